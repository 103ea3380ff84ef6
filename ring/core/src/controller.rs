//! The leader's decisions about control planes: pure functions of the committed state, what the
//! leader observed (time, leases released, workloads serving) and its policy. The leader's duties
//! propose what [`decide`] returns; the operator's commands use [`plan_moves`]; the simulation
//! drives both directly.
//!
//! Safety (DESIGN.md rules 1 and 2) rests on two things here:
//! - a control plane leaves a lost host only once the host is *committed* `lost`, which the
//!   leader judges after `member_lost_ms > lease_ms + fence_ms + margin` without contact, so
//!   the host's lease has run out and it fenced itself;
//! - a control plane moved off a host that may still hold a lease waits in `fencing` until that
//!   host reports it released (in a renewal it sent after the move was committed) or this
//!   leader has watched it fence for `lease_ms + fence_ms + margin`.
//!
//! An *unplaced* control plane can have former hosts fencing it too: it was unplaced while its
//! host might still serve it, or its host was removed when the ring was recovered
//! ([`RingState::recover`]). Such a control plane is released the same way, and placed only
//! once nobody fences it any more, so its next host starts it right away and the wait is
//! measured once, from when this leader first saw it (after a recovery: from the recovered
//! ring's first leader, which is after the removed hosts could last have renewed).

use std::collections::{BTreeMap, BTreeSet};

use super::backup_report::{self, BackupReport};
use super::command::Command;
use super::control_plane::{ControlPlane, MoveKind, Phase};
use super::error::CommandError;
use super::etcd_cluster::{EtcdChangeStep, EtcdHealth, ZONE_TOLERANT_MEMBERS};
use super::member::Health;
use super::migration::MigrationReport;
use super::placement::{self, NoEligibleHost, Request};
use super::state::RingState;
use super::timing::Timing;

/// The leader's policy.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Policy {
    /// How long a granted lease lasts on the member, counted from before it asked.
    pub lease_ms: u64,
    /// How long a member takes, at most, to stop a workload once its lease ran out.
    pub fence_ms: u64,
    /// Allowance for clocks running at different rates.
    pub margin_ms: u64,
    /// Least time between two automatic moves of one control plane (anti-flapping).
    pub min_move_interval_ms: u64,
    /// Most control planes one member may host (0: no limit).
    pub capacity: usize,
    /// How long a member stays lost before its etcd members of zone-tolerant control planes
    /// are replaced on spare members ([`DEFAULT_ETCD_REPLACE_AFTER_MS`]).
    pub etcd_replace_after_ms: u64,
}

/// Default of [`Policy::etcd_replace_after_ms`]: five minutes. A zone back sooner rejoins its
/// clusters with its data; a replacement copies the whole database to the new member.
pub const DEFAULT_ETCD_REPLACE_AFTER_MS: u64 = 300_000;

impl Policy {
    /// The policy for `timing`, with the placement settings.
    pub fn new(timing: &Timing, min_move_interval_ms: u64, capacity: usize) -> Self {
        Self {
            lease_ms: timing.lease_ms,
            fence_ms: timing.fence_ms,
            margin_ms: timing.clock_margin_ms,
            min_move_interval_ms,
            capacity,
            etcd_replace_after_ms: DEFAULT_ETCD_REPLACE_AFTER_MS,
        }
    }

    /// The same policy, replacing lost etcd members after `ms`.
    pub fn with_etcd_replace_after_ms(mut self, ms: u64) -> Self {
        self.etcd_replace_after_ms = ms;
        self
    }

    /// How long a former host may still serve after the last lease it could have been granted.
    pub fn fence_wait_ms(&self) -> u64 {
        self.lease_ms + self.fence_ms + self.margin_ms
    }
}

