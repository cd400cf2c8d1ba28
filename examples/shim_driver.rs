//! Benchmark driver: starts shim v2 binaries exactly as containerd 1.6 does and times one
//! container's whole lifecycle through each, without containerd's own work in the way.
//!
//! For every run and shim: a fresh bundle (`config.json` from `runc spec`, patched to run
//! `/bin/true` from an absolute, read-only rootfs), the stdout/stderr/log FIFOs with their read
//! sides open (as an engine holds them), then
//!
//!   `SHIM -namespace NS -address ADDR -publish-binary BIN -id ID start`   (cwd = the bundle,
//!   env TTRPC_ADDRESS/GRPC_ADDRESS/NAMESPACE/GOMAXPROCS as containerd sets them; stdin = the
//!   runtime options `Any` when there are options, else nothing)
//!
//! then over ttrpc, with the service name `containerd.task.v2.Task` that containerd 1.6 and
//! CRI-O call (the Go shim of containerd 1.6 serves only that name): Create → Start → Wait →
//! Delete → Shutdown, until the daemon process has exited.
//!
//! Timed: from spawning `start` to the daemon's exit. CPU: the driver is a child subreaper, so
//! the daemon (which `start` detaches) becomes its child; the CPU time (user + system, all
//! threads, ns precision through the process CPU clock) of the `start` process and of the
//! daemon is read while each is a zombie, just before reaping. Children the shims reap
//! themselves (runc, crun, the container) are not counted.
//!
//! Shims run interleaved (A B, then B A, ...), so machine noise hits them alike. Prints JSON.
//!
//!   shim_driver --shim go=/usr/bin/containerd-shim-runc-v2 --shim gantry=PATH \
//!     --rootfs DIR --workdir DIR --address SOCK --ttrpc-address SOCK [--namespace NS] \
//!     [--runs N] [--warmup N] [--runtime-binary crun] [--publish-binary /usr/bin/containerd] \
//!     [--summary FILE] [--runtime-floor] [--keep-logs]
//!
//! `--runtime-floor` adds a reference entry, `oci-runtime`: the same container run by the OCI
//! runtime alone (`create`, `start`, wait for the exit, `delete`), the floor under any shim.
//!
//! `--keep-logs` saves each shim's log FIFO output as `WORKDIR/ID.log`.
//!
//! `--engine crio` starts every shim as CRI-O does instead (`-address ""`, empty `TTRPC_ADDRESS`
//! and `GRPC_ADDRESS`: no event publisher) and marks a pod's containers with CRI-O's
//! annotations (all of those CRI-O 1.37 writes, `io.kubernetes.cri-o.ContainerType` among them),
//! its resources and OOM score, and, as CRI-O's `runtime_config_path` does, the first
//! `--config`'s path in Create's runtime options (`runtimeoptions.v1.Options`).
//!
//! `--systemd-slice SLICE` gives each container the systemd driver's `cgroupsPath`,
//! `SLICE:drv:<id>` (the shims' own configuration must select that driver).
//!
//! `--summary FILE` also writes `SHIM<TAB>KEY<TAB>VALUE` lines (lifecycle_p50, lifecycle_p90,
//! create_p50, cpu_p50, cpu_mean, start_cmd_p50, in ms; `null` where not applicable) for
//! scripts without a JSON parser.

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use containerd_shim_protos::api::{
    CreateTaskRequest, CreateTaskResponse, DeleteRequest, DeleteResponse, Empty, ShutdownRequest, StartRequest,
    StartResponse, WaitRequest, WaitResponse,
};
use containerd_shim_protos::protobuf::{Message, MessageField};
use containerd_shim_protos::shim::oci::Options as RuncOptions;
use serde_json::{json, Value};
use ttrpc::asynchronous::Client;

const SERVICE: &str = "containerd.task.v2.Task";
const RPC_TIMEOUT: Duration = Duration::from_secs(60);

struct Args {
    shims: Vec<(String, PathBuf)>,
    rootfs: PathBuf,
    workdir: PathBuf,
    address: String,
    ttrpc_address: String,
    namespace: String,
    publish_binary: String,
    runtime_binary: Option<String>,
    runs: usize,
    warmup: usize,
    summary: Option<PathBuf>,
    runtime_floor: bool,
    keep_logs: bool,
    /// Pod mode: the pause image's rootfs; each run starts a pod (sandbox + one container).
    pod: Option<PathBuf>,
    /// GANTRY_CONFIG for a shim's `start` (so one binary runs with two configs).
    configs: Vec<(String, PathBuf)>,
    /// systemd cgroup driver: `cgroupsPath` is `SLICE:drv:<id>` instead of `/<ns>/<id>`.
    systemd_slice: Option<String>,
    /// `--engine crio`: CRI-O's `start` environment and annotations.
    crio: bool,
}

