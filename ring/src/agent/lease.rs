//! This member's own lease as the agent's helpers see it: [`OwnLease`] (the deadline of the
//! last grant, for the builtin DNS server), and waiting for a lease deadline held in a watch
//! ([`lease_runs_out`], [`lease_ran_out`]), as the etcd driver, its backups and the gate do.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use tokio::sync::watch;

use crate::raft::divergence::OwnDivergence;
use crate::time::monotonic_ms;

/// What a member knows of its own lease, for those who must not act on stale state after it
/// runs out (the builtin DNS server): the deadline of the last grant, and the leader's applied
/// index when it gave it.
#[derive(Debug, Default)]
pub struct OwnLease {
    deadline_ms: AtomicU64,
    applied_index: AtomicU64,
    /// Set when this member diverged: it then vouches for nothing, whatever its lease.
    divergence: OwnDivergence,
}

impl OwnLease {
    /// A lease that vouches for nothing once `divergence` is set.
    pub fn new(divergence: OwnDivergence) -> Self {
        Self {
            divergence,
            ..Self::default()
        }
    }

    /// Whether this member diverged (then it vouches for nothing).
    pub fn divergence(&self) -> &OwnDivergence {
        &self.divergence
    }

    /// Records a grant that runs until `deadline_ms` (monotonic clock), read by the leader at
    /// `applied_index`.
    pub fn record(&self, deadline_ms: u64, applied_index: u64) {
        // The index first: a reader that sees the new deadline sees at least this index.
        self.applied_index
            .fetch_max(applied_index, Ordering::SeqCst);
        self.deadline_ms.fetch_max(deadline_ms, Ordering::SeqCst);
    }

    /// Whether state applied up to `applied_index` may be vouched for at `now_ms` (monotonic):
    /// the lease is current, the state is at least as fresh as the last grant, and this member
    /// did not diverge.
    pub fn vouches(&self, now_ms: u64, applied_index: u64) -> bool {
        !self.divergence.is_set()
            && now_ms < self.deadline_ms.load(Ordering::SeqCst)
            && applied_index >= self.applied_index.load(Ordering::SeqCst)
    }

    /// Milliseconds of lease left at `now_ms` (0 when it ran out).
    pub fn remaining_ms(&self, now_ms: u64) -> u64 {
        self.deadline_ms
            .load(Ordering::SeqCst)
            .saturating_sub(now_ms)
    }
}

/// Resolves when less than `margin_ms` of the lease is left: `deadline` is the lease's
/// deadline on the monotonic clock ([`monotonic_ms`]), moved later by each renewal.
pub(crate) async fn lease_runs_out(deadline: &mut watch::Receiver<u64>, margin_ms: u64) {
    loop {
        let at = deadline.borrow_and_update().saturating_sub(margin_ms);
        let now = monotonic_ms();
        if now >= at {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(at - now)) => {}
            changed = deadline.changed() => {
                if changed.is_err() {
                    // Nobody renews any more: the last deadline stands.
                    tokio::time::sleep(Duration::from_millis(at - now)).await;
                    return;
                }
            }
        }
    }
}

/// Whether the lease whose deadline (monotonic ms) `deadline` holds has run out.
pub(crate) fn lease_ran_out(deadline: &watch::Receiver<u64>) -> bool {
    monotonic_ms() >= *deadline.borrow()
}
