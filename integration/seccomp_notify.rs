//! Watched syscalls (`seccomp_notify`) through real runc: the daemon receives the notification
//! fd at the listener it named in the profile and answers each call (deny, kill, log); every
//! call is one event and one counter increment; CRI-O's notifier annotation, an engine's own
//! listener, and a daemon killed with a call pending (ENOSYS, fail-closed).

use std::path::Path;
use std::time::Duration;

use gantry::telemetry::Kind;
use serde_json::Value;

use crate::common::task::task;
use crate::common::{
    assert_clean, crio_bundle, crio_create_req, crio_remove, crio_start, ctx, env, open_fifo_reader, read_fifo,
    runtimeoptions_any, task_client, text, wait_until,
};
use crate::metrics::{events_toml, log_path, of, promtool_accepts, records, sample, scrape};

/// gantry's profile on every container, `names` watched with `action`, events into `log`.
fn watching(names: &[&str], action: &str, log: &Path) -> String {
    let list: Vec<String> = names.iter().map(|n| format!("{n:?}")).collect();
    format!(
        "[security]\nseccomp_default = \"runtime-default\"\nseccomp_notify = [{}]\nseccomp_notify_action = {action:?}\n{}",
        list.join(", "),
        events_toml(log)
    )
}

/// The seccomp lines of `id`: (syscall, action, count).
fn seccomp_lines(log: &Path, id: &str) -> Vec<(String, String, u64)> {
    let recs = records(log);
    of(&recs, id, Kind::Seccomp)
        .into_iter()
        .map(|r| {
            let s = |v: &Option<String>| v.clone().unwrap_or_default();
            (s(&r.syscall), s(&r.decision), r.count.unwrap_or(0))
        })
        .collect()
}

fn counter(log: &Path, syscall: &str, action: &str) -> f64 {
    let text = scrape(log);
    sample(
        &text,
        "gantry_seccomp_notifications_total",
        &[("syscall", syscall), ("action", action)],
    )
}

/// Each action through containerd: `deny` fails the call with EPERM, `kill` ends the container
/// at the call, `log` lets it run; each call is one event and one counter increment.
#[test]
fn watched_calls_are_denied_killed_or_logged_and_counted() {
    let env = env();
    let log = log_path("notify-deny");
    let ns = env.namespace_with("notify-deny", &watching(&["unshare", "mount"], "deny", &log));
    let o = env.ctr_run(&ns, "n1", &[], &["sh", "-c", "unshare -m true; echo unshare=$?"]);
    let out = text(&o);
    assert!(
        out.contains("unshare=1") && out.contains("Operation not permitted"),
        "{out}"
    );
    assert_eq!(seccomp_lines(&log, "n1"), [("unshare".into(), "deny".into(), 1)]);
    assert_eq!(counter(&log, "unshare", "deny"), 1.0);
    assert_clean(env, &ns);

    let log = log_path("notify-kill");
    let ns = env.namespace_with("notify-kill", &watching(&["unshare"], "kill", &log));
    let o = env.ctr_run(
        &ns,
        "k1",
        &[],
        &["sh", "-c", "echo before; unshare -m true; echo after"],
    );
    let out = text(&o);
    assert_eq!(o.status.code(), Some(137), "{out}");
    assert!(out.contains("before") && !out.contains("after"), "{out}");
    assert_eq!(seccomp_lines(&log, "k1"), [("unshare".into(), "kill".into(), 1)]);
    let recs = records(&log);
    let exits = of(&recs, "k1", Kind::Exit);
    assert_eq!(exits.first().and_then(|r| r.signal), Some(9), "{exits:?}");
    assert_eq!(counter(&log, "unshare", "kill"), 1.0);
    assert_clean(env, &ns);

    // chroot needs CAP_SYS_CHROOT, which containers have by default: under `log` it runs.
    let log = log_path("notify-log");
    let ns = env.namespace_with("notify-log", &watching(&["chroot"], "log", &log));
    let o = env.ctr_run(&ns, "l1", &[], &["sh", "-c", "chroot / true; echo chroot=$?"]);
    let out = text(&o);
    assert!(out.contains("chroot=0"), "{out}");
    assert_eq!(seccomp_lines(&log, "l1"), [("chroot".into(), "log".into(), 1)]);
    assert_eq!(counter(&log, "chroot", "log"), 1.0);
    assert_clean(env, &ns);
}

