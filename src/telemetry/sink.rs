//! The daemon's side of the event log: request handlers call [`Telemetry`], which builds a
//! [`Record`] and `try_send`s it into a bounded queue (a full queue drops and counts; nothing
//! waits). One task drains the queue into the log file on the daemon's thread: a local
//! `O_APPEND` write of a few hundred bytes lands in the page cache in microseconds and never
//! waits for the disk (no fsync), so it does not need a thread of its own, which would cost
//! every daemon memory. The log must be on a local filesystem for that to hold.
//!
//! Pod metadata comes from the bundle's annotations, read by the drain task when it handles
//! a `create` (not on the request path), and is remembered per container until `delete`.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use slog::{info, warn, Logger};
use tokio::sync::{mpsc, oneshot};

use super::event::{this_handler, Kind, PodMeta, Record};
use super::log::EventLog;
use super::trace::Request;
use super::EventsConfig;
use crate::devices::INJECTED_ANNOTATION;
use crate::runtime::RuntimeError;

/// Records waiting for the drain task. A burst of creates of a whole pod is a few dozen.
pub const QUEUE_CAPACITY: usize = 256;

enum Msg {
    /// A record; for `create`, the bundle whose annotations name the pod.
    Record(Box<Record>, Option<PathBuf>),
    Flush(oneshot::Sender<()>),
}

struct Inner {
    tx: mpsc::Sender<Msg>,
    namespace: String,
    handler: String,
    /// Lost before reaching the file; written as a `dropped` line once the log works again.
    dropped: Arc<AtomicU64>,
}

/// One watched syscall as the notifier saw it.
#[derive(Debug, Clone, Copy)]
pub struct SeccompCall<'a> {
    pub syscall: &'a str,
    pub arch: &'a str,
    pub pid: u32,
    pub action: &'a str,
}

/// Emits lifecycle events into the event log; a no-op when the log is off.
#[derive(Clone, Default)]
pub struct Telemetry {
    inner: Option<Arc<Inner>>,
}

impl Telemetry {
    /// Off: every call does nothing.
    pub fn off() -> Self {
        Self::default()
    }

    /// Starts the drain task (needs a tokio runtime) when `config.log` is set.
    pub fn start(config: &EventsConfig, namespace: &str, log: Logger) -> Self {
        if config.log.as_os_str().is_empty() {
            return Self::off();
        }
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        let dropped = Arc::<AtomicU64>::default();
        let writer = EventLog::new(&config.log, config.max_bytes, config.keep);
        tokio::spawn(drain(rx, writer, dropped.clone(), log));
        Self {
            inner: Some(Arc::new(Inner {
                tx,
                namespace: namespace.to_string(),
                handler: this_handler(),
                dropped,
            })),
        }
    }

    /// Events lost so far and not yet reported in the log.
    pub fn pending_drops(&self) -> u64 {
        self.inner
            .as_ref()
            .map(|i| i.dropped.load(Ordering::Relaxed))
            .unwrap_or(0)
    }

    /// Builds a record of `kind` for `id`, lets `fill` complete it, and enqueues it with the
    /// current request's trace context and (for request events) duration.
    pub fn emit(&self, kind: Kind, id: &str, fill: impl FnOnce(&mut Record)) {
        self.send(kind, id, None, fill);
    }

    fn send(&self, kind: Kind, id: &str, bundle: Option<PathBuf>, fill: impl FnOnce(&mut Record)) {
        let Some(inner) = &self.inner else { return };
        let mut r = Record::new(kind, id, &inner.namespace, &inner.handler);
        if let Some(req) = Request::current() {
            r.traceparent = req.traceparent;
            if !matches!(
                kind,
                Kind::Exit
                    | Kind::RuntimeError
                    | Kind::Policy
                    | Kind::DevicesInjected
                    | Kind::Seccomp
                    | Kind::SeccompProfile
            ) {
                // Whole microseconds: readable lines, no float noise.
                r.duration_ms = Some(req.started.elapsed().as_micros() as f64 / 1000.0);
            }
        }
        fill(&mut r);
        if inner.tx.try_send(Msg::Record(Box::new(r), bundle)).is_err() {
            inner.dropped.fetch_add(1, Ordering::Relaxed);
        }
    }

    /// Create served; the drain task reads the pod's names and injected devices from `bundle`.
    pub fn created(&self, id: &str, bundle: PathBuf, pid: i32) {
        self.send(Kind::Create, id, Some(bundle), |r| r.pid = Some(pid as u32));
    }

    /// A process exited: `status` is the code, or 128 + signal for a killed process.
    pub fn exited(&self, id: &str, exec_id: Option<&str>, pid: i32, status: u32, oom_killed: bool) {
        self.emit(Kind::Exit, id, |r| {
            r.exec_id = exec_id.map(str::to_string);
            r.pid = Some(pid as u32);
            r.exit_code = Some(status);
            r.signal = (status > 128 && status < 128 + 65).then(|| status - 128);
            r.oom_killed = Some(oom_killed);
        });
    }

