//! The spec's seccomp filter: compiled by the daemon while the init sets up, loaded by the init.
//!
//! Why: libseccomp takes ~13 ms to compile a runtime's default profile (CRI-O's, ~300 calls
//! for three architectures), the largest step left in a sandbox's Create once its cgroups are
//! joined. The daemon compiles it on a blocking thread while the init execs, joins cgroups and
//! namespaces and mounts the rootfs, and hands the BPF program over a pipe
//! ([`SECCOMP_FD`](super::SECCOMP_FD)); the init loads it at runc's point with the flags
//! libseccomp's own `seccomp_load` would pass. Same libseccomp, same program.
//!
//! Compiled programs are also kept on disk ([`Cache`]): every pod of a node gets the same
//! default profile but its own daemon, so without it each pod would compile it again.

use std::fs::File;
use std::io::{Read, Seek, SeekFrom, Write};
use std::os::fd::{AsFd, FromRawFd, OwnedFd};
use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
use std::path::PathBuf;

use libseccomp::ScmpFilterContext;
use serde_json::Value;
use sha2::{Digest, Sha256};

use super::init::{fail, InitError};
use crate::security::seccomp::{self, Checks, Profile};

/// The kernel's limit on a filter's length (BPF_MAXINSNS).
const MAX_INSTRUCTIONS: usize = 4096;
const SECCOMP_FILTER_FLAG_TSYNC: u32 = 1;
const SECCOMP_FILTER_FLAG_LOG: u32 = 2;
const SECCOMP_FILTER_FLAG_SPEC_ALLOW: u32 = 4;

/// Builds `linux.seccomp` (validated at Create) into a filter that leaves `no_new_privs` as
/// the spec says, as runc does.
fn filter(doc: &Value) -> Result<Option<ScmpFilterContext>, String> {
    let Some(raw) = doc.pointer("/linux/seccomp").filter(|v| !v.is_null()) else {
        return Ok(None);
    };
    let profile: Profile = serde_json::from_value(raw.clone()).map_err(|e| format!("linux.seccomp: {e}"))?;
    let checks = Checks {
        unknown: crate::security::Unknown::Warn,
        require_default_deny: false,
        all_arches: true,
    };
    let (mut filter, _) = seccomp::build(&profile, checks).map_err(|e| format!("linux.seccomp: {e}"))?;
    filter.set_ctl_nnp(false).map_err(|e| format!("seccomp: {e}"))?;
    Ok(Some(filter))
}

/// Whether the spec has a filter for the init to load.
pub fn wanted(doc: &Value) -> bool {
    doc.pointer("/linux/seccomp").is_some_and(|v| !v.is_null())
}

/// Daemon side (blocking): writes the spec's compiled filter to `out` (from `cache` when it
/// holds it, else compiled and stored there): the seccomp() flags as 4 bytes, then the program
/// as libseccomp exports it.
pub fn send(doc: &Value, out: OwnedFd, cache: Option<&Cache>) -> Result<(), String> {
    let Some(raw) = doc.pointer("/linux/seccomp").filter(|v| !v.is_null()) else {
        return Ok(());
    };
    let key = Cache::key(raw);
    let bytes = match cache.and_then(|c| c.get(&key)) {
        Some(hit) => hit,
        None => {
            let bytes = compile(doc)?;
            if let Some(c) = cache {
                c.put(&key, &bytes);
            }
            bytes
        }
    };
    File::from(out)
        .write_all(&bytes)
        .map_err(|e| format!("seccomp program: {e}"))
}

/// The flags and program libseccomp would load for this spec.
fn compile(doc: &Value) -> Result<Vec<u8>, String> {
    let Some(filter) = filter(doc)? else {
        return Err("linux.seccomp: no filter".into());
    };
    let ctl = |on: Result<bool, libseccomp::error::SeccompError>, flag: u32| if on.unwrap_or(false) { flag } else { 0 };
    let flags = ctl(filter.get_ctl_tsync(), SECCOMP_FILTER_FLAG_TSYNC)
        | ctl(filter.get_ctl_log(), SECCOMP_FILTER_FLAG_LOG)
        | ctl(filter.get_ctl_ssb(), SECCOMP_FILTER_FLAG_SPEC_ALLOW);
    // libseccomp 2.5 exports to a descriptor only: an anonymous memory file.
    // SAFETY: memfd_create with a NUL-terminated name; the result is owned below.
    let raw = unsafe { libc::memfd_create(c"gantry-seccomp".as_ptr(), libc::MFD_CLOEXEC) };
    if raw < 0 {
        return Err(format!("seccomp program: memfd: {}", std::io::Error::last_os_error()));
    }
    // SAFETY: memfd_create just returned this descriptor.
    let mut file = unsafe { File::from_raw_fd(raw) };
    filter
        .export_bpf(file.as_fd())
        .map_err(|e| format!("seccomp program: {e}"))?;
    let mut bytes = flags.to_ne_bytes().to_vec();
    file.seek(SeekFrom::Start(0))
        .and_then(|_| file.read_to_end(&mut bytes))
        .map_err(|e| format!("seccomp program: {e}"))?;
    parse(&bytes).map_err(|InitError(why)| why)?;
    Ok(bytes)
}

