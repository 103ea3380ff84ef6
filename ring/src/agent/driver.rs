//! Drivers: how a member runs the control planes it hosts.
//!
//! - `none`: runs nothing. An instance is a deadline in memory; it "serves" until the deadline
//!   or a stop. Useful for a ring that only records assignments, and for tests of the
//!   coordinator itself.
//! - `exec`: runs the configured command per control plane under `ring-guard`, which stops it
//!   at the lease deadline even if `ringd` is frozen. Hook commands (`on_start`, `on_stop`) run
//!   with a timeout, their output captured into the log, like Patroni callbacks.
//! - `etcd`: runs each control plane's etcd itself, moving its data through the backups when
//!   it moves ([`super::etcd`]).
//!
//! Every command gets the control plane, the epoch and the action in its environment:
//! `GARDEN_RING_CONTROL_PLANE`, `GARDEN_RING_EPOCH`, `GARDEN_RING_ACTION` (`start`, `run`,
//! `health`, `stop`, `fence`), `GARDEN_RING_MEMBER`, `GARDEN_RING_ENDPOINT` (this member's endpoint for
//! it) and `GARDEN_RING_DNS_NAME`.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Stdio;
use std::time::Duration;

use tokio::process::Command;
use tracing::Instrument as _;

use std::sync::Arc;

use super::backup_status::BackupStatuses;
use super::etcd::{EtcdInstance, EtcdRuntime, InstancePhase, SnapshotTimes};
use super::etcd_replica::EtcdReplica;
pub use super::workload::{
    ClusterDuty, DriverError, MigrationTarget, PendingChange, ReplicaTarget, Target,
};
use super::workload::{Guard, GuardLimits};
use crate::config::{Config, DriverKind, DriverSettings};
use crate::core::etcd_cluster::ReplicaKey;
use crate::core::limits::MAX_TEXT_LEN;
use crate::core::names::fit_text;
use crate::time::monotonic_ms;

/// Most bytes of a hook's output kept for the log.
pub const MAX_HOOK_OUTPUT_BYTES: usize = 4 * 1024;
/// The pause before an etcd that failed starts again, in ms, after its first failure in a
/// row; it doubles with each further one, up to [`MAX_RESTART_BACKOFF_MS`].
const FIRST_RESTART_BACKOFF_MS: u64 = 1_000;
/// The longest pause before an etcd that keeps failing starts again, in ms.
const MAX_RESTART_BACKOFF_MS: u64 = 30_000;
/// How long an etcd that failed before must stay healthy before its failures are forgotten
/// (its backoff starts from [`FIRST_RESTART_BACKOFF_MS`] again), in ms.
const FORGET_FAILURES_AFTER_MS: u64 = 60_000;
/// Below this many free bytes on the file system of an etcd's data, a failure's report says
/// so: etcd preallocates its WAL files at 64 MiB each, so it fails to write with room to
/// spare by other measures.
const LOW_DATA_DISK_BYTES: u64 = 128 * 1024 * 1024;

/// An etcd of a control plane that ended by itself (see [`EtcdInstance::failed`]): what the
/// host reports, and when it tries again.
#[derive(Debug, Clone)]
struct Failure {
    epoch: u64,
    why: String,
    /// Failures in a row (from 1).
    count: u32,
    /// Not started again before this (monotonic ms).
    next_start_ms: u64,
}

struct Instance {
    target: Target,
    deadline_ms: u64,
    guard: Option<Guard>,
}

/// This member's etcd member of a zone-tolerant control plane: run by the `etcd` driver; with
/// the others (which run no etcd) only a deadline in memory, so that the ring's bookkeeping
/// is the same whatever the driver.
enum Replica {
    Memory { key: ReplicaKey, deadline_ms: u64 },
    Etcd(EtcdReplica),
}

impl Replica {
    fn key(&self) -> ReplicaKey {
        match self {
            Replica::Memory { key, .. } => *key,
            Replica::Etcd(r) => r.key(),
        }
    }
}

