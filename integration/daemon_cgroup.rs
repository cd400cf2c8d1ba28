//! Where a pod's daemon lives: out of the engine's cgroup before it serves (a cgroupfs cgroup
//! of its own on a host without systemd, a transient scope in `system.slice` under systemd),
//! gone when the daemon is; and a daemon emptied by Shutdown exits once its engine falls
//! quiet, though CRI-O never hangs up. The restart of an engine's unit around such a daemon is
//! `node::stopping_the_engines_unit_leaves_its_pods_daemons_serving`.

use std::path::Path;
use std::time::Duration;

use crate::common::cri::cgroup_dirs;
use crate::common::task::task;
use crate::common::{
    assert_clean, crio_bundle, crio_create_req, crio_remove, crio_start, ctx, daemon_pid, env, open_fifo_reader, run,
    task_client, text, wait_until, SHIM,
};

/// `/proc/<pid>/cgroup`'s path per hierarchy (`hierarchy-id:controllers` → path).
fn cgroups(pid: i32) -> Vec<(String, String)> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    text.lines()
        .filter_map(|l| l.rsplit_once(':').map(|(k, v)| (k.to_string(), v.to_string())))
        .collect()
}

/// The daemon's home as it must be on this host: a scope under systemd, else `/gantry/<hash>`.
fn home_suffix(socket: &str) -> String {
    let hash = Path::new(socket).file_name().unwrap().to_str().unwrap().to_string();
    if Path::new("/run/systemd/system").exists() {
        format!("/system.slice/gantry-shim-{hash}.scope")
    } else {
        format!("/gantry/{hash}")
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_daemon_serves_from_its_own_cgroup_and_takes_it_away_when_it_exits() {
    let env = env();
    let ns = env.namespace("home-pod");
    let infra = crio_bundle(&ns, "home1", "home1", &["sleep", "1000"], |_| {});
    // The daemon's log, kept as a file: what it said about its home and its exit.
    std::fs::write(infra.dir.join("log"), b"").unwrap();
    let o = crio_start(&ns, &infra.dir, "home1", b"");
    assert!(o.status.success(), "{}", text(&o));
    let address = String::from_utf8(o.stdout.clone()).unwrap();
    let socket = address.trim_start_matches("unix://").to_string();
    let daemon = daemon_pid(&infra.dir);

    // Out of the cgroups of the process that started it (the engine), in every hierarchy.
    let ours = cgroups(std::process::id() as i32);
    let its = cgroups(daemon);
    let said = || std::fs::read_to_string(infra.dir.join("log")).unwrap_or_default();
    let suffix = home_suffix(&socket);
    assert!(!its.is_empty());
    for (hierarchy, path) in &its {
        let engine = ours.iter().find(|(h, _)| h == hierarchy).map(|(_, p)| p.as_str());
        assert_ne!(
            Some(path.as_str()),
            engine,
            "hierarchy {hierarchy} still the engine's:\n{}",
            said()
        );
        assert!(path.ends_with(&suffix), "hierarchy {hierarchy}: {path}, want …{suffix}");
    }
    let relative = its[0].1.clone();
    assert!(!cgroup_dirs(&relative).is_empty(), "no directory for {relative}");

    // It serves from there: a container runs, exits and is removed.
    let client = task_client(&address).await;
    let _out = open_fifo_reader(&infra.stdout);
    client.create(ctx(), &crio_create_req(&infra)).await.unwrap();
    let pod = task(&client, "home1");
    pod.start().await.unwrap();
    pod.kill(9).await.unwrap();
    assert_eq!(pod.wait().await.unwrap().exit_status, 137);
    // The Shutdown's reply arrives though the client stays connected, as CRI-O's does.
    crio_remove(&client, "home1").await;
    let gone = wait_until(Duration::from_secs(10), || {
        !Path::new(&format!("/proc/{daemon}")).exists()
    });
    assert!(gone, "daemon {daemon} still running after the last Shutdown");
    let left = wait_until(Duration::from_secs(10), || cgroup_dirs(&relative).is_empty());
    assert!(left, "the daemon's cgroup outlived it: {:?}", cgroup_dirs(&relative));
    let log = std::fs::read_to_string(infra.dir.join("log")).unwrap();
    assert!(log.contains("daemon left the engine's cgroup"), "{log}");
    assert!(log.contains("daemon exiting"), "{log}");
    assert!(
        !log.contains("anyway"),
        "the daemon waited out its grace for the engine:\n{log}"
    );
    drop(client);
    std::fs::remove_file(infra.dir.join("log")).unwrap();
    assert_clean(env, &ns);
}

/// A daemon killed outright cannot remove its cgroupfs home; the `delete` the engine runs for
/// a dead daemon does (a systemd scope is collected by systemd itself).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_killed_daemons_cgroup_is_removed_by_delete() {
    let env = env();
    let ns = env.namespace("home-killed");
    let infra = crio_bundle(&ns, "home2", "home2", &["sleep", "1000"], |_| {});
    let o = crio_start(&ns, &infra.dir, "home2", b"");
    assert!(o.status.success(), "{}", text(&o));
    let address = String::from_utf8(o.stdout.clone()).unwrap();
    let daemon = daemon_pid(&infra.dir);
    let relative = cgroups(daemon)[0].1.clone();
    let client = task_client(&address).await;
    let _out = open_fifo_reader(&infra.stdout);
    client.create(ctx(), &crio_create_req(&infra)).await.unwrap();
    task(&client, "home2").start().await.unwrap();
    drop(client);

    nix::sys::signal::kill(nix::unistd::Pid::from_raw(daemon), nix::sys::signal::SIGKILL).unwrap();
    assert!(wait_until(Duration::from_secs(10), || !Path::new(&format!(
        "/proc/{daemon}"
    ))
    .exists()));
    let o = run(std::process::Command::new(SHIM)
        .args(["-namespace", "default", "-id", "home2", "-bundle"])
        .arg(&infra.dir)
        .arg("delete")
        .env("GANTRY_CONFIG", &ns.config));
    assert!(o.status.success(), "{}", text(&o));
    let left = wait_until(Duration::from_secs(10), || cgroup_dirs(&relative).is_empty());
    assert!(left, "the killed daemon's cgroup is left: {:?}", cgroup_dirs(&relative));
    assert_clean(env, &ns);
}

/// CRI-O's upstream unit keeps systemd's default `KillMode=control-group`: stopping it signals
/// every process in its cgroup. A daemon that CRI-O's `start` forked inside such a unit has
/// left for its own scope before it served, so it outlives the stop, and its pod stays
/// manageable: the container's exit while the engine was down is reported after it, and
/// delete and Shutdown work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the production-shaped node: run through scripts/test.sh --node"]
async fn stopping_the_engines_unit_leaves_its_pods_daemons_serving() {
    let env = crate::node::on_node();
    let ns = env.namespace("node-engine-unit");
    let infra = crio_bundle(&ns, "eu1", "eu1", &["sleep", "1000"], |_| {});
    let unit = format!("gantry-test-engine-{}", std::process::id());
    let address_file = ns.dir.join("address-from-unit");
    // The engine: a service with the default KillMode whose process runs `start` as CRI-O
    // does, then stays, as an engine would.
    let start = crate::common::crio_start_cmd(&ns, &infra.dir, "eu1");
    let mut line = format!("'{}'", start.get_program().to_string_lossy());
    for a in start.get_args() {
        line.push_str(&format!(" '{}'", a.to_string_lossy()));
    }
    line.push_str(&format!(" >{} </dev/null; exec sleep 1000", address_file.display()));
    let mut systemd_run = std::process::Command::new("systemd-run");
    systemd_run
        .arg(format!("--unit={unit}"))
        .arg(format!("--working-directory={}", infra.dir.display()));
    for (k, v) in start.get_envs() {
        if let Some(v) = v {
            systemd_run.arg(format!("--setenv={}={}", k.to_string_lossy(), v.to_string_lossy()));
        }
    }
    let o = run(systemd_run.args(["sh", "-c", &line]));
    assert!(o.status.success(), "{}", text(&o));
    let started = wait_until(Duration::from_secs(30), || {
        std::fs::read_to_string(&address_file).is_ok_and(|a| a.starts_with("unix://"))
    });
    assert!(started, "the engine unit's start printed no address");
    let address = std::fs::read_to_string(&address_file).unwrap();
    let daemon = daemon_pid(&infra.dir);
    let client = task_client(&address).await;
    let _out = open_fifo_reader(&infra.stdout);
    let created = client.create(ctx(), &crio_create_req(&infra)).await.unwrap();
    task(&client, "eu1").start().await.unwrap();
    drop(client);

    let o = run(std::process::Command::new("systemctl").args(["stop", &unit]));
    assert!(o.status.success(), "{}", text(&o));
    // systemctl stop returns once the unit's cgroup is empty.
    assert!(
        Path::new(&format!("/proc/{daemon}")).exists(),
        "stopping the engine's unit killed the pod's daemon"
    );
    // The container exits while the engine is down.
    nix::sys::signal::kill(
        nix::unistd::Pid::from_raw(created.pid as i32),
        nix::sys::signal::SIGKILL,
    )
    .unwrap();

    let client = task_client(&address).await;
    let pod = task(&client, "eu1");
    assert_eq!(pod.wait().await.unwrap().exit_status, 137);
    let d = crio_remove(&client, "eu1").await;
    assert_eq!(d.exit_status, 137);
    let gone = wait_until(Duration::from_secs(10), || {
        !Path::new(&format!("/proc/{daemon}")).exists()
    });
    assert!(gone, "daemon {daemon} still running after the last Shutdown");
    let _ = run(std::process::Command::new("systemctl").args(["reset-failed", &unit]));
    assert_clean(env, &ns);
}
