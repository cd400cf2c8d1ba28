//! Turning containerd's mount options into mount(2) calls, and finding what is mounted below a
//! path. Pure functions, plus the two syscall sequences the mount helper (a re-exec of this binary) runs.

use std::path::Path;

use nix::mount::{mount, umount2, MntFlags, MsFlags};

/// What one option word does to the flags: set them, or clear them.
enum Flag {
    Set(MsFlags),
    Clear(MsFlags),
}

/// The option words mount(8) and containerd understand as flags; anything else is filesystem
/// data (`lowerdir=...`, `size=...`).
fn flag(word: &str) -> Option<Flag> {
    use Flag::{Clear, Set};
    Some(match word {
        "async" => Clear(MsFlags::MS_SYNCHRONOUS),
        "atime" => Clear(MsFlags::MS_NOATIME),
        "bind" => Set(MsFlags::MS_BIND),
        "defaults" => Set(MsFlags::empty()),
        "dev" => Clear(MsFlags::MS_NODEV),
        "diratime" => Clear(MsFlags::MS_NODIRATIME),
        "dirsync" => Set(MsFlags::MS_DIRSYNC),
        "exec" => Clear(MsFlags::MS_NOEXEC),
        "mand" => Set(MsFlags::MS_MANDLOCK),
        "noatime" => Set(MsFlags::MS_NOATIME),
        "nodev" => Set(MsFlags::MS_NODEV),
        "nodiratime" => Set(MsFlags::MS_NODIRATIME),
        "noexec" => Set(MsFlags::MS_NOEXEC),
        "nomand" => Clear(MsFlags::MS_MANDLOCK),
        "norelatime" => Clear(MsFlags::MS_RELATIME),
        "nostrictatime" => Clear(MsFlags::MS_STRICTATIME),
        "nosuid" => Set(MsFlags::MS_NOSUID),
        "rbind" => Set(MsFlags::MS_BIND.union(MsFlags::MS_REC)),
        "relatime" => Set(MsFlags::MS_RELATIME),
        "remount" => Set(MsFlags::MS_REMOUNT),
        "ro" => Set(MsFlags::MS_RDONLY),
        "rw" => Clear(MsFlags::MS_RDONLY),
        "strictatime" => Set(MsFlags::MS_STRICTATIME),
        "suid" => Clear(MsFlags::MS_NOSUID),
        "sync" => Set(MsFlags::MS_SYNCHRONOUS),
        "private" => Set(MsFlags::MS_PRIVATE),
        "rprivate" => Set(MsFlags::MS_PRIVATE.union(MsFlags::MS_REC)),
        "shared" => Set(MsFlags::MS_SHARED),
        "rshared" => Set(MsFlags::MS_SHARED.union(MsFlags::MS_REC)),
        "slave" => Set(MsFlags::MS_SLAVE),
        "rslave" => Set(MsFlags::MS_SLAVE.union(MsFlags::MS_REC)),
        "unbindable" => Set(MsFlags::MS_UNBINDABLE),
        "runbindable" => Set(MsFlags::MS_UNBINDABLE.union(MsFlags::MS_REC)),
        _ => return None,
    })
}

const PROPAGATION: MsFlags = MsFlags::MS_SHARED
    .union(MsFlags::MS_PRIVATE)
    .union(MsFlags::MS_SLAVE)
    .union(MsFlags::MS_UNBINDABLE);

/// One mount as the syscalls want it.
#[derive(Debug, PartialEq, Eq)]
pub struct Plan {
    pub flags: MsFlags,
    /// Comma-joined filesystem options; `None` when there are none.
    pub data: Option<String>,
    /// Directory to run in: overlay lower dirs made relative to it (see [`compact_lowerdirs`]).
    pub chdir: Option<String>,
}

/// Splits option words into flags and data, compacting long overlay option strings.
pub fn plan(fs_type: &str, options: &[String]) -> Plan {
    let page = 4096;
    let size: usize = options.iter().map(|o| o.len() + 1).sum();
    let (chdir, options) = if fs_type == "overlay" && size >= page - 512 {
        compact_lowerdirs(options)
    } else {
        (None, options.to_vec())
    };
    let mut flags = MsFlags::empty();
    let mut data = Vec::new();
    for word in &options {
        match flag(word) {
            Some(Flag::Set(f)) => flags |= f,
            Some(Flag::Clear(f)) => flags &= !f,
            None => data.push(word.as_str()),
        }
    }
    Plan {
        flags,
        data: (!data.is_empty()).then(|| data.join(",")),
        chdir,
    }
}

