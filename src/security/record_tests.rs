use super::*;
use crate::security::seccomp::{validate, Checks, Profile};
use crate::security::Unknown;

fn set(names: &[&str]) -> BTreeSet<String> {
    names.iter().map(|s| s.to_string()).collect()
}

fn doc(name: Option<&str>) -> Value {
    match name {
        Some(n) => json!({"annotations": {RECORD_ANNOTATION: n}}),
        None => json!({"annotations": {}}),
    }
}

fn builds(profile: &Value, require_default_deny: bool) {
    let p: Profile = serde_json::from_value(profile.clone()).expect("an OCI seccomp profile");
    let checks = Checks {
        unknown: Unknown::Reject,
        require_default_deny,
        all_arches: true,
    };
    validate(&p, checks).expect("libseccomp builds it on every listed architecture");
}

#[test]
fn recording_is_asked_by_annotation_and_refused_when_off_or_misnamed() {
    let dir = Path::new("/var/lib/gantry/seccomp");
    assert_eq!(plan(&doc(None), dir), Ok(None));
    assert_eq!(
        plan(&doc(Some("web-1")), dir),
        Ok(Some(Recording {
            name: "web-1".into(),
            dir: dir.into()
        }))
    );
    let off = plan(&doc(Some("web-1")), Path::new("")).unwrap_err();
    assert!(off.contains("seccomp_recording_dir"), "{off}");
    for bad in ["", "../x", "a/b", "Web", "-a", "a.", ".lock", &"a".repeat(254)] {
        assert!(plan(&doc(Some(bad)), dir).is_err(), "{bad:?} accepted");
    }
}

#[test]
fn the_recording_filter_notifies_every_known_call_but_the_fixed_few() {
    let f = filter(Path::new("/run/g/seccomp-1"), &[]);
    assert_eq!(f["listenerPath"], "/run/g/seccomp-1");
    assert_eq!(f["defaultAction"], "SCMP_ACT_ALLOW");
    let notified: BTreeSet<&str> = f["syscalls"][1]["names"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(Value::as_str)
        .collect();
    assert_eq!(f["syscalls"][1]["action"], "SCMP_ACT_NOTIFY");
    for n in ["unshare", "chroot", "openat", "socket", "connect", "mount", "clone"] {
        assert!(notified.contains(n), "{n} not notified");
    }
    for n in ALWAYS {
        assert!(!notified.contains(n), "{n} notified");
    }
    assert!(notified.len() > 300, "{} names", notified.len());
    builds(&f, false);
    // A watched name the fixed list holds is notified after all, so its action applies.
    let w = filter(Path::new("/x"), &["read".into()]);
    assert!(w["syscalls"][1]["names"].as_array().unwrap().contains(&json!("read")));
    assert!(!w["syscalls"][0]["names"].as_array().unwrap().contains(&json!("read")));
}

#[test]
fn a_recorded_profile_denies_by_default_and_passes_the_strictest_validation() {
    let p = profile(&set(&["openat", "uname"]));
    assert_eq!(p["defaultAction"], "SCMP_ACT_ERRNO");
    let names = allowed_names(&p).unwrap();
    assert!(names.contains("uname") && names.contains("write") && !names.contains("unshare"));
    builds(&p, true);
}

#[test]
fn recordings_of_one_name_merge_and_the_yaml_is_a_seccomp_profile_object() {
    let tmp = tempfile::tempdir().unwrap();
    let rec = Recording {
        name: "busybox".into(),
        dir: tmp.path().join("profiles"),
    };
    let first = save(&rec, &set(&["openat", "uname"])).unwrap();
    assert_eq!(first.path, rec.json_path());
    assert_eq!(first.added, first.allowed, "a new profile: everything is added");
    let again = save(&rec, &set(&["uname"])).unwrap();
    assert_eq!((again.added, again.allowed), (0, first.allowed));
    let more = save(&rec, &set(&["getcwd"])).unwrap();
    assert_eq!((more.added, more.allowed), (1, first.allowed + 1));
    let names = allowed_names(&read(&rec.json_path()).unwrap()).unwrap();
    assert!(names.contains("openat") && names.contains("getcwd"));

    let yaml: Value = serde_yaml_ng::from_slice(&std::fs::read(rec.yaml_path()).unwrap()).unwrap();
    assert_eq!(yaml["apiVersion"], "security-profiles-operator.x-k8s.io/v1beta1");
    assert_eq!(yaml["kind"], "SeccompProfile");
    assert_eq!(yaml["metadata"]["name"], "busybox");
    assert_eq!(yaml["spec"]["defaultAction"], "SCMP_ACT_ERRNO");
    assert_eq!(yaml["spec"]["architectures"], json!(seccomp_arches()));
    assert_eq!(yaml["spec"]["syscalls"][0]["action"], "SCMP_ACT_ALLOW");
    assert_eq!(allowed_names(&yaml["spec"]).unwrap(), names);

    assert_eq!(
        recorded_json(&rec.dir, "busybox").unwrap(),
        std::fs::read_to_string(rec.json_path()).unwrap()
    );
    assert!(matches!(
        recorded_json(&rec.dir, "none-such"),
        Err(RecordError::Io { .. })
    ));
    assert!(matches!(
        recorded_json(Path::new(""), "busybox"),
        Err(RecordError::Refused(_))
    ));
}

#[test]
fn a_profile_that_is_not_ours_is_never_overwritten() {
    let tmp = tempfile::tempdir().unwrap();
    let rec = Recording {
        name: "x".into(),
        dir: tmp.path().into(),
    };
    std::fs::write(rec.json_path(), "{not json").unwrap();
    assert!(matches!(save(&rec, &set(&["uname"])), Err(RecordError::Parse { .. })));
    assert_eq!(std::fs::read_to_string(rec.json_path()).unwrap(), "{not json");
}

fn seccomp_arches() -> Vec<String> {
    crate::security::seccomp::architectures(std::env::consts::ARCH)
}
