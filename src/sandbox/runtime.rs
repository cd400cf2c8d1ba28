//! [`FastSandbox`]: the [`Runtime`] of a container the fast path started. Create spawns
//! `sandbox-init`, Start releases it, and the rest (kill, delete, pause, ps, update) works on
//! the process and its cgroup directly, as runc would, since no OCI runtime knows the container.

use std::os::fd::{AsRawFd, OwnedFd};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::Mutex;
use std::time::Instant;

use async_trait::async_trait;
use nix::fcntl::{fcntl, FcntlArg, OFlag};
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use tokio::io::AsyncReadExt;

use super::{cgroup, seccomp, RECORD_BINARY, SECCOMP_FD, START_FD, SYNC_FD};
use crate::config::RuntimeTimeouts;
use crate::reaper::Reaper;
use crate::runtime::{ProcessStdio, Runtime, RuntimeError, RuntimeIdentity, RuntimeState, Spawn};

/// A sandbox container started without an OCI runtime.
pub struct FastSandbox {
    bundle: PathBuf,
    cgroup: PathBuf,
    reaper: Reaper,
    timeouts: RuntimeTimeouts,
    /// Root the OCI runtime would have used (kept in the record for symmetry).
    root: PathBuf,
    pid: Mutex<Option<i32>>,
    /// Write end of the pipe the init waits on; taken by Start.
    start: Mutex<Option<OwnedFd>>,
    started: std::sync::atomic::AtomicBool,
    /// The spec as read at Create, when it has a seccomp filter for the daemon to compile, and
    /// where compiled filters are kept. Taken by the init's spawn: a whole spec (with a
    /// ~400-rule profile, tens of KiB of heap) is not kept for the sandbox's life.
    seccomp: Mutex<Option<(serde_json::Value, PathBuf)>>,
}

fn failed(command: &str, message: impl Into<String>) -> RuntimeError {
    RuntimeError::Failed {
        binary: RECORD_BINARY.into(),
        command: command.into(),
        message: message.into(),
        not_found: false,
        status: 1,
    }
}

fn not_found(command: &str) -> RuntimeError {
    RuntimeError::Failed {
        binary: RECORD_BINARY.into(),
        command: command.into(),
        message: "container does not exist".into(),
        not_found: true,
        status: 1,
    }
}

/// Runs blocking cgroup work off the daemon's thread.
async fn blocking<T: Send + 'static>(
    command: &'static str,
    f: impl FnOnce() -> Result<T, cgroup::CgroupError> + Send + 'static,
) -> Result<T, RuntimeError> {
    match tokio::task::spawn_blocking(f).await {
        Ok(r) => r.map_err(|e| failed(command, e.to_string())),
        Err(e) => Err(failed(command, e.to_string())),
    }
}

/// `fd` duplicated above the low numbers the child's dup2 targets, close-on-exec.
fn high(fd: &OwnedFd) -> Result<OwnedFd, RuntimeError> {
    let raw = fcntl(fd.as_raw_fd(), FcntlArg::F_DUPFD_CLOEXEC(10)).map_err(std::io::Error::from)?;
    // SAFETY: fcntl just returned this descriptor and nothing else owns it.
    Ok(unsafe { std::os::fd::FromRawFd::from_raw_fd(raw) })
}

impl FastSandbox {
    pub fn new(bundle: &Path, cgroup: PathBuf, root: PathBuf, timeouts: RuntimeTimeouts, reaper: Reaper) -> Self {
        Self {
            bundle: bundle.to_path_buf(),
            cgroup,
            reaper,
            timeouts,
            root,
            pid: Mutex::new(None),
            start: Mutex::new(None),
            started: Default::default(),
            seccomp: Mutex::new(None),
        }
    }

    /// The spec whose seccomp filter the daemon compiles for the init (none: no filter), and
    /// the directory of compiled filters.
    pub fn with_spec(mut self, doc: &serde_json::Value, cache: PathBuf) -> Self {
        self.seccomp = Mutex::new(seccomp::wanted(doc).then(|| (doc.clone(), cache)));
        self
    }

