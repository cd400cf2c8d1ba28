//! Soak driver (run by `scripts/soak.sh`): N cycles of container lifecycles through gantry, with
//! leak accounting. Each cycle:
//!   - through containerd (`ctr`): run -d, exec, SIGKILL, delete;
//!   - CRI-O style (`start` with `-address ""` and an empty TTRPC_ADDRESS, then ttrpc): a pod of
//!     two containers in one daemon (sandbox + app), an exec in the app, kill, Wait, Delete and
//!     Shutdown of both, until the daemon exits;
//!   - an exec in one long-lived CRI-O pod that lives through the whole soak.
//!
//! It samples, after the first cycle (warm), at the middle and at the end: the long-lived
//! daemon's fds, threads and anonymous RSS; the node's mounts, cgroup directories, zombies, entries in the
//! socket directory, files under the runtime root and bundles. It prints one table and exits
//! non-zero when anything grew beyond its stated noise bound.
//!
//!   soak --cycles N --shim PATH --config GANTRY_TOML --address CONTAINERD_SOCK --namespace NS
//!        --image REF --rootfs DIR --workdir DIR --socket-dir DIR --runtime-root DIR --state DIR

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail, Context, Result};
use containerd_shim_protos::api::{
    CreateTaskRequest, DeleteRequest, ExecProcessRequest, KillRequest, ShutdownRequest, StartRequest, WaitRequest,
};
use containerd_shim_protos::shim_async::TaskClient;
use serde_json::{json, Value};

struct Args {
    cycles: usize,
    shim: PathBuf,
    config: PathBuf,
    address: PathBuf,
    namespace: String,
    image: String,
    rootfs: PathBuf,
    workdir: PathBuf,
    socket_dir: PathBuf,
    runtime_root: PathBuf,
    state: PathBuf,
}

fn parse_args() -> Result<Args> {
    let mut it = std::env::args().skip(1);
    let mut get = std::collections::HashMap::new();
    while let Some(k) = it.next() {
        let v = it.next().ok_or_else(|| anyhow!("{k} needs a value"))?;
        get.insert(k.trim_start_matches('-').to_string(), v);
    }
    let mut take = |k: &str| get.remove(k).ok_or_else(|| anyhow!("--{k} is required"));
    Ok(Args {
        cycles: take("cycles")?.parse()?,
        shim: take("shim")?.into(),
        config: take("config")?.into(),
        address: take("address")?.into(),
        namespace: take("namespace")?,
        image: take("image")?,
        rootfs: take("rootfs")?.into(),
        workdir: take("workdir")?.into(),
        socket_dir: take("socket-dir")?.into(),
        runtime_root: take("runtime-root")?.into(),
        state: take("state")?.into(),
    })
}

/// One sample of everything that must not grow.
#[derive(Clone, Default)]
struct Sample {
    values: Vec<(&'static str, i64, i64)>,
}

fn count_dirs(root: &Path) -> i64 {
    let mut n = 0;
    for e in std::fs::read_dir(root).into_iter().flatten().flatten() {
        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            n += 1 + count_dirs(&e.path());
        }
    }
    n
}

fn count_entries(root: &Path) -> i64 {
    let mut n = 0;
    for e in std::fs::read_dir(root).into_iter().flatten().flatten() {
        n += 1;
        if e.file_type().map(|t| t.is_dir()).unwrap_or(false) {
            n += count_entries(&e.path());
        }
    }
    n
}

fn status_field(pid: i32, field: &str) -> i64 {
    let text = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    text.lines()
        .find(|l| l.starts_with(field))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
        .unwrap_or(-1)
}

/// Zombies gantry or this driver is answerable for: children of a gantry daemon or of the
/// driver (a subreaper, so pod daemons whose `start` exited are its children).
fn zombies() -> i64 {
    let me = std::process::id() as i32;
    let mut procs = Vec::new();
    for e in std::fs::read_dir("/proc").into_iter().flatten().flatten() {
        let Ok(pid) = e.file_name().to_string_lossy().parse::<i32>() else {
            continue;
        };
        let stat = std::fs::read_to_string(e.path().join("stat")).unwrap_or_default();
        let Some((head, rest)) = stat.rsplit_once(')') else {
            continue;
        };
        let mut f = rest.split_whitespace();
        let (state, ppid) = (
            f.next().unwrap_or(""),
            f.next().and_then(|p| p.parse::<i32>().ok()).unwrap_or(0),
        );
        let gantry = head.ends_with("containerd-shim");
        procs.push((pid, state == "Z", ppid, gantry));
    }
    let ours: std::collections::HashSet<i32> = procs.iter().filter(|p| p.3).map(|p| p.0).chain([me]).collect();
    procs.iter().filter(|p| p.1 && ours.contains(&p.2)).count() as i64
}

