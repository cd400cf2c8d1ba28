//! Reading the bundle's `config.json` and the edits gantry makes to it before the OCI runtime
//! sees it. Each edit is a small function over the parsed spec (devices live in
//! [`crate::devices`]); [`edit`] runs them in order and says whether anything changed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use oci_spec::runtime::Spec;
use serde_json::Value;
use thiserror::Error;

use crate::config::Config;
use crate::devices::{self, DeviceError, Injection};

pub const CRIO_SANDBOX_ID: &str = "io.kubernetes.cri-o.SandboxID";
pub const CRIO_CONTAINER_TYPE: &str = "io.kubernetes.cri-o.ContainerType";
pub const CRI_SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";
pub const CRI_CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
pub const RUNC_GROUP: &str = "io.containerd.runc.v2.group";

#[derive(Debug, Error)]
pub enum SpecError {
    #[error("invalid id {id:?}: {why}")]
    Id { id: String, why: &'static str },
    #[error("read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("malformed {path}: {source}")]
    Parse { path: PathBuf, source: serde_json::Error },
    #[error("write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    #[error(transparent)]
    Devices(#[from] DeviceError),
}

/// Ids become file and directory names: refuse anything that could escape or confuse them.
pub fn validate_id(id: &str) -> Result<(), SpecError> {
    let bad = |why| {
        Err(SpecError::Id {
            id: id.to_string(),
            why,
        })
    };
    if id.is_empty() {
        return bad("empty");
    }
    if id.len() > 1024 {
        return bad("longer than 1024 bytes");
    }
    if id == "." || id == ".." || id.contains("..") {
        return bad("contains \"..\"");
    }
    if !id
        .chars()
        .all(|c| c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.' | '+' | '@' | ':'))
    {
        return bad("only letters, digits and _ - . + @ : are allowed");
    }
    Ok(())
}

pub fn config_path(bundle: &Path) -> PathBuf {
    bundle.join("config.json")
}

/// Reads and parses `config.json`; the raw bytes are returned too so a failed create can
/// restore the file exactly.
pub fn load(bundle: &Path) -> Result<(Spec, Vec<u8>), SpecError> {
    let path = config_path(bundle);
    let raw = std::fs::read(&path).map_err(|source| SpecError::Read {
        path: path.clone(),
        source,
    })?;
    let spec = serde_json::from_slice(&raw).map_err(|source| SpecError::Parse { path, source })?;
    Ok((spec, raw))
}

/// Only the annotations of the bundle's config.json: `start` needs nothing else, and skipping
/// the rest is cheaper than building a whole `Spec` in a process that lives a millisecond.
pub fn load_annotations(bundle: &Path) -> Result<HashMap<String, String>, SpecError> {
    #[derive(serde::Deserialize)]
    struct Annotated {
        #[serde(default)]
        annotations: Option<HashMap<String, String>>,
    }
    let path = config_path(bundle);
    let raw = std::fs::read(&path).map_err(|source| SpecError::Read {
        path: path.clone(),
        source,
    })?;
    let a: Annotated = serde_json::from_slice(&raw).map_err(|source| SpecError::Parse { path, source })?;
    Ok(a.annotations.unwrap_or_default())
}

/// Writes the edited spec back over `raw` (the file as read) without losing what oci-spec does
/// not model: vendor extensions and fields newer than the crate survive wherever the edits left
/// that part of the document alone, so runc sees what the engine wrote plus the edits.
pub fn save(bundle: &Path, raw: &[u8], spec: &Spec) -> Result<(), SpecError> {
    let path = config_path(bundle);
    let write_err = |e: serde_json::Error| SpecError::Write {
        path: path.clone(),
        source: std::io::Error::other(e),
    };
    let edited = serde_json::to_value(spec).map_err(write_err)?;
    let original: Value = serde_json::from_slice(raw).map_err(write_err)?;
    let modelled = serde_json::from_slice::<Spec>(raw)
        .and_then(serde_json::to_value)
        .map_err(write_err)?;
    let data = serde_json::to_vec(&carry_unmodelled(original, &modelled, edited)).map_err(write_err)?;
    std::fs::write(&path, data).map_err(|source| SpecError::Write { path, source })
}

/// `edited`, plus what the typed round trip of `original` (`modelled`) dropped. Objects keep
/// the keys oci-spec does not know; array elements the edits kept (equal to their modelled
/// form, wherever they moved) come back whole; anything the edits changed is theirs.
fn carry_unmodelled(original: Value, modelled: &Value, edited: Value) -> Value {
    if *modelled == edited {
        return original;
    }
    match (original, modelled, edited) {
        (Value::Object(orig), Value::Object(known), Value::Object(mut out)) => {
            for (k, v) in orig {
                match (known.get(&k), out.remove(&k)) {
                    (None, _) => {
                        out.insert(k, v);
                    }
                    (Some(m), Some(e)) => {
                        out.insert(k, carry_unmodelled(v, m, e));
                    }
                    // The edits removed a field the model knows: it stays removed.
                    (Some(_), None) => {}
                }
            }
            Value::Object(out)
        }
        (Value::Array(orig), Value::Array(known), Value::Array(out)) => {
            let mut unused: Vec<Option<Value>> = orig.into_iter().map(Some).collect();
            out.into_iter()
                .map(|e| {
                    let kept = known
                        .iter()
                        .zip(unused.iter_mut())
                        .find(|(m, o)| o.is_some() && **m == e)
                        .and_then(|(_, o)| o.take());
                    kept.unwrap_or(e)
                })
                .collect()
        }
        (_, _, edited) => edited,
    }
}

/// Annotations of a spec, empty when absent.
pub fn annotations(spec: &Spec) -> HashMap<String, String> {
    spec.annotations().clone().unwrap_or_default()
}

/// The pod a container belongs to, so all of a pod's containers share one daemon.
pub fn group_id(annotations: &HashMap<String, String>) -> Option<String> {
    [CRIO_SANDBOX_ID, CRI_SANDBOX_ID, RUNC_GROUP]
        .iter()
        .find_map(|k| annotations.get(*k).filter(|v| !v.is_empty()).cloned())
}

/// True for containers CRI-O created (it expects `<bundle>/oom` on OOM kills).
pub fn is_crio(annotations: &HashMap<String, String>) -> bool {
    annotations.contains_key(CRIO_SANDBOX_ID) || annotations.contains_key(CRIO_CONTAINER_TYPE)
}

/// The container's root filesystem as the runtime will resolve it.
pub fn root_path(bundle: &Path, spec: &Spec) -> PathBuf {
    let root = spec
        .root()
        .as_ref()
        .map(|r| r.path().clone())
        .unwrap_or_else(|| PathBuf::from("rootfs"));
    if root.is_absolute() {
        root
    } else {
        bundle.join(root)
    }
}

/// What the edits did, for logs and annotations.
#[derive(Debug, Default)]
pub struct Edits {
    pub devices: Injection,
}

impl Edits {
    pub fn changed(&self) -> bool {
        !self.devices.devices.is_empty()
    }
}

/// Runs every spec edit in order.
pub fn edit(spec: &mut Spec, config: &Config) -> Result<Edits, SpecError> {
    let privileged = devices::is_privileged(spec);
    let devices = devices::inject(spec, &config.devices, privileged)?;
    Ok(Edits { devices })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids() {
        for ok in ["abc", "a-b_c.d", "k8s_POD_x_1", "0123456789abcdef"] {
            assert!(validate_id(ok).is_ok(), "{ok}");
        }
        for bad in ["", "a/b", "..", "../x", "a..b", "a b", "x\0"] {
            assert!(validate_id(bad).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn grouping_annotations() {
        let mut a = HashMap::new();
        assert_eq!(group_id(&a), None);
        a.insert(CRI_SANDBOX_ID.to_string(), "pod1".to_string());
        assert_eq!(group_id(&a).as_deref(), Some("pod1"));
        a.insert(CRIO_SANDBOX_ID.to_string(), "pod2".to_string());
        assert_eq!(group_id(&a).as_deref(), Some("pod2"));
        assert!(is_crio(&a));
    }

    /// A config.json as a newer engine might write it: vendor keys at several depths.
    const WITH_UNMODELLED: &str = r#"{
        "ociVersion": "1.2.0",
        "hostname": "h",
        "x-vendor": {"keep": true},
        "process": {"cwd": "/", "args": ["sh"], "user": {"uid": 0, "gid": 0}, "env": ["A=1"], "x-proc": 7},
        "root": {"path": "rootfs"},
        "mounts": [
            {"destination": "/proc", "type": "proc", "source": "proc", "x-mount": "m"},
            {"destination": "/dev", "type": "tmpfs", "source": "tmpfs"}
        ],
        "linux": {"namespaces": [{"type": "pid"}], "x-linux": [1, 2]}
    }"#;

    fn edited_and_saved(edit: impl FnOnce(&mut Spec)) -> Value {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), WITH_UNMODELLED).unwrap();
        let (mut spec, raw) = load(dir.path()).unwrap();
        edit(&mut spec);
        save(dir.path(), &raw, &spec).unwrap();
        let saved = std::fs::read(dir.path().join("config.json")).unwrap();
        // What runc gets must still be a spec.
        serde_json::from_slice::<Spec>(&saved).unwrap();
        serde_json::from_slice(&saved).unwrap()
    }

    #[test]
    fn save_keeps_unmodelled_fields_next_to_edits() {
        use oci_spec::runtime::MountBuilder;
        let saved = edited_and_saved(|spec| {
            let mut mounts = spec.mounts().clone().unwrap();
            let gpu = MountBuilder::default()
                .destination("/usr/lib/libcuda.so")
                .source("/host/libcuda.so")
                .options(vec!["ro".to_string(), "bind".to_string()])
                .build()
                .unwrap();
            // Edits may reorder as well as add.
            mounts.insert(0, gpu);
            spec.set_mounts(Some(mounts));
            let mut process = spec.process().clone().unwrap();
            process.set_env(Some(vec!["A=1".into(), "NVIDIA_VISIBLE_DEVICES=0".into()]));
            spec.set_process(Some(process));
        });
        assert_eq!(saved["x-vendor"], serde_json::json!({"keep": true}));
        assert_eq!(saved["linux"]["x-linux"], serde_json::json!([1, 2]));
        assert_eq!(saved["process"]["x-proc"], 7);
        assert_eq!(saved["process"]["env"][1], "NVIDIA_VISIBLE_DEVICES=0");
        let dests: Vec<_> = saved["mounts"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["destination"].clone())
            .collect();
        assert_eq!(dests, ["/usr/lib/libcuda.so", "/proc", "/dev"]);
        assert_eq!(saved["mounts"][1]["x-mount"], "m", "a moved element keeps its extras");
        assert_eq!(saved["hostname"], "h");
    }

    #[test]
    fn save_applies_changes_and_removals_of_modelled_fields() {
        let saved = edited_and_saved(|spec| {
            spec.set_hostname(None);
            let mut mounts = spec.mounts().clone().unwrap();
            mounts[0].set_options(Some(vec!["nosuid".to_string()]));
            spec.set_mounts(Some(mounts));
        });
        assert!(saved.get("hostname").is_none(), "{saved}");
        assert_eq!(saved["mounts"][0]["options"], serde_json::json!(["nosuid"]));
        // A changed element is the edit's: its extras cannot be told apart from stale state.
        assert!(saved["mounts"][0].get("x-mount").is_none());
        assert_eq!(saved["x-vendor"]["keep"], true);
    }

    #[test]
    fn malformed_config_names_file_and_position() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), "{\"ociVersion\": 1,,}").unwrap();
        let e = load(dir.path()).unwrap_err().to_string();
        assert!(e.contains("config.json") && e.contains("line 1"), "{e}");
    }

