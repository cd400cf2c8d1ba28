//! The CRI side of the harness: a second private containerd with its CRI plugin on (the
//! first one, in `common/mod.rs`, runs without it for the `ctr` tests), a `gantry` runtime
//! handler next to the default `runc` one, a pause image and the busybox image in its
//! `k8s.io` namespace, and a CRI v1 gRPC client over its unix socket (as kubelet talks to it).
//!
//! Everything lives under `<env().dir>/cri` (root, state, sockets, gantry's config, socket dir
//! and runtime root, the CNI dirs, the pod log dirs), so an aborted run is cleaned up by the
//! stale-run sweep of `common::env()`; the runc shims of an aborted run are killed here.

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use hyper_util::rt::TokioIo;
use tonic::transport::{Channel, Endpoint, Uri};

use super::cri_api::{
    ContainerConfig, ContainerMetadata, ImageServiceClient, ImageSpec, ImageStatusRequest, LinuxContainerConfig,
    LinuxContainerSecurityContext, LinuxPodSandboxConfig, LinuxSandboxSecurityContext, NamespaceMode, NamespaceOption,
    PodSandboxConfig, PodSandboxMetadata, RemovePodSandboxRequest, RuntimeServiceClient, StopPodSandboxRequest,
    VersionRequest,
};
use super::{env, run, text, IMAGE, SHIM};

/// The CRI runtime handler (RuntimeClass `handler`) that selects gantry.
pub const HANDLER: &str = "gantry";
/// The sandbox ("pause") image the CRI plugin is configured with.
pub const PAUSE_IMAGE: &str = "docker.io/gantry/pause:latest";
/// The containerd namespace of the CRI plugin.
pub const CRI_NS: &str = "k8s.io";

pub type Client = RuntimeServiceClient;

pub struct Cri {
    /// `<env().dir>/cri`: everything of the CRI containerd.
    pub dir: PathBuf,
    /// containerd's gRPC socket (CRI and the containerd API).
    pub sock: PathBuf,
    pub state_dir: PathBuf,
    /// containerd's stdout/stderr, with the shims' log lines (the bundles' `log` FIFOs).
    pub log: PathBuf,
    /// gantry's config for the `gantry` handler (the handler's `ConfigPath`).
    pub config: PathBuf,
    pub socket_dir: PathBuf,
    pub runtime_root: PathBuf,
    /// The runc shim's `Root` for the default handler.
    pub runc_root: PathBuf,
    /// Parent of the pods' CRI log directories.
    pub pod_logs: PathBuf,
    /// CRI tests take turns: they check global state (all gantry daemons of `k8s.io`, the
    /// socket dir), and the machine has two cores.
    serial: tokio::sync::Mutex<()>,
    /// containerd's config and PATH, to start it again after a restart test stopped it.
    containerd_config: PathBuf,
    path: String,
    /// The running containerd's pid; 0 while a test has it stopped.
    containerd: std::sync::Mutex<u32>,
}

static CRI: tokio::sync::OnceCell<Cri> = tokio::sync::OnceCell::const_new();

/// The shared CRI containerd; started on first use, dies with the test binary.
pub async fn cri() -> &'static Cri {
    CRI.get_or_init(start).await
}

impl Cri {
    /// Holds the CRI tests' turn.
    /// Starts containerd again first if a restart test failed while it was stopped.
    pub async fn serial(&self) -> tokio::sync::MutexGuard<'_, ()> {
        let turn = self.serial.lock().await;
        if *self.containerd.lock().unwrap() == 0 {
            self.start_containerd().await;
        }
        turn
    }

    /// A new CRI RuntimeService client (a fresh channel: each test has its own tokio runtime).
    pub async fn client(&self) -> Client {
        RuntimeServiceClient::new(channel(&self.sock).await)
    }

    pub fn ctr(&self, args: &[&str]) -> std::process::Output {
        run(Command::new("ctr")
            .env("PATH", &self.path)
            .arg("--address")
            .arg(&self.sock)
            .args(["-n", CRI_NS])
            .args(args)
            .stdin(std::process::Stdio::null()))
    }

    /// containerd's task bundle of a container or sandbox.
    pub fn bundle(&self, id: &str) -> PathBuf {
        self.state_dir
            .join("io.containerd.runtime.v2.task")
            .join(CRI_NS)
            .join(id)
    }

    /// The last `n` lines of containerd's log (shim lines included), for failure messages.
    pub fn log_tail(&self, n: usize) -> String {
        let log = std::fs::read_to_string(&self.log).unwrap_or_default();
        let lines: Vec<&str> = log.lines().collect();
        lines[lines.len().saturating_sub(n)..].join("\n")
    }

    /// Entries of gantry's socket dir.
    pub fn sockets(&self) -> Vec<PathBuf> {
        std::fs::read_dir(&self.socket_dir)
            .into_iter()
            .flatten()
            .flatten()
            .map(|e| e.path())
            .collect()
    }

    /// A pod's CRI log directory (created).
    pub fn pod_log_dir(&self, pod: &str) -> PathBuf {
        let d = self.pod_logs.join(pod);
        std::fs::create_dir_all(&d).unwrap();
        d
    }
}

