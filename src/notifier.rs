//! The daemon's side of watched syscalls ([`crate::security::notify`]): a socket bound before
//! the runtime's `create`, to which the runtime sends the container's seccomp notification fd
//! once its filter is loaded; then each notification answered on the event loop.
//!
//! Nothing here blocks the reactor: a notification is received only after `poll` says one is
//! pending, and the kernel counts a pending notification until it is received, so the receive
//! returns at once (ENOENT when its caller died in between). When every task under the filter
//! has exited, the fd hangs up and the task ends. If the daemon dies, the kernel fails the
//! container's pending and later watched calls with ENOSYS; nothing can attach again.

use std::collections::{BTreeSet, HashMap};
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
use crate::security::record::{self, Recording};
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

/// What the container's filters report to, shared by the fds of init and its execs.
struct Shared {
    ctx: Context,
    recorder: Option<Recorder>,
}

/// The serving task; aborted (and the socket removed) when dropped.
pub struct Notifier {
    task: JoinHandle<()>,
    shared: Arc<Shared>,
}

impl Drop for Notifier {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl Notifier {
    /// Saves what the container's recording has seen since the last save (nothing without a
    /// recording). Delete calls it: the daemon may exit right after.
    pub async fn finish(&self) {
        if let Some(r) = &self.shared.recorder {
            r.save(&self.shared.ctx).await;
        }
    }
}

/// Starts serving `listener` for `ctx`'s container: init's filter fd from the runtime's
/// `create`, then one per exec (the runtime loads the profile, listener included, for each).
pub fn spawn(listener: Listener, ctx: Context) -> Notifier {
    let recorder = ctx.watch.record.clone().map(Recorder::new);
    let shared = Arc::new(Shared { ctx, recorder });
    let task = tokio::spawn(accept_all(listener, shared.clone()));
    Notifier { task, shared }
}

/// Accepts every connection for the container's life; each is served by its own task, all of
/// them aborted with this one.
async fn accept_all(listener: Listener, shared: Arc<Shared>) {
    let mut serving = tokio::task::JoinSet::new();
    let mut init = true;
    loop {
        tokio::select! {
            conn = listener.listener.accept() => {
                let stream = match conn {
                    Ok((stream, _)) => stream,
                    Err(e) => {
                        warn!(shared.ctx.log, "seccomp listener: accept failed; no more notification fds"; "error" => %e);
                        break;
                    }
                };
                let shared = shared.clone();
                serving.spawn(async move {
                    let log = shared.ctx.log.clone();
                    match receive(&stream).await {
                        Ok(fd) => {
                            let (served, _) = tokio::join!(serve(fd, &shared, init), drain(stream));
                            if let Err(e) = served {
                                warn!(log, "seccomp notifications: stopped"; "error" => %e);
                            }
                        }
                        Err(e) => warn!(log, "seccomp listener: no notification fd"; "error" => %e),
                    }
                });
                init = false;
            }
            Some(_) = serving.join_next() => {}
        }
    }
    while serving.join_next().await.is_some() {}
}

/// Checks the peer of one connection and returns the fd it sent.
async fn receive(stream: &tokio::net::UnixStream) -> Result<OwnedFd, NotifierError> {
    let peer = crate::peer::peer_of(stream)?;
    if !crate::peer::same_user(&peer) {
        return Err(NotifierError::Peer(peer.uid));
    }
    loop {
        stream.readable().await?;
        match stream.try_io(Interest::READABLE, || crate::io::recv_fd(stream.as_raw_fd())) {
            Ok(fd) => return Ok(fd),
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

/// Reads the rest of the runtime's message (the container's state as JSON) to its end and
/// drops it: closing early would fail the runtime's write. Alongside serving, never before it:
/// runc 1.1 keeps an exec's connection open until that exec's init, which may already be
/// waiting on a notification, has gone on.
async fn drain(mut stream: tokio::net::UnixStream) {
    let mut rest = [0u8; 4096];
    while matches!(stream.read(&mut rest).await, Ok(n) if n > 0) {}
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

/// Serves one filter's fd until every task under it has exited; `init`'s end saves the
/// recording (the container has exited).
async fn serve(fd: OwnedFd, shared: &Shared, init: bool) -> Result<(), NotifierError> {
    let ctx = &shared.ctx;
    info!(ctx.log, "seccomp notifications: serving"; "watch" => ctx.watch.describe(), "init" => init);
    // SAFETY: the AsyncFd owns the fd; it is neither closed nor duplicated while registered.
    let fd =
        unsafe { AsyncFd::register_with_interest(fd, Interest::READABLE) }.map_err(|e| NotifierError::Io(e.into()))?;
    let mut reports = Reports::default();
    loop {
        let flush = reports.next_due();
        let mut guard = tokio::select! {
            g = fd.readable() => g?,
            () = sleep_until(flush) => {
                report(ctx, reports.due(Instant::now()));
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
        if let Some(call) = answer(raw, &req, shared) {
            let first = reports.record(call, Instant::now());
            report(ctx, first);
        }
    }
    report(ctx, reports.due(Instant::now() + REPORT_WINDOW));
    info!(ctx.log, "seccomp notifications: every process under the filter has exited"; "init" => init);
    if let (true, Some(r)) = (init, &shared.recorder) {
        r.save(ctx).await;
    }
    Ok(())
}

async fn sleep_until(at: Option<Instant>) {
    match at {
        Some(at) => tokio::time::sleep_until(at).await,
        None => std::future::pending().await,
    }
}

/// Answers one notification as the watch says (a call a recording does not watch continues,
/// noted); the watched call, for the report, unless its caller was already gone
/// (`SECCOMP_IOCTL_NOTIF_ID_VALID` is checked before anything acts on its pid).
fn answer(fd: i32, req: &ScmpNotifReq, shared: &Shared) -> Option<Call> {
    notify_id_valid(fd, req.id).ok()?;
    let ctx = &shared.ctx;
    let syscall = req
        .data
        .syscall
        .get_name_by_arch(req.data.arch)
        .unwrap_or_else(|_| format!("nr{}", i32::from(req.data.syscall)));
    if let Some(recorder) = &shared.recorder {
        if !ctx.watch.syscalls.contains(&syscall) {
            let _ = ScmpNotifResp::new_continue(req.id, ScmpNotifRespFlags::empty()).respond(fd);
            recorder.note(syscall);
            return None;
        }
    }
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

/// A container's recording: the names its filters let through, saved when init's filter hangs
/// up and again at Delete if execs added any.
struct Recorder {
    rec: Recording,
    names: std::sync::Mutex<BTreeSet<String>>,
    calls: AtomicU64,
    /// How many names the last save held; `None` before the first.
    saved: tokio::sync::Mutex<Option<usize>>,
}

impl Recorder {
    fn new(rec: Recording) -> Self {
        Self {
            rec,
            names: Default::default(),
            calls: AtomicU64::new(0),
            saved: Default::default(),
        }
    }

    fn note(&self, syscall: String) {
        self.calls.fetch_add(1, Ordering::Relaxed);
        if let Ok(mut names) = self.names.lock() {
            names.insert(syscall);
        }
    }

    /// Merges the names into the profile file, off the reactor; one save at a time.
    async fn save(&self, ctx: &Context) {
        let mut saved = self.saved.lock().await;
        let names = self.names.lock().map(|n| n.clone()).unwrap_or_default();
        if *saved == Some(names.len()) {
            return;
        }
        let (rec, seen) = (self.rec.clone(), names.len());
        let calls = self.calls.load(Ordering::Relaxed);
        match tokio::task::spawn_blocking(move || record::save(&rec, &names)).await {
            Ok(Ok(s)) => {
                info!(ctx.log, "seccomp profile recorded"; "profile" => s.path.display().to_string(),
                    "allowed" => s.allowed, "added" => s.added, "observed" => seen, "calls" => calls);
                ctx.telemetry.seccomp_profile(&ctx.id, &ctx.pod, &self.rec.name, &s);
                *saved = Some(seen);
            }
            Ok(Err(e)) => warn!(ctx.log, "seccomp profile not recorded"; "error" => %e),
            Err(e) => warn!(ctx.log, "seccomp profile not recorded"; "error" => %e),
        }
    }
}

#[cfg(test)]
#[path = "notifier_tests.rs"]
mod tests;
