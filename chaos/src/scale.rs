//! The `scale` part of `ring-chaos bench`: the coordinator at scale, on loopback (no root, no
//! namespaces).
//!
//! Three release `ringd` (mutual TLS, loopback timings, driver `none`, the builtin DNS provider
//! on every member) get `control_planes` control planes, `on_victim` of them hosted on one
//! member (the victim, a follower unless `kill_leader`), the rest spread over the other two.
//! Once every control plane runs, the victim is SIGKILLed and the storm measured:
//!
//! - kill -> the victim committed `lost` (polled on a survivor's member list);
//! - kill -> the last of the victim's control planes moved (its migration's start: the move's
//!   proposal time, stamped by the leader; it commits right after);
//! - kill -> the last of them running at its new host (the migration's `done` time: the
//!   proposal time of its `ReportServing`);
//! - kill -> every one of their DNS names answered with the new host's address by every
//!   surviving member's builtin DNS server (queried, concurrently, until correct).
//!
//! Every `ringd`'s RSS (`VmRSS`) is sampled every 100 ms, at rest and during the storm, and its
//! peak (`VmHWM`) read at the end of each phase. Driver `none` starts nothing per control
//! plane, so this measures the coordinator itself.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use futures::StreamExt;
use garden_ring::admin::AdminClient;
use garden_ring::config::{InitialMember, Timing};
use garden_ring::dns::query::{Observed, observe};
use garden_ring::dns::update::RecordValue;
use garden_ring::pb;
use serde::Serialize;

use crate::bench::local::{self, LocalRing, RingSpec, ZONE};

/// Port of every control plane's endpoint (nothing listens: driver `none`).
const CP_PORT: u16 = 2379;
/// How often RSS is sampled.
const RSS_EVERY: Duration = Duration::from_millis(100);
/// DNS queries in flight at once.
const DNS_IN_FLIGHT: usize = 64;

/// What to run.
#[derive(Debug, Clone)]
pub struct ScaleOptions {
    /// Control planes registered.
    pub control_planes: usize,
    /// Of those, hosted on the member that is killed.
    pub on_victim: usize,
    /// Where the members' directories and logs, and `scale.json`, go.
    pub out: PathBuf,
    /// Directory with `ringd` (a release build is what the numbers are about).
    pub bin_dir: PathBuf,
    /// Registrations in flight at once.
    pub concurrency: usize,
    /// Kill the leader instead of a follower.
    pub kill_leader: bool,
    /// How long registration, and then the storm, may take before the run gives up.
    pub timeout: Duration,
    /// How long RSS is watched at rest, between registration and the kill.
    pub rest: Duration,
    /// Keep the members' data directories (otherwise removed at the end; logs are kept).
    pub keep_data: bool,
}

impl Default for ScaleOptions {
    fn default() -> Self {
        Self {
            control_planes: 10_000,
            on_victim: 1_000,
            out: PathBuf::from("target/scale"),
            bin_dir: PathBuf::new(),
            concurrency: 64,
            kill_leader: false,
            timeout: Duration::from_secs(600),
            rest: Duration::from_secs(5),
            keep_data: false,
        }
    }
}

/// RSS of one member, KiB.
#[derive(Debug, Clone, Default, Serialize)]
pub struct Rss {
    /// Largest `VmRSS` sampled at rest (after registration, before the kill).
    pub rest_kib: u64,
    /// `VmHWM` (peak) at the end of registration.
    pub peak_after_registration_kib: u64,
    /// Largest `VmRSS` sampled during the storm.
    pub storm_max_kib: u64,
    /// `VmHWM` (peak) at the end of the run, counted from the kill: the peak is reset then
    /// (`/proc/PID/clear_refs`), so registration's own peak, above, is not counted twice.
    pub peak_kib: u64,
}

