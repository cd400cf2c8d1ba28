//! A real CRI-O (scripts/stack.sh's, copied into the node lane by node-lane.sh) run by the
//! node's systemd as its upstream unit runs it (`Type=notify`, the default KillMode), with its
//! default systemd cgroup manager and gantry as a `runtime_type = "vm"` handler on the shipped
//! config: the production defect of CRI-O on a systemd node. Images come from a
//! containers-storage root node-lane.sh fills on the host (the guest has no skopeo).

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::Duration;

use crate::common::{run, text, wait_until, SHIM};

struct Crio {
    bin: PathBuf,
    work: PathBuf,
    run: PathBuf,
    unit: String,
}

impl Crio {
    /// Starts CRI-O as a transient unit shaped like crio.service, with `manager` as its cgroup
    /// manager (its default, systemd, or cgroupfs, which wants conmon in the pod's cgroup).
    fn start(manager: &str) -> Self {
        let bin = PathBuf::from(std::env::var("GANTRY_STACK_BIN").expect("GANTRY_STACK_BIN (node-lane.sh sets it)"));
        let storage = PathBuf::from(std::env::var("GANTRY_CRIO_STORAGE").expect("GANTRY_CRIO_STORAGE"));
        let pid = std::process::id();
        let work = PathBuf::from(format!("/var/lib/gantry-crio-{pid}"));
        let run_dir = PathBuf::from(format!("/run/gantry-crio-{pid}"));
        for d in [&work, &run_dir] {
            std::fs::create_dir_all(d).unwrap();
        }
        let o = run(Command::new("tar").arg("-C").arg(&work).arg("-xf").arg(&storage));
        assert!(o.status.success(), "{}", text(&o));
        std::fs::create_dir_all(work.join("cni")).unwrap();
        std::fs::write(
            work.join("cni/10-lo.conflist"),
            r#"{"cniVersion":"0.4.0","name":"lo-only","plugins":[{"type":"loopback"}]}"#,
        )
        .unwrap();
        std::fs::write(
            work.join("policy.json"),
            r#"{"default":[{"type":"insecureAcceptAnything"}]}"#,
        )
        .unwrap();
        let repo = Path::new(env!("CARGO_MANIFEST_DIR"));
        let mut conf = config(&bin, &work, &run_dir, repo);
        if manager == "cgroupfs" {
            conf = conf.replace(
                "[crio.runtime]\n",
                "[crio.runtime]\ncgroup_manager = \"cgroupfs\"\nconmon_cgroup = \"pod\"\n",
            );
        }
        std::fs::write(work.join("crio.conf"), conf).unwrap();
        let c = Crio {
            bin,
            work,
            run: run_dir,
            unit: format!("gantry-test-crio-{pid}"),
        };
        c.launch();
        c
    }

    /// Runs CRI-O in its unit (transient: gone once stopped, so a later start runs it anew) and
    /// waits until it answers.
    fn launch(&self) {
        let o = run(Command::new("systemd-run")
            .arg(format!("--unit={}", self.unit))
            .args([
                "-p",
                "Type=notify",
                "-p",
                "TasksMax=infinity",
                "-p",
                "OOMScoreAdjust=-999",
            ])
            .arg(format!(
                "--setenv=PATH={}:/usr/sbin:/usr/bin:/sbin:/bin",
                self.bin.display()
            ))
            .arg(self.bin.join("crio"))
            .arg("--config")
            .arg(self.work.join("crio.conf")));
        assert!(o.status.success(), "{}\n{}", text(&o), self.journal());
        let up = wait_until(Duration::from_secs(120), || self.crictl(&["version"]).status.success());
        assert!(up, "CRI-O did not come up:\n{}", self.journal());
    }

    fn crictl(&self, args: &[&str]) -> Output {
        let sock = format!("unix://{}", self.run.join("crio.sock").display());
        run(Command::new(self.bin.join("crictl"))
            .args(["--config", "/dev/null", "-r", &sock, "-i", &sock, "-t", "60s"])
            .args(args))
    }

    fn ok(&self, args: &[&str]) -> String {
        let o = self.crictl(args);
        assert!(o.status.success(), "crictl {args:?}: {}\n{}", text(&o), self.journal());
        String::from_utf8_lossy(&o.stdout).trim().to_string()
    }

    fn json(&self, args: &[&str]) -> serde_json::Value {
        serde_json::from_str(&self.ok(args)).unwrap()
    }

    fn journal(&self) -> String {
        let o = run(Command::new("journalctl").args(["-u", &self.unit, "--no-pager", "-n", "60"]));
        String::from_utf8_lossy(&o.stdout).into_owned()
    }
}

