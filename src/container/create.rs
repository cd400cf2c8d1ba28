//! Create: prepare the bundle (rootfs mounts, spec edits, the runtime record), run the
//! runtime's `create`, and build the [`Container`]. Every step is undone when a later one
//! fails, or when the Create's future is dropped midway.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::Instant;

use containerd_shim_protos::api::Mount;
use slog::{info, o, warn, Logger};

use super::console::{read_pid, run_with_console};
use super::{invalid, off_reactor, CgroupWatch, Container, TaskError, INIT_PID_FILE, RUNTIME_FILE, RUNTIME_LOG};
use crate::cgroups::ContainerCgroup;
use crate::config::Config;
use crate::exits::{self, ExitOrder};
use crate::io::{self, StdioPaths};
use crate::notifier::{self, Listener, Notifier};
use crate::options::EngineOptions;
use crate::process::Process;
use crate::reaper::{Exit, Reaper};
use crate::runtime::choose::{RuntimeFactory, RuntimeRecord, Wanted};
use crate::runtime::{Runtime, Spawn};
use crate::security::notify::Watch;
use crate::spec::{self, Loaded, SpecError};
use crate::telemetry::{PodMeta, Telemetry};
use crate::{files, mount};

/// Everything Create needs.
pub struct CreateParams {
    pub id: String,
    pub bundle: PathBuf,
    pub rootfs: Vec<Mount>,
    pub stdio: StdioPaths,
    /// The engine's runc `Options` (or CRI's `config_path`), decoded.
    pub engine: EngineOptions,
    /// The config the engine's options select, and the file it came from.
    pub config: Arc<Config>,
    pub config_file: Option<PathBuf>,
    pub namespace: String,
    /// Directory for console sockets (short paths).
    pub console_dir: PathBuf,
    /// Where watched syscalls are reported.
    pub telemetry: Telemetry,
}

/// Undoes a half-done create when dropped without `disarm`.
struct Undo<'a> {
    armed: bool,
    bundle: &'a Path,
    mounted: Option<PathBuf>,
    original_config: Option<Vec<u8>>,
    /// Set from the runtime's create on until its state is known to be gone: a create dropped
    /// midway (its future cancelled) still has the runtime delete what it may have made.
    runtime: Option<(Arc<dyn Runtime>, String)>,
}

