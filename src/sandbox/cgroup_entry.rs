//! How the fast path's init puts itself and its child into the container's cgroups without the
//! kernel's global migration lock.
//!
//! Why: a write to `cgroup.procs` takes `cgroup_threadgroup_rwsem` for writing, which waits for
//! an RCU grace period: 5–20 ms per container start on the hosts measured, the largest single
//! step of a pause container's Create. The kernel skips that lock when a thread moves itself
//! (`0` written to a v1 `tasks` file), which for a single-threaded process moves the whole
//! process, and a child forked with `clone3(CLONE_INTO_CGROUP)` starts in its cgroup without any
//! migration. The resulting membership is the one runc's `cgroup.procs` writes give.

use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::unistd::{ForkResult, Pid};
use oci_spec::runtime::LinuxResources;

use super::cgroup::{self, err, CgroupError};
use super::systemd::Property;

/// How the init's child is to enter the unified (cgroup2) hierarchy.
pub enum Entry {
    /// Nothing left to do: the child inherits every membership of this process.
    Inherited,
    /// Forked straight into this cgroup2 directory (this process is in every v1 one already).
    ForkInto { dir: PathBuf, fd: OwnedFd },
}

/// Puts the calling process into `path`'s v1 hierarchies, readies its cgroup2 directory for
/// the child, and applies `resources`. With a single-threaded caller each v1 hierarchy is
/// joined through `tasks` and the unified one (a hybrid host's, or a v2 host's only one) is
/// left to [`fork`]; with threads (not the init's case) through `cgroup.procs` as
/// [`cgroup::join`] does. A new cgroup namespace is the child's to create, once it is in every
/// cgroup (as runc unshares it last).
pub fn join_self(
    path: &Path,
    resources: &LinuxResources,
    unit_properties: &[(String, Property)],
) -> Result<Entry, CgroupError> {
    let pid = std::process::id() as i32;
    // systemd driver (v2 hosts): systemd starts the scope with this process in it, as runc's
    // driver has it do; the child inherits it.
    if let Some(unit) = cgroup::systemd_unit(path).filter(|_| single_threaded()) {
        let slice = path.to_str().and_then(|p| p.split(':').next()).unwrap_or_default();
        let scope = super::systemd::Scope {
            unit: &unit.scope,
            description: &format!("libcontainer container {}", unit.name),
            slice,
            pid: pid as u32,
            extra: unit_properties,
        };
        let dir = super::systemd::start_scope(&scope, SCOPE_TIMEOUT)?;
        cgroup::limit_scope(path, &dir, resources)?;
        return Ok(Entry::Inherited);
    }
    if !single_threaded() {
        cgroup::join(path, resources, pid)?;
        return Ok(Entry::Inherited);
    }
    if cgroup::host_is_v2() {
        let dir = cgroup::create_v2(path)?;
        cgroup::limit(&cgroup::manager(path)?, path, Some(&dir), resources)?;
        return fork_into(dir);
    }
    // libcgroups' manager takes ~2 ms to build (a procfs mount per controller): a helper
    // thread builds it while this one creates and joins the hierarchies (a thread moving itself
    // leaves the others where they are). It has ended before the init enters namespaces, which
    // needs a single-threaded process.
    let owned = path.to_path_buf();
    let builder = std::thread::Builder::new().spawn(move || cgroup::manager(&owned));
    let relative = cgroup::relative(path);
    for mount in cgroup::hierarchies(joined) {
        let dir = mount.join(relative);
        std::fs::create_dir_all(&dir).map_err(|e| err(&dir, e))?;
        if is_cpuset(&mount) {
            fill_cpuset(&mount, relative)?;
        }
        std::fs::write(dir.join("tasks"), "0").map_err(|e| err(&dir, format!("join: {e}")))?;
    }
    let manager = match builder {
        Ok(thread) => thread
            .join()
            .map_err(|_| err(path, "the thread building the cgroup manager panicked"))??,
        Err(_) => cgroup::manager(path)?,
    };
    cgroup::limit(&manager, path, None, resources)?;
    // A hybrid host's unified hierarchy, as runc's v1 manager joins it (one hierarchy, however
    // many times mounted: the first mount names it).
    match cgroup::cgroup2_mounts().into_iter().next() {
        Some(mount) => {
            let dir = mount.join(relative);
            std::fs::create_dir_all(&dir).map_err(|e| err(&dir, e))?;
            fork_into(dir)
        }
        None => Ok(Entry::Inherited),
    }
}

