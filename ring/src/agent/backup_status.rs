//! What this member knows of the backups of each control plane it runs: the etcd driver's
//! instances record a [`BackupReport`] whenever their backups change (a full or a delta
//! snapshot stored, a delta period that had no events) and forget it when they end.
//!
//! Two readers: the agent's lease renewals carry the reports of the control planes it runs
//! at the epoch it runs them ([`BackupStatuses::at_epochs`]), which the leader commits now and
//! then ([`crate::core::backup_report::worth_committing`]); and `/metrics` shows them on this
//! host, fresh at every scrape (`garden_ring_backup_*{control_plane}`).

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::core::backup_report::BackupReport;

/// The newest [`BackupReport`] of each control plane hosted here, with the epoch of the
/// instance that recorded it; modelled on [`super::etcd::SnapshotTimes`]. Only control planes
/// an instance runs here appear, one entry each, and only once it recorded a report.
/// Also what this member's garbage collections deleted, in total.
#[derive(Debug, Default)]
pub struct BackupStatuses {
    reports: Mutex<BTreeMap<String, (u64, BackupReport)>>,
    /// Full snapshots, delta snapshots deleted, and deletions that failed.
    gc: [AtomicU64; 3],
}

/// What this member's garbage collections did since it started (`/metrics`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct GcTotals {
    /// Full snapshots deleted.
    pub deleted_full: u64,
    /// Delta snapshots deleted.
    pub deleted_delta: u64,
    /// Deletions (or listings) that failed.
    pub failures: u64,
}

impl BackupStatuses {
    fn lock(&self) -> std::sync::MutexGuard<'_, BTreeMap<String, (u64, BackupReport)>> {
        self.reports.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Counts what a garbage collection did.
    pub fn count_gc(&self, deleted_full: u64, deleted_delta: u64, failures: u64) {
        for (counter, n) in self.gc.iter().zip([deleted_full, deleted_delta, failures]) {
            counter.fetch_add(n, Ordering::Relaxed);
        }
    }

    /// What this member's garbage collections did since it started.
    pub fn gc_totals(&self) -> GcTotals {
        let [full, delta, failures] = &self.gc;
        GcTotals {
            deleted_full: full.load(Ordering::Relaxed),
            deleted_delta: delta.load(Ordering::Relaxed),
            failures: failures.load(Ordering::Relaxed),
        }
    }

    /// Records `report` for `name` at `epoch`, replacing what was recorded before, unless an
    /// instance of a later epoch recorded one already. A report that fails
    /// [`BackupReport::validate`] is kept for `/metrics` but the leader will not commit it: it
    /// is logged as a warning (a bug in the driver).
    pub fn update(&self, name: &str, epoch: u64, report: BackupReport) {
        if let Err(e) = report.validate() {
            tracing::warn!(
                control_plane = name,
                epoch,
                "backup report the ring will not commit: {e}"
            );
        }
        let mut statuses = self.lock();
        if statuses.get(name).is_some_and(|(e, _)| *e > epoch) {
            return;
        }
        statuses.insert(name.to_string(), (epoch, report));
    }

    /// Forgets `name`, unless an instance of another epoch recorded it since.
    pub fn forget(&self, name: &str, epoch: u64) {
        let mut statuses = self.lock();
        if statuses.get(name).is_some_and(|(e, _)| *e == epoch) {
            statuses.remove(name);
        }
    }

    /// Every control plane's newest report, whatever its epoch (for `/metrics`).
    pub fn all(&self) -> BTreeMap<String, BackupReport> {
        self.lock()
            .iter()
            .map(|(name, (_, report))| (name.clone(), report.clone()))
            .collect()
    }

    /// The reports of the control planes in `running` recorded at exactly the epoch it names
    /// (what a lease renewal carries: the leader takes a report as about that epoch).
    pub fn at_epochs(&self, running: &BTreeMap<String, u64>) -> BTreeMap<String, BackupReport> {
        self.lock()
            .iter()
            .filter(|(name, (epoch, _))| running.get(*name) == Some(epoch))
            .map(|(name, (_, report))| (name.clone(), report.clone()))
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(revision: u64) -> BackupReport {
        BackupReport {
            full: Some("x/v2/Full-00000000-00000010-1700000000.gz".into()),
            revision,
            up_to_date_unix_ms: 1_700_000_000_000 + revision,
            delta_period_ms: 20_000,
            ..BackupReport::default()
        }
    }

    #[test]
    fn reports_are_kept_per_control_plane_and_forgotten_by_their_epoch() {
        let statuses = BackupStatuses::default();
        assert!(statuses.all().is_empty());
        statuses.update("x", 2, report(10));
        statuses.update("x", 2, report(11));
        statuses.update("y", 1, report(5));
        assert_eq!(statuses.all().len(), 2);
        assert_eq!(statuses.all()["x"].revision, 11);

        // An older epoch's instance neither replaces nor forgets a newer one's report.
        statuses.update("x", 1, report(3));
        statuses.forget("x", 1);
        assert_eq!(statuses.all()["x"].revision, 11);
        statuses.update("x", 3, report(12));
        statuses.forget("x", 2);
        assert_eq!(statuses.all()["x"].revision, 12);
        statuses.forget("x", 3);
        assert_eq!(statuses.all().keys().collect::<Vec<_>>(), ["y"]);
    }

    #[test]
    fn renewals_carry_only_what_runs_at_the_recorded_epoch() {
        let statuses = BackupStatuses::default();
        statuses.update("x", 2, report(10));
        statuses.update("y", 1, report(5));
        statuses.update("z", 1, report(7));
        let running = BTreeMap::from([("x".to_string(), 2), ("y".to_string(), 2)]);
        let carried = statuses.at_epochs(&running);
        assert_eq!(carried.keys().collect::<Vec<_>>(), ["x"]);
        assert_eq!(carried["x"].revision, 10);
    }
}
