//! Reads that say how fresh they are.
//!
//! Every Admin read (`Status`, `MemberList`, `ControlPlaneList`, `ControlPlaneGet`, `History`)
//! first asks [`Reads::linearize`]. By default that is a **ReadIndex read**, the one etcd and
//! openraft use:
//!
//! 1. the leader confirms with a quorum that it still leads (a heartbeat round every member of
//!    that quorum accepted after the request arrived) and names its read index: the end of the
//!    log it had committed by then (openraft's `get_read_linearizer(ReadPolicy::ReadIndex)`);
//!    a follower asks the leader for it over the peer port (the `ReadIndex` RPC);
//! 2. the answering member waits until it has applied up to that index, then reads its state.
//!
//! Every write acknowledged before the request arrived was committed at an index at or below
//! the read index, so the answer holds it: the read is linearizable, on any member.
//!
//! When that cannot be done within [`Timing::read_index_wait_ms`] (no leader known, the leader
//! unreachable or without a quorum, this member too far behind), or when the client asked for a
//! stale read, the member answers from its own state and says so in
//! [`pb::ReadFreshness`]: how long ago it last heard from a leader, and which index it had
//! applied. A member cut off from the quorum still answers, never silently stale.

use std::sync::Arc;
use std::time::{Duration, Instant};

use openraft::ServerState;
use openraft::type_config::async_runtime::instant::Instant as _;
use openraft::type_config::async_runtime::watch::WatchReceiver;

use crate::config::Timing;
use crate::pb;
use crate::raft::contact::LeaderContact;
use crate::raft::network::{PeerNetwork, PeerPool};
use crate::raft::{NodeId, RaftNode, StateMachineStore};

/// Why a read could not be linearized (the text goes to the client as `stale_reason`).
type StaleReason = String;

/// The reason a client that asked for a stale read gets.
pub const ASKED_FOR_STALE: &str = "asked for a stale read";

/// Linearizes the Admin reads of one member.
pub struct Reads {
    me: NodeId,
    raft: RaftNode,
    sm: StateMachineStore,
    pool: Arc<PeerPool>,
    contact: LeaderContact,
    wait: Duration,
}

impl Reads {
    /// The reads of member `me`.
    pub fn new(
        me: NodeId,
        raft: RaftNode,
        sm: StateMachineStore,
        pool: Arc<PeerPool>,
        contact: LeaderContact,
        timing: &Timing,
    ) -> Self {
        Self {
            me,
            raft,
            sm,
            pool,
            contact,
            wait: Duration::from_millis(timing.read_index_wait_ms()),
        }
    }

    /// Makes the read that follows linearizable unless `stale` is asked or it cannot be done in
    /// time; returns what the answer must say about its freshness. Read the state after this.
    pub async fn linearize(&self, stale: bool) -> pb::ReadFreshness {
        if stale {
            return self.stale(ASKED_FOR_STALE.to_string());
        }
        if let Some(own) = self.pool.own_divergence().get() {
            return self.stale(format!(
                "this member diverged, its state is not vouched for: {}",
                own.reason
            ));
        }
        let started = Instant::now();
        let index = match tokio::time::timeout(self.wait, self.read_index()).await {
            Ok(Ok(index)) => index,
            Ok(Err(reason)) => return self.stale(reason),
            Err(_) => {
                return self.stale(format!(
                    "no read index from the leader within {} ms",
                    self.wait.as_millis()
                ));
            }
        };
        let rest = self.wait.saturating_sub(started.elapsed());
        let mut applied = self.sm.watch_applied();
        match tokio::time::timeout(rest, applied.wait_for(|i| *i >= index)).await {
            Ok(Ok(_)) => {
                let applied_index = self.sm.read(|a| a.applied_index());
                debug_assert!(applied_index >= index, "waited for {index}");
                pb::ReadFreshness {
                    linearizable: true,
                    read_index: index,
                    applied_index,
                    leader_contact_ms_ago: self.contact_ms_ago(),
                    stale_reason: String::new(),
                }
            }
            _ => {
                let at = self.sm.read(|a| a.applied_index());
                self.stale(format!(
                    "applied up to index {at} only, short of the leader's read index {index}, within {} ms",
                    self.wait.as_millis()
                ))
            }
        }
    }

