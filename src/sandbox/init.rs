//! `containerd-shim-gantry-v2 sandbox-init BUNDLE PID_FILE`: the fast path's container init,
//! a fresh single-threaded process of gantry's own binary (so it may fork and allocate freely).
//!
//! It joins the cgroup, sets `oomScoreAdj`, joins or creates the namespaces, then forks: the
//! child (pid 1 of a new pid namespace) sets up the rootfs and credentials, reports `ok` on
//! [`SYNC_FD`](super::SYNC_FD) and waits on [`START_FD`](super::START_FD) for Start before it
//! execs the program; the parent writes the child's pid to PID_FILE and exits, so the child is
//! re-parented to the daemon (a subreaper), as runc's init is. Any failure is reported on the
//! sync pipe as `error: <what>` and the process exits 1.

use std::fs::File;
use std::io::{Read, Write};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
use std::path::{Path, PathBuf};

use nix::sched::{setns, unshare, CloneFlags};
use nix::unistd::ForkResult;
use oci_spec::runtime::{LinuxDeviceType, LinuxNamespace, LinuxNamespaceType, Spec};
use serde_json::Value;

use super::{cgroup, cgroup_entry, creds, rootfs, seccomp, SECCOMP_FD, START_FD, SYNC_FD};

/// A step of the init that failed, in words for the engine.
#[derive(Debug)]
pub struct InitError(pub String);

pub fn fail(what: impl Into<String>) -> InitError {
    InitError(what.into())
}

/// Runs the init; the return value is the exit code (only on failure: success execs).
pub fn main(args: &[String]) -> i32 {
    // SAFETY: the daemon hands the init exactly these descriptors; nothing else owns them.
    let mut sync = unsafe { File::from_raw_fd(SYNC_FD) };
    match run(args, &mut sync) {
        Ok(()) => 0,
        Err(InitError(why)) => {
            let _ = sync.write_all(format!("error: {why}\n").as_bytes());
            1
        }
    }
}

/// The bundle's spec, as the typed model and as the document the fast path checked.
struct Loaded {
    spec: Spec,
    doc: Value,
    rootfs: PathBuf,
}

fn load(bundle: &Path) -> Result<Loaded, InitError> {
    let raw = std::fs::read(bundle.join("config.json")).map_err(|e| fail(format!("read config.json: {e}")))?;
    let doc: Value = serde_json::from_slice(&raw).map_err(|e| fail(format!("config.json: {e}")))?;
    let spec: Spec = serde_json::from_slice(&raw).map_err(|e| fail(format!("config.json: {e}")))?;
    let root = spec
        .root()
        .as_ref()
        .map(|r| r.path().clone())
        .unwrap_or_else(|| "rootfs".into());
    let rootfs = if root.is_absolute() { root } else { bundle.join(root) };
    let rootfs = rootfs
        .canonicalize()
        .map_err(|e| fail(format!("rootfs {}: {e}", rootfs.display())))?;
    Ok(Loaded { spec, doc, rootfs })
}

fn run(args: &[String], sync: &mut File) -> Result<(), InitError> {
    let [bundle, pid_file] = args else {
        return Err(fail("usage: sandbox-init BUNDLE PID_FILE"));
    };
    // SAFETY: as for the sync descriptor.
    let start = unsafe { OwnedFd::from_raw_fd(START_FD) };
    let l = load(Path::new(bundle))?;
    let linux = l.spec.linux().clone().unwrap_or_default();
    let nodes: Vec<(LinuxDeviceType, i64, i64)> = linux
        .devices()
        .iter()
        .flatten()
        .map(|d| (d.typ(), d.major(), d.minor()))
        .collect();
    let resources = cgroup::effective_resources(linux.resources().as_ref(), &nodes);
    let path = linux.cgroups_path().clone().unwrap_or_default();
    // runc's systemd driver sends these with the scope; cgroupfs ignores them.
    let annotations = l.spec.annotations().clone().unwrap_or_default();
    let unit_properties = super::systemd::annotation_properties(&annotations)
        .map_err(|key| fail(format!("annotation {key}: not a unit property the fast path sends")))?;
    let entry = cgroup_entry::join_self(&path, &resources, &unit_properties).map_err(|e| fail(e.to_string()))?;
    if let Some(adj) = l.spec.process().as_ref().and_then(|p| p.oom_score_adj()) {
        std::fs::write("/proc/self/oom_score_adj", adj.to_string())
            .map_err(|e| fail(format!("set oomScoreAdj {adj}: {e}")))?;
    }
    // The pid file is opened before the fork: the child pivots into the rootfs in the mount
    // namespace this process shares with it, which moves this process's root too.
    let pid_out = PidFile::open(Path::new(pid_file))?;
    enter_namespaces(&l.spec)?;
    // SAFETY: this process is single-threaded (a fresh exec that started no threads).
    match unsafe { cgroup_entry::fork(&entry) }.map_err(fail)? {
        ForkResult::Parent { child } => pid_out.write(child.as_raw()).map_err(|e| {
            let _ = nix::sys::signal::kill(child, nix::sys::signal::SIGKILL);
            fail(format!("write {pid_file}: {e}"))
        }),
        ForkResult::Child => {
            let result = container(&l, sync, start);
            if let Err(InitError(why)) = result {
                let _ = sync.write_all(format!("error: {why}\n").as_bytes());
            }
            std::process::exit(1)
        }
    }
}

