//! The one place a container's runtime is chosen: for a new container (Create) and for a
//! bundle whose daemon is gone (`delete`).
//!
//! Why one place: the choice has three inputs that used to be read in three places (the
//! engine's runc `Options`, gantry's config, and whether the sandbox fast path takes a pause
//! container), and `delete` must rebuild exactly the runtime Create chose from what Create
//! recorded in the bundle ([`RuntimeRecord`]). Unit tests replace the whole choice with a fake
//! ([`Runtimes`] is the seam).

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use slog::{info, Logger};

use super::{OciRuntime, Runtime};
use crate::config::Config;
use crate::container::RUNTIME_LOG;
use crate::options::EngineOptions;
use crate::reaper::Reaper;
use crate::spec::Edited;

/// What `delete` (the subcommand, after a daemon died) needs to clean up a bundle, and what
/// the installer reads to know which gantry binary a bundle still needs. It outlives the
/// daemon that wrote it, so another version of gantry may read it: [`RuntimeRecord::FORMAT`].
#[derive(Debug, Serialize, Deserialize)]
pub struct RuntimeRecord {
    /// The record's format: 1 (no field) before the installer, 2 with `shim`. A reader refuses
    /// a format newer than its own rather than misread it.
    #[serde(default = "format_one")]
    pub format: u32,
    /// The gantry binary whose daemon created the bundle (its resolved path), which the
    /// installer must not remove while the bundle exists.
    #[serde(default)]
    pub shim: Option<PathBuf>,
    pub binary: String,
    pub root: PathBuf,
    pub systemd_cgroup: bool,
    pub rootfs_mounted: bool,
    /// Where the daemon's socket lives: `delete` removes a dead daemon's socket only there.
    #[serde(default = "default_socket_dir")]
    pub socket_dir: PathBuf,
}

fn default_socket_dir() -> PathBuf {
    PathBuf::from(crate::config::DEFAULT_SOCKET_DIR)
}

fn format_one() -> u32 {
    1
}

impl RuntimeRecord {
    /// The format this binary writes and the newest it reads.
    pub const FORMAT: u32 = 2;

    /// The bundle's record: `Ok(None)` when there is none or it does not parse (a bundle from
    /// before records, or a Create cut short), `Err` for a format newer than this binary's.
    pub fn read(bundle: &Path) -> Result<Option<Self>, String> {
        let path = bundle.join(crate::container::RUNTIME_FILE);
        let Some(record) = std::fs::read(&path)
            .ok()
            .and_then(|b| serde_json::from_slice::<Self>(&b).ok())
        else {
            return Ok(None);
        };
        if record.format > Self::FORMAT {
            return Err(format!(
                "{} has format {}, newer than the {} this gantry reads: use the gantry that wrote it",
                path.display(),
                record.format,
                Self::FORMAT
            ));
        }
        Ok(Some(record))
    }

    /// The running binary's own path, for `shim`.
    pub fn this_shim() -> Option<PathBuf> {
        std::fs::read_link("/proc/self/exe").ok()
    }

    /// The record a bundle without one stands for: the config's runtime, as Create would have
    /// chosen it without engine options for a container with `cgroups_path`.
    pub fn from_config(config: &Config, namespace: &str, cgroups_path: &str) -> Self {
        Self {
            format: Self::FORMAT,
            shim: None,
            binary: config.runtime.binary.clone(),
            root: config.runtime.root.join(namespace),
            systemd_cgroup: config.runtime.systemd_cgroup.systemd_for(false, cgroups_path),
            rootfs_mounted: false,
            socket_dir: config.shim.socket_dir_for(None),
        }
    }
}

/// What Create knows when it chooses.
pub struct Wanted<'a> {
    pub engine: &'a EngineOptions,
    pub config: &'a Config,
    pub namespace: &'a str,
    pub bundle: &'a Path,
    /// The spec's annotations, as the engine wrote them.
    pub annotations: &'a HashMap<String, String>,
    /// The spec as the runtime will read it: after gantry's edits.
    pub spec: &'a Edited,
    pub reaper: &'a Reaper,
    pub log: &'a Logger,
}

