//! End-to-end tests of [`inject`] over fake hosts (temp dev roots with real
//! character nodes, nvidia-ctk-shaped specs).

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};

use oci_spec::runtime::{LinuxDeviceType, Spec};
use serde_json::json;

use super::fixture::{fake_gpu_uuid, is_root, ldcache_hook_args, make_fake_nvidia, write_nvidia_cdi_spec};
use super::*;

const HOOK: &str = "/usr/bin/nvidia-cdi-hook";
const LIB_DEST: &str = "/usr/lib/x86_64-linux-gnu/libcuda.so.1";

/// A fake host: dev root with `gpus` GPUs, CDI dirs `etc` and `run`.
struct Host {
    _dir: tempfile::TempDir,
    root: PathBuf,
    dev: PathBuf,
    etc: PathBuf,
    run: PathBuf,
    lib: PathBuf,
}

impl Host {
    /// Always `Some`; refuses to run (fails) when not root, since mknod needs root and a
    /// skipped test must never count as a pass.
    fn new(gpus: u32) -> Option<Host> {
        assert!(
            is_root(),
            "this test creates device nodes: run the suite as root (scripts/test.sh)"
        );
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().to_path_buf();
        let dev = root.join("dev");
        make_fake_nvidia(&dev, gpus, 508).unwrap();
        let lib = root.join("libcuda.so.1");
        fs::write(&lib, b"").unwrap();
        Some(Host {
            etc: root.join("etc-cdi"),
            run: root.join("run-cdi"),
            _dir: dir,
            root,
            dev,
            lib,
        })
    }

    fn with_spec(gpus: u32) -> Option<(Host, PathBuf)> {
        let host = Host::new(gpus)?;
        let spec = write_nvidia_cdi_spec(&host.run, &host.dev, gpus, HOOK, ldcache_hook_args(), &host.lib).unwrap();
        Some((host, spec))
    }

    fn cfg(&self) -> DeviceConfig {
        DeviceConfig {
            cdi_spec_dirs: vec![self.etc.clone(), self.run.clone()],
            dev_root: self.dev.clone(),
            // These tests resolve env requests; the default trust model is tested apart.
            nvidia_visible_devices: true,
            ..Default::default()
        }
    }
}

/// A spec as an engine hands it over (trimmed): env, a leading deny-all rule.
fn engine_spec(env: &[&str], annotations: &[(&str, &str)]) -> Spec {
    let mut env_list = vec!["PATH=/usr/bin:/bin".to_string()];
    env_list.extend(env.iter().map(|s| s.to_string()));
    let ann: HashMap<String, String> = annotations
        .iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
    serde_json::from_value(json!({
        "ociVersion": "1.1.0",
        "process": {"user": {"uid": 0, "gid": 0}, "cwd": "/", "args": ["nvidia-smi"], "env": env_list},
        "root": {"path": "rootfs"},
        "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
        "annotations": ann,
        "linux": {
            "resources": {"devices": [{"allow": false, "access": "rwm"}]},
            "namespaces": [{"type": "mount"}]
        }
    }))
    .unwrap()
}

fn node_paths(spec: &Spec) -> Vec<String> {
    spec.linux()
        .as_ref()
        .and_then(|l| l.devices().clone())
        .unwrap_or_default()
        .iter()
        .map(|d| d.path().display().to_string())
        .collect()
}

/// (allow, type, major, minor, access) of a cgroup device rule.
type Rule = (bool, Option<LinuxDeviceType>, Option<i64>, Option<i64>, Option<String>);

fn rules(spec: &Spec) -> Vec<Rule> {
    spec.linux()
        .as_ref()
        .and_then(|l| l.resources().clone())
        .and_then(|r| r.devices().clone())
        .unwrap_or_default()
        .iter()
        .map(|r| (r.allow(), r.typ(), r.major(), r.minor(), r.access().clone()))
        .collect()
}

fn allow(major: i64, minor: i64) -> Rule {
    (
        true,
        Some(LinuxDeviceType::C),
        Some(major),
        Some(minor),
        Some("rwm".to_string()),
    )
}

fn env_of(spec: &Spec) -> Vec<String> {
    spec.process()
        .as_ref()
        .and_then(|p| p.env().clone())
        .unwrap_or_default()
}