/// What one run measured. Times are milliseconds; `None` means it did not happen in time.
#[derive(Debug, Clone, Default, Serialize)]
pub struct ScaleReport {
    /// Control planes registered.
    pub control_planes: usize,
    /// Hosted on the victim.
    pub on_victim: usize,
    /// The member killed.
    pub victim: String,
    /// Whether it led the ring when killed.
    pub victim_was_leader: bool,
    /// The leader before the kill.
    pub leader_before: String,
    /// CPU cores of the machine.
    pub cores: usize,
    /// Registering every control plane (all calls answered).
    pub registration_ms: u64,
    /// Registrations per second.
    pub registrations_per_s: f64,
    /// From the first registration to every control plane running.
    pub all_running_ms: Option<u64>,
    /// Kill -> the victim committed `lost`.
    pub lost_ms: Option<u64>,
    /// Kill -> the last of the victim's control planes moved (proposal time of its move).
    pub moved_ms: Option<u64>,
    /// Kill -> the last of them running at its new host (proposal time of its serving report).
    pub running_ms: Option<u64>,
    /// Kill -> every one of their names answered with the new host by every survivor's DNS.
    pub dns_ms: Option<u64>,
    /// Names answered correctly by every survivor at the end (of `on_victim`).
    pub dns_correct: usize,
    /// Where the moved control planes went: member -> count.
    pub new_hosts: BTreeMap<String, usize>,
    /// Per member.
    pub rss: BTreeMap<String, Rss>,
    /// What went wrong, if anything.
    pub problems: Vec<String>,
}

impl ScaleReport {
    /// The table printed at the end.
    pub fn table(&self) -> String {
        let show = |v: Option<u64>| v.map_or_else(|| "-".to_string(), |v| format!("{v} ms"));
        let mut out = String::new();
        out.push_str(&format!(
            "scale: {} control planes, {} on {} ({}), {} cores\n",
            self.control_planes,
            self.on_victim,
            self.victim,
            if self.victim_was_leader {
                "the leader"
            } else {
                "a follower"
            },
            self.cores
        ));
        out.push_str("| measure | value |\n| --- | --- |\n");
        out.push_str(&format!(
            "| registration ({} control planes) | {} ms ({:.0}/s) |\n",
            self.control_planes, self.registration_ms, self.registrations_per_s
        ));
        out.push_str(&format!(
            "| registration -> all running | {} |\n",
            show(self.all_running_ms)
        ));
        out.push_str(&format!(
            "| kill -> victim lost | {} |\n",
            show(self.lost_ms)
        ));
        out.push_str(&format!(
            "| kill -> all {} moved | {} |\n",
            self.on_victim,
            show(self.moved_ms)
        ));
        out.push_str(&format!(
            "| kill -> all {} running at new hosts | {} |\n",
            self.on_victim,
            show(self.running_ms)
        ));
        out.push_str(&format!(
            "| kill -> all {} names answered by the survivors' DNS | {} ({} correct) |\n",
            self.on_victim,
            show(self.dns_ms),
            self.dns_correct
        ));
        for (name, r) in &self.rss {
            out.push_str(&format!(
                "| RSS {name}: rest / peak after registration / storm max / peak | {} / {} / {} / {} MiB |\n",
                mib(r.rest_kib),
                mib(r.peak_after_registration_kib),
                mib(r.storm_max_kib),
                mib(r.peak_kib)
            ));
        }
        for p in &self.problems {
            out.push_str(&format!("problem: {p}\n"));
        }
        out
    }
}

fn mib(kib: u64) -> String {
    format!("{:.1}", kib as f64 / 1024.0)
}

/// The address control plane endpoints of member `index` have (and so its DNS answers).
fn host_ip(index: usize) -> Ipv4Addr {
    Ipv4Addr::new(127, 0, 1, u8::try_from(index + 1).unwrap_or(255))
}

/// (VmRSS, VmHWM) of `pid`, KiB.
fn rss_of(pid: u32) -> Option<(u64, u64)> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let field = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
    };
    Some((field("VmRSS:")?, field("VmHWM:")?))
}

/// Resets `pid`'s `VmHWM` to its current RSS (Linux 4.0 and later).
fn reset_peak(pid: u32) -> std::io::Result<()> {
    std::fs::write(format!("/proc/{pid}/clear_refs"), "5")
}

