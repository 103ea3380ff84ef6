//! Membership safety with real processes: a member that lost its data never rejoins under its
//! old id, a removed learner finds out and stops, a late founder joins the formed ring.

use std::time::Duration;

use garden_ring_tests::{Ring, RingOptions, eventually, status};

const FORM: Duration = Duration::from_secs(20);

/// Waits until member `i`'s view shows every listed member healthy.
async fn all_healthy(ring: &Ring, i: usize, ids: &[u64]) {
    eventually(FORM, "members healthy", || async {
        let s = status(&ring.procs[i]).await.ok()?;
        ids.iter()
            .all(|id| {
                s.members
                    .iter()
                    .any(|m| m.id == *id && m.health == "healthy")
            })
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn a_founder_that_lost_its_data_refuses_to_rejoin_and_is_replaced() {
    let mut ring = Ring::start(RingOptions::default());
    ring.wait_leader(&[0, 1, 2], &[], FORM).await;
    all_healthy(&ring, 0, &[1, 2, 3]).await;

    // Member c loses its disk.
    ring.procs[2].kill9();
    std::fs::remove_dir_all(&ring.procs[2].config.data_dir).unwrap();
    ring.procs[2].spawn();
    let exit = ring.procs[2].wait_exit(Duration::from_secs(10));
    assert_eq!(
        exit.and_then(|s| s.code()),
        Some(1),
        "c must refuse to start:\n{}",
        ring.procs[2].log()
    );
    let log = ring.procs[2].log();
    assert!(
        log.contains("lost its data") && log.contains("ringctl member remove 3"),
        "{log}"
    );

    // The operator's procedure: remove it, add it back under a new id on the same addresses.
    let out = ring.ringctl(&["member", "remove", "3", "--reason", "disk lost"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    std::fs::remove_dir_all(&ring.procs[2].config.data_dir).ok();
    let mut replacement = ring.procs[2].config.clone();
    replacement.id = 4;
    replacement.name = "c2".into();
    replacement.initial_members.clear();
    // A new member name needs its own certificate.
    if let Some(tls) = &mut replacement.tls {
        tls.files = garden_ring_tests::ensure_cert(
            &garden_ring_tests::certs_dir(ring.dir.path()),
            &garden_ring::tls::Identity::new(garden_ring::tls::Role::Member, "c2").unwrap(),
        );
    }
    ring.procs[2].config = replacement.clone();
    ring.procs[2].spawn();
    let out = ring.ringctl(&[
        "member",
        "add",
        "--id",
        "4",
        "--name",
        "c2",
        "--zone",
        &replacement.zone,
        "--address",
        &replacement.peer_address(),
        "--admin-address",
        &replacement.admin_address(),
        "--promote",
    ]);
    assert!(
        out.status.success(),
        "{}\n{}",
        String::from_utf8_lossy(&out.stderr),
        ring.logs()
    );
    all_healthy(&ring, 0, &[1, 2, 4]).await;
    eventually(
        FORM,
        "the replacement sees itself as a voter and id 3 gone",
        || async {
            let s = status(&ring.procs[2]).await.ok()?;
            let gone = s.members.iter().all(|m| m.id != 3);
            (gone && s.members.iter().find(|m| m.id == 4)?.role == "voter").then_some(())
        },
    )
    .await;
}

#[tokio::test]
async fn a_removed_learner_finds_out_and_stops() {
    let mut ring = Ring::start(RingOptions::default());
    ring.wait_leader(&[0, 1, 2], &[], FORM).await;
    let e = ring.joiner(5);
    ring.procs[e].spawn();
    let out = ring.ringctl_member_add(e, &[]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = ring.ringctl(&["member", "remove", "5"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // It hears from no leader any more; after member_lost_ms it asks its peers and stops.
    let lost_ms = ring.procs[e].config.timing.member_lost_ms;
    let exit = ring.procs[e].wait_exit(Duration::from_millis(lost_ms * 3 + 5_000));
    assert_eq!(
        exit.and_then(|s| s.code()),
        Some(3),
        "removed learner exits 3:\n{}",
        ring.procs[e].log()
    );
}

#[tokio::test]
async fn a_founder_starting_late_on_an_empty_directory_follows_the_formed_ring() {
    let mut ring = Ring::prepare(RingOptions::default());
    ring.procs[0].spawn();
    ring.procs[1].spawn();
    ring.wait_leader(&[0, 1], &[], FORM).await;
    let out = ring.ringctl(&[
        "cp",
        "add",
        "early",
        "--dns-name",
        "early.ring.test",
        "--endpoint-on",
        "a=10.0.0.1:1",
        "--endpoint-on",
        "b=10.0.0.2:1",
        "--backup",
        "s3://bkt/early",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    ring.procs[2].spawn();
    all_healthy(&ring, 0, &[1, 2, 3]).await;
    eventually(FORM, "c has the data", || async {
        let s = status(&ring.procs[2]).await.ok()?;
        s.control_planes
            .iter()
            .any(|c| c.name == "early")
            .then_some(())
    })
    .await;
    assert!(
        ring.procs[2]
            .log()
            .contains("following it as a founding member"),
        "{}",
        ring.procs[2].log()
    );
    assert!(ring.procs[2].is_running());
}
