//! GPU injection through a real containerd and runc, on fake NVIDIA nodes (this machine has no
//! GPU): a temp device root with `mknod`ed nodes and a CDI spec shaped like `nvidia-ctk cdi
//! generate` output, with a library mount and a createContainer hook.

use std::path::PathBuf;

use crate::gpu_fixture::{make_fake_nvidia, write_nvidia_cdi_spec, NVIDIA_MAJOR};

use crate::common::{assert_clean, env, text, Ns};

const UVM_MAJOR: u32 = 235;

pub(crate) struct GpuHost {
    pub(crate) ns: Ns,
    marker: PathBuf,
    cdi_dir: PathBuf,
}

/// A namespace whose gantry config sees two fake GPUs (nodes, CDI spec, hook, library).
pub(crate) fn gpu_host(name: &str) -> GpuHost {
    let env = env();
    // The namespace dir is made first so the fake host can live inside it.
    let probe = env.namespace(name);
    let dev = probe.dir.join("dev");
    make_fake_nvidia(&dev, 2, UVM_MAJOR).unwrap();
    let lib = probe.dir.join("libcuda.so.1");
    std::fs::write(&lib, "fake libcuda\n").unwrap();
    let marker = probe.dir.join("hook-ran");
    let hook = probe.dir.join("hook.sh");
    std::fs::write(&hook, format!("#!/bin/sh\necho \"$@\" >> {}\n", marker.display())).unwrap();
    std::fs::set_permissions(&hook, std::os::unix::fs::PermissionsExt::from_mode(0o755)).unwrap();
    let cdi_dir = probe.dir.join("cdi");
    let args = vec!["nvidia-cdi-hook".to_string(), "update-ldcache".to_string()];
    write_nvidia_cdi_spec(&cdi_dir, &dev, 2, hook.to_str().unwrap(), args, &lib).unwrap();
    let devices = format!(
        "[devices]\ncdi_spec_dirs = [{:?}]\ndev_root = {:?}\nnvidia_visible_devices = true\n",
        cdi_dir, dev
    );
    let ns = env.namespace_with(name, &devices);
    GpuHost { ns, marker, cdi_dir }
}

/// Opens a node of each (major, minor) made inside the container: with no driver behind a fake
/// node, the kernel answers ENXIO ("No such device or address") when the container's device
/// cgroup lets it through and EPERM ("not permitted") when it does not, on v1's devices files
/// and v2's eBPF filter alike.
const PROBE: &str = "for d in 195:0 195:1 195:255 235:0; do mknod /tmp/probe c ${d%:*} ${d#*:}; \
    echo \"access $d $(cat /tmp/probe 2>&1 | grep -o 'not permitted\\|No such device or address')\"; \
    rm -f /tmp/probe; done";

