//! The ttrpc Task service: every container of the daemon's group, multiplexed by id. Handlers
//! are thin; the work happens in [`crate::container`]. Errors become ttrpc codes here and
//! only here.

use std::collections::HashMap;
use std::future::Future;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use containerd_shim_protos::api::{CheckpointTaskRequest, StatsRequest, StatsResponse, UpdateTaskRequest};
use containerd_shim_protos::api::{
    CloseIORequest, ConnectRequest, ConnectResponse, CreateTaskRequest, CreateTaskResponse, DeleteRequest,
    DeleteResponse, ExecProcessRequest, KillRequest, PauseRequest, PidsRequest, PidsResponse, ProcessInfo,
    ResizePtyRequest, ResumeRequest, ShutdownRequest, StartRequest, StartResponse, StateRequest, StateResponse,
    Status as ApiStatus, WaitRequest, WaitResponse,
};
use containerd_shim_protos::events::task::{
    TaskCheckpointed, TaskCreate, TaskDelete, TaskExecAdded, TaskExecStarted, TaskExit, TaskOOM, TaskPaused,
    TaskResumed, TaskStart,
};
use containerd_shim_protos::protobuf::well_known_types::empty::Empty;
use containerd_shim_protos::shim_async::Task;
use slog::{debug, info, warn, Logger};
use tokio::sync::Notify;
use ttrpc::r#async::TtrpcContext;

use crate::config::{self, ConfigSource};
use crate::container::{off_reactor, Container, CreateParams, StartedExec, TaskError};
use crate::events::{task_io, ts_field, Event, Publisher};
use crate::inflight::InFlight;
use crate::io::{IoError, StdioPaths};
use crate::options;
use crate::process::{ExitInfo, Status};
use crate::reaper::Reaper;
use crate::runtime::choose::{oci_runtimes, RuntimeFactory};
use crate::runtime::RuntimeError;
use crate::telemetry::trace::Request;
use crate::telemetry::{Kind, Telemetry};

mod task_api;
pub use task_api::{services, Service};

/// Maps an error to the ttrpc status clients act on (NOT_FOUND, ALREADY_EXISTS, ...).
pub fn to_ttrpc(e: &TaskError) -> ttrpc::Error {
    use ttrpc::Code;
    let code = match e {
        TaskError::NotFound(_) | TaskError::ExecNotFound { .. } | TaskError::Gone(_) => Code::NOT_FOUND,
        TaskError::AlreadyExists(_) => Code::ALREADY_EXISTS,
        TaskError::InvalidArgument(_) | TaskError::Refused { .. } | TaskError::Config(_) | TaskError::Spec(_) => {
            Code::INVALID_ARGUMENT
        }
        TaskError::Io(IoError::Open { .. } | IoError::Scheme(_) | IoError::NotAbsolute(_)) => Code::INVALID_ARGUMENT,
        TaskError::Precondition(_) | TaskError::State(_) => Code::FAILED_PRECONDITION,
        TaskError::Unimplemented(_) => Code::UNIMPLEMENTED,
        TaskError::Runtime(r) if r.is_not_found() => Code::NOT_FOUND,
        TaskError::Runtime(RuntimeError::Timeout { .. }) => Code::DEADLINE_EXCEEDED,
        TaskError::Runtime(_) => Code::UNKNOWN,
        // The rootfs mounts are the request's own input (type, source, options).
        TaskError::Mount(crate::mount::MountError::Mount { .. }) => Code::INVALID_ARGUMENT,
        TaskError::Io(_) | TaskError::Mount(_) | TaskError::Cgroup(_) | TaskError::Internal(_) => Code::INTERNAL,
    };
    ttrpc::Error::RpcStatus(ttrpc::get_status(code, e.to_string()))
}

fn api_status(s: Status) -> ApiStatus {
    match s {
        Status::Created | Status::Starting => ApiStatus::CREATED,
        Status::Running => ApiStatus::RUNNING,
        Status::Paused => ApiStatus::PAUSED,
        Status::Stopped => ApiStatus::STOPPED,
    }
}

