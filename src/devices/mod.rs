//! GPU device injection (CDI and NVIDIA_VISIBLE_DEVICES) as edits over the OCI spec.
//!
//! Engines (CRI-O, containerd) usually inject CDI devices before the shim
//! reads `config.json`; gantry injects again so that `ctr`/nerdctl users,
//! gantry's own annotation and `NVIDIA_VISIBLE_DEVICES` work too, and every
//! edit is idempotent so a pre-injected spec comes out unchanged. Nothing
//! here logs: [`inject`] returns an [`Injection`] report for the caller.
//!
//! Flow: collect requests (config, annotations) → apply policy → load CDI
//! specs (only if something was asked for) → resolve → read
//! `NVIDIA_VISIBLE_DEVICES` as it will be after those edits (a CDI spec's
//! `void` marker silences it) → resolve it through CDI or, without a spec
//! for the NVIDIA kind, through `/dev/nvidia*` discovery → apply all edits
//! at once (nothing is changed if anything fails) → record the result in
//! the `gantry.dev/injected-devices` annotation.

mod cdi;
mod cdi_check;
mod cdi_spec;
mod config;
pub mod discover;
pub mod edits;
pub mod exec_env;
#[cfg(test)]
pub mod fixture;
pub mod request;

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use oci_spec::runtime::{LinuxDeviceType, Spec};

pub use config::DeviceConfig;
pub use edits::EditStats;
pub use request::{
    Origin, QualifiedName, VisibleDevices, CDI_ANNOTATION_PREFIX, DEVICES_ANNOTATION, NVIDIA_VISIBLE_DEVICES,
};

use edits::{EditSet, NodeEdit};
use request::Request;

/// Annotation recording what gantry injected (comma-separated; CDI names,
/// or `dev:<container path>` for nodes found by fallback discovery).
pub const INJECTED_ANNOTATION: &str = "gantry.dev/injected-devices";

/// Why injection failed. Each message names the device and the paths
/// involved so that it can be acted on from the engine's error alone.
#[derive(Debug, thiserror::Error)]
pub enum DeviceError {
    #[error("invalid config {key}: {reason}")]
    InvalidConfig { key: &'static str, reason: String },

    #[error("invalid device request {request:?} from {origin}: {reason}")]
    InvalidRequest {
        request: String,
        origin: String,
        reason: String,
    },

    #[error("device {device} requested by {origin} is denied by policy: {policy}")]
    PolicyDenied {
        device: String,
        origin: String,
        policy: &'static str,
    },

    #[error(
        "unknown device {device}: {detail}; CDI spec files for kind {kind}: {}; directories searched: {}",
        list(.spec_files),
        list(.searched)
    )]
    UnknownDevice {
        device: String,
        kind: String,
        detail: String,
        spec_files: Vec<PathBuf>,
        searched: Vec<PathBuf>,
    },

    #[error("malformed CDI spec {}: {message}", .path.display())]
    MalformedSpec { path: PathBuf, message: String },

    #[error("cannot read CDI spec location {}: {message}", .path.display())]
    UnreadableSpec { path: PathBuf, message: String },

    #[error(
        "conflicting CDI specs for device {device}: {} and {} (same directory)",
        .first.display(),
        .second.display()
    )]
    ConflictingSpecs {
        device: String,
        first: PathBuf,
        second: PathBuf,
    },

    #[error("device node {} for {device} is missing on the host: {reason}", .node.display())]
    NodeMissing {
        node: PathBuf,
        device: String,
        reason: String,
    },

    #[error("device node {} for {device} is unusable: {reason}", .node.display())]
    InvalidNode {
        node: PathBuf,
        device: String,
        reason: String,
    },
}

fn list(paths: &[PathBuf]) -> String {
    if paths.is_empty() {
        "none".to_string()
    } else {
        paths
            .iter()
            .map(|p| p.display().to_string())
            .collect::<Vec<_>>()
            .join(", ")
    }
}

