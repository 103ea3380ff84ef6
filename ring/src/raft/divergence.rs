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
//! From ring version 2 the leader also commits what it found
//! ([`Command::MarkDiverged`](crate::core::Command::MarkDiverged)), so every member, and every
//! later leader, shows it. The member itself learns it from the leader's answer to its lease
//! renewal (it is granted nothing) or from that record once it applies it, and then
//! ([`OwnDivergence`]) vouches for nothing: its `/readyz` is not ready, its builtin DNS answers
//! SERVFAIL, its reads are stale, and it grants no vote while its log ends below what it had
//! acknowledged, so it never helps elect a leader that lacks those entries.
//!
//! What no member can see (ARCHITECTURE.md, "Diverged members"): a member that lost entries
//! and came back under a new leader that never saw its acknowledgement, before any leader
//! replicated to it again, looks like a follower that is merely behind.

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use super::types::NodeId;
pub use crate::core::Divergence;

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
pub fn conflict_after_ack(acknowledged: Option<u64>, conflict_index: u64) -> Option<Divergence> {
    let acked = acknowledged?;
    (conflict_index <= acked).then(|| Divergence {
        acknowledged_index: acked,
        reason: format!(
            "its log no longer holds index {conflict_index}, after it acknowledged up to index \
             {acked} to this leader: it lost entries it had acknowledged (a restored disk or data \
             directory, or a disk that lied about a flush); replace it with an empty data directory"
        ),
    })
}

/// The members this member found diverged while it led (not replicated; see the module docs).
#[derive(Debug, Default, Clone)]
pub struct Diverged(Arc<Mutex<BTreeMap<NodeId, Divergence>>>);

impl Diverged {
    /// Records that `id` (named `name`) diverged; the first reason stays. Logged once, as an
    /// error: the ring runs on fewer members than it shows until this one is replaced.
    pub fn mark(&self, id: NodeId, name: &str, divergence: Divergence) {
        let mut map = self.0.lock().unwrap_or_else(|e| e.into_inner());
        map.entry(id).or_insert_with(|| {
            tracing::error!(peer = id, peer_name = %name, "member diverged: {}", divergence.reason);
            divergence
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

/// What this member knows of its own divergence: set when the leader says so (in the answer to
/// a renewal) or the ring's record of it is applied here, for the life of the process (a
/// restart learns it again from the record or the leader). Shared by the agent's lease (which
/// then vouches for nothing), the reads, and the peer service (which then grants no vote while
/// the log ends below [`Divergence::acknowledged_index`]).
#[derive(Debug, Default, Clone)]
pub struct OwnDivergence(
    Arc<Mutex<Option<Divergence>>>,
    Arc<std::sync::atomic::AtomicBool>,
);

impl OwnDivergence {
    /// Records that this member diverged; the first finding stays. Logged once, as an error.
    pub fn learn(&self, divergence: &Divergence) {
        let mut own = self.0.lock().unwrap_or_else(|e| e.into_inner());
        if own.is_none() {
            tracing::error!(
                acknowledged_index = divergence.acknowledged_index,
                "this member diverged, it vouches for nothing and grants no vote until its log \
                 holds what it acknowledged; replace it (deploy/README.md, \"A member that \
                 diverged\"): {}",
                divergence.reason
            );
            *own = Some(divergence.clone());
            self.1.store(true, Ordering::SeqCst);
        }
    }

    /// Whether this member diverged (a load, for the paths every DNS query and readiness
    /// check takes; [`Self::get`] says why).
    pub fn is_set(&self) -> bool {
        self.1.load(Ordering::SeqCst)
    }

    /// Whether this member diverged, and why.
    pub fn get(&self) -> Option<Divergence> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Why this member grants no vote now (its log ends at `last_log_index`), if it does not.
    pub fn refuses_vote(&self, last_log_index: Option<u64>) -> Option<String> {
        let own = self.get()?;
        let last = last_log_index.unwrap_or(0);
        (last < own.acknowledged_index).then(|| {
            format!(
                "this member lost entries it had acknowledged (its log ends at index {last}, it \
                 had acknowledged up to {}): it grants no vote until its log holds them again",
                own.acknowledged_index
            )
        })
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
        assert_eq!(why.acknowledged_index, 39);
        assert!(
            why.reason.contains("index 39") && why.reason.contains("acknowledged"),
            "{why:?}"
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
        let found = |reason: &str| Divergence {
            acknowledged_index: 9,
            reason: reason.into(),
        };
        d.mark(2, "b", found("first"));
        d.mark(2, "b", found("second"));
        assert_eq!(d.get(2).map(|x| x.reason), Some("first".into()));
        assert_eq!(d.get(3), None);
        assert_eq!(d.all().len(), 1);
    }

    #[test]
    fn a_diverged_member_grants_no_vote_until_its_log_holds_what_it_acknowledged() {
        let own = OwnDivergence::default();
        assert_eq!(own.refuses_vote(Some(3)), None, "not diverged: votes");
        own.learn(&Divergence {
            acknowledged_index: 69,
            reason: "first".into(),
        });
        own.learn(&Divergence {
            acknowledged_index: 5,
            reason: "second".into(),
        });
        assert_eq!(own.get().map(|d| d.acknowledged_index), Some(69));
        let why = own.refuses_vote(Some(30)).expect("refused");
        assert!(
            why.contains("ends at index 30") && why.contains("69"),
            "{why}"
        );
        assert!(own.refuses_vote(None).is_some());
        assert!(own.refuses_vote(Some(68)).is_some());
        // Caught up again: its vote protects those entries like any member's.
        assert_eq!(own.refuses_vote(Some(69)), None);
        assert_eq!(own.refuses_vote(Some(400)), None);
    }
}
