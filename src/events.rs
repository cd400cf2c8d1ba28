//! Task lifecycle events. containerd learns of exits and OOMs only from these, forwarded to its
//! `TTRPC_ADDRESS`; CRI-O sets no address and reads no events, so then they are only logged.
//! One queue, one sender: events reach containerd in the order they were published.

use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime};

use containerd_shim_protos::events::task::{
    TaskCheckpointed, TaskCreate, TaskDelete, TaskExecAdded, TaskExecStarted, TaskExit, TaskIO, TaskOOM, TaskPaused,
    TaskResumed, TaskStart,
};
use containerd_shim_protos::protobuf::well_known_types::any::Any;
use containerd_shim_protos::protobuf::well_known_types::timestamp::Timestamp;
use containerd_shim_protos::protobuf::{Message, MessageField};
use containerd_shim_protos::shim::event::Envelope;
use containerd_shim_protos::shim::events::ForwardRequest;
use containerd_shim_protos::shim_async::{Client, EventsClient};
use slog::{debug, info, warn, Logger};
use tokio::sync::{mpsc, oneshot};
use tokio::time::Instant;

/// A lifecycle event, with the topic containerd files it under.
#[derive(Debug, Clone)]
pub enum Event {
    Create(TaskCreate),
    Start(TaskStart),
    Exit(TaskExit),
    Delete(TaskDelete),
    ExecAdded(TaskExecAdded),
    ExecStarted(TaskExecStarted),
    Oom(TaskOOM),
    Paused(TaskPaused),
    Resumed(TaskResumed),
    Checkpointed(TaskCheckpointed),
}

impl Event {
    pub fn topic(&self) -> &'static str {
        match self {
            Event::Create(_) => "/tasks/create",
            Event::Start(_) => "/tasks/start",
            Event::Exit(_) => "/tasks/exit",
            Event::Delete(_) => "/tasks/delete",
            Event::ExecAdded(_) => "/tasks/exec-added",
            Event::ExecStarted(_) => "/tasks/exec-started",
            Event::Oom(_) => "/tasks/oom",
            Event::Paused(_) => "/tasks/paused",
            Event::Resumed(_) => "/tasks/resumed",
            Event::Checkpointed(_) => "/tasks/checkpointed",
        }
    }

    /// The encoded message, through each concrete type's `Message::write_to_bytes`: the
    /// `MessageDyn` route names the message from its descriptor even on success, and building
    /// the descriptors of containerd's proto files costs each daemon ~0.4 MiB of heap.
    fn encode(&self) -> Vec<u8> {
        fn enc<M: Message>(m: &M) -> Vec<u8> {
            m.write_to_bytes().unwrap_or_default()
        }
        match self {
            Event::Create(m) => enc(m),
            Event::Start(m) => enc(m),
            Event::Exit(m) => enc(m),
            Event::Delete(m) => enc(m),
            Event::ExecAdded(m) => enc(m),
            Event::ExecStarted(m) => enc(m),
            Event::Oom(m) => enc(m),
            Event::Paused(m) => enc(m),
            Event::Resumed(m) => enc(m),
            Event::Checkpointed(m) => enc(m),
        }
    }

    /// The bare message name containerd registers the event under. Spelled out rather than
    /// read from the protobuf descriptor: building descriptors costs each daemon ~0.5 MiB of heap.
    pub fn type_url(&self) -> &'static str {
        match self {
            Event::Create(_) => "containerd.events.TaskCreate",
            Event::Start(_) => "containerd.events.TaskStart",
            Event::Exit(_) => "containerd.events.TaskExit",
            Event::Delete(_) => "containerd.events.TaskDelete",
            Event::ExecAdded(_) => "containerd.events.TaskExecAdded",
            Event::ExecStarted(_) => "containerd.events.TaskExecStarted",
            Event::Oom(_) => "containerd.events.TaskOOM",
            Event::Paused(_) => "containerd.events.TaskPaused",
            Event::Resumed(_) => "containerd.events.TaskResumed",
            Event::Checkpointed(_) => "containerd.events.TaskCheckpointed",
        }
    }

    /// The event as an `Any` whose type URL is the bare message name (`containerd.events.TaskExit`).
    pub fn to_any(&self) -> Any {
        let mut any = Any::new();
        any.type_url = self.type_url().to_string();
        any.value = self.encode();
        any
    }

    pub fn container_id(&self) -> &str {
        match self {
            Event::Create(m) => &m.container_id,
            Event::Start(m) => &m.container_id,
            Event::Exit(m) => &m.container_id,
            Event::Delete(m) => &m.container_id,
            Event::ExecAdded(m) => &m.container_id,
            Event::ExecStarted(m) => &m.container_id,
            Event::Oom(m) => &m.container_id,
            Event::Paused(m) => &m.container_id,
            Event::Resumed(m) => &m.container_id,
            Event::Checkpointed(m) => &m.container_id,
        }
    }
}

