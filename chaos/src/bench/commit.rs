//! Commit path: writes/s and latency of a 3-member ring against a 3-member etcd cluster on the
//! same machine, same duration, same client model. Both run for the whole part, but only one is
//! driven at a time (they never share the cores under load), in [`SEGMENTS`] alternating
//! segments per concurrency: etcd, ring, etcd, ring... A VM's disk and CPU drift over minutes;
//! measured one system after the other, that drift lands on the ratio, alternated it falls on
//! both.
//!
//! - **etcd**: Debian's etcd (3.4) with its defaults (fsync on every commit, heartbeat 100 ms,
//!   election 1 s), plain HTTP/2 on loopback. Each write is a KV `Put` of a value as long as the
//!   ring's log payload for one write (below), to a key of the client's own.
//! - **ring**: three `ringd`s with their production settings (`Timing::default()`, snapshots
//!   every 5000 entries, mutual TLS on every port, redb with fsync). Each write is a
//!   `ControlPlaneLabel` call through the Admin API: it replaces the labels of a control plane
//!   of the client's own (`bench-NN`), so it is validated, proposed, appended and fsynced on a
//!   majority, applied, recorded in history, and acknowledged, exactly like an etcd put.
//! - Both: every client is a sequential loop (the next write after the previous one was
//!   acknowledged) over its own connection (one HTTP/2 channel per client) to the leader;
//!   `warmup` seconds are run and thrown away before a system's first segment at each
//!   concurrency ([`SETTLE_SECONDS`] before the others), then writes acknowledged within the
//!   segments (`seconds` in all) count, with their latency.

use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use garden_ring::backup::etcd::{EtcdClient, EtcdClientOptions};
use garden_ring::config::Timing;
use garden_ring::core::{Command, Proposal};
use garden_ring::pb;
use garden_ring::pb::admin_client::AdminClient as Grpc;
use serde::Serialize;
use tonic::transport::Channel;

use super::local::{self, Child, EtcdCluster, LocalRing, RingSpec};
use super::stats::{LatencySummary, cpu_seconds};

/// Seconds the servers' CPU is measured with no client.
const IDLE_SECONDS: f64 = 2.0;

/// Segments each system's measured time is cut into, alternating between the two.
pub const SEGMENTS: u32 = 4;

/// Seconds run and thrown away before every segment but the first of a system at one
/// concurrency (its clients are connected and warm already).
pub const SETTLE_SECONDS: f64 = 0.2;

/// Settings of the commit part.
#[derive(Debug, Clone)]
pub struct CommitOptions {
    /// Measured seconds per system and concurrency.
    pub seconds: f64,
    /// Seconds run before measuring (thrown away).
    pub warmup: f64,
    /// The numbers of concurrent clients.
    pub concurrency: Vec<usize>,
    /// Where `ringd` is.
    pub bin_dir: PathBuf,
    /// The `etcd` binary.
    pub etcd: PathBuf,
    /// A scratch directory (data directories, logs), removed by the caller.
    pub dir: PathBuf,
    /// Certificates (see [`local::certificates`]).
    pub certs: PathBuf,
    /// Record the leader `ringd` with `perf record --call-graph dwarf` during each
    /// concurrency, into `<this directory>/perf-ring-leader-<clients>.data`.
    pub perf: Option<PathBuf>,
}

/// One system at one concurrency.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct Point {
    /// Concurrent clients.
    pub clients: usize,
    /// Throughput and latency.
    #[serde(flatten)]
    pub summary: LatencySummary,
    /// Failed writes in the measured window.
    pub errors: u64,
    /// CPU seconds the three servers used in the measured window (all their threads).
    pub server_cpu_s: f64,
    /// Of them, µs per acknowledged write.
    pub server_cpu_us_per_write: Option<f64>,
    /// CPU seconds the load generator (this process: the clients) used in the window.
    pub client_cpu_s: f64,
    /// The first error any client saw (also during the warm-up).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub first_error: Option<String>,
}

/// What the commit part measured.
#[derive(Debug, Clone, Default, Serialize)]
pub struct CommitReport {
    /// Bytes of one ring write's log payload (the proposal as JSON), also the etcd value size.
    pub payload_bytes: usize,
    /// What one write is, per system.
    pub ring_write: &'static str,
    /// What one write is for etcd.
    pub etcd_write: &'static str,
    /// `etcd --version`.
    pub etcd_version: String,
    /// The ring's timings (production defaults).
    pub ring_timing: Timing,
    /// Measured seconds per point, and warm-up.
    pub seconds: f64,
    /// Warm-up seconds per point.
    pub warmup_seconds: f64,
    /// etcd, per concurrency.
    pub etcd: Vec<Point>,
    /// The ring, per concurrency.
    pub ring: Vec<Point>,
    /// Where the `perf record` files of the leader are, when asked for.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub perf_data: Option<PathBuf>,
    /// CPU the three etcd members use with no client, in CPUs (1.0: one core busy).
    pub etcd_idle_cpus: f64,
    /// CPU the three ringd use with no client (the benchmark's control planes registered).
    pub ring_idle_cpus: f64,
}

