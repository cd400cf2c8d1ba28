//! Seccomp profile recording (`gantry.dev/seccomp-record=<name>`): the container runs under a
//! recording filter instead of its profile, and the syscalls it makes become an OCI profile.
//!
//! Mechanism (numbers in docs/performance.md): every syscall the host's libseccomp names is an
//! `SCMP_ACT_NOTIFY` rule except [`ALWAYS`], and the daemon answers each notification with
//! `FLAG_CONTINUE`, noting the name. Exact (the kernel names the caller's filter, so no call is
//! attributed to the wrong container, and none is lost to rate limits as audit records are),
//! no privilege beyond what the watched syscalls already use, one round trip per notified call.
//! [`ALWAYS`] keeps the hottest calls off the round trip and holds the ones the runtime's own
//! init makes after loading the filter (runc's `write` can never be notified; its Go threads'
//! calls depend on timing), so every recorded profile allows them and replays.

use std::collections::BTreeSet;
use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::{DirBuilderExt, OpenOptionsExt};
use std::path::{Path, PathBuf};

use libseccomp::{ScmpArch, ScmpSyscall};
use serde::Serialize;
use serde_json::{json, Value};
use thiserror::Error;

/// The pod's or container's request: the profile's name (a Kubernetes object name).
pub const RECORD_ANNOTATION: &str = "gantry.dev/seccomp-record";

/// Allowed by every recorded profile and never notified: what runc's and crun's init call
/// between loading the filter and exec'ing the workload (`write` cannot be notified at all,
/// and the Go runtime's threads call the rest as timing has it), and the hottest calls of
/// any workload, which would otherwise cost a round trip each.
pub const ALWAYS: &[&str] = &[
    "brk",
    "close",
    "epoll_ctl",
    "epoll_pwait",
    "execve",
    "exit",
    "exit_group",
    "fcntl",
    "futex",
    "getpid",
    "gettid",
    "madvise",
    "mmap",
    "munmap",
    "nanosleep",
    "read",
    "restart_syscall",
    "rt_sigprocmask",
    "rt_sigreturn",
    "sched_yield",
    "sigaltstack",
    "tgkill",
    "write",
];

#[derive(Debug, Error)]
pub enum RecordError {
    #[error("{0}")]
    Refused(String),
    #[error("recorded profile {path}: {source}")]
    Io { path: PathBuf, source: std::io::Error },
    #[error("recorded profile {path}: not an OCI seccomp profile: {why}")]
    Parse { path: PathBuf, why: String },
}

/// Where a container's recording goes.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Recording {
    pub name: String,
    pub dir: PathBuf,
}

impl Recording {
    pub fn json_path(&self) -> PathBuf {
        self.dir.join(format!("{}.json", self.name))
    }

    pub fn yaml_path(&self) -> PathBuf {
        self.dir.join(format!("{}.yaml", self.name))
    }
}

/// The recording `doc` asks for, if any; refused when recording is off (`dir` empty) or the
/// name could not be an object's.
pub fn plan(doc: &Value, dir: &Path) -> Result<Option<Recording>, String> {
    let key = format!("/annotations/{}", RECORD_ANNOTATION.replace('/', "~1"));
    let Some(name) = doc.pointer(&key).and_then(Value::as_str) else {
        return Ok(None);
    };
    if dir.as_os_str().is_empty() {
        return Err(format!(
            "{RECORD_ANNOTATION}={name:?}: recording is off on this node (security.seccomp_recording_dir is empty)"
        ));
    }
    check_name(name).map_err(|why| format!("{RECORD_ANNOTATION}={name:?}: {why}"))?;
    Ok(Some(Recording {
        name: name.to_string(),
        dir: dir.to_path_buf(),
    }))
}

/// A DNS subdomain name as Kubernetes objects have (the YAML's `metadata.name`), which is also
/// a safe file name.
pub fn check_name(name: &str) -> Result<(), String> {
    let ok_char = |c: char| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-' || c == '.';
    let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_lowercase() || c.is_ascii_digit());
    if name.is_empty() || name.len() > 253 || !name.chars().all(ok_char) {
        return Err("a profile name is 1-253 of a-z, 0-9, '-' and '.'".into());
    }
    if !alnum(name.chars().next()) || !alnum(name.chars().last()) {
        return Err("a profile name starts and ends with a letter or digit".into());
    }
    Ok(())
}

/// Every name the host's libseccomp knows on the native architecture, sorted.
fn native_names() -> BTreeSet<String> {
    let arch = ScmpArch::native();
    (0..1024)
        .filter_map(|nr| ScmpSyscall::from(nr).get_name_by_arch(arch).ok())
        .collect()
}

/// The recording filter: [`ALWAYS`] (less `watched`) allowed, every other known name notified
/// at `listener`; a name libseccomp does not know is allowed unrecorded.
pub fn filter(listener: &Path, watched: &[String]) -> Value {
    let always = |n: &str| ALWAYS.contains(&n) && !watched.iter().any(|w| w == n);
    let notified: Vec<String> = native_names().into_iter().filter(|n| !always(n)).collect();
    let allowed: Vec<&str> = ALWAYS.iter().copied().filter(|n| always(n)).collect();
    json!({
        "defaultAction": "SCMP_ACT_ALLOW",
        "architectures": super::seccomp::architectures(std::env::consts::ARCH),
        "syscalls": [
            {"names": allowed, "action": "SCMP_ACT_ALLOW"},
            {"names": notified, "action": "SCMP_ACT_NOTIFY"}
        ],
        "listenerPath": listener.display().to_string(),
    })
}

