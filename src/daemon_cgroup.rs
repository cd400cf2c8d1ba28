//! Where a pod's daemon lives in the cgroup tree: out of the engine's service cgroup, before it
//! serves, so that stopping or restarting the engine's unit never signals it.
//!
//! Why: `start` forks the daemon, so it begins in the engine's cgroup, and systemd stops a
//! service by signalling every process in that cgroup (`KillMode=control-group`, the default,
//! which CRI-O's upstream unit keeps). `systemctl restart crio` then ended every gantry pod's
//! daemon while its containers ran on, unreachable. containerd's unit sets `KillMode=process`;
//! CRI-O itself moves each conmon into a scope of its own (`crio-conmon-<id>.scope`, in
//! `system.slice` by default); Kata moves its shim into the pod's cgroup. gantry does what
//! CRI-O does for conmon, whatever the engine:
//!
//! - systemd running: a transient scope `gantry-shim-<hash>.scope` (the hash of the daemon's
//!   socket name) in `system.slice`, started over D-Bus with the daemon's pid; systemd collects
//!   it when the daemon exits, killed or not.
//! - no systemd: a cgroup `/gantry/<hash>` of its own in every hierarchy; the daemon moves back
//!   to the root and removes it as it exits, and `delete` removes a killed daemon's.
//!
//! `system.slice` and not the pod's slice, by default: the daemon's memory (about half a MB
//! per pod) is then charged to the node, as conmon's is, rather than to the pod's own limit,
//! where a pod near its limit could have its daemon OOM-killed with it. A RuntimeClass
//! `overhead` therefore reserves nothing for the daemon on the pod's side; an operator who
//! wants it charged elsewhere names a slice.

use std::path::{Path, PathBuf};
use std::time::Duration;

use slog::{info, warn, Logger};

use crate::config::Placement;
use crate::sandbox::systemd::{start_scope, Scope};

/// How long the move may take before the daemon serves where it is (the engine's `start`
/// waits 10 s for the daemon in all).
const MOVE_TIMEOUT: Duration = Duration::from_secs(3);

/// The parent of every daemon's cgroup when systemd is not running (`"auto"`).
const CGROUPFS_PARENT: &str = "/gantry";

/// systemd runs and answers on the system bus: then `"auto"` asks it for a scope.
fn systemd_reachable() -> bool {
    libcgroups::systemd::booted() && crate::dbus::system_bus().is_some()
}

/// Where the daemon went, and what its exit has to undo.
#[derive(Debug, PartialEq, Eq)]
pub enum Home {
    /// Left where the engine started it.
    Engine,
    /// A transient scope: systemd removes it once empty.
    Scope(String),
    /// A cgroupfs cgroup (relative to each hierarchy's root): removed at exit.
    Cgroup(PathBuf),
}

/// The name a daemon's scope or cgroup takes: its socket's file name (already a short hash
/// of namespace and pod), else the id.
pub fn name_for(socket: &Path, id: &str) -> String {
    socket
        .file_name()
        .and_then(|n| n.to_str())
        .filter(|n| !n.is_empty() && crate::config::unit_name_ok(n))
        .unwrap_or(id)
        .to_string()
}

/// Moves this process out of the engine's cgroup as `placement` says. A failure is logged and
/// the daemon serves where it is: a pod is better served from the engine's cgroup than not
/// at all.
pub fn leave_engine(placement: &Placement, name: &str, description: &str, log: &Logger) -> Home {
    let systemd = systemd_reachable();
    let moved = match placement {
        Placement::Engine => return Home::Engine,
        Placement::Auto if systemd => into_scope("system.slice", name, description),
        Placement::Slice(slice) if systemd => into_scope(slice, name, description),
        Placement::Slice(slice) => Err(format!("{slice} needs systemd, which is not running")),
        Placement::Auto => into_cgroup(&Path::new(CGROUPFS_PARENT).join(name)),
        Placement::Parent(parent) => into_cgroup(&parent.join(name)),
    };
    match moved {
        Ok(home) => {
            info!(log, "daemon left the engine's cgroup"; "cgroup" => ?home);
            home
        }
        Err(why) => {
            warn!(log, "daemon stays in the engine's cgroup: stopping the engine's unit will signal it"; "reason" => why);
            Home::Engine
        }
    }
}

fn into_scope(slice: &str, name: &str, description: &str) -> Result<Home, String> {
    let unit = format!("gantry-shim-{name}.scope");
    let scope = Scope {
        unit: &unit,
        description,
        slice,
        pid: std::process::id(),
        extra: &[],
    };
    // Returns once the kernel shows the daemon in the scope: it serves only from there.
    start_scope(&scope, MOVE_TIMEOUT).map_err(|e| e.to_string())?;
    Ok(Home::Scope(unit))
}

