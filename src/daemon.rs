//! The long-lived daemon: serves the Task API for every container of one pod on the listener
//! `start` bound, reaps every child, and exits after a Shutdown that finds no container left,
//! or on SIGTERM: then, as the runc shim does, it removes its socket, flushes its events and
//! exits while its containers keep running (`delete` cleans up after them).

use std::io::Write;
use std::os::fd::FromRawFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use slog::{info, o, warn, Logger};
use thiserror::Error;

use crate::args::Flags;
use crate::bootstrap::{bundle_dir, LISTENER_FD, READY_FD};
use crate::config::Config;
use crate::daemon_cgroup;
use crate::events::Publisher;
use crate::logging;
use crate::peer::SameUserListener;
use crate::reaper::{self, Reaper};
use crate::service::{services, Service, TaskService};
use crate::telemetry::{EventsConfig, Telemetry};

/// How long a daemon emptied by Shutdown waits for the engine to hang up or fall quiet (so
/// that every request sent with the Shutdown is answered) before it exits anyway.
const REPLY_GRACE: std::time::Duration = std::time::Duration::from_secs(2);
/// No byte from any engine for this long after the last Shutdown: nothing more is coming.
const QUIET_AFTER_SHUTDOWN: std::time::Duration = std::time::Duration::from_millis(100);

/// How long an idle blocking-pool thread waits for more work before it ends.
pub const BLOCKING_KEEP_ALIVE: std::time::Duration = std::time::Duration::from_millis(500);
/// Blocking-pool threads at most: more Creates than this at once queue for one.
const MAX_BLOCKING_THREADS: usize = 4;
/// Readiness events taken from epoll per reactor tick; more wait for the next tick.
const EVENTS_PER_TICK: usize = 64;

#[derive(Debug, Error)]
pub enum DaemonError {
    #[error("runtime: {0}")]
    Tokio(std::io::Error),
    #[error("listener on fd {LISTENER_FD}: {0}")]
    Listener(ttrpc::Error),
    #[error("ttrpc server: {0}")]
    Server(ttrpc::Error),
    #[error("signal handling: {0}")]
    Signals(std::io::Error),
}

/// Runs the daemon until it is shut down; blocks the calling thread. `config` is the shim
/// config as `start` resolved it (the log level comes from it).
pub fn serve(flags: &Flags, config: Config) -> Result<(), DaemonError> {
    // A vanished log or stdio reader must cost a write error, never the shim's life.
    // SAFETY: installing SIG_IGN has no preconditions.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
    crate::sys::one_malloc_arena();
    crate::cgroups::warm::set_enabled(config.runtime.cgroup_warmup);
    let bundle = bundle_dir(flags);
    let level = logging::level(&config.shim.log_level, flags.debug);
    let log = match logging::open_log_fifo(&bundle) {
        Some(sink) => logging::logger(sink, level, &flags.namespace),
        None => logging::discard(),
    };
    let log = log.new(o!("shim_pid" => std::process::id()));
    logging::bridge_log_facade(&log);
    // Before it serves: from its first reply on, the engine's restart must not reach it.
    let home = daemon_cgroup::leave_engine(
        &config.shim.daemon_cgroup,
        &daemon_cgroup::name_for(Path::new(&flags.socket), &flags.id),
        &format!("gantry shim for pod {} (namespace {})", flags.id, flags.namespace),
        &log,
    );
    // After the move: the warm-up keeps rewriting the cgroup it finds first, and would move
    // the daemon back into the engine's.
    crate::sandbox::warm_for_systemd_scopes(&config);
    if let Err(e) = reaper::set_subreaper() {
        warn!(log, "cannot become child subreaper"; "error" => %e);
    }

    // One reactor thread: memory per shim is a headline figure, and nothing here needs
    // parallelism. Blocking work (spec edits, cgroup reads) gets a named pool thread that ends
    // soon after: a pod's Creates come within moments of each other and then the daemon idles.
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name("gantry-blocking")
        .thread_keep_alive(BLOCKING_KEEP_ALIVE)
        .max_blocking_threads(MAX_BLOCKING_THREADS)
        // The epoll event buffer lives as long as the daemon: tokio's default of 1,024 events
        // a tick is 12 KiB of heap, for a daemon that watches a few dozen descriptors.
        .max_io_events_per_tick(EVENTS_PER_TICK)
        .build()
        .map_err(DaemonError::Tokio)?;
    let socket = PathBuf::from(&flags.socket);
    let result = rt.block_on(run(flags, socket.clone(), log.clone(), &config.events));
    if !flags.socket.is_empty() {
        let _ = std::fs::remove_file(&socket);
    }
    info!(log, "daemon exiting"; "id" => &flags.id);
    home.leave();
    result
}

