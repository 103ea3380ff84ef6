//! The openraft type configuration.

use std::fmt;

use serde::{Deserialize, Serialize};

use crate::core::{CommandError, MemberSpec, Proposal};

pub use crate::core::NodeId;

/// What the Raft membership records about each member: enough to reach it and to register it.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberNode {
    /// Member name.
    pub name: String,
    /// Failure zone.
    pub zone: String,
    /// Peer (Raft) address, `host:port`.
    pub address: String,
    /// Admin API address, `host:port`.
    pub admin_address: String,
}

impl From<&MemberSpec> for MemberNode {
    fn from(spec: &MemberSpec) -> Self {
        Self {
            name: spec.name.clone(),
            zone: spec.zone.clone(),
            address: spec.address.clone(),
            admin_address: spec.admin_address.clone(),
        }
    }
}

impl MemberNode {
    /// The registration of node `id` as recorded in the Raft membership.
    pub fn spec(&self, id: NodeId) -> MemberSpec {
        MemberSpec {
            id,
            name: self.name.clone(),
            zone: self.zone.clone(),
            address: self.address.clone(),
            admin_address: self.admin_address.clone(),
        }
    }
}

impl fmt::Display for MemberNode {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.name, self.address)
    }
}

/// A member's answer to a peer's `Ping`: how it sees the ring and the peer.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PingReply {
    /// The leader the answering member knows of.
    pub leader_id: Option<NodeId>,
    /// Its applied index.
    pub applied_index: u64,
    /// Whether the ring has registered its founders.
    pub bootstrapped: bool,
    /// `None` when the asking member is not registered; else whether it has ever been in
    /// contact with a leader (been judged healthy).
    pub registered: Option<bool>,
}

/// The leader's answer to a follower's `ReadIndex`: a quorum confirmed it leads in `term`, and
/// a linearizable read must wait until the reader has applied `index`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ReadIndexReply {
    /// The log index to apply before reading.
    pub index: u64,
    /// The term the leader confirmed.
    pub term: u64,
}

/// The result of applying one proposal: refused commands are committed but change nothing.
pub type ApplyResult = Result<(), CommandError>;

openraft::declare_raft_types!(
    /// Type configuration of the ring's Raft group.
    pub TypeConfig:
        D = Proposal,
        R = ApplyResult,
        Node = MemberNode,
);

/// Data of a state-machine snapshot: the encoded [`SnapshotBody`](super::state_machine::SnapshotBody).
pub type SnapshotData = Vec<u8>;

/// A running Raft node of this ring.
pub type RaftNode = openraft::Raft<TypeConfig, super::StateMachineStore>;

/// openraft's log entry for this ring.
pub type Entry = openraft::alias::EntryOf<TypeConfig>;
/// openraft's log id.
pub type LogId = openraft::alias::LogIdOf<TypeConfig>;
/// openraft's vote.
pub type Vote = openraft::alias::VoteOf<TypeConfig>;
/// openraft's snapshot metadata.
pub type SnapshotMeta = openraft::alias::SnapshotMetaOf<TypeConfig>;
/// openraft's stored membership.
pub type StoredMembership = openraft::alias::StoredMembershipOf<TypeConfig>;
/// The log id of entry `index` proposed by leader `node` in `term`.
pub fn log_id(term: u64, node: NodeId, index: u64) -> LogId {
    LogId::new(
        openraft::impls::leader_id_adv::LeaderId {
            term,
            node_id: node,
        },
        index,
    )
}

/// openraft's metrics of a node of this ring.
pub type RaftMetricsOf = openraft::RaftMetrics<TypeConfig>;

