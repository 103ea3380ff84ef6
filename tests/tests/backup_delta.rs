//! Delta snapshots against a real etcd (Debian's 3.4) and a `file://` object store: events
//! taken from a watch, written in etcd-backup-restore's format, replayed onto a restored full
//! snapshot; and the faults: a corrupt, truncated or missing delta in the middle (the replay
//! stops at the last good one and says where), a watch behind a compaction.
//!
//! Timings are printed (`--no-capture` shows them).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use garden_ring::backup::delta::DeltaEvent;
use garden_ring::backup::etcd::{TxnOp, WatchMessage, WatchStream};
use garden_ring::backup::object_store::ObjectStore;
use garden_ring::backup::object_store::local::LocalFileSystem;
use garden_ring::backup::object_store::path::Path as StorePath;
use garden_ring::backup::restore::{RestoreOptions, RestoreTool, Restored, restore_newest};
use garden_ring::backup::snapshot::{TakenSnapshot, stage_delta_snapshot, take_full_snapshot};
use garden_ring_tests::etcd::{Etcd, EtcdSpec, tool};

const PREFIX: &str = "shoot--dev--ring-a/etcd-main";
const T0: u64 = 1_700_000_000;

struct Bucket {
    root: PathBuf,
    store: Arc<dyn ObjectStore>,
    prefix: StorePath,
}

fn bucket(dir: &Path) -> Bucket {
    let root = dir.join("bucket");
    std::fs::create_dir_all(&root).unwrap();
    Bucket {
        store: Arc::new(LocalFileSystem::new_with_prefix(&root).unwrap()),
        root,
        prefix: StorePath::from(PREFIX),
    }
}

/// Every key and value of `etcd`.
async fn contents(etcd: &Etcd) -> BTreeMap<String, String> {
    garden_ring_tests::etcd::key_values(etcd.client(), b"").await
}

/// Puts, overwrites, deletes and a two-key transaction: round `round` of the workload.
async fn workload(etcd: &Etcd, round: usize) {
    let c = etcd.client();
    for i in 0..20 {
        etcd.put(
            &format!("/registry/r{round}/k{i:02}"),
            &format!("v{round}-{i}"),
        )
        .await;
    }
    // Overwrite and delete keys of the round before.
    if round > 0 {
        etcd.put(&format!("/registry/r{}/k00", round - 1), "overwritten")
            .await;
        c.delete(format!("/registry/r{}/k01", round - 1).as_bytes())
            .await
            .unwrap();
    }
    c.txn(&[
        TxnOp::Put {
            key: format!("/registry/txn/{round}/a").into_bytes(),
            value: b"A".to_vec(),
        },
        TxnOp::Put {
            key: format!("/registry/txn/{round}/b").into_bytes(),
            value: b"B".to_vec(),
        },
        TxnOp::Delete {
            key: format!("/registry/r{round}/k19").into_bytes(),
        },
    ])
    .await
    .unwrap();
}

/// Events from `watch` until one at `revision` arrived.
async fn collect(watch: &mut WatchStream, revision: u64) -> Vec<DeltaEvent> {
    let mut out: Vec<DeltaEvent> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while out.last().is_none_or(|e| (e.revision() as u64) < revision) {
        let left = deadline.saturating_duration_since(Instant::now());
        let message = tokio::time::timeout(left, watch.next())
            .await
            .expect("the watch delivers within 10 s")
            .unwrap();
        let WatchMessage::Events { events, .. } = message else {
            panic!("unexpected {message:?}");
        };
        let now = SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap()
            .as_nanos() as i128;
        out.extend(events.into_iter().map(|event| DeltaEvent {
            event,
            time_unix_ns: now,
        }));
    }
    assert_eq!(out.last().unwrap().revision() as u64, revision);
    out
}

/// Stores `events` as the delta after `after` (gzipped when `gzip`), named with `at`.
async fn delta(
    bucket: &Bucket,
    after: u64,
    events: &[DeltaEvent],
    at: u64,
    gzip: bool,
) -> TakenSnapshot {
    stage_delta_snapshot(
        &bucket.store,
        &bucket.prefix,
        after + 1,
        events,
        at,
        false,
        gzip,
    )
    .await
    .unwrap()
    .complete()
    .await
    .unwrap()
}

fn options(spec: &EtcdSpec, data_dir: &Path) -> RestoreOptions {
    RestoreOptions {
        data_dir: data_dir.to_path_buf(),
        member_name: spec.name.clone(),
        peer_url: spec.peer_url(),
        tool: RestoreTool::detect(tool("etcdctl").parent().unwrap()).unwrap(),
        now_unix_s: T0 + 100,
        tool_timeout_ms: 60_000,
        only: None,
        replay_with: Some(tool("etcd")),
    }
}

/// Restores `bucket` into `<dir>/<name>.etcd`, starts etcd on it, returns what it holds.
async fn restore(
    dir: &Path,
    bucket: &Bucket,
    name: &str,
) -> (Restored, BTreeMap<String, String>, u64) {
    let spec = EtcdSpec::reserve(name);
    let data_dir = dir.join(format!("{name}.etcd"));
    let began = Instant::now();
    let restored = restore_newest(&bucket.store, &bucket.prefix, &options(&spec, &data_dir))
        .await
        .expect("restore");
    println!(
        "{name}: restored {} + {} delta(s) to revision {} in {:?} (replay {} ms)",
        restored.snapshot,
        restored.deltas.len(),
        restored.revision,
        began.elapsed(),
        restored.replay_ms
    );
    let etcd = Etcd::start_from(dir, spec, &data_dir).await;
    let revision = etcd.client().revision().await.unwrap();
    (restored, contents(&etcd).await, revision)
}

