//! Processes on loopback for the benchmarks, without namespaces or root: a ring of `ringd`s
//! with mutual TLS (the production setup), a 3-member etcd cluster, free ports, and children
//! that are killed when dropped (also when a part fails or panics).

use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use garden_ring::backup::etcd::{EtcdClient, EtcdClientOptions};
use garden_ring::config::{
    Config, DnsSettings, InitialMember, LogSettings, PlacementSettings, SnapshotSettings, Timing,
    TlsSettings,
};
use garden_ring::pb;
use garden_ring::pb::admin_client::AdminClient as Grpc;
use garden_ring::tls::client::Expect;
use garden_ring::tls::{Identity, Role, Security, TlsStore};
use tonic::transport::Channel;

/// A child process with its output in a log, SIGKILLed and reaped when dropped (see
/// [`garden_ring_tests::child`]).
pub use garden_ring_tests::child::LoggedChild as Child;

/// The DNS zone of the benchmark rings.
pub const ZONE: &str = "bench.garden-ring.test";

/// `n` distinct free loopback ports (all bound at once, then released).
pub fn free_ports(n: usize) -> anyhow::Result<Vec<u16>> {
    let listeners = (0..n)
        .map(|_| TcpListener::bind("127.0.0.1:0"))
        .collect::<Result<Vec<_>, _>>()
        .context("reserving loopback ports")?;
    listeners
        .iter()
        .map(|l| Ok(l.local_addr()?.port()))
        .collect()
}

/// What kind of ring to start.
#[derive(Debug, Clone)]
pub struct RingSpec {
    /// Raft and failure-detection timings.
    pub timing: Timing,
    /// Whether every member serves the zone (builtin DNS) on a port of its own.
    pub dns: bool,
    /// With `dns`: whether the leader checks every member's server for each record (as in
    /// production), or only its own.
    pub verify_every_server: bool,
    /// The members' driver (`none` by default).
    pub driver: garden_ring::config::DriverSettings,
    /// How the members reach their backup locations.
    pub backup: garden_ring::config::BackupSettings,
    /// Whether every member serves `/metrics` on a port of its own.
    pub metrics: bool,
}

impl Default for RingSpec {
    fn default() -> Self {
        Self {
            timing: Timing::loopback(),
            dns: false,
            verify_every_server: false,
            driver: Default::default(),
            backup: Default::default(),
            metrics: false,
        }
    }
}

/// One member of a [`LocalRing`].
pub struct RingMember {
    /// Its config.
    pub config: Config,
    /// Where it serves DNS, if it does.
    pub dns: Option<SocketAddr>,
    /// Its `ringd`.
    pub proc: Child,
    /// A lazily connected channel to its Admin API (for polling; reconnects by itself).
    channel: Channel,
}

impl RingMember {
    /// Its Admin address.
    pub fn admin(&self) -> String {
        self.config.admin_address()
    }

    /// A client over the shared channel.
    pub fn client(&self) -> Grpc<Channel> {
        Grpc::new(self.channel.clone())
    }

    /// Its status, or `None` when it does not answer within the channel's timeout.
    pub async fn status(&self) -> Option<pb::StatusResponse> {
        self.client()
            .status(pb::StatusRequest::default())
            .await
            .ok()
            .map(tonic::Response::into_inner)
    }
}

/// A ring of three `ringd` processes on loopback, with mutual TLS.
pub struct LocalRing {
    /// The members, a, b, c.
    pub members: Vec<RingMember>,
    /// How clients authenticate (the `admin:operator` certificate).
    pub security: Security,
}

/// Makes the CA and the certificates (members a, b, c, `admin:operator`) in `dir/certs`
/// (reused when present); returns that directory.
pub fn certificates(dir: &Path) -> anyhow::Result<PathBuf> {
    Ok(garden_ring::demo::demo_certificates(
        dir,
        &founders(&[0; 6]),
    )?)
}

fn founders(ports: &[u16]) -> Vec<InitialMember> {
    (0..3)
        .map(|i| {
            let name = char::from(b'a' + i as u8).to_string();
            InitialMember {
                id: i as u64 + 1,
                zone: format!("zone-{name}"),
                name,
                address: format!("127.0.0.1:{}", ports[2 * i + 1]),
                admin_address: format!("127.0.0.1:{}", ports[2 * i]),
            }
        })
        .collect()
}

