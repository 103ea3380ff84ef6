//! Zone-tolerant control planes: a control plane whose etcd is a cluster of
//! [`ZONE_TOLERANT_MEMBERS`] members, one on each of that many ring members in distinct zones.
//!
//! A control plane with [`Tolerance::None`] (the default) has one etcd, on its host, and comes
//! back elsewhere through its backups. One with [`Tolerance::Zone`] has an [`EtcdCluster`]: each
//! of its members runs one etcd member (a *replica*) for as long as it belongs to the cluster,
//! whatever the host. The host is one of them: the member whose public endpoint clients reach
//! (through its gate), which the DNS name points at and which takes the backups. Losing a zone
//! then loses one etcd member, never an acknowledged write (etcd acknowledges only what a
//! majority stored); the host moves to a surviving etcd member with no copy and no restore.
//!
//! What the ring says about the cluster is [`EtcdHealth`], judged from the ring's view of its
//! members (`lost` members count as down).

use std::fmt;

use serde::{Deserialize, Serialize};

/// How many etcd members a zone-tolerant control plane has: one per zone, three zones.
pub const ZONE_TOLERANT_MEMBERS: usize = 3;

/// What failure a control plane's etcd survives without losing an acknowledged write.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "lowercase")]
pub enum Tolerance {
    /// One etcd, on the host; a lost host's control plane is restored elsewhere from its
    /// backups (data-loss window: about one delta period).
    #[default]
    None,
    /// One etcd member in each of three zones; a lost zone loses nothing and the host moves to
    /// a surviving member without a restore.
    Zone,
}

impl Tolerance {
    /// Parses `none` or `zone`.
    pub fn parse(text: &str) -> Option<Self> {
        match text {
            "none" => Some(Tolerance::None),
            "zone" => Some(Tolerance::Zone),
            _ => None,
        }
    }
}

impl fmt::Display for Tolerance {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Tolerance::None => "none",
            Tolerance::Zone => "zone",
        })
    }
}

/// One etcd member of a zone-tolerant control plane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EtcdMember {
    /// The ring member that runs it; also its etcd member name.
    pub member: String,
    /// `host:port` it listens on for its etcd peers.
    pub peer: String,
    /// The cluster generation at which it joined ([`EtcdCluster::generation`]). Its data
    /// directory is named after it, so a member removed and later added again starts from
    /// nothing instead of from data the cluster no longer knows. Generation 1 formed the
    /// cluster (`--initial-cluster-state new`); later ones join it (`existing`).
    pub joined: u64,
    /// Added as a learner and not promoted yet: it receives the log but does not vote, and
    /// does not host.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub learner: bool,
    /// Starts with `--force-new-cluster` (an operator's recovery from this member's data):
    /// set by [`Command::RecoverEtcdCluster`](crate::Command::RecoverEtcdCluster), cleared when
    /// the cluster grows again.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub force_new_cluster: bool,
    /// Goes up when its etcd process must start again on the same data (a recovery).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub incarnation: u64,
    /// Restore its data from the newest backups at this location (URL) before etcd first
    /// starts on it (an operator's recovery from backup); cleared with `force_new_cluster`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_from: Option<String>,
    /// etcd's id of it (what `etcdctl member list` shows, in hex), as the host reported it
    /// ([`Command::RecordEtcdIds`](crate::Command::RecordEtcdIds)); 0 until then. Fixed for
    /// its life: a member added again later is another etcd member with another id.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub etcd_id: u64,
}

fn is_zero(value: &u64) -> bool {
    *value == 0
}

impl EtcdMember {
    /// Which run of it a grant covers: a member runs one etcd process per key; another key
    /// restarts it (another `joined`: on an empty data directory of its own).
    pub fn key(&self) -> ReplicaKey {
        ReplicaKey {
            joined: self.joined,
            incarnation: self.incarnation,
        }
    }
}

/// Which run of an etcd member a lease covers ([`EtcdMember::key`]).
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
pub struct ReplicaKey {
    /// The generation it joined at: names its data directory.
    pub joined: u64,
    /// Its incarnation on that data.
    pub incarnation: u64,
}

