//! The daemon's trust boundary, probed as an attacker and an unlucky operator would: who may
//! connect, what a console socket accepts, links planted in a bundle, namespace names, what a
//! failed `start` or a symlinked state directory leaves, Kill's codes, and stdio paths.
//! Other users are played by processes that drop to `nobody` (uid 65534) before they act.

use std::os::unix::ffi::OsStrExt;
use std::os::unix::fs::{symlink, MetadataExt, PermissionsExt};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use containerd_shim_protos::api::{ConnectRequest, CreateTaskRequest};
use containerd_shim_protos::shim_async::TaskClient;

use crate::common::task::{process_any, task};

use crate::common::{
    assert_clean, code, crio_bundle, crio_create_req, crio_kill_and_remove, crio_remove, crio_start, crio_start_cmd,
    ctx, daemons_in, env, message, open_fifo_reader, read_fifo, run, shutdown, task_client, text, wait_until, Ns, SHIM,
};

const NOBODY: u32 = 65534;

/// What a raw ttrpc Connect request sent by another process got.
#[derive(Debug, PartialEq, Eq)]
enum Probe {
    /// The daemon answered.
    Answered,
    /// The connection was accepted by the kernel and closed by the daemon unanswered.
    Closed,
    /// connect(2) itself failed with this errno (file permissions).
    Refused(i32),
    Other(i32),
}

/// One ttrpc request frame: Task.Connect.
fn connect_frame() -> Vec<u8> {
    use protobuf::Message;
    let req = ConnectRequest {
        id: "probe".into(),
        ..Default::default()
    };
    let r = ttrpc::Request {
        service: "containerd.task.v2.Task".into(),
        method: "Connect".into(),
        payload: req.write_to_bytes().unwrap(),
        timeout_nano: 30_000_000_000,
        ..Default::default()
    };
    let payload = r.write_to_bytes().unwrap();
    let mut frame = Vec::new();
    frame.extend((payload.len() as u32).to_be_bytes());
    frame.extend(1u32.to_be_bytes());
    frame.extend([1u8, 0u8]);
    frame.extend(payload);
    frame
}

fn sockaddr(path: &Path) -> libc::sockaddr_un {
    // SAFETY: sockaddr_un is plain data; all zeroes is a valid value.
    let mut a: libc::sockaddr_un = unsafe { std::mem::zeroed() };
    a.sun_family = libc::AF_UNIX as libc::sa_family_t;
    for (i, b) in path.as_os_str().as_bytes().iter().enumerate() {
        a.sun_path[i] = *b as libc::c_char;
    }
    a
}

/// Runs `act` in a child that has dropped to `uid`/`gid` (and no supplementary groups), and
/// returns the errno it reported. The child never execs: `act` runs between fork and exec, so
/// it may only make async-signal-safe calls on memory prepared before the fork, and reports
/// through the error `spawn` returns.
fn as_user(uid: u32, act: impl FnMut() -> std::io::Result<()> + Send + Sync + 'static) -> i32 {
    let mut cmd = Command::new("/bin/true");
    cmd.uid(uid).gid(uid).stdin(Stdio::null());
    // SAFETY: see above; every closure passed here only makes raw libc calls.
    unsafe {
        cmd.pre_exec(act);
    }
    match cmd.spawn() {
        Ok(mut c) => {
            let _ = c.wait();
            0
        }
        Err(e) => e.raw_os_error().unwrap_or(-1),
    }
}

fn errno() -> std::io::Error {
    std::io::Error::last_os_error()
}

fn report(code: i32) -> std::io::Result<()> {
    Err(std::io::Error::from_raw_os_error(code))
}

