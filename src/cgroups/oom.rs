//! OOM-kill notifications. v1: an eventfd registered on memory.oom_control through
//! cgroup.event_control (the kernel signals it on OOM and when the cgroup is removed). v2: the
//! `oom_kill` counter of memory.events, woken by inotify (kernfs signals IN_MODIFY on every
//! change) and re-checked on a timer in case a notification is missed. The `oom` counter is
//! not used: it also counts OOMs that ended without a kill.

use std::ffi::CString;
use std::fs::{self, File};
use std::io::{self, Read};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use nix::sys::eventfd::{EfdFlags, EventFd};
use tokio::io::unix::AsyncFd;

use super::{get, io_err, read_keyed, CgroupError};

/// How often a v2 watcher re-reads the counters without a notification.
const RECHECK: Duration = Duration::from_millis(500);

/// Yields once per OOM kill in a container's cgroup, and ends when the cgroup is gone.
pub struct OomWatcher {
    inner: Inner,
}

enum Inner {
    V1 {
        efd: AsyncFd<EventFd>,
        /// The registration lasts as long as the eventfd; this keeps the file it names open.
        _control: File,
        dir: PathBuf,
    },
    V2 {
        inotify: AsyncFd<Inotify>,
        dir: PathBuf,
        seen: u64,
    },
}

impl OomWatcher {
    pub(super) fn v1(dir: &Path) -> Result<Self, CgroupError> {
        require_runtime()?;
        let control_path = dir.join("memory.oom_control");
        let control = File::open(&control_path).map_err(|e| match e.kind() {
            io::ErrorKind::NotFound if !dir.is_dir() => CgroupError::Gone(dir.to_path_buf()),
            io::ErrorKind::NotFound => CgroupError::OomUnsupported(format!("{} is absent", control_path.display())),
            _ => io_err(&control_path, e),
        })?;
        let efd = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
            .map_err(|e| io_err(Path::new("eventfd"), e.into()))?;
        let event_control = dir.join("cgroup.event_control");
        fs::write(&event_control, format!("{} {}", efd.as_raw_fd(), control.as_raw_fd())).map_err(|e| {
            match e.raw_os_error() {
                // Removed between the open and the registration.
                Some(libc::ENOENT | libc::ENODEV) if !dir.is_dir() => CgroupError::Gone(dir.to_path_buf()),
                _ => io_err(&event_control, e),
            }
        })?;
        // SAFETY: the EventFd owns its descriptor and stays inside the AsyncFd.
        let efd = unsafe { AsyncFd::register(efd) }.map_err(|e| io_err(Path::new("eventfd"), e.into()))?;
        Ok(Self {
            inner: Inner::V1 {
                efd,
                _control: control,
                dir: dir.to_path_buf(),
            },
        })
    }

    pub(super) fn v2(dir: &Path) -> Result<Self, CgroupError> {
        require_runtime()?;
        let events = dir.join("memory.events");
        let inotify = Inotify::new().map_err(|e| io_err(Path::new("inotify"), e))?;
        // Watch before reading the baseline, so no kill falls between the two.
        if let Err(e) = inotify.watch(&events, libc::IN_MODIFY) {
            return Err(if e.kind() != io::ErrorKind::NotFound {
                io_err(&events, e)
            } else if dir.is_dir() {
                CgroupError::OomUnsupported(format!("{} is absent (no memory controller)", events.display()))
            } else {
                CgroupError::Gone(dir.to_path_buf())
            });
        }
        // Emptiness ends the watcher; without cgroup.events the timer notices removal.
        let _ = inotify.watch(&dir.join("cgroup.events"), libc::IN_MODIFY);
        let seen = match read_keyed(&events)? {
            Some(kv) => get(&kv, "oom_kill"),
            None => return Err(CgroupError::Gone(dir.to_path_buf())),
        };
        // SAFETY: the File owns its descriptor and stays inside the AsyncFd.
        let inotify = unsafe { AsyncFd::register(inotify) }.map_err(|e| io_err(Path::new("inotify"), e.into()))?;
        Ok(Self {
            inner: Inner::V2 {
                inotify,
                dir: dir.to_path_buf(),
                seen,
            },
        })
    }

