//! Loading CDI spec directories and resolving requested devices to edits.
//!
//! Parsing uses gantry's own serde types for the CDI format ([`super::cdi_spec`], JSON or
//! YAML); `cdi_check` applies CDI's semantic checks (version, names, annotations, edits), as
//! Go's `cdi.Cache` does for containerd and CRI-O; resolution here dedups edits and honours
//! `dev_root`.

use std::fs;
use std::io;
use std::path::{Path, PathBuf};

use oci_spec::runtime::{Hook, LinuxDeviceType, Mount};

pub(crate) use super::cdi_spec::{RawDevice, RawEdits, RawNode};
use super::discover::{host_path, stat_node};
use super::edits::{EditSet, HookEdit, HookStage, NodeEdit};
use super::request::QualifiedName;
use super::DeviceError;

/// One valid spec file.
#[derive(Debug, Clone)]
pub(crate) struct LoadedSpec {
    pub path: PathBuf,
    /// Index of its directory in `cdi_spec_dirs`: higher wins.
    pub priority: usize,
    pub kind: String,
    devices: Vec<RawDevice>,
    edits: Option<RawEdits>,
}

/// A file or directory that could not be used.
#[derive(Debug, Clone)]
pub(crate) struct Broken {
    pub path: PathBuf,
    pub message: String,
    /// Read fine but did not parse or validate.
    pub malformed: bool,
}

impl Broken {
    pub fn to_error(&self) -> DeviceError {
        if self.malformed {
            DeviceError::MalformedSpec {
                path: self.path.clone(),
                message: self.message.clone(),
            }
        } else {
            DeviceError::UnreadableSpec {
                path: self.path.clone(),
                message: self.message.clone(),
            }
        }
    }
}

/// Every spec found in the configured directories.
#[derive(Debug, Clone, Default)]
pub(crate) struct Registry {
    pub dirs: Vec<PathBuf>,
    pub specs: Vec<LoadedSpec>,
    pub broken: Vec<Broken>,
}

impl Registry {
    /// Reads `*.json` and `*.yaml` in each directory (sorted by name). A
    /// missing directory is normal; anything unusable is kept in `broken`
    /// and only becomes an error if a request cannot be resolved without it.
    pub fn load(dirs: &[PathBuf]) -> Registry {
        let mut reg = Registry {
            dirs: dirs.to_vec(),
            ..Default::default()
        };
        for (priority, dir) in dirs.iter().enumerate() {
            let entries = match fs::read_dir(dir) {
                Ok(e) => e,
                Err(e) if e.kind() == io::ErrorKind::NotFound => continue,
                Err(e) => {
                    reg.broken.push(Broken {
                        path: dir.clone(),
                        message: e.to_string(),
                        malformed: false,
                    });
                    continue;
                }
            };
            let mut files = Vec::new();
            for entry in entries {
                match entry {
                    Ok(entry) if is_spec_file(&entry.path()) => files.push(entry.path()),
                    Ok(_) => {}
                    Err(e) => reg.broken.push(Broken {
                        path: dir.clone(),
                        message: e.to_string(),
                        malformed: false,
                    }),
                }
            }
            files.sort();
            for path in files {
                match load_file(&path, priority) {
                    Ok(spec) => reg.specs.push(spec),
                    Err(broken) => reg.broken.push(broken),
                }
            }
        }
        reg
    }

    /// Whether any valid spec has this kind.
    pub fn has_kind(&self, kind: &str) -> bool {
        self.specs.iter().any(|s| s.kind == kind)
    }

    /// Valid spec files of a kind, for error messages.
    pub fn files_for_kind(&self, kind: &str) -> Vec<PathBuf> {
        self.specs
            .iter()
            .filter(|s| s.kind == kind)
            .map(|s| s.path.clone())
            .collect()
    }

