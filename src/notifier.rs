//! The daemon's side of watched syscalls ([`crate::security::notify`]): a socket bound before
//! the runtime's `create`, to which the runtime sends the container's seccomp notification fd
//! once its filter is loaded; then each notification answered on the event loop.
//!
//! Nothing here blocks the reactor: a notification is received only after `poll` says one is
//! pending, and the kernel counts a pending notification until it is received, so the receive
//! returns at once (ENOENT when its caller died in between). When every task under the filter
//! has exited, the fd hangs up and the task ends. If the daemon dies, the kernel fails the
//! container's pending and later watched calls with ENOSYS; nothing can attach again.

use std::collections::HashMap;
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use libseccomp::{notify_id_valid, ScmpArch, ScmpNotifReq, ScmpNotifResp, ScmpNotifRespFlags};
use slog::{info, warn, Logger};
use thiserror::Error;
use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncReadExt, Interest};
use tokio::task::JoinHandle;
use tokio::time::Instant;

use crate::security::notify::{NotifyAction, Watch};
use crate::telemetry::{PodMeta, SeccompCall, Telemetry};

#[derive(Debug, Error)]
pub enum NotifierError {
    #[error("seccomp listener {path}: {source}")]
    Bind { path: PathBuf, source: std::io::Error },
    #[error("seccomp listener: {0}")]
    Io(#[from] std::io::Error),
    #[error("seccomp listener: a peer of another user (uid {0}) connected")]
    Peer(u32),
}

/// How long one line of the event log and the log stands for the calls of one syscall: the
/// first call is reported at once, the rest of the window in one line with their count.
pub const REPORT_WINDOW: Duration = Duration::from_secs(1);

static SEQ: AtomicU64 = AtomicU64::new(0);

/// The socket the runtime connects to (`linux.seccomp.listenerPath`); removed when dropped.
pub struct Listener {
    path: PathBuf,
    listener: tokio::net::UnixListener,
}

/// A fresh socket path in `dir` (the daemon's private socket directory), for [`Listener::bind`]:
/// the profile names it before the socket exists, and only a container with a watch binds it.
pub fn socket_path(dir: &Path) -> PathBuf {
    let n = SEQ.fetch_add(1, Ordering::Relaxed);
    dir.join(format!("seccomp-{}-{n}", std::process::id()))
}

impl Listener {
    /// Binds `path` with mode 0600, whatever umask the engine gave the daemon.
    pub fn bind(path: &Path) -> Result<Self, NotifierError> {
        let path = path.to_path_buf();
        let err = |source| NotifierError::Bind {
            path: path.clone(),
            source,
        };
        let _ = std::fs::remove_file(&path);
        let listener = tokio::net::UnixListener::bind(&path).map_err(err)?;
        let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).map_err(|e| err(e.into()))?;
        // SAFETY: a valid NUL-terminated path; fchmodat changes only that file's mode.
        if unsafe { libc::fchmodat(libc::AT_FDCWD, c.as_ptr(), 0o600, 0) } != 0 {
            return Err(err(std::io::Error::last_os_error()));
        }
        Ok(Self { path, listener })
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Who the notifications are about and what to do with them.
pub struct Context {
    pub id: String,
    pub pod: PodMeta,
    pub watch: Watch,
    pub telemetry: Telemetry,
    pub log: Logger,
    /// Init's pid once `create` has returned: what `kill` kills.
    pub init: Arc<OnceLock<i32>>,
}

/// The serving task; aborted (and the socket removed) when dropped.
pub struct Notifier(JoinHandle<()>);

impl Drop for Notifier {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// Starts serving `listener` for `ctx`'s container.
pub fn spawn(listener: Listener, ctx: Context) -> Notifier {
    Notifier(tokio::spawn(async move {
        let log = ctx.log.clone();
        match accept(listener).await {
            Ok(fd) => {
                if let Err(e) = serve(fd, ctx).await {
                    warn!(log, "seccomp notifications: stopped"; "error" => %e);
                }
            }
            Err(e) => warn!(log, "seccomp listener: no notification fd"; "error" => %e),
        }
    }))
}

/// Takes the one connection the runtime makes, checks its peer, and returns the fd it sent.
/// The rest of its message (the container's state as JSON) is read to its end and dropped:
/// closing early would fail the runtime's write.
async fn accept(listener: Listener) -> Result<OwnedFd, NotifierError> {
    let (mut stream, _) = listener.listener.accept().await?;
    drop(listener);
    let peer = crate::peer::peer_of(&stream)?;
    if !crate::peer::same_user(&peer) {
        return Err(NotifierError::Peer(peer.uid));
    }
    let fd = loop {
        stream.readable().await?;
        match stream.try_io(Interest::READABLE, || crate::io::recv_fd(stream.as_raw_fd())) {
            Ok(fd) => break fd,
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e.into()),
        }
    };
    let mut rest = [0u8; 4096];
    while stream.read(&mut rest).await? > 0 {}
    Ok(fd)
}

/// What a zero-timeout poll of the notification fd says.
enum Pending {
    Notification,
    Nothing,
    /// Every task under the filter has exited.
    HungUp,
}

fn pending(fd: &OwnedFd) -> Pending {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(
        std::os::fd::AsFd::as_fd(fd),
        PollFlags::POLLIN | PollFlags::POLLHUP,
    )];
    match poll(&mut fds, PollTimeout::ZERO) {
        Ok(n) if n > 0 => {
            let got = fds[0].revents().unwrap_or(PollFlags::empty());
            if got.contains(PollFlags::POLLIN) {
                Pending::Notification
            } else if got.intersects(PollFlags::POLLHUP | PollFlags::POLLERR | PollFlags::POLLNVAL) {
                Pending::HungUp
            } else {
                Pending::Nothing
            }
        }
        _ => Pending::Nothing,
    }
}

async fn serve(fd: OwnedFd, ctx: Context) -> Result<(), NotifierError> {
    info!(ctx.log, "seccomp notifications: serving"; "watch" => ctx.watch.describe());
    // SAFETY: the AsyncFd owns the fd; it is neither closed nor duplicated while registered.
    let fd =
        unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.map_err(|e| NotifierError::Io(e.into()))?;
    let mut reports = Reports::default();
    loop {
        let flush = reports.next_due();
        let mut guard = tokio::select! {
            g = fd.readable() => g?,
            () = sleep_until(flush) => {
                report(&ctx, reports.due(Instant::now()));
                continue;
            }
        };
        match pending(fd.get_ref()) {
            Pending::Notification => {}
            Pending::Nothing => {
                guard.clear_ready();
                continue;
            }
            Pending::HungUp => break,
        }
        let raw = fd.get_ref().as_raw_fd();
        // ENOENT: the caller died between the poll and the receive.
        let Ok(req) = ScmpNotifReq::receive(raw) else { continue };
        if let Some(call) = answer(raw, &req, &ctx) {
            let first = reports.record(call, Instant::now());
            report(&ctx, first);
        }
    }
    report(&ctx, reports.due(Instant::now() + REPORT_WINDOW));
    info!(
        ctx.log,
        "seccomp notifications: every process under the filter has exited"
    );
    Ok(())
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Answers one notification as the watch says; the call, for the report, unless its caller
/// was already gone (`SECCOMP_IOCTL_NOTIF_ID_VALID` is checked before anything acts on its pid).
fn answer(fd: i32, req: &ScmpNotifReq, ctx: &Context) -> Option<Call> {
    notify_id_valid(fd, req.id).ok()?;
    let action = ctx.watch.action;
    if action == NotifyAction::Kill {
        // Init first, then the caller, then the answer: the caller waits in the call (its pid
        // still its own) until answered, so nothing in the container acts on the call before
        // init is dead. Killed in another order, a container on a busy host ran on between
        // the two kills (its shell saw the caller die and exited 0).
        let kill =
            |pid: i32| nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
        let init = ctx.init.get().map(|init| (*init, kill(*init)));
        let caller = kill(req.pid as i32);
        info!(ctx.log, "watched syscall: killing the container"; "caller" => req.pid,
            "caller_killed" => ?caller, "init" => ?init);
    }
    let resp = match action {
        NotifyAction::Log => ScmpNotifResp::new_continue(req.id, ScmpNotifRespFlags::empty()),
        NotifyAction::Deny | NotifyAction::Kill => {
            ScmpNotifResp::new_error(req.id, -libc::EPERM, ScmpNotifRespFlags::empty())
        }
    };
    // Fails only when the caller died meanwhile (always, after a kill): reported all the same.
    let _ = resp.respond(fd);
    let syscall = req
        .data
        .syscall
        .get_name_by_arch(req.data.arch)
        .unwrap_or_else(|_| format!("nr{}", i32::from(req.data.syscall)));
    Some(Call {
        syscall,
        arch: arch_name(req.data.arch),
        pid: req.pid,
    })
}

fn arch_name(arch: ScmpArch) -> &'static str {
    match arch {
        ScmpArch::X8664 => "x86_64",
        ScmpArch::X86 => "x86",
        ScmpArch::X32 => "x32",
        ScmpArch::Aarch64 => "aarch64",
        ScmpArch::Arm => "arm",
        ScmpArch::Riscv64 => "riscv64",
        ScmpArch::S390X => "s390x",
        ScmpArch::Ppc64Le => "ppc64le",
        _ => "other",
    }
}

/// One watched call as answered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    pub syscall: String,
    pub arch: &'static str,
    pub pid: u32,
}

