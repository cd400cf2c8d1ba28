//! The binary's place on the host: `/opt/gantry/<version>/containerd-shim-gantry-v2`, written
//! by write-then-rename, and the stable path the engines use, a symlink swapped by rename.
//!
//! Why a directory per version, named by content: a running shim daemon executes its own
//! file, and overwriting a file in use fails with "Text file busy" (kata-deploy's first
//! lesson); a directory whose name is the binary's hash never changes under a daemon, and the
//! old version stays until no bundle names it.

use std::io::Read;
use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
use std::path::{Path, PathBuf};

use sha2::{Digest, Sha256};

use super::{host_path, InstallError};
use crate::runtime::choose::RuntimeRecord;

pub const SHIM_NAME: &str = "containerd-shim-gantry-v2";
/// Where the engines find gantry (CRI-O's `runtime_path`, containerd's `PATH`).
pub const STABLE_PATH: &str = "/usr/local/bin/containerd-shim-gantry-v2";
/// The versions' root on the host.
pub const VERSIONS_DIR: &str = "/opt/gantry";

/// The engines' bundle directories whose gantry records name a binary: containerd's task
/// bundles (`<ns>/<id>`) and CRI-O's container userdata.
const BUNDLE_GLOBS: [(&str, &str); 2] = [
    ("/run/containerd/io.containerd.runtime.v2.task", "*/*"),
    ("/run/containers/storage/overlay-containers", "*/userdata"),
];

/// `<crate version>-<first 12 hex digits of the binary's sha256>`, and the whole sha256.
pub fn version_of(binary: &Path) -> Result<(String, String), InstallError> {
    let hash = sha256_file(binary).map_err(|e| InstallError::io("read", binary, e))?;
    Ok((format!("{}-{}", env!("CARGO_PKG_VERSION"), &hash[..12]), hash))
}

pub fn sha256_file(path: &Path) -> std::io::Result<String> {
    let mut f = std::fs::File::open(path)?;
    let mut h = Sha256::new();
    let mut buf = vec![0u8; 1 << 16];
    loop {
        let n = f.read(&mut buf)?;
        if n == 0 {
            break;
        }
        h.update(&buf[..n]);
    }
    Ok(h.finalize().iter().map(|b| format!("{b:02x}")).collect())
}

/// The host path (as the engines see it) of `version`'s binary.
pub fn versioned(version: &str) -> PathBuf {
    Path::new(VERSIONS_DIR).join(version).join(SHIM_NAME)
}

/// Copies `source` (whose sha256 is `want`) into its version's directory unless it is already
/// there whole; returns whether anything was written.
pub fn place(host: &Path, source: &Path, version: &str, want: &str) -> Result<bool, InstallError> {
    let dest = host_path(host, &versioned(version));
    let same_size = |a: &Path, b: &Path| match (std::fs::metadata(a), std::fs::metadata(b)) {
        (Ok(a), Ok(b)) => a.len() == b.len(),
        _ => false,
    };
    if same_size(source, &dest) && sha256_file(&dest).is_ok_and(|have| have == want) {
        return Ok(false);
    }
    let dir = dest.parent().unwrap_or(host);
    let tmp = dir.join(format!(".{SHIM_NAME}.{}.tmp", std::process::id()));
    let copy = || -> std::io::Result<()> {
        let mut from = std::fs::File::open(source)?;
        let mut to = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o755)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&tmp)?;
        std::io::copy(&mut from, &mut to)?;
        to.set_permissions(std::fs::Permissions::from_mode(0o755))?;
        to.sync_all()?;
        std::fs::rename(&tmp, &dest)
    };
    copy().map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        InstallError::io("install", &dest, e)
    })?;
    Ok(true)
}

/// What the stable path is now: the version it points at, if it is gantry's link.
pub enum Stable {
    Missing,
    Link(PathBuf),
    /// A file or link gantry did not make (`scripts/install.sh` installs a plain file).
    Foreign,
}

pub fn stable(host: &Path) -> Stable {
    let path = host_path(host, Path::new(STABLE_PATH));
    match std::fs::symlink_metadata(&path) {
        Err(_) => Stable::Missing,
        Ok(m) if m.file_type().is_symlink() => match std::fs::read_link(&path).map(|t| resolve(&t)) {
            Ok(target) if target.starts_with(VERSIONS_DIR) => Stable::Link(target),
            _ => Stable::Foreign,
        },
        Ok(_) => Stable::Foreign,
    }
}

/// A link target read from the stable path, as a host path (`..` taken lexically).
fn resolve(target: &Path) -> PathBuf {
    let mut out = PathBuf::from(Path::new(STABLE_PATH).parent().unwrap_or(Path::new("/")));
    for part in target.components() {
        match part {
            std::path::Component::RootDir => out = PathBuf::from("/"),
            std::path::Component::ParentDir => {
                out.pop();
            }
            std::path::Component::Normal(p) => out.push(p),
            std::path::Component::CurDir | std::path::Component::Prefix(_) => {}
        }
    }
    out
}

/// The link's text: relative (`../../../opt/gantry/<v>/...`), so it resolves the same on the
/// host and under the installer's `/host`.
fn link_text(version: &str) -> PathBuf {
    let depth = Path::new(STABLE_PATH)
        .parent()
        .map_or(0, |p| p.components().count() - 1);
    let up: PathBuf = std::iter::repeat_n("..", depth).collect();
    up.join(versioned(version).strip_prefix("/").unwrap_or(Path::new("")))
}

