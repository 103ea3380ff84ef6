//! Why a command was refused. These errors are part of the replicated state machine's output
//! (a refused command is committed but changes nothing), so they are plain data: serializable,
//! comparable and deterministic.

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
    /// The command is well-formed but not allowed in the current state.
    #[error("{0}")]
    Refused(String),
}

impl CommandError {
    /// Builds an [`CommandError::Invalid`], truncating long values so errors stay one line.
    pub fn invalid(field: &str, value: &str, why: impl Into<String>) -> Self {
        const SHOWN: usize = 80;
        let value = if value.len() > SHOWN {
            let mut end = SHOWN;
            while !value.is_char_boundary(end) {
                end -= 1;
            }
            format!("{}...", &value[..end])
        } else {
            value.to_string()
        };
        Self::Invalid {
            field: field.to_string(),
            value,
            why: why.into(),
        }
    }
}
