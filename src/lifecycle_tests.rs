//! The lifecycle protocol against a scripted runtime ([`FakeRuntime`]) on tokio's paused
//! clock: exits racing Start, Kill and Exec, cancelled Creates, hung runtime calls.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use containerd_shim_protos::api::{
    CreateTaskRequest, DeleteRequest, ExecProcessRequest, KillRequest, StartRequest, StateRequest,
};
use containerd_shim_protos::events::task::{TaskExecStarted, TaskExit};
use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::{Message, MessageField};
use containerd_shim_protos::shim::events::ForwardRequest;
use containerd_shim_protos::shim_async::Task;
use ttrpc::r#async::TtrpcContext;

use super::{Service, TaskService};
use crate::events::{Forward, Publisher};
use crate::process::ExitInfo;
use crate::reaper::Reaper;
use crate::runtime::choose::RuntimeFactory;
use crate::runtime::fake::FakeRuntime;

type Events = Arc<Mutex<Vec<String>>>;

/// Records each event as "topic id" (the exec id for exec events and exits; for deletes the
/// id, container id and pid).
struct Recorder(Events);

impl Forward for Recorder {
    async fn forward(&mut self, req: &ForwardRequest) -> Result<(), String> {
        let topic = req.envelope.topic.clone();
        let any = req.envelope.event.as_ref().cloned().unwrap_or_default();
        let id = match topic.as_str() {
            "/tasks/exit" => TaskExit::parse_from_bytes(&any.value).map(|e| e.id).unwrap_or_default(),
            "/tasks/exec-started" => TaskExecStarted::parse_from_bytes(&any.value)
                .map(|e| e.exec_id)
                .unwrap_or_default(),
            "/tasks/delete" => containerd_shim_protos::events::task::TaskDelete::parse_from_bytes(&any.value)
                .map(|e| format!("{} container={} pid={}", e.id, e.container_id, e.pid))
                .unwrap_or_default(),
            _ => String::new(),
        };
        self.0
            .lock()
            .unwrap()
            .push(format!("{topic} {id}").trim_end().to_string());
        Ok(())
    }
}

pub(super) struct Harness {
    pub svc: Arc<TaskService>,
    pub fake: FakeRuntime,
    events: Events,
    pub bundle: PathBuf,
    _dir: tempfile::TempDir,
}

pub(super) fn ctx() -> TtrpcContext {
    TtrpcContext {
        mh: Default::default(),
        metadata: HashMap::new(),
        timeout_nano: 0,
        connection_data: Arc::default(),
    }
}

/// A service whose containers run on one fake runtime, with a bundle for "c1". `edit` may
/// change the spec first.
pub(super) fn harness_with(edit: impl FnOnce(&mut oci_spec::runtime::Spec)) -> Harness {
    harness_configured(edit, crate::config::fixed(crate::config::Config::default()))
}

/// [`harness_with`], its Creates taking their config from `configs`.
pub(super) fn harness_configured(
    edit: impl FnOnce(&mut oci_spec::runtime::Spec),
    configs: crate::config::ConfigSource,
) -> Harness {
    let dir = tempfile::tempdir().unwrap();
    let bundle = dir.path().join("bundle");
    std::fs::create_dir_all(bundle.join("rootfs")).unwrap();
    let mut spec = oci_spec::runtime::Spec::default();
    edit(&mut spec);
    std::fs::write(bundle.join("config.json"), serde_json::to_vec(&spec).unwrap()).unwrap();
    let log = slog::Logger::root(slog::Discard, slog::o!());
    let reaper = Reaper::default();
    let fake = FakeRuntime::new(reaper.clone());
    let events = Events::default();
    let publisher = Publisher::with_forwarder(Recorder(events.clone()), "ns", log.clone());
    let f = fake.clone();
    let runtimes: RuntimeFactory = Arc::new(crate::runtime::fake::Always(Arc::new(f.clone())));
    let svc = TaskService::new(publisher, reaper, "ns", dir.path().into(), log)
        .with_runtimes(runtimes)
        .with_configs(configs);
    Harness {
        svc: Arc::new(svc),
        fake,
        events,
        bundle,
        _dir: dir,
    }
}

/// A harness whose container c1 is created and started, and init's pid.
async fn running() -> (Harness, i32) {
    let h = harness();
    let pid = h.create().await;
    h.start("").await.unwrap();
    (h, pid)
}

