//! The fleet installer on the production-shaped node: the installer image run as a privileged
//! container of the node's own containerd (a systemd service) with the host at `/host`, the
//! restart over D-Bus, a pod through the CRI with the `gantry` handler, an upgrade while it
//! runs, and uninstall. Ignored elsewhere, never counted as passed.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use crate::common::cri::{channel, container_config, pod_config, Client};
use crate::common::cri_api::{
    CreateContainerRequest, ExecSyncRequest, RemovePodSandboxRequest, RunPodSandboxRequest, StartContainerRequest,
    StopPodSandboxRequest,
};
use crate::common::{busybox_image, env, run, text, wait_until};

const SOCK: &str = "/run/containerd/containerd.sock";

fn ctr(ns: &str, args: &[&str]) -> std::process::Output {
    run(Command::new("ctr").args(["--address", SOCK, "-n", ns]).args(args))
}

fn containerd_pid() -> String {
    let o = run(Command::new("systemctl").args(["show", "-p", "MainPID", "--value", "containerd"]));
    String::from_utf8_lossy(&o.stdout).trim().to_string()
}

/// The installer images node-lane.sh built on the host: version N (this build) and N+1.
fn images() -> (PathBuf, PathBuf) {
    let dir = PathBuf::from(std::env::var("GANTRY_INSTALLER_IMAGES").expect("GANTRY_INSTALLER_IMAGES (node-lane.sh)"));
    (dir.join("installer-n.tar"), dir.join("installer-n1.tar"))
}

/// Runs `image` as the DaemonSet's pod runs it (privileged, the host's root at /host) with
/// `args` (none: the image's install command); waits for it to end; its JSON report.
fn run_installer(image: &str, name: &str, args: &[&str]) -> serde_json::Value {
    let log = format!("/run/{name}.log");
    let mut cmd = vec!["run", "-d", "--privileged", "--log-uri"];
    let uri = format!("file://{log}");
    cmd.push(&uri);
    cmd.extend(["--mount", "type=bind,src=/,dst=/host,options=rbind:rw", image, name]);
    cmd.extend(args);
    let o = ctr("gantry-node", &cmd);
    assert!(o.status.success(), "{}", text(&o));
    // containerd restarts under it: `task ls` fails for a moment, then shows it STOPPED.
    let done = wait_until(Duration::from_secs(300), || {
        String::from_utf8_lossy(&ctr("gantry-node", &["task", "ls"]).stdout)
            .lines()
            .any(|l| l.starts_with(name) && l.contains("STOPPED"))
    });
    let out = std::fs::read_to_string(&log).unwrap_or_default();
    assert!(done, "{name} did not finish: {out}");
    let _ = ctr("gantry-node", &["task", "delete", name]);
    let _ = ctr("gantry-node", &["container", "delete", name]);
    let _ = std::fs::remove_file(&log);
    let report = out
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l.trim()).ok())
        .find(|v| v.get("version").is_some());
    report.unwrap_or_else(|| panic!("{name} printed no report:\n{out}"))
}

fn strings(v: &serde_json::Value, key: &str) -> Vec<String> {
    v[key]
        .as_array()
        .into_iter()
        .flatten()
        .filter_map(|s| s.as_str().map(String::from))
        .collect()
}

/// The gantry daemon binary serving a CRI container, from its bundle's shim.pid.
fn daemon_exe(id: &str) -> PathBuf {
    let bundle = Path::new("/run/containerd/io.containerd.runtime.v2.task/k8s.io").join(id);
    let pid = std::fs::read_to_string(bundle.join("shim.pid")).unwrap();
    std::fs::read_link(format!("/proc/{}/exe", pid.trim())).unwrap()
}

async fn pod(c: &mut Client, name: &str) -> (String, String) {
    let log_dir = env().dir.join(format!("fleet-logs-{name}"));
    std::fs::create_dir_all(&log_dir).unwrap();
    let config = pod_config(name, &log_dir);
    let req = RunPodSandboxRequest {
        config: Some(config.clone()),
        runtime_handler: "gantry".into(),
    };
    let pod = c
        .run_pod_sandbox(req)
        .await
        .unwrap_or_else(|e| panic!("RunPodSandbox: {e:?}"));
    let pod = pod.into_inner().pod_sandbox_id;
    let create = CreateContainerRequest {
        pod_sandbox_id: pod.clone(),
        config: Some(container_config("work", &["sleep", "1000"])),
        sandbox_config: Some(config),
    };
    let id = c
        .create_container(create)
        .await
        .unwrap_or_else(|e| panic!("CreateContainer: {e:?}"));
    let id = id.into_inner().container_id;
    c.start_container(StartContainerRequest {
        container_id: id.clone(),
    })
    .await
    .unwrap_or_else(|e| panic!("StartContainer: {e:?}"));
    (pod, id)
}

