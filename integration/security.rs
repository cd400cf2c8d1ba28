//! The hardening policy through real engines and runc, with `runtime-conf/gantry-hardened.toml`:
//! through containerd (`ctr`) and through the CRI-O-style start (ttrpc), what the container gets
//! (seen from the host in /proc/PID/status and from inside), what is refused, and that a
//! refusal leaves nothing behind.

use containerd_shim_protos::api::CreateTaskRequest;
use serde_json::Value;
use ttrpc::Code;

use crate::common::task::task;
use crate::common::{
    assert_clean, code, crio_bundle, crio_start, ctx, env, message, open_fifo_reader, runtimeoptions_any, task_client,
    text, CrioBundle, Ns,
};

/// The hardened example with some `[security]` keys replaced.
fn hardened(over: &[(&str, toml::Value)]) -> String {
    let mut doc: toml::Table = include_str!("../runtime-conf/gantry-hardened.toml").parse().unwrap();
    let security = doc.get_mut("security").and_then(toml::Value::as_table_mut).unwrap();
    for (k, v) in over {
        security.insert(k.to_string(), v.clone());
    }
    toml::to_string(&doc).unwrap()
}

fn caps(list: &[&str]) -> toml::Value {
    toml::Value::Array(list.iter().map(|c| toml::Value::String(c.to_string())).collect())
}

/// A field of /proc/PID/status, e.g. `Seccomp` -> "2".
fn status_field(status: &str, field: &str) -> String {
    status
        .lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .map(|v| v.trim().to_string())
        .unwrap_or_else(|| panic!("no {field} in {status}"))
}

fn has_cap(status: &str, set: &str, bit: u32) -> bool {
    u64::from_str_radix(&status_field(status, set), 16).unwrap() & (1 << bit) != 0
}

const CAP_NET_RAW: u32 = 13;

/// Runs `sleep` detached through ctr, returns init's /proc status (read from the host) and
/// the bundle's config.json as the runtime got it, then removes the container.
fn run_and_inspect(ns: &Ns, id: &str, extra: &[&str]) -> (String, Value) {
    let env = env();
    let o = env.ctr_run_detached(ns, id, extra, &["sleep", "1000"]);
    assert!(o.status.success(), "{}", text(&o));
    let tasks = env.ctr(&ns.name, &["task", "ls"]);
    let pid: i32 = String::from_utf8_lossy(&tasks.stdout)
        .lines()
        .find(|l| l.split_whitespace().next() == Some(id))
        .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        .unwrap();
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap();
    let spec = serde_json::from_slice(&std::fs::read(env.bundle(&ns.name, id).join("config.json")).unwrap()).unwrap();
    env.kill_and_remove(&ns.name, id);
    (status, spec)
}

/// `ctr run` that must fail; returns stderr after removing the container record.
fn refused(ns: &Ns, id: &str, extra: &[&str]) -> String {
    let env = env();
    let o = env.ctr_run(ns, id, extra, &["true"]);
    assert!(!o.status.success(), "{id} ran: {}", text(&o));
    let _ = env.ctr(&ns.name, &["container", "delete", id]);
    String::from_utf8_lossy(&o.stderr).into_owned()
}

/// A shell workload and the calls the profile must stop; prints one marker per step.
fn workload(port: u16) -> String {
    format!(
        "grep Seccomp: /proc/1/status; ls / >/dev/null && cat /proc/1/status >/dev/null && sleep 0.1 && echo basic-ok; \
         printf 'HTTP/1.0 200 OK\\r\\n\\r\\nhello-over-tcp' | nc -l -p {port} >/dev/null & sleep 0.5; \
         wget -q -O - http://127.0.0.1:{port}/; echo; \
         unshare -U true; echo unshare-user=$?; unshare -m true; echo unshare-mount=$?; \
         mount -t tmpfs x /tmp; echo mount=$?; reboot -f; echo reboot=$?"
    )
}

