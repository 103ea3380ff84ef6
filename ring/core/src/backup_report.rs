//! What a control plane's host reports about its backups: the newest full snapshot, the delta
//! (`Incr-`) snapshots written since, the etcd revision the stored backups reach, and how
//! fresh they are.
//!
//! The host's etcd driver keeps one [`BackupReport`] per control plane it runs
//! (`agent::backup_status::BackupStatuses`) and sends it with its lease renewals; the leader
//! commits it (`Command::ReportBackup`) when [`worth_committing`] says so: the first report of
//! an epoch, a new full snapshot, or otherwise at most once every [`REPORT_INTERVAL_MS`] of
//! backup time. That bounds the log to one backup write per control plane per
//! [`REPORT_INTERVAL_MS`], however short the delta period. The committed report is cleared when
//! the control plane moves (a new epoch starts with no backups of its own yet).

use serde::{Deserialize, Serialize};

use super::error::CommandError;
use super::limits::{MAX_SNAPSHOT_KEY_LEN, MAX_SNAPSHOT_NUMBER};
use super::names::{Invalid, invalid, is_invisible_format};

/// Least backup time (`up_to_date_unix_ms`) between two committed reports of one control
/// plane that name the same full snapshot, in ms.
pub const REPORT_INTERVAL_MS: u64 = 5_000;

/// A host's report on the backups of one control plane it runs, at its current epoch.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupReport {
    /// Key (or name) of the newest full snapshot written or restored at this epoch, if any.
    pub full: Option<String>,
    /// Delta snapshots written after it.
    pub deltas_since_full: u64,
    /// The etcd revision the stored backups reach (last revision of the newest snapshot).
    pub revision: u64,
    /// Creation time of the newest delta snapshot, Unix ms (None: none since the full one).
    pub newest_delta_unix_ms: Option<u64>,
    /// The last time the backups were known complete up to then (a delta written, or a period
    /// that had no events), Unix ms.
    pub up_to_date_unix_ms: u64,
    /// The host's delta_snapshot_period_ms (0: deltas off).
    pub delta_period_ms: u64,
    /// What the host's garbage collection of these backups last did (None: it has not run,
    /// or is off).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gc: Option<GcReport>,
    /// The host's last defragmentation of the etcd (it rides with the backups: a full
    /// snapshot follows it). None: none at this epoch yet.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub defrag: Option<DefragReport>,
}

/// The host's last defragmentation of a control plane's etcd.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct DefragReport {
    /// When it ended, Unix ms.
    pub last_unix_ms: u64,
    /// How long it took: etcd answered nothing meanwhile, ms.
    pub took_ms: u64,
    /// The database's size before, bytes.
    pub db_before_bytes: u64,
    /// ... and after.
    pub db_after_bytes: u64,
    /// It took longer than the lease: clients saw the endpoint stall that long.
    pub longer_than_lease: bool,
}

/// Longest [`GcReport::policy`] and [`GcReport::held`], bytes.
pub const MAX_GC_TEXT_LEN: usize = 256;

/// What the host's garbage collection of a control plane's backups last did.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcReport {
    /// The policy (`exponential`, `limit-based (7)`).
    pub policy: String,
    /// When it last listed and deleted, Unix ms (0: not yet).
    pub last_unix_ms: u64,
    /// Full snapshots it kept then, the newest included.
    pub kept_full: u64,
    /// The oldest of them: how far back a restore can go.
    pub oldest_full: Option<String>,
    /// Snapshots it deleted then.
    pub deleted: u64,
    /// Why it did not run at its last period (empty: it ran).
    pub held: String,
}

