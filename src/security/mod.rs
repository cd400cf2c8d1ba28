//! The handler's hardening policy (`[security]`): seccomp, AppArmor, capabilities, privileged
//! containers, no_new_privileges and a read-only rootfs, decided per container as edits to
//! `config.json` before the runtime sees it ([`apply`], called from `spec::edit` after the
//! device edits). It works on the spec's JSON, not oci-spec's model, so capability names or
//! seccomp values newer than the crate are judged by name. Every decision is recorded in a
//! `gantry.dev/*` annotation (visible in `crictl inspect`) and returned for the log.

pub mod apparmor;
pub mod caps;
pub mod exec;
pub mod notify;
pub mod record;
pub mod seccomp;
pub mod syscalls;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value};
use thiserror::Error;

use crate::devices;
use apparmor::{AppArmorError, Host, Outcome};
use caps::CapsError;
use seccomp::{Checks, Profile, ProfileError};

/// CRI-O's record of the pod's seccomp choice (`Unconfined`, `RuntimeDefault`, a path, or "").
pub const CRIO_SECCOMP_ANNOTATION: &str = "io.kubernetes.cri-o.SeccompProfilePath";
pub const SECCOMP_ANNOTATION: &str = "gantry.dev/seccomp";
pub const APPARMOR_ANNOTATION: &str = "gantry.dev/apparmor";
pub const CAPS_DROPPED_ANNOTATION: &str = "gantry.dev/capabilities-dropped";
pub const PRIVILEGED_ANNOTATION: &str = "gantry.dev/privileged";
pub const NNP_ANNOTATION: &str = "gantry.dev/no-new-privileges";
pub const READONLY_ANNOTATION: &str = "gantry.dev/readonly-rootfs";

/// `unknown_syscalls`: what a profile naming a call libseccomp does not know gets.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Unknown {
    #[default]
    Warn,
    Reject,
}

/// `apparmor_unavailable`: a named profile on a host without AppArmor.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Unavailable {
    #[default]
    Keep,
    Drop,
    Reject,
}

/// `capability_violation`: a capability outside `allowed_capabilities`.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Violation {
    #[default]
    Reject,
    Drop,
}

/// `no_new_privileges` and `readonly_rootfs`: leave the engine's choice or force it on.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Force {
    #[default]
    Keep,
    Force,
}

/// The `[security]` table. The defaults change nothing: the engine's spec goes through as
/// it came (profiles are still validated, and only what the runtime would refuse anyway fails).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(default, deny_unknown_fields)]
pub struct SecurityConfig {
    /// `none`, `runtime-default` (gantry's profile) or the absolute path of an OCI seccomp JSON.
    pub seccomp_default: String,
    pub allow_unconfined: bool,
    pub unknown_syscalls: Unknown,
    pub require_default_deny: bool,
    /// Profile applied when the spec names none (hosts with AppArmor only); empty: none.
    pub apparmor_default: String,
    pub apparmor_unavailable: Unavailable,
    pub apparmor_securityfs: PathBuf,
    pub apparmor_sysfs: PathBuf,
    /// `None`: no limit.
    pub allowed_capabilities: Option<Vec<String>>,
    pub capability_violation: Violation,
    pub allow_privileged: bool,
    pub no_new_privileges: Force,
    pub readonly_rootfs: Force,
    /// Syscalls the daemon is notified of (`SCMP_ACT_NOTIFY`), see [`notify`]; empty: none.
    pub seccomp_notify: Vec<String>,
    pub seccomp_notify_action: notify::NotifyAction,
    /// Where recorded profiles go ([`record`]); empty: recording refused.
    pub seccomp_recording_dir: PathBuf,
}

impl SecurityConfig {
    /// No policy asked for: the spec goes to the runtime as the engine wrote it. Where the
    /// host's AppArmor files are looked for is not policy, so it does not count.
    pub fn is_passthrough(&self) -> bool {
        let defaults = Self::default();
        let policy = Self {
            apparmor_securityfs: defaults.apparmor_securityfs.clone(),
            apparmor_sysfs: defaults.apparmor_sysfs.clone(),
            ..self.clone()
        };
        policy == defaults
    }
}

impl Default for SecurityConfig {
    fn default() -> Self {
        Self {
            seccomp_default: "none".into(),
            allow_unconfined: true,
            unknown_syscalls: Unknown::Warn,
            require_default_deny: false,
            apparmor_default: String::new(),
            apparmor_unavailable: Unavailable::Keep,
            apparmor_securityfs: PathBuf::from("/sys/kernel/security"),
            apparmor_sysfs: PathBuf::from("/sys"),
            allowed_capabilities: None,
            capability_violation: Violation::Reject,
            allow_privileged: true,
            no_new_privileges: Force::Keep,
            readonly_rootfs: Force::Keep,
            seccomp_notify: Vec::new(),
            seccomp_notify_action: notify::NotifyAction::Log,
            seccomp_recording_dir: PathBuf::new(),
        }
    }
}

