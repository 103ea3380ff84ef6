//! Commands: the only way the replicated state changes. Each travels in a [`Proposal`] that also
//! carries who asked, why, and the proposer's wall-clock time, so `apply` never reads a clock.

use std::collections::BTreeMap;
use std::fmt;

use super::vec_map::VecMap;
use serde::{Deserialize, Serialize};

use super::NodeId;
use super::control_plane::MoveKind;
use super::error::CommandError;
use super::etcd_cluster::{EtcdChangeStep, Tolerance, ZONE_TOLERANT_MEMBERS};
use super::limits::{MAX_MEMBERS, MAX_TEXT_LEN};
use super::member::Health;
pub use super::member::MemberSpec;
use super::names::{
    Invalid, check_address, check_backup_url, check_dns_name, check_label, check_text, invalid,
    require,
};

/// A command with its context, as written to the Raft log.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Proposal {
    /// What to do.
    pub command: Command,
    /// Unix time in milliseconds at the proposer. Only recorded, never compared with a clock.
    pub at_ms: u64,
    /// Who asked: a client identity, or `ringd/<member>` for the ring's own actions.
    pub actor: String,
    /// Why, in the actor's words. May be empty.
    pub reason: String,
}

impl fmt::Display for Proposal {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} by {}", self.command.action(), self.actor)
    }
}

impl Proposal {
    /// Checks everything about the proposal that does not depend on the state: names,
    /// addresses, URLs, text lengths. Done before a proposal reaches the log, and again in
    /// `apply` (a log may hold entries written by an older, laxer version).
    pub fn validate(&self) -> Result<(), CommandError> {
        require("actor", &self.actor, check_text)?;
        if self.actor.is_empty() {
            return Err(CommandError::invalid("actor", "", "must not be empty"));
        }
        require("reason", &self.reason, check_text)?;
        self.command.validate()
    }
}

/// Everything needed to register a control plane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlPlaneSpec {
    /// DNS-1123 label, unique.
    pub name: String,
    /// Member name it belongs to and must never be hosted on.
    pub home: Option<String>,
    /// DNS name clients use.
    pub dns_name: String,
    /// Member name -> `host:port` the control plane answers on when hosted there.
    pub endpoints: VecMap<String, String>,
    /// Backup location URL (where its host writes backups, unless `backups` names another
    /// for that member).
    pub backup: String,
    /// Member name -> backup location when hosted there (each zone's own bucket, as Gardener
    /// gives every seed one).
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub backups: BTreeMap<String, String>,
    /// Member name to host it on; `None` lets placement choose when the command is applied.
    pub host: Option<String>,
    /// The operator's preferences, most preferred first: a member name, or `key=value` for
    /// members with that label. Placement takes the first eligible match before spreading by
    /// load.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub prefer: Vec<String>,
    /// What failure its etcd survives without losing a write: `None` (one etcd on the host) or
    /// `Zone` (one etcd member on each of three members in distinct zones).
    #[serde(default, skip_serializing_if = "is_default")]
    pub tolerance: Tolerance,
    /// Member name -> `host:port` its etcd member listens on for its peers there (zone
    /// tolerance only). Every member named here needs an endpoint too: any of them may
    /// become the host.
    #[serde(default, skip_serializing_if = "VecMap::is_empty")]
    pub etcd_peers: VecMap<String, String>,
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

