//! Scenarios: what breaks, and what must hold afterwards. One run builds a fresh network and
//! ring, starts the writers, breaks one zone, watches the ring recover, then reads every
//! control plane back and checks the outcome.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use garden_ring::pb;
use tokio::sync::watch;

use crate::client::{Ack, Writer, connect, key};
use crate::model::{ClientStats, Event, Measures, Run};
use crate::netns::{Link, Topology};
use crate::world::{self, Binaries, World, endpoint};

/// What a scenario breaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Fault {
    /// Every process of a zone that hosts control planes (not the leader's) SIGKILLed and all
    /// its links cut.
    ZoneKill,
    /// A zone cut off from the other zones, still reaching the region and the clients; its
    /// processes stay alive and must fence themselves.
    ZonePartition,
    /// The leader's zone killed.
    LeaderZoneKill,
}

/// A scenario.
#[derive(Debug, Clone, Copy)]
pub struct Scenario {
    /// Its name on the command line.
    pub name: &'static str,
    /// What it does, for `--help` and the report.
    pub description: &'static str,
    /// The fault.
    pub fault: Fault,
    /// Whether no acknowledged write may be lost at all (otherwise: none acknowledged before
    /// the snapshot restored).
    pub zero_loss: bool,
}

/// The scenarios built so far.
pub const SCENARIOS: &[Scenario] = &[
    Scenario {
        name: "zone-kill",
        description: "all processes of a zone hosting control planes SIGKILLed, its links cut",
        fault: Fault::ZoneKill,
        zero_loss: false,
    },
    Scenario {
        name: "zone-partition",
        description: "a zone cut off from the other zones, still reaching the region and clients: it must fence, and its final snapshot makes the move lossless",
        fault: Fault::ZonePartition,
        zero_loss: true,
    },
    Scenario {
        name: "leader-zone-kill",
        description: "the leader's zone killed: a new leader is elected and moves its control planes",
        fault: Fault::LeaderZoneKill,
        zero_loss: false,
    },
];

/// Settings of a run.
#[derive(Debug, Clone)]
pub struct RunOptions {
    /// Where the binaries are.
    pub binaries: Binaries,
    /// The run's directory.
    pub dir: std::path::PathBuf,
    /// Zones (3 or 5).
    pub zones: Vec<String>,
    /// Control planes registered.
    pub control_planes: usize,
    /// An RTO above this fails the run, ms.
    pub rto_budget_ms: u64,
}

/// Records events on the run's clock.
struct Timeline {
    start: Instant,
    events: Vec<Event>,
}

impl Timeline {
    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    fn add(&mut self, kind: &str, subject: &str, detail: impl Into<String>) -> u64 {
        let at_ms = self.now_ms();
        self.add_at(at_ms, kind, subject, detail)
    }

    fn add_at(&mut self, at_ms: u64, kind: &str, subject: &str, detail: impl Into<String>) -> u64 {
        self.events.push(Event {
            at_ms,
            kind: kind.into(),
            subject: subject.into(),
            detail: detail.into(),
        });
        at_ms
    }
}

/// What the observer remembers of the last status, to report changes.
#[derive(Default)]
struct Seen {
    leader: u64,
}

impl Seen {
    fn update(&mut self, s: &pb::StatusResponse, timeline: &mut Timeline) {
        if s.leader_id != 0 && s.leader_id != self.leader {
            let name = s
                .members
                .iter()
                .find(|m| m.id == s.leader_id)
                .map(|m| m.name.clone())
                .unwrap_or_default();
            if self.leader != 0 {
                timeline.add("ring", &name, format!("leader {name} (term {})", s.term));
            }
            self.leader = s.leader_id;
        }
    }
}

