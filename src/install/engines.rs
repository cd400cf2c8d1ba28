//! Which engines a host runs, and the drop-ins that register gantry with them. Only drop-ins:
//! CRI-O reads `crio.conf.d/`, containerd reads `conf.d/gantry.toml` through an `imports`
//! entry. A main config is never rewritten; where containerd would not import the drop-in,
//! one entry is added to its `imports` by a textual edit that uninstall reverses byte for
//! byte.

use std::path::{Path, PathBuf};

use super::{host_path, InstallError};

pub const CRIO_DROPIN: &str = "/etc/crio/crio.conf.d/99-gantry.conf";
pub const CONTAINERD_DROPIN: &str = "/etc/containerd/conf.d/gantry.toml";
pub const CONTAINERD_MAIN: &str = "/etc/containerd/config.toml";
const IMPORT_MARK: &str = "# added by containerd-shim-gantry-v2 install";

#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Engine {
    Crio,
    Containerd {
        /// (major, minor), from the package database or the binary.
        version: (u32, u32),
    },
}

impl Engine {
    pub fn unit(&self) -> &'static str {
        match self {
            Engine::Crio => "crio.service",
            Engine::Containerd { .. } => "containerd.service",
        }
    }
    pub fn dropin(&self) -> &'static str {
        match self {
            Engine::Crio => CRIO_DROPIN,
            Engine::Containerd { .. } => CONTAINERD_DROPIN,
        }
    }
}

/// An engine is there when its socket is (what the DaemonSet mounts), its binary is, or its
/// main config is; an empty `/etc/<engine>` is not enough: the kubelet creates the
/// DaemonSet's host directories when they are missing.
fn present(host: &Path, paths: &[&str]) -> bool {
    paths.iter().any(|p| host_path(host, Path::new(p)).exists())
}

/// The engines on `host` (`only`: `crio`, `containerd` or `auto`); `containerd_version`
/// overrides what the host says of containerd's.
pub fn detect(host: &Path, only: &str, containerd_version: Option<&str>) -> Result<Vec<Engine>, InstallError> {
    let mut out = Vec::new();
    let want = |name: &str| only == "auto" || only == name;
    let crio = present(
        host,
        &[
            "/run/crio/crio.sock",
            "/usr/bin/crio",
            "/usr/local/bin/crio",
            "/etc/crio/crio.conf",
        ],
    );
    if want("crio") && (crio || only == "crio") {
        out.push(Engine::Crio);
    }
    let bins = ["/usr/bin/containerd", "/usr/local/bin/containerd"];
    let containerd = present(host, &["/run/containerd/containerd.sock", CONTAINERD_MAIN]) || present(host, &bins);
    if want("containerd") && (containerd || only == "containerd") {
        let version = match containerd_version {
            Some(v) => parse_version(v).ok_or_else(|| InstallError::Usage(format!("--containerd-version {v:?}")))?,
            None => containerd_version_on(host, &bins).ok_or(InstallError::ContainerdVersion)?,
        };
        out.push(Engine::Containerd { version });
    }
    if out.is_empty() {
        return Err(InstallError::NoEngine(host.to_path_buf()));
    }
    Ok(out)
}

/// `1.6.20~ds1`, `v2.1.4`, `1:1.7.24-1`: the major and minor numbers.
fn parse_version(text: &str) -> Option<(u32, u32)> {
    let v = text.trim().rsplit(':').next()?.trim_start_matches('v');
    let mut parts = v.split(|c: char| !c.is_ascii_digit());
    let major = parts.next()?.parse().ok()?;
    let minor = parts.next()?.parse().ok()?;
    Some((major, minor))
}

