//! The sandbox fast path: a pause container started by gantry's own init is, field by field,
//! what runc makes of the same spec; its lifecycle works through the Task API as CRI-O drives
//! it; anything the fast path does not handle goes to runc; nothing is left behind.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use containerd_shim_protos::api::{ExecProcessRequest, Status};

#[path = "sandbox_systemd.rs"]
mod systemd;

use crate::common::task::{process_any, task};
use crate::common::{
    assert_clean, code, crio_bundle, crio_create_req, crio_remove, crio_start, ctx, env, message, open_fifo_reader,
    run, task_client, text, wait_until, CrioBundle, Ns, SHIM,
};

/// A rootfs with the busybox tools and the test pause program at /pause, shared by the tests
/// (read-only in their specs).
fn pause_rootfs() -> PathBuf {
    static ROOTFS: std::sync::Mutex<()> = std::sync::Mutex::new(());
    let _one = ROOTFS.lock().unwrap_or_else(|p| p.into_inner());
    let rootfs = env().dir.join("pause-rootfs");
    if rootfs.join("pause").exists() {
        return rootfs;
    }
    let o = run(Command::new("cp").arg("-a").arg(&env().rootfs).arg(&rootfs));
    assert!(o.status.success(), "{}", text(&o));
    // GANTRY_PAUSE_BIN: built beforehand (the node lane's guest has no compiler).
    if let Some(built) = std::env::var_os("GANTRY_PAUSE_BIN") {
        std::fs::copy(built, rootfs.join("pause")).unwrap();
        return rootfs;
    }
    let src = Path::new(env!("CARGO_MANIFEST_DIR")).join("integration/fixtures/pause.c");
    let o = run(Command::new("cc")
        .args(["-static", "-Os", "-o"])
        .arg(rootfs.join("pause"))
        .arg(src));
    assert!(o.status.success(), "cc pause.c: {}", text(&o));
    rootfs
}

/// Network, IPC and UTS namespaces pinned to files, as CRI-O's pinns leaves them.
struct Pinned {
    files: Vec<PathBuf>,
}

impl Pinned {
    fn new(dir: &Path) -> Pinned {
        let dir = dir.join("pinned");
        std::fs::create_dir_all(&dir).unwrap();
        let files: Vec<PathBuf> = ["net", "ipc", "uts"].iter().map(|n| dir.join(n)).collect();
        for f in &files {
            std::fs::write(f, "").unwrap();
        }
        let o = run(Command::new("unshare")
            .arg(format!("--net={}", files[0].display()))
            .arg(format!("--ipc={}", files[1].display()))
            .arg(format!("--uts={}", files[2].display()))
            .arg("true"));
        assert!(o.status.success(), "unshare: {}", text(&o));
        Pinned { files }
    }
}

impl Drop for Pinned {
    fn drop(&mut self) {
        for f in &self.files {
            let _ = nix::mount::umount2(f, nix::mount::MntFlags::MNT_DETACH);
        }
    }
}

/// gantry's own runtime-default seccomp profile for `caps`.
fn seccomp_profile(caps: &str) -> serde_json::Value {
    let o = run(Command::new(SHIM).args(["seccomp-profile", "--caps", caps]));
    assert!(o.status.success(), "{}", text(&o));
    serde_json::from_slice(&o.stdout).unwrap()
}

/// A pause container's spec shaped like CRI-O's: namespaces joined from pinned files, a new
/// pid and mount namespace, a non-root user, few capabilities, seccomp, limits and sysctls.
fn pause_bundle(ns: &Ns, id: &str, rootfs: &Path, pinned: &Pinned, patch: fn(&mut serde_json::Value)) -> CrioBundle {
    const CAPS: &str = "CAP_CHOWN,CAP_KILL,CAP_NET_BIND_SERVICE";
    let profile = seccomp_profile(CAPS);
    crio_bundle(ns, id, id, &["/pause"], |spec| {
        let caps: Vec<&str> = CAPS.split(',').collect();
        spec["root"]["path"] = rootfs.to_str().unwrap().into();
        spec["hostname"] = "sandbox-host".into();
        spec["process"]["user"] = serde_json::json!({"uid": 65534, "gid": 65534, "additionalGids": [65534, 4]});
        spec["process"]["noNewPrivileges"] = true.into();
        spec["process"]["oomScoreAdj"] = 200.into();
        spec["process"]["capabilities"] = serde_json::json!({
            "bounding": caps, "effective": caps, "permitted": caps, "inheritable": [], "ambient": ["CAP_KILL"]
        });
        let mounts = spec["mounts"].as_array_mut().unwrap();
        mounts.retain(|m| m["type"] != "cgroup");
        let linux = &mut spec["linux"];
        linux["namespaces"] = serde_json::json!([
            {"type": "pid"},
            {"type": "mount"},
            {"type": "network", "path": pinned.files[0]},
            {"type": "ipc", "path": pinned.files[1]},
            {"type": "uts", "path": pinned.files[2]},
        ]);
        linux["sysctl"] =
            serde_json::json!({"net.ipv4.ip_unprivileged_port_start": "0", "kernel.shm_rmid_forced": "1"});
        linux["resources"] = serde_json::json!({
            "devices": [{"allow": false, "access": "rwm"}],
            "memory": {"limit": 64 * 1024 * 1024},
            "cpu": {"shares": 2},
            "pids": {"limit": 100}
        });
        linux["seccomp"] = profile;
        patch(spec);
    })
}

