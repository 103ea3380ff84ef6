//! What the leader does on its own, on every tick:
//!
//! 1. **Register the founders**: right after formation the registry is empty; the leader
//!    commits a `Bootstrap` from the Raft membership (names, zones, addresses travel in it).
//! 2. **Converge membership to intent**: the registry is the operator's intent and the Raft
//!    configuration follows it: a registered member missing from Raft is added as a learner, a
//!    learner the operator promoted becomes a voter once caught up, a retired id still in the
//!    configuration is removed. This finishes operations a leader crash interrupted.
//! 3. **Judge health**: from the last time each member acknowledged the leader (replication and
//!    heartbeats) or renewed its lease, counted for members it has not heard from yet from its
//!    own election, or earlier: from the last moment an earlier leader could have granted a
//!    lease, as a quorum's renewals tell ([`crate::raft::contact`]). A change (`healthy` ->
//!    `suspect` -> `lost`, and back) is committed as an event.
//! 4. **Heal**: propose what [`crate::core::controller::decide`] says: move the control planes
//!    of lost members, place unplaced ones, release fences, record what serves.
//! 5. **Raise the ring's version** once every member of the configuration runs a binary that
//!    supports the next one, unless the operator holds it (`ringctl upgrade hold`, or
//!    `[upgrade] finalize = "manual"`; see [`crate::upgrade`]).
//!
//! And what any other member does:
//!
//! 6. **Check it still belongs**: a member that has heard from no leader for `member_lost_ms`
//!    pings its peers. A peer refuses a retired id with "member-removed", which stops `ringd`
//!    (a removed learner would otherwise never find out: nobody sends it anything any more).
//!
//! The decisions themselves are pure functions of the core ([`crate::core::health::judge`],
//! [`crate::core::controller::decide`]), tested there.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use futures::StreamExt as _;
use openraft::ServerState;
use openraft::type_config::async_runtime::watch::WatchReceiver;
use tokio::sync::watch;
use tracing::Instrument as _;

use crate::config::{Finalize, Timing};
use crate::core::health::{judge, judge_diverged};
use crate::core::{Command, MemberSpec, Proposal, Role};
use crate::leases::LeaseDesk;
use crate::membership::MembershipChanger;
use crate::raft::contact::LeaderContact;
use crate::raft::network::PeerNetwork;
use crate::raft::types::RaftMetricsOf;
use crate::raft::{NodeId, RaftNode, StateMachineStore};

/// Most rounds of the controller's decisions in one duties tick.
const HEAL_ROUNDS_PER_TICK: usize = 3;

/// Most of the controller's proposals in flight at once.
const MAX_PROPOSALS_IN_FLIGHT: usize = 256;

/// The leader's duties of one member.
pub struct Duties {
    me: NodeId,
    actor: String,
    raft: RaftNode,
    membership: MembershipChanger,
    state: StateMachineStore,
    timing: Timing,
    dns_zone: Option<String>,
    network: PeerNetwork,
    contact: LeaderContact,
    desk: std::sync::Arc<LeaseDesk>,
    leader_since: Option<Instant>,
    last_probe: Option<Instant>,
    started: Instant,
    seen_leader: Option<(Option<NodeId>, u64)>,
    finalize: Finalize,
}

/// The parts of a running member the duties work with.
pub struct Parts {
    /// The Raft node.
    pub raft: RaftNode,
    /// The only path to Raft configuration changes.
    pub membership: MembershipChanger,
    /// The applied state.
    pub state: StateMachineStore,
    /// Clients to the peers.
    pub network: PeerNetwork,
    /// When a leader last reached this member.
    pub contact: LeaderContact,
    /// Leases and what the leader observed.
    pub desk: std::sync::Arc<LeaseDesk>,
    /// When the ring's version is raised.
    pub finalize: Finalize,
}

impl Duties {
    /// The duties of member `me` (named `name`); `dns_zone` is recorded when this member
    /// registers the founders.
    pub fn new(
        me: NodeId,
        name: &str,
        timing: Timing,
        dns_zone: Option<String>,
        parts: Parts,
    ) -> Self {
        let Parts {
            raft,
            membership,
            state,
            network,
            contact,
            desk,
            finalize,
        } = parts;
        Self {
            me,
            actor: format!("ringd/{name}"),
            raft,
            membership,
            state,
            timing,
            dns_zone,
            network,
            contact,
            desk,
            leader_since: None,
            last_probe: None,
            started: Instant::now(),
            seen_leader: None,
            finalize,
        }
    }