pub(super) fn harness() -> Harness {
    harness_with(|_| {})
}

pub(super) fn code(r: ttrpc::Result<impl std::fmt::Debug>) -> ttrpc::Code {
    match r {
        Err(ttrpc::Error::RpcStatus(s)) => s.code(),
        other => panic!("expected an RPC status, got {other:?}"),
    }
}

impl Harness {
    pub fn service(&self) -> Service {
        Service(self.svc.clone())
    }

    pub fn create_req(&self) -> CreateTaskRequest {
        CreateTaskRequest {
            id: "c1".into(),
            bundle: self.bundle.to_str().unwrap().into(),
            ..Default::default()
        }
    }

    pub async fn create(&self) -> i32 {
        self.service().create(&ctx(), self.create_req()).await.unwrap().pid as i32
    }

    pub async fn start(&self, exec_id: &str) -> ttrpc::Result<u32> {
        let req = StartRequest {
            id: "c1".into(),
            exec_id: exec_id.into(),
            ..Default::default()
        };
        self.service().start(&ctx(), req).await.map(|r| r.pid)
    }

    pub async fn add_exec(&self, exec_id: &str) {
        self.try_add_exec(exec_id).await.unwrap();
    }

    pub async fn try_add_exec(&self, exec_id: &str) -> ttrpc::Result<()> {
        let req = ExecProcessRequest {
            id: "c1".into(),
            exec_id: exec_id.into(),
            spec: MessageField::some(Any {
                value: br#"{"args":["true"],"cwd":"/","user":{"uid":0,"gid":0}}"#.to_vec(),
                ..Default::default()
            }),
            ..Default::default()
        };
        self.service().exec(&ctx(), req).await.map(drop)
    }

    pub async fn kill(&self, exec_id: &str, signal: u32) -> ttrpc::Result<()> {
        let req = KillRequest {
            id: "c1".into(),
            exec_id: exec_id.into(),
            signal,
            ..Default::default()
        };
        self.service().kill(&ctx(), req).await.map(drop)
    }

    /// A Kill of init sent while the runtime's `kill` is held: once the call is in the
    /// runtime, the gate that lets it finish and the request's task.
    pub async fn held_kill(
        &self,
        signal: u32,
    ) -> (
        Arc<tokio::sync::Semaphore>,
        tokio::task::JoinHandle<ttrpc::Result<containerd_shim_protos::protobuf::well_known_types::empty::Empty>>,
    ) {
        let gate = self.fake.hold("kill");
        let svc = self.service();
        let req = KillRequest {
            id: "c1".into(),
            signal,
            ..Default::default()
        };
        let kill = tokio::spawn(async move { svc.kill(&ctx(), req).await });
        self.fake.entered("kill", 1).await;
        (gate, kill)
    }

    pub async fn delete(&self, exec_id: &str) -> ttrpc::Result<u32> {
        let req = DeleteRequest {
            id: "c1".into(),
            exec_id: exec_id.into(),
            ..Default::default()
        };
        self.service().delete(&ctx(), req).await.map(|r| r.exit_status)
    }

    pub async fn status(&self, exec_id: &str) -> containerd_shim_protos::api::Status {
        let req = StateRequest {
            id: "c1".into(),
            exec_id: exec_id.into(),
            ..Default::default()
        };
        self.service().state(&ctx(), req).await.unwrap().status.unwrap()
    }

    /// The process's exit, if it arrives within a (paused-clock) minute.
    pub async fn wait(&self, exec_id: &str) -> Option<ExitInfo> {
        let p = self.svc.get("c1").and_then(|c| c.process(exec_id)).ok()?;
        tokio::time::timeout(Duration::from_secs(60), p.wait()).await.ok()
    }

    /// Every event published so far, once forwarded.
    pub async fn events(&self) -> Vec<String> {
        self.svc.publisher.flush(Duration::from_secs(5)).await;
        self.events.lock().unwrap().clone()
    }

    pub fn leftovers(&self) -> Vec<String> {
        let mut names: Vec<String> = std::fs::read_dir(&self.bundle)
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .filter(|n| n != "config.json" && n != "rootfs")
            .collect();
        names.sort();
        names
    }
}

