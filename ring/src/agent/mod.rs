//! The agent every member runs: it renews this member's lease with the leader, one round at a
//! time, and makes the workloads match the grant ([`crate::core::agent::reconcile`]) through
//! the driver ([`driver`]).
//!
//! A round's request goes to the leader on one of the connections to it ([`PEER_LANES`], the
//! first rotating from round to round so that all stay warm); when no answer came within
//! [`Timing::renew_hedge_ms`] (or the connection failed) a copy goes on the next, up to one per
//! connection, and the first answer wins. A lost packet stalls one TCP connection for at least
//! its 200 ms retransmission timeout; the copies keep a lossy link from lapsing the lease. Every
//! copy names the round ([`crate::core::renewal`]), so the leader records each round once and
//! never a late copy of an earlier one.
//!
//! Without a fresh grant it starts and extends nothing; each workload's guard then stops it at
//! the deadline of the last grant, whatever `ringd` is doing (DESIGN.md rule 1).

mod adoption;
pub mod backup_status;
pub mod driver;
pub mod etcd;
mod etcd_backups;
mod etcd_gc;
mod etcd_membership;
mod etcd_replica;
mod etcd_runtime;
pub mod gate;
pub(crate) mod guarded;
mod lease;
mod workload;

pub use lease::OwnLease;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use openraft::type_config::async_runtime::watch::WatchReceiver;
use tokio::sync::watch;
use tracing::Instrument as _;

use crate::core::Timing;
use crate::core::agent::{Action, Grant, Memory, ReplicaAction, reconcile, reconcile_replicas};
use crate::core::renewal::RenewRound;
use crate::leases::LeaseDesk;
use crate::raft::contact::LeaderContact;
use crate::raft::network::{CallError, PEER_LANES, PeerNetwork};
use crate::raft::types::{EarlierLeaderContact, RenewReply, RenewRequest};
use crate::raft::{NodeId, RaftNode, StateMachineStore};
use crate::time::monotonic_ms;
use driver::{ReplicaTarget, Target, Workloads};

/// Why a lease renewal failed; the member keeps what runs until the current lease runs out.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RenewError {
    /// No leader is known.
    #[error("no leader known")]
    NoLeader,
    /// This member leads, and its own lease desk did not answer in time.
    #[error("timed out")]
    TimedOut,
    /// This member leads, and its own lease desk refused (e.g. leadership is moving).
    #[error("{0}")]
    Refused(String),
    /// The leader's address is not known yet.
    #[error("leader {leader} has no address yet")]
    NoAddress {
        /// The leader's id.
        leader: NodeId,
    },
    /// The call to the leader failed.
    #[error(transparent)]
    Peer(#[from] crate::raft::network::CallError),
}

/// One member's agent.
pub struct Agent {
    me: NodeId,
    name: String,
    raft: RaftNode,
    state: StateMachineStore,
    network: PeerNetwork,
    desk: Arc<LeaseDesk>,
    /// When a leader last reached this member: sent with every renewal (see
    /// [`crate::raft::contact`]).
    contact: LeaderContact,
    workloads: Workloads,
    memory: Memory,
    timing: Timing,
    last_error: Option<String>,
    own: Arc<OwnLease>,
    /// The last grant, and the leader's applied index it was read at.
    granted: Option<(u64, Grant)>,
    /// What the last renewal reported healthy.
    reported_healthy: BTreeMap<String, u64>,
    /// Renew again at once: something stopped or started in the last round (the leader learns
    /// of the release, or that the new workload runs, now, not a renewal interval later).
    again: bool,
    /// A grant could not be acted on because this member's state had not applied it yet:
    /// renew again as soon as it applies more.
    deferred: bool,
    /// This process's run and the last round's number in it (see [`RenewRound`]).
    run: u64,
    seq: u64,
    /// This ringd is leaving (SIGTERM): its renewal announces the restart, and its grant only
    /// extends what runs (see [`Agent::farewell`]).
    restarting: bool,
}

/// A run id for this process: random, so a restarted member never repeats one.
fn new_run() -> u64 {
    use std::hash::{BuildHasher, Hasher};
    let mut hasher = std::collections::hash_map::RandomState::new().build_hasher();
    hasher.write_u32(std::process::id());
    hasher.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    hasher.finish()
}