/// containerd's version from dpkg's database (Debian's `containerd` or Docker's
/// `containerd.io`), else from the binary's `--version` where the binary runs here (a static
/// build does), else from the main config (`version = 3` is written by 2.x only).
fn containerd_version_on(host: &Path, bins: &[&str]) -> Option<(u32, u32)> {
    let status = std::fs::read_to_string(host_path(host, Path::new("/var/lib/dpkg/status"))).unwrap_or_default();
    for stanza in status.split("\n\n") {
        let field = |name: &str| stanza.lines().find_map(|l| l.strip_prefix(name).map(str::trim));
        let ours = matches!(field("Package:"), Some("containerd" | "containerd.io"));
        if ours && field("Status:").is_some_and(|s| s.ends_with(" installed")) {
            if let Some(v) = field("Version:").and_then(parse_version) {
                return Some(v);
            }
        }
    }
    for bin in bins {
        let out = std::process::Command::new(host_path(host, Path::new(bin)))
            .arg("--version")
            .stdin(std::process::Stdio::null())
            .output();
        if let Ok(out) = out {
            let text = String::from_utf8_lossy(&out.stdout).into_owned();
            if let Some(v) = text.split_whitespace().skip(1).find_map(parse_version) {
                return Some(v);
            }
        }
    }
    let main = std::fs::read_to_string(host_path(host, Path::new(CONTAINERD_MAIN))).ok()?;
    (config_version(&main) == Some(3)).then_some((2, 0))
}

/// The main config's `version` key.
fn config_version(text: &str) -> Option<i64> {
    toml::from_str::<toml::Table>(text).ok()?.get("version")?.as_integer()
}

/// The containerd drop-in, in the layout containerd `version` reads natively, given the main
/// config's text (`main`).
///
/// containerd before 2.0 merges an imported file's plugin sections by replacing them whole
/// (its `mergeConfig`: "Replace entire sections instead of merging map's values"), and a CRI
/// section's `runtimes` table replaces the built-in one: a drop-in naming only gantry's
/// runtime would take away the main config's CRI settings and the default `runc` runtime, and
/// the CRI plugin would not load. So for 1.x the drop-in carries the main config's whole CRI
/// section, the default runtime, and gantry's runtime; 2.x merges plugin sections key by key.
pub fn containerd_dropin(version: (u32, u32), main: Option<&str>) -> Result<String, InstallError> {
    const HEADER: &str = "# Registers gantry as the CRI runtime handler \"gantry\". Written by\n\
         # `containerd-shim-gantry-v2 install`; removed by `uninstall`. Edit /etc/gantry/config.toml instead.\n";
    const OPTIONS: &str = "ConfigPath = \"/etc/gantry/config.toml\"\n";
    if version.0 >= 2 {
        // No options table: with any, containerd 2.x's CRI wraps them as runtimeoptions and
        // then fails every user-namespace container of a non-runc shim (it reads them back as
        // runc options to set the I/O owner). gantry finds /etc/gantry/config.toml by itself.
        let table = "plugins.\"io.containerd.cri.v1.runtime\".containerd.runtimes.gantry";
        return Ok(format!("{HEADER}version = 3\n\n[{table}]\n{RUNTIME_KEYS}"));
    }
    let plugin = "io.containerd.grpc.v1.cri";
    let bad = |e: &dyn std::fmt::Display| InstallError::MainConfig(format!("does not parse: {e}"));
    let parsed: toml::Table = match main {
        Some(text) => toml::from_str(text).map_err(|e| bad(&e))?,
        None => toml::Table::new(),
    };
    let mut cri = parsed
        .get("plugins")
        .and_then(|p| p.get(plugin))
        .and_then(|c| c.as_table())
        .cloned()
        .unwrap_or_default();
    let containerd = table_at(&mut cri, "containerd");
    let default = containerd
        .get("default_runtime_name")
        .and_then(|v| v.as_str())
        .unwrap_or("runc")
        .to_string();
    containerd.insert("default_runtime_name".into(), default.clone().into());
    let runtimes = table_at(containerd, "runtimes");
    if !runtimes.contains_key(&default) {
        let runc: toml::Table = toml::from_str("runtime_type = \"io.containerd.runc.v2\"").map_err(|e| bad(&e))?;
        runtimes.insert(default, runc.into());
    }
    let gantry: toml::Table = toml::from_str(&format!("{RUNTIME_KEYS}\n[options]\n{OPTIONS}")).map_err(|e| bad(&e))?;
    runtimes.insert("gantry".into(), gantry.into());
    let mut plugins = toml::Table::new();
    plugins.insert(plugin.into(), cri.into());
    let mut doc = toml::Table::new();
    doc.insert("version".into(), 2.into());
    doc.insert("plugins".into(), plugins.into());
    let body = toml::to_string(&doc).map_err(|e| bad(&e))?;
    Ok(format!(
        "{HEADER}# containerd 1.x replaces a plugin section with an imported one whole: this is the main\n\
         # config's CRI section with gantry's runtime added, rewritten when the main config changes.\n{body}"
    ))
}