#[test]
fn unconfined_busybox_gets_the_runtime_default_profile() {
    let env = env();
    let port = 20000 + (std::process::id() % 10000) as u16;
    let ns = env.namespace_with("sec-default", &hardened(&[]));
    let o = env.ctr_run(&ns, "w1", &["--net-host"], &["sh", "-c", &workload(port)]);
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert!(out.contains("Seccomp:\t2"), "{out}");
    assert!(out.contains("basic-ok") && out.contains("hello-over-tcp"), "{out}");
    for step in ["unshare-user", "unshare-mount", "mount", "reboot"] {
        assert!(!out.contains(&format!("{step}=0")), "{step} succeeded: {out}");
    }
    assert!(out.contains("Operation not permitted"), "{out}");

    // Without the policy the same container is unconfined and may create a user namespace.
    let plain = env.namespace("sec-plain");
    let o = env.ctr_run(&plain, "w2", &["--net-host"], &["sh", "-c", &workload(port + 1)]);
    let out = text(&o);
    assert!(out.contains("Seccomp:\t0") && out.contains("unshare-user=0"), "{out}");
    assert_clean(env, &ns);
    assert_clean(env, &plain);
}

#[test]
fn sys_admin_in_the_bounding_set_unlocks_unshare() {
    let env = env();
    let mut allowed: Vec<&str> = vec!["CAP_SYS_ADMIN"];
    allowed.extend(gantry::security::DEFAULT_CAPS);
    let ns = env.namespace_with("sec-sysadmin", &hardened(&[("allowed_capabilities", caps(&allowed))]));
    let o = env.ctr_run(
        &ns,
        "s1",
        &["--cap-add", "CAP_SYS_ADMIN"],
        &[
            "sh",
            "-c",
            "grep Seccomp: /proc/1/status; unshare -m true; echo unshare-mount=$?",
        ],
    );
    let out = text(&o);
    assert!(out.contains("Seccomp:\t2") && out.contains("unshare-mount=0"), "{out}");
    assert_clean(env, &ns);
}

#[test]
fn privileged_containers_get_no_profile_or_are_refused() {
    let env = env();
    let ns = env.namespace_with("sec-priv", &hardened(&[("allow_privileged", true.into())]));
    let (status, spec) = run_and_inspect(&ns, "p1", &["--privileged"]);
    assert_eq!(status_field(&status, "Seccomp"), "0");
    assert_eq!(spec["annotations"]["gantry.dev/seccomp"], "unconfined");
    assert_eq!(spec["annotations"]["gantry.dev/privileged"], "true");
    assert_clean(env, &ns);

    let strict = env.namespace_with("sec-nopriv", &hardened(&[]));
    let err = refused(&strict, "p2", &["--privileged"]);
    assert!(
        err.contains("\"p2\"") && err.contains("security.allow_privileged"),
        "{err}"
    );
    assert_clean(env, &strict);
}

#[test]
fn capabilities_outside_the_allow_list_are_dropped_or_refused() {
    let env = env();
    let ns = env.namespace_with("sec-caps", &hardened(&[]));
    let (status, spec) = run_and_inspect(&ns, "c1", &[]);
    for set in ["CapBnd", "CapEff", "CapPrm"] {
        assert!(!has_cap(&status, set, CAP_NET_RAW), "{set}: {status}");
    }
    assert!(has_cap(&status, "CapBnd", 0), "CAP_CHOWN kept: {status}");
    assert_eq!(status_field(&status, "NoNewPrivs"), "1");
    let dropped = spec["annotations"]["gantry.dev/capabilities-dropped"].as_str().unwrap();
    assert!(
        dropped.contains("CAP_NET_RAW") && dropped.contains("CAP_MKNOD"),
        "{dropped}"
    );
    assert_eq!(spec["annotations"]["gantry.dev/seccomp"], "runtime-default");
    assert_eq!(spec["root"]["readonly"], true);

    // The engine's set is what the container gets without the policy.
    let plain = env.namespace("sec-caps-plain");
    let (status, _) = run_and_inspect(&plain, "c2", &[]);
    assert!(has_cap(&status, "CapBnd", CAP_NET_RAW), "{status}");

    let strict = env.namespace_with(
        "sec-caps-reject",
        &hardened(&[("capability_violation", "reject".into())]),
    );
    let err = refused(&strict, "c3", &[]);
    assert!(
        err.contains("\"c3\"") && err.contains("security.allowed_capabilities"),
        "{err}"
    );
    assert!(err.contains("CAP_"), "{err}");
    assert_clean(env, &ns);
    assert_clean(env, &plain);
    assert_clean(env, &strict);
}

