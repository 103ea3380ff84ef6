//! etcd backups against a real etcd (Debian's 3.4) and a `file://` object store: full and
//! final snapshots streamed into the store, restore of the newest one that verifies into a
//! fresh data directory, an etcd started on it, and the faults: a corrupt or truncated newest
//! snapshot (restore falls back and reports it), a non-empty data directory (refused), an etcd
//! that does not run (a retryable error).
//!
//! Timings and sizes are printed (`--no-capture` shows them).

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Instant;

use garden_ring::backup::checksum::verify_bytes;
use garden_ring::backup::etcd::{EtcdClient, EtcdError};
use garden_ring::backup::object_store::local::LocalFileSystem;
use garden_ring::backup::object_store::path::Path as StorePath;
use garden_ring::backup::object_store::{ObjectStore, ObjectStoreExt};
use garden_ring::backup::restore::{
    RestoreError, RestoreOptions, RestoreTool, Restored, restore_newest,
};
use garden_ring::backup::snapshot::{
    RevisionSource, TakenSnapshot, stage_full_snapshot, take_final_snapshot, take_full_snapshot,
};
use garden_ring::core::backup_name::{Compression, SnapshotKind, SnapshotPath};
use garden_ring_tests::etcd::{Etcd, EtcdSpec, fast, tool};

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

impl Bucket {
    /// The file behind a stored snapshot.
    fn file(&self, taken: &TakenSnapshot) -> PathBuf {
        self.root.join(taken.location.as_ref())
    }
}

fn key(i: usize) -> String {
    format!("/registry/things/k{i:05}")
}

fn value(i: usize) -> String {
    format!("value-{i}-{}", "x".repeat(100))
}

/// Writes keys `range`, returns the revision of the last write.
async fn write_keys(etcd: &Etcd, range: std::ops::Range<usize>) -> u64 {
    let mut revision = 0;
    for i in range {
        revision = etcd.put(&key(i), &value(i)).await;
    }
    revision
}

fn restore_options(dir: &Path, spec: &EtcdSpec, data_dir: &Path, now: u64) -> RestoreOptions {
    let etcdctl = tool("etcdctl");
    let _ = dir;
    RestoreOptions {
        data_dir: data_dir.to_path_buf(),
        member_name: spec.name.clone(),
        peer_url: spec.peer_url(),
        tool: RestoreTool::detect(etcdctl.parent().unwrap()).unwrap(),
        now_unix_s: now,
        tool_timeout_ms: 60_000,
        only: None,
        replay_with: Some(tool("etcd")),
    }
}

/// A full snapshot of `etcd` into `bucket`, neither final nor gzipped, named with `now_unix_s`.
async fn plain_snapshot(bucket: &Bucket, etcd: &Etcd, now_unix_s: u64) -> TakenSnapshot {
    take_full_snapshot(
        etcd.client(),
        &bucket.store,
        &bucket.prefix,
        now_unix_s,
        false,
        false,
    )
    .await
    .unwrap()
}

/// Checks a stored snapshot by itself: its name, its checksum, its revision.
async fn check_stored(bucket: &Bucket, taken: &TakenSnapshot, expected_revision: u64) {
    let parsed = SnapshotPath::parse(taken.location.as_ref()).expect("the name parses");
    assert_eq!(parsed, taken.path);
    assert_eq!(parsed.prefix().as_str(), PREFIX);
    assert_eq!(parsed.name().kind(), SnapshotKind::Full);
    assert_eq!(parsed.name().start_revision(), 0);
    assert_eq!(parsed.name().last_revision(), expected_revision);
    assert_eq!(taken.revision, expected_revision);
    let bytes = bucket
        .store
        .get(&taken.location)
        .await
        .unwrap()
        .bytes()
        .await
        .unwrap();
    assert_eq!(bytes.len() as u64, taken.stored_size_bytes);
    let verified = verify_bytes(parsed.name().compression(), &bytes).expect("it verifies");
    assert_eq!(verified.sha256, taken.sha256);
    assert_eq!(verified.size_bytes, taken.snapshot_size_bytes);
    // etcd's database is bbolt pages; the trailer follows (etcdctl checks this shape too).
    assert_eq!((taken.snapshot_size_bytes - 32) % 512, 0);
}

