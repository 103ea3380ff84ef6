//! What the Admin API shows and does about rolling upgrades (`ringctl upgrade`, the ring
//! version in `ringctl status`); the rules are [`crate::upgrade`]'s and the core's.

use std::collections::BTreeMap;
use std::sync::Arc;

use tonic::Status;

use crate::config::Finalize;
use crate::core::ring_version::MemberVersion;
use crate::core::{Command, NodeId, RingState};
use crate::pb;
use crate::upgrade::{Reports, next_version};

/// The upgrade parts of the Admin service: the reports of members' binaries and this
/// member's `[upgrade] finalize`.
#[derive(Clone)]
pub struct Upgrade {
    /// What members report about their binaries.
    pub reports: Arc<Reports>,
    /// When the leader raises the version.
    pub finalize: Finalize,
    /// How old a report may be to count towards raising the version
    /// ([`crate::upgrade::FRESH_LEASES`] leases).
    pub fresh: std::time::Duration,
}

impl Default for Upgrade {
    fn default() -> Self {
        Self {
            reports: Arc::default(),
            finalize: Finalize::Auto,
            fresh: std::time::Duration::from_millis(
                crate::core::Timing::default().lease_ms * crate::upgrade::FRESH_LEASES,
            ),
        }
    }
}

/// A member's binary as the API shows it (`None`: it reports none, release 0.1.0).
pub fn binary(version: &Option<MemberVersion>) -> pb::MemberBinary {
    match version {
        None => pb::MemberBinary::default(),
        Some(v) => pb::MemberBinary {
            reported: true,
            release: v.binary.clone(),
            commit: v.commit.clone(),
            ring_min: v.ring.min,
            ring_max: v.ring.max,
        },
    }
}

/// The members of the configuration by name: the registered ones.
fn names(state: &RingState) -> BTreeMap<NodeId, String> {
    state
        .members
        .values()
        .map(|m| (m.id, m.name.clone()))
        .collect()
}

impl Upgrade {
    /// The ring's version and the upgrade's state, as this member sees them.
    pub fn status(&self, state: &RingState) -> pb::RingVersionStatus {
        let version = &state.settings.ring_version;
        let view = self.reports.view();
        let (next, next_blocked) = match next_version(
            version.active,
            &names(state),
            &self.reports.fresh(self.fresh),
        ) {
            Ok(next) => (next, String::new()),
            Err(why) => (0, why),
        };
        pb::RingVersionStatus {
            active: version.active,
            held: version.held.is_some(),
            held_reason: version.held.clone().unwrap_or_default(),
            finalize: match self.finalize {
                Finalize::Auto => "auto",
                Finalize::Manual => "manual",
            }
            .into(),
            next,
            next_blocked,
            mixed: view.mixed,
            mixed_for_ms: u64::try_from(view.mixed_for.as_millis()).unwrap_or(u64::MAX),
            answering: Some(binary(&Some(crate::version::this_member()))),
        }
    }

    /// The binaries members reported, for the member list.
    pub fn versions(&self) -> BTreeMap<NodeId, Option<MemberVersion>> {
        self.reports.view().versions
    }

    /// The command `ringctl upgrade hold` proposes, or why it cannot.
    pub fn hold(state: &RingState, held: bool) -> Result<Command, Status> {
        let command = Command::HoldUpgrade { held };
        if let Err(e) = state.settings.ring_version.admits(&command) {
            return Err(Status::failed_precondition(format!(
                "{e}. At ring version {} a hold cannot be recorded (release 0.1.0 could not \
                 read it): set `[upgrade] finalize = \"manual\"` on the upgraded members instead",
                state.settings.ring_version.active
            )));
        }
        Ok(command)
    }

    /// The command `ringctl upgrade finalize` proposes (on the leader), or why it cannot.
    pub fn finalize(&self, state: &RingState) -> Result<Command, Status> {
        let active = state.settings.ring_version.active;
        let next = next_version(active, &names(state), &self.reports.fresh(self.fresh))
            .map_err(Status::failed_precondition)?;
        Ok(Command::SetRingVersion { version: next })
    }
}
