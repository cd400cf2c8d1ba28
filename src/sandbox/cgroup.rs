//! The fast-path container's cgroup (v1, cgroupfs): joined, limited, frozen, listed and removed
//! through libcgroups, plus the named hierarchies (`name=systemd`) libcgroups leaves alone and
//! runc joins too.

use std::path::{Path, PathBuf};

use libcgroups::common::{
    create_cgroup_manager, AnyCgroupManager, CgroupConfig, CgroupManager, ControllerOpt, FreezerState,
};
use nix::unistd::Pid;
use oci_spec::runtime::{LinuxDeviceCgroup, LinuxDeviceCgroupBuilder, LinuxDeviceType, LinuxResources};

use crate::proc::{self, MountTable};

/// Why a cgroup operation failed (reported as the fast path's runtime error).
#[derive(Debug, thiserror::Error)]
#[error("cgroup {path}: {why}")]
pub struct CgroupError {
    pub path: String,
    pub why: String,
}

pub(super) fn err(path: &Path, why: impl ToString) -> CgroupError {
    CgroupError {
        path: path.display().to_string(),
        why: why.to_string(),
    }
}

/// libcgroups' manager for this host's mode and `path`'s driver: v1 on a legacy or hybrid host;
/// on a v2 host, systemd's for a `slice:prefix:name` path (a scope unit started and changed
/// over D-Bus, as runc's systemd driver does), else v2's.
pub(super) fn manager(path: &Path) -> Result<AnyCgroupManager, CgroupError> {
    let unit = systemd_unit(path);
    let config = CgroupConfig {
        cgroup_path: path.to_path_buf(),
        systemd_cgroup: unit.is_some(),
        container_name: unit.map(|u| u.name).unwrap_or_default(),
    };
    create_cgroup_manager(config).map_err(|e| err(path, e))
}

/// A systemd-driver `cgroupsPath` (`slice:prefix:name`), as the fast path takes it.
#[derive(Debug, PartialEq, Eq)]
pub struct SystemdUnit {
    /// The container's name (`name`).
    pub name: String,
    /// The scope unit runc would start for it: `prefix-name.scope`.
    pub scope: String,
}

/// `path` as a systemd-driver `cgroupsPath`: a parent slice (`*.slice`, or empty for
/// `system.slice`), a prefix and a name, none with a `/`; a name that is itself a slice (a
/// unit the runtime would create as a slice, not a scope) is not taken.
pub fn systemd_unit(path: &Path) -> Option<SystemdUnit> {
    let text = path.to_str()?;
    let parts: Vec<&str> = text.split(':').collect();
    let [slice, prefix, name] = parts[..] else {
        return None;
    };
    let slice_ok = slice.is_empty() || (slice.len() > ".slice".len() && slice.ends_with(".slice"));
    let plain = |s: &str| !s.is_empty() && !s.contains('/') && s != "." && s != "..";
    (slice_ok && !slice.contains('/') && plain(prefix) && plain(name) && !name.ends_with(".slice")).then(|| {
        SystemdUnit {
            name: name.to_string(),
            scope: format!("{prefix}-{name}.scope"),
        }
    })
}

/// `pid`'s cgroup2 directory (from `/proc/<pid>/cgroup`): where systemd put it.
pub(super) fn v2_dir_of(pid: i32) -> Result<PathBuf, CgroupError> {
    let file = PathBuf::from(format!("/proc/{pid}/cgroup"));
    let text = proc::cgroup_text(pid).map_err(|e| err(&file, e))?;
    let path = proc::unified_path(&text).ok_or_else(|| err(&file, "no cgroup2 line"))?;
    under_v2_root(path).map_err(|why| err(&file, why))
}

/// A cgroup2 path from `/proc` as a directory under the v2 mount. Seen from a cgroup namespace
/// a path may climb (`/../x`): not one to join.
pub(super) fn under_v2_root(path: &str) -> Result<PathBuf, String> {
    if path.split('/').any(|c| c == "..") {
        return Err(format!("cgroup path {path} is outside this namespace's root"));
    }
    Ok(Path::new(V2_ROOT).join(relative(Path::new(path))))
}

/// Where a unified (v2) host mounts its cgroups.
const V2_ROOT: &str = "/sys/fs/cgroup";

/// True on a cgroup v2 (unified) host.
pub fn host_is_v2() -> bool {
    matches!(
        libcgroups::common::get_cgroup_setup(),
        Ok(libcgroups::common::CgroupSetup::Unified)
    )
}