/// Lets spawned tasks run until they block.
pub(super) async fn settle() {
    for _ in 0..20 {
        tokio::task::yield_now().await;
    }
}

#[tokio::test(start_paused = true)]
async fn an_init_exit_before_start_returns_is_reported_after_start() {
    let h = harness();
    let pid = h.create().await;
    let gate = h.fake.hold("start");
    let svc = h.service();
    let start = tokio::spawn(async move {
        let req = StartRequest {
            id: "c1".into(),
            ..Default::default()
        };
        svc.start(&ctx(), req).await
    });
    h.fake.entered("start", 1).await;
    h.fake.exit(pid, 3);
    settle().await;
    gate.add_permits(1);
    assert_eq!(start.await.unwrap().unwrap().pid as i32, pid);
    assert_eq!(h.wait("").await.map(|e| e.status), Some(3));
    assert_eq!(h.events().await, ["/tasks/create", "/tasks/start", "/tasks/exit c1"]);
}

/// containerd's consumers compare TaskDelete field for field with the runc shim's, which
/// leaves `id` empty for the init process (and sends no event for an exec's delete).
#[tokio::test(start_paused = true)]
async fn the_init_delete_event_matches_the_runc_shim_field_for_field() {
    let (h, pid) = running().await;
    h.add_exec("e1").await;
    let exec_pid = h.start("e1").await.unwrap();
    h.fake.exit(exec_pid as i32, 0);
    assert!(h.wait("e1").await.is_some());
    h.delete("e1").await.unwrap();
    h.fake.exit(pid, 0);
    assert!(h.wait("").await.is_some());
    h.delete("").await.unwrap();
    let events = h.events().await;
    let deletes: Vec<_> = events.iter().filter(|e| e.starts_with("/tasks/delete")).collect();
    assert_eq!(
        deletes,
        [&format!("/tasks/delete  container=c1 pid={pid}")],
        "{events:?}"
    );
}

#[tokio::test(start_paused = true)]
async fn kill_racing_the_exit_succeeds_for_sigterm_and_says_finished_otherwise() {
    let (h, pid) = running().await;
    let (gate, kill) = h.held_kill(libc::SIGTERM as u32).await;
    // init dies on its own meanwhile; the runtime then finds nothing to signal
    h.fake.exit(pid, 0);
    h.fake.fail("kill", "container not running");
    gate.add_permits(1);
    assert!(kill.await.unwrap().is_ok());
    assert_eq!(h.wait("").await.map(|e| e.status), Some(0));
    assert!(h.kill("", libc::SIGKILL as u32).await.is_ok());
    assert_eq!(code(h.kill("", libc::SIGUSR1 as u32).await), ttrpc::Code::NOT_FOUND);
    assert_eq!(code(h.kill("", 0).await), ttrpc::Code::NOT_FOUND);
}

/// Drives `do_create` (no detached task around it) and drops it while `op` is held.
async fn create_dropped_at(h: &Harness, op: &'static str) {
    let _gate = h.fake.hold(op);
    let svc = h.svc.clone();
    let req = h.create_req();
    let create = async move { svc.do_create(req).await };
    let entered = h.fake.entered(op, 1);
    tokio::select! {
        r = create => panic!("create ended while {op} was held: {:?}", r.err()),
        _ = async { entered.await; settle().await } => {}
    }
    h.fake.clear(op);
    settle().await;
}

/// The runtime's half-created container was deleted and nothing of c1 is left.
fn assert_runtime_container_removed(h: &Harness) {
    assert!(
        h.fake.calls().contains(&"delete --force c1".to_string()),
        "the runtime's half-created container is not deleted: {:?}",
        h.fake.calls()
    );
    assert_eq!(h.leftovers(), Vec::<String>::new());
}

#[tokio::test(start_paused = true)]
async fn a_create_dropped_during_the_runtime_create_leaves_nothing() {
    let h = harness();
    create_dropped_at(&h, "create").await;
    assert!(h.svc.is_empty(), "an id is stuck in flight");
    assert_runtime_container_removed(&h);
}

#[tokio::test(start_paused = true)]
async fn a_create_dropped_during_its_failure_cleanup_leaves_nothing() {
    let h = harness();
    h.fake.fail("create", "runc create failed: boom");
    create_dropped_at(&h, "delete").await;
    assert!(h.svc.is_empty(), "an id is stuck in flight");
    assert_eq!(h.leftovers(), Vec::<String>::new());
    // A new Create of the same id works.
    h.fake.clear("create");
    h.create().await;
}

