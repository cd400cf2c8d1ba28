//! A container held by the daemon: its bundle, rootfs mounts, OCI runtime, init process and
//! execs, and every operation the Task API performs on them. Create undoes all it did when a
//! step fails, so a refused container leaves no mounts, runtime state, sockets or files.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant, SystemTime};

use containerd_shim_protos::api::Mount;
use containerd_shim_protos::protobuf::well_known_types::any::Any;
use serde::{Deserialize, Serialize};
use slog::{info, o, warn, Logger};
use thiserror::Error;

use crate::cgroups::{CgroupError, ContainerCgroup};
use crate::config::{Config, ConfigError};
use crate::files;
use crate::io::{self, IoError, StdioPaths};
use crate::mount::{self, MountError};
use crate::options::{self, EngineOptions};
use crate::process::{ExitInfo, Op, Process, StateError, Status};
use crate::reaper::Reaper;
use crate::runtime::{OciRuntime, RuntimeError, Spawn};
use crate::spec::{self, SpecError};

/// Files gantry writes into a bundle, removed on Delete.
pub const INIT_PID_FILE: &str = "init.pid";
pub const RUNTIME_FILE: &str = "gantry-runtime.json";
pub const RUNTIME_LOG: &str = "log.json";

#[derive(Debug, Error)]
pub enum TaskError {
    #[error("container {0:?} not found")]
    NotFound(String),
    /// Something other than a container is missing or gone (a process that finished, a
    /// cgroup): NOT_FOUND with the message as it stands.
    #[error("{0}")]
    Gone(String),
    #[error("exec {exec:?} not found in container {id:?}")]
    ExecNotFound { id: String, exec: String },
    #[error("{0} already exists")]
    AlreadyExists(String),
    #[error("{0}")]
    InvalidArgument(String),
    #[error("{0}")]
    Precondition(String),
    #[error("{0}")]
    Unimplemented(String),
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Io(#[from] IoError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Mount(#[from] MountError),
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error("{0}")]
    Internal(String),
}

/// What `delete` (the subcommand, after a daemon died) needs to clean up a bundle.
#[derive(Debug, Serialize, Deserialize)]
pub struct RuntimeRecord {
    pub binary: String,
    pub root: PathBuf,
    pub systemd_cgroup: bool,
    pub rootfs_mounted: bool,
    /// Where the daemon's socket lives: `delete` removes a dead daemon's socket only there.
    #[serde(default = "default_socket_dir")]
    pub socket_dir: PathBuf,
}

fn default_socket_dir() -> PathBuf {
    crate::config::ShimConfig::default().socket_dir
}

/// Everything Create needs.
pub struct CreateParams {
    pub id: String,
    pub bundle: PathBuf,
    pub rootfs: Vec<Mount>,
    pub stdio: StdioPaths,
    pub options: Option<Any>,
    pub namespace: String,
    /// Directory for console sockets (short paths).
    pub console_dir: PathBuf,
}

pub struct Container {
    pub id: String,
    pub namespace: String,
    pub bundle: PathBuf,
    pub runtime: OciRuntime,
    pub init: Arc<Process>,
    pub crio: bool,
    pub log: Logger,
    execs: Mutex<HashMap<String, Arc<Process>>>,
    /// Set the moment init is reaped: no exec may start after that.
    init_reaped: AtomicBool,
    rootfs_mounted: Option<PathBuf>,
    console_dir: PathBuf,
    reaper: Reaper,
    /// The container's cgroup, located from init's pid right after create.
    pub cgroup: Option<ContainerCgroup>,
    /// OOM kills already reported (TaskOOM published), against the kernel's counter.
    ooms_reported: std::sync::atomic::AtomicU64,
    /// Set once any OOM kill hit the container.
    oom_killed: AtomicBool,
    /// Init's exit, subscribed the moment its pid was known; taken by the exit monitor.
    init_exit: Mutex<Option<tokio::sync::oneshot::Receiver<crate::reaper::Exit>>>,
}

/// Undoes a half-done create when dropped without `disarm`.
struct Undo<'a> {
    armed: bool,
    bundle: &'a Path,
    mounted: Option<PathBuf>,
    original_config: Option<Vec<u8>>,
}

impl Undo<'_> {
    fn run(&mut self) {
        if !self.armed {
            return;
        }
        self.armed = false;
        if let Some(t) = &self.mounted {
            let _ = mount::unmount_all(t);
        }
        if let Some(raw) = &self.original_config {
            let _ = files::write_atomic(&spec::config_path(self.bundle), raw);
        }
        for f in [INIT_PID_FILE, RUNTIME_FILE, RUNTIME_LOG] {
            files::remove_entry(&self.bundle.join(f));
        }
    }
}

