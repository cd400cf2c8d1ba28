//! Reading the bundle's `config.json` and the edits gantry makes to it before the OCI runtime
//! sees it. Each edit is a small function over the parsed spec (devices live in
//! [`crate::devices`]); [`edit`] runs them in order and says whether anything changed.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use oci_spec::runtime::Spec;
use serde::Deserialize;
use serde_json::Value;
use thiserror::Error;

use crate::config::Config;
use crate::devices::{self, DeviceError, Injection};
use crate::security::{self, SecurityError};

pub const CRIO_SANDBOX_ID: &str = "io.kubernetes.cri-o.SandboxID";
pub const CRIO_CONTAINER_TYPE: &str = "io.kubernetes.cri-o.ContainerType";
pub const CRI_SANDBOX_ID: &str = "io.kubernetes.cri.sandbox-id";
pub const CRI_CONTAINER_TYPE: &str = "io.kubernetes.cri.container-type";
pub const RUNC_GROUP: &str = "io.containerd.runc.v2.group";

#[derive(Debug, Error)]
pub enum SpecError {
    #[error("invalid id {id:?}: {why}")]
    Id { id: String, why: &'static str },
    #[error("namespace validation: identifier {0:?} must match ^[A-Za-z0-9]+(?:[._-](?:[A-Za-z0-9]+))*$ and be at most 76 characters")]
    Namespace(String),
    #[error("read {path}: {source}")]
    Read { path: PathBuf, source: std::io::Error },
    #[error("malformed {path}: {source}")]
    Parse { path: PathBuf, source: serde_json::Error },
    #[error("write {path}: {source}")]
    Write { path: PathBuf, source: std::io::Error },
    /// Devices were asked for, but the spec holds a value oci-spec cannot represent, so
    /// gantry cannot edit it (runc alone would have accepted it).
    #[error("cannot edit {path} (device injection): it holds a value this gantry cannot represent: {why}")]
    Unmodelled { path: PathBuf, why: String },
    #[error(transparent)]
    Devices(#[from] DeviceError),
    #[error(transparent)]
    Security(#[from] SecurityError),
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

/// Namespaces become directory names under the runtime root: validated as containerd validates
/// its identifiers (a direct caller of `start` is not filtered by containerd).
pub fn validate_namespace(ns: &str) -> Result<(), SpecError> {
    let words_ok = ns
        .split(['.', '_', '-'])
        .all(|w| !w.is_empty() && w.chars().all(|c| c.is_ascii_alphanumeric()));
    if ns.is_empty() || ns.len() > 76 || !words_ok {
        return Err(SpecError::Namespace(ns.to_string()));
    }
    Ok(())
}

pub fn config_path(bundle: &Path) -> PathBuf {
    bundle.join("config.json")
}

/// The parts of `config.json` gantry reads for itself, typed loosely (strings, not enums) so
/// they are there even for a spec oci-spec cannot represent.
#[derive(Debug, Default, Deserialize)]
pub struct View {
    #[serde(default)]
    annotations: Option<HashMap<String, String>>,
    #[serde(default)]
    root: Option<ViewRoot>,
    #[serde(default)]
    process: Option<ViewProcess>,
}

#[derive(Debug, Default, Deserialize)]
struct ViewRoot {
    #[serde(default)]
    path: Option<PathBuf>,
}

#[derive(Debug, Default, Deserialize)]
struct ViewProcess {
    #[serde(default)]
    env: Option<Vec<String>>,
    #[serde(default)]
    capabilities: Option<ViewCapabilities>,
    #[serde(default, rename = "oomScoreAdj")]
    oom_score_adj: Option<i32>,
}

#[derive(Debug, Default, Deserialize)]
struct ViewCapabilities {
    #[serde(default)]
    bounding: Option<Vec<String>>,
}

impl View {
    /// Annotations, empty when absent.
    pub fn annotations(&self) -> HashMap<String, String> {
        self.annotations.clone().unwrap_or_default()
    }

    /// The container's root filesystem as the runtime will resolve it.
    pub fn root_path(&self, bundle: &Path) -> PathBuf {
        let root = self
            .root
            .as_ref()
            .and_then(|r| r.path.clone())
            .unwrap_or_else(|| PathBuf::from("rootfs"));
        if root.is_absolute() {
            root
        } else {
            bundle.join(root)
        }
    }

    fn env(&self) -> &[String] {
        self.process.as_ref().and_then(|p| p.env.as_deref()).unwrap_or_default()
    }

    fn bounding(&self) -> &[String] {
        self.process
            .as_ref()
            .and_then(|p| p.capabilities.as_ref())
            .and_then(|c| c.bounding.as_deref())
            .unwrap_or_default()
    }
}

/// `config.json` as read: the bytes (a failed create restores them exactly), the [`View`], and
/// the full typed spec the edits work on.
#[derive(Debug)]
pub struct Loaded {
    pub raw: Vec<u8>,
    pub view: View,
    /// `Err` when the document is a spec but holds a value newer than oci-spec's model (a
    /// capability, seccomp action or namespace type it does not know). runc and crun accept
    /// those, as the runc shim does: such a spec goes to the runtime untouched, and only an
    /// edit (device injection) is refused.
    pub spec: Result<Spec, serde_json::Error>,
    /// The whole document after every edit, once [`edit`] built it for the security policy
    /// (which works on the JSON, so a spec oci-spec cannot represent can be hardened too).
    pub doc: Option<Value>,
}

/// True when oci-spec refused a document only for a value it has no variant for.
pub fn is_newer_than_model(e: &serde_json::Error) -> bool {
    let msg = e.to_string();
    e.classify() == serde_json::error::Category::Data
        && (msg.starts_with("unknown variant") || msg.starts_with("no variant for"))
}

fn read(bundle: &Path) -> Result<(PathBuf, Vec<u8>), SpecError> {
    let path = config_path(bundle);
    match std::fs::read(&path) {
        Ok(raw) => Ok((path, raw)),
        Err(source) => Err(SpecError::Read { path, source }),
    }
}

/// Reads and parses `config.json`.
pub fn load(bundle: &Path) -> Result<Loaded, SpecError> {
    let (path, raw) = read(bundle)?;
    let view = serde_json::from_slice(&raw).map_err(|source| SpecError::Parse {
        path: path.clone(),
        source,
    })?;
    let spec = match serde_json::from_slice(&raw) {
        Err(e) if !is_newer_than_model(&e) => return Err(SpecError::Parse { path, source: e }),
        parsed => parsed,
    };
    Ok(Loaded {
        raw,
        view,
        spec,
        doc: None,
    })
}

/// Only the annotations of the bundle's config.json: `start` needs nothing else, and skipping
/// the rest is cheaper than building a whole `Spec` in a process that lives a millisecond.
pub fn load_annotations(bundle: &Path) -> Result<HashMap<String, String>, SpecError> {
    let (path, raw) = read(bundle)?;
    let v: View = serde_json::from_slice(&raw).map_err(|source| SpecError::Parse { path, source })?;
    Ok(v.annotations())
}

/// The spec after Create's edits.
pub struct Edited {
    /// The whole document as the runtime will read it, when an edit built it (always when
    /// `write` is set).
    pub doc: Option<Value>,
    /// What to write over config.json, when the edits changed it.
    pub write: Option<Vec<u8>>,
    /// The document as the engine wrote it: what a failed Create puts back.
    pub original: Vec<u8>,
    pub edits: Edits,
}

/// Runs [`edit`] and renders the result without touching the bundle, so it can run where a
/// cancelled Create just drops it. The edited document keeps what oci-spec does not model:
/// vendor extensions and fields newer than the crate survive wherever the edits left that
/// part of the document alone, so runc sees what the engine wrote plus the edits.
pub fn edit_for_create(
    bundle: &Path,
    mut loaded: Loaded,
    config: &Config,
    listener: &Path,
) -> Result<Edited, SpecError> {
    let edits = edit(bundle, &mut loaded, config, listener)?;
    let doc = match loaded.doc.take() {
        None if !edits.devices.is_empty() => Some(merged(bundle, &loaded)?),
        doc => doc,
    };
    let write = match (&doc, edits.changed()) {
        (Some(doc), true) => Some(serde_json::to_vec(doc).map_err(|e| SpecError::Write {
            path: config_path(bundle),
            source: std::io::Error::other(e),
        })?),
        _ => None,
    };
    Ok(Edited {
        doc,
        write,
        original: loaded.raw,
        edits,
    })
}

impl Edited {
    /// The spec as the runtime will read it; parsed here only when no edit built it, so a
    /// Create that needs no document (not a sandbox) never parses one.
    pub fn document(&self) -> Result<std::borrow::Cow<'_, Value>, serde_json::Error> {
        match &self.doc {
            Some(doc) => Ok(std::borrow::Cow::Borrowed(doc)),
            None => serde_json::from_slice(&self.original).map(std::borrow::Cow::Owned),
        }
    }
}

/// Writes `data` over the bundle's config.json.
pub fn write(bundle: &Path, data: &[u8]) -> Result<(), SpecError> {
    let path = config_path(bundle);
    // Renamed into place: atomic for a concurrent reader, and never written through a link.
    crate::files::write_atomic(&path, data).map_err(|source| SpecError::Write { path, source })
}

/// The typed spec's edits over the document as read (see [`carry_unmodelled`]).
fn merged(bundle: &Path, loaded: &Loaded) -> Result<Value, SpecError> {
    let path = config_path(bundle);
    let spec = loaded.spec.as_ref().map_err(|why| SpecError::Unmodelled {
        path: path.clone(),
        why: why.to_string(),
    })?;
    let write_err = |e: serde_json::Error| SpecError::Write {
        path: path.clone(),
        source: std::io::Error::other(e),
    };
    let edited = serde_json::to_value(spec).map_err(write_err)?;
    // What the typed parse skipped (an unmodelled field) can still be invalid JSON text, such
    // as a lone surrogate escape: that is a malformed file, not a failed write.
    let original: Value = serde_json::from_slice(&loaded.raw).map_err(|source| SpecError::Parse {
        path: path.clone(),
        source,
    })?;
    let modelled = serde_json::from_slice::<Spec>(&loaded.raw)
        .and_then(serde_json::to_value)
        .map_err(write_err)?;
    Ok(carry_unmodelled(original, &modelled, edited))
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

/// An exec's process JSON with what Create decided for its container (read back from the
/// bundle's `config.json`): the env device injection gave init, and the security policy's
/// limits. Unchanged when either side cannot be read: the exec then runs as the engine asked.
pub fn edit_exec(bundle: &Path, process: Vec<u8>) -> Vec<u8> {
    let Ok((_, raw)) = read(bundle) else {
        return process;
    };
    let (Ok(container), Ok(mut edited)) = (
        serde_json::from_slice::<Value>(&raw),
        serde_json::from_slice::<Value>(&process),
    ) else {
        return process;
    };
    devices::exec_env::apply(&container, &mut edited);
    security::exec::apply(&container, &mut edited);
    serde_json::to_vec(&edited).unwrap_or(process)
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

/// What the edits did, for logs and annotations.
#[derive(Debug, Default)]
pub struct Edits {
    pub devices: Injection,
    pub security: security::Report,
    /// The calls the daemon must serve notifications for, at the `listener` [`edit`] was given.
    pub notify: Option<security::notify::Watch>,
    /// `oomScoreAdj` raised from the first value to the second (`restrict_oom_score_adj`).
    pub oom_score_adj: Option<(i32, i32)>,
}

impl Edits {
    pub fn changed(&self) -> bool {
        !self.devices.devices.is_empty() || self.security.changed || self.oom_score_adj.is_some()
    }
}

/// `restrict_oom_score_adj`: the container's `oomScoreAdj` and the floor it is raised to,
/// when it asks for less than `floor` (the daemon's own value).
fn oom_clamp(view: &View, restrict: bool, floor: Option<i32>) -> Option<(i32, i32)> {
    let asked = view.process.as_ref()?.oom_score_adj?;
    let floor = floor.filter(|_| restrict)?;
    (asked < floor).then_some((asked, floor))
}

/// Runs every spec edit in order: devices on the typed spec, then the security policy on the
/// resulting document, then the watched syscalls (their notifications go to `listener`). A
/// spec oci-spec cannot represent gets no device edits (asking for one is refused) but is
/// judged by the security policy all the same.
pub fn edit(bundle: &Path, loaded: &mut Loaded, config: &Config, listener: &Path) -> Result<Edits, SpecError> {
    let devices = edit_devices(bundle, loaded, config)?;
    let oom_score_adj = oom_clamp(
        &loaded.view,
        config.runtime.restrict_oom_score_adj,
        crate::proc::own_oom_score_adj(),
    );
    // Without a policy only the engine's profiles need a look (seccomp validation, AppArmor
    // loaded), and a recording request its refusal; skip the JSON then.
    let has_profile = match &loaded.spec {
        Ok(spec) => {
            spec.linux().as_ref().is_some_and(|l| l.seccomp().is_some())
                || spec.process().as_ref().is_some_and(|p| p.apparmor_profile().is_some())
                || spec
                    .annotations()
                    .as_ref()
                    .is_some_and(|a| a.contains_key(security::record::RECORD_ANNOTATION))
        }
        Err(_) => true,
    };
    if !has_profile && oom_score_adj.is_none() && config.security.is_passthrough() {
        return Ok(Edits {
            devices,
            security: security::Report::default(),
            notify: None,
            oom_score_adj,
        });
    }
    let mut doc = if devices.devices.is_empty() {
        serde_json::from_slice(&loaded.raw).map_err(|source| SpecError::Parse {
            path: config_path(bundle),
            source,
        })?
    } else {
        merged(bundle, loaded)?
    };
    let mut security = security::apply(&mut doc, &config.security)?;
    let notify = security::watch_syscalls(&mut doc, &config.security, listener, &mut security)?;
    if let (Some((_, floor)), Some(process)) = (oom_score_adj, doc.get_mut("process")) {
        process["oomScoreAdj"] = floor.into();
    }
    // Kept even when unchanged: whoever reads the edited spec next need not parse it again.
    loaded.doc = Some(doc);
    Ok(Edits {
        devices,
        security,
        notify,
        oom_score_adj,
    })
}

fn edit_devices(bundle: &Path, loaded: &mut Loaded, config: &Config) -> Result<Injection, SpecError> {
    let privileged = devices::is_privileged(loaded.view.bounding());
    match &mut loaded.spec {
        Ok(spec) => Ok(devices::inject(spec, &config.devices, privileged)?),
        Err(why) => {
            let asked = devices::asked(
                loaded.view.annotations.as_ref(),
                loaded.view.env(),
                &config.devices,
                privileged,
            )?;
            if asked.anything() {
                return Err(SpecError::Unmodelled {
                    path: config_path(bundle),
                    why: why.to_string(),
                });
            }
            Ok(Injection {
                warnings: asked.warning.into_iter().collect(),
                ..Default::default()
            })
        }
    }
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
    fn namespaces_follow_containerd_identifiers() {
        for ok in ["default", "k8s.io", "moby", "a-b_c.d", "x1", &"n".repeat(76)] {
            assert!(validate_namespace(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "../../esc",
            "a/b",
            "a..b",
            ".a",
            "a.",
            "a b",
            "-a",
            &"n".repeat(77),
            "ns\0",
        ] {
            let e = validate_namespace(bad).unwrap_err();
            assert!(e.to_string().starts_with("namespace validation: identifier"), "{e}");
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

    /// What Create writes for a spec whose typed part (or document) was edited.
    fn save(bundle: &Path, loaded: &Loaded) -> Result<(), SpecError> {
        let doc = match &loaded.doc {
            Some(doc) => doc.clone(),
            None => merged(bundle, loaded)?,
        };
        write(bundle, &serde_json::to_vec(&doc).unwrap())
    }

    fn edited_and_saved(edit: impl FnOnce(&mut Spec)) -> Value {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), WITH_UNMODELLED).unwrap();
        let mut loaded = load(dir.path()).unwrap();
        edit(loaded.spec.as_mut().unwrap());
        save(dir.path(), &loaded).unwrap();
        let saved = std::fs::read(dir.path().join("config.json")).unwrap();
        // What runc gets must still be a spec.
        serde_json::from_slice::<Spec>(&saved).unwrap();
        serde_json::from_slice(&saved).unwrap()
    }

    #[test]
    fn invalid_text_in_an_unmodelled_field_is_malformed_not_a_write_error() {
        // Found by fuzz/spec: the typed parses skip the field, the document parse does not.
        let dir = tempfile::tempdir().unwrap();
        let text = WITH_UNMODELLED.replace(r#"{"keep": true}"#, r#""\ud800""#);
        std::fs::write(dir.path().join("config.json"), &text).unwrap();
        let mut loaded = load(dir.path()).unwrap();
        loaded.spec.as_mut().unwrap().set_hostname(Some("edited".into()));
        let e = save(dir.path(), &loaded).unwrap_err();
        assert!(matches!(e, SpecError::Parse { .. }), "{e}");
        assert_eq!(std::fs::read_to_string(dir.path().join("config.json")).unwrap(), text);
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

    /// A spec runc and crun run (runc warns about the capability) but oci-spec 0.10 refuses.
    fn newer_spec(annotations: Value) -> Value {
        serde_json::json!({
            "ociVersion": "1.2.0",
            "process": {
                "cwd": "/", "args": ["true"], "user": {"uid": 0, "gid": 0},
                "capabilities": {"bounding": ["CAP_CHOWN", "CAP_FUTURE_THING"]}
            },
            "root": {"path": "rootfs"},
            "annotations": annotations,
            "linux": {"namespaces": [{"type": "pid"}]}
        })
    }

    #[test]
    fn values_newer_than_the_model_are_told_apart_from_malformed_specs() {
        let refused = |v: Value| serde_json::from_value::<Spec>(v).unwrap_err();
        // Pins the crate's wording: a crate update that changes it fails here, not in production.
        assert!(is_newer_than_model(&refused(newer_spec(Value::Null))));
        let mut ns = newer_spec(Value::Null);
        ns["process"]["capabilities"]["bounding"] = serde_json::json!([]);
        ns["linux"]["namespaces"][0]["type"] = "future-ns".into();
        assert!(is_newer_than_model(&refused(ns)));
        let mut bad = newer_spec(Value::Null);
        bad["process"]["capabilities"]["bounding"] = serde_json::json!([]);
        bad["process"]["args"] = "true".into();
        assert!(!is_newer_than_model(&refused(bad)));
    }

    fn load_value(v: &Value) -> (tempfile::TempDir, Result<Loaded, SpecError>) {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("config.json"), serde_json::to_vec(v).unwrap()).unwrap();
        let loaded = load(dir.path());
        (dir, loaded)
    }

    #[test]
    fn a_newer_spec_passes_through_unless_an_edit_is_asked_for() {
        let config = Config::default();
        let (dir, loaded) = load_value(&newer_spec(serde_json::json!({"k": "v"})));
        let mut loaded = loaded.unwrap();
        assert!(loaded.spec.is_err());
        assert_eq!(loaded.view.annotations()["k"], "v");
        assert_eq!(loaded.view.root_path(dir.path()), dir.path().join("rootfs"));
        let edits = edit(dir.path(), &mut loaded, &config, Path::new("/run/no-listener")).unwrap();
        assert!(!edits.changed());

        let (dir, loaded) = load_value(&newer_spec(
            serde_json::json!({devices::DEVICES_ANNOTATION: "nvidia.com/gpu=0"}),
        ));
        let e = edit(dir.path(), &mut loaded.unwrap(), &config, Path::new("/run/no-listener"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("config.json") && e.contains("CAP_FUTURE_THING"), "{e}");

        // A wrongly typed field is still malformed input, refused at load.
        let mut bad = newer_spec(Value::Null);
        bad["process"]["args"] = "true".into();
        let e = load_value(&bad).1.err().unwrap().to_string();
        assert!(e.starts_with("malformed") && e.contains("config.json"), "{e}");
    }

    #[test]
    fn a_newer_spec_is_hardened_by_name_and_saved_as_a_document() {
        let mut config = Config::default();
        config.security.allowed_capabilities = Some(vec!["CAP_CHOWN".into()]);
        config.security.capability_violation = crate::security::Violation::Drop;
        let (dir, loaded) = load_value(&newer_spec(serde_json::json!({"k": "v"})));
        let mut loaded = loaded.unwrap();
        let edits = edit(dir.path(), &mut loaded, &config, Path::new("/run/no-listener")).unwrap();
        assert!(edits.changed());
        save(dir.path(), &loaded).unwrap();
        let saved: Value = serde_json::from_slice(&std::fs::read(dir.path().join("config.json")).unwrap()).unwrap();
        assert_eq!(
            saved["process"]["capabilities"]["bounding"],
            serde_json::json!(["CAP_CHOWN"])
        );
        assert_eq!(
            saved["annotations"]["gantry.dev/capabilities-dropped"],
            "CAP_FUTURE_THING"
        );
        assert_eq!(saved["annotations"]["k"], "v");
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
        let view: View = serde_json::from_str(r#"{"ociVersion":"1.0.2","root":{"path":"rootfs"}}"#).unwrap();
        assert_eq!(view.root_path(Path::new("/b")), PathBuf::from("/b/rootfs"));
        let view: View = serde_json::from_str(r#"{"root":{"path":"/abs/root"}}"#).unwrap();
        assert_eq!(view.root_path(Path::new("/b")), PathBuf::from("/abs/root"));
    }

    #[test]
    fn restrict_oom_score_adj_raises_only_what_is_below_the_floor() {
        let view =
            |adj: &str| -> View { serde_json::from_str(&format!(r#"{{"process":{{"oomScoreAdj":{adj}}}}}"#)).unwrap() };
        assert_eq!(oom_clamp(&view("-998"), true, Some(-500)), Some((-998, -500)));
        assert_eq!(oom_clamp(&view("-500"), true, Some(-500)), None);
        assert_eq!(oom_clamp(&view("100"), true, Some(0)), None);
        assert_eq!(oom_clamp(&view("-998"), false, Some(0)), None, "off by default");
        assert_eq!(oom_clamp(&view("-998"), true, None), None, "own value unreadable");
        assert_eq!(oom_clamp(&View::default(), true, Some(0)), None, "none asked");

        // Through the whole edit: the written document carries the daemon's own value.
        // (A test process is never at -1000 itself: no service manager or login gives that.)
        let own = crate::proc::own_oom_score_adj().unwrap();
        let mut spec = newer_spec(serde_json::json!({"k": "v"}));
        spec["process"]["oomScoreAdj"] = (-1000).into();
        let (dir, loaded) = load_value(&spec);
        let mut config = Config::default();
        config.runtime.restrict_oom_score_adj = true;
        let edited = edit_for_create(dir.path(), loaded.unwrap(), &config, Path::new("/run/no-listener")).unwrap();
        assert_eq!(edited.edits.oom_score_adj, Some((-1000, own)));
        let written: Value = serde_json::from_slice(edited.write.as_deref().unwrap()).unwrap();
        assert_eq!(written["process"]["oomScoreAdj"], own);
        // Unmodelled values around it survive.
        assert_eq!(written["process"]["capabilities"], spec["process"]["capabilities"]);
    }
}
