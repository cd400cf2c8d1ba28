//! Keeps the kernel's cgroup migration lock writer-fast while an OCI runtime joins cgroups.
//!
//! Why: a write to `cgroup.procs` takes the kernel's global `cgroup_threadgroup_rwsem` for
//! writing. Unless some writer held it within the last RCU grace period, taking it waits for a
//! whole grace period: 10–20 ms per write on this project's VM, the largest single step of
//! `runc create` and `runc exec`, which write the new process into every hierarchy. The
//! kernel's remedy is the `favordynmods` cgroup mount option, a host setting. gantry gets the
//! same effect for the span of a runtime invocation: a helper thread writes the daemon's own
//! pid to its own `cgroup.procs` (moving nothing) every [`PERIOD`], so the runtime's writes find
//! the lock already in its writer mode. The first such write pays the grace period, while the
//! runtime is still starting. Outside invocations nothing runs.

use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use super::ContainerCgroup;

/// Well under a grace period, so the lock never falls back to its reader mode in between.
const PERIOD: Duration = Duration::from_millis(2);

struct State {
    holders: usize,
    /// Kept warm until then whatever the holders ([`hold_for`]).
    until: Option<Instant>,
    running: bool,
    /// The daemon's own `cgroup.procs`; `None` once found unusable (then nothing is tried again).
    procs: Option<Option<PathBuf>>,
}

static STATE: Mutex<State> = Mutex::new(State {
    holders: 0,
    until: None,
    running: false,
    procs: None,
});

/// While alive, the migration lock is kept writer-fast.
#[must_use]
pub struct Hold(());

/// Holds the lock warm until the returned value is dropped (a cancelled request drops it too).
pub fn hold() -> Hold {
    let mut s = STATE.lock().unwrap_or_else(|p| p.into_inner());
    s.holders += 1;
    ensure_running(&mut s);
    Hold(())
}

/// Keeps the lock warm for `span` from now: for a write known to come soon whose first warm-up
/// write should start early, since that one waits out a whole grace period itself.
pub fn hold_for(span: Duration) {
    let mut s = STATE.lock().unwrap_or_else(|p| p.into_inner());
    let until = Instant::now() + span;
    s.until = Some(s.until.map_or(until, |u| u.max(until)));
    ensure_running(&mut s);
}

fn ensure_running(s: &mut State) {
    if !s.running {
        let procs = s.procs.get_or_insert_with(own_procs).clone();
        if let Some(path) = procs {
            if std::thread::Builder::new()
                .name("cgroup-warm".into())
                .spawn(move || run(path))
                .is_ok()
            {
                s.running = true;
            }
        }
    }
}

impl Drop for Hold {
    fn drop(&mut self) {
        let mut s = STATE.lock().unwrap_or_else(|p| p.into_inner());
        s.holders = s.holders.saturating_sub(1);
    }
}

fn own_procs() -> Option<PathBuf> {
    let own = ContainerCgroup::for_pid(std::process::id() as i32).ok()?;
    let dir = match own.v2_dir() {
        Some(d) => d.to_path_buf(),
        None => own.v1_paths()?.dirs().next()?.clone(),
    };
    Some(dir.join("cgroup.procs"))
}

fn run(procs: PathBuf) {
    let pid = std::process::id().to_string();
    loop {
        {
            let mut s = STATE.lock().unwrap_or_else(|p| p.into_inner());
            if s.holders == 0 && s.until.is_none_or(|u| Instant::now() >= u) {
                s.running = false;
                return;
            }
        }
        if std::fs::write(&procs, &pid).is_err() {
            // Not allowed here (a foreign cgroup, a read-only mount): never tried again.
            let mut s = STATE.lock().unwrap_or_else(|p| p.into_inner());
            s.procs = Some(None);
            s.running = false;
            return;
        }
        std::thread::sleep(PERIOD);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A fresh process joining a new cgroup through `cgroup.procs`, timed in the child.
    fn timed_join(dir: &std::path::Path) -> Duration {
        let procs = dir.join("cgroup.procs");
        let out = std::process::Command::new("sh")
            .arg("-c")
            .arg(format!(
                "a=$(date +%s%N); echo $$ > {}; b=$(date +%s%N); echo $((b - a))",
                procs.display()
            ))
            .output()
            .expect("sh");
        let ns: u64 = String::from_utf8_lossy(&out.stdout).trim().parse().unwrap_or(u64::MAX);
        Duration::from_nanos(ns)
    }

    #[test]
    fn held_warm_a_join_skips_the_grace_period_and_the_helper_stops_when_released_or_the_span_ends() {
        let Some(procs) = own_procs() else {
            eprintln!("skipped: this test process's cgroup is not writable here");
            return;
        };
        if !nix::unistd::geteuid().is_root() {
            eprintln!("skipped: needs root to create cgroups");
            return;
        }
        let Some(own) = procs.parent() else { return };
        let dir = own.join(format!("gantry-warm-test-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("mkdir");
        let hold = hold();
        std::thread::sleep(Duration::from_millis(50));
        // Spaced out, so that without the helper each join would find the lock cold again.
        let warm: Vec<Duration> = (0..5)
            .map(|_| {
                std::thread::sleep(Duration::from_millis(60));
                timed_join(&dir)
            })
            .collect();
        drop(hold);
        std::thread::sleep(Duration::from_millis(20));
        assert!(
            !STATE.lock().unwrap().running,
            "the helper thread stops once nothing holds it"
        );
        // A span-held warm-up runs on its own and stops once the span is over.
        hold_for(Duration::from_millis(150));
        std::thread::sleep(Duration::from_millis(60));
        let during = timed_join(&dir);
        assert!(STATE.lock().unwrap().running, "held for a span");
        std::thread::sleep(Duration::from_millis(150));
        assert!(!STATE.lock().unwrap().running, "the span is over");
        let _ = std::fs::remove_dir(&dir);
        assert!(during < Duration::from_millis(3), "join during the span: {during:?}");
        let mut sorted = warm.clone();
        sorted.sort();
        // A cold join waits for an RCU grace period (milliseconds); warm it takes microseconds
        // plus the shell's own `date` calls.
        assert!(sorted[2] < Duration::from_millis(3), "warm joins: {warm:?}");
    }
}
