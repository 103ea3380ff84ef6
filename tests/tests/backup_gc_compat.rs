//! Garbage collection as the real etcd-backup-restore v0.43.0 does it: on the same bucket (a
//! Local store holding 40 days of full snapshots, each followed by a delta, denser over the
//! last 30 hours), `etcdbrctl snapshot` with `--garbage-collection-policy` runs its garbage
//! collector, and what it leaves must be exactly what `garden_ring::core::backup_retention`
//! plans to leave, for both policies. Without etcdbrctl the tests fail under `CI=true` and are
//! skipped elsewhere, saying why.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use garden_ring::core::backup_name::{SnapshotKind, SnapshotName};
use garden_ring::core::backup_retention::{Retention, plan};
use garden_ring_tests::etcd::Etcd;
use garden_ring_tests::etcdbrctl::{SnapshotOptions, Snapshotter, Store, require_etcdbrctl};

const HOUR_S: u64 = 3_600;
const DAY_S: u64 = 24 * HOUR_S;

/// What etcdbrctl's GC leaves of a synthetic history, against garden-ring's plan.
async fn compare(policy: &'static str, retention: Retention) {
    let Some(etcdbrctl) = require_etcdbrctl() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(dir.path(), "gc").await;
    // etcd's revision above every synthetic snapshot's, so etcdbrctl's own full snapshot (at
    // start) is the newest.
    let times = synthetic_times(garden_ring::time::unix_ms() / 1000);
    let top_revision = 4 * times.len() as u64 + 10;
    let mut revision = 0;
    for i in 0..top_revision {
        revision = etcd.put(&format!("/k/{i}"), "v").await;
    }
    assert!(revision > top_revision);
    let store = Store::local(&dir.path().join("home"), "bucket", "p");
    let v2 = store.local_v2_dir();
    std::fs::create_dir_all(&v2).unwrap();
    let mut synthetic = Vec::new();
    for (i, created) in times.iter().enumerate() {
        let full_revision = 4 * i as u64 + 1;
        synthetic.push(SnapshotName::new(SnapshotKind::Full, 0, full_revision, *created).unwrap());
        synthetic.push(
            SnapshotName::new(
                SnapshotKind::Incr,
                full_revision + 1,
                full_revision + 2,
                created + 60,
            )
            .unwrap(),
        );
    }
    for name in &synthetic {
        std::fs::write(v2.join(name.to_string()), b"not read by GC").unwrap();
    }

    let options = SnapshotOptions {
        delta_snapshot_period: Duration::ZERO,
        compress: false,
        garbage_collection: Some((policy, 7, Duration::from_millis(1_500))),
    };
    let began_s = garden_ring::time::unix_ms() / 1000;
    let snapshotter = Snapshotter::start(&etcdbrctl, dir.path(), &store, &etcd.spec, &options);
    // Two runs of its collector: the second one sees its own full snapshot for sure.
    let deadline = Instant::now() + Duration::from_secs(30);
    while snapshotter
        .log()
        .matches("GC: Total number garbage collected snapshots")
        .count()
        < 2
    {
        assert!(
            Instant::now() < deadline,
            "etcdbrctl did not collect twice in 30 s; log:\n{}",
            snapshotter.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let ended_s = garden_ring::time::unix_ms() / 1000;
    let saved = snapshotter.saved();
    drop(snapshotter);
    let left: BTreeSet<String> = store
        .objects()
        .await
        .0
        .into_iter()
        .map(|o| o.name)
        .collect();

    let mut all = synthetic.clone();
    for name in &saved {
        all.push(SnapshotName::parse(name).unwrap());
    }
    assert_eq!(saved.len(), 1, "etcdbrctl's own full snapshot: {saved:?}");
    // The same plan at the start and the end of the run unless an hour began meanwhile.
    let expected = |now_s: u64| -> BTreeSet<String> {
        let p = plan(&all, retention, now_s);
        (0..all.len())
            .filter(|i| !p.delete.contains(i))
            .map(|i| all[i].to_string())
            .collect()
    };
    let (at_start, at_end) = (expected(began_s), expected(ended_s));
    assert!(
        left == at_start || left == at_end,
        "{policy}: etcdbrctl left {} snapshots, garden-ring plans {}\nonly etcdbrctl kept: {:?}\nonly garden-ring kept: {:?}",
        left.len(),
        at_end.len(),
        left.difference(&at_end).collect::<Vec<_>>(),
        at_end.difference(&left).collect::<Vec<_>>()
    );
    let fulls = left.iter().filter(|n| n.starts_with("Full-")).count();
    println!(
        "{policy}: {} synthetic + {} of etcdbrctl's; both leave {} ({fulls} full), the same names",
        synthetic.len(),
        saved.len(),
        left.len()
    );
}

/// Creation times, oldest first: every 8 hours over 40 days and every 20 minutes over the
/// last 30 hours, all at least a minute before `now_s` (a delta follows each a minute later).
fn synthetic_times(now_s: u64) -> Vec<u64> {
    let newest = now_s - 2 * 60;
    let mut times = BTreeSet::new();
    for k in 0..40 * 3 {
        times.insert(newest - k * 8 * HOUR_S - DAY_S / 2);
    }
    for k in 0..30 * 3 {
        times.insert(newest - k * 20 * 60);
    }
    times.into_iter().collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn limit_based_gc_leaves_what_etcdbrctl_leaves() {
    compare("LimitBased", Retention::LimitBased { max_backups: 7 }).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn exponential_gc_leaves_what_etcdbrctl_leaves() {
    compare("Exponential", Retention::Exponential).await;
}
