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
        // Let the subscription register before anything happens.
        std::thread::sleep(Duration::from_millis(300));
        Events { child, lines }
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
    let running = wait_until(Duration::from_secs(10), || {
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

    let ok = wait_until(Duration::from_secs(5), || events.task_topics("ev").len() >= 4);
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
    let gone = wait_until(Duration::from_secs(10), || {
        !std::path::Path::new(&format!("/proc/{init_pid}")).exists()
    });
    assert!(gone, "container process {init_pid} survived");
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
        let ok = wait_until(Duration::from_secs(5), || events.task_topics(&id).len() >= 4);
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
