//! The `etcd` driver: each hosted control plane is an etcd this member runs itself.
//!
//! One [`EtcdInstance`] per hosted control plane and epoch, driven by its own task:
//!
//! 1. **Prepare** the data. The data directory is `<data_root>/<control plane>/epoch-<N>/etcd`.
//!    If it exists, this member served epoch N before (a restart, a short lease hiccup):
//!    nobody else can have served since (the epoch would have changed), so it is used as it
//!    is. Otherwise the migration of epoch N runs ([`crate::backup::migrate`]: markers in both
//!    locations, snapshots copied source -> destination), then the newest snapshot that
//!    verifies is restored ([`crate::backup::restore`]) into `epoch-<N>.restoring/` and renamed
//!    into place. A control plane that never had a host and has no snapshot starts empty. A
//!    control plane that had a host but has no snapshot is not started empty: that would lose
//!    its data silently; the instance retries and says why in the migration's note.
//! 2. **Start** etcd under `ring-guard` (stopped at the lease deadline whatever `ringd` does),
//!    listening on loopback ports of its own, and wait until it answers.
//! 3. **Serve**: open the [`Gate`] on the control plane's public endpoint; take a full snapshot
//!    every `snapshot_interval_ms` and delta snapshots between them, each after reading the
//!    marker of this member's backup location (DESIGN.md rule 4: a member that lost ownership
//!    uploads nothing and stops serving). An etcd restored from a clean chain continues it with
//!    deltas from the restored revision on (the watch starts before the gate opens); any other
//!    starts with a full snapshot at once ([`super::etcd_backups`]).
//! 4. **Stop** (the grant no longer covers it, or the lease is about to run out unrenewed, at
//!    a quarter of the lease before its deadline): close the gate first (no write is
//!    acknowledged after that), take a **final** snapshot (`.final`; again only after the
//!    marker check), stop etcd. The member keeps reporting the control plane as running
//!    until this is done, so a planned switchover's new host waits for the final snapshot:
//!    nothing acknowledged is lost. When the lease runs out, a delta upload in flight is given
//!    up (its events stay for the final one) and the final snapshot must be stored before the
//!    lease's deadline: an upload hung on a bad link must not hold up the instance's end.
//! 5. **Hold** (the lease ran out, an own etcd): at the deadline the guard *freezes* etcd
//!    (SIGSTOP: it answers nothing, the gate is closed anyway) and holds it for up to 4 x
//!    `member_lost_ms` (long after the ring would have moved the control plane), then the
//!    guard stops it. A fresh grant at this epoch within the hold thaws it and opens the gate again:
//!    a lease that lapsed for a moment (a cut, heavy loss) costs no etcd restart. The grant
//!    going elsewhere stops it as in 4.
//!
//! While preparing, the instance reports the migration's step (`copying`, `restoring`,
//! `starting`), the bytes copied, the snapshot restored and the data-loss window (the
//! snapshot's age when restored, zero for a final one) through the lease renewals.

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::sync::watch;
use tokio::task::JoinHandle;
use tracing::Instrument as _;

use super::etcd_backups::{Backups, Resume, StoreError, Stored};
use super::etcd_gc::{self, Collected};
use super::etcd_replica::ReplicaHandle;
pub use super::etcd_runtime::{EtcdRuntime, SnapshotTimes};
use super::gate::Gate;
use super::guarded::{GuardGate, GuardLink, GuardStatus, Guarded};
use super::lease::{lease_ran_out, lease_runs_out};
use super::workload::ClusterDuty;
use super::workload::{DriverError, GuardLimits, Target};
use crate::backup::copy::{CopyOptions, CopyProgress};
use crate::backup::etcd::{EtcdClient, EtcdClientOptions};
use crate::backup::location::BackupLocation;
use crate::backup::migrate::{MigrateError, MigrationPlan, migrate};
use crate::backup::restore::{RestoreError, RestoreOptions, RestoreTool, restore_newest};
use crate::core::backup_report::{DefragReport, GcReport};
use crate::core::backup_retention::Hold;
use crate::core::etcd_cluster::EtcdChangeStep;
use crate::core::migration::{MigrationReport, MigrationStep, note_text};
use crate::time::{monotonic_ms, unix_ms};

/// The migration's note of a zone-tolerant control plane's move.
const ZONE_TOLERANT_NOTE: &str =
    "zone-tolerant: the etcd cluster holds the data; no copy, no restore";
/// Longest wait between two attempts to prepare a control plane's data, in ms.
const MAX_PREPARE_BACKOFF_MS: u64 = 5_000;
/// First wait after a failed attempt to prepare, in ms.
const FIRST_PREPARE_BACKOFF_MS: u64 = 200;
/// How many times `member_lost_ms` an own etcd stays frozen after its lease ran out, at most.
const HOLD_MEMBER_LOST_TIMES: u64 = 4;
/// How long a serving etcd may fail its health checks before its host reports a problem, in
/// ms (a compaction or a defragmentation may hold it up for a few seconds).
const UNHEALTHY_PROBLEM_MS: u64 = 10_000;

/// Where an instance is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InstancePhase {
    /// Copying, restoring or starting etcd.
    Preparing,
    /// etcd runs behind an open gate.
    Serving,
    /// The gate is closed; the final snapshot is being taken and etcd stopped (or, after a
    /// lapsed lease, frozen until the lease comes back).
    Stopping,
    /// Nothing runs any more.
    Ended,
}

#[derive(Debug)]
struct View {
    phase: InstancePhase,
    healthy: bool,
    report: Option<MigrationReport>,
    copy: Option<watch::Receiver<CopyProgress>>,
    /// The last step of its etcd cluster's change this front end did (generation, step).
    etcd_done: Option<(u64, EtcdChangeStep)>,
    /// etcd's ids of its cluster's members as it last listed them (generation, ring member ->
    /// id).
    etcd_ids: Option<(u64, BTreeMap<String, u64>)>,
    /// Why its backups may not be garbage-collected now, from the applied state (None: they
    /// may).
    gc_hold: Option<Hold>,
    /// Since when (monotonic ms) its serving etcd has failed every health check.
    unhealthy_since_ms: Option<u64>,
    /// Why it ended by itself (etcd exited, could not start, its data could not be prepared);
    /// `None` while it runs, and when it ended because it was told to (stop, lease, move).
    failed: Option<String>,
}

struct Shared {
    view: Mutex<View>,
    gate: tokio::sync::Mutex<Option<OpenGate>>,
    /// The guard of an own etcd, once it runs: [`EtcdInstance::extend_now`] moves its
    /// deadline directly.
    guard: Mutex<Option<GuardLink>>,
    /// Asks the serving loop for a delta snapshot now ([`EtcdInstance::cut_soon`]).
    cut_soon: tokio::sync::Notify,
}

/// An open public endpoint: kept by this process (a zone-tolerant control plane's front end)
/// or by the guard of an own etcd ([`Guarded`], so that it outlives `ringd`).
enum OpenGate {
    Local(Gate),
    Guarded(GuardGate),
}

impl OpenGate {
    fn ran_out(&self) -> watch::Receiver<bool> {
        match self {
            OpenGate::Local(g) => g.ran_out(),
            OpenGate::Guarded(g) => g.ran_out(),
        }
    }

    async fn close(self) {
        match self {
            OpenGate::Local(g) => g.close().await,
            OpenGate::Guarded(g) => g.close().await,
        }
    }
}

impl Shared {
    fn view(&self) -> std::sync::MutexGuard<'_, View> {
        self.view.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn set_phase(&self, phase: InstancePhase) {
        let mut view = self.view();
        view.phase = phase;
        if phase != InstancePhase::Serving {
            view.healthy = false;
        }
    }

    fn report(&self, step: MigrationStep, change: impl FnOnce(&mut MigrationReport)) {
        let mut view = self.view();
        let report = view.report.get_or_insert_with(MigrationReport::default);
        report.step = Some(step);
        change(report);
    }

    fn note(&self, note: String) {
        let mut view = self.view();
        if let Some(report) = view.report.as_mut() {
            report.note = note_text(&note);
        }
    }

    /// Closes the gate if it is open: no client reaches etcd once this returns.
    async fn close_gate(&self) {
        if let Some(gate) = self.gate.lock().await.take() {
            gate.close().await;
        }
    }
}

/// One control plane's etcd at one epoch.
pub struct EtcdInstance {
    target: Target,
    deadline: watch::Sender<u64>,
    stop: watch::Sender<bool>,
    /// Set when this ringd leaves: the task ends at once and leaves etcd and its endpoint to
    /// the guard, for the next ringd of this member to adopt.
    detach: watch::Sender<bool>,
    change: watch::Sender<Option<ClusterDuty>>,
    shared: Arc<Shared>,
    task: JoinHandle<()>,
}

impl EtcdInstance {
    /// Starts preparing and then serving `target` until `deadline_ms` (monotonic) unless
    /// extended.
    /// A zone-tolerant control plane's instance is the front end of `replica`, this member's
    /// etcd member of it: no data is prepared and no etcd started; the gate opens once the
    /// cluster answers a linearizable read through it.
    pub fn start(
        runtime: Arc<EtcdRuntime>,
        target: Target,
        deadline_ms: u64,
        replica: Option<ReplicaHandle>,
    ) -> Self {
        Self::launch(runtime, target, deadline_ms, Launch::Start(replica))
    }