/// How a requested device was satisfied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Resolution {
    /// From a CDI spec file.
    Cdi { spec_file: PathBuf },
    /// From `/dev/nvidia*` discovery: these container paths.
    Fallback { nodes: Vec<PathBuf> },
}

/// One satisfied request.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InjectedDevice {
    /// The requested fully qualified name.
    pub device: String,
    pub origin: Origin,
    pub resolution: Resolution,
}

/// What [`inject`] did, for the caller to log. Empty when nothing was
/// requested.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Injection {
    /// Devices this call injected (edits already present count as
    /// injected), as recorded in [`INJECTED_ANNOTATION`]: CDI names, or
    /// `dev:/dev/nvidiaN`-style entries for fallback nodes.
    pub devices: Vec<String>,
    /// Per request: who asked and what satisfied it.
    pub sources: Vec<InjectedDevice>,
    /// CDI spec files whose edits were applied.
    pub spec_files: Vec<PathBuf>,
    /// Edits applied versus found already present (engine pre-injection).
    pub stats: EditStats,
    /// Worth a log line: spec files that could not be used but were not
    /// needed, ignored edits, an ignored `NVIDIA_VISIBLE_DEVICES`.
    pub warnings: Vec<String>,
}

impl Injection {
    /// Whether nothing was injected.
    pub fn is_empty(&self) -> bool {
        self.devices.is_empty()
    }
}

/// Heuristic for callers that have no privileged flag: the bounding set
/// holds CAP_SYS_ADMIN, CAP_SYS_MODULE and CAP_SYS_RAWIO, which engines
/// grant together only to privileged containers. Takes the names as the spec
/// spells them (any case, `CAP_` prefix or not), so it also works for a spec
/// oci-spec cannot represent.
pub fn is_privileged<S: AsRef<str>>(bounding: &[S]) -> bool {
    let has = |want: &str| {
        bounding.iter().any(|c| {
            let c = c.as_ref();
            // Bytes: a name with multi-byte characters must not be sliced inside one.
            let bare = if c.as_bytes().get(..4).is_some_and(|p| p.eq_ignore_ascii_case(b"CAP_")) {
                &c[4..]
            } else {
                c
            };
            bare.eq_ignore_ascii_case(want)
        })
    };
    ["SYS_ADMIN", "SYS_MODULE", "SYS_RAWIO"].iter().all(|c| has(c))
}

/// What a container asks of device injection, known before any CDI spec is
/// read: explicit requests (config defaults, annotations) and whether
/// `NVIDIA_VISIBLE_DEVICES` selects devices that are honoured for it.
pub struct Asked {
    explicit: Vec<Request>,
    env_selects: bool,
    /// Set when `NVIDIA_VISIBLE_DEVICES` selects devices but is not honoured.
    pub warning: Option<String>,
}

impl Asked {
    pub fn anything(&self) -> bool {
        !self.explicit.is_empty() || self.env_selects
    }
}

/// Reads the requests out of a container's annotations and env (see [`inject`]).
pub fn asked(
    annotations: Option<&HashMap<String, String>>,
    env: &[String],
    cfg: &DeviceConfig,
    privileged: bool,
) -> Result<Asked, DeviceError> {
    let explicit = request::explicit_requests(annotations, cfg, privileged)?;
    let env_selects = !VisibleDevices::from_env(env).device_names().is_empty();
    let env_honoured = privileged || cfg.nvidia_visible_devices;
    let warning = (env_selects && !env_honoured).then(|| {
        format!(
            "{NVIDIA_VISIBLE_DEVICES} ignored for an unprivileged container: devices.nvidia_visible_devices = false"
        )
    });
    Ok(Asked {
        explicit,
        env_selects: env_selects && env_honoured,
        warning,
    })
}