fn injected(spec: &Spec) -> Option<String> {
    spec.annotations()
        .as_ref()
        .and_then(|a| a.get(INJECTED_ANNOTATION).cloned())
}

#[test]
fn nothing_requested_touches_nothing() {
    // Spec dirs that would produce a warning if read: a regular file.
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("not-a-dir");
    fs::write(&file, "").unwrap();
    let cfg = DeviceConfig {
        cdi_spec_dirs: vec![file.clone()],
        dev_root: file,
        ..Default::default()
    };
    for env in [
        vec![],
        vec!["NVIDIA_VISIBLE_DEVICES="],
        vec!["NVIDIA_VISIBLE_DEVICES=none"],
        vec!["NVIDIA_VISIBLE_DEVICES=void"],
        vec!["NVIDIA_VISIBLE_DEVICES=void", "NVIDIA_VISIBLE_DEVICES=all"],
    ] {
        let mut spec = engine_spec(&env, &[("io.kubernetes.cri.container-type", "container")]);
        let before = spec.clone();
        let got = inject(&mut spec, &cfg, false).unwrap();
        assert_eq!(got, Injection::default(), "{env:?}");
        assert!(got.is_empty());
        assert_eq!(spec, before, "{env:?}");
    }
}

#[test]
fn annotation_request_injects_cdi_edits() {
    let Some((host, spec_file)) = Host::with_spec(2) else {
        return;
    };
    let mut spec = engine_spec(
        &["NVIDIA_VISIBLE_DEVICES=all"],
        &[("cdi.k8s.io/nvidia-device-plugin_x", "nvidia.com/gpu=1")],
    );
    let got = inject(&mut spec, &host.cfg(), false).unwrap();

    assert_eq!(got.devices, ["nvidia.com/gpu=1"]);
    assert_eq!(got.spec_files, std::slice::from_ref(&spec_file));
    assert_eq!(
        got.sources,
        [InjectedDevice {
            device: "nvidia.com/gpu=1".into(),
            origin: Origin::Annotation("cdi.k8s.io/nvidia-device-plugin_x".into()),
            resolution: Resolution::Cdi { spec_file },
        }]
    );
    assert!(got.warnings.is_empty(), "{:?}", got.warnings);
    assert_eq!(
        node_paths(&spec),
        [
            "/dev/nvidiactl",
            "/dev/nvidia-uvm",
            "/dev/nvidia-uvm-tools",
            "/dev/nvidia-modeset",
            "/dev/nvidia1"
        ]
    );
    let r = rules(&spec);
    assert_eq!(
        r[0],
        (false, None, None, None, Some("rwm".into())),
        "deny-all stays first"
    );
    assert_eq!(
        &r[1..],
        [
            allow(195, 255),
            allow(508, 0),
            allow(508, 1),
            allow(195, 254),
            allow(195, 1)
        ]
    );
    // The CDI marker replaced the image's selection: no second injection by env.
    assert_eq!(env_of(&spec), ["PATH=/usr/bin:/bin", "NVIDIA_VISIBLE_DEVICES=void"]);
    let mounts = spec.mounts().clone().unwrap();
    let lib = mounts.iter().find(|m| m.destination() == Path::new(LIB_DEST)).unwrap();
    assert_eq!(lib.source().as_deref(), Some(host.lib.as_path()));
    assert_eq!(lib.options().clone().unwrap(), ["ro", "nosuid", "nodev", "bind"]);
    let hooks = spec.hooks().as_ref().unwrap().create_container().clone().unwrap();
    assert_eq!(hooks.len(), 1);
    assert_eq!(hooks[0].path(), Path::new(HOOK));
    assert_eq!(hooks[0].args().clone().unwrap(), ldcache_hook_args());
    let dev = spec.linux().as_ref().unwrap().devices().clone().unwrap();
    let gpu1 = dev.iter().find(|d| d.path() == Path::new("/dev/nvidia1")).unwrap();
    assert_eq!(
        (gpu1.typ(), gpu1.major(), gpu1.minor(), gpu1.file_mode()),
        (LinuxDeviceType::C, 195, 1, Some(0o666))
    );
    assert_eq!(injected(&spec).as_deref(), Some("nvidia.com/gpu=1"));
    assert_eq!(got.stats.nodes_added, 5);
    assert_eq!(got.stats.rules_added, 5);

    // Twice: identical spec.
    let once = spec.clone();
    let again = inject(&mut spec, &host.cfg(), false).unwrap();
    assert_eq!(spec, once);
    assert_eq!(again.devices, ["nvidia.com/gpu=1"]);
    assert_eq!(
        (
            again.stats.nodes_added,
            again.stats.rules_added,
            again.stats.hooks_added,
            again.stats.mounts_added,
            again.stats.env_set
        ),
        (0, 0, 0, 0, 0)
    );
    assert_eq!(
        (
            again.stats.nodes_present,
            again.stats.hooks_present,
            again.stats.mounts_present
        ),
        (5, 1, 1)
    );
}

