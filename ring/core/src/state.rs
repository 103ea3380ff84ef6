//! [`RingState`]: everything the ring agrees on, and [`RingState::apply`], the only way it
//! changes.
//!
//! `apply` validates a command completely before it touches anything, so a refused command leaves
//! the state exactly as it was. After every change [`RingState::check_invariants`] asserts the
//! rules the rest of the system relies on (one host per control plane, never at home, a hosted
//! control plane has an epoch of at least 1 and an endpoint on its host, unique names, retired ids
//! never registered again).

use std::collections::{BTreeMap, BTreeSet};

use serde::{Deserialize, Serialize};

use super::NodeId;
use super::backup_report::BackupReport;
use super::command::{Command, ControlPlaneSpec, Proposal};
use super::control_plane::{ControlPlane, HostProblem, MoveKind, Phase};
use super::error::{CommandError, ReportKind, Unfitness};
use super::etcd_cluster::{
    EtcdChange, EtcdChangeStep, EtcdCluster, EtcdHealth, EtcdMember, ReplicaKey, Tolerance,
    ZONE_TOLERANT_MEMBERS,
};
use super::history::{Event, History};
use super::limits::{MAX_CONTROL_PLANES, MAX_MEMBERS};
use super::member::{Divergence, Health, Member, MemberSpec, Role};
use super::migration::{Migration, MigrationReport, MigrationStep};
use super::names::check_name_in_zone;
use super::placement::{self, Roster};
use super::revocation::{MAX_REVOKED, Revocation};
use super::ring_version::RingVersion;

/// Ring-wide settings.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RingSettings {
    /// When set, the ring takes no automatic action (no failover); operator commands still work.
    pub paused: bool,
    /// The DNS zone every control plane's DNS name lies inside, if the founders set one.
    #[serde(default)]
    pub dns_zone: Option<String>,
    /// How often this ring was recovered (`ringd recover`, `ringctl snapshot restore`). Members
    /// whose state disagrees on it belong to different rings and refuse each other's messages
    /// (see [`RingState::generation`]).
    #[serde(default)]
    pub recoveries: u64,
    /// The ring's version (see [`crate::ring_version`]). Not stored while it is version 1
    /// without a hold, so a state of that version encodes exactly as release 0.1.0's.
    #[serde(default, skip_serializing_if = "RingVersion::is_initial")]
    pub ring_version: RingVersion,
}

/// The replicated state of a ring, version 1.
///
/// Besides what is stored it keeps an [`Index`] of its control planes (by host, by former
/// host still fencing, and those not `running`), so that a lease renewal, the controller and
/// placement look only at the control planes concerned instead of scanning all of them. The
/// index is derived: never serialized, rebuilt when a state is decoded, kept by `apply`, and
/// checked against a recomputation by [`RingState::check_invariants`].
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(from = "StoredRingState")]
pub struct RingState {
    /// Whether the initial members have been registered.
    pub bootstrapped: bool,
    /// Registered members by id.
    pub members: BTreeMap<NodeId, Member>,
    /// Ids of removed members; never accepted again.
    pub retired_ids: BTreeSet<NodeId>,
    /// Control planes by name. Change them only through [`RingState::apply`] (which keeps the
    /// index), or call [`RingState::reindex`] afterwards. Boxed: a map node then holds eleven
    /// pointers instead of eleven control planes (5.6 KiB), which matters because nodes filled
    /// in name order stay about half full (10,000 control planes: about 4 MiB less).
    pub control_planes: BTreeMap<String, Box<ControlPlane>>,
    /// Ring-wide settings.
    pub settings: RingSettings,
    /// Who did what, when and why.
    pub history: History,
    /// Certificates the ring refuses although its CA signed them (at most
    /// [`MAX_REVOKED`](crate::revocation::MAX_REVOKED)), oldest first.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub revoked: Vec<Revocation>,
    /// Derived lookups over `control_planes` (not stored).
    #[serde(skip)]
    index: Index,
}

/// [`RingState`] as stored: everything but the index, which is rebuilt from it.
#[derive(Deserialize)]
struct StoredRingState {
    bootstrapped: bool,
    members: BTreeMap<NodeId, Member>,
    retired_ids: BTreeSet<NodeId>,
    control_planes: BTreeMap<String, Box<ControlPlane>>,
    settings: RingSettings,
    history: History,
    #[serde(default)]
    revoked: Vec<Revocation>,
}

impl From<StoredRingState> for RingState {
    fn from(s: StoredRingState) -> Self {
        let mut state = Self {
            bootstrapped: s.bootstrapped,
            members: s.members,
            retired_ids: s.retired_ids,
            control_planes: s.control_planes,
            settings: s.settings,
            history: s.history,
            revoked: s.revoked,
            index: Index::default(),
        };
        state.reindex();
        state
    }
}

/// Lookups over the control planes, derived from them (see [`RingState`]).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Index {
    /// Member name -> the control planes it hosts (any phase but `unplaced`).
    by_host: BTreeMap<String, BTreeSet<String>>,
    /// Member name -> the control planes whose `fencing` set holds it.
    fenced_by: BTreeMap<String, BTreeSet<String>>,
    /// The control planes not `running`: the only ones the controller may act on, besides
    /// those of a lost host.
    unsettled: BTreeSet<String>,
    /// DNS name -> the control plane that has it.
    by_dns_name: BTreeMap<String, String>,
    /// Member name -> the zone-tolerant control planes it runs an etcd member of.
    replicas: BTreeMap<String, BTreeSet<String>>,
    /// The zone-tolerant control planes whose etcd cluster has fewer than three members (after
    /// an operator's recovery): the controller grows them back.
    small_clusters: BTreeSet<String>,
}

impl Index {
    /// The index of `control_planes`, computed from scratch.
    fn of(control_planes: &BTreeMap<String, Box<ControlPlane>>) -> Self {
        let mut index = Self::default();
        for cp in control_planes.values() {
            index.insert(cp);
        }
        index
    }

    fn insert(&mut self, cp: &ControlPlane) {
        if let Some(host) = &cp.host {
            self.by_host
                .entry(host.clone())
                .or_default()
                .insert(cp.name.clone());
        }
        for member in &cp.fencing {
            self.fenced_by
                .entry(member.clone())
                .or_default()
                .insert(cp.name.clone());
        }
        if cp.phase != Phase::Running {
            self.unsettled.insert(cp.name.clone());
        }
        self.by_dns_name
            .insert(cp.dns_name.clone(), cp.name.clone());
        for member in cp.etcd.iter().flat_map(|c| c.names()) {
            self.replicas
                .entry(member.to_string())
                .or_default()
                .insert(cp.name.clone());
        }
        if cp
            .etcd
            .as_ref()
            .is_some_and(|c| c.members.len() < ZONE_TOLERANT_MEMBERS)
        {
            self.small_clusters.insert(cp.name.clone());
        }
    }

    fn remove(&mut self, cp: &ControlPlane) {
        fn take(map: &mut BTreeMap<String, BTreeSet<String>>, key: &str, name: &str) {
            if let Some(set) = map.get_mut(key) {
                set.remove(name);
                if set.is_empty() {
                    map.remove(key);
                }
            }
        }
        if let Some(host) = &cp.host {
            take(&mut self.by_host, host, &cp.name);
        }
        for member in &cp.fencing {
            take(&mut self.fenced_by, member, &cp.name);
        }
        self.unsettled.remove(&cp.name);
        if self.by_dns_name.get(&cp.dns_name) == Some(&cp.name) {
            self.by_dns_name.remove(&cp.dns_name);
        }
        for member in cp.etcd.iter().flat_map(|c| c.names()) {
            take(&mut self.replicas, member, &cp.name);
        }
        self.small_clusters.remove(&cp.name);
    }
}

impl RingState {
    /// Looks a member up by name.
    pub fn member_by_name(&self, name: &str) -> Option<&Member> {
        self.members.values().find(|m| m.name == name)
    }

    /// Looks a member up by id (decimal) or by name.
    pub fn member_by_ref(&self, reference: &str) -> Option<&Member> {
        reference
            .parse::<NodeId>()
            .ok()
            .and_then(|id| self.members.get(&id))
            .or_else(|| self.member_by_name(reference))
    }

    /// Number of control planes hosted by the member named `name`.
    pub fn hosted_count(&self, name: &str) -> usize {
        self.index.by_host.get(name).map_or(0, BTreeSet::len)
    }

    /// What member `name` may serve now: its control planes in `Starting` or `Running`, with
    /// their epochs. A lease granted by the leader covers exactly these.
    pub fn grants(&self, name: &str) -> BTreeMap<String, u64> {
        self.grants_iter(name)
            .map(|(cp, epoch)| (cp.to_string(), epoch))
            .collect()
    }