fn usage() -> ! {
    eprintln!(
        "usage: shim_driver --shim NAME=PATH [--shim NAME=PATH ...] --rootfs DIR --workdir DIR \
         --address SOCK --ttrpc-address SOCK [--namespace NS] [--runs N] [--warmup N] \
         [--runtime-binary NAME] [--publish-binary PATH] [--summary FILE] [--runtime-floor] [--keep-logs] \
         [--pod PAUSE_ROOTFS] [--config NAME=GANTRY_CONFIG] [--systemd-slice SLICE] \
         [--engine containerd|crio]"
    );
    std::process::exit(2)
}

fn parse_args() -> Result<Args> {
    let mut a = Args {
        shims: Vec::new(),
        rootfs: PathBuf::new(),
        workdir: PathBuf::new(),
        address: String::new(),
        ttrpc_address: String::new(),
        namespace: "bench-driver".into(),
        publish_binary: "/usr/bin/containerd".into(),
        runtime_binary: None,
        runs: 50,
        warmup: 1,
        summary: None,
        runtime_floor: false,
        keep_logs: false,
        pod: None,
        configs: Vec::new(),
        systemd_slice: None,
        crio: false,
    };
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        if flag == "-h" || flag == "--help" {
            usage();
        }
        if flag == "--runtime-floor" {
            a.runtime_floor = true;
            continue;
        }
        if flag == "--keep-logs" {
            a.keep_logs = true;
            continue;
        }
        let v = it.next().ok_or_else(|| anyhow!("{flag} needs a value"))?;
        match flag.as_str() {
            "--shim" => {
                let (n, p) = v.split_once('=').ok_or_else(|| anyhow!("--shim wants NAME=PATH"))?;
                a.shims.push((n.to_string(), PathBuf::from(p)));
            }
            "--rootfs" => a.rootfs = PathBuf::from(v),
            "--workdir" => a.workdir = PathBuf::from(v),
            "--address" => a.address = v,
            "--ttrpc-address" => a.ttrpc_address = v,
            "--namespace" => a.namespace = v,
            "--publish-binary" => a.publish_binary = v,
            "--runtime-binary" => a.runtime_binary = Some(v).filter(|s| !s.is_empty()),
            "--runs" => a.runs = v.parse().context("--runs")?,
            "--warmup" => a.warmup = v.parse().context("--warmup")?,
            "--summary" => a.summary = Some(PathBuf::from(v)),
            "--pod" => a.pod = Some(PathBuf::from(v)),
            "--systemd-slice" => a.systemd_slice = Some(v),
            "--engine" => match v.as_str() {
                "crio" => a.crio = true,
                "containerd" => a.crio = false,
                _ => bail!("--engine crio|containerd"),
            },
            "--config" => {
                let (n, p) = v.split_once('=').ok_or_else(|| anyhow!("--config wants NAME=PATH"))?;
                a.configs.push((n.to_string(), PathBuf::from(p)));
            }
            _ => bail!("unknown flag {flag}"),
        }
    }
    if a.shims.is_empty() || a.rootfs.as_os_str().is_empty() || a.workdir.as_os_str().is_empty() {
        usage();
    }
    a.rootfs = std::fs::canonicalize(&a.rootfs).with_context(|| format!("rootfs {}", a.rootfs.display()))?;
    Ok(a)
}

/// One container lifecycle's measurements, in milliseconds.
#[derive(Default)]
struct Sample {
    total: f64,
    start_cmd: f64,
    create: f64,
    start: f64,
    wait: f64,
    delete: f64,
    shutdown_to_exit: f64,
    cpu_start_cmd: f64,
    cpu_daemon: f64,
    /// Pod mode: `start` spawned → the sandbox's Start answered.
    sandbox: f64,
    /// Pod mode: `start` spawned → the pod's container's Start answered.
    pod: f64,
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// CPU time (user + system, every thread, ns precision) of a process that has not been reaped.
fn process_cpu(pid: i32) -> Result<Duration> {
    let mut clock: libc::clockid_t = 0;
    // SAFETY: plain libc calls with valid out-pointers.
    let rc = unsafe { libc::clock_getcpuclockid(pid, &mut clock) };
    if rc != 0 {
        bail!("clock_getcpuclockid({pid}): {}", std::io::Error::from_raw_os_error(rc));
    }
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    if unsafe { libc::clock_gettime(clock, &mut ts) } != 0 {
        bail!("clock_gettime(cpu clock of {pid}): {}", std::io::Error::last_os_error());
    }
    Ok(Duration::new(ts.tv_sec as u64, ts.tv_nsec as u32))
}

/// Waits until child `pid` has exited without reaping it (it stays a zombie).
fn wait_exited_noreap(pid: i32) -> Result<()> {
    loop {
        // SAFETY: zeroed siginfo is a valid out-buffer for waitid.
        let mut info: libc::siginfo_t = unsafe { std::mem::zeroed() };
        let rc = unsafe { libc::waitid(libc::P_PID, pid as libc::id_t, &mut info, libc::WEXITED | libc::WNOWAIT) };
        if rc == 0 {
            return Ok(());
        }
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EINTR) {
            bail!("waitid({pid}): {e}");
        }
    }
}

