//! Copy throughput between two buckets of a real S3 API (`moto_server` on loopback), in one
//! run and on the same data:
//!
//! - `ours (streamed)`: `copy_snapshots` from bucket A to bucket B (get -> multipart upload);
//! - `raw object_store`: a plain loop over the same objects, `get` streamed into
//!   `WriteMultipart`, same part size and parallelism, no listing of the destination, no
//!   skipping, no retries;
//! - `ours (server-side)`: `copy_snapshots` within bucket A to another prefix (CopyObject);
//! - `aws s3 cp --recursive` between the buckets, if the `aws` CLI is installed (it copies
//!   server-side too, so compare it with the server-side row).
//!
//! Run: `cargo bench -p garden-ring --bench backup_copy`. Prints a table and writes
//! `<target dir>/bench/backup_copy.json`. `GARDEN_RING_BENCH_MIB` sets the total size
//! (default 128, 16 to 1024), in objects of 16 MiB. moto keeps every bucket in memory.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path as FsPath, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::Arc;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use garden_ring::backup::copy::{
    CopyOptions, MAX_PARTS_IN_FLIGHT, PART_SIZE_BYTES, copy_snapshots,
};
use garden_ring::backup::layout::list_snapshots;
use garden_ring::backup::location::BackupLocation;
use garden_ring::backup::object_store::path::Path;
use garden_ring::backup::object_store::{ObjectStore, ObjectStoreExt, PutPayload, WriteMultipart};
use garden_ring::config::BackupSettings;

const MIB: usize = 1024 * 1024;
/// Size of one snapshot object.
const OBJECT_MIB: usize = 16;
const PARALLELISM: usize = 4;

/// A `moto_server` child, killed on drop.
struct Moto {
    child: Child,
    addr: SocketAddr,
}

impl Drop for Moto {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// One HTTP/1.1 request without a body; the status.
fn http(addr: SocketAddr, method: &str, path: &str) -> std::io::Result<u16> {
    let mut stream = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    stream.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    response
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other("not an HTTP response"))
}

