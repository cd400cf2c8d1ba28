//! The sandbox fast path: a pod's infra ("pause") container started by gantry itself instead
//! of `runc create`/`runc start`.
//!
//! Why: a pause container is the same small program in every pod, yet `runc create` costs it
//! two Go runtime start-ups and most of a pod start (CRI-O always creates one for a `vm`
//! handler). gantry re-executes its own binary as the container's init (`sandbox-init`), which
//! applies the subset of the OCI spec a pause container uses, exactly as runc applies it, and
//! waits for Start to exec the program.
//!
//! Handled: namespaces (joined by path, as CRI-O's `pinns` leaves them, or new), the cgroup
//! (cgroupfs driver with an absolute `cgroupsPath`, or on a v2 host with systemd the systemd
//! driver's `slice:prefix:name` scope; resources through libcgroups; on v1 every mounted
//! hierarchy joined as runc joins them, on v2 runc's device rules as an eBPF filter), `oomScoreAdj`, rlimits, hostname and
//! domainname, sysctls, the rootfs (pivoted into, read-only where asked, propagation) and its
//! `bind`/`proc`/`sysfs`/`tmpfs`/`devpts`/`mqueue` mounts, runc's default device nodes and
//! `linux.devices`, masked and read-only paths, user, groups and umask, the five capability
//! sets, `noNewPrivileges` and seccomp (libseccomp).
//!
//! Where it is faster than runc beyond skipping runc's two Go start-ups: the init joins its v1
//! cgroups without the kernel's global migration lock ([`cgroup_entry`]), and the daemon
//! compiles the seccomp filter while the init sets up, once per node and profile ([`seccomp`]).
//!
//! Anything else goes to the OCI runtime, and the reason is logged ([`check`] names it): the
//! systemd cgroup driver on a v1 host or without systemd, user namespaces,
//! hooks, a terminal, AppArmor and SELinux labels, `cgroup` mounts, seccomp notification, and
//! any field of `process` or `linux` this module does not know.

pub(crate) mod cgroup;
mod cgroup_entry;
pub mod check;
mod creds;
mod devfilter;
pub mod init;
mod rootfs;
pub mod runtime;
mod seccomp;
pub(crate) mod systemd;

pub use check::{check, is_pause, is_sandbox, Fallback};
pub use runtime::FastSandbox;

/// The `binary` a fast-path container's runtime record names: `delete` (after a daemon died)
/// cleans such a container up itself rather than asking an OCI runtime that never knew it.
pub const RECORD_BINARY: &str = "gantry-sandbox-init";

/// File descriptors `sandbox-init` finds at start: where it reports (`ok` or an error), and
/// the pipe Start writes to.
pub const SYNC_FD: i32 = 3;
pub const START_FD: i32 = 4;
/// Compiled seccomp filters, under the OCI runtime's root (no engine namespace starts with a
/// dot, so no runtime state directory takes this name).
pub const SECCOMP_CACHE: &str = ".seccomp-cache";

/// Where `sandbox-init` reads the seccomp program the daemon compiled ([`seccomp`]).
pub const SECCOMP_FD: i32 = 5;

use std::collections::HashMap;
use std::path::Path;

use serde::Deserialize;

use crate::config::Config;
use crate::reaper::Reaper;
use crate::runtime::RuntimeIdentity;

/// The fast path's runtime for this container, `None` when it is not a pause container (or
/// the fast path is off), or why a pause container goes to the OCI runtime. `spec` is the
/// spec as the runtime would read it (after gantry's edits); `oci` the runtime it would go to.
pub fn fast_path(
    bundle: &Path,
    annotations: &HashMap<String, String>,
    spec: &crate::spec::Edited,
    config: &Config,
    oci: &RuntimeIdentity,
    reaper: &Reaper,
) -> Result<Option<FastSandbox>, Fallback> {
    if !config.runtime.sandbox_fast_path || !is_sandbox(annotations) {
        return Ok(None);
    }
    let doc = spec.document().map_err(|e| Fallback(format!("config.json: {e}")))?;
    let spec = doc.as_ref();
    if !is_pause(spec) {
        return Ok(None);
    }
    if oci_spec::runtime::Spec::deserialize(spec).is_err() {
        return Err(Fallback("the spec holds values gantry does not model".into()));
    }
    if libcgroups::common::get_cgroup_setup().is_err() {
        return Err(Fallback("the host's cgroup mode is unknown".into()));
    }
    check(spec, oci.systemd_cgroup)?;
    let cgroup = spec
        .pointer("/linux/cgroupsPath")
        .and_then(serde_json::Value::as_str)
        .unwrap_or("");
    let sandbox = FastSandbox::new(
        bundle,
        cgroup.into(),
        oci.root.clone(),
        config.runtime.timeouts,
        reaper.clone(),
    )
    .with_spec(spec, config.runtime.root.join(SECCOMP_CACHE));
    Ok(Some(sandbox))
}

/// How long a new daemon keeps the cgroup migration lock warm (`cgroups::warm`) when its
/// pod's sandbox is to have systemd move the init into a scope: the pod's Create follows the
/// daemon's start within milliseconds, and the first warm-up write, which waits out an RCU
/// grace period, is then mostly done before systemd's own write comes. Create holds it on for
/// as long as it takes.
pub const STARTUP_WARM: std::time::Duration = std::time::Duration::from_millis(200);

/// Called once as the daemon starts: warms the migration lock for [`STARTUP_WARM`] where the
/// fast path would start sandboxes through systemd.
pub fn warm_for_systemd_scopes(config: &Config) {
    let runtime = &config.runtime;
    if runtime.sandbox_fast_path
        && runtime.systemd_cgroup != crate::config::CgroupDriver::Cgroupfs
        && check::Driver::on_this_host(true) == check::Driver::Systemd
    {
        crate::cgroups::warm::hold_for(STARTUP_WARM);
    }
}