/// What the kernel says about a process, with the container's own names replaced by `ID` so
/// two containers built from the same spec compare equal.
fn observe(pid: u32, id: &str) -> BTreeMap<String, String> {
    let mut seen = BTreeMap::new();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    for line in status.lines() {
        let (k, v) = line.split_once(':').unwrap();
        if k.starts_with("Cap")
            || [
                "NoNewPrivs",
                "Seccomp",
                "Seccomp_filters",
                "Uid",
                "Gid",
                "Groups",
                "Umask",
            ]
            .contains(&k)
        {
            seen.insert(format!("status.{k}"), v.trim().to_string());
        }
    }
    let host_ns = |kind: &str| std::fs::read_link(format!("/proc/self/ns/{kind}")).unwrap();
    for kind in ["pid", "mnt", "net", "ipc", "uts", "cgroup", "user"] {
        let link = std::fs::read_link(format!("/proc/{pid}/ns/{kind}")).unwrap();
        let what = if link == host_ns(kind) {
            "host".to_string()
        } else {
            "own".to_string()
        };
        seen.insert(format!("ns.{kind}"), what);
    }
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    seen.insert("cgroup".into(), cgroup.replace(id, "ID"));
    // The same read from inside its cgroup namespace: where that namespace is rooted.
    let o = run(Command::new("nsenter")
        .args(["-t", &pid.to_string(), "-C", "--", "cat"])
        .arg(format!("/proc/{pid}/cgroup")));
    seen.insert("cgroup.in_ns".into(), text(&o).replace(id, "ID"));
    seen.insert(
        "root".into(),
        std::fs::read_link(format!("/proc/{pid}/root"))
            .unwrap()
            .display()
            .to_string(),
    );
    let mountinfo = std::fs::read_to_string(format!("/proc/{pid}/mountinfo")).unwrap();
    for (i, line) in mountinfo.lines().enumerate() {
        // Drop mount ids and device numbers: they differ between any two mounts.
        let fields: Vec<&str> = line.split(' ').collect();
        let tail = fields[3..].join(" ");
        seen.insert(format!("mount.{i:02}"), tail.replace(id, "ID"));
    }
    for f in ["oom_score_adj", "limits"] {
        seen.insert(f.into(), std::fs::read_to_string(format!("/proc/{pid}/{f}")).unwrap());
    }
    let cmdline = std::fs::read(format!("/proc/{pid}/cmdline")).unwrap();
    seen.insert("cmdline".into(), String::from_utf8_lossy(&cmdline).into_owned());
    let environ = std::fs::read(format!("/proc/{pid}/environ")).unwrap();
    seen.insert("environ".into(), String::from_utf8_lossy(&environ).into_owned());
    for (key, cmd) in [
        ("hostname", vec!["hostname"]),
        (
            "sysctl.port",
            vec!["cat", "/proc/sys/net/ipv4/ip_unprivileged_port_start"],
        ),
        ("sysctl.shm", vec!["cat", "/proc/sys/kernel/shm_rmid_forced"]),
        ("dev", vec!["ls", "-ln", "/dev"]),
    ] {
        let o = run(Command::new("nsenter")
            .args(["-t", &pid.to_string(), "-m", "-u", "-n", "-i", "-p", "--"])
            .args(cmd));
        let out = text(&o);
        seen.insert(key.into(), if key == "dev" { without_times(&out) } else { out });
    }
    let cg = |c: &str| crate::common::cri::cgroup_dir(pid, c);
    let files: &[(&str, &str)] = if crate::common::cri::cgroup_v2() {
        &[
            ("memory", "memory.max"),
            ("cpu", "cpu.weight"),
            ("cpu", "cpu.max"),
            ("pids", "pids.max"),
            ("", "cgroup.subtree_control"),
        ]
    } else {
        &[
            ("devices", "devices.list"),
            ("memory", "memory.limit_in_bytes"),
            ("cpu", "cpu.shares"),
            ("pids", "pids.max"),
        ]
    };
    for &(c, f) in files {
        seen.insert(
            format!("cgroup.{f}"),
            std::fs::read_to_string(cg(c).join(f)).unwrap_or_default(),
        );
    }
    seen
}

