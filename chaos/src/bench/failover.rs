//! Failover time: SIGKILL of a control plane's host in a 3-member ring on loopback, measured
//! from the kill to each step the ring takes, against the configured timings.
//!
//! Each trial starts a fresh ring (loopback timings, or production ones with `--timings
//! production`; mutual TLS, the `none` driver so the
//! coordinator is measured, not a workload; every member serves the zone with the builtin
//! DNS), registers one control plane on the victim, waits until it runs there and every
//! member's DNS answers the victim's address, lets a lease renewal pass, and kills the victim.
//! Odd trials kill the leader, even ones a follower. Then, every 10 ms, both survivors are
//! asked for their status and their DNS answer:
//!
//! - **detect**: kill -> the victim judged `lost` (the leader's `member.health` event in the
//!   history, stamped when it proposed it);
//! - **elect**: kill -> a survivor names a new leader (leader trials only);
//! - **move**: kill -> a survivor has applied the move of the control plane (committed);
//! - **serving**: kill -> a survivor has applied the new host's report that it serves it;
//! - **dns**: kill -> the builtin DNS of every survivor answers the new host's address.
//!
//! The floor: the leader may judge a member lost only `member_lost_ms` after it last heard
//! from it, and `ringd` refuses a `member_lost_ms` that is not above
//! `lease_ms + fence_ms + clock_margin_ms` (the old host has certainly stopped by then). A
//! safe design cannot move the control plane sooner; what the ring adds on top is the
//! difference.

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context;
use garden_ring::config::Timing;
use garden_ring::dns::query::{Observed, observe};
use garden_ring::dns::update::RecordValue;
use garden_ring::pb;
use serde::Serialize;

use super::local::{self, LocalRing, RingSpec, ZONE};
use super::stats::DurationStats;

/// Settings of the failover part.
#[derive(Debug, Clone)]
pub struct FailoverOptions {
    /// Trials (half of them, rounded up, kill the leader).
    pub trials: u32,
    /// Where `ringd` is.
    pub bin_dir: PathBuf,
    /// A scratch directory, removed by the caller.
    pub dir: PathBuf,
    /// Certificates (see [`local::certificates`]).
    pub certs: PathBuf,
    /// The rings' timings.
    pub timing: Timing,
}

/// One trial.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Trial {
    /// 1-based.
    pub number: u32,
    /// The member killed.
    pub killed: String,
    /// Whether it led.
    pub killed_leader: bool,
    /// Where the control plane went.
    pub new_host: String,
    /// Kill -> judged lost, ms.
    pub detect_ms: Option<u64>,
    /// Kill -> a new leader, ms (leader trials).
    pub elect_ms: Option<u64>,
    /// Kill -> the move applied on a survivor, ms.
    pub move_ms: Option<u64>,
    /// Kill -> the new host's serving report applied on a survivor, ms.
    pub serving_ms: Option<u64>,
    /// Kill -> every survivor's DNS answers the new host, ms.
    pub dns_ms: Option<u64>,
    /// Why the trial is incomplete, if it is.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub failure: Option<String>,
}

/// What the failover part measured.
#[derive(Debug, Clone, Serialize)]
pub struct FailoverReport {
    /// The timings of the ring (`--timings`).
    pub timing: Timing,
    /// The floor a safe design cannot beat: `member_lost_ms`.
    pub floor_ms: u64,
    /// `lease_ms + fence_ms + clock_margin_ms`, which `member_lost_ms` must exceed.
    pub lease_fence_margin_ms: u64,
    /// How often the survivors were asked, ms (the resolution of every step but detect).
    pub poll_ms: u64,
    /// Every trial.
    pub trials: Vec<Trial>,
    /// Kill -> judged lost.
    pub detect: DurationStats,
    /// Kill -> new leader (leader trials).
    pub elect: DurationStats,
    /// Kill -> move committed.
    pub r#move: DurationStats,
    /// Kill -> serving at the new host.
    pub serving: DurationStats,
    /// Kill -> DNS answers the new host.
    pub dns: DurationStats,
    /// The steps one after the other: detect, detect -> move, move -> serving, serving -> dns
    /// (medians of the per-trial differences, ms).
    pub breakdown_p50_ms: Breakdown,
}

