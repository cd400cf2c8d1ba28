//! Host device nodes: `stat` for CDI nodes that carry only a path, and the
//! `/dev/nvidia*` discovery used when no CDI spec exists for the NVIDIA kind.
//!
//! Majors are read from the nodes, never hard-coded: `nvidia-uvm` and
//! `nvidia-caps` majors are assigned dynamically by the kernel.

use std::collections::BTreeMap;
use std::fs;
use std::io;
use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use oci_spec::runtime::LinuxDeviceType;

/// What `stat` says about a device node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NodeInfo {
    pub typ: LinuxDeviceType,
    pub major: i64,
    pub minor: i64,
    /// Permission bits (`mode & 0o7777`).
    pub mode: u32,
}

/// Stats `path` (following symlinks, as `/dev/char/*` are links). `Ok(None)`
/// when it exists but is not a device node or fifo.
pub fn stat_node(path: &Path) -> io::Result<Option<NodeInfo>> {
    let meta = fs::metadata(path)?;
    let ft = meta.file_type();
    let typ = if ft.is_char_device() {
        LinuxDeviceType::C
    } else if ft.is_block_device() {
        LinuxDeviceType::B
    } else if ft.is_fifo() {
        LinuxDeviceType::P
    } else {
        return Ok(None);
    };
    let (major, minor) = if typ == LinuxDeviceType::P {
        (0, 0)
    } else {
        let rdev = meta.rdev();
        (i64::from(libc::major(rdev)), i64::from(libc::minor(rdev)))
    };
    Ok(Some(NodeInfo {
        typ,
        major,
        minor,
        mode: meta.mode() & 0o7777,
    }))
}

/// Maps a host path under `/dev` to `dev_root` (`/dev/nvidia0` →
/// `<dev_root>/nvidia0`); other paths are used as they are.
pub fn host_path(path: &Path, dev_root: &Path) -> PathBuf {
    match path.strip_prefix("/dev") {
        Ok(rest) if path.is_absolute() => dev_root.join(rest),
        _ => path.to_path_buf(),
    }
}

/// A host node found by discovery.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HostNode {
    /// Where it is on the host (under `dev_root`).
    pub host: PathBuf,
    /// Where it goes in the container (under `/dev`).
    pub container: PathBuf,
    pub info: NodeInfo,
}

/// Control nodes every GPU process needs, in injection order.
pub const CONTROL_NODES: [&str; 4] = ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools", "nvidia-modeset"];

/// `/dev/nvidia*` nodes found under a dev root.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NvidiaNodes {
    /// `nvidiaN` by index N.
    pub gpus: BTreeMap<u32, HostNode>,
    /// Present control nodes (see [`CONTROL_NODES`]), then `nvidia-caps/*`.
    pub control: Vec<HostNode>,
}

