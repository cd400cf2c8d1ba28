//! What only a production-shaped node shows: systemd as PID 1, cgroup v2 with every
//! controller, a `Type=notify` containerd, full capabilities. These tests run in the guest of
//! `scripts/test.sh --node` (`scripts/node-vm.sh`); elsewhere cargo lists them as ignored with
//! the reason, never as passed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::{assert_clean, env, run, text, wait_until, Env, Ns, IMAGE, RUNTIME, SHIM};

const NODE: &str = "needs the production-shaped node: run through scripts/test.sh --node";

/// Fails loudly when run (`--ignored`) anywhere but on such a node.
pub(crate) fn on_node() -> &'static Env {
    let fs = run(Command::new("stat").args(["-fc", "%T", "/sys/fs/cgroup"]));
    assert_eq!(
        String::from_utf8_lossy(&fs.stdout).trim(),
        "cgroup2fs",
        "not a cgroup v2 host: {NODE}"
    );
    let init = std::fs::read_to_string("/proc/1/comm").unwrap_or_default();
    assert_eq!(init.trim(), "systemd", "PID 1 is not systemd: {NODE}");
    env()
}

fn pid_file(bundle: &Path, name: &str) -> i32 {
    std::fs::read_to_string(bundle.join(name))
        .unwrap()
        .trim()
        .parse()
        .unwrap()
}

/// The v2 cgroup directory of a process, from its `0::` line.
fn cgroup_dir(pid: i32) -> PathBuf {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let path = text
        .lines()
        .find_map(|l| l.strip_prefix("0::"))
        .expect("a v2 cgroup line");
    Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'))
}

fn read(dir: &Path, file: &str) -> String {
    std::fs::read_to_string(dir.join(file))
        .unwrap_or_default()
        .trim()
        .to_string()
}

fn metrics(ns: &str, id: &str) -> serde_json::Value {
    let o = env().ctr(ns, &["task", "metrics", "--format", "json", id]);
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("metrics json: {e}: {}", text(&o)))
}

/// Sends Update with `resources` (LinuxResources JSON) to the daemon serving `bundle`.
fn update(bundle: &Path, resources: &str) {
    use crate::common::task::task;
    let address = std::fs::read_to_string(bundle.join("address")).unwrap();
    let mut any = protobuf::well_known_types::any::Any::new();
    any.type_url = "opencontainers/runtime-spec/1/LinuxResources".into();
    any.value = resources.as_bytes().to_vec();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = crate::common::task_client(&address).await;
        task(&client, "box").update(Some(any)).await.unwrap();
    });
}

/// Limits, Stats, Update, Pause/Resume and cleanup on cgroup v2, through runc and crun.
#[test]
#[ignore = "needs the production-shaped node: run through scripts/test.sh --node"]
fn cgroup_v2_limits_stats_update_freeze_and_cleanup() {
    let env = on_node();
    for (label, extra) in [("runc", ""), ("crun", "[runtime]\nbinary = \"crun\"\n")] {
        let ns = env.namespace_with(&format!("node-v2-{label}"), extra);
        let flags = ["--memory-limit", "67108864", "--cpus", "0.5"];
        let o = env.ctr_run_detached(&ns, "box", &flags, &["sleep", "1000"]);
        assert!(o.status.success(), "{label}: {}", text(&o));
        env.wait_status(&ns.name, "box", "RUNNING");
        let pid = pid_file(&env.bundle(&ns.name, "box"), "init.pid");
        let dir = cgroup_dir(pid);
        assert_eq!(read(&dir, "memory.max"), "67108864", "{label}: {}", dir.display());
        assert_eq!(read(&dir, "cpu.max"), "50000 100000", "{label}");

        // io.containerd.cgroups.v2.Metrics: `usage_limit` exists only there.
        let m = metrics(&ns.name, "box");
        assert_eq!(m["memory"]["usage_limit"].as_u64(), Some(67108864), "{label}: {m}");
        assert!(m["memory"]["usage"].as_u64().unwrap_or(0) > 0, "{label}: {m}");
        assert_eq!(m["pids"]["current"].as_u64(), Some(1), "{label}: {m}");

        // ctr 1.6 has no `task update`: the Task API's Update, straight to the daemon.
        update(
            &env.bundle(&ns.name, "box"),
            r#"{"memory":{"limit":134217728},"pids":{"limit":77}}"#,
        );
        assert_eq!(read(&dir, "memory.max"), "134217728", "{label}");
        assert_eq!(read(&dir, "pids.max"), "77", "{label}");

        let o = env.ctr(&ns.name, &["task", "pause", "box"]);
        assert!(o.status.success(), "{label}: {}", text(&o));
        env.wait_status(&ns.name, "box", "PAUSED");
        assert_eq!(read(&dir, "cgroup.freeze"), "1", "{label}");
        let o = env.ctr(&ns.name, &["task", "resume", "box"]);
        assert!(o.status.success(), "{label}: {}", text(&o));
        env.wait_status(&ns.name, "box", "RUNNING");
        assert_eq!(read(&dir, "cgroup.freeze"), "0", "{label}");

        env.kill_and_remove(&ns.name, "box");
        assert!(
            wait_until(Duration::from_secs(10), || !dir.exists()),
            "{label}: {} left behind",
            dir.display()
        );
        assert_clean(env, &ns);
    }
}

