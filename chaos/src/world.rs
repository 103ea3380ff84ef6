//! The world of one run: the region's DNS server (BIND, RFC 2136 with TSIG) and object store
//! (`moto_server`), one `ringd` per zone running its control planes' etcd, and the control
//! planes registered. Every process runs inside its namespace (`ip netns exec`), logs into the
//! run's directory, and dies with the namespace when the [`crate::netns::Topology`] is dropped.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use garden_ring::admin::AdminClient;
use garden_ring::config::{
    BackupSettings, Config, DnsProvider, DnsSettings, DriverKind, DriverSettings,
    EtcdDriverSettings, InitialMember, LogSettings, PlacementSettings, Rfc2136Settings,
    SnapshotSettings, Timing, TlsSettings,
};
use garden_ring::dns::update::RecordValue;
use garden_ring::pb;
use garden_ring::tls::{Identity, Role, Security, TlsStore};
use garden_ring_tests::child::LoggedChild;

use crate::netns::{REGION, client_address_of_zone, mesh_address, namespace};

/// The ring's DNS zone.
pub const ZONE: &str = "chaos.garden-ring.test";
/// The DNS server's address.
pub const DNS_SERVER: SocketAddr = SocketAddr::new(std::net::IpAddr::V4(REGION), 53);
/// The object store's port.
const S3_PORT: u16 = 9000;
/// First port of the control planes' endpoints: control plane i listens on `CP_PORT + i`.
pub const CP_PORT: u16 = 2379;
/// First port of the control planes' etcd peers (tolerance zone): control plane i's etcd
/// member listens on `ETCD_PEER_PORT + i` at each zone's mesh address.
pub const ETCD_PEER_PORT: u16 = 12380;
/// How long a lost member's etcd members wait before they are replaced on a spare zone (only
/// a ring of more than three zones has spares).
pub const ETCD_REPLACE_AFTER_MS: u64 = 3_000;
/// How often each etcd takes a full snapshot: rarely, so that a restore after a zone loss
/// replays the delta snapshots written since.
pub const SNAPSHOT_INTERVAL_MS: u64 = 60_000;
/// How often each etcd writes a delta snapshot (the events since the last snapshot).
pub const DELTA_PERIOD_MS: u64 = 1_000;
/// Longest wait for a service to answer.
const START_TIMEOUT: Duration = Duration::from_secs(30);
/// How long one Admin request to one member may take (the per-member clients).
pub const ADMIN_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);

/// Index of `named` in [`World::region`].
pub const NAMED: usize = 0;
/// Index of `moto_server` in [`World::region`].
pub const MOTO: usize = 1;

/// Where the binaries are.
#[derive(Debug, Clone)]
pub struct Binaries {
    /// `ringd` and `ring-guard`.
    pub ring_dir: PathBuf,
    /// `etcd` and `etcdctl`/`etcdutl`.
    pub etcd_dir: PathBuf,
    /// libfaketime to preload into every `ringd` (clock-jump): each member's wall clock then
    /// follows the offset in its [`Member::clock_file`] (`+0` at start); its monotonic clock is
    /// left alone, as an NTP step leaves it.
    pub faketime: Option<PathBuf>,
    /// Another release's `ringd` and `ring-guard` the members start with (rolling-upgrade,
    /// which restarts them onto `ring_dir`'s one by one); `None`: `ring_dir`'s.
    pub start_from: Option<PathBuf>,
}

impl Binaries {
    /// Where the members' first `ringd` and `ring-guard` come from.
    pub fn start_dir(&self) -> &Path {
        self.start_from.as_deref().unwrap_or(&self.ring_dir)
    }
}

