//! The leader's side of leases: it answers members' renewals (the `Renew` RPC) and keeps what
//! it observed for the controller ([`crate::core::controller`]).
//!
//! A renewal is answered only by the leader, only after it confirmed its leadership with a
//! quorum and applied everything committed before (a ReadIndex read), and with exactly
//! [`RingState::grants`] of the asking member at that point. The member's lease runs from
//! before it sent the request, so it never outlasts what the leader could know.
//!
//! Each renewal also counts as contact with the member (for health), tells which control
//! planes it released (it holds no grant for one it is fencing, and lists it as not running:
//! since a member renews one round at a time, nothing it does later can bring it back), and
//! which it serves (running and passing the driver's health check). It also carries the host's
//! reports on the migrations it performs and on the backups it writes, kept for the controller
//! when they are about a control plane the member hosts at the epoch it runs.
//!
//! A round may arrive more than once, and late (the agent sends a copy on another connection
//! when the first is slow): the desk records what a round reports only if it is later than the
//! member's round it recorded last, answers another copy of that round without recording it
//! again, and refuses an earlier one ([`crate::core::renewal`]).
//!
//! [`RingState::grants`]: crate::core::RingState::grants

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::ServerState;
use openraft::type_config::async_runtime::watch::WatchReceiver;
use tonic::Status;

use crate::core::Phase;
use crate::core::backup_report::worth_committing;
use crate::core::controller::{Observations, Policy};
use crate::core::health::earlier_leaders_silent_ms;
use crate::core::renewal::{self, Arrival, RenewRound};
use crate::raft::divergence::{Diverged, Divergence};
use crate::raft::service::RenewHandler;
use crate::raft::types::{RenewReply, RenewRequest};
use crate::raft::{NodeId, RaftNode, StateMachineStore};
use crate::upgrade::Reports;

struct Inner {
    observations: Observations,
    last_renewal: BTreeMap<NodeId, Instant>,
    /// Members that announced a restart: until when they are not judged lost.
    restarting: BTreeMap<NodeId, Instant>,
    /// Member -> (its vote's term, when it last accepted a message of a leader of an earlier
    /// term, on this member's clock) from its latest renewal.
    earlier_leader: BTreeMap<NodeId, (u64, Instant)>,
    /// Member -> the latest round of its renewals recorded (in this term).
    rounds: BTreeMap<NodeId, RenewRound>,
}

/// Answers renewals and keeps the leader's observations.
pub struct LeaseDesk {
    me: NodeId,
    raft: RaftNode,
    state: StateMachineStore,
    policy: Policy,
    started: Instant,
    inner: Mutex<Inner>,
    /// Woken when a renewal brings news the controller acts on at once: a former host released
    /// a control plane, or a new host serves one (the duties decide then, not at their next
    /// tick).
    news: tokio::sync::Notify,
    /// Renewals answered with a grant (for `/metrics`: the leader's load at rest).
    renewals: Arc<AtomicU64>,
    /// The binaries members report with their renewals.
    reports: Arc<Reports>,
    /// The followers this member found diverged while it led (the network layer's record).
    diverged: Diverged,
    /// What an announced restart gets.
    policy_restart: RestartPolicy,
}

/// What a member that announces its restart gets ([`RenewRequest::restarting`]).
#[derive(Debug, Clone, Copy)]
pub struct RestartPolicy {
    /// The lease of its last renewal ([`crate::core::Timing::restart_lease_ms`]).
    pub lease_ms: u64,
    /// How long it is not judged lost ([`crate::core::Timing::restart_grace_ms`]).
    pub grace_ms: u64,
}

impl LeaseDesk {
    /// The desk of member `me`.
    pub fn new(
        me: NodeId,
        raft: RaftNode,
        state: StateMachineStore,
        policy: Policy,
        reports: Arc<Reports>,
        diverged: Diverged,
    ) -> Self {
        Self {
            me,
            raft,
            state,
            policy,
            started: Instant::now(),
            inner: Mutex::new(Inner {
                observations: Observations::default(),
                last_renewal: BTreeMap::new(),
                restarting: BTreeMap::new(),
                earlier_leader: BTreeMap::new(),
                rounds: BTreeMap::new(),
            }),
            news: tokio::sync::Notify::new(),
            renewals: Arc::default(),
            reports,
            diverged,
            policy_restart: RestartPolicy {
                lease_ms: 0,
                grace_ms: 0,
            },
        }
    }