/// What the leader observed beyond the committed state. Times are the leader's monotonic clock
/// (`now_ms`, `fencing_since`) except `unix_ms`, compared with the times in commands.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Observations {
    /// Now, on the leader's monotonic clock.
    pub now_ms: u64,
    /// Now, Unix milliseconds.
    pub unix_ms: u64,
    /// When this leader first saw (control plane, epoch) fencing.
    pub fencing_since: BTreeMap<(String, u64), u64>,
    /// (control plane, epoch, member): the member renewed its lease, in a request it sent after
    /// this leader saw the move, without holding the control plane.
    pub released: BTreeSet<(String, u64, String)>,
    /// (control plane, epoch, member): the host reports serving it.
    pub serving: BTreeSet<(String, u64, String)>,
    /// (control plane, epoch, member): the host's last report on the migration it performs.
    pub progress: BTreeMap<(String, u64, String), MigrationReport>,
    /// (control plane, epoch, member): the host's last report on the backups it writes, while
    /// it is worth committing ([`backup_report::worth_committing`]; [`Observations::observe`]
    /// forgets the others), so this holds only what waits for a commit, not every control
    /// plane that runs.
    pub backups: BTreeMap<(String, u64, String), BackupReport>,
    /// Member name -> when this leader first saw it judged lost (its monotonic clock).
    pub lost_since: BTreeMap<String, u64>,
    /// (control plane, cluster generation, host, step): the host reports it did the step its
    /// etcd cluster's change waits for.
    pub etcd_changes: BTreeSet<(String, u64, String, EtcdChangeStep)>,
    /// (control plane, cluster generation, host) -> ring member -> etcd member id: what the
    /// host read from etcd's member list, while it names an id the ring has not recorded
    /// ([`Observations::observe`] forgets the others).
    pub etcd_ids: BTreeMap<(String, u64, String), BTreeMap<String, u64>>,
    /// (control plane, epoch, host) -> what the host reports wrong with it (`None`: nothing),
    /// while that differs from the committed problem ([`Observations::observe`] forgets the
    /// others).
    pub problems: BTreeMap<(String, u64, String), Option<String>>,
}

impl Observations {
    /// Starts the fencing clock of every control plane newly seen with former hosts fencing it
    /// (phase `fencing`, or `unplaced` with a non-empty set), and forgets what no longer
    /// applies (also backup reports committed already or not worth committing).
    pub fn observe(&mut self, state: &RingState) {
        // Only a control plane that is not running can have former hosts fencing it.
        let fencing: BTreeSet<(String, u64)> = state
            .unsettled()
            .filter(|cp| !cp.fencing.is_empty())
            .map(|cp| (cp.name.clone(), cp.epoch))
            .collect();
        self.fencing_since.retain(|key, _| fencing.contains(key));
        for key in fencing {
            self.fencing_since.entry(key).or_insert(self.now_ms);
        }
        let current = |cp: &String, epoch: &u64| {
            state
                .control_planes
                .get(cp)
                .is_some_and(|c| c.epoch == *epoch)
        };
        self.released.retain(|(cp, epoch, _)| current(cp, epoch));
        self.serving.retain(|(cp, epoch, _)| current(cp, epoch));
        self.progress.retain(|(cp, epoch, _), _| current(cp, epoch));
        let lost: BTreeSet<&String> = state
            .members
            .values()
            .filter(|m| m.health == Health::Lost)
            .map(|m| &m.name)
            .collect();
        self.lost_since.retain(|m, _| lost.contains(m));
        for m in lost {
            self.lost_since.entry(m.clone()).or_insert(self.now_ms);
        }
        self.etcd_changes.retain(|(cp, generation, _, step)| {
            state
                .control_planes
                .get(cp)
                .and_then(|c| c.etcd.as_ref())
                .is_some_and(|e| {
                    e.generation == *generation
                        && e.change.as_ref().is_some_and(|c| c.step == *step)
                })
        });
        self.etcd_ids.retain(|(cp, generation, _), ids| {
            state.control_planes.get(cp).is_some_and(|c| {
                c.etcd.as_ref().is_some_and(|e| {
                    e.generation == *generation && !e.unrecorded_ids(ids).is_empty()
                })
            })
        });
        self.problems.retain(|(cp, epoch, _), reported| {
            state
                .control_planes
                .get(cp)
                .is_some_and(|c| c.epoch == *epoch && !same_problem(c, reported.as_deref()))
        });
        self.backups.retain(|(cp, epoch, _), report| {
            state.control_planes.get(cp).is_some_and(|c| {
                c.epoch == *epoch
                    && backup_report::worth_committing(c.backup_status.as_ref(), report)
            })
        });
    }
}

