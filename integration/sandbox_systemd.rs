//! The sandbox fast path with the systemd cgroup driver, against a real systemd: the same
//! pause spec through the fast path and through `runc --systemd-cgroup`, compared field by
//! field, both placed in scope units by systemd.
//!
//! On a systemd host with cgroup v2 (the node lane's guest) the host's own systemd does it.
//! This project's VMs' PID 1 is not systemd and their controllers belong to cgroup v1, so there
//! the test builds
//! the nearest real thing: a mount namespace whose `/sys/fs/cgroup` is the cgroup2 hierarchy
//! and whose `/run/systemd/system` exists (a systemd host, as runc and libcgroups check), with
//! a systemd manager (`systemd --user`, root's, in a cgroup of its own) on a D-Bus daemon (the
//! manager's own socket-activated bus) bound at `/run/dbus/system_bus_socket`, where runc and
//! libcgroups look for the system bus. The daemons and runc run in that namespace; systemd
//! creates the slices and scopes. (Not `/run/systemd/private`: systemd 252 leaves a request
//! unanswered when it arrives together with the client's `BEGIN`, which libcgroups' client
//! often does, stalling each call for its 10 s receive timeout.)

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use super::*;
use crate::common::crio_kill_and_remove;

const SYSTEMD: &str = "/lib/systemd/systemd";

/// A systemd manager and the mount namespace that makes it the host's, for one test; on a
/// real systemd host with cgroup v2 (the node lane's guest), the host's own systemd.
struct SystemdHost {
    /// The imitation's namespace holder; `None` on a real systemd host.
    holder: Option<Child>,
    cgroup: PathBuf,
    dir: PathBuf,
}

/// PID 1 is systemd and /sys/fs/cgroup is the unified hierarchy.
fn real_systemd_host() -> bool {
    let init = std::fs::read_to_string("/proc/1/comm").unwrap_or_default();
    init.trim() == "systemd" && crate::common::cri::cgroup_v2()
}

impl SystemdHost {
    fn start(dir: &Path) -> SystemdHost {
        if real_systemd_host() {
            return SystemdHost {
                holder: None,
                cgroup: PathBuf::new(),
                dir: dir.to_path_buf(),
            };
        }
        assert!(
            Path::new(SYSTEMD).exists(),
            "{SYSTEMD} is missing (scripts/deps.sh installs systemd)"
        );
        let _ = std::fs::remove_dir_all(dir);
        std::fs::create_dir_all(dir).unwrap();
        let name = format!("gantry-systemd-{}", std::process::id());
        let cgroup = Path::new("/sys/fs/cgroup/unified").join(&name);
        let runtime_dir = dir.join("xdg");
        let script = format!(
            "set -e
             mount -t cgroup2 none /sys/fs/cgroup
             mkdir -p /sys/fs/cgroup/{name} && echo $$ > /sys/fs/cgroup/{name}/cgroup.procs
             mount -t tmpfs tmpfs /run/systemd && mkdir -p /run/systemd/system
             mkdir -p {rt} && mount -t tmpfs tmpfs {rt}
             XDG_RUNTIME_DIR={rt} {SYSTEMD} --user --log-target=console >{log} 2>&1 &
             for i in $(seq 200); do [ -S {rt}/systemd/private ] && break; sleep 0.05; done
             XDG_RUNTIME_DIR={rt} timeout 20 systemctl --user is-system-running --wait >/dev/null || true
             for i in $(seq 200); do [ -S {rt}/bus ] && break; sleep 0.05; done
             mkdir -p /run/dbus && mount -t tmpfs tmpfs /run/dbus
             touch /run/dbus/system_bus_socket && mount --bind {rt}/bus /run/dbus/system_bus_socket
             echo ready
             exec sleep 100000",
            rt = runtime_dir.display(),
            log = dir.join("systemd.log").display(),
        );
        let mut holder = Command::new("unshare")
            .args(["-m", "--propagation", "private", "sh", "-c", &script])
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        // One line when ready; the end of the output if the script failed.
        let mut ready = String::new();
        let mut out = std::io::BufReader::new(holder.stdout.take().unwrap());
        let _ = std::io::BufRead::read_line(&mut out, &mut ready);
        let host = SystemdHost {
            holder: Some(holder),
            cgroup,
            dir: dir.to_path_buf(),
        };
        assert!(ready.contains("ready"), "systemd did not start: {}", host.log());
        host
    }

