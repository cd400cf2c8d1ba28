//! CDI's semantic checks on a parsed spec: version, kind, device names,
//! annotations and container edits, as Go's `cdi.Cache` applies them for
//! containerd and CRI-O (which run no JSON-schema pass by default).
//!
//! No JSON-schema pass (the Rust CDI crate's always adds one, whose dependencies were half of
//! the shim's code): serde's typed parse already rejects wrongly shaped specs.

use std::collections::{BTreeMap, HashSet};

use super::cdi_spec::{parse_version, required_version, RawEdits, RawSpec, VERSIONS};

/// Kubernetes' limit on all annotations of one object, which CDI reuses.
const ANNOTATIONS_SIZE_LIMIT: usize = 256 * 1024;

/// Checks a parsed spec; the error says what is wrong and where.
pub(super) fn check(s: &RawSpec) -> Result<(), String> {
    let declared = parse_version(&s.cdi_version)
        .filter(|d| VERSIONS.iter().any(|(v, _)| parse_version(v) == Some(*d)))
        .ok_or_else(|| format!("invalid cdiVersion {:?}", s.cdi_version))?;
    let needed = required_version(s);
    if parse_version(needed).is_some_and(|n| n > declared) {
        return Err(format!(
            "cdiVersion {} is too old for the fields used: needs at least {needed}",
            s.cdi_version
        ));
    }
    let (vendor, class) = s.kind.split_once('/').unwrap_or((s.kind.as_str(), ""));
    check_name(vendor, false).map_err(|e| format!("kind {:?}: invalid vendor: {e}", s.kind))?;
    check_name(class, false).map_err(|e| format!("kind {:?}: invalid class: {e}", s.kind))?;
    check_annotations(&s.annotations).map_err(|e| format!("annotations: {e}"))?;
    if let Some(edits) = &s.container_edits {
        check_edits(edits).map_err(|e| format!("containerEdits: {e}"))?;
    }
    if s.devices.is_empty() {
        return Err("no devices".into());
    }
    let mut seen = HashSet::new();
    for d in &s.devices {
        let at = |e: String| format!("device {:?}: {e}", d.name);
        check_name(&d.name, true).map_err(at)?;
        if !seen.insert(d.name.as_str()) {
            return Err(at("defined twice".into()));
        }
        check_annotations(&d.annotations).map_err(|e| at(format!("annotations: {e}")))?;
        if d.container_edits.is_empty() {
            return Err(at("no containerEdits".into()));
        }
        check_edits(&d.container_edits).map_err(|e| at(format!("containerEdits: {e}")))?;
    }
    Ok(())
}

/// Vendor and class: a letter first, a letter or digit last, `-_.` between;
/// device names may also start with a digit and contain `:`.
fn check_name(name: &str, device: bool) -> Result<(), String> {
    let first = name.chars().next().ok_or("empty name")?;
    if !(first.is_ascii_alphabetic() || device && first.is_ascii_digit()) {
        return Err(format!(
            "{name:?} must start with a letter{}",
            if device { " or digit" } else { "" }
        ));
    }
    if !name.ends_with(|c: char| c.is_ascii_alphanumeric()) {
        return Err(format!("{name:?} must end with a letter or digit"));
    }
    let allowed = |c: char| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.') || device && c == ':';
    match name.chars().find(|&c| !allowed(c)) {
        Some(c) => Err(format!("invalid character {c:?} in {name:?}")),
        None => Ok(()),
    }
}

/// Kubernetes annotation rules: keys are qualified names (`[prefix/]name`),
/// total size at most 256 KiB.
fn check_annotations(annotations: &BTreeMap<String, String>) -> Result<(), String> {
    for key in annotations.keys() {
        check_qualified_name(&key.to_ascii_lowercase()).map_err(|e| format!("key {key:?}: {e}"))?;
    }
    let size: usize = annotations.iter().map(|(k, v)| k.len() + v.len()).sum();
    if size > ANNOTATIONS_SIZE_LIMIT {
        return Err(format!("total size {size} exceeds {ANNOTATIONS_SIZE_LIMIT}"));
    }
    Ok(())
}