/// gantry's runtime table, the same in both layouts.
const RUNTIME_KEYS: &str = "runtime_type = \"io.containerd.gantry.v2\"\n\
    privileged_without_host_devices = true\n\
    pod_annotations = [\"gantry.dev/*\", \"cdi.k8s.io/*\"]\n\
    container_annotations = [\"gantry.dev/*\", \"cdi.k8s.io/*\"]\n";

/// The table under `key`, made if missing (a value that is not a table is replaced).
fn table_at<'t>(t: &'t mut toml::Table, key: &str) -> &'t mut toml::Table {
    if !t.get(key).is_some_and(|v| v.is_table()) {
        t.insert(key.into(), toml::Table::new().into());
    }
    match t.get_mut(key) {
        Some(toml::Value::Table(inner)) => inner,
        _ => unreachable!("a table was inserted above"),
    }
}

/// Whether containerd `version` would read the drop-in with `main` as its main config
/// (`None`: no file): through `imports` that cover it, or, from 2.2 on, through the default
/// `conf.d/*.toml` import when the main config sets no `imports` of its own.
pub fn dropin_imported(main: Option<&str>, version: (u32, u32)) -> bool {
    let imports = main.and_then(|t| toml::from_str::<toml::Table>(t).ok()).and_then(|t| {
        t.get("imports").and_then(|v| v.as_array().cloned()).map(|a| {
            a.iter()
                .filter_map(|v| v.as_str().map(String::from))
                .collect::<Vec<_>>()
        })
    });
    match imports {
        Some(list) => list.iter().any(|pattern| glob_match(pattern, CONTAINERD_DROPIN)),
        None => version >= (2, 2),
    }
}

/// `*` within one path component, as Go's filepath.Match reads the patterns people write.
fn glob_match(pattern: &str, path: &str) -> bool {
    let (p, s): (Vec<&str>, Vec<&str>) = (pattern.split('/').collect(), path.split('/').collect());
    p.len() == s.len()
        && p.iter()
            .zip(&s)
            .all(|(p, s)| component_match(p.as_bytes(), s.as_bytes()))
}

fn component_match(p: &[u8], s: &[u8]) -> bool {
    match p.split_first() {
        None => s.is_empty(),
        Some((b'*', rest)) => (0..=s.len()).any(|i| component_match(rest, &s[i..])),
        Some((c, rest)) => s.first() == Some(c) && component_match(rest, &s[1..]),
    }
}

/// How the drop-in was made visible to containerd, so uninstall undoes exactly that.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub enum Import {
    /// A main config was created holding only the import (there was none).
    CreatedMain(String),
    /// This line was inserted.
    Line(String),
    /// This text was inserted right after an `imports = [`.
    Entry(String),
}

