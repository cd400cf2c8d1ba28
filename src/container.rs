//! A container held by the daemon: its bundle, rootfs mounts, OCI runtime, init process and
//! execs, and every operation the Task API performs on them. Create undoes all it did when a
//! step fails, so a refused container leaves no mounts, runtime state, sockets or files.
//! Exits are published in the runc shim's order: execs first, init last ([`crate::exits`]).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, SystemTime};

use containerd_shim_protos::protobuf::well_known_types::any::Any;
use slog::{info, warn, Logger};

use crate::cgroups::{CgroupError, ContainerCgroup};
use crate::exits::ExitOrder;
use crate::files;
use crate::mount;
use crate::process::{ExitInfo, Op, Process, Status};
use crate::reaper::Reaper;
use crate::runtime::Runtime;
use cgroup_watch::CgroupWatch;

mod cgroup_watch;
mod console;
mod create;
mod error;
mod exec;

pub use create::CreateParams;
use error::invalid;
pub use error::TaskError;
pub use exec::StartedExec;

/// How long a process's terminal output may still flow after its exit before the exit is
/// published anyway: the runc shim's bound. A process that left a child holding the terminal
/// would otherwise hold its exit back for as long as the child lives.
pub const OUTPUT_DRAIN: Duration = Duration::from_secs(2);

/// Runs `f` on tokio's blocking pool: file reads, YAML and JSON parsing, libseccomp and cgroup
/// reads that would otherwise hold up every other request on the reactor thread. Only work
/// without side effects goes here: a Create cancelled while it runs just drops the result.
pub(crate) async fn off_reactor<T: Send + 'static>(f: impl FnOnce() -> T + Send + 'static) -> Result<T, TaskError> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| TaskError::Internal(format!("blocking task: {e}")))
}

/// Files gantry writes into a bundle, removed on Delete.
pub const INIT_PID_FILE: &str = "init.pid";
pub const RUNTIME_FILE: &str = "gantry-runtime.json";
pub const RUNTIME_LOG: &str = "log.json";

/// One container: its init, its execs, and what Delete must undo.
pub struct Container {
    id: String,
    namespace: String,
    bundle: PathBuf,
    runtime: Arc<dyn Runtime>,
    init: Arc<Process>,
    crio: bool,
    log: Logger,
    execs: Mutex<HashMap<String, Arc<Process>>>,
    /// Exec count and init's reaping: init's exit is published last (see [`crate::exits`]).
    exits: ExitOrder,
    /// No pid namespace of its own: the rest of its processes are killed when init exits.
    kill_all_on_exit: bool,
    rootfs_mounted: Option<PathBuf>,
    console_dir: PathBuf,
    reaper: Reaper,
    /// The container's cgroup, located from init's pid right after create, and its OOM kills.
    cgroup: CgroupWatch,
    /// Init's exit, subscribed the moment its pid was known; taken by the exit monitor.
    init_exit: Mutex<Option<tokio::sync::oneshot::Receiver<crate::reaper::Exit>>>,
    /// Kills of init whose runtime call has not returned. Init's exit waits for them: an engine
    /// that learns of the exit deletes the task and closes its connection, and a Kill reply
    /// still unsent then reaches the engine as "ttrpc: closed" (containerd's CRI failed a
    /// StopPodSandbox so under load).
    kills: tokio::sync::watch::Sender<usize>,
    /// Serves the container's watched syscalls; ends with the container's last process.
    #[allow(dead_code)]
    notifier: Option<crate::notifier::Notifier>,
}

/// Counts one kill of init in flight until dropped.
struct KillInFlight<'a>(&'a tokio::sync::watch::Sender<usize>);

impl<'a> KillInFlight<'a> {
    fn new(kills: &'a tokio::sync::watch::Sender<usize>) -> Self {
        kills.send_modify(|n| *n += 1);
        KillInFlight(kills)
    }
}