/// A command to propose, with the reason recorded in history.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Decision {
    /// The command.
    pub command: Command,
    /// Why.
    pub reason: String,
}

/// What the leader should propose now: at most one decision per control plane, in name order.
///
/// Only the control planes that [`RingState::may_change`] lists are looked at: one that runs
/// on a member not judged lost gets no decision (see [`decide_one`]), so a ring of thousands
/// of control planes costs a round only what is moving. The one exception is a backup report
/// ([`Command::ReportBackup`]), which is about control planes that run: those come from what
/// the hosts reported ([`Observations::backups`]), not from a scan of the state.
pub fn decide(state: &RingState, obs: &Observations, policy: &Policy) -> Vec<Decision> {
    let mut out = decide_for(state, state.may_change(), obs, policy);
    // Debug builds (every test, the simulation) check that nothing was skipped.
    debug_assert_eq!(
        out,
        decide_for(
            state,
            state.control_planes.values().map(Box::as_ref),
            obs,
            policy
        ),
        "a decision about a control plane `may_change` does not list"
    );
    let decided: BTreeSet<String> = out
        .iter()
        .filter_map(|d| d.command.control_plane_epoch())
        .map(|(name, _)| name.to_string())
        .collect();
    let mut reports = backup_reports(state, obs, &decided);
    reports.extend(problem_reports(state, obs, &decided));
    reports.extend(etcd_decisions(state, obs, policy, &decided));
    if !reports.is_empty() {
        out.extend(reports);
        // Every decision is about one control plane: back into name order (stable).
        out.sort_by_cached_key(|d| d.command.control_plane_epoch().map(|(n, _)| n.to_owned()));
    }
    out
}

/// The backup reports worth committing ([`backup_report::worth_committing`]): from the host of
/// a `running` control plane at its epoch, valid, and about a control plane nothing else in
/// this round (`decided`) is about.
fn backup_reports(
    state: &RingState,
    obs: &Observations,
    decided: &BTreeSet<String>,
) -> Vec<Decision> {
    let mut out = Vec::new();
    for ((name, epoch, member), report) in &obs.backups {
        let Some(cp) = state.control_planes.get(name) else {
            continue;
        };
        if cp.phase != Phase::Running
            || cp.epoch != *epoch
            || cp.host.as_deref() != Some(member.as_str())
            || decided.contains(name)
            || !backup_report::worth_committing(cp.backup_status.as_ref(), report)
            || report.validate().is_err()
        {
            continue;
        }
        out.push(Decision {
            command: Command::ReportBackup {
                name: name.clone(),
                epoch: *epoch,
                member: member.clone(),
                report: report.clone(),
            },
            reason: format!("{member} reports its backups"),
        });
    }
    out
}

/// Whether `reported` (a host's words, `None`: nothing wrong) is what `cp` has committed.
pub fn same_problem(cp: &ControlPlane, reported: Option<&str>) -> bool {
    cp.problem.as_ref().map(|p| p.text.as_str()) == reported
}

/// The hosts' problem reports to commit: from the host of a `starting` or `running` control
/// plane at its epoch, different from the committed one, valid, and about a control plane
/// nothing else in this round (`decided`) is about.
fn problem_reports(
    state: &RingState,
    obs: &Observations,
    decided: &BTreeSet<String>,
) -> Vec<Decision> {
    let mut out = Vec::new();
    for ((name, epoch, member), problem) in &obs.problems {
        let Some(cp) = state.control_planes.get(name) else {
            continue;
        };
        if !matches!(cp.phase, Phase::Starting | Phase::Running)
            || cp.epoch != *epoch
            || cp.host.as_deref() != Some(member.as_str())
            || decided.contains(name)
            || same_problem(cp, problem.as_deref())
        {
            continue;
        }
        let command = Command::ReportProblem {
            name: name.clone(),
            epoch: *epoch,
            member: member.clone(),
            problem: problem.clone(),
        };
        if command.validate().is_err() {
            continue;
        }
        out.push(Decision {
            command,
            reason: match problem {
                Some(_) => format!("{member} reports a problem with it"),
                None => format!("{member} reports it well again"),
            },
        });
    }
    out
}

