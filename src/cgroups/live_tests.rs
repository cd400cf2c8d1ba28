//! Tests against the host's real cgroups (root needed). Each test runs the variant of the
//! layout the host has ([`layout`]): the v1 hierarchies on a legacy or hybrid host, the unified
//! hierarchy on a v2 host. None asserts which layout that is; the suite runs on both (the
//! project's v1 hosts, the node guest's v2).

use std::fs;
use std::io::{BufRead, BufReader, Write};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::{Duration, Instant};

use protobuf::Message;

use super::*;

/// A cgroup created for one test in each listed hierarchy, removed on drop.
struct TestCgroup {
    dirs: Vec<PathBuf>,
}

impl TestCgroup {
    fn new(mounts: &[&str], tag: &str) -> Self {
        let name = format!("gantry-unit-{}-{tag}", std::process::id());
        let mut dirs: Vec<PathBuf> = Vec::new();
        for m in mounts {
            let dir = Path::new(m).join(&name);
            // cpu and cpuacct may be one hierarchy behind two names.
            let canon = fs::canonicalize(m).unwrap().join(&name);
            if dirs.iter().any(|d| fs::canonicalize(d).ok() == Some(canon.clone())) {
                continue;
            }
            fs::create_dir(&dir).unwrap();
            dirs.push(dir);
        }
        Self { dirs }
    }

    fn dir(&self, mount: &str) -> PathBuf {
        Path::new(mount).join(self.dirs[0].file_name().unwrap())
    }

    fn add(&self, pid: u32) {
        for d in &self.dirs {
            fs::write(d.join("cgroup.procs"), pid.to_string()).unwrap();
        }
    }
}