#[test]
fn every_request_form() {
    let Some((host, _)) = Host::with_spec(2) else {
        return;
    };
    let uuid = fake_gpu_uuid(1);
    struct Case {
        env: Vec<String>,
        ann: Vec<(&'static str, String)>,
        defaults: Vec<String>,
        want_devices: Vec<String>,
        want_gpus: Vec<&'static str>,
    }
    /// One row: the container's env, its annotations and the configured defaults; the
    /// devices and GPU nodes they must resolve to.
    fn case(
        env: &[&str],
        ann: &[(&'static str, &str)],
        defaults: &[&str],
        want: &[&str],
        gpus: &[&'static str],
    ) -> Case {
        let own = |v: &[&str]| v.iter().map(|s| s.to_string()).collect();
        Case {
            env: own(env),
            ann: ann.iter().map(|(k, v)| (*k, v.to_string())).collect(),
            defaults: own(defaults),
            want_devices: own(want),
            want_gpus: gpus.to_vec(),
        }
    }
    let s = |v: &str| v.to_string();
    let by_uuid = format!("nvidia.com/gpu={uuid}");
    let env_uuid = format!("NVIDIA_VISIBLE_DEVICES={uuid}");
    let (gpu0, gpu1, both) = ("nvidia.com/gpu=0", "nvidia.com/gpu=1", ["/dev/nvidia0", "/dev/nvidia1"]);
    #[rustfmt::skip] // one case a line
    let cases = vec![
        case(&[], &[("gantry.dev/devices", gpu0)], &[], &[gpu0], &["/dev/nvidia0"]),
        case(&[], &[("cdi.k8s.io/a", "nvidia.com/gpu=0,nvidia.com/gpu=1")], &[], &[gpu0, gpu1], &both),
        case(&[], &[("cdi.k8s.io/a", &by_uuid)], &[], &[&by_uuid], &["/dev/nvidia1"]),
        case(&[], &[], &[gpu1], &[gpu1], &["/dev/nvidia1"]),
        case(&["NVIDIA_VISIBLE_DEVICES=all"], &[], &[], &["nvidia.com/gpu=all"], &both),
        case(&["NVIDIA_VISIBLE_DEVICES=1,0"], &[], &[], &[gpu1, gpu0], &["/dev/nvidia1", "/dev/nvidia0"]),
        case(&[&env_uuid], &[], &[], &[&by_uuid], &["/dev/nvidia1"]),
        // explicit request + image default env=all: the CDI void marker wins
        case(&["NVIDIA_VISIBLE_DEVICES=all"], &[("gantry.dev/devices", gpu0)], &[], &[gpu0], &["/dev/nvidia0"]),
        // the same device from two sources is injected once
        case(&[], &[("gantry.dev/devices", gpu0), ("cdi.k8s.io/b", gpu0)], &[gpu0], &[gpu0], &["/dev/nvidia0"]),
        case(&["NVIDIA_VISIBLE_DEVICES=none"], &[], &[], &[], &[]),
    ];
    for (i, c) in cases.into_iter().enumerate() {
        let env: Vec<&str> = c.env.iter().map(String::as_str).collect();
        let ann: Vec<(&str, &str)> = c.ann.iter().map(|(k, v)| (*k, v.as_str())).collect();
        let mut spec = engine_spec(&env, &ann);
        let cfg = DeviceConfig {
            default_devices: c.defaults.clone(),
            ..host.cfg()
        };
        let got = inject(&mut spec, &cfg, false).unwrap();
        assert_eq!(got.devices, c.want_devices, "case {i}");
        let gpus: Vec<String> = node_paths(&spec)
            .into_iter()
            .filter(|p| p.starts_with("/dev/nvidia") && p[11..].chars().all(|c| c.is_ascii_digit()))
            .collect();
        assert_eq!(gpus, c.want_gpus, "case {i}");
        if !c.want_devices.is_empty() {
            assert_eq!(injected(&spec), Some(c.want_devices.join(",")), "case {i}");
            assert!(env_of(&spec).contains(&s("NVIDIA_VISIBLE_DEVICES=void")), "case {i}");
        }
        let once = spec.clone();
        inject(&mut spec, &cfg, false).unwrap();
        assert_eq!(spec, once, "case {i}: second injection changed the spec");
    }
}

/// A spec as containerd/CRI-O leave it after their own CDI injection of
/// nvidia.com/gpu=0 — except that the engine forgot the nvidia-uvm rule.
#[test]
fn engine_pre_injected_spec_is_not_duplicated() {
    let Some((host, _)) = Host::with_spec(1) else {
        return;
    };
    let node = |p: &str, major: i64, minor: i64| json!({"path": p, "type": "c", "major": major, "minor": minor, "fileMode": 8630});
    let rule =
        |major: i64, minor: i64| json!({"allow": true, "type": "c", "major": major, "minor": minor, "access": "rwm"});
    let mut spec: Spec = serde_json::from_value(json!({
        "ociVersion": "1.1.0",
        "process": {"user": {"uid": 0, "gid": 0}, "cwd": "/", "args": ["nvidia-smi"],
                    "env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=void"]},
        "root": {"path": "rootfs"},
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc"},
            {"destination": LIB_DEST, "source": host.lib, "options": ["ro", "nosuid", "nodev", "bind"]}
        ],
        "hooks": {"createContainer": [{"path": HOOK, "args": ldcache_hook_args()}]},
        "annotations": {"cdi.k8s.io/nvidia-device-plugin_abc": "nvidia.com/gpu=0"},
        "linux": {
            "devices": [
                node("/dev/nvidiactl", 195, 255), node("/dev/nvidia-uvm", 508, 0),
                node("/dev/nvidia-uvm-tools", 508, 1), node("/dev/nvidia-modeset", 195, 254),
                node("/dev/nvidia0", 195, 0)
            ],
            "resources": {"devices": [
                {"allow": false, "access": "rwm"},
                rule(195, 255), rule(508, 1), rule(195, 254), rule(195, 0)
            ]}
        }
    }))
    .unwrap();
    let before = spec.clone();
    let got = inject(&mut spec, &host.cfg(), false).unwrap();
    assert_eq!(got.devices, ["nvidia.com/gpu=0"]);
    assert_eq!(got.stats.nodes_present, 5);
    assert_eq!(
        (got.stats.nodes_added, got.stats.rules_added),
        (0, 1),
        "only the missing uvm rule"
    );
    assert_eq!(
        (
            got.stats.env_set,
            got.stats.hooks_added,
            got.stats.mounts_added,
            got.stats.gids_added
        ),
        (0, 0, 0, 0)
    );
    assert_eq!(node_paths(&spec), node_paths(&before));
    assert_eq!(rules(&spec).last().cloned(), Some(allow(508, 0)));
    assert_eq!(rules(&spec).len(), rules(&before).len() + 1);
    assert_eq!(env_of(&spec), env_of(&before));
    assert_eq!(spec.mounts(), before.mounts());
    assert_eq!(spec.hooks(), before.hooks());
    // Apart from the rule and the record, nothing changed.
    let mut expected = before;
    expected.set_linux(spec.linux().clone());
    expected
        .annotations_mut()
        .as_mut()
        .unwrap()
        .insert(INJECTED_ANNOTATION.into(), "nvidia.com/gpu=0".into());
    assert_eq!(spec, expected);
}

#[test]
fn fallback_discovery_without_cdi_spec() {
    let Some(host) = Host::new(3) else { return };
    // An unrelated vendor's spec must not prevent the fallback.
    fs::create_dir_all(&host.etc).unwrap();
    fs::write(
        host.etc.join("accel.yaml"),
        "cdiVersion: \"0.5.0\"\nkind: example.com/accel\ndevices:\n  - name: a0\n    containerEdits:\n      env: [A=1]\n",
    )
    .unwrap();
    let control = [
        "/dev/nvidiactl",
        "/dev/nvidia-uvm",
        "/dev/nvidia-uvm-tools",
        "/dev/nvidia-modeset",
        "/dev/nvidia-caps/nvidia-cap1",
        "/dev/nvidia-caps/nvidia-cap2",
    ];
    for (value, gpus) in [
        ("1", vec!["/dev/nvidia1"]),
        ("2,0", vec!["/dev/nvidia2", "/dev/nvidia0"]),
        ("all", vec!["/dev/nvidia0", "/dev/nvidia1", "/dev/nvidia2"]),
    ] {
        let mut spec = engine_spec(&[&format!("NVIDIA_VISIBLE_DEVICES={value}")], &[]);
        let got = inject(&mut spec, &host.cfg(), false).unwrap();
        let mut want: Vec<String> = gpus.iter().map(|s| s.to_string()).collect();
        want.extend(control.iter().map(|s| s.to_string()));
        assert_eq!(node_paths(&spec), want, "{value}");
        let names: Vec<String> = want.iter().map(|p| format!("dev:{p}")).collect();
        assert_eq!(got.devices, names, "{value}");
        assert_eq!(injected(&spec), Some(names.join(",")));
        assert!(got.spec_files.is_empty());
        assert!(matches!(got.sources[0].resolution, Resolution::Fallback { .. }));
        assert_eq!(got.sources[0].origin, Origin::Env);
        let r = rules(&spec);
        assert_eq!(r.len(), 1 + want.len());
        assert!(r.contains(&allow(508, 0)) && r.contains(&allow(509, 2)) && r.contains(&allow(195, 255)));
        // the env is left alone: no CDI marker without CDI
        assert_eq!(env_of(&spec)[1], format!("NVIDIA_VISIBLE_DEVICES={value}"));
        let once = spec.clone();
        inject(&mut spec, &host.cfg(), false).unwrap();
        assert_eq!(spec, once, "{value}: second injection changed the spec");
    }

    // UUIDs cannot be resolved without a spec
    let uuid = fake_gpu_uuid(0);
    let mut spec = engine_spec(&[&format!("NVIDIA_VISIBLE_DEVICES={uuid}")], &[]);
    let before = spec.clone();
    let msg = inject(&mut spec, &host.cfg(), false).unwrap_err().to_string();
    assert!(
        msg.contains(&uuid) && msg.contains("nvidia-ctk") && msg.contains(&host.run.display().to_string()),
        "{msg}"
    );
    assert_eq!(spec, before);

    // a missing index names the node and the device
    let spec = engine_spec(&["NVIDIA_VISIBLE_DEVICES=0,7"], &[]);
    assert_node_missing(&host, spec, "nvidia7", "nvidia.com/gpu=7");
}

#[test]
fn fallback_all_without_gpus_fails_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = DeviceConfig {
        cdi_spec_dirs: vec![dir.path().join("cdi")],
        dev_root: dir.path().join("dev"),
        nvidia_visible_devices: true,
        ..Default::default()
    };
    let mut spec = engine_spec(&["NVIDIA_VISIBLE_DEVICES=all"], &[]);
    let msg = inject(&mut spec, &cfg, false).unwrap_err().to_string();
    assert!(
        msg.contains("nvidia.com/gpu=all") && msg.contains(&dir.path().join("dev").display().to_string()),
        "{msg}"
    );
}

#[test]
fn env_selection_policy() {
    let Some((host, _)) = Host::with_spec(1) else {
        return;
    };
    let off = DeviceConfig {
        nvidia_visible_devices: false,
        ..host.cfg()
    };
    let mut spec = engine_spec(&["NVIDIA_VISIBLE_DEVICES=0"], &[]);
    let before = spec.clone();
    let got = inject(&mut spec, &off, false).unwrap();
    assert!(got.is_empty() && got.warnings.len() == 1 && got.warnings[0].contains("nvidia_visible_devices"));
    assert_eq!(spec, before);
    // privileged containers are honoured regardless
    let got = inject(&mut spec, &off, true).unwrap();
    assert_eq!(got.devices, ["nvidia.com/gpu=0"]);
}

#[test]
fn policy_denials_through_inject() {
    let Some((host, _)) = Host::with_spec(1) else {
        return;
    };
    let no_ann = DeviceConfig {
        allow_annotations: false,
        ..host.cfg()
    };
    let no_all = DeviceConfig {
        allow_all: false,
        ..host.cfg()
    };
    let priv_all = DeviceConfig {
        allow_all: false,
        privileged_all_devices: true,
        ..host.cfg()
    };
    for (cfg, privileged, env, ann, policy) in [
        (
            &no_ann,
            false,
            "",
            "nvidia.com/gpu=0",
            Some("devices.allow_annotations"),
        ),
        (&no_all, false, "", "nvidia.com/gpu=all", Some("devices.allow_all")),
        (
            &no_all,
            false,
            "NVIDIA_VISIBLE_DEVICES=all",
            "",
            Some("devices.allow_all"),
        ),
        (
            &no_all,
            true,
            "NVIDIA_VISIBLE_DEVICES=all",
            "",
            Some("devices.privileged_all_devices"),
        ),
        (&priv_all, true, "NVIDIA_VISIBLE_DEVICES=all", "", None),
        (&priv_all, false, "", "nvidia.com/gpu=all", Some("devices.allow_all")),
        (&no_all, false, "NVIDIA_VISIBLE_DEVICES=0", "", None),
    ] {
        let env: Vec<&str> = if env.is_empty() { vec![] } else { vec![env] };
        let ann: Vec<(&str, &str)> = if ann.is_empty() {
            vec![]
        } else {
            vec![("gantry.dev/devices", ann)]
        };
        let mut spec = engine_spec(&env, &ann);
        let before = spec.clone();
        match (inject(&mut spec, cfg, privileged), policy) {
            (Ok(got), None) => assert!(!got.is_empty()),
            (Err(e), Some(policy)) => {
                let msg = e.to_string();
                assert!(
                    matches!(e, DeviceError::PolicyDenied { .. }) && msg.contains(policy),
                    "{msg}"
                );
                assert_eq!(spec, before);
            }
            (got, want) => {
                panic!("{env:?} {ann:?} privileged={privileged}: got {got:?}, want denial {want:?}")
            }
        }
    }
}

#[test]
fn errors_name_devices_and_paths() {
    let Some((host, spec_file)) = Host::with_spec(1) else {
        return;
    };

    // unknown device: device, the kind's spec file, the directories
    let mut spec = engine_spec(&[], &[("gantry.dev/devices", "nvidia.com/gpu=3")]);
    let msg = inject(&mut spec, &host.cfg(), false).unwrap_err().to_string();
    for needle in [
        "nvidia.com/gpu=3",
        &spec_file.display().to_string(),
        &host.etc.display().to_string(),
        &host.run.display().to_string(),
    ] {
        assert!(msg.contains(needle), "{needle} missing from {msg}");
    }

    // a node the spec names but the host lacks
    fs::remove_file(host.dev.join("nvidia-uvm-tools")).unwrap();
    let spec = engine_spec(&[], &[("gantry.dev/devices", "nvidia.com/gpu=0")]);
    assert_node_missing(&host, spec, "nvidia-uvm-tools", "nvidia.com/gpu=0");

    // malformed spec: file and parser message; reported only when it matters
    make_fake_nvidia(&host.dev, 1, 508).unwrap();
    let bad = host.etc.join("vendor.yaml");
    fs::create_dir_all(&host.etc).unwrap();
    fs::write(&bad, "cdiVersion: [").unwrap();
    let mut spec = engine_spec(&[], &[("gantry.dev/devices", "example.com/x=1")]);
    let err = inject(&mut spec, &host.cfg(), false).unwrap_err();
    let msg = err.to_string();
    assert!(
        matches!(err, DeviceError::MalformedSpec { .. }) && msg.contains(&bad.display().to_string()),
        "{msg}"
    );
    let mut spec = engine_spec(&[], &[("gantry.dev/devices", "nvidia.com/gpu=0")]);
    let got = inject(&mut spec, &host.cfg(), false).unwrap();
    assert!(
        got.warnings.iter().any(|w| w.contains(&bad.display().to_string())),
        "{:?}",
        got.warnings
    );

    // conflict in one directory names both files
    fs::remove_file(&bad).unwrap();
    let copy = host.run.join("nvidia-2.json");
    fs::copy(&spec_file, &copy).unwrap();
    let mut spec = engine_spec(&[], &[("gantry.dev/devices", "nvidia.com/gpu=0")]);
    let err = inject(&mut spec, &host.cfg(), false).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, DeviceError::ConflictingSpecs { .. }), "{msg}");
    assert!(
        msg.contains(&spec_file.display().to_string()) && msg.contains(&copy.display().to_string()),
        "{msg}"
    );
    // the same spec in a lower-priority directory is no conflict
    fs::create_dir_all(&host.etc).unwrap();
    fs::rename(&copy, host.etc.join("nvidia.json")).unwrap();
    let got = inject(&mut spec, &host.cfg(), false).unwrap();
    assert_eq!(got.spec_files, [spec_file]);

    // bad request syntax
    let mut spec = engine_spec(&[], &[("cdi.k8s.io/x", "gpu0")]);
    let msg = inject(&mut spec, &host.cfg(), false).unwrap_err().to_string();
    assert!(msg.contains("gpu0") && msg.contains("cdi.k8s.io/x"), "{msg}");
    let _ = &host.root;
}

