//! Fault injection: the daemon or the OCI runtime killed at the worst moment, a stdio FIFO
//! removed under a running container, 20 pods at once, init exiting while an exec runs. Each
//! leaves the node clean and every container's state correct.

use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use containerd_shim_protos::api::Status;

use crate::common::task::{process_any, task};
use crate::common::{
    assert_clean, crio_bundle, crio_create_req, crio_kill_and_remove, crio_remove, crio_start, ctx, daemons_in, env,
    open_fifo_reader, read_fifo, run, task_client, text, wait_until, Ns, SHIM,
};

/// An OCI runtime wrapper that, on `create`, records its pid in `marker` and waits for `gate`
/// to exist before running runc.
fn gated_runtime(dir: &Path) -> (PathBuf, PathBuf, PathBuf) {
    let (marker, gate, wrapper) = (dir.join("create-pid"), dir.join("gate"), dir.join("gated-runc"));
    let script = format!(
        "#!/bin/sh\nfor a in \"$@\"; do\n  if [ \"$a\" = create ]; then\n    echo $$ > {m}\n    \
         while [ ! -e {g} ]; do sleep 0.05; done\n  fi\ndone\nexec runc \"$@\"\n",
        m = marker.display(),
        g = gate.display()
    );
    std::fs::write(&wrapper, script).unwrap();
    std::fs::set_permissions(&wrapper, std::fs::Permissions::from_mode(0o755)).unwrap();
    (wrapper, marker, gate)
}

fn gated_ns(name: &str) -> (Ns, PathBuf, PathBuf) {
    let env = env();
    let probe = env.namespace(name);
    let (wrapper, marker, gate) = gated_runtime(&probe.dir);
    let ns = env.namespace_with(name, &format!("[runtime]\nbinary = {:?}\n", wrapper));
    (ns, marker, gate)
}

fn read_pid(path: &Path) -> i32 {
    assert!(
        wait_until(Duration::from_secs(10), || path.exists()),
        "{path:?} never appeared"
    );
    let mut pid = String::new();
    assert!(wait_until(Duration::from_secs(30), || {
        pid = std::fs::read_to_string(path).unwrap_or_default();
        pid.ends_with('\n')
    }));
    pid.trim().parse().unwrap()
}

fn sigkill(pid: i32) {
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
}

/// The daemon SIGKILLed while Create runs: the client gets an error, and the `delete` action
/// (what CRI-O and containerd run for a shim they lost) leaves nothing, even though the
/// runtime finished creating after the daemon died.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn daemon_killed_during_create_then_delete_cleans_up() {
    let env = env();
    let (ns, marker, gate) = gated_ns("fault-daemon");
    let b = crio_bundle(&ns, "fd1", "fd1", &["sleep", "60"], |_| {});
    let o = crio_start(&ns, &b.dir, "fd1", b"");
    assert!(o.status.success(), "{}", text(&o));
    let client = task_client(&String::from_utf8(o.stdout).unwrap()).await;
    let _out = open_fifo_reader(&b.stdout);
    let req = crio_create_req(&b);
    let create = tokio::spawn(async move { client.create(ctx(), &req).await });
    let runtime = read_pid(&marker);
    let daemon: i32 = std::fs::read_to_string(b.dir.join("shim.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    sigkill(daemon);
    assert!(create.await.unwrap().is_err(), "Create answered from a killed daemon");
    // The runtime outlives the daemon and finishes its create.
    std::fs::write(&gate, "").unwrap();
    assert!(wait_until(Duration::from_secs(10), || !Path::new(&format!(
        "/proc/{runtime}"
    ))
    .exists()
        || std::fs::read_to_string(format!("/proc/{runtime}/stat"))
            .is_ok_and(|s| s.contains(") Z"))));
    let o = run(Command::new(SHIM)
        .args(["-namespace", "default", "-id", "fd1", "-bundle"])
        .arg(&b.dir)
        .arg("delete")
        .env("GANTRY_CONFIG", &ns.config));
    assert!(o.status.success(), "{}", text(&o));
    assert!(daemons_in(&b.dir).is_empty());
    std::fs::remove_file(&gate).unwrap();
    std::fs::remove_file(&marker).unwrap();
    assert_clean(env, &ns);
}

/// The OCI runtime SIGKILLed in the middle of `create`: Create fails naming the runtime, and
/// nothing of the container is left; the daemon keeps serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn runtime_killed_mid_create_fails_cleanly() {
    let env = env();
    let (ns, marker, gate) = gated_ns("fault-runtime");
    let b = crio_bundle(&ns, "fr1", "fr1", &["sleep", "60"], |_| {});
    let o = crio_start(&ns, &b.dir, "fr1", b"");
    assert!(o.status.success(), "{}", text(&o));
    let address = String::from_utf8(o.stdout).unwrap();
    let client = task_client(&address).await;
    let _out = open_fifo_reader(&b.stdout);
    let req = crio_create_req(&b);
    let create = tokio::spawn(async move { client.create(ctx(), &req).await });
    sigkill(read_pid(&marker));
    let e = create.await.unwrap().unwrap_err();
    assert!(format!("{e:?}").contains("gated-runc"), "{e:?}");
    // The daemon still serves: the same id can be created once the runtime behaves.
    std::fs::write(&gate, "").unwrap();
    let client = task_client(&address).await;
    client.create(ctx(), &crio_create_req(&b)).await.unwrap();
    crio_kill_and_remove(&client, "fr1").await;
    std::fs::remove_file(&gate).unwrap();
    std::fs::remove_file(&marker).unwrap();
    assert_clean(env, &ns);
}

