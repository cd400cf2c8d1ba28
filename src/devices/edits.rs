//! Applying resolved container edits to an OCI spec (pure over `Spec`).
//!
//! The CDI crate's `ContainerEdits::apply` is not used: it appends hooks and
//! cgroup rules unconditionally and stats host paths itself, while engines
//! (CRI-O, containerd) have usually injected the same devices already, so
//! every edit here is idempotent: nodes by path, env by key, hooks by
//! stage+path+args, mounts by destination, gids by value, and a cgroup allow
//! rule only when the existing rules do not already grant the access.

use std::path::{Path, PathBuf};

use oci_spec::runtime::{
    Hook, Hooks, Linux, LinuxDevice, LinuxDeviceCgroup, LinuxDeviceType, LinuxResources, Mount, Spec,
};

/// A device node with everything the OCI spec needs (host lookups done).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeEdit {
    /// Path inside the container.
    pub path: PathBuf,
    pub typ: LinuxDeviceType,
    pub major: i64,
    pub minor: i64,
    pub file_mode: Option<u32>,
    /// cgroup access (`rwm` by default; empty = no allow rule).
    pub access: String,
    pub uid: Option<u32>,
    pub gid: Option<u32>,
}

/// OCI hook stages, named as CDI `hookName`s.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HookStage {
    Prestart,
    CreateRuntime,
    CreateContainer,
    StartContainer,
    Poststart,
    Poststop,
}

impl HookStage {
    /// Parses a CDI `hookName`.
    pub fn parse(name: &str) -> Option<Self> {
        Some(match name {
            "prestart" => HookStage::Prestart,
            "createRuntime" => HookStage::CreateRuntime,
            "createContainer" => HookStage::CreateContainer,
            "startContainer" => HookStage::StartContainer,
            "poststart" => HookStage::Poststart,
            "poststop" => HookStage::Poststop,
            _ => return None,
        })
    }
}

/// A hook to add at a stage.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct HookEdit {
    pub stage: HookStage,
    pub hook: Hook,
}

/// One batch of edits (a CDI spec's spec-wide edits, a device's edits, or
/// a fallback selection), ready to apply.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EditSet {
    pub env: Vec<String>,
    pub nodes: Vec<NodeEdit>,
    pub mounts: Vec<Mount>,
    pub hooks: Vec<HookEdit>,
    pub additional_gids: Vec<u32>,
}

/// What applying changed and what was already there, for the caller's log.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EditStats {
    pub env_set: usize,
    pub nodes_added: usize,
    pub nodes_present: usize,
    pub rules_added: usize,
    pub mounts_added: usize,
    pub mounts_present: usize,
    pub hooks_added: usize,
    pub hooks_present: usize,
    pub gids_added: usize,
}

/// Applies `edits` to `spec`. Env and gid edits need `process`; without one
/// they are skipped and a warning is pushed.
pub fn apply(spec: &mut Spec, edits: &EditSet, stats: &mut EditStats, warnings: &mut Vec<String>) {
    apply_process(spec, edits, stats, warnings);
    for node in &edits.nodes {
        apply_node(spec, node, stats);
    }
    for mount in &edits.mounts {
        let mounts = spec.mounts_mut().get_or_insert_with(Vec::new);
        let dest = normalize(mount.destination());
        if mounts.iter().any(|m| normalize(m.destination()) == dest) {
            stats.mounts_present += 1;
        } else {
            mounts.push(mount.clone());
            stats.mounts_added += 1;
        }
    }
    for edit in &edits.hooks {
        let list = hook_list(spec.hooks_mut().get_or_insert_with(Hooks::default), edit.stage);
        let list = list.get_or_insert_with(Vec::new);
        if list
            .iter()
            .any(|h| h.path() == edit.hook.path() && h.args() == edit.hook.args())
        {
            stats.hooks_present += 1;
        } else {
            list.push(edit.hook.clone());
            stats.hooks_added += 1;
        }
    }
}

