//! Profile generation per capability set and architecture, one test per rule group, and
//! validation through libseccomp.

use super::*;
use crate::security::syscalls::{CapGroup, NEVER};

fn caps(list: &[&str]) -> Vec<String> {
    list.iter().map(|s| s.to_string()).collect()
}

/// Names the profile allows unconditionally.
fn allowed(p: &Profile) -> Vec<String> {
    p.syscalls
        .iter()
        .filter(|r| r.action == "SCMP_ACT_ALLOW" && r.args.is_empty())
        .flat_map(|r| r.names.clone())
        .collect()
}

fn rules_for<'a>(p: &'a Profile, name: &str) -> Vec<&'a Rule> {
    p.syscalls
        .iter()
        .filter(|r| r.names.iter().any(|n| n == name))
        .collect()
}

const STRICT: Checks = Checks {
    unknown: Unknown::Reject,
    require_default_deny: true,
    all_arches: true,
};

#[test]
fn default_profile_denies_by_default_with_eperm_and_a_docker_class_allow_list() {
    let p = runtime_default(&caps(crate::security::DEFAULT_CAPS), "x86_64");
    assert_eq!(p.default_action, "SCMP_ACT_ERRNO");
    assert_eq!(p.default_errno_ret, Some(1));
    let names = allowed(&p);
    assert!((330..=400).contains(&names.len()), "{}", names.len());
    for n in [
        "read",
        "write",
        "execve",
        "socket",
        "connect",
        "bind",
        "listen",
        "accept4",
        "clock_gettime",
        "wait4",
    ] {
        assert!(names.iter().any(|x| x == n), "{n} missing");
    }
    for n in NEVER {
        assert!(rules_for(&p, n).is_empty(), "{n} must never be allowed");
    }
    // gantry's own profile passes its strictest validation.
    assert_eq!(validate(&p, STRICT), Ok(Vec::new()));
}

#[test]
fn architectures_are_native_plus_compat() {
    assert_eq!(
        architectures("x86_64"),
        ["SCMP_ARCH_X86_64", "SCMP_ARCH_X86", "SCMP_ARCH_X32"]
    );
    assert_eq!(architectures("aarch64"), ["SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"]);
    assert_eq!(
        runtime_default(&[], "aarch64").architectures,
        ["SCMP_ARCH_AARCH64", "SCMP_ARCH_ARM"]
    );
    assert!(architectures("sparc").is_empty());
}

#[test]
fn without_sys_admin_clone_loses_namespace_flags_and_clone3_gets_enosys() {
    let p = runtime_default(&caps(&["CAP_CHOWN"]), "x86_64");
    let clone = rules_for(&p, "clone");
    assert_eq!(clone.len(), 1);
    let arg = &clone[0].args[0];
    assert_eq!((arg.index, arg.value, arg.value_two), (0, CLONE_NAMESPACE_FLAGS, 0));
    assert_eq!(arg.op, "SCMP_CMP_MASKED_EQ");
    let clone3 = rules_for(&p, "clone3");
    assert_eq!(clone3.len(), 1);
    assert_eq!(
        (clone3[0].action.as_str(), clone3[0].errno_ret),
        ("SCMP_ACT_ERRNO", Some(38))
    );
    for n in ["mount", "umount2", "unshare", "setns", "pivot_root"] {
        assert!(rules_for(&p, n).is_empty(), "{n}");
    }
    // s390x passes the flags in the second argument.
    let s390 = runtime_default(&[], "s390x");
    assert_eq!(rules_for(&s390, "clone")[0].args[0].index, 1);
}

#[test]
fn sys_admin_unlocks_mount_namespaces_and_plain_clone() {
    let p = runtime_default(&caps(&["sys_admin"]), "x86_64");
    let names = allowed(&p);
    for n in ["mount", "umount2", "unshare", "setns", "clone", "clone3"] {
        assert!(names.iter().any(|x| x == n), "{n}");
    }
    assert!(rules_for(&p, "clone").iter().all(|r| r.args.is_empty()));
    assert_eq!(validate(&p, STRICT), Ok(Vec::new()));
}

/// One assertion per capability group: its calls appear with the capability and not without.
#[test]
fn every_capability_group_is_gated_on_its_capability() {
    for CapGroup { cap, names } in CAP_GROUPS {
        let with = allowed(&runtime_default(&caps(&[cap]), "x86_64"));
        let without = allowed(&runtime_default(&[], "x86_64"));
        let known: Vec<_> = names.iter().filter(|n| known(n)).collect();
        assert!(!known.is_empty(), "{cap}: no call of the group is known to libseccomp");
        for n in known {
            assert!(with.iter().any(|x| x == n), "{cap} should allow {n}");
            assert!(!without.iter().any(|x| x == n), "{n} allowed without {cap}");
        }
    }
}