/// Reaps exited children (pod daemons reparented to this subreaper); only between cycles,
/// when no `ctr` or `start` the driver waits for is running.
fn reap() {
    use nix::sys::wait::{waitpid, WaitPidFlag, WaitStatus};
    while let Ok(s) = waitpid(nix::unistd::Pid::from_raw(-1), Some(WaitPidFlag::WNOHANG)) {
        if s == WaitStatus::StillAlive {
            break;
        }
    }
}

fn sample(a: &Args, daemon: i32) -> Sample {
    let fds = std::fs::read_dir(format!("/proc/{daemon}/fd"))
        .map(|d| d.count() as i64)
        .unwrap_or(-1);
    let mounts = std::fs::read_to_string("/proc/self/mountinfo")
        .unwrap_or_default()
        .lines()
        .count() as i64;
    let cgroups: i64 = [
        "memory",
        "pids",
        "cpu,cpuacct",
        "devices",
        "freezer",
        "blkio",
        "hugetlb",
        "unified",
    ]
    .iter()
    .map(|c| count_dirs(&Path::new("/sys/fs/cgroup").join(c).join(&a.namespace)))
    .sum();
    let tasks = a.state.join("io.containerd.runtime.v2.task").join(&a.namespace);
    Sample {
        values: vec![
            ("daemon fds", fds, 2),
            ("daemon threads", status_field(daemon, "Threads:"), 0),
            // Anonymous only: the executable's mapped pages rise and fall with the daemon's
            // settling (src/settle.rs), a leak shows in the heap.
            ("daemon anon RSS [KiB]", status_field(daemon, "RssAnon:"), 1024),
            ("node mounts", mounts, 0),
            ("cgroup directories", cgroups, 0),
            ("zombies", zombies(), 0),
            ("socket dir entries", count_entries(&a.socket_dir), 0),
            ("runtime root files", count_entries(&a.runtime_root), 0),
            ("bundles (containerd)", count_entries(&tasks), 0),
            ("bundles (CRI-O style)", count_entries(&a.workdir.join("bundles")), 0),
        ],
    }
}

fn ctr(a: &Args, args: &[&str]) -> Result<String> {
    let o = Command::new("ctr")
        .arg("--address")
        .arg(&a.address)
        .args(["-n", &a.namespace])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .context("ctr")?;
    if !o.status.success() {
        bail!("ctr {args:?}: {}", String::from_utf8_lossy(&o.stderr).trim());
    }
    Ok(String::from_utf8_lossy(&o.stdout).into_owned())
}

