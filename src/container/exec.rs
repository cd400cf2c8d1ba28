//! Execs: registered by Exec, run by Start (counted for the exit order from its first line),
//! removed by Delete.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::{Instant, SystemTime};

use containerd_shim_protos::protobuf::well_known_types::any::Any;

use super::console::{read_pid, run_with_console};
use super::{invalid, Container, TaskError};
use crate::exits::ExecSlot;
use crate::files;
use crate::io::{self, StdioPaths};
use crate::process::{ExitInfo, Op, Process, Status};
use crate::runtime::Spawn;
use crate::spec;

/// An exec that Start ran: its process, its exit to come, and its place in the exec count
/// (dropped once its TaskExit is published).
pub struct StartedExec {
    pub process: Arc<Process>,
    pub exit: tokio::sync::oneshot::Receiver<crate::reaper::Exit>,
    pub slot: ExecSlot,
}

impl Container {
    /// Registers an exec (Exec RPC); it runs on Start.
    pub fn add_exec(&self, exec_id: &str, stdio: StdioPaths, spec: &Any) -> Result<(), TaskError> {
        spec::validate_id(exec_id).map_err(invalid)?;
        if self.exits.init_reaped() || self.init.status() == Status::Stopped {
            return Err(TaskError::Precondition(format!(
                "container {:?} has stopped: cannot exec",
                self.id
            )));
        }
        // Parsed only to refuse a malformed spec here, with INVALID_ARGUMENT, rather than at Start;
        // a value newer than oci-spec's model is the runtime's to judge.
        match serde_json::from_slice::<oci_spec::runtime::Process>(&spec.value) {
            Err(e) if !spec::is_newer_than_model(&e) => {
                return Err(invalid(format!("exec {exec_id:?} process spec: {e}")));
            }
            _ => {}
        }
        let mut execs = self.execs();
        if execs.contains_key(exec_id) {
            return Err(TaskError::AlreadyExists(format!(
                "exec {exec_id:?} in container {:?}",
                self.id
            )));
        }
        let json = exec_process_json(exec_id, &spec.value, stdio.terminal)?;
        let json = spec::edit_exec(&self.bundle, json);
        let p = Arc::new(Process::new(exec_id, stdio, Arc::default()));
        files::write_atomic(&self.exec_spec_path(exec_id), &json)
            .map_err(|e| TaskError::Internal(format!("write exec spec: {e}")))?;
        execs.insert(exec_id.to_string(), p);
        Ok(())
    }

    pub(super) fn exec_spec_path(&self, exec_id: &str) -> PathBuf {
        self.bundle.join(format!("exec-{exec_id}.json"))
    }

    fn exec_pid_path(&self, exec_id: &str) -> PathBuf {
        self.bundle.join(format!("exec-{exec_id}.pid"))
    }

    /// Runs a registered exec. The exit subscription is taken before returning so a fast exit
    /// is never lost; the exec is counted (init's exit waits for it) from the first line.
    pub async fn start_exec(&self, exec_id: &str) -> Result<StartedExec, TaskError> {
        let slot = self
            .exits
            .begin_exec()
            .ok_or_else(|| TaskError::Precondition(format!("container {:?} init process is not running", self.id)))?;
        let p = self.process(exec_id)?;
        let claim = p.begin_start(exec_id)?;
        let owner = io::Owner {
            id: &self.id,
            namespace: &self.namespace,
            reaper: &self.reaper,
        };
        let prepared = io::prepare(&p.stdio, &self.console_dir, &owner).await?;
        let pid_file = self.exec_pid_path(exec_id);
        files::remove_entry(&pid_file);
        let spec_file = self.exec_spec_path(exec_id);
        let started = Instant::now();
        let spawn = Spawn {
            pid_file: &pid_file,
            console_socket: prepared.console.as_ref().map(|c| c.path.as_path()),
            stdio: prepared.stdio,
        };
        let result = run_with_console(
            self.runtime.exec(&self.id, &spec_file, spawn),
            prepared.console.as_ref(),
            &prepared.io,
            &p.stdio,
        )
        .await;
        let _ = std::fs::remove_file(&spec_file);
        let pid = result.and_then(|_| read_pid(&pid_file));
        let _ = std::fs::remove_file(&pid_file);
        let pid = match pid {
            Ok(pid) => pid,
            Err(e) => {
                // Handles opened for a failed exec close here, so the client's FIFOs see EOF.
                prepared.io.shutdown().await;
                drop(prepared.io);
                p.set_exited(ExitInfo {
                    pid: 0,
                    status: 255,
                    at: SystemTime::now(),
                });
                return Err(e);
            }
        };
        p.set_pid(pid);
        p.set_io(prepared.io);
        let exit = self.reaper.subscribe_since(pid, Some(started));
        claim.started();
        Ok(StartedExec { process: p, exit, slot })
    }

    /// Deletes an exec; returns its exit.
    pub async fn delete_exec(&self, exec_id: &str) -> Result<ExitInfo, TaskError> {
        let p = self.process(exec_id)?;
        p.check(exec_id, Op::Delete)?;
        self.execs().remove(exec_id);
        let _ = std::fs::remove_file(self.exec_spec_path(exec_id));
        p.io().shutdown().await;
        Ok(p.exit().unwrap_or(ExitInfo {
            pid: p.pid(),
            status: 0,
            at: SystemTime::now(),
        }))
    }
}

/// The exec's process JSON as the runtime gets it: the request's `terminal` wins over the
/// spec's, as in the runc shim (CRI-O copies the container's process, `terminal: false`, and asks
/// for a tty in the request; runc refuses a console socket for a non-terminal process). Every
/// other field, modelled or not, is kept as sent.
fn exec_process_json(exec_id: &str, raw: &[u8], terminal: bool) -> Result<Vec<u8>, TaskError> {
    let mut value: serde_json::Value =
        serde_json::from_slice(raw).map_err(|e| invalid(format!("exec {exec_id:?} process spec: {e}")))?;
    let Some(process) = value.as_object_mut() else {
        return Err(invalid(format!("exec {exec_id:?} process spec is not a JSON object")));
    };
    process.insert("terminal".into(), terminal.into());
    serde_json::to_vec(&value).map_err(|e| TaskError::Internal(format!("exec {exec_id:?} process spec: {e}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exec_terminal_comes_from_the_request_and_unknown_fields_stay() {
        let raw = br#"{"terminal":false,"args":["sh"],"cwd":"/","vendorThing":{"x":1}}"#;
        let out: serde_json::Value = serde_json::from_slice(&exec_process_json("e", raw, true).unwrap()).unwrap();
        assert_eq!(out["terminal"], true);
        assert_eq!(out["vendorThing"]["x"], 1);
        assert_eq!(out["args"][0], "sh");
        let raw = br#"{"terminal":true,"args":["sh"],"cwd":"/"}"#;
        let out: serde_json::Value = serde_json::from_slice(&exec_process_json("e", raw, false).unwrap()).unwrap();
        assert_eq!(out["terminal"], false);
        assert!(matches!(
            exec_process_json("e", b"[1]", true),
            Err(TaskError::InvalidArgument(_))
        ));
    }
}