/// Sends a ttrpc Connect to `sock` as `uid` and says what came back.
fn probe_as(uid: u32, sock: &Path) -> Probe {
    let frame = connect_frame();
    let addr = sockaddr(sock);
    let got = as_user(uid, move || {
        // SAFETY: raw syscalls on buffers owned by this closure.
        unsafe {
            let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
            if fd < 0 {
                return Err(errno());
            }
            let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
            if libc::connect(fd, &addr as *const _ as *const libc::sockaddr, len) < 0 {
                return Err(errno());
            }
            // MSG_NOSIGNAL: a refused connection may already be closed; SIGPIPE would kill
            // this child before it reports.
            if libc::send(fd, frame.as_ptr().cast(), frame.len(), libc::MSG_NOSIGNAL) < 0 {
                return Err(errno());
            }
            let mut pfd = libc::pollfd {
                fd,
                events: libc::POLLIN,
                revents: 0,
            };
            if libc::poll(&mut pfd, 1, 30_000) == 0 {
                return report(libc::ETIMEDOUT);
            }
            let mut buf = [0u8; 64];
            match libc::read(fd, buf.as_mut_ptr().cast(), buf.len()) {
                n if n > 0 => report(libc::EEXIST),
                0 => report(libc::ECONNABORTED),
                _ => Err(errno()),
            }
        }
    });
    match got {
        libc::EEXIST => Probe::Answered,
        libc::ECONNABORTED | libc::ECONNRESET | libc::EPIPE => Probe::Closed,
        libc::EACCES | libc::EPERM | libc::ENOENT => Probe::Refused(got),
        other => Probe::Other(other),
    }
}

fn mode(p: &Path) -> u32 {
    std::fs::symlink_metadata(p).unwrap().mode() & 0o7777
}

async fn start_crio(ns: &Ns, bundle: &Path, id: &str) -> (String, TaskClient) {
    let o = crio_start(ns, bundle, id, b"");
    assert!(o.status.success(), "{}", text(&o));
    let address = String::from_utf8(o.stdout).unwrap();
    let client = task_client(&address).await;
    (address, client)
}

async fn start_and_wait(client: &TaskClient, id: &str) -> u32 {
    let t = task(client, id);
    t.start().await.unwrap();
    t.wait().await.unwrap().exit_status
}

/// Item 1: Sockets live in a 0700 directory with mode 0600, and even with both widened another
/// user's connection is closed unanswered while root is served.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_users_cannot_drive_the_daemon_even_through_a_widened_socket() {
    let env = env();
    let ns = env.namespace("peer");
    let b = crio_bundle(&ns, "peer1", "peer1", &["sleep", "60"], |_| {});
    let (address, client) = start_crio(&ns, &b.dir, "peer1").await;
    let sock = PathBuf::from(address.trim_start_matches("unix://"));
    assert_eq!(mode(&ns.socket_dir), 0o700, "socket directory");
    assert_eq!(mode(&sock), 0o600, "socket");
    assert_eq!(std::fs::metadata(&sock).unwrap().uid(), 0);
    // A packaging or umask mistake widens both.
    std::fs::set_permissions(&ns.socket_dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&sock, std::fs::Permissions::from_mode(0o666)).unwrap();
    assert_eq!(probe_as(0, &sock), Probe::Answered, "root is served");
    assert_eq!(probe_as(NOBODY, &sock), Probe::Closed, "another user must be refused");
    // The refusal cost the daemon nothing.
    task(&client, "peer1").connect().await.unwrap();
    shutdown(&client, "peer1").await;
    assert_clean(env, &ns);
}