impl ControlPlaneSpec {
    /// Syntax checks.
    pub fn validate(&self) -> Result<(), CommandError> {
        require("control plane name", &self.name, check_label)?;
        if let Some(home) = &self.home {
            require("home member", home, check_label)?;
        }
        require("DNS name", &self.dns_name, check_dns_name)?;
        if self.prefer.len() > MAX_MEMBERS {
            return Err(CommandError::Limit(format!(
                "at most {MAX_MEMBERS} preferred hosts"
            )));
        }
        for entry in &self.prefer {
            require("preference", entry, check_preference)?;
        }
        if self.endpoints.is_empty() {
            return Err(CommandError::invalid(
                "endpoints",
                "",
                "at least one member=host:port endpoint is needed",
            ));
        }
        if self.endpoints.len() > MAX_MEMBERS {
            return Err(CommandError::Limit(format!(
                "at most {MAX_MEMBERS} endpoints per control plane"
            )));
        }
        for (member, endpoint) in &self.endpoints {
            require("endpoint member", member, check_label)?;
            require("endpoint", endpoint, check_address)?;
        }
        require("backup location", &self.backup, check_backup_url)?;
        if self.backups.len() > MAX_MEMBERS {
            return Err(CommandError::Limit(format!(
                "at most {MAX_MEMBERS} per-member backup locations"
            )));
        }
        for (member, url) in &self.backups {
            require("member name", member, check_label)?;
            require("backup location", url, check_backup_url)?;
        }
        self.validate_etcd_peers()?;
        if let Some(host) = &self.host {
            require("host member", host, check_label)?;
            if self.tolerance == Tolerance::Zone && !self.etcd_peers.contains_key(host) {
                return Err(CommandError::invalid(
                    "host member",
                    host,
                    "has no etcd peer address for this zone-tolerant control plane (--etcd-peer-on)",
                ));
            }
            if !self.endpoints.contains_key(host) {
                return Err(CommandError::invalid(
                    "host member",
                    host,
                    "has no endpoint for this control plane",
                ));
            }
            if self.home.as_ref() == Some(host) {
                return Err(CommandError::invalid(
                    "host member",
                    host,
                    "is the control plane's home; a control plane is never hosted at home",
                ));
            }
        }
        Ok(())
    }

    fn validate_etcd_peers(&self) -> Result<(), CommandError> {
        match self.tolerance {
            Tolerance::None if !self.etcd_peers.is_empty() => Err(CommandError::invalid(
                "etcd peer addresses",
                "",
                "are only for zone-tolerant control planes (tolerance zone); with tolerance none the \
                 host runs one etcd on loopback",
            )),
            Tolerance::None => Ok(()),
            Tolerance::Zone => {
                if self.etcd_peers.len() < ZONE_TOLERANT_MEMBERS {
                    return Err(CommandError::invalid(
                        "etcd peer addresses",
                        "",
                        format!(
                            "tolerance zone needs an etcd peer address (member=host:port) on at least \
                             {ZONE_TOLERANT_MEMBERS} members in distinct zones, {} given",
                            self.etcd_peers.len()
                        ),
                    ));
                }
                if self.etcd_peers.len() > MAX_MEMBERS {
                    return Err(CommandError::Limit(format!(
                        "at most {MAX_MEMBERS} etcd peer addresses per control plane"
                    )));
                }
                for (member, peer) in &self.etcd_peers {
                    require("etcd peer member", member, check_label)?;
                    require("etcd peer address", peer, check_address)?;
                    if !self.endpoints.contains_key(member) {
                        return Err(CommandError::invalid(
                            "etcd peer member",
                            member,
                            "has no endpoint for this control plane: every member with an etcd \
                             member may become the host",
                        ));
                    }
                    if let Some((other, _)) = self
                        .endpoints
                        .iter()
                        .find(|(_, endpoint)| *endpoint == peer)
                    {
                        return Err(CommandError::invalid(
                            "etcd peer address",
                            peer,
                            format!("is also {other}'s client endpoint"),
                        ));
                    }
                }
                Ok(())
            }
        }
    }
}

