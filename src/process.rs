//! One process of a container (its init or an exec): lifecycle state, exit, stdio. The state
//! machine is pure so every transition the Task API allows (and refuses) is unit-tested.

use std::sync::{Arc, Mutex, MutexGuard};
use std::time::SystemTime;

use thiserror::Error;
use tokio::sync::watch;

use crate::io::{ProcessIo, StdioPaths};

/// Lifecycle of a process as the Task API reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Status {
    Created,
    /// A Start is under way (reported as created): a second Start is refused.
    Starting,
    Running,
    Paused,
    Stopped,
}

/// What ended a process.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ExitInfo {
    pub pid: i32,
    pub status: u32,
    pub at: SystemTime,
}

#[derive(Debug, Error, PartialEq, Eq)]
pub enum StateError {
    #[error("process {id:?} is {from:?}: cannot {action}")]
    Transition {
        id: String,
        from: Status,
        action: &'static str,
    },
}

/// An operation asking to move the process between states.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Op {
    Start,
    Pause,
    Resume,
    Delete,
}

impl Op {
    fn name(self) -> &'static str {
        match self {
            Op::Start => "start",
            Op::Pause => "pause",
            Op::Resume => "resume",
            Op::Delete => "delete a running process",
        }
    }
}

/// The state an operation leads to from `from`, or why it is refused.
pub fn transition(id: &str, from: Status, op: Op) -> Result<Status, StateError> {
    use Status::*;
    let to = match (from, op) {
        (Created, Op::Start) => Running,
        (Running, Op::Pause) => Paused,
        (Paused, Op::Resume) => Running,
        (Created | Stopped, Op::Delete) => Stopped,
        _ => {
            return Err(StateError::Transition {
                id: id.to_string(),
                from,
                action: op.name(),
            })
        }
    };
    Ok(to)
}

struct Inner {
    status: Status,
    pid: i32,
}

/// A Start in progress; see [`Process::begin_start`].
pub struct StartClaim<'a> {
    process: &'a Process,
}

impl StartClaim<'_> {
    /// The runtime started the process: it is running (unless it already exited).
    pub fn started(self) {
        self.process.end_start(Status::Running);
    }
}

impl Drop for StartClaim<'_> {
    fn drop(&mut self) {
        self.process.end_start(Status::Created);
    }
}

/// One process. Exits are broadcast through a watch channel so any number of Wait calls
/// see the same status and time.
pub struct Process {
    /// Exec id; empty for the init process.
    pub exec_id: String,
    pub stdio: StdioPaths,
    io: Mutex<Arc<ProcessIo>>,
    inner: Mutex<Inner>,
    exit: watch::Sender<Option<ExitInfo>>,
    /// Held across a Start (runtime call + TaskStart event); the exit monitor takes it before
    /// reporting, so a process that dies at once is still reported started, then exited.
    pub start_lock: tokio::sync::Mutex<()>,
}

