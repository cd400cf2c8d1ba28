//! The env entries device injection gave a container's init, for its exec processes too.
//!
//! An exec's process spec comes from the engine, which never saw gantry's CDI edits (CRI-O and
//! containerd copy the container's process as they built it), so `crictl exec gpu-pod env`
//! would lack e.g. `NVIDIA_VISIBLE_DEVICES=void` or a library path a CDI spec set. The entries
//! are recorded in the `gantry.dev/injected-env` annotation at Create and set on each exec.

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

/// Sets the entries recorded in the container's `config.json` (`container`, as written at
/// Create) on an exec's process, replacing the same keys. Nothing changes when nothing was
/// recorded or the process env is not a list of strings: the exec then runs as the engine asked.
pub fn apply(container: &Value, process: &mut Value) {
    let Some(entries) = container
        .pointer(&format!("/annotations/{}", INJECTED_ENV_ANNOTATION.replace('/', "~1")))
        .and_then(Value::as_str)
        .and_then(|v| serde_json::from_str::<Vec<String>>(v).ok())
    else {
        return;
    };
    let Some(object) = process.as_object_mut() else {
        return;
    };
    let mut env: Vec<String> = match object.get("env") {
        None | Some(Value::Null) => Vec::new(),
        Some(v) => match serde_json::from_value(v.clone()) {
            Ok(env) => env,
            Err(_) => return,
        },
    };
    for entry in &entries {
        set_env(&mut env, entry);
    }
    object.insert("env".into(), env.into());
}

#[cfg(test)]
mod tests {
    use super::*;

    fn container(annotation: Option<&str>) -> Value {
        let mut spec = serde_json::json!({"ociVersion": "1.0.2", "annotations": {}});
        if let Some(a) = annotation {
            spec["annotations"][INJECTED_ENV_ANNOTATION] = a.into();
        }
        spec
    }

    #[test]
    fn exec_env_gets_the_recorded_entries() {
        let c = container(Some(
            r#"["NVIDIA_VISIBLE_DEVICES=void","LD_LIBRARY_PATH=/usr/lib/nvidia"]"#,
        ));
        let mut p =
            serde_json::json!({"args":["env"],"cwd":"/","env":["PATH=/bin","NVIDIA_VISIBLE_DEVICES=all"],"x":1});
        apply(&c, &mut p);
        assert_eq!(
            p["env"],
            serde_json::json!([
                "PATH=/bin",
                "NVIDIA_VISIBLE_DEVICES=void",
                "LD_LIBRARY_PATH=/usr/lib/nvidia"
            ])
        );
        assert_eq!(p["x"], 1);
        let mut p = serde_json::json!({"args":["env"]});
        apply(&c, &mut p);
        assert_eq!(p["env"][0], "NVIDIA_VISIBLE_DEVICES=void");
    }

    #[test]
    fn without_a_record_the_exec_is_untouched() {
        let process = serde_json::json!({"args":["env"],"env":["A=1"]});
        for c in [container(None), container(Some("not json"))] {
            let mut p = process.clone();
            apply(&c, &mut p);
            assert_eq!(p, process);
        }
        let mut odd = serde_json::json!({"env": "A=1"});
        apply(&container(Some(r#"["B=2"]"#)), &mut odd);
        assert_eq!(odd["env"], "A=1");
    }
}
