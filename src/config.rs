//! The shim's TOML configuration: one documented file (`runtime-conf/gantry.toml`), found through
//! the engine's per-handler options, `GANTRY_CONFIG`, `/etc/gantry/config.toml`, or defaults.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use thiserror::Error;

use crate::devices::DeviceConfig;
use crate::security::SecurityConfig;

/// Where the system-wide config lives when nothing else names one.
pub const DEFAULT_CONFIG_PATH: &str = "/etc/gantry/config.toml";
/// Environment variable naming a config file (between the engine's option and the default path).
pub const CONFIG_ENV: &str = "GANTRY_CONFIG";

#[derive(Debug, Clone, Default, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct Config {
    pub shim: ShimConfig,
    pub runtime: RuntimeConfig,
    pub devices: DeviceConfig,
    pub events: crate::telemetry::EventsConfig,
    pub security: SecurityConfig,
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct ShimConfig {
    /// Directory of the daemons' ttrpc sockets; keep it short (sockets are limited to 108 bytes).
    /// Unset: the engine's (containerd 2.x `BootstrapParams.socket_dir`), else
    /// [`DEFAULT_SOCKET_DIR`]; see [`ShimConfig::socket_dir_for`].
    #[serde(skip_serializing_if = "Option::is_none")]
    pub socket_dir: Option<PathBuf>,
    /// `debug`, `info`, `warn` or `error`; `-debug` on the command line forces `debug`.
    pub log_level: String,
    /// Where each daemon moves before it serves, out of the engine's service cgroup:
    /// `"auto"`, `"engine"` (stay), a `*.slice` or an absolute cgroupfs parent
    /// (see [`crate::daemon_cgroup`]).
    pub daemon_cgroup: Placement,
}

/// Where daemons' sockets go when neither the config nor the engine names a directory.
pub const DEFAULT_SOCKET_DIR: &str = "/run/gantry/s";

impl ShimConfig {
    /// The socket directory for a daemon: the operator's pin, else the one the engine passed
    /// (containerd 2.x keeps shim sockets under its state directory, and k3s or rke2 move
    /// that), else [`DEFAULT_SOCKET_DIR`]. An engine's relative path is ignored.
    pub fn socket_dir_for(&self, engine: Option<&Path>) -> PathBuf {
        self.socket_dir
            .clone()
            .or_else(|| engine.filter(|p| p.is_absolute()).map(Path::to_path_buf))
            .unwrap_or_else(|| PathBuf::from(DEFAULT_SOCKET_DIR))
    }
}

impl Default for ShimConfig {
    fn default() -> Self {
        Self {
            socket_dir: None,
            log_level: "info".into(),
            daemon_cgroup: Placement::Auto,
        }
    }
}

#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct RuntimeConfig {
    /// OCI runtime binary: a name looked up in PATH (`runc`, `crun`) or an absolute path.
    pub binary: String,
    /// State root of the OCI runtime; the namespace is appended, as the runc shim does.
    pub root: PathBuf,
    /// Which cgroup driver the OCI runtime uses: each container's own `cgroupsPath` decides
    /// unless the operator overrides it (see [`CgroupDriver`]).
    pub systemd_cgroup: CgroupDriver,
    /// Seconds each runtime call may take before it is killed.
    pub timeouts: RuntimeTimeouts,
    /// Start pods' pause containers without the OCI runtime (see [`crate::sandbox`]).
    pub sandbox_fast_path: bool,
    /// Keep the kernel's cgroup migration lock writer-fast while a runtime joins cgroups
    /// (see [`crate::cgroups::warm`]).
    pub cgroup_warmup: bool,
    /// Raise an `oomScoreAdj` below the daemon's own to the daemon's, as containerd's CRI
    /// does with the same key: hosts that may not lower it (no CAP_SYS_RESOURCE: rootless,
    /// nested) otherwise fail CRI-O's infra containers, which ask for -998.
    pub restrict_oom_score_adj: bool,
}