/// Compiled programs by content: a root-only directory of files named by the SHA-256 of what
/// determines the program (the profile, gantry's and libseccomp's versions, the host
/// architecture). A file not owned by this user, writable by others, or not a well-formed
/// program is ignored and compiled afresh.
pub struct Cache {
    dir: PathBuf,
}

/// Files kept at most; past it new programs are compiled but not stored.
const CACHE_ENTRIES: usize = 256;

impl Cache {
    pub fn new(dir: PathBuf) -> Self {
        Self { dir }
    }

    fn key(raw: &Value) -> String {
        let v = libseccomp::ScmpVersion::current().map(|v| format!("{}.{}.{}", v.major, v.minor, v.micro));
        let mut h = Sha256::new();
        h.update(format!(
            "gantry {} libseccomp {} {}\0",
            env!("CARGO_PKG_VERSION"),
            v.unwrap_or_default(),
            std::env::consts::ARCH
        ));
        h.update(serde_json::to_vec(raw).unwrap_or_default());
        h.finalize().iter().map(|b| format!("{b:02x}")).collect()
    }

    fn get(&self, key: &str) -> Option<Vec<u8>> {
        let mut file = std::fs::OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(self.dir.join(key))
            .ok()?;
        let m = file.metadata().ok()?;
        let own = m.uid() == nix::unistd::geteuid().as_raw() && m.mode() & 0o022 == 0 && m.nlink() == 1;
        let size = m.len() as usize;
        if !m.is_file() || !own || size > 4 + MAX_INSTRUCTIONS * std::mem::size_of::<libc::sock_filter>() {
            return None;
        }
        let mut bytes = Vec::with_capacity(size);
        file.read_to_end(&mut bytes).ok()?;
        parse(&bytes).ok().map(|_| bytes)
    }

    /// Best effort: a program that cannot be stored is compiled again next time.
    fn put(&self, key: &str, bytes: &[u8]) {
        if crate::files::private_dir(&self.dir).is_err() {
            return;
        }
        let full = std::fs::read_dir(&self.dir).map_or(true, |d| d.count() >= CACHE_ENTRIES);
        if !full {
            let _ = crate::files::write_atomic_mode(&self.dir.join(key), bytes, 0o600);
        }
    }
}

/// A compiled filter as the kernel takes it.
pub struct Program {
    flags: u32,
    code: Vec<libc::sock_filter>,
}

/// Init side: reads the program the daemon sends on `fd` (to its end).
pub fn receive(fd: i32) -> Result<Program, InitError> {
    // SAFETY: the daemon placed this descriptor for this process alone.
    let mut file = unsafe { File::from_raw_fd(fd) };
    let mut bytes = Vec::new();
    file.read_to_end(&mut bytes)
        .map_err(|e| fail(format!("seccomp program: {e}")))?;
    parse(&bytes)
}

fn parse(bytes: &[u8]) -> Result<Program, InitError> {
    let size = std::mem::size_of::<libc::sock_filter>();
    let (head, body) = bytes
        .split_first_chunk::<4>()
        .ok_or_else(|| fail("seccomp program: none received"))?;
    let count = body.len() / size;
    if body.is_empty() || body.len() % size != 0 || count > MAX_INSTRUCTIONS {
        return Err(fail(format!("seccomp program: {} bytes is not a filter", body.len())));
    }
    let code = body
        .chunks_exact(size)
        .map(|c| libc::sock_filter {
            code: u16::from_ne_bytes([c[0], c[1]]),
            jt: c[2],
            jf: c[3],
            k: u32::from_ne_bytes([c[4], c[5], c[6], c[7]]),
        })
        .collect();
    Ok(Program {
        flags: u32::from_ne_bytes(*head),
        code,
    })
}

