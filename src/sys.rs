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

/// Closes every descriptor numbered `first` or above, as an exec would close close-on-exec
/// ones: for a process that forks without exec'ing.
pub fn close_fds_from(first: RawFd) -> std::io::Result<()> {
    // SAFETY: close_range only closes descriptors; none above `first` is used afterwards.
    if unsafe { libc::syscall(libc::SYS_close_range, first as libc::c_uint, libc::c_uint::MAX, 0) } == 0 {
        return Ok(());
    }
    // Kernels before 5.9: close what /proc lists (collected first: the listing holds an fd).
    let open: Vec<RawFd> = std::fs::read_dir("/proc/self/fd")?
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .filter(|fd| *fd >= first)
        .collect();
    for fd in open {
        // SAFETY: as above; EBADF for the listing's own, already closed fd is harmless.
        unsafe { libc::close(fd) };
    }
    Ok(())
}

/// Replaces this process's last command-line word `from` with `to` (same length) where
/// `ps` and /proc/PID/cmdline read it, so a daemon forked from `start` shows as such. Best
/// effort: the words live in this process's own stack, written through /proc/self/mem.
pub fn retitle_action(from: &str, to: &str) {
    use std::os::unix::fs::FileExt;
    if from.len() != to.len() {
        return;
    }
    // arg_end, where the argument strings end, is field 49.
    let Ok(stat) = crate::proc::Stat::of("self") else {
        return;
    };
    let Some(arg_end) = stat.field(49).and_then(|v| v.parse::<u64>().ok()) else {
        return;
    };
    let want = format!("{from}\0");
    let Some(at) = arg_end.checked_sub(want.len() as u64) else {
        return;
    };
    let Ok(mem) = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/proc/self/mem")
    else {
        return;
    };
    let mut cur = vec![0u8; want.len()];
    if mem.read_exact_at(&mut cur, at).is_ok() && cur == want.as_bytes() {
        let _ = mem.write_all_at(to.as_bytes(), at);
    }
}

/// Serialises unit tests that own child processes with the reaper test that reaps any child
/// (waitpid(-1)), so it never steals another test's exit status.
#[cfg(test)]
pub(crate) fn test_children_lock() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|e| e.into_inner())
}

/// Gives the heap's free pages back to the kernel. A daemon's busiest moments are Create and
/// Start (spec parsing, runtime output); what they freed would otherwise stay resident, and
/// private, for the container's whole life.
pub fn trim_heap() {
    // SAFETY: malloc_trim only releases free heap memory.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0);
    }
}