/// Runs `scenario` once.
pub async fn run_once(
    scenario: &Scenario,
    number: u32,
    options: &RunOptions,
    topology: &Topology,
) -> anyhow::Result<Run> {
    std::fs::create_dir_all(&options.dir)?;
    let started_unix_ms = garden_ring::time::unix_ms();
    let mut world = world::build(
        &options.dir,
        &options.zones,
        options.control_planes,
        &options.binaries,
    )
    .await?;
    let mut timeline = Timeline {
        start: Instant::now(),
        events: Vec::new(),
    };
    let result = drive(scenario, options, topology, &mut world, &mut timeline).await;
    let (measures, clients, mut failures) = match result {
        Ok(outcome) => outcome,
        Err(e) => (Measures::default(), Vec::new(), vec![format!("{e:#}")]),
    };
    if measures.split_brain_writes > 0 {
        failures.push(format!(
            "split brain: {} writes acknowledged by an old host after the new one took over",
            measures.split_brain_writes
        ));
    }
    drop(world);
    timeline.events.sort_by_key(|e| e.at_ms);
    Ok(Run {
        scenario: scenario.name.to_string(),
        run: number,
        started_unix_ms,
        duration_ms: garden_ring::time::unix_ms().saturating_sub(started_unix_ms),
        measures,
        clients,
        events: timeline.events,
        failures,
    })
}

type Outcome = (Measures, Vec<ClientStats>, Vec<String>);

