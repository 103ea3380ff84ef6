//! The backup data path at a real size (issue 19): one etcd preloaded with `--backup-mib` MiB
//! (1 GiB by default) and a real S3 API (`moto_server`), each measurement against its peer in
//! the same run:
//!
//! - **deltas' cost**: writes/s of 16 clients (1 KiB values) on the etcd alone, then with the
//!   delta snapshotter running (a watch, a delta every second with the ownership marker read
//!   before each upload: what a host's driver does, through the same library functions),
//!   into moto and into a local `file://` location (moto shares the CPUs);
//! - **defragmentation** of the whole database, timed (etcd answers no write meanwhile);
//! - **full snapshot upload**: `stage_full_snapshot` + completion (etcd's snapshot stream,
//!   verified, into a multipart upload) against a raw `object_store` multipart upload of the
//!   same bytes from a local file;
//! - **migration copy**: `copy_snapshots` of the full snapshot and the 100 deltas after it to
//!   another bucket, against the raw copy of [`super::copy`] (get streamed into put);
//! - **restore**: `restore_newest` (the full snapshot, then the 100 deltas replayed through a
//!   temporary etcd) against `etcdbrctl restore` of the same bucket, when etcdbrctl is there.
//!
//! The deltas' load phases run in alternating order, twice each (medians count).

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use garden_ring::backup::copy::{
    CopyOptions, MAX_PARTS_IN_FLIGHT, PART_SIZE_BYTES, copy_snapshots,
};
use garden_ring::backup::delta::DeltaEvent;
use garden_ring::backup::etcd::{EtcdClient, EtcdClientOptions, WatchMessage, WatchStream};
use garden_ring::backup::location::BackupLocation;
use garden_ring::backup::marker;
use garden_ring::backup::object_store::path::Path as StorePath;
use garden_ring::backup::object_store::{ObjectStore, ObjectStoreExt, WriteMultipart};
use garden_ring::backup::restore::{RestoreOptions, RestoreTool, restore_newest};
use garden_ring::backup::snapshot::{stage_delta_snapshot, stage_full_snapshot};
use garden_ring::config::BackupSettings;
use serde::Serialize;
use tokio::io::AsyncReadExt;

use garden_ring::pb;

use super::copy::{CopyRow, data, median, raw_copy};
use super::local::{Child, LocalRing, RingSpec, free_ports};

const MIB: usize = 1024 * 1024;
/// Value size of the preloaded keys.
pub const PRELOAD_VALUE_BYTES: usize = 32 * 1024;
/// Value size of the load phases' and the deltas' writes.
pub const WRITE_VALUE_BYTES: usize = 1024;
/// Keys each load client overwrites in turn: the load phases leave 16 MiB of live keys, and
/// the compaction and defragmentation after them bring the database back to its preloaded
/// size (the full snapshot, copy and restore after them measure that size).
pub const LOAD_KEYS_PER_CLIENT: u64 = 1024;
/// Writes per delta of the restore's 100.
pub const WRITES_PER_DELTA: usize = 50;
/// The delta period of the load phase with deltas.
pub const DELTA_PERIOD: Duration = Duration::from_secs(1);

/// Settings of the backup part.
#[derive(Debug, Clone)]
pub struct BackupBenchOptions {
    /// What the etcd holds before the measurements, MiB.
    pub size_mib: usize,
    /// Seconds per load phase.
    pub seconds: f64,
    /// Concurrent clients of the load phases (and of the preload).
    pub clients: usize,
    /// Deltas after the full snapshot that the copy and the restores carry.
    pub deltas: usize,
    /// The `etcd` binary (its directory also has `etcdctl` or `etcdutl`).
    pub etcd: PathBuf,
    /// `etcdbrctl`, when found.
    pub etcdbrctl: Option<PathBuf>,
    /// A scratch directory, removed by the caller.
    pub dir: PathBuf,
}

/// What the backup part measured.
#[derive(Debug, Clone, Serialize)]
pub struct BackupReport {
    /// Preloaded MiB of values.
    pub size_mib: usize,
    /// Keys preloaded.
    pub keys: usize,
    /// etcd's database after the preload, bytes.
    pub db_size_bytes: u64,
    /// How long the preload took, s.
    pub preload_s: f64,
    /// `etcd --version`.
    pub etcd_version: String,
    /// Clients of the load phases.
    pub clients: usize,
    /// writes/s without snapshots, per round.
    pub plain_writes_per_s: Vec<f64>,
    /// writes/s with a delta every second, per round.
    pub with_deltas_writes_per_s: Vec<f64>,
    /// Deltas written during the load phases with deltas, and their bytes.
    pub load_deltas: u64,
    /// Their stored bytes.
    pub load_delta_bytes: u64,
    /// Median with deltas / median without.
    pub ratio_deltas: f64,
    /// writes/s with a delta every second into a local `file://` location (no moto), per
    /// round.
    pub with_file_deltas_writes_per_s: Vec<f64>,
    /// Their median / the median without.
    pub ratio_file_deltas: f64,
    /// writes/s with a watch of every key drained and nothing written: etcd's share of the
    /// deltas' cost, per round.
    pub with_watch_writes_per_s: Vec<f64>,
    /// writes/s with `etcdbrctl snapshot` cutting its deltas every second into a local store
    /// (after its first full snapshot), per round; empty without etcdbrctl.
    pub with_etcdbrctl_writes_per_s: Vec<f64>,
    /// A defragmentation of the whole database, s (no write is answered meanwhile).
    pub defrag_s: f64,
    /// The database after it, bytes.
    pub db_after_defrag_bytes: u64,
    /// The ring's full snapshot of the etcd into the bucket.
    pub full_upload: CopyRow,
    /// A raw multipart upload of the same bytes.
    pub raw_upload: CopyRow,
    /// etcd's snapshot stream read to its end and dropped: the floor of any full snapshot.
    pub stream_alone: CopyRow,
    /// The ring's copy of the full snapshot and the deltas after it (median of 2 rounds).
    pub copy: CopyRow,
    /// The raw copy of the same objects (median of 2 rounds).
    pub raw_copy: CopyRow,
    /// Deltas after the full snapshot.
    pub deltas: usize,
    /// The ring's restore (full + deltas), s.
    pub restore_s: f64,
    /// Of which the deltas' replay, ms.
    pub replay_ms: u64,
    /// The same restore with etcd 3.5, s, when it is installed.
    pub restore_35_s: Option<f64>,
    /// Of which the deltas' replay, ms.
    pub replay_35_ms: Option<u64>,
    /// `etcdbrctl restore` of the same bucket, s, when etcdbrctl is there.
    pub etcdbrctl_restore_s: Option<f64>,
    /// The switchover and the failover of a control plane that big.
    pub moves: Vec<MoveReport>,
}

