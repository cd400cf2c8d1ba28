//! Capabilities by name, over the spec's JSON (`process.capabilities`): names newer than
//! oci-spec's enum are handled like any other, odd ones never panic.

use serde_json::{Map, Value};
use thiserror::Error;

/// The five capability sets of `process.capabilities`.
pub const SETS: [&str; 5] = ["bounding", "effective", "inheritable", "permitted", "ambient"];

#[derive(Debug, Error, PartialEq)]
pub enum CapsError {
    #[error(
        "capability {cap} in process.capabilities.{set} is not in security.allowed_capabilities \
         (rejected by security.capability_violation = \"reject\")"
    )]
    NotAllowed { set: &'static str, cap: String },
    #[error("process.capabilities.{set} is not a list of names")]
    Malformed { set: &'static str },
}

/// `CAP_SYS_ADMIN` for `sys_admin`, `CAP_SYS_ADMIN`, `cap_sys_admin`: engines and operators
/// spell them differently, the kernel only one way.
pub fn normalize(name: &str) -> String {
    let upper = name.trim().to_ascii_uppercase();
    if upper.starts_with("CAP_") {
        upper
    } else {
        format!("CAP_{upper}")
    }
}

fn names<'a>(caps: &'a Map<String, Value>, set: &'static str) -> Result<Vec<&'a str>, CapsError> {
    match caps.get(set) {
        None | Some(Value::Null) => Ok(Vec::new()),
        Some(Value::Array(list)) => list
            .iter()
            .map(|v| v.as_str().ok_or(CapsError::Malformed { set }))
            .collect(),
        Some(_) => Err(CapsError::Malformed { set }),
    }
}

/// The bounding set's names as written (empty when absent).
pub fn bounding(doc: &Value) -> Vec<String> {
    doc.pointer("/process/capabilities/bounding")
        .and_then(Value::as_array)
        .map(|l| l.iter().filter_map(Value::as_str).map(String::from).collect())
        .unwrap_or_default()
}

/// Every (set, capability) outside `allowed`, in set order.
pub fn violations(caps: &Map<String, Value>, allowed: &[String]) -> Result<Vec<(&'static str, String)>, CapsError> {
    let allowed: Vec<String> = allowed.iter().map(|c| normalize(c)).collect();
    let mut out = Vec::new();
    for set in SETS {
        for name in names(caps, set)? {
            if !allowed.contains(&normalize(name)) {
                out.push((set, name.to_string()));
            }
        }
    }
    Ok(out)
}

/// Removes every capability outside `allowed` from all five sets; returns the removed names
/// (normalized, each once).
pub fn drop_outside(caps: &mut Map<String, Value>, allowed: &[String]) -> Result<Vec<String>, CapsError> {
    let mut dropped: Vec<String> = Vec::new();
    for (_, name) in violations(caps, allowed)? {
        let n = normalize(&name);
        if !dropped.contains(&n) {
            dropped.push(n);
        }
    }
    for set in SETS {
        if let Some(Value::Array(list)) = caps.get_mut(set) {
            list.retain(|v| v.as_str().is_some_and(|n| !dropped.contains(&normalize(n))));
        }
    }
    Ok(dropped)
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn caps(v: Value) -> Map<String, Value> {
        v.as_object().unwrap().clone()
    }

    #[test]
    fn names_are_normalized() {
        assert_eq!(normalize("sys_admin"), "CAP_SYS_ADMIN");
        assert_eq!(normalize("CAP_NET_RAW"), "CAP_NET_RAW");
        assert_eq!(normalize(" cap_bpf "), "CAP_BPF");
    }

    #[test]
    fn violations_cover_all_five_sets_and_newer_names() {
        let c = caps(json!({
            "bounding": ["CAP_CHOWN", "CAP_NET_RAW", "CAP_FUTURE_THING"],
            "effective": ["CAP_CHOWN"],
            "ambient": ["CAP_NET_RAW"]
        }));
        let v = violations(&c, &["chown".into(), "CAP_FUTURE_THING".into()]).unwrap();
        assert_eq!(
            v,
            vec![("bounding", "CAP_NET_RAW".into()), ("ambient", "CAP_NET_RAW".into())]
        );
        assert!(violations(&c, &[]).unwrap().len() == 5);
    }

    #[test]
    fn drop_removes_from_every_set() {
        let mut c = caps(json!({
            "bounding": ["CAP_CHOWN", "CAP_NET_RAW"],
            "effective": ["CAP_NET_RAW", "CAP_CHOWN"],
            "permitted": ["cap_net_raw"],
            "inheritable": []
        }));
        let dropped = drop_outside(&mut c, &["CAP_CHOWN".into()]).unwrap();
        assert_eq!(dropped, vec!["CAP_NET_RAW".to_string()]);
        assert_eq!(c["bounding"], json!(["CAP_CHOWN"]));
        assert_eq!(c["effective"], json!(["CAP_CHOWN"]));
        assert_eq!(c["permitted"], json!([]));
    }

    #[test]
    fn odd_shapes_are_errors_not_panics() {
        let c = caps(json!({"bounding": "CAP_CHOWN"}));
        assert_eq!(violations(&c, &[]), Err(CapsError::Malformed { set: "bounding" }));
        let c = caps(json!({"effective": [1]}));
        assert!(violations(&c, &[]).is_err());
        assert!(bounding(&json!({"process": {"capabilities": {"bounding": [1, "CAP_X"]}}})) == vec!["CAP_X"]);
    }
}
