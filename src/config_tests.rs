//! Where a Create's config comes from: the service's config source, asked with the path the
//! engine's options name, never the host's files behind the test's back.

use std::path::PathBuf;
use std::sync::{Arc, Mutex};

use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::MessageField;
use containerd_shim_protos::shim_async::Task;

use super::lifecycle_tests::{code, ctx, harness_configured};
use crate::config::{Config, ConfigError, ConfigSource};

/// `runtimeoptions.v1.Options{config_path}`, as CRI-O sends its `runtime_config_path`.
fn config_option(path: &str) -> Any {
    let mut value = vec![0x12, path.len() as u8];
    value.extend_from_slice(path.as_bytes());
    let mut any = Any::new();
    any.type_url = "runtimeoptions.v1.Options".into();
    any.value = value;
    any
}

/// A source that notes each path it is asked for and answers with `answer`.
fn recording(answer: fn() -> Result<Config, ConfigError>) -> (ConfigSource, Arc<Mutex<Vec<Option<String>>>>) {
    let asked = Arc::new(Mutex::new(Vec::new()));
    let seen = asked.clone();
    let source: ConfigSource = Arc::new(move |path| {
        seen.lock().unwrap().push(path.map(String::from));
        answer().map(|c| (c, path.map(PathBuf::from)))
    });
    (source, asked)
}

#[tokio::test]
async fn a_create_asks_the_services_source_with_the_path_the_engine_names() {
    let (source, asked) = recording(|| Ok(Config::default()));
    let h = harness_configured(|_| {}, source);
    let mut req = h.create_req();
    req.options = MessageField::some(config_option("/etc/gantry/pod.toml"));
    h.service().create(&ctx(), req).await.unwrap();
    assert_eq!(*asked.lock().unwrap(), [Some("/etc/gantry/pod.toml".to_string())]);
    assert!(
        h.fake.calls().iter().any(|c| c.starts_with("create c1")),
        "{:?}",
        h.fake.calls()
    );

    let (source, asked) = recording(|| Ok(Config::default()));
    let h = harness_configured(|_| {}, source);
    h.create().await;
    assert_eq!(*asked.lock().unwrap(), [None]);
}

#[tokio::test]
async fn a_config_the_source_refuses_fails_the_create_before_the_runtime_runs() {
    let (source, _) = recording(|| {
        Err(ConfigError::Invalid {
            path: "/etc/gantry/config.toml".into(),
            line: 3,
            key: "runtime.binary".into(),
            message: "invalid type".into(),
        })
    });
    let h = harness_configured(|_| {}, source);
    let r = h.service().create(&ctx(), h.create_req()).await;
    let message = match &r {
        Err(ttrpc::Error::RpcStatus(s)) => s.message().to_string(),
        _ => String::new(),
    };
    assert_eq!(code(r), ttrpc::Code::INVALID_ARGUMENT);
    assert!(
        message.contains("line 3") && message.contains("runtime.binary"),
        "{message}"
    );
    assert!(h.fake.calls().is_empty(), "{:?}", h.fake.calls());
    // Nothing written into the bundle, and the id is free for a retry.
    for f in [crate::container::RUNTIME_FILE, crate::container::INIT_PID_FILE] {
        assert!(!h.bundle.join(f).exists(), "{f} left behind");
    }
    assert!(h.svc.is_empty());
}