/// A `slice:prefix:name` cgroupsPath with gantry's config as shipped (no `systemd_cgroup` key,
/// no runc option from the engine): the path's form picks runc's systemd driver, so the
/// container runs in a transient scope under its slice with the spec's limit, and the scope is
/// gone after delete.
#[test]
#[ignore = "needs the production-shaped node: run through scripts/test.sh --node"]
fn the_systemd_cgroup_driver_runs_the_container_in_a_scope_it_removes() {
    let env = on_node();
    let ns = env.namespace("node-systemd");
    let scope = format!("gantry-{}.scope", ns.name);
    let cgroup = format!("gantrytest.slice:gantry:{}", ns.name);
    let flags = ["--cgroup", cgroup.as_str(), "--memory-limit", "67108864"];
    let o = env.ctr_run_detached(&ns, "box", &flags, &["sleep", "1000"]);
    assert!(o.status.success(), "{}", text(&o));
    env.wait_status(&ns.name, "box", "RUNNING");
    let pid = pid_file(&env.bundle(&ns.name, "box"), "init.pid");
    let dir = cgroup_dir(pid);
    assert!(
        dir.ends_with(format!("gantrytest.slice/{scope}")),
        "not in its scope: {}",
        dir.display()
    );
    assert_eq!(read(&dir, "memory.max"), "67108864");
    let active = run(Command::new("systemctl").args(["is-active", &scope]));
    assert_eq!(
        String::from_utf8_lossy(&active.stdout).trim(),
        "active",
        "{}",
        text(&active)
    );

    env.kill_and_remove(&ns.name, "box");
    let gone = wait_until(Duration::from_secs(10), || {
        let units = run(Command::new("systemctl").args(["list-units", "--all", "--no-legend", &scope]));
        !String::from_utf8_lossy(&units.stdout).contains(&scope)
    });
    assert!(gone, "{scope} is still listed after delete");
    assert_clean(env, &ns);
}

/// The node's own containerd (the systemd service) and `/usr/local/bin` are shared by the
/// tests that use them: one at a time.
static SYSTEM_CONTAINERD: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// [`on_node`], holding the node's containerd for the caller.
pub(crate) fn on_node_containerd() -> (&'static Env, std::sync::MutexGuard<'static, ()>) {
    let env = on_node();
    (env, SYSTEM_CONTAINERD.lock().unwrap_or_else(|e| e.into_inner()))
}

fn system_ctr(args: &[&str]) -> std::process::Output {
    run(Command::new("ctr")
        .args(["--address", "/run/containerd/containerd.sock", "-n", "gantry-node"])
        .args(args))
}

fn environ(pid: i32) -> String {
    String::from_utf8_lossy(&std::fs::read(format!("/proc/{pid}/environ")).unwrap_or_default()).replace('\0', "\n")
}

