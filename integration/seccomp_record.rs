//! Seccomp profile recording (`gantry.dev/seccomp-record`) through containerd and real runc: a
//! busybox workload is recorded three times into the same syscall set, replays under the
//! recorded profile while `unshare` and `chroot` fail with EPERM; an exec's calls are recorded
//! too; the YAML is a `SeccompProfile` object; recording refused while the node has it off.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use gantry::telemetry::Kind;
use serde_json::Value;

use crate::common::{assert_clean, env, text, Ns, SHIM};
use crate::metrics::{events_toml, log_path, of, records};

/// sh, ls, cat, date, sleep, and wget from a listener (busybox nc serving an HTTP response) on
/// 127.0.0.1 inside the container. Timing must not choose the calls: wget starts once nc
/// listens (no refused first try), and the shell polls until nc has ended (no server cut off by
/// the container's exit halfway through its calls; ash's `wait` would sigsuspend or not as
/// timing has it).
fn workload(port: u16) -> String {
    format!(
        "set -e; ls / >/dev/null; cat /etc/passwd /etc/group >/dev/null; date >/dev/null; sleep 0.1; \
         printf 'HTTP/1.0 200 OK\\r\\nContent-Length: 65536\\r\\n\\r\\n' >/tmp/resp; \
         dd if=/dev/zero bs=64k count=1 2>/dev/null >>/tmp/resp; \
         nc -l -p {port} </tmp/resp >/dev/null & \
         i=0; until grep -qE \":$(printf %04X {port}) [0:]+ 0A\" /proc/net/tcp /proc/net/tcp6; do \
         i=$((i+1)); [ $i -lt 400 ]; sleep 0.05; done; \
         wget -q -O /dev/null http://127.0.0.1:{port}/big; \
         while kill -0 $! 2>/dev/null; do sleep 0.05; done; echo served"
    )
}

fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

fn allowed(profile: &Value) -> BTreeSet<String> {
    let mut out = BTreeSet::new();
    for rule in profile["syscalls"].as_array().into_iter().flatten() {
        assert_eq!(rule["action"], "SCMP_ACT_ALLOW", "{profile}");
        out.extend(
            rule["names"]
                .as_array()
                .unwrap()
                .iter()
                .map(|n| n.as_str().unwrap().to_string()),
        );
    }
    out
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))).unwrap()
}

fn recording_ns(env: &crate::common::Env, name: &str, dir: &Path, log: &Path) -> Ns {
    let toml = format!(
        "[security]\nseccomp_recording_dir = {:?}\n{}",
        dir.display().to_string(),
        events_toml(log)
    );
    env.namespace_with(name, &toml)
}

/// Records the workload as `name` in a container `id`; returns the allowed names.
fn record(env: &crate::common::Env, ns: &Ns, dir: &Path, id: &str, name: &str, port: u16) -> BTreeSet<String> {
    let annotation = format!("gantry.dev/seccomp-record={name}");
    let o = env.ctr_run(
        ns,
        id,
        &["--net-host", "--annotation", &annotation],
        &["sh", "-c", &workload(port)],
    );
    assert!(o.status.success() && text(&o).contains("served"), "{}", text(&o));
    allowed(&read_json(&dir.join(format!("{name}.json"))))
}

#[test]
fn a_recorded_workload_replays_and_nothing_else_runs() {
    let env = env();
    let log = log_path("record");
    let dir: PathBuf = env.dir.join("record-profiles").join(std::process::id().to_string());
    let ns = recording_ns(env, "record", &dir, &log);
    let port = free_port();
    let sets: Vec<BTreeSet<String>> = ["r1", "r2", "r3"]
        .iter()
        .map(|n| record(env, &ns, &dir, &format!("{n}-c"), &format!("web-{n}"), port))
        .collect();
    for (i, s) in sets.iter().enumerate().skip(1) {
        let diff: Vec<_> = s.symmetric_difference(&sets[0]).collect();
        assert!(
            diff.is_empty(),
            "recording {} differs from the first in {diff:?}",
            i + 1
        );
    }
    let names = &sets[0];
    for n in [
        "execve",
        "write",
        "openat",
        "nanosleep",
        "socket",
        "connect",
        "bind",
        "accept4",
    ] {
        let alt = match n {
            "nanosleep" => names.contains("clock_nanosleep"),
            "accept4" => names.contains("accept"),
            _ => false,
        };
        assert!(names.contains(n) || alt, "{n} missing from {names:?}");
    }
    assert!(!names.contains("unshare") && !names.contains("chroot"), "{names:?}");
    let recs = records(&log);
    let saved = of(&recs, "r1-c", Kind::SeccompProfile);
    assert_eq!(saved.len(), 1, "{saved:?}");
    assert_eq!(saved[0].reason.as_deref(), Some("web-r1"));
    assert_eq!(saved[0].count, Some(names.len() as u64));

    // The SeccompProfile object: the fields the operator's CRD has, the JSON's content.
    let yaml: Value = serde_yaml_ng::from_slice(&std::fs::read(dir.join("web-r1.yaml")).unwrap()).unwrap();
    assert_eq!(yaml["apiVersion"], "security-profiles-operator.x-k8s.io/v1beta1");
    assert_eq!(yaml["kind"], "SeccompProfile");
    assert_eq!(yaml["metadata"]["name"], "web-r1");
    assert_eq!(yaml["spec"]["defaultAction"], "SCMP_ACT_ERRNO");
    assert!(yaml["spec"]["architectures"].as_array().is_some_and(|a| !a.is_empty()));
    assert_eq!(&allowed(&yaml["spec"]), names);

    // `seccomp-profile --recorded` prints it (the config the daemon read, by GANTRY_CONFIG).
    let o = std::process::Command::new(SHIM)
        .args(["seccomp-profile", "--recorded", "web-r1"])
        .env("GANTRY_CONFIG", &ns.config)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(o.stdout, std::fs::read(dir.join("web-r1.json")).unwrap());

    // Replayed as the node's default profile: the workload runs, escapes fail with EPERM.
    let replay = format!(
        "[security]\nseccomp_default = {:?}\nrequire_default_deny = true\n",
        dir.join("web-r1.json").display().to_string()
    );
    let rns = env.namespace_with("record-replay", &replay);
    let check = std::process::Command::new(SHIM)
        .args(["check-config", rns.config.to_str().unwrap()])
        .output()
        .unwrap();
    assert!(
        check.status.success(),
        "check-config refused the recording: {}",
        text(&check)
    );
    let script = format!(
        "{}; unshare -m true; echo unshare=$?; chroot / true; echo chroot=$?",
        workload(port).replace("set -e; ", "")
    );
    let o = env.ctr_run(&rns, "replay", &["--net-host"], &["sh", "-c", &script]);
    let out = text(&o);
    assert!(out.contains("served"), "{out}");
    assert!(out.contains("unshare=1") && out.contains("chroot=1"), "{out}");
    assert!(out.contains("Operation not permitted"), "{out}");
    assert_clean(env, &rns);
    assert_clean(env, &ns);
    let _ = std::fs::remove_dir_all(&dir);
}

