//! Placement: the pure choice of a member to host a control plane.
//!
//! Version 1 rules (the self-healing work extends them with cordons, capacity and preferences):
//! the host must be a registered member that is in the Raft configuration (not still joining),
//! has an endpoint for the control plane, is not its home, is not suspect or lost, and is not in
//! the home's zone when another zone is available.
//! Among those, the member hosting the fewest control planes wins; ties go to the lowest id so
//! every member computes the same answer.

use super::command::ControlPlaneSpec;
use super::state::{Health, RingState, Role};

/// Chooses a host for `spec`, or `None` when no member is eligible.
pub fn choose_host(state: &RingState, spec: &ControlPlaneSpec) -> Option<String> {
    let home_zone = spec
        .home
        .as_ref()
        .and_then(|home| state.member_by_name(home))
        .map(|m| m.zone.clone());
    let eligible: Vec<_> = state
        .members
        .values()
        .filter(|m| spec.endpoints.contains_key(&m.name))
        .filter(|m| spec.home.as_deref() != Some(m.name.as_str()))
        .filter(|m| m.role != Role::Joining)
        .filter(|m| !matches!(m.health, Health::Suspect | Health::Lost))
        .collect();
    let outside_home_zone: Vec<_> = eligible
        .iter()
        .copied()
        .filter(|m| home_zone.as_deref() != Some(m.zone.as_str()))
        .collect();
    let candidates = if outside_home_zone.is_empty() {
        eligible
    } else {
        outside_home_zone
    };
    candidates
        .into_iter()
        .min_by_key(|m| (state.hosted_count(&m.name), m.id))
        .map(|m| m.name.clone())
}
