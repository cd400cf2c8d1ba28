//! A container's cgroup: where it lives, its usage as the protobuf `Metrics` that containerd and
//! CRI-O decode from the Stats RPC, and OOM-kill notifications.
//!
//! libcgroups detects the host's cgroup mode and reads v1 `pids`; the other files are read here.
//! libcgroups 0.7 reads stats only through `CgroupManager::stats()` (its per-controller readers
//! are private), which fails whole when any file it expects is absent, and its `Stats` lacks or
//! changes much of what containerd's `Metrics` carry. Field by field (tests:
//! `v2::tests::libcgroups_v2_stats_lack_what_containerd_reports` on a fixture tree,
//! `live_tests::libcgroups_v1_cpu_split_is_in_ticks` on a live v1 cgroup):
//!
//! | containerd `Metrics` | libcgroups 0.7 `Stats` | here |
//! |---|---|---|
//! | v1 pids current, limit (`max` = 0) | same (`stats::pid_stats`) | libcgroups |
//! | v1 cpu total, per_cpu (ns); throttling | same files | own (libcgroups: only in `stats()`) |
//! | v1 cpu user, kernel (ns) | cpuacct.stat USER_HZ ticks | usage_user/usage_sys, ticks→ns |
//! | v1 memory: 32 `memory.stat` fields | raw map; needs memsw, kmem and kmem.tcp | own |
//! | v1 usage/swap/kernel/kernel_tcp entries | same, all four required | own, each optional |
//! | v1 memory_oom_control (oom_kill) | — | own |
//! | v1 blkio `*_recursive`, device names | non-recursive files, no names | own |
//! | v2 cpu usage/user/system, throttling (µs) | same | own (libcgroups: only in `stats()`) |
//! | v2 cpu nr_bursts, burst_usec | — | own |
//! | PSI some/full avg10/60/300, total | averages only; file required | own, optional |
//! | v2 memory.stat fields | raw map | own |
//! | v2 usage, limit, peak, swap usage/limit/peak | same; memory.swap.* required | own |
//! | v2 memory_events (oom_kill, ...) | `oom` alone, as fail_count | own |
//! | v2 io rbytes/wbytes/rios/wios per device | one entry per op | own |
//! | v2 hugetlb current, failcnt / max (limit) | same / — ; host's page sizes | own |
//! | v2 pids limit (`max` = u64::MAX) | 0 | own |
//! | a section whose files are absent | the whole call fails | section unset |

mod oom;
mod v1;
mod v2;
pub mod warm;

#[cfg(test)]
mod live_tests;

use std::collections::HashMap;
use std::fs;
use std::io;
use std::path::{Component, Path, PathBuf};

use crate::proc::{self, MountTable};
use libcgroups::common::CgroupSetup;
use protobuf::well_known_types::any::Any;
use protobuf::Message;

/// Whether a `cgroupsPath` is in the systemd driver's form, `slice:prefix:name` (the slice may
/// be empty), as runc's systemd driver parses it; an absolute or other relative path is a
/// cgroupfs path.
pub fn is_systemd_path(cgroups_path: &str) -> bool {
    !cgroups_path.starts_with('/') && cgroups_path.split(':').count() == 3
}

pub use containerd_shim_protos::cgroups::metrics::Metrics as MetricsV1;
pub use containerd_shim_protos::cgroups_v2::metrics::Metrics as MetricsV2;
pub use oom::OomWatcher;
pub use v1::v1_metrics;
pub use v2::v2_metrics;

/// Type URL of v1 stats. Bare, without `type.googleapis.com/`: containerd's typeurl registry and
/// CRI-O look the message up by exactly this name.
pub const V1_METRICS_TYPE_URL: &str = "io.containerd.cgroups.v1.Metrics";
/// Type URL of v2 stats (see [`V1_METRICS_TYPE_URL`]).
pub const V2_METRICS_TYPE_URL: &str = "io.containerd.cgroups.v2.Metrics";

