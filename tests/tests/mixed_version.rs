//! Rolling upgrades against the real previous release (issue 43): a ring started on release
//! 0.1.0's binaries (built from this repository's history by `scripts/previous-release.sh`),
//! upgraded one member at a time to this tree's, followers first, then the leader.
//!
//! - While the ring is mixed it keeps working (writes commit, every member applies them) and
//!   stays at ring version 1; once every member runs this release the leader raises it to 2
//!   by itself, and from then on a 0.1.0 `ringd` refuses the data directory, naming both
//!   versions.
//! - With `[upgrade] finalize = "manual"`, the ring stays at version 1 after every member is
//!   upgraded, any member can go back to 0.1.0 (and the ring keeps working), and `ringctl
//!   upgrade finalize` raises it; then `ringctl upgrade hold` works.
//! - A `ringctl snapshot save` file written by 0.1.0's ringctl is restored by this release's.
//! - A member of 0.1.0 that fell behind catches up by installing a snapshot of a leader of
//!   this release, and a member of this release one of a leader of 0.1.0.
//! - With the etcd driver: while the ring is mixed, a switchover from a 0.1.0 host to one of
//!   this release loses no acknowledged write (this release restores the final snapshot 0.1.0
//!   wrote), and a zone kill of a 0.1.0 host fails over to a member of this release with every
//!   write 0.1.0's delta snapshots hold.
//! - At the end every member holds the same state (as etcd compares `HashKV`).

use std::path::{Path, PathBuf};
use std::time::Duration;

use garden_ring::pb;
use garden_ring_tests::{
    Ring, RingOptions, add_control_plane, control_plane, eventually, previous_release, status,
};

const FORM: Duration = Duration::from_secs(30);

/// Stops member `i` (SIGTERM), then starts `ringd` (`None`: this tree's) on its data
/// directory, and waits until it answers and has applied what the others have.
async fn restart_on(ring: &mut Ring, i: usize, ringd: Option<PathBuf>) {
    assert!(
        ring.procs[i].terminate().is_some_and(|s| s.success()),
        "member {i} did not stop cleanly:\n{}",
        ring.procs[i].log()
    );
    ring.procs[i].ringd = ringd;
    ring.procs[i].spawn();
    caught_up(ring, i).await;
}

/// Waits until member `i` answers and has applied at least what the leader had applied when
/// this was called, and every member sees every member healthy.
async fn caught_up(ring: &Ring, i: usize) {
    let target = leader_applied(ring).await;
    eventually(FORM, "the restarted member catches up", || async {
        let s = status(&ring.procs[i]).await.ok()?;
        (s.applied_index >= target && s.leader_id != 0).then_some(())
    })
    .await;
    garden_ring_tests::wait_all_healthy(ring).await;
}

/// The applied index of the leader, as the first member that answers names it.
async fn leader_applied(ring: &Ring) -> u64 {
    eventually(FORM, "a leader answers", || async {
        for p in &ring.procs {
            let Ok(s) = status(p).await else { continue };
            let leader = ring.procs.iter().find(|q| q.config.id == s.leader_id)?;
            return status(leader).await.ok().map(|l| l.applied_index);
        }
        None
    })
    .await
}

/// The index of the member that leads now.
async fn leader(ring: &Ring) -> usize {
    let id = ring.wait_leader(&[0, 1, 2], &[], FORM).await;
    ring.index_of(id)
}

/// Waits until every member runs at ring version `version`.
async fn all_at(ring: &Ring, version: u32) {
    eventually(FORM, "every member runs at the ring version", || async {
        for p in &ring.procs {
            let s = status(p).await.ok()?;
            if s.ring_version.map(|v| v.active) != Some(version) {
                return None;
            }
        }
        Some(())
    })
    .await;
}

/// Waits until every member says the ring can be raised to `next` (the leader heard every
/// member on a binary that supports it, and told them).
async fn next_is(ring: &Ring, next: u32) {
    eventually(FORM, "every member reports this release", || async {
        for p in &ring.procs {
            if status(p).await.ok()?.ring_version?.next != next {
                return None;
            }
        }
        Some(())
    })
    .await;
}

