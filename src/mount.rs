//! Mounting the rootfs containerd hands over in Create, and taking it down again. The mounts
//! run in a helper process, this binary re-executed as `mount-helper`: a long overlay option
//! string needs a change of working directory, and a mount can block (a slow or stuck
//! filesystem), neither of which the daemon may suffer. The helper is exec'd rather than
//! forked: the daemon has threads (the blocking pool, the cgroup warm-up), and a forked copy
//! of a threaded process may find a lock held forever. Options become mount(2) calls in
//! [`options`].

use std::io::Read;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Instant;

use containerd_shim_protos::api::Mount;
use serde::{Deserialize, Serialize};
use thiserror::Error;
use tokio::io::{AsyncReadExt, AsyncWriteExt};

use crate::reaper::Reaper;

pub mod idmap;
pub mod options;

/// The first argument that makes this binary the mount helper.
pub const HELPER_ARG: &str = "mount-helper";
/// The helper's `argv[0]`, so process listings tell it from a daemon.
const HELPER_NAME: &str = "gantry-mount-helper";

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

/// What the helper is asked to do: the engine's mounts, in order, on `target`. It travels as
/// JSON on the helper's stdin.
#[derive(Debug, Serialize, Deserialize)]
struct Request {
    target: PathBuf,
    mounts: Vec<Wanted>,
}

#[derive(Debug, Serialize, Deserialize)]
struct Wanted {
    fs_type: String,
    source: String,
    options: Vec<String>,
}

/// Mounts each of containerd's rootfs mounts on `target` in order, in the helper; returns
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
    let request = Request {
        target: target.clone(),
        mounts: mounts
            .iter()
            .map(|m| Wanted {
                fs_type: m.type_.clone(),
                source: m.source.clone(),
                options: m.options.clone(),
            })
            .collect(),
    };
    if let Err(failed) = in_helper(&request, reaper).await {
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

/// Runs the request in `<this binary> mount-helper` ([`crate::environ::self_exe`]): the request goes in on stdin, the
/// reason for a refusal comes back on stdout (exit status 1), the exit through the reaper.
async fn in_helper(request: &Request, reaper: &Reaper) -> Result<(), Failed> {
    let body = serde_json::to_vec(request).map_err(|e| Failed::Helper(format!("encode the request: {e}")))?;
    let mut cmd = std::process::Command::new(crate::environ::self_exe());
    cmd.arg0(HELPER_NAME)
        .arg(HELPER_ARG)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    crate::environ::sanitise(&mut cmd);
    let since = Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| Failed::Helper(format!("start the mount helper: {e}")))?;
    let exit = reaper.subscribe_since(child.id() as i32, Some(since));
    let (stdin, stdout, stderr) = (child.stdin.take(), child.stdout.take(), child.stderr.take());
    let write = async {
        if let Some(w) = stdin.and_then(|w| tokio::net::unix::pipe::Sender::from_owned_fd(OwnedFd::from(w)).ok()) {
            let mut w = w;
            // A helper that died early closes its stdin: its exit status says why.
            let _ = w.write_all(&body).await;
        }
    };
    let (_, message, stderr) = tokio::join!(
        write,
        read_all(stdout.map(OwnedFd::from)),
        read_all(stderr.map(OwnedFd::from))
    );
    match exit.await {
        Ok(e) if e.status == 0 => Ok(()),
        Ok(e) if e.status == 1 && !message.is_empty() => Err(Failed::Work(message)),
        Ok(e) => Err(Failed::Helper(format!(
            "the mount helper exited with status {} {message} {stderr}",
            e.status
        ))),
        Err(_) => Err(Failed::Helper("the mount helper's exit was lost".into())),
    }
}

async fn read_all(fd: Option<OwnedFd>) -> String {
    let mut text = Vec::new();
    if let Some(Ok(mut r)) = fd.map(tokio::net::unix::pipe::Receiver::from_owned_fd) {
        let _ = r.read_to_end(&mut text).await;
    }
    String::from_utf8_lossy(&text).trim().to_string()
}

/// The helper's side: reads the request on stdin and mounts. Exit status 0 when every mount
/// is in place, 1 with the reason on stdout when one was refused, 2 for a request that could
/// not be read (on stderr).
pub fn helper_main() -> i32 {
    let mut input = Vec::new();
    if let Err(e) = std::io::stdin().read_to_end(&mut input) {
        eprintln!("mount-helper: read the request: {e}");
        return 2;
    }
    let request: Request = match serde_json::from_slice(&input) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("mount-helper: the request on stdin is not valid: {e}");
            return 2;
        }
    };
    match mount_request(&request) {
        Ok(()) => 0,
        Err(message) => {
            print!("{message}");
            1
        }
    }
}

fn mount_request(request: &Request) -> Result<(), String> {
    for m in &request.mounts {
        let (idmap, options) = idmap::split(&m.options)?;
        let userns = idmap.as_ref().map(idmap::user_namespace).transpose()?;
        let overlay = m.fs_type == "overlay";
        // Held until the overlay is mounted: its layers are reached through the stage.
        let (options, _stage) = match &userns {
            Some(ns) if overlay => {
                let (options, stage) = idmap::overlay_lowers(&options, &request.target, ns.as_fd())?;
                (options, Some(stage))
            }
            _ => (options, None),
        };
        let plan = options::plan(&m.fs_type, &options);
        if let Some(dir) = &plan.chdir {
            std::env::set_current_dir(dir).map_err(|e| format!("overlay lower directories under {dir}: {e}"))?;
        }
        let fs_type = (!m.fs_type.is_empty()).then_some(m.fs_type.as_str());
        let source = (!m.source.is_empty()).then_some(m.source.as_str());
        options::apply(source, fs_type, &request.target, &plan)
            .map_err(|e| format!("mount {} {:?}: {e}", m.fs_type, m.source))?;
        if let (Some(ns), false) = (&userns, overlay) {
            idmap::remap_in_place(&request.target, ns.as_fd())?;
        }
    }
    Ok(())
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