/// What a start found of its previous run's etcds ([`Workloads::adopt`]).
#[derive(Debug, Default)]
pub struct Adoption {
    /// Adopted: serving (or frozen) here at that epoch, without a restart.
    pub adopted: Vec<(String, u64)>,
    /// Found at an epoch the applied state no longer has here, and stopped.
    pub stopped: Vec<(String, u64)>,
    /// Guards over this member's etcd data that could not be adopted (no control socket).
    pub unknown_guards: Vec<i32>,
}

/// The workloads of one member.
pub struct Workloads {
    member: String,
    settings: DriverSettings,
    fence_ms: u64,
    guard_binary: PathBuf,
    instances: BTreeMap<String, Instance>,
    etcd: Option<Arc<EtcdRuntime>>,
    etcd_instances: BTreeMap<String, EtcdInstance>,
    replicas: BTreeMap<String, Replica>,
    snapshots: Arc<SnapshotTimes>,
    backups: Arc<BackupStatuses>,
    /// Control plane -> its etcd's failures in a row at its latest epoch here.
    failures: BTreeMap<String, Failure>,
}

/// The `ring-guard` binary next to the running executable.
pub fn default_guard_binary() -> PathBuf {
    std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(|d| d.join("ring-guard")))
        .unwrap_or_else(|| PathBuf::from("ring-guard"))
}

impl Workloads {
    /// The workloads of member `member`.
    pub fn new(member: &str, settings: DriverSettings, fence_ms: u64) -> Self {
        let guard_binary = settings.guard.clone().unwrap_or_else(default_guard_binary);
        Self {
            member: member.to_string(),
            settings,
            fence_ms,
            guard_binary,
            instances: BTreeMap::new(),
            etcd: None,
            etcd_instances: BTreeMap::new(),
            replicas: BTreeMap::new(),
            snapshots: Arc::default(),
            backups: Arc::default(),
            failures: BTreeMap::new(),
        }
    }

    /// The workloads of the member `config` describes, with the driver it configures.
    pub fn from_config(config: &Config) -> Result<Self, DriverError> {
        let mut workloads = Self::new(&config.name, config.driver.clone(), config.timing.fence_ms);
        if config.driver.kind == DriverKind::Etcd {
            let bin_dir = config.etcd_bin_dir().map_err(|e| DriverError::Spawn {
                command: "etcd".into(),
                why: e.to_string(),
            })?;
            workloads.etcd = Some(Arc::new(EtcdRuntime {
                member: config.name.clone(),
                bin_dir,
                data_root: config.etcd_data_root(),
                settings: config.driver.etcd.clone(),
                backup: config.backup.clone(),
                guard_binary: workloads.guard_binary.clone(),
                timing: config.timing.clone(),
                snapshots: workloads.snapshots.clone(),
                backups: workloads.backups.clone(),
                peer_tls: config.tls.as_ref().map(|t| t.files.clone()),
            }));
        }
        Ok(workloads)
    }

    /// When the etcd driver's instances last took a snapshot (empty with other drivers).
    pub fn snapshot_times(&self) -> Arc<SnapshotTimes> {
        self.snapshots.clone()
    }

    /// The etcd driver's instances' newest backup reports (empty with other drivers).
    pub fn backup_statuses(&self) -> Arc<BackupStatuses> {
        self.backups.clone()
    }

    /// The backup reports of what runs (`running`: control plane -> epoch), each recorded at
    /// the epoch it runs at. Only the `etcd` driver writes backups; the others report none.
    pub fn backups(
        &self,
        running: &BTreeMap<String, u64>,
    ) -> BTreeMap<String, crate::core::backup_report::BackupReport> {
        self.backups.at_epochs(running)
    }

    fn env(&self, cmd: &mut Command, target: &Target, action: &str) {
        cmd.env("GARDEN_RING_CONTROL_PLANE", &target.name)
            .env("GARDEN_RING_EPOCH", target.epoch.to_string())
            .env("GARDEN_RING_ACTION", action)
            .env("GARDEN_RING_MEMBER", &self.member)
            .env("GARDEN_RING_ENDPOINT", &target.endpoint)
            .env("GARDEN_RING_DNS_NAME", &target.dns_name);
    }