/// Samples the RSS of every member into `max` (per member) until told to stop.
struct Sampler {
    max: Arc<Mutex<BTreeMap<String, u64>>>,
    stop: tokio::sync::watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Sampler {
    fn start(pids: Vec<(String, u32)>) -> Self {
        let max = Arc::new(Mutex::new(BTreeMap::new()));
        let (stop, mut stopped) = tokio::sync::watch::channel(false);
        let seen = max.clone();
        let task = tokio::spawn(async move {
            loop {
                for (name, pid) in &pids {
                    if let Some((rss, _)) = rss_of(*pid) {
                        let mut m = seen.lock().unwrap_or_else(|e| e.into_inner());
                        let e = m.entry(name.clone()).or_insert(0);
                        *e = (*e).max(rss);
                    }
                }
                tokio::select! {
                    _ = tokio::time::sleep(RSS_EVERY) => {}
                    _ = stopped.wait_for(|s| *s) => return,
                }
            }
        });
        Self { max, stop, task }
    }

    async fn finish(self) -> BTreeMap<String, u64> {
        let _ = self.stop.send(true);
        let _ = self.task.await;
        self.max.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }
}

fn unix_ms() -> u64 {
    garden_ring::time::unix_ms()
}

/// Runs the scale measurement (see the module docs).
pub async fn run(opts: &ScaleOptions) -> anyhow::Result<ScaleReport> {
    if opts.control_planes == 0 || opts.on_victim > opts.control_planes {
        bail!("--on-victim must be at most --control-planes, which must be at least 1");
    }
    if opts.control_planes > garden_ring::core::limits::MAX_CONTROL_PLANES {
        bail!(
            "at most {} control planes",
            garden_ring::core::limits::MAX_CONTROL_PLANES
        );
    }
    let ringd_bin = opts.bin_dir.join("ringd");
    if !ringd_bin.is_file() {
        bail!(
            "{} has no ringd (build with `cargo build --release -p garden-ring --bins`, or pass --bin-dir)",
            opts.bin_dir.display()
        );
    }
    garden_ring::tls::install_crypto_provider();
    let dir = opts.out.join("run");
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    let dir = dir.canonicalize()?;
    let certs = local::certificates(&dir)?;
    let spec = RingSpec {
        timing: Timing::loopback(),
        dns: true,
        // The keeper checks only its own server: the storm's 1,000 names are what the
        // measurement asks every survivor about, and three servers' worth of checks would
        // be load the coordinator adds only because of the benchmark.
        verify_every_server: false,
        driver: Default::default(),
        backup: Default::default(),
        metrics: false,
    };
    let mut ring = LocalRing::start(&dir, &opts.bin_dir, &certs, &spec)?;
    let founders = ring.members[0].config.initial_members.clone();
    let security = ring.security.clone();
    let clients = founders
        .iter()
        .map(|m| {
            AdminClient::new(
                vec![m.admin_address.clone()],
                security.clone(),
                "ring-chaos",
            )
            .map(|c| c.with_request_timeout(Duration::from_secs(30)))
        })
        .collect::<Result<Vec<_>, _>>()?;

    let result = measure(opts, &founders, &mut ring, &clients).await;
    for m in &mut ring.members {
        m.proc.kill9();
    }
    if !opts.keep_data {
        for m in &founders {
            let _ = std::fs::remove_dir_all(dir.join(&m.name).join("data"));
        }
    }
    let report = result?;
    std::fs::write(
        opts.out.join("scale.json"),
        serde_json::to_string_pretty(&report)?,
    )?;
    Ok(report)
}

async fn status(client: &AdminClient) -> Option<pb::StatusResponse> {
    client
        .call_once(pb::StatusRequest::default(), &mut |mut c, r| async move {
            c.status(r).await
        })
        .await
        .ok()
}

fn cp_name(i: usize) -> String {
    format!("cp-{i:05}")
}

fn add_request(i: usize, host: &str, founders: &[InitialMember]) -> pb::ControlPlaneAddRequest {
    let name = cp_name(i);
    pb::ControlPlaneAddRequest {
        dns_name: format!("{name}.{ZONE}"),
        endpoints: founders
            .iter()
            .enumerate()
            .map(|(z, m)| (m.name.clone(), format!("{}:{CP_PORT}", host_ip(z))))
            .collect(),
        backup: format!("s3://scale/{name}"),
        backups: Default::default(),
        home: String::new(),
        host: host.to_string(),
        reason: "ring-chaos scale".into(),
        prefer: Vec::new(),
        tolerance: Default::default(),
        etcd_peers: Default::default(),
        name,
    }
}

async fn measure(
    opts: &ScaleOptions,
    founders: &[InitialMember],
    ring: &mut LocalRing,
    clients: &[AdminClient],
) -> anyhow::Result<ScaleReport> {
    let mut report = ScaleReport {
        control_planes: opts.control_planes,
        on_victim: opts.on_victim,
        cores: std::thread::available_parallelism().map_or(1, |n| n.get()),
        ..ScaleReport::default()
    };
    // The ring forms, every member healthy.
    let formed = crate::world::poll(
        Duration::from_secs(60),
        Duration::from_millis(100),
        "the ring formed and every member is healthy",
        || async {
            let s = status(&clients[0]).await?;
            (s.leader_id != 0
                && s.members.len() == 3
                && s.members.iter().all(|m| m.health == "healthy"))
            .then_some(s)
        },
    )
    .await?;
    let leader = formed
        .members
        .iter()
        .find(|m| m.id == formed.leader_id)
        .map(|m| m.name.clone())
        .context("the leader is not a member")?;
    let victim = if opts.kill_leader {
        leader.clone()
    } else {
        founders
            .iter()
            .map(|m| m.name.clone())
            .find(|n| *n != leader)
            .context("no follower")?
    };
    let victim_index = founders
        .iter()
        .position(|m| m.name == victim)
        .context("victim")?;
    let others: Vec<String> = founders
        .iter()
        .map(|m| m.name.clone())
        .filter(|n| *n != victim)
        .collect();
    report.victim = victim.clone();
    report.leader_before = leader.clone();
    println!("ring formed; leader {leader}, victim {victim}");

    // Register: the first `on_victim` on the victim, the rest alternately on the others.
    let leader_index = founders.iter().position(|m| m.name == leader).unwrap_or(0);
    let hosts: Vec<String> = (0..opts.control_planes)
        .map(|i| {
            if i < opts.on_victim {
                victim.clone()
            } else {
                others[i % others.len()].clone()
            }
        })
        .collect();
    let pids: Vec<(String, u32)> = ring
        .members
        .iter()
        .filter_map(|m| Some((m.config.name.clone(), m.proc.pid()?)))
        .collect();
    let started = Instant::now();
    let done = Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let progress = {
        let done = done.clone();
        let total = opts.control_planes;
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(Duration::from_secs(5)).await;
                println!(
                    "  registered {} of {total} after {} s",
                    done.load(std::sync::atomic::Ordering::Relaxed),
                    started.elapsed().as_secs()
                );
            }
        })
    };
    let client = &clients[leader_index];
    let results: Vec<anyhow::Result<()>> = futures::stream::iter(hosts.iter().enumerate())
        .map(|(i, host)| {
            let req = add_request(i, host, founders);
            let done = done.clone();
            async move {
                client
                    .call(req, |mut c, r| async move { c.control_plane_add(r).await })
                    .await
                    .with_context(|| format!("registering control plane {i}"))?;
                done.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                Ok(())
            }
        })
        .buffer_unordered(opts.concurrency.max(1))
        .collect()
        .await;
    progress.abort();
    let failed: Vec<_> = results.into_iter().filter_map(Result::err).collect();
    report.registration_ms = ms(started.elapsed());
    report.registrations_per_s =
        opts.control_planes as f64 / started.elapsed().as_secs_f64().max(0.001);
    if let Some(e) = failed.first() {
        bail!("{} registrations failed, the first: {e:#}", failed.len());
    }
    println!(
        "registered {} control planes in {} ms",
        opts.control_planes, report.registration_ms
    );
    // Every control plane runs: its name answers its host at a survivor's DNS. (Not a list of
    // the control planes: that is megabytes a member encodes, and its memory would be counted
    // as the ring's at rest.)
    let survivors: Vec<usize> = (0..founders.len()).filter(|i| *i != victim_index).collect();
    let dns_servers: Vec<SocketAddr> = survivors
        .iter()
        .map(|i| ring.members[*i].dns.context("a member without DNS"))
        .collect::<anyhow::Result<_>>()?;
    let index_of = |name: &str| founders.iter().position(|m| m.name == name);
    let expected: Vec<(String, Ipv4Addr)> = hosts
        .iter()
        .enumerate()
        .map(|(i, host)| (cp_name(i), host_ip(index_of(host).unwrap_or(0))))
        .collect();
    let wrong = wait_dns(dns_servers[0], &expected, opts.timeout).await;
    if wrong > 0 {
        bail!(
            "{wrong} of {} names do not answer their host after {:?} (the ring did not settle)",
            expected.len(),
            opts.timeout
        );
    }
    report.all_running_ms = Some(ms(started.elapsed()));
    println!(
        "all {} running (answered by DNS) {} ms after registration began",
        expected.len(),
        ms(started.elapsed())
    );
    let on_victim: Vec<String> = (0..opts.on_victim).map(cp_name).collect();
    // At rest.
    let peak_after_registration: BTreeMap<String, u64> = pids
        .iter()
        .filter_map(|(n, p)| Some((n.clone(), rss_of(*p)?.1)))
        .collect();
    let sampler = Sampler::start(pids.clone());
    tokio::time::sleep(opts.rest).await;
    let rest = sampler.finish().await;
    // Asked of the victim: a status lists every control plane, and the victim's memory is
    // of no interest afterwards.
    let before = status(&clients[victim_index])
        .await
        .context("status before the kill")?;
    let leader_now = before
        .members
        .iter()
        .find(|m| m.id == before.leader_id)
        .map(|m| m.name.clone())
        .unwrap_or_default();
    report.victim_was_leader = leader_now == victim;
    if report.victim_was_leader != opts.kill_leader {
        report.problems.push(format!(
            "the leader moved to {leader_now} during registration"
        ));
    }
    report.leader_before = leader_now;
    // Sanity: the survivors' DNS answers the victim's control planes with the victim.
    let sample = &on_victim[..on_victim.len().min(20)];
    for name in sample {
        for server in &dns_servers {
            let seen = query(*server, name).await;
            if !matches!(&seen, Observed::Values(v) if v == &[RecordValue::A(host_ip(victim_index))])
            {
                report.problems.push(format!(
                    "before the kill, {server} answers {name} with {seen}"
                ));
                break;
            }
        }
    }

    // The storm. Each member's peak is counted from here on: registration's peak is reported
    // above, on its own.
    for (name, pid) in &pids {
        if let Err(e) = reset_peak(*pid) {
            report.problems.push(format!(
                "cannot reset {name}'s peak RSS, so its storm peak includes registration: {e}"
            ));
        }
    }
    let storm = Sampler::start(pids.clone());
    let killed_unix = unix_ms();
    let killed = Instant::now();
    ring.members[victim_index].proc.kill9();
    println!("killed {victim}; watching the storm");
    let survivor_client = &clients[survivors[0]];
    let lost = async {
        crate::world::poll(
            opts.timeout,
            Duration::from_millis(20),
            "the victim is lost",
            || async {
                let list = survivor_client
                    .call_once(
                        pb::MemberListRequest::default(),
                        &mut |mut c, r| async move { c.member_list(r).await },
                    )
                    .await
                    .ok()?;
                list.members
                    .iter()
                    .any(|m| m.name == victim && m.health == "lost")
                    .then(|| ms(killed.elapsed()))
            },
        )
        .await
        .ok()
    };
    let dns = watch_dns(
        &dns_servers,
        &on_victim,
        host_ip(victim_index),
        killed,
        opts.timeout,
    );
    let (lost_ms, (dns_ms, dns_correct)) = tokio::join!(lost, dns);
    report.lost_ms = lost_ms;
    report.dns_ms = dns_ms;
    report.dns_correct = dns_correct;
    // A little longer at the new steady state, then the peaks.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let storm_max = storm.finish().await;
    for (name, pid) in &pids {
        // The victim is gone: its peak is the largest it was seen at.
        let peak = rss_of(*pid).map(|(_, hwm)| hwm).unwrap_or_else(|| {
            peak_after_registration
                .get(name)
                .copied()
                .unwrap_or_default()
                .max(rest.get(name).copied().unwrap_or_default())
        });
        report.rss.insert(
            name.clone(),
            Rss {
                rest_kib: rest.get(name).copied().unwrap_or_default(),
                peak_after_registration_kib: peak_after_registration
                    .get(name)
                    .copied()
                    .unwrap_or_default(),
                storm_max_kib: storm_max.get(name).copied().unwrap_or_default(),
                peak_kib: peak,
            },
        );
    }
    // The ring's own stamps: when each move and each serving report was proposed (listed
    // after the peaks were read: a list is megabytes).
    let mut after = None;
    for i in &survivors {
        if let Some(l) = list(&clients[*i]).await {
            after = Some(l);
            break;
        }
    }
    let after = after.context("no survivor lists the control planes")?;
    let moved: BTreeSet<&str> = on_victim.iter().map(String::as_str).collect();
    let mut last_move = Some(0u64);
    let mut last_running = Some(0u64);
    for cp in after.iter().filter(|c| moved.contains(c.name.as_str())) {
        *report.new_hosts.entry(cp.host.clone()).or_default() += 1;
        let migration = cp.migration.as_ref().filter(|m| m.epoch == cp.epoch);
        match migration {
            Some(m) if cp.host != victim && cp.epoch >= 2 => {
                last_move = last_move.map(|l| l.max(m.started_unix_ms));
                if cp.phase == "running" && m.step == "done" {
                    last_running = last_running.map(|l| l.max(m.updated_unix_ms));
                } else {
                    last_running = None;
                }
            }
            _ => {
                last_move = None;
                last_running = None;
            }
        }
    }
    report.moved_ms = last_move.map(|t| t.saturating_sub(killed_unix));
    report.running_ms = last_running.map(|t| t.saturating_sub(killed_unix));
    if report.dns_ms.is_none() {
        report.problems.push(format!(
            "only {} of {} names answered with a new host within {:?}",
            report.dns_correct, opts.on_victim, opts.timeout
        ));
    }
    Ok(report)
}

