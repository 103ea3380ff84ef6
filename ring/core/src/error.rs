//! Why a command was refused. These errors are part of the replicated state machine's output
//! (a refused command is committed but changes nothing), so they are plain data: serializable,
//! comparable and deterministic.

use std::fmt;

use serde::{Deserialize, Serialize};

use super::NodeId;

/// A command the state machine refused. Nothing of a refused command is applied.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error, Serialize, Deserialize)]
pub enum CommandError {
    /// A field failed its syntax check.
    #[error("invalid {field} {value:?}: {why}")]
    Invalid {
        /// The field, as the operator knows it (e.g. "member name").
        field: String,
        /// The offending value (truncated to a readable length).
        value: String,
        /// What is wrong with it.
        why: String,
    },
    /// The member id is registered already.
    #[error("member id {0} is already in use")]
    DuplicateMemberId(NodeId),
    /// The member id belonged to a removed member; ids are never reused.
    #[error("member id {0} belonged to a removed member and is never reused; pick a new id")]
    RetiredMemberId(NodeId),
    /// Another current member has this name.
    #[error("member name {name:?} is already used by member {id}")]
    DuplicateMemberName {
        /// The name.
        name: String,
        /// The member that has it.
        id: NodeId,
    },
    /// No member with this id or name.
    #[error("unknown member {0:?}")]
    UnknownMember(String),
    /// A control plane with this name exists already.
    #[error("control plane {0:?} already exists")]
    DuplicateControlPlane(String),
    /// No control plane with this name.
    #[error("unknown control plane {0:?}")]
    UnknownControlPlane(String),
    /// Another control plane uses this DNS name.
    #[error("DNS name {dns_name:?} is already used by control plane {control_plane:?}")]
    DuplicateDnsName {
        /// The DNS name.
        dns_name: String,
        /// The control plane that has it.
        control_plane: String,
    },
    /// A configured limit would be exceeded.
    #[error("limit reached: {0}")]
    Limit(String),
    /// A ring recovery was proposed through Raft; it is only ever applied offline.
    #[error(
        "a ring recovery is never committed through Raft; only `ringd recover` and `ringctl snapshot restore` apply it, offline"
    )]
    RecoveryThroughRaft,
    /// Something other than a ring recovery was given to the offline recovery.
    #[error("{action} is not a ring recovery")]
    NotARecovery {
        /// The command's action (as history names it).
        action: String,
    },
    /// `Bootstrap` names other founders or another DNS zone than the ring has.
    #[error("the ring is already bootstrapped with other members or another DNS zone")]
    AlreadyBootstrapped,
    /// The founders are not registered yet (retryable: the leader registers them at once).
    #[error("the ring has not registered its founding members yet; retry")]
    NotBootstrapped,
    /// A former member of that name may still hold a lease on a control plane.
    #[error(
        "control plane {control_plane} still waits for a former member named {name} to release it (its lease may not have run out yet); add {name} once no control plane lists it as fencing (`ringctl cp list`), within lease + fence + margin"
    )]
    NameStillFencing {
        /// The control plane that waits.
        control_plane: String,
        /// The member name being added.
        name: String,
    },
    /// Another member uses the address.
    #[error("member {name} ({id}) already uses address {address} / {admin_address}")]
    DuplicateAddress {
        /// The member that has it.
        name: String,
        /// Its id.
        id: NodeId,
        /// Its peer address.
        address: String,
        /// Its Admin address.
        admin_address: String,
    },
    /// A promotion of a member that has not joined as a learner yet (retryable once it has).
    #[error("member {name} ({id}) has not joined as a learner yet; it can be promoted once it has")]
    NotJoinedYet {
        /// The member.
        name: String,
        /// Its id.
        id: NodeId,
    },
    /// A removal of a member that still hosts control planes.
    #[error("member {name} ({id}) hosts control planes {}; move them first", control_planes.join(", "))]
    HostsControlPlanes {
        /// The member.
        name: String,
        /// Its id.
        id: NodeId,
        /// What it hosts.
        control_planes: Vec<String>,
    },
    /// A removal of a member that still runs etcd members of zone-tolerant control planes.
    #[error(
        "member {name} ({id}) runs etcd members of the zone-tolerant control planes {}; remove them or replace its etcd members first",
        control_planes.join(", ")
    )]
    RunsEtcdMembers {
        /// The member.
        name: String,
        /// Its id.
        id: NodeId,
        /// Whose etcd members it runs.
        control_planes: Vec<String>,
    },
    /// A zone-tolerant control plane whose etcd members cannot be placed in distinct zones.
    #[error("control plane {control_plane}: {why}")]
    TooFewZones {
        /// The control plane.
        control_plane: String,
        /// Which zones have eligible members, and why the others are not.
        why: String,
    },
    /// A move of a zone-tolerant control plane to a member that runs none of its etcd members.
    #[error(
        "control plane {control_plane} is zone-tolerant: only its etcd members ({}) may host it, not {member}",
        members.join(", ")
    )]
    NotAnEtcdMember {
        /// The control plane.
        control_plane: String,
        /// The member named.
        member: String,
        /// Its etcd members.
        members: Vec<String>,
    },
    /// A command about the etcd cluster of a control plane that has none.
    #[error("control plane {control_plane} is not zone-tolerant: it has no etcd cluster")]
    NotZoneTolerant {
        /// The control plane.
        control_plane: String,
    },
    /// A change of an etcd cluster decided on stale state.
    #[error(
        "control plane {control_plane}'s etcd cluster is at generation {generation}; this was decided on stale state"
    )]
    StaleEtcdGeneration {
        /// The control plane.
        control_plane: String,
        /// Its cluster's generation.
        generation: u64,
    },
    /// A second change of an etcd cluster while one is in progress.
    #[error(
        "control plane {control_plane}'s etcd cluster is changing already ({change}); one change at a time"
    )]
    EtcdChangeInProgress {
        /// The control plane.
        control_plane: String,
        /// The change in progress, in words.
        change: String,
    },
    /// A report of a step the etcd cluster's change does not wait for.
    #[error(
        "control plane {control_plane}'s etcd cluster waits for {}; {member} reported {given}",
        expected.as_deref().unwrap_or("no change")
    )]
    UnexpectedEtcdChangeReport {
        /// The control plane.
        control_plane: String,
        /// The step it waits for, if a change is in progress.
        expected: Option<String>,
        /// Who reported.
        member: String,
        /// What was reported.
        given: String,
    },
    /// A host reported an etcd id for a member other than the one the ring recorded.
    #[error(
        "control plane {control_plane}'s etcd member on {member} is recorded with id {recorded:x}, reported as {reported:x}: the ring keeps the recorded one"
    )]
    EtcdIdConflict {
        /// The control plane.
        control_plane: String,
        /// The ring member that runs it.
        member: String,
        /// The id recorded.
        recorded: u64,
        /// The id reported.
        reported: u64,
    },
    /// An operator's recovery of an etcd cluster that is not allowed now.
    #[error("cannot recover the etcd cluster of {control_plane}: {why}")]
    RecoveryRefused {
        /// The control plane.
        control_plane: String,
        /// Why not.
        why: String,
    },
    /// A replacement etcd member that cannot take part.
    #[error("{member} cannot replace an etcd member of {control_plane}: {why}")]
    ReplacementUnfit {
        /// The control plane.
        control_plane: String,
        /// The member proposed.
        member: String,
        /// Why not.
        why: String,
    },
    /// A removal of the last voter.
    #[error("member {name} ({id}) is the last voter; a ring cannot remove its last voter")]
    LastVoter {
        /// The member.
        name: String,
        /// Its id.
        id: NodeId,
    },
    /// A recovery of a ring that never registered its founders.
    #[error(
        "this ring never registered its founding members: there is nothing to recover; form a new ring instead"
    )]
    NothingToRecover,
    /// A recovery from a removed member.
    #[error(
        "member id {id} was removed from this ring (retired): a ring cannot restart from a removed member"
    )]
    RecoveryFromRetiredMember {
        /// The survivor's id.
        id: NodeId,
    },
    /// A recovery from an id the ring does not know.
    #[error("member id {id} is not a member of this ring (registered: {})", registered.join(", "))]
    RecoveryFromUnknownMember {
        /// The survivor's id.
        id: NodeId,
        /// The registered members, as `name(id)`.
        registered: Vec<String>,
    },
    /// A recovery whose survivor has another name or zone than registered.
    #[error(
        "member {id} is registered as {registered_name} in zone {registered_zone}, not {name} in zone {zone}"
    )]
    RecoveryIdentityMismatch {
        /// The survivor's id.
        id: NodeId,
        /// Its registered name.
        registered_name: String,
        /// Its registered zone.
        registered_zone: String,
        /// The name given.
        name: String,
        /// The zone given.
        zone: String,
    },
    /// A recovery that does not remove exactly every other member.
    #[error("a recovery removes exactly every other member ({others:?}), not {removed:?}")]
    RecoveryRemovesOthers {
        /// Every other member's id.
        others: std::collections::BTreeSet<NodeId>,
        /// The ids given.
        removed: Vec<NodeId>,
    },
    /// A move decided on stale state (the epoch moved on since): decide again.
    #[error(
        "control plane {control_plane} is at epoch {epoch}; a move must name epoch {} (this one was decided on stale state)",
        epoch + 1
    )]
    StaleMove {
        /// The control plane.
        control_plane: String,
        /// Its current epoch.
        epoch: u64,
    },
    /// A move to the current host.
    #[error("control plane {control_plane} is already hosted on {member}")]
    AlreadyHosted {
        /// The control plane.
        control_plane: String,
        /// Its host.
        member: String,
    },
    /// A move to the control plane's home.
    #[error("{member} is the home of control plane {control_plane}; it is never hosted there")]
    MoveToHome {
        /// The control plane.
        control_plane: String,
        /// Its home.
        member: String,
    },
    /// A move to a member without an endpoint for the control plane.
    #[error("control plane {control_plane} has no endpoint on {member}")]
    NoEndpoint {
        /// The control plane.
        control_plane: String,
        /// The member.
        member: String,
    },
    /// A move to a member that is still joining.
    #[error("{member} is still joining the ring")]
    MoveToJoining {
        /// The member.
        member: String,
    },
    /// A move to a cordoned member.
    #[error("{member} is cordoned; uncordon it first")]
    MoveToCordoned {
        /// The member.
        member: String,
    },
    /// A revocation of a certificate that is revoked already.
    #[error("certificate {serial} of {issuer} is already revoked (at {at_ms} ms by {actor})")]
    AlreadyRevoked {
        /// Its serial number.
        serial: String,
        /// Its issuer.
        issuer: String,
        /// When it was revoked (Unix ms).
        at_ms: u64,
        /// By whom.
        actor: String,
    },
    /// Taking back a revocation that does not exist.
    #[error(
        "certificate {serial} of {issuer} is not revoked (`ringctl certs list-revoked` lists what is)"
    )]
    NotRevoked {
        /// Its serial number.
        serial: String,
        /// Its issuer.
        issuer: String,
    },
    /// A move to a lost member.
    #[error("{member} is lost")]
    MoveToLost {
        /// The member.
        member: String,
    },
    /// A new control plane's requested host cannot take it.
    #[error("host {host} {why}; choose another host or let placement choose")]
    HostUnfit {
        /// The requested host.
        host: String,
        /// Why not.
        why: Unfitness,
    },
    /// A fence release at another epoch than the control plane's.
    #[error("control plane {control_plane} is at epoch {epoch}, not {given}")]
    WrongEpoch {
        /// The control plane.
        control_plane: String,
        /// Its epoch.
        epoch: u64,
        /// The epoch given.
        given: u64,
    },
    /// A fence release by a member that does not fence the control plane.
    #[error("{member} is not fencing control plane {control_plane}")]
    NotFencing {
        /// The member.
        member: String,
        /// The control plane.
        control_plane: String,
    },
    /// A host's report that does not match the control plane's phase, epoch or host (a late
    /// report from before a move).
    #[error(
        "control plane {control_plane} is {phase} at epoch {epoch} on {}; {member} cannot report {report} {given}",
        host.as_deref().unwrap_or("no host")
    )]
    UnexpectedReport {
        /// The control plane.
        control_plane: String,
        /// Its phase, as history names it.
        phase: String,
        /// Its epoch.
        epoch: u64,
        /// Its host.
        host: Option<String>,
        /// The member that reported.
        member: String,
        /// What it reported.
        report: ReportKind,
        /// The epoch it reported for.
        given: u64,
    },
    /// A migration report for an epoch without a migration.
    #[error("control plane {control_plane} has no migration at epoch {epoch}")]
    NoMigration {
        /// The control plane.
        control_plane: String,
        /// The epoch.
        epoch: u64,
    },
    /// A migration report of a step that goes back, or one a host never reports.
    #[error("the migration is {step}; a report of {reported} comes too late or too early")]
    MigrationStepOutOfOrder {
        /// The migration's step.
        step: String,
        /// The step reported.
        reported: String,
    },
    /// A command introduced at a newer ring version than the active one: some member might
    /// not decode it (see [`crate::ring_version`]).
    #[error(
        "{action} needs ring version {needed}; the ring runs at version {active} (members of older releases could not read it): finalize the upgrade first (`ringctl upgrade finalize`)"
    )]
    RingVersionTooLow {
        /// The command's action (as history names it).
        action: String,
        /// The version that introduced it.
        needed: u32,
        /// The ring's active version.
        active: u32,
    },
    /// A ring version change that is not one step up from the active version.
    #[error("the ring runs at version {active}; it can only be raised to {}, not {asked}", active + 1)]
    RingVersionStep {
        /// The active version.
        active: u32,
        /// The version asked for.
        asked: u32,
    },
}

