//! The bad-input catalogue: table-driven cases of everything an engine, a direct caller or a
//! broken node can hand gantry. Each case asserts the ttrpc code (or the `start` outcome),
//! that the message names the problem, and that nothing is left behind.

use std::path::Path;
use std::process::{Command, Stdio};

use containerd_shim_protos::api::CreateTaskRequest;
use protobuf::well_known_types::any::Any;
use protobuf::MessageField;
use ttrpc::Code;

use crate::common::task::{process_any, task, Task};
use crate::common::{
    assert_clean, code, crio_bundle, crio_create_req, crio_kill_and_remove, crio_start, ctx, env, message,
    open_fifo_reader, run, runtimeoptions_any, task_client, text, SHIM,
};

type Patch = fn(&mut serde_json::Value);
type Request = Box<dyn Fn(&mut CreateTaskRequest, &Path)>;

/// A Create that must be refused: how its bundle and request differ from a good one.
struct CreateCase {
    name: &'static str,
    patch: Patch,
    /// Replaces config.json with these bytes when set.
    raw: Option<fn() -> Vec<u8>>,
    request: Request,
    code: Code,
    says: &'static str,
}

const INVALID: Code = Code::INVALID_ARGUMENT;

fn keep(_: &mut serde_json::Value) {}

fn json_any(type_url: &str, v: serde_json::Value) -> Any {
    let mut any = Any::new();
    any.type_url = type_url.into();
    any.value = serde_json::to_vec(&v).unwrap();
    any
}

/// A case that changes config.json (through `patch`) and the request.
fn both(name: &'static str, patch: Patch, request: Request, code: Code, says: &'static str) -> CreateCase {
    CreateCase {
        name,
        patch,
        raw: None,
        request,
        code,
        says,
    }
}

/// A case that changes config.json only.
fn spec(name: &'static str, patch: Patch, code: Code, says: &'static str) -> CreateCase {
    both(name, patch, Box::new(|_, _| {}), code, says)
}

/// A case that changes the request only.
fn req(name: &'static str, request: fn(&mut CreateTaskRequest, &Path), code: Code, says: &'static str) -> CreateCase {
    both(name, keep, Box::new(request), code, says)
}

/// A case whose config.json is these bytes.
fn raw(name: &'static str, raw: fn() -> Vec<u8>, code: Code, says: &'static str) -> CreateCase {
    CreateCase {
        raw: Some(raw),
        ..spec(name, keep, code, says)
    }
}

/// A case whose request points at a shim config file holding `text` (and changes config.json
/// through `patch`).
fn shim_config(name: &'static str, patch: Patch, text: &'static str, says: &'static str) -> CreateCase {
    let file = format!("{}.toml", name.replace(' ', "-"));
    let request = move |r: &mut CreateTaskRequest, bundle: &Path| {
        let path = bundle.parent().unwrap().join(&file);
        std::fs::write(&path, text).unwrap();
        r.options = MessageField::some(runtimeoptions_any(&path));
    };
    both(name, patch, Box::new(request), INVALID, says)
}

fn create_cases() -> Vec<CreateCase> {
    let mut cases = spec_cases();
    cases.extend(request_cases());
    cases.extend(config_cases());
    cases
}