/// The Create handler dropped at its client's deadline while the runtime's create is held;
/// the engine's cleanup (Delete, then Shutdown) runs out before the create ends. The finished
/// create is rolled back, Delete answered NOT_FOUND after waiting, and the Shutdown that found
/// the Create in flight takes effect once the daemon is empty.
#[tokio::test(start_paused = true)]
async fn an_abandoned_create_is_rolled_back_and_a_waiting_shutdown_takes_effect() {
    use containerd_shim_protos::shim_async::Task;
    let h = harness();
    let gate = h.fake.hold("create");
    let svc = h.service();
    let entered = h.fake.entered("create", 1);
    let req = h.create_req();
    let c = ctx();
    let handler = svc.create(&c, req);
    tokio::select! {
        r = handler => panic!("create answered while the runtime was held: {r:?}"),
        _ = async { entered.await; settle().await } => {}
    }
    // The engine's cleanup: a Delete that gives up waiting, a Shutdown that finds the Create.
    let delete = containerd_shim_protos::api::DeleteRequest {
        id: "c1".into(),
        ..Default::default()
    };
    assert!(
        tokio::time::timeout(Duration::from_secs(5), h.service().delete(&ctx(), delete))
            .await
            .is_err()
    );
    let shutdown = containerd_shim_protos::api::ShutdownRequest {
        id: "c1".into(),
        ..Default::default()
    };
    h.service().shutdown(&ctx(), shutdown).await.unwrap();
    let exited = h.svc.shutdown.clone();
    let notified = exited.notified();
    tokio::pin!(notified);
    notified.as_mut().enable();
    h.fake.clear("create");
    gate.add_permits(1);
    settle().await;
    let exited = tokio::time::timeout(Duration::from_secs(5), notified).await.is_ok();
    assert!(
        exited,
        "the daemon did not exit: calls {:?}, empty {}",
        h.fake.calls(),
        h.svc.is_empty()
    );
    assert!(h.svc.is_empty());
    assert_runtime_container_removed(&h);
}

#[tokio::test(start_paused = true)]
async fn a_hung_runtime_call_times_out_and_create_undoes_itself() {
    let h = harness();
    h.fake.hang("start", Duration::from_secs(10));
    h.create().await;
    let t0 = tokio::time::Instant::now();
    assert_eq!(code(h.start("").await), ttrpc::Code::DEADLINE_EXCEEDED);
    assert!(t0.elapsed() >= Duration::from_secs(10));
    assert_eq!(h.status("").await, containerd_shim_protos::api::Status::CREATED);
    assert!(h.delete("").await.is_ok());

    h.fake.hang("create", Duration::from_secs(60));
    let r = h.service().create(&ctx(), h.create_req()).await;
    assert_eq!(code(r), ttrpc::Code::DEADLINE_EXCEEDED);
    assert!(h.svc.is_empty());
    assert_eq!(h.fake.calls().iter().filter(|c| *c == "delete --force c1").count(), 2);
    assert_eq!(h.leftovers(), Vec::<String>::new());
}

#[tokio::test(start_paused = true)]
async fn an_exec_exit_before_its_start_returns_follows_exec_started() {
    let h = harness();
    h.create().await;
    h.start("").await.unwrap();
    h.add_exec("e1").await;
    let gate = h.fake.hold("exec");
    let svc = h.service();
    let start = tokio::spawn(async move {
        let req = StartRequest {
            id: "c1".into(),
            exec_id: "e1".into(),
            ..Default::default()
        };
        svc.start(&ctx(), req).await
    });
    h.fake.entered("exec", 1).await;
    gate.add_permits(1);
    settle().await;
    // The pid file is written: the exec exits before Start has answered.
    let pid = h.fake.exec_pids()[0];
    h.fake.exit(pid, 7);
    assert_eq!(start.await.unwrap().unwrap().pid as i32, pid);
    assert_eq!(h.wait("e1").await.map(|e| e.status), Some(7));
    let events = h.events().await;
    assert_eq!(events[events.len() - 2..], ["/tasks/exec-started e1", "/tasks/exit e1"]);
}