/// A tonic channel over a unix socket.
pub async fn channel(sock: &Path) -> Channel {
    let shown = sock.display().to_string();
    let sock = sock.to_path_buf();
    Endpoint::try_from("http://[::]:50051")
        .unwrap()
        .timeout(Duration::from_secs(120))
        .connect_timeout(Duration::from_secs(10))
        .connect_with_connector(tower::service_fn(move |_: Uri| {
            let sock = sock.clone();
            async move { Ok::<_, std::io::Error>(TokioIo::new(tokio::net::UnixStream::connect(sock).await?)) }
        }))
        .await
        .unwrap_or_else(|e| panic!("connect to {shown}: {e:?}"))
}

async fn start() -> Cri {
    kill_stale_runc_shims();
    // The ctr harness owns the run directory (and sweeps aborted runs); the CRI containerd
    // lives inside it and reuses its busybox image.
    let base = env();
    let dir = base.dir.join("cri");
    std::fs::create_dir_all(&dir).unwrap();

    let pause_dir = dir.join("pause-image");
    crate::common::busybox_image(&pause_dir, PAUSE_IMAGE, &["/pause"]);

    let (socket_dir, runtime_root, config) =
        super::gantry_config(&dir, &format!("systemd_cgroup = {}\n", systemd_driver()));
    // Under `<run dir>/cri-runc/rt`: the stale-run sweep deletes runc containers of every
    // `<run dir>/*/rt/*` root.
    let runc_root = base.dir.join("cri-runc").join("rt");
    let cni_bin = dir.join("cni-bin");
    let cni_conf = dir.join("cni-conf");
    let pod_logs = dir.join("pod-logs");
    for d in [&cni_bin, &cni_conf, &pod_logs, &runc_root] {
        std::fs::create_dir_all(d).unwrap();
    }
    let sock = dir.join("containerd.sock");
    let state_dir = dir.join("state");
    let cd_config = dir.join("containerd.toml");
    let cri = r#"plugins."io.containerd.grpc.v1.cri""#;
    std::fs::write(
        &cd_config,
        format!(
            r#"version = 2
root = {root:?}
state = {state:?}
[grpc]
  address = {sock:?}
[ttrpc]
  address = {ttrpc:?}
# Not /opt/containerd.
[plugins."io.containerd.internal.v1.opt"]
  path = {opt:?}
[{cri}]
  sandbox_image = "{PAUSE_IMAGE}"
  # The VM lacks CAP_SYS_RESOURCE: never ask for a lower oom_score_adj than containerd's.
  restrict_oom_score_adj = true
  # containerd 1.7+ only (1.6 has no CDI); off so the test does not depend on /etc/cdi.
  enable_cdi = false
[{cri}.containerd]
  default_runtime_name = "runc"
[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"
[{cri}.containerd.runtimes.runc.options]
  Root = {runc_root:?}
  SystemdCgroup = {systemd}
[{cri}.containerd.runtimes.{HANDLER}]
  runtime_type = "io.containerd.gantry.v2"
[{cri}.containerd.runtimes.{HANDLER}.options]
  ConfigPath = {config:?}
# Host-network pods need no CNI; empty dirs keep the host's CNI setup out.
[{cri}.cni]
  bin_dir = {cni_bin:?}
  conf_dir = {cni_conf:?}
"#,
            root = dir.join("root"),
            state = state_dir,
            sock = sock,
            ttrpc = dir.join("containerd.sock.ttrpc"),
            opt = dir.join("opt"),
            systemd = systemd_driver(),
        ),
    )
    .unwrap();

    let shim_dir = Path::new(SHIM).parent().unwrap().to_path_buf();
    let mut path = format!("{}:{}", shim_dir.display(), std::env::var("PATH").unwrap_or_default());
    if let Some(engine) = engine_bin() {
        path = format!("{}:{path}", engine.display());
    }
    let log = dir.join("containerd.log");
    std::fs::File::create(&log).unwrap();
    let pid = spawn_containerd(&cd_config, &log, &path);

    let c = Cri {
        dir: dir.clone(),
        sock,
        state_dir,
        log,
        config,
        socket_dir,
        runtime_root,
        runc_root,
        pod_logs,
        serial: tokio::sync::Mutex::new(()),
        containerd_config: cd_config,
        path,
        containerd: std::sync::Mutex::new(pid),
    };
    let up = super::wait_until(Duration::from_secs(30), || c.ctr(&["version"]).status.success());
    assert!(up, "CRI containerd did not start:\n{}", c.log_tail(60));
    for tar in [pause_dir.join("image.tar"), base.image_tar.clone()] {
        let o = c.ctr(&["images", "import", tar.to_str().unwrap()]);
        assert!(o.status.success(), "import {}: {}", tar.display(), text(&o));
    }
    c.wait_ready().await;
    c
}

/// `GANTRY_TEST_ENGINE_BIN`: a directory whose containerd, ctr, runc shim and runc the CRI tests
/// run instead of the host's (scripts/test.sh points it at scripts/stack.sh's containerd 2.3
/// and runc 1.4 for the suite's second CRI pass). gantry runs that runc too: its config names
/// `runc`, found in the same PATH.
pub fn engine_bin() -> Option<PathBuf> {
    std::env::var_os("GANTRY_TEST_ENGINE_BIN")
        .filter(|d| !d.is_empty())
        .map(PathBuf::from)
}

/// Starts containerd on `config`, its output appended to `log`; returns its pid.
fn spawn_containerd(config: &Path, log: &Path, path: &str) -> u32 {
    let log_file = std::fs::OpenOptions::new().append(true).open(log).unwrap();
    let mut cmd = Command::new("containerd");
    cmd.arg("--config")
        .arg(config)
        .env("PATH", path)
        // gantry must find its config through the handler's ConfigPath alone.
        .env_remove("GANTRY_CONFIG")
        .stdout(log_file.try_clone().unwrap())
        .stderr(log_file);
    super::spawn_for_life(cmd)
}

impl Cri {
    /// Stops containerd the way `systemctl stop containerd` does (SIGTERM; the shims and their
    /// containers keep running) and waits until it has exited.
    pub fn stop_containerd(&self) {
        use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
        let mut pid = self.containerd.lock().unwrap();
        assert_ne!(*pid, 0, "containerd is already stopped");
        let p = nix::unistd::Pid::from_raw(*pid as i32);
        nix::sys::signal::kill(p, nix::sys::signal::Signal::SIGTERM).unwrap();
        // The child is this process's (spawn_for_life only parks its handle): reap it here.
        let exited = super::wait_until(Duration::from_secs(30), || {
            !matches!(waitpid(p, Some(WaitPidFlag::WNOHANG)), Ok(WaitStatus::StillAlive))
        });
        assert!(exited, "containerd did not exit on SIGTERM:\n{}", self.log_tail(40));
        *pid = 0;
    }

    /// Starts containerd again on the same config and state, and waits until its CRI answers.
    pub async fn start_containerd(&self) {
        {
            let mut pid = self.containerd.lock().unwrap();
            assert_eq!(*pid, 0, "containerd is running");
            *pid = spawn_containerd(&self.containerd_config, &self.log, &self.path);
        }
        let up = super::wait_until(Duration::from_secs(30), || self.ctr(&["version"]).status.success());
        assert!(up, "containerd did not come back:\n{}", self.log_tail(60));
        self.wait_ready().await;
    }

    /// The CRI service answers, and its image store has caught up with the imports (it learns
    /// of them from containerd's events).
    /// The major version of the containerd this harness runs (`containerd --version`: "containerd
    /// github.com/containerd/containerd v1.6.20 ..." or ".../v2 v2.3.7 ...").
    pub fn engine_major(&self) -> u32 {
        let o = run(Command::new("containerd").env("PATH", &self.path).arg("--version"));
        let text = String::from_utf8_lossy(&o.stdout).into_owned();
        let version = text.split_whitespace().nth(2).unwrap_or_default();
        let major = version
            .trim_start_matches('v')
            .split('.')
            .next()
            .and_then(|m| m.parse().ok());
        major.unwrap_or_else(|| panic!("containerd --version: {text:?}"))
    }

    async fn wait_ready(&self) {
        let c = self;
        let ch = channel(&c.sock).await;
        let mut rt = RuntimeServiceClient::new(ch.clone());
        let mut images = ImageServiceClient::new(ch);
        let mut ready = false;
        for _ in 0..200 {
            let version_ok = rt.version(VersionRequest::default()).await.is_ok();
            let mut both = version_ok;
            for image in [PAUSE_IMAGE, IMAGE] {
                let st = images
                    .image_status(ImageStatusRequest {
                        image: Some(image_spec(image)),
                        verbose: false,
                    })
                    .await;
                both &= st.map(|r| r.into_inner().image.is_some()).unwrap_or(false);
            }
            if both {
                ready = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert!(ready, "CRI plugin not ready or images not visible:\n{}", c.log_tail(60));
    }
}

/// runc shims of an aborted earlier run's CRI containerd (they outlive it); gantry's daemons
/// and the containers are swept by `common::env()`.
fn kill_stale_runc_shims() {
    for (pid, args) in super::processes() {
        if !args.first().is_some_and(|a| a.ends_with("containerd-shim-runc-v2")) {
            continue;
        }
        let Some(addr) = flag(&args, "-address") else { continue };
        let Some(run_pid) = addr
            .strip_prefix("/tmp/gantry-it-")
            .and_then(|r| r.split('/').next())
            .and_then(|p| p.parse::<i32>().ok())
        else {
            continue;
        };
        if run_pid != std::process::id() as i32 && !Path::new(&format!("/proc/{run_pid}")).exists() {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        }
    }
}

/// The value after a Go-style flag (`-id X`).
pub fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.windows(2).find(|w| w[0] == name).map(|w| w[1].as_str())
}

/// A running shim daemon (not a `start`/`delete` invocation).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Daemon {
    pub pid: i32,
    /// Its `-id`: the container whose `start` spawned it (for a pod, the sandbox).
    pub id: String,
    pub args: Vec<String>,
}

/// Shim daemons of `binary` (e.g. `containerd-shim-gantry-v2`) serving the CRI namespace of
/// the containerd on `address`.
pub fn daemons(binary: &str, address: &Path) -> Vec<Daemon> {
    let address = address.to_str().unwrap();
    super::processes()
        .into_iter()
        .filter(|(_, a)| a.first().is_some_and(|b| b.ends_with(binary)))
        .filter(|(_, a)| flag(a, "-namespace") == Some(CRI_NS))
        .filter(|(_, a)| flag(a, "-address").is_some_and(|x| x.trim_start_matches("unix://") == address))
        .filter(|(_, a)| !a.iter().any(|x| x == "start" || x == "delete"))
        .map(|(pid, args)| Daemon {
            pid,
            id: flag(&args, "-id").unwrap_or_default().to_string(),
            args,
        })
        .collect()
}

impl Cri {
    /// gantry daemons of this containerd's `k8s.io` namespace.
    pub fn gantry_daemons(&self) -> Vec<Daemon> {
        daemons("containerd-shim-gantry-v2", &self.sock)
    }

    /// containerd's own runc shims (the default handler) of this containerd's `k8s.io` namespace.
    pub fn runc_daemons(&self) -> Vec<Daemon> {
        daemons("containerd-shim-runc-v2", &self.sock)
    }
}

pub fn image_spec(image: &str) -> ImageSpec {
    ImageSpec {
        image: image.to_string(),
    }
}

fn host_network_namespaces() -> NamespaceOption {
    NamespaceOption {
        network: NamespaceMode::Node as i32,
        // As kubelet sets it without shareProcessNamespace: the container's init is its pid 1.
        pid: NamespaceMode::Container as i32,
        ipc: NamespaceMode::Pod as i32,
    }
}

/// A host-network pod, unique by `name` (the uid is derived from it and this run's pid).
pub fn pod_config(name: &str, log_dir: &Path) -> PodSandboxConfig {
    PodSandboxConfig {
        metadata: Some(PodSandboxMetadata {
            name: name.to_string(),
            uid: format!("{name}-uid-{}", std::process::id()),
            namespace: "gantry-it".to_string(),
            attempt: 0,
        }),
        // Empty, as kubelet leaves it for host-network pods: a hostname needs a private UTS
        // namespace, and runc refuses it without one.
        hostname: String::new(),
        log_directory: log_dir.to_str().unwrap().to_string(),
        labels: HashMap::from([("gantry-it".to_string(), name.to_string())]),
        linux: Some(LinuxPodSandboxConfig {
            cgroup_parent: if systemd_driver() {
                POD_SLICE.into()
            } else {
                String::new()
            },
            security_context: Some(LinuxSandboxSecurityContext {
                namespace_options: Some(host_network_namespaces()),
            }),
        }),
    }
}

/// A busybox container running `command`, logging to `<pod log dir>/<name>.log`.
pub fn container_config(name: &str, command: &[&str]) -> ContainerConfig {
    ContainerConfig {
        metadata: Some(ContainerMetadata {
            name: name.to_string(),
            attempt: 0,
        }),
        image: Some(image_spec(IMAGE)),
        command: command.iter().map(|s| s.to_string()).collect(),
        log_path: format!("{name}.log"),
        linux: Some(LinuxContainerConfig {
            resources: None,
            security_context: Some(LinuxContainerSecurityContext {
                namespace_options: Some(host_network_namespaces()),
            }),
        }),
    }
}

/// Stops and removes a pod (and so its containers) when a test fails before it did so itself.
pub struct PodGuard {
    sock: PathBuf,
    pub id: String,
    armed: bool,
}

impl PodGuard {
    pub fn new(cri: &Cri, id: &str) -> PodGuard {
        PodGuard {
            sock: cri.sock.clone(),
            id: id.to_string(),
            armed: true,
        }
    }

    /// The test removed the pod itself.
    pub fn disarm(&mut self) {
        self.armed = false;
    }
}

impl Drop for PodGuard {
    fn drop(&mut self) {
        if !self.armed {
            return;
        }
        let sock = self.sock.clone();
        let id = self.id.clone();
        // Drop may run inside the test's runtime: clean up from a thread with its own.
        let _ = std::thread::spawn(move || {
            let Ok(rt) = tokio::runtime::Builder::new_current_thread().enable_all().build() else {
                return;
            };
            rt.block_on(async {
                let work = async {
                    let mut c = RuntimeServiceClient::new(channel(&sock).await);
                    let _ = c
                        .stop_pod_sandbox(StopPodSandboxRequest {
                            pod_sandbox_id: id.clone(),
                        })
                        .await;
                    let _ = c
                        .remove_pod_sandbox(RemovePodSandboxRequest {
                            pod_sandbox_id: id.clone(),
                        })
                        .await;
                };
                let _ = tokio::time::timeout(Duration::from_secs(60), work).await;
            });
        })
        .join();
    }
}

/// The pods' cgroup parent under the systemd driver (kubelet's shape for a BestEffort pod).
pub const POD_SLICE: &str = "kubepods-besteffort-gantryit.slice";

/// On a systemd host with cgroup v2 (the node lane's guest) the CRI tests run as kubelet runs
/// there: the systemd cgroup driver for gantry and runc, pods under a `.slice` parent (from
/// which containerd's CRI makes `slice:cri-containerd:<id>` paths). Elsewhere cgroupfs.
pub fn systemd_driver() -> bool {
    let init = std::fs::read_to_string("/proc/1/comm").unwrap_or_default();
    init.trim() == "systemd" && cgroup_v2()
}

/// Whether this host runs the unified cgroup v2 hierarchy at /sys/fs/cgroup (the node lane's
/// guest) rather than v1 controllers (this project's build machines).
pub fn cgroup_v2() -> bool {
    nix::sys::statfs::statfs("/sys/fs/cgroup")
        .is_ok_and(|s| s.filesystem_type() == nix::sys::statfs::CGROUP2_SUPER_MAGIC)
}

/// The container's CPU time in ns: v1 `cpuacct.usage`, v2 `cpu.stat` `usage_usec`.
pub fn cpu_usage_ns(pid: u32) -> u64 {
    if !cgroup_v2() {
        return cgroup_u64(&cgroup_dir(pid, "cpuacct"), "cpuacct.usage");
    }
    let stat = std::fs::read_to_string(cgroup_dir(pid, "cpu").join("cpu.stat")).unwrap();
    let usec = stat.lines().find_map(|l| l.strip_prefix("usage_usec ")).unwrap();
    usec.trim().parse::<u64>().unwrap() * 1000
}

/// The container's memory limit: v1 `memory.limit_in_bytes`, v2 `memory.max`.
pub fn memory_limit(pid: u32) -> String {
    let file = if cgroup_v2() {
        "memory.max"
    } else {
        "memory.limit_in_bytes"
    };
    std::fs::read_to_string(cgroup_dir(pid, "memory").join(file))
        .unwrap()
        .trim()
        .to_string()
}

/// CPU shares as the cgroup holds them: v1 `cpu.shares`; v2 `cpu.weight`, given back as the
/// weight runc maps `shares` to (1 + (shares - 2) * 9999 / 262142).
pub fn cpu_shares_as_held(pid: u32, shares: u64) -> (u64, u64) {
    if cgroup_v2() {
        (
            cgroup_u64(&cgroup_dir(pid, "cpu"), "cpu.weight"),
            1 + (shares - 2) * 9999 / 262142,
        )
    } else {
        (cgroup_u64(&cgroup_dir(pid, "cpu"), "cpu.shares"), shares)
    }
}

/// The cgroup directory of `controller` that `pid` is in (v1), or its v2 directory.
pub fn cgroup_dir(pid: u32, controller: &str) -> PathBuf {
    let cg = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    if cgroup_v2() {
        let path = cg
            .lines()
            .find_map(|l| l.strip_prefix("0::"))
            .unwrap_or_else(|| panic!("no v2 line:\n{cg}"));
        return Path::new("/sys/fs/cgroup").join(path.trim_start_matches('/'));
    }
    for line in cg.lines() {
        let mut parts = line.splitn(3, ':');
        let (_, ctls, path) = (parts.next(), parts.next().unwrap_or(""), parts.next().unwrap_or(""));
        if ctls.split(',').any(|c| c == controller) {
            // The mount may be named after a combined hierarchy (cpu,cpuacct).
            let base = Path::new("/sys/fs/cgroup").join(ctls);
            let base = if base.exists() {
                base
            } else {
                Path::new("/sys/fs/cgroup").join(controller)
            };
            return base.join(path.trim_start_matches('/'));
        }
    }
    panic!("no {controller} cgroup for {pid} in:\n{cg}");
}

/// Whether the freezer holds `pid`'s cgroup: v1 `freezer.state` FROZEN, v2 `cgroup.events`
/// `frozen 1`.
pub fn frozen(pid: u32) -> bool {
    if cgroup_v2() {
        let events = std::fs::read_to_string(cgroup_dir(pid, "").join("cgroup.events")).unwrap();
        return events.lines().any(|l| l == "frozen 1");
    }
    let state = std::fs::read_to_string(cgroup_dir(pid, "freezer").join("freezer.state")).unwrap();
    state.trim() == "FROZEN"
}

/// Every directory named `relative` (`/ns/id`) under a cgroup mount this process sees, v1
/// hierarchies and the unified one alike: where a cgroup would be left behind.
pub fn cgroup_dirs(relative: &str) -> Vec<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/self/mounts").unwrap();
    mounts
        .lines()
        .filter_map(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            (f.len() > 2 && (f[2] == "cgroup" || f[2] == "cgroup2"))
                .then(|| Path::new(f[1]).join(relative.trim_start_matches('/')))
        })
        .filter(|d| d.is_dir())
        .collect()
}

/// Reads a cgroup file as a number.
pub fn cgroup_u64(dir: &Path, file: &str) -> u64 {
    let p = dir.join(file);
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("read {}: {e}", p.display()))
        .trim()
        .parse()
        .unwrap()
}