fn v2_dir(path: &Path) -> PathBuf {
    Path::new(V2_ROOT).join(relative(path))
}

/// Creates `path` in the v2 hierarchy as libcgroups' v2 manager (and runc) do before they move
/// a process in: each level created, and every controller the root offers enabled in the
/// root's and each intermediate level's `cgroup.subtree_control` (best effort, as theirs: a
/// limit needing a controller that could not be enabled fails when applied). Returns the
/// leaf's directory.
pub(super) fn create_v2(path: &Path) -> Result<PathBuf, CgroupError> {
    create_v2_under(Path::new(V2_ROOT), path)
}

fn create_v2_under(root: &Path, path: &Path) -> Result<PathBuf, CgroupError> {
    let available = std::fs::read_to_string(root.join("cgroup.controllers")).map_err(|e| err(root, e))?;
    let enable = |dir: &Path| {
        for c in available.split_whitespace() {
            let _ = std::fs::write(dir.join("cgroup.subtree_control"), format!("+{c}"));
        }
    };
    enable(root);
    let mut dir = root.to_path_buf();
    let mut parts = relative(path).components().peekable();
    while let Some(part) = parts.next() {
        dir.push(part);
        match std::fs::create_dir(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::AlreadyExists => return Err(err(&dir, e)),
            _ => {}
        }
        if parts.peek().is_some() {
            enable(&dir);
        }
    }
    Ok(dir)
}

/// runc's always-allowed device rules, appended after the spec's (specconv's AllowedDevices).
fn default_rules() -> Vec<LinuxDeviceCgroup> {
    let rule = |typ, major: Option<i64>, minor: Option<i64>, access: &str| {
        let mut b = LinuxDeviceCgroupBuilder::default()
            .allow(true)
            .typ(typ)
            .access(access.to_string());
        if let Some(m) = major {
            b = b.major(m);
        }
        if let Some(m) = minor {
            b = b.minor(m);
        }
        b.build().unwrap_or_default()
    };
    use LinuxDeviceType::{B, C};
    vec![
        rule(C, None, None, "m"),
        rule(B, None, None, "m"),
        rule(C, Some(1), Some(3), "rwm"),
        rule(C, Some(1), Some(8), "rwm"),
        rule(C, Some(1), Some(7), "rwm"),
        rule(C, Some(5), Some(0), "rwm"),
        rule(C, Some(1), Some(5), "rwm"),
        rule(C, Some(1), Some(9), "rwm"),
        rule(C, Some(136), None, "rwm"),
        rule(C, Some(5), Some(2), "rwm"),
        rule(C, Some(10), Some(200), "rwm"),
    ]
}

/// The resources runc would write: the spec's device rules, an allow rule per
/// `linux.devices` node, then runc's defaults.
pub fn effective_resources(
    resources: Option<&LinuxResources>,
    nodes: &[(LinuxDeviceType, i64, i64)],
) -> LinuxResources {
    let mut r = resources.cloned().unwrap_or_default();
    let mut rules = r.devices().clone().unwrap_or_default();
    for (typ, major, minor) in nodes {
        let node = LinuxDeviceCgroupBuilder::default()
            .allow(true)
            .typ(*typ)
            .major(*major)
            .minor(*minor)
            .access("rwm".to_string())
            .build();
        rules.extend(node.ok());
    }
    rules.extend(default_rules());
    r.set_devices(Some(rules));
    r
}

/// Mount points of the seen v1 hierarchies whose super options pass `pick`.
pub(crate) fn hierarchies(pick: fn(&str) -> bool) -> Vec<PathBuf> {
    cgroup_mounts("cgroup", pick)
}

fn cgroup_mounts(fs_type: &str, pick: fn(&str) -> bool) -> Vec<PathBuf> {
    let table = MountTable::of_self().unwrap_or_default();
    table
        .visible()
        .into_iter()
        .filter(|m| m.fs_type == fs_type && pick(&m.super_options))
        .map(|m| m.mount_point.clone())
        .collect()
}

/// Hierarchies libcgroups' v1 manager leaves alone and runc joins too: those mounted with a
/// `name=` option (no controller) and, on a hybrid host, the unified one.
fn extra_hierarchies() -> Vec<PathBuf> {
    let mut out = hierarchies(|opts| opts.split(',').any(|o| o.starts_with("name=")));
    out.extend(cgroup2_mounts());
    out
}

/// Mount points of the seen cgroup2 hierarchy (one, or none on a v1-only host).
pub(crate) fn cgroup2_mounts() -> Vec<PathBuf> {
    cgroup_mounts("cgroup2", |_| true)
}