/// Medians of the steps between the measured points, ms.
#[derive(Debug, Clone, Default, Serialize, PartialEq, Eq)]
pub struct Breakdown {
    /// Kill -> judged lost.
    pub detect: Option<u64>,
    /// Judged lost -> move applied.
    pub detect_to_move: Option<u64>,
    /// Move applied -> serving applied.
    pub move_to_serving: Option<u64>,
    /// Serving applied -> DNS everywhere.
    pub serving_to_dns: Option<u64>,
}

const POLL: Duration = Duration::from_millis(10);

/// Runs the failover part.
pub async fn run(opts: &FailoverOptions) -> anyhow::Result<FailoverReport> {
    let timing = opts.timing.clone();
    let mut trials = Vec::new();
    for number in 1..=opts.trials {
        let dir = opts.dir.join(format!("trial-{number}"));
        std::fs::create_dir_all(&dir)?;
        let trial = match trial(number, &dir, opts, &timing).await {
            Ok(t) => t,
            Err(e) => Trial {
                number,
                failure: Some(format!("{e:#}")),
                ..Trial::default()
            },
        };
        println!(
            "  trial {number}: killed {}{}: detect {} ms, elect {} ms, move {} ms, serving {} ms, dns {} ms{}",
            trial.killed,
            if trial.killed_leader { " (leader)" } else { "" },
            show(trial.detect_ms),
            show(trial.elect_ms),
            show(trial.move_ms),
            show(trial.serving_ms),
            show(trial.dns_ms),
            trial
                .failure
                .as_ref()
                .map(|f| format!(" FAILED: {f}"))
                .unwrap_or_default()
        );
        trials.push(trial);
        let _ = std::fs::remove_dir_all(&dir);
    }
    Ok(report(timing, trials))
}

fn show(v: Option<u64>) -> String {
    v.map_or_else(|| "-".into(), |v| v.to_string())
}

/// The report of `trials` (pure).
pub fn report(timing: Timing, trials: Vec<Trial>) -> FailoverReport {
    let diff = |a: Option<u64>, b: Option<u64>| Some(b?.saturating_sub(a?));
    let median = |values: Vec<Option<u64>>| DurationStats::of(values).p50_ms;
    FailoverReport {
        floor_ms: timing.member_lost_ms,
        lease_fence_margin_ms: timing.lease_ms + timing.fence_ms + timing.clock_margin_ms,
        poll_ms: POLL.as_millis() as u64,
        detect: DurationStats::of(trials.iter().map(|t| t.detect_ms)),
        elect: DurationStats::of(trials.iter().map(|t| t.elect_ms)),
        r#move: DurationStats::of(trials.iter().map(|t| t.move_ms)),
        serving: DurationStats::of(trials.iter().map(|t| t.serving_ms)),
        dns: DurationStats::of(trials.iter().map(|t| t.dns_ms)),
        breakdown_p50_ms: Breakdown {
            detect: median(trials.iter().map(|t| t.detect_ms).collect()),
            detect_to_move: median(
                trials
                    .iter()
                    .map(|t| diff(t.detect_ms, t.move_ms))
                    .collect(),
            ),
            move_to_serving: median(
                trials
                    .iter()
                    .map(|t| diff(t.move_ms, t.serving_ms))
                    .collect(),
            ),
            serving_to_dns: median(
                trials
                    .iter()
                    .map(|t| diff(t.serving_ms, t.dns_ms))
                    .collect(),
            ),
        },
        timing,
        trials,
    }
}

/// The A records `server` answers for `name`, if it answers.
async fn answers(server: SocketAddr, name: &str) -> Vec<IpAddr> {
    let probe = RecordValue::A(std::net::Ipv4Addr::UNSPECIFIED);
    match observe(server, name, &probe, Duration::from_millis(200)).await {
        Observed::Values(values) => values
            .into_iter()
            .filter_map(|v| match v {
                RecordValue::A(ip) => Some(IpAddr::V4(ip)),
                _ => None,
            })
            .collect(),
        _ => Vec::new(),
    }
}