/// Converts a wall-clock time to a protobuf timestamp.
pub fn timestamp(t: SystemTime) -> Timestamp {
    let d = t.duration_since(SystemTime::UNIX_EPOCH).unwrap_or_default();
    let mut ts = Timestamp::new();
    ts.seconds = d.as_secs() as i64;
    ts.nanos = d.subsec_nanos() as i32;
    ts
}

pub fn ts_field(t: Option<SystemTime>) -> MessageField<Timestamp> {
    t.map(|t| MessageField::some(timestamp(t))).unwrap_or_default()
}

pub fn task_io(stdin: &str, stdout: &str, stderr: &str, terminal: bool) -> MessageField<TaskIO> {
    MessageField::some(TaskIO {
        stdin: stdin.into(),
        stdout: stdout.into(),
        stderr: stderr.into(),
        terminal,
        ..Default::default()
    })
}

/// Most events waiting for containerd. At the limit the newest event is dropped (and counted):
/// the queue keeps its order, memory stays bounded while containerd is away, and publishing
/// never waits.
pub const QUEUE_CAPACITY: usize = 1024;
/// How long one event is retried before it is dropped. containerd's Go shim keeps retrying about
/// this long, which covers a containerd restart.
pub const RETRY_WINDOW: Duration = Duration::from_secs(20);
const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(2);
/// Bound on one Forward call, so a hung containerd costs a retry, not the queue.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(5);

/// What the forwarding task receives: an event, or a request to report once all earlier
/// events are through (the daemon flushes before it exits).
enum Item {
    Event(Box<Envelope>),
    Flush(oneshot::Sender<()>),
}

/// Events dropped (queue full or retries exhausted), and whether a burst of drops is under way
/// (logged once per burst, not once per event).
#[derive(Default)]
struct Drops {
    count: AtomicU64,
    bursting: AtomicBool,
}

impl Drops {
    fn dropped(&self, log: &Logger, why: &str, topic: &str) {
        self.count.fetch_add(1, Ordering::Relaxed);
        if !self.bursting.swap(true, Ordering::Relaxed) {
            warn!(log, "dropping events for containerd"; "why" => why, "topic" => topic,
                "dropped_total" => self.count.load(Ordering::Relaxed));
        }
    }

    fn delivered(&self, log: &Logger) {
        if self.bursting.swap(false, Ordering::Relaxed) {
            info!(log, "events flow again"; "dropped_total" => self.count.load(Ordering::Relaxed));
        }
    }
}

/// Where events go: containerd's Events service in production, a fake in tests.
pub trait Forward: Send + 'static {
    /// One attempt to deliver one event.
    fn forward(&mut self, req: &ForwardRequest) -> impl Future<Output = Result<(), String>> + Send;
}

/// containerd's `Events/Forward` on `TTRPC_ADDRESS`, connected lazily and again after a failure.
struct Ttrpc {
    address: String,
    client: Option<EventsClient>,
}