/// `ls -l`-style lines of /dev/nvidia* inside a container, and what its device cgroup lets it
/// open ([`PROBE`]).
fn run_and_inspect(host: &GpuHost, id: &str, extra: &[&str]) -> (String, String) {
    let env = env();
    let o = env.ctr_run_detached(&host.ns, id, extra, &["sleep", "1000"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = env.ctr(
        &host.ns.name,
        &[
            "task",
            "exec",
            "--exec-id",
            "ls",
            id,
            "sh",
            "-c",
            "ls -l /dev/ | grep nvidia; cat /usr/lib/x86_64-linux-gnu/libcuda.so.1",
        ],
    );
    assert!(o.status.success(), "{}", text(&o));
    let mut inside = String::from_utf8_lossy(&o.stdout).into_owned();
    // What was injected is recorded in the bundle's spec (crictl inspect shows annotations).
    let spec: serde_json::Value =
        serde_json::from_slice(&std::fs::read(env.bundle(&host.ns.name, id).join("config.json")).unwrap()).unwrap();
    let injected = spec["annotations"]["gantry.dev/injected-devices"]
        .as_str()
        .unwrap_or("")
        .to_string();
    inside.push_str(&format!("\ninjected: {injected}\n"));
    let o = env.ctr(
        &host.ns.name,
        &["task", "exec", "--exec-id", "probe", id, "sh", "-c", PROBE],
    );
    assert!(o.status.success(), "{}", text(&o));
    let access = String::from_utf8_lossy(&o.stdout).into_owned();
    env.kill_and_remove(&host.ns.name, id);
    (inside, access)
}

/// The (major, minor) of a `/dev/NAME` line in `ls -l /dev` output, e.g. "crw-rw-rw- 1 root root 195, 0 ... nvidia0".
fn node(ls: &str, name: &str) -> Option<(u32, u32)> {
    ls.lines()
        .find(|l| l.split_whitespace().last() == Some(name))
        .and_then(|l| {
            let f: Vec<&str> = l.split_whitespace().collect();
            let major = f.get(4)?.trim_end_matches(',').parse().ok()?;
            let minor = f.get(5)?.parse().ok()?;
            Some((major, minor))
        })
}

fn allows(access: &str, major: u32, minor: u32) -> bool {
    let line = |what: &str| format!("access {major}:{minor} {what}");
    assert!(
        access
            .lines()
            .any(|l| l == line("No such device or address") || l == line("not permitted")),
        "no probe of {major}:{minor}: {access}"
    );
    access.lines().any(|l| l == line("No such device or address"))
}

fn assert_only_gpu(inside: &str, list: &str, want: u32, not: u32) {
    assert_eq!(
        node(inside, &format!("nvidia{want}")),
        Some((NVIDIA_MAJOR, want)),
        "{inside}"
    );
    assert_eq!(node(inside, "nvidiactl"), Some((NVIDIA_MAJOR, 255)), "{inside}");
    assert_eq!(node(inside, "nvidia-uvm"), Some((UVM_MAJOR, 0)), "{inside}");
    assert_eq!(node(inside, &format!("nvidia{not}")), None, "{inside}");
    assert!(allows(list, NVIDIA_MAJOR, want), "{list}");
    assert!(allows(list, NVIDIA_MAJOR, 255), "{list}");
    assert!(allows(list, UVM_MAJOR, 0), "{list}");
    assert!(!allows(list, NVIDIA_MAJOR, not), "{list}");
    assert!(inside.contains("fake libcuda"), "library mount missing: {inside}");
    assert!(inside.contains(&format!("injected: nvidia.com/gpu={want}")), "{inside}");
}

#[test]
fn nvidia_visible_devices_selects_one_gpu() {
    let host = gpu_host("gpu-env");
    let (inside, list) = run_and_inspect(&host, "g0", &["--env", "NVIDIA_VISIBLE_DEVICES=0"]);
    assert_only_gpu(&inside, &list, 0, 1);
    let hooks = std::fs::read_to_string(&host.marker).expect("createContainer hook did not run");
    assert!(hooks.contains("update-ldcache"), "{hooks}");
    assert_clean(env(), &host.ns);
}

#[test]
fn annotation_selects_a_cdi_device_and_unknown_devices_fail_create() {
    let host = gpu_host("gpu-annot");
    let (inside, list) = run_and_inspect(&host, "g1", &["--annotation", "gantry.dev/devices=nvidia.com/gpu=1"]);
    assert_only_gpu(&inside, &list, 1, 0);

    let env = env();
    let o = env.ctr_run(
        &host.ns,
        "g7",
        &["--annotation", "gantry.dev/devices=nvidia.com/gpu=7"],
        &["true"],
    );
    assert!(!o.status.success(), "{}", text(&o));
    let err = String::from_utf8_lossy(&o.stderr);
    assert!(err.contains("nvidia.com/gpu=7"), "{err}");
    assert!(
        err.contains(host.cdi_dir.to_str().unwrap()),
        "error does not name the spec dir: {err}"
    );
    let _ = env.ctr(&host.ns.name, &["container", "delete", "g7"]);
    assert_clean(env, &host.ns);
}

#[test]
fn without_a_cdi_spec_nodes_are_discovered_under_the_device_root() {
    let host = gpu_host("gpu-discover");
    std::fs::remove_dir_all(&host.cdi_dir).unwrap();
    let env = env();
    let o = env.ctr_run(
        &host.ns,
        "d1",
        &["--env", "NVIDIA_VISIBLE_DEVICES=1"],
        &["sh", "-c", "ls -l /dev/ | grep nvidia"],
    );
    assert!(o.status.success(), "{}", text(&o));
    let inside = String::from_utf8_lossy(&o.stdout);
    assert_eq!(node(&inside, "nvidia1"), Some((NVIDIA_MAJOR, 1)), "{inside}");
    assert_eq!(node(&inside, "nvidia-uvm"), Some((UVM_MAJOR, 0)), "{inside}");
    assert_eq!(node(&inside, "nvidia0"), None, "{inside}");
    assert_clean(env, &host.ns);
}
