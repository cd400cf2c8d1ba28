//! The node installer (`install`/`uninstall`) against fake host roots, and an upgrade in place
//! with real containers: pods of version N keep their daemons after N+1 is installed.

use std::collections::BTreeMap;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::task::{process_any, task};
use crate::common::{
    assert_clean, crio_bundle, crio_create_req, crio_start_cmd_with, ctx, env, open_fifo_reader, run, task_client,
    text, wait_until, SHIM,
};

fn repo() -> &'static str {
    env!("CARGO_MANIFEST_DIR")
}

/// Runs `shim action --host HOST --payload <repo> --no-restart ARGS`; the JSON report.
fn installer(shim: &Path, action: &str, host: &Path, args: &[&str]) -> serde_json::Value {
    let o = run(Command::new(shim)
        .args([action, "--host"])
        .arg(host)
        .args(["--payload", repo(), "--no-restart"])
        .args(args));
    assert!(o.status.success(), "{action}: {}", text(&o));
    serde_json::from_slice(&o.stdout).unwrap_or_else(|e| panic!("{e}: {}", text(&o)))
}

fn list(v: &serde_json::Value, key: &str) -> Vec<String> {
    v[key]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_string())
        .collect()
}

/// Every path under `root` with its content (links by target), to compare whole trees.
fn tree(root: &Path) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    let mut todo = vec![root.to_path_buf()];
    while let Some(dir) = todo.pop() {
        for e in std::fs::read_dir(&dir).unwrap().flatten() {
            let p = e.path();
            let key = p.strip_prefix(root).unwrap().display().to_string();
            let ft = e.file_type().unwrap();
            let value = if ft.is_symlink() {
                format!("-> {}", std::fs::read_link(&p).unwrap().display())
            } else if ft.is_dir() {
                todo.push(p.clone());
                "dir".into()
            } else if ft.is_file() {
                String::from_utf8_lossy(&std::fs::read(&p).unwrap()).into_owned()
            } else {
                "special".into()
            };
            out.insert(key, value);
        }
    }
    out
}

/// A host root with an engine's socket listening (what the DaemonSet mounts).
fn host_with_socket(socket: &str) -> (tempfile::TempDir, UnixListener) {
    let host = tempfile::tempdir().unwrap();
    let path = host.path().join(socket.trim_start_matches('/'));
    std::fs::create_dir_all(path.parent().unwrap()).unwrap();
    let l = UnixListener::bind(&path).unwrap();
    (host, l)
}

/// A CRI-O host: the drop-in, the versioned binary and its link, the config; the second run
/// changes and restarts nothing; uninstall leaves exactly the tree that was there before.
#[test]
fn crio_host_install_is_idempotent_and_uninstall_restores_the_tree() {
    let (host, _sock) = host_with_socket("/run/crio/crio.sock");
    let before = tree(host.path());
    let r = installer(Path::new(SHIM), "install", host.path(), &[]);
    let version = r["version"].as_str().unwrap().to_string();
    assert_eq!(list(&r, "engines"), ["crio.service"]);
    assert_eq!(list(&r, "restart_needed"), ["crio.service"]);
    let dropin = std::fs::read_to_string(host.path().join("etc/crio/crio.conf.d/99-gantry.conf")).unwrap();
    assert_eq!(
        dropin,
        std::fs::read_to_string(format!("{}/runtime-conf/crio/99-gantry.conf", repo())).unwrap()
    );
    let link = std::fs::read_link(host.path().join("usr/local/bin/containerd-shim-gantry-v2")).unwrap();
    // Relative, so it resolves the same on the host and under the installer pod's /host.
    let versioned = Path::new("opt/gantry").join(&version).join("containerd-shim-gantry-v2");
    assert_eq!(link, Path::new("../../..").join(&versioned));
    assert_eq!(
        std::fs::read(SHIM).unwrap(),
        std::fs::read(host.path().join(&versioned)).unwrap()
    );
    assert!(host.path().join("etc/gantry/config.toml").exists());
    assert_eq!(
        std::fs::read_to_string(host.path().join("run/gantry/install/ready"))
            .unwrap()
            .trim(),
        version
    );
    let o = run(Command::new(SHIM)
        .args(["install", "--check", "--host"])
        .arg(host.path()));
    assert!(o.status.success(), "{}", text(&o));

    let again = installer(Path::new(SHIM), "install", host.path(), &[]);
    assert!(list(&again, "changed").is_empty(), "{again}");
    assert!(list(&again, "restart_needed").is_empty(), "{again}");

    let u = installer(Path::new(SHIM), "uninstall", host.path(), &[]);
    assert_eq!(list(&u, "restart_needed"), ["crio.service"]);
    assert_eq!(tree(host.path()), before);
    let o = run(Command::new(SHIM)
        .args(["install", "--check", "--host"])
        .arg(host.path()));
    assert!(!o.status.success(), "ready after uninstall");
}

