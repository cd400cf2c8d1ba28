//! The short-lived invocations engines make: `start` (find or spawn the pod's daemon and print
//! its address), `delete` (clean up after a daemon that died), and the probes (`-v`, `-info`,
//! `features`, `check-config`), none of which starts a daemon.

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::fd::{AsRawFd, IntoRawFd, OwnedFd, RawFd};
use std::os::unix::fs::PermissionsExt;
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use containerd_shim_protos::api::DeleteResponse;
use containerd_shim_protos::protobuf::Message;
use sha2::{Digest, Sha256};
use thiserror::Error;

use crate::args::Flags;
use crate::config::{Config, ConfigError};
use crate::container::{INIT_PID_FILE, RUNTIME_FILE, RUNTIME_LOG};
use crate::options::{self, EngineOptions};
use crate::reaper::Reaper;
use crate::runtime::choose::{OciRuntimes, RuntimeRecord, Runtimes};
use crate::runtime::OciRuntime;
use crate::{daemon_cgroup, files, spec};

/// The fd numbers the daemon inherits: its bound listener and the ready pipe.
pub const LISTENER_FD: i32 = 3;
pub const READY_FD: i32 = 4;
/// Unix socket paths are limited to 108 bytes including the NUL.
const MAX_SOCKET_PATH: usize = 107;

#[derive(Debug, Error)]
pub enum BootstrapError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("socket path {0:?} is longer than 107 bytes; choose a shorter shim.socket_dir")]
    SocketTooLong(PathBuf),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("daemon did not become ready: {0}")]
    NotReady(String),
    #[error("{0}")]
    Runtime(#[from] crate::runtime::RuntimeError),
    #[error(transparent)]
    Spec(#[from] crate::spec::SpecError),
    #[error(
        "runtime options on stdin are not a protobuf Any ({0}); containerd sends the handler's options marshalled"
    )]
    Options(String),
    #[error("{0}")]
    Record(String),
}

fn io_err<'a>(what: &'static str, path: &'a Path) -> impl FnOnce(std::io::Error) -> BootstrapError + 'a {
    move |source| BootstrapError::Io {
        what,
        path: path.to_path_buf(),
        source,
    }
}

/// Reads whatever the engine put on stdin without ever blocking on an idle one.
pub fn read_stdin() -> Vec<u8> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    // Not `std::io::stdin()`: its first use allocates std's 8 KiB buffer for the process's
    // life, and the daemon `start` forks inherits it.
    // SAFETY: fd 0 stays open (or stays closed: poll then reports POLLNVAL and read fails)
    // while this borrow lives; nothing here closes it.
    let fd = unsafe { std::os::fd::BorrowedFd::borrow_raw(libc::STDIN_FILENO) };
    let mut data = Vec::new();
    let deadline = Instant::now() + Duration::from_millis(500);
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
        let timeout = PollTimeout::try_from(left.as_millis().min(500) as i32).unwrap_or(PollTimeout::ZERO);
        match poll(&mut fds, timeout) {
            Ok(n) if n > 0 => {}
            _ => return data,
        }
        let mut buf = [0u8; 8192];
        match nix::unistd::read(fd.as_raw_fd(), &mut buf) {
            Ok(0) | Err(_) => return data,
            Ok(n) => data.extend_from_slice(&buf[..n]),
        }
        if data.len() > 1 << 20 {
            return data;
        }
    }
}

/// Socket of the daemon serving `group` in `namespace`: a hash keeps it short and fixed-size.
pub fn socket_path(socket_dir: &Path, namespace: &str, group: &str) -> Result<PathBuf, BootstrapError> {
    let digest = Sha256::digest(format!("{namespace}/{group}").as_bytes());
    let name: String = digest.iter().take(16).map(|b| format!("{b:02x}")).collect();
    let path = socket_dir.join(name);
    if path.as_os_str().len() > MAX_SOCKET_PATH {
        return Err(BootstrapError::SocketTooLong(path));
    }
    Ok(path)
}

/// The bundle this invocation is about: `-bundle`, else the working directory.
pub fn bundle_dir(flags: &Flags) -> PathBuf {
    if !flags.bundle.is_empty() {
        return PathBuf::from(&flags.bundle);
    }
    std::env::current_dir().unwrap_or_else(|_| PathBuf::from("."))
}

