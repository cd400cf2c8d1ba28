//! The CDI spec file format (JSON or YAML), as serde types of gantry's own. Unknown fields are
//! refused, as by the Go and Rust CDI libraries, so a typo in a spec is an error naming it, not
//! a silently dropped edit. Kept in-tree because gantry needs nothing of the
//! `container-device-interface` crate but these types and its version table, and the crate
//! always pulls an HTTP/TLS stack and a JSON-schema engine into the build.

use std::collections::BTreeMap;

use serde::Deserialize;

/// One spec file.
#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct RawSpec {
    pub(super) cdi_version: String,
    pub(super) kind: String,
    #[serde(default)]
    pub(super) annotations: BTreeMap<String, String>,
    pub(super) devices: Vec<RawDevice>,
    pub(super) container_edits: Option<RawEdits>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct RawDevice {
    pub(super) name: String,
    #[serde(default)]
    pub(super) annotations: BTreeMap<String, String>,
    pub(super) container_edits: RawEdits,
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct RawEdits {
    pub(super) env: Option<Vec<String>>,
    pub(super) device_nodes: Option<Vec<RawNode>>,
    pub(super) net_devices: Option<Vec<RawNetDevice>>,
    pub(super) hooks: Option<Vec<RawHook>>,
    pub(super) mounts: Option<Vec<RawMount>>,
    pub(super) intel_rdt: Option<RawIntelRdt>,
    pub(super) additional_gids: Option<Vec<u32>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct RawNode {
    pub(super) path: String,
    pub(super) host_path: Option<String>,
    #[serde(rename = "type")]
    pub(super) typ: Option<String>,
    pub(super) major: Option<i64>,
    pub(super) minor: Option<i64>,
    pub(super) file_mode: Option<u32>,
    pub(super) permissions: Option<String>,
    pub(super) uid: Option<u32>,
    pub(super) gid: Option<u32>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct RawMount {
    pub(super) host_path: String,
    pub(super) container_path: String,
    #[serde(rename = "type")]
    pub(super) typ: Option<String>,
    pub(super) options: Option<Vec<String>>,
}

#[derive(Debug, Clone, Deserialize)]
#[serde(rename_all = "camelCase", deny_unknown_fields)]
pub(crate) struct RawHook {
    pub(super) hook_name: String,
    pub(super) path: String,
    pub(super) args: Option<Vec<String>>,
    pub(super) env: Option<Vec<String>>,
    pub(super) timeout: Option<i64>,
}

/// Intel RDT edits: parsed so a spec using them validates; gantry does not apply them.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawIntelRdt {
    #[serde(rename = "closID")]
    pub(super) _clos_id: Option<String>,
    #[serde(rename = "l3CacheSchema")]
    pub(super) _l3_cache_schema: Option<String>,
    #[serde(rename = "memBwSchema")]
    pub(super) _mem_bw_schema: Option<String>,
    pub(super) schemata: Option<Vec<String>>,
    #[serde(rename = "enableMonitoring")]
    pub(super) enable_monitoring: Option<bool>,
    #[serde(rename = "enableCMT")]
    pub(super) _enable_cmt: Option<bool>,
    #[serde(rename = "enableMBM")]
    pub(super) _enable_mbm: Option<bool>,
}

/// Network device edits: parsed so a spec using them validates; gantry does not apply them.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct RawNetDevice {
    #[serde(rename = "hostInterfaceName")]
    pub(super) _host_interface_name: String,
    #[serde(rename = "name")]
    pub(super) _name: String,
}

/// Parses a spec file's bytes (`json` by its extension, else YAML).
pub(super) fn parse(data: &[u8], json: bool) -> Result<RawSpec, String> {
    if json {
        serde_json::from_slice(data).map_err(|e| e.to_string())
    } else {
        serde_yaml_ng::from_slice(data).map_err(|e| e.to_string())
    }
}

/// Whether a spec uses a field that a version introduced.
type Needs = Option<fn(&RawSpec) -> bool>;

/// Released CDI spec versions gantry reads, oldest first, each with the test for fields that
/// need it (a spec must declare at least the newest version whose fields it uses).
pub(super) const VERSIONS: [(&str, Needs); 10] = [
    ("0.1.0", None),
    ("0.2.0", None),
    ("0.3.0", None),
    ("0.4.0", Some(needs_0_4)),
    ("0.5.0", Some(needs_0_5)),
    ("0.6.0", Some(needs_0_6)),
    ("0.7.0", Some(needs_0_7)),
    ("0.8.0", None),
    ("1.0.0", None),
    ("1.1.0", Some(needs_1_1)),
];

/// `major.minor.patch` (an optional leading `v`) as numbers; `None` when not a version.
pub(super) fn parse_version(v: &str) -> Option<(u64, u64, u64)> {
    let mut parts = v.trim_start_matches('v').split('.').map(|p| p.parse::<u64>().ok());
    let version = (parts.next()??, parts.next()??, parts.next()??);
    parts.next().is_none().then_some(version)
}

/// The oldest version that covers every field the spec uses (0.3.0 at least).
pub(super) fn required_version(s: &RawSpec) -> &'static str {
    VERSIONS
        .iter()
        .rev()
        .find(|(_, needs)| needs.is_some_and(|f| f(s)))
        .map(|(v, _)| *v)
        .unwrap_or("0.3.0")
}