/// The stdout FIFO removed (and its reader gone) under a running container: the container keeps
/// running, and Kill, Wait and Delete still work.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdout_fifo_removed_under_a_running_container() {
    let env = env();
    let ns = env.namespace("fault-fifo");
    let b = crio_bundle(
        &ns,
        "ff1",
        "ff1",
        &["sh", "-c", "while true; do echo tick; sleep 0.1; done"],
        |_| {},
    );
    let o = crio_start(&ns, &b.dir, "ff1", b"");
    assert!(o.status.success(), "{}", text(&o));
    let client = task_client(&String::from_utf8(o.stdout).unwrap()).await;
    let mut out = open_fifo_reader(&b.stdout);
    client.create(ctx(), &crio_create_req(&b)).await.unwrap();
    task(&client, "ff1").start().await.unwrap();
    assert!(read_fifo(&mut out, Duration::from_secs(5)).contains("tick"));
    drop(out);
    std::fs::remove_file(&b.stdout).unwrap();
    // An observation window: the writer keeps writing into a FIFO nobody reads for a while.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let st = task(&client, "ff1").state().await.unwrap();
    assert_eq!(
        st.status.enum_value_or_default(),
        Status::RUNNING,
        "the container died with its reader"
    );
    crio_kill_and_remove(&client, "ff1").await;
    assert_clean(env, &ns);
}

/// Twenty CRI-O-style pods created, started and killed at once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn twenty_pods_at_once() {
    let env = env();
    let ns = env.namespace("fault-twenty");
    let mut pods = Vec::new();
    for i in 0..20 {
        let id = format!("tw{i}");
        let b = crio_bundle(&ns, &id, &id, &["sleep", "60"], |_| {});
        let ns_config = ns.config.clone();
        let name = ns.name.clone();
        pods.push(tokio::spawn(async move {
            let ns = Ns {
                name,
                dir: PathBuf::new(),
                config: ns_config,
                socket_dir: PathBuf::new(),
                runtime_root: PathBuf::new(),
            };
            let (dir, id2) = (b.dir.clone(), id.clone());
            let o = tokio::task::spawn_blocking(move || crio_start(&ns, &dir, &id2, b""))
                .await
                .unwrap();
            assert!(o.status.success(), "{}", text(&o));
            let client = task_client(&String::from_utf8(o.stdout).unwrap()).await;
            let _out = open_fifo_reader(&b.stdout);
            client.create(ctx(), &crio_create_req(&b)).await.unwrap();
            task(&client, &id).start().await.unwrap();
            crio_kill_and_remove(&client, &id).await;
        }));
    }
    for p in pods {
        p.await.unwrap();
    }
    assert_clean(env, &ns);
}