/// containerd 1.6 (from dpkg's record) with a main config of its own: a version-2 drop-in
/// and one imports line; the config edited by the operator is kept; uninstall restores the
/// main config byte for byte and leaves the edited config.
#[test]
fn containerd_1_6_host_gets_an_import_and_edits_are_kept() {
    let host = tempfile::tempdir().unwrap();
    let main = "version = 2\n\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"pause:3.6\"\n";
    let write = |p: &str, t: &str| {
        let path = host.path().join(p);
        std::fs::create_dir_all(path.parent().unwrap()).unwrap();
        std::fs::write(path, t).unwrap();
    };
    write("etc/containerd/config.toml", main);
    write(
        "var/lib/dpkg/status",
        "Package: runc\nStatus: install ok installed\nVersion: 1.1.5\n\nPackage: containerd\nStatus: install ok installed\nVersion: 1.6.20~ds1-1+deb12u3\n",
    );
    write(
        "etc/gantry/config.toml",
        "# edited here\n[runtime]\nbinary = \"runc\"\n",
    );
    let before = tree(host.path());
    let r = installer(Path::new(SHIM), "install", host.path(), &[]);
    assert_eq!(list(&r, "engines"), ["containerd.service"]);
    assert!(
        !list(&r, "changed").contains(&"/etc/gantry/config.toml".to_string()),
        "{r}"
    );
    let dropin = std::fs::read_to_string(host.path().join("etc/containerd/conf.d/gantry.toml")).unwrap();
    assert!(
        dropin.contains("version = 2") && dropin.contains("io.containerd.grpc.v1.cri"),
        "{dropin}"
    );
    let edited = std::fs::read_to_string(host.path().join("etc/containerd/config.toml")).unwrap();
    assert!(
        edited.contains("imports = [\"/etc/containerd/conf.d/gantry.toml\"]"),
        "{edited}"
    );
    assert!(edited.ends_with(main.trim_start_matches("version = 2\n")), "{edited}");
    installer(Path::new(SHIM), "uninstall", host.path(), &[]);
    assert_eq!(tree(host.path()), before);
}

/// containerd 2.2 with no main config reads conf.d by default: only the version-3 drop-in,
/// no main config created.
#[test]
fn containerd_2_2_host_gets_only_a_conf_d_drop_in() {
    let (host, _sock) = host_with_socket("/run/containerd/containerd.sock");
    let r = installer(
        Path::new(SHIM),
        "install",
        host.path(),
        &["--containerd-version", "2.2.1"],
    );
    assert_eq!(list(&r, "engines"), ["containerd.service"]);
    let dropin = std::fs::read_to_string(host.path().join("etc/containerd/conf.d/gantry.toml")).unwrap();
    assert!(
        dropin.contains("version = 3") && dropin.contains("io.containerd.cri.v1.runtime"),
        "{dropin}"
    );
    assert!(!host.path().join("etc/containerd/config.toml").exists());
    // Without a version and nothing to read it from, the installer says what to pass.
    let o = run(Command::new(SHIM)
        .args(["install", "--no-restart", "--payload", repo(), "--host"])
        .arg(host.path()));
    assert!(
        !o.status.success() && text(&o).contains("--containerd-version"),
        "{}",
        text(&o)
    );
    installer(
        Path::new(SHIM),
        "uninstall",
        host.path(),
        &["--containerd-version", "2.2.1"],
    );
}