impl BackupReport {
    /// Syntax checks: `full`, when given, is a non-empty snapshot key or name of at most
    /// [`MAX_SNAPSHOT_KEY_LEN`] bytes without control or invisible formatting characters; the
    /// revision and the times are at most [`MAX_SNAPSHOT_NUMBER`] (etcd's and
    /// etcd-backup-restore's signed 64-bit numbers); a delta time is given exactly when deltas
    /// were written since the full snapshot.
    pub fn validate(&self) -> Result<(), CommandError> {
        if let Some(full) = &self.full {
            check_snapshot_key(full)
                .map_err(|why| CommandError::invalid("full snapshot", full, why))?;
        }
        for (field, value) in [
            ("backup revision", Some(self.revision)),
            ("newest delta time", self.newest_delta_unix_ms),
            ("backups up-to-date time", Some(self.up_to_date_unix_ms)),
            ("delta snapshot period", Some(self.delta_period_ms)),
        ] {
            if let Some(value) = value.filter(|v| *v > MAX_SNAPSHOT_NUMBER) {
                return Err(CommandError::invalid(
                    field,
                    &value.to_string(),
                    format!("must be at most {MAX_SNAPSHOT_NUMBER}"),
                ));
            }
        }
        if let Some(gc) = &self.gc {
            if let Some(oldest) = &gc.oldest_full {
                check_snapshot_key(oldest).map_err(|why| {
                    CommandError::invalid("oldest kept full snapshot", oldest, why)
                })?;
            }
            for (field, text) in [("GC policy", &gc.policy), ("GC hold", &gc.held)] {
                if text.len() > MAX_GC_TEXT_LEN
                    || text
                        .chars()
                        .any(|c| c.is_control() || is_invisible_format(c))
                {
                    return Err(CommandError::invalid(
                        field,
                        text,
                        format!(
                            "must be at most {MAX_GC_TEXT_LEN} bytes without control or invisible formatting characters"
                        ),
                    ));
                }
            }
            if gc.last_unix_ms > MAX_SNAPSHOT_NUMBER {
                return Err(CommandError::invalid(
                    "GC time",
                    &gc.last_unix_ms.to_string(),
                    format!("must be at most {MAX_SNAPSHOT_NUMBER}"),
                ));
            }
        }
        if (self.deltas_since_full > 0) != self.newest_delta_unix_ms.is_some() {
            return Err(CommandError::invalid(
                "newest delta time",
                &self
                    .newest_delta_unix_ms
                    .map(|t| t.to_string())
                    .unwrap_or_default(),
                format!(
                    "is given exactly when deltas were written since the full snapshot ({} were)",
                    self.deltas_since_full
                ),
            ));
        }
        Ok(())
    }

    /// The file name of the full snapshot (what follows the last `/` of its key), if any.
    pub fn full_name(&self) -> Option<&str> {
        self.full
            .as_deref()
            .map(|key| key.rsplit('/').next().unwrap_or(key))
    }
}

/// Whether `report` says something the ring should commit over `committed` (the control
/// plane's committed report at this epoch, if any): always when nothing is committed or the
/// full snapshot changed; otherwise only when something changed and its backups are at least
/// [`REPORT_INTERVAL_MS`] more recent than the committed ones.
pub fn worth_committing(committed: Option<&BackupReport>, report: &BackupReport) -> bool {
    let Some(committed) = committed else {
        return true;
    };
    if committed.full != report.full {
        return true;
    }
    committed != report
        && report
            .up_to_date_unix_ms
            .saturating_sub(committed.up_to_date_unix_ms)
            >= REPORT_INTERVAL_MS
}