    /// `systemctl show UNIT -p PROPERTY` on this manager.
    fn show(&self, unit: &str, property: &str) -> String {
        let Some(holder) = &self.holder else {
            return text(&run(Command::new("systemctl").args(["show", unit, "-p", property])));
        };
        let o = run(Command::new("nsenter")
            .arg("-t")
            .arg(holder.id().to_string())
            .args(["-m", "--", "systemctl", "--user", "show", unit, "-p", property])
            .env("XDG_RUNTIME_DIR", self.dir.join("xdg")));
        text(&o)
    }

    fn log(&self) -> String {
        std::fs::read_to_string(self.dir.join("systemd.log")).unwrap_or_default()
    }

    /// `start` as CRI-O runs it, inside this namespace.
    fn crio_start(&self, ns: &Ns, b: &CrioBundle) -> std::process::Output {
        let Some(holder) = &self.holder else {
            return crate::common::crio_start(ns, &b.dir, &b.id, b"");
        };
        let mut nsenter = Command::new("nsenter");
        nsenter
            .arg("-t")
            .arg(holder.id().to_string())
            .arg("-m")
            .arg(format!("--wd={}", b.dir.display()))
            .arg("--");
        start_through(nsenter, ns, b)
    }
}

impl Drop for SystemdHost {
    fn drop(&mut self) {
        let Some(holder) = self.holder.as_mut() else {
            return;
        };
        // systemd first (it stops its units), then the namespace's holder, then what is left
        // of systemd's cgroups, deepest first.
        for pid in pids_under(&self.cgroup) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGTERM);
        }
        if !wait_until(Duration::from_secs(5), || pids_under(&self.cgroup).is_empty()) {
            for pid in pids_under(&self.cgroup) {
                let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
            }
            let _ = wait_until(Duration::from_secs(5), || pids_under(&self.cgroup).is_empty());
        }
        let _ = holder.kill();
        let _ = holder.wait();
        let mut dirs: Vec<PathBuf> = walk(&self.cgroup);
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for d in dirs {
            let _ = std::fs::remove_dir(d);
        }
    }
}

/// Every process in the cgroup2 tree at `dir`.
fn pids_under(dir: &Path) -> Vec<i32> {
    walk(dir)
        .iter()
        .flat_map(|d| {
            std::fs::read_to_string(d.join("cgroup.procs"))
                .unwrap_or_default()
                .lines()
                .filter_map(|l| l.parse().ok())
                .collect::<Vec<i32>>()
        })
        .collect()
}

fn walk(dir: &Path) -> Vec<PathBuf> {
    let mut out = vec![dir.to_path_buf()];
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        if e.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(walk(&e.path()));
        }
    }
    out
}

/// Where `pid` is in the cgroup2 hierarchy, as a host path.
fn unified_dir(pid: u32) -> PathBuf {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap();
    let path = text.lines().find_map(|l| l.strip_prefix("0::")).unwrap();
    let root = if crate::common::cri::cgroup_v2() {
        "/sys/fs/cgroup"
    } else {
        "/sys/fs/cgroup/unified"
    };
    Path::new(root).join(path.trim_start_matches('/'))
}

/// The systemd driver's `cgroupsPath`, and the unit property CRI-O gives every infra container
/// under that driver.
fn set_cgroups_path(b: &CrioBundle, path: &str) {
    let file = b.dir.join("config.json");
    let mut spec: serde_json::Value = serde_json::from_slice(&std::fs::read(&file).unwrap()).unwrap();
    spec["linux"]["cgroupsPath"] = path.into();
    spec["annotations"]["org.systemd.property.CollectMode"] = "'inactive-or-failed'".into();
    std::fs::write(&file, serde_json::to_vec(&spec).unwrap()).unwrap();
}

