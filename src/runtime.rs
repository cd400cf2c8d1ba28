//! Drives the OCI runtime binary (runc by default, crun selectable). Every invocation's exit is
//! collected by the [`Reaper`], never by `Child::wait()`, and a failure carries the runtime's
//! own error text (its JSON log, then its stderr), not just "exit status 1".

use std::ffi::OsString;
use std::fs::File;
use std::io::{Read, Seek, SeekFrom};
use std::os::fd::OwnedFd;
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use async_trait::async_trait;
use serde::Deserialize;
use thiserror::Error;
use tokio::io::AsyncReadExt;

use crate::config::RuntimeTimeouts;
use crate::reaper::{Exit, Reaper};

#[derive(Debug, Error)]
pub enum RuntimeError {
    #[error("cannot run OCI runtime {binary:?}: {source}")]
    Spawn { binary: String, source: std::io::Error },
    #[error("{binary} {command} failed: {message}")]
    Failed {
        binary: String,
        command: String,
        message: String,
        /// True when the runtime said the container does not exist.
        not_found: bool,
        /// The runtime's exit status (128 + signal when it was killed).
        status: u32,
    },
    #[error("{binary} {command}: unexpected output: {message}")]
    Output {
        binary: String,
        command: String,
        message: String,
    },
    #[error("{0}")]
    Io(#[from] std::io::Error),
    /// The call ran past its configured limit; it and everything it started were killed.
    #[error("{binary} {command} did not finish within {}s and was killed", after.as_secs())]
    Timeout {
        binary: String,
        command: String,
        after: Duration,
    },
}

impl RuntimeError {
    pub fn is_not_found(&self) -> bool {
        matches!(self, RuntimeError::Failed { not_found: true, .. })
    }

    /// The runtime refused because the container's process is gone (a Kill racing its exit).
    pub fn is_not_running(&self) -> bool {
        match self {
            RuntimeError::Failed { message, .. } => {
                let m = message.to_lowercase();
                m.contains("not running") || m.contains("process already finished") || m.contains("no such process")
            }
            _ => false,
        }
    }
}

/// The container's stdio as handed to `create`/`exec` (inherited by the container process).
#[derive(Default)]
pub struct ProcessStdio {
    pub stdin: Option<OwnedFd>,
    pub stdout: Option<OwnedFd>,
    pub stderr: Option<OwnedFd>,
}

/// Options common to `create` and `exec`.
pub struct Spawn<'a> {
    pub pid_file: &'a Path,
    pub console_socket: Option<&'a Path>,
    pub stdio: ProcessStdio,
}

/// What a container's record names about its runtime (`delete` after a daemon died uses it).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RuntimeIdentity {
    pub binary: String,
    pub root: PathBuf,
    pub systemd_cgroup: bool,
}