fn reap(pid: i32) {
    let mut status = 0;
    // SAFETY: waitpid on our own child.
    unsafe { libc::waitpid(pid, &mut status, 0) };
}

/// Reaps whatever else got reparented to us (orphans of a shim) without blocking.
fn reap_strays() {
    loop {
        let mut status = 0;
        let pid = unsafe { libc::waitpid(-1, &mut status, libc::WNOHANG) };
        if pid <= 0 {
            return;
        }
    }
}

/// The daemon `start` left behind: `<bundle>/shim.pid` where the shim writes it (gantry),
/// else our only child process (the Go shim of containerd 1.6 writes no pid file; its daemon
/// got reparented to us, the subreaper, when `start` exited).
fn daemon_pid(bundle: &Path) -> Result<i32> {
    if let Ok(s) = std::fs::read_to_string(bundle.join("shim.pid")) {
        return s.trim().parse().context("shim.pid");
    }
    let mut kids = Vec::new();
    for t in std::fs::read_dir("/proc/self/task")?.flatten() {
        let list = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
        kids.extend(list.split_whitespace().filter_map(|p| p.parse::<i32>().ok()));
    }
    kids.sort_unstable();
    kids.dedup();
    match kids.as_slice() {
        [pid] => Ok(*pid),
        other => bail!(
            "no shim.pid in {} and {} children: {other:?}",
            bundle.display(),
            other.len()
        ),
    }
}

fn mkfifo(path: &Path) -> Result<()> {
    nix::unistd::mkfifo(path, nix::sys::stat::Mode::from_bits_truncate(0o700))
        .with_context(|| format!("mkfifo {}", path.display()))
}

/// Opens a FIFO's read side as an engine does before the shim runs, and drains it until
/// aborted. Opened read-write so it neither blocks nor sees EOF before a writer comes.
/// With `keep`, what was read is appended to that file.
fn drain_fifo(path: &Path, keep: Option<PathBuf>) -> Result<tokio::task::JoinHandle<()>> {
    let mut rx = tokio::net::unix::pipe::OpenOptions::new()
        .read_write(true)
        .open_receiver(path)
        .with_context(|| format!("open {}", path.display()))?;
    let mut keep = match keep {
        Some(p) => Some(
            std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&p)
                .with_context(|| format!("open {}", p.display()))?,
        ),
        None => None,
    };
    Ok(tokio::spawn(async move {
        use tokio::io::AsyncReadExt;
        let mut buf = vec![0u8; 64 * 1024];
        while let Ok(n) = rx.read(&mut buf).await {
            if n == 0 {
                break;
            }
            if let Some(f) = keep.as_mut() {
                let _ = f.write_all(&buf[..n]);
            }
        }
    }))
}

fn spec_template(workdir: &Path) -> Result<Value> {
    let dir = workdir.join("spec-template");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let o = Command::new("runc")
        .args(["spec", "--bundle"])
        .arg(&dir)
        .output()
        .context("runc spec")?;
    if !o.status.success() {
        bail!("runc spec: {}", String::from_utf8_lossy(&o.stderr));
    }
    let spec = serde_json::from_slice(&std::fs::read(dir.join("config.json"))?)?;
    let _ = std::fs::remove_dir_all(&dir);
    Ok(spec)
}

async fn call<Req: Message, Resp: Message>(c: &Client, method: &str, req: &Req) -> Result<Resp> {
    let mut r = ttrpc::Request::new();
    r.service = SERVICE.into();
    r.method = method.into();
    r.timeout_nano = RPC_TIMEOUT.as_nanos() as i64;
    r.payload = req.write_to_bytes()?;
    let res = c.request(r).await.map_err(|e| anyhow!("{SERVICE}/{method}: {e:?}"))?;
    Ok(Resp::parse_from_bytes(&res.payload)?)
}

/// A Task RPC whose request carries only the container id.
async fn by_id<Resp: Message>(c: &Client, method: &str, id: &str) -> Result<Resp> {
    let id = id.to_string();
    match method {
        "Start" => {
            call(
                c,
                method,
                &StartRequest {
                    id,
                    ..Default::default()
                },
            )
            .await
        }
        "Wait" => {
            call(
                c,
                method,
                &WaitRequest {
                    id,
                    ..Default::default()
                },
            )
            .await
        }
        "Delete" => {
            call(
                c,
                method,
                &DeleteRequest {
                    id,
                    ..Default::default()
                },
            )
            .await
        }
        "Shutdown" => {
            call(
                c,
                method,
                &ShutdownRequest {
                    id,
                    ..Default::default()
                },
            )
            .await
        }
        other => bail!("no id-only request for {other}"),
    }
}

struct Driver {
    args: Args,
    spec: Value,
    options: Option<containerd_shim_protos::protobuf::well_known_types::any::Any>,
}