/// Lists NVIDIA nodes under `dev_root`. A missing `dev_root` or
/// `nvidia-caps` directory means no nodes; entries that are not character
/// devices are ignored.
pub fn discover_nvidia(dev_root: &Path) -> io::Result<NvidiaNodes> {
    let mut found = NvidiaNodes::default();
    let entries = match fs::read_dir(dev_root) {
        Ok(e) => e,
        Err(e) if e.kind() == io::ErrorKind::NotFound => return Ok(found),
        Err(e) => return Err(e),
    };
    let mut names = Vec::new();
    for entry in entries {
        names.push(entry?.file_name().to_string_lossy().into_owned());
    }
    for name in &names {
        let Some(index) = name
            .strip_prefix("nvidia")
            .filter(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(node) = char_node(dev_root, name)? {
            found.gpus.insert(index, node);
        }
    }
    for name in CONTROL_NODES {
        if names.iter().any(|n| n == name) {
            if let Some(node) = char_node(dev_root, name)? {
                found.control.push(node);
            }
        }
    }
    match fs::read_dir(dev_root.join("nvidia-caps")) {
        Ok(entries) => {
            let mut caps = Vec::new();
            for entry in entries {
                caps.push(format!("nvidia-caps/{}", entry?.file_name().to_string_lossy()));
            }
            caps.sort();
            for rel in caps {
                if let Some(node) = char_node(dev_root, &rel)? {
                    found.control.push(node);
                }
            }
        }
        Err(e) if matches!(e.kind(), io::ErrorKind::NotFound | io::ErrorKind::NotADirectory) => {}
        Err(e) => return Err(e),
    }
    Ok(found)
}

fn char_node(dev_root: &Path, rel: &str) -> io::Result<Option<HostNode>> {
    let host = dev_root.join(rel);
    match stat_node(&host) {
        Ok(Some(info)) if info.typ == LinuxDeviceType::C => Ok(Some(HostNode {
            host,
            container: Path::new("/dev").join(rel),
            info,
        })),
        Ok(_) => Ok(None),
        // raced with a driver unload: treat as absent
        Err(e) if e.kind() == io::ErrorKind::NotFound => Ok(None),
        Err(e) => Err(e),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::fixture::{is_root, make_fake_nvidia};

    #[test]
    fn host_path_mapping() {
        let root = Path::new("/tmp/fake/dev");
        for (input, want) in [
            ("/dev/nvidia0", "/tmp/fake/dev/nvidia0"),
            ("/dev/nvidia-caps/nvidia-cap1", "/tmp/fake/dev/nvidia-caps/nvidia-cap1"),
            ("/dev", "/tmp/fake/dev"),
            ("/devices/x", "/devices/x"),
            ("/opt/dev/nvidia0", "/opt/dev/nvidia0"),
            ("dev/nvidia0", "dev/nvidia0"),
        ] {
            assert_eq!(host_path(Path::new(input), root), PathBuf::from(want), "{input}");
        }
        assert_eq!(
            host_path(Path::new("/dev/nvidia0"), Path::new("/dev")),
            PathBuf::from("/dev/nvidia0")
        );
    }

    #[test]
    fn stat_kinds() {
        let null = stat_node(Path::new("/dev/null")).unwrap().unwrap();
        assert_eq!((null.typ, null.major, null.minor), (LinuxDeviceType::C, 1, 3));
        assert_eq!(stat_node(Path::new("/etc/hostname")).ok().flatten(), None);
        assert_eq!(
            stat_node(Path::new("/nonexistent/x")).unwrap_err().kind(),
            io::ErrorKind::NotFound
        );
    }

    #[test]
    fn discovers_fake_nodes() {
        assert!(
            is_root(),
            "this test creates device nodes: run the suite as root (scripts/test.sh)"
        );
        let dir = tempfile::tempdir().unwrap();
        let dev = dir.path().join("dev");
        assert_eq!(
            discover_nvidia(&dev).unwrap(),
            NvidiaNodes::default(),
            "missing dev root"
        );
        make_fake_nvidia(&dev, 3, 511).unwrap();
        // noise that must be ignored
        fs::write(dev.join("nvidia7"), b"not a node").unwrap();
        fs::write(dev.join("nvidia-smi"), b"").unwrap();
        let found = discover_nvidia(&dev).unwrap();
        assert_eq!(found.gpus.keys().copied().collect::<Vec<_>>(), [0, 1, 2]);
        let gpu1 = &found.gpus[&1];
        assert_eq!(gpu1.container, PathBuf::from("/dev/nvidia1"));
        assert_eq!(gpu1.host, dev.join("nvidia1"));
        assert_eq!((gpu1.info.major, gpu1.info.minor, gpu1.info.mode), (195, 1, 0o666));
        let control: Vec<_> = found
            .control
            .iter()
            .map(|n| (n.container.to_string_lossy().into_owned(), n.info.major, n.info.minor))
            .collect();
        assert_eq!(
            control,
            [
                ("/dev/nvidiactl".to_string(), 195, 255),
                ("/dev/nvidia-uvm".to_string(), 511, 0),
                ("/dev/nvidia-uvm-tools".to_string(), 511, 1),
                ("/dev/nvidia-modeset".to_string(), 195, 254),
                ("/dev/nvidia-caps/nvidia-cap1".to_string(), 512, 1),
                ("/dev/nvidia-caps/nvidia-cap2".to_string(), 512, 2),
            ]
        );
    }
}
