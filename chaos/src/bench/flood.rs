//! `flood`: many Admin clients writing and reading as fast as they can against a 3-member ring
//! (issue 24, point 4), while the ring's own traffic must go on:
//! - no leader change (every member's Raft term is the same after as before);
//! - no member judged `suspect` or `lost` (no `member.health` event in history during the
//!   flood, and `garden_ring_member_health` never says so in the 100 ms samples);
//! - heartbeats within their interval: the followers' gaps between two messages of their
//!   leader (`garden_ring_leader_contact_gap_seconds`, counted by `ringd` itself), reported as
//!   the worst gap and how many exceeded `heartbeat_ms`;
//! - the ring's lease renewals keep working: every member's own lease (sampled every 100 ms
//!   from `/metrics`) never runs below half of `lease_ms`.
//!
//! Each client is a loop over its own connection (clients are spread over the three members,
//! so followers forward the writes): a `ControlPlaneLabel` write to one of
//! [`CONTROL_PLANES`] control planes, then a linearizable `ControlPlaneGet` of it. All
//! clients share one identity (`admin:operator`), the worst case for per-identity limits.
//! Monitoring reads `/metrics` (its own listener), not the Admin API.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use garden_ring::config::Timing;
use garden_ring::pb;
use garden_ring::raft::contact::GAP_BOUNDS_MS;
use serde::Serialize;

use super::local::{self, LocalRing, RingSpec};

/// Control planes the clients write to.
pub const CONTROL_PLANES: usize = 16;
/// How often `/metrics` is sampled during the flood.
const SAMPLE_MS: u64 = 100;

/// Settings of the flood part.
#[derive(Debug, Clone)]
pub struct FloodOptions {
    /// Concurrent clients.
    pub clients: usize,
    /// Seconds of flood.
    pub seconds: f64,
    /// The ring's timings.
    pub timing: Timing,
    /// Where `ringd` is.
    pub bin_dir: PathBuf,
    /// A scratch directory.
    pub dir: PathBuf,
    /// Certificates (see [`local::certificates`]).
    pub certs: PathBuf,
}

/// One member's view of the flood.
#[derive(Debug, Clone, Default, Serialize)]
pub struct MemberFlood {
    /// Its name.
    pub name: String,
    /// Raft term before and after.
    pub term_before: u64,
    /// Raft term after.
    pub term_after: u64,
    /// Gaps between its leader's messages during the flood (none on the leader).
    pub gaps: u64,
    /// Of those, longer than `heartbeat_ms`.
    pub gaps_over_heartbeat: u64,
    /// Upper bound of the longest gap's bucket during the flood, ms (`None`: no gap longer
    /// than the largest bound, or none at all).
    pub worst_gap_bucket_ms: Option<u64>,
    /// The longest gap since the member started (read after the flood), ms.
    pub max_gap_since_start_ms: u64,
    /// The longest gap of the flood exactly, when it is the longest since start (else it is
    /// known only by its bucket), ms.
    pub worst_gap_ms: Option<u64>,
    /// The least lease time left seen in the samples, s.
    pub min_lease_remaining_s: Option<f64>,
    /// Samples in which it judged some member suspect or lost.
    pub samples_with_unhealthy: u64,
}

/// What the flood part measured.
#[derive(Debug, Clone, Serialize)]
pub struct FloodReport {
    /// Concurrent clients.
    pub clients: usize,
    /// Seconds flooded.
    pub seconds: f64,
    /// Heartbeat interval, ms.
    pub heartbeat_ms: u64,
    /// Least election timeout, ms.
    pub election_timeout_min_ms: u64,
    /// Lease, ms.
    pub lease_ms: u64,
    /// Writes acknowledged.
    pub writes_ok: u64,
    /// Reads answered.
    pub reads_ok: u64,
    /// Failed calls by gRPC code.
    pub errors: BTreeMap<String, u64>,
    /// Writes acknowledged per second.
    pub writes_per_s: f64,
    /// Reads answered per second.
    pub reads_per_s: f64,
    /// `member.health` events committed during the flood.
    pub health_events: Vec<String>,
    /// Lease renewals the leader answered during the flood.
    pub renewals_answered: Option<u64>,
    /// Per member.
    pub members: Vec<MemberFlood>,
    /// Why the ring's own traffic did not go on ([`FloodReport::problems`]); empty when it did.
    pub failures: Vec<String>,
}