#[test]
fn yaml_spec_with_gids_and_explicit_numbers() {
    let Some(host) = Host::new(0) else { return };
    fs::create_dir_all(&host.etc).unwrap();
    fs::write(
        host.etc.join("accel.yaml"),
        r#"cdiVersion: "1.1.0"
kind: example.com/accel
devices:
  - name: "a0"
    containerEdits:
      deviceNodes:
        - {path: /dev/accel0, type: c, major: 240, minor: 3, permissions: rw, gid: 44}
      additionalGids: [44]
      env: ["ACCEL_VISIBLE=0"]
      hooks:
        - {hookName: poststop, path: /usr/bin/accel-cleanup, args: [accel-cleanup]}
"#,
    )
    .unwrap();
    let mut spec = engine_spec(&[], &[]);
    let cfg = DeviceConfig {
        default_devices: vec!["example.com/accel=a0".into()],
        ..host.cfg()
    };
    let got = inject(&mut spec, &cfg, false).unwrap();
    assert_eq!(got.devices, ["example.com/accel=a0"]);
    assert_eq!(got.sources[0].origin, Origin::Config);
    assert_eq!(
        rules(&spec)[1],
        (true, Some(LinuxDeviceType::C), Some(240), Some(3), Some("rw".into()))
    );
    let p = spec.process().as_ref().unwrap();
    assert_eq!(p.user().additional_gids().clone().unwrap(), [44]);
    assert!(env_of(&spec).contains(&"ACCEL_VISIBLE=0".to_string()));
    assert_eq!(spec.hooks().as_ref().unwrap().poststop().as_ref().unwrap().len(), 1);
    let once = spec.clone();
    inject(&mut spec, &cfg, false).unwrap();
    assert_eq!(spec, once);
}

