//! Bad input of every kind gets a clear error with the right ttrpc code, and leaves nothing.

use containerd_shim_protos::api::{
    ConnectRequest, DeleteRequest, KillRequest, PauseRequest, StartRequest, StateRequest, WaitRequest,
};
use ttrpc::Code;

use crate::common::{
    assert_clean, code, crio_bundle, crio_start, ctx, env, message, open_fifo_reader, runtimeoptions_any, task_client,
    text,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_fail_cleanly_with_the_right_code() {
    let env = env();
    let ns = env.namespace("bad-input");
    let good = crio_bundle(&ns, "good", "good", &["sleep", "1000"], |_| {});
    let o = crio_start(&ns, &good.dir, "good", b"");
    assert!(o.status.success(), "{}", text(&o));
    let address = String::from_utf8(o.stdout).unwrap();
    let client = task_client(&address).await;
    let _out = open_fifo_reader(&good.stdout);

    // Malformed config.json.
    let b = crio_bundle(&ns, "malformed", "good", &["true"], |_| {});
    std::fs::write(b.dir.join("config.json"), b"{\"ociVersion\": \"1.0.2\", \"process\": [").unwrap();
    let e = client
        .create(ctx(), &crate::common::crio_create_req(&b))
        .await
        .unwrap_err();
    assert_eq!(code(&e), Code::INVALID_ARGUMENT, "{}", message(&e));
    assert!(message(&e).contains("config.json"), "{}", message(&e));

    // Missing rootfs.
    let b = crio_bundle(&ns, "noroot", "good", &["true"], |s| {
        s["root"]["path"] = "/nonexistent/rootfs".into();
    });
    let e = client
        .create(ctx(), &crate::common::crio_create_req(&b))
        .await
        .unwrap_err();
    assert_eq!(code(&e), Code::INVALID_ARGUMENT, "{}", message(&e));
    assert!(message(&e).contains("/nonexistent/rootfs"), "{}", message(&e));

    // An OCI runtime that does not exist, chosen through the engine's config path.
    let bad_cfg = ns.dir.join("bad-runtime.toml");
    std::fs::write(&bad_cfg, "[runtime]\nbinary = \"/nonexistent/runc\"\n").unwrap();
    let b = crio_bundle(&ns, "noruntime", "good", &["true"], |_| {});
    let _o = open_fifo_reader(&b.stdout);
    let mut r = crate::common::crio_create_req(&b);
    r.options = protobuf::MessageField::some(runtimeoptions_any(&bad_cfg));
    let e = client.create(ctx(), &r).await.unwrap_err();
    assert!(message(&e).contains("/nonexistent/runc"), "{}", message(&e));

    // A config file with an error names file, line and key.
    let broken = ns.dir.join("broken.toml");
    std::fs::write(&broken, "[runtime]\nsystemd_cgroup = \"maybe\"\n").unwrap();
    let mut r = crate::common::crio_create_req(&b);
    r.options = protobuf::MessageField::some(runtimeoptions_any(&broken));
    let e = client.create(ctx(), &r).await.unwrap_err();
    assert_eq!(code(&e), Code::INVALID_ARGUMENT, "{}", message(&e));
    let m = message(&e);
    assert!(
        m.contains("broken.toml") && m.contains("line 2") && m.contains("runtime.systemd_cgroup"),
        "{m}"
    );

    // Bad ids.
    for id in ["a/b", "..", "../escape", ""] {
        let mut r = crate::common::crio_create_req(&good);
        r.id = id.into();
        let e = client.create(ctx(), &r).await.unwrap_err();
        assert_eq!(code(&e), Code::INVALID_ARGUMENT, "id {id:?}: {}", message(&e));
    }

    // Duplicate create.
    client
        .create(ctx(), &crate::common::crio_create_req(&good))
        .await
        .unwrap();
    let e = client
        .create(ctx(), &crate::common::crio_create_req(&good))
        .await
        .unwrap_err();
    assert_eq!(code(&e), Code::ALREADY_EXISTS, "{}", message(&e));

    // Wrong state: pause before start, delete while running.
    let e = client
        .pause(
            ctx(),
            &PauseRequest {
                id: "good".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), Code::FAILED_PRECONDITION, "{}", message(&e));
    client
        .start(
            ctx(),
            &StartRequest {
                id: "good".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();
    let e = client
        .start(
            ctx(),
            &StartRequest {
                id: "good".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), Code::FAILED_PRECONDITION, "{}", message(&e));
    let e = client
        .delete(
            ctx(),
            &DeleteRequest {
                id: "good".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), Code::FAILED_PRECONDITION, "{}", message(&e));

    // Unknown ids: NOT_FOUND from every RPC, and the daemon lives on.
    let unknown = "nobody".to_string();
    let e = client
        .state(
            ctx(),
            &StateRequest {
                id: unknown.clone(),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), Code::NOT_FOUND);
    let e = client
        .start(
            ctx(),
            &StartRequest {
                id: unknown.clone(),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), Code::NOT_FOUND);
    let e = client
        .kill(
            ctx(),
            &KillRequest {
                id: unknown.clone(),
                signal: 9,
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), Code::NOT_FOUND);
    let e = client
        .wait(
            ctx(),
            &WaitRequest {
                id: unknown.clone(),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), Code::NOT_FOUND);
    let e = client
        .delete(
            ctx(),
            &DeleteRequest {
                id: unknown.clone(),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), Code::NOT_FOUND);
    let e = client
        .state(
            ctx(),
            &StateRequest {
                id: "good".into(),
                exec_id: "nope".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap_err();
    assert_eq!(code(&e), Code::NOT_FOUND);
    client
        .connect(
            ctx(),
            &ConnectRequest {
                id: "good".into(),
                ..Default::default()
            },
        )
        .await
        .unwrap();

    // Refused creates left nothing: no runtime state, no gantry files in their bundles.
    for id in ["malformed", "noroot", "noruntime"] {
        let rt = ns.runtime_root.join(&ns.name).join(id);
        assert!(!rt.exists(), "runtime state left for {id}");
    }

    crate::common::crio_kill_and_remove(&client, "good").await;
    assert_clean(env, &ns);
}
