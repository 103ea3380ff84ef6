//! What every driver shares about one workload: the control plane it runs ([`Target`], built
//! from the applied state), the `ring-guard` process that stops it at the lease deadline
//! whatever `ringd` does ([`Guard`]), and why a driver action failed ([`DriverError`]).

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncBufReadExt, AsyncWriteExt, BufReader};
use tokio::process::{Child, ChildStdin, Command};
use tracing::Instrument as _;

use crate::core::RingState;
use crate::core::etcd_cluster::{EtcdChangeStep, EtcdCluster, ReplicaKey};

/// Why a driver action failed.
#[derive(Debug, thiserror::Error)]
pub enum DriverError {
    /// A command could not be started.
    #[error("cannot run {command}: {why}")]
    Spawn {
        /// The command.
        command: String,
        /// Why.
        why: String,
    },
    /// An instance of the control plane at another epoch is still stopping.
    #[error(
        "control plane {name} at epoch {epoch} is still stopping here; starting again once it stopped"
    )]
    Busy {
        /// The control plane.
        name: String,
        /// The epoch of the instance still stopping.
        epoch: u64,
    },
    /// A zone-tolerant control plane's host has no etcd member of it running yet.
    #[error("this member's etcd member of {name} does not run yet; starting once it does")]
    NoReplica {
        /// The control plane.
        name: String,
    },
    /// The control plane's etcd failed here a moment ago; it starts again after a pause that
    /// doubles with every failure in a row (a crash loop must not hammer the disk or the
    /// object store).
    #[error(
        "etcd of {name} at epoch {epoch} failed here {failures} time(s) in a row; starting again in {retry_in_ms} ms"
    )]
    BackingOff {
        /// The control plane.
        name: String,
        /// The epoch.
        epoch: u64,
        /// Failures in a row.
        failures: u32,
        /// How long until the next start, in ms.
        retry_in_ms: u64,
    },
    /// A hook failed or timed out.
    #[error("hook {action} for {name} at epoch {epoch}: {why}")]
    Hook {
        /// `start` or `stop`.
        action: &'static str,
        /// The control plane.
        name: String,
        /// The epoch.
        epoch: u64,
        /// Why, with the captured output.
        why: String,
    },
}

/// What a driver needs to know about a control plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The control plane.
    pub name: String,
    /// The epoch to run it at.
    pub epoch: u64,
    /// This member's endpoint for it.
    pub endpoint: String,
    /// Its DNS name.
    pub dns_name: String,
    /// Where this member writes its backups (URL).
    pub backup: String,
    /// The migration that brought it here at this epoch, if the ring recorded one.
    pub migration: Option<MigrationTarget>,
    /// Zone-tolerant: its etcd is a cluster whose member on this host runs as a replica
    /// ([`ReplicaTarget`]); the host only opens its gate to it and takes the backups.
    pub zone_tolerant: bool,
}

impl Target {
    /// What `member` needs to start control plane `name` at `epoch`, from its applied `state`;
    /// `None` until that state has caught up with the grant: the control plane registered, at
    /// exactly `epoch`, hosted on `member`.
    ///
    /// The grant comes from the leader and may be ahead of this member's applied state. Built
    /// from an older state, the target would carry no migration (the record names another
    /// epoch), and the etcd driver would take a moved control plane for a new one and start it
    /// empty instead of restoring its data.
    pub fn from_state(state: &RingState, member: &str, name: &str, epoch: u64) -> Option<Self> {
        let cp = state.control_planes.get(name)?;
        if cp.epoch != epoch || cp.host.as_deref() != Some(member) {
            return None;
        }
        let migration = cp
            .migration
            .as_ref()
            .filter(|m| m.epoch == epoch && m.to == member)
            .map(|m| MigrationTarget {
                from: m.from.clone(),
                source: m.source.clone(),
                started_unix_ms: m.started_unix_ms,
            });
        Some(Self {
            name: name.to_string(),
            epoch,
            endpoint: cp.endpoints.get(member).cloned().unwrap_or_default(),
            dns_name: cp.dns_name.clone(),
            backup: cp.backup_for(member).to_string(),
            migration,
            zone_tolerant: cp.etcd.is_some(),
        })
    }