/// `seccomp_default`, parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeccompDefault {
    None,
    RuntimeDefault,
    File(PathBuf),
}

impl SecurityConfig {
    pub fn seccomp_default(&self) -> SeccompDefault {
        match self.seccomp_default.as_str() {
            "none" | "" => SeccompDefault::None,
            "runtime-default" => SeccompDefault::RuntimeDefault,
            path => SeccompDefault::File(PathBuf::from(path)),
        }
    }

    /// Checks what the types cannot; `Err((key, message))` names the offending key.
    pub fn validate(&self) -> Result<(), (&'static str, String)> {
        if let SeccompDefault::File(p) = self.seccomp_default() {
            if !p.is_absolute() {
                let msg = format!("{p:?}: must be none, runtime-default or an absolute path");
                return Err(("seccomp_default", msg));
            }
        }
        if !self.allow_unconfined && self.seccomp_default() == SeccompDefault::None {
            let msg = "false needs a seccomp_default other than none (what would replace Unconfined?)";
            return Err(("allow_unconfined", msg.into()));
        }
        for name in self.allowed_capabilities.iter().flatten() {
            let n = caps::normalize(name);
            if n.len() <= 4 || !n[4..].chars().all(|c| c.is_ascii_alphanumeric() || c == '_') {
                return Err(("allowed_capabilities", format!("{name:?} is not a capability name")));
            }
        }
        notify::check_names(&self.seccomp_notify).map_err(|msg| ("seccomp_notify", msg))?;
        if !self.seccomp_recording_dir.as_os_str().is_empty() && !self.seccomp_recording_dir.is_absolute() {
            return Err((
                "seccomp_recording_dir",
                "must be empty (off) or an absolute path".into(),
            ));
        }
        for (key, p) in [
            ("apparmor_securityfs", &self.apparmor_securityfs),
            ("apparmor_sysfs", &self.apparmor_sysfs),
        ] {
            if !p.is_absolute() {
                return Err((key, "must be an absolute path".into()));
            }
        }
        Ok(())
    }
}

#[derive(Debug, Error)]
pub enum SecurityError {
    #[error(
        "privileged container refused (rejected by security.allow_privileged = false; privileged: the \
         bounding set holds CAP_SYS_ADMIN, CAP_SYS_MODULE and CAP_SYS_RAWIO)"
    )]
    Privileged,
    #[error(transparent)]
    Caps(#[from] CapsError),
    #[error("seccomp profile {from}: {error}")]
    Seccomp { from: String, error: ProfileError },
    #[error("seccomp profile {path}: {why}")]
    ProfileFile { path: PathBuf, why: String },
    #[error(transparent)]
    AppArmor(#[from] AppArmorError),
}

impl SecurityError {
    /// The refusal's kind, as the `reason` of its policy event and metric label.
    pub fn reason(&self) -> &'static str {
        match self {
            SecurityError::Privileged => "privileged",
            SecurityError::Caps(_) => "capabilities",
            SecurityError::Seccomp { .. } => "seccomp",
            SecurityError::ProfileFile { .. } => "seccomp-profile",
            SecurityError::AppArmor(_) => "apparmor",
        }
    }
}

/// The policy's decisions as recorded in a container's annotations: (reason, value) for the
/// policy events of its Create.
pub fn recorded_decisions(annotations: &std::collections::HashMap<String, String>) -> Vec<(&'static str, String)> {
    [
        (SECCOMP_ANNOTATION, "seccomp"),
        (APPARMOR_ANNOTATION, "apparmor"),
        (CAPS_DROPPED_ANNOTATION, "capabilities-dropped"),
        (NNP_ANNOTATION, "no-new-privileges"),
        (READONLY_ANNOTATION, "readonly-rootfs"),
        (PRIVILEGED_ANNOTATION, "privileged"),
        (notify::NOTIFY_ANNOTATION, "seccomp-notify"),
    ]
    .into_iter()
    .filter_map(|(key, reason)| annotations.get(key).map(|v| (reason, v.clone())))
    // Every container under a policy records `privileged=false`; only the exception is news.
    .filter(|(reason, v)| *reason != "privileged" || v == "true")
    .collect()
}