    /// [`grants`](RingState::grants) in name order, without copying (an agent compares them
    /// with its last grant at every applied index).
    pub fn grants_iter<'a>(&'a self, name: &str) -> impl Iterator<Item = (&'a str, u64)> + 'a {
        self.hosted(name)
            .filter(|cp| matches!(cp.phase, Phase::Starting | Phase::Running))
            .map(|cp| (cp.name.as_str(), cp.epoch))
    }

    /// The etcd members the member named `name` runs: zone-tolerant control plane -> which
    /// run of its etcd member ([`EtcdMember::key`]). Unlike [`grants`]
    /// this does not depend on the phase or the host: an etcd member runs for as long as it
    /// belongs to the cluster (etcd itself keeps its members consistent; only the host's gate,
    /// which clients reach, is fenced by epochs). The lease covers these too, so a member cut
    /// off from the ring stops them at its deadline like everything else it runs.
    ///
    /// [`grants`]: RingState::grants
    pub fn replica_grants(&self, name: &str) -> BTreeMap<String, ReplicaKey> {
        self.replica_grants_iter(name)
            .map(|(cp, key)| (cp.to_string(), key))
            .collect()
    }

    /// [`replica_grants`](RingState::replica_grants) in name order, without copying.
    pub fn replica_grants_iter<'a>(
        &'a self,
        name: &'a str,
    ) -> impl Iterator<Item = (&'a str, ReplicaKey)> + 'a {
        self.lookup(self.index.replicas.get(name))
            .filter_map(move |cp| {
                let cluster = cp.etcd.as_ref()?;
                let member = cluster.member(name).filter(|_| cluster.may_run(name))?;
                Some((cp.name.as_str(), member.key()))
            })
    }

    /// How the etcd cluster of a zone-tolerant control plane stands, as far as the ring can
    /// tell: members whose ring member is judged lost, or no longer registered, are down.
    /// `None` for a control plane with one etcd.
    pub fn etcd_health(&self, cp: &ControlPlane) -> Option<EtcdHealth> {
        let cluster = cp.etcd.as_ref()?;
        Some(cluster.health(|name| {
            self.member_by_name(name)
                .is_some_and(|m| m.health != Health::Lost)
        }))
    }

    /// The zone-tolerant control planes whose etcd cluster has fewer than three members.
    pub fn small_clusters(&self) -> impl Iterator<Item = &ControlPlane> + '_ {
        self.lookup(Some(&self.index.small_clusters))
    }

    /// The zone-tolerant control planes the member named `name` runs an etcd member of.
    pub fn replicas_on<'a>(&'a self, name: &str) -> impl Iterator<Item = &'a ControlPlane> + 'a {
        self.lookup(self.index.replicas.get(name))
    }

    /// Names of the control planes hosted by the member named `name`.
    pub fn hosted_by(&self, name: &str) -> Vec<String> {
        self.index
            .by_host
            .get(name)
            .map(|set| set.iter().cloned().collect())
            .unwrap_or_default()
    }

    /// The control planes hosted by the member named `name` (any phase), by name.
    pub fn hosted<'a>(&'a self, name: &str) -> impl Iterator<Item = &'a ControlPlane> + 'a {
        self.lookup(self.index.by_host.get(name))
    }

    /// The control planes whose `fencing` set holds the member named `name`, by name.
    pub fn fenced_by<'a>(&'a self, name: &str) -> impl Iterator<Item = &'a ControlPlane> + 'a {
        self.lookup(self.index.fenced_by.get(name))
    }

    /// The control planes the leader's controller may act on: those not `running` (unplaced,
    /// fencing, starting) and, unless the ring is paused, those on a member judged lost; in
    /// name order. Every other control plane runs on a member not lost, and nothing is decided
    /// for it (see [`crate::controller::decide`]).
    pub fn may_change(&self) -> Vec<&ControlPlane> {
        let mut names: BTreeSet<&String> = self.index.unsettled.iter().collect();
        if !self.settings.paused {
            for m in self.members.values().filter(|m| m.health == Health::Lost) {
                if let Some(set) = self.index.by_host.get(&m.name) {
                    names.extend(set);
                }
            }
        }
        names
            .into_iter()
            .filter_map(|n| self.control_planes.get(n).map(Box::as_ref))
            .collect()
    }

    /// The control planes not `running`, by name.
    pub fn unsettled(&self) -> impl Iterator<Item = &ControlPlane> + '_ {
        self.lookup(Some(&self.index.unsettled))
    }

    fn lookup<'a>(
        &'a self,
        names: Option<&'a BTreeSet<String>>,
    ) -> impl Iterator<Item = &'a ControlPlane> + 'a {
        names
            .into_iter()
            .flatten()
            .filter_map(|n| self.control_planes.get(n).map(Box::as_ref))
    }

    /// Rebuilds the index from `control_planes`: for code that changed them directly
    /// (tests); `apply` keeps it up to date itself.
    pub fn reindex(&mut self) {
        self.index = Index::of(&self.control_planes);
    }

    /// Applies a committed proposal at log `index`. On error nothing changed.
    ///
    /// A [`Command::Recover`] is refused here: it never travels through the log (see
    /// [`RingState::recover`]).
    pub fn apply(&mut self, index: u64, proposal: &Proposal) -> Result<(), CommandError> {
        if matches!(proposal.command, Command::Recover { .. }) {
            return Err(CommandError::RecoveryThroughRaft);
        }
        self.apply_any(index, proposal)
    }

    /// Which incarnation of the ring this state belongs to, as peer messages carry it: 0 before
    /// the founders are registered (a member with no state yet, which every ring accepts), then
    /// 1 for the ring as formed, plus one per recovery. Two members with different non-zero
    /// generations refuse each other's messages: one of them kept its state from before a
    /// recovery that removed it, possibly without the ring knowing its id.
    pub fn generation(&self) -> u64 {
        if self.bootstrapped {
            self.settings.recoveries.saturating_add(1)
        } else {
            0
        }
    }

    /// Applies a [`Command::Recover`] at `index` (one past the last entry the state reflects):
    /// the ring restarts with the survivor as its only member. Used offline by `ringd recover`
    /// and `ringctl snapshot restore` (see `garden_ring::recovery`); like [`RingState::apply`] it
    /// validates first, changes nothing when it refuses, records a history event and checks the
    /// invariants.
    ///
    /// What it does, in order:
    /// - every control plane hosted on a removed member loses its host at the next epoch
    ///   (`unplaced`), and the removed host joins its `fencing` set unless it was judged lost
    ///   already: nobody knows when that host last renewed its lease, so the control plane is
    ///   placed again only once the recovered ring's leader has watched the set for
    ///   `lease + fence + margin` (see [`crate::controller`]);
    /// - the other members are removed and their ids retired, exactly as `RemoveMember` does;
    /// - the survivor keeps its control planes (same host, same epoch), takes the addresses
    ///   given, and becomes the only voter;
    /// - the ring's generation goes up by one ([`RingState::generation`]).
    pub fn recover(&mut self, index: u64, proposal: &Proposal) -> Result<(), CommandError> {
        if !matches!(proposal.command, Command::Recover { .. }) {
            return Err(CommandError::NotARecovery {
                action: proposal.command.action().to_string(),
            });
        }
        self.apply_any(index, proposal)
    }

    fn apply_any(&mut self, index: u64, proposal: &Proposal) -> Result<(), CommandError> {
        // The control plane a command is about leaves the index while it changes and comes
        // back as it is afterwards (also when the command was refused: then it is unchanged).
        // Commands that change several control planes keep the index themselves.
        let touched = touched_control_plane(&proposal.command);
        if let Some(cp) = touched.and_then(|n| self.control_planes.get(n)) {
            self.index.remove(cp);
        }
        let result = self.apply_checked(index, proposal);
        if let Some(cp) = touched.and_then(|n| self.control_planes.get(n)) {
            self.index.insert(cp);
        }
        if result.is_ok() {
            self.check_after(&proposal.command);
        }
        result
    }

    fn apply_checked(&mut self, index: u64, proposal: &Proposal) -> Result<(), CommandError> {
        proposal.validate()?;
        self.settings.ring_version.admits(&proposal.command)?;
        let subject = subject(self, &proposal.command);
        let detail = match &proposal.command {
            Command::Bootstrap { members, dns_zone } => match self.bootstrap(members, dns_zone)? {
                Some(detail) => detail,
                None => return Ok(()),
            },
            Command::AddMember(spec) => self.add_member(spec)?,
            Command::PromoteMember { id } => self.promote_member(*id)?,
            Command::RemoveMember { id } => self.remove_member(*id)?,
            Command::SetHealth { id, health } => match self.set_health(*id, *health)? {
                Some(detail) => detail,
                None => return Ok(()),
            },
            Command::AddControlPlane(spec) => {
                self.add_control_plane(spec, index, proposal.at_ms)?
            }
            Command::RemoveControlPlane { name } => self.remove_control_plane(name)?,
            Command::MoveControlPlane {
                name,
                to,
                epoch,
                kind,
                note,
            } => {
                self.move_control_plane(name, to.as_deref(), *epoch, *kind, note, proposal.at_ms)?
            }
            Command::ReleaseFence {
                name,
                epoch,
                member,
            } => self.release_fence(name, *epoch, member)?,
            Command::ReportServing {
                name,
                epoch,
                member,
            } => self.report_serving(name, *epoch, member, proposal.at_ms)?,
            Command::ReportMigration {
                name,
                epoch,
                member,
                report,
            } => self.report_migration(name, *epoch, member, report, proposal.at_ms)?,
            Command::ReportBackup {
                name,
                epoch,
                member,
                report,
            } => match self.report_backup(name, *epoch, member, report)? {
                Some(detail) => detail,
                None => return Ok(()),
            },
            Command::ReportProblem {
                name,
                epoch,
                member,
                problem,
            } => match self.report_problem(
                name,
                *epoch,
                member,
                problem.as_deref(),
                proposal.at_ms,
            )? {
                Some(detail) => detail,
                None => return Ok(()),
            },
            Command::ReplaceEtcdMember {
                name,
                remove,
                add,
                generation,
            } => self.replace_etcd_member(name, remove.as_deref(), add, *generation)?,
            Command::RecoverEtcdCluster {
                name,
                from,
                generation,
                from_backup,
            } => self.recover_etcd_cluster(name, from, *generation, *from_backup)?,
            Command::ReportEtcdChange {
                name,
                generation,
                member,
                done,
            } => self.report_etcd_change(name, *generation, member, *done)?,
            Command::RecordEtcdIds {
                name,
                generation,
                member,
                ids,
            } => self.record_etcd_ids(name, *generation, member, ids)?,
            Command::MarkDiverged {
                id,
                acknowledged_index,
            } => {
                let divergence = Divergence {
                    acknowledged_index: *acknowledged_index,
                    reason: proposal.reason.clone(),
                };
                match self.member_mut(*id)?.mark_diverged(divergence) {
                    Some(detail) => detail,
                    None => return Ok(()),
                }
            }
            Command::SetLabels { id, labels } => {
                let member = self.member_mut(*id)?;
                member.labels = labels.clone();
                labels_detail(labels)
            }
            Command::SetControlPlaneLabels { name, labels } => {
                let cp = self
                    .control_planes
                    .get_mut(name)
                    .ok_or_else(|| CommandError::UnknownControlPlane(name.clone()))?;
                cp.labels = labels.clone();
                labels_detail(labels)
            }
            Command::Cordon { id, cordoned } => match self.cordon(*id, *cordoned)? {
                Some(detail) => detail,
                None => return Ok(()),
            },
            Command::Recover {
                survivor,
                removed,
                source,
            } => self.recover_ring(survivor, removed, source, proposal.at_ms)?,
            Command::RevokeCertificate {
                issuer,
                serial,
                subject,
                reason,
            } => self.revoke(issuer, serial, subject, reason, proposal)?,
            Command::UnrevokeCertificate { issuer, serial } => self.unrevoke(issuer, serial)?,
            Command::SetRingVersion { version } => {
                let from = self.settings.ring_version.active;
                self.settings.ring_version = RingVersion {
                    active: *version,
                    held: None,
                };
                format!("ring version {from} -> {version}")
            }
            Command::HoldUpgrade { held } => {
                let version = &mut self.settings.ring_version;
                version.held = held.then(|| proposal.reason.clone());
                if *held {
                    format!("held at ring version {}", version.active)
                } else {
                    format!("hold on ring version {} released", version.active)
                }
            }
            Command::SetPaused { paused } => {
                self.settings.paused = *paused;
                if *paused {
                    "automatic actions paused".to_string()
                } else {
                    "automatic actions resumed".to_string()
                }
            }
        };
        self.history.push(Event {
            index,
            at_ms: proposal.at_ms,
            actor: proposal.actor.clone(),
            action: proposal.command.action().to_string(),
            subject,
            reason: proposal.reason.clone(),
            detail,
        });
        Ok(())
    }

    /// Mirrors a committed Raft membership: members in `voters` become voters, in `learners`
    /// learners, all other registered members are joining.
    pub fn apply_membership(&mut self, voters: &BTreeSet<NodeId>, learners: &BTreeSet<NodeId>) {
        for member in self.members.values_mut() {
            member.role = if voters.contains(&member.id) {
                Role::Voter
            } else if learners.contains(&member.id) {
                Role::Learner
            } else {
                Role::Joining
            };
        }
        self.check_invariants();
    }

    fn bootstrap(
        &mut self,
        members: &[MemberSpec],
        dns_zone: &Option<String>,
    ) -> Result<Option<String>, CommandError> {
        if self.bootstrapped {
            let same = *dns_zone == self.settings.dns_zone
                && members.len() == self.members.len()
                && members.iter().all(|spec| {
                    self.members.get(&spec.id).is_some_and(|m| {
                        m.name == spec.name
                            && m.zone == spec.zone
                            && m.address == spec.address
                            && m.admin_address == spec.admin_address
                    })
                });
            return if same {
                Ok(None)
            } else {
                Err(CommandError::AlreadyBootstrapped)
            };
        }
        let mut seen_ids = BTreeSet::new();
        let mut seen_names = BTreeMap::new();
        for spec in members {
            if !seen_ids.insert(spec.id) {
                return Err(CommandError::DuplicateMemberId(spec.id));
            }
            if let Some(id) = seen_names.insert(spec.name.as_str(), spec.id) {
                return Err(CommandError::DuplicateMemberName {
                    name: spec.name.clone(),
                    id,
                });
            }
        }
        for spec in members {
            self.members
                .insert(spec.id, new_member(spec, Role::Voter, true));
        }
        self.settings.dns_zone = dns_zone.clone();
        self.bootstrapped = true;
        let names: Vec<_> = members
            .iter()
            .map(|m| format!("{}({})", m.name, m.id))
            .collect();
        Ok(Some(format!("ring formed by {}", names.join(", "))))
    }

    fn add_member(&mut self, spec: &MemberSpec) -> Result<String, CommandError> {
        // The founders are registered first. A member added before them could share a name or
        // an address with one, and Bootstrap only checks its own list.
        if !self.bootstrapped {
            return Err(CommandError::NotBootstrapped);
        }
        if self.retired_ids.contains(&spec.id) {
            return Err(CommandError::RetiredMemberId(spec.id));
        }
        if self.members.contains_key(&spec.id) {
            return Err(CommandError::DuplicateMemberId(spec.id));
        }
        if let Some(other) = self.member_by_name(&spec.name) {
            return Err(CommandError::DuplicateMemberName {
                name: spec.name.clone(),
                id: other.id,
            });
        }
        // Fencing sets hold member names. A former member of this name that may still hold a
        // lease must not be mistaken for the new one: the new member's first renewal (which
        // holds nothing) would release the old member's fence early.
        if let Some(cp) = self
            .control_planes
            .values()
            .find(|cp| cp.fencing.contains(&spec.name))
        {
            return Err(CommandError::NameStillFencing {
                control_plane: cp.name.clone(),
                name: spec.name.clone(),
            });
        }
        if let Some(other) = self
            .members
            .values()
            .find(|m| m.address == spec.address || m.admin_address == spec.admin_address)
        {
            return Err(CommandError::DuplicateAddress {
                name: other.name.clone(),
                id: other.id,
                address: other.address.clone(),
                admin_address: other.admin_address.clone(),
            });
        }
        if self.members.len() >= MAX_MEMBERS {
            return Err(CommandError::Limit(format!(
                "at most {MAX_MEMBERS} members"
            )));
        }
        self.members
            .insert(spec.id, new_member(spec, Role::Joining, false));
        Ok(format!(
            "id {} zone {} peer {} admin {}",
            spec.id, spec.zone, spec.address, spec.admin_address
        ))
    }

    fn promote_member(&mut self, id: NodeId) -> Result<String, CommandError> {
        let member = self.member_mut(id)?;
        if member.role == Role::Joining {
            return Err(CommandError::NotJoinedYet {
                name: member.name.clone(),
                id,
            });
        }
        member.wants_voter = true;
        Ok("to become a voter".into())
    }

    fn remove_member(&mut self, id: NodeId) -> Result<String, CommandError> {
        let member = self
            .members
            .get(&id)
            .ok_or_else(|| CommandError::UnknownMember(id.to_string()))?;
        let hosted = self.hosted_by(&member.name);
        if !hosted.is_empty() {
            return Err(CommandError::HostsControlPlanes {
                name: member.name.clone(),
                id,
                control_planes: hosted.iter().map(|cp| cp.to_string()).collect(),
            });
        }
        let replicas: Vec<String> = self
            .replicas_on(&member.name)
            .map(|cp| cp.name.clone())
            .collect();
        if !replicas.is_empty() {
            return Err(CommandError::RunsEtcdMembers {
                name: member.name.clone(),
                id,
                control_planes: replicas,
            });
        }
        let voters = self
            .members
            .values()
            .filter(|m| m.role == Role::Voter || m.wants_voter)
            .count();
        if member.role == Role::Voter && voters <= 1 {
            return Err(CommandError::LastVoter {
                name: member.name.clone(),
                id,
            });
        }
        let name = member.name.clone();
        self.members.remove(&id);
        self.retired_ids.insert(id);
        Ok(format!("{name} ({id}) removed; id {id} retired for good"))
    }

    /// See [`RingState::recover`]. Everything is checked before anything changes.
    fn recover_ring(
        &mut self,
        survivor: &MemberSpec,
        removed: &[NodeId],
        source: &str,
        at_ms: u64,
    ) -> Result<String, CommandError> {
        if !self.bootstrapped {
            return Err(CommandError::NothingToRecover);
        }
        if self.retired_ids.contains(&survivor.id) {
            return Err(CommandError::RecoveryFromRetiredMember { id: survivor.id });
        }
        let current = self.members.get(&survivor.id).ok_or_else(|| {
            CommandError::RecoveryFromUnknownMember {
                id: survivor.id,
                registered: self
                    .members
                    .values()
                    .map(|m| format!("{}({})", m.name, m.id))
                    .collect(),
            }
        })?;
        if current.name != survivor.name || current.zone != survivor.zone {
            return Err(CommandError::RecoveryIdentityMismatch {
                id: survivor.id,
                registered_name: current.name.clone(),
                registered_zone: current.zone.clone(),
                name: survivor.name.clone(),
                zone: survivor.zone.clone(),
            });
        }
        let others: BTreeSet<NodeId> = self
            .members
            .keys()
            .copied()
            .filter(|id| *id != survivor.id)
            .collect();
        let named: BTreeSet<NodeId> = removed.iter().copied().collect();
        if named != others || named.len() != removed.len() {
            return Err(CommandError::RecoveryRemovesOthers {
                others,
                removed: removed.to_vec(),
            });
        }
        let gone: BTreeMap<String, NodeId> = others
            .iter()
            .map(|id| (self.members[id].name.clone(), *id))
            .collect();

        // 1. Control planes hosted on removed members: no host, next epoch, and the host
        //    fencing it (move_control_plane keeps it in the set unless it was judged lost).
        let orphaned: Vec<(String, String, u64)> = self
            .control_planes
            .values()
            .filter_map(|cp| {
                let host = cp.host.as_ref().filter(|h| gone.contains_key(*h))?;
                Some((cp.name.clone(), host.clone(), cp.epoch))
            })
            .collect();
        for (name, host, epoch) in &orphaned {
            let note = format!("its host {host} was removed when the ring was recovered");
            self.move_control_plane(name, None, epoch + 1, MoveKind::Failover, &note, at_ms)
                .expect("unplacing an existing control plane at its next epoch is never refused");
        }
        // Every control plane left without a host, those just unplaced and those unplaced
        // before, waits for every removed member: entries only the lost members had may have
        // placed it on any of them, even on one this state judges lost, and that member may
        // still hold a lease. (Control planes on the survivor stay as they are: it restarts
        // them only after its start-up pause of a lease and a fence.)
        for cp in self.control_planes.values_mut() {
            if cp.host.is_none() {
                cp.fencing.extend(gone.keys().cloned());
            }
        }
        // Those changes went around `apply_any`, which keeps the index for one control plane.
        self.reindex();

        // A new generation: members that kept the state from before (the removed ones, and any
        // the survivor never heard of, added in entries only the lost members had) no longer
        // reach this ring.
        self.settings.recoveries += 1;

        // 2. The other members leave for good, like RemoveMember.
        for id in &others {
            self.members.remove(id);
            self.retired_ids.insert(*id);
        }

        // 3. The survivor: reachable where it says, the only voter.
        let member = self.members.get_mut(&survivor.id).expect("checked above");
        member.address = survivor.address.clone();
        member.admin_address = survivor.admin_address.clone();
        member.wants_voter = true;
        self.apply_membership(&BTreeSet::from([survivor.id]), &BTreeSet::new());

        let list = |items: Vec<String>| -> String {
            const SHOWN: usize = 20;
            let more = items.len().saturating_sub(SHOWN);
            let mut text = items.into_iter().take(SHOWN).collect::<Vec<_>>().join(", ");
            if more > 0 {
                text.push_str(&format!(" and {more} more"));
            }
            text
        };
        let removed_text = list(
            gone.iter()
                .map(|(name, id)| format!("{name}({id})"))
                .collect(),
        );
        let mut detail = format!(
            "recovered from {source}; {}({}) is the only member; removed {} for good (ids retired)",
            survivor.name,
            survivor.id,
            if removed_text.is_empty() {
                "nobody"
            } else {
                &removed_text
            }
        );
        if !orphaned.is_empty() {
            detail.push_str(&format!(
                "; control planes whose host was removed, placed again once its lease has certainly run out: {}",
                list(
                    orphaned
                        .iter()
                        .map(|(name, host, epoch)| format!("{name} (was on {host}, now epoch {})", epoch + 1))
                        .collect()
                )
            ));
        }
        Ok(detail)
    }

    fn control_plane_mut(&mut self, name: &str) -> Result<&mut ControlPlane, CommandError> {
        self.control_planes
            .get_mut(name)
            .map(Box::as_mut)
            .ok_or_else(|| CommandError::UnknownControlPlane(name.to_string()))
    }

    fn member_mut(&mut self, id: NodeId) -> Result<&mut Member, CommandError> {
        self.members
            .get_mut(&id)
            .ok_or_else(|| CommandError::UnknownMember(id.to_string()))
    }

    fn set_health(&mut self, id: NodeId, health: Health) -> Result<Option<String>, CommandError> {
        let member = self.member_mut(id)?;
        if member.health == health {
            return Ok(None);
        }
        let mut detail = format!("{} -> {}", member.health, health);
        member.health = health;
        member.contacted |= health == Health::Healthy;
        if health == Health::Lost {
            // Lost means silent for member_lost_ms > lease_ms + fence_ms + margin: whatever
            // lease it held has run out and it fenced itself (DESIGN.md rules 1 and 2).
            let name = member.name.clone();
            let released: Vec<String> = self
                .index
                .fenced_by
                .get(&name)
                .map(|set| set.iter().cloned().collect())
                .unwrap_or_default();
            for cp_name in &released {
                let cp = self
                    .control_planes
                    .get_mut(cp_name)
                    .expect("the index names existing control planes");
                self.index.remove(cp);
                cp.fencing.remove(&name);
                cp.end_fencing_if_done();
                self.index.insert(cp);
            }
            if !released.is_empty() {
                detail.push_str(&format!("; no longer fencing {}", released.join(", ")));
            }
        }
        Ok(Some(detail))
    }

    /// Assigns control plane `name` to member `to` (or unplaces it) at `epoch`, which must be
    /// exactly one more than its current epoch, so a decision taken on stale state fails. The
    /// former host joins the fencing set unless it never could have started it or was judged
    /// lost; the new host may start only once that set is empty.
    fn move_control_plane(
        &mut self,
        name: &str,
        to: Option<&str>,
        epoch: u64,
        kind: MoveKind,
        note: &str,
        at_ms: u64,
    ) -> Result<String, CommandError> {
        let cp = self
            .control_planes
            .get(name)
            .ok_or_else(|| CommandError::UnknownControlPlane(name.to_string()))?;
        if epoch != cp.epoch + 1 {
            return Err(CommandError::StaleMove {
                control_plane: name.to_string(),
                epoch: cp.epoch,
            });
        }
        if let Some(to) = to {
            let member = self
                .member_by_name(to)
                .ok_or_else(|| CommandError::UnknownMember(to.to_string()))?;
            if cp.host.as_deref() == Some(to) {
                return Err(CommandError::AlreadyHosted {
                    control_plane: name.to_string(),
                    member: to.to_string(),
                });
            }
            if cp.home.as_deref() == Some(to) {
                return Err(CommandError::MoveToHome {
                    control_plane: name.to_string(),
                    member: to.to_string(),
                });
            }
            if !cp.endpoints.contains_key(to) {
                return Err(CommandError::NoEndpoint {
                    control_plane: name.to_string(),
                    member: to.to_string(),
                });
            }
            if let Some(cluster) = &cp.etcd
                && !cluster.is_voter(to)
            {
                return Err(CommandError::NotAnEtcdMember {
                    control_plane: name.to_string(),
                    member: to.to_string(),
                    members: cluster
                        .members
                        .iter()
                        .filter(|m| !m.learner)
                        .map(|m| m.member.clone())
                        .collect(),
                });
            }
            if member.role == Role::Joining {
                return Err(CommandError::MoveToJoining {
                    member: to.to_string(),
                });
            }
            if member.cordoned {
                return Err(CommandError::MoveToCordoned {
                    member: to.to_string(),
                });
            }
            if member.health == Health::Lost {
                return Err(CommandError::MoveToLost {
                    member: to.to_string(),
                });
            }
        }
        // A former host judged lost has fenced itself. One that is no longer registered (removed,
        // or lost in a recovery) may still hold a lease: it stays in the set until it is
        // released (the leader watched the set for lease + fence + margin).
        let lost = |m: &str| {
            self.member_by_name(m)
                .is_some_and(|m| m.health == Health::Lost)
        };
        let mut fencing: BTreeSet<String> =
            cp.fencing.iter().filter(|m| !lost(m)).cloned().collect();
        if let Some(old) = &cp.host
            && matches!(cp.phase, Phase::Starting | Phase::Running)
            && !lost(old)
        {
            fencing.insert(old.clone());
        }
        let from = cp.host.clone().unwrap_or_else(|| "nowhere".into());
        // The data is where it was last served: the host before this move, or, for a control
        // plane that was unplaced, the source of the migration that left it so.
        let source_host = cp
            .host
            .clone()
            .or_else(|| cp.migration.as_ref().and_then(|m| m.from.clone()));
        let cp = self.control_planes.get_mut(name).expect("looked up above");
        cp.epoch = epoch;
        cp.moved_at_ms = at_ms;
        // The backups reported at the old epoch are the old host's; the new host reports its own.
        cp.backup_status = None;
        // So is what the old host reported wrong with it.
        cp.problem = None;
        match to {
            Some(to) => {
                // Moving back to a former host: it stops its old instance itself (its agent
                // drops every epoch it no longer holds before starting a new one).
                fencing.remove(to);
                cp.host = Some(to.to_string());
                cp.unplaced_reason.clear();
                cp.phase = if fencing.is_empty() {
                    Phase::Starting
                } else {
                    Phase::Fencing
                };
            }
            None => {
                cp.host = None;
                cp.phase = Phase::Unplaced;
                cp.unplaced_reason = note.to_string();
            }
        }
        cp.fencing = fencing;
        cp.migration = Some(Migration::begin(
            epoch,
            source_host.clone(),
            to.unwrap_or_default().to_string(),
            source_host
                .as_deref()
                .map(|h| cp.backup_for(h).to_string())
                .unwrap_or_else(|| cp.backup.clone()),
            to.map(|t| cp.backup_for(t).to_string()).unwrap_or_default(),
            if cp.fencing.is_empty() {
                MigrationStep::Handover
            } else {
                MigrationStep::Fencing
            },
            at_ms,
        ));
        let waiting = if cp.fencing.is_empty() {
            String::new()
        } else {
            format!(
                "; waiting for {} to release it",
                cp.fencing.iter().cloned().collect::<Vec<_>>().join(", ")
            )
        };
        Ok(match &cp.host {
            Some(to) => format!("{kind}: {from} -> {to} at epoch {epoch}{waiting}"),
            None => format!("{kind}: unplaced at epoch {epoch} ({note}){waiting}"),
        })
    }

    /// Member `member` no longer holds a lease on control plane `name` at `epoch` (it reported
    /// it stopped, or its lease ran out on the leader's clock).
    fn release_fence(
        &mut self,
        name: &str,
        epoch: u64,
        member: &str,
    ) -> Result<String, CommandError> {
        let cp = self.control_plane_mut(name)?;
        if cp.epoch != epoch {
            return Err(CommandError::WrongEpoch {
                control_plane: name.to_string(),
                epoch: cp.epoch,
                given: epoch,
            });
        }
        if !cp.fencing.remove(member) {
            return Err(CommandError::NotFencing {
                member: member.to_string(),
                control_plane: name.to_string(),
            });
        }
        cp.end_fencing_if_done();
        Ok(format!(
            "{member} released it at epoch {epoch}; now {}",
            cp.phase
        ))
    }

    /// The host reports serving control plane `name` at `epoch`.
    fn report_serving(
        &mut self,
        name: &str,
        epoch: u64,
        member: &str,
        at_ms: u64,
    ) -> Result<String, CommandError> {
        let cp = self.control_plane_mut(name)?;
        if cp.epoch != epoch || cp.host.as_deref() != Some(member) || cp.phase != Phase::Starting {
            return Err(unexpected_report(cp, member, ReportKind::Serving, epoch));
        }
        cp.phase = Phase::Running;
        let mut detail = format!("serving on {member} at epoch {epoch}");
        if let Some(m) = cp.migration.as_mut().filter(|m| m.epoch == epoch) {
            m.step = MigrationStep::Done;
            m.updated_unix_ms = at_ms;
            detail.push_str(&format!(
                "; migration done in {} ms",
                at_ms.saturating_sub(m.started_unix_ms)
            ));
            if let Some(window) = m.data_loss_window_ms {
                detail.push_str(&format!(", data-loss window {window} ms"));
            }
        }
        Ok(detail)
    }

    /// The host reports the migration's progress at `epoch`.
    fn report_migration(
        &mut self,
        name: &str,
        epoch: u64,
        member: &str,
        report: &MigrationReport,
        at_ms: u64,
    ) -> Result<String, CommandError> {
        let cp = self.control_plane_mut(name)?;
        if cp.epoch != epoch || cp.host.as_deref() != Some(member) || cp.phase != Phase::Starting {
            return Err(unexpected_report(cp, member, ReportKind::Migration, epoch));
        }
        let migration = cp
            .migration
            .as_mut()
            .filter(|m| m.epoch == epoch)
            .ok_or_else(|| CommandError::NoMigration {
                control_plane: name.to_string(),
                epoch,
            })?;
        migration.apply(report, at_ms)
    }

    /// The host reports the backups of control plane `name` at `epoch`; refused unless it is
    /// `running` there. The report replaces the committed one; history records only the first
    /// report of an epoch and a new full snapshot (`None`: nothing for history), so the
    /// periodic reports between full snapshots do not push the other events out.
    fn report_backup(
        &mut self,
        name: &str,
        epoch: u64,
        member: &str,
        report: &BackupReport,
    ) -> Result<Option<String>, CommandError> {
        let cp = self.control_plane_mut(name)?;
        if cp.epoch != epoch || cp.host.as_deref() != Some(member) || cp.phase != Phase::Running {
            return Err(unexpected_report(cp, member, ReportKind::Backups, epoch));
        }
        let recorded = cp
            .backup_status
            .as_ref()
            .is_none_or(|committed| committed.full != report.full);
        cp.backup_status = Some(report.clone());
        if !recorded {
            return Ok(None);
        }
        let full = match report.full_name() {
            Some(full) => format!("full snapshot {}", super::error::shorten(full)),
            None => "no full snapshot yet".into(),
        };
        let deltas = if report.delta_period_ms == 0 {
            "delta snapshots off".to_string()
        } else {
            format!(
                "{} delta snapshots since, one every {} ms",
                report.deltas_since_full, report.delta_period_ms
            )
        };
        Ok(Some(format!(
            "backups at epoch {epoch}: {full}, revision {}, {deltas}",
            report.revision
        )))
    }

    /// The host reports what is wrong with control plane `name` at `epoch` (`None`: nothing);
    /// refused unless it hosts it there, starting or running. `None` for history when nothing
    /// changes; a problem keeps its first time while only its words change.
    fn report_problem(
        &mut self,
        name: &str,
        epoch: u64,
        member: &str,
        problem: Option<&str>,
        at_ms: u64,
    ) -> Result<Option<String>, CommandError> {
        let cp = self.control_plane_mut(name)?;
        if cp.epoch != epoch
            || cp.host.as_deref() != Some(member)
            || !matches!(cp.phase, Phase::Starting | Phase::Running)
        {
            return Err(unexpected_report(cp, member, ReportKind::Problem, epoch));
        }
        match (cp.problem.take(), problem) {
            (None, None) => Ok(None),
            (Some(old), None) => Ok(Some(format!(
                "no problem any more on {member} at epoch {epoch} (reported since {} ms before): {}",
                at_ms.saturating_sub(old.since_ms),
                super::error::shorten(&old.text)
            ))),
            (old, Some(text)) => {
                let unchanged = old.as_ref().is_some_and(|o| o.text == text);
                let since_ms = old.as_ref().map_or(at_ms, |o| o.since_ms);
                cp.problem = Some(HostProblem {
                    text: text.to_string(),
                    since_ms,
                });
                if unchanged {
                    return Ok(None);
                }
                Ok(Some(format!(
                    "problem on {member} at epoch {epoch}: {text}"
                )))
            }
        }
    }

    /// Whether the certificate `serial` of `issuer` is revoked, and how.
    pub fn revocation(&self, issuer: &str, serial: &str) -> Option<&Revocation> {
        self.revoked.iter().find(|r| r.names(issuer, serial))
    }

    fn revoke(
        &mut self,
        issuer: &str,
        serial: &str,
        subject: &str,
        reason: &str,
        proposal: &Proposal,
    ) -> Result<String, CommandError> {
        if let Some(r) = self.revocation(issuer, serial) {
            return Err(CommandError::AlreadyRevoked {
                serial: serial.to_string(),
                issuer: issuer.to_string(),
                at_ms: r.at_ms,
                actor: r.actor.clone(),
            });
        }
        if self.revoked.len() >= MAX_REVOKED {
            return Err(CommandError::Limit(format!(
                "at most {MAX_REVOKED} revoked certificates; unrevoke those that expired"
            )));
        }
        self.revoked.push(Revocation {
            issuer: issuer.to_string(),
            serial: serial.to_string(),
            subject: subject.to_string(),
            reason: reason.to_string(),
            at_ms: proposal.at_ms,
            actor: proposal.actor.clone(),
        });
        Ok(format!(
            "certificate {serial} of {issuer}{} revoked: {reason}",
            if subject.is_empty() {
                String::new()
            } else {
                format!(" ({subject})")
            }
        ))
    }

    fn unrevoke(&mut self, issuer: &str, serial: &str) -> Result<String, CommandError> {
        let Some(at) = self.revoked.iter().position(|r| r.names(issuer, serial)) else {
            return Err(CommandError::NotRevoked {
                serial: serial.to_string(),
                issuer: issuer.to_string(),
            });
        };
        let r = self.revoked.remove(at);
        Ok(format!(
            "certificate {serial} of {issuer} accepted again (revoked at {} ms by {}: {})",
            r.at_ms, r.actor, r.reason
        ))
    }

    fn cordon(&mut self, id: NodeId, cordoned: bool) -> Result<Option<String>, CommandError> {
        let member = self.member_mut(id)?;
        if member.cordoned == cordoned {
            return Ok(None);
        }
        member.cordoned = cordoned;
        Ok(Some(if cordoned {
            "cordoned: no new control planes".into()
        } else {
            "uncordoned".into()
        }))
    }

    fn add_control_plane(
        &mut self,
        spec: &ControlPlaneSpec,
        index: u64,
        at_ms: u64,
    ) -> Result<String, CommandError> {
        if self.control_planes.contains_key(&spec.name) {
            return Err(CommandError::DuplicateControlPlane(spec.name.clone()));
        }
        if self.control_planes.len() >= MAX_CONTROL_PLANES {
            return Err(CommandError::Limit(format!(
                "at most {MAX_CONTROL_PLANES} control planes"
            )));
        }
        if let Some(zone) = &self.settings.dns_zone {
            check_name_in_zone(&spec.dns_name, zone).map_err(|why| {
                CommandError::invalid(
                    "DNS name",
                    &spec.dns_name,
                    format!(
                        "{why} (the ring's DNS zone; every control plane's name must lie inside it)"
                    ),
                )
            })?;
        }
        if let Some(other) = self.index.by_dns_name.get(&spec.dns_name) {
            return Err(CommandError::DuplicateDnsName {
                dns_name: spec.dns_name.clone(),
                control_plane: other.clone(),
            });
        }
        if let Some(home) = &spec.home
            && self.member_by_name(home).is_none()
        {
            return Err(CommandError::UnknownMember(home.clone()));
        }
        let named = spec.prefer.iter().filter(|p| !p.contains('='));
        for member in spec.endpoints.keys().chain(named) {
            if self.member_by_name(member).is_none() {
                return Err(CommandError::UnknownMember(member.clone()));
            }
        }
        if let Some(host) = &spec.host {
            let member = self
                .member_by_name(host)
                .ok_or_else(|| CommandError::UnknownMember(host.clone()))?;
            let unfit = if member.role == Role::Joining {
                Some(Unfitness::Joining)
            } else if member.health == Health::Lost {
                Some(Unfitness::Lost)
            } else if member.cordoned {
                Some(Unfitness::Cordoned)
            } else {
                None
            };
            if let Some(why) = unfit {
                return Err(CommandError::HostUnfit {
                    host: host.clone(),
                    why,
                });
            }
        }
        let mut etcd = None;
        let choice = if spec.tolerance == Tolerance::Zone {
            // A zone-tolerant control plane is placed whole or refused: its etcd cluster is
            // formed once, by the members chosen now.
            let (host, members) = placement::choose_etcd_members(self, spec, spec.host.as_deref())
                .map_err(|why| CommandError::TooFewZones {
                    control_plane: spec.name.clone(),
                    why: why.to_string(),
                })?;
            etcd = Some(EtcdCluster {
                token: format!("{}-{}", spec.name, index),
                generation: 1,
                members: members
                    .into_iter()
                    .map(|member| EtcdMember {
                        peer: spec.etcd_peers.get(&member).cloned().unwrap_or_default(),
                        member,
                        joined: 1,
                        learner: false,
                        force_new_cluster: false,
                        incarnation: 0,
                        etcd_id: 0,
                        restore_from: None,
                    })
                    .collect(),
                change: None,
            });
            Ok(host)
        } else {
            match &spec.host {
                Some(host) => Ok(host.clone()),
                None => placement::choose_host(self, &placement::Request::new(spec), 0),
            }
        };
        let (host, epoch, phase, unplaced_reason) = match choice {
            Ok(h) => (Some(h), 1, Phase::Starting, String::new()),
            Err(why) => (None, 0, Phase::Unplaced, why.to_string()),
        };
        let etcd_detail = etcd
            .as_ref()
            .map(|c| {
                format!(
                    "; etcd members on {}",
                    c.names().collect::<Vec<_>>().join(", ")
                )
            })
            .unwrap_or_default();
        let detail = match &host {
            Some(h) => format!(
                "dns {} hosted on {h} at epoch {epoch}{etcd_detail}",
                spec.dns_name
            ),
            None => format!("dns {} unplaced: {unplaced_reason}", spec.dns_name),
        };
        // Its data (if any: a bucket an earlier etcd-backup-restore or ring wrote) comes from
        // `backup` to where the host writes.
        let migration = host.as_ref().map(|h| {
            Migration::begin(
                epoch,
                None,
                h.clone(),
                spec.backup.clone(),
                spec.backups.get(h).unwrap_or(&spec.backup).clone(),
                MigrationStep::Handover,
                at_ms,
            )
        });
        self.control_planes.insert(
            spec.name.clone(),
            Box::new(ControlPlane {
                name: spec.name.clone(),
                home: spec.home.clone(),
                dns_name: spec.dns_name.clone(),
                endpoints: spec.endpoints.clone(),
                backup: spec.backup.clone(),
                host,
                epoch,
                phase,
                fencing: BTreeSet::new(),
                unplaced_reason,
                moved_at_ms: 0,
                prefer: spec.prefer.clone(),
                backups: spec.backups.clone(),
                migration,
                labels: BTreeMap::new(),
                backup_status: None,
                problem: None,
                tolerance: spec.tolerance,
                etcd_peers: spec.etcd_peers.clone(),
                etcd,
            }),
        );
        Ok(detail)
    }

    /// Control plane `name` and its etcd cluster, which must be at `generation`.
    fn etcd_cluster_at(
        &self,
        name: &str,
        generation: u64,
    ) -> Result<(&ControlPlane, &EtcdCluster), CommandError> {
        let cp = self
            .control_planes
            .get(name)
            .ok_or_else(|| CommandError::UnknownControlPlane(name.to_string()))?;
        let cluster = cp
            .etcd
            .as_ref()
            .ok_or_else(|| CommandError::NotZoneTolerant {
                control_plane: name.to_string(),
            })?;
        if cluster.generation != generation {
            return Err(CommandError::StaleEtcdGeneration {
                control_plane: name.to_string(),
                generation: cluster.generation,
            });
        }
        Ok((cp, cluster))
    }

    /// See [`Command::ReplaceEtcdMember`]. The spare must be registered, a voter or learner of
    /// the ring (not joining), not lost, suspect or cordoned, have an etcd peer address and an
    /// endpoint for the control plane, and be in a zone none of the remaining members uses.
    fn replace_etcd_member(
        &mut self,
        name: &str,
        remove: Option<&str>,
        add: &str,
        generation: u64,
    ) -> Result<String, CommandError> {
        let (cp, cluster) = self.etcd_cluster_at(name, generation)?;
        if let Some(change) = &cluster.change {
            return Err(CommandError::EtcdChangeInProgress {
                control_plane: name.to_string(),
                change: format!("{} -> {}, {}", change.removed, change.added, change.step),
            });
        }
        let unfit = |member: &str, why: &str| CommandError::ReplacementUnfit {
            control_plane: name.to_string(),
            member: member.to_string(),
            why: why.to_string(),
        };
        match remove {
            Some(remove) => {
                if !cluster.contains(remove) {
                    return Err(unfit(
                        add,
                        &format!("{remove} runs none of its etcd members"),
                    ));
                }
                if cp.host.as_deref() == Some(remove) {
                    return Err(unfit(
                        add,
                        &format!(
                            "{remove} hosts it; the host moves before its etcd member is replaced"
                        ),
                    ));
                }
            }
            None => {
                if cluster.members.len() >= ZONE_TOLERANT_MEMBERS {
                    return Err(unfit(
                        add,
                        &format!(
                            "the cluster has {} members already; one is added only to a smaller one",
                            cluster.members.len()
                        ),
                    ));
                }
            }
        }
        if cluster.contains(add) {
            return Err(unfit(add, "it runs one of its etcd members already"));
        }
        let spare = self
            .member_by_name(add)
            .ok_or_else(|| CommandError::UnknownMember(add.to_string()))?;
        let why = if spare.role == Role::Joining {
            Some("it is still joining the ring".to_string())
        } else if matches!(spare.health, Health::Lost | Health::Suspect) {
            Some(format!("it is {}", spare.health))
        } else if spare.cordoned {
            Some("it is cordoned".into())
        } else if !cp.etcd_peers.contains_key(add) || !cp.endpoints.contains_key(add) {
            Some("it has no etcd peer address or no endpoint for it".into())
        } else {
            cluster
                .members
                .iter()
                .filter(|m| Some(m.member.as_str()) != remove)
                .find(|m| {
                    self.member_by_name(&m.member)
                        .is_some_and(|r| r.zone == spare.zone)
                })
                .map(|m| {
                    format!(
                        "its zone {} has {}'s etcd member already",
                        spare.zone, m.member
                    )
                })
        };
        if let Some(why) = why {
            return Err(unfit(add, &why));
        }
        let peer = cp.etcd_peers.get(add).cloned().unwrap_or_default();
        let (removed_peer, removed_etcd_id) = remove
            .and_then(|r| cluster.member(r))
            .map(|m| (m.peer.clone(), m.etcd_id))
            .unwrap_or_default();
        let cp = self.control_plane_mut(name)?;
        let cluster = cp.etcd.as_mut().expect("checked above");
        cluster.generation += 1;
        if let Some(remove) = remove {
            cluster.members.retain(|m| m.member != remove);
        }
        // A member forced into a new cluster of its own must not force again once others join.
        for m in &mut cluster.members {
            m.force_new_cluster = false;
        }
        cluster.members.push(EtcdMember {
            member: add.to_string(),
            peer: peer.clone(),
            joined: cluster.generation,
            learner: true,
            force_new_cluster: false,
            incarnation: 0,
            etcd_id: 0,
            restore_from: None,
        });
        cluster.change = Some(EtcdChange {
            removed: remove.unwrap_or_default().to_string(),
            removed_peer,
            removed_etcd_id,
            added: add.to_string(),
            // Nothing to remove: straight to adding.
            step: if remove.is_some() {
                EtcdChangeStep::Removing
            } else {
                EtcdChangeStep::Adding
            },
        });
        Ok(match remove {
            Some(remove) => format!(
                "etcd member on {remove} to be replaced by one on {add} (peer {peer}) at generation {}",
                cluster.generation
            ),
            None => format!(
                "etcd member to be added on {add} (peer {peer}) at generation {}",
                cluster.generation
            ),
        })
    }

    /// See [`Command::RecoverEtcdCluster`]. Refused unless the ring judges the cluster without
    /// a quorum, `from` runs a voting member of it, is not lost, and hosts the control plane.
    fn recover_etcd_cluster(
        &mut self,
        name: &str,
        from: &str,
        generation: u64,
        from_backup: bool,
    ) -> Result<String, CommandError> {
        let (cp, cluster) = self.etcd_cluster_at(name, generation)?;
        let refuse = |why: String| CommandError::RecoveryRefused {
            control_plane: name.to_string(),
            why,
        };
        let health = self.etcd_health(cp).expect("a zone-tolerant control plane");
        if !matches!(health, EtcdHealth::NoQuorum { .. }) {
            return Err(refuse(format!(
                "its etcd cluster is {health}: it has a quorum, nothing to recover"
            )));
        }
        if !cluster.is_voter(from) {
            return Err(refuse(format!(
                "{from} runs no voting member of its etcd cluster ({})",
                cluster.names().collect::<Vec<_>>().join(", ")
            )));
        }
        if self
            .member_by_name(from)
            .is_none_or(|m| m.health == Health::Lost)
        {
            return Err(refuse(format!("{from} is lost or not registered")));
        }
        if cp.host.as_deref() != Some(from) {
            return Err(refuse(format!(
                "it is hosted on {}, not {from}; recover from its host (a lost host's control \
                 plane moves to a surviving etcd member by itself)",
                cp.host.as_deref().unwrap_or("no member")
            )));
        }
        let dropped: Vec<String> = cluster
            .names()
            .filter(|m| *m != from)
            .map(str::to_string)
            .collect();
        // The newest backups are where the last host that served wrote them: the source of
        // this epoch's move while the host has not served at it, its own location otherwise.
        let (source, report) = match &cp.migration {
            Some(m) if m.epoch == cp.epoch && cp.phase != Phase::Running => {
                (m.source.clone(), None)
            }
            _ => (cp.backup.clone(), cp.backup_status.clone()),
        };
        let cp = self.control_plane_mut(name)?;
        let cluster = cp.etcd.as_mut().expect("checked above");
        cluster.generation += 1;
        cluster.change = Some(EtcdChange {
            removed: String::new(),
            removed_peer: String::new(),
            removed_etcd_id: 0,
            added: from.to_string(),
            step: EtcdChangeStep::Forcing,
        });
        let generation = cluster.generation;
        cluster.members.retain(|m| m.member == from);
        let dropped = dropped.join(", ");
        if from_backup {
            for m in &mut cluster.members {
                // A new data directory (the generation names it), restored before etcd starts;
                // a new etcd member, so a new id.
                m.joined = generation;
                m.incarnation = generation;
                m.force_new_cluster = false;
                m.restore_from = Some(source.clone());
                m.etcd_id = 0;
            }
            let newest = match report {
                Some(r) => format!(
                    "; the last report of them: full snapshot {}, {} delta(s) since, revision {}, \
                     complete up to {} (Unix ms)",
                    r.full.as_deref().unwrap_or("none"),
                    r.deltas_since_full,
                    r.revision,
                    r.up_to_date_unix_ms
                ),
                None => String::new(),
            };
            return Ok(format!(
                "etcd cluster restored on {from} from the newest backups in {source} at generation \
                 {generation}, on a new data directory; {dropped} dropped (writes after the newest \
                 delta snapshot there are lost{newest}); it grows back on spares"
            ));
        }
        for m in &mut cluster.members {
            m.force_new_cluster = true;
            m.incarnation = generation;
        }
        Ok(format!(
            "etcd cluster forced anew from {from}'s data at generation {generation}; {dropped} \
             dropped (writes acknowledged by the cluster that {from} had not received are lost); \
             it grows back on spares"
        ))
    }

    /// See [`Command::ReportEtcdChange`].
    fn report_etcd_change(
        &mut self,
        name: &str,
        generation: u64,
        member: &str,
        done: EtcdChangeStep,
    ) -> Result<String, CommandError> {
        let cp = self.control_plane_mut(name)?;
        let host = cp.host.clone();
        let cluster = cp
            .etcd
            .as_mut()
            .ok_or_else(|| CommandError::NotZoneTolerant {
                control_plane: name.to_string(),
            })?;
        if cluster.generation != generation {
            return Err(CommandError::StaleEtcdGeneration {
                control_plane: name.to_string(),
                generation: cluster.generation,
            });
        }
        let expected = cluster.change.as_ref().map(|c| c.step);
        if expected != Some(done) || host.as_deref() != Some(member) {
            return Err(CommandError::UnexpectedEtcdChangeReport {
                control_plane: name.to_string(),
                expected: expected.map(|s| format!("{s} (reported by its host)")),
                member: member.to_string(),
                given: done.to_string(),
            });
        }
        let change = cluster.change.as_mut().expect("checked above");
        let added = change.added.clone();
        Ok(match done {
            EtcdChangeStep::Removing => {
                change.step = EtcdChangeStep::Adding;
                format!("etcd member on {} removed from the cluster", change.removed)
            }
            EtcdChangeStep::Adding => {
                change.step = EtcdChangeStep::CatchingUp;
                format!("etcd member on {added} added as a learner; it starts and catches up")
            }
            EtcdChangeStep::CatchingUp => {
                cluster.change = None;
                for m in cluster.members.iter_mut().filter(|m| m.member == added) {
                    m.learner = false;
                }
                format!("etcd member on {added} promoted: the cluster is whole again")
            }
            EtcdChangeStep::Forcing => {
                cluster.change = None;
                for m in &mut cluster.members {
                    m.force_new_cluster = false;
                    m.restore_from = None;
                }
                format!(
                    "etcd cluster runs again as {added} alone, from its data; it grows back next"
                )
            }
        })
    }

    /// See [`Command::RecordEtcdIds`]. Refused from anyone but the host, at another generation,
    /// for a ring member not in the cluster, or for one whose recorded id differs (an etcd
    /// member keeps its id for life: a different one means the report is about another
    /// cluster or the list was misread, and the ring keeps what it has).
    fn record_etcd_ids(
        &mut self,
        name: &str,
        generation: u64,
        member: &str,
        ids: &BTreeMap<String, u64>,
    ) -> Result<String, CommandError> {
        let (cp, cluster) = self.etcd_cluster_at(name, generation)?;
        if cp.host.as_deref() != Some(member) {
            return Err(CommandError::UnexpectedEtcdChangeReport {
                control_plane: name.to_string(),
                expected: Some("etcd ids (reported by its host)".to_string()),
                member: member.to_string(),
                given: "etcd ids".to_string(),
            });
        }
        for (m, id) in ids {
            let Some(known) = cluster.member(m) else {
                return Err(CommandError::NotAnEtcdMember {
                    control_plane: name.to_string(),
                    member: m.clone(),
                    members: cluster.names().map(str::to_string).collect(),
                });
            };
            if known.etcd_id != 0 && known.etcd_id != *id {
                return Err(CommandError::EtcdIdConflict {
                    control_plane: name.to_string(),
                    member: m.clone(),
                    recorded: known.etcd_id,
                    reported: *id,
                });
            }
        }
        let cp = self.control_plane_mut(name)?;
        let cluster = cp.etcd.as_mut().expect("checked above");
        let mut recorded = Vec::new();
        for m in &mut cluster.members {
            if let Some(id) = ids.get(&m.member)
                && m.etcd_id != *id
            {
                m.etcd_id = *id;
                recorded.push(format!("{}={id:x}", m.member));
            }
        }
        Ok(format!("etcd member ids: {}", recorded.join(", ")))
    }

    fn remove_control_plane(&mut self, name: &str) -> Result<String, CommandError> {
        let cp = self
            .control_planes
            .remove(name)
            .ok_or_else(|| CommandError::UnknownControlPlane(name.to_string()))?;
        Ok(format!(
            "was on {} at epoch {}",
            cp.host.as_deref().unwrap_or("no host"),
            cp.epoch
        ))
    }

    /// Asserts the invariants after applying `command`: all of them in debug builds (every test
    /// runs them after every command), in release builds those of the object the command
    /// touched, so a write never costs a scan of every control plane.
    fn check_after(&self, command: &Command) {
        if cfg!(debug_assertions) {
            self.check_invariants();
            return;
        }
        match command {
            Command::AddControlPlane(ControlPlaneSpec { name, .. })
            | Command::MoveControlPlane { name, .. }
            | Command::ReleaseFence { name, .. }
            | Command::ReportServing { name, .. }
            | Command::ReportMigration { name, .. }
            | Command::ReportBackup { name, .. }
            | Command::ReportProblem { name, .. }
            | Command::ReplaceEtcdMember { name, .. }
            | Command::ReportEtcdChange { name, .. }
            | Command::RecordEtcdIds { name, .. }
            | Command::RecoverEtcdCluster { name, .. } => {
                if let Some(cp) = self.control_planes.get(name) {
                    check_control_plane(cp);
                }
            }
            Command::Recover { .. } => self.check_invariants(),
            Command::AddMember(spec) => assert!(
                !self.retired_ids.contains(&spec.id),
                "retired id {} is registered again",
                spec.id
            ),
            _ => {}
        }
    }

    /// Asserts the invariants of the state. A violation is a bug in `apply`, never bad input,
    /// so it panics rather than returning an error.
    pub fn check_invariants(&self) {
        if !self.bootstrapped {
            assert!(
                self.members.is_empty() && self.control_planes.is_empty(),
                "members or control planes registered before the ring was bootstrapped"
            );
        }
        let mut names = BTreeSet::new();
        for (id, member) in &self.members {
            assert_eq!(*id, member.id, "member keyed under the wrong id");
            assert!(
                !self.retired_ids.contains(id),
                "retired id {id} is registered again"
            );
            assert!(
                names.insert(&member.name),
                "member name {} twice",
                member.name
            );
        }
        assert!(
            self.revoked.len() <= MAX_REVOKED,
            "{} revoked certificates",
            self.revoked.len()
        );
        let mut revoked = BTreeSet::new();
        for r in &self.revoked {
            assert!(
                revoked.insert((&r.issuer, &r.serial)),
                "certificate {} of {} revoked twice",
                r.serial,
                r.issuer
            );
        }
        let mut dns_names = BTreeSet::new();
        for (name, cp) in &self.control_planes {
            assert_eq!(*name, cp.name, "control plane keyed under the wrong name");
            assert!(
                dns_names.insert(&cp.dns_name),
                "DNS name {} twice",
                cp.dns_name
            );
            check_control_plane(cp);
        }
        assert!(
            self.index == Index::of(&self.control_planes),
            "the control-plane index differs from its recomputation"
        );
    }
}

