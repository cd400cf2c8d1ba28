//! A scriptable [`Runtime`] for unit tests. Its processes are pids above the kernel's
//! `pid_max` (so a stray signal reaches nobody), written to the pid files the container reads;
//! their exits go through the real [`Reaper`] (`deliver`), as a reaped child's would. Each
//! call is recorded and can be held at a gate, made to fail, or made to hang until its limit.

use std::collections::{HashMap, HashSet};
use std::path::Path;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use async_trait::async_trait;
use tokio::sync::{watch, Semaphore};

use super::{Runtime, RuntimeError, RuntimeIdentity, RuntimeState, Spawn};
use crate::reaper::{Exit, Reaper};

/// A chooser that gives every container (and every record) the same runtime.
pub struct Always(pub Arc<dyn Runtime>);

impl super::choose::Runtimes for Always {
    fn for_create(&self, _: &super::choose::Wanted<'_>) -> Arc<dyn Runtime> {
        self.0.clone()
    }
    fn for_record(&self, _: &super::choose::RuntimeRecord, _: &Path, _: Reaper) -> Arc<dyn Runtime> {
        self.0.clone()
    }
}

/// Above `PID_MAX_LIMIT` (2^22): never a real process.
const FIRST_PID: i32 = 5_000_000;

/// What a call does once past its gate (if any).
#[derive(Clone)]
enum Behaviour {
    /// Fails with this message.
    Fail(String),
    /// Never answers; ends as a real call past its limit does.
    Hang(Duration),
}

#[derive(Default)]
struct State {
    next_pid: i32,
    /// Calls wait here for a permit first.
    gates: HashMap<&'static str, Arc<Semaphore>>,
    script: HashMap<&'static str, Behaviour>,
    /// Container id → init pid, while it lives.
    inits: HashMap<String, i32>,
    /// Every live pid (init and execs).
    alive: HashSet<i32>,
    execs: Vec<i32>,
    /// Calls that ran to their end (past gate and script), as "op args".
    finished: Vec<String>,
}

/// The fake runtime; cheap to clone (shared state).
#[derive(Clone)]
pub struct FakeRuntime {
    state: Arc<Mutex<State>>,
    calls: Arc<watch::Sender<Vec<String>>>,
    reaper: Reaper,
}