/// `main` (the main config's text, `None` if absent) made to import the drop-in, and how.
pub fn add_import(main: Option<&str>, version: (u32, u32)) -> Result<(String, Import), InstallError> {
    let quoted = format!("\"{CONTAINERD_DROPIN}\"");
    let Some(text) = main else {
        let config = if version.0 >= 2 { 3 } else { 2 };
        let body = format!("{IMPORT_MARK}\nversion = {config}\nimports = [{quoted}]\n");
        return Ok((body.clone(), Import::CreatedMain(body)));
    };
    let first_table = text
        .lines()
        .position(|l| l.trim_start().starts_with('['))
        .unwrap_or(usize::MAX);
    let lines: Vec<&str> = text.split_inclusive('\n').collect();
    let mut at = 0;
    for (i, line) in lines.iter().enumerate().take(first_table) {
        let t = line.trim_start();
        if let Some(rest) = t.strip_prefix("imports").map(str::trim_start) {
            if let Some(after) = rest.strip_prefix('=').map(str::trim_start) {
                if !after.starts_with('[') {
                    return Err(InstallError::MainConfig("its `imports` is not an array".into()));
                }
                let offset: usize = lines[..i].iter().map(|l| l.len()).sum::<usize>() + line.find('[').unwrap_or(0) + 1;
                let entry = format!("{quoted}, ");
                let edited = format!("{}{entry}{}", &text[..offset], &text[offset..]);
                return checked(edited, Import::Entry(entry));
            }
        }
        if t.starts_with("version") {
            at = i + 1;
        }
    }
    let line = format!("imports = [{quoted}] {IMPORT_MARK}\n");
    let offset: usize = lines[..at.min(lines.len())].iter().map(|l| l.len()).sum();
    let sep = if offset > 0 && !text[..offset].ends_with('\n') {
        "\n"
    } else {
        ""
    };
    let edited = format!("{}{sep}{line}{}", &text[..offset], &text[offset..]);
    checked(edited, Import::Line(format!("{sep}{line}")))
}

/// The edit must leave a config that parses and imports the drop-in.
fn checked(edited: String, how: Import) -> Result<(String, Import), InstallError> {
    if dropin_imported(Some(&edited), (0, 0)) {
        Ok((edited, how))
    } else {
        Err(InstallError::MainConfig(
            "adding the import did not give a valid config".into(),
        ))
    }
}

/// The main config with `how` undone; `None`: remove the file.
pub fn remove_import(text: &str, how: &Import) -> Option<String> {
    match how {
        Import::CreatedMain(body) if text == body => None,
        Import::CreatedMain(_) => Some(text.to_string()),
        Import::Line(s) | Import::Entry(s) => Some(text.replacen(s.as_str(), "", 1)),
    }
}