/// The changes of zone-tolerant control planes' etcd clusters, for control planes nothing
/// else in this round (`decided`) is about:
/// - a host's report of the step its cluster's change waited for: committed
///   ([`Command::ReportEtcdChange`]), which moves the change on;
/// - unless the ring is paused, an etcd member whose ring member has been lost for
///   `etcd_replace_after_ms` (on this leader's clock), of a cluster with no change in progress
///   and hosted elsewhere: replaced by a spare ([`Command::ReplaceEtcdMember`]), chosen as
///   [`spare_for`] says. Nothing happens when there is no spare: the cluster stays degraded.
fn etcd_decisions(
    state: &RingState,
    obs: &Observations,
    policy: &Policy,
    decided: &BTreeSet<String>,
) -> Vec<Decision> {
    let mut out = Vec::new();
    let mut seen = BTreeSet::new();
    for (name, generation, member, step) in &obs.etcd_changes {
        let Some(cp) = state.control_planes.get(name) else {
            continue;
        };
        let Some(cluster) = &cp.etcd else { continue };
        if decided.contains(name)
            || cluster.generation != *generation
            || cp.host.as_deref() != Some(member.as_str())
            || cluster.change.as_ref().is_none_or(|c| c.step != *step)
            || !seen.insert(name.clone())
        {
            continue;
        }
        out.push(Decision {
            command: Command::ReportEtcdChange {
                name: name.clone(),
                generation: *generation,
                member: member.clone(),
                done: *step,
            },
            reason: format!("{member} reports the etcd cluster's step {step} done"),
        });
    }
    for ((name, generation, member), ids) in &obs.etcd_ids {
        let Some(cp) = state.control_planes.get(name) else {
            continue;
        };
        let Some(cluster) = &cp.etcd else { continue };
        let new = cluster.unrecorded_ids(ids);
        if decided.contains(name)
            || cluster.generation != *generation
            || cp.host.as_deref() != Some(member.as_str())
            || new.is_empty()
            || !seen.insert(name.clone())
        {
            continue;
        }
        out.push(Decision {
            command: Command::RecordEtcdIds {
                name: name.clone(),
                generation: *generation,
                member: member.clone(),
                ids: new,
            },
            reason: format!("{member} read etcd's member list"),
        });
    }
    if state.settings.paused {
        return out;
    }
    // A cluster left smaller by an operator's recovery grows back, once its host serves.
    for cp in state.small_clusters() {
        let Some(cluster) = &cp.etcd else { continue };
        if cluster.members.len() >= ZONE_TOLERANT_MEMBERS
            || cluster.change.is_some()
            || cp.phase != Phase::Running
            || decided.contains(&cp.name)
            || seen.contains(&cp.name)
        {
            continue;
        }
        let Some(spare) = spare_for(state, cp, "") else {
            continue;
        };
        seen.insert(cp.name.clone());
        out.push(Decision {
            command: Command::ReplaceEtcdMember {
                name: cp.name.clone(),
                remove: None,
                add: spare.clone(),
                generation: cluster.generation,
            },
            reason: format!(
                "its etcd cluster has {} of {ZONE_TOLERANT_MEMBERS} members; one more on {spare}",
                cluster.members.len()
            ),
        });
    }
    for (lost, since) in &obs.lost_since {
        let waited = obs.now_ms.saturating_sub(*since);
        if waited < policy.etcd_replace_after_ms {
            continue;
        }
        for cp in state.replicas_on(lost) {
            let Some(cluster) = &cp.etcd else { continue };
            // etcd removes a member only with quorum: a cluster without it waits for its
            // operator (`cp recover`), or a replacement would hang in its first step.
            let no_quorum = matches!(state.etcd_health(cp), Some(EtcdHealth::NoQuorum { .. }));
            if cluster.change.is_some()
                || no_quorum
                || cp.host.as_deref() == Some(lost.as_str())
                || decided.contains(&cp.name)
                || seen.contains(&cp.name)
            {
                continue;
            }
            let Some(spare) = spare_for(state, cp, lost) else {
                continue;
            };
            seen.insert(cp.name.clone());
            out.push(Decision {
                command: Command::ReplaceEtcdMember {
                    name: cp.name.clone(),
                    remove: Some(lost.clone()),
                    add: spare.clone(),
                    generation: cluster.generation,
                },
                reason: format!(
                    "{lost} lost for {waited} ms >= etcd_replace_after_ms {}; its etcd member moves to {spare}",
                    policy.etcd_replace_after_ms
                ),
            });
        }
    }
    out
}