/// What [`apply`] decided, for the log.
#[derive(Debug, Default)]
pub struct Report {
    /// The document was edited (annotations included).
    pub changed: bool,
    /// The recorded decisions, as written into the annotations.
    pub decisions: Vec<(&'static str, String)>,
    /// Syscall names in the profile this host's libseccomp does not know (the runtime skips
    /// them, as runc does silently).
    pub unknown_syscalls: Vec<String>,
}

/// Where the container's seccomp profile comes from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SeccompChoice {
    /// The engine put one in the spec: validated, kept.
    Engine,
    /// None: privileged, the pod asked for it (and it is allowed), or no default is configured.
    Unconfined,
    /// gantry's default applies.
    Apply(SeccompDefault),
}

/// The seccomp decision table. `crio` is CRI-O's annotation of the pod's choice; containerd
/// records none, so there "Unconfined" and "unset" both get the default.
pub fn seccomp_choice(has_profile: bool, privileged: bool, crio: Option<&str>, cfg: &SecurityConfig) -> SeccompChoice {
    let default = cfg.seccomp_default();
    let pod_unconfined = crio == Some("Unconfined") && cfg.allow_unconfined;
    if has_profile {
        SeccompChoice::Engine
    } else if privileged || default == SeccompDefault::None || pod_unconfined {
        SeccompChoice::Unconfined
    } else {
        SeccompChoice::Apply(default)
    }
}

/// At Create the rules are built for the native architecture (the one this host runs, ~0.5 ms
/// for 360 names against ~3 ms for three); the other listed ones are checked by name.
fn checks(cfg: &SecurityConfig) -> Checks {
    Checks {
        unknown: cfg.unknown_syscalls,
        require_default_deny: cfg.require_default_deny,
        all_arches: false,
    }
}

/// The object at `path` in `doc`, created (with its parents) where absent or not an object.
fn object<'a>(doc: &'a mut Value, path: &[&str]) -> &'a mut Map<String, Value> {
    let mut map = as_object(doc);
    for key in path {
        map = as_object(map.entry(key.to_string()).or_insert(Value::Null));
    }
    map
}

fn as_object(v: &mut Value) -> &mut Map<String, Value> {
    match v {
        Value::Object(map) => map,
        other => {
            *other = Value::Object(Map::new());
            as_object(other)
        }
    }
}

fn engine_profile(doc: &Value) -> Result<Option<Profile>, SecurityError> {
    match doc.pointer("/linux/seccomp") {
        None | Some(Value::Null) => Ok(None),
        Some(v) => serde_json::from_value(v.clone())
            .map(Some)
            .map_err(|e| SecurityError::Seccomp {
                from: "from the engine (linux.seccomp)".into(),
                error: ProfileError {
                    rule: "linux.seccomp".into(),
                    why: format!("malformed: {e}"),
                    key: None,
                },
            }),
    }
}

/// The profile gantry applies for `default`, validated (cached per capability set / content).
fn default_profile(
    default: &SeccompDefault,
    bounding: &[String],
    cfg: &SecurityConfig,
) -> Result<Value, SecurityError> {
    let (profile, from) = match default {
        SeccompDefault::File(path) => {
            let why = |e: String| SecurityError::ProfileFile {
                path: path.clone(),
                why: e,
            };
            let raw = std::fs::read(path).map_err(|e| why(e.to_string()))?;
            let p: Profile = serde_json::from_slice(&raw).map_err(|e| why(format!("malformed: {e}")))?;
            (
                std::sync::Arc::new(p),
                format!("{} (security.seccomp_default)", path.display()),
            )
        }
        _ => (
            seccomp::cached_runtime_default(bounding),
            "runtime-default of gantry".to_string(),
        ),
    };
    let checks = checks(cfg);
    let refused = |rule: &str, why: String| ProfileError {
        rule: rule.into(),
        why,
        key: None,
    };
    seccomp::validate_cached(&profile, checks)
        .and_then(|_| serde_json::to_value(&*profile).map_err(|e| refused("linux.seccomp", e.to_string())))
        .map_err(|error| SecurityError::Seccomp { from, error })
}

/// What the policy needs on the host before [`apply`] can decide: gantry's own AppArmor
/// profile loaded where it is the default.
pub async fn prepare_host(cfg: &SecurityConfig, reaper: &crate::reaper::Reaper) -> Result<(), SecurityError> {
    let host = apparmor::Host {
        securityfs: &cfg.apparmor_securityfs,
        sysfs: &cfg.apparmor_sysfs,
    };
    Ok(apparmor::ensure_default_loaded(&cfg.apparmor_default, &host, reaper).await?)
}