    fn tick_interval(&self) -> Duration {
        Duration::from_millis(self.timing.duties_interval_ms())
    }

    async fn propose(&self, command: Command, reason: String) {
        let action = command.action();
        // The gate of rolling upgrades: nothing a member of an older release cannot read.
        if let Err(e) = self
            .state
            .read(|a| a.state.settings.ring_version.admits(&command))
        {
            tracing::error!(action, "duty not proposed: {e}");
            return;
        }
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

    /// Logs leadership changes once each (openraft's own logs are filtered by default).
    fn note_leadership(&mut self, metrics: &RaftMetricsOf) {
        let now = (metrics.current_leader, metrics.current_term);
        if self.seen_leader != Some(now) {
            match now.0 {
                Some(leader) if leader == self.me => {
                    tracing::info!(term = now.1, "this member is the leader")
                }
                Some(leader) => tracing::info!(term = now.1, leader, "following leader {leader}"),
                None => tracing::info!(term = now.1, "no leader known"),
            }
            self.seen_leader = Some(now);
        }
    }

    async fn tick(&mut self) {
        let metrics: RaftMetricsOf = self.raft.metrics().borrow_watched().clone();
        self.note_leadership(&metrics);
        if metrics.state != ServerState::Leader {
            if self.leader_since.take().is_some() {
                self.desk.reset();
            }
            self.check_still_member(&metrics).await;
            return;
        }
        let since = *self.leader_since.get_or_insert_with(Instant::now);
        // Only what the duties need: never clone the control planes or the history per tick.
        let (bootstrapped, members, retired_ids) = self.state.read(|a| {
            (
                a.state.bootstrapped,
                a.state.members.clone(),
                a.state.retired_ids.clone(),
            )
        });
        let membership = metrics.membership_config.membership().clone();

        // 1. Register the founders.
        if !bootstrapped {
            let members: Vec<MemberSpec> = membership.nodes().map(|(id, n)| n.spec(*id)).collect();
            let dns_zone = self.dns_zone.clone();
            self.propose(
                Command::Bootstrap { members, dns_zone },
                "ring formed".into(),
            )
            .await;
            return;
        }

        // 2. Converge the Raft configuration to the registry.
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        let in_raft: BTreeSet<NodeId> = membership.nodes().map(|(id, _)| *id).collect();
        for m in members.values() {
            if !in_raft.contains(&m.id) {
                let node = crate::raft::MemberNode::from(&m.spec());
                if let Err(e) = self.membership.add_learner(m.id, node).await {
                    tracing::debug!(peer_id = m.id, "re-adding learner: {e}");
                }
            } else if m.wants_voter
                && m.role == Role::Learner
                && !voters.contains(&m.id)
                && caught_up(&metrics, m.id)
                && let Err(e) = self.membership.promote(m.id).await
            {
                tracing::debug!(peer_id = m.id, "finishing promotion: {e}");
            }
        }
        for id in in_raft.intersection(&retired_ids) {
            if let Err(e) = self.membership.remove(*id).await {
                tracing::debug!(peer_id = id, "finishing removal: {e}");
            }
        }

        // 3. Judge health. A member not heard from in this term is silent since this
        // election, or since the last moment an earlier leader could have granted it a lease
        // if a quorum told when that was (see `crate::raft::contact`; only with a single
        // configuration, whose majorities meet every quorum an earlier leader used).
        let earlier_silent_ms = if membership.get_joint_config().len() == 1 {
            self.desk
                .earlier_leaders_silent(metrics.current_term, &voters)
                .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        } else {
            None
        };
        for m in members.values() {
            let (last_ack_ms, since_election_ms) = if m.id == self.me {
                (Some(0), 0)
            } else {
                let (ack, since_election) = contact_ms(&metrics, m.id, since);
                let since_election = since_election.max(earlier_silent_ms.unwrap_or(0));
                let renewed = self
                    .desk
                    .since_renewal(m.id)
                    .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
                let last = match (ack, renewed) {
                    (Some(a), Some(r)) => Some(a.min(r)),
                    (a, r) => a.or(r),
                };
                (last, since_election)
            };
            // A member that lost entries it acknowledged is never healthy again (it is granted
            // nothing; lost, so that what it hosts moves, once its last grant ran out) until
            // it is replaced. What this leader found is committed for every member to see.
            let diverged = if m.id == self.me {
                None
            } else {
                self.note_divergence(m).await
            };
            let judged = match &diverged {
                Some(_) => {
                    let granted_ms = self
                        .desk
                        .since_renewal(m.id)
                        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX));
                    Some(judge_diverged(granted_ms, since_election_ms, &self.timing))
                }
                // A member that announced its restart is not judged lost for a while (only a
                // delay of the failover: always safe).
                None => match judge(last_ack_ms, since_election_ms, &self.timing) {
                    Some(crate::core::Health::Lost) if self.desk.restarting(m.id) => {
                        Some(crate::core::Health::Suspect)
                    }
                    judged => judged,
                },
            };
            let Some(health) = judged else {
                continue;
            };
            if health != m.health {
                let reason = match last_ack_ms {
                    _ if diverged.is_some() => format!(
                        "diverged: {}",
                        diverged
                            .as_ref()
                            .map(|d| d.reason.as_str())
                            .unwrap_or_default()
                    ),
                    _ if m.id == self.me => "the leader itself".to_string(),
                    Some(ms) if self.desk.restarting(m.id) => {
                        format!("last contact {ms} ms ago; it announced its restart")
                    }
                    Some(ms) => format!("last contact {ms} ms ago"),
                    None => match earlier_silent_ms {
                        Some(ms) if ms >= since_election_ms => format!(
                            "no contact in this term, and no earlier leader could grant a \
                             lease for {ms} ms (a quorum's last contact with one)"
                        ),
                        _ => format!(
                            "no contact since this leader was elected {since_election_ms} ms ago"
                        ),
                    },
                };
                tracing::info!(peer = %m.name, peer_id = m.id, "health {} -> {health}: {reason}", m.health);
                self.propose(Command::SetHealth { id: m.id, health }, reason)
                    .await;
            }
        }

