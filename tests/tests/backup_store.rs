//! The object-store side of etcd backups against a real S3 API (`moto_server` on loopback)
//! and `file://`: locations, listing etcd-backup-restore's layout, and copying between
//! locations like `etcdbrctl copy`, also through a store outage.

use std::collections::BTreeMap;
use std::path::Path as FsPath;
use std::time::Duration;

use garden_ring::backup::copy::{
    CopyError, CopyMethod, CopyOptions, CopyProgress, CopyReport, RetryPolicy, SkipReason,
    copy_snapshots,
};
use garden_ring::backup::layout::{incrementals_after, list_snapshots, newest_full};
use garden_ring::backup::location::{BackupLocation, LocationError};
use garden_ring::backup::object_store::path::Path;
use garden_ring::backup::object_store::{ObjectStoreExt, PutPayload};
use garden_ring::config::BackupSettings;
use garden_ring_tests::s3::{Moto, Proxy};
use tokio::sync::watch;
use tokio::time::Instant;

const MIB: usize = 1024 * 1024;

/// Deterministic bytes that differ per `seed`, so a mixed-up or truncated copy shows.
fn data(seed: u64, len: usize) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x as u8
        })
        .collect()
}

async fn put(location: &BackupLocation, key: &str, bytes: Vec<u8>) {
    let path = object_path(location, key);
    location
        .store()
        .put(&path, PutPayload::from(bytes))
        .await
        .unwrap_or_else(|e| panic!("put {key} into {location}: {e}"));
}

async fn get(location: &BackupLocation, key: &str) -> Option<Vec<u8>> {
    let path = object_path(location, key);
    match location.store().get(&path).await {
        Ok(got) => Some(got.bytes().await.expect("read the object").to_vec()),
        Err(garden_ring::backup::object_store::Error::NotFound { .. }) => None,
        Err(e) => panic!("get {key} from {location}: {e}"),
    }
}

/// `key` relative to the location's prefix, as a store path.
fn object_path(location: &BackupLocation, key: &str) -> Path {
    let prefix = location.prefix().as_ref();
    let full = if prefix.is_empty() {
        key.to_string()
    } else {
        format!("{prefix}/{key}")
    };
    Path::parse(full).expect("a valid key")
}

/// The snapshot names (last segment) and sizes a location holds.
async fn snapshots(location: &BackupLocation) -> BTreeMap<String, usize> {
    list_snapshots(location)
        .await
        .unwrap_or_else(|e| panic!("list {location}: {e}"))
        .snapshots
        .iter()
        .map(|s| (s.path.name().to_string(), s.size_bytes as usize))
        .collect()
}

/// etcd-backup-restore's fixtures: name -> size, as `etcdbrctl` names them.
const FULL_1000: &str = "Full-00000000-00001000-1700000000.gz";
const INCR_1050: &str = "Incr-00001001-00001050-1700000060.gz";
const FULL_1100_FINAL: &str = "Full-00000000-00001100-1700000120.gz.final";
const FULL_1100: &str = "Full-00000000-00001100-1700000120.gz";

/// Writes the fixtures into `location`: a 9 MiB full snapshot (two parts), a small
/// incremental, a 17 MiB final full snapshot (three parts), and two objects that are not
/// snapshots (a stray file and a chunk of an unfinished upload, S3 only). Returns the
/// snapshots' contents by name.
async fn write_fixtures(location: &BackupLocation, with_chunk: bool) -> BTreeMap<String, Vec<u8>> {
    let fixtures = BTreeMap::from([
        (FULL_1000.to_string(), data(1, 9 * MIB + 17)),
        (INCR_1050.to_string(), data(2, 3_000)),
        (FULL_1100_FINAL.to_string(), data(3, 17 * MIB + 5)),
    ]);
    for (name, bytes) in &fixtures {
        put(location, &format!("v2/{name}"), bytes.clone()).await;
    }
    put(location, "v2/README.txt", b"not a snapshot".to_vec()).await;
    if with_chunk {
        put(
            location,
            "v2/Full-00000000-00002000-1700000300.gz/0000000001",
            b"chunk".to_vec(),
        )
        .await;
    }
    fixtures
}

fn options(settings: &BackupSettings) -> CopyOptions {
    CopyOptions {
        deadline: Some(Instant::now() + Duration::from_secs(120)),
        ..CopyOptions::new(settings)
    }
}