impl fmt::Display for ReplicaKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "joined {}, incarnation {}",
            self.joined, self.incarnation
        )
    }
}

/// The step a replacement of an etcd member waits for; the host performs each with etcd's
/// membership API and reports it done, and the leader commits that (so a new leader, or a new
/// host, goes on where the last one stopped; each step is idempotent).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum EtcdChangeStep {
    /// `MemberRemove` of the lost member (done when etcd no longer lists it).
    Removing,
    /// `MemberAdd` of the spare as a learner (done when etcd lists it); only then is the
    /// spare's etcd member started, joining the existing cluster empty.
    Adding,
    /// `MemberPromote` of the learner, which etcd refuses until it caught up with the leader.
    CatchingUp,
    /// An operator's recovery: the member (`added`) restarts with `--force-new-cluster` on its
    /// data; done when etcd lists it alone and it answers a linearizable read. Only then does
    /// the cluster grow again (a member added before would be forced out by a restart).
    Forcing,
}

impl fmt::Display for EtcdChangeStep {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            EtcdChangeStep::Removing => "removing",
            EtcdChangeStep::Adding => "adding",
            EtcdChangeStep::CatchingUp => "catching-up",
            EtcdChangeStep::Forcing => "forcing",
        })
    }
}

/// The one membership change of a cluster in progress: a lost member replaced by a spare.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EtcdChange {
    /// The ring member whose etcd member goes (no longer in [`EtcdCluster::members`]).
    pub removed: String,
    /// Its peer address (`host:port`), by which etcd may list it before it ever started.
    #[serde(default)]
    pub removed_peer: String,
    /// Its etcd id, if the ring knew it ([`EtcdMember::etcd_id`]; 0: unknown).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub removed_etcd_id: u64,
    /// The ring member whose etcd member comes (in the members, a learner until the end); in
    /// a recovery (step `forcing`), the member it restarts from.
    pub added: String,
    /// The step it waits for.
    pub step: EtcdChangeStep,
}

/// The etcd cluster of a zone-tolerant control plane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct EtcdCluster {
    /// etcd's `--initial-cluster-token`: the control plane's name and the epoch it was created
    /// at, so two clusters never take each other's members for their own.
    pub token: String,
    /// Goes up by one with every membership change (1 as created).
    pub generation: u64,
    /// Its members, by ring member name.
    pub members: Vec<EtcdMember>,
    /// The membership change in progress, if any: at most one at a time.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub change: Option<EtcdChange>,
}

impl EtcdCluster {
    /// Whether the ring member `name` runs one of its members.
    pub fn contains(&self, name: &str) -> bool {
        self.members.iter().any(|m| m.member == name)
    }

    /// The member run by `name`.
    pub fn member(&self, name: &str) -> Option<&EtcdMember> {
        self.members.iter().find(|m| m.member == name)
    }