impl Forward for Ttrpc {
    async fn forward(&mut self, req: &ForwardRequest) -> Result<(), String> {
        if self.client.is_none() {
            self.client = Some(connect(&self.address).await?);
        }
        let Some(c) = &self.client else {
            return Err("not connected".into());
        };
        let ctx = ttrpc::context::with_timeout(FORWARD_TIMEOUT.as_nanos() as i64);
        match tokio::time::timeout(FORWARD_TIMEOUT, c.forward(ctx, req)).await {
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => {
                self.client = None;
                Err(e.to_string())
            }
            Err(_) => {
                self.client = None;
                Err("forward timed out".into())
            }
        }
    }
}

/// Publishes events in order to containerd, or only logs them when there is no address.
#[derive(Clone)]
pub struct Publisher {
    tx: Option<mpsc::Sender<Item>>,
    drops: Arc<Drops>,
    namespace: String,
    log: Logger,
}

impl Publisher {
    /// `address` is `TTRPC_ADDRESS`; empty under CRI-O. Connects lazily, so a containerd that
    /// is restarting does not stop the shim from serving.
    pub fn new(address: &str, namespace: &str, log: Logger) -> Self {
        if address.is_empty() {
            return Self {
                tx: None,
                drops: Arc::default(),
                namespace: namespace.to_string(),
                log,
            };
        }
        let forwarder = Ttrpc {
            address: address.to_string(),
            client: None,
        };
        Self::with_forwarder(forwarder, namespace, log)
    }

    /// A publisher delivering through `forwarder` (one task, one event at a time, in order).
    pub fn with_forwarder(forwarder: impl Forward, namespace: &str, log: Logger) -> Self {
        let (tx, rx) = mpsc::channel(QUEUE_CAPACITY);
        let drops = Arc::<Drops>::default();
        tokio::spawn(forward_loop(forwarder, rx, drops.clone(), log.clone()));
        Self {
            tx: Some(tx),
            drops,
            namespace: namespace.to_string(),
            log,
        }
    }

    /// Queues an event; never waits (a full queue drops it and counts the drop).
    pub fn publish(&self, event: Event) {
        debug!(self.log, "event"; "topic" => event.topic(), "id" => event.container_id(),
            "forwarded" => self.tx.is_some());
        let Some(tx) = &self.tx else { return };
        let topic = event.topic();
        let envelope = Envelope {
            timestamp: MessageField::some(timestamp(SystemTime::now())),
            namespace: self.namespace.clone(),
            topic: topic.to_string(),
            event: MessageField::some(event.to_any()),
            ..Default::default()
        };
        match tx.try_send(Item::Event(Box::new(envelope))) {
            Ok(()) => {}
            Err(mpsc::error::TrySendError::Full(_)) => self.drops.dropped(&self.log, "queue full", topic),
            Err(mpsc::error::TrySendError::Closed(_)) => {}
        }
    }

    /// Events dropped so far: queue full, or containerd unreachable for [`RETRY_WINDOW`].
    pub fn dropped(&self) -> u64 {
        self.drops.count.load(Ordering::Relaxed)
    }

    /// Waits (bounded) until every event published so far was forwarded or dropped, so the
    /// TaskDelete of the last container is not lost when the daemon exits right after.
    pub async fn flush(&self, timeout: Duration) {
        let Some(tx) = &self.tx else { return };
        let (done, wait) = oneshot::channel();
        let _ = tokio::time::timeout(timeout, async {
            if tx.send(Item::Flush(done)).await.is_ok() {
                let _ = wait.await;
            }
        })
        .await;
    }
}

async fn connect(address: &str) -> Result<EventsClient, String> {
    let addr = if address.starts_with("unix://") {
        address.to_string()
    } else {
        format!("unix://{address}")
    };
    Client::connect(&addr)
        .await
        .map(EventsClient::new)
        .map_err(|e| e.to_string())
}