impl FloodReport {
    /// Leader changes: how far the terms moved.
    pub fn term_changes(&self) -> u64 {
        self.members
            .iter()
            .map(|m| m.term_after.saturating_sub(m.term_before))
            .max()
            .unwrap_or(0)
    }

    /// The worst gap of the flood over the members, ms: exact where the member's longest
    /// gap since start came during the flood, else an upper bound (the lesser of its bucket's
    /// bound and the longest gap since start).
    pub fn worst_gap_ms(&self) -> Option<u64> {
        self.members
            .iter()
            .filter_map(|m| {
                m.worst_gap_ms.or(m
                    .worst_gap_bucket_ms
                    .map(|bound| bound.min(m.max_gap_since_start_ms)))
            })
            .max()
    }

    /// Lease renewals the leader should answer in the flood's time: every member renews
    /// every `lease_ms / 4`.
    pub fn renewals_expected(&self) -> f64 {
        self.members.len() as f64 * self.seconds * 4_000.0 / self.lease_ms as f64
    }

    /// Why the ring's own traffic did not go on, if it did not.
    pub fn problems(&self) -> Vec<String> {
        let mut out = Vec::new();
        if self.term_changes() > 0 {
            out.push(format!("the term moved {} time(s)", self.term_changes()));
        }
        if !self.health_events.is_empty() {
            out.push(format!("health changed: {}", self.health_events.join("; ")));
        }
        for m in &self.members {
            if m.samples_with_unhealthy > 0 {
                out.push(format!(
                    "{} judged a member suspect or lost in {} sample(s)",
                    m.name, m.samples_with_unhealthy
                ));
            }
            if let Some(left) = m.min_lease_remaining_s
                && left * 1000.0 < self.lease_ms as f64 / 2.0
            {
                out.push(format!(
                    "{}'s lease ran down to {left:.2} s (lease {} ms)",
                    m.name, self.lease_ms
                ));
            }
        }
        out
    }
}

/// The samples of one `/metrics` page this part reads.
#[derive(Debug, Default)]
struct Scrape {
    term: Option<u64>,
    lease_remaining_s: Option<f64>,
    unhealthy: bool,
    gap_buckets: Vec<u64>,
    gap_max_s: Option<f64>,
    renewals: Option<u64>,
}

fn scrape(address: SocketAddr) -> Option<Scrape> {
    let (_, text) = garden_ring_tests::http_get(address, "/metrics")?;
    let mut s = Scrape::default();
    let value = |line: &str| line.rsplit(' ').next().and_then(|v| v.parse::<f64>().ok());
    for line in text.lines() {
        if line.starts_with("garden_ring_raft_term ") {
            s.term = value(line).map(|v| v as u64);
        } else if line.starts_with("garden_ring_lease_remaining_seconds ") {
            s.lease_remaining_s = value(line);
        } else if line.starts_with("garden_ring_member_health{")
            && (line.contains("health=\"suspect\"") || line.contains("health=\"lost\""))
            && value(line) == Some(1.0)
        {
            s.unhealthy = true;
        } else if line.starts_with("garden_ring_leader_contact_gap_seconds_bucket{") {
            s.gap_buckets.push(value(line).unwrap_or(0.0) as u64);
        } else if line.starts_with("garden_ring_leader_contact_gap_max_seconds ") {
            s.gap_max_s = value(line);
        } else if line.starts_with("garden_ring_lease_renewals_answered_total ") {
            s.renewals = value(line).map(|v| v as u64);
        }
    }
    Some(s)
}

/// The gaps between two scrapes' cumulative buckets: (count, over `heartbeat_ms`, worst bound).
fn gap_diff(before: &[u64], after: &[u64], heartbeat_ms: u64) -> (u64, u64, Option<u64>) {
    // Cumulative (le=...) buckets, the last +Inf; per-bucket counts are the differences.
    let per = |c: &[u64]| -> Vec<u64> {
        c.iter()
            .enumerate()
            .map(|(i, v)| v - if i == 0 { 0 } else { c[i - 1] })
            .collect()
    };
    if before.len() != after.len() || after.len() != GAP_BOUNDS_MS.len() + 1 {
        return (0, 0, None);
    }
    let (b, a) = (per(before), per(after));
    let during: Vec<u64> = a
        .iter()
        .zip(&b)
        .map(|(a, b)| a.saturating_sub(*b))
        .collect();
    let count = during.iter().sum();
    let over = during
        .iter()
        .enumerate()
        .filter(|(i, _)| {
            GAP_BOUNDS_MS
                .get(*i)
                .is_none_or(|bound| *bound > heartbeat_ms)
        })
        .map(|(_, n)| n)
        .sum();
    let worst = during
        .iter()
        .rposition(|n| *n > 0)
        .and_then(|i| GAP_BOUNDS_MS.get(i).copied());
    (count, over, worst)
}