fn check_qualified_name(key: &str) -> Result<(), String> {
    let (prefix, name) = match key.split_once('/') {
        Some((p, n)) => (Some(p), n),
        None => (None, key),
    };
    if let Some(prefix) = prefix {
        let label_ok = |l: &str| {
            !l.is_empty()
                && l.starts_with(|c: char| c.is_ascii_alphanumeric())
                && l.ends_with(|c: char| c.is_ascii_alphanumeric())
                && l.chars()
                    .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '-')
        };
        if prefix.len() > 253 || !prefix.split('.').all(label_ok) {
            return Err("prefix must be a DNS subdomain".into());
        }
    }
    let ok = !name.is_empty()
        && name.len() <= 63
        && name.starts_with(|c: char| c.is_ascii_alphanumeric())
        && name.ends_with(|c: char| c.is_ascii_alphanumeric())
        && name
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || matches!(c, '-' | '_' | '.'));
    if ok {
        Ok(())
    } else {
        Err("name must be 1-63 alphanumerics with '-', '_' or '.' inside".into())
    }
}

impl RawEdits {
    pub(super) fn is_empty(&self) -> bool {
        self.env.as_ref().is_none_or(Vec::is_empty)
            && self.device_nodes.as_ref().is_none_or(Vec::is_empty)
            && self.hooks.as_ref().is_none_or(Vec::is_empty)
            && self.mounts.as_ref().is_none_or(Vec::is_empty)
            && self.additional_gids.as_ref().is_none_or(Vec::is_empty)
            && self.intel_rdt.is_none()
            && self.net_devices.as_ref().is_none_or(Vec::is_empty)
    }
}

fn check_env(env: &[String]) -> Result<(), String> {
    match env.iter().find(|v| v.split_once('=').is_none_or(|(k, _)| k.is_empty())) {
        Some(bad) => Err(format!("env {bad:?}: want NAME=value")),
        None => Ok(()),
    }
}

const HOOK_NAMES: [&str; 6] = [
    "prestart",
    "createRuntime",
    "createContainer",
    "startContainer",
    "poststart",
    "poststop",
];

