//! Which snapshots of a control plane's backups garbage collection deletes: etcd-backup-restore's
//! two policies, with the ring's rule that nothing a restore may need is ever deleted. Pure: a
//! list of snapshot names and the time in, the indexes to delete out; the host lists and
//! deletes.
//!
//! The snapshots form *streams*: a full snapshot and the deltas after it, up to the next full
//! one (by revision). Both policies
//!
//! - keep the **newest stream whole**: the newest full snapshot and every delta after it are
//!   what a restore replays ([`crate::backup_chain`]), so they are never deleted, however old;
//! - delete the deltas of every older stream (a restore starts from the newest full snapshot,
//!   so they are never replayed), and the deltas older than the oldest full snapshot;
//! - choose which older **full snapshots** stay (the points an operator can still go back to):
//!   - [`Retention::Exponential`]: every one of the last hour, then the newest of each hour for
//!     24 hours, of each day for 7 days, of each week for 4 weeks; none older (hours, days and
//!     weeks are UTC windows counted from the Unix epoch);
//!   - [`Retention::LimitBased`]: the newest `max_backups`.
//!
//! Whether GC may run at all (not during a migration of the control plane, not in a migration's
//! source bucket, not over what a later epoch's owner wrote) is decided by the caller.

use std::collections::BTreeMap;

use super::backup_name::{SnapshotKind, SnapshotName};

/// etcd-backup-restore's default `--max-backups` for the limit-based policy.
pub const DEFAULT_MAX_BACKUPS: usize = 7;

const HOUR_S: u64 = 3_600;
const DAY_S: u64 = 24 * HOUR_S;
const WEEK_S: u64 = 7 * DAY_S;

/// A garbage collection policy (etcd-backup-restore's `--garbage-collection-policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retention {
    /// Keep all full snapshots of the last hour, then one per hour for 24 hours, one per day
    /// for 7 days, one per week for 4 weeks.
    Exponential,
    /// Keep the newest `max_backups` full snapshots (at least 1).
    LimitBased {
        /// How many full snapshots to keep.
        max_backups: usize,
    },
}

/// What garbage collection deletes and keeps, by index into the snapshots given to [`plan`].
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Plan {
    /// The snapshots to delete, in the order given.
    pub delete: Vec<usize>,
    /// The full snapshots kept, oldest first.
    pub kept_full: Vec<usize>,
}

/// The snapshots to delete from `snapshots` (one control plane's backups, in any order) under
/// `retention` at `now_unix_s`: see the [module docs](self).
pub fn plan(snapshots: &[SnapshotName], retention: Retention, now_unix_s: u64) -> Plan {
    let mut fulls: Vec<usize> = (0..snapshots.len())
        .filter(|&i| snapshots[i].kind() == SnapshotKind::Full)
        .collect();
    // Oldest first: by revision, then time; a final snapshot after the plain one of the same
    // revision.
    fulls.sort_by_key(|&i| {
        let s = &snapshots[i];
        (s.last_revision(), s.created_unix_s(), s.is_final())
    });
    let Some(&newest) = fulls.last() else {
        // No full snapshot: nothing is known to be superseded; keep everything.
        return Plan::default();
    };
    let newest_revision = snapshots[newest].last_revision();
    let keep: Vec<bool> = {
        let older = &fulls[..fulls.len() - 1];
        let mut keep = match retention {
            Retention::LimitBased { max_backups } => {
                let max = max_backups.max(1);
                let from = fulls.len().saturating_sub(max);
                (0..older.len()).map(|k| k >= from).collect()
            }
            Retention::Exponential => exponential(snapshots, older, now_unix_s),
        };
        keep.push(true);
        keep
    };
    let kept_full: Vec<usize> = fulls
        .iter()
        .zip(&keep)
        .filter(|(_, k)| **k)
        .map(|(i, _)| *i)
        .collect();
    let mut delete = Vec::new();
    for (i, s) in snapshots.iter().enumerate() {
        let goes = match s.kind() {
            SnapshotKind::Full => !kept_full.contains(&i),
            // A delta belongs to the newest stream when it reaches past the newest full
            // snapshot: a restore replays it.
            SnapshotKind::Incr => s.last_revision() <= newest_revision,
        };
        if goes {
            delete.push(i);
        }
    }
    debug_assert!(
        !delete.contains(&newest),
        "GC deletes the newest full snapshot"
    );
    debug_assert!(
        delete
            .iter()
            .all(|&i| snapshots[i].kind() == SnapshotKind::Full
                || snapshots[i].last_revision() <= newest_revision),
        "GC deletes a delta a restore replays"
    );
    Plan { delete, kept_full }
}

