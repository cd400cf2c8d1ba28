//! Policy decision tables over whole `config.json` documents.

use serde_json::{json, Value};

use super::*;

/// A spec as CRI-O or containerd writes it for an unprivileged container.
fn spec(bounding: &[&str]) -> Value {
    json!({
        "ociVersion": "1.0.2",
        "process": {
            "args": ["sh"], "cwd": "/",
            "capabilities": {"bounding": bounding, "effective": bounding, "permitted": bounding}
        },
        "root": {"path": "rootfs"},
        "linux": {"namespaces": [{"type": "pid"}]}
    })
}

const PRIVILEGED: &[&str] = &["CAP_SYS_ADMIN", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_CHOWN"];

fn hardened() -> SecurityConfig {
    let text = include_str!("../../runtime-conf/gantry-hardened.toml");
    crate::config::Config::parse(std::path::Path::new("gantry-hardened.toml"), text)
        .unwrap()
        .security
}

fn annotation<'a>(doc: &'a Value, key: &str) -> Option<&'a str> {
    doc["annotations"][key].as_str()
}

#[test]
fn seccomp_decision_table() {
    let runtime = SecurityConfig {
        seccomp_default: "runtime-default".into(),
        ..Default::default()
    };
    let strict = SecurityConfig {
        allow_unconfined: false,
        ..runtime.clone()
    };
    let none = SecurityConfig::default();
    let apply = SeccompChoice::Apply(SeccompDefault::RuntimeDefault);
    // (has profile, privileged, CRI-O annotation, config) -> choice
    let table = [
        (true, false, None, &runtime, SeccompChoice::Engine),
        (true, true, None, &strict, SeccompChoice::Engine),
        (false, true, None, &strict, SeccompChoice::Unconfined),
        (false, false, None, &none, SeccompChoice::Unconfined),
        (false, false, None, &runtime, apply.clone()),
        (false, false, Some(""), &runtime, apply.clone()),
        (false, false, Some("Unconfined"), &runtime, SeccompChoice::Unconfined),
        (false, false, Some("Unconfined"), &strict, apply.clone()),
        (false, false, Some("RuntimeDefault"), &runtime, apply.clone()),
    ];
    for (has, privileged, crio, cfg, want) in table {
        assert_eq!(
            seccomp_choice(has, privileged, crio, cfg),
            want,
            "{has} {privileged} {crio:?}"
        );
    }
    let file = SecurityConfig {
        seccomp_default: "/etc/gantry/seccomp.json".into(),
        ..Default::default()
    };
    assert_eq!(
        seccomp_choice(false, false, None, &file),
        SeccompChoice::Apply(SeccompDefault::File("/etc/gantry/seccomp.json".into()))
    );
}

#[test]
fn defaults_change_nothing() {
    // On a host without AppArmor and on one where the engine's profile is loaded alike (the
    // host's own securityfs is not read: it is whatever machine runs the test).
    for (enabled, loaded) in [(false, &[][..]), (true, &["p"][..])] {
        let dir = apparmor::tests::fixture(enabled, loaded);
        let (securityfs, sysfs) = apparmor::tests::host(&dir);
        let cfg = SecurityConfig {
            apparmor_securityfs: securityfs,
            apparmor_sysfs: sysfs,
            ..Default::default()
        };
        let mut doc = spec(&["CAP_CHOWN", "CAP_NET_RAW"]);
        doc["process"]["apparmorProfile"] = "p".into();
        let before = doc.clone();
        let report = apply(&mut doc, &cfg).unwrap();
        assert!(!report.changed && report.decisions.is_empty(), "AppArmor {enabled}");
        assert_eq!(doc, before);
    }
}

#[test]
fn hardened_applies_runtime_default_and_records_every_decision() {
    let mut doc = spec(&["CAP_CHOWN", "CAP_NET_RAW", "CAP_KILL"]);
    let report = apply(&mut doc, &hardened()).unwrap();
    assert!(report.changed);
    assert_eq!(doc["linux"]["seccomp"]["defaultAction"], "SCMP_ACT_ERRNO");
    assert_eq!(annotation(&doc, SECCOMP_ANNOTATION), Some("runtime-default"));
    assert_eq!(annotation(&doc, PRIVILEGED_ANNOTATION), Some("false"));
    assert_eq!(annotation(&doc, APPARMOR_ANNOTATION), Some("none"));
    assert_eq!(annotation(&doc, CAPS_DROPPED_ANNOTATION), Some("CAP_NET_RAW"));
    assert_eq!(
        doc["process"]["capabilities"]["bounding"],
        json!(["CAP_CHOWN", "CAP_KILL"])
    );
    assert_eq!(doc["process"]["noNewPrivileges"], true);
    assert_eq!(doc["root"]["readonly"], true);
    assert_eq!(annotation(&doc, NNP_ANNOTATION), Some("forced"));
    // Already set by the engine: nothing forced, nothing recorded.
    let mut doc = spec(&["CAP_CHOWN"]);
    doc["process"]["noNewPrivileges"] = true.into();
    apply(&mut doc, &hardened()).unwrap();
    assert_eq!(annotation(&doc, NNP_ANNOTATION), None);
}

