//! Idmapped rootfs mounts, for user-namespace pods (`hostUsers: false`). containerd 2.x's
//! overlay snapshotter, on a kernel whose overlayfs takes idmapped layers, hands the shim its
//! rootfs mount with `uidmap=` and `gidmap=` options (the pod's mappings) instead of chowning
//! every layer. They are not the filesystem's options (overlay answers EINVAL): the helper takes
//! them out, makes a user namespace with those mappings, and mounts the layers through an
//! idmapped, read-only bind of their common directory, as containerd's own mount package does
//! (core/mount, `prepareIDMappedOverlay`). Any other filesystem is mounted, then idmapped in
//! place. Runs only in the mount helper, a process of its own (see [`super`]).

use std::ffi::CString;
use std::fs::File;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd, FromRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use nix::mount::{umount2, MntFlags};
use nix::sched::CloneFlags;

/// The first argument that makes this binary the user namespace holder: a process that sits in
/// the new namespace (reading its stdin until EOF) while the helper writes its mappings.
pub const HOLDER_ARG: &str = "userns-holder";

/// The pod's mappings, as containerd writes them: `container:host:size[,...]`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IdMap {
    uid: Vec<(u32, u32, u32)>,
    gid: Vec<(u32, u32, u32)>,
}

/// Takes `uidmap=`/`gidmap=` out of a mount's options. Both or neither: containerd remaps only
/// both, and one alone is a request this helper cannot honour.
pub fn split(options: &[String]) -> Result<(Option<IdMap>, Vec<String>), String> {
    let (mut uid, mut gid, mut rest) = (None, None, Vec::new());
    for o in options {
        if let Some(v) = o.strip_prefix("uidmap=") {
            uid = Some(parse(v)?);
        } else if let Some(v) = o.strip_prefix("gidmap=") {
            gid = Some(parse(v)?);
        } else {
            rest.push(o.clone());
        }
    }
    match (uid, gid) {
        (Some(uid), Some(gid)) => Ok((Some(IdMap { uid, gid }), rest)),
        (None, None) => Ok((None, rest)),
        _ => Err("uidmap= and gidmap= come together or not at all".into()),
    }
}

fn parse(list: &str) -> Result<Vec<(u32, u32, u32)>, String> {
    list.split(',')
        .map(|m| {
            let n: Vec<u32> = m
                .split(':')
                .map(str::parse)
                .collect::<Result<_, _>>()
                .map_err(|_| bad(m))?;
            match n[..] {
                [container, host, size] if size > 0 => Ok((container, host, size)),
                _ => Err(bad(m)),
            }
        })
        .collect()
}

fn bad(m: &str) -> String {
    format!("id mapping {m:?}: want container-id:host-id:size")
}

fn map_file(ranges: &[(u32, u32, u32)]) -> String {
    ranges.iter().map(|(c, h, s)| format!("{c} {h} {s}\n")).collect()
}

/// A user namespace with `map`'s mappings. Made by a holder process of this binary that
/// unshares it before its exec (no fork without exec): once the helper has written the maps
/// and opened the namespace, the holder is let go.
pub fn user_namespace(map: &IdMap) -> Result<OwnedFd, String> {
    let mut cmd = Command::new(crate::environ::self_exe());
    cmd.arg0("gantry-userns-holder")
        .arg(HOLDER_ARG)
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    // SAFETY: unshare(2) is a single async-signal-safe system call, run between fork and exec.
    unsafe {
        cmd.pre_exec(|| nix::sched::unshare(CloneFlags::CLONE_NEWUSER).map_err(io::Error::from));
    }
    let mut holder = cmd.spawn().map_err(|e| format!("start a user namespace holder: {e}"))?;
    let pid = holder.id();
    let made = (|| -> io::Result<OwnedFd> {
        std::fs::write(format!("/proc/{pid}/uid_map"), map_file(&map.uid))?;
        std::fs::write(format!("/proc/{pid}/gid_map"), map_file(&map.gid))?;
        Ok(File::open(format!("/proc/{pid}/ns/user"))?.into())
    })();
    drop(holder.stdin.take());
    let _ = holder.wait();
    made.map_err(|e| format!("user namespace for {map:?}: {e}"))
}

/// The holder's whole life: wait for the helper to close stdin.
pub fn holder_main() -> i32 {
    let _ = io::copy(&mut io::stdin(), &mut io::sink());
    0
}

/// The layers' common directory, bound idmapped and read-only at a stage beside the rootfs
/// while the overlay mount takes it; unmounted and removed on drop (the overlay keeps its own
/// references to the layers).
pub struct Stage {
    dir: PathBuf,
    mounted: bool,
}

impl Drop for Stage {
    fn drop(&mut self) {
        if self.mounted {
            let _ = umount2(&self.dir, MntFlags::MNT_DETACH);
        }
        let _ = std::fs::remove_dir(&self.dir);
    }
}

/// Rewrites an overlay's `lowerdir=` to reach the layers through an idmapped bind of their
/// common directory, staged next to `target`.
pub fn overlay_lowers(options: &[String], target: &Path, userns: BorrowedFd) -> Result<(Vec<String>, Stage), String> {
    let lowers: Vec<&str> = options
        .iter()
        .filter_map(|o| o.strip_prefix("lowerdir="))
        .flat_map(|l| l.split(':'))
        .collect();
    let common = common_dir(&lowers).ok_or_else(|| format!("overlay layers {lowers:?} share no directory to idmap"))?;
    let parent = target.parent().unwrap_or(Path::new("/"));
    let dir = parent.join(format!(".gantry-idmap-{}", std::process::id()));
    std::fs::create_dir(&dir).map_err(|e| format!("create {}: {e}", dir.display()))?;
    let mut stage = Stage { dir, mounted: false };
    idmapped_bind(Path::new(&common), &stage.dir, userns, true)
        .map_err(|e| format!("idmapped bind of {common} on {}: {e}", stage.dir.display()))?;
    stage.mounted = true;
    let moved: Vec<String> = lowers
        .iter()
        .map(|l| format!("{}{}", stage.dir.display(), &l[common.len()..]))
        .collect();
    let rewritten = options
        .iter()
        .filter(|o| !o.starts_with("lowerdir="))
        .cloned()
        .chain([format!("lowerdir={}", moved.join(":"))])
        .collect();
    Ok((rewritten, stage))
}