/// Starts exec `exec_id` as a task of its own (it may be held at the runtime's gate).
fn spawn_start(h: &Harness, exec_id: &str) -> tokio::task::JoinHandle<ttrpc::Result<u32>> {
    let svc = h.service();
    let req = StartRequest {
        id: "c1".into(),
        exec_id: exec_id.into(),
        ..Default::default()
    };
    tokio::spawn(async move { svc.start(&ctx(), req).await.map(|r| r.pid) })
}

/// Delete of init, as its own task (to race it against another request).
fn spawn_delete(h: &Harness) -> tokio::task::JoinHandle<ttrpc::Result<containerd_shim_protos::api::DeleteResponse>> {
    let svc = h.service();
    let req = DeleteRequest {
        id: "c1".into(),
        ..Default::default()
    };
    tokio::spawn(async move { svc.delete(&ctx(), req).await })
}

fn exits(events: &[String]) -> Vec<&str> {
    events
        .iter()
        .filter(|e| e.starts_with("/tasks/exit") || e.starts_with("/tasks/exec-started"))
        .map(String::as_str)
        .collect()
}

#[tokio::test(start_paused = true)]
async fn an_exec_starting_while_init_exits_is_published_before_init() {
    let h = harness();
    let init = h.create().await;
    h.start("").await.unwrap();
    h.add_exec("e1").await;
    let gate = h.fake.hold("exec");
    let start = spawn_start(&h, "e1");
    h.fake.entered("exec", 1).await;
    h.fake.exit(init, 0);
    settle().await;
    gate.add_permits(1);
    let pid = start.await.unwrap().unwrap() as i32;
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(
        exits(&h.events().await),
        ["/tasks/exec-started e1"],
        "init's exit came first"
    );
    h.fake.exit(pid, 137);
    assert_eq!(h.wait("").await.map(|e| e.status), Some(0));
    assert_eq!(
        exits(&h.events().await),
        ["/tasks/exec-started e1", "/tasks/exit e1", "/tasks/exit c1"]
    );
}

#[tokio::test(start_paused = true)]
async fn init_exit_waits_for_running_execs_without_a_timer() {
    let h = harness();
    let init = h.create().await;
    h.start("").await.unwrap();
    h.add_exec("e1").await;
    let pid = h.start("e1").await.unwrap() as i32;
    h.fake.exit(init, 0);
    tokio::time::sleep(Duration::from_secs(3600)).await;
    assert!(h.wait("").await.is_none(), "init's Wait returned while an exec runs");
    assert!(
        !h.fake.calls().iter().any(|c| c.starts_with("kill")),
        "own pid namespace: nothing to kill, {:?}",
        h.fake.calls()
    );
    h.fake.exit(pid, 1);
    assert_eq!(h.wait("").await.map(|e| e.status), Some(0));
    assert_eq!(
        exits(&h.events().await),
        ["/tasks/exec-started e1", "/tasks/exit e1", "/tasks/exit c1"]
    );
    // No exec begins once init is gone.
    assert_eq!(code(h.try_add_exec("e2").await), ttrpc::Code::FAILED_PRECONDITION);
}

#[tokio::test(start_paused = true)]
async fn a_shared_pid_namespace_has_the_rest_killed_when_init_exits() {
    let h = harness_with(|spec| {
        let mut linux = spec.linux().clone().unwrap();
        let namespaces = linux.namespaces().clone().unwrap_or_default();
        let kept = namespaces
            .into_iter()
            .filter(|n| n.typ() != oci_spec::runtime::LinuxNamespaceType::Pid)
            .collect();
        linux.set_namespaces(Some(kept));
        spec.set_linux(Some(linux));
    });
    let init = h.create().await;
    h.start("").await.unwrap();
    h.add_exec("e1").await;
    h.start("e1").await.unwrap();
    let t0 = tokio::time::Instant::now();
    h.fake.exit(init, 0);
    assert_eq!(h.wait("").await.map(|e| e.status), Some(0));
    assert_eq!(t0.elapsed(), Duration::ZERO, "waited on a timer");
    assert!(
        h.fake.calls().contains(&"kill c1 9 all".to_string()),
        "{:?}",
        h.fake.calls()
    );
    assert_eq!(h.wait("e1").await.map(|e| e.status), Some(137));
    assert_eq!(
        exits(&h.events().await),
        ["/tasks/exec-started e1", "/tasks/exit e1", "/tasks/exit c1"]
    );
}

