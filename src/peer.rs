//! Who may talk to the daemon. Its ttrpc socket serves only peers of the daemon's own user
//! and group (as containerd's Go shim, through ttrpc's same-user handshake), whatever the
//! socket's mode; a console socket takes a pty master only from an OCI runtime process the
//! daemon started. The listener also bounds live connections and gives memory back to the
//! system after a burst of them.

use std::collections::VecDeque;
use std::io;
use std::os::fd::AsFd;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use slog::{warn, Logger};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{UnixListener, UnixStream};

/// Live connections one daemon serves at most; further ones are closed at once. CRI-O holds
/// one per container and containerd one per daemon, so a pod never comes near it.
pub const MAX_CONNECTIONS: usize = 1024;
/// A burst of at least this many live connections that has halved triggers a heap trim.
const TRIM_AFTER: usize = 32;

/// The credentials the kernel recorded when the peer connected.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Peer {
    pub pid: i32,
    pub uid: u32,
    pub gid: u32,
}

pub fn peer_of(sock: &impl AsFd) -> io::Result<Peer> {
    let c = nix::sys::socket::getsockopt(sock, nix::sys::socket::sockopt::PeerCredentials)?;
    Ok(Peer {
        pid: c.pid(),
        uid: c.uid(),
        gid: c.gid(),
    })
}

/// True when the peer runs as this process's effective user and group.
pub fn same_user(p: &Peer) -> bool {
    p.uid == nix::unistd::geteuid().as_raw() && p.gid == nix::unistd::getegid().as_raw()
}

/// Runtime processes remembered for console sockets; more than ever run at once in a pod.
const REMEMBERED_RUNTIMES: usize = 64;
static RUNTIMES: Mutex<VecDeque<i32>> = Mutex::new(VecDeque::new());

/// Records an OCI runtime process this daemon just spawned (before anything awaits), so its
/// console-socket connection is recognised even if it exited before the accept was handled.
pub fn note_runtime(pid: i32) {
    let mut r = RUNTIMES.lock().unwrap_or_else(|e| e.into_inner());
    if r.len() == REMEMBERED_RUNTIMES {
        r.pop_front();
    }
    r.push_back(pid);
}

/// True when `pid` is a runtime process this daemon started, or a live descendant of one (a
/// runtime behind a wrapper that forks).
pub fn started_by_runtime(pid: i32) -> bool {
    let noted: Vec<i32> = RUNTIMES
        .lock()
        .unwrap_or_else(|e| e.into_inner())
        .iter()
        .copied()
        .collect();
    noted.iter().any(|r| descends_from(pid, *r))
}

/// True when `pid` is `ancestor` or one of its descendants (walking `/proc/<pid>/stat`).
pub fn descends_from(pid: i32, ancestor: i32) -> bool {
    let mut cur = pid;
    for _ in 0..64 {
        if cur == ancestor {
            return true;
        }
        if cur <= 1 {
            return false;
        }
        match parent_of(cur) {
            Some(p) => cur = p,
            None => return false,
        }
    }
    false
}

fn parent_of(pid: i32) -> Option<i32> {
    crate::proc::Stat::of(&pid.to_string()).ok()?.ppid()
}

/// Counts live connections and trims the heap when a burst is over.
#[derive(Debug, Default)]
struct Gauge {
    live: AtomicUsize,
    peak: AtomicUsize,
    /// Woken whenever a connection ends.
    closed: tokio::sync::Notify,
    /// Reads that brought bytes, on any connection: a request arriving moves it.
    reads: AtomicU64,
}

/// The daemon's live connections, as the service sees them: whether any engine is still
/// connected.
#[derive(Debug, Clone, Default)]
pub struct Connections(Arc<Gauge>);

impl Connections {
    pub fn live(&self) -> usize {
        self.0.live.load(Ordering::SeqCst)
    }

