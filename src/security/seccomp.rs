//! Seccomp: gantry's runtime-default profile, generated per capability set and architecture
//! from [`super::syscalls`], and the validation of any profile (the engine's or gantry's)
//! through libseccomp before the runtime sees it. Both results are cached per daemon, so a
//! Create pays for a profile once per capability set, and for a validation once per profile.

use std::collections::HashMap;
use std::str::FromStr;
use std::sync::{Arc, Mutex};

use libseccomp::{ScmpAction, ScmpArch, ScmpArgCompare, ScmpCompareOp, ScmpFilterContext, ScmpSyscall};
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};
use thiserror::Error;

use super::caps;
use super::syscalls::{BASE, CAP_GROUPS, CLONE3_ERRNO, CLONE_NAMESPACE_FLAGS, PERSONALITY_VALUES};
use super::Unknown;

/// EPERM: what a call outside the profile gets (containerd's choice; CRI-O's is ENOSYS).
const EPERM: u32 = 1;

/// `linux.seccomp` as the OCI spec defines it, typed loosely (strings) so a profile with a
/// value libseccomp refuses can be named rather than failing to parse.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Profile {
    pub default_action: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default_errno_ret: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub architectures: Vec<String>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub syscalls: Vec<Rule>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Rule {
    pub names: Vec<String>,
    pub action: String,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errno_ret: Option<u32>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub args: Vec<Arg>,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct Arg {
    pub index: u64,
    pub value: u64,
    #[serde(default)]
    pub value_two: u64,
    pub op: String,
}

/// Why a profile is refused: the rule (a JSON path into the profile) and, when a setting of
/// gantry's made the call, the config key.
#[derive(Debug, Clone, Error, PartialEq)]
#[error("{rule}: {why}{}", key.map(|k| format!(" (rejected by {k})")).unwrap_or_default())]
pub struct ProfileError {
    pub rule: String,
    pub why: String,
    pub key: Option<&'static str>,
}

fn refuse(rule: impl Into<String>, why: impl Into<String>, key: Option<&'static str>) -> ProfileError {
    ProfileError {
        rule: rule.into(),
        why: why.into(),
        key,
    }
}

/// What validation enforces beyond libseccomp's own checks.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Checks {
    pub unknown: Unknown,
    pub require_default_deny: bool,
    /// Build the rules for every listed architecture (about 3 ms for a 360-name profile on
    /// three; the tests do, for gantry's profile), or for the native one only, the listed ones
    /// just checked by libseccomp (about 0.5 ms; what Create does).
    pub all_arches: bool,
}

/// The native architecture and its compat architectures, as seccomp names them.
pub fn architectures(arch: &str) -> Vec<String> {
    let names: &[&str] = match arch {
        "x86_64" => &["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"],
        "x86" => &["SCMP_ARCH_X86"],
        "aarch64" => &["SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"],
        "arm" => &["SCMP_ARCH_ARM"],
        "riscv64" => &["SCMP_ARCH_RISCV64"],
        "s390x" => &["SCMP_ARCH_S390X", "SCMP_ARCH_S390"],
        "powerpc64" => &["SCMP_ARCH_PPC64LE"],
        _ => &[],
    };
    names.iter().map(|s| s.to_string()).collect()
}

/// Whether the host's libseccomp can name `name` (on any architecture it knows).
fn known(name: &str) -> bool {
    ScmpSyscall::from_name(name).is_ok()
}

fn allow(names: Vec<String>, args: Vec<Arg>) -> Rule {
    Rule {
        names,
        action: "SCMP_ACT_ALLOW".into(),
        errno_ret: None,
        args,
    }
}