#[tokio::test(start_paused = true)]
async fn two_concurrent_starts_of_one_exec_run_it_once() {
    let h = harness();
    h.create().await;
    h.start("").await.unwrap();
    h.add_exec("e1").await;
    let gate = h.fake.hold("exec");
    let first = spawn_start(&h, "e1");
    h.fake.entered("exec", 1).await;
    let second = tokio::time::timeout(Duration::from_secs(60), h.start("e1")).await;
    let second = second.expect("the second Start runs the exec again (held at the runtime's gate)");
    assert_eq!(code(second), ttrpc::Code::FAILED_PRECONDITION);
    assert_eq!(h.status("e1").await, containerd_shim_protos::api::Status::CREATED);
    gate.add_permits(2);
    first.await.unwrap().unwrap();
    settle().await;
    let execs = h.fake.calls().iter().filter(|c| c.starts_with("exec")).count();
    assert_eq!(execs, 1, "{:?}", h.fake.calls());
    assert_eq!(h.status("e1").await, containerd_shim_protos::api::Status::RUNNING);
}

#[tokio::test(start_paused = true)]
async fn delete_racing_the_start_of_a_created_init_waits_for_it() {
    let h = harness();
    h.create().await;
    let gate = h.fake.hold("start");
    let start = spawn_start(&h, "");
    h.fake.entered("start", 1).await;
    let delete = spawn_delete(&h);
    settle().await;
    assert!(
        !h.fake.calls().iter().any(|c| c.starts_with("delete")),
        "runtime delete while the runtime start runs: {:?}",
        h.fake.calls()
    );
    gate.add_permits(1);
    start.await.unwrap().unwrap();
    assert_eq!(code(delete.await.unwrap()), ttrpc::Code::FAILED_PRECONDITION);
    assert_eq!(h.status("").await, containerd_shim_protos::api::Status::RUNNING);

    // A Start that fails leaves init created, and the Delete waiting for it then succeeds.
    let h = harness();
    h.create().await;
    let gate = h.fake.hold("start");
    h.fake.fail("start", "runc start failed: boom");
    let start = spawn_start(&h, "");
    h.fake.entered("start", 1).await;
    let delete = spawn_delete(&h);
    settle().await;
    gate.add_permits(1);
    assert_eq!(code(start.await.unwrap()), ttrpc::Code::UNKNOWN);
    assert_eq!(delete.await.unwrap().unwrap().exit_status, 137);
}

#[tokio::test(start_paused = true)]
async fn a_wait_on_an_exec_drained_by_delete_still_returns_its_exit() {
    let h = harness();
    h.create().await;
    h.add_exec("e1").await;
    let pid = h.start("e1").await.unwrap() as i32;
    let p = h.svc.get("c1").unwrap().process("e1").unwrap();
    let wait = tokio::spawn(async move { p.wait().await });
    // Init never started: Delete is allowed and takes the exec out of the container.
    h.delete("").await.unwrap();
    h.fake.exit(pid, 5);
    let exit = tokio::time::timeout(Duration::from_secs(60), wait).await;
    assert_eq!(exit.expect("Wait never returns").unwrap().status, 5);
}

#[tokio::test(start_paused = true)]
async fn non_ascii_capability_names_do_not_panic_a_create() {
    let h = harness();
    let config = h.bundle.join("config.json");
    let mut doc: serde_json::Value = serde_json::from_slice(&std::fs::read(&config).unwrap()).unwrap();
    doc["process"]["capabilities"]["bounding"] = serde_json::json!(["CAPé_SYS_ADMIN", "é", "CAP_SYS_RAWIO", "ÇAP_X"]);
    std::fs::write(&config, serde_json::to_vec(&doc).unwrap()).unwrap();
    let r = h.service().create(&ctx(), h.create_req()).await;
    assert!(r.is_ok(), "{r:?}");
}