/// What `start` leaves this process to do.
#[derive(Debug)]
pub enum Started {
    /// The engine's answer (`unix://...`): print it and exit.
    Address(String),
    /// This process is the pod's freshly forked daemon: serve with these flags and the config
    /// `start` already resolved.
    Daemon(Flags, Box<Config>),
}

/// `start`: finds or spawns the daemon for this container's group and returns its `unix://`
/// address, or, in the forked daemon itself, the flags to serve with.
///
/// Everything that can be refused is refused before a daemon is forked (ids, a missing or
/// malformed `config.json`, the config); a failure after the fork (writing `address` on a full
/// disk) kills, reaps and unlinks the daemon this call spawned, so nothing is left serving.
pub fn start(flags: &Flags, stdin: &[u8]) -> Result<Started, BootstrapError> {
    spec::validate_namespace(&flags.namespace)?;
    spec::validate_id(&flags.id)?;
    let bundle = bundle_dir(flags);
    let annotations = spec::load_annotations(&bundle)?;
    let engine = options::from_stdin(stdin, &flags.id, &flags.namespace);
    let (config, _) = Config::resolve(engine.config_path.as_deref())?;
    let group = spec::group_id(&annotations).unwrap_or_else(|| flags.id.clone());
    let socket_dir = &config.shim.socket_dir_for(engine.socket_dir.as_deref().map(Path::new));
    files::private_dir(socket_dir).map_err(io_err("create", socket_dir))?;
    let sock = socket_path(socket_dir, &flags.namespace, &group)?;
    let address = format!("unix://{}", sock.display());

    // Serialise the starts of one group so two containers of a pod never spawn two daemons;
    // other pods' starts go on meanwhile.
    let lock = GroupLock::acquire(&sock)?;

    let (pid, spawned) = match UnixStream::connect(&sock) {
        Ok(conn) => (peer_pid(&conn).unwrap_or(0), false),
        // Only a socket nobody serves may be replaced; any other error (a full backlog, a
        // permission problem) must not orphan the pod's live daemon.
        Err(e) if e.kind() == std::io::ErrorKind::NotFound || e.raw_os_error() == Some(libc::ECONNREFUSED) => {
            match spawn_daemon(flags, &bundle, &sock, &engine)? {
                Spawned::Parent(pid) => (pid, true),
                Spawned::Child(daemon) => {
                    // The lock's descriptor is already closed here; unlocking (and removing the
                    // lock file) belongs to the parent.
                    std::mem::forget(lock);
                    return Ok(Started::Daemon(daemon, Box::new(config)));
                }
            }
        }
        Err(e) => return Err(io_err("connect", &sock)(e)),
    };
    let written = files::write_atomic(&bundle.join("address"), address.as_bytes())
        .and_then(|()| files::write_atomic(&bundle.join("shim.pid"), pid.to_string().as_bytes()));
    if let Err(e) = written {
        if spawned {
            abandon_daemon(pid, &sock);
        }
        return Err(io_err("write address into", &bundle)(e));
    }
    drop(lock);
    Ok(Started::Address(address))
}

/// An exclusive `flock` on `<socket>.lock`, held across one group's connect-or-spawn. The file
/// exists only while a start holds it: the holder removes it before unlocking, and a start that
/// locked a file already removed (it opened it just before) tries again on the current one.
struct GroupLock {
    path: PathBuf,
    _file: nix::fcntl::Flock<File>,
}

impl GroupLock {
    fn acquire(sock: &Path) -> Result<GroupLock, BootstrapError> {
        use std::os::unix::fs::{MetadataExt, OpenOptionsExt};
        let path = sock.with_extension("lock");
        loop {
            let file = OpenOptions::new()
                .read(true)
                .write(true)
                .create(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path)
                .map_err(io_err("open", &path))?;
            let file = nix::fcntl::Flock::lock(file, nix::fcntl::FlockArg::LockExclusive)
                .map_err(|(_, e)| io_err("lock", &path)(e.into()))?;
            let held = file.metadata().map_err(io_err("stat", &path))?;
            let current = std::fs::symlink_metadata(&path).ok();
            if current.is_some_and(|c| c.ino() == held.ino() && c.dev() == held.dev()) {
                return Ok(GroupLock { path, _file: file });
            }
        }
    }
}