    /// Runs a hook (if configured) with a timeout; its output goes to the log.
    async fn hook(
        &self,
        action: &'static str,
        argv: &[String],
        target: &Target,
    ) -> Result<(), DriverError> {
        let Some((program, args)) = argv.split_first() else {
            return Ok(());
        };
        let mut cmd = Command::new(program);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true);
        self.env(&mut cmd, target, action);
        let fail = |why: String| DriverError::Hook {
            action,
            name: target.name.clone(),
            epoch: target.epoch,
            why,
        };
        let child = cmd
            .spawn()
            .map_err(|e| fail(format!("cannot start {program}: {e}")))?;
        let timeout = Duration::from_millis(self.settings.hook_timeout_ms);
        let output = tokio::time::timeout(timeout, child.wait_with_output())
            .await
            .map_err(|_| {
                fail(format!(
                    "timed out after {} ms and was killed",
                    timeout.as_millis()
                ))
            })?
            .map_err(|e| fail(e.to_string()))?;
        let mut text = String::from_utf8_lossy(&output.stdout).into_owned();
        text.push_str(&String::from_utf8_lossy(&output.stderr));
        if text.len() > MAX_HOOK_OUTPUT_BYTES {
            let mut cut = MAX_HOOK_OUTPUT_BYTES;
            while !text.is_char_boundary(cut) {
                cut -= 1;
            }
            text.truncate(cut);
            text.push_str(" [...]");
        }
        let text = text.trim();
        if output.status.success() {
            if !text.is_empty() {
                tracing::info!("{action} hook: {text}");
            }
            Ok(())
        } else {
            Err(fail(format!("exited with {}: {text}", output.status)))
        }
    }

    /// Starts `target`, to be stopped at `deadline_ms` (monotonic) unless extended.
    pub async fn start(&mut self, target: Target, deadline_ms: u64) -> Result<(), DriverError> {
        if let Some(runtime) = &self.etcd {
            if let Some(failure) = self.failures.get(&target.name) {
                if failure.epoch != target.epoch {
                    self.failures.remove(&target.name);
                } else if let Some(retry_in_ms) = failure
                    .next_start_ms
                    .checked_sub(monotonic_ms())
                    .filter(|ms| *ms > 0)
                {
                    return Err(DriverError::BackingOff {
                        name: target.name.clone(),
                        epoch: target.epoch,
                        failures: failure.count,
                        retry_in_ms,
                    });
                }
            }
            if let Some(old) = self.etcd_instances.get(&target.name) {
                // Never two instances of one control plane: the old one finishes stopping first.
                return Err(DriverError::Busy {
                    name: target.name.clone(),
                    epoch: old.target().epoch,
                });
            }
            let replica = if target.zone_tolerant {
                match self.replicas.get(&target.name) {
                    Some(Replica::Etcd(replica)) if !replica.ended() => Some(replica.handle()),
                    _ => {
                        return Err(DriverError::NoReplica {
                            name: target.name.clone(),
                        });
                    }
                }
            } else {
                None
            };
            tracing::info!(
                "starting etcd{}",
                if replica.is_some() {
                    " (the front end of this member's etcd member)"
                } else {
                    ""
                }
            );
            let name = target.name.clone();
            let instance = EtcdInstance::start(runtime.clone(), target, deadline_ms, replica);
            self.etcd_instances.insert(name, instance);
            return Ok(());
        }
        if self.settings.kind == DriverKind::None {
            self.instances.insert(
                target.name.clone(),
                Instance {
                    target,
                    deadline_ms,
                    guard: None,
                },
            );
            return Ok(());
        }
        self.hook("start", &self.settings.on_start.clone(), &target)
            .await?;
        let env = [
            ("GARDEN_RING_CONTROL_PLANE", target.name.clone()),
            ("GARDEN_RING_EPOCH", target.epoch.to_string()),
            ("GARDEN_RING_ACTION", "run".to_string()),
            ("GARDEN_RING_MEMBER", self.member.clone()),
            ("GARDEN_RING_ENDPOINT", target.endpoint.clone()),
            ("GARDEN_RING_DNS_NAME", target.dns_name.clone()),
        ];
        let guard = Guard::spawn(
            &self.guard_binary,
            GuardLimits::fence(self.fence_ms),
            &self.settings.run,
            &env,
            deadline_ms,
            &target.name,
            target.epoch,
        )
        .await?;
        tracing::info!("started");
        self.instances.insert(
            target.name.clone(),
            Instance {
                target,
                deadline_ms,
                guard: Some(guard),
            },
        );
        Ok(())
    }

    /// Takes over the etcds a previous run of this member left under their guards (etcd
    /// driver only; `None` with the others, which adopt nothing). `target_of` builds a
    /// control plane's target at an epoch from the applied state ([`Target::adopted`]); a
    /// guard whose control plane the state moved on or removed is stopped.
    pub async fn adopt(
        &mut self,
        target_of: impl Fn(&str, u64) -> Option<Target>,
    ) -> Option<Adoption> {
        let runtime = self.etcd.clone()?;
        let mut adoption = Adoption::default();
        let mut reached = Vec::new();
        for mut found in super::adoption::find(&runtime.data_root).await {
            reached.push(found.status.guard_pid);
            let span = crate::logging::control_plane_span(&found.name, found.epoch);
            match target_of(&found.name, found.epoch) {
                Some(target) if !self.etcd_instances.contains_key(&found.name) => {
                    let instance =
                        EtcdInstance::adopt(runtime.clone(), target, found.guard, found.status);
                    self.etcd_instances.insert(found.name.clone(), instance);
                    adoption.adopted.push((found.name, found.epoch));
                }
                _ => {
                    span.in_scope(|| {
                        tracing::warn!(
                            "a previous run left etcd running at an epoch this member no longer serves; stopping it"
                        )
                    });
                    found.guard.stop(self.fence_ms).instrument(span).await;
                    adoption.stopped.push((found.name, found.epoch));
                }
            }
        }
        adoption.unknown_guards = super::adoption::unknown_guards(&runtime.data_root, &reached);
        Some(adoption)
    }

    /// Before this ringd leaves: a delta snapshot of every etcd that serves here, waited for at
    /// most `within` (the etcds serve on under their guards; what they acknowledged until now
    /// is then in the bucket, whether or not a next ringd adopts them). An instance still
    /// preparing or starting is stopped instead (see [`Workloads::still_stopping`]): nothing
    /// was acknowledged through it in this run, but an etcd starting on data an earlier run
    /// left may hold writes the bucket lacks (that run ended without a final snapshot, its
    /// guard killed); its final snapshot stores them, so no guard is left holding what the
    /// bucket does not. Returns the control planes being stopped.
    pub async fn flush_backups(&self, within: Duration) -> Vec<String> {
        if self.etcd.is_none() {
            return Vec::new();
        }
        let deltas = self.settings.etcd.delta_snapshot_period_ms > 0;
        let asked_unix_ms = crate::time::unix_ms();
        let mut serving = BTreeMap::new();
        let mut starting = Vec::new();
        for (name, instance) in &self.etcd_instances {
            match instance.phase() {
                InstancePhase::Serving if deltas => {
                    instance.cut_soon();
                    serving.insert(name.clone(), instance.target().epoch);
                }
                InstancePhase::Preparing => {
                    instance.stop().await;
                    starting.push(name.clone());
                }
                _ => {}
            }
        }
        let until = tokio::time::Instant::now() + within;
        loop {
            let stored = self.backups.at_epochs(&serving);
            let done = serving.keys().all(|name| {
                stored
                    .get(name)
                    .is_some_and(|r| r.up_to_date_unix_ms >= asked_unix_ms)
            });
            if done {
                tracing::info!(
                    control_planes = serving.len(),
                    "last delta snapshots stored"
                );
                return starting;
            }
            if tokio::time::Instant::now() >= until {
                tracing::warn!(
                    "the last delta snapshots were not all stored within {} ms",
                    within.as_millis()
                );
                return starting;
            }
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }

    /// Which of `names` (instances [`Workloads::flush_backups`] stopped) have not ended yet.
    pub fn still_stopping(&self, names: &[String]) -> Vec<String> {
        names
            .iter()
            .filter(|name| {
                self.etcd_instances
                    .get(*name)
                    .is_some_and(|i| i.phase() != InstancePhase::Ended)
            })
            .cloned()
            .collect()
    }

    /// Starts this member's etcd member of a zone-tolerant control plane, to be stopped at
    /// `deadline_ms` (monotonic) unless extended.
    pub fn start_replica(&mut self, target: ReplicaTarget, deadline_ms: u64) {
        if let Some(old) = self.replicas.get(&target.name) {
            if old.key() == target.key {
                return;
            }
            // Another run: never two etcd members of one control plane here.
            tracing::info!(
                "etcd member of {} ({}) still stopping; the new one starts next round",
                target.name,
                old.key()
            );
            return;
        }
        let replica = match &self.etcd {
            Some(runtime) => {
                tracing::info!("starting etcd member of {}", target.name);
                Replica::Etcd(EtcdReplica::start(
                    runtime.clone(),
                    target.clone(),
                    deadline_ms,
                ))
            }
            None => Replica::Memory {
                key: target.key,
                deadline_ms,
            },
        };
        self.replicas.insert(target.name, replica);
    }

    /// Tells each etcd instance what the applied `state` asks of it: a zone-tolerant front
    /// end its etcd cluster's duty, every instance whether it may garbage-collect its backups
    /// ([`crate::core::backup_retention::hold`]).
    pub fn follow_state(&self, state: &crate::core::RingState) {
        for (name, instance) in &self.etcd_instances {
            let epoch = instance.target().epoch;
            if instance.target().zone_tolerant {
                instance.set_cluster_duty(ClusterDuty::from_state(state, &self.member, name));
            }
            instance.set_gc_hold(crate::core::backup_retention::hold(
                state,
                &self.member,
                name,
                epoch,
            ));
        }
    }

    /// etcd's ids of their clusters' members as the front ends last listed them: control
    /// plane -> (generation, ring member -> etcd member id).
    pub fn etcd_ids(&self) -> BTreeMap<String, (u64, BTreeMap<String, u64>)> {
        self.etcd_instances
            .iter()
            .filter_map(|(name, i)| Some((name.clone(), i.etcd_ids()?)))
            .collect()
    }

    /// The etcd cluster changes' steps the front ends did: control plane -> (generation, step).
    pub fn etcd_changes(
        &self,
    ) -> BTreeMap<String, (u64, crate::core::etcd_cluster::EtcdChangeStep)> {
        self.etcd_instances
            .iter()
            .filter_map(|(name, i)| Some((name.clone(), i.etcd_change_done()?)))
            .collect()
    }

    /// Moves the deadline of this member's etcd member of `name` (run `key`).
    pub fn extend_replica(&mut self, name: &str, key: ReplicaKey, deadline_ms: u64) {
        match self.replicas.get_mut(name) {
            Some(Replica::Etcd(r)) if r.key() == key => r.extend(deadline_ms),
            Some(Replica::Memory {
                key: k,
                deadline_ms: d,
            }) if *k == key => *d = (*d).max(deadline_ms),
            _ => {}
        }
    }

    /// Stops this member's etcd member of `name` (run `key`).
    pub fn stop_replica(&mut self, name: &str, key: ReplicaKey) {
        match self.replicas.get(name) {
            Some(Replica::Etcd(r)) if r.key() == key => r.stop(),
            Some(Replica::Memory { key: k, .. }) if *k == key => {
                self.replicas.remove(name);
            }
            _ => {}
        }
    }

    /// The etcd members this member runs (control plane -> run); those that ended (stopped,
    /// or their lease ran out) are dropped.
    pub fn running_replicas(&mut self) -> BTreeMap<String, ReplicaKey> {
        let now = monotonic_ms();
        self.replicas.retain(|name, replica| {
            let ended = match replica {
                Replica::Memory { deadline_ms, .. } => now >= *deadline_ms,
                Replica::Etcd(r) => r.ended(),
            };
            if ended {
                tracing::info!(control_plane = %name, "etcd member ended");
            }
            !ended
        });
        self.replicas
            .iter()
            .map(|(name, r)| (name.clone(), r.key()))
            .collect()
    }

    /// Moves the deadline of the running instance of `name` at `epoch`.
    pub async fn extend(&mut self, name: &str, epoch: u64, deadline_ms: u64) {
        if let Some(instance) = self.etcd_instances.get(name) {
            if instance.target().epoch == epoch {
                instance.extend_now(deadline_ms).await;
            }
            return;
        }
        let Some(instance) = self.instances.get_mut(name) else {
            return;
        };
        if instance.target.epoch != epoch || deadline_ms <= instance.deadline_ms {
            return;
        }
        instance.deadline_ms = deadline_ms;
        if let Some(guard) = instance.guard.as_mut() {
            guard.set_deadline(deadline_ms).await;
        }
    }

    /// Stops the instance of `name` at `epoch` now and waits (at most `fence_ms`) for it.
    pub async fn stop(&mut self, name: &str, epoch: u64) {
        if let Some(instance) = self.etcd_instances.get(name) {
            if instance.target().epoch == epoch {
                instance.stop().await;
            }
            return;
        }
        let matches = self
            .instances
            .get(name)
            .is_some_and(|i| i.target.epoch == epoch);
        if !matches {
            return;
        }
        let instance = self.instances.remove(name).expect("checked above");
        if let Some(mut guard) = instance.guard
            && !guard.stop(self.fence_ms).await
        {
            tracing::error!("guard did not stop in time; killed it");
        }
        tracing::info!("stopped");
        if let Err(e) = self
            .hook("stop", &self.settings.on_stop.clone(), &instance.target)
            .await
        {
            tracing::warn!("{e}");
        }
    }

    /// The migrations the instances perform, by control plane. The `none` and `exec` drivers
    /// move no data themselves, so they report none (their migrations go from `handover` to
    /// `done`); the `etcd` driver reports its copy and restore.
    pub fn migrations(&self) -> BTreeMap<String, crate::core::migration::MigrationReport> {
        self.etcd_instances
            .iter()
            .filter_map(|(name, i)| Some((name.clone(), i.migration_report()?)))
            .collect()
    }

    /// What is wrong with the control planes whose etcd runs here or failed here (control
    /// plane -> (epoch, the host's words)): an etcd that failed (and is not healthy again
    /// since), one that runs but has failed its health checks for a while, or one that runs on
    /// a nearly full file system. The words say when the file system of the data is nearly
    /// full. Empty with other drivers.
    pub fn problems(&self) -> BTreeMap<String, (u64, String)> {
        let Some(runtime) = &self.etcd else {
            return BTreeMap::new();
        };
        // The host's words, with one look at the data's file system.
        let words = |name: &str, epoch: u64, what: Option<String>| {
            let note = low_disk_note(&runtime.epoch_dir(name, epoch));
            // An etcd that serves on a nearly full disk fails at its next WAL file: said
            // before it does (and while a restart on a still full disk serves a moment).
            let what = what.or_else(|| {
                note.is_some()
                    .then(|| "etcd runs, but its data disk is nearly full".to_string())
            })?;
            let text = match note {
                Some(note) => format!("{what}; {note}"),
                None => what,
            };
            Some((epoch, fit_text(&text, MAX_TEXT_LEN)))
        };
        let mut out = BTreeMap::new();
        for (name, failure) in &self.failures {
            let healthy_again = self
                .etcd_instances
                .get(name)
                .is_some_and(|i| i.target().epoch == failure.epoch && i.healthy());
            if !healthy_again {
                let what = format!(
                    "etcd failed {} time(s) in a row: {}",
                    failure.count, failure.why
                );
                out.extend(words(name, failure.epoch, Some(what)).map(|w| (name.clone(), w)));
            }
        }
        for (name, instance) in &self.etcd_instances {
            if !out.contains_key(name) {
                let epoch = instance.target().epoch;
                out.extend(words(name, epoch, instance.problem()).map(|w| (name.clone(), w)));
            }
        }
        out
    }

    /// Whether the health of an etcd instance differs from `reported` (control plane -> epoch
    /// reported healthy in the last renewal). Cheap (no hooks): the agent checks it between
    /// renewals, so a new host reports serving as soon as its gate opened.
    pub fn etcd_health_changed(&self, reported: &BTreeMap<String, u64>) -> bool {
        self.etcd_instances
            .iter()
            .any(|(name, i)| i.healthy() != (reported.get(name) == Some(&i.target().epoch)))
    }

    /// Of what runs, what passes the health check (everything, without one).
    pub async fn healthy(&self) -> BTreeMap<String, u64> {
        let mut out: BTreeMap<String, u64> = self
            .etcd_instances
            .iter()
            .filter(|(_, i)| i.healthy())
            .map(|(name, i)| (name.clone(), i.target().epoch))
            .collect();
        for (name, instance) in &self.instances {
            let span = crate::logging::control_plane_span(name, instance.target.epoch);
            let ok = self.settings.health.is_empty()
                || match self
                    .hook("health", &self.settings.health, &instance.target)
                    .instrument(span)
                    .await
                {
                    Ok(()) => true,
                    Err(e) => {
                        tracing::debug!("{e}");
                        false
                    }
                };
            if ok {
                out.insert(name.clone(), instance.target.epoch);
            }
        }
        out
    }

    /// What runs now (control plane -> epoch). Instances whose guard exited (fenced at the
    /// deadline, or the workload ended) or whose deadline passed are dropped.
    pub async fn running(&mut self) -> BTreeMap<String, u64> {
        let now = monotonic_ms();
        let mut gone = Vec::new();
        for (name, instance) in &mut self.instances {
            let ended = match &mut instance.guard {
                Some(guard) => guard.exited().is_some(),
                None => now >= instance.deadline_ms,
            };
            if ended {
                gone.push(name.clone());
            }
        }
        for name in gone {
            if let Some(instance) = self.instances.remove(&name) {
                let span = crate::logging::control_plane_span(&name, instance.target.epoch);
                async {
                    tracing::warn!("fenced: its lease ran out (or the workload ended)");
                    if let Err(e) = self
                        .hook("fence", &self.settings.on_stop.clone(), &instance.target)
                        .await
                    {
                        tracing::warn!("{e}");
                    }
                }
                .instrument(span)
                .await;
            }
        }
        let failures = &mut self.failures;
        self.etcd_instances.retain(|name, instance| {
            let epoch = instance.target().epoch;
            if instance.phase() != InstancePhase::Ended {
                if instance.healthy()
                    && failures.get(name).is_some_and(|f| {
                        f.epoch == epoch
                            && now >= f.next_start_ms.saturating_add(FORGET_FAILURES_AFTER_MS)
                    })
                {
                    failures.remove(name);
                }
                return true;
            }
            let _in = crate::logging::control_plane_span(name, epoch).entered();
            match instance.failed() {
                None => tracing::info!("etcd instance ended"),
                Some(why) => {
                    let count = match failures.get(name) {
                        Some(f) if f.epoch == epoch => f.count.saturating_add(1),
                        _ => 1,
                    };
                    let backoff_ms = restart_backoff_ms(count);
                    tracing::error!(
                        failures = count,
                        "etcd failed: {why}; starting again in {backoff_ms} ms"
                    );
                    failures.insert(
                        name.clone(),
                        Failure {
                            epoch,
                            why,
                            count,
                            next_start_ms: now.saturating_add(backoff_ms),
                        },
                    );
                }
            }
            false
        });
        self.instances
            .iter()
            .map(|(n, i)| (n.clone(), i.target.epoch))
            .chain(
                self.etcd_instances
                    .iter()
                    .map(|(n, i)| (n.clone(), i.target().epoch)),
            )
            .collect()
    }
}

