//! Small process-level helpers shared by the places that spawn helpers with extra fds.

use std::os::fd::RawFd;

/// Places `fds[i]` at fd number `first + i` in a child between fork and exec, whatever numbers
/// they had (a naive dup2 loop clobbers a source that already sits at a target number, and
/// dup2 onto itself would keep close-on-exec). Only async-signal-safe calls.
pub fn install_fds(fds: &[RawFd], first: RawFd) -> std::io::Result<()> {
    const SCRATCH: RawFd = 256;
    let mut moved = [0 as RawFd; 8];
    if fds.len() > moved.len() {
        return Err(std::io::Error::from_raw_os_error(libc::EINVAL));
    }
    for (i, fd) in fds.iter().enumerate() {
        // SAFETY: fcntl/dup2/close on descriptors this process owns; no allocation.
        let tmp = unsafe { libc::fcntl(*fd, libc::F_DUPFD, SCRATCH) };
        if tmp < 0 {
            return Err(std::io::Error::last_os_error());
        }
        moved[i] = tmp;
    }
    for (i, tmp) in moved.iter().take(fds.len()).enumerate() {
        // SAFETY: as above.
        if unsafe { libc::dup2(*tmp, first + i as RawFd) } < 0 {
            return Err(std::io::Error::last_os_error());
        }
        // SAFETY: as above.
        unsafe { libc::close(*tmp) };
    }
    Ok(())
}

/// Serialises unit tests that own child processes with the reaper test that reaps any child
/// (waitpid(-1)), so it never steals another test's exit status.
#[cfg(test)]
pub(crate) fn test_children_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}