    /// What an announced restart gets (without this, the normal lease and no grace).
    pub fn with_restarts(mut self, restart: RestartPolicy) -> Self {
        self.policy_restart = restart;
        self
    }

    /// Whether member `id` diverged: the ring's record of it, or this leader's finding.
    pub fn divergence(&self, id: NodeId) -> Option<Divergence> {
        self.state
            .read(|a| a.state.members.get(&id).and_then(|m| m.diverged.clone()))
            .or_else(|| self.diverged.get(id))
    }

    /// The count of renewals this desk answered with a grant.
    pub fn renewals(&self) -> Arc<AtomicU64> {
        self.renewals.clone()
    }

    /// Resolves when a renewal brought a release or a new host's health (see `news`); one
    /// wake-up covers everything before it.
    pub async fn news(&self) {
        self.news.notified().await;
    }

    /// What the members report about their binaries (see [`crate::upgrade`]).
    pub fn reports(&self) -> &Arc<Reports> {
        &self.reports
    }

    /// The policy.
    pub fn policy(&self) -> &Policy {
        &self.policy
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether member `id` announced a restart within the grace ([`Timing::restart_grace_ms`])
    /// and has not renewed since: it is then not judged lost.
    ///
    /// [`Timing::restart_grace_ms`]: crate::core::Timing::restart_grace_ms
    pub fn restarting(&self, id: NodeId) -> bool {
        let mut inner = self.lock();
        match inner.restarting.get(&id) {
            Some(until) if Instant::now() < *until => true,
            Some(_) => {
                inner.restarting.remove(&id);
                false
            }
            None => false,
        }
    }

    /// How long ago member `id` last renewed with this member (as leader).
    pub fn since_renewal(&self, id: NodeId) -> Option<Duration> {
        self.lock().last_renewal.get(&id).map(Instant::elapsed)
    }

    /// Forgets everything observed (this member stopped leading: a new term starts afresh).
    pub fn reset(&self) {
        let mut inner = self.lock();
        inner.observations = Observations::default();
        inner.last_renewal.clear();
        inner.restarting.clear();
        inner.earlier_leader.clear();
        inner.rounds.clear();
        drop(inner);
        self.reports.reset();
    }

    /// How long, at least, no leader of a term below `term` can have granted a lease, by the
    /// renewals of a majority of `voters` ([`earlier_leaders_silent_ms`]); see
    /// [`crate::raft::contact`].
    pub fn earlier_leaders_silent(&self, term: u64, voters: &BTreeSet<NodeId>) -> Option<Duration> {
        let reports: BTreeMap<NodeId, (u64, u64)> = self
            .lock()
            .earlier_leader
            .iter()
            .map(|(id, (at_term, at))| {
                let silent_ms = u64::try_from(at.elapsed().as_millis()).unwrap_or(u64::MAX);
                (*id, (*at_term, silent_ms))
            })
            .collect();
        earlier_leaders_silent_ms(term, voters, &reports).map(Duration::from_millis)
    }

    /// The observations for the controller, brought up to date with the applied state.
    pub fn observations(&self) -> Observations {
        let now_ms = u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX);
        let mut inner = self.lock();
        inner.observations.now_ms = now_ms;
        inner.observations.unix_ms = crate::time::unix_ms();
        self.state.read(|a| inner.observations.observe(&a.state));
        inner.observations.clone()
    }