/// Whether the cgroup exists in any v1 hierarchy (v2: in the one; systemd: its scope's).
pub fn exists(path: &Path) -> bool {
    if systemd_unit(path).is_some() {
        return manager(path).is_ok_and(|m| m.get_all_pids().is_ok());
    }
    if host_is_v2() {
        return v2_dir(path).is_dir();
    }
    hierarchies(|_| true).iter().any(|m| m.join(relative(path)).is_dir())
}

pub(super) fn relative(path: &Path) -> &Path {
    path.strip_prefix("/").unwrap_or(path)
}

/// Puts `pid` into `path` in every hierarchy (through `cgroup.procs`) and applies `resources`:
/// devices as runc's emulator writes them, the rest through libcgroups.
pub fn join(path: &Path, resources: &LinuxResources, pid: i32) -> Result<(), CgroupError> {
    let m = manager(path)?;
    m.add_task(Pid::from_raw(pid)).map_err(|e| err(path, e))?;
    if host_is_v2() {
        let dir = match systemd_unit(path) {
            Some(_) => v2_dir_of(pid)?,
            None => v2_dir(path),
        };
        return limit(&m, path, Some(&dir), resources);
    }
    limit(&m, path, None, resources)?;
    for mount in extra_hierarchies() {
        let dir = mount.join(relative(path));
        std::fs::create_dir_all(&dir).map_err(|e| err(&dir, e))?;
        std::fs::write(dir.join("cgroup.procs"), pid.to_string()).map_err(|e| err(&dir, e))?;
    }
    Ok(())
}

/// Applies `resources` to the joined cgroup: devices as an eBPF filter attached to `v2_dir`
/// (a v2 host's cgroup directory) or else as v1 devices files, the rest through libcgroups
/// (systemd: as unit properties).
pub(super) fn limit(
    m: &AnyCgroupManager,
    path: &Path,
    v2_dir: Option<&Path>,
    resources: &LinuxResources,
) -> Result<(), CgroupError> {
    let (rest, rules) = split_devices(resources);
    apply(m, path, &rest)?;
    devices(path, v2_dir, &rules)
}

/// [`limit`] for a scope systemd started (`dir`): unit properties only where there are limits
/// besides devices (libcgroups' manager costs a D-Bus connection), the device filter always.
pub(super) fn limit_scope(path: &Path, dir: &Path, resources: &LinuxResources) -> Result<(), CgroupError> {
    let (rest, rules) = split_devices(resources);
    if rest != LinuxResources::default() {
        apply(&manager(path)?, path, &rest)?;
    }
    devices(path, Some(dir), &rules)
}

fn split_devices(resources: &LinuxResources) -> (LinuxResources, Vec<LinuxDeviceCgroup>) {
    let mut rest = resources.clone();
    let rules = rest.devices().clone().unwrap_or_default();
    rest.set_devices(None);
    (rest, rules)
}

fn apply(m: &AnyCgroupManager, path: &Path, rest: &LinuxResources) -> Result<(), CgroupError> {
    let opt = ControllerOpt {
        resources: rest,
        disable_oom_killer: rest
            .memory()
            .as_ref()
            .and_then(|m| m.disable_oom_killer())
            .unwrap_or(false),
        oom_score_adj: None,
        freezer_state: None,
    };
    m.apply(&opt).map_err(|e| err(path, e))
}

fn devices(path: &Path, v2_dir: Option<&Path>, rules: &[LinuxDeviceCgroup]) -> Result<(), CgroupError> {
    if let Some(dir) = v2_dir {
        // No devices files on v2: the same rules as an eBPF program, as runc attaches one.
        let (allow_all, exceptions) = fold_devices(rules);
        let program = super::devfilter::program(allow_all, &exceptions).map_err(|e| err(path, e))?;
        return super::devfilter::attach(dir, &program).map_err(|e| err(dir, format!("device filter: {e}")));
    }
    if !rules.is_empty() {
        write_devices(path, rules)?;
    }
    Ok(())
}