/// Why a cgroup could not be found, read or watched.
#[derive(Debug, thiserror::Error)]
pub enum CgroupError {
    /// The host's cgroup layout could not be determined.
    #[error("cannot detect the host's cgroup mode: {0}")]
    Mode(String),
    /// The process's cgroup could not be located (process gone, controller not mounted).
    #[error("cgroup of pid {pid}: {reason}")]
    Locate { pid: i32, reason: String },
    /// The cgroup has been removed: the container is gone (callers answer NOT_FOUND).
    #[error("cgroup {} no longer exists", .0.display())]
    Gone(PathBuf),
    #[error("{}: {source}", .path.display())]
    Io {
        path: PathBuf,
        #[source]
        source: io::Error,
    },
    #[error("{}: unexpected content {text:?}", .path.display())]
    Parse { path: PathBuf, text: String },
    /// This cgroup offers no OOM notification (no memory controller in its hierarchy).
    #[error("OOM notification unavailable: {0}")]
    OomUnsupported(String),
    /// Async watchers register with the tokio reactor, so they need a runtime.
    #[error("OOM watcher created outside a tokio runtime")]
    NoRuntime,
    #[error("encoding metrics: {0}")]
    Encode(#[from] protobuf::Error),
}

/// Per-controller directories of a cgroup v1 container. A controller the host does not mount
/// stays `None`; co-mounted controllers (`cpu,cpuacct`) share a directory.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct V1Paths {
    pub memory: Option<PathBuf>,
    pub cpu: Option<PathBuf>,
    pub cpuacct: Option<PathBuf>,
    pub pids: Option<PathBuf>,
    pub blkio: Option<PathBuf>,
    pub hugetlb: Option<PathBuf>,
}

impl V1Paths {
    fn dirs(&self) -> impl Iterator<Item = &PathBuf> {
        [
            &self.memory,
            &self.cpu,
            &self.cpuacct,
            &self.pids,
            &self.blkio,
            &self.hugetlb,
        ]
        .into_iter()
        .flatten()
    }
}

#[derive(Debug, Clone, PartialEq, Eq)]
enum Layout {
    V1(V1Paths),
    V2(PathBuf),
}

/// The cgroup of a running container, found from its init pid. Paths are resolved once: the
/// runtime never moves a container's init, and re-resolving after it exits would fail.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ContainerCgroup {
    layout: Layout,
}

impl ContainerCgroup {
    /// Locates the cgroup of `pid` from `/proc/<pid>/cgroup` and `/proc/self/mountinfo`. The
    /// version follows the host, as the engines expect: a unified host (cgroup2 at
    /// /sys/fs/cgroup) is v2; legacy and hybrid hosts (whose `unified` mount holds no resource
    /// controllers) are v1.
    pub fn for_pid(pid: i32) -> Result<Self, CgroupError> {
        let v2 = host_is_v2()?;
        let cgroup = proc::cgroup_text(pid).map_err(|e| CgroupError::Locate {
            pid,
            reason: format!("/proc/{pid}/cgroup: {e}"),
        })?;
        let mounts = MountTable::of_self().map_err(|e| io_err(Path::new("/proc/self/mountinfo"), e))?;
        Self::resolve(pid, v2, &cgroup, &mounts)
    }

    /// A cgroup v2 directory, taken as is (fixture trees, or a path already known).
    pub fn v2_at(dir: PathBuf) -> Self {
        Self {
            layout: Layout::V2(dir),
        }
    }

    /// A set of cgroup v1 controller directories, taken as is.
    pub fn v1_at(paths: V1Paths) -> Self {
        Self {
            layout: Layout::V1(paths),
        }
    }

    pub fn is_v2(&self) -> bool {
        matches!(self.layout, Layout::V2(_))
    }

    /// The v2 directory, or `None` on v1.
    pub fn v2_dir(&self) -> Option<&Path> {
        match &self.layout {
            Layout::V2(d) => Some(d),
            Layout::V1(_) => None,
        }
    }

    /// The v1 controller directories, or `None` on v2.
    pub fn v1_paths(&self) -> Option<&V1Paths> {
        match &self.layout {
            Layout::V1(p) => Some(p),
            Layout::V2(_) => None,
        }
    }

