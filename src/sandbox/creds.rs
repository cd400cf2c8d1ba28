//! The sandbox init's last steps, in runc's order: rlimits, the bounding set, user and groups,
//! capabilities, `noNewPrivileges`, then `execve` (seccomp: [`super::seccomp`]).

use std::ffi::CString;

use nix::sys::stat::{fstat, Mode, SFlag};
use nix::unistd::{Gid, Uid};
use oci_spec::runtime::Process;
use serde_json::Value;

use super::init::{fail, InitError};

/// Capability names in kernel order (`include/uapi/linux/capability.h`).
const CAPS: [&str; 41] = [
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_DAC_READ_SEARCH",
    "CAP_FOWNER",
    "CAP_FSETID",
    "CAP_KILL",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETPCAP",
    "CAP_LINUX_IMMUTABLE",
    "CAP_NET_BIND_SERVICE",
    "CAP_NET_BROADCAST",
    "CAP_NET_ADMIN",
    "CAP_NET_RAW",
    "CAP_IPC_LOCK",
    "CAP_IPC_OWNER",
    "CAP_SYS_MODULE",
    "CAP_SYS_RAWIO",
    "CAP_SYS_CHROOT",
    "CAP_SYS_PTRACE",
    "CAP_SYS_PACCT",
    "CAP_SYS_ADMIN",
    "CAP_SYS_BOOT",
    "CAP_SYS_NICE",
    "CAP_SYS_RESOURCE",
    "CAP_SYS_TIME",
    "CAP_SYS_TTY_CONFIG",
    "CAP_MKNOD",
    "CAP_LEASE",
    "CAP_AUDIT_WRITE",
    "CAP_AUDIT_CONTROL",
    "CAP_SETFCAP",
    "CAP_MAC_OVERRIDE",
    "CAP_MAC_ADMIN",
    "CAP_SYSLOG",
    "CAP_WAKE_ALARM",
    "CAP_BLOCK_SUSPEND",
    "CAP_AUDIT_READ",
    "CAP_PERFMON",
    "CAP_BPF",
    "CAP_CHECKPOINT_RESTORE",
];

/// The kernel's number for a capability name (any spelling [`crate::security::caps`] accepts).
pub fn cap_number(name: &str) -> Option<u32> {
    let name = crate::security::caps::normalize(name);
    CAPS.iter().position(|c| *c == name).map(|i| i as u32)
}

fn mask(list: &[String]) -> u64 {
    list.iter().filter_map(|n| cap_number(n)).fold(0, |m, c| m | 1 << c)
}

/// One set of `process.capabilities`, by name.
fn cap_set(doc: &Value, set: &str) -> Vec<String> {
    doc.pointer(&format!("/process/capabilities/{set}"))
        .and_then(Value::as_array)
        .map(|l| l.iter().filter_map(Value::as_str).map(String::from).collect())
        .unwrap_or_default()
}

/// The highest capability this kernel knows.
fn last_cap() -> u32 {
    std::fs::read_to_string("/proc/sys/kernel/cap_last_cap")
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(CAPS.len() as u32 - 1)
}

pub fn rlimits(process: &Process) -> Result<(), InitError> {
    for r in process.rlimits().iter().flatten() {
        let kind = serde_json::to_value(r.typ()).ok();
        let name = kind.as_ref().and_then(|v| v.as_str()).unwrap_or("");
        let Some(resource) = rlimit_number(name) else {
            return Err(fail(format!("unknown rlimit {name}")));
        };
        let limit = libc::rlimit {
            rlim_cur: r.soft(),
            rlim_max: r.hard(),
        };
        // SAFETY: setrlimit reads the struct it is given.
        if unsafe { libc::setrlimit(resource, &limit) } != 0 {
            return Err(fail(format!("setrlimit {name}: {}", std::io::Error::last_os_error())));
        }
    }
    Ok(())
}