    /// The control plane `name` at `epoch` that a previous run of `member` left running under
    /// its guard, as this run's applied `state` knows it: as [`Target::from_state`] when the
    /// state holds that epoch here; when the state is older (this run has not applied the move
    /// yet), its endpoint and backup location as the state has them (a move changes neither
    /// for the member it goes to). `None` when the state has moved it on, or no longer has it:
    /// that etcd is no longer this member's to serve.
    pub fn adopted(state: &RingState, member: &str, name: &str, epoch: u64) -> Option<Self> {
        let cp = state.control_planes.get(name)?;
        if cp.epoch > epoch || cp.etcd.is_some() {
            return None;
        }
        if cp.epoch == epoch {
            return Self::from_state(state, member, name, epoch);
        }
        Some(Self {
            name: name.to_string(),
            epoch,
            endpoint: cp.endpoints.get(member).cloned()?,
            dns_name: cp.dns_name.clone(),
            backup: cp.backup_for(member).to_string(),
            migration: None,
            zone_tolerant: false,
        })
    }
}

/// The step of a zone-tolerant control plane's etcd cluster change its host is to carry out
/// (see [`crate::core::etcd_cluster::EtcdChange`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PendingChange {
    /// The cluster's generation.
    pub generation: u64,
    /// The step.
    pub step: EtcdChangeStep,
    /// The etcd member that goes (its name, and its peer address `host:port`).
    pub removed: String,
    /// Its peer address.
    pub removed_peer: String,
    /// The etcd member that comes.
    pub added: String,
    /// Its peer address (`host:port`).
    pub added_peer: String,
    /// etcd's id of the member that goes, if the ring recorded it (0: find it by name or peer
    /// URL).
    pub removed_etcd_id: u64,
}

impl PendingChange {
    /// The step of `cluster`'s change, if one is in progress.
    fn of(cluster: &EtcdCluster) -> Option<Self> {
        let change = cluster.change.as_ref()?;
        Some(Self {
            generation: cluster.generation,
            step: change.step,
            removed: change.removed.clone(),
            removed_peer: change.removed_peer.clone(),
            added: change.added.clone(),
            added_peer: cluster
                .member(&change.added)
                .map(|m| m.peer.clone())
                .unwrap_or_default(),
            removed_etcd_id: change.removed_etcd_id,
        })
    }
}

/// What the host of a zone-tolerant control plane does for its etcd cluster: carry out the
/// step of its change, if one is in progress, and read etcd's ids of its members (for the
/// ring to record).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ClusterDuty {
    /// The cluster's generation.
    pub generation: u64,
    /// Ring member -> its etcd member's peer address (`host:port`).
    pub peers: BTreeMap<String, String>,
    /// The step of its change to carry out.
    pub change: Option<PendingChange>,
}

impl ClusterDuty {
    /// The duty `state` gives `member` for control plane `name`, if it hosts it and it is
    /// zone-tolerant.
    pub fn from_state(state: &RingState, member: &str, name: &str) -> Option<Self> {
        let cp = state.control_planes.get(name)?;
        if cp.host.as_deref() != Some(member) {
            return None;
        }
        let cluster = cp.etcd.as_ref()?;
        Some(Self {
            generation: cluster.generation,
            peers: cluster
                .members
                .iter()
                .map(|m| (m.member.clone(), m.peer.clone()))
                .collect(),
            change: PendingChange::of(cluster),
        })
    }
}

/// What a driver needs to run this member's etcd member of a zone-tolerant control plane.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ReplicaTarget {
    /// The control plane.
    pub name: String,
    /// Which run of this member's etcd member (the generation it joined at names its data
    /// directory).
    pub key: ReplicaKey,
    /// Start with `--force-new-cluster` (an operator's recovery from this member's data).
    pub force_new_cluster: bool,
    /// Restore a new data directory from the newest backups at this location (URL) first (an
    /// operator's recovery from backup).
    pub restore_from: Option<String>,
    /// The etcd cluster (its members and their peer addresses, its token).
    pub cluster: EtcdCluster,
    /// This member's name: its etcd member's name.
    pub member: String,
    /// `host:port` its etcd member listens on for peers.
    pub peer: String,
}

