//! `install` and `uninstall`: gantry put onto a node from a privileged pod (or by hand) that
//! sees the host's root at `--host`, the way kata-deploy installs Kata.
//!
//! The rules, each learned by kata-deploy's users: write drop-ins only; write binaries into
//! versioned paths by write-then-rename and swap a stable symlink; restart an engine only
//! when a file it reads changed; never remove a binary while a bundle names it; removal is an
//! explicit `uninstall`, never a side effect of the pod stopping. Every step is a line on
//! stderr; the outcome is a JSON report on stdout and, for probes, `/run/gantry/install/ready`.

mod binary;
mod engines;
mod restart;
mod state;

use std::path::{Path, PathBuf};
use std::time::Duration;

use thiserror::Error;

pub use binary::{version_of, STABLE_PATH, VERSIONS_DIR};
use engines::Engine;
use state::State;

pub const READY_FILE: &str = "/run/gantry/install/ready";
const LOCK_FILE: &str = "/run/lock/gantry-install.lock";
const CONFIG: &str = "/etc/gantry/config.toml";
const RESTART_TIMEOUT: Duration = Duration::from_secs(120);

#[derive(Debug, Error)]
pub enum InstallError {
    #[error("{0}; usage: install|uninstall [--host DIR] [--payload DIR] [--engine auto|crio|containerd] [--containerd-version V] [--no-restart] [--stay] [--check]")]
    Usage(String),
    #[error("{what} {path}: {source}")]
    Io {
        what: &'static str,
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no engine found under {0} (neither CRI-O nor containerd): nothing to register with")]
    NoEngine(PathBuf),
    #[error("cannot tell containerd's version (no dpkg record, the binary does not run here, no version 3 config): pass --containerd-version")]
    ContainerdVersion,
    #[error("{0} was not installed by this installer (scripts/install.sh installs a plain file): remove it with scripts/install.sh --uninstall first")]
    Foreign(PathBuf),
    #[error("containerd's main config: {0}; left unchanged")]
    MainConfig(String),
    #[error("the installed config {0} does not load with this version: {1}")]
    Config(PathBuf, String),
    #[error("restarting {0}: {1}")]
    Restart(&'static str, String),
    #[error("{0}")]
    State(String),
    #[error("not ready: {0}")]
    NotReady(String),
}

impl InstallError {
    fn io(what: &'static str, path: &Path, source: std::io::Error) -> Self {
        InstallError::Io {
            what,
            path: path.to_path_buf(),
            source,
        }
    }
}

/// `path` (absolute, as the host sees it) under the host root.
pub fn host_path(host: &Path, path: &Path) -> PathBuf {
    host.join(path.strip_prefix("/").unwrap_or(path))
}

#[derive(Debug, Clone)]
pub struct Options {
    pub host: PathBuf,
    pub payload: PathBuf,
    pub engine: String,
    pub containerd_version: Option<String>,
    pub restart: bool,
    pub stay: bool,
    pub check: bool,
}

/// Parses the flags after `install` or `uninstall`.
pub fn parse(args: &[String]) -> Result<Options, InstallError> {
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|p| p.parent().map(Path::to_path_buf));
    let mut o = Options {
        host: "/host".into(),
        payload: exe_dir.unwrap_or_else(|| "/gantry".into()),
        engine: "auto".into(),
        containerd_version: None,
        restart: true,
        stay: false,
        check: false,
    };
    let mut it = args.iter();
    while let Some(arg) = it.next() {
        let (name, inline) = match arg.split_once('=') {
            Some((n, v)) => (n, Some(v.to_string())),
            None => (arg.as_str(), None),
        };
        let mut value = || {
            inline
                .clone()
                .or_else(|| it.next().cloned())
                .ok_or_else(|| InstallError::Usage(format!("{name} needs a value")))
        };
        match name {
            "--host" => o.host = value()?.into(),
            "--payload" => o.payload = value()?.into(),
            "--engine" => o.engine = value()?,
            "--containerd-version" => o.containerd_version = Some(value()?),
            "--no-restart" => o.restart = false,
            "--stay" => o.stay = true,
            "--check" => o.check = true,
            other => return Err(InstallError::Usage(format!("unknown flag {other:?}"))),
        }
    }
    if !matches!(o.engine.as_str(), "auto" | "crio" | "containerd") {
        return Err(InstallError::Usage(format!("--engine {:?}", o.engine)));
    }
    if !o.host.is_dir() {
        return Err(InstallError::Usage(format!(
            "--host {}: not a directory (the host's root)",
            o.host.display()
        )));
    }
    Ok(o)
}

/// What a run did, printed as JSON on stdout.
#[derive(Debug, Default, serde::Serialize)]
pub struct Report {
    pub version: String,
    pub engines: Vec<String>,
    /// Host paths written or removed.
    pub changed: Vec<String>,
    pub restarted: Vec<String>,
    /// Units whose configuration changed but that were not restarted (`--no-restart`).
    pub restart_needed: Vec<String>,
    /// Versions kept because a bundle names them.
    pub kept: Vec<String>,
}

/// One progress line on stderr in one write: unbuffered `eprintln!` writes its pieces
/// separately, and the container log merges stdout and stderr as written, so the JSON report
/// on stdout could land between "gantry-install: " and the rest of the line.
pub(crate) fn step(what: &str) {
    use std::io::Write;
    let line = format!("gantry-install: {what}\n");
    let _ = std::io::stderr().lock().write_all(line.as_bytes());
}

/// Holds the host-wide installer lock until dropped.
fn lock(host: &Path, st: &mut State) -> Result<nix::fcntl::Flock<std::fs::File>, InstallError> {
    let path = host_path(host, Path::new(LOCK_FILE));
    st.create_dirs(host, Path::new(LOCK_FILE))?;
    let f = std::fs::OpenOptions::new()
        .create(true)
        .truncate(false)
        .write(true)
        .open(&path)
        .map_err(|e| InstallError::io("open", &path, e))?;
    step(&format!("waiting for {LOCK_FILE}"));
    nix::fcntl::Flock::lock(f, nix::fcntl::FlockArg::LockExclusive)
        .map_err(|(_, e)| InstallError::io("lock", &path, e.into()))
}

/// `install`: returns the report, or with `--check` whether this version is installed.
pub fn install(o: &Options) -> Result<Report, InstallError> {
    let me =
        std::fs::read_link("/proc/self/exe").map_err(|e| InstallError::io("read", Path::new("/proc/self/exe"), e))?;
    let (version, sha) = version_of(&me)?;
    if o.check {
        return check(o, &version).map(|()| Report {
            version,
            ..Default::default()
        });
    }
    let mut st = State::load(&o.host)?;
    let _lock = lock(&o.host, &mut st)?;
    // Read again under the lock: another installer may have written it meanwhile.
    let mut st = State::load(&o.host)?.merge_dirs(st);
    let mut report = Report {
        version: version.clone(),
        ..Default::default()
    };
    let found = engines::detect(&o.host, &o.engine, o.containerd_version.as_deref())?;
    step(&format!("version {version}; engines: {found:?}"));
    st.create_dirs(&o.host, &binary::versioned(&version))?;
    st.create_dirs(&o.host, Path::new(STABLE_PATH))?;
    if binary::place(&o.host, &me, &version, &sha)? {
        report.changed.push(binary::versioned(&version).display().to_string());
    }
    if binary::point_stable(&o.host, &version)? {
        report.changed.push(STABLE_PATH.into());
    }
    install_config(o, &mut st, &mut report)?;
    for engine in &found {
        report.engines.push(engine.unit().into());
        let changed = register(o, engine, &mut st, &mut report)?;
        restart_if(o, engine, changed, &mut st, &mut report)?;
    }
    st.save(&o.host)?;
    write_ready(&o.host, &version, &mut st)?;
    step("ready");
    Ok(report)
}

/// The shipped config, unless the one on the host was edited since the installer wrote it
/// (or was never written by it): that one is kept, and must load with this version.
fn install_config(o: &Options, st: &mut State, report: &mut Report) -> Result<(), InstallError> {
    let src = o.payload.join("runtime-conf/gantry.toml");
    let shipped = std::fs::read(&src).map_err(|e| InstallError::io("read", &src, e))?;
    let dest = host_path(&o.host, Path::new(CONFIG));
    let current = std::fs::read(&dest).ok();
    let ours = current
        .as_ref()
        .is_some_and(|c| st.config_sha.as_deref() == Some(&state::sha(c)));
    match current {
        Some(c) if c == shipped => {}
        Some(_) if !ours => {
            crate::config::Config::load(&dest).map_err(|e| InstallError::Config(dest.clone(), e.to_string()))?;
            step(&format!(
                "{CONFIG}: edited on this host; kept (it loads with this version)"
            ));
        }
        _ => {
            st.create_dirs(&o.host, Path::new(CONFIG))?;
            crate::files::write_atomic(&dest, &shipped).map_err(|e| InstallError::io("write", &dest, e))?;
            st.config_sha = Some(state::sha(&shipped));
            report.changed.push(CONFIG.into());
        }
    }
    Ok(())
}

/// Writes `engine`'s drop-in (and containerd's import); returns whether the engine must
/// restart to read them.
fn register(o: &Options, engine: &Engine, st: &mut State, report: &mut Report) -> Result<bool, InstallError> {
    let (path, body) = engines::dropin(engine, &o.host, &o.payload)?;
    let dest = host_path(&o.host, &path);
    let mut changed = false;
    if std::fs::read(&dest).ok().as_deref() != Some(&body[..]) {
        st.create_dirs(&o.host, &path)?;
        crate::files::write_atomic(&dest, &body).map_err(|e| InstallError::io("write", &dest, e))?;
        report.changed.push(path.display().to_string());
        changed = true;
    }
    if let Engine::Containerd { version } = engine {
        let main_path = host_path(&o.host, Path::new(engines::CONTAINERD_MAIN));
        let main = std::fs::read_to_string(&main_path).ok();
        if !engines::dropin_imported(main.as_deref(), *version) {
            let (edited, how) = engines::add_import(main.as_deref(), *version)?;
            st.create_dirs(&o.host, Path::new(engines::CONTAINERD_MAIN))?;
            crate::files::write_atomic(&main_path, edited.as_bytes())
                .map_err(|e| InstallError::io("write", &main_path, e))?;
            step(&format!(
                "{}: import of {} added",
                engines::CONTAINERD_MAIN,
                engines::CONTAINERD_DROPIN
            ));
            st.import = Some(how);
            report.changed.push(engines::CONTAINERD_MAIN.into());
            changed = true;
        }
    }
    Ok(changed)
}

/// Restarts `engine` when its files `changed` or an earlier run's restart did not succeed;
/// the state says so before the attempt, so a failed restart is retried by the next run.
fn restart_if(
    o: &Options,
    engine: &Engine,
    changed: bool,
    st: &mut State,
    report: &mut Report,
) -> Result<(), InstallError> {
    let unit = engine.unit().to_string();
    if !changed && !st.restart_pending.contains(&unit) {
        return Ok(());
    }
    if !st.restart_pending.contains(&unit) {
        st.restart_pending.push(unit.clone());
    }
    st.save(&o.host)?;
    restart_engine(o, engine, report)?;
    st.restart_pending.retain(|u| *u != unit);
    Ok(())
}

/// Restarts the unit, or with `--no-restart` leaves that to the caller (a node image build,
/// a bootstrap that starts the engine afterwards) and reports it.
fn restart_engine(o: &Options, engine: &Engine, report: &mut Report) -> Result<(), InstallError> {
    let unit = engine.unit();
    if !o.restart {
        step(&format!(
            "{unit}: its configuration changed; not restarted (--no-restart)"
        ));
        report.restart_needed.push(unit.into());
        return Ok(());
    }
    let bus = host_path(&o.host, Path::new("/run/dbus/system_bus_socket"));
    step(&format!("{unit}: restarting over D-Bus ({})", bus.display()));
    restart::restart_unit(&bus, unit, RESTART_TIMEOUT).map_err(|e| InstallError::Restart(unit, e))?;
    if *engine == Engine::Crio {
        let sock = host_path(&o.host, Path::new("/run/crio/crio.sock"));
        restart::wait_crio_handler(&sock, RESTART_TIMEOUT).map_err(|e| InstallError::Restart(unit, e))?;
    }
    step(&format!("{unit}: active again"));
    report.restarted.push(unit.into());
    Ok(())
}

fn write_ready(host: &Path, version: &str, st: &mut State) -> Result<(), InstallError> {
    let ready = host_path(host, Path::new(READY_FILE));
    st.create_dirs(host, Path::new(READY_FILE))?;
    crate::files::write_atomic(&ready, format!("{version}\n").as_bytes())
        .map_err(|e| InstallError::io("write", &ready, e))?;
    st.save(host)
}

/// `--check`: this version is what the stable path runs, and the ready file says so.
fn check(o: &Options, version: &str) -> Result<(), InstallError> {
    let ready = std::fs::read_to_string(host_path(&o.host, Path::new(READY_FILE))).unwrap_or_default();
    if ready.trim() != version {
        return Err(InstallError::NotReady(format!(
            "{READY_FILE} names {:?}, not {version}",
            ready.trim()
        )));
    }
    match binary::stable(&o.host) {
        binary::Stable::Link(t) if t == binary::versioned(version) => Ok(()),
        _ => Err(InstallError::NotReady(format!(
            "{STABLE_PATH} does not point at {version}"
        ))),
    }
}

/// `uninstall`: the drop-ins and the import out, the engines restarted, the stable link and
/// every version no bundle names removed, then what the installer created.
pub fn uninstall(o: &Options) -> Result<Report, InstallError> {
    let mut st = State::load(&o.host)?;
    let _lock = lock(&o.host, &mut st)?;
    let mut st = State::load(&o.host)?.merge_dirs(st);
    let mut report = Report::default();
    let _ = std::fs::remove_file(host_path(&o.host, Path::new(READY_FILE)));
    for engine in registered(o, &st) {
        report.engines.push(engine.unit().into());
        let changed = unregister(o, &engine, &mut st, &mut report)?;
        restart_if(o, &engine, changed, &mut st, &mut report)?;
    }
    if let binary::Stable::Link(_) = binary::stable(&o.host) {
        let link = host_path(&o.host, Path::new(STABLE_PATH));
        std::fs::remove_file(&link).map_err(|e| InstallError::io("remove", &link, e))?;
        report.changed.push(STABLE_PATH.into());
    }
    remove_versions(o, &mut report)?;
    let config = host_path(&o.host, Path::new(CONFIG));
    if let Ok(c) = std::fs::read(&config) {
        if st.config_sha.as_deref() == Some(&state::sha(&c)) {
            std::fs::remove_file(&config).map_err(|e| InstallError::io("remove", &config, e))?;
            report.changed.push(CONFIG.into());
        } else {
            step(&format!("{CONFIG}: edited on this host; kept"));
        }
    }
    if report.kept.is_empty() {
        // Nothing of gantry is left for a later installer to serialise with.
        let _ = std::fs::remove_file(host_path(&o.host, Path::new(LOCK_FILE)));
        st.remove(&o.host)?;
    } else {
        st.save(&o.host)?;
    }
    step("uninstalled");
    Ok(report)
}

/// The engines gantry is registered with, from what is installed (a drop-in, the recorded
/// import), not from detection: removal must not depend on telling containerd's version.
fn registered(o: &Options, st: &State) -> Vec<Engine> {
    let has = |p: &str| host_path(&o.host, Path::new(p)).exists();
    let mut out = Vec::new();
    if o.engine != "containerd" && has(engines::CRIO_DROPIN) {
        out.push(Engine::Crio);
    }
    if o.engine != "crio" && (has(engines::CONTAINERD_DROPIN) || st.import.is_some()) {
        out.push(Engine::Containerd { version: (0, 0) });
    }
    out
}

fn unregister(o: &Options, engine: &Engine, st: &mut State, report: &mut Report) -> Result<bool, InstallError> {
    let mut changed = false;
    let dropin = host_path(&o.host, Path::new(engine.dropin()));
    if dropin.exists() {
        std::fs::remove_file(&dropin).map_err(|e| InstallError::io("remove", &dropin, e))?;
        report.changed.push(engine.dropin().into());
        changed = true;
    }
    if let (Engine::Containerd { .. }, Some(how)) = (engine, st.import.take()) {
        let main = host_path(&o.host, Path::new(engines::CONTAINERD_MAIN));
        let text = std::fs::read_to_string(&main).unwrap_or_default();
        match engines::remove_import(&text, &how) {
            None => std::fs::remove_file(&main).map_err(|e| InstallError::io("remove", &main, e))?,
            Some(t) => {
                crate::files::write_atomic(&main, t.as_bytes()).map_err(|e| InstallError::io("write", &main, e))?
            }
        }
        report.changed.push(engines::CONTAINERD_MAIN.into());
        changed = true;
    }
    Ok(changed)
}

/// Removes each installed version that no bundle names; with a bundle whose record does not
/// say, none.
fn remove_versions(o: &Options, report: &mut Report) -> Result<(), InstallError> {
    let used = match binary::in_use(&o.host) {
        Ok(used) => used,
        Err(bundle) => {
            step(&format!(
                "{} does not name its binary: every version kept",
                bundle.display()
            ));
            report.kept = binary::versions(&o.host);
            return Ok(());
        }
    };
    for version in binary::versions(&o.host) {
        let dir = Path::new(VERSIONS_DIR).join(&version);
        // A daemon records the path it ran from: the host's, or under `--host` when the
        // installer runs on the host itself against another root (the tests' fake hosts).
        let in_host = host_path(&o.host, &dir);
        let named = |shim: &PathBuf| shim.starts_with(&dir) || shim.starts_with(&in_host);
        if let Some((_, bundle)) = used.iter().find(|(shim, _)| named(shim)) {
            step(&format!("{version}: kept, {} still runs it", bundle.display()));
            report.kept.push(version);
            continue;
        }
        let path = host_path(&o.host, &dir);
        std::fs::remove_dir_all(&path).map_err(|e| InstallError::io("remove", &path, e))?;
        report.changed.push(dir.display().to_string());
    }
    Ok(())
}

/// The `install`/`uninstall` subcommand: prints the report, returns the exit code (0 done or
/// ready, 1 failed or not ready).
pub fn main(action: &str, args: &[String]) -> i32 {
    let result = parse(args).and_then(|o| {
        let report = if action == "uninstall" {
            uninstall(&o)?
        } else {
            install(&o)?
        };
        if o.stay {
            wait_for_stop();
        }
        Ok(report)
    });
    match result {
        Ok(report) => {
            // One write for the same reason as `step`.
            use std::io::Write;
            let line = format!("{}\n", serde_json::to_string(&report).unwrap_or_default());
            let _ = std::io::stdout().lock().write_all(line.as_bytes());
            0
        }
        Err(e) => {
            step(&format!("error: {e}"));
            1
        }
    }
}

/// `--stay`: the DaemonSet's container idles until the kubelet stops it, and then removes
/// nothing: a restart or rolling update of the pod is not an uninstall.
fn wait_for_stop() {
    use nix::sys::signal::{SigSet, Signal};
    let mut set = SigSet::empty();
    set.add(Signal::SIGTERM);
    set.add(Signal::SIGINT);
    if set.thread_block().is_ok() {
        step("installed; waiting for SIGTERM (stopping removes nothing)");
        let _ = set.wait();
    }
}
