//! Compatibility with the real etcd-backup-restore v0.43.0 (`etcdbrctl`), both ways: the cells
//! of a matrix {who writes the backup} x {who restores it} x {Local, S3} x {plain, gzip} x
//! {the hosted etcd: Debian's 3.4, upstream 3.5}, each printed as a `cell:` line:
//!
//! - etcdbrctl writes, etcdbrctl restores: proves the harness (`garden_ring_tests::etcdbrctl`);
//! - etcdbrctl writes, garden-ring restores (`restore_newest` with delta replay, with etcd 3.4's
//!   `etcdctl` + `etcd` and with 3.5's `etcdutl` + `etcd`): every key, delete and overwrite;
//! - garden-ring writes (its full snapshot, delta and final delta writers, from etcd 3.4 and
//!   3.5), etcdbrctl restores: exactly the acknowledged writes;
//! - copies: `etcdbrctl copy` output restored by garden-ring, garden-ring's copy (the
//!   migration's) restored by etcdbrctl.
//!
//! The reusable pieces live in `garden_ring_tests::compat` (the end-to-end test of a ringd host
//! on an etcdbrctl bucket, in `etcd_driver.rs`, uses them too):
//!
//! - [`Workload`]: puts, overwrites, deletes and multi-key transactions against a real etcd
//!   (puts through garden-ring's `EtcdClient`; deletes and transactions through the `etcdctl` of
//!   the same etcd), recording every write (revision, key, value or delete) and the expected
//!   final key -> value model;
//! - [`etcdbrctl_bucket`]: a backup written by etcdbrctl while the workload runs: one full
//!   snapshot (taken before the deltas' writes), at least two deltas holding overwrites and
//!   deletes, optionally a `.final` full snapshot (`etcdbrctl server`);
//! - [`read_all`]: every key of a data directory, read from an etcd started on it.
//!
//! What etcdbrctl restores with deltas is marked cluster version 3.5 (they are replayed through
//! its embedded etcd 3.5): Debian's etcd 3.4 refuses to start on it ("cluster cannot be
//! downgraded", checked here on a copy), so restores are read with upstream etcd 3.5
//! (`etcd35_bin_dir`). A restore of a `.final` full snapshot alone is not marked: 3.4 must
//! start on it and read the same keys. Without etcdbrctl or etcd 3.5 the tests fail under `CI=true` and are
//! skipped elsewhere, saying why. The final-snapshot test needs root (a network namespace).
//!
//! Timings and object names are printed (`--no-capture` shows them).

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use garden_ring::backup::copy::{CopyOptions as RingCopyOptions, copy_snapshots};
use garden_ring::backup::delta::DeltaEvent;
use garden_ring::backup::etcd::{WatchMessage, WatchStream};
use garden_ring::backup::restore::{
    RestoreOptions, RestoreTool, Restored as RingRestored, restore_newest,
};
use garden_ring::backup::snapshot::{stage_delta_snapshot, take_full_snapshot};
use garden_ring_tests::compat::{
    Bucket, STORE_PREFIX, Workload, Write, etcdbrctl_bucket, read_all,
};
use garden_ring_tests::etcd::{Etcd, EtcdSpec, default_bin_dir, require_etcd35_bin_dir};
use garden_ring_tests::etcdbrctl::{self, CopyOptions, Provider, Store, require_etcdbrctl};
use garden_ring_tests::s3::Moto;