fn apply_process(spec: &mut Spec, edits: &EditSet, stats: &mut EditStats, warnings: &mut Vec<String>) {
    if edits.env.is_empty() && edits.additional_gids.iter().all(|g| *g == 0) {
        return;
    }
    let Some(process) = spec.process_mut().as_mut() else {
        warnings.push(format!(
            "spec has no process: env {:?} and gids {:?} not applied",
            edits.env, edits.additional_gids
        ));
        return;
    };
    let env = process.env_mut().get_or_insert_with(Vec::new);
    for entry in &edits.env {
        if set_env(env, entry) {
            stats.env_set += 1;
        }
    }
    for &gid in &edits.additional_gids {
        // CDI ignores gid 0: root's group is never "additional".
        if gid == 0 {
            continue;
        }
        let gids = process.user_mut().additional_gids_mut().get_or_insert_with(Vec::new);
        if !gids.contains(&gid) {
            gids.push(gid);
            stats.gids_added += 1;
        }
    }
}

/// Sets `KEY=value`, replacing an existing `KEY` (like CDI's generator) so
/// that e.g. `NVIDIA_VISIBLE_DEVICES=void` overrides the image's value.
/// Returns whether the env changed.
pub(crate) fn set_env(env: &mut Vec<String>, entry: &str) -> bool {
    let key = entry.split_once('=').map_or(entry, |(k, _)| k);
    let positions: Vec<usize> = env
        .iter()
        .enumerate()
        .filter(|(_, e)| e.split_once('=').map_or(e.as_str(), |(k, _)| k) == key)
        .map(|(i, _)| i)
        .collect();
    match positions.as_slice() {
        [] => {
            env.push(entry.to_string());
            true
        }
        [only] if env[*only] == entry => false,
        [first, rest @ ..] => {
            env[*first] = entry.to_string();
            for &i in rest.iter().rev() {
                env.remove(i);
            }
            true
        }
    }
}

fn apply_node(spec: &mut Spec, node: &NodeEdit, stats: &mut EditStats) {
    let (uid, gid) = match spec.process() {
        // As CDI does: a node without owner belongs to a non-root process user.
        Some(p) => (
            node.uid.or((p.user().uid() > 0).then(|| p.user().uid())),
            node.gid.or((p.user().gid() > 0).then(|| p.user().gid())),
        ),
        None => (node.uid, node.gid),
    };
    let linux = spec.linux_mut().get_or_insert_with(empty_linux);
    let devices = linux.devices_mut().get_or_insert_with(Vec::new);
    let (typ, major, minor) = match devices.iter().find(|d| d.path() == &node.path) {
        Some(present) => {
            stats.nodes_present += 1;
            (present.typ(), present.major(), present.minor())
        }
        None => {
            let mut dev = LinuxDevice::default();
            dev.set_path(node.path.clone())
                .set_typ(node.typ)
                .set_major(node.major)
                .set_minor(node.minor)
                .set_file_mode(node.file_mode)
                .set_uid(uid)
                .set_gid(gid);
            devices.push(dev);
            stats.nodes_added += 1;
            (node.typ, node.major, node.minor)
        }
    };
    let rule_typ = match typ {
        LinuxDeviceType::B => LinuxDeviceType::B,
        LinuxDeviceType::C | LinuxDeviceType::U => LinuxDeviceType::C,
        // fifos and "all" take no device rule
        LinuxDeviceType::P | LinuxDeviceType::A => return,
    };
    // An empty node access is CDI's "none": no rule (unlike an empty rule
    // access, which means rwm).
    if node.access.is_empty() {
        return;
    }
    let want = access_bits(Some(&node.access));
    let resources = linux.resources_mut().get_or_insert_with(LinuxResources::default);
    let rules = resources.devices_mut().get_or_insert_with(Vec::new);
    if granted(rules, rule_typ, major, minor) & want == want {
        return;
    }
    let mut rule = LinuxDeviceCgroup::default();
    rule.set_allow(true)
        .set_typ(Some(rule_typ))
        .set_major(Some(major))
        .set_minor(Some(minor))
        .set_access(Some(node.access.clone()));
    // Appended, i.e. after the engine's leading deny-all; later rules win.
    rules.push(rule);
    stats.rules_added += 1;
}

