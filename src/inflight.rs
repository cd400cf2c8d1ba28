//! Ids with a Create under way. Each is held by a guard that clears it however the request
//! ends (an error, a panic, or its future dropped at a client's deadline), so a cancelled
//! Create can never leave an id that keeps the daemon from exiting.

use std::collections::HashSet;
use std::sync::{Mutex, MutexGuard};

use tokio::sync::Notify;

/// The set of ids in flight, and a signal for whoever waits for one to end.
#[derive(Default)]
pub struct InFlight {
    ids: Mutex<HashSet<String>>,
    ended: Notify,
}

/// Holds an id in its [`InFlight`] set until dropped.
pub struct InFlightGuard<'a> {
    set: &'a InFlight,
    id: String,
}

impl Drop for InFlightGuard<'_> {
    fn drop(&mut self) {
        self.set.lock().remove(&self.id);
        self.set.ended.notify_waiters();
    }
}

impl InFlight {
    fn lock(&self) -> MutexGuard<'_, HashSet<String>> {
        self.ids.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Marks `id` as in flight, unless it already is or `taken` (checked under the same lock)
    /// says it is in use elsewhere.
    pub fn begin(&self, id: &str, taken: impl FnOnce() -> bool) -> Option<InFlightGuard<'_>> {
        let mut ids = self.lock();
        if taken() || !ids.insert(id.to_string()) {
            return None;
        }
        Some(InFlightGuard {
            set: self,
            id: id.to_string(),
        })
    }

    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    /// Waits until `id` is not in flight.
    pub async fn settled(&self, id: &str) {
        loop {
            let ended = self.ended.notified();
            tokio::pin!(ended);
            ended.as_mut().enable();
            if !self.lock().contains(id) {
                return;
            }
            ended.await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[tokio::test(start_paused = true)]
    async fn a_dropped_future_frees_its_id_and_wakes_waiters() {
        let set = InFlight::default();
        assert!(set.begin("a", || true).is_none(), "taken elsewhere");
        let t0 = tokio::time::Instant::now();
        let work = async {
            let _guard = set.begin("a", || false).unwrap();
            tokio::time::sleep(Duration::from_secs(3600)).await;
        };
        let waiter = async {
            tokio::task::yield_now().await;
            assert!(set.begin("a", || false).is_none(), "duplicate while in flight");
            tokio::time::timeout(Duration::from_secs(60), set.settled("a")).await
        };
        // The work is dropped at its await point after 1 s, as ttrpc drops a handler.
        let (cancelled, settled) = tokio::join!(tokio::time::timeout(Duration::from_secs(1), work), waiter);
        assert!(cancelled.is_err());
        assert!(settled.is_ok(), "the id stayed in flight after its future was dropped");
        assert!(t0.elapsed() < Duration::from_secs(2));
        assert!(set.is_empty());
        assert!(set.begin("a", || false).is_some());
    }
}