/// The exposition with the seccomp counter passes promtool (host suite: the node guest has no
/// promtool). The lines are what the notifier writes, the counter what the exporter makes.
#[test]
fn the_seccomp_counter_passes_promtool() {
    let log = log_path("notify-promtool");
    let mut lines = Vec::new();
    for (syscall, action, count) in [("unshare", "deny", 1), ("unshare", "deny", 41), ("mount", "kill", 1)] {
        let mut r = gantry::telemetry::Record::new(Kind::Seccomp, "c1", "k8s.io", "gantry");
        r.syscall = Some(syscall.into());
        r.arch = Some("x86_64".into());
        r.pid = Some(7);
        r.decision = Some(action.into());
        r.count = Some(count);
        lines.extend(r.to_line());
    }
    std::fs::write(&log, lines).unwrap();
    let text = scrape(&log);
    promtool_accepts(&text);
    assert_eq!(counter(&log, "unshare", "deny"), 42.0, "{text}");
    assert_eq!(counter(&log, "mount", "kill"), 1.0, "{text}");
}

/// A flood of one watched call: every call counted, a handful of lines (rate-limited per
/// syscall and second), and the daemon answers other requests meanwhile.
#[test]
fn a_flood_is_counted_exactly_in_a_few_lines() {
    let env = env();
    let log = log_path("notify-flood");
    let ns = env.namespace_with("notify-flood", &watching(&["chdir"], "log", &log));
    let script = "i=0; while [ $i -lt 400 ]; do cd /; i=$((i+1)); done; echo done; exec sleep 1000";
    let o = env.ctr_run_detached(&ns, "f1", &[], &["sh", "-c", script]);
    assert!(o.status.success(), "{}", text(&o));
    // Requests to the same daemon during the flood are answered.
    for _ in 0..5 {
        assert!(env.task_status(&ns.name, "f1").contains("RUNNING"));
    }
    let flooded = wait_until(Duration::from_secs(60), || {
        seccomp_lines(&log, "f1").iter().map(|l| l.2).sum::<u64>() >= 400
    });
    env.kill_and_remove(&ns.name, "f1");
    let lines = seccomp_lines(&log, "f1");
    let total: u64 = lines.iter().map(|l| l.2).sum();
    assert!(flooded && total >= 400, "{total} calls in {} lines", lines.len());
    // One line a second per syscall: 400 calls take far less than 100 s even on the node
    // guest's emulated CPU; without the limit there would be one line a call.
    assert!(
        (lines.len() as u64) < total / 4,
        "{} lines for {total} calls",
        lines.len()
    );
    assert_eq!(counter(&log, "chdir", "log"), total as f64);
    assert_clean(env, &ns);
}