/// A source etcd with a full snapshot and three deltas (plain, gzip, plain); returns the
/// deltas and the contents after each.
async fn three_deltas(
    dir: &Path,
    bucket: &Bucket,
) -> (Vec<TakenSnapshot>, Vec<BTreeMap<String, String>>) {
    let etcd = Etcd::start(dir, "source").await;
    workload(&etcd, 0).await;
    let full = take_full_snapshot(
        etcd.client(),
        &bucket.store,
        &bucket.prefix,
        T0,
        false,
        false,
    )
    .await
    .unwrap();
    let mut watch = etcd.client().watch_all(full.revision + 1).await.unwrap();
    let mut after = full.revision;
    let mut taken = Vec::new();
    let mut states = vec![contents(&etcd).await];
    for round in 1..=3 {
        workload(&etcd, round).await;
        let revision = etcd.client().revision().await.unwrap();
        let events = collect(&mut watch, revision).await;
        let d = delta(bucket, after, &events, T0 + round as u64, round == 2).await;
        assert_eq!(d.revision, revision);
        after = d.revision;
        taken.push(d);
        states.push(contents(&etcd).await);
    }
    (taken, states)
}

#[tokio::test(flavor = "multi_thread")]
async fn deltas_from_a_watch_replay_every_write_delete_and_overwrite() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = bucket(dir.path());
    let (deltas, states) = three_deltas(dir.path(), &bucket).await;
    let (restored, got, revision) = restore(dir.path(), &bucket, "restored").await;
    assert_eq!(restored.deltas.len(), 3);
    assert_eq!(restored.replay_stopped, None);
    assert_eq!(restored.revision, deltas[2].revision);
    assert_eq!(revision, deltas[2].revision, "the revision is the source's");
    assert_eq!(restored.newest_applied(), &deltas[2].path);
    assert_eq!(restored.created_unix_s, T0 + 3);
    assert_eq!(restored.unapplied_incr, 0);
    assert_eq!(
        &got,
        states.last().unwrap(),
        "every key, delete and overwrite"
    );
    assert!(got.contains_key("/registry/txn/3/b"));
    assert_eq!(got["/registry/r2/k00"], "overwritten");
    assert!(!got.contains_key("/registry/r2/k01"));
}

#[tokio::test(flavor = "multi_thread")]
async fn a_corrupt_truncated_or_missing_delta_stops_the_replay_at_the_last_good_one() {
    let dir = tempfile::tempdir().unwrap();
    let bucket = bucket(dir.path());
    let (deltas, states) = three_deltas(dir.path(), &bucket).await;
    let second = bucket.root.join(deltas[1].location.as_ref());
    let original = std::fs::read(&second).unwrap();

    let mut flipped = original.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x40;
    for (case, bytes) in [
        ("corrupt", Some(flipped)),
        ("truncated", Some(original[..original.len() - 10].to_vec())),
        ("missing", None),
    ] {
        match &bytes {
            Some(b) => std::fs::write(&second, b).unwrap(),
            None => std::fs::remove_file(&second).unwrap(),
        }
        let (restored, got, revision) = restore(dir.path(), &bucket, case).await;
        assert_eq!(restored.deltas, vec![deltas[0].path.clone()], "{case}");
        assert_eq!(restored.revision, deltas[0].revision, "{case}");
        assert_eq!(
            revision, deltas[0].revision,
            "{case}: never past the bad one"
        );
        assert_eq!(
            got, states[1],
            "{case}: exactly what the first delta reached"
        );
        let stopped = restored.replay_stopped.expect("the stop is reported");
        let named = if bytes.is_some() {
            &deltas[1]
        } else {
            &deltas[2]
        };
        assert_eq!(stopped.name, named.location.to_string(), "{case}");
        println!("{case}: stopped at {}: {}", stopped.name, stopped.why);
        assert_eq!(
            restored.unapplied_incr,
            if bytes.is_some() { 2 } else { 1 },
            "{case}"
        );
        // The window is that of the newest delta applied.
        assert_eq!(restored.created_unix_s, T0 + 1);
    }
    std::fs::write(&second, &original).unwrap();
    let (restored, got, _) = restore(dir.path(), &bucket, "repaired").await;
    assert_eq!(restored.deltas.len(), 3);
    assert_eq!(&got, states.last().unwrap());
}

#[tokio::test(flavor = "multi_thread")]
async fn a_watch_behind_a_compaction_says_so() {
    let dir = tempfile::tempdir().unwrap();
    let etcd = Etcd::start(dir.path(), "compacted").await;
    for i in 0..10 {
        etcd.put(&format!("k{i}"), "v").await;
    }
    let revision = etcd.client().revision().await.unwrap();
    etcd.client().compact(revision).await.unwrap();
    let mut watch = etcd.client().watch_all(2).await.unwrap();
    let message = tokio::time::timeout(Duration::from_secs(10), watch.next())
        .await
        .unwrap()
        .unwrap();
    assert_eq!(
        message,
        WatchMessage::Compacted {
            compact_revision: revision
        }
    );
}