async fn forward_loop(mut forwarder: impl Forward, mut rx: mpsc::Receiver<Item>, drops: Arc<Drops>, log: Logger) {
    while let Some(item) = rx.recv().await {
        match item {
            Item::Event(envelope) => {
                let req = ForwardRequest {
                    envelope: MessageField::some(*envelope),
                    ..Default::default()
                };
                if deliver(&mut forwarder, &req, &log).await {
                    drops.delivered(&log);
                } else {
                    drops.dropped(&log, "containerd unreachable", &req.envelope.topic);
                }
            }
            Item::Flush(done) => {
                let _ = done.send(());
            }
        }
    }
}

/// Tries one event with growing pauses until it is through or [`RETRY_WINDOW`] has passed
/// since the first attempt (the last attempt is made at the window's end).
async fn deliver(forwarder: &mut impl Forward, req: &ForwardRequest, log: &Logger) -> bool {
    let first = Instant::now();
    let mut backoff = FIRST_BACKOFF;
    for attempt in 1u32.. {
        let error = match forwarder.forward(req).await {
            Ok(()) => return true,
            Err(e) => e,
        };
        let elapsed = first.elapsed();
        if elapsed >= RETRY_WINDOW {
            return false;
        }
        if attempt == 1 {
            warn!(log, "forwarding event failed; retrying"; "topic" => &req.envelope.topic, "error" => error);
        } else {
            debug!(log, "forwarding event failed"; "topic" => &req.envelope.topic,
                "attempt" => attempt, "error" => error);
        }
        tokio::time::sleep(backoff.min(RETRY_WINDOW - elapsed)).await;
        backoff = (backoff * 2).min(MAX_BACKOFF);
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;
    use containerd_shim_protos::protobuf::MessageFull;

    #[test]
    fn type_urls_match_the_protobuf_names() {
        let all = [
            Event::Create(Default::default()),
            Event::Start(Default::default()),
            Event::Exit(Default::default()),
            Event::Delete(Default::default()),
            Event::ExecAdded(Default::default()),
            Event::ExecStarted(Default::default()),
            Event::Oom(Default::default()),
            Event::Paused(Default::default()),
            Event::Resumed(Default::default()),
            Event::Checkpointed(Default::default()),
        ];
        let names = [
            TaskCreate::descriptor().full_name().to_string(),
            TaskStart::descriptor().full_name().to_string(),
            TaskExit::descriptor().full_name().to_string(),
            TaskDelete::descriptor().full_name().to_string(),
            TaskExecAdded::descriptor().full_name().to_string(),
            TaskExecStarted::descriptor().full_name().to_string(),
            TaskOOM::descriptor().full_name().to_string(),
            TaskPaused::descriptor().full_name().to_string(),
            TaskResumed::descriptor().full_name().to_string(),
            TaskCheckpointed::descriptor().full_name().to_string(),
        ];
        for (e, name) in all.iter().zip(names) {
            assert_eq!(e.type_url(), name);
        }
    }

    type Shared<T> = Arc<std::sync::Mutex<Vec<T>>>;

    /// A fake containerd: fails every attempt until `up_at`, then records what arrives.
    struct Fake {
        up_at: Option<Instant>,
        attempts: Shared<(Instant, String)>,
        got: Shared<String>,
    }

    impl Fake {
        fn new(up_at: Option<Instant>) -> (Self, Shared<(Instant, String)>, Shared<String>) {
            let f = Fake {
                up_at,
                attempts: Arc::default(),
                got: Arc::default(),
            };
            let (a, g) = (f.attempts.clone(), f.got.clone());
            (f, a, g)
        }
    }

    fn id_of(req: &ForwardRequest) -> String {
        let any = req.envelope.event.as_ref().cloned().unwrap_or_default();
        let m: TaskStart = Message::parse_from_bytes(&any.value).unwrap_or_default();
        m.container_id
    }

    impl Forward for Fake {
        async fn forward(&mut self, req: &ForwardRequest) -> Result<(), String> {
            let id = id_of(req);
            self.attempts.lock().unwrap().push((Instant::now(), id.clone()));
            match self.up_at {
                Some(t) if Instant::now() >= t => {
                    self.got.lock().unwrap().push(id);
                    Ok(())
                }
                _ => Err("connection refused".into()),
            }
        }
    }

    /// Wraps the real forwarder and notes when each attempt was made.
    struct Recording<F> {
        inner: F,
        attempts: Shared<Instant>,
    }

    impl<F: Forward> Forward for Recording<F> {
        async fn forward(&mut self, req: &ForwardRequest) -> Result<(), String> {
            self.attempts.lock().unwrap().push(Instant::now());
            self.inner.forward(req).await
        }
    }

    fn start(id: &str) -> Event {
        Event::Start(TaskStart {
            container_id: id.into(),
            ..Default::default()
        })
    }

    fn discard() -> Logger {
        Logger::root(slog::Discard, slog::o!())
    }

    #[tokio::test(start_paused = true)]
    async fn unreachable_containerd_is_retried_for_the_whole_window() {
        let dir = tempfile::tempdir().unwrap();
        let attempts = Shared::<Instant>::default();
        let forwarder = Recording {
            inner: Ttrpc {
                address: dir.path().join("no-containerd.sock").display().to_string(),
                client: None,
            },
            attempts: attempts.clone(),
        };
        let p = Publisher::with_forwarder(forwarder, "ns", discard());
        let t0 = Instant::now();
        p.publish(start("a"));
        tokio::time::sleep(Duration::from_secs(19)).await;
        assert_eq!(p.dropped(), 0, "dropped before the retry window ended");
        tokio::time::sleep(Duration::from_secs(60)).await;
        assert_eq!(p.dropped(), 1);
        let a = attempts.lock().unwrap().clone();
        assert!(a.len() > 10, "only {} attempts", a.len());
        let last = *a.last().unwrap() - t0;
        assert!(last >= RETRY_WINDOW, "last attempt after {last:?}");
        assert!(last < RETRY_WINDOW + MAX_BACKOFF, "still retrying after {last:?}");
    }

    #[tokio::test(start_paused = true)]
    async fn order_is_kept_across_an_outage_and_an_expired_event_is_counted() {
        let t0 = Instant::now();
        let (fake, attempts, got) = Fake::new(Some(t0 + Duration::from_secs(25)));
        let p = Publisher::with_forwarder(fake, "ns", discard());
        for i in 0..50 {
            p.publish(start(&format!("c{i}")));
        }
        tokio::time::sleep(Duration::from_secs(30)).await;
        p.flush(Duration::from_secs(5)).await;
        // c0 was retried for the whole window while containerd was away, then dropped; the
        // rest arrived once it was back, in the order they were published.
        let want: Vec<String> = (1..50).map(|i| format!("c{i}")).collect();
        assert_eq!(*got.lock().unwrap(), want);
        assert_eq!(p.dropped(), 1);
        let a = attempts.lock().unwrap();
        let c0: Vec<_> = a.iter().filter(|(_, id)| id == "c0").collect();
        assert!(c0.last().unwrap().0 - t0 >= RETRY_WINDOW);
    }

    #[tokio::test(start_paused = true)]
    async fn a_full_queue_drops_and_counts_without_blocking() {
        let (fake, _attempts, got) = Fake::new(None);
        let p = Publisher::with_forwarder(fake, "ns", discard());
        // No await in between: the forwarder has taken nothing yet, so exactly the capacity fits.
        for i in 0..QUEUE_CAPACITY + 10 {
            p.publish(start(&format!("c{i}")));
        }
        assert_eq!(p.dropped(), 10);
        assert!(got.lock().unwrap().is_empty());
    }

    #[test]
    fn any_type_url_is_bare_name() {
        let e = Event::Exit(TaskExit {
            container_id: "c".into(),
            exit_status: 3,
            ..Default::default()
        });
        let any = e.to_any();
        assert_eq!(any.type_url, "containerd.events.TaskExit");
        assert_eq!(e.topic(), "/tasks/exit");
        let back: TaskExit = containerd_shim_protos::protobuf::Message::parse_from_bytes(&any.value).unwrap();
        assert_eq!(back.exit_status, 3);
    }
}