impl Drop for GroupLock {
    /// Removes the file while still holding it; the lock is released after (field drop).
    fn drop(&mut self) {
        let _ = std::fs::remove_file(&self.path);
    }
}

/// Kills and reaps a daemon this `start` forked but could not hand out, and removes its socket.
fn abandon_daemon(pid: i32, sock: &Path) {
    let pid = nix::unistd::Pid::from_raw(pid);
    let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
    let _ = nix::sys::wait::waitpid(pid, None);
    let _ = std::fs::remove_file(sock);
}

fn bind_unlistened(path: &Path) -> std::io::Result<OwnedFd> {
    use nix::sys::socket::{bind, socket, AddressFamily, SockFlag, SockType, UnixAddr};
    let fd = socket(AddressFamily::Unix, SockType::Stream, SockFlag::SOCK_CLOEXEC, None)?;
    bind(fd.as_raw_fd(), &UnixAddr::new(path)?)?;
    Ok(fd)
}

fn peer_pid(conn: &UnixStream) -> Option<i32> {
    nix::sys::socket::getsockopt(conn, nix::sys::socket::sockopt::PeerCredentials)
        .ok()
        .map(|c| c.pid())
}

enum Spawned {
    /// In `start`: the daemon serves; its pid.
    Parent(i32),
    /// In the daemon: the flags to serve with.
    Child(Flags),
}

/// Binds the socket, forks the daemon on it and waits until it serves.
///
/// A fork without exec: `start` is single-threaded (no runtime, no helper thread), so the
/// child can simply go on as the daemon. Each exec costs a static glibc's start-up, whose
/// CPUID-based cache probing is slow under virtualisation, plus page-table and page-fault work;
/// a container start saves one of them.
fn spawn_daemon(flags: &Flags, bundle: &Path, sock: &Path, engine: &EngineOptions) -> Result<Spawned, BootstrapError> {
    let _ = std::fs::remove_file(sock);
    // Bound here, listened on by the daemon: SO_PEERCRED then names the daemon, which is how
    // a later `start` of the same pod learns its pid.
    let listener = bind_unlistened(sock).map_err(io_err("bind", sock))?;
    let cleanup = |e| {
        let _ = std::fs::remove_file(sock);
        e
    };
    std::fs::set_permissions(sock, std::fs::Permissions::from_mode(0o600))
        .map_err(io_err("chmod", sock))
        .map_err(cleanup)?;
    let (ready_r, ready_w) =
        nix::unistd::pipe2(nix::fcntl::OFlag::O_CLOEXEC).map_err(|e| cleanup(io_err("pipe", sock)(e.into())))?;
    let daemon = Flags {
        socket: sock.display().to_string(),
        ..flags.clone()
    };
    // SAFETY: this process has one thread (see above), so the child may allocate and run any
    // code; it only rearranges descriptors before returning to `main` as the daemon.
    match unsafe { nix::unistd::fork() } {
        Err(e) => Err(cleanup(io_err("fork daemon for", sock)(e.into()))),
        Ok(nix::unistd::ForkResult::Child) => {
            drop(ready_r);
            let (listen, ready) = (listener.into_raw_fd(), ready_w.into_raw_fd());
            if become_daemon(listen, ready, bundle, engine).is_err() {
                // The parent sees the ready pipe close and reports the failure.
                // SAFETY: ends this forked child without running the parent's exit handlers.
                unsafe { libc::_exit(1) };
            }
            Ok(Spawned::Child(daemon))
        }
        Ok(nix::unistd::ForkResult::Parent { child }) => {
            drop(ready_w);
            drop(listener);
            match wait_ready(ready_r, Duration::from_secs(10)) {
                Ok(()) => Ok(Spawned::Parent(child.as_raw())),
                Err(e) => {
                    let _ = nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGKILL);
                    let _ = nix::sys::wait::waitpid(child, None);
                    Err(cleanup(e))
                }
            }
        }
    }
}