/// A `Linux` with nothing set (`Linux::default()` adds namespaces).
fn empty_linux() -> Linux {
    serde_json::from_value(serde_json::json!({})).unwrap_or_default()
}

const R: u8 = 1;
const W: u8 = 2;
const M: u8 = 4;

/// `rwm` letters as bits; a missing or empty access means all of them.
fn access_bits(access: Option<&String>) -> u8 {
    match access.map(String::as_str) {
        None | Some("") => R | W | M,
        Some(s) => s.chars().fold(0, |acc, c| {
            acc | match c {
                'r' => R,
                'w' => W,
                'm' => M,
                _ => 0,
            }
        }),
    }
}

/// Access the rule list grants to a device, evaluated in order with the
/// last matching rule winning and everything denied to start with (as runc
/// does).
fn granted(rules: &[LinuxDeviceCgroup], typ: LinuxDeviceType, major: i64, minor: i64) -> u8 {
    rules.iter().fold(0, |acc, rule| {
        let typ_ok = match rule.typ() {
            None | Some(LinuxDeviceType::A) => true,
            Some(LinuxDeviceType::U) => typ == LinuxDeviceType::C,
            Some(t) => t == typ,
        };
        let num_ok = |n: Option<i64>, want: i64| n.is_none_or(|n| n < 0 || n == want);
        if !(typ_ok && num_ok(rule.major(), major) && num_ok(rule.minor(), minor)) {
            return acc;
        }
        let bits = access_bits(rule.access().as_ref());
        if rule.allow() {
            acc | bits
        } else {
            acc & !bits
        }
    })
}

#[allow(deprecated)] // prestart is deprecated in the runtime spec but CDI still names it
fn hook_list(hooks: &mut Hooks, stage: HookStage) -> &mut Option<Vec<Hook>> {
    match stage {
        HookStage::Prestart => hooks.prestart_mut(),
        HookStage::CreateRuntime => hooks.create_runtime_mut(),
        HookStage::CreateContainer => hooks.create_container_mut(),
        HookStage::StartContainer => hooks.start_container_mut(),
        HookStage::Poststart => hooks.poststart_mut(),
        HookStage::Poststop => hooks.poststop_mut(),
    }
}

