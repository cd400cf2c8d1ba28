//! gantry's runtime-default seccomp profile as data: which system calls a container may make,
//! and which need a capability in the container's bounding set. [`super::seccomp`] turns these
//! tables into an OCI `linux.seccomp` object per capability set and architecture.
//!
//! Written for gantry from the kernel's syscall list. Left out on purpose (the default action,
//! EPERM, answers them): module and kexec loading, `keyctl`/`add_key`/`request_key` (the kernel
//! keyring is not namespaced), `userfaultfd`, `io_uring_*` (a large attack surface that seccomp
//! cannot inspect), obsolete calls (`uselib`, `_sysctl`, `ustat`, `sysfs`, `nfsservctl`,
//! `vm86`), swap, `pivot_root` and `chroot` without their capabilities, and the rest of the
//! namespace and mount families without CAP_SYS_ADMIN.

/// Calls every container may make. Names unknown to the host's libseccomp (calls newer than
/// it) are dropped when the profile is generated: the runtime could not filter them either.
#[rustfmt::skip]
pub const BASE: &[&str] = &[
    // Files and descriptors.
    "access", "chdir", "chmod", "chown", "chown32", "close", "close_range", "copy_file_range",
    "creat", "dup", "dup2", "dup3", "faccessat", "faccessat2", "fadvise64", "fadvise64_64",
    "fallocate", "fchdir", "fchmod", "fchmodat", "fchmodat2", "fchown", "fchown32", "fchownat",
    "fcntl", "fcntl64", "fdatasync", "fgetxattr", "flistxattr", "flock", "fremovexattr",
    "fsetxattr", "fstat", "fstat64", "fstatat64", "fstatfs", "fstatfs64", "fsync", "ftruncate",
    "ftruncate64", "futimesat", "getcwd", "getdents", "getdents64", "getxattr", "inotify_add_watch",
    "inotify_init", "inotify_init1", "inotify_rm_watch", "ioctl", "lchown", "lchown32",
    "lgetxattr", "link", "linkat", "listxattr", "llistxattr", "_llseek", "lremovexattr", "lseek",
    "lsetxattr", "lstat", "lstat64", "mkdir", "mkdirat", "mknod", "mknodat", "newfstatat", "open",
    "openat", "openat2", "pipe", "pipe2", "pread64", "preadv", "preadv2", "pwrite64", "pwritev",
    "pwritev2", "read", "readahead", "readlink", "readlinkat", "readv", "removexattr", "rename",
    "renameat", "renameat2", "rmdir", "sendfile", "sendfile64", "setxattr", "splice", "stat",
    "stat64", "statfs", "statfs64", "statx", "symlink", "symlinkat", "sync", "sync_file_range",
    "sync_file_range2", "syncfs", "tee", "truncate", "truncate64", "umask", "unlink", "unlinkat",
    "utime", "utimensat", "utimensat_time64", "utimes", "vmsplice", "write", "writev",
    "fanotify_mark", "memfd_create", "name_to_handle_at",
    // Polling and event descriptors.
    "epoll_create", "epoll_create1", "epoll_ctl", "epoll_ctl_old", "epoll_pwait", "epoll_pwait2",
    "epoll_wait", "epoll_wait_old", "eventfd", "eventfd2", "poll", "ppoll", "ppoll_time64",
    "pselect6", "pselect6_time64", "select", "_newselect", "signalfd", "signalfd4",
    "timerfd_create", "timerfd_gettime", "timerfd_gettime64", "timerfd_settime",
    "timerfd_settime64",
    // Asynchronous I/O (the old interface; io_uring is not allowed).
    "io_cancel", "io_destroy", "io_getevents", "io_pgetevents", "io_pgetevents_time64",
    "io_setup", "io_submit", "ioprio_get", "ioprio_set",
    // Memory.
    "brk", "madvise", "membarrier", "mincore", "mlock", "mlock2", "mlockall", "mmap", "mmap2",
    "mprotect", "mremap", "msync", "munlock", "munlockall", "munmap", "pkey_alloc", "pkey_free",
    "pkey_mprotect", "remap_file_pages",
    // Processes, threads, signals.
    "capget", "capset", "execve", "execveat", "exit", "exit_group", "fork", "futex",
    "futex_requeue", "futex_time64", "futex_wait", "futex_waitv", "futex_wake", "get_robust_list",
    "getcpu", "getpgid", "getpgrp", "getpid", "getppid", "getpriority", "getrusage", "getsid",
    "gettid", "kill", "pause", "pidfd_open", "pidfd_send_signal", "prctl", "prlimit64",
    "restart_syscall", "rseq", "rt_sigaction", "rt_sigpending", "rt_sigprocmask",
    "rt_sigqueueinfo", "rt_sigreturn", "rt_sigsuspend", "rt_sigtimedwait",
    "rt_sigtimedwait_time64", "rt_tgsigqueueinfo", "sched_get_priority_max",
    "sched_get_priority_min", "sched_getaffinity", "sched_getattr", "sched_getparam",
    "sched_getscheduler", "sched_rr_get_interval", "sched_rr_get_interval_time64",
    "sched_setaffinity", "sched_setattr", "sched_setparam", "sched_setscheduler", "sched_yield",
    "seccomp", "set_robust_list", "set_tid_address", "setpgid", "setpriority", "setsid",
    "sigaltstack", "sigprocmask", "sigreturn", "tgkill", "tkill", "vfork", "wait4", "waitid",
    "waitpid", "getrlimit", "setrlimit", "ugetrlimit",
    // Credentials (the kernel checks CAP_SETUID/CAP_SETGID itself).
    "getegid", "getegid32", "geteuid", "geteuid32", "getgid", "getgid32", "getgroups",
    "getgroups32", "getresgid", "getresgid32", "getresuid", "getresuid32", "getuid", "getuid32",
    "setfsgid", "setfsgid32", "setfsuid", "setfsuid32", "setgid", "setgid32", "setgroups",
    "setgroups32", "setregid", "setregid32", "setresgid", "setresgid32", "setresuid",
    "setresuid32", "setreuid", "setreuid32", "setuid", "setuid32",
    // Time and timers (reading; setting the clock needs CAP_SYS_TIME).
    "adjtimex", "alarm", "clock_getres", "clock_getres_time64", "clock_gettime",
    "clock_gettime64", "clock_nanosleep", "clock_nanosleep_time64", "getitimer", "gettimeofday",
    "nanosleep", "setitimer", "time", "timer_create", "timer_delete", "timer_getoverrun",
    "timer_gettime", "timer_gettime64", "timer_settime", "timer_settime64", "times",
    // Sockets.
    "accept", "accept4", "bind", "connect", "getpeername", "getsockname", "getsockopt", "listen",
    "recv", "recvfrom", "recvmmsg", "recvmmsg_time64", "recvmsg", "send", "sendmmsg", "sendmsg",
    "sendto", "setsockopt", "shutdown", "socket", "socketcall", "socketpair",
    // System V and POSIX IPC (namespaced).
    "ipc", "mq_getsetattr", "mq_notify", "mq_open", "mq_timedreceive", "mq_timedreceive_time64",
    "mq_timedsend", "mq_timedsend_time64", "mq_unlink", "msgctl", "msgget", "msgrcv", "msgsnd",
    "semctl", "semget", "semop", "semtimedop", "semtimedop_time64", "shmat", "shmctl", "shmdt",
    "shmget",
    // System information and sandboxing.
    "getrandom", "sysinfo", "uname", "landlock_add_rule", "landlock_create_ruleset",
    "landlock_restrict_self", "process_mrelease", "cachestat", "map_shadow_stack",
    // Architecture-specific calls (resolved per architecture; absent ones are skipped).
    "arch_prctl", "get_thread_area", "set_thread_area", "modify_ldt", "arm_fadvise64_64",
    "arm_sync_file_range", "breakpoint", "cacheflush", "set_tls", "riscv_flush_icache",
];