    /// Returns once no connection is open.
    pub async fn none(&self) {
        loop {
            let closed = self.0.closed.notified();
            tokio::pin!(closed);
            closed.as_mut().enable();
            if self.live() == 0 {
                return;
            }
            closed.await;
        }
    }

    /// Returns once no byte has arrived on any connection for a whole `span` (or none is
    /// open). Why: after the last Shutdown an engine may keep its connection open (CRI-O
    /// never closes it), so a hang-up is no signal; requests it sent together with the
    /// Shutdown arrive within moments of it, and closing a connection with a request unread
    /// resets it, the reply lost.
    pub async fn quiet_for(&self, span: std::time::Duration) {
        loop {
            let before = self.0.reads.load(Ordering::SeqCst);
            if self.live() == 0 {
                return;
            }
            tokio::time::sleep(span).await;
            if self.0.reads.load(Ordering::SeqCst) == before {
                return;
            }
        }
    }
}

impl Gauge {
    fn open(&self) -> bool {
        let live = self.live.fetch_add(1, Ordering::SeqCst) + 1;
        self.peak.fetch_max(live, Ordering::SeqCst);
        if live > MAX_CONNECTIONS {
            self.close();
            return false;
        }
        true
    }

    fn close(&self) {
        let live = self.live.fetch_sub(1, Ordering::SeqCst).saturating_sub(1);
        self.closed.notify_waiters();
        let peak = self.peak.load(Ordering::SeqCst);
        if peak >= TRIM_AFTER && live <= peak / 2 {
            self.peak.store(live, Ordering::SeqCst);
            // Connection buffers freed by the burst stay in glibc's heap otherwise: a daemon
            // that once served 1,500 connections would keep ~10 MiB for the rest of its life.
            // SAFETY: malloc_trim only releases free heap memory.
            #[cfg(target_env = "gnu")]
            unsafe {
                libc::malloc_trim(0);
            }
        }
    }
}

/// The daemon's accepted connections, filtered by peer credentials; a ttrpc `Listener` source.
pub struct SameUserListener {
    inner: UnixListener,
    gauge: Arc<Gauge>,
    log: Logger,
}

impl SameUserListener {
    pub fn new(inner: UnixListener, log: Logger) -> Self {
        Self {
            inner,
            gauge: Arc::default(),
            log,
        }
    }

    /// Live connections (for tests and metrics).
    pub fn live(&self) -> usize {
        self.gauge.live.load(Ordering::SeqCst)
    }

    /// A handle on the live connections that outlives the listener's move into the server.
    pub fn connections(&self) -> Connections {
        Connections(self.gauge.clone())
    }
}

impl futures_core::Stream for SameUserListener {
    type Item = io::Result<Connection>;

    fn poll_next(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Option<Self::Item>> {
        let this = self.get_mut();
        loop {
            let stream = match this.inner.poll_accept(cx) {
                Poll::Ready(Ok((s, _))) => s,
                Poll::Ready(Err(e)) => return Poll::Ready(Some(Err(e))),
                Poll::Pending => return Poll::Pending,
            };
            match peer_of(&stream) {
                Ok(p) if same_user(&p) => {}
                Ok(p) => {
                    warn!(this.log, "refused connection from another user"; "peer_pid" => p.pid, "peer_uid" => p.uid, "peer_gid" => p.gid);
                    continue;
                }
                Err(e) => {
                    warn!(this.log, "refused connection without credentials"; "error" => %e);
                    continue;
                }
            }
            if !this.gauge.open() {
                warn!(this.log, "refused connection: too many"; "limit" => MAX_CONNECTIONS);
                continue;
            }
            return Poll::Ready(Some(Ok(Connection {
                stream,
                gauge: this.gauge.clone(),
            })));
        }
    }
}

/// One accepted connection; counted until dropped.
pub struct Connection {
    stream: UnixStream,
    gauge: Arc<Gauge>,
}

impl Drop for Connection {
    fn drop(&mut self) {
        self.gauge.close();
    }
}

impl AsyncRead for Connection {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let filled = buf.filled().len();
        let polled = Pin::new(&mut this.stream).poll_read(cx, buf);
        if buf.filled().len() > filled {
            this.gauge.reads.fetch_add(1, Ordering::SeqCst);
        }
        polled
    }
}