/// Shared state of the daemon.
pub struct TaskService {
    containers: Mutex<HashMap<String, Arc<Container>>>,
    /// Ids whose Create is in flight (a duplicate must fail at once, not race).
    creating: InFlight,
    publisher: Publisher,
    /// The node's event log (CRI-O reads no events; this is what it gets).
    telemetry: Telemetry,
    reaper: Reaper,
    namespace: String,
    console_dir: PathBuf,
    /// Builds each container's runtime (a fake in unit tests).
    runtimes: RuntimeFactory,
    /// Where each Create's config comes from (fixed in unit tests).
    configs: ConfigSource,
    log: Logger,
    /// Signalled when Shutdown finds no container left.
    pub shutdown: Arc<Notify>,
    /// A Shutdown came while only Creates were in flight: the daemon exits when they end
    /// leaving nothing (an engine's cleanup after a Create that missed its deadline).
    shutdown_pending: AtomicBool,
    /// The daemon's live connections (unset in unit tests).
    connections: std::sync::OnceLock<crate::peer::Connections>,
    /// Gives back what set-up left resident, a while after the last Start.
    settle: Arc<crate::settle::Settler>,
}

type TResult<T> = ttrpc::Result<T>;

impl TaskService {
    pub fn new(publisher: Publisher, reaper: Reaper, namespace: &str, console_dir: PathBuf, log: Logger) -> Self {
        Self {
            containers: Mutex::default(),
            creating: InFlight::default(),
            publisher,
            telemetry: Telemetry::off(),
            reaper,
            namespace: namespace.to_string(),
            console_dir,
            runtimes: oci_runtimes(),
            configs: config::from_files(),
            log,
            shutdown: Arc::new(Notify::new()),
            shutdown_pending: AtomicBool::new(false),
            connections: std::sync::OnceLock::new(),
            settle: Arc::default(),
        }
    }

    /// Lets the service see whether any engine is still connected.
    pub fn set_connections(&self, c: crate::peer::Connections) {
        let _ = self.connections.set(c);
    }

    /// Writes lifecycle events into the event log as well.
    pub fn with_telemetry(mut self, telemetry: Telemetry) -> Self {
        self.telemetry = telemetry;
        self
    }

    pub fn telemetry(&self) -> &Telemetry {
        &self.telemetry
    }

    /// Uses `runtimes` instead of the OCI runtime for new containers.
    pub fn with_runtimes(mut self, runtimes: RuntimeFactory) -> Self {
        self.runtimes = runtimes;
        self
    }

    /// Takes each Create's config from `configs` instead of the files.
    pub fn with_configs(mut self, configs: ConfigSource) -> Self {
        self.configs = configs;
        self
    }

    fn containers(&self) -> MutexGuard<'_, HashMap<String, Arc<Container>>> {
        self.containers.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn get(&self, id: &str) -> Result<Arc<Container>, TaskError> {
        self.containers()
            .get(id)
            .cloned()
            .ok_or_else(|| TaskError::NotFound(id.to_string()))
    }

    /// True when the daemon holds nothing and may exit.
    pub fn is_empty(&self) -> bool {
        self.containers().is_empty() && self.creating.is_empty()
    }

    fn fail(&self, rpc: &str, id: &str, e: TaskError) -> ttrpc::Error {
        let trace = Request::current().and_then(|r| r.traceparent).unwrap_or_default();
        warn!(self.log, "request failed"; "rpc" => rpc, "id" => id, "error" => %e, "traceparent" => trace);
        if let TaskError::Runtime(r) = &e {
            self.telemetry.runtime_error(rpc, id, r);
        }
        to_ttrpc(&e)
    }

    async fn do_create(&self, req: CreateTaskRequest) -> Result<CreateTaskResponse, TaskError> {
        let id = req.id.clone();
        if !req.checkpoint.is_empty() {
            return Err(TaskError::Unimplemented(format!(
                "create {id:?}: restoring from checkpoint {:?} is not supported by gantry",
                req.checkpoint
            )));
        }
        // Cleared however this ends, a cancelled request included.
        let in_use = || self.containers().contains_key(&id);
        let _in_flight = self
            .creating
            .begin(&id, in_use)
            .ok_or_else(|| TaskError::AlreadyExists(format!("container {id:?}")))?;
        let engine = req.options.as_ref().map(options::from_any).unwrap_or_default();
        let (configs, path) = (self.configs.clone(), engine.config_path.clone());
        let (config, config_file) = off_reactor(move || configs(path.as_deref()))
            .await?
            .map_err(|e| TaskError::InvalidArgument(e.to_string()))?;
        let params = CreateParams {
            id: id.clone(),
            bundle: PathBuf::from(&req.bundle),
            rootfs: req.rootfs.clone(),
            stdio: StdioPaths {
                stdin: req.stdin.clone(),
                stdout: req.stdout.clone(),
                stderr: req.stderr.clone(),
                terminal: req.terminal,
            },
            engine,
            config: Arc::new(config),
            config_file,
            namespace: self.namespace.clone(),
            console_dir: self.console_dir.clone(),
            telemetry: self.telemetry.clone(),
        };
        let created = Container::create(params, self.reaper.clone(), &self.runtimes, &self.log).await;
        if let Err(TaskError::Refused { reason, message }) = &created {
            self.telemetry.policy(&id, "deny", reason, message);
        }
        let container = created?;
        let pid = container.init().pid();
        self.containers().insert(id.clone(), container.clone());
        self.publisher.publish(Event::Create(TaskCreate {
            container_id: id.clone(),
            bundle: req.bundle.clone(),
            rootfs: req.rootfs.clone(),
            io: task_io(&req.stdin, &req.stdout, &req.stderr, req.terminal),
            checkpoint: req.checkpoint.clone(),
            pid: pid as u32,
            ..Default::default()
        }));
        self.telemetry.created(&id, PathBuf::from(&req.bundle), pid);
        self.monitor_init(container);
        Ok(CreateTaskResponse {
            pid: pid as u32,
            ..Default::default()
        })
    }