fn start_moto(log: &FsPath) -> Moto {
    let found = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|d| d.join("moto_server"))
        .find(|p| p.is_file())
        .unwrap_or_else(|| {
            panic!(
                "`moto_server` not found in PATH; run scripts/test.sh (it installs moto[server])"
            )
        });
    let port = TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .expect("a free port")
        .port();
    let log = std::fs::File::create(log).expect("create moto.log");
    let child = Command::new(found)
        .args(["-H", "127.0.0.1", "-p", &port.to_string()])
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log handle"))
        .stderr(log)
        .spawn()
        .expect("start moto_server");
    let mut moto = Moto {
        child,
        addr: SocketAddr::from(([127, 0, 0, 1], port)),
    };
    let deadline = Instant::now() + Duration::from_secs(60);
    while http(moto.addr, "GET", "/").ok() != Some(200) {
        if let Ok(Some(status)) = moto.child.try_wait() {
            panic!("moto_server exited with {status}");
        }
        assert!(
            Instant::now() < deadline,
            "moto_server did not answer within 60 s"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
    moto
}

/// Deterministic incompressible-looking bytes.
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

/// The plain baseline: every object of `from` under `prefix`, `get` streamed into
/// `WriteMultipart` at `to`, `PARALLELISM` objects at once.
async fn raw_copy(from: Arc<dyn ObjectStore>, to: Arc<dyn ObjectStore>, prefix: &Path) -> u64 {
    let objects: Vec<_> = from.list(Some(prefix)).try_collect().await.expect("list");
    futures::stream::iter(objects)
        .map(|meta| {
            let (from, to) = (Arc::clone(&from), Arc::clone(&to));
            tokio::spawn(async move {
                let mut stream = from.get(&meta.location).await.expect("get").into_stream();
                let upload = to
                    .put_multipart(&meta.location)
                    .await
                    .expect("start upload");
                let mut writer = WriteMultipart::new_with_chunk_size(upload, PART_SIZE_BYTES);
                while let Some(chunk) = stream.try_next().await.expect("read") {
                    writer
                        .wait_for_capacity(MAX_PARTS_IN_FLIGHT)
                        .await
                        .expect("upload a part");
                    writer.put(chunk);
                }
                writer.finish().await.expect("complete the upload");
                meta.size
            })
        })
        .buffer_unordered(PARALLELISM)
        .map(|done| done.expect("copy task"))
        .fold(0, |total, size| async move { total + size })
        .await
}

struct Row {
    name: &'static str,
    bytes: u64,
    seconds: f64,
}

impl Row {
    fn mib_per_s(&self) -> f64 {
        self.bytes as f64 / MIB as f64 / self.seconds
    }
}

fn target_dir() -> PathBuf {
    std::env::var_os("CARGO_TARGET_DIR")
        .map(PathBuf::from)
        .unwrap_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../target"))
}

fn main() {
    let total_mib: usize = std::env::var("GARDEN_RING_BENCH_MIB")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(128)
        .clamp(16, 1024);
    let count = total_mib / OBJECT_MIB;
    let dir = tempfile::tempdir().expect("a temporary directory");
    let moto = start_moto(&dir.path().join("moto.log"));
    for bucket in ["bench-a", "bench-b", "bench-raw", "bench-cli"] {
        assert_eq!(
            http(moto.addr, "PUT", &format!("/{bucket}")).ok(),
            Some(200)
        );
    }
    let credentials = dir.path().join("s3.toml");
    std::fs::write(
        &credentials,
        "access_key_id = \"bench\"\nsecret_access_key = \"bench\"\n",
    )
    .expect("write credentials");
    let endpoint = format!("http://{}", moto.addr);
    let settings = BackupSettings {
        s3_endpoint: Some(endpoint.clone()),
        s3_allow_http: true,
        credentials_file: Some(credentials),
        copy_parallelism: PARALLELISM,
        ..BackupSettings::default()
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("a tokio runtime");
    let open = |url: &str| BackupLocation::parse(url, &settings).expect("a location");
    let source = open("s3://bench-a/etcd-main");

    let rows = runtime.block_on(async {
        let mut rows = Vec::new();
        let mut bytes = 0u64;
        for i in 0..count as u64 {
            let kind = if i % 4 == 0 { "Full" } else { "Incr" };
            let name = format!(
                "etcd-main/v2/{kind}-{:08}-{:08}-{}.gz",
                if kind == "Full" { 0 } else { 1_000 * i + 1 },
                1_000 * (i + 1),
                1_700_000_000 + 60 * i
            );
            let payload = data(i, OBJECT_MIB * MIB);
            bytes += payload.len() as u64;
            source
                .store()
                .put(&Path::parse(&name).unwrap(), PutPayload::from(payload))
                .await
                .expect("write a snapshot");
        }
        println!("{count} snapshots of {OBJECT_MIB} MiB ({total_mib} MiB) in moto, parallelism {PARALLELISM}");

        let started = Instant::now();
        let report = copy_snapshots(&source, &open("s3://bench-b/etcd-main"), &CopyOptions::new(&settings))
            .await
            .expect("our copy");
        rows.push(Row { name: "ours (streamed)", bytes: report.bytes_copied, seconds: started.elapsed().as_secs_f64() });
        assert_eq!(report.bytes_copied, bytes);

        let started = Instant::now();
        let raw = raw_copy(source.store(), open("s3://bench-raw").store(), &Path::parse("etcd-main/v2").unwrap()).await;
        rows.push(Row { name: "raw object_store", bytes: raw, seconds: started.elapsed().as_secs_f64() });
        assert_eq!(raw, bytes);

        let started = Instant::now();
        let report = copy_snapshots(&source, &open("s3://bench-a/copy"), &CopyOptions::new(&settings))
            .await
            .expect("our server-side copy");
        rows.push(Row { name: "ours (server-side)", bytes: report.bytes_copied, seconds: started.elapsed().as_secs_f64() });

        let aws = Command::new("aws").arg("--version").output().is_ok_and(|o| o.status.success());
        if aws {
            let started = Instant::now();
            let status = Command::new("aws")
                .args(["s3", "cp", "--recursive", "--only-show-errors", "--endpoint-url", &endpoint])
                .args(["s3://bench-a/etcd-main/", "s3://bench-cli/etcd-main/"])
                .env("AWS_ACCESS_KEY_ID", "bench")
                .env("AWS_SECRET_ACCESS_KEY", "bench")
                .env("AWS_DEFAULT_REGION", "us-east-1")
                .env("AWS_EC2_METADATA_DISABLED", "true")
                .env("AWS_CONFIG_FILE", "/dev/null")
                .env("AWS_SHARED_CREDENTIALS_FILE", "/dev/null")
                .status()
                .expect("run aws");
            assert!(status.success(), "aws s3 cp failed: {status}");
            let seconds = started.elapsed().as_secs_f64();
            let copied = list_snapshots(&open("s3://bench-cli/etcd-main")).await.expect("list");
            assert_eq!(copied.snapshots.len(), count, "aws s3 cp copied every snapshot");
            rows.push(Row { name: "aws s3 cp --recursive (server-side)", bytes, seconds });
        } else {
            println!("(aws CLI not found: its row is left out)");
        }
        rows
    });

    println!();
    println!(
        "{:<38} {:>10} {:>10} {:>10}",
        "copy", "MiB", "seconds", "MiB/s"
    );
    for row in &rows {
        println!(
            "{:<38} {:>10.0} {:>10.2} {:>10.1}",
            row.name,
            row.bytes as f64 / MIB as f64,
            row.seconds,
            row.mib_per_s()
        );
    }
    let ratio = rows[0].mib_per_s() / rows[1].mib_per_s();
    println!("\nours / raw object_store (streamed, same data, same run): {ratio:.2}");
    let cli_ratio = rows.get(3).map(|cli| rows[2].mib_per_s() / cli.mib_per_s());
    if let Some(r) = cli_ratio {
        println!("ours (server-side) / aws s3 cp: {r:.2}");
    }

    let json = serde_json::json!({
        "total_mib": total_mib,
        "objects": count,
        "object_mib": OBJECT_MIB,
        "parallelism": PARALLELISM,
        "part_mib": PART_SIZE_BYTES / MIB,
        "rows": rows.iter().map(|r| serde_json::json!({
            "name": r.name,
            "bytes": r.bytes,
            "seconds": r.seconds,
            "mib_per_s": r.mib_per_s(),
        })).collect::<Vec<_>>(),
        "ratio_ours_to_raw": ratio,
        "ratio_server_side_to_aws_cli": cli_ratio,
    });
    let out = target_dir().join("bench");
    std::fs::create_dir_all(&out).expect("create the bench directory");
    let path = out.join("backup_copy.json");
    std::fs::write(&path, serde_json::to_string_pretty(&json).unwrap()).expect("write the JSON");
    println!("wrote {}", path.display());
}