/// A device rule as the v1 devices files take it: `c 1:3 rwm`.
fn rule_text(r: &LinuxDeviceCgroup) -> (String, (u8, i64, i64)) {
    let kind = match r.typ() {
        Some(LinuxDeviceType::B) => 'b',
        Some(LinuxDeviceType::C | LinuxDeviceType::U) => 'c',
        Some(LinuxDeviceType::P) => 'p',
        _ => 'a',
    };
    let num = |n: Option<i64>| n.map(|n| n.to_string()).unwrap_or_else(|| "*".into());
    let access = r.access().clone().unwrap_or_else(|| "rwm".into());
    let text = format!("{kind} {}:{} {access}", num(r.major()), num(r.minor()));
    (text, (kind as u8, r.major().unwrap_or(-1), r.minor().unwrap_or(-1)))
}

fn is_everything(r: &LinuxDeviceCgroup) -> bool {
    matches!(r.typ(), None | Some(LinuxDeviceType::A)) && r.major().is_none() && r.minor().is_none()
}

/// The rules folded as runc's devices emulator folds them: a rule on every device resets the
/// default, any other is an exception to it (or cancels one). Default, then sorted exceptions.
pub fn fold_devices(rules: &[LinuxDeviceCgroup]) -> (bool, Vec<String>) {
    let mut allow_all = true;
    let mut exceptions: Vec<(String, (u8, i64, i64))> = Vec::new();
    for r in rules {
        let allow = r.allow();
        if is_everything(r) {
            allow_all = allow;
            exceptions.clear();
            continue;
        }
        let rule = rule_text(r);
        exceptions.retain(|e| e.0 != rule.0);
        if allow != allow_all {
            exceptions.push(rule);
        }
    }
    exceptions.sort_by_key(|e| e.1);
    (allow_all, exceptions.into_iter().map(|e| e.0).collect())
}

fn write_devices(path: &Path, rules: &[LinuxDeviceCgroup]) -> Result<(), CgroupError> {
    let Some(mount) = hierarchies(|o| o.split(',').any(|c| c == "devices")).into_iter().next() else {
        return Err(err(path, "no devices hierarchy is mounted"));
    };
    let dir = mount.join(relative(path));
    let (allow_all, exceptions) = fold_devices(rules);
    let (reset, except) = if allow_all {
        ("devices.allow", "devices.deny")
    } else {
        ("devices.deny", "devices.allow")
    };
    std::fs::write(dir.join(reset), "a").map_err(|e| err(&dir, e))?;
    for rule in exceptions {
        std::fs::write(dir.join(except), &rule).map_err(|e| err(&dir, format!("{except} {rule}: {e}")))?;
    }
    Ok(())
}

/// New limits (Update).
pub fn update(path: &Path, resources: &LinuxResources) -> Result<(), CgroupError> {
    let opt = ControllerOpt {
        resources,
        disable_oom_killer: false,
        oom_score_adj: None,
        freezer_state: None,
    };
    manager(path)?.apply(&opt).map_err(|e| err(path, e))
}

pub fn freeze(path: &Path, frozen: bool) -> Result<(), CgroupError> {
    let state = if frozen {
        FreezerState::Frozen
    } else {
        FreezerState::Thawed
    };
    manager(path)?.freeze(state).map_err(|e| err(path, e))
}

pub fn pids(path: &Path) -> Result<Vec<i32>, CgroupError> {
    let pids = manager(path)?.get_all_pids().map_err(|e| err(path, e))?;
    Ok(pids.into_iter().map(Pid::as_raw).collect())
}

/// How long [`empty`] waits for killed tasks to leave: generous, since it is only reached when
/// something was still running, and the alternative is a cgroup left behind.
const EMPTY_WAIT: std::time::Duration = std::time::Duration::from_secs(10);

/// Kills what is in the cgroup and waits until the kernel has moved every killed task out
/// (or [`EMPTY_WAIT`] has passed): a task leaves only once it runs its exit, which on a loaded
/// host can take longer than the removal's own few retries, and rmdir fails with EBUSY until then.
fn empty(path: &Path) {
    let deadline = std::time::Instant::now() + EMPTY_WAIT;
    loop {
        let left = pids(path).unwrap_or_default();
        if left.is_empty() || std::time::Instant::now() >= deadline {
            return;
        }
        for pid in left {
            let _ = nix::sys::signal::kill(Pid::from_raw(pid), nix::sys::signal::SIGKILL);
        }
        std::thread::sleep(std::time::Duration::from_millis(10));
    }
}

