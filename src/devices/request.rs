//! Collecting device requests from the spec and the config (pure).
//!
//! Qualified-name parsing follows the CDI rules, in-tree like the rest of
//! gantry's CDI support (see `cdi_spec`).

use std::collections::HashMap;
use std::fmt;

use super::{DeviceConfig, DeviceError};

/// Annotation prefix of CDI requests made by device plugins / engines.
pub const CDI_ANNOTATION_PREFIX: &str = "cdi.k8s.io/";
/// gantry's own request annotation: comma-separated fully qualified names.
pub const DEVICES_ANNOTATION: &str = "gantry.dev/devices";
/// The NVIDIA toolkit's legacy selection variable.
pub const NVIDIA_VISIBLE_DEVICES: &str = "NVIDIA_VISIBLE_DEVICES";

/// A fully qualified CDI device name, `vendor/class=name`.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QualifiedName {
    pub vendor: String,
    pub class: String,
    pub name: String,
}

impl QualifiedName {
    /// Parses `vendor/class=name` with the CDI character rules.
    pub fn parse(s: &str) -> Result<Self, String> {
        let (kind, name) = s
            .split_once('=')
            .ok_or_else(|| "not a fully qualified CDI name (vendor/class=name)".to_string())?;
        Self::from_kind(kind, name)
    }

    /// Parses a CDI kind `vendor/class`.
    pub fn parse_kind(kind: &str) -> Result<(String, String), String> {
        let (vendor, class) = kind
            .split_once('/')
            .ok_or_else(|| format!("kind {kind:?} is not vendor/class"))?;
        validate_vendor_or_class(vendor).map_err(|e| format!("vendor {vendor:?}: {e}"))?;
        validate_vendor_or_class(class).map_err(|e| format!("class {class:?}: {e}"))?;
        Ok((vendor.to_string(), class.to_string()))
    }

    /// `vendor/class=name` from a kind and a device name, checking both.
    pub fn from_kind(kind: &str, name: &str) -> Result<Self, String> {
        let (vendor, class) = Self::parse_kind(kind)?;
        validate_device_name(name)?;
        Ok(QualifiedName {
            vendor,
            class,
            name: name.to_string(),
        })
    }

    /// The `vendor/class` part.
    pub fn kind(&self) -> String {
        format!("{}/{}", self.vendor, self.class)
    }

    /// Whether this asks for every device of its kind.
    pub fn is_all(&self) -> bool {
        self.name == "all"
    }
}

impl fmt::Display for QualifiedName {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}={}", self.vendor, self.class, self.name)
    }
}

fn validate_vendor_or_class(s: &str) -> Result<(), String> {
    validate_chars(s, |c| c.is_ascii_alphabetic(), |c| matches!(c, '-' | '_' | '.'))
}

fn validate_device_name(s: &str) -> Result<(), String> {
    validate_chars(s, |c| c.is_ascii_alphanumeric(), |c| matches!(c, '-' | '_' | '.' | ':'))
        .map_err(|e| format!("device name {s:?}: {e}"))
}

fn validate_chars(s: &str, first_ok: impl Fn(char) -> bool, inner_extra: impl Fn(char) -> bool) -> Result<(), String> {
    let mut chars = s.chars();
    match chars.next() {
        None => return Err("empty".to_string()),
        Some(c) if !first_ok(c) => return Err(format!("must not start with {c:?}")),
        Some(_) => {}
    }
    if let Some(c) = s.chars().last() {
        if !c.is_ascii_alphanumeric() {
            return Err(format!("must not end with {c:?}"));
        }
    }
    if let Some(c) = s.chars().find(|&c| !c.is_ascii_alphanumeric() && !inner_extra(c)) {
        return Err(format!("invalid character {c:?}"));
    }
    Ok(())
}

/// Who asked for a device; policy and error messages depend on it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// `devices.default_devices` in gantry's config.
    Config,
    /// An annotation, with its key.
    Annotation(String),
    /// The container's `NVIDIA_VISIBLE_DEVICES`.
    Env,
    /// A `volume-mounts` bind mount, with its destination.
    VolumeMount(String),
}

