//! Init's and execs' pid files and the console socket a tty's runtime call sends its pty
//! master on.

use std::path::Path;
use std::time::Duration;

use super::TaskError;
use crate::io::{self, StdioPaths};
use crate::runtime::RuntimeError;

/// The pid a runtime wrote into `path` (`--pid-file`).
pub(super) fn read_pid(path: &Path) -> Result<i32, TaskError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| TaskError::Internal(format!("read pid file {}: {e}", path.display())))?;
    text.trim()
        .parse()
        .map_err(|e| TaskError::Internal(format!("pid file {}: {e}", path.display())))
}

/// Runs a runtime create/exec while receiving the pty master on the console socket.
pub(super) async fn run_with_console(
    fut: impl std::future::Future<Output = Result<(), RuntimeError>>,
    console: Option<&io::ConsoleSocket>,
    pio: &io::ProcessIo,
    stdio: &StdioPaths,
) -> Result<(), TaskError> {
    let Some(console) = console else {
        return fut.await.map_err(TaskError::from);
    };
    let recv = console.receive();
    tokio::pin!(fut);
    tokio::pin!(recv);
    let mut master = None;
    let mut done = None;
    while done.is_none() {
        tokio::select! {
            r = &mut fut, if done.is_none() => done = Some(r),
            m = &mut recv, if master.is_none() => master = Some(m),
        }
    }
    done.unwrap_or(Ok(()))?;
    let master = match master {
        Some(m) => m?,
        None => tokio::time::timeout(Duration::from_secs(5), recv)
            .await
            .map_err(|_| TaskError::Internal("the runtime sent no pty master".into()))??,
    };
    pio.attach_console(master, stdio)?;
    Ok(())
}