impl AsyncWrite for Connection {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<io::Result<usize>> {
        Pin::new(&mut self.get_mut().stream).poll_write(cx, data)
    }
    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_flush(cx)
    }
    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().stream).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn descendants_are_found_through_proc() {
        let me = std::process::id() as i32;
        assert!(descends_from(me, me));
        assert!(descends_from(me, 1), "everything descends from init");
        let _g = crate::sys::test_children_lock();
        let mut child = std::process::Command::new("sleep").arg("5").spawn().unwrap();
        let pid = child.id() as i32;
        assert!(descends_from(pid, me));
        assert!(!descends_from(me, pid));
        child.kill().unwrap();
        child.wait().unwrap();
    }

    #[test]
    fn runtimes_are_remembered_and_bounded() {
        // Not while the console-socket test relies on the pid it noted.
        let _g = crate::sys::test_children_lock();
        note_runtime(-7);
        assert!(started_by_runtime(-7), "an exited runtime is still recognised");
        assert!(
            !started_by_runtime(std::process::id() as i32),
            "the daemon is not a runtime"
        );
        for i in 0..REMEMBERED_RUNTIMES as i32 {
            note_runtime(-100 - i);
        }
        assert!(!started_by_runtime(-7), "the oldest one was forgotten");
    }

    /// Quiet means a whole span with no byte read: a read inside the span starts it over.
    #[tokio::test(start_paused = true)]
    async fn quiet_waits_a_whole_span_without_reads() {
        let span = std::time::Duration::from_millis(100);
        let gauge = Arc::new(Gauge::default());
        let connections = Connections(gauge.clone());
        assert!(gauge.open());
        let started = tokio::time::Instant::now();
        let quiet = tokio::spawn({
            let c = connections.clone();
            async move { c.quiet_for(span).await }
        });
        tokio::time::sleep(std::time::Duration::from_millis(50)).await;
        gauge.reads.fetch_add(1, Ordering::SeqCst);
        quiet.await.unwrap();
        assert_eq!(started.elapsed(), std::time::Duration::from_millis(200));
        // No connection: nothing to wait for.
        gauge.close();
        let started = tokio::time::Instant::now();
        connections.quiet_for(span).await;
        assert_eq!(started.elapsed(), std::time::Duration::ZERO);
    }

    #[test]
    fn gauge_bounds_and_counts() {
        let g = Gauge::default();
        for _ in 0..MAX_CONNECTIONS {
            assert!(g.open());
        }
        assert!(!g.open(), "one past the limit is refused");
        assert_eq!(g.live.load(Ordering::SeqCst), MAX_CONNECTIONS);
        for _ in 0..MAX_CONNECTIONS {
            g.close();
        }
        assert_eq!(g.live.load(Ordering::SeqCst), 0);
        assert!(
            g.peak.load(Ordering::SeqCst) < TRIM_AFTER,
            "the burst was trimmed and forgotten"
        );
    }

    #[tokio::test]
    async fn same_user_peers_are_served() {
        use futures_core::Stream;
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("sock");
        let listener = SameUserListener::new(UnixListener::bind(&path).unwrap(), crate::logging::discard());
        let _client = UnixStream::connect(&path).await.unwrap();
        let mut listener = Box::pin(listener);
        let conn = std::future::poll_fn(|cx| listener.as_mut().poll_next(cx)).await;
        let conn = conn.unwrap().unwrap();
        assert_eq!(listener.live(), 1);
        drop(conn);
        assert_eq!(listener.live(), 0);
    }
}