/// `ls -l` output without its modification times ("Dec  2 01:03"): two containers started a
/// minute boundary apart (a slow machine) must still compare equal.
fn without_times(listing: &str) -> String {
    let clock = |t: &str| t.len() == 5 && t.as_bytes()[2] == b':';
    listing
        .lines()
        .map(|l| {
            let words: Vec<&str> = l.split_whitespace().collect();
            match words.iter().position(|w| clock(w)) {
                Some(i) if i >= 2 => [&words[..i - 2], &words[i + 1..]].concat().join(" "),
                _ => words.join(" "),
            }
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// Starts one pause container CRI-O-style (start, Create, Start); returns the client and pid.
async fn start_pause(ns: &Ns, b: &CrioBundle) -> (containerd_shim_protos::shim_async::TaskClient, u32) {
    run_pause(crio_start(ns, &b.dir, &b.id, b""), b).await
}

/// `start` as CRI-O runs it, in a mount namespace of its own where /sys/fs/cgroup is the
/// cgroup2 hierarchy: the daemon it leaves, and the runc it runs, see a cgroup v2 host.
fn v2_start(ns: &Ns, b: &CrioBundle) -> std::process::Output {
    let mut unshare = Command::new("unshare");
    unshare.args([
        "-m",
        "--propagation",
        "private",
        "sh",
        "-c",
        "mount -t cgroup2 none /sys/fs/cgroup && exec \"$@\"",
        "sh",
    ]);
    start_through(unshare, ns, b)
}

/// `start` as CRI-O runs it (program, arguments, environment, bundle as working directory),
/// appended to `wrapper`, a command that runs it somewhere else.
fn start_through(mut wrapper: Command, ns: &Ns, b: &CrioBundle) -> std::process::Output {
    let cmd = crate::common::crio_start_cmd(ns, &b.dir, &b.id);
    wrapper
        .arg(cmd.get_program())
        .args(cmd.get_args())
        .current_dir(&b.dir)
        .stdin(std::process::Stdio::null());
    for (k, v) in cmd.get_envs() {
        if let Some(v) = v {
            wrapper.env(k, v);
        }
    }
    run(&mut wrapper)
}

/// Asserts two observations of pause containers are the same, naming every field that is not.
fn assert_same(what: &str, a: &BTreeMap<String, String>, b: &BTreeMap<String, String>) {
    let differences: Vec<String> = a
        .keys()
        .chain(b.keys())
        .collect::<std::collections::BTreeSet<_>>()
        .into_iter()
        .filter(|k| a.get(*k) != b.get(*k))
        .map(|k| format!("{k}:\n  fast path: {:?}\n  runc:      {:?}", a.get(k), b.get(k)))
        .collect();
    assert!(
        differences.is_empty(),
        "{what}: differences:\n{}",
        differences.join("\n")
    );
}

async fn run_pause(o: std::process::Output, b: &CrioBundle) -> (containerd_shim_protos::shim_async::TaskClient, u32) {
    assert!(o.status.success(), "{}", text(&o));
    let client = task_client(&String::from_utf8(o.stdout).unwrap()).await;
    let _out = open_fifo_reader(&b.stdout);
    let created = client.create(ctx(), &crio_create_req(b)).await.unwrap();
    task(&client, &b.id).start().await.unwrap();
    // Started means the init has been released; the exec of /pause follows at once.
    let pid = created.pid;
    assert!(wait_until(Duration::from_secs(30), || {
        std::fs::read(format!("/proc/{pid}/cmdline")).is_ok_and(|c| c.starts_with(b"/pause"))
    }));
    (client, pid)
}

/// A pause spec for a v2 view of this VM, whose controllers belong to v1: device rules only
/// among the resources, and a cgroup namespace of its own.
fn v2_only(spec: &mut serde_json::Value) {
    spec["linux"]["resources"] = serde_json::json!({"devices": [{"allow": false, "access": "rwm"}]});
    spec["linux"]["namespaces"]
        .as_array_mut()
        .unwrap()
        .push(serde_json::json!({"type": "cgroup"}));
}

fn started_by(ns: &Ns, id: &str) -> &'static str {
    if ns.runtime_root.join("default").join(id).exists() {
        "runc"
    } else {
        "fast path"
    }
}

/// Starts the same pause spec through the fast path and through runc and compares what the
/// kernel shows of the two processes; then SIGTERM ends both with status 0.
async fn compare_with_runc(variant: &str, patch: fn(&mut serde_json::Value)) -> BTreeMap<String, String> {
    let env = env();
    let fast_ns = env.namespace(&format!("sbx-fast-{variant}"));
    let runc_ns = env.namespace_with(&format!("sbx-runc-{variant}"), "[runtime]\nsandbox_fast_path = false\n");
    let rootfs = pause_rootfs();
    let pinned = Pinned::new(&fast_ns.dir);
    let fast = pause_bundle(&fast_ns, "pf1", &rootfs, &pinned, patch);
    let slow = pause_bundle(&runc_ns, "pr1", &rootfs, &pinned, patch);

    let (fast_client, fast_pid) = start_pause(&fast_ns, &fast).await;
    let (runc_client, runc_pid) = start_pause(&runc_ns, &slow).await;
    assert_eq!(started_by(&fast_ns, "pf1"), "fast path");
    assert_eq!(started_by(&runc_ns, "pr1"), "runc");

    let seen = |pid, id, ns: &Ns| -> BTreeMap<String, String> {
        observe(pid, id)
            .into_iter()
            .map(|(k, v)| (k, v.replace(&ns.name, "NS")))
            .collect()
    };
    let (a, b) = (seen(fast_pid, "pf1", &fast_ns), seen(runc_pid, "pr1", &runc_ns));
    if std::env::var_os("GANTRY_SHOW_OBSERVED").is_some() {
        eprintln!("{a:#?}");
    }
    assert_same(variant, &a, &b);

    for (client, id) in [(fast_client, "pf1"), (runc_client, "pr1")] {
        let t = task(&client, id);
        t.kill(15).await.unwrap();
        let waited = t.wait().await.unwrap();
        assert_eq!(waited.exit_status, 0, "{id}: pause exits 0 on SIGTERM");
        crio_remove(&client, id).await;
    }
    drop(pinned);
    assert_clean(env, &fast_ns);
    assert_clean(env, &runc_ns);
    a
}

/// CRI-O's shape: a non-root user, no_new_privs (seccomp loaded last), few capabilities.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_path_pause_matches_runc_field_by_field() {
    let a = compare_with_runc("user", |_| {}).await;
    // The fields that matter were really applied, not merely equal.
    assert_eq!(a["status.NoNewPrivs"], "1");
    assert_eq!(a["status.Seccomp"], "2");
    assert_eq!(a["status.CapBnd"], "0000000000000421");
    assert_eq!(a["status.Uid"], "65534\t65534\t65534\t65534");
    assert_eq!(
        (a["ns.pid"].as_str(), a["ns.net"].as_str(), a["ns.mnt"].as_str()),
        ("own", "own", "own")
    );
    assert!(a["hostname"].contains("stdout=sandbox-host\n"), "{}", a["hostname"]);
    assert!(a["sysctl.port"].contains("stdout=0\n"), "{}", a["sysctl.port"]);
    assert!(a.keys().filter(|k| k.starts_with("mount.")).count() > 10, "{a:?}");
    assert!(a["cgroup"].contains(":/NS/ID"), "{}", a["cgroup"]);
    // The spec's limits were applied, on either cgroup version (v2: shares 2 is weight 1).
    let (memory, cpu, cpu_value) = if crate::common::cri::cgroup_v2() {
        ("cgroup.memory.max", "cgroup.cpu.weight", "1\n")
    } else {
        ("cgroup.memory.limit_in_bytes", "cgroup.cpu.shares", "2\n")
    };
    assert_eq!(a[memory], "67108864\n");
    assert_eq!(a[cpu], cpu_value);
    assert_eq!(a["cgroup.pids.max"], "100\n");
    // v1 device rules are files; on v2 they are an eBPF filter, which
    // fast_path_on_cgroup_v2_matches_runc probes device by device.
    if !crate::common::cri::cgroup_v2() {
        assert!(
            a["cgroup.devices.list"].starts_with("b *:* m\nc *:* m\nc 1:3 rwm"),
            "{}",
            a["cgroup.devices.list"]
        );
    }
    assert_eq!(a["oom_score_adj"], "200\n");
}

/// containerd's shape: root with runc's default capabilities, seccomp loaded before the
/// capabilities are set (no no_new_privs), ambient capabilities, a writable rootfs, a masked
/// path that does not exist, and a new cgroup namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_path_root_pause_matches_runc_field_by_field() {
    let a = compare_with_runc("root", |spec| {
        let caps = serde_json::json!(["CAP_CHOWN", "CAP_KILL", "CAP_NET_RAW", "CAP_SETUID", "CAP_SETGID"]);
        spec["process"]["user"] = serde_json::json!({"uid": 0, "gid": 0, "umask": 63});
        spec["process"]["noNewPrivileges"] = false.into();
        spec["process"]["capabilities"] = serde_json::json!({
            "bounding": caps, "effective": caps, "permitted": caps, "inheritable": caps, "ambient": ["CAP_NET_RAW"]
        });
        spec["root"]["readonly"] = false.into();
        spec["linux"]["maskedPaths"]
            .as_array_mut()
            .unwrap()
            .push("/no/such/path".into());
        spec["linux"]["namespaces"]
            .as_array_mut()
            .unwrap()
            .push(serde_json::json!({"type": "cgroup"}));
    })
    .await;
    assert_eq!(a["status.NoNewPrivs"], "0");
    assert_eq!(a["status.Seccomp"], "2");
    assert_eq!(a["status.CapEff"], a["status.CapBnd"]);
    assert_ne!(a["status.CapAmb"], "0000000000000000");
    assert_eq!(a["status.Umask"], "0077");
    assert_eq!(a["ns.cgroup"], "own");
    assert!(rooted_at_container(&a["cgroup.in_ns"]), "{}", a["cgroup.in_ns"]);
}

