//! AppArmor, host-aware: whether the host has it (runc's check), whether a profile is loaded,
//! and what to do with `process.apparmorProfile` either way.

use std::path::Path;

use thiserror::Error;

use super::Unavailable;

#[derive(Debug, Error, PartialEq)]
pub enum AppArmorError {
    #[error(
        "AppArmor profile {profile:?} requested, but this host has no AppArmor \
         (rejected by security.apparmor_unavailable = \"reject\")"
    )]
    Unavailable { profile: String },
    #[error("AppArmor profile gantry-default could not be loaded with apparmor_parser: {0}")]
    Load(String),
    #[error("AppArmor profile {profile:?} ({from}) is not loaded on this host (not listed in {listing})")]
    NotLoaded {
        profile: String,
        from: &'static str,
        listing: String,
    },
}

/// What the host offers, read from its securityfs and sysfs (configurable roots, so tests can
/// use a fixture tree).
pub struct Host<'a> {
    pub securityfs: &'a Path,
    pub sysfs: &'a Path,
}

impl Host<'_> {
    /// runc's test: `<securityfs>/apparmor` exists and the module says it is enabled.
    pub fn enabled(&self) -> bool {
        let on = std::fs::read_to_string(self.sysfs.join("module/apparmor/parameters/enabled"))
            .map(|s| s.starts_with('Y'))
            .unwrap_or(false);
        on && self.securityfs.join("apparmor").exists()
    }

    fn listing(&self) -> std::path::PathBuf {
        self.securityfs.join("apparmor/profiles")
    }

    /// Whether `<securityfs>/apparmor/profiles` lists `name` (lines are `name (mode)`).
    pub fn loaded(&self, name: &str) -> bool {
        std::fs::read_to_string(self.listing())
            .map(|text| {
                text.lines()
                    .any(|l| l.rsplit_once(" (").map(|(n, _)| n).unwrap_or(l).trim() == name)
            })
            .unwrap_or(false)
    }
}

/// What happened to the container's AppArmor profile (`gantry.dev/apparmor`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Outcome {
    /// Nothing named, nothing applied.
    None,
    /// The engine's profile, kept.
    Engine(String),
    /// `security.apparmor_default`, applied.
    Default(String),
    /// Removed: the host has no AppArmor.
    Dropped(String),
}

impl Outcome {
    pub fn annotation(&self) -> String {
        match self {
            Outcome::None => "none".into(),
            Outcome::Engine(p) => format!("engine:{p}"),
            Outcome::Default(p) => format!("default:{p}"),
            Outcome::Dropped(p) => format!("dropped:{p}"),
        }
    }
}

/// The profile gantry ships (`runtime-conf/apparmor/gantry-default`), loaded on demand.
pub const GANTRY_DEFAULT: &str = "gantry-default";
const GANTRY_DEFAULT_PROFILE: &str = include_str!("../../runtime-conf/apparmor/gantry-default");

/// Loads gantry's own profile when the config makes it the default and an AppArmor host has
/// not loaded it yet, as containerd loads `cri-containerd.apparmor.d`: `apparmor_parser -Kr`
/// with the profile on stdin (`-K`: no cache written). Run by the reaper like any helper, so
/// the daemon's thread never waits on it; once loaded, the kernel keeps it for every daemon.
pub async fn ensure_default_loaded(
    default: &str,
    host: &Host<'_>,
    reaper: &crate::reaper::Reaper,
) -> Result<(), AppArmorError> {
    if default != GANTRY_DEFAULT || !host.enabled() || host.loaded(GANTRY_DEFAULT) {
        return Ok(());
    }
    load(GANTRY_DEFAULT_PROFILE, reaper).await
}