/// gantry's runtime-default profile for a container whose bounding set is `bounding`, on
/// `arch` (`std::env::consts::ARCH` spelling). Pure apart from asking libseccomp which
/// names it knows.
pub fn runtime_default(bounding: &[String], arch: &str) -> Profile {
    let has = |cap: &str| bounding.iter().any(|c| caps::normalize(c) == cap);
    let mut names: Vec<String> = BASE.iter().map(|s| s.to_string()).collect();
    for group in CAP_GROUPS.iter().filter(|g| has(g.cap)) {
        names.extend(group.names.iter().map(|s| s.to_string()));
    }
    let sys_admin = has("CAP_SYS_ADMIN");
    if sys_admin {
        names.push("clone".into());
    }
    names.retain(|n| known(n));
    names.sort();
    names.dedup();
    let mut rules = vec![allow(names, Vec::new())];
    if !sys_admin {
        // s390x passes clone's flags in its second argument.
        let index = if arch == "s390x" { 1 } else { 0 };
        let no_namespaces = Arg {
            index,
            value: CLONE_NAMESPACE_FLAGS,
            value_two: 0,
            op: "SCMP_CMP_MASKED_EQ".into(),
        };
        rules.push(allow(vec!["clone".into()], vec![no_namespaces]));
        rules.push(Rule {
            names: vec!["clone3".into()],
            action: "SCMP_ACT_ERRNO".into(),
            errno_ret: Some(CLONE3_ERRNO),
            args: Vec::new(),
        });
    }
    for &value in PERSONALITY_VALUES {
        let arg = Arg {
            index: 0,
            value,
            value_two: 0,
            op: "SCMP_CMP_EQ".into(),
        };
        rules.push(allow(vec!["personality".into()], vec![arg]));
    }
    Profile {
        default_action: "SCMP_ACT_ERRNO".into(),
        default_errno_ret: Some(EPERM),
        architectures: architectures(arch),
        syscalls: rules,
    }
}

type ProfileCache = Mutex<HashMap<Vec<String>, Arc<Profile>>>;
static PROFILES: std::sync::OnceLock<ProfileCache> = std::sync::OnceLock::new();

/// [`runtime_default`] for the native architecture, generated once per capability set.
pub fn cached_runtime_default(bounding: &[String]) -> Arc<Profile> {
    let mut key: Vec<String> = bounding.iter().map(|c| caps::normalize(c)).collect();
    key.sort();
    key.dedup();
    let cache = PROFILES.get_or_init(Default::default);
    let mut map = cache.lock().unwrap_or_else(|p| p.into_inner());
    map.entry(key)
        .or_insert_with_key(|k| Arc::new(runtime_default(k, std::env::consts::ARCH)))
        .clone()
}

fn action(name: &str, errno: Option<u32>) -> Result<ScmpAction, String> {
    let value = match name {
        "SCMP_ACT_ERRNO" => Some(errno.unwrap_or(EPERM) as i32),
        "SCMP_ACT_TRACE" => Some(errno.unwrap_or(EPERM) as i32),
        _ => None,
    };
    ScmpAction::from_str(name, value).map_err(|e| format!("invalid action {name:?}: {e}"))
}

/// One libseccomp comparison per argument rule; `Err` names what is wrong.
fn compare(arg: &Arg) -> Result<ScmpArgCompare, String> {
    if arg.index > 5 {
        return Err(format!("argument index {} out of range (0-5)", arg.index));
    }
    let op = ScmpCompareOp::from_str(&arg.op).map_err(|_| format!("invalid operator {:?}", arg.op))?;
    Ok(match op {
        ScmpCompareOp::MaskedEqual(_) => {
            ScmpArgCompare::new(arg.index as u32, ScmpCompareOp::MaskedEqual(arg.value), arg.value_two)
        }
        op => ScmpArgCompare::new(arg.index as u32, op, arg.value),
    })
}

/// Checks `profile` by building it with libseccomp (nothing is loaded). Returns the syscall
/// names libseccomp does not know, under `unknown_syscalls = "warn"` (the runtime skips them).
pub fn validate(profile: &Profile, checks: Checks) -> Result<Vec<String>, ProfileError> {
    build(profile, checks).map(|(_, warnings)| warnings)
}