/// A member to run the etcd member of `cp` that `lost` ran: one with an etcd peer address and
/// an endpoint for it, in the ring (not joining), healthy, not cordoned, running none of its
/// etcd members, in a zone none of the others uses; the one hosting the fewest control
/// planes, then the lowest id.
fn spare_for<'a>(state: &'a RingState, cp: &ControlPlane, lost: &str) -> Option<&'a String> {
    let cluster = cp.etcd.as_ref()?;
    let zones: BTreeSet<&str> = cluster
        .names()
        .filter(|m| *m != lost)
        .filter_map(|m| state.member_by_name(m))
        .map(|m| m.zone.as_str())
        .collect();
    state
        .members
        .values()
        .filter(|m| {
            cp.etcd_peers.contains_key(&m.name)
                && cp.endpoints.contains_key(&m.name)
                && !cluster.contains(&m.name)
                && m.role != crate::member::Role::Joining
                && m.health == Health::Healthy
                && m.diverged.is_none()
                && !m.cordoned
                && !zones.contains(m.zone.as_str())
        })
        .min_by_key(|m| (state.hosted_count(&m.name), m.id))
        .map(|m| &m.name)
}

/// The decisions about `control_planes`, in their order. Placements count the control planes
/// the earlier decisions of this round give each member
/// ([`placement::choose_host_planned`]), so a batch spreads and respects capacity.
fn decide_for<'a>(
    state: &RingState,
    control_planes: impl IntoIterator<Item = &'a ControlPlane>,
    obs: &Observations,
    policy: &Policy,
) -> Vec<Decision> {
    let mut planned: BTreeMap<String, usize> = BTreeMap::new();
    let mut out = Vec::new();
    for cp in control_planes {
        if let Some(d) = decide_one(state, cp, obs, policy, &planned) {
            if let Command::MoveControlPlane { to: Some(to), .. } = &d.command {
                *planned.entry(to.clone()).or_default() += 1;
            }
            out.push(d);
        }
    }
    out
}

fn decide_one(
    state: &RingState,
    cp: &ControlPlane,
    obs: &Observations,
    policy: &Policy,
    planned: &BTreeMap<String, usize>,
) -> Option<Decision> {
    match cp.phase {
        Phase::Fencing | Phase::Unplaced if !cp.fencing.is_empty() => {
            let since = obs.fencing_since.get(&(cp.name.clone(), cp.epoch))?;
            let waited = obs.now_ms.saturating_sub(*since);
            for member in &cp.fencing {
                let key = (cp.name.clone(), cp.epoch, member.clone());
                let reason = if obs.released.contains(&key) {
                    format!("{member} reported it stopped")
                } else if waited >= policy.fence_wait_ms() {
                    format!(
                        "{member}'s lease ran out: fenced for {waited} ms >= lease {} + fence {} + margin {} ms",
                        policy.lease_ms, policy.fence_ms, policy.margin_ms
                    )
                } else {
                    continue;
                };
                return Some(Decision {
                    command: Command::ReleaseFence {
                        name: cp.name.clone(),
                        epoch: cp.epoch,
                        member: member.clone(),
                    },
                    reason,
                });
            }
        }
        Phase::Starting => {
            let host = cp.host.as_ref()?;
            // Progress first: the host's last report (the snapshot restored, the data-loss
            // window) is committed before the migration is marked done.
            let key = (cp.name.clone(), cp.epoch, host.clone());
            if let (Some(report), Some(migration)) = (obs.progress.get(&key), &cp.migration)
                && migration.epoch == cp.epoch
                && migration.worth_committing(report, obs.unix_ms)
            {
                return Some(Decision {
                    command: Command::ReportMigration {
                        name: cp.name.clone(),
                        epoch: cp.epoch,
                        member: host.clone(),
                        report: report.clone(),
                    },
                    reason: format!("{host} reports the migration's progress"),
                });
            }
            if obs
                .serving
                .contains(&(cp.name.clone(), cp.epoch, host.clone()))
            {
                return Some(Decision {
                    command: Command::ReportServing {
                        name: cp.name.clone(),
                        epoch: cp.epoch,
                        member: host.clone(),
                    },
                    reason: format!("{host} reports serving it"),
                });
            }
        }
        Phase::Running | Phase::Fencing | Phase::Unplaced => {}
    }
    if state.settings.paused {
        return None;
    }
    let host = cp.host.as_ref().and_then(|h| state.member_by_name(h));
    match (cp.phase, host) {
        // Placed once no former host may serve it any more (see the module docs).
        (Phase::Unplaced, _) if !cp.fencing.is_empty() => None,
        (Phase::Unplaced, _) => {
            let to = placement::choose_host_planned(
                state,
                &Request::moving(cp),
                policy.capacity,
                planned,
            )
            .ok()?;
            Some(move_to(
                cp,
                Some(to),
                MoveKind::Placement,
                String::new(),
                "placed".into(),
            ))
        }
        (_, Some(h)) if h.health == Health::Lost => {
            let since_move = obs.unix_ms.saturating_sub(cp.moved_at_ms);
            if cp.moved_at_ms > 0 && since_move < policy.min_move_interval_ms {
                return None;
            }
            let request = Request::moving(cp).avoiding_zone(Some(&h.zone));
            let reason = format!("host {} is lost", h.name);
            Some(
                match placement::choose_host_planned(state, &request, policy.capacity, planned) {
                    Ok(to) => move_to(cp, Some(to), MoveKind::Failover, String::new(), reason),
                    Err(why) => move_to(cp, None, MoveKind::Failover, why.to_string(), reason),
                },
            )
        }
        _ => None,
    }
}