async fn load(profile: &str, reaper: &crate::reaper::Reaper) -> Result<(), AppArmorError> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    use tokio::io::AsyncReadExt;
    const LIMIT: std::time::Duration = std::time::Duration::from_secs(60);
    let since = std::time::Instant::now();
    let mut child = Command::new("apparmor_parser")
        .arg("-Kr")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| AppArmorError::Load(e.to_string()))?;
    let pid = child.id() as i32;
    let exit = reaper.subscribe_since(pid, Some(since));
    // A few KiB: the pipe takes it whole, so this write does not wait on the parser.
    if let Some(mut stdin) = child.stdin.take() {
        let _ = stdin.write_all(profile.as_bytes());
    }
    let mut err = Vec::new();
    if let Some(Ok(mut r)) = child.stderr.take().map(crate::runtime::pipe_reader) {
        let _ = tokio::time::timeout(LIMIT, r.read_to_end(&mut err)).await;
    }
    match tokio::time::timeout(LIMIT, exit).await {
        Ok(Ok(e)) if e.status == 0 => Ok(()),
        Ok(Ok(e)) => Err(AppArmorError::Load(format!(
            "exit status {}: {}",
            e.status,
            String::from_utf8_lossy(&err).trim()
        ))),
        _ => {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), nix::sys::signal::SIGKILL);
            Err(AppArmorError::Load("did not finish within 60 s".into()))
        }
    }
}

/// Whatever the policy: a profile the spec names on a host with AppArmor on must be loaded,
/// or Create fails with gantry's error naming it. Otherwise runc fails later with `write
/// /proc/self/attr/apparmor/exec: no such file or directory`.
pub fn check_named(current: Option<&str>, host: &Host) -> Result<(), AppArmorError> {
    match current.filter(|p| !p.is_empty() && *p != "unconfined") {
        Some(p) if host.enabled() && !host.loaded(p) => Err(AppArmorError::NotLoaded {
            profile: p.to_string(),
            from: "from the engine",
            listing: host.listing().display().to_string(),
        }),
        _ => Ok(()),
    }
}

