//! Followers whose log went back behind what they acknowledged (issue 42).
//!
//! Raft is safe only while no member loses what it acknowledged: a commit counted its
//! acknowledgement, and an election may count its vote. A VM restored from a disk snapshot, a
//! data directory copied back, a disk whose write cache lied all break that, and the member
//! itself cannot tell (its log looks whole to it, only shorter).
//!
//! The leader can: within one replication session (one [`Acknowledged`] per openraft network
//! client, so per leadership of one follower), the leader's log below what the follower
//! acknowledged never changes, and by Raft's log matching a follower that acknowledged index
//! `a` holds the leader's entries up to `a`. So an answer *conflict at `p`* with `p <= a` means
//! the follower lost entries it had acknowledged: it **diverged**. [`conflict_after_ack`]
//! is that rule; [`Diverged`] is the leader's record of such members, which keeps them judged
//! `lost` (what they host moves) and shows them as `diverged` in the status, the metric
//! `garden_ring_member_diverged` and the alert `RingMemberDiverged`, until the member is
//! replaced (`ringctl member remove`, then added anew with an empty data directory).
//!
//! What no member can see (ARCHITECTURE.md, "Diverged members"): a member that lost entries
//! and came back under a new leader that never saw its acknowledgement, before any leader
//! replicated to it again, looks like a follower that is merely behind. The record is the
//! leader's own and is not replicated (that needs a new command, so a ring version: issue 43).

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::types::NodeId;

/// The highest log index a follower acknowledged in one replication session (a matching log
/// id it answered), shared by the clones of that session's client.
#[derive(Debug, Default, Clone)]
pub struct Acknowledged(Arc<AtomicU64>);

impl Acknowledged {
    /// Records that the follower answered a match at `index`.
    pub fn matched(&self, index: u64) {
        self.0.fetch_max(index.saturating_add(1), Ordering::Relaxed);
    }

    /// The highest index it acknowledged, if any.
    pub fn highest(&self) -> Option<u64> {
        self.0.load(Ordering::Relaxed).checked_sub(1)
    }
}

/// Why a conflict at `conflict_index`, answered by a follower that acknowledged up to
/// `acknowledged`, means it lost acknowledged entries; `None` when it is an ordinary conflict
/// (the follower is only behind, or holds entries of an older leader the current one does not).
pub fn conflict_after_ack(acknowledged: Option<u64>, conflict_index: u64) -> Option<String> {
    let acked = acknowledged?;
    (conflict_index <= acked).then(|| {
        format!(
            "its log no longer holds index {conflict_index}, after it acknowledged up to index \
             {acked} to this leader: it lost entries it had acknowledged (a restored disk or data \
             directory, or a disk that lied about a flush); replace it with an empty data directory"
        )
    })
}

/// One diverged member, as the leader found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Divergence {
    /// The reason, one line.
    pub reason: String,
}

/// The members this member found diverged while it led (not replicated; see the module docs).
#[derive(Debug, Default, Clone)]
pub struct Diverged(Arc<Mutex<BTreeMap<NodeId, Divergence>>>);

impl Diverged {
    /// Records that `id` (named `name`) diverged; the first reason stays. Logged once, as an
    /// error: the ring runs on fewer members than it shows until this one is replaced.
    pub fn mark(&self, id: NodeId, name: &str, reason: String) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(id).or_insert_with(|| {
            tracing::error!(peer = id, peer_name = %name, "member diverged: {reason}");
            Divergence { reason }
        });
    }

    /// Whether `id` diverged, and why.
    pub fn get(&self, id: NodeId) -> Option<Divergence> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(&id)
            .cloned()
    }

    /// Every diverged member.
    pub fn all(&self) -> BTreeMap<NodeId, Divergence> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_conflict_at_or_below_what_was_acknowledged_is_divergence() {
        // Never acknowledged anything in this session: only behind.
        assert_eq!(conflict_after_ack(None, 5), None);
        // Acknowledged 39, asked for 40 with prev 39 -> conflict at 39: it lost 39.
        let why = conflict_after_ack(Some(39), 39).expect("diverged");
        assert!(
            why.contains("index 39") && why.contains("acknowledged"),
            "{why}"
        );
        assert!(conflict_after_ack(Some(39), 7).is_some());
        // Conflict above what it acknowledged: an ordinary probe.
        assert_eq!(conflict_after_ack(Some(39), 40), None);
    }

    #[test]
    fn acknowledgements_only_rise_and_the_first_reason_stays() {
        let a = Acknowledged::default();
        assert_eq!(a.highest(), None);
        a.matched(0);
        assert_eq!(a.highest(), Some(0));
        a.matched(9);
        a.clone().matched(4);
        assert_eq!(a.highest(), Some(9));
        let d = Diverged::default();
        d.mark(2, "b", "first".into());
        d.mark(2, "b", "second".into());
        assert_eq!(d.get(2).map(|x| x.reason), Some("first".into()));
        assert_eq!(d.get(3), None);
        assert_eq!(d.all().len(), 1);
    }
}
