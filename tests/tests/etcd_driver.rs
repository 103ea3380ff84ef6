//! The `etcd` driver with real processes: three `ringd` on loopback, each running the etcd of
//! the control planes it hosts (Debian's `etcd-server`), backups in `file://` locations and on
//! a real S3 API (`moto_server`). A control plane's data follows it when its host is lost or
//! it is switched over, and an old host that comes back uploads nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use garden_ring::backup::etcd::{EtcdClient, EtcdClientOptions};
use garden_ring::backup::layout::list_snapshots;
use garden_ring::backup::location::BackupLocation;
use garden_ring::config::BackupSettings;
use garden_ring::core::backup_name::SnapshotKind;
use garden_ring::pb;
use garden_ring_tests::etcd::{MEMBERS, etcd_control_plane, fast, file_backups, tool};
use garden_ring_tests::{Ring, RingOptions, add_control_plane, cps, eventually, wait_all_healthy};

fn kill_zone(ring: &mut Ring, i: usize) {
    ring.kill_zone(i);
}

/// A ring whose members run etcd, snapshotting every `snapshot_interval_ms`.
fn etcd_ring(snapshot_interval_ms: u64, backup: BackupSettings) -> Ring {
    etcd_ring_with(
        garden_ring_tests::etcd::driver(snapshot_interval_ms),
        backup,
    )
}

/// A ring whose members run etcd with a full snapshot at start (and hourly) and delta
/// snapshots every `delta_ms`: the shape of Gardener's backups.
fn etcd_ring_with_deltas(delta_ms: u64, backup: BackupSettings) -> Ring {
    etcd_ring_with(
        garden_ring_tests::etcd::driver_with_deltas(3_600_000, delta_ms),
        backup,
    )
}

fn etcd_ring_with(driver: garden_ring::config::DriverSettings, backup: BackupSettings) -> Ring {
    let mut ring = Ring::prepare(RingOptions {
        driver,
        ..RingOptions::default()
    });
    for p in &mut ring.procs {
        p.config.backup = backup.clone();
        p.spawn();
    }
    ring
}

/// Waits until `name` runs on a member other than `not_on` (any member when empty) and
/// returns it.
async fn running_elsewhere(
    ring: &Ring,
    among: &[usize],
    name: &str,
    not_on: &str,
    timeout: Duration,
) -> pb::ControlPlane {
    eventually(
        timeout,
        &format!("{name} runs on a member other than {not_on:?}"),
        || async {
            let cp = cps(ring, among).await.remove(name)?;
            (cp.phase == "running" && cp.host != not_on && !cp.host.is_empty()).then_some(cp)
        },
    )
    .await
}

/// A client of the control plane's etcd at `host`'s endpoint.
async fn etcd_at(cp: &pb::ControlPlane, host: &str) -> EtcdClient {
    let endpoint = format!("http://{}", cp.endpoints[host]);
    EtcdClient::connect(&endpoint, fast())
        .await
        .unwrap_or_else(|e| panic!("connect to {name} at {endpoint}: {e}", name = cp.name))
}

/// Puts `key` (value `v`) and returns the revision, retrying for up to 10 s: on a loaded
/// machine a host may miss a lease renewal, stop the instance and start it again on the same
/// epoch's data (a put is idempotent, so a retried one changes nothing it should not).
async fn put_retrying(etcd: &EtcdClient, key: &str) -> u64 {
    eventually(Duration::from_secs(10), &format!("put {key}"), || async {
        etcd.put(key.as_bytes(), b"v").await.ok()
    })
    .await
}

/// Puts `/registry/<prefix>000`, `001`... (`n` keys, retrying each); the keys and the last
/// revision.
async fn put_keys(etcd: &EtcdClient, prefix: &str, n: usize) -> (BTreeSet<String>, u64) {
    let mut written = BTreeSet::new();
    let mut last_revision = 0;
    for i in 0..n {
        let key = format!("/registry/{prefix}{i:03}");
        last_revision = put_retrying(etcd, &key).await;
        written.insert(key);
    }
    (written, last_revision)
}

/// The full snapshots in `url` (name -> last revision).
async fn full_snapshots(url: &str, backup: &BackupSettings) -> BTreeMap<String, u64> {
    let location = BackupLocation::parse(url, backup).unwrap();
    list_snapshots(&location)
        .await
        .unwrap()
        .snapshots
        .iter()
        .map(|s| (s.path.name().to_string(), s.path.name().last_revision()))
        .collect()
}