/// CRI-O's `seccompNotifierAction=stop` kills the container at an escape call (gantry's list
/// when the config names none); a profile whose `listenerPath` the engine set is left as it
/// was, its listener getting the fd.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_crio_annotation_kills_and_an_engine_listener_is_kept() {
    let env = env();
    let log = log_path("notify-crio");
    let ns = env.namespace_with(
        "notify-crio",
        &format!(
            "[security]\nseccomp_default = \"runtime-default\"\n{}",
            events_toml(&log)
        ),
    );
    let pod = crio_bundle(&ns, "npod", "npod", &["sleep", "1000"], |_| {});
    let o = crio_start(&ns, &pod.dir, "npod", b"");
    assert!(o.status.success(), "{}", text(&o));
    let client = task_client(&String::from_utf8(o.stdout).unwrap()).await;
    let _pod_out = open_fifo_reader(&pod.stdout);
    client.create(ctx(), &crio_create_req(&pod)).await.unwrap();
    let config = ns.config.clone();
    let create = |b: &crate::common::CrioBundle| {
        let mut r = crio_create_req(b);
        r.options = protobuf::MessageField::some(runtimeoptions_any(&config));
        r
    };

    let stop = |s: &mut Value| s["annotations"]["io.kubernetes.cri-o.seccompNotifierAction"] = "stop".into();
    let b = crio_bundle(
        &ns,
        "nstop",
        "npod",
        &["sh", "-c", "echo before; unshare -m true; echo after"],
        stop,
    );
    let mut out = open_fifo_reader(&b.stdout);
    client.create(ctx(), &create(&b)).await.unwrap();
    let t = task(&client, "nstop");
    t.start().await.unwrap();
    assert_eq!(t.wait().await.unwrap().exit_status, 137);
    let said = read_fifo(&mut out, Duration::from_secs(5));
    assert!(said.contains("before") && !said.contains("after"), "{said}");
    let spec: Value = serde_json::from_slice(&std::fs::read(b.dir.join("config.json")).unwrap()).unwrap();
    let watch = spec["annotations"]["gantry.dev/seccomp-notify"]
        .as_str()
        .unwrap_or_default();
    assert!(watch.starts_with("kill:unshare,setns,mount"), "{spec}");
    crio_remove(&client, "nstop").await;
    assert_eq!(seccomp_lines(&log, "nstop"), [("unshare".into(), "kill".into(), 1)]);

    // The engine's listener: a socket of the test's, which gets the fd; gantry adds nothing.
    let agent = ns.dir.join("agent.sock");
    let listener = std::os::unix::net::UnixListener::bind(&agent).unwrap();
    let got_fd = std::thread::spawn(move || {
        let (s, _) = listener.accept().unwrap();
        let fd = gantry::io::recv_fd(std::os::fd::AsRawFd::as_raw_fd(&s)).is_ok();
        let _ = std::io::Read::read_to_end(&mut &s, &mut Vec::new());
        fd
    });
    let agent_path = agent.display().to_string();
    let engine = move |s: &mut Value| {
        s["annotations"]["io.kubernetes.cri-o.seccompNotifierAction"] = "stop".into();
        s["linux"]["seccomp"] = serde_json::json!({"defaultAction": "SCMP_ACT_ALLOW", "listenerPath": agent_path,
            "syscalls": [{"names": ["getppid"], "action": "SCMP_ACT_NOTIFY"}]});
    };
    let b = crio_bundle(&ns, "nengine", "npod", &["true"], engine);
    let _out = open_fifo_reader(&b.stdout);
    client.create(ctx(), &create(&b)).await.unwrap();
    assert!(got_fd.join().unwrap(), "the engine's listener got no fd");
    let spec: Value = serde_json::from_slice(&std::fs::read(b.dir.join("config.json")).unwrap()).unwrap();
    assert_eq!(spec["linux"]["seccomp"]["listenerPath"], agent.display().to_string());
    assert_eq!(
        spec["linux"]["seccomp"]["syscalls"].as_array().map(Vec::len),
        Some(1),
        "{spec}"
    );
    let t = task(&client, "nengine");
    t.start().await.unwrap();
    assert_eq!(t.wait().await.unwrap().exit_status, 0);
    crio_remove(&client, "nengine").await;
    crate::common::crio_kill_and_remove(&client, "npod").await;
    assert_clean(env, &ns);
}