/// Writes `lines` (a call and how many it stands for) to the event log and the log.
fn report(ctx: &Context, lines: Vec<(Call, u64)>) {
    let action = ctx.watch.action.as_str();
    for (call, count) in lines {
        let c = SeccompCall {
            syscall: &call.syscall,
            arch: call.arch,
            pid: call.pid,
            action,
        };
        ctx.telemetry.seccomp(&ctx.id, &ctx.pod, &c, count);
        warn!(ctx.log, "watched syscall"; "syscall" => &call.syscall, "arch" => call.arch,
            "pid" => call.pid, "action" => action, "count" => count);
    }
}

/// Rate-limits the reports: per syscall, the first call of a window is reported at once and
/// the others of that window together when it ends. Every call is counted in some line.
#[derive(Default)]
pub struct Reports {
    windows: HashMap<String, Window>,
}

struct Window {
    ends: Instant,
    /// Calls since the window's first, and the last of them.
    held: u64,
    last: Option<Call>,
}

impl Reports {
    /// Counts `call` at `now`; returns what to report at once.
    pub fn record(&mut self, call: Call, now: Instant) -> Vec<(Call, u64)> {
        let mut out = self.due(now);
        match self.windows.get_mut(&call.syscall) {
            Some(w) => {
                w.held += 1;
                w.last = Some(call);
            }
            None => {
                let w = Window {
                    ends: now + REPORT_WINDOW,
                    held: 0,
                    last: None,
                };
                self.windows.insert(call.syscall.clone(), w);
                out.push((call, 1));
            }
        }
        out
    }

    /// The windows ended by `now`, each with its held calls (if any), forgotten.
    pub fn due(&mut self, now: Instant) -> Vec<(Call, u64)> {
        let ended: Vec<String> = self
            .windows
            .iter()
            .filter(|(_, w)| w.ends <= now)
            .map(|(k, _)| k.clone())
            .collect();
        let mut out = Vec::new();
        for k in ended {
            if let Some(Window {
                held, last: Some(call), ..
            }) = self.windows.remove(&k)
            {
                out.push((call, held));
            }
        }
        out.sort_by(|a, b| a.0.syscall.cmp(&b.0.syscall));
        out
    }

    /// When the earliest open window ends.
    pub fn next_due(&self) -> Option<Instant> {
        self.windows.values().map(|w| w.ends).min()
    }
}

#[cfg(test)]
#[path = "notifier_tests.rs"]
mod tests;
