//! Scenarios: what breaks, and what must hold afterwards. One run builds a fresh network and
//! ring, starts the writers, breaks one zone, watches the ring recover, then reads every
//! control plane back and checks the outcome.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use anyhow::Context;
use garden_ring::pb;
use tokio::sync::watch;

use crate::client::{Ack, Writer, connect, key};
use crate::model::{ClientStats, Event, LossPhase, Measures, Run};
use crate::netns::{Link, Topology};
use crate::registry::RegistryClients;
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
    /// A zone cut off from everything, processes alive.
    ZoneIsolation,
    /// The leader's zone killed.
    LeaderZoneKill,
    /// A zone killed, then brought back once its control planes moved.
    ZoneReturn,
    /// A zone's link to the other zones going down and up every 700 ms for 8 s.
    FlappingLink,
    /// A zone killed while the DNS server is stopped; the server comes back after 5 s.
    DnsOutage,
    /// A zone killed while the object store is stopped; it comes back after 5 s.
    ObjectStoreOutage,
    /// Two of three zones killed; one comes back after 6 s.
    DoubleZoneLoss,
    /// Every ringd restarted, one after the other.
    RollingRestart,
    /// Every ringd restarted onto this build from the previous release's, leader last.
    RollingUpgrade,
    /// Every process of a zone hosting control planes (not the leader's) SIGSTOPped for
    /// `FREEZE_MS`, then SIGCONTed: a pause its own processes cannot see coming.
    ZoneFreeze,
    /// The leader's zone frozen the same way.
    LeaderZoneFreeze,
    /// The wall clock of a member hosting control planes (not the leader) stepped by +1 h,
    /// then -1 h, then back (libfaketime; its monotonic clock untouched): nothing may move,
    /// no write wait longer than a lease; then a switchover of one of its control planes, whose
    /// backups were written across the steps, loses nothing.
    ClockJump,
    /// A member hosting control planes (not the leader) restarted on an older copy of its
    /// data directory, taken while it was stopped, after it acknowledged more: the leader must
    /// find it diverged, keep it lost and move what it hosts; nothing acknowledged is lost
    /// beyond a failover's window.
    StaleDisk,
    /// A zone's links to the other zones and to the region dropping packets at random (each
    /// rate of `RunOptions::loss_percents` for `loss_ms`), then cut three times for less than
    /// `member_lost_ms - lease_ms`: nothing may move.
    LossyLink,
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

/// The scenarios.
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
    Scenario {
        name: "zone-isolation",
        description: "a zone cut off from everything, processes alive: it must fence; loss bounded by the snapshot age",
        fault: Fault::ZoneIsolation,
        zero_loss: false,
    },
    Scenario {
        name: "zone-return",
        description: "a zone killed, then brought back: it rejoins, never serves its old control planes, nothing moves back",
        fault: Fault::ZoneReturn,
        zero_loss: false,
    },
    Scenario {
        name: "flapping-link",
        description: "a zone's link to the other zones flaps for 8 s: never two hosts at once, nothing lost, everything serves afterwards",
        fault: Fault::FlappingLink,
        zero_loss: true,
    },
    Scenario {
        name: "dns-outage-during-failover",
        description: "a zone killed while the DNS server is down for 5 s: the move completes and DNS converges",
        fault: Fault::DnsOutage,
        zero_loss: false,
    },
    Scenario {
        name: "object-store-outage-during-migration",
        description: "a zone killed while the object store is down for 5 s: the migration waits and completes",
        fault: Fault::ObjectStoreOutage,
        zero_loss: false,
    },
    Scenario {
        name: "double-zone-loss",
        description: "two of three zones killed: no quorum, nothing moves; one zone returns after 6 s and everything serves again (with --tolerance zone --zones 5: the ring keeps its quorum, an etcd cluster loses its own, the ring shows it no-quorum and an operator recovers it from its survivor)",
        fault: Fault::DoubleZoneLoss,
        zero_loss: false,
    },
    Scenario {
        name: "lossy-link",
        description: "a zone's links to the other zones and the region drop 10%, 30%, 50% of packets for 60 s each (--loss-percent, --loss-secs), then are cut three times for 3/4 of member_lost_ms - lease_ms: nothing moves, no write waits longer than a lease, nothing lost",
        fault: Fault::LossyLink,
        zero_loss: true,
    },
    Scenario {
        name: "zone-freeze",
        description: "every process of a zone hosting control planes SIGSTOPped for 5 s, then SIGCONTed: no split brain while frozen or after the thaw, the thawed host serves nothing that moved, loss bounded as in zone-kill",
        fault: Fault::ZoneFreeze,
        zero_loss: false,
    },
    Scenario {
        name: "leader-zone-freeze",
        description: "the leader's zone frozen for 5 s, then thawed: a new leader moves its control planes; the old one steps down and serves nothing that moved",
        fault: Fault::LeaderZoneFreeze,
        zero_loss: false,
    },
    Scenario {
        name: "clock-jump",
        description: "a host's wall clock stepped +1 h for 10 s, then -1 h for 10 s, then back (libfaketime, monotonic clock untouched): nothing moves, no write waits longer than a lease, history times stay sane; then a switchover of one of its control planes restores the backups written across the steps and loses nothing",
        fault: Fault::ClockJump,
        zero_loss: true,
    },
    Scenario {
        name: "stale-disk",
        description: "a member's ringd restarted on an older copy of its data directory (it had acknowledged more since): found diverged, judged lost, its control planes moved",
        fault: Fault::StaleDisk,
        zero_loss: false,
    },
    Scenario {
        name: "rolling-restart",
        description: "every ringd restarted in turn: no failover at all, nothing lost",
        fault: Fault::RollingRestart,
        zero_loss: true,
    },
    Scenario {
        name: "rolling-upgrade",
        description: "the ring started on the previous release (--from-bin-dir), every ringd restarted onto this build in turn, followers first, the leader last: no failover, nothing lost, the ring raised to this build's ring version; each client's longest wait for a write is the upgrade's cost",
        fault: Fault::RollingUpgrade,
        zero_loss: true,
    },
];