    /// The ring members that run its members.
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.members.iter().map(|m| m.member.as_str())
    }

    /// Of the etcd ids in `ids` (ring member -> id), those of its members whose id the ring has
    /// not recorded yet. A member recorded with another id is left out: etcd ids are for
    /// life, so the ring keeps what it has
    /// ([`CommandError::EtcdIdConflict`](crate::CommandError::EtcdIdConflict)).
    pub fn unrecorded_ids(
        &self,
        ids: &std::collections::BTreeMap<String, u64>,
    ) -> std::collections::BTreeMap<String, u64> {
        ids.iter()
            .filter(|(m, id)| **id != 0 && self.member(m).is_some_and(|k| k.etcd_id == 0))
            .map(|(m, id)| (m.clone(), *id))
            .collect()
    }

    /// Whether `name` runs one of its voting members (only those may host).
    pub fn is_voter(&self, name: &str) -> bool {
        self.member(name).is_some_and(|m| !m.learner)
    }

    /// Whether the etcd member on `name` may run now: every member, except one being added
    /// before etcd has been told about it (`MemberAdd`), which it would refuse.
    pub fn may_run(&self, name: &str) -> bool {
        self.contains(name)
            && !self.change.as_ref().is_some_and(|c| {
                c.added == name
                    && matches!(c.step, EtcdChangeStep::Removing | EtcdChangeStep::Adding)
            })
    }

    /// etcd's `--initial-cluster` value, with `scheme` (`http` or `https`) for the peer URLs.
    pub fn initial_cluster(&self, scheme: &str) -> String {
        self.members
            .iter()
            .map(|m| format!("{}={scheme}://{}", m.member, m.peer))
            .collect::<Vec<_>>()
            .join(",")
    }

    /// How the cluster stands when the members for which `up` says false are down (the ring
    /// counts a member down when its ring member is judged lost or no longer registered:
    /// [`RingState::etcd_health`](crate::RingState::etcd_health)).
    ///
    /// Only voting members count: a learner (being added) neither makes nor breaks a quorum.
    pub fn health(&self, up: impl Fn(&str) -> bool) -> EtcdHealth {
        let voters = self.members.iter().filter(|m| !m.learner);
        let down: Vec<String> = voters
            .clone()
            .filter(|m| !up(&m.member))
            .map(|m| m.member.clone())
            .collect();
        let total = voters.count();
        let up = total - down.len();
        if down.is_empty() {
            EtcdHealth::Whole { total }
        } else if up > total / 2 {
            EtcdHealth::Degraded { up, total, down }
        } else {
            EtcdHealth::NoQuorum { up, total, down }
        }
    }
}

/// How a zone-tolerant control plane's etcd cluster stands.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum EtcdHealth {
    /// Every member is up.
    Whole {
        /// How many members it has.
        total: usize,
    },
    /// A majority is up: it serves, with less to spare.
    Degraded {
        /// Members up.
        up: usize,
        /// Members in all.
        total: usize,
        /// The members down.
        down: Vec<String>,
    },
    /// No majority: etcd accepts no write and no linearizable read. The ring never forces a
    /// new cluster by itself; an operator recovers it.
    NoQuorum {
        /// Members up.
        up: usize,
        /// Members in all.
        total: usize,
        /// The members down.
        down: Vec<String>,
    },
}

impl EtcdHealth {
    /// `whole`, `degraded` or `no-quorum`.
    pub fn word(&self) -> &'static str {
        match self {
            EtcdHealth::Whole { .. } => "whole",
            EtcdHealth::Degraded { .. } => "degraded",
            EtcdHealth::NoQuorum { .. } => "no-quorum",
        }
    }
}

