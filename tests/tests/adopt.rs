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

/// How a member's ringd goes before the same binary starts again on its config.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Leaving {
    /// SIGTERM: an upgrade or a planned restart (announced to the leader).
    Restart,
    /// SIGKILL: a crash (nothing announced; the guards keep serving on the lease they have).
    Crash,
}

/// Admin API writes (a label on member `on`, through every member's endpoint) one after the
/// other until `stop`; the longest any took until it was acknowledged, retries included.
async fn admin_writes_along(
    client: garden_ring::admin::client::AdminClient,
    on: String,
    stop: tokio::sync::watch::Receiver<bool>,
) -> (usize, Duration) {
    let (mut done, mut longest) = (0, Duration::ZERO);
    while !*stop.borrow() {
        let asked = Instant::now();
        loop {
            let request = pb::MemberLabelRequest {
                member: on.clone(),
                labels: [("adopt-test".to_string(), done.to_string())].into(),
                reason: "adopt test: Admin writes during a restart".into(),
            };
            let call = client.call(request, |mut c, r| async move { c.member_label(r).await });
            if call.await.is_ok() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        longest = longest.max(asked.elapsed());
        done += 1;
    }
    (done, longest)
}

/// Restarts member `i` (`how`, then the same binary on the same config) under a writer on
/// `name`'s endpoint at `host` and an Admin API writer, and checks that nothing about `name`
/// changed: the same etcd process, epoch and host, every acknowledged write there, no move
/// in the history. Returns the longest Admin write.
async fn restart_under_a_writer(
    ring: &mut Ring,
    i: usize,
    name: &str,
    host: &str,
    how: Leaving,
) -> Duration {
    assert_eq!(ring.procs[i].config.name, host, "member {i} hosts {name}");
    let before = running_on(ring, name, host).await;
    let root = ring.procs[i].config.etcd_data_root();
    let pid = etcd_pid(&root, name, before.epoch).expect("its etcd runs");
    let endpoint = format!("http://{}", before.endpoints[host]);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let writer = tokio::spawn(write_all_along(endpoint.clone(), "w", stopped.clone()));
    let other = ring.procs[(i + 1) % 3].config.name.clone();
    let admin = tokio::spawn(admin_writes_along(ring.client(), other, stopped));
    tokio::time::sleep(Duration::from_millis(500)).await;

    let restarted = Instant::now();
    match how {
        Leaving::Restart => {
            let status = ring.procs[i].terminate();
            assert!(
                status.is_some_and(|s| s.success()),
                "ringd exits cleanly on SIGTERM: {status:?}"
            );
        }
        // Only ringd: what it started runs on under its guards.
        Leaving::Crash => ring.procs[i].kill9(),
    }
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
    let (admin_writes, admin_longest) = admin.await.unwrap();

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
        "{how:?} of {member} (hosting {name}): exited after {down_ms} ms, healthy again \
         after {back_ms} ms; etcd pid {pid} kept; {} writes acknowledged, 0 lost, longest \
         wait {} ms, {} failed tries; {moves} moves in the history; {admin_writes} Admin \
         writes, the longest {} ms",
        written.acked.len(),
        written.longest_wait.as_millis(),
        written.failures,
        admin_longest.as_millis()
    );
    assert_eq!(moves, 0, "{history}");
    admin_longest
}