    /// Takes over the etcd a previous run of this member left serving (or frozen) under its
    /// guard at `target`'s epoch: no restore, no restart; its backups go on from a full
    /// snapshot taken at once.
    pub(super) fn adopt(
        runtime: Arc<EtcdRuntime>,
        target: Target,
        guard: Guarded,
        status: GuardStatus,
    ) -> Self {
        let deadline_ms = status.deadline_ms;
        Self::launch(runtime, target, deadline_ms, Launch::Adopt(guard, status))
    }

    fn launch(runtime: Arc<EtcdRuntime>, target: Target, deadline_ms: u64, launch: Launch) -> Self {
        let (deadline, deadline_rx) = watch::channel(deadline_ms);
        let (stop, stop_rx) = watch::channel(false);
        let (detach, mut detach_rx) = watch::channel(false);
        let (change, change_rx) = watch::channel(None);
        let shared = Arc::new(Shared {
            view: Mutex::new(View {
                phase: InstancePhase::Preparing,
                healthy: false,
                report: None,
                copy: None,
                etcd_done: None,
                etcd_ids: None,
                gc_hold: Some(Hold::NotServingHere {
                    epoch: target.epoch,
                }),
                unhealthy_since_ms: None,
                failed: None,
            }),
            gate: tokio::sync::Mutex::new(None),
            guard: Mutex::new(None),
            cut_soon: tokio::sync::Notify::new(),
        });
        // Every line the instance logs, the backup code's included, names its control plane
        // and epoch.
        let span = crate::logging::control_plane_span(&target.name, target.epoch);
        let task_shared = shared.clone();
        let task_target = target.clone();
        let work = async move {
            match launch {
                Launch::Start(replica) => {
                    run(
                        runtime,
                        task_target,
                        task_shared,
                        deadline_rx,
                        stop_rx,
                        replica.map(|r| (r, change_rx)),
                    )
                    .await
                }
                Launch::Adopt(guard, status) => {
                    run_adopted(
                        runtime,
                        task_target,
                        task_shared,
                        guard,
                        status,
                        deadline_rx,
                        stop_rx,
                    )
                    .await
                }
            }
        };
        let task = tokio::spawn(
            async move {
                tokio::select! {
                    // Detaching first: the instance's owner is gone (its stop and deadline
                    // senders with it), which the work must not take for a stop.
                    biased;
                    _ = detach_rx.wait_for(|d| *d) => {
                        // Whatever it was doing is dropped; the guard keeps etcd and its
                        // endpoint until the lease's deadline.
                        tracing::info!("left to its guard: the next ringd of this member adopts it");
                    }
                    () = work => {}
                }
            }
            .instrument(span),
        );
        Self {
            target,
            deadline,
            stop,
            detach,
            change,
            shared,
            task,
        }
    }

    /// What this front end is to do for its etcd cluster (zone-tolerant control planes it
    /// hosts only).
    pub fn set_cluster_duty(&self, duty: Option<ClusterDuty>) {
        self.change.send_if_modified(|c| {
            let changed = *c != duty;
            *c = duty;
            changed
        });
    }

    /// Whether its backups may be garbage-collected now (see
    /// [`crate::core::backup_retention::hold`]).
    pub fn set_gc_hold(&self, hold: Option<Hold>) {
        self.shared.view().gc_hold = hold;
    }

    /// etcd's ids of its cluster's members as this front end last listed them: (generation,
    /// ring member -> etcd member id).
    pub fn etcd_ids(&self) -> Option<(u64, BTreeMap<String, u64>)> {
        self.shared.view().etcd_ids.clone()
    }

    /// The last step of its etcd cluster's change this front end did.
    pub fn etcd_change_done(&self) -> Option<(u64, EtcdChangeStep)> {
        self.shared.view().etcd_done
    }

    /// The control plane and epoch.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// Moves the lease deadline later.
    pub fn extend(&self, deadline_ms: u64) {
        self.deadline.send_if_modified(|d| {
            let later = deadline_ms > *d;
            if later {
                *d = deadline_ms;
            }
            later
        });
    }

    /// Moves the lease deadline later, and while etcd serves, its guard's too before this
    /// returns (not only when the instance's task next runs): what a leaving ringd extends
    /// (its farewell renewal's lease) must reach the guard before it exits.
    pub async fn extend_now(&self, deadline_ms: u64) {
        self.extend(deadline_ms);
        let link = self
            .shared
            .guard
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone();
        if let Some(link) = link
            && self.phase() == InstancePhase::Serving
        {
            link.set_deadline(deadline_ms).await;
        }
    }

    /// Asks for a delta snapshot at once (a leaving ringd's last one: what is acknowledged up
    /// to now is in the bucket even if the machine goes down with it); its report's
    /// `up_to_date_unix_ms` says when it is stored.
    pub fn cut_soon(&self) {
        self.shared.cut_soon.notify_one();
    }

    /// Stops serving now (the gate is closed when this returns); the final snapshot and
    /// etcd's stop follow in the instance's task, which [`EtcdInstance::phase`] reports.
    pub async fn stop(&self) {
        let _ = self.stop.send(true);
        self.shared.close_gate().await;
    }

    /// Where the instance is.
    pub fn phase(&self) -> InstancePhase {
        if self.task.is_finished() {
            return InstancePhase::Ended;
        }
        self.shared.view().phase
    }

    /// Why the instance ended by itself, once it has (see [`View::failed`]).
    pub fn failed(&self) -> Option<String> {
        self.shared.view().failed.clone()
    }

    /// What is wrong while it runs: etcd serves but has failed its health checks for
    /// [`UNHEALTHY_PROBLEM_MS`].
    pub fn problem(&self) -> Option<String> {
        let view = self.shared.view();
        let since = view.unhealthy_since_ms?;
        (view.phase == InstancePhase::Serving
            && monotonic_ms().saturating_sub(since) >= UNHEALTHY_PROBLEM_MS)
            .then(|| "etcd runs but does not answer its health checks".to_string())
    }

    /// Whether etcd serves and answered its last health check.
    pub fn healthy(&self) -> bool {
        let view = self.shared.view();
        view.phase == InstancePhase::Serving && view.healthy
    }

    /// The migration report while preparing, and the last one while serving (so the ring
    /// records the snapshot restored and the data-loss window even when the whole preparation
    /// fell between two renewals); none otherwise.
    pub fn migration_report(&self) -> Option<MigrationReport> {
        let view = self.shared.view();
        if !matches!(
            view.phase,
            InstancePhase::Preparing | InstancePhase::Serving
        ) {
            return None;
        }
        let mut report = view.report.clone()?;
        if let Some(copy) = &view.copy {
            report.bytes_copied = report.bytes_copied.max(copy.borrow().bytes_done);
        }
        Some(report)
    }
}

impl Drop for EtcdInstance {
    fn drop(&mut self) {
        // The task ends itself on stop; an instance dropped without one (ringd shutting
        // down) leaves etcd to its guard: the next ringd adopts it, or the guard ends it at
        // the deadline.
        let _ = self.detach.send(true);
    }
}

/// How an instance begins.
enum Launch {
    /// Prepares the data and starts etcd (or fronts this member's etcd member of it).
    Start(Option<ReplicaHandle>),
    /// Takes over an etcd a previous run left under its guard.
    Adopt(Guarded, GuardStatus),
}

/// Why serving ended.
#[derive(Debug)]
enum Ending {
    /// The grant no longer covers it.
    Stopped,
    /// The lease is about to run out without a renewal.
    LeaseRunningOut,
    /// The marker says another member owns the backups now.
    Lost(String),
    /// etcd (or its guard) exited.
    Exited(String),
}