impl ReplicaTarget {
    /// What `member` needs to run its etcd member of `name` as granted (`key`), from its
    /// applied `state`; `None` until that state has caught up with the grant.
    pub fn from_state(
        state: &RingState,
        member: &str,
        name: &str,
        key: ReplicaKey,
    ) -> Option<Self> {
        let cp = state.control_planes.get(name)?;
        let cluster = cp.etcd.as_ref()?;
        let own = cluster.member(member).filter(|m| m.key() == key)?;
        Some(Self {
            name: name.to_string(),
            key,
            force_new_cluster: own.force_new_cluster,
            restore_from: own.restore_from.clone(),
            peer: own.peer.clone(),
            member: member.to_string(),
            cluster: cluster.clone(),
        })
    }
}

/// What a driver needs to know about the migration of a control plane to this member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct MigrationTarget {
    /// The member that served it before, if any.
    pub from: Option<String>,
    /// The backup location its data comes from (URL).
    pub source: String,
    /// When the move was committed, Unix ms.
    pub started_unix_ms: u64,
}

/// How a guard ends its workload: gone within `fence_ms` once stopped; with `hold_ms` > 0 the
/// lease's deadline freezes it first, for up to `hold_ms` (see `ring-guard`).
#[derive(Debug, Clone, Copy)]
pub(crate) struct GuardLimits {
    pub(crate) fence_ms: u64,
    pub(crate) hold_ms: u64,
}

impl GuardLimits {
    /// Stopped at the deadline, gone within `fence_ms`.
    pub(crate) fn fence(fence_ms: u64) -> Self {
        Self {
            fence_ms,
            hold_ms: 0,
        }
    }
}

/// A `ring-guard` process running one workload.
pub(crate) struct Guard {
    child: Child,
    stdin: Option<ChildStdin>,
}

impl Guard {
    /// Starts `argv` under the guard at `guard_binary`, to be stopped at `deadline_ms`
    /// (monotonic), with `env` set; the guard's reports go to the log.
    pub(crate) async fn spawn(
        guard_binary: &std::path::Path,
        limits: GuardLimits,
        argv: &[String],
        env: &[(&str, String)],
        deadline_ms: u64,
        name: &str,
        epoch: u64,
    ) -> Result<Self, DriverError> {
        let mut cmd = Command::new(guard_binary);
        cmd.arg("--fence-ms").arg(limits.fence_ms.to_string());
        if limits.hold_ms > 0 {
            cmd.arg("--hold-ms").arg(limits.hold_ms.to_string());
        }
        cmd.arg("--")
            .args(argv)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit());
        for (key, value) in env {
            cmd.env(key, value);
        }
        let mut child = cmd.spawn().map_err(|e| DriverError::Spawn {
            command: guard_binary.display().to_string(),
            why: e.to_string(),
        })?;
        let stdin = child.stdin.take();
        if let Some(out) = child.stdout.take() {
            tokio::spawn(
                async move {
                    let mut lines = BufReader::new(out).lines();
                    while let Ok(Some(line)) = lines.next_line().await {
                        tracing::info!("guard: {line}");
                    }
                }
                .instrument(crate::logging::control_plane_span(name, epoch)),
            );
        }
        let mut guard = Self { child, stdin };
        guard.set_deadline(deadline_ms).await;
        Ok(guard)
    }

    /// Moves the deadline.
    pub(crate) async fn set_deadline(&mut self, deadline_ms: u64) {
        if let Some(stdin) = self.stdin.as_mut() {
            let _ = stdin
                .write_all(format!("deadline {deadline_ms}\n").as_bytes())
                .await;
        }
    }

    /// Stops the workload now and waits (at most `fence_ms` + 500 ms) for the guard, then
    /// kills it.
    pub(crate) async fn stop(&mut self, fence_ms: u64) -> bool {
        if let Some(stdin) = self.stdin.as_mut() {
            let _ = stdin.write_all(b"stop\n").await;
        }
        let wait = Duration::from_millis(fence_ms + 500);
        if tokio::time::timeout(wait, self.child.wait()).await.is_err() {
            let _ = self.child.kill().await;
            return false;
        }
        true
    }

    /// Waits until the guard exits (the workload ended or was fenced).
    pub(crate) async fn wait(&mut self) -> String {
        match self.child.wait().await {
            Ok(status) => status.to_string(),
            Err(e) => e.to_string(),
        }
    }

    /// How the guard exited, if it did.
    pub(crate) fn exited(&mut self) -> Option<String> {
        match self.child.try_wait() {
            Ok(None) => None,
            Ok(Some(status)) => Some(status.to_string()),
            Err(e) => Some(e.to_string()),
        }
    }
}
