//! Task lifecycle events. containerd learns of exits and OOMs only from these, forwarded to its
//! `TTRPC_ADDRESS`; CRI-O sets no address and reads no events, so then they are only logged.
//! One queue, one sender: events reach containerd in the order they were published.

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
use slog::{debug, warn, Logger};
use tokio::sync::{mpsc, oneshot};

/// Attempts per event before it is dropped (containerd down for good).
const MAX_ATTEMPTS: u32 = 5;

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

/// What the forwarding task receives: an event, or a request to report once all earlier
/// events are through (the daemon flushes before it exits).
enum Item {
    Event(Box<Envelope>),
    Flush(oneshot::Sender<()>),
}

/// Publishes events in order to containerd, or only logs them when there is no address.
#[derive(Clone)]
pub struct Publisher {
    tx: Option<mpsc::UnboundedSender<Item>>,
    namespace: String,
    log: Logger,
}

impl Publisher {
    /// `address` is `TTRPC_ADDRESS`; empty under CRI-O. Connects lazily, so a containerd that
    /// is restarting does not stop the shim from serving.
    pub fn new(address: &str, namespace: &str, log: Logger) -> Self {
        let tx = (!address.is_empty()).then(|| {
            let (tx, rx) = mpsc::unbounded_channel();
            tokio::spawn(forward_loop(address.to_string(), rx, log.clone()));
            tx
        });
        Self {
            tx,
            namespace: namespace.to_string(),
            log,
        }
    }

    pub fn publish(&self, event: Event) {
        debug!(self.log, "event"; "topic" => event.topic(), "id" => event.container_id(),
            "forwarded" => self.tx.is_some());
        let Some(tx) = &self.tx else { return };
        let envelope = Envelope {
            timestamp: MessageField::some(timestamp(SystemTime::now())),
            namespace: self.namespace.clone(),
            topic: event.topic().to_string(),
            event: MessageField::some(event.to_any()),
            ..Default::default()
        };
        let _ = tx.send(Item::Event(Box::new(envelope)));
    }

    /// Waits (bounded) until every event published so far was forwarded or dropped, so the
    /// TaskDelete of the last container is not lost when the daemon exits right after.
    pub async fn flush(&self, timeout: Duration) {
        let Some(tx) = &self.tx else { return };
        let (done, wait) = oneshot::channel();
        if tx.send(Item::Flush(done)).is_ok() {
            let _ = tokio::time::timeout(timeout, wait).await;
        }
    }
}

async fn connect(address: &str) -> Option<EventsClient> {
    let addr = if address.starts_with("unix://") {
        address.to_string()
    } else {
        format!("unix://{address}")
    };
    Client::connect(&addr).await.ok().map(EventsClient::new)
}

async fn forward_loop(address: String, mut rx: mpsc::UnboundedReceiver<Item>, log: Logger) {
    let mut client: Option<EventsClient> = None;
    while let Some(item) = rx.recv().await {
        let envelope = match item {
            Item::Event(e) => *e,
            Item::Flush(done) => {
                let _ = done.send(());
                continue;
            }
        };
        let req = ForwardRequest {
            envelope: MessageField::some(envelope),
            ..Default::default()
        };
        for attempt in 1..=MAX_ATTEMPTS {
            if client.is_none() {
                client = connect(&address).await;
            }
            let Some(c) = &client else {
                tokio::time::sleep(Duration::from_millis(100 * attempt as u64)).await;
                continue;
            };
            let ctx = ttrpc::context::with_timeout(Duration::from_secs(5).as_nanos() as i64);
            match c.forward(ctx, &req).await {
                Ok(_) => break,
                Err(e) => {
                    warn!(log, "forwarding event failed"; "topic" => &req.envelope.topic,
                        "attempt" => attempt, "error" => %e);
                    client = None;
                    tokio::time::sleep(Duration::from_millis(100 * attempt as u64)).await;
                }
            }
        }
    }
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