/// The label write a ring client sends, as the leader proposes it (the actor is the admin
/// certificate's identity).
pub fn ring_proposal(client: usize, seq: u64) -> Proposal {
    Proposal {
        command: Command::SetControlPlaneLabels {
            name: control_plane_name(client),
            labels: [("seq".to_string(), format!("s{seq:09}"))].into(),
        },
        at_ms: garden_ring::time::unix_ms(),
        actor: "admin:operator".into(),
        reason: String::new(),
    }
}

/// The control plane client `i` labels.
pub fn control_plane_name(i: usize) -> String {
    format!("bench-{i:02}")
}

enum Writer {
    Etcd {
        client: EtcdClient,
        key: Vec<u8>,
        value: Vec<u8>,
    },
    Ring {
        client: Grpc<Channel>,
        name: String,
    },
}

impl Writer {
    async fn write(&mut self, seq: u64) -> Result<(), String> {
        match self {
            Writer::Etcd { client, key, value } => {
                let stamp = format!("{seq:09}");
                let n = stamp.len().min(value.len());
                value[..n].copy_from_slice(&stamp.as_bytes()[..n]);
                client
                    .put(key, value)
                    .await
                    .map(|_| ())
                    .map_err(|e| e.to_string())
            }
            Writer::Ring { client, name } => client
                .control_plane_label(pb::ControlPlaneLabelRequest {
                    name: name.clone(),
                    labels: [("seq".to_string(), format!("s{seq:09}"))].into(),
                    reason: String::new(),
                })
                .await
                .map(|_| ())
                .map_err(|s| format!("{:?}: {}", s.code(), s.message())),
        }
    }
}

/// What one segment of one system measured.
#[derive(Debug, Default)]
struct Segment {
    latencies_us: Vec<u64>,
    errors: u64,
    first_error: Option<String>,
    server_cpu_s: f64,
    client_cpu_s: f64,
}

/// Runs `writers` (one sequential loop each) for `warmup` + `measure`; what was acknowledged
/// within `measure` counts, and the CPU the `servers` used meanwhile. Returns the writers
/// (connected, for the next segment) with what was measured.
async fn drive(
    writers: Vec<Writer>,
    servers: &[u32],
    warmup: Duration,
    measure: Duration,
) -> anyhow::Result<(Vec<Writer>, Segment)> {
    let start = Instant::now() + warmup;
    let end = start + measure;
    let me = vec![std::process::id()];
    let servers = servers.to_vec();
    let cpu = tokio::spawn(async move {
        tokio::time::sleep_until(start.into()).await;
        let (servers0, me0) = (cpu_seconds(&servers), cpu_seconds(&me));
        tokio::time::sleep_until(end.into()).await;
        (cpu_seconds(&servers) - servers0, cpu_seconds(&me) - me0)
    });
    let tasks: Vec<_> = writers
        .into_iter()
        .map(|mut w| {
            tokio::spawn(async move {
                let mut latencies = Vec::new();
                let mut errors = 0u64;
                let mut first_error = None;
                let mut seq = 0u64;
                while Instant::now() < end {
                    seq += 1;
                    let began = Instant::now();
                    let result = w.write(seq).await;
                    let done = Instant::now();
                    let counted = done >= start && done <= end;
                    match result {
                        Ok(()) if counted => {
                            latencies.push(done.duration_since(began).as_micros() as u64);
                        }
                        Ok(()) => {}
                        Err(e) => {
                            errors += u64::from(counted);
                            first_error.get_or_insert(e);
                            tokio::time::sleep(Duration::from_millis(10)).await;
                        }
                    }
                }
                (w, latencies, errors, first_error)
            })
        })
        .collect();
    let mut writers = Vec::new();
    let mut segment = Segment::default();
    for task in tasks {
        let (w, latencies, errors, first_error) = task.await.context("a client task failed")?;
        writers.push(w);
        segment.latencies_us.extend(latencies);
        segment.errors += errors;
        if segment.first_error.is_none() {
            segment.first_error = first_error;
        }
    }
    (segment.server_cpu_s, segment.client_cpu_s) = cpu.await.unwrap_or_default();
    Ok((writers, segment))
}

