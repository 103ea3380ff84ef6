//! The HTTP endpoint with real `ringd` processes: `/metrics` counts and times a failover,
//! `/readyz` turns not-ready on a member cut off from the quorum within its lease.

use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

use garden_ring_tests::{Ports, Ring, RingOptions, add_running, cps, eventually};
use nix::sys::signal::Signal;

/// One GET; the status code and the body.
fn get(address: SocketAddr, path: &str) -> Option<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&address, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n")?.1.to_string();
    Some((status, body))
}

/// The value of the sample named exactly `series` (name and labels).
fn sample(body: &str, series: &str) -> Option<f64> {
    body.lines()
        .find_map(|l| l.strip_prefix(series)?.strip_prefix(' ')?.parse().ok())
}

fn ring_with_metrics() -> (Ring, Vec<SocketAddr>) {
    let mut ring = Ring::prepare(RingOptions::default());
    let ports = Ports::reserve(ring.procs.len());
    let addresses: Vec<SocketAddr> = ports
        .numbers()
        .iter()
        .map(|p| SocketAddr::from(([127, 0, 0, 1], *p)))
        .collect();
    ports.release();
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
        assert_eq!(get(*address, "/healthz").map(|r| r.0), Some(200));
        let (status, body) = get(*address, "/metrics").unwrap();
        assert_eq!(status, 200);
        assert!(
            body.contains("# TYPE garden_ring_raft_term gauge"),
            "{body}"
        );
        assert!(
            body.contains("garden_ring_control_plane_running{control_plane=\"m1\",host=\"a\"} 1"),
            "{body}"
        );
    }
    assert_eq!(get(metrics[0], "/nope").map(|r| r.0), Some(404));
    // Every metric the shipped alert rules use is served.
    let rules = std::fs::read_to_string(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../deploy/prometheus/alerts.yml"
    ))
    .unwrap();
    let (_, body) = get(metrics[0], "/metrics").unwrap();
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
                let (_, body) = get(*address, "/metrics")?;
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
            (get(*address, "/readyz")?.0 == 200).then_some(())
        })
        .await;
    }
    // c alone: the other two frozen, so c has no quorum and its lease runs out.
    ring.procs[0].signal(Signal::SIGSTOP);
    ring.procs[1].signal(Signal::SIGSTOP);
    let cut = Instant::now();
    let lease = Duration::from_millis(ring.procs[2].config.timing.lease_ms);
    let (status, body) = eventually(lease * 3, "c is not ready", || async {
        let r = get(metrics[2], "/readyz")?;
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
        (get(metrics[2], "/readyz")?.0 == 200).then_some(())
    })
    .await;
}
