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
/// private, for the container's whole life. It also gives back the pages of the calling thread's
/// (the reactor's) stack below the frames now live: the deepest moment of a Create
/// (libseccomp, serde, the sandbox's set-up) leaves tens of KiB of dead stack resident too.
pub fn trim_heap() {
    // SAFETY: malloc_trim only releases free heap memory.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::malloc_trim(0);
    }
    release_dead_stack();
    release_code_pages();
}

/// Unmaps this executable's read-only pages (code, `.rodata`, unwind tables, the relocation
/// table read once at start) from the process; they stay in the page cache. Create and Start run
/// much of the binary once (spec parsing, policy, the runtime's invocation), and with the
/// kernel's 64 KiB fault-around that kept 2.3-2.6 MiB of it mapped in every pod's daemon for the
/// pod's life. What the daemon runs afterwards (the reactor, Wait, State, Delete) faults back in
/// from the page cache at a few microseconds a window. Writable segments are never touched:
/// their pages are private (the relocated `.data.rel.ro` among them), and dropping them would
/// undo the relocations. Never inlined: scripts/symbol-order.sh splits a daemon's recording at
/// its return, into the code set-up runs and the code the daemon runs afterwards, laid out first.
#[inline(never)]
pub fn release_code_pages() {
    for (start, end) in read_only_segments() {
        // SAFETY: [start, end) holds only whole pages of read-only, file-backed segments of this
        // executable (see `read_only_segments`): after MADV_DONTNEED they read back unchanged
        // from the file, so no live reference into them can observe a difference.
        unsafe {
            libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED);
        }
    }
}

/// Most loadable segments an executable has (lld and ld write four or five).
const MAX_SEGMENTS: usize = 8;

/// The whole pages of the executable's loadable segments that are not writable, as
/// [start, end) addresses. Pages a segment shares with its neighbour are left out.
fn read_only_segments() -> Vec<(usize, usize)> {
    let mut found = [(0usize, 0usize); MAX_SEGMENTS];
    // SAFETY: the callback only reads the program headers glibc hands it and writes `found`,
    // which outlives the call.
    unsafe { libc::dl_iterate_phdr(Some(main_program_segments), found.as_mut_ptr().cast()) };
    found.into_iter().filter(|(s, e)| e > s).collect()
}

/// dl_iterate_phdr's callback: records the first object's (the executable's) read-only
/// PT_LOAD segments into the `[(usize, usize); MAX_SEGMENTS]` that `data` points to, then stops.
unsafe extern "C" fn main_program_segments(
    info: *mut libc::dl_phdr_info,
    _size: libc::size_t,
    data: *mut libc::c_void,
) -> libc::c_int {
    // SAFETY: glibc passes a valid info for the duration of the call; `data` is the array
    // `read_only_segments` passed.
    let (info, found) = unsafe { (&*info, &mut *data.cast::<[(usize, usize); MAX_SEGMENTS]>()) };
    if info.dlpi_phdr.is_null() {
        return 1;
    }
    // SAFETY: dlpi_phdr points at dlpi_phnum program headers.
    let headers = unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) };
    let page = page_size();
    let loads = headers
        .iter()
        .filter(|h| h.p_type == libc::PT_LOAD && h.p_flags & libc::PF_W == 0);
    for (slot, h) in found.iter_mut().zip(loads) {
        let start = info.dlpi_addr as usize + h.p_vaddr as usize;
        let end = start + h.p_filesz as usize;
        *slot = (start.next_multiple_of(page), end & !(page - 1));
    }
    1
}

fn page_size() -> usize {
    // SAFETY: sysconf has no preconditions.
    usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096)
}

/// One arena for every thread. A blocking-pool thread would otherwise get a glibc arena of its
/// own (a 132 KiB heap, tens of KiB of it resident for the daemon's life, and never trimmed
/// into the main heap's free pages); the daemon's threads rarely allocate at once, so the
/// shared arena's lock costs nothing measurable. Call before the first thread starts.
pub fn one_malloc_arena() {
    // SAFETY: mallopt only changes the allocator's tuning.
    #[cfg(target_env = "gnu")]
    unsafe {
        libc::mallopt(libc::M_ARENA_MAX, 1);
    }
}

/// Below this much under the caller's frame nothing is released: room for the frames of the
/// functions this one still returns through, and for a signal handler's.
const LIVE_STACK_MARGIN: usize = 16 << 10;

/// `MADV_DONTNEED` on the calling thread's stack pages below its live frames: they read back
/// as zero-filled pages when the stack grows there again. The bounds are glibc's for the
/// thread (`pthread_getattr_np`; for the main thread, the `[stack]` mapping's top and the
/// stack rlimit, a range the kernel keeps every other mapping out of), so the range holds only
/// this stack and unmapped addresses, which madvise skips.
fn release_dead_stack() {
    let Some((low, _)) = own_stack() else {
        return;
    };
    let here = std::hint::black_box(0u8);
    let sp = std::ptr::addr_of!(here) as usize;
    let page = page_size();
    let end = sp.saturating_sub(LIVE_STACK_MARGIN) & !(page - 1);
    let start = low.saturating_add(page - 1) & !(page - 1);
    if end <= start {
        return;
    }
    // SAFETY: [start, end) lies below every live frame of this thread and inside its stack's
    // bounds (see the doc comment); the kernel skips the unmapped part (ENOMEM, ignored).
    unsafe {
        libc::madvise(start as *mut libc::c_void, end - start, libc::MADV_DONTNEED);
    }
}

