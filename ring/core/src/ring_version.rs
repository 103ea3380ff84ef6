//! The ring's version: which commands, fields and formats the members may exchange.
//!
//! A member of an older release cannot decode a command it does not know (the log stops
//! applying there), so every command, field and format carries the **ring version** that
//! introduced it, and the replicated state holds the ring's *active* version
//! ([`RingVersion::active`]). A leader proposes only what the active version allows
//! ([`RingVersion::admits`]); `apply` refuses the rest, as an assertion.
//!
//! The active version goes up by one step, with [`Command::SetRingVersion`], once every member
//! of the configuration runs a binary that supports the next one (the leader checks what each
//! reports; [`next_version`]). Until then any member can go back to the previous release's
//! binary: nothing in the log or in a snapshot is newer than what it reads. After it, the
//! older binary cannot take part (the peer messages and the data directory carry the active
//! version as their codec number, which the older binary refuses).
//!
//! Ring versions:
//! - **1**: release 0.1.0 (no version in the state: an absent [`RingVersion`] is version 1).
//! - **2**: release 0.2.0: [`Command::SetRingVersion`], [`Command::HoldUpgrade`] and
//!   [`Command::MarkDiverged`] (with [`Member::diverged`](crate::member::Member::diverged)).

use serde::{Deserialize, Serialize};

use super::command::Command;
use super::error::CommandError;

/// The ring version a state without one runs at: release 0.1.0's.
pub const INITIAL_RING_VERSION: u32 = 1;

/// The ring versions this build can run at: the oldest (what the previous release runs) and
/// the newest (what it adds). A binary runs beside members of any version in this range.
pub const SUPPORTED_RING_VERSIONS: (u32, u32) = (1, 2);

/// The ring's version as the replicated state holds it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RingVersion {
    /// The version every member runs at: what the leader may propose.
    pub active: u32,
    /// Set by the operator (`ringctl upgrade hold`): the leader does not raise the version by
    /// itself, only `ringctl upgrade finalize` does. The operator's reason.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held: Option<String>,
}

impl Default for RingVersion {
    fn default() -> Self {
        Self {
            active: INITIAL_RING_VERSION,
            held: None,
        }
    }
}

impl RingVersion {
    /// Whether this is what a state of release 0.1.0 holds implicitly (and so is not stored:
    /// the state encodes exactly as 0.1.0's does).
    pub fn is_initial(&self) -> bool {
        *self == Self::default()
    }

    /// Whether a command may be proposed and applied at this active version: it was
    /// introduced at or before it. [`Command::SetRingVersion`] names the next version, which
    /// every member must support (the proposer checks that; see [`next_version`]).
    pub fn admits(&self, command: &Command) -> Result<(), CommandError> {
        if let Command::SetRingVersion { version } = command {
            let next = self.active.saturating_add(1);
            return if *version == next {
                Ok(())
            } else {
                Err(CommandError::RingVersionStep {
                    active: self.active,
                    asked: *version,
                })
            };
        }
        let needed = introduced_in(command);
        if needed <= self.active {
            Ok(())
        } else {
            Err(CommandError::RingVersionTooLow {
                action: command.action().to_string(),
                needed,
                active: self.active,
            })
        }
    }
}

/// The ring version that introduced `command` (members of older versions cannot decode it).
pub fn introduced_in(command: &Command) -> u32 {
    match command {
        Command::SetRingVersion { version } => *version,
        Command::HoldUpgrade { .. } | Command::MarkDiverged { .. } => 2,
        _ => INITIAL_RING_VERSION,
    }
}

/// What one member supports, as it reports it: the range of ring versions its binary runs at.
/// A member that reports nothing (release 0.1.0) supports version 1 only.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Supported {
    /// The oldest ring version it runs at.
    pub min: u32,
    /// The newest.
    pub max: u32,
}

impl Supported {
    /// What a member that reports nothing supports: release 0.1.0's version only.
    pub const UNREPORTED: Supported = Supported {
        min: INITIAL_RING_VERSION,
        max: INITIAL_RING_VERSION,
    };

    /// What this build supports.
    pub const THIS_BUILD: Supported = Supported {
        min: SUPPORTED_RING_VERSIONS.0,
        max: SUPPORTED_RING_VERSIONS.1,
    };

    /// Whether a member with this binary can run at `version`.
    pub fn runs(&self, version: u32) -> bool {
        (self.min..=self.max).contains(&version)
    }
}

/// What a member reports about its binary with every lease renewal.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MemberVersion {
    /// The release, e.g. `0.2.0`.
    pub binary: String,
    /// The commit it was built from (short), or `unknown`.
    pub commit: String,
    /// The ring versions it runs at.
    pub ring: Supported,
}

/// The version the active one may be raised to: one step up, when every member of the
/// configuration (`members`, what each supports) runs it. `None` while some member does not
/// (a mixed ring), or when the newest is active already.
pub fn next_version<'a>(
    active: u32,
    members: impl IntoIterator<Item = &'a Supported>,
) -> Option<u32> {
    let next = active.checked_add(1)?;
    let mut any = false;
    for supported in members {
        any = true;
        if !supported.runs(next) {
            return None;
        }
    }
    any.then_some(next)
}

/// Whether the members of the configuration run binaries of more than one newest version
/// (some could run a newer ring version than others): a rolling upgrade that is not done.
pub fn is_mixed<'a>(members: impl IntoIterator<Item = &'a Supported>) -> bool {
    let mut newest = None;
    for supported in members {
        match newest {
            None => newest = Some(supported.max),
            Some(n) if n != supported.max => return true,
            Some(_) => {}
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    const OLD: Supported = Supported::UNREPORTED;
    const NEW: Supported = Supported::THIS_BUILD;

    #[test]
    fn an_absent_version_is_release_0_1_0s() {
        let v: RingVersion = serde_json::from_str(r#"{"active":1}"#).unwrap();
        assert!(v.is_initial());
        assert_eq!(RingVersion::default().active, 1);
    }

    #[test]
    fn raised_only_when_every_member_runs_the_next_version() {
        assert_eq!(next_version(1, [&NEW, &NEW, &NEW]), Some(2));
        assert_eq!(next_version(1, [&NEW, &OLD, &NEW]), None);
        assert_eq!(
            next_version(2, [&NEW, &NEW, &NEW]),
            None,
            "2 is this build's newest"
        );
        assert_eq!(
            next_version(1, []),
            None,
            "no member reported: nothing is known"
        );
    }

    #[test]
    fn mixed_while_newest_versions_differ() {
        assert!(is_mixed([&NEW, &OLD]));
        assert!(!is_mixed([&NEW, &NEW]));
        assert!(!is_mixed([&OLD, &OLD, &OLD]));
    }

    #[test]
    fn commands_of_a_newer_version_are_refused_at_an_older_one() {
        let v1 = RingVersion::default();
        let hold = Command::HoldUpgrade { held: true };
        assert!(matches!(
            v1.admits(&hold),
            Err(CommandError::RingVersionTooLow {
                needed: 2,
                active: 1,
                ..
            })
        ));
        assert!(v1.admits(&Command::SetPaused { paused: true }).is_ok());
        assert!(v1.admits(&Command::SetRingVersion { version: 2 }).is_ok());
        assert!(matches!(
            v1.admits(&Command::SetRingVersion { version: 3 }),
            Err(CommandError::RingVersionStep {
                active: 1,
                asked: 3
            })
        ));
        let v2 = RingVersion {
            active: 2,
            held: None,
        };
        assert!(v2.admits(&hold).is_ok());
        assert!(v2.admits(&Command::SetRingVersion { version: 2 }).is_err());
    }
}
