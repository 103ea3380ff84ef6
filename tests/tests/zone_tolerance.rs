//! Zone-tolerant control planes with real processes: three `ringd` on loopback in three zones,
//! each running one etcd member (Debian's `etcd-server`) of the control plane, peers over TLS
//! with the members' own certificates. A lost zone loses no acknowledged write and the host
//! moves to a surviving member without a restore; a switchover moves only the host.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use garden_ring::backup::etcd::{EtcdClient, EtcdMember};
use garden_ring::config::BackupSettings;
use garden_ring::pb;
use garden_ring_tests::etcd::{driver_with_deltas, fast};
use garden_ring_tests::{
    Ports, Ring, RingOptions, add_control_plane, cps, eventually, http_get, wait_all_healthy,
};
use tokio::sync::watch;

const MEMBERS: [&str; 3] = ["a", "b", "c"];

/// A ring of a, b, c (zones zone-a..c) whose members run etcd, deltas every 300 ms.
fn etcd_ring() -> Ring {
    let mut ring = Ring::prepare(RingOptions {
        driver: driver_with_deltas(3_600_000, 300),
        ..RingOptions::default()
    });
    for p in &mut ring.procs {
        p.config.backup = BackupSettings::default();
        p.spawn();
    }
    ring
}

/// A zone-tolerant control plane: an endpoint and an etcd peer address on every member, a
/// `file://` backup location per member.
fn zone_tolerant(ring: &Ring, name: &str, host: &str) -> pb::ControlPlaneAddRequest {
    let ports = Ports::reserve(2 * MEMBERS.len());
    let numbers = ports.numbers();
    ports.release();
    let at = |offset: usize| -> BTreeMap<String, String> {
        MEMBERS
            .iter()
            .enumerate()
            .map(|(i, m)| (m.to_string(), format!("127.0.0.1:{}", numbers[offset + i])))
            .collect()
    };
    let backups: BTreeMap<String, String> = MEMBERS
        .iter()
        .map(|m| {
            let path = ring.dir.path().join("backups").join(m).join(name);
            std::fs::create_dir_all(&path).unwrap();
            (m.to_string(), format!("file://{}", path.display()))
        })
        .collect();
    pb::ControlPlaneAddRequest {
        name: name.into(),
        home: String::new(),
        dns_name: format!("{name}.{}", garden_ring_tests::TEST_ZONE),
        endpoints: at(0),
        backup: backups["a"].clone(),
        backups,
        host: host.into(),
        reason: "test".into(),
        prefer: Vec::new(),
        tolerance: "zone".into(),
        etcd_peers: at(MEMBERS.len()),
    }
}

async fn running(ring: &Ring, among: &[usize], name: &str, on: &[&str]) -> pb::ControlPlane {
    eventually(
        Duration::from_secs(30),
        &format!("{name} runs on one of {on:?}"),
        || async {
            let cp = cps(ring, among).await.remove(name)?;
            (cp.phase == "running" && on.contains(&cp.host.as_str())).then_some(cp)
        },
    )
    .await
}

/// A client of the control plane's etcd at `host`'s endpoint, connecting for up to 10 s: on a
/// loaded machine a host may miss a renewal, close its gate and open it again a moment later.
async fn etcd_at(cp: &pb::ControlPlane, host: &str) -> EtcdClient {
    let endpoint = format!("http://{}", cp.endpoints[host]);
    eventually(
        Duration::from_secs(10),
        &format!("{} answers at {endpoint}", cp.name),
        || async { EtcdClient::connect(&endpoint, fast()).await.ok() },
    )
    .await
}

async fn keys_at(cp: &pb::ControlPlane, host: &str) -> BTreeSet<String> {
    etcd_at(cp, host)
        .await
        .get_prefix(b"/registry/")
        .await
        .unwrap()
        .into_iter()
        .map(|kv| String::from_utf8(kv.key).unwrap())
        .collect()
}