/// A standalone etcd (killed on drop).
struct Etcd {
    _child: Child,
    url: String,
}

async fn start_etcd(etcd: &Path, dir: &Path) -> anyhow::Result<Etcd> {
    let ports = free_ports(2)?;
    let url = format!("http://127.0.0.1:{}", ports[0]);
    let peer = format!("http://127.0.0.1:{}", ports[1]);
    let mut child = Child::spawn(
        "etcd",
        std::process::Command::new(etcd)
            .args(["--name", "bench", "--data-dir"])
            .arg(dir.join("bench.etcd"))
            .args([
                "--listen-client-urls",
                &url,
                "--advertise-client-urls",
                &url,
            ])
            .args([
                "--listen-peer-urls",
                &peer,
                "--initial-advertise-peer-urls",
                &peer,
            ])
            .args(["--initial-cluster", &format!("bench={peer}")])
            .args(["--quota-backend-bytes", &(8u64 << 30).to_string()])
            .args(["--max-request-bytes", &(4 * MIB).to_string()]),
        dir.join("etcd.log"),
    )?;
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        child.check_running()?;
        if let Ok(c) = EtcdClient::connect(&url, options()).await
            && c.status().await.is_ok()
        {
            return Ok(Etcd { _child: child, url });
        }
        if Instant::now() >= deadline {
            bail!("etcd did not answer within 30 s");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

fn options() -> EtcdClientOptions {
    EtcdClientOptions {
        connect_timeout_ms: 2_000,
        request_timeout_ms: 30_000,
        ..EtcdClientOptions::default()
    }
}

/// Writes `count` keys of `PRELOAD_VALUE_BYTES` with `clients` clients; returns the last
/// revision.
async fn preload(url: &str, count: usize, clients: usize) -> anyhow::Result<u64> {
    let last = Arc::new(AtomicU64::new(0));
    let mut tasks = Vec::new();
    for c in 0..clients {
        let client = EtcdClient::connect(url, options()).await?;
        let last = last.clone();
        tasks.push(tokio::spawn(async move {
            for i in (c..count).step_by(clients) {
                let value = data(i as u64, PRELOAD_VALUE_BYTES);
                let r = client
                    .put(format!("/registry/preload/{i:08}").as_bytes(), &value)
                    .await?;
                last.fetch_max(r, Ordering::Relaxed);
            }
            anyhow::Ok(())
        }));
    }
    for t in tasks {
        t.await??;
    }
    Ok(last.load(Ordering::Relaxed))
}

/// `clients` clients writing 1 KiB values for `seconds` (over [`LOAD_KEYS_PER_CLIENT`] keys
/// each); writes per second.
async fn load(url: &str, clients: usize, seconds: f64, round: &str) -> anyhow::Result<f64> {
    let written = Arc::new(AtomicU64::new(0));
    let until = Instant::now() + Duration::from_secs_f64(seconds);
    let mut tasks = Vec::new();
    let value = data(7, WRITE_VALUE_BYTES);
    for c in 0..clients {
        let client = EtcdClient::connect(url, options()).await?;
        let (written, value, round) = (written.clone(), value.clone(), round.to_string());
        tasks.push(tokio::spawn(async move {
            let mut n = 0u64;
            while Instant::now() < until {
                let key = format!("/registry/load/{c}/{}", n % LOAD_KEYS_PER_CLIENT);
                client
                    .put(key.as_bytes(), &value)
                    .await
                    .with_context(|| format!("load phase {round}, client {c}"))?;
                n += 1;
            }
            written.fetch_add(n, Ordering::Relaxed);
            anyhow::Ok(())
        }));
    }
    let started = Instant::now();
    for t in tasks {
        t.await??;
    }
    Ok(written.load(Ordering::Relaxed) as f64 / started.elapsed().as_secs_f64())
}

/// What a host's delta snapshotter does, through the same library functions: the events of
/// a watch, cut into a delta on demand, the ownership marker read before each upload.
struct DeltaWriter {
    watch: WatchStream,
    pending: Vec<DeltaEvent>,
    /// The first revision of the next delta.
    next: u64,
    /// The watch delivered every event up to here.
    delivered: u64,
    store: Arc<dyn ObjectStore>,
    prefix: StorePath,
    written: u64,
    bytes: u64,
}

impl DeltaWriter {
    async fn start(
        client: &EtcdClient,
        location: &BackupLocation,
        from: u64,
    ) -> anyhow::Result<Self> {
        Ok(Self {
            watch: client.watch_all(from).await?,
            pending: Vec::new(),
            next: from,
            delivered: from.saturating_sub(1),
            store: location.store(),
            prefix: location.prefix().clone(),
            written: 0,
            bytes: 0,
        })
    }

    /// Takes in the watch's next message.
    async fn pull(&mut self) -> anyhow::Result<()> {
        match self.watch.next().await? {
            WatchMessage::Events { events, revision } => {
                let now_ns = garden_ring::time::unix_ms() as i128 * 1_000_000;
                self.delivered = self.delivered.max(revision);
                for event in events {
                    self.pending.push(DeltaEvent {
                        event,
                        time_unix_ns: now_ns,
                    });
                }
                Ok(())
            }
            other => bail!("the watch ended: {other:?}"),
        }
    }

    /// Pulls until every event up to `revision` is in.
    async fn pull_until(&mut self, revision: u64) -> anyhow::Result<()> {
        while self.delivered < revision {
            tokio::time::timeout(Duration::from_secs(30), self.pull())
                .await
                .context("the watch delivered nothing for 30 s")??;
        }
        Ok(())
    }

    /// Writes the pending events as a delta (nothing without any).
    async fn cut(&mut self) -> anyhow::Result<()> {
        if self.pending.is_empty() {
            return Ok(());
        }
        marker::read(&self.store, &self.prefix).await?;
        let now_s = garden_ring::time::unix_ms() / 1000;
        let staged = stage_delta_snapshot(
            &self.store,
            &self.prefix,
            self.next,
            &self.pending,
            now_s,
            false,
            false,
        )
        .await?;
        let taken = staged.complete().await?;
        self.next = taken.revision + 1;
        self.pending.clear();
        self.written += 1;
        self.bytes += taken.stored_size_bytes;
        Ok(())
    }
}

/// A load phase with the delta writer cutting every [`DELTA_PERIOD`] meanwhile.
async fn load_with_deltas(
    url: &str,
    clients: usize,
    seconds: f64,
    round: &str,
    location: &BackupLocation,
) -> anyhow::Result<(f64, u64, u64)> {
    let client = EtcdClient::connect(url, options()).await?;
    let from = client.revision().await? + 1;
    let mut writer = DeltaWriter::start(&client, location, from).await?;
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let snapshotter = tokio::spawn(async move {
        let mut tick = tokio::time::interval(DELTA_PERIOD);
        tick.tick().await;
        loop {
            tokio::select! {
                pulled = writer.pull() => pulled?,
                _ = tick.tick() => writer.cut().await?,
                _ = stopped.changed() => break,
            }
        }
        writer.cut().await?;
        anyhow::Ok((writer.written, writer.bytes))
    });
    let writes = load(url, clients, seconds, round).await;
    let _ = stop.send(true);
    let (deltas, bytes) = snapshotter.await??;
    Ok((writes?, deltas, bytes))
}

/// A load phase with a watch of every key drained meanwhile (what etcd spends on the
/// deltas' watch, without cutting or storing anything).
async fn load_with_watch(
    url: &str,
    clients: usize,
    seconds: f64,
    round: &str,
) -> anyhow::Result<f64> {
    let client = EtcdClient::connect(url, options()).await?;
    let mut watch = client.watch_all(client.revision().await? + 1).await?;
    let (stop, mut stopped) = tokio::sync::watch::channel(false);
    let drain = tokio::spawn(async move {
        loop {
            tokio::select! {
                message = watch.next() => { message?; }
                _ = stopped.changed() => break,
            }
        }
        anyhow::Ok(())
    });
    let writes = load(url, clients, seconds, round).await;
    let _ = stop.send(true);
    drain.await??;
    writes
}

/// A load phase with `etcdbrctl snapshot` (deltas every second into a local store under
/// `home`) running, the real peer's cost; its first full snapshot is waited for before the
/// load starts, so that only its deltas are measured.
async fn load_with_etcdbrctl(
    etcdbrctl: &Path,
    home: &Path,
    url: &str,
    clients: usize,
    seconds: f64,
    round: &str,
) -> anyhow::Result<f64> {
    use garden_ring_tests::etcdbrctl::{SnapshotOptions, Snapshotter, Store};
    std::fs::create_dir_all(home)?;
    let store = Store::local(home, "load", "etcd-main");
    let options = SnapshotOptions {
        delta_snapshot_period: DELTA_PERIOD,
        compress: false,
        garbage_collection: None,
    };
    let mut snapshotter = Snapshotter::start_for(etcdbrctl, home, &store, url, &options);
    snapshotter.wait_settled().await;
    let writes = load(url, clients, seconds, round).await;
    let deltas = snapshotter.listing().await.deltas().len();
    snapshotter.stop();
    println!("    etcdbrctl cut {deltas} deltas during the load ({round})");
    std::fs::remove_dir_all(home).ok();
    writes
}

/// Uploads `file` to `to` as the raw baseline: `WriteMultipart`, the copy's part size and
/// parts in flight.
async fn raw_upload(
    file: &Path,
    store: &Arc<dyn ObjectStore>,
    to: &StorePath,
) -> anyhow::Result<u64> {
    let mut f = tokio::fs::File::open(file).await?;
    let upload = store.put_multipart(to).await?;
    let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_SIZE_BYTES);
    let mut buf = vec![0u8; 4 * MIB];
    let mut total = 0u64;
    loop {
        let n = f.read(&mut buf).await?;
        if n == 0 {
            break;
        }
        writer.wait_for_capacity(MAX_PARTS_IN_FLIGHT).await?;
        writer.write(&buf[..n]);
        total += n as u64;
    }
    writer.finish().await?;
    Ok(total)
}

/// Streams object `from` of `store` into `file` (not timed).
async fn download(
    store: &Arc<dyn ObjectStore>,
    from: &StorePath,
    file: &Path,
) -> anyhow::Result<()> {
    use futures::TryStreamExt;
    use tokio::io::AsyncWriteExt;
    let mut out = tokio::fs::File::create(file).await?;
    let mut stream = store.get(from).await?.into_stream();
    while let Some(chunk) = stream.try_next().await? {
        out.write_all(&chunk).await?;
    }
    out.flush().await?;
    Ok(())
}

/// `restore_newest` of `location` into `<dir>/<name>.etcd` with the restore tool beside
/// `etcd`, which replays the deltas; checks that `deltas` deltas were replayed up to `last`.
/// Seconds, and the replay's ms.
async fn ring_restore(
    location: &BackupLocation,
    dir: &Path,
    name: &str,
    etcd: &Path,
    deltas: usize,
    last: u64,
) -> anyhow::Result<(f64, u64)> {
    let etcd_dir = etcd.parent().context("etcd has no directory")?;
    let peer = free_ports(1)?[0];
    let started = Instant::now();
    let restored = restore_newest(
        &location.store(),
        location.prefix(),
        &RestoreOptions {
            data_dir: dir.join(format!("{name}.etcd")),
            member_name: name.into(),
            peer_url: format!("http://127.0.0.1:{peer}"),
            tool: RestoreTool::detect(etcd_dir)?,
            now_unix_s: garden_ring::time::unix_ms() / 1000,
            tool_timeout_ms: 1_800_000,
            only: None,
            replay_with: Some(etcd.to_path_buf()),
        },
    )
    .await?;
    let seconds = started.elapsed().as_secs_f64();
    if restored.deltas.len() != deltas || restored.revision != last {
        bail!(
            "the ring's restore replayed {} deltas to revision {}; expected {deltas} to {last}",
            restored.deltas.len(),
            restored.revision,
        );
    }
    std::fs::remove_dir_all(dir.join(format!("{name}.etcd")))?;
    Ok((seconds, restored.replay_ms))
}

/// Runs the backup part: the measurements on one etcd, then the moves on a ring of `ringd`
/// from `bin_dir` with the certificates in `certs`.
pub async fn run(
    opts: &BackupBenchOptions,
    bin_dir: &Path,
    certs: &Path,
) -> anyhow::Result<BackupReport> {
    let moto = garden_ring_tests::s3::Moto::start(&opts.dir.join("moto"));
    for bucket in ["src", "dst", "raw", "load"] {
        moto.create_bucket(bucket);
    }
    let settings: BackupSettings = moto.settings(&moto.endpoint());
    let open = |url: &str| BackupLocation::parse(url, &settings).with_context(|| url.to_string());
    let etcd = start_etcd(&opts.etcd, &opts.dir).await?;
    let client = EtcdClient::connect(&etcd.url, options()).await?;

    // Preload.
    let keys = opts.size_mib * MIB / PRELOAD_VALUE_BYTES;
    let started = Instant::now();
    preload(&etcd.url, keys, opts.clients).await?;
    let preload_s = started.elapsed().as_secs_f64();
    let db_size_bytes = client.status().await?.db_size_bytes;
    println!(
        "  preloaded {keys} keys of {} KiB ({} MiB) in {preload_s:.1} s; database {:.0} MiB",
        PRELOAD_VALUE_BYTES / 1024,
        opts.size_mib,
        db_size_bytes as f64 / MIB as f64
    );

    // The deltas' cost: rounds in rotating order. The deltas go to moto (a Python process on
    // the same CPUs) and, to tell moto's share apart, to a local `file://` location.
    let load_location = open("s3://load/etcd-main")?;
    let file_dir = opts.dir.join("file-deltas");
    std::fs::create_dir_all(&file_dir)?;
    let file_location = open(&format!("file://{}/etcd-main", file_dir.display()))?;
    let (mut plain, mut with, mut with_file) = (Vec::new(), Vec::new(), Vec::new());
    let (mut with_watch, mut with_etcdbrctl) = (Vec::new(), Vec::new());
    let (mut load_deltas, mut load_delta_bytes) = (0, 0);
    let mut variants = vec!["p", "s3", "file", "watch"];
    if opts.etcdbrctl.is_some() {
        variants.push("etcdbrctl");
    }
    for round in 0..2 {
        let mut order = variants.clone();
        if round == 1 {
            order.reverse();
        }
        for variant in order {
            let name = format!("r{round}{variant}");
            match variant {
                "p" => plain.push(load(&etcd.url, opts.clients, opts.seconds, &name).await?),
                "watch" => with_watch
                    .push(load_with_watch(&etcd.url, opts.clients, opts.seconds, &name).await?),
                "etcdbrctl" => {
                    let etcdbrctl = opts.etcdbrctl.as_deref().context("etcdbrctl")?;
                    let home = opts.dir.join(format!("etcdbrctl-{name}"));
                    with_etcdbrctl.push(
                        load_with_etcdbrctl(
                            etcdbrctl,
                            &home,
                            &etcd.url,
                            opts.clients,
                            opts.seconds,
                            &name,
                        )
                        .await?,
                    );
                }
                "s3" => {
                    let (w, d, b) = load_with_deltas(
                        &etcd.url,
                        opts.clients,
                        opts.seconds,
                        &name,
                        &load_location,
                    )
                    .await?;
                    with.push(w);
                    load_deltas += d;
                    load_delta_bytes += b;
                }
                _ => {
                    let (w, ..) = load_with_deltas(
                        &etcd.url,
                        opts.clients,
                        opts.seconds,
                        &name,
                        &file_location,
                    )
                    .await?;
                    with_file.push(w);
                }
            }
        }
    }
    let ratio_deltas = median(&with) / median(&plain);
    let ratio_file_deltas = median(&with_file) / median(&plain);
    println!(
        "  {} clients: {:.0} writes/s without snapshots, {:.0} with a delta every {} s to moto ({load_deltas} deltas, {:.1} MiB): {ratio_deltas:.3}x; {:.0} to file:// {ratio_file_deltas:.3}x; {:.0} with a watch alone; {} with etcdbrctl's deltas",
        opts.clients,
        median(&plain),
        median(&with),
        DELTA_PERIOD.as_secs(),
        load_delta_bytes as f64 / MIB as f64,
        median(&with_file),
        median(&with_watch),
        if with_etcdbrctl.is_empty() {
            "-".to_string()
        } else {
            format!("{:.0}", median(&with_etcdbrctl))
        },
    );
    std::fs::remove_dir_all(&file_dir).ok();

    // The load phases' history compacted away, then the whole database defragmented (etcd
    // answers no write meanwhile), as a host's schedule does.
    let before_bytes = client.status().await?.db_size_bytes;
    client.compact(client.revision().await?).await?;
    let started = Instant::now();
    client.defragment(3_600_000).await?;
    let defrag_s = started.elapsed().as_secs_f64();
    let db_after_defrag_bytes = client.status().await?.db_size_bytes;
    println!(
        "  defragmentation: {defrag_s:.1} s (database {:.0} MiB -> {:.0} MiB)",
        before_bytes as f64 / MIB as f64,
        db_after_defrag_bytes as f64 / MIB as f64
    );

    // The full snapshot, then the deltas after it.
    let src = open("s3://src/etcd-main")?;
    let started = Instant::now();
    let staged = stage_full_snapshot(
        &client,
        &src.store(),
        src.prefix(),
        garden_ring::time::unix_ms() / 1000,
        false,
        false,
    )
    .await?;
    let full = staged.complete().await?;
    let full_upload = CopyRow::new(
        "ring full snapshot",
        full.stored_size_bytes,
        started.elapsed().as_secs_f64(),
    );
    let started = Instant::now();
    let mut stream = client.snapshot_stream().await?;
    let mut streamed = 0u64;
    while let Some(chunk) = stream.next_chunk().await? {
        streamed += chunk.blob.len() as u64;
    }
    let stream_alone = CopyRow::new(
        "etcd snapshot stream alone",
        streamed,
        started.elapsed().as_secs_f64(),
    );
    let local = opts.dir.join("full.db");
    download(&src.store(), &full.location, &local).await?;
    let raw_store = open("s3://raw")?.store();
    let started = Instant::now();
    let raw_bytes = raw_upload(&local, &raw_store, &StorePath::parse("upload/full.db")?).await?;
    let raw_upload_t = CopyRow::new(
        "raw object_store upload",
        raw_bytes,
        started.elapsed().as_secs_f64(),
    );
    std::fs::remove_file(&local)?;
    raw_store
        .delete(&StorePath::parse("upload/full.db")?)
        .await?;
    println!(
        "  full snapshot {:.0} MiB: ring {:.1} s ({:.0} MiB/s), raw upload {:.1} s ({:.0} MiB/s), etcd's stream alone {:.1} s ({:.0} MiB/s)",
        full_upload.bytes as f64 / MIB as f64,
        full_upload.seconds,
        full_upload.mib_per_s,
        raw_upload_t.seconds,
        raw_upload_t.mib_per_s,
        stream_alone.seconds,
        stream_alone.mib_per_s
    );
    let mut writer = DeltaWriter::start(&client, &src, full.revision + 1).await?;
    let value = data(9, WRITE_VALUE_BYTES);
    let mut last = full.revision;
    for d in 0..opts.deltas {
        for w in 0..WRITES_PER_DELTA {
            last = client
                .put(format!("/registry/deltas/{d:04}/{w:03}").as_bytes(), &value)
                .await?;
        }
        writer.pull_until(last).await?;
        writer.cut().await?;
    }
    if writer.written != opts.deltas as u64 {
        bail!("{} deltas written of {}", writer.written, opts.deltas);
    }

    // The copy, 2 rounds each, alternating.
    let (mut ring_runs, mut raw_runs) = (Vec::new(), Vec::new());
    let mut copied = 0;
    for round in 0..2 {
        for ring_now in [round == 0, round == 1] {
            if ring_now {
                let dst = open(&format!("s3://dst/r{round}/etcd-main"))?;
                let started = Instant::now();
                let report = copy_snapshots(&src, &dst, &CopyOptions::new(&settings)).await?;
                ring_runs.push(started.elapsed().as_secs_f64());
                copied = report.bytes_copied;
            } else {
                let started = Instant::now();
                raw_copy(
                    src.store(),
                    raw_store.clone(),
                    &StorePath::parse("etcd-main/v2")?,
                    &format!("r{round}"),
                )
                .await?;
                raw_runs.push(started.elapsed().as_secs_f64());
                super::copy::delete_all(raw_store.clone(), &format!("r{round}")).await?;
            }
        }
    }
    let copy = CopyRow::new("ring (streamed)", copied, median(&ring_runs)).runs(ring_runs);
    let raw_copy_t = CopyRow::new("raw object_store", copied, median(&raw_runs)).runs(raw_runs);
    println!(
        "  copy of the full snapshot + {} deltas ({:.0} MiB): ring {:.1} s, raw {:.1} s",
        opts.deltas,
        copied as f64 / MIB as f64,
        copy.seconds,
        raw_copy_t.seconds
    );

    // The restores, from the first copy: with the etcd the bench runs (its restore tool, and
    // it replays the deltas), and with etcd 3.5 when it is installed (`--unsafe-no-fsync`
    // during the replay, one sync at the end).
    let dst = open("s3://dst/r0/etcd-main")?;
    let (restore_s, replay_ms) =
        ring_restore(&dst, &opts.dir, "restored", &opts.etcd, opts.deltas, last).await?;
    println!(
        "  restore of the full snapshot + {} deltas: ring {restore_s:.1} s (replay {replay_ms} ms)",
        opts.deltas
    );
    let restore_35 = match garden_ring_tests::etcd::etcd35_bin_dir() {
        Some(dir) => {
            let (s, r) = ring_restore(
                &dst,
                &opts.dir,
                "restored35",
                &dir.join("etcd"),
                opts.deltas,
                last,
            )
            .await?;
            println!("  ... with etcd 3.5: {s:.1} s (replay {r} ms)");
            Some((s, r))
        }
        None => None,
    };
    let etcdbrctl_restore_s = match &opts.etcdbrctl {
        Some(etcdbrctl) => {
            let store =
                garden_ring_tests::etcdbrctl::Store::s3(&moto, &opts.dir, "dst", "r0/etcd-main");
            let (etcdbrctl, dir) = (etcdbrctl.clone(), opts.dir.clone());
            let ran = tokio::task::spawn_blocking(move || {
                garden_ring_tests::etcdbrctl::restore(&etcdbrctl, &dir, &store, "etcdbrctl")
            })
            .await?;
            match ran {
                Ok(r) => {
                    println!("  etcdbrctl restore: {:.1} s", r.ran.took.as_secs_f64());
                    Some(r.ran.took.as_secs_f64())
                }
                Err(ran) => bail!("etcdbrctl restore failed ({}): {}", ran.status, ran.log),
            }
        }
        None => {
            println!("  (etcdbrctl not found: the restore is not compared)");
            None
        }
    };
    // The standalone etcd and the copies are done with: the moves get the machine.
    drop(etcd);
    for bucket in ["src", "dst", "load"] {
        super::copy::delete_all(open(&format!("s3://{bucket}"))?.store(), "")
            .await
            .ok();
    }
    let moves = run_moves(opts, bin_dir, certs, &moto, &settings).await?;
    Ok(BackupReport {
        moves,
        size_mib: opts.size_mib,
        keys,
        db_size_bytes,
        preload_s,
        etcd_version: super::local::etcd_version(&opts.etcd),
        clients: opts.clients,
        plain_writes_per_s: plain,
        with_deltas_writes_per_s: with,
        with_file_deltas_writes_per_s: with_file,
        with_watch_writes_per_s: with_watch,
        with_etcdbrctl_writes_per_s: with_etcdbrctl,
        ratio_file_deltas,
        defrag_s,
        db_after_defrag_bytes,
        load_deltas,
        load_delta_bytes,
        ratio_deltas,
        full_upload,
        raw_upload: raw_upload_t,
        stream_alone,
        copy,
        raw_copy: raw_copy_t,
        deltas: opts.deltas,
        restore_s,
        replay_ms,
        restore_35_s: restore_35.map(|r| r.0),
        replay_35_ms: restore_35.map(|r| r.1),
        etcdbrctl_restore_s,
    })
}

/// One move of the big control plane, in its parts (from the ring's history; the
/// proposers' clocks are this machine's).
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct MoveReport {
    /// `switchover a -> b`, `failover (b killed) -> c`.
    pub what: String,
    /// The move (or the kill) -> serving at the new host, ms.
    pub total_ms: u64,
    /// The move (or the kill) -> the new host starts copying: the old host's final snapshot
    /// and release (switchover), or detection and the lease's expiry (failover), ms.
    pub before_copy_ms: Option<u64>,
    /// Copying, ms.
    pub copy_ms: Option<u64>,
    /// Restoring (the full snapshot and the deltas' replay), ms.
    pub restore_ms: Option<u64>,
    /// Starting: etcd up, the gate open, serving reported, ms.
    pub start_ms: Option<u64>,
    /// What the migration copied, bytes.
    pub bytes_copied: u64,
    /// The snapshot restored last (full or delta).
    pub restored: String,
    /// Its data-loss window, ms.
    pub data_loss_window_ms: Option<u64>,
    /// Writes the writer had acknowledged through the move.
    pub acked_writes: u64,
    /// Of those, missing at the new host.
    pub lost_writes: u64,
    /// Failover: the kill -> the old host's etcd gone (its guard fences it at the lease
    /// deadline it last had, `fence_ms` at most after it), ms.
    pub old_etcd_gone_ms: Option<u64>,
    /// Failover: what the ring allows for that: `lease_ms + fence_ms`.
    pub fence_bound_ms: Option<u64>,
}

/// The first event about `cp` at or after `from_ms` whose action is `action` and whose
/// detail contains `detail`: its time.
fn event_at(
    events: &[garden_ring::pb::Event],
    cp: &str,
    from_ms: u64,
    action: &str,
    detail: &str,
) -> Option<u64> {
    events
        .iter()
        .filter(|e| {
            e.subject == cp && e.action == action && e.at_ms >= from_ms && e.detail.contains(detail)
        })
        .map(|e| e.at_ms)
        .min()
}

/// The parts of a move that began at `t0_ms` (Unix), from the history.
fn parts(events: &[garden_ring::pb::Event], cp: &str, t0_ms: u64) -> [Option<u64>; 4] {
    let copying = event_at(
        events,
        cp,
        t0_ms,
        "control-plane.migration",
        "migration copying",
    );
    let restoring = event_at(
        events,
        cp,
        t0_ms,
        "control-plane.migration",
        "migration restoring",
    );
    let starting = event_at(
        events,
        cp,
        t0_ms,
        "control-plane.migration",
        "migration starting",
    );
    let serving = event_at(events, cp, t0_ms, "control-plane.serving", "");
    let between = |a: Option<u64>, b: Option<u64>| Some(b?.saturating_sub(a?));
    [
        between(Some(t0_ms), copying),
        between(copying, restoring),
        between(restoring, starting),
        between(starting, serving),
    ]
}

/// The pids of the `etcd` processes whose command line names a path under `dir` (a member's
/// etcd instances: their data directories are below its data directory).
fn etcd_pids_under(dir: &Path) -> Vec<u32> {
    let dir = dir.display().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let Ok(cmdline) = std::fs::read(format!("/proc/{pid}/cmdline")) else {
                return false;
            };
            let args: Vec<&[u8]> = cmdline.split(|b| *b == 0).collect();
            args.first().is_some_and(|a| a.ends_with(b"/etcd"))
                && args
                    .iter()
                    .any(|a| String::from_utf8_lossy(a).starts_with(&dir))
        })
        .collect()
}