/// Whether a `/proc/<pid>/cgroup` read from inside the process's cgroup namespace (as
/// [`observe`] keeps it) shows it at the namespace's root in every hierarchy: the namespace
/// was created once the process was in all of its cgroups.
fn rooted_at_container(seen: &str) -> bool {
    let lines: Vec<&str> = seen
        .lines()
        .map(|l| l.trim_start_matches("stdout="))
        .filter(|l| l.split(':').count() == 3 && l.starts_with(|c: char| c.is_ascii_digit()))
        .collect();
    seen.starts_with("status=Some(0)")
        && lines.iter().any(|l| l.starts_with("0::"))
        && lines.iter().all(|l| l.ends_with(":/"))
}

/// State, Stats, Pause/Resume, an app container joining the pause container's pid namespace,
/// exec into that app container, refusals for what a fast-path sandbox cannot do, and the
/// exit reported on SIGKILL.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_path_sandbox_lifecycle_and_pod_members() {
    let env = env();
    let ns = env.namespace("sandbox-life");
    let rootfs = pause_rootfs();
    let pinned = Pinned::new(&ns.dir);
    let pause = pause_bundle(&ns, "pl1", &rootfs, &pinned, |_| {});
    let (client, pid) = start_pause(&ns, &pause).await;
    assert_eq!(started_by(&ns, "pl1"), "fast path");
    // The hostname is set in the pinned UTS namespace it joined, as runc sets it.
    let o = run(Command::new("nsenter")
        .arg(format!("--uts={}", pinned.files[2].display()))
        .arg("hostname"));
    assert_eq!(String::from_utf8_lossy(&o.stdout), "sandbox-host\n", "{}", text(&o));
    let pl1 = task(&client, "pl1");
    let state = pl1.state().await.unwrap();
    assert_eq!((state.status.enum_value().unwrap(), state.pid), (Status::RUNNING, pid));
    let stats = pl1.stats().await.unwrap();
    let metrics = if crate::common::cri::cgroup_v2() { "v2" } else { "v1" };
    assert_eq!(stats.stats.type_url, format!("io.containerd.cgroups.{metrics}.Metrics"));
    pl1.pause().await.unwrap();
    // v1 freezer.state, or v2 cgroup.freeze.
    let v2 = crate::common::cri::cgroup_v2();
    let (file, frozen, thawed) = if v2 {
        ("cgroup.freeze", "1", "0")
    } else {
        ("freezer.state", "FROZEN", "THAWED")
    };
    let freezer = crate::common::cri::cgroup_dir(pid, "freezer").join(file);
    assert_eq!(std::fs::read_to_string(&freezer).unwrap().trim(), frozen);
    pl1.resume().await.unwrap();
    assert_eq!(std::fs::read_to_string(&freezer).unwrap().trim(), thawed);

    // A restarted CRI-O reconnects from the bundle's `address` file and rebuilds the sandbox
    // from State: the same daemon answers, with the pid, status and stdio paths.
    let address = std::fs::read_to_string(pause.dir.join("address")).unwrap();
    let again = task_client(&address).await;
    let state = task(&again, "pl1").state().await.unwrap();
    assert_eq!((state.status.enum_value().unwrap(), state.pid), (Status::RUNNING, pid));
    assert_eq!(state.stdout, pause.stdout.to_str().unwrap());
    drop(again);

    // An app container of the pod joins the pause container's namespaces, through runc.
    let app = crio_bundle(&ns, "pa1", "pl1", &["sleep", "600"], |spec| {
        spec["linux"]["namespaces"] = serde_json::json!([
            {"type": "pid", "path": format!("/proc/{pid}/ns/pid")},
            {"type": "mount"},
            {"type": "network", "path": pinned.files[0]},
            {"type": "ipc", "path": pinned.files[1]},
            {"type": "uts", "path": pinned.files[2]},
        ]);
    });
    let o = crio_start(&ns, &app.dir, "pa1", b"");
    assert!(o.status.success(), "{}", text(&o));
    let _app_out = open_fifo_reader(&app.stdout);
    client.create(ctx(), &crio_create_req(&app)).await.unwrap();
    let pa1 = task(&client, "pa1");
    pa1.start().await.unwrap();
    let exec_out = ns.dir.join("exec-out");
    nix::unistd::mkfifo(&exec_out, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
    let mut reader = open_fifo_reader(&exec_out);
    let process = serde_json::json!({"args": ["cat", "/proc/1/cmdline"], "cwd": "/", "env": ["PATH=/bin"], "user": {"uid": 0, "gid": 0}});
    let e1 = pa1.exec("e1");
    let mut exec = e1.exec_request(Some(process_any(process)));
    exec.stdout = exec_out.to_str().unwrap().into();
    client.exec(ctx(), &exec).await.unwrap();
    e1.start().await.unwrap();
    let seen = crate::common::read_fifo(&mut reader, Duration::from_secs(10));
    assert!(
        seen.starts_with("/pause"),
        "pid 1 seen from the app container: {seen:?}"
    );
    // The blocking-pool threads that ran both Creates left no glibc arena of their own behind
    // (the daemon keeps one arena: a thread's would stay resident for the pod's life).
    let daemon = crate::common::daemons_in(&pause.dir)[0];
    let maps = std::fs::read_to_string(format!("/proc/{daemon}/maps")).unwrap();
    let arenas = thread_arenas(&maps);
    assert!(arenas.is_empty(), "daemon {daemon} has thread arenas: {arenas:?}");

    // Exec into the sandbox itself is refused, with the reason.
    let into_pause = ExecProcessRequest {
        id: "pl1".into(),
        exec_id: "e2".into(),
        ..exec.clone()
    };
    let refused = match client.exec(ctx(), &into_pause).await {
        Err(e) => e,
        Ok(_) => pl1.exec("e2").start().await.unwrap_err(),
    };
    assert!(
        message(&refused).contains("fast path"),
        "{:?}: {}",
        code(&refused),
        message(&refused)
    );

    crate::common::crio_kill_and_remove(&client, "pa1").await;
    pl1.kill(9).await.unwrap();
    let waited = pl1.wait().await.unwrap();
    assert_eq!(waited.exit_status, 137);
    crio_remove(&client, "pl1").await;
    drop(pinned);
    assert_clean(env, &ns);
}

