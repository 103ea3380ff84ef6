//! Placement: the pure choice of a member to host a control plane.
//!
//! A host must be a registered member that is in the Raft configuration (not still joining),
//! has an endpoint for the control plane, is not its home, is healthy (or not judged yet), is
//! not cordoned, is not in the home's zone, is not in a zone being avoided (the zone of a lost
//! host), and hosts fewer than the per-member capacity (0: no limit). Among those, the
//! operator's most preferred member wins (the control plane's `prefer` list: member names and
//! `key=value` labels, most preferred first), then the member
//! hosting the fewest control planes; ties go to the lowest id, so every member computes the
//! same answer. When nobody is eligible the answer says why, member by member.

use std::collections::BTreeMap;

use super::command::ControlPlaneSpec;
use super::control_plane::ControlPlane;
use super::etcd_cluster::{EtcdCluster, ZONE_TOLERANT_MEMBERS};
use super::member::{Health, Member, Role};
use super::vec_map::VecMap;

/// What placement reads of a ring: its members and how many control planes each hosts.
/// [`RingState`](crate::state::RingState) implements it; placement never sees the rest of the
/// state (and does not depend on it: the state calls placement when a control plane is added).
pub trait Roster {
    /// Every registered member, in id order.
    fn members(&self) -> impl Iterator<Item = &Member>;
    /// The member called `name`.
    fn member_by_name(&self, name: &str) -> Option<&Member>;
    /// How many control planes member `name` hosts.
    fn hosted_count(&self, name: &str) -> usize;
}

/// What to place.
#[derive(Debug, Clone)]
pub struct Request<'a> {
    /// The control plane's name (for messages).
    pub name: &'a str,
    /// Its home member, never a host.
    pub home: Option<&'a str>,
    /// Members with an endpoint for it.
    pub endpoints: &'a VecMap<String, String>,
    /// Members not to choose (its current host).
    pub exclude: Option<&'a str>,
    /// A zone to avoid (the zone of a lost host).
    pub avoid_zone: Option<&'a str>,
    /// Preferred members, most preferred first.
    pub prefer: &'a [String],
    /// Only these members may host it: a zone-tolerant control plane's host is always one of
    /// its etcd members.
    pub only: Option<&'a EtcdCluster>,
}

impl<'a> Request<'a> {
    /// A request for a new control plane.
    pub fn new(spec: &'a ControlPlaneSpec) -> Self {
        Self {
            name: &spec.name,
            home: spec.home.as_deref(),
            endpoints: &spec.endpoints,
            exclude: None,
            avoid_zone: None,
            prefer: &spec.prefer,
            only: None,
        }
    }

    /// A request to move `cp` off its current host.
    pub fn moving(cp: &'a ControlPlane) -> Self {
        Self {
            name: &cp.name,
            home: cp.home.as_deref(),
            endpoints: &cp.endpoints,
            exclude: cp.host.as_deref(),
            avoid_zone: None,
            prefer: &cp.prefer,
            only: cp.etcd.as_ref(),
        }
    }

    /// Also avoid `zone`.
    pub fn avoiding_zone(mut self, zone: Option<&'a str>) -> Self {
        self.avoid_zone = zone;
        self
    }
}

/// Why nobody can host a control plane: each member considered and why not (members without an
/// endpoint for it, and its current host, are not considered).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{}", if why_not.is_empty() {
    format!("no other member has an endpoint for {control_plane}")
} else {
    format!("no eligible member: {}", why_not.join(", "))
})]
pub struct NoEligibleHost {
    /// The control plane.
    pub control_plane: String,
    /// `<member> <reason>` for each member considered.
    pub why_not: Vec<String>,
}

/// Chooses a host for `request`, or says why nobody is eligible. `capacity` is the most control
/// planes one member may host (0: no limit).
pub fn choose_host(
    state: &impl Roster,
    request: &Request<'_>,
    capacity: usize,
) -> Result<String, NoEligibleHost> {
    choose_host_planned(state, request, capacity, &BTreeMap::new())
}

/// [`choose_host`] for one of several decisions taken against the same `state`: `planned`
/// counts, per member, the control planes the earlier decisions of the batch give it, so
/// spreading and capacity see them before they are applied (without it, a batch of 1,000
/// failovers all went to the one member that was least loaded before the batch, past any
/// capacity).
pub fn choose_host_planned(
    state: &impl Roster,
    request: &Request<'_>,
    capacity: usize,
    planned: &BTreeMap<String, usize>,
) -> Result<String, NoEligibleHost> {
    let home_zone = request
        .home
        .and_then(|home| state.member_by_name(home))
        .map(|m| m.zone.as_str());
    let mut why_not: Vec<String> = Vec::new();
    let rank = |m: &Member| {
        request
            .prefer
            .iter()
            .position(|p| match p.split_once('=') {
                Some((key, value)) => m.labels.get(key).is_some_and(|v| v == value),
                None => *p == m.name,
            })
            .unwrap_or(usize::MAX)
    };
    let mut best: Option<(usize, usize, u64, &str)> = None;
    for m in state.members() {
        // Members without an endpoint, and the current host, are not candidates at all: no
        // need to explain them.
        let reason = if !request.endpoints.contains_key(&m.name)
            || request.exclude == Some(m.name.as_str())
            || request.only.is_some_and(|c| !c.contains(&m.name))
        {
            None
        } else if let Some(why) = unfit(m, request.home, home_zone) {
            Some(why)
        } else if request.avoid_zone == Some(m.zone.as_str()) {
            Some(format!("in the lost zone {}", m.zone))
        } else {
            let hosted =
                state.hosted_count(&m.name) + planned.get(&m.name).copied().unwrap_or_default();
            if capacity > 0 && hosted >= capacity {
                Some(format!("at capacity ({hosted} of {capacity})"))
            } else {
                let key = (rank(m), hosted, m.id);
                if best.is_none_or(|(r, h, id, _)| key < (r, h, id)) {
                    best = Some((key.0, key.1, key.2, &m.name));
                }
                continue;
            }
        };
        if let Some(reason) = reason {
            why_not.push(format!("{} {reason}", m.name));
        }
    }
    match best {
        Some((_, _, _, name)) => Ok(name.to_string()),
        None => Err(NoEligibleHost {
            control_plane: request.name.to_string(),
            why_not,
        }),
    }
}

