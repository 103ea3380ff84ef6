//! The control planes of a ring: what the ring records about each ([`ControlPlane`]), its life
//! cycle ([`Phase`]) and why it last moved ([`MoveKind`]).

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;

use serde::{Deserialize, Serialize};

use super::backup_report::BackupReport;
use super::etcd_cluster::{EtcdCluster, Tolerance};
use super::migration::{Migration, MigrationStep};
use super::vec_map::VecMap;

/// Where a control plane is in its life. Only in `Starting` and `Running` may its host serve it
/// (hold a lease on it); see [`RingState::grants`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub enum Phase {
    /// No host: no member was eligible (the reason is recorded).
    #[serde(alias = "Pending")]
    Unplaced,
    /// Assigned to its new host, which must not start it yet: a former host may still hold a
    /// lease on it (see [`ControlPlane::fencing`]).
    Fencing,
    /// Its host may start it; it has not reported serving yet.
    Starting,
    /// Its host reported serving it at the current epoch.
    Running,
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Phase::Unplaced => "unplaced",
            Phase::Fencing => "fencing",
            Phase::Starting => "starting",
            Phase::Running => "running",
        })
    }
}

/// Why a control plane moved.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MoveKind {
    /// Placed for the first time, or again after it was unplaced.
    Placement,
    /// Its host was lost (automatic).
    Failover,
    /// Planned by the operator: the old host stops first.
    Switchover,
    /// Planned: its host is being drained.
    Drain,
    /// Forced by the operator (`ringctl failover`).
    Forced,
}

impl fmt::Display for MoveKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            MoveKind::Placement => "placement",
            MoveKind::Failover => "failover",
            MoveKind::Switchover => "switchover",
            MoveKind::Drain => "drain",
            MoveKind::Forced => "forced failover",
        })
    }
}

/// A registered control plane.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct ControlPlane {
    /// Unique name.
    pub name: String,
    /// Member it belongs to and must never be hosted on.
    pub home: Option<String>,
    /// DNS name clients use.
    pub dns_name: String,
    /// Member name -> endpoint when hosted there.
    pub endpoints: VecMap<String, String>,
    /// Backup location URL.
    pub backup: String,
    /// Member hosting it.
    pub host: Option<String>,
    /// Fencing token; bumped on every change of host.
    pub epoch: u64,
    /// Life-cycle phase.
    pub phase: Phase,
    /// Former hosts that may still hold a lease on it. The current host may start it only once
    /// this is empty: each former host released it (reported it stopped after the move), its
    /// lease ran out on the leader's clock, or it was judged lost.
    #[serde(default)]
    pub fencing: BTreeSet<String>,
    /// Why it is unplaced (empty otherwise).
    #[serde(default)]
    pub unplaced_reason: String,
    /// When it last moved (the proposal's time, Unix ms; 0 if never): automatic moves keep a
    /// minimum interval (anti-flapping).
    #[serde(default)]
    pub moved_at_ms: u64,
    /// Members preferred as hosts, most preferred first.
    #[serde(default)]
    pub prefer: Vec<String>,
    /// Member name -> backup location when hosted there; others use `backup`.
    #[serde(default)]
    pub backups: BTreeMap<String, String>,
    /// The migration of its data to its current host, from the last move that gave it a host.
    #[serde(default)]
    pub migration: Option<Migration>,
    /// Labels the operator gave it (`ringctl cp label`); nothing in the ring acts on them.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub labels: BTreeMap<String, String>,
    /// The host's last committed report on its backups at the current epoch (only while
    /// `running`; cleared by every move). Named apart from `backup`, the location URL.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub backup_status: Option<BackupReport>,
    /// What failure its etcd survives (see [`crate::etcd_cluster`]).
    #[serde(default, skip_serializing_if = "is_default")]
    pub tolerance: Tolerance,
    /// Member name -> `host:port` of its etcd member there, for the members that may run one
    /// (zone tolerance only; from `ControlPlaneSpec::etcd_peers`).
    #[serde(default, skip_serializing_if = "VecMap::is_empty")]
    pub etcd_peers: VecMap<String, String>,
    /// Its etcd cluster (zone tolerance only): `None` until it is placed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etcd: Option<EtcdCluster>,
    /// What its host reports wrong with it at the current epoch (its etcd keeps exiting, say),
    /// committed when it appears, changes or clears ([`crate::Command::ReportProblem`]); only
    /// while hosted, cleared by every move.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problem: Option<HostProblem>,
}

/// What a host reports wrong with a control plane it hosts: the control plane is down or
/// failing there although the host itself is in contact (so no failover happens by itself).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HostProblem {
    /// The host's words (at most [`crate::limits::MAX_TEXT_LEN`] bytes).
    pub text: String,
    /// When it was first committed, on the proposer's clock (Unix ms); kept while only the
    /// words change.
    pub since_ms: u64,
}

fn is_default<T: Default + PartialEq>(value: &T) -> bool {
    *value == T::default()
}

impl ControlPlane {
    /// Once no former host fences it any more, the host may start it: phase `starting`, and its
    /// migration moves to `handover`.
    pub(crate) fn end_fencing_if_done(&mut self) {
        if self.fencing.is_empty() && self.phase == Phase::Fencing {
            self.phase = Phase::Starting;
            let epoch = self.epoch;
            if let Some(m) = self.migration.as_mut().filter(|m| m.epoch == epoch) {
                m.step = MigrationStep::Handover;
            }
        }
    }

    /// Where `member` writes this control plane's backups when it hosts it.
    pub fn backup_for(&self, member: &str) -> &str {
        self.backups.get(member).unwrap_or(&self.backup)
    }
}