    #[test]
    fn start_reads_only_annotations() {
        let dir = tempfile::tempdir().unwrap();
        let cfg = dir.path().join("config.json");
        std::fs::write(
            &cfg,
            r#"{"ociVersion":"1.0.2","process":{"args":["sh"],"cwd":"/"},"root":{"path":"rootfs"},
                "annotations":{"io.kubernetes.cri-o.SandboxID":"pod9"},"linux":{"namespaces":[]}}"#,
        )
        .unwrap();
        let a = load_annotations(dir.path()).unwrap();
        assert_eq!(group_id(&a).as_deref(), Some("pod9"));
        std::fs::write(&cfg, r#"{"ociVersion":"1.0.2"}"#).unwrap();
        assert!(load_annotations(dir.path()).unwrap().is_empty());
        std::fs::write(&cfg, "{").unwrap();
        assert!(load_annotations(dir.path())
            .unwrap_err()
            .to_string()
            .contains("config.json"));
    }

    #[test]
    fn relative_root_is_under_bundle() {
        let spec: Spec = serde_json::from_str(r#"{"ociVersion":"1.0.2","root":{"path":"rootfs"}}"#).unwrap();
        assert_eq!(root_path(Path::new("/b"), &spec), PathBuf::from("/b/rootfs"));
    }
}
