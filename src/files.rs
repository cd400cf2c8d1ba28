//! Files gantry writes where someone else could have planted a link: the bundle (the engine's
//! directory, which CRI-O and direct callers fill) and the socket directory. Nothing is ever
//! written through a symlink: a file is created beside its final name with `O_EXCL |
//! O_NOFOLLOW` and renamed over it, which replaces a planted link instead of following it, and
//! a reader sees either the old file or the whole new one.

use std::fs::{DirBuilder, File, OpenOptions};
use std::io::Write;
use std::os::unix::fs::{DirBuilderExt, FileTypeExt, MetadataExt, OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

static SEQ: AtomicU64 = AtomicU64::new(0);

/// Writes `data` to `path` by rename from a fresh temporary file in the same directory (mode
/// 0644 less the umask, or `mode` when given): atomic for readers, and a symlink planted at
/// `path` is replaced, never written through.
pub fn write_atomic(path: &Path, data: &[u8]) -> std::io::Result<()> {
    write_atomic_mode(path, data, 0o644)
}

/// [`write_atomic`] with an explicit creation mode (0600 for what only root should read).
pub fn write_atomic_mode(path: &Path, data: &[u8], mode: u32) -> std::io::Result<()> {
    let tmp = temp_name(path)?;
    let result = (|| {
        let mut f = OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(mode)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        f.write_all(data)?;
        drop(f);
        std::fs::rename(&tmp, path)
    })();
    if result.is_err() {
        let _ = std::fs::remove_file(&tmp);
    }
    result
}

fn temp_name(path: &Path) -> std::io::Result<PathBuf> {
    let name = path
        .file_name()
        .ok_or_else(|| std::io::Error::new(std::io::ErrorKind::InvalidInput, "no file name"))?;
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    let tmp = format!(".{}.{}-{n}.tmp", name.to_string_lossy(), std::process::id());
    Ok(path.with_file_name(tmp))
}

/// Opens an existing file for reading and writing without following a final symlink (the log
/// FIFO, which opened so needs no reader yet).
pub fn open_rw_nofollow(path: &Path, extra_flags: i32) -> std::io::Result<File> {
    OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC | extra_flags)
        .open(path)
}

/// Sets the mode of a file someone else (the runtime) created, through a descriptor opened
/// without following a link; best effort.
pub fn restrict(path: &Path, mode: u32) {
    let opened = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(path);
    if let Ok(f) = opened {
        let _ = f.set_permissions(std::fs::Permissions::from_mode(mode));
    }
}

/// Removes `path` only when it is not a directory, and never what a link points at (unlink
/// removes the link itself): for files gantry owns in a bundle, whatever was planted there.
pub fn remove_entry(path: &Path) {
    if let Ok(m) = std::fs::symlink_metadata(path) {
        if !m.is_dir() {
            let _ = std::fs::remove_file(path);
        }
    }
}

/// Creates (or tightens) the directory that holds the daemons' sockets: owned by this user,
/// mode 0700, so no other user can reach a socket even if its own mode were widened. A
/// sticky, world-writable directory such as /tmp is shared by design and left alone.
pub fn private_dir(dir: &Path) -> std::io::Result<()> {
    DirBuilder::new().recursive(true).mode(0o700).create(dir)?;
    let m = std::fs::metadata(dir)?;
    let sticky = m.mode() & 0o1000 != 0;
    if m.uid() == nix::unistd::geteuid().as_raw() && m.mode() & 0o077 != 0 && !sticky {
        std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o700))?;
    }
    Ok(())
}

/// True when `path` is a unix socket directly inside `dir` (both taken literally, after
/// resolving `dir`'s own links): what `delete` may remove when a dead daemon's `address`
/// names it, and nothing else.
pub fn is_socket_in(path: &Path, dir: &Path) -> bool {
    let Ok(dir) = dir.canonicalize() else {
        return false;
    };
    let (Some(parent), Some(_)) = (path.parent(), path.file_name()) else {
        return false;
    };
    if parent.canonicalize().ok().as_deref() != Some(dir.as_path()) {
        return false;
    }
    std::fs::symlink_metadata(path).is_ok_and(|m| m.file_type().is_socket())
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::os::unix::fs::symlink;

    #[test]
    fn atomic_write_replaces_a_planted_symlink_instead_of_following_it() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "precious").unwrap();
        let planted = dir.path().join("address");
        symlink(&victim, &planted).unwrap();
        write_atomic(&planted, b"unix:///run/x").unwrap();
        assert_eq!(std::fs::read_to_string(&victim).unwrap(), "precious");
        assert!(!std::fs::symlink_metadata(&planted).unwrap().file_type().is_symlink());
        assert_eq!(std::fs::read_to_string(&planted).unwrap(), "unix:///run/x");
        // No temporary file is left beside it.
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names.len(), 2, "{names:?}");
    }

    #[test]
    fn failed_atomic_write_leaves_nothing() {
        let dir = tempfile::tempdir().unwrap();
        // The final name is a directory: rename fails, the temporary file goes.
        let target = dir.path().join("d");
        std::fs::create_dir(&target).unwrap();
        std::fs::write(target.join("f"), "x").unwrap();
        assert!(write_atomic(&target, b"data").is_err());
        let names: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .map(|e| e.file_name())
            .collect();
        assert_eq!(names, vec![std::ffi::OsString::from("d")]);
    }

    #[test]
    fn log_fifo_is_not_opened_through_a_symlink() {
        let dir = tempfile::tempdir().unwrap();
        let victim = dir.path().join("victim");
        std::fs::write(&victim, "").unwrap();
        let log = dir.path().join("log");
        symlink(&victim, &log).unwrap();
        let e = open_rw_nofollow(&log, 0).unwrap_err();
        assert_eq!(e.raw_os_error(), Some(libc::ELOOP));
    }

    #[test]
    fn only_sockets_inside_the_directory_qualify_for_removal() {
        let dir = tempfile::tempdir().unwrap();
        let sockets = dir.path().join("s");
        private_dir(&sockets).unwrap();
        let sock = sockets.join("abc");
        let _l = std::os::unix::net::UnixListener::bind(&sock).unwrap();
        assert!(is_socket_in(&sock, &sockets));
        let file = sockets.join("file");
        std::fs::write(&file, "").unwrap();
        assert!(!is_socket_in(&file, &sockets), "a regular file is not a socket");
        let outside = dir.path().join("other");
        let _l2 = std::os::unix::net::UnixListener::bind(&outside).unwrap();
        assert!(!is_socket_in(&outside, &sockets), "a socket elsewhere is not ours");
        let link = sockets.join("link");
        symlink(&outside, &link).unwrap();
        assert!(!is_socket_in(&link, &sockets), "a link to a socket is not a socket");
    }

    #[test]
    fn socket_dir_is_private() {
        let dir = tempfile::tempdir().unwrap();
        let sockets = dir.path().join("a/b");
        private_dir(&sockets).unwrap();
        assert_eq!(std::fs::metadata(&sockets).unwrap().mode() & 0o777, 0o700);
        std::fs::set_permissions(&sockets, std::fs::Permissions::from_mode(0o755)).unwrap();
        private_dir(&sockets).unwrap();
        assert_eq!(std::fs::metadata(&sockets).unwrap().mode() & 0o777, 0o700, "tightened");
    }
}