/// config.json that is not a spec, or a spec the runtime cannot run.
#[rustfmt::skip] // one case a line: rustfmt would spread each over seven
fn spec_cases() -> Vec<CreateCase> {
    vec![
        raw("truncated json", || b"{\"ociVersion\": \"1.0.2\", \"process\": [".to_vec(), INVALID, "config.json"),
        raw("not json at all", || b"\x00\x01garbage".to_vec(), INVALID, "malformed"),
        raw("empty file", Vec::new, INVALID, "malformed"),
        raw("a json array", || b"[1, 2, 3]".to_vec(), INVALID, "malformed"),
        spec("process of the wrong type", |s| s["process"] = "sh".into(), INVALID, "malformed"),
        spec("args of the wrong type", |s| s["process"]["args"] = 7.into(), INVALID, "malformed"),
        spec("annotations of the wrong type", |s| s["annotations"] = serde_json::json!([1]), INVALID, "malformed"),
        spec("root of the wrong type", |s| s["root"] = "x".into(), INVALID, "malformed"),
        spec("missing rootfs", |s| s["root"]["path"] = "/nonexistent/rootfs".into(), INVALID, "/nonexistent/rootfs"),
        spec("missing root", |s| drop(s.as_object_mut().unwrap().remove("root")), INVALID, "rootfs"),
        spec("missing process", |s| drop(s.as_object_mut().unwrap().remove("process")), Code::UNKNOWN, "process"),
        spec("executable not found", |s| s["process"]["args"] = serde_json::json!(["/no/such/binary"]), Code::UNKNOWN, "/no/such/binary"),
        spec("netns path that does not exist", |s| {
            let bad = serde_json::json!({"type": "network", "path": "/proc/self/ns/no-such-ns"});
            s["linux"]["namespaces"].as_array_mut().unwrap().push(bad);
        }, Code::UNKNOWN, "no-such-ns"),
        spec("unknown CDI device", |s| s["annotations"]["gantry.dev/devices"] = "nvidia.com/gpu=7".into(), INVALID, "nvidia.com/gpu=7"),
        spec("malformed CDI name", |s| s["annotations"]["gantry.dev/devices"] = "not a device name".into(), INVALID, "not a device name"),
        spec("CDI annotation naming an unknown vendor", |s| s["annotations"]["cdi.k8s.io/x"] = "example.com/nic=0".into(), INVALID, "example.com/nic=0"),
        spec("seccomp profile with an invalid architecture", |s| {
            s["linux"]["seccomp"] = serde_json::json!({"defaultAction": "SCMP_ACT_ERRNO",
                "architectures": ["SCMP_ARCH_NOPE"], "syscalls": []});
        }, INVALID, "SCMP_ARCH_NOPE"),
        spec("seccomp rule with an argument index past 5", |s| {
            s["linux"]["seccomp"] = serde_json::json!({"defaultAction": "SCMP_ACT_ERRNO",
                "syscalls": [{"names": ["clone"], "action": "SCMP_ACT_ALLOW",
                    "args": [{"index": 9, "value": 1, "op": "SCMP_CMP_EQ"}]}]});
        }, INVALID, "index"),
    ]
}

/// Requests with a bad id, bundle, checkpoint, stdio or rootfs mount.
#[rustfmt::skip] // one case a line: rustfmt would spread each over seven
fn request_cases() -> Vec<CreateCase> {
    let rootfs = |type_: &str, source: &str, options: &[&str]| {
        vec![containerd_shim_protos::types::mount::Mount {
            type_: type_.into(),
            source: source.into(),
            options: options.iter().map(|o| o.to_string()).collect(),
            ..Default::default()
        }]
    };
    let rootfs_case = |name, r: Request, says| both(name, |s| s["root"]["path"] = "rootfs".into(), r, INVALID, says);
    vec![
        req("id with a slash", |r, _| r.id = "a/b".into(), INVALID, "invalid id"),
        req("id ..", |r, _| r.id = "..".into(), INVALID, "invalid id"),
        req("id escaping", |r, _| r.id = "../escape".into(), INVALID, "invalid id"),
        req("empty id", |r, _| r.id = String::new(), INVALID, "invalid id"),
        req("id with NUL", |r, _| r.id = "a\0b".into(), INVALID, "invalid id"),
        req("id with a space", |r, _| r.id = "a b".into(), INVALID, "invalid id"),
        req("id of 1025 bytes", |r, _| r.id = "x".repeat(1025), INVALID, "invalid id"),
        req("relative bundle", |r, _| r.bundle = "relative/bundle".into(), INVALID, "relative/bundle"),
        req("missing bundle", |r, _| r.bundle = "/nonexistent/bundle".into(), INVALID, "/nonexistent/bundle"),
        req("restore from a checkpoint", |r, _| r.checkpoint = "/tmp/cp".into(), Code::UNIMPLEMENTED, "checkpoint"),
        req("stdin that does not exist", |r, d| r.stdin = d.join("no-stdin").to_str().unwrap().into(), INVALID, "no-stdin"),
        req("stdout in a missing directory", |r, d| r.stdout = d.join("gone/out").to_str().unwrap().into(), INVALID, "gone/out"),
        req("stdout that is a directory", |r, d| r.stdout = d.to_str().unwrap().into(), INVALID, "stdout"),
        req("stdout with an unknown scheme", |r, _| r.stdout = "tcp://127.0.0.1:9".into(), INVALID, "tcp://"),
        req("relative file:// stdout", |r, _| r.stdout = "file://rel/out.log".into(), INVALID, "absolute"),
        req("relative binary:// stdout", |r, _| r.stdout = "binary://logger".into(), INVALID, "absolute"),
        req("binary:// logger that does not exist", |r, _| r.stdout = "binary:///no/such/logger".into(), INVALID, "/no/such/logger"),
        req("file:// into a read-only directory", |r, d| {
            r.stdout = format!("file://{}/ro/out.log", d.parent().unwrap().parent().unwrap().display());
        }, INVALID, "Read-only"),
        rootfs_case("unknown rootfs mount type", Box::new(move |r, _| r.rootfs = rootfs("no-such-fs", "none", &[])), "no-such-fs"),
        rootfs_case("rootfs bind of a missing source", Box::new(move |r, _| r.rootfs = rootfs("bind", "/nonexistent/layer", &["rbind"])), "/nonexistent/layer"),
    ]
}