    /// A security-policy decision, for the policy code to report (`decision`: allow, deny or
    /// warn; `reason`: short and low-cardinality, it becomes a metric label).
    pub fn policy(&self, id: &str, decision: &str, reason: &str, message: &str) {
        self.emit(Kind::Policy, id, |r| {
            r.decision = Some(decision.to_string());
            r.reason = Some(reason.to_string());
            r.message = Some(message.to_string());
        });
    }

    /// `count` watched calls of `syscall` by the container (`pid`: the last caller), answered
    /// with `action`; `pod` names the pod (the record has no bundle to read it from).
    pub fn seccomp(&self, id: &str, pod: &PodMeta, call: &SeccompCall<'_>, count: u64) {
        self.emit(Kind::Seccomp, id, |r| {
            r.pod = pod.clone();
            r.syscall = Some(call.syscall.to_string());
            r.arch = Some(call.arch.to_string());
            r.pid = Some(call.pid);
            r.decision = Some(call.action.to_string());
            r.count = Some(count);
        });
    }

    /// The container's recording was saved into the profile `name`.
    pub fn seccomp_profile(&self, id: &str, pod: &PodMeta, name: &str, saved: &crate::security::record::Saved) {
        self.emit(Kind::SeccompProfile, id, |r| {
            r.pod = pod.clone();
            r.reason = Some(name.to_string());
            r.message = Some(saved.path.display().to_string());
            r.count = Some(saved.allowed as u64);
        });
    }

    /// A failed OCI runtime call while serving `rpc`.
    pub fn runtime_error(&self, rpc: &str, id: &str, e: &RuntimeError) {
        let call = match e {
            RuntimeError::Failed { command, .. }
            | RuntimeError::Output { command, .. }
            | RuntimeError::Timeout { command, .. } => command.clone(),
            RuntimeError::Spawn { .. } => "spawn".into(),
            RuntimeError::Io(_) => "io".into(),
        };
        self.emit(Kind::RuntimeError, id, |r| {
            r.rpc = Some(rpc.to_string());
            r.call = Some(call);
            r.reason = Some(
                if matches!(e, RuntimeError::Timeout { .. }) {
                    "timeout"
                } else {
                    "failed"
                }
                .into(),
            );
            r.message = Some(e.to_string());
            if let RuntimeError::Failed { status, .. } = e {
                r.exit_code = Some(*status);
            }
        });
    }

    /// Waits (bounded) until everything enqueued so far is written, before the daemon exits.
    pub async fn flush(&self, timeout: Duration) {
        let Some(inner) = &self.inner else { return };
        let (done, wait) = oneshot::channel();
        let _ = tokio::time::timeout(timeout, async {
            if inner.tx.send(Msg::Flush(done)).await.is_ok() {
                let _ = wait.await;
            }
        })
        .await;
    }
}

/// The drain task's state.
struct Drain {
    writer: EventLog,
    dropped: Arc<AtomicU64>,
    pods: HashMap<String, PodMeta>,
    failing: bool,
    log: Logger,
}

async fn drain(mut rx: mpsc::Receiver<Msg>, writer: EventLog, dropped: Arc<AtomicU64>, log: Logger) {
    let mut d = Drain {
        writer,
        dropped,
        pods: HashMap::new(),
        failing: false,
        log,
    };
    while let Some(msg) = rx.recv().await {
        // Behind whatever else is ready: the request that sent this record answers its
        // client first, and the file work happens after.
        tokio::task::yield_now().await;
        match msg {
            Msg::Record(r, bundle) => d.handle(*r, bundle),
            Msg::Flush(done) => {
                let _ = done.send(());
            }
        }
    }
}

impl Drain {
    fn handle(&mut self, mut r: Record, bundle: Option<PathBuf>) {
        let mut devices = Vec::new();
        let mut decisions = Vec::new();
        if let Some(b) = bundle {
            let annotations = crate::spec::load_annotations(&b).unwrap_or_default();
            self.pods.insert(r.id.clone(), PodMeta::from_annotations(&annotations));
            devices = annotations
                .get(INJECTED_ANNOTATION)
                .map(|v| v.split(',').filter(|d| !d.is_empty()).map(str::to_string).collect())
                .unwrap_or_default();
            decisions = crate::security::recorded_decisions(&annotations);
        }
        if let Some(meta) = self.pods.get(&r.id) {
            r.pod = meta.clone();
        }
        if r.event == Kind::Delete && r.exec_id.is_none() {
            self.pods.remove(&r.id);
        }
        let injected = (!devices.is_empty()).then(|| {
            let mut d = Record::new(Kind::DevicesInjected, &r.id, &r.ns, &r.handler);
            d.pod = r.pod.clone();
            d.traceparent = r.traceparent.clone();
            d.devices = devices;
            d
        });
        self.write(&r);
        if let Some(d) = injected {
            self.write(&d);
        }
        // The security policy's decisions at this Create, one policy event each.
        for (reason, value) in decisions {
            let mut p = Record::new(Kind::Policy, &r.id, &r.ns, &r.handler);
            p.pod = r.pod.clone();
            p.traceparent = r.traceparent.clone();
            p.decision = Some("allow".into());
            p.reason = Some(reason.into());
            p.message = Some(value);
            self.write(&p);
        }
    }