    /// Resolves with `Some(())` for each new OOM kill (kills in quick succession may coalesce
    /// into one), and with `None` once the cgroup is removed (v2 also: emptied), after which
    /// no kill can follow. Cancel-safe.
    pub async fn next(&mut self) -> Option<()> {
        match &mut self.inner {
            Inner::V1 { efd, dir, .. } => next_v1(efd, dir).await,
            Inner::V2 { inotify, dir, seen, .. } => next_v2(inotify, dir, seen).await,
        }
    }
}

fn require_runtime() -> Result<(), CgroupError> {
    tokio::runtime::Handle::try_current()
        .map(|_| ())
        .map_err(|_| CgroupError::NoRuntime)
}

/// The eventfd fires on OOM and on cgroup removal; the directory's existence tells them apart
/// (kernfs removes the directory before the kernel drops the event and signals it).
async fn next_v1(efd: &mut AsyncFd<EventFd>, dir: &Path) -> Option<()> {
    loop {
        let mut guard = efd.readable().await.ok()?;
        match guard.get_inner().read() {
            Ok(_) => return dir.join("memory.oom_control").exists().then_some(()),
            Err(nix::errno::Errno::EAGAIN) => guard.clear_ready(),
            Err(nix::errno::Errno::EINTR) => {}
            Err(_) => return None,
        }
    }
}

async fn next_v2(inotify: &mut AsyncFd<Inotify>, dir: &Path, seen: &mut u64) -> Option<()> {
    let events = dir.join("memory.events");
    loop {
        // Emptiness before the counter: a kill that emptied the cgroup has already been counted
        // by the time `populated 0` is visible, so it is never lost.
        let populated = match read_keyed(&dir.join("cgroup.events")) {
            Ok(Some(kv)) => kv.get("populated").is_none_or(|&p| p != 0),
            _ => true,
        };
        match read_keyed(&events) {
            // A key missing (a file caught mid-rewrite in tests) is "no change".
            Ok(Some(kv)) => {
                let kills = kv.get("oom_kill").copied().unwrap_or(*seen);
                if kills > *seen {
                    *seen = kills;
                    return Some(());
                }
            }
            Ok(None) | Err(_) => return None,
        }
        if !populated {
            return None;
        }
        match tokio::time::timeout(RECHECK, inotify.readable()).await {
            Ok(Ok(mut guard)) => {
                if guard.get_inner().drain().is_err() {
                    // A broken inotify fd: fall back to the timer alone.
                    tokio::time::sleep(RECHECK).await;
                }
                guard.clear_ready();
            }
            Ok(Err(_)) => tokio::time::sleep(RECHECK).await,
            Err(_) => {}
        }
    }
}

/// A non-blocking inotify descriptor. nix's `inotify` feature is not enabled in this crate, so
/// the two calls are made through libc.
struct Inotify(File);

impl Inotify {
    fn new() -> io::Result<Self> {
        // SAFETY: no pointers are passed; the result is checked.
        let fd = unsafe { libc::inotify_init1(libc::IN_NONBLOCK | libc::IN_CLOEXEC) };
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        // SAFETY: `fd` is a fresh descriptor that nothing else owns.
        Ok(Self(File::from(unsafe { OwnedFd::from_raw_fd(fd) })))
    }

    fn watch(&self, path: &Path, mask: u32) -> io::Result<()> {
        let c =
            CString::new(path.as_os_str().as_bytes()).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e))?;
        // SAFETY: `c` is a valid NUL-terminated string that outlives the call.
        let wd = unsafe { libc::inotify_add_watch(self.0.as_raw_fd(), c.as_ptr(), mask) };
        if wd < 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(())
    }

    /// Discards queued events: the watcher re-reads the counters instead of decoding them.
    fn drain(&self) -> io::Result<()> {
        let mut buf = [0u8; 4096];
        loop {
            match (&self.0).read(&mut buf) {
                Ok(0) => return Ok(()),
                Ok(_) => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        }
    }
}