impl Process {
    pub fn new(exec_id: &str, stdio: StdioPaths, io: Arc<ProcessIo>) -> Self {
        Self {
            exec_id: exec_id.to_string(),
            stdio,
            io: Mutex::new(io),
            inner: Mutex::new(Inner {
                status: Status::Created,
                pid: 0,
            }),
            exit: watch::channel(None).0,
            start_lock: tokio::sync::Mutex::new(()),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The handles the shim holds for this process's stdio.
    pub fn io(&self) -> Arc<ProcessIo> {
        self.io.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Replaces the stdio handles (an exec's are opened only when it starts).
    pub fn set_io(&self, io: Arc<ProcessIo>) {
        *self.io.lock().unwrap_or_else(|e| e.into_inner()) = io;
    }

    pub fn status(&self) -> Status {
        self.lock().status
    }

    pub fn pid(&self) -> i32 {
        self.lock().pid
    }

    pub fn set_pid(&self, pid: i32) {
        self.lock().pid = pid;
    }

    pub fn exit(&self) -> Option<ExitInfo> {
        *self.exit.borrow()
    }

    /// Checks an operation without applying it (the runtime call happens in between).
    pub fn check(&self, id: &str, op: Op) -> Result<Status, StateError> {
        transition(id, self.status(), op)
    }

    /// Claims the process for one Start (created → starting), so a concurrent second Start is
    /// refused rather than running the process twice. The claim ends with [`StartClaim::started`],
    /// or, dropped (failure, cancellation), goes back to created.
    pub fn begin_start(&self, id: &str) -> Result<StartClaim<'_>, StateError> {
        let mut inner = self.lock();
        if inner.status == Status::Starting {
            return Err(StateError::Transition {
                id: id.to_string(),
                from: Status::Starting,
                action: "start it again",
            });
        }
        transition(id, inner.status, Op::Start)?;
        inner.status = Status::Starting;
        Ok(StartClaim { process: self })
    }

    fn end_start(&self, to: Status) {
        let mut inner = self.lock();
        if inner.status == Status::Starting {
            inner.status = to;
        }
    }

    /// Applies an operation's new state unless the process exited meanwhile.
    pub fn apply(&self, to: Status) {
        let mut inner = self.lock();
        if inner.status != Status::Stopped {
            inner.status = to;
        }
    }

    /// Records the exit and wakes every waiter.
    pub fn set_exited(&self, exit: ExitInfo) {
        self.lock().status = Status::Stopped;
        self.exit.send_replace(Some(exit));
    }

    /// Resolves once the process has exited.
    pub async fn wait(&self) -> ExitInfo {
        let mut rx = self.exit.subscribe();
        loop {
            if let Some(e) = *rx.borrow_and_update() {
                return e;
            }
            if rx.changed().await.is_err() {
                // The sender lives as long as `self`; this only happens during teardown.
                return ExitInfo {
                    pid: self.pid(),
                    status: 255,
                    at: SystemTime::now(),
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use Status::*;

    #[test]
    fn transitions() {
        let table = [
            (Created, Op::Start, Ok(Running)),
            (Running, Op::Start, Err(())),
            (Stopped, Op::Start, Err(())),
            (Running, Op::Pause, Ok(Paused)),
            (Created, Op::Pause, Err(())),
            (Paused, Op::Resume, Ok(Running)),
            (Running, Op::Resume, Err(())),
            (Created, Op::Delete, Ok(Stopped)),
            (Stopped, Op::Delete, Ok(Stopped)),
            (Running, Op::Delete, Err(())),
            (Paused, Op::Delete, Err(())),
        ];
        for (from, op, want) in table {
            let got = transition("c", from, op).map_err(|_| ());
            assert_eq!(got, want, "{from:?} --{op:?}-->");
        }
        let e = transition("c1", Running, Op::Delete).unwrap_err().to_string();
        assert!(e.contains("c1") && e.contains("Running"), "{e}");
        for op in [Op::Start, Op::Pause, Op::Resume, Op::Delete] {
            assert!(transition("c", Starting, op).is_err(), "Starting --{op:?}-->");
        }
    }

    #[test]
    fn one_start_at_a_time() {
        let p = Process::new("e", StdioPaths::default(), Arc::default());
        let claim = p.begin_start("e").unwrap();
        assert_eq!(p.status(), Starting);
        let e = p.begin_start("e").err().unwrap().to_string();
        assert!(e.contains("Starting"), "{e}");
        drop(claim);
        assert_eq!(p.status(), Created, "a failed start leaves it created");
        p.begin_start("e").unwrap().started();
        assert_eq!(p.status(), Running);
        assert!(p.begin_start("e").is_err());
    }

    #[tokio::test]
    async fn every_waiter_sees_the_same_exit() {
        let p = Arc::new(Process::new("", StdioPaths::default(), Arc::default()));
        let waiters: Vec<_> = (0..3)
            .map(|_| {
                let p = p.clone();
                tokio::spawn(async move { p.wait().await })
            })
            .collect();
        let exit = ExitInfo {
            pid: 9,
            status: 137,
            at: SystemTime::now(),
        };
        tokio::task::yield_now().await;
        p.set_exited(exit);
        for w in waiters {
            assert_eq!(w.await.unwrap(), exit);
        }
        // A waiter arriving after the exit gets it too.
        assert_eq!(p.wait().await, exit);
        assert_eq!(p.status(), Stopped);
        p.apply(Running);
        assert_eq!(p.status(), Stopped, "an exited process never comes back");
    }
}
