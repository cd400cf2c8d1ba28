//! The console: the socket on which the OCI runtime hands over a pty master
//! (`--console-socket`), and the pty master as an async stream for the copies in
//! [`super::ProcessIo`].

use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::path::{Path, PathBuf};
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::task::{Context, Poll};

use tokio::io::unix::AsyncFd;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::IoError;

/// Copies the client's stdin FIFO into the pty until the FIFO ends (its last writer, the
/// shim's own keeper included, closed it) or [`ProcessIo::close`] aborts the copy. Once the
/// pty refuses writes (the process is gone) input is read and dropped, so the engine's writes
/// never fail while the exec is still being collected (see [`ProcessIo::drain`]).
pub(super) async fn copy_stdin(mut input: tokio::net::unix::pipe::Receiver, mut pty: PtyStream) {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut buf = vec![0u8; 4096];
    let mut pty_open = true;
    while let Ok(n @ 1..) = input.read(&mut buf).await {
        if pty_open && pty.write_all(&buf[..n]).await.is_err() {
            pty_open = false;
        }
    }
}

/// A pty master as an async byte stream. EIO after the slave side closes reads as EOF.
pub(super) struct PtyStream(pub(super) Arc<AsyncFd<OwnedFd>>);

impl AsyncRead for PtyStream {
    fn poll_read(self: Pin<&mut Self>, cx: &mut Context<'_>, buf: &mut ReadBuf<'_>) -> Poll<std::io::Result<()>> {
        loop {
            let mut guard = match self.0.poll_read_ready(cx) {
                Poll::Ready(Ok(g)) => g,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            };
            let unfilled = buf.initialize_unfilled();
            match guard.try_io(|fd| nix::unistd::read(fd.as_raw_fd(), unfilled).map_err(std::io::Error::from)) {
                Ok(Ok(n)) => {
                    buf.advance(n);
                    return Poll::Ready(Ok(()));
                }
                Ok(Err(e)) if e.raw_os_error() == Some(libc::EIO) => return Poll::Ready(Ok(())),
                Ok(Err(e)) => return Poll::Ready(Err(e)),
                Err(_would_block) => continue,
            }
        }
    }
}

impl AsyncWrite for PtyStream {
    fn poll_write(self: Pin<&mut Self>, cx: &mut Context<'_>, data: &[u8]) -> Poll<std::io::Result<usize>> {
        loop {
            let mut guard = match self.0.poll_write_ready(cx) {
                Poll::Ready(Ok(g)) => g,
                Poll::Ready(Err(e)) => return Poll::Ready(Err(e)),
                Poll::Pending => return Poll::Pending,
            };
            match guard.try_io(|fd| nix::unistd::write(fd.get_ref(), data).map_err(std::io::Error::from)) {
                Ok(r) => return Poll::Ready(r),
                Err(_would_block) => continue,
            }
        }
    }
    fn poll_flush(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
    fn poll_shutdown(self: Pin<&mut Self>, _: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Poll::Ready(Ok(()))
    }
}

/// A unix socket on which the OCI runtime sends the pty master (`--console-socket`).
pub struct ConsoleSocket {
    pub path: PathBuf,
    listener: tokio::net::UnixListener,
}

static CONSOLE_SEQ: AtomicU64 = AtomicU64::new(0);

impl ConsoleSocket {
    /// Binds `dir/pty-<pid>-<n>` with mode 0600 (`dir` is the daemon's private socket
    /// directory), whatever umask the engine gave the daemon.
    pub(super) fn bind(dir: &Path) -> Result<Self, IoError> {
        let n = CONSOLE_SEQ.fetch_add(1, Ordering::Relaxed);
        let path = dir.join(format!("pty-{}-{n}", std::process::id()));
        let err = |source| IoError::Console {
            path: path.clone(),
            source,
        };
        crate::files::private_dir(dir).map_err(err)?;
        let _ = std::fs::remove_file(&path);
        // Not through the umask: it is process-wide, and the daemon has helper threads. The
        // socket sits in a 0700 directory, so the moment before the chmod exposes nothing.
        let listener = tokio::net::UnixListener::bind(&path).map_err(err)?;
        use std::os::unix::fs::PermissionsExt;
        if let Err(e) = std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o600)) {
            let _ = std::fs::remove_file(&path);
            return Err(err(e));
        }
        Ok(Self { path, listener })
    }

    /// Receives the master fd; call concurrently with the runtime's create/exec. Only an OCI
    /// runtime process this daemon started (or a wrapper's child), running as the daemon's
    /// user, may hand it in; anyone else's connection is closed and the wait goes on.
    pub async fn receive(&self) -> Result<OwnedFd, IoError> {
        let err = |source| IoError::Console {
            path: self.path.clone(),
            source,
        };
        loop {
            let (stream, _) = self.listener.accept().await.map_err(err)?;
            match crate::peer::peer_of(&stream) {
                Ok(p) if crate::peer::same_user(&p) && crate::peer::started_by_runtime(p.pid) => {}
                Ok(p) => {
                    log::warn!(
                        "console socket {}: refused a connection from pid {} (uid {}): not the OCI runtime",
                        self.path.display(),
                        p.pid,
                        p.uid
                    );
                    continue;
                }
                Err(_) => continue,
            }
            loop {
                stream.readable().await.map_err(err)?;
                match stream.try_io(tokio::io::Interest::READABLE, || recv_fd(stream.as_raw_fd())) {
                    Ok(fd) => return Ok(fd),
                    Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => continue,
                    Err(e) => return Err(err(e)),
                }
            }
        }
    }
}

impl Drop for ConsoleSocket {
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

pub fn recv_fd(sock: RawFd) -> std::io::Result<OwnedFd> {
    use nix::sys::socket::{recvmsg, ControlMessageOwned, MsgFlags};
    use std::os::fd::FromRawFd;
    let mut buf = [0u8; 4096];
    let mut iov = [std::io::IoSliceMut::new(&mut buf)];
    let mut cmsg = nix::cmsg_space!([RawFd; 1]);
    let msg = recvmsg::<()>(sock, &mut iov, Some(&mut cmsg), MsgFlags::MSG_CMSG_CLOEXEC)?;
    // SAFETY: the kernel just installed these descriptors for us; we own each of them. Extra
    // ones (a runtime sends one) are closed rather than leaked.
    let mut fds = msg
        .cmsgs()?
        .filter_map(|c| match c {
            ControlMessageOwned::ScmRights(fds) => Some(fds),
            _ => None,
        })
        .flatten()
        .map(|fd| unsafe { OwnedFd::from_raw_fd(fd) })
        .collect::<Vec<_>>();
    if !fds.is_empty() {
        return Ok(fds.swap_remove(0));
    }
    Err(std::io::Error::new(
        std::io::ErrorKind::InvalidData,
        "console socket message carried no file descriptor",
    ))
}
