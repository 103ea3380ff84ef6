//! The `rfc2136` DNS provider with real processes: three `ringd` whose leader sends
//! TSIG-signed updates to a real BIND 9 on loopback, and `dig` asking BIND what the world sees.
//!
//! Loopback timings: lease 1000 ms, member lost after 2000 ms; record TTL 5 s; full reconcile
//! every 1000 ms in these tests.

use std::path::Path;
use std::time::{Duration, Instant};

use garden_ring::config::{DnsProvider, DnsSettings, Rfc2136Settings};
use garden_ring_tests::bind::{Bind, tsig_keygen};
use garden_ring_tests::{Ring, RingOptions, TEST_ZONE, TestDns, add_running, cps, eventually};

const FORM: Duration = Duration::from_secs(20);

/// A ring publishing to `bind` with the key in `key_file`, workloads recorded.
fn ring_for(bind: &Bind, key_file: &Path) -> Ring {
    Ring::start_recording(RingOptions {
        dns: TestDns::Settings(DnsSettings {
            zone: Some(TEST_ZONE.into()),
            ttl_s: 5,
            provider: DnsProvider::Rfc2136,
            rfc2136: Some(Rfc2136Settings {
                server: bind.addr(),
                key_file: key_file.to_path_buf(),
            }),
            reconcile_interval_ms: 1_000,
            timeout_ms: 1_000,
            ..DnsSettings::default()
        }),
        ..RingOptions::default()
    })
}

/// The harness gives members a, b, c the endpoints 10.0.0.1, .2, .3.
fn ip(member: &str) -> String {
    format!("10.0.0.{}", member.as_bytes()[0] - b'a' + 1)
}

/// `ringctl dns list -o json` through the members in `among`.
fn dns_list(ring: &Ring, among: &[usize]) -> serde_json::Value {
    let endpoints: Vec<String> = among.iter().map(|&i| ring.procs[i].admin()).collect();
    let out = garden_ring_tests::ringctl(
        &ring.client_config,
        &endpoints,
        &["dns", "list", "--output", "json"],
    );
    assert!(out.status.success(), "{out:?}");
    serde_json::from_slice(&out.stdout).unwrap()
}

fn record<'a>(list: &'a serde_json::Value, name: &str) -> &'a serde_json::Value {
    list["records"]
        .as_array()
        .unwrap()
        .iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("no record {name} in {list}"))
}

/// Waits until `ringctl dns list` through `among` reports no problem.
async fn wait_no_problems(ring: &Ring, among: &[usize]) {
    eventually(
        Duration::from_secs(10),
        "the DNS problems clear",
        || async {
            let list = dns_list(ring, among);
            list["problems"]
                .as_array()
                .unwrap()
                .is_empty()
                .then_some(())
        },
    )
    .await;
}

/// Waits until BIND answers `name` A with exactly `want`.
async fn wait_bind(bind: &Bind, name: &str, want: &[&str], timeout: Duration) {
    eventually(
        timeout,
        &format!("BIND answers {name} A {want:?}"),
        || async { (bind.dig(name, "A") == want).then_some(()) },
    )
    .await;
}

