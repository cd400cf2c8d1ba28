//! gantry selected per pod through containerd's CRI plugin (containerd 1.6, CRI v1 over gRPC),
//! the way kubelet drives it with a RuntimeClass whose handler is `gantry`: pods, containers,
//! exec, status, stats, resource updates, stop timeouts, one gantry daemon per pod, and the
//! default runc handler untouched.

use std::collections::HashSet;
use std::time::{Duration, Instant};

use crate::common::cri_api::{
    ContainerConfig, ContainerFilter, ContainerState, ContainerStatsRequest, ContainerStatusRequest,
    ContainerStatusResponse, CreateContainerRequest, ExecSyncRequest, ExecSyncResponse, LinuxContainerResources,
    ListContainersRequest, PodSandboxConfig, PodSandboxState, PodSandboxStatus, PodSandboxStatusRequest,
    RemoveContainerRequest, RemovePodSandboxRequest, RunPodSandboxRequest, StartContainerRequest, StopContainerRequest,
    StopPodSandboxRequest, UpdateContainerResourcesRequest,
};

use crate::common::cri::{
    cgroup_dir, container_config, cpu_shares_as_held, cpu_usage_ns, cri, memory_limit, pod_config, Client, Cri, Daemon,
    PodGuard, HANDLER,
};
use crate::common::wait_until;

/// A pod name unique to this run.
pub(crate) fn pod_name(base: &str) -> String {
    format!("{base}-{}", std::process::id())
}

pub(crate) async fn run_pod(c: &mut Client, config: &PodSandboxConfig, handler: &str) -> String {
    c.run_pod_sandbox(RunPodSandboxRequest {
        config: Some(config.clone()),
        runtime_handler: handler.to_string(),
    })
    .await
    .unwrap_or_else(|e| panic!("RunPodSandbox ({handler:?}): {e:?}\n{}", tail()))
    .into_inner()
    .pod_sandbox_id
}

/// Creates and starts a container; returns its id.
pub(crate) async fn run_container(
    c: &mut Client,
    pod: &str,
    config: &PodSandboxConfig,
    name: &str,
    cmd: &[&str],
) -> String {
    create_and_start(c, pod, config, container_config(name, cmd)).await
}

/// [`run_container`] of `sh -c script`.
pub(crate) async fn run_script(
    c: &mut Client,
    pod: &str,
    config: &PodSandboxConfig,
    name: &str,
    script: &str,
) -> String {
    run_container(c, pod, config, name, &["sh", "-c", script]).await
}

/// Creates and starts the container `container` describes; returns its id.
pub(crate) async fn create_and_start(
    c: &mut Client,
    pod: &str,
    config: &PodSandboxConfig,
    container: ContainerConfig,
) -> String {
    let name = container.metadata.as_ref().map(|m| m.name.clone()).unwrap_or_default();
    let id = c
        .create_container(CreateContainerRequest {
            pod_sandbox_id: pod.to_string(),
            config: Some(container),
            sandbox_config: Some(config.clone()),
        })
        .await
        .unwrap_or_else(|e| panic!("CreateContainer {name}: {e:?}\n{}", tail()))
        .into_inner()
        .container_id;
    c.start_container(StartContainerRequest {
        container_id: id.clone(),
    })
    .await
    .unwrap_or_else(|e| panic!("StartContainer {name}: {e:?}\n{}", tail()));
    id
}

/// PodSandboxStatus of `pod`: its status, or the call's error (a removed pod's NOT_FOUND).
pub(crate) async fn pod_status(c: &mut Client, pod: &str) -> Result<PodSandboxStatus, tonic::Status> {
    c.pod_sandbox_status(PodSandboxStatusRequest {
        pod_sandbox_id: pod.to_string(),
        verbose: false,
    })
    .await
    .map(|r| r.into_inner().status.unwrap())
}

pub(crate) async fn status(c: &mut Client, id: &str) -> ContainerStatusResponse {
    c.container_status(ContainerStatusRequest {
        container_id: id.to_string(),
        verbose: true,
    })
    .await
    .unwrap_or_else(|e| panic!("ContainerStatus: {e:?}"))
    .into_inner()
}

pub(crate) fn state(s: &ContainerStatusResponse) -> ContainerState {
    ContainerState::try_from(s.status.as_ref().unwrap().state).unwrap()
}