    /// Stats as the `Any` the Stats RPC returns: `io.containerd.cgroups.v1.Metrics` (CPU in ns)
    /// or `io.containerd.cgroups.v2.Metrics` (CPU in µs). [`CgroupError::Gone`] once the
    /// cgroup has been removed.
    pub fn metrics_any(&self) -> Result<Any, CgroupError> {
        let (type_url, value) = match &self.layout {
            Layout::V1(p) => (V1_METRICS_TYPE_URL, v1_metrics(p)?.write_to_bytes()?),
            Layout::V2(d) => (V2_METRICS_TYPE_URL, v2_metrics(d)?.write_to_bytes()?),
        };
        let mut any = Any::new();
        any.type_url = type_url.to_string();
        any.value = value;
        Ok(any)
    }

    /// How many processes the kernel has OOM-killed in this cgroup so far (v1
    /// `memory.oom_control`, v2 `memory.events`). Comparing it before and after an exit is the
    /// race-free way to tell an OOM kill from another SIGKILL.
    pub fn oom_kills(&self) -> Result<u64, CgroupError> {
        let (path, dir) = match &self.layout {
            Layout::V1(p) => {
                let dir = p
                    .memory
                    .as_ref()
                    .ok_or_else(|| CgroupError::OomUnsupported("no v1 memory cgroup".to_string()))?;
                (dir.join("memory.oom_control"), dir)
            }
            Layout::V2(d) => (d.join("memory.events"), d),
        };
        match read_keyed(&path)? {
            Some(kv) => Ok(get(&kv, "oom_kill")),
            None if dir.is_dir() => Err(CgroupError::OomUnsupported(format!("{} is absent", path.display()))),
            None => Err(CgroupError::Gone(dir.clone())),
        }
    }

    /// On v2, the parent's hierarchical `oom_kill` (it counts its children's kills too); what
    /// is left to count a kill by once the cgroup itself was removed (see
    /// `Container::take_new_ooms`).
    pub fn parent_oom_kills(&self) -> Option<u64> {
        let Layout::V2(d) = &self.layout else { return None };
        let kv = read_keyed(&d.parent()?.join("memory.events")).ok()??;
        Some(get(&kv, "oom_kill"))
    }

    /// OOM-kill notifications for this cgroup. Must be called inside a tokio runtime.
    pub fn oom_watcher(&self) -> Result<OomWatcher, CgroupError> {
        match &self.layout {
            Layout::V1(p) => match &p.memory {
                Some(dir) => OomWatcher::v1(dir),
                None => Err(CgroupError::OomUnsupported("no v1 memory cgroup".to_string())),
            },
            Layout::V2(d) => OomWatcher::v2(d),
        }
    }

    /// Resolves the cgroup from the texts of `/proc/<pid>/cgroup` and `/proc/self/mountinfo`.
    fn resolve(pid: i32, v2: bool, cgroup: &str, table: &MountTable) -> Result<Self, CgroupError> {
        let mounts = cgroup_mounts(table);
        let locate = |reason: String| CgroupError::Locate { pid, reason };
        if v2 {
            let path = proc::unified_path(cgroup).ok_or_else(|| locate("no cgroup2 entry".to_string()))?;
            let dir = mounts
                .iter()
                .filter(|m| m.v2)
                .find_map(|m| m.dir_for(path))
                .ok_or_else(|| locate(format!("no cgroup2 mount holds {path}")))?;
            return Ok(Self::v2_at(dir));
        }
        let mut paths = V1Paths::default();
        for entry in proc::parse_cgroups(cgroup) {
            for controller in &entry.controllers {
                let slot = match controller.as_str() {
                    "memory" => &mut paths.memory,
                    "cpu" => &mut paths.cpu,
                    "cpuacct" => &mut paths.cpuacct,
                    "pids" => &mut paths.pids,
                    "blkio" => &mut paths.blkio,
                    "hugetlb" => &mut paths.hugetlb,
                    _ => continue,
                };
                *slot = mounts
                    .iter()
                    .filter(|m| !m.v2 && m.options.iter().any(|o| o == controller))
                    .find_map(|m| m.dir_for(&entry.path));
            }
        }
        if paths.memory.is_none() && paths.cpuacct.is_none() {
            return Err(locate("no v1 memory or cpuacct cgroup is mounted for it".to_string()));
        }
        Ok(Self::v1_at(paths))
    }
}

fn host_is_v2() -> Result<bool, CgroupError> {
    match libcgroups::common::get_cgroup_setup() {
        Ok(CgroupSetup::Unified) => Ok(true),
        Ok(CgroupSetup::Legacy | CgroupSetup::Hybrid) => Ok(false),
        Err(e) => Err(CgroupError::Mode(e.to_string())),
    }
}