/// The refusal of a host's report that does not match `cp` (phase, epoch, host).
fn unexpected_report(
    cp: &ControlPlane,
    member: &str,
    report: ReportKind,
    given: u64,
) -> CommandError {
    CommandError::UnexpectedReport {
        control_plane: cp.name.clone(),
        phase: cp.phase.to_string(),
        epoch: cp.epoch,
        host: cp.host.clone(),
        member: member.to_string(),
        report,
        given,
    }
}

/// The control plane a command changes, if it names one.
fn touched_control_plane(command: &Command) -> Option<&str> {
    match command {
        Command::AddControlPlane(spec) => Some(&spec.name),
        Command::RemoveControlPlane { name }
        | Command::MoveControlPlane { name, .. }
        | Command::ReleaseFence { name, .. }
        | Command::ReportServing { name, .. }
        | Command::ReportMigration { name, .. }
        | Command::ReportBackup { name, .. }
        | Command::ReportProblem { name, .. }
        | Command::ReplaceEtcdMember { name, .. }
        | Command::ReportEtcdChange { name, .. }
        | Command::RecordEtcdIds { name, .. }
        | Command::RecoverEtcdCluster { name, .. } => Some(name),
        _ => None,
    }
}

/// The invariants of one control plane: hosted exactly when placed, at epoch 1 or more, never
/// at home, only where it has an endpoint, never fencing its own host, startable (phase
/// `Starting`/`Running`) only when no former host may still hold a lease, and with a backup
/// report only while running (a move clears it).
fn check_control_plane(cp: &ControlPlane) {
    let name = &cp.name;
    match (&cp.host, cp.phase) {
        (Some(host), Phase::Fencing | Phase::Starting | Phase::Running) => {
            assert!(cp.epoch >= 1, "{name} hosted at epoch 0");
            assert_ne!(cp.home.as_ref(), Some(host), "{name} hosted at home");
            assert!(
                cp.endpoints.contains_key(host),
                "{name} hosted without endpoint"
            );
            assert!(!cp.fencing.contains(host), "{name} fences its own host");
            assert_eq!(
                cp.phase == Phase::Fencing,
                !cp.fencing.is_empty(),
                "{name} is {} with fencing {:?}",
                cp.phase,
                cp.fencing
            );
        }
        (None, Phase::Unplaced) => {}
        (host, phase) => panic!("{name} has host {host:?} in phase {phase}"),
    }
    match (cp.tolerance, &cp.etcd) {
        (Tolerance::None, None) => assert!(
            cp.etcd_peers.is_empty(),
            "{name} has etcd peer addresses without zone tolerance"
        ),
        (Tolerance::Zone, Some(cluster)) => {
            let names: BTreeSet<&str> = cluster.names().collect();
            assert_eq!(
                names.len(),
                cluster.members.len(),
                "{name}'s etcd cluster names a member twice"
            );
            assert!(
                !cluster.members.is_empty(),
                "{name}'s etcd cluster has no member"
            );
            assert!(
                cluster
                    .members
                    .iter()
                    .filter(|m| m.force_new_cluster)
                    .count()
                    <= usize::from(cluster.members.len() == 1),
                "{name}'s etcd cluster forces a new cluster with others in it"
            );
            if let Some(host) = &cp.host {
                assert!(
                    cluster.contains(host),
                    "{name} is hosted on {host}, which runs none of its etcd members"
                );
            }
            let learners: Vec<&str> = cluster
                .members
                .iter()
                .filter(|m| m.learner)
                .map(|m| m.member.as_str())
                .collect();
            match &cluster.change {
                Some(change) if change.step == EtcdChangeStep::Forcing => {
                    assert!(learners.is_empty(), "{name} has learners while forced anew");
                    assert!(
                        cluster.contains(&change.added),
                        "{name} is forced anew from a member it does not list"
                    );
                }
                Some(change) => {
                    assert_eq!(
                        learners,
                        [change.added.as_str()],
                        "{name}'s learners are not the member being added"
                    );
                    assert!(
                        !cluster.contains(&change.removed),
                        "{name}'s removed etcd member is still listed"
                    );
                    assert!(
                        cp.host.as_deref() != Some(change.added.as_str()),
                        "{name} is hosted on a learner"
                    );
                }
                None => assert!(learners.is_empty(), "{name} has learners and no change"),
            }
        }
        (tolerance, etcd) => panic!("{name} has tolerance {tolerance} and etcd cluster {etcd:?}"),
    }
    assert!(
        cp.backup_status.is_none() || cp.phase == Phase::Running,
        "{name} has a backup report while {}",
        cp.phase
    );
    assert!(
        cp.problem.is_none() || matches!(cp.phase, Phase::Starting | Phase::Running),
        "{name} has a host's problem while {}",
        cp.phase
    );
    if let Some(m) = &cp.migration {
        assert!(m.epoch <= cp.epoch, "{name}'s migration is from the future");
        if m.epoch == cp.epoch && cp.host.is_some() {
            assert_eq!(
                cp.host.as_deref(),
                Some(m.to.as_str()),
                "{name}'s migration goes elsewhere"
            );
            assert_eq!(
                m.step == MigrationStep::Fencing,
                cp.phase == Phase::Fencing,
                "{name}'s migration is {} while it is {}",
                m.step,
                cp.phase
            );
            assert_eq!(
                m.step == MigrationStep::Done,
                cp.phase == Phase::Running,
                "{name}'s migration is {} while it is {}",
                m.step,
                cp.phase
            );
        }
    }
}

