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
//!   this release.
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

    // Followers first: the ring is mixed, keeps working and stays at version 1.
    let l = leader(&ring).await;
    for i in (0..3).filter(|&i| i != l) {
        restart_on(&mut ring, i, None).await;
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