/// Checks what etcdbrctl wrote against the workload: full snapshot(s) at the seed's revision
/// (`server` takes two at start, possibly with one name), then deltas that follow each other without a gap up to the last write and whose events are
/// exactly the workload's writes after the full snapshot, among them overwrites and deletes.
async fn check_deltas(bucket: &Bucket, compressed: bool) {
    let fulls: Vec<_> = bucket
        .listing
        .fulls()
        .into_iter()
        .filter(|f| !f.parsed.is_final())
        .collect();
    assert!(
        !fulls.is_empty()
            && fulls
                .iter()
                .all(|f| f.parsed.last_revision() == bucket.full_revision),
        "full snapshots only of the seed: {:?}",
        bucket.listing.names()
    );
    let deltas = bucket.listing.deltas();
    assert!(
        deltas.len() >= 2,
        "two deltas at least: {:?}",
        bucket.listing.names()
    );
    let mut next = bucket.full_revision + 1;
    let mut events = Vec::new();
    for delta in &deltas {
        assert_eq!(
            delta.parsed.compression().is_some(),
            compressed,
            "{}",
            delta.name
        );
        assert_eq!(
            delta.parsed.start_revision(),
            next,
            "no gap before {}",
            delta.name
        );
        next = delta.parsed.last_revision() + 1;
        let bytes = bucket.store.read(&delta.name).await;
        let decoded = etcdbrctl::decode_delta(&delta.parsed, &bytes);
        assert_eq!(
            decoded.first().map(|e| e.mod_revision),
            Some(delta.parsed.start_revision())
        );
        assert_eq!(
            decoded.last().map(|e| e.mod_revision),
            Some(delta.parsed.last_revision())
        );
        events.extend(decoded);
    }
    assert_eq!(
        next,
        bucket.last_revision + 1,
        "the deltas reach the last write"
    );
    let overwrites = events.iter().filter(|e| !e.delete && e.version > 1).count();
    let deletes = events.iter().filter(|e| e.delete).count();
    assert!(
        overwrites > 0 && deletes > 0,
        "{overwrites} overwrites, {deletes} deletes"
    );
    let mut in_deltas: Vec<Write> = events
        .iter()
        .map(|e| Write {
            revision: e.mod_revision,
            key: e.key_str(),
            value: (!e.delete).then(|| String::from_utf8(e.value.clone()).unwrap()),
        })
        .collect();
    let mut expected: Vec<Write> = bucket
        .writes
        .iter()
        .filter(|w| w.revision > bucket.full_revision)
        .cloned()
        .collect();
    in_deltas.sort();
    expected.sort();
    assert_eq!(
        in_deltas, expected,
        "the deltas hold exactly the writes after the full one"
    );
    println!(
        "  {} deltas, {} events ({overwrites} overwrites, {deletes} deletes), revisions {}..={}",
        deltas.len(),
        events.len(),
        bucket.full_revision + 1,
        bucket.last_revision
    );
}

/// Debian's etcd 3.4 on a copy of `data_dir`: when etcdbrctl's restore replayed deltas (through
/// its embedded etcd 3.5, which marks the data directory cluster version 3.5) it must refuse
/// it ("cluster cannot be downgraded"); a restore of a full snapshot alone is not marked, and
/// 3.4 must then read back `model` too.
async fn check_etcd34(data_dir: &Path, replayed_deltas: bool, model: &BTreeMap<String, String>) {
    let copy = PathBuf::from(format!("{}-for-3.4", data_dir.display()));
    garden_ring_tests::copy_dir(data_dir, &copy).unwrap();
    let dir = data_dir.parent().unwrap();
    let began = Instant::now();
    let started =
        Etcd::try_start_from_bin(&default_bin_dir(), dir, EtcdSpec::reserve("etcd34"), &copy).await;
    match (started, replayed_deltas) {
        (Err(e), true) => {
            assert!(
                e.log.contains("cluster cannot be downgraded"),
                "etcd 3.4 failed differently: {e}"
            );
            println!(
                "  etcd 3.4 refuses it in {:?}: {}",
                began.elapsed(),
                e.log
                    .lines()
                    .find(|l| l.contains("cannot be downgraded"))
                    .unwrap_or_default()
                    .trim()
            );
        }
        (Ok(etcd), true) => panic!(
            "Debian's etcd started on a data directory whose deltas etcdbrctl replayed (log: \
             {}); is it newer than 3.4?",
            etcd.log()
        ),
        (Err(e), false) => panic!("etcd 3.4 refuses a restore of a full snapshot alone: {e}"),
        (Ok(mut etcd), false) => {
            let read = etcd.client().get_prefix(b"").await.expect("read every key");
            etcd.stop();
            let read: BTreeMap<String, String> = read
                .into_iter()
                .map(|kv| {
                    let text = |b: Vec<u8>| String::from_utf8(b).expect("UTF-8");
                    (text(kv.key), text(kv.value))
                })
                .collect();
            assert_eq!(
                &read, model,
                "etcd 3.4 on the restore of a full snapshot alone"
            );
            println!(
                "  etcd 3.4 starts on it (no delta was replayed, so it is not marked 3.5) and \
                 reads the same {} keys",
                read.len()
            );
        }
    }
}