/// Codes as containerd's runc shim returns them, for the failures engines act on.
#[tokio::test(start_paused = true)]
async fn error_codes_match_the_runc_shim() {
    use containerd_shim_protos::api::StatsRequest;
    let h = harness();
    h.create().await;
    let no_binary =
        "runc start failed: unable to start container process: exec: \"nope\": executable file not found in $PATH";
    h.fake.fail("start", no_binary);
    assert_eq!(code(h.start("").await), ttrpc::Code::UNKNOWN, "a start failure");
    h.fake.clear("start");
    h.start("").await.unwrap();
    h.add_exec("e1").await;
    h.fake.fail("exec", &no_binary.replace("start failed", "exec failed"));
    assert_eq!(code(h.start("e1").await), ttrpc::Code::UNKNOWN, "an exec failure");
    h.fake.fail("pause", "container does not exist");
    let pause = containerd_shim_protos::api::PauseRequest {
        id: "c1".into(),
        ..Default::default()
    };
    assert_eq!(code(h.service().pause(&ctx(), pause).await), ttrpc::Code::NOT_FOUND);
    // The fake's container has no cgroup: "cgroup does not exist".
    let stats = StatsRequest {
        id: "c1".into(),
        ..Default::default()
    };
    assert_eq!(code(h.service().stats(&ctx(), stats).await), ttrpc::Code::NOT_FOUND);
    assert_eq!(code(h.start("nope").await), ttrpc::Code::NOT_FOUND);
    assert_eq!(code(h.start("").await), ttrpc::Code::FAILED_PRECONDITION);
}

#[tokio::test(start_paused = true)]
async fn pids_name_the_exec_of_each_exec_pid() {
    use containerd_shim_protos::api::PidsRequest;
    use containerd_shim_protos::shim::oci::ProcessDetails;
    let h = harness();
    let init = h.create().await;
    h.start("").await.unwrap();
    h.add_exec("e1").await;
    let exec = h.start("e1").await.unwrap();
    let req = PidsRequest {
        id: "c1".into(),
        ..Default::default()
    };
    let got = h.service().pids(&ctx(), req).await.unwrap().processes;
    assert_eq!(got.len(), 2);
    for p in got {
        if p.pid == init as u32 {
            assert!(p.info.is_none(), "init carries no details");
        } else {
            assert_eq!(p.pid, exec);
            let any = p.info.unwrap();
            assert_eq!(any.type_url, "containerd.runc.v1.ProcessDetails");
            assert_eq!(ProcessDetails::parse_from_bytes(&any.value).unwrap().exec_id, "e1");
        }
    }
}

/// A Pids whose client gave up while the runtime lists processes: the `ps` call still runs to
/// its end, under its timeout and with its exit reaped, instead of being dropped midway.
#[tokio::test(start_paused = true)]
async fn a_pids_dropped_while_the_runtime_lists_still_finishes_the_call() {
    let h = harness();
    h.create().await;
    let gate = h.fake.hold("ps");
    let svc = h.service();
    let req = containerd_shim_protos::api::PidsRequest {
        id: "c1".into(),
        ..Default::default()
    };
    let pids = async move { svc.pids(&ctx(), req).await };
    let entered = h.fake.entered("ps", 1);
    tokio::select! {
        r = pids => panic!("pids ended while ps was held: {:?}", r.err()),
        _ = async { entered.await; settle().await } => {}
    }
    gate.add_permits(1);
    settle().await;
    let ps: Vec<String> = h.fake.finished().into_iter().filter(|c| c.starts_with("ps")).collect();
    assert_eq!(
        ps,
        vec!["ps c1".to_string()],
        "the dropped request's ps did not run to its end"
    );
}

/// Init dies of a Kill whose runtime call has not returned yet: its exit is published only
/// once the Kill is answered, so an engine that deletes the task on the exit (and closes the
/// connection) has the Kill's reply first.
#[tokio::test(start_paused = true)]
async fn an_exit_caused_by_a_kill_in_flight_is_published_after_the_kill_returns() {
    let (h, pid) = running().await;
    let (gate, kill) = h.held_kill(libc::SIGKILL as u32).await;
    h.fake.exit(pid, 137);
    settle().await;
    assert_eq!(
        h.events().await,
        ["/tasks/create", "/tasks/start"],
        "the exit overtook the kill"
    );
    gate.add_permits(1);
    kill.await.unwrap().unwrap();
    assert_eq!(h.wait("").await.map(|e| e.status), Some(137));
    assert_eq!(h.events().await, ["/tasks/create", "/tasks/start", "/tasks/exit c1"]);
}