/// The drop-in file this version writes for `engine`, with its content.
pub fn dropin(engine: &Engine, host: &Path, payload: &Path) -> Result<(PathBuf, Vec<u8>), InstallError> {
    let body = match engine {
        Engine::Crio => {
            let src = payload.join("runtime-conf/crio/99-gantry.conf");
            std::fs::read(&src).map_err(|e| InstallError::io("read", &src, e))?
        }
        Engine::Containerd { version } => {
            let main = std::fs::read_to_string(host_path(host, Path::new(CONTAINERD_MAIN))).ok();
            containerd_dropin(*version, main.as_deref())?.into_bytes()
        }
    };
    Ok((PathBuf::from(engine.dropin()), body))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn versions_as_packages_and_binaries_print_them() {
        assert_eq!(parse_version("1.6.20~ds1-1+deb12u3"), Some((1, 6)));
        assert_eq!(parse_version("v2.1.4"), Some((2, 1)));
        assert_eq!(parse_version("1:1.7.24-1"), Some((1, 7)));
        assert_eq!(parse_version("github.com/containerd/containerd"), None);
    }

    #[test]
    fn the_drop_in_is_imported_by_imports_or_by_2_2s_default() {
        assert!(!dropin_imported(None, (1, 6)));
        assert!(!dropin_imported(None, (2, 1)));
        assert!(dropin_imported(None, (2, 2)));
        assert!(dropin_imported(Some("version = 3\n"), (2, 2)));
        assert!(!dropin_imported(
            Some("version = 3\nimports = [\"/etc/x.toml\"]\n"),
            (2, 2)
        ));
        assert!(dropin_imported(
            Some("imports = [\"/etc/containerd/conf.d/*.toml\"]\n"),
            (1, 6)
        ));
        assert!(!dropin_imported(
            Some("imports = [\"/etc/containerd/*.toml\"]\n"),
            (1, 6)
        ));
    }

    #[test]
    fn an_import_is_added_and_removed_byte_for_byte() {
        let configs = [
            "version = 2\n\n[plugins.\"io.containerd.grpc.v1.cri\"]\n  sandbox_image = \"pause\"\n",
            "# comment\nversion = 2\nroot = \"/var/lib/containerd\"\n[grpc]\naddress = \"/x\"\n",
            "version = 3\nimports = [\"/etc/other.toml\"]\n[grpc]\n",
            "version = 2\nimports = [\n  \"/etc/a.toml\",\n]\n",
            "oom_score = 0",
        ];
        for text in configs {
            let (edited, how) = add_import(Some(text), (1, 6)).unwrap();
            assert!(dropin_imported(Some(&edited), (1, 6)), "{edited}");
            let before: toml::Table = toml::from_str(text).unwrap();
            let mut after: toml::Table = toml::from_str(&edited).unwrap();
            after.remove("imports");
            let mut before_less = before.clone();
            before_less.remove("imports");
            assert_eq!(before_less, after, "only imports changed in {edited}");
            assert_eq!(remove_import(&edited, &how).as_deref(), Some(text));
        }
        let (created, how) = add_import(None, (2, 0)).unwrap();
        assert!(created.contains("version = 3") && dropin_imported(Some(&created), (2, 0)));
        assert_eq!(remove_import(&created, &how), None);
        assert!(add_import(Some("imports = \"x\"\n"), (1, 6)).is_err());
    }

    #[test]
    fn the_containerd_drop_in_matches_the_layout_of_the_version() {
        for (version, plugin, config_path) in [
            ((1, 6), "io.containerd.grpc.v1.cri", Some("/etc/gantry/config.toml")),
            // 2.x: no options (they break user-namespace containers); the default path serves.
            ((2, 2), "io.containerd.cri.v1.runtime", None),
        ] {
            let text = containerd_dropin(version, None).unwrap();
            let t: toml::Table = toml::from_str(&text).unwrap();
            let gantry = &t["plugins"][plugin]["containerd"]["runtimes"]["gantry"];
            assert_eq!(gantry["runtime_type"].as_str(), Some("io.containerd.gantry.v2"));
            let path = gantry.get("options").and_then(|o| o["ConfigPath"].as_str());
            assert_eq!(path, config_path, "{version:?}");
        }
    }

    /// containerd 1.x replaces the CRI section with the imported one: the drop-in keeps the
    /// main config's CRI settings and runtimes, and always has the default runtime.
    #[test]
    fn a_1_x_drop_in_carries_the_main_configs_cri_section_and_the_default_runtime() {
        let debian = "version = 2\n[plugins]\n  [plugins.\"io.containerd.grpc.v1.cri\"]\n    [plugins.\"io.containerd.grpc.v1.cri\".cni]\n      bin_dir = \"/usr/lib/cni\"\n";
        let text = containerd_dropin((1, 6), Some(debian)).unwrap();
        let t: toml::Table = toml::from_str(&text).unwrap();
        let cri = &t["plugins"]["io.containerd.grpc.v1.cri"];
        assert_eq!(cri["cni"]["bin_dir"].as_str(), Some("/usr/lib/cni"));
        assert_eq!(cri["containerd"]["default_runtime_name"].as_str(), Some("runc"));
        assert_eq!(
            cri["containerd"]["runtimes"]["runc"]["runtime_type"].as_str(),
            Some("io.containerd.runc.v2")
        );
        assert!(cri["containerd"]["runtimes"]["gantry"].is_table());
        let custom = "version = 2\n[plugins.\"io.containerd.grpc.v1.cri\".containerd]\ndefault_runtime_name = \"crun\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.crun]\nruntime_type = \"io.containerd.runc.v2\"\n[plugins.\"io.containerd.grpc.v1.cri\".containerd.runtimes.crun.options]\nBinaryName = \"crun\"\n";
        let t: toml::Table = toml::from_str(&containerd_dropin((1, 7), Some(custom)).unwrap()).unwrap();
        let runtimes = &t["plugins"]["io.containerd.grpc.v1.cri"]["containerd"]["runtimes"];
        assert_eq!(runtimes["crun"]["options"]["BinaryName"].as_str(), Some("crun"));
        assert!(
            runtimes.get("runc").is_none(),
            "a runtime the config does not name was added"
        );
        assert!(containerd_dropin((1, 6), Some("not [toml")).is_err());
    }
}