/// Chooses containers' runtimes.
pub trait Runtimes: Send + Sync {
    /// A new container's runtime.
    fn for_create(&self, wanted: &Wanted<'_>) -> Arc<dyn Runtime>;
    /// The runtime of a bundle whose daemon died, from the record its Create wrote.
    fn for_record(&self, record: &RuntimeRecord, bundle: &Path, reaper: Reaper) -> Arc<dyn Runtime>;
}

/// How the daemon holds its chooser.
pub type RuntimeFactory = Arc<dyn Runtimes>;

/// The production chooser: the sandbox fast path for a pause container it can start, else the
/// OCI runtime the engine's options or the config name.
pub struct OciRuntimes;

/// The production factory.
pub fn oci_runtimes() -> RuntimeFactory {
    Arc::new(OciRuntimes)
}

impl Runtimes for OciRuntimes {
    fn for_create(&self, w: &Wanted<'_>) -> Arc<dyn Runtime> {
        let oci = oci_runtime(w);
        match crate::sandbox::fast_path(w.bundle, w.annotations, w.spec, w.config, &oci.identity(), w.reaper) {
            Ok(Some(sandbox)) => Arc::new(sandbox),
            Ok(None) => Arc::new(oci),
            Err(why) => {
                info!(w.log, "sandbox fast path not taken: the OCI runtime starts it"; "reason" => %why);
                Arc::new(oci)
            }
        }
    }