fn copied_names(report: &CopyReport) -> Vec<String> {
    report
        .copied
        .iter()
        .map(|c| c.destination.name().to_string())
        .collect()
}

/// Checks that every snapshot of `source` is at `destination` with `.final` stripped, byte
/// for byte, and that the source still holds everything.
async fn assert_copied(
    source: &BackupLocation,
    destination: &BackupLocation,
    fixtures: &BTreeMap<String, Vec<u8>>,
) {
    for (name, bytes) in fixtures {
        let stripped = name.strip_suffix(".final").unwrap_or(name);
        let copy = get(destination, &format!("v2/{stripped}"))
            .await
            .unwrap_or_else(|| panic!("{stripped} missing at {destination}"));
        assert!(copy == *bytes, "{stripped} at {destination} differs");
        let original = get(source, &format!("v2/{name}")).await;
        assert!(
            original.as_ref() == Some(bytes),
            "{name} changed at {source}"
        );
    }
    assert_eq!(
        get(destination, &format!("v2/{FULL_1100_FINAL}")).await,
        None
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn locations_open_and_work_on_s3_and_file() {
    let dir = tempfile::tempdir().unwrap();
    let moto = Moto::start(&dir.path().join("moto"));
    moto.create_bucket("ring-a");
    let settings = moto.settings(&moto.endpoint());

    let s3 = BackupLocation::parse("s3://ring-a/shoot--dev--a/etcd-main/", &settings).unwrap();
    assert_eq!(s3.to_string(), "s3://ring-a/shoot--dev--a/etcd-main");
    let file_url = format!("file://{}/backups/a", dir.path().display());
    let file = BackupLocation::parse(&file_url, &settings).unwrap();
    assert!(dir.path().join("backups/a").is_dir());

    for location in [&s3, &file] {
        let bytes = data(7, 100_000);
        put(location, &format!("v2/{FULL_1000}"), bytes.clone()).await;
        put(location, "v2/stray", b"x".to_vec()).await;
        assert_eq!(
            get(location, &format!("v2/{FULL_1000}")).await,
            Some(bytes),
            "{location}"
        );
        let listing = list_snapshots(location).await.unwrap();
        assert_eq!(listing.snapshots.len(), 1, "{location}");
        assert_eq!(listing.snapshots[0].path.name().to_string(), FULL_1000);
        assert_eq!(listing.snapshots[0].size_bytes, 100_000);
        assert_eq!(listing.unparsed.len(), 1, "{location}");
        assert!(listing.unparsed[0].location.as_ref().ends_with("v2/stray"));
        // Neither Debug nor Display shows the secret of the credentials file.
        let shown = format!("{location} {location:?}");
        assert!(!shown.contains("testing-secret"), "{shown}");
    }
    // The S3 objects live under the prefix, in the bucket moto holds.
    assert!(
        moto.log()
            .contains("PUT /ring-a/shoot--dev--a/etcd-main/v2/")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_urls_and_credentials_files_fail_clearly() {
    let dir = tempfile::tempdir().unwrap();
    let good = BackupSettings {
        s3_endpoint: Some("http://127.0.0.1:9".into()),
        s3_allow_http: true,
        ..BackupSettings::default()
    };
    for (url, expected) in [
        ("ftp://bucket/x", "not supported"),
        ("s3://b/x", "3 to 63"),
        ("s3://bucket/../other", ".."),
        ("file://relative/path", "absolute"),
        ("s3://AKIDEXAMPLE:hunter2@bucket/x", "'@'"),
        ("s3://bucket/x?token=hunter2", "'?'"),
        ("s3://bucket/%2e%2e/x", "'%'"),
    ] {
        let err = BackupLocation::parse(url, &good).unwrap_err();
        let text = err.to_string();
        assert!(matches!(err, LocationError::Url { .. }), "{url}: {text}");
        assert!(text.contains(expected), "{url}: {text}");
        assert!(!text.contains("hunter2"), "{text}");
        assert!(text.starts_with("backup location \""), "{text}");
    }

    let with_file = |file: &FsPath| BackupSettings {
        credentials_file: Some(file.to_path_buf()),
        ..good.clone()
    };
    let write = |name: &str, content: &[u8]| {
        let path = dir.path().join(name);
        std::fs::write(&path, content).unwrap();
        path
    };
    let cases = [
        (dir.path().join("missing.toml"), "cannot be read"),
        (dir.path().to_path_buf(), "cannot be read"),
        (
            write("big.toml", &vec![b'#'; 64 * 1024 + 1]),
            "larger than 65536 bytes",
        ),
        (
            write(
                "bad.toml",
                b"access_key_id = \"a\"\nsecret_access_key = hunter2\n",
            ),
            "not valid TOML (line 2)",
        ),
        (
            write("nokey.toml", b"secret_access_key = \"hunter2\"\n"),
            "has no access_key_id",
        ),
        (
            write(
                "typo.toml",
                b"access_key_id = \"a\"\nsecret_key = \"hunter2\"\n",
            ),
            "unknown key \"secret_key\"",
        ),
    ];
    for (file, expected) in cases {
        let err = BackupLocation::parse("s3://bucket/x", &with_file(&file)).unwrap_err();
        let text = err.to_string();
        assert!(
            matches!(err, LocationError::Credentials { .. }),
            "{}: {text}",
            file.display()
        );
        assert!(text.contains(&file.display().to_string()), "{text}");
        assert!(text.contains(expected), "{text} (expected {expected})");
        assert!(!text.contains("hunter2"), "{text}");
    }

    // A bucket that does not exist: listing fails at once, not retryable, naming the URL.
    let moto = Moto::start(&dir.path().join("moto"));
    let settings = moto.settings(&moto.endpoint());
    let missing = BackupLocation::parse("s3://no-such-bucket/x", &settings).unwrap();
    let started = std::time::Instant::now();
    let err = list_snapshots(&missing).await.unwrap_err();
    assert!(!err.is_retryable(), "{err}");
    assert!(err.to_string().contains("s3://no-such-bucket/x"), "{err}");
    assert!(started.elapsed() < Duration::from_secs(10));
    let other = BackupLocation::parse("s3://other-bucket/x", &settings).unwrap();
    moto.create_bucket("other-bucket");
    let err = copy_snapshots(&other, &missing, &options(&settings))
        .await
        .unwrap_err();
    assert!(!err.is_retryable(), "{err}");
    assert!(
        matches!(
            err,
            CopyError::List {
                which: "destination",
                attempts: 1,
                ..
            }
        ),
        "{err}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn etcd_backup_restore_layout_is_listed_and_copied_across_buckets_final_first() {
    let dir = tempfile::tempdir().unwrap();
    let moto = Moto::start(&dir.path().join("moto"));
    moto.create_bucket("zone-a");
    moto.create_bucket("zone-b");
    let settings = moto.settings(&moto.endpoint());
    let source = BackupLocation::parse("s3://zone-a/shoot--dev--x/etcd-main", &settings).unwrap();
    let destination =
        BackupLocation::parse("s3://zone-b/shoot--dev--x/etcd-main", &settings).unwrap();
    let fixtures = write_fixtures(&source, true).await;

    let listing = list_snapshots(&source).await.unwrap();
    let names: Vec<String> = listing
        .snapshots
        .iter()
        .map(|s| s.path.name().to_string())
        .collect();
    assert_eq!(names, [FULL_1000, INCR_1050, FULL_1100_FINAL]);
    let unparsed: Vec<&str> = listing
        .unparsed
        .iter()
        .map(|u| u.location.as_ref())
        .collect();
    assert_eq!(
        unparsed,
        [
            "shoot--dev--x/etcd-main/v2/Full-00000000-00002000-1700000300.gz/0000000001",
            "shoot--dev--x/etcd-main/v2/README.txt",
        ]
    );
    let full = newest_full(&listing.snapshots).unwrap();
    assert_eq!(full.path.name().to_string(), FULL_1100_FINAL);
    assert!(incrementals_after(&listing.snapshots, full).is_empty());

    let (progress_tx, progress_rx) = watch::channel(CopyProgress::default());
    let report = copy_snapshots(
        &source,
        &destination,
        &CopyOptions {
            progress: Some(progress_tx),
            ..options(&settings)
        },
    )
    .await
    .unwrap();
    // The final snapshot completes first, under its stripped name; then newest first.
    assert_eq!(copied_names(&report), [FULL_1100, INCR_1050, FULL_1000]);
    let methods: Vec<CopyMethod> = report.copied.iter().map(|c| c.method).collect();
    assert_eq!(
        methods,
        [CopyMethod::Streamed, CopyMethod::Put, CopyMethod::Streamed]
    );
    let total: usize = fixtures.values().map(Vec::len).sum();
    assert_eq!(report.bytes_copied, total as u64);
    assert!(report.skipped.is_empty());
    assert_eq!(report.unparsed.len(), 2);
    assert_eq!(
        *progress_rx.borrow(),
        CopyProgress {
            objects_total: 3,
            objects_done: 3,
            bytes_total: total as u64,
            bytes_done: total as u64,
        }
    );
    assert_copied(&source, &destination, &fixtures).await;
    // Only snapshots were copied: the stray objects stay behind.
    assert!(
        list_snapshots(&destination)
            .await
            .unwrap()
            .unparsed
            .is_empty()
    );
    // Streamed objects went through multipart uploads; the small one through one PUT.
    let log = moto.log();
    assert!(log.contains(&format!(
        "POST /zone-b/shoot--dev--x/etcd-main/v2/{FULL_1100}?uploads"
    )));

    // Again: everything is there, nothing is copied.
    let again = copy_snapshots(&source, &destination, &options(&settings))
        .await
        .unwrap();
    assert!(again.copied.is_empty(), "{:?}", again.copied);
    assert_eq!(again.bytes_copied, 0);
    let mut skipped: Vec<(String, SkipReason)> = again
        .skipped
        .iter()
        .map(|s| (s.source.name().to_string(), s.reason))
        .collect();
    skipped.sort_by(|a, b| a.0.cmp(&b.0));
    assert_eq!(
        skipped,
        [
            (FULL_1000.to_string(), SkipReason::Present),
            (FULL_1100_FINAL.to_string(), SkipReason::Present),
            (INCR_1050.to_string(), SkipReason::Present),
        ]
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn copy_within_one_bucket_is_server_side() {
    let dir = tempfile::tempdir().unwrap();
    let moto = Moto::start(&dir.path().join("moto"));
    moto.create_bucket("shared");
    let settings = moto.settings(&moto.endpoint());
    let source = BackupLocation::parse("s3://shared/ring-a/etcd-main", &settings).unwrap();
    let destination = BackupLocation::parse("s3://shared/ring-b/etcd-main", &settings).unwrap();
    assert_eq!(source.store_id(), destination.store_id());
    let fixtures = write_fixtures(&source, false).await;

    let report = copy_snapshots(&source, &destination, &options(&settings))
        .await
        .unwrap();
    assert_eq!(copied_names(&report)[0], FULL_1100);
    assert!(
        report
            .copied
            .iter()
            .all(|c| c.method == CopyMethod::ServerSide),
        "{:?}",
        report.copied
    );
    // The bytes never left the server: no multipart upload, no GET of a snapshot.
    let log = moto.log();
    assert!(!log.contains("?uploads"), "{log}");
    assert!(!log.contains("GET /shared/ring-a/etcd-main/v2/"), "{log}");
    assert_copied(&source, &destination, &fixtures).await;

    let err = copy_snapshots(&source, &source, &options(&settings))
        .await
        .unwrap_err();
    assert!(matches!(err, CopyError::SameLocation { .. }), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn copy_from_file_to_s3_and_back() {
    let dir = tempfile::tempdir().unwrap();
    let moto = Moto::start(&dir.path().join("moto"));
    moto.create_bucket("zone-b");
    let settings = moto.settings(&moto.endpoint());
    let local = BackupLocation::parse(
        &format!("file://{}/local/etcd-main", dir.path().display()),
        &settings,
    )
    .unwrap();
    let s3 = BackupLocation::parse("s3://zone-b/etcd-main", &settings).unwrap();
    let back =
        BackupLocation::parse(&format!("file://{}/back", dir.path().display()), &settings).unwrap();
    let fixtures = write_fixtures(&local, false).await;

    let up = copy_snapshots(&local, &s3, &options(&settings))
        .await
        .unwrap();
    assert_eq!(copied_names(&up), [FULL_1100, INCR_1050, FULL_1000]);
    assert_copied(&local, &s3, &fixtures).await;

    let down = copy_snapshots(&s3, &back, &options(&settings))
        .await
        .unwrap();
    assert_eq!(down.copied.len(), 3);
    let stripped: BTreeMap<String, Vec<u8>> = fixtures
        .iter()
        .map(|(n, b)| (n.trim_end_matches(".final").to_string(), b.clone()))
        .collect();
    assert_copied(&s3, &back, &stripped).await;
    // Nothing but the three snapshots landed in the directory (no staging files left).
    let mut files: Vec<String> = std::fs::read_dir(dir.path().join("back/v2"))
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    files.sort();
    assert_eq!(files, [FULL_1000, FULL_1100, INCR_1050]);
}

/// Six 12 MiB snapshots (two parts each), plus what they contain.
async fn write_many(location: &BackupLocation, count: u64) -> BTreeMap<String, Vec<u8>> {
    let mut fixtures = BTreeMap::new();
    for i in 0..count {
        let name = format!(
            "Full-00000000-{:08}-{}.gz",
            1_000 * (i + 1),
            1_700_000_000 + 60 * i
        );
        let bytes = data(100 + i, 12 * MIB + i as usize);
        put(location, &format!("v2/{name}"), bytes.clone()).await;
        fixtures.insert(name, bytes);
    }
    fixtures
}

/// Waits until `check` holds for the copy's progress, or panics after `timeout`.
async fn wait_progress(
    progress: &mut watch::Receiver<CopyProgress>,
    timeout: Duration,
    what: &str,
    check: impl Fn(&CopyProgress) -> bool,
) -> CopyProgress {
    let waited = tokio::time::timeout(timeout, progress.wait_for(|p| check(p)))
        .await
        .map(|got| got.expect("the copy keeps its progress sender").clone());
    waited.unwrap_or_else(|_| panic!("timed out waiting until {what}: {:?}", *progress.borrow()))
}

/// Every object the destination shows is complete and equal to the source's.
async fn assert_only_complete_objects(
    destination: &BackupLocation,
    fixtures: &BTreeMap<String, Vec<u8>>,
) -> usize {
    let present = snapshots(destination).await;
    for (name, size) in &present {
        let bytes = fixtures
            .get(name)
            .unwrap_or_else(|| panic!("unexpected {name}"));
        assert_eq!(*size, bytes.len(), "{name} is listed with a partial size");
        let got = get(destination, &format!("v2/{name}")).await.unwrap();
        assert!(got == *bytes, "{name} is visible but not complete");
    }
    present.len()
}

/// How many multipart uploads moto saw started for `key`.
fn uploads_started(moto: &Moto, bucket: &str, key: &str) -> usize {
    moto.log()
        .matches(&format!("POST /{bucket}/{key}?uploads"))
        .count()
}

/// Two buckets behind a proxy that can cut the store off, six snapshots in the source, and
/// a watcher that reads the destination directly (past the proxy).
struct Outage {
    _dir: tempfile::TempDir,
    moto: Moto,
    proxy: Proxy,
    source: BackupLocation,
    destination: BackupLocation,
    watcher: BackupLocation,
    fixtures: BTreeMap<String, Vec<u8>>,
    via_proxy: BackupSettings,
}

impl Outage {
    async fn set_up() -> Self {
        let dir = tempfile::tempdir().unwrap();
        let moto = Moto::start(&dir.path().join("moto"));
        moto.create_bucket("zone-a");
        moto.create_bucket("zone-b");
        let direct = moto.settings(&moto.endpoint());
        let proxy = Proxy::start(moto.addr());
        let via_proxy = moto.settings(&proxy.endpoint());
        let source = BackupLocation::parse("s3://zone-a/etcd-main", &via_proxy).unwrap();
        let destination = BackupLocation::parse("s3://zone-b/etcd-main", &via_proxy).unwrap();
        let watcher = BackupLocation::parse("s3://zone-b/etcd-main", &direct).unwrap();
        let fixtures = write_many(&source, 6).await;
        Self {
            _dir: dir,
            moto,
            proxy,
            source,
            destination,
            watcher,
            fixtures,
            via_proxy,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_store_outage_mid_copy_is_retried_and_the_copy_completes() {
    let Outage {
        _dir,
        moto,
        proxy,
        source,
        destination,
        watcher,
        fixtures,
        ..
    } = Outage::set_up().await;

    let (progress_tx, mut progress) = watch::channel(CopyProgress::default());
    let copy_options = CopyOptions {
        parallelism: 2,
        retry: RetryPolicy {
            initial_backoff_ms: 100,
            max_backoff_ms: 1_000,
            max_attempts: 1_000,
        },
        deadline: Some(Instant::now() + Duration::from_secs(120)),
        progress: Some(progress_tx),
        newest_fulls: None,
    };
    let copy = tokio::spawn({
        let (source, destination) = (source.clone(), destination.clone());
        async move { copy_snapshots(&source, &destination, &copy_options).await }
    });

    // Cut once at least one object is complete and another is on its way.
    let at_cut = wait_progress(
        &mut progress,
        Duration::from_secs(60),
        "one object copied and more moving",
        |p| p.objects_done >= 1 && p.bytes_done > (12 * MIB) as u64,
    )
    .await;
    proxy.cut();
    let complete_at_cut = assert_only_complete_objects(&watcher, &fixtures).await;
    assert!((1..6).contains(&complete_at_cut), "{complete_at_cut}");
    let refused_before = proxy.refused();
    // The outage lasts until the copy has been turned away several times.
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while proxy.refused() < refused_before + 5 {
        assert!(
            std::time::Instant::now() < deadline,
            "the copy stopped trying"
        );
        assert!(!copy.is_finished(), "the copy ended during the outage");
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // Nothing partial became visible meanwhile.
    assert!(assert_only_complete_objects(&watcher, &fixtures).await >= complete_at_cut);
    proxy.restore();

    let report = tokio::time::timeout(Duration::from_secs(120), copy)
        .await
        .expect("the copy finishes after the store returns")
        .unwrap()
        .unwrap_or_else(|e| panic!("copy failed: {e}"));
    let mut names = copied_names(&report);
    names.sort();
    let expected: Vec<String> = fixtures.keys().cloned().collect();
    assert_eq!(names, expected, "every object copied exactly once");
    assert!(
        report.copied.iter().any(|c| c.attempts > 1),
        "the outage forced no retry: {:?}",
        report.copied
    );
    // Objects complete before the cut were never started again.
    for copied in &report.copied[..at_cut.objects_done] {
        assert_eq!(copied.attempts, 1, "{copied:?}");
        let key = format!("etcd-main/v2/{}", copied.destination.name());
        assert_eq!(
            uploads_started(&moto, "zone-b", &key),
            1,
            "{key}; moto's log:\n{}",
            moto.log()
        );
    }
    assert_copied(&source, &watcher, &fixtures).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_copy_that_gives_up_during_an_outage_resumes_without_recopying() {
    let Outage {
        _dir,
        moto,
        proxy,
        source,
        destination,
        watcher,
        fixtures,
        via_proxy,
    } = Outage::set_up().await;

    let (progress_tx, mut progress) = watch::channel(CopyProgress::default());
    let impatient = CopyOptions {
        parallelism: 2,
        retry: RetryPolicy {
            initial_backoff_ms: 50,
            max_backoff_ms: 100,
            max_attempts: 2,
        },
        deadline: Some(Instant::now() + Duration::from_secs(120)),
        progress: Some(progress_tx),
        newest_fulls: None,
    };
    let copy = tokio::spawn({
        let (source, destination) = (source.clone(), destination.clone());
        async move { copy_snapshots(&source, &destination, &impatient).await }
    });
    wait_progress(
        &mut progress,
        Duration::from_secs(60),
        "one object copied",
        |p| p.objects_done >= 1,
    )
    .await;
    proxy.cut();
    let err = tokio::time::timeout(Duration::from_secs(120), copy)
        .await
        .expect("the copy gives up")
        .unwrap()
        .expect_err("the copy cannot finish while the store is away");
    assert!(err.is_retryable(), "{err}");
    assert!(err.to_string().contains("gave up after"), "{err}");

    let done_before = snapshots(&watcher).await;
    assert!(
        !done_before.is_empty() && done_before.len() < 6,
        "{done_before:?}"
    );
    assert_only_complete_objects(&watcher, &fixtures).await;

    proxy.restore();
    let report = copy_snapshots(&source, &destination, &options(&via_proxy))
        .await
        .unwrap();
    let skipped: Vec<String> = report
        .skipped
        .iter()
        .map(|s| s.destination.name().to_string())
        .collect();
    let mut expected_skipped: Vec<String> = done_before.keys().cloned().collect();
    let mut skipped_sorted = skipped.clone();
    skipped_sorted.sort();
    expected_skipped.sort();
    assert_eq!(
        skipped_sorted, expected_skipped,
        "complete objects are skipped"
    );
    assert_eq!(report.copied.len() + report.skipped.len(), 6);
    for name in done_before.keys() {
        let key = format!("etcd-main/v2/{name}");
        assert_eq!(
            uploads_started(&moto, "zone-b", &key),
            1,
            "{key} was copied again"
        );
    }
    assert_copied(&source, &watcher, &fixtures).await;
}