/// Installs the filter (SECCOMP_SET_MODE_FILTER), as libseccomp's `seccomp_load` does.
pub fn load(program: Option<&Program>) -> Result<(), InitError> {
    let Some(p) = program else {
        return Ok(());
    };
    let fprog = libc::sock_fprog {
        len: p.code.len() as u16,
        filter: p.code.as_ptr() as *mut libc::sock_filter,
    };
    // SAFETY: `fprog` points at `p.code`, which outlives the call; the kernel copies it.
    let r = unsafe {
        libc::syscall(
            libc::SYS_seccomp,
            libc::SECCOMP_SET_MODE_FILTER,
            p.flags,
            &fprog as *const libc::sock_fprog,
        )
    };
    if r != 0 {
        return Err(fail(format!(
            "load seccomp filter: {}",
            std::io::Error::last_os_error()
        )));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_program_survives_the_pipe_and_bad_bytes_are_refused() {
        let doc = serde_json::json!({"linux": {"seccomp": {
            "defaultAction": "SCMP_ACT_ERRNO",
            "architectures": ["SCMP_ARCH_X86_64"],
            "syscalls": [{"names": ["read", "write", "exit_group"], "action": "SCMP_ACT_ALLOW"}]
        }}});
        assert!(wanted(&doc));
        let (r, w) = nix::unistd::pipe().unwrap();
        let sender = std::thread::spawn(move || send(&doc, w, None));
        let mut bytes = Vec::new();
        File::from(r).read_to_end(&mut bytes).unwrap();
        sender.join().unwrap().unwrap();
        let program = parse(&bytes).unwrap();
        assert_eq!(program.flags, 0);
        // Same program as libseccomp exports for the same profile.
        let direct = filter(&serde_json::json!({"linux": {"seccomp": {
            "defaultAction": "SCMP_ACT_ERRNO",
            "architectures": ["SCMP_ARCH_X86_64"],
            "syscalls": [{"names": ["read", "write", "exit_group"], "action": "SCMP_ACT_ALLOW"}]
        }}}))
        .unwrap()
        .unwrap();
        let (r2, w2) = nix::unistd::pipe().unwrap();
        direct.export_bpf(w2.as_fd()).unwrap();
        drop(w2);
        let mut exported = Vec::new();
        File::from(r2).read_to_end(&mut exported).unwrap();
        assert_eq!(&bytes[4..], &exported[..]);
        assert!(program.code.len() > 3);
        // Loading a bad or missing program is an error, not an unconfined container.
        assert!(parse(&[]).is_err());
        assert!(parse(&[0, 0, 0, 0]).is_err());
        assert!(parse(&[0, 0, 0, 0, 1, 2, 3]).is_err());
        assert!(!wanted(&serde_json::json!({"linux": {}})));
    }

    fn profile(names: &[&str]) -> Value {
        serde_json::json!({"linux": {"seccomp": {
            "defaultAction": "SCMP_ACT_ERRNO",
            "architectures": ["SCMP_ARCH_X86_64"],
            "syscalls": [{"names": names, "action": "SCMP_ACT_ALLOW"}]
        }}})
    }

    fn sent(doc: &Value, cache: &Cache) -> Vec<u8> {
        let (r, w) = nix::unistd::pipe().unwrap();
        send(doc, w, Some(cache)).unwrap();
        let mut bytes = Vec::new();
        File::from(r).read_to_end(&mut bytes).unwrap();
        bytes
    }

    #[test]
    fn the_cache_serves_only_well_formed_root_only_programs_of_the_same_profile() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let cache = Cache::new(dir.path().join("cache"));
        let doc = profile(&["read", "write"]);
        let first = sent(&doc, &cache);
        let key = Cache::key(doc.pointer("/linux/seccomp").unwrap());
        let file = dir.path().join("cache").join(&key);
        let meta = std::fs::metadata(&file).unwrap();
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
        assert_eq!(
            std::fs::metadata(dir.path().join("cache"))
                .unwrap()
                .permissions()
                .mode()
                & 0o777,
            0o700
        );
        // A different profile is a different entry.
        assert_ne!(key, Cache::key(profile(&["read"]).pointer("/linux/seccomp").unwrap()));
        // A hit gives the same bytes; a planted program is served only when it is well formed,
        // owned by this user and not writable by others.
        assert_eq!(sent(&doc, &cache), first);
        let planted = {
            let mut p = first.clone();
            p.truncate(4 + 8);
            p.extend_from_slice(&first[first.len() - 8..]);
            p
        };
        std::fs::write(&file, &planted).unwrap();
        assert_eq!(cache.get(&key).as_deref(), Some(&planted[..]));
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o622)).unwrap();
        assert_eq!(cache.get(&key), None);
        std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o600)).unwrap();
        if nix::unistd::geteuid().is_root() {
            std::os::unix::fs::chown(&file, Some(65534), None).unwrap();
            assert_eq!(cache.get(&key), None);
            std::os::unix::fs::chown(&file, Some(0), None).unwrap();
        }
        std::fs::write(&file, b"not a program").unwrap();
        assert_eq!(cache.get(&key), None);
        // What the cache refuses is compiled again (and stored again).
        assert_eq!(sent(&doc, &cache), first);
        assert_eq!(std::fs::read(&file).unwrap(), first);
    }
}