/// Shim configs that do not load, and specs the security policy refuses.
#[rustfmt::skip] // one case a line: rustfmt would spread each over seven
fn config_cases() -> Vec<CreateCase> {
    vec![
        shim_config("shim config with a syntax error", keep, "[runtime\nbinary = 1", "syntax-error.toml"),
        shim_config("shim config with an unknown key", keep, "[runtime]\nbinnary = \"crun\"\n", "binnary"),
        shim_config("shim config error names its line", keep, "[runtime]\n\nsystemd_cgroup = \"maybe\"\n", "line 3"),
        shim_config("shim config with a wrong type", keep, "[runtime]\nsystemd_cgroup = \"maybe\"\n", "runtime.systemd_cgroup"),
        req("shim config that does not exist", |r, d| r.options = MessageField::some(runtimeoptions_any(&d.join("absent.toml"))), INVALID, "absent.toml"),
        CreateCase {
            code: Code::UNKNOWN,
            ..shim_config("OCI runtime that does not exist", keep, "[runtime]\nbinary = \"/nonexistent/runc\"\n", "/nonexistent/runc")
        },
        shim_config("seccomp profile naming an unknown syscall", |s| {
            s["linux"]["seccomp"] = serde_json::json!({"defaultAction": "SCMP_ACT_ERRNO",
                "syscalls": [{"names": ["notasyscall"], "action": "SCMP_ACT_ALLOW"}]});
        }, "[security]\nunknown_syscalls = \"reject\"\n", "notasyscall"),
        shim_config("allow-by-default seccomp profile under require_default_deny", |s| {
            s["linux"]["seccomp"] = serde_json::json!({"defaultAction": "SCMP_ACT_ALLOW", "syscalls": []});
        }, "[security]\nrequire_default_deny = true\n", "SCMP_ACT_ALLOW"),
        shim_config("capability outside the allow-list", keep,
            "[security]\nallowed_capabilities = [\"CAP_KILL\"]\ncapability_violation = \"reject\"\n", "CAP_AUDIT_WRITE"),
        shim_config("privileged container where none is allowed", |s| {
            let all = serde_json::json!(["CAP_SYS_ADMIN", "CAP_SYS_MODULE", "CAP_SYS_RAWIO", "CAP_KILL"]);
            for set in ["bounding", "effective", "permitted"] {
                s["process"]["capabilities"][set] = all.clone();
            }
        }, "[security]\nallow_privileged = false\n", "privileged"),
        shim_config("AppArmor profile on a host without AppArmor, under reject", |s| s["process"]["apparmorProfile"] = "gantry-test".into(),
            "[security]\napparmor_unavailable = \"reject\"\n", "gantry-test"),
    ]
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refused_creates_name_the_problem_and_leave_nothing() {
    let env = env();
    let ns = env.namespace("catalogue");
    // A read-only directory for the file:// case.
    let ro = ns.dir.join("ro");
    std::fs::create_dir_all(&ro).unwrap();
    let o = run(Command::new("mount")
        .args(["-t", "tmpfs", "-o", "ro,size=64k", "tmpfs"])
        .arg(&ro));
    assert!(o.status.success(), "{}", text(&o));
    let host = ns.dir.join("host");
    let b = crio_bundle(&ns, "cat-host", "cat-host", &["sleep", "60"], |_| {});
    std::fs::rename(&b.dir, &host).unwrap();
    let o = crio_start(&ns, &host, "cat-host", b"");
    assert!(o.status.success(), "{}", text(&o));
    let client = task_client(&String::from_utf8(o.stdout).unwrap()).await;

    let cases = create_cases();
    assert!(cases.len() >= 40, "{} create cases", cases.len());
    let mut failures = Vec::new();
    for (i, case) in cases.iter().enumerate() {
        let id = format!("cat{i}");
        let b = crio_bundle(&ns, &id, "cat-host", &["true"], case.patch);
        if let Some(raw) = case.raw {
            std::fs::write(b.dir.join("config.json"), raw()).unwrap();
        }
        let before = std::fs::read(b.dir.join("config.json")).unwrap();
        let _out = open_fifo_reader(&b.stdout);
        let mut req = crio_create_req(&b);
        (case.request)(&mut req, &b.dir);
        match client.create(ctx(), &req).await {
            Ok(_) => failures.push(format!("{}: accepted", case.name)),
            Err(e) if code(&e) != case.code || !message(&e).contains(case.says) => {
                failures.push(format!("{}: {:?} {:?}", case.name, code(&e), message(&e)));
            }
            Err(_) => {}
        }
        if std::fs::read(b.dir.join("config.json")).unwrap() != before {
            failures.push(format!("{}: config.json changed", case.name));
        }
        let left: Vec<_> = ["init.pid", "gantry-runtime.json", "log.json", "oom"]
            .iter()
            .filter(|f| b.dir.join(f).exists())
            .collect();
        if !left.is_empty() {
            failures.push(format!("{}: left {left:?}", case.name));
        }
        if ns.runtime_root.join(&ns.name).join(&id).exists() {
            failures.push(format!("{}: runtime state left", case.name));
        }
        std::fs::remove_dir_all(&b.dir).unwrap();
    }
    assert!(
        failures.is_empty(),
        "{} of {} cases:\n{}",
        failures.len(),
        cases.len(),
        failures.join("\n")
    );
    let _ = nix::mount::umount2(&ro, nix::mount::MntFlags::MNT_DETACH);
    crate::common::shutdown(&client, "cat-host").await;
    assert_clean(env, &ns);
}

/// Every RPC on an unknown container, an unknown exec and in the wrong state: the code the Go
/// shim returns, and the daemon lives on.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rpcs_on_unknown_ids_and_in_the_wrong_state() {
    let env = env();
    let ns = env.namespace("catalogue-rpc");
    let b = crio_bundle(&ns, "rpc1", "rpc1", &["sleep", "60"], |_| {});
    let o = crio_start(&ns, &b.dir, "rpc1", b"");
    assert!(o.status.success(), "{}", text(&o));
    let client = task_client(&String::from_utf8(o.stdout).unwrap()).await;
    let _out = open_fifo_reader(&b.stdout);
    let mut failures = Vec::new();
    let mut expect = |name: &str, got: Result<(), ttrpc::Error>, want: Option<Code>| match (got, want) {
        (Ok(()), None) => {}
        (Err(e), Some(w)) if code(&e) == w => {}
        (got, want) => failures.push(format!("{name}: got {got:?}, want {want:?}")),
    };
    for id in ["nobody", "rpc1"] {
        // For "rpc1" (not created yet) as for "nobody": NOT_FOUND everywhere.
        unknown_id_cases(&task(&client, id), &mut expect).await;
    }
    client.create(ctx(), &crio_create_req(&b)).await.unwrap();
    let dup = client.create(ctx(), &crio_create_req(&b)).await.map(drop);
    expect("duplicate create", dup, Some(Code::ALREADY_EXISTS));
    wrong_state_cases(&task(&client, "rpc1"), &mut expect).await;
    let r = task(&client, "rpc1").connect().await.map(drop);
    expect("connect after all of the above", r, None);
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    crio_kill_and_remove(&client, "rpc1").await;
    assert_clean(env, &ns);
}