/// Item 2: Under a permissive umask, another user racing to the console socket never gets in: the
/// socket is 0600 in a 0700 directory, and the container gets its real pty.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn console_sockets_take_the_pty_only_from_the_runtime() {
    let env = env();
    let ns = env.namespace("console");
    let b = crio_bundle(&ns, "con1", "con1", &["sh", "-c", "test -t 1 && echo tty-yes"], |s| {
        s["process"]["terminal"] = true.into();
    });
    let mut cmd = crio_start_cmd(&ns, &b.dir, "con1");
    // SAFETY: umask is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0);
            Ok(())
        });
    }
    let o = run(cmd.stdin(Stdio::null()));
    assert!(o.status.success(), "{}", text(&o));
    let address = String::from_utf8(o.stdout).unwrap();
    let client = task_client(&address).await;
    let daemon: i32 = std::fs::read_to_string(b.dir.join("shim.pid"))
        .unwrap()
        .parse()
        .unwrap();
    // The directory widened after start, as a careless operator might.
    std::fs::set_permissions(&ns.socket_dir, std::fs::Permissions::from_mode(0o777)).unwrap();
    let console = ns.socket_dir.join(format!("pty-{daemon}-0"));
    let addr = sockaddr(&console);
    // The attacker says when it is trying: the Create below must race a running attacker.
    let (ready_r, ready_w) = nix::unistd::pipe().unwrap();
    let ready_fd = std::os::fd::AsRawFd::as_raw_fd(&ready_w);
    let attacker = std::thread::spawn(move || {
        let _open_until_done = ready_w;
        as_user(NOBODY, move || {
            // SAFETY: raw syscalls on buffers owned by this closure.
            unsafe {
                libc::write(ready_fd, b"r".as_ptr().cast(), 1);
                let mut tries = 0;
                while tries < 4000 {
                    tries += 1;
                    let fd = libc::socket(libc::AF_UNIX, libc::SOCK_STREAM, 0);
                    let len = std::mem::size_of::<libc::sockaddr_un>() as libc::socklen_t;
                    if libc::connect(fd, &addr as *const _ as *const libc::sockaddr, len) == 0 {
                        // Hand in our own stdin as the "pty master".
                        let mut byte = [b'x'];
                        let mut iov = libc::iovec {
                            iov_base: byte.as_mut_ptr().cast(),
                            iov_len: 1,
                        };
                        let mut space = [0u64; 8];
                        let mut msg: libc::msghdr = std::mem::zeroed();
                        msg.msg_iov = &mut iov;
                        msg.msg_iovlen = 1;
                        msg.msg_control = space.as_mut_ptr().cast();
                        msg.msg_controllen = libc::CMSG_SPACE(4) as _;
                        let c = libc::CMSG_FIRSTHDR(&msg);
                        (*c).cmsg_level = libc::SOL_SOCKET;
                        (*c).cmsg_type = libc::SCM_RIGHTS;
                        (*c).cmsg_len = libc::CMSG_LEN(4) as _;
                        *(libc::CMSG_DATA(c) as *mut i32) = 0;
                        libc::sendmsg(fd, &msg, libc::MSG_NOSIGNAL);
                        return report(libc::EEXIST);
                    }
                    libc::close(fd);
                    libc::usleep(1000);
                }
                report(libc::ETIMEDOUT)
            }
        })
    });
    // One byte once the attacker runs (EOF if it never started: the assertions below say so).
    let _ = std::io::Read::read(&mut std::fs::File::from(ready_r), &mut [0u8; 1]);
    let mut out = open_fifo_reader(&b.stdout);
    let mut req = crio_create_req(&b);
    req.terminal = true;
    client.create(ctx(), &req).await.unwrap();
    assert_eq!(start_and_wait(&client, "con1").await, 0);
    let got = read_fifo(&mut out, Duration::from_secs(5));
    assert!(got.contains("tty-yes"), "the container lost its pty: {got:?}");
    assert_eq!(
        attacker.join().unwrap(),
        libc::ETIMEDOUT,
        "another user reached the console socket"
    );
    crio_remove(&client, "con1").await;
    assert_clean(env, &ns);
}