impl Driver {
    fn bundle(&self, id: &str) -> Result<PathBuf> {
        self.bundle_with(id, |_| {})
    }

    fn bundle_with(&self, id: &str, patch: impl FnOnce(&mut Value)) -> Result<PathBuf> {
        let dir = self.args.workdir.join(id);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let mut spec = self.spec.clone();
        spec["process"]["terminal"] = false.into();
        spec["process"]["args"] = json!(["/bin/true"]);
        spec["root"]["path"] = self.args.rootfs.to_str().unwrap().into();
        spec["root"]["readonly"] = true.into();
        spec["linux"]["cgroupsPath"] = match &self.args.systemd_slice {
            Some(slice) => format!("{slice}:drv:{id}"),
            None => format!("/{}/{}", self.args.namespace, id),
        }
        .into();
        patch(&mut spec);
        std::fs::write(dir.join("config.json"), serde_json::to_vec_pretty(&spec)?)?;
        for f in ["stdout", "stderr", "log"] {
            mkfifo(&dir.join(f))?;
        }
        Ok(dir)
    }

    /// Runs `start` as containerd does; returns (address, start pid's CPU).
    fn start_cmd(&self, name: &str, shim: &Path, id: &str, bundle: &Path) -> Result<(String, Duration)> {
        let a = &self.args;
        let mut cmd = Command::new(shim);
        if let Some((_, config)) = a.configs.iter().find(|(n, _)| n == name).filter(|_| !a.crio) {
            cmd.env("GANTRY_CONFIG", config);
        }
        let (address, ttrpc_address) = match a.crio {
            true => ("", ""),
            false => (a.address.as_str(), a.ttrpc_address.as_str()),
        };
        cmd.args(["-namespace", &a.namespace, "-address", address])
            .args(["-publish-binary", &a.publish_binary, "-id", id, "start"])
            .current_dir(bundle)
            .env("TTRPC_ADDRESS", ttrpc_address)
            .env("GRPC_ADDRESS", address)
            .env("NAMESPACE", &a.namespace)
            .env("MAX_SHIM_VERSION", "2")
            .env("GOMAXPROCS", "2")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        // CRI-O sends its options with Create only; containerd also on `start`'s stdin.
        let opts = match &self.options {
            Some(any) if !a.crio => Some(any.write_to_bytes()?),
            _ => None,
        };
        cmd.stdin(if opts.is_some() { Stdio::piped() } else { Stdio::null() });
        let mut child = cmd.spawn().with_context(|| format!("spawn {}", shim.display()))?;
        if let (Some(bytes), Some(mut stdin)) = (opts, child.stdin.take()) {
            stdin.write_all(&bytes)?;
        }
        let mut out = String::new();
        child.stdout.take().unwrap().read_to_string(&mut out)?;
        let mut err = String::new();
        child.stderr.take().unwrap().read_to_string(&mut err)?;
        let pid = child.id() as i32;
        wait_exited_noreap(pid)?;
        let cpu = process_cpu(pid)?;
        let status = child.wait()?;
        if !status.success() {
            bail!("{} start for {id}: {status}: {out}{err}", shim.display());
        }
        let address = out.trim().to_string();
        if address.is_empty() {
            bail!("{} start for {id} printed no address (stderr: {err})", shim.display());
        }
        Ok((address, cpu))
    }

    /// The OCI runtime alone: `create`, `start`, wait for the container's exit, `delete`.
    fn floor_lifecycle(&self, id: &str, bundle: &Path) -> Result<Sample> {
        let rt = self.args.runtime_binary.clone().unwrap_or_else(|| "runc".into());
        let root = self.args.workdir.join("floor-root");
        let run = |args: &[&str], out: Stdio, err: Stdio| -> Result<()> {
            let o = Command::new(&rt)
                .arg("--root")
                .arg(&root)
                .args(args)
                .stdin(Stdio::null())
                .stdout(out)
                .stderr(err)
                .status()
                .with_context(|| format!("{rt} {}", args[0]))?;
            if !o.success() {
                bail!("{rt} {args:?}: {o}");
            }
            Ok(())
        };
        let open_w = |f: &str| std::fs::OpenOptions::new().write(true).open(bundle.join(f));
        let mut s = Sample::default();
        let t0 = Instant::now();
        let pid_file = bundle.join("init.pid");
        let b = bundle.to_str().unwrap();
        let p = pid_file.to_str().unwrap();
        run(
            &["create", "--bundle", b, "--pid-file", p, id],
            open_w("stdout")?.into(),
            open_w("stderr")?.into(),
        )?;
        s.create = ms(t0.elapsed());
        let pid: i32 = std::fs::read_to_string(&pid_file)?.trim().parse()?;
        let mut t = Instant::now();
        run(&["start", id], Stdio::null(), Stdio::null())?;
        s.start = ms(t.elapsed());
        t = Instant::now();
        // The container's init was reparented to us, the subreaper, when `create` exited.
        wait_exited_noreap(pid)?;
        reap(pid);
        s.wait = ms(t.elapsed());
        t = Instant::now();
        run(&["delete", id], Stdio::null(), Stdio::null())?;
        s.delete = ms(t.elapsed());
        s.total = ms(t0.elapsed());
        Ok(s)
    }

