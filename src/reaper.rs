//! The one place that calls `waitpid`: the daemon is a child subreaper, so container inits,
//! exec processes and OCI runtime invocations all exit to it. Exits fan out to whoever
//! subscribed to the pid; an exit nobody has asked for yet is kept for a while, so an exit that
//! races ahead of its subscription (a container that dies before Start returns) is never lost.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
use nix::unistd::Pid;
use tokio::sync::oneshot;

/// How long an unclaimed exit is kept before it is dropped (reparented orphans nobody waits for).
const UNCLAIMED_TTL: Duration = Duration::from_secs(120);
/// Unclaimed exits kept at most (a fork storm of orphans in a pod sharing the host's pid
/// namespace must not grow the daemon); past it the oldest is dropped.
pub const MAX_UNCLAIMED: usize = 4096;

/// A reaped process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    pub pid: i32,
    /// Exit code, or 128 + signal number for a killed process (as shells and containerd report).
    pub status: u32,
    pub at: SystemTime,
}

#[derive(Default)]
struct Inner {
    /// Every subscriber of a pid gets its exit (a Wait and the exit watcher of one process,
    /// say): a second subscription never silently replaces the first.
    waiters: HashMap<i32, Vec<oneshot::Sender<Exit>>>,
    unclaimed: HashMap<i32, (Exit, Instant)>,
}

/// Collects exits of every child and hands each to its subscriber.
#[derive(Default, Clone)]
pub struct Reaper {
    inner: Arc<Mutex<Inner>>,
}

impl Reaper {
    fn lock(&self) -> MutexGuard<'_, Inner> {
        // A poisoned lock only means another thread panicked mid-update of plain maps.
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Returns a receiver that resolves when `pid` is reaped, even if it already was.
    pub fn subscribe(&self, pid: i32) -> oneshot::Receiver<Exit> {
        self.subscribe_since(pid, None)
    }

    /// Like [`Reaper::subscribe`], but an already-kept exit counts only if it was reaped after
    /// `since` (when the process was known to be alive), so a reused pid is never confused
    /// with an older process.
    pub fn subscribe_since(&self, pid: i32, since: Option<Instant>) -> oneshot::Receiver<Exit> {
        let (tx, rx) = oneshot::channel();
        let mut inner = self.lock();
        match inner.unclaimed.remove(&pid) {
            Some((exit, t)) if since.is_none_or(|s| t >= s) => {
                let _ = tx.send(exit);
            }
            _ => {
                let waiting = inner.waiters.entry(pid).or_default();
                // Subscribers that gave up (their receiver dropped) need no exit.
                waiting.retain(|w| !w.is_closed());
                waiting.push(tx);
            }
        }
        rx
    }

    /// Delivers one exit to every subscriber of its pid, or keeps it when nobody listens.
    pub fn deliver(&self, exit: Exit) {
        let mut inner = self.lock();
        let waiting = inner.waiters.remove(&exit.pid).unwrap_or_default();
        // Every live subscriber gets it (no short circuit).
        let mut taken = false;
        for tx in waiting {
            taken |= tx.send(exit).is_ok();
        }
        if taken {
            return;
        }
        let now = Instant::now();
        inner
            .unclaimed
            .retain(|_, (_, t)| now.duration_since(*t) < UNCLAIMED_TTL);
        if inner.unclaimed.len() >= MAX_UNCLAIMED {
            let oldest = inner.unclaimed.iter().min_by_key(|(_, (_, t))| *t).map(|(pid, _)| *pid);
            if let Some(pid) = oldest {
                inner.unclaimed.remove(&pid);
            }
        }
        inner.unclaimed.insert(exit.pid, (exit, now));
    }

    /// Reaps every child that has exited, without blocking.
    pub fn reap_all(&self) {
        loop {
            match waitpid(Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
                Ok(WaitStatus::Exited(pid, code)) => self.deliver(Exit {
                    pid: pid.as_raw(),
                    status: code as u32,
                    at: SystemTime::now(),
                }),
                Ok(WaitStatus::Signaled(pid, sig, _)) => self.deliver(Exit {
                    pid: pid.as_raw(),
                    status: 128 + sig as u32,
                    at: SystemTime::now(),
                }),
                Ok(WaitStatus::StillAlive) | Err(_) => return,
                Ok(_) => continue,
            }
        }
    }

