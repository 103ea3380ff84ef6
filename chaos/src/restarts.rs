//! What a rolling restart or upgrade costs the etcds it leaves running: which of them were
//! restarted (a new process), found by their data directories in `/proc`, and waiting until a
//! restarted `ringd` is back in the ring before the next one goes.

use std::collections::BTreeMap;
use std::time::Duration;

use garden_ring::pb;

use crate::world::{self, World};

/// The pid of every etcd running on this machine, by the control plane its data directory
/// (`.../<control plane>/epoch-<N>/etcd`) names.
pub fn etcd_pids() -> BTreeMap<String, u32> {
    garden_ring::process::command_lines()
        .into_iter()
        .filter_map(|(pid, args)| Some((control_plane_of_etcd(&args)?, u32::try_from(pid).ok()?)))
        .collect()
}

/// The control plane an etcd command line serves, from its `--data-dir`.
fn control_plane_of_etcd(args: &[String]) -> Option<String> {
    if garden_ring::process::program(args) != Some("etcd") {
        return None;
    }
    let dir = args
        .iter()
        .position(|a| a == "--data-dir")
        .and_then(|i| args.get(i + 1))?;
    let epoch_dir = std::path::Path::new(dir).parent()?;
    epoch_dir
        .file_name()?
        .to_str()?
        .starts_with("epoch-")
        .then(|| {
            epoch_dir
                .parent()?
                .file_name()?
                .to_str()
                .map(str::to_string)
        })?
}

/// The control planes whose etcd is another process in `after` than in `before` (or gone).
pub fn restarted(before: &BTreeMap<String, u32>, after: &BTreeMap<String, u32>) -> Vec<String> {
    before
        .iter()
        .filter(|(cp, pid)| after.get(*cp) != Some(*pid))
        .map(|(cp, _)| cp.clone())
        .collect()
}

/// Waits until member `i` answers a linearizable read of its own (it runs, knows the leader
/// and has caught up with it): back in the ring.
pub async fn back_in_the_ring(world: &World, i: usize) -> anyhow::Result<()> {
    let name = world.members[i].name.clone();
    world::wait_for(
        Duration::from_secs(30),
        &format!("{name} is back in the ring"),
        || async {
            let s = world.per_member[i]
                .call_once(
                    pb::StatusRequest { stale: false },
                    &mut |mut c, r| async move { c.status(r).await },
                )
                .await
                .ok()?;
            s.freshness.filter(|f| f.linearizable).map(|_| ())
        },
    )
    .await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_etcd_is_named_by_its_data_directory() {
        let line = |args: &[&str]| garden_ring::process::split(args.join("\0").as_bytes());
        let etcd = line(&[
            "/usr/bin/etcd",
            "--name",
            "cp-1",
            "--data-dir",
            "/tmp/x/a/data/etcd/cp-1/epoch-3/etcd",
        ]);
        assert_eq!(control_plane_of_etcd(&etcd), Some("cp-1".into()));
        let guard = line(&[
            "ring-guard",
            "--",
            "etcd",
            "--data-dir",
            "/x/cp-1/epoch-3/etcd",
        ]);
        assert_eq!(control_plane_of_etcd(&guard), None, "the guard is not etcd");
        let other = line(&["etcd", "--data-dir", "/var/lib/etcd"]);
        assert_eq!(control_plane_of_etcd(&other), None);
        let before = BTreeMap::from([("a".to_string(), 1), ("b".to_string(), 2)]);
        let after = BTreeMap::from([("a".to_string(), 1), ("b".to_string(), 3)]);
        assert_eq!(restarted(&before, &after), ["b"]);
        assert!(restarted(&before, &before).is_empty());
    }
}