/// For each of the `older` full snapshots (oldest first), whether the exponential policy keeps
/// it at `now_unix_s`.
fn exponential(snapshots: &[SnapshotName], older: &[usize], now_unix_s: u64) -> Vec<bool> {
    // The newest snapshot of each window wins its window: walk newest first.
    let mut taken: BTreeMap<(u8, u64), ()> = BTreeMap::new();
    let mut keep = vec![false; older.len()];
    for (k, &i) in older.iter().enumerate().rev() {
        let created = snapshots[i].created_unix_s();
        let age = now_unix_s.saturating_sub(created);
        let window = if age < HOUR_S {
            keep[k] = true;
            continue;
        } else if age < DAY_S {
            (0, created / HOUR_S)
        } else if age < 7 * DAY_S {
            (1, created / DAY_S)
        } else if age < 4 * WEEK_S {
            (2, created / WEEK_S)
        } else {
            continue;
        };
        keep[k] = taken.insert(window, ()).is_none();
    }
    keep
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000;

    fn full(revision: u64, created: u64) -> SnapshotName {
        SnapshotName::new(SnapshotKind::Full, 0, revision, created).unwrap()
    }

    fn delta(start: u64, last: u64, created: u64) -> SnapshotName {
        SnapshotName::new(SnapshotKind::Incr, start, last, created).unwrap()
    }

    /// A full snapshot every `every_s` back from now for `span_s`, each followed by two deltas.
    fn history(every_s: u64, span_s: u64) -> Vec<SnapshotName> {
        let mut out = Vec::new();
        let count = span_s / every_s;
        for n in 0..=count {
            let created = NOW - (count - n) * every_s;
            let revision = 100 * n + 1;
            out.push(full(revision, created));
            out.push(delta(revision + 1, revision + 10, created + 10));
            out.push(delta(revision + 11, revision + 20, created + 20));
        }
        out
    }

    fn names(snapshots: &[SnapshotName], indexes: &[usize]) -> Vec<String> {
        indexes.iter().map(|&i| snapshots[i].to_string()).collect()
    }

    #[test]
    fn limit_based_keeps_the_newest_fulls_and_only_the_newest_streams_deltas() {
        let snaps = history(3_600, 9 * 3_600); // 10 streams
        let plan = plan(&snaps, Retention::LimitBased { max_backups: 7 }, NOW);
        assert_eq!(plan.kept_full.len(), 7);
        let newest = snaps.len() - 3;
        assert_eq!(*plan.kept_full.last().unwrap(), newest);
        // 3 old fulls, and the deltas of the 9 older streams.
        assert_eq!(
            plan.delete.len(),
            3 + 9 * 2,
            "{:?}",
            names(&snaps, &plan.delete)
        );
        for (i, s) in snaps.iter().enumerate().skip(newest) {
            assert!(!plan.delete.contains(&i), "{s} deleted");
        }
        // max_backups 0 still keeps the newest.
        let plan = super::plan(&snaps, Retention::LimitBased { max_backups: 0 }, NOW);
        assert_eq!(plan.kept_full, [newest]);
    }

    #[test]
    fn exponential_keeps_the_last_hour_then_hourly_daily_weekly_and_nothing_older() {
        // A full snapshot every 30 minutes for 40 days.
        let snaps = history(1_800, 40 * DAY_S);
        let plan = plan(&snaps, Retention::Exponential, NOW);
        let kept: Vec<u64> = plan
            .kept_full
            .iter()
            .map(|&i| snaps[i].created_unix_s())
            .collect();
        let ages: Vec<u64> = kept.iter().map(|c| NOW - c).collect();
        // Every one of the last hour (ages 0, 1800; 3600 is an hour old and is an hourly one).
        assert!(ages.contains(&0) && ages.contains(&1_800));
        // At most one per hour window between 1 h and 24 h, and one in each of them.
        for hour in (NOW - DAY_S + HOUR_S) / HOUR_S..NOW / HOUR_S {
            let in_window = kept
                .iter()
                .filter(|c| **c / HOUR_S == hour && NOW - **c >= HOUR_S && NOW - **c < DAY_S)
                .count();
            assert!(in_window <= 1, "hour {hour}: {in_window}");
        }
        // Nothing of 4 weeks or older.
        assert!(ages.iter().all(|a| *a < 4 * WEEK_S), "{ages:?}");
        // Something in each day of the last week and each of the 4 weeks.
        for day in 1..7 {
            assert!(
                ages.iter()
                    .any(|a| *a >= day * DAY_S && *a < (day + 1) * DAY_S),
                "nothing kept {day} days back: {ages:?}"
            );
        }
        // 2 in the last hour + 23 hourly + 7 daily windows (the window of the day 24 h back
        // partly overlaps) + weekly: far fewer than the 1,921 there are, more than 30.
        assert!(
            (30..=45).contains(&kept.len()),
            "{} kept: {ages:?}",
            kept.len()
        );
        // Deltas: only the newest stream's stay.
        let deltas_left = (0..snaps.len())
            .filter(|i| snaps[*i].kind() == SnapshotKind::Incr && !plan.delete.contains(i))
            .count();
        assert_eq!(deltas_left, 2);
    }

    #[test]
    fn the_newest_full_snapshot_and_its_deltas_stay_however_old() {
        let snaps = vec![
            full(10, NOW - 90 * DAY_S),
            delta(11, 20, NOW - 90 * DAY_S + 10),
            full(30, NOW - 60 * DAY_S),
            delta(31, 40, NOW - 60 * DAY_S + 10),
            // A delta that overlaps the newest full snapshot and reaches past it is replayed.
            delta(25, 45, NOW - 60 * DAY_S + 20),
        ];
        for retention in [
            Retention::Exponential,
            Retention::LimitBased { max_backups: 1 },
        ] {
            let plan = plan(&snaps, retention, NOW);
            assert_eq!(plan.kept_full, [2], "{retention:?}");
            assert_eq!(plan.delete, [0, 1], "{retention:?}");
        }
    }

    #[test]
    fn without_a_full_snapshot_nothing_is_deleted() {
        let snaps = vec![delta(1, 10, NOW - 90 * DAY_S), delta(11, 20, NOW)];
        assert_eq!(plan(&snaps, Retention::Exponential, NOW), Plan::default());
        assert_eq!(
            plan(&[], Retention::LimitBased { max_backups: 7 }, NOW),
            Plan::default()
        );
    }

    #[test]
    fn a_final_snapshot_of_the_same_revision_is_the_newer_one() {
        let plain = full(50, NOW - 10);
        let fin = full(50, NOW - 10).with_final(true);
        let snaps = vec![fin, plain, delta(51, 60, NOW - 5)];
        let plan = plan(&snaps, Retention::LimitBased { max_backups: 1 }, NOW);
        assert_eq!(plan.kept_full, [0]);
        assert_eq!(plan.delete, [1]);
    }
}