/// Item 3: Links planted in a bundle are replaced, never written through: `address`, `shim.pid`,
/// `oom`, `log.json`, `init.pid` and a `config.json` that device injection rewrites; and the
/// `delete` action removes no file a planted `address` names.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn links_planted_in_the_bundle_are_never_written_through() {
    let env = env();
    let host = crate::gpu::gpu_host("links");
    let ns = &host.ns;
    let hog = ["sh", "-c", "x=aaaaaaaaaaaaaaaa; while true; do x=$x$x; done"];
    let b = crio_bundle(ns, "link1", "link1", &hog, |s| {
        s["linux"]["resources"]["memory"] = serde_json::json!({"limit": 16 * 1024 * 1024});
        s["annotations"]["gantry.dev/devices"] = "nvidia.com/gpu=0".into();
    });
    let victims = ns.dir.join("victims");
    std::fs::create_dir_all(&victims).unwrap();
    for name in ["address", "shim.pid", "oom", "log.json", "init.pid"] {
        std::fs::write(victims.join(name), "precious").unwrap();
        symlink(victims.join(name), b.dir.join(name)).unwrap();
    }
    let spec = std::fs::read(b.dir.join("config.json")).unwrap();
    std::fs::rename(b.dir.join("config.json"), victims.join("config.json")).unwrap();
    symlink(victims.join("config.json"), b.dir.join("config.json")).unwrap();

    let (_, client) = start_crio(ns, &b.dir, "link1").await;
    let _out = open_fifo_reader(&b.stdout);
    client.create(ctx(), &crio_create_req(&b)).await.unwrap();
    assert_eq!(start_and_wait(&client, "link1").await, 137);
    for name in ["address", "shim.pid", "oom", "log.json", "init.pid"] {
        assert_eq!(
            std::fs::read_to_string(victims.join(name)).unwrap(),
            "precious",
            "{name} was written through"
        );
    }
    assert_eq!(
        std::fs::read(victims.join("config.json")).unwrap(),
        spec,
        "config.json was written through"
    );
    for name in ["address", "shim.pid", "oom", "config.json"] {
        let m = std::fs::symlink_metadata(b.dir.join(name)).unwrap();
        assert!(m.is_file(), "{name} is not a regular file in the bundle");
    }
    let edited = std::fs::read_to_string(b.dir.join("config.json")).unwrap();
    assert!(edited.contains("gantry.dev/injected-devices"), "{edited}");
    crio_remove(&client, "link1").await;

    // `delete` after a daemon died: a planted address naming any file removes nothing.
    let target = victims.join("address");
    std::fs::write(b.dir.join("address"), format!("unix://{}", target.display())).unwrap();
    let o = run(Command::new(SHIM)
        .args(["-namespace", "default", "-id", "link1", "-bundle"])
        .arg(&b.dir)
        .arg("delete")
        .env("GANTRY_CONFIG", &ns.config));
    assert!(o.status.success(), "{}", text(&o));
    assert_eq!(
        std::fs::read_to_string(&target).unwrap(),
        "precious",
        "delete removed {target:?}"
    );
    let _ = std::fs::remove_file(b.dir.join("oom"));
    assert_clean(env, ns);
}

/// Item 4: Namespaces and ids become paths: `start` and `delete` refuse what containerd refuses.
#[test]
fn namespaces_and_ids_are_validated() {
    let env = env();
    let ns = env.namespace("names");
    let b = crio_bundle(&ns, "names1", "names1", &["true"], |_| {});
    for (namespace, id, says) in [
        ("../../esc", "names1", "namespace validation"),
        ("a/b", "names1", "namespace validation"),
        ("default", "../x", "invalid id"),
    ] {
        for action in ["start", "delete"] {
            let o = run(Command::new(SHIM)
                .args(["-namespace", namespace, "-address", "", "-id", id, "-bundle"])
                .arg(&b.dir)
                .arg(action)
                .current_dir(&b.dir)
                .env("GANTRY_CONFIG", &ns.config)
                .stdin(Stdio::null()));
            assert!(!o.status.success(), "{action} {namespace} {id}: {}", text(&o));
            assert!(String::from_utf8_lossy(&o.stderr).contains(says), "{}", text(&o));
        }
    }
    assert!(daemons_in(&b.dir).is_empty());
    assert!(!ns.runtime_root.parent().unwrap().join("esc").exists());
    assert_clean(env, &ns);
}