/// The point of `clients` clients from its segments, `measured_s` seconds in all.
fn point(clients: usize, segments: Vec<Segment>, measured_s: f64) -> Point {
    let mut all = Segment::default();
    for s in segments {
        all.latencies_us.extend(s.latencies_us);
        all.errors += s.errors;
        all.first_error = all.first_error.or(s.first_error);
        all.server_cpu_s += s.server_cpu_s;
        all.client_cpu_s += s.client_cpu_s;
    }
    let summary = LatencySummary::from_micros(all.latencies_us, measured_s);
    Point {
        clients,
        server_cpu_us_per_write: (summary.count > 0)
            .then(|| all.server_cpu_s * 1e6 / summary.count as f64),
        summary,
        errors: all.errors,
        first_error: all.first_error,
        server_cpu_s: all.server_cpu_s,
        client_cpu_s: all.client_cpu_s,
    }
}

fn print_point(system: &str, p: &Point) {
    println!(
        "  {system:<5} {:>3} clients: {:>8.0} writes/s  p50 {:>7.2} ms  p99 {:>7.2} ms  ({} writes, {} errors; servers {:.0} µs CPU/write, clients {:.1} s CPU)",
        p.clients,
        p.summary.per_second,
        p.summary.p50_us as f64 / 1000.0,
        p.summary.p99_us as f64 / 1000.0,
        p.summary.count,
        p.errors,
        p.server_cpu_us_per_write.unwrap_or(0.0),
        p.client_cpu_s,
    );
}

/// The CPUs the processes `pids` use over `seconds` (1.0: one core busy all the time).
async fn idle_cpus(pids: &[u32], seconds: f64) -> f64 {
    let before = cpu_seconds(pids);
    tokio::time::sleep(Duration::from_secs_f64(seconds)).await;
    (cpu_seconds(pids) - before) / seconds
}

/// Starts `perf record --call-graph dwarf` on the ring leader `pid` for `duration`, into
/// `<dir>/perf-ring-leader-<clients>.data`.
fn record_leader(
    dir: &std::path::Path,
    scratch: &std::path::Path,
    clients: usize,
    pid: u32,
    duration: Duration,
) -> anyhow::Result<Child> {
    let file = dir.join(format!("perf-ring-leader-{clients}.data"));
    let child = Child::spawn(
        "perf record",
        std::process::Command::new("perf")
            .args(["record", "--call-graph", "dwarf,16384", "-F", "199", "-p"])
            .arg(pid.to_string())
            .arg("-o")
            .arg(&file)
            .args(["--", "sleep"])
            .arg(format!("{}", duration.as_secs_f64().ceil()))
            .env("RUST_LOG", ""),
        scratch.join("perf.log"),
    )?;
    Ok(child)
}