impl LocalRing {
    /// Starts a 3-member ring in `dir` (one directory per member) with the `ringd` in `bin_dir`
    /// and the certificates in `certs` (see [`certificates`]); returns at once (see
    /// [`LocalRing::wait_healthy`]).
    pub fn start(
        dir: &Path,
        bin_dir: &Path,
        certs: &Path,
        spec: &RingSpec,
    ) -> anyhow::Result<Self> {
        let ports = free_ports(12)?;
        let founders = founders(&ports);
        let dns_of = |i: usize| SocketAddr::from(([127, 0, 0, 1], ports[6 + i]));
        let files = garden_ring::demo::tls_files(certs, &Identity::new(Role::Admin, "operator")?);
        let security = Security::Tls(TlsStore::load(files, None)?);
        let mut members = Vec::new();
        for (i, m) in founders.iter().enumerate() {
            let home = dir.join(&m.name);
            std::fs::create_dir_all(&home)?;
            let dns = spec.dns.then(|| dns_of(i));
            let config = Config {
                id: m.id,
                name: m.name.clone(),
                zone: m.zone.clone(),
                data_dir: home.join("data"),
                listen_peer: m.address.parse()?,
                listen_admin: m.admin_address.parse()?,
                advertise_peer: None,
                advertise_admin: None,
                initial_members: founders.clone(),
                timing: spec.timing.clone(),
                snapshot: SnapshotSettings::default(),
                log: LogSettings::default(),
                backup: spec.backup.clone(),
                upgrade: Default::default(),
                tls: Some(TlsSettings {
                    files: garden_ring::demo::tls_files(
                        certs,
                        &Identity::new(Role::Member, &m.name)?,
                    ),
                    reload_interval_ms: 1_000,
                }),
                insecure: false,
                dns: DnsSettings {
                    zone: Some(ZONE.into()),
                    ttl_s: 5,
                    listen: dns,
                    verify_servers: match (spec.dns, spec.verify_every_server) {
                        (false, _) => Vec::new(),
                        (true, true) => (0..founders.len()).map(dns_of).collect(),
                        (true, false) => vec![dns_of(i)],
                    },
                    ..DnsSettings::default()
                },
                admin: Default::default(),
                metrics: garden_ring::config::MetricsSettings {
                    listen: spec
                        .metrics
                        .then(|| SocketAddr::from(([127, 0, 0, 1], ports[9 + i]))),
                },
                placement: PlacementSettings {
                    min_move_interval_ms: 1_000,
                    capacity: 0,
                    ..PlacementSettings::default()
                },
                driver: spec.driver.clone(),
            };
            config
                .validate()
                .with_context(|| format!("config of member {}", m.name))?;
            let path = home.join("ringd.toml");
            std::fs::write(&path, config.to_toml())?;
            let proc = Child::spawn(
                format!("ringd {}", m.name),
                Command::new(bin_dir.join("ringd"))
                    .arg("--config")
                    .arg(&path)
                    .env("RUST_LOG", ""),
                home.join("ringd.log"),
            )?;
            let channel = garden_ring::tls::client::channel(
                &m.admin_address,
                &security,
                Expect::AnyMember,
                Duration::from_millis(500),
                |e| e.timeout(Duration::from_millis(1_000)),
            )?;
            members.push(RingMember {
                config,
                dns,
                proc,
                channel,
            });
        }
        Ok(Self { members, security })
    }