/// Why an instance ended without serving, or stopped serving by itself. The instance is gone
/// either way; the member's next renewal reports the control plane not running, and the
/// leader's grant decides what happens next. (Within `prepare`, what may succeed later is
/// retried by [`Prepare::Retry`] before it ever becomes one of these.)
#[derive(Debug, thiserror::Error)]
enum InstanceError {
    /// Told to stop while preparing the data.
    #[error("stopped while preparing")]
    StoppedWhilePreparing,
    /// The lease ran out while preparing the data.
    #[error("the lease ran out while preparing")]
    LeaseRanOut,
    /// Preparing the data failed for good (see the migration's note).
    #[error("{0}")]
    Prepare(String),
    /// A local file-system operation failed.
    #[error("cannot {what} {}: {source}", path.display())]
    Io {
        /// What was being done.
        what: &'static str,
        /// On what.
        path: PathBuf,
        /// The OS's error.
        source: std::io::Error,
    },
    /// No free loopback port for etcd.
    #[error("cannot find a free port on 127.0.0.1: {0}")]
    NoPort(std::io::Error),
    /// The control plane's endpoint does not resolve.
    #[error("cannot resolve endpoint {endpoint}: {source}")]
    Resolve {
        /// The endpoint.
        endpoint: String,
        /// Why.
        source: std::io::Error,
    },
    /// The endpoint resolves to nothing.
    #[error("endpoint {0} resolves to no address")]
    NoAddress(String),
    /// etcd could not be started under its guard.
    #[error(transparent)]
    Spawn(#[from] DriverError),
    /// etcd exited before it answered.
    #[error("etcd exited while starting: {0}")]
    ExitedWhileStarting(String),
    /// etcd did not answer in time.
    #[error("etcd did not answer on {client_url} within {timeout_ms} ms")]
    StartTimeout {
        /// Where it was asked.
        client_url: String,
        /// How long it had.
        timeout_ms: u64,
    },
    /// The control plane's public endpoint could not be opened.
    #[error(transparent)]
    Gate(#[from] super::gate::GateError),
    /// The guard could not open the control plane's public endpoint.
    #[error("the guard cannot open the endpoint {public}: {why}")]
    GuardGate {
        /// The public address.
        public: SocketAddr,
        /// What the guard said.
        why: String,
    },
    /// This member's backup location is unusable.
    #[error(transparent)]
    Location(#[from] crate::backup::location::LocationError),
}

async fn run(
    runtime: Arc<EtcdRuntime>,
    target: Target,
    shared: Arc<Shared>,
    mut deadline: watch::Receiver<u64>,
    mut stop: watch::Receiver<bool>,
    replica: Option<(ReplicaHandle, watch::Receiver<Option<ClusterDuty>>)>,
) {
    let name = target.name.clone();
    let epoch = target.epoch;
    let dir = runtime.epoch_dir(&name, epoch);
    // However the instance ends, its snapshot age and backup report stop being reported.
    struct Forget<'a>(&'a EtcdRuntime, &'a str, u64);
    impl Drop for Forget<'_> {
        fn drop(&mut self) {
            self.0.snapshots.forget(self.1, self.2);
            self.0.backups.forget(self.1, self.2);
        }
    }
    let _forget = Forget(&runtime, &name, epoch);
    // The stored chain the restored etcd continues, if any.
    let mut resume = None;
    // This epoch's data from an earlier run of this member (not restored now from the bucket).
    let data_was_here = replica.is_none() && dir.join("etcd").is_dir();
    if replica.is_some() {
        // The etcd cluster holds the data: nothing to copy or restore, nothing lost.
        shared.report(MigrationStep::Starting, |r| {
            r.data_loss_window_ms = Some(0);
            r.note = ZONE_TOLERANT_NOTE.into();
        });
    } else if !dir.join("etcd").is_dir() {
        let prepared = tokio::select! {
            prepared = prepare(&runtime, &target, &shared) => prepared,
            _ = stopped(&mut stop) => Err(InstanceError::StoppedWhilePreparing),
            _ = lease_runs_out(&mut deadline, 0) => Err(InstanceError::LeaseRanOut),
        };
        match prepared {
            Ok(chain) => resume = chain,
            Err(why) => {
                tracing::warn!("not started: {why}");
                if !matches!(
                    why,
                    InstanceError::StoppedWhilePreparing | InstanceError::LeaseRanOut
                ) {
                    shared.view().failed = Some(format!("not started: {why}"));
                }
                shared.set_phase(InstancePhase::Ended);
                return;
            }
        }
    } else {
        tracing::info!(dir = %dir.display(), "data of this epoch is here already: etcd starts on it");
    }
    shared.report(MigrationStep::Starting, |_| {});
    let served = match replica {
        Some((replica, change)) => {
            front(
                &runtime,
                &target,
                &shared,
                replica,
                change,
                &mut deadline,
                &mut stop,
            )
            .await
        }
        None => {
            serve(
                &runtime,
                &target,
                &shared,
                resume,
                data_was_here,
                &mut deadline,
                &mut stop,
            )
            .await
        }
    };
    let ending = match served {
        Ok(ending) => ending,
        Err(why) => {
            tracing::error!("{why}");
            shared.close_gate().await;
            shared.view().failed = Some(why.to_string());
            shared.set_phase(InstancePhase::Ended);
            return;
        }
    };
    if let Ending::Exited(status) = &ending {
        shared.view().failed = Some(format!("etcd exited while serving: {status}"));
    }
    shared.set_phase(InstancePhase::Ended);
    tracing::info!("etcd stopped ({ending:?})");
}

/// Serves the etcd a previous run of this member left under `guard` (see
/// [`EtcdInstance::adopt`]).
async fn run_adopted(
    runtime: Arc<EtcdRuntime>,
    target: Target,
    shared: Arc<Shared>,
    guard: Guarded,
    status: GuardStatus,
    mut deadline: watch::Receiver<u64>,
    mut stop: watch::Receiver<bool>,
) {
    let name = target.name.clone();
    let epoch = target.epoch;
    struct Forget<'a>(&'a EtcdRuntime, &'a str, u64);
    impl Drop for Forget<'_> {
        fn drop(&mut self) {
            self.0.snapshots.forget(self.1, self.2);
            self.0.backups.forget(self.1, self.2);
        }
    }
    let _forget = Forget(&runtime, &name, epoch);
    shared.report(MigrationStep::Starting, |r| {
        r.note = "adopted from this member's previous ringd: no restore, no restart".into();
    });
    *shared.guard.lock().unwrap_or_else(|e| e.into_inner()) = Some(guard.link());
    let mut backend = Backend::Own(guard);
    let Some(relay_to) = status.target else {
        tracing::error!("the guard names no address of its etcd; stopping it");
        backend.stop(runtime.timing.fence_ms).await;
        shared.set_phase(InstancePhase::Ended);
        return;
    };
    tracing::info!(
        pid = status.pid,
        frozen = status.frozen,
        gate_open = status.gate_open,
        "adopting the etcd on {relay_to} left by this member's previous ringd"
    );
    let client_options = EtcdClientOptions {
        connect_timeout_ms: 500,
        request_timeout_ms: runtime.timing.workload_request_timeout_ms(),
        ..EtcdClientOptions::default()
    };
    let client_url = format!("http://{relay_to}");
    // A frozen etcd answers once a grant thaws it: until then, only the deadline moves.
    let client = loop {
        if let Ok(client) = EtcdClient::connect(&client_url, client_options).await {
            break client;
        }
        tokio::select! {
            _ = stopped(&mut stop) => {
                backend.stop(runtime.timing.fence_ms).await;
                shared.set_phase(InstancePhase::Ended);
                return;
            }
            status = backend.ended() => {
                shared.view().failed = Some(format!("etcd exited while being adopted: {status}"));
                shared.set_phase(InstancePhase::Ended);
                return;
            }
            changed = deadline.changed() => {
                if changed.is_ok() {
                    let d = *deadline.borrow_and_update();
                    backend.set_deadline(d).await;
                }
            }
            () = tokio::time::sleep(Duration::from_millis(50)) => {}
        }
    };
    let served = behind_gate(
        &runtime,
        &target,
        &shared,
        client,
        relay_to,
        backend,
        None,
        &mut deadline,
        &mut stop,
    )
    .await;
    match served {
        Ok(Ending::Exited(status)) => {
            shared.view().failed = Some(format!("etcd exited while serving: {status}"));
        }
        Ok(ending) => tracing::info!("etcd stopped ({ending:?})"),
        Err(why) => {
            tracing::error!("{why}");
            shared.close_gate().await;
            shared.view().failed = Some(why.to_string());
        }
    }
    shared.set_phase(InstancePhase::Ended);
}

/// Resolves once `stop` is set. Never when its sender is gone: the instance was dropped
/// (its ringd leaves), which sets `detach` first, and the task may be polled on another
/// thread at that moment; a stop taken from the drop would close the gate the guard keeps
/// open for the next ringd.
async fn stopped(stop: &mut watch::Receiver<bool>) {
    if stop.wait_for(|s| *s).await.is_err() {
        std::future::pending::<()>().await;
    }
}

/// Prepares the data of `target` at its epoch, retrying what may succeed later. Returns the
/// stored chain the restored etcd continues, if it may ([`Backups::resume`]).
async fn prepare(
    runtime: &EtcdRuntime,
    target: &Target,
    shared: &Shared,
) -> Result<Option<Resume>, InstanceError> {
    let mut backoff_ms = FIRST_PREPARE_BACKOFF_MS;
    // Streams (a full snapshot and the deltas after it) the migration copies: the newest, and
    // one more each time every copied full snapshot failed to verify.
    let mut streams = 1;
    loop {
        match prepare_once(runtime, target, shared, streams).await {
            Ok(resume) => return Ok(resume),
            Err(Prepare::CopyMore(why)) => {
                streams += 1;
                tracing::warn!("{why}: copying {streams} streams of snapshots");
                shared.note(format!("{why}: copying {streams} streams of snapshots"));
            }
            Err(Prepare::Fatal(why)) => {
                shared.note(why.clone());
                return Err(InstanceError::Prepare(why));
            }
            Err(Prepare::Retry(why)) => {
                tracing::warn!("preparing the data: {why}; again in {backoff_ms} ms");
                shared.note(format!("retrying in {backoff_ms} ms: {why}"));
                tokio::time::sleep(Duration::from_millis(backoff_ms)).await;
                backoff_ms = (backoff_ms * 2).min(MAX_PREPARE_BACKOFF_MS);
            }
        }
    }
}

enum Prepare {
    Retry(String),
    Fatal(String),
    /// No full snapshot copied verifies, and the source has older ones: copy one more stream.
    CopyMore(String),
}

async fn prepare_once(
    runtime: &EtcdRuntime,
    target: &Target,
    shared: &Shared,
    streams: usize,
) -> Result<Option<Resume>, Prepare> {
    let fatal = |e: &dyn std::fmt::Display| Prepare::Fatal(e.to_string());
    let destination =
        BackupLocation::parse(&target.backup, &runtime.backup).map_err(|e| fatal(&e))?;
    let (source, from, started_unix_ms) = match &target.migration {
        Some(m) => (
            BackupLocation::parse(&m.source, &runtime.backup).map_err(|e| fatal(&e))?,
            m.from.clone(),
            m.started_unix_ms,
        ),
        // Every placement records its migration (from nowhere for a new control plane): without
        // one, this member cannot tell a new control plane from a moved one, and starting it
        // empty could lose its data. The agent builds a new target next round.
        None => {
            return Err(Prepare::Fatal(format!(
                "no record of the move of {} to this member at epoch {}: not starting",
                target.name, target.epoch
            )));
        }
    };
    let plan = MigrationPlan {
        control_plane: target.name.clone(),
        epoch: target.epoch,
        from: from.clone(),
        to: runtime.member.clone(),
        started_unix_ms,
    };
    let (progress, progress_rx) = watch::channel(CopyProgress::default());
    set_copy_progress(shared, progress_rx);
    shared.report(MigrationStep::Copying, |_| {});
    // The restore needs the newest full snapshot and the deltas after it, not the whole
    // history (the source keeps it: DESIGN.md rule 4).
    let options = CopyOptions {
        progress: Some(progress),
        newest_fulls: Some(streams),
        ..CopyOptions::new(&runtime.backup)
    };
    let migrated = migrate(&source, &destination, &plan, &options, unix_ms)
        .await
        .map_err(|e| match e {
            MigrateError::Superseded { .. } => Prepare::Fatal(e.to_string()),
            e if e.is_retryable() => Prepare::Retry(e.to_string()),
            e => Prepare::Fatal(e.to_string()),
        })?;
    let copied = migrated.copy.bytes_copied;
    // `.final` is stripped in the copy (like `etcdbrctl copy`): remember which were final.
    let finals: BTreeSet<String> = migrated
        .copy
        .copied
        .iter()
        .map(|c| (&c.source, &c.destination))
        .chain(
            migrated
                .copy
                .skipped
                .iter()
                .map(|s| (&s.source, &s.destination)),
        )
        .filter(|(source, _)| source.name().is_final())
        .map(|(_, destination)| destination.name().to_string())
        .collect();
    if !migrated.copy.copied.is_empty() {
        tracing::info!(
            "copied {} snapshots ({copied} bytes) from {source} to {destination}; {} older ones left there",
            migrated.copy.copied.len(),
            migrated.copy.left_out
        );
    }
    let left_out = migrated.copy.left_out;
    shared.report(MigrationStep::Restoring, |r| r.bytes_copied = copied);

    let dir = runtime.epoch_dir(&target.name, target.epoch);
    let restoring = dir.with_extension("restoring");
    remove_dir_if_there(&restoring).map_err(|e| fatal(&e))?;
    std::fs::create_dir_all(&restoring)
        .map_err(|e| fatal(&format!("cannot create {}: {e}", restoring.display())))?;
    let tool = RestoreTool::detect(&runtime.bin_dir).map_err(|e| fatal(&e))?;
    let peer_url = format!("http://127.0.0.1:{}", free_port().map_err(|e| fatal(&e))?);
    let now = unix_ms();
    let options = RestoreOptions {
        data_dir: restoring.join("etcd"),
        member_name: target.name.clone(),
        peer_url,
        tool,
        now_unix_s: now / 1000,
        tool_timeout_ms: runtime.settings.restore_timeout_ms,
        only: if from.is_some() {
            migrated.from_source()
        } else {
            None
        },
        replay_with: Some(runtime.bin_dir.join("etcd")),
    };
    let resume = match restore_newest(&destination.store(), destination.prefix(), &options).await {
        Ok(restored) => {
            let newest = restored.newest_applied();
            let is_final = restored.is_final || finals.contains(&newest.name().to_string());
            let window_ms = if is_final {
                0
            } else {
                now.saturating_sub(restored.created_unix_s * 1000)
            };
            let mut notes = Vec::new();
            if !restored.deltas.is_empty() {
                notes.push(format!(
                    "{} + {} delta(s) to revision {}",
                    restored.snapshot.name(),
                    restored.deltas.len(),
                    restored.revision
                ));
            }
            if let Some(stopped) = &restored.replay_stopped {
                notes.push(format!(
                    "replay stopped before {}: {}",
                    stopped.name, stopped.why
                ));
            }
            if !restored.skipped_bad.is_empty() {
                notes.push(format!(
                    "skipped {} full snapshot(s) that do not verify, newest {}: {}",
                    restored.skipped_bad.len(),
                    restored.skipped_bad[0].name,
                    restored.skipped_bad[0].why
                ));
            }
            let note = notes.join("; ");
            if restored.replay_stopped.is_some() || !restored.skipped_bad.is_empty() {
                tracing::warn!("{note}");
            }
            tracing::info!(
                "restored {} and {} delta(s) (revision {}, newest {newest}, final: {is_final}, data-loss window {window_ms} ms, replay {} ms)",
                restored.snapshot,
                restored.deltas.len(),
                restored.revision,
                restored.replay_ms,
            );
            shared.report(MigrationStep::Starting, |r| {
                r.restored = Some(newest.to_string());
                r.data_loss_window_ms = Some(window_ms);
                r.note = note_text(&note);
            });
            resumable(&restored)
        }
        Err(RestoreError::NoSnapshot { .. }) if from.is_none() => {
            // Never served anywhere and nothing to restore: a new, empty etcd.
            remove_dir_if_there(&restoring.join("etcd")).map_err(|e| fatal(&e))?;
            create_private_dir(&restoring.join("etcd")).map_err(|e| fatal(&e))?;
            shared.report(MigrationStep::Starting, |r| {
                r.data_loss_window_ms = Some(0);
                r.note = "no snapshot: a new, empty etcd".into();
            });
            None
        }
        Err(RestoreError::NoSnapshot { .. }) => {
            return Err(Prepare::Retry(format!(
                "no snapshot in {destination} although {} served it: not starting an empty etcd \
                 (remove and add the control plane again to start it empty)",
                from.as_deref().unwrap_or_default()
            )));
        }
        Err(e @ RestoreError::NoUsableSnapshot { .. }) if left_out > 0 => {
            return Err(Prepare::CopyMore(e.to_string()));
        }
        // Retried with backoff even when not retryable (a missing tool, a snapshot of the wrong
        // cluster): ending the instance would only have the agent start it again next round.
        Err(e) => return Err(Prepare::Retry(e.to_string())),
    };
    // Into place in one rename: a data directory exists only once it is complete.
    remove_dir_if_there(&dir).map_err(|e| fatal(&e))?;
    std::fs::rename(&restoring, &dir).map_err(|e| {
        fatal(&format!(
            "cannot rename {} to {}: {e}",
            restoring.display(),
            dir.display()
        ))
    })?;
    if let Some(parent) = dir.parent() {
        crate::durable::sync_dir(parent)
            .map_err(|e| fatal(&format!("cannot sync {}: {e}", parent.display())))?;
    }
    Ok(resume)
}

/// The chain a restored etcd may continue with its deltas: the full snapshot and deltas it was
/// restored from, when they are the whole story of the location. Not when the replay stopped
/// early or deltas were left out (a delta of this etcd would start where other deltas already
/// are), nor next to a newer full snapshot that did not verify or snapshots that are not the
/// source's history (a later restore could prefer them, or join them to this chain): then
/// the host starts a chain of its own with a full snapshot at once.
fn resumable(restored: &crate::backup::restore::Restored) -> Option<Resume> {
    let why_not = if restored.replay_stopped.is_some() {
        "the replay stopped early"
    } else if restored.unapplied_incr > 0 {
        "deltas were left out"
    } else if !restored.skipped_bad.is_empty() {
        "a newer full snapshot does not verify"
    } else if restored.foreign_newer > 0 {
        "newer snapshots that are not the source's history are there"
    } else {
        let full_revision = restored.snapshot.name().last_revision();
        return Some(Resume {
            full: restored.snapshot.to_string(),
            full_revision,
            deltas: restored.deltas.len() as u64,
            revision: restored.revision.max(full_revision),
        });
    };
    tracing::info!("{why_not}: the backups start again with a full snapshot at once");
    None
}

/// Creates `dir` readable by this user only, as etcd wants its data directory.
fn create_private_dir(dir: &Path) -> Result<(), InstanceError> {
    use std::os::unix::fs::DirBuilderExt;
    std::fs::DirBuilder::new()
        .recursive(true)
        .mode(0o700)
        .create(dir)
        .map_err(|source| InstanceError::Io {
            what: "create",
            path: dir.to_path_buf(),
            source,
        })
}

fn remove_dir_if_there(dir: &Path) -> Result<(), InstanceError> {
    super::etcd_runtime::remove_dir_if_there(dir).map_err(|source| InstanceError::Io {
        what: "remove",
        path: dir.to_path_buf(),
        source,
    })
}

/// A free TCP port on loopback (the OS picks it; etcd binds it a moment later).
fn free_port() -> Result<u16, InstanceError> {
    super::etcd_runtime::free_port().map_err(InstanceError::NoPort)
}

async fn resolve(endpoint: &str) -> Result<SocketAddr, InstanceError> {
    if let Ok(address) = endpoint.parse() {
        return Ok(address);
    }
    tokio::net::lookup_host(endpoint)
        .await
        .map_err(|source| InstanceError::Resolve {
            endpoint: endpoint.to_string(),
            source,
        })?
        .next()
        .ok_or_else(|| InstanceError::NoAddress(endpoint.to_string()))
}

/// Starts etcd on the prepared data, serves it until told to stop, then stops it.
async fn serve(
    runtime: &Arc<EtcdRuntime>,
    target: &Target,
    shared: &Shared,
    resume: Option<Resume>,
    data_was_here: bool,
    deadline: &mut watch::Receiver<u64>,
    stop: &mut watch::Receiver<bool>,
) -> Result<Ending, InstanceError> {
    let name = &target.name;
    let epoch = target.epoch;
    let client_port = free_port()?;
    let peer_port = free_port()?;
    let client_url = format!("http://127.0.0.1:{client_port}");
    let peer_url = format!("http://127.0.0.1:{peer_port}");
    let dir = runtime.epoch_dir(name, epoch);
    let mut argv: Vec<String> = vec![
        runtime.bin_dir.join("etcd").display().to_string(),
        "--name".into(),
        name.clone(),
        "--data-dir".into(),
        dir.join("etcd").display().to_string(),
        "--listen-client-urls".into(),
        client_url.clone(),
        "--advertise-client-urls".into(),
        client_url.clone(),
        "--listen-peer-urls".into(),
        peer_url.clone(),
        "--initial-advertise-peer-urls".into(),
        peer_url.clone(),
        "--initial-cluster".into(),
        format!("{name}={peer_url}"),
        "--logger".into(),
        "zap".into(),
        "--log-level".into(),
        "error".into(),
    ];
    argv.extend(runtime.settings.etcd_health_flags());
    let env = [
        ("GARDEN_RING_CONTROL_PLANE", name.clone()),
        ("GARDEN_RING_EPOCH", epoch.to_string()),
        ("GARDEN_RING_MEMBER", runtime.member.clone()),
    ];
    let deadline_ms = *deadline.borrow();
    // Frozen, not stopped, when the lease runs out: the endpoint (the gate, closed then) is the
    // only way to this etcd, and a lease that comes back thaws it without a restart. A frozen
    // etcd serves nothing whatever happens meanwhile (only a grant at this epoch thaws it, and
    // a move ends those), so the hold's bound only gives its memory back: four times
    // `member_lost_ms`, long after the ring would have moved it, long enough for a lossy link
    // whose renewals fail for seconds without the member falling silent.
    let limits = GuardLimits {
        fence_ms: runtime.timing.fence_ms,
        hold_ms: runtime
            .timing
            .member_lost_ms
            .saturating_mul(HOLD_MEMBER_LOST_TIMES),
    };
    // The guard keeps the public endpoint (closed until the gate opens below), so that
    // clients' connections outlive this ringd.
    let public = resolve(&target.endpoint).await?;
    let relay_to = SocketAddr::from(([127, 0, 0, 1], client_port));
    let mut guard = Guarded::spawn(
        &runtime.guard_binary,
        limits,
        &dir,
        (public, relay_to),
        &argv,
        &env,
        deadline_ms,
        name,
        epoch,
    )
    .await?;
    *shared.guard.lock().unwrap_or_else(|e| e.into_inner()) = Some(guard.link());

    // Wait until etcd answers.
    let client_options = EtcdClientOptions {
        connect_timeout_ms: 500,
        request_timeout_ms: runtime.timing.workload_request_timeout_ms(),
        ..EtcdClientOptions::default()
    };
    let started = monotonic_ms();
    let margin_ms = runtime.timing.self_fence_margin_ms();
    let mut final_logged = false;
    let client = loop {
        if stop.has_changed().unwrap_or(true) && *stop.borrow() {
            // Data that was here already may hold writes the bucket lacks: etcd is started on
            // for a final snapshot (the gate stays closed), while the lease lasts.
            if !data_was_here || monotonic_ms() + margin_ms >= *deadline.borrow() {
                guard.stop(runtime.timing.fence_ms).await;
                return Ok(Ending::Stopped);
            }
            if !final_logged {
                tracing::info!(
                    "told to stop while etcd starts on data that was here already: a final snapshot of it first, the endpoint stays closed"
                );
                final_logged = true;
            }
        }
        if let Some(status) = guard.exited() {
            return Err(InstanceError::ExitedWhileStarting(status));
        }
        if deadline.has_changed().unwrap_or(false) {
            let d = *deadline.borrow_and_update();
            guard.set_deadline(d).await;
        }
        if let Ok(client) = EtcdClient::connect(&client_url, client_options).await
            && client.status().await.is_ok()
        {
            break client;
        }
        if monotonic_ms() - started > runtime.settings.start_timeout_ms {
            guard.stop(runtime.timing.fence_ms).await;
            return Err(InstanceError::StartTimeout {
                client_url,
                timeout_ms: runtime.settings.start_timeout_ms,
            });
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    };
    tracing::info!("etcd runs on {client_url} (data in {})", dir.display());
    behind_gate(
        runtime,
        target,
        shared,
        client,
        relay_to,
        Backend::Own(guard),
        resume,
        deadline,
        stop,
    )
    .await
}

/// What an instance's etcd is: its own process (under its guard), or this member's etcd member
/// of a zone-tolerant control plane, which runs on and which the instance only fronts (with
/// the step of its cluster's change to carry out).
enum Backend {
    Own(Guarded),
    Replica(ReplicaHandle, watch::Receiver<Option<ClusterDuty>>),
}

impl Backend {
    /// Resolves when the etcd behind the gate ends, with how.
    async fn ended(&mut self) -> String {
        match self {
            Backend::Own(guard) => guard.wait().await,
            Backend::Replica(replica, _) => {
                let _ = replica.client_url.wait_for(Option::is_none).await;
                "this member's etcd member stopped".into()
            }
        }
    }

    async fn set_deadline(&mut self, deadline_ms: u64) {
        if let Backend::Own(guard) = self {
            guard.set_deadline(deadline_ms).await;
        }
    }

    /// Opens the public endpoint `public` to etcd at `relay_to` until the lease's `deadline`:
    /// the guard's gate for an own etcd, one in this process for an etcd member.
    async fn open_gate(
        &self,
        public: SocketAddr,
        relay_to: SocketAddr,
        deadline: watch::Receiver<u64>,
    ) -> Result<OpenGate, InstanceError> {
        match self {
            Backend::Own(guard) => guard
                .open_gate()
                .await
                .map(OpenGate::Guarded)
                .map_err(|why| InstanceError::GuardGate { public, why }),
            Backend::Replica(..) => Gate::open(public, relay_to, deadline)
                .await
                .map(OpenGate::Local)
                .map_err(InstanceError::Gate),
        }
    }

    /// Stops an own etcd; an etcd member runs on.
    async fn stop(&mut self, fence_ms: u64) {
        if let Backend::Own(guard) = self {
            guard.stop(fence_ms).await;
        }
    }

    /// Whether etcd answers: a status for an own etcd, a linearizable read (which needs a
    /// quorum of the cluster) for an etcd member.
    async fn answers(&self, client: &EtcdClient) -> bool {
        match self {
            Backend::Own(_) => client.status().await.is_ok(),
            Backend::Replica(..) => client.get(HEALTH_KEY).await.is_ok(),
        }
    }

    /// Does the duty of the host for its etcd cluster: the step of its change that waits, if
    /// any and not done yet; then, until they are all known at this generation, etcd's ids of
    /// its members.
    async fn keep_cluster(&self, client: &EtcdClient, shared: &Shared, scheme: &str) {
        let Backend::Replica(_, duty) = self else {
            return;
        };
        let Some(duty) = duty.borrow().clone() else {
            return;
        };
        let change = duty
            .change
            .as_ref()
            .filter(|c| shared.view().etcd_done != Some((c.generation, c.step)));
        let ids_known = shared
            .view()
            .etcd_ids
            .as_ref()
            .is_some_and(|(g, ids)| *g == duty.generation && ids.len() == duty.peers.len());
        if change.is_none() && ids_known {
            return;
        }
        // One member list serves both.
        let members = match client.member_list().await {
            Ok(members) => members,
            Err(e) => {
                match change {
                    Some(c) => tracing::warn!(
                        "etcd cluster change ({} of {} -> {}): {e}; again shortly",
                        c.step,
                        c.removed,
                        c.added
                    ),
                    None => tracing::debug!("etcd member list: {e}; again shortly"),
                }
                return;
            }
        };
        if !ids_known {
            let ids = super::etcd_membership::ids(&members, &duty, scheme);
            shared.view().etcd_ids = Some((duty.generation, ids));
        }
        if let Some(change) = change {
            match super::etcd_membership::carry_out(client, &members, change, scheme).await {
                Ok(true) => shared.view().etcd_done = Some((change.generation, change.step)),
                Ok(false) => {}
                Err(e) => tracing::warn!(
                    "etcd cluster change ({} of {} -> {}): {e}; again shortly",
                    change.step,
                    change.removed,
                    change.added
                ),
            }
        }
    }
}

/// How often a front end tries the step of its etcd cluster's change, ms.
const ETCD_CHANGE_INTERVAL_MS: u64 = 500;

/// The key a zone-tolerant front end reads (linearizably) to tell that its cluster has a
/// quorum; it need not exist.
const HEALTH_KEY: &[u8] = b"/garden-ring/health";

/// Fronts this member's etcd member of a zone-tolerant control plane: once the cluster answers
/// a linearizable read through it, the gate opens on the public endpoint and the backups are
/// taken, as for an own etcd, until told to stop; etcd itself runs on.
async fn front(
    runtime: &Arc<EtcdRuntime>,
    target: &Target,
    shared: &Shared,
    mut replica: ReplicaHandle,
    change: watch::Receiver<Option<ClusterDuty>>,
    deadline: &mut watch::Receiver<u64>,
    stop: &mut watch::Receiver<bool>,
) -> Result<Ending, InstanceError> {
    let client_options = EtcdClientOptions {
        connect_timeout_ms: 500,
        request_timeout_ms: runtime.timing.workload_request_timeout_ms(),
        ..EtcdClientOptions::default()
    };
    let started = monotonic_ms();
    let mut waiting_logged = false;
    let (client, relay_to) = loop {
        if *stop.borrow() {
            return Ok(Ending::Stopped);
        }
        if monotonic_ms() >= *deadline.borrow() {
            return Ok(Ending::LeaseRunningOut);
        }
        if replica.client_url.has_changed().is_err() {
            // The etcd member this front end was given ended (its lease ran out as this one
            // started): end too, and the agent starts one for the member that runs now.
            return Ok(Ending::Exited("this member's etcd member ended".into()));
        }
        let url = replica.client_url.borrow_and_update().clone();
        if let Some(url) = url
            && let Ok(client) = EtcdClient::connect(&url, client_options).await
            && client.get(HEALTH_KEY).await.is_ok()
        {
            let relay_to = url
                .trim_start_matches("http://")
                .parse::<SocketAddr>()
                .map_err(|e| InstanceError::Resolve {
                    endpoint: url.clone(),
                    source: std::io::Error::new(std::io::ErrorKind::InvalidInput, e),
                })?;
            break (client, relay_to);
        }
        if !waiting_logged && monotonic_ms() - started > 1_000 {
            tracing::warn!(
                "waiting for this member's etcd member to answer a linearizable read (its cluster needs a quorum)"
            );
            shared.note(format!(
                "{ZONE_TOLERANT_NOTE}; waiting for the etcd cluster to answer a linearizable read"
            ));
            waiting_logged = true;
        }
        tokio::select! {
            _ = tokio::time::sleep(Duration::from_millis(50)) => {}
            _ = stopped(stop) => return Ok(Ending::Stopped),
        }
    };
    tracing::info!(
        "the etcd cluster answered a linearizable read through {relay_to} after {} ms",
        monotonic_ms() - started
    );
    if waiting_logged {
        shared.note(ZONE_TOLERANT_NOTE.into());
    }
    behind_gate(
        runtime,
        target,
        shared,
        client,
        relay_to,
        Backend::Replica(replica, change),
        None,
        deadline,
        stop,
    )
    .await
}

/// Opens the gate on the public endpoint to `relay_to` (where `client` reaches etcd), takes
/// the backups, checks health, and when told to stop (or the lease is about to run out)
/// closes the gate first, then takes the final snapshot and stops an own etcd.
#[allow(clippy::too_many_arguments)]
async fn behind_gate(
    runtime: &Arc<EtcdRuntime>,
    target: &Target,
    shared: &Shared,
    client: EtcdClient,
    relay_to: SocketAddr,
    mut backend: Backend,
    resume: Option<Resume>,
    deadline: &mut watch::Receiver<u64>,
    stop: &mut watch::Receiver<bool>,
) -> Result<Ending, InstanceError> {
    let name = &target.name;
    let epoch = target.epoch;
    let public = match resolve(&target.endpoint).await {
        Ok(public) => public,
        Err(e) => {
            backend.stop(runtime.timing.fence_ms).await;
            return Err(e);
        }
    };
    let own = match BackupLocation::parse(&target.backup, &runtime.backup) {
        Ok(own) => own,
        Err(e) => {
            backend.stop(runtime.timing.fence_ms).await;
            return Err(e.into());
        }
    };
    let mut backups = Backups::new(runtime.clone(), target.clone(), client.clone(), own);
    // Before the gate opens, so that no write is acknowledged before the watch of the
    // continued chain runs (it would be delivered all the same, from etcd's history). Without
    // deltas there is no chain to continue.
    let resume = resume.filter(|_| runtime.settings.delta_snapshot_period_ms > 0);
    let resumed = match &resume {
        Some(chain) => match backups.resume(chain).await {
            Ok(()) => {
                tracing::info!(
                    "the backups continue the restored chain: {} + {} delta(s) to revision {}; the next delta starts at revision {}",
                    chain.full,
                    chain.deltas,
                    chain.revision,
                    chain.revision + 1
                );
                true
            }
            Err(why) => {
                tracing::warn!(
                    "cannot continue the restored chain ({why}): a full snapshot at once"
                );
                false
            }
        },
        None => false,
    };
    // Told to stop before the gate opened (a leaving ringd, while etcd started on data that was
    // here already): the gate stays closed and the final snapshot below stores what that data
    // holds, which the bucket may not (writes acknowledged after the last delta of an earlier
    // run whose etcd ended without a final snapshot).
    let mut gate_ran_out = if *stop.borrow() {
        shared.set_phase(InstancePhase::Stopping);
        watch::channel(false).1
    } else {
        let gate = match backend.open_gate(public, relay_to, deadline.clone()).await {
            Ok(gate) => gate,
            Err(e) => {
                backend.stop(runtime.timing.fence_ms).await;
                return Err(e);
            }
        };
        let ran_out = gate.ran_out();
        *shared.gate.lock().await = Some(gate);
        shared.set_phase(InstancePhase::Serving);
        set_healthy(shared, true);
        tracing::info!("etcd serves on {public}");
        if matches!(backend, Backend::Own(_)) {
            remove_older_epochs(runtime, name, epoch);
        }
        ran_out
    };

    let full_interval = Duration::from_millis(runtime.settings.full_snapshot_interval_ms);
    let delta_period_ms = runtime.settings.delta_snapshot_period_ms;
    let delta_period = Duration::from_millis(delta_period_ms.max(1));
    // After a failed full snapshot (or a lost watch) the next one comes soon, not an hour later.
    let full_retry = full_interval.min(Duration::from_millis(delta_period_ms.clamp(1_000, 5_000)));
    // A continued chain has its full snapshot (unless compaction is due already); a new one
    // starts with one.
    let mut next_full = tokio::time::Instant::now();
    if resumed && backups.compaction_due().is_none() {
        next_full += full_interval;
    }
    let mut next_delta = tokio::time::Instant::now() + delta_period;
    let mut last_cut_failed = false;
    let mut health = tokio::time::interval(Duration::from_millis(
        runtime.timing.workload_health_interval_ms(),
    ));
    health.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let margin_ms = runtime.timing.self_fence_margin_ms();
    let mut deadline_for_guard = deadline.clone();
    let fronts_replica = matches!(backend, Backend::Replica(..));
    let mut change_tick = tokio::time::interval(Duration::from_millis(ETCD_CHANGE_INTERVAL_MS));
    change_tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let gc_period_ms = runtime.settings.garbage_collection_period_ms;
    let retention = runtime.settings.retention();
    let mut next_gc = tokio::time::Instant::now() + Duration::from_millis(gc_period_ms.max(1));
    let defrag_interval_ms = runtime.settings.defragmentation_interval_ms;
    let mut next_defrag =
        tokio::time::Instant::now() + Duration::from_millis(defrag_interval_ms.max(1));
    // The full snapshot running beside the loop, if any.
    let mut full_job: Option<FullJob> = None;
    // Whether another full snapshot must follow the running one (a defragmentation came
    // meanwhile). Other reasons (the interval, compaction, a lost watch) the running one meets.
    let mut full_after_job = false;
    let ending = 'serve: loop {
        let ending = loop {
            // Before anything else: a branch that waited (a health check on an etcd the guard
            // froze) may have let the lease run out, and a cut chosen now would find it run out
            // ("not uploading") and end the instance as if it had lost ownership.
            if monotonic_ms() + margin_ms >= *deadline.borrow() {
                break Ending::LeaseRunningOut;
            }
            if *stop.borrow() {
                break Ending::Stopped;
            }
            tokio::select! {
                _ = stopped(stop) => break Ending::Stopped,
                _ = lease_runs_out(deadline, margin_ms) => break Ending::LeaseRunningOut,
                // The gate closed itself at the deadline while this loop did not run (the host
                // was frozen past its lease and a renewal came at once after the thaw): a lapse
                // all the same; the gate opens again through the hold below.
                // (A gate closed by the driver, which drops the sender, is not this.)
                _ = async {
                    if gate_ran_out.wait_for(|r| *r).await.is_err() {
                        std::future::pending::<()>().await;
                    }
                } => break Ending::LeaseRunningOut,
                status = backend.ended() => break Ending::Exited(status),
                changed = deadline_for_guard.changed() => {
                    if changed.is_ok() {
                        let d = *deadline_for_guard.borrow_and_update();
                        backend.set_deadline(d).await;
                    }
                }
                _ = tokio::time::sleep_until(next_full), if full_job.is_none() => {
                    full_job = Some(FullJob {
                        started_unix_ms: unix_ms(),
                        handle: tokio::spawn(backups.full_job(deadline).in_current_span()),
                    });
                }
                joined = async { (&mut full_job.as_mut().expect("guarded").handle).await }, if full_job.is_some() => {
                    let started_unix_ms = full_job.take().map_or(0, |job| job.started_unix_ms);
                    let stored = joined.unwrap_or_else(|e| Err(StoreError::Task(e.to_string())));
                    if let Ok(stored) = &stored {
                        backups.full_done(stored, started_unix_ms, false).await;
                    }
                    let next_interval = if std::mem::take(&mut full_after_job) {
                        Duration::ZERO
                    } else {
                        full_interval
                    };
                    match stored {
                        Ok(Stored::Taken(taken)) => {
                            tracing::debug!("full snapshot {} ({} bytes)", taken.location, taken.stored_size_bytes);
                            next_full = tokio::time::Instant::now() + next_interval;
                        }
                        Ok(Stored::Lost(lost)) => break lost_or_lapsed(deadline, lost),
                        Ok(Stored::Nothing) => next_full = tokio::time::Instant::now() + next_interval,
                        Err(e) => {
                            tracing::warn!("full snapshot failed: {e}; again in {} ms", full_retry.as_millis());
                            next_full = tokio::time::Instant::now() + full_retry;
                        }
                    }
                    publish(runtime, target, &backups);
                }
                message = backups.next_message() => {
                    if let Some(why) = backups.on_message(message) {
                        tracing::warn!("{why}: a full snapshot now, so that no revision is left out");
                        next_full = tokio::time::Instant::now();
                    } else if backups.over_memory_limit() && !last_cut_failed {
                        next_delta = tokio::time::Instant::now();
                    }
                }
                () = shared.cut_soon.notified() => next_delta = tokio::time::Instant::now(),
                _ = tokio::time::sleep_until(next_delta), if delta_period_ms > 0 && backups.watching() => {
                    last_cut_failed = false;
                    let cut = backups.cut(deadline, false);
                    // Given up when the lease runs out (an upload over a bad link can hang for
                    // its whole timeout): the instance must stop in time; the events stay pending
                    // for the final delta (a cut records nothing until its upload is stored).
                    let Some(cut) = within_lease(
                        forwarding_deadlines(&mut backend, &mut deadline_for_guard, cut),
                        deadline,
                        margin_ms,
                    )
                    .await
                    else {
                        tracing::warn!("delta snapshot given up: the lease is running out");
                        break Ending::LeaseRunningOut;
                    };
                    match cut {
                        Ok(Stored::Taken(taken)) => tracing::debug!("delta snapshot {} ({} bytes)", taken.location, taken.stored_size_bytes),
                        Ok(Stored::Lost(lost)) => break lost_or_lapsed(deadline, lost),
                        Ok(Stored::Nothing) => {}
                        Err(e) => {
                            // Its events go into the next one; no retry before the next period,
                            // however many events come meanwhile.
                            tracing::warn!("delta snapshot failed: {e}; its events go into the next one");
                            last_cut_failed = true;
                        }
                    }
                    if let Some(why) = backups.compaction_due() {
                        // A restore replays every delta since the full snapshot: bound them.
                        tracing::info!("{why}: a full snapshot now (compaction)");
                        next_full = tokio::time::Instant::now();
                    }
                    next_delta = tokio::time::Instant::now() + delta_period;
                    publish(runtime, target, &backups);
                }
                _ = tokio::time::sleep_until(next_gc), if gc_period_ms > 0 => {
                    let hold = shared.view().gc_hold.clone();
                    let collect = etcd_gc::collect(&backups, deadline, retention, hold);
                    let collected = forwarding_deadlines(&mut backend, &mut deadline_for_guard, collect).await;
                    let held = |backups: &mut Backups, why: String| {
                        backups
                            .gc
                            .get_or_insert_with(|| GcReport {
                                policy: etcd_gc::policy_name(retention),
                                ..GcReport::default()
                            })
                            .held = why;
                    };
                    match collected {
                        Ok(Collected::Ran(report)) => backups.gc = Some(report),
                        Ok(Collected::Held(why)) => {
                            tracing::debug!("garbage collection held: {why}");
                            held(&mut backups, why);
                        }
                        Ok(Collected::Lost(lost)) => break lost_or_lapsed(deadline, lost),
                        Err(e) => {
                            tracing::warn!("garbage collection failed: {e}; again in {gc_period_ms} ms");
                            backups.count_gc(0, 0, 1);
                            held(&mut backups, crate::core::migration::note_text(&format!("failed: {e}")));
                        }
                    }
                    next_gc = tokio::time::Instant::now() + Duration::from_millis(gc_period_ms);
                    publish(runtime, target, &backups);
                }
                _ = tokio::time::sleep_until(next_defrag), if defrag_interval_ms > 0 => {
                    let defrag = defragment(&client, runtime.timing.lease_ms, runtime.settings.restore_timeout_ms);
                    let report = forwarding_deadlines(&mut backend, &mut deadline_for_guard, defrag).await;
                    if report.is_some() {
                        // A full snapshot follows a defragmentation (as Gardener's does): the
                        // compacted database is the new base of the chain (after the one running,
                        // which read the database before).
                        next_full = tokio::time::Instant::now();
                        full_after_job = full_job.is_some();
                    }
                    backups.defrag = report.or(backups.defrag.take());
                    next_defrag = tokio::time::Instant::now() + Duration::from_millis(defrag_interval_ms);
                    publish(runtime, target, &backups);
                }
                _ = health.tick() => {
                    let ok = backend.answers(&client).await;
                    set_healthy(shared, ok);
                }
                _ = change_tick.tick(), if fronts_replica => {
                    backend.keep_cluster(&client, shared, runtime.peer_scheme()).await;
                }
            }
        };

        // A full snapshot still running is given up: the final delta holds what it would.
        let full_given_up = full_job.take().is_some();
        // No client reaches etcd from here on.
        shared.close_gate().await;
        shared.set_phase(InstancePhase::Stopping);
        match &ending {
            Ending::Stopped | Ending::LeaseRunningOut => {
                let final_cut = backups.final_cut(deadline, margin_ms / 2);
                let final_cut = if matches!(ending, Ending::LeaseRunningOut) {
                    // Within the lease as it stands now, whatever renewals come: the guard is
                    // not extended any more and stops etcd at this deadline, and after it a new
                    // host may follow (an upload over a bad link could hang for its whole
                    // timeout, holding up the restart of a member whose lease comes back). The
                    // deltas already stored are what a new host gets: the RPO of a fence.
                    let left_ms = deadline.borrow().saturating_sub(monotonic_ms());
                    tokio::time::timeout(Duration::from_millis(left_ms), final_cut)
                        .await
                        .unwrap_or_else(|_| {
                            Ok(Stored::Lost(
                                "the lease ran out before the final snapshot was stored"
                                    .to_string(),
                            ))
                        })
                } else {
                    final_cut.await
                };
                match final_cut {
                    Ok(Stored::Taken(taken)) => {
                        tracing::info!(
                            "final snapshot {} at revision {}",
                            taken.location,
                            taken.revision
                        )
                    }
                    Ok(Stored::Nothing) => tracing::info!(
                        "no final snapshot needed: the delta snapshots hold everything up to revision {}",
                        backups.covered_revision()
                    ),
                    Ok(Stored::Lost(lost)) => {
                        tracing::warn!("no final snapshot: {lost}")
                    }
                    Err(e) => {
                        tracing::error!(
                            "final snapshot failed: {e}; the newest stored snapshot is what a new host gets"
                        )
                    }
                }
                publish(runtime, target, &backups);
            }
            Ending::Lost(why) => {
                tracing::error!("stops serving: {why}");
            }
            Ending::Exited(status) => {
                tracing::warn!("etcd exited ({status}); no final snapshot")
            }
        }
        if !matches!(ending, Ending::LeaseRunningOut) || !matches!(backend, Backend::Own(_)) {
            break 'serve ending;
        }
        // The lease ran out: the guard freezes etcd at the deadline (its hold) instead of
        // stopping it. A fresh grant at this epoch (the quorum's word, as for any serving) thaws
        // it and the gate opens again, without a restart.
        match held(&mut backend, &mut deadline_for_guard, stop, margin_ms).await {
            Held::Renewed => {}
            Held::Stopped => break 'serve Ending::Stopped,
            Held::Exited(status) => break 'serve Ending::Exited(status),
        }
        match backend.open_gate(public, relay_to, deadline.clone()).await {
            Ok(gate) => {
                gate_ran_out = gate.ran_out();
                *shared.gate.lock().await = Some(gate);
            }
            Err(e) => {
                tracing::warn!("the lease is back but the endpoint cannot open again: {e}");
                break 'serve ending;
            }
        }
        shared.set_phase(InstancePhase::Serving);
        set_healthy(shared, true);
        tracing::info!("the lease is back: etcd serves again on {public}, without a restart");
        // The full snapshot given up (or a lost watch's) comes now.
        if full_given_up || !backups.watching() {
            next_full = tokio::time::Instant::now();
        }
        next_delta = tokio::time::Instant::now() + delta_period;
    };
    backend.stop(runtime.timing.fence_ms).await;
    Ok(ending)
}

/// How an upload refused for `lost` ends the instance: as a lapse when the lease ran out (the
/// uploads check it first; a grant at this epoch may come back), otherwise as lost ownership.
fn lost_or_lapsed(deadline: &watch::Receiver<u64>, lost: String) -> Ending {
    if lease_ran_out(deadline) {
        Ending::LeaseRunningOut
    } else {
        Ending::Lost(lost)
    }
}

/// How a hold after a lapsed lease ended.
enum Held {
    /// The lease is back, with more than the margin left.
    Renewed,
    /// The instance must stop (its grant is gone, or nobody renews any more).
    Stopped,
    /// etcd ended: the guard's hold ran out, or it exited.
    Exited(String),
}

/// Waits, with the gate closed and etcd frozen by its guard (from the lease's deadline on),
/// until the lease is back with more than `margin_ms` left (its deadline is passed on to the
/// guard, which thaws etcd), the instance must stop, or etcd ends.
async fn held(
    backend: &mut Backend,
    deadline: &mut watch::Receiver<u64>,
    stop: &mut watch::Receiver<bool>,
    margin_ms: u64,
) -> Held {
    loop {
        let now_deadline = *deadline.borrow_and_update();
        if monotonic_ms() + margin_ms < now_deadline {
            // The guard may not have seen it (it came during the final snapshot).
            backend.set_deadline(now_deadline).await;
            return Held::Renewed;
        }
        tokio::select! {
            _ = stopped(stop) => return Held::Stopped,
            status = backend.ended() => return Held::Exited(status),
            changed = deadline.changed() => {
                if changed.is_err() {
                    return Held::Stopped;
                }
                let d = *deadline.borrow();
                backend.set_deadline(d).await;
            }
        }
    }
}

/// A full snapshot running in a task of its own beside the serving loop (a big etcd's takes
/// minutes; the deltas go on meanwhile). Dropping it aborts the task: an upload not completed
/// is dropped unfinished (see [`crate::backup::snapshot`]).
struct FullJob {
    handle: JoinHandle<Result<Stored, StoreError>>,
    /// When it started, Unix ms.
    started_unix_ms: u64,
}

impl Drop for FullJob {
    fn drop(&mut self) {
        self.handle.abort();
    }
}

fn set_copy_progress(shared: &Shared, progress: watch::Receiver<CopyProgress>) {
    shared.view().copy = Some(progress);
}

fn set_healthy(shared: &Shared, ok: bool) {
    let mut view = shared.view();
    view.healthy = ok;
    if ok {
        view.unhealthy_since_ms = None;
    } else if view.unhealthy_since_ms.is_none() {
        view.unhealthy_since_ms = Some(monotonic_ms());
    }
}

/// Awaits `work` while handing every new lease deadline on to the guard of an own etcd: a
/// long snapshot, garbage collection or defragmentation must not leave the guard with a
/// deadline that has run out (it would fence a member that renewed its lease).
async fn forwarding_deadlines<T>(
    backend: &mut Backend,
    deadline: &mut watch::Receiver<u64>,
    work: impl std::future::Future<Output = T>,
) -> T {
    let mut work = std::pin::pin!(work);
    loop {
        tokio::select! {
            out = &mut work => return out,
            changed = deadline.changed() => {
                if changed.is_err() {
                    return work.await;
                }
                let d = *deadline.borrow_and_update();
                backend.set_deadline(d).await;
            }
        }
    }
}

/// Runs `work` until less than `margin_ms` of the lease `deadline` holds is left (None then:
/// `work` is dropped unfinished).
async fn within_lease<T>(
    work: impl std::future::Future<Output = T>,
    deadline: &watch::Receiver<u64>,
    margin_ms: u64,
) -> Option<T> {
    let mut lease = deadline.clone();
    tokio::select! {
        out = work => Some(out),
        () = lease_runs_out(&mut lease, margin_ms) => None,
    }
}

/// Defragments the etcd `client` reaches (waiting up to `timeout_ms`) and says what it did:
/// the database's size before and after, and how long it took, which is how long etcd
/// answered nothing. Longer than `lease_ms` is logged as a warning and shows in `cp get`.
async fn defragment(client: &EtcdClient, lease_ms: u64, timeout_ms: u64) -> Option<DefragReport> {
    let before = client.status().await.ok();
    let started = monotonic_ms();
    if let Err(e) = client.defragment(timeout_ms).await {
        tracing::warn!("defragmentation failed: {e}; again at the next interval");
        return None;
    }
    let took_ms = monotonic_ms() - started;
    let after = client.status().await.ok();
    let size =
        |s: &Option<crate::backup::etcd::EtcdStatus>| s.as_ref().map_or(0, |s| s.db_size_bytes);
    let report = DefragReport {
        last_unix_ms: unix_ms(),
        took_ms,
        db_before_bytes: size(&before),
        db_after_bytes: size(&after),
        longer_than_lease: took_ms > lease_ms,
    };
    if report.longer_than_lease {
        tracing::warn!(
            "defragmentation took {took_ms} ms, longer than the lease ({lease_ms} ms): etcd answered nothing meanwhile (database {} -> {} bytes)",
            report.db_before_bytes,
            report.db_after_bytes
        );
    } else {
        tracing::info!(
            "defragmented in {took_ms} ms (database {} -> {} bytes)",
            report.db_before_bytes,
            report.db_after_bytes
        );
    }
    Some(report)
}

/// Tells the member what the backups of `target` reach (for its renewals and `/metrics`).
fn publish(runtime: &EtcdRuntime, target: &Target, backups: &Backups) {
    runtime.backups.update(
        &target.name,
        target.epoch,
        backups.report(runtime.settings.delta_snapshot_period_ms),
    );
}

/// Removes the data directories of epochs before `epoch` (their data moved on through the
/// backups); best effort.
fn remove_older_epochs(runtime: &EtcdRuntime, name: &str, epoch: u64) {
    let Ok(entries) = std::fs::read_dir(runtime.data_root.join(name)) else {
        return;
    };
    for entry in entries.flatten() {
        let file_name = entry.file_name();
        let Some(older) = file_name
            .to_str()
            .and_then(|n| n.strip_prefix("epoch-"))
            .and_then(|n| n.split('.').next())
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        if older < epoch
            && let Err(e) = std::fs::remove_dir_all(entry.path())
        {
            tracing::warn!("cannot remove {}: {e}", entry.path().display());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backup::restore::{Restored, SkippedSnapshot};
    use crate::core::backup_name::SnapshotPath;

    fn restored(deltas: &[&str]) -> Restored {
        let path = |name: &str| SnapshotPath::parse(&format!("cp/v2/{name}")).unwrap();
        Restored {
            snapshot: path("Full-00000000-00000010-1700000000"),
            deltas: deltas.iter().map(|d| path(d)).collect(),
            replay_stopped: None,
            revision: 10,
            created_unix_s: 1_700_000_000,
            age_s: 0,
            is_final: false,
            sha256: String::new(),
            snapshot_size_bytes: 0,
            stored_size_bytes: 0,
            skipped_bad: Vec::new(),
            unapplied_incr: 0,
            foreign_newer: 0,
            replay_ms: 0,
        }
    }

    #[test]
    fn a_clean_chain_is_continued_from_the_restored_revision() {
        let mut r = restored(&["Incr-00000011-00000030-1700000001"]);
        r.revision = 30;
        assert_eq!(
            resumable(&r),
            Some(Resume {
                full: "cp/v2/Full-00000000-00000010-1700000000".into(),
                full_revision: 10,
                deltas: 1,
                revision: 30,
            })
        );
    }

    #[test]
    fn a_chain_with_anything_left_out_or_beside_it_is_not_continued() {
        let skipped = SkippedSnapshot {
            name: "x".into(),
            why: "y".into(),
        };
        let mut r = restored(&[]);
        r.replay_stopped = Some(skipped.clone());
        assert_eq!(resumable(&r), None);
        let mut r = restored(&[]);
        r.unapplied_incr = 1;
        assert_eq!(resumable(&r), None);
        let mut r = restored(&[]);
        r.skipped_bad = vec![skipped];
        assert_eq!(resumable(&r), None);
        let mut r = restored(&[]);
        r.foreign_newer = 2;
        assert_eq!(resumable(&r), None);
    }
}