/// What can be proposed.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Command {
    /// Registers the members that formed the ring (from the initial Raft membership). Applied
    /// once; later identical bootstraps are no-ops, different ones are refused.
    Bootstrap {
        /// The initial members.
        members: Vec<MemberSpec>,
        /// The DNS zone every control plane's DNS name must lie inside (from the founders'
        /// `[dns] zone`); `None` leaves DNS names unconstrained.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        dns_zone: Option<String>,
    },
    /// Registers a new member; it joins Raft as a learner next.
    AddMember(MemberSpec),
    /// Records the operator's wish that a learner become a voter.
    PromoteMember {
        /// The member.
        id: NodeId,
    },
    /// Deregisters a member and retires its id for good.
    RemoveMember {
        /// The member.
        id: NodeId,
    },
    /// Records the leader's view of a member's health.
    SetHealth {
        /// The member.
        id: NodeId,
        /// Its health.
        health: Health,
    },
    /// Registers a control plane (and places it when no host is given).
    AddControlPlane(ControlPlaneSpec),
    /// Deregisters a control plane.
    RemoveControlPlane {
        /// Its name.
        name: String,
    },
    /// Moves a control plane to another member, or unplaces it, at the next epoch.
    MoveControlPlane {
        /// Its name.
        name: String,
        /// The new host; `None` unplaces it (no eligible member).
        to: Option<String>,
        /// The epoch after the move: exactly one more than the current one.
        epoch: u64,
        /// Why it moves.
        kind: MoveKind,
        /// Why it is unplaced, when `to` is `None`.
        #[serde(default)]
        note: String,
    },
    /// A former host no longer holds a lease on a control plane.
    ReleaseFence {
        /// The control plane.
        name: String,
        /// Its current epoch.
        epoch: u64,
        /// The former host.
        member: String,
    },
    /// The host serves the control plane at its current epoch.
    ReportServing {
        /// The control plane.
        name: String,
        /// Its current epoch.
        epoch: u64,
        /// The host.
        member: String,
    },
    /// The new host reports how the migration of the control plane's data goes.
    ReportMigration {
        /// The control plane.
        name: String,
        /// Its current epoch.
        epoch: u64,
        /// The host.
        member: String,
        /// What it reports.
        report: crate::migration::MigrationReport,
    },
    /// The host reports the backups of a running control plane (newest full snapshot, deltas
    /// since, the revision they reach). The leader commits a report only when it is worth it
    /// ([`crate::backup_report::worth_committing`]).
    ReportBackup {
        /// The control plane.
        name: String,
        /// Its current epoch.
        epoch: u64,
        /// The host.
        member: String,
        /// What it reports.
        report: crate::backup_report::BackupReport,
    },
    /// The host reports what is wrong with a control plane it hosts (its etcd keeps exiting,
    /// its data disk is full), or `None` once nothing is. The leader commits a report only
    /// when it differs from the committed one, so history records each problem once.
    ReportProblem {
        /// The control plane.
        name: String,
        /// Its current epoch.
        epoch: u64,
        /// The host.
        member: String,
        /// What is wrong, in the host's words; `None`: nothing any more.
        problem: Option<String>,
    },
    /// Starts replacing the etcd member of a zone-tolerant control plane on `remove` (its ring
    /// member lost for long enough) by a new one on `add` (a spare in a zone the cluster does
    /// not use yet): `remove` leaves the cluster's members, `add` joins them as a learner, and
    /// the host carries the change out step by step ([`ReportEtcdChange`](Command::ReportEtcdChange)).
    ReplaceEtcdMember {
        /// The control plane.
        name: String,
        /// The ring member whose etcd member goes; `None` only adds one (a cluster with fewer
        /// than three members after a recovery grows back).
        remove: Option<String>,
        /// The ring member whose etcd member comes.
        add: String,
        /// The cluster's generation now (the change makes it one more): a decision taken on
        /// stale state fails.
        generation: u64,
    },
    /// An operator's recovery of a zone-tolerant control plane's etcd cluster that lost its
    /// quorum: the cluster starts again as `from`'s etcd member alone, forced from its data
    /// (`--force-new-cluster`; writes the cluster acknowledged that `from` had not received
    /// are lost), or, `from_backup`, on a new data directory restored from the newest backups
    /// (writes after the newest delta snapshot are lost). It grows back to three members on
    /// spares afterwards.
    RecoverEtcdCluster {
        /// The control plane.
        name: String,
        /// The surviving member that runs the cluster's one member (its host).
        from: String,
        /// The cluster's generation now: a recovery decided on stale state fails.
        generation: u64,
        /// Restore from the backups instead of starting from `from`'s data (when that data is
        /// lost or suspect).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        from_backup: bool,
    },
    /// The host of a zone-tolerant control plane did `done`, the step its cluster's change
    /// waited for.
    ReportEtcdChange {
        /// The control plane.
        name: String,
        /// The cluster's generation.
        generation: u64,
        /// The host.
        member: String,
        /// The step done.
        done: EtcdChangeStep,
    },
    /// The host of a zone-tolerant control plane reports etcd's ids of its cluster's members
    /// (from etcd's member list); committed for the members whose id the ring does not know
    /// yet.
    RecordEtcdIds {
        /// The control plane.
        name: String,
        /// The cluster's generation the list was taken at.
        generation: u64,
        /// The host.
        member: String,
        /// Ring member name -> etcd member id.
        ids: BTreeMap<String, u64>,
    },
    /// Replaces a member's labels (placement preferences can name them).
    SetLabels {
        /// The member.
        id: NodeId,
        /// Label key -> value.
        labels: BTreeMap<String, String>,
    },
    /// Replaces a control plane's labels: the operator's notes on it (owner, tier, ...),
    /// replicated and recorded in history like every change; nothing in the ring acts on them.
    SetControlPlaneLabels {
        /// The control plane.
        name: String,
        /// Label key -> value.
        labels: BTreeMap<String, String>,
    },
    /// Cordons or uncordons a member (a cordoned member gets no new control planes).
    Cordon {
        /// The member.
        id: NodeId,
        /// Cordoned or not.
        cordoned: bool,
    },
    /// Revokes a certificate the ring's CA signed (a leaked key, a stolen member
    /// certificate): every member refuses it on both ports and closes the connections that
    /// presented it. See [`crate::revocation`].
    RevokeCertificate {
        /// Its issuer's distinguished name.
        issuer: String,
        /// Its serial number ([`crate::revocation::serial`]'s form).
        serial: String,
        /// Whom it speaks for (`member:b`), when known; empty otherwise.
        subject: String,
        /// Why.
        reason: String,
    },
    /// Takes a revocation back: the certificate is accepted again while it is valid.
    UnrevokeCertificate {
        /// Its issuer's distinguished name.
        issuer: String,
        /// Its serial number.
        serial: String,
    },
    /// Pauses or resumes the ring's automatic actions.
    SetPaused {
        /// Paused or not.
        paused: bool,
    },
    /// Raises the ring's active version by one (see [`crate::ring_version`]); proposed once
    /// every member of the configuration runs a binary that supports it. Ring version 2.
    SetRingVersion {
        /// The new active version: the active one plus one.
        version: u32,
    },
    /// Records that a member lost entries it had acknowledged (a leader found its log behind
    /// what it acknowledged): it stays judged lost, hosts nothing and grants no vote until its
    /// log holds `acknowledged_index` again, and is shown diverged on every member until it is
    /// removed. The reason is the proposal's. Ring version 2.
    MarkDiverged {
        /// The member.
        id: NodeId,
        /// The highest log index it had acknowledged to that leader.
        acknowledged_index: u64,
    },
    /// Holds the ring at its active version (the leader then raises it only when the operator
    /// finalizes), or releases the hold. The reason is the proposal's. Ring version 2.
    HoldUpgrade {
        /// Held or released.
        held: bool,
    },
    /// Disaster recovery: the ring restarts from one member's state with that member as its
    /// only member. Never proposed through Raft (a majority is gone, nothing could commit):
    /// `ringd recover` and `ringctl snapshot restore` apply it offline with
    /// [`RingState::recover`](super::RingState::recover), and `apply` refuses it.
    Recover {
        /// The member the ring restarts from, as it will be reached from now on (its addresses
        /// may differ from the registered ones, e.g. after a restore on a new machine).
        survivor: MemberSpec,
        /// Every other registered member: removed, their ids retired for good.
        removed: Vec<NodeId>,
        /// Where the state came from, in words (recorded in history).
        source: String,
    },
}