impl fmt::Display for Origin {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Origin::Config => write!(f, "config devices.default_devices"),
            Origin::Annotation(key) => write!(f, "annotation {key}"),
            Origin::Env => write!(f, "env {NVIDIA_VISIBLE_DEVICES}"),
            Origin::VolumeMount(dest) => write!(f, "volume mount {dest}"),
        }
    }
}

/// One requested device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Request {
    pub name: QualifiedName,
    pub origin: Origin,
}

/// `NVIDIA_VISIBLE_DEVICES` as the NVIDIA toolkit reads it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum VisibleDevices {
    /// Unset or empty: nothing.
    Unset,
    /// `none`: no GPU.
    None,
    /// `void`: the marker CDI specs set; GPUs already came through CDI.
    Void,
    /// `all`.
    All,
    /// Indexes, UUIDs, MIG names, in order, without duplicates.
    List(Vec<String>),
}

impl VisibleDevices {
    /// Parses a value (`None` = unset).
    pub fn parse(value: Option<&str>) -> Self {
        let Some(value) = value.map(str::trim) else {
            return VisibleDevices::Unset;
        };
        match value {
            "" => VisibleDevices::Unset,
            "none" => VisibleDevices::None,
            "void" => VisibleDevices::Void,
            "all" => VisibleDevices::All,
            list => {
                let mut items: Vec<String> = Vec::new();
                for item in list.split(',').map(str::trim).filter(|i| !i.is_empty()) {
                    if item == "all" {
                        return VisibleDevices::All;
                    }
                    if !items.iter().any(|i| i == item) {
                        items.push(item.to_string());
                    }
                }
                if items.is_empty() {
                    VisibleDevices::Unset
                } else {
                    VisibleDevices::List(items)
                }
            }
        }
    }

    /// Reads the variable from an OCI process env. `void` in any entry wins
    /// (the CDI marker must never be overridden by an image default);
    /// otherwise the last entry counts, as engines replace by key.
    pub fn from_env(env: &[String]) -> Self {
        let mut last = None;
        for entry in env {
            if let Some(value) = env_value(entry, NVIDIA_VISIBLE_DEVICES) {
                if value.trim() == "void" {
                    return VisibleDevices::Void;
                }
                last = Some(value);
            }
        }
        Self::parse(last)
    }

    /// The device names to request under `kind` (`all` for `All`).
    pub fn device_names(&self) -> Vec<String> {
        match self {
            VisibleDevices::Unset | VisibleDevices::None | VisibleDevices::Void => Vec::new(),
            VisibleDevices::All => vec!["all".to_string()],
            VisibleDevices::List(items) => items.clone(),
        }
    }
}

/// The value of `key` in a `KEY=value` entry.
pub(crate) fn env_value<'a>(entry: &'a str, key: &str) -> Option<&'a str> {
    entry.split_once('=').and_then(|(k, v)| (k == key).then_some(v))
}

/// Requests from `default_devices` and annotations, in that order (annotation
/// keys sorted so the result does not depend on map order), policy applied.
pub fn explicit_requests(
    annotations: Option<&HashMap<String, String>>,
    cfg: &DeviceConfig,
    privileged: bool,
) -> Result<Vec<Request>, DeviceError> {
    let mut out = Vec::new();
    for name in &cfg.default_devices {
        admit(
            &mut out,
            name,
            Origin::Config,
            QualifiedName::parse(name),
            (cfg, privileged),
        )?;
    }
    if let Some(annotations) = annotations {
        let mut keys: Vec<&String> = annotations
            .keys()
            .filter(|k| k.starts_with(CDI_ANNOTATION_PREFIX) || k.as_str() == DEVICES_ANNOTATION)
            .collect();
        keys.sort();
        for key in keys {
            let value = annotations.get(key).map(String::as_str).unwrap_or_default();
            for item in value.split(',').map(str::trim).filter(|i| !i.is_empty()) {
                let origin = Origin::Annotation(key.clone());
                admit(&mut out, item, origin, QualifiedName::parse(item), (cfg, privileged))?;
            }
        }
    }
    Ok(out)
}

/// Requests from `NVIDIA_VISIBLE_DEVICES`, resolved under `kind`, policy
/// applied. Empty when the variable is not honoured for this container.
pub fn env_requests(
    visible: &VisibleDevices,
    cfg: &DeviceConfig,
    privileged: bool,
) -> Result<Vec<Request>, DeviceError> {
    if !(privileged || cfg.nvidia_visible_devices) {
        return Ok(Vec::new());
    }
    let mut out = Vec::new();
    for item in visible.device_names() {
        let name = QualifiedName::from_kind(&cfg.nvidia_kind, &item);
        admit(&mut out, &item, Origin::Env, name, (cfg, privileged))?;
    }
    Ok(out)
}