async fn trial(
    number: u32,
    dir: &std::path::Path,
    opts: &FailoverOptions,
    timing: &Timing,
) -> anyhow::Result<Trial> {
    let spec = RingSpec {
        timing: timing.clone(),
        dns: true,
        verify_every_server: true,
        driver: Default::default(),
        backup: Default::default(),
        metrics: false,
    };
    let mut ring = LocalRing::start(dir, &opts.bin_dir, &opts.certs, &spec)?;
    ring.wait_healthy(Duration::from_secs(60)).await?;
    let leader = crate::world::poll(
        Duration::from_secs(30),
        Duration::from_millis(50),
        "the ring agrees on a leader",
        || ring.leader(),
    )
    .await?;
    let killed_leader = !number.is_multiple_of(2);
    let victim = if killed_leader {
        leader
    } else {
        (leader + 1) % ring.members.len()
    };
    let victim_name = ring.members[victim].config.name.clone();
    let victim_id = ring.members[victim].config.id;
    let victim_ip = IpAddr::V4(local::endpoint_ip(&victim_name));
    let cp = format!("fo-{number}");
    let dns_name = format!("{cp}.{ZONE}");
    ring.members[leader]
        .client()
        .control_plane_add(local::control_plane(&cp, Some(&victim_name)))
        .await
        .context("registering the control plane")?;
    let survivors: Vec<usize> = (0..ring.members.len()).filter(|i| *i != victim).collect();
    let servers: Vec<SocketAddr> = ring.members.iter().filter_map(|m| m.dns).collect();
    crate::world::poll(
        Duration::from_secs(30),
        Duration::from_millis(50),
        "the control plane runs on the victim and every member's DNS says so",
        || async {
            let s = ring.members[leader].status().await?;
            let c = s.control_planes.iter().find(|c| c.name == cp)?;
            if c.host != victim_name || c.phase != "running" {
                return None;
            }
            for server in &servers {
                if answers(*server, &dns_name).await != vec![victim_ip] {
                    return None;
                }
            }
            Some(())
        },
    )
    .await?;
    // Steady state: at least one lease renewal after it started serving.
    tokio::time::sleep(Duration::from_millis(timing.lease_ms)).await;

    let kill_unix_ms = garden_ring::time::unix_ms();
    let killed_at = Instant::now();
    ring.members[victim].proc.kill9();
    let mut t = Trial {
        number,
        killed: victim_name.clone(),
        killed_leader,
        ..Trial::default()
    };
    let since = |at: Instant| at.duration_since(killed_at).as_millis() as u64;
    let deadline = killed_at + Duration::from_secs(30);
    let mut dns_seen = vec![false; survivors.len()];
    while Instant::now() < deadline {
        let statuses =
            futures::future::join_all(survivors.iter().map(|i| ring.members[*i].status())).await;
        let now = Instant::now();
        for s in statuses.into_iter().flatten() {
            if killed_leader && t.elect_ms.is_none() && s.leader_id != 0 && s.leader_id != victim_id
            {
                t.elect_ms = Some(since(now));
            }
            if let Some(c) = s.control_planes.iter().find(|c| c.name == cp)
                && !c.host.is_empty()
                && c.host != victim_name
            {
                t.move_ms.get_or_insert(since(now));
                t.new_host = c.host.clone();
                if c.phase == "running" {
                    t.serving_ms.get_or_insert(since(now));
                }
            }
        }
        if !t.new_host.is_empty() {
            let want = IpAddr::V4(local::endpoint_ip(&t.new_host));
            let seen = futures::future::join_all(
                survivors
                    .iter()
                    .map(|i| answers(ring.members[*i].dns.expect("dns"), &dns_name)),
            )
            .await;
            let now = Instant::now();
            for (k, ips) in seen.into_iter().enumerate() {
                if ips == vec![want] {
                    dns_seen[k] = true;
                }
            }
            if dns_seen.iter().all(|s| *s) {
                t.dns_ms = Some(since(now));
            }
        }
        let elected = !killed_leader || t.elect_ms.is_some();
        if t.dns_ms.is_some() && t.serving_ms.is_some() && elected {
            break;
        }
        tokio::time::sleep(POLL).await;
    }
    // Detection from the ring's own record (the leader's clock is this machine's).
    let ring_ref = &ring;
    let history = futures::future::join_all(survivors.iter().map(|&i| async move {
        ring_ref.members[i]
            .client()
            .history(pb::HistoryRequest {
                limit: 0,
                ..Default::default()
            })
            .await
            .ok()
            .map(tonic::Response::into_inner)
    }))
    .await;
    t.detect_ms = detect_ms(
        history.iter().flatten().flat_map(|h| h.events.iter()),
        &victim_name,
        kill_unix_ms,
    );
    let missing: Vec<&str> = [
        ("detect", t.detect_ms.is_none()),
        ("elect", killed_leader && t.elect_ms.is_none()),
        ("move", t.move_ms.is_none()),
        ("serving", t.serving_ms.is_none()),
        ("dns", t.dns_ms.is_none()),
    ]
    .into_iter()
    .filter(|(_, m)| *m)
    .map(|(w, _)| w)
    .collect();
    if !missing.is_empty() {
        t.failure = Some(format!(
            "not seen within 30 s: {} (logs were in {})",
            missing.join(", "),
            dir.display()
        ));
    }
    ring.stop();
    Ok(t)
}