/// Restores `bucket` with etcdbrctl into `<dir>/<name>.etcd`, checks whether it replayed
/// deltas (`replays_deltas`), what etcd 3.4 makes of it ([`check_etcd34`]) and that etcd 3.5
/// reads back exactly the model.
async fn restore_and_compare(
    etcdbrctl: &Path,
    etcd35: &Path,
    bucket: &Bucket,
    name: &str,
    replays_deltas: bool,
) {
    let restored = etcdbrctl::restore(etcdbrctl, bucket.dir.path(), &bucket.store, name)
        .unwrap_or_else(|ran| panic!("etcdbrctl restore failed ({}):\n{}", ran.status, ran.log));
    let replayed = restored.ran.log.contains("Applying first delta snapshot");
    println!(
        "  etcdbrctl restore in {:?}{}",
        restored.ran.took,
        if replayed {
            ", deltas replayed"
        } else {
            ", full snapshot only"
        }
    );
    assert_eq!(
        replayed, replays_deltas,
        "restore log:\n{}",
        restored.ran.log
    );
    check_etcd34(&restored.data_dir, replayed, &bucket.model).await;
    let read = read_all(etcd35, &restored.data_dir).await;
    for (key, value) in &bucket.model {
        assert_eq!(read.get(key), Some(value), "{key} after the restore");
    }
    for key in read.keys() {
        assert!(
            bucket.model.contains_key(key),
            "{key} is restored but was deleted"
        );
    }
    assert_eq!(read, bucket.model);
}

/// Without its first delta the bucket has a gap: etcdbrctl's restore must fail, saying so.
fn check_gap_fails(etcdbrctl: &Path, bucket: &Bucket) {
    let first = bucket.listing.deltas()[0];
    std::fs::remove_file(bucket.store.local_v2_dir().join(&first.name)).unwrap();
    let ran = etcdbrctl::restore(etcdbrctl, bucket.dir.path(), &bucket.store, "with-gap")
        .map(|r| r.ran)
        .expect_err("a restore over a gap in the deltas fails");
    let line = ran
        .log
        .lines()
        .find(|l| l.contains("mismatched event revision while applying delta snapshot"))
        .unwrap_or_else(|| panic!("restore with a gap failed differently:\n{}", ran.log));
    println!(
        "  without {}, restore fails ({}): {}",
        first.name,
        ran.status,
        line.trim()
    );
}