/// Init exits while an exec still runs (a pod-shared pid namespace keeps the exec alive): the
/// exec is killed with the container, Wait returns for both, and everything is removed.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn init_exits_while_an_exec_runs() {
    let env = env();
    let ns = env.namespace("fault-initexit");
    let b = crio_bundle(&ns, "ie1", "ie1", &["sh", "-c", "sleep 1; exit 3"], |_| {});
    let o = crio_start(&ns, &b.dir, "ie1", b"");
    assert!(o.status.success(), "{}", text(&o));
    let client = task_client(&String::from_utf8(o.stdout).unwrap()).await;
    let _out = open_fifo_reader(&b.stdout);
    client.create(ctx(), &crio_create_req(&b)).await.unwrap();
    let ie1 = task(&client, "ie1");
    ie1.start().await.unwrap();
    let spec =
        serde_json::json!({"args": ["sleep", "60"], "cwd": "/", "user": {"uid": 0, "gid": 0}, "env": ["PATH=/bin"]});
    let long = ie1.exec("long");
    long.add(Some(process_any(spec))).await.unwrap();
    long.start().await.unwrap();
    let (init, exec) = tokio::join!(ie1.wait(), long.wait());
    assert_eq!(init.unwrap().exit_status, 3);
    assert_eq!(
        exec.unwrap().exit_status,
        137,
        "the exec dies with the container's pid namespace"
    );
    ie1.kill(9).await.unwrap();
    crio_remove(&client, "ie1").await;
    assert_clean(env, &ns);
}

/// A containerd of this test's own, which the test may stop and start again.
struct OwnContainerd {
    dir: PathBuf,
    sock: PathBuf,
    child: Option<std::process::Child>,
}

impl OwnContainerd {
    fn new(ns: &Ns) -> Self {
        let dir = ns.dir.join("own-containerd");
        std::fs::create_dir_all(&dir).unwrap();
        let sock = dir.join("c.sock");
        let config = format!(
            "version = 2\nroot = {:?}\nstate = {:?}\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\
             [grpc]\n  address = {:?}\n[ttrpc]\n  address = {:?}\n",
            dir.join("root"),
            dir.join("state"),
            sock,
            dir.join("c.sock.ttrpc"),
        );
        std::fs::write(dir.join("containerd.toml"), config).unwrap();
        let mut c = Self { dir, sock, child: None };
        c.start(ns);
        c
    }

    fn start(&mut self, ns: &Ns) {
        let shim_dir = Path::new(SHIM).parent().unwrap().to_path_buf();
        let path = format!("{}:{}", shim_dir.display(), std::env::var("PATH").unwrap_or_default());
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.dir.join("containerd.log"))
            .unwrap();
        let child = Command::new("containerd")
            .args(["--log-level", "debug", "--config"])
            .arg(self.dir.join("containerd.toml"))
            .env("PATH", path)
            .env("GANTRY_CONFIG", &ns.config)
            .stdout(log.try_clone().unwrap())
            .stderr(log)
            .spawn()
            .unwrap();
        self.child = Some(child);
        assert!(wait_until(Duration::from_secs(20), || self
            .ctr(ns, &["version"])
            .status
            .success()));
    }

    fn stop(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(c.id() as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
            let _ = c.wait();
        }
    }

    fn ctr(&self, ns: &Ns, args: &[&str]) -> std::process::Output {
        run(Command::new("ctr")
            .arg("--address")
            .arg(&self.sock)
            .args(["-n", &ns.name])
            .args(args))
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("containerd.log")).unwrap_or_default()
    }
}

impl Drop for OwnContainerd {
    fn drop(&mut self) {
        self.stop();
    }
}

