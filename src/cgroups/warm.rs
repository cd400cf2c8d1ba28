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
//! runtime is still starting. Outside invocations nothing runs. `[runtime] cgroup_warmup =
//! false` turns it off ([`set_enabled`]).

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
    /// Off by the operator's choice: holds are counted but no thread starts.
    disabled: bool,
    /// Warm-up writes made so far (tests observe the helper through it).
    writes: u64,
}

static STATE: Mutex<State> = Mutex::new(State {
    holders: 0,
    until: None,
    running: false,
    procs: None,
    disabled: false,
    writes: 0,
});

/// The operator's `[runtime] cgroup_warmup`; set once when the daemon starts.
pub fn set_enabled(on: bool) {
    STATE.lock().unwrap_or_else(|p| p.into_inner()).disabled = !on;
}

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
    if !s.running && !s.disabled {
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
        STATE.lock().unwrap_or_else(|p| p.into_inner()).writes += 1;
        std::thread::sleep(PERIOD);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn state<T>(f: impl FnOnce(&mut State) -> T) -> T {
        f(&mut STATE.lock().unwrap_or_else(|p| p.into_inner()))
    }

    /// Polls generously: the helper thread's pace is the scheduler's, not the test's.
    fn eventually(what: &str, f: impl Fn() -> bool) {
        let end = Instant::now() + Duration::from_secs(30);
        while !f() {
            assert!(Instant::now() < end, "never happened: {what}");
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    /// The warm-up's effect on a real cgroup join (a grace period saved per write) is measured
    /// by `scripts/bench.sh`; here only what the helper thread does, against a stand-in
    /// `cgroup.procs` file, so the test needs neither root nor a writable cgroup.
    #[test]
    fn the_helper_writes_while_held_and_ends_when_released_the_span_ends_or_it_is_turned_off() {
        let dir = tempfile::tempdir().unwrap();
        let procs = dir.path().join("cgroup.procs");
        state(|s| s.procs = Some(Some(procs.clone())));
        // A helper that another test started before may still write the real `cgroup.procs`;
        // every helper started from here on writes the stand-in.
        eventually("an earlier helper ends", || !state(|s| s.running));

        let held = hold();
        let first = state(|s| s.writes);
        eventually("three warm-up writes", || state(|s| s.writes) >= first + 3);
        // Polled: each write truncates the file first, so one read may see it empty.
        let pid = std::process::id().to_string();
        eventually("the daemon's pid written", || {
            std::fs::read_to_string(&procs).is_ok_and(|t| t == pid)
        });
        drop(held);
        // Other tests of this binary hold it too; each of them ends.
        eventually("the helper stops once nothing holds it", || !state(|s| s.running));

        hold_for(Duration::from_millis(100));
        assert!(state(|s| s.running), "a span starts the helper at once");
        eventually("the helper stops once the span is over", || !state(|s| s.running));

        set_enabled(false);
        eventually("no helper left", || !state(|s| s.running));
        let _held = hold();
        assert!(!state(|s| s.running), "turned off: no helper thread");
        set_enabled(true);
    }
}
