//! The lifecycle under deadlines and hung runtimes: a client deadline that cancels a request
//! midway, and an OCI runtime that never answers.

use std::path::Path;
use std::time::{Duration, Instant};

use containerd_shim_protos::api::{ConnectRequest, ShutdownRequest};

use crate::common::task::task;

use crate::common::{
    assert_clean, code, crio_bundle, crio_create_req, crio_kill_and_remove, crio_start, ctx, daemon_pid, env, message,
    open_fifo_reader, runtimeoptions_any, task_client, text, wait_until,
};

fn alive(pid: i32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

/// Processes whose command line mentions `needle` (zombies have none, so they do not count).
fn processes_with(needle: &str) -> Vec<String> {
    crate::common::processes()
        .into_iter()
        .map(|(pid, args)| format!("{pid} {}", args.join(" ")))
        .filter(|line| line.contains(needle))
        .collect()
}

/// A Create whose client deadline (1 ms) passes while runc is still creating: ttrpc drops the
/// handler, the create still runs to its end, and CRI-O's answer (Delete, Shutdown) leaves
/// nothing behind and ends the daemon.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn create_cancelled_by_a_client_deadline_leaves_nothing() {
    let env = env();
    let ns = env.namespace("cancel");
    let b = crio_bundle(&ns, "cx1", "cx1", &["sleep", "1000"], |_| {});
    let o = crio_start(&ns, &b.dir, "cx1", b"");
    assert!(o.status.success(), "{}", text(&o));
    let daemon = daemon_pid(&b.dir);
    let client = task_client(&String::from_utf8(o.stdout).unwrap()).await;
    let _out = open_fifo_reader(&b.stdout);

    let short = ttrpc::context::with_timeout(Duration::from_millis(1).as_nanos() as i64);
    let e = client.create(short, &crio_create_req(&b)).await.unwrap_err();
    if let ttrpc::Error::RpcStatus(_) = e {
        assert_eq!(code(&e), ttrpc::Code::DEADLINE_EXCEEDED, "{}", message(&e));
    }
    let cx1 = task(&client, "cx1");
    match cx1.delete().await {
        Ok(d) => assert_eq!(d.exit_status, 137),
        Err(e) => assert_eq!(code(&e), ttrpc::Code::NOT_FOUND, "{}", message(&e)),
    }
    cx1.shutdown().await.unwrap();
    let gone = wait_until(Duration::from_secs(10), || !alive(daemon));
    assert!(gone, "daemon {daemon} still running after Delete and Shutdown");
    assert_clean(env, &ns);
}

