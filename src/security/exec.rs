//! Keeps an exec inside what Create decided for its container. Engines build an exec's process
//! from the container's process as they sent it, before gantry's edits, and runc gives an exec
//! the capabilities, no_new_privileges and AppArmor profile its process JSON names: without
//! this an exec would get back a capability the policy dropped.

use serde_json::Value;

use super::{caps, APPARMOR_ANNOTATION, PRIVILEGED_ANNOTATION};

/// Applies the container's decisions (its `config.json` as written at Create) to an exec's
/// process. Nothing changes for containers created without a `[security]` policy.
pub fn apply(container: &Value, process: &mut Value) {
    let annotation = |k: &str| container.pointer(&format!("/annotations/{}", k.replace('/', "~1")));
    if annotation(PRIVILEGED_ANNOTATION).is_none() {
        return;
    }
    let Some(process) = process.as_object_mut() else {
        return;
    };
    if let Some(Value::Array(bounding)) = container.pointer("/process/capabilities/bounding") {
        let allowed: Vec<String> = bounding.iter().filter_map(Value::as_str).map(caps::normalize).collect();
        if let Some(Value::Object(sets)) = process.get_mut("capabilities") {
            for set in caps::SETS {
                if let Some(Value::Array(list)) = sets.get_mut(set) {
                    list.retain(|v| v.as_str().is_some_and(|n| allowed.contains(&caps::normalize(n))));
                }
            }
        }
    }
    if container.pointer("/process/noNewPrivileges") == Some(&Value::Bool(true)) {
        process.insert("noNewPrivileges".into(), true.into());
    }
    let dropped = annotation(APPARMOR_ANNOTATION)
        .and_then(Value::as_str)
        .is_some_and(|a| a.starts_with("dropped:"));
    if dropped {
        process.remove("apparmorProfile");
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn container(annotations: Value) -> Value {
        json!({
            "process": {"noNewPrivileges": true, "capabilities": {"bounding": ["CAP_CHOWN", "CAP_KILL"]}},
            "annotations": annotations
        })
    }

    fn exec() -> Value {
        json!({
            "args": ["sh"],
            "apparmorProfile": "crio-default",
            "capabilities": {"bounding": ["CAP_CHOWN", "CAP_NET_RAW"], "effective": ["cap_net_raw", "CAP_KILL"]}
        })
    }

    #[test]
    fn an_exec_gets_no_more_than_its_container() {
        let c = container(json!({"gantry.dev/privileged": "false", "gantry.dev/apparmor": "dropped:crio-default"}));
        let mut p = exec();
        apply(&c, &mut p);
        assert_eq!(p["capabilities"]["bounding"], json!(["CAP_CHOWN"]));
        assert_eq!(p["capabilities"]["effective"], json!(["CAP_KILL"]));
        assert_eq!(p["noNewPrivileges"], true);
        assert!(p.get("apparmorProfile").is_none());
    }

    #[test]
    fn without_a_policy_the_exec_is_untouched() {
        let mut p = exec();
        apply(&container(json!({})), &mut p);
        assert_eq!(p, exec());
        apply(
            &json!({"annotations": {"gantry.dev/privileged": "false"}}),
            &mut json!(5),
        );
    }
}
