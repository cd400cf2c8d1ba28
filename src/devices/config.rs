//! The `[devices]` table of gantry's configuration.

use std::path::PathBuf;

use super::request::QualifiedName;
use super::DeviceError;

/// Device injection settings and policy (`[devices]` in the TOML config).
///
/// Defaults trust only what the device-plugin path can produce for an
/// unprivileged container: CDI names (the engine's CDI fields, `cdi.k8s.io/*`
/// annotations) and the NVIDIA device plugin's `volume-mounts` list. A pod's
/// own `NVIDIA_VISIBLE_DEVICES` is honoured for privileged containers only,
/// like the NVIDIA toolkit's
/// `accept-nvidia-visible-devices-envvar-when-unprivileged = false`; any pod
/// could otherwise take every GPU past the device plugin's accounting.
#[derive(Debug, Clone, serde::Deserialize, serde::Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct DeviceConfig {
    /// CDI spec directories, lowest priority first: a later directory wins
    /// when two directories define the same device.
    pub cdi_spec_dirs: Vec<PathBuf>,
    /// Where host device nodes are looked up: a CDI host path or a fallback
    /// node `/dev/X` is read from `<dev_root>/X` (tests point this at a
    /// temporary directory).
    pub dev_root: PathBuf,
    /// CDI kind that `NVIDIA_VISIBLE_DEVICES` entries are resolved against.
    pub nvidia_kind: String,
    /// Honour `NVIDIA_VISIBLE_DEVICES` in unprivileged containers (privileged
    /// containers are always honoured, as by the NVIDIA toolkit). Default
    /// false: the variable is the pod's own to set. Opt in where the device
    /// plugin's `envvar` strategy is used and every pod is trusted.
    pub nvidia_visible_devices: bool,
    /// Honour the NVIDIA device plugin's `volume-mounts` strategy: a bind
    /// mount of `/dev/null` at `/var/run/nvidia-container-devices/<id>` per
    /// allocated GPU (index, UUID or `all`), resolved like the env variable.
    pub nvidia_volume_mounts: bool,
    /// Fully qualified CDI names injected into every container. Exempt from
    /// the request policy below: the administrator asked for them.
    pub default_devices: Vec<String>,
    /// Honour `cdi.k8s.io/*` and `gantry.dev/devices` annotations. When false
    /// a container carrying such a request fails to be created.
    pub allow_annotations: bool,
    /// Allow requests for `<kind>=all` (by annotation or by
    /// `NVIDIA_VISIBLE_DEVICES=all`).
    pub allow_all: bool,
    /// Let privileged containers request `<kind>=all` even when `allow_all`
    /// is false (monitoring agents that need every GPU).
    pub privileged_all_devices: bool,
}

impl Default for DeviceConfig {
    fn default() -> Self {
        DeviceConfig {
            cdi_spec_dirs: vec![PathBuf::from("/etc/cdi"), PathBuf::from("/var/run/cdi")],
            dev_root: PathBuf::from("/dev"),
            nvidia_kind: "nvidia.com/gpu".to_string(),
            nvidia_visible_devices: false,
            nvidia_volume_mounts: true,
            default_devices: Vec::new(),
            allow_annotations: true,
            allow_all: true,
            privileged_all_devices: false,
        }
    }
}

impl DeviceConfig {
    /// Checks what can be checked without touching the host, so a bad
    /// config fails at load time rather than at the first GPU container.
    pub fn validate(&self) -> Result<(), DeviceError> {
        QualifiedName::parse_kind(&self.nvidia_kind).map_err(|reason| DeviceError::InvalidConfig {
            key: "devices.nvidia_kind",
            reason: format!("{:?}: {reason}", self.nvidia_kind),
        })?;
        for name in &self.default_devices {
            QualifiedName::parse(name).map_err(|reason| DeviceError::InvalidConfig {
                key: "devices.default_devices",
                reason: format!("{name:?}: {reason}"),
            })?;
        }
        if self.dev_root.as_os_str().is_empty() {
            return Err(DeviceError::InvalidConfig {
                key: "devices.dev_root",
                reason: "empty path".to_string(),
            });
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_and_toml_keys() {
        let empty: DeviceConfig = toml::from_str("").unwrap();
        assert_eq!(empty, DeviceConfig::default());
        assert_eq!(
            empty.cdi_spec_dirs,
            vec![PathBuf::from("/etc/cdi"), PathBuf::from("/var/run/cdi")]
        );
        assert_eq!(empty.dev_root, PathBuf::from("/dev"));
        assert_eq!(empty.nvidia_kind, "nvidia.com/gpu");
        assert!(!empty.nvidia_visible_devices && empty.nvidia_volume_mounts);
        assert!(empty.allow_annotations && empty.allow_all);
        assert!(!empty.privileged_all_devices);

        let cfg: DeviceConfig = toml::from_str(
            r#"
            cdi_spec_dirs = ["/a"]
            dev_root = "/tmp/dev"
            nvidia_kind = "example.com/gpu"
            nvidia_visible_devices = false
            default_devices = ["example.com/fuse=0"]
            allow_annotations = false
            allow_all = false
            privileged_all_devices = true
            "#,
        )
        .unwrap();
        assert_eq!(cfg.cdi_spec_dirs, vec![PathBuf::from("/a")]);
        assert_eq!(cfg.default_devices, vec!["example.com/fuse=0".to_string()]);
        assert!(!cfg.nvidia_visible_devices && !cfg.allow_annotations && !cfg.allow_all);
        assert!(cfg.privileged_all_devices);
        cfg.validate().unwrap();

        assert!(toml::from_str::<DeviceConfig>("bogus = 1").is_err());
    }

    #[test]
    fn validate_names_the_key() {
        for (cfg, key) in [
            (
                DeviceConfig {
                    nvidia_kind: "nvidia.com".into(),
                    ..Default::default()
                },
                "devices.nvidia_kind",
            ),
            (
                DeviceConfig {
                    default_devices: vec!["gpu0".into()],
                    ..Default::default()
                },
                "devices.default_devices",
            ),
            (
                DeviceConfig {
                    dev_root: PathBuf::new(),
                    ..Default::default()
                },
                "devices.dev_root",
            ),
        ] {
            let err = cfg.validate().unwrap_err().to_string();
            assert!(err.contains(key), "{err}");
        }
    }
}