    /// Waits until the ring formed and every member sees every member healthy.
    pub async fn wait_healthy(&mut self, timeout: Duration) -> anyhow::Result<()> {
        let deadline = Instant::now() + timeout;
        loop {
            for m in &mut self.members {
                m.proc.check_running()?;
            }
            let mut healthy = 0;
            for m in &self.members {
                if let Some(s) = m.status().await
                    && s.leader_id != 0
                    && s.members.len() == self.members.len()
                    && s.members.iter().all(|m| m.health == "healthy")
                {
                    healthy += 1;
                }
            }
            if healthy == self.members.len() {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!("the ring did not form with every member healthy within {timeout:?}");
            }
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }

    /// The index (in [`LocalRing::members`]) of the member every answering member names as
    /// leader.
    pub async fn leader(&self) -> Option<usize> {
        let mut leader = None;
        for m in &self.members {
            let s = m.status().await?;
            if s.leader_id == 0 || leader.is_some_and(|l| l != s.leader_id) {
                return None;
            }
            leader = Some(s.leader_id);
        }
        let id = leader?;
        self.members.iter().position(|m| m.config.id == id)
    }

    /// A new channel to member `i`'s Admin API, connected now (one per benchmark client).
    pub async fn connect(&self, i: usize) -> anyhow::Result<Grpc<Channel>> {
        let channel = garden_ring::tls::client::connect(
            &self.members[i].admin(),
            &self.security,
            Expect::AnyMember,
            Duration::from_secs(2),
            |e| e.timeout(Duration::from_secs(10)),
        )
        .await
        .with_context(|| format!("connecting to {}", self.members[i].admin()))?;
        Ok(Grpc::new(channel))
    }

    /// Stops every member (SIGTERM, then SIGKILL).
    pub fn stop(&mut self) {
        for m in &mut self.members {
            m.proc.terminate_within(Duration::from_secs(5));
        }
    }
}

/// A control plane named `name` that members a, b, c can host at 10.0.0.1..3 (so the address
/// its DNS name points at tells the host), hosted on `host` when given.
pub fn control_plane(name: &str, host: Option<&str>) -> pb::ControlPlaneAddRequest {
    pb::ControlPlaneAddRequest {
        name: name.into(),
        home: String::new(),
        dns_name: format!("{name}.{ZONE}"),
        endpoints: ["a", "b", "c"]
            .iter()
            .enumerate()
            .map(|(i, m)| (m.to_string(), format!("10.0.0.{}:443", i + 1)))
            .collect(),
        backup: format!("s3://bench/{name}"),
        backups: Default::default(),
        host: host.unwrap_or_default().into(),
        reason: "ring-chaos bench".into(),
        prefer: Vec::new(),
        tolerance: Default::default(),
        etcd_peers: Default::default(),
    }
}

/// The address control plane endpoints on member `name` have (see [`control_plane`]).
pub fn endpoint_ip(name: &str) -> std::net::Ipv4Addr {
    let i = name.bytes().next().map_or(0, |b| b.saturating_sub(b'a'));
    std::net::Ipv4Addr::new(10, 0, 0, i + 1)
}

/// A 3-member etcd cluster on loopback, default settings (fsync on).
pub struct EtcdCluster {
    /// Client URLs, member order.
    pub client_urls: Vec<String>,
    procs: Vec<Child>,
}

impl EtcdCluster {
    /// Starts it in `dir` (a data directory and a log per member) and waits until it has a
    /// leader that answers.
    pub async fn start(dir: &Path, etcd: &Path) -> anyhow::Result<Self> {
        let ports = free_ports(6)?;
        let names = ["e1", "e2", "e3"];
        let peer = |i: usize| format!("http://127.0.0.1:{}", ports[2 * i + 1]);
        let client = |i: usize| format!("http://127.0.0.1:{}", ports[2 * i]);
        let cluster = names
            .iter()
            .enumerate()
            .map(|(i, n)| format!("{n}={}", peer(i)))
            .collect::<Vec<_>>()
            .join(",");
        let mut procs = Vec::new();
        for (i, name) in names.iter().enumerate() {
            let args: Vec<String> = [
                "--name",
                name,
                "--data-dir",
                &dir.join(format!("{name}.etcd")).display().to_string(),
                "--listen-client-urls",
                &client(i),
                "--advertise-client-urls",
                &client(i),
                "--listen-peer-urls",
                &peer(i),
                "--initial-advertise-peer-urls",
                &peer(i),
                "--initial-cluster",
                &cluster,
                "--initial-cluster-state",
                "new",
                "--initial-cluster-token",
                "ring-chaos-bench",
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            procs.push(Child::spawn(
                format!("etcd {name}"),
                Command::new(etcd).args(&args).env("RUST_LOG", ""),
                dir.join(format!("{name}.log")),
            )?);
        }
        let mut cluster = Self {
            client_urls: (0..names.len()).map(client).collect(),
            procs,
        };
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            for p in &mut cluster.procs {
                p.check_running()?;
            }
            if cluster.leader().await.is_some() {
                return Ok(cluster);
            }
            if Instant::now() >= deadline {
                bail!("the etcd cluster elected no leader within 30 s");
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// The client URL of the leader, once every member answers and names it.
    pub async fn leader(&self) -> Option<String> {
        let options = EtcdClientOptions {
            connect_timeout_ms: 500,
            request_timeout_ms: 1_000,
            ..EtcdClientOptions::default()
        };
        let mut statuses = Vec::new();
        for url in &self.client_urls {
            let c = EtcdClient::connect(url, options).await.ok()?;
            statuses.push((url.clone(), c.status().await.ok()?));
        }
        let leader = statuses.first()?.1.leader;
        if leader == 0 || statuses.iter().any(|(_, s)| s.leader != leader) {
            return None;
        }
        statuses
            .into_iter()
            .find(|(_, s)| s.member_id == leader)
            .map(|(url, _)| url)
    }

    /// The members' pids.
    pub fn pids(&self) -> Vec<u32> {
        self.procs.iter().filter_map(Child::pid).collect()
    }

    /// Stops every member (SIGTERM, then SIGKILL).
    pub fn stop(&mut self) {
        for p in &mut self.procs {
            p.terminate_within(Duration::from_secs(5));
        }
    }
}

/// `etcd --version`'s first line.
pub fn etcd_version(etcd: &Path) -> String {
    Command::new(etcd)
        .arg("--version")
        .output()
        .ok()
        .and_then(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .next()
                .map(str::to_string)
        })
        .unwrap_or_else(|| "unknown".into())
}