/// Kill -> the first `member.health` event judging `victim` lost at or after `kill_unix_ms`.
pub fn detect_ms<'a>(
    events: impl Iterator<Item = &'a pb::Event>,
    victim: &str,
    kill_unix_ms: u64,
) -> Option<u64> {
    let prefix = format!("{victim}(");
    events
        .filter(|e| {
            e.action == "member.health"
                && e.subject.starts_with(&prefix)
                && e.detail.contains("-> lost")
                && e.at_ms >= kill_unix_ms
        })
        .map(|e| e.at_ms - kill_unix_ms)
        .min()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn event(action: &str, subject: &str, detail: &str, at_ms: u64) -> pb::Event {
        pb::Event {
            action: action.into(),
            subject: subject.into(),
            detail: detail.into(),
            at_ms,
            ..Default::default()
        }
    }

    #[test]
    fn detection_is_the_first_lost_event_of_the_victim_after_the_kill() {
        let events = [
            event("member.health", "b(2)", "healthy -> lost", 900),
            event("member.health", "b(2)", "healthy -> suspect", 1_500),
            event("member.health", "c(3)", "suspect -> lost", 2_000),
            event("member.health", "b(2)", "suspect -> lost", 3_100),
            event("member.health", "b(2)", "suspect -> lost", 3_500),
        ];
        assert_eq!(detect_ms(events.iter(), "b", 1_000), Some(2_100));
        assert_eq!(detect_ms(events.iter(), "a", 1_000), None);
    }

    #[test]
    fn the_report_takes_percentiles_and_the_breakdown() {
        let trial = |n, detect, mv, serving, dns, elect| Trial {
            number: n,
            detect_ms: Some(detect),
            move_ms: Some(mv),
            serving_ms: Some(serving),
            dns_ms: Some(dns),
            elect_ms: elect,
            ..Trial::default()
        };
        let r = report(
            Timing::loopback(),
            vec![
                trial(1, 2_000, 2_010, 2_300, 2_320, Some(400)),
                trial(2, 2_050, 2_070, 2_350, 2_400, None),
                trial(3, 2_100, 2_150, 2_500, 2_510, Some(300)),
            ],
        );
        assert_eq!(r.floor_ms, 2_000);
        assert_eq!(r.lease_fence_margin_ms, 1_700);
        assert_eq!(r.detect.p50_ms, Some(2_050));
        assert_eq!(r.detect.p99_ms, Some(2_100));
        assert_eq!(r.elect.n, 2);
        assert_eq!(r.dns.max_ms, Some(2_510));
        assert_eq!(
            r.breakdown_p50_ms,
            Breakdown {
                detect: Some(2_050),
                detect_to_move: Some(20),
                move_to_serving: Some(290),
                serving_to_dns: Some(20),
            }
        );
    }
}