/// glibc's per-thread malloc arenas in a maps listing: an anonymous read-write heap at a
/// 64 MiB boundary, the rest of its 64 MiB reserved inaccessible right after it.
fn thread_arenas(maps: &str) -> Vec<&str> {
    const ARENA: u64 = 64 << 20;
    let range = |l: &str| {
        let r = l.split_whitespace().next()?;
        let (a, b) = r.split_once('-')?;
        Some((u64::from_str_radix(a, 16).ok()?, u64::from_str_radix(b, 16).ok()?))
    };
    let anonymous = |l: &str, perms: &str| {
        let f: Vec<&str> = l.split_whitespace().collect();
        f.len() == 5 && f[1] == perms && f[4] == "0"
    };
    let lines: Vec<&str> = maps.lines().collect();
    lines
        .windows(2)
        .filter(|w| {
            let (Some((start, _)), Some((_, reserved_end))) = (range(w[0]), range(w[1])) else {
                return false;
            };
            start % ARENA == 0 && reserved_end == start + ARENA && anonymous(w[0], "rw-p") && anonymous(w[1], "---p")
        })
        .map(|w| w[0])
        .collect()
}

/// What the fast path does not handle goes to runc (a `cgroup` mount here, as in runc's own
/// default spec) and still runs; a pause container whose program is missing fails Create with
/// the reason, as runc's does, leaving no cgroup, process or file behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unhandled_specs_fall_back_and_failures_leave_nothing() {
    let env = env();
    let ns = env.namespace("sandbox-fallback");
    let rootfs = pause_rootfs();
    let pinned = Pinned::new(&ns.dir);
    let b = pause_bundle(&ns, "pc1", &rootfs, &pinned, |spec| {
        let cgroup = serde_json::json!({"destination": "/sys/fs/cgroup", "type": "cgroup", "source": "cgroup",
                                        "options": ["nosuid", "noexec", "nodev", "relatime", "ro"]});
        spec["mounts"].as_array_mut().unwrap().push(cgroup);
    });
    let (client, _pid) = start_pause(&ns, &b).await;
    assert_eq!(started_by(&ns, "pc1"), "runc");
    crate::common::crio_kill_and_remove(&client, "pc1").await;

    let missing = pause_bundle(&ns, "pm1", &rootfs, &pinned, |spec| {
        spec["process"]["args"] = serde_json::json!(["/no/pause"])
    });
    let o = crio_start(&ns, &missing.dir, "pm1", b"");
    assert!(o.status.success(), "{}", text(&o));
    let client = task_client(&String::from_utf8(o.stdout).unwrap()).await;
    let _out = open_fifo_reader(&missing.stdout);
    let e = client.create(ctx(), &crio_create_req(&missing)).await.unwrap_err();
    assert!(message(&e).contains("/no/pause"), "{}", message(&e));
    let left = crate::common::cri::cgroup_dirs(&format!("/{}/pm1", ns.name));
    assert!(left.is_empty(), "cgroup left: {left:?}");
    crate::common::shutdown(&client, "pm1").await;

    // A sysctl outside the container's namespaces would reach the host's kernel: the fast
    // path leaves it to runc, which refuses it.
    let before = std::fs::read_to_string("/proc/sys/kernel/panic").unwrap();
    let host_sysctl = pause_bundle(&ns, "ps1", &rootfs, &pinned, |spec| {
        let other = if std::fs::read_to_string("/proc/sys/kernel/panic").unwrap().trim() == "7" {
            "8"
        } else {
            "7"
        };
        spec["linux"]["sysctl"] = serde_json::json!({"kernel.panic": other});
    });
    let o = crio_start(&ns, &host_sysctl.dir, "ps1", b"");
    assert!(o.status.success(), "{}", text(&o));
    let client = task_client(&String::from_utf8(o.stdout).unwrap()).await;
    let _out = open_fifo_reader(&host_sysctl.stdout);
    let e = client.create(ctx(), &crio_create_req(&host_sysctl)).await.unwrap_err();
    assert!(message(&e).contains("kernel.panic"), "{}", message(&e));
    assert_eq!(std::fs::read_to_string("/proc/sys/kernel/panic").unwrap(), before);
    crate::common::shutdown(&client, "ps1").await;
    drop(pinned);
    assert_clean(env, &ns);
}