fn move_to(
    cp: &ControlPlane,
    to: Option<String>,
    kind: MoveKind,
    note: String,
    reason: String,
) -> Decision {
    Decision {
        command: Command::MoveControlPlane {
            name: cp.name.clone(),
            to,
            epoch: cp.epoch + 1,
            kind,
            note,
        },
        reason,
    }
}

/// Why an operator's move cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PlanError {
    /// No control plane with this name.
    #[error("unknown control plane {0:?}")]
    UnknownControlPlane(String),
    /// Nobody can take it.
    #[error("cannot move {control_plane}: {why}")]
    NoHost {
        /// The control plane.
        control_plane: String,
        /// Why nobody can.
        why: NoEligibleHost,
    },
    /// The state refuses the move.
    #[error("cannot move {control_plane}: {error}")]
    Refused {
        /// The control plane.
        control_plane: String,
        /// The state's refusal.
        error: CommandError,
    },
}

/// What an operator's move does: `names` to move, each to `to` or to the member placement
/// chooses (never their current host). Planned on a copy of the state, one move after the
/// other, so capacity and spreading see the earlier moves; the first control plane nobody can
/// take ends the plan with the reason.
pub fn plan_moves(
    state: &RingState,
    names: &[String],
    to: Option<&str>,
    kind: MoveKind,
    policy: &Policy,
    at_ms: u64,
) -> Result<Vec<Command>, PlanError> {
    let mut scratch = state.clone();
    let mut plan = Vec::new();
    for name in names {
        let cp = scratch
            .control_planes
            .get(name)
            .ok_or_else(|| PlanError::UnknownControlPlane(name.clone()))?;
        let target = match to {
            Some(t) => t.to_string(),
            None => placement::choose_host(&scratch, &Request::moving(cp), policy.capacity)
                .map_err(|why| PlanError::NoHost {
                    control_plane: name.clone(),
                    why,
                })?,
        };
        let command = Command::MoveControlPlane {
            name: name.clone(),
            to: Some(target),
            epoch: cp.epoch + 1,
            kind,
            note: String::new(),
        };
        let proposal = super::command::Proposal {
            command: command.clone(),
            at_ms,
            actor: "plan".into(),
            reason: String::new(),
        };
        let index = scratch.history.iter().next_back().map_or(0, |e| e.index) + 1;
        scratch
            .apply(index, &proposal)
            .map_err(|error| PlanError::Refused {
                control_plane: name.clone(),
                error,
            })?;
        plan.push(command);
    }
    Ok(plan)
}

#[cfg(test)]
mod tests;