type Expect<'a> = dyn FnMut(&str, Result<(), ttrpc::Error>, Option<Code>) + 'a;

async fn unknown_id_cases(t: &Task<'_>, expect: &mut Expect<'_>) {
    let nf = Some(Code::NOT_FOUND);
    let mut expect = |rpc: &str, got, want| expect(&format!("{rpc} {}", t.id()), got, want);
    expect("state", t.state().await.map(drop), nf);
    expect("start", t.start().await.map(drop), nf);
    expect("kill", t.kill(9).await.map(drop), nf);
    expect("wait", t.wait().await.map(drop), nf);
    expect("delete", t.delete().await.map(drop), nf);
    expect("pids", t.pids().await.map(drop), nf);
    expect("pause", t.pause().await.map(drop), nf);
    expect("resume", t.resume().await.map(drop), nf);
    expect("stats", t.stats().await.map(drop), nf);
    expect("close_io", t.close_stdin().await.map(drop), nf);
    expect("resize_pty", t.resize(1, 1).await.map(drop), nf);
    expect("exec", t.exec("e").add(Some(process_true())).await.map(drop), nf);
    let empty = json_any("x", serde_json::json!({}));
    expect("update", t.update(Some(empty)).await.map(drop), nf);
    expect("checkpoint", t.checkpoint("/tmp/x").await.map(drop), nf);
}

