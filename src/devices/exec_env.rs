//! The env entries device injection gave a container's init, for its exec processes too.
//!
//! An exec's process spec comes from the engine, which never saw gantry's CDI edits (CRI-O and
//! containerd copy the container's process as they built it), so `crictl exec gpu-pod env`
//! would lack e.g. `NVIDIA_VISIBLE_DEVICES=void` or a library path a CDI spec set. The entries
//! are recorded in the `gantry.dev/injected-env` annotation at Create and set on each exec.

use std::path::Path;

use oci_spec::runtime::Spec;
use serde_json::Value;

use super::edits::{set_env, EditSet};

/// Annotation holding the injected env entries (a JSON list of `KEY=value`).
pub const INJECTED_ENV_ANNOTATION: &str = "gantry.dev/injected-env";

/// Records the env entries of `sets` on the spec (nothing when there are none).
pub(crate) fn record(spec: &mut Spec, sets: &[EditSet]) {
    let mut entries: Vec<String> = Vec::new();
    for entry in sets.iter().flat_map(|s| s.env.iter()) {
        set_env(&mut entries, entry);
    }
    if entries.is_empty() {
        return;
    }
    let Ok(json) = serde_json::to_string(&entries) else {
        return;
    };
    let annotations = spec.annotations_mut().get_or_insert_with(Default::default);
    annotations.insert(INJECTED_ENV_ANNOTATION.to_string(), json);
}

/// `process` (an exec's process JSON) with the entries recorded in the bundle's config.json
/// set, replacing the same keys. Unchanged when nothing was recorded or anything is unreadable:
/// the exec then runs as the engine asked.
pub fn with_injected_env(bundle: &Path, process: Vec<u8>) -> Vec<u8> {
    let Ok(annotations) = crate::spec::load_annotations(bundle) else {
        return process;
    };
    let Some(entries) = annotations
        .get(INJECTED_ENV_ANNOTATION)
        .and_then(|v| serde_json::from_str::<Vec<String>>(v).ok())
    else {
        return process;
    };
    apply(&process, &entries).unwrap_or(process)
}

fn apply(process: &[u8], entries: &[String]) -> Option<Vec<u8>> {
    let mut value: Value = serde_json::from_slice(process).ok()?;
    let object = value.as_object_mut()?;
    let mut env: Vec<String> = match object.get("env") {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => serde_json::from_value(v.clone()).ok()?,
    };
    for entry in entries {
        set_env(&mut env, entry);
    }
    object.insert("env".into(), env.into());
    serde_json::to_vec(&value).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bundle_with(annotation: Option<&str>) -> tempfile::TempDir {
        let dir = tempfile::tempdir().unwrap();
        let mut spec = serde_json::json!({"ociVersion": "1.0.2", "annotations": {}});
        if let Some(a) = annotation {
            spec["annotations"][INJECTED_ENV_ANNOTATION] = a.into();
        }
        std::fs::write(dir.path().join("config.json"), spec.to_string()).unwrap();
        dir
    }

    #[test]
    fn exec_env_gets_the_recorded_entries() {
        let dir = bundle_with(Some(
            r#"["NVIDIA_VISIBLE_DEVICES=void","LD_LIBRARY_PATH=/usr/lib/nvidia"]"#,
        ));
        let process = br#"{"args":["env"],"cwd":"/","env":["PATH=/bin","NVIDIA_VISIBLE_DEVICES=all"],"x":1}"#;
        let out: Value = serde_json::from_slice(&with_injected_env(dir.path(), process.to_vec())).unwrap();
        assert_eq!(
            out["env"],
            serde_json::json!([
                "PATH=/bin",
                "NVIDIA_VISIBLE_DEVICES=void",
                "LD_LIBRARY_PATH=/usr/lib/nvidia"
            ])
        );
        assert_eq!(out["x"], 1);
        let out: Value =
            serde_json::from_slice(&with_injected_env(dir.path(), br#"{"args":["env"]}"#.to_vec())).unwrap();
        assert_eq!(out["env"][0], "NVIDIA_VISIBLE_DEVICES=void");
    }

    #[test]
    fn without_a_record_the_exec_is_untouched() {
        let process = br#"{"args":["env"],"env":["A=1"]}"#.to_vec();
        let dir = bundle_with(None);
        assert_eq!(with_injected_env(dir.path(), process.clone()), process);
        let dir = bundle_with(Some("not json"));
        assert_eq!(with_injected_env(dir.path(), process.clone()), process);
        assert_eq!(with_injected_env(Path::new("/nonexistent"), process.clone()), process);
    }
}
