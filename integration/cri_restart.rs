//! containerd restarted under running gantry pods, the way a node upgrade or `systemctl restart
//! containerd` does it, and everything driven through the CRI afterwards, as kubelet would.

use std::path::Path;
use std::time::Duration;

use crate::common::cri::{cri, pod_config, PodGuard, HANDLER};
use crate::common::cri_api::{ContainerState, PodSandboxState};
use crate::common::cri_stream::Stdin;
use crate::common::wait_until;
use crate::cri::{
    assert_gantry_clean, bundle_shim_pid, exec, gantry_daemons_of, pid, pod_name, pod_status, run_pod, run_script,
    state, status, stop_and_remove_pod, tail, wait_exited,
};
use crate::cri_exec::stream_exec;

/// A file the container's shell waits for, created from the host through `/proc/<pid>/root`
/// (the CRI cannot reach the container while containerd is down).
fn release(pid: u32, name: &str) {
    std::fs::write(format!("/proc/{pid}/root/tmp/{name}"), "").unwrap();
}

/// The pod and its daemon outlive containerd; a container that exits while containerd is down
/// is reported exited with its code afterwards; a running one keeps its pid, its log stream
/// (containerd reattaches to its output), exec with and without a terminal, and stops and is
/// removed with nothing left behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cri_containerd_restart_under_a_running_gantry_pod() {
    let cri = cri().await;
    let _turn = cri.serial().await;
    let mut c = cri.client().await;
    let name = pod_name("restart");
    let log_dir = cri.pod_log_dir(&name);
    let config = pod_config(&name, &log_dir);
    let pod = run_pod(&mut c, &config, HANDLER).await;
    let mut guard = PodGuard::new(cri, &pod);
    let wait_for = |file: &str| format!("while [ ! -e /tmp/{file} ]; do sleep 0.1; done");
    let script = format!("echo before; {}; echo after; exec sleep 1000", wait_for("again"));
    let work = run_script(&mut c, &pod, &config, "work", &script).await;
    let ends = run_script(&mut c, &pod, &config, "ends", &format!("{}; exit 3", wait_for("go"))).await;
    let daemon = bundle_shim_pid(cri, &pod);
    let work_pid = pid(&status(&mut c, &work).await);
    let ends_pid = pid(&status(&mut c, &ends).await);

    cri.stop_containerd();
    release(ends_pid, "go");
    let gone = wait_until(Duration::from_secs(30), || {
        !Path::new(&format!("/proc/{ends_pid}")).exists()
    });
    assert!(gone, "the container did not exit while containerd was down");
    cri.start_containerd().await;

    // The same daemon still serves the whole pod; containerd started no other.
    let daemons: Vec<i32> = gantry_daemons_of(cri, &[&pod, &work, &ends])
        .iter()
        .map(|d| d.pid)
        .collect();
    assert_eq!(daemons, vec![daemon], "{}", tail());
    let st = pod_status(&mut c, &pod).await.unwrap();
    assert_eq!(st.state, PodSandboxState::SandboxReady as i32);

    let s = wait_exited(&mut c, &ends, Duration::from_secs(30)).await;
    assert_eq!(state(&s), ContainerState::ContainerExited, "{s:?}\n{}", tail());
    // containerd 2.x, back up, asks each task shim for its pids and takes one with none (a
    // container that exited meanwhile) for a leaked shim: it deletes the task and CRI reports
    // 255, "Unknown" (core/runtime/v2/shim_load.go). runc's shim answers the same, and so the
    // same happens to it (checked by hand with the runc handler on containerd 2.3.7).
    let (code, reason) = match cri.engine_major() {
        1 => (3, "Error"),
        _ => (255, "Unknown"),
    };
    let st = s.status.as_ref().unwrap();
    assert_eq!((st.exit_code, st.reason.as_str()), (code, reason), "{s:?}");

    let s = status(&mut c, &work).await;
    assert_eq!(
        (state(&s), pid(&s)),
        (ContainerState::ContainerRunning, work_pid),
        "{s:?}"
    );
    release(work_pid, "again");
    let log = log_dir.join("work.log");
    let logged = wait_until(Duration::from_secs(30), || {
        std::fs::read_to_string(&log).is_ok_and(|l| l.contains(" stdout F before") && l.contains(" stdout F after"))
    });
    assert!(
        logged,
        "output after the restart is not in the CRI log: {:?}\n{}",
        std::fs::read_to_string(&log),
        tail()
    );
    let r = exec(&mut c, &work, &["echo", "still here"]).await;
    assert_eq!((r.exit_code, r.stdout.as_slice()), (0, &b"still here\n"[..]), "{r:?}");
    let r = stream_exec(
        &mut c,
        &work,
        &["sh", "-c", "test -t 1 && echo tty; exit 2"],
        true,
        Stdin::Open,
    )
    .await;
    assert!(r.stdout_text().contains("tty"), "{r:?}");
    assert_eq!(r.exit_code(), Some(2), "{r:?}");

    stop_and_remove_pod(&mut c, &pod).await;
    guard.disarm();
    assert_gantry_clean(cri, &[&pod, &work, &ends]);
}