/// A snapshot key or name as a report may carry it (see [`BackupReport::validate`]).
fn check_snapshot_key(value: &str) -> Result<(), Invalid> {
    if value.is_empty() {
        return Err("must not be empty (no full snapshot is reported as none)".into());
    }
    if value.len() > MAX_SNAPSHOT_KEY_LEN {
        return Err(invalid!(
            "is {} bytes long; at most {MAX_SNAPSHOT_KEY_LEN} (a snapshot key)",
            value.len()
        ));
    }
    if value
        .chars()
        .any(|c| c.is_control() || is_invisible_format(c))
    {
        return Err("must not contain control or invisible formatting characters".into());
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(full: &str, deltas: u64, up_to_date: u64) -> BackupReport {
        BackupReport {
            full: Some(format!("shoot--dev--x/etcd-main/v2/{full}")),
            deltas_since_full: deltas,
            revision: 100 + deltas,
            newest_delta_unix_ms: (deltas > 0).then_some(up_to_date),
            up_to_date_unix_ms: up_to_date,
            delta_period_ms: 1_000,
            ..BackupReport::default()
        }
    }

    #[test]
    fn reports_are_committed_when_new_on_a_new_full_or_every_interval() {
        let full = "Full-00000000-00000100-1700000000.gz";
        let first = report(full, 0, 1_700_000_000_000);
        assert!(worth_committing(None, &first));
        assert!(!worth_committing(Some(&first), &first), "nothing changed");
        let soon = report(full, 3, 1_700_000_004_999);
        assert!(!worth_committing(Some(&first), &soon), "throttled");
        let later = report(full, 5, 1_700_000_005_000);
        assert!(worth_committing(Some(&first), &later));
        // Only the time moved on (periods without events): committed every interval too.
        let quiet = BackupReport {
            up_to_date_unix_ms: 1_700_000_005_000,
            ..first.clone()
        };
        assert!(worth_committing(Some(&first), &quiet));
        // A new full snapshot at once, however soon.
        let new_full = report("Full-00000000-00000103-1700000001.gz", 0, 1_700_000_001_000);
        assert!(worth_committing(Some(&soon), &new_full));
        let none = BackupReport {
            full: None,
            ..first.clone()
        };
        assert!(worth_committing(Some(&first), &none));
    }

    #[test]
    fn reports_are_checked() {
        let good = report("Full-00000000-00000100-1700000000.gz", 2, 1_700_000_000_000);
        good.validate().unwrap();
        assert_eq!(
            good.full_name(),
            Some("Full-00000000-00000100-1700000000.gz")
        );
        BackupReport::default().validate().unwrap();

        let longest = BackupReport {
            full: Some("x".repeat(MAX_SNAPSHOT_KEY_LEN)),
            ..BackupReport::default()
        };
        longest.validate().unwrap();
        for full in [
            String::new(),
            "x".repeat(MAX_SNAPSHOT_KEY_LEN + 1),
            "Full-0\n".into(),
            "Full\u{202e}".into(),
        ] {
            let bad = BackupReport {
                full: Some(full.clone()),
                ..BackupReport::default()
            };
            let err = bad.validate().unwrap_err();
            assert!(
                matches!(&err, CommandError::Invalid { field, .. } if field == "full snapshot"),
                "{full:?}: {err}"
            );
        }
        let collected = BackupReport {
            gc: Some(GcReport {
                policy: "limit-based (7)".into(),
                last_unix_ms: 1_700_000_000_000,
                kept_full: 7,
                oldest_full: Some("v2/Full-00000000-00000010-1700000000".into()),
                deleted: 3,
                held: String::new(),
            }),
            ..good.clone()
        };
        collected.validate().unwrap();
        for (gc, field) in [
            (
                GcReport {
                    oldest_full: Some(String::new()),
                    ..GcReport::default()
                },
                "oldest kept full snapshot",
            ),
            (
                GcReport {
                    held: "x".repeat(MAX_GC_TEXT_LEN + 1),
                    ..GcReport::default()
                },
                "GC hold",
            ),
            (
                GcReport {
                    policy: "a\nb".into(),
                    ..GcReport::default()
                },
                "GC policy",
            ),
            (
                GcReport {
                    last_unix_ms: MAX_SNAPSHOT_NUMBER + 1,
                    ..GcReport::default()
                },
                "GC time",
            ),
        ] {
            let bad = BackupReport {
                gc: Some(gc),
                ..good.clone()
            };
            let err = bad.validate().unwrap_err();
            assert!(
                matches!(&err, CommandError::Invalid { field: f, .. } if f == field),
                "{field}: {err}"
            );
        }
        let huge = BackupReport {
            revision: MAX_SNAPSHOT_NUMBER + 1,
            ..BackupReport::default()
        };
        assert!(huge.validate().is_err());
        let no_time = BackupReport {
            newest_delta_unix_ms: None,
            ..good.clone()
        };
        assert!(no_time.validate().is_err());
        let no_deltas = BackupReport {
            deltas_since_full: 0,
            ..good
        };
        assert!(no_deltas.validate().is_err());
    }
}