/// A cgroup filesystem mount from mountinfo.
#[derive(Debug)]
struct CgroupMount {
    /// The cgroup the mount shows at its mount point (not `/` inside a cgroup namespace).
    root: String,
    mount_point: PathBuf,
    v2: bool,
    /// Super options: the controllers of a v1 hierarchy.
    options: Vec<String>,
}

impl CgroupMount {
    /// Where `cgroup` (a path from /proc/<pid>/cgroup) appears under this mount, if at all.
    fn dir_for(&self, cgroup: &str) -> Option<PathBuf> {
        let rel = Path::new(cgroup).strip_prefix(&self.root).ok()?;
        // A `..` would escape the mount; /proc never prints one, but stay inside regardless.
        if rel.components().any(|c| !matches!(c, Component::Normal(_))) {
            return None;
        }
        Some(self.mount_point.join(rel))
    }
}

/// The cgroup mounts of a table that can be seen (see [`MountTable::visible`]).
fn cgroup_mounts(table: &MountTable) -> Vec<CgroupMount> {
    table
        .visible()
        .into_iter()
        .filter_map(|m| {
            let v2 = match m.fs_type.as_str() {
                "cgroup2" => true,
                "cgroup" => false,
                _ => return None,
            };
            Some(CgroupMount {
                root: m.root.clone(),
                mount_point: m.mount_point.clone(),
                v2,
                options: m.options().map(str::to_string).collect(),
            })
        })
        .collect()
}

fn io_err(path: &Path, source: io::Error) -> CgroupError {
    CgroupError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Reads a cgroup file; `None` when it does not exist, because a controller or a feature of
/// this kernel is absent, which is normal. ENODEV is what kernfs returns for a file of a
/// cgroup removed after it was opened.
fn read_opt(path: &Path) -> Result<Option<String>, CgroupError> {
    match fs::read_to_string(path) {
        Ok(s) => Ok(Some(s)),
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::EOPNOTSUPP) => Ok(None),
        Err(e) if e.raw_os_error() == Some(libc::ENODEV) => {
            Err(CgroupError::Gone(path.parent().unwrap_or(path).to_path_buf()))
        }
        Err(e) => Err(io_err(path, e)),
    }
}

/// Parses a single-value file; `max` (no limit) becomes `unlimited`.
fn parse_value(path: &Path, text: &str, unlimited: u64) -> Result<u64, CgroupError> {
    let t = text.trim();
    if t == "max" {
        return Ok(unlimited);
    }
    t.parse().map_err(|_| CgroupError::Parse {
        path: path.to_path_buf(),
        text: t.to_string(),
    })
}

fn read_u64(path: &Path, unlimited: u64) -> Result<Option<u64>, CgroupError> {
    read_opt(path)?.map(|t| parse_value(path, &t, unlimited)).transpose()
}

/// `key value` lines (cpu.stat, memory.stat, memory.events ...).
type Keyed = HashMap<String, u64>;

/// Parses a flat-keyed file. Lines that are not `key <u64>` are skipped, so a kernel adding a
/// differently shaped line does not break Stats.
fn parse_keyed(text: &str) -> Keyed {
    text.lines()
        .filter_map(|l| {
            let mut f = l.split_whitespace();
            let (k, v) = (f.next()?, f.next()?);
            if f.next().is_some() {
                return None;
            }
            Some((k.to_string(), v.parse().ok()?))
        })
        .collect()
}

fn read_keyed(path: &Path) -> Result<Option<Keyed>, CgroupError> {
    Ok(read_opt(path)?.map(|t| parse_keyed(&t)))
}

/// A keyed value, 0 when the kernel does not report it (as containerd does).
fn get(kv: &Keyed, key: &str) -> u64 {
    kv.get(key).copied().unwrap_or(0)
}

/// Parses `MAJ:MIN`.
fn parse_dev(s: &str) -> Option<(u64, u64)> {
    let (maj, min) = s.split_once(':')?;
    Some((maj.parse().ok()?, min.parse().ok()?))
}