    fn write(&mut self, r: &Record) {
        let pending = self.dropped.swap(0, Ordering::Relaxed);
        if pending > 0 {
            let mut d = Record::new(Kind::Dropped, "", &r.ns, &r.handler);
            d.count = Some(pending);
            if self.writer.append(&d.to_line()).is_err() {
                self.dropped.fetch_add(pending, Ordering::Relaxed);
            }
        }
        match self.writer.append(&r.to_line()) {
            Ok(()) if self.failing => {
                self.failing = false;
                info!(self.log, "event log writable again"; "path" => self.writer.path().display().to_string());
            }
            Ok(()) => {}
            Err(e) => {
                self.dropped.fetch_add(1, Ordering::Relaxed);
                if !self.failing {
                    self.failing = true;
                    warn!(self.log, "event log not writable: dropping events (counted)"; "error" => %e);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config(dir: &std::path::Path) -> EventsConfig {
        EventsConfig {
            log: dir.join("events.jsonl"),
            ..Default::default()
        }
    }

    fn read(dir: &std::path::Path) -> Vec<Record> {
        std::fs::read_to_string(dir.join("events.jsonl"))
            .unwrap_or_default()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    }

    #[tokio::test]
    async fn records_carry_pod_names_devices_and_trace() {
        let dir = tempfile::tempdir().unwrap();
        let bundle = dir.path().join("b");
        std::fs::create_dir(&bundle).unwrap();
        std::fs::write(
            bundle.join("config.json"),
            r#"{"ociVersion":"1.0.2","annotations":{"io.kubernetes.pod.name":"web","io.kubernetes.container.name":"nginx","gantry.dev/injected-devices":"nvidia.com/gpu=0,nvidia.com/gpu=1"}}"#,
        )
        .unwrap();
        let t = Telemetry::start(
            &config(dir.path()),
            "k8s.io",
            slog::Logger::root(slog::Discard, slog::o!()),
        );
        let md = [(
            "traceparent".to_string(),
            vec!["00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01".to_string()],
        )]
        .into();
        Request::from_metadata(&md)
            .scope(async { t.created("c1", bundle.clone(), 42) })
            .await;
        t.exited("c1", None, 42, 137, true);
        t.emit(Kind::Delete, "c1", |_| {});
        t.emit(Kind::Start, "c1", |_| {});
        t.flush(Duration::from_secs(5)).await;
        let got = read(dir.path());
        let kinds: Vec<_> = got.iter().map(|r| r.event).collect();
        assert_eq!(
            kinds,
            [
                Kind::Create,
                Kind::DevicesInjected,
                Kind::Exit,
                Kind::Delete,
                Kind::Start
            ]
        );
        assert_eq!(got[0].pod.pod.as_deref(), Some("web"));
        assert!(got[0].traceparent.is_some() && got[0].duration_ms.is_some());
        assert_eq!(got[1].devices, ["nvidia.com/gpu=0", "nvidia.com/gpu=1"]);
        assert_eq!((got[2].signal, got[2].exit_reason()), (Some(9), "oom"));
        assert!(got[2].traceparent.is_none(), "outside the request");
        assert_eq!(got[3].pod.container.as_deref(), Some("nginx"));
        assert_eq!(got[4].pod, PodMeta::default(), "forgotten after delete");
    }

    #[tokio::test]
    async fn a_full_queue_drops_counts_and_reports_later() {
        let dir = tempfile::tempdir().unwrap();
        let t = Telemetry::start(&config(dir.path()), "ns", slog::Logger::root(slog::Discard, slog::o!()));
        // Nothing drains until this task yields: the queue takes exactly its capacity.
        for i in 0..QUEUE_CAPACITY + 7 {
            t.emit(Kind::Start, &format!("c{i}"), |_| {});
        }
        assert_eq!(t.pending_drops(), 7);
        t.flush(Duration::from_secs(5)).await;
        t.emit(Kind::Start, "late", |_| {});
        t.flush(Duration::from_secs(5)).await;
        let got = read(dir.path());
        let dropped: Vec<_> = got.iter().filter(|r| r.event == Kind::Dropped).collect();
        assert_eq!(dropped.len(), 1);
        assert_eq!(dropped[0].count, Some(7));
        assert_eq!(got.len(), QUEUE_CAPACITY + 2);
    }

    #[tokio::test]
    async fn off_writes_nothing() {
        let t = Telemetry::off();
        t.emit(Kind::Start, "c", |_| {});
        t.flush(Duration::from_secs(1)).await;
        assert_eq!(t.pending_drops(), 0);
    }
}