/// How long an outage of the DNS server or the object store lasts, ms.
const OUTAGE_MS: u64 = 5_000;
/// How long zone-freeze and leader-zone-freeze keep a zone stopped, ms: more than a lease at
/// every profile, and more than `member_lost_ms` at loopback timings (its control planes move).
const FREEZE_MS: u64 = 5_000;
/// How long after a thaw the thawed member may still accept connections for a control plane
/// that moved away while it was frozen, ms: its ringd learns of the move with its first
/// renewal, then stops the (held) etcd.
const THAWED_STOP_MS: u64 = 10_000;
/// How far a freeze must be from member_lost_ms to say for sure whether it moves anything, ms.
const FREEZE_MARGIN_MS: u64 = 1_000;
/// How long clock-jump keeps each step of the host's wall clock, ms.
const CLOCK_STEP_MS: u64 = 10_000;
/// How far a history time may stray from the real clock (one machine) and still be sane, ms.
const CLOCK_SANE_MS: u64 = 5_000;
/// How long a delta snapshot may take to reach the bucket after its period ends, ms: a write
/// acknowledged more than `DELTA_PERIOD_MS` + this before the fault must survive it.
const DELTA_UPLOAD_ALLOWANCE_MS: u64 = 500;
/// A client's longest gap between acknowledgements from this long on is marked on the
/// timeline, ms.
const LONG_GAP_MS: u64 = 1_000;
/// How long before a double zone loss a write acknowledged by the two lost etcd members may
/// be missing after an operator recovers the cluster from its survivor: etcd
/// `--force-new-cluster` keeps only what the survivor knew committed, and it learns the
/// commit index with the next append or heartbeat (100 ms), so 1 s is ten of them.
const FORCED_LOSS_ALLOWANCE_MS: u64 = 1_000;

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
    /// Zone-tolerant control planes (one etcd member per zone): no acknowledged write may be
    /// lost in any scenario.
    pub zone_tolerant: bool,
    /// The ring's timings (`--timings`).
    pub timing: garden_ring::config::Timing,
    /// lossy-link: the loss rates, in turn, percent.
    pub loss_percents: Vec<u8>,
    /// lossy-link: how long each rate lasts, ms.
    pub loss_ms: u64,
    /// lossy-link: the longest a client may wait for an acknowledgement, ms.
    pub max_wait_ms: u64,
}

/// Records events on the run's clock.
pub(crate) struct Timeline {
    start: Instant,
    events: Vec<Event>,
}

impl Timeline {
    fn now_ms(&self) -> u64 {
        self.start.elapsed().as_millis() as u64
    }

