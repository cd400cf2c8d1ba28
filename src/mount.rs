//! Mounting the rootfs containerd hands over in Create, and taking it down again. The mounts
//! run in a forked helper process: a long overlay option string needs a change of working
//! directory, and a mount can block (a slow or stuck filesystem), neither of which the
//! daemon's only thread may suffer. Options become mount(2) calls in [`options`].

use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::time::Instant;

use containerd_shim_protos::api::Mount;
use thiserror::Error;
use tokio::io::AsyncReadExt;

use crate::reaper::Reaper;

pub mod options;

#[derive(Debug, Error)]
pub enum MountError {
    /// The kernel refused one of the request's mounts (its type, source or options).
    #[error("mount on {target}: {message}")]
    Mount { target: String, message: String },
    #[error("unmount {target}: {message}")]
    Unmount { target: String, message: String },
    #[error("create {target}: {source}")]
    Mkdir { target: String, source: std::io::Error },
    /// The helper that mounts could not run, or died without saying why.
    #[error("mount on {target}: {message}")]
    Helper { target: String, message: String },
}

/// Mounts each of containerd's rootfs mounts on `target` in order, in a forked helper; returns
/// the resolved target the mounts sit on (`/proc/self/mountinfo` names mount points by their
/// real path, so a bundle behind a symlink, such as /var/run -> /run, is unmounted by that path).
pub async fn mount_all(mounts: &[Mount], target: &Path, reaper: &Reaper) -> Result<PathBuf, MountError> {
    std::fs::create_dir_all(target).map_err(|source| MountError::Mkdir {
        target: target.display().to_string(),
        source,
    })?;
    let target = target.canonicalize().map_err(|source| MountError::Mkdir {
        target: target.display().to_string(),
        source,
    })?;
    let work = || {
        for m in mounts {
            let plan = options::plan(&m.type_, &m.options);
            if let Some(dir) = &plan.chdir {
                std::env::set_current_dir(dir).map_err(|e| format!("overlay lower directories under {dir}: {e}"))?;
            }
            let fs_type = (!m.type_.is_empty()).then_some(m.type_.as_str());
            let source = (!m.source.is_empty()).then_some(m.source.as_str());
            options::apply(source, fs_type, &target, &plan)
                .map_err(|e| format!("mount {} {:?}: {e}", m.type_, m.source))?;
        }
        Ok(())
    };
    if let Err(failed) = in_helper(work, reaper).await {
        let _ = unmount_all(&target);
        let target = target.display().to_string();
        return Err(match failed {
            Failed::Work(message) => MountError::Mount { target, message },
            Failed::Helper(message) => MountError::Helper { target, message },
        });
    }
    Ok(target)
}

/// Why a helper's work did not happen.
enum Failed {
    /// The work itself failed, saying why.
    Work(String),
    /// The helper could not run or died without saying why.
    Helper(String),
}

/// Runs `work` in a forked child that only does that and `_exit`s; its error text comes back
/// over a pipe, its exit through the reaper. The daemon runs one thread, so the child starts
/// with a consistent copy of it.
async fn in_helper(work: impl FnOnce() -> Result<(), String>, reaper: &Reaper) -> Result<(), Failed> {
    let (r, w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| Failed::Helper(format!("pipe: {e}")))?;
    let since = Instant::now();
    // SAFETY: the child runs `work` (mount syscalls and their bookkeeping) and `_exit`s; it
    // never returns into the runtime.
    match unsafe { nix::unistd::fork() } {
        Ok(nix::unistd::ForkResult::Child) => {
            drop(r);
            let result = std::panic::catch_unwind(std::panic::AssertUnwindSafe(work))
                .unwrap_or_else(|_| Err("the mount helper panicked".into()));
            let code = match result {
                Ok(()) => 0,
                Err(message) => {
                    let _ = nix::unistd::write(&w, message.as_bytes());
                    1
                }
            };
            // SAFETY: ends the child without running the parent's destructors or atexit hooks.
            unsafe { libc::_exit(code) }
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            let exit = reaper.subscribe_since(child.as_raw(), Some(since));
            drop(w);
            let message = read_all(r).await;
            match exit.await {
                Ok(e) if e.status == 0 => Ok(()),
                Ok(e) if e.status == 1 && !message.is_empty() => Err(Failed::Work(message)),
                Ok(e) => Err(Failed::Helper(format!(
                    "the mount helper exited with status {} {message}",
                    e.status
                ))),
                Err(_) => Err(Failed::Helper("the mount helper's exit was lost".into())),
            }
        }
        Err(e) => Err(Failed::Helper(format!("fork the mount helper: {e}"))),
    }
}

async fn read_all(fd: OwnedFd) -> String {
    let mut text = Vec::new();
    if let Ok(mut r) = tokio::net::unix::pipe::Receiver::from_owned_fd(fd) {
        let _ = r.read_to_end(&mut text).await;
    }
    String::from_utf8_lossy(&text).trim().to_string()
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
    options::umount_recursive(t, nix::mount::MntFlags::MNT_DETACH).map_err(|e| MountError::Unmount {
        target: t.to_string(),
        message: e.to_string(),
    })
}

/// True when something is mounted exactly at `target`.
pub fn is_mountpoint(target: &Path) -> bool {
    let target = target.canonicalize().unwrap_or_else(|_| target.to_path_buf());
    crate::proc::MountTable::of_self().is_ok_and(|t| t.is_mount_point(&target))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn mount(fs_type: &str, source: &str, options: Vec<String>) -> Mount {
        Mount {
            type_: fs_type.into(),
            source: source.into(),
            options,
            ..Default::default()
        }
    }

    // The std lock keeps other tests' children out of this reaper's waitpid(-1) while it runs.
    #[allow(clippy::await_holding_lock)]
    #[tokio::test]
    async fn mounts_run_in_a_helper_that_cannot_take_the_daemon_down() {
        if !nix::unistd::geteuid().is_root() {
            return;
        }
        let _children = crate::sys::test_children_lock();
        let reaper = Reaper::default();
        reaper.start().unwrap();
        let dir = tempfile::tempdir().unwrap();
        let cwd = std::env::current_dir().unwrap();

        let target = dir.path().join("ok");
        let got = mount_all(&[mount("tmpfs", "tmpfs", vec!["size=1m".into()])], &target, &reaper)
            .await
            .unwrap();
        assert!(is_mountpoint(&got), "the helper's mount is visible to the daemon");
        unmount_all(&got).unwrap();
        assert!(!is_mountpoint(&got));

        // Over a page of overlay options: mount_rootfs changes directory to the layers' common
        // prefix, and `_exit`s when it cannot. In the daemon's own process, that was the end.
        let prefix = dir.path().join("missing").join("x".repeat(100));
        let lower: Vec<String> = (0..60)
            .map(|i| prefix.join(format!("layer{i}")).display().to_string())
            .collect();
        let options = vec![
            format!("lowerdir={}", lower.join(":")),
            format!("upperdir={}", dir.path().join("u").display()),
            format!("workdir={}", dir.path().join("w").display()),
        ];
        let e = mount_all(&[mount("overlay", "overlay", options)], &dir.path().join("ov"), &reaper)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("overlay lower directories"), "{e}");
        assert_eq!(std::env::current_dir().unwrap(), cwd, "the daemon's directory changed");

        let e = mount_all(&[mount("nosuchfs", "x", vec![])], &dir.path().join("bad"), &reaper)
            .await
            .unwrap_err();
        assert!(e.to_string().contains("nosuchfs"), "{e}");
        assert!(
            matches!(e, MountError::Mount { .. }),
            "a refused mount is the request's: {e}"
        );
    }
}