#[tokio::test(flavor = "multi_thread")]
async fn etcdbrctl_restores_what_it_wrote() {
    let (Some(etcdbrctl), Some(etcd35)) = (require_etcdbrctl(), require_etcd35_bin_dir()) else {
        return;
    };
    let began = Instant::now();
    for (provider, compress) in [
        (Provider::Local, false),
        (Provider::Local, true),
        (Provider::S3, false),
        (Provider::S3, true),
    ] {
        let cell = Instant::now();
        let bucket = etcdbrctl_bucket(&etcdbrctl, provider, compress, false).await;
        check_deltas(&bucket, compress).await;
        restore_and_compare(&etcdbrctl, &etcd35, &bucket, "restored", true).await;
        let what = format!(
            "{} {}",
            provider.as_str(),
            if compress { "gzip" } else { "plain" }
        );
        for (version, bin_dir) in [("3.4", default_bin_dir()), ("3.5", etcd35.clone())] {
            let (restored, read) = garden_ring_restore(
                &bucket.store,
                bucket.dir.path(),
                &bin_dir,
                &format!("ring-{version}"),
            )
            .await;
            assert_eq!(
                read, bucket.model,
                "garden-ring's restore with etcd {version}"
            );
            assert_eq!(restored.deltas.len(), bucket.listing.deltas().len());
            assert_eq!(restored.revision, bucket.last_revision);
            assert_eq!(restored.replay_stopped, None);
            println!(
                "cell: etcdbrctl writes, garden-ring restores, {what}, etcd {version}: pass ({} keys, {} deltas replayed in {} ms)",
                read.len(),
                restored.deltas.len(),
                restored.replay_ms
            );
        }
        if provider == Provider::Local && !compress {
            check_gap_fails(&etcdbrctl, &bucket);
            // garden-ring restores up to the gap and says where it stopped.
            let (restored, read) = garden_ring_restore(
                &bucket.store,
                bucket.dir.path(),
                &default_bin_dir(),
                "ring-gap",
            )
            .await;
            let mut at_full = BTreeMap::new();
            for w in bucket
                .writes
                .iter()
                .filter(|w| w.revision <= bucket.full_revision)
            {
                match &w.value {
                    Some(v) => at_full.insert(w.key.clone(), v.clone()),
                    None => at_full.remove(&w.key),
                };
            }
            assert_eq!(
                read, at_full,
                "the full snapshot alone, nothing past the gap"
            );
            assert_eq!(restored.revision, bucket.full_revision);
            assert!(restored.deltas.is_empty());
            let stopped = restored.replay_stopped.expect("the gap is reported");
            assert!(stopped.why.contains("in no snapshot"), "{stopped:?}");
            println!(
                "cell: etcdbrctl writes with a gap, garden-ring restores, Local plain, etcd 3.4: pass (stops before {}: {})",
                stopped.name, stopped.why
            );
        }
        println!(
            "  {} {}: {} keys match, cell in {:?}\n",
            provider.as_str(),
            if compress { "gzip" } else { "plain" },
            bucket.model.len(),
            cell.elapsed()
        );
    }
    println!("etcdbrctl_restores_what_it_wrote: {:?}", began.elapsed());
}

#[tokio::test(flavor = "multi_thread")]
async fn etcdbrctl_final_full_snapshot_restores_alone_and_copies() {
    let (Some(etcdbrctl), Some(etcd35)) = (require_etcdbrctl(), require_etcd35_bin_dir()) else {
        return;
    };
    let began = Instant::now();
    for provider in [Provider::Local, Provider::S3] {
        let cell = Instant::now();
        let bucket = etcdbrctl_bucket(&etcdbrctl, provider, true, true).await;
        check_deltas(&bucket, true).await;
        let last = bucket.listing.0.last().expect("objects");
        assert!(
            last.parsed.is_final(),
            "the newest object is the final full snapshot: {last:?}"
        );
        assert_eq!(last.parsed.last_revision(), bucket.last_revision);
        restore_and_compare(&etcdbrctl, &etcd35, &bucket, "restored", false).await;
        for (version, bin_dir) in [("3.4", default_bin_dir()), ("3.5", etcd35.clone())] {
            let (restored, read) = garden_ring_restore(
                &bucket.store,
                bucket.dir.path(),
                &bin_dir,
                &format!("ring-{version}"),
            )
            .await;
            assert_eq!(
                read, bucket.model,
                "garden-ring's restore with etcd {version}"
            );
            assert!(restored.is_final, "{restored:?}");
            assert!(
                restored.deltas.is_empty(),
                "nothing after the final full snapshot"
            );
            println!(
                "cell: etcdbrctl writes (with a .final full), garden-ring restores, {} gzip, etcd {version}: pass",
                provider.as_str()
            );
        }

        if provider == Provider::Local {
            // The final full snapshot alone, as Gardener copies a backup to a new bucket.
            let to = Store::local(&bucket.store.home, "copied", STORE_PREFIX);
            let options = CopyOptions {
                wait_for_final_snapshot: true,
                max_backups_to_copy: Some(1),
            };
            let ran = etcdbrctl::copy(&etcdbrctl, bucket.dir.path(), &bucket.store, &to, &options)
                .unwrap_or_else(|ran| {
                    panic!("etcdbrctl copy failed ({}):\n{}", ran.status, ran.log)
                });
            let copied = to.objects().await;
            let stripped = last.name.strip_suffix(".final").expect("a .final name");
            assert_eq!(
                copied.names(),
                [stripped],
                "only the final full snapshot, as not final"
            );
            assert_eq!(
                bucket.store.read(&last.name).await,
                to.read(stripped).await,
                "copied byte for byte"
            );
            println!("  etcdbrctl copy in {:?}: {:?}", ran.took, copied.names());
            let restored = etcdbrctl::restore(&etcdbrctl, bucket.dir.path(), &to, "from-copy")
                .unwrap_or_else(|ran| panic!("restore of the copy failed:\n{}", ran.log));
            assert_eq!(read_all(&etcd35, &restored.data_dir).await, bucket.model);
            // garden-ring restores etcdbrctl's copy.
            let (_, read) =
                garden_ring_restore(&to, bucket.dir.path(), &default_bin_dir(), "ring-from-copy")
                    .await;
            assert_eq!(read, bucket.model);
            println!("cell: etcdbrctl copy, garden-ring restores, Local gzip, etcd 3.4: pass");
            // etcdbrctl restores garden-ring's copy (the migration's, every snapshot).
            let ring_to = Store::local(&bucket.store.home, "ring-copied", STORE_PREFIX);
            std::fs::create_dir_all(ring_to.local_v2_dir()).unwrap();
            let report = copy_snapshots(
                &bucket.store.open(),
                &ring_to.open(),
                &RingCopyOptions::new(&bucket.store.settings()),
            )
            .await
            .expect("garden-ring's copy");
            assert_eq!(report.copied.len(), bucket.listing.0.len());
            assert!(
                ring_to
                    .objects()
                    .await
                    .names()
                    .iter()
                    .all(|n| !n.ends_with(".final")),
                "the copy strips .final"
            );
            let restored =
                etcdbrctl::restore(&etcdbrctl, bucket.dir.path(), &ring_to, "from-ring-copy")
                    .unwrap_or_else(|ran| {
                        panic!("restore of garden-ring's copy failed:\n{}", ran.log)
                    });
            assert_eq!(read_all(&etcd35, &restored.data_dir).await, bucket.model);
            println!("cell: garden-ring copy, etcdbrctl restores, Local gzip: pass");
        }
        println!(
            "  {} gzip with a final full snapshot: {} keys match, cell in {:?}\n",
            provider.as_str(),
            bucket.model.len(),
            cell.elapsed()
        );
    }
    println!(
        "etcdbrctl_final_full_snapshot_restores_alone_and_copies: {:?}",
        began.elapsed()
    );
}

