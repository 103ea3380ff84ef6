//! What the leader does on its own, on every tick:
//!
//! 1. **Register the founders**: right after formation the registry is empty; the leader
//!    commits a `Bootstrap` from the Raft membership (names, zones, addresses travel in it).
//! 2. **Converge membership to intent**: the registry is the operator's intent and the Raft
//!    configuration follows it: a registered member missing from Raft is added as a learner, a
//!    learner the operator promoted becomes a voter once caught up, a retired id still in the
//!    configuration is removed. This finishes operations a leader crash interrupted.
//! 3. **Judge health**: from the last time each member acknowledged the leader (replication and
//!    heartbeats), counted from this leader's own election for members it has not heard from
//!    yet. A change (`healthy` -> `suspect` -> `lost`, and back) is committed as an event.
//!
//! Only the leader acts; the decisions themselves are small pure functions tested below.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use openraft::ServerState;
use openraft::type_config::async_runtime::watch::WatchReceiver;
use tokio::sync::watch;

use crate::config::Timing;
use crate::core::{Command, Health, MemberSpec, Proposal, Role};
use crate::membership::MembershipChanger;
use crate::raft::types::RaftMetricsOf;
use crate::raft::{NodeId, RaftNode, StateMachineStore};

/// The leader's duties of one member.
pub struct Duties {
    me: NodeId,
    actor: String,
    raft: RaftNode,
    membership: MembershipChanger,
    state: StateMachineStore,
    timing: Timing,
    leader_since: Option<Instant>,
}

impl Duties {
    /// Duties of member `me` (named `name`).
    pub fn new(
        me: NodeId,
        name: String,
        raft: RaftNode,
        membership: MembershipChanger,
        state: StateMachineStore,
        timing: Timing,
    ) -> Self {
        Self {
            me,
            actor: format!("ringd/{name}"),
            raft,
            membership,
            state,
            timing,
            leader_since: None,
        }
    }

    fn tick_interval(&self) -> Duration {
        Duration::from_millis((self.timing.heartbeat_ms * 2).max(20))
    }

    async fn propose(&self, command: Command, reason: String) {
        let action = command.action();
        let proposal = Proposal {
            command,
            at_ms: crate::time::unix_ms(),
            actor: self.actor.clone(),
            reason,
        };
        match self.raft.client_write(proposal).await {
            Ok(resp) => {
                if let Err(e) = resp.data {
                    tracing::warn!(action, "duty refused: {e}");
                }
            }
            Err(e) => tracing::debug!(action, "duty not committed: {e}"),
        }
    }

    async fn tick(&mut self) {
        let metrics: RaftMetricsOf = self.raft.metrics().borrow_watched().clone();
        if metrics.state != ServerState::Leader {
            self.leader_since = None;
            return;
        }
        let since = *self.leader_since.get_or_insert_with(Instant::now);
        let applied = self.state.read(Clone::clone);
        let membership = metrics.membership_config.membership().clone();

        // 1. Register the founders.
        if !applied.state.bootstrapped {
            let members: Vec<MemberSpec> = membership
                .nodes()
                .map(|(id, n)| MemberSpec {
                    id: *id,
                    name: n.name.clone(),
                    zone: n.zone.clone(),
                    address: n.address.clone(),
                    admin_address: n.admin_address.clone(),
                })
                .collect();
            self.propose(Command::Bootstrap { members }, "ring formed".into())
                .await;
            return;
        }

        // 2. Converge the Raft configuration to the registry.
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let in_raft: BTreeSet<NodeId> = membership.nodes().map(|(id, _)| *id).collect();
        for m in applied.state.members.values() {
            if !in_raft.contains(&m.id) {
                let node = crate::raft::MemberNode {
                    name: m.name.clone(),
                    zone: m.zone.clone(),
                    address: m.address.clone(),
                    admin_address: m.admin_address.clone(),
                };
                if let Err(e) = self.membership.add_learner(m.id, node).await {
                    tracing::debug!(member = m.id, "re-adding learner: {e}");
                }
            } else if m.wants_voter && m.role == Role::Learner && !voters.contains(&m.id) {
                let caught_up = caught_up(&metrics, m.id);
                if caught_up {
                    if let Err(e) = self.membership.promote(m.id).await {
                        tracing::debug!(member = m.id, "finishing promotion: {e}");
                    }
                }
            }
        }
        for id in in_raft.intersection(&applied.state.retired_ids) {
            if let Err(e) = self.membership.remove(*id).await {
                tracing::debug!(member = id, "finishing removal: {e}");
            }
        }

        // 3. Judge health.
        for m in applied.state.members.values() {
            let silent_ms = if m.id == self.me {
                0
            } else {
                silence_ms(&metrics, m.id, since)
            };
            let health = judge(silent_ms, &self.timing);
            if health != m.health {
                let reason = if m.id == self.me {
                    "the leader itself".to_string()
                } else {
                    format!("last contact {silent_ms} ms ago")
                };
                self.propose(Command::SetHealth { id: m.id, health }, reason)
                    .await;
            }
        }
    }
}

/// How long the leader has not heard from member `id`, counting from the leader's own election
/// when it has not heard from it at all.
fn silence_ms(metrics: &RaftMetricsOf, id: NodeId, leader_since: Instant) -> u64 {
    use openraft::type_config::async_runtime::Instant as _;
    let last_ack = metrics
        .heartbeat
        .as_ref()
        .and_then(|h| h.get(&id).cloned().flatten());
    let elapsed = match last_ack {
        Some(at) => at.elapsed(),
        None => leader_since.elapsed(),
    };
    u64::try_from(elapsed.as_millis()).unwrap_or(u64::MAX)
}

fn caught_up(metrics: &RaftMetricsOf, id: NodeId) -> bool {
    let committed = metrics
        .local_committed
        .as_ref()
        .map(|l| l.index)
        .unwrap_or(0);
    metrics
        .replication
        .as_ref()
        .and_then(|r| r.get(&id).cloned().flatten())
        .is_some_and(|l| l.index >= committed)
}

/// Health from the time since last contact.
pub fn judge(silent_ms: u64, timing: &Timing) -> Health {
    if silent_ms >= timing.member_lost_ms {
        Health::Lost
    } else if silent_ms >= timing.member_suspect_ms {
        Health::Suspect
    } else {
        Health::Healthy
    }
}

/// Runs the duties until `stopped` turns true.
pub async fn run(mut duties: Duties, mut stopped: watch::Receiver<bool>) {
    let mut interval = tokio::time::interval(duties.tick_interval());
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Also act at once when this member's Raft state changes (e.g. it just became leader).
    let mut server_state = duties.raft.server_metrics();
    loop {
        tokio::select! {
            _ = interval.tick() => duties.tick().await,
            changed = server_state.changed() => {
                if changed.is_err() {
                    return;
                }
                duties.tick().await;
            }
            _ = async { let _ = stopped.wait_for(|s| *s).await; } => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn health_thresholds() {
        let t = Timing::loopback();
        assert_eq!(judge(0, &t), Health::Healthy);
        assert_eq!(judge(t.member_suspect_ms - 1, &t), Health::Healthy);
        assert_eq!(judge(t.member_suspect_ms, &t), Health::Suspect);
        assert_eq!(judge(t.member_lost_ms - 1, &t), Health::Suspect);
        assert_eq!(judge(t.member_lost_ms, &t), Health::Lost);
    }
}