/// Commits `n` control planes named `prefix-k` through the ring.
async fn write(ring: &Ring, prefix: &str, n: usize) {
    for k in 0..n {
        add_control_plane(
            &ring.client(),
            control_plane(&format!("{prefix}-{k}"), None),
        )
        .await
        .unwrap_or_else(|e| panic!("write {prefix}-{k}: {e}"));
    }
}

/// What every member must agree on: members (id, name, role) and control planes (name, host,
/// epoch, phase), compared when all have applied the same index (the ring keeps committing
/// reports meanwhile, so the members are read until they answer at one index). Two members at
/// the same index holding different states fail the test at once.
async fn same_state_everywhere(ring: &Ring) {
    type Seen = (
        Vec<(u64, String, String)>,
        Vec<(String, String, u64, String)>,
    );
    eventually(
        FORM,
        "every member answers at the same applied index",
        || async {
            let mut seen: Vec<(u64, Seen)> = Vec::new();
            for p in &ring.procs {
                let s = status(p).await.ok()?;
                let mut members: Vec<_> = s
                    .members
                    .iter()
                    .map(|m| (m.id, m.name.clone(), m.role.clone()))
                    .collect();
                members.sort();
                let mut cps: Vec<_> = s
                    .control_planes
                    .iter()
                    .map(|c| (c.name.clone(), c.host.clone(), c.epoch, c.phase.clone()))
                    .collect();
                cps.sort();
                seen.push((s.applied_index, (members, cps)));
            }
            if seen.iter().any(|(index, _)| *index != seen[0].0) {
                return None;
            }
            for (i, s) in seen.iter().enumerate().skip(1) {
                assert_eq!(
                    &seen[0], s,
                    "members 0 and {i} hold different states at one index"
                );
            }
            Some(())
        },
    )
    .await;
}