/// Kills what is left in it and removes it from every hierarchy.
pub fn remove(path: &Path) -> Result<(), CgroupError> {
    if systemd_unit(path).is_some() {
        // Its processes first, so that stopping the scope finds nothing to wait for; one
        // manager (one D-Bus connection) for both.
        let m = manager(path)?;
        for pid in m.get_all_pids().unwrap_or_default() {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::SIGKILL);
        }
        return m.remove().map_err(|e| err(path, e));
    }
    if host_is_v2() {
        if !v2_dir(path).exists() {
            return Ok(());
        }
        empty(path);
        return manager(path)?.remove().map_err(|e| err(path, e));
    }
    empty(path);
    if let Err(e) = manager(path)?.remove() {
        // libcgroups stops at the first hierarchy whose directory is gone already (seen when a
        // failed RunPodSandbox's cleanup raced the init's exit); the rest go here, and only a
        // directory that stays is an error.
        let stayed = hierarchies(|_| true)
            .into_iter()
            .map(|m| m.join(relative(path)))
            .any(|dir| std::fs::remove_dir(&dir).is_err() && dir.exists());
        if stayed {
            return Err(err(path, e));
        }
    }
    for mount in extra_hierarchies() {
        let dir = mount.join(relative(path));
        match std::fs::remove_dir(&dir) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(err(&dir, e)),
            _ => {}
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runc_rules_follow_the_spec_and_node_rules() {
        let deny = LinuxDeviceCgroupBuilder::default()
            .allow(false)
            .access("rwm".to_string())
            .build()
            .unwrap();
        let mut spec = LinuxResources::default();
        spec.set_devices(Some(vec![deny.clone()]));
        let r = effective_resources(Some(&spec), &[(LinuxDeviceType::C, 195, 0)]);
        let rules = r.devices().clone().unwrap();
        assert_eq!(rules[0], deny);
        assert_eq!(
            (rules[1].major(), rules[1].minor(), rules[1].allow()),
            (Some(195), Some(0), true)
        );
        assert_eq!(rules.len(), 2 + default_rules().len());
        assert_eq!(rules.last().unwrap().major(), Some(10));
        let (allow_all, list) = fold_devices(&rules);
        assert!(!allow_all);
        assert_eq!(list[..3], ["b *:* m", "c *:* m", "c 1:3 rwm"]);
        assert_eq!(list[list.len() - 3..], ["c 10:200 rwm", "c 136:* rwm", "c 195:0 rwm"]);
    }

    #[test]
    fn v2_levels_are_created_with_controllers_enabled_above_the_leaf() {
        let tmp = tempfile::tempdir().unwrap();
        let root = tmp.path();
        std::fs::write(root.join("cgroup.controllers"), "cpu memory pids\n").unwrap();
        std::fs::create_dir(root.join("pod")).unwrap();
        let leaf = create_v2_under(root, Path::new("/pod/ctr")).unwrap();
        assert_eq!(leaf, root.join("pod/ctr"));
        assert!(leaf.is_dir());
        // A fixture's plain file keeps the last write: each enabled level got all three.
        for dir in [root.to_path_buf(), root.join("pod")] {
            assert_eq!(
                std::fs::read_to_string(dir.join("cgroup.subtree_control")).unwrap(),
                "+pids"
            );
        }
        assert!(!leaf.join("cgroup.subtree_control").exists());
        // Idempotent: a second container of the pod, the same pod again.
        create_v2_under(root, Path::new("/pod/ctr")).unwrap();
        assert!(create_v2_under(&root.join("missing"), Path::new("/a")).is_err());
    }

    #[test]
    fn folding_follows_runcs_emulator() {
        let rule = |allow: bool, typ: Option<LinuxDeviceType>, major: Option<i64>| {
            let mut b = LinuxDeviceCgroupBuilder::default()
                .allow(allow)
                .access("rwm".to_string());
            if let Some(t) = typ {
                b = b.typ(t);
            }
            if let Some(m) = major {
                b = b.major(m).minor(0);
            }
            b.build().unwrap()
        };
        use LinuxDeviceType::C;
        // Allow-all stays the default; a deny is an exception; a later allow cancels it.
        let (all, list) = fold_devices(&[rule(false, Some(C), Some(4)), rule(false, Some(C), Some(5))]);
        assert!(all);
        assert_eq!(list, ["c 4:0 rwm", "c 5:0 rwm"]);
        let (_, list) = fold_devices(&[rule(false, Some(C), Some(4)), rule(true, Some(C), Some(4))]);
        assert!(list.is_empty());
        // A rule on every device resets everything before it.
        let (all, list) = fold_devices(&[
            rule(true, Some(C), Some(4)),
            rule(false, None, None),
            rule(true, Some(C), Some(9)),
        ]);
        assert!(!all);
        assert_eq!(list, ["c 9:0 rwm"]);
    }
}