/// The pid file, written through descriptors opened before the fork (its directory, and a
/// temporary file there renamed over it), whatever the process's root is by then.
struct PidFile {
    dir: OwnedFd,
    name: PathBuf,
    tmp: PathBuf,
    file: File,
}

impl PidFile {
    fn open(path: &Path) -> Result<PidFile, InitError> {
        use nix::fcntl::{open, openat, OFlag};
        use nix::sys::stat::Mode;
        let what = |e: nix::Error| fail(format!("pid file {}: {e}", path.display()));
        let parent = path
            .parent()
            .filter(|p| !p.as_os_str().is_empty())
            .unwrap_or(Path::new("."));
        let name = PathBuf::from(
            path.file_name()
                .ok_or_else(|| fail(format!("pid file {}", path.display())))?,
        );
        let mut tmp = name.clone().into_os_string();
        tmp.push(".tmp");
        let tmp = PathBuf::from(tmp);
        let dir = open(
            parent,
            OFlag::O_DIRECTORY | OFlag::O_RDONLY | OFlag::O_CLOEXEC,
            Mode::empty(),
        )
        .map_err(what)?;
        // SAFETY: `open` just returned this descriptor.
        let dir = unsafe { OwnedFd::from_raw_fd(dir) };
        let flags = OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_TRUNC | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
        let raw = openat(Some(dir.as_raw_fd()), &tmp, flags, Mode::from_bits_truncate(0o644)).map_err(what)?;
        // SAFETY: `openat` just returned this descriptor.
        let file = unsafe { File::from_raw_fd(raw) };
        Ok(PidFile { dir, name, tmp, file })
    }

    fn write(mut self, pid: i32) -> std::io::Result<()> {
        self.file.write_all(pid.to_string().as_bytes())?;
        let dir = Some(self.dir.as_raw_fd());
        nix::fcntl::renameat(dir, &self.tmp, dir, &self.name).map_err(std::io::Error::from)
    }
}

fn flag(kind: LinuxNamespaceType) -> CloneFlags {
    match kind {
        LinuxNamespaceType::Pid => CloneFlags::CLONE_NEWPID,
        LinuxNamespaceType::Network => CloneFlags::CLONE_NEWNET,
        LinuxNamespaceType::Mount => CloneFlags::CLONE_NEWNS,
        LinuxNamespaceType::Ipc => CloneFlags::CLONE_NEWIPC,
        LinuxNamespaceType::Uts => CloneFlags::CLONE_NEWUTS,
        LinuxNamespaceType::Cgroup => CloneFlags::CLONE_NEWCGROUP,
        LinuxNamespaceType::User => CloneFlags::CLONE_NEWUSER,
        LinuxNamespaceType::Time => CloneFlags::empty(),
    }
}

/// Joins the namespaces given by path (opened first: they are host paths), then creates the
/// rest in one `unshare`. A pid namespace takes effect for the child forked next. A new cgroup
/// namespace is left to the child: its root is the creator's cgroups, and only the child is in
/// every one of the container's (see [`cgroup_entry::fork`]).
fn enter_namespaces(spec: &Spec) -> Result<(), InitError> {
    let list = spec
        .linux()
        .as_ref()
        .and_then(|l| l.namespaces().clone())
        .unwrap_or_default();
    let mut joins = Vec::new();
    let mut new = CloneFlags::empty();
    for ns in &list {
        match ns.path() {
            Some(p) if !p.as_os_str().is_empty() => {
                let f =
                    File::open(p).map_err(|e| fail(format!("open {:?} namespace {}: {e}", ns.typ(), p.display())))?;
                joins.push((f, ns.typ(), p.clone()));
            }
            _ if ns.typ() == LinuxNamespaceType::Cgroup => {}
            _ => new |= flag(ns.typ()),
        }
    }
    for (f, kind, p) in &joins {
        setns(f, flag(*kind)).map_err(|e| fail(format!("join {kind:?} namespace {}: {e}", p.display())))?;
    }
    unshare(new).map_err(|e| fail(format!("unshare {new:?}: {e}")))
}

