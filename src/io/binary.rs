//! `binary://` logging, as containerd defines it: a logger process gets the container's stdout
//! and stderr as fds 3 and 4, signals readiness by closing (or writing to) fd 5, and learns
//! who it serves from `CONTAINER_ID` and `CONTAINER_NAMESPACE`. On close it gets SIGTERM, then
//! SIGKILL if it lingers.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::AsyncReadExt;
use tokio::sync::oneshot;

use super::IoError;
use crate::reaper::{Exit, Reaper};

/// How long a logger gets to drain after SIGTERM before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(5);
/// How long a logger may take to signal readiness.
const READY_TIMEOUT: Duration = Duration::from_secs(10);

/// A running logging process.
pub struct BinaryLogger {
    pid: i32,
    exit: Mutex<Option<oneshot::Receiver<Exit>>>,
}

fn err(path: &Path, source: std::io::Error) -> IoError {
    IoError::Open {
        which: "binary logger",
        path: path.display().to_string(),
        source,
    }
}

/// The logger's argv from the URI's query, containerd's way: each key, then its value if any.
pub fn logger_args(args: &[(String, String)]) -> Vec<String> {
    let mut out = Vec::new();
    for (k, v) in args {
        out.push(k.clone());
        if !v.is_empty() {
            out.push(v.clone());
        }
    }
    out
}

/// Spawns the logger; returns it with the write ends the container gets as stdout and stderr.
pub async fn spawn(
    path: &Path,
    args: &[(String, String)],
    id: &str,
    namespace: &str,
    reaper: &Reaper,
) -> Result<(BinaryLogger, OwnedFd, OwnedFd), IoError> {
    let e = |source| err(path, source);
    let (out_r, out_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|x| e(x.into()))?;
    let (err_r, err_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|x| e(x.into()))?;
    let (ready_r, ready_w) = nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|x| e(x.into()))?;
    let mut cmd = Command::new(path);
    cmd.args(logger_args(args))
        .env("CONTAINER_ID", id)
        .env("CONTAINER_NAMESPACE", namespace)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    crate::environ::sanitise(&mut cmd);
    let fds = [out_r.as_raw_fd(), err_r.as_raw_fd(), ready_w.as_raw_fd()];
    // SAFETY: install_fds is async-signal-safe.
    unsafe {
        cmd.pre_exec(move || crate::sys::install_fds(&fds, 3));
    }
    let started = Instant::now();
    let child = cmd.spawn().map_err(e)?;
    let pid = child.id() as i32;
    let exit = reaper.subscribe_since(pid, Some(started));
    drop((out_r, err_r, ready_w, cmd));
    let logger = BinaryLogger {
        pid,
        exit: Mutex::new(Some(exit)),
    };
    let mut ready = tokio::net::unix::pipe::Receiver::from_owned_fd(ready_r).map_err(e)?;
    let mut b = [0u8; 1];
    match tokio::time::timeout(READY_TIMEOUT, ready.read(&mut b)).await {
        Ok(Ok(_)) => Ok((logger, out_w, err_w)),
        Ok(Err(x)) => {
            logger.stop().await;
            Err(e(x))
        }
        Err(_) => {
            logger.stop().await;
            Err(e(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                "logger did not signal readiness on fd 5",
            )))
        }
    }
}

impl BinaryLogger {
    /// SIGTERM, a grace period to drain, then SIGKILL.
    pub async fn stop(&self) {
        let Some(mut exit) = self.exit.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return;
        };
        if exit.try_recv().is_ok() {
            return;
        }
        let _ = kill(Pid::from_raw(self.pid), Signal::SIGTERM);
        if tokio::time::timeout(STOP_GRACE, &mut exit).await.is_err() {
            let _ = kill(Pid::from_raw(self.pid), Signal::SIGKILL);
            let _ = tokio::time::timeout(STOP_GRACE, exit).await;
        }
    }

    pub fn pid(&self) -> i32 {
        self.pid
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn args_follow_containerd() {
        let a = vec![("--id".to_string(), "x".to_string()), ("-v".to_string(), String::new())];
        assert_eq!(logger_args(&a), ["--id", "x", "-v"]);
    }
}