#[test]
fn execs_stay_within_the_containers_policy() {
    let env = env();
    let ns = env.namespace_with("sec-exec", &hardened(&[]));
    let o = env.ctr_run_detached(&ns, "x1", &[], &["sleep", "1000"]);
    assert!(o.status.success(), "{}", text(&o));
    // ctr builds the exec's process from the container's spec as it sent it (CAP_NET_RAW, no
    // no_new_privileges); the exec must not get back what the policy took from init.
    let o = env.ctr(
        &ns.name,
        &["task", "exec", "--exec-id", "st", "x1", "cat", "/proc/self/status"],
    );
    let status = text(&o);
    assert!(o.status.success(), "{status}");
    for set in ["CapBnd", "CapEff", "CapPrm"] {
        assert!(!has_cap(&status, set, CAP_NET_RAW), "{set}: {status}");
    }
    assert_eq!(status_field(&status, "NoNewPrivs"), "1");
    assert_eq!(status_field(&status, "Seccomp"), "2");
    env.kill_and_remove(&ns.name, "x1");
    assert_clean(env, &ns);
}

#[test]
fn engine_profile_through_containerd_is_kept() {
    let env = env();
    let ns = env.namespace_with("sec-engine", &hardened(&[]));
    let (status, spec) = run_and_inspect(&ns, "e1", &["--seccomp"]);
    assert_eq!(status_field(&status, "Seccomp"), "2");
    assert_eq!(spec["annotations"]["gantry.dev/seccomp"], "engine");
    assert_clean(env, &ns);
}

/// A config file for one CRI-O container (sent as the runtime options' config path).
fn config_file(ns: &Ns, name: &str, toml: &str) -> std::path::PathBuf {
    let p = ns.dir.join(format!("{name}.toml"));
    std::fs::write(&p, toml).unwrap();
    p
}

fn create_req(b: &CrioBundle, config: &std::path::Path) -> CreateTaskRequest {
    let mut r = crate::common::crio_create_req(b);
    r.options = protobuf::MessageField::some(runtimeoptions_any(config));
    r
}

/// Creates and starts `b` under `config`, returns init's /proc status and the spec the runtime
/// got, then kills and deletes it.
async fn crio_run(
    client: &containerd_shim_protos::shim_async::TaskClient,
    b: &CrioBundle,
    config: &std::path::Path,
) -> (String, Value) {
    let _out = open_fifo_reader(&b.stdout);
    let created = client.create(ctx(), &create_req(b, config)).await.unwrap();
    let t = task(client, &b.id);
    t.start().await.unwrap();
    let status = std::fs::read_to_string(format!("/proc/{}/status", created.pid)).unwrap();
    let spec = serde_json::from_slice(&std::fs::read(b.dir.join("config.json")).unwrap()).unwrap();
    t.kill(9).await.unwrap();
    t.wait().await.unwrap();
    t.delete().await.unwrap();
    (status, spec)
}