/// Why a member cannot host a new control plane.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum Unfitness {
    /// It is still joining the ring.
    Joining,
    /// It is judged lost.
    Lost,
    /// The operator cordoned it.
    Cordoned,
}

impl fmt::Display for Unfitness {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Unfitness::Joining => "is still joining the ring",
            Unfitness::Lost => "is lost",
            Unfitness::Cordoned => "is cordoned",
        })
    }
}

/// What a host reported, in [`CommandError::UnexpectedReport`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum ReportKind {
    /// `ReportServing`.
    Serving,
    /// `ReportMigration`.
    Migration,
    /// `ReportBackup`.
    Backups,
    /// `ReportProblem`.
    Problem,
}

impl fmt::Display for ReportKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            ReportKind::Serving => "serving epoch",
            ReportKind::Migration => "a migration at epoch",
            ReportKind::Backups => "its backups at epoch",
            ReportKind::Problem => "a problem at epoch",
        })
    }
}

impl CommandError {
    /// A stable name for the kind of refusal (snake case), for clients that branch on it: the
    /// Admin API sends it in the `x-ring-refusal` header of the error.
    pub fn kind(&self) -> &'static str {
        match self {
            CommandError::Invalid { .. } => "invalid",
            CommandError::DuplicateMemberId(_) => "duplicate_member_id",
            CommandError::RetiredMemberId(_) => "retired_member_id",
            CommandError::DuplicateMemberName { .. } => "duplicate_member_name",
            CommandError::UnknownMember(_) => "unknown_member",
            CommandError::DuplicateControlPlane(_) => "duplicate_control_plane",
            CommandError::UnknownControlPlane(_) => "unknown_control_plane",
            CommandError::DuplicateDnsName { .. } => "duplicate_dns_name",
            CommandError::Limit(_) => "limit",
            CommandError::AlreadyRevoked { .. } => "already_revoked",
            CommandError::NotRevoked { .. } => "not_revoked",
            CommandError::RecoveryThroughRaft => "recovery_through_raft",
            CommandError::NotARecovery { .. } => "not_a_recovery",
            CommandError::AlreadyBootstrapped => "already_bootstrapped",
            CommandError::NotBootstrapped => "not_bootstrapped",
            CommandError::NameStillFencing { .. } => "name_still_fencing",
            CommandError::DuplicateAddress { .. } => "duplicate_address",
            CommandError::NotJoinedYet { .. } => "not_joined_yet",
            CommandError::HostsControlPlanes { .. } => "hosts_control_planes",
            CommandError::RunsEtcdMembers { .. } => "runs_etcd_members",
            CommandError::TooFewZones { .. } => "too_few_zones",
            CommandError::NotAnEtcdMember { .. } => "not_an_etcd_member",
            CommandError::NotZoneTolerant { .. } => "not_zone_tolerant",
            CommandError::StaleEtcdGeneration { .. } => "stale_etcd_generation",
            CommandError::EtcdChangeInProgress { .. } => "etcd_change_in_progress",
            CommandError::UnexpectedEtcdChangeReport { .. } => "unexpected_etcd_change_report",
            CommandError::EtcdIdConflict { .. } => "etcd_id_conflict",
            CommandError::ReplacementUnfit { .. } => "replacement_unfit",
            CommandError::RecoveryRefused { .. } => "etcd_recovery_refused",
            CommandError::LastVoter { .. } => "last_voter",
            CommandError::NothingToRecover => "nothing_to_recover",
            CommandError::RecoveryFromRetiredMember { .. } => "recovery_from_retired_member",
            CommandError::RecoveryFromUnknownMember { .. } => "recovery_from_unknown_member",
            CommandError::RecoveryIdentityMismatch { .. } => "recovery_identity_mismatch",
            CommandError::RecoveryRemovesOthers { .. } => "recovery_removes_others",
            CommandError::StaleMove { .. } => "stale_move",
            CommandError::AlreadyHosted { .. } => "already_hosted",
            CommandError::MoveToHome { .. } => "move_to_home",
            CommandError::NoEndpoint { .. } => "no_endpoint",
            CommandError::MoveToJoining { .. } => "move_to_joining",
            CommandError::MoveToCordoned { .. } => "move_to_cordoned",
            CommandError::MoveToLost { .. } => "move_to_lost",
            CommandError::HostUnfit { .. } => "host_unfit",
            CommandError::WrongEpoch { .. } => "wrong_epoch",
            CommandError::NotFencing { .. } => "not_fencing",
            CommandError::UnexpectedReport { .. } => "unexpected_report",
            CommandError::NoMigration { .. } => "no_migration",
            CommandError::MigrationStepOutOfOrder { .. } => "migration_step_out_of_order",
            CommandError::RingVersionTooLow { .. } => "ring_version_too_low",
            CommandError::RingVersionStep { .. } => "ring_version_step",
        }
    }

    /// Whether the same command may succeed later without an operator changing anything:
    /// the state it waits for comes by itself (the founders get registered, a learner joins, a
    /// former host releases its lease). A stale move is not: it must be decided again.
    pub fn is_transient(&self) -> bool {
        matches!(
            self,
            CommandError::NotBootstrapped
                | CommandError::NotJoinedYet { .. }
                | CommandError::NameStillFencing { .. }
        )
    }

    /// Whether the command is well-formed but not allowed in the current state (gRPC
    /// `FAILED_PRECONDITION`), as opposed to invalid, a conflict, unknown or over a limit.
    pub fn is_precondition(&self) -> bool {
        !matches!(
            self,
            CommandError::Invalid { .. }
                | CommandError::DuplicateMemberId(_)
                | CommandError::RetiredMemberId(_)
                | CommandError::DuplicateMemberName { .. }
                | CommandError::DuplicateControlPlane(_)
                | CommandError::DuplicateDnsName { .. }
                | CommandError::UnknownMember(_)
                | CommandError::UnknownControlPlane(_)
                | CommandError::Limit(_)
                | CommandError::AlreadyRevoked { .. }
                | CommandError::NotRevoked { .. }
        )
    }

    /// Builds an [`CommandError::Invalid`], truncating long values so errors stay one line.
    pub fn invalid(field: &str, value: &str, why: impl Into<String>) -> Self {
        Self::Invalid {
            field: field.to_string(),
            value: shorten(value),
            why: why.into(),
        }
    }
}

