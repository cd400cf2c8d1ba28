//! Stats (cgroup v1 metrics through `ctr task metrics`) and OOM kills: events for containerd,
//! the `<bundle>/oom` marker for CRI-O.

use std::time::Duration;

use crate::common::task::task;
use crate::common::{
    assert_clean, crio_bundle, crio_remove, crio_start, ctx, env, open_fifo_reader, task_client, text,
};

fn metrics(ns: &str, id: &str) -> serde_json::Value {
    let o = env().ctr(ns, &["task", "metrics", "--format", "json", id]);
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("metrics json: {e}: {}", text(&o)))
}

#[test]
fn metrics_are_v1_and_move_when_the_container_works() {
    let env = env();
    let ns = env.namespace("metrics");
    let o = env.ctr_run_detached(&ns, "busy", &[], &["sh", "-c", "x=0; while true; do x=$((x+1)); done"]);
    assert!(o.status.success(), "{}", text(&o));
    let cpu = |m: &serde_json::Value| m["cpu"]["usage"]["total"].as_u64().unwrap_or(0);
    let mem = |m: &serde_json::Value| m["memory"]["usage"]["usage"].as_u64().unwrap_or(0);
    // Polled, not slept: on a busy machine the loop may get little CPU at first.
    let mut m1 = metrics(&ns.name, "busy");
    assert!(
        crate::common::wait_until(Duration::from_secs(30), || {
            m1 = metrics(&ns.name, "busy");
            cpu(&m1) > 0
        }),
        "{m1}"
    );
    assert!(mem(&m1) > 0, "{m1}");
    // CPU time is in nanoseconds: the busy loop adds 0.1 s of it before long.
    let mut m2 = m1.clone();
    let moved = crate::common::wait_until(Duration::from_secs(60), || {
        m2 = metrics(&ns.name, "busy");
        cpu(&m2) > cpu(&m1) + 100_000_000
    });
    assert!(moved, "cpu {} -> {}", cpu(&m1), cpu(&m2));
    assert_eq!(m2["pids"]["current"].as_u64(), Some(1), "{m2}");

    env.kill_and_remove(&ns.name, "busy");
    assert_clean(env, &ns);
}

const HOG: &[&str] = &["sh", "-c", "x=aaaaaaaaaaaaaaaa; while true; do x=$x$x; done"];

#[test]
fn oom_event_comes_before_the_exit() {
    let env = env();
    let ns = env.namespace("oom");
    let events = crate::containerd::Events::start(&ns);
    let o = env.ctr_run(&ns, "hog", &["--memory-limit", "16777216"], HOG);
    assert_eq!(o.status.code(), Some(137), "{}", text(&o));
    let both = crate::common::wait_until(Duration::from_secs(10), || {
        let t = events.task_topics("hog");
        t.iter().any(|x| x == "/tasks/oom") && t.iter().any(|x| x == "/tasks/exit")
    });
    let topics = events.task_topics("hog");
    assert!(both, "{topics:?}");
    let oom = topics.iter().position(|t| t == "/tasks/oom");
    let exit = topics.iter().position(|t| t == "/tasks/exit");
    assert!(oom < exit, "OOM after exit: {topics:?}");
    assert!(events.lines_for("hog", "/tasks/exit")[0].contains("\"exit_status\":137"));
    assert_clean(env, &ns);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crio_oom_writes_the_marker_before_wait_returns() {
    let env = env();
    let ns = env.namespace("crio-oom");
    let b = crio_bundle(&ns, "hog", "hog", HOG, |s| {
        s["linux"]["resources"]["memory"] = serde_json::json!({"limit": 16 * 1024 * 1024});
    });
    let o = crio_start(&ns, &b.dir, "hog", b"");
    assert!(o.status.success(), "{}", text(&o));
    let client = task_client(&String::from_utf8(o.stdout).unwrap()).await;
    let _out = open_fifo_reader(&b.stdout);
    let req = crate::common::crio_create_req(&b);
    client.create(ctx(), &req).await.unwrap();
    assert!(!b.dir.join("oom").exists());
    let hog = task(&client, "hog");
    hog.start().await.unwrap();
    let w = hog.wait().await.unwrap();
    assert_eq!(w.exit_status, 137);
    assert!(b.dir.join("oom").exists(), "no <bundle>/oom after an OOM kill");
    crio_remove(&client, "hog").await;
    let _ = std::fs::remove_file(b.dir.join("oom"));
    assert_clean(env, &ns);
}
