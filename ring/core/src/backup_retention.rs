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
//!   - [`Retention::Exponential`]: etcd-backup-restore's windows, exactly (its
//!     `RunGarbageCollector`, v0.43), anchored at the **end of the current UTC day** (`eod`,
//!     23:59:59): every snapshot of today's current clock hour; the newest of each other hour
//!     window of today; the newest of each day window for the 7 days before; the newest of each
//!     week window up to 5 weeks back (for these, `eod` moves back one day); none older. A
//!     snapshot is the newest of its window when the next newer full snapshot (kept or not)
//!     lies in another window;
//!   - [`Retention::LimitBased`]: the newest `max_backups`.
//!
//! Whether GC may run at all is [`hold`]'s decision, from the ring's state: only the control
//! plane's host at its current epoch, and never while a migration of it is in progress (its
//! source bucket is then being copied: DESIGN.md rule 4). The host also checks its lease and
//! the location's marker before it deletes (what a later epoch's owner wrote is never touched).

use super::backup_name::{SnapshotKind, SnapshotName};
use super::control_plane::Phase;
use super::migration::MigrationStep;
use super::state::RingState;

/// etcd-backup-restore's default `--max-backups` for the limit-based policy.
pub const DEFAULT_MAX_BACKUPS: usize = 7;

const HOUR_S: i64 = 3_600;
const DAY_S: i64 = 24 * HOUR_S;
const WEEK_S: i64 = 7 * DAY_S;

/// A garbage collection policy (etcd-backup-restore's `--garbage-collection-policy`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Retention {
    /// Keep all full snapshots of the current hour, then one per hour for the rest of today,
    /// one per day for 7 days, one per week up to 5 weeks back (UTC; see the module docs).
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
            Retention::Exponential => exponential(snapshots, older, newest, now_unix_s),
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

/// Why garbage collection may not run on a control plane's backups now (see [`hold`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Hold {
    /// The applied state does not (yet, or any more) say that this member serves it at this
    /// epoch: the state lags the grant, the control plane moved on, or it is not running.
    #[error("the ring's state does not show it running here at epoch {epoch}")]
    NotServingHere {
        /// The epoch the host runs it at.
        epoch: u64,
    },
    /// A migration of the control plane is in progress: its source bucket is being copied.
    #[error("its migration of epoch {epoch} is in progress ({step})")]
    Migrating {
        /// The migration's epoch.
        epoch: u64,
        /// Where it stands.
        step: &'static str,
    },
}

/// Whether `member`, running control plane `name` at `epoch`, may garbage-collect its backups
/// under the applied `state`: `None` when it may; else why not. It may only while the state
/// shows it serving there (host, epoch, phase running) with no migration in progress (the
/// migration that brought it there done).
pub fn hold(state: &RingState, member: &str, name: &str, epoch: u64) -> Option<Hold> {
    let Some(cp) = state.control_planes.get(name) else {
        return Some(Hold::NotServingHere { epoch });
    };
    if cp.epoch != epoch || cp.host.as_deref() != Some(member) || cp.phase != Phase::Running {
        return Some(Hold::NotServingHere { epoch });
    }
    match &cp.migration {
        Some(m) if m.step != MigrationStep::Done => Some(Hold::Migrating {
            epoch: m.epoch,
            step: m.step.as_str(),
        }),
        _ => None,
    }
}

/// For each of the `older` full snapshots (oldest first; the newest full snapshot comes after
/// them and is not among them), whether the exponential policy keeps it at `now_unix_s`: see
/// the [module docs](self).
fn exponential(
    snapshots: &[SnapshotName],
    older: &[usize],
    newest: usize,
    now_unix_s: u64,
) -> Vec<bool> {
    let now = now_unix_s.min(i64::MAX as u64) as i64;
    let created = |i: usize| snapshots[i].created_unix_s().min(i64::MAX as u64) as i64;
    // The end of the current UTC day.
    let mut eod = now - now.rem_euclid(DAY_S) + DAY_S - 1;
    let mut weeks_tracked = false;
    let mut keep = vec![false; older.len()];
    // Walk newest first; each candidate is judged against the next newer full snapshot.
    let mut newer = created(newest);
    for (k, &i) in older.iter().enumerate().rev() {
        let c = created(i);
        let age_to_eod = eod - c;
        let threshold_h: i64 = if age_to_eod < DAY_S {
            if (c.rem_euclid(DAY_S)) / HOUR_S == now.rem_euclid(DAY_S) / HOUR_S {
                0
            } else {
                1
            }
        } else if age_to_eod < 8 * DAY_S {
            24
        } else if age_to_eod < 5 * WEEK_S {
            if !weeks_tracked {
                // The weeks end with the previous day.
                eod -= DAY_S;
                weeks_tracked = true;
            }
            24 * 7
        } else {
            newer = c;
            continue;
        };
        // Whole hours, days and weeks from eod, truncated toward zero as Go's int() does.
        let hour_change = (eod - c) / HOUR_S - (eod - newer) / HOUR_S;
        let day_change = (eod - c) / DAY_S - (eod - newer) / DAY_S;
        let week_change = (eod - c) / WEEK_S - (eod - newer) / WEEK_S;
        keep[k] = threshold_h == 0
            || hour_change / threshold_h != 0
            || day_change * 24 / threshold_h != 0
            || week_change * 24 * 7 / threshold_h != 0;
        newer = c;
    }
    keep
}

#[cfg(test)]
mod tests {
    use super::*;