        // 4. Heal. A decision can lead to the next at once (a host's progress is committed
        // before its serving), so the controller decides again after its proposals applied,
        // a few rounds at most, and not when a round decided exactly what the last did (a
        // refused proposal would be).
        let policy = self.desk.policy().clone();
        let mut last = Vec::new();
        for _ in 0..HEAL_ROUNDS_PER_TICK {
            let observations = self.desk.observations();
            let decisions = self
                .state
                .read(|a| crate::core::controller::decide(&a.state, &observations, &policy));
            if decisions.is_empty() || decisions == last {
                break;
            }
            last = decisions.clone();
            self.propose_all(decisions).await;
        }

        // 5. Raise the ring's version.
        self.raise_ring_version(&in_raft, &members).await;
    }

    /// Proposes the next ring version once every member of the configuration (voters,
    /// learners, and registered members not in it yet) reported a binary that supports it,
    /// unless it is held.
    async fn raise_ring_version(
        &self,
        in_raft: &BTreeSet<NodeId>,
        members: &std::collections::BTreeMap<NodeId, crate::core::Member>,
    ) {
        let reports = self.desk.reports();
        let mut names: std::collections::BTreeMap<NodeId, String> = in_raft
            .iter()
            .map(|id| (*id, format!("member {id}")))
            .collect();
        names.extend(members.values().map(|m| (m.id, m.name.clone())));
        reports.retain(&names.keys().copied().collect());
        let version = self.state.read(|a| a.state.settings.ring_version.clone());
        if self.finalize == Finalize::Manual || version.held.is_some() {
            return;
        }
        // Only reports of the last two leases count: a member restarted on an older binary,
        // or gone silent, holds the version back until it is heard from again.
        let fresh = reports.fresh(Duration::from_millis(
            self.timing.lease_ms * crate::upgrade::FRESH_LEASES,
        ));
        let Ok(next) = crate::upgrade::next_version(version.active, &names, &fresh) else {
            return;
        };
        tracing::info!(
            "every member runs a binary that supports ring version {next}: raising it from {}",
            version.active
        );
        self.propose(
            Command::SetRingVersion { version: next },
            format!("every member runs a binary that supports ring version {next}"),
        )
        .await;
    }

    /// Proposes `decisions` together.
    async fn propose_all(&self, decisions: Vec<crate::core::controller::Decision>) {
        // Decisions are about different control planes (at most one each), so they are
        // proposed together: openraft appends and fsyncs whatever is waiting as one batch,
        // where one proposal at a time would pay a commit round per control plane. Each
        // command is still checked on its own when applied (a move names its exact epoch).
        let this = self;
        futures::stream::iter(decisions)
            .map(|d| {
                // A decision about a control plane is logged with its name and epoch.
                let span = match d.command.control_plane_epoch() {
                    Some((name, epoch)) => crate::logging::control_plane_span(name, epoch),
                    None => tracing::Span::none(),
                };
                async move {
                    tracing::info!(action = d.command.action(), "{}", d.reason);
                    this.propose(d.command, d.reason).await;
                }
                .instrument(span)
            })
            .buffered(MAX_PROPOSALS_IN_FLIGHT)
            .for_each(|()| async {})
            .await;
    }
}