impl Agent {
    /// The agent of member `me` (named `name`), with leases of at most `timing.lease_ms`.
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        me: NodeId,
        name: &str,
        raft: RaftNode,
        state: StateMachineStore,
        network: PeerNetwork,
        desk: Arc<LeaseDesk>,
        workloads: Workloads,
        timing: Timing,
        contact: LeaderContact,
    ) -> Self {
        Self {
            contact,
            me,
            name: name.to_string(),
            raft,
            state,
            own: Arc::new(OwnLease::new(network.pool().own_divergence().clone())),
            network,
            desk,
            workloads,
            memory: Memory::default(),
            timing,
            last_error: None,
            granted: None,
            reported_healthy: BTreeMap::new(),
            again: false,
            deferred: false,
            run: new_run(),
            seq: 0,
            restarting: false,
        }
    }

    /// Whether the applied state grants this member something other than the last grant
    /// (a move committed, a fence released), once it has applied at least as far as the
    /// leader had when it answered; or a grant waits for this member's state to catch up.
    fn state_moved_on(&self) -> bool {
        let Some((index, last)) = &self.granted else {
            return false;
        };
        self.deferred
            || self.state.read(|a| {
                let granted = last.control_planes.iter().map(|(n, e)| (n.as_str(), *e));
                let replicas = last.replicas.iter().map(|(n, k)| (n.as_str(), *k));
                a.applied_index() >= *index
                    && (a.state.grants_iter(&self.name).ne(granted)
                        || a.state.replica_grants_iter(&self.name).ne(replicas))
            })
    }

    /// Whether an etcd front end's health changed since the last renewal reported it.
    fn health_moved_on(&self) -> bool {
        self.workloads.etcd_health_changed(&self.reported_healthy)
    }

    /// This member's own lease, as the agent last renewed it.
    pub fn own_lease(&self) -> Arc<OwnLease> {
        self.own.clone()
    }

    /// How often the lease is renewed ([`Timing::renew_interval_ms`]).
    pub fn renew_interval(&self) -> Duration {
        Duration::from_millis(self.timing.renew_interval_ms())
    }

    async fn renew(&self, request: RenewRequest) -> Result<RenewReply, RenewError> {
        let timeout = Duration::from_millis(self.timing.renew_timeout_ms());
        let (leader, node) = {
            let m = self.raft.metrics().borrow_watched().clone();
            let leader = m.current_leader.ok_or(RenewError::NoLeader)?;
            let node = m.membership_config.membership().get_node(&leader).cloned();
            (leader, node)
        };
        if leader == self.me {
            return tokio::time::timeout(timeout, self.desk.renew_lease(self.me, request))
                .await
                .map_err(|_| RenewError::TimedOut)?
                .map_err(|s| RenewError::Refused(s.message().to_string()));
        }
        let node = node.ok_or(RenewError::NoAddress { leader })?;
        let round = request.round.map(|r| r.seq).unwrap_or_default();
        // Rotate the first connection, so that every one carries traffic and stays warm.
        let first_lane = usize::try_from(round % PEER_LANES as u64).unwrap_or(0);
        let hedge = Duration::from_millis(self.timing.renew_hedge_ms());
        let deadline = tokio::time::Instant::now() + timeout;
        let request = &request;
        let network = &self.network;
        let copy = |k: usize| {
            let mut client = network.client_on_lane(leader, &node, first_lane + k);
            let left = deadline.saturating_duration_since(tokio::time::Instant::now());
            async move { client.renew(request, left).await }
        };
        let mut in_flight = futures::stream::FuturesUnordered::new();
        let mut sent = 0usize;
        let mut next_copy_at = tokio::time::Instant::now();
        let mut last_error = None;
        loop {
            let now = tokio::time::Instant::now();
            if now >= deadline {
                break;
            }
            if sent < PEER_LANES && now >= next_copy_at {
                in_flight.push(copy(sent));
                sent += 1;
                next_copy_at = now + hedge;
            }
            if in_flight.is_empty() {
                break;
            }
            let wake = if sent < PEER_LANES {
                next_copy_at.min(deadline)
            } else {
                deadline
            };
            tokio::select! {
                Some(result) = futures::StreamExt::next(&mut in_flight) => match result {
                    Ok(reply) => return Ok(reply),
                    // The leader answered with a failure: a copy would get the same.
                    Err(e @ CallError::Network(_)) => return Err(e.into()),
                    // This connection failed: the next copy goes now.
                    Err(e @ CallError::Unreachable(_)) => {
                        last_error = Some(e);
                        next_copy_at = tokio::time::Instant::now();
                    }
                },
                () = tokio::time::sleep_until(wake) => {}
            }
        }
        Err(last_error
            .unwrap_or_else(|| {
                CallError::Unreachable(format!(
                    "no answer from the leader in {} ms on {sent} connections",
                    timeout.as_millis()
                ))
            })
            .into())
    }

    /// The last renewal of this ringd before it exits (SIGTERM): it announces the restart, so
    /// the leader grants the longest lease DESIGN.md rule 2 allows and does not judge this
    /// member lost for a while; what runs here gets that deadline and is left to its guards
    /// for the next ringd to adopt.
    pub async fn farewell(&mut self) {
        // First what the etcds acknowledged so far into their buckets (they serve on); what
        // still starts is stopped, for its final snapshot.
        let stopping = self
            .workloads
            .flush_backups(Duration::from_millis(self.timing.lease_ms / 2))
            .await;
        self.restarting = true;
        let before = self.own.remaining_ms(monotonic_ms());
        self.round().await;
        let after = self.own.remaining_ms(monotonic_ms());
        tracing::info!(
            "restart announced: the lease has {after} ms left (it had {before} ms); what runs here stays with its guards"
        );
        // The final snapshots of what was stopped, while renewals (each announcing the
        // restart again: nothing starts) keep the lease they are taken under.
        let until = tokio::time::Instant::now() + Duration::from_millis(FAREWELL_STOP_WAIT_MS);
        let mut left = self.workloads.still_stopping(&stopping);
        while !left.is_empty() && tokio::time::Instant::now() < until {
            tokio::time::sleep(Duration::from_millis(self.timing.renew_interval_ms())).await;
            self.round().await;
            left = self.workloads.still_stopping(&stopping);
        }
        if !stopping.is_empty() {
            if left.is_empty() {
                tracing::info!(control_planes = ?stopping, "stopped what was still starting here");
            } else {
                tracing::warn!(
                    control_planes = ?left,
                    "still stopping after {FAREWELL_STOP_WAIT_MS} ms: left to their guards"
                );
            }
        }
    }

    /// Adopts the etcds a previous run of this member left under their guards; whether this
    /// run knows everything that may run here (then it need not wait for unknown leases to
    /// run out before its first renewal).
    async fn adopt(&mut self) -> bool {
        let (state, me) = (self.state.clone(), self.name.clone());
        let adoption = self
            .workloads
            .adopt(|name, epoch| state.read(|a| Target::adopted(&a.state, &me, name, epoch)))
            .await;
        let Some(adoption) = adoption else {
            return false;
        };
        for (name, epoch) in &adoption.adopted {
            tracing::info!(control_plane = %name, epoch, "adopted from the previous run");
        }
        if !adoption.unknown_guards.is_empty() {
            tracing::info!(
                pids = ?adoption.unknown_guards,
                "guards of a previous run that cannot be adopted still run here"
            );
            return false;
        }
        true
    }

    /// One round: renew, then act on the grant.
    pub async fn round(&mut self) {
        self.again = false;
        self.deferred = false;
        // The ring's record that this member diverged (ring version 2), once applied here.
        if let Some(divergence) = self.state.read(|a| {
            a.state
                .members
                .get(&self.me)
                .and_then(|m| m.diverged.clone())
        }) {
            self.own.divergence().learn(&divergence);
        }
        let running = self.workloads.running().await;
        let healthy = self.workloads.healthy().await;
        let sent_at_ms = monotonic_ms();
        let term = self.raft.metrics().borrow_watched().current_term;
        let earlier_leader = EarlierLeaderContact {
            term,
            ms_ago: u64::try_from(self.contact.earlier_than(term).elapsed().as_millis())
                .unwrap_or(u64::MAX),
        };
        self.seq += 1;
        let reply = self
            .renew(RenewRequest {
                round: Some(RenewRound {
                    run: self.run,
                    seq: self.seq,
                }),
                earlier_leader: Some(earlier_leader),
                running: running.clone(),
                healthy: healthy.clone(),
                migrations: self.workloads.migrations(),
                backups: self.workloads.backups(&running),
                etcd_changes: self.workloads.etcd_changes(),
                etcd_ids: self.workloads.etcd_ids(),
                problems: self.workloads.problems(),
                version: Some(crate::version::this_member()),
                restarting: self.restarting,
            })
            .await;
        let reply = match reply {
            Ok(r) => {
                if self.last_error.take().is_some() {
                    tracing::info!("lease renewed again");
                }
                r
            }
            Err(e) => {
                let e = e.to_string();
                if self.last_error.as_deref() != Some(e.as_str()) {
                    tracing::warn!(
                        "cannot renew the lease ({e}); what runs here stops when the current lease runs out"
                    );
                    self.last_error = Some(e);
                }
                return;
            }
        };
        self.reported_healthy = healthy;
        if let Some(divergence) = &reply.diverged {
            self.own.divergence().learn(divergence);
        }
        // What the leader knows of the members' binaries (its own reports, when it leads).
        if self.raft.metrics().borrow_watched().current_leader != Some(self.me) {
            self.desk.reports().learn(reply.versions);
        }
        let grant = Grant {
            sent_at_ms,
            // Never longer than this member's own idea of a lease (the restart lease when it
            // announced its restart): a leader with other timings cannot stretch it.
            lease_ms: reply.lease_ms.min(if self.restarting {
                self.timing.restart_lease_ms()
            } else {
                self.timing.lease_ms
            }),
            control_planes: reply.granted,
            replicas: reply.replicas,
        };
        self.granted = Some((reply.applied_index, grant.clone()));
        if grant.deadline_ms() <= monotonic_ms() {
            // The answer came too late to be of use.
            return;
        }
        self.own.record(grant.deadline_ms(), reply.applied_index);
        // Etcd members first: a zone-tolerant control plane's host fronts its own.
        let replicas = self.workloads.running_replicas();
        let replica_actions = if self.restarting {
            Vec::new()
        } else {
            reconcile_replicas(&grant, &replicas)
        };
        let (replica_stops, replica_starts): (Vec<_>, Vec<_>) = replica_actions
            .into_iter()
            .partition(|a| matches!(a, ReplicaAction::Stop { .. }));
        for action in replica_starts {
            self.act_on_replica(action);
        }
        let mut actions = reconcile(&mut self.memory, &grant, &running);
        if self.restarting {
            // Leaving: what runs keeps running (longer), nothing starts or stops now.
            actions.retain(|a| matches!(a, Action::Extend { .. }));
        }
        self.again = actions.iter().any(|a| matches!(a, Action::Stop { .. }));
        for action in actions {
            // Each action is about one control plane at one epoch: its lines say which.
            let span = match &action {
                Action::Stop { name, epoch }
                | Action::Extend { name, epoch, .. }
                | Action::Start { name, epoch, .. } => {
                    crate::logging::control_plane_span(name, *epoch)
                }
            };
            self.act(action).instrument(span).await;
        }
        for action in replica_stops {
            self.act_on_replica(action);
        }
        // The hosts of zone-tolerant control planes carry out their clusters' changes.
        self.state.read(|a| self.workloads.follow_state(&a.state));
    }

    fn act_on_replica(&mut self, action: ReplicaAction) {
        match action {
            ReplicaAction::Stop { name, key } => self.workloads.stop_replica(&name, key),
            ReplicaAction::Extend {
                name,
                key,
                deadline_ms,
            } => self.workloads.extend_replica(&name, key, deadline_ms),
            ReplicaAction::Start {
                name,
                key,
                deadline_ms,
            } => {
                let target = self
                    .state
                    .read(|a| ReplicaTarget::from_state(&a.state, &self.name, &name, key));
                match target {
                    Some(target) => self.workloads.start_replica(target, deadline_ms),
                    None => {
                        tracing::debug!(
                            control_plane = %name,
                            "etcd member granted before applied here; starting next round"
                        );
                        self.deferred = true;
                    }
                }
            }
        }
    }

    async fn act(&mut self, action: Action) {
        match action {
            Action::Stop { name, epoch } => self.workloads.stop(&name, epoch).await,
            Action::Extend {
                name,
                epoch,
                deadline_ms,
            } => self.workloads.extend(&name, epoch, deadline_ms).await,
            Action::Start {
                name,
                epoch,
                deadline_ms,
            } => {
                let target = self
                    .state
                    .read(|a| Target::from_state(&a.state, &self.name, &name, epoch));
                let Some(target) = target else {
                    // The grant is ahead of this member's applied state: once it applied more.
                    tracing::debug!("granted before applied here; starting next round");
                    self.deferred = true;
                    return;
                };
                match self.workloads.start(target, deadline_ms).await {
                    // Renew again at once: the leader learns that it runs (and, without a
                    // health check to wait for, serves) now, not a renewal interval later.
                    Ok(()) => self.again = true,
                    // Said once, when it failed; not again at every renewal of the pause.
                    Err(e @ crate::agent::driver::DriverError::BackingOff { .. }) => {
                        tracing::debug!("not started: {e}");
                    }
                    Err(e) => tracing::error!("cannot start: {e}"),
                }
            }
        }
    }
}