impl Drop for KillInFlight<'_> {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n = n.saturating_sub(1));
    }
}

impl Container {
    pub fn id(&self) -> &str {
        &self.id
    }

    pub fn bundle(&self) -> &Path {
        &self.bundle
    }

    pub fn init(&self) -> &Arc<Process> {
        &self.init
    }

    /// The logger carrying the container's id.
    pub fn log(&self) -> &Logger {
        &self.log
    }

    /// Whether the kernel OOM-killed anything in the container so far.
    pub fn oom_killed(&self) -> bool {
        self.cgroup.oom_killed()
    }

    /// New OOM kills since the last call, per the kernel's counter (each becomes a TaskOOM).
    pub fn take_new_ooms(&self) -> u64 {
        let new = self.cgroup.take_new_ooms();
        if new > 0 {
            warn!(self.log, "OOM kill"; "count" => new);
        }
        new
    }

    /// A watcher of the cgroup's OOM kills, when it has a cgroup and the kernel can tell.
    pub fn oom_watcher(&self) -> Option<Result<crate::cgroups::OomWatcher, CgroupError>> {
        self.cgroup.get().map(ContainerCgroup::oom_watcher)
    }

    /// Stats of the container's cgroup as the `Any` engines decode, read off the reactor.
    pub async fn stats(&self) -> Result<Any, TaskError> {
        let cg = self
            .cgroup
            .get()
            .cloned()
            // The runc shim's answer: NOT_FOUND "cgroup does not exist".
            .ok_or_else(|| TaskError::Gone(format!("cgroup does not exist for container {:?}", self.id)))?;
        match off_reactor(move || cg.metrics_any()).await? {
            Ok(any) => Ok(any),
            Err(CgroupError::Gone { .. }) => Err(TaskError::Gone(format!("cgroup of container {:?} is gone", self.id))),
            Err(e) => Err(e.into()),
        }
    }

    /// Takes init's exit subscription (once).
    pub fn take_init_exit(&self) -> Option<tokio::sync::oneshot::Receiver<crate::reaper::Exit>> {
        self.init_exit.lock().unwrap_or_else(|e| e.into_inner()).take()
    }

    fn execs(&self) -> MutexGuard<'_, HashMap<String, Arc<Process>>> {
        self.execs.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The init process (empty exec id) or the named exec.
    pub fn process(&self, exec_id: &str) -> Result<Arc<Process>, TaskError> {
        if exec_id.is_empty() {
            return Ok(self.init.clone());
        }
        self.execs()
            .get(exec_id)
            .cloned()
            .ok_or_else(|| TaskError::ExecNotFound {
                id: self.id.clone(),
                exec: exec_id.to_string(),
            })
    }

    /// The container's processes as its runtime lists them (`runc ps`).
    pub async fn runtime_pids(&self) -> Result<Vec<i32>, crate::runtime::RuntimeError> {
        self.runtime.ps(&self.id).await
    }

    /// Exec ids by pid, for the execs that have one (Pids names them).
    pub fn exec_pids(&self) -> HashMap<i32, String> {
        self.execs()
            .iter()
            .filter(|(_, p)| p.pid() > 0)
            .map(|(id, p)| (p.pid(), id.clone()))
            .collect()
    }

    pub fn exec_ids(&self) -> Vec<String> {
        self.execs().keys().cloned().collect()
    }

    /// Starts init; returns its pid.
    pub async fn start_init(&self) -> Result<i32, TaskError> {
        let claim = self.init.begin_start(&self.id)?;
        self.runtime.start(&self.id).await?;
        claim.started();
        Ok(self.init.pid())
    }