    const NOW: u64 = 1_800_000_000;
    // The module's constants are i64 (etcd-backup-restore's signed arithmetic); the tests' u64.
    const HOUR_S: u64 = 3_600;
    const DAY_S: u64 = 24 * HOUR_S;
    const WEEK_S: u64 = 7 * DAY_S;

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
    fn exponential_keeps_etcd_backup_restores_windows_anchored_at_the_end_of_the_day() {
        // NOW is 08:00:00 UTC. A full snapshot every 30 minutes for 40 days, the newest at NOW.
        assert_eq!(NOW % DAY_S, 8 * HOUR_S);
        let snaps = history(1_800, 40 * DAY_S);
        let plan = plan(&snaps, Retention::Exponential, NOW);
        let day_start = NOW - NOW % DAY_S;
        let kept: Vec<u64> = plan
            .kept_full
            .iter()
            .map(|&i| snaps[i].created_unix_s())
            .collect();
        // Today: the newest of each earlier hour (xx:30), and the newest snapshot (08:00).
        let today: Vec<u64> = kept
            .iter()
            .filter(|c| **c >= day_start)
            .map(|c| c - day_start)
            .collect();
        let mut expected: Vec<u64> = (0..8).map(|h| h * 3_600 + 1_800).collect();
        expected.push(8 * 3_600);
        assert_eq!(today, expected);
        // The 7 days before: the newest of each day (23:30).
        for day in 1..=7u64 {
            let start = day_start - day * DAY_S;
            let of_day: Vec<u64> = kept
                .iter()
                .filter(|c| (start..start + DAY_S).contains(*c))
                .map(|c| c - start)
                .collect();
            assert_eq!(of_day, [23 * 3_600 + 1_800], "day -{day}");
        }
        // Then one per week window (weeks ending with the day 8 days back), each the newest
        // of its window: a snapshot at 23:30, 7 days apart.
        let weekly: Vec<u64> = kept
            .iter()
            .copied()
            .filter(|c| *c < day_start - 7 * DAY_S)
            .collect();
        assert!((3..=5).contains(&weekly.len()), "{weekly:?}");
        for pair in weekly.windows(2) {
            assert_eq!(pair[1] - pair[0], WEEK_S, "{weekly:?}");
        }
        assert!(weekly.iter().all(|c| c % DAY_S == 23 * 3_600 + 1_800));
        // Nothing 5 weeks before the end of today or older.
        let eod = day_start + DAY_S - 1;
        assert!(kept.iter().all(|c| eod - c < 5 * WEEK_S), "{kept:?}");
        // Deltas: only the newest stream's stay.
        let deltas_left = (0..snaps.len())
            .filter(|i| snaps[*i].kind() == SnapshotKind::Incr && !plan.delete.contains(i))
            .count();
        assert_eq!(deltas_left, 2);
    }

    #[test]
    fn exponential_keeps_every_snapshot_of_the_current_hour() {
        // 08:00, 08:10, ..., 08:50 of the same day; now 08:55.
        let now = NOW + 55 * 60;
        let snaps: Vec<SnapshotName> = (0..6).map(|k| full(10 + k, NOW + k * 600)).collect();
        let plan = plan(&snaps, Retention::Exponential, now);
        assert_eq!(plan.kept_full, [0, 1, 2, 3, 4, 5]);
        assert!(plan.delete.is_empty());
        // An hour later, only the newest of that hour and the newest overall stay.
        let plan = super::plan(&snaps, Retention::Exponential, now + 3_600);
        assert_eq!(plan.kept_full, [5]);
        // (the newest is the newest of its hour too)
        assert_eq!(plan.delete, [0, 1, 2, 3, 4]);
    }

    #[test]
    fn gc_runs_only_at_the_running_host_with_no_migration_in_progress() {
        let mut ring = crate::testing::Ring::new();
        ring.add("x", Some("b"), "a");
        let mut obs = crate::controller::Observations::default();
        let epoch = ring.cp("x").epoch;
        assert_eq!(
            hold(&ring.state, "a", "x", epoch),
            Some(Hold::NotServingHere { epoch }),
            "starting, not running yet"
        );
        obs.serving.insert(("x".into(), epoch, "a".into()));
        ring.run(&mut obs);
        let state = ring.state.clone();
        assert_eq!(hold(&state, "a", "x", epoch), None);
        assert_eq!(
            hold(&state, "b", "x", epoch),
            Some(Hold::NotServingHere { epoch })
        );
        assert_eq!(
            hold(&state, "a", "x", epoch + 1),
            Some(Hold::NotServingHere { epoch: epoch + 1 })
        );
        assert!(hold(&state, "a", "nope", epoch).is_some());
        let mut moving = state.clone();
        let cp = moving.control_planes.get_mut("x").unwrap();
        cp.migration = Some(crate::migration::Migration {
            epoch,
            from: Some("b".into()),
            to: "a".into(),
            source: "file:///b".into(),
            destination: "file:///a".into(),
            step: MigrationStep::Copying,
            started_unix_ms: 0,
            updated_unix_ms: 0,
            bytes_copied: 0,
            restored: None,
            data_loss_window_ms: None,
            note: String::new(),
        });
        assert_eq!(
            hold(&moving, "a", "x", epoch),
            Some(Hold::Migrating {
                epoch,
                step: "copying"
            })
        );
        let cp = moving.control_planes.get_mut("x").unwrap();
        cp.migration.as_mut().unwrap().step = MigrationStep::Done;
        assert_eq!(hold(&moving, "a", "x", epoch), None);
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