/// Restarts member `m`'s `ringd` (stopped already) on the binaries in `to` instead of
/// `from`: its command line and its config's `ring-guard` path.
pub fn switch_binaries(m: &mut Member, from: &Path, to: &Path) -> anyhow::Result<()> {
    let old = from.join("ringd").display().to_string();
    let new = to.join("ringd").display().to_string();
    let mut switched = false;
    for arg in &mut m.ringd.argv {
        if *arg == old {
            *arg = new.clone();
            switched = true;
        }
        if let Some(config) = arg.strip_suffix("ringd.toml").map(|_| arg.clone()) {
            let text = std::fs::read_to_string(&config)?;
            let guard_old = from.join("ring-guard").display().to_string();
            let guard_new = to.join("ring-guard").display().to_string();
            std::fs::write(&config, text.replace(&guard_old, &guard_new))?;
        }
    }
    anyhow::ensure!(switched, "{} does not run {old}", m.name);
    m.ringd.spawn()
}

/// Where Debian's `faketime` package puts the multi-threaded libfaketime.
pub const LIBFAKETIME: &str = "/usr/lib/x86_64-linux-gnu/faketime/libfaketimeMT.so.1";

/// A process in a namespace, killed when dropped.
#[derive(Debug)]
pub struct Proc {
    /// What it is, for messages.
    pub name: String,
    /// Its namespace.
    pub namespace: String,
    /// Its command line, without `ip netns exec`.
    pub argv: Vec<String>,
    /// Its log.
    pub log: PathBuf,
    /// The running process; `None` once it exited or was reaped.
    child: Option<LoggedChild>,
}

impl Proc {
    /// Starts `argv` in namespace `ns`, logging to `log`.
    pub fn start(name: &str, ns: &str, argv: Vec<String>, log: PathBuf) -> anyhow::Result<Self> {
        let mut proc = Self {
            name: name.to_string(),
            namespace: ns.to_string(),
            argv,
            log,
            child: None,
        };
        proc.spawn()?;
        Ok(proc)
    }

    /// Starts it (again).
    pub fn spawn(&mut self) -> anyhow::Result<()> {
        let child = LoggedChild::spawn(
            self.name.as_str(),
            Command::new("ip")
                .args(["netns", "exec", &self.namespace])
                .args(&self.argv),
            &self.log,
        )
        .with_context(|| format!("starting {} in {}", self.name, self.namespace))?;
        self.child = Some(child);
        Ok(())
    }

    /// Sends `signal` to it (`ip netns exec` execs the program, so this is the program).
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        if let Some(child) = &self.child {
            let _ = child.signal(signal);
        }
    }

    /// Waits (at most `timeout`) for it to exit; false when it still runs.
    pub fn wait_exit(&mut self, timeout: Duration) -> bool {
        let Some(child) = self.child.as_mut() else {
            return true;
        };
        if child.wait_exit(timeout).is_none() && child.is_running() {
            return false;
        }
        self.child = None;
        true
    }

    /// Reaps it after it was killed.
    pub fn reap(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill9();
        }
    }
}

/// One member of the ring.
#[derive(Debug)]
pub struct Member {
    /// Its name (`a`, `b`, ...).
    pub name: String,
    /// Its zone (`zone-a`, ...).
    pub zone: String,
    /// Its `ringd`.
    pub ringd: Proc,
}

/// The file (in a member's directory) whose offset its libfaketime'd wall clock follows.
const CLOCK_FILE: &str = "faketime";

impl Member {
    /// Where its wall clock's offset is read from (with [`Binaries::faketime`]): `+0`, `+1h`,
    /// `-1h`, ... (libfaketime's syntax).
    pub fn clock_file(&self) -> PathBuf {
        self.ringd
            .log
            .parent()
            .map(|home| home.join(CLOCK_FILE))
            .unwrap_or_else(|| PathBuf::from(CLOCK_FILE))
    }
}

/// Everything of one run but the network.
pub struct World {
    /// The members, zone order.
    pub members: Vec<Member>,
    /// `named` ([`NAMED`]) and `moto_server` ([`MOTO`]); they stop with the world.
    pub region: Vec<Proc>,
    /// The control planes' names.
    pub control_planes: Vec<String>,
    /// A client of every member's Admin API.
    pub admin: AdminClient,
    /// One client per member (to ask each one, not whichever answers first).
    pub per_member: Vec<std::sync::Arc<AdminClient>>,
}

