//! Acceptance tests of the Foundation issue, against real `ringd` processes on loopback.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use garden_ring::pb;
use garden_ring_tests::{Ring, RingOptions, add_control_plane, control_plane, eventually, status};

const FORM: Duration = Duration::from_secs(20);

/// Waits until member `i` has applied `index` and lists control plane `name`.
async fn wait_visible(ring: &Ring, i: usize, index: u64, name: &str) {
    let p = &ring.procs[i];
    eventually(
        Duration::from_secs(15),
        &format!("{} applied {index} with {name}", p.config.name),
        || async {
            let s = status(p).await.ok()?;
            (s.applied_index >= index && s.control_planes.iter().any(|c| c.name == name))
                .then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn three_members_elect_and_a_follower_write_reaches_all() {
    let ring = Ring::start(RingOptions::default());
    let started = Instant::now();
    let leader = ring.wait_leader(&[0, 1, 2], &[], FORM).await;
    println!(
        "first leader {leader} elected {} ms after the processes started",
        started.elapsed().as_millis()
    );

    let follower = (0..3).find(|&i| ring.procs[i].config.id != leader).unwrap();
    let index = add_control_plane(
        &ring.procs[follower].client(),
        control_plane("via-follower", Some("a")),
    )
    .await
    .expect("a write sent to a follower is forwarded and committed");
    for i in 0..3 {
        wait_visible(&ring, i, index, "via-follower").await;
    }
    let s = status(&ring.procs[0]).await.unwrap();
    let cp = s
        .control_planes
        .iter()
        .find(|c| c.name == "via-follower")
        .unwrap();
    assert_eq!(cp.epoch, 1);
    assert!(
        cp.phase == "starting" || cp.phase == "running",
        "placed: {}",
        cp.phase
    );
    assert_ne!(cp.host, "a", "never hosted at home");
    let actions: Vec<_> = ring
        .client()
        .call(
            pb::HistoryRequest {
                limit: 0,
                ..Default::default()
            },
            |mut c, r| async move { c.history(r).await },
        )
        .await
        .unwrap()
        .events
        .into_iter()
        .map(|e| e.action)
        .collect();
    assert!(
        actions.contains(&"ring.bootstrap".to_string()),
        "{actions:?}"
    );
    assert!(
        actions.contains(&"control-plane.add".to_string()),
        "{actions:?}"
    );
}

#[tokio::test]
async fn killing_the_leader_elects_a_new_one_and_the_old_one_catches_up() {
    let mut ring = Ring::start(RingOptions::default());
    let old = ring.wait_leader(&[0, 1, 2], &[], FORM).await;
    let before = add_control_plane(&ring.client(), control_plane("before", None))
        .await
        .unwrap();
    for i in 0..3 {
        wait_visible(&ring, i, before, "before").await;
    }

    let victim = ring.index_of(old);
    let survivors: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
    let killed_at = Instant::now();
    ring.procs[victim].kill9();
    let new = ring
        .wait_leader(&survivors, &[old], Duration::from_secs(10))
        .await;
    let elected_ms = killed_at.elapsed().as_millis();
    println!("kill -9 of leader {old}: member {new} leads after {elected_ms} ms");

    let after = add_control_plane(&ring.client(), control_plane("after", None))
        .await
        .expect("writes succeed with the new leader");
    let write_ms = killed_at.elapsed().as_millis();
    println!("first write after the kill committed {write_ms} ms after it");

    // ringctl with the dead member's endpoint first moves on to the next one.
    let mut endpoints = vec![ring.procs[victim].admin()];
    endpoints.extend(survivors.iter().map(|&i| ring.procs[i].admin()));
    let out = garden_ring_tests::ringctl(
        &ring.client_config,
        &endpoints,
        &["cp", "list", "--output", "json"],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(String::from_utf8_lossy(&out.stdout).contains("\"after\""));

    ring.procs[victim].spawn();
    wait_visible(&ring, victim, after, "after").await;
    wait_visible(&ring, victim, after, "before").await;
    // The restarted member follows; it did not take leadership back by force.
    let s = status(&ring.procs[victim]).await.unwrap();
    assert_ne!(s.leader_id, 0);
}

#[tokio::test]
async fn every_acknowledged_write_survives_kill9_of_all_members() {
    // Small snapshot interval: recovery goes through a persisted snapshot plus log replay.
    let mut ring = Ring::start(RingOptions {
        snapshot_every: 16,
        snapshot_keep: 4,
        ..RingOptions::default()
    });
    ring.wait_leader(&[0, 1, 2], &[], FORM).await;

    let client = std::sync::Arc::new(ring.client());
    let mut tasks = Vec::new();
    for writer in 0..4 {
        let client = client.clone();
        tasks.push(tokio::spawn(async move {
            let mut acked = Vec::new();
            for n in 0..15 {
                let name = format!("cp-{writer}-{n}");
                if add_control_plane(&client, control_plane(&name, None))
                    .await
                    .is_ok()
                {
                    acked.push(name);
                }
            }
            acked
        }));
    }
    let mut acked = BTreeSet::new();
    for t in tasks {
        acked.extend(t.await.unwrap());
    }
    assert_eq!(acked.len(), 60, "all writes acknowledged on a healthy ring");

    for p in &mut ring.procs {
        p.kill9();
    }
    for p in &mut ring.procs {
        p.spawn();
    }
    ring.wait_leader(&[0, 1, 2], &[], FORM).await;
    for i in 0..3 {
        let p = &ring.procs[i];
        let present: BTreeSet<String> =
            eventually(FORM, "restarted member has replayed its log", || async {
                let s = status(p).await.ok()?;
                let names: BTreeSet<String> =
                    s.control_planes.into_iter().map(|c| c.name).collect();
                acked.is_subset(&names).then_some(names)
            })
            .await;
        assert!(
            acked.is_subset(&present),
            "member {} lost acknowledged writes",
            p.config.name
        );
    }
    assert!(
        ring.procs
            .iter()
            .any(|p| p.log().contains("built snapshot")),
        "the test should exercise snapshots:\n{}",
        ring.logs()
    );
}

#[tokio::test]
async fn a_fourth_member_joins_as_learner_is_promoted_and_removed() {
    // Logs are purged right after each snapshot, so the new member must be caught up by a
    // streamed snapshot install, not only by log replication.
    let mut ring = Ring::start(RingOptions {
        snapshot_every: 8,
        snapshot_keep: 0,
        ..RingOptions::default()
    });
    ring.wait_leader(&[0, 1, 2], &[], FORM).await;
    let mut last = 0;
    for n in 0..20 {
        last = add_control_plane(&ring.client(), control_plane(&format!("early-{n}"), None))
            .await
            .unwrap();
    }

    let d = ring.joiner(4);
    ring.procs[d].spawn();
    let out = ring.ringctl_member_add(d, &["--reason", "grow"]);
    assert!(
        out.status.success(),
        "member add failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("caught up"), "{text}");

    // As a learner it has all the data, and it does not vote.
    wait_visible(&ring, d, last, "early-19").await;
    let leader_view = status(&ring.procs[0]).await.unwrap();
    let m = leader_view.members.iter().find(|m| m.id == 4).unwrap();
    assert_eq!(m.role, "learner");
    assert!(
        ring.procs[d].log().contains("installed snapshot"),
        "{}",
        ring.procs[d].log()
    );

    let out = ring.ringctl(&["member", "promote", "d", "--output", "json"]);
    assert!(
        out.status.success(),
        "promote failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    eventually(
        Duration::from_secs(10),
        "d is a voter everywhere",
        || async {
            for p in &ring.procs {
                let s = status(p).await.ok()?;
                if s.members.iter().find(|m| m.id == 4)?.role != "voter" {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;

    // Remove it: it leaves the configuration, its id is retired, and its ringd exits (status 3).
    let out = ring.ringctl(&["member", "remove", "d", "--reason", "shrink"]);
    assert!(
        out.status.success(),
        "remove failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    eventually(
        Duration::from_secs(10),
        "d is gone from every remaining member's view",
        || async {
            for p in &ring.procs[..3] {
                let s = status(p).await.ok()?;
                if s.members.iter().any(|m| m.id == 4) {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
    let exit = ring.procs[d].wait_exit(Duration::from_secs(15));
    assert_eq!(
        exit.and_then(|s| s.code()),
        Some(3),
        "removed member exits with status 3:\n{}",
        ring.procs[d].log()
    );
    let out = ring.ringctl(&[
        "member",
        "add",
        "--id",
        "4",
        "--name",
        "e",
        "--zone",
        "zone-e",
        "--address",
        "127.0.0.1:1",
        "--admin-address",
        "127.0.0.1:2",
    ]);
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("never reused"));
}

#[tokio::test]
async fn leadership_can_be_transferred() {
    let ring = Ring::start(RingOptions::default());
    let old = ring.wait_leader(&[0, 1, 2], &[], FORM).await;
    let target = (1..=3).find(|id| *id != old).unwrap();
    let out = ring.ringctl(&["leader", "transfer", "--to", &target.to_string()]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let now = ring
        .wait_leader(&[0, 1, 2], &[old], Duration::from_secs(10))
        .await;
    assert_eq!(now, target);
}

/// A client that keeps an idle connection open (here: one whose runtime is blocked, so it
/// cannot even answer the server's GOAWAY) must not hold `ringd`'s exit on SIGTERM: the servers
/// drop open connections `SERVER_DRAIN_MS` after shutdown begins.
#[tokio::test]
async fn sigterm_exits_even_while_a_client_keeps_a_connection_open() {
    let mut ring = Ring::start(RingOptions {
        members: 1,
        ..RingOptions::default()
    });
    ring.wait_leader(&[0], &[], Duration::from_secs(20)).await;
    let client = ring.procs[0].client();
    client
        .call(pb::StatusRequest::default(), |mut c, r| async move {
            c.status(r).await
        })
        .await
        .expect("status");
    let started = Instant::now();
    // Blocks this (single-threaded) runtime: the client's connection stays open, unanswered.
    let status = ring.procs[0]
        .terminate_within(Duration::from_secs(15))
        .expect("ringd exits after SIGTERM while a client holds a connection");
    let took_ms = started.elapsed().as_millis();
    assert!(status.success(), "exit status {status:?}");
    let drain_ms = u128::from(garden_ring::node::SERVER_DRAIN_MS);
    assert!(
        took_ms < drain_ms + 10_000,
        "SIGTERM to exit took {took_ms} ms"
    );
    println!("SIGTERM -> exit with a client's connection open: {took_ms} ms");
    drop(client);
}
