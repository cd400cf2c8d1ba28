//! One lifecycle event as a line of the event log (schema version 1, documented in docs/telemetry.md).
//! The same record type is written by the daemons and read back by the exporter, so the two
//! cannot drift apart. Optional fields are left out of the line when they do not apply.

use std::collections::HashMap;
use std::time::SystemTime;

use serde::{Deserialize, Serialize};

use crate::logging;

/// Schema version written into every line (`"v"`).
pub const SCHEMA_VERSION: u32 = 1;

/// What happened. Serialized in snake_case (`"exec_started"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Kind {
    Create,
    Start,
    /// Init's exit (`exec_id` absent) or an exec's (`exec_id` set): code, signal, OOM.
    Exit,
    Delete,
    ExecAdded,
    ExecStarted,
    Paused,
    Resumed,
    Updated,
    /// Devices gantry put into the spec at Create (`devices`).
    DevicesInjected,
    /// A security-policy decision (`decision`, `reason`), reported by the policy code.
    Policy,
    /// An OCI runtime call failed (`rpc`, `call`, `message`).
    RuntimeError,
    /// Events this daemon could not log earlier (`count`), written once the log works again.
    Dropped,
    /// Watched syscalls a container made (`syscall`, `arch`, `pid`, `decision`: the action
    /// taken; `count`: calls this line stands for, since lines are rate-limited).
    Seccomp,
    /// A recorded seccomp profile was saved (`reason`: its name; `message`: its JSON file;
    /// `count`: the names it allows).
    SeccompProfile,
}

impl Kind {
    pub fn as_str(self) -> &'static str {
        match self {
            Kind::Create => "create",
            Kind::Start => "start",
            Kind::Exit => "exit",
            Kind::Delete => "delete",
            Kind::ExecAdded => "exec_added",
            Kind::ExecStarted => "exec_started",
            Kind::Paused => "paused",
            Kind::Resumed => "resumed",
            Kind::Updated => "updated",
            Kind::DevicesInjected => "devices_injected",
            Kind::Policy => "policy",
            Kind::RuntimeError => "runtime_error",
            Kind::Dropped => "dropped",
            Kind::Seccomp => "seccomp",
            Kind::SeccompProfile => "seccomp_profile",
        }
    }
}

/// Who a container belongs to, from the engine's annotations (CRI-O or containerd CRI).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PodMeta {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_namespace: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pod_uid: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub container: Option<String>,
}

/// Annotation keys per field, CRI-O's first (it sets both its own and the Kubernetes ones).
const POD_NAME: &[&str] = &[
    "io.kubernetes.pod.name",
    "io.kubernetes.cri-o.KubeName",
    "io.kubernetes.cri.sandbox-name",
];
const POD_NAMESPACE: &[&str] = &["io.kubernetes.pod.namespace", "io.kubernetes.cri.sandbox-namespace"];
const POD_UID: &[&str] = &["io.kubernetes.pod.uid", "io.kubernetes.cri.sandbox-uid"];
const CONTAINER_NAME: &[&str] = &[
    "io.kubernetes.container.name",
    "io.kubernetes.cri-o.ContainerName",
    "io.kubernetes.cri.container-name",
];

impl PodMeta {
    pub fn from_annotations(a: &HashMap<String, String>) -> Self {
        let pick = |keys: &[&str]| keys.iter().find_map(|k| a.get(*k).filter(|v| !v.is_empty()).cloned());
        Self {
            pod: pick(POD_NAME),
            pod_namespace: pick(POD_NAMESPACE),
            pod_uid: pick(POD_UID),
            container: pick(CONTAINER_NAME),
        }
    }
}

/// One line of the event log.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Record {
    pub v: u32,
    /// RFC 3339, UTC, microseconds.
    pub ts: String,
    pub event: Kind,
    /// Container id (empty only for `dropped`).
    pub id: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exec_id: Option<String>,
    /// Engine namespace (`k8s.io`, `default`, ...).
    pub ns: String,
    /// The runtime handler (`gantry` for `containerd-shim-gantry-v2`).
    pub handler: String,
    #[serde(flatten)]
    pub pod: PodMeta,
    /// How long gantry took to serve the request (Create, Start, Exec, Delete, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub duration_ms: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pid: Option<u32>,
    /// Exit code as the engines report it (128 + signal for a killed process).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exit_code: Option<u32>,
    /// The signal that ended the process, when it was killed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub signal: Option<u32>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub oom_killed: Option<bool>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub devices: Vec<String>,
    /// `policy`: `allow`, `deny` or `warn`; `seccomp`: `log`, `deny` or `kill`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decision: Option<String>,
    /// `policy`: a short, low-cardinality reason (used as a metric label).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// `runtime_error`: the Task RPC being served.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rpc: Option<String>,
    /// `runtime_error`: the OCI runtime command that failed (`create`, `exec`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub call: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// `dropped`: how many events were lost.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub count: Option<u64>,
    /// `seccomp`: the watched call, by name, and the architecture it was made for.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub syscall: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub arch: Option<String>,
    /// W3C trace context of the request that caused the event.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traceparent: Option<String>,
}