/// The path of `name` on `PATH`, `/usr/sbin` or `/usr/bin`; the error says how to install it.
pub fn find_tool(name: &str) -> anyhow::Result<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain([PathBuf::from("/usr/sbin"), PathBuf::from("/usr/bin")])
        .map(|d| d.join(name))
        .find(|p| p.is_file())
        .with_context(|| format!("{name} not found on PATH, /usr/sbin or /usr/bin (scripts/test.sh installs what ring-chaos needs)"))
}

/// The ring timings `--timings` offers.
pub const TIMING_PROFILES: [&str; 3] = ["loopback", "tight", "production"];

/// The timings of profile `name` (one of [`TIMING_PROFILES`]): `loopback` (lease 1 s, member
/// lost after 2 s), `tight` (lease 2 s, fence 1 s, member lost after 4 s: half the production
/// RTO; chaos/results/lossy-link.md has what it rides out), and
/// `production` (the defaults: lease 4 s, fence 2 s, member lost after 8 s).
pub fn timing_profile(name: &str) -> garden_ring::config::Timing {
    use garden_ring::config::Timing;
    match name {
        "production" => Timing::default(),
        "tight" => Timing {
            heartbeat_ms: 100,
            election_timeout_min_ms: 500,
            election_timeout_max_ms: 1_000,
            member_suspect_ms: 2_000,
            member_lost_ms: 4_000,
            lease_ms: 2_000,
            fence_ms: 1_000,
            clock_margin_ms: 500,
        },
        _ => Timing::loopback(),
    }
}

/// lossy-link's default loss rates at timing profile `name`: the rates whose phases kept every
/// wait for an acknowledgement within one lease in the runs of chaos/results/lossy-link.md.
/// Measured limits (longest wait at 50% loss): loopback (1 s lease) 3.3-25.7 s, so 30% is
/// its limit; tight (2 s) 1650 ms in one run of one, too near the lease for a default; production
/// (4 s) 23 ms.
pub fn lossy_link_loss_percents(name: &str) -> &'static [u8] {
    match name {
        "production" => &[10, 30, 50],
        _ => &[10, 30],
    }
}

/// What [`lossy_link_loss_percents`] is based on, for the scenario's report: the measured
/// limit of profile `name`.
pub fn lossy_link_limit(name: &str) -> &'static str {
    match name {
        "production" => {
            "production timings (lease 4 s) held 50% loss (longest wait 23 ms) and moved at 70% in 1 run of 3"
        }
        "tight" => {
            "tight timings (lease 2 s) hold 30% loss (22 ms); 50% waited 1650 ms in one run, too near the lease to be a default"
        }
        _ => {
            "loopback timings (lease 1 s) hold 30% loss (22-49 ms); at 50% renewals fail for seconds (waits of 3.3-25.7 s, nothing moved)"
        }
    }
}

/// The profile `timing` is, for report names: `None` for loopback (what CI runs).
pub fn timing_profile_name(timing: &garden_ring::config::Timing) -> Option<&'static str> {
    TIMING_PROFILES
        .into_iter()
        .filter(|p| *p != "loopback")
        .find(|p| timing_profile(p) == *timing)
        .or((*timing != garden_ring::config::Timing::loopback()).then_some("custom"))
}

/// Checks that every program a run needs is installed; the error names what is missing.
pub fn check_tools(binaries: &Binaries) -> anyhow::Result<()> {
    for tool in ["named", "tsig-keygen", "moto_server", "ip"] {
        find_tool(tool)?;
    }
    for (dir, tool) in [
        (&binaries.ring_dir, "ringd"),
        (&binaries.ring_dir, "ring-guard"),
        (&binaries.etcd_dir, "etcd"),
    ] {
        if !dir.join(tool).is_file() {
            bail!(
                "{} has no {tool} (build with `cargo build --bins`, or pass --bin-dir)",
                dir.display()
            );
        }
    }
    Ok(())
}