/// `value`, cut to at most 80 bytes (on a character boundary) with `...` appended when cut, so
/// an error that quotes hostile input stays one readable line.
pub fn shorten(value: &str) -> String {
    const SHOWN: usize = 80;
    if value.len() <= SHOWN {
        return value.to_string();
    }
    let mut end = SHOWN;
    while !value.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &value[..end])
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn long_values_are_shortened_on_a_character_boundary() {
        assert_eq!(shorten("short"), "short");
        assert_eq!(shorten(&"x".repeat(80)), "x".repeat(80));
        assert_eq!(shorten(&"x".repeat(81)), format!("{}...", "x".repeat(80)));
        // 'é' is two bytes; byte 80 is the start of the 41st.
        let accents = "\u{e9}".repeat(41);
        assert_eq!(shorten(&accents), format!("{}...", "\u{e9}".repeat(40)));
        // 'x' then 'é's: byte 80 falls inside one.
        let shifted = format!("x{}", "\u{e9}".repeat(41));
        assert_eq!(shorten(&shifted), format!("x{}...", "\u{e9}".repeat(39)));
        let err = CommandError::invalid("actor", &"a".repeat(1000), "too long");
        assert!(err.to_string().len() < 200, "{err}");
    }
}

#[cfg(test)]
mod message_tests {
    use super::*;

