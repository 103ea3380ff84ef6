//! The records the ring wants: a pure function of the applied state (DESIGN.md rule 3).
//!
//! - Each control plane's DNS name points at its host's endpoint (A or AAAA for an address,
//!   CNAME for a host name; DNS carries no port), but only while it is `running`: a control
//!   plane that is `fencing` or `starting` at a new epoch has no record until its new host
//!   reports it healthy, and never again the old host's.
//! - With a ring zone, each healthy member's Admin endpoint is `<member>.members.<zone>`.
//!
//! A name that should have no record is listed with [`RecordValue::Delete`] and the reason, so
//! providers remove what they published before and operators see why a name is empty.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use crate::{Health, Phase, RingState};

/// What a name should point to: the value of the A, AAAA or CNAME record the ring wants there.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RecordValue {
    /// One IPv4 address.
    A(Ipv4Addr),
    /// One IPv6 address.
    Aaaa(Ipv6Addr),
    /// An alias for another DNS name.
    Cname(String),
    /// Nothing: the managed records at the name are deleted.
    Delete,
}

/// One record the ring wants to exist (or not).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DesiredRecord {
    /// Owner name, without the trailing dot.
    pub name: String,
    /// TTL, seconds.
    pub ttl_s: u32,
    /// The value, or [`RecordValue::Delete`] for "no record".
    pub value: RecordValue,
    /// Where it comes from, in words.
    pub why: String,
}

/// The value for an endpoint `host:port` (`[v6]:port` for IPv6): an address record, or a CNAME
/// to the host name.
pub fn endpoint_value(endpoint: &str) -> RecordValue {
    let host = match endpoint.rsplit_once(':') {
        Some((host, _port)) => host,
        None => endpoint,
    };
    let host = host.trim_start_matches('[').trim_end_matches(']');
    match host.parse::<IpAddr>() {
        Ok(IpAddr::V4(v4)) => RecordValue::A(v4),
        Ok(IpAddr::V6(v6)) => RecordValue::Aaaa(v6),
        Err(_) => RecordValue::Cname(host.trim_end_matches('.').to_string()),
    }
}

/// The records the ring wants, sorted by name.
pub fn desired_records(state: &RingState, ttl_s: u32) -> Vec<DesiredRecord> {
    records(state, ttl_s, true)
}

/// [`desired_records`] without the words: every `why` is empty. For the builtin server, which
/// only needs the values and rebuilds them whenever the applied index moves.
pub fn desired_values(state: &RingState, ttl_s: u32) -> Vec<DesiredRecord> {
    records(state, ttl_s, false)
}

