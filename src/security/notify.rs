//! Watched syscalls (`seccomp_notify`): which calls of a container the kernel hands to the
//! daemon instead of deciding them itself, as edits to the container's seccomp profile. Each
//! watched name becomes an `SCMP_ACT_NOTIFY` rule, whatever the profile did with it before,
//! and `listenerPath` names the daemon's socket, to which the runtime sends the notification
//! fd after loading the filter. What the daemon then does with each call is
//! [`crate::notifier`]'s.
//!
//! `log` lets the call proceed (`SECCOMP_USER_NOTIF_FLAG_CONTINUE`): audit only, never a
//! security boundary, since the call runs as the profile without the rule would not have
//! decided. `deny` answers EPERM; `kill` answers EPERM and kills the container.

use std::path::Path;

use libseccomp::ScmpSyscall;
use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

use super::record::{self, Recording};
use super::seccomp::ProfileError;
use super::SecurityConfig;

/// CRI-O's per-pod switch for its own notifier: `stop` kills the container, anything else logs.
pub const CRIO_NOTIFIER_ANNOTATION: &str = "io.kubernetes.cri-o.seccompNotifierAction";
/// The same switch under the name CRI-O 1.37 introduced (it still honours the old one).
pub const CRIO_NOTIFIER_ANNOTATION_V2: &str = "seccomp-notifier-action.crio.io";
/// Records the watch in the spec (`crictl inspect`): `deny:unshare,mount`, or `engine` when the
/// engine had set a listener of its own.
pub const NOTIFY_ANNOTATION: &str = "gantry.dev/seccomp-notify";

/// What the daemon does with a watched call.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum NotifyAction {
    #[default]
    Log,
    Deny,
    Kill,
}

impl NotifyAction {
    pub fn as_str(self) -> &'static str {
        match self {
            NotifyAction::Log => "log",
            NotifyAction::Deny => "deny",
            NotifyAction::Kill => "kill",
        }
    }
}

/// Watched when a pod turns CRI-O's notifier on and `seccomp_notify` names nothing: the calls
/// with which a container probes its sandbox.
pub const ESCAPE_SYSCALLS: &[&str] = &[
    "unshare",
    "setns",
    "mount",
    "ptrace",
    "bpf",
    "keyctl",
    "init_module",
    "finit_module",
    "kexec_load",
];

/// A container's watch: the calls and what their notifications get, and whether every other
/// call is recorded ([`super::record`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Watch {
    pub action: NotifyAction,
    pub syscalls: Vec<String>,
    pub record: Option<Recording>,
}

impl Watch {
    /// The annotation value: `deny:unshare,mount`, `record:NAME`, or both joined by `;`.
    pub fn describe(&self) -> String {
        let watched = format!("{}:{}", self.action.as_str(), self.syscalls.join(","));
        match (&self.record, self.syscalls.is_empty()) {
            (None, _) => watched,
            (Some(r), true) => format!("record:{}", r.name),
            (Some(r), false) => format!("{watched};record:{}", r.name),
        }
    }
}

/// What [`plan`] decided for one container.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Plan {
    /// Nothing to watch: no list, no pod asking, privileged, or no profile.
    Off,
    /// The engine set `listenerPath` (CRI-O's notifier, an NRI plugin): its rules stay, none
    /// of gantry's are added.
    EngineListener(String),
    Watch(Watch),
}

/// Checks a `seccomp_notify` list as the config loads: names libseccomp knows, and not
/// `write`, which the runtime's own init needs after the filter is loaded (runc refuses it).
pub fn check_names(names: &[String]) -> Result<(), String> {
    for name in names {
        if name == "write" {
            return Err("\"write\" cannot be watched: the runtime writes after loading the filter".into());
        }
        if ScmpSyscall::from_name(name).is_err() {
            return Err(format!("{name:?} is not a syscall this host's libseccomp knows"));
        }
    }
    Ok(())
}

/// Whether this host can serve notifications as `action` needs: libseccomp API level 5
/// (notification fds) and, for `log`, a kernel of 5.5 or later (`FLAG_CONTINUE`). Refused by
/// name rather than run without the watch.
pub fn host_support(action: NotifyAction) -> Result<(), String> {
    let api = libseccomp::get_api();
    if api < 5 {
        return Err(format!(
            "this host's libseccomp (API level {api}) cannot hand out notification fds (needs 5)"
        ));
    }
    let release = nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut parts = release
        .split(|c: char| !c.is_ascii_digit())
        .map(|p| p.parse::<u32>().unwrap_or(0));
    let (major, minor) = (parts.next().unwrap_or(0), parts.next().unwrap_or(0));
    if action == NotifyAction::Log && (major, minor) < (5, 5) {
        return Err(format!(
            "kernel {release} cannot let a watched call continue (log needs 5.5)"
        ));
    }
    Ok(())
}