#[test]
fn privileged_heuristic() {
    assert!(is_privileged(&[
        "CAP_CHOWN",
        "CAP_SYS_ADMIN",
        "CAP_SYS_MODULE",
        "CAP_SYS_RAWIO"
    ]));
    // Spelled as oci-spec accepts them too, and next to names it does not know.
    assert!(is_privileged(&[
        "sys_admin",
        "cap_SYS_MODULE",
        "SYS_RAWIO",
        "CAP_FUTURE_THING"
    ]));
    assert!(!is_privileged(&["CAP_SYS_ADMIN", "CAP_SYS_RAWIO"]));
    assert!(!is_privileged(&["CAP_CHOWN", "CAP_NET_BIND_SERVICE"]));
    assert!(!is_privileged::<&str>(&[]));
    // Multi-byte characters where the CAP_ prefix would end (found by fuzz/spec; panicked).
    assert!(!is_privileged(&["¡ࠀ", "CA\u{e9}", "\u{556ce}x"]));
}

/// Injection into `spec` fails naming the missing `node` under the host's /dev and the
/// `device` that needed it, and leaves the spec as it was.
fn assert_node_missing(host: &Host, mut spec: Spec, node: &str, device: &str) {
    let before = spec.clone();
    let err = inject(&mut spec, &host.cfg(), false).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, DeviceError::NodeMissing { .. }));
    assert!(
        msg.contains(&host.dev.join(node).display().to_string()) && msg.contains(device),
        "{msg}"
    );
    assert_eq!(spec, before, "untouched on error");
}