fn rlimit_number(name: &str) -> Option<libc::__rlimit_resource_t> {
    Some(match name {
        "RLIMIT_AS" => libc::RLIMIT_AS,
        "RLIMIT_CORE" => libc::RLIMIT_CORE,
        "RLIMIT_CPU" => libc::RLIMIT_CPU,
        "RLIMIT_DATA" => libc::RLIMIT_DATA,
        "RLIMIT_FSIZE" => libc::RLIMIT_FSIZE,
        "RLIMIT_LOCKS" => libc::RLIMIT_LOCKS,
        "RLIMIT_MEMLOCK" => libc::RLIMIT_MEMLOCK,
        "RLIMIT_MSGQUEUE" => libc::RLIMIT_MSGQUEUE,
        "RLIMIT_NICE" => libc::RLIMIT_NICE,
        "RLIMIT_NOFILE" => libc::RLIMIT_NOFILE,
        "RLIMIT_NPROC" => libc::RLIMIT_NPROC,
        "RLIMIT_RSS" => libc::RLIMIT_RSS,
        "RLIMIT_RTPRIO" => libc::RLIMIT_RTPRIO,
        "RLIMIT_RTTIME" => libc::RLIMIT_RTTIME,
        "RLIMIT_SIGPENDING" => libc::RLIMIT_SIGPENDING,
        "RLIMIT_STACK" => libc::RLIMIT_STACK,
        _ => return None,
    })
}

fn prctl(option: libc::c_int, arg: libc::c_ulong, what: &str) -> Result<(), InitError> {
    // SAFETY: prctl with integer arguments only.
    if unsafe { libc::prctl(option, arg, 0, 0, 0) } != 0 {
        return Err(fail(format!("{what}: {}", std::io::Error::last_os_error())));
    }
    Ok(())
}

/// Drops every capability outside the bounding set (needs CAP_SETPCAP, so before the user).
pub fn bounding(doc: &Value) -> Result<(), InitError> {
    let keep = mask(&cap_set(doc, "bounding"));
    for cap in 0..=last_cap() {
        if keep & (1 << cap) == 0 {
            prctl(libc::PR_CAPBSET_DROP, cap as libc::c_ulong, "drop bounding capability")?;
        }
    }
    Ok(())
}

/// The passwd name and home of `uid`, and the groups /etc/group lists that name in, read
/// inside the container as runc reads them.
fn passwd_entry(uid: u32) -> (Option<String>, String) {
    let text = std::fs::read_to_string("/etc/passwd").unwrap_or_default();
    for line in text.lines() {
        let f: Vec<&str> = line.split(':').collect();
        if f.len() >= 6 && f[2].parse() == Ok(uid) {
            return (Some(f[0].to_string()), f[5].to_string());
        }
    }
    (None, "/".to_string())
}

fn member_groups(name: &str) -> Vec<Gid> {
    let text = std::fs::read_to_string("/etc/group").unwrap_or_default();
    text.lines()
        .filter_map(|line| {
            let f: Vec<&str> = line.split(':').collect();
            let listed = f.len() >= 4 && f[3].split(',').any(|m| m.trim() == name);
            listed.then(|| f[2].parse().ok().map(Gid::from_raw)).flatten()
        })
        .collect()
}

/// Switches to the spec's user keeping the permitted set, as runc's `setupUser`. Returns the
/// user's home (runc sets `HOME` from it when the env lacks one).
pub fn user(process: &Process) -> Result<String, InitError> {
    let u = process.user();
    let (uid, gid) = (Uid::from_raw(u.uid()), Gid::from_raw(u.gid()));
    let (name, home) = passwd_entry(u.uid());
    let mut groups: Vec<Gid> = name.as_deref().map(member_groups).unwrap_or_default();
    groups.extend(u.additional_gids().iter().flatten().map(|g| Gid::from_raw(*g)));
    fix_stdio_owner(uid, gid);
    nix::unistd::setgroups(&groups).map_err(|e| fail(format!("setgroups: {e}")))?;
    prctl(libc::PR_SET_KEEPCAPS, 1, "keep capabilities")?;
    nix::unistd::setresgid(gid, gid, gid).map_err(|e| fail(format!("setgid {gid}: {e}")))?;
    nix::unistd::setresuid(uid, uid, uid).map_err(|e| fail(format!("setuid {uid}: {e}")))?;
    prctl(libc::PR_SET_KEEPCAPS, 0, "clear keep capabilities")?;
    let umask = u.umask().unwrap_or(0o022);
    nix::sys::stat::umask(Mode::from_bits_truncate(umask as libc::mode_t));
    Ok(home)
}

/// The container's stdio becomes the user's, unless it is /dev/null (runc's fixStdioPermissions).
fn fix_stdio_owner(uid: Uid, gid: Gid) {
    for fd in [0, 1, 2] {
        let Ok(st) = fstat(fd) else { continue };
        let null = SFlag::from_bits_truncate(st.st_mode) & SFlag::S_IFMT == SFlag::S_IFCHR
            && st.st_rdev == libc::makedev(1, 3);
        if null || st.st_uid == uid.as_raw() {
            continue;
        }
        // SAFETY: fchown on a descriptor this process holds.
        let _ = unsafe { libc::fchown(fd, uid.as_raw(), gid.as_raw()) };
    }
}