fn fork_into(dir: PathBuf) -> Result<Entry, CgroupError> {
    let flags = nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_CLOEXEC;
    let raw = nix::fcntl::open(&dir, flags, nix::sys::stat::Mode::empty()).map_err(|e| err(&dir, e))?;
    // SAFETY: `open` just returned this descriptor and nothing else owns it.
    let fd = unsafe { OwnedFd::from_raw_fd(raw) };
    Ok(Entry::ForkInto { dir, fd })
}

/// How long systemd may take to start a scope and move the init into it.
const SCOPE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// The v1 controllers libcgroups' manager joins, as runc's cgroupfs manager does.
const CONTROLLERS: &[&str] = &[
    "cpu",
    "cpuacct",
    "cpuset",
    "devices",
    "hugetlb",
    "memory",
    "pids",
    "perf_event",
    "blkio",
    "net_prio",
    "net_cls",
    "freezer",
];

/// The hierarchies [`cgroup::join`] puts a process in: libcgroups' controllers and the named
/// ones (`name=systemd`).
fn joined(opts: &str) -> bool {
    opts.split(',')
        .any(|o| o.starts_with("name=") || CONTROLLERS.contains(&o))
}

fn single_threaded() -> bool {
    crate::proc::own_threads() == Some(1)
}

fn is_cpuset(mount: &Path) -> bool {
    mount.join("cpuset.cpus").exists()
}

/// A new v1 cpuset cgroup starts with empty `cpus` and `mems`, which refuses tasks (ENOSPC):
/// each empty level takes its parent's, as runc and libcgroups fill them.
fn fill_cpuset(mount: &Path, relative: &Path) -> Result<(), CgroupError> {
    for file in ["cpuset.cpus", "cpuset.mems"] {
        let mut dir = mount.to_path_buf();
        let mut value = std::fs::read_to_string(dir.join(file)).map_err(|e| err(&dir, e))?;
        for part in relative.components() {
            dir.push(part);
            let own = std::fs::read_to_string(dir.join(file)).map_err(|e| err(&dir, e))?;
            if own.trim().is_empty() {
                std::fs::write(dir.join(file), value.trim()).map_err(|e| err(&dir, format!("{file}: {e}")))?;
            } else {
                value = own;
            }
        }
    }
    Ok(())
}

/// The kernel's `struct clone_args` (version 2, with `cgroup`).
#[repr(C)]
#[derive(Default)]
struct CloneArgs {
    flags: u64,
    pidfd: u64,
    child_tid: u64,
    parent_tid: u64,
    exit_signal: u64,
    stack: u64,
    stack_size: u64,
    tls: u64,
    set_tid: u64,
    set_tid_size: u64,
    cgroup: u64,
}

const CLONE_INTO_CGROUP: u64 = 0x2_0000_0000;

/// Forks the container's process into `entry`'s cgroup. Where the kernel refuses `clone3`
/// (older kernels, a seccomp profile answering ENOSYS) this process joins through
/// `cgroup.procs` and forks as usual.
///
/// # Safety
/// As `fork`: the caller is single-threaded, and the child only runs this init's own code
/// before it execs or exits.
pub unsafe fn fork(entry: &Entry) -> Result<ForkResult, String> {
    if let Entry::ForkInto { dir, fd } = entry {
        let args = CloneArgs {
            flags: CLONE_INTO_CGROUP,
            exit_signal: libc::SIGCHLD as u64,
            cgroup: fd.as_raw_fd() as u64,
            ..Default::default()
        };
        // SAFETY: clone3 without CLONE_VM duplicates the process as fork does; glibc takes the
        // child's thread id from the kernel where it needs it (raise, pthread_kill).
        let r = unsafe {
            libc::syscall(
                libc::SYS_clone3,
                &args as *const CloneArgs,
                std::mem::size_of::<CloneArgs>(),
            )
        };
        match r {
            0 => return Ok(ForkResult::Child),
            r if r > 0 => {
                return Ok(ForkResult::Parent {
                    child: Pid::from_raw(r as i32),
                })
            }
            _ => {
                let pid = std::process::id().to_string();
                std::fs::write(dir.join("cgroup.procs"), pid).map_err(|e| format!("cgroup {}: {e}", dir.display()))?;
            }
        }
    }
    // SAFETY: as this function's own contract.
    unsafe { nix::unistd::fork() }.map_err(|e| format!("fork: {e}"))
}
