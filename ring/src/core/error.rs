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
        Self::Invalid {
            field: field.to_string(),
            value: shorten(value),
            why: why.into(),
        }
    }
}

/// `value`, cut to at most 80 bytes (on a character boundary) with `...` appended when cut, so
/// an error that quotes hostile input stays one readable line.
pub(crate) fn shorten(value: &str) -> String {
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