/// The huge page sizes (`2MB`, `1GB`) a cgroup directory has files for, named by the file
/// each size has in both versions (`hugetlb.<size>.<suffix>`), sorted; none when `dir` is
/// unreadable (the controller is not there).
fn hugetlb_sizes(dir: &Path, suffix: &str) -> Vec<String> {
    let Ok(rd) = fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut sizes: Vec<String> = rd
        .filter_map(|e| e.ok())
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let size = name.strip_prefix("hugetlb.")?.strip_suffix(suffix)?;
            (!size.contains('.')).then(|| size.to_string())
        })
        .collect();
    sizes.sort();
    sizes
}

/// Writes cgroup files for a test: `(name, text)` under `dir`, created first.
#[cfg(test)]
fn write_files(dir: &Path, files: &[(&str, &str)]) {
    fs::create_dir_all(dir).unwrap();
    for (name, text) in files {
        fs::write(dir.join(name), text).unwrap();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn systemd_paths_are_told_from_cgroupfs_paths() {
        assert!(is_systemd_path("kubepods-besteffort-pod1.slice:crio:abc"));
        assert!(is_systemd_path(":crio:abc"));
        assert!(is_systemd_path("system.slice:docker:abc"));
        assert!(!is_systemd_path("/kubepods/besteffort/pod1/abc"));
        assert!(!is_systemd_path("/a:b:c"));
        assert!(!is_systemd_path("relative/path"));
        assert!(!is_systemd_path("a:b"));
        assert!(!is_systemd_path(""));
    }

    const HYBRID_MOUNTINFO: &str = "\
31 23 0:28 / /sys/fs/cgroup rw,relatime - tmpfs tmpfs rw,mode=755
32 31 0:29 / /sys/fs/cgroup/cpu,cpuacct rw,relatime shared:9 - cgroup cgroup rw,cpu,cpuacct
35 31 0:32 / /sys/fs/cgroup/memory rw,relatime - cgroup cgroup rw,memory
38 31 0:35 / /sys/fs/cgroup/blkio rw,relatime - cgroup cgroup rw,blkio
39 31 0:36 / /sys/fs/cgroup/pids rw,relatime - cgroup cgroup rw,pids
40 31 0:37 / /sys/fs/cgroup/systemd rw,relatime - cgroup cgroup rw,xattr,name=systemd
41 31 0:38 / /sys/fs/cgroup/unified rw,relatime - cgroup2 cgroup2 rw
50 23 0:50 / /proc rw - proc proc rw
";

    #[test]
    fn resolves_v1_paths_with_comounted_controllers() {
        let cgroup = "\
12:pids:/kubepods/pod1/abc
9:memory:/kubepods/pod1/abc
4:cpu,cpuacct:/kubepods/pod1/abc
3:blkio:/kubepods/pod1/abc
1:name=systemd:/kubepods/pod1/abc
0::/kubepods/pod1/abc
";
        let cg = ContainerCgroup::resolve(7, false, cgroup, &MountTable::parse(HYBRID_MOUNTINFO)).unwrap();
        assert!(!cg.is_v2());
        let p = cg.v1_paths().unwrap();
        let at = |c: &str| Some(PathBuf::from(format!("/sys/fs/cgroup/{c}/kubepods/pod1/abc")));
        assert_eq!(p.memory, at("memory"));
        assert_eq!(p.cpu, at("cpu,cpuacct"));
        assert_eq!(p.cpuacct, at("cpu,cpuacct"));
        assert_eq!(p.pids, at("pids"));
        assert_eq!(p.blkio, at("blkio"));
        assert_eq!(p.hugetlb, None);
    }

    #[test]
    fn resolves_v2_path_on_the_cgroup2_mount() {
        let mountinfo = "25 1 0:22 / /sys/fs/cgroup rw,nosuid - cgroup2 cgroup2 rw,nsdelegate\n";
        let cgroup = "0::/system.slice/crio-abc.scope\n";
        let cg = ContainerCgroup::resolve(7, true, cgroup, &MountTable::parse(mountinfo)).unwrap();
        assert!(cg.is_v2());
        assert_eq!(
            cg.v2_dir(),
            Some(Path::new("/sys/fs/cgroup/system.slice/crio-abc.scope"))
        );
        // Hybrid host asked for v2: the unified mount is the cgroup2 one.
        let cg = ContainerCgroup::resolve(7, true, cgroup, &MountTable::parse(HYBRID_MOUNTINFO)).unwrap();
        assert_eq!(
            cg.v2_dir(),
            Some(Path::new("/sys/fs/cgroup/unified/system.slice/crio-abc.scope"))
        );
    }

    #[test]
    fn mount_root_is_stripped_and_foreign_paths_rejected() {
        // A mount showing only /kubepods (cgroup namespace or bind mount).
        let mountinfo = "35 31 0:32 /kubepods /sys/fs/cgroup/memory rw - cgroup cgroup rw,memory\n";
        let cg = ContainerCgroup::resolve(7, false, "9:memory:/kubepods/x\n", &MountTable::parse(mountinfo)).unwrap();
        assert_eq!(
            cg.v1_paths().unwrap().memory,
            Some(PathBuf::from("/sys/fs/cgroup/memory/x"))
        );
        let e = ContainerCgroup::resolve(7, false, "9:memory:/other/x\n", &MountTable::parse(mountinfo)).unwrap_err();
        assert!(matches!(e, CgroupError::Locate { pid: 7, .. }), "{e}");
        let e = ContainerCgroup::resolve(7, true, "9:memory:/x\n", &MountTable::parse(mountinfo)).unwrap_err();
        assert!(e.to_string().contains("no cgroup2 entry"), "{e}");
    }

    #[test]
    fn mounts_covered_by_a_later_mount_are_left_out() {
        // A namespace's cgroup2 mounted over a hybrid host's /sys/fs/cgroup (tmpfs): the v1 and
        // `unified` mounts stay in its table, hidden.
        let mountinfo = format!(
            "{HYBRID_MOUNTINFO}90 25 0:40 / /sys/fs/cgroup rw - cgroup2 none rw\n\
             91 90 0:41 / /sys/fs/cgroup/x/y rw - tmpfs tmpfs rw\n"
        );
        let cg =
            ContainerCgroup::resolve(7, true, "0::/kubepods.slice/a.scope\n", &MountTable::parse(&mountinfo)).unwrap();
        assert_eq!(cg.v2_dir(), Some(Path::new("/sys/fs/cgroup/kubepods.slice/a.scope")));
        let mounts = cgroup_mounts(&MountTable::parse(&mountinfo));
        assert_eq!(mounts.len(), 1, "only the namespace's own cgroup2 mount is seen");
        // A mount below another (not over it) hides nothing.
        assert!(cgroup_mounts(&MountTable::parse(HYBRID_MOUNTINFO)).len() > 1);
    }

    #[test]
    fn value_parsing() {
        let p = Path::new("f");
        assert_eq!(parse_value(p, "42\n", 0).unwrap(), 42);
        assert_eq!(parse_value(p, "max\n", u64::MAX).unwrap(), u64::MAX);
        assert_eq!(parse_value(p, "max", 0).unwrap(), 0);
        assert!(matches!(parse_value(p, "x", 0), Err(CgroupError::Parse { .. })));
        let kv = parse_keyed("a 1\nb 2 3\nc x\n\nd 4\n");
        assert_eq!(kv.len(), 2);
        assert_eq!(get(&kv, "a"), 1);
        assert_eq!(get(&kv, "d"), 4);
        assert_eq!(get(&kv, "b"), 0);
        assert_eq!(parse_dev("8:16"), Some((8, 16)));
        assert_eq!(parse_dev("8"), None);
    }

    #[test]
    fn type_urls_match_the_proto_names() {
        use protobuf::MessageFull;
        assert_eq!(MetricsV1::descriptor().full_name(), V1_METRICS_TYPE_URL);
        assert_eq!(MetricsV2::descriptor().full_name(), V2_METRICS_TYPE_URL);
    }

    #[test]
    fn missing_cgroup_is_gone() {
        let d = tempfile::tempdir().unwrap();
        let cg = ContainerCgroup::v2_at(d.path().join("nope"));
        assert!(matches!(cg.metrics_any(), Err(CgroupError::Gone(_))));
        assert!(matches!(cg.oom_kills(), Err(CgroupError::Gone(_))));
        let cg = ContainerCgroup::v1_at(V1Paths {
            memory: Some(d.path().join("nope")),
            ..Default::default()
        });
        assert!(matches!(cg.metrics_any(), Err(CgroupError::Gone(_))));
    }
}