impl Record {
    /// A record of `kind` for container `id`, stamped now; the rest is filled by the caller.
    pub fn new(kind: Kind, id: &str, ns: &str, handler: &str) -> Self {
        Self {
            v: SCHEMA_VERSION,
            ts: logging::rfc3339(SystemTime::now(), logging::Fraction::Micros),
            event: kind,
            id: id.to_string(),
            exec_id: None,
            ns: ns.to_string(),
            handler: handler.to_string(),
            pod: PodMeta::default(),
            duration_ms: None,
            pid: None,
            exit_code: None,
            signal: None,
            oom_killed: None,
            devices: Vec::new(),
            decision: None,
            reason: None,
            rpc: None,
            call: None,
            message: None,
            count: None,
            syscall: None,
            arch: None,
            traceparent: None,
        }
    }

    /// The JSON line, newline included, ready for one `write`.
    pub fn to_line(&self) -> Vec<u8> {
        let mut line = serde_json::to_vec(self).unwrap_or_default();
        line.push(b'\n');
        line
    }

    /// Why a process ended, as the metrics label it: `oom`, `signal` or `normal`.
    pub fn exit_reason(&self) -> &'static str {
        if self.oom_killed == Some(true) {
            "oom"
        } else if self.signal.is_some() {
            "signal"
        } else {
            "normal"
        }
    }
}

/// The handler name from the binary's name (`containerd-shim-<handler>-v2`), as the engines
/// derive it; `gantry` when the binary was renamed otherwise.
pub fn handler_from_argv0(argv0: &str) -> String {
    let base = argv0.rsplit('/').next().unwrap_or(argv0);
    base.strip_prefix("containerd-shim-")
        .and_then(|s| s.strip_suffix("-v2"))
        .filter(|s| !s.is_empty())
        .unwrap_or("gantry")
        .to_string()
}

/// The handler of this process.
pub fn this_handler() -> String {
    handler_from_argv0(&std::env::args().next().unwrap_or_default())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pod_meta_from_either_engine() {
        let crio: HashMap<String, String> = [
            ("io.kubernetes.pod.name", "web-0"),
            ("io.kubernetes.pod.namespace", "shop"),
            ("io.kubernetes.pod.uid", "u-1"),
            ("io.kubernetes.container.name", "nginx"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let m = PodMeta::from_annotations(&crio);
        assert_eq!(m.pod.as_deref(), Some("web-0"));
        assert_eq!(m.container.as_deref(), Some("nginx"));
        let cri: HashMap<String, String> = [
            ("io.kubernetes.cri.sandbox-name", "db-1"),
            ("io.kubernetes.cri.sandbox-namespace", "data"),
            ("io.kubernetes.cri.sandbox-uid", "u-2"),
            ("io.kubernetes.cri.container-name", "pg"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        let m = PodMeta::from_annotations(&cri);
        assert_eq!(
            (m.pod_namespace.as_deref(), m.pod_uid.as_deref()),
            (Some("data"), Some("u-2"))
        );
        assert_eq!(PodMeta::from_annotations(&HashMap::new()), PodMeta::default());
    }

    #[test]
    fn lines_roundtrip_and_leave_out_what_does_not_apply() {
        let mut r = Record::new(Kind::Exit, "c1", "k8s.io", "gantry");
        r.exit_code = Some(137);
        r.signal = Some(9);
        r.oom_killed = Some(true);
        r.pod.pod = Some("p".into());
        let line = r.to_line();
        assert_eq!(line.last(), Some(&b'\n'));
        let text = String::from_utf8(line.clone()).unwrap();
        assert!(
            text.contains(r#""event":"exit""#) && text.contains(r#""pod":"p""#),
            "{text}"
        );
        assert!(!text.contains("exec_id") && !text.contains("devices"), "{text}");
        let back: Record = serde_json::from_slice(&line).unwrap();
        assert_eq!(back, r);
        assert_eq!(back.exit_reason(), "oom");
    }

    #[test]
    fn handler_comes_from_the_binary_name() {
        assert_eq!(handler_from_argv0("/usr/bin/containerd-shim-gantry-v2"), "gantry");
        assert_eq!(handler_from_argv0("containerd-shim-gpu-v2"), "gpu");
        assert_eq!(handler_from_argv0("/tmp/deps/integration-abc"), "gantry");
    }
}
