//! The `stale-disk` fault (issue 42): an operator's mistake made on purpose. A member's
//! `ringd` is stopped, its data directory copied, started again; the ring commits changes it
//! acknowledges; then it is stopped, the old copy put back, and started. The leader must find
//! it diverged ([`garden_ring::raft::divergence`]), keep it lost and move what it hosts.

use std::time::{Duration, Instant};

use anyhow::Context;
use garden_ring::pb;

use crate::scenario::Timeline;
use crate::world::World;

/// Changes the ring commits while the victim acknowledges them, after its data directory was
/// copied (label writes on the victim member: no side effects).
const STALE_DISK_CHANGES: usize = 20;

/// stale-disk: stops the victim's ringd, copies its data directory, starts it, commits
/// [`STALE_DISK_CHANGES`] changes, stops it, puts the copy back and starts it; returns the
/// timeline times of that last stop (its machine's processes killed with it: nothing the
/// member acknowledges later can be on the disk that is then replaced, so the loss of data
/// counts from here) and of that last start (the fault the ring must find).
pub(crate) async fn run(
    world: &mut World,
    victim_index: usize,
    dir: &std::path::Path,
    timeline: &mut Timeline,
) -> anyhow::Result<(u64, u64)> {
    let name = world.members[victim_index].name.clone();
    let zone = world.members[victim_index].zone.clone();
    let data = world.members[victim_index]
        .ringd
        .log
        .parent()
        .map(|home| home.join("data"))
        .context("the victim's home")?;
    let copy = dir.join("stale-copy");
    let stop = |world: &mut World| -> anyhow::Result<()> {
        world.members[victim_index]
            .ringd
            .signal(nix::sys::signal::Signal::SIGTERM);
        if !world.members[victim_index]
            .ringd
            .wait_exit(Duration::from_secs(10))
        {
            anyhow::bail!("ringd {name} did not stop within 10 s of SIGTERM");
        }
        // The machine stops as a whole (a VM restored from a disk snapshot, a directory
        // copied back while nothing runs): the etcds its ringd left serving under their
        // guards (for the next ringd to adopt) go with it.
        garden_ring_tests::kill_processes_under(&data);
        Ok(())
    };
    stop(world)?;
    let _ = std::fs::remove_dir_all(&copy);
    garden_ring_tests::copy_dir(&data, &copy).context("copying the victim's data directory")?;
    world.members[victim_index].ringd.spawn()?;
    timeline.add(
        "fault",
        &zone,
        format!("ringd {name} restarted; its data directory copied while it was stopped"),
    );
    let mut committed = 0;
    let until = Instant::now() + Duration::from_secs(30);
    while committed < STALE_DISK_CHANGES && Instant::now() < until {
        let labels = [("stale-disk".to_string(), committed.to_string())].into();
        // On the member, not a control plane: the registry's clients own those labels.
        let request = pb::MemberLabelRequest {
            member: name.clone(),
            labels,
            reason: "stale-disk: changes the victim acknowledges".into(),
        };
        if world
            .admin
            .call(request, |mut c, r| async move { c.member_label(r).await })
            .await
            .is_ok()
        {
            committed += 1;
        }
    }
    anyhow::ensure!(
        committed == STALE_DISK_CHANGES,
        "only {committed} of {STALE_DISK_CHANGES} changes committed in 30 s"
    );
    // Give the victim time to acknowledge them (it is a healthy follower now).
    tokio::time::sleep(Duration::from_millis(500)).await;
    stop(world)?;
    // Writes its guard acknowledged after the farewell's last delta, until now, were on this
    // disk only (less than a delta period's worth): the old copy replaces them.
    let stopped_at = timeline.add(
        "fault",
        &zone,
        format!("ringd {name} stopped, its machine's processes with it"),
    );
    std::fs::remove_dir_all(&data)?;
    garden_ring_tests::copy_dir(&copy, &data).context("putting the old copy back")?;
    world.members[victim_index].ringd.spawn()?;
    let started_at = timeline.add(
        "fault",
        &zone,
        format!("ringd {name} started on the old copy of its data directory"),
    );
    Ok((stopped_at, started_at))
}
