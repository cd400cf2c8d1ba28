//! Container stdio. FIFOs and files are handed to the OCI runtime directly, so the container
//! writes straight into the engine's FIFO with no copy in between; the shim keeps a read handle
//! on each output FIFO (a restarting reader never SIGPIPEs the container). Stdin's FIFO is
//! handed over as well: the container sees EOF when the client closes its write side, as with
//! the runc shim. A terminal goes through a console socket: the runtime sends the pty master
//! and the shim copies between it and the FIFOs (there a shim-held writer keeps the copy alive
//! until CloseIO).

use std::fs::{File, OpenOptions};
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::fs::{FileTypeExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use nix::fcntl::{fcntl, FcntlArg, OFlag};
use thiserror::Error;
use tokio::io::unix::AsyncFd;
use tokio::task::JoinHandle;

use crate::reaper::Reaper;
use crate::runtime::ProcessStdio;

pub mod binary;
mod console;

use console::{copy_stdin, PtyStream};
pub use console::{recv_fd, ConsoleSocket};

#[derive(Debug, Error)]
pub enum IoError {
    #[error("open {which} {path:?}: {source}")]
    Open {
        which: &'static str,
        path: String,
        source: std::io::Error,
    },
    #[error("unsupported stdio URI {0:?} (use a FIFO path, file:// or binary://)")]
    Scheme(String),
    #[error("stdio URI {0:?}: the path must be absolute")]
    NotAbsolute(String),
    #[error("console socket {path:?}: {source}")]
    Console { path: PathBuf, source: std::io::Error },
    #[error("resize pty: {0}")]
    Resize(nix::Error),
}

/// The stdio a client asked for, kept verbatim for State (CRI-O rebuilds its IO from it).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct StdioPaths {
    pub stdin: String,
    pub stdout: String,
    pub stderr: String,
    pub terminal: bool,
}

/// A stdio destination named by the engine.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Target {
    None,
    /// A FIFO (or any path) to open directly.
    Path(PathBuf),
    /// `file:///path`: append to a regular file.
    File(PathBuf),
    /// `binary:///path?k=v`: a logging process fed through pipes.
    Binary {
        path: PathBuf,
        args: Vec<(String, String)>,
    },
}

/// Parses one stdio string as containerd and CRI-O send it.
pub fn parse_target(s: &str) -> Result<Target, IoError> {
    if s.is_empty() {
        return Ok(Target::None);
    }
    if let Some(rest) = s.strip_prefix("file://") {
        if !rest.starts_with('/') {
            return Err(IoError::NotAbsolute(s.to_string()));
        }
        return Ok(Target::File(PathBuf::from(rest)));
    }
    if let Some(rest) = s.strip_prefix("binary://") {
        let (path, query) = rest.split_once('?').unwrap_or((rest, ""));
        if !path.starts_with('/') {
            return Err(IoError::NotAbsolute(s.to_string()));
        }
        let args = query
            .split('&')
            .filter(|kv| !kv.is_empty())
            .map(|kv| {
                let (k, v) = kv.split_once('=').unwrap_or((kv, ""));
                (percent_decode(k), percent_decode(v))
            })
            .collect();
        return Ok(Target::Binary {
            path: PathBuf::from(percent_decode(path)),
            args,
        });
    }
    if s.contains("://") && !s.starts_with('/') {
        return Err(IoError::Scheme(s.to_string()));
    }
    Ok(Target::Path(PathBuf::from(s)))
}