/// Restores into `<dir>/<name>.etcd` and starts etcd on it.
async fn restore_and_start(
    dir: &Path,
    bucket: &Bucket,
    name: &str,
    now: u64,
) -> (Restored, Etcd, std::time::Duration) {
    let spec = EtcdSpec::reserve(name);
    let data_dir = dir.join(format!("{name}.etcd"));
    let began = Instant::now();
    let restored = restore_newest(
        &bucket.store,
        &bucket.prefix,
        &restore_options(dir, &spec, &data_dir, now),
    )
    .await
    .expect("restore");
    let took = began.elapsed();
    let etcd = Etcd::start_from(dir, spec, &data_dir).await;
    (restored, etcd, took)
}

#[tokio::test(flavor = "multi_thread")]
async fn snapshots_restore_everything_up_to_the_final_one_and_nothing_after() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let bucket = bucket(dir);
    let source = Etcd::start(dir, "source").await;
    println!("etcd started in {:?}", source.startup);

    let began = Instant::now();
    let rev_1000 = write_keys(&source, 0..1000).await;
    println!("1000 puts in {:?}", began.elapsed());
    assert_eq!(source.client().revision().await.unwrap(), rev_1000);

    let began = Instant::now();
    let full = take_full_snapshot(
        source.client(),
        &bucket.store,
        &bucket.prefix,
        T0,
        false,
        false,
    )
    .await
    .expect("full snapshot");
    println!(
        "full snapshot {} in {:?}: {} bytes, revision {} ({:?})",
        full.location,
        began.elapsed(),
        full.snapshot_size_bytes,
        full.revision,
        full.revision_source
    );
    assert_eq!(
        full.location.as_ref(),
        format!("{PREFIX}/v2/Full-00000000-{rev_1000:08}-{T0}")
    );
    check_stored(&bucket, &full, rev_1000).await;

    let rev_1500 = write_keys(&source, 1000..1500).await;
    let began = Instant::now();
    let last = take_final_snapshot(
        source.client(),
        &bucket.store,
        &bucket.prefix,
        T0 + 60,
        false,
    )
    .await
    .expect("final snapshot");
    println!(
        "final snapshot {} in {:?}: {} bytes",
        last.location,
        began.elapsed(),
        last.snapshot_size_bytes
    );
    assert!(last.location.as_ref().ends_with(".final"));
    assert!(last.path.name().is_final());
    check_stored(&bucket, &last, rev_1500).await;
    // Written after the final snapshot: must not come back.
    write_keys(&source, 1500..1600).await;

    let (restored, target, took) = restore_and_start(dir, &bucket, "target", T0 + 90).await;
    println!(
        "restored {} (revision {}, age {} s, data-loss window {} s) in {took:?}; etcd started on it in {:?}",
        restored.snapshot,
        restored.revision,
        restored.age_s,
        restored.data_loss_window_s(),
        target.startup
    );
    assert_eq!(restored.snapshot, last.path);
    assert_eq!(restored.revision, rev_1500);
    assert!(restored.is_final);
    assert_eq!(restored.age_s, 30);
    assert_eq!(restored.data_loss_window_s(), 0);
    assert!(restored.skipped_bad.is_empty());
    assert_eq!(restored.unapplied_incr, 0);
    assert_eq!(restored.sha256, last.sha256);

    let keys = target.client().get_prefix(b"/registry/").await.unwrap();
    assert_eq!(
        keys.len(),
        1500,
        "every key up to the final snapshot, none after"
    );
    for (i, kv) in keys.iter().enumerate() {
        assert_eq!(kv.key, key(i).as_bytes());
        assert_eq!(kv.value, value(i).as_bytes());
    }
    assert_eq!(target.get(&key(1499)).await, Some(value(1499)));
    assert_eq!(target.get(&key(1500)).await, None);
    assert_eq!(target.etcdctl_get(&key(7)), Some(value(7)));
    // The restored store continues at the snapshot's revision.
    assert_eq!(target.client().revision().await.unwrap(), rev_1500);

    // A second restore into the now non-empty data directory is refused.
    let spec = EtcdSpec::reserve("again");
    let err = restore_newest(
        &bucket.store,
        &bucket.prefix,
        &restore_options(dir, &spec, &target.data_dir, T0 + 90),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, RestoreError::DataDirNotEmpty { .. }), "{err}");
    assert!(!err.is_retryable());
    println!("refused: {err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn a_corrupt_or_truncated_newest_snapshot_falls_back_to_the_previous_one() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let bucket = bucket(dir);
    let source = Etcd::start(dir, "source").await;
    let rev_a = write_keys(&source, 0..1000).await;
    let older = plain_snapshot(&bucket, &source, T0).await;
    write_keys(&source, 1000..1200).await;
    let newer = plain_snapshot(&bucket, &source, T0 + 60).await;
    assert!(newer.revision > older.revision);
    let good = std::fs::read(bucket.file(&newer)).unwrap();

    // A flipped byte in the middle of the newer one.
    let mut flipped = good.clone();
    let middle = flipped.len() / 2;
    flipped[middle] ^= 0x01;
    std::fs::write(bucket.file(&newer), &flipped).unwrap();
    let (restored, target, took) = restore_and_start(dir, &bucket, "after-flip", T0 + 100).await;
    println!(
        "flipped byte: restored {} in {took:?}, skipped {:?}",
        restored.snapshot, restored.skipped_bad
    );
    assert_eq!(restored.snapshot, older.path);
    assert_eq!(restored.revision, rev_a);
    assert!(!restored.is_final);
    assert_eq!(restored.age_s, 100);
    assert_eq!(restored.data_loss_window_s(), 100);
    assert_eq!(restored.skipped_bad.len(), 1);
    assert_eq!(restored.skipped_bad[0].name, newer.location.to_string());
    assert!(
        restored.skipped_bad[0].why.contains("mismatch"),
        "{:?}",
        restored.skipped_bad
    );
    assert_eq!(target.get(&key(999)).await, Some(value(999)));
    assert_eq!(target.get(&key(1000)).await, None);
    drop(target);

    // Cut off: half of it.
    std::fs::write(bucket.file(&newer), &good[..good.len() / 2]).unwrap();
    let (restored, target, _) = restore_and_start(dir, &bucket, "after-cut", T0 + 100).await;
    println!("truncated: skipped {:?}", restored.skipped_bad);
    assert_eq!(restored.snapshot, older.path);
    assert_eq!(restored.skipped_bad.len(), 1);
    assert_eq!(restored.skipped_bad[0].name, newer.location.to_string());
    assert_eq!(target.get(&key(999)).await, Some(value(999)));
    drop(target);

    // Cut off to nothing but a few bytes, and the older one corrupt too: nothing usable.
    std::fs::write(bucket.file(&newer), &good[..10]).unwrap();
    let mut bad_older = std::fs::read(bucket.file(&older)).unwrap();
    bad_older[100] ^= 0xff;
    std::fs::write(bucket.file(&older), &bad_older).unwrap();
    let spec = EtcdSpec::reserve("nothing");
    let err = restore_newest(
        &bucket.store,
        &bucket.prefix,
        &restore_options(dir, &spec, &dir.join("nothing.etcd"), T0 + 100),
    )
    .await
    .unwrap_err();
    println!("nothing usable: {err}");
    let RestoreError::NoUsableSnapshot { skipped, .. } = &err else {
        panic!("{err}");
    };
    assert_eq!(skipped.len(), 2);
    assert!(skipped[0].why.contains("truncated"), "{skipped:?}");
    assert!(skipped[1].why.contains("mismatch"), "{skipped:?}");
    assert!(!dir.join("nothing.etcd").exists(), "no data directory left");
    assert!(
        std::fs::read_dir(dir).unwrap().all(|e| !e
            .unwrap()
            .file_name()
            .to_string_lossy()
            .ends_with(".restore.db")),
        "no temporary file left"
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn gzipped_snapshots_round_trip() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let bucket = bucket(dir);
    let source = Etcd::start(dir, "source").await;
    let revision = write_keys(&source, 0..1000).await;
    let began = Instant::now();
    let taken = take_full_snapshot(
        source.client(),
        &bucket.store,
        &bucket.prefix,
        T0,
        true,
        true,
    )
    .await
    .unwrap();
    println!(
        "gzipped final snapshot {} in {:?}: {} bytes stored for {} bytes of etcd snapshot",
        taken.location,
        began.elapsed(),
        taken.stored_size_bytes,
        taken.snapshot_size_bytes
    );
    assert!(taken.location.as_ref().ends_with(".gz.final"));
    assert_eq!(taken.path.name().compression(), Some(Compression::Gzip));
    assert!(taken.stored_size_bytes < taken.snapshot_size_bytes);
    check_stored(&bucket, &taken, revision).await;

    let (restored, target, took) = restore_and_start(dir, &bucket, "target", T0 + 5).await;
    println!("restored {} in {took:?}", restored.snapshot);
    assert_eq!(restored.snapshot, taken.path);
    assert_eq!(restored.stored_size_bytes, taken.stored_size_bytes);
    assert_eq!(restored.snapshot_size_bytes, taken.snapshot_size_bytes);
    assert_eq!(
        target
            .client()
            .get_prefix(b"/registry/")
            .await
            .unwrap()
            .len(),
        1000
    );
    assert_eq!(target.get(&key(500)).await, Some(value(500)));
}

#[tokio::test(flavor = "multi_thread")]
async fn an_etcd_that_does_not_run_is_a_retryable_error() {
    let spec = EtcdSpec::reserve("absent");
    let err = EtcdClient::connect(&spec.client_url(), fast())
        .await
        .unwrap_err();
    println!("{err}");
    assert!(err.is_retryable(), "{err}");
    assert!(matches!(err, EtcdError::Unavailable { .. }), "{err}");

    // One that stops after the client connected: the snapshot fails, retryably, and leaves
    // nothing in the store.
    let tmp = tempfile::tempdir().unwrap();
    let bucket = bucket(tmp.path());
    let mut etcd = Etcd::start(tmp.path(), "short-lived").await;
    let client = etcd.client().clone();
    etcd.stop();
    let err = take_full_snapshot(&client, &bucket.store, &bucket.prefix, T0, false, false)
        .await
        .unwrap_err();
    println!("{err}");
    assert!(err.is_retryable(), "{err}");
    assert!(
        matches!(
            err,
            // Unavailable (connection refused) or Cancelled (the connection died mid-call).
            garden_ring::backup::snapshot::SnapshotError::Etcd(_)
        ),
        "{err}"
    );
    let listed: Vec<_> = futures_list(&bucket).await;
    assert!(listed.is_empty(), "nothing stored: {listed:?}");

    // An empty bucket has nothing to restore.
    let err = restore_newest(
        &bucket.store,
        &bucket.prefix,
        &restore_options(tmp.path(), &spec, &tmp.path().join("x.etcd"), T0),
    )
    .await
    .unwrap_err();
    assert!(matches!(err, RestoreError::NoSnapshot { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread")]
async fn the_revision_comes_from_etcd() {
    let tmp = tempfile::tempdir().unwrap();
    let bucket = bucket(tmp.path());
    let etcd = Etcd::start(tmp.path(), "rev").await;
    let revision = write_keys(&etcd, 0..10).await;
    let taken = plain_snapshot(&bucket, &etcd, T0).await;
    // etcd 3.4 sends no header with the stream; 3.6 does.
    let status = etcd.client().status().await.unwrap();
    println!(
        "etcd {}: revision {} from {:?}",
        status.version, taken.revision, taken.revision_source
    );
    if status.version.starts_with("3.4") {
        assert_eq!(taken.revision_source, RevisionSource::StatusBefore);
    }
    assert_eq!(taken.revision, revision);
}

/// Every key in the bucket.
async fn futures_list(bucket: &Bucket) -> Vec<String> {
    let mut out = Vec::new();
    let mut walk = vec![bucket.root.clone()];
    while let Some(dir) = walk.pop() {
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.is_dir() {
                walk.push(path);
            } else {
                out.push(path.display().to_string());
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread")]
async fn a_staged_snapshot_is_invisible_until_completed_and_an_aborted_one_leaves_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    let bucket = bucket(tmp.path());
    let etcd = Etcd::start(tmp.path(), "staged").await;
    let revision = write_keys(&etcd, 0..100).await;

    let staged = stage_full_snapshot(
        etcd.client(),
        &bucket.store,
        &bucket.prefix,
        T0,
        false,
        false,
    )
    .await
    .unwrap();
    assert!(
        bucket
            .store
            .head(&staged.snapshot().location)
            .await
            .is_err(),
        "a staged snapshot is not visible under its name"
    );
    staged.abort().await.unwrap();
    assert_eq!(futures_list(&bucket).await, Vec::<String>::new());

    let staged = stage_full_snapshot(
        etcd.client(),
        &bucket.store,
        &bucket.prefix,
        T0 + 1,
        false,
        false,
    )
    .await
    .unwrap();
    let taken = staged.complete().await.unwrap();
    check_stored(&bucket, &taken, revision).await;
}

#[tokio::test(flavor = "multi_thread")]
async fn a_restore_limited_to_the_source_s_history_passes_over_a_newer_stranger() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path();
    let bucket = bucket(dir);
    let etcd = Etcd::start(dir, "history").await;
    let ours_revision = write_keys(&etcd, 0..100).await;
    let ours = plain_snapshot(&bucket, &etcd, T0).await;
    // A former owner's late snapshot: newer, more keys, not part of what the source holds.
    write_keys(&etcd, 100..200).await;
    let stranger = plain_snapshot(&bucket, &etcd, T0 + 10).await;
    assert!(stranger.revision > ours.revision);

    let spec = EtcdSpec::reserve("limited");
    let data_dir = dir.join("limited.etcd");
    let options = RestoreOptions {
        only: Some([ours.path.name().to_string()].into()),
        ..restore_options(dir, &spec, &data_dir, T0 + 20)
    };
    let restored = restore_newest(&bucket.store, &bucket.prefix, &options)
        .await
        .unwrap();
    assert_eq!(restored.snapshot, ours.path);
    assert_eq!(restored.revision, ours_revision);
    // The stranger reaches past what was restored: a host must not continue this chain.
    assert_eq!(restored.foreign_newer, 1);
    let target = Etcd::start_from(dir, spec, &data_dir).await;
    assert_eq!(
        target
            .client()
            .get_prefix(b"/registry/")
            .await
            .unwrap()
            .len(),
        100
    );

    // Without the limit the stranger would have been restored.
    let spec = EtcdSpec::reserve("unlimited");
    let data_dir = dir.join("unlimited.etcd");
    let restored = restore_newest(
        &bucket.store,
        &bucket.prefix,
        &restore_options(dir, &spec, &data_dir, T0 + 20),
    )
    .await
    .unwrap();
    assert_eq!(restored.snapshot, stranger.path);
    assert_eq!(restored.foreign_newer, 0);

    // A limit that names nothing there is "no snapshot", not an empty etcd.
    let spec = EtcdSpec::reserve("none");
    let options = RestoreOptions {
        only: Some(BTreeSet::new()),
        ..restore_options(dir, &spec, &dir.join("none.etcd"), T0 + 20)
    };
    let err = restore_newest(&bucket.store, &bucket.prefix, &options)
        .await
        .unwrap_err();
    assert!(matches!(err, RestoreError::NoSnapshot { .. }), "{err}");
}