#[tokio::test]
async fn killing_a_host_moves_its_names_on_bind() {
    let tmp = tempfile::tempdir().unwrap();
    let bind = Bind::start(&tmp.path().join("bind"), TEST_ZONE, Some("ring-key"));
    let mut ring = ring_for(&bind, bind.key_file().unwrap());
    let leader = ring.wait_leader(&[0, 1, 2], &[], FORM).await;
    let victim = (0..3).find(|&i| ring.procs[i].config.id != leader).unwrap();
    let victim_name = ring.procs[victim].config.name.clone();
    add_running(
        &ring,
        &[
            ("d", None, Some(&victim_name)),
            ("e", None, Some(&victim_name)),
        ],
    )
    .await;
    for name in ["d.ring.test", "e.ring.test"] {
        wait_bind(&bind, name, &[&ip(&victim_name)], Duration::from_secs(10)).await;
    }
    let member_record = format!("{victim_name}.members.ring.test");
    assert_eq!(bind.dig(&member_record, "A"), ["127.0.0.1"]);

    ring.procs[victim].kill9();
    let killed = Instant::now();
    let survivors: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
    // The names never point at the lost host again once they changed, and end at a survivor.
    let mut moved_ms = std::collections::BTreeMap::new();
    while moved_ms.len() < 2 {
        assert!(
            killed.elapsed() < Duration::from_secs(20),
            "the names did not move: {moved_ms:?}\n{}\n{}",
            ring.logs(),
            bind.log()
        );
        for name in ["d.ring.test", "e.ring.test"] {
            let answer = bind.dig(name, "A");
            if moved_ms.contains_key(name) {
                assert_ne!(
                    answer,
                    [ip(&victim_name)],
                    "{name} went back to the lost host"
                );
            } else if !answer.is_empty() && answer != [ip(&victim_name)] {
                moved_ms.insert(name, killed.elapsed().as_millis());
            }
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
    // The answer is the host the ring committed.
    let now = cps(&ring, &survivors).await;
    for name in ["d", "e"] {
        assert_eq!(
            bind.dig(&format!("{name}.ring.test"), "A"),
            [ip(&now[name].host)]
        );
    }
    assert!(
        bind.dig(&member_record, "A").is_empty(),
        "the lost member's admin record is withdrawn"
    );
    let list = dns_list(&ring, &survivors);
    assert_eq!(list["provider"], "rfc2136");
    assert_eq!(list["from_leader"], true);
    let d = record(&list, "d.ring.test");
    assert_eq!(d["visible"], true, "{d}");
    println!(
        "kill -9 host -> BIND answers the new host: {moved_ms:?} ms; commit -> visible on BIND \
         (leader's measure) d: {} ms, last change {}: {} ms",
        d["visible_after_ms"], list["last_change"], list["last_change_ms"]
    );
}

#[tokio::test]
async fn a_dns_server_down_during_failover_gets_the_record_when_back_and_drift_is_repaired() {
    let tmp = tempfile::tempdir().unwrap();
    let mut bind = Bind::start(&tmp.path().join("bind"), TEST_ZONE, Some("ring-key"));
    let mut ring = ring_for(&bind, bind.key_file().unwrap());
    let leader = ring.wait_leader(&[0, 1, 2], &[], FORM).await;
    let victim = (0..3).find(|&i| ring.procs[i].config.id != leader).unwrap();
    let victim_name = ring.procs[victim].config.name.clone();
    add_running(&ring, &[("d", None, Some(&victim_name))]).await;
    wait_bind(
        &bind,
        "d.ring.test",
        &[&ip(&victim_name)],
        Duration::from_secs(10),
    )
    .await;

    bind.stop();
    ring.procs[victim].kill9();
    let survivors: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
    let before = cps(&ring, &survivors).await["d"].epoch;
    let new_host = eventually(Duration::from_secs(20), "d runs on a survivor", || async {
        let d = cps(&ring, &survivors).await.remove("d")?;
        (d.phase == "running" && d.epoch > before).then_some(d.host)
    })
    .await;
    // Status: pending, and the problem names the server.
    let server = bind.addr().to_string();
    let list = eventually(
        Duration::from_secs(15),
        "dns list shows d pending and the publishing problem",
        || async {
            let list = dns_list(&ring, &survivors);
            let d = record(&list, "d.ring.test");
            let problems = list["problems"].to_string();
            (d["visible"] == false
                && d["value"] == ip(&new_host)
                && problems.contains("publishing")
                && problems.contains(&server))
            .then_some(list)
        },
    )
    .await;
    println!("while BIND is down: {}", list["problems"]);
    let text = garden_ring_tests::ringctl(
        &ring.client_config,
        &[ring.procs[survivors[0]].admin()],
        &["dns", "list"],
    );
    let text = String::from_utf8_lossy(&text.stdout).to_string();
    assert!(text.contains("PENDING"), "{text}");
    assert!(text.contains("DNS PROBLEM: publishing"), "{text}");

    bind.restart();
    let back = Instant::now();
    wait_bind(
        &bind,
        "d.ring.test",
        &[&ip(&new_host)],
        Duration::from_secs(20),
    )
    .await;
    let converged_ms = back.elapsed().as_millis();
    wait_no_problems(&ring, &survivors).await;

    // The server loses every update (journal gone): the next full reconcile puts them back.
    // (It may do so before this test's first dig, so the proof is the leader noticing.)
    let repairs_before = ring.logs().matches("lost a record it had accepted").count();
    bind.restart_without_journal();
    let lost = Instant::now();
    wait_bind(
        &bind,
        "d.ring.test",
        &[&ip(&new_host)],
        Duration::from_secs(10),
    )
    .await;
    eventually(
        Duration::from_secs(5),
        "the leader logs the repair",
        || async {
            (ring.logs().matches("lost a record it had accepted").count() > repairs_before)
                .then_some(())
        },
    )
    .await;
    println!(
        "BIND back -> record converged in {converged_ms} ms; BIND restarted without its \
         journal -> repaired in {} ms",
        lost.elapsed().as_millis()
    );
}

#[tokio::test]
async fn a_wrong_tsig_key_is_a_clear_error_and_fixing_the_file_is_enough() {
    let tmp = tempfile::tempdir().unwrap();
    let bind = Bind::start(&tmp.path().join("bind"), TEST_ZONE, Some("ring-key"));
    // The right key name with another secret.
    let wrong = tsig_keygen(&tmp.path().join("wrong"), "ring-key");
    let key_file = tmp.path().join("ring.key");
    std::fs::copy(&wrong, &key_file).unwrap();
    let mut ring = ring_for(&bind, &key_file);
    let leader = ring.wait_leader(&[0, 1, 2], &[], FORM).await;
    add_running(&ring, &[("d", None, Some("a"))]).await;
    let server = bind.addr().to_string();
    let list = eventually(
        Duration::from_secs(15),
        "the TSIG problem in dns list",
        || async {
            let list = dns_list(&ring, &[0, 1, 2]);
            let problems = list["problems"].to_string();
            (problems.contains(&server)
                && problems.contains("ring-key")
                && problems.contains("BADSIG"))
            .then_some(list)
        },
    )
    .await;
    println!("wrong key: {}", list["problems"]);
    assert!(bind.dig("d.ring.test", "A").is_empty());
    let leader_log = ring.procs[ring.index_of(leader)].log();
    assert!(
        leader_log.contains("BADSIG") && leader_log.contains(&server),
        "the leader logs the TSIG failure with the server:\n{leader_log}"
    );
    for p in &mut ring.procs {
        assert!(p.is_running(), "a wrong key crashes nothing");
    }
    // The operator puts the right key in place: no restart needed.
    std::fs::copy(bind.key_file().unwrap(), &key_file).unwrap();
    wait_bind(&bind, "d.ring.test", &[&ip("a")], Duration::from_secs(20)).await;
    let status = ring.ringctl(&["status"]);
    let status = String::from_utf8_lossy(&status.stdout).to_string();
    assert!(status.contains("provider rfc2136"), "{status}");
    wait_no_problems(&ring, &[0, 1, 2]).await;
}
