//! gantry started and driven exactly as CRI-O drives a `runtime_type = "vm"` handler:
//! `start` with an empty address and stdin, then the Task API over ttrpc.

use std::time::Duration;

use containerd_shim_protos::api::Status;

use crate::common::task::{process_any, task};
use crate::common::{
    assert_clean, code, crio_bundle, crio_remove, crio_start, ctx, daemon_pid, env, message, open_fifo_reader,
    read_fifo, task_client, text, wait_until,
};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crio_lifecycle_grouping_and_shutdown() {
    let env = env();
    let ns = env.namespace("crio-pod");
    let infra = crio_bundle(&ns, "pod1", "pod1", &["sleep", "1000"], |_| {});
    let app = crio_bundle(&ns, "app1", "pod1", &["sh", "-c", "echo hi from app; exit 7"], |_| {});

    let o = crio_start(&ns, &infra.dir, "pod1", b"");
    assert!(o.status.success(), "{}", text(&o));
    assert!(o.stderr.is_empty(), "start wrote to stderr: {}", text(&o));
    let address = String::from_utf8(o.stdout.clone()).unwrap();
    assert!(address.starts_with("unix:///"), "{address:?}");
    assert_eq!(std::fs::read_to_string(infra.dir.join("address")).unwrap(), address);
    let daemon = daemon_pid(&infra.dir);

    let client = task_client(&address).await;
    let _infra_out = open_fifo_reader(&infra.stdout);
    let created = client
        .create(ctx(), &crate::common::crio_create_req(&infra))
        .await
        .unwrap();
    assert!(created.pid > 0);
    let pod = task(&client, "pod1");
    pod.start().await.unwrap();
    // Liveness probe on a running init.
    pod.kill(0).await.unwrap();

    // The second container of the pod joins the same daemon.
    let o = crio_start(&ns, &app.dir, "app1", b"");
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(String::from_utf8(o.stdout.clone()).unwrap(), address);
    let app_daemon = daemon_pid(&app.dir);
    assert_eq!(app_daemon, daemon);
    assert_eq!(
        env.shim_processes("default").iter().filter(|p| **p == daemon).count(),
        1
    );

    // CRI-O opens one connection per container.
    let client2 = task_client(&address).await;
    let mut app_out = open_fifo_reader(&app.stdout);
    client2
        .create(ctx(), &crate::common::crio_create_req(&app))
        .await
        .unwrap();
    let app1 = task(&client2, "app1");
    app1.start().await.unwrap();
    let w = app1.wait().await.unwrap();
    assert_eq!(w.exit_status, 7);
    assert_eq!(read_fifo(&mut app_out, Duration::from_secs(5)).trim(), "hi from app");

    let st = app1.state().await.unwrap();
    assert_eq!(st.status.enum_value_or_default(), Status::STOPPED);
    assert_eq!(st.exit_status, 7);
    assert_eq!(st.stdout, app.stdout.to_str().unwrap());
    assert!(!st.terminal);
    assert_eq!(st.bundle, app.dir.to_str().unwrap());

    // Signal 0 to an exited process is an error; SIGKILL/SIGTERM succeed.
    let e = app1.kill(0).await.unwrap_err();
    assert_eq!(code(&e), ttrpc::Code::NOT_FOUND, "{}", message(&e));
    app1.kill(9).await.unwrap();

    let d = crio_remove(&client2, "app1").await;
    assert_eq!(d.exit_status, 7);
    // Still serving the infra container.
    let c = pod.connect().await.unwrap();
    assert_eq!(c.shim_pid as i32, daemon);
    assert_eq!(c.task_pid, created.pid);

    // Two concurrent waiters get the same exit.
    let w1 = pod.wait();
    let w2 = pod.wait();
    let kill = async {
        // Lets both Waits reach the daemon first; if they do not, the test still checks that a
        // Wait answers with the exit whenever it arrives.
        tokio::time::sleep(Duration::from_millis(200)).await;
        pod.kill(9).await
    };
    let (w1, w2, k) = tokio::join!(w1, w2, kill);
    k.unwrap();
    let (w1, w2) = (w1.unwrap(), w2.unwrap());
    assert_eq!(w1.exit_status, 137);
    assert_eq!(w1.exit_status, w2.exit_status);
    assert_eq!(w1.exited_at, w2.exited_at);

    let d = crio_remove(&client, "pod1").await;
    assert_eq!(d.exit_status, 137);
    let gone = wait_until(Duration::from_secs(10), || {
        !std::path::Path::new(&format!("/proc/{daemon}")).exists()
    });
    assert!(gone, "daemon {daemon} still running after the last Shutdown");
    assert_clean(env, &ns);
}