/// Runs the flood.
pub async fn run(options: &FloodOptions) -> anyhow::Result<FloodReport> {
    if options.clients == 0 {
        bail!("a flood needs at least one client");
    }
    let spec = RingSpec {
        timing: options.timing.clone(),
        metrics: true,
        ..RingSpec::default()
    };
    let mut ring = LocalRing::start(&options.dir, &options.bin_dir, &options.certs, &spec)?;
    let result = flood(&mut ring, options).await;
    ring.stop();
    result
}

async fn flood(ring: &mut LocalRing, options: &FloodOptions) -> anyhow::Result<FloodReport> {
    ring.wait_healthy(Duration::from_secs(60)).await?;
    let leader = ring.leader().await.context("no leader")?;
    let mut admin = ring.connect(leader).await?;
    for n in 0..CONTROL_PLANES {
        admin
            .control_plane_add(local::control_plane(&format!("flood-{n:02}"), None))
            .await
            .with_context(|| format!("adding flood-{n:02}"))?;
    }
    let metrics: Vec<SocketAddr> = ring
        .members
        .iter()
        .map(|m| m.config.metrics.listen.context("metrics are on"))
        .collect::<anyhow::Result<_>>()?;
    // Every member's agent renews its lease (it waits a lease and a fence after its start
    // before the first renewal): the flood starts from a ring at work.
    let renewing = Instant::now() + Duration::from_secs(30);
    loop {
        let all = metrics.iter().all(|a| {
            scrape(*a)
                .and_then(|s| s.lease_remaining_s)
                .is_some_and(|left| left > 0.0)
        });
        if all {
            break;
        }
        if Instant::now() >= renewing {
            bail!("not every member renews its lease 30 s after the ring formed");
        }
        tokio::time::sleep(Duration::from_millis(SAMPLE_MS)).await;
    }
    let history_before = admin
        .history(pb::HistoryRequest::default())
        .await?
        .into_inner()
        .events
        .iter()
        .map(|e| e.index)
        .max()
        .unwrap_or(0);
    let before: Vec<Scrape> = metrics
        .iter()
        .map(|a| scrape(*a).context("a member's /metrics does not answer"))
        .collect::<anyhow::Result<_>>()?;

    // The clients, each on its own connection.
    let mut channels = Vec::new();
    for i in 0..options.clients {
        channels.push(ring.connect(i % ring.members.len()).await?);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let writes = Arc::new(AtomicU64::new(0));
    let reads = Arc::new(AtomicU64::new(0));
    let errors = Arc::new(std::sync::Mutex::new(BTreeMap::<String, u64>::new()));
    let started = Instant::now();
    let mut tasks = Vec::new();
    for (i, mut client) in channels.into_iter().enumerate() {
        let (stop, writes, reads, errors) =
            (stop.clone(), writes.clone(), reads.clone(), errors.clone());
        tasks.push(tokio::spawn(async move {
            let name = format!("flood-{:02}", i % CONTROL_PLANES);
            let fail = |status: tonic::Status| {
                *errors
                    .lock()
                    .unwrap_or_else(|e| e.into_inner())
                    .entry(format!("{:?}", status.code()))
                    .or_default() += 1;
            };
            let mut n = 0u64;
            while !stop.load(Ordering::Relaxed) {
                n += 1;
                let write = pb::ControlPlaneLabelRequest {
                    name: name.clone(),
                    labels: [(format!("client-{i}"), n.to_string())].into(),
                    reason: "flood".into(),
                };
                match client.control_plane_label(write).await {
                    Ok(_) => _ = writes.fetch_add(1, Ordering::Relaxed),
                    Err(status) => fail(status),
                }
                let read = pb::ControlPlaneGetRequest {
                    name: name.clone(),
                    ..Default::default()
                };
                match client.control_plane_get(read).await {
                    Ok(_) => _ = reads.fetch_add(1, Ordering::Relaxed),
                    Err(status) => fail(status),
                }
            }
        }));
    }

    // Samples until the end.
    let mut min_lease: Vec<Option<f64>> = vec![None; metrics.len()];
    let mut unhealthy = vec![0u64; metrics.len()];
    let deadline = started + Duration::from_secs_f64(options.seconds);
    while Instant::now() < deadline {
        tokio::time::sleep(Duration::from_millis(SAMPLE_MS)).await;
        for (i, address) in metrics.iter().enumerate() {
            let address = *address;
            let Ok(Some(s)) = tokio::task::spawn_blocking(move || scrape(address)).await else {
                continue;
            };
            if let Some(left) = s.lease_remaining_s {
                min_lease[i] = Some(min_lease[i].map_or(left, |m: f64| m.min(left)));
            }
            unhealthy[i] += u64::from(s.unhealthy);
        }
    }
    stop.store(true, Ordering::Relaxed);
    let elapsed = started.elapsed().as_secs_f64();
    for task in tasks {
        let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
    }

    let after: Vec<Scrape> = metrics
        .iter()
        .map(|a| scrape(*a).context("a member's /metrics does not answer after the flood"))
        .collect::<anyhow::Result<_>>()?;
    let leader_now = ring.leader().await.unwrap_or(leader);
    let mut admin = ring.connect(leader_now).await?;
    let health_events = admin
        .history(pb::HistoryRequest::default())
        .await?
        .into_inner()
        .events
        .into_iter()
        .filter(|e| e.index > history_before && e.action == "member.health")
        .map(|e| format!("{} {}", e.subject, e.detail))
        .collect();
    let heartbeat_ms = options.timing.heartbeat_ms;
    let members = ring
        .members
        .iter()
        .enumerate()
        .map(|(i, m)| {
            let (gaps, over, worst) =
                gap_diff(&before[i].gap_buckets, &after[i].gap_buckets, heartbeat_ms);
            let max_before = (before[i].gap_max_s.unwrap_or(0.0) * 1000.0) as u64;
            let max_after = (after[i].gap_max_s.unwrap_or(0.0) * 1000.0) as u64;
            MemberFlood {
                worst_gap_ms: (max_after > max_before).then_some(max_after),
                name: m.config.name.clone(),
                term_before: before[i].term.unwrap_or(0),
                term_after: after[i].term.unwrap_or(0),
                gaps,
                gaps_over_heartbeat: over,
                worst_gap_bucket_ms: worst,
                max_gap_since_start_ms: max_after,
                min_lease_remaining_s: min_lease[i],
                samples_with_unhealthy: unhealthy[i],
            }
        })
        .collect();
    let writes_ok = writes.load(Ordering::Relaxed);
    let reads_ok = reads.load(Ordering::Relaxed);
    let errors = errors.lock().unwrap_or_else(|e| e.into_inner()).clone();
    let mut report = FloodReport {
        clients: options.clients,
        seconds: elapsed,
        heartbeat_ms,
        election_timeout_min_ms: options.timing.election_timeout_min_ms,
        lease_ms: options.timing.lease_ms,
        writes_ok,
        reads_ok,
        errors,
        writes_per_s: writes_ok as f64 / elapsed,
        reads_per_s: reads_ok as f64 / elapsed,
        health_events,
        renewals_answered: match (before[leader].renewals, after[leader].renewals) {
            (Some(b), Some(a)) if leader_now == leader => Some(a.saturating_sub(b)),
            _ => None,
        },
        members,
        failures: Vec::new(),
    };
    report.failures = report.problems();
    Ok(report)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gap_differences_find_the_worst_bucket_of_the_window() {
        let n = GAP_BOUNDS_MS.len() + 1;
        let before = vec![10; n];
        let mut after = vec![10; n];
        // During the window: 5 gaps <= 50 ms, 1 gap <= 150 ms (cumulative buckets).
        for (i, bound) in GAP_BOUNDS_MS.iter().enumerate() {
            after[i] += if *bound >= 150 {
                6
            } else if *bound >= 50 {
                5
            } else {
                0
            };
        }
        after[n - 1] += 6;
        assert_eq!(gap_diff(&before, &after, 50), (6, 1, Some(150)));
        assert_eq!(gap_diff(&before, &before, 50), (0, 0, None));
        assert_eq!(gap_diff(&before, &after[1..], 50), (0, 0, None));
    }
}