impl Drop for Undo<'_> {
    fn drop(&mut self) {
        self.run();
    }
}

fn invalid(e: impl std::fmt::Display) -> TaskError {
    TaskError::InvalidArgument(e.to_string())
}

impl Container {
    /// Prepares the bundle and runs the OCI runtime's `create`.
    pub async fn create(p: CreateParams, reaper: Reaper, log: &Logger) -> Result<Arc<Container>, TaskError> {
        spec::validate_id(&p.id).map_err(invalid)?;
        let log = log.new(o!("id" => p.id.clone()));
        if !p.bundle.is_absolute() || !p.bundle.is_dir() {
            return Err(invalid(format!(
                "bundle {:?} is not an existing absolute directory",
                p.bundle
            )));
        }
        let mut loaded = spec::load(&p.bundle).map_err(invalid)?;
        if let Err(why) = &loaded.spec {
            warn!(log, "config.json holds values gantry does not model; the runtime gets it as is"; "why" => why.to_string());
        }
        let engine = p.options.as_ref().map(options::from_any).unwrap_or_default();
        let (config, config_file) = Config::resolve(engine.config_path.as_deref()).map_err(invalid)?;
        let runtime = runtime_for(&engine, &config, &p.namespace, &p.bundle, reaper.clone());
        let annotations = loaded.view.annotations();
        let crio = spec::is_crio(&annotations);

        let mut undo = Undo {
            armed: true,
            bundle: &p.bundle,
            mounted: None,
            original_config: None,
        };
        if !p.rootfs.is_empty() {
            // The resolved target (the bundle may sit behind a symlink): what is unmounted later.
            undo.mounted = Some(mount::mount_all(&p.rootfs, &p.bundle.join("rootfs"))?);
        } else {
            let root = loaded.view.root_path(&p.bundle);
            if !root.is_dir() {
                return Err(invalid(format!("rootfs {} does not exist", root.display())));
            }
        }

        let edits = spec::edit(&p.bundle, &mut loaded, &config).map_err(|e| match e {
            SpecError::Devices(d) => TaskError::InvalidArgument(d.to_string()),
            SpecError::Security(s) => TaskError::InvalidArgument(format!("container {:?}: {s}", p.id)),
            other => TaskError::Spec(other),
        })?;
        for w in &edits.devices.warnings {
            warn!(log, "device injection"; "warning" => w);
        }
        crate::security::log(&log, &edits.security);
        if edits.changed() {
            spec::save(&p.bundle, &loaded)?;
            undo.original_config = Some(loaded.raw);
            if !edits.devices.is_empty() {
                info!(log, "injected devices"; "devices" => edits.devices.devices.join(","));
            }
        }

        let record = RuntimeRecord {
            binary: runtime.binary.clone(),
            root: runtime.root.clone(),
            systemd_cgroup: runtime.systemd_cgroup,
            rootfs_mounted: undo.mounted.is_some(),
            socket_dir: p.console_dir.clone(),
        };
        let record_json = serde_json::to_vec(&record).map_err(|e| TaskError::Internal(e.to_string()))?;
        files::write_atomic(&p.bundle.join(RUNTIME_FILE), &record_json)
            .map_err(|e| TaskError::Internal(format!("write {RUNTIME_FILE}: {e}")))?;
        // Fresh regular files where the runtime writes (its log, the pid file), whatever was
        // planted under those names: the runtime opens them by path.
        files::remove_entry(&p.bundle.join(INIT_PID_FILE));
        files::write_atomic(&p.bundle.join(RUNTIME_LOG), b"")
            .map_err(|e| TaskError::Internal(format!("write {RUNTIME_LOG}: {e}")))?;

        let owner = io::Owner {
            id: &p.id,
            namespace: &p.namespace,
            reaper: &reaper,
        };
        let prepared = io::prepare(&p.stdio, &p.console_dir, &owner).await?;
        let process = Arc::new(Process::new("", p.stdio.clone(), prepared.io.clone()));
        let pid_file = p.bundle.join(INIT_PID_FILE);
        let started = Instant::now();
        let spawn = Spawn {
            pid_file: &pid_file,
            console_socket: prepared.console.as_ref().map(|c| c.path.as_path()),
            stdio: prepared.stdio,
        };
        let created = run_with_console(
            runtime.create(&p.id, &p.bundle, spawn),
            prepared.console.as_ref(),
            &prepared.io,
            &p.stdio,
        )
        .await;
        if let Err(e) = created {
            warn!(log, "create failed"; "error" => %e);
            // The runtime may have left state behind (e.g. a failed start of runc init).
            let _ = runtime.delete(&p.id, true).await;
            prepared.io.shutdown().await;
            return Err(e);
        }
        let pid = match read_pid(&pid_file) {
            Ok(pid) => pid,
            Err(e) => {
                let _ = runtime.delete(&p.id, true).await;
                prepared.io.shutdown().await;
                return Err(e);
            }
        };
        process.set_pid(pid);
        let init_exit = reaper.subscribe_since(pid, Some(started));
        undo.armed = false;
        info!(log, "created"; "pid" => pid, "oci_runtime" => &runtime.binary,
            "config" => config_file.map(|p| p.display().to_string()).unwrap_or_else(|| "defaults".into()));
        let cgroup = match ContainerCgroup::for_pid(pid) {
            Ok(c) => Some(c),
            Err(e) => {
                warn!(log, "cgroup not found: no stats or OOM events"; "error" => %e);
                None
            }
        };
        let ooms_baseline = cgroup.as_ref().and_then(|c| c.oom_kills().ok()).unwrap_or(0);
        Ok(Arc::new(Container {
            cgroup,
            ooms_reported: std::sync::atomic::AtomicU64::new(ooms_baseline),
            oom_killed: AtomicBool::new(false),
            init_exit: Mutex::new(Some(init_exit)),
            id: p.id,
            namespace: p.namespace,
            rootfs_mounted: undo.mounted.take(),
            bundle: p.bundle.clone(),
            runtime,
            init: process,
            crio,
            log,
            execs: Mutex::new(HashMap::new()),
            init_reaped: AtomicBool::new(false),
            console_dir: p.console_dir,
            reaper,
        }))
    }