/// Runs the agent until `stopped` turns true. Workloads keep their deadlines: a member that
/// shuts down stops serving when its lease runs out (its guards see to that).
///
/// It first adopts what a previous run left under guards it can reach; when others may run, it
/// waits the longest lease and `fence_ms` ([`Timing::start_fence_wait_ms`]): a previous run of this member (killed, restarted) may
/// have left guards running workloads under a lease this run knows nothing of; they are gone
/// by then, so this run's first renewal can truthfully say what runs here.
pub async fn run(mut agent: Agent, mut stopped: watch::Receiver<bool>) {
    if agent.adopt().await {
        tracing::info!("every etcd a previous run left here is adopted: serving at once");
        // The first renewal as soon as a leader is known (its lease thaws what is frozen).
        let wait = Duration::from_millis(agent.timing.lease_ms);
        let _ = agent
            .raft
            .wait(Some(wait))
            .metrics(|m| m.current_leader.is_some(), "a leader is known")
            .await;
    } else {
        let wait = Duration::from_millis(agent.timing.start_fence_wait_ms());
        tracing::info!(
            "waiting {} ms for leases a previous run may still hold before serving",
            wait.as_millis()
        );
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = async { let _ = stopped.wait_for(|s| *s).await; } => return,
        }
    }
    let mut tick = tokio::time::interval(agent.renew_interval());
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut applied = agent.state.watch_applied();
    let mut health = tokio::time::interval(Duration::from_millis(HEALTH_POLL_MS));
    health.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        // Renewals happen every renew interval, and also at once when they carry news either
        // way: the applied state grants something new (a move committed, a fence released),
        // something stopped (the leader learns of the release), a front end's health changed
        // (the leader learns that a new host serves). At rest none of these happen, so the
        // leader sees no more renewals than the interval gives.
        let renew = tokio::select! {
            _ = tick.tick() => true,
            changed = applied.changed() => {
                if changed.is_err() {
                    return;
                }
                agent.state_moved_on()
            }
            _ = health.tick() => agent.health_moved_on(),
            _ = async { let _ = stopped.wait_for(|s| *s).await; } => {
                agent.farewell().await;
                return;
            }
        };
        if !renew {
            continue;
        }
        tick.reset();
        agent.round().await;
        if agent.again {
            // Once: what stopped in that round is not running any more.
            agent.round().await;
        }
    }
}

/// How often the agent looks at its etcd front ends' health between renewals, ms (a read of
/// a flag each).
const HEALTH_POLL_MS: u64 = 20;

/// How long a leaving ringd waits for the instances it stopped (they were still starting) to
/// end with their final snapshots, ms; past it, they are left to their guards.
const FAREWELL_STOP_WAIT_MS: u64 = 30_000;