/// The control plane the moves measure.
const BIG: &str = "big";

/// Polls `big` at member `via` every 100 ms until `done` holds (or `timeout`).
async fn wait_cp(
    ring: &LocalRing,
    via: usize,
    timeout: Duration,
    what: &str,
    done: impl Fn(&pb::ControlPlane) -> bool,
) -> anyhow::Result<pb::ControlPlane> {
    let deadline = Instant::now() + timeout;
    loop {
        if let Ok(cp) = ring.members[via]
            .client()
            .control_plane_get(pb::ControlPlaneGetRequest {
                name: BIG.into(),
                ..Default::default()
            })
            .await
            .map(tonic::Response::into_inner)
            && done(&cp)
        {
            return Ok(cp);
        }
        if Instant::now() >= deadline {
            bail!("{what}: not within {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// The ring's history as member `via` has it.
async fn history(ring: &LocalRing, via: usize) -> anyhow::Result<Vec<pb::Event>> {
    Ok(ring.members[via]
        .client()
        .history(pb::HistoryRequest {
            limit: 0,
            ..Default::default()
        })
        .await?
        .into_inner()
        .events)
}

/// Writes `/registry/moving/<tag>/<n>` one after another through `url` until `stop` (a tag
/// per move, so that one move's keys are not another's); the
/// acknowledged keys.
async fn write_until(
    url: String,
    tag: &'static str,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<String> {
    let mut acked = Vec::new();
    let Ok(client) = EtcdClient::connect(&url, options()).await else {
        return acked;
    };
    let value = data(11, WRITE_VALUE_BYTES);
    for n in 0.. {
        if *stop.borrow() {
            break;
        }
        let key = format!("/registry/moving/{tag}/{n:08}");
        match tokio::time::timeout(Duration::from_secs(2), client.put(key.as_bytes(), &value)).await
        {
            Ok(Ok(_)) => acked.push(key),
            _ => break,
        }
    }
    acked
}

/// How many of `keys` the etcd at `url` does not have.
async fn missing(url: &str, keys: &[String]) -> anyhow::Result<u64> {
    let client = EtcdClient::connect(url, options()).await?;
    let have: std::collections::BTreeSet<Vec<u8>> = client
        .get_prefix(b"/registry/moving/")
        .await?
        .into_iter()
        .map(|kv| kv.key)
        .collect();
    Ok(keys.iter().filter(|k| !have.contains(k.as_bytes())).count() as u64)
}

/// A move's report, once `big` serves at its new host.
async fn measured(
    ring: &LocalRing,
    via: usize,
    what: String,
    t0_ms: u64,
    cp: &pb::ControlPlane,
    (acked_writes, lost_writes): (u64, u64),
) -> anyhow::Result<MoveReport> {
    let events = history(ring, via).await?;
    let serving = event_at(&events, BIG, t0_ms, "control-plane.serving", "")
        .context("no serving event after the move")?;
    let [before_copy_ms, copy_ms, restore_ms, start_ms] = parts(&events, BIG, t0_ms);
    let m = cp.migration.clone().unwrap_or_default();
    let report = MoveReport {
        what,
        total_ms: serving - t0_ms,
        before_copy_ms,
        copy_ms,
        restore_ms,
        start_ms,
        bytes_copied: m.bytes_copied,
        restored: m.restored,
        data_loss_window_ms: m.data_loss_window_ms,
        acked_writes,
        lost_writes,
        old_etcd_gone_ms: None,
        fence_bound_ms: None,
    };
    let ms = |v: Option<u64>| v.map_or("-".into(), |v| format!("{v}"));
    println!(
        "  {}: {} ms to serving (before the copy {} ms, copy {} ms of {:.0} MiB, restore {} ms, start {} ms); restored {}, {} of {} acknowledged writes lost",
        report.what,
        report.total_ms,
        ms(report.before_copy_ms),
        ms(report.copy_ms),
        report.bytes_copied as f64 / MIB as f64,
        ms(report.restore_ms),
        ms(report.start_ms),
        report.restored,
        report.lost_writes,
        report.acked_writes
    );
    Ok(report)
}

/// The switchover (a -> b) and the failover (b's ringd killed) of a control plane whose etcd
/// holds `size_mib`, on three `ringd` with the etcd driver at production timings, backups in
/// moto, deltas every second; a writer runs through each move.
pub async fn run_moves(
    opts: &BackupBenchOptions,
    bin_dir: &Path,
    certs: &Path,
    moto: &garden_ring_tests::s3::Moto,
    settings: &BackupSettings,
) -> anyhow::Result<Vec<MoveReport>> {
    use garden_ring::config::{DriverKind, DriverSettings, MAX_FULL_SNAPSHOT_INTERVAL_MS, Timing};
    for bucket in ["ring-a", "ring-b", "ring-c"] {
        moto.create_bucket(bucket);
    }
    let mut driver = DriverSettings {
        kind: DriverKind::Etcd,
        ..DriverSettings::default()
    };
    let etcd = &mut driver.etcd;
    etcd.bin_dir = opts.etcd.parent().map(Path::to_path_buf);
    etcd.full_snapshot_interval_ms = MAX_FULL_SNAPSHOT_INTERVAL_MS;
    etcd.delta_snapshot_period_ms = DELTA_PERIOD.as_millis() as u64;
    etcd.garbage_collection_period_ms = 0;
    etcd.defragmentation_interval_ms = 0;
    etcd.start_timeout_ms = 300_000;
    etcd.restore_timeout_ms = 3_600_000;
    let spec = RingSpec {
        timing: Timing::default(),
        dns: false,
        verify_every_server: false,
        driver,
        backup: settings.clone(),
        metrics: false,
    };
    let mut ring = LocalRing::start(&opts.dir.join("ring"), bin_dir, certs, &spec)?;
    ring.wait_healthy(Duration::from_secs(60)).await?;
    let ports = free_ports(3)?;
    let names = ["a", "b", "c"];
    let endpoint = |m: &str| {
        let i = names.iter().position(|n| *n == m).unwrap_or(0);
        format!("127.0.0.1:{}", ports[i])
    };
    let url = |m: &str| format!("http://{}", endpoint(m));
    ring.members[0]
        .client()
        .control_plane_add(pb::ControlPlaneAddRequest {
            name: BIG.into(),
            dns_name: format!("{BIG}.{}", super::local::ZONE),
            endpoints: names.iter().map(|m| (m.to_string(), endpoint(m))).collect(),
            backup: format!("s3://ring-a/{BIG}"),
            backups: names
                .iter()
                .map(|m| (m.to_string(), format!("s3://ring-{m}/{BIG}")))
                .collect(),
            host: "a".into(),
            reason: "ring-chaos bench backup".into(),
            ..pb::ControlPlaneAddRequest::default()
        })
        .await?;
    wait_cp(&ring, 0, Duration::from_secs(120), "big runs on a", |cp| {
        cp.phase == "running" && cp.host == "a"
    })
    .await?;
    let keys = opts.size_mib * MIB / PRELOAD_VALUE_BYTES;
    let started = Instant::now();
    let last = preload(&url("a"), keys, opts.clients).await?;
    println!(
        "  ring: preloaded {keys} keys ({} MiB) through a's endpoint in {:.1} s",
        opts.size_mib,
        started.elapsed().as_secs_f64()
    );
    wait_cp(
        &ring,
        0,
        Duration::from_secs(600),
        "a's backups reach the preload",
        |cp| {
            cp.backup_status
                .as_ref()
                .is_some_and(|b| b.revision >= last)
        },
    )
    .await?;

    let mut reports = Vec::new();
    // The switchover, with a writer running through it.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let writer = tokio::spawn(write_until(url("a"), "switchover", stopped));
    tokio::time::sleep(Duration::from_secs(2)).await;
    let t0 = garden_ring::time::unix_ms();
    ring.members[0]
        .client()
        .r#move(pb::MoveRequest {
            move_kind: pb::MoveKind::Switchover as i32,
            control_plane: BIG.into(),
            to: "b".into(),
            reason: "ring-chaos bench backup".into(),
            ..pb::MoveRequest::default()
        })
        .await?;
    // The writer ends at its first refused write (a's gate closed); stopped here in case.
    let cp = wait_cp(
        &ring,
        0,
        Duration::from_secs(3_600),
        "big runs on b",
        |cp| cp.phase == "running" && cp.host == "b",
    )
    .await?;
    let _ = stop.send(true);
    let acked = writer.await?;
    let lost = (acked.len() as u64, missing(&url("b"), &acked).await?);
    reports.push(measured(&ring, 0, "switchover a -> b".into(), t0, &cp, lost).await?);

    // The failover: b's ringd killed while a writer runs on b.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let writer = tokio::spawn(write_until(url("b"), "failover", stopped));
    tokio::time::sleep(Duration::from_secs(3)).await;
    let b_dir = ring.members[1].config.data_dir.clone();
    let old_etcd = etcd_pids_under(&b_dir);
    if old_etcd.is_empty() {
        bail!("no etcd process found under {}", b_dir.display());
    }
    let t0 = garden_ring::time::unix_ms();
    let killed = Instant::now();
    ring.members[1].proc.kill9();
    let gone = tokio::spawn(async move {
        while old_etcd
            .iter()
            .any(|pid| Path::new(&format!("/proc/{pid}")).exists())
        {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
        killed.elapsed().as_millis() as u64
    });
    let cp = wait_cp(
        &ring,
        0,
        Duration::from_secs(3_600),
        "big runs off b",
        |cp| cp.phase == "running" && !cp.host.is_empty() && cp.host != "b",
    )
    .await?;
    let _ = stop.send(true);
    let acked = writer.await?;
    let lost = (acked.len() as u64, missing(&url(&cp.host), &acked).await?);
    let mut report = measured(
        &ring,
        0,
        format!("failover (b killed) -> {}", cp.host),
        t0,
        &cp,
        lost,
    )
    .await?;
    let timing = &ring.members[0].config.timing;
    report.fence_bound_ms = Some(timing.lease_ms + timing.fence_ms);
    report.old_etcd_gone_ms = Some(gone.await?);
    println!(
        "  the killed host's etcd was fenced {} ms after the kill (lease + fence: {} ms)",
        report.old_etcd_gone_ms.unwrap_or_default(),
        timing.lease_ms + timing.fence_ms
    );
    reports.push(report);
    ring.stop();
    Ok(reports)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(action: &str, detail: &str, at_ms: u64) -> pb::Event {
        pb::Event {
            action: action.into(),
            subject: BIG.into(),
            detail: detail.into(),
            at_ms,
            ..Default::default()
        }
    }

    #[test]
    fn a_move_s_parts_come_from_the_history_after_it() {
        let events = vec![
            // An earlier move's events do not count.
            event(
                "control-plane.migration",
                "migration copying, 5 bytes copied",
                500,
            ),
            event("control-plane.move", "switchover a -> b", 1_000),
            event("control-plane.migration", "migration copying", 1_400),
            event(
                "control-plane.migration",
                "migration copying, 1073741824 bytes copied",
                5_000,
            ),
            event("control-plane.migration", "migration restoring", 9_000),
            event("control-plane.migration", "migration starting", 20_000),
            event("control-plane.serving", "serving on b at epoch 2", 20_700),
        ];
        assert_eq!(
            parts(&events, BIG, 1_000),
            [Some(400), Some(7_600), Some(11_000), Some(700)]
        );
        assert_eq!(
            event_at(&events, BIG, 1_000, "control-plane.serving", ""),
            Some(20_700)
        );
        // Nothing after the time: nothing known.
        assert_eq!(parts(&events, BIG, 30_000), [None, None, None, None]);
        assert_eq!(
            event_at(&events, "other", 0, "control-plane.move", ""),
            None
        );
    }
}