    /// The spec (index into `specs`) and device for a request: the highest
    /// priority directory wins; two files of that directory defining it
    /// conflict.
    pub fn lookup(&self, name: &QualifiedName) -> Result<(usize, &RawDevice), DeviceError> {
        let kind = name.kind();
        let found: Vec<(usize, &RawDevice)> = self
            .specs
            .iter()
            .enumerate()
            .filter(|(_, s)| s.kind == kind)
            .filter_map(|(i, s)| s.devices.iter().find(|d| d.name == name.name).map(|d| (i, d)))
            .collect();
        let Some(top) = found.iter().map(|(i, _)| self.specs[*i].priority).max() else {
            if let Some(broken) = self.broken.first() {
                return Err(broken.to_error());
            }
            return Err(DeviceError::UnknownDevice {
                device: name.to_string(),
                kind: kind.clone(),
                detail: "no CDI spec defines it".to_string(),
                spec_files: self.files_for_kind(&kind),
                searched: self.dirs.clone(),
            });
        };
        let winners: Vec<(usize, &RawDevice)> = found
            .into_iter()
            .filter(|(i, _)| self.specs[*i].priority == top)
            .collect();
        match winners.as_slice() {
            [winner] => Ok(*winner),
            [first, second, ..] => Err(DeviceError::ConflictingSpecs {
                device: name.to_string(),
                first: self.specs[first.0].path.clone(),
                second: self.specs[second.0].path.clone(),
            }),
            [] => Err(DeviceError::UnknownDevice {
                device: name.to_string(),
                kind: kind.clone(),
                detail: "no CDI spec defines it".to_string(),
                spec_files: self.files_for_kind(&kind),
                searched: self.dirs.clone(),
            }),
        }
    }

    /// Spec-wide edits of a loaded spec.
    pub fn spec_edits(&self, index: usize) -> Option<&RawEdits> {
        self.specs.get(index).and_then(|s| s.edits.as_ref())
    }
}

fn is_spec_file(path: &Path) -> bool {
    path.extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("json") || e.eq_ignore_ascii_case("yaml"))
}

fn load_file(path: &Path, priority: usize) -> Result<LoadedSpec, Broken> {
    let malformed = |message: String| Broken {
        path: path.to_path_buf(),
        message,
        malformed: true,
    };
    let data = fs::read(path).map_err(|e| Broken {
        path: path.to_path_buf(),
        message: e.to_string(),
        malformed: false,
    })?;
    let pathbuf = path.to_path_buf();
    let json = path
        .extension()
        .and_then(|e| e.to_str())
        .is_some_and(|e| e.eq_ignore_ascii_case("json"));
    let spec = super::cdi_spec::parse(&data, json).map_err(malformed)?;
    super::cdi_check::check(&spec).map_err(malformed)?;
    Ok(LoadedSpec {
        path: pathbuf,
        priority,
        kind: spec.kind,
        devices: spec.devices,
        edits: spec.container_edits,
    })
}

/// Turns a spec's or device's edits into an [`EditSet`], reading host nodes
/// for type/major/minor where the spec leaves them out (as CDI's
/// `fillMissingInfo`, but under `dev_root`). `device` names the request in
/// errors.
pub(crate) fn resolve_edits(
    raw: &RawEdits,
    dev_root: &Path,
    device: &str,
    spec_path: &Path,
    warnings: &mut Vec<String>,
) -> Result<EditSet, DeviceError> {
    let mut set = EditSet {
        env: raw.env.clone().unwrap_or_default(),
        additional_gids: raw.additional_gids.clone().unwrap_or_default(),
        ..Default::default()
    };
    for node in raw.device_nodes.iter().flatten() {
        set.nodes.push(resolve_node(node, dev_root, device)?);
    }
    for m in raw.mounts.iter().flatten() {
        let mut mount = Mount::default();
        mount
            .set_destination(PathBuf::from(&m.container_path))
            .set_source(Some(PathBuf::from(&m.host_path)))
            .set_typ(m.typ.clone())
            .set_options(m.options.clone());
        set.mounts.push(mount);
    }
    for h in raw.hooks.iter().flatten() {
        let stage = HookStage::parse(&h.hook_name).ok_or_else(|| DeviceError::MalformedSpec {
            path: spec_path.to_path_buf(),
            message: format!("unknown hookName {:?}", h.hook_name),
        })?;
        let mut hook = Hook::default();
        hook.set_path(PathBuf::from(&h.path))
            .set_args(h.args.clone())
            .set_env(h.env.clone())
            .set_timeout(h.timeout);
        set.hooks.push(HookEdit { stage, hook });
    }
    for (field, present) in [
        ("netDevices", raw.net_devices.is_some()),
        ("intelRdt", raw.intel_rdt.is_some()),
    ] {
        if present {
            warnings.push(format!(
                "CDI spec {}: {field} edits for {device} are not supported and were ignored",
                spec_path.display()
            ));
        }
    }
    Ok(set)
}

fn parse_type(t: &str) -> Option<LinuxDeviceType> {
    Some(match t {
        "c" => LinuxDeviceType::C,
        "u" => LinuxDeviceType::U,
        "b" => LinuxDeviceType::B,
        "p" => LinuxDeviceType::P,
        _ => return None,
    })
}

