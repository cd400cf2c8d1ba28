//! Which containers the fast path takes: pure functions over the final `config.json`.

use std::collections::HashMap;
use std::fmt;

use serde_json::Value;

use crate::spec::{CRIO_CONTAINER_TYPE, CRI_CONTAINER_TYPE};

/// Why a sandbox container goes to the OCI runtime instead (logged).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Fallback(pub String);

impl fmt::Display for Fallback {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

fn fallback<T>(why: impl Into<String>) -> Result<T, Fallback> {
    Err(Fallback(why.into()))
}

/// The engine says this is a pod's infra container.
pub fn is_sandbox(annotations: &HashMap<String, String>) -> bool {
    [CRIO_CONTAINER_TYPE, CRI_CONTAINER_TYPE]
        .iter()
        .any(|k| annotations.get(*k).map(String::as_str) == Some("sandbox"))
}

/// The process is a pause program: one argument whose file name is `pause` (the Kubernetes
/// pause image runs `/pause`).
pub fn is_pause(doc: &Value) -> bool {
    let args = doc.pointer("/process/args").and_then(Value::as_array);
    match args.map(Vec::as_slice) {
        Some([Value::String(a)]) => a.rsplit('/').next() == Some("pause"),
        _ => false,
    }
}

/// Keys of each object the fast path applies; any other key with a non-empty value sends the
/// container to the OCI runtime (a field newer than this code may restrict something).
const TOP: &[&str] = &[
    "ociVersion",
    "process",
    "root",
    "hostname",
    "domainname",
    "mounts",
    "linux",
    "annotations",
    "hooks",
];
const PROCESS: &[&str] = &[
    "terminal",
    "consoleSize",
    "user",
    "args",
    "env",
    "cwd",
    "capabilities",
    "rlimits",
    "noNewPrivileges",
    "oomScoreAdj",
    "apparmorProfile",
    "selinuxLabel",
];
const USER: &[&str] = &["uid", "gid", "umask", "additionalGids"];
const LINUX: &[&str] = &[
    "namespaces",
    "uidMappings",
    "gidMappings",
    "devices",
    "cgroupsPath",
    "resources",
    "sysctl",
    "seccomp",
    "rootfsPropagation",
    "maskedPaths",
    "readonlyPaths",
    "mountLabel",
];
const SECCOMP: &[&str] = &["defaultAction", "defaultErrnoRet", "architectures", "syscalls"];
const MOUNT_TYPES: &[&str] = &["bind", "proc", "sysfs", "tmpfs", "devpts", "mqueue"];
const NAMESPACES: &[&str] = &["pid", "network", "mount", "ipc", "uts", "cgroup"];

fn is_empty(v: &Value) -> bool {
    match v {
        Value::Null => true,
        Value::Bool(b) => !b,
        Value::String(s) => s.is_empty(),
        Value::Array(a) => a.is_empty(),
        Value::Object(o) => o.values().all(is_empty),
        Value::Number(_) => false,
    }
}

/// The first key of `obj` (at `at`) outside `known` that holds something.
fn unknown_keys(obj: Option<&Value>, known: &[&str], at: &str) -> Result<(), Fallback> {
    let Some(Value::Object(map)) = obj else {
        return Ok(());
    };
    match map.iter().find(|(k, v)| !known.contains(&k.as_str()) && !is_empty(v)) {
        Some((k, _)) => fallback(format!("{at}{k} is not handled by the fast path")),
        None => Ok(()),
    }
}

/// The cgroup driver the fast path would use, as the host allows it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Driver {
    Cgroupfs,
    /// systemd on a v2 host: scopes through libcgroups' systemd manager.
    Systemd,
    /// systemd configured where the fast path cannot drive it, and why.
    SystemdUnusable(&'static str),
}

impl Driver {
    /// The configured driver (`systemd`: the runtime's `systemd_cgroup`) on this host.
    pub fn on_this_host(systemd: bool) -> Driver {
        match systemd {
            false => Driver::Cgroupfs,
            // libcgroups drives systemd on v2 only; runc's v1 systemd driver also joins the
            // controllers systemd does not manage, which the fast path does not do.
            true if !super::cgroup::host_is_v2() => {
                Driver::SystemdUnusable("the systemd cgroup driver on a cgroup v1 host")
            }
            true if !libcgroups::systemd::booted() => {
                Driver::SystemdUnusable("the systemd cgroup driver without systemd running")
            }
            // The init's D-Bus reader takes little-endian messages only.
            true if cfg!(target_endian = "big") => {
                Driver::SystemdUnusable("the systemd cgroup driver on a big-endian host")
            }
            true if super::systemd::system_bus().is_none() => {
                Driver::SystemdUnusable("the systemd cgroup driver without a D-Bus system bus")
            }
            true => Driver::Systemd,
        }
    }
}

/// `Ok` when the fast path applies everything `doc` asks for; else why not. `systemd` is the
/// configured cgroup driver.
pub fn check(doc: &Value, systemd: bool) -> Result<(), Fallback> {
    check_with(doc, Driver::on_this_host(systemd), is_host_netns)
}

/// Whether the namespace file at `path` is this process's (the host's) network namespace.
fn is_host_netns(path: &str) -> bool {
    use std::os::unix::fs::MetadataExt;
    match (std::fs::metadata(path), std::fs::metadata("/proc/self/ns/net")) {
        (Ok(a), Ok(b)) => a.dev() == b.dev() && a.ino() == b.ino(),
        _ => false,
    }
}

/// [`check`] with the host-network-namespace test given (unit tests fake it).
pub fn check_with(doc: &Value, driver: Driver, host_netns: impl Fn(&str) -> bool) -> Result<(), Fallback> {
    if let Driver::SystemdUnusable(why) = driver {
        return fallback(why);
    }
    unknown_keys(Some(doc), TOP, "")?;
    unknown_keys(doc.get("process"), PROCESS, "process.")?;
    unknown_keys(doc.pointer("/process/user"), USER, "process.user.")?;
    unknown_keys(doc.get("linux"), LINUX, "linux.")?;
    unknown_keys(doc.pointer("/linux/seccomp"), SECCOMP, "linux.seccomp.")?;
    let set = |p: &str| doc.pointer(p).is_some_and(|v| !is_empty(v));
    for (path, what) in [
        ("/hooks", "hooks"),
        ("/process/terminal", "a terminal"),
        ("/process/apparmorProfile", "an AppArmor profile"),
        ("/process/selinuxLabel", "an SELinux label"),
        ("/linux/mountLabel", "an SELinux mount label"),
        ("/linux/uidMappings", "user namespace mappings"),
        ("/linux/gidMappings", "user namespace mappings"),
    ] {
        if set(path) {
            return fallback(what);
        }
    }
    check_cgroups_path(doc, driver)?;
    check_namespaces(doc)?;
    check_names_and_sysctls(doc, &host_netns)?;
    check_mounts(doc)?;
    check_capabilities(doc)?;
    check_seccomp(doc)
}

fn check_cgroups_path(doc: &Value, driver: Driver) -> Result<(), Fallback> {
    let cgroups_path = doc.pointer("/linux/cgroupsPath").and_then(Value::as_str).unwrap_or("");
    if driver == Driver::Systemd {
        if super::cgroup::systemd_unit(std::path::Path::new(cgroups_path)).is_none() {
            return fallback(format!(
                "cgroupsPath {cgroups_path:?} is not a systemd slice:prefix:name path"
            ));
        }
        // Unit properties from annotations, as runc sends them with the scope.
        let annotations: HashMap<String, String> = doc
            .get("annotations")
            .and_then(|a| serde_json::from_value(a.clone()).ok())
            .unwrap_or_default();
        if let Err(key) = super::systemd::annotation_properties(&annotations) {
            return fallback(format!("annotation {key} is not a unit property the fast path sends"));
        }
        return Ok(());
    }
    if !cgroups_path.starts_with('/') || cgroups_path.contains(':') {
        return fallback(format!("cgroupsPath {cgroups_path:?} is not an absolute cgroupfs path"));
    }
    // The init joins each hierarchy's mount point with this path; runc cleans `.` and `..`
    // away first (so such a path stays under the mount). Left to runc to clean.
    if cgroups_path.split('/').any(|c| c == "." || c == "..") {
        return fallback(format!("cgroupsPath {cgroups_path:?} has `.` or `..` components"));
    }
    Ok(())
}

fn check_namespaces(doc: &Value) -> Result<(), Fallback> {
    let list = doc.pointer("/linux/namespaces").and_then(Value::as_array);
    let mut mount = false;
    for ns in list.into_iter().flatten() {
        let kind = ns.get("type").and_then(Value::as_str).unwrap_or("");
        if !NAMESPACES.contains(&kind) {
            return fallback(format!("a {kind:?} namespace"));
        }
        let joined = ns.get("path").is_some_and(|p| !is_empty(p));
        if kind == "mount" {
            if joined {
                return fallback("joining an existing mount namespace");
            }
            mount = true;
        }
    }
    if !mount {
        return fallback("no new mount namespace");
    }
    Ok(())
}

/// The path of the `kind` namespace entry: `Some("")` when it is new, `None` when absent.
fn namespace<'a>(doc: &'a Value, kind: &str) -> Option<&'a str> {
    let list = doc.pointer("/linux/namespaces").and_then(Value::as_array)?;
    let ns = list
        .iter()
        .find(|n| n.get("type").and_then(Value::as_str) == Some(kind))?;
    Some(ns.get("path").and_then(Value::as_str).unwrap_or(""))
}