/// Injects the devices requested for this container into `spec`.
///
/// Requests: `cfg.default_devices`, `cdi.k8s.io/*` and `gantry.dev/devices`
/// annotations, and `NVIDIA_VISIBLE_DEVICES` in the process env (for
/// unprivileged containers only if `cfg.nvidia_visible_devices`). Without
/// any, returns an empty [`Injection`] without touching the spec or the
/// filesystem. On error the spec is left unchanged.
pub fn inject(spec: &mut Spec, cfg: &DeviceConfig, privileged: bool) -> Result<Injection, DeviceError> {
    let mut report = Injection::default();
    let env: Vec<String> = spec
        .process()
        .as_ref()
        .and_then(|p| p.env().clone())
        .unwrap_or_default();
    let mut asked = asked(spec.annotations().as_ref(), &env, cfg, privileged)?;
    report.warnings.extend(asked.warning.take());
    let mounts: Vec<(PathBuf, Option<PathBuf>)> = spec
        .mounts()
        .iter()
        .flatten()
        .map(|m| (m.destination().clone(), m.source().clone()))
        .collect();
    let mount_reqs = request::mount_requests(&mounts, cfg, privileged)?;
    if !asked.anything() && mount_reqs.is_empty() {
        return Ok(report);
    }
    let explicit = asked.explicit;

    let registry = cdi::Registry::load(&cfg.cdi_spec_dirs);
    let mut plan = Plan::default();
    for req in &explicit {
        plan.add_cdi(&registry, req, &cfg.dev_root)?;
    }

    // The env as it will be once the CDI edits are in: a spec's
    // NVIDIA_VISIBLE_DEVICES=void means the GPUs already came through CDI.
    let mut env_after = env;
    for set in &plan.sets {
        for entry in &set.env {
            edits::set_env(&mut env_after, entry);
        }
    }
    let mut env_reqs = mount_reqs;
    for req in request::env_requests(&VisibleDevices::from_env(&env_after), cfg, privileged)? {
        request::push_unique(&mut env_reqs, req);
    }
    if !env_reqs.is_empty() {
        if registry.has_kind(&cfg.nvidia_kind) || !registry.broken.is_empty() {
            for req in &env_reqs {
                plan.add_cdi(&registry, req, &cfg.dev_root)?;
            }
        } else {
            plan.add_fallback(&registry, &env_reqs, cfg)?;
        }
    }

    report.warnings.append(&mut plan.warnings);
    for broken in &registry.broken {
        report.warnings.push(format!("ignored: {}", broken.to_error()));
    }
    for set in &plan.sets {
        edits::apply(spec, set, &mut report.stats, &mut report.warnings);
    }
    record(spec, &plan.devices);
    // An engine that injected the same edits itself gives its execs the env already.
    if report.stats.env_set > 0 {
        exec_env::record(spec, &plan.sets);
    }
    report.devices = plan.devices;
    report.sources = plan.sources;
    report.spec_files = plan.spec_files;
    Ok(report)
}

/// Edits resolved so far; applied only once everything resolved.
#[derive(Default)]
struct Plan {
    sets: Vec<EditSet>,
    /// Specs whose spec-wide edits are already in `sets`.
    used_specs: Vec<usize>,
    spec_files: Vec<PathBuf>,
    devices: Vec<String>,
    sources: Vec<InjectedDevice>,
    warnings: Vec<String>,
}

impl Plan {
    fn add_cdi(&mut self, registry: &cdi::Registry, req: &Request, dev_root: &Path) -> Result<(), DeviceError> {
        let device = req.name.to_string();
        let (index, dev) = registry.lookup(&req.name)?;
        let spec_path = registry.specs[index].path.clone();
        if !self.used_specs.contains(&index) {
            if let Some(raw) = registry.spec_edits(index) {
                let set = cdi::resolve_edits(raw, dev_root, &device, &spec_path, &mut self.warnings)?;
                self.sets.push(set);
            }
            self.used_specs.push(index);
            self.spec_files.push(spec_path.clone());
        }
        let set = cdi::resolve_edits(dev.edits(), dev_root, &device, &spec_path, &mut self.warnings)?;
        self.sets.push(set);
        push_name(&mut self.devices, device.clone());
        self.sources.push(InjectedDevice {
            device,
            origin: req.origin.clone(),
            resolution: Resolution::Cdi { spec_file: spec_path },
        });
        Ok(())
    }