async fn remove(c: &mut Client, pod: &str) {
    let stop = StopPodSandboxRequest {
        pod_sandbox_id: pod.into(),
    };
    c.stop_pod_sandbox(stop)
        .await
        .unwrap_or_else(|e| panic!("StopPodSandbox: {e:?}"));
    let rm = RemovePodSandboxRequest {
        pod_sandbox_id: pod.into(),
    };
    c.remove_pod_sandbox(rm)
        .await
        .unwrap_or_else(|e| panic!("RemovePodSandbox: {e:?}"));
}

/// The whole rollout on a systemd node: install from the image (containerd restarted over
/// D-Bus, the `gantry` handler then served by the node's CRI), an upgrade while a pod runs (no
/// restart; the old pod stays on its daemon, a new pod gets the new version), and uninstall
/// (the main config byte for byte as before, no version left, containerd restarted again).
#[test]
#[ignore = "needs the production-shaped node: run through scripts/test.sh --node"]
fn the_installer_image_installs_upgrades_and_uninstalls_on_the_node() {
    let (_, _turn) = crate::node::on_node_containerd();
    let main_before = std::fs::read("/etc/containerd/config.toml").ok();
    let (n_tar, n1_tar) = images();
    for tar in [&n_tar, &n1_tar] {
        let o = ctr("gantry-node", &["images", "import", tar.to_str().unwrap()]);
        assert!(o.status.success(), "{}", text(&o));
    }
    // The CRI's images: the pause image under the name containerd 1.6 defaults to, and busybox.
    let dir = env().dir.join("fleet-images");
    busybox_image(&dir, "registry.k8s.io/pause:3.6", &["/pause"]);
    let o = ctr("k8s.io", &["images", "import", dir.join("image.tar").to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));
    let o = ctr("k8s.io", &["images", "import", env().image_tar.to_str().unwrap()]);
    assert!(o.status.success(), "{}", text(&o));

    let pid_before = containerd_pid();
    let n = run_installer("docker.io/gantry/installer:n", "gantry-install-n", &[]);
    assert_eq!(strings(&n, "restarted"), ["containerd.service"], "{n}");
    assert_ne!(containerd_pid(), pid_before, "containerd was not restarted");
    let version_n = n["version"].as_str().unwrap().to_string();
    let ready = std::fs::read_to_string("/run/gantry/install/ready").unwrap();
    assert_eq!(ready.trim(), version_n);

    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let mut c = Client::new(channel(Path::new(SOCK)).await);
        let (old_pod, old) = pod(&mut c, "fleet-old").await;
        assert!(daemon_exe(&old).starts_with(Path::new("/opt/gantry").join(&version_n)));

        let pid_mid = containerd_pid();
        let n1 = run_installer("docker.io/gantry/installer:n1", "gantry-install-n1", &[]);
        let version_n1 = n1["version"].as_str().unwrap().to_string();
        assert_ne!(version_n1, version_n);
        assert!(
            strings(&n1, "restarted").is_empty(),
            "an upgrade restarted the engine: {n1}"
        );
        assert_eq!(containerd_pid(), pid_mid);

        let exec = ExecSyncRequest {
            container_id: old.clone(),
            cmd: vec!["echo".into(), "still".into()],
            timeout: 30,
        };
        let out = c
            .exec_sync(exec)
            .await
            .unwrap_or_else(|e| panic!("ExecSync: {e:?}"))
            .into_inner();
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "still");
        assert!(daemon_exe(&old).starts_with(Path::new("/opt/gantry").join(&version_n)));
        let (new_pod, new) = pod(&mut c, "fleet-new").await;
        assert!(daemon_exe(&new).starts_with(Path::new("/opt/gantry").join(&version_n1)));
        remove(&mut c, &old_pod).await;
        remove(&mut c, &new_pod).await;
    });

    let pid_before = containerd_pid();
    let u = run_installer(
        "docker.io/gantry/installer:n1",
        "gantry-uninstall",
        &["/gantry/containerd-shim-gantry-v2", "uninstall", "--host", "/host"],
    );
    assert!(strings(&u, "kept").is_empty(), "{u}");
    assert_eq!(strings(&u, "restarted"), ["containerd.service"], "{u}");
    assert_ne!(containerd_pid(), pid_before);
    assert_eq!(std::fs::read("/etc/containerd/config.toml").ok(), main_before);
    for gone in [
        "/opt/gantry",
        "/usr/local/bin/containerd-shim-gantry-v2",
        "/etc/containerd/conf.d/gantry.toml",
    ] {
        assert!(std::fs::symlink_metadata(gone).is_err(), "{gone} left");
    }
}