/// A version a bundle still names is kept by uninstall (and reported); once the bundle is
/// gone, the next uninstall removes it.
#[test]
fn uninstall_keeps_a_version_a_bundle_names() {
    let (host, _sock) = host_with_socket("/run/crio/crio.sock");
    let r = installer(Path::new(SHIM), "install", host.path(), &[]);
    let version = r["version"].as_str().unwrap();
    let bundle = host
        .path()
        .join("run/containers/storage/overlay-containers/c1/userdata");
    std::fs::create_dir_all(&bundle).unwrap();
    let record = serde_json::json!({"format": 2, "shim": format!("/opt/gantry/{version}/containerd-shim-gantry-v2"),
        "binary": "runc", "root": "/run/gantry/runc", "systemd_cgroup": false, "rootfs_mounted": false});
    std::fs::write(bundle.join("gantry-runtime.json"), record.to_string()).unwrap();
    let u = installer(Path::new(SHIM), "uninstall", host.path(), &[]);
    assert_eq!(list(&u, "kept"), [version]);
    assert!(host
        .path()
        .join("opt/gantry")
        .join(version)
        .join("containerd-shim-gantry-v2")
        .exists());
    std::fs::remove_dir_all(host.path().join("run/containers")).unwrap();
    let u = installer(Path::new(SHIM), "uninstall", host.path(), &[]);
    assert!(list(&u, "kept").is_empty());
    assert!(!host.path().join("opt/gantry").exists());
}