/// The spec's entry for a namespace of `kind`, if it lists one.
fn namespace(spec: &Spec, kind: LinuxNamespaceType) -> Option<LinuxNamespace> {
    let list = spec.linux().as_ref().and_then(|l| l.namespaces().as_ref())?;
    list.iter().find(|n| n.typ() == kind).cloned()
}

/// Whether the spec asks for a new namespace of `kind` (listed without a path).
fn new_namespace(spec: &Spec, kind: LinuxNamespaceType) -> bool {
    namespace(spec, kind).is_some_and(|n| n.path().as_ref().is_none_or(|p| p.as_os_str().is_empty()))
}

fn has_namespace(spec: &Spec, kind: LinuxNamespaceType) -> bool {
    namespace(spec, kind).is_some()
}

/// The forked child: everything inside the namespaces, then the wait for Start and the exec.
fn container(l: &Loaded, sync: &mut File, start: OwnedFd) -> Result<(), InitError> {
    let spec = &l.spec;
    let process = spec.process().clone().unwrap_or_default();
    // Not dumpable until the exec: nothing in the container may ptrace or open this process.
    // SAFETY: prctl with integer arguments only.
    unsafe { libc::prctl(libc::PR_SET_DUMPABLE, 0, 0, 0, 0) };
    if new_namespace(spec, LinuxNamespaceType::Cgroup) {
        unshare(CloneFlags::CLONE_NEWCGROUP).map_err(|e| fail(format!("unshare cgroup namespace: {e}")))?;
    }
    creds::rlimits(&process)?;
    rootfs::prepare(spec, &l.rootfs)?;
    // In a UTS namespace of its own, new or joined (CRI-O pins one), as runc sets them.
    if has_namespace(spec, LinuxNamespaceType::Uts) {
        if let Some(h) = spec.hostname().as_deref().filter(|h| !h.is_empty()) {
            nix::unistd::sethostname(h).map_err(|e| fail(format!("sethostname {h}: {e}")))?;
        }
        if let Some(d) = l
            .doc
            .get("domainname")
            .and_then(Value::as_str)
            .filter(|d| !d.is_empty())
        {
            // SAFETY: setdomainname reads `len` bytes of `d`.
            if unsafe { libc::setdomainname(d.as_ptr().cast(), d.len()) } != 0 {
                return Err(fail(format!("setdomainname {d}: {}", std::io::Error::last_os_error())));
            }
        }
    }
    for (key, value) in spec
        .linux()
        .as_ref()
        .and_then(|l| l.sysctl().clone())
        .unwrap_or_default()
    {
        let path = format!("/proc/sys/{}", key.replace('.', "/"));
        std::fs::write(&path, &value).map_err(|e| fail(format!("sysctl {key}={value}: {e}")))?;
    }
    rootfs::finalize(spec)?;
    let program = match seccomp::wanted(&l.doc) {
        true => Some(seccomp::receive(SECCOMP_FD)?),
        false => None,
    };
    let nnp = process.no_new_privileges().unwrap_or(false);
    if !nnp {
        seccomp::load(program.as_ref())?;
    }
    creds::bounding(&l.doc)?;
    let home = creds::user(&process)?;
    let cwd = process.cwd();
    nix::unistd::chdir(cwd.as_path()).map_err(|e| fail(format!("chdir {}: {e}", cwd.display())))?;
    creds::capabilities(&l.doc)?;
    if nnp {
        creds::no_new_privileges()?;
    }
    creds::check_program(&process)?;
    sync.write_all(b"ok\n").map_err(|e| fail(format!("report: {e}")))?;
    // The daemon reads the sync pipe to its end: this process's copy must go now.
    let _ = nix::unistd::close(sync.as_raw_fd());
    let mut byte = [0u8; 1];
    let mut start = File::from(start);
    match start.read(&mut byte) {
        Ok(1) => {}
        // The daemon let go without Start (Delete before Start): leave quietly.
        _ => std::process::exit(0),
    }
    drop(start);
    if nnp {
        if let Err(InitError(why)) = seccomp::load(program.as_ref()) {
            let _ = writeln!(std::io::stderr(), "{why}");
            std::process::exit(127);
        }
    }
    let InitError(why) = creds::exec(&process, &home);
    let _ = writeln!(std::io::stderr(), "{why}");
    std::process::exit(127)
}
