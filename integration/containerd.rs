//! gantry driven by a real containerd 1.6 through `ctr`.

use std::io::{BufRead, BufReader};
use std::process::{Child, Stdio};
use std::time::Duration;

use crate::common::{assert_clean, env, text, wait_until, Ns};

/// `ctr events` running in the background; collects lines.
pub(crate) struct Events {
    child: Child,
    lines: std::sync::Arc<std::sync::Mutex<Vec<String>>>,
}

impl Events {
    pub(crate) fn start(ns: &Ns) -> Events {
        let mut child = env()
            .ctr_cmd(&ns.name)
            .arg("events")
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .unwrap();
        let out = child.stdout.take().unwrap();
        let lines = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
        let l2 = lines.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                l2.lock().unwrap().push(line);
            }
        });
        // Ready once the subscription delivers: label the namespace (a `/namespaces/update`
        // event) until such an event arrives, instead of sleeping and hoping.
        let events = Events { child, lines };
        let _ = env().ctr(&ns.name, &["namespaces", "create", &ns.name]);
        let ready = crate::common::wait_until(Duration::from_secs(30), || {
            let _ = env().ctr(&ns.name, &["namespaces", "label", &ns.name, "gantry-events-probe=1"]);
            events
                .lines
                .lock()
                .unwrap()
                .iter()
                .any(|l| l.contains("/namespaces/update"))
        });
        assert!(ready, "`ctr events` never delivered the probe event");
        events
    }

    /// Topics of /tasks/* events concerning `id`, in arrival order.
    pub(crate) fn task_topics(&self, id: &str) -> Vec<String> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(&format!("\"container_id\":\"{id}\"")))
            .filter_map(|l| {
                l.split_whitespace()
                    .find(|w| w.starts_with("/tasks/"))
                    .map(str::to_string)
            })
            .collect()
    }

    pub(crate) fn lines_for(&self, id: &str, topic: &str) -> Vec<String> {
        self.lines
            .lock()
            .unwrap()
            .iter()
            .filter(|l| l.contains(&format!("\"container_id\":\"{id}\"")) && l.contains(topic))
            .cloned()
            .collect()
    }
}