/// The container's init pid, from the verbose `info` containerd adds to ContainerStatus.
pub(crate) fn pid(s: &ContainerStatusResponse) -> u32 {
    let info: serde_json::Value = serde_json::from_str(&s.info["info"]).unwrap();
    info["pid"].as_u64().unwrap_or_else(|| panic!("no pid in {info}")) as u32
}

pub(crate) async fn exec(c: &mut Client, id: &str, cmd: &[&str]) -> ExecSyncResponse {
    c.exec_sync(ExecSyncRequest {
        container_id: id.to_string(),
        cmd: cmd.iter().map(|s| s.to_string()).collect(),
        timeout: 30,
    })
    .await
    .unwrap_or_else(|e| panic!("ExecSync {cmd:?}: {e:?}\n{}", tail()))
    .into_inner()
}

pub(crate) async fn wait_exited(c: &mut Client, id: &str, timeout: Duration) -> ContainerStatusResponse {
    let end = Instant::now() + timeout;
    loop {
        let s = status(c, id).await;
        if state(&s) == ContainerState::ContainerExited || Instant::now() > end {
            return s;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

pub(crate) async fn stop_and_remove_pod(c: &mut Client, pod: &str) {
    c.stop_pod_sandbox(StopPodSandboxRequest {
        pod_sandbox_id: pod.to_string(),
    })
    .await
    .unwrap_or_else(|e| panic!("StopPodSandbox: {e:?}\n{}", tail()));
    let st = pod_status(c, pod).await.unwrap();
    assert_eq!(st.state, PodSandboxState::SandboxNotready as i32);
    c.remove_pod_sandbox(RemovePodSandboxRequest {
        pod_sandbox_id: pod.to_string(),
    })
    .await
    .unwrap_or_else(|e| panic!("RemovePodSandbox: {e:?}\n{}", tail()));
    let gone = pod_status(c, pod).await.unwrap_err();
    assert_eq!(gone.code(), tonic::Code::NotFound, "{gone:?}");
}

/// containerd's log tail (the shims' JSON lines are in it), for failure messages.
pub(crate) fn tail() -> String {
    std::fs::read_to_string(crate::common::env().dir.join("cri/containerd.log"))
        .map(|l| {
            let lines: Vec<&str> = l.lines().collect();
            format!(
                "--- containerd log ---\n{}",
                lines[lines.len().saturating_sub(40)..].join("\n")
            )
        })
        .unwrap_or_default()
}

/// The gantry daemons serving any of `ids` (a daemon carries the `-id` of the container whose
/// `start` spawned it).
pub(crate) fn gantry_daemons_of(cri: &Cri, ids: &[&str]) -> Vec<Daemon> {
    cri.gantry_daemons()
        .into_iter()
        .filter(|d| ids.contains(&d.id.as_str()))
        .collect()
}

/// The pid gantry's `start` wrote into a task's bundle: the daemon serving that container.
pub(crate) fn bundle_shim_pid(cri: &Cri, id: &str) -> i32 {
    let p = cri.bundle(id).join("shim.pid");
    std::fs::read_to_string(&p)
        .unwrap_or_else(|e| panic!("{}: {e}", p.display()))
        .trim()
        .parse()
        .unwrap()
}

/// After a test's pods are gone: no gantry daemon of the CRI namespace, an empty socket dir, no
/// bundles, no runtime state and no cgroups of `ids`.
pub(crate) fn assert_gantry_clean(cri: &Cri, ids: &[&str]) {
    let mut left = Vec::new();
    let clean = wait_until(Duration::from_secs(30), || {
        left = cri
            .gantry_daemons()
            .iter()
            .map(|d| format!("gantry daemon {} {:?}", d.pid, d.args))
            .collect();
        left.extend(cri.sockets().iter().map(|s| format!("socket {}", s.display())));
        for id in ids {
            let b = cri.bundle(id);
            if b.exists() {
                left.push(format!("bundle {}", b.display()));
            }
            let st = cri.runtime_root.join(crate::common::cri::CRI_NS).join(id);
            if st.exists() {
                left.push(format!("runtime state {}", st.display()));
            }
            // The systemd driver's scope, which systemd removes with its unit.
            let scope = format!("cri-containerd-{id}.scope");
            let units = std::process::Command::new("systemctl")
                .args(["list-units", "--all", "--no-legend", &scope])
                .output();
            if units.is_ok_and(|o| String::from_utf8_lossy(&o.stdout).contains(&scope)) {
                left.push(format!("unit {scope}"));
            }
            // v1 controllers, and "" for the v2 tree.
            for ctl in ["memory", "cpu", "pids", ""] {
                let cg = std::path::Path::new("/sys/fs/cgroup")
                    .join(ctl)
                    .join(crate::common::cri::CRI_NS)
                    .join(id);
                if cg.exists() {
                    left.push(format!("cgroup {}", cg.display()));
                }
            }
        }
        left.is_empty()
    });
    assert!(clean, "left behind:\n{}\n{}", left.join("\n"), tail());
}

/// The whole CRI lifecycle of a gantry pod, as kubelet drives it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cri_gantry_pod_lifecycle() {
    let cri = cri().await;
    let _turn = cri.serial().await;
    let mut c = cri.client().await;
    let name = pod_name("lifecycle");
    let config = pod_config(&name, &cri.pod_log_dir(&name));

    let t0 = Instant::now();
    let pod = run_pod(&mut c, &config, HANDLER).await;
    let mut guard = PodGuard::new(cri, &pod);
    eprintln!("RunPodSandbox through gantry: {:?}", t0.elapsed());
    let st = pod_status(&mut c, &pod).await.unwrap();
    assert_eq!(st.state, PodSandboxState::SandboxReady as i32);
    assert_eq!(st.runtime_handler, HANDLER);

    // The sandbox runs in a gantry daemon found through the handler's ConfigPath (its socket is
    // in that config's socket_dir), not in a runc shim.
    let sandbox_daemons = gantry_daemons_of(cri, &[&pod]);
    assert_eq!(sandbox_daemons.len(), 1, "{sandbox_daemons:?}");
    let daemon = sandbox_daemons[0].pid;
    assert_eq!(bundle_shim_pid(cri, &pod), daemon);
    // containerd reads the address `start` wrote; the daemon listening there is this one.
    let address = std::fs::read_to_string(cri.bundle(&pod).join("address")).unwrap();
    let socket = address.trim().trim_start_matches("unix://").to_string();
    let conn = std::os::unix::net::UnixStream::connect(&socket).unwrap();
    let peer = nix::sys::socket::getsockopt(&conn, nix::sys::socket::sockopt::PeerCredentials).unwrap();
    assert_eq!(peer.pid(), daemon, "{socket} is served by another process");
    drop(conn);
    assert!(
        socket.starts_with(cri.socket_dir.to_str().unwrap()),
        "{socket} not in {}",
        cri.socket_dir.display()
    );
    assert!(
        cri.runc_daemons().iter().all(|d| d.id != pod),
        "a runc shim serves the gantry pod"
    );

    // A workload that burns a little CPU, then ignores SIGTERM forever.
    let burn = "trap '' TERM; i=0; while [ $i -lt 30000 ]; do i=$((i+1)); done; echo started; \
                while true; do sleep 1; done";
    let work = run_script(&mut c, &pod, &config, "work", burn).await;
    let s = status(&mut c, &work).await;
    assert_eq!(state(&s), ContainerState::ContainerRunning, "{s:?}");
    let work_pid = pid(&s);
    assert!(work_pid > 0);

    // The container joined the pod's daemon: one gantry daemon for sandbox + container.
    assert_eq!(bundle_shim_pid(cri, &work), daemon);
    let pod_daemons = gantry_daemons_of(cri, &[&pod, &work]);
    assert_eq!(
        pod_daemons.iter().map(|d| d.pid).collect::<Vec<_>>(),
        vec![daemon],
        "{pod_daemons:?}"
    );
    assert_eq!(cri.sockets(), vec![std::path::PathBuf::from(&socket)]);

    // ExecSync: output and exit code.
    let r = exec(&mut c, &work, &["sh", "-c", "echo hi; echo oops >&2; exit 3"]).await;
    assert_eq!(String::from_utf8_lossy(&r.stdout), "hi\n");
    assert_eq!(String::from_utf8_lossy(&r.stderr), "oops\n");
    assert_eq!(r.exit_code, 3);
    let r = exec(&mut c, &work, &["cat", "/proc/1/cmdline"]).await;
    assert_eq!(r.exit_code, 0);
    assert!(String::from_utf8_lossy(&r.stdout).starts_with("sh\0-c\0trap"), "{r:?}");

    // ContainerStats: CPU in nanoseconds (matches cpuacct.usage read around it) and memory.
    let memory = cgroup_dir(work_pid, "memory");
    assert!(
        if crate::common::cri::systemd_driver() {
            memory.ends_with(format!("{}/cri-containerd-{work}.scope", crate::common::cri::POD_SLICE))
        } else {
            memory.ends_with(format!("k8s.io/{work}"))
        },
        "unexpected cgroup {}",
        memory.display()
    );
    // Let the CPU loop finish so the usage is well above zero.
    let log = cri.pod_log_dir(&name).join("work.log");
    let started = wait_until(Duration::from_secs(30), || {
        std::fs::read_to_string(&log).unwrap_or_default().contains("started")
    });
    assert!(started, "no 'started' in {}", log.display());
    let before = cpu_usage_ns(work_pid);
    let stats = c
        .container_stats(ContainerStatsRequest {
            container_id: work.clone(),
        })
        .await
        .unwrap_or_else(|e| panic!("ContainerStats: {e:?}\n{}", tail()))
        .into_inner()
        .stats
        .unwrap();
    let after = cpu_usage_ns(work_pid);
    let cpu = stats.cpu.unwrap().usage_core_nano_seconds.unwrap().value;
    assert!(cpu > 0, "{stats:?}");
    assert!(
        before <= cpu && cpu <= after,
        "CPU {cpu} ns not within the cgroup's usage {before}..{after}"
    );
    let mem = stats.memory.unwrap();
    let usage = mem.usage_bytes.unwrap().value;
    let working_set = mem.working_set_bytes.unwrap().value;
    assert!(usage > 0 && working_set > 0 && working_set <= usage, "{mem:?}");
    assert_eq!(stats.attributes.unwrap().id, work);

    // UpdateContainerResources changes the cgroup's memory limit.
    let limit: i64 = 96 << 20;
    assert_ne!(memory_limit(work_pid), limit.to_string());
    c.update_container_resources(UpdateContainerResourcesRequest {
        container_id: work.clone(),
        linux: Some(LinuxContainerResources {
            memory_limit_in_bytes: limit,
            cpu_shares: 512,
        }),
    })
    .await
    .unwrap_or_else(|e| panic!("UpdateContainerResources: {e:?}\n{}", tail()));
    assert_eq!(memory_limit(work_pid), limit.to_string());
    let (held, want) = cpu_shares_as_held(work_pid, 512);
    assert_eq!(held, want);
    let s = status(&mut c, &work).await;
    let res = s.status.unwrap().resources.unwrap().linux.unwrap();
    assert_eq!(res.memory_limit_in_bytes, limit);

    // A second container of the pod: runs to its own exit code, output in its CRI log.
    let oneshot = run_script(
        &mut c,
        &pod,
        &config,
        "oneshot",
        "echo to-stdout; echo to-stderr >&2; exit 5",
    )
    .await;
    assert_eq!(bundle_shim_pid(cri, &oneshot), daemon);
    let s = wait_exited(&mut c, &oneshot, Duration::from_secs(30)).await;
    assert_eq!(state(&s), ContainerState::ContainerExited, "{s:?}");
    let st = s.status.unwrap();
    assert_eq!(st.exit_code, 5);
    assert_eq!(st.reason, "Error");
    // Both set; their order is not asserted: CRI stamps StartedAt when StartContainer returns,
    // FinishedAt from the exit time, and a command that exits at once may be reaped first.
    assert!(st.started_at > 0 && st.finished_at > 0, "{st:?}");
    let log = std::fs::read_to_string(cri.pod_log_dir(&name).join("oneshot.log")).unwrap();
    assert!(log.lines().any(|l| l.ends_with(" stdout F to-stdout")), "{log}");
    assert!(log.lines().any(|l| l.ends_with(" stderr F to-stderr")), "{log}");
    c.remove_container(RemoveContainerRequest {
        container_id: oneshot.clone(),
    })
    .await
    .unwrap();
    // Still one daemon, still serving the pod.
    assert_eq!(gantry_daemons_of(cri, &[&pod, &work, &oneshot]).len(), 1);

    // StopContainer with a timeout: SIGTERM is ignored, SIGKILL follows after the timeout.
    let timeout = 2;
    let t = Instant::now();
    c.stop_container(StopContainerRequest {
        container_id: work.clone(),
        timeout,
    })
    .await
    .unwrap_or_else(|e| panic!("StopContainer: {e:?}\n{}", tail()));
    let elapsed = t.elapsed();
    assert!(
        elapsed >= Duration::from_secs(timeout as u64),
        "stopped after {elapsed:?}, before the {timeout}s timeout"
    );
    assert!(elapsed < Duration::from_secs(30), "stop took {elapsed:?}");
    let s = status(&mut c, &work).await;
    assert_eq!(state(&s), ContainerState::ContainerExited, "{s:?}");
    assert_eq!(s.status.as_ref().unwrap().exit_code, 137);
    let reaped = wait_until(Duration::from_secs(30), || {
        !std::path::Path::new(&format!("/proc/{work_pid}")).exists()
    });
    assert!(reaped, "container process {work_pid} still there");

    c.remove_container(RemoveContainerRequest {
        container_id: work.clone(),
    })
    .await
    .unwrap_or_else(|e| panic!("RemoveContainer: {e:?}\n{}", tail()));
    let left = c
        .list_containers(ListContainersRequest {
            filter: Some(ContainerFilter {
                pod_sandbox_id: pod.clone(),
            }),
        })
        .await
        .unwrap()
        .into_inner()
        .containers;
    assert!(left.is_empty(), "{left:?}");
    // The sandbox keeps the daemon alive.
    assert!(std::path::Path::new(&format!("/proc/{daemon}")).exists());

    stop_and_remove_pod(&mut c, &pod).await;
    guard.disarm();
    let exited = wait_until(Duration::from_secs(30), || {
        !std::path::Path::new(&format!("/proc/{daemon}")).exists()
    });
    assert!(
        exited,
        "gantry daemon {daemon} still running after RemovePodSandbox\n{}",
        tail()
    );
    assert_gantry_clean(cri, &[&pod, &work, &oneshot]);
    eprintln!("gantry pod lifecycle: {:?}", t0.elapsed());
}

/// Two gantry pods at once get a daemon each; removing one leaves the other serving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cri_two_gantry_pods_two_daemons() {
    let cri = cri().await;
    let _turn = cri.serial().await;
    let mut c = cri.client().await;
    let (na, nb) = (pod_name("pod-a"), pod_name("pod-b"));
    let (ca, cb) = (
        pod_config(&na, &cri.pod_log_dir(&na)),
        pod_config(&nb, &cri.pod_log_dir(&nb)),
    );
    let a = run_pod(&mut c, &ca, HANDLER).await;
    let mut ga = PodGuard::new(cri, &a);
    let b = run_pod(&mut c, &cb, HANDLER).await;
    let mut gb = PodGuard::new(cri, &b);
    let xa = run_container(&mut c, &a, &ca, "x", &["sleep", "1000"]).await;
    let xb = run_container(&mut c, &b, &cb, "x", &["sleep", "1000"]).await;

    let (da, db) = (bundle_shim_pid(cri, &a), bundle_shim_pid(cri, &b));
    assert_ne!(da, db);
    assert_eq!(bundle_shim_pid(cri, &xa), da);
    assert_eq!(bundle_shim_pid(cri, &xb), db);
    let pids: HashSet<i32> = gantry_daemons_of(cri, &[&a, &b, &xa, &xb])
        .iter()
        .map(|d| d.pid)
        .collect();
    assert_eq!(pids, HashSet::from([da, db]));
    assert_eq!(cri.sockets().len(), 2);

    stop_and_remove_pod(&mut c, &a).await;
    ga.disarm();
    let exited = wait_until(Duration::from_secs(30), || {
        !std::path::Path::new(&format!("/proc/{da}")).exists()
    });
    assert!(exited, "daemon of pod a still running\n{}", tail());
    // Pod b is untouched.
    assert!(std::path::Path::new(&format!("/proc/{db}")).exists());
    assert_eq!(state(&status(&mut c, &xb).await), ContainerState::ContainerRunning);
    let r = exec(&mut c, &xb, &["echo", "b lives"]).await;
    assert_eq!(
        (r.exit_code, String::from_utf8_lossy(&r.stdout).as_ref()),
        (0, "b lives\n")
    );
    assert_eq!(cri.sockets().len(), 1);

    // RemovePodSandbox without a StopContainer first: containerd stops what is left.
    stop_and_remove_pod(&mut c, &b).await;
    gb.disarm();
    assert_gantry_clean(cri, &[&a, &b, &xa, &xb]);
}

/// A container killed by the kernel's OOM killer is reported by containerd's CRI as
/// `OOMKilled` with exit code 137: CRI reads gantry's `/tasks/oom` event, which comes first.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cri_an_oom_killed_container_is_reported_oomkilled() {
    use crate::common::cri_api::LinuxContainerResources;
    let cri = cri().await;
    let _turn = cri.serial().await;
    let mut c = cri.client().await;
    let name = pod_name("oom");
    let config = pod_config(&name, &cri.pod_log_dir(&name));
    let pod = run_pod(&mut c, &config, HANDLER).await;
    let mut guard = PodGuard::new(cri, &pod);
    let mut hog = container_config("hog", &["sh", "-c", "x=aaaaaaaaaaaaaaaa; while true; do x=$x$x; done"]);
    if let Some(linux) = hog.linux.as_mut() {
        linux.resources = Some(LinuxContainerResources {
            memory_limit_in_bytes: 16 << 20,
            cpu_shares: 0,
        });
    }
    let id = create_and_start(&mut c, &pod, &config, hog).await;
    let s = wait_exited(&mut c, &id, Duration::from_secs(60)).await;
    let st = s.status.unwrap();
    assert_eq!(
        (st.exit_code, st.reason.as_str()),
        (137, "OOMKilled"),
        "{st:?}\n{}",
        tail()
    );
    stop_and_remove_pod(&mut c, &pod).await;
    guard.disarm();
    assert_gantry_clean(cri, &[&pod, &id]);
}