/// The calling thread's stack as glibc knows it: (lowest address, one past the highest).
#[cfg(target_env = "gnu")]
fn own_stack() -> Option<(usize, usize)> {
    let mut attr = std::mem::MaybeUninit::<libc::pthread_attr_t>::uninit();
    // SAFETY: pthread_getattr_np initialises `attr` when it returns 0; it is destroyed below.
    if unsafe { libc::pthread_getattr_np(libc::pthread_self(), attr.as_mut_ptr()) } != 0 {
        return None;
    }
    let (mut addr, mut size) = (std::ptr::null_mut(), 0usize);
    // SAFETY: `attr` was initialised above; both out-pointers are valid.
    let got = unsafe { libc::pthread_attr_getstack(attr.as_ptr(), &mut addr, &mut size) };
    // SAFETY: `attr` was initialised above and is not used after this.
    unsafe { libc::pthread_attr_destroy(attr.as_mut_ptr()) };
    (got == 0).then(|| (addr as usize, addr as usize + size))
}

#[cfg(not(target_env = "gnu"))]
fn own_stack() -> Option<(usize, usize)> {
    None
}

#[cfg(all(test, target_env = "gnu"))]
mod tests {
    use super::*;

    /// Resident pages in [low, high), by mincore.
    fn resident(low: usize, high: usize) -> usize {
        let page = 4096;
        let mut v = vec![0u8; (high - low).div_ceil(page)];
        // SAFETY: the range is this thread's stack mapping, page-aligned; `v` has a byte per page.
        let rc = unsafe { libc::mincore(low as *mut libc::c_void, high - low, v.as_mut_ptr()) };
        assert_eq!(rc, 0, "mincore: {}", std::io::Error::last_os_error());
        v.iter().filter(|b| *b & 1 == 1).count()
    }

    #[inline(never)]
    fn deep(bytes: usize) -> u8 {
        let mut buf = [0u8; 64 << 10];
        for b in buf.iter_mut().step_by(1024) {
            *b = 1;
        }
        buf[7] = 1;
        let below = if bytes > buf.len() { deep(bytes - buf.len()) } else { 0 };
        std::hint::black_box(&buf)[7] + below
    }

    #[test]
    fn the_dead_part_of_a_stack_is_given_back_and_the_live_part_kept() {
        let t = std::thread::Builder::new().stack_size(2 << 20).spawn(|| {
            let (low, high) = own_stack().expect("this thread's stack");
            assert!(high - low >= 2 << 20);
            std::hint::black_box(deep(512 << 10));
            let touched = resident(low, high);
            release_dead_stack();
            let kept = resident(low, high);
            // 512 KiB were touched below this frame; all but the margin go back.
            assert!(touched >= 128, "touched {touched} pages");
            assert!(touched - kept >= 100, "touched {touched} pages, {kept} still resident");
            // The live frames still work after it.
            assert_eq!(deep(128 << 10), 2);
        });
        t.expect("spawn").join().expect("the thread");
    }

    /// Pages of [start, end) mapped in this process's page table (/proc/self/pagemap's
    /// "present" bit), unlike mincore, which answers for the page cache.
    fn mapped(start: usize, end: usize) -> usize {
        use std::os::unix::fs::FileExt;
        let pagemap = std::fs::File::open("/proc/self/pagemap").expect("pagemap");
        let pages = (end - start) / 4096;
        let mut entries = vec![0u8; pages * 8];
        pagemap
            .read_exact_at(&mut entries, (start / 4096 * 8) as u64)
            .expect("pagemap read");
        entries
            .chunks_exact(8)
            .filter(|e| u64::from_ne_bytes((*e).try_into().unwrap()) >> 63 == 1)
            .count()
    }

    #[test]
    fn the_executables_read_only_pages_are_unmapped_and_fault_back() {
        let segments = read_only_segments();
        assert!(segments.len() >= 2, "code and read-only data: {segments:x?}");
        let code = segments
            .iter()
            .copied()
            .find(|(s, e)| (*s..*e).contains(&(mapped as *const () as usize)))
            .expect("this function lies in a read-only segment");
        // Touch a wide part of the code: a parse and a format, then the count itself.
        let parse = || serde_json::from_str::<serde_json::Value>(r#"{"a": [1, 2.5, "x"]}"#).expect("parse");
        std::hint::black_box(format!("{}", parse()));
        let before = mapped(code.0, code.1);
        release_code_pages();
        let after = mapped(code.0, code.1);
        assert!(before >= 32, "{before} code pages were mapped");
        assert!(after * 2 < before, "{after} of {before} code pages still mapped");
        // Everything still runs, read-only data included (a parse and a format go through
        // `.rodata` tables and relocated vtables).
        assert_eq!(format!("{}", parse()), r#"{"a":[1,2.5,"x"]}"#);
        assert!(mapped(code.0, code.1) > after, "code faulted back in");
    }
}