    /// Publishes init's exit once it is reaped (and its execs' exits are out), preceded by
    /// TaskOOM for every OOM kill the kernel counted.
    fn monitor_init(&self, c: Arc<Container>) {
        self.monitor_oom(c.clone());
        let Some(rx) = c.take_init_exit() else { return };
        let publisher = self.publisher.clone();
        let telemetry = self.telemetry.clone();
        tokio::spawn(async move {
            let Ok(exit) = rx.await else { return };
            // An init that exits while Start is in flight is reported after TaskStart.
            drop(c.init().start_lock.lock().await);
            publish_ooms(&publisher, &c);
            let info = c.init_exited(exit).await;
            publisher.publish(exit_event(c.id(), c.id(), info));
            // As for CRI-O's marker: an OOM kill counts when it ended init with a failure.
            let oom = c.oom_killed() && info.status != 0;
            telemetry.exited(c.id(), None, info.pid, info.status, oom);
        });
    }

    /// Arms the OOM watcher right after create; it lives until init exits.
    fn monitor_oom(&self, c: Arc<Container>) {
        let mut watcher = match c.oom_watcher() {
            None => return,
            Some(Ok(w)) => w,
            Some(Err(e)) => {
                debug!(c.log(), "no OOM watcher"; "error" => %e);
                return;
            }
        };
        let publisher = self.publisher.clone();
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    fired = watcher.next() => {
                        if fired.is_none() {
                            break;
                        }
                        publish_ooms(&publisher, &c);
                    }
                    _ = c.init().wait() => break,
                }
            }
        });
    }

    /// Publishes an exec's exit, then releases its place in the count init's exit waits for.
    fn monitor_exec(&self, c: Arc<Container>, exec: StartedExec) {
        let publisher = self.publisher.clone();
        let telemetry = self.telemetry.clone();
        let StartedExec { process: p, exit, slot } = exec;
        tokio::spawn(async move {
            let _slot = slot;
            let Ok(exit) = exit.await else { return };
            let exec_id = p.exec_id.clone();
            if !p.io().drain(crate::container::OUTPUT_DRAIN).await {
                let bound = crate::container::OUTPUT_DRAIN.as_secs();
                warn!(c.log(), "terminal output still flowing after the exit; the rest is dropped"; "exec_id" => &exec_id, "bound_s" => bound);
            }
            let info = ExitInfo {
                pid: exit.pid,
                status: exit.status,
                at: exit.at,
            };
            p.set_exited(info);
            debug!(c.log(), "exec exited"; "exec_id" => &exec_id, "status" => exit.status);
            publisher.publish(exit_event(c.id(), &exec_id, info));
            telemetry.exited(c.id(), Some(&exec_id), info.pid, info.status, false);
        });
    }

    async fn do_start(&self, req: StartRequest) -> Result<StartResponse, TaskError> {
        let c = self.get(&req.id)?;
        let pid = if req.exec_id.is_empty() {
            let _started = c.init().start_lock.lock().await;
            let pid = c.start_init().await?;
            self.publisher.publish(Event::Start(TaskStart {
                container_id: c.id().to_string(),
                pid: pid as u32,
                ..Default::default()
            }));
            self.telemetry.emit(Kind::Start, c.id(), |r| r.pid = Some(pid as u32));
            pid
        } else {
            let exec = c.start_exec(&req.exec_id).await?;
            let pid = exec.process.pid();
            self.publisher.publish(Event::ExecStarted(TaskExecStarted {
                container_id: c.id().to_string(),
                exec_id: req.exec_id.clone(),
                pid: pid as u32,
                ..Default::default()
            }));
            self.telemetry.emit(Kind::ExecStarted, c.id(), |r| {
                r.exec_id = Some(req.exec_id.clone());
                r.pid = Some(pid as u32);
            });
            self.monitor_exec(c.clone(), exec);
            pid
        };
        Ok(StartResponse {
            pid: pid as u32,
            ..Default::default()
        })
    }

    /// After a Create's work: one whose client gave up (its deadline passed, the handler was
    /// dropped) is rolled back as the Go shim's cancelled `runc create` is, since the engine
    /// believes it failed and its own cleanup may already have come and gone; then a Shutdown
    /// that came while it ran takes effect if nothing is left.
    async fn after_create(self: &Arc<Self>, id: &str, created: bool, abandoned: &AtomicBool) {
        // Taken out of the map before the first await: a Delete that waited on this Create
        // finds nothing (NOT_FOUND) rather than deleting it a second time.
        let gave_up = abandoned.load(Ordering::SeqCst);
        let rollback = created && gave_up;
        // In flight again until rolled back: Delete waits, Shutdown does not exit midway.
        let rolling = rollback.then(|| self.creating.begin(id, || false)).flatten();
        let taken = rollback.then(|| self.containers().remove(id)).flatten();
        if let Some(c) = taken {
            warn!(self.log, "create finished after its client gave up: rolled back"; "id" => id);
            match c.delete().await {
                Ok(exit) => self.publisher.publish(delete_event(c.id(), &exit)),
                Err(e) => warn!(self.log, "rolling back an abandoned create"; "id" => id, "error" => %e),
            }
        }
        drop(rolling);
        // containerd's cleanup of a Create past its deadline may send Shutdown while the
        // Create still runs: that Shutdown takes effect now.
        if self.is_empty() && self.shutdown_pending.swap(false, Ordering::SeqCst) {
            info!(self.log, "shutdown"; "id" => id, "exiting" => true, "after" => "create");
            self.shutdown.notify_one();
            return;
        }
        // Or its Shutdown fails on the expired deadline and it only disconnects: once no
        // engine is connected to a daemon left empty by the rollback, nobody will ask again.
        if let (true, Some(conns)) = (gave_up, self.connections.get().cloned()) {
            let svc = self.clone();
            let id = id.to_string();
            tokio::spawn(async move {
                conns.none().await;
                if svc.is_empty() {
                    info!(svc.log, "shutdown"; "id" => id, "exiting" => true, "after" => "abandoned create, no client left");
                    svc.shutdown.notify_one();
                }
            });
        }
    }

    async fn do_delete(&self, req: DeleteRequest) -> Result<DeleteResponse, TaskError> {
        // CRI-O answers a Create that missed its deadline with Delete: it must find what that
        // Create, still running, leaves.
        self.creating.settled(&req.id).await;
        let c = self.get(&req.id)?;
        let exit = if req.exec_id.is_empty() {
            // A Start of init under way ends first: Delete then finds it running or, if the
            // start failed, still created; never a runtime delete racing the runtime start.
            drop(c.init().start_lock.lock().await);
            let exit = c.delete().await?;
            self.containers().remove(&req.id);
            self.publisher.publish(delete_event(c.id(), &exit));
            exit
        } else {
            c.delete_exec(&req.exec_id).await?
        };
        self.telemetry.emit(Kind::Delete, c.id(), |r| {
            r.exec_id = (!req.exec_id.is_empty()).then(|| req.exec_id.clone());
            r.pid = Some(exit.pid as u32);
            r.exit_code = Some(exit.status);
        });
        Ok(DeleteResponse {
            pid: exit.pid as u32,
            exit_status: exit.status,
            exited_at: ts_field(Some(exit.at)),
            ..Default::default()
        })
    }

    fn do_state(&self, req: &StateRequest) -> Result<StateResponse, TaskError> {
        let c = self.get(&req.id)?;
        let p = c.process(&req.exec_id)?;
        let exit = p.exit();
        Ok(StateResponse {
            id: if req.exec_id.is_empty() {
                c.id().to_string()
            } else {
                req.exec_id.clone()
            },
            bundle: c.bundle().display().to_string(),
            pid: p.pid() as u32,
            status: api_status(p.status()).into(),
            stdin: p.stdio.stdin.clone(),
            stdout: p.stdio.stdout.clone(),
            stderr: p.stdio.stderr.clone(),
            terminal: p.stdio.terminal,
            exit_status: exit.map(|e| e.status).unwrap_or_default(),
            exited_at: ts_field(exit.map(|e| e.at)),
            exec_id: req.exec_id.clone(),
            ..Default::default()
        })
    }

    fn do_exec(&self, req: &ExecProcessRequest) -> Result<(), TaskError> {
        let c = self.get(&req.id)?;
        let spec = req
            .spec
            .as_ref()
            .ok_or_else(|| TaskError::InvalidArgument(format!("exec {:?}: no process spec", req.exec_id)))?;
        let stdio = StdioPaths {
            stdin: req.stdin.clone(),
            stdout: req.stdout.clone(),
            stderr: req.stderr.clone(),
            terminal: req.terminal,
        };
        c.add_exec(&req.exec_id, stdio, spec)?;
        self.publisher.publish(Event::ExecAdded(TaskExecAdded {
            container_id: c.id().to_string(),
            exec_id: req.exec_id.clone(),
            ..Default::default()
        }));
        self.telemetry
            .emit(Kind::ExecAdded, c.id(), |r| r.exec_id = Some(req.exec_id.clone()));
        Ok(())
    }
}