/// The deepest directory holding every layer, never `/`.
fn common_dir(lowers: &[&str]) -> Option<String> {
    let first = Path::new(lowers.first()?);
    let mut common = first.parent()?.to_path_buf();
    while !lowers.iter().all(|l| Path::new(l).starts_with(&common)) {
        common = common.parent()?.to_path_buf();
    }
    (common != Path::new("/")).then(|| common.to_string_lossy().into_owned())
}

/// Idmaps the mount at `target` in place: an idmapped clone of it takes its place (not stacked
/// over it, so one unmount takes the rootfs down).
pub fn remap_in_place(target: &Path, userns: BorrowedFd) -> Result<(), String> {
    idmapped_bind(target, target, userns, false).map_err(|e| format!("idmap {}: {e}", target.display()))
}

/// open_tree(2) a clone of `source`, mount_setattr(2) it idmapped through `userns`, and
/// move_mount(2) it onto `target`, in place of `target`'s own mount when the two are one path.
/// (Neither nix nor std wraps the new mount API.)
fn idmapped_bind(source: &Path, target: &Path, userns: BorrowedFd, readonly: bool) -> io::Result<()> {
    let path = |p: &Path| CString::new(p.as_os_str().as_bytes()).map_err(io::Error::other);
    let (source, target) = (path(source)?, path(target)?);
    let flags = libc::OPEN_TREE_CLONE | libc::OPEN_TREE_CLOEXEC as libc::c_uint | libc::AT_RECURSIVE as libc::c_uint;
    // SAFETY: a valid C string and flags; the result is checked before use.
    let fd = unsafe { libc::syscall(libc::SYS_open_tree, libc::AT_FDCWD, source.as_ptr(), flags) };
    if fd < 0 {
        return Err(io::Error::last_os_error());
    }
    // SAFETY: open_tree returned a new descriptor that nothing else owns.
    let tree = unsafe { OwnedFd::from_raw_fd(fd as i32) };
    let mut attr: libc::mount_attr = unsafe { std::mem::zeroed() };
    attr.attr_set = libc::MOUNT_ATTR_IDMAP | if readonly { libc::MOUNT_ATTR_RDONLY } else { 0 };
    attr.propagation = libc::MS_PRIVATE;
    attr.userns_fd = userns.as_raw_fd() as u64;
    let empty = c"";
    // SAFETY: the tree descriptor is open, `attr` lives across the call and its size is passed.
    let set = unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_EMPTY_PATH | libc::AT_RECURSIVE,
            &attr as *const libc::mount_attr,
            std::mem::size_of::<libc::mount_attr>(),
        )
    };
    if set < 0 {
        return Err(io::Error::last_os_error());
    }
    if source == target {
        umount2(
            Path::new(std::ffi::OsStr::from_bytes(target.as_bytes())),
            MntFlags::MNT_DETACH,
        )?;
    }
    // SAFETY: as above; the target is a valid C string.
    let moved = unsafe {
        libc::syscall(
            libc::SYS_move_mount,
            tree.as_raw_fd(),
            empty.as_ptr(),
            libc::AT_FDCWD,
            target.as_ptr(),
            libc::MOVE_MOUNT_F_EMPTY_PATH,
        )
    };
    if moved < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn words(s: &[&str]) -> Vec<String> {
        s.iter().map(|w| w.to_string()).collect()
    }

    #[test]
    fn mappings_come_out_of_the_options_in_pairs() {
        let (map, rest) = split(&words(&[
            "index=off",
            "uidmap=0:65536:65536",
            "gidmap=0:65536:65536,70000:1:1",
        ]))
        .unwrap();
        assert_eq!(
            map,
            Some(IdMap {
                uid: vec![(0, 65536, 65536)],
                gid: vec![(0, 65536, 65536), (70000, 1, 1)]
            })
        );
        assert_eq!(rest, words(&["index=off"]));
        assert_eq!(map_file(&map.unwrap().gid), "0 65536 65536\n70000 1 1\n");
        assert_eq!(split(&words(&["ro"])).unwrap(), (None, words(&["ro"])));
        for wrong in [
            &["uidmap=0:1:1"][..],
            &["uidmap=0:1", "gidmap=0:1:1"],
            &["uidmap=a:b:c", "gidmap=0:1:1"],
        ] {
            assert!(split(&words(wrong)).is_err(), "{wrong:?}");
        }
        assert!(split(&words(&["uidmap=0:1:0", "gidmap=0:1:1"])).is_err(), "empty range");
    }

    #[test]
    fn the_layers_common_directory_is_a_whole_directory_and_never_the_root() {
        let s = "/var/lib/containerd/snapshots";
        assert_eq!(
            common_dir(&[&format!("{s}/12/fs"), &format!("{s}/3/fs")]),
            Some(s.into())
        );
        assert_eq!(common_dir(&[&format!("{s}/12/fs")]), Some(format!("{s}/12")));
        // "/s/1" and "/s/10" share the string "/s/1", not a directory.
        assert_eq!(common_dir(&["/a/s/1/fs", "/a/s/10/fs"]), Some("/a/s".into()));
        assert_eq!(common_dir(&["/a/fs", "/b/fs"]), None);
    }
}