/// Puts `key` at the control plane's host, retrying (a new connection each time) for up to
/// 10 s: on a loaded machine a host may miss a renewal and close its gate for a moment.
async fn put_retrying(cp: &pb::ControlPlane, key: &str) {
    eventually(Duration::from_secs(10), &format!("put {key}"), || async {
        etcd_at(cp, &cp.host)
            .await
            .put(key.as_bytes(), b"v")
            .await
            .ok()
    })
    .await;
}

/// Registers zone-tolerant control plane `name` hosted on a, with an endpoint and an etcd peer
/// address on fresh loopback ports on each of `members`.
async fn add_zone_tolerant_on(ring: &Ring, name: &str, members: &[&str]) {
    let ports = Ports::reserve(members.len() * 2);
    let numbers = ports.numbers();
    ports.release();
    let at = |offset: usize| -> BTreeMap<String, String> {
        members
            .iter()
            .enumerate()
            .map(|(i, m)| (m.to_string(), format!("127.0.0.1:{}", numbers[offset + i])))
            .collect()
    };
    let mut req = zone_tolerant(ring, name, "a");
    req.endpoints = at(0);
    req.etcd_peers = at(members.len());
    add_control_plane(&ring.client(), req).await.unwrap();
}

/// Writes `/registry/<prefix>000` to `<prefix>049` at the host of `cp`; returns the keys.
async fn write_keys(cp: &pb::ControlPlane, prefix: &str) -> Vec<String> {
    let mut written = Vec::new();
    for i in 0..50 {
        let key = format!("/registry/{prefix}{i:03}");
        put_retrying(cp, &key).await;
        written.push(key);
    }
    written
}

/// Kills b and c, two of the three zones of `name`'s etcd cluster, and waits until the ring
/// (asked among `survivors`) shows it `no-quorum`.
async fn lose_b_and_c(ring: &Ring, survivors: &[usize], name: &str) {
    ring_kill(ring, 1);
    ring_kill(ring, 2);
    eventually(
        Duration::from_secs(30),
        &format!("{name} shows no-quorum"),
        || async {
            let cp = cps(ring, survivors).await.remove(name)?;
            (cp.etcd?.health == "no-quorum").then_some(())
        },
    )
    .await;
}

/// Waits (at most 90 s) until `name`'s etcd cluster is a, d and e, whole, and it runs at a;
/// then until it takes a write there, and checks that it kept every key of `written`.
async fn whole_again_on_a_d_e(
    ring: &Ring,
    survivors: &[usize],
    name: &str,
    written: &[String],
) -> pb::ControlPlane {
    let whole = eventually(
        Duration::from_secs(90),
        &format!("{name}'s etcd cluster is a, d, e and whole"),
        || async {
            let cp = cps(ring, survivors).await.remove(name)?;
            let etcd = cp.etcd.as_ref()?;
            let mut names: Vec<&str> = etcd.members.iter().map(|m| m.member.as_str()).collect();
            names.sort_unstable();
            (names == ["a", "d", "e"]
                && etcd.change.is_empty()
                && etcd.health == "whole"
                && cp.phase == "running")
                .then_some(cp)
        },
    )
    .await;
    let etcd = etcd_at(&whole, "a").await;
    eventually(
        Duration::from_secs(10),
        "a write is acknowledged",
        || async { etcd.put(b"/registry/after", b"v").await.ok() },
    )
    .await;
    let got = keys_at(&whole, "a").await;
    let lost: Vec<_> = written.iter().filter(|k| !got.contains(*k)).collect();
    assert!(lost.is_empty(), "lost in the recovery of {name}: {lost:?}");
    whole
}

/// What a writer saw: the keys acknowledged, and the longest stretch without an
/// acknowledgement while it wrote (the endpoint's outage as a client lives it).
struct Written {
    acked: Vec<String>,
    longest_gap: Duration,
}

