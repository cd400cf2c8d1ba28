//! Test harness: a private containerd (own root, state, sockets under one temp dir), a
//! busybox image built from Debian's busybox-static, and helpers to start gantry the way
//! CRI-O does and talk ttrpc to it.

#![allow(dead_code)]

pub mod cri;
pub mod cri_api;
pub mod cri_stream;
pub mod task;

use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

pub const SHIM: &str = env!("CARGO_BIN_EXE_containerd-shim-gantry-v2");
pub const RUNTIME: &str = "io.containerd.gantry.v2";
pub const IMAGE: &str = "docker.io/gantry/busybox:latest";

pub struct Env {
    /// Everything of this test run lives below here.
    pub dir: PathBuf,
    pub ctr_sock: PathBuf,
    /// The gantry config containerd's shims use (via GANTRY_CONFIG).
    pub config: PathBuf,
    pub socket_dir: PathBuf,
    pub runtime_root: PathBuf,
    pub state_dir: PathBuf,
    pub image_tar: PathBuf,
    pub rootfs: PathBuf,
    imported: Mutex<HashSet<String>>,
    /// Bound where containerd's `NOTIFY_SOCKET` points, as systemd's is on a node.
    pub notify_socket: std::os::unix::net::UnixDatagram,
}

/// The variables systemd gives a service besides `NOTIFY_SOCKET` (pids that are not
/// containerd's, so containerd itself ignores the socket-activation and watchdog ones).
pub const SERVICE_MANAGER_ENV: [(&str, &str); 6] = [
    ("LISTEN_FDS", "1"),
    ("LISTEN_PID", "1"),
    ("WATCHDOG_USEC", "30000000"),
    ("WATCHDOG_PID", "1"),
    ("INVOCATION_ID", "0123456789abcdef0123456789abcdef"),
    ("JOURNAL_STREAM", "8:12345"),
];

static ENV: OnceLock<Env> = OnceLock::new();

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Runs a command, panicking with its output when it cannot be started.
pub fn run(cmd: &mut Command) -> Output {
    cmd.output().unwrap_or_else(|e| panic!("run {cmd:?}: {e}"))
}

