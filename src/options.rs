//! Runtime options engines pass in `CreateTaskRequest.options` and on `start`'s stdin:
//! containerd's runc `Options`, CRI's `runtimeoptions.v1.Options{config_path}`, or
//! containerd 2.3's `BootstrapParams` wrapping either.

use containerd_shim_protos::bootstrap_api::BootstrapParams;
use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::{CodedInputStream, Message};
use containerd_shim_protos::shim::oci::Options as RuncOptions;

/// What gantry takes from the engine's options.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EngineOptions {
    pub binary_name: Option<String>,
    pub root: Option<String>,
    pub systemd_cgroup: bool,
    pub config_path: Option<String>,
    /// containerd 2.x's `BootstrapParams.socket_dir` (only on `start`'s stdin).
    pub socket_dir: Option<String>,
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

/// Decodes `runtimeoptions.v1.Options`: field 1 `type_url`, field 2 `config_path`.
fn runtimeoptions_config_path(value: &[u8]) -> Option<String> {
    let mut is = CodedInputStream::from_bytes(value);
    let mut path = None;
    while let Ok(Some(tag)) = is.read_raw_tag_or_eof() {
        match tag {
            // field 2, wire type 2 (length-delimited)
            18 => path = is.read_string().ok(),
            10 => {
                is.read_string().ok()?;
            }
            _ => is
                .skip_field(containerd_shim_protos::protobuf::rt::WireType::new(tag & 7)?)
                .ok()?,
        }
    }
    path.filter(|p| !p.is_empty())
}

/// Reads an options `Any`; unknown types yield defaults (never an error: `start` must not fail).
pub fn from_any(any: &Any) -> EngineOptions {
    let url = any.type_url.trim_start_matches("type.googleapis.com/");
    if url.ends_with("runc.v1.Options") {
        if let Ok(o) = RuncOptions::parse_from_bytes(&any.value) {
            return EngineOptions {
                binary_name: non_empty(&o.binary_name),
                root: non_empty(&o.root),
                systemd_cgroup: o.systemd_cgroup,
                ..Default::default()
            };
        }
    }
    if url.ends_with("runtimeoptions.v1.Options") {
        return EngineOptions {
            config_path: runtimeoptions_config_path(&any.value),
            ..Default::default()
        };
    }
    EngineOptions::default()
}

/// Interprets `start`'s stdin. BootstrapParams count only when they name this container
/// (a legacy `Any` also parses as BootstrapParams, with its type URL as instance id).
pub fn from_stdin(data: &[u8], id: &str, namespace: &str) -> EngineOptions {
    if data.is_empty() {
        return EngineOptions::default();
    }
    if let Ok(p) = BootstrapParams::parse_from_bytes(data) {
        if p.instance_id == id && p.namespace == namespace {
            let options = p
                .extensions
                .iter()
                .filter_map(|e| e.value.as_ref())
                .map(from_any)
                .find(|o| *o != EngineOptions::default())
                .unwrap_or_default();
            return EngineOptions {
                socket_dir: p.socket_dir.clone().filter(|d| !d.is_empty()),
                ..options
            };
        }
    }
    Any::parse_from_bytes(data).map(|a| from_any(&a)).unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;
    use containerd_shim_protos::bootstrap_api::Extension;

    fn runc_any() -> Any {
        let o = RuncOptions {
            binary_name: "crun".into(),
            root: "/run/x".into(),
            ..Default::default()
        };
        Any {
            type_url: "containerd.runc.v1.Options".into(),
            value: o.write_to_bytes().unwrap(),
            ..Default::default()
        }
    }

    fn runtimeoptions_any(path: &str) -> Any {
        // type_url = "" (field 1), config_path (field 2)
        let mut v = vec![18u8, path.len() as u8];
        v.extend_from_slice(path.as_bytes());
        Any {
            type_url: "runtimeoptions.v1.Options".into(),
            value: v,
            ..Default::default()
        }
    }

    #[test]
    fn every_stdin_form() {
        // empty (CRI-O)
        assert_eq!(from_stdin(b"", "c", "default"), EngineOptions::default());
        // legacy runc Options Any (containerd <= 2.2)
        let o = from_stdin(&runc_any().write_to_bytes().unwrap(), "c", "k8s.io");
        assert_eq!(o.binary_name.as_deref(), Some("crun"));
        assert_eq!(o.root.as_deref(), Some("/run/x"));
        // runtimeoptions Any
        let o = from_stdin(&runtimeoptions_any("/etc/g.toml").write_to_bytes().unwrap(), "c", "ns");
        assert_eq!(o.config_path.as_deref(), Some("/etc/g.toml"));
        // BootstrapParams that match the flags
        let mut ext = Extension::new();
        ext.value = containerd_shim_protos::protobuf::MessageField::some(runc_any());
        let p = BootstrapParams {
            instance_id: "c".into(),
            namespace: "k8s.io".into(),
            extensions: vec![ext],
            ..Default::default()
        };
        let bytes = p.write_to_bytes().unwrap();
        assert_eq!(from_stdin(&bytes, "c", "k8s.io").binary_name.as_deref(), Some("crun"));
        // ... and ones that do not: ignored, never an error
        assert_eq!(from_stdin(&bytes, "other", "k8s.io"), EngineOptions::default());
        // garbage
        assert_eq!(from_stdin(&[0xff, 0xff, 0x01], "c", "ns"), EngineOptions::default());
    }

    /// containerd 2.3 always sends `socket_dir` (field 9), with or without options.
    #[test]
    fn the_engines_socket_directory_is_taken_from_bootstrap_params() {
        let p = BootstrapParams {
            instance_id: "c".into(),
            namespace: "k8s.io".into(),
            socket_dir: Some("/run/containerd/s".into()),
            ..Default::default()
        };
        let bytes = p.write_to_bytes().unwrap();
        assert_eq!(bytes[bytes.len() - 19..][..2], [0x4a, 17], "field 9, length-delimited");
        let o = from_stdin(&bytes, "c", "k8s.io");
        assert_eq!(o.socket_dir.as_deref(), Some("/run/containerd/s"));
        assert_eq!(o.binary_name, None);
        assert_eq!(from_stdin(&bytes, "other", "k8s.io").socket_dir, None);
    }
}