    /// The runtime of a fast-path container whose daemon died (`delete`): pid and cgroup from
    /// the bundle.
    pub fn recover(bundle: &Path, reaper: Reaper) -> Self {
        let doc: serde_json::Value = std::fs::read(bundle.join("config.json"))
            .ok()
            .and_then(|b| serde_json::from_slice(&b).ok())
            .unwrap_or_default();
        let cgroup = doc.pointer("/linux/cgroupsPath").and_then(|v| v.as_str()).unwrap_or("");
        let me = Self::new(
            bundle,
            cgroup.into(),
            PathBuf::new(),
            RuntimeTimeouts::default(),
            reaper,
        );
        let pid = std::fs::read_to_string(bundle.join(crate::container::INIT_PID_FILE))
            .ok()
            .and_then(|s| s.trim().parse().ok());
        *me.pid.lock().unwrap_or_else(|p| p.into_inner()) = pid;
        me
    }

    fn pid(&self) -> Option<i32> {
        *self.pid.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The init's pid while it lives in this container's cgroup (a reused pid never matches).
    fn live_pid(&self) -> Option<i32> {
        let pid = self.pid()?;
        let cgroups = crate::proc::cgroup_text(pid).ok()?;
        // systemd driver: systemd places the scope under its own root and the slice's path.
        let (want, scope) = match cgroup::systemd_unit(&self.cgroup) {
            Some(unit) => (format!("/{}", unit.scope), true),
            None => (self.cgroup.to_string_lossy().into_owned(), false),
        };
        crate::proc::parse_cgroups(&cgroups)
            .iter()
            .map(|e| e.path.as_str())
            .any(|p| if scope { p.ends_with(&want) } else { p == want })
            .then_some(pid)
    }

    fn command(&self, pid_file: &Path, stdio: ProcessStdio, fds: [(OwnedFd, i32); 3]) -> Command {
        let mut cmd = Command::new(crate::environ::self_exe());
        cmd.arg0(RECORD_BINARY)
            .arg("sandbox-init")
            .arg(&self.bundle)
            .arg(pid_file);
        cmd.stdin(stdio.stdin.map(Stdio::from).unwrap_or_else(Stdio::null));
        cmd.stdout(stdio.stdout.map(Stdio::from).unwrap_or_else(Stdio::null));
        cmd.stderr(stdio.stderr.map(Stdio::from).unwrap_or_else(Stdio::null));
        cmd.env_clear().process_group(0);
        // The bus the daemon's checks found is the one the init's systemd calls use.
        if let Some(bus) = std::env::var_os("DBUS_SYSTEM_BUS_ADDRESS") {
            cmd.env("DBUS_SYSTEM_BUS_ADDRESS", bus);
        }
        // SAFETY: only dup2 (async-signal-safe) between fork and exec; it clears close-on-exec.
        unsafe {
            cmd.pre_exec(move || {
                for (fd, at) in &fds {
                    if *at >= 0 && libc::dup2(fd.as_raw_fd(), *at) < 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                }
                Ok(())
            });
        }
        cmd
    }

    /// Spawns the init and reads its report: `ok`, or the step that failed.
    async fn spawn_init(&self, pid_file: &Path, stdio: ProcessStdio) -> Result<(), RuntimeError> {
        let (sync_r, sync_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(std::io::Error::from)?;
        let (start_r, start_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(std::io::Error::from)?;
        let (program_r, program_w) = nix::unistd::pipe2(OFlag::O_CLOEXEC).map_err(std::io::Error::from)?;
        let filter_spec = self.seccomp.lock().unwrap_or_else(|p| p.into_inner()).take();
        // Without a filter to send the init gets no descriptor 5 (`-1`: not placed).
        let program_at = if filter_spec.is_some() { SECCOMP_FD } else { -1 };
        let fds = [
            (high(&sync_w)?, SYNC_FD),
            (high(&start_r)?, START_FD),
            (high(&program_r)?, program_at),
        ];
        let mut cmd = self.command(pid_file, stdio, fds);
        // systemd moves the init into its scope through `cgroup.procs`, which waits out an RCU
        // grace period unless the migration lock is warm (`cgroups::warm`); the first warm-up
        // write pays that period while the init starts and asks for the scope.
        let _warm = cgroup::systemd_unit(&self.cgroup).map(|_| crate::cgroups::warm::hold());
        let since = Instant::now();
        let child = cmd.spawn().map_err(|source| RuntimeError::Spawn {
            binary: RECORD_BINARY.into(),
            source,
        })?;
        let pid = child.id() as i32;
        let exited = self.reaper.subscribe_since(pid, Some(since));
        drop(cmd);
        drop((sync_w, start_r, program_r));
        let compiled = filter_spec.map(|(doc, dir)| {
            tokio::task::spawn_blocking(move || seccomp::send(&doc, program_w, Some(&seccomp::Cache::new(dir))))
        });
        *self.start.lock().unwrap_or_else(|p| p.into_inner()) = Some(start_w);
        let mut report = String::new();
        let after = self.timeouts.for_command("create");
        let read = async {
            let mut r = tokio::net::unix::pipe::Receiver::from_owned_fd(sync_r)?;
            r.read_to_string(&mut report).await?;
            Ok::<_, std::io::Error>(exited.await.ok())
        };
        let exit = match tokio::time::timeout(after, read).await {
            Ok(r) => r?,
            Err(_) => {
                let _ = nix::sys::signal::killpg(Pid::from_raw(pid), Signal::SIGKILL);
                return Err(RuntimeError::Timeout {
                    binary: RECORD_BINARY.into(),
                    command: "create".into(),
                    after,
                });
            }
        };
        let status = exit.map(|e| e.status).unwrap_or(1);
        let sent = match compiled {
            None => Ok(()),
            Some(task) => task.await.unwrap_or_else(|e| Err(format!("seccomp program: {e}"))),
        };
        init_outcome(&report, status, sent).map_err(|why| failed("create", why))
    }
}

/// What a fast-path Create comes to, from the init's report (its last line `ok` or `error:
/// …`), its exit status and whether the daemon could hand it the seccomp program. The init's
/// own error wins: an init that failed first (a refused `oomScoreAdj`, say) closes the
/// program pipe unread, and the daemon's write then fails with a mere EPIPE.
fn init_outcome(report: &str, status: u32, sent: Result<(), String>) -> Result<(), String> {
    match (report.lines().last(), sent) {
        (Some(line), _) if line != "ok" => Err(line.trim_start_matches("error: ").to_string()),
        // The init reported that no program came, or none could be made; the daemon knows why.
        (_, Err(why)) => Err(why),
        (Some(_), Ok(())) if status == 0 => Ok(()),
        (Some(_), Ok(())) => Err(format!("sandbox init reported ok but exited with status {status}")),
        (None, Ok(())) => Err(format!("sandbox init exited with status {status} before reporting")),
    }
}

#[async_trait]
impl Runtime for FastSandbox {
    fn identity(&self) -> RuntimeIdentity {
        RuntimeIdentity {
            binary: RECORD_BINARY.into(),
            root: self.root.clone(),
            systemd_cgroup: cgroup::systemd_unit(&self.cgroup).is_some(),
        }
    }

    async fn create(&self, _id: &str, _bundle: &Path, spawn: Spawn<'_>) -> Result<(), RuntimeError> {
        let result = self.spawn_init(spawn.pid_file, spawn.stdio).await;
        // The init's temporary pid file, left only when it failed before renaming it.
        let mut tmp = spawn.pid_file.as_os_str().to_owned();
        tmp.push(".tmp");
        crate::files::remove_entry(Path::new(&tmp));
        if let Ok(pid) = std::fs::read_to_string(spawn.pid_file).map(|s| s.trim().parse::<i32>()) {
            *self.pid.lock().unwrap_or_else(|p| p.into_inner()) = pid.ok();
        }
        result
    }

    async fn start(&self, _id: &str) -> Result<(), RuntimeError> {
        let Some(fd) = self.start.lock().unwrap_or_else(|p| p.into_inner()).take() else {
            return Err(failed("start", "container is not in created state"));
        };
        let written = nix::unistd::write(&fd, b"s").map_err(std::io::Error::from);
        match written {
            Ok(1) => {
                self.started.store(true, std::sync::atomic::Ordering::SeqCst);
                Ok(())
            }
            _ => Err(failed("start", "container's init is gone")),
        }
    }

    async fn exec(&self, _id: &str, _process: &Path, _spawn: Spawn<'_>) -> Result<(), RuntimeError> {
        Err(failed("exec", "a sandbox started by gantry's fast path takes no exec"))
    }

    async fn kill(&self, _id: &str, signal: u32, all: bool) -> Result<(), RuntimeError> {
        let targets = if all {
            let path = self.cgroup.clone();
            blocking("kill", move || cgroup::pids(&path)).await.unwrap_or_default()
        } else {
            self.live_pid().into_iter().collect()
        };
        if targets.is_empty() {
            return Err(failed("kill", "container not running"));
        }
        for pid in targets {
            // SAFETY: kill(2) with plain integers; the signal number was checked by the service.
            unsafe { libc::kill(pid, signal as i32) };
        }
        Ok(())
    }

    async fn delete(&self, _id: &str, force: bool) -> Result<(), RuntimeError> {
        self.start.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(pid) = self.live_pid() {
            if !force && self.started.load(std::sync::atomic::Ordering::SeqCst) {
                return Err(failed("delete", "cannot delete a running container"));
            }
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        let path = self.cgroup.clone();
        // systemd's driver asks systemd (D-Bus): off the daemon's thread, as the removal is.
        let existed = blocking("delete", move || {
            let existed = cgroup::exists(&path);
            cgroup::remove(&path).map(|()| existed)
        })
        .await?;
        if existed || self.pid().is_some() {
            Ok(())
        } else {
            Err(not_found("delete"))
        }
    }

    async fn pause(&self, _id: &str) -> Result<(), RuntimeError> {
        let path = self.cgroup.clone();
        blocking("pause", move || cgroup::freeze(&path, true)).await
    }

    async fn resume(&self, _id: &str) -> Result<(), RuntimeError> {
        let path = self.cgroup.clone();
        blocking("resume", move || cgroup::freeze(&path, false)).await
    }

    async fn update(&self, _id: &str, resources_json: &Path) -> Result<(), RuntimeError> {
        let raw = std::fs::read(resources_json)?;
        let resources: oci_spec::runtime::LinuxResources =
            serde_json::from_slice(&raw).map_err(|e| failed("update", format!("resources: {e}")))?;
        let path = self.cgroup.clone();
        blocking("update", move || cgroup::update(&path, &resources)).await
    }

    async fn ps(&self, _id: &str) -> Result<Vec<i32>, RuntimeError> {
        let path = self.cgroup.clone();
        blocking("ps", move || cgroup::pids(&path)).await
    }

    async fn checkpoint(&self, _id: &str, _image: &Path, _work: &Path, _exit: bool) -> Result<(), RuntimeError> {
        Err(failed(
            "checkpoint",
            "a sandbox started by gantry's fast path cannot be checkpointed",
        ))
    }

    async fn state(&self, _id: &str) -> Result<RuntimeState, RuntimeError> {
        let Some(pid) = self.pid() else {
            return Err(not_found("state"));
        };
        let status = match self.live_pid() {
            None => "stopped",
            Some(_) if !self.started.load(std::sync::atomic::Ordering::SeqCst) => "created",
            Some(_) => "running",
        };
        Ok(RuntimeState {
            pid,
            status: status.into(),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::init_outcome;

    #[test]
    fn the_inits_own_error_wins_over_the_broken_pipe_it_caused() {
        let epipe = || Err("seccomp program: Broken pipe (os error 32)".to_string());
        let report = "error: write /proc/self/oom_score_adj: Permission denied\n";
        assert_eq!(
            init_outcome(report, 1, epipe()),
            Err("write /proc/self/oom_score_adj: Permission denied".to_string())
        );
        assert_eq!(init_outcome("", 1, epipe()), epipe());
        assert_eq!(init_outcome("ok\n", 0, Ok(())), Ok(()));
        assert!(init_outcome("ok\n", 0, epipe()).is_err());
        assert!(init_outcome("", 1, Ok(())).unwrap_err().contains("before reporting"));
    }
}