/// The decision for a container whose spec names `current` (None: no profile).
pub fn decide(
    current: Option<&str>,
    privileged: bool,
    default: &str,
    unavailable: Unavailable,
    host: &Host,
) -> Result<Outcome, AppArmorError> {
    let current = current.filter(|p| !p.is_empty());
    let wanted_default = (!privileged && !default.is_empty()).then_some(default);
    if current.is_none() && wanted_default.is_none() {
        return Ok(Outcome::None);
    }
    if !host.enabled() {
        return match (current, unavailable) {
            (None, _) => Ok(Outcome::None),
            (Some(p), Unavailable::Keep) => Ok(Outcome::Engine(p.to_string())),
            (Some(p), Unavailable::Drop) => Ok(Outcome::Dropped(p.to_string())),
            (Some(p), Unavailable::Reject) => Err(AppArmorError::Unavailable { profile: p.to_string() }),
        };
    }
    let (profile, from) = match current {
        Some(p) => (p, "from the engine"),
        None => (default, "security.apparmor_default"),
    };
    if profile != "unconfined" && !host.loaded(profile) {
        return Err(AppArmorError::NotLoaded {
            profile: profile.to_string(),
            from,
            listing: host.listing().display().to_string(),
        });
    }
    Ok(match current {
        Some(p) => Outcome::Engine(p.to_string()),
        None => Outcome::Default(profile.to_string()),
    })
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A securityfs/sysfs fixture: AppArmor on, `loaded` listed as loaded profiles.
    pub(crate) fn fixture(enabled: bool, loaded: &[&str]) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        std::fs::create_dir_all(dir.path().join("sec/apparmor")).unwrap();
        let params = dir.path().join("sys/module/apparmor/parameters");
        std::fs::create_dir_all(&params).unwrap();
        std::fs::write(params.join("enabled"), if enabled { "Y\n" } else { "N\n" }).unwrap();
        let listing: String = loaded.iter().map(|p| format!("{p} (enforce)\n")).collect();
        std::fs::write(dir.path().join("sec/apparmor/profiles"), listing).unwrap();
        dir
    }

    pub(crate) fn host(dir: &tempfile::TempDir) -> (std::path::PathBuf, std::path::PathBuf) {
        (dir.path().join("sec"), dir.path().join("sys"))
    }

    #[test]
    fn host_without_apparmor_keeps_drops_or_rejects() {
        let dir = fixture(false, &[]);
        let (sec, sys) = host(&dir);
        let h = Host {
            securityfs: &sec,
            sysfs: &sys,
        };
        assert!(!h.enabled());
        let d = |u| decide(Some("p1"), false, "", u, &h);
        assert_eq!(d(Unavailable::Keep), Ok(Outcome::Engine("p1".into())));
        assert_eq!(d(Unavailable::Drop), Ok(Outcome::Dropped("p1".into())));
        let e = d(Unavailable::Reject).unwrap_err().to_string();
        assert!(
            e.contains("\"p1\"") && e.contains("security.apparmor_unavailable"),
            "{e}"
        );
        // A default is not applied where it cannot work.
        assert_eq!(
            decide(None, false, "gantry-default", Unavailable::Reject, &h),
            Ok(Outcome::None)
        );
        // Missing trees count as "no AppArmor" (this machine).
        let none = Path::new("/nonexistent");
        let h = Host {
            securityfs: none,
            sysfs: none,
        };
        assert!(!h.enabled());
    }

    #[test]
    fn host_with_apparmor_applies_default_and_checks_loaded() {
        let dir = fixture(true, &["gantry-default", "crio-default"]);
        let (sec, sys) = host(&dir);
        let h = Host {
            securityfs: &sec,
            sysfs: &sys,
        };
        assert!(h.enabled() && h.loaded("crio-default") && !h.loaded("crio"));
        let keep = Unavailable::Keep;
        assert_eq!(
            decide(None, false, "gantry-default", keep, &h),
            Ok(Outcome::Default("gantry-default".into()))
        );
        assert_eq!(decide(None, true, "gantry-default", keep, &h), Ok(Outcome::None));
        assert_eq!(
            decide(Some("crio-default"), false, "", keep, &h),
            Ok(Outcome::Engine("crio-default".into()))
        );
        assert_eq!(
            decide(Some("unconfined"), false, "x", keep, &h),
            Ok(Outcome::Engine("unconfined".into()))
        );
        let e = decide(Some("mine"), false, "", keep, &h).unwrap_err().to_string();
        assert!(
            e.contains("\"mine\"") && e.contains("not loaded") && e.contains("profiles"),
            "{e}"
        );
        let e = decide(None, false, "absent", keep, &h).unwrap_err().to_string();
        assert!(e.contains("security.apparmor_default"), "{e}");
    }

    #[test]
    fn a_named_profile_must_be_loaded_where_apparmor_is_on() {
        let on = fixture(true, &["crio-default"]);
        let (sec, sys) = host(&on);
        let h = Host {
            securityfs: &sec,
            sysfs: &sys,
        };
        assert!(check_named(Some("crio-default"), &h).is_ok());
        assert!(check_named(Some("unconfined"), &h).is_ok());
        assert!(check_named(None, &h).is_ok());
        let e = check_named(Some("missing"), &h).unwrap_err().to_string();
        assert!(e.contains("\"missing\"") && e.contains("not loaded"), "{e}");
        let off = fixture(false, &[]);
        let (sec, sys) = host(&off);
        let h = Host {
            securityfs: &sec,
            sysfs: &sys,
        };
        assert!(
            check_named(Some("missing"), &h).is_ok(),
            "no AppArmor: the policy decides"
        );
    }

    #[test]
    fn the_enabled_flag_alone_is_not_enough() {
        let dir = fixture(true, &[]);
        std::fs::remove_dir_all(dir.path().join("sec/apparmor")).unwrap();
        let (sec, sys) = host(&dir);
        assert!(!Host {
            securityfs: &sec,
            sysfs: &sys
        }
        .enabled());
    }
}