fn resolve_node(raw: &RawNode, dev_root: &Path, device: &str) -> Result<NodeEdit, DeviceError> {
    let host = host_path(Path::new(raw.host_path.as_deref().unwrap_or(&raw.path)), dev_root);
    let declared = match raw.typ.as_deref().filter(|t| !t.is_empty()) {
        None => None,
        Some(t) => Some(parse_type(t).ok_or_else(|| DeviceError::InvalidNode {
            node: PathBuf::from(&raw.path),
            device: device.to_string(),
            reason: format!("invalid type {t:?}"),
        })?),
    };
    let (typ, major, minor, mode) = match declared {
        // fully described (or a fifo): no host lookup, as in CDI
        Some(t) if raw.major.is_some() || t == LinuxDeviceType::P => {
            (t, raw.major.unwrap_or(0), raw.minor.unwrap_or(0), None)
        }
        _ => {
            let info = match stat_node(&host) {
                Ok(Some(info)) => info,
                Ok(None) => {
                    return Err(DeviceError::InvalidNode {
                        node: host,
                        device: device.to_string(),
                        reason: "not a device node".to_string(),
                    })
                }
                Err(e) => {
                    return Err(DeviceError::NodeMissing {
                        node: host,
                        device: device.to_string(),
                        reason: e.to_string(),
                    })
                }
            };
            let same = |a: LinuxDeviceType, b: LinuxDeviceType| {
                let norm = |t| {
                    if t == LinuxDeviceType::U {
                        LinuxDeviceType::C
                    } else {
                        t
                    }
                };
                norm(a) == norm(b)
            };
            if let Some(t) = declared.filter(|t| !same(*t, info.typ)) {
                return Err(DeviceError::InvalidNode {
                    node: host,
                    device: device.to_string(),
                    reason: format!("spec says type {:?}, host node is {:?}", t.as_str(), info.typ.as_str()),
                });
            }
            let (major, minor) = match raw.major {
                Some(major) => (major, raw.minor.unwrap_or(0)),
                None => (info.major, info.minor),
            };
            (declared.unwrap_or(info.typ), major, minor, Some(info.mode & 0o777))
        }
    };
    let access = match raw.permissions.as_deref() {
        None | Some("") => "rwm".to_string(),
        Some("none") => String::new(),
        Some(p) => p.to_string(),
    };
    Ok(NodeEdit {
        path: PathBuf::from(&raw.path),
        typ,
        major,
        minor,
        file_mode: raw.file_mode.or(mode),
        access,
        uid: raw.uid,
        gid: raw.gid,
    })
}