fn process_true() -> Any {
    process_any(serde_json::json!({"args": ["true"], "cwd": "/", "user": {"uid": 0, "gid": 0}, "env": ["PATH=/bin"]}))
}

async fn wrong_state_cases(t: &Task<'_>, expect: &mut Expect<'_>) {
    let fp = Some(Code::FAILED_PRECONDITION);
    let invalid = Some(Code::INVALID_ARGUMENT);
    expect("pause before start", t.pause().await.map(drop), fp);
    expect("resume before start", t.resume().await.map(drop), fp);
    let r = t.exec("bad/exec").add(Some(process_true())).await.map(drop);
    expect("exec id with a slash", r, invalid);
    expect(
        "exec without a spec",
        t.exec("nospec").add(None).await.map(drop),
        invalid,
    );
    let garbage = json_any("x", serde_json::json!({"args": 3}));
    let r = t.exec("garbage").add(Some(garbage)).await.map(drop);
    expect("exec with a malformed spec", r, invalid);
    let r = t.exec("never-added").start().await.map(drop);
    expect("start of an unknown exec", r, Some(Code::NOT_FOUND));
    let r = t.exec("never-added").state().await.map(drop);
    expect("state of an unknown exec", r, Some(Code::NOT_FOUND));
    t.start().await.unwrap();
    expect("start twice", t.start().await.map(drop), fp);
    expect("delete while running", t.delete().await.map(drop), fp);
    expect("resume while running", t.resume().await.map(drop), fp);
    t.exec("e1").add(Some(process_true())).await.unwrap();
    let r = t.exec("e1").add(Some(process_true())).await.map(drop);
    expect("duplicate exec id", r, Some(Code::ALREADY_EXISTS));
    expect("kill of an exec not started", t.exec("e1").kill(9).await.map(drop), fp);
    expect(
        "delete of an exec not started",
        t.exec("e1").delete().await.map(drop),
        None,
    );
    let r = t.resize(80, 24).await.map(drop);
    expect(
        "resize of a process without a terminal (ignored, as by the Go shim)",
        r,
        None,
    );
    let bad = json_any("x", serde_json::json!({"memory": {"limit": "lots"}}));
    expect(
        "update with garbage resources",
        t.update(Some(bad)).await.map(drop),
        invalid,
    );
    expect("update without resources", t.update(None).await.map(drop), invalid);
    expect("signal 65", t.kill(65).await.map(drop), invalid);
}

/// Runs the shim with `args` CRI-O style (no TTRPC_ADDRESS, cwd the bundle) with `config`
/// and `stdin`.
fn shim_with(args: &[&str], config: &Path, stdin: &[u8], dir: &Path) -> std::process::Output {
    use std::io::Write;
    let mut child = Command::new(SHIM)
        .args(args)
        .current_dir(dir)
        .env("TTRPC_ADDRESS", "")
        .env("GANTRY_CONFIG", config)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    child.stdin.take().unwrap().write_all(stdin).unwrap();
    child.wait_with_output().unwrap()
}

/// Sends Shutdown for `id` to the daemon at `address`, from a test that has no runtime.
fn shutdown_at(address: &str, id: &str) {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async {
        let client = task_client(address).await;
        crate::common::shutdown(&client, id).await;
    });
}

