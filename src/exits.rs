//! The order in which a container's exits are published, as containerd's runc shim keeps it:
//! **init's TaskExit is the last exit published for a container.**
//!
//! The protocol:
//! 1. An exec is counted from the moment its Start begins ([`ExitOrder::begin_exec`]), before
//!    the runtime is asked to run it, not when it is marked running: an exec whose `runc exec`
//!    is still in flight when init dies is waited for too.
//! 2. Its [`ExecSlot`] is released when its TaskExit has been published (or when its Start
//!    fails, or its future is dropped): whatever ends the exec, the count comes down.
//! 3. Once init has been reaped ([`ExitOrder::init_reaped`]), no exec may begin
//!    (FAILED_PRECONDITION "init process is not running").
//! 4. When init is reaped and the container shares a pid namespace with the host or the pod
//!    ([`kills_all_on_exit`]), the rest of its processes would outlive it: they are killed
//!    with `kill --all SIGKILL` (runc shim: `ShouldKillAllOnExit`). With a pid namespace of
//!    its own, the kernel has already killed them.
//! 5. Init's exit is recorded (Wait returns) and published only when the count is zero
//!    ([`ExitOrder::execs_done`]). There is no timer: the exec exits are sure to come, by 4.

use std::sync::Arc;

use serde::Deserialize;
use tokio::sync::watch;

#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    init_reaped: bool,
    running_execs: usize,
}

/// One container's exec count and whether its init has been reaped.
#[derive(Clone)]
pub struct ExitOrder(Arc<watch::Sender<Counts>>);

impl Default for ExitOrder {
    fn default() -> Self {
        Self(Arc::new(watch::channel(Counts::default()).0))
    }
}

/// Counts one exec until dropped (after its TaskExit is published, or when its Start fails).
pub struct ExecSlot(ExitOrder);

impl Drop for ExecSlot {
    fn drop(&mut self) {
        self.0
             .0
            .send_modify(|c| c.running_execs = c.running_execs.saturating_sub(1));
    }
}

impl ExitOrder {
    /// Counts an exec whose Start begins; `None` once init has been reaped.
    pub fn begin_exec(&self) -> Option<ExecSlot> {
        let mut counted = false;
        self.0.send_if_modified(|c| {
            if !c.init_reaped {
                c.running_execs += 1;
                counted = true;
            }
            counted
        });
        counted.then(|| ExecSlot(self.clone()))
    }

    /// Marks init reaped: no exec begins from here on.
    pub fn set_init_reaped(&self) {
        self.0.send_modify(|c| c.init_reaped = true);
    }

    pub fn init_reaped(&self) -> bool {
        self.0.borrow().init_reaped
    }

    /// Resolves when no counted exec is left.
    pub async fn execs_done(&self) {
        let mut rx = self.0.subscribe();
        let _ = rx.wait_for(|c| c.running_execs == 0).await;
    }
}

/// True when the container has no pid namespace of its own (none in the spec, or one joined by
/// `path`): its other processes outlive init unless killed. An unreadable spec counts as shared,
/// as in the runc shim.
pub fn kills_all_on_exit(config_json: &[u8]) -> bool {
    #[derive(Deserialize)]
    struct Doc {
        linux: Option<Linux>,
    }
    #[derive(Deserialize)]
    struct Linux {
        namespaces: Option<Vec<Namespace>>,
    }
    #[derive(Deserialize)]
    struct Namespace {
        #[serde(rename = "type")]
        kind: String,
        path: Option<String>,
    }
    let Ok(doc) = serde_json::from_slice::<Doc>(config_json) else {
        return true;
    };
    let namespaces = doc.linux.and_then(|l| l.namespaces).unwrap_or_default();
    !namespaces
        .iter()
        .any(|ns| ns.kind == "pid" && ns.path.as_deref().unwrap_or("").is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pid_namespace_sharing() {
        let own = br#"{"linux":{"namespaces":[{"type":"mount"},{"type":"pid"}]}}"#;
        assert!(!kills_all_on_exit(own));
        let joined = br#"{"linux":{"namespaces":[{"type":"pid","path":"/proc/1/ns/pid"}]}}"#;
        assert!(kills_all_on_exit(joined));
        assert!(kills_all_on_exit(br#"{"linux":{"namespaces":[{"type":"mount"}]}}"#));
        assert!(kills_all_on_exit(br#"{"linux":{}}"#));
        assert!(kills_all_on_exit(b"{}"));
        assert!(kills_all_on_exit(b"not json"));
    }

    #[tokio::test(start_paused = true)]
    async fn init_waits_for_every_counted_exec_and_then_refuses_new_ones() {
        let order = ExitOrder::default();
        let a = order.begin_exec().unwrap();
        let b = order.begin_exec().unwrap();
        order.set_init_reaped();
        assert!(order.begin_exec().is_none());
        let done = order.execs_done();
        tokio::pin!(done);
        drop(a);
        assert!(futures_now(&mut done).await.is_none(), "one exec is still counted");
        drop(b);
        assert!(futures_now(&mut done).await.is_some());
    }

    async fn futures_now<F: std::future::Future + Unpin>(f: &mut F) -> Option<F::Output> {
        tokio::time::timeout(std::time::Duration::from_millis(1), f).await.ok()
    }
}