/// Decides the watch for `doc` (the whole config.json, after the policy's seccomp decision).
pub fn plan(doc: &Value, privileged: bool, cfg: &SecurityConfig) -> Plan {
    let annotations = doc.get("annotations");
    let pod = [CRIO_NOTIFIER_ANNOTATION_V2, CRIO_NOTIFIER_ANNOTATION]
        .into_iter()
        .find_map(|k| annotations.and_then(|a| a.get(k)).and_then(Value::as_str));
    let action = match pod {
        Some("stop") => NotifyAction::Kill,
        Some(_) => NotifyAction::Log,
        None => cfg.seccomp_notify_action,
    };
    let syscalls: Vec<String> = match (cfg.seccomp_notify.is_empty(), pod) {
        (false, _) => cfg.seccomp_notify.clone(),
        (true, Some(_)) => ESCAPE_SYSCALLS.iter().map(|s| s.to_string()).collect(),
        (true, None) => return Plan::Off,
    };
    let Some(seccomp) = doc.pointer("/linux/seccomp").filter(|v| v.is_object()) else {
        return Plan::Off;
    };
    if privileged {
        return Plan::Off;
    }
    if let Some(path) = seccomp
        .get("listenerPath")
        .and_then(Value::as_str)
        .filter(|p| !p.is_empty())
    {
        return Plan::EngineListener(path.to_string());
    }
    Plan::Watch(Watch {
        action,
        syscalls,
        record: None,
    })
}