/// Calls a capability in the bounding set unlocks (the kernel still checks the capability).
pub struct CapGroup {
    pub cap: &'static str,
    pub names: &'static [&'static str],
}

#[rustfmt::skip]
pub const CAP_GROUPS: &[CapGroup] = &[
    CapGroup {
        cap: "CAP_SYS_ADMIN",
        names: &[
            "clone3", "fanotify_init", "fsconfig", "fsmount", "fsopen", "fspick", "lookup_dcookie",
            "mount", "mount_setattr", "move_mount", "open_tree", "pivot_root", "quotactl",
            "quotactl_fd", "setdomainname", "sethostname", "setns", "umount", "umount2", "unshare",
        ],
    },
    CapGroup { cap: "CAP_SYS_BOOT", names: &["reboot"] },
    CapGroup { cap: "CAP_SYS_CHROOT", names: &["chroot"] },
    CapGroup { cap: "CAP_SYS_MODULE", names: &["delete_module", "finit_module", "init_module"] },
    CapGroup { cap: "CAP_SYS_PACCT", names: &["acct"] },
    CapGroup {
        cap: "CAP_SYS_PTRACE",
        names: &["kcmp", "pidfd_getfd", "process_madvise", "process_vm_readv", "process_vm_writev", "ptrace"],
    },
    CapGroup { cap: "CAP_SYS_RAWIO", names: &["ioperm", "iopl"] },
    CapGroup {
        cap: "CAP_SYS_TIME",
        names: &["clock_adjtime", "clock_adjtime64", "clock_settime", "clock_settime64", "settimeofday", "stime"],
    },
    CapGroup { cap: "CAP_SYS_TTY_CONFIG", names: &["vhangup"] },
    CapGroup {
        cap: "CAP_SYS_NICE",
        names: &["get_mempolicy", "mbind", "migrate_pages", "move_pages", "set_mempolicy", "set_mempolicy_home_node"],
    },
    CapGroup { cap: "CAP_SYSLOG", names: &["syslog"] },
    CapGroup { cap: "CAP_BPF", names: &["bpf"] },
    CapGroup { cap: "CAP_PERFMON", names: &["perf_event_open"] },
    CapGroup { cap: "CAP_DAC_READ_SEARCH", names: &["open_by_handle_at"] },
];