    /// The typed refusals read exactly as the text refusals they replaced: operators, scripts
    /// and the tests of the I/O layer match these words.
    #[test]
    fn refusals_read_as_before() {
        let cases = [
            (
                CommandError::NotBootstrapped,
                "the ring has not registered its founding members yet; retry",
            ),
            (
                CommandError::NameStillFencing {
                    control_plane: "cp1".into(),
                    name: "d".into(),
                },
                "control plane cp1 still waits for a former member named d to release it (its lease may not have run out yet); add d once no control plane lists it as fencing (`ringctl cp list`), within lease + fence + margin",
            ),
            (
                CommandError::HostsControlPlanes {
                    name: "a".into(),
                    id: 1,
                    control_planes: vec!["cp1".into(), "cp2".into()],
                },
                "member a (1) hosts control planes cp1, cp2; move them first",
            ),
            (
                CommandError::StaleMove {
                    control_plane: "cp1".into(),
                    epoch: 3,
                },
                "control plane cp1 is at epoch 3; a move must name epoch 4 (this one was decided on stale state)",
            ),
            (
                CommandError::HostUnfit {
                    host: "b".into(),
                    why: Unfitness::Cordoned,
                },
                "host b is cordoned; choose another host or let placement choose",
            ),
            (
                CommandError::UnexpectedReport {
                    control_plane: "x".into(),
                    phase: "starting".into(),
                    epoch: 2,
                    host: None,
                    member: "c".into(),
                    report: ReportKind::Backups,
                    given: 1,
                },
                "control plane x is starting at epoch 2 on no host; c cannot report its backups at epoch 1",
            ),
            (
                CommandError::RecoveryRemovesOthers {
                    others: [2, 3].into(),
                    removed: vec![2],
                },
                "a recovery removes exactly every other member ({2, 3}), not [2]",
            ),
        ];
        for (error, text) in cases {
            assert_eq!(error.to_string(), text);
            assert!(error.is_precondition(), "{}", error.kind());
        }
        assert!(CommandError::NotBootstrapped.is_transient());
        assert!(
            !CommandError::StaleMove {
                control_plane: "x".into(),
                epoch: 1
            }
            .is_transient()
        );
        assert!(!CommandError::UnknownMember("x".into()).is_precondition());
    }
}