/// IPC sysctls runc allows in a container with its own IPC namespace.
const IPC_SYSCTLS: &[&str] = &[
    "kernel.msgmax",
    "kernel.msgmnb",
    "kernel.msgmni",
    "kernel.sem",
    "kernel.shmall",
    "kernel.shmmax",
    "kernel.shmmni",
    "kernel.shm_rmid_forced",
];

/// What runc's validator refuses about hostname, domainname and sysctls goes to runc, which
/// refuses it with its own message: a sysctl outside the container's namespaces would
/// otherwise be written to the host's kernel.
fn check_names_and_sysctls(doc: &Value, host_netns: &impl Fn(&str) -> bool) -> Result<(), Fallback> {
    let uts = namespace(doc, "uts").is_some();
    for key in ["hostname", "domainname"] {
        if !uts && doc.get(key).and_then(Value::as_str).is_some_and(|h| !h.is_empty()) {
            return fallback(format!("{key} without a UTS namespace"));
        }
    }
    let sysctls = doc.pointer("/linux/sysctl").and_then(Value::as_object);
    for key in sysctls.into_iter().flat_map(|m| m.keys()) {
        let allowed = if IPC_SYSCTLS.contains(&key.as_str()) || key.starts_with("fs.mqueue.") {
            namespace(doc, "ipc").is_some()
        } else if key.starts_with("net.") {
            namespace(doc, "network").is_some_and(|p| p.is_empty() || !host_netns(p))
        } else {
            uts && key == "kernel.domainname"
        };
        if !allowed {
            return fallback(format!("sysctl {key:?} is not in a namespace of the container's own"));
        }
    }
    Ok(())
}