/// The daemon SIGKILLed under a running fast-path sandbox: `delete`, as the engine runs it
/// then, kills the pause process and removes its cgroup though no OCI runtime knew it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_after_a_dead_daemon_cleans_a_fast_path_sandbox() {
    let env = env();
    let ns = env.namespace("sandbox-orphan");
    let rootfs = pause_rootfs();
    let pinned = Pinned::new(&ns.dir);
    let b = pause_bundle(&ns, "po1", &rootfs, &pinned, |_| {});
    let (_client, pid) = start_pause(&ns, &b).await;
    assert_eq!(started_by(&ns, "po1"), "fast path");
    let daemon: i32 = std::fs::read_to_string(b.dir.join("shim.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    nix::sys::signal::kill(nix::unistd::Pid::from_raw(daemon), nix::sys::signal::SIGKILL).unwrap();
    let o = run(Command::new(SHIM)
        .args(["-namespace", "default", "-id", "po1", "-bundle"])
        .arg(&b.dir)
        .arg("delete")
        .env("GANTRY_CONFIG", &ns.config));
    assert!(o.status.success(), "{}", text(&o));
    assert!(wait_until(Duration::from_secs(30), || {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).map_or(true, |s| s.contains(") Z"))
    }));
    let left = crate::common::cri::cgroup_dirs(&format!("/{}/po1", ns.name));
    assert!(left.is_empty(), "cgroup left: {left:?}");
    drop(pinned);
    assert_clean(env, &ns);
}