fn all_edits(s: &RawSpec) -> impl Iterator<Item = &RawEdits> {
    s.container_edits
        .iter()
        .chain(s.devices.iter().map(|d| &d.container_edits))
}

/// Mounts with a type.
fn needs_0_4(s: &RawSpec) -> bool {
    all_edits(s)
        .flat_map(|e| e.mounts.iter().flatten())
        .any(|m| m.typ.as_deref().is_some_and(|t| !t.is_empty()))
}

/// Device names starting with something other than a letter, or nodes with a hostPath.
fn needs_0_5(s: &RawSpec) -> bool {
    let odd_name = s
        .devices
        .iter()
        .any(|d| !d.name.chars().next().is_some_and(char::is_alphabetic));
    let host_path = all_edits(s)
        .flat_map(|e| e.device_nodes.iter().flatten())
        .any(|n| n.host_path.as_deref().is_some_and(|p| !p.is_empty()));
    odd_name || host_path
}

/// Annotations, or a class with a dot in it.
fn needs_0_6(s: &RawSpec) -> bool {
    let annotated = !s.annotations.is_empty() || s.devices.iter().any(|d| !d.annotations.is_empty());
    let dotted_class = s
        .kind
        .split_once('/')
        .is_some_and(|(vendor, class)| !vendor.is_empty() && class.contains('.'));
    annotated || dotted_class
}

/// Intel RDT edits or additional GIDs.
fn needs_0_7(s: &RawSpec) -> bool {
    all_edits(s).any(|e| e.intel_rdt.is_some() || e.additional_gids.as_ref().is_some_and(|g| !g.is_empty()))
}

/// Network devices, or RDT schemata or monitoring.
fn needs_1_1(s: &RawSpec) -> bool {
    all_edits(s).any(|e| {
        e.net_devices.as_ref().is_some_and(|n| !n.is_empty())
            || e.intel_rdt
                .as_ref()
                .is_some_and(|r| r.schemata.is_some() || r.enable_monitoring.is_some())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn spec(json: &str) -> RawSpec {
        parse(json.as_bytes(), true).unwrap()
    }

    #[test]
    fn versions_parse_and_order() {
        assert_eq!(parse_version("0.5.0"), Some((0, 5, 0)));
        assert_eq!(parse_version("v1.1.0"), Some((1, 1, 0)));
        assert_eq!(parse_version("1.1"), None);
        assert_eq!(parse_version("1.1.0.0"), None);
        assert_eq!(parse_version("x.1.0"), None);
        let parsed: Vec<_> = VERSIONS.iter().map(|(v, _)| parse_version(v).unwrap()).collect();
        assert!(parsed.windows(2).all(|w| w[0] < w[1]), "oldest first");
    }

    #[test]
    fn each_field_needs_its_version() {
        let base = |edits: &str, name: &str| {
            format!(
                r#"{{"cdiVersion":"0.3.0","kind":"a.com/b","devices":[{{"name":"{name}","containerEdits":{edits}}}]}}"#
            )
        };
        let cases = [
            (base(r#"{"env":["A=1"]}"#, "dev"), "0.3.0"),
            (
                base(
                    r#"{"mounts":[{"hostPath":"/a","containerPath":"/b","type":"bind"}]}"#,
                    "dev",
                ),
                "0.4.0",
            ),
            (base(r#"{"env":["A=1"]}"#, "0"), "0.5.0"),
            (
                base(r#"{"deviceNodes":[{"path":"/dev/x","hostPath":"/dev/y"}]}"#, "dev"),
                "0.5.0",
            ),
            (
                base(r#"{"env":["A=1"]}"#, "dev").replace("a.com/b", "a.com/b.c"),
                "0.6.0",
            ),
            (base(r#"{"additionalGids":[5]}"#, "dev"), "0.7.0"),
            (base(r#"{"intelRdt":{"closID":"c"}}"#, "dev"), "0.7.0"),
            (base(r#"{"intelRdt":{"schemata":["L3:0=f"]}}"#, "dev"), "1.1.0"),
            (
                base(r#"{"netDevices":[{"hostInterfaceName":"eth1","name":"net0"}]}"#, "dev"),
                "1.1.0",
            ),
        ];
        for (json, want) in cases {
            assert_eq!(required_version(&spec(&json)), want, "{json}");
        }
    }

    #[test]
    fn unknown_fields_and_wrong_types_are_refused_in_json_and_yaml() {
        let typo =
            r#"{"cdiVersion":"0.5.0","kind":"a.com/b","devices":[{"name":"d","containerEdits":{"envv":["A=1"]}}]}"#;
        assert!(parse(typo.as_bytes(), true).unwrap_err().contains("envv"));
        let yaml = "cdiVersion: 0.5.0\nkind: a.com/b\ndevices:\n  - name: d\n    containerEdits:\n      deviceNodes:\n        - path: /dev/x\n          major: nope\n";
        assert!(parse(yaml.as_bytes(), false).is_err());
        let ok = "cdiVersion: 0.5.0\nkind: a.com/b\ndevices:\n  - name: d\n    containerEdits:\n      env: [A=1]\n";
        assert_eq!(parse(ok.as_bytes(), false).unwrap().devices[0].name, "d");
    }
}