impl AsRawFd for Inotify {
    fn as_raw_fd(&self) -> RawFd {
        self.0.as_raw_fd()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cgroups::{ContainerCgroup, V1Paths};
    use tokio::time::timeout;

    fn events(kills: u64, oom: u64) -> String {
        format!("low 0\nhigh 0\nmax 9\noom {oom}\noom_kill {kills}\noom_group_kill 0\n")
    }

    fn v2_fixture() -> (tempfile::TempDir, PathBuf) {
        let d = tempfile::tempdir().unwrap();
        let dir = d.path().join("c1");
        fs::create_dir(&dir).unwrap();
        fs::write(dir.join("memory.events"), events(2, 2)).unwrap();
        fs::write(dir.join("cgroup.events"), "populated 1\nfrozen 0\n").unwrap();
        (d, dir)
    }

    #[tokio::test]
    async fn v2_fires_on_oom_kill_not_on_oom() {
        let (_d, dir) = v2_fixture();
        let mut w = ContainerCgroup::v2_at(dir.clone()).oom_watcher().unwrap();
        // Existing kills are history, not news.
        assert!(timeout(Duration::from_millis(300), w.next()).await.is_err());
        // An OOM that reclaimed without killing.
        fs::write(dir.join("memory.events"), events(2, 3)).unwrap();
        assert!(timeout(Duration::from_millis(700), w.next()).await.is_err());
        fs::write(dir.join("memory.events"), events(3, 4)).unwrap();
        let got = timeout(Duration::from_secs(3), w.next()).await;
        assert_eq!(got, Ok(Some(())));
        // The last process died: the watcher ends.
        fs::write(dir.join("cgroup.events"), "populated 0\nfrozen 0\n").unwrap();
        assert_eq!(timeout(Duration::from_secs(3), w.next()).await, Ok(None));
    }

    #[tokio::test]
    async fn v2_kill_that_empties_the_cgroup_is_reported_first() {
        let (_d, dir) = v2_fixture();
        let mut w = ContainerCgroup::v2_at(dir.clone()).oom_watcher().unwrap();
        fs::write(dir.join("memory.events"), events(3, 3)).unwrap();
        fs::write(dir.join("cgroup.events"), "populated 0\nfrozen 0\n").unwrap();
        assert_eq!(timeout(Duration::from_secs(3), w.next()).await, Ok(Some(())));
        assert_eq!(timeout(Duration::from_secs(3), w.next()).await, Ok(None));
    }

    #[tokio::test]
    async fn v2_removed_cgroup_ends_the_watcher() {
        let (_d, dir) = v2_fixture();
        let mut w = ContainerCgroup::v2_at(dir.clone()).oom_watcher().unwrap();
        fs::remove_dir_all(&dir).unwrap();
        assert_eq!(timeout(Duration::from_secs(3), w.next()).await, Ok(None));
    }

    /// What `Container::take_new_ooms` falls back on once the cgroup itself is gone.
    #[test]
    fn the_parents_hierarchical_count_outlives_the_cgroup() {
        let (d, dir) = v2_fixture();
        let cg = ContainerCgroup::v2_at(dir.clone());
        assert_eq!(cg.parent_oom_kills(), None, "no parent memory.events");
        fs::write(d.path().join("memory.events"), events(7, 7)).unwrap();
        fs::remove_dir_all(&dir).unwrap();
        assert!(matches!(cg.oom_kills(), Err(CgroupError::Gone(_))));
        assert_eq!(cg.parent_oom_kills(), Some(7));
        assert_eq!(ContainerCgroup::v1_at(V1Paths::default()).parent_oom_kills(), None);
    }

    #[tokio::test]
    async fn unsupported_and_gone_cgroups_are_errors() {
        let d = tempfile::tempdir().unwrap();
        let e = ContainerCgroup::v2_at(d.path().to_path_buf())
            .oom_watcher()
            .err()
            .unwrap();
        assert!(matches!(e, CgroupError::OomUnsupported(_)), "{e}");
        let e = ContainerCgroup::v2_at(d.path().join("gone"))
            .oom_watcher()
            .err()
            .unwrap();
        assert!(matches!(e, CgroupError::Gone(_)), "{e}");
        let e = ContainerCgroup::v1_at(V1Paths::default()).oom_watcher().err().unwrap();
        assert!(matches!(e, CgroupError::OomUnsupported(_)), "{e}");
        let v1 = ContainerCgroup::v1_at(V1Paths {
            memory: Some(d.path().join("gone")),
            ..Default::default()
        });
        let e = v1.oom_watcher().err().unwrap();
        assert!(matches!(e, CgroupError::Gone(_)), "{e}");
    }

    #[test]
    fn watcher_can_move_to_a_task() {
        fn send<T: Send + 'static>() {}
        send::<OomWatcher>();
    }

    #[test]
    fn needs_a_runtime() {
        let (_d, dir) = v2_fixture();
        let e = ContainerCgroup::v2_at(dir).oom_watcher().err().unwrap();
        assert!(matches!(e, CgroupError::NoRuntime), "{e}");
    }
}