/// Where the NVIDIA device plugin's `volume-mounts` strategy mounts `/dev/null`, one entry
/// per allocated GPU (`/var/run` is a link to `/run` in most images; both are read).
pub const VOLUME_MOUNT_DIRS: [&str; 2] = ["/var/run/nvidia-container-devices", "/run/nvidia-container-devices"];

/// Requests from `volume-mounts` entries among `mounts` (destination, source), resolved under
/// the NVIDIA kind, policy applied. Only binds of `/dev/null` count: that is what the plugin
/// mounts, and anything else at those paths is the pod's own.
pub fn mount_requests(
    mounts: &[(std::path::PathBuf, Option<std::path::PathBuf>)],
    cfg: &DeviceConfig,
    privileged: bool,
) -> Result<Vec<Request>, DeviceError> {
    let mut out = Vec::new();
    if !cfg.nvidia_volume_mounts {
        return Ok(out);
    }
    for (dest, source) in mounts {
        let listed = VOLUME_MOUNT_DIRS
            .iter()
            .any(|d| dest.parent() == Some(std::path::Path::new(d)));
        if !listed || source.as_deref() != Some(std::path::Path::new("/dev/null")) {
            continue;
        }
        let Some(item) = dest.file_name().and_then(|n| n.to_str()) else {
            continue;
        };
        let origin = Origin::VolumeMount(dest.display().to_string());
        let name = QualifiedName::from_kind(&cfg.nvidia_kind, item);
        admit(&mut out, item, origin, name, (cfg, privileged))?;
    }
    Ok(out)
}

/// Denies what the policy forbids; the administrator's own
/// `default_devices` are exempt.
pub fn check_policy(req: &Request, cfg: &DeviceConfig, privileged: bool) -> Result<(), DeviceError> {
    if req.origin == Origin::Config {
        return Ok(());
    }
    if matches!(req.origin, Origin::Annotation(_)) && !cfg.allow_annotations {
        return Err(DeviceError::PolicyDenied {
            device: req.name.to_string(),
            origin: req.origin.to_string(),
            policy: "devices.allow_annotations = false",
        });
    }
    if req.name.is_all() && !cfg.allow_all && !(privileged && cfg.privileged_all_devices) {
        return Err(DeviceError::PolicyDenied {
            device: req.name.to_string(),
            origin: req.origin.to_string(),
            policy: if privileged {
                "devices.allow_all = false and devices.privileged_all_devices = false"
            } else {
                "devices.allow_all = false (unprivileged container)"
            },
        });
    }
    Ok(())
}

/// Adds the request `item` from `origin` once its name parsed (`name`) and the policy
/// allows it; a name that did not parse is an error naming the item and where it came from.
fn admit(
    out: &mut Vec<Request>,
    item: &str,
    origin: Origin,
    name: Result<QualifiedName, String>,
    (cfg, privileged): (&DeviceConfig, bool),
) -> Result<(), DeviceError> {
    let name = name.map_err(|reason| DeviceError::InvalidRequest {
        request: item.to_string(),
        origin: origin.to_string(),
        reason,
    })?;
    let req = Request { name, origin };
    check_policy(&req, cfg, privileged)?;
    push_unique(out, req);
    Ok(())
}