fn normalize(p: &Path) -> PathBuf {
    p.components().collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use oci_spec::runtime::{HookBuilder, MountBuilder};

    fn node(path: &str, major: i64, minor: i64) -> NodeEdit {
        NodeEdit {
            path: path.into(),
            typ: LinuxDeviceType::C,
            major,
            minor,
            file_mode: Some(0o666),
            access: "rwm".into(),
            uid: None,
            gid: None,
        }
    }

    fn hook(path: &str, args: &[&str]) -> Hook {
        HookBuilder::default()
            .path(path)
            .args(args.iter().map(|s| s.to_string()).collect::<Vec<_>>())
            .build()
            .unwrap()
    }

    fn mount(dest: &str) -> Mount {
        MountBuilder::default()
            .destination(dest)
            .source("/host/lib")
            .options(vec!["ro".to_string(), "bind".to_string()])
            .build()
            .unwrap()
    }

    fn rule(
        allow: bool,
        typ: Option<LinuxDeviceType>,
        major: Option<i64>,
        minor: Option<i64>,
        access: &str,
    ) -> LinuxDeviceCgroup {
        let mut r = LinuxDeviceCgroup::default();
        r.set_allow(allow)
            .set_typ(typ)
            .set_major(major)
            .set_minor(minor)
            .set_access(Some(access.to_string()));
        r
    }

    /// A spec as an engine hands it over: process env, a leading deny-all.
    fn engine_spec() -> Spec {
        serde_json::from_value(serde_json::json!({
            "ociVersion": "1.1.0",
            "process": {"user": {"uid": 0, "gid": 0}, "cwd": "/", "args": ["sh"],
                        "env": ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=all"]},
            "root": {"path": "rootfs"},
            "mounts": [{"destination": "/proc", "type": "proc", "source": "proc"}],
            "linux": {"resources": {"devices": [{"allow": false, "access": "rwm"}]}}
        }))
        .unwrap()
    }

    fn full_set() -> EditSet {
        EditSet {
            env: vec!["NVIDIA_VISIBLE_DEVICES=void".into(), "FOO=1".into()],
            nodes: vec![node("/dev/nvidia0", 195, 0), node("/dev/nvidiactl", 195, 255)],
            mounts: vec![mount("/usr/lib/libcuda.so.1")],
            hooks: vec![HookEdit {
                stage: HookStage::CreateContainer,
                hook: hook("/usr/bin/nvidia-cdi-hook", &["nvidia-cdi-hook", "update-ldcache"]),
            }],
            additional_gids: vec![0, 44],
        }
    }

    #[test]
    fn applies_everything_once() {
        let mut spec = engine_spec();
        let (mut stats, mut warnings) = (EditStats::default(), Vec::new());
        apply(&mut spec, &full_set(), &mut stats, &mut warnings);
        assert!(warnings.is_empty());
        assert_eq!(
            stats,
            EditStats {
                env_set: 2,
                nodes_added: 2,
                rules_added: 2,
                mounts_added: 1,
                hooks_added: 1,
                gids_added: 1,
                ..Default::default()
            }
        );
        let env = spec.process().as_ref().unwrap().env().clone().unwrap();
        assert_eq!(env, ["PATH=/bin", "NVIDIA_VISIBLE_DEVICES=void", "FOO=1"]);
        let linux = spec.linux().as_ref().unwrap();
        let devs = linux.devices().as_ref().unwrap();
        assert_eq!(devs.len(), 2);
        assert_eq!(
            (devs[0].major(), devs[0].minor(), devs[0].file_mode()),
            (195, 0, Some(0o666))
        );
        let rules = linux.resources().as_ref().unwrap().devices().as_ref().unwrap();
        assert_eq!(rules.len(), 3);
        assert!(!rules[0].allow(), "deny-all stays first");
        assert_eq!(
            rules[1],
            rule(true, Some(LinuxDeviceType::C), Some(195), Some(0), "rwm")
        );

        let before = spec.clone();
        let mut again = EditStats::default();
        apply(&mut spec, &full_set(), &mut again, &mut warnings);
        assert_eq!(spec, before, "second apply changes nothing");
        assert_eq!(
            again,
            EditStats {
                nodes_present: 2,
                mounts_present: 1,
                hooks_present: 1,
                ..Default::default()
            }
        );
    }

    #[test]
    fn present_node_without_rule_gets_one_from_the_present_node() {
        let mut spec = engine_spec();
        let mut present = LinuxDevice::default();
        present
            .set_path("/dev/nvidia0".into())
            .set_typ(LinuxDeviceType::C)
            .set_major(195)
            .set_minor(0);
        spec.linux_mut().as_mut().unwrap().set_devices(Some(vec![present]));
        let set = EditSet {
            nodes: vec![node("/dev/nvidia0", 999, 9)],
            ..Default::default()
        };
        let mut stats = EditStats::default();
        apply(&mut spec, &set, &mut stats, &mut Vec::new());
        assert_eq!((stats.nodes_present, stats.nodes_added, stats.rules_added), (1, 0, 1));
        let linux = spec.linux().as_ref().unwrap();
        assert_eq!(linux.devices().as_ref().unwrap().len(), 1);
        let rules = linux.resources().as_ref().unwrap().devices().as_ref().unwrap();
        assert_eq!(
            rules[1],
            rule(true, Some(LinuxDeviceType::C), Some(195), Some(0), "rwm")
        );
    }

    #[test]
    fn rule_coverage_table() {
        use LinuxDeviceType::*;
        let deny_all = rule(false, None, None, None, "rwm");
        for (rules, access, added) in [
            (vec![], "rwm", true),
            (vec![deny_all.clone()], "rwm", true),
            (
                vec![deny_all.clone(), rule(true, Some(C), Some(195), Some(0), "rwm")],
                "rwm",
                false,
            ),
            (
                vec![deny_all.clone(), rule(true, Some(C), Some(195), Some(0), "rw")],
                "rw",
                false,
            ),
            (
                vec![deny_all.clone(), rule(true, Some(C), Some(195), Some(0), "r")],
                "rw",
                true,
            ),
            (
                vec![deny_all.clone(), rule(true, Some(C), Some(195), None, "rwm")],
                "rwm",
                false,
            ),
            (
                vec![deny_all.clone(), rule(true, Some(C), Some(195), Some(-1), "rwm")],
                "rwm",
                false,
            ),
            (
                vec![deny_all.clone(), rule(true, Some(B), Some(195), Some(0), "rwm")],
                "rwm",
                true,
            ),
            (
                vec![deny_all.clone(), rule(true, Some(C), Some(195), Some(1), "rwm")],
                "rwm",
                true,
            ),
            // privileged: allow everything
            (vec![rule(true, Some(A), None, None, "rwm")], "rwm", false),
            (vec![rule(true, None, None, None, "")], "rwm", false),
            // a later deny takes the grant away again
            (
                vec![
                    rule(true, Some(C), Some(195), Some(0), "rwm"),
                    rule(false, Some(C), Some(195), None, "w"),
                ],
                "rw",
                true,
            ),
        ] {
            let mut spec = engine_spec();
            spec.linux_mut()
                .as_mut()
                .unwrap()
                .resources_mut()
                .as_mut()
                .unwrap()
                .set_devices(Some(rules.clone()));
            let mut n = node("/dev/nvidia0", 195, 0);
            n.access = access.into();
            let mut stats = EditStats::default();
            apply(
                &mut spec,
                &EditSet {
                    nodes: vec![n],
                    ..Default::default()
                },
                &mut stats,
                &mut Vec::new(),
            );
            assert_eq!(stats.rules_added == 1, added, "{rules:?} {access}");
        }
    }

    #[test]
    fn node_types_and_access() {
        let mut spec = engine_spec();
        let mut fifo = node("/dev/fifo", 0, 0);
        fifo.typ = LinuxDeviceType::P;
        let mut none = node("/dev/quiet", 10, 1);
        none.access = String::new();
        let mut u = node("/dev/unbuffered", 10, 2);
        u.typ = LinuxDeviceType::U;
        let mut blk = node("/dev/sdz", 8, 0);
        blk.typ = LinuxDeviceType::B;
        blk.access = "r".into();
        let set = EditSet {
            nodes: vec![fifo, none, u, blk],
            ..Default::default()
        };
        let mut stats = EditStats::default();
        apply(&mut spec, &set, &mut stats, &mut Vec::new());
        assert_eq!((stats.nodes_added, stats.rules_added), (4, 2));
        let rules = spec
            .linux()
            .as_ref()
            .unwrap()
            .resources()
            .as_ref()
            .unwrap()
            .devices()
            .clone()
            .unwrap();
        assert_eq!(rules[1], rule(true, Some(LinuxDeviceType::C), Some(10), Some(2), "rwm"));
        assert_eq!(rules[2], rule(true, Some(LinuxDeviceType::B), Some(8), Some(0), "r"));
    }

    #[test]
    fn node_owner_follows_non_root_process_user() {
        let mut spec = engine_spec();
        let user = spec.process_mut().as_mut().unwrap().user_mut();
        user.set_uid(1000);
        user.set_gid(1000);
        let mut owned = node("/dev/owned", 1, 1);
        owned.gid = Some(44);
        let set = EditSet {
            nodes: vec![node("/dev/a", 1, 2), owned],
            ..Default::default()
        };
        apply(&mut spec, &set, &mut EditStats::default(), &mut Vec::new());
        let devs = spec.linux().as_ref().unwrap().devices().clone().unwrap();
        assert_eq!((devs[0].uid(), devs[0].gid()), (Some(1000), Some(1000)));
        assert_eq!((devs[1].uid(), devs[1].gid()), (Some(1000), Some(44)));
        // root process: left unset, as CDI does
        let mut spec = engine_spec();
        apply(&mut spec, &set, &mut EditStats::default(), &mut Vec::new());
        let devs = spec.linux().as_ref().unwrap().devices().clone().unwrap();
        assert_eq!((devs[0].uid(), devs[0].gid()), (None, None));
    }

    #[test]
    fn env_replacement_table() {
        for (env, entry, want, changed) in [
            (vec![], "A=1", vec!["A=1"], true),
            (vec!["A=1"], "A=1", vec!["A=1"], false),
            (vec!["A=0", "B=2"], "A=1", vec!["A=1", "B=2"], true),
            (vec!["A=0", "B=2", "A=3"], "A=1", vec!["A=1", "B=2"], true),
            (vec!["A=1", "A=1"], "A=1", vec!["A=1"], true),
            (vec!["AB=1"], "A=1", vec!["AB=1", "A=1"], true),
        ] {
            let mut env: Vec<String> = env.into_iter().map(String::from).collect();
            assert_eq!(set_env(&mut env, entry), changed, "{env:?} {entry}");
            assert_eq!(env, want);
        }
    }

    #[test]
    fn hooks_and_mounts_dedup_and_stages() {
        let mut spec = engine_spec();
        let h = hook("/usr/bin/nvidia-cdi-hook", &["nvidia-cdi-hook", "update-ldcache"]);
        let other_args = hook("/usr/bin/nvidia-cdi-hook", &["nvidia-cdi-hook", "create-symlinks"]);
        let set = EditSet {
            hooks: vec![
                HookEdit {
                    stage: HookStage::CreateContainer,
                    hook: h.clone(),
                },
                HookEdit {
                    stage: HookStage::CreateContainer,
                    hook: h.clone(),
                },
                HookEdit {
                    stage: HookStage::CreateContainer,
                    hook: other_args,
                },
                HookEdit {
                    stage: HookStage::Poststop,
                    hook: h.clone(),
                },
            ],
            mounts: vec![mount("/usr/lib/x"), mount("/usr/lib/x/"), mount("/proc")],
            ..Default::default()
        };
        let mut stats = EditStats::default();
        apply(&mut spec, &set, &mut stats, &mut Vec::new());
        assert_eq!((stats.hooks_added, stats.hooks_present), (3, 1));
        assert_eq!((stats.mounts_added, stats.mounts_present), (1, 2));
        let hooks = spec.hooks().as_ref().unwrap();
        assert_eq!(hooks.create_container().as_ref().unwrap().len(), 2);
        assert_eq!(hooks.poststop().as_ref().unwrap().len(), 1);
        for (name, stage) in [
            ("prestart", Some(HookStage::Prestart)),
            ("createRuntime", Some(HookStage::CreateRuntime)),
            ("createContainer", Some(HookStage::CreateContainer)),
            ("startContainer", Some(HookStage::StartContainer)),
            ("poststart", Some(HookStage::Poststart)),
            ("poststop", Some(HookStage::Poststop)),
            ("CreateContainer", None),
        ] {
            assert_eq!(HookStage::parse(name), stage);
        }
    }

    #[test]
    fn missing_sections_are_created_and_missing_process_warns() {
        let mut spec: Spec = serde_json::from_value(serde_json::json!({"ociVersion": "1.1.0"})).unwrap();
        let mut warnings = Vec::new();
        apply(&mut spec, &full_set(), &mut EditStats::default(), &mut warnings);
        assert_eq!(warnings.len(), 1);
        let linux = spec.linux().as_ref().unwrap();
        assert!(linux.namespaces().is_none(), "no default namespaces invented");
        assert_eq!(linux.devices().as_ref().unwrap().len(), 2);
        assert_eq!(linux.resources().as_ref().unwrap().devices().as_ref().unwrap().len(), 2);
    }
}
