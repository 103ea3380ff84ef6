//! The members of a ring: what registers one ([`MemberSpec`]), and what the ring records about
//! each ([`Member`]: its place in the Raft configuration, its health, the operator's cordon and
//! labels).

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use super::NodeId;
use super::error::CommandError;
use super::names::{check_address, check_label, require};

/// A member's place in the Raft configuration, mirrored from committed membership entries.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Role {
    /// Registered, not yet in the Raft configuration.
    Joining,
    /// Receives the log, does not vote.
    Learner,
    /// Votes and counts toward the quorum.
    Voter,
}

impl fmt::Display for Role {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Role::Joining => "joining",
            Role::Learner => "learner",
            Role::Voter => "voter",
        })
    }
}

/// The leader's view of a member, as last committed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Health {
    /// Not judged yet (no leader has reported on it).
    Unknown,
    /// The leader has recent contact.
    Healthy,
    /// Contact is late.
    Suspect,
    /// No contact for longer than the loss threshold.
    Lost,
}

impl fmt::Display for Health {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Health::Unknown => "unknown",
            Health::Healthy => "healthy",
            Health::Suspect => "suspect",
            Health::Lost => "lost",
        })
    }
}

/// A registered member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Member {
    /// Raft node id.
    pub id: NodeId,
    /// Unique name.
    pub name: String,
    /// Failure zone.
    pub zone: String,
    /// Peer (Raft) address.
    pub address: String,
    /// Admin API address.
    pub admin_address: String,
    /// Place in the Raft configuration.
    pub role: Role,
    /// Whether the operator asked for it to be a voter.
    pub wants_voter: bool,
    /// Health as last committed by the leader.
    pub health: Health,
    /// Whether a leader has ever heard from it (it has been healthy at least once). A member
    /// that comes back with an empty data directory while this is set has lost its data.
    pub contacted: bool,
    /// Cordoned by the operator: it gets no new control planes (it keeps the ones it has).
    #[serde(default)]
    pub cordoned: bool,
    /// Labels the operator gave it (placement preferences can name them).
    #[serde(default)]
    pub labels: BTreeMap<String, String>,
    /// Set when a leader found it with less in its log than it had acknowledged
    /// ([`Command::MarkDiverged`](super::command::Command::MarkDiverged), ring version 2): it
    /// stays judged lost until it is removed. Absent in states of ring version 1.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub diverged: Option<Divergence>,
}

/// Why a member is not trusted: it came back with less in its log than it had acknowledged (a
/// restored disk or data directory, a disk that lied about a flush).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Divergence {
    /// The highest log index it had acknowledged to the leader that found it: until its log
    /// holds that far again, it grants no vote.
    pub acknowledged_index: u64,
    /// Why, in one line.
    pub reason: String,
}

impl Member {
    /// Records that it diverged; the first finding stays. `None` when it was recorded already.
    pub fn mark_diverged(&mut self, divergence: Divergence) -> Option<String> {
        if self.diverged.is_some() {
            return None;
        }
        let detail = format!(
            "diverged (it had acknowledged up to index {}): {}",
            divergence.acknowledged_index, divergence.reason
        );
        self.diverged = Some(divergence);
        Some(detail)
    }

    /// What the member was registered with.
    pub fn spec(&self) -> MemberSpec {
        MemberSpec {
            id: self.id,
            name: self.name.clone(),
            zone: self.zone.clone(),
            address: self.address.clone(),
            admin_address: self.admin_address.clone(),
        }
    }
}

/// Everything needed to register a member.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberSpec {
    /// Raft node id, never reused. Must not be 0.
    pub id: NodeId,
    /// DNS-1123 label, unique among current members.
    pub name: String,
    /// DNS-1123 label of the failure zone.
    pub zone: String,
    /// Peer (Raft) address, `host:port`.
    pub address: String,
    /// Admin API address, `host:port`.
    pub admin_address: String,
}

impl MemberSpec {
    /// Syntax checks.
    pub fn validate(&self) -> Result<(), CommandError> {
        if self.id == 0 {
            return Err(CommandError::invalid(
                "member id",
                "0",
                "must be at least 1",
            ));
        }
        require("member name", &self.name, check_label)?;
        require("zone", &self.zone, check_label)?;
        require("member address", &self.address, check_address)?;
        require("member admin address", &self.admin_address, check_address)?;
        if self.address == self.admin_address {
            return Err(CommandError::invalid(
                "member admin address",
                &self.admin_address,
                "must differ from the peer address",
            ));
        }
        Ok(())
    }
}