/// Item 5: A `start` that cannot finish leaves no daemon: refused before the fork for a missing
/// or malformed config.json, killed and unlinked when `address` cannot be written.
#[test]
fn a_failed_start_leaves_no_daemon() {
    let env = env();
    let ns = env.namespace("failstart");
    let none = ns.dir.join("bundles/none");
    std::fs::create_dir_all(&none).unwrap();
    let bad = crio_bundle(&ns, "bad1", "bad1", &["true"], |_| {});
    std::fs::write(bad.dir.join("config.json"), "{ not json").unwrap();
    for (dir, says) in [(&none, "config.json"), (&bad.dir, "malformed")] {
        let o = crio_start(&ns, dir, "x1", b"");
        assert!(!o.status.success(), "{}", text(&o));
        assert!(String::from_utf8_lossy(&o.stderr).contains(says), "{}", text(&o));
        assert!(daemons_in(dir).is_empty(), "a daemon was left for {dir:?}");
    }
    std::fs::remove_dir_all(&none).unwrap();
    std::fs::remove_dir_all(&bad.dir).unwrap();

    // A bundle on a full filesystem.
    let full = ns.dir.join("full");
    std::fs::create_dir_all(&full).unwrap();
    let o = run(Command::new("mount")
        .args(["-t", "tmpfs", "-o", "size=256k", "tmpfs"])
        .arg(&full));
    assert!(o.status.success(), "{}", text(&o));
    let spec = crio_bundle(&ns, "full1", "full1", &["true"], |_| {});
    let bundle = full.join("full1");
    std::fs::create_dir_all(&bundle).unwrap();
    std::fs::copy(spec.dir.join("config.json"), bundle.join("config.json")).unwrap();
    std::fs::remove_dir_all(&spec.dir).unwrap();
    let o = run(Command::new("dd")
        .args(["if=/dev/zero", "bs=4k"])
        .arg(format!("of={}", full.join("filler").display())));
    assert!(!o.status.success(), "the tmpfs should have filled up");
    let o = crio_start(&ns, &bundle, "full1", b"");
    let left = daemons_in(&bundle);
    let address = std::fs::read(bundle.join("address")).ok();
    let _ = nix::mount::umount2(&full, nix::mount::MntFlags::MNT_DETACH);
    assert!(!o.status.success(), "{}", text(&o));
    assert!(
        String::from_utf8_lossy(&o.stderr).contains("No space left"),
        "{}",
        text(&o)
    );
    assert!(left.is_empty(), "daemons left: {left:?}");
    assert_eq!(address, None, "an address file was left");
    assert_clean(env, &ns);
}

/// Item 6: Rootfs mounts of a bundle under a symlinked state directory are undone after a failed
/// Create and after Delete (mountinfo names the resolved path).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rootfs_mounts_under_a_symlinked_state_dir_are_undone() {
    let env = env();
    let ns = env.namespace("symstate");
    let real = ns.dir.join("state-real");
    std::fs::create_dir_all(&real).unwrap();
    let link = ns.dir.join("state-link");
    symlink(&real, &link).unwrap();
    let mounted_under_real = || {
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let real = real.to_str().unwrap().to_string();
        mounts
            .lines()
            .filter_map(|l| l.split(' ').nth(4))
            .any(|m| m.starts_with(&real))
    };
    for (id, fail) in [("sym1", true), ("sym2", false)] {
        let b = crio_bundle(&ns, id, id, &["sleep", "60"], |s| {
            s["root"]["path"] = "rootfs".into();
            if fail {
                let bad = serde_json::json!({"type": "network", "path": "/proc/self/ns/no-such-netns"});
                s["linux"]["namespaces"].as_array_mut().unwrap().push(bad);
            }
        });
        let dir = link.join(id);
        std::fs::rename(&b.dir, real.join(id)).unwrap();
        let (_, client) = start_crio(&ns, &dir, id).await;
        let _out = open_fifo_reader(&dir.join("stdout"));
        let req = CreateTaskRequest {
            id: id.into(),
            bundle: dir.to_str().unwrap().into(),
            stdout: dir.join("stdout").to_str().unwrap().into(),
            rootfs: vec![containerd_shim_protos::types::mount::Mount {
                type_: "bind".into(),
                source: env.rootfs.to_str().unwrap().into(),
                options: vec!["rbind".into(), "ro".into()],
                ..Default::default()
            }],
            ..Default::default()
        };
        let created = client.create(ctx(), &req).await;
        if fail {
            let e = created.unwrap_err();
            assert!(message(&e).contains("no-such-netns"), "{e:?}");
            assert!(!mounted_under_real(), "a failed Create left its rootfs mounted");
            let _ = task(&client, id).delete().await;
            shutdown(&client, id).await;
        } else {
            created.unwrap();
            assert!(mounted_under_real(), "the rootfs was not mounted");
            crio_kill_and_remove(&client, id).await;
            assert!(!mounted_under_real(), "Delete left the rootfs mounted");
        }
        assert!(wait_until(Duration::from_secs(10), || daemons_in(&dir).is_empty()));
        std::fs::remove_dir_all(real.join(id)).unwrap();
    }
    assert_clean(env, &ns);
}