    /// The leader's read index: asked of the local Raft on the leader, of the leader over the
    /// peer port on a follower.
    async fn read_index(&self) -> Result<u64, StaleReason> {
        let metrics = self
            .raft
            .wait(Some(self.wait))
            .metrics(|m| m.current_leader.is_some(), "a leader is known")
            .await
            .map_err(|_| format!("no leader known within {} ms", self.wait.as_millis()))?;
        let leader = metrics.current_leader.expect("waited for a leader");
        if leader == self.me && metrics.state == ServerState::Leader {
            let linearizer = self
                .raft
                .get_read_linearizer(openraft::ReadPolicy::ReadIndex)
                .await
                .map_err(|e| format!("this member could not confirm it leads: {e}"))?;
            return Ok(linearizer.read_log_id().index());
        }
        let node = metrics
            .membership_config
            .membership()
            .get_node(&leader)
            .cloned()
            .ok_or_else(|| format!("leader {leader} has no known address"))?;
        let reply = PeerNetwork::new(self.me, self.pool.clone())
            .client(leader, &node)
            .read_index(self.wait)
            .await
            .map_err(|e| format!("leader {leader} gave no read index: {e}"))?;
        Ok(reply.index)
    }

    fn stale(&self, reason: StaleReason) -> pb::ReadFreshness {
        pb::ReadFreshness {
            linearizable: false,
            read_index: 0,
            applied_index: self.sm.read(|a| a.applied_index()),
            leader_contact_ms_ago: self.contact_ms_ago(),
            stale_reason: reason,
        }
    }

    /// Milliseconds since this member last heard from a leader; on the leader, since a quorum
    /// last acknowledged it. -1 when never since it started.
    fn contact_ms_ago(&self) -> i64 {
        let since = {
            let metrics = self.raft.metrics();
            let m = metrics.borrow_watched();
            if m.state == ServerState::Leader {
                Some(m.last_quorum_acked.as_ref().map(|at| at.elapsed()))
            } else {
                None
            }
        };
        let since = since.unwrap_or_else(|| self.contact.since());
        since.map_or(-1, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
    }
}

/// The line a client prints for a read that is not linearizable, e.g. `stale: last heard from
/// the leader 1200 ms ago, applied index 57 (no leader known within 600 ms)`; `None` when it is.
pub fn stale_line(freshness: Option<&pb::ReadFreshness>) -> Option<String> {
    let f = freshness?;
    if f.linearizable {
        return None;
    }
    let heard = if f.leader_contact_ms_ago < 0 {
        "never heard from a leader".to_string()
    } else {
        format!(
            "last heard from the leader {} ms ago",
            f.leader_contact_ms_ago
        )
    };
    Some(format!(
        "stale: {heard}, applied index {} ({})",
        f.applied_index, f.stale_reason
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_read_that_is_not_linearizable_gets_a_stale_line() {
        assert_eq!(stale_line(None), None);
        let fresh = pb::ReadFreshness {
            linearizable: true,
            read_index: 9,
            applied_index: 9,
            leader_contact_ms_ago: 3,
            stale_reason: String::new(),
        };
        assert_eq!(stale_line(Some(&fresh)), None);
        let stale = pb::ReadFreshness {
            linearizable: false,
            read_index: 0,
            applied_index: 57,
            leader_contact_ms_ago: 1200,
            stale_reason: ASKED_FOR_STALE.to_string(),
        };
        assert_eq!(
            stale_line(Some(&stale)).as_deref(),
            Some(
                "stale: last heard from the leader 1200 ms ago, applied index 57 (asked for a stale read)"
            )
        );
        let never = pb::ReadFreshness {
            leader_contact_ms_ago: -1,
            ..stale
        };
        assert!(
            stale_line(Some(&never))
                .unwrap()
                .starts_with("stale: never heard from a leader, applied index 57")
        );
    }
}