/// In the forked child: a session of its own, the bundle as working directory, stdio on
/// /dev/null, the listener and ready pipe at fds 3 and 4 and nothing else open (what an exec
/// with close-on-exec descriptors would have left), the engine's config path in the
/// environment, and "serve" in place of "start" in its command line.
fn become_daemon(listen: RawFd, ready: RawFd, bundle: &Path, engine: &EngineOptions) -> std::io::Result<()> {
    nix::unistd::setsid()?;
    std::env::set_current_dir(bundle)?;
    // First, so that stdio replaced below can never be one of them.
    crate::sys::install_fds(&[listen, ready], LISTENER_FD)?;
    let null = OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/null")?
        .into_raw_fd();
    for fd in 0..3 {
        if fd != null {
            nix::unistd::dup2(null, fd)?;
        }
    }
    if null > 2 {
        nix::unistd::close(null)?;
    }
    crate::sys::close_fds_from(READY_FD + 1)?;
    if let Some(p) = &engine.config_path {
        std::env::set_var(crate::config::CONFIG_ENV, p);
    }
    crate::sys::retitle_action("start", "serve");
    Ok(())
}

fn wait_ready(ready: OwnedFd, timeout: Duration) -> Result<(), BootstrapError> {
    use nix::poll::{poll, PollFd, PollFlags, PollTimeout};
    let mut fds = [PollFd::new(std::os::fd::AsFd::as_fd(&ready), PollFlags::POLLIN)];
    let t = PollTimeout::try_from(timeout.as_millis() as i32).unwrap_or(PollTimeout::MAX);
    match poll(&mut fds, t) {
        Ok(0) => return Err(BootstrapError::NotReady("timed out".into())),
        Err(e) => return Err(BootstrapError::NotReady(e.to_string())),
        Ok(_) => {}
    }
    let mut b = [0u8; 1];
    match File::from(ready).read(&mut b) {
        Ok(1) => Ok(()),
        _ => Err(BootstrapError::NotReady("daemon exited before serving".into())),
    }
}

/// `delete`: cleans up a bundle whose daemon is gone, as containerd asks after a shim died.
pub async fn delete(flags: &Flags) -> Result<DeleteResponse, BootstrapError> {
    spec::validate_namespace(&flags.namespace)?;
    spec::validate_id(&flags.id)?;
    let bundle = bundle_dir(flags);
    let record = RuntimeRecord::read(&bundle).map_err(BootstrapError::Record)?;
    let reaper = Reaper::default();
    reaper.start().map_err(io_err("signal handler", &bundle))?;
    let config = Config::resolve(None).map(|(c, _)| c);
    // Where a killed daemon lived (a bad config file leaves it to the default).
    let placement = config
        .as_ref()
        .map(|c| c.shim.daemon_cgroup.clone())
        .unwrap_or_default();
    let record = match record {
        Some(r) => r,
        None => {
            let path = spec_value(&bundle, "/linux/cgroupsPath").unwrap_or_default();
            RuntimeRecord::from_config(&config?, &flags.namespace, &path)
        }
    };
    let rt = OciRuntimes.for_record(&record, &bundle, reaper);
    match rt.delete(&flags.id, true).await {
        Ok(()) => {}
        Err(e) if e.is_not_found() => {}
        Err(e) => return Err(e.into()),
    }
    let _ = crate::mount::unmount_all(&bundle.join("rootfs"));
    let pid = std::fs::read_to_string(bundle.join(INIT_PID_FILE))
        .ok()
        .and_then(|s| s.trim().parse::<u32>().ok())
        .unwrap_or(0);
    // The dead daemon's socket, if nothing serves it any more: only ever a socket in the
    // socket directory, whatever a planted `address` names.
    // So is its seccomp listener (watched syscalls, recording), which the spec it edited names.
    let address = std::fs::read_to_string(bundle.join("address")).ok();
    let address = address
        .as_deref()
        .map(|a| a.trim().trim_start_matches("unix://").to_string());
    // A killed daemon's cgroupfs home (a systemd scope is collected by systemd).
    if let Some(cgroup) = address
        .as_ref()
        .and_then(|socket| daemon_cgroup::cgroup_of_dead(&placement, Path::new(socket), &flags.id))
    {
        daemon_cgroup::remove_cgroup(&cgroup);
    }
    for path in address.into_iter().chain(seccomp_listener(&bundle)) {
        let path = Path::new(&path);
        if files::is_socket_in(path, &record.socket_dir) && UnixStream::connect(path).is_err() {
            let _ = std::fs::remove_file(path);
        }
    }
    for f in [INIT_PID_FILE, RUNTIME_FILE, RUNTIME_LOG] {
        files::remove_entry(&bundle.join(f));
    }
    Ok(DeleteResponse {
        pid,
        exit_status: 137,
        exited_at: crate::events::ts_field(Some(SystemTime::now())),
        ..Default::default()
    })
}