/// Opens devices from inside the container's cgroup (where its device filter applies) and
/// namespaces: /dev/null (runc allows it) and a /dev/kmsg node made there (1:11, not allowed;
/// mknod itself is, `c *:* m`).
fn device_access(pid: u32, v2_cgroup: &Path) -> String {
    let script = format!(
        "echo $$ > {}/cgroup.procs && exec nsenter -t {pid} -m -p sh -c \
         'head -c 1 /dev/null && echo null-ok || echo null-denied; \
          mknod /dev/kmsg-probe c 1 11 && echo mknod-ok || echo mknod-denied; \
          head -c 1 /dev/kmsg-probe >/dev/null 2>&1 && echo kmsg-ok || echo kmsg-denied; rm -f /dev/kmsg-probe'",
        v2_cgroup.display()
    );
    text(&run(Command::new("sh").args(["-c", &script])))
}

/// cgroup v2: the same pause spec through the fast path and through runc, each daemon in a
/// mount namespace whose /sys/fs/cgroup is the cgroup2 hierarchy (this host is hybrid and its
/// controllers belong to v1, so the spec keeps only device rules): the same cgroup, the same
/// process state, and a device filter that lets /dev/null through and refuses /dev/zero.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_path_on_cgroup_v2_matches_runc() {
    let env = env();
    // A v2 host (the node lane's guest) as it is; on this project's hybrid machines the
    // daemons get a mount namespace whose /sys/fs/cgroup is the unified hierarchy.
    let host_v2 = crate::common::cri::cgroup_v2();
    let unified = Path::new(if host_v2 {
        "/sys/fs/cgroup"
    } else {
        "/sys/fs/cgroup/unified"
    });
    if !unified.join("cgroup.procs").exists() {
        panic!("this test needs the unified cgroup2 hierarchy at {}", unified.display());
    }
    let start = |ns: &Ns, b: &CrioBundle| {
        if host_v2 {
            crio_start(ns, &b.dir, &b.id, b"")
        } else {
            v2_start(ns, b)
        }
    };
    let fast_ns = env.namespace("sbx2-fast");
    let runc_ns = env.namespace_with("sbx2-runc", "[runtime]\nsandbox_fast_path = false\n");
    let rootfs = pause_rootfs();
    let pinned = Pinned::new(&fast_ns.dir);
    let fast = pause_bundle(&fast_ns, "pf2", &rootfs, &pinned, v2_only);
    let slow = pause_bundle(&runc_ns, "pr2", &rootfs, &pinned, v2_only);
    let (fast_client, fast_pid) = run_pause(start(&fast_ns, &fast), &fast).await;
    let (runc_client, runc_pid) = run_pause(start(&runc_ns, &slow), &slow).await;
    assert_eq!(started_by(&fast_ns, "pf2"), "fast path");
    assert_eq!(started_by(&runc_ns, "pr2"), "runc");

    let seen = |pid, id: &str, ns: &Ns| -> BTreeMap<String, String> {
        let mut m = observe(pid, id);
        m.insert("devices".into(), device_access(pid, &unified.join(&ns.name).join(id)));
        m.into_iter().map(|(k, v)| (k, v.replace(&ns.name, "NS"))).collect()
    };
    let (a, b) = (seen(fast_pid, "pf2", &fast_ns), seen(runc_pid, "pr2", &runc_ns));
    assert_same("cgroup v2", &a, &b);
    assert!(a["cgroup"].contains("0::/NS/ID\n"), "{}", a["cgroup"]);
    assert!(rooted_at_container(&a["cgroup.in_ns"]), "{}", a["cgroup.in_ns"]);
    assert_eq!(a["ns.cgroup"], "own");
    for want in ["null-ok", "mknod-ok", "kmsg-denied"] {
        assert!(a["devices"].contains(want), "{want}: {}", a["devices"]);
    }

    for (client, id) in [(fast_client, "pf2"), (runc_client, "pr2")] {
        crate::common::crio_kill_and_remove(&client, id).await;
    }
    for (ns, id) in [(&fast_ns, "pf2"), (&runc_ns, "pr2")] {
        let dir = unified.join(&ns.name);
        assert!(
            wait_until(Duration::from_secs(30), || !dir.join(id).exists()),
            "{} stayed",
            dir.join(id).display()
        );
        let _ = std::fs::remove_dir(&dir);
    }
    drop(pinned);
    assert_clean(env, &fast_ns);
    assert_clean(env, &runc_ns);
}

