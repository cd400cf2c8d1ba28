//! The container module's errors; the service maps them to ttrpc codes (`to_ttrpc`).

use thiserror::Error;

use crate::cgroups::CgroupError;
use crate::config::ConfigError;
use crate::io::IoError;
use crate::mount::MountError;
use crate::process::StateError;
use crate::runtime::RuntimeError;
use crate::spec::SpecError;

#[derive(Debug, Error)]
pub enum TaskError {
    #[error("container {0:?} not found")]
    NotFound(String),
    /// Something other than a container is missing or gone (a process that finished, a
    /// cgroup): NOT_FOUND with the message as it stands.
    #[error("{0}")]
    Gone(String),
    #[error("exec {exec:?} not found in container {id:?}")]
    ExecNotFound { id: String, exec: String },
    #[error("{0} already exists")]
    AlreadyExists(String),
    #[error("{0}")]
    InvalidArgument(String),
    /// The security policy refused the container (INVALID_ARGUMENT); `reason` is short and
    /// low-cardinality, for the policy event.
    #[error("{message}")]
    Refused { reason: &'static str, message: String },
    #[error("{0}")]
    Precondition(String),
    #[error("{0}")]
    Unimplemented(String),
    #[error(transparent)]
    State(#[from] StateError),
    #[error(transparent)]
    Runtime(#[from] RuntimeError),
    #[error(transparent)]
    Io(#[from] IoError),
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error(transparent)]
    Spec(#[from] SpecError),
    #[error(transparent)]
    Mount(#[from] MountError),
    #[error(transparent)]
    Cgroup(#[from] CgroupError),
    #[error("{0}")]
    Internal(String),
}

pub(super) fn invalid(e: impl std::fmt::Display) -> TaskError {
    TaskError::InvalidArgument(e.to_string())
}
