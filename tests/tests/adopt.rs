//! A `ringd` restart leaves its etcds to their guards, and the next `ringd` of the member
//! adopts them (issue 43, point 3), with real processes: three `ringd` on loopback with the
//! `etcd` driver, a writer on a control plane's endpoint all along. The restarted member's etcd
//! is the same process before and after, at the same epoch, on the same host; no write the
//! writer was told succeeded is lost; and the leader's restart moves nothing either.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use garden_ring::backup::etcd::EtcdClient;
use garden_ring::pb;
use garden_ring_tests::etcd::{etcd_control_plane, fast, file_backups};
use garden_ring_tests::{Ring, RingOptions, add_control_plane, eventually, wait_all_healthy};

/// The pid of the etcd that serves `name` at `epoch` in the data root `root` (its data
/// directory names all three), if one runs.
fn etcd_pid(root: &std::path::Path, name: &str, epoch: u64) -> Option<u32> {
    let needle = format!("{}/{name}/epoch-{epoch}/etcd", root.display());
    std::fs::read_dir("/proc").ok()?.flatten().find_map(|e| {
        let pid: u32 = e.file_name().to_str()?.parse().ok()?;
        let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
        let args: Vec<String> = cmdline
            .split(|b| *b == 0)
            .map(|a| String::from_utf8_lossy(a).to_string())
            .collect();
        let program = std::path::Path::new(args.first()?).file_name()?.to_str()?;
        (program == "etcd" && args.iter().any(|a| a.ends_with(&needle))).then_some(pid)
    })
}

/// What a writer saw: the keys acknowledged, the longest wait for one, the failed tries.
struct Written {
    acked: BTreeSet<String>,
    longest_wait: Duration,
    failures: usize,
}

/// Writes `/registry/<prefix>NNNNNN` one after the other until `stop`, retrying a failed put
/// (on a new connection) until it is acknowledged.
async fn write_all_along(
    endpoint: String,
    prefix: &'static str,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Written {
    let mut written = Written {
        acked: BTreeSet::new(),
        longest_wait: Duration::ZERO,
        failures: 0,
    };
    let mut client = None;
    for i in 0.. {
        if *stop.borrow() {
            break;
        }
        let key = format!("/registry/{prefix}{i:06}");
        let asked = Instant::now();
        loop {
            if client.is_none() {
                client = EtcdClient::connect(&endpoint, fast()).await.ok();
            }
            let acked = match &client {
                Some(c) => c.put(key.as_bytes(), b"v").await.is_ok(),
                None => false,
            };
            if acked {
                break;
            }
            written.failures += 1;
            client = None;
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        written.longest_wait = written.longest_wait.max(asked.elapsed());
        written.acked.insert(key);
    }
    written
}

async fn running_on(ring: &Ring, name: &str, host: &str) -> pb::ControlPlane {
    garden_ring_tests::running_on_within(ring, name, host, Duration::from_secs(30)).await
}

/// Restarts member `i` (SIGTERM, then the same binary on the same config) under a writer on
/// `name`'s endpoint at `host`, and checks that nothing about `name` changed: the same etcd
/// process, epoch and host, every acknowledged write there, no move in the history.
async fn restart_under_a_writer(ring: &mut Ring, i: usize, name: &str, host: &str) {
    assert_eq!(ring.procs[i].config.name, host, "member {i} hosts {name}");
    let before = running_on(ring, name, host).await;
    let root = ring.procs[i].config.etcd_data_root();
    let pid = etcd_pid(&root, name, before.epoch).expect("its etcd runs");
    let endpoint = format!("http://{}", before.endpoints[host]);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let writer = tokio::spawn(write_all_along(endpoint.clone(), "w", stopped));
    tokio::time::sleep(Duration::from_millis(500)).await;

    let restarted = Instant::now();
    let status = ring.procs[i].terminate();
    assert!(
        status.is_some_and(|s| s.success()),
        "ringd exits cleanly on SIGTERM: {status:?}"
    );
    let down_ms = restarted.elapsed().as_millis();
    ring.procs[i].spawn();
    let member = ring.procs[i].config.name.clone();
    eventually(
        Duration::from_secs(30),
        "the restarted member is healthy again",
        || async {
            let s = garden_ring_tests::status(&ring.procs[i]).await.ok()?;
            s.members
                .iter()
                .any(|m| m.name == member && m.health == "healthy")
                .then_some(())
        },
    )
    .await;
    let back_ms = restarted.elapsed().as_millis();
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let _ = stop.send(true);
    let written = writer.await.unwrap();

    let after = running_on(ring, name, host).await;
    assert_eq!(after.epoch, before.epoch, "{name} moved");
    assert_eq!(
        etcd_pid(&root, name, after.epoch),
        Some(pid),
        "{name}'s etcd was restarted"
    );
    let log = ring.procs[i].log();
    assert!(log.contains("adopting the etcd"), "not adopted:\n{log}");
    let got: BTreeSet<String> = EtcdClient::connect(&endpoint, fast())
        .await
        .unwrap()
        .get_prefix_keys(b"/registry/w")
        .await
        .unwrap()
        .into_iter()
        .map(|kv| String::from_utf8(kv.key).unwrap())
        .collect();
    let missing = written.acked.difference(&got).count();
    assert_eq!(missing, 0, "{missing} acknowledged writes lost");
    let history = ring.ringctl(&["history", "--limit", "0"]);
    let history = String::from_utf8_lossy(&history.stdout).to_string();
    let moves = history
        .lines()
        .filter(|l| l.contains("control-plane.move"))
        .count();
    println!(
        "restart of {member} (hosting {name}): exited after {down_ms} ms, healthy again \
         after {back_ms} ms; etcd pid {pid} kept; {} writes acknowledged, 0 lost, longest \
         wait {} ms, {} failed tries; {moves} moves in the history",
        written.acked.len(),
        written.longest_wait.as_millis(),
        written.failures
    );
    assert_eq!(moves, 0, "{history}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_ringd_adopts_its_etcd_and_nothing_moves() {
    let mut ring = Ring::prepare(RingOptions {
        driver: garden_ring_tests::etcd::driver_with_deltas(3_600_000, 300),
        ..RingOptions::default()
    });
    for p in &mut ring.procs {
        p.spawn();
    }
    wait_all_healthy(&ring).await;
    let leader = ring
        .wait_leader(&[0, 1, 2], &[], Duration::from_secs(20))
        .await;
    let l = ring.index_of(leader);
    let follower = (0..3).find(|&i| i != l).unwrap();
    let follower_name = ring.procs[follower].config.name.clone();
    let leader_name = ring.procs[l].config.name.clone();
    for (name, host) in [("on-follower", &follower_name), ("on-leader", &leader_name)] {
        let backups = file_backups(ring.dir.path(), name);
        let req = etcd_control_plane(name, host, &backups[host.as_str()], backups.clone());
        add_control_plane(&ring.client(), req).await.unwrap();
        running_on(&ring, name, host).await;
    }

    // A follower hosting one.
    restart_under_a_writer(&mut ring, follower, "on-follower", &follower_name).await;
    // The leader hosting one: it hands the leadership over first.
    restart_under_a_writer(&mut ring, l, "on-leader", &leader_name).await;
    let log = ring.procs[l].log();
    assert!(log.contains("handing the leadership over"), "{log}");
}