#[test]
fn privileged_containers_are_refused_or_left_unconfined() {
    let mut doc = spec(PRIVILEGED);
    let e = apply(&mut doc, &hardened()).unwrap_err().to_string();
    assert!(e.contains("security.allow_privileged"), "{e}");
    let cfg = SecurityConfig {
        allow_privileged: true,
        ..hardened()
    };
    let mut doc = spec(PRIVILEGED);
    apply(&mut doc, &cfg).unwrap();
    assert!(doc["linux"].get("seccomp").is_none());
    assert_eq!(annotation(&doc, SECCOMP_ANNOTATION), Some("unconfined"));
    assert_eq!(annotation(&doc, PRIVILEGED_ANNOTATION), Some("true"));
    // Privileged containers keep their full set: the allow-list is for unprivileged ones.
    assert_eq!(doc["process"]["capabilities"]["bounding"].as_array().unwrap().len(), 4);
}

#[test]
fn capability_violations_reject_naming_the_set() {
    let cfg = SecurityConfig {
        capability_violation: Violation::Reject,
        ..hardened()
    };
    let mut doc = spec(&["CAP_CHOWN"]);
    doc["process"]["capabilities"]["ambient"] = json!(["CAP_FUTURE_THING"]);
    let before = doc.clone();
    let e = apply(&mut doc, &cfg).unwrap_err().to_string();
    assert!(
        e.contains("CAP_FUTURE_THING") && e.contains("process.capabilities.ambient"),
        "{e}"
    );
    assert!(e.contains("security.capability_violation"), "{e}");
    assert_eq!(doc, before, "a refused spec is not edited");
}

#[test]
fn crio_unconfined_is_respected_or_overridden() {
    let crio = |doc: &mut Value| {
        doc["annotations"] = json!({CRIO_SECCOMP_ANNOTATION: "Unconfined"});
    };
    let allow = SecurityConfig {
        allow_unconfined: true,
        ..hardened()
    };
    let mut doc = spec(&["CAP_CHOWN"]);
    crio(&mut doc);
    apply(&mut doc, &allow).unwrap();
    assert!(doc["linux"].get("seccomp").is_none());
    assert_eq!(annotation(&doc, SECCOMP_ANNOTATION), Some("unconfined"));
    let mut doc = spec(&["CAP_CHOWN"]);
    crio(&mut doc);
    apply(&mut doc, &hardened()).unwrap();
    assert!(doc["linux"]["seccomp"].is_object());
}

#[test]
fn engine_profiles_are_validated_and_kept() {
    let mut doc = spec(&["CAP_CHOWN"]);
    doc["linux"]["seccomp"] =
        json!({"defaultAction": "SCMP_ACT_ERRNO", "syscalls": [{"names": ["read"], "action": "SCMP_ACT_ALLOW"}]});
    let kept = doc["linux"]["seccomp"].clone();
    apply(&mut doc, &hardened()).unwrap();
    assert_eq!(doc["linux"]["seccomp"], kept);
    assert_eq!(annotation(&doc, SECCOMP_ANNOTATION), Some("engine"));

    doc["linux"]["seccomp"]["syscalls"][0]["names"] = json!(["notasyscall"]);
    let e = apply(&mut doc, &hardened()).unwrap_err().to_string();
    assert!(
        e.contains("syscalls[0]") && e.contains("security.unknown_syscalls"),
        "{e}"
    );
    // With the defaults an unknown name is a warning, as the runtime skips it.
    let r = apply(&mut doc, &SecurityConfig::default()).unwrap();
    assert_eq!(r.unknown_syscalls, ["notasyscall"]);
    doc["linux"]["seccomp"] = json!({"defaultAction": 7});
    let e = apply(&mut doc, &SecurityConfig::default()).unwrap_err().to_string();
    assert!(e.contains("malformed"), "{e}");
}