    async fn start_blocking(
        &'static self,
        name: &str,
        shim: &Path,
        id: &str,
        bundle: &Path,
    ) -> Result<(String, Duration)> {
        let (name, shim, id, bundle) = (
            name.to_string(),
            shim.to_path_buf(),
            id.to_string(),
            bundle.to_path_buf(),
        );
        tokio::task::spawn_blocking(move || self.start_cmd(&name, &shim, &id, &bundle)).await?
    }

    /// Pod mode: a pause sandbox and one `/bin/true` container joining its namespaces, both
    /// through the same daemon, as CRI-O and containerd's CRI start a pod; then torn down.
    async fn pod(&'static self, name: &str, shim: &Path, id: &str, daemon_slot: &mut Option<i32>) -> Result<Sample> {
        let pause_rootfs = self.args.pod.clone().unwrap_or_default();
        let crio = self.args.crio;
        let annotate = |spec: &mut Value, kind: &str| {
            spec["annotations"] = match crio {
                true => crio_annotations(id, kind),
                false => json!({
                    "io.kubernetes.cri.container-type": kind,
                    "io.kubernetes.cri.sandbox-id": id,
                }),
            };
            if crio {
                // What CRI-O's specs carry beyond `runc spec`'s: a BestEffort pod's CPU resources
                // and the OOM score CRI-O sets.
                spec["process"]["oomScoreAdj"] = 0.into();
                spec["linux"]["resources"]["cpu"] = json!({"shares": 2, "quota": 0, "period": 100000});
            }
        };
        let sandbox = self.bundle_with(id, |spec| {
            spec["process"]["args"] = json!(["/pause"]);
            spec["root"]["path"] = pause_rootfs.to_str().unwrap_or_default().into();
            if let Some(m) = spec["mounts"].as_array_mut() {
                m.retain(|m| m["type"] != "cgroup");
            }
            annotate(spec, "sandbox");
        })?;
        let app_id = format!("{id}-app");
        let mut drains = Vec::new();
        for f in ["stdout", "stderr", "log"] {
            drains.push(drain_fifo(&sandbox.join(f), None)?);
        }
        let mut s = Sample::default();
        let t0 = Instant::now();
        let (address, _) = self.start_blocking(name, shim, id, &sandbox).await?;
        *daemon_slot = Some(daemon_pid(&sandbox)?);
        let client = Client::connect(&address)
            .await
            .map_err(|e| anyhow!("connect {address}: {e:?}"))?;
        let pid = self.create_start(&client, id, &sandbox).await?;
        s.sandbox = ms(t0.elapsed());
        let app = self.bundle_with(&app_id, |spec| {
            annotate(spec, "container");
            let joined: Vec<Value> = ["pid", "network", "ipc", "uts"]
                .iter()
                .zip(["pid", "net", "ipc", "uts"])
                .map(|(kind, file)| json!({"type": kind, "path": format!("/proc/{pid}/ns/{file}")}))
                .chain([json!({"type": "mount"})])
                .collect();
            spec["linux"]["namespaces"] = joined.into();
        })?;
        for f in ["stdout", "stderr", "log"] {
            drains.push(drain_fifo(&app.join(f), None)?);
        }
        let (app_address, _) = self.start_blocking(name, shim, &app_id, &app).await?;
        if app_address != address {
            bail!("{name}: the pod's container went to another daemon ({app_address} vs {address})");
        }
        self.create_start(&client, &app_id, &app).await?;
        s.pod = ms(t0.elapsed());
        let waited: WaitResponse = by_id(&client, "Wait", &app_id).await?;
        if waited.exit_status != 0 {
            bail!("{name}: the pod's /bin/true exited {}", waited.exit_status);
        }
        let _: DeleteResponse = by_id(&client, "Delete", &app_id).await?;
        let kill = containerd_shim_protos::api::KillRequest {
            id: id.into(),
            signal: 9,
            ..Default::default()
        };
        let _: Empty = call(&client, "Kill", &kill).await?;
        let _: WaitResponse = by_id(&client, "Wait", id).await?;
        let _: DeleteResponse = by_id(&client, "Delete", id).await?;
        let _: Result<Empty> = by_id(&client, "Shutdown", id).await;
        drop(client);
        let daemon = daemon_slot.take().unwrap_or_default();
        let exited = tokio::task::spawn_blocking(move || wait_exited_noreap(daemon));
        tokio::time::timeout(Duration::from_secs(30), exited).await???;
        reap(daemon);
        for d in drains {
            d.abort();
        }
        s.total = ms(t0.elapsed());
        Ok(s)
    }