impl Undo<'_> {
    fn run(&mut self) {
        if !self.armed {
            return;
        }
        self.armed = false;
        if let Some((rt, id)) = self.runtime.take() {
            if let Ok(handle) = tokio::runtime::Handle::try_current() {
                handle.spawn(async move {
                    let _ = rt.delete(&id, true).await;
                });
            }
        }
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

/// Init as the runtime created it.
struct Created {
    process: Arc<Process>,
    pid: i32,
    exit: tokio::sync::oneshot::Receiver<Exit>,
}

impl Container {
    /// Prepares the bundle and runs the OCI runtime's `create`.
    pub async fn create(
        p: CreateParams,
        reaper: Reaper,
        runtimes: &RuntimeFactory,
        log: &Logger,
    ) -> Result<Arc<Container>, TaskError> {
        spec::validate_id(&p.id).map_err(invalid)?;
        let log = log.new(o!("id" => p.id.clone()));
        if !p.bundle.is_absolute() || !p.bundle.is_dir() {
            return Err(invalid(format!(
                "bundle {:?} is not an existing absolute directory",
                p.bundle
            )));
        }
        let bundle = p.bundle.clone();
        let loaded = off_reactor(move || spec::load(&bundle)).await?.map_err(invalid)?;
        if let Err(why) = &loaded.spec {
            warn!(log, "config.json holds values gantry does not model; the runtime gets it as is"; "why" => why.to_string());
        }
        let annotations = loaded.view.annotations();
        let crio = spec::is_crio(&annotations);
        let kill_all_on_exit = exits::kills_all_on_exit(&loaded.raw);
        let mut undo = Undo {
            armed: true,
            bundle: &p.bundle,
            mounted: None,
            original_config: None,
            runtime: None,
        };
        let listener = notifier::socket_path(&p.console_dir);
        let init = Arc::new(OnceLock::new());
        let mut notifier = None;
        let runtime = {
            let edited = prepare_bundle(&p, loaded, &listener, &reaper, &mut undo, &log).await?;
            if let Some(watch) = edited.edits.notify.clone() {
                let pod = PodMeta::from_annotations(&annotations);
                notifier = Some(serve_watch(&p, &listener, watch, pod, &init, &log)?);
            }
            runtimes.for_create(&Wanted {
                engine: &p.engine,
                config: &p.config,
                namespace: &p.namespace,
                bundle: &p.bundle,
                annotations: &annotations,
                spec: &edited,
                reaper: &reaper,
                log: &log,
            })
        };
        write_record(&p, runtime.as_ref(), &undo)?;
        let created = run_create(&p, &runtime, &reaper, &mut undo, &log).await?;
        let _ = init.set(created.pid);
        undo.armed = false;
        undo.runtime = None;
        info!(log, "created"; "pid" => created.pid, "oci_runtime" => runtime.identity().binary,
            "config" => p.config_file.as_ref().map(|p| p.display().to_string()).unwrap_or_else(|| "defaults".into()));
        let cgroup = locate_cgroup(created.pid, &log).await;
        Ok(Arc::new(Container {
            cgroup,
            init_exit: Mutex::new(Some(created.exit)),
            kills: tokio::sync::watch::Sender::new(0),
            id: p.id,
            namespace: p.namespace,
            rootfs_mounted: undo.mounted.take(),
            bundle: p.bundle.clone(),
            runtime,
            init: created.process,
            crio,
            log,
            execs: Mutex::new(HashMap::new()),
            exits: ExitOrder::default(),
            kill_all_on_exit,
            console_dir: p.console_dir,
            reaper,
            notifier,
        }))
    }
}

/// Binds the socket the edited profile names (before the runtime's create, which connects to
/// it) and serves the container's watched syscalls there.
fn serve_watch(
    p: &CreateParams,
    listener: &Path,
    watch: Watch,
    pod: PodMeta,
    init: &Arc<OnceLock<i32>>,
    log: &Logger,
) -> Result<Notifier, TaskError> {
    let listener = Listener::bind(listener).map_err(|e| TaskError::Internal(e.to_string()))?;
    let ctx = notifier::Context {
        id: p.id.clone(),
        pod,
        watch,
        telemetry: p.telemetry.clone(),
        log: log.clone(),
        init: init.clone(),
    };
    Ok(notifier::spawn(listener, ctx))
}

/// Init's cgroup and its OOM counters as of now (the baseline later kills are counted from).
async fn locate_cgroup(pid: i32, log: &Logger) -> CgroupWatch {
    let located = off_reactor(move || ContainerCgroup::for_pid(pid).map(CgroupWatch::new)).await;
    match located.and_then(|r| r.map_err(TaskError::from)) {
        Ok(watch) => watch,
        Err(e) => {
            warn!(log, "cgroup not found: no stats or OOM events"; "error" => %e);
            CgroupWatch::default()
        }
    }
}

/// Mounts the rootfs (or checks the engine's) and applies the spec edits, noting each in
/// `undo`. Returns the spec as the runtime will read it.
async fn prepare_bundle(
    p: &CreateParams,
    loaded: Loaded,
    listener: &Path,
    reaper: &Reaper,
    undo: &mut Undo<'_>,
    log: &Logger,
) -> Result<spec::Edited, TaskError> {
    if !p.rootfs.is_empty() {
        // The resolved target (the bundle may sit behind a symlink): what is unmounted later.
        undo.mounted = Some(mount::mount_all(&p.rootfs, &p.bundle.join("rootfs"), reaper).await?);
    } else {
        let root = loaded.view.root_path(&p.bundle);
        if !root.is_dir() {
            return Err(invalid(format!("rootfs {} does not exist", root.display())));
        }
    }
    let refused = |s: crate::security::SecurityError| TaskError::Refused {
        reason: s.reason(),
        message: format!("container {:?}: {s}", p.id),
    };
    crate::security::prepare_host(&p.config.security, reaper)
        .await
        .map_err(refused)?;
    // CDI scans and YAML, libseccomp's validation: off the reactor.
    let (bundle, config, listener) = (p.bundle.clone(), p.config.clone(), listener.to_path_buf());
    let mut edited = off_reactor(move || spec::edit_for_create(&bundle, loaded, &config, &listener))
        .await?
        .map_err(|e| match e {
            SpecError::Devices(d) => TaskError::InvalidArgument(d.to_string()),
            SpecError::Security(s) => refused(s),
            other => TaskError::Spec(other),
        })?;
    let edits = &edited.edits;
    for w in &edits.devices.warnings {
        warn!(log, "device injection"; "warning" => w);
    }
    crate::security::log(log, &edits.security);
    if let Some((asked, floor)) = edits.oom_score_adj {
        info!(log, "oomScoreAdj raised to the daemon's own (restrict_oom_score_adj)"; "asked" => asked, "set" => floor);
    }
    let notify = crate::security::notify::NOTIFY_ANNOTATION;
    if let Some((_, v)) = edits
        .security
        .decisions
        .iter()
        .find(|(k, v)| *k == notify && v.starts_with("engine:"))
    {
        info!(log, "seccomp notify: the engine set its own listener; gantry watches nothing for this container"; "listener" => v.trim_start_matches("engine:"));
    }
    if let Some(bytes) = &edited.write {
        // Noted before the write: nothing between the two can be cancelled. (A written spec
        // has its document, so `Edited::document` no longer needs the original.)
        undo.original_config = Some(std::mem::take(&mut edited.original));
        spec::write(&p.bundle, bytes)?;
        if !edits.devices.is_empty() {
            info!(log, "injected devices"; "devices" => edits.devices.devices.join(","));
        }
    }
    Ok(edited)
}

/// Writes what the runtime and a later `delete` need: the runtime record, and fresh files
/// where the runtime writes.
fn write_record(p: &CreateParams, runtime: &dyn Runtime, undo: &Undo<'_>) -> Result<(), TaskError> {
    let identity = runtime.identity();
    let record = RuntimeRecord {
        format: RuntimeRecord::FORMAT,
        shim: RuntimeRecord::this_shim(),
        binary: identity.binary,
        root: identity.root,
        systemd_cgroup: identity.systemd_cgroup,
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
        .map_err(|e| TaskError::Internal(format!("write {RUNTIME_LOG}: {e}")))
}

/// Opens init's stdio and runs the runtime's `create`; on failure the runtime deletes what it
/// may have left and the stdio closes.
async fn run_create(
    p: &CreateParams,
    runtime: &Arc<dyn Runtime>,
    reaper: &Reaper,
    undo: &mut Undo<'_>,
    log: &Logger,
) -> Result<Created, TaskError> {
    let owner = io::Owner {
        id: &p.id,
        namespace: &p.namespace,
        reaper,
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
    undo.runtime = Some((runtime.clone(), p.id.clone()));
    let console = prepared.console.as_ref();
    let created = run_with_console(runtime.create(&p.id, &p.bundle, spawn), console, &prepared.io, &p.stdio).await;
    match created.and_then(|()| read_pid(&pid_file)) {
        Ok(pid) => {
            process.set_pid(pid);
            // The runtime creates it 0666 less the daemon's umask, which the engine may have left 0.
            files::restrict(&pid_file, 0o644);
            let exit = reaper.subscribe_since(pid, Some(started));
            Ok(Created { process, pid, exit })
        }
        Err(e) => {
            warn!(log, "create failed"; "error" => %e);
            // The runtime may have left state behind (e.g. a failed start of runc init).
            let _ = runtime.delete(&p.id, true).await;
            undo.runtime = None;
            prepared.io.shutdown().await;
            Err(e)
        }
    }
}