impl Default for RuntimeConfig {
    fn default() -> Self {
        Self {
            binary: "runc".into(),
            root: PathBuf::from("/run/gantry/runtime"),
            systemd_cgroup: CgroupDriver::FollowEngine,
            timeouts: RuntimeTimeouts::default(),
            sandbox_fast_path: true,
            cgroup_warmup: true,
            restrict_oom_score_adj: false,
        }
    }
}

/// `[shim] daemon_cgroup`: where each daemon moves before it serves, out of the engine's
/// cgroup (the why is `crate::daemon_cgroup`'s).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub enum Placement {
    /// A scope in `system.slice` under systemd, else the cgroupfs parent `/gantry`.
    #[default]
    Auto,
    /// Stay in the engine's cgroup.
    Engine,
    /// A scope in this slice (systemd only).
    Slice(String),
    /// A cgroup under this cgroupfs parent.
    Parent(PathBuf),
}

impl Placement {
    pub fn parse(value: &str) -> Result<Placement, String> {
        match value {
            "auto" => Ok(Placement::Auto),
            "engine" => Ok(Placement::Engine),
            s if s.ends_with(".slice") && s.len() > ".slice".len() && unit_name_ok(s) => Ok(Placement::Slice(s.into())),
            s if s.starts_with('/') && !s.split('/').any(|c| c == ".." || c == ".") && !s.contains(':') => {
                Ok(Placement::Parent(PathBuf::from(s)))
            }
            s => Err(format!(
                "{s:?} is not \"auto\", \"engine\", a NAME.slice or an absolute cgroup path"
            )),
        }
    }
}

/// Characters systemd takes in a unit name.
pub(crate) fn unit_name_ok(s: &str) -> bool {
    s.bytes().all(|b| b.is_ascii_alphanumeric() || b"-_.:\\@".contains(&b))
}

impl Serialize for Placement {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Placement::Auto => s.serialize_str("auto"),
            Placement::Engine => s.serialize_str("engine"),
            Placement::Slice(slice) => s.serialize_str(slice),
            Placement::Parent(path) => s.serialize_str(&path.to_string_lossy()),
        }
    }
}

impl<'de> Deserialize<'de> for Placement {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        Placement::parse(&String::deserialize(d)?).map_err(serde::de::Error::custom)
    }
}

/// The runtime's cgroup driver: `systemd_cgroup = "auto"` (the default) or a boolean override.
///
/// Why follow the engine by default: the engine already chose its driver and wrote it into every
/// `cgroupsPath` (CRI-O's default systemd manager writes `slice:prefix:name`, a cgroupfs engine
/// an absolute path), and runc misreads a path of the other form (a systemd triple taken as a
/// cgroupfs path becomes a directory literally named `slice:prefix:name`, outside the pod).
/// A fixed key in gantry's config cannot be right for both engines' defaults at once.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum CgroupDriver {
    /// The systemd driver for a `slice:prefix:name` path, cgroupfs for any other; with no
    /// path, the engine's runc `SystemdCgroup` option.
    #[default]
    FollowEngine,
    /// `true`: always the systemd driver.
    Systemd,
    /// `false`: always cgroupfs.
    Cgroupfs,
}

impl CgroupDriver {
    /// Whether the runtime runs a container with this `cgroupsPath` through systemd;
    /// `engine_systemd` is the engine's runc option (containerd's `SystemdCgroup`).
    pub fn systemd_for(self, engine_systemd: bool, cgroups_path: &str) -> bool {
        match self {
            CgroupDriver::Systemd => true,
            CgroupDriver::Cgroupfs => false,
            CgroupDriver::FollowEngine if cgroups_path.is_empty() => engine_systemd,
            CgroupDriver::FollowEngine => crate::cgroups::is_systemd_path(cgroups_path),
        }
    }
}

impl Serialize for CgroupDriver {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            CgroupDriver::FollowEngine => s.serialize_str("auto"),
            CgroupDriver::Systemd => s.serialize_bool(true),
            CgroupDriver::Cgroupfs => s.serialize_bool(false),
        }
    }
}