/// Create must fail with INVALID_ARGUMENT naming the container and `want`; config.json stays
/// byte for byte as the engine wrote it.
async fn crio_refused(
    client: &containerd_shim_protos::shim_async::TaskClient,
    b: &CrioBundle,
    config: &std::path::Path,
    want: &[&str],
) {
    let before = std::fs::read(b.dir.join("config.json")).unwrap();
    let e = client.create(ctx(), &create_req(b, config)).await.unwrap_err();
    assert_eq!(code(&e), Code::INVALID_ARGUMENT, "{}", message(&e));
    let msg = message(&e);
    assert!(msg.contains(&format!("{:?}", b.id)), "{msg}");
    for w in want {
        assert!(msg.contains(w), "{w:?} not in {msg}");
    }
    assert_eq!(std::fs::read(b.dir.join("config.json")).unwrap(), before);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn crio_annotations_engine_profiles_and_apparmor() {
    let env = env();
    let ns = env.namespace("sec-crio");
    let pod = crio_bundle(&ns, "secpod", "secpod", &["sleep", "1000"], |_| {});
    let o = crio_start(&ns, &pod.dir, "secpod", b"");
    assert!(o.status.success(), "{}", text(&o));
    let client = task_client(&String::from_utf8(o.stdout).unwrap()).await;
    let _pod_out = open_fifo_reader(&pod.stdout);
    client
        .create(ctx(), &crate::common::crio_create_req(&pod))
        .await
        .unwrap();

    let strict = config_file(&ns, "strict", &hardened(&[]));
    let lenient = config_file(&ns, "lenient", &hardened(&[("allow_unconfined", true.into())]));
    let unconfined = |s: &mut Value| {
        s["annotations"]["io.kubernetes.cri-o.SeccompProfilePath"] = "Unconfined".into();
    };
    let b = crio_bundle(&ns, "unc1", "secpod", &["sleep", "1000"], unconfined);
    let (status, spec) = crio_run(&client, &b, &lenient).await;
    assert_eq!(status_field(&status, "Seccomp"), "0");
    assert_eq!(spec["annotations"]["gantry.dev/seccomp"], "unconfined");
    let b = crio_bundle(&ns, "unc2", "secpod", &["sleep", "1000"], unconfined);
    let (status, spec) = crio_run(&client, &b, &strict).await;
    assert_eq!(status_field(&status, "Seccomp"), "2");
    assert_eq!(spec["annotations"]["gantry.dev/seccomp"], "runtime-default");

    // Engine profiles that the policy refuses, each naming the rule and the key.
    let profile = |p: Value| {
        move |s: &mut Value| {
            s["linux"]["seccomp"] = p;
        }
    };
    let unknown = serde_json::json!({"defaultAction": "SCMP_ACT_ERRNO",
        "syscalls": [{"names": ["read", "notasyscall"], "action": "SCMP_ACT_ALLOW"}]});
    let b = crio_bundle(&ns, "bad1", "secpod", &["true"], profile(unknown));
    crio_refused(
        &client,
        &b,
        &strict,
        &["notasyscall", "syscalls[0]", "security.unknown_syscalls"],
    )
    .await;
    let arch = serde_json::json!({"defaultAction": "SCMP_ACT_ERRNO", "architectures": ["SCMP_ARCH_X86_64", "SCMP_ARCH_PDP11"]});
    let b = crio_bundle(&ns, "bad2", "secpod", &["true"], profile(arch));
    crio_refused(&client, &b, &strict, &["architectures[1]", "SCMP_ARCH_PDP11"]).await;
    let allow = serde_json::json!({"defaultAction": "SCMP_ACT_ALLOW",
        "syscalls": [{"names": ["kexec_load"], "action": "SCMP_ACT_ERRNO"}]});
    let b = crio_bundle(&ns, "bad3", "secpod", &["true"], profile(allow));
    crio_refused(
        &client,
        &b,
        &strict,
        &["defaultAction", "security.require_default_deny"],
    )
    .await;

    // AppArmor on this host (none): dropped and recorded, or refused.
    let apparmor = |s: &mut Value| {
        s["process"]["apparmorProfile"] = "crio-default".into();
    };
    // The host's own securityfs and sysfs. With AppArmor (the node lane's guest) a profile
    // the host has not loaded is refused, whatever apparmor_unavailable says.
    if std::path::Path::new("/sys/kernel/security/apparmor").exists() {
        let reject = config_file(&ns, "reject", &hardened(&[]));
        let b = crio_bundle(&ns, "aa2", "secpod", &["true"], apparmor);
        crio_refused(&client, &b, &reject, &["crio-default", "is not loaded"]).await;
        crate::common::crio_kill_and_remove(&client, "secpod").await;
        assert_clean(env, &ns);
        return;
    }
    // This project's kernels have no AppArmor.
    let drop = vec![("apparmor_unavailable", toml::Value::from("drop"))];
    let drop = config_file(&ns, "drop", &hardened(&drop));
    let b = crio_bundle(&ns, "aa1", "secpod", &["sleep", "1000"], apparmor);
    let (_, spec) = crio_run(&client, &b, &drop).await;
    assert_eq!(spec["annotations"]["gantry.dev/apparmor"], "dropped:crio-default");
    assert!(spec["process"].get("apparmorProfile").is_none());
    let reject = config_file(&ns, "reject", &hardened(&[]));
    let b = crio_bundle(&ns, "aa2", "secpod", &["true"], apparmor);
    crio_refused(&client, &b, &reject, &["crio-default", "security.apparmor_unavailable"]).await;

    crate::common::crio_kill_and_remove(&client, "secpod").await;
    assert_clean(env, &ns);
}

/// Sets `[devices] nvidia_visible_devices` in a GPU namespace's config (read at each Create).
fn env_opt_in(ns: &Ns, on: bool) {
    let text = std::fs::read_to_string(&ns.config).unwrap();
    let text = text.replace(
        &format!("nvidia_visible_devices = {}", !on),
        &format!("nvidia_visible_devices = {on}"),
    );
    std::fs::write(&ns.config, text).unwrap();
}

fn gpu_nodes(out: &str) -> Vec<String> {
    let mut nodes: Vec<String> = out
        .split_whitespace()
        .filter(|w| w.starts_with("nvidia") && w[6..].chars().all(|c| c.is_ascii_digit()) && w.len() > 6)
        .map(String::from)
        .collect();
    nodes.sort();
    nodes
}

#[test]
fn nvidia_visible_devices_is_opt_in_for_unprivileged_containers() {
    let env = env();
    let host = crate::gpu::gpu_host("sec-gpu-env");
    let list = ["sh", "-c", "ls /dev; echo listed"];
    let all = ["--env", "NVIDIA_VISIBLE_DEVICES=all"];
    env_opt_in(&host.ns, false);
    let o = env.ctr_run(&host.ns, "ge1", &all, &list);
    assert!(o.status.success() && text(&o).contains("listed"), "{}", text(&o));
    assert!(gpu_nodes(&text(&o)).is_empty(), "{}", text(&o));
    // Privileged containers are trusted either way.
    let mut privileged = all.to_vec();
    privileged.push("--privileged");
    let o = env.ctr_run(
        &host.ns,
        "ge2",
        &privileged,
        &["sh", "-c", "ls /dev/nvidia0 /dev/nvidia1"],
    );
    assert!(o.status.success(), "{}", text(&o));
    env_opt_in(&host.ns, true);
    let o = env.ctr_run(&host.ns, "ge3", &all, &list);
    assert_eq!(gpu_nodes(&text(&o)), ["nvidia0", "nvidia1"], "{}", text(&o));
    assert_clean(env, &host.ns);
}

#[test]
fn volume_mounts_inject_exactly_the_listed_gpus_and_execs_get_the_injected_env() {
    let env = env();
    let host = crate::gpu::gpu_host("sec-gpu-mounts");
    env_opt_in(&host.ns, false);
    let mount = "type=bind,src=/dev/null,dst=/var/run/nvidia-container-devices/1,options=rbind:ro";
    let o = env.ctr_run_detached(&host.ns, "gm1", &["--mount", mount], &["sleep", "1000"]);
    assert!(o.status.success(), "{}", text(&o));
    let o = env.ctr(
        &host.ns.name,
        &["task", "exec", "--exec-id", "ls", "gm1", "sh", "-c", "ls /dev; env"],
    );
    let out = text(&o);
    assert!(o.status.success(), "{out}");
    assert_eq!(gpu_nodes(&out), ["nvidia1"], "{out}");
    // The CDI spec's env edit reached init; the engine's exec process did not carry it.
    assert!(out.contains("NVIDIA_VISIBLE_DEVICES=void"), "{out}");
    let spec: Value =
        serde_json::from_slice(&std::fs::read(env.bundle(&host.ns.name, "gm1").join("config.json")).unwrap()).unwrap();
    assert_eq!(spec["annotations"]["gantry.dev/injected-devices"], "nvidia.com/gpu=1");
    env.kill_and_remove(&host.ns.name, "gm1");
    assert_clean(env, &host.ns);
}
