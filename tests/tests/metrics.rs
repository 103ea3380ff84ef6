//! The HTTP endpoint with real `ringd` processes: `/metrics` counts and times a failover,
//! `/readyz` turns not-ready on a member cut off from the quorum within its lease, the leader
//! times DNS propagation as `ringctl dns list` does, and the etcd driver's host reports its
//! snapshots' age for the control planes it hosts, and only for those.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use garden_ring::pb;
use garden_ring_tests::{
    Ports, Ring, RingOptions, TestDns, add_control_plane, add_running, cps, eventually, http_get,
};
use nix::sys::signal::Signal;

/// The value of the sample named exactly `series` (name and labels).
fn sample(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn ring_with_metrics() -> (Ring, Vec<SocketAddr>) {
    ring_with_metrics_and(RingOptions::default())
}

fn ring_with_metrics_and(options: RingOptions) -> (Ring, Vec<SocketAddr>) {
    let mut ring = Ring::prepare(options);
    let addresses = ring.free_addresses(ring.procs.len());
    for (p, address) in ring.procs.iter_mut().zip(&addresses) {
        p.config.metrics.listen = Some(*address);
        p.spawn();
    }
    (ring, addresses)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_count_and_time_a_failover() {
    let (mut ring, metrics) = ring_with_metrics();
    add_running(&ring, &[("m1", None, Some("a"))]).await;
    for address in &metrics {
        assert_eq!(http_get(*address, "/healthz").map(|r| r.0), Some(200));
        let (status, body) = http_get(*address, "/metrics").unwrap();
        assert_eq!(status, 200);
        assert!(
            body.contains("# TYPE garden_ring_raft_term gauge"),
            "{body}"
        );
        assert!(
            body.contains("garden_ring_control_plane_running{control_plane=\"m1\",host=\"a\"} 1"),
            "{body}"
        );
        // Declared even while empty: no DNS served here, no etcd driver.
        for family in [
            "garden_ring_dns_propagation_seconds histogram",
            "garden_ring_snapshot_age_seconds gauge",
            "garden_ring_backup_revision gauge",
            "garden_ring_backup_deltas_since_full gauge",
            "garden_ring_backup_delta_age_seconds gauge",
            "garden_ring_backup_delta_period_seconds gauge",
            "garden_ring_raft_committed_index gauge",
        ] {
            assert!(body.contains(&format!("# TYPE {family}")), "{body}");
        }
        let committed = sample(&body, "garden_ring_raft_committed_index").unwrap();
        let applied = sample(&body, "garden_ring_raft_applied_index").unwrap();
        assert!(committed >= 1.0, "{body}");
        assert!(
            committed + 5.0 >= applied,
            "committed {committed}, applied {applied}"
        );
    }
    assert_eq!(http_get(metrics[0], "/nope").map(|r| r.0), Some(404));
    // Every metric the shipped alert rules use is served.
    let rules = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/prometheus/alerts.yml"
    ))
    .unwrap();
    let (_, body) = http_get(metrics[0], "/metrics").unwrap();
    let mut used = 0;
    for name in rules
        .split(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
        .filter(|w| w.starts_with("garden_ring_"))
    {
        used += 1;
        let family = ["_bucket", "_sum", "_count"]
            .iter()
            .find_map(|suffix| name.strip_suffix(suffix))
            .unwrap_or(name);
        assert!(
            body.contains(&format!("# TYPE {family} ")),
            "alerts.yml uses {name}, which /metrics does not declare"
        );
    }
    assert!(used >= 7, "{used} metric names found in alerts.yml");

    let killed = Instant::now();
    ring.procs[0].kill9();
    eventually(Duration::from_secs(20), "m1 runs elsewhere", || async {
        let cp = cps(&ring, &[1, 2]).await.remove("m1")?;
        (cp.phase == "running" && cp.host != "a").then_some(())
    })
    .await;
    let took = killed.elapsed();
    // Every surviving member applied the move and timed the migration.
    for address in &metrics[1..] {
        let body = eventually(
            Duration::from_secs(5),
            "the failover is counted",
            || async {
                let (_, body) = http_get(*address, "/metrics")?;
                (sample(&body, "garden_ring_moves_total{kind=\"failover\"}")? >= 1.0)
                    .then_some(body)
            },
        )
        .await;
        let count = sample(&body, "garden_ring_migration_duration_seconds_count").unwrap();
        let sum = sample(&body, "garden_ring_migration_duration_seconds_sum").unwrap();
        assert_eq!(count, 1.0, "{body}");
        assert!(
            sum > 0.0 && sum < took.as_secs_f64(),
            "sum {sum}, took {took:?}"
        );
        assert_eq!(
            sample(
                &body,
                "garden_ring_member_health{member=\"a\",zone=\"zone-a\",health=\"lost\"}"
            ),
            Some(1.0),
            "{body}"
        );
        println!("failover counted; migration {sum} s (kill to running {took:?})");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn readyz_turns_not_ready_when_cut_off_from_the_quorum() {
    let (ring, metrics) = ring_with_metrics();
    add_running(&ring, &[]).await;
    for address in &metrics {
        eventually(Duration::from_secs(10), "ready", || async {
            (http_get(*address, "/readyz")?.0 == 200).then_some(())
        })
        .await;
    }
    // c alone: the other two frozen, so c has no quorum and its lease runs out.
    ring.procs[0].signal(Signal::SIGSTOP);
    ring.procs[1].signal(Signal::SIGSTOP);
    let cut = Instant::now();
    let lease = Duration::from_millis(ring.procs[2].config.timing.lease_ms);
    let (status, body) = eventually(lease * 3, "c is not ready", || async {
        let r = http_get(metrics[2], "/readyz")?;
        (r.0 == 503).then_some(r)
    })
    .await;
    let after = cut.elapsed();
    ring.procs[0].signal(Signal::SIGCONT);
    ring.procs[1].signal(Signal::SIGCONT);
    assert_eq!(status, 503);
    assert!(body.contains("not ready"), "{body}");
    assert!(
        after <= lease + Duration::from_millis(500),
        "not ready after {after:?}"
    );
    println!("cut off c not ready after {after:?} (lease {lease:?})");
    // And ready again once the quorum is back.
    eventually(Duration::from_secs(10), "c is ready again", || async {
        (http_get(metrics[2], "/readyz")?.0 == 200).then_some(())
    })
    .await;
}

/// The ring's DNS records as the leader reports them (`ringctl dns list`).
async fn dns_list(ring: &Ring) -> Option<pb::DnsListResponse> {
    ring.client()
        .call(pb::DnsListRequest {}, |mut c, r| async move {
            c.dns_list(r).await
        })
        .await
        .ok()
        .filter(|l| l.from_leader)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_times_dns_propagation_as_dns_list_shows_it() {
    let (ring, metrics) = ring_with_metrics_and(RingOptions {
        dns: TestDns::Builtin,
        ..RingOptions::default()
    });
    add_running(&ring, &[]).await;
    // Settled: every record the ring wants is visible on every member's server.
    eventually(
        Duration::from_secs(20),
        "every DNS record is visible",
        || async {
            let list = dns_list(&ring).await?;
            (!list.records.is_empty() && list.records.iter().all(|r| r.visible)).then_some(())
        },
    )
    .await;
    let leader = ring
        .wait_leader(&[0, 1, 2], &[], Duration::from_secs(10))
        .await;
    let leader = ring.index_of(leader);
    let read = |i: usize| {
        let (_, body) = http_get(metrics[i], "/metrics").unwrap();
        let count = sample(&body, "garden_ring_dns_propagation_seconds_count").unwrap();
        let sum = sample(&body, "garden_ring_dns_propagation_seconds_sum").unwrap();
        (count, sum, body)
    };
    let (count0, sum0, _) = read(leader);

    // A new control plane's record, from the moment the leader sees it to every server.
    add_control_plane(
        &ring.client(),
        garden_ring_tests::control_plane("d1", Some("a")),
    )
    .await
    .unwrap();
    let record = eventually(
        Duration::from_secs(20),
        "d1's record is visible",
        || async {
            let list = dns_list(&ring).await?;
            list.records
                .into_iter()
                .find(|r| r.name.starts_with("d1.") && r.r#type == "A" && r.visible)
        },
    )
    .await;
    let (count1, sum1, body) =
        eventually(Duration::from_secs(5), "the leader counts it", || async {
            let r = read(leader);
            (r.0 > count0).then_some(r)
        })
        .await;
    let took_s = record.visible_after_ms as f64 / 1000.0;
    println!(
        "d1 visible after {took_s} s (dns list); histogram count {count0} -> {count1}, sum {sum0} -> {sum1}"
    );
    if count1 == count0 + 1.0 {
        // Nothing else changed meanwhile: the one observation is d1's, as dns list shows it.
        assert!(
            (sum1 - sum0 - took_s).abs() < 0.002,
            "observed {} s, dns list says {took_s} s",
            sum1 - sum0
        );
    } else {
        assert!(
            sum1 - sum0 + 0.0005 >= took_s,
            "the histogram's new observations ({} s) do not include d1's {took_s} s",
            sum1 - sum0
        );
    }
    assert!(took_s < 10.0, "{took_s} s");
    let le = |bound: &str| {
        sample(
            &body,
            &format!("garden_ring_dns_propagation_seconds_bucket{{le=\"{bound}\"}}"),
        )
        .unwrap()
    };
    assert_eq!(le("+Inf"), count1, "{body}");
    assert!(le("0.05") <= le("60"), "{body}");
    // Followers time nothing: the keeper acts on the leader only.
    for i in (0..3).filter(|i| *i != leader) {
        assert_eq!(read(i).0, 0.0, "member {i} is not the leader");
    }
}

/// A ring with metrics whose members run etcd, snapshotting every `snapshot_interval_ms`.
fn etcd_ring_with_metrics(snapshot_interval_ms: u64) -> (Ring, Vec<SocketAddr>) {
    ring_with_metrics_and(RingOptions {
        driver: garden_ring_tests::etcd::driver(snapshot_interval_ms),
        ..RingOptions::default()
    })
}

fn snapshot_age(body: &str, name: &str) -> Option<f64> {
    sample(
        body,
        &format!("garden_ring_snapshot_age_seconds{{control_plane=\"{name}\"}}"),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_host_reports_its_snapshots_age_and_stops_when_the_control_plane_leaves() {
    let interval = Duration::from_millis(1_000);
    let (ring, metrics) = etcd_ring_with_metrics(interval.as_millis() as u64);
    garden_ring_tests::wait_all_healthy(&ring).await;
    let backups = ring.dir.path().join("backups");
    let ports = Ports::reserve(3);
    let mut request = garden_ring_tests::control_plane("e1", None);
    request.endpoints = ["a", "b", "c"]
        .iter()
        .zip(ports.numbers())
        .map(|(m, port)| (m.to_string(), format!("127.0.0.1:{port}")))
        .collect();
    ports.release();
    // A bucket per member, as Gardener gives every seed one.
    request.backups = ["a", "b", "c"]
        .iter()
        .map(|m| {
            let path = backups.join(m).join("e1");
            std::fs::create_dir_all(&path).unwrap();
            (m.to_string(), format!("file://{}", path.display()))
        })
        .collect();
    request.backup = request.backups["a"].clone();
    request.host = "a".into();
    add_control_plane(&ring.client(), request).await.unwrap();

    // a hosts e1: it reports the age of e1's newest snapshot, which stays under the interval
    // (plus the time a snapshot takes); b and c report none.
    // A new snapshot shows as the age going down from one reading to the next.
    let mut ages = Vec::new();
    let mut previous: Option<f64> = None;
    eventually(
        Duration::from_secs(30),
        "a took three snapshots of e1",
        || {
            let age =
                http_get(metrics[0], "/metrics").and_then(|(_, body)| snapshot_age(&body, "e1"));
            if let Some(age) = age {
                if previous.is_some_and(|p| age < p) {
                    ages.push(age);
                }
                previous = Some(age);
            }
            let done = ages.len() >= 3;
            async move { done.then_some(()) }
        },
    )
    .await;
    println!("e1's snapshot age at a, each just after a new snapshot: {ages:?} s");
    let (_, body) = http_get(metrics[0], "/metrics").unwrap();
    let age = snapshot_age(&body, "e1").unwrap();
    assert!(
        age < interval.as_secs_f64() + 3.0,
        "snapshot age {age} s with a {interval:?} interval"
    );
    for i in [1, 2] {
        let (_, body) = http_get(metrics[i], "/metrics").unwrap();
        assert_eq!(snapshot_age(&body, "e1"), None, "member {i}: {body}");
    }

    // Switched over to b: a forgets it once its etcd stopped, b reports it.
    let out = ring.ringctl(&["switchover", "e1", "--to", "b", "--reason", "test"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eventually(
        Duration::from_secs(30),
        "b reports e1 and a no longer",
        || async {
            let (_, at_a) = http_get(metrics[0], "/metrics")?;
            let (_, at_b) = http_get(metrics[1], "/metrics")?;
            (snapshot_age(&at_a, "e1").is_none() && snapshot_age(&at_b, "e1").is_some())
                .then_some(())
        },
    )
    .await;
}

/// Issue 22 (the lease path reacts to events): renewing at once after a start or a stop adds
/// no load at rest. Over 3 s of a ring at rest with a control plane running, the members'
/// renewals the leader answers stay at what the renewal interval gives (3 members, one every
/// `lease_ms / 4`): at most 1.5 times that.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_leader_answers_no_more_renewals_at_rest_than_the_interval_gives() {
    let (ring, metrics) = ring_with_metrics();
    add_running(&ring, &[("r1", None, Some("b"))]).await;
    let renewals = || -> f64 {
        metrics
            .iter()
            .filter_map(|m| http_get(*m, "/metrics"))
            .filter_map(|(_, body)| sample(&body, "garden_ring_lease_renewals_answered_total"))
            .sum()
    };
    // Settle: the start's extra renewals are over.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let (before, started) = (renewals(), Instant::now());
    tokio::time::sleep(Duration::from_secs(3)).await;
    let per_s = (renewals() - before) / started.elapsed().as_secs_f64();
    let timing = garden_ring::config::Timing::loopback();
    let interval_per_s = 3.0 * 1000.0 / timing.renew_interval_ms() as f64;
    println!("renewals at rest: {per_s:.1}/s (the interval gives {interval_per_s:.1}/s)");
    assert!(
        per_s >= 0.5 * interval_per_s && per_s <= 1.5 * interval_per_s,
        "{per_s:.1} renewals/s at rest; the interval gives {interval_per_s:.1}/s"
    );
}
