//! `ringd --log-format json` with real processes: every line a member writes is one JSON
//! object naming the member, and the lines about a control plane (the host's driver and agent,
//! the leader's decisions) carry its name and epoch at the top level.

use std::time::Duration;

use garden_ring::config::LogFormat;
use garden_ring_tests::{Proc, Ring, RingOptions, add_running, eventually, recording_driver};
use serde_json::Value;

/// Every line of `p`'s log, parsed; panics naming the line that is not a JSON object.
fn json_lines(p: &Proc) -> Vec<Value> {
    p.log()
        .lines()
        .filter(|l| !l.is_empty())
        .map(|l| match serde_json::from_str::<Value>(l) {
            Ok(v) if v.is_object() => v,
            _ => panic!("member {}: not a JSON object: {l}", p.config.name),
        })
        .collect()
}

/// The first line of `lines` about control plane `name` at `epoch` for which `also` holds.
fn about<'a>(
    lines: &'a [Value],
    name: &str,
    epoch: u64,
    also: impl Fn(&Value) -> bool,
) -> Option<&'a Value> {
    lines
        .iter()
        .find(|l| l["control_plane"] == name && l["epoch"] == epoch && also(l))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn json_lines_name_the_member_and_the_control_plane_and_epoch() {
    let mut ring = Ring::prepare(RingOptions::default());
    let driver = recording_driver(ring.dir.path());
    for p in &mut ring.procs {
        p.config.driver = driver.clone();
        p.config.log.format = LogFormat::Json;
        p.spawn();
    }
    add_running(&ring, &[("j1", Some("a"), Some("b"))]).await;
    let leader = ring
        .wait_leader(&[0, 1, 2], &[], Duration::from_secs(10))
        .await;
    let leader = ring.index_of(leader);

    // The host's agent and exec driver: the start, and the guard's report, inside j1's span.
    let host = &ring.procs[1];
    let started = eventually(
        Duration::from_secs(10),
        "b logs j1's start with its name and epoch",
        || async {
            let lines = json_lines(host);
            about(&lines, "j1", 1, |l| l["message"] == "started").cloned()
        },
    )
    .await;
    let raw = host.log();
    let raw = raw
        .lines()
        .find(|l| l.contains("\"control_plane\":\"j1\"") && l.contains("\"message\":\"started\""))
        .unwrap_or_default()
        .to_string();
    println!("host line: {raw}");
    assert_eq!(started["member"], "b");
    assert_eq!(started["level"], "INFO");
    assert!(started["timestamp"].is_string() && started["target"].is_string());

    // The leader's controller: its decision that j1 serves at epoch 1.
    let decided = eventually(
        Duration::from_secs(10),
        "the leader logs its decision about j1 with its name and epoch",
        || async {
            let lines = json_lines(&ring.procs[leader]);
            about(&lines, "j1", 1, |l| l["action"] == "control-plane.serving").cloned()
        },
    )
    .await;
    println!("leader line: {decided}");
    assert_eq!(decided["member"], ring.procs[leader].config.name.as_str());

    // Every line of every member is JSON and names its member; a line about no control plane
    // has no such field.
    for p in &ring.procs {
        let lines = json_lines(p);
        assert!(lines.len() > 3, "{}: {} lines", p.config.name, lines.len());
        for l in &lines {
            assert_eq!(l["member"], p.config.name.as_str(), "{l}");
            assert!(l["message"].is_string(), "{l}");
        }
        assert!(
            lines
                .iter()
                .any(|l| l.get("control_plane").is_none() && l.get("epoch").is_none()),
            "{}: every line names a control plane",
            p.config.name
        );
        println!("{}: {} JSON lines", p.config.name, lines.len());
    }
}