/// Builds `profile` into a libseccomp filter as runc does (the sandbox fast path loads it),
/// with the unknown names of [`validate`].
pub fn build(profile: &Profile, checks: Checks) -> Result<(ScmpFilterContext, Vec<String>), ProfileError> {
    let default =
        action(&profile.default_action, profile.default_errno_ret).map_err(|why| refuse("defaultAction", why, None))?;
    if checks.require_default_deny && matches!(default, ScmpAction::Allow | ScmpAction::Log) {
        let why = format!("allows by default ({})", profile.default_action);
        return Err(refuse("defaultAction", why, Some("security.require_default_deny")));
    }
    let libseccomp = |rule: String, e: libseccomp::error::SeccompError| refuse(rule, format!("libseccomp: {e}"), None);
    let mut filter = ScmpFilterContext::new(default).map_err(|e| libseccomp("defaultAction".into(), e))?;
    let mut arch_probe = ScmpFilterContext::new(default).map_err(|e| libseccomp("defaultAction".into(), e))?;
    for (i, arch) in profile.architectures.iter().enumerate() {
        let rule = format!("architectures[{i}]");
        let parsed =
            ScmpArch::from_str(arch).map_err(|_| refuse(&rule, format!("invalid architecture {arch:?}"), None))?;
        let target = if checks.all_arches {
            &mut filter
        } else {
            &mut arch_probe
        };
        target.add_arch(parsed).map_err(|e| libseccomp(rule, e))?;
    }
    let mut unknown = Vec::new();
    for (i, r) in profile.syscalls.iter().enumerate() {
        let rule = format!("syscalls[{i}]");
        let act = action(&r.action, r.errno_ret).map_err(|why| refuse(&rule, why, None))?;
        let conds = r
            .args
            .iter()
            .enumerate()
            .map(|(j, a)| compare(a).map_err(|why| refuse(format!("{rule}.args[{j}]"), why, None)))
            .collect::<Result<Vec<_>, _>>()?;
        for name in &r.names {
            let Ok(call) = ScmpSyscall::from_name(name) else {
                let why = format!("unknown syscall {name:?}");
                if checks.unknown == Unknown::Reject {
                    return Err(refuse(&rule, why, Some("security.unknown_syscalls")));
                }
                unknown.push(name.clone());
                continue;
            };
            // The runtime skips rules whose action is the default one; libseccomp refuses them.
            if act == default {
                continue;
            }
            add(&mut filter, act, call, &r.args, &conds).map_err(|e| libseccomp(format!("{rule} ({name})"), e))?;
        }
    }
    Ok((filter, unknown))
}

/// Adds one rule as the runtime does: conditions on the same argument become separate rules.
fn add(
    filter: &mut ScmpFilterContext,
    act: ScmpAction,
    call: ScmpSyscall,
    args: &[Arg],
    conds: &[ScmpArgCompare],
) -> Result<(), libseccomp::error::SeccompError> {
    let repeated = (1..args.len()).any(|i| args[..i].iter().any(|a| a.index == args[i].index));
    if repeated {
        for c in conds {
            filter.add_rule_conditional(act, call, std::slice::from_ref(c))?;
        }
    } else {
        filter.add_rule_conditional(act, call, conds)?;
    }
    Ok(())
}

type ValidationCache = Mutex<HashMap<[u8; 32], Result<Vec<String>, ProfileError>>>;
static VALIDATIONS: std::sync::OnceLock<ValidationCache> = std::sync::OnceLock::new();

/// [`validate`], remembered per profile content and checks: engines hand every container of
/// a kind the same profile, and building a 400-rule filter costs about a millisecond.
pub fn validate_cached(profile: &Profile, checks: Checks) -> Result<Vec<String>, ProfileError> {
    let mut hasher = Sha256::new();
    hasher.update(serde_json::to_vec(profile).unwrap_or_default());
    hasher.update(format!("{checks:?}"));
    let key: [u8; 32] = hasher.finalize().into();
    let cache = VALIDATIONS.get_or_init(Default::default);
    if let Some(hit) = cache.lock().unwrap_or_else(|p| p.into_inner()).get(&key) {
        return hit.clone();
    }
    let result = validate(profile, checks);
    let mut map = cache.lock().unwrap_or_else(|p| p.into_inner());
    if map.len() >= 64 {
        map.clear();
    }
    map.insert(key, result.clone());
    result
}

/// Empties both caches: they serve a pod's Creates, which come within moments of each other,
/// and a settled daemon (`settle.rs`) need not keep a generated profile of ~400 rules for a
/// Create that may never come; the next one rebuilds them in a millisecond or two.
pub fn forget_cached() {
    if let Some(c) = PROFILES.get() {
        *c.lock().unwrap_or_else(|p| p.into_inner()) = HashMap::new();
    }
    if let Some(c) = VALIDATIONS.get() {
        *c.lock().unwrap_or_else(|p| p.into_inner()) = HashMap::new();
    }
}

#[cfg(test)]
#[path = "seccomp_tests.rs"]
mod tests;