/// `linux.seccomp.listenerPath` of the bundle's spec, if any.
fn seccomp_listener(bundle: &Path) -> Option<String> {
    spec_value(bundle, "/linux/seccomp/listenerPath")
}

/// One string of the bundle's spec (`delete` has no daemon that kept it in memory).
fn spec_value(bundle: &Path, pointer: &str) -> Option<String> {
    let spec: serde_json::Value = serde_json::from_slice(&std::fs::read(bundle.join("config.json")).ok()?).ok()?;
    spec.pointer(pointer)?.as_str().map(String::from)
}

/// `-v`: name, version and git revision.
pub fn version_text() -> String {
    format!(
        "containerd-shim-gantry-v2:\n  Version:  {}\n  Revision: {}\n  Rust version: {}\n",
        env!("CARGO_PKG_VERSION"),
        env!("GANTRY_GIT_REVISION"),
        env!("GANTRY_RUSTC_VERSION"),
    )
}

/// `features`: the OCI runtime's own features JSON, for the runtime a Create with these engine
/// options would use (runc `BinaryName` first, then the config `ConfigPath` names), so an
/// engine asking about one handler learns what that handler's containers get.
pub async fn features(engine: &EngineOptions) -> Result<Vec<u8>, BootstrapError> {
    let (c, _) = Config::resolve(engine.config_path.as_deref())?;
    let binary = crate::runtime::choose::oci_binary(engine, &c);
    let reaper = Reaper::default();
    reaper.start().map_err(io_err("signal handler", Path::new("/")))?;
    let rt = OciRuntime::new(&binary, c.runtime.root, false, PathBuf::from("/dev/null"), reaper);
    Ok(rt.features().await?)
}

/// The name containerd registers the runtime-spec `Features` type under (`typeurl.Register(&
/// features.Features{}, "types.containerd.io", "opencontainers/runtime-spec", "1", "features",
/// "Features")`), which runc's shim uses. containerd resolves an `Any` by this name alone and
/// decodes a non-protobuf type's value as JSON; under any other name its CRI sees no features
/// (no recursive read-only mounts, no idmapped mounts for user-namespace pods).
pub const FEATURES_TYPE_URL: &str = "types.containerd.io/opencontainers/runtime-spec/1/features/Features";

/// The runtime's own `features` JSON as containerd expects it in `RuntimeInfo.features`.
pub fn features_any(json: Vec<u8>) -> containerd_shim_protos::protobuf::well_known_types::any::Any {
    containerd_shim_protos::protobuf::well_known_types::any::Any {
        type_url: FEATURES_TYPE_URL.into(),
        value: json,
        ..Default::default()
    }
}

/// `-info`: a `RuntimeInfo` protobuf, as containerd 2.x asks of shims. `stdin` holds the
/// handler's runtime options as containerd sends them (a marshalled `Any`: runc `Options`, or
/// the CRI's `runtimeoptions` with gantry's `ConfigPath`); they pick the runtime whose features
/// are reported, and are echoed in `RuntimeInfo.options` as runc's shim does. A runtime
/// without `features` leaves the field empty (runc's shim does the same).
pub async fn info(stdin: &[u8]) -> Result<Vec<u8>, BootstrapError> {
    use containerd_shim_protos::protobuf::well_known_types::any::Any;
    use containerd_shim_protos::types::introspection::{RuntimeInfo, RuntimeVersion};
    let given = match stdin {
        [] => None,
        bytes => Some(Any::parse_from_bytes(bytes).map_err(|e| BootstrapError::Options(e.to_string()))?),
    };
    let engine = given.as_ref().map(options::from_any).unwrap_or_default();
    let features = features(&engine).await.ok();
    let info = RuntimeInfo {
        name: "io.containerd.gantry.v2".into(),
        version: containerd_shim_protos::protobuf::MessageField::some(RuntimeVersion {
            version: env!("CARGO_PKG_VERSION").into(),
            revision: env!("GANTRY_GIT_REVISION").into(),
            ..Default::default()
        }),
        features: features.map(features_any).into(),
        options: given.into(),
        ..Default::default()
    };
    Ok(info.write_to_bytes().unwrap_or_default())
}

