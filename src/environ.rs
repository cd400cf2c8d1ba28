//! The environment gantry hands to what it starts.
//!
//! A service manager tells its service how to talk back to it through the environment:
//! systemd gives a `Type=notify` containerd or CRI-O `NOTIFY_SOCKET`, socket activation
//! `LISTEN_*`, the watchdog `WATCHDOG_*`, and every service `INVOCATION_ID` and
//! `JOURNAL_STREAM`. Those describe the engine's relationship with systemd, not a container's.
//! Inherited by an OCI runtime they change its behaviour: runc and crun treat `NOTIFY_SOCKET`
//! as a request to relay the container's own `READY=1`, bind-mount a socket into it at
//! `/run/notify` and make `start` wait for a message no ordinary container ever sends (the
//! task stays CREATED until the runtime call is killed). go-runc strips `NOTIFY_SOCKET` for
//! containerd's runc shim for the same reason. gantry removes all of them from its own
//! environment before anything else runs, so no runtime, logger, hook or container sees them.

use std::process::Command;

/// Exact names systemd sets for a service that concern only the service itself.
const NAMES: &[&str] = &[
    "NOTIFY_SOCKET",
    "INVOCATION_ID",
    "JOURNAL_STREAM",
    "SYSTEMD_EXEC_PID",
    "MANAGERPID",
];

/// Families of them: socket activation (`LISTEN_FDS`, `LISTEN_PID`, `LISTEN_FDNAMES`) and the
/// watchdog (`WATCHDOG_USEC`, `WATCHDOG_PID`).
const PREFIXES: &[&str] = &["LISTEN_", "WATCHDOG_"];

/// Whether `name` is a service manager's variable that must not reach gantry's children.
pub fn is_service_manager_var(name: &str) -> bool {
    NAMES.contains(&name) || PREFIXES.iter().any(|p| name.starts_with(p))
}

/// Removes the service manager's variables from this process's environment.
///
/// Called first thing in `main`, while the process has one thread: changing the environment
/// races with any other thread reading it.
pub fn scrub() {
    for k in present(std::env::vars_os().map(|(k, _)| k)) {
        std::env::remove_var(k);
    }
}

/// Keeps the service manager's variables off one command, whatever this process's environment
/// holds (a library user that never called [`scrub`], a test).
pub fn sanitise(cmd: &mut Command) {
    for k in present(std::env::vars_os().map(|(k, _)| k)) {
        cmd.env_remove(k);
    }
}

/// The service manager's variables among `names`.
fn present(names: impl Iterator<Item = std::ffi::OsString>) -> Vec<String> {
    names
        .filter_map(|k| k.into_string().ok())
        .filter(|k| is_service_manager_var(k))
        .collect()
}

/// The binary the daemon re-executes for its helpers (`mount-helper`, `sandbox-init`):
/// `/proc/self/exe`, which names the running daemon's own file even after an upgrade replaced
/// it on disk, so helper and daemon are always one version. `GANTRY_SELF_EXE` replaces it for
/// tools that run the daemon under an interpreter, where `/proc/self/exe` names the
/// interpreter (valgrind in `scripts/symbol-order.sh`).
pub fn self_exe() -> std::path::PathBuf {
    std::env::var_os("GANTRY_SELF_EXE")
        .filter(|p| !p.is_empty())
        .map(std::path::PathBuf::from)
        .unwrap_or_else(|| "/proc/self/exe".into())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn systemd_service_variables_are_recognised() {
        for v in [
            "NOTIFY_SOCKET",
            "LISTEN_FDS",
            "LISTEN_PID",
            "LISTEN_FDNAMES",
            "WATCHDOG_USEC",
            "WATCHDOG_PID",
            "INVOCATION_ID",
            "JOURNAL_STREAM",
        ] {
            assert!(is_service_manager_var(v), "{v}");
        }
        for v in [
            "PATH",
            "HOME",
            "GANTRY_CONFIG",
            "XDG_RUNTIME_DIR",
            "DBUS_SYSTEM_BUS_ADDRESS",
            "NOTIFY",
        ] {
            assert!(!is_service_manager_var(v), "{v}");
        }
    }

    #[test]
    fn only_the_service_managers_names_are_picked() {
        let names = ["PATH", "NOTIFY_SOCKET", "LISTEN_PID", "HOME", "JOURNAL_STREAM"].map(std::ffi::OsString::from);
        assert_eq!(
            present(names.into_iter()),
            ["NOTIFY_SOCKET", "LISTEN_PID", "JOURNAL_STREAM"]
        );
    }
}