    /// Runs the SIGCHLD loop on the current tokio runtime.
    pub fn start(&self) -> std::io::Result<()> {
        use tokio::signal::unix::{signal, SignalKind};
        let mut sigchld = signal(SignalKind::child())?;
        let reaper = self.clone();
        tokio::spawn(async move {
            // Children that exited before the handler was installed.
            reaper.reap_all();
            while sigchld.recv().await.is_some() {
                reaper.reap_all();
            }
        });
        Ok(())
    }
}

impl std::fmt::Debug for Reaper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Reaper")
    }
}

/// Makes this process the reaper of every orphan below it (container inits and execs).
pub fn set_subreaper() -> nix::Result<()> {
    nix::sys::prctl::set_child_subreaper(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn exit(pid: i32, status: u32) -> Exit {
        Exit {
            pid,
            status,
            at: SystemTime::now(),
        }
    }

    #[tokio::test]
    async fn a_flood_of_unclaimed_exits_is_bounded_and_keeps_the_newest() {
        let r = Reaper::default();
        let n = MAX_UNCLAIMED as i32 + 500;
        for pid in 1..=n {
            r.deliver(exit(pid, 0));
        }
        assert_eq!(r.lock().unclaimed.len(), MAX_UNCLAIMED);
        let got = r.subscribe(n).await.unwrap();
        assert_eq!(got.pid, n, "the newest is still there");
    }

    #[tokio::test]
    async fn every_subscriber_of_a_pid_gets_its_exit() {
        let r = Reaper::default();
        let first = r.subscribe(9);
        let second = r.subscribe(9);
        let gave_up = r.subscribe(9);
        drop(gave_up);
        r.deliver(exit(9, 2));
        assert_eq!(first.await.unwrap().status, 2, "the first subscriber is not replaced");
        assert_eq!(second.await.unwrap().status, 2);
        assert!(r.lock().unclaimed.is_empty(), "a delivered exit is not kept");
        // Nobody left listening: the exit is kept for a later subscriber.
        drop(r.subscribe(10));
        r.deliver(exit(10, 1));
        assert_eq!(r.subscribe(10).await.unwrap().status, 1);
    }

    #[tokio::test]
    async fn exit_before_subscribe_is_kept() {
        let r = Reaper::default();
        r.deliver(exit(42, 3));
        let got = r.subscribe(42).await.unwrap();
        assert_eq!((got.pid, got.status), (42, 3));
    }

    #[tokio::test]
    async fn exit_after_subscribe_is_delivered_once() {
        let r = Reaper::default();
        let rx = r.subscribe(7);
        r.deliver(exit(7, 137));
        assert_eq!(rx.await.unwrap().status, 137);
        // A later exit with the same pid (reuse) is not confused with the first.
        r.deliver(exit(7, 0));
        assert_eq!(r.subscribe(7).await.unwrap().status, 0);
    }

    // The reaper under test is what waits for the child; the std lock only keeps other test
    // threads' children out of its waitpid(-1) while this single-threaded test runs.
    #[allow(clippy::zombie_processes, clippy::await_holding_lock)]
    #[tokio::test]
    async fn reaps_real_children() {
        let _children = crate::sys::test_children_lock();
        let r = Reaper::default();
        let child = std::process::Command::new("sh").args(["-c", "exit 5"]).spawn().unwrap();
        let rx = r.subscribe(child.id() as i32);
        // Poll instead of SIGCHLD so the test does not depend on signal delivery order.
        let got = loop {
            r.reap_all();
            if let Some((e, _)) = r.lock().unclaimed.get(&(child.id() as i32)) {
                break *e;
            }
            if r.lock().waiters.is_empty() {
                break rx.await.unwrap();
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        };
        assert_eq!(got.status, 5);
    }
}