    /// Renews the lease of member `from` (see the module docs).
    pub async fn renew_lease(
        &self,
        from: NodeId,
        request: RenewRequest,
    ) -> Result<RenewReply, Status> {
        let leading = {
            let m = self.raft.metrics().borrow_watched().clone();
            m.state == ServerState::Leader && m.current_leader == Some(self.me)
        };
        if !leading {
            return Err(Status::failed_precondition(format!(
                "member {} is not the leader; renew with the leader",
                self.me
            )));
        }
        let arrived = Instant::now();
        self.reports.record(from, request.version.clone());
        if let Some(divergence) = self.divergence(from) {
            // Granted nothing, not even a lease of no control plane (which would let its
            // builtin DNS answer, in a release that ignores `diverged`), and not counted as a
            // renewal: the duties judge it lost once whatever it was granted before can no
            // longer run (`judge_diverged`).
            return Ok(RenewReply {
                lease_ms: 0,
                diverged: Some(divergence),
                ..RenewReply::default()
            });
        }
        {
            let mut inner = self.lock();
            // Any copy is contact, however late.
            inner.last_renewal.insert(from, arrived);
            if request.restarting {
                let grace = Duration::from_millis(self.policy_restart.grace_ms);
                inner.restarting.insert(from, arrived + grace);
            } else {
                inner.restarting.remove(&from);
            }
            if renewal::sort(inner.rounds.get(&from).copied(), request.round) == Arrival::Stale {
                return Err(superseded(from, request.round));
            }
            // The contact was at most `ms_ago` before the sending, which was before `arrived`.
            if let Some(earlier) = request.earlier_leader
                && let Some(at) = arrived.checked_sub(Duration::from_millis(earlier.ms_ago))
            {
                inner.earlier_leader.insert(from, (earlier.term, at));
            }
        }
        self.raft
            .ensure_linearizable(openraft::ReadPolicy::ReadIndex)
            .await
            .map_err(|e| Status::unavailable(format!("cannot confirm leadership: {e}")))?;
        // Read after the ReadIndex: everything committed before this request arrived is here.
        let reading = self.state.read(|a| {
            let name = a.state.members.get(&from)?.name.clone();
            let granted = a.state.grants(&name);
            let replicas = a.state.replica_grants(&name);
            let mut released = Vec::new();
            let mut serving = Vec::new();
            // Only the control planes this member fences or hosts (the state's index), not
            // every control plane of the ring.
            for cp in a.state.fenced_by(&name) {
                if !request.running.contains_key(&cp.name) {
                    released.push((cp.name.clone(), cp.epoch, name.clone()));
                }
            }
            let mut problems = Vec::new();
            for cp in a.state.hosted(&name) {
                if cp.phase == Phase::Starting && request.healthy.get(&cp.name) == Some(&cp.epoch) {
                    serving.push((cp.name.clone(), cp.epoch, name.clone()));
                }
                // What the host says is wrong (nothing, when it names none at this epoch),
                // while it differs from what the state has.
                let reported = request
                    .problems
                    .get(&cp.name)
                    .filter(|(epoch, _)| *epoch == cp.epoch)
                    .map(|(_, text)| text.clone());
                if matches!(cp.phase, Phase::Starting | Phase::Running)
                    && !crate::core::controller::same_problem(cp, reported.as_deref())
                {
                    problems.push(((cp.name.clone(), cp.epoch, name.clone()), reported));
                }
            }
            let mut progress = Vec::new();
            for (cp_name, report) in &request.migrations {
                let Some(cp) = a.state.control_planes.get(cp_name) else {
                    continue;
                };
                if cp.phase == Phase::Starting
                    && cp.host.as_deref() == Some(name.as_str())
                    && request.running.get(cp_name) == Some(&cp.epoch)
                {
                    progress.push(((cp.name.clone(), cp.epoch, name.clone()), report.clone()));
                }
            }
            // Only the backup reports worth a commit are kept: a host reports every control
            // plane it runs in every renewal, and most reports change nothing yet.
            let mut backups = Vec::new();
            for (cp_name, report) in &request.backups {
                let Some(cp) = a.state.control_planes.get(cp_name) else {
                    continue;
                };
                if matches!(cp.phase, Phase::Starting | Phase::Running)
                    && cp.host.as_deref() == Some(name.as_str())
                    && request.running.get(cp_name) == Some(&cp.epoch)
                    && worth_committing(cp.backup_status.as_ref(), report)
                {
                    backups.push(((cp.name.clone(), cp.epoch, name.clone()), report.clone()));
                }
            }
            let mut etcd_changes = Vec::new();
            for (cp_name, (generation, step)) in &request.etcd_changes {
                let Some(cp) = a.state.control_planes.get(cp_name) else {
                    continue;
                };
                let waits = cp.etcd.as_ref().is_some_and(|c| {
                    c.generation == *generation
                        && c.change.as_ref().is_some_and(|c| c.step == *step)
                });
                if waits && cp.host.as_deref() == Some(name.as_str()) {
                    etcd_changes.push((cp.name.clone(), *generation, name.clone(), *step));
                }
            }
            // Only lists that name an id the ring has not recorded yet.
            let mut etcd_ids = Vec::new();
            for (cp_name, (generation, ids)) in &request.etcd_ids {
                let Some(cp) = a.state.control_planes.get(cp_name) else {
                    continue;
                };
                let new = cp.etcd.as_ref().is_some_and(|c| {
                    c.generation == *generation && !c.unrecorded_ids(ids).is_empty()
                });
                if new && cp.host.as_deref() == Some(name.as_str()) {
                    etcd_ids.push(((cp.name.clone(), *generation, name.clone()), ids.clone()));
                }
            }
            Some((
                (granted, replicas, etcd_changes, etcd_ids, problems),
                released,
                serving,
                progress,
                backups,
                a.applied_index(),
            ))
        });
        let Some((
            (granted, replicas, etcd_changes, etcd_ids, problems),
            released,
            serving,
            progress,
            backups,
            applied_index,
        )) = reading
        else {
            return Err(Status::failed_precondition(format!(
                "member {from} is not registered"
            )));
        };
        let mut news = false;
        {
            let mut inner = self.lock();
            // Sorted again now that the reading is done: a later round may have been recorded
            // while this one waited for its ReadIndex.
            match renewal::sort(inner.rounds.get(&from).copied(), request.round) {
                Arrival::Stale => return Err(superseded(from, request.round)),
                // Answered (it renews the lease), recorded once.
                Arrival::Copy => {}
                Arrival::Record => {
                    if let Some(round) = request.round {
                        inner.rounds.insert(from, round);
                    }
                    news = !released.is_empty() || !serving.is_empty();
                    inner.observations.released.extend(released);
                    inner.observations.serving.extend(serving);
                    inner.observations.progress.extend(progress);
                    inner.observations.backups.extend(backups);
                    inner.observations.etcd_changes.extend(etcd_changes);
                    inner.observations.etcd_ids.extend(etcd_ids);
                    news |= !problems.is_empty();
                    inner.observations.problems.extend(problems);
                }
            }
        }
        if news {
            self.news.notify_one();
        }
        self.renewals.fetch_add(1, Ordering::Relaxed);
        if request.restarting {
            tracing::info!(
                peer_id = from,
                lease_ms = self.policy_restart.lease_ms,
                grace_ms = self.policy_restart.grace_ms,
                "the member announced its restart: what it hosts keeps serving under its guards"
            );
        }
        Ok(RenewReply {
            granted,
            lease_ms: if request.restarting {
                self.policy_restart.lease_ms.max(self.policy.lease_ms)
            } else {
                self.policy.lease_ms
            },
            applied_index,
            replicas,
            versions: self.reports.view().versions,
            diverged: None,
        })
    }
}

/// The refusal of a renewal round older than one recorded: the member gave up on it already.
fn superseded(from: NodeId, round: Option<RenewRound>) -> Status {
    Status::aborted(format!(
        "renewal round {round:?} of member {from} was superseded by a later one"
    ))
}

impl RenewHandler for LeaseDesk {
    fn renew(
        &self,
        from: NodeId,
        request: RenewRequest,
    ) -> futures::future::BoxFuture<'_, Result<RenewReply, Status>> {
        Box::pin(self.renew_lease(from, request))
    }
}