/// garden-ring's restore of `store` (the newest full snapshot and the deltas after it,
/// replayed) into `<dir>/<name>.etcd` with the tools of `bin_dir` (`etcdctl` for 3.4,
/// `etcdutl` for 3.5, and its `etcd` for the replay); returns what it reported and every key,
/// read with an etcd from `bin_dir` started on it.
async fn garden_ring_restore(
    store: &Store,
    dir: &Path,
    bin_dir: &Path,
    name: &str,
) -> (RingRestored, BTreeMap<String, String>) {
    let location = store.open();
    let spec = EtcdSpec::reserve(name);
    let data_dir = dir.join(format!("{name}.etcd"));
    let options = RestoreOptions {
        data_dir: data_dir.clone(),
        member_name: spec.name.clone(),
        peer_url: spec.peer_url(),
        tool: RestoreTool::detect(bin_dir).expect("etcdctl or etcdutl"),
        now_unix_s: garden_ring::time::unix_ms() / 1000,
        tool_timeout_ms: 60_000,
        only: None,
        replay_with: Some(bin_dir.join("etcd")),
    };
    let began = Instant::now();
    let restored = restore_newest(&location.store(), location.prefix(), &options)
        .await
        .unwrap_or_else(|e| panic!("garden-ring's restore of {}: {e}", store.url()));
    println!(
        "  garden-ring restore with {} in {:?}: {} + {} delta(s), revision {}",
        options.tool.path().display(),
        began.elapsed(),
        restored.snapshot,
        restored.deltas.len(),
        restored.revision
    );
    let read = read_all(bin_dir, &data_dir).await;
    (restored, read)
}

