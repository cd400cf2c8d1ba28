//! The event log and the node exporter, through containerd (`ctr`) and through the CRI-O-style
//! start (empty `TTRPC_ADDRESS`): each lifecycle event is one well-formed line, and the
//! `metrics` action's counters and histograms match what happened, after the daemons are gone.

use std::io::{BufRead, Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use containerd_shim_protos::api::StartRequest;
use gantry::telemetry::{Kind, Record};

use crate::common::task::task;
use crate::common::{
    assert_clean, crio_bundle, crio_create_req, crio_remove, crio_start, ctx, daemons_in, env, open_fifo_reader,
    task_client, text, wait_until, Ns, SHIM,
};

const HOG: &[&str] = &["sh", "-c", "x=aaaaaaaaaaaaaaaa; while true; do x=$x$x; done"];
const TRACEPARENT: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

/// A fresh event-log path for one test.
pub(crate) fn log_path(name: &str) -> PathBuf {
    let dir = env().dir.join(format!("events-{name}"));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    dir.join("events.jsonl")
}

pub(crate) fn events_toml(log: &Path) -> String {
    format!("[events]\nlog = {:?}\n", log)
}

/// Every line of the log, each of which must parse.
pub(crate) fn records(log: &Path) -> Vec<Record> {
    std::fs::read_to_string(log)
        .unwrap_or_default()
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("malformed line {l:?}: {e}")))
        .collect()
}

pub(crate) fn of<'a>(recs: &'a [Record], id: &str, kind: Kind) -> Vec<&'a Record> {
    recs.iter().filter(|r| r.id == id && r.event == kind).collect()
}

/// Waits until no daemon of the namespace is left (so the log holds all they wrote).
fn daemons_gone(ns: &Ns) {
    let gone = wait_until(Duration::from_secs(15), || env().shim_processes(&ns.name).is_empty());
    assert!(gone, "daemons still alive: {:?}", env().shim_processes(&ns.name));
}

/// `containerd-shim-gantry-v2 metrics --log LOG` (text format 0.0.4).
pub(crate) fn scrape(log: &Path) -> String {
    let o = Command::new(SHIM).args(["metrics", "--log"]).arg(log).output().unwrap();
    assert!(o.status.success(), "metrics: {}", text(&o));
    String::from_utf8(o.stdout).unwrap()
}

/// The value of the sample `name{...}` whose labels include all of `want`; 0 when absent.
pub(crate) fn sample(exposition: &str, name: &str, want: &[(&str, &str)]) -> f64 {
    exposition
        .lines()
        .filter(|l| !l.starts_with('#'))
        .find_map(|l| {
            let (head, value) = l.rsplit_once(' ')?;
            let (n, labels) = head.split_once('{').unwrap_or((head, ""));
            let ok = n == name && want.iter().all(|(k, v)| labels.contains(&format!("{k}=\"{v}\"")));
            ok.then(|| value.parse().ok()).flatten()
        })
        .unwrap_or(0.0)
}

pub(crate) fn promtool_accepts(exposition: &str) {
    let mut child = Command::new("promtool")
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .expect("promtool (apt-get install prometheus; scripts/deps.sh installs it)");
    child.stdin.take().unwrap().write_all(exposition.as_bytes()).unwrap();
    let o = child.wait_with_output().unwrap();
    assert!(o.status.success(), "promtool: {}\n{exposition}", text(&o));
}