/// CRI-O gives infra containers `oomScoreAdj` -998; the fast path applies it as runc does
/// where CAP_SYS_RESOURCE is held (not on this project's build machines).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[ignore = "needs the production-shaped node: run through scripts/test.sh --node"]
async fn fast_path_applies_a_negative_oom_score_adj() {
    let env = env();
    let ns = env.namespace("sbx-oomadj");
    let rootfs = pause_rootfs();
    let pinned = Pinned::new(&ns.dir);
    let b = pause_bundle(&ns, "po1", &rootfs, &pinned, |spec| {
        spec["process"]["oomScoreAdj"] = (-998).into();
    });
    let (client, pid) = start_pause(&ns, &b).await;
    assert_eq!(started_by(&ns, "po1"), "fast path");
    let adj = std::fs::read_to_string(format!("/proc/{pid}/oom_score_adj")).unwrap();
    assert_eq!(adj.trim(), "-998");
    crate::common::crio_kill_and_remove(&client, "po1").await;
    drop(pinned);
    assert_clean(env, &ns);
}

/// Delete finishes a fast-path sandbox whose cgroup has already lost a hierarchy's directory
/// (containerd 2.3's CRI cleaning up a RunPodSandbox its NRI hook failed: "failed to read
/// .../memory/k8s.io/<id>/cgroup.procs: No such file or directory", and the pod was left).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delete_finishes_when_a_cgroup_directory_is_already_gone() {
    let env = env();
    let ns = env.namespace("sbx-gone");
    let rootfs = pause_rootfs();
    let pinned = Pinned::new(&ns.dir);
    let b = pause_bundle(&ns, "pg1", &rootfs, &pinned, |_| {});
    let (client, pid) = start_pause(&ns, &b).await;
    assert_eq!(started_by(&ns, "pg1"), "fast path");
    let cgroup = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let relative = cgroup
        .lines()
        .next()
        .unwrap()
        .splitn(3, ':')
        .nth(2)
        .unwrap()
        .to_string();
    let t = crate::common::task::task(&client, "pg1");
    t.kill(9).await.unwrap();
    t.wait().await.unwrap();
    let dirs = crate::common::cri::cgroup_dirs(&relative);
    assert!(!dirs.is_empty(), "no directory for {relative}");
    // The memory hierarchy's, as seen (v1); the one directory on a v2 host.
    let gone = dirs
        .iter()
        .find(|d| d.starts_with("/sys/fs/cgroup/memory"))
        .unwrap_or(&dirs[0]);
    std::fs::remove_dir(gone).unwrap();
    assert_eq!(crate::common::crio_remove(&client, "pg1").await.exit_status, 137);
    assert!(
        crate::common::cri::cgroup_dirs(&relative).is_empty(),
        "{:?}",
        crate::common::cri::cgroup_dirs(&relative)
    );
    drop(pinned);
    assert_clean(env, &ns);
}