/// Item 7: Kill: INVALID_ARGUMENT for a signal that does not exist, NOT_FOUND "process already
/// finished" for a liveness probe of an exited process, success for SIGKILL/SIGTERM to it.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kill_codes_and_messages() {
    let env = env();
    let ns = env.namespace("killcodes");
    let b = crio_bundle(&ns, "kc1", "kc1", &["sleep", "60"], |_| {});
    let (_, client) = start_crio(&ns, &b.dir, "kc1").await;
    let _out = open_fifo_reader(&b.stdout);
    client.create(ctx(), &crio_create_req(&b)).await.unwrap();
    let kc1 = task(&client, "kc1");
    kc1.start().await.unwrap();
    let spec = serde_json::json!({"args": ["sleep", "60"], "cwd": "/", "user": {"uid": 0, "gid": 0},
        "env": ["PATH=/bin"]});
    kc1.exec("e1").add(Some(process_any(spec))).await.unwrap();
    kc1.exec("e1").start().await.unwrap();
    for exec_id in ["", "e1"] {
        let e = kc1.exec(exec_id).kill(999).await.unwrap_err();
        assert_eq!(code(&e), ttrpc::Code::INVALID_ARGUMENT, "{exec_id:?}: {e:?}");
        assert!(message(&e).contains("invalid signal 999"), "{e:?}");
    }
    kc1.kill(9).await.unwrap();
    kc1.wait().await.unwrap();
    for exec_id in ["", "e1"] {
        let e = kc1.exec(exec_id).kill(0).await.unwrap_err();
        assert_eq!(code(&e), ttrpc::Code::NOT_FOUND, "{exec_id:?}: {e:?}");
        assert_eq!(message(&e), "process already finished");
        kc1.exec(exec_id).kill(9).await.unwrap();
        kc1.exec(exec_id).kill(15).await.unwrap();
    }
    let e = kc1.exec("nope").kill(9).await.unwrap_err();
    assert_eq!(code(&e), ttrpc::Code::NOT_FOUND);
    crio_remove(&client, "kc1").await;
    assert_clean(env, &ns);
}