/// A three-member ring on the etcd driver (a full snapshot an hour, deltas every
/// `delta_ms`), healthy, with a leader; returns it, the leader's index and a follower's.
async fn etcd_ring(delta_ms: u64) -> (Ring, usize, usize) {
    let mut ring = Ring::prepare(RingOptions {
        driver: garden_ring_tests::etcd::driver_with_deltas(3_600_000, delta_ms),
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
    (ring, l, follower)
}

/// Adds the etcd-driver control plane `name` on `host` and waits until it runs there.
async fn add_on(ring: &Ring, name: &str, host: &str) -> pb::ControlPlane {
    let backups = file_backups(ring.dir.path(), name);
    let req = etcd_control_plane(name, host, &backups[host], backups.clone());
    add_control_plane(&ring.client(), req).await.unwrap();
    running_on(ring, name, host).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_ringd_adopts_its_etcd_and_nothing_moves() {
    let (mut ring, l, follower) = etcd_ring(300).await;
    let follower_name = ring.procs[follower].config.name.clone();
    let leader_name = ring.procs[l].config.name.clone();
    for (name, host) in [("on-follower", &follower_name), ("on-leader", &leader_name)] {
        add_on(&ring, name, host).await;
    }

    // A follower hosting one.
    restart_under_a_writer(
        &mut ring,
        follower,
        "on-follower",
        &follower_name,
        Leaving::Restart,
    )
    .await;
    // The leader hosting one: it hands the leadership over first, so Admin writes wait for
    // no election.
    let admin_longest =
        restart_under_a_writer(&mut ring, l, "on-leader", &leader_name, Leaving::Restart).await;
    let log = ring.procs[l].log();
    assert!(log.contains("handing the leadership over"), "{log}");
    let election_ms = ring.procs[l].config.timing.election_timeout_max_ms;
    assert!(
        admin_longest.as_millis() <= u128::from(election_ms),
        "an Admin write waited {} ms during the leader's restart, longer than an election \
         ({election_ms} ms)",
        admin_longest.as_millis()
    );
}

/// A crashed ringd (SIGKILL) leaves its etcd serving under its guard, on the lease it had;
/// the ringd started again adopts it: the same process, nothing lost, nothing moved.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_ringd_is_adopted_too() {
    let (mut ring, _, follower) = etcd_ring(300).await;
    let host = ring.procs[follower].config.name.clone();
    add_on(&ring, "crashed", &host).await;
    restart_under_a_writer(&mut ring, follower, "crashed", &host, Leaving::Crash).await;
}

/// Writes `/registry/<prefix>NNNNNN` until `stop`, each key tried once (a failed put only
/// reconnects); returns the keys acknowledged, each with when.
async fn write_until(
    endpoint: String,
    prefix: &'static str,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<(String, Instant)> {
    let mut acked = Vec::new();
    let mut client = None;
    for i in 0.. {
        if *stop.borrow() {
            break;
        }
        if client.is_none() {
            client = EtcdClient::connect(&endpoint, fast()).await.ok();
        }
        let key = format!("/registry/{prefix}{i:06}");
        match &client {
            Some(c) if c.put(key.as_bytes(), b"v").await.is_ok() => {
                acked.push((key, Instant::now()));
            }
            _ => {
                client = None;
                tokio::time::sleep(Duration::from_millis(10)).await;
            }
        }
    }
    acked
}

/// A ringd that leaves while its etcd still starts (on data a killed guard left: writes
/// acknowledged after the last delta, on this disk only) stops that etcd with a final
/// snapshot instead of leaving it to its guard: when the member then stays away, the host the
/// ring moves the control plane to restores every acknowledged write.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ringd_leaving_while_its_etcd_starts_stores_what_that_etcd_holds() {
    // Deltas once a minute: the farewell's delta is the only one while the test runs.
    let (mut ring, l, f) = etcd_ring(60_000).await;
    let host = ring.procs[f].config.name.clone();
    let name = "kept";
    let before = add_on(&ring, name, &host).await;
    let endpoint = format!("http://{}", before.endpoints[&host]);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let writer = tokio::spawn(write_until(endpoint.clone(), "k", stopped));
    tokio::time::sleep(Duration::from_millis(500)).await;

    // SIGTERM: the farewell's delta, then the guard serves on alone; what it acknowledges now
    // is on this disk only. Then the machine's processes go (its guards, its etcd).
    let status = ring.procs[f].terminate();
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    let left_at = Instant::now();
    tokio::time::sleep(Duration::from_millis(300)).await;
    let root = ring.procs[f].config.etcd_data_root();
    garden_ring_tests::kill_processes_under(&root);
    let _ = stop.send(true);
    let acked = writer.await.unwrap();
    let on_disk_only = acked.iter().filter(|(_, at)| *at > left_at).count();
    assert!(
        on_disk_only > 0,
        "no write acknowledged by the guard alone ({} in all)",
        acked.len()
    );

    // The next ringd starts etcd on that data; it is told to leave before etcd serves.
    let logged_before = ring.procs[f].log().len();
    ring.procs[f].spawn();
    eventually(
        Duration::from_secs(30),
        "the next ringd starts etcd on the data that was here",
        || async {
            let log = ring.procs[f].log();
            log[logged_before..]
                .contains("data of this epoch is here already")
                .then_some(())
        },
    )
    .await;
    let status = ring.procs[f].terminate();
    assert!(status.is_some_and(|s| s.success()), "{status:?}");
    let log = ring.procs[f].log()[logged_before..].to_string();
    assert!(
        log.contains("stopped what was still starting here") && log.contains("final snapshot"),
        "no final snapshot of the etcd that was starting:\n{log}"
    );

    // It stays away: the ring moves the control plane, restored from the bucket.
    let moved = eventually(
        Duration::from_secs(60),
        &format!("{name} runs elsewhere"),
        || async {
            let cp = garden_ring_tests::cps(&ring, &[l]).await.remove(name)?;
            (cp.phase == "running" && cp.host != host && cp.epoch > before.epoch).then_some(cp)
        },
    )
    .await;
    let endpoint = format!("http://{}", moved.endpoints[&moved.host]);
    let got: BTreeSet<String> = EtcdClient::connect(&endpoint, fast())
        .await
        .unwrap()
        .get_prefix_keys(b"/registry/k")
        .await
        .unwrap()
        .into_iter()
        .map(|kv| String::from_utf8(kv.key).unwrap())
        .collect();
    let missing: Vec<&String> = acked
        .iter()
        .map(|(k, _)| k)
        .filter(|k| !got.contains(*k))
        .collect();
    println!(
        "{} writes acknowledged, {on_disk_only} of them by the guard alone after its ringd \
         left; moved to {} at epoch {}: {} missing",
        acked.len(),
        moved.host,
        moved.epoch,
        missing.len()
    );
    assert!(
        missing.is_empty(),
        "{} acknowledged writes lost",
        missing.len()
    );
}
