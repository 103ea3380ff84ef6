//! A small ring for the core's unit tests: members a..d (d shares c's zone), all voters and
//! healthy, commands applied in order at increasing times, and the controller run on it.
//! Only compiled for tests.

use std::collections::BTreeSet;

use crate::command::{Command, ControlPlaneSpec, MemberSpec, Proposal};
use crate::control_plane::{ControlPlane, MoveKind};
use crate::controller::{Decision, Observations, Policy, decide, plan_moves};
use crate::member::Health;
use crate::state::RingState;

pub(crate) fn spec(id: u64, name: &str, zone: &str) -> MemberSpec {
    MemberSpec {
        id,
        name: name.into(),
        zone: zone.into(),
        address: format!("127.0.0.1:{}", 7000 + id * 10 + 1),
        admin_address: format!("127.0.0.1:{}", 7000 + id * 10),
    }
}

pub(crate) fn policy() -> Policy {
    Policy {
        lease_ms: 1_000,
        fence_ms: 200,
        margin_ms: 100,
        min_move_interval_ms: 5_000,
        capacity: 0,
        etcd_replace_after_ms: 60_000,
    }
}

pub(crate) struct Ring {
    pub(crate) state: RingState,
    pub(crate) index: u64,
}

impl Ring {
    /// Members a..d in zones za, zb, zc, zc (d shares c's zone), all voters and healthy.
    pub(crate) fn new() -> Self {
        let mut ring = Ring {
            state: RingState::default(),
            index: 0,
        };
        ring.apply(Command::Bootstrap {
            members: vec![
                spec(1, "a", "za"),
                spec(2, "b", "zb"),
                spec(3, "c", "zc"),
                spec(4, "d", "zc"),
            ],
            dns_zone: None,
        })
        .unwrap();
        for id in 1..=4 {
            ring.apply(Command::SetHealth {
                id,
                health: Health::Healthy,
            })
            .unwrap();
        }
        ring.state
            .apply_membership(&(1..=4).collect(), &BTreeSet::new());
        ring
    }

    pub(crate) fn apply(&mut self, command: Command) -> Result<(), crate::CommandError> {
        self.index += 1;
        self.state.apply(
            self.index,
            &Proposal {
                command,
                at_ms: 1_000_000 + self.index,
                actor: "test".into(),
                reason: String::new(),
            },
        )
    }

    pub(crate) fn add(&mut self, name: &str, home: Option<&str>, host: &str) {
        self.apply(Command::AddControlPlane(ControlPlaneSpec {
            name: name.into(),
            home: home.map(str::to_string),
            dns_name: format!("{name}.ring.example"),
            endpoints: ["a", "b", "c", "d"]
                .iter()
                .map(|m| (m.to_string(), format!("{m}.example:443")))
                .collect(),
            backup: format!("s3://backups/{name}"),
            backups: Default::default(),
            host: Some(host.into()),
            prefer: Vec::new(),
            tolerance: Default::default(),
            etcd_peers: Default::default(),
        }))
        .unwrap();
    }

    /// A zone-tolerant control plane `name` with endpoints and etcd peer addresses on a..d,
    /// hosted on `host` (or where placement puts it).
    pub(crate) fn add_zone_tolerant(
        &mut self,
        name: &str,
        host: Option<&str>,
    ) -> Result<(), crate::CommandError> {
        self.apply(Command::AddControlPlane(zone_tolerant_spec(name, host)))
    }

    pub(crate) fn run(&mut self, obs: &mut Observations) -> Vec<Decision> {
        obs.observe(&self.state);
        let decisions = decide(&self.state, obs, &policy());
        for d in &decisions {
            self.apply(d.command.clone()).unwrap();
        }
        decisions
    }

    /// Plans and applies a switchover of `name` to `to` (the operator's `ringctl switchover`).
    pub(crate) fn switchover(&mut self, name: &str, to: &str, seed: u64) {
        let plan = plan_moves(
            &self.state,
            &[name.into()],
            Some(to),
            MoveKind::Switchover,
            &policy(),
            seed,
        )
        .unwrap();
        for c in plan {
            self.apply(c).unwrap();
        }
    }

    pub(crate) fn cp(&self, name: &str) -> &ControlPlane {
        &self.state.control_planes[name]
    }

    pub(crate) fn lose(&mut self, id: u64) {
        self.apply(Command::SetHealth {
            id,
            health: Health::Lost,
        })
        .unwrap();
    }
}

/// The spec of a zone-tolerant control plane with endpoints and etcd peers on a..d.
pub(crate) fn zone_tolerant_spec(name: &str, host: Option<&str>) -> ControlPlaneSpec {
    ControlPlaneSpec {
        name: name.into(),
        home: None,
        dns_name: format!("{name}.ring.example"),
        endpoints: ["a", "b", "c", "d"]
            .iter()
            .map(|m| (m.to_string(), format!("{m}.example:443")))
            .collect(),
        backup: format!("s3://backups/{name}"),
        backups: Default::default(),
        host: host.map(str::to_string),
        prefer: Vec::new(),
        tolerance: crate::etcd_cluster::Tolerance::Zone,
        etcd_peers: ["a", "b", "c", "d"]
            .iter()
            .map(|m| (m.to_string(), format!("{m}.example:2380")))
            .collect(),
    }
}