impl Drop for TestCgroup {
    fn drop(&mut self) {
        for d in &self.dirs {
            for _ in 0..50 {
                if fs::remove_dir(d).is_ok() || !d.exists() {
                    break;
                }
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
}

/// A shell that waits for a line on stdin before running `script`, so it can be moved into a
/// cgroup first.
struct Gated {
    child: Child,
    out: BufReader<ChildStdout>,
    // Keeps the reaper's waitpid(-1) test from reaping this child under us.
    _children: std::sync::MutexGuard<'static, ()>,
}

impl Gated {
    fn spawn(script: &str) -> Self {
        let children = crate::sys::test_children_lock();
        let mut child = Command::new("sh")
            .arg("-c")
            .arg(format!("read go; {script}"))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        Self {
            child,
            out,
            _children: children,
        }
    }

    fn pid(&self) -> u32 {
        self.child.id()
    }

    fn say(&mut self, line: &str) {
        let stdin = self.child.stdin.as_mut().unwrap();
        writeln!(stdin, "{line}").unwrap();
        stdin.flush().unwrap();
    }

    fn line(&mut self) -> String {
        let mut s = String::new();
        self.out.read_line(&mut s).unwrap();
        s
    }
}

impl Drop for Gated {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The host's cgroup layout, as the code under test sees it.
enum Layout {
    V1,
    /// The cgroup2 mount showing the root, with memory, cpu and pids handed to its children.
    V2(String),
}

fn layout() -> Layout {
    assert!(
        nix::unistd::Uid::effective().is_root(),
        "live cgroup tests need root (scripts/test.sh)"
    );
    if !host_is_v2().unwrap() {
        return Layout::V1;
    }
    let mounts = MountTable::of_self().unwrap();
    let mount = cgroup_mounts(&mounts)
        .into_iter()
        .find(|m| m.v2 && m.root == "/")
        .expect("a v2 host mounts the cgroup2 root");
    let root = mount.mount_point.to_string_lossy().into_owned();
    // systemd enables these at the root already; elsewhere the test does (it is the root, so
    // no process is in the way).
    fs::write(Path::new(&root).join("cgroup.subtree_control"), "+memory +cpu +pids").unwrap();
    Layout::V2(root)
}

/// Spins, fills 2 MB, prints "ready" and waits: the live tests' workload.
const WORK: &str = "i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; \
     x=$(head -c 2000000 /dev/zero | tr '\\0' a); echo ready; read done";

const MEMORY: &str = "/sys/fs/cgroup/memory";

#[test]
fn metrics_of_a_live_process() {
    match layout() {
        Layout::V1 => v1_metrics_of_a_live_process(),
        Layout::V2(root) => v2_metrics_of_a_live_process(&root),
    }
}

fn v1_metrics_of_a_live_process() {
    let mounts: Vec<&str> = [MEMORY, "/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpuacct"]
        .into_iter()
        .chain(["/sys/fs/cgroup/pids", "/sys/fs/cgroup/blkio"])
        .filter(|m| Path::new(m).join("cgroup.procs").exists())
        .collect();
    let cg = TestCgroup::new(&mounts, "stats");
    let pids_dir = cg.dir("/sys/fs/cgroup/pids");
    let pids_limited = pids_dir.is_dir() && fs::write(pids_dir.join("pids.max"), "100").is_ok();
    let mut child = Gated::spawn(WORK);
    cg.add(child.pid());

    let found = ContainerCgroup::for_pid(child.pid() as i32).unwrap();
    let paths = found.v1_paths().unwrap();
    assert_eq!(paths.memory, Some(cg.dir(MEMORY)));
    assert_eq!(paths.cpuacct, Some(cg.dir("/sys/fs/cgroup/cpuacct")));
    if pids_limited {
        assert_eq!(paths.pids, Some(pids_dir));
    }

    let started = Instant::now();
    child.say("go");
    assert_eq!(child.line(), "ready\n");
    let wall_ns = started.elapsed().as_nanos() as u64;

    let any = found.metrics_any().unwrap();
    assert_eq!(any.type_url, "io.containerd.cgroups.v1.Metrics");
    let m = MetricsV1::parse_from_bytes(&any.value).unwrap();
    let u = &m.cpu.usage;
    eprintln!(
        "live v1: wall {wall_ns} ns, cpu total {} user {} kernel {} per_cpu {:?}, mem {:?}",
        u.total, u.user, u.kernel, u.per_cpu, m.memory.usage
    );
    // 300000 shell iterations take well over 10 ms; in µs or ticks this would be far smaller.
    assert!(u.total > 10_000_000, "cpu total {} ns", u.total);
    let cpus = u.per_cpu.len().max(1) as u64;
    assert!(u.total <= wall_ns * cpus + 50_000_000, "cpu total {} ns", u.total);
    let per_cpu: u64 = u.per_cpu.iter().sum();
    assert!(per_cpu.abs_diff(u.total) <= u.total / 10, "{per_cpu} vs {}", u.total);
    let split = u.user + u.kernel;
    assert!(
        split >= u.total / 2 && split <= u.total * 3 / 2,
        "user+kernel {split} vs total {}",
        u.total
    );
    assert!(m.memory.usage.usage > 1_000_000, "{:?}", m.memory.usage);
    assert!(m.memory.usage.limit > 0);
    assert!(m.memory.total_rss + m.memory.total_cache > 0);
    assert_eq!(m.memory_oom_control.oom_kill, 0);
    if pids_limited {
        assert_eq!((m.pids.current, m.pids.limit), (1, 100));
    }
    assert!(m.cpu.throttling.is_some());
    assert!(m.blkio.is_some());

    child.say("done");
    assert!(child.child.wait().unwrap().success());
}

fn v2_metrics_of_a_live_process(root: &str) {
    let cg = TestCgroup::new(&[root], "stats");
    let dir = cg.dir(root);
    fs::write(dir.join("pids.max"), "100").unwrap();
    let mut child = Gated::spawn(WORK);
    cg.add(child.pid());

    let found = ContainerCgroup::for_pid(child.pid() as i32).unwrap();
    assert_eq!(found.v2_dir(), Some(dir.as_path()));
    let started = Instant::now();
    child.say("go");
    assert_eq!(child.line(), "ready\n");
    let wall_us = started.elapsed().as_micros() as u64;

    let any = found.metrics_any().unwrap();
    assert_eq!(any.type_url, "io.containerd.cgroups.v2.Metrics");
    let m = MetricsV2::parse_from_bytes(&any.value).unwrap();
    let (cpu, mem) = (&m.cpu, &m.memory);
    eprintln!(
        "live v2: wall {wall_us} us, cpu {} user {} system {} us, memory {} limit {}, pids {:?}",
        cpu.usage_usec, cpu.user_usec, cpu.system_usec, mem.usage, mem.usage_limit, m.pids
    );
    // 300000 shell iterations take well over 10 ms; in ns or ticks this would be far off.
    assert!(cpu.usage_usec > 10_000, "usage {} us", cpu.usage_usec);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    assert!(cpu.usage_usec <= wall_us * cpus + 50_000, "usage {} us", cpu.usage_usec);
    let split = cpu.user_usec + cpu.system_usec;
    assert!(
        split.abs_diff(cpu.usage_usec) <= cpu.usage_usec / 10,
        "{split} vs {}",
        cpu.usage_usec
    );
    assert!(mem.usage > 1_000_000, "memory {}", mem.usage);
    // memory.max `max`, reported as containerd's v2 does.
    assert_eq!(mem.usage_limit, u64::MAX);
    assert_eq!(m.memory_events.oom_kill, 0);
    assert_eq!((m.pids.current, m.pids.limit), (1, 100));

    child.say("done");
    assert!(child.child.wait().unwrap().success());
}

/// libcgroups' v1 reader on a live cgroup (it cannot be pointed at a fixture: it finds the
/// hierarchies in this process's mount table) next to gantry's: the CPU split into user and
/// kernel time comes in cpuacct.stat's USER_HZ ticks, not the nanoseconds containerd reports.
#[test]
fn libcgroups_cpu_split_matches_on_v2_and_is_in_ticks_on_v1() {
    match layout() {
        Layout::V1 => libcgroups_v1_cpu_split_is_in_ticks(),
        Layout::V2(root) => libcgroups_v2_cpu_split_is_ours(&root),
    }
}

fn libcgroups_v1_cpu_split_is_in_ticks() {
    use libcgroups::common::CgroupManager;

    // Every hierarchy whose stats libcgroups reads must hold the cgroup.
    let mounts: Vec<&str> = [MEMORY, "/sys/fs/cgroup/cpu", "/sys/fs/cgroup/cpuacct"]
        .into_iter()
        .chain(["/sys/fs/cgroup/pids", "/sys/fs/cgroup/blkio", "/sys/fs/cgroup/hugetlb"])
        .filter(|m| Path::new(m).join("cgroup.procs").exists())
        .collect();
    let cg = TestCgroup::new(&mounts, "libcg");
    let mut child = Gated::spawn("i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; echo ready; read done");
    cg.add(child.pid());
    child.say("go");
    assert_eq!(child.line(), "ready\n");

    // Once the child sleeps in `read`, the counters stand still while both read them.
    wait_sleeping(child.pid());
    let found = ContainerCgroup::for_pid(child.pid() as i32).unwrap();
    let ours = v1_metrics(found.v1_paths().unwrap()).unwrap();
    let name = cg.dirs[0].file_name().unwrap();
    let manager = libcgroups::v1::Manager::new(Path::new(name)).unwrap();
    let theirs = manager.stats().unwrap();
    let cpuacct = cg.dir("/sys/fs/cgroup/cpuacct");
    let stat = read_keyed(&cpuacct.join("cpuacct.stat")).unwrap().unwrap();
    let u = &ours.cpu.usage;
    eprintln!(
        "live v1: gantry user {} kernel {} ns; libcgroups user {} kernel {}; cpuacct.stat {stat:?}",
        u.user, u.kernel, theirs.cpu.usage.usage_user, theirs.cpu.usage.usage_kernel
    );
    // Same total, in ns both.
    assert_eq!(theirs.cpu.usage.usage_total, u.total);
    assert!(u.total > 10_000_000, "cpu total {} ns", u.total);
    // The split: ticks there, ns here (100 ticks a second against 1e9 ns).
    assert_eq!(
        (theirs.cpu.usage.usage_user, theirs.cpu.usage.usage_kernel),
        (get(&stat, "user"), get(&stat, "system"))
    );
    assert!(u.user + u.kernel > 1_000_000 * (get(&stat, "user") + get(&stat, "system")));
    // pids come from libcgroups in both.
    assert_eq!(
        (theirs.pids.current, theirs.pids.limit),
        (ours.pids.current, ours.pids.limit)
    );

    child.say("done");
    assert!(child.child.wait().unwrap().success());
}

/// On v2 both read cpu.stat in microseconds, so the numbers are the same.
fn libcgroups_v2_cpu_split_is_ours(root: &str) {
    use libcgroups::common::CgroupManager;

    // libcgroups' stats read every controller the root offers (hugetlb.*.events included) and
    // fail on the first file missing, so the test cgroup gets them all; gantry's reader takes
    // what is there.
    let offered = fs::read_to_string(Path::new(root).join("cgroup.controllers")).unwrap();
    for c in offered.split_whitespace() {
        let _ = fs::write(Path::new(root).join("cgroup.subtree_control"), format!("+{c}"));
    }
    let cg = TestCgroup::new(&[root], "libcg");
    let mut child = Gated::spawn(WORK);
    cg.add(child.pid());
    child.say("go");
    assert_eq!(child.line(), "ready\n");
    wait_sleeping(child.pid());
    let dir = cg.dir(root);
    let ours = v2_metrics(&dir).unwrap();
    let name = dir.file_name().unwrap();
    let manager = libcgroups::v2::manager::Manager::new(PathBuf::from(root), PathBuf::from(name)).unwrap();
    let theirs = manager.stats().unwrap();
    let u = &theirs.cpu.usage;
    eprintln!(
        "live v2: gantry {} user {} system {} us; libcgroups {} user {} kernel {}",
        ours.cpu.usage_usec, ours.cpu.user_usec, ours.cpu.system_usec, u.usage_total, u.usage_user, u.usage_kernel
    );
    assert!(ours.cpu.usage_usec > 10_000, "usage {} us", ours.cpu.usage_usec);
    assert_eq!(
        (u.usage_total, u.usage_user, u.usage_kernel),
        (ours.cpu.usage_usec, ours.cpu.user_usec, ours.cpu.system_usec)
    );
    child.say("done");
    assert!(child.child.wait().unwrap().success());
}

/// Waits until `pid` sleeps (in `read`), so its counters stand still while they are read.
fn wait_sleeping(pid: u32) {
    let stat_path = format!("/proc/{pid}/stat");
    let sleeping = || {
        let stat = fs::read_to_string(&stat_path).unwrap_or_default();
        stat.rsplit_once(") ").is_some_and(|(_, rest)| rest.starts_with('S'))
    };
    let end = Instant::now() + Duration::from_secs(5);
    while !sleeping() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[tokio::test]
async fn oom_kill_is_notified() {
    match layout() {
        Layout::V1 => v1_oom_kill_is_notified().await,
        Layout::V2(root) => v2_oom_kill_is_notified(&root).await,
    }
}

async fn v1_oom_kill_is_notified() {
    let cg = TestCgroup::new(&[MEMORY], "oom");
    let dir = cg.dir(MEMORY);
    fs::write(dir.join("memory.limit_in_bytes"), "8M").unwrap();
    if dir.join("memory.memsw.limit_in_bytes").exists() {
        fs::write(dir.join("memory.memsw.limit_in_bytes"), "8M").unwrap();
    }
    // `exec` so the killed process is the child itself; tail buffers /dev/zero without bound.
    let mut child = Gated::spawn("exec tail /dev/zero");
    cg.add(child.pid());

    let found = ContainerCgroup::for_pid(child.pid() as i32).unwrap();
    assert_eq!(found.oom_kills().unwrap(), 0);
    let mut watcher = found.oom_watcher().unwrap();
    child.say("go");

    let got = tokio::time::timeout(Duration::from_secs(20), watcher.next()).await;
    assert_eq!(got, Ok(Some(())));
    let status = child.child.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    assert!(found.oom_kills().unwrap() >= 1);
    let m = MetricsV1::parse_from_bytes(&found.metrics_any().unwrap().value).unwrap();
    assert!(m.memory_oom_control.oom_kill >= 1);
    // (failcnt stays 0 on this 6.18 kernel even at the limit, so the peak is checked.)
    assert!(m.memory.usage.max >= 7 << 20, "{:?}", m.memory.usage);

    // Removing the cgroup also signals the eventfd; that must end the watcher, not fire it.
    drop(cg);
    let mut extra = 0;
    let end = loop {
        match tokio::time::timeout(Duration::from_secs(10), watcher.next()).await {
            Ok(Some(())) if extra < 5 => extra += 1,
            other => break other,
        }
    };
    eprintln!("live v1 OOM: {extra} further notifications before the end");
    assert_eq!(end, Ok(None), "after {extra} further notifications");
}

async fn v2_oom_kill_is_notified(root: &str) {
    let cg = TestCgroup::new(&[root], "oom");
    let dir = cg.dir(root);
    fs::write(dir.join("memory.max"), "8M").unwrap();
    if dir.join("memory.swap.max").exists() {
        fs::write(dir.join("memory.swap.max"), "0").unwrap();
    }
    let mut child = Gated::spawn("exec tail /dev/zero");
    cg.add(child.pid());

    let found = ContainerCgroup::for_pid(child.pid() as i32).unwrap();
    assert_eq!(found.oom_kills().unwrap(), 0);
    let mut watcher = found.oom_watcher().unwrap();
    child.say("go");

    let got = tokio::time::timeout(Duration::from_secs(20), watcher.next()).await;
    assert_eq!(got, Ok(Some(())));
    let status = child.child.wait().unwrap();
    assert_eq!(status.signal(), Some(libc::SIGKILL), "{status:?}");
    assert!(found.oom_kills().unwrap() >= 1);
    let m = MetricsV2::parse_from_bytes(&found.metrics_any().unwrap().value).unwrap();
    assert!(m.memory_events.oom_kill >= 1, "{:?}", m.memory_events);
    // memory.peak (kernel 5.19+): the limit was reached.
    assert!(m.memory.max_usage >= 7 << 20, "{:?}", m.memory);

    // The killed child emptied the cgroup; removing it ends the watcher without another event.
    drop(cg);
    let end = tokio::time::timeout(Duration::from_secs(10), watcher.next()).await;
    assert_eq!(end, Ok(None));
}

/// The unified hierarchy of a hybrid host (or the only one of a v2 host): no resource
/// controllers here, but cpu.stat is always present, and it must stay in microseconds.
#[tokio::test]
async fn v2_metrics_on_a_controllerless_cgroup2() {
    assert!(
        nix::unistd::Uid::effective().is_root(),
        "live cgroup tests need root (scripts/test.sh)"
    );
    let mounts = MountTable::of_self().unwrap();
    let mount = cgroup_mounts(&mounts)
        .into_iter()
        .find(|m| m.v2)
        .expect("this test needs a cgroup2 mount (the hybrid host's /sys/fs/cgroup/unified)");
    let root = mount.mount_point.to_string_lossy().into_owned();
    assert!(
        mount.root == "/" && Path::new(&root).join("cgroup.procs").exists(),
        "cgroup2 mount {root} does not show the root"
    );
    let cg = TestCgroup::new(&[root.as_str()], "v2");
    let mut child = Gated::spawn("i=0; while [ $i -lt 300000 ]; do i=$((i+1)); done; echo ready; read done");
    cg.add(child.pid());

    let cgroup = fs::read_to_string(format!("/proc/{}/cgroup", child.pid())).unwrap();
    let found = ContainerCgroup::resolve(child.pid() as i32, true, &cgroup, &mounts).unwrap();
    assert_eq!(found.v2_dir(), Some(cg.dir(&root).as_path()));

    let started = Instant::now();
    child.say("go");
    assert_eq!(child.line(), "ready\n");
    let wall_us = started.elapsed().as_micros() as u64;
    let any = found.metrics_any().unwrap();
    assert_eq!(any.type_url, "io.containerd.cgroups.v2.Metrics");
    let m = MetricsV2::parse_from_bytes(&any.value).unwrap();
    let controllers = fs::read_to_string(cg.dir(&root).join("cgroup.controllers")).unwrap();
    eprintln!(
        "live v2 at {}: controllers {:?}, wall {wall_us} us, cpu {:?}, memory set {}, events set {}",
        root,
        controllers.trim(),
        m.cpu.usage_usec,
        m.memory.is_some(),
        m.memory_events.is_some()
    );
    assert!(m.cpu.usage_usec > 1_000, "usage {} us", m.cpu.usage_usec);
    let cpus = std::thread::available_parallelism().map_or(1, |n| n.get()) as u64;
    assert!(
        m.cpu.usage_usec <= wall_us * cpus + 50_000,
        "usage {} us",
        m.cpu.usage_usec
    );
    assert!(m.cpu.user_usec + m.cpu.system_usec > 0);
    if !controllers.contains("memory") {
        assert!(m.memory.is_none() && m.memory_events.is_none());
        let e = found.oom_watcher().err().unwrap();
        assert!(matches!(e, CgroupError::OomUnsupported(_)), "{e}");
    }
    child.say("done");
    assert!(child.child.wait().unwrap().success());
}