    /// Records init's exit once every counted exec's exit is out (see [`crate::exits`]).
    pub async fn init_exited(&self, exit: crate::reaper::Exit) -> ExitInfo {
        self.exits.set_init_reaped();
        if self.kill_all_on_exit {
            if let Err(e) = self.runtime.kill(&self.id, libc::SIGKILL as u32, true).await {
                warn!(self.log, "cannot kill the processes init left"; "error" => %e);
            }
        }
        self.exits.execs_done().await;
        let mut kills = self.kills.subscribe();
        if tokio::time::timeout(OUTPUT_DRAIN, kills.wait_for(|n| *n == 0))
            .await
            .is_err()
        {
            warn!(self.log, "a kill of init is still running after its exit; publishing the exit"; "bound_s" => OUTPUT_DRAIN.as_secs());
        }
        if !self.init.io().drain(OUTPUT_DRAIN).await {
            warn!(self.log, "terminal output still flowing after the exit; the rest is dropped"; "bound_s" => OUTPUT_DRAIN.as_secs());
        }
        if self.crio && self.oom_killed() && exit.status != 0 {
            // CRI-O learns of OOM kills only from this file, which must exist before Wait returns.
            if let Err(e) = files::write_atomic(&self.bundle.join("oom"), b"") {
                warn!(self.log, "cannot write oom marker"; "error" => %e);
            }
        }
        let info = ExitInfo {
            pid: exit.pid,
            status: exit.status,
            at: exit.at,
        };
        self.init.set_exited(info);
        info!(self.log, "exited"; "pid" => exit.pid, "status" => exit.status);
        info
    }

    /// Signals init (through the runtime) or an exec. Codes as containerd's Go shim returns
    /// them: INVALID_ARGUMENT for a signal that does not exist, NOT_FOUND "process already
    /// finished" for a process that exited, except that SIGKILL and SIGTERM to an exited
    /// process succeed (CRI-O stops containers that way whether or not they still run).
    pub async fn kill(&self, exec_id: &str, signal: u32, all: bool) -> Result<(), TaskError> {
        check_signal(signal)?;
        let p = self.process(exec_id)?;
        let terminating = signal == libc::SIGKILL as u32 || signal == libc::SIGTERM as u32;
        let reaped = p.status() == Status::Stopped || exec_id.is_empty() && self.exits.init_reaped();
        if reaped {
            return if terminating { Ok(()) } else { Err(finished()) };
        }
        if exec_id.is_empty() {
            if signal == 0 {
                return signal_pid(p.pid(), 0).map_err(|_| finished());
            }
            let _in_flight = KillInFlight::new(&self.kills);
            return match self.runtime.kill(&self.id, signal, all).await {
                Ok(()) => Ok(()),
                // The process exited between the check and the runtime call.
                Err(e) if e.is_not_running() || self.exits.init_reaped() => {
                    if terminating {
                        Ok(())
                    } else {
                        Err(finished())
                    }
                }
                Err(e) => Err(e.into()),
            };
        }
        if matches!(p.status(), Status::Created | Status::Starting) {
            return Err(TaskError::Precondition(format!("exec {exec_id:?} has not started")));
        }
        match signal_pid(p.pid(), signal) {
            Ok(()) => Ok(()),
            Err(nix::Error::ESRCH) if terminating => Ok(()),
            Err(nix::Error::ESRCH) => Err(finished()),
            Err(e) => Err(TaskError::Internal(format!("signal {signal} to exec {exec_id:?}: {e}"))),
        }
    }

    /// Deletes the container: runtime state, mounts, files. Init must have exited or never started.
    pub async fn delete(&self) -> Result<ExitInfo, TaskError> {
        self.init.check(&self.id, Op::Delete)?;
        match self.runtime.delete(&self.id, true).await {
            Ok(()) => {}
            Err(e) if e.is_not_found() => {}
            Err(e) => return Err(e.into()),
        }
        // A never-started init is killed by the delete; its exit arrives through the reaper.
        let exit = match tokio::time::timeout(Duration::from_secs(5), self.init.wait()).await {
            Ok(e) => e,
            Err(_) => ExitInfo {
                pid: self.init.pid(),
                status: 137,
                at: SystemTime::now(),
            },
        };
        if let Some(n) = &self.notifier {
            n.finish().await;
        }
        let execs: Vec<_> = self.execs().drain().collect();
        for (exec_id, p) in execs {
            let _ = std::fs::remove_file(self.exec_spec_path(&exec_id));
            p.io().shutdown().await;
        }
        self.init.io().shutdown().await;
        if let Some(t) = &self.rootfs_mounted {
            mount::unmount_all(t)?;
        }
        for f in [INIT_PID_FILE, RUNTIME_FILE, RUNTIME_LOG] {
            files::remove_entry(&self.bundle.join(f));
        }
        info!(self.log, "deleted"; "status" => exit.status);
        Ok(exit)
    }

