//! Self-healing with real processes: three `ringd`, the `exec` driver running a workload per
//! control plane that records when it serves, and `ring-guard` enforcing leases.
//!
//! Loopback timings: lease 1000 ms, fence 500 ms, clock margin 200 ms, member lost after
//! 2000 ms. Each test prints what it measured.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use garden_ring::pb;
use garden_ring_tests::{
    Ring, RingOptions, add_control_plane, add_running, assert_no_overlap, control_plane, cps,
    eventually, served, status,
};
use nix::sys::signal::Signal;

const FORM: Duration = Duration::from_secs(20);

fn unix_ns() -> u128 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}

/// A ring whose workloads record into `ring.dir/serving-*.log`.
fn recording_ring() -> Ring {
    Ring::start_recording(RingOptions::default())
}

/// Waits until every control plane in `moved` runs on another member than `from` at a higher
/// epoch, and returns, per control plane, the milliseconds from `since` to when it was seen
/// running there.
async fn wait_moved(
    ring: &Ring,
    among: &[usize],
    moved: &BTreeMap<String, pb::ControlPlane>,
    from: &str,
    since: Instant,
) -> BTreeMap<String, u128> {
    let mut done = BTreeMap::new();
    let deadline = since + Duration::from_secs(20);
    while done.len() < moved.len() {
        assert!(
            Instant::now() < deadline,
            "not all moved off {from}: {done:?}\n{}",
            ring.logs()
        );
        let now = cps(ring, among).await;
        for (name, before) in moved {
            let cp = &now[name];
            if !done.contains_key(name)
                && cp.phase == "running"
                && cp.host != from
                && cp.epoch > before.epoch
            {
                done.insert(name.clone(), since.elapsed().as_millis());
            }
        }
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    done
}

fn hosted_by(
    all: &BTreeMap<String, pb::ControlPlane>,
    member: &str,
) -> BTreeMap<String, pb::ControlPlane> {
    all.iter()
        .filter(|(_, c)| c.host == member)
        .map(|(n, c)| (n.clone(), c.clone()))
        .collect()
}

#[tokio::test]
async fn killing_a_host_moves_its_control_planes_and_nothing_serves_twice() {
    let mut ring = recording_ring();
    let leader = ring.wait_leader(&[0, 1, 2], &[], FORM).await;
    let victim = (0..3).find(|&i| ring.procs[i].config.id != leader).unwrap();
    let victim_name = ring.procs[victim].config.name.clone();
    let others: Vec<&str> = ["a", "b", "c"]
        .into_iter()
        .filter(|n| *n != victim_name)
        .collect();
    // Two control planes on the victim (homes elsewhere), one elsewhere.
    add_running(
        &ring,
        &[
            ("x1", Some(others[0]), Some(&victim_name)),
            ("x2", Some(others[1]), Some(&victim_name)),
            ("y", None, Some(others[0])),
        ],
    )
    .await;
    let moved = hosted_by(&cps(&ring, &[0, 1, 2]).await, &victim_name);
    assert_eq!(moved.len(), 2, "{moved:?}");

    let killed_at = Instant::now();
    let killed_ns = unix_ns();
    ring.procs[victim].kill9();
    let survivors: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
    let times = wait_moved(&ring, &survivors, &moved, &victim_name, killed_at).await;
    println!(
        "kill -9 of {victim_name}'s ringd -> running on a survivor, per control plane (ms): {times:?}"
    );

    let now = cps(&ring, &survivors).await;
    for (name, before) in &moved {
        let cp = &now[name];
        assert!(cp.epoch > before.epoch);
        assert_ne!(cp.host, cp.home, "never at home");
        // The move is recorded as a migration from the lost host, done once it served.
        let m = cp.migration.as_ref().expect("a migration is recorded");
        assert_eq!(
            (m.epoch, m.from.as_str(), m.to.as_str(), m.step.as_str()),
            (cp.epoch, victim_name.as_str(), cp.host.as_str(), "done"),
            "{m:?}"
        );
        let stretches = served(ring.dir.path(), name);
        assert_no_overlap(name, &stretches);
        let old = stretches
            .iter()
            .find(|s| s.member == victim_name)
            .expect("the victim served it");
        let fenced_after_ms = (old.to_ns.saturating_sub(killed_ns)) / 1_000_000;
        println!(
            "{name}: the orphaned workload on {victim_name} served until {fenced_after_ms} ms after the kill (lease 1000 ms); the new one started {} ms after that",
            (stretches.last().unwrap().from_ns - old.to_ns) / 1_000_000
        );
        assert!(
            fenced_after_ms <= 1_000 + 500 + 100,
            "fenced late: {fenced_after_ms} ms"
        );
    }
    // The control plane that was elsewhere did not move.
    assert_eq!(now["y"].epoch, 1);
}

#[tokio::test]
async fn a_frozen_ringd_is_fenced_by_its_guard_and_does_not_serve_again() {
    frozen_host_is_fenced_and_does_not_serve_again(false).await;
}

/// The same with the leader frozen: the new leader counts its silence from the survivors' last
/// contact with it, not from its own election, and still moves only after its guard stopped.
#[tokio::test]
async fn a_frozen_leader_is_fenced_by_its_guard_before_its_control_plane_moves() {
    frozen_host_is_fenced_and_does_not_serve_again(true).await;
}

async fn frozen_host_is_fenced_and_does_not_serve_again(freeze_the_leader: bool) {
    let ring = recording_ring();
    let leader = ring.wait_leader(&[0, 1, 2], &[], FORM).await;
    let victim = (0..3)
        .find(|&i| (ring.procs[i].config.id == leader) == freeze_the_leader)
        .unwrap();
    let victim_name = ring.procs[victim].config.name.clone();
    let other = ["a", "b", "c"]
        .into_iter()
        .find(|n| *n != victim_name)
        .unwrap();
    add_running(&ring, &[("z", Some(other), Some(&victim_name))]).await;
    let moved = hosted_by(&cps(&ring, &[0, 1, 2]).await, &victim_name);
    assert_eq!(moved.len(), 1, "z runs on {victim_name} before the freeze");

    let stopped_at = Instant::now();
    let stopped_ns = unix_ns();
    ring.procs[victim].signal(Signal::SIGSTOP);
    let survivors: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
    let times = wait_moved(&ring, &survivors, &moved, &victim_name, stopped_at).await;
    println!("SIGSTOP of {victim_name}'s ringd -> running elsewhere (ms): {times:?}");
    // Frozen longer than member_lost_ms, then thawed.
    let frozen_for = Duration::from_millis(3_000).saturating_sub(stopped_at.elapsed());
    tokio::time::sleep(frozen_for).await;
    let cont_ns = unix_ns();
    ring.procs[victim].signal(Signal::SIGCONT);
    // The thawed member catches up and must not start z again.
    eventually(
        Duration::from_secs(10),
        "the thawed member answers",
        || async { status(&ring.procs[victim]).await.ok().map(|_| ()) },
    )
    .await;
    eventually(
        Duration::from_secs(10),
        "the thawed member sees the move",
        || async {
            let s = status(&ring.procs[victim]).await.ok()?;
            s.control_planes
                .iter()
                .any(|c| c.name == "z" && c.host != victim_name && c.phase == "running")
                .then_some(())
        },
    )
    .await;
    // Give it a few lease renewals to misbehave, if it would.
    tokio::time::sleep(Duration::from_millis(1_500)).await;
    let stretches = served(ring.dir.path(), "z");
    assert_no_overlap("z", &stretches);
    assert!(
        stretches
            .iter()
            .filter(|s| s.member == victim_name)
            .all(|s| s.to_ns < cont_ns),
        "the thawed member served z again: {stretches:?}"
    );
    let Some(old) = stretches.iter().find(|s| s.member == victim_name) else {
        panic!(
            "the frozen member {victim_name} never served z: {stretches:?}\nfile:\n{}\nlogs:\n{}",
            std::fs::read_to_string(ring.dir.path().join("serving-z.log")).unwrap_or_default(),
            ring.logs()
        );
    };
    let new = stretches.iter().find(|s| s.member != victim_name).unwrap();
    println!(
        "z: old workload stopped by its guard {} ms after SIGSTOP; new host started {} ms after that",
        old.to_ns.saturating_sub(stopped_ns) / 1_000_000,
        (new.from_ns - old.to_ns) / 1_000_000
    );
}

#[tokio::test]
async fn killing_the_leader_that_hosts_control_planes_still_moves_them() {
    let mut ring = recording_ring();
    let leader = ring.wait_leader(&[0, 1, 2], &[], FORM).await;
    let victim = ring.index_of(leader);
    let victim_name = ring.procs[victim].config.name.clone();
    let other = ["a", "b", "c"]
        .into_iter()
        .find(|n| *n != victim_name)
        .unwrap();
    add_running(
        &ring,
        &[
            ("l1", Some(other), Some(&victim_name)),
            ("l2", None, Some(&victim_name)),
        ],
    )
    .await;
    let moved = hosted_by(&cps(&ring, &[0, 1, 2]).await, &victim_name);
    let killed_at = Instant::now();
    ring.procs[victim].kill9();
    let survivors: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
    let times = wait_moved(&ring, &survivors, &moved, &victim_name, killed_at).await;
    println!("kill -9 of the leader {victim_name} -> running on a survivor (ms): {times:?}");
    for name in moved.keys() {
        assert_no_overlap(name, &served(ring.dir.path(), name));
    }
    // The new leader counted the old one's silence from the survivors' last contact with it
    // (their renewals said when), not from its own election.
    let history = ringctl_ok(&ring, &["history", "--limit", "0"]);
    let judged: Vec<&str> = history
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "member.health")
        .filter_map(|e| e["reason"].as_str())
        .collect();
    assert!(
        judged
            .iter()
            .any(|r| r.contains("no earlier leader could grant")),
        "the lost leader's silence was counted from the election: {judged:#?}"
    );
}