/// Appends unless the same device was already requested (first origin wins).
pub(crate) fn push_unique(list: &mut Vec<Request>, req: Request) {
    if !list.iter().any(|r| r.name == req.name) {
        list.push(req);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn qn(s: &str) -> QualifiedName {
        QualifiedName::parse(s).unwrap()
    }

    #[test]
    fn qualified_names() {
        for (input, ok) in [
            ("nvidia.com/gpu=0", true),
            ("nvidia.com/gpu=all", true),
            ("nvidia.com/gpu=GPU-6ba7b810-9dad-11d1-80b4-00c04fd430c8", true),
            ("nvidia.com/gpu=MIG-0:1", true),
            ("vendor_x.io/class-a=dev.1", true),
            ("nvidia.com/gpu", false),
            ("nvidia.com=0", false),
            ("/dev/nvidia0", false),
            ("nvidia.com/gpu=", false),
            ("nvidia.com/gpu=0=1", false),
            ("nvidia.com/gpu/x=0", false),
            ("1vendor/gpu=0", false),
            ("vendor./gpu=0", false),
            ("vendor/gpu=_0", false),
            ("vendor/gpu=a b", false),
            ("", false),
        ] {
            assert_eq!(QualifiedName::parse(input).is_ok(), ok, "{input:?}");
        }
        let q = qn("nvidia.com/gpu=0");
        assert_eq!(
            (q.vendor.as_str(), q.class.as_str(), q.name.as_str()),
            ("nvidia.com", "gpu", "0")
        );
        assert_eq!(q.kind(), "nvidia.com/gpu");
        assert_eq!(q.to_string(), "nvidia.com/gpu=0");
        assert!(qn("nvidia.com/gpu=all").is_all());
    }

    #[test]
    fn visible_devices_forms() {
        use VisibleDevices as V;
        let list = |v: &[&str]| V::List(v.iter().map(|s| s.to_string()).collect());
        for (value, want) in [
            (Option::None, V::Unset),
            (Some(""), V::Unset),
            (Some("  "), V::Unset),
            (Some(","), V::Unset),
            (Some("none"), V::None),
            (Some("void"), V::Void),
            (Some("all"), V::All),
            (Some(" all "), V::All),
            (Some("0"), list(&["0"])),
            (Some("0,1"), list(&["0", "1"])),
            (Some("1, 0 ,1,"), list(&["1", "0"])),
            (Some("0,all"), V::All),
            (
                Some("GPU-6ba7b810-9dad-11d1-80b4-00c04fd430c8,1"),
                list(&["GPU-6ba7b810-9dad-11d1-80b4-00c04fd430c8", "1"]),
            ),
            (Some("MIG-0:1"), list(&["MIG-0:1"])),
        ] {
            assert_eq!(VisibleDevices::parse(value), want, "{value:?}");
        }
    }

    #[test]
    fn visible_devices_from_env() {
        let env = |v: &[&str]| v.iter().map(|s| s.to_string()).collect::<Vec<_>>();
        assert_eq!(VisibleDevices::from_env(&env(&["PATH=/bin"])), VisibleDevices::Unset);
        assert_eq!(
            VisibleDevices::from_env(&env(&["NVIDIA_VISIBLE_DEVICES=0", "NVIDIA_VISIBLE_DEVICES=1"])),
            VisibleDevices::List(vec!["1".into()])
        );
        assert_eq!(
            VisibleDevices::from_env(&env(&["NVIDIA_VISIBLE_DEVICES=void", "NVIDIA_VISIBLE_DEVICES=all"])),
            VisibleDevices::Void
        );
        assert_eq!(
            VisibleDevices::from_env(&env(&["NVIDIA_VISIBLE_DEVICESX=0", "XNVIDIA_VISIBLE_DEVICES=0"])),
            VisibleDevices::Unset
        );
    }

    fn annotations(pairs: &[(&str, &str)]) -> HashMap<String, String> {
        pairs.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect()
    }

    fn names(reqs: &[Request]) -> Vec<String> {
        reqs.iter().map(|r| r.name.to_string()).collect()
    }

    #[test]
    fn explicit_request_forms() {
        let cfg = DeviceConfig {
            default_devices: vec!["example.com/fuse=0".into()],
            ..Default::default()
        };
        let a = annotations(&[
            ("gantry.dev/devices", "nvidia.com/gpu=1, example.com/fuse=0"),
            (
                "cdi.k8s.io/nvidia-device-plugin_abc",
                "nvidia.com/gpu=0,nvidia.com/gpu=GPU-1234",
            ),
            ("cdi.k8s.io/other", ""),
            ("io.kubernetes.cri-o.Devices", "nvidia.com/gpu=7"),
        ]);
        let reqs = explicit_requests(Some(&a), &cfg, false).unwrap();
        assert_eq!(
            names(&reqs),
            [
                "example.com/fuse=0",
                "nvidia.com/gpu=0",
                "nvidia.com/gpu=GPU-1234",
                "nvidia.com/gpu=1"
            ]
        );
        assert_eq!(reqs[0].origin, Origin::Config);
        assert_eq!(
            reqs[1].origin,
            Origin::Annotation("cdi.k8s.io/nvidia-device-plugin_abc".into())
        );
        assert!(explicit_requests(None, &DeviceConfig::default(), false)
            .unwrap()
            .is_empty());
    }

    #[test]
    fn invalid_requests_name_origin_and_value() {
        let a = annotations(&[("cdi.k8s.io/x", "nvidia.com/gpu=0,gpu0")]);
        let err = explicit_requests(Some(&a), &DeviceConfig::default(), false)
            .unwrap_err()
            .to_string();
        assert!(err.contains("gpu0") && err.contains("cdi.k8s.io/x"), "{err}");

        let visible = VisibleDevices::parse(Some("0,bad/name"));
        let err = env_requests(&visible, &env_cfg(), false).unwrap_err().to_string();
        assert!(
            err.contains("bad/name") && err.contains(NVIDIA_VISIBLE_DEVICES),
            "{err}"
        );
    }

    /// The env opt-in: these tests are about resolving the variable, not about trusting it.
    fn env_cfg() -> DeviceConfig {
        DeviceConfig {
            nvidia_visible_devices: true,
            ..Default::default()
        }
    }

    #[test]
    fn env_is_trusted_by_default_only_for_privileged_containers() {
        let all = VisibleDevices::parse(Some("all"));
        assert!(env_requests(&all, &DeviceConfig::default(), false).unwrap().is_empty());
        assert_eq!(
            names(&env_requests(&all, &DeviceConfig::default(), true).unwrap()),
            ["nvidia.com/gpu=all"]
        );
        assert_eq!(
            names(&env_requests(&all, &env_cfg(), false).unwrap()),
            ["nvidia.com/gpu=all"]
        );
    }

    #[test]
    fn volume_mounts_list_the_allocated_gpus() {
        let m = |dest: &str, src: &str| (std::path::PathBuf::from(dest), Some(std::path::PathBuf::from(src)));
        let mounts = vec![
            m("/var/run/nvidia-container-devices/1", "/dev/null"),
            m(
                "/run/nvidia-container-devices/GPU-6ba7b810-9dad-11d1-80b4-00c04fd430c8",
                "/dev/null",
            ),
            m("/var/run/nvidia-container-devices/1", "/dev/null"),
            // Not the plugin's: another source, another directory.
            m("/var/run/nvidia-container-devices/0", "/etc/hosts"),
            m("/var/run/other/0", "/dev/null"),
            m("/proc", "proc"),
        ];
        let reqs = mount_requests(&mounts, &DeviceConfig::default(), false).unwrap();
        assert_eq!(
            names(&reqs),
            [
                "nvidia.com/gpu=1",
                "nvidia.com/gpu=GPU-6ba7b810-9dad-11d1-80b4-00c04fd430c8"
            ]
        );
        assert_eq!(
            reqs[0].origin,
            Origin::VolumeMount("/var/run/nvidia-container-devices/1".into())
        );
        let off = DeviceConfig {
            nvidia_volume_mounts: false,
            ..Default::default()
        };
        assert!(mount_requests(&mounts, &off, false).unwrap().is_empty());
        let no_all = DeviceConfig {
            allow_all: false,
            ..Default::default()
        };
        let all = vec![m("/var/run/nvidia-container-devices/all", "/dev/null")];
        let e = mount_requests(&all, &no_all, false).unwrap_err().to_string();
        assert!(e.contains("volume mount") && e.contains("devices.allow_all"), "{e}");
    }

    #[test]
    fn env_requests_resolve_through_kind() {
        let cfg = env_cfg();
        for (value, want) in [
            ("all", vec!["nvidia.com/gpu=all"]),
            ("none", vec![]),
            ("void", vec![]),
            ("", vec![]),
            ("0,1", vec!["nvidia.com/gpu=0", "nvidia.com/gpu=1"]),
            (
                "GPU-6ba7b810-9dad-11d1-80b4-00c04fd430c8",
                vec!["nvidia.com/gpu=GPU-6ba7b810-9dad-11d1-80b4-00c04fd430c8"],
            ),
        ] {
            let reqs = env_requests(&VisibleDevices::parse(Some(value)), &cfg, false).unwrap();
            assert_eq!(names(&reqs), want, "{value:?}");
            assert!(reqs.iter().all(|r| r.origin == Origin::Env));
        }
        let cfg = DeviceConfig {
            nvidia_kind: "example.com/accel".into(),
            ..env_cfg()
        };
        let reqs = env_requests(&VisibleDevices::parse(Some("2")), &cfg, false).unwrap();
        assert_eq!(names(&reqs), ["example.com/accel=2"]);
    }

    #[test]
    fn env_honoured_for_unprivileged_only_when_configured() {
        let cfg = DeviceConfig {
            nvidia_visible_devices: false,
            ..Default::default()
        };
        let v = VisibleDevices::parse(Some("0"));
        assert!(env_requests(&v, &cfg, false).unwrap().is_empty());
        assert_eq!(names(&env_requests(&v, &cfg, true).unwrap()), ["nvidia.com/gpu=0"]);
    }

    #[test]
    fn policy_table() {
        struct Case {
            cfg: DeviceConfig,
            privileged: bool,
            origin: Origin,
            device: &'static str,
            denied_by: Option<&'static str>,
        }
        let ann = || Origin::Annotation("cdi.k8s.io/x".into());
        let no_ann = DeviceConfig {
            allow_annotations: false,
            ..Default::default()
        };
        let no_all = DeviceConfig {
            allow_all: false,
            ..Default::default()
        };
        let no_all_priv_ok = DeviceConfig {
            allow_all: false,
            privileged_all_devices: true,
            ..Default::default()
        };
        let cases = [
            Case {
                cfg: DeviceConfig::default(),
                privileged: false,
                origin: ann(),
                device: "nvidia.com/gpu=all",
                denied_by: None,
            },
            Case {
                cfg: no_ann.clone(),
                privileged: false,
                origin: ann(),
                device: "nvidia.com/gpu=0",
                denied_by: Some("devices.allow_annotations"),
            },
            Case {
                cfg: no_ann.clone(),
                privileged: true,
                origin: ann(),
                device: "nvidia.com/gpu=0",
                denied_by: Some("devices.allow_annotations"),
            },
            Case {
                cfg: no_ann.clone(),
                privileged: false,
                origin: Origin::Env,
                device: "nvidia.com/gpu=0",
                denied_by: None,
            },
            Case {
                cfg: no_all.clone(),
                privileged: false,
                origin: ann(),
                device: "nvidia.com/gpu=all",
                denied_by: Some("devices.allow_all"),
            },
            Case {
                cfg: no_all.clone(),
                privileged: false,
                origin: Origin::Env,
                device: "nvidia.com/gpu=all",
                denied_by: Some("devices.allow_all"),
            },
            Case {
                cfg: no_all.clone(),
                privileged: true,
                origin: Origin::Env,
                device: "nvidia.com/gpu=all",
                denied_by: Some("devices.privileged_all_devices"),
            },
            Case {
                cfg: no_all.clone(),
                privileged: false,
                origin: ann(),
                device: "nvidia.com/gpu=0",
                denied_by: None,
            },
            Case {
                cfg: no_all.clone(),
                privileged: false,
                origin: Origin::Config,
                device: "nvidia.com/gpu=all",
                denied_by: None,
            },
            Case {
                cfg: no_all_priv_ok.clone(),
                privileged: true,
                origin: ann(),
                device: "nvidia.com/gpu=all",
                denied_by: None,
            },
            Case {
                cfg: no_all_priv_ok,
                privileged: false,
                origin: ann(),
                device: "nvidia.com/gpu=all",
                denied_by: Some("devices.allow_all"),
            },
        ];
        for (i, c) in cases.iter().enumerate() {
            let req = Request {
                name: qn(c.device),
                origin: c.origin.clone(),
            };
            match (check_policy(&req, &c.cfg, c.privileged), c.denied_by) {
                (Ok(()), None) => {}
                (Err(e), Some(policy)) => {
                    let msg = e.to_string();
                    assert!(msg.contains(policy) && msg.contains(c.device), "case {i}: {msg}");
                    assert!(matches!(e, DeviceError::PolicyDenied { .. }), "case {i}");
                }
                (got, want) => panic!("case {i}: got {got:?}, want denial by {want:?}"),
            }
        }
    }
}
