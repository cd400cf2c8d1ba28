//! Cancellation of requests: ttrpc drops a handler's future when the client's deadline passes.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use containerd_shim_protos::api::{CreateTaskRequest, DeleteRequest};
use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::MessageField;
use containerd_shim_protos::shim_async::Task;
use ttrpc::r#async::TtrpcContext;

use super::{Service, TaskService};
use crate::events::Publisher;
use crate::reaper::Reaper;

fn ctx() -> TtrpcContext {
    TtrpcContext {
        mh: Default::default(),
        metadata: HashMap::new(),
        timeout_nano: 0,
        connection_data: Arc::default(),
    }
}

/// `runtimeoptions.v1.Options{config_path}`, as CRI-O sends its `runtime_config_path`.
fn config_option(path: &Path) -> Any {
    let p = path.to_str().unwrap().as_bytes();
    let mut value = vec![0x12, p.len() as u8];
    value.extend_from_slice(p);
    let mut any = Any::new();
    any.type_url = "runtimeoptions.v1.Options".into();
    any.value = value;
    any
}

/// A bundle whose runtime is a script that notes each call, spends a second in `create` and
/// then fails it: a Create that is under way for long enough to be dropped midway.
fn slow_failing_runtime(dir: &Path) -> (CreateTaskRequest, std::path::PathBuf) {
    use std::os::unix::fs::PermissionsExt;
    let bundle = dir.join("bundle");
    std::fs::create_dir_all(bundle.join("rootfs")).unwrap();
    let spec = oci_spec::runtime::Spec::default();
    std::fs::write(bundle.join("config.json"), serde_json::to_vec(&spec).unwrap()).unwrap();
    let calls = dir.join("calls");
    let script = dir.join("rt");
    let body = format!(
        "#!/bin/sh\necho \"$*\" >> {}\ncase \" $* \" in *\" create \"*) sleep 1;; esac\nexit 1\n",
        calls.display()
    );
    std::fs::write(&script, body).unwrap();
    std::fs::set_permissions(&script, std::fs::Permissions::from_mode(0o755)).unwrap();
    let config = dir.join("gantry.toml");
    let toml = format!("[runtime]\nbinary = {:?}\nroot = {:?}\n", script, dir.join("root"));
    std::fs::write(&config, toml).unwrap();
    let req = CreateTaskRequest {
        id: "c1".into(),
        bundle: bundle.to_str().unwrap().into(),
        options: MessageField::some(config_option(&config)),
        ..Default::default()
    };
    (req, calls)
}

// The std lock keeps other tests' children out of this reaper's waitpid(-1) while it runs.
#[allow(clippy::await_holding_lock)]
#[tokio::test]
async fn a_create_dropped_midway_finishes_and_frees_its_id() {
    let _children = crate::sys::test_children_lock();
    let dir = tempfile::tempdir().unwrap();
    let (req, calls) = slow_failing_runtime(dir.path());
    let log = slog::Logger::root(slog::Discard, slog::o!());
    let reaper = Reaper::default();
    reaper.start().unwrap();
    let publisher = Publisher::new("", "ns", log.clone());
    let svc = Arc::new(TaskService::new(publisher, reaper, "ns", dir.path().into(), log));
    let service = Service(svc.clone());

    // Dropped while the runtime's create runs, as ttrpc does at the client's deadline.
    let dropped = tokio::time::timeout(Duration::from_millis(300), service.create(&ctx(), req)).await;
    assert!(dropped.is_err(), "create ended before it could be dropped");
    assert!(!svc.is_empty(), "the create is still under way");

    // CRI-O's answer, Delete, waits for the create to end, and then finds nothing.
    let delete = DeleteRequest {
        id: "c1".into(),
        ..Default::default()
    };
    let e = tokio::time::timeout(Duration::from_secs(10), service.delete(&ctx(), delete))
        .await
        .expect("delete hangs")
        .unwrap_err();
    assert!(
        matches!(&e, ttrpc::Error::RpcStatus(s) if s.code() == ttrpc::Code::NOT_FOUND),
        "{e:?}"
    );
    // The dropped create ran to its end: the failed runtime create was undone, the id freed.
    let calls = std::fs::read_to_string(calls).unwrap();
    assert!(calls.contains("delete --force c1"), "{calls}");
    assert!(svc.is_empty(), "c1 is still marked as being created");
}