impl TaskService {
    async fn do_checkpoint(&self, req: CheckpointTaskRequest) -> Result<Empty, TaskError> {
        let c = self.get(&req.id)?;
        let opts = req
            .options
            .as_ref()
            .and_then(|a| {
                protobuf::Message::parse_from_bytes(&a.value)
                    .ok()
                    .map(|o: containerd_shim_protos::shim::oci::CheckpointOptions| o)
            })
            .unwrap_or_default();
        let image = if opts.image_path.is_empty() {
            req.path.clone()
        } else {
            opts.image_path.clone()
        };
        if image.is_empty() {
            return Err(TaskError::InvalidArgument("checkpoint: no image path".into()));
        }
        let work = if opts.work_path.is_empty() {
            c.bundle().join("criu-work")
        } else {
            PathBuf::from(&opts.work_path)
        };
        c.checkpoint(std::path::Path::new(&image), &work, opts.exit).await?;
        self.publisher.publish(Event::Checkpointed(TaskCheckpointed {
            container_id: c.id().to_string(),
            checkpoint: image,
            ..Default::default()
        }));
        Ok(Empty::new())
    }
}

/// TaskDelete for a container's init.
fn delete_event(id: &str, exit: &ExitInfo) -> Event {
    Event::Delete(TaskDelete {
        container_id: id.to_string(),
        pid: exit.pid as u32,
        exit_status: exit.status,
        exited_at: ts_field(Some(exit.at)),
        // Empty, as the runc shim leaves it for the init process (the only one whose delete
        // is published); containerd's consumers compare the two shims' events field by field.
        ..Default::default()
    })
}