/// Overlay `lowerdir=` lists can exceed the page mount(2) copies: with many layers under one
/// snapshot directory, the common directory becomes the working directory and the layers are
/// named relative to it (containerd does the same). Only the mount helper process may `chdir`.
pub fn compact_lowerdirs(options: &[String]) -> (Option<String>, Vec<String>) {
    let lowers: Vec<&str> = options
        .iter()
        .filter_map(|o| o.strip_prefix("lowerdir="))
        .flat_map(|l| l.split(':'))
        .collect();
    if lowers.len() < 2 {
        return (None, options.to_vec());
    }
    let first = lowers[0];
    let mut common = first.len();
    for l in &lowers[1..] {
        common = common.min(first.bytes().zip(l.bytes()).take_while(|(a, b)| a == b).count());
    }
    // Back to a whole directory: the prefix up to and including its last '/'. Found in bytes:
    // the common byte count may end inside a multi-byte character ("/s/é" and "/s/è" share
    // the first byte of both), where a string slice would panic; after an ASCII '/' is always
    // a character boundary.
    let Some(cut) = first.as_bytes()[..common].iter().rposition(|b| *b == b'/') else {
        return (None, options.to_vec());
    };
    let prefix = &first[..=cut];
    if prefix == "/" {
        return (None, options.to_vec());
    }
    let relative: Vec<&str> = lowers.iter().map(|l| &l[prefix.len()..]).collect();
    let rewritten = options
        .iter()
        .map(|o| match o.strip_prefix("lowerdir=") {
            Some(_) => format!("lowerdir={}", relative.join(":")),
            None => o.clone(),
        })
        .collect();
    (Some(prefix.to_string()), rewritten)
}

/// The mount(2) calls of one planned mount, as containerd makes them: the mount itself without
/// propagation flags (unless it only remounts), then the propagation change, then a read-only
/// remount for a read-only bind (the kernel ignores MS_RDONLY on the first bind call).
pub fn apply(source: Option<&str>, fs_type: Option<&str>, target: &Path, p: &Plan) -> nix::Result<()> {
    let flags = p.flags & !PROPAGATION;
    if !p.flags.contains(MsFlags::MS_REMOUNT) || p.data.is_some() {
        mount(source, target, fs_type, flags, p.data.as_deref())?;
    }
    if p.flags.intersects(PROPAGATION) {
        let change = p.flags & (PROPAGATION | MsFlags::MS_REC);
        mount(None::<&str>, target, None::<&str>, change, None::<&str>)?;
    }
    if flags.contains(MsFlags::MS_BIND | MsFlags::MS_RDONLY) {
        let remount = flags | MsFlags::MS_REMOUNT;
        mount(None::<&str>, target, None::<&str>, remount, None::<&str>)?;
    }
    Ok(())
}

/// Unmounts everything at or below `target`, deepest first.
pub fn umount_recursive(target: &str, flags: MntFlags) -> nix::Result<()> {
    let table =
        crate::proc::MountTable::of_self().map_err(|e| nix::Error::from_raw(e.raw_os_error().unwrap_or(libc::EIO)))?;
    for point in table.below(std::path::Path::new(target)) {
        match umount2(&point, flags) {
            Ok(()) | Err(nix::Error::EINVAL) | Err(nix::Error::ENOENT) => {}
            Err(e) => return Err(e),
        }
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
    fn flags_and_data_are_split_as_containerd_does() {
        let p = plan(
            "overlay",
            &words(&["ro", "nosuid", "index=off", "lowerdir=/a:/b", "rw"]),
        );
        assert_eq!(p.flags, MsFlags::MS_NOSUID, "rw clears the earlier ro");
        assert_eq!(p.data.as_deref(), Some("index=off,lowerdir=/a:/b"));
        assert_eq!(p.chdir, None, "short options stay as they are");
        let p = plan("bind", &words(&["rbind", "ro", "rprivate"]));
        assert_eq!(
            p.flags,
            MsFlags::MS_BIND | MsFlags::MS_REC | MsFlags::MS_RDONLY | MsFlags::MS_PRIVATE
        );
        assert_eq!(p.data, None);
    }

    #[test]
    fn long_lowerdir_lists_are_made_relative_to_their_common_directory() {
        let layers: Vec<String> = (0..60)
            .map(|i| format!("/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs/snapshots/{i}/fs"))
            .collect();
        let options = vec![
            format!("lowerdir={}", layers.join(":")),
            "upperdir=/u/99/fs".to_string(),
        ];
        let p = plan("overlay", &options);
        assert_eq!(
            p.chdir.as_deref(),
            Some("/var/lib/containerd/io.containerd.snapshotter.v1.overlayfs/snapshots/")
        );
        let data = p.data.unwrap();
        assert!(data.starts_with("lowerdir=0/fs:1/fs:"), "{data}");
        assert!(data.ends_with(",upperdir=/u/99/fs"), "{data}");
        // Nothing in common but the root: left alone.
        let (chdir, _) = compact_lowerdirs(&words(&["lowerdir=/a/x:/b/y"]));
        assert_eq!(chdir, None);
        // A shared name prefix is not a shared directory.
        // Layers that differ inside a multi-byte character.
        let (chdir, opts) = compact_lowerdirs(&words(&["lowerdir=/s/\u{e9}1:/s/\u{e8}2"]));
        assert_eq!(chdir.as_deref(), Some("/s/"));
        assert_eq!(opts, words(&["lowerdir=\u{e9}1:\u{e8}2"]));
        let (chdir, opts) = compact_lowerdirs(&words(&["lowerdir=/s/layer10:/s/layer11"]));
        assert_eq!(chdir.as_deref(), Some("/s/"));
        assert_eq!(opts, words(&["lowerdir=layer10:layer11"]));
    }
}