fn ms(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

async fn list(client: &AdminClient) -> Option<Vec<pb::ControlPlane>> {
    client
        .call_once(
            pb::ControlPlaneListRequest::default(),
            &mut |mut c, r| async move { c.control_plane_list(r).await },
        )
        .await
        .ok()
        .map(|l| l.control_planes)
}

async fn query(server: SocketAddr, cp: &str) -> Observed {
    observe(
        server,
        &format!("{cp}.{ZONE}"),
        &RecordValue::A(Ipv4Addr::LOCALHOST),
        Duration::from_millis(1_000),
    )
    .await
}

/// Queries `server` for every name until each answers its address, at most `timeout`; returns
/// how many still do not.
async fn wait_dns(server: SocketAddr, expected: &[(String, Ipv4Addr)], timeout: Duration) -> usize {
    let started = Instant::now();
    let mut open: Vec<&(String, Ipv4Addr)> = expected.iter().collect();
    let mut last_reported = Instant::now();
    while !open.is_empty() && started.elapsed() < timeout {
        let answers: Vec<(&(String, Ipv4Addr), bool)> = futures::stream::iter(open)
            .map(|pair| async move {
                let seen = query(server, &pair.0).await;
                let ok = matches!(&seen, Observed::Values(v) if v == &[RecordValue::A(pair.1)]);
                (pair, ok)
            })
            .buffer_unordered(DNS_IN_FLIGHT)
            .collect()
            .await;
        open = answers
            .into_iter()
            .filter(|(_, ok)| !*ok)
            .map(|(p, _)| p)
            .collect();
        if last_reported.elapsed() >= Duration::from_secs(5) {
            println!(
                "  {} of {} names answer their host",
                expected.len() - open.len(),
                expected.len()
            );
            last_reported = Instant::now();
        }
        if !open.is_empty() {
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }
    open.len()
}

/// Queries every (name, server) until each answers an address other than `old`; returns when
/// the last one did (after `since`) and how many names every server answered correctly.
async fn watch_dns(
    servers: &[SocketAddr],
    names: &[String],
    old: Ipv4Addr,
    since: Instant,
    timeout: Duration,
) -> (Option<u64>, usize) {
    let mut open: Vec<(String, SocketAddr)> = names
        .iter()
        .flat_map(|n| servers.iter().map(move |s| (n.clone(), *s)))
        .collect();
    let mut last_reported = Instant::now();
    let mut last_ok = 0;
    while !open.is_empty() && since.elapsed() < timeout {
        let answers: Vec<((String, SocketAddr), Option<u64>)> = futures::stream::iter(open)
            .map(|(name, server)| async move {
                let seen = query(server, &name).await;
                let ok = matches!(&seen, Observed::Values(v)
                    if v.len() == 1 && matches!(v[0], RecordValue::A(ip) if ip != old));
                ((name, server), ok.then(|| ms(since.elapsed())))
            })
            .buffer_unordered(DNS_IN_FLIGHT)
            .collect()
            .await;
        open = Vec::new();
        for (key, ok_at) in answers {
            match ok_at {
                Some(at) => last_ok = last_ok.max(at),
                None => open.push(key),
            }
        }
        if last_reported.elapsed() >= Duration::from_secs(1) {
            println!(
                "  {} s: {} of {} (name, server) pairs answer the new host",
                since.elapsed().as_secs(),
                names.len() * servers.len() - open.len(),
                names.len() * servers.len()
            );
            last_reported = Instant::now();
        }
        if !open.is_empty() {
            tokio::time::sleep(Duration::from_millis(20)).await;
        }
    }
    let wrong: BTreeSet<&str> = open.iter().map(|(n, _)| n.as_str()).collect();
    let correct = names.len() - wrong.len();
    (open.is_empty().then_some(last_ok), correct)
}