impl Drop for Crio {
    fn drop(&mut self) {
        let _ = self.crictl(&["rmp", "-fa"]);
        let _ = run(Command::new("systemctl").args(["stop", &self.unit]));
        let _ = run(Command::new("systemctl").args(["reset-failed", &self.unit]));
        for d in [&self.run, &self.work] {
            let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap_or_default();
            let mut points: Vec<&str> = mounts
                .lines()
                .filter_map(|l| l.split(' ').nth(4))
                .filter(|p| p.starts_with(d.to_str().unwrap()))
                .collect();
            points.sort_by_key(|p| std::cmp::Reverse(p.len()));
            for p in points {
                let _ = nix::mount::umount2(p, nix::mount::MntFlags::MNT_DETACH);
            }
            let _ = std::fs::remove_dir_all(d);
        }
    }
}

/// CRI-O's config: its defaults (the systemd cgroup manager) but private paths, and gantry.
fn config(bin: &Path, work: &Path, run: &Path, repo: &Path) -> String {
    format!(
        r#"[crio]
root = "{work}/storage"
runroot = "{run}/storage"
storage_driver = "overlay"
log_dir = "{work}/logs"
version_file = "{run}/version"
version_file_persist = "{work}/version"
clean_shutdown_file = "{work}/clean.shutdown"
[crio.api]
listen = "{run}/crio.sock"
[crio.runtime]
default_runtime = "runc"
pinns_path = "{bin}/pinns"
namespaces_dir = "{run}/ns"
container_exits_dir = "{run}/exits"
container_attach_socket_dir = "{run}/attach"
[crio.runtime.runtimes.runc]
runtime_path = "{bin}/runc"
runtime_type = "oci"
runtime_root = "{run}/runc"
[crio.runtime.runtimes.gantry]
runtime_type = "vm"
runtime_path = "{shim}"
runtime_root = "{run}/gantry"
runtime_config_path = "{repo}/runtime-conf/gantry.toml"
privileged_without_host_devices = true
[crio.image]
pause_image = "localhost/gantry/pause:latest"
pause_command = "/pause"
signature_policy = "{work}/policy.json"
[crio.network]
network_dir = "{work}/cni"
plugin_dirs = ["{cni}"]
"#,
        work = work.display(),
        run = run.display(),
        bin = bin.display(),
        shim = SHIM,
        repo = repo.display(),
        cni = bin.parent().unwrap().join("cni").display(),
    )
}

/// The v2 cgroup of a process, from its `0::` line.
fn cgroup_of(pid: i64) -> String {
    let text = std::fs::read_to_string(format!("/proc/{pid}/cgroup")).unwrap_or_default();
    text.lines()
        .find_map(|l| l.strip_prefix("0::"))
        .unwrap_or_default()
        .to_string()
}

/// CRI-O's defaults on a systemd node: the container lands in its pod's slice with its limit,
/// as conmon + runc's does, the pod's daemon lives in a scope of its own, `systemctl restart`
/// of CRI-O's unit leaves the daemon serving (the container stays manageable: status, exec,
/// stop), and nothing of gantry outlives the pod's removal.
#[test]
#[ignore = "needs the production-shaped node: run through scripts/test.sh --node"]
fn crio_under_systemd_keeps_gantry_pods_in_their_slice_and_across_a_restart() {
    crate::node::on_node();
    pods_in_their_cgroup_and_across_a_restart("systemd");
}

/// The same with CRI-O's cgroupfs manager: cgroupfs paths, the daemon still in its own scope.
#[test]
#[ignore = "needs the production-shaped node: run through scripts/test.sh --node"]
fn crio_with_cgroupfs_keeps_gantry_pods_in_their_cgroup_and_across_a_restart() {
    crate::node::on_node();
    pods_in_their_cgroup_and_across_a_restart("cgroupfs");
}