/// Every cgroup hierarchy this process sees: v1 controllers and named ones, and the unified.
fn hierarchies() -> Vec<PathBuf> {
    let mut all = crate::sandbox::cgroup::hierarchies(|_| true);
    all.extend(crate::sandbox::cgroup::cgroup2_mounts());
    all
}

fn into_cgroup(path: &Path) -> Result<Home, String> {
    let relative = path.strip_prefix("/").unwrap_or(path);
    let pid = std::process::id().to_string();
    for mount in hierarchies() {
        let mut dir = mount.clone();
        for part in relative.components() {
            dir.push(part);
            if !dir.exists() {
                std::fs::create_dir(&dir).map_err(|e| format!("{}: {e}", dir.display()))?;
                inherit_cpuset(&dir);
            }
        }
        std::fs::write(dir.join("cgroup.procs"), &pid).map_err(|e| format!("{}: {e}", dir.display()))?;
    }
    Ok(Home::Cgroup(relative.to_path_buf()))
}

/// A new v1 cpuset cgroup starts with no CPUs and no memory nodes, and takes no task until
/// it has both: copied from its parent, as runc and libcgroups do.
fn inherit_cpuset(dir: &Path) {
    for file in ["cpuset.cpus", "cpuset.mems"] {
        let own = dir.join(file);
        let empty = std::fs::read_to_string(&own).is_ok_and(|v| v.trim().is_empty());
        if let (true, Some(parent)) = (empty, dir.parent()) {
            if let Ok(v) = std::fs::read_to_string(parent.join(file)) {
                let _ = std::fs::write(&own, v.trim());
            }
        }
    }
}

impl Home {
    /// At the daemon's exit: a cgroupfs home is left for each hierarchy's root and removed
    /// (a process cannot remove the cgroup it is in); a scope is systemd's to collect.
    pub fn leave(&self) {
        let Home::Cgroup(relative) = self else {
            return;
        };
        let pid = std::process::id().to_string();
        for mount in hierarchies() {
            let _ = std::fs::write(mount.join("cgroup.procs"), &pid);
        }
        remove_cgroup(relative);
    }
}

/// Removes a daemon's cgroupfs cgroup from every hierarchy; one still in use stays (`rmdir`
/// refuses it). `delete` calls it for a daemon that was killed.
pub fn remove_cgroup(relative: &Path) {
    for mount in hierarchies() {
        let _ = std::fs::remove_dir(mount.join(relative));
    }
}

/// The cgroupfs home a daemon of this socket would have had under `placement` (for
/// `delete`, after the daemon died): none under systemd, which collects its scope itself.
pub fn cgroup_of_dead(placement: &Placement, socket: &Path, id: &str) -> Option<PathBuf> {
    if systemd_reachable() {
        return None;
    }
    let parent = match placement {
        Placement::Auto => PathBuf::from(CGROUPFS_PARENT),
        Placement::Parent(p) => p.clone(),
        Placement::Engine | Placement::Slice(_) => return None,
    };
    let path = parent.join(name_for(socket, id));
    Some(path.strip_prefix("/").unwrap_or(&path).to_path_buf())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_daemon_is_named_after_its_socket() {
        let socket = Path::new("/run/gantry/s/0123456789abcdef0123456789abcdef");
        assert_eq!(name_for(socket, "pod1"), "0123456789abcdef0123456789abcdef");
        assert_eq!(name_for(Path::new(""), "pod1"), "pod1");
    }

    /// The cgroupfs home is made level by level in a hierarchy and a cpuset level takes its
    /// parent's CPUs and memory nodes (else the kernel refuses the daemon's pid).
    #[test]
    fn a_new_cpuset_level_takes_its_parents_cpus_and_nodes() {
        let root = tempfile::tempdir().unwrap();
        std::fs::write(root.path().join("cpuset.cpus"), "0-1\n").unwrap();
        std::fs::write(root.path().join("cpuset.mems"), "0\n").unwrap();
        let child = root.path().join("gantry");
        std::fs::create_dir(&child).unwrap();
        std::fs::write(child.join("cpuset.cpus"), "\n").unwrap();
        std::fs::write(child.join("cpuset.mems"), "").unwrap();
        inherit_cpuset(&child);
        assert_eq!(std::fs::read_to_string(child.join("cpuset.cpus")).unwrap(), "0-1");
        assert_eq!(std::fs::read_to_string(child.join("cpuset.mems")).unwrap(), "0");
    }
}