fn ringctl_ok(ring: &Ring, args: &[&str]) -> serde_json::Value {
    let mut all = args.to_vec();
    all.extend(["--output", "json"]);
    let out = ring.ringctl(&all);
    assert!(
        out.status.success(),
        "ringctl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

#[tokio::test]
async fn operator_controls_behave_and_dry_runs_change_nothing() {
    let ring = recording_ring();
    ring.wait_leader(&[0, 1, 2], &[], FORM).await;
    add_running(
        &ring,
        &[
            ("s", None, Some("a")),
            ("t", None, Some("a")),
            ("u", None, Some("b")),
        ],
    )
    .await;
    let before = cps(&ring, &[0]).await;

    // Dry runs print the plan and change nothing.
    let plan = ringctl_ok(&ring, &["switchover", "s", "--to", "c", "--dry-run"]);
    assert_eq!(plan["dry_run"], true);
    assert_eq!(plan["moves"][0]["to"], "c");
    let plan = ringctl_ok(&ring, &["member", "drain", "a", "--dry-run"]);
    assert_eq!(plan["moves"].as_array().unwrap().len(), 2);
    let plan = ringctl_ok(&ring, &["failover", "u", "--dry-run"]);
    assert_eq!(plan["moves"].as_array().unwrap().len(), 1);
    assert_eq!(cps(&ring, &[0]).await, before, "a dry run changed the ring");

    // Switchover: planned; the old host hands over, the new one starts after it.
    let started = Instant::now();
    ringctl_ok(&ring, &["switchover", "s", "--to", "c", "--reason", "test"]);
    eventually(Duration::from_secs(10), "s runs on c", || async {
        let cp = cps(&ring, &[0]).await.remove("s")?;
        (cp.host == "c" && cp.phase == "running" && cp.epoch == 2).then_some(())
    })
    .await;
    println!(
        "switchover s a -> c: running on c after {} ms",
        started.elapsed().as_millis()
    );
    assert_no_overlap("s", &served(ring.dir.path(), "s"));

    // Cordon: no new control planes land on c; uncordon lifts it.
    ringctl_ok(&ring, &["member", "cordon", "c", "--reason", "maintenance"]);
    let mut req = control_plane("v", Some("a"));
    req.host = String::new();
    add_control_plane(&ring.client(), req).await.unwrap();
    let v = eventually(Duration::from_secs(5), "a applied v", || async {
        cps(&ring, &[0]).await.remove("v")
    })
    .await;
    assert_eq!(v.host, "b", "c is cordoned and a is home: only b");
    // Drain b: cordoned first, then everything moves; with a as the only home-free
    // target for u, and v's home a, v cannot move anywhere: the plan says so.
    let out = ring.ringctl(&["member", "drain", "b"]);
    assert!(!out.status.success());
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("cannot move v"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    ringctl_ok(&ring, &["member", "uncordon", "c"]);
    let drained = ringctl_ok(&ring, &["member", "drain", "b", "--reason", "maintenance"]);
    assert_eq!(drained["moves"].as_array().unwrap().len(), 2, "{drained}");
    eventually(Duration::from_secs(10), "nothing runs on b", || async {
        let all = cps(&ring, &[0]).await;
        all.values()
            .all(|c| c.host != "b" && c.phase == "running")
            .then_some(())
    })
    .await;
    let members = ringctl_ok(&ring, &["member", "list"]);
    let b = members
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["name"] == "b")
        .unwrap()
        .clone();
    assert_eq!(b["cordoned"], true, "drain cordons: {b}");

    // Labels: a control plane that prefers tier=gold goes to the gold member.
    ringctl_ok(
        &ring,
        &[
            "member",
            "label",
            "c",
            "tier=gold",
            "--reason",
            "fast disks",
        ],
    );
    let out = ring.ringctl(&[
        "cp",
        "add",
        "w",
        "--dns-name",
        "w.ring.test",
        "--endpoint-on",
        "a=10.0.0.1:443",
        "--endpoint-on",
        "b=10.0.0.2:443",
        "--endpoint-on",
        "c=10.0.0.3:443",
        "--backup",
        "s3://backups/w",
        "--prefer",
        "tier=gold",
    ]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let w = eventually(Duration::from_secs(5), "a applied w", || async {
        cps(&ring, &[0]).await.remove("w")
    })
    .await;
    assert_eq!(w.host, "c", "w prefers tier=gold");
    // A control plane's labels are notes: replaced, replicated, recorded; nothing moves.
    ringctl_ok(
        &ring,
        &[
            "cp",
            "label",
            "w",
            "owner=team-1",
            "--reason",
            "who runs it",
        ],
    );
    let labelled = eventually(Duration::from_secs(5), "b applied w's labels", || async {
        let cp = cps(&ring, &[1]).await.remove("w")?;
        (cp.labels.get("owner").map(String::as_str) == Some("team-1")).then_some(cp)
    })
    .await;
    assert_eq!((labelled.host.as_str(), labelled.epoch), ("c", w.epoch));
    let out = ring.ringctl(&["cp", "label", "nope", "owner=x"]);
    assert!(!out.status.success(), "labelling an unknown control plane");
    assert!(
        String::from_utf8_lossy(&out.stderr).contains("nope"),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );

    // Failover (forced) of a control plane on a healthy host works too, and is recorded.
    ringctl_ok(&ring, &["failover", "t", "--to", "c", "--reason", "forced"]);
    eventually(Duration::from_secs(10), "t runs on c", || async {
        let cp = cps(&ring, &[0]).await.remove("t")?;
        (cp.host == "c" && cp.phase == "running").then_some(())
    })
    .await;

    // Pause: a lost host's control planes stay put; resume moves them.
    ringctl_ok(&ring, &["pause", "--reason", "maintenance window"]);
    let history = ringctl_ok(&ring, &["history", "--limit", "0"]);
    let actions: Vec<&str> = history
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["action"].as_str().unwrap())
        .collect();
    for action in [
        "control-plane.move",
        "member.cordon",
        "member.uncordon",
        "member.labels",
        "control-plane.labels",
        "control-plane.released",
        "ring.pause",
    ] {
        assert!(
            actions.contains(&action),
            "{action} not in history: {actions:?}"
        );
    }
    for name in ["s", "t", "u", "v", "w"] {
        assert_no_overlap(name, &served(ring.dir.path(), name));
    }
}

#[tokio::test]
async fn pause_detects_but_never_moves() {
    let mut ring = recording_ring();
    let leader = ring.wait_leader(&[0, 1, 2], &[], FORM).await;
    let victim = (0..3).find(|&i| ring.procs[i].config.id != leader).unwrap();
    let victim_name = ring.procs[victim].config.name.clone();
    add_running(&ring, &[("p", None, Some(&victim_name))]).await;
    ringctl_ok(&ring, &["pause", "--reason", "maintenance"]);
    ring.procs[victim].kill9();
    let survivors: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
    eventually(
        Duration::from_secs(10),
        "the victim is judged lost",
        || async {
            let s = status(&ring.procs[survivors[0]]).await.ok()?;
            s.members
                .iter()
                .any(|m| m.name == victim_name && m.health == "lost")
                .then_some(())
        },
    )
    .await;
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let p = cps(&ring, &survivors).await.remove("p").unwrap();
    assert_eq!(
        (p.host.as_str(), p.epoch),
        (victim_name.as_str(), 1),
        "paused: nothing moves"
    );
    let resumed = Instant::now();
    let out = ring.ringctl(&["--endpoint", &ring.procs[survivors[0]].admin(), "resume"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    eventually(Duration::from_secs(10), "p moves once resumed", || async {
        let p = cps(&ring, &survivors).await.remove("p")?;
        (p.host != victim_name && p.phase == "running").then_some(())
    })
    .await;
    println!(
        "resume -> p running elsewhere in {} ms",
        resumed.elapsed().as_millis()
    );
}

#[tokio::test]
async fn without_a_quorum_nothing_moves_and_the_ring_recovers_when_one_returns() {
    let mut ring = recording_ring();
    ring.wait_leader(&[0, 1, 2], &[], FORM).await;
    add_running(
        &ring,
        &[
            ("qa", None, Some("a")),
            ("qb", None, Some("b")),
            ("qc", None, Some("c")),
        ],
    )
    .await;
    let before = cps(&ring, &[0]).await;
    ring.procs[1].kill9();
    ring.procs[2].kill9();
    let lost_at = Instant::now();
    // The survivor says why nothing happens, and fences what it ran when its lease runs out.
    let s = eventually(Duration::from_secs(10), "a reports no quorum", || async {
        let s = status(&ring.procs[0]).await.ok()?;
        (!s.problem.is_empty()).then_some(s)
    })
    .await;
    println!("status of the survivor: {}", s.problem);
    assert!(s.problem.contains("majority"), "{}", s.problem);
    tokio::time::sleep(Duration::from_millis(2_500)).await;
    let during = cps(&ring, &[0]).await;
    for (name, cp) in &before {
        assert_eq!(
            (during[name].host.as_str(), during[name].epoch),
            (cp.host.as_str(), cp.epoch),
            "{name} moved without a quorum"
        );
    }
    let qa = served(ring.dir.path(), "qa");
    let last = qa.last().unwrap().to_ns;
    assert!(
        unix_ns() - last > 1_000_000_000,
        "a kept serving qa without a lease"
    );

    // b comes back: a quorum again. c's control plane moves; the others run again.
    ring.procs[1].spawn();
    let back = Instant::now();
    eventually(
        Duration::from_secs(20),
        "everything runs again, off c",
        || async {
            let all = cps(&ring, &[0, 1]).await;
            all.values()
                .all(|c| c.phase == "running" && c.host != "c")
                .then_some(())
        },
    )
    .await;
    println!(
        "quorum back -> every control plane running again in {} ms ({} ms after the loss)",
        back.elapsed().as_millis(),
        lost_at.elapsed().as_millis()
    );
    let after = cps(&ring, &[0, 1]).await;
    assert!(after["qc"].epoch > before["qc"].epoch);
    for name in ["qa", "qb", "qc"] {
        assert_no_overlap(name, &served(ring.dir.path(), name));
    }
}

#[tokio::test]
async fn dns_records_follow_the_serving_host() {
    let mut ring = recording_ring();
    let leader = ring.wait_leader(&[0, 1, 2], &[], FORM).await;
    let victim = (0..3).find(|&i| ring.procs[i].config.id != leader).unwrap();
    let victim_name = ring.procs[victim].config.name.clone();
    add_running(&ring, &[("d", None, Some(&victim_name))]).await;
    let value = |list: &serde_json::Value, name: &str| {
        list["records"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .map(|r| {
                (
                    r["type"].as_str().unwrap().to_string(),
                    r["value"].as_str().unwrap().to_string(),
                )
            })
    };
    let records = ringctl_ok(&ring, &["dns", "list"]);
    // The harness gives member a, b, c the endpoints 10.0.0.1, .2, .3.
    let ip = |m: &str| format!("10.0.0.{}", (m.as_bytes()[0] - b'a' + 1));
    assert_eq!(
        value(&records, "d.ring.test"),
        Some(("A".into(), ip(&victim_name)))
    );
    assert!(value(&records, &format!("{victim_name}.members.ring.test")).is_some());

    ring.procs[victim].kill9();
    let survivors: Vec<usize> = (0..3).filter(|&i| i != victim).collect();
    let endpoints: Vec<String> = survivors.iter().map(|&i| ring.procs[i].admin()).collect();
    let list = || {
        let out = garden_ring_tests::ringctl(
            &ring.client_config,
            &endpoints,
            &["dns", "list", "--output", "json"],
        );
        serde_json::from_slice::<serde_json::Value>(&out.stdout).unwrap()
    };
    // While the control plane moves, its name never points at the lost host again once it
    // changed, and ends at the new host.
    let moved = eventually(
        Duration::from_secs(15),
        "d's record points at the new host",
        || async {
            let records = list();
            match value(&records, "d.ring.test") {
                Some((kind, v)) if kind == "A" && v != ip(&victim_name) => Some(v),
                _ => None,
            }
        },
    )
    .await;
    let cp = cps(&ring, &survivors).await.remove("d").unwrap();
    assert_eq!(moved, ip(&cp.host));
    let records = list();
    assert_eq!(
        value(&records, &format!("{victim_name}.members.ring.test")).map(|v| v.0),
        Some("NONE".to_string()),
        "a lost member's admin record is withdrawn"
    );
}
