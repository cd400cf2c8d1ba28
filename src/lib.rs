//! gantry: a containerd shim v2 runtime handler. One daemon per pod serves the Task API over
//! ttrpc for CRI-O and containerd, drives runc or crun, and edits the OCI spec on the way
//! (GPU devices) before the runtime sees it.

pub mod args;
pub mod bootstrap;
pub mod cgroups;
pub mod config;
pub mod container;
pub mod daemon;
pub mod daemon_cgroup;
pub mod dbus;
pub mod devices;
pub mod environ;
pub mod events;
pub mod exits;
pub mod files;
pub mod inflight;
pub mod install;
pub mod io;
pub mod logging;
pub mod mount;
pub mod notifier;
pub mod options;
pub mod peer;
pub mod proc;
pub mod process;
pub mod reaper;
pub mod runtime;
pub mod sandbox;
pub mod security;
pub mod service;
pub mod settle;
pub mod spec;
pub mod sys;
pub mod telemetry;
