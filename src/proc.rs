//! The one reader of the kernel's per-process files: `/proc/<pid>/mountinfo`,
//! `/proc/<pid>/cgroup`, `/proc/<pid>/stat` and `/proc/<pid>/status`.
//!
//! Cgroup paths, mount propagation and unmounting all follow from these texts, so they are
//! parsed once, here, with the same rules everywhere: mountinfo's octal escapes are decoded, a
//! mount that a later mount covers is not "seen", and a command name holding spaces or `)` does
//! not shift the fields of `stat`. The `procfs` crate (in the tree through libcgroups) parses the
//! same files but allocates a struct of every field for each line and reads through its own
//! error type; these few fields are all gantry needs.

use std::io;
use std::path::{Path, PathBuf};

/// One line of a mountinfo table.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Mount {
    /// The directory of the filesystem that the mount shows (not `/` for a bind or inside a
    /// cgroup namespace).
    pub root: String,
    pub mount_point: PathBuf,
    /// The optional fields (`shared:N`, `master:N`, ...).
    pub optional: Vec<String>,
    pub fs_type: String,
    pub source: String,
    /// The super options, comma separated as the kernel writes them.
    pub super_options: String,
}

impl Mount {
    /// Whether the mount is a peer of a shared group (its mounts propagate).
    pub fn is_shared(&self) -> bool {
        self.optional.iter().any(|o| o.starts_with("shared:"))
    }

    /// The super options one by one (for a v1 cgroup mount: its controllers and `name=`).
    pub fn options(&self) -> impl Iterator<Item = &str> {
        self.super_options.split(',')
    }

    /// Parses one line: `id parent maj:min root mount-point options [optional...] - fstype
    /// source super-options`.
    fn parse(line: &str) -> Option<Self> {
        let (left, right) = line.split_once(" - ")?;
        let left: Vec<&str> = left.split(' ').collect();
        let mut right = right.split(' ');
        Some(Self {
            root: unescape(left.get(3)?),
            mount_point: PathBuf::from(unescape(left.get(4)?)),
            optional: left.iter().skip(6).map(|s| s.to_string()).collect(),
            fs_type: unescape(right.next()?),
            source: unescape(right.next().unwrap_or_default()),
            super_options: unescape(right.next().unwrap_or_default()),
        })
    }
}

/// A process's mount table, in the kernel's order (a mount is listed after its parent and after
/// the mounts it covers).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MountTable {
    mounts: Vec<Mount>,
}

impl MountTable {
    /// This process's table.
    pub fn of_self() -> io::Result<Self> {
        Ok(Self::parse(&std::fs::read_to_string("/proc/self/mountinfo")?))
    }

    /// Parses a mountinfo text; a malformed line is left out.
    pub fn parse(text: &str) -> Self {
        Self {
            mounts: text.lines().filter_map(Mount::parse).collect(),
        }
    }

    /// Every mount, covered or not, in the kernel's order.
    pub fn all(&self) -> &[Mount] {
        &self.mounts
    }

    /// The mounts that can be seen: one that a later mount covers (on its mount point or above
    /// it, as a namespace that mounts cgroup2 over a hybrid host's `/sys/fs/cgroup` leaves the
    /// v1 and `unified` mounts in its table) is left out. Kernel order.
    pub fn visible(&self) -> Vec<&Mount> {
        let mut seen = Vec::new();
        for (i, m) in self.mounts.iter().enumerate() {
            let later = &self.mounts[i + 1..];
            if !later.iter().any(|l| m.mount_point.starts_with(&l.mount_point)) {
                seen.push(m);
            }
        }
        seen
    }

    /// The seen mount that holds `path` (the one with the longest mount point above it).
    pub fn holding(&self, path: &Path) -> Option<&Mount> {
        self.visible()
            .into_iter()
            .filter(|m| path.starts_with(&m.mount_point))
            .max_by_key(|m| m.mount_point.as_os_str().len())
    }

    /// Mount points at or below `target`, covered ones included, deepest first, each once.
    pub fn below(&self, target: &Path) -> Vec<PathBuf> {
        let mut points: Vec<PathBuf> = self
            .mounts
            .iter()
            .map(|m| m.mount_point.clone())
            .filter(|p| p.starts_with(target))
            .collect();
        points.sort_by_key(|p| std::cmp::Reverse(p.components().count()));
        points.dedup();
        points
    }

    /// Whether something is mounted exactly at `target` (already resolved).
    pub fn is_mount_point(&self, target: &Path) -> bool {
        self.mounts.iter().any(|m| m.mount_point == target)
    }
}