impl fmt::Display for EtcdHealth {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            EtcdHealth::Whole { total } => write!(f, "whole ({total} of {total})"),
            EtcdHealth::Degraded { up, total, down } | EtcdHealth::NoQuorum { up, total, down } => {
                write!(
                    f,
                    "{} ({up} of {total}; down: {})",
                    self.word(),
                    down.join(", ")
                )
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::command::Command;
    use crate::control_plane::Phase;
    use crate::controller::Observations;
    use crate::error::CommandError;
    use crate::testing::{Ring, zone_tolerant_spec};

    fn names(cluster: &EtcdCluster) -> Vec<&str> {
        cluster.names().collect()
    }

    /// The test ring with zone-tolerant control plane x hosted and running on a.
    fn x_running_on_a() -> (Ring, Observations) {
        let mut ring = Ring::new();
        ring.add_zone_tolerant("x", Some("a")).unwrap();
        let mut obs = Observations::default();
        obs.serving.insert(("x".into(), 1, "a".into()));
        ring.run(&mut obs);
        (ring, obs)
    }

    #[test]
    fn a_recovery_from_backup_restores_on_a_new_data_directory_from_where_the_last_host_wrote() {
        let (mut ring, mut obs) = x_running_on_a();
        assert_eq!(ring.cp("x").phase, Phase::Running);
        // a and b lost: the host moves to c, which cannot serve without a quorum.
        ring.lose(1);
        ring.lose(2);
        obs.now_ms = 10_000_000;
        ring.run(&mut obs);
        obs.now_ms += 3_600_000;
        ring.run(&mut obs);
        let cp = ring.cp("x").clone();
        assert_eq!(cp.host.as_deref(), Some("c"), "{cp:?}");
        assert_eq!(ring.state.etcd_health(&cp).unwrap().word(), "no-quorum");
        let source = cp.migration.as_ref().unwrap().source.clone();
        let generation = cp.etcd.as_ref().unwrap().generation;
        let old_key = cp.etcd.as_ref().unwrap().member("c").unwrap().key();
        ring.apply(Command::RecoverEtcdCluster {
            name: "x".into(),
            from: "c".into(),
            generation,
            from_backup: true,
        })
        .unwrap();
        let detail = ring.state.history.newest(1)[0].detail.clone();
        assert!(
            detail.starts_with(&format!(
                "etcd cluster restored on c from the newest backups in {source} at generation {}",
                generation + 1
            )),
            "{detail}"
        );
        let cluster = ring.cp("x").etcd.clone().unwrap();
        assert_eq!(names(&cluster), vec!["c"]);
        let c = cluster.member("c").unwrap();
        // A new data directory and run, restored from where a wrote; not forced.
        assert_eq!(c.restore_from.as_deref(), Some(source.as_str()));
        assert!(!c.force_new_cluster);
        assert_eq!(c.joined, generation + 1);
        assert_ne!(c.key(), old_key);
        assert_eq!(c.etcd_id, 0);
        assert_eq!(
            cluster.change.as_ref().map(|c| c.step),
            Some(EtcdChangeStep::Forcing)
        );
        // Once the host reports it running alone, the restore is done with.
        obs.etcd_changes.insert((
            "x".into(),
            generation + 1,
            "c".into(),
            EtcdChangeStep::Forcing,
        ));
        ring.run(&mut obs);
        let cluster = ring.cp("x").etcd.clone().unwrap();
        assert!(cluster.change.is_none());
        assert_eq!(cluster.member("c").unwrap().restore_from, None);
        assert_eq!(cluster.member("c").unwrap().key(), c.key());
    }

    #[test]
    fn the_hosts_etcd_ids_are_recorded_once_and_a_removed_members_id_goes_with_the_change() {
        let (mut ring, mut obs) = x_running_on_a();
        let ids = |pairs: &[(&str, u64)]| -> std::collections::BTreeMap<String, u64> {
            pairs.iter().map(|(m, id)| (m.to_string(), *id)).collect()
        };
        let all = ids(&[("a", 0xa1), ("b", 0xb2), ("c", 0xc3)]);
        // Only the host's list counts.
        obs.etcd_ids
            .insert(("x".into(), 1, "b".into()), all.clone());
        assert!(ring.run(&mut obs).is_empty());
        obs.etcd_ids
            .insert(("x".into(), 1, "a".into()), all.clone());
        let d = ring.run(&mut obs);
        assert_eq!(d.len(), 1, "{d:?}");
        let recorded: Vec<u64> = ring
            .cp("x")
            .etcd
            .as_ref()
            .unwrap()
            .members
            .iter()
            .map(|m| m.etcd_id)
            .collect();
        assert_eq!(recorded, [0xa1, 0xb2, 0xc3]);
        // Recorded: the reports are forgotten and nothing more is decided.
        assert!(ring.run(&mut obs).is_empty());
        assert!(obs.etcd_ids.is_empty(), "{:?}", obs.etcd_ids);
        // Ids are for life: another one for c is refused, and the recorded one kept.
        let record = |member: &str, generation, ids| Command::RecordEtcdIds {
            name: "x".into(),
            generation,
            member: member.into(),
            ids,
        };
        let err = ring.apply(record("a", 1, ids(&[("c", 0xdd)]))).unwrap_err();
        assert_eq!(
            err.to_string(),
            "control plane x's etcd member on c is recorded with id c3, reported as dd: the ring keeps the recorded one"
        );
        let err = ring.apply(record("b", 1, ids(&[("c", 0xc3)]))).unwrap_err();
        assert!(
            matches!(err, CommandError::UnexpectedEtcdChangeReport { .. }),
            "{err}"
        );
        let err = ring.apply(record("a", 1, ids(&[("d", 0xd4)]))).unwrap_err();
        assert!(matches!(err, CommandError::NotAnEtcdMember { .. }), "{err}");
        // c lost long enough: its replacement on d carries c's id (etcd removes by id), and
        // d's member has none until the host lists it.
        ring.lose(3);
        obs.now_ms = 1_000;
        assert!(ring.run(&mut obs).is_empty());
        obs.now_ms += crate::testing::policy().etcd_replace_after_ms;
        let d = ring.run(&mut obs);
        assert_eq!(d.len(), 1, "{d:?}");
        let cluster = ring.cp("x").etcd.clone().unwrap();
        let change = cluster.change.clone().unwrap();
        assert_eq!(
            (change.removed.as_str(), change.removed_etcd_id),
            ("c", 0xc3)
        );
        assert_eq!(cluster.member("d").unwrap().etcd_id, 0);
        // A list taken at the old generation is stale.
        obs.etcd_ids
            .insert(("x".into(), 1, "a".into()), ids(&[("d", 0xd4)]));
        assert!(
            ring.run(&mut obs)
                .iter()
                .all(|d| !matches!(d.command, Command::RecordEtcdIds { .. }))
        );
        let err = ring.apply(record("a", 1, ids(&[("d", 0xd4)]))).unwrap_err();
        assert!(
            matches!(err, CommandError::StaleEtcdGeneration { .. }),
            "{err}"
        );
    }

    #[test]
    fn a_zone_tolerant_control_plane_gets_one_etcd_member_per_zone_with_its_host_among_them() {
        let mut ring = Ring::new();
        ring.add_zone_tolerant("x", Some("d")).unwrap();
        let cp = ring.cp("x");
        let cluster = cp.etcd.as_ref().unwrap();
        // d is in zc with c: c is never chosen with it.
        assert_eq!(names(cluster), vec!["d", "a", "b"]);
        assert_eq!(cp.host.as_deref(), Some("d"));
        assert_eq!(cluster.members[0].peer, "d.example:2380");
        assert_eq!(cluster.generation, 1);
        assert!(cluster.token.starts_with("x-"), "{}", cluster.token);
        // Every etcd member runs its replica; the grants (the gate) only on the host.
        assert_eq!(
            ring.state.replica_grants("a"),
            [(
                "x".to_string(),
                ReplicaKey {
                    joined: 1,
                    incarnation: 0
                }
            )]
            .into()
        );
        assert!(ring.state.replica_grants("c").is_empty());
        assert_eq!(ring.state.grants("d"), [("x".to_string(), 1)].into());
        assert!(ring.state.grants("a").is_empty());
        // Placement chooses the host among the members with a peer address.
        ring.add_zone_tolerant("y", None).unwrap();
        let y = ring.cp("y");
        let cluster = y.etcd.as_ref().unwrap();
        assert!(cluster.contains(y.host.as_deref().unwrap()));
        let zones: std::collections::BTreeSet<&str> = cluster
            .names()
            .map(|n| ring.state.member_by_name(n).unwrap().zone.as_str())
            .collect();
        assert_eq!(zones.len(), 3, "{cluster:?}");
    }

    #[test]
    fn fewer_than_three_eligible_zones_are_refused_with_the_zones_named() {
        let mut ring = Ring::new();
        ring.lose(2);
        let err = ring.add_zone_tolerant("x", Some("a")).unwrap_err();
        assert!(matches!(err, CommandError::TooFewZones { .. }), "{err}");
        let text = err.to_string();
        assert!(
            text.contains("eligible members are in 2 zone(s): za (a), zc (c d)")
                && text.contains("not eligible: b lost"),
            "{text}"
        );
        assert!(!ring.state.control_planes.contains_key("x"));
        // Too few peer addresses: refused before placement.
        let mut spec = zone_tolerant_spec("y", None);
        spec.etcd_peers.remove("a");
        spec.etcd_peers.remove("b");
        let err = ring.apply(Command::AddControlPlane(spec)).unwrap_err();
        assert!(err.to_string().contains("at least 3 members"), "{err}");
        // Peer addresses without zone tolerance: refused.
        let mut spec = zone_tolerant_spec("z", None);
        spec.tolerance = Tolerance::None;
        let err = ring.apply(Command::AddControlPlane(spec)).unwrap_err();
        assert!(err.to_string().contains("only for zone-tolerant"), "{err}");
    }

    #[test]
    fn a_lost_host_moves_to_a_surviving_etcd_member_and_a_lost_replica_moves_nothing() {
        let (mut ring, mut obs) = x_running_on_a();
        assert_eq!(ring.cp("x").phase, Phase::Running);
        let cluster = ring.cp("x").etcd.clone().unwrap();
        assert_eq!(names(&cluster), vec!["a", "b", "c"]);

        // A replica's member is lost: nothing moves, the cluster is degraded.
        ring.lose(3);
        obs.unix_ms = 10_000_000;
        assert!(ring.run(&mut obs).is_empty());
        assert_eq!(
            ring.state.etcd_health(ring.cp("x")).unwrap().to_string(),
            "degraded (2 of 3; down: c)"
        );

        // The host is lost: it moves to b, the one surviving etcd member (d, in c's zone and
        // with no etcd member, is never chosen), at once.
        ring.lose(1);
        obs.unix_ms = 20_000_000;
        ring.run(&mut obs);
        let cp = ring.cp("x");
        assert_eq!(
            (cp.host.as_deref(), cp.epoch, cp.phase),
            (Some("b"), 2, Phase::Starting)
        );
        assert_eq!(
            ring.state.etcd_health(ring.cp("x")).unwrap().to_string(),
            "no-quorum (1 of 3; down: a, c)"
        );
    }

    #[test]
    fn a_member_lost_long_enough_is_replaced_on_a_spare_step_by_step() {
        let (mut ring, mut obs) = x_running_on_a();
        // c (zone zc) is lost; d is in zc too, which the others (za, zb) do not use.
        ring.lose(3);
        obs.now_ms = 1_000;
        assert!(
            ring.run(&mut obs).is_empty(),
            "not before etcd_replace_after_ms"
        );
        obs.now_ms = 1_000 + 59_999;
        assert!(
            ring.run(&mut obs).is_empty(),
            "not before etcd_replace_after_ms"
        );
        obs.now_ms = 1_000 + 60_000;
        let d = ring.run(&mut obs);
        assert_eq!(d.len(), 1, "{d:?}");
        let cluster = ring.cp("x").etcd.clone().unwrap();
        assert_eq!(names(&cluster), vec!["a", "b", "d"]);
        assert_eq!(cluster.generation, 2);
        let added = cluster.member("d").unwrap();
        assert!(added.learner && added.joined == 2, "{added:?}");
        // Its etcd member starts only once etcd was told about it.
        assert!(ring.state.replica_grants("d").is_empty());
        assert!(ring.state.replica_grants("c").is_empty());
        // One change at a time, nothing without the host's report.
        assert!(ring.run(&mut obs).is_empty());
        let err = ring
            .apply(Command::ReplaceEtcdMember {
                name: "x".into(),
                remove: Some("b".into()),
                add: "c".into(),
                generation: 2,
            })
            .unwrap_err();
        assert!(
            matches!(err, CommandError::EtcdChangeInProgress { .. }),
            "{err}"
        );
        // A report from another member than the host is refused.
        let err = ring
            .apply(Command::ReportEtcdChange {
                name: "x".into(),
                generation: 2,
                member: "b".into(),
                done: EtcdChangeStep::Removing,
            })
            .unwrap_err();
        assert!(
            matches!(err, CommandError::UnexpectedEtcdChangeReport { .. }),
            "{err}"
        );
        for (step, then) in [
            (EtcdChangeStep::Removing, Some(EtcdChangeStep::Adding)),
            (EtcdChangeStep::Adding, Some(EtcdChangeStep::CatchingUp)),
            (EtcdChangeStep::CatchingUp, None),
        ] {
            obs.etcd_changes.insert(("x".into(), 2, "a".into(), step));
            assert_eq!(ring.run(&mut obs).len(), 1);
            let cluster = ring.cp("x").etcd.clone().unwrap();
            assert_eq!(cluster.change.as_ref().map(|c| c.step), then);
            if then == Some(EtcdChangeStep::CatchingUp) {
                assert_eq!(
                    ring.state.replica_grants("d"),
                    [(
                        "x".to_string(),
                        ReplicaKey {
                            joined: 2,
                            incarnation: 0
                        }
                    )]
                    .into()
                );
                // A learner does not host.
                let err = ring
                    .apply(Command::MoveControlPlane {
                        name: "x".into(),
                        to: Some("d".into()),
                        epoch: 2,
                        kind: crate::control_plane::MoveKind::Switchover,
                        note: String::new(),
                    })
                    .unwrap_err();
                assert!(matches!(err, CommandError::NotAnEtcdMember { .. }), "{err}");
            }
        }
        let cluster = ring.cp("x").etcd.clone().unwrap();
        assert!(!cluster.member("d").unwrap().learner);
        assert_eq!(
            ring.state.etcd_health(ring.cp("x")).unwrap().to_string(),
            "whole (3 of 3)"
        );
        // c, back, is no longer a member: it runs nothing of x.
        assert!(ring.state.replica_grants("c").is_empty());
        assert!(ring.run(&mut obs).is_empty());
    }

    #[test]
    fn a_lost_member_without_a_spare_in_a_free_zone_is_not_replaced() {
        let mut ring = Ring::new();
        // d (zc), a, b: c is in zc with d, so it cannot replace a or b.
        ring.add_zone_tolerant("x", Some("d")).unwrap();
        ring.lose(1);
        let mut obs = Observations::default();
        ring.run(&mut obs);
        obs.now_ms = 1_000_000;
        assert!(ring.run(&mut obs).is_empty());
        let err = ring
            .apply(Command::ReplaceEtcdMember {
                name: "x".into(),
                remove: Some("a".into()),
                add: "c".into(),
                generation: 1,
            })
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "c cannot replace an etcd member of x: its zone zc has d's etcd member already"
        );
    }