/// Points the stable path at `version` by renaming a fresh link over it; returns whether it
/// changed. Refuses to replace what gantry's installer did not put there.
pub fn point_stable(host: &Path, version: &str) -> Result<bool, InstallError> {
    let target = versioned(version);
    let path = host_path(host, Path::new(STABLE_PATH));
    match stable(host) {
        Stable::Link(now) if now == target => return Ok(false),
        Stable::Foreign => return Err(InstallError::Foreign(path)),
        _ => {}
    }
    let dir = path.parent().unwrap_or(host);
    let tmp = dir.join(format!(".{SHIM_NAME}.{}.link", std::process::id()));
    let _ = std::fs::remove_file(&tmp);
    std::os::unix::fs::symlink(link_text(version), &tmp).map_err(|e| InstallError::io("link", &tmp, e))?;
    std::fs::rename(&tmp, &path).map_err(|e| {
        let _ = std::fs::remove_file(&tmp);
        InstallError::io("link", &path, e)
    })?;
    Ok(true)
}

/// Which binaries the node's bundles still name, by host path; `Err` names a bundle whose
/// record does not say (written before records named their binary), which keeps every
/// version.
pub fn in_use(host: &Path) -> Result<Vec<(PathBuf, PathBuf)>, PathBuf> {
    let mut out = Vec::new();
    for (root, pattern) in BUNDLE_GLOBS {
        for bundle in expand(&host_path(host, Path::new(root)), pattern) {
            if !bundle.join(crate::container::RUNTIME_FILE).exists() {
                continue;
            }
            match RuntimeRecord::read(&bundle) {
                Ok(Some(RuntimeRecord { shim: Some(shim), .. })) => out.push((shim, bundle)),
                _ => return Err(bundle),
            }
        }
    }
    Ok(out)
}

/// The directories under `root` matching `pattern`, whose parts are `*` or literal names.
fn expand(root: &Path, pattern: &str) -> Vec<PathBuf> {
    let mut level = vec![root.to_path_buf()];
    for part in pattern.split('/') {
        let mut next = Vec::new();
        for dir in level {
            if part == "*" {
                let entries = std::fs::read_dir(&dir).into_iter().flatten().flatten();
                next.extend(entries.map(|e| e.path()).filter(|p| p.is_dir()));
            } else if dir.join(part).is_dir() {
                next.push(dir.join(part));
            }
        }
        level = next;
    }
    level
}

/// The installed versions: the directories under `/opt/gantry`.
pub fn versions(host: &Path) -> Vec<String> {
    let dir = host_path(host, Path::new(VERSIONS_DIR));
    let mut out: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| e.path().is_dir())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    out.sort();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bundles_name_their_binary_and_an_unknown_one_keeps_everything() {
        let host = tempfile::tempdir().unwrap();
        let write = |bundle: &str, json: &str| {
            let dir = host.path().join(bundle.trim_start_matches('/'));
            std::fs::create_dir_all(&dir).unwrap();
            std::fs::write(dir.join(crate::container::RUNTIME_FILE), json).unwrap();
        };
        let shim = "/opt/gantry/0.1.0-aaaaaaaaaaaa/containerd-shim-gantry-v2";
        let record = format!(
            r#"{{"format":2,"shim":"{shim}","binary":"runc","root":"/r","systemd_cgroup":false,"rootfs_mounted":false}}"#
        );
        write("/run/containerd/io.containerd.runtime.v2.task/k8s.io/c1", &record);
        write("/run/containers/storage/overlay-containers/c2/userdata", &record);
        // A bundle of another shim (no record) is not gantry's.
        std::fs::create_dir_all(
            host.path()
                .join("run/containerd/io.containerd.runtime.v2.task/default/runc1"),
        )
        .unwrap();
        let used = in_use(host.path()).unwrap();
        assert_eq!(used.len(), 2);
        assert!(used.iter().all(|(s, _)| s == Path::new(shim)));
        write(
            "/run/containerd/io.containerd.runtime.v2.task/default/old",
            r#"{"binary":"runc","root":"/r","systemd_cgroup":false,"rootfs_mounted":false}"#,
        );
        let unknown = in_use(host.path()).unwrap_err();
        assert!(unknown.ends_with("default/old"), "{unknown:?}");
    }

    #[test]
    fn the_stable_link_is_swapped_and_a_foreign_file_refused() {
        let host = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(host.path().join("usr/local/bin")).unwrap();
        assert_eq!(
            link_text("0.1.0-a"),
            Path::new("../../../opt/gantry/0.1.0-a/containerd-shim-gantry-v2")
        );
        assert_eq!(resolve(&link_text("0.1.0-a")), versioned("0.1.0-a"));
        assert!(matches!(stable(host.path()), Stable::Missing));
        assert!(point_stable(host.path(), "0.1.0-a").unwrap());
        assert!(!point_stable(host.path(), "0.1.0-a").unwrap());
        assert!(point_stable(host.path(), "0.1.0-b").unwrap());
        assert!(matches!(stable(host.path()), Stable::Link(t) if t == versioned("0.1.0-b")));
        let path = host.path().join(STABLE_PATH.trim_start_matches('/'));
        std::fs::remove_file(&path).unwrap();
        std::fs::write(&path, "installed by install.sh").unwrap();
        assert!(matches!(
            point_stable(host.path(), "0.1.0-a"),
            Err(InstallError::Foreign(_))
        ));
    }
}