/// Waits (10 s at most) until a full snapshot in `url` holds `revision`; returns its name and
/// last revision.
async fn snapshot_holding(url: &str, backup: &BackupSettings, revision: u64) -> (String, u64) {
    eventually(
        Duration::from_secs(10),
        &format!("a snapshot in {url} holds revision {revision}"),
        || async {
            full_snapshots(url, backup)
                .await
                .into_iter()
                .find(|(_, last)| *last >= revision)
        },
    )
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_host_s_control_plane_comes_back_with_every_snapshotted_key() {
    let backup = BackupSettings::default();
    // One full snapshot (at start), then deltas: the restore replays them.
    let mut ring = etcd_ring_with_deltas(300, backup.clone());
    wait_all_healthy(&ring).await;
    let backups = file_backups(ring.dir.path(), "cp1");
    let req = etcd_control_plane("cp1", "a", &backups["a"], backups.clone());
    add_control_plane(&ring.client(), req).await.unwrap();
    let cp = eventually(Duration::from_secs(20), "cp1 runs on a", || async {
        let cp = cps(&ring, &[0, 1, 2]).await.remove("cp1")?;
        (cp.phase == "running" && cp.host == "a").then_some(cp)
    })
    .await;

    // Keys through the public endpoint; then a snapshot that holds them all.
    let etcd = etcd_at(&cp, "a").await;
    let mut written = BTreeSet::new();
    let mut last_revision = 0;
    for i in 0..200 {
        let key = format!("/registry/k{i:04}");
        last_revision = put_retrying(&etcd, &key).await;
        written.insert(key);
    }
    let holding = snapshot_holding(&backups["a"], &backup, last_revision).await;
    let holding_created_s: u64 = holding
        .0
        .split('-')
        .nth(3)
        .unwrap()
        .split('.')
        .next()
        .unwrap()
        .parse()
        .unwrap();

    let killed_at = Instant::now();
    let killed_unix_ms = garden_ring::time::unix_ms();
    kill_zone(&mut ring, 0);
    // A newer snapshot that is corrupt (as a disk or a half-finished foreign upload leaves
    // one): the new host detects it by checksum and restores the one before.
    let a_dir = backups["a"].strip_prefix("file://").unwrap();
    let corrupt = format!(
        "Full-00000000-{:08}-{}",
        last_revision + 1_000,
        killed_unix_ms / 1000
    );
    std::fs::write(
        Path::new(a_dir).join("v2").join(&corrupt),
        vec![0x5a; 64 * 1024],
    )
    .unwrap();
    let moved = running_elsewhere(&ring, &[1, 2], "cp1", "a", Duration::from_secs(30)).await;
    let rto = killed_at.elapsed();
    let migration = moved.migration.clone().unwrap();
    assert!(
        migration.note.contains("skipped 1 full snapshot") && migration.note.contains(&corrupt),
        "{migration:?}"
    );
    // ... and the history says so (the event of the migration's report).
    let history = ring.ringctl(&["history", "--output", "json"]);
    let history = String::from_utf8_lossy(&history.stdout);
    assert!(
        history.contains(&format!(
            "skipped 1 full snapshot(s) that do not verify, newest v2/{corrupt}"
        )),
        "{history}"
    );
    // The restored snapshot holds every key: `holding` or a later one of the same revision.
    let restored_name = migration.restored.rsplit('/').next().unwrap();
    let field = |i: usize| -> u64 { restored_name.split('-').nth(i).unwrap().parse().unwrap() };
    assert!(
        field(2) >= last_revision && field(3) >= holding_created_s,
        "{migration:?}"
    );
    let snapshot_created_s = field(3);
    assert_eq!(migration.step, "done", "{migration:?}");
    assert_eq!(migration.from, "a");
    assert_eq!(migration.source, backups["a"]);
    assert_eq!(migration.destination, backups[&moved.host]);
    assert!(!migration.restored.is_empty(), "{migration:?}");
    let window_ms = migration.data_loss_window_ms.expect("a data-loss window");
    // The window is the restored snapshot's age when it was restored: at least its age when
    // the zone died, at most its age now (snapshot names have whole seconds).
    let age_at_kill_ms = killed_unix_ms.saturating_sub(snapshot_created_s * 1000);
    let age_now_ms = garden_ring::time::unix_ms() - snapshot_created_s * 1000 + 1000;
    assert!(
        window_ms + 1000 >= age_at_kill_ms && window_ms <= age_now_ms,
        "window {window_ms} ms, snapshot age at the kill {age_at_kill_ms} ms, now {age_now_ms} ms"
    );

    let got = keys_at(&moved, &moved.host).await;
    let missing: Vec<_> = written.difference(&got).collect();
    assert!(missing.is_empty(), "missing after the move: {missing:?}");
    println!(
        "zone loss: cp1 a -> {} in {} ms; restored {} ({} keys), data-loss window {window_ms} ms",
        moved.host,
        rto.as_millis(),
        migration.restored,
        got.len()
    );
}

/// Writes keys `/registry/<prefix><i>` through `etcd` until `stop` is set or a write fails;
/// returns the keys whose writes were acknowledged.
async fn write_until_refused(
    etcd: EtcdClient,
    prefix: &str,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<String> {
    let mut acked = Vec::new();
    for i in 0.. {
        if *stop.borrow() {
            break;
        }
        let key = format!("/registry/{prefix}{i:06}");
        match etcd.put(key.as_bytes(), b"v").await {
            Ok(_) => acked.push(key),
            Err(_) => break,
        }
    }
    acked
}

async fn keys_at(cp: &pb::ControlPlane, host: &str) -> BTreeSet<String> {
    etcd_at(cp, host)
        .await
        .get_prefix_keys(b"/registry/")
        .await
        .unwrap()
        .into_iter()
        .map(|kv| String::from_utf8(kv.key).unwrap())
        .collect()
}

async fn running_on(ring: &Ring, name: &str, host: &str) -> pb::ControlPlane {
    garden_ring_tests::running_on_within(ring, name, host, Duration::from_secs(20)).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switchover_loses_no_acknowledged_write() {
    let backup = BackupSettings::default();
    // Full snapshots far apart, deltas every 300 ms: only the final delta can carry the last
    // writes.
    let ring = etcd_ring_with_deltas(300, backup.clone());
    wait_all_healthy(&ring).await;
    let backups = file_backups(ring.dir.path(), "cp2");
    let req = etcd_control_plane("cp2", "a", &backups["a"], backups.clone());
    add_control_plane(&ring.client(), req).await.unwrap();
    let cp = running_on(&ring, "cp2", "a").await;

    let (stop, stopped) = tokio::sync::watch::channel(false);
    let writer = tokio::spawn(write_until_refused(etcd_at(&cp, "a").await, "s", stopped));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let started = Instant::now();
    switchover(&ring, "cp2", "b");
    let moved = running_on(&ring, "cp2", "b").await;
    let took = started.elapsed();
    let _ = stop.send(true);
    let acked = writer.await.unwrap();
    assert!(acked.len() > 10, "only {} writes acknowledged", acked.len());

    let got = keys_at(&moved, "b").await;
    let missing: Vec<_> = acked.iter().filter(|k| !got.contains(*k)).collect();
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged writes missing: {:?}",
        missing.len(),
        acked.len(),
        &missing[..missing.len().min(5)]
    );
    let migration = moved.migration.unwrap();
    // The final snapshot, copied without its `.final` (like `etcdbrctl copy`).
    let finals = full_snapshots(&backups["a"], &backup).await;
    let restored_name = migration.restored.rsplit('/').next().unwrap();
    let a_log = ring.procs[0].log();
    let cp2_log: Vec<&str> = a_log.lines().filter(|l| l.contains("cp2")).collect();
    assert!(
        finals.contains_key(&format!("{restored_name}.final")),
        "{migration:?} not from a final snapshot in {finals:?}; a's log:\n{}",
        cp2_log.join("\n")
    );
    assert_eq!(migration.data_loss_window_ms, Some(0), "{migration:?}");
    // The old host serves no more.
    assert!(
        EtcdClient::connect(&format!("http://{}", moved.endpoints["a"]), fast())
            .await
            .is_err(),
        "a still accepts connections for cp2"
    );
    println!(
        "switchover: cp2 a -> b in {} ms; {} acknowledged writes, all at b; restored {}",
        took.as_millis(),
        acked.len(),
        migration.restored
    );

    // The real etcd-backup-restore restores what a's agent wrote (a full snapshot, deltas, the
    // final delta) with every acknowledged write.
    let Some((got, took)) = etcdbrctl_keys(&ring, &backups["a"]).await else {
        return;
    };
    let missing: Vec<_> = acked.iter().filter(|k| !got.contains(*k)).collect();
    assert!(
        missing.is_empty(),
        "etcdbrctl's restore of a's bucket misses {} acknowledged writes",
        missing.len()
    );
    println!(
        "cell: ringd's etcd driver writes (etcd 3.4, file://, plain), etcdbrctl restores: pass ({} acknowledged writes, restore {:?})",
        acked.len(),
        took
    );
}

/// Adds the etcd control plane `name` on a, with a `file://` location per member, and waits
/// until it runs there; returns the locations and the control plane.
async fn add_on_a(ring: &Ring, name: &str) -> (BTreeMap<String, String>, pb::ControlPlane) {
    let backups = file_backups(ring.dir.path(), name);
    let req = etcd_control_plane(name, "a", &backups["a"], backups.clone());
    add_control_plane(&ring.client(), req).await.unwrap();
    (backups, running_on(ring, name, "a").await)
}

/// Waits (10 s at most) until the snapshots in `location` reach `revision` by their names;
/// returns that listing.
async fn backups_reaching(
    location: &BackupLocation,
    revision: u64,
) -> garden_ring::backup::layout::Listing {
    eventually(
        Duration::from_secs(10),
        &format!("the backups in {location} reach revision {revision}"),
        || async {
            let listing = list_snapshots(location).await.ok()?;
            let reach = listing
                .snapshots
                .iter()
                .map(|s| s.path.name().last_revision())
                .max()?;
            (reach >= revision).then_some(listing)
        },
    )
    .await
}

/// The keys under `/registry/` of what the real `etcdbrctl restore` makes of the `file://`
/// location `url`, and how long it took; `None` without etcdbrctl or etcd 3.5 (outside CI).
async fn etcdbrctl_keys(ring: &Ring, url: &str) -> Option<(BTreeSet<String>, Duration)> {
    let (Some(etcdbrctl), Some(etcd35)) = (
        garden_ring_tests::etcdbrctl::require_etcdbrctl(),
        garden_ring_tests::etcd::require_etcd35_bin_dir(),
    ) else {
        return None;
    };
    let dir = PathBuf::from(url.strip_prefix("file://").unwrap());
    let store = garden_ring_tests::etcdbrctl::Store::local(
        dir.parent().unwrap().parent().unwrap(),
        &dir.parent().unwrap().file_name().unwrap().to_string_lossy(),
        &dir.file_name().unwrap().to_string_lossy(),
    );
    assert_eq!(store.local_v2_dir(), dir.join("v2"));
    let restored =
        garden_ring_tests::etcdbrctl::restore(&etcdbrctl, ring.dir.path(), &store, "etcdbrctl")
            .unwrap_or_else(|ran| panic!("etcdbrctl restore of {url}:\n{}", ran.log));
    let got = garden_ring_tests::etcd::Etcd::start_from_bin(
        &etcd35,
        ring.dir.path(),
        garden_ring_tests::etcd::EtcdSpec::reserve("read-etcdbrctl"),
        &restored.data_dir,
    )
    .await
    .client()
    .get_prefix_keys(b"/registry/")
    .await
    .unwrap();
    let keys = got
        .into_iter()
        .map(|kv| String::from_utf8(kv.key).unwrap())
        .collect();
    Some((keys, restored.ran.took))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_former_owner_s_late_snapshot_is_never_restored_when_the_control_plane_returns() {
    let backup = BackupSettings::default();
    // Periodic snapshots far apart: what moves is the final snapshots.
    let ring = etcd_ring(600_000, backup.clone());
    wait_all_healthy(&ring).await;
    let backups = file_backups(ring.dir.path(), "cp7");
    let req = etcd_control_plane("cp7", "a", &backups["a"], backups.clone());
    add_control_plane(&ring.client(), req).await.unwrap();
    let cp = running_on(&ring, "cp7", "a").await;
    let etcd = etcd_at(&cp, "a").await;
    for i in 0..10 {
        etcd.put(format!("/registry/old{i}").as_bytes(), b"v")
            .await
            .unwrap();
    }
    switchover(&ring, "cp7", "b");
    let at_b = running_on(&ring, "cp7", "b").await;

    // What a member frozen inside an upload leaves behind when it wakes up after the move: a
    // snapshot of its old data, completed in its own location, under a revision the ring
    // never reaches (a's final snapshot, renamed).
    let a_location = BackupLocation::parse(&backups["a"], &backup).unwrap();
    let a_dir = PathBuf::from(backups["a"].strip_prefix("file://").unwrap()).join("v2");
    let final_name = full_snapshots(&backups["a"], &backup)
        .await
        .into_keys()
        .find(|n| n.ends_with(".final"))
        .expect("a's final snapshot");
    let stranger = format!(
        "Full-00000000-09999999-{}",
        garden_ring::time::unix_ms() / 1000
    );
    put_snapshot(&a_location, &stranger, &a_dir.join(&final_name)).await;

    let etcd = etcd_at(&at_b, "b").await;
    for i in 0..10 {
        etcd.put(format!("/registry/new{i}").as_bytes(), b"v")
            .await
            .unwrap();
    }
    switchover(&ring, "cp7", "a");
    let back = running_on(&ring, "cp7", "a").await;
    let got = keys_at(&back, "a").await;
    let restored = back.migration.unwrap().restored;
    assert!(
        !restored.contains(&stranger),
        "restored the former owner's late snapshot {restored}"
    );
    for i in 0..10 {
        assert!(
            got.contains(&format!("/registry/new{i}")),
            "b's writes missing at a (restored {restored}): {got:?}"
        );
    }
    assert!(
        ring.procs[0].log().contains(&format!(
            "that are not the source's history (newest {stranger})"
        )),
        "{}",
        ring.procs[0].log()
    );
    println!("returned to a: restored {restored}, {} keys", got.len());
}

/// `ringctl switchover NAME --to TO`, which must succeed.
fn switchover(ring: &Ring, name: &str, to: &str) {
    let out = ring.ringctl(&["switchover", name, "--to", to, "--reason", "test"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Puts `file` into `location` under `v2/<name>`.
async fn put_snapshot(location: &BackupLocation, name: &str, file: &Path) {
    use garden_ring::backup::object_store::{ObjectStoreExt, PutPayload};
    let key = format!("{}/v2/{name}", location.prefix().as_ref());
    let bytes = std::fs::read(file).unwrap();
    location
        .store()
        .put(&key.as_str().into(), PutPayload::from(bytes))
        .await
        .unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_bucket_written_by_etcd_backup_restore_is_migrated_and_restored() {
    let dir = tempfile::tempdir().unwrap();
    let moto = garden_ring_tests::s3::Moto::start(dir.path());
    moto.create_bucket("etcdbr");
    let backup = moto.settings(&moto.endpoint());

    // etcd-backup-restore's bucket: a full snapshot, a newer gzipped one, and a delta after it,
    // named as etcdbrctl names them; the snapshots are etcdctl's (the same bytes as etcd's
    // snapshot API, sha256 trailer included).
    let mut source = garden_ring_tests::etcd::Etcd::start(dir.path(), "source").await;
    let fixture = BackupLocation::parse("s3://etcdbr/shoot--dev--x/etcd-main", &backup).unwrap();
    let save = |file: &Path| {
        let out = std::process::Command::new(tool("etcdctl"))
            .env("ETCDCTL_API", "3")
            .args(["--endpoints", &source.spec.client_url(), "snapshot", "save"])
            .arg(file)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{}",
            String::from_utf8_lossy(&out.stderr)
        );
    };
    let mut revision = 0;
    for i in 0..50 {
        revision = source.put(&format!("/registry/old{i:03}"), "v").await;
    }
    let older = dir.path().join("older.db");
    save(&older);
    put_snapshot(
        &fixture,
        &format!("Full-00000000-{revision:08}-1700000000"),
        &older,
    )
    .await;
    for i in 0..100 {
        revision = source.put(&format!("/registry/new{i:03}"), "v").await;
    }
    let newer = dir.path().join("newer.db");
    save(&newer);
    let gz = std::process::Command::new("gzip")
        .arg("-k")
        .arg(&newer)
        .status()
        .unwrap();
    assert!(gz.success());
    let newest_name = format!("Full-00000000-{revision:08}-1700000100.gz");
    put_snapshot(&fixture, &newest_name, &newer.with_extension("db.gz")).await;
    put_snapshot(
        &fixture,
        &format!(
            "Incr-{:08}-{:08}-1700000160.gz",
            revision + 1,
            revision + 10
        ),
        &newer.with_extension("db.gz"),
    )
    .await;
    source.stop();

    let ring = etcd_ring(600_000, backup.clone());
    wait_all_healthy(&ring).await;
    let backups = file_backups(ring.dir.path(), "cp3");
    let req = etcd_control_plane("cp3", "b", fixture.url(), backups.clone());
    add_control_plane(&ring.client(), req).await.unwrap();
    let cp = running_on(&ring, "cp3", "b").await;
    let migration = cp.migration.clone().unwrap();
    assert_eq!(migration.source, fixture.url());
    assert!(migration.restored.ends_with(&newest_name), "{migration:?}");
    assert!(migration.bytes_copied > 0, "{migration:?}");

    let got = keys_at(&cp, "b").await;
    assert_eq!(got.len(), 150, "{got:?}");
    assert!(got.contains("/registry/old049") && got.contains("/registry/new099"));
    // The copy kept etcd-backup-restore's names and took the chain the restore needs only:
    // the older full snapshot stays at the source.
    let copied = full_snapshots(&backups["b"], &backup).await;
    assert!(copied.contains_key(&newest_name), "{copied:?}");
    assert!(
        !copied.keys().any(|n| n.ends_with("-1700000000")),
        "{copied:?}"
    );
    assert!(
        full_snapshots(fixture.url(), &backup)
            .await
            .keys()
            .any(|n| n.ends_with("-1700000000"))
    );
    println!(
        "etcd-backup-restore bucket: restored {} with {} keys; {} bytes copied",
        migration.restored,
        got.len(),
        migration.bytes_copied
    );
}

/// A moto_server with a bucket `zone-<member>` per member, reached through a [`Proxy`] the
/// test can cut or stall, and the backup settings that point at the proxy.
///
/// [`Proxy`]: garden_ring_tests::s3::Proxy
fn store_behind_proxy(
    dir: &Path,
) -> (
    garden_ring_tests::s3::Moto,
    garden_ring_tests::s3::Proxy,
    BackupSettings,
) {
    let moto = garden_ring_tests::s3::Moto::start(dir);
    for m in MEMBERS {
        moto.create_bucket(&format!("zone-{m}"));
    }
    let proxy = garden_ring_tests::s3::Proxy::start(moto.addr());
    let backup = moto.settings(&proxy.endpoint());
    (moto, proxy, backup)
}

/// Control plane `name`'s location in each member's bucket of [`store_behind_proxy`].
fn s3_backups(name: &str) -> BTreeMap<String, String> {
    MEMBERS
        .iter()
        .map(|m| (m.to_string(), format!("s3://zone-{m}/{name}")))
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_object_store_outage_during_a_migration_delays_it_and_loses_nothing() {
    let dir = tempfile::tempdir().unwrap();
    let (_moto, proxy, backup) = store_behind_proxy(dir.path());
    let mut ring = etcd_ring(300, backup.clone());
    wait_all_healthy(&ring).await;
    let backups = s3_backups("cp4");
    let req = etcd_control_plane("cp4", "a", &backups["a"], backups.clone());
    add_control_plane(&ring.client(), req).await.unwrap();
    let cp = running_on(&ring, "cp4", "a").await;
    let etcd = etcd_at(&cp, "a").await;
    let (written, last_revision) = put_keys(&etcd, "o", 100).await;
    snapshot_holding(&backups["a"], &backup, last_revision).await;

    proxy.cut();
    kill_zone(&mut ring, 0);
    // The new host is assigned and tries; the ring shows why it waits.
    let waiting = eventually(
        Duration::from_secs(30),
        "the migration reports the outage",
        || async {
            let cp = cps(&ring, &[1, 2]).await.remove("cp4")?;
            let m = cp.migration?;
            (m.from == "a" && m.step == "copying" && m.note.contains("retrying")).then_some(m)
        },
    )
    .await;
    assert_ne!(waiting.to, "a");
    let outage_ends = Instant::now();
    proxy.restore();
    let moved = running_elsewhere(&ring, &[1, 2], "cp4", "a", Duration::from_secs(30)).await;
    let got = keys_at(&moved, &moved.host).await;
    let missing: Vec<_> = written.difference(&got).collect();
    assert!(missing.is_empty(), "missing after the move: {missing:?}");
    println!(
        "object store outage: the migration waited ({:?}), then finished {} ms after the store returned; {} keys at {}",
        waiting.note,
        outage_ends.elapsed().as_millis(),
        got.len(),
        moved.host
    );
}

/// A host whose lease lapses while an upload hangs (the object store holds every byte) serves
/// again as soon as its lease comes back, without restarting etcd: the hung delta is given up
/// when the lease runs out, the final snapshot is bounded by the lease, not by the store
/// client's timeouts (which held a host's restart for 20-40 s on a lossy link), and the guard
/// freezes etcd at the deadline and thaws it when the grant returns.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lapsed_lease_does_not_wait_for_a_hung_upload() {
    use nix::sys::signal::Signal;
    let dir = tempfile::tempdir().unwrap();
    let (_moto, proxy, backup) = store_behind_proxy(dir.path());
    let mut ring = Ring::prepare(RingOptions {
        driver: garden_ring_tests::etcd::driver_with_deltas(3_600_000, 200),
        ..RingOptions::default()
    });
    for p in &mut ring.procs {
        p.config.backup = backup.clone();
        // The others freeze for longer than a lease: nothing may move meanwhile.
        p.config.timing.member_suspect_ms = 4_000;
        p.config.timing.member_lost_ms = 8_000;
        p.spawn();
    }
    wait_all_healthy(&ring).await;
    let backups = s3_backups("cp8");
    let req = etcd_control_plane("cp8", "a", &backups["a"], backups.clone());
    add_control_plane(&ring.client(), req).await.unwrap();
    let cp = running_on(&ring, "cp8", "a").await;
    let etcd = etcd_at(&cp, "a").await;
    let (mut written, last_revision) = put_keys(&etcd, "h", 50).await;
    snapshot_holding(&backups["a"], &backup, last_revision).await;

    // Every upload from now on hangs; a write makes sure a delta is cut (and hangs).
    proxy.stall();
    etcd.put(b"/registry/stalled", b"v").await.unwrap();
    written.insert("/registry/stalled".to_string());
    let count = |what: &str| ring.procs[0].log().matches(what).count();
    let (ended_before, frozen_before) = (count("etcd instance ended"), count("guard: frozen"));
    // The others freeze: a cannot renew, and its lease runs out.
    let lease = Duration::from_millis(ring.procs[0].config.timing.lease_ms);
    tokio::time::sleep(Duration::from_millis(400)).await;
    ring.procs[1].signal(Signal::SIGSTOP);
    ring.procs[2].signal(Signal::SIGSTOP);
    eventually(
        lease * 6,
        "a's guard freezes etcd on the lapsed lease",
        || async { (count("guard: frozen") > frozen_before).then_some(()) },
    )
    .await;
    ring.procs[1].signal(Signal::SIGCONT);
    ring.procs[2].signal(Signal::SIGCONT);
    let thawed = Instant::now();
    eventually(
        Duration::from_secs(10),
        "cp8 serves again at a (a write is acknowledged)",
        || async {
            let etcd = EtcdClient::connect(&format!("http://{}", cp.endpoints["a"]), fast())
                .await
                .ok()?;
            etcd.put(b"/registry/back", b"v").await.ok()
        },
    )
    .await;
    let back_ms = thawed.elapsed().as_millis();
    written.insert("/registry/back".to_string());
    let log = ring.procs[0].log();
    assert!(
        log.contains("delta snapshot given up: the lease is running out")
            || log.contains("the lease ran out before the final snapshot was stored"),
        "the hung upload was not given up:\n{log}"
    );
    assert!(log.contains("guard: thawed"), "{log}");
    assert!(log.contains("serves again"), "{log}");
    assert_eq!(
        count("etcd instance ended"),
        ended_before,
        "etcd restarted:\n{log}"
    );
    let now = cps(&ring, &[0, 1, 2]).await.remove("cp8").unwrap();
    assert_eq!((now.host.as_str(), now.epoch), ("a", cp.epoch), "cp8 moved");
    let got = keys_at(&now, "a").await;
    let missing: Vec<_> = written.difference(&got).collect();
    assert!(missing.is_empty(), "missing: {missing:?}");
    proxy.restore();
    println!(
        "hung upload: etcd frozen on the lapse; serving again {back_ms} ms after the others thawed, no restart"
    );
}

/// A host frozen whole (ringd, its guard and etcd: SIGSTOP, as a paused VM) for longer than its
/// lease but shorter than `member_lost_ms`: nothing moves, and after the thaw the control plane
/// serves again at the same epoch. Its gate closed itself at the deadline while the serving loop
/// was frozen too; the first renewal after the thaw comes before the loop runs, so the loop
/// must notice the closed gate (chaos zone-freeze at production timings found it unreachable
/// for good).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_host_frozen_past_its_lease_serves_again_after_the_thaw() {
    use nix::sys::signal::Signal;
    let mut ring = Ring::prepare(RingOptions {
        driver: garden_ring_tests::etcd::driver_with_deltas(3_600_000, 200),
        ..RingOptions::default()
    });
    for p in &mut ring.procs {
        // Production timings (lease 4 s): found there; the health check the serving loop
        // waits on (half a lease) outlasts the thaw's first renewal.
        p.config.timing = garden_ring::config::Timing::default();
        p.spawn();
    }
    wait_all_healthy(&ring).await;
    let backups = file_backups(ring.dir.path(), "cp10");
    let req = etcd_control_plane("cp10", "a", &backups["a"], backups.clone());
    add_control_plane(&ring.client(), req).await.unwrap();
    let cp = running_on(&ring, "cp10", "a").await;
    let etcd = etcd_at(&cp, "a").await;
    let (mut written, _) = put_keys(&etcd, "f", 20).await;

    // Every process of member a: its ringd, and what names its data directory (guard, etcd).
    let data = ring.procs[0].config.data_dir.display().to_string();
    let out = std::process::Command::new("pgrep")
        .args(["-f", &data])
        .output()
        .expect("pgrep");
    let mut pids: Vec<i32> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| l.trim().parse().ok())
        .collect();
    pids.push(ring.procs[0].pid().expect("a runs") as i32);
    pids.sort_unstable();
    pids.dedup();
    assert!(pids.len() >= 3, "ringd, guard and etcd: {pids:?}");
    let signal = |s: Signal| {
        for pid in &pids {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid), s);
        }
    };
    let lease = Duration::from_millis(ring.procs[0].config.timing.lease_ms);
    // Which of ringd's tasks runs first after a thaw is a race: several rounds, frozen at
    // different points of the serving loop (the writes keep deltas being cut).
    let mut back_ms = Vec::new();
    for round in 0..FREEZE_ROUNDS {
        let key = format!("/registry/thawed-{round}");
        etcd.put(key.as_bytes(), b"v").await.ok();
        signal(Signal::SIGSTOP);
        tokio::time::sleep(lease + lease / 4).await;
        signal(Signal::SIGCONT);
        let thawed = Instant::now();
        eventually(
            Duration::from_secs(15),
            &format!("cp10 serves again at a after freeze {round} (a write is acknowledged)"),
            || async {
                let etcd = EtcdClient::connect(&format!("http://{}", cp.endpoints["a"]), fast())
                    .await
                    .ok()?;
                etcd.put(key.as_bytes(), b"v").await.ok()
            },
        )
        .await;
        back_ms.push(thawed.elapsed().as_millis());
        written.insert(key);
    }
    let now = cps(&ring, &[0, 1, 2]).await.remove("cp10").unwrap();
    assert_eq!(
        (now.host.as_str(), now.epoch),
        ("a", cp.epoch),
        "cp10 moved"
    );
    let got = keys_at(&now, "a").await;
    let missing: Vec<_> = written.difference(&got).collect();
    assert!(missing.is_empty(), "missing: {missing:?}");
    println!(
        "host frozen {FREEZE_ROUNDS} times for {} ms (lease {} ms): serving again {back_ms:?} ms after each thaw, same epoch",
        (lease + lease / 4).as_millis(),
        lease.as_millis()
    );
}

/// How often `a_host_frozen_past_its_lease_serves_again_after_the_thaw` freezes its host.
const FREEZE_ROUNDS: usize = 3;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_returning_old_host_uploads_nothing_and_stays_fenced() {
    use nix::sys::signal::Signal;
    let backup = BackupSettings::default();
    let ring = etcd_ring(200, backup.clone());
    wait_all_healthy(&ring).await;
    let backups = file_backups(ring.dir.path(), "cp5");
    let req = etcd_control_plane("cp5", "a", &backups["a"], backups.clone());
    add_control_plane(&ring.client(), req).await.unwrap();
    let cp = running_on(&ring, "cp5", "a").await;
    let revision = etcd_at(&cp, "a")
        .await
        .put(b"/registry/x", b"v")
        .await
        .unwrap();
    // Frozen before its first snapshot, a would leave nothing to restore: the new host would
    // rightly refuse to start cp5 empty, and wait.
    snapshot_holding(&backups["a"], &backup, revision).await;

    // A client of cp5 at a that waits as long as it takes: its write, sent while a is frozen,
    // must not be acknowledged when a wakes up past its lease.
    let patient = EtcdClient::connect(
        &format!("http://{}", cp.endpoints["a"]),
        EtcdClientOptions {
            request_timeout_ms: 60_000,
            ..fast()
        },
    )
    .await
    .unwrap();

    // Freeze the whole zone: ringd, its guard and etcd.
    let data_root = ring.procs[0].config.data_dir.display().to_string();
    ring.procs[0].signal(Signal::SIGSTOP);
    let stop_all = |signal: &str| {
        let _ = std::process::Command::new("pkill")
            .args([signal, "-f", &data_root])
            .status();
    };
    stop_all("-STOP");
    let in_flight = tokio::spawn(async move { patient.put(b"/registry/late", b"v").await });
    let moved = running_elsewhere(&ring, &[1, 2], "cp5", "a", Duration::from_secs(30)).await;
    let before = full_snapshots(&backups["a"], &backup).await;

    // An instance may have ended before (a slow first start is retried): wait for the next.
    let ended = || ring.procs[0].log().matches("etcd instance ended").count();
    let ended_before = ended();
    // Waking up, the worst order: ringd and etcd run, the guard (which would stop etcd at
    // the deadline) not yet. The gate, bound to the lease, passes nothing on.
    ring.procs[0].signal(Signal::SIGCONT);
    let _ = std::process::Command::new("pkill")
        .args(["-CONT", "-f", &format!("^\\S*/etcd .*{data_root}")])
        .status();
    let late = tokio::time::timeout(Duration::from_secs(10), in_flight)
        .await
        .expect("the write in flight got an answer")
        .unwrap();
    assert!(
        late.is_err(),
        "a acknowledged a write after waking up past its lease: {late:?}"
    );
    stop_all("-CONT");
    // The old host's instance ends without uploading.
    eventually(
        Duration::from_secs(10),
        "a's etcd instance ended",
        || async { (ended() > ended_before).then_some(()) },
    )
    .await;
    let after = full_snapshots(&backups["a"], &backup).await;
    assert_eq!(before, after, "a uploaded after it lost cp5");
    assert!(
        !ring.procs[0].log().contains("final snapshot v2/"),
        "{}",
        ring.procs[0].log()
    );
    assert!(
        EtcdClient::connect(&format!("http://{}", moved.endpoints["a"]), fast())
            .await
            .is_err(),
        "a still accepts connections for cp5"
    );
    // And it stays so: a is healthy again, cp5 stays at its new host.
    wait_all_healthy(&ring).await;
    let now = cps(&ring, &[1, 2]).await.remove("cp5").unwrap();
    assert_eq!(
        (now.host.as_str(), now.epoch),
        (moved.host.as_str(), moved.epoch)
    );
    println!(
        "returning host: a found {} snapshots unchanged; cp5 stays on {}",
        after.len(),
        moved.host
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deltas_are_cut_by_size_and_join_up_from_the_full_snapshot() {
    let backup = BackupSettings::default();
    // A period far away: only the memory limit (the smallest allowed, 64 KiB) cuts deltas.
    let mut driver = garden_ring_tests::etcd::driver_with_deltas(3_600_000, 600_000);
    driver.etcd.delta_snapshot_memory_limit_bytes = 64 * 1024;
    let ring = etcd_ring_with(driver, backup.clone());
    wait_all_healthy(&ring).await;
    let backups = file_backups(ring.dir.path(), "cp5");
    let req = etcd_control_plane("cp5", "a", &backups["a"], backups.clone());
    add_control_plane(&ring.client(), req).await.unwrap();
    let cp = running_on(&ring, "cp5", "a").await;
    let etcd = etcd_at(&cp, "a").await;
    // 400 writes of 1 KiB: about 550 KiB of delta JSON, so at least 8 cuts.
    let value = vec![b'x'; 1024];
    let mut last = 0;
    for i in 0..400 {
        last = eventually(Duration::from_secs(10), "put", || async {
            etcd.put(format!("/registry/big/{i:04}").as_bytes(), &value)
                .await
                .ok()
        })
        .await;
    }
    let location = BackupLocation::parse(&backups["a"], &backup).unwrap();
    let listing = eventually(Duration::from_secs(10), "deltas cut by size", || async {
        let listing = list_snapshots(&location).await.ok()?;
        let deltas = listing
            .snapshots
            .iter()
            .filter(|s| s.path.name().kind() == SnapshotKind::Incr)
            .count();
        (deltas >= 8).then_some(listing)
    })
    .await;
    // One full snapshot (at start); deltas that follow it revision by revision.
    let mut fulls = listing
        .snapshots
        .iter()
        .filter(|s| s.path.name().kind() == SnapshotKind::Full);
    let full = fulls.next().expect("the full snapshot taken at start");
    assert!(fulls.next().is_none());
    let mut next = full.path.name().last_revision() + 1;
    let mut deltas = 0;
    for s in listing
        .snapshots
        .iter()
        .filter(|s| s.path.name().kind() == SnapshotKind::Incr)
    {
        assert_eq!(s.path.name().start_revision(), next, "{}", s.path);
        next = s.path.name().last_revision() + 1;
        deltas += 1;
        // Each is cut once its events reach 64 KiB: about 50 writes of 1 KiB.
        assert!(
            s.size_bytes < 200 * 1024,
            "{} is {} bytes",
            s.path,
            s.size_bytes
        );
    }
    assert!(next - 1 <= last);
    println!(
        "size cuts: {deltas} deltas after {} up to revision {} (last write {last})",
        full.path,
        next - 1
    );
}

/// The new user's first try (issue "etcd backups as Gardener writes them"): a control plane
/// registered on a bucket that the real etcd-backup-restore wrote (a full snapshot, then deltas
/// with new keys, overwrites, deletes and transactions) comes up on its first host with exactly
/// what `etcdbrctl restore` itself gives back: every key, no deleted key back, every overwrite
/// at its last value. Before delta replay the host restored the full snapshot only.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_control_plane_on_a_bucket_etcdbrctl_wrote_comes_up_with_every_write() {
    use garden_ring_tests::compat::{KEY_PREFIX, etcdbrctl_bucket};
    use garden_ring_tests::etcdbrctl::{Provider, require_etcdbrctl};

    let Some(etcdbrctl) = require_etcdbrctl() else {
        return;
    };
    for compress in [false, true] {
        let bucket = etcdbrctl_bucket(&etcdbrctl, Provider::Local, compress, false).await;
        let deltas = bucket.listing.deltas().len();
        assert!(deltas >= 2, "{:?}", bucket.listing.names());
        let ring = etcd_ring_with_deltas(1_000, bucket.store.settings());
        wait_all_healthy(&ring).await;
        let backups = file_backups(ring.dir.path(), "cp9");
        let req = etcd_control_plane("cp9", "b", &bucket.store.url(), backups);
        add_control_plane(&ring.client(), req).await.unwrap();
        let cp = running_on(&ring, "cp9", "b").await;
        let migration = cp.migration.clone().unwrap();
        let etcd = etcd_at(&cp, "b").await;
        let got = garden_ring_tests::etcd::key_values(&etcd, KEY_PREFIX.as_bytes()).await;
        assert_eq!(
            got, bucket.model,
            "the host restored {} and replayed what follows it",
            migration.restored
        );
        let revision = etcd.revision().await.unwrap();
        assert!(
            revision >= bucket.last_revision,
            "revision {revision} reaches the last delta's {}",
            bucket.last_revision
        );
        println!(
            "cell: etcdbrctl writes (Local {}), a ringd host restores: pass ({} keys, {} deltas, revision {revision}, restored {})",
            if compress { "gzip" } else { "plain" },
            got.len(),
            deltas,
            migration.restored
        );
    }
}

/// Issue "backups that last and scale": with compaction every 40 events and limit-based
/// garbage collection keeping 3 full snapshots, a control plane written 240 times ends with a
/// bounded bucket (at most 3 full snapshots, deltas only after the newest), `cp get` and
/// `/metrics` say what GC kept and deleted, the hosted etcd runs with the configured quota
/// and is defragmented on schedule (a full snapshot after), and a failover after all that
/// restores every acknowledged write from what GC left.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn garbage_collection_bounds_the_bucket_and_a_failover_still_restores_every_write() {
    use garden_ring::config::GcPolicy;
    let backup = BackupSettings::default();
    // Full snapshots only from compaction (and defragmentation); deltas every 100 ms.
    let mut driver = garden_ring_tests::etcd::driver_with_deltas(3_600_000, 100);
    driver.etcd.compaction_events = 40;
    driver.etcd.garbage_collection_policy = GcPolicy::LimitBased;
    driver.etcd.max_backups = 3;
    driver.etcd.garbage_collection_period_ms = 1_100;
    driver.etcd.quota_backend_bytes = 64 * 1024 * 1024;
    driver.etcd.defragmentation_interval_ms = 4_000;
    let mut ring = Ring::prepare(RingOptions {
        driver,
        ..RingOptions::default()
    });
    let metrics = ring.free_addresses(ring.procs.len());
    for (p, address) in ring.procs.iter_mut().zip(&metrics) {
        p.config.backup = backup.clone();
        p.config.metrics.listen = Some(*address);
        p.spawn();
    }
    wait_all_healthy(&ring).await;
    let (backups, cp) = add_on_a(&ring, "gc1").await;
    let etcd = etcd_at(&cp, "a").await;

    // etcd runs with the configured quota (its own /metrics, through the endpoint's relay;
    // HTTP/1.0: etcd closes the connection after the answer and sends it unchunked).
    let etcd_metrics = {
        use std::io::{Read, Write};
        let mut stream = std::net::TcpStream::connect(cp.endpoints["a"].as_str()).unwrap();
        stream
            .set_read_timeout(Some(Duration::from_secs(5)))
            .unwrap();
        stream.write_all(b"GET /metrics HTTP/1.0\r\n\r\n").unwrap();
        let mut text = String::new();
        stream.read_to_string(&mut text).unwrap();
        text
    };
    let quota: Option<f64> = etcd_metrics.lines().find_map(|l| {
        l.strip_prefix("etcd_server_quota_backend_bytes ")?
            .trim()
            .parse()
            .ok()
    });
    assert_eq!(quota, Some(64.0 * 1024.0 * 1024.0));

    let mut written = BTreeSet::new();
    let mut last_revision = 0;
    for i in 0..240 {
        let key = format!("/registry/gc/{i:04}");
        last_revision = put_retrying(&etcd, &key).await;
        written.insert(key);
        if i % 40 == 39 {
            // Let a delta (and the compaction it triggers) happen between the batches.
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    let location = BackupLocation::parse(&backups["a"], &backup).unwrap();
    // GC catches up: at most 3 full snapshots, no delta older than the newest one, the
    // newest delta at the last write.
    let listing = eventually(
        Duration::from_secs(20),
        "GC leaves at most 3 full snapshots and the deltas after the newest, up to the last write",
        || async {
            let listing = list_snapshots(&location).await.ok()?;
            let fulls: Vec<_> = listing
                .snapshots
                .iter()
                .filter(|s| s.path.name().kind() == SnapshotKind::Full)
                .collect();
            let newest = fulls.last()?.path.name().last_revision();
            let old_deltas = listing.snapshots.iter().any(|s| {
                s.path.name().kind() == SnapshotKind::Incr
                    && s.path.name().last_revision() <= newest
            });
            let reach = listing
                .snapshots
                .iter()
                .map(|s| s.path.name().last_revision())
                .max()?;
            (fulls.len() <= 3 && fulls.len() >= 2 && !old_deltas && reach >= last_revision)
                .then_some(listing)
        },
    )
    .await;
    let names: Vec<String> = listing
        .snapshots
        .iter()
        .map(|s| s.path.name().to_string())
        .collect();

    // `cp get` says what GC kept, and that a defragmentation happened.
    let shown = eventually(
        Duration::from_secs(15),
        "cp get shows GC and defragmentation",
        || async {
            let out = ring.ringctl(&["cp", "get", "gc1"]);
            let text = String::from_utf8_lossy(&out.stdout).to_string();
            (text.contains("retention:        limit-based (3)")
                && text.contains("kept:             3 full snapshots")
                && text.contains("last GC:")
                && text.contains("defragmented:"))
            .then_some(text)
        },
    )
    .await;
    // /metrics on the host: deletions counted, 3 kept, a defragmentation timed.
    let body = garden_ring_tests::http_get(metrics[0], "/metrics")
        .unwrap()
        .1;
    let value = |prefix: &str| -> f64 {
        body.lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no {prefix} in /metrics"))
            .trim()
            .parse()
            .unwrap()
    };
    let deleted_full = value("garden_ring_backup_gc_deleted_total{kind=\"full\"}");
    let deleted_delta = value("garden_ring_backup_gc_deleted_total{kind=\"delta\"}");
    assert!(deleted_full >= 3.0, "{deleted_full} full deleted");
    assert!(deleted_delta >= 10.0, "{deleted_delta} deltas deleted");
    assert_eq!(
        value("garden_ring_backup_full_snapshots_kept{control_plane=\"gc1\"}"),
        3.0
    );
    let defrag_s = value("garden_ring_etcd_defrag_duration_seconds{control_plane=\"gc1\"}");
    assert_eq!(value("garden_ring_backup_gc_failures_total"), 0.0);

    // Kill the host: the new one restores from what GC left.
    kill_zone(&mut ring, 0);
    let moved = running_elsewhere(&ring, &[1, 2], "gc1", "a", Duration::from_secs(30)).await;
    let got = keys_at(&moved, &moved.host).await;
    let missing: Vec<_> = written.difference(&got).collect();
    assert!(missing.is_empty(), "missing after the move: {missing:?}");
    println!(
        "GC: {deleted_full} full and {deleted_delta} delta snapshots deleted; left {names:?}; \
         defragmentation {defrag_s} s; restored {} on {} with all {} keys\n{shown}",
        moved.migration.as_ref().map_or("", |m| m.restored.as_str()),
        moved.host,
        got.len()
    );
}

/// Issue "backups that last and scale", the gap the 1 GiB bench found: a new host continues
/// the chain it restored with deltas from the restored revision on, instead of starting a
/// chain of its own with a full snapshot of the whole database (minutes for a big etcd, with
/// every write it acknowledged until then in no backup: the quick bench lost 1018 of 1018).
/// After a switchover a -> b, b's first backups are deltas that follow the final delta it
/// restored, and b takes no full snapshot; b is then killed, and the host after it restores
/// every acknowledged write from a's full snapshot and the deltas of both hosts.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_host_continues_the_restored_chain_so_its_loss_right_after_loses_nothing() {
    use garden_ring::core::backup_chain::delta_chain;
    let backup = BackupSettings::default();
    // Full snapshots an hour apart, deltas every 100 ms.
    let mut ring = etcd_ring_with_deltas(100, backup.clone());
    wait_all_healthy(&ring).await;
    let (backups, cp) = add_on_a(&ring, "cp9").await;
    let etcd = etcd_at(&cp, "a").await;
    let mut written = BTreeSet::new();
    for i in 0..20 {
        let key = format!("/registry/chain/a{i:03}");
        put_retrying(&etcd, &key).await;
        written.insert(key);
    }
    switchover(&ring, "cp9", "b");
    let moved = running_on(&ring, "cp9", "b").await;
    let etcd = etcd_at(&moved, "b").await;
    let mut last_revision = 0;
    for i in 0..20 {
        let key = format!("/registry/chain/b{i:03}");
        last_revision = put_retrying(&etcd, &key).await;
        written.insert(key);
    }

    // b's deltas reach the last write within a few periods.
    let at_b = BackupLocation::parse(&backups["b"], &backup).unwrap();
    let listing = backups_reaching(&at_b, last_revision).await;
    let names: Vec<String> = listing
        .snapshots
        .iter()
        .map(|s| s.path.name().to_string())
        .collect();
    // Every full snapshot at b is a copy of one of a's (`.final` stripped): b took none.
    let at_a = BackupLocation::parse(&backups["a"], &backup).unwrap();
    let a_fulls: BTreeSet<String> = list_snapshots(&at_a)
        .await
        .unwrap()
        .snapshots
        .iter()
        .filter(|s| s.path.name().kind() == SnapshotKind::Full)
        .map(|s| {
            s.path
                .name()
                .to_string()
                .trim_end_matches(".final")
                .to_string()
        })
        .collect();
    let b_fulls: Vec<_> = listing
        .snapshots
        .iter()
        .filter(|s| s.path.name().kind() == SnapshotKind::Full)
        .collect();
    let newest_full = b_fulls.last().expect("a's full snapshot, copied to b");
    for full in &b_fulls {
        assert!(
            a_fulls.contains(&full.path.name().to_string()),
            "b took a full snapshot of its own ({}) instead of continuing the chain; b's backups: {names:?}",
            full.path.name()
        );
    }
    // The deltas join up from a's full snapshot to the last write, across both hosts.
    let deltas: Vec<_> = listing
        .snapshots
        .iter()
        .filter(|s| s.path.name().kind() == SnapshotKind::Incr)
        .map(|s| *s.path.name())
        .collect();
    let chain = delta_chain(newest_full.path.name().last_revision(), &deltas);
    assert!(chain.gap.is_none(), "{:?} in {names:?}", chain.gap);
    assert!(chain.reaches >= last_revision, "{chain:?} in {names:?}");

    // Lose b: the next host restores every acknowledged write.
    kill_zone(&mut ring, 1);
    let after = running_elsewhere(&ring, &[0, 2], "cp9", "b", Duration::from_secs(30)).await;
    let got = keys_at(&after, &after.host).await;
    let missing: Vec<_> = written.difference(&got).collect();
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged writes missing after b was lost: {missing:?}; b's backups: {names:?}",
        missing.len(),
        written.len()
    );
    println!(
        "continued chain: b wrote {} deltas after {} (to revision {}); after b's loss {} restored {} with all {} keys",
        deltas.len(),
        newest_full.path.name(),
        chain.reaches,
        after.host,
        after.migration.as_ref().map_or("", |m| m.restored.as_str()),
        got.len()
    );
}

/// Issue "backups that last and scale": a full snapshot runs beside the delta cuts, so the
/// backups stay a delta period behind while a big etcd's full snapshot takes its time
/// (before, no delta was cut until it was stored: at 1 GiB, 25 s in no backup). A 24 MiB etcd
/// written on: compaction (`compaction_bytes` 16 MiB) starts full snapshots that take longer
/// than the 100 ms delta period, and the writes made meanwhile are in a delta that overlaps
/// the full snapshot's revision. A failover restores every acknowledged write from that
/// chain, and so does the real `etcdbrctl restore` from the same bucket.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deltas_go_on_while_a_full_snapshot_runs() {
    let backup = BackupSettings::default();
    let mut driver = garden_ring_tests::etcd::driver_with_deltas(3_600_000, 100);
    driver.etcd.compaction_bytes = 16 * 1024 * 1024;
    let mut ring = etcd_ring_with(driver, backup.clone());
    wait_all_healthy(&ring).await;
    let (backups, cp) = add_on_a(&ring, "cp10").await;
    let etcd = etcd_at(&cp, "a").await;

    // 384 values of 64 KiB that gzip cannot shrink (xorshift), written while a small writer
    // goes on beside them.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let writer = tokio::spawn(write_until_refused(etcd_at(&cp, "a").await, "w", stopped));
    let mut state = 0x9e37_79b9_7f4a_7c15_u64;
    let mut written = BTreeSet::new();
    for i in 0..384 {
        let value: Vec<u8> = (0..64 * 1024 / 8)
            .flat_map(|_| {
                state ^= state << 13;
                state ^= state >> 7;
                state ^= state << 17;
                state.to_le_bytes()
            })
            .collect();
        let key = format!("/registry/big/{i:04}");
        eventually(Duration::from_secs(10), "put", || async {
            etcd.put(key.as_bytes(), &value).await.ok()
        })
        .await;
        written.insert(key);
    }
    let location = BackupLocation::parse(&backups["a"], &backup).unwrap();
    // A bound, not a timing: the compaction's full snapshot of 24 MiB took 18-28 s of the
    // test's run on a loaded 2-CPU CI machine, once more than 30 s.
    let overlap = eventually(
        Duration::from_secs(90),
        "a delta that overlaps a full snapshot taken after the first",
        || async {
            let listing = list_snapshots(&location).await.ok()?;
            let names: Vec<_> = listing.snapshots.iter().map(|s| *s.path.name()).collect();
            names
                .iter()
                .filter(|f| f.kind() == SnapshotKind::Full && f.last_revision() > 1)
                .find_map(|f| {
                    let r = f.last_revision();
                    names
                        .iter()
                        .find(|d| {
                            d.kind() == SnapshotKind::Incr
                                && d.start_revision() <= r
                                && d.last_revision() > r
                        })
                        .map(|d| (f.to_string(), d.to_string()))
                })
        },
    )
    .await;
    let _ = stop.send(true);
    let acked = writer.await.unwrap();
    written.extend(acked.iter().cloned());
    // The last write in a delta before the host is lost.
    let last_revision = etcd.revision().await.unwrap();
    backups_reaching(&location, last_revision).await;

    kill_zone(&mut ring, 0);
    let moved = running_elsewhere(&ring, &[1, 2], "cp10", "a", Duration::from_secs(60)).await;
    let got = keys_at(&moved, &moved.host).await;
    let missing: Vec<_> = written.difference(&got).collect();
    assert!(
        missing.is_empty(),
        "{} of {} acknowledged writes missing after the failover",
        missing.len(),
        written.len()
    );
    println!(
        "full beside deltas: {} overlaps {}; {} writes ({} small) all at {} (restored {})",
        overlap.1,
        overlap.0,
        written.len(),
        acked.len(),
        moved.host,
        moved.migration.as_ref().map_or("", |m| m.restored.as_str())
    );
    if let Some((got, took)) = etcdbrctl_keys(&ring, &backups["a"]).await {
        let missing: Vec<_> = written.difference(&got).collect();
        assert!(
            missing.is_empty(),
            "etcdbrctl's restore of a's bucket misses {} of {} acknowledged writes: {:?}",
            missing.len(),
            written.len(),
            &missing[..missing.len().min(5)]
        );
        println!("etcdbrctl restores all {} ({took:?})", written.len());
    }
}