/// Writes `/registry/<prefix><i>` to the control plane's current host (asking the ring where
/// that is whenever a write fails) until `stop` is set.
async fn write_following_the_host(
    ring: &Ring,
    name: &str,
    prefix: &str,
    stop: watch::Receiver<bool>,
) -> Written {
    let mut acked = Vec::new();
    let mut longest_gap = Duration::ZERO;
    let mut last_ack = Instant::now();
    let mut etcd: Option<EtcdClient> = None;
    let mut i = 0;
    while !*stop.borrow() {
        let Some(client) = etcd.as_ref() else {
            let cp = cps(ring, &[0, 1, 2]).await.remove(name).unwrap();
            if cp.phase == "running" {
                etcd = EtcdClient::connect(&format!("http://{}", cp.endpoints[&cp.host]), fast())
                    .await
                    .ok();
            }
            if etcd.is_none() {
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
            continue;
        };
        let key = format!("/registry/{prefix}{i:06}");
        match client.put(key.as_bytes(), b"v").await {
            Ok(_) => {
                longest_gap = longest_gap.max(last_ack.elapsed());
                last_ack = Instant::now();
                acked.push(key);
                i += 1;
            }
            // Unacknowledged: maybe stored, maybe not; the next write uses a new key.
            Err(_) => {
                etcd = None;
                i += 1;
            }
        }
    }
    Written { acked, longest_gap }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lost_zone_loses_no_acknowledged_write_and_only_the_host_moves() {
    let ring = etcd_ring();
    wait_all_healthy(&ring).await;
    add_control_plane(&ring.client(), zone_tolerant(&ring, "zt1", "a"))
        .await
        .unwrap();
    let cp = running(&ring, &[0, 1, 2], "zt1", &["a"]).await;
    let etcd = cp.etcd.clone().expect("an etcd cluster");
    assert_eq!(cp.tolerance, "zone");
    assert_eq!(
        etcd.members
            .iter()
            .map(|m| m.member.as_str())
            .collect::<Vec<_>>(),
        ["a", "b", "c"]
    );
    assert_eq!(etcd.health, "whole");
    // The etcd members speak TLS to each other, with the members' own certificates.
    assert!(
        ring.logs().contains("(peers a=https://127.0.0.1:"),
        "no etcd member started with https peers"
    );

    // Writes through the host's endpoint, then the host's zone dies under them.
    let (stop_tx, stop) = watch::channel(false);
    let writer = {
        let ring = &ring;
        async move { write_following_the_host(ring, "zt1", "k", stop).await }
    };
    let chaos = async {
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        let killed_at = Instant::now();
        ring_kill(&ring, 0);
        let moved = running(&ring, &[1, 2], "zt1", &["b", "c"]).await;
        let rto = killed_at.elapsed();
        // A few more writes at the new host.
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop_tx.send_replace(true);
        (moved, rto)
    };
    let (written, (moved, rto)) = tokio::join!(writer, chaos);
    assert!(
        written.acked.len() > 20,
        "{} writes acknowledged",
        written.acked.len()
    );

    // No copy, no restore: the etcd cluster kept the data.
    let migration = moved.migration.clone().unwrap();
    assert_eq!(migration.from, "a");
    assert!(migration.restored.is_empty(), "{migration:?}");
    assert_eq!(migration.data_loss_window_ms, Some(0), "{migration:?}");
    assert!(
        migration.note.contains("no copy, no restore"),
        "{migration:?}"
    );
    let etcd = moved.etcd.clone().unwrap();
    assert_eq!(
        (etcd.health.as_str(), etcd.down.clone()),
        ("degraded", vec!["a".to_string()])
    );

    let got = keys_at(&moved, &moved.host).await;
    let lost: Vec<_> = written.acked.iter().filter(|k| !got.contains(*k)).collect();
    assert!(lost.is_empty(), "acknowledged and lost: {lost:?}");
    println!(
        "zone loss (tolerance zone): zt1 a -> {} in {} ms; {} writes acknowledged, 0 lost; \
         longest gap between acknowledgements {} ms",
        moved.host,
        rto.as_millis(),
        written.acked.len(),
        written.longest_gap.as_millis()
    );
    // `ringctl cp get` says what stands.
    let out = ring_ringctl(&ring, &["cp", "get", "zt1"]);
    assert!(
        out.contains("etcd:     degraded (2 of 3 members up; down: a)"),
        "{out}"
    );
}

fn ring_kill(ring: &Ring, i: usize) {
    // `Ring::kill_zone` needs `&mut`; the writer holds a shared borrow meanwhile, so kill the
    // same way here: the ringd, then everything started under its data directory.
    if let Some(pid) = ring.procs[i].pid() {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid as i32),
            nix::sys::signal::Signal::SIGKILL,
        );
    }
    let data_root = ring.procs[i].config.data_dir.display().to_string();
    let _ = std::process::Command::new("pkill")
        .args(["-9", "-f", &data_root])
        .status();
}