/// run -d, exec, SIGKILL, delete through containerd.
fn containerd_cycle(a: &Args, i: usize) -> Result<()> {
    let id = format!("soak-c{i}");
    let config = a.config.to_string_lossy().into_owned();
    ctr(
        a,
        &[
            "run",
            "-d",
            "--runtime",
            "io.containerd.gantry.v2",
            "--runtime-config-path",
            &config,
            &a.image,
            &id,
            "sleep",
            "1000",
        ],
    )?;
    ctr(a, &["task", "exec", "--exec-id", "e", &id, "true"])?;
    ctr(a, &["task", "kill", "-s", "SIGKILL", &id])?;
    let end = Instant::now() + Duration::from_secs(10);
    while ctr(a, &["task", "delete", &id]).is_err() {
        if Instant::now() > end {
            bail!("task {id} never stopped");
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    ctr(a, &["container", "delete", &id])?;
    Ok(())
}

fn ctx() -> ttrpc::context::Context {
    ttrpc::context::with_timeout(Duration::from_secs(60).as_nanos() as i64)
}

struct Crio<'a> {
    a: &'a Args,
    template: Value,
}

impl Crio<'_> {
    /// A CRI-O-style bundle (absolute rootfs, CRI-O annotations, stdout FIFO held open).
    fn bundle(&self, id: &str, sandbox: &str, args: &[&str]) -> Result<(PathBuf, std::fs::File)> {
        let dir = self.a.workdir.join("bundles").join(id);
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir)?;
        let mut spec = self.template.clone();
        spec["process"]["terminal"] = false.into();
        spec["process"]["args"] = json!(args);
        spec["root"] = json!({"path": self.a.rootfs, "readonly": true});
        spec["linux"]["cgroupsPath"] = format!("/{}/{id}", self.a.namespace).into();
        let kind = if id == sandbox { "sandbox" } else { "container" };
        spec["annotations"] =
            json!({"io.kubernetes.cri-o.SandboxID": sandbox, "io.kubernetes.cri-o.ContainerType": kind});
        std::fs::write(dir.join("config.json"), serde_json::to_vec(&spec)?)?;
        nix::unistd::mkfifo(&dir.join("stdout"), nix::sys::stat::Mode::from_bits_truncate(0o600))?;
        use std::os::unix::fs::OpenOptionsExt;
        let reader = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NONBLOCK)
            .open(dir.join("stdout"))?;
        Ok((dir, reader))
    }

    fn start(&self, dir: &Path, id: &str) -> Result<String> {
        let o = Command::new(&self.a.shim)
            .args([
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
            .current_dir(dir)
            .env("TTRPC_ADDRESS", "")
            .env("GANTRY_CONFIG", &self.a.config)
            .stdin(Stdio::null())
            .output()?;
        if !o.status.success() {
            bail!("start {id}: {}", String::from_utf8_lossy(&o.stderr));
        }
        Ok(String::from_utf8(o.stdout)?)
    }

    async fn create_start(&self, c: &TaskClient, id: &str, dir: &Path) -> Result<()> {
        let req = CreateTaskRequest {
            id: id.into(),
            bundle: dir.to_string_lossy().into_owned(),
            stdout: dir.join("stdout").to_string_lossy().into_owned(),
            ..Default::default()
        };
        c.create(ctx(), &req).await.map_err(|e| anyhow!("create {id}: {e:?}"))?;
        let start = StartRequest {
            id: id.into(),
            ..Default::default()
        };
        c.start(ctx(), &start).await.map_err(|e| anyhow!("start {id}: {e:?}"))?;
        Ok(())
    }

    async fn exec(&self, c: &TaskClient, id: &str, exec_id: &str) -> Result<()> {
        let process = json!({"args": ["true"], "cwd": "/", "user": {"uid": 0, "gid": 0}, "env": ["PATH=/bin"]});
        let mut spec = protobuf::well_known_types::any::Any::new();
        spec.type_url = "types.containerd.io/opencontainers/runtime-spec/1/Process".into();
        spec.value = serde_json::to_vec(&process)?;
        let req = ExecProcessRequest {
            id: id.into(),
            exec_id: exec_id.into(),
            spec: protobuf::MessageField::some(spec),
            ..Default::default()
        };
        c.exec(ctx(), &req).await.map_err(|e| anyhow!("exec {id}: {e:?}"))?;
        let start = StartRequest {
            id: id.into(),
            exec_id: exec_id.into(),
            ..Default::default()
        };
        c.start(ctx(), &start)
            .await
            .map_err(|e| anyhow!("exec start {id}: {e:?}"))?;
        let wait = WaitRequest {
            id: id.into(),
            exec_id: exec_id.into(),
            ..Default::default()
        };
        let w = c
            .wait(ctx(), &wait)
            .await
            .map_err(|e| anyhow!("exec wait {id}: {e:?}"))?;
        if w.exit_status != 0 {
            bail!("exec in {id} exited {}", w.exit_status);
        }
        let del = DeleteRequest {
            id: id.into(),
            exec_id: exec_id.into(),
            ..Default::default()
        };
        c.delete(ctx(), &del)
            .await
            .map_err(|e| anyhow!("exec delete {id}: {e:?}"))?;
        Ok(())
    }

    async fn remove(&self, c: &TaskClient, id: &str) -> Result<()> {
        let kill = KillRequest {
            id: id.into(),
            signal: 9,
            ..Default::default()
        };
        c.kill(ctx(), &kill).await.map_err(|e| anyhow!("kill {id}: {e:?}"))?;
        let wait = WaitRequest {
            id: id.into(),
            ..Default::default()
        };
        c.wait(ctx(), &wait).await.map_err(|e| anyhow!("wait {id}: {e:?}"))?;
        let del = DeleteRequest {
            id: id.into(),
            ..Default::default()
        };
        c.delete(ctx(), &del).await.map_err(|e| anyhow!("delete {id}: {e:?}"))?;
        let shutdown = ShutdownRequest {
            id: id.into(),
            ..Default::default()
        };
        c.shutdown(ctx(), &shutdown)
            .await
            .map_err(|e| anyhow!("shutdown {id}: {e:?}"))?;
        Ok(())
    }

    /// A two-container pod: start, exec in the app, tear both down, wait for the daemon's exit.
    async fn pod_cycle(&self, i: usize) -> Result<()> {
        let (sandbox, app) = (format!("soak-p{i}"), format!("soak-a{i}"));
        let (sdir, _r1) = self.bundle(&sandbox, &sandbox, &["sleep", "1000"])?;
        let (adir, _r2) = self.bundle(&app, &sandbox, &["sleep", "1000"])?;
        let address = self.start(&sdir, &sandbox)?;
        if self.start(&adir, &app)? != address {
            bail!("the pod's two containers got two daemons");
        }
        let daemon: i32 = std::fs::read_to_string(sdir.join("shim.pid"))?.trim().parse()?;
        let c = TaskClient::new(ttrpc::asynchronous::Client::connect(&address).await?);
        self.create_start(&c, &sandbox, &sdir).await?;
        self.create_start(&c, &app, &adir).await?;
        self.exec(&c, &app, "e").await?;
        self.remove(&c, &app).await?;
        self.remove(&c, &sandbox).await?;
        drop(c);
        let end = Instant::now() + Duration::from_secs(10);
        while Path::new(&format!("/proc/{daemon}")).exists() && zombie_or_alive(daemon) {
            if Instant::now() > end {
                bail!("pod daemon {daemon} did not exit");
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        std::fs::remove_dir_all(&sdir)?;
        std::fs::remove_dir_all(&adir)?;
        Ok(())
    }
}

fn zombie_or_alive(pid: i32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    !stat.is_empty() && stat.rsplit_once(')').and_then(|(_, r)| r.split_whitespace().next()) != Some("Z")
}

fn print_table(samples: &[(String, Sample)]) -> bool {
    let mut ok = true;
    println!(
        "{:<24} {:>10} {:>10} {:>10} {:>8} {:>6}  verdict",
        "resource", &samples[0].0, &samples[1].0, &samples[2].0, "growth", "bound"
    );
    for (i, (name, _, bound)) in samples[0].1.values.iter().enumerate() {
        let v: Vec<i64> = samples.iter().map(|(_, s)| s.values[i].1).collect();
        let growth = v[2] - v[0];
        let pass = growth <= *bound;
        ok &= pass;
        println!(
            "{name:<24} {:>10} {:>10} {:>10} {growth:>+8} {bound:>6}  {}",
            v[0],
            v[1],
            v[2],
            if pass { "ok" } else { "GREW" }
        );
    }
    ok
}

fn main() -> Result<()> {
    let a = parse_args()?;
    // Pod daemons outlive the `start` that forked them; as on a node (containerd and CRI-O are
    // subreapers), their exits come back here to be reaped.
    // SAFETY: prctl(PR_SET_CHILD_SUBREAPER) has no memory-safety preconditions.
    unsafe { libc::prctl(libc::PR_SET_CHILD_SUBREAPER, 1) };
    std::fs::create_dir_all(a.workdir.join("bundles"))?;
    let tmpl_dir = a.workdir.join("template");
    std::fs::create_dir_all(&tmpl_dir)?;
    let o = Command::new("runc")
        .args(["spec", "--bundle"])
        .arg(&tmpl_dir)
        .output()?;
    if !o.status.success() {
        bail!("runc spec failed");
    }
    let template: Value = serde_json::from_slice(&std::fs::read(tmpl_dir.join("config.json"))?)?;
    std::fs::remove_dir_all(&tmpl_dir)?;
    let crio = Crio { a: &a, template };
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(async {
        let (ldir, _lr) = crio.bundle("soak-long", "soak-long", &["sleep", "100000"])?;
        let address = crio.start(&ldir, "soak-long")?;
        let long = TaskClient::new(ttrpc::asynchronous::Client::connect(&address).await?);
        crio.create_start(&long, "soak-long", &ldir).await?;
        let daemon: i32 = std::fs::read_to_string(ldir.join("shim.pid"))?.trim().parse()?;
        let started = Instant::now();
        let mut samples = Vec::new();
        for i in 0..a.cycles {
            containerd_cycle(&a, i).with_context(|| format!("cycle {i}, containerd"))?;
            crio.pod_cycle(i).await.with_context(|| format!("cycle {i}, CRI-O-style pod"))?;
            crio.exec(&long, "soak-long", &format!("x{i}")).await.with_context(|| format!("cycle {i}, long-lived exec"))?;
            reap();
            if i == 0 || i == a.cycles / 2 || i + 1 == a.cycles {
                // Reaped exits and freed memory settle first.
                tokio::time::sleep(Duration::from_millis(300)).await;
                let label = if i == 0 { "warm".to_string() } else { format!("cycle {}", i + 1) };
                samples.push((label, sample(&a, daemon)));
            }
        }
        println!("soak: {} cycles in {:.0} s (each: containerd run/exec/kill/delete, a two-container CRI-O-style pod with an exec, an exec in the long-lived pod)", a.cycles, started.elapsed().as_secs_f64());
        while samples.len() < 3 {
            samples.push(samples[samples.len() - 1].clone());
        }
        let ok = print_table(&samples);
        crio.remove(&long, "soak-long").await?;
        if !ok {
            bail!("resources grew beyond their bounds");
        }
        Ok(())
    })
}