/// Applies the policy to `doc` (the whole `config.json`). On error nothing was decided for
/// the runtime: the caller writes nothing.
pub fn apply(doc: &mut Value, cfg: &SecurityConfig) -> Result<Report, SecurityError> {
    let mut report = Report::default();
    let engine = engine_profile(doc)?;
    if let Some(p) = &engine {
        let from = "from the engine (linux.seccomp)".to_string();
        report.unknown_syscalls =
            seccomp::validate_cached(p, checks(cfg)).map_err(|error| SecurityError::Seccomp { from, error })?;
    }
    let named = doc.pointer("/process/apparmorProfile").and_then(Value::as_str);
    let host = apparmor::Host {
        securityfs: &cfg.apparmor_securityfs,
        sysfs: &cfg.apparmor_sysfs,
    };
    apparmor::check_named(named, &host)?;
    if cfg.is_passthrough() {
        return Ok(report);
    }
    let privileged = devices::is_privileged(&caps::bounding(doc));
    if privileged && !cfg.allow_privileged {
        return Err(SecurityError::Privileged);
    }
    let mut decisions = vec![(PRIVILEGED_ANNOTATION, privileged.to_string())];
    if let (false, Some(allowed)) = (privileged, &cfg.allowed_capabilities) {
        let set = object(doc, &["process", "capabilities"]);
        match cfg.capability_violation {
            Violation::Reject => {
                if let Some((set, cap)) = caps::violations(set, allowed)?.into_iter().next() {
                    return Err(CapsError::NotAllowed { set, cap }.into());
                }
            }
            Violation::Drop => {
                let dropped = caps::drop_outside(set, allowed)?;
                if !dropped.is_empty() {
                    decisions.push((CAPS_DROPPED_ANNOTATION, dropped.join(",")));
                }
            }
        }
    }
    if cfg.no_new_privileges == Force::Force && doc.pointer("/process/noNewPrivileges") != Some(&Value::Bool(true)) {
        object(doc, &["process"]).insert("noNewPrivileges".into(), true.into());
        decisions.push((NNP_ANNOTATION, "forced".into()));
    }
    if cfg.readonly_rootfs == Force::Force && doc.pointer("/root/readonly") != Some(&Value::Bool(true)) {
        object(doc, &["root"]).insert("readonly".into(), true.into());
        decisions.push((READONLY_ANNOTATION, "forced".into()));
    }
    decisions.push((
        SECCOMP_ANNOTATION,
        decide_seccomp(doc, engine.is_some(), privileged, cfg)?,
    ));
    decisions.push((APPARMOR_ANNOTATION, decide_apparmor(doc, privileged, cfg)?));
    let annotations = object(doc, &["annotations"]);
    for (k, v) in &decisions {
        annotations.insert(k.to_string(), v.clone().into());
    }
    report.decisions = decisions;
    report.changed = true;
    Ok(report)
}

/// Applies the watched-syscalls plan ([`notify`]) to `doc`, after [`apply`]: the watch the
/// daemon must serve at `listener`, if any, and its decision in `report`.
pub fn watch_syscalls(
    doc: &mut Value,
    cfg: &SecurityConfig,
    listener: &std::path::Path,
    report: &mut Report,
) -> Result<Option<notify::Watch>, SecurityError> {
    let privileged = devices::is_privileged(&caps::bounding(doc));
    let refused = |from: &str, why: String, key| SecurityError::Seccomp {
        from: from.into(),
        error: ProfileError {
            rule: "linux.seccomp".into(),
            why,
            key: Some(key),
        },
    };
    let recording = record::plan(doc, &cfg.seccomp_recording_dir)
        .map_err(|why| refused("for the recording", why, "security.seccomp_recording_dir"))?;
    let plan = notify::plan(doc, privileged, cfg);
    let (watch, value) = match (plan, recording) {
        (notify::Plan::EngineListener(path), Some(_)) => {
            let why = format!("the engine set its own listener ({path}): cannot record through it");
            return Err(refused("for the recording", why, "security.seccomp_recording_dir"));
        }
        (notify::Plan::EngineListener(path), None) => (None, format!("engine:{path}")),
        (notify::Plan::Off, None) => return Ok(None),
        (plan, recording) => {
            let mut w = match plan {
                notify::Plan::Watch(w) => w,
                _ => notify::Watch::default(),
            };
            w.record = recording;
            notify::rewrite(doc, &w, listener).map_err(|error| SecurityError::Seccomp {
                from: "with the watched syscalls (security.seccomp_notify)".into(),
                error,
            })?;
            let value = w.describe();
            (Some(w), value)
        }
    };
    object(doc, &["annotations"]).insert(notify::NOTIFY_ANNOTATION.into(), value.clone().into());
    report.decisions.push((notify::NOTIFY_ANNOTATION, value));
    report.changed = true;
    Ok(watch)
}