#[repr(C)]
struct CapHeader {
    version: u32,
    pid: i32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct CapData {
    effective: u32,
    permitted: u32,
    inheritable: u32,
}

/// Sets the effective, permitted and inheritable sets, then raises the ambient ones.
pub fn capabilities(doc: &Value) -> Result<(), InitError> {
    let eff = mask(&cap_set(doc, "effective"));
    let perm = mask(&cap_set(doc, "permitted"));
    let inh = mask(&cap_set(doc, "inheritable"));
    let mut header = CapHeader {
        version: 0x2008_0522, // _LINUX_CAPABILITY_VERSION_3
        pid: 0,
    };
    let mut data = [CapData::default(); 2];
    for (i, d) in data.iter_mut().enumerate() {
        let shift = 32 * i;
        d.effective = (eff >> shift) as u32;
        d.permitted = (perm >> shift) as u32;
        d.inheritable = (inh >> shift) as u32;
    }
    // SAFETY: capset reads a v3 header and two data words, both valid for the call.
    if unsafe { libc::syscall(libc::SYS_capset, &mut header as *mut CapHeader, data.as_ptr()) } != 0 {
        return Err(fail(format!("capset: {}", std::io::Error::last_os_error())));
    }
    // runc raises each ambient capability and ignores a refusal (one not also permitted and
    // inheritable cannot be raised); so does the fast path, for the same result.
    for cap in cap_set(doc, "ambient").iter().filter_map(|n| cap_number(n)) {
        // SAFETY: prctl with integer arguments only.
        unsafe {
            libc::prctl(
                libc::PR_CAP_AMBIENT,
                libc::PR_CAP_AMBIENT_RAISE,
                cap as libc::c_ulong,
                0,
                0,
            )
        };
    }
    Ok(())
}

pub fn no_new_privileges() -> Result<(), InitError> {
    prctl(libc::PR_SET_NO_NEW_PRIVS, 1, "no_new_privs")
}

/// The program's path: as given when it holds a `/`, else looked up in the spec's `PATH`.
fn resolve(program: &str, env: &[String]) -> String {
    if program.contains('/') {
        return program.to_string();
    }
    let path = env
        .iter()
        .find_map(|e| e.strip_prefix("PATH="))
        .unwrap_or("/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin");
    path.split(':')
        .map(|d| format!("{d}/{program}"))
        .find(|p| nix::unistd::access(p.as_str(), nix::unistd::AccessFlags::X_OK).is_ok())
        .unwrap_or_else(|| program.to_string())
}

fn cstrings(list: &[String]) -> Result<Vec<CString>, InitError> {
    list.iter()
        .map(|s| CString::new(s.as_bytes()).map_err(|_| fail(format!("{s:?} holds a NUL byte"))))
        .collect()
}

/// Replaces this process with the container's program.
pub fn exec(process: &Process, home: &str) -> InitError {
    let args = process.args().clone().unwrap_or_default();
    let mut env = process.env().clone().unwrap_or_default();
    if !env.iter().any(|e| e.starts_with("HOME=")) {
        env.push(format!("HOME={home}"));
    }
    let Some(program) = args.first() else {
        return fail("process.args is empty");
    };
    let path = resolve(program, &env);
    let (Ok(argv), Ok(envp), Ok(file)) = (cstrings(&args), cstrings(&env), CString::new(path.clone())) else {
        return fail("process args or env hold a NUL byte");
    };
    match nix::unistd::execve(&file, &argv, &envp) {
        Err(e) => fail(format!("exec {path:?}: {e}")),
        Ok(never) => match never {},
    }
}

/// Fails Create, as runc does, when the program cannot be found or run.
pub fn check_program(process: &Process) -> Result<(), InitError> {
    let args = process.args().clone().unwrap_or_default();
    let env = process.env().clone().unwrap_or_default();
    let Some(program) = args.first() else {
        return Err(fail("process.args is empty"));
    };
    let path = resolve(program, &env);
    match std::fs::metadata(&path) {
        Err(e) => Err(fail(format!("exec: {program:?}: stat {path}: {e}"))),
        Ok(m) if !m.is_file() => Err(fail(format!("exec: {program:?}: {path} is not a regular file"))),
        Ok(_) => nix::unistd::access(path.as_str(), nix::unistd::AccessFlags::X_OK)
            .map_err(|e| fail(format!("exec: {program:?}: {path}: {e}"))),
    }
}
