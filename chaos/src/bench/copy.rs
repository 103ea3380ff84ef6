//! Migration copy: the throughput of the ring's snapshot copy between two buckets of a real S3
//! API (`moto_server` on loopback) against a raw copy of the same data, in the same run.
//!
//! (This was `ring/benches/backup_copy.rs`; it moved here so that one command runs every
//! benchmark.)
//!
//! - `ring (streamed)`: `copy_snapshots` from bucket A to bucket B, what a migration does
//!   between two zones' buckets (list, get streamed into a multipart upload, retries,
//!   destination checks);
//! - `raw object_store`: a plain loop over the same objects, `get` streamed into
//!   `WriteMultipart`, same part size and parallelism, no listing of the destination, no
//!   skipping, no retries;
//! - `ring (server-side)`: `copy_snapshots` within bucket A to another prefix (CopyObject);
//! - `aws s3 cp --recursive` between buckets, when the `aws` CLI is installed (it copies
//!   server-side too, so it is compared with the server-side row).
//!
//! The streamed copies run [`ROUNDS`] times each, in alternating order, and their medians
//! count. moto keeps every bucket in memory; objects are 16 MiB.

use std::net::{SocketAddr, TcpListener};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::{StreamExt, TryStreamExt};
use garden_ring::backup::copy::{
    CopyOptions, MAX_PARTS_IN_FLIGHT, PART_SIZE_BYTES, copy_snapshots,
};
use garden_ring::backup::layout::list_snapshots;
use garden_ring::backup::location::BackupLocation;
use garden_ring::backup::object_store::path::Path;
use garden_ring::backup::object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use garden_ring::config::BackupSettings;
use serde::Serialize;

use super::local::Child;

const MIB: usize = 1024 * 1024;
/// Size of one snapshot object.
pub const OBJECT_MIB: usize = 16;
/// Objects copied at once, by both.
pub const PARALLELISM: usize = 4;
/// Rounds of the ring's and the raw copy, in alternating order (the first copy of a run pays
/// for connections and moto's warm-up).
pub const ROUNDS: usize = 3;

/// Settings of the copy part.
#[derive(Debug, Clone)]
pub struct CopyBenchOptions {
    /// Total size copied, MiB (rounded down to whole objects, at least one).
    pub total_mib: usize,
    /// A scratch directory (moto's log), removed by the caller.
    pub dir: PathBuf,
}

/// One copy.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct CopyRow {
    /// What copied.
    pub name: String,
    /// Bytes copied.
    pub bytes: u64,
    /// How long it took.
    pub seconds: f64,
    /// MiB per second.
    pub mib_per_s: f64,
    /// Seconds of every round, when there were several (`seconds` is their median).
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub rounds_seconds: Vec<f64>,
}

impl CopyRow {
    pub(super) fn new(name: &str, bytes: u64, seconds: f64) -> Self {
        Self {
            name: name.into(),
            bytes,
            seconds,
            mib_per_s: bytes as f64 / MIB as f64 / seconds.max(1e-9),
            rounds_seconds: Vec::new(),
        }
    }

    pub(super) fn runs(mut self, seconds: Vec<f64>) -> Self {
        self.rounds_seconds = seconds;
        self
    }
}

/// What the copy part measured.
#[derive(Debug, Clone, Serialize)]
pub struct CopyReport {
    /// Total MiB copied per row.
    pub total_mib: usize,
    /// Objects.
    pub objects: usize,
    /// MiB per object.
    pub object_mib: usize,
    /// Objects at once.
    pub parallelism: usize,
    /// Rounds of the streamed copies (medians reported).
    pub rounds: usize,
    /// Multipart part size, MiB.
    pub part_mib: usize,
    /// Streamed (ring), raw, server-side (ring), and `aws s3 cp` when installed.
    pub rows: Vec<CopyRow>,
    /// ring (streamed) / raw.
    pub ratio_ring_to_raw: f64,
    /// ring (server-side) / `aws s3 cp`, when the CLI is installed.
    pub ratio_server_side_to_aws_cli: Option<f64>,
}