impl Duties {
    /// Whether member `m` (not this one) diverged: the ring's record, or what this leader
    /// found, which it then commits (ring version 2; at version 1 it stays this leader's).
    async fn note_divergence(
        &self,
        m: &crate::core::Member,
    ) -> Option<crate::raft::divergence::Divergence> {
        if let Some(recorded) = &m.diverged {
            return Some(recorded.clone());
        }
        let found = self.network.pool().diverged().get(m.id)?;
        let command = Command::MarkDiverged {
            id: m.id,
            acknowledged_index: found.acknowledged_index,
        };
        if self
            .state
            .read(|a| a.state.settings.ring_version.admits(&command))
            .is_ok()
        {
            self.propose(command, found.reason.clone()).await;
        }
        Some(found)
    }

    /// Pings the peers when no leader has been heard from for `member_lost_ms`, at most once
    /// per `member_lost_ms`; see the module docs.
    async fn check_still_member(&mut self, metrics: &RaftMetricsOf) {
        let lost = Duration::from_millis(self.timing.member_lost_ms);
        let silent = self
            .contact
            .since()
            .unwrap_or_else(|| self.started.elapsed());
        if silent < lost || self.last_probe.is_some_and(|at| at.elapsed() < lost) {
            return;
        }
        self.last_probe = Some(Instant::now());
        let timeout = Duration::from_millis(self.timing.probe_timeout_ms());
        let membership = metrics.membership_config.membership();
        for (id, node) in membership.nodes() {
            if *id == self.me {
                continue;
            }
            let mut client = self.network.client(*id, node);
            if let Err(e) = client.ping(timeout).await {
                tracing::debug!(peer_id = id, "ping: {e}");
            }
        }
    }
}

/// Milliseconds since member `id` last acknowledged this leader (`None` if it never has),
/// and since this leader was elected.
fn contact_ms(metrics: &RaftMetricsOf, id: NodeId, leader_since: Instant) -> (Option<u64>, u64) {
    use openraft::type_config::async_runtime::Instant as _;
    let ms = |d: Duration| u64::try_from(d.as_millis()).unwrap_or(u64::MAX);
    let last_ack = metrics
        .heartbeat
        .as_ref()
        .and_then(|h| h.get(&id).cloned().flatten());
    (
        last_ack.map(|at| ms(at.elapsed())),
        ms(leader_since.elapsed()),
    )
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

/// Runs the duties until `stopped` turns true.
pub async fn run(mut duties: Duties, mut stopped: watch::Receiver<bool>) {
    let mut interval = tokio::time::interval(duties.tick_interval());
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // Also act at once when this member's Raft state changes (e.g. it just became leader).
    let mut server_state = duties.raft.server_metrics();
    let desk = duties.desk.clone();
    loop {
        tokio::select! {
            _ = interval.tick() => duties.tick().await,
            // A release or a new host's health: the move goes on now, not at the next tick.
            () = desk.news() => duties.tick().await,
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