    /// New OOM kills since the last call, per the kernel's counter (each becomes a TaskOOM).
    pub fn take_new_ooms(&self) -> u64 {
        let Some(cg) = &self.cgroup else { return 0 };
        let Ok(now) = cg.oom_kills() else { return 0 };
        let before = self.ooms_reported.swap(now, Ordering::SeqCst);
        let new = now.saturating_sub(before);
        if new > 0 {
            self.oom_killed.store(true, Ordering::SeqCst);
            warn!(self.log, "OOM kill"; "count" => new);
        }
        new
    }

    /// Stats of the container's cgroup as the `Any` engines decode.
    pub fn stats(&self) -> Result<Any, TaskError> {
        let cg = self
            .cgroup
            .as_ref()
            .ok_or_else(|| TaskError::Precondition(format!("container {:?} has no cgroup to read", self.id)))?;
        match cg.metrics_any() {
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

    pub fn exec_ids(&self) -> Vec<String> {
        self.execs().keys().cloned().collect()
    }

    /// Starts init; returns its pid.
    pub async fn start_init(&self) -> Result<i32, TaskError> {
        let to = self.init.check(&self.id, Op::Start)?;
        self.runtime.start(&self.id).await?;
        self.init.apply(to);
        Ok(self.init.pid())
    }

    /// Registers an exec (Exec RPC); it runs on Start.
    pub fn add_exec(&self, exec_id: &str, stdio: StdioPaths, spec: &Any) -> Result<(), TaskError> {
        spec::validate_id(exec_id).map_err(invalid)?;
        if self.init_reaped.load(Ordering::SeqCst) || self.init.status() == Status::Stopped {
            return Err(TaskError::Precondition(format!(
                "container {:?} has stopped: cannot exec",
                self.id
            )));
        }
        // Parsed only to refuse a malformed spec here, with INVALID_ARGUMENT, rather than at Start;
        // a value newer than oci-spec's model is the runtime's to judge.
        match serde_json::from_slice::<oci_spec::runtime::Process>(&spec.value) {
            Err(e) if !spec::is_newer_than_model(&e) => {
                return Err(invalid(format!("exec {exec_id:?} process spec: {e}")));
            }
            _ => {}
        }
        let mut execs = self.execs();
        if execs.contains_key(exec_id) {
            return Err(TaskError::AlreadyExists(format!(
                "exec {exec_id:?} in container {:?}",
                self.id
            )));
        }
        let json = exec_process_json(exec_id, &spec.value, stdio.terminal)?;
        let json = spec::edit_exec(&self.bundle, json);
        let p = Arc::new(Process::new(exec_id, stdio, Arc::default()));
        files::write_atomic(&self.exec_spec_path(exec_id), &json)
            .map_err(|e| TaskError::Internal(format!("write exec spec: {e}")))?;
        execs.insert(exec_id.to_string(), p);
        Ok(())
    }

    fn exec_spec_path(&self, exec_id: &str) -> PathBuf {
        self.bundle.join(format!("exec-{exec_id}.json"))
    }

    fn exec_pid_path(&self, exec_id: &str) -> PathBuf {
        self.bundle.join(format!("exec-{exec_id}.pid"))
    }

    /// Runs a registered exec; returns the exec process and its pid. The exit subscription is
    /// taken before returning so a fast exit is never lost.
    pub async fn start_exec(
        &self,
        exec_id: &str,
    ) -> Result<(Arc<Process>, tokio::sync::oneshot::Receiver<crate::reaper::Exit>), TaskError> {
        let p = self.process(exec_id)?;
        let to = p.check(exec_id, Op::Start)?;
        if self.init_reaped.load(Ordering::SeqCst) {
            return Err(TaskError::Precondition(format!(
                "container {:?} has stopped: cannot exec",
                self.id
            )));
        }
        let owner = io::Owner {
            id: &self.id,
            namespace: &self.namespace,
            reaper: &self.reaper,
        };
        let prepared = io::prepare(&p.stdio, &self.console_dir, &owner).await?;
        let pid_file = self.exec_pid_path(exec_id);
        files::remove_entry(&pid_file);
        let spec_file = self.exec_spec_path(exec_id);
        let started = Instant::now();
        let spawn = Spawn {
            pid_file: &pid_file,
            console_socket: prepared.console.as_ref().map(|c| c.path.as_path()),
            stdio: prepared.stdio,
        };
        let result = run_with_console(
            self.runtime.exec(&self.id, &spec_file, spawn),
            prepared.console.as_ref(),
            &prepared.io,
            &p.stdio,
        )
        .await;
        let _ = std::fs::remove_file(&spec_file);
        let pid = result.and_then(|_| read_pid(&pid_file));
        let _ = std::fs::remove_file(&pid_file);
        let pid = match pid {
            Ok(pid) => pid,
            Err(e) => {
                // Handles opened for a failed exec close here, so the client's FIFOs see EOF.
                prepared.io.shutdown().await;
                drop(prepared.io);
                p.set_exited(ExitInfo {
                    pid: 0,
                    status: 255,
                    at: SystemTime::now(),
                });
                return Err(e);
            }
        };
        p.set_pid(pid);
        p.set_io(prepared.io);
        let rx = self.reaper.subscribe_since(pid, Some(started));
        p.apply(to);
        Ok((p, rx))
    }

    /// Records init's exit once every exec has exited (the runc shim's order: execs first).
    pub async fn init_exited(&self, exit: crate::reaper::Exit) -> ExitInfo {
        self.init_reaped.store(true, Ordering::SeqCst);
        let running: Vec<_> = self
            .execs()
            .values()
            .filter(|p| matches!(p.status(), Status::Running | Status::Paused))
            .cloned()
            .collect();
        if !running.is_empty() {
            let all = futures_wait_all(&running);
            if tokio::time::timeout(Duration::from_secs(2), all).await.is_err() {
                // Execs outlive init only when the container shares a pid namespace.
                let _ = self.runtime.kill(&self.id, libc::SIGKILL as u32, true).await;
                let _ = tokio::time::timeout(Duration::from_secs(5), futures_wait_all(&running)).await;
            }
        }
        self.init.io().drain(Duration::from_secs(2)).await;
        if self.crio && self.oom_killed.load(Ordering::SeqCst) && exit.status != 0 {
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
        let reaped = p.status() == Status::Stopped || exec_id.is_empty() && self.init_reaped.load(Ordering::SeqCst);
        if reaped {
            return if terminating { Ok(()) } else { Err(finished()) };
        }
        if exec_id.is_empty() {
            if signal == 0 {
                return signal_pid(p.pid(), 0).map_err(|_| finished());
            }
            return match self.runtime.kill(&self.id, signal, all).await {
                Ok(()) => Ok(()),
                // The process exited between the check and the runtime call.
                Err(e) if e.is_not_running() || self.init_reaped.load(Ordering::SeqCst) => {
                    if terminating {
                        Ok(())
                    } else {
                        Err(finished())
                    }
                }
                Err(e) => Err(e.into()),
            };
        }
        if p.status() == Status::Created {
            return Err(TaskError::Precondition(format!("exec {exec_id:?} has not started")));
        }
        match signal_pid(p.pid(), signal) {
            Ok(()) => Ok(()),
            Err(nix::Error::ESRCH) if terminating => Ok(()),
            Err(nix::Error::ESRCH) => Err(finished()),
            Err(e) => Err(TaskError::Internal(format!("signal {signal} to exec {exec_id:?}: {e}"))),
        }
    }

    /// Deletes an exec; returns its exit.
    pub async fn delete_exec(&self, exec_id: &str) -> Result<ExitInfo, TaskError> {
        let p = self.process(exec_id)?;
        p.check(exec_id, Op::Delete)?;
        self.execs().remove(exec_id);
        let _ = std::fs::remove_file(self.exec_spec_path(exec_id));
        p.io().shutdown().await;
        Ok(p.exit().unwrap_or(ExitInfo {
            pid: p.pid(),
            status: 0,
            at: SystemTime::now(),
        }))
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
        crate::runtime::criu_available()
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

/// The exec's process JSON as the runtime gets it: the request's `terminal` wins over the
/// spec's, as in the runc shim (CRI-O copies the container's process, `terminal: false`, and asks
/// for a tty in the request; runc refuses a console socket for a non-terminal process). Every
/// other field, modelled or not, is kept as sent.
fn exec_process_json(exec_id: &str, raw: &[u8], terminal: bool) -> Result<Vec<u8>, TaskError> {
    let mut value: serde_json::Value =
        serde_json::from_slice(raw).map_err(|e| invalid(format!("exec {exec_id:?} process spec: {e}")))?;
    let Some(process) = value.as_object_mut() else {
        return Err(invalid(format!("exec {exec_id:?} process spec is not a JSON object")));
    };
    process.insert("terminal".into(), terminal.into());
    serde_json::to_vec(&value).map_err(|e| TaskError::Internal(format!("exec {exec_id:?} process spec: {e}")))
}

async fn futures_wait_all(ps: &[Arc<Process>]) {
    for p in ps {
        p.wait().await;
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

fn read_pid(path: &Path) -> Result<i32, TaskError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| TaskError::Internal(format!("read pid file {}: {e}", path.display())))?;
    text.trim()
        .parse()
        .map_err(|e| TaskError::Internal(format!("pid file {}: {e}", path.display())))
}

/// Runs a runtime create/exec while receiving the pty master on the console socket.
async fn run_with_console(
    fut: impl std::future::Future<Output = Result<(), RuntimeError>>,
    console: Option<&io::ConsoleSocket>,
    pio: &io::ProcessIo,
    stdio: &StdioPaths,
) -> Result<(), TaskError> {
    let Some(console) = console else {
        return fut.await.map_err(TaskError::from);
    };
    let recv = console.receive();
    tokio::pin!(fut);
    tokio::pin!(recv);
    let mut master = None;
    let mut done = None;
    while done.is_none() {
        tokio::select! {
            r = &mut fut, if done.is_none() => done = Some(r),
            m = &mut recv, if master.is_none() => master = Some(m),
        }
    }
    done.unwrap_or(Ok(()))?;
    let master = match master {
        Some(m) => m?,
        None => tokio::time::timeout(Duration::from_secs(5), recv)
            .await
            .map_err(|_| TaskError::Internal("the runtime sent no pty master".into()))??,
    };
    pio.attach_console(master, stdio)?;
    Ok(())
}

/// Picks the OCI runtime: runc `Options` from the engine first, then the config file.
pub fn runtime_for(
    engine: &EngineOptions,
    config: &Config,
    namespace: &str,
    bundle: &Path,
    reaper: Reaper,
) -> OciRuntime {
    let binary = engine
        .binary_name
        .clone()
        .unwrap_or_else(|| config.runtime.binary.clone());
    let root = engine
        .root
        .as_ref()
        .map(PathBuf::from)
        .unwrap_or_else(|| config.runtime.root.clone())
        .join(namespace);
    OciRuntime::new(
        &binary,
        root,
        engine.systemd_cgroup || config.runtime.systemd_cgroup,
        bundle.join(RUNTIME_LOG),
        reaper,
    )
    .with_timeouts(config.runtime.timeouts)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_terminal_comes_from_the_request_and_unknown_fields_stay() {
        let raw = br#"{"terminal":false,"args":["sh"],"cwd":"/","vendorThing":{"x":1}}"#;
        let out: serde_json::Value = serde_json::from_slice(&exec_process_json("e", raw, true).unwrap()).unwrap();
        assert_eq!(out["terminal"], true);
        assert_eq!(out["vendorThing"]["x"], 1);
        assert_eq!(out["args"][0], "sh");
        let raw = br#"{"terminal":true,"args":["sh"],"cwd":"/"}"#;
        let out: serde_json::Value = serde_json::from_slice(&exec_process_json("e", raw, false).unwrap()).unwrap();
        assert_eq!(out["terminal"], false);
        assert!(matches!(
            exec_process_json("e", b"[1]", true),
            Err(TaskError::InvalidArgument(_))
        ));
    }
}