/// kB of the daemon's executable mapped read-only (code, `.rodata`): the pages set-up faulted
/// in and the settle gives back (`/proc/PID/smaps`, mappings of the daemon's own binary).
fn exe_read_only_kb(pid: i32) -> u64 {
    let exe = std::fs::read_link(format!("/proc/{pid}/exe")).unwrap();
    let smaps = std::fs::read_to_string(format!("/proc/{pid}/smaps")).unwrap();
    let (mut ours, mut kb) = (false, 0);
    for line in smaps.lines() {
        let f: Vec<&str> = line.split_whitespace().collect();
        if f.first().is_some_and(|a| a.contains('-') && !a.ends_with(':')) {
            ours = f.len() >= 6 && !f[1].contains('w') && std::path::Path::new(f[5]) == exe;
        } else if ours && f.first() == Some(&"Rss:") {
            kb += f[1].parse::<u64>().unwrap();
        }
    }
    kb
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_running_pods_daemon_settles_and_serves_on() {
    let env = env();
    let ns = env.namespace("crio-settle");
    let infra = crio_bundle(&ns, "pod1", "pod1", &["sleep", "1000"], |_| {});
    let app = crio_bundle(&ns, "app1", "pod1", &["sh", "-c", "echo after the settle"], |_| {});
    let o = crio_start(&ns, &infra.dir, "pod1", b"");
    assert!(o.status.success(), "{}", text(&o));
    let address = String::from_utf8(o.stdout.clone()).unwrap();
    let daemon = daemon_pid(&infra.dir);
    let client = task_client(&address).await;
    let _infra_out = open_fifo_reader(&infra.stdout);
    client
        .create(ctx(), &crate::common::crio_create_req(&infra))
        .await
        .unwrap();
    let pod = task(&client, "pod1");
    pod.start().await.unwrap();
    let set_up = exe_read_only_kb(daemon);

    // A while after the last Start (settle::SETTLE_AFTER, 2 s) the daemon drops what set-up
    // faulted in; waited for, not timed.
    let mut settled = set_up;
    let dropped = wait_until(Duration::from_secs(60), || {
        settled = exe_read_only_kb(daemon);
        settled * 2 < set_up
    });
    assert!(
        dropped,
        "read-only pages of the executable: {set_up} kB after Start, {settled} kB later"
    );

    // And serves on: the code a Create, Start and Wait need faults back in.
    let st = pod.state().await.unwrap();
    assert_eq!(st.status.enum_value_or_default(), Status::RUNNING);
    let o = crio_start(&ns, &app.dir, "app1", b"");
    assert!(o.status.success(), "{}", text(&o));
    let mut app_out = open_fifo_reader(&app.stdout);
    client
        .create(ctx(), &crate::common::crio_create_req(&app))
        .await
        .unwrap();
    let app1 = task(&client, "app1");
    app1.start().await.unwrap();
    assert_eq!(app1.wait().await.unwrap().exit_status, 0);
    assert_eq!(
        read_fifo(&mut app_out, Duration::from_secs(5)).trim(),
        "after the settle"
    );
    crio_remove(&client, "app1").await;
    pod.kill(9).await.unwrap();
    assert_eq!(crio_remove(&client, "pod1").await.exit_status, 137);
    assert_clean(env, &ns);
}

/// CRI-O asks -998 for every infra container. With `restrict_oom_score_adj` gantry raises it
/// to the daemon's own value, as containerd's CRI does with that key, so the pod runs where
/// the runtime may not lower it; the daemon says so in its log.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn restrict_oom_score_adj_raises_the_infra_to_the_daemons_own() {
    let env = env();
    let ns = env.namespace_with("crio-oomadj", "[runtime]\nrestrict_oom_score_adj = true\n");
    let infra = crio_bundle(&ns, "pod1", "pod1", &["sleep", "1000"], |s| {
        s["process"]["oomScoreAdj"] = (-998).into();
    });
    // A plain file where CRI-O passes a FIFO: the daemon's log lines land in it.
    std::fs::write(infra.dir.join("log"), b"").unwrap();
    let o = crio_start(&ns, &infra.dir, "pod1", b"");
    assert!(o.status.success(), "{}", text(&o));
    let own = std::fs::read_to_string(format!("/proc/{}/oom_score_adj", daemon_pid(&infra.dir))).unwrap();
    assert!(own.trim().parse::<i32>().unwrap() > -998, "daemon's own {own}");
    let client = task_client(&String::from_utf8(o.stdout).unwrap()).await;
    let _out = open_fifo_reader(&infra.stdout);
    let created = client
        .create(ctx(), &crate::common::crio_create_req(&infra))
        .await
        .unwrap();
    let adj = std::fs::read_to_string(format!("/proc/{}/oom_score_adj", created.pid)).unwrap();
    assert_eq!(adj.trim(), own.trim());
    let config = std::fs::read_to_string(infra.dir.join("config.json")).unwrap();
    let config: serde_json::Value = serde_json::from_str(&config).unwrap();
    assert_eq!(config["process"]["oomScoreAdj"].to_string(), own.trim());
    let log = std::fs::read_to_string(infra.dir.join("log")).unwrap();
    assert!(
        log.lines()
            .any(|l| l.contains("restrict_oom_score_adj") && l.contains("-998") && l.contains("pod1")),
        "{log}"
    );
    task(&client, "pod1").kill(9).await.unwrap();
    assert_eq!(crio_remove(&client, "pod1").await.exit_status, 137);
    std::fs::remove_file(infra.dir.join("log")).unwrap();
    assert_clean(env, &ns);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn start_accepts_every_stdin_form() {
    use protobuf::Message;
    let env = env();
    let ns = env.namespace("crio-stdin");
    let b = crio_bundle(&ns, "s1", "s1", &["true"], |_| {});
    let legacy = crate::common::runtimeoptions_any(&ns.config).write_to_bytes().unwrap();
    let bootstrap = {
        let mut p = containerd_shim_protos::bootstrap_api::BootstrapParams::new();
        p.instance_id = "someone-else".into();
        p.namespace = "default".into();
        p.write_to_bytes().unwrap()
    };
    let mut addresses = Vec::new();
    for stdin in [b"".to_vec(), legacy, bootstrap, vec![0xff, 0x00, 0x13]] {
        let o = crio_start(&ns, &b.dir, "s1", &stdin);
        assert!(o.status.success() && o.stderr.is_empty(), "{}", text(&o));
        addresses.push(String::from_utf8(o.stdout).unwrap());
    }
    // The same daemon answered every time; nothing was created, so Shutdown ends it.
    assert!(addresses.windows(2).all(|w| w[0] == w[1]), "{addresses:?}");
    let client = task_client(&addresses[0]).await;
    task(&client, "s1").shutdown().await.unwrap();
    let ns_clean = wait_until(Duration::from_secs(10), || {
        std::fs::read_dir(&ns.socket_dir)
            .map(|d| d.count() == 0)
            .unwrap_or(true)
    });
    assert!(ns_clean, "socket left after shutdown");
    assert_clean(env, &ns);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn terminal_init_and_resize_pty() {
    let env = env();
    let ns = env.namespace("crio-tty");
    let b = crio_bundle(
        &ns,
        "tty1",
        "tty1",
        &["sh", "-c", "sleep 1; stty size; test -t 1 && echo tty-yes"],
        |s| {
            s["process"]["terminal"] = true.into();
        },
    );
    let o = crio_start(&ns, &b.dir, "tty1", b"");
    assert!(o.status.success(), "{}", text(&o));
    let client = task_client(&String::from_utf8(o.stdout).unwrap()).await;
    let mut out = open_fifo_reader(&b.stdout);
    let mut req = crate::common::crio_create_req(&b);
    req.terminal = true;
    req.stderr = b.dir.join("stderr-unused").to_str().unwrap().into();
    client.create(ctx(), &req).await.unwrap();
    let tty1 = task(&client, "tty1");
    tty1.start().await.unwrap();
    tty1.resize(123, 45).await.unwrap();
    let w = tty1.wait().await.unwrap();
    assert_eq!(w.exit_status, 0);
    let text = read_fifo(&mut out, Duration::from_secs(5));
    assert!(text.contains("45 123"), "{text:?}");
    assert!(text.contains("tty-yes"), "{text:?}");
    let st = tty1.state().await.unwrap();
    assert!(st.terminal);
    crio_remove(&client, "tty1").await;
    assert_clean(env, &ns);
}

/// A spec holding a value newer than gantry's model (a capability oci-spec does not know) runs
/// as it does under the runc shim (runc warns and ignores it), for init and exec alike; asking
/// for devices in such a spec fails cleanly, naming the value, with the file untouched.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn values_newer_than_the_spec_model_reach_the_runtime() {
    let env = env();
    let ns = env.namespace("crio-newer");
    let future_cap = |s: &mut serde_json::Value| {
        let caps = s["process"]["capabilities"]["bounding"].as_array_mut().unwrap();
        caps.push("CAP_FUTURE_THING".into());
    };
    let b = crio_bundle(&ns, "nc1", "nc1", &["sleep", "1000"], future_cap);
    let o = crio_start(&ns, &b.dir, "nc1", b"");
    assert!(o.status.success(), "{}", text(&o));
    let client = task_client(&String::from_utf8(o.stdout).unwrap()).await;
    let _out = open_fifo_reader(&b.stdout);
    client.create(ctx(), &crate::common::crio_create_req(&b)).await.unwrap();
    let nc1 = task(&client, "nc1");
    nc1.start().await.unwrap();

    // An exec whose process spec carries the same capability.
    let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(b.dir.join("config.json")).unwrap()).unwrap();
    let mut process = spec["process"].clone();
    process["args"] = serde_json::json!(["sh", "-c", "echo exec ran"]);
    let exec_out = b.dir.join("exec-stdout");
    nix::unistd::mkfifo(&exec_out, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let mut out = open_fifo_reader(&exec_out);
    let e1 = nc1.exec("e1");
    let mut exec = e1.exec_request(Some(process_any(process)));
    exec.stdout = exec_out.to_str().unwrap().into();
    client.exec(ctx(), &exec).await.unwrap();
    e1.start().await.unwrap();
    assert_eq!(e1.wait().await.unwrap().exit_status, 0);
    assert!(read_fifo(&mut out, Duration::from_secs(5)).contains("exec ran"));
    e1.delete().await.unwrap();
    // The engine's FIFO, made by this test: the engine removes it.
    std::fs::remove_file(&exec_out).unwrap();

    // Devices asked for in such a spec: refused before anything is mounted or run.
    let g = crio_bundle(&ns, "nc2", "nc1", &["true"], |s| {
        future_cap(s);
        s["annotations"]["gantry.dev/devices"] = "nvidia.com/gpu=0".into();
    });
    let before = std::fs::read(g.dir.join("config.json")).unwrap();
    let e = client
        .create(ctx(), &crate::common::crio_create_req(&g))
        .await
        .unwrap_err();
    assert_eq!(code(&e), ttrpc::Code::INVALID_ARGUMENT, "{}", message(&e));
    assert!(message(&e).contains("CAP_FUTURE_THING"), "{}", message(&e));
    assert_eq!(std::fs::read(g.dir.join("config.json")).unwrap(), before);

    crate::common::crio_kill_and_remove(&client, "nc1").await;
    assert_clean(env, &ns);
}

/// CRI-O's `crictl exec -it`: the request asks for a terminal while the process spec (a copy of
/// the container's) says `terminal: false`. The request wins, as in the runc shim.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exec_with_terminal_from_the_request() {
    let env = env();
    let ns = env.namespace("crio-exec-tty");
    let b = crio_bundle(&ns, "et1", "et1", &["sleep", "1000"], |_| {});
    let o = crio_start(&ns, &b.dir, "et1", b"");
    assert!(o.status.success(), "{}", text(&o));
    let client = task_client(&String::from_utf8(o.stdout).unwrap()).await;
    let _out = open_fifo_reader(&b.stdout);
    client.create(ctx(), &crate::common::crio_create_req(&b)).await.unwrap();
    let et1 = task(&client, "et1");
    et1.start().await.unwrap();

    let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(b.dir.join("config.json")).unwrap()).unwrap();
    let mut process = spec["process"].clone();
    assert_eq!(process["terminal"], false);
    process["args"] = serde_json::json!(["sh", "-c", "tty; echo ok"]);
    let exec_out = b.dir.join("exec-stdout");
    nix::unistd::mkfifo(&exec_out, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let mut out = open_fifo_reader(&exec_out);
    let tty_exec = et1.exec("tty-exec");
    let mut exec = tty_exec.exec_request(Some(process_any(process)));
    exec.terminal = true;
    exec.stdout = exec_out.to_str().unwrap().into();
    client.exec(ctx(), &exec).await.unwrap();
    tty_exec.start().await.unwrap();
    assert_eq!(tty_exec.wait().await.unwrap().exit_status, 0);
    let text = read_fifo(&mut out, Duration::from_secs(5));
    assert!(text.contains("/dev/pts/"), "{text:?}");
    assert!(text.contains("ok"), "{text:?}");
    let st = tty_exec.state().await.unwrap();
    assert!(st.terminal);
    tty_exec.delete().await.unwrap();
    std::fs::remove_file(&exec_out).unwrap();
    crate::common::crio_kill_and_remove(&client, "et1").await;
    assert_clean(env, &ns);
}