/// A runtime that hangs in `create` (a wrapper around runc, as the configured binary): Create
/// fails with DEADLINE_EXCEEDED after the configured 15 s, the wrapper and its children are
/// killed, and the daemon serves another container of the pod meanwhile. (15 s, not less: the
/// other container's Create and Start must fit inside the hang in the node guest under TCG on
/// a busy host, where 2 s did not.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hung_runtime_create_times_out_while_the_daemon_serves_others() {
    use std::os::unix::fs::PermissionsExt;
    let env = env();
    let ns = env.namespace("hung-rt");
    let wrapper = ns.dir.join("hanging-runc");
    let script = "#!/bin/sh\nfor a in \"$@\"; do\n  if [ \"$a\" = create ]; then sleep 31337 & wait; fi\ndone\nexec runc \"$@\"\n";
    std::fs::write(&wrapper, script).unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    let hang_config = ns.dir.join("hang.toml");
    std::fs::write(
        &hang_config,
        format!(
            "[runtime]\nbinary = {:?}\nroot = {:?}\n[runtime.timeouts]\ncreate = 15\n",
            wrapper, ns.runtime_root
        ),
    )
    .unwrap();
    let check = std::process::Command::new(crate::common::SHIM)
        .arg("check-config")
        .arg(&hang_config)
        .output()
        .unwrap();
    assert!(check.status.success(), "{}", text(&check));

    let hung = crio_bundle(&ns, "hang1", "hang1", &["sleep", "1000"], |_| {});
    let ok = crio_bundle(&ns, "ok1", "hang1", &["sleep", "1000"], |_| {});
    let o = crio_start(&ns, &hung.dir, "hang1", b"");
    assert!(o.status.success(), "{}", text(&o));
    let address = String::from_utf8(o.stdout).unwrap();
    let daemon = daemon_pid(&hung.dir);
    let o = crio_start(&ns, &ok.dir, "ok1", b"");
    assert_eq!(String::from_utf8(o.stdout).unwrap(), address);
    let _hung_out = open_fifo_reader(&hung.stdout);
    let _ok_out = open_fifo_reader(&ok.stdout);

    let client = task_client(&address).await;
    let mut req = crio_create_req(&hung);
    req.options = protobuf::MessageField::some(runtimeoptions_any(&hang_config));
    let started = Instant::now();
    let pending = tokio::spawn(async move { client.create(ctx(), &req).await });

    // The daemon answers and creates other containers while the hung call is pending.
    let other = task_client(&address).await;
    let _ = wait_until(Duration::from_secs(10), || !processes_with("sleep 31337").is_empty());
    other.create(ctx(), &crio_create_req(&ok)).await.unwrap();
    let (ok1, hang1) = (task(&other, "ok1"), task(&other, "hang1"));
    ok1.start().await.unwrap();
    assert_eq!(ok1.connect().await.unwrap().shim_pid as i32, daemon);
    let e = hang1.state().await.unwrap_err();
    assert_eq!(code(&e), ttrpc::Code::NOT_FOUND, "{}", message(&e));
    assert!(!pending.is_finished(), "the hung create returned early");
    assert!(!processes_with("sleep 31337").is_empty(), "the wrapper never hung");

    let e = tokio::time::timeout(Duration::from_secs(120), pending)
        .await
        .expect("the hung create never returned")
        .unwrap()
        .unwrap_err();
    let took = started.elapsed();
    assert_eq!(code(&e), ttrpc::Code::DEADLINE_EXCEEDED, "{}", message(&e));
    assert!(message(&e).contains("create"), "{}", message(&e));
    // The configured 15 s limit fired, not the default: its message names it, and the call
    // took at least that long (a lower bound holds on a busy machine).
    assert!(message(&e).contains("within 15s"), "{}", message(&e));
    assert!(took >= Duration::from_secs(15), "{took:?}");
    let mut left = Vec::new();
    let clean = wait_until(Duration::from_secs(30), || {
        left = processes_with("sleep 31337");
        left.extend(processes_with(wrapper.to_str().unwrap()));
        left.is_empty()
    });
    assert!(clean, "left running:\n{}", left.join("\n"));

    // CRI-O's answer to the failed Create, then the other container's teardown.
    let e = hang1.delete().await.unwrap_err();
    assert_eq!(code(&e), ttrpc::Code::NOT_FOUND, "{}", message(&e));
    hang1.shutdown().await.unwrap();
    crio_kill_and_remove(&other, "ok1").await;
    let gone = wait_until(Duration::from_secs(10), || !alive(daemon));
    assert!(gone, "daemon {daemon} still running");
    assert_clean(env, &ns);
}

