//! Lifecycle telemetry that works under CRI-O as well as containerd. CRI-O reads no shim
//! events, so every daemon also writes each lifecycle transition as a JSON line into a node-wide
//! event log ([`log`]); the node exporter ([`exporter`]) derives Prometheus counters and
//! histograms from that log ([`aggregate`], [`tail`]) and asks `/proc` for the live daemons'
//! gauges. Daemons hold no metrics registry: their only cost on a request is a bounded,
//! non-blocking enqueue ([`Telemetry`]); a task drains the queue into the file.

pub mod aggregate;
pub mod event;
pub mod exporter;
pub mod log;
pub mod sink;
pub mod tail;
pub mod trace;

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

pub use event::{Kind, PodMeta, Record};
pub use sink::{SeccompCall, Telemetry};

/// The default event log (see `runtime-conf/gantry.toml` for why it is on by default).
pub const DEFAULT_LOG: &str = "/var/log/gantry/events.jsonl";

/// `[events]` of the shim config.
#[derive(Debug, Clone, Deserialize, Serialize, PartialEq)]
#[serde(default, deny_unknown_fields)]
pub struct EventsConfig {
    /// The JSON-lines event log shared by all daemons of the node; empty turns it off.
    pub log: PathBuf,
    /// Size past which the log is rotated.
    pub max_bytes: u64,
    /// Rotated files kept (`events.jsonl.1` … `.N`).
    pub keep: u32,
    /// Exporter: add `pod` and `pod_namespace` labels to the exit and error counters.
    pub pod_labels: bool,
}

impl Default for EventsConfig {
    fn default() -> Self {
        Self {
            log: PathBuf::from(DEFAULT_LOG),
            max_bytes: 16 * 1024 * 1024,
            keep: 3,
            pod_labels: false,
        }
    }
}

impl EventsConfig {
    /// What is wrong with the section, as (key, message), if anything.
    pub fn problem(&self) -> Option<(&'static str, String)> {
        if !self.log.as_os_str().is_empty() && !self.log.is_absolute() {
            return Some(("log", "must be an absolute path or empty (off)".into()));
        }
        if self.max_bytes < 4096 {
            return Some(("max_bytes", format!("must be at least 4096, not {}", self.max_bytes)));
        }
        if !(1..=100).contains(&self.keep) {
            return Some(("keep", format!("must be between 1 and 100, not {}", self.keep)));
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use crate::config::Config;

    #[test]
    fn events_section_is_read_and_checked() {
        let c = Config::parse(Path::new("f"), "[events]\nlog = \"\"\nkeep = 5\n").unwrap();
        assert!(c.events.log.as_os_str().is_empty());
        assert_eq!((c.events.keep, c.events.max_bytes), (5, 16 * 1024 * 1024));
        let text = "[shim]\nlog_level = \"info\"\n[events]\nlog = \"relative/x.jsonl\"\n";
        let e = Config::parse(Path::new("f"), text).unwrap_err().to_string();
        assert!(e.contains("events.log") && e.contains("line 4"), "{e}");
        let e = Config::parse(Path::new("f"), "[events]\nmax_bytes = 10\n").unwrap_err();
        assert!(e.to_string().contains("events.max_bytes"), "{e}");
        let e = Config::parse(Path::new("f"), "[events]\nkeep = 0\n").unwrap_err();
        assert!(e.to_string().contains("events.keep"), "{e}");
    }
}