async fn run(flags: &Flags, socket: PathBuf, log: Logger, events: &EventsConfig) -> Result<(), DaemonError> {
    let reaper = Reaper::default();
    reaper.start().map_err(DaemonError::Signals)?;
    let address = std::env::var("TTRPC_ADDRESS").unwrap_or_default();
    let publisher = Publisher::new(&address, &flags.namespace, log.clone());
    let flusher = publisher.clone();
    let console_dir = socket
        .parent()
        .map(|p| p.to_path_buf())
        .unwrap_or_else(|| PathBuf::from("/run/gantry/s"));
    let telemetry = Telemetry::start(events, &flags.namespace, log.clone());
    let task = Arc::new(
        TaskService::new(publisher, reaper, &flags.namespace, console_dir, log.clone())
            .with_telemetry(telemetry.clone()),
    );
    let shutdown = task.shutdown.clone();
    let mut terminate =
        tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()).map_err(DaemonError::Signals)?;

    // SAFETY: `start` handed us this bound socket as fd 3; nothing else owns it.
    let listener = unsafe { std::os::fd::OwnedFd::from_raw_fd(LISTENER_FD) };
    // Not for the runtimes and containers this daemon spawns.
    let _ = nix::fcntl::fcntl(
        LISTENER_FD,
        nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
    );
    nix::sys::socket::listen(&listener, nix::sys::socket::Backlog::MAXCONN)
        .map_err(|e| DaemonError::Listener(ttrpc::Error::Others(e.to_string())))?;
    let listener = std::os::unix::net::UnixListener::from(listener);
    listener
        .set_nonblocking(true)
        .map_err(|e| DaemonError::Listener(ttrpc::Error::Others(e.to_string())))?;
    let listener = tokio::net::UnixListener::from_std(listener)
        .map_err(|e| DaemonError::Listener(ttrpc::Error::Others(e.to_string())))?;
    // Only peers of the daemon's own user get a ttrpc connection, whatever the socket's mode.
    let accepted = SameUserListener::new(listener, log.clone());
    task.set_connections(accepted.connections());
    let connections = accepted.connections();
    let mut server = ttrpc::r#async::Server::new()
        .add_listener(ttrpc::r#async::transport::Listener::new(accepted))
        .register_service(services(Service(task.clone())));
    server.start().await.map_err(DaemonError::Server)?;
    signal_ready();
    info!(log, "serving"; "id" => &flags.id, "socket" => socket.display().to_string(), "events" => !address.is_empty());

    let drained = async {
        loop {
            shutdown.notified().await;
            if task.is_empty() {
                break;
            }
        }
    };
    let by_shutdown = tokio::select! {
        () = drained => true,
        _ = terminate.recv() => {
            info!(log, "SIGTERM: shutting down; containers keep running"; "containers" => !task.is_empty());
            false
        }
    };
    // No new `start` may find this daemon from here on: it hands out a fresh one instead.
    let _ = std::fs::remove_file(&socket);
    if by_shutdown {
        // Requests sent together with the Shutdown may still be on their way, and replies in a
        // connection's write queue. containerd hangs up once it has its answers; CRI-O never
        // does after its last Shutdown, so a connection quiet for QUIET_AFTER_SHUTDOWN counts
        // as done too. ttrpc's server shutdown below then lets the handlers finish and waits
        // for its writers to write what they queued.
        let settled = async {
            tokio::select! {
                () = connections.none() => {}
                () = connections.quiet_for(QUIET_AFTER_SHUTDOWN) => {}
            }
        };
        if tokio::time::timeout(REPLY_GRACE, settled).await.is_err() {
            info!(log, "engine still sending after Shutdown; exiting anyway"; "waited_ms" => REPLY_GRACE.as_millis() as u64);
        }
    }
    flusher.flush(std::time::Duration::from_secs(3)).await;
    telemetry.flush(std::time::Duration::from_secs(1)).await;
    let _ = server.shutdown().await;
    Ok(())
}

/// Tells `start` the server is accepting (one byte on the ready pipe, then close it).
fn signal_ready() {
    // SAFETY: fd 4 is the ready pipe `start` gave us; we take ownership and close it here.
    let mut f = unsafe { std::fs::File::from_raw_fd(READY_FD) };
    let _ = f.write_all(b"1");
}