impl<'de> Deserialize<'de> for CgroupDriver {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        #[derive(Deserialize)]
        #[serde(untagged)]
        enum Raw {
            Flag(bool),
            Word(String),
        }
        match Raw::deserialize(d) {
            Ok(Raw::Flag(true)) => Ok(CgroupDriver::Systemd),
            Ok(Raw::Flag(false)) => Ok(CgroupDriver::Cgroupfs),
            Ok(Raw::Word(w)) if w == "auto" => Ok(CgroupDriver::FollowEngine),
            _ => Err(serde::de::Error::custom(
                "expected \"auto\" (follow each container's cgroupsPath), true or false",
            )),
        }
    }
}

/// Seconds an OCI runtime invocation may run before gantry kills it (its whole process group)
/// and fails the request with DEADLINE_EXCEEDED. A hung `runc` would otherwise hold the request,
/// and whatever waits on it, forever. The defaults sit above the engines' own deadlines (CRI-O
/// gives Create 240 s; kubelet's runtime request timeout is 2 min), so a slow runtime is left
/// to the engine's judgement first.
#[derive(Debug, Clone, Copy, Deserialize, Serialize, PartialEq, Eq)]
#[serde(default, deny_unknown_fields)]
pub struct RuntimeTimeouts {
    pub create: u64,
    pub start: u64,
    pub exec: u64,
    pub kill: u64,
    pub delete: u64,
    /// `checkpoint` (CRIU dumps of large containers take long).
    pub checkpoint: u64,
    /// Every other call: state, ps, pause, resume, update, features.
    pub default: u64,
}

impl Default for RuntimeTimeouts {
    fn default() -> Self {
        Self {
            create: 250,
            start: 130,
            exec: 130,
            kill: 130,
            delete: 130,
            checkpoint: 600,
            default: 130,
        }
    }
}

/// Longest accepted timeout (a day): more is a typo, not a deadline.
const MAX_TIMEOUT_SECS: u64 = 86_400;

impl RuntimeTimeouts {
    /// The limit for one runtime command (`create`, `start`, ...).
    pub fn for_command(&self, command: &str) -> std::time::Duration {
        let secs = match command {
            "create" => self.create,
            "start" => self.start,
            "exec" => self.exec,
            "kill" => self.kill,
            "delete" => self.delete,
            "checkpoint" => self.checkpoint,
            _ => self.default,
        };
        std::time::Duration::from_secs(secs)
    }

    fn entries(&self) -> [(&'static str, u64); 7] {
        [
            ("create", self.create),
            ("start", self.start),
            ("exec", self.exec),
            ("kill", self.kill),
            ("delete", self.delete),
            ("checkpoint", self.checkpoint),
            ("default", self.default),
        ]
    }
}

#[derive(Debug, Error)]
pub enum ConfigError {
    #[error("config {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("config {path}, line {line}, key `{key}`: {message}")]
    Invalid {
        path: PathBuf,
        line: usize,
        key: String,
        message: String,
    },
}

impl Config {
    /// Parses `text` read from `path`; errors name the file, the line and the key.
    pub fn parse(path: &Path, text: &str) -> Result<Config, ConfigError> {
        toml::from_str(text)
            .map_err(|e| {
                let (line, key) = match e.span() {
                    Some(span) => locate(text, span.start),
                    None => (0, String::new()),
                };
                Config::invalid(path, line, key, e.message().to_string())
            })
            .and_then(|c: Config| c.validate(path, text))
    }

    fn invalid(path: &Path, line: usize, key: String, message: String) -> ConfigError {
        ConfigError::Invalid {
            path: path.to_path_buf(),
            line,
            key,
            message,
        }
    }