/// Rewrites `doc`'s profile for `watch`: the watched names leave every rule (a rule left with
/// none goes), one `SCMP_ACT_NOTIFY` rule takes them, and `listenerPath` is `listener`. The
/// rest of the profile, fields gantry does not model included, stays as it was.
pub fn rewrite(doc: &mut Value, watch: &Watch, listener: &Path) -> Result<(), ProfileError> {
    let refuse = |why: String| ProfileError {
        rule: "linux.seccomp".into(),
        why,
        key: Some("security.seccomp_notify"),
    };
    check_names(&watch.syscalls).map_err(refuse)?;
    host_support(watch.action).map_err(refuse)?;
    if watch.record.is_some() {
        // The recording filter replaces the profile: every call but a fixed few is notified
        // and, unless watched, continued.
        host_support(NotifyAction::Log).map_err(refuse)?;
        doc["linux"]["seccomp"] = record::filter(listener, &watch.syscalls);
        return Ok(());
    }
    let Some(seccomp) = doc.pointer_mut("/linux/seccomp").and_then(Value::as_object_mut) else {
        return Err(refuse("no profile to add the rule to".into()));
    };
    let watched = |n: &Value| n.as_str().is_some_and(|n| watch.syscalls.iter().any(|w| w == n));
    let mut rules = match seccomp.remove("syscalls") {
        Some(Value::Array(rules)) => rules,
        _ => Vec::new(),
    };
    for rule in rules.iter_mut() {
        if let Some(names) = rule.get_mut("names").and_then(Value::as_array_mut) {
            names.retain(|n| !watched(n));
        }
    }
    rules.retain(|r| r.get("names").and_then(Value::as_array).is_none_or(|n| !n.is_empty()));
    rules.push(json!({"names": watch.syscalls, "action": "SCMP_ACT_NOTIFY"}));
    seccomp.insert("syscalls".into(), Value::Array(rules));
    seccomp.insert("listenerPath".into(), listener.display().to_string().into());
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn cfg(names: &[&str], action: NotifyAction) -> SecurityConfig {
        SecurityConfig {
            seccomp_notify: names.iter().map(|s| s.to_string()).collect(),
            seccomp_notify_action: action,
            ..Default::default()
        }
    }

    fn doc() -> Value {
        json!({"linux": {"seccomp": {"defaultAction": "SCMP_ACT_ERRNO", "flags": ["SECCOMP_FILTER_FLAG_LOG"],
            "syscalls": [
                {"names": ["read", "unshare"], "action": "SCMP_ACT_ALLOW"},
                {"names": ["mount"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 0, "value": 1, "op": "SCMP_CMP_EQ"}]}
            ]}}, "annotations": {}})
    }

    #[test]
    fn watched_names_leave_every_rule_and_one_notify_rule_takes_them() {
        let mut d = doc();
        let w = Watch {
            action: NotifyAction::Deny,
            syscalls: vec!["unshare".into(), "mount".into()],
            record: None,
        };
        rewrite(&mut d, &w, Path::new("/run/g/seccomp-1")).unwrap();
        let s = &d["linux"]["seccomp"];
        assert_eq!(s["listenerPath"], "/run/g/seccomp-1");
        assert_eq!(s["flags"], json!(["SECCOMP_FILTER_FLAG_LOG"]), "unmodelled fields stay");
        assert_eq!(
            s["syscalls"],
            json!([
                {"names": ["read"], "action": "SCMP_ACT_ALLOW"},
                {"names": ["unshare", "mount"], "action": "SCMP_ACT_NOTIFY"}
            ])
        );
        let profile: super::super::seccomp::Profile = serde_json::from_value(s.clone()).unwrap();
        let checks = super::super::seccomp::Checks {
            unknown: super::super::Unknown::Reject,
            require_default_deny: true,
            all_arches: false,
        };
        super::super::seccomp::validate(&profile, checks).expect("libseccomp builds the rewritten profile");
    }

    #[test]
    fn the_plan_follows_the_config_the_pod_and_the_engine() {
        let on = cfg(&["unshare"], NotifyAction::Deny);
        let want = |action, names: &[&str]| {
            Plan::Watch(Watch {
                action,
                syscalls: names.iter().map(|s| s.to_string()).collect(),
                record: None,
            })
        };
        assert_eq!(plan(&doc(), false, &cfg(&[], NotifyAction::Deny)), Plan::Off);
        assert_eq!(plan(&doc(), false, &on), want(NotifyAction::Deny, &["unshare"]));
        assert_eq!(plan(&doc(), true, &on), Plan::Off, "privileged");
        assert_eq!(plan(&json!({"linux": {}}), false, &on), Plan::Off, "no profile");
        let mut pod = doc();
        pod["annotations"][CRIO_NOTIFIER_ANNOTATION] = "stop".into();
        assert_eq!(plan(&pod, false, &on), want(NotifyAction::Kill, &["unshare"]));
        assert_eq!(
            plan(&pod, false, &SecurityConfig::default()),
            want(NotifyAction::Kill, ESCAPE_SYSCALLS)
        );
        pod["annotations"][CRIO_NOTIFIER_ANNOTATION] = "anything".into();
        assert_eq!(plan(&pod, false, &on), want(NotifyAction::Log, &["unshare"]));
        pod["annotations"][CRIO_NOTIFIER_ANNOTATION_V2] = "stop".into();
        assert_eq!(
            plan(&pod, false, &on),
            want(NotifyAction::Kill, &["unshare"]),
            "CRI-O 1.37's name wins"
        );
        let mut engine = doc();
        engine["linux"]["seccomp"]["listenerPath"] = "/run/agent.sock".into();
        assert_eq!(
            plan(&engine, false, &on),
            Plan::EngineListener("/run/agent.sock".into())
        );
    }

    #[test]
    fn the_annotation_names_the_watch_and_the_recording() {
        let rec = Some(Recording {
            name: "web".into(),
            dir: "/r".into(),
        });
        let mut w = Watch {
            action: NotifyAction::Deny,
            syscalls: vec!["unshare".into(), "mount".into()],
            record: None,
        };
        assert_eq!(w.describe(), "deny:unshare,mount");
        w.record = rec.clone();
        assert_eq!(w.describe(), "deny:unshare,mount;record:web");
        let only = Watch {
            record: rec,
            ..Default::default()
        };
        assert_eq!(only.describe(), "record:web");
    }

    #[test]
    fn a_recording_replaces_the_profile_and_keeps_the_watched_calls_notified() {
        let mut d = doc();
        let w = Watch {
            action: NotifyAction::Deny,
            syscalls: vec!["read".into()],
            record: Some(Recording {
                name: "x".into(),
                dir: "/r".into(),
            }),
        };
        rewrite(&mut d, &w, Path::new("/run/g/seccomp-2")).unwrap();
        let s = &d["linux"]["seccomp"];
        assert_eq!(s["defaultAction"], "SCMP_ACT_ALLOW");
        assert_eq!(s["listenerPath"], "/run/g/seccomp-2");
        assert!(s["syscalls"][1]["names"].as_array().unwrap().contains(&json!("read")));
        assert!(s.get("flags").is_none(), "the container's profile is replaced whole");
    }

    #[test]
    fn this_host_serves_every_action() {
        for a in [NotifyAction::Log, NotifyAction::Deny, NotifyAction::Kill] {
            host_support(a).unwrap();
        }
    }

    #[test]
    fn write_and_unknown_names_are_refused_by_name() {
        let e = check_names(&["unshare".into(), "write".into()]).unwrap_err();
        assert!(e.contains("\"write\""), "{e}");
        let e = check_names(&["nosuchcall".into()]).unwrap_err();
        assert!(e.contains("nosuchcall"), "{e}");
        let mut d = doc();
        let w = Watch {
            action: NotifyAction::Log,
            syscalls: vec!["write".into()],
            record: None,
        };
        let e = rewrite(&mut d, &w, Path::new("/x")).unwrap_err();
        assert_eq!(e.key, Some("security.seccomp_notify"));
        assert_eq!(d, doc(), "a refused rewrite leaves the document alone");
    }
}
