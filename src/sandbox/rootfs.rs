//! The sandbox init's mount namespace, set up as runc's `prepareRootfs`/`finalizeRootfs` do:
//! propagation, the rootfs bound onto itself, the spec's mounts, device nodes and /dev links,
//! `pivot_root`, then read-only remounts, read-only and masked paths.

use std::os::unix::fs::symlink;
use std::path::{Path, PathBuf};

use nix::mount::{mount, umount2, MntFlags, MsFlags};
use nix::sys::stat::{mknod, umask, Mode, SFlag};
use oci_spec::runtime::{LinuxDevice, LinuxDeviceType, Mount, Spec};

use super::init::{fail, InitError};
use crate::mount::options::plan;

const PROPAGATION: MsFlags = MsFlags::MS_SHARED
    .union(MsFlags::MS_PRIVATE)
    .union(MsFlags::MS_SLAVE)
    .union(MsFlags::MS_UNBINDABLE);

fn sys(what: impl FnOnce() -> String) -> impl FnOnce(nix::Error) -> InitError {
    move |e| fail(format!("{}: {e}", what()))
}

/// `path` inside `root`, symlinks resolved as if `root` were `/` (runc's SecureJoin), so an
/// image's symlink cannot send a mount outside the rootfs.
pub fn secure_join(root: &Path, path: &Path) -> PathBuf {
    let mut pending: Vec<PathBuf> = path.components().rev().map(|c| c.as_os_str().into()).collect();
    let mut out = PathBuf::new();
    let mut links = 0;
    while let Some(part) = pending.pop() {
        match part.as_os_str().to_str() {
            Some("/" | ".") => continue,
            Some("..") => {
                out.pop();
                continue;
            }
            _ => {}
        }
        let candidate = out.join(&part);
        let full = root.join(&candidate);
        match std::fs::read_link(&full) {
            Ok(target) if links < 255 => {
                links += 1;
                if target.is_absolute() {
                    out = PathBuf::new();
                }
                pending.extend(target.components().rev().map(|c| c.as_os_str().into()));
            }
            _ => out = candidate,
        }
    }
    root.join(out)
}

fn mkdir_all(dir: &Path) -> Result<(), InitError> {
    std::fs::create_dir_all(dir).map_err(|e| fail(format!("mkdir {}: {e}", dir.display())))
}

/// Where a mount lands, created as runc creates it: a file for a bind of a file, else a dir.
fn mountpoint(root: &Path, m: &Mount, bind: bool) -> Result<PathBuf, InitError> {
    let dest = secure_join(root, m.destination());
    let source_is_file = bind
        && m.source()
            .as_ref()
            .is_some_and(|s| s.metadata().is_ok_and(|md| !md.is_dir()));
    if source_is_file {
        if let Some(parent) = dest.parent() {
            mkdir_all(parent)?;
        }
        if std::fs::symlink_metadata(&dest).is_err() {
            std::fs::File::create(&dest).map_err(|e| fail(format!("create {}: {e}", dest.display())))?;
        }
    } else {
        mkdir_all(&dest)?;
    }
    Ok(dest)
}

fn mount_one(root: &Path, m: &Mount) -> Result<(), InitError> {
    let options = m.options().clone().unwrap_or_default();
    let bind = options.iter().any(|o| o == "bind" || o == "rbind");
    let kind = m.typ().clone().unwrap_or_default();
    let p = plan(&kind, &options);
    let dest = mountpoint(root, m, bind)?;
    let what = || format!("mount {} on {}", kind, m.destination().display());
    let propagation = p.flags & (PROPAGATION | MsFlags::MS_REC);
    let flags = p.flags & !PROPAGATION;
    if bind {
        let source = m.source().clone().unwrap_or_default();
        mount(
            Some(&source),
            &dest,
            None::<&str>,
            flags & (MsFlags::MS_BIND | MsFlags::MS_REC),
            None::<&str>,
        )
        .map_err(sys(what))?;
        let extra = flags & !(MsFlags::MS_BIND | MsFlags::MS_REC | MsFlags::MS_REMOUNT);
        if !extra.is_empty() {
            let remount = flags | MsFlags::MS_REMOUNT | MsFlags::MS_BIND;
            mount(None::<&str>, &dest, None::<&str>, remount, None::<&str>).map_err(sys(what))?;
        }
    } else {
        let source = m.source().clone().unwrap_or_else(|| PathBuf::from(&kind));
        // tmpfs is made read-only after everything below it is mounted (finalize).
        let flags = if kind == "tmpfs" {
            flags & !MsFlags::MS_RDONLY
        } else {
            flags
        };
        mount(Some(&source), &dest, Some(kind.as_str()), flags, p.data.as_deref()).map_err(sys(what))?;
    }
    if !(propagation & PROPAGATION).is_empty() {
        mount(None::<&str>, &dest, None::<&str>, propagation, None::<&str>).map_err(sys(what))?;
    }
    Ok(())
}