/// Item 8: Stdio paths gantry will not create, runtime errors said once, and memory given back
/// after a burst of connections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn stdio_paths_runtime_errors_and_connection_bursts() {
    let env = env();
    let ns = env.namespace("smaller");
    let b = crio_bundle(&ns, "sm1", "sm1", &["true"], |s| {
        let bad = serde_json::json!({"type": "network", "path": "/proc/self/ns/no-such-netns"});
        s["linux"]["namespaces"].as_array_mut().unwrap().push(bad);
    });
    let (address, client) = start_crio(&ns, &b.dir, "sm1").await;
    let missing = ns.dir.join("no-such-dir");
    for (stdout, says) in [
        (missing.join("out").to_str().unwrap().to_string(), "no-such-dir"),
        ("file://relative/log".to_string(), "must be absolute"),
    ] {
        let mut req = crio_create_req(&b);
        req.stdout = stdout;
        let e = client.create(ctx(), &req).await.unwrap_err();
        assert_eq!(code(&e), ttrpc::Code::INVALID_ARGUMENT, "{e:?}");
        assert!(message(&e).contains(says), "{e:?}");
    }
    assert!(!missing.exists(), "gantry created the stdout path's directory");

    let _out = open_fifo_reader(&b.stdout);
    let e = client.create(ctx(), &crio_create_req(&b)).await.unwrap_err();
    assert_eq!(code(&e), ttrpc::Code::UNKNOWN, "{e:?}");
    assert_eq!(message(&e).matches("no-such-netns").count(), 1, "said twice: {e:?}");

    let daemon = daemons_in(&b.dir)[0];
    let rss = || {
        let status = std::fs::read_to_string(format!("/proc/{daemon}/status")).unwrap();
        let line = status.lines().find(|l| l.starts_with("VmRSS:")).unwrap().to_string();
        line.split_whitespace().nth(1).unwrap().parse::<u64>().unwrap()
    };
    let before = rss();
    let frame = connect_frame();
    let sock = PathBuf::from(address.trim_start_matches("unix://"));
    for _ in 0..3 {
        use tokio::io::{AsyncReadExt, AsyncWriteExt};
        let mut conns = Vec::new();
        for _ in 0..800 {
            let mut c = tokio::net::UnixStream::connect(&sock).await.unwrap();
            c.write_all(&frame).await.unwrap();
            conns.push(c);
        }
        // Every one is answered, so the daemon built its whole per-connection state.
        for c in &mut conns {
            let mut buf = [0u8; 16];
            assert!(c.read(&mut buf).await.unwrap() > 0);
        }
        drop(conns);
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    let after = rss();
    assert!(
        after < before + 2048,
        "RSS grew from {before} KiB to {after} KiB after connection bursts"
    );
    shutdown(&client, "sm1").await;
    assert_clean(env, &ns);
}

/// Security checks: under umask 000, nothing gantry creates (bundle files, sockets, the socket
/// directory) is group- or world-writable; the daemon's environment does not reach the
/// container; the socket directory is not visible inside the container's mount namespace.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn created_files_are_private_and_the_daemon_environment_stays_out() {
    let env = env();
    let ns = env.namespace("private");
    let probe = format!("ls {} 2>&1; env", ns.socket_dir.display());
    let b = crio_bundle(&ns, "priv1", "priv1", &["sh", "-c", &probe], |_| {});
    let mut cmd = crio_start_cmd(&ns, &b.dir, "priv1");
    cmd.env("GANTRY_TEST_SECRET", "leaked-from-the-daemon");
    // SAFETY: umask is async-signal-safe.
    unsafe {
        cmd.pre_exec(|| {
            libc::umask(0);
            Ok(())
        });
    }
    let o = run(cmd.stdin(Stdio::null()));
    assert!(o.status.success(), "{}", text(&o));
    let client = task_client(&String::from_utf8(o.stdout).unwrap()).await;
    let mut out = open_fifo_reader(&b.stdout);
    client.create(ctx(), &crio_create_req(&b)).await.unwrap();
    let mut loose = Vec::new();
    let mut check = |p: &Path| {
        if let Ok(m) = std::fs::symlink_metadata(p) {
            if m.mode() & 0o022 != 0 && !m.file_type().is_symlink() {
                loose.push(format!("{} {:o}", p.display(), m.mode() & 0o7777));
            }
        }
    };
    check(&ns.socket_dir);
    for e in std::fs::read_dir(&ns.socket_dir).unwrap().flatten() {
        check(&e.path());
    }
    for name in ["address", "shim.pid", "gantry-runtime.json", "log.json", "init.pid"] {
        check(&b.dir.join(name));
    }
    assert_eq!(start_and_wait(&client, "priv1").await, 0);
    let seen = read_fifo(&mut out, Duration::from_secs(5));
    assert!(loose.is_empty(), "group- or world-writable: {loose:?}");
    assert!(
        seen.contains("No such file"),
        "the socket directory is visible inside: {seen}"
    );
    assert!(seen.contains("PATH="), "no env printed: {seen}");
    assert!(
        !seen.contains("leaked-from-the-daemon"),
        "the daemon's environment reached the container: {seen}"
    );
    crio_remove(&client, "priv1").await;
    assert_clean(env, &ns);
}