    /// Applies new resource limits (an OCI `LinuxResources` JSON) to the running container.
    pub async fn update(&self, resources: &Any) -> Result<(), TaskError> {
        let parsed: oci_spec::runtime::LinuxResources = serde_json::from_slice(&resources.value).map_err(|e| {
            invalid(format!(
                "update {:?}: resources are not OCI LinuxResources JSON: {e}",
                self.id
            ))
        })?;
        if matches!(self.init.status(), Status::Stopped) {
            return Err(TaskError::Precondition(format!(
                "container {:?} has stopped: cannot update",
                self.id
            )));
        }
        // One file per call: concurrent Updates never share (or truncate) each other's.
        static SEQ: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(0);
        let n = SEQ.fetch_add(1, Ordering::Relaxed);
        let path = self.bundle.join(format!("gantry-update-{n}.json"));
        let json = serde_json::to_vec(&parsed).map_err(|e| TaskError::Internal(e.to_string()))?;
        files::write_atomic(&path, &json).map_err(|e| TaskError::Internal(format!("write {}: {e}", path.display())))?;
        let result = self.runtime.update(&self.id, &path).await;
        let _ = std::fs::remove_file(&path);
        result?;
        info!(self.log, "updated resources");
        Ok(())
    }

    /// Checkpoints the container with the runtime's `checkpoint` (CRIU) into `image`.
    pub async fn checkpoint(&self, image: &Path, work: &Path, exit: bool) -> Result<(), TaskError> {
        if self.init.status() != Status::Running {
            return Err(TaskError::Precondition(format!(
                "container {:?} is not running",
                self.id
            )));
        }
        crate::runtime::criu_available(&self.reaper)
            .await
            .map_err(TaskError::Unimplemented)?;
        self.runtime.checkpoint(&self.id, image, work, exit).await?;
        Ok(())
    }

    pub async fn pause(&self) -> Result<(), TaskError> {
        let to = self.init.check(&self.id, Op::Pause)?;
        self.runtime.pause(&self.id).await?;
        self.init.apply(to);
        Ok(())
    }

    pub async fn resume(&self) -> Result<(), TaskError> {
        let to = self.init.check(&self.id, Op::Resume)?;
        self.runtime.resume(&self.id).await?;
        self.init.apply(to);
        Ok(())
    }
}

fn finished() -> TaskError {
    TaskError::Gone("process already finished".into())
}

/// Refuses a signal number the kernel does not have (1..=SIGRTMAX, or 0 for a liveness probe).
fn check_signal(signal: u32) -> Result<(), TaskError> {
    if signal > libc::SIGRTMAX() as u32 {
        return Err(TaskError::InvalidArgument(format!(
            "invalid signal {signal}: signals are 0 to {}",
            libc::SIGRTMAX()
        )));
    }
    Ok(())
}

fn signal_pid(pid: i32, signal: u32) -> Result<(), nix::Error> {
    if pid <= 0 {
        return Err(nix::Error::ESRCH);
    }
    // Raw kill(2): real-time signals have no `nix::Signal` variant.
    // SAFETY: kill has no memory-safety preconditions.
    let rc = unsafe { libc::kill(pid, signal as libc::c_int) };
    nix::Error::result(rc).map(drop)
}