impl Command {
    /// The control plane and epoch a command about one control plane's epoch concerns (a move,
    /// a released fence, a report), for the fields of the lines logged about it.
    pub fn control_plane_epoch(&self) -> Option<(&str, u64)> {
        match self {
            Command::MoveControlPlane { name, epoch, .. }
            | Command::ReleaseFence { name, epoch, .. }
            | Command::ReportServing { name, epoch, .. }
            | Command::ReportMigration { name, epoch, .. }
            | Command::ReportBackup { name, epoch, .. }
            | Command::ReportProblem { name, epoch, .. } => Some((name, *epoch)),
            _ => None,
        }
    }

    /// The action name used in history and logs.
    pub fn action(&self) -> &'static str {
        match self {
            Command::Bootstrap { .. } => "ring.bootstrap",
            Command::AddMember(_) => "member.add",
            Command::PromoteMember { .. } => "member.promote",
            Command::RemoveMember { .. } => "member.remove",
            Command::SetHealth { .. } => "member.health",
            Command::MarkDiverged { .. } => "member.diverged",
            Command::AddControlPlane(_) => "control-plane.add",
            Command::RemoveControlPlane { .. } => "control-plane.remove",
            Command::MoveControlPlane { .. } => "control-plane.move",
            Command::ReleaseFence { .. } => "control-plane.released",
            Command::ReportServing { .. } => "control-plane.serving",
            Command::ReportMigration { .. } => "control-plane.migration",
            Command::ReportBackup { .. } => "control-plane.backup",
            Command::ReportProblem { .. } => "control-plane.problem",
            Command::ReplaceEtcdMember { .. } => "control-plane.etcd-replace",
            Command::ReportEtcdChange { .. } => "control-plane.etcd-change",
            Command::RecordEtcdIds { .. } => "control-plane.etcd-ids",
            Command::RecoverEtcdCluster { .. } => "control-plane.etcd-recover",
            Command::SetLabels { .. } => "member.labels",
            Command::SetControlPlaneLabels { .. } => "control-plane.labels",
            Command::Cordon { cordoned: true, .. } => "member.cordon",
            Command::Cordon {
                cordoned: false, ..
            } => "member.uncordon",
            Command::RevokeCertificate { .. } => "cert.revoke",
            Command::UnrevokeCertificate { .. } => "cert.unrevoke",
            Command::SetPaused { paused: true } => "ring.pause",
            Command::SetPaused { paused: false } => "ring.resume",
            Command::SetRingVersion { .. } => "ring.version",
            Command::HoldUpgrade { held: true } => "ring.upgrade-hold",
            Command::HoldUpgrade { held: false } => "ring.upgrade-release",
            Command::Recover { .. } => "ring.recover",
        }
    }

    /// Syntax checks (see [`Proposal::validate`]).
    pub fn validate(&self) -> Result<(), CommandError> {
        match self {
            Command::Bootstrap { members, dns_zone } => {
                if let Some(zone) = dns_zone {
                    require("DNS zone", zone, check_dns_name)?;
                }
                if members.is_empty() {
                    return Err(CommandError::invalid(
                        "initial members",
                        "",
                        "at least one member is needed",
                    ));
                }
                if members.len() > MAX_MEMBERS {
                    return Err(CommandError::Limit(format!(
                        "at most {MAX_MEMBERS} members"
                    )));
                }
                members.iter().try_for_each(MemberSpec::validate)
            }
            Command::AddMember(spec) => spec.validate(),
            Command::PromoteMember { id }
            | Command::RemoveMember { id }
            | Command::SetHealth { id, .. }
            | Command::MarkDiverged { id, .. }
            | Command::Cordon { id, .. }
            | Command::SetLabels { id, .. } => {
                if let Command::SetLabels { labels, .. } = self {
                    check_labels(labels, "member")?;
                }
                if *id == 0 {
                    return Err(CommandError::invalid(
                        "member id",
                        "0",
                        "must be at least 1",
                    ));
                }
                Ok(())
            }
            Command::AddControlPlane(spec) => spec.validate(),
            Command::RevokeCertificate {
                issuer,
                serial,
                subject,
                reason,
            } => crate::revocation::validate(issuer, serial, subject, reason),
            Command::UnrevokeCertificate { issuer, serial } => {
                crate::revocation::validate(issuer, serial, "", "-")
            }
            Command::RemoveControlPlane { name } => {
                require("control plane name", name, check_label)
            }
            Command::SetControlPlaneLabels { name, labels } => {
                require("control plane name", name, check_label)?;
                check_labels(labels, "control plane")
            }
            Command::MoveControlPlane {
                name,
                to,
                epoch,
                note,
                ..
            } => {
                require("control plane name", name, check_label)?;
                if let Some(to) = to {
                    require("member name", to, check_label)?;
                }
                if *epoch == 0 {
                    return Err(CommandError::invalid("epoch", "0", "must be at least 1"));
                }
                require("note", note, check_text)
            }
            Command::ReleaseFence {
                name,
                epoch,
                member,
            }
            | Command::ReportServing {
                name,
                epoch,
                member,
            } => {
                require("control plane name", name, check_label)?;
                require("member name", member, check_label)?;
                if *epoch == 0 {
                    return Err(CommandError::invalid("epoch", "0", "must be at least 1"));
                }
                Ok(())
            }
            Command::ReportMigration {
                name,
                epoch,
                member,
                report,
            } => {
                require("control plane name", name, check_label)?;
                require("member name", member, check_label)?;
                if *epoch == 0 {
                    return Err(CommandError::invalid("epoch", "0", "must be at least 1"));
                }
                report.validate()
            }
            Command::ReportBackup {
                name,
                epoch,
                member,
                report,
            } => {
                require("control plane name", name, check_label)?;
                require("member name", member, check_label)?;
                if *epoch == 0 {
                    return Err(CommandError::invalid("epoch", "0", "must be at least 1"));
                }
                report.validate()
            }
            Command::ReportProblem {
                name,
                epoch,
                member,
                problem,
            } => {
                require("control plane name", name, check_label)?;
                require("member name", member, check_label)?;
                if *epoch == 0 {
                    return Err(CommandError::invalid("epoch", "0", "must be at least 1"));
                }
                if let Some(problem) = problem {
                    require("problem", problem, check_text)?;
                    if problem.trim().is_empty() {
                        return Err(CommandError::invalid(
                            "problem",
                            problem,
                            "must not be empty",
                        ));
                    }
                }
                Ok(())
            }
            Command::ReplaceEtcdMember {
                name,
                remove,
                add,
                generation,
            } => {
                require("control plane name", name, check_label)?;
                if let Some(remove) = remove {
                    require("member name", remove, check_label)?;
                }
                require("member name", add, check_label)?;
                if remove.as_ref() == Some(add) {
                    return Err(CommandError::invalid(
                        "member name",
                        add,
                        "an etcd member cannot replace itself",
                    ));
                }
                if *generation == 0 {
                    return Err(CommandError::invalid(
                        "generation",
                        "0",
                        "must be at least 1",
                    ));
                }
                Ok(())
            }
            Command::ReportEtcdChange {
                name,
                generation,
                member,
                ..
            }
            | Command::RecoverEtcdCluster {
                name,
                generation,
                from: member,
                ..
            } => check_etcd_cluster_command(name, member, *generation),
            Command::RecordEtcdIds {
                name,
                generation,
                member,
                ids,
            } => {
                check_etcd_cluster_command(name, member, *generation)?;
                if ids.is_empty() {
                    return Err(CommandError::invalid("etcd ids", "", "must name a member"));
                }
                for (m, id) in ids {
                    require("member name", m, check_label)?;
                    if *id == 0 {
                        return Err(CommandError::invalid(
                            "etcd id",
                            &format!("{m}=0"),
                            "etcd never gives a member id 0",
                        ));
                    }
                }
                Ok(())
            }
            // The version's step is checked against the state (`RingVersion::admits`).
            Command::SetPaused { .. }
            | Command::HoldUpgrade { .. }
            | Command::SetRingVersion { .. } => Ok(()),
            Command::Recover {
                survivor,
                removed,
                source,
            } => {
                survivor.validate()?;
                if removed.len() > MAX_MEMBERS {
                    return Err(CommandError::Limit(format!(
                        "at most {MAX_MEMBERS} members"
                    )));
                }
                if removed.iter().any(|id| *id == 0 || *id == survivor.id) {
                    return Err(CommandError::invalid(
                        "removed members",
                        "",
                        "must not name id 0 or the survivor",
                    ));
                }
                require("source", source, check_text)
            }
        }
    }
}