/// The pause before an etcd that failed `count` times in a row starts again, in ms.
fn restart_backoff_ms(count: u32) -> u64 {
    let doublings = count.saturating_sub(1).min(16);
    FIRST_RESTART_BACKOFF_MS
        .saturating_mul(1 << doublings)
        .min(MAX_RESTART_BACKOFF_MS)
}

/// "the data disk is nearly full (N MiB free)" when the file system that holds `dir` (or its
/// nearest existing parent) has less than [`LOW_DATA_DISK_BYTES`] free.
fn low_disk_note(dir: &std::path::Path) -> Option<String> {
    let existing = dir.ancestors().find(|d| d.exists())?;
    let free = crate::raft::disk::free_bytes(existing).ok()?;
    (free < LOW_DATA_DISK_BYTES).then(|| {
        format!(
            "the file system of its data ({}) has {} MiB free (etcd preallocates 64 MiB WAL files)",
            existing.display(),
            free / (1024 * 1024)
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::core::MoveKind;
    use crate::core::RingState;
    use crate::core::command::{Command, ControlPlaneSpec, MemberSpec, Proposal};

    fn apply(state: &mut RingState, index: u64, command: Command) {
        let proposal = Proposal {
            command,
            at_ms: 1_700_000_000_000 + index,
            actor: "test".into(),
            reason: "test".into(),
        };
        state.apply(index, &proposal).unwrap();
    }

    /// A ring of a, b, c with control plane `x` hosted on a at epoch 1.
    fn x_on_a() -> RingState {
        let mut state = RingState::default();
        let members = ["a", "b", "c"]
            .iter()
            .zip(1u64..)
            .map(|(name, id)| MemberSpec {
                id,
                name: name.to_string(),
                zone: format!("zone-{name}"),
                address: format!("127.0.0.1:{}", 7001 + id * 10),
                admin_address: format!("127.0.0.1:{}", 7000 + id * 10),
            })
            .collect();
        apply(
            &mut state,
            1,
            Command::Bootstrap {
                members,
                dns_zone: None,
            },
        );
        apply(
            &mut state,
            2,
            Command::AddControlPlane(ControlPlaneSpec {
                name: "x".into(),
                home: None,
                dns_name: "x.ring.example".into(),
                endpoints: [("a", "10.0.0.1:2379"), ("b", "10.0.0.2:2379")]
                    .iter()
                    .map(|(m, e)| (m.to_string(), e.to_string()))
                    .collect(),
                backup: "file:///backups/a/x".into(),
                backups: [("b".to_string(), "file:///backups/b/x".to_string())].into(),
                host: Some("a".into()),
                prefer: Vec::new(),
                tolerance: Default::default(),
                etcd_peers: Default::default(),
            }),
        );
        state
    }

    #[test]
    fn a_target_waits_for_the_applied_state_to_reach_the_granted_epoch() {
        let before = x_on_a();
        let mut after = before.clone();
        apply(
            &mut after,
            3,
            Command::MoveControlPlane {
                name: "x".into(),
                to: Some("b".into()),
                epoch: 2,
                kind: MoveKind::Failover,
                note: String::new(),
            },
        );

        // b is granted epoch 2 while its applied state still has x on a at epoch 1: no target
        // (one built now would carry no migration, and an etcd would start empty).
        assert_eq!(Target::from_state(&before, "b", "x", 2), None);
        // Once applied: the migration from a's bucket.
        let target = Target::from_state(&after, "b", "x", 2).unwrap();
        assert_eq!(target.endpoint, "10.0.0.2:2379");
        assert_eq!(target.backup, "file:///backups/b/x");
        let migration = target.migration.unwrap();
        assert_eq!(migration.from.as_deref(), Some("a"));
        assert_eq!(migration.source, "file:///backups/a/x");

        // A new control plane's first placement: a migration from nowhere.
        let first = Target::from_state(&before, "a", "x", 1).unwrap();
        assert_eq!(first.migration.unwrap().from, None);

        // Stale or foreign grants and unknown names build nothing.
        assert_eq!(Target::from_state(&after, "a", "x", 1), None);
        assert_eq!(Target::from_state(&after, "c", "x", 2), None);
        assert_eq!(Target::from_state(&after, "b", "y", 2), None);
    }

    #[test]
    fn a_failing_etcd_waits_longer_after_each_failure_up_to_a_cap() {
        let pauses: Vec<u64> = (1..=8).map(restart_backoff_ms).collect();
        assert_eq!(
            pauses,
            [1_000, 2_000, 4_000, 8_000, 16_000, 30_000, 30_000, 30_000]
        );
        assert_eq!(restart_backoff_ms(u32::MAX), MAX_RESTART_BACKOFF_MS);
    }
}