    #[test]
    fn an_operator_recovers_a_cluster_without_quorum_from_its_host_and_it_grows_back() {
        let (mut ring, mut obs) = x_running_on_a();
        let recover = |from: &str, generation| Command::RecoverEtcdCluster {
            name: "x".into(),
            from: from.into(),
            generation,
            from_backup: false,
        };
        // With a quorum there is nothing to recover.
        ring.lose(2);
        let err = ring.apply(recover("a", 1)).unwrap_err();
        assert_eq!(
            err.to_string(),
            "cannot recover the etcd cluster of x: its etcd cluster is degraded (2 of 3; down: b): it has a quorum, nothing to recover"
        );
        // The ring never forces anything by itself.
        ring.lose(3);
        obs.now_ms = 10_000_000;
        obs.unix_ms = 10_000_000;
        let decided = ring.run(&mut obs);
        assert!(decided.is_empty(), "{decided:?}");
        assert_eq!(
            ring.state.etcd_health(ring.cp("x")).unwrap().word(),
            "no-quorum"
        );
        // Not even a replacement of the lost members long after etcd_replace_after_ms, though
        // d is a spare for c: etcd cannot remove a member without a quorum.
        obs.now_ms += 3_600_000;
        let decided = ring.run(&mut obs);
        assert!(decided.is_empty(), "{decided:?}");
        let err = ring.apply(recover("b", 1)).unwrap_err();
        assert!(matches!(err, CommandError::RecoveryRefused { .. }), "{err}");
        ring.apply(recover("a", 1)).unwrap();
        let cluster = ring.cp("x").etcd.clone().unwrap();
        assert_eq!(names(&cluster), vec!["a"]);
        let a = cluster.member("a").unwrap();
        assert!(
            a.force_new_cluster && a.incarnation == 2 && a.joined == 1,
            "{a:?}"
        );
        // Same data directory (joined 1), a new run of it.
        assert_eq!(
            ring.state.replica_grants("a"),
            [(
                "x".to_string(),
                ReplicaKey {
                    joined: 1,
                    incarnation: 2
                }
            )]
            .into()
        );
        // Nothing grows before the host reports the forced cluster running.
        assert_eq!(
            cluster.change.as_ref().map(|c| c.step),
            Some(EtcdChangeStep::Forcing)
        );
        assert!(ring.run(&mut obs).is_empty());
        obs.etcd_changes
            .insert(("x".into(), 2, "a".into(), EtcdChangeStep::Forcing));
        assert_eq!(ring.run(&mut obs).len(), 1);
        let cluster = ring.cp("x").etcd.clone().unwrap();
        assert!(!cluster.member("a").unwrap().force_new_cluster && cluster.change.is_none());
        // It grows back on the spare, d (zc, healthy).
        let d = ring.run(&mut obs);
        assert_eq!(d.len(), 1, "{d:?}");
        let cluster = ring.cp("x").etcd.clone().unwrap();
        assert_eq!(names(&cluster), vec!["a", "d"]);
        assert_eq!(
            cluster.change.as_ref().map(|c| c.step),
            Some(EtcdChangeStep::Adding)
        );
    }