/// An exec into a recording container is served at the same listener (the runtime loads the
/// profile for it too) and its calls land in the same profile, saved at Delete.
#[test]
fn an_execs_calls_are_recorded_too() {
    let env = env();
    let log = log_path("record-exec");
    let dir = env.dir.join("record-exec").join(std::process::id().to_string());
    let ns = recording_ns(env, "record-exec", &dir, &log);
    let o = env.ctr_run_detached(
        &ns,
        "e1",
        &["--annotation", "gantry.dev/seccomp-record=exec"],
        &["sleep", "1000"],
    );
    assert!(o.status.success(), "{}", text(&o));
    let o = env.ctr(&ns.name, &["task", "exec", "--exec-id", "x1", "e1", "uname", "-a"]);
    assert!(o.status.success(), "exec under the recording filter: {}", text(&o));
    env.kill_and_remove(&ns.name, "e1");
    let names = allowed(&read_json(&dir.join("exec.json")));
    assert!(names.contains("uname"), "the exec's call is missing: {names:?}");
    assert_clean(env, &ns);
}

/// With `seccomp_recording_dir` empty (the default) the annotation fails Create, naming the key.
#[test]
fn recording_is_refused_while_the_node_has_it_off() {
    let env = env();
    let ns = env.namespace_with("record-off", "");
    let o = env.ctr_run(&ns, "off", &["--annotation", "gantry.dev/seccomp-record=x"], &["true"]);
    let out = text(&o);
    assert!(!o.status.success(), "{out}");
    assert!(out.contains("seccomp_recording_dir"), "{out}");
    assert_clean(env, &ns);
}

/// Started as CRI-O starts a pod (one daemon, `runtime_type = "vm"`): the app container's
/// recording is saved by the Delete CRI-O sends after its exit, with its event.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crio_container_is_recorded_through_its_pods_daemon() {
    use crate::common::{
        crio_bundle, crio_create_req, crio_kill_and_remove, crio_remove, crio_start, ctx, open_fifo_reader,
        runtimeoptions_any, task_client,
    };
    let env = env();
    let log = log_path("record-crio");
    let dir = env.dir.join("record-crio").join(std::process::id().to_string());
    let ns = recording_ns(env, "record-crio", &dir, &log);
    let pod = crio_bundle(&ns, "rpod", "rpod", &["sleep", "1000"], |_| {});
    let o = crio_start(&ns, &pod.dir, "rpod", b"");
    assert!(o.status.success(), "{}", text(&o));
    let client = task_client(&String::from_utf8(o.stdout).unwrap()).await;
    let _pod_out = open_fifo_reader(&pod.stdout);
    client.create(ctx(), &crio_create_req(&pod)).await.unwrap();
    let record = |s: &mut Value| s["annotations"]["gantry.dev/seccomp-record"] = "crio-app".into();
    let b = crio_bundle(
        &ns,
        "rapp",
        "rpod",
        &["sh", "-c", "uname >/dev/null; ls / >/dev/null"],
        record,
    );
    let _out = open_fifo_reader(&b.stdout);
    let mut req = crio_create_req(&b);
    req.options = protobuf::MessageField::some(runtimeoptions_any(&ns.config));
    client.create(ctx(), &req).await.unwrap();
    let t = crate::common::task::task(&client, "rapp");
    t.start().await.unwrap();
    assert_eq!(t.wait().await.unwrap().exit_status, 0);
    crio_remove(&client, "rapp").await;
    let names = allowed(&read_json(&dir.join("crio-app.json")));
    assert!(names.contains("uname") && names.contains("getdents64"), "{names:?}");
    let recs = records(&log);
    let saved = of(&recs, "rapp", Kind::SeccompProfile);
    assert!(!saved.is_empty(), "no seccomp_profile event");
    assert_eq!(saved[0].reason.as_deref(), Some("crio-app"));
    crio_kill_and_remove(&client, "rpod").await;
    assert_clean(env, &ns);
}