/// The mount holding `path` is made private when it is shared, so the rootfs bind and the
/// pivot do not propagate back to the host (runc's rootfsParentMountPrivate).
fn parent_mount_private(rootfs: &Path) -> Result<(), InitError> {
    let table = crate::proc::MountTable::of_self().map_err(|e| fail(format!("mountinfo: {e}")))?;
    let best = table.holding(rootfs).map(|m| (m.mount_point.clone(), m.is_shared()));
    if let Some((point, true)) = best {
        mount(None::<&str>, &point, None::<&str>, MsFlags::MS_PRIVATE, None::<&str>)
            .map_err(sys(|| format!("make {} private", point.display())))?;
    }
    Ok(())
}

fn root_propagation(spec: &Spec) -> MsFlags {
    let named = spec.linux().as_ref().and_then(|l| l.rootfs_propagation().clone());
    let flags = named.map(|n| plan("", &[n]).flags).unwrap_or(MsFlags::empty());
    if flags.is_empty() {
        MsFlags::MS_SLAVE | MsFlags::MS_REC
    } else {
        flags
    }
}

/// Everything up to and including `pivot_root`; the process's root is the container's after.
pub fn prepare(spec: &Spec, rootfs: &Path) -> Result<(), InitError> {
    mount(None::<&str>, "/", None::<&str>, root_propagation(spec), None::<&str>)
        .map_err(sys(|| "set / propagation".into()))?;
    parent_mount_private(rootfs)?;
    mount(
        Some(rootfs),
        rootfs,
        Some("bind"),
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(sys(|| format!("bind rootfs {}", rootfs.display())))?;
    let mounts = spec.mounts().clone().unwrap_or_default();
    for m in &mounts {
        mount_one(rootfs, m)?;
    }
    let dev_bound = mounts.iter().any(|m| {
        m.destination() == Path::new("/dev") && m.options().iter().flatten().any(|o| o == "bind" || o == "rbind")
    });
    if !dev_bound {
        devices(spec, rootfs)?;
        dev_links(rootfs, &mounts)?;
    }
    pivot(rootfs)
}

/// runc's default nodes, then `linux.devices`, created with umask 0.
fn devices(spec: &Spec, rootfs: &Path) -> Result<(), InitError> {
    let defaults = [
        ("null", 1, 3),
        ("zero", 1, 5),
        ("full", 1, 7),
        ("tty", 5, 0),
        ("urandom", 1, 9),
        ("random", 1, 8),
    ];
    let listed = spec
        .linux()
        .as_ref()
        .and_then(|l| l.devices().clone())
        .unwrap_or_default();
    let old = umask(Mode::empty());
    let result = (|| {
        for (name, major, minor) in defaults {
            let path = PathBuf::from(format!("/dev/{name}"));
            if listed.iter().all(|d| d.path() != &path) {
                node(rootfs, &path, SFlag::S_IFCHR, major, minor, 0o666, 0, 0)?;
            }
        }
        for d in &listed {
            create_listed(rootfs, d)?;
        }
        Ok(())
    })();
    umask(old);
    result
}

fn create_listed(rootfs: &Path, d: &LinuxDevice) -> Result<(), InitError> {
    let kind = match d.typ() {
        LinuxDeviceType::C | LinuxDeviceType::U => SFlag::S_IFCHR,
        LinuxDeviceType::B => SFlag::S_IFBLK,
        LinuxDeviceType::P => SFlag::S_IFIFO,
        LinuxDeviceType::A => return Err(fail(format!("device {}: type a", d.path().display()))),
    };
    let mode = d.file_mode().unwrap_or(0o666) & 0o7777;
    let (uid, gid) = (d.uid().unwrap_or(0), d.gid().unwrap_or(0));
    node(rootfs, d.path(), kind, d.major(), d.minor(), mode, uid, gid)
}

#[allow(clippy::too_many_arguments)]
fn node(
    rootfs: &Path,
    path: &Path,
    kind: SFlag,
    major: i64,
    minor: i64,
    mode: u32,
    uid: u32,
    gid: u32,
) -> Result<(), InitError> {
    let dest = secure_join(rootfs, path);
    if let Some(parent) = dest.parent() {
        mkdir_all(parent)?;
    }
    let _ = std::fs::remove_file(&dest);
    let dev = libc::makedev(major as u32, minor as u32);
    mknod(&dest, kind, Mode::from_bits_truncate(mode as libc::mode_t), dev)
        .map_err(sys(|| format!("mknod {}", path.display())))?;
    nix::unistd::chown(&dest, Some(uid.into()), Some(gid.into())).map_err(sys(|| format!("chown {}", path.display())))
}

fn dev_links(rootfs: &Path, mounts: &[Mount]) -> Result<(), InitError> {
    let mut links = vec![
        ("/proc/self/fd", "fd"),
        ("/proc/self/fd/0", "stdin"),
        ("/proc/self/fd/1", "stdout"),
        ("/proc/self/fd/2", "stderr"),
    ];
    if Path::new("/proc/kcore").exists() {
        links.push(("/proc/kcore", "core"));
    }
    let dev = secure_join(rootfs, Path::new("/dev"));
    for (target, name) in links {
        let at = dev.join(name);
        if let Err(e) = symlink(target, &at) {
            if e.kind() != std::io::ErrorKind::AlreadyExists {
                return Err(fail(format!("symlink /dev/{name}: {e}")));
            }
        }
    }
    if mounts.iter().any(|m| m.destination() == Path::new("/dev/pts")) {
        let ptmx = dev.join("ptmx");
        let _ = std::fs::remove_file(&ptmx);
        symlink("pts/ptmx", &ptmx).map_err(|e| fail(format!("symlink /dev/ptmx: {e}")))?;
    }
    Ok(())
}

fn pivot(rootfs: &Path) -> Result<(), InitError> {
    let old = nix::fcntl::open(
        "/",
        nix::fcntl::OFlag::O_DIRECTORY | nix::fcntl::OFlag::O_RDONLY,
        Mode::empty(),
    )
    .map_err(sys(|| "open /".into()))?;
    nix::unistd::chdir(rootfs).map_err(sys(|| format!("chdir {}", rootfs.display())))?;
    nix::unistd::pivot_root(".", ".").map_err(sys(|| "pivot_root".into()))?;
    nix::unistd::fchdir(old).map_err(sys(|| "fchdir old root".into()))?;
    mount(
        None::<&str>,
        ".",
        None::<&str>,
        MsFlags::MS_SLAVE | MsFlags::MS_REC,
        None::<&str>,
    )
    .map_err(sys(|| "old root rslave".into()))?;
    umount2(".", MntFlags::MNT_DETACH).map_err(sys(|| "detach old root".into()))?;
    let _ = nix::unistd::close(old);
    nix::unistd::chdir("/").map_err(sys(|| "chdir /".into()))
}

/// After the pivot: read-only tmpfs mounts and root, then read-only and masked paths.
pub fn finalize(spec: &Spec) -> Result<(), InitError> {
    for m in spec.mounts().iter().flatten() {
        let options = m.options().clone().unwrap_or_default();
        if m.typ().as_deref() == Some("tmpfs") && options.iter().any(|o| o == "ro") {
            let p = plan("tmpfs", &options);
            let flags = (p.flags & !PROPAGATION) | MsFlags::MS_REMOUNT;
            mount(None::<&str>, m.destination(), None::<&str>, flags, p.data.as_deref())
                .map_err(sys(|| format!("remount {} read-only", m.destination().display())))?;
        }
    }
    if spec.root().as_ref().is_some_and(|r| r.readonly() == Some(true)) {
        read_only_root()?;
    }
    let linux = spec.linux().clone().unwrap_or_default();
    for p in linux.readonly_paths().iter().flatten() {
        read_only_path(Path::new(p))?;
    }
    for p in linux.masked_paths().iter().flatten() {
        mask_path(Path::new(p))?;
    }
    Ok(())
}

/// `/` remounted read-only keeping its other flags (runc's setReadonly).
fn read_only_root() -> Result<(), InitError> {
    let st = nix::sys::statvfs::statvfs("/").map_err(sys(|| "statvfs /".into()))?;
    let keep = MsFlags::from_bits_truncate(st.flags().bits() as libc::c_ulong)
        & (MsFlags::MS_NOSUID
            | MsFlags::MS_NODEV
            | MsFlags::MS_NOEXEC
            | MsFlags::MS_NOATIME
            | MsFlags::MS_NODIRATIME
            | MsFlags::MS_RELATIME);
    let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | keep;
    mount(Some("/"), "/", None::<&str>, flags, None::<&str>).map_err(sys(|| "remount / read-only".into()))
}

fn missing(e: nix::Error) -> bool {
    e == nix::Error::ENOENT
}

fn read_only_path(path: &Path) -> Result<(), InitError> {
    match mount(
        Some(path),
        path,
        None::<&str>,
        MsFlags::MS_BIND | MsFlags::MS_REC,
        None::<&str>,
    ) {
        Err(e) if missing(e) => return Ok(()),
        other => other.map_err(sys(|| format!("bind {}", path.display())))?,
    }
    let st = nix::sys::statvfs::statvfs(path).map_err(sys(|| format!("statvfs {}", path.display())))?;
    let keep = MsFlags::from_bits_truncate(st.flags().bits() as libc::c_ulong)
        & (MsFlags::MS_NOSUID | MsFlags::MS_NODEV | MsFlags::MS_NOEXEC);
    let flags = MsFlags::MS_BIND | MsFlags::MS_REMOUNT | MsFlags::MS_RDONLY | MsFlags::MS_REC | keep;
    mount(Some(path), path, None::<&str>, flags, None::<&str>)
        .map_err(sys(|| format!("remount {} read-only", path.display())))
}

fn mask_path(path: &Path) -> Result<(), InitError> {
    let is_dir = match std::fs::metadata(path) {
        Ok(m) => m.is_dir(),
        Err(_) => return Ok(()),
    };
    let r = if is_dir {
        mount(Some("tmpfs"), path, Some("tmpfs"), MsFlags::MS_RDONLY, None::<&str>)
    } else {
        mount(Some("/dev/null"), path, None::<&str>, MsFlags::MS_BIND, None::<&str>)
    };
    match r {
        Err(e) if missing(e) || e == nix::Error::ENOTDIR => Ok(()),
        other => other.map_err(sys(|| format!("mask {}", path.display()))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn secure_join_keeps_symlinks_inside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("real")).unwrap();
        symlink("/etc", root.join("abs")).unwrap();
        symlink("../../../..", root.join("up")).unwrap();
        symlink("real", root.join("rel")).unwrap();
        assert_eq!(secure_join(root, Path::new("/abs/x")), root.join("etc/x"));
        assert_eq!(secure_join(root, Path::new("/up/x")), root.join("x"));
        assert_eq!(secure_join(root, Path::new("/../../x")), root.join("x"));
        assert_eq!(secure_join(root, Path::new("/rel/y")), root.join("real/y"));
        assert_eq!(secure_join(root, Path::new("/dev/pts")), root.join("dev/pts"));
    }

    #[test]
    fn loops_end() {
        let dir = tempfile::tempdir().unwrap();
        symlink("b", dir.path().join("a")).unwrap();
        symlink("a", dir.path().join("b")).unwrap();
        let _ = secure_join(dir.path(), Path::new("/a/x"));
    }
}