/// Undoes mountinfo's octal escapes (the kernel writes space, tab, newline and backslash as
/// `\ooo`). A backslash not followed by three octal digits is kept.
pub fn unescape(field: &str) -> String {
    let b = field.as_bytes();
    let mut out = Vec::with_capacity(b.len());
    let mut i = 0;
    while i < b.len() {
        let code = b
            .get(i + 1..i + 4)
            .filter(|d| b[i] == b'\\' && d.iter().all(|c| (b'0'..=b'7').contains(c)))
            .and_then(|d| u8::try_from(d.iter().fold(0u32, |acc, c| acc * 8 + u32::from(c - b'0'))).ok());
        match code {
            Some(byte) => {
                out.push(byte);
                i += 4;
            }
            None => {
                out.push(b[i]);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// One line of `/proc/<pid>/cgroup`: `hierarchy-id:controllers:path`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CgroupEntry {
    /// Empty for the unified (v2) line and for a v1 `name=` hierarchy's line it is `name=...`.
    pub controllers: Vec<String>,
    pub path: String,
}

impl CgroupEntry {
    /// The unified hierarchy's line (`0::path`).
    pub fn is_unified(&self) -> bool {
        self.controllers.is_empty()
    }
}

/// The text of `/proc/<pid>/cgroup`.
pub fn cgroup_text(pid: i32) -> io::Result<String> {
    std::fs::read_to_string(format!("/proc/{pid}/cgroup"))
}

/// Parses a `/proc/<pid>/cgroup` text. The path may contain `:`, so only the first two are split.
pub fn parse_cgroups(text: &str) -> Vec<CgroupEntry> {
    text.lines()
        .filter_map(|l| {
            let mut parts = l.splitn(3, ':');
            let (_id, controllers, path) = (parts.next()?, parts.next()?, parts.next()?);
            Some(CgroupEntry {
                controllers: controllers
                    .split(',')
                    .filter(|c| !c.is_empty())
                    .map(str::to_string)
                    .collect(),
                path: path.to_string(),
            })
        })
        .collect()
}

/// The cgroup2 path in a `/proc/<pid>/cgroup` text (its `0::` line).
pub fn unified_path(text: &str) -> Option<&str> {
    text.lines().find_map(|l| l.strip_prefix("0::"))
}

/// The fields of `/proc/<pid>/stat` that follow the command name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Stat {
    /// Field 3 onwards (`state`, `ppid`, ...), so field `n` of proc(5) is `rest[n - 3]`.
    rest: Vec<String>,
}

impl Stat {
    /// Reads `/proc/<pid>/stat` (`"self"` for this process).
    pub fn of(pid: &str) -> io::Result<Self> {
        let text = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
        Self::parse(&text).ok_or_else(|| io::Error::new(io::ErrorKind::InvalidData, "malformed stat"))
    }

    /// Parses a stat text. The command name is in parentheses and may hold spaces and `)`, so
    /// the fields start after the last `)`.
    pub fn parse(text: &str) -> Option<Self> {
        let rest = text.rsplit_once(')')?.1;
        let rest: Vec<String> = rest.split_whitespace().map(str::to_string).collect();
        (!rest.is_empty()).then_some(Self { rest })
    }

    /// Field `n` as numbered in proc(5) (1 = pid, 2 = comm, 3 = state, ...); `None` for 1 and 2.
    pub fn field(&self, n: usize) -> Option<&str> {
        self.rest.get(n.checked_sub(3)?).map(String::as_str)
    }

    /// The state letter (`R`, `S`, `Z`, ...).
    pub fn state(&self) -> Option<&str> {
        self.field(3)
    }

    pub fn ppid(&self) -> Option<i32> {
        self.field(4)?.parse().ok()
    }
}

/// Whether `pid` exists and is not a zombie.
pub fn is_running(pid: i32) -> bool {
    Stat::of(&pid.to_string()).is_ok_and(|s| s.state() != Some("Z"))
}

/// This process's `oom_score_adj`: the floor `[runtime] restrict_oom_score_adj` holds
/// containers to. Read once; the daemon never changes its own.
pub fn own_oom_score_adj() -> Option<i32> {
    static OWN: std::sync::OnceLock<Option<i32>> = std::sync::OnceLock::new();
    *OWN.get_or_init(|| {
        std::fs::read_to_string("/proc/self/oom_score_adj")
            .ok()
            .and_then(|s| s.trim().parse().ok())
    })
}

/// The number of threads of this process (`Threads:` in `/proc/self/status`).
pub fn own_threads() -> Option<usize> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    status
        .lines()
        .find_map(|l| l.strip_prefix("Threads:"))
        .and_then(|n| n.trim().parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    const HYBRID: &str = "\
30 1 8:1 / / rw,relatime shared:1 - ext4 /dev/vda rw
24 30 0:22 / /sys rw,nosuid shared:7 - sysfs sysfs rw
31 24 0:26 / /sys/fs/cgroup ro,nosuid shared:8 - tmpfs tmpfs ro,mode=755
32 31 0:27 / /sys/fs/cgroup/unified rw shared:9 - cgroup2 cgroup2 rw,nsdelegate
35 31 0:30 / /sys/fs/cgroup/memory rw shared:12 - cgroup cgroup rw,memory
";

    #[test]
    fn fields_are_split_and_escapes_decoded() {
        let t = MountTable::parse("1 2 0:3 /a\\134b /x\\040y rw shared:4 master:1 - cgroup cg\\011x rw,pids\n");
        let m = &t.all()[0];
        assert_eq!(m.root, "/a\\b");
        assert_eq!(m.mount_point, Path::new("/x y"));
        assert_eq!(m.source, "cg\tx");
        assert_eq!(m.optional, ["shared:4", "master:1"]);
        assert!(m.is_shared());
        assert_eq!(m.options().collect::<Vec<_>>(), ["rw", "pids"]);
    }

    #[test]
    fn a_stray_backslash_or_a_code_over_a_byte_is_kept() {
        assert_eq!(unescape("a\\b\\12"), "a\\b\\12");
        assert_eq!(unescape("\\777x"), "\\777x");
        assert_eq!(unescape("\\303\\251"), "é");
    }

    #[test]
    fn a_mount_covered_by_a_later_one_is_not_seen() {
        // A cgroup namespace that mounted cgroup2 over the hybrid host's /sys/fs/cgroup.
        let text = format!("{HYBRID}40 30 0:40 / /sys/fs/cgroup rw - cgroup2 cgroup2 rw\n");
        let t = MountTable::parse(&text);
        let seen: Vec<&str> = t.visible().iter().map(|m| m.fs_type.as_str()).collect();
        assert_eq!(seen, ["ext4", "sysfs", "cgroup2"]);
        assert_eq!(t.visible()[2].mount_point, Path::new("/sys/fs/cgroup"));
        // Without the cover, the host's hierarchies are all seen.
        assert_eq!(MountTable::parse(HYBRID).visible().len(), 5);
    }

    #[test]
    fn the_holding_mount_is_the_deepest_seen_one() {
        let t = MountTable::parse(HYBRID);
        let m = t.holding(Path::new("/sys/fs/cgroup/memory/kubepods")).unwrap();
        assert_eq!(m.fs_type, "cgroup");
        assert_eq!(t.holding(Path::new("/srv")).unwrap().fs_type, "ext4");
        // Path components, not string prefixes: /sys/fs/cgroupx is not under /sys/fs/cgroup.
        assert_eq!(t.holding(Path::new("/sys/fs/cgroupx")).unwrap().fs_type, "sysfs");
    }

    #[test]
    fn mounts_below_a_target_come_deepest_first() {
        let t = MountTable::parse(HYBRID);
        let below = t.below(Path::new("/sys/fs/cgroup"));
        assert_eq!(below.len(), 3);
        assert_eq!(below[2], Path::new("/sys/fs/cgroup"));
        assert!(t.below(Path::new("/sys/fs/cgroup/mem")).is_empty());
        assert!(t.is_mount_point(Path::new("/sys/fs/cgroup/unified")));
        assert!(!t.is_mount_point(Path::new("/sys/fs")));
    }

    #[test]
    fn cgroup_lines_keep_colons_in_paths() {
        let e = parse_cgroups("9:memory,cpu:/a:b\n1:name=systemd:/x\n0::/k.slice\n");
        assert_eq!(e[0].controllers, ["memory", "cpu"]);
        assert_eq!(e[0].path, "/a:b");
        assert_eq!(e[1].controllers, ["name=systemd"]);
        assert!(e[2].is_unified());
        assert_eq!(unified_path("9:memory:/a\n0::/k.slice\n"), Some("/k.slice"));
    }

    #[test]
    fn stat_fields_follow_a_command_name_with_spaces_and_parens() {
        let s = Stat::parse("42 (a b) c) S 7 42 42 0 -1").unwrap();
        assert_eq!(s.state(), Some("S"));
        assert_eq!(s.ppid(), Some(7));
        assert_eq!(s.field(2), None);
        assert!(Stat::parse("garbage").is_none());
        let me = Stat::of("self").unwrap();
        assert_eq!(me.ppid(), Some(nix::unistd::getppid().as_raw()));
        assert!(is_running(std::process::id() as i32));
        assert!(own_threads().unwrap() >= 1);
    }
}