/// The daemon killed while a watched call waits for its answer: the kernel fails the call with
/// ENOSYS; the container is not left blocked and the shim's `delete` leaves nothing. Started
/// as CRI-O starts it, so no engine cleans up behind the test while the container reports.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_call_pending_when_the_daemon_dies_fails_with_enosys() {
    let env = env();
    let log = log_path("notify-dead");
    let ns = env.namespace_with("notify-dead", &watching(&["unshare"], "log", &log));
    let out = ns.dir.join("out");
    std::fs::create_dir_all(&out).unwrap();
    let bind = serde_json::json!({"destination": "/out", "type": "bind", "source": out, "options": ["rbind", "rw"]});
    let script = "while [ ! -e /out/go ]; do sleep 0.05; done; unshare -m true 2>&1; echo rc=$?";
    let b = crio_bundle(&ns, "p1", "p1", &["sh", "-c", script], |s| {
        s["mounts"].as_array_mut().unwrap().push(bind);
    });
    let o = crio_start(&ns, &b.dir, "p1", b"");
    assert!(o.status.success(), "{}", text(&o));
    let client = task_client(&String::from_utf8(o.stdout).unwrap()).await;
    let mut fifo = open_fifo_reader(&b.stdout);
    let mut req = crio_create_req(&b);
    req.options = protobuf::MessageField::some(runtimeoptions_any(&ns.config));
    let init = client.create(ctx(), &req).await.unwrap().pid;
    task(&client, "p1").start().await.unwrap();
    let daemon: i32 = std::fs::read_to_string(b.dir.join("shim.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let signal = |pid: i32, s| nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), s).unwrap();
    signal(daemon, nix::sys::signal::Signal::SIGSTOP);
    std::fs::write(out.join("go"), b"").unwrap();
    // The call is pending once the shell's child sits in unshare (x86_64: 272).
    let pending = wait_until(Duration::from_secs(60), || {
        let children = std::fs::read_to_string(format!("/proc/{init}/task/{init}/children")).unwrap_or_default();
        children.split_whitespace().any(|c| {
            let syscall = std::fs::read_to_string(format!("/proc/{c}/syscall")).unwrap_or_default();
            syscall.split_whitespace().next() == Some("272")
        })
    });
    assert!(pending, "no call pending");
    signal(daemon, nix::sys::signal::Signal::SIGKILL);
    // The container ends on its own once the call is answered: its output ends with EOF.
    let said = read_fifo(&mut fifo, Duration::from_secs(60));
    assert!(
        said.contains("Function not implemented") && said.contains("rc=1"),
        "{said:?}"
    );
    let o = crate::common::run(
        std::process::Command::new(crate::common::SHIM)
            .args(["-namespace", "default", "-id", "p1", "-bundle"])
            .arg(&b.dir)
            .arg("delete")
            .env("GANTRY_CONFIG", &ns.config),
    );
    assert!(o.status.success(), "{}", text(&o));
    assert!(crate::common::daemons_in(&b.dir).is_empty());
    assert_clean(env, &ns);
}

/// An exec is watched as init is: the runtime loads the profile for the exec too and sends
/// that filter's fd to the same listener, which stays bound for the container's life.
#[test]
fn an_exec_is_watched_as_init_is() {
    let env = env();
    let log = log_path("notify-exec");
    let ns = env.namespace_with("notify-exec", &watching(&["unshare"], "deny", &log));
    let o = env.ctr_run_detached(&ns, "x1", &[], &["sleep", "1000"]);
    assert!(o.status.success(), "{}", text(&o));
    let script = "unshare -m true; echo unshare=$?";
    let o = env.ctr(&ns.name, &["task", "exec", "--exec-id", "e1", "x1", "sh", "-c", script]);
    let out = text(&o);
    assert!(
        out.contains("unshare=1") && out.contains("Operation not permitted"),
        "{out}"
    );
    env.kill_and_remove(&ns.name, "x1");
    assert_eq!(seccomp_lines(&log, "x1"), [("unshare".into(), "deny".into(), 1)]);
    assert_clean(env, &ns);
}