/// Polls `check` every 50 ms until it returns `Some`, or fails naming `what` after `timeout`.
pub async fn wait_for<T, F, Fut>(timeout: Duration, what: &str, check: F) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    poll(timeout, Duration::from_millis(50), what, check).await
}

/// Polls `check` every `every` until it returns `Some`, or fails naming `what` after `timeout`.
pub async fn poll<T, F, Fut>(
    timeout: Duration,
    every: Duration,
    what: &str,
    mut check: F,
) -> anyhow::Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return Ok(v);
        }
        if Instant::now() >= deadline {
            bail!("timed out after {timeout:?} waiting until {what}");
        }
        tokio::time::sleep(every).await;
    }
}

fn start_region(dir: &Path) -> anyhow::Result<(Vec<Proc>, PathBuf)> {
    let region = namespace("region");
    let bind_dir = dir.join("region").join("bind");
    std::fs::create_dir_all(&bind_dir)?;
    let key = Command::new(find_tool("tsig-keygen")?)
        .args(["-a", "hmac-sha256", "ring-key"])
        .output()
        .context("running tsig-keygen")?;
    if !key.status.success() {
        bail!("tsig-keygen: {}", String::from_utf8_lossy(&key.stderr));
    }
    let key_file = bind_dir.join("ring-key.key");
    std::fs::write(&key_file, &key.stdout)?;
    let conf = format!(
        r#"include "{key}";
options {{
    directory "{dir}";
    listen-on port 53 {{ {REGION}; }};
    listen-on-v6 {{ none; }};
    pid-file none;
    session-keyfile none;
    recursion no;
    dnssec-validation no;
    notify no;
}};
controls {{ }};
zone "{ZONE}" {{
    type primary;
    file "db.zone";
    allow-update {{ key "ring-key"; }};
}};
"#,
        key = key_file.display(),
        dir = bind_dir.display(),
    );
    std::fs::write(bind_dir.join("named.conf"), conf)?;
    std::fs::write(
        bind_dir.join("db.zone"),
        format!(
            "$TTL 5\n@ IN SOA ns.{ZONE}. hostmaster.{ZONE}. 1 60 60 600 5\n@ IN NS ns.{ZONE}.\nns IN A {REGION}\n"
        ),
    )?;
    let named = Proc::start(
        "named",
        &region,
        vec![
            find_tool("named")?.display().to_string(),
            "-g".into(),
            "-c".into(),
            bind_dir.join("named.conf").display().to_string(),
        ],
        dir.join("region").join("named.log"),
    )?;
    let moto = Proc::start(
        "moto_server",
        &region,
        vec![
            find_tool("moto_server")?.display().to_string(),
            "-H".into(),
            REGION.to_string(),
            "-p".into(),
            S3_PORT.to_string(),
        ],
        dir.join("region").join("moto.log"),
    )?;
    Ok((vec![named, moto], key_file))
}

/// One HTTP/1.1 request without a body to the object store; returns the status code.
async fn s3_request(method: &str, path: &str) -> std::io::Result<u16> {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};
    let mut stream = tokio::time::timeout(
        Duration::from_secs(2),
        tokio::net::TcpStream::connect((REGION, S3_PORT)),
    )
    .await
    .map_err(|_| std::io::Error::other("connect timed out"))??;
    let request = format!(
        "{method} {path} HTTP/1.1\r\nHost: {REGION}:{S3_PORT}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    );
    stream.write_all(request.as_bytes()).await?;
    let mut head = vec![0u8; 64];
    let n = stream.read(&mut head).await?;
    let text = String::from_utf8_lossy(&head[..n]);
    text.split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not HTTP: {text:?}")))
}