fn ring_ringctl(ring: &Ring, args: &[&str]) -> String {
    let out = ring.ringctl(args);
    assert!(
        out.status.success(),
        "ringctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_switchover_moves_only_the_host_and_loses_nothing() {
    let ring = etcd_ring();
    wait_all_healthy(&ring).await;

    // Too few peer addresses: one clear line, nothing added.
    let mut short = zone_tolerant(&ring, "zt0", "a");
    short.etcd_peers.remove("c");
    let err = add_control_plane(&ring.client(), short).await.unwrap_err();
    assert!(
        err.to_string().contains(
            "tolerance zone needs an etcd peer address (member=host:port) on at least 3 members"
        ),
        "{err}"
    );

    add_control_plane(&ring.client(), zone_tolerant(&ring, "zt2", "a"))
        .await
        .unwrap();
    running(&ring, &[0, 1, 2], "zt2", &["a"]).await;
    let (stop_tx, stop) = watch::channel(false);
    let writer = write_following_the_host(&ring, "zt2", "s", stop);
    let operator = async {
        tokio::time::sleep(Duration::from_millis(1_000)).await;
        let started = Instant::now();
        ring_ringctl(
            &ring,
            &["switchover", "zt2", "--to", "b", "--reason", "test"],
        );
        let moved = running(&ring, &[0, 1, 2], "zt2", &["b"]).await;
        let took = started.elapsed();
        tokio::time::sleep(Duration::from_millis(500)).await;
        stop_tx.send_replace(true);
        (moved, took)
    };
    let (written, (moved, took)) = tokio::join!(writer, operator);
    let got = keys_at(&moved, "b").await;
    let lost: Vec<_> = written.acked.iter().filter(|k| !got.contains(*k)).collect();
    assert!(lost.is_empty(), "acknowledged and lost: {lost:?}");
    assert!(moved.migration.unwrap().restored.is_empty());
    // a still runs its etcd member: the cluster is whole.
    assert_eq!(moved.etcd.unwrap().health, "whole");
    println!(
        "switchover (tolerance zone): zt2 a -> b running after {} ms; {} writes acknowledged, \
         0 lost; the endpoint was down {} ms for a client that follows the host",
        took.as_millis(),
        written.acked.len(),
        written.longest_gap.as_millis()
    );
}

/// A ring of a, b, c and `spares` (d, e: each in a zone of its own, added and promoted), whose
/// members run etcd and replace a lost etcd member after `replace_after_ms`.
async fn ring_with_spares(spares: &[&str], replace_after_ms: u64) -> Ring {
    let mut ring = Ring::prepare(RingOptions {
        driver: driver_with_deltas(3_600_000, 300),
        ..RingOptions::default()
    });
    let joiners: Vec<usize> = (4..).take(spares.len()).map(|id| ring.joiner(id)).collect();
    let metrics = ring.free_addresses(ring.procs.len());
    for (p, address) in ring.procs.iter_mut().zip(metrics) {
        p.config.backup = BackupSettings::default();
        p.config.placement.etcd_replace_after_ms = replace_after_ms;
        p.config.metrics.listen = Some(address);
    }
    for i in 0..3 {
        ring.procs[i].spawn();
    }
    ring.wait_leader(&[0, 1, 2], &[], Duration::from_secs(20))
        .await;
    for (i, name) in joiners.into_iter().zip(spares) {
        ring.procs[i].spawn();
        let out = ring.ringctl_member_add(i, &["--reason", "a spare zone"]);
        assert!(
            out.status.success(),
            "member add: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        ring_ringctl(&ring, &["member", "promote", name]);
    }
    wait_all_healthy(&ring).await;
    ring
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_lost_long_enough_is_replaced_on_a_spare_in_another_zone() {
    let ring = ring_with_spares(&["d"], 2_000).await;

    // Endpoints and etcd peers on all four; the cluster goes on a, b, c (d is the spare).
    add_zone_tolerant_on(&ring, "zt3", &["a", "b", "c", "d"]).await;
    let cp = running(&ring, &[0, 1, 2, 3], "zt3", &["a"]).await;
    let members = |cp: &pb::ControlPlane| -> Vec<String> {
        cp.etcd
            .as_ref()
            .unwrap()
            .members
            .iter()
            .map(|m| m.member.clone())
            .collect()
    };
    assert_eq!(members(&cp), ["a", "b", "c"]);
    let etcd = etcd_at(&cp, "a").await;
    // The ring records etcd's ids of the members, as etcd lists them.
    let ids_recorded = |want: usize| {
        let ring = &ring;
        async move {
            eventually(
                Duration::from_secs(20),
                "the ring recorded etcd's id of every member of zt3's cluster",
                || async {
                    let cp = cps(ring, &[0, 1, 2, 3]).await.remove("zt3")?;
                    let etcd = cp.etcd.as_ref()?;
                    let ids: BTreeMap<String, u64> = etcd
                        .members
                        .iter()
                        .filter(|m| m.etcd_id != 0)
                        .map(|m| (m.member.clone(), m.etcd_id))
                        .collect();
                    (ids.len() == want && etcd.change.is_empty()).then_some(ids)
                },
            )
            .await
        }
    };
    let listed_ids = |listed: &[EtcdMember]| -> BTreeMap<String, u64> {
        listed.iter().map(|m| (m.name.clone(), m.id)).collect()
    };
    let recorded = ids_recorded(3).await;
    assert_eq!(recorded, listed_ids(&etcd.member_list().await.unwrap()));
    let c_id = recorded["c"];
    let written = write_keys(&cp, "r").await;

    // c's zone dies; 2 s after it is judged lost, d takes its etcd member: removed, added as a
    // learner, caught up, promoted.
    let killed_at = Instant::now();
    ring_kill(&ring, 2);
    let repaired = eventually(
        Duration::from_secs(60),
        "zt3's etcd cluster is a, b, d and whole",
        || async {
            let cp = cps(&ring, &[0, 1, 3]).await.remove("zt3")?;
            let etcd = cp.etcd.as_ref()?;
            (members(&cp) == ["a", "b", "d"]
                && etcd.change.is_empty()
                && etcd.health == "whole"
                && !etcd.members.iter().any(|m| m.learner))
            .then_some(cp)
        },
    )
    .await;
    let took = killed_at.elapsed();
    assert_eq!(repaired.host, "a");
    assert_eq!(repaired.etcd.as_ref().unwrap().generation, 2);

    // etcd agrees: three voters, d among them and started.
    let listed = etcd.member_list().await.unwrap();
    let mut names: Vec<String> = listed.iter().map(|m| m.name.clone()).collect();
    names.sort();
    assert_eq!(names, ["a", "b", "d"], "{listed:?}");
    assert!(listed.iter().all(|m| !m.learner), "{listed:?}");
    // The ring knows d's id too, and c's is gone with it (it was removed by that id).
    let recorded = ids_recorded(3).await;
    assert_eq!(recorded, listed_ids(&listed));
    assert!(!recorded.values().any(|id| *id == c_id));
    let d_peer = &repaired
        .etcd
        .as_ref()
        .unwrap()
        .members
        .iter()
        .find(|m| m.member == "d")
        .unwrap()
        .peer;
    let shown = ring_ringctl(&ring, &["cp", "get", "zt3"]);
    assert!(
        shown.contains(&format!("d: peer {d_peer}, id {:x}", recorded["d"])),
        "{shown}"
    );
    // Nothing lost, and it takes writes.
    etcd.put(b"/registry/after", b"v").await.unwrap();
    let got = keys_at(&repaired, "a").await;
    assert!(written.iter().all(|k| got.contains(k)));
    // The history has each step.
    let history = ring_ringctl(&ring, &["history"]);
    for step in [
        "to be replaced by one on d",
        "etcd member on c removed from the cluster",
        "etcd member on d added as a learner",
        "etcd member on d promoted",
    ] {
        assert!(history.contains(step), "{step:?} missing from\n{history}");
    }
    println!(
        "repair: c's etcd member replaced by d's (removed, learner added, promoted) {} ms after the kill \
         (member_lost_ms + etcd_replace_after_ms 2000 ms); {} keys kept",
        took.as_millis(),
        got.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_recovers_a_cluster_without_quorum_from_its_host_and_it_grows_back() {
    // Five members: the ring keeps its quorum when two of the cluster's zones die.
    let ring = ring_with_spares(&["d", "e"], 300_000).await;

    add_zone_tolerant_on(&ring, "zt4", &["a", "b", "c", "d", "e"]).await;
    let survivors = [0, 3, 4];
    let cp = running(&ring, &survivors, "zt4", &["a"]).await;
    let members = |cp: &pb::ControlPlane| -> Vec<String> {
        cp.etcd
            .as_ref()
            .unwrap()
            .members
            .iter()
            .map(|m| m.member.clone())
            .collect()
    };
    assert_eq!(members(&cp), ["a", "b", "c"]);
    let etcd = etcd_at(&cp, "a").await;
    let written = write_keys(&cp, "q").await;

    // Two of its three zones die: the ring (a, d, e) keeps its quorum, the etcd cluster does
    // not, and the ring does not force anything by itself.
    lose_b_and_c(&ring, &survivors, "zt4").await;
    assert!(
        etcd.put(b"/registry/refused", b"v").await.is_err(),
        "a write was acknowledged without a quorum"
    );
    let out = ring_ringctl(&ring, &["cp", "get", "zt4"]);
    assert!(
        out.contains("etcd:     no-quorum (1 of 3 members up; down: b, c)"),
        "{out}"
    );
    // And /metrics, for the alert that pages the operator (GardenRingEtcdClusterNoQuorum).
    let metrics = ring.procs[0].config.metrics.listen.unwrap();
    let health_is = |health: &'static str| async move {
        let line = format!(
            "garden_ring_control_plane_etcd_health{{control_plane=\"zt4\",health=\"{health}\"}} 1"
        );
        eventually(Duration::from_secs(10), &line, || async {
            let (_, body) = http_get(metrics, "/metrics")?;
            body.contains(&line).then_some(())
        })
        .await;
    };
    health_is("no-quorum").await;

    // What an operator can do, checked first.
    let dry = ring_ringctl(
        &ring,
        &["cp", "recover", "zt4", "--from-member", "a", "--dry-run"],
    );
    assert!(
        dry.contains("dry run, nothing changed: would have etcd cluster forced anew from a's data")
            && dry.contains("b, c dropped")
            && dry.contains("are lost"),
        "{dry}"
    );
    let refused = ring.ringctl(&["cp", "recover", "zt4", "--from-member", "b"]);
    assert!(!refused.status.success());
    let refused = String::from_utf8_lossy(&refused.stderr);
    assert!(
        refused.contains("cannot recover the etcd cluster of zt4"),
        "{refused}"
    );
    let recovered_at = Instant::now();
    ring_ringctl(
        &ring,
        &[
            "cp",
            "recover",
            "zt4",
            "--from-member",
            "a",
            "--reason",
            "test",
        ],
    );

    // a alone from its data, then back to three on the spares d and e.
    let whole = whole_again_on_a_d_e(&ring, &survivors, "zt4", &written).await;
    let took = recovered_at.elapsed();
    health_is("whole").await;
    let etcd = etcd_at(&whole, "a").await;
    let mut listed: Vec<String> = etcd
        .member_list()
        .await
        .unwrap()
        .into_iter()
        .filter(|m| !m.learner)
        .map(|m| m.name)
        .collect();
    listed.sort();
    assert_eq!(listed, ["a", "d", "e"]);
    println!(
        "recovery from a: no-quorum -> forced from a's data -> whole again on a, d, e in {} ms; \
         {} of {} keys written before the loss kept",
        took.as_millis(),
        written.len(),
        written.len()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_operator_recovers_a_cluster_without_quorum_from_its_backups() {
    let ring = ring_with_spares(&["d", "e"], 300_000).await;
    add_zone_tolerant_on(&ring, "zt5", &["a", "b", "c", "d", "e"]).await;
    let survivors = [0, 3, 4];
    let cp = running(&ring, &survivors, "zt5", &["a"]).await;
    let mut written = write_keys(&cp, "b").await;
    let revision = etcd_at(&cp, "a")
        .await
        .put(b"/registry/b-last", b"v")
        .await
        .unwrap();
    written.push("/registry/b-last".into());
    // The backups hold every write (a delta every 300 ms; the ring's report lags by up to 5 s).
    let before = eventually(
        Duration::from_secs(30),
        "zt5's backups reach the last write",
        || async {
            let cp = cps(&ring, &survivors).await.remove("zt5")?;
            let ids_known = cp.etcd.as_ref()?.members.iter().all(|m| m.etcd_id != 0);
            (cp.backup_status.as_ref()?.revision >= revision && ids_known).then_some(cp)
        },
    )
    .await;
    let a_id = before.etcd.as_ref().unwrap().members[0].etcd_id;

    lose_b_and_c(&ring, &survivors, "zt5").await;
    let dry = ring_ringctl(
        &ring,
        &["cp", "recover", "zt5", "--from-backup", "--dry-run"],
    );
    assert!(
        dry.contains("dry run, nothing changed: would have etcd cluster restored on a from the newest backups in ")
            && dry.contains("b, c dropped (writes after the newest delta snapshot there are lost; the last report of them: full snapshot ")
            && dry.contains(&format!("revision {}", before.backup_status.as_ref().unwrap().revision)),
        "{dry}"
    );
    let neither = ring.ringctl(&["cp", "recover", "zt5"]);
    assert!(!neither.status.success());
    let neither = String::from_utf8_lossy(&neither.stderr);
    assert!(
        neither.contains("--from-member") && neither.contains("--from-backup"),
        "{neither}"
    );
    let recovered_at = Instant::now();
    ring_ringctl(
        &ring,
        &["cp", "recover", "zt5", "--from-backup", "--reason", "test"],
    );

    // a on a new data directory restored from the bucket, then back to three on d and e.
    let whole = whole_again_on_a_d_e(&ring, &survivors, "zt5", &written).await;
    let took = recovered_at.elapsed();
    let etcd = etcd_at(&whole, "a").await;
    // A new etcd member on a (restored, not the old one forced), advertising its peer address,
    // and d and e joined it.
    let listed = etcd.member_list().await.unwrap();
    let a = listed.iter().find(|m| m.name == "a").unwrap();
    assert_ne!(a.id, a_id, "{listed:?}");
    let a_peer = &whole
        .etcd
        .as_ref()
        .unwrap()
        .members
        .iter()
        .find(|m| m.member == "a")
        .unwrap()
        .peer;
    assert!(
        a.peer_urls.len() == 1 && a.peer_urls[0].ends_with(&format!("://{a_peer}")),
        "{listed:?}"
    );
    let history = ring_ringctl(&ring, &["history"]);
    assert!(history.contains("etcd cluster restored on a"), "{history}");
    println!(
        "recovery from backup: no-quorum -> a restored from the bucket -> whole again on a, d, e \
         in {} ms; {} of {} keys written before the loss kept",
        took.as_millis(),
        written.len(),
        written.len()
    );
}