/// Applies the seccomp decision to `doc`; returns the annotation value.
fn decide_seccomp(doc: &mut Value, has: bool, privileged: bool, cfg: &SecurityConfig) -> Result<String, SecurityError> {
    let crio = doc
        .pointer(&format!("/annotations/{}", CRIO_SECCOMP_ANNOTATION.replace('/', "~1")))
        .and_then(Value::as_str)
        .map(String::from);
    Ok(match seccomp_choice(has, privileged, crio.as_deref(), cfg) {
        SeccompChoice::Engine => "engine".into(),
        SeccompChoice::Unconfined => "unconfined".into(),
        SeccompChoice::Apply(default) => {
            let profile = default_profile(&default, &caps::bounding(doc), cfg)?;
            object(doc, &["linux"]).insert("seccomp".into(), profile);
            match default {
                SeccompDefault::File(p) => p.display().to_string(),
                _ => "runtime-default".into(),
            }
        }
    })
}

/// Applies the AppArmor decision to `doc`; returns the annotation value.
fn decide_apparmor(doc: &mut Value, privileged: bool, cfg: &SecurityConfig) -> Result<String, SecurityError> {
    let current = doc
        .pointer("/process/apparmorProfile")
        .and_then(Value::as_str)
        .map(String::from);
    let host = Host {
        securityfs: &cfg.apparmor_securityfs,
        sysfs: &cfg.apparmor_sysfs,
    };
    let outcome = apparmor::decide(
        current.as_deref(),
        privileged,
        &cfg.apparmor_default,
        cfg.apparmor_unavailable,
        &host,
    )?;
    match &outcome {
        Outcome::Dropped(_) => {
            object(doc, &["process"]).remove("apparmorProfile");
        }
        Outcome::Default(p) => {
            object(doc, &["process"]).insert("apparmorProfile".into(), p.clone().into());
        }
        Outcome::None | Outcome::Engine(_) => {}
    }
    Ok(outcome.annotation())
}

/// One log line per container with every decision (the logger carries the container id).
pub fn log(log: &slog::Logger, report: &Report) {
    let new = first_sightings(&report.unknown_syscalls);
    if !new.is_empty() {
        // Engines' default profiles name calls newer than the host's libseccomp (containerd's
        // names 11 on Debian 12): said once per daemon, not for every container.
        slog::warn!(log, "security policy: the seccomp profile names syscalls this host's libseccomp does not know; the runtime skips them (each is reported once per daemon)";
            "syscalls" => new.join(","));
    }
    if !report.decisions.is_empty() {
        let decisions: Vec<String> = report.decisions.iter().map(|(k, v)| format!("{k}={v}")).collect();
        slog::info!(log, "security policy"; "decisions" => decisions.join(" "));
    }
}

/// The names among `names` not reported before by this process, now marked as reported.
fn first_sightings(names: &[String]) -> Vec<String> {
    static SEEN: std::sync::Mutex<std::collections::BTreeSet<String>> =
        std::sync::Mutex::new(std::collections::BTreeSet::new());
    let mut seen = SEEN.lock().unwrap_or_else(|p| p.into_inner());
    names.iter().filter(|n| seen.insert((*n).clone())).cloned().collect()
}

/// The capabilities containerd gives a container by default: what `seccomp-profile` assumes
/// without `--caps`.
pub const DEFAULT_CAPS: &[&str] = &[
    "CAP_CHOWN",
    "CAP_DAC_OVERRIDE",
    "CAP_FSETID",
    "CAP_FOWNER",
    "CAP_MKNOD",
    "CAP_NET_RAW",
    "CAP_SETGID",
    "CAP_SETUID",
    "CAP_SETFCAP",
    "CAP_SETPCAP",
    "CAP_NET_BIND_SERVICE",
    "CAP_SYS_CHROOT",
    "CAP_KILL",
    "CAP_AUDIT_WRITE",
];

/// `seccomp-profile [--caps A,B]`: the profile gantry would apply, as pretty JSON.
pub fn profile_json(caps: Option<&str>) -> String {
    let caps: Vec<String> = match caps {
        Some(list) => list
            .split(',')
            .filter(|c| !c.trim().is_empty())
            .map(caps::normalize)
            .collect(),
        None => DEFAULT_CAPS.iter().map(|c| c.to_string()).collect(),
    };
    let profile = seccomp::runtime_default(&caps, std::env::consts::ARCH);
    let mut out = serde_json::to_string_pretty(&profile).unwrap_or_default();
    out.push('\n');
    out
}

#[cfg(test)]
mod tests;