const _: () = assert!(MAX_TEXT_LEN < super::limits::MAX_PROPOSAL_BYTES);

/// Most labels one member or control plane may carry.
pub const MAX_LABELS: usize = 16;

/// At most [`MAX_LABELS`] labels, keys and values DNS-1123 labels; `what` carries them.
fn check_labels(labels: &BTreeMap<String, String>, what: &str) -> Result<(), CommandError> {
    if labels.len() > MAX_LABELS {
        return Err(CommandError::Limit(format!(
            "at most {MAX_LABELS} labels per {what}"
        )));
    }
    for (key, value) in labels {
        require("label key", key, check_label)?;
        require("label value", value, check_label)?;
    }
    Ok(())
}

/// A placement preference: a member name, or `key=value` (both DNS-1123 labels).
pub fn check_preference(entry: &str) -> Result<(), Invalid> {
    match entry.split_once('=') {
        Some((key, value)) => {
            check_label(key).map_err(|why| invalid!("label key {why}"))?;
            check_label(value).map_err(|why| invalid!("label value {why}"))
        }
        None => check_label(entry),
    }
}

/// The names and the generation of a command about an etcd cluster, from its host.
fn check_etcd_cluster_command(
    name: &str,
    member: &str,
    generation: u64,
) -> Result<(), CommandError> {
    require("control plane name", name, check_label)?;
    require("member name", member, check_label)?;
    if generation == 0 {
        return Err(CommandError::invalid(
            "generation",
            "0",
            "must be at least 1",
        ));
    }
    Ok(())
}