#[test]
fn profile_file_default() {
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("p.json");
    std::fs::write(
        &file,
        r#"{"defaultAction":"SCMP_ACT_ERRNO","syscalls":[{"names":["read"],"action":"SCMP_ACT_ALLOW"}]}"#,
    )
    .unwrap();
    let cfg = SecurityConfig {
        seccomp_default: file.to_str().unwrap().into(),
        ..hardened()
    };
    let mut doc = spec(&["CAP_CHOWN"]);
    apply(&mut doc, &cfg).unwrap();
    assert_eq!(doc["linux"]["seccomp"]["syscalls"][0]["names"], json!(["read"]));
    assert_eq!(annotation(&doc, SECCOMP_ANNOTATION), file.to_str());
    std::fs::write(&file, "{").unwrap();
    let e = apply(&mut spec(&[]), &cfg).unwrap_err().to_string();
    assert!(e.contains("p.json") && e.contains("malformed"), "{e}");
}

#[test]
fn apparmor_on_a_host_without_it() {
    let cfg = |u| SecurityConfig {
        apparmor_unavailable: u,
        apparmor_securityfs: "/nonexistent/sec".into(),
        apparmor_sysfs: "/nonexistent/sys".into(),
        ..hardened()
    };
    let mut doc = spec(&["CAP_CHOWN"]);
    doc["process"]["apparmorProfile"] = "crio-default".into();
    let e = apply(&mut doc.clone(), &cfg(Unavailable::Reject))
        .unwrap_err()
        .to_string();
    assert!(
        e.contains("crio-default") && e.contains("security.apparmor_unavailable"),
        "{e}"
    );
    apply(&mut doc, &cfg(Unavailable::Drop)).unwrap();
    assert!(doc["process"].get("apparmorProfile").is_none());
    assert_eq!(annotation(&doc, APPARMOR_ANNOTATION), Some("dropped:crio-default"));
}

#[test]
fn odd_documents_do_not_panic() {
    for mut doc in [
        json!({}),
        json!({"process": 5, "annotations": []}),
        json!({"process": {"capabilities": null}}),
    ] {
        let _ = apply(&mut doc, &hardened());
    }
    let mut doc = json!({"process": {"capabilities": {"bounding": "CAP_CHOWN"}}});
    let e = apply(&mut doc, &hardened()).unwrap_err().to_string();
    assert!(e.contains("not a list"), "{e}");
}

#[test]
fn config_validation_names_keys() {
    let bad = [
        ("seccomp_default = \"relative.json\"", "security.seccomp_default"),
        ("allow_unconfined = false", "security.allow_unconfined"),
        (
            "allowed_capabilities = [\"CAP_CHOWN\", \"not a cap\"]",
            "security.allowed_capabilities",
        ),
        ("apparmor_unavailable = \"maybe\"", "security.apparmor_unavailable"),
        ("capability_violation = \"warn\"", "security.capability_violation"),
        ("no_new_privileges = \"yes\"", "security.no_new_privileges"),
    ];
    for (line, key) in bad {
        let text = format!("[security]\n\n{line}\n");
        let e = crate::config::Config::parse(std::path::Path::new("/etc/g.toml"), &text)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains(key) && e.contains("line 3") && e.contains("/etc/g.toml"),
            "{line}: {e}"
        );
    }
    let h = hardened();
    assert_eq!(h.seccomp_default(), SeccompDefault::RuntimeDefault);
    assert!(!h.allow_unconfined && !h.allow_privileged && h.require_default_deny);
    assert!(h.allowed_capabilities.is_some());
}

#[test]
fn probe_prints_the_profile_for_the_given_caps() {
    let p: Profile = serde_json::from_str(&profile_json(Some("CAP_SYS_ADMIN"))).unwrap();
    assert!(p.syscalls[0].names.iter().any(|n| n == "mount"));
    let p: Profile = serde_json::from_str(&profile_json(None)).unwrap();
    assert!(!p.syscalls[0].names.iter().any(|n| n == "mount"));
    assert!(
        p.syscalls[0].names.iter().any(|n| n == "chroot"),
        "containerd's default set has CAP_SYS_CHROOT"
    );
}

#[test]
fn an_unknown_syscall_is_reported_once_per_daemon() {
    let names = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
    assert_eq!(
        first_sightings(&names(&["gantry_test_a", "gantry_test_b"])),
        names(&["gantry_test_a", "gantry_test_b"])
    );
    assert!(first_sightings(&names(&["gantry_test_b", "gantry_test_a"])).is_empty());
    assert_eq!(
        first_sightings(&names(&["gantry_test_a", "gantry_test_c"])),
        names(&["gantry_test_c"])
    );
}
