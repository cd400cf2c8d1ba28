//! The rootfs mount helper (`containerd-shim-gantry-v2 mount-helper`), which every Create's
//! rootfs goes through (the daemon re-executes itself for it instead of forking), driven
//! directly: the request on stdin, the reason for a refusal on stdout, the exit status.

use std::path::Path;
use std::process::{Command, Output};

use crate::common::{run_with_stdin, text, SHIM};

fn helper(stdin: &[u8]) -> Output {
    run_with_stdin(Command::new(SHIM).arg("mount-helper"), stdin)
}

fn request(target: &Path, fs_type: &str, source: &str, options: &[String]) -> Vec<u8> {
    serde_json::to_vec(&serde_json::json!({
        "target": target,
        "mounts": [{ "fs_type": fs_type, "source": source, "options": options }],
    }))
    .unwrap()
}

fn mounted(target: &Path) -> bool {
    gantry::proc::MountTable::of_self().unwrap().is_mount_point(target)
}

#[test]
fn the_mount_helper_mounts_and_says_why_not() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().canonicalize().unwrap();

    let ok = root.join("ok");
    std::fs::create_dir(&ok).unwrap();
    let o = helper(&request(&ok, "tmpfs", "tmpfs", &["size=1m".into()]));
    assert!(o.status.success(), "{}", text(&o));
    assert!(mounted(&ok), "the helper's mount is visible outside it");
    nix::mount::umount2(&ok, nix::mount::MntFlags::MNT_DETACH).unwrap();

    // Over a page of overlay options: the helper changes directory to the layers' common
    // prefix, and says so when it cannot.
    let prefix = root.join("missing").join("x".repeat(100));
    let lower: Vec<String> = (0..60)
        .map(|i| prefix.join(format!("layer{i}")).display().to_string())
        .collect();
    let ov = root.join("ov");
    std::fs::create_dir(&ov).unwrap();
    let options = [
        format!("lowerdir={}", lower.join(":")),
        format!("upperdir={}", root.join("u").display()),
        format!("workdir={}", root.join("w").display()),
    ];
    let o = helper(&request(&ov, "overlay", "overlay", &options));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stdout).contains("overlay lower directories"),
        "{}",
        text(&o)
    );
    assert!(!mounted(&ov));

    // A refusal by the kernel names the mount.
    let o = helper(&request(&ov, "nosuchfs", "x", &[]));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("nosuchfs"), "{}", text(&o));

    // A request it cannot read is not a mount's failure.
    let o = helper(b"{ not json");
    assert_eq!(o.status.code(), Some(2), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stderr).contains("not valid"), "{}", text(&o));
}