/// `check-config [path]`: validates a file and prints what it resolved to.
pub fn check_config(path: Option<&str>) -> Result<String, BootstrapError> {
    let (config, used) = Config::resolve(path)?;
    let text = toml::to_string_pretty(&config).unwrap_or_default();
    let src = used
        .map(|p| p.display().to_string())
        .unwrap_or_else(|| "built-in defaults".into());
    Ok(format!("# config OK: {src}\n{text}"))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn group_locks_serialise_one_group_only_and_leave_no_file() {
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("aaaa"), dir.path().join("bbbb"));
        let held = GroupLock::acquire(&a).unwrap();
        let (tx, rx) = std::sync::mpsc::channel();
        let a2 = a.clone();
        let waiter = std::thread::spawn(move || {
            let lock = GroupLock::acquire(&a2).unwrap();
            tx.send(()).unwrap();
            drop(lock);
        });
        // Another group is not held up; the same group is.
        drop(GroupLock::acquire(&b).unwrap());
        assert!(
            rx.recv_timeout(Duration::from_millis(200)).is_err(),
            "two holders of one group"
        );
        drop(held);
        rx.recv_timeout(Duration::from_secs(5))
            .expect("the waiter never got the lock");
        waiter.join().unwrap();
        let left: Vec<_> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name())
            .collect();
        assert!(left.is_empty(), "{left:?}");
    }

    /// What containerd 2.3 does with `RuntimeInfo.features`: look the type up by its URL, then
    /// unmarshal the value as the JSON of runtime-spec's `Features`.
    #[test]
    fn features_are_labelled_as_containerd_resolves_them() {
        // `runc features` of Debian's runc 1.1.5, abridged.
        let json = br#"{"ociVersionMin":"1.0.0","ociVersionMax":"1.1.0-rc.1","hooks":["prestart","createRuntime"],
            "mountOptions":["bind","rbind","ro","rro","rw"],"linux":{"namespaces":["cgroup","ipc","mount","network","pid","user","uts"],
            "capabilities":["CAP_CHOWN"],"cgroup":{"v1":true,"v2":true,"systemd":true,"systemdUser":true},
            "seccomp":{"enabled":true,"actions":["SCMP_ACT_ALLOW"],"operators":["SCMP_CMP_EQ"],"archs":["SCMP_ARCH_X86_64"]},
            "apparmor":{"enabled":true},"selinux":{"enabled":true}},"annotations":{"io.github.seccomp.libseccomp.version":"2.5.4"}}"#;
        let any = features_any(json.to_vec());
        assert_eq!(
            any.type_url,
            "types.containerd.io/opencontainers/runtime-spec/1/features/Features"
        );
        let f: oci_spec::runtime::Features = serde_json::from_slice(&any.value).unwrap();
        assert!(f.mount_options().as_ref().unwrap().iter().any(|o| o == "rro"));
        assert_eq!(f.oci_version_max(), "1.1.0-rc.1");
    }

    #[test]
    fn socket_paths_are_short_and_stable() {
        let a = socket_path(Path::new("/run/gantry/s"), "k8s.io", "pod").unwrap();
        let b = socket_path(Path::new("/run/gantry/s"), "k8s.io", "pod").unwrap();
        let c = socket_path(Path::new("/run/gantry/s"), "default", "pod").unwrap();
        assert_eq!(a, b);
        assert_ne!(a, c);
        assert!(a.as_os_str().len() < 108);
        let long = "/x".repeat(60);
        assert!(matches!(
            socket_path(Path::new(&long), "n", "g"),
            Err(BootstrapError::SocketTooLong(_))
        ));
    }
}