/// containerd restarted while a container runs, which exits while containerd is down: the
/// task is still listed and controllable afterwards, and the shim's retried TaskExit reaches
/// the restarted containerd (its debug log shows the forwarded event).
#[test]
fn containerd_restart_while_containers_run() {
    let env = env();
    let ns = env.namespace("fault-restart");
    let mut cd = OwnContainerd::new(&ns);
    let o = cd.ctr(&ns, &["images", "import", env.image_tar.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let config = ns.config.to_str().unwrap();
    let o = cd.ctr(
        &ns,
        &[
            "run",
            "-d",
            "--runtime",
            "io.containerd.gantry.v2",
            "--runtime-config-path",
            config,
            crate::common::IMAGE,
            "rs1",
            "sleep",
            "1000",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let ls = cd.ctr(&ns, &["task", "ls"]);
    let pid: i32 = String::from_utf8_lossy(&ls.stdout)
        .lines()
        .find(|l| l.starts_with("rs1"))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|p| p.parse().ok())
        .unwrap_or_else(|| panic!("no pid: {}", text(&ls)));
    cd.stop();
    let before = cd.log().len();
    sigkill(pid);
    // The container ends while containerd is down (the daemon reaps it).
    let ended = wait_until(Duration::from_secs(10), || !gantry::proc::is_running(pid));
    assert!(ended, "the container outlived SIGKILL");
    cd.start(&ns);
    let forwarded = wait_until(Duration::from_secs(25), || {
        let log = cd.log();
        log[before..]
            .lines()
            .any(|l| l.contains("msg=\"event forwarded\"") && l.contains("topic=/tasks/exit"))
    });
    assert!(
        forwarded,
        "the TaskExit never reached the restarted containerd:\n{}",
        &cd.log()[before..]
    );
    let ls = cd.ctr(&ns, &["task", "ls"]);
    assert!(
        String::from_utf8_lossy(&ls.stdout)
            .lines()
            .any(|l| l.starts_with("rs1") && l.contains("STOPPED")),
        "{}",
        text(&ls)
    );
    let o = cd.ctr(&ns, &["task", "delete", "rs1"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = cd.ctr(&ns, &["container", "delete", "rs1"]);
    assert!(o.status.success(), "{}", text(&o));
    let bundles = cd.dir.join("state/io.containerd.runtime.v2.task").join(&ns.name);
    assert!(wait_until(Duration::from_secs(10), || std::fs::read_dir(&bundles)
        .map(|d| d.count() == 0)
        .unwrap_or(true)));
    assert!(wait_until(Duration::from_secs(10), || env
        .shim_processes(&ns.name)
        .is_empty()));
    drop(cd);
    assert_clean(env, &ns);
}

/// A real client deadline through containerd: `ctr --timeout` expires while the runtime is
/// still in `create` (gated), and the runtime only finishes after containerd's own cleanup has
/// given up too (its Delete timed out waiting on the Create, its Shutdown found the Create in
/// flight, it ran `delete`). gantry rolls the abandoned Create back and the daemon exits.
#[test]
fn ctr_timeout_during_create_leaves_nothing() {
    let env = env();
    let (ns, marker, gate) = gated_ns("fault-ctr-timeout");
    let config = ns.config.to_str().unwrap();
    let o = env.ctr(
        &ns.name,
        &[
            "--timeout",
            "3s",
            "run",
            "--runtime",
            crate::common::RUNTIME,
            "--runtime-config-path",
            config,
            crate::common::IMAGE,
            "ct1",
            "true",
        ],
    );
    assert!(!o.status.success(), "ctr ran past its deadline: {}", text(&o));
    assert!(text(&o).contains("deadline"), "{}", text(&o));
    let runtime = read_pid(&marker);
    // The engine gives up entirely first: its cleanup (Delete, which waits on the Create, then
    // Shutdown, then the `delete` action) times out and removes the bundle.
    let bundle = env.bundle(&ns.name, "ct1");
    assert!(
        wait_until(Duration::from_secs(20), || !bundle.join("config.json").exists()),
        "{bundle:?} stayed"
    );
    std::fs::write(&gate, "").unwrap();
    // The runtime finishes its create after the client has gone; gantry rolls it back.
    assert!(wait_until(Duration::from_secs(20), || !Path::new(&format!(
        "/proc/{runtime}"
    ))
    .exists()
        || std::fs::read_to_string(format!("/proc/{runtime}/stat"))
            .is_ok_and(|s| s.contains(") Z"))));
    let _ = env.ctr(&ns.name, &["task", "delete", "-f", "ct1"]);
    let o = env.ctr(&ns.name, &["container", "delete", "ct1"]);
    assert!(o.status.success(), "{}", text(&o));
    std::fs::remove_file(&gate).unwrap();
    std::fs::remove_file(&marker).unwrap();
    assert_clean(env, &ns);
}