fn check_mounts(doc: &Value) -> Result<(), Fallback> {
    let list = doc.get("mounts").and_then(Value::as_array);
    for m in list.into_iter().flatten() {
        let options: Vec<&str> = m
            .get("options")
            .and_then(Value::as_array)
            .map(|o| o.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let bind = options.iter().any(|o| *o == "bind" || *o == "rbind");
        let kind = m
            .get("type")
            .and_then(Value::as_str)
            .unwrap_or(if bind { "bind" } else { "" });
        if !MOUNT_TYPES.contains(&kind) && !bind {
            return fallback(format!("a {kind:?} mount"));
        }
        if let Some(o) = options
            .iter()
            .find(|o| o.starts_with("idmap") || o.starts_with("ridmap") || o.starts_with("tmpcopyup"))
        {
            return fallback(format!("mount option {o:?}"));
        }
        if m.get("uidMappings").is_some_and(|v| !is_empty(v)) || m.get("gidMappings").is_some_and(|v| !is_empty(v)) {
            return fallback("an id-mapped mount");
        }
        let dest = m.get("destination").and_then(Value::as_str).unwrap_or("");
        if !dest.starts_with('/') {
            return fallback(format!("mount destination {dest:?} is not absolute"));
        }
    }
    Ok(())
}

fn check_capabilities(doc: &Value) -> Result<(), Fallback> {
    let caps = doc.pointer("/process/capabilities").and_then(Value::as_object);
    for (set, list) in caps.into_iter().flatten() {
        for name in list.as_array().into_iter().flatten() {
            let name = name.as_str().unwrap_or("");
            if super::creds::cap_number(name).is_none() {
                return fallback(format!("capability {name:?} in process.capabilities.{set}"));
            }
        }
    }
    Ok(())
}

fn check_seccomp(doc: &Value) -> Result<(), Fallback> {
    let rules = doc.pointer("/linux/seccomp/syscalls").and_then(Value::as_array);
    for r in rules.into_iter().flatten() {
        let action = r.get("action").and_then(Value::as_str).unwrap_or("");
        if action == "SCMP_ACT_NOTIFY" {
            return fallback("seccomp notification");
        }
    }
    Ok(())
}

#[cfg(test)]
#[path = "check_tests.rs"]
mod tests;