/// A kubelet-style BestEffort pod of one 64 MiB container through `handler`; returns the pod's
/// id, the container's, and where the container's cgroup must be.
fn run_pod(crio: &Crio, manager: &str, handler: &str) -> (String, String, String) {
    let uid = format!("u{}{handler}", std::process::id());
    let (parent, want_dir) = match manager {
        "systemd" => {
            let slice = format!("kubepods-besteffort-pod{uid}.slice");
            (
                slice.clone(),
                format!("/kubepods.slice/kubepods-besteffort.slice/{slice}"),
            )
        }
        _ => {
            let path = format!("/kubepods/besteffort/pod{uid}");
            (path.clone(), path)
        }
    };
    let pod_json = crio.work.join(format!("pod-{handler}.json"));
    std::fs::write(
        &pod_json,
        format!(
            r#"{{"metadata":{{"name":"p-{handler}","namespace":"default","uid":"{uid}"}},"log_directory":"{logs}",
                "linux":{{"cgroup_parent":"{parent}","security_context":{{"namespace_options":{{"pid":1}}}}}}}}"#,
            logs = crio.work.join("pod-logs").display()
        ),
    )
    .unwrap();
    let ctr_json = crio.work.join("ctr.json");
    std::fs::write(
        &ctr_json,
        r#"{"metadata":{"name":"c"},"image":{"image":"localhost/gantry/busybox:latest"},"command":["sleep","1000"],
            "log_path":"c.log","linux":{"resources":{"memory_limit_in_bytes":67108864},
            "security_context":{"namespace_options":{"pid":1}}}}"#,
    )
    .unwrap();
    let pod = crio.ok(&["runp", "--runtime", handler, pod_json.to_str().unwrap()]);
    let ctr = crio.ok(&["create", &pod, ctr_json.to_str().unwrap(), pod_json.to_str().unwrap()]);
    crio.ok(&["start", &ctr]);
    let leaf = match manager {
        "systemd" => format!("crio-{ctr}.scope"),
        _ => format!("crio-{ctr}"),
    };
    (pod, ctr.clone(), format!("{want_dir}/{leaf}"))
}

/// Whether `crictl statsp` counts the pod's memory and processes (conmon + runc's pod has no
/// infra process: CRI-O drops it), waiting a while for CRI-O's stats; with the last answer.
fn pod_counted(crio: &Crio, pod: &str) -> (bool, serde_json::Value) {
    let mut stats = serde_json::Value::Null;
    let counted = wait_until(Duration::from_secs(30), || {
        stats = crio.json(&["statsp", "-o", "json", "--id", pod]);
        let linux = &stats["stats"][0]["linux"];
        let value = |v: &serde_json::Value| v["value"].as_str().and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
        value(&linux["memory"]["workingSetBytes"]) > 0 && value(&linux["process"]["processCount"]) >= 1
    });
    (counted, stats)
}

/// A container of `cmd` in `pod` (made by [`run_pod`] for `handler`), started; its id.
fn add_container(crio: &Crio, pod: &str, handler: &str, name: &str, cmd: &str) -> String {
    let json = crio.work.join(format!("ctr-{name}.json"));
    std::fs::write(
        &json,
        format!(
            r#"{{"metadata":{{"name":"{name}"}},"image":{{"image":"localhost/gantry/busybox:latest"}},
                "command":["sh","-c","{cmd}"],"log_path":"{name}.log",
                "linux":{{"security_context":{{"namespace_options":{{"pid":1}}}}}}}}"#
        ),
    )
    .unwrap();
    let pod_json = crio.work.join(format!("pod-{handler}.json"));
    let id = crio.ok(&["create", pod, json.to_str().unwrap(), pod_json.to_str().unwrap()]);
    crio.ok(&["start", &id]);
    id
}

/// Waits until `ctr` is reported exited; its status.
fn exited(crio: &Crio, ctr: &str) -> serde_json::Value {
    let mut st = serde_json::Value::Null;
    let done = wait_until(Duration::from_secs(60), || {
        st = crio.json(&["inspect", ctr]);
        st["status"]["state"] == "CONTAINER_EXITED"
    });
    assert!(done, "{ctr} not reported exited: {st}\n{}", crio.journal());
    st
}