/// SIGTERM to a daemon ends it as the runc shim ends: socket removed, containers left running
/// (containerd's `delete` cleans them up later), instead of the daemon dying on the signal.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sigterm_shuts_the_daemon_down_and_leaves_containers_running() {
    let env = env();
    let ns = env.namespace("sigterm");
    let b = crio_bundle(&ns, "st1", "st1", &["sleep", "1000"], |_| {});
    let o = crio_start(&ns, &b.dir, "st1", b"");
    assert!(o.status.success(), "{}", text(&o));
    let address = String::from_utf8(o.stdout).unwrap();
    let socket = std::path::PathBuf::from(address.trim_start_matches("unix://"));
    let daemon = daemon_pid(&b.dir);
    let client = task_client(&address).await;
    let _out = open_fifo_reader(&b.stdout);
    let init = client.create(ctx(), &crio_create_req(&b)).await.unwrap().pid as i32;
    task(&client, "st1").start().await.unwrap();
    // One thread per daemon once idle: the blocking-pool thread Create used ends (after 0.5 s
    // without work; 30 s is for a busy machine), and nothing left another helper behind.
    let status = || std::fs::read_to_string(format!("/proc/{daemon}/status")).unwrap_or_default();
    let one = wait_until(Duration::from_secs(30), || status().lines().any(|l| l == "Threads:\t1"));
    assert!(one, "{}", status());

    nix::sys::signal::kill(nix::unistd::Pid::from_raw(daemon), nix::sys::signal::SIGTERM).unwrap();
    let gone = wait_until(Duration::from_secs(10), || !alive(daemon));
    assert!(gone, "daemon {daemon} still running after SIGTERM");
    assert!(!socket.exists(), "the socket {} is left", socket.display());
    assert!(alive(init), "the container died with the daemon");

    // containerd's cleanup of a dead shim: `delete` kills and deletes the container.
    let o = std::process::Command::new(crate::common::SHIM)
        .args(["-namespace", "default", "-id", "st1", "-bundle"])
        .arg(&b.dir)
        .arg("delete")
        .env("GANTRY_CONFIG", &ns.config)
        .output()
        .unwrap();
    assert!(o.status.success(), "{}", text(&o));
    assert!(wait_until(Duration::from_secs(10), || !alive(init)));
    assert_clean(env, &ns);
}

/// Replies in flight when a Shutdown empties the daemon still reach the engine: requests sent
/// together with the Shutdown on one connection (as containerd's CRI may send a Connect or
/// State while it shuts a pod's shim down) all get their answers before the daemon exits, in
/// every one of many rounds.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replies_in_flight_when_shutdown_ends_the_daemon_still_arrive() {
    const ROUNDS: usize = 30;
    const ALONGSIDE: usize = 8;
    let env = env();
    let ns = env.namespace("shutdown-race");
    let mut lost = Vec::new();
    for round in 0..ROUNDS {
        let id = format!("sr{round}");
        let b = crio_bundle(&ns, &id, &id, &["true"], |_| {});
        let o = crio_start(&ns, &b.dir, &id, b"");
        assert!(o.status.success(), "{}", text(&o));
        let daemon = daemon_pid(&b.dir);
        // A client the test can close, as containerd closes its shim client after Shutdown.
        let address = String::from_utf8(o.stdout).unwrap();
        let sock = std::os::unix::net::UnixStream::connect(address.trim_start_matches("unix://")).unwrap();
        let closer = sock.try_clone().unwrap();
        // SAFETY: the descriptor is a connected unix socket handed over to the client.
        let raw =
            unsafe { ttrpc::asynchronous::Client::from_raw_unix_socket_fd(std::os::fd::IntoRawFd::into_raw_fd(sock)) };
        let client = containerd_shim_protos::shim_async::TaskClient::new(raw);
        let connect = ConnectRequest {
            id: id.clone(),
            ..Default::default()
        };
        let shutdown = ShutdownRequest {
            id: id.clone(),
            ..Default::default()
        };
        let connects: Vec<_> = (0..ALONGSIDE)
            .map(|_| {
                let (client, connect) = (client.clone(), connect.clone());
                tokio::spawn(async move { client.connect(ctx(), &connect).await })
            })
            .collect();
        if let Err(e) = client.shutdown(ctx(), &shutdown).await {
            lost.push(format!("round {round}: Shutdown: {e:?}"));
        }
        for (i, c) in connects.into_iter().enumerate() {
            if let Err(e) = c.await.unwrap() {
                lost.push(format!("round {round}: Connect {i}: {e:?}"));
            }
        }
        closer.shutdown(std::net::Shutdown::Both).unwrap();
        drop(client);
        // This machine's init reaps orphans late: a zombie has exited.
        let gone = wait_until(Duration::from_secs(10), || !gantry::proc::is_running(daemon));
        assert!(gone, "daemon {daemon} still running after Shutdown");
    }
    assert!(
        lost.is_empty(),
        "replies lost to the daemon's exit:\n{}",
        lost.join("\n")
    );
    assert_clean(env, &ns);
}