/// Builds the world in `dir` for `zones` (the topology exists and this thread is in the client
/// namespace), with `control_planes` control planes.
pub async fn build(
    dir: &Path,
    zones: &[String],
    control_planes: usize,
    zone_tolerant: bool,
    timing: Timing,
    binaries: &Binaries,
) -> anyhow::Result<World> {
    let (region, key_file) = start_region(dir)?;
    wait_for(START_TIMEOUT, "the object store answers", || async {
        s3_request("GET", "/").await.ok().filter(|s| *s == 200)
    })
    .await?;
    wait_for(START_TIMEOUT, "the DNS server answers", || async {
        let seen = garden_ring::dns::query::observe(
            DNS_SERVER,
            &format!("ns.{ZONE}"),
            &RecordValue::A(REGION),
            Duration::from_millis(500),
        )
        .await;
        matches!(seen, garden_ring::dns::query::Observed::Values(_)).then_some(())
    })
    .await?;
    for zone in zones {
        let status = s3_request("PUT", &format!("/{zone}")).await?;
        if status != 200 {
            bail!("creating bucket {zone}: HTTP {status}");
        }
    }
    let credentials = dir.join("s3-credentials.toml");
    std::fs::write(
        &credentials,
        "access_key_id = \"chaos\"\nsecret_access_key = \"chaos-secret\"\n",
    )?;
    let backup = BackupSettings {
        s3_endpoint: Some(format!("http://{REGION}:{S3_PORT}")),
        s3_allow_http: true,
        credentials_file: Some(credentials),
        ..BackupSettings::default()
    };

    let founders: Vec<InitialMember> = zones
        .iter()
        .enumerate()
        .map(|(i, zone)| InitialMember {
            id: i as u64 + 1,
            name: zone.trim_start_matches("zone-").to_string(),
            zone: zone.clone(),
            address: format!("{}:7401", mesh_address(i)),
            admin_address: format!("{}:7400", client_address_of_zone(i)),
        })
        .collect();
    let certs = garden_ring::demo::demo_certificates(dir, &founders)?;
    let mut members = Vec::new();
    for (i, m) in founders.iter().enumerate() {
        let home = dir.join(&m.name);
        std::fs::create_dir_all(&home)?;
        let config = Config {
            id: m.id,
            name: m.name.clone(),
            zone: m.zone.clone(),
            data_dir: home.join("data"),
            listen_peer: m.address.parse()?,
            listen_admin: "0.0.0.0:7400".parse()?,
            advertise_peer: None,
            advertise_admin: Some(m.admin_address.clone()),
            initial_members: founders.clone(),
            timing: timing.clone(),
            snapshot: SnapshotSettings::default(),
            log: LogSettings::default(),
            backup: backup.clone(),
            upgrade: Default::default(),
            tls: Some(TlsSettings {
                files: garden_ring::demo::tls_files(&certs, &Identity::new(Role::Member, &m.name)?),
                reload_interval_ms: 1_000,
            }),
            insecure: false,
            dns: DnsSettings {
                zone: Some(ZONE.into()),
                ttl_s: 5,
                provider: DnsProvider::Rfc2136,
                rfc2136: Some(Rfc2136Settings {
                    server: DNS_SERVER,
                    key_file: key_file.clone(),
                }),
                verify_servers: vec![DNS_SERVER],
                ..DnsSettings::default()
            },
            metrics: Default::default(),
            admin: Default::default(),
            placement: PlacementSettings {
                min_move_interval_ms: 1_000,
                capacity: 0,
                etcd_replace_after_ms: ETCD_REPLACE_AFTER_MS,
            },
            driver: DriverSettings {
                kind: DriverKind::Etcd,
                guard: Some(binaries.start_dir().join("ring-guard")),
                etcd: EtcdDriverSettings {
                    bin_dir: Some(binaries.etcd_dir.clone()),
                    full_snapshot_interval_ms: SNAPSHOT_INTERVAL_MS,
                    delta_snapshot_period_ms: DELTA_PERIOD_MS,
                    ..EtcdDriverSettings::default()
                },
                ..DriverSettings::default()
            },
        };
        config
            .validate()
            .with_context(|| format!("config of member {}", m.name))?;
        let path = home.join("ringd.toml");
        std::fs::write(&path, config.to_toml())?;
        let mut argv = Vec::new();
        if let Some(lib) = &binaries.faketime {
            let clock = home.join(CLOCK_FILE);
            std::fs::write(&clock, "+0\n")?;
            argv.extend([
                "env".to_string(),
                format!("LD_PRELOAD={}", lib.display()),
                format!("FAKETIME_TIMESTAMP_FILE={}", clock.display()),
                // Re-read the file every second; the monotonic clock stays real.
                "FAKETIME_CACHE_DURATION=1".into(),
                "FAKETIME_DONT_FAKE_MONOTONIC=1".into(),
            ]);
        }
        argv.extend([
            binaries.start_dir().join("ringd").display().to_string(),
            "--config".into(),
            path.display().to_string(),
        ]);
        let ringd = Proc::start(
            &format!("ringd {}", m.name),
            &namespace(&zones[i]),
            argv,
            home.join("ringd.log"),
        )?;
        members.push(Member {
            name: m.name.clone(),
            zone: m.zone.clone(),
            ringd,
        });
    }
    let files = garden_ring::demo::tls_files(&certs, &Identity::new(Role::Admin, "operator")?);
    let security = Security::Tls(TlsStore::load(files, None)?);
    let admin = AdminClient::new(
        founders.iter().map(|m| m.admin_address.clone()).collect(),
        security.clone(),
        "ring-chaos",
    )?;
    let per_member = founders
        .iter()
        .map(|m| {
            AdminClient::new(
                vec![m.admin_address.clone()],
                security.clone(),
                "ring-chaos",
            )
            .map(|c| std::sync::Arc::new(c.with_request_timeout(ADMIN_REQUEST_TIMEOUT)))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut world = World {
        members,
        region,
        control_planes: Vec::new(),
        admin,
        per_member,
    };
    world.wait_formed().await?;
    world.register(control_planes, zone_tolerant).await?;
    Ok(world)
}

impl World {
    /// The ring's status as its leader sees it: every member is asked at once (500 ms
    /// each) and the answer of the one that leads at the highest term wins. A member cut off
    /// from the others answers from the state it last applied, which may be stale; it is
    /// used only when no leader answers, the freshest (highest applied index) first. Each
    /// member answers from its own state (a stale read): the harness wants every member's own
    /// view, at once, also of members cut off from the leader.
    pub async fn status(&self) -> Option<pb::StatusResponse> {
        let asks = self.per_member.iter().map(|client| async move {
            tokio::time::timeout(
                Duration::from_millis(500),
                client.call_once(
                    pb::StatusRequest { stale: true },
                    &mut |mut c, r| async move { c.status(r).await },
                ),
            )
            .await
            .ok()
            .and_then(Result::ok)
        });
        let answers: Vec<pb::StatusResponse> = futures::future::join_all(asks)
            .await
            .into_iter()
            .flatten()
            .collect();
        answers
            .iter()
            .filter(|s| s.server_state == "leader")
            .max_by_key(|s| s.term)
            .or_else(|| answers.iter().max_by_key(|s| s.applied_index))
            .cloned()
    }

    /// The ring's history as its leader keeps it (a member cut off from the others would
    /// answer with the history it last applied).
    pub async fn history(&self) -> Option<pb::HistoryResponse> {
        let leader = self.status().await?;
        let name = &leader
            .members
            .iter()
            .find(|m| m.id == leader.member_id)?
            .name;
        let index = self.member_index(name)?;
        self.per_member[index]
            .call_once(
                pb::HistoryRequest {
                    limit: 0,
                    ..Default::default()
                },
                &mut |mut c, r| async move { c.history(r).await },
            )
            .await
            .ok()
    }

    async fn wait_formed(&self) -> anyhow::Result<()> {
        let n = self.members.len();
        wait_for(
            Duration::from_secs(60),
            "the ring formed and every member is healthy",
            || async {
                let s = self.status().await?;
                (s.members.len() == n && s.members.iter().all(|m| m.health == "healthy"))
                    .then_some(())
            },
        )
        .await
    }

    async fn register(&mut self, count: usize, zone_tolerant: bool) -> anyhow::Result<()> {
        for i in 0..count {
            let name = format!("cp-{}", i + 1);
            let port = CP_PORT + i as u16;
            let endpoints: BTreeMap<String, String> = self
                .members
                .iter()
                .enumerate()
                .map(|(z, m)| {
                    (
                        m.name.clone(),
                        format!("{}:{port}", client_address_of_zone(z)),
                    )
                })
                .collect();
            let backups: BTreeMap<String, String> = self
                .members
                .iter()
                .map(|m| (m.name.clone(), format!("s3://{}/{name}", m.zone)))
                .collect();
            let first = self.members[i % self.members.len()].name.clone();
            let req = pb::ControlPlaneAddRequest {
                name: name.clone(),
                home: String::new(),
                dns_name: format!("{name}.{ZONE}"),
                endpoints,
                backup: backups[&first].clone(),
                backups,
                host: String::new(),
                reason: "ring-chaos".into(),
                prefer: Vec::new(),
                tolerance: if zone_tolerant { "zone" } else { "none" }.into(),
                etcd_peers: if zone_tolerant {
                    (0..self.members.len())
                        .map(|z| {
                            (
                                self.members[z].name.clone(),
                                format!("{}:{}", mesh_address(z), ETCD_PEER_PORT + i as u16),
                            )
                        })
                        .collect()
                } else {
                    BTreeMap::new()
                },
            };
            self.admin
                .call(req, |mut c, r| async move { c.control_plane_add(r).await })
                .await
                .with_context(|| format!("registering {name}"))?;
            self.control_planes.push(name);
        }
        let names = self.control_planes.clone();
        wait_for(
            Duration::from_secs(60),
            "every control plane runs",
            || async {
                let s = self.status().await?;
                let running = s
                    .control_planes
                    .iter()
                    .filter(|c| names.contains(&c.name) && c.phase == "running")
                    .count();
                (running == names.len()).then_some(())
            },
        )
        .await
    }

    /// The member index of `name`.
    pub fn member_index(&self, name: &str) -> Option<usize> {
        self.members.iter().position(|m| m.name == name)
    }
}

/// The address of control plane `cp` (`cp-<i>`) at the member with index `zone`.
pub fn endpoint(cp: &str, zone: usize) -> SocketAddr {
    let i: u16 = cp
        .trim_start_matches("cp-")
        .parse::<u16>()
        .unwrap_or(1)
        .saturating_sub(1);
    SocketAddr::new(client_address_of_zone(zone).into(), CP_PORT + i)
}

/// The index of the zone whose client address is `ip`.
pub fn zone_of(ip: std::net::IpAddr) -> Option<usize> {
    match ip {
        std::net::IpAddr::V4(v4) => {
            let o = v4.octets();
            (o[0] == 10 && o[1] == 77 && o[2] == 3 && o[3] >= 11).then(|| usize::from(o[3] - 11))
        }
        std::net::IpAddr::V6(_) => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_timing_profile_is_safe_and_named() {
        for name in TIMING_PROFILES {
            // lossy-link's defaults stay at or under what the profile was measured to hold.
            let rates = lossy_link_loss_percents(name);
            let held = if name == "production" { 50 } else { 30 };
            assert!(rates.iter().all(|r| *r <= held), "{name}: {rates:?}");
            assert!(rates.contains(&held), "{name}: {rates:?}");
            assert!(!lossy_link_limit(name).is_empty());
            let t = timing_profile(name);
            assert!(
                t.member_lost_ms > t.lease_ms + t.fence_ms + t.clock_margin_ms,
                "{name} breaks DESIGN.md rule 2"
            );
            let expected = (name != "loopback").then_some(name);
            assert_eq!(timing_profile_name(&t), expected);
            if name != "loopback" {
                assert_eq!(t.warnings(), Vec::<String>::new(), "{name}");
            }
        }
        let custom = garden_ring::config::Timing {
            lease_ms: 1_500,
            ..garden_ring::config::Timing::loopback()
        };
        assert_eq!(timing_profile_name(&custom), Some("custom"));
    }
}