impl Drop for Events {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn run_prints_output_and_exact_exit_codes() {
    let env = env();
    let ns = env.namespace("ctr-run");
    let o = env.ctr_run(&ns, "hello", &[], &["echo", "hello from gantry"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "hello from gantry");

    let o = env.ctr_run(&ns, "three", &[], &["sh", "-c", "echo out; echo err >&2; exit 3"]);
    assert_eq!(o.status.code(), Some(3), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "out");
    assert_eq!(String::from_utf8_lossy(&o.stderr).trim(), "err");

    // A container killed from outside: `ctr run` reports 128 + SIGKILL.
    let config = ns.config.to_str().unwrap().to_string();
    let run = env
        .ctr_cmd(&ns.name)
        .args([
            "run",
            "--rm",
            "--runtime",
            crate::common::RUNTIME,
            "--runtime-config-path",
            &config,
        ])
        .args([crate::common::IMAGE, "killed", "sleep", "1000"])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Generous: an attached `ctr run` in the node guest under TCG on a busy host took over 10 s.
    let running = wait_until(Duration::from_secs(90), || {
        String::from_utf8_lossy(&env.ctr(&ns.name, &["task", "ls"]).stdout).contains("RUNNING")
    });
    assert!(running, "task never ran");
    let o = env.ctr(&ns.name, &["task", "kill", "-s", "SIGKILL", "killed"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = run.wait_with_output().unwrap();
    assert_eq!(o.status.code(), Some(137), "{}", text(&o));
    assert_clean(env, &ns);
}

#[test]
fn kill_delete_and_events_in_order() {
    let env = env();
    let ns = env.namespace("ctr-events");
    let events = Events::start(&ns);
    let o = env.ctr_run_detached(&ns, "ev", &[], &["sleep", "1000"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = env.ctr(&ns.name, &["task", "ls"]);
    assert!(String::from_utf8_lossy(&o.stdout).contains("RUNNING"), "{}", text(&o));

    let o = env.ctr(&ns.name, &["task", "kill", "-s", "SIGKILL", "ev"]);
    assert!(o.status.success(), "{}", text(&o));
    let stopped = wait_until(Duration::from_secs(10), || {
        String::from_utf8_lossy(&env.ctr(&ns.name, &["task", "ls"]).stdout).contains("STOPPED")
    });
    assert!(stopped, "task did not stop");
    // SIGKILL to an already-exited task succeeds, as with the runc shim.
    let o = env.ctr(&ns.name, &["task", "kill", "-s", "SIGKILL", "ev"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = env.ctr(&ns.name, &["task", "delete", "ev"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = env.ctr(&ns.name, &["container", "delete", "ev"]);
    assert!(o.status.success(), "{}", text(&o));

    let ok = wait_until(Duration::from_secs(30), || events.task_topics("ev").len() >= 4);
    let topics = events.task_topics("ev");
    assert!(ok, "events: {topics:?}");
    assert_eq!(
        topics,
        ["/tasks/create", "/tasks/start", "/tasks/exit", "/tasks/delete"]
    );
    let exit = events.lines_for("ev", "/tasks/exit");
    assert!(exit[0].contains("\"exit_status\":137"), "{exit:?}");
    assert_clean(env, &ns);
}

#[test]
fn fifty_containers_leave_nothing_behind() {
    let env = env();
    let ns = env.namespace("ctr-fifty");
    for i in 0..50 {
        let id = format!("c{i}");
        let o = env.ctr_run(&ns, &id, &[], &["sh", "-c", &format!("echo {i}")]);
        assert!(o.status.success(), "container {i}: {}", text(&o));
        assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), i.to_string());
    }
    assert_clean(env, &ns);
}

#[test]
fn killed_daemon_is_cleaned_up_through_delete() {
    let env = env();
    let ns = env.namespace("ctr-sigkill");
    let o = env.ctr_run_detached(&ns, "victim", &[], &["sleep", "1000"]);
    assert!(o.status.success(), "{}", text(&o));
    let bundle = env.bundle(&ns.name, "victim");
    let shim_pid: i32 = std::fs::read_to_string(bundle.join("shim.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let init_pid: i32 = std::fs::read_to_string(bundle.join("init.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    assert!(shim_pid > 0 && init_pid > 0);
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(shim_pid), nix::sys::signal::Signal::SIGKILL).unwrap();

    // containerd notices the dead shim and runs `containerd-shim-gantry-v2 delete`.
    let stopped = wait_until(Duration::from_secs(20), || {
        let ls = String::from_utf8_lossy(&env.ctr(&ns.name, &["task", "ls"]).stdout).into_owned();
        !ls.contains("RUNNING")
    });
    assert!(stopped, "task still running after its shim was killed");
    let _ = env.ctr(&ns.name, &["task", "delete", "victim"]);
    let o = env.ctr(&ns.name, &["container", "delete", "victim"]);
    assert!(o.status.success(), "{}", text(&o));
    // Dead is what counts: once the shim is gone its orphans belong to containerd (a
    // subreaper), which reaps them on its own time, slowly under the node guest's emulated CPU.
    let stat = || std::fs::read_to_string(format!("/proc/{init_pid}/stat")).unwrap_or_default();
    let gone = wait_until(Duration::from_secs(30), || {
        let s = stat();
        s.is_empty() || s.contains(") Z")
    });
    assert!(gone, "container process {init_pid} survived: {}", stat());
    // containerd removes a dead shim's bundle, socket and rootfs mount on its own time (it runs
    // `delete` and unmounts after the task is gone): under the node guest's emulated CPU that
    // has taken longer than assert_clean's 10 s. What is never cleaned still fails below.
    wait_until(Duration::from_secs(60), || env.leftovers(&ns).is_empty());
    assert_clean(env, &ns);
}

#[test]
fn crun_selected_by_config() {
    let env = env();
    let ns = env.namespace_with("ctr-crun", "[runtime]\nbinary = \"crun\"\n");
    let o = env.ctr_run(&ns, "c1", &[], &["sh", "-c", "echo via crun; exit 4"]);
    assert_eq!(o.status.code(), Some(4), "{}", text(&o));
    assert_eq!(String::from_utf8_lossy(&o.stdout).trim(), "via crun");
    // The runtime's own state root proves crun (not runc) ran it.
    let o = env.ctr_run_detached(&ns, "c2", &[], &["sleep", "100"]);
    assert!(o.status.success(), "{}", text(&o));
    let crun_state = ns.runtime_root.join(&ns.name).join("c2").join("status");
    assert!(crun_state.exists(), "no crun state at {}", crun_state.display());
    env.kill_and_remove(&ns.name, "c2");
    assert_clean(env, &ns);
}

#[test]
fn instant_exit_is_reported_after_start() {
    let env = env();
    let ns = env.namespace("ctr-instant");
    let events = Events::start(&ns);
    for i in 0..10 {
        let id = format!("i{i}");
        let o = env.ctr_run(&ns, &id, &[], &["true"]);
        assert!(o.status.success(), "{}", text(&o));
    }
    for i in 0..10 {
        let id = format!("i{i}");
        let ok = wait_until(Duration::from_secs(30), || events.task_topics(&id).len() >= 4);
        let topics = events.task_topics(&id);
        assert!(ok, "{id}: {topics:?}");
        assert_eq!(
            topics,
            ["/tasks/create", "/tasks/start", "/tasks/exit", "/tasks/delete"],
            "{id}"
        );
    }
    assert_clean(env, &ns);
}

/// The names in `/proc/<pid>/environ`.
fn environ_names(pid: i32) -> Vec<String> {
    let raw = std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default();
    raw.split(|b| *b == 0)
        .filter_map(|kv| kv.split(|b| *b == b'=').next())
        .filter(|k| !k.is_empty())
        .map(|k| String::from_utf8_lossy(k).into_owned())
        .collect()
}

fn pid_in(bundle: &std::path::Path, file: &str) -> i32 {
    let text = std::fs::read_to_string(bundle.join(file)).unwrap();
    text.trim().parse().unwrap()
}

/// containerd under systemd (`Type=notify`) has `NOTIFY_SOCKET` and the other service
/// variables in its environment, and passes them to every shim. runc and crun would take
/// `NOTIFY_SOCKET` as a request to relay the container's READY=1 and make `start` wait for
/// it: `ctr run -d` then hangs with the task CREATED. The shared containerd of these tests runs
/// with all of them set (see `common::env`).
#[test]
fn a_notify_socket_in_the_engines_environment_reaches_no_runtime() {
    let env = env();
    let mut names: Vec<&str> = crate::common::SERVICE_MANAGER_ENV.iter().map(|(k, _)| *k).collect();
    names.push("NOTIFY_SOCKET");
    for (label, extra) in [("runc", ""), ("crun", "[runtime]\nbinary = \"crun\"\n")] {
        let ns = env.namespace_with(&format!("ctr-notify-{label}"), extra);
        let o = env.ctr_run_detached(&ns, "n1", &[], &["sleep", "1000"]);
        assert!(o.status.success(), "{label}: ctr run -d: {}", text(&o));
        env.wait_status(&ns.name, "n1", "RUNNING");
        let bundle = env.bundle(&ns.name, "n1");
        // (The daemon's own /proc/PID/environ still shows the block it was started with; what
        // counts is what its children get.)
        let seen = environ_names(pid_in(&bundle, "init.pid"));
        assert!(
            seen.iter().any(|s| s == "PATH"),
            "{label}: no environment read: {seen:?}"
        );
        let leaked: Vec<_> = names.iter().filter(|n| seen.iter().any(|s| s == *n)).collect();
        assert!(leaked.is_empty(), "{label}: the container got {leaked:?}");
        // runc keeps the relay socket in <root>/<id>/notify/, crun in <root>/<id>/notify/ too.
        let state = ns.runtime_root.join(&ns.name).join("n1");
        assert!(
            !state.join("notify").exists(),
            "{label}: the runtime set up a notify relay"
        );
        env.kill_and_remove(&ns.name, "n1");
        assert_clean(env, &ns);
    }
}