fn new_member(spec: &MemberSpec, role: Role, wants_voter: bool) -> Member {
    Member {
        id: spec.id,
        name: spec.name.clone(),
        zone: spec.zone.clone(),
        address: spec.address.clone(),
        admin_address: spec.admin_address.clone(),
        role,
        wants_voter,
        health: Health::Unknown,
        contacted: false,
        cordoned: false,
        labels: BTreeMap::new(),
        diverged: None,
    }
}

/// A label change in history's words.
fn labels_detail(labels: &BTreeMap<String, String>) -> String {
    if labels.is_empty() {
        "labels removed".into()
    } else {
        format!(
            "labels {}",
            labels
                .iter()
                .map(|(k, v)| format!("{k}={v}"))
                .collect::<Vec<_>>()
                .join(",")
        )
    }
}

fn subject(state: &RingState, command: &Command) -> String {
    let member_name = |id: &NodeId| {
        state
            .members
            .get(id)
            .map(|m| format!("{}({id})", m.name))
            .unwrap_or_else(|| format!("member {id}"))
    };
    match command {
        Command::Bootstrap { .. }
        | Command::SetPaused { .. }
        | Command::SetRingVersion { .. }
        | Command::HoldUpgrade { .. }
        | Command::Recover { .. } => "ring".into(),
        Command::RevokeCertificate {
            serial, subject, ..
        } if !subject.is_empty() => format!("certificate {serial} ({subject})"),
        Command::RevokeCertificate { serial, .. } | Command::UnrevokeCertificate { serial, .. } => {
            format!("certificate {serial}")
        }
        Command::AddMember(spec) => format!("{}({})", spec.name, spec.id),
        Command::PromoteMember { id }
        | Command::RemoveMember { id }
        | Command::SetHealth { id, .. }
        | Command::MarkDiverged { id, .. } => member_name(id),
        Command::AddControlPlane(spec) => spec.name.clone(),
        Command::RemoveControlPlane { name }
        | Command::SetControlPlaneLabels { name, .. }
        | Command::MoveControlPlane { name, .. }
        | Command::ReleaseFence { name, .. }
        | Command::ReportServing { name, .. }
        | Command::ReportMigration { name, .. }
        | Command::ReportBackup { name, .. }
        | Command::ReportProblem { name, .. }
        | Command::ReplaceEtcdMember { name, .. }
        | Command::ReportEtcdChange { name, .. }
        | Command::RecordEtcdIds { name, .. }
        | Command::RecoverEtcdCluster { name, .. } => name.clone(),
        Command::Cordon { id, .. } | Command::SetLabels { id, .. } => member_name(id),
    }
}

impl Roster for RingState {
    fn members(&self) -> impl Iterator<Item = &Member> {
        self.members.values()
    }

    fn member_by_name(&self, name: &str) -> Option<&Member> {
        RingState::member_by_name(self, name)
    }

    fn hosted_count(&self, name: &str) -> usize {
        RingState::hosted_count(self, name)
    }
}

#[cfg(test)]
mod tests;
