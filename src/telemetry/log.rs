//! The node's event log: one JSON line per event, appended by every daemon of the node to one
//! file, rotated by size without losing or splitting a line.
//!
//! - No interleaving: the file is opened `O_APPEND` and each line goes out in one `write(2)`;
//!   the kernel appends a regular-file write atomically with respect to other appenders.
//! - Rotation: the writer that sees the file past `max_bytes` takes `<log>.lock` with a
//!   non-blocking `flock` (a busy lock means another process is rotating: nobody waits), checks
//!   the file is still the one it measured, and renames `<log>` → `<log>.1` → … →
//!   `<log>.<keep>`. Other writers notice the rename (the path's inode differs from their open
//!   file's) before their next line and reopen. A line already in flight lands complete in
//!   `<log>.1`, where readers find it.
//! - Failure (missing directory, read-only file, full disk) is an error for the caller to
//!   count; a short write (disk full mid-line) is followed by a newline before the next line,
//!   so a fragment never glues onto a good line.

use std::fs::{File, OpenOptions};
use std::os::fd::AsFd;
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::fcntl::{Flock, FlockArg};
use thiserror::Error;

#[derive(Debug, Error)]
pub enum LogError {
    #[error("open event log {path}: {source}")]
    Open { path: PathBuf, source: std::io::Error },
    #[error("write event log {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error("write event log {path}: only {written} of {len} bytes written")]
    Short { path: PathBuf, written: usize, len: usize },
    #[error("event log {path}: reopen deferred after a failure")]
    Deferred { path: PathBuf },
}

/// How long after a failed open the next attempt waits, so a missing directory costs one
/// failed `open` per interval, not one per event.
const REOPEN_BACKOFF: Duration = Duration::from_secs(1);

/// Path of rotated file `n` (`events.jsonl.1`).
pub fn rotated(path: &Path, n: u32) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(format!(".{n}"));
    PathBuf::from(s)
}

fn lock_path(path: &Path) -> PathBuf {
    let mut s = path.as_os_str().to_owned();
    s.push(".lock");
    PathBuf::from(s)
}

/// An appender to the shared log.
pub struct EventLog {
    path: PathBuf,
    max_bytes: u64,
    keep: u32,
    file: Option<(File, u64)>,
    failed_at: Option<Instant>,
    /// The last write stopped mid-line: start the next one with a newline.
    broken: bool,
}

impl EventLog {
    /// A writer for `path`, rotated past `max_bytes`, keeping `keep` old files (at least 1).
    /// Nothing is opened yet.
    pub fn new(path: &Path, max_bytes: u64, keep: u32) -> Self {
        Self {
            path: path.to_path_buf(),
            max_bytes: max_bytes.max(1),
            keep: keep.max(1),
            file: None,
            failed_at: None,
            broken: false,
        }
    }

    pub fn path(&self) -> &Path {
        &self.path
    }

    /// Appends one line (newline included) in one write, then rotates if the file grew past
    /// the limit.
    pub fn append(&mut self, line: &[u8]) -> Result<(), LogError> {
        self.follow_rotation();
        let mut buf;
        let data = if self.broken {
            buf = Vec::with_capacity(line.len() + 1);
            buf.push(b'\n');
            buf.extend_from_slice(line);
            &buf[..]
        } else {
            line
        };
        let result = write_once(self.open()?, data);
        match result {
            Ok(n) if n == data.len() => self.broken = false,
            Ok(n) => {
                self.broken = n > 0;
                self.file = None;
                return Err(LogError::Short {
                    path: self.path.clone(),
                    written: n,
                    len: data.len(),
                });
            }
            Err(source) => {
                self.file = None;
                return Err(LogError::Write {
                    path: self.path.clone(),
                    source,
                });
            }
        }
        self.rotate_if_full();
        Ok(())
    }

    /// Drops the open file when the path now names another file (someone rotated).
    fn follow_rotation(&mut self) {
        let Some((_, ino)) = &self.file else { return };
        match std::fs::metadata(&self.path) {
            Ok(m) if m.ino() == *ino => {}
            _ => self.file = None,
        }
    }

    fn open(&mut self) -> Result<&mut File, LogError> {
        if self.file.is_none() {
            if let Some(t) = self.failed_at {
                if t.elapsed() < REOPEN_BACKOFF {
                    return Err(LogError::Deferred {
                        path: self.path.clone(),
                    });
                }
            }
            let opened = match open_append(&self.path) {
                Err(e) if e.kind() == std::io::ErrorKind::NotFound && make_parent(&self.path) => {
                    open_append(&self.path)
                }
                other => other,
            };
            match opened {
                Ok(f) => {
                    self.failed_at = None;
                    self.file = Some(f);
                }
                Err(source) => {
                    self.failed_at = Some(Instant::now());
                    return Err(LogError::Open {
                        path: self.path.clone(),
                        source,
                    });
                }
            }
        }
        match &mut self.file {
            Some((f, _)) => Ok(f),
            None => Err(LogError::Deferred {
                path: self.path.clone(),
            }),
        }
    }

    /// Rotates under the lock when our file is past the limit. Best effort: any failure leaves
    /// the file growing and the next line tries again.
    fn rotate_if_full(&mut self) {
        let Some((f, ino)) = &self.file else { return };
        let ino = *ino;
        if f.metadata().map(|m| m.len()).unwrap_or(0) < self.max_bytes {
            return;
        }
        let Ok(lock_file) = OpenOptions::new()
            .write(true)
            .create(true)
            .mode(0o640)
            .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
            .open(lock_path(&self.path))
        else {
            return;
        };
        // Busy: another writer is rotating this very file; it will be renamed away.
        let Ok(_lock) = Flock::lock(lock_file, FlockArg::LockExclusiveNonblock) else {
            return;
        };
        let still_ours = std::fs::metadata(&self.path)
            .map(|m| m.ino() == ino && m.len() >= self.max_bytes)
            .unwrap_or(false);
        if still_ours {
            // Only the files that exist are shifted: the lock is held for a few renames.
            let top = (1..self.keep)
                .take_while(|n| rotated(&self.path, *n).exists())
                .last()
                .unwrap_or(0);
            for n in (1..=top).rev() {
                let _ = std::fs::rename(rotated(&self.path, n), rotated(&self.path, n + 1));
            }
            let _ = std::fs::rename(&self.path, rotated(&self.path, 1));
        }
        self.file = None;
    }
}

fn open_append(path: &Path) -> std::io::Result<(File, u64)> {
    OpenOptions::new()
        .append(true)
        .create(true)
        .mode(0o640)
        .custom_flags(libc::O_CLOEXEC | libc::O_NOFOLLOW)
        .open(path)
        .and_then(|f| f.metadata().map(|m| (f, m.ino())))
}

/// Creates the log's directory (mode 0750) when only that last level is missing, as for the
/// default `/var/log/gantry`; a path missing more than that is a typo, not a log to create.
fn make_parent(path: &Path) -> bool {
    use std::os::unix::fs::DirBuilderExt;
    let Some(dir) = path.parent() else { return false };
    if !dir.parent().is_some_and(Path::is_dir) {
        return false;
    }
    let made = std::fs::DirBuilder::new().mode(0o750).create(dir);
    made.is_ok() || dir.is_dir()
}

/// One `write(2)`, retried only when interrupted before writing anything.
fn write_once(f: &mut File, data: &[u8]) -> std::io::Result<usize> {
    loop {
        match nix::unistd::write(f.as_fd(), data) {
            Ok(n) => return Ok(n),
            Err(nix::errno::Errno::EINTR) => continue,
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
#[path = "log_tests.rs"]
mod tests;