/// `clone` flags that create namespaces (CLONE_NEWNS | NEWCGROUP | NEWUTS | NEWIPC | NEWUSER |
/// NEWPID | NEWNET): without CAP_SYS_ADMIN, `clone` is allowed only with none of them set.
pub const CLONE_NAMESPACE_FLAGS: u64 = 0x7E02_0000;

/// Answer to `clone3` without CAP_SYS_ADMIN: its flags sit behind a pointer seccomp cannot
/// read, so ENOSYS makes glibc fall back to `clone`, whose flags it can.
pub const CLONE3_ERRNO: u32 = 38;

/// `personality` domains a container may select (Linux, and the 32-bit / uname26 variants
/// that `setarch` and old binaries use, plus the query value 0xffffffff).
pub const PERSONALITY_VALUES: &[u64] = &[0x0, 0x8, 0x20000, 0x20008, 0xffff_ffff];

/// Calls no container gets from the runtime-default profile, whatever its capabilities:
/// checked by the tests so that a later edit of the tables above cannot let them in.
#[rustfmt::skip]
pub const NEVER: &[&str] = &[
    "kexec_load", "kexec_file_load", "keyctl", "add_key", "request_key", "userfaultfd",
    "io_uring_setup", "io_uring_enter", "io_uring_register", "uselib", "_sysctl", "ustat",
    "sysfs", "nfsservctl", "vm86", "vm86old", "swapon", "swapoff", "create_module",
    "get_kernel_syms", "query_module",
];