fn check_edits(e: &RawEdits) -> Result<(), String> {
    check_env(e.env.as_deref().unwrap_or_default())?;
    for n in e.device_nodes.iter().flatten() {
        if n.path.is_empty() {
            return Err("deviceNodes: empty path".into());
        }
        if let Some(t) = n.typ.as_deref().filter(|t| !matches!(*t, "" | "b" | "c" | "u" | "p")) {
            return Err(format!("device node {}: invalid type {t:?}", n.path));
        }
        if let Some(p) = n
            .permissions
            .as_deref()
            .filter(|p| !p.chars().all(|c| matches!(c, 'r' | 'w' | 'm')))
        {
            return Err(format!("device node {}: invalid permissions {p:?}", n.path));
        }
    }
    for h in e.hooks.iter().flatten() {
        if !HOOK_NAMES.contains(&h.hook_name.as_str()) {
            return Err(format!("invalid hook name {:?}", h.hook_name));
        }
        if h.path.is_empty() {
            return Err(format!("hook {:?}: empty path", h.hook_name));
        }
        check_env(h.env.as_deref().unwrap_or_default()).map_err(|err| format!("hook {:?}: {err}", h.hook_name))?;
    }
    for m in e.mounts.iter().flatten() {
        if m.host_path.is_empty() || m.container_path.is_empty() {
            return Err(format!("mount {:?} -> {:?}: empty path", m.host_path, m.container_path));
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check_json(json: &str) -> Result<(), String> {
        check(&super::super::cdi_spec::parse(json.as_bytes(), true).expect("spec parses"))
    }

    fn spec_with(kind: &str, device: &str, edits: &str) -> String {
        format!(
            r#"{{"cdiVersion":"0.5.0","kind":"{kind}","devices":[{{"name":"{device}","containerEdits":{edits}}}]}}"#
        )
    }

    const NODE: &str = r#"{"deviceNodes":[{"path":"/dev/nvidia0"}]}"#;

    #[test]
    fn accepts_nvidia_ctk_shape() {
        let json = r#"{"cdiVersion":"0.6.0","kind":"nvidia.com/gpu",
            "annotations":{"cdi.k8s.io/gen":"nvidia-ctk"},
            "devices":[{"name":"0","containerEdits":{"deviceNodes":[{"path":"/dev/nvidia0"}]}},
                       {"name":"GPU-1f2e:mig-1","containerEdits":{"env":["A=1"]}}],
            "containerEdits":{"env":["NVIDIA_VISIBLE_DEVICES=void"],
              "hooks":[{"hookName":"createContainer","path":"/usr/bin/nvidia-ctk","args":["x"]}],
              "mounts":[{"hostPath":"/usr/lib/libcuda.so.1","containerPath":"/usr/lib/libcuda.so.1"}]}}"#;
        assert_eq!(check_json(json), Ok(()));
    }

    #[test]
    fn rejects_each_broken_part_naming_it() {
        let cases = [
            (
                spec_with("nvidia.com/gpu", "0", NODE).replace("0.5.0", "9.9.9"),
                "cdiVersion",
            ),
            (spec_with("nvidia.com", "0", NODE), "class"),
            (spec_with("1vendor/gpu", "0", NODE), "vendor"),
            (spec_with("nvidia.com/g(pu", "0", NODE), "class"),
            (spec_with("nvidia.com/gpu", "gpu 0", NODE), "device \"gpu 0\""),
            (spec_with("nvidia.com/gpu", "0-", NODE), "end with"),
            (spec_with("nvidia.com/gpu", "0", "{}"), "no containerEdits"),
            (spec_with("nvidia.com/gpu", "0", r#"{"env":["=x"]}"#), "env"),
            (
                spec_with("nvidia.com/gpu", "0", r#"{"deviceNodes":[{"path":""}]}"#),
                "empty path",
            ),
            (
                spec_with(
                    "nvidia.com/gpu",
                    "0",
                    r#"{"deviceNodes":[{"path":"/dev/x","type":"z"}]}"#,
                ),
                "type",
            ),
            (
                spec_with(
                    "nvidia.com/gpu",
                    "0",
                    r#"{"deviceNodes":[{"path":"/dev/x","permissions":"rx"}]}"#,
                ),
                "permissions",
            ),
            (
                spec_with("nvidia.com/gpu", "0", r#"{"hooks":[{"hookName":"later","path":"/x"}]}"#),
                "hook name",
            ),
            (
                spec_with(
                    "nvidia.com/gpu",
                    "0",
                    r#"{"mounts":[{"hostPath":"","containerPath":"/x"}]}"#,
                ),
                "mount",
            ),
            (
                r#"{"cdiVersion":"0.5.0","kind":"a.com/b","devices":[
                    {"name":"0","containerEdits":{"env":["A=1"]}},{"name":"0","containerEdits":{"env":["A=1"]}}]}"#
                    .to_string(),
                "defined twice",
            ),
            (
                r#"{"cdiVersion":"0.5.0","kind":"a.com/b","devices":[]}"#.to_string(),
                "no devices",
            ),
            (
                r#"{"cdiVersion":"0.6.0","kind":"a.com/b","annotations":{"bad key!":"x"},
                    "devices":[{"name":"0","containerEdits":{"env":["A=1"]}}]}"#
                    .to_string(),
                "bad key!",
            ),
        ];
        for (json, want) in cases {
            let err = check_json(&json).expect_err(&json);
            assert!(err.contains(want), "{json}: {err}");
        }
    }

    #[test]
    fn version_must_cover_the_fields_used() {
        // intelRdt needs cdiVersion 0.7.0 or later
        let json = spec_with("a.com/b", "0", r#"{"intelRdt":{"closID":"c"}}"#).replace("0.5.0", "0.3.0");
        let err = check_json(&json).expect_err("too old");
        assert!(err.contains("at least"), "{err}");
        assert_eq!(check_json(&json.replace("0.3.0", "0.7.0")), Ok(()));
    }

    #[test]
    fn annotation_size_is_bounded() {
        let big = "x".repeat(ANNOTATIONS_SIZE_LIMIT);
        let json = format!(
            r#"{{"cdiVersion":"0.6.0","kind":"a.com/b","annotations":{{"k":"{big}"}},
                "devices":[{{"name":"0","containerEdits":{{"env":["A=1"]}}}}]}}"#
        );
        assert!(check_json(&json).expect_err("too big").contains("exceeds"));
    }
}