/// Events from `watch` until one at `revision` arrived, stamped with the time they came.
async fn collect_events(watch: &mut WatchStream, revision: u64) -> Vec<DeltaEvent> {
    let mut out: Vec<DeltaEvent> = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(10);
    while out.last().is_none_or(|e| (e.revision() as u64) < revision) {
        let left = deadline.saturating_duration_since(Instant::now());
        let message = tokio::time::timeout(left, watch.next())
            .await
            .expect("the watch delivers within 10 s")
            .expect("the watch runs");
        let WatchMessage::Events { events, .. } = message else {
            panic!("unexpected {message:?}");
        };
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
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

#[tokio::test(flavor = "multi_thread")]
async fn etcdbrctl_restores_what_garden_ring_wrote() {
    let (Some(etcdbrctl), Some(etcd35)) = (require_etcdbrctl(), require_etcd35_bin_dir()) else {
        return;
    };
    let began = Instant::now();
    for (version, bin_dir) in [("3.4", default_bin_dir()), ("3.5", etcd35.clone())] {
        for (provider, compress) in [
            (Provider::Local, false),
            (Provider::Local, true),
            (Provider::S3, false),
            (Provider::S3, true),
        ] {
            let cell = Instant::now();
            let dir = tempfile::Builder::new()
                .prefix("backup-compat-ring-")
                .tempdir()
                .unwrap();
            let path = dir.path();
            let (store, _moto) = match provider {
                Provider::Local => {
                    let store = Store::local(&path.join("home"), "backups", STORE_PREFIX);
                    std::fs::create_dir_all(store.local_v2_dir()).unwrap();
                    (store, None)
                }
                Provider::S3 => {
                    let moto = Moto::start(&path.join("moto"));
                    moto.create_bucket("backups");
                    let store = Store::s3(&moto, &path.join("home"), "backups", STORE_PREFIX);
                    (store, Some(moto))
                }
            };
            let location = store.open();
            let objects = location.store();
            let prefix = location.prefix().clone();
            let spec = EtcdSpec::reserve("source");
            let source =
                Etcd::start_from_bin(&bin_dir, path, spec, &path.join("source.etcd")).await;
            let mut workload = Workload::new(&source);
            workload.seed().await;
            let now = garden_ring::time::unix_ms() / 1000;
            let full = take_full_snapshot(source.client(), &objects, &prefix, now, false, compress)
                .await
                .expect("full snapshot");
            let mut watch = source.client().watch_all(full.revision + 1).await.unwrap();
            let mut after = full.revision;
            for (round, final_) in [(1, false), (2, true)] {
                if round == 1 {
                    workload.round_1().await;
                } else {
                    workload.round_2().await;
                }
                let events = collect_events(&mut watch, workload.revision()).await;
                let delta = stage_delta_snapshot(
                    &objects,
                    &prefix,
                    after + 1,
                    &events,
                    now + round,
                    final_,
                    compress,
                )
                .await
                .unwrap()
                .complete()
                .await
                .unwrap();
                after = delta.revision;
            }
            let listing = store.objects().await;
            assert_eq!(listing.fulls().len(), 1);
            assert_eq!(listing.deltas().len(), 2);
            assert!(listing.0.last().unwrap().parsed.is_final());
            let restored =
                etcdbrctl::restore(&etcdbrctl, path, &store, "restored").unwrap_or_else(|ran| {
                    panic!("etcdbrctl restore failed ({}):\n{}", ran.status, ran.log)
                });
            assert!(
                restored.ran.log.contains("Applying first delta snapshot"),
                "etcdbrctl replayed garden-ring's deltas:\n{}",
                restored.ran.log
            );
            let read = read_all(&etcd35, &restored.data_dir).await;
            assert_eq!(read, workload.model, "exactly what was acknowledged");
            let what = format!(
                "{} {}, etcd {version}",
                provider.as_str(),
                if compress { "gzip" } else { "plain" }
            );
            println!(
                "cell: garden-ring writes, etcdbrctl restores, {what}: pass ({} keys; {:?}; restore {:?}; cell {:?})",
                read.len(),
                listing.names(),
                restored.ran.took,
                cell.elapsed()
            );
            // And garden-ring reads its own writing back with the same etcd.
            let (ring, read) = garden_ring_restore(&store, path, &bin_dir, "ring").await;
            assert_eq!(read, workload.model);
            assert!(ring.is_final && ring.deltas.len() == 2, "{ring:?}");
        }
    }
    println!(
        "etcdbrctl_restores_what_garden_ring_wrote: {:?}",
        began.elapsed()
    );
}
