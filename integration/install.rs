//! scripts/install.sh against a DESTDIR, and `check-config`.

use std::path::Path;
use std::process::Command;

use crate::common::{run, text, SHIM};

fn install(destdir: &Path, extra: &[&str]) -> std::process::Output {
    let repo = env!("CARGO_MANIFEST_DIR");
    run(Command::new("bash")
        .arg(format!("{repo}/scripts/install.sh"))
        .args(["--binary", SHIM, "--engine", "crio"])
        .args(extra)
        .env("DESTDIR", destdir))
}

fn files_under(dir: &Path) -> Vec<String> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        out.push(p.strip_prefix(dir).unwrap_or(&p).display().to_string());
        if p.is_dir() {
            out.extend(
                files_under(&p)
                    .into_iter()
                    .map(|f| format!("{}/{f}", e.file_name().to_string_lossy())),
            );
        }
    }
    out.sort();
    out
}

#[test]
fn install_is_idempotent_refuses_changed_config_and_uninstalls_everything() {
    let dest = tempfile::tempdir().unwrap();
    let o = install(dest.path(), &[]);
    assert!(o.status.success(), "{}", text(&o));
    let bin = dest.path().join("usr/local/bin/containerd-shim-gantry-v2");
    let cfg = dest.path().join("etc/gantry/config.toml");
    let dropin = dest.path().join("etc/crio/crio.conf.d/99-gantry.conf");
    assert!(
        bin.exists() && cfg.exists() && dropin.exists(),
        "{:?}",
        files_under(dest.path())
    );
    let dropin_text = std::fs::read_to_string(&dropin).unwrap();
    assert!(
        dropin_text.contains("runtime_path = \"/usr/local/bin/containerd-shim-gantry-v2\""),
        "{dropin_text}"
    );
    assert!(dropin_text.contains("runtime_type = \"vm\""), "{dropin_text}");

    // Again: nothing changes.
    let o = install(dest.path(), &[]);
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("unchanged"), "{}", text(&o));

    // A locally edited config is not overwritten without --force.
    std::fs::write(&cfg, "[shim]\nlog_level = \"debug\"\n").unwrap();
    let o = install(dest.path(), &[]);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("--force"), "{}", text(&o));
    let o = install(dest.path(), &["--force"]);
    assert!(o.status.success(), "{}", text(&o));

    let o = install(dest.path(), &["--uninstall"]);
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(files_under(dest.path()), Vec::<String>::new());
}

#[test]
fn check_config_names_file_line_and_key() {
    let dir = tempfile::tempdir().unwrap();
    let good = Path::new(env!("CARGO_MANIFEST_DIR")).join("runtime-conf/gantry.toml");
    let o = run(Command::new(SHIM).args(["check-config", good.to_str().unwrap()]));
    assert!(o.status.success(), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("log_level"), "{}", text(&o));

    let bad = dir.path().join("bad.toml");
    std::fs::write(&bad, "[shim]\nsocket_dir = \"/run/g\"\n[devices]\nnvidia_kind = 5\n").unwrap();
    let o = run(Command::new(SHIM).args(["check-config", bad.to_str().unwrap()]));
    assert!(!o.status.success());
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(
        err.contains("bad.toml") && err.contains("line 4") && err.contains("devices.nvidia_kind"),
        "{err}"
    );

    let o = run(Command::new(SHIM).args(["check-config", "/nonexistent/gantry.toml"]));
    assert!(!o.status.success());
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("/nonexistent/gantry.toml"),
        "{}",
        text(&o)
    );
}

#[test]
fn probes_start_nothing() {
    let o = run(Command::new(SHIM).arg("-v"));
    assert!(o.status.success(), "{}", text(&o));
    let v = String::from_utf8_lossy(&o.stdout);
    assert!(
        v.contains("containerd-shim-gantry-v2") && v.contains("Version:") && v.contains("Revision:"),
        "{v}"
    );

    let o = run(Command::new(SHIM).arg("features"));
    assert!(o.status.success(), "{}", text(&o));
    let f: serde_json::Value = serde_json::from_slice(&o.stdout).unwrap();
    assert!(f["ociVersionMax"].is_string(), "{f}");

    let o = run(Command::new(SHIM).arg("-info"));
    assert!(o.status.success(), "{}", text(&o));
    let info: containerd_shim_protos::types::introspection::RuntimeInfo =
        protobuf::Message::parse_from_bytes(&o.stdout).unwrap();
    assert_eq!(info.name, "io.containerd.gantry.v2");
    // containerd 2.x resolves the Any by this name and decodes its value as JSON.
    let any = info.features.as_ref().expect("features");
    assert_eq!(
        any.type_url,
        "types.containerd.io/opencontainers/runtime-spec/1/features/Features"
    );
    let features: serde_json::Value = serde_json::from_slice(&any.value).unwrap();
    assert_eq!(features, f, "the configured runtime's own features document");
}