fn records(state: &RingState, ttl_s: u32, explain: bool) -> Vec<DesiredRecord> {
    let mut out = Vec::new();
    for cp in state.control_planes.values() {
        let endpoint = cp.host.as_ref().and_then(|h| cp.endpoints.get(h));
        let (value, why) = match (cp.phase, &cp.host, endpoint) {
            (Phase::Running, Some(host), Some(endpoint)) => (
                endpoint_value(endpoint),
                if explain {
                    format!("{} on {host} at epoch {}", cp.name, cp.epoch)
                } else {
                    String::new()
                },
            ),
            (phase, host, _) => (
                RecordValue::Delete,
                if explain {
                    format!(
                        "{} is {phase}{} at epoch {}: no record until its host reports it serving",
                        cp.name,
                        host.as_ref()
                            .map(|h| format!(" on {h}"))
                            .unwrap_or_default(),
                        cp.epoch
                    )
                } else {
                    String::new()
                },
            ),
        };
        out.push(DesiredRecord {
            name: cp.dns_name.clone(),
            ttl_s,
            value,
            why,
        });
    }
    if let Some(zone) = &state.settings.dns_zone {
        for m in state.members.values() {
            let (value, why) = if m.health == Health::Healthy {
                (
                    endpoint_value(&m.admin_address),
                    format!("admin endpoint of member {}", m.name),
                )
            } else {
                (
                    RecordValue::Delete,
                    format!("member {} is {}", m.name, m.health),
                )
            };
            out.push(DesiredRecord {
                name: format!("{}.members.{zone}", m.name),
                ttl_s,
                value,
                why,
            });
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    out
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeSet;
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;
    use crate::{Command, ControlPlaneSpec, MemberSpec, MoveKind, Proposal};

    fn apply(state: &mut RingState, index: u64, command: Command) {
        state
            .apply(
                index,
                &Proposal {
                    command,
                    at_ms: 1,
                    actor: "test".into(),
                    reason: String::new(),
                },
            )
            .unwrap();
    }

    fn ring() -> RingState {
        let mut state = RingState::default();
        let members = ["a", "b", "c"]
            .iter()
            .enumerate()
            .map(|(i, n)| MemberSpec {
                id: i as u64 + 1,
                name: n.to_string(),
                zone: format!("zone-{n}"),
                address: format!("10.0.0.{}:7401", i + 1),
                admin_address: format!("10.0.0.{}:7400", i + 1),
            })
            .collect();
        apply(
            &mut state,
            1,
            Command::Bootstrap {
                members,
                dns_zone: Some("ring.example".into()),
            },
        );
        state.apply_membership(&(1..=3).collect(), &BTreeSet::new());
        for id in 1..=3 {
            apply(
                &mut state,
                1 + id,
                Command::SetHealth {
                    id,
                    health: Health::Healthy,
                },
            );
        }
        apply(
            &mut state,
            5,
            Command::AddControlPlane(ControlPlaneSpec {
                name: "x".into(),
                home: None,
                dns_name: "api.x.ring.example".into(),
                endpoints: [
                    ("a".to_string(), "10.1.0.1:443".to_string()),
                    ("b".to_string(), "[2001:db8::2]:443".to_string()),
                    ("c".to_string(), "x.c.example.net:443".to_string()),
                ]
                .into(),
                backup: "s3://backups/x".into(),
                backups: Default::default(),
                host: Some("a".into()),
                prefer: Vec::new(),
                tolerance: Default::default(),
                etcd_peers: Default::default(),
            }),
        );
        state
    }

    fn record<'a>(records: &'a [DesiredRecord], name: &str) -> &'a DesiredRecord {
        records.iter().find(|r| r.name == name).unwrap()
    }

    #[test]
    fn a_record_appears_only_once_the_host_serves() {
        let mut state = ring();
        let r = desired_records(&state, 5);
        assert_eq!(record(&r, "api.x.ring.example").value, RecordValue::Delete);
        apply(
            &mut state,
            6,
            Command::ReportServing {
                name: "x".into(),
                epoch: 1,
                member: "a".into(),
            },
        );
        let r = desired_records(&state, 5);
        let x = record(&r, "api.x.ring.example");
        assert_eq!(x.value, RecordValue::A(Ipv4Addr::new(10, 1, 0, 1)));
        assert_eq!(x.ttl_s, 5);
        // A switchover: no record while fencing and starting; then the new host's address.
        apply(
            &mut state,
            7,
            Command::MoveControlPlane {
                name: "x".into(),
                to: Some("b".into()),
                epoch: 2,
                kind: MoveKind::Switchover,
                note: String::new(),
            },
        );
        let r = desired_records(&state, 5);
        let x = record(&r, "api.x.ring.example");
        assert_eq!(
            x.value,
            RecordValue::Delete,
            "never the old host: {}",
            x.why
        );
        for (index, command) in [
            Command::ReleaseFence {
                name: "x".into(),
                epoch: 2,
                member: "a".into(),
            },
            Command::ReportServing {
                name: "x".into(),
                epoch: 2,
                member: "b".into(),
            },
        ]
        .into_iter()
        .enumerate()
        {
            apply(&mut state, 8 + index as u64, command);
        }
        let r = desired_records(&state, 5);
        assert_eq!(
            record(&r, "api.x.ring.example").value,
            RecordValue::Aaaa("2001:db8::2".parse::<Ipv6Addr>().unwrap())
        );
    }

    #[test]
    fn host_names_become_cnames_and_healthy_members_are_listed() {
        assert_eq!(
            endpoint_value("x.c.example.net.:443"),
            RecordValue::Cname("x.c.example.net".into())
        );
        let mut state = ring();
        apply(
            &mut state,
            6,
            Command::SetHealth {
                id: 2,
                health: Health::Lost,
            },
        );
        let r = desired_records(&state, 30);
        assert_eq!(
            record(&r, "a.members.ring.example").value,
            RecordValue::A(Ipv4Addr::new(10, 0, 0, 1))
        );
        assert_eq!(
            record(&r, "b.members.ring.example").value,
            RecordValue::Delete
        );
        let names: Vec<&str> = r.iter().map(|r| r.name.as_str()).collect();
        let mut sorted = names.clone();
        sorted.sort();
        assert_eq!(names, sorted);
    }
}