/// The seam between the task service and the OCI runtime: the calls a container makes, so the
/// lifecycle (exit ordering, races, cancellation) is testable without runc. [`OciRuntime`] is
/// the real one; `fake::FakeRuntime` scripts one in unit tests.
#[async_trait]
pub trait Runtime: Send + Sync {
    fn identity(&self) -> RuntimeIdentity;
    async fn create(&self, id: &str, bundle: &Path, spawn: Spawn<'_>) -> Result<(), RuntimeError>;
    async fn start(&self, id: &str) -> Result<(), RuntimeError>;
    async fn exec(&self, id: &str, process_json: &Path, spawn: Spawn<'_>) -> Result<(), RuntimeError>;
    async fn kill(&self, id: &str, signal: u32, all: bool) -> Result<(), RuntimeError>;
    async fn delete(&self, id: &str, force: bool) -> Result<(), RuntimeError>;
    async fn pause(&self, id: &str) -> Result<(), RuntimeError>;
    async fn resume(&self, id: &str) -> Result<(), RuntimeError>;
    async fn update(&self, id: &str, resources_json: &Path) -> Result<(), RuntimeError>;
    async fn ps(&self, id: &str) -> Result<Vec<i32>, RuntimeError>;
    async fn checkpoint(&self, id: &str, image: &Path, work: &Path, exit: bool) -> Result<(), RuntimeError>;
    async fn state(&self, id: &str) -> Result<RuntimeState, RuntimeError>;
}

pub mod choose;
#[cfg(test)]
pub mod fake;

#[async_trait]
impl Runtime for OciRuntime {
    fn identity(&self) -> RuntimeIdentity {
        RuntimeIdentity {
            binary: self.binary.clone(),
            root: self.root.clone(),
            systemd_cgroup: self.systemd_cgroup,
        }
    }
    async fn create(&self, id: &str, bundle: &Path, spawn: Spawn<'_>) -> Result<(), RuntimeError> {
        OciRuntime::create(self, id, bundle, spawn).await
    }
    async fn start(&self, id: &str) -> Result<(), RuntimeError> {
        OciRuntime::start(self, id).await
    }
    async fn exec(&self, id: &str, process_json: &Path, spawn: Spawn<'_>) -> Result<(), RuntimeError> {
        OciRuntime::exec(self, id, process_json, spawn).await
    }
    async fn kill(&self, id: &str, signal: u32, all: bool) -> Result<(), RuntimeError> {
        OciRuntime::kill(self, id, signal, all).await
    }
    async fn delete(&self, id: &str, force: bool) -> Result<(), RuntimeError> {
        OciRuntime::delete(self, id, force).await
    }
    async fn pause(&self, id: &str) -> Result<(), RuntimeError> {
        OciRuntime::pause(self, id).await
    }
    async fn resume(&self, id: &str) -> Result<(), RuntimeError> {
        OciRuntime::resume(self, id).await
    }
    async fn update(&self, id: &str, resources_json: &Path) -> Result<(), RuntimeError> {
        OciRuntime::update(self, id, resources_json).await
    }
    async fn ps(&self, id: &str) -> Result<Vec<i32>, RuntimeError> {
        OciRuntime::ps(self, id).await
    }
    async fn checkpoint(&self, id: &str, image: &Path, work: &Path, exit: bool) -> Result<(), RuntimeError> {
        OciRuntime::checkpoint(self, id, image, work, exit).await
    }
    async fn state(&self, id: &str) -> Result<RuntimeState, RuntimeError> {
        OciRuntime::state(self, id).await
    }
}

/// One configured OCI runtime (binary + state root).
#[derive(Debug, Clone)]
pub struct OciRuntime {
    pub binary: String,
    /// `binary` resolved against PATH once, as Go's `exec.LookPath` does for the runc shim:
    /// a bare name would otherwise cost a failed `execve` per PATH entry at every invocation.
    program: PathBuf,
    pub root: PathBuf,
    pub systemd_cgroup: bool,
    /// JSON log the runtime writes errors into (`--log`), kept inside the bundle.
    pub log: PathBuf,
    reaper: Reaper,
    /// Per-command limits; past one, the call's process group is killed.
    timeouts: RuntimeTimeouts,
}

/// Part of `runc state` output the shim uses.
#[derive(Debug, Deserialize)]
pub struct RuntimeState {
    pub pid: i32,
    pub status: String,
}

/// The executable `name` runs: itself when it holds a `/`, else the first executable regular
/// file of that name in `path` (a `PATH` value). Unresolved names stay as given, so spawning
/// fails with the name the operator configured.
fn look_path(name: &str, path: Option<&std::ffi::OsStr>) -> PathBuf {
    use std::os::unix::fs::PermissionsExt;
    if name.contains('/') {
        return PathBuf::from(name);
    }
    let executable = |p: &Path| std::fs::metadata(p).is_ok_and(|m| m.is_file() && m.permissions().mode() & 0o111 != 0);
    path.into_iter()
        .flat_map(std::env::split_paths)
        .filter(|dir| !dir.as_os_str().is_empty())
        .map(|dir| dir.join(name))
        .find(|p| executable(p))
        .unwrap_or_else(|| PathBuf::from(name))
}

impl OciRuntime {
    pub fn new(binary: &str, root: PathBuf, systemd_cgroup: bool, log: PathBuf, reaper: Reaper) -> Self {
        Self {
            binary: binary.to_string(),
            program: look_path(binary, std::env::var_os("PATH").as_deref()),
            root,
            systemd_cgroup,
            log,
            reaper,
            timeouts: RuntimeTimeouts::default(),
        }
    }

    /// Uses `timeouts` (the config's `[runtime.timeouts]`) instead of the defaults.
    pub fn with_timeouts(mut self, timeouts: RuntimeTimeouts) -> Self {
        self.timeouts = timeouts;
        self
    }

    fn command(&self, args: &[OsString]) -> Command {
        let mut cmd = Command::new(&self.program);
        cmd.arg0(&self.binary);
        cmd.arg("--root").arg(&self.root);
        cmd.arg("--log").arg(&self.log).arg("--log-format").arg("json");
        if self.systemd_cgroup {
            cmd.arg("--systemd-cgroup");
        }
        cmd.args(args);
        crate::environ::sanitise(&mut cmd);
        // Its own process group: on a timeout the runtime and all it forked die together.
        cmd.process_group(0);
        cmd
    }

    /// Runs the runtime and returns its stdout. `stdio` (for create/exec) replaces the
    /// runtime's own stdio so the container inherits it; otherwise output is captured.
    async fn run(&self, args: Vec<OsString>, stdio: Option<ProcessStdio>) -> Result<Vec<u8>, RuntimeError> {
        let command = args
            .iter()
            .find(|a| !a.to_string_lossy().starts_with('-'))
            .map(|a| a.to_string_lossy().into_owned())
            .unwrap_or_default();
        let log_start = std::fs::metadata(&self.log).map(|m| m.len()).unwrap_or(0);
        let mut cmd = self.command(&args);
        let capture = stdio.is_none();
        match stdio {
            Some(s) => {
                cmd.stdin(s.stdin.map(Stdio::from).unwrap_or_else(Stdio::null));
                cmd.stdout(s.stdout.map(Stdio::from).unwrap_or_else(Stdio::null));
                cmd.stderr(s.stderr.map(Stdio::from).unwrap_or_else(Stdio::null));
            }
            None => {
                cmd.stdin(Stdio::null()).stdout(Stdio::piped()).stderr(Stdio::piped());
            }
        }
        let spawned = std::time::Instant::now();
        let mut child = cmd.spawn().map_err(|source| RuntimeError::Spawn {
            binary: self.binary.clone(),
            source,
        })?;
        // Subscribe before the first await so the reaper cannot hand the exit to nobody, and
        // only to an exit reaped after the spawn: a kept exit of an earlier process that had
        // this pid (reused) must not end this call.
        let pid = child.id() as i32;
        let mut exited = self.reaper.subscribe_since(pid, Some(spawned));
        crate::peer::note_runtime(pid);
        let (mut out, mut err) = (Vec::new(), Vec::new());
        let (stdout, stderr) = if capture {
            let stdout = child.stdout.take().map(pipe_reader).transpose()?;
            (stdout, child.stderr.take().map(pipe_reader).transpose()?)
        } else {
            (None, None)
        };
        let after = self.timeouts.for_command(&command);
        let finished = tokio::time::timeout(after, async {
            let read_out = async {
                if let Some(mut r) = stdout {
                    let _ = r.read_to_end(&mut out).await;
                }
            };
            let read_err = async {
                if let Some(mut r) = stderr {
                    let _ = r.read_to_end(&mut err).await;
                }
            };
            tokio::join!(read_out, read_err);
            (&mut exited).await
        })
        .await;
        drop(cmd);
        let Ok(exit) = finished else {
            return Err(self.kill_timed_out(pid, command, after, exited).await);
        };
        let exit = exit.map_err(|_| std::io::Error::other(format!("{} {command}: exit status lost", self.binary)))?;
        if exit.status == 0 {
            return Ok(out);
        }
        let logged = read_log_errors(&self.log, log_start);
        let message = failure_message(&logged, &String::from_utf8_lossy(&err), exit.status, capture);
        let not_found = says_container_missing(&message);
        Err(RuntimeError::Failed {
            binary: self.binary.clone(),
            command,
            message,
            not_found,
            status: exit.status,
        })
    }

    /// Kills the process group of a call that ran out of time and waits (bounded) for the
    /// reaper to collect its leader.
    async fn kill_timed_out(
        &self,
        pid: i32,
        command: String,
        after: Duration,
        exited: tokio::sync::oneshot::Receiver<Exit>,
    ) -> RuntimeError {
        use nix::sys::signal::{killpg, Signal};
        let _ = killpg(nix::unistd::Pid::from_raw(pid), Signal::SIGKILL);
        let _ = tokio::time::timeout(Duration::from_secs(5), exited).await;
        RuntimeError::Timeout {
            binary: self.binary.clone(),
            command,
            after,
        }
    }

    pub async fn create(&self, id: &str, bundle: &Path, spawn: Spawn<'_>) -> Result<(), RuntimeError> {
        self.spawn(vec!["create".into(), "--bundle".into(), bundle.into()], id, spawn)
            .await
    }

    pub async fn start(&self, id: &str) -> Result<(), RuntimeError> {
        self.run(vec!["start".into(), id.into()], None).await.map(|_| ())
    }

    /// Runs an extra process described by `process_json` (an OCI `Process`) in the container.
    pub async fn exec(&self, id: &str, process_json: &Path, spawn: Spawn<'_>) -> Result<(), RuntimeError> {
        let args = vec![
            "exec".into(),
            "--detach".into(),
            "--process".into(),
            process_json.into(),
        ];
        self.spawn(args, id, spawn).await
    }

    /// `create` and `exec`: the calls that start a process, with its pid file and console.
    async fn spawn(&self, mut args: Vec<OsString>, id: &str, spawn: Spawn<'_>) -> Result<(), RuntimeError> {
        args.extend(["--pid-file".into(), spawn.pid_file.into()]);
        if let Some(sock) = spawn.console_socket {
            args.extend(["--console-socket".into(), sock.into()]);
        }
        args.push(id.into());
        // The runtime writes the new process into every hierarchy's cgroup.procs.
        let _warm = crate::cgroups::warm::hold();
        self.run(args, Some(spawn.stdio)).await.map(|_| ())
    }

    pub async fn kill(&self, id: &str, signal: u32, all: bool) -> Result<(), RuntimeError> {
        let mut args: Vec<OsString> = vec!["kill".into()];
        if all {
            args.push("--all".into());
        }
        args.extend([id.into(), signal.to_string().into()]);
        self.run(args, None).await.map(|_| ())
    }

    pub async fn delete(&self, id: &str, force: bool) -> Result<(), RuntimeError> {
        let mut args: Vec<OsString> = vec!["delete".into()];
        if force {
            args.push("--force".into());
        }
        args.push(id.into());
        self.run(args, None).await.map(|_| ())
    }

    pub async fn pause(&self, id: &str) -> Result<(), RuntimeError> {
        self.run(vec!["pause".into(), id.into()], None).await.map(|_| ())
    }

    pub async fn resume(&self, id: &str) -> Result<(), RuntimeError> {
        self.run(vec!["resume".into(), id.into()], None).await.map(|_| ())
    }

    /// Applies new limits from an OCI `LinuxResources` JSON file.
    pub async fn update(&self, id: &str, resources_json: &Path) -> Result<(), RuntimeError> {
        let args = vec!["update".into(), "--resources".into(), resources_json.into(), id.into()];
        self.run(args, None).await.map(|_| ())
    }

    pub async fn state(&self, id: &str) -> Result<RuntimeState, RuntimeError> {
        let out = self.run(vec!["state".into(), id.into()], None).await?;
        serde_json::from_slice(&out).map_err(|e| self.output_error("state", e))
    }

    /// Pids of every process in the container.
    pub async fn ps(&self, id: &str) -> Result<Vec<i32>, RuntimeError> {
        let args = vec!["ps".into(), "--format".into(), "json".into(), id.into()];
        let out = self.run(args, None).await?;
        let pids: Option<Vec<i32>> = serde_json::from_slice(&out).map_err(|e| self.output_error("ps", e))?;
        Ok(pids.unwrap_or_default())
    }

    /// The runtime's `features` JSON, verbatim.
    pub async fn features(&self) -> Result<Vec<u8>, RuntimeError> {
        self.run(vec!["features".into()], None).await
    }

    pub async fn checkpoint(&self, id: &str, image: &Path, work: &Path, exit: bool) -> Result<(), RuntimeError> {
        let mut args: Vec<OsString> = vec!["checkpoint".into(), "--image-path".into(), image.into()];
        args.extend(["--work-path".into(), work.into()]);
        if !exit {
            args.push("--leave-running".into());
        }
        args.push(id.into());
        self.run(args, None).await.map(|_| ())
    }

    fn output_error(&self, command: &str, e: serde_json::Error) -> RuntimeError {
        RuntimeError::Output {
            binary: self.binary.clone(),
            command: command.to_string(),
            message: e.to_string(),
        }
    }
}

/// True when the runtime's failure says the container itself does not exist (NOT_FOUND), as
/// runc's "container does not exist" and crun's "container `x` not found"/"does not exist";
/// never for the container's process failing to start ("executable file not found", a
/// missing file): those are the runc shim's UNKNOWN.
pub(crate) fn says_container_missing(message: &str) -> bool {
    let m = message.to_lowercase();
    let start_failure = m.contains("executable file not found") || m.contains("no such file or directory");
    !start_failure && (m.contains("does not exist") || m.contains("container") && m.contains("not found"))
}

/// Whether CRIU can checkpoint on this host (`criu check`), asked once; the error says why not.
pub async fn criu_available(reaper: &Reaper) -> Result<(), String> {
    static RESULT: tokio::sync::OnceCell<Result<(), String>> = tokio::sync::OnceCell::const_new();
    RESULT.get_or_init(|| criu_check("criu", reaper)).await.clone()
}

/// Runs `<criu> check` as the runtime calls run: spawned, its stderr read on the reactor, its
/// exit collected by the reaper, so the daemon's only thread never waits on it.
async fn criu_check(criu: &str, reaper: &Reaper) -> Result<(), String> {
    const LIMIT: Duration = Duration::from_secs(30);
    let mut cmd = Command::new(criu);
    cmd.arg("check")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let since = std::time::Instant::now();
    let mut child = cmd
        .spawn()
        .map_err(|e| format!("checkpoint needs CRIU, which cannot run here: {e}"))?;
    let exit = reaper.subscribe_since(child.id() as i32, Some(since));
    let mut err = Vec::new();
    if let Some(Ok(mut r)) = child.stderr.take().map(pipe_reader) {
        let _ = tokio::time::timeout(LIMIT, r.read_to_end(&mut err)).await;
    }
    match tokio::time::timeout(LIMIT, exit).await {
        Ok(Ok(e)) if e.status == 0 => Ok(()),
        Ok(Ok(_)) => {
            let text = String::from_utf8_lossy(&err);
            let last = text.lines().rfind(|l| !l.trim().is_empty()).unwrap_or("no output");
            Err(format!(
                "checkpoint needs CRIU, and `criu check` fails on this host: {}",
                last.trim()
            ))
        }
        _ => {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(child.id() as i32), nix::sys::signal::SIGKILL);
            Err("checkpoint needs CRIU, and `criu check` did not answer".into())
        }
    }
}

pub(crate) fn pipe_reader<T: Into<OwnedFd>>(p: T) -> std::io::Result<tokio::net::unix::pipe::Receiver> {
    tokio::net::unix::pipe::Receiver::from_owned_fd(p.into())
}

/// Error messages the runtime logged (JSON lines with level error/fatal) after `offset`.
fn read_log_errors(path: &Path, offset: u64) -> String {
    let mut text = String::new();
    if let Ok(mut f) = File::open(path) {
        if f.seek(SeekFrom::Start(offset)).is_ok() {
            let _ = f.take(64 * 1024).read_to_string(&mut text);
        }
    }
    parse_log_errors(&text)
}

/// The runtime's own words for a failure: its logged errors, then whatever stderr adds (runc
/// and crun print the same error to both; it is said once). Without either, the exit status,
/// and where the text went when stderr was the container's.
fn failure_message(logged: &str, stderr: &str, status: u32, captured: bool) -> String {
    let mut parts: Vec<&str> = Vec::new();
    if !logged.is_empty() {
        parts.push(logged);
    }
    for line in stderr.lines().map(str::trim).filter(|l| !l.is_empty()) {
        let repeated = logged.contains(line) || !logged.is_empty() && line.contains(logged);
        if !repeated && !parts.contains(&line) {
            parts.push(line);
        }
    }
    if !parts.is_empty() {
        return parts.join("; ");
    }
    if captured {
        format!("exit status {status}")
    } else {
        format!("exit status {status} with nothing in its log (its stderr is the process's stderr)")
    }
}

/// Extracts `msg` of error-level JSON log lines (runc and crun both log `{"level","msg"}`).
pub fn parse_log_errors(text: &str) -> String {
    #[derive(Deserialize)]
    struct Line {
        #[serde(default)]
        level: String,
        #[serde(default)]
        msg: String,
    }
    text.lines()
        .filter_map(|l| serde_json::from_str::<Line>(l).ok())
        .filter(|l| matches!(l.level.as_str(), "error" | "fatal" | "panic"))
        .map(|l| l.msg)
        .collect::<Vec<_>>()
        .join("; ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runtime_binary_is_looked_up_once_in_path() {
        use std::os::unix::fs::PermissionsExt;
        let dir = tempfile::tempdir().unwrap();
        let (a, b) = (dir.path().join("a"), dir.path().join("b"));
        std::fs::create_dir_all(&a).unwrap();
        std::fs::create_dir_all(&b).unwrap();
        // in `a` but not executable, a directory of that name in `b`: both skipped
        std::fs::write(a.join("rt"), "").unwrap();
        std::fs::create_dir(b.join("rt")).unwrap();
        let c = dir.path().join("c");
        std::fs::create_dir_all(&c).unwrap();
        std::fs::write(c.join("rt"), "#!/bin/sh\n").unwrap();
        std::fs::set_permissions(c.join("rt"), std::fs::Permissions::from_mode(0o755)).unwrap();
        let path = std::env::join_paths([&a, &b, &c]).unwrap();
        assert_eq!(look_path("rt", Some(&path)), c.join("rt"));
        assert_eq!(look_path("missing", Some(&path)), PathBuf::from("missing"));
        assert_eq!(look_path("./rt", Some(&path)), PathBuf::from("./rt"));
        assert_eq!(look_path("/usr/bin/rt", None), PathBuf::from("/usr/bin/rt"));
    }

    fn script(dir: &Path, body: &str) -> PathBuf {
        use std::os::unix::fs::PermissionsExt;
        let path = dir.join("fake-runtime");
        std::fs::write(&path, format!("#!/bin/sh\n{body}\n")).unwrap();
        std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o755)).unwrap();
        path
    }

    fn fake_runtime(dir: &Path, body: &str, reaper: Reaper) -> OciRuntime {
        let path = script(dir, body);
        OciRuntime::new(
            path.to_str().unwrap(),
            dir.join("root"),
            false,
            dir.join("log.json"),
            reaper,
        )
    }

    /// Alive and not a zombie (an orphan's zombie may wait for a pid 1 that does not reap).
    fn running(pid: i32) -> bool {
        crate::proc::is_running(pid)
    }

    // The std lock keeps other tests' children out of this reaper's waitpid(-1) while it runs.
    #[allow(clippy::await_holding_lock)]
    #[tokio::test(start_paused = true)]
    async fn create_uses_its_own_limit_on_the_paused_clock() {
        let _children = crate::sys::test_children_lock();
        let dir = tempfile::tempdir().unwrap();
        let reaper = Reaper::default();
        reaper.start().unwrap();
        let rt = fake_runtime(dir.path(), "exec sleep 1000", reaper);
        let t0 = tokio::time::Instant::now();
        let spawn = Spawn {
            pid_file: &dir.path().join("pid"),
            console_socket: None,
            stdio: ProcessStdio::default(),
        };
        let e = rt.create("c1", dir.path(), spawn).await.unwrap_err();
        let want = RuntimeTimeouts::default().for_command("create");
        assert!(
            matches!(&e, RuntimeError::Timeout { command, after, .. } if command == "create" && *after == want),
            "{e}"
        );
        // On tokio's clock: a timer outside it would not have advanced t0 at all.
        assert!(t0.elapsed() >= want);
    }

    // The std lock keeps other tests' children out of this reaper's waitpid(-1) while it runs.
    #[allow(clippy::await_holding_lock)]
    #[tokio::test]
    async fn a_hung_call_is_killed_with_its_process_group() {
        let _children = crate::sys::test_children_lock();
        let dir = tempfile::tempdir().unwrap();
        let reaper = Reaper::default();
        reaper.start().unwrap();
        let marker = dir.path().join("grandchild");
        let body = format!("sleep 1000 &\necho $! > {}\nwait", marker.display());
        let rt = fake_runtime(dir.path(), &body, reaper).with_timeouts(RuntimeTimeouts {
            kill: 1,
            ..Default::default()
        });
        let e = rt.kill("c1", 15, false).await.unwrap_err();
        assert!(
            matches!(&e, RuntimeError::Timeout { command, after, .. } if command == "kill" && after.as_secs() == 1),
            "{e}"
        );
        assert!(e.to_string().contains("kill did not finish within 1s"), "{e}");
        let grandchild: i32 = std::fs::read_to_string(&marker).unwrap().trim().parse().unwrap();
        let mut gone = false;
        for _ in 0..100 {
            if !running(grandchild) {
                gone = true;
                break;
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        assert!(gone, "the runtime's child {grandchild} survived the timeout");
    }

    // The std lock keeps other tests' children out of this reaper's waitpid(-1) while it runs.
    #[allow(clippy::await_holding_lock)]
    #[tokio::test]
    async fn a_kept_exit_of_a_reused_pid_does_not_end_a_call() {
        let _children = crate::sys::test_children_lock();
        let dir = tempfile::tempdir().unwrap();
        let reaper = Reaper::default();
        reaper.start().unwrap();
        // Unclaimed exits (status 99) for every pid the next spawns may get, as if earlier
        // processes with those pids had exited and nobody had asked for them yet.
        let last: i32 = std::fs::read_to_string("/proc/sys/kernel/ns_last_pid")
            .unwrap()
            .trim()
            .parse()
            .unwrap();
        for pid in last + 1..last + 5000 {
            reaper.deliver(Exit {
                pid,
                status: 99,
                at: std::time::SystemTime::now(),
            });
        }
        let rt = fake_runtime(dir.path(), "sleep 0.2\nexit 0", reaper);
        let r = rt.start("c1").await;
        assert!(r.is_ok(), "the call ended with an older process's exit: {r:?}");
    }

    #[test]
    fn failure_text_is_said_once() {
        let logged = "runc create failed: unable to start container process: exec: \"nope\": not found";
        let stderr = format!("{logged}\n");
        assert_eq!(failure_message(logged, &stderr, 1, true), logged);
        let logrus = format!("time=\"2026\" level=error msg=\"{logged}\"\n");
        assert_eq!(failure_message(logged, &logrus, 1, true), logged);
        assert_eq!(
            failure_message("", "unable to signal init: x\nunable to signal init: x\n", 1, true),
            "unable to signal init: x"
        );
        assert_eq!(
            failure_message(logged, "other words\n", 1, true),
            format!("{logged}; other words")
        );
        assert_eq!(failure_message("", "", 3, true), "exit status 3");
        assert!(failure_message("", "", 3, false).contains("process's stderr"));
    }

    // The std lock keeps other tests' children out of this reaper's waitpid(-1) while it runs.
    #[allow(clippy::await_holding_lock)]
    #[tokio::test]
    async fn criu_check_leaves_the_reactor_free() {
        let _children = crate::sys::test_children_lock();
        let dir = tempfile::tempdir().unwrap();
        let reaper = Reaper::default();
        reaper.start().unwrap();
        let criu = script(dir.path(), "sleep 0.5\necho 'Error: no luck here' >&2\nexit 1");
        let ticks = std::sync::Arc::new(std::sync::atomic::AtomicU32::new(0));
        let counter = ticks.clone();
        let ticker = tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_millis(10)).await;
                counter.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            }
        });
        let e = criu_check(criu.to_str().unwrap(), &reaper).await.unwrap_err();
        ticker.abort();
        assert!(e.ends_with("Error: no luck here"), "{e}");
        let n = ticks.load(std::sync::atomic::Ordering::Relaxed);
        assert!(n >= 10, "the reactor ran {n} timers during a 0.5 s check");
        let e = criu_check("/nonexistent/criu", &reaper).await.unwrap_err();
        assert!(e.contains("cannot run here"), "{e}");
    }

    #[test]
    fn only_a_missing_container_is_not_found() {
        let table = [
            ("container does not exist", true),
            ("container with id exists: c1", false),
            ("container `c1` not found", true),
            (
                "runc create failed: unable to start container process: exec: \"nope\": executable file not found in $PATH",
                false,
            ),
            (
                "runc exec failed: unable to start container process: exec: \"/nope\": stat /nope: no such file or directory",
                false,
            ),
            ("container not running", false),
        ];
        for (message, want) in table {
            assert_eq!(says_container_missing(message), want, "{message}");
        }
    }

    #[test]
    fn log_errors_are_extracted() {
        let log = r#"{"level":"warning","msg":"ignored","time":"x"}
{"level":"error","msg":"runc run failed: unable to start container process: exec: \"nope\": executable file not found in $PATH","time":"x"}
not json
"#;
        assert_eq!(
            parse_log_errors(log),
            "runc run failed: unable to start container process: exec: \"nope\": executable file not found in $PATH"
        );
        assert_eq!(parse_log_errors(""), "");
    }
}