/// Runs `-info` with `stdin` as containerd 2.3 gives it (the handler's options, marshalled).
fn info_with(stdin: &[u8]) -> std::process::Output {
    crate::common::run_with_stdin(Command::new(SHIM).arg("-info"), stdin)
}

/// The `features` JSON inside `-info`'s answer.
fn info_features(
    o: &std::process::Output,
) -> (
    serde_json::Value,
    containerd_shim_protos::types::introspection::RuntimeInfo,
) {
    assert!(o.status.success(), "{}", text(o));
    let info: containerd_shim_protos::types::introspection::RuntimeInfo =
        protobuf::Message::parse_from_bytes(&o.stdout).unwrap();
    let any = info.features.as_ref().expect("features");
    (serde_json::from_slice(&any.value).unwrap(), info)
}

/// A stand-in OCI runtime whose `features` names itself.
fn fake_runtime(dir: &Path, name: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    let p = dir.join(name);
    std::fs::write(
        &p,
        format!(
            "#!/bin/sh\ncase \" $* \" in *' features '*) echo '{{\"ociVersionMin\":\"1.0.0\",\"ociVersionMax\":\"1.2.0\",\"annotations\":{{\"runtime\":\"{name}\"}}}}';; *) exit 1;; esac\n"
        ),
    )
    .unwrap();
    std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o755)).unwrap();
    p
}

/// containerd 2.3 passes the handler's options on `-info`'s stdin: runc `Options.BinaryName`
/// or the config that CRI's `ConfigPath` names picks the runtime whose features are reported,
/// the options come back in `RuntimeInfo.options`, and bytes that are no `Any` are refused.
#[test]
fn info_reports_the_runtime_the_handlers_options_select() {
    use containerd_shim_protos::protobuf::well_known_types::any::Any;
    use protobuf::Message;
    let dir = tempfile::tempdir().unwrap();
    let by_options = fake_runtime(dir.path(), "runtime-from-options");
    let by_config = fake_runtime(dir.path(), "runtime-from-config");

    let runc = containerd_shim_protos::shim::oci::Options {
        binary_name: by_options.to_str().unwrap().into(),
        ..Default::default()
    };
    let any = Any {
        type_url: "containerd.runc.v1.Options".into(),
        value: runc.write_to_bytes().unwrap(),
        ..Default::default()
    };
    let (features, info) = info_features(&info_with(&any.write_to_bytes().unwrap()));
    assert_eq!(features["annotations"]["runtime"], "runtime-from-options", "{features}");
    assert_eq!(
        info.options.as_ref(),
        Some(&any),
        "the options are echoed as runc's shim does"
    );

    // CRI's runtimeoptions.v1.Options { type_url = 1, config_path = 2 }.
    let config = dir.path().join("gantry.toml");
    std::fs::write(&config, format!("[runtime]\nbinary = {:?}\n", by_config)).unwrap();
    let path = config.to_str().unwrap().as_bytes();
    let mut value = vec![0x12, path.len() as u8];
    value.extend_from_slice(path);
    let any = Any {
        type_url: "type.googleapis.com/runtimeoptions.v1.Options".into(),
        value,
        ..Default::default()
    };
    let (features, _) = info_features(&info_with(&any.write_to_bytes().unwrap()));
    assert_eq!(features["annotations"]["runtime"], "runtime-from-config", "{features}");

    let o = info_with(b"\xff\xff not a protobuf");
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("runtime options on stdin"),
        "{}",
        text(&o)
    );
}

/// The shim is a static-pie executable: position-independent (`ET_DYN`, so the root daemon
/// gets ASLR) with no program interpreter (no dynamic loader, one mapped file).
#[test]
fn the_binary_is_static_and_position_independent() {
    let elf = std::fs::read(SHIM).unwrap();
    assert_eq!(&elf[..4], b"\x7fELF");
    let u16_at = |o: usize| u16::from_le_bytes([elf[o], elf[o + 1]]);
    let u64_at = |o: usize| u64::from_le_bytes(elf[o..o + 8].try_into().unwrap());
    const ET_DYN: u16 = 3;
    const PT_INTERP: u32 = 3;
    assert_eq!(u16_at(16), ET_DYN, "not position-independent (e_type {})", u16_at(16));
    let (phoff, phentsize, phnum) = (u64_at(32) as usize, u16_at(54) as usize, u16_at(56) as usize);
    let interp = (0..phnum).any(|i| {
        let o = phoff + i * phentsize;
        u32::from_le_bytes(elf[o..o + 4].try_into().unwrap()) == PT_INTERP
    });
    assert!(!interp, "the binary asks for a dynamic loader");
}