/// A second real binary of another version: this build with a trailer, so its content, and
/// with it its version directory, differ.
fn next_version(dir: &Path) -> PathBuf {
    let path = dir.join("containerd-shim-gantry-v2");
    let mut bytes = std::fs::read(SHIM).unwrap();
    bytes.extend_from_slice(b"\0gantry upgrade test: version N+1\0");
    std::fs::write(&path, bytes).unwrap();
    std::fs::set_permissions(&path, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    path
}

fn daemon_exe(bundle: &Path) -> PathBuf {
    let pid = std::fs::read_to_string(bundle.join("shim.pid")).unwrap();
    std::fs::read_link(format!("/proc/{}/exe", pid.trim())).unwrap()
}

/// Upgrade in place: containers started by version N keep their daemons after N+1 is
/// installed (exec, kill and delete through them work), a new container runs N+1, and N+1's
/// `delete` cleans the bundle of an N daemon that was SIGKILLed. Nothing is left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn upgrade_in_place_leaves_running_containers_to_their_own_daemons() {
    let env = env();
    let ns = env.namespace("upgrade");
    let (host, _sock) = host_with_socket("/run/crio/crio.sock");
    let n = installer(Path::new(SHIM), "install", host.path(), &[]);
    let stable = host.path().join("usr/local/bin/containerd-shim-gantry-v2");
    let start = |id: &str| {
        let b = crio_bundle(&ns, id, id, &["sleep", "1000"], |_| {});
        let o = run(crio_start_cmd_with(&stable, &ns, &b.dir, id).stdin(std::process::Stdio::null()));
        assert!(o.status.success(), "{}", text(&o));
        (b, String::from_utf8(o.stdout).unwrap())
    };
    let (b1, a1) = start("up1");
    let (b2, a2) = start("up2");
    let (c1, c2) = (task_client(&a1).await, task_client(&a2).await);
    let (_o1, _o2) = (open_fifo_reader(&b1.stdout), open_fifo_reader(&b2.stdout));
    for (c, b) in [(&c1, &b1), (&c2, &b2)] {
        c.create(ctx(), &crio_create_req(b)).await.unwrap();
        task(c, &b.id).start().await.unwrap();
    }
    let n_dir = host.path().join("opt/gantry").join(n["version"].as_str().unwrap());
    assert!(daemon_exe(&b1.dir).starts_with(&n_dir));

    let scratch = tempfile::tempdir().unwrap();
    let n1 = installer(&next_version(scratch.path()), "install", host.path(), &[]);
    assert_ne!(n1["version"], n["version"]);
    assert!(list(&n1, "changed").contains(&"/usr/local/bin/containerd-shim-gantry-v2".to_string()));
    assert!(
        list(&n1, "restart_needed").is_empty(),
        "a binary swap restarts no engine: {n1}"
    );

    // N's daemon still serves its container: exec, kill, delete.
    let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(b1.dir.join("config.json")).unwrap()).unwrap();
    let mut process = spec["process"].clone();
    process["args"] = serde_json::json!(["sh", "-c", "exit 3"]);
    let ex = task(&c1, "up1").exec("e1");
    ex.add(Some(process_any(process))).await.unwrap();
    ex.start().await.unwrap();
    assert_eq!(ex.wait().await.unwrap().exit_status, 3);
    ex.delete().await.unwrap();
    assert!(daemon_exe(&b1.dir).starts_with(&n_dir));
    crate::common::crio_kill_and_remove(&c1, "up1").await;

    // A new container runs N+1.
    let n1_dir = host.path().join("opt/gantry").join(n1["version"].as_str().unwrap());
    let (b3, a3) = start("up3");
    assert!(daemon_exe(&b3.dir).starts_with(&n1_dir));
    let c3 = task_client(&a3).await;
    let _o3 = open_fifo_reader(&b3.stdout);
    c3.create(ctx(), &crio_create_req(&b3)).await.unwrap();
    task(&c3, "up3").start().await.unwrap();
    crate::common::crio_kill_and_remove(&c3, "up3").await;

    // N's daemon SIGKILLed; N+1 (the stable path now) cleans its bundle.
    let pid: i32 = std::fs::read_to_string(b2.dir.join("shim.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::Signal::SIGKILL);
    assert!(wait_until(Duration::from_secs(10), || !Path::new(&format!(
        "/proc/{pid}"
    ))
    .exists()
        || std::fs::read_to_string(format!("/proc/{pid}/stat"))
            .is_ok_and(|s| s.contains(") Z"))));
    let o = run(Command::new(&stable)
        .args(["-namespace", "default", "-id", "up2", "-bundle"])
        .arg(&b2.dir)
        .arg("delete")
        .env("GANTRY_CONFIG", &ns.config));
    assert!(o.status.success(), "{}", text(&o));
    assert_clean(env, &ns);
}

/// A restart that fails (here: no system bus) fails the install and is not forgotten: no
/// ready file, and the next run restarts the engine although its files are already in place.
#[test]
fn a_failed_restart_is_retried_by_the_next_run() {
    let (host, _sock) = host_with_socket("/run/crio/crio.sock");
    let o = run(Command::new(SHIM)
        .args(["install", "--payload", repo(), "--host"])
        .arg(host.path()));
    assert!(!o.status.success(), "{}", text(&o));
    assert!(text(&o).contains("restarting crio.service"), "{}", text(&o));
    assert!(!host.path().join("run/gantry/install/ready").exists());
    let again = installer(Path::new(SHIM), "install", host.path(), &[]);
    assert!(list(&again, "changed").is_empty(), "{again}");
    assert_eq!(list(&again, "restart_needed"), ["crio.service"]);
    let third = installer(Path::new(SHIM), "install", host.path(), &[]);
    assert!(
        list(&third, "restart_needed").is_empty(),
        "--no-restart hands the restart to the caller: {third}"
    );
    installer(Path::new(SHIM), "uninstall", host.path(), &[]);
}
