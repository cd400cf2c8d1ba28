//! Mounting the rootfs containerd hands over in Create, and taking it down again.

use std::path::{Path, PathBuf};

use containerd_shim_protos::api::Mount;
use thiserror::Error;

#[derive(Debug, Error)]
pub enum MountError {
    #[error("mount {fs_type} {source_path:?} on {target}: {message}")]
    Mount {
        fs_type: String,
        source_path: String,
        target: String,
        message: String,
    },
    #[error("unmount {target}: {message}")]
    Unmount { target: String, message: String },
    #[error("create {target}: {source}")]
    Mkdir { target: String, source: std::io::Error },
}

/// Mounts each of containerd's rootfs mounts on `target` in order; returns the resolved
/// target the mounts sit on (`/proc/self/mountinfo` names mount points by their real path, so a
/// bundle behind a symlink, such as /var/run -> /run, is unmounted by that path).
pub fn mount_all(mounts: &[Mount], target: &Path) -> Result<PathBuf, MountError> {
    std::fs::create_dir_all(target).map_err(|source| MountError::Mkdir {
        target: target.display().to_string(),
        source,
    })?;
    let target = &target.canonicalize().map_err(|source| MountError::Mkdir {
        target: target.display().to_string(),
        source,
    })?;
    for m in mounts {
        let fs_type = (!m.type_.is_empty()).then_some(m.type_.as_str());
        let source = (!m.source.is_empty()).then_some(m.source.as_str());
        if let Err(e) = containerd_shim::mount::mount_rootfs(fs_type, source, &m.options, target) {
            let _ = unmount_all(target);
            return Err(MountError::Mount {
                fs_type: m.type_.clone(),
                source_path: m.source.clone(),
                target: target.display().to_string(),
                message: e.to_string(),
            });
        }
    }
    Ok(target.clone())
}

/// Unmounts everything at or below `target` (lazily if busy), found by its resolved path; a
/// missing target is fine.
pub fn unmount_all(target: &Path) -> Result<(), MountError> {
    let Ok(target) = target.canonicalize() else {
        return Ok(());
    };
    let Some(t) = target.to_str() else {
        return Ok(());
    };
    containerd_shim::mount::umount_recursive(Some(t), libc::MNT_DETACH).map_err(|e| MountError::Unmount {
        target: t.to_string(),
        message: e.to_string(),
    })
}

/// True when something is mounted exactly at `target`.
pub fn is_mountpoint(target: &Path) -> bool {
    let Ok(text) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return false;
    };
    let target = target.canonicalize().unwrap_or_else(|_| target.to_path_buf());
    let t = target.to_string_lossy();
    text.lines().any(|l| l.split(' ').nth(4) == Some(&*t))
}