    #[test]
    fn only_etcd_members_may_host_and_members_running_one_are_not_removed() {
        let mut ring = Ring::new();
        ring.add_zone_tolerant("x", Some("a")).unwrap();
        let err = ring
            .apply(Command::MoveControlPlane {
                name: "x".into(),
                to: Some("d".into()),
                epoch: 2,
                kind: crate::control_plane::MoveKind::Switchover,
                note: String::new(),
            })
            .unwrap_err();
        assert_eq!(
            err.to_string(),
            "control plane x is zone-tolerant: only its etcd members (a, b, c) may host it, not d"
        );
        // A switchover to an etcd member moves only the host.
        ring.switchover("x", "c", 1);
        assert_eq!(ring.cp("x").host.as_deref(), Some("c"));
        assert_eq!(
            ring.cp("x").etcd.as_ref().map(names),
            Some(vec!["a", "b", "c"])
        );
        let err = ring.apply(Command::RemoveMember { id: 2 }).unwrap_err();
        assert!(matches!(err, CommandError::RunsEtcdMembers { .. }), "{err}");
        ring.apply(Command::RemoveMember { id: 4 }).unwrap();
    }

    #[test]
    fn tolerance_parses_and_prints_its_words() {
        for t in [Tolerance::None, Tolerance::Zone] {
            assert_eq!(Tolerance::parse(&t.to_string()), Some(t));
        }
        assert_eq!(Tolerance::parse("region"), None);
        assert_eq!(Tolerance::default(), Tolerance::None);
    }

    #[test]
    fn initial_cluster_names_every_member_with_its_peer_url() {
        let cluster = EtcdCluster {
            token: "cp-1".into(),
            generation: 1,
            members: vec![
                EtcdMember {
                    member: "a".into(),
                    peer: "10.0.0.1:2380".into(),
                    joined: 1,
                    learner: false,
                    force_new_cluster: false,
                    incarnation: 0,
                    etcd_id: 0,
                    restore_from: None,
                },
                EtcdMember {
                    member: "b".into(),
                    peer: "10.0.0.2:2380".into(),
                    joined: 1,
                    learner: false,
                    force_new_cluster: false,
                    incarnation: 0,
                    etcd_id: 0,
                    restore_from: None,
                },
            ],
            change: None,
        };
        assert_eq!(
            cluster.initial_cluster("https"),
            "a=https://10.0.0.1:2380,b=https://10.0.0.2:2380"
        );
        assert!(cluster.contains("b") && !cluster.contains("c"));
    }
}