/// CRI-O's shape under its default `cgroup_manager = "systemd"`: `slice:crio:<id>` in the pod's
/// slice, and gantry's config as shipped (no `systemd_cgroup` key: the path's form picks the
/// driver). Both containers end up in scopes systemd made, with the same view of everything,
/// and the fast path takes the pause.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn fast_path_with_the_systemd_driver_matches_runc() {
    let env = env();
    let fast_ns = env.namespace("sbxsd-fast");
    let runc_ns = env.namespace_with("sbxsd-runc", "sandbox_fast_path = false\n");
    let rootfs = pause_rootfs();
    // Pinned before the namespace is made, so that its copy of the mounts holds them.
    let pinned = Pinned::new(&fast_ns.dir);
    let host = SystemdHost::start(&env.dir.join("systemd-host"));
    let fast = pause_bundle(&fast_ns, "pf3", &rootfs, &pinned, v2_only);
    let slow = pause_bundle(&runc_ns, "pr3", &rootfs, &pinned, v2_only);
    set_cgroups_path(&fast, "kubepods-besteffort-podsd.slice:crio:pf3");
    set_cgroups_path(&slow, "kubepods-besteffort-podsd.slice:crio:pr3");
    let (fast_client, fast_pid) = run_pause(host.crio_start(&fast_ns, &fast), &fast).await;
    let (runc_client, runc_pid) = run_pause(host.crio_start(&runc_ns, &slow), &slow).await;
    assert_eq!(started_by(&fast_ns, "pf3"), "fast path", "{}", host.log());
    assert_eq!(started_by(&runc_ns, "pr3"), "runc");

    let seen = |pid, id: &str, ns: &Ns| -> BTreeMap<String, String> {
        let mut m = observe(pid, id);
        m.insert("devices".into(), device_access(pid, &unified_dir(pid)));
        m.into_iter().map(|(k, v)| (k, v.replace(&ns.name, "NS"))).collect()
    };
    let (a, b) = (seen(fast_pid, "pf3", &fast_ns), seen(runc_pid, "pr3", &runc_ns));
    assert_same("systemd driver", &a, &b);
    // Placed by systemd: the pod's slice expanded as systemd expands it, a scope per container.
    let want = "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-podsd.slice/crio-ID.scope\n";
    assert!(a["cgroup"].contains(want), "{}", a["cgroup"]);
    assert!(rooted_at_container(&a["cgroup.in_ns"]), "{}", a["cgroup.in_ns"]);
    for want in ["null-ok", "mknod-ok", "kmsg-denied"] {
        assert!(a["devices"].contains(want), "{want}: {}", a["devices"]);
    }
    let scopes = [unified_dir(fast_pid), unified_dir(runc_pid)];
    // The scopes' unit properties, as systemd reports them: the same, CRI-O's CollectMode
    // included.
    for property in ["CollectMode", "Delegate", "TasksAccounting", "Slice"] {
        let (f, r) = (
            host.show("crio-pf3.scope", property),
            host.show("crio-pr3.scope", property),
        );
        assert_eq!(f, r, "{property}");
        assert!(f.contains(&format!("stdout={property}=")), "{f}");
    }
    assert!(host
        .show("crio-pf3.scope", "CollectMode")
        .contains("=inactive-or-failed"));
    // Pause and Resume freeze the scope systemd made; State reports the pause process.
    let pf3 = task(&fast_client, "pf3");
    let state = pf3.state().await.unwrap();
    assert_eq!(
        (state.status.enum_value().unwrap(), state.pid),
        (Status::RUNNING, fast_pid)
    );
    let frozen = || std::fs::read_to_string(scopes[0].join("cgroup.freeze")).unwrap_or_default();
    pf3.pause().await.unwrap();
    assert_eq!(frozen(), "1\n");
    pf3.resume().await.unwrap();
    assert_eq!(frozen(), "0\n");

    for (client, id) in [(fast_client, "pf3"), (runc_client, "pr3")] {
        crio_kill_and_remove(&client, id).await;
    }
    // The scopes are gone with their units.
    for scope in &scopes {
        assert!(
            wait_until(Duration::from_secs(5), || !scope.exists()),
            "{} stayed",
            scope.display()
        );
    }
    drop(pinned);
    drop(host);
    assert_clean(env, &fast_ns);
    assert_clean(env, &runc_ns);
}