/// Runs `cmd` with `stdin` written to its standard input, and collects its output.
pub fn run_with_stdin(cmd: &mut Command, stdin: &[u8]) -> Output {
    use std::io::Write;
    let mut child = cmd
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap_or_else(|e| panic!("run {cmd:?}: {e}"));
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

pub fn text(o: &Output) -> String {
    format!(
        "status={:?}\nstdout={}\nstderr={}",
        o.status.code(),
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// Polls `f` until it returns true or `timeout` passes.
/// The pid of the daemon serving a bundle (`start` writes it to `shim.pid`).
pub fn daemon_pid(bundle: &Path) -> i32 {
    std::fs::read_to_string(bundle.join("shim.pid"))
        .unwrap()
        .parse()
        .unwrap()
}

pub fn wait_until(timeout: Duration, mut f: impl FnMut() -> bool) -> bool {
    let end = Instant::now() + timeout;
    while Instant::now() < end {
        if f() {
            return true;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    f()
}

/// The shared test environment; containerd starts on first use and dies with the test binary.
/// gantry's config for a harness under `dir`: its socket directory `dir/s`, its runtime root
/// `dir/rt` (the stale-run sweep deletes runc containers under `<run dir>/*/rt`), debug logs,
/// and `runtime_extra` lines in `[runtime]`. Returns those two paths and the file's.
pub fn gantry_config(dir: &Path, runtime_extra: &str) -> (PathBuf, PathBuf, PathBuf) {
    let (socket_dir, runtime_root, config) = (dir.join("s"), dir.join("rt"), dir.join("gantry.toml"));
    let text = format!(
        "[shim]\nsocket_dir = {socket_dir:?}\nlog_level = \"debug\"\n[runtime]\nroot = {runtime_root:?}\n{runtime_extra}"
    );
    std::fs::write(&config, text).unwrap();
    (socket_dir, runtime_root, config)
}

pub fn env() -> &'static Env {
    ENV.get_or_init(|| {
        clean_stale_runs();
        let dir = PathBuf::from(format!("/tmp/gantry-it-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let image_dir = dir.join("image");
        busybox_image(&image_dir, IMAGE, &[]);

        let (socket_dir, runtime_root, config) = gantry_config(&dir, "");
        let ctr_sock = dir.join("containerd.sock");
        let state_dir = dir.join("state");
        let cd_config = dir.join("containerd.toml");
        std::fs::write(
            &cd_config,
            format!(
                "version = 2\nroot = {:?}\nstate = {:?}\ndisabled_plugins = [\"io.containerd.grpc.v1.cri\"]\n\
                 [grpc]\n  address = {:?}\n[ttrpc]\n  address = {:?}\n",
                dir.join("root"),
                state_dir,
                ctr_sock,
                dir.join("containerd.sock.ttrpc"),
            ),
        )
        .unwrap();
        let shim_dir = Path::new(SHIM).parent().unwrap().to_path_buf();
        let path = format!("{}:{}", shim_dir.display(), std::env::var("PATH").unwrap_or_default());
        let log = std::fs::File::create(dir.join("containerd.log")).unwrap();
        let cd_config2 = cd_config.clone();
        let config2 = config.clone();
        let mut cmd = Command::new("containerd");
        cmd.arg("--config")
            .arg(&cd_config2)
            .env("PATH", &path)
            .env("GANTRY_CONFIG", &config2)
            .stdout(log.try_clone().unwrap())
            .stderr(log);
        // containerd as systemd runs it on a node (`Type=notify`): these reach every shim.
        let notify = dir.join("notify.sock");
        let notify_socket = std::os::unix::net::UnixDatagram::bind(&notify).unwrap();
        cmd.envs(SERVICE_MANAGER_ENV).env("NOTIFY_SOCKET", &notify);
        let _ = spawn_for_life(cmd);
        let env = Env {
            dir: dir.clone(),
            ctr_sock,
            config,
            socket_dir,
            runtime_root,
            state_dir,
            image_tar: image_dir.join("image.tar"),
            rootfs: image_dir.join("rootfs"),
            imported: Mutex::new(HashSet::new()),
            notify_socket,
        };
        let up = wait_until(Duration::from_secs(20), || {
            env.ctr("default", &["version"]).status.success()
        });
        assert!(
            up,
            "containerd did not start: {}",
            std::fs::read_to_string(dir.join("containerd.log")).unwrap_or_default()
        );
        env
    })
}

impl Env {
    pub fn ctr_cmd(&self, ns: &str) -> Command {
        let mut c = Command::new("ctr");
        c.arg("--address").arg(&self.ctr_sock).arg("-n").arg(ns);
        c.stdin(Stdio::null());
        c
    }

    pub fn ctr(&self, ns: &str, args: &[&str]) -> Output {
        run(self.ctr_cmd(ns).args(args))
    }

    /// A namespace holding the busybox image, with its own gantry config (socket dir and
    /// runtime root), so each test's leak checks see only its own containers.
    pub fn namespace(&self, ns: &str) -> Ns {
        self.namespace_with(ns, "")
    }

    /// Like [`Env::namespace`], with extra TOML appended to the namespace's gantry config.
    pub fn namespace_with(&self, ns: &str, extra_toml: &str) -> Ns {
        // Unique per run: cgroup paths (/<ns>/<id>) are global on the host.
        let ns = &format!("{ns}-{}", std::process::id());
        let dir = self.dir.join(ns);
        let n = Ns {
            name: ns.to_string(),
            config: dir.join("gantry.toml"),
            socket_dir: dir.join("s"),
            runtime_root: dir.join("rt"),
            dir,
        };
        std::fs::create_dir_all(&n.dir).unwrap();
        let (runtime_extra, rest) = match extra_toml.strip_prefix("[runtime]") {
            Some(r) => (r.to_string(), String::new()),
            None => (String::new(), extra_toml.to_string()),
        };
        std::fs::write(
            &n.config,
            format!(
                "[shim]\nsocket_dir = {:?}\nlog_level = \"debug\"\n[runtime]\nroot = {:?}\n{runtime_extra}\n{rest}\n",
                n.socket_dir, n.runtime_root
            ),
        )
        .unwrap();
        let mut done = self.imported.lock().unwrap();
        if !done.contains(ns) {
            let o = self.ctr(ns, &["images", "import", self.image_tar.to_str().unwrap()]);
            assert!(o.status.success(), "import: {}", text(&o));
            done.insert(ns.to_string());
        }
        n
    }

    /// `ctr run --rm` through gantry; returns the output.
    pub fn ctr_run(&self, ns: &Ns, id: &str, extra: &[&str], cmd: &[&str]) -> Output {
        self.ctr_run_as("--rm", ns, id, extra, cmd)
    }

    /// `ctr run -d` through gantry (the task keeps running).
    pub fn ctr_run_detached(&self, ns: &Ns, id: &str, extra: &[&str], cmd: &[&str]) -> Output {
        self.ctr_run_as("-d", ns, id, extra, cmd)
    }

    fn ctr_run_as(&self, mode: &str, ns: &Ns, id: &str, extra: &[&str], cmd: &[&str]) -> Output {
        let config = ns.config.to_str().unwrap();
        let mut args = vec!["run", mode, "--runtime", RUNTIME, "--runtime-config-path", config];
        args.extend_from_slice(extra);
        args.extend_from_slice(&[IMAGE, id]);
        args.extend_from_slice(cmd);
        self.ctr(&ns.name, &args)
    }

    /// The STATUS column of `ctr task ls` for `id` (empty when there is no such task).
    pub fn task_status(&self, ns: &str, id: &str) -> String {
        let o = self.ctr(ns, &["task", "ls"]);
        String::from_utf8_lossy(&o.stdout)
            .lines()
            .find(|l| l.split_whitespace().next() == Some(id))
            .and_then(|l| l.split_whitespace().nth(2).map(str::to_string))
            .unwrap_or_default()
    }

    /// Waits until the task reports `status`.
    pub fn wait_status(&self, ns: &str, id: &str, status: &str) {
        let ok = wait_until(Duration::from_secs(10), || self.task_status(ns, id) == status);
        assert!(
            ok,
            "task {id} never reached {status} (now {:?})",
            self.task_status(ns, id)
        );
    }

    /// SIGKILLs a task, waits until it stopped, then deletes task and container.
    pub fn kill_and_remove(&self, ns: &str, id: &str) {
        let o = self.ctr(ns, &["task", "kill", "-s", "SIGKILL", id]);
        assert!(o.status.success(), "{}", text(&o));
        self.wait_status(ns, id, "STOPPED");
        self.remove(ns, id);
    }

    /// Deletes a stopped task and its container.
    pub fn remove(&self, ns: &str, id: &str) {
        let o = self.ctr(ns, &["task", "delete", id]);
        assert!(o.status.success(), "{}", text(&o));
        let o = self.ctr(ns, &["container", "delete", id]);
        assert!(o.status.success(), "{}", text(&o));
    }

    /// The bundle containerd made for a task.
    pub fn bundle(&self, ns: &str, id: &str) -> PathBuf {
        self.state_dir.join("io.containerd.runtime.v2.task").join(ns).join(id)
    }

    /// Everything a namespace's containers could leave behind, as readable lines; empty when clean.
    pub fn leftovers(&self, ns: &Ns) -> Vec<String> {
        let mut left = Vec::new();
        let tasks = self.state_dir.join("io.containerd.runtime.v2.task").join(&ns.name);
        for e in std::fs::read_dir(&tasks).into_iter().flatten().flatten() {
            left.push(format!("bundle {}", e.path().display()));
        }
        for e in std::fs::read_dir(&ns.socket_dir).into_iter().flatten().flatten() {
            left.push(format!("socket {}", e.path().display()));
        }
        let ns_dir = &ns.dir;
        let ns = ns.name.as_str();
        for e in std::fs::read_dir(ns_dir.join("bundles"))
            .into_iter()
            .flatten()
            .flatten()
        {
            for f in std::fs::read_dir(e.path()).into_iter().flatten().flatten() {
                let name = f.file_name().to_string_lossy().into_owned();
                if !KEEP_IN_BUNDLE.contains(&name.as_str()) {
                    left.push(format!("bundle file {}", f.path().display()));
                }
            }
        }
        let runtime_ns = self.dir.join(ns).join("rt").join(ns);
        for e in std::fs::read_dir(&runtime_ns).into_iter().flatten().flatten() {
            left.push(format!("runtime state {}", e.path().display()));
        }
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        for l in mounts.lines() {
            if let Some(mp) = l.split(' ').nth(4) {
                if mp.contains(&format!("/{ns}/")) && mp.starts_with(self.dir.to_str().unwrap()) {
                    left.push(format!("mount {mp}"));
                }
            }
        }
        for ctl in ["memory", "pids", "cpu", "devices", "freezer"] {
            let d = Path::new("/sys/fs/cgroup").join(ctl).join(ns);
            for e in std::fs::read_dir(&d).into_iter().flatten().flatten() {
                if e.path().is_dir() {
                    left.push(format!("cgroup {}", e.path().display()));
                }
            }
        }
        left.extend(self.shim_processes(ns).into_iter().map(|p| format!("shim process {p}")));
        left
    }

    /// Pids of gantry daemons serving `ns`.
    pub fn shim_processes(&self, ns: &str) -> Vec<i32> {
        processes()
            .into_iter()
            .filter(|(_, args)| {
                let is_shim = args.first().is_some_and(|a| a.ends_with("containerd-shim-gantry-v2"));
                let in_ns = args.windows(2).any(|w| w[0] == "-namespace" && w[1] == ns);
                let serving = !args.iter().any(|a| a == "start" || a == "delete");
                is_shim && in_ns && serving
            })
            .map(|(pid, _)| pid)
            .collect()
    }
}

/// Removes what an aborted earlier run left: its containers (through runc), daemons, mounts.
fn clean_stale_runs() {
    let Ok(entries) = std::fs::read_dir("/tmp") else {
        return;
    };
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(pid) = name.strip_prefix("gantry-it-").and_then(|p| p.parse::<i32>().ok()) else {
            continue;
        };
        if Path::new(&format!("/proc/{pid}")).exists() {
            continue;
        }
        let dir = e.path();
        for p in shim_pids_under(&dir) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(p), nix::sys::signal::Signal::SIGKILL);
        }
        for ns in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            for root in std::fs::read_dir(ns.path().join("rt")).into_iter().flatten().flatten() {
                let list = run(Command::new("runc").arg("--root").arg(root.path()).args(["list", "-q"]));
                for id in String::from_utf8_lossy(&list.stdout).lines() {
                    let _ = run(Command::new("runc")
                        .arg("--root")
                        .arg(root.path())
                        .args(["delete", "--force", id]));
                }
            }
        }
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
        let mut points: Vec<&str> = mounts
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .filter(|m| m.starts_with(dir.to_str().unwrap_or("-")))
            .collect();
        points.sort_by_key(|p| std::cmp::Reverse(p.len()));
        for m in points {
            let _ = nix::mount::umount2(m, nix::mount::MntFlags::MNT_DETACH);
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
}

fn shim_pids_under(dir: &Path) -> Vec<i32> {
    let needle = dir.to_string_lossy().into_owned();
    processes()
        .into_iter()
        .filter(|(_, args)| {
            args.iter().any(|a| a.contains("containerd-shim-gantry-v2")) && args.iter().any(|a| a.contains(&needle))
        })
        .map(|(pid, _)| pid)
        .collect()
}

/// Every pid in /proc.
pub fn pids() -> impl Iterator<Item = i32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_string_lossy().parse().ok())
}

/// Every process with its argv (kernel threads and zombies, which have none, left out).
pub fn processes() -> Vec<(i32, Vec<String>)> {
    pids()
        .filter_map(|pid| {
            let cmd = std::fs::read(format!("/proc/{pid}/cmdline")).ok()?;
            let args = cmd.strip_suffix(&[0]).unwrap_or(&cmd);
            (!args.is_empty()).then(|| {
                let argv = args.split(|b| *b == 0).map(|s| String::from_utf8_lossy(s).into_owned());
                (pid, argv.collect())
            })
        })
        .collect()
}

/// Files a CRI-O-style test bundle holds before gantry touches it (and that may stay).
pub const KEEP_IN_BUNDLE: &[&str] = &["config.json", "address", "shim.pid", "stdout", "stderr", "stdin", "log"];

/// A test namespace and its private gantry config.
pub struct Ns {
    pub name: String,
    pub dir: PathBuf,
    pub config: PathBuf,
    pub socket_dir: PathBuf,
    pub runtime_root: PathBuf,
}

/// Waits until the namespace has nothing left, returning what is still there on timeout.
pub fn assert_clean(env: &Env, ns: &Ns) {
    let mut left = Vec::new();
    let clean = wait_until(Duration::from_secs(10), || {
        left = env.leftovers(ns);
        left.is_empty()
    });
    assert!(clean, "left behind in {}:\n{}", ns.name, left.join("\n"));
    // The per-namespace parent cgroups (`/<ns>` of cgroupsPath `/<ns>/<id>`) are the runtime's,
    // created on first use and never removed by it; they are unique per test run, so tidy them.
    for e in std::fs::read_dir("/sys/fs/cgroup").into_iter().flatten().flatten() {
        let _ = std::fs::remove_dir(e.path().join(&ns.name));
    }
}

/// A bundle laid out the way CRI-O lays it out: `config.json` with CRI-O annotations and an
/// absolute, already present `root.path`, plus a stdout FIFO.
pub struct CrioBundle {
    pub id: String,
    pub dir: PathBuf,
    pub stdout: PathBuf,
}

pub fn crio_bundle(
    ns: &Ns,
    id: &str,
    sandbox: &str,
    args: &[&str],
    patch: impl FnOnce(&mut serde_json::Value),
) -> CrioBundle {
    let env = env();
    let dir = ns.dir.join("bundles").join(id);
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    let o = run(Command::new("runc").args(["spec", "--bundle"]).arg(&dir));
    assert!(o.status.success(), "runc spec: {}", text(&o));
    let path = dir.join("config.json");
    let mut spec: serde_json::Value = serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
    spec["process"]["terminal"] = false.into();
    spec["process"]["args"] = args.iter().map(|a| serde_json::Value::from(*a)).collect();
    spec["root"]["path"] = env.rootfs.to_str().unwrap().into();
    spec["root"]["readonly"] = true.into();
    spec["linux"]["cgroupsPath"] = format!("/{}/{}", ns.name, id).into();
    let kind = if id == sandbox { "sandbox" } else { "container" };
    spec["annotations"] = serde_json::json!({
        "io.kubernetes.cri-o.SandboxID": sandbox,
        "io.kubernetes.cri-o.ContainerType": kind,
    });
    patch(&mut spec);
    std::fs::write(&path, serde_json::to_vec_pretty(&spec).unwrap()).unwrap();
    let stdout = dir.join("stdout");
    nix::unistd::mkfifo(&stdout, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    CrioBundle {
        id: id.to_string(),
        dir,
        stdout,
    }
}

/// Runs `start` exactly as CRI-O does: `-address ""`, empty TTRPC_ADDRESS, empty stdin,
/// cwd = the bundle. Returns the command output (stdout should be the address).
pub fn crio_start(ns: &Ns, bundle: &Path, id: &str, stdin: &[u8]) -> Output {
    use std::io::Write;
    let mut child = crio_start_cmd(ns, bundle, id)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let mut input = child.stdin.take().unwrap();
    input.write_all(stdin).unwrap();
    drop(input);
    child.wait_with_output().unwrap()
}

/// The command [`crio_start`] runs, for tests that change how it is started.
pub fn crio_start_cmd(ns: &Ns, bundle: &Path, id: &str) -> Command {
    crio_start_cmd_with(Path::new(SHIM), ns, bundle, id)
}

/// [`crio_start_cmd`] of another gantry binary (an installed one).
pub fn crio_start_cmd_with(shim: &Path, ns: &Ns, bundle: &Path, id: &str) -> Command {
    let mut cmd = Command::new(shim);
    cmd.args([
        "-namespace",
        "default",
        "-address",
        "",
        "-publish-binary",
        "/usr/bin/crio",
        "-id",
        id,
        "start",
    ])
    .current_dir(bundle)
    .env("TTRPC_ADDRESS", "")
    .env("GRPC_ADDRESS", "")
    .env("NAMESPACE", "default")
    .env("MAX_SHIM_VERSION", "2")
    .env("GANTRY_CONFIG", &ns.config);
    cmd
}

/// Pids of gantry daemons whose working directory is `bundle` (CRI-O-style daemons all serve
/// namespace "default", so the bundle is what tells them apart).
pub fn daemons_in(bundle: &Path) -> Vec<i32> {
    let want = bundle.canonicalize().unwrap_or_else(|_| bundle.to_path_buf());
    pids()
        .filter(|pid| {
            let link = |name: &str| std::fs::read_link(format!("/proc/{pid}/{name}")).ok();
            let shim = link("exe").is_some_and(|exe| exe.to_string_lossy().contains("containerd-shim-gantry-v2"));
            shim && link("cwd").as_ref() == Some(&want)
        })
        .collect()
}

/// Builds a busybox image named `name` into `dir` with scripts/busybox-image.sh (`entrypoint`
/// as its command when given).
pub fn busybox_image(dir: &Path, name: &str, entrypoint: &[&str]) {
    let o = run(Command::new("bash")
        .arg(repo().join("scripts/busybox-image.sh"))
        .arg(dir)
        .arg(name)
        .args(entrypoint));
    assert!(o.status.success(), "image {name}: {}", text(&o));
}

/// A ttrpc Task client on a daemon's address.
pub async fn task_client(address: &str) -> containerd_shim_protos::shim_async::TaskClient {
    let c = ttrpc::asynchronous::Client::connect(address).await.unwrap();
    containerd_shim_protos::shim_async::TaskClient::new(c)
}

pub fn ctx() -> ttrpc::context::Context {
    ttrpc::context::with_timeout(Duration::from_secs(60).as_nanos() as i64)
}

/// The ttrpc code of a failed call.
pub fn code(e: &ttrpc::Error) -> ttrpc::Code {
    match e {
        ttrpc::Error::RpcStatus(s) => s.code(),
        other => panic!("not an RPC status: {other:?}"),
    }
}

pub fn message(e: &ttrpc::Error) -> String {
    match e {
        ttrpc::Error::RpcStatus(s) => s.message().to_string(),
        other => format!("{other:?}"),
    }
}

/// Opens a FIFO's read side without blocking (as CRI-O does before Create).
pub fn open_fifo_reader(path: &Path) -> std::fs::File {
    use std::os::unix::fs::OpenOptionsExt;
    std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(path)
        .unwrap()
}

/// Reads what is available on a non-blocking FIFO until EOF or `timeout`.
pub fn read_fifo(f: &mut std::fs::File, timeout: Duration) -> String {
    use std::io::Read;
    let mut out = Vec::new();
    let end = Instant::now() + timeout;
    let mut buf = [0u8; 4096];
    while Instant::now() < end {
        match f.read(&mut buf) {
            Ok(0) if !out.is_empty() => break,
            Ok(0) => std::thread::sleep(Duration::from_millis(20)),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => std::thread::sleep(Duration::from_millis(20)),
            Err(_) => break,
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// `runtimeoptions.v1.Options{config_path}` as CRI-O's `runtime_config_path` sends it.
pub fn runtimeoptions_any(config_path: &Path) -> protobuf::well_known_types::any::Any {
    let p = config_path.to_str().unwrap().as_bytes();
    assert!(p.len() < 128);
    let mut value = vec![0x12, p.len() as u8];
    value.extend_from_slice(p);
    let mut any = protobuf::well_known_types::any::Any::new();
    any.type_url = "runtimeoptions.v1.Options".into();
    any.value = value;
    any
}

/// The Create request CRI-O sends for a bundle made by [`crio_bundle`].
pub fn crio_create_req(b: &CrioBundle) -> containerd_shim_protos::api::CreateTaskRequest {
    containerd_shim_protos::api::CreateTaskRequest {
        id: b.id.clone(),
        bundle: b.dir.to_str().unwrap().into(),
        stdout: b.stdout.to_str().unwrap().into(),
        ..Default::default()
    }
}

/// SIGKILL, Wait, Delete and Shutdown of one container, as CRI-O tears it down.
pub async fn crio_kill_and_remove(client: &containerd_shim_protos::shim_async::TaskClient, id: &str) {
    let t = task::task(client, id);
    t.kill(9).await.unwrap();
    t.wait().await.unwrap();
    crio_remove(client, id).await;
}

/// Shutdown as CRI-O sends it after a container's Delete.
pub async fn shutdown(client: &containerd_shim_protos::shim_async::TaskClient, id: &str) {
    task::task(client, id).shutdown().await.unwrap();
}

/// Delete and Shutdown of one exited container, as CRI-O removes it; Delete's answer.
pub async fn crio_remove(
    client: &containerd_shim_protos::shim_async::TaskClient,
    id: &str,
) -> containerd_shim_protos::api::DeleteResponse {
    let t = task::task(client, id);
    let deleted = t.delete().await.unwrap();
    t.shutdown().await.unwrap();
    deleted
}

/// Starts a service (containerd) that lives exactly as long as this test binary: it is spawned
/// from a thread that never ends, with PDEATHSIG, so it dies however the binary ends.
pub fn spawn_for_life(mut cmd: Command) -> u32 {
    let (tx, rx) = std::sync::mpsc::channel();
    #[allow(clippy::zombie_processes)]
    std::thread::spawn(move || {
        use std::os::unix::process::CommandExt;
        // SAFETY: prctl is async-signal-safe.
        unsafe {
            cmd.pre_exec(|| {
                libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL);
                Ok(())
            });
        }
        let child = cmd.spawn();
        let ok = child.is_ok();
        tx.send(child.map(|c| c.id()).map_err(|e| e.to_string())).unwrap();
        if !ok {
            return;
        }
        loop {
            std::thread::park();
        }
    });
    rx.recv()
        .unwrap()
        .unwrap_or_else(|e| panic!("start containerd: {e} (apt-get install containerd)"))
}