fn percent_decode(s: &str) -> String {
    let bytes = s.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'%' && i + 2 < bytes.len() {
            // Bytes, not a str slice: a multi-byte character after '%' must not split.
            let hex = std::str::from_utf8(&bytes[i + 1..i + 3]).ok();
            if let Some(b) = hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
                out.push(b);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

fn is_fifo(path: &Path) -> bool {
    std::fs::metadata(path)
        .map(|m| m.file_type().is_fifo())
        .unwrap_or(false)
}

fn open_err<'a>(which: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> IoError + 'a {
    move |source| IoError::Open {
        which,
        path: path.display().to_string(),
        source,
    }
}

fn set_blocking(fd: RawFd) -> nix::Result<()> {
    let flags = OFlag::from_bits_truncate(fcntl(fd, FcntlArg::F_GETFL)?);
    fcntl(fd, FcntlArg::F_SETFL(flags & !OFlag::O_NONBLOCK)).map(|_| ())
}

/// Opens a FIFO for writing without blocking on a missing reader; returns (writer, keeper).
fn open_output_fifo(which: &'static str, path: &Path) -> Result<(OwnedFd, OwnedFd), IoError> {
    let keep = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(path)
        .map_err(open_err(which, path))?;
    let w = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(path)
        .map_err(open_err(which, path))?;
    Ok((w.into(), keep.into()))
}

fn open_output(which: &'static str, target: &Target) -> Result<(Option<OwnedFd>, Option<OwnedFd>), IoError> {
    match target {
        Target::None => Ok((None, None)),
        Target::Path(p) if is_fifo(p) => {
            let (w, keep) = open_output_fifo(which, p)?;
            Ok((Some(w), Some(keep)))
        }
        // A plain path is the engine's to make (its FIFO, or a file such as /dev/null): gantry
        // never creates directories or files for one, as the Go shim does not.
        Target::Path(p) => {
            let f = OpenOptions::new()
                .append(true)
                .custom_flags(libc::O_CLOEXEC)
                .open(p)
                .map_err(open_err(which, p))?;
            Ok((Some(f.into()), None))
        }
        Target::File(p) => {
            if let Some(dir) = p.parent() {
                std::fs::create_dir_all(dir).map_err(open_err(which, p))?;
            }
            let f = OpenOptions::new()
                .create(true)
                .append(true)
                .custom_flags(libc::O_CLOEXEC)
                .open(p)
                .map_err(open_err(which, p))?;
            Ok((Some(f.into()), None))
        }
        Target::Binary { .. } => Err(IoError::Scheme(format!("{target:?}"))),
    }
}

/// Opens stdin for the container plus the shim's keep-alive write handle.
fn open_stdin(path: &str) -> Result<(Option<OwnedFd>, Option<OwnedFd>), IoError> {
    if path.is_empty() {
        return Ok((None, None));
    }
    let p = Path::new(path);
    let r = OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(p)
        .map_err(open_err("stdin", p))?;
    if !is_fifo(p) {
        return Ok((Some(r.into()), None));
    }
    set_blocking(r.as_raw_fd()).map_err(|e| open_err("stdin", p)(e.into()))?;
    let w = OpenOptions::new()
        .write(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_CLOEXEC)
        .open(p)
        .map_err(open_err("stdin", p))?;
    Ok((Some(r.into()), Some(w.into())))
}

/// What the shim holds for one process's stdio while it lives.
#[derive(Default)]
pub struct ProcessIo {
    keepers: Vec<OwnedFd>,
    stdin_keeper: Mutex<Option<OwnedFd>>,
    console: Mutex<Option<Arc<AsyncFd<OwnedFd>>>>,
    /// The pty → stdout copy: what `drain` waits for.
    output: Mutex<Option<JoinHandle<()>>>,
    /// Input copies (stdin → pty): never waited for, ended only by [`ProcessIo::close`].
    copies: Mutex<Vec<JoinHandle<()>>>,
    /// Where a terminal's output goes when that is a `binary://` logger (its stdout pipe),
    /// until the pty master arrives.
    console_out: Mutex<Option<OwnedFd>>,
    logger: Option<binary::BinaryLogger>,
}

/// Who a process's stdio belongs to (binary loggers are told).
pub struct Owner<'a> {
    pub id: &'a str,
    pub namespace: &'a str,
    pub reaper: &'a Reaper,
}

/// Prepared stdio: what to give the runtime, and what the shim keeps.
pub struct Prepared {
    pub stdio: ProcessStdio,
    pub io: Arc<ProcessIo>,
    pub console: Option<ConsoleSocket>,
}

/// Opens the process's stdio. With a terminal, nothing is opened yet: a console socket is
/// bound in `console_dir` and the copies start once the runtime has sent the pty master.
pub async fn prepare(paths: &StdioPaths, console_dir: &Path, owner: &Owner<'_>) -> Result<Prepared, IoError> {
    if paths.terminal {
        let console = ConsoleSocket::bind(console_dir)?;
        let mut io = ProcessIo::default();
        // A tty has one output stream: the logger's stdout (its stderr pipe is closed here).
        if let Target::Binary { path, args } = parse_target(&paths.stdout)? {
            let (l, out, _err) = binary::spawn(&path, &args, owner.id, owner.namespace, owner.reaper).await?;
            io.logger = Some(l);
            io.console_out = Mutex::new(Some(out));
        }
        return Ok(Prepared {
            stdio: ProcessStdio::default(),
            io: Arc::new(io),
            console: Some(console),
        });
    }
    let mut keepers = Vec::new();
    // No shim-held writer here: the client's close is the container's EOF.
    let (stdin, _) = open_stdin(&paths.stdin)?;
    let stdin_keeper = None;
    let (out_target, err_target) = (parse_target(&paths.stdout)?, parse_target(&paths.stderr)?);
    let mut logger = None;
    let (stdout, stderr) = match (&out_target, &err_target) {
        (Target::Binary { path, args }, _) | (_, Target::Binary { path, args }) => {
            let (l, out, err) = binary::spawn(path, args, owner.id, owner.namespace, owner.reaper).await?;
            logger = Some(l);
            (Some(out), Some(err))
        }
        _ => {
            let (stdout, k) = open_output("stdout", &out_target)?;
            keepers.extend(k);
            let (stderr, k) = open_output("stderr", &err_target)?;
            keepers.extend(k);
            (stdout, stderr)
        }
    };
    Ok(Prepared {
        stdio: ProcessStdio { stdin, stdout, stderr },
        io: Arc::new(ProcessIo {
            keepers,
            stdin_keeper: Mutex::new(stdin_keeper),
            logger,
            ..Default::default()
        }),
        console: None,
    })
}

impl ProcessIo {
    /// CloseIO(stdin): drops the shim's write side so the process sees EOF once the client
    /// closes its own.
    pub fn close_stdin(&self) {
        self.stdin_keeper.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    /// Starts copying between the pty master and the client's FIFOs.
    pub fn attach_console(&self, master: OwnedFd, paths: &StdioPaths) -> Result<(), IoError> {
        nix::fcntl::fcntl(master.as_raw_fd(), FcntlArg::F_SETFL(OFlag::O_NONBLOCK)).map_err(|e| IoError::Console {
            path: PathBuf::new(),
            source: e.into(),
        })?;
        // SAFETY: the OwnedFd stays inside the AsyncFd (always the same open descriptor).
        let master = unsafe { AsyncFd::register(master) }.map_err(|e| IoError::Console {
            path: PathBuf::new(),
            source: e.into_parts().1,
        })?;
        let master = Arc::new(master);
        let mut copies = Vec::new();
        let mut output = None;
        let logger_pipe = self.console_out.lock().unwrap_or_else(|e| e.into_inner()).take();
        if let Some(w) = logger_pipe {
            let mut out =
                tokio::net::unix::pipe::Sender::from_owned_fd(w).map_err(open_err("stdout", Path::new("")))?;
            let mut pty = PtyStream(master.clone());
            output = Some(tokio::spawn(async move {
                let _ = tokio::io::copy(&mut pty, &mut out).await;
            }));
        } else if let Target::Path(p) | Target::File(p) = parse_target(&paths.stdout)? {
            let (w, keep) = if is_fifo(&p) {
                let (w, keep) = open_output_fifo("stdout", &p)?;
                (w, Some(keep))
            } else {
                let (w, _) = open_output("stdout", &Target::File(p.clone()))?;
                (w.ok_or_else(|| IoError::Scheme(paths.stdout.clone()))?, None)
            };
            // The keeper stays with the copy task; the copy ends when the pty hangs up.
            let mut pty = PtyStream(master.clone());
            if keep.is_some() {
                let mut out = tokio::net::unix::pipe::Sender::from_owned_fd(w).map_err(open_err("stdout", &p))?;
                output = Some(tokio::spawn(async move {
                    let _keep = keep;
                    let _ = tokio::io::copy(&mut pty, &mut out).await;
                }));
            } else {
                // A regular file: written directly (page cache), not through tokio::fs, whose
                // every write takes a blocking-pool thread.
                let mut out = File::from(w);
                output = Some(tokio::spawn(async move {
                    use tokio::io::AsyncReadExt;
                    let mut buf = vec![0u8; 16 * 1024];
                    while let Ok(n @ 1..) = pty.read(&mut buf).await {
                        if std::io::Write::write_all(&mut out, &buf[..n]).is_err() {
                            break;
                        }
                    }
                }));
            }
        }
        if !paths.stdin.is_empty() {
            let p = PathBuf::from(&paths.stdin);
            let (r, keeper) = open_stdin(&paths.stdin)?;
            if let Some(r) = r {
                let _ = nix::fcntl::fcntl(r.as_raw_fd(), FcntlArg::F_SETFL(OFlag::O_NONBLOCK));
                let input = tokio::net::unix::pipe::Receiver::from_owned_fd(r).map_err(open_err("stdin", &p))?;
                copies.push(tokio::spawn(copy_stdin(input, PtyStream(master.clone()))));
            }
            *self.stdin_keeper.lock().unwrap_or_else(|e| e.into_inner()) = keeper;
        }
        *self.console.lock().unwrap_or_else(|e| e.into_inner()) = Some(master);
        *self.output.lock().unwrap_or_else(|e| e.into_inner()) = output;
        self.copies.lock().unwrap_or_else(|e| e.into_inner()).extend(copies);
        Ok(())
    }

    pub fn resize(&self, width: u32, height: u32) -> Result<(), IoError> {
        let guard = self.console.lock().unwrap_or_else(|e| e.into_inner());
        let Some(master) = guard.as_ref() else {
            return Ok(());
        };
        let ws = libc::winsize {
            ws_row: height as u16,
            ws_col: width as u16,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        // SAFETY: TIOCSWINSZ reads a winsize struct that outlives the call.
        let rc = unsafe { libc::ioctl(master.get_ref().as_raw_fd(), libc::TIOCSWINSZ, &ws) };
        if rc < 0 {
            return Err(IoError::Resize(nix::Error::last()));
        }
        Ok(())
    }

    pub fn has_console(&self) -> bool {
        self.console.lock().map(|c| c.is_some()).unwrap_or(false)
    }

    /// Waits (bounded) for the terminal output copy to drain after the process exited, so the
    /// client has all output before it learns of the exit. The input copy is left running: it
    /// holds the only read end of the stdin FIFO, and the engine may still write to it
    /// (containerd's CRI forwards the EOF of a `crictl exec -it` whose own stdin ended); closed
    /// here, that write fails with EPIPE, and for a terminal containerd then closes the exec's
    /// stdout stream before reading what the process wrote. False when the bound cut the copy
    /// short (a child left holding the terminal, a client not reading): the caller logs it.
    #[must_use = "a copy cut short loses output; log it"]
    pub async fn drain(&self, timeout: Duration) -> bool {
        let Some(c) = self.output.lock().unwrap_or_else(|e| e.into_inner()).take() else {
            return true;
        };
        let abort = c.abort_handle();
        let done = tokio::time::timeout(timeout, c).await.is_ok();
        if !done {
            abort.abort();
        }
        done
    }

    /// Releases every handle and stops a binary logger (Delete).
    pub async fn shutdown(&self) {
        self.close();
        if let Some(l) = &self.logger {
            l.stop().await;
        }
    }

    /// Releases every handle.
    pub fn close(&self) {
        self.close_stdin();
        self.console.lock().unwrap_or_else(|e| e.into_inner()).take();
        for c in self.copies.lock().unwrap_or_else(|e| e.into_inner()).drain(..) {
            c.abort();
        }
        if let Some(c) = self.output.lock().unwrap_or_else(|e| e.into_inner()).take() {
            c.abort();
        }
        self.console_out.lock().unwrap_or_else(|e| e.into_inner()).take();
    }

    #[doc(hidden)]
    pub fn keeper_count(&self) -> usize {
        self.keepers.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn test_owner(reaper: &Reaper) -> Owner<'_> {
        Owner {
            id: "c",
            namespace: "ns",
            reaper,
        }
    }

    #[test]
    fn targets() {
        assert_eq!(parse_target("").unwrap(), Target::None);
        assert_eq!(
            parse_target("/run/x/stdout").unwrap(),
            Target::Path("/run/x/stdout".into())
        );
        assert_eq!(
            parse_target("file:///var/log/c.log").unwrap(),
            Target::File("/var/log/c.log".into())
        );
        assert_eq!(
            parse_target("binary:///usr/bin/logger?id=a%20b&x").unwrap(),
            Target::Binary {
                path: "/usr/bin/logger".into(),
                args: vec![("id".into(), "a b".into()), ("x".into(), String::new())]
            }
        );
        assert!(parse_target("tcp://1.2.3.4").is_err());
        assert!(matches!(
            parse_target("file://relative/log"),
            Err(IoError::NotAbsolute(_))
        ));
        assert!(matches!(
            parse_target("binary://logger?x=1"),
            Err(IoError::NotAbsolute(_))
        ));
        // Non-ASCII after '%' decodes without splitting a character (this panicked).
        assert_eq!(
            parse_target("binary:///bin/l?k=%é%41").unwrap(),
            Target::Binary {
                path: "/bin/l".into(),
                args: vec![("k".into(), "%éA".into())]
            }
        );
    }

    /// Sends `fd` over a unix socket connected to `path` with raw calls only (it also runs
    /// between fork and exec).
    fn send_fd_raw(addr: &libc::sockaddr_un, fd: RawFd) -> std::io::Result<()> {
        // SAFETY: raw syscalls on buffers owned by this frame.
        unsafe {
            let s = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
            if libc::connect(s, (addr as *const libc::sockaddr_un).cast(), len) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            let mut byte = [b'x'];
            let mut iov = libc::iovec {
                iov_base: byte.as_mut_ptr().cast(),
                iov_len: 1,
            };
            let mut space = [0u64; 8];
            let mut msg: libc::msghdr = std::mem::zeroed();
            msg.msg_iov = &mut iov;
            msg.msg_iovlen = 1;
            msg.msg_control = space.as_mut_ptr().cast();
            msg.msg_controllen = libc::CMSG_SPACE(4) as _;
            let c = libc::CMSG_FIRSTHDR(&msg);
            (*c).cmsg_level = libc::SOL_SOCKET;
            (*c).cmsg_type = libc::SCM_RIGHTS;
            (*c).cmsg_len = libc::CMSG_LEN(4) as _;
            *(libc::CMSG_DATA(c) as *mut i32) = fd;
            if libc::sendmsg(s, &msg, libc::MSG_NOSIGNAL) < 0 {
                return Err(std::io::Error::last_os_error());
            }
        }
        Ok(())
    }

    #[test]
    fn console_socket_is_private_and_takes_the_master_only_from_a_child() {
        use std::os::unix::ffi::OsStrExt;
        use std::os::unix::fs::{MetadataExt, PermissionsExt};
        use std::os::unix::process::CommandExt;
        let _g = crate::sys::test_children_lock();
        let dir = tempfile::tempdir().unwrap();
        let sockets = dir.path().join("s");
        std::fs::create_dir(&sockets).unwrap();
        std::fs::set_permissions(&sockets, std::fs::Permissions::from_mode(0o777)).unwrap();
        let old = nix::sys::stat::umask(nix::sys::stat::Mode::empty());
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .unwrap();
        let console = rt.block_on(async { ConsoleSocket::bind(&sockets) });
        nix::sys::stat::umask(old);
        let console = console.unwrap();
        assert_eq!(std::fs::metadata(&console.path).unwrap().mode() & 0o777, 0o600);
        assert_eq!(std::fs::metadata(&sockets).unwrap().mode() & 0o777, 0o700);

        // SAFETY: sockaddr_un is plain data.
        let mut addr: libc::sockaddr_un = unsafe { std::mem::zeroed() };
        addr.sun_family = libc::AF_UNIX as libc::sa_family_t;
        for (i, b) in console.path.as_os_str().as_bytes().iter().enumerate() {
            addr.sun_path[i] = *b as libc::c_char;
        }
        // The daemon itself is not the runtime: a pipe sent from here is refused.
        let (pipe_r, _pipe_w) = nix::unistd::pipe().unwrap();
        send_fd_raw(&addr, pipe_r.as_raw_fd()).unwrap();
        // A runtime the daemon started sends its stdin, /dev/null, and is gone (reaped) before
        // the daemon handles the connection.
        let mut cmd = std::process::Command::new("/bin/true");
        cmd.stdin(std::process::Stdio::null());
        // SAFETY: only raw, async-signal-safe calls between fork and exec.
        unsafe { cmd.pre_exec(move || send_fd_raw(&addr, 0)) };
        let mut child = cmd.spawn().unwrap();
        crate::peer::note_runtime(child.id() as i32);
        assert!(child.wait().unwrap().success());
        let got = rt
            .block_on(async { tokio::time::timeout(Duration::from_secs(10), console.receive()).await })
            .unwrap()
            .unwrap();
        let st = nix::sys::stat::fstat(got.as_raw_fd()).unwrap();
        let null = nix::sys::stat::stat("/dev/null").unwrap();
        assert_eq!(
            st.st_rdev, null.st_rdev,
            "the master came from the child, not the daemon"
        );
    }

    #[tokio::test]
    async fn fifo_output_does_not_block_without_reader_and_keeps_reader() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("out");
        nix::unistd::mkfifo(&p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let paths = StdioPaths {
            stdout: p.display().to_string(),
            ..Default::default()
        };
        let reaper = Reaper::default();
        let prep = prepare(&paths, dir.path(), &test_owner(&reaper)).await.unwrap();
        assert!(prep.stdio.stdout.is_some());
        assert_eq!(prep.io.keeper_count(), 1);
        // Writing works with no external reader: the shim's keeper absorbs SIGPIPE risk.
        let mut w = File::from(prep.stdio.stdout.unwrap());
        std::io::Write::write_all(&mut w, b"hello").unwrap();
    }

    /// Reproduces the lost output of `crictl exec -it CT tty < /dev/null`: after the process
    /// exited and its output drained, the engine still writes the client's EOF to stdin. That
    /// write must succeed (an EPIPE there makes containerd close the exec's stdout) and the
    /// output must all be in the stdout FIFO; only Delete's `close` lets go of stdin.
    #[tokio::test]
    async fn stdin_stays_writable_after_a_tty_process_exited_until_close() {
        let dir = tempfile::tempdir().unwrap();
        let (stdin, stdout) = (dir.path().join("in"), dir.path().join("out"));
        for p in [&stdin, &stdout] {
            nix::unistd::mkfifo(p, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        }
        let paths = StdioPaths {
            stdin: stdin.display().to_string(),
            stdout: stdout.display().to_string(),
            terminal: true,
            ..Default::default()
        };
        let nonblocking = |p: &Path, write: bool| {
            OpenOptions::new()
                .read(!write)
                .write(write)
                .custom_flags(libc::O_NONBLOCK)
                .open(p)
                .unwrap()
        };
        let mut client_out = nonblocking(&stdout, false);
        let pty = nix::pty::openpty(None, None).unwrap();
        let io = ProcessIo::default();
        io.attach_console(pty.master, &paths).unwrap();
        let mut client_in = nonblocking(&stdin, true);
        let mut slave = File::from(pty.slave);
        std::io::Write::write_all(&mut slave, b"/dev/pts/0\n").unwrap();
        drop(slave);
        assert!(io.drain(Duration::from_secs(30)).await);

        let mut got = Vec::new();
        let _ = std::io::Read::read_to_end(&mut client_out, &mut got);
        assert!(String::from_utf8_lossy(&got).contains("/dev/pts/0"), "{got:?}");
        std::io::Write::write_all(&mut client_in, b"\x04").expect("the engine's write after the exit");
        tokio::task::yield_now().await;
        io.close();
        // The copy task ends once aborted; then the FIFO has no reader left.
        let mut closed = false;
        for _ in 0..1000 {
            tokio::task::yield_now().await;
            if let Err(e) = std::io::Write::write_all(&mut client_in, b"x") {
                assert_eq!(e.raw_os_error(), Some(libc::EPIPE), "{e}");
                closed = true;
                break;
            }
        }
        assert!(closed, "close released the stdin FIFO");
    }

    #[tokio::test(start_paused = true)]
    async fn a_tty_with_stdin_and_no_stdout_drains_at_once() {
        let dir = tempfile::tempdir().unwrap();
        let stdin = dir.path().join("in");
        nix::unistd::mkfifo(&stdin, nix::sys::stat::Mode::from_bits_truncate(0o600)).unwrap();
        let paths = StdioPaths {
            stdin: stdin.display().to_string(),
            terminal: true,
            ..Default::default()
        };
        let pty = nix::pty::openpty(None, None).unwrap();
        let io = ProcessIo::default();
        io.attach_console(pty.master, &paths).unwrap();
        drop(pty.slave);
        // On the paused clock: waiting for the stdin copy would advance it to the timeout.
        let t0 = tokio::time::Instant::now();
        assert!(io.drain(Duration::from_secs(5)).await);
        assert_eq!(t0.elapsed(), Duration::ZERO, "drain waited for the stdin copy");
    }

    #[tokio::test]
    async fn a_tty_with_binary_stdout_reaches_the_logger() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let got = dir.path().join("got");
        let logger = dir.path().join("logger");
        let body = format!("#!/bin/sh\nexec 5>&-\ncat <&3 > {}\n", got.display());
        std::fs::write(&logger, body).unwrap();
        std::fs::set_permissions(&logger, std::fs::Permissions::from_mode(0o755)).unwrap();
        let paths = StdioPaths {
            stdout: format!("binary://{}", logger.display()),
            terminal: true,
            ..Default::default()
        };
        let reaper = Reaper::default();
        let prep = prepare(&paths, dir.path(), &test_owner(&reaper)).await.unwrap();
        let pty = nix::pty::openpty(None, None).unwrap();
        prep.io.attach_console(pty.master, &paths).unwrap();
        let mut slave = File::from(pty.slave);
        std::io::Write::write_all(&mut slave, b"hello from the tty\n").unwrap();
        drop(slave);
        assert!(prep.io.drain(Duration::from_secs(5)).await);
        let mut text = String::new();
        for _ in 0..100 {
            text = std::fs::read_to_string(&got).unwrap_or_default();
            if text.contains("hello from the tty") {
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(text.contains("hello from the tty"), "the logger got {text:?}");
    }

    #[tokio::test]
    async fn a_tty_with_file_stdout_reaches_the_file() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("tty.log");
        let paths = StdioPaths {
            stdout: format!("file://{}", log.display()),
            terminal: true,
            ..Default::default()
        };
        let pty = nix::pty::openpty(None, None).unwrap();
        let io = ProcessIo::default();
        io.attach_console(pty.master, &paths).unwrap();
        let mut slave = File::from(pty.slave);
        std::io::Write::write_all(&mut slave, b"to the file\n").unwrap();
        drop(slave);
        assert!(io.drain(Duration::from_secs(5)).await);
        let text = std::fs::read_to_string(&log).unwrap();
        assert!(text.contains("to the file"), "{text:?}");
    }
}