#[test]
fn personality_only_with_listed_domains() {
    let p = runtime_default(&[], "x86_64");
    let rules = rules_for(&p, "personality");
    assert_eq!(rules.len(), PERSONALITY_VALUES.len());
    assert!(rules.iter().all(|r| r.args.len() == 1 && r.args[0].op == "SCMP_CMP_EQ"));
}

#[test]
fn generation_is_cached_per_capability_set() {
    let a = cached_runtime_default(&caps(&["CAP_KILL", "CAP_CHOWN"]));
    let b = cached_runtime_default(&caps(&["chown", "kill"]));
    assert!(Arc::ptr_eq(&a, &b));
    let c = cached_runtime_default(&caps(&["CAP_SYS_ADMIN"]));
    assert!(!Arc::ptr_eq(&a, &c));
    // A settled daemon forgets them; the next Create generates the same profile anew.
    forget_cached();
    let d = cached_runtime_default(&caps(&["kill", "chown"]));
    assert!(!Arc::ptr_eq(&a, &d), "still cached after forget_cached");
    assert_eq!(*a, *d);
}

fn engine(v: serde_json::Value) -> Profile {
    serde_json::from_value(v).unwrap()
}

#[test]
fn validation_names_the_rule_and_the_key() {
    let unknown = engine(serde_json::json!({
        "defaultAction": "SCMP_ACT_ERRNO",
        "syscalls": [{"names": ["read"], "action": "SCMP_ACT_ALLOW"},
                     {"names": ["write", "notasyscall"], "action": "SCMP_ACT_ALLOW"}]
    }));
    let warn = Checks {
        unknown: Unknown::Warn,
        require_default_deny: false,
        all_arches: true,
    };
    assert_eq!(validate(&unknown, warn).unwrap(), ["notasyscall"]);
    let e = validate(&unknown, STRICT).unwrap_err();
    assert_eq!(e.rule, "syscalls[1]");
    assert_eq!(e.key, Some("security.unknown_syscalls"));
    assert!(e.to_string().contains("notasyscall"), "{e}");

    let arch = engine(
        serde_json::json!({"defaultAction": "SCMP_ACT_ERRNO", "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_VAX"]}),
    );
    let e = validate(&arch, warn).unwrap_err();
    assert!(e.rule == "architectures[1]" && e.why.contains("SCMP_ARCH_VAX"), "{e}");
    let native_only = Checks {
        all_arches: false,
        ..warn
    };
    assert_eq!(validate(&arch, native_only).unwrap_err().rule, "architectures[1]");

    let allow = engine(
        serde_json::json!({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": [{"names": ["kexec_load"], "action": "SCMP_ACT_ERRNO"}]}),
    );
    assert!(validate(&allow, warn).is_ok());
    let e = validate(&allow, STRICT).unwrap_err();
    assert_eq!(
        (e.rule.as_str(), e.key),
        ("defaultAction", Some("security.require_default_deny"))
    );

    let action = engine(
        serde_json::json!({"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [{"names": ["read"], "action": "SCMP_ACT_MAYBE"}]}),
    );
    assert_eq!(validate(&action, warn).unwrap_err().rule, "syscalls[0]");
    let op = engine(serde_json::json!({"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
        {"names": ["read"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 0, "value": 1, "op": "SCMP_CMP_ALMOST"}]}]}));
    assert_eq!(validate(&op, warn).unwrap_err().rule, "syscalls[0].args[0]");
    let index = engine(serde_json::json!({"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
        {"names": ["read"], "action": "SCMP_ACT_ALLOW", "args": [{"index": 6, "value": 1, "op": "SCMP_CMP_EQ"}]}]}));
    let e = validate(&index, warn).unwrap_err();
    assert!(e.why.contains("index 6"), "{e}");
    let bad_default = engine(serde_json::json!({"defaultAction": "SCMP_ACT_NOPE"}));
    assert_eq!(validate(&bad_default, warn).unwrap_err().rule, "defaultAction");
}

#[test]
fn same_argument_twice_is_accepted_as_the_runtime_splits_it() {
    let p = engine(serde_json::json!({"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [
        {"names": ["personality"], "action": "SCMP_ACT_ALLOW", "args": [
            {"index": 0, "value": 0, "op": "SCMP_CMP_EQ"}, {"index": 0, "value": 8, "op": "SCMP_CMP_EQ"}]}]}));
    assert!(validate(&p, STRICT).is_ok());
}

#[test]
fn validation_results_are_cached() {
    let p = engine(
        serde_json::json!({"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [{"names": ["notasyscall"], "action": "SCMP_ACT_ALLOW"}]}),
    );
    let first = validate_cached(&p, STRICT);
    assert!(first.is_err());
    assert_eq!(validate_cached(&p, STRICT), first);
    let warn = Checks {
        unknown: Unknown::Warn,
        require_default_deny: true,
        all_arches: true,
    };
    assert!(validate_cached(&p, warn).is_ok(), "the checks are part of the key");
}