fn ringctl(ring: &Ring, args: &[&str]) -> (bool, String) {
    let endpoints: Vec<String> = ring.procs.iter().map(|p| p.admin()).collect();
    let out = garden_ring_tests::ringctl(&ring.client_config, &endpoints, args);
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

/// Snapshots every this many entries in the test rings (five kept behind), so a member down
/// for a few dozen writes catches up by snapshot.
const SNAPSHOT_EVERY: u64 = 20;

/// A three-member ring on release 0.1.0's binaries, with a few control planes.
async fn old_ring(old: &Path) -> Ring {
    let mut ring = Ring::prepare(RingOptions {
        snapshot_every: SNAPSHOT_EVERY,
        snapshot_keep: 5,
        ..RingOptions::default()
    });
    for p in &mut ring.procs {
        p.ringd = Some(old.join("ringd"));
        p.spawn();
    }
    leader(&ring).await;
    garden_ring_tests::wait_all_healthy(&ring).await;
    write(&ring, "old", 5).await;
    ring
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_ring_of_the_previous_release_upgrades_member_by_member_and_raises_its_version() {
    let Some(old) = previous_release() else {
        return;
    };
    let mut ring = old_ring(&old).await;
    let s = status(&ring.procs[0]).await.unwrap();
    assert!(s.ring_version.is_none(), "0.1.0 reports no ring version");
    // A backup of the ring's state, as 0.1.0's ringctl writes it.
    let saved = ring.dir.path().join("by-0.1.0.snap");
    let endpoints: Vec<String> = ring.procs.iter().map(|p| p.admin()).collect();
    let out = garden_ring_tests::ringctl_of(
        &old.join("ringctl"),
        &ring.client_config,
        &endpoints,
        &["snapshot", "save", &saved.display().to_string()],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Followers first: the ring is mixed, keeps working and stays at version 1. The first one
    // is down while the others write past their snapshot and trim their logs: started on this
    // release, it catches up by installing a snapshot of the leader of 0.1.0.
    let l = leader(&ring).await;
    let first = (0..3).find(|&i| i != l).unwrap();
    assert!(ring.procs[first].terminate().is_some_and(|s| s.success()));
    write(&ring, "lagging", 3 * SNAPSHOT_EVERY as usize).await;
    let logged_before = ring.procs[first].log().len();
    ring.procs[first].ringd = None;
    ring.procs[first].spawn();
    caught_up(&ring, first).await;
    let installed = ring.procs[first].log()[logged_before..].to_string();
    assert!(
        installed.contains("installed snapshot"),
        "the member of this release caught up without 0.1.0's snapshot:\n{installed}"
    );
    same_state_everywhere(&ring).await;
    for i in (0..3).filter(|&i| i != l) {
        if i != first {
            restart_on(&mut ring, i, None).await;
        }
        write(&ring, &format!("mixed-{i}"), 3).await;
        let v = status(&ring.procs[i]).await.unwrap().ring_version.unwrap();
        assert_eq!(v.active, 1, "raised while a member runs 0.1.0");
    }
    // The leader last: a new binary leads, hears every member on this release and raises.
    restart_on(&mut ring, l, None).await;
    all_at(&ring, 2).await;
    write(&ring, "new", 3).await;
    let (ok, text) = ringctl(&ring, &["upgrade", "status"]);
    assert!(ok, "{text}");
    assert!(text.contains("ring version: 2"), "{text}");
    assert!(!text.contains("MIXED"), "{text}");
    let (ok, text) = ringctl(&ring, &["history"]);
    assert!(ok && text.contains("ring.version"), "{text}");
    same_state_everywhere(&ring).await;

    // Now 0.1.0 cannot take part: its ringd refuses the data directory, naming both encodings.
    let i = (l + 1) % 3;
    ring.procs[i].terminate();
    ring.procs[i].ringd = Some(old.join("ringd"));
    ring.procs[i].spawn();
    let exited = ring.procs[i].wait_exit(FORM);
    let log = ring.procs[i].log();
    assert!(
        exited.is_some_and(|s| !s.success()),
        "0.1.0 started on a directory of ring version 2:\n{log}"
    );
    assert!(
        log.contains("storage encoding 2") && log.contains("reads encoding 1"),
        "{log}"
    );
    // This release starts on it again, and nothing was lost.
    ring.procs[i].ringd = None;
    ring.procs[i].spawn();
    caught_up(&ring, i).await;
    same_state_everywhere(&ring).await;
    let names: Vec<String> = status(&ring.procs[i])
        .await
        .unwrap()
        .control_planes
        .into_iter()
        .map(|c| c.name)
        .collect();
    let l_now = leader(&ring).await;
    let mixed = (0..3).find(|&k| k != l).unwrap();
    for w in [
        "old-0".to_string(),
        "old-4".into(),
        format!("mixed-{mixed}-2"),
        "new-2".into(),
    ] {
        assert!(names.contains(&w), "{w} lost: {names:?} (leader {l_now})");
    }

    // This release restores the file 0.1.0 saved (into a new directory; nothing runs there).
    let target = ring.dir.path().join("restored");
    let config = ring.procs[0].config_path.display().to_string();
    let (ok, text) = ringctl(
        &ring,
        &[
            "snapshot",
            "restore",
            &saved.display().to_string(),
            "--ringd-config",
            &config,
            "--data-dir",
            &target.display().to_string(),
            "--yes",
        ],
    );
    assert!(ok, "restoring 0.1.0's snapshot file: {text}");
    assert!(target.join("ring.redb").is_file(), "{text}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn until_finalized_any_member_can_go_back_to_the_previous_release() {
    let Some(old) = previous_release() else {
        return;
    };
    let mut ring = old_ring(&old).await;
    // An operator who wants to verify before finalizing: the upgraded members hold.
    for p in &mut ring.procs {
        p.config.upgrade.finalize = garden_ring::config::Finalize::Manual;
    }
    let l = leader(&ring).await;
    let order: Vec<usize> = (0..3).filter(|&i| i != l).chain([l]).collect();
    for &i in &order {
        restart_on(&mut ring, i, None).await;
    }
    write(&ring, "upgraded", 3).await;
    next_is(&ring, 2).await;
    let (ok, text) = ringctl(&ring, &["upgrade", "status"]);
    assert!(ok, "{text}");
    assert!(
        text.contains("ring version: 1") && text.contains("ring version 2 is available"),
        "{text}"
    );
    // A hold cannot be recorded at version 1 (0.1.0 could not read it).
    let (ok, text) = ringctl(&ring, &["upgrade", "hold", "--reason", "verify"]);
    assert!(!ok && text.contains("finalize = \"manual\""), "{text}");

    // Roll the leader back to 0.1.0 (its config without the [upgrade] section 0.1.0 does
    // not know): the ring keeps working beside it.
    // While it is down, the others write past their snapshot and trim their logs: the member
    // of 0.1.0 catches up by installing a snapshot from a leader of this release.
    let l = leader(&ring).await;
    ring.procs[l].config.upgrade = Default::default();
    assert!(ring.procs[l].terminate().is_some_and(|s| s.success()));
    write(&ring, "while-down", 3 * SNAPSHOT_EVERY as usize).await;
    ring.procs[l].ringd = Some(old.join("ringd"));
    let before = ring.procs[l].log().len();
    ring.procs[l].spawn();
    caught_up(&ring, l).await;
    let installed = ring.procs[l]
        .log()
        .get(before..)
        .unwrap_or_default()
        .to_string();
    write(&ring, "rolled-back", 3).await;
    // Once the leader heard the rolled-back member, nobody offers version 2: a leader of this
    // release names it, or the member of 0.1.0 leads (and tells nobody what it heard). Until
    // its first renewal (0.1.0 waits a lease and a half after a restart before it renews),
    // the leader counts it as not heard from, not on its previous process's word.
    let old_id = ring.procs[l].config.id;
    eventually(FORM, "the leader hears the member of 0.1.0", || async {
        let s = status(&ring.procs[(l + 1) % 3]).await.ok()?;
        if s.leader_id == old_id {
            return Some(());
        }
        let leader = ring.procs.iter().find(|p| p.config.id == s.leader_id)?;
        let v = status(leader).await.ok()?.ring_version?;
        assert_eq!(v.active, 1);
        (v.next == 0 && v.next_blocked.contains("runs 0.1.0")).then_some(())
    })
    .await;
    assert!(
        installed.contains("installed snapshot"),
        "the member of 0.1.0 caught up without a snapshot:\n{installed}"
    );
    // Refused either way: by a leader of 0.1.0 (no such method), or by one of this release
    // (a member runs 0.1.0).
    let (ok, text) = ringctl(&ring, &["upgrade", "finalize"]);
    assert!(!ok && text.contains("0.1.0"), "{text}");
    same_state_everywhere(&ring).await;

    // Forward again, then finalize by hand.
    ring.procs[l].config.upgrade.finalize = garden_ring::config::Finalize::Manual;
    restart_on(&mut ring, l, None).await;
    next_is(&ring, 2).await;
    // A leader elected during the restarts may not have heard every member yet: it says so,
    // and the operator runs it again.
    eventually(FORM, "finalize is accepted", || async {
        let (ok, text) = ringctl(&ring, &["upgrade", "finalize", "--reason", "verified"]);
        assert!(ok || text.contains("not heard from yet"), "{text}");
        ok.then_some(())
    })
    .await;
    all_at(&ring, 2).await;
    let (ok, text) = ringctl(&ring, &["upgrade", "hold", "--reason", "next release"]);
    assert!(ok && text.contains("HELD"), "{text}");
    let s: pb::StatusResponse = status(&ring.procs[0]).await.unwrap();
    assert!(s.ring_version.unwrap().held);
    let (ok, text) = ringctl(&ring, &["upgrade", "release"]);
    assert!(ok, "{text}");
    write(&ring, "final", 2).await;
    same_state_everywhere(&ring).await;
}

/// A writer's keys on `endpoint`: puts `/registry/<prefix>NNNNNN` until `stop`, retrying each
/// until acknowledged (on a new connection); the acknowledged ones.
async fn write_keys(
    endpoint: String,
    prefix: &'static str,
    stop: tokio::sync::watch::Receiver<bool>,
) -> Vec<String> {
    use garden_ring::backup::etcd::EtcdClient;
    let mut acked = Vec::new();
    let mut client: Option<EtcdClient> = None;
    for i in 0.. {
        if *stop.borrow() {
            break;
        }
        let key = format!("/registry/{prefix}{i:06}");
        loop {
            if *stop.borrow() {
                return acked;
            }
            if client.is_none() {
                client = EtcdClient::connect(&endpoint, garden_ring_tests::etcd::fast())
                    .await
                    .ok();
            }
            if let Some(c) = &client
                && c.put(key.as_bytes(), b"v").await.is_ok()
            {
                acked.push(key);
                break;
            }
            client = None;
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    acked
}

/// The keys under `/registry/<prefix>` that `cp` holds at its host.
async fn keys_of(cp: &pb::ControlPlane, prefix: &str) -> std::collections::BTreeSet<String> {
    use garden_ring::backup::etcd::EtcdClient;
    let endpoint = format!("http://{}", cp.endpoints[&cp.host]);
    let client = EtcdClient::connect(&endpoint, garden_ring_tests::etcd::fast())
        .await
        .unwrap_or_else(|e| panic!("{} at {endpoint}: {e}", cp.name));
    client
        .get_prefix_keys(format!("/registry/{prefix}").as_bytes())
        .await
        .unwrap()
        .into_iter()
        .map(|kv| String::from_utf8(kv.key).unwrap())
        .collect()
}

/// `name` as the ring sees it once it runs on a member other than `not_on` (any, when empty).
async fn running_off(ring: &Ring, name: &str, not_on: &str) -> pb::ControlPlane {
    eventually(FORM, &format!("{name} runs off {not_on:?}"), || async {
        let cp = garden_ring_tests::cps(ring, &[0, 1, 2])
            .await
            .remove(name)?;
        (cp.phase == "running" && !cp.host.is_empty() && cp.host != not_on).then_some(cp)
    })
    .await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn etcd_control_planes_switch_over_and_fail_over_while_the_ring_is_mixed() {
    let Some(old) = previous_release() else {
        return;
    };
    // A 0.1.0 ring whose members run etcd (delta snapshots every 300 ms).
    let mut ring = Ring::prepare(RingOptions {
        driver: garden_ring_tests::etcd::driver_with_deltas(3_600_000, 300),
        ..RingOptions::default()
    });
    for p in &mut ring.procs {
        p.ringd = Some(old.join("ringd"));
        p.spawn();
    }
    let l = leader(&ring).await;
    garden_ring_tests::wait_all_healthy(&ring).await;
    let upgraded = (0..3).find(|&i| i != l).unwrap();
    let old_follower = (0..3).find(|&i| i != l && i != upgraded).unwrap();
    let name_of = |i: usize| ring.procs[i].config.name.clone();
    let (new_name, old_name, leader_name) = (name_of(upgraded), name_of(old_follower), name_of(l));
    // Both control planes start on the follower that stays on 0.1.0: its backups, written by
    // 0.1.0, are what this release restores.
    for cp in ["switched", "failed"] {
        let backups = garden_ring_tests::etcd::file_backups(ring.dir.path(), cp);
        let req = garden_ring_tests::etcd::etcd_control_plane(
            cp,
            &old_name,
            &backups[&old_name],
            backups.clone(),
        );
        add_control_plane(&ring.client(), req).await.unwrap();
    }
    let failed = garden_ring_tests::running_on_within(&ring, "failed", &old_name, FORM).await;
    let switched = garden_ring_tests::running_on_within(&ring, "switched", &old_name, FORM).await;

    // Mixed: one follower on this release.
    restart_on(&mut ring, upgraded, None).await;

    // A switchover from the 0.1.0 member to the upgraded one under a writer: the new host
    // restores the final snapshot 0.1.0 wrote; nothing acknowledged is lost.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let endpoint = format!("http://{}", switched.endpoints[&old_name]);
    let writer = tokio::spawn(write_keys(endpoint, "s", stopped));
    tokio::time::sleep(Duration::from_millis(300)).await;
    let (ok, text) = ringctl(
        &ring,
        &[
            "switchover",
            "switched",
            "--to",
            &new_name,
            "--reason",
            "mixed",
        ],
    );
    assert!(ok, "{text}");
    let moved = garden_ring_tests::running_on_within(&ring, "switched", &new_name, FORM).await;
    let _ = stop.send(true);
    let acked = writer.await.unwrap();
    let got = keys_of(&moved, "s").await;
    let missing = acked.iter().filter(|k| !got.contains(*k)).count();
    assert!(acked.len() > 10, "only {} writes acknowledged", acked.len());
    assert_eq!(
        missing,
        0,
        "{missing} of {} acknowledged writes lost",
        acked.len()
    );
    let switched_acked = acked.len();

    // A zone kill of the 0.1.0 member: its control plane comes back elsewhere with every key
    // its stored deltas hold (0.1.0's backups, restored by whichever member takes it).
    let endpoint = format!("http://{}", failed.endpoints[&old_name]);
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let writer = tokio::spawn(write_keys(endpoint, "f", stopped));
    tokio::time::sleep(Duration::from_millis(500)).await;
    let _ = stop.send(true);
    let acked = writer.await.unwrap();
    // Wait until the backups hold every acknowledged write (the host reports their revision).
    let written_revision = eventually(FORM, "the writes' revision", || async {
        let cp = garden_ring_tests::cps(&ring, &[0, 1, 2])
            .await
            .remove("failed")?;
        let endpoint = format!("http://{}", cp.endpoints[&old_name]);
        let c = garden_ring::backup::etcd::EtcdClient::connect(
            &endpoint,
            garden_ring_tests::etcd::fast(),
        )
        .await
        .ok()?;
        c.status().await.ok().map(|s| s.revision)
    })
    .await;
    eventually(FORM, "the deltas hold every write", || async {
        let cp = garden_ring_tests::cps(&ring, &[0, 1, 2])
            .await
            .remove("failed")?;
        (cp.backup_status?.revision >= written_revision).then_some(())
    })
    .await;
    // The leader (still on 0.1.0) is cordoned: the failover goes to the upgraded member, so
    // this release restores what 0.1.0 stored.
    let (ok, text) = ringctl(
        &ring,
        &[
            "member",
            "cordon",
            &leader_name,
            "--reason",
            "fail over to this release",
        ],
    );
    assert!(ok, "{text}");
    ring.kill_zone(old_follower);
    let moved = running_off(&ring, "failed", &old_name).await;
    assert_eq!(moved.host, new_name, "{moved:?}");
    let got = keys_of(&moved, "f").await;
    let missing = acked.iter().filter(|k| !got.contains(*k)).count();
    assert_eq!(
        missing,
        0,
        "{missing} of {} snapshotted writes lost ({} restored it)",
        acked.len(),
        moved.host
    );
    println!(
        "mixed ring: switchover {old_name} (0.1.0) -> {new_name} (this release) lost 0 of {} \
         writes; {old_name} (0.1.0) killed, `failed` restored by {} (this release) from 0.1.0's \
         backups with all {} snapshotted writes",
        switched_acked,
        moved.host,
        acked.len()
    );

    let (ok, text) = ringctl(
        &ring,
        &["member", "uncordon", &leader_name, "--reason", "done"],
    );
    assert!(ok, "{text}");
    // The rest upgraded (the killed member on this release, then the leader): the ring is
    // raised and every member agrees.
    ring.procs[old_follower].ringd = None;
    ring.procs[old_follower].spawn();
    caught_up(&ring, old_follower).await;
    let l = leader(&ring).await;
    if ring.procs[l].ringd.is_some() {
        restart_on(&mut ring, l, None).await;
    }
    all_at(&ring, 2).await;
    same_state_everywhere(&ring).await;
}