/// A member's lease renewal (the `Renew` RPC).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RenewRequest {
    /// What the member runs now: control plane -> epoch (starting or serving).
    pub running: std::collections::BTreeMap<String, u64>,
    /// Of those, what passed its health check.
    #[serde(default)]
    pub healthy: std::collections::BTreeMap<String, u64>,
    /// Of those, the migrations it performs (copy, restore), by control plane.
    #[serde(default)]
    pub migrations: std::collections::BTreeMap<String, crate::core::migration::MigrationReport>,
    /// Of those, the backups it writes, by control plane: only for control planes it runs at
    /// the epoch in `running` (etcd driver; empty with the others).
    #[serde(default)]
    pub backups: std::collections::BTreeMap<String, crate::core::backup_report::BackupReport>,
    /// Of those (zone-tolerant ones it hosts), the step of their etcd cluster's change it did:
    /// control plane -> (cluster generation, step).
    #[serde(default)]
    pub etcd_changes:
        std::collections::BTreeMap<String, (u64, crate::core::etcd_cluster::EtcdChangeStep)>,
    /// Of those (zone-tolerant ones it hosts), etcd's ids of the cluster's members as it last
    /// listed them: control plane -> (cluster generation, ring member -> etcd member id).
    #[serde(default)]
    pub etcd_ids:
        std::collections::BTreeMap<String, (u64, std::collections::BTreeMap<String, u64>)>,
    /// Of the control planes it hosts (running or not), what is wrong with them here:
    /// control plane -> (epoch, the host's words), e.g. an etcd that keeps exiting. Absent:
    /// nothing wrong (or a member that predates it).
    #[serde(default)]
    pub problems: std::collections::BTreeMap<String, (u64, String)>,
    /// When this member last accepted a message of a leader of a term below its vote's (see
    /// [`crate::raft::contact`]): a new leader counts silent members' time from the latest of a
    /// quorum's. `None` from a member that predates it (the leader then counts from its
    /// election).
    #[serde(default)]
    pub earlier_leader: Option<EarlierLeaderContact>,
    /// Which round of this member's renewals this is; every copy of a round carries the same
    /// (see [`crate::core::renewal`]). `None` from a member that predates it.
    #[serde(default)]
    pub round: Option<crate::core::renewal::RenewRound>,
    /// The member's binary: release, commit and the ring versions it runs at (see
    /// [`crate::core::ring_version`]). `None` from a member that predates it (release 0.1.0,
    /// which runs ring version 1 only).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<crate::core::ring_version::MemberVersion>,
    /// The member's last renewal before it restarts (SIGTERM): the leader grants the longest
    /// lease rule 2 allows ([`crate::core::Timing::restart_lease_ms`]) and does not judge it
    /// lost for [`crate::core::Timing::restart_grace_ms`], so that what it hosts keeps serving
    /// under its guards while the next `ringd` starts and adopts it. Ignored by a leader of
    /// release 0.1.0.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub restarting: bool,
}

/// A member's last accepted contact with a leader of a term below `term`, as it sends it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct EarlierLeaderContact {
    /// The term of the member's vote when it sent this.
    pub term: u64,
    /// Milliseconds from that contact to the sending (rounded down: never an older contact
    /// than the truth).
    pub ms_ago: u64,
}

/// The leader's answer to a [`RenewRequest`].
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub struct RenewReply {
    /// What the member may serve: control plane -> epoch.
    pub granted: std::collections::BTreeMap<String, u64>,
    /// The lease length, counted from before the request was sent.
    pub lease_ms: u64,
    /// The leader's applied index when it read the grant (after a ReadIndex): the member's
    /// own state is as fresh as the grant once it has applied this far.
    #[serde(default)]
    pub applied_index: u64,
    /// The etcd members of zone-tolerant control planes the member runs: control plane ->
    /// which run of its etcd member. Covered by the same lease.
    #[serde(default)]
    pub replicas: std::collections::BTreeMap<String, crate::core::etcd_cluster::ReplicaKey>,
    /// The binaries of the members the leader heard from in its term (`None`: release
    /// 0.1.0), so every member can show them. Empty from a leader that predates it.
    #[serde(default, skip_serializing_if = "std::collections::BTreeMap::is_empty")]
    pub versions:
        std::collections::BTreeMap<NodeId, Option<crate::core::ring_version::MemberVersion>>,
    /// Set when the leader found the member with less in its log than it had acknowledged
    /// ([`crate::raft::divergence`]): it is then granted nothing. Absent from a leader that
    /// predates it (release 0.1.0), which a member of that release ignores too.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diverged: Option<crate::core::Divergence>,
}