    fn validate(self, path: &Path, text: &str) -> Result<Config, ConfigError> {
        let find = |key: &str| {
            text.lines()
                .position(|l| l.trim_start().starts_with(key))
                .map(|i| i + 1)
                .unwrap_or(0)
        };
        if self.runtime.binary.trim().is_empty() {
            let msg = "must name an OCI runtime".to_string();
            return Err(Config::invalid(path, find("binary"), "runtime.binary".into(), msg));
        }
        if !matches!(self.shim.log_level.as_str(), "debug" | "info" | "warn" | "error") {
            let msg = format!("unknown level {:?} (debug, info, warn, error)", self.shim.log_level);
            return Err(Config::invalid(path, find("log_level"), "shim.log_level".into(), msg));
        }
        for (key, secs) in self.runtime.timeouts.entries() {
            if secs == 0 || secs > MAX_TIMEOUT_SECS {
                let msg = format!("must be between 1 and {MAX_TIMEOUT_SECS} seconds, not {secs}");
                return Err(Config::invalid(path, find(key), format!("runtime.timeouts.{key}"), msg));
            }
        }
        if let Err((key, msg)) = self.security.validate() {
            return Err(Config::invalid(path, find(key), format!("security.{key}"), msg));
        }
        if self.shim.socket_dir.as_ref().is_some_and(|d| !d.is_absolute()) {
            let msg = "must be an absolute path".to_string();
            return Err(Config::invalid(path, find("socket_dir"), "shim.socket_dir".into(), msg));
        }
        if let Some((key, msg)) = self.events.problem() {
            // "log " and not "log": `log_level` of [shim] starts with it too.
            return Err(Config::invalid(
                path,
                find(&format!("{key} ")),
                format!("events.{key}"),
                msg,
            ));
        }
        Ok(self)
    }

    /// Loads one file.
    pub fn load(path: &Path) -> Result<Config, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
            path: path.to_path_buf(),
            source,
        })?;
        Config::parse(path, &text)
    }

    /// Resolves the file to use: the engine's `config_path` first, then `GANTRY_CONFIG`, then
    /// `/etc/gantry/config.toml` if it exists. `None` means built-in defaults.
    pub fn locate(engine_path: Option<&str>) -> Option<PathBuf> {
        if let Some(p) = engine_path.filter(|p| !p.is_empty()) {
            return Some(PathBuf::from(p));
        }
        if let Some(p) = std::env::var_os(CONFIG_ENV).filter(|p| !p.is_empty()) {
            return Some(PathBuf::from(p));
        }
        let default = Path::new(DEFAULT_CONFIG_PATH);
        default.exists().then(|| default.to_path_buf())
    }

    /// Loads the config that [`Config::locate`] picks, or the defaults.
    pub fn resolve(engine_path: Option<&str>) -> Result<(Config, Option<PathBuf>), ConfigError> {
        match Config::locate(engine_path) {
            Some(p) => Config::load(&p).map(|c| (c, Some(p))),
            None => Ok((Config::default(), None)),
        }
    }
}

/// Where a daemon's Creates get their config from the path the engine's options name (if
/// any): [`Config::resolve`] in production, a fixed config in unit tests, whose results must
/// not change on a host where gantry is installed.
pub type ConfigSource =
    std::sync::Arc<dyn Fn(Option<&str>) -> Result<(Config, Option<PathBuf>), ConfigError> + Send + Sync>;

/// The production source: [`Config::resolve`].
pub fn from_files() -> ConfigSource {
    std::sync::Arc::new(Config::resolve)
}

/// Always `config`, whatever the engine names.
pub fn fixed(config: Config) -> ConfigSource {
    std::sync::Arc::new(move |_| Ok((config.clone(), None)))
}