impl RawDevice {
    pub fn edits(&self) -> &RawEdits {
        &self.container_edits
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::devices::fixture::{fake_gpu_uuid, is_root, ldcache_hook_args, make_fake_nvidia, write_nvidia_cdi_spec};

    fn qn(s: &str) -> QualifiedName {
        QualifiedName::parse(s).unwrap()
    }

    /// A spec for one fake GPU whose hook and library no test runs.
    fn one_gpu_spec(dir: &Path) -> std::path::PathBuf {
        write_nvidia_cdi_spec(dir, Path::new("/dev"), 1, "/bin/true", vec![], Path::new("/lib/x")).unwrap()
    }

    const YAML_SPEC: &str = r#"
cdiVersion: "1.1.0"
kind: example.com/accel
devices:
  - name: "a0"
    containerEdits:
      deviceNodes:
        - path: /dev/accel0
          type: c
          major: 240
          minor: 7
          permissions: rw
      additionalGids: [44]
containerEdits:
  env: [ACCEL=1]
"#;

    #[test]
    fn loads_yaml_and_json_and_ignores_other_files() {
        let dir = tempfile::tempdir().unwrap();
        fs::write(dir.path().join("accel.yaml"), YAML_SPEC).unwrap();
        fs::write(dir.path().join("README.md"), "not a spec").unwrap();
        write_nvidia_cdi_spec(
            dir.path(),
            Path::new("/dev"),
            2,
            "/usr/bin/nvidia-cdi-hook",
            ldcache_hook_args(),
            Path::new("/lib/libcuda.so.1"),
        )
        .unwrap();
        let reg = Registry::load(&[dir.path().join("missing"), dir.path().to_path_buf()]);
        assert!(reg.broken.is_empty(), "{:?}", reg.broken);
        assert_eq!(reg.specs.len(), 2);
        assert!(reg.has_kind("nvidia.com/gpu") && reg.has_kind("example.com/accel"));
        let (i, dev) = reg.lookup(&qn("example.com/accel=a0")).unwrap();
        assert_eq!(reg.specs[i].priority, 1);
        let set = resolve_edits(
            dev.edits(),
            Path::new("/nonexistent"),
            "example.com/accel=a0",
            &reg.specs[i].path,
            &mut Vec::new(),
        )
        .unwrap();
        assert_eq!(set.additional_gids, [44]);
        assert_eq!(
            set.nodes[0],
            NodeEdit {
                path: "/dev/accel0".into(),
                typ: LinuxDeviceType::C,
                major: 240,
                minor: 7,
                file_mode: None,
                access: "rw".into(),
                uid: None,
                gid: None,
            },
            "fully described node needs no host lookup"
        );
        assert_eq!(
            reg.spec_edits(i).unwrap().env.as_deref(),
            Some(&["ACCEL=1".to_string()][..])
        );
        for name in ["0", "1", "all"] {
            reg.lookup(&qn(&format!("nvidia.com/gpu={name}"))).unwrap();
        }
        reg.lookup(&qn(&format!("nvidia.com/gpu={}", fake_gpu_uuid(1))))
            .unwrap();
    }

    #[test]
    fn unknown_device_names_device_files_and_dirs() {
        let dir = tempfile::tempdir().unwrap();
        let spec = one_gpu_spec(dir.path());
        let other = dir.path().join("nowhere");
        let reg = Registry::load(&[other.clone(), dir.path().to_path_buf()]);
        let err = reg.lookup(&qn("nvidia.com/gpu=5")).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, DeviceError::UnknownDevice { .. }));
        for needle in [
            "nvidia.com/gpu=5",
            &spec.display().to_string(),
            &other.display().to_string(),
            &dir.path().display().to_string(),
        ] {
            assert!(msg.contains(needle), "{needle} not in {msg}");
        }
        let msg = reg.lookup(&qn("example.com/x=1")).unwrap_err().to_string();
        assert!(msg.contains("example.com/x=1") && msg.contains("none"), "{msg}");
    }

    #[test]
    fn malformed_specs_matter_only_when_unresolved() {
        let dir = tempfile::tempdir().unwrap();
        let bad = dir.path().join("broken.json");
        fs::write(&bad, "{\"cdiVersion\": \"0.5.0\", \"kind\": ").unwrap();
        let bad_yaml = dir.path().join("broken.yaml");
        fs::write(
            &bad_yaml,
            "cdiVersion: 0.5.0\nkind: x.com/y\nbogusField: 1\ndevices: []\n",
        )
        .unwrap();
        let invalid = dir.path().join("invalid.yaml");
        fs::write(
            &invalid,
            "cdiVersion: \"0.5.0\"\nkind: x.com/y\ndevices:\n  - name: d\n    containerEdits: {}\n",
        )
        .unwrap();
        let version = dir.path().join("version.json");
        fs::write(&version, r#"{"cdiVersion": "x.y", "kind": "x.com/y", "devices": [{"name": "d", "containerEdits": {"env": ["A=1"]}}]}"#).unwrap();
        let reg = Registry::load(&[dir.path().to_path_buf()]);
        assert_eq!(reg.broken.len(), 4, "{:?}", reg.broken);
        assert!(reg.broken[3].message.contains("x.y"), "{:?}", reg.broken[3]);
        for b in &reg.broken {
            assert!(b.malformed && !b.message.is_empty(), "{b:?}");
        }
        let err = reg.lookup(&qn("nvidia.com/gpu=0")).unwrap_err();
        let msg = err.to_string();
        assert!(matches!(err, DeviceError::MalformedSpec { .. }), "{msg}");
        assert!(msg.contains(&bad.display().to_string()) && msg.contains("EOF"), "{msg}");
        assert!(reg.broken[1].message.contains("bogusField"), "{:?}", reg.broken[1]);
        assert!(
            reg.broken[2].message.contains("no containerEdits"),
            "{:?}",
            reg.broken[2]
        );

        one_gpu_spec(dir.path());
        let reg = Registry::load(&[dir.path().to_path_buf()]);
        reg.lookup(&qn("nvidia.com/gpu=0")).unwrap();
    }

    #[test]
    fn later_dir_wins_and_same_dir_conflicts() {
        let base = tempfile::tempdir().unwrap();
        let (etc, run) = (base.path().join("etc"), base.path().join("run"));
        write_nvidia_cdi_spec(&etc, Path::new("/dev"), 2, "/etc-hook", vec![], Path::new("/lib/x")).unwrap();
        let run_spec =
            write_nvidia_cdi_spec(&run, Path::new("/dev"), 1, "/run-hook", vec![], Path::new("/lib/x")).unwrap();
        let reg = Registry::load(&[etc.clone(), run.clone()]);
        let (i, _) = reg.lookup(&qn("nvidia.com/gpu=0")).unwrap();
        assert_eq!(reg.specs[i].path, run_spec);
        let (i, _) = reg.lookup(&qn("nvidia.com/gpu=1")).unwrap();
        assert_eq!(
            reg.specs[i].path,
            etc.join("nvidia.json"),
            "only the lower dir has GPU 1"
        );

        // a second file in the winning directory defining the same device
        let copy = run.join("nvidia-copy.json");
        fs::copy(&run_spec, &copy).unwrap();
        let reg = Registry::load(&[etc.clone(), run.clone()]);
        let msg = reg.lookup(&qn("nvidia.com/gpu=0")).unwrap_err().to_string();
        assert!(
            msg.contains(&copy.display().to_string()) && msg.contains(&run_spec.display().to_string()),
            "{msg}"
        );
        assert!(msg.contains("nvidia.com/gpu=0"), "{msg}");
        // GPU 1 lives only in etc: no conflict
        reg.lookup(&qn("nvidia.com/gpu=1")).unwrap();
    }

    #[test]
    fn unreadable_dir_is_reported_when_it_matters() {
        let dir = tempfile::tempdir().unwrap();
        let not_a_dir = dir.path().join("file");
        fs::write(&not_a_dir, "").unwrap();
        let reg = Registry::load(std::slice::from_ref(&not_a_dir));
        let err = reg.lookup(&qn("nvidia.com/gpu=0")).unwrap_err();
        assert!(matches!(err, DeviceError::UnreadableSpec { .. }));
        assert!(err.to_string().contains(&not_a_dir.display().to_string()));
    }

    #[test]
    fn node_resolution_against_host() {
        assert!(
            is_root(),
            "this test creates device nodes: run the suite as root (scripts/test.sh)"
        );
        let dir = tempfile::tempdir().unwrap();
        let dev = dir.path().join("dev");
        make_fake_nvidia(&dev, 1, 500).unwrap();
        let raw = |v: serde_json::Value| -> RawNode { serde_json::from_value(v).unwrap() };
        // path only: looked up under dev_root
        let n = resolve_node(&raw(serde_json::json!({"path": "/dev/nvidia-uvm"})), &dev, "d").unwrap();
        assert_eq!(
            (n.typ, n.major, n.minor, n.file_mode, n.access.as_str()),
            (LinuxDeviceType::C, 500, 0, Some(0o666), "rwm")
        );
        assert_eq!(n.path, PathBuf::from("/dev/nvidia-uvm"));
        // hostPath outside /dev used as is; container path kept
        let n = resolve_node(&raw(serde_json::json!({"path": "/dev/nvidia0", "hostPath": dev.join("nvidia0"), "permissions": "none", "fileMode": 0o600})), Path::new("/nonexistent"), "d").unwrap();
        assert_eq!(
            (n.major, n.minor, n.file_mode, n.access.as_str()),
            (195, 0, Some(0o600), "")
        );
        // declared type matches ('u' counts as char); declared major kept
        let n = resolve_node(
            &raw(serde_json::json!({"path": "/dev/nvidia0", "type": "u"})),
            &dev,
            "d",
        )
        .unwrap();
        assert_eq!((n.typ, n.major), (LinuxDeviceType::U, 195));
        // mismatch, missing, not a device, bad type
        fs::write(dev.join("plain"), "").unwrap();
        for (v, needle) in [
            (
                serde_json::json!({"path": "/dev/nvidia0", "type": "b"}),
                "host node is \"c\"",
            ),
            (serde_json::json!({"path": "/dev/nvidia9"}), "nvidia9"),
            (serde_json::json!({"path": "/dev/plain"}), "not a device node"),
            (serde_json::json!({"path": "/dev/nvidia0", "type": "x"}), "invalid type"),
        ] {
            let msg = resolve_node(&raw(v.clone()), &dev, "nvidia.com/gpu=9")
                .unwrap_err()
                .to_string();
            assert!(msg.contains(needle) && msg.contains("nvidia.com/gpu=9"), "{v}: {msg}");
        }
    }
}