/// containerd 2.3 passes its socket directory in `BootstrapParams.socket_dir`: gantry's
/// daemon listens there unless the operator's config pins `shim.socket_dir`.
#[test]
fn start_listens_in_the_engines_socket_dir_unless_the_config_pins_one() {
    use containerd_shim_protos::bootstrap_api::BootstrapParams;
    use protobuf::Message;
    let env = env();
    let ns = env.namespace("catalogue-sockdir");
    let engine_dir = ns.dir.join("engine-s");
    let unpinned = ns.dir.join("unpinned.toml");
    std::fs::write(&unpinned, format!("[runtime]\nroot = {:?}\n", ns.runtime_root)).unwrap();
    for (id, config, want) in [("sd1", &unpinned, &engine_dir), ("sd2", &ns.config, &ns.socket_dir)] {
        let b = crio_bundle(&ns, id, id, &["true"], |_| {});
        let params = BootstrapParams {
            instance_id: id.into(),
            namespace: "default".into(),
            socket_dir: Some(engine_dir.display().to_string()),
            ..Default::default()
        };
        let args = ["-namespace", "default", "-address", "", "-id", id, "start"];
        let o = shim_with(&args, config, &params.write_to_bytes().unwrap(), &b.dir);
        assert!(o.status.success(), "{}", text(&o));
        let address = String::from_utf8_lossy(&o.stdout).into_owned();
        let socket = Path::new(address.trim_start_matches("unix://"));
        assert_eq!(socket.parent(), Some(want.as_path()), "{id}: {address}");
        shutdown_at(&address, id);
        assert!(crate::common::wait_until(std::time::Duration::from_secs(10), || {
            crate::common::daemons_in(&b.dir).is_empty() && !socket.exists()
        }));
    }
    assert_clean(env, &ns);
}

/// `start` as engines and direct callers may run it: refused without an id or a config.json,
/// never refused for what is on stdin.
#[test]
fn start_arguments_and_stdin() {
    let env = env();
    let ns = env.namespace("catalogue-start");
    let b = crio_bundle(&ns, "st1", "st1", &["true"], |_| {});
    let shim = |args: &[&str], stdin: &[u8], dir: &Path| shim_with(args, &ns.config, stdin, dir);
    let o = shim(&["-namespace", "default", "-address", "", "start"], b"", &b.dir);
    assert!(
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("invalid id"),
        "{}",
        text(&o)
    );
    let o = shim(&["-namespace", "default", "-id", "st1", "-bogus", "start"], b"", &b.dir);
    assert!(
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("bogus"),
        "{}",
        text(&o)
    );
    let o = shim(&["-namespace", "default", "-id", "st1", "launch"], b"", &b.dir);
    assert!(
        !o.status.success() && String::from_utf8_lossy(&o.stderr).contains("launch"),
        "{}",
        text(&o)
    );
    for garbage in [&b"\xff\xfe garbage"[..], &[0u8; 4096][..], &b"\x0a\x05hello"[..]] {
        let o = shim(
            &["-namespace", "default", "-address", "", "-id", "st1", "start"],
            garbage,
            &b.dir,
        );
        assert!(o.status.success(), "garbage stdin must not fail start: {}", text(&o));
        assert!(
            String::from_utf8_lossy(&o.stdout).starts_with("unix://"),
            "{}",
            text(&o)
        );
    }
    let address = std::fs::read_to_string(b.dir.join("address")).unwrap();
    shutdown_at(&address, "st1");
    assert!(crate::common::wait_until(std::time::Duration::from_secs(10), || {
        crate::common::daemons_in(&b.dir).is_empty()
    }));
    assert_clean(env, &ns);
}

/// An oversized config.json (10 MB of annotations) is not bad input: it runs, as under runc,
/// and leaves nothing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ten_megabytes_of_annotations_run() {
    let env = env();
    let ns = env.namespace("catalogue-big");
    let b = crio_bundle(&ns, "big1", "big1", &["true"], |s| {
        let map = s["annotations"].as_object_mut().unwrap();
        for i in 0..10_000 {
            map.insert(format!("example.com/a{i}"), "x".repeat(1000).into());
        }
    });
    assert!(std::fs::metadata(b.dir.join("config.json")).unwrap().len() > 10_000_000);
    let o = crio_start(&ns, &b.dir, "big1", b"");
    assert!(o.status.success(), "{}", text(&o));
    let client = task_client(&String::from_utf8(o.stdout).unwrap()).await;
    let _out = open_fifo_reader(&b.stdout);
    client.create(ctx(), &crio_create_req(&b)).await.unwrap();
    let big = task(&client, "big1");
    big.start().await.unwrap();
    let w = big.wait().await.unwrap();
    assert_eq!(w.exit_status, 0);
    crate::common::crio_remove(&client, "big1").await;
    assert_clean(env, &ns);
}