    /// `/dev/nvidia*` selection for env requests when no CDI spec exists
    /// for the NVIDIA kind: indexes and `all`, plus the present control
    /// nodes. UUIDs and MIG names need a CDI spec.
    fn add_fallback(
        &mut self,
        registry: &cdi::Registry,
        reqs: &[Request],
        cfg: &DeviceConfig,
    ) -> Result<(), DeviceError> {
        let found = discover::discover_nvidia(&cfg.dev_root).map_err(|e| DeviceError::NodeMissing {
            node: cfg.dev_root.clone(),
            device: reqs.first().map(|r| r.name.to_string()).unwrap_or_default(),
            reason: format!("cannot list NVIDIA nodes: {e}"),
        })?;
        let mut set = EditSet::default();
        for req in reqs {
            let device = req.name.to_string();
            let gpus: Vec<&discover::HostNode> = if req.name.is_all() {
                if found.gpus.is_empty() {
                    return Err(DeviceError::UnknownDevice {
                        device,
                        kind: cfg.nvidia_kind.clone(),
                        detail: format!(
                            "no CDI spec for the kind and no nvidiaN nodes under {}",
                            cfg.dev_root.display()
                        ),
                        spec_files: Vec::new(),
                        searched: registry.dirs.clone(),
                    });
                }
                found.gpus.values().collect()
            } else {
                let index = req.name.name.parse::<u32>().map_err(|_| DeviceError::UnknownDevice {
                    device: device.clone(),
                    kind: cfg.nvidia_kind.clone(),
                    detail: format!(
                        "no CDI spec for the kind, and without one only GPU indexes and `all` \
                         can be resolved from {} (generate a spec with `nvidia-ctk cdi generate`)",
                        cfg.dev_root.display()
                    ),
                    spec_files: Vec::new(),
                    searched: registry.dirs.clone(),
                })?;
                let gpu = found.gpus.get(&index).ok_or_else(|| DeviceError::NodeMissing {
                    node: cfg.dev_root.join(format!("nvidia{index}")),
                    device: device.clone(),
                    reason: "no such GPU node (and no CDI spec for the kind)".to_string(),
                })?;
                vec![gpu]
            };
            let nodes = gpus.iter().map(|g| g.container.clone()).collect();
            for gpu in gpus {
                add_host_node(&mut set, gpu);
            }
            self.sources.push(InjectedDevice {
                device,
                origin: req.origin.clone(),
                resolution: Resolution::Fallback { nodes },
            });
        }
        for node in &found.control {
            add_host_node(&mut set, node);
        }
        for node in &set.nodes {
            push_name(&mut self.devices, format!("dev:{}", node.path.display()));
        }
        self.sets.push(set);
        Ok(())
    }
}

fn add_host_node(set: &mut EditSet, node: &discover::HostNode) {
    if set.nodes.iter().any(|n| n.path == node.container) {
        return;
    }
    set.nodes.push(NodeEdit {
        path: node.container.clone(),
        typ: LinuxDeviceType::C,
        major: node.info.major,
        minor: node.info.minor,
        file_mode: Some(node.info.mode & 0o777),
        access: "rwm".to_string(),
        uid: None,
        gid: None,
    });
}

fn push_name(list: &mut Vec<String>, name: String) {
    if !list.contains(&name) {
        list.push(name);
    }
}

/// Adds `devices` to the injected-devices annotation, keeping what an
/// earlier call recorded, so that injecting twice yields the same spec.
fn record(spec: &mut Spec, devices: &[String]) {
    if devices.is_empty() {
        return;
    }
    let annotations = spec.annotations_mut().get_or_insert_with(Default::default);
    let mut all: Vec<String> = annotations
        .get(INJECTED_ANNOTATION)
        .map(|v| {
            v.split(',')
                .map(str::trim)
                .filter(|s| !s.is_empty())
                .map(String::from)
                .collect()
        })
        .unwrap_or_default();
    for d in devices {
        push_name(&mut all, d.clone());
    }
    annotations.insert(INJECTED_ANNOTATION.to_string(), all.join(","));
}

#[cfg(test)]
mod tests;