/// Line number (1-based) and the dotted key of the table entry around byte `offset`.
fn locate(text: &str, offset: usize) -> (usize, String) {
    let offset = offset.min(text.len());
    let before = &text[..offset];
    let line_no = before.matches('\n').count() + 1;
    let mut table = String::new();
    for l in before.lines() {
        let t = l.trim();
        if t.starts_with('[') && !t.starts_with("[[") {
            table = t.trim_matches(|c| c == '[' || c == ']').trim().to_string();
        }
    }
    let line = text.lines().nth(line_no - 1).unwrap_or("");
    let key = line
        .split_once('=')
        .map(|(k, _)| k.trim().trim_matches('"').to_string())
        .unwrap_or_default();
    let dotted = match (table.is_empty(), key.is_empty()) {
        (_, true) => table,
        (true, false) => key,
        (false, false) => format!("{table}.{key}"),
    };
    (line_no, dotted)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_socket_directory_is_the_pin_then_the_engines_then_the_default() {
        let unpinned = ShimConfig::default();
        let engine = Path::new("/run/containerd/s");
        assert_eq!(unpinned.socket_dir_for(None), Path::new(DEFAULT_SOCKET_DIR));
        assert_eq!(unpinned.socket_dir_for(Some(engine)), engine);
        assert_eq!(
            unpinned.socket_dir_for(Some(Path::new("rel/s"))),
            Path::new(DEFAULT_SOCKET_DIR)
        );
        let pinned = Config::parse(Path::new("t.toml"), "[shim]\nsocket_dir = \"/run/pin\"\n").unwrap();
        assert_eq!(pinned.shim.socket_dir_for(Some(engine)), Path::new("/run/pin"));
        assert_eq!(pinned.shim.socket_dir_for(None), Path::new("/run/pin"));
    }

    #[test]
    fn defaults_roundtrip_through_documented_file() {
        let text = include_str!("../runtime-conf/gantry.toml");
        let c = Config::parse(Path::new("gantry.toml"), text).unwrap();
        assert_eq!(c, Config::default());
    }

    #[test]
    fn placements_are_parsed_and_bad_ones_refused() {
        assert_eq!(Placement::parse("auto"), Ok(Placement::Auto));
        assert_eq!(Placement::parse("engine"), Ok(Placement::Engine));
        assert_eq!(
            Placement::parse("gantry.slice"),
            Ok(Placement::Slice("gantry.slice".into()))
        );
        assert_eq!(
            Placement::parse("/shims"),
            Ok(Placement::Parent(PathBuf::from("/shims")))
        );
        for bad in [
            "",
            "pod",
            ".slice",
            "a/b.slice",
            "shims",
            "/a/../b",
            "/a:b",
            "x y.slice",
        ] {
            assert!(Placement::parse(bad).is_err(), "{bad:?} accepted");
        }
    }

    #[test]
    fn errors_name_file_line_and_key() {
        let text = "[shim]\nsocket_dir = \"/run/x\"\n\n[runtime]\nsystemd_cgroup = \"yes\"\n";
        let e = Config::parse(Path::new("/etc/g.toml"), text).unwrap_err().to_string();
        assert!(e.contains("/etc/g.toml"), "{e}");
        assert!(e.contains("line 5"), "{e}");
        assert!(e.contains("runtime.systemd_cgroup"), "{e}");

        let e = Config::parse(Path::new("f"), "[runtime]\nbinnary = \"crun\"\n").unwrap_err();
        let e = e.to_string();
        assert!(e.contains("line 2") && e.contains("binnary"), "{e}");

        let e = Config::parse(Path::new("f"), "[shim]\ndaemon_cgroup = \"pod\"\n").unwrap_err();
        assert!(e.to_string().contains("shim.daemon_cgroup"), "{e}");

        let e = Config::parse(Path::new("f"), "[shim]\nlog_level = \"loud\"\n").unwrap_err();
        assert!(e.to_string().contains("shim.log_level"), "{e}");
    }

    #[test]
    fn runtime_timeouts_are_read_and_checked() {
        let text = "[runtime.timeouts]\ncreate = 2\ndefault = 7\n";
        let c = Config::parse(Path::new("f"), text).unwrap();
        let t = c.runtime.timeouts;
        assert_eq!(t.for_command("create"), std::time::Duration::from_secs(2));
        assert_eq!(t.for_command("pause"), std::time::Duration::from_secs(7));
        assert_eq!(t.for_command("kill"), std::time::Duration::from_secs(130));

        let e = Config::parse(Path::new("f"), "[runtime.timeouts]\nkill = 0\n").unwrap_err();
        let e = e.to_string();
        assert!(e.contains("runtime.timeouts.kill") && e.contains("line 2"), "{e}");
        let e = Config::parse(Path::new("f"), "[runtime.timeouts]\nrun = 5\n").unwrap_err();
        assert!(e.to_string().contains("run"), "{e}");
    }

    #[test]
    fn engine_path_wins() {
        assert_eq!(Config::locate(Some("/a.toml")), Some(PathBuf::from("/a.toml")));
    }
}