/// A `moto_server` child (killed on drop) and its address.
struct Moto {
    _child: Child,
    addr: SocketAddr,
}

/// One HTTP/1.1 request without a body; the status.
async fn http(addr: SocketAddr, method: &str, path: &str) -> std::io::Result<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream =
        tokio::time::timeout(Duration::from_secs(5), tokio::net::TcpStream::connect(addr))
            .await
            .map_err(|_| std::io::Error::other("connect timed out"))??;
    stream
        .write_all(
            format!(
                "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
            )
            .as_bytes(),
        )
        .await?;
    let mut head = vec![0u8; 64];
    let n = tokio::time::timeout(Duration::from_secs(10), stream.read(&mut head))
        .await
        .map_err(|_| std::io::Error::other("no answer"))??;
    String::from_utf8_lossy(&head[..n])
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("not an HTTP response"))
}

async fn start_moto(dir: &std::path::Path) -> anyhow::Result<Moto> {
    let program = crate::world::find_tool("moto_server").map_err(|_| {
        anyhow::anyhow!(
            "moto_server not found: install it with `pip install 'moto[server]'` (scripts/test.sh does)"
        )
    })?;
    let port = TcpListener::bind("127.0.0.1:0")?.local_addr()?.port();
    let mut child = Child::spawn(
        "moto_server",
        std::process::Command::new(&program)
            .args(["-H", "127.0.0.1", "-p"])
            .arg(port.to_string())
            .env("RUST_LOG", ""),
        dir.join("moto.log"),
    )?;
    let addr = SocketAddr::from(([127, 0, 0, 1], port));
    let deadline = Instant::now() + Duration::from_secs(60);
    while http(addr, "GET", "/").await.ok() != Some(200) {
        child.check_running()?;
        if Instant::now() >= deadline {
            bail!("moto_server did not answer within 60 s");
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    Ok(Moto {
        _child: child,
        addr,
    })
}

/// Deterministic incompressible-looking bytes.
pub fn data(seed: u64, len: usize) -> Vec<u8> {
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

/// The plain baseline: every object of `from` under `prefix`, `get` streamed into
/// `WriteMultipart` at `to` under `into/`, [`PARALLELISM`] objects at once.
pub(super) async fn raw_copy(
    from: Arc<dyn ObjectStore>,
    to: Arc<dyn ObjectStore>,
    prefix: &Path,
    into: &str,
) -> anyhow::Result<u64> {
    let objects: Vec<_> = from.list(Some(prefix)).try_collect().await?;
    let copied: Vec<u64> = futures::stream::iter(objects)
        .map(|meta| {
            let (from, to) = (Arc::clone(&from), Arc::clone(&to));
            let target = Path::parse(format!("{into}/{}", meta.location));
            async move {
                let target = target?;
                let mut stream = from.get(&meta.location).await?.into_stream();
                let upload = to.put_multipart(&target).await?;
                let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_SIZE_BYTES);
                while let Some(chunk) = stream.try_next().await? {
                    writer.wait_for_capacity(MAX_PARTS_IN_FLIGHT).await?;
                    writer.put(chunk);
                }
                writer.finish().await?;
                anyhow::Ok(meta.size)
            }
        })
        .buffer_unordered(PARALLELISM)
        .try_collect()
        .await?;
    Ok(copied.into_iter().sum())
}

/// Deletes every object under `prefix` (moto keeps them in memory).
pub(super) async fn delete_all(store: Arc<dyn ObjectStore>, prefix: &str) -> anyhow::Result<()> {
    let prefix = Path::parse(prefix)?;
    let objects: Vec<_> = store.list(Some(&prefix)).try_collect().await?;
    for meta in objects {
        store.delete(&meta.location).await?;
    }
    Ok(())
}

/// The median of `v` (the lower middle one for an even count).
pub fn median(v: &[f64]) -> f64 {
    let mut sorted = v.to_vec();
    sorted.sort_by(f64::total_cmp);
    sorted
        .get(sorted.len().saturating_sub(1) / 2)
        .copied()
        .unwrap_or(0.0)
}

/// The snapshot name of object `i` (etcd-backup-restore's v2 layout).
fn snapshot_name(i: u64) -> String {
    let kind = if i.is_multiple_of(4) { "Full" } else { "Incr" };
    format!(
        "etcd-main/v2/{kind}-{:08}-{:08}-{}.gz",
        if kind == "Full" { 0 } else { 1_000 * i + 1 },
        1_000 * (i + 1),
        1_700_000_000 + 60 * i
    )
}

/// Runs the copy part.
pub async fn run(opts: &CopyBenchOptions) -> anyhow::Result<CopyReport> {
    let count = (opts.total_mib / OBJECT_MIB).max(1);
    let total_mib = count * OBJECT_MIB;
    let moto = start_moto(&opts.dir).await?;
    for bucket in ["bench-a", "bench-b", "bench-raw", "bench-cli"] {
        let status = http(moto.addr, "PUT", &format!("/{bucket}")).await?;
        if status != 200 {
            bail!("creating bucket {bucket}: HTTP {status}");
        }
    }
    let credentials = opts.dir.join("s3.toml");
    std::fs::write(
        &credentials,
        "access_key_id = \"bench\"\nsecret_access_key = \"bench\"\n",
    )?;
    let endpoint = format!("http://{}", moto.addr);
    let settings = BackupSettings {
        s3_endpoint: Some(endpoint.clone()),
        s3_allow_http: true,
        credentials_file: Some(credentials),
        copy_parallelism: PARALLELISM,
        ..BackupSettings::default()
    };
    let open = |url: &str| BackupLocation::parse(url, &settings).with_context(|| url.to_string());
    let source = open("s3://bench-a/etcd-main")?;
    let mut bytes = 0u64;
    for i in 0..count as u64 {
        let payload = data(i, OBJECT_MIB * MIB);
        bytes += payload.len() as u64;
        source
            .store()
            .put(&Path::parse(snapshot_name(i))?, PutPayload::from(payload))
            .await
            .context("writing a snapshot into moto")?;
    }
    println!(
        "  {count} snapshots of {OBJECT_MIB} MiB ({total_mib} MiB) in moto, parallelism {PARALLELISM}"
    );
    // Rounds in alternating order (ring first, then raw first, ...), each into a fresh
    // prefix removed afterwards; the median of each counts.
    let (mut ring_runs, mut raw_runs) = (Vec::new(), Vec::new());
    for round in 0..ROUNDS {
        for ring_now in [round.is_multiple_of(2), !round.is_multiple_of(2)] {
            let prefix = format!("r{round}");
            if ring_now {
                let destination = open(&format!("s3://bench-b/{prefix}/etcd-main"))?;
                let started = Instant::now();
                let report = copy_snapshots(&source, &destination, &CopyOptions::new(&settings))
                    .await
                    .context("the ring's copy")?;
                ring_runs.push(started.elapsed().as_secs_f64());
                if report.bytes_copied != bytes {
                    bail!(
                        "the ring's copy moved {} bytes of {bytes}",
                        report.bytes_copied
                    );
                }
                delete_all(destination.store(), &prefix).await?;
            } else {
                let destination = open("s3://bench-raw")?.store();
                let started = Instant::now();
                let raw = raw_copy(
                    source.store(),
                    destination.clone(),
                    &Path::parse("etcd-main/v2")?,
                    &prefix,
                )
                .await
                .context("the raw copy")?;
                raw_runs.push(started.elapsed().as_secs_f64());
                if raw != bytes {
                    bail!("the raw copy moved {raw} bytes of {bytes}");
                }
                delete_all(destination, &prefix).await?;
            }
        }
    }
    let mut rows = vec![
        CopyRow::new("ring (streamed)", bytes, median(&ring_runs)).runs(ring_runs),
        CopyRow::new("raw object_store", bytes, median(&raw_runs)).runs(raw_runs),
    ];

    let started = Instant::now();
    let report = copy_snapshots(
        &source,
        &open("s3://bench-a/copy")?,
        &CopyOptions::new(&settings),
    )
    .await
    .context("the ring's server-side copy")?;
    rows.push(CopyRow::new(
        "ring (server-side)",
        report.bytes_copied,
        started.elapsed().as_secs_f64(),
    ));

    let aws = Command::new("aws")
        .arg("--version")
        .output()
        .is_ok_and(|o| o.status.success());
    if aws {
        let started = Instant::now();
        let status = tokio::process::Command::new("aws")
            .args([
                "s3",
                "cp",
                "--recursive",
                "--only-show-errors",
                "--endpoint-url",
                &endpoint,
            ])
            .args(["s3://bench-a/etcd-main/", "s3://bench-cli/etcd-main/"])
            .env("AWS_ACCESS_KEY_ID", "bench")
            .env("AWS_SECRET_ACCESS_KEY", "bench")
            .env("AWS_DEFAULT_REGION", "us-east-1")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("AWS_CONFIG_FILE", "/dev/null")
            .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
            .status()
            .await
            .context("running aws")?;
        if !status.success() {
            bail!("aws s3 cp failed: {status}");
        }
        let seconds = started.elapsed().as_secs_f64();
        let copied = list_snapshots(&open("s3://bench-cli/etcd-main")?).await?;
        if copied.snapshots.len() != count {
            bail!(
                "aws s3 cp copied {} of {count} snapshots",
                copied.snapshots.len()
            );
        }
        rows.push(CopyRow::new(
            "aws s3 cp --recursive (server-side)",
            bytes,
            seconds,
        ));
    } else {
        println!("  (aws CLI not found: its row is left out)");
    }
    for r in &rows {
        println!(
            "  {:<36} {:>6.0} MiB {:>7.2} s {:>8.1} MiB/s",
            r.name,
            r.bytes as f64 / MIB as f64,
            r.seconds,
            r.mib_per_s
        );
    }
    Ok(CopyReport {
        total_mib,
        objects: count,
        object_mib: OBJECT_MIB,
        parallelism: PARALLELISM,
        rounds: ROUNDS,
        part_mib: PART_SIZE_BYTES / MIB,
        ratio_ring_to_raw: rows[0].mib_per_s / rows[1].mib_per_s,
        ratio_server_side_to_aws_cli: rows.get(3).map(|cli| rows[2].mib_per_s / cli.mib_per_s),
        rows,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_names_follow_the_v2_layout() {
        assert_eq!(
            snapshot_name(0),
            "etcd-main/v2/Full-00000000-00001000-1700000000.gz"
        );
        assert_eq!(
            snapshot_name(1),
            "etcd-main/v2/Incr-00001001-00002000-1700000060.gz"
        );
        assert!(
            garden_ring::core::backup_name::SnapshotName::parse(
                snapshot_name(5).rsplit('/').next().unwrap()
            )
            .is_ok()
        );
    }

    #[test]
    fn rows_compute_their_throughput() {
        let r = CopyRow::new("x", 64 * MIB as u64, 2.0);
        assert_eq!(r.mib_per_s, 32.0);
        assert_eq!(data(1, 16), data(1, 16));
        assert_ne!(data(1, 16), data(2, 16));
        assert_eq!(median(&[3.0, 1.0, 2.0]), 2.0);
        assert_eq!(median(&[4.0, 1.0, 3.0, 2.0]), 2.0);
        assert_eq!(median(&[]), 0.0);
    }
}