async fn drive(
    scenario: &Scenario,
    options: &RunOptions,
    topology: &Topology,
    world: &mut World,
    timeline: &mut Timeline,
) -> anyhow::Result<Outcome> {
    let mut seen = Seen::default();
    let before = world.status().await.context("no member answers")?;
    seen.update(&before, timeline);
    let leader = before
        .members
        .iter()
        .find(|m| m.id == before.leader_id)
        .map(|m| m.name.clone())
        .context("no leader")?;
    let hosts: BTreeMap<String, String> = before
        .control_planes
        .iter()
        .map(|c| (c.name.clone(), c.host.clone()))
        .collect();
    // The zone to break: the leader's, or one that hosts control planes and does not lead.
    let victim =
        match scenario.fault {
            Fault::LeaderZoneKill => leader.clone(),
            Fault::ZoneKill | Fault::ZonePartition => hosts
                .values()
                .find(|h| **h != leader)
                .cloned()
                .context("every control plane is on the leader")?,
        };
    let victim_index = world.member_index(&victim).context("unknown victim")?;
    let victim_zone = world.members[victim_index].zone.clone();
    let moved: Vec<String> = hosts
        .iter()
        .filter(|(_, h)| **h == victim)
        .map(|(c, _)| c.clone())
        .collect();

    // Writers, and a warm-up: every control plane acknowledged writes, and a snapshot was
    // taken after them.
    let (stop, stopped) = watch::channel(false);
    let writers: Vec<Writer> = world
        .control_planes
        .iter()
        .map(|cp| Writer::start(cp, timeline.start, stopped.clone()))
        .collect();
    world::wait_for(
        Duration::from_secs(30),
        "every writer is acknowledged",
        || async {
            writers
                .iter()
                .all(|w| w.record.lock().map(|r| r.acks.len() >= 20).unwrap_or(false))
                .then_some(())
        },
    )
    .await?;
    tokio::time::sleep(Duration::from_millis(world::SNAPSHOT_INTERVAL_MS * 2)).await;

    // The fault.
    let fault_unix_ms = garden_ring::time::unix_ms();
    let fault_ms = match scenario.fault {
        Fault::ZoneKill | Fault::LeaderZoneKill => {
            for link in Link::ALL {
                topology.set_link(&victim_zone, link, false)?;
            }
            let killed = topology.signal_zone(&victim_zone, nix::sys::signal::Signal::SIGKILL);
            world.members[victim_index].ringd.reap();
            timeline.add(
                "fault",
                &victim_zone,
                format!("{victim_zone} killed ({killed} processes), links cut"),
            )
        }
        Fault::ZonePartition => {
            topology.set_link(&victim_zone, Link::Mesh, false)?;
            timeline.add(
                "fault",
                &victim_zone,
                format!("{victim_zone} cut off from the other zones"),
            )
        }
    };

    // Watch until every moved control plane runs elsewhere and its writer was acknowledged
    // there.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut elect_ms = None;
    let mut final_status = None;
    loop {
        if let Some(s) = world.status().await {
            seen.update(&s, timeline);
            if elect_ms.is_none() && victim == leader {
                let new_leader = s.members.iter().find(|m| m.id == s.leader_id);
                if new_leader.is_some_and(|m| m.name != victim) {
                    elect_ms = Some(timeline.now_ms() - fault_ms);
                }
            }
            let all_moved = moved.iter().all(|cp| {
                s.control_planes
                    .iter()
                    .any(|c| c.name == *cp && c.host != victim && c.phase == "running")
            });
            let acked_elsewhere = writers
                .iter()
                .filter(|w| moved.contains(&w.control_plane))
                .all(|w| {
                    w.record
                        .lock()
                        .map(|r| {
                            r.acks
                                .iter()
                                .any(|a| a.at_ms > fault_ms && a.zone != victim_index)
                        })
                        .unwrap_or(false)
                });
            if all_moved && acked_elsewhere {
                final_status = Some(s);
                break;
            }
        }
        if Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // The ring's own record of what it did, with the leader's timestamps.
    let detect_ms = ring_events(world, fault_unix_ms, fault_ms, &victim, timeline).await;
    // A little more writing at the new hosts, then stop.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let _ = stop.send(true);
    let mut records = Vec::new();
    for w in writers {
        let cp = w.control_plane.clone();
        records.push((cp, w.finish().await));
    }
    let mut failures = Vec::new();
    let Some(status) = final_status.or(world.status().await) else {
        anyhow::bail!("no member answers after the fault");
    };
    if !moved.iter().all(|cp| {
        status
            .control_planes
            .iter()
            .any(|c| c.name == *cp && c.host != victim && c.phase == "running")
    }) {
        failures.push(format!(
            "not every control plane of {victim} ({}) runs elsewhere within 60 s",
            moved.join(", ")
        ));
    }

    // Read every control plane back and compare with what was acknowledged.
    let mut clients = Vec::new();
    let mut measures = Measures {
        detect_ms,
        elect_ms,
        ..Measures::default()
    };
    for (cp, record) in records {
        let now = status.control_planes.iter().find(|c| c.name == cp);
        let host = now.map(|c| c.host.clone()).unwrap_or_default();
        let host_index = world.member_index(&host);
        let mut stats = ClientStats {
            control_plane: cp.clone(),
            attempted: record.attempted,
            acknowledged: record.acks.len() as u64,
            ..ClientStats::default()
        };
        stats.longest_gap_ms = longest_gap(&record.acks);
        let present = match host_index {
            Some(z) => read_seqs(&cp, z).await,
            None => None,
        };
        let Some(present) = present else {
            failures.push(format!("{cp}: cannot read it back at {host}"));
            clients.push(stats);
            continue;
        };
        let lost: Vec<&Ack> = record
            .acks
            .iter()
            .filter(|a| !present.contains(&a.seq))
            .collect();
        stats.lost = lost.len() as u64;
        if moved.contains(&cp) {
            let first_new = record
                .acks
                .iter()
                .find(|a| a.at_ms > fault_ms && a.zone != victim_index);
            if let Some(first) = first_new {
                let rto = first.at_ms - fault_ms;
                measures.rto_ms = Some(measures.rto_ms.map_or(rto, |r: u64| r.max(rto)));
                timeline.add_at(
                    first.at_ms,
                    "client",
                    &cp,
                    format!("first write acknowledged at {host}, {rto} ms after the fault"),
                );
                stats.split_brain = record
                    .acks
                    .iter()
                    .filter(|a| a.zone == victim_index && a.at_ms > first.at_ms)
                    .count() as u64;
            }
            let migration = now.and_then(|c| c.migration.clone());
            if let Some(m) = &migration {
                if let Some(w) = m.data_loss_window_ms {
                    measures.data_loss_window_ms =
                        Some(measures.data_loss_window_ms.map_or(w, |x: u64| x.max(w)));
                }
                // Acknowledged before the restored snapshot was taken (names carry seconds):
                // those must be there.
                let created_s: Option<u64> = m
                    .restored
                    .rsplit('/')
                    .next()
                    .and_then(|n| n.split('-').nth(3))
                    .and_then(|t| t.split('.').next())
                    .and_then(|t| t.parse().ok());
                if let Some(created_s) = created_s {
                    let run_start_unix_ms =
                        garden_ring::time::unix_ms().saturating_sub(timeline.now_ms());
                    stats.lost_before_snapshot = lost
                        .iter()
                        .filter(|a| run_start_unix_ms + a.at_ms + 1_000 < created_s * 1000)
                        .count() as u64;
                }
            }
        }
        measures.lost_writes += stats.lost;
        measures.split_brain_writes += stats.split_brain;
        if scenario.zero_loss && stats.lost > 0 {
            failures.push(format!(
                "{cp}: {} acknowledged writes lost (zero-loss scenario)",
                stats.lost
            ));
        }
        if stats.lost_before_snapshot > 0 {
            failures.push(format!(
                "{cp}: {} writes acknowledged before the restored snapshot are missing",
                stats.lost_before_snapshot
            ));
        }
        clients.push(stats);
    }
    if let Some(rto) = measures.rto_ms
        && rto > options.rto_budget_ms
    {
        failures.push(format!(
            "RTO {rto} ms is over the budget of {} ms",
            options.rto_budget_ms
        ));
    }
    if !moved.is_empty() && measures.rto_ms.is_none() {
        failures.push("no write was acknowledged at a new host".into());
    }
    for f in &failures {
        timeline.add("check", "", format!("FAILED: {f}"));
    }
    Ok((measures, clients, failures))
}

/// Adds the ring's history after the fault to the timeline (moves, health, migrations, on the
/// leader's clock, which on one machine is the harness's); returns the time from the fault to
/// `victim` judged lost.
async fn ring_events(
    world: &World,
    fault_unix_ms: u64,
    fault_ms: u64,
    victim: &str,
    timeline: &mut Timeline,
) -> Option<u64> {
    let history = world
        .admin
        .call(pb::HistoryRequest { limit: 0 }, |mut c, r| async move {
            c.history(r).await
        })
        .await
        .ok()?;
    let mut detect_ms = None;
    for e in history.events.iter().filter(|e| e.at_ms >= fault_unix_ms) {
        let after_fault = e.at_ms - fault_unix_ms;
        if e.action == "member.health"
            && (e.subject == victim || e.subject.starts_with(&format!("{victim}(")))
            && e.detail.contains("-> lost")
            && detect_ms.is_none()
        {
            detect_ms = Some(after_fault);
        }
        let kind = if e.action.starts_with("dns") {
            "dns"
        } else {
            "ring"
        };
        timeline.add_at(
            fault_ms + after_fault,
            kind,
            &e.subject,
            format!("{}: {}", e.action, e.detail),
        );
    }
    detect_ms
}

fn longest_gap(acks: &[Ack]) -> u64 {
    acks.windows(2)
        .map(|w| w[1].at_ms.saturating_sub(w[0].at_ms))
        .max()
        .unwrap_or(0)
}

/// The sequence numbers present in `cp`'s etcd at zone `z`.
async fn read_seqs(cp: &str, z: usize) -> Option<std::collections::BTreeSet<u64>> {
    let client = connect(endpoint(cp, z)).await?;
    let prefix = key(cp, 0);
    let prefix = &prefix[..prefix.len() - 10];
    let kvs = client.get_prefix(prefix.as_bytes()).await.ok()?;
    Some(
        kvs.iter()
            .filter_map(|kv| {
                std::str::from_utf8(&kv.key)
                    .ok()?
                    .rsplit('/')
                    .next()?
                    .parse()
                    .ok()
            })
            .collect(),
    )
}
