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

fn owner(path: &Path) -> (u32, u32) {
    use std::os::unix::fs::MetadataExt;
    let m = std::fs::symlink_metadata(path).unwrap();
    (m.uid(), m.gid())
}

/// containerd 2.x's rootfs for a user-namespace pod: overlay options with `uidmap=`/`gidmap=`.
/// The layers show through the mount owned by the pod's host ids, the upper layer is written
/// as those ids, nothing is chowned, and the helper's stage is gone afterwards.
#[test]
fn an_idmapped_overlay_shows_the_layers_as_the_pods_ids() {
    use std::os::unix::fs::chown;

    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    let root = dir.path().canonicalize().unwrap();
    let snapshots = root.join("snapshots");
    for d in ["1/fs/etc", "2/fs/home/app", "3/fs", "3/work"] {
        std::fs::create_dir_all(snapshots.join(d)).unwrap();
    }
    std::fs::write(snapshots.join("1/fs/etc/hosts"), "x").unwrap();
    chown(snapshots.join("2/fs/home/app"), Some(1000), Some(1000)).unwrap();
    let target = root.join("bundle").join("rootfs");
    std::fs::create_dir_all(&target).unwrap();
    let layers = |s: &Path| format!("lowerdir={}:{}", s.join("2/fs").display(), s.join("1/fs").display());
    let overlay = |extra: &[&str]| -> Vec<String> {
        let mut o = vec![
            layers(&snapshots),
            format!("upperdir={}", snapshots.join("3/fs").display()),
            format!("workdir={}", snapshots.join("3/work").display()),
            "index=off".into(),
        ];
        o.extend(extra.iter().map(|e| e.to_string()));
        o
    };

    // One map without the other is refused, and nothing is left mounted.
    let o = helper(&request(
        &target,
        "overlay",
        "overlay",
        &overlay(&["uidmap=0:100000:65536"]),
    ));
    assert_eq!(o.status.code(), Some(1), "{}", text(&o));
    assert!(String::from_utf8_lossy(&o.stdout).contains("gidmap"), "{}", text(&o));
    assert!(!mounted(&target));

    let maps = ["uidmap=0:100000:65536", "gidmap=0:200000:65536"];
    let o = helper(&request(&target, "overlay", "overlay", &overlay(&maps)));
    assert!(o.status.success(), "{}", text(&o));
    assert!(mounted(&target));
    assert_eq!(owner(&target.join("etc/hosts")), (100000, 200000));
    assert_eq!(owner(&target.join("home/app")), (101000, 201000));
    // The layers themselves are untouched.
    assert_eq!(owner(&snapshots.join("1/fs/etc/hosts")), (0, 0));
    // The stage the layers were reached through is gone; no mount is left beside the rootfs.
    let beside: Vec<_> = std::fs::read_dir(target.parent().unwrap())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    assert_eq!(beside, vec![std::ffi::OsString::from("rootfs")]);
    assert_eq!(
        gantry::proc::MountTable::of_self().unwrap().below(&root).len(),
        1,
        "only the rootfs"
    );
    nix::mount::umount2(&target, nix::mount::MntFlags::MNT_DETACH).unwrap();

    // Any other filesystem is idmapped in place.
    let o = helper(&request(
        &target,
        "bind",
        snapshots.join("1/fs").to_str().unwrap(),
        &["rbind".into(), "ro".into(), maps[0].into(), maps[1].into()],
    ));
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(owner(&target.join("etc/hosts")), (100000, 200000));
    gantry::mount::unmount_all(&target).unwrap();
    assert!(!mounted(&target));
}