#[test]
fn containerd_lifecycle_oom_failing_exec_and_runtime_error_are_logged_and_counted() {
    let env = env();
    let log = log_path("ctr");
    let ns = env.namespace_with("mx-ctr", &events_toml(&log));
    let o = env.ctr_run(&ns, "ok", &[], &["true"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = env.ctr_run(&ns, "hog", &["--memory-limit", "16777216"], HOG);
    assert_eq!(o.status.code(), Some(137), "{}", text(&o));
    let o = env.ctr_run(&ns, "nobin", &[], &["/no/such/binary"]);
    assert!(!o.status.success(), "{}", text(&o));
    let o = env.ctr_run_detached(&ns, "sleeper", &[], &["sleep", "1000"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = env.ctr(
        &ns.name,
        &["task", "exec", "--exec-id", "bad", "sleeper", "/no/such/exec"],
    );
    assert!(!o.status.success(), "{}", text(&o));
    let o = env.ctr(&ns.name, &["task", "exec", "--exec-id", "good", "sleeper", "true"]);
    assert!(o.status.success(), "{}", text(&o));
    env.kill_and_remove(&ns.name, "sleeper");
    let _ = env.ctr(&ns.name, &["containers", "rm", "nobin"]);
    assert_clean(env, &ns);
    daemons_gone(&ns);

    let recs = records(&log);
    for id in ["ok", "hog", "sleeper"] {
        for kind in [Kind::Create, Kind::Start, Kind::Exit, Kind::Delete] {
            let n = of(&recs, id, kind).iter().filter(|r| r.exec_id.is_none()).count();
            assert_eq!(n, 1, "{id} {kind:?}: {recs:#?}");
        }
    }
    let all = |r: &&Record| r.ns == ns.name && r.handler == "gantry" && r.v == 1 && r.ts.ends_with('Z');
    assert!(recs.iter().all(|r| all(&r)), "{recs:#?}");
    let hog = of(&recs, "hog", Kind::Exit)[0];
    assert_eq!(
        (hog.exit_code, hog.signal, hog.oom_killed),
        (Some(137), Some(9), Some(true))
    );
    let ok = of(&recs, "ok", Kind::Exit)[0];
    assert_eq!((ok.exit_code, ok.signal, ok.oom_killed), (Some(0), None, Some(false)));
    assert!(of(&recs, "ok", Kind::Create)[0].duration_ms.unwrap() > 0.0);
    assert!(of(&recs, "nobin", Kind::Create).is_empty());
    let error = |id: &str, call: &str| {
        recs.iter()
            .find(|r| r.event == Kind::RuntimeError && r.id == id && r.call.as_deref() == Some(call))
            .unwrap_or_else(|| panic!("no {call} error for {id}: {recs:#?}"))
    };
    assert!(error("nobin", "create")
        .message
        .as_deref()
        .unwrap()
        .contains("/no/such/binary"));
    assert_eq!(error("nobin", "create").exit_code, Some(1), "the runtime's exit status");
    assert_eq!(error("sleeper", "exec").rpc.as_deref(), Some("start"));
    let execs = of(&recs, "sleeper", Kind::ExecStarted);
    assert_eq!(execs.len(), 1, "only the good exec started: {execs:?}");
    assert_eq!(of(&recs, "sleeper", Kind::ExecAdded).len(), 2);

    let m = scrape(&log);
    let base = [("handler", "gantry"), ("namespace", ns.name.as_str())];
    let with = |extra: &[(&'static str, &'static str)]| -> Vec<(&str, &str)> {
        base.iter().copied().chain(extra.iter().copied()).collect()
    };
    assert_eq!(sample(&m, "gantry_containers_created_total", &base), 3.0, "{m}");
    assert_eq!(sample(&m, "gantry_containers_started_total", &base), 3.0);
    let exits = |reason, process| {
        sample(
            &m,
            "gantry_exits_total",
            &with(&[("reason", reason), ("process", process)]),
        )
    };
    assert_eq!(exits("oom", "init"), 1.0);
    assert_eq!(exits("normal", "init"), 1.0);
    assert_eq!(exits("signal", "init"), 1.0, "sleeper was killed");
    assert_eq!(exits("normal", "exec"), 1.0);
    assert_eq!(sample(&m, "gantry_execs_total", &base), 1.0);
    assert_eq!(
        sample(&m, "gantry_runtime_errors_total", &with(&[("call", "create")])),
        1.0
    );
    assert_eq!(
        sample(&m, "gantry_runtime_errors_total", &with(&[("call", "exec")])),
        1.0
    );
    let count = |op| sample(&m, "gantry_request_duration_seconds_count", &with(&[("op", op)]));
    assert_eq!(
        (count("create"), count("start"), count("exec"), count("delete")),
        (3.0, 3.0, 1.0, 3.0)
    );
    assert_eq!(sample(&m, "gantry_containers_running", &base), 0.0);
    assert_eq!(sample(&m, "gantry_events_dropped_total", &base), 0.0);
    promtool_accepts(&m);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crio_events_carry_pod_names_trace_context_and_durations() {
    let env = env();
    let log = log_path("crio");
    let ns = env.namespace_with("mx-crio", &events_toml(&log));
    let b = crio_bundle(&ns, "web", "web", &["true"], |s| {
        let a = s["annotations"].as_object_mut().unwrap();
        for (k, v) in [
            ("io.kubernetes.pod.name", "web-0"),
            ("io.kubernetes.pod.namespace", "shop"),
            ("io.kubernetes.pod.uid", "8d6c-uid"),
            ("io.kubernetes.container.name", "nginx"),
        ] {
            a.insert(k.into(), v.into());
        }
    });
    let o = crio_start(&ns, &b.dir, "web", b"");
    assert!(o.status.success(), "{}", text(&o));
    let client = task_client(&String::from_utf8(o.stdout).unwrap()).await;
    let _out = open_fifo_reader(&b.stdout);
    let traced = || {
        let mut c = ctx();
        c.add("traceparent".into(), TRACEPARENT.into());
        c
    };
    client.create(traced(), &crio_create_req(&b)).await.unwrap();
    let start = StartRequest {
        id: "web".into(),
        ..Default::default()
    };
    client.start(traced(), &start).await.unwrap();
    assert_eq!(task(&client, "web").wait().await.unwrap().exit_status, 0);
    crio_remove(&client, "web").await;
    assert!(wait_until(Duration::from_secs(10), || daemons_in(&b.dir).is_empty()));

    let recs = records(&log);
    let kinds: Vec<Kind> = recs.iter().filter(|r| r.id == "web").map(|r| r.event).collect();
    assert_eq!(
        kinds,
        [Kind::Create, Kind::Start, Kind::Exit, Kind::Delete],
        "{recs:#?}"
    );
    for r in recs.iter().filter(|r| r.id == "web") {
        assert_eq!(r.pod.pod.as_deref(), Some("web-0"), "{r:?}");
        assert_eq!(r.pod.pod_namespace.as_deref(), Some("shop"));
        assert_eq!(r.pod.pod_uid.as_deref(), Some("8d6c-uid"));
        assert_eq!(r.pod.container.as_deref(), Some("nginx"));
        assert_eq!(r.ns, "default");
    }
    let create = of(&recs, "web", Kind::Create)[0];
    assert_eq!(create.traceparent.as_deref(), Some(TRACEPARENT));
    assert!(create.duration_ms.unwrap() > 0.0);
    assert_eq!(
        of(&recs, "web", Kind::Start)[0].traceparent.as_deref(),
        Some(TRACEPARENT)
    );
    assert_eq!(
        of(&recs, "web", Kind::Delete)[0].traceparent,
        None,
        "Delete was not traced"
    );
    assert_eq!(of(&recs, "web", Kind::Exit)[0].exit_code, Some(0));

    let m = scrape(&log);
    let base = [("handler", "gantry"), ("namespace", "default")];
    assert_eq!(sample(&m, "gantry_containers_created_total", &base), 1.0, "{m}");
    let exits = [("reason", "normal"), ("process", "init")];
    assert_eq!(sample(&m, "gantry_exits_total", &exits), 1.0);
    let op = [("op", "delete")];
    assert_eq!(sample(&m, "gantry_request_duration_seconds_count", &op), 1.0);
    assert_clean(env, &ns);
}

#[test]
fn device_injection_is_an_event_and_a_counter() {
    let env = env();
    let host = crate::gpu::gpu_host("mx-gpu");
    let log = log_path("gpu");
    let mut config = std::fs::OpenOptions::new().append(true).open(&host.ns.config).unwrap();
    config.write_all(events_toml(&log).as_bytes()).unwrap();
    let o = env.ctr_run(&host.ns, "g", &["--env", "NVIDIA_VISIBLE_DEVICES=0"], &["true"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_clean(env, &host.ns);
    daemons_gone(&host.ns);
    let recs = records(&log);
    let injected = of(&recs, "g", Kind::DevicesInjected);
    assert_eq!(injected.len(), 1, "{recs:#?}");
    let devices = &injected[0].devices;
    assert!(devices.iter().any(|d| d == "nvidia.com/gpu=0"), "{devices:?}");
    let m = scrape(&log);
    let kind = [("kind", "nvidia.com/gpu")];
    let want = devices.iter().filter(|d| d.starts_with("nvidia.com/gpu=")).count() as f64;
    assert_eq!(sample(&m, "gantry_devices_injected_total", &kind), want, "{m}");
}

/// The hardening policy's decisions are events and counters: those applied at a Create
/// (`allow`, by what was decided) and a refused container (`deny`, with the refusal's kind).
#[test]
fn policy_decisions_are_events_and_counters() {
    let env = env();
    let log = log_path("policy");
    let mut toml = include_str!("../runtime-conf/gantry-hardened.toml").to_string();
    toml.push_str(&events_toml(&log));
    let ns = env.namespace_with("mx-policy", &toml);
    let o = env.ctr_run(&ns, "ok", &[], &["true"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = env.ctr_run(&ns, "priv", &["--privileged"], &["true"]);
    assert!(!o.status.success(), "a privileged container ran: {}", text(&o));
    let _ = env.ctr(&ns.name, &["container", "delete", "priv"]);
    assert_clean(env, &ns);
    daemons_gone(&ns);
    let recs = records(&log);
    let allowed = of(&recs, "ok", Kind::Policy);
    let seccomp = allowed
        .iter()
        .find(|r| r.reason.as_deref() == Some("seccomp"))
        .expect("seccomp decision");
    assert_eq!(seccomp.decision.as_deref(), Some("allow"));
    assert_eq!(seccomp.message.as_deref(), Some("runtime-default"));
    let denied = of(&recs, "priv", Kind::Policy);
    assert_eq!(denied.len(), 1, "{recs:#?}");
    assert_eq!(
        (denied[0].decision.as_deref(), denied[0].reason.as_deref()),
        (Some("deny"), Some("privileged"))
    );
    assert!(denied[0]
        .message
        .as_deref()
        .unwrap_or("")
        .contains("security.allow_privileged"));
    let m = scrape(&log);
    assert_eq!(
        sample(
            &m,
            "gantry_policy_decisions_total",
            &[("decision", "deny"), ("reason", "privileged")]
        ),
        1.0,
        "{m}"
    );
    assert_eq!(
        sample(
            &m,
            "gantry_policy_decisions_total",
            &[("decision", "allow"), ("reason", "seccomp")]
        ),
        1.0,
        "{m}"
    );
}

/// `metrics --listen` keeps counting across daemons that come and go; a counter never drops.
#[test]
fn exporter_counters_survive_the_daemons_that_counted() {
    let env = env();
    let log = log_path("listen");
    let ns = env.namespace_with("mx-listen", &events_toml(&log));
    let mut exporter = Command::new(SHIM)
        .args(["metrics", "--listen", "127.0.0.1:0", "--log"])
        .arg(&log)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut banner = String::new();
    // Kept open until the end: the exporter's later messages must not hit a closed pipe.
    let mut stderr = std::io::BufReader::new(exporter.stderr.take().unwrap());
    stderr.read_line(&mut banner).unwrap();
    let addr = banner
        .split("http://")
        .nth(1)
        .and_then(|s| s.split('/').next())
        .unwrap_or_else(|| panic!("no address in {banner:?}"))
        .to_string();
    let get = || {
        let mut s = std::net::TcpStream::connect(&addr).unwrap();
        s.write_all(b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n").unwrap();
        let mut out = String::new();
        s.read_to_string(&mut out).unwrap();
        assert!(out.starts_with("HTTP/1.1 200 OK"), "{out}");
        out
    };
    let base = [("handler", "gantry"), ("namespace", ns.name.as_str())];
    let created = |m: &str| sample(m, "gantry_containers_created_total", &base);
    let mut seen = Vec::new();
    for (i, id) in ["one", "two"].into_iter().enumerate() {
        let o = env.ctr_run(&ns, id, &[], &["true"]);
        assert!(o.status.success(), "{}", text(&o));
        daemons_gone(&ns);
        let m = get();
        seen.push(created(&m));
        assert_eq!(created(&m), (i + 1) as f64, "{m}");
        assert_eq!(
            sample(&m, "gantry_exits_total", &[("reason", "normal")]),
            (i + 1) as f64
        );
    }
    let _ = exporter.kill();
    let _ = exporter.wait();
    drop(stderr);
    assert!(seen.windows(2).all(|w| w[0] <= w[1]), "{seen:?}");
    assert_clean(env, &ns);
}

/// A log gantry cannot write (its directory cannot be made) costs containers nothing: they run
/// and exit as usual, and the daemon says so once, not once per event.
#[test]
fn an_unwritable_log_never_affects_containers() {
    let env = env();
    let ns = env.namespace_with("mx-unwritable", "[events]\nlog = \"/proc/gantry-none/events.jsonl\"\n");
    for id in ["u1", "u2"] {
        let o = env.ctr_run(&ns, id, &[], &["sh", "-c", "exit 7"]);
        assert_eq!(o.status.code(), Some(7), "{}", text(&o));
    }
    assert_clean(env, &ns);
    daemons_gone(&ns);
    // containerd copies each daemon's log lines into its own log.
    let cd_log = std::fs::read_to_string(env.dir.join("containerd.log")).unwrap();
    let warnings = cd_log
        .lines()
        .filter(|l| l.contains(&ns.name) && l.contains("event log not writable"))
        .count();
    assert_eq!(warnings, 2, "one warning per daemon (two containers, two daemons)");
}
