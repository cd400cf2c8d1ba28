//! The daemon's settling once its containers are up. Set-up (Create, Start, and the State calls
//! an engine makes right after) runs much of the binary once, grows the heap and the reactor's
//! stack, and starts helper threads that end half a second later; none of that is needed while
//! the containers just run, which is most of a pod's life. So a while after the last Start,
//! when nothing else has started meanwhile, the daemon gives it all back at once (the seccomp
//! profile caches, then [`crate::sys::trim_heap`]: free heap, dead stack, the executable's code
//! pages). Settling then, not at Start itself, keeps what the engine's next calls and the helper
//! threads' ends would fault back in out of the pages a running pod keeps.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

/// How long after the last Start the daemon settles: past the blocking pool's keep-alive
/// (`daemon::BLOCKING_KEEP_ALIVE`, 0.5 s), so its threads have ended, and past the engine's
/// calls that follow a Start (CRI-O's State, a pod's next Create within the same second).
pub const SETTLE_AFTER: Duration = Duration::from_secs(2);

/// Debounces the release: each [`Settler::arm`] supersedes the ones before it.
pub struct Settler {
    armed: AtomicU64,
    release: fn(),
}

impl Default for Settler {
    /// Trims the daemon. Not in unit tests: they share one process, where one test's daemon
    /// settling would unmap the code another test is measuring (sys.rs tests the release).
    fn default() -> Self {
        #[cfg(not(test))]
        let release: fn() = release;
        #[cfg(test)]
        let release: fn() = || {};
        Self::with_release(release)
    }
}

/// What settling gives back: the policy's caches of generated and validated seccomp profiles,
/// then free heap, the stack's dead pages and the code pages.
#[cfg(not(test))]
fn release() {
    crate::security::seccomp::forget_cached();
    crate::sys::trim_heap();
}

impl Settler {
    /// A settler that runs `release` instead of trimming the daemon (unit tests count calls).
    pub fn with_release(release: fn()) -> Self {
        Self {
            armed: AtomicU64::new(0),
            release,
        }
    }

    /// Schedules a release [`SETTLE_AFTER`] from now on the current runtime, cancelling any
    /// still pending. Runs on the reactor, so the stack it gives back is the reactor's own.
    pub fn arm(self: &Arc<Self>) {
        let mine = self.armed.fetch_add(1, Ordering::SeqCst) + 1;
        let me = self.clone();
        tokio::spawn(async move {
            tokio::time::sleep(SETTLE_AFTER).await;
            if me.armed.load(Ordering::SeqCst) == mine {
                (me.release)();
            }
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::AtomicUsize;

    static RELEASES: AtomicUsize = AtomicUsize::new(0);

    fn count() {
        RELEASES.fetch_add(1, Ordering::SeqCst);
    }

    /// Lets the spawned timers run up to the paused clock's now.
    async fn run_timers() {
        for _ in 0..4 {
            tokio::task::yield_now().await;
        }
    }

    #[tokio::test(start_paused = true)]
    async fn a_release_comes_once_after_the_last_arm_and_not_before() {
        RELEASES.store(0, Ordering::SeqCst);
        let s = Arc::new(Settler::with_release(count));
        s.arm();
        tokio::time::sleep(SETTLE_AFTER / 2).await;
        s.arm(); // a second container's Start: the first release is superseded
        tokio::time::sleep(SETTLE_AFTER / 2 + Duration::from_millis(100)).await;
        run_timers().await;
        assert_eq!(RELEASES.load(Ordering::SeqCst), 0, "the first arm's timer fired");
        tokio::time::sleep(SETTLE_AFTER / 2).await;
        run_timers().await;
        assert_eq!(RELEASES.load(Ordering::SeqCst), 1, "the last arm's timer releases");
        tokio::time::sleep(SETTLE_AFTER * 5).await;
        run_timers().await;
        assert_eq!(RELEASES.load(Ordering::SeqCst), 1, "and nothing more");
    }
}