    /// Create and Start of one container; its pid.
    async fn create_start(&self, client: &Client, id: &str, bundle: &Path) -> Result<u32> {
        let create = CreateTaskRequest {
            id: id.into(),
            bundle: bundle.to_str().unwrap_or_default().into(),
            stdout: bundle.join("stdout").to_str().unwrap_or_default().into(),
            stderr: bundle.join("stderr").to_str().unwrap_or_default().into(),
            options: MessageField::from_option(self.options.clone()),
            ..Default::default()
        };
        let created: CreateTaskResponse = call(client, "Create", &create).await?;
        let _: StartResponse = by_id(client, "Start", id).await?;
        Ok(created.pid)
    }

    async fn lifecycle(&'static self, name: &str, shim: Option<&Path>, id: &str) -> Result<Sample> {
        if let (Some(_), Some(shim)) = (&self.args.pod, shim) {
            let mut daemon = None;
            let r = self.pod(name, shim, id, &mut daemon).await;
            if let (Err(_), Some(pid)) = (&r, daemon) {
                unsafe { libc::kill(pid, libc::SIGKILL) };
                reap(pid);
            }
            reap_strays();
            let _ = std::fs::remove_dir_all(self.args.workdir.join(id));
            let _ = std::fs::remove_dir_all(self.args.workdir.join(format!("{id}-app")));
            return r;
        }
        let bundle = self.bundle(id)?;
        let drains = ["stdout", "stderr", "log"]
            .iter()
            .map(|f| {
                let keep = (self.args.keep_logs && *f == "log").then(|| self.args.workdir.join(format!("{id}.log")));
                drain_fifo(&bundle.join(f), keep)
            })
            .collect::<Result<Vec<_>>>()?;
        let mut daemon = None;
        let r = match shim {
            Some(shim) => self.lifecycle_in(name, shim, id, &bundle, &mut daemon).await,
            None => {
                let (id2, b2) = (id.to_string(), bundle.clone());
                match tokio::task::spawn_blocking(move || self.floor_lifecycle(&id2, &b2)).await {
                    Ok(r) => r,
                    Err(e) => Err(e.into()),
                }
            }
        };
        if let (Err(_), Some(pid)) = (&r, daemon) {
            // Leave nothing running behind a failed run.
            unsafe { libc::kill(pid, libc::SIGKILL) };
            reap(pid);
        }
        reap_strays();
        if self.args.keep_logs {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        for d in drains {
            d.abort();
        }
        let _ = std::fs::remove_dir_all(&bundle);
        r
    }

    async fn lifecycle_in(
        &'static self,
        name: &str,
        shim: &Path,
        id: &str,
        bundle: &Path,
        daemon_slot: &mut Option<i32>,
    ) -> Result<Sample> {
        let bundle = bundle.to_path_buf();
        let mut s = Sample::default();
        let t0 = Instant::now();

        let (address, cpu_start) = self.start_blocking(name, shim, id, &bundle).await?;
        s.start_cmd = ms(t0.elapsed());
        s.cpu_start_cmd = ms(cpu_start);
        let daemon = daemon_pid(&bundle)?;
        *daemon_slot = Some(daemon);

        let client = Client::connect(&address)
            .await
            .map_err(|e| anyhow!("connect {address}: {e:?}"))?;
        let mut t = Instant::now();
        let create = CreateTaskRequest {
            id: id.into(),
            bundle: bundle.to_str().unwrap().into(),
            stdout: bundle.join("stdout").to_str().unwrap().into(),
            stderr: bundle.join("stderr").to_str().unwrap().into(),
            terminal: false,
            options: MessageField::from_option(self.options.clone()),
            ..Default::default()
        };
        let created: CreateTaskResponse = call(&client, "Create", &create).await?;
        if created.pid == 0 {
            bail!("{name}: Create returned pid 0");
        }
        s.create = ms(t.elapsed());
        t = Instant::now();
        let _: StartResponse = by_id(&client, "Start", id).await?;
        s.start = ms(t.elapsed());
        t = Instant::now();
        let w: WaitResponse = by_id(&client, "Wait", id).await?;
        if w.exit_status != 0 {
            bail!("{name}: /bin/true exited {}", w.exit_status);
        }
        s.wait = ms(t.elapsed());
        t = Instant::now();
        let _: DeleteResponse = by_id(&client, "Delete", id).await?;
        s.delete = ms(t.elapsed());
        t = Instant::now();
        // A shim may exit before its reply to Shutdown gets out; that is a normal shutdown.
        let shut: Result<Empty> = by_id(&client, "Shutdown", id).await;
        drop(client);
        let exited = tokio::time::timeout(
            Duration::from_secs(30),
            tokio::task::spawn_blocking(move || wait_exited_noreap(daemon)),
        )
        .await;
        let total = t0.elapsed();
        match exited {
            Ok(Ok(Ok(()))) => {}
            Ok(Ok(Err(e))) => bail!("{name}: daemon {daemon} is not our child ({e}); shutdown: {shut:?}"),
            _ => bail!("{name}: daemon {daemon} did not exit after Shutdown ({shut:?})"),
        }
        s.shutdown_to_exit = ms(t.elapsed());
        s.total = ms(total);
        s.cpu_daemon = ms(process_cpu(daemon)?);
        reap(daemon);
        *daemon_slot = None;
        Ok(s)
    }
}

/// Nearest-rank percentile of sorted values.
/// The annotations CRI-O 1.37 puts on a pod's specs (names as CRI-O writes them; values shaped
/// like its, some of them JSON), so that the daemon parses what it parses under CRI-O.
fn crio_annotations(sandbox: &str, kind: &str) -> Value {
    let mut a = serde_json::Map::new();
    let cri_o = |k: &str| format!("io.kubernetes.cri-o.{k}");
    for (k, v) in [
        ("ContainerType", kind.to_string()),
        ("SandboxID", sandbox.to_string()),
        ("ContainerID", sandbox.to_string()),
        ("ContainerName", format!("k8s_POD_{sandbox}_default_uid_0")),
        ("Created", "2026-01-01T00:00:00.000000000Z".into()),
        ("HostName", sandbox.into()),
        ("HostnamePath", format!("/run/containers/storage/{sandbox}/hostname")),
        ("KubeName", sandbox.into()),
        (
            "Labels",
            format!(r#"{{"io.kubernetes.pod.name":"{sandbox}","io.kubernetes.pod.namespace":"default"}}"#),
        ),
        ("LogPath", format!("/var/log/pods/{sandbox}/{sandbox}.log")),
        (
            "Metadata",
            format!(r#"{{"name":"{sandbox}","uid":"uid","namespace":"default"}}"#),
        ),
        (
            "MountPoint",
            format!("/var/lib/containers/storage/overlay/{sandbox}/merged"),
        ),
        ("Name", format!("k8s_{sandbox}_default_uid_0")),
        ("Namespace", "default".into()),
        ("NamespaceOptions", r#"{"pid":1}"#.into()),
        ("PortMappings", "[]".into()),
        ("PrivilegedRuntime", "false".into()),
        ("ResolvPath", format!("/run/containers/storage/{sandbox}/resolv.conf")),
        ("RuntimeHandler", "gantry".into()),
        ("SandboxName", format!("k8s_{sandbox}_default_uid_0")),
        ("SeccompProfilePath", "".into()),
        ("ShmPath", format!("/run/containers/storage/{sandbox}/shm")),
        ("CgroupParent", "/kubepods/besteffort/poduid".into()),
        ("Annotations", "{}".into()),
        (
            "CNIResult",
            r#"{"cniVersion":"1.1.0","interfaces":[{"name":"lo"}],"ips":[]}"#.into(),
        ),
    ] {
        a.insert(cri_o(k), v.into());
    }
    for (k, v) in [
        ("io.kubernetes.container.name", "POD"),
        ("io.kubernetes.pod.name", sandbox),
        ("io.kubernetes.pod.namespace", "default"),
        ("io.kubernetes.pod.uid", "uid"),
        ("kubernetes.io/config.seen", "2026-01-01T00:00:00.000000000Z"),
        ("kubernetes.io/config.source", "api"),
    ] {
        a.insert(k.into(), v.into());
    }
    Value::Object(a)
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    if sorted.is_empty() {
        return f64::NAN;
    }
    let rank = ((p / 100.0) * sorted.len() as f64).ceil() as usize;
    sorted[rank.clamp(1, sorted.len()) - 1]
}

fn stats(mut v: Vec<f64>) -> Value {
    v.sort_by(|a, b| a.partial_cmp(b).unwrap());
    let mean = v.iter().sum::<f64>() / v.len().max(1) as f64;
    let r = |x: f64| (x * 1000.0).round() / 1000.0;
    json!({
        "p50": r(pct(&v, 50.0)),
        "p90": r(pct(&v, 90.0)),
        "mean": r(mean),
        "min": r(*v.first().unwrap_or(&f64::NAN)),
        "max": r(*v.last().unwrap_or(&f64::NAN)),
    })
}

fn main() -> Result<()> {
    let args = parse_args()?;
    // Become the subreaper: daemons that `start` detaches become our children, so their CPU
    // time can be read at exit.
    if unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) } != 0 {
        bail!("prctl(PR_SET_CHILD_SUBREAPER): {}", std::io::Error::last_os_error());
    }
    std::fs::create_dir_all(&args.workdir)?;
    let spec = spec_template(&args.workdir)?;
    let crio_options = args.configs.first().filter(|_| args.crio).map(|(_, path)| {
        // runtimeoptions.v1.Options{config_path}: field 2, a string (no generated type in the tree).
        let mut value = Vec::new();
        let mut out = containerd_shim_protos::protobuf::CodedOutputStream::vec(&mut value);
        out.write_string(2, &path.to_string_lossy()).unwrap();
        out.flush().unwrap();
        drop(out);
        let mut any = containerd_shim_protos::protobuf::well_known_types::any::Any::new();
        any.type_url = "runtimeoptions.v1.Options".into();
        any.value = value;
        any
    });
    let options = crio_options.or_else(|| {
        args.runtime_binary.as_ref().map(|b| {
            let o = RuncOptions {
                binary_name: b.clone(),
                ..Default::default()
            };
            let mut any = containerd_shim_protos::protobuf::well_known_types::any::Any::new();
            any.type_url = "containerd.runc.v1.Options".into();
            any.value = o.write_to_bytes().unwrap();
            any
        })
    });
    let driver: &'static Driver = Box::leak(Box::new(Driver { args, spec, options }));
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async move {
        let a = &driver.args;
        let tag = std::process::id();
        let mut samples: BTreeMap<&str, Vec<Sample>> = BTreeMap::new();
        let mut entries: Vec<(String, Option<PathBuf>)> =
            a.shims.iter().map(|(n, p)| (n.clone(), Some(p.clone()))).collect();
        if a.runtime_floor {
            entries.push(("oci-runtime".into(), None));
        }
        let entries: &'static [(String, Option<PathBuf>)] = Box::leak(entries.into_boxed_slice());
        for i in 0..a.warmup + a.runs {
            let mut order: Vec<&(String, Option<PathBuf>)> = entries.iter().collect();
            if i % 2 == 1 {
                order.reverse();
            }
            for (name, path) in order {
                let id = format!("drv-{tag}-{name}-{i}");
                let s = driver
                    .lifecycle(name, path.as_deref(), &id)
                    .await
                    .with_context(|| format!("{name} run {i}"))?;
                if i >= a.warmup {
                    samples.entry(name.as_str()).or_default().push(s);
                }
            }
        }
        let mut shims = serde_json::Map::new();
        for (name, v) in &samples {
            let col = |f: fn(&Sample) -> f64| stats(v.iter().map(f).collect());
            let mut entry = json!({
                    "lifecycle_ms": col(|s| s.total),
                    "cpu_ms": col(|s| s.cpu_start_cmd + s.cpu_daemon),
                    "cpu_start_cmd_ms": col(|s| s.cpu_start_cmd),
                    "cpu_daemon_ms": col(|s| s.cpu_daemon),
                    "phases_ms": {
                        "start_cmd": col(|s| s.start_cmd),
                        "create": col(|s| s.create),
                        "start": col(|s| s.start),
                        "wait": col(|s| s.wait),
                        "delete": col(|s| s.delete),
                        "shutdown_to_exit": col(|s| s.shutdown_to_exit),
                    },
                    "samples_ms": v.iter().map(|s| (s.total * 1000.0).round() / 1000.0).collect::<Vec<_>>(),
            });
            if a.pod.is_some() {
                entry = json!({
                    "sandbox_start_ms": col(|s| s.sandbox),
                    "pod_start_ms": col(|s| s.pod),
                    "pod_lifecycle_ms": col(|s| s.total),
                });
            }
            if *name == "oci-runtime" {
                // No shim process: no shim CPU and no `start` command to report.
                let o = entry.as_object_mut().unwrap();
                for k in ["cpu_ms", "cpu_start_cmd_ms", "cpu_daemon_ms"] {
                    o.remove(k);
                }
                o["phases_ms"].as_object_mut().unwrap().remove("start_cmd");
                o["phases_ms"].as_object_mut().unwrap().remove("shutdown_to_exit");
            }
            shims.insert(name.to_string(), entry);
        }
        let out = json!({
            "runs": a.runs,
            "warmup": a.warmup,
            "runtime_binary": a.runtime_binary.clone().unwrap_or_else(|| "runc".into()),
            "service": SERVICE,
            "shims": shims,
        });
        if let Some(path) = &a.summary {
            let mut tsv = String::new();
            for (name, s) in &shims {
                if a.pod.is_some() {
                    tsv.push_str(&format!("{name}\tsandbox_p50\t{}\n", s["sandbox_start_ms"]["p50"]));
                    tsv.push_str(&format!("{name}\tpod_p50\t{}\n", s["pod_start_ms"]["p50"]));
                    continue;
                }
                for (key, v) in [
                    ("lifecycle_p50", &s["lifecycle_ms"]["p50"]),
                    ("create_p50", &s["phases_ms"]["create"]["p50"]),
                    ("lifecycle_p90", &s["lifecycle_ms"]["p90"]),
                    ("cpu_p50", &s["cpu_ms"]["p50"]),
                    ("cpu_mean", &s["cpu_ms"]["mean"]),
                    ("start_cmd_p50", &s["phases_ms"]["start_cmd"]["p50"]),
                ] {
                    tsv.push_str(&format!("{name}\t{key}\t{v}\n"));
                }
            }
            std::fs::write(path, tsv).with_context(|| format!("write {}", path.display()))?;
        }
        println!("{}", serde_json::to_string_pretty(&out)?);
        Ok::<_, anyhow::Error>(())
    })
}
