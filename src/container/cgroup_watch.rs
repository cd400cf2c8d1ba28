//! A container's cgroup once located, and its OOM kills counted against the kernel's counter.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crate::cgroups::{CgroupError, ContainerCgroup};

/// `parent_ooms` when there is no parent count to fall back on.
const NO_PARENT: u64 = u64::MAX;

pub(super) struct CgroupWatch {
    cgroup: Option<ContainerCgroup>,
    /// OOM kills already reported (TaskOOM published), against the kernel's counter.
    ooms_reported: AtomicU64,
    /// v2: the parent's `oom_kill` as of the last read of the cgroup's own ([`NO_PARENT`] when
    /// unknown).
    parent_ooms: AtomicU64,
    /// Set once any OOM kill hit the container.
    oom_killed: AtomicBool,
}

impl Default for CgroupWatch {
    /// No cgroup: no stats, no OOM events.
    fn default() -> Self {
        Self {
            cgroup: None,
            ooms_reported: AtomicU64::new(0),
            parent_ooms: AtomicU64::new(NO_PARENT),
            oom_killed: AtomicBool::new(false),
        }
    }
}

impl CgroupWatch {
    /// Watches `cgroup`, counting from the kills it already saw (blocking: reads cgroup files).
    pub(super) fn new(cgroup: ContainerCgroup) -> Self {
        let baseline = cgroup.oom_kills().unwrap_or(0);
        let parent = cgroup.parent_oom_kills().unwrap_or(NO_PARENT);
        Self {
            cgroup: Some(cgroup),
            ooms_reported: AtomicU64::new(baseline),
            parent_ooms: AtomicU64::new(parent),
            oom_killed: AtomicBool::new(false),
        }
    }

    pub(super) fn get(&self) -> Option<&ContainerCgroup> {
        self.cgroup.as_ref()
    }

    pub(super) fn oom_killed(&self) -> bool {
        self.oom_killed.load(Ordering::SeqCst)
    }

    /// New OOM kills since the last call.
    ///
    /// The systemd driver removes a container's scope as soon as it is empty, which on a busy
    /// node can be before the daemon reads the kill that emptied it. Once the cgroup is gone,
    /// a rise of the parent's (the pod slice's) hierarchical counter since the last read of
    /// the cgroup's own is that kill, counted once. A sibling killed in that same moment would
    /// be counted too: the price of not losing the kill.
    pub(super) fn take_new_ooms(&self) -> u64 {
        let Some(cg) = &self.cgroup else { return 0 };
        let new = match cg.oom_kills() {
            Ok(now) => {
                // After the cgroup's own read: a kill counted there is never counted again.
                self.parent_ooms
                    .store(cg.parent_oom_kills().unwrap_or(NO_PARENT), Ordering::SeqCst);
                now.saturating_sub(self.ooms_reported.swap(now, Ordering::SeqCst))
            }
            Err(CgroupError::Gone(_)) => {
                let base = self.parent_ooms.load(Ordering::SeqCst);
                match cg.parent_oom_kills() {
                    Some(now) if base != NO_PARENT && now > base => {
                        self.parent_ooms.store(now, Ordering::SeqCst);
                        1
                    }
                    _ => 0,
                }
            }
            Err(_) => 0,
        };
        if new > 0 {
            self.oom_killed.store(true, Ordering::SeqCst);
        }
        new
    }
}