/// A pod without a runtime handler runs on containerd's default (runc): no gantry involved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cri_default_handler_still_runc() {
    let cri = cri().await;
    let _turn = cri.serial().await;
    let mut c = cri.client().await;
    let name = pod_name("runc-pod");
    let config = pod_config(&name, &cri.pod_log_dir(&name));
    let pod = run_pod(&mut c, &config, "").await;
    let mut guard = PodGuard::new(cri, &pod);
    let st = pod_status(&mut c, &pod).await.unwrap();
    assert_eq!(st.state, PodSandboxState::SandboxReady as i32);

    let ctr = run_container(&mut c, &pod, &config, "plain", &["sleep", "1000"]).await;
    assert_eq!(state(&status(&mut c, &ctr).await), ContainerState::ContainerRunning);
    let r = exec(&mut c, &ctr, &["sh", "-c", "echo via runc; exit 2"]).await;
    assert_eq!(
        (r.exit_code, String::from_utf8_lossy(&r.stdout).as_ref()),
        (2, "via runc\n")
    );

    // containerd's runc shim serves the pod; gantry serves nothing and has no socket.
    let runc: Vec<Daemon> = cri.runc_daemons().into_iter().filter(|d| d.id == pod).collect();
    assert_eq!(runc.len(), 1, "no runc shim for the pod: {:?}", cri.runc_daemons());
    assert!(cri.gantry_daemons().is_empty(), "{:?}", cri.gantry_daemons());
    assert!(cri.sockets().is_empty(), "{:?}", cri.sockets());
    assert!(
        cri.runc_root.join(crate::common::cri::CRI_NS).join(&ctr).exists(),
        "container not in the runc handler's root"
    );

    c.stop_container(StopContainerRequest {
        container_id: ctr.clone(),
        timeout: 1,
    })
    .await
    .unwrap();
    let s = status(&mut c, &ctr).await;
    assert_eq!(state(&s), ContainerState::ContainerExited);
    assert_eq!(s.status.unwrap().exit_code, 137);
    c.remove_container(RemoveContainerRequest { container_id: ctr })
        .await
        .unwrap();
    stop_and_remove_pod(&mut c, &pod).await;
    guard.disarm();
    let runc_pid = runc[0].pid;
    let exited = wait_until(Duration::from_secs(30), || {
        !std::path::Path::new(&format!("/proc/{runc_pid}")).exists()
    });
    assert!(exited, "runc shim {runc_pid} still running");
    assert_gantry_clean(cri, &[&pod]);
}