/// The node's own containerd, started by systemd as `Type=notify`, has `NOTIFY_SOCKET` in its
/// environment; a detached container through gantry still reaches RUNNING at once.
#[test]
#[ignore = "needs the production-shaped node: run through scripts/test.sh --node"]
fn a_detached_container_under_the_nodes_type_notify_containerd_runs() {
    let (env, _turn) = on_node_containerd();
    let main_pid = run(Command::new("systemctl").args(["show", "-p", "MainPID", "--value", "containerd"]));
    let main_pid: i32 = String::from_utf8_lossy(&main_pid.stdout).trim().parse().unwrap_or(0);
    assert!(main_pid > 0, "the node's containerd is not running");
    assert!(
        environ(main_pid).contains("NOTIFY_SOCKET="),
        "systemd gave containerd no NOTIFY_SOCKET"
    );
    // containerd finds shims in its PATH, as on a node with gantry installed.
    let link = Path::new("/usr/local/bin/containerd-shim-gantry-v2");
    let _ = std::fs::remove_file(link);
    std::os::unix::fs::symlink(SHIM, link).unwrap();
    let o = system_ctr(&["images", "import", env.image_tar.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let o = system_ctr(&["run", "-d", "--runtime", RUNTIME, IMAGE, "notify1", "sleep", "1000"]);
    assert!(
        o.status.success(),
        "ctr run -d under the node's containerd: {}",
        text(&o)
    );
    let running = wait_until(Duration::from_secs(10), || {
        String::from_utf8_lossy(&system_ctr(&["task", "ls"]).stdout).contains("RUNNING")
    });
    let pids = system_ctr(&["task", "ls"]);
    assert!(running, "{}", text(&pids));
    let ls = String::from_utf8_lossy(&pids.stdout).into_owned();
    let pid: i32 = ls
        .lines()
        .find(|l| l.starts_with("notify1"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|p| p.parse().ok())
        .unwrap_or(0);
    assert!(pid > 0, "{ls}");
    assert!(
        !environ(pid).contains("NOTIFY_SOCKET"),
        "the container got NOTIFY_SOCKET"
    );
    let o = system_ctr(&["task", "kill", "-s", "SIGKILL", "notify1"]);
    assert!(o.status.success(), "{}", text(&o));
    let stopped = wait_until(Duration::from_secs(10), || {
        String::from_utf8_lossy(&system_ctr(&["task", "ls"]).stdout).contains("STOPPED")
    });
    assert!(stopped);
    let o = system_ctr(&["task", "delete", "notify1"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = system_ctr(&["container", "delete", "notify1"]);
    assert!(o.status.success(), "{}", text(&o));
    let _ = std::fs::remove_file(link);
}

/// Every capability up to `cap_last_cap`, which this project's build machines lack.
#[test]
#[ignore = "needs the production-shaped node: run through scripts/test.sh --node"]
fn a_privileged_container_has_every_capability() {
    let env = on_node();
    let ns = env.namespace("node-priv");
    let last: u32 = std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let all = (1u64 << (last + 1)) - 1;
    let o = env.ctr_run(&ns, "priv", &["--privileged"], &["grep", "CapEff", "/proc/self/status"]);
    assert!(o.status.success(), "{}", text(&o));
    let out = String::from_utf8_lossy(&o.stdout);
    let hex = out.split_whitespace().nth(1).unwrap_or("");
    assert_eq!(u64::from_str_radix(hex, 16).ok(), Some(all), "{out}");
    assert_clean(env, &ns);
}

/// CRI-O gives infra containers -998: applied by runc where CAP_SYS_RESOURCE is held.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the production-shaped node: run through scripts/test.sh --node"]
async fn a_negative_oom_score_adj_is_applied() {
    use crate::common::{
        crio_bundle, crio_create_req, crio_kill_and_remove, crio_start, ctx, open_fifo_reader, task_client,
    };
    let env = on_node();
    let ns: Ns = env.namespace("node-oomadj");
    let b = crio_bundle(&ns, "adj", "adj", &["sleep", "1000"], |s| {
        s["process"]["oomScoreAdj"] = (-998).into();
    });
    let o = crio_start(&ns, &b.dir, "adj", b"");
    assert!(o.status.success(), "{}", text(&o));
    let client = task_client(&String::from_utf8(o.stdout).unwrap()).await;
    let _out = open_fifo_reader(&b.stdout);
    let created = client.create(ctx(), &crio_create_req(&b)).await.unwrap();
    let adj = std::fs::read_to_string(format!("/proc/{}/oom_score_adj", created.pid)).unwrap();
    assert_eq!(adj.trim(), "-998");
    crio_kill_and_remove(&client, "adj").await;
    assert_clean(env, &ns);
}

/// With the default config (no `[security]` table), a spec naming a profile the node has not
/// loaded fails Create with gantry's error naming it, not runc's write error.
#[test]
#[ignore = "needs the production-shaped node: run through scripts/test.sh --node"]
fn a_named_apparmor_profile_that_is_not_loaded_fails_create_clearly() {
    let env = on_node();
    let ns = env.namespace("node-aa");
    let o = env.ctr_run(&ns, "aa", &["--apparmor-profile", "gantry-test-missing"], &["true"]);
    assert!(!o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("\"gantry-test-missing\"") && err.contains("is not loaded on this host"),
        "{}",
        text(&o)
    );
    let _ = env.ctr(&ns.name, &["container", "delete", "aa"]);
    assert_clean(env, &ns);
}

/// The AppArmor label of a fresh container process, as `/proc/self/attr/current` shows it.
fn label(env: &Env, ns: &Ns, id: &str, extra: &[&str]) -> String {
    let o = env.ctr_run(ns, id, extra, &["cat", "/proc/self/attr/current"]);
    assert!(o.status.success(), "{}", text(&o));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// `apparmor_default = "gantry-default"`: gantry loads its own profile the first time it is
/// needed (here it is unloaded first), unprivileged containers run confined by it, a mount
/// the profile denies is refused even with CAP_SYS_ADMIN (the same mount succeeds
/// unconfined), and privileged containers stay unconfined.
#[test]
#[ignore = "needs the production-shaped node: run through scripts/test.sh --node"]
fn gantry_default_is_loaded_on_demand_and_confines_unprivileged_containers() {
    let env = on_node();
    let profile = Path::new(env!("CARGO_MANIFEST_DIR")).join("runtime-conf/apparmor/gantry-default");
    let listed = || std::fs::read_to_string("/sys/kernel/security/apparmor/profiles").unwrap_or_default();
    if listed().lines().any(|l| l.starts_with("gantry-default ")) {
        let o = run(Command::new("apparmor_parser").arg("-R").arg(&profile));
        assert!(o.status.success(), "unload: {}", text(&o));
    }
    let mount = ["sh", "-c", "mkdir -p /tmp/m && mount -t tmpfs t /tmp/m && echo mounted"];
    let cap = ["--cap-add", "CAP_SYS_ADMIN"];

    let plain = env.namespace("node-aa-none");
    assert_eq!(label(env, &plain, "u", &[]), "unconfined");
    let o = env.ctr_run(&plain, "m", &cap, &mount);
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("mounted"),
        "control: {}",
        text(&o)
    );

    let ns = env.namespace_with("node-aa-default", "[security]\napparmor_default = \"gantry-default\"\n");
    assert_eq!(label(env, &ns, "c", &[]), "gantry-default (enforce)");
    assert!(
        listed().lines().any(|l| l == "gantry-default (enforce)"),
        "{}",
        listed()
    );
    let o = env.ctr_run(&ns, "m", &cap, &mount);
    assert!(!String::from_utf8_lossy(&o.stdout).contains("mounted"), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("ermission denied"),
        "{}",
        text(&o)
    );
    assert_eq!(label(env, &ns, "p", &["--privileged"]), "unconfined");
    assert_clean(env, &plain);
    assert_clean(env, &ns);
}

/// containerd's runc option `SystemdCgroup = true` (what a `runc`-style handler's options carry
/// in Create) makes gantry use the systemd driver even though its own config does not.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the production-shaped node: run through scripts/test.sh --node"]
async fn the_engines_systemd_cgroup_option_selects_the_systemd_driver() {
    use crate::common::{
        crio_bundle, crio_create_req, crio_kill_and_remove, crio_start, ctx, open_fifo_reader, task_client,
    };
    use containerd_shim_protos::protobuf::Message;
    let env = on_node();
    let ns = env.namespace("node-sdopt");
    let scope = format!("gantry-{}.scope", ns.name);
    let cgroups_path = format!("gantrytest.slice:gantry:{}", ns.name);
    let b = crio_bundle(&ns, "sd", "sd", &["sleep", "1000"], |s| {
        s["linux"]["cgroupsPath"] = cgroups_path.clone().into();
    });
    let o = crio_start(&ns, &b.dir, "sd", b"");
    assert!(o.status.success(), "{}", text(&o));
    let client = task_client(&String::from_utf8(o.stdout).unwrap()).await;
    let _out = open_fifo_reader(&b.stdout);
    let options = containerd_shim_protos::shim::oci::Options {
        systemd_cgroup: true,
        ..Default::default()
    };
    let mut any = protobuf::well_known_types::any::Any::new();
    any.type_url = "containerd.runc.v1.Options".into();
    any.value = options.write_to_bytes().unwrap();
    let mut req = crio_create_req(&b);
    req.options = protobuf::MessageField::some(any);
    let created = client.create(ctx(), &req).await.unwrap();
    let dir = cgroup_dir(created.pid as i32);
    assert!(
        dir.ends_with(format!("gantrytest.slice/{scope}")),
        "not in its scope: {}",
        dir.display()
    );
    crio_kill_and_remove(&client, "sd").await;
    let gone = wait_until(Duration::from_secs(10), || {
        let units = run(Command::new("systemctl").args(["list-units", "--all", "--no-legend", &scope]));
        !String::from_utf8_lossy(&units.stdout).contains(&scope)
    });
    assert!(gone, "{scope} is still listed after delete");
    assert_clean(env, &ns);
}