    fn for_record(&self, r: &RuntimeRecord, bundle: &Path, reaper: Reaper) -> Arc<dyn Runtime> {
        if r.binary == crate::sandbox::RECORD_BINARY {
            return Arc::new(crate::sandbox::FastSandbox::recover(bundle, reaper));
        }
        Arc::new(OciRuntime::new(
            &r.binary,
            r.root.clone(),
            r.systemd_cgroup,
            bundle.join(RUNTIME_LOG),
            reaper,
        ))
    }
}

/// The OCI runtime binary: runc `Options`' `BinaryName` from the engine first, then the
/// config file's (also what `features` reports on).
pub fn oci_binary(engine: &EngineOptions, config: &Config) -> String {
    engine
        .binary_name
        .clone()
        .unwrap_or_else(|| config.runtime.binary.clone())
}

/// The OCI runtime: runc `Options` from the engine first, then the config file.
fn oci_runtime(w: &Wanted<'_>) -> OciRuntime {
    let (engine, config) = (w.engine, w.config);
    let binary = oci_binary(engine, config);
    let root = engine
        .root
        .as_ref()
        .map(PathBuf::from)
        .unwrap_or_else(|| config.runtime.root.clone())
        .join(w.namespace);
    let cgroups_path = w.spec.document().ok().and_then(|doc| {
        doc.pointer("/linux/cgroupsPath")
            .and_then(serde_json::Value::as_str)
            .map(String::from)
    });
    let systemd =
        (config.runtime.systemd_cgroup).systemd_for(engine.systemd_cgroup, cgroups_path.as_deref().unwrap_or(""));
    OciRuntime::new(&binary, root, systemd, w.bundle.join(RUNTIME_LOG), w.reaper.clone())
        .with_timeouts(config.runtime.timeouts)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wanted<'a>(
        engine: &'a EngineOptions,
        config: &'a Config,
        (annotations, spec): &'a (HashMap<String, String>, Edited),
        reaper: &'a Reaper,
        log: &'a Logger,
    ) -> Wanted<'a> {
        Wanted {
            engine,
            config,
            namespace: "k8s.io",
            bundle: Path::new("/run/b"),
            annotations,
            spec,
            reaper,
            log,
        }
    }

    /// A spec no edit touched.
    fn no_edits() -> (HashMap<String, String>, Edited) {
        let spec = Edited {
            doc: Some(serde_json::json!({})),
            write: None,
            original: b"{}".to_vec(),
            edits: Default::default(),
        };
        (HashMap::new(), spec)
    }

    #[test]
    fn the_engines_options_win_over_the_config() {
        let (reaper, log) = (Reaper::default(), Logger::root(slog::Discard, slog::o!()));
        let mut config = Config::default();
        config.runtime.binary = "crun".into();
        let spec = no_edits();
        let defaults = EngineOptions::default();
        let id = OciRuntimes
            .for_create(&wanted(&defaults, &config, &spec, &reaper, &log))
            .identity();
        assert_eq!(id.binary, "crun");
        assert_eq!(id.root, config.runtime.root.join("k8s.io"));
        let engine = EngineOptions {
            binary_name: Some("/opt/runc".into()),
            root: Some("/run/other".into()),
            systemd_cgroup: true,
            ..Default::default()
        };
        let id = OciRuntimes
            .for_create(&wanted(&engine, &config, &spec, &reaper, &log))
            .identity();
        assert_eq!(
            (id.binary.as_str(), id.root, id.systemd_cgroup),
            ("/opt/runc", PathBuf::from("/run/other/k8s.io"), true)
        );
    }

    fn with_cgroups_path(path: &str) -> (HashMap<String, String>, Edited) {
        let doc = serde_json::json!({ "linux": { "cgroupsPath": path } });
        let spec = Edited {
            original: serde_json::to_vec(&doc).unwrap(),
            doc: Some(doc),
            write: None,
            edits: Default::default(),
        };
        (HashMap::new(), spec)
    }

    /// CRI-O's default systemd manager writes `slice:prefix:name` and sends no runc options:
    /// the path alone must pick runc's systemd driver, and an absolute path cgroupfs, unless
    /// the operator pinned the driver.
    #[test]
    fn the_cgroups_path_picks_the_driver_unless_the_config_pins_it() {
        use crate::config::CgroupDriver;
        let (reaper, log) = (Reaper::default(), Logger::root(slog::Discard, slog::o!()));
        let engine = EngineOptions::default();
        let systemd = with_cgroups_path("kubepods-besteffort-pod1.slice:crio:c1");
        let cgroupfs = with_cgroups_path("/kubepods/besteffort/pod1/c1");
        let mut config = Config::default();
        let pick = |config: &Config, spec| {
            OciRuntimes
                .for_create(&wanted(&engine, config, spec, &reaper, &log))
                .identity()
                .systemd_cgroup
        };
        assert!(pick(&config, &systemd));
        assert!(!pick(&config, &cgroupfs));
        config.runtime.systemd_cgroup = CgroupDriver::Cgroupfs;
        assert!(!pick(&config, &systemd));
        config.runtime.systemd_cgroup = CgroupDriver::Systemd;
        assert!(pick(&config, &cgroupfs));
    }

    #[test]
    fn a_record_rebuilds_the_runtime_create_chose() {
        let record = RuntimeRecord {
            format: RuntimeRecord::FORMAT,
            shim: None,
            binary: "crun".into(),
            root: "/run/crun/ns".into(),
            systemd_cgroup: true,
            rootfs_mounted: false,
            socket_dir: default_socket_dir(),
        };
        let id = OciRuntimes
            .for_record(&record, Path::new("/run/b"), Reaper::default())
            .identity();
        assert_eq!(
            (id.binary.as_str(), id.root, id.systemd_cgroup),
            ("crun", PathBuf::from("/run/crun/ns"), true)
        );
        let fast = RuntimeRecord {
            binary: crate::sandbox::RECORD_BINARY.into(),
            ..record
        };
        let dir = tempfile::tempdir().unwrap();
        let id = OciRuntimes.for_record(&fast, dir.path(), Reaper::default()).identity();
        assert_eq!(id.binary, crate::sandbox::RECORD_BINARY);
    }

    #[test]
    fn a_bundle_without_a_record_stands_for_the_configs_runtime() {
        let config = Config::default();
        let r = RuntimeRecord::from_config(&config, "default", "");
        assert!(!r.systemd_cgroup);
        assert!(RuntimeRecord::from_config(&config, "default", "pod1.slice:crio:c1").systemd_cgroup);
        assert_eq!(r.binary, config.runtime.binary);
        assert_eq!(r.root, config.runtime.root.join("default"));
        assert!(!r.rootfs_mounted);
    }

    /// A record outlives its daemon: the previous format (no `format`, no `shim`) is read as
    /// format 1, this one round-trips, and a newer one is refused by name, never misread.
    #[test]
    fn records_of_older_formats_are_read_and_newer_ones_refused() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join(crate::container::RUNTIME_FILE);
        assert!(RuntimeRecord::read(dir.path()).unwrap().is_none());
        let v1 = r#"{"binary":"runc","root":"/run/gantry/runc/ns","systemd_cgroup":false,"rootfs_mounted":true}"#;
        std::fs::write(&file, v1).unwrap();
        let r = RuntimeRecord::read(dir.path()).unwrap().unwrap();
        assert_eq!((r.format, r.shim.as_deref(), r.rootfs_mounted), (1, None, true));
        let now = RuntimeRecord {
            shim: Some("/opt/gantry/0.1.0-abc/containerd-shim-gantry-v2".into()),
            ..RuntimeRecord::from_config(&Config::default(), "ns", "")
        };
        std::fs::write(&file, serde_json::to_vec(&now).unwrap()).unwrap();
        let r = RuntimeRecord::read(dir.path()).unwrap().unwrap();
        assert_eq!((r.format, r.shim), (RuntimeRecord::FORMAT, now.shim));
        let future = v1.replace('{', r#"{"format":99,"#);
        std::fs::write(&file, future).unwrap();
        let err = RuntimeRecord::read(dir.path()).unwrap_err();
        assert!(
            err.contains("format 99") && err.contains(crate::container::RUNTIME_FILE),
            "{err}"
        );
    }
}
