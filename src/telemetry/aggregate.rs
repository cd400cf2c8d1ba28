//! Prometheus metrics derived from event-log records. Counters and histograms only grow here,
//! whichever daemon wrote the lines, so a daemon exiting never takes a count back. State is
//! bounded: the metric families are keyed by low-cardinality labels (handler, engine
//! namespace, reason, ...), the running set by live containers (capped), and per-pod label sets
//! (only with `pod_labels`) are capped too, past which they fold into `pod="_other"`.

use std::collections::{HashMap, HashSet};

use prometheus_client::encoding::text::encode;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::Histogram;
use prometheus_client::registry::Registry;
use thiserror::Error;

use super::event::{Kind, Record};

#[derive(Debug, Error)]
pub enum AggregateError {
    #[error("encoding metrics: {0}")]
    Encode(#[from] std::fmt::Error),
}

type Labels = Vec<(String, String)>;
type Counters = Family<Labels, Counter>;
type Gauges = Family<Labels, Gauge>;
type Histograms = Family<Labels, Histogram, fn() -> Histogram>;

/// Most containers tracked as running at once (a node runs a few hundred).
pub const MAX_RUNNING: usize = 100_000;
/// Most distinct pods given labels of their own with `pod_labels`.
pub const MAX_PODS: usize = 5_000;

/// Request latency buckets in seconds: 1 ms to 4 min (CRI-O's Create deadline).
const BUCKETS: [f64; 16] = [
    0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0, 240.0,
];

fn latency_histogram() -> Histogram {
    Histogram::new(BUCKETS)
}

/// A live daemon as `/proc` shows it.
#[derive(Debug, Clone)]
pub struct DaemonInfo {
    pub handler: String,
    pub rss_bytes: u64,
}

struct Metrics {
    created: Counters,
    started: Counters,
    exits: Counters,
    execs: Counters,
    deleted: Counters,
    devices: Counters,
    policy: Counters,
    seccomp: Counters,
    runtime_errors: Counters,
    dropped: Counters,
    malformed: Counter,
    /// Lines of a schema newer than this binary's: skipped, never misread.
    newer: Counter,
    durations: Histograms,
    running: Gauges,
    daemons: Gauges,
    memory: Gauges,
    build: Gauges,
}

/// Registers each `(name, help, family)`.
fn register_all<'m, M: prometheus_client::registry::Metric + Clone + 'm>(
    r: &mut Registry,
    families: impl IntoIterator<Item = (&'static str, &'static str, &'m M)>,
) {
    for (name, help, family) in families {
        r.register(name, help, family.clone());
    }
}

/// Aggregated state of the node's event log.
pub struct Aggregator {
    registry: Registry,
    m: Metrics,
    pod_labels: bool,
    running: HashMap<(String, String), Labels>,
    pods: HashSet<(String, String)>,
}

impl Aggregator {
    pub fn new(pod_labels: bool) -> Self {
        let mut registry = Registry::default();
        let m = Metrics {
            created: Counters::default(),
            started: Counters::default(),
            exits: Counters::default(),
            execs: Counters::default(),
            deleted: Counters::default(),
            devices: Counters::default(),
            policy: Counters::default(),
            seccomp: Counters::default(),
            runtime_errors: Counters::default(),
            dropped: Counters::default(),
            malformed: Counter::default(),
            newer: Counter::default(),
            durations: Histograms::new_with_constructor(latency_histogram),
            running: Gauges::default(),
            daemons: Gauges::default(),
            memory: Gauges::default(),
            build: Gauges::default(),
        };
        let r = &mut registry;
        // Families of one type are registered from one table each.
        let counters = [
            (
                "gantry_containers_created",
                "Containers created (Create served)",
                &m.created,
            ),
            (
                "gantry_containers_started",
                "Containers started (init Start served)",
                &m.started,
            ),
            (
                "gantry_exits",
                "Process exits by reason (normal, signal, oom) and process (init, exec)",
                &m.exits,
            ),
            ("gantry_execs", "Exec processes started", &m.execs),
            ("gantry_containers_deleted", "Containers deleted", &m.deleted),
            (
                "gantry_devices_injected",
                "Devices injected into containers, by kind",
                &m.devices,
            ),
            (
                "gantry_policy_decisions",
                "Security-policy decisions by decision and reason",
                &m.policy,
            ),
            (
                "gantry_seccomp_notifications",
                "Watched syscalls containers made, by syscall and the action taken",
                &m.seccomp,
            ),
            (
                "gantry_runtime_errors",
                "Failed OCI runtime calls by call",
                &m.runtime_errors,
            ),
            (
                "gantry_events_dropped",
                "Events the daemons could not write to the log",
                &m.dropped,
            ),
        ];
        register_all(r, counters);
        let gauges = [
            (
                "gantry_containers_running",
                "Containers started and not exited, per the event log",
                &m.running,
            ),
            (
                "gantry_daemons",
                "Live gantry daemons (pods) of the handler",
                &m.daemons,
            ),
            (
                "gantry_daemon_resident_memory_bytes",
                "Resident memory of all live daemons of the handler",
                &m.memory,
            ),
        ];
        register_all(r, gauges);
        r.register(
            "gantry_event_log_newer_schema_lines",
            "Event-log lines of a newer schema than this exporter reads, skipped",
            m.newer.clone(),
        );
        r.register(
            "gantry_event_log_malformed_lines",
            "Event-log lines that did not parse",
            m.malformed.clone(),
        );
        r.register(
            "gantry_request_duration_seconds",
            "Time gantry took to serve Create, Start, Exec (start of an exec) and Delete",
            m.durations.clone(),
        );
        r.register("gantry_build_info", "gantry version and git revision", m.build.clone());
        let build: Labels = vec![
            ("version".into(), env!("CARGO_PKG_VERSION").into()),
            (
                "revision".into(),
                option_env!("GANTRY_GIT_REVISION").unwrap_or("unknown").into(),
            ),
        ];
        m.build.get_or_create(&build).set(1);
        Self {
            registry,
            m,
            pod_labels,
            running: HashMap::new(),
            pods: HashSet::new(),
        }
    }

    /// One line of the log (newline optional); a line that does not parse is counted.
    pub fn observe_line(&mut self, line: &[u8]) {
        if line.iter().all(u8::is_ascii_whitespace) {
            return;
        }
        match serde_json::from_slice::<Record>(line) {
            // Written by a newer gantry (a node mid-upgrade): its fields may mean other things.
            Ok(r) if r.v > super::event::SCHEMA_VERSION => {
                self.m.newer.inc();
            }
            Ok(r) => self.observe(&r),
            Err(_) => {
                self.m.malformed.inc();
            }
        }
    }

    fn base(&mut self, r: &Record) -> Labels {
        let mut l: Labels = vec![
            ("handler".into(), r.handler.clone()),
            ("namespace".into(), r.ns.clone()),
        ];
        if self.pod_labels {
            let key = (
                r.pod.pod_namespace.clone().unwrap_or_default(),
                r.pod.pod.clone().unwrap_or_default(),
            );
            let known = self.pods.contains(&key) || (self.pods.len() < MAX_PODS && self.pods.insert(key.clone()));
            let (ns, pod) = if known { key } else { ("_other".into(), "_other".into()) };
            l.push(("pod_namespace".into(), ns));
            l.push(("pod".into(), pod));
        }
        l
    }

    fn with(mut l: Labels, k: &str, v: &str) -> Labels {
        l.push((k.to_string(), v.to_string()));
        l
    }

    /// Folds one record into the metrics.
    pub fn observe(&mut self, r: &Record) {
        let base = self.base(r);
        let key = (r.ns.clone(), r.id.clone());
        match r.event {
            Kind::Create => {
                self.m.created.get_or_create(&base).inc();
                self.duration(&base, "create", r);
            }
            Kind::Start => {
                self.m.started.get_or_create(&base).inc();
                self.duration(&base, "start", r);
                if self.running.len() < MAX_RUNNING {
                    self.running.insert(key, base.clone());
                }
            }
            Kind::ExecStarted => {
                self.m.execs.get_or_create(&base).inc();
                self.duration(&base, "exec", r);
            }
            Kind::Exit => {
                let process = if r.exec_id.is_some() { "exec" } else { "init" };
                let l = Self::with(Self::with(base, "reason", r.exit_reason()), "process", process);
                self.m.exits.get_or_create(&l).inc();
                if r.exec_id.is_none() {
                    self.running.remove(&key);
                }
            }
            Kind::Delete if r.exec_id.is_none() => {
                self.m.deleted.get_or_create(&base).inc();
                self.duration(&base, "delete", r);
                self.running.remove(&key);
            }
            Kind::DevicesInjected => {
                for d in &r.devices {
                    let kind = device_kind(d);
                    self.m
                        .devices
                        .get_or_create(&Self::with(base.clone(), "kind", kind))
                        .inc();
                }
            }
            Kind::Policy => {
                let decision = r.decision.as_deref().unwrap_or("unknown");
                let l = Self::with(base, "decision", decision);
                let l = Self::with(l, "reason", r.reason.as_deref().unwrap_or("unknown"));
                self.m.policy.get_or_create(&l).inc();
            }
            Kind::Seccomp => {
                let l = Self::with(base, "syscall", r.syscall.as_deref().unwrap_or("unknown"));
                let l = Self::with(l, "action", r.decision.as_deref().unwrap_or("unknown"));
                self.m.seccomp.get_or_create(&l).inc_by(r.count.unwrap_or(1));
            }
            Kind::RuntimeError => {
                let l = Self::with(base, "call", r.call.as_deref().unwrap_or("unknown"));
                self.m.runtime_errors.get_or_create(&l).inc();
            }
            Kind::Dropped => {
                let l: Labels = vec![
                    ("handler".into(), r.handler.clone()),
                    ("namespace".into(), r.ns.clone()),
                ];
                self.m.dropped.get_or_create(&l).inc_by(r.count.unwrap_or(0));
            }
            Kind::Delete | Kind::ExecAdded | Kind::Paused | Kind::Resumed | Kind::Updated | Kind::SeccompProfile => {}
        }
    }

    fn duration(&self, base: &Labels, op: &str, r: &Record) {
        if let Some(ms) = r.duration_ms {
            let l = Self::with(base.clone(), "op", op);
            self.m.durations.get_or_create(&l).observe(ms / 1000.0);
        }
    }

    /// Replaces the gauges of live daemons with what `/proc` shows now.
    pub fn set_daemons(&self, daemons: &[DaemonInfo]) {
        self.m.daemons.clear();
        self.m.memory.clear();
        for d in daemons {
            let l: Labels = vec![("handler".into(), d.handler.clone())];
            self.m.daemons.get_or_create(&l).inc();
            self.m.memory.get_or_create(&l).inc_by(d.rss_bytes as i64);
        }
    }

    /// Containers tracked as running (for tests and the bounded-state check).
    pub fn running_len(&self) -> usize {
        self.running.len()
    }

    /// The exposition (OpenMetrics text, which Prometheus and promtool read).
    pub fn encode(&self) -> Result<String, AggregateError> {
        self.m.running.clear();
        for labels in self.running.values() {
            // Running counts per handler and namespace, whatever the pod labels are.
            let l: Labels = labels.iter().take(2).cloned().collect();
            self.m.running.get_or_create(&l).inc();
        }
        let mut out = String::new();
        encode(&mut out, &self.registry)?;
        Ok(out)
    }
}

/// The same exposition in the Prometheus text format 0.0.4, which node_exporter's textfile
/// collector and `promtool check metrics` parse: OpenMetrics names a counter's family without
/// its `_total` suffix in `# HELP`/`# TYPE`, which that parser would read as a second, untyped
/// family. Only those comment lines change (and `# EOF` goes); samples are the crate's.
pub fn openmetrics_to_text(om: &str) -> String {
    let counters: HashSet<&str> = om
        .lines()
        .filter_map(|l| l.strip_prefix("# TYPE ")?.strip_suffix(" counter"))
        .collect();
    let mut out = String::with_capacity(om.len() + 64);
    for line in om.lines().filter(|l| *l != "# EOF") {
        let comment = ["# HELP ", "# TYPE "].into_iter().find(|p| line.starts_with(p));
        let renamed = comment.and_then(|prefix| {
            let rest = &line[prefix.len()..];
            let (name, tail) = rest.split_once(' ').unwrap_or((rest, ""));
            counters.contains(name).then(|| format!("{prefix}{name}_total {tail}"))
        });
        match renamed {
            Some(l) => out.push_str(l.trim_end()),
            None => out.push_str(line),
        }
        out.push('\n');
    }
    out
}

/// The device kind of an injected device: `nvidia.com/gpu` of `nvidia.com/gpu=0`, `dev` of a
/// fallback `dev:/dev/nvidia0`.
pub fn device_kind(device: &str) -> &str {
    match device.split_once('=') {
        Some((kind, _)) => kind,
        None => device.split_once(':').map(|(k, _)| k).unwrap_or("unknown"),
    }
}

#[cfg(test)]
#[path = "aggregate_tests.rs"]
mod tests;