/// Runs the commit part.
pub async fn run(opts: &CommitOptions) -> anyhow::Result<CommitReport> {
    let warmup = Duration::from_secs_f64(opts.warmup);
    let measure = Duration::from_secs_f64(opts.seconds);
    let payload_bytes = serde_json::to_vec(&ring_proposal(0, 1))?.len();

    // Both systems up; each is measured idle while the other is idle too.
    let etcd_dir = opts.dir.join("etcd");
    std::fs::create_dir_all(&etcd_dir)?;
    let mut cluster = EtcdCluster::start(&etcd_dir, &opts.etcd).await?;
    let leader_url = cluster
        .leader()
        .await
        .context("the etcd cluster has no leader")?;
    let options = EtcdClientOptions {
        connect_timeout_ms: 2_000,
        request_timeout_ms: 10_000,
        ..EtcdClientOptions::default()
    };

    let ring_dir = opts.dir.join("ring");
    std::fs::create_dir_all(&ring_dir)?;
    let spec = RingSpec {
        timing: Timing::default(),
        dns: false,
        verify_every_server: false,
        driver: Default::default(),
        backup: Default::default(),
        metrics: false,
    };
    let mut ring = LocalRing::start(&ring_dir, &opts.bin_dir, &opts.certs, &spec)?;
    ring.wait_healthy(Duration::from_secs(60)).await?;
    let leader = crate::world::poll(
        Duration::from_secs(30),
        Duration::from_millis(100),
        "the ring agrees on a leader",
        || ring.leader(),
    )
    .await?;
    let most = opts.concurrency.iter().copied().max().unwrap_or(1);
    let admin = ring.connect(leader).await?;
    for i in 0..most {
        admin
            .clone()
            .control_plane_add(local::control_plane(&control_plane_name(i), None))
            .await
            .with_context(|| format!("registering {}", control_plane_name(i)))?;
    }
    // Every control plane placed and reported serving: the ring is quiet before measuring.
    crate::world::poll(
        Duration::from_secs(60),
        Duration::from_millis(100),
        "every benchmark control plane runs",
        || async {
            let s = ring.members[leader].status().await?;
            (s.control_planes.len() == most
                && s.control_planes.iter().all(|c| c.phase == "running"))
            .then_some(())
        },
    )
    .await?;
    let servers: Vec<u32> = ring.members.iter().filter_map(|m| m.proc.pid()).collect();
    let etcd_idle_cpus = idle_cpus(&cluster.pids(), IDLE_SECONDS).await;
    let ring_idle_cpus = idle_cpus(&servers, IDLE_SECONDS).await;

    let segment = measure / SEGMENTS;
    let settle = Duration::from_secs_f64(SETTLE_SECONDS);
    let (mut etcd, mut points) = (Vec::new(), Vec::new());
    for &clients in &opts.concurrency {
        let mut etcd_writers = Vec::new();
        let mut ring_writers = Vec::new();
        for i in 0..clients {
            etcd_writers.push(Writer::Etcd {
                client: EtcdClient::connect(&leader_url, options).await?,
                key: format!("/bench/{}", control_plane_name(i)).into_bytes(),
                value: vec![b'x'; payload_bytes],
            });
            ring_writers.push(Writer::Ring {
                client: ring.connect(leader).await?,
                name: control_plane_name(i),
            });
        }
        let (mut etcd_segments, mut ring_segments) = (Vec::new(), Vec::new());
        for n in 0..SEGMENTS {
            let lead_in = if n == 0 { warmup } else { settle };
            let (w, measured) = drive(etcd_writers, &cluster.pids(), lead_in, segment).await?;
            etcd_writers = w;
            etcd_segments.push(measured);

            let perf = match (&opts.perf, n) {
                (Some(dir), 0) => Some(record_leader(
                    dir,
                    &opts.dir,
                    clients,
                    ring.members[leader].proc.pid().context("the leader runs")?,
                    lead_in + segment,
                )?),
                _ => None,
            };
            let (w, measured) = drive(ring_writers, &servers, lead_in, segment).await?;
            ring_writers = w;
            ring_segments.push(measured);
            if let Some(mut p) = perf {
                // perf stops by itself after the sleep; let it write its file.
                p.wait_exit(Duration::from_secs(60));
            }
        }
        let measured_s = segment.as_secs_f64() * f64::from(SEGMENTS);
        let e = point(clients, etcd_segments, measured_s);
        let r = point(clients, ring_segments, measured_s);
        print_point("etcd", &e);
        print_point("ring", &r);
        etcd.push(e);
        points.push(r);
    }
    println!("  idle: etcd {etcd_idle_cpus:.3} CPUs, ring {ring_idle_cpus:.3} CPUs");
    cluster.stop();
    drop(cluster);
    let _ = std::fs::remove_dir_all(&etcd_dir);
    ring.stop();
    drop(ring);
    let _ = std::fs::remove_dir_all(&ring_dir);
    Ok(CommitReport {
        payload_bytes,
        ring_write: "ControlPlaneLabel through the Admin API (mutual TLS) to the leader: a committed Raft entry, fsynced on a majority, applied, in history",
        etcd_write: "KV Put to the leader (plain HTTP/2), value as long as the ring's payload, one key per client",
        etcd_version: local::etcd_version(&opts.etcd),
        ring_timing: Timing::default(),
        seconds: opts.seconds,
        warmup_seconds: opts.warmup,
        etcd,
        ring: points,
        perf_data: opts.perf.clone(),
        etcd_idle_cpus,
        ring_idle_cpus,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_payload_is_the_proposal_a_client_write_becomes() {
        let p = ring_proposal(7, 42);
        let Command::SetControlPlaneLabels { name, labels } = &p.command else {
            panic!("a label write");
        };
        assert_eq!(name, "bench-07");
        assert_eq!(labels["seq"], "s000000042");
        p.validate().expect("a valid command");
        // The size does not depend on the sequence number (fixed width).
        let a = serde_json::to_vec(&ring_proposal(1, 1)).unwrap().len();
        let b = serde_json::to_vec(&ring_proposal(63, 999_999))
            .unwrap()
            .len();
        assert_eq!(a, b);
    }

    #[test]
    fn segments_merge_into_one_point_over_the_whole_measured_time() {
        let segments = vec![
            Segment {
                latencies_us: vec![1_000, 3_000],
                errors: 0,
                first_error: None,
                server_cpu_s: 0.002,
                client_cpu_s: 0.1,
            },
            Segment {
                latencies_us: vec![2_000],
                errors: 2,
                first_error: Some("late".into()),
                server_cpu_s: 0.001,
                client_cpu_s: 0.1,
            },
        ];
        let p = point(16, segments, 2.0);
        assert_eq!((p.clients, p.summary.count, p.errors), (16, 3, 2));
        assert_eq!(p.summary.per_second, 1.5);
        assert_eq!(p.summary.p50_us, 2_000);
        assert_eq!(p.first_error.as_deref(), Some("late"));
        assert!((p.server_cpu_us_per_write.unwrap() - 1_000.0).abs() < 1e-6);
        assert!((p.client_cpu_s - 0.2).abs() < 1e-9);
    }
}