fn publish_ooms(publisher: &Publisher, c: &Container) {
    for _ in 0..c.take_new_ooms() {
        publisher.publish(Event::Oom(TaskOOM {
            container_id: c.id().to_string(),
            ..Default::default()
        }));
    }
}

/// `ProcessDetails{exec_id}` as the runc shim attaches it to an exec's pid in Pids.
fn process_details(exec_id: &str) -> containerd_shim_protos::protobuf::well_known_types::any::Any {
    use containerd_shim_protos::protobuf::Message;
    let details = containerd_shim_protos::shim::oci::ProcessDetails {
        exec_id: exec_id.to_string(),
        ..Default::default()
    };
    containerd_shim_protos::protobuf::well_known_types::any::Any {
        type_url: "containerd.runc.v1.ProcessDetails".into(),
        value: details.write_to_bytes().unwrap_or_default(),
        ..Default::default()
    }
}

fn exit_event(container_id: &str, id: &str, info: ExitInfo) -> Event {
    Event::Exit(TaskExit {
        container_id: container_id.to_string(),
        id: id.to_string(),
        pid: info.pid as u32,
        exit_status: info.status,
        exited_at: ts_field(Some(info.at)),
        ..Default::default()
    })
}

#[cfg(test)]
#[path = "service_tests.rs"]
mod tests;

#[cfg(test)]
#[path = "config_tests.rs"]
mod config_tests;
#[cfg(test)]
#[path = "lifecycle_tests.rs"]
mod lifecycle_tests;
