//! Test fixtures: fake NVIDIA nodes and nvidia-ctk-shaped CDI specs.
//!
//! Compiled only into tests: the library's unit tests (`cfg(test)`), and the integration and
//! fuzz targets, which include this file as a module of their own (`#[path]`), so no fixture
//! ships in the library. They build the same fake host: real character nodes under a temporary
//! dev root (needs root for `mknod`) and a spec like `nvidia-ctk cdi generate` writes, whose
//! host paths point at those nodes.

use std::fs;
use std::io;
use std::os::unix::fs::PermissionsExt;
use std::path::{Path, PathBuf};

use nix::sys::stat::{makedev, mknod, Mode, SFlag};

/// Major of the `nvidia` driver's nodes on real hosts.
pub const NVIDIA_MAJOR: u32 = 195;

/// Whether this process can create device nodes.
pub fn is_root() -> bool {
    nix::unistd::geteuid().is_root()
}

/// A stable, well-formed GPU UUID for fake GPU `index`.
pub fn fake_gpu_uuid(index: u32) -> String {
    format!("GPU-6ba7b810-9dad-11d1-80b4-{index:012x}")
}

/// Creates, under `dev_root`, character nodes shaped like a host with
/// `gpus` GPUs: `nvidiaN` (195:N), `nvidiactl` (195:255), `nvidia-modeset`
/// (195:254), `nvidia-uvm` (uvm_major:0), `nvidia-uvm-tools`
/// (uvm_major:1) and `nvidia-caps/nvidia-cap1`, `nvidia-cap2`
/// (uvm_major+1:1, 2), all mode 0666. Existing nodes are kept.
pub fn make_fake_nvidia(dev_root: &Path, gpus: u32, uvm_major: u32) -> io::Result<()> {
    fs::create_dir_all(dev_root.join("nvidia-caps"))?;
    let mut nodes: Vec<(String, u32, u32)> = (0..gpus).map(|i| (format!("nvidia{i}"), NVIDIA_MAJOR, i)).collect();
    nodes.extend([
        ("nvidiactl".to_string(), NVIDIA_MAJOR, 255),
        ("nvidia-modeset".to_string(), NVIDIA_MAJOR, 254),
        ("nvidia-uvm".to_string(), uvm_major, 0),
        ("nvidia-uvm-tools".to_string(), uvm_major, 1),
        ("nvidia-caps/nvidia-cap1".to_string(), uvm_major + 1, 1),
        ("nvidia-caps/nvidia-cap2".to_string(), uvm_major + 1, 2),
    ]);
    for (rel, major, minor) in nodes {
        let path = dev_root.join(rel);
        match mknod(
            &path,
            SFlag::S_IFCHR,
            Mode::from_bits_truncate(0o666),
            makedev(u64::from(major), u64::from(minor)),
        ) {
            Ok(()) | Err(nix::errno::Errno::EEXIST) => {}
            Err(e) => return Err(io::Error::from(e)),
        }
        // mknod is subject to the umask
        fs::set_permissions(&path, fs::Permissions::from_mode(0o666))?;
    }
    Ok(())
}

/// Writes `<dir>/nvidia.json`, shaped like `nvidia-ctk cdi generate` output
/// for `gpus` GPUs: devices `N`, `GPU-<uuid>` ([`fake_gpu_uuid`]) and `all`
/// whose nodes carry only `path` (`/dev/nvidiaN`) and `hostPath` (the fake
/// node under `dev_root`); spec-wide edits with
/// `NVIDIA_VISIBLE_DEVICES=void`, the control nodes, a bind mount of
/// `lib_host_path` at `/usr/lib/x86_64-linux-gnu/libcuda.so.1` and a
/// `createContainer` hook. Returns the file's path.
pub fn write_nvidia_cdi_spec(
    dir: &Path,
    dev_root: &Path,
    gpus: u32,
    hook_path: &str,
    hook_args: Vec<String>,
    lib_host_path: &Path,
) -> io::Result<PathBuf> {
    let node = |rel: &str| {
        serde_json::json!({
            "path": format!("/dev/{rel}"),
            "hostPath": dev_root.join(rel),
        })
    };
    let mut devices = Vec::new();
    for i in 0..gpus {
        let edits = serde_json::json!({"deviceNodes": [node(&format!("nvidia{i}"))]});
        devices.push(serde_json::json!({"name": i.to_string(), "containerEdits": edits}));
        devices.push(serde_json::json!({"name": fake_gpu_uuid(i), "containerEdits": edits}));
    }
    let all: Vec<_> = (0..gpus).map(|i| node(&format!("nvidia{i}"))).collect();
    devices.push(serde_json::json!({"name": "all", "containerEdits": {"deviceNodes": all}}));
    let spec = serde_json::json!({
        "cdiVersion": "0.5.0",
        "kind": "nvidia.com/gpu",
        "devices": devices,
        "containerEdits": {
            "env": ["NVIDIA_VISIBLE_DEVICES=void"],
            "deviceNodes": [
                node("nvidiactl"),
                node("nvidia-uvm"),
                node("nvidia-uvm-tools"),
                node("nvidia-modeset"),
            ],
            "hooks": [{
                "hookName": "createContainer",
                "path": hook_path,
                "args": hook_args,
            }],
            "mounts": [{
                "hostPath": lib_host_path,
                "containerPath": "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
                "options": ["ro", "nosuid", "nodev", "bind"],
            }],
        },
    });
    fs::create_dir_all(dir)?;
    let path = dir.join("nvidia.json");
    let text = serde_json::to_string_pretty(&spec).map_err(io::Error::other)?;
    fs::write(&path, text)?;
    Ok(path)
}

/// The `args` of the ldcache hook in [`write_nvidia_cdi_spec`] specs as
/// nvidia-ctk writes them.
pub fn ldcache_hook_args() -> Vec<String> {
    [
        "nvidia-cdi-hook",
        "update-ldcache",
        "--folder",
        "/usr/lib/x86_64-linux-gnu",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect()
}