    pub(crate) fn add(&mut self, kind: &str, subject: &str, detail: impl Into<String>) -> u64 {
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
    let mut binaries = options.binaries.clone();
    if scenario.fault == Fault::ClockJump {
        let lib = std::path::PathBuf::from(world::LIBFAKETIME);
        anyhow::ensure!(
            lib.exists(),
            "clock-jump needs libfaketime ({}): apt-get install faketime",
            lib.display()
        );
        binaries.faketime = Some(lib);
    }
    let mut world = world::build(
        &options.dir,
        &options.zones,
        options.control_planes,
        options.zone_tolerant,
        options.timing.clone(),
        &binaries,
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
    let member_names: Vec<String> = world.members.iter().map(|m| m.name.clone()).collect();
    drop(world);
    // A passed run keeps its logs, not its data: every etcd preallocates a 64 MiB WAL, and a
    // zone-tolerant run has three per control plane (about 1 GiB a run). A failed run keeps
    // everything for the post-mortem.
    if failures.is_empty() {
        for member in &member_names {
            let data = options.dir.join(member).join("data");
            if let Err(e) = std::fs::remove_dir_all(&data)
                && e.kind() != std::io::ErrorKind::NotFound
            {
                eprintln!("cannot remove {}: {e}", data.display());
            }
        }
    }
    timeline.events.sort_by_key(|e| e.at_ms);
    Ok(Run {
        scenario: {
            let mut name = scenario.name.to_string();
            if options.zone_tolerant {
                name.push_str(" (tolerance zone)");
            }
            if let Some(profile) = world::timing_profile_name(&options.timing) {
                name.push_str(&format!(" ({profile})"));
            }
            name
        },
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
    let victim = match scenario.fault {
        Fault::LeaderZoneKill | Fault::LeaderZoneFreeze => leader.clone(),
        _ => hosts
            .values()
            .find(|h| **h != leader)
            .cloned()
            .context("every control plane is on the leader")?,
    };
    let victim_index = world.member_index(&victim).context("unknown victim")?;
    let victim_zone = world.members[victim_index].zone.clone();
    // Double-zone-loss of zone-tolerant control planes in a ring with spare zones: the second
    // zone runs an etcd member of a control plane the victim hosts, so that etcd cluster loses
    // its quorum, and it stays lost; an operator recovers the cluster from its survivor.
    // Otherwise the second zone is the first that is not the victim, and it comes back.
    let no_quorum_run =
        scenario.fault == Fault::DoubleZoneLoss && options.zone_tolerant && world.members.len() > 3;
    let second_index = if no_quorum_run {
        let name = before
            .control_planes
            .iter()
            .filter(|c| c.host == victim)
            .filter_map(|c| c.etcd.as_ref())
            .flat_map(|e| e.members.iter())
            .map(|m| m.member.clone())
            .find(|m| *m != victim && *m != leader)
            .context("no control plane of the victim has an etcd member off it and the leader")?;
        world.member_index(&name).context("unknown member")?
    } else {
        (0..world.members.len())
            .find(|i| *i != victim_index)
            .context("one zone only")?
    };
    let second_zone = world.members[second_index].zone.clone();
    // The members that stay lost, and their zones' indexes.
    let gone: Vec<String> = if no_quorum_run {
        vec![victim.clone(), world.members[second_index].name.clone()]
    } else {
        vec![victim.clone()]
    };
    let gone_index: Vec<usize> = gone.iter().filter_map(|m| world.member_index(m)).collect();
    // The control planes that must move (none when nothing may move, or anything may).
    let t = &options.timing;
    // A freeze moves the zone's control planes when it outlasts member_lost_ms by a margin, and
    // must move nothing when it ends a renewal and a margin before it; in between, either.
    let freeze_moves = t.member_lost_ms + FREEZE_MARGIN_MS < FREEZE_MS;
    let freeze_stays = FREEZE_MS + t.renew_interval_ms() + FREEZE_MARGIN_MS < t.member_lost_ms;
    let moved: Vec<String> = match scenario.fault {
        Fault::FlappingLink
        | Fault::RollingRestart
        | Fault::RollingUpgrade
        | Fault::LossyLink
        | Fault::ClockJump => Vec::new(),
        Fault::ZoneFreeze | Fault::LeaderZoneFreeze if !freeze_moves => Vec::new(),
        _ => hosts
            .iter()
            .filter(|(_, h)| gone.contains(h))
            .map(|(c, _)| c.clone())
            .collect(),
    };
    // The control planes whose etcd cluster loses its quorum (two of its three members).
    let stuck: Vec<String> = if no_quorum_run {
        before
            .control_planes
            .iter()
            .filter(|c| {
                c.etcd.as_ref().is_some_and(|e| {
                    e.members
                        .iter()
                        .filter(|m| gone.contains(&m.member))
                        .count()
                        >= 2
                })
            })
            .map(|c| c.name.clone())
            .collect()
    } else {
        Vec::new()
    };

    // Writers, and a warm-up: every control plane acknowledged writes, and delta snapshots
    // were written after them (the full snapshot is the one each etcd took at start).
    let (stop, stopped) = watch::channel(false);
    let writers: Vec<Writer> = world
        .control_planes
        .iter()
        .map(|cp| Writer::start(cp, timeline.start, stopped.clone()))
        .collect();
    // Admin API clients on the registry, their history checked for linearizability.
    let registry = RegistryClients::start(
        &world.per_member,
        &world.control_planes,
        timeline.start,
        stopped.clone(),
    );
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
    tokio::time::sleep(Duration::from_millis(world::DELTA_PERIOD_MS * 3)).await;

    // The fault.
    let mut elect_ms = None;
    let mut fault_unix_ms = garden_ring::time::unix_ms();
    let kill = |zone: &str, index: usize, world: &mut World| -> anyhow::Result<usize> {
        for link in Link::ALL {
            topology.set_link(zone, link, false)?;
        }
        let killed = topology.signal_zone(zone, nix::sys::signal::Signal::SIGKILL);
        world.members[index].ringd.reap();
        Ok(killed)
    };
    let mut outage: Option<(Instant, usize, &str)> = None;
    let mut loss_phases = Vec::new();
    // Rolling restarts and upgrades: how many of the etcds they left running were restarted.
    let mut etcd_restarts = None;
    // When the victim's data stopped growing, if before the fault (the loss check's reference).
    let mut data_lost_ms = None;
    let fault_ms = match scenario.fault {
        Fault::ZoneKill | Fault::LeaderZoneKill | Fault::ZoneReturn => {
            let killed = kill(&victim_zone, victim_index, world)?;
            timeline.add(
                "fault",
                &victim_zone,
                format!("{victim_zone} killed ({killed} processes), links cut"),
            )
        }
        Fault::DnsOutage | Fault::ObjectStoreOutage => {
            let (which, what) = match scenario.fault {
                Fault::DnsOutage => (world::NAMED, "the DNS server"),
                _ => (world::MOTO, "the object store"),
            };
            world.region[which].signal(nix::sys::signal::Signal::SIGSTOP);
            let killed = kill(&victim_zone, victim_index, world)?;
            outage = Some((
                Instant::now() + Duration::from_millis(OUTAGE_MS),
                which,
                what,
            ));
            timeline.add(
                "fault",
                &victim_zone,
                format!("{what} stopped; {victim_zone} killed ({killed} processes)"),
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
        Fault::ZoneIsolation => {
            for link in Link::ALL {
                topology.set_link(&victim_zone, link, false)?;
            }
            timeline.add(
                "fault",
                &victim_zone,
                format!("{victim_zone} cut off from everything, processes alive"),
            )
        }
        Fault::DoubleZoneLoss => {
            let a = kill(&victim_zone, victim_index, world)?;
            let b = kill(&second_zone, second_index, world)?;
            timeline.add(
                "fault",
                &victim_zone,
                format!(
                    "{victim_zone} and {second_zone} killed ({} processes)",
                    a + b
                ),
            )
        }
        Fault::FlappingLink => {
            let at = timeline.add(
                "fault",
                &victim_zone,
                format!("{victim_zone}'s link to the other zones flaps for 8 s"),
            );
            for _ in 0..6 {
                topology.set_link(&victim_zone, Link::Mesh, false)?;
                tokio::time::sleep(Duration::from_millis(700)).await;
                topology.set_link(&victim_zone, Link::Mesh, true)?;
                tokio::time::sleep(Duration::from_millis(700)).await;
            }
            timeline.add("heal", &victim_zone, "the link stays up");
            at
        }
        Fault::LossyLink => {
            let lossy = [Link::Mesh, Link::Region];
            let mut epochs: BTreeMap<String, u64> = before
                .control_planes
                .iter()
                .map(|c| (c.name.clone(), c.epoch))
                .collect();
            let profile = world::timing_profile_name(&options.timing).unwrap_or("loopback");
            let rates = options
                .loss_percents
                .iter()
                .map(|p| format!("{p}%"))
                .collect::<Vec<_>>()
                .join(", ");
            let at = timeline.add(
                "fault",
                &victim_zone,
                format!(
                    "{victim_zone}'s links to the other zones and the region turn lossy: {rates} \
                     (measured limit: {})",
                    world::lossy_link_limit(profile)
                ),
            );
            println!(
                "lossy-link ({profile}): {rates}, {} s each; measured limit: {}",
                options.loss_ms / 1_000,
                world::lossy_link_limit(profile)
            );
            for percent in &options.loss_percents {
                topology.set_loss(&victim_zone, &lossy, *percent)?;
                let what = format!("{percent}% loss");
                timeline.add("fault", &victim_zone, what.clone());
                let phase = watch_phase(
                    world,
                    timeline,
                    &mut seen,
                    &mut epochs,
                    what,
                    options.loss_ms,
                )
                .await;
                loss_phases.push(phase);
            }
            topology.set_loss(&victim_zone, &lossy, 0)?;
            timeline.add("heal", &victim_zone, "no loss");
            let t = &options.timing;
            // Two leases of calm before the first cut, as after every cut: TCP's retransmission
            // backoff from the loss phase would otherwise be inherited by the first cut
            // (issue 41: 1243 ms against 531 and 371 for the two later ones).
            let calm = watch_phase(
                world,
                timeline,
                &mut seen,
                &mut epochs,
                "after the loss".to_string(),
                2 * t.lease_ms,
            )
            .await;
            loss_phases.push(calm);
            // Partitions shorter than member_lost_ms - lease_ms, each followed by two leases
            // of calm (the host renews, the clients catch up).
            let cut_ms = t.member_lost_ms.saturating_sub(t.lease_ms) * 3 / 4;
            for _ in 0..3 {
                topology.set_link(&victim_zone, Link::Mesh, false)?;
                let what = format!("cut for {cut_ms} ms");
                timeline.add("fault", &victim_zone, what.clone());
                let phase =
                    watch_phase(world, timeline, &mut seen, &mut epochs, what, cut_ms).await;
                topology.set_link(&victim_zone, Link::Mesh, true)?;
                timeline.add("heal", &victim_zone, "link back");
                let what = "after the cut".to_string();
                let calm = watch_phase(
                    world,
                    timeline,
                    &mut seen,
                    &mut epochs,
                    what,
                    2 * t.lease_ms,
                )
                .await;
                loss_phases.push(phase);
                loss_phases.push(calm);
            }
            at
        }
        Fault::ZoneFreeze | Fault::LeaderZoneFreeze => {
            let stopped = topology.signal_zone(&victim_zone, nix::sys::signal::Signal::SIGSTOP);
            let at = timeline.add(
                "fault",
                &victim_zone,
                format!("{victim_zone} frozen ({stopped} processes SIGSTOPped)"),
            );
            // Watch the others while it is frozen (a frozen member answers nothing).
            let until = Instant::now() + Duration::from_millis(FREEZE_MS);
            while Instant::now() < until {
                if let Some(s) = world.status().await {
                    seen.update(&s, timeline);
                    let new_leader = s.members.iter().find(|m| m.id == s.leader_id);
                    if elect_ms.is_none()
                        && victim == leader
                        && new_leader.is_some_and(|m| m.name != victim)
                    {
                        elect_ms = Some(timeline.now_ms() - at);
                    }
                }
                let rest = until.saturating_duration_since(Instant::now());
                tokio::time::sleep(rest.min(Duration::from_millis(100))).await;
            }
            let thawed = topology.signal_zone(&victim_zone, nix::sys::signal::Signal::SIGCONT);
            timeline.add(
                "heal",
                &victim_zone,
                format!("{victim_zone} thawed ({thawed} processes SIGCONTed)"),
            );
            at
        }
        Fault::StaleDisk => {
            let (stopped_at, at) =
                crate::stale_disk::run(world, victim_index, &options.dir, timeline).await?;
            // The fault is the start on the old copy, not the stops and writes before it; what
            // is lost counts from the stop before it (the disk it ran on is replaced).
            fault_unix_ms = garden_ring::time::unix_ms();
            data_lost_ms = Some(stopped_at);
            at
        }
        Fault::ClockJump => {
            let mut epochs: BTreeMap<String, u64> = before
                .control_planes
                .iter()
                .map(|c| (c.name.clone(), c.epoch))
                .collect();
            let clock = world.members[victim_index].clock_file();
            let at = timeline.now_ms();
            for (offset, ms) in [
                ("+1h", CLOCK_STEP_MS),
                ("-1h", CLOCK_STEP_MS),
                ("+0", 2 * options.timing.lease_ms),
            ] {
                std::fs::write(&clock, format!("{offset}\n"))
                    .with_context(|| format!("writing {}", clock.display()))?;
                let what = format!("{victim}'s wall clock at {offset}");
                timeline.add("fault", &victim_zone, what.clone());
                let phase = watch_phase(world, timeline, &mut seen, &mut epochs, what, ms).await;
                loss_phases.push(phase);
            }
            // A switchover of one of its control planes: the new host restores the backups
            // written across the steps (the final snapshot included) and must lose nothing.
            let cp = hosts
                .iter()
                .find(|(_, h)| **h == victim)
                .map(|(c, _)| c.clone())
                .context("the victim hosts nothing")?;
            world
                .admin
                .call(
                    pb::MoveRequest {
                        move_kind: pb::MoveKind::Switchover.into(),
                        control_plane: cp.clone(),
                        reason: "clock-jump: restore what was written across the steps".into(),
                        ..Default::default()
                    },
                    |mut c, r| async move { c.r#move(r).await },
                )
                .await
                .with_context(|| format!("switchover of {cp}"))?;
            timeline.add("fault", &cp, format!("switchover of {cp} off {victim}"));
            world::wait_for(
                Duration::from_secs(60),
                &format!("{cp} runs off {victim}"),
                || async {
                    let s = world.status().await?;
                    s.control_planes
                        .iter()
                        .any(|c| c.name == cp && c.host != victim && c.phase == "running")
                        .then_some(())
                },
            )
            .await?;
            timeline.add("heal", &cp, format!("{cp} runs off {victim}"));
            at
        }
        Fault::RollingRestart | Fault::RollingUpgrade => {
            let upgrade = scenario.fault == Fault::RollingUpgrade;
            let at = timeline.add(
                "fault",
                "",
                if upgrade {
                    "rolling upgrade of every ringd, followers first"
                } else {
                    "rolling restart of every ringd"
                },
            );
            let order = restart_order(world, upgrade).await?;
            let pids_before: BTreeMap<String, u32> = crate::restarts::etcd_pids()
                .into_iter()
                .filter(|(cp, _)| hosts.contains_key(cp))
                .collect();
            for i in order {
                let name = world.members[i].name.clone();
                world.members[i]
                    .ringd
                    .signal(nix::sys::signal::Signal::SIGTERM);
                if !world.members[i].ringd.wait_exit(Duration::from_secs(10)) {
                    anyhow::bail!("ringd {name} did not stop within 10 s of SIGTERM");
                }
                match (&options.binaries.start_from, upgrade) {
                    (Some(from), true) => {
                        world::switch_binaries(
                            &mut world.members[i],
                            from,
                            &options.binaries.ring_dir,
                        )?;
                    }
                    _ => world.members[i].ringd.spawn()?,
                }
                timeline.add(
                    "fault",
                    &world.members[i].zone,
                    format!(
                        "ringd {name} {}",
                        if upgrade { "upgraded" } else { "restarted" }
                    ),
                );
                // Next one only when this member serves its control planes again.
                let mine: Vec<&String> = hosts
                    .iter()
                    .filter(|(_, h)| **h == name)
                    .map(|(c, _)| c)
                    .collect();
                world::wait_for(
                    Duration::from_secs(30),
                    &format!("{name} serves its control planes again"),
                    || async {
                        for cp in &mine {
                            let client = connect(endpoint(cp, i)).await?;
                            client.status().await.ok()?;
                        }
                        Some(())
                    },
                )
                .await?;
                timeline.add(
                    "heal",
                    &world.members[i].zone,
                    format!("{name} serves again"),
                );
                // And the next one only once this one is back in the ring (a rolling restart
                // never has two members out at once).
                crate::restarts::back_in_the_ring(world, i).await?;
                timeline.add(
                    "heal",
                    &world.members[i].zone,
                    format!("{name} back in the ring"),
                );
            }
            let restarted = crate::restarts::restarted(&pids_before, &crate::restarts::etcd_pids());
            timeline.add(
                "heal",
                "",
                format!(
                    "{} of {} etcds restarted{}",
                    restarted.len(),
                    pids_before.len(),
                    if restarted.is_empty() {
                        String::new()
                    } else {
                        format!(": {}", restarted.join(", "))
                    }
                ),
            );
            etcd_restarts = Some(restarted.len() as u64);
            if upgrade {
                let newest = garden_ring::core::ring_version::SUPPORTED_RING_VERSIONS.1;
                world::wait_for(
                    Duration::from_secs(30),
                    &format!("the ring runs at ring version {newest}"),
                    || async {
                        let s = world.status().await?;
                        (s.ring_version?.active == newest).then_some(())
                    },
                )
                .await?;
                timeline.add(
                    "heal",
                    "",
                    format!("the ring runs at ring version {newest}"),
                );
            }
            at
        }
    };
    if no_quorum_run {
        recover_without_quorum(world, &stuck, &gone, timeline).await?;
    } else if scenario.fault == Fault::DoubleZoneLoss {
        // Without a quorum nothing may move: watch for a while, then bring one zone back.
        let until = Instant::now() + Duration::from_secs(6);
        while Instant::now() < until {
            if let Some(s) = world.status().await {
                for c in &s.control_planes {
                    if hosts.get(&c.name).is_some_and(|h| *h != c.host) && c.phase == "running" {
                        anyhow::bail!("{} moved to {} without a quorum", c.name, c.host);
                    }
                }
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        for link in Link::ALL {
            topology.set_link(&second_zone, link, true)?;
        }
        world.members[second_index].ringd.spawn()?;
        timeline.add("heal", &second_zone, format!("{second_zone} back"));
    }

    // Watch until every moved control plane runs elsewhere and its writer was acknowledged
    // there.
    let deadline = Instant::now() + Duration::from_secs(60);
    let mut final_status = None;
    loop {
        if let Some((at, which, what)) = outage
            && Instant::now() >= at
        {
            world.region[which].signal(nix::sys::signal::Signal::SIGCONT);
            timeline.add("heal", "region", format!("{what} back"));
            outage = None;
        }
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
                    .any(|c| c.name == *cp && !gone.contains(&c.host) && c.phase == "running")
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
                                .any(|a| a.at_ms > fault_ms && !gone_index.contains(&a.zone))
                        })
                        .unwrap_or(false)
                });
            let all_running = s.control_planes.iter().all(|c| c.phase == "running");
            if all_moved && acked_elsewhere && all_running && outage.is_none() {
                final_status = Some(s);
                break;
            }
        }
        if Instant::now() >= deadline {
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    let mut failures = Vec::new();
    if scenario.fault == Fault::ZoneReturn {
        for link in Link::ALL {
            topology.set_link(&victim_zone, link, true)?;
        }
        world.members[victim_index].ringd.spawn()?;
        timeline.add("heal", &victim_zone, format!("{victim_zone} back"));
        world::wait_for(
            Duration::from_secs(30),
            "the returned member is healthy",
            || async {
                let s = world.status().await?;
                s.members
                    .iter()
                    .any(|m| m.name == victim && m.health == "healthy")
                    .then_some(())
            },
        )
        .await?;
        // Give it time to do something wrong: a lease and a half.
        tokio::time::sleep(Duration::from_millis(1_500)).await;
        if let Some(s) = world.status().await {
            for c in s.control_planes.iter().filter(|c| moved.contains(&c.name)) {
                if c.host == victim {
                    failures.push(format!("{} moved back to {victim} on its own", c.name));
                }
            }
            final_status = Some(s);
        }
        for cp in &moved {
            if connect(endpoint(cp, victim_index)).await.is_some() {
                // Connecting works only if something listens: the old host serves again.
                failures.push(format!("{victim} accepts connections for {cp} again"));
            }
        }
    }
    if matches!(scenario.fault, Fault::ZoneFreeze | Fault::LeaderZoneFreeze) {
        // The thawed member serves nothing that moved away while it was frozen: within
        // THAWED_STOP_MS nothing answers there (a held etcd is frozen: it completes no
        // handshake), and it stays so.
        let thawed = Instant::now();
        for cp in &moved {
            let address = endpoint(cp, victim_index);
            let quiet = world::wait_for(
                Duration::from_millis(THAWED_STOP_MS),
                &format!("{victim} answers nothing for {cp}"),
                || async {
                    match connect(address).await {
                        Some(client) if client.status().await.is_ok() => None,
                        _ => Some(()),
                    }
                },
            )
            .await;
            match quiet {
                Ok(()) => {
                    timeline.add(
                        "check",
                        &victim_zone,
                        format!(
                            "{victim} answers nothing for {cp}, {} ms after the thaw",
                            thawed.elapsed().as_millis()
                        ),
                    );
                }
                Err(e) => failures.push(format!("{e:#}")),
            }
        }
        if freeze_stays {
            for c in world.status().await.iter().flat_map(|s| &s.control_planes) {
                if hosts.get(&c.name).is_some_and(|h| *h != c.host) {
                    failures.push(format!(
                        "{} moved to {} after a freeze of {FREEZE_MS} ms, shorter than member_lost_ms ({} ms)",
                        c.name, c.host, t.member_lost_ms
                    ));
                }
            }
        }
    }
    if scenario.fault == Fault::ClockJump {
        // History is stamped by the leader, whose clock did not move: every event since the
        // fault lies between the fault and now (one machine, one real clock) and in index
        // order. What the stepped host reports (its snapshot names) must not leak in as times.
        let now_unix_ms = garden_ring::time::unix_ms();
        match world.history().await {
            None => failures.push("no history after the clock steps".into()),
            Some(h) => {
                let mut events: Vec<&pb::Event> = h
                    .events
                    .iter()
                    .filter(|e| e.at_ms + CLOCK_SANE_MS >= fault_unix_ms)
                    .collect();
                events.sort_by_key(|e| e.index);
                for e in &events {
                    if e.at_ms > now_unix_ms + CLOCK_SANE_MS {
                        failures.push(format!(
                            "history event {} ({}) is stamped {} ms in the future",
                            e.index,
                            e.action,
                            e.at_ms - now_unix_ms
                        ));
                    }
                }
                for pair in events.windows(2) {
                    if pair[1].at_ms + CLOCK_SANE_MS < pair[0].at_ms {
                        failures.push(format!(
                            "history goes back in time: event {} at {} after event {} at {}",
                            pair[1].index, pair[1].at_ms, pair[0].index, pair[0].at_ms
                        ));
                    }
                }
                timeline.add(
                    "check",
                    "",
                    format!(
                        "{} history events since the fault, stamped in order within the run",
                        events.len()
                    ),
                );
            }
        }
    }
    // A little more writing at the new hosts, then stop.
    tokio::time::sleep(Duration::from_millis(1_000)).await;
    let _ = stop.send(true);
    let mut records = Vec::new();
    for w in writers {
        let cp = w.control_plane.clone();
        records.push((cp, w.finish().await));
    }
    let (registry, not_linearizable) = registry.check().await;
    failures.extend(not_linearizable);
    timeline.add(
        "check",
        "",
        format!(
            "registry history: {} Admin operations checked for linearizability ({} writes, {} of unknown outcome; {} linearizable reads; {} stale reads not checked)",
            registry.ops_checked,
            registry.writes,
            registry.unknown_writes,
            registry.reads,
            registry.stale_reads
        ),
    );
    let Some(status) = final_status.or(world.status().await) else {
        anyhow::bail!("no member answers after the fault");
    };
    if !moved.iter().all(|cp| {
        status
            .control_planes
            .iter()
            .any(|c| c.name == *cp && !gone.contains(&c.host) && c.phase == "running")
    }) {
        failures.push(format!(
            "not every control plane of {} ({}) runs elsewhere within 60 s",
            gone.join(" and "),
            moved.join(", ")
        ));
    }

    // With spare zones, the lost zone's etcd members are replaced: every cluster whole again,
    // without the victim, within a minute.
    let mut etcd_repair_ms = None;
    if options.zone_tolerant
        && world.members.len() > 3
        && (no_quorum_run
            || matches!(
                scenario.fault,
                Fault::ZoneKill
                    | Fault::LeaderZoneKill
                    | Fault::ZonePartition
                    | Fault::ZoneIsolation
            ))
    {
        let repaired = world::wait_for(
            Duration::from_secs(60),
            "every etcd cluster is whole again without the lost zones",
            || async {
                let s = world.status().await?;
                s.control_planes
                    .iter()
                    .all(|c| {
                        c.etcd.as_ref().is_some_and(|e| {
                            e.health == "whole"
                                && e.change.is_empty()
                                && e.members.iter().all(|m| !gone.contains(&m.member))
                        })
                    })
                    .then_some(())
            },
        )
        .await;
        match repaired {
            Ok(()) => {
                let ms = timeline.now_ms() - fault_ms;
                timeline.add(
                    "etcd",
                    "",
                    format!(
                        "every etcd cluster whole again without {}",
                        gone.join(" and ")
                    ),
                );
                etcd_repair_ms = Some(ms);
            }
            Err(e) => failures.push(format!("{e:#}")),
        }
    }
    // The ring's own record of what it did, with the leader's timestamps (read last, so the
    // repair's steps are on the timeline too).
    let detect_ms = ring_events(world, fault_unix_ms, fault_ms, &victim, timeline).await;

    if matches!(
        scenario.fault,
        Fault::RollingRestart | Fault::RollingUpgrade | Fault::FlappingLink | Fault::LossyLink
    ) {
        let epochs: BTreeMap<&str, u64> = before
            .control_planes
            .iter()
            .map(|c| (c.name.as_str(), c.epoch))
            .collect();
        for c in &status.control_planes {
            if c.phase != "running" {
                failures.push(format!("{} is {} at the end", c.name, c.phase));
            }
            if matches!(
                scenario.fault,
                Fault::RollingRestart | Fault::RollingUpgrade | Fault::LossyLink
            ) && epochs.get(c.name.as_str()) != Some(&c.epoch)
            {
                failures.push(format!(
                    "{} failed over during {} (epoch {} -> {})",
                    c.name,
                    scenario.name,
                    epochs.get(c.name.as_str()).copied().unwrap_or_default(),
                    c.epoch
                ));
            }
        }
    }

    // Read every control plane back and compare with what was acknowledged.
    let mut clients = Vec::new();
    let mut measures = Measures {
        detect_ms,
        elect_ms,
        etcd_repair_ms,
        registry: Some(registry),
        etcd_restarts,
        ..Measures::default()
    };
    // From this release on a restart leaves the etcds serving and the next ringd adopts them
    // (an upgrade from a release before, whose ringd stops them, restarts each once).
    if scenario.fault == Fault::RollingRestart && etcd_restarts.is_some_and(|n| n > 0) {
        failures.push(format!(
            "{} etcds were restarted by a rolling restart of ringd (0 expected)",
            etcd_restarts.unwrap_or_default()
        ));
    }
    // Each lossy-link phase's longest wait for an acknowledgement, over all clients: no write
    // may wait longer than a lease (the host never stopped serving).
    for phase in &mut loss_phases {
        for (_, record) in &records {
            phase.longest_gap_ms =
                phase
                    .longest_gap_ms
                    .max(gap_within(&record.acks, phase.start_ms, phase.end_ms));
        }
        if phase.longest_gap_ms > options.max_wait_ms {
            failures.push(format!(
                "{}: a client waited {} ms for an acknowledgement, more than {} ms (a lease is {} ms)",
                phase.what, phase.longest_gap_ms, options.max_wait_ms, options.timing.lease_ms
            ));
        }
        for cp in &phase.moved {
            failures.push(format!("{}: {cp} moved", phase.what));
        }
    }
    measures.loss_phases = loss_phases;
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
        let (gap_ms, gap_at_ms) = longest_gap(&record.acks);
        stats.longest_gap_ms = gap_ms;
        if gap_ms >= LONG_GAP_MS {
            timeline.add_at(
                gap_at_ms,
                "client",
                &cp,
                format!("no write acknowledged for the next {gap_ms} ms (its longest gap)"),
            );
        }
        for (at_ms, zone) in record.dns_changes.iter().skip(1) {
            let member = world
                .members
                .get(*zone)
                .map(|m| m.name.as_str())
                .unwrap_or("?");
            timeline.add_at(*at_ms, "dns", &cp, format!("the name points at {member}"));
        }
        stats.split_brain = split_brain(&record.acks);
        let present = match host_index {
            Some(z) => world::wait_for(Duration::from_secs(10), "it answers", || {
                read_seqs(&cp, z, record.attempted)
            })
            .await
            .ok(),
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
        // With delta snapshots every DELTA_PERIOD_MS, a write is in the bucket at most one
        // period plus an upload after it was acknowledged: anything older than that before the
        // fault must have survived it.
        stats.lost_before_delta_period = lost
            .iter()
            .filter(|a| {
                a.at_ms + world::DELTA_PERIOD_MS + DELTA_UPLOAD_ALLOWANCE_MS
                    < data_lost_ms.unwrap_or(fault_ms)
            })
            .count() as u64;
        if moved.contains(&cp) {
            let first_new = record
                .acks
                .iter()
                .find(|a| a.at_ms > fault_ms && !gone_index.contains(&a.zone));
            if let Some(first) = first_new {
                let rto = first.at_ms - fault_ms;
                measures.rto_ms = Some(measures.rto_ms.map_or(rto, |r: u64| r.max(rto)));
                timeline.add_at(
                    first.at_ms,
                    "client",
                    &cp,
                    format!("first write acknowledged at {host}, {rto} ms after the fault"),
                );
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
        measures.lost_before_delta_period += stats.lost_before_delta_period;
        measures.split_brain_writes += stats.split_brain;
        if stuck.contains(&cp) {
            // etcd --force-new-cluster keeps what the survivor knew committed: a write
            // acknowledged by the two lost members just before the fault may be missing, an
            // older one may not.
            let older = lost
                .iter()
                .filter(|a| a.at_ms + FORCED_LOSS_ALLOWANCE_MS < fault_ms)
                .count();
            if older > 0 {
                failures.push(format!(
                    "{cp}: {older} writes acknowledged more than {FORCED_LOSS_ALLOWANCE_MS} ms before the fault are missing after the recovery from the survivor"
                ));
            }
        } else if (scenario.zero_loss || options.zone_tolerant) && stats.lost > 0 {
            failures.push(format!(
                "{cp}: {} acknowledged writes lost (zero-loss scenario)",
                stats.lost
            ));
        }
        if stats.lost_before_delta_period > 0 {
            failures.push(format!(
                "{cp}: {} writes acknowledged more than a delta period ({} ms + {} ms) before the fault are missing",
                stats.lost_before_delta_period,
                world::DELTA_PERIOD_MS,
                DELTA_UPLOAD_ALLOWANCE_MS
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
        && scenario.fault != Fault::DoubleZoneLoss
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

/// Double-zone-loss that leaves the etcd clusters of `stuck` without quorum: waits (at most
/// 30 s) until the ring shows each `no-quorum` and hosted on its surviving member, checks that
/// the ring changes none of them by itself for 3 s, then recovers each from its host as an
/// operator does (`ringctl cp recover NAME --from-member HOST`, a dry run first).
async fn recover_without_quorum(
    world: &World,
    stuck: &[String],
    gone: &[String],
    timeline: &mut Timeline,
) -> anyhow::Result<()> {
    anyhow::ensure!(!stuck.is_empty(), "no etcd cluster lost its quorum");
    // Each stuck control plane's host and etcd cluster generation, once all are no-quorum
    // at a survivor with no membership change in progress.
    let at_survivors = |s: &pb::StatusResponse| -> Option<BTreeMap<String, (String, u64)>> {
        stuck
            .iter()
            .map(|name| {
                let c = s.control_planes.iter().find(|c| c.name == *name)?;
                let e = c.etcd.as_ref()?;
                (e.health == "no-quorum"
                    && !c.host.is_empty()
                    && !gone.contains(&c.host)
                    && e.change.is_empty())
                .then(|| (name.clone(), (c.host.clone(), e.generation)))
            })
            .collect()
    };
    let survivors = world::wait_for(
        Duration::from_secs(30),
        "every etcd cluster without quorum is shown no-quorum, hosted on its survivor",
        || async { at_survivors(&world.status().await?) },
    )
    .await?;
    let shown: Vec<String> = survivors
        .iter()
        .map(|(cp, (host, _))| format!("{cp} at {host}"))
        .collect();
    timeline.add("ring", "", format!("no-quorum: {}", shown.join(", ")));
    let until = Instant::now() + Duration::from_secs(3);
    while Instant::now() < until {
        if let Some(s) = world.status().await {
            anyhow::ensure!(
                at_survivors(&s).as_ref() == Some(&survivors),
                "an etcd cluster without quorum changed before its operator acted"
            );
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    for (name, (host, _)) in &survivors {
        for dry_run in [true, false] {
            let req = pb::ControlPlaneRecoverRequest {
                name: name.clone(),
                from_member: host.clone(),
                dry_run,
                reason: "ring-chaos: two of its zones lost".into(),
                from_backup: false,
            };
            let plan = world
                .admin
                .call(
                    req,
                    |mut c, r| async move { c.control_plane_recover(r).await },
                )
                .await
                .with_context(|| format!("cp recover {name} --from-member {host}"))?
                .plan;
            let flag = if dry_run { " --dry-run" } else { "" };
            timeline.add(
                "operator",
                name,
                format!("cp recover --from-member {host}{flag}: {plan}"),
            );
        }
    }
    Ok(())
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
    let history = world.history().await?;
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

/// Acknowledgements by a host after another host acknowledged a later write: once a new host
/// answered, every earlier host must be silent.
fn split_brain(acks: &[Ack]) -> u64 {
    let mut current = None;
    let mut retired = std::collections::BTreeSet::new();
    let mut count = 0;
    for a in acks {
        if retired.contains(&a.zone) {
            count += 1;
            continue;
        }
        if let Some(z) = current
            && z != a.zone
        {
            retired.insert(z);
        }
        current = Some(a.zone);
    }
    count
}

/// Watches the ring for `ms` (a phase of lossy-link): leader changes, members judged other
/// than healthy, control planes at another epoch than in `epochs` (which it then updates, so
/// that a move counts in the phase it happened in).
async fn watch_phase(
    world: &World,
    timeline: &mut Timeline,
    seen: &mut Seen,
    epochs: &mut BTreeMap<String, u64>,
    what: String,
    ms: u64,
) -> LossPhase {
    let mut phase = LossPhase {
        what,
        start_ms: timeline.now_ms(),
        ..LossPhase::default()
    };
    let until = Instant::now() + Duration::from_millis(ms);
    let mut leader = None;
    while Instant::now() < until {
        if let Some(s) = world.status().await {
            seen.update(&s, timeline);
            if s.leader_id != 0 {
                if leader.is_some_and(|l| l != s.leader_id) {
                    phase.leader_changes += 1;
                }
                leader = Some(s.leader_id);
            }
            for m in s.members.iter().filter(|m| m.health != "healthy") {
                let judged = format!("{} {}", m.name, m.health);
                if !phase.judged.contains(&judged) {
                    phase.judged.push(judged);
                }
            }
            for c in &s.control_planes {
                if let Some(epoch) = epochs.get_mut(&c.name)
                    && *epoch != c.epoch
                {
                    *epoch = c.epoch;
                    if !phase.moved.contains(&c.name) {
                        phase.moved.push(c.name.clone());
                    }
                }
            }
        }
        tokio::time::sleep(
            until
                .saturating_duration_since(Instant::now())
                .min(Duration::from_millis(200)),
        )
        .await;
    }
    phase.end_ms = timeline.now_ms();
    phase
}

/// The order of a rolling restart: by zone; for an upgrade the followers first, the leader
/// last (as deploy/README.md says), so the ring changes leaders once.
async fn restart_order(world: &world::World, upgrade: bool) -> anyhow::Result<Vec<usize>> {
    let all: Vec<usize> = (0..world.members.len()).collect();
    if !upgrade {
        return Ok(all);
    }
    let s = world
        .status()
        .await
        .ok_or_else(|| anyhow::anyhow!("no member answers before the upgrade"))?;
    let leader = s
        .members
        .iter()
        .find(|m| m.id == s.leader_id)
        .and_then(|m| world.member_index(&m.name))
        .ok_or_else(|| anyhow::anyhow!("no leader before the upgrade"))?;
    Ok(all
        .into_iter()
        .filter(|&i| i != leader)
        .chain([leader])
        .collect())
}

/// Where `scripts/previous-release.sh` puts the previous release's binaries, if it did.
pub fn previous_release_dir() -> Option<std::path::PathBuf> {
    let home = std::env::var_os("HOME")?;
    let dir = std::path::Path::new(&home).join(".cache/garden-ring/release-0.1.0-e0220b2/bin");
    dir.join("ringd").is_file().then_some(dir)
}

/// The longest wait for an acknowledgement that overlaps `[start_ms, end_ms]`, ms, whole (a
/// wait that began before the window counts from its start): between two consecutive
/// acknowledgements, and from the last one to the window's end if none came after it.
fn gap_within(acks: &[Ack], start_ms: u64, end_ms: u64) -> u64 {
    let mut longest = 0;
    let mut previous: Option<u64> = None;
    for a in acks {
        if let Some(p) = previous
            && a.at_ms > start_ms
            && p < end_ms
        {
            longest = longest.max(a.at_ms - p);
        }
        previous = Some(a.at_ms);
    }
    match previous {
        Some(p) if p < end_ms => longest.max(end_ms - p),
        Some(_) => longest,
        None => end_ms.saturating_sub(start_ms),
    }
}

/// The longest time between two acknowledgements, ms, and when it began (the first one's
/// time); (0, 0) with fewer than two.
fn longest_gap(acks: &[Ack]) -> (u64, u64) {
    acks.windows(2)
        .map(|w| (w[1].at_ms.saturating_sub(w[0].at_ms), w[0].at_ms))
        .max_by_key(|(gap, at)| (*gap, std::cmp::Reverse(*at)))
        .unwrap_or((0, 0))
}

/// The sequence numbers present in `cp`'s etcd at zone `z`.
/// The sequence numbers of `cp`'s keys at member `z`, up to `max_seq`: keys only, read in
/// blocks of 100,000 (a long run writes more than one range may return).
async fn read_seqs(cp: &str, z: usize, max_seq: u64) -> Option<std::collections::BTreeSet<u64>> {
    const BLOCK: u64 = 100_000;
    let client = connect(endpoint(cp, z)).await?;
    let mut seqs = std::collections::BTreeSet::new();
    for block in 0..=max_seq / BLOCK {
        // Keys are zero-padded to 10 digits: the first 5 name a block of 100,000.
        let first = key(cp, block * BLOCK);
        let prefix = &first[..first.len() - 5];
        let kvs = client.get_prefix_keys(prefix.as_bytes()).await.ok()?;
        seqs.extend(kvs.iter().filter_map(|kv| {
            std::str::from_utf8(&kv.key)
                .ok()?
                .rsplit('/')
                .next()?
                .parse::<u64>()
                .ok()
        }));
    }
    Some(seqs)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn acks(zones: &[usize]) -> Vec<Ack> {
        zones
            .iter()
            .enumerate()
            .map(|(i, z)| Ack {
                seq: i as u64 + 1,
                at_ms: i as u64 * 10,
                zone: *z,
            })
            .collect()
    }

    #[test]
    fn an_old_host_acknowledging_after_the_new_one_is_split_brain() {
        assert_eq!(split_brain(&acks(&[0, 0, 1, 1])), 0);
        assert_eq!(split_brain(&acks(&[0, 0, 1, 0, 1])), 1);
        assert_eq!(split_brain(&acks(&[0, 1, 2, 0, 1])), 2);
        assert_eq!(split_brain(&[]), 0);
    }

    #[test]
    fn gaps_are_between_acknowledgements() {
        let mut a = acks(&[0, 0, 1]);
        a[2].at_ms = 500;
        assert_eq!(longest_gap(&a), (490, 10));
        assert_eq!(longest_gap(&a[..1]), (0, 0));
        a[1].at_ms = 400;
        a[2].at_ms = 800;
        assert_eq!(longest_gap(&a), (400, 0), "the first of equal gaps");
    }

    #[test]
    fn gap_within_counts_the_waits_that_overlap_the_window() {
        let acks: Vec<Ack> = [100, 300, 1_300, 1_400]
            .into_iter()
            .enumerate()
            .map(|(i, at_ms)| Ack {
                seq: i as u64,
                at_ms,
                zone: 0,
            })
            .collect();
        assert_eq!(gap_within(&acks, 0, 2_000), 1_000, "300 -> 1300");
        assert_eq!(
            gap_within(&acks, 350, 1_350),
            1_000,
            "a wait begun before counts whole"
        );
        assert_eq!(gap_within(&acks, 2_000, 2_500), 1_100, "nothing since 1400");
        assert_eq!(
            gap_within(&acks, 1_350, 2_000),
            600,
            "1400 -> the window's end"
        );
        assert_eq!(gap_within(&[], 0, 500), 500, "nothing acknowledged at all");
    }

    #[test]
    fn scenario_names_are_unique() {
        let mut names: Vec<_> = SCENARIOS.iter().map(|s| s.name).collect();
        names.sort_unstable();
        names.dedup();
        assert_eq!(names.len(), SCENARIOS.len());
    }
}