/// The profile that allows `names` and [`ALWAYS`], and denies everything else with EPERM.
pub fn profile(names: &BTreeSet<String>) -> Value {
    let mut all = names.clone();
    all.extend(ALWAYS.iter().map(|s| s.to_string()));
    json!({
        "defaultAction": "SCMP_ACT_ERRNO",
        "architectures": super::seccomp::architectures(std::env::consts::ARCH),
        "syscalls": [{"names": all, "action": "SCMP_ACT_ALLOW"}],
    })
}

/// The allowed names of a profile this module wrote.
fn allowed_names(profile: &Value) -> Option<BTreeSet<String>> {
    let rules = profile.get("syscalls")?.as_array()?;
    let mut out = BTreeSet::new();
    for rule in rules.iter().filter(|r| r["action"] == "SCMP_ACT_ALLOW") {
        out.extend(
            rule["names"]
                .as_array()?
                .iter()
                .filter_map(Value::as_str)
                .map(String::from),
        );
    }
    Some(out)
}

#[derive(Serialize)]
#[serde(rename_all = "camelCase")]
struct SpoProfile<'a> {
    api_version: &'static str,
    kind: &'static str,
    metadata: SpoMeta<'a>,
    spec: &'a Value,
}

#[derive(Serialize)]
struct SpoMeta<'a> {
    name: &'a str,
}

/// `profile` as a security-profiles-operator `SeccompProfile` object.
pub fn spo_yaml(name: &str, profile: &Value) -> String {
    let object = SpoProfile {
        api_version: "security-profiles-operator.x-k8s.io/v1beta1",
        kind: "SeccompProfile",
        metadata: SpoMeta { name },
        spec: profile,
    };
    serde_yaml_ng::to_string(&object).unwrap_or_default()
}

/// What [`save`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Saved {
    pub path: PathBuf,
    /// Names the profile allows, and how many of them this save added.
    pub allowed: usize,
    pub added: usize,
}

/// Merges `observed` into `rec`'s profile (creating it) and writes both files, under a lock
/// shared by every daemon on the node: containers recording one name add up.
pub fn save(rec: &Recording, observed: &BTreeSet<String>) -> Result<Saved, RecordError> {
    let io = |path: &Path| {
        let path = path.to_path_buf();
        move |source| RecordError::Io { path, source }
    };
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o755)
        .create(&rec.dir)
        .map_err(io(&rec.dir))?;
    let lock_path = rec.dir.join(format!(".{}.lock", rec.name));
    let lock = OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .mode(0o600)
        .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
        .open(&lock_path)
        .map_err(io(&lock_path))?;
    let _lock =
        nix::fcntl::Flock::lock(lock, nix::fcntl::FlockArg::LockExclusive).map_err(|(_, e)| RecordError::Io {
            path: lock_path.clone(),
            source: e.into(),
        })?;
    let json_path = rec.json_path();
    let before = match read(&json_path) {
        Ok(v) => allowed_names(&v).ok_or_else(|| RecordError::Parse {
            path: json_path.clone(),
            why: "no allowed syscalls".into(),
        })?,
        Err(RecordError::Io { source, .. }) if source.kind() == std::io::ErrorKind::NotFound => BTreeSet::new(),
        Err(e) => return Err(e),
    };
    let mut names = before.clone();
    names.extend(observed.iter().cloned());
    let profile = profile(&names);
    let mut text = serde_json::to_string_pretty(&profile).unwrap_or_default();
    text.push('\n');
    crate::files::write_atomic(&json_path, text.as_bytes()).map_err(io(&json_path))?;
    let yaml_path = rec.yaml_path();
    crate::files::write_atomic(&yaml_path, spo_yaml(&rec.name, &profile).as_bytes()).map_err(io(&yaml_path))?;
    let allowed = allowed_names(&profile).map_or(0, |n| n.len());
    Ok(Saved {
        path: json_path,
        allowed,
        added: allowed.saturating_sub(before.len()),
    })
}

/// Reads a recorded profile's JSON (a link is refused: the directory is the node's).
pub fn read(path: &Path) -> Result<Value, RecordError> {
    let mut text = String::new();
    File::options()
        .read(true)
        .custom_flags(libc::O_NOFOLLOW)
        .open(path)
        .and_then(|mut f| f.read_to_string(&mut text))
        .map_err(|source| RecordError::Io {
            path: path.to_path_buf(),
            source,
        })?;
    serde_json::from_str(&text).map_err(|e| RecordError::Parse {
        path: path.to_path_buf(),
        why: e.to_string(),
    })
}

/// `seccomp-profile --recorded NAME`: the recorded profile's JSON as written.
pub fn recorded_json(dir: &Path, name: &str) -> Result<String, RecordError> {
    if dir.as_os_str().is_empty() {
        return Err(RecordError::Refused(
            "recording is off on this node (security.seccomp_recording_dir is empty)".into(),
        ));
    }
    check_name(name).map_err(RecordError::Refused)?;
    let rec = Recording {
        name: name.to_string(),
        dir: dir.to_path_buf(),
    };
    let profile = read(&rec.json_path())?;
    let mut out = serde_json::to_string_pretty(&profile).unwrap_or_default();
    out.push('\n');
    Ok(out)
}

#[cfg(test)]
#[path = "record_tests.rs"]
mod tests;