impl FakeRuntime {
    pub fn new(reaper: Reaper) -> Self {
        Self {
            state: Arc::new(Mutex::new(State {
                next_pid: FIRST_PID,
                ..Default::default()
            })),
            calls: Arc::new(watch::channel(Vec::new()).0),
            reaper,
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Holds every later `op` call until `release`d; returns the gate.
    pub fn hold(&self, op: &'static str) -> Arc<Semaphore> {
        let gate = Arc::new(Semaphore::new(0));
        self.lock().gates.insert(op, gate.clone());
        gate
    }

    /// Makes every later `op` call (and held ones, once released) fail with `message`.
    pub fn fail(&self, op: &'static str, message: &str) {
        self.lock().script.insert(op, Behaviour::Fail(message.to_string()));
    }

    /// Makes every later `op` call hang until `limit`, then time out.
    pub fn hang(&self, op: &'static str, limit: Duration) {
        self.lock().script.insert(op, Behaviour::Hang(limit));
    }

    /// Lets `op` calls through again.
    pub fn clear(&self, op: &'static str) {
        let mut s = self.lock();
        s.script.remove(op);
        s.gates.remove(op);
    }

    /// Calls that ran to their end, as "op args": a call dropped midway is not among them.
    pub fn finished(&self) -> Vec<String> {
        self.lock().finished.clone()
    }

    /// Every call so far, as "op args".
    pub fn calls(&self) -> Vec<String> {
        self.calls.borrow().clone()
    }

    /// Waits until `n` calls of `op` have been made (they may be held at their gate).
    pub async fn entered(&self, op: &str, n: usize) {
        let mut rx = self.calls.subscribe();
        let _ = rx
            .wait_for(|c| c.iter().filter(|l| l.split(' ').next() == Some(op)).count() >= n)
            .await;
    }

    /// Init's pid of container `id`, while it lives.
    pub fn init_pid(&self, id: &str) -> Option<i32> {
        self.lock().inits.get(id).copied()
    }

    /// Pids of execs started so far, in order.
    pub fn exec_pids(&self) -> Vec<i32> {
        self.lock().execs.clone()
    }

    /// The process `pid` exits with `status` (the reaper delivers it).
    pub fn exit(&self, pid: i32, status: u32) {
        let was_alive = {
            let mut s = self.lock();
            s.inits.retain(|_, p| *p != pid);
            s.alive.remove(&pid)
        };
        if was_alive {
            self.reaper.deliver(Exit {
                pid,
                status,
                at: SystemTime::now(),
            });
        }
    }

    fn spawn_pid(&self) -> i32 {
        let mut s = self.lock();
        let pid = s.next_pid;
        s.next_pid += 1;
        s.alive.insert(pid);
        pid
    }

    /// Records the call, then behaves as scripted.
    async fn call(&self, op: &'static str, args: String) -> Result<(), RuntimeError> {
        let line = format!("{op} {args}").trim_end().to_string();
        let result = self.run_call(op, line.clone()).await;
        self.lock().finished.push(line);
        result
    }

    async fn run_call(&self, op: &'static str, line: String) -> Result<(), RuntimeError> {
        let gate = self.lock().gates.get(op).cloned();
        self.calls.send_modify(|c| c.push(line));
        if let Some(gate) = gate {
            if let Ok(permit) = gate.acquire().await {
                permit.forget();
            }
        }
        let behaviour = self.lock().script.get(op).cloned();
        match behaviour {
            None => Ok(()),
            Some(Behaviour::Fail(message)) => Err(RuntimeError::Failed {
                binary: "fake".into(),
                command: op.into(),
                not_found: super::says_container_missing(&message),
                message,
                status: 1,
            }),
            Some(Behaviour::Hang(after)) => {
                tokio::time::sleep(after).await;
                Err(RuntimeError::Timeout {
                    binary: "fake".into(),
                    command: op.into(),
                    after,
                })
            }
        }
    }

    fn write_pid(&self, path: &Path) -> Result<i32, RuntimeError> {
        let pid = self.spawn_pid();
        std::fs::write(path, pid.to_string())?;
        Ok(pid)
    }
}

#[async_trait]
impl Runtime for FakeRuntime {
    fn identity(&self) -> RuntimeIdentity {
        RuntimeIdentity {
            binary: "fake".into(),
            root: "/nonexistent".into(),
            systemd_cgroup: false,
        }
    }

    async fn create(&self, id: &str, _bundle: &Path, spawn: Spawn<'_>) -> Result<(), RuntimeError> {
        self.call("create", id.into()).await?;
        let pid = self.write_pid(spawn.pid_file)?;
        self.lock().inits.insert(id.to_string(), pid);
        Ok(())
    }

    async fn start(&self, id: &str) -> Result<(), RuntimeError> {
        self.call("start", id.into()).await
    }

    async fn exec(&self, id: &str, _process_json: &Path, spawn: Spawn<'_>) -> Result<(), RuntimeError> {
        self.call("exec", id.into()).await?;
        let pid = self.write_pid(spawn.pid_file)?;
        self.lock().execs.push(pid);
        Ok(())
    }

    /// SIGKILL and SIGTERM end init (with `all`, every exec too), as a real runtime would.
    async fn kill(&self, id: &str, signal: u32, all: bool) -> Result<(), RuntimeError> {
        self.call("kill", format!("{id} {signal}{}", if all { " all" } else { "" }))
            .await?;
        let terminating = signal == libc::SIGKILL as u32 || signal == libc::SIGTERM as u32;
        if !terminating {
            return Ok(());
        }
        let (init, execs) = {
            let s = self.lock();
            (s.inits.get(id).copied(), s.execs.clone())
        };
        if all {
            for pid in execs {
                self.exit(pid, 128 + signal);
            }
        }
        if let Some(pid) = init {
            self.exit(pid, 128 + signal);
        }
        Ok(())
    }

    async fn delete(&self, id: &str, force: bool) -> Result<(), RuntimeError> {
        self.call("delete", format!("{}{id}", if force { "--force " } else { "" }))
            .await?;
        // A created, never started init dies with the delete.
        if let Some(pid) = self.init_pid(id) {
            self.exit(pid, 137);
        }
        Ok(())
    }

    async fn pause(&self, id: &str) -> Result<(), RuntimeError> {
        self.call("pause", id.into()).await
    }

    async fn resume(&self, id: &str) -> Result<(), RuntimeError> {
        self.call("resume", id.into()).await
    }

    async fn update(&self, id: &str, _resources_json: &Path) -> Result<(), RuntimeError> {
        self.call("update", id.into()).await
    }

    async fn ps(&self, id: &str) -> Result<Vec<i32>, RuntimeError> {
        self.call("ps", id.into()).await?;
        let s = self.lock();
        let mut pids: Vec<i32> = s.alive.iter().copied().collect();
        pids.sort_unstable();
        Ok(pids)
    }

    async fn checkpoint(&self, id: &str, _image: &Path, _work: &Path, _exit: bool) -> Result<(), RuntimeError> {
        self.call("checkpoint", id.into()).await
    }

    async fn state(&self, id: &str) -> Result<RuntimeState, RuntimeError> {
        self.call("state", id.into()).await?;
        let pid = self.init_pid(id).unwrap_or_default();
        let status = if pid > 0 { "running" } else { "stopped" };
        Ok(RuntimeState {
            pid,
            status: status.into(),
        })
    }
}