/// One CRI-O at a time: two would share its node-wide paths (the NRI socket, /var/lib/crio).
static ONE_CRIO: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn pods_in_their_cgroup_and_across_a_restart(manager: &str) {
    let _one = ONE_CRIO.lock().unwrap_or_else(|e| e.into_inner());
    let crio = Crio::start(manager);

    // The control: CRI-O's default handler, conmon + runc, puts its container here.
    let (runc_pod, runc_ctr, runc_want) = run_pod(&crio, manager, "runc");
    let runc_pid = crio.json(&["inspect", &runc_ctr])["info"]["pid"].as_i64().unwrap();
    assert_eq!(cgroup_of(runc_pid), runc_want, "conmon + runc's container");
    let (runc_counted, runc_stats) = pod_counted(&crio, &runc_pod);
    // With the systemd manager CRI-O reads the pod's slice; with cgroupfs it may count nothing,
    // and then there is nothing to compare.
    assert!(manager != "systemd" || runc_counted, "{runc_stats}");
    crio.ok(&["stop", "-t", "0", &runc_ctr]);
    crio.ok(&["rmp", "-f", &runc_pod]);

    // gantry's lands where runc's does, with its limit there.
    let (pod, ctr, want) = run_pod(&crio, manager, "gantry");
    let info = crio.json(&["inspect", &ctr]);
    let pid = info["info"]["pid"].as_i64().unwrap();
    let cg = cgroup_of(pid);
    assert_eq!(cg, want, "{}", crio.journal());
    let max = std::fs::read_to_string(format!("/sys/fs/cgroup{cg}/memory.max")).unwrap();
    assert_eq!(max.trim(), "67108864");
    let infra = crio.json(&["inspectp", &pod]);
    let infra_pid = infra["info"]["pid"].as_i64().unwrap();
    let pod_dir = want.rsplit_once('/').unwrap().0.to_string();
    assert!(
        cgroup_of(infra_pid).starts_with(&format!("{pod_dir}/")),
        "the pod's infra process is outside {pod_dir}: {}",
        cgroup_of(infra_pid)
    );

    // The pause ran through the fast path: runc knows the container, not the pod's infra.
    let runc_state = std::fs::read_dir("/run/gantry/runtime")
        .unwrap()
        .map(|e| e.unwrap().path())
        .find(|ns| ns.join(&ctr).exists())
        .expect("no runc state for gantry's container under /run/gantry/runtime");
    assert!(
        !runc_state.join(&pod).exists(),
        "the sandbox fast path was not taken for an ordinary pod:\n{}",
        crio.journal()
    );

    // CRI-O's pod stats (from the pod's cgroup) count gantry's pod wherever they count
    // conmon + runc's.
    if runc_counted {
        let (counted, stats) = pod_counted(&crio, &pod);
        assert!(
            counted,
            "crictl statsp shows no memory for gantry's pod, as it did for runc's: {stats}"
        );
    }

    // The pod's daemon: out of CRI-O's unit, in a scope of its own.
    let bundle = crio.run.join("storage/overlay-containers").join(&pod).join("userdata");
    let daemon: i64 = std::fs::read_to_string(bundle.join("shim.pid"))
        .unwrap()
        .trim()
        .parse()
        .unwrap();
    let home = cgroup_of(daemon);
    assert!(
        home.starts_with("/system.slice/gantry-shim-") && home.ends_with(".scope"),
        "daemon {daemon} lives in {home}"
    );

    // CRI-O's unit restarted as `systemctl restart crio` does, while a container of the pod
    // exits: the daemon stays, CRI-O reaches the pod through it afterwards, and the exit is
    // reported with its code.
    let ends = add_container(&crio, &pod, "gantry", "ends", "sleep 2; exit 3");
    let o = run(Command::new("systemctl").args(["restart", &crio.unit]));
    assert!(o.status.success(), "{}", text(&o));
    let up = wait_until(Duration::from_secs(120), || crio.crictl(&["version"]).status.success());
    assert!(up, "CRI-O did not come back:\n{}", crio.journal());
    assert!(
        Path::new(&format!("/proc/{daemon}")).exists(),
        "the restart took the daemon down"
    );
    let st = crio.json(&["inspect", &ctr]);
    assert_eq!(st["status"]["state"], "CONTAINER_RUNNING", "{st}");
    assert_eq!(
        crio.ok(&["exec", &ctr, "echo", "after the restart"]),
        "after the restart"
    );
    assert_eq!(exited(&crio, &ends)["status"]["exitCode"], 3);
    crio.ok(&["rm", &ends]);

    // CRI-O stopped for 10 s, then started again: the same.
    let o = run(Command::new("systemctl").args(["stop", &crio.unit]));
    assert!(o.status.success(), "{}", text(&o));
    std::thread::sleep(Duration::from_secs(10));
    assert!(
        Path::new(&format!("/proc/{daemon}")).exists(),
        "the stop took the daemon down"
    );
    crio.launch();
    let st = crio.json(&["inspect", &ctr]);
    assert_eq!(st["status"]["state"], "CONTAINER_RUNNING", "{st}");
    assert_eq!(crio.ok(&["exec", &ctr, "echo", "after the stop"]), "after the stop");

    // Stopped and removed through the same daemon; then nothing of it is left.
    crio.ok(&["stop", "-t", "2", &ctr]);
    crio.ok(&["rm", &ctr]);
    crio.ok(&["stopp", &pod]);
    crio.ok(&["rmp", &pod]);
    let gone = wait_until(Duration::from_secs(20), || {
        !Path::new(&format!("/proc/{daemon}")).exists()
    });
    assert!(gone, "daemon {daemon} outlived its pod");
    assert!(
        !Path::new(&format!("/sys/fs/cgroup{home}")).exists(),
        "the daemon's scope outlived it: {home}"
    );
}