/// Why member `m` cannot host (or run an etcd member of) a control plane whose home is `home`
/// (in `home_zone`), whatever the control plane's other wishes: its home, joining, suspect,
/// lost, diverged, cordoned, or in the home's zone.
fn unfit(m: &Member, home: Option<&str>, home_zone: Option<&str>) -> Option<String> {
    if home == Some(m.name.as_str()) {
        Some("its home".to_string())
    } else if m.role == Role::Joining {
        Some("joining".into())
    } else if m.diverged.is_some() {
        Some("diverged".into())
    } else if matches!(m.health, Health::Suspect | Health::Lost) {
        Some(m.health.to_string())
    } else if m.cordoned {
        Some("cordoned".into())
    } else if home_zone == Some(m.zone.as_str()) {
        Some(format!("in the home zone {}", m.zone))
    } else {
        None
    }
}

/// Why a zone-tolerant control plane's etcd members cannot be chosen.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error(
    "tolerance zone needs an etcd member on {ZONE_TOLERANT_MEMBERS} eligible members in distinct zones; {}{}",
    if zones.is_empty() { "no member is eligible".to_string() } else { format!("eligible members are in {} zone(s): {}", zones.len(), zones.join(", ")) },
    if why_not.is_empty() { String::new() } else { format!("; not eligible: {}", why_not.join(", ")) }
)]
pub struct TooFewZones {
    /// `<zone> (<members>)` for each zone with an eligible member.
    pub zones: Vec<String>,
    /// `<member> <reason>` for each member with an etcd peer address that is not eligible.
    pub why_not: Vec<String>,
}

/// The members of a new zone-tolerant control plane's etcd cluster: its host (`host`, or the
/// one [`choose_host`] picks among the members with an etcd peer address) and one member in
/// each of two other zones, [`ZONE_TOLERANT_MEMBERS`] in all, in distinct zones. Eligible are
/// the members with an etcd peer address that could host it (not its home or in its home's
/// zone, not joining, suspect, lost or cordoned); in each zone the operator's preference wins,
/// then the member hosting the fewest control planes, then the lowest id. Returns the host and
/// the members (the host among them), in the order chosen.
pub fn choose_etcd_members(
    state: &impl Roster,
    spec: &ControlPlaneSpec,
    host: Option<&str>,
) -> Result<(String, Vec<String>), TooFewZones> {
    let home_zone = spec
        .home
        .as_deref()
        .and_then(|home| state.member_by_name(home))
        .map(|m| m.zone.as_str());
    let rank = |m: &Member| {
        spec.prefer
            .iter()
            .position(|p| match p.split_once('=') {
                Some((key, value)) => m.labels.get(key).is_some_and(|v| v == value),
                None => *p == m.name,
            })
            .unwrap_or(usize::MAX)
    };
    let mut why_not = Vec::new();
    // Zone -> eligible members, best first.
    let mut by_zone: BTreeMap<&str, Vec<(usize, usize, u64, &str)>> = BTreeMap::new();
    for m in state.members() {
        if !spec.etcd_peers.contains_key(&m.name) {
            continue;
        }
        match unfit(m, spec.home.as_deref(), home_zone) {
            Some(reason) => why_not.push(format!("{} {reason}", m.name)),
            None => by_zone.entry(&m.zone).or_default().push((
                rank(m),
                state.hosted_count(&m.name),
                m.id,
                &m.name,
            )),
        }
    }
    for members in by_zone.values_mut() {
        members.sort();
    }
    let too_few = |by_zone: &BTreeMap<&str, Vec<(usize, usize, u64, &str)>>,
                   why_not: Vec<String>| TooFewZones {
        zones: by_zone
            .iter()
            .map(|(zone, ms)| {
                format!(
                    "{zone} ({})",
                    ms.iter().map(|m| m.3).collect::<Vec<_>>().join(" ")
                )
            })
            .collect(),
        why_not,
    };
    if by_zone.len() < ZONE_TOLERANT_MEMBERS {
        return Err(too_few(&by_zone, why_not));
    }
    let host = match host {
        Some(h) => h.to_string(),
        None => {
            let request = Request {
                endpoints: &spec.etcd_peers,
                ..Request::new(spec)
            };
            choose_host(state, &request, 0).map_err(|_| too_few(&by_zone, why_not.clone()))?
        }
    };
    let host_zone = state
        .member_by_name(&host)
        .map(|m| m.zone.clone())
        .unwrap_or_default();
    let mut chosen = vec![host.clone()];
    // The best member of each other zone, then the best of those.
    let mut others: Vec<(usize, usize, u64, &str)> = by_zone
        .iter()
        .filter(|(zone, _)| **zone != host_zone)
        .filter_map(|(_, ms)| ms.first().copied())
        .collect();
    others.sort();
    chosen.extend(
        others
            .iter()
            .take(ZONE_TOLERANT_MEMBERS - 1)
            .map(|m| m.3.to_string()),
    );
    if chosen.len() < ZONE_TOLERANT_MEMBERS {
        return Err(too_few(&by_zone, why_not));
    }
    Ok((host, chosen))
}
