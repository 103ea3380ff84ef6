//! Harness for integration tests that start real `ringd` and `ringctl` processes on loopback.
//!
//! The binaries are found next to the test executable's `deps/` directory (where
//! `cargo build --bins` puts them), or through `RINGD_BIN` / `RINGCTL_BIN`. Every ring lives in
//! its own temporary directory, on ports the harness picked free, and every process it started
//! is killed when the [`Ring`] is dropped, also when a test fails.
//!
//! Waiting is always "until a condition holds, or a deadline passes" ([`eventually`]), never a
//! fixed sleep.

pub mod bind;
pub mod child;
pub mod compat;
pub mod dig;
pub mod etcd;
pub mod etcdbrctl;
pub mod netns;
pub mod s3;
pub mod wal;

use std::collections::BTreeMap;
use std::future::Future;
use std::net::{SocketAddr, TcpListener};
use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::time::{Duration, Instant};

use garden_ring::admin::AdminClient;
use garden_ring::client_config::ClientConfig;
use garden_ring::config::{
    Config, DnsSettings, DriverSettings, InitialMember, LogSettings, PlacementSettings,
    SnapshotSettings, Timing, TlsSettings,
};
use garden_ring::pb;
use garden_ring::tls::{Identity, Role, Security, TlsFiles, certs};

use crate::child::LoggedChild;

/// Path of a workspace binary (`ringd`, `ringctl`).
pub fn binary(name: &str) -> PathBuf {
    let var = format!("{}_BIN", name.to_uppercase());
    if let Ok(p) = std::env::var(&var) {
        return PathBuf::from(p);
    }
    let exe = std::env::current_exe().expect("test executable path");
    let profile_dir = exe
        .parent()
        .and_then(|deps| deps.parent())
        .expect("test executable lives in target/<profile>/deps");
    let path = profile_dir.join(name);
    assert!(
        path.is_file(),
        "{} not found; build the binaries first (`cargo build --bins`) or set {var}",
        path.display()
    );
    path
}

/// Whether this is a CI run (`CI=true`, or `CI=1`): there a missing external tool fails the
/// test instead of skipping it.
pub fn ci() -> bool {
    std::env::var("CI").is_ok_and(|v| v.eq_ignore_ascii_case("true") || v == "1")
}

/// Reports a missing external tool `what`: panics with `advice` under [`ci`], else prints that
/// the test is skipped and why (visible with `--no-capture`).
pub fn missing_tool(what: &str, advice: &str) {
    if ci() {
        panic!("{what} is missing and CI=true, so this test must not skip: {advice}");
    }
    println!("SKIPPED: {what} is missing ({advice}); under CI=true this fails the test");
}

/// The directory holding the previous release's `ringd`, `ring-guard` and `ringctl`
/// (`scripts/previous-release.sh` builds and caches them; `GARDEN_RING_PREVIOUS_BIN_DIR`
/// overrides), or `None` when they are not built: then [`missing_tool`] has said so (and
/// failed the test under CI).
pub fn previous_release() -> Option<PathBuf> {
    if let Ok(dir) = std::env::var("GARDEN_RING_PREVIOUS_BIN_DIR") {
        return Some(PathBuf::from(dir));
    }
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("../scripts/previous-release.sh");
    let out = Command::new(&script).arg("--print-dir").output();
    match out {
        Ok(o) if o.status.success() => Some(PathBuf::from(
            String::from_utf8_lossy(&o.stdout).trim().to_string(),
        )),
        _ => {
            missing_tool(
                "the previous release's binaries",
                "build them with scripts/previous-release.sh (scripts/test.sh does)",
            );
            None
        }
    }
}

/// Free loopback ports, held until [`Ports::release`] so two calls cannot hand out the same one.
///
/// Under nextest every running test has a slot number (`NEXTEST_TEST_GLOBAL_SLOT`, unique
/// among the tests running at once); ports then come from a range of the slot's own, below the
/// kernel's ephemeral range. Between [`Ports::release`] and the moment a `ringd` binds a port,
/// no other test (and no connection's ephemeral source port) can take it: before, a parallel
/// test's reservation could, and its `ringd` found its port in use.
pub struct Ports(Vec<TcpListener>);

/// First port of slot 0's range; each slot has [`PORTS_PER_SLOT`].
const SLOT_PORTS_BASE: u16 = 10_000;
/// Ports per nextest slot.
const PORTS_PER_SLOT: u16 = 400;
/// Slots that fit below 32768, where Linux's ephemeral range starts by default.
const MAX_SLOTS: u16 = (32_768 - SLOT_PORTS_BASE) / PORTS_PER_SLOT;

impl Ports {
    /// Reserves `n` free ports.
    pub fn reserve(n: usize) -> Self {
        Self((0..n).map(|_| reserve_one()).collect())
    }

    /// The reserved port numbers.
    pub fn numbers(&self) -> Vec<u16> {
        self.0
            .iter()
            .map(|l| l.local_addr().unwrap().port())
            .collect()
    }

    /// Frees the ports so the processes under test can bind them.
    pub fn release(self) {}
}

/// One free port: from this test's slot range under nextest, else one the kernel picks.
fn reserve_one() -> TcpListener {
    use std::sync::atomic::{AtomicU16, Ordering};
    /// The next offset to try in this process's range.
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let slot = std::env::var("NEXTEST_TEST_GLOBAL_SLOT")
        .ok()
        .and_then(|s| s.parse::<u16>().ok())
        .filter(|slot| *slot < MAX_SLOTS);
    if let Some(slot) = slot {
        let base = SLOT_PORTS_BASE + slot * PORTS_PER_SLOT;
        for _ in 0..PORTS_PER_SLOT {
            let offset = NEXT.fetch_add(1, Ordering::Relaxed) % PORTS_PER_SLOT;
            if let Ok(listener) = TcpListener::bind(("127.0.0.1", base + offset)) {
                return listener;
            }
        }
    }
    TcpListener::bind("127.0.0.1:0").expect("bind an ephemeral port")
}

/// Settings of a test ring.
#[derive(Clone, Debug)]
pub struct RingOptions {
    /// Founding members.
    pub members: usize,
    /// Snapshot every this many entries.
    pub snapshot_every: u64,
    /// Entries kept behind a snapshot.
    pub snapshot_keep: u64,
    /// Run without TLS.
    pub insecure: bool,
    /// How members run control planes.
    pub driver: DriverSettings,
    /// How members publish DNS.
    pub dns: TestDns,
}

/// How a test ring publishes DNS.
#[derive(Clone, Debug, Default)]
pub enum TestDns {
    /// Records are computed (zone [`TEST_ZONE`], TTL 5 s) but not served.
    #[default]
    Unserved,
    /// Every member serves the zone on a port of its own (see [`Ring::dns_servers`]); the
    /// leader checks all of them.
    Builtin,
    /// These settings (zone [`TEST_ZONE`] unless they set one).
    Settings(DnsSettings),
}

impl Default for RingOptions {
    fn default() -> Self {
        Self {
            members: 3,
            snapshot_every: SnapshotSettings::default().every_entries,
            snapshot_keep: SnapshotSettings::default().keep_entries,
            insecure: false,
            driver: DriverSettings::default(),
            dns: TestDns::Unserved,
        }
    }
}

/// One plain HTTP/1.1 GET of `path` at `address` (the metrics endpoint); its status code and
/// body, or `None` when it does not answer within a few seconds.
pub fn http_get(address: SocketAddr, path: &str) -> Option<(u16, String)> {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect_timeout(&address, Duration::from_secs(1)).ok()?;
    stream.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
    write!(stream, "GET {path} HTTP/1.1\r\nHost: x\r\n\r\n").ok()?;
    let mut text = String::new();
    stream.read_to_string(&mut text).ok()?;
    let status = text.split_whitespace().nth(1)?.parse().ok()?;
    let body = text.split_once("\r\n\r\n")?.1.to_string();
    Some((status, body))
}

/// An `exec` driver whose workload appends `<unix ns> <member> <epoch>` to
/// `dir/serving-<control plane>.log` every 20 ms while it runs, so a test can tell who served
/// what when; its health check passes once the workload wrote a line at its epoch.
pub fn recording_driver(dir: &Path) -> DriverSettings {
    let script = format!(
        "while true; do echo \"$(date +%s%N) $GARDEN_RING_MEMBER $GARDEN_RING_EPOCH\" >> {}/serving-$GARDEN_RING_CONTROL_PLANE.log; sleep 0.02; done",
        dir.display()
    );
    // Healthy once this member wrote a line at this epoch.
    let health = format!(
        "grep -q \" $GARDEN_RING_MEMBER $GARDEN_RING_EPOCH$\" {}/serving-$GARDEN_RING_CONTROL_PLANE.log",
        dir.display()
    );
    DriverSettings {
        kind: garden_ring::config::DriverKind::Exec,
        run: vec!["sh".into(), "-c".into(), script],
        health: vec!["sh".into(), "-c".into(), health],
        guard: Some(binary("ring-guard")),
        ..DriverSettings::default()
    }
}

/// One stretch of serving in a recording driver's log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Served {
    /// Who served.
    pub member: String,
    /// At which epoch.
    pub epoch: u64,
    /// First and last line, Unix ns.
    pub from_ns: u128,
    /// Last line.
    pub to_ns: u128,
}

/// The serving stretches of control plane `name` recorded in `dir`, in order of start.
pub fn served(dir: &Path, name: &str) -> Vec<Served> {
    let text = std::fs::read_to_string(dir.join(format!("serving-{name}.log"))).unwrap_or_default();
    let mut by: std::collections::BTreeMap<(String, u64), (u128, u128)> = Default::default();
    for line in text.lines() {
        let mut parts = line.split_whitespace();
        let (Some(ts), Some(member), Some(epoch)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let (Ok(ts), Ok(epoch)) = (ts.parse::<u128>(), epoch.parse::<u64>()) else {
            continue;
        };
        let e = by.entry((member.to_string(), epoch)).or_insert((ts, ts));
        e.0 = e.0.min(ts);
        e.1 = e.1.max(ts);
    }
    let mut out: Vec<Served> = by
        .into_iter()
        .map(|((member, epoch), (from_ns, to_ns))| Served {
            member,
            epoch,
            from_ns,
            to_ns,
        })
        .collect();
    out.sort_by_key(|s| s.from_ns);
    out
}

/// Panics if two stretches of serving overlap in time (two members, or two epochs, at once).
pub fn assert_no_overlap(name: &str, stretches: &[Served]) {
    for pair in stretches.windows(2) {
        assert!(
            pair[0].to_ns < pair[1].from_ns,
            "{name}: {:?} and {:?} served at the same time",
            pair[0],
            pair[1]
        );
    }
}

/// The DNS zone of test rings.
pub const TEST_ZONE: &str = "ring.test";

/// The certificate directory of a test ring in `dir`.
pub fn certs_dir(dir: &Path) -> PathBuf {
    dir.join("certs")
}

/// The TLS files of `identity` in `certs_dir`, issuing the certificate (and the CA) if missing.
pub fn ensure_cert(certs_dir: &Path, identity: &Identity) -> TlsFiles {
    if !certs::ca_path(certs_dir).exists() {
        certs::init_ca(certs_dir, 30, false).expect("make a CA");
    }
    let (cert_file, key_file) = certs::paths(certs_dir, identity);
    if !cert_file.exists() {
        // Members: also valid for loopback by address, as the etcd members of zone-tolerant
        // control planes verify their peers (with the member's own certificate).
        let sans: Vec<String> = if identity.role == Role::Member {
            vec!["127.0.0.1".into(), "localhost".into()]
        } else {
            Vec::new()
        };
        certs::issue(certs_dir, identity, &sans, 30, false).expect("issue a certificate");
    }
    TlsFiles {
        ca_file: certs::ca_path(certs_dir),
        cert_file,
        key_file,
        crl_file: None,
    }
}

/// The identity of the test operator.
pub fn admin_identity() -> Identity {
    Identity::new(Role::Admin, "tester").unwrap()
}

/// One `ringd` process of a test ring.
pub struct Proc {
    /// Its config.
    pub config: Config,
    /// Where the config is written.
    pub config_path: PathBuf,
    /// Its combined stdout and stderr.
    pub log_path: PathBuf,
    /// How test clients connect to it.
    pub security: Security,
    /// Environment variables set for it (e.g. an `LD_PRELOAD` fault injector).
    pub env: Vec<(String, String)>,
    /// The `ringd` binary it starts: `None` for this tree's ([`binary`]), or another release's
    /// (see [`previous_release`]); its `ring-guard` is the one next to it.
    pub ringd: Option<PathBuf>,
    /// The running process; `None` before the first start and once it stopped.
    child: Option<LoggedChild>,
}

/// How long [`Proc::terminate`] waits for `ringd` to exit after SIGTERM before it kills it.
const TERMINATE_TIMEOUT: Duration = Duration::from_secs(60);

impl Proc {
    /// The Admin endpoint.
    pub fn admin(&self) -> String {
        self.config.admin_address()
    }

    /// Whether the process runs.
    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(LoggedChild::is_running)
    }

    /// Its pid, if running.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().and_then(LoggedChild::pid)
    }

    /// Starts the process from its config file.
    pub fn spawn(&mut self) {
        assert!(
            self.child.is_none(),
            "member {} already runs",
            self.config.name
        );
        std::fs::write(&self.config_path, self.config.to_toml()).expect("write config");
        let child = LoggedChild::spawn(
            format!("ringd {}", self.config.name),
            Command::new(self.ringd.clone().unwrap_or_else(|| binary("ringd")))
                .arg("--config")
                .arg(&self.config_path)
                .env("RUST_LOG", "")
                .envs(self.env.iter().map(|(k, v)| (k, v))),
            &self.log_path,
        )
        .expect("spawn ringd");
        self.child = Some(child);
    }

    /// Sends `signal` to the process (e.g. SIGSTOP, SIGCONT).
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        let child = self.child.as_ref().expect("the member runs");
        child.signal(signal).expect("signal");
    }

    /// `kill -9`, and waits for the process to be gone.
    pub fn kill9(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.kill9();
        }
    }

    /// SIGTERM, and waits for the exit status (at most a minute; `None` after a SIGKILL when
    /// it takes longer, or when it does not run).
    pub fn terminate(&mut self) -> Option<std::process::ExitStatus> {
        self.child.take()?.terminate_within(TERMINATE_TIMEOUT)
    }

    /// SIGTERM, and waits (bounded) for the exit status; `None` (after a SIGKILL, so nothing is
    /// left behind) when it did not exit in time.
    pub fn terminate_within(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let mut child = self.child.take().expect("the member runs");
        child.terminate_within(timeout)
    }

    /// Waits (bounded) for the process to exit on its own and returns its status.
    pub fn wait_exit(&mut self, timeout: Duration) -> Option<std::process::ExitStatus> {
        let status = self.child.as_mut()?.wait_exit(timeout)?;
        self.child = None;
        Some(status)
    }

    /// The log so far (for failure messages).
    pub fn log(&self) -> String {
        child::read_log(&self.log_path)
    }

    /// An Admin client for this member only.
    pub fn client(&self) -> AdminClient {
        AdminClient::new(vec![self.admin()], self.security.clone(), "test")
            .unwrap()
            .with_request_timeout(Duration::from_secs(20))
    }
}

/// How many lines of each member's log a failing test prints: the tail, where a failure shows.
const FAILURE_LOG_LINES: usize = 80;

/// Kills (SIGKILL) every process whose command line names something under `dir`: the
/// guards and etcds a member left behind on purpose (a restarted `ringd` adopts them), which
/// would otherwise run on until their lease's hold ran out.
pub fn kill_processes_under(dir: &std::path::Path) {
    let needle = dir.to_string_lossy().to_string();
    let me = std::process::id() as i32;
    for (pid, args) in garden_ring::process::command_lines() {
        if pid != me && args.iter().any(|a| a.contains(&needle)) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

impl Drop for Proc {
    /// Kills the process and what it left under its data directory; when a test fails (the
    /// thread panics), prints the tail of its log, so that a CI failure says what the member
    /// was doing.
    fn drop(&mut self) {
        self.kill9();
        kill_processes_under(&self.config.etcd_data_root());
        if std::thread::panicking() {
            let tail = child::log_tail(&self.log_path, FAILURE_LOG_LINES);
            eprintln!(
                "--- member {}: the last {} lines of {} ---\n{tail}",
                self.config.name,
                tail.lines().count(),
                self.log_path.display(),
            );
        }
    }
}

/// A ring of real `ringd` processes in a temporary directory.
pub struct Ring {
    /// Its members, founders first. (Declared before `dir`, so they are dropped first: killed,
    /// and their log tails printed when the test fails, before the directory is removed.)
    pub procs: Vec<Proc>,
    /// Its directory (removed with the ring).
    pub dir: tempfile::TempDir,
    /// `ringctl`'s client config for this ring (admin certificate, founders' endpoints).
    pub client_config: PathBuf,
    /// How test clients connect (the admin certificate, or no TLS).
    pub security: Security,
    options: RingOptions,
}

/// A member config for a test ring (member `id` is named [`member_name`]`(id)`).
pub fn member_config(
    dir: &Path,
    id: u64,
    admin_port: u16,
    peer_port: u16,
    founders: Vec<InitialMember>,
    options: &RingOptions,
) -> Config {
    member_config_named(
        dir,
        id,
        &member_name(id),
        admin_port,
        peer_port,
        founders,
        options,
    )
}

/// A member config for a test ring, for member `id` named `name` (e.g. a fresh member that
/// replaces a lost one under a new id and the old name).
pub fn member_config_named(
    dir: &Path,
    id: u64,
    name: &str,
    admin_port: u16,
    peer_port: u16,
    founders: Vec<InitialMember>,
    options: &RingOptions,
) -> Config {
    let name = name.to_string();
    let tls = (!options.insecure).then(|| TlsSettings {
        files: ensure_cert(
            &certs_dir(dir),
            &Identity::new(Role::Member, &name).unwrap(),
        ),
        reload_interval_ms: 200,
    });
    Config {
        id,
        tls,
        backup: Default::default(),
        upgrade: Default::default(),
        dns: match &options.dns {
            TestDns::Unserved | TestDns::Builtin => DnsSettings {
                zone: Some(TEST_ZONE.into()),
                ttl_s: 5,
                ..DnsSettings::default()
            },
            TestDns::Settings(settings) => DnsSettings {
                zone: settings.zone.clone().or(Some(TEST_ZONE.into())),
                ..settings.clone()
            },
        },
        metrics: Default::default(),
        admin: Default::default(),
        placement: PlacementSettings {
            min_move_interval_ms: 1_000,
            capacity: 0,
            ..PlacementSettings::default()
        },
        driver: options.driver.clone(),
        insecure: options.insecure,
        zone: format!("zone-{name}"),
        data_dir: dir.join(&name).join("data"),
        listen_peer: format!("127.0.0.1:{peer_port}").parse().unwrap(),
        listen_admin: format!("127.0.0.1:{admin_port}").parse().unwrap(),
        advertise_peer: None,
        advertise_admin: None,
        initial_members: founders,
        timing: Timing::loopback(),
        snapshot: SnapshotSettings {
            every_entries: options.snapshot_every,
            keep_entries: options.snapshot_keep,
        },
        log: LogSettings {
            level: garden_ring::config::DEFAULT_LOG_LEVEL.into(),
            ..LogSettings::default()
        },
        name,
    }
}

/// Name of member `id`: 1 -> a, 2 -> b, ...
pub fn member_name(id: u64) -> String {
    char::from(b'a' + u8::try_from(id - 1).unwrap()).to_string()
}

impl Ring {
    /// Starts a ring with `options.members` founders.
    pub fn start(options: RingOptions) -> Self {
        let mut ring = Self::prepare(options);
        for p in &mut ring.procs {
            p.spawn();
        }
        ring
    }

    /// Starts a ring whose workloads record into `ring.dir/serving-*.log` (see
    /// [`recording_driver`]).
    pub fn start_recording(options: RingOptions) -> Self {
        let mut ring = Self::prepare(options);
        let driver = recording_driver(ring.dir.path());
        for p in &mut ring.procs {
            p.config.driver = driver.clone();
            p.spawn();
        }
        ring
    }

    /// Writes the configs of a ring with `options.members` founders without starting any.
    pub fn prepare(options: RingOptions) -> Self {
        let dir = tempfile::Builder::new()
            .prefix("ring-test-")
            .tempdir()
            .unwrap();
        let ports = Ports::reserve(options.members * 3);
        let numbers = ports.numbers();
        let founders: Vec<InitialMember> = (0..options.members)
            .map(|i| {
                let id = i as u64 + 1;
                let name = member_name(id);
                InitialMember {
                    id,
                    zone: format!("zone-{name}"),
                    name,
                    address: format!("127.0.0.1:{}", numbers[2 * i + 1]),
                    admin_address: format!("127.0.0.1:{}", numbers[2 * i]),
                }
            })
            .collect();
        let client = ClientConfig {
            endpoints: founders.iter().map(|m| m.admin_address.clone()).collect(),
            insecure: options.insecure,
            ..match options.insecure {
                true => ClientConfig::default(),
                false => {
                    let files = ensure_cert(&certs_dir(dir.path()), &admin_identity());
                    ClientConfig {
                        ca_file: Some(files.ca_file),
                        cert_file: Some(files.cert_file),
                        key_file: Some(files.key_file),
                        ..ClientConfig::default()
                    }
                }
            }
        };
        let client_config = dir.path().join("ringctl.toml");
        std::fs::write(&client_config, client.to_toml()).unwrap();
        let security = client.security().expect("test certificates load");
        let procs = (0..options.members)
            .map(|i| {
                let id = i as u64 + 1;
                let mut config = member_config(
                    dir.path(),
                    id,
                    numbers[2 * i],
                    numbers[2 * i + 1],
                    founders.clone(),
                    &options,
                );
                if let TestDns::Builtin = options.dns {
                    let dns = |i: usize| -> SocketAddr {
                        format!("127.0.0.1:{}", numbers[2 * options.members + i])
                            .parse()
                            .unwrap()
                    };
                    config.dns.listen = Some(dns(i));
                    config.dns.verify_servers = (0..options.members).map(dns).collect();
                }
                Self::proc_for(dir.path(), config, &security)
            })
            .collect();
        ports.release();
        Self {
            dir,
            procs,
            client_config,
            security,
            options,
        }
    }

    /// The members' DNS servers (with [`TestDns::Builtin`]), founders first.
    pub fn dns_servers(&self) -> Vec<SocketAddr> {
        self.procs
            .iter()
            .filter_map(|p| p.config.dns.listen)
            .collect()
    }

    fn proc_for(dir: &Path, config: Config, security: &Security) -> Proc {
        let home = dir.join(&config.name);
        std::fs::create_dir_all(&home).unwrap();
        Proc {
            config_path: home.join("ringd.toml"),
            log_path: home.join("ringd.log"),
            security: security.clone(),
            config,
            env: Vec::new(),
            ringd: None,
            child: None,
        }
    }

    /// Prepares (does not start) a new member `id` that will join with `member add`.
    pub fn joiner(&mut self, id: u64) -> usize {
        let ports = Ports::reserve(2);
        let n = ports.numbers();
        let config = member_config(self.dir.path(), id, n[0], n[1], Vec::new(), &self.options);
        ports.release();
        self.procs
            .push(Self::proc_for(self.dir.path(), config, &self.security));
        self.procs.len() - 1
    }

    /// Prepares (does not start) a fresh member `id` named `name` that will join with
    /// `member add`: it replaces a lost member under a new id, with its own directory
    /// (`<name>-<id>/`) and ports.
    pub fn replacement(&mut self, id: u64, name: &str) -> usize {
        let ports = Ports::reserve(2);
        let n = ports.numbers();
        let mut config = member_config_named(
            self.dir.path(),
            id,
            name,
            n[0],
            n[1],
            Vec::new(),
            &self.options,
        );
        let home = self.dir.path().join(format!("{name}-{id}"));
        config.data_dir = home.join("data");
        ports.release();
        std::fs::create_dir_all(&home).unwrap();
        self.procs.push(Proc {
            config_path: home.join("ringd.toml"),
            log_path: home.join("ringd.log"),
            security: self.security.clone(),
            config,
            env: Vec::new(),
            ringd: None,
            child: None,
        });
        self.procs.len() - 1
    }

    /// Runs `ringctl member add` for member `i` (from its config), plus `extra` arguments.
    pub fn ringctl_member_add(&self, i: usize, extra: &[&str]) -> Output {
        let cfg = &self.procs[i].config;
        let (id, address, admin) = (cfg.id.to_string(), cfg.peer_address(), cfg.admin_address());
        let mut args = vec![
            "member",
            "add",
            "--id",
            &id,
            "--name",
            &cfg.name,
            "--zone",
            &cfg.zone,
            "--address",
            &address,
            "--admin-address",
            &admin,
        ];
        args.extend_from_slice(extra);
        self.ringctl(&args)
    }

    /// A client over all members.
    pub fn client(&self) -> AdminClient {
        AdminClient::new(
            self.procs.iter().map(Proc::admin).collect(),
            self.security.clone(),
            "test",
        )
        .unwrap()
        .with_request_timeout(Duration::from_secs(20))
    }

    /// Index of the member with node id `id`.
    pub fn index_of(&self, id: u64) -> usize {
        self.procs
            .iter()
            .position(|p| p.config.id == id)
            .unwrap_or_else(|| panic!("no member with id {id}"))
    }

    /// Waits until every running member in `among` agrees on one leader that is not in
    /// `excluding`, and returns it.
    pub async fn wait_leader(&self, among: &[usize], excluding: &[u64], timeout: Duration) -> u64 {
        eventually(timeout, "members agree on a leader", || async {
            let mut leader = None;
            for &i in among {
                let s = status(&self.procs[i]).await.ok()?;
                if s.leader_id == 0 || excluding.contains(&s.leader_id) {
                    return None;
                }
                if leader.is_some_and(|l| l != s.leader_id) {
                    return None;
                }
                leader = Some(s.leader_id);
            }
            leader
        })
        .await
    }

    /// Kills member `i` the way a zone dies: its `ringd`, and the guards and etcds it started
    /// (every process whose command line names its data directory).
    pub fn kill_zone(&mut self, i: usize) {
        self.procs[i].kill9();
        let data_root = self.procs[i].config.data_dir.display().to_string();
        let _ = std::process::Command::new("pkill")
            .args(["-9", "-f", &data_root])
            .status();
    }

    /// `n` free loopback addresses none of the members is configured to listen on (their
    /// ports were released when the ring was prepared, so a plain [`Ports::reserve`] can hand
    /// one of them out again: seen as "cannot listen on metrics address ...: already in use").
    pub fn free_addresses(&self, n: usize) -> Vec<SocketAddr> {
        let taken: std::collections::BTreeSet<u16> = self
            .procs
            .iter()
            .flat_map(|p| [p.config.listen_peer.port(), p.config.listen_admin.port()])
            .collect();
        // Reservations that collided are held until the end, so none comes back.
        let mut held = Vec::new();
        loop {
            let ports = Ports::reserve(n);
            if ports.numbers().iter().all(|p| !taken.contains(p)) {
                let addresses = ports
                    .numbers()
                    .iter()
                    .map(|p| SocketAddr::from(([127, 0, 0, 1], *p)))
                    .collect();
                ports.release();
                drop(held);
                return addresses;
            }
            held.push(ports);
        }
    }

    /// Runs the real `ringctl` against all members with `args`.
    pub fn ringctl(&self, args: &[&str]) -> Output {
        let endpoints: Vec<String> = self.procs.iter().map(Proc::admin).collect();
        ringctl(&self.client_config, &endpoints, args)
    }

    /// Concatenated logs of all members (for failure messages).
    pub fn logs(&self) -> String {
        self.procs
            .iter()
            .map(|p| format!("===== {} =====\n{}", p.config.name, p.log()))
            .collect::<Vec<_>>()
            .join("\n")
    }
}

/// Runs the real `ringctl` with the client config `config` (through `RINGCTL_CONFIG`, as an
/// operator would) and `--endpoint` set to `endpoints`.
pub fn ringctl(config: &Path, endpoints: &[String], args: &[&str]) -> Output {
    ringctl_of(&binary("ringctl"), config, endpoints, args)
}

/// [`ringctl`] with another build's `ringctl` binary (e.g. the previous release's).
pub fn ringctl_of(ringctl: &Path, config: &Path, endpoints: &[String], args: &[&str]) -> Output {
    Command::new(ringctl)
        .arg("--endpoint")
        .arg(endpoints.join(","))
        .args(args)
        .env_remove("RINGCTL_ENDPOINTS")
        .env("RINGCTL_CONFIG", config)
        .output()
        .expect("run ringctl")
}

/// The `Status` of one member.
pub async fn status(p: &Proc) -> Result<pb::StatusResponse, garden_ring::admin::ClientError> {
    p.client()
        .call(pb::StatusRequest::default(), |mut c, r| async move {
            c.status(r).await
        })
        .await
}

/// Polls `check` every 20 ms until it returns `Some`, or panics naming `what` after `timeout`.
pub async fn eventually<T, F, Fut>(timeout: Duration, what: &str, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting until {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A control plane registration request with endpoints on members `a`, `b`, `c`.
pub fn control_plane(name: &str, home: Option<&str>) -> pb::ControlPlaneAddRequest {
    pb::ControlPlaneAddRequest {
        name: name.into(),
        home: home.unwrap_or_default().into(),
        dns_name: format!("{name}.{TEST_ZONE}"),
        endpoints: ["a", "b", "c"]
            .iter()
            .enumerate()
            .map(|(i, m)| (m.to_string(), format!("10.0.0.{}:443", i + 1)))
            .collect(),
        backup: format!("s3://backups/{name}"),
        backups: Default::default(),
        host: String::new(),
        reason: "test".into(),
        prefer: Vec::new(),
        tolerance: Default::default(),
        etcd_peers: Default::default(),
    }
}

/// Registers a control plane through `client`; returns the commit index.
pub async fn add_control_plane(
    client: &AdminClient,
    req: pb::ControlPlaneAddRequest,
) -> Result<u64, garden_ring::admin::ClientError> {
    client
        .call(req, |mut c, r| async move { c.control_plane_add(r).await })
        .await
        .map(|r| r.index)
}

/// Waits (at most `timeout`) until control plane `name` runs on `host`, as the first of the
/// three founders that answers sees it.
pub async fn running_on_within(
    ring: &Ring,
    name: &str,
    host: &str,
    timeout: Duration,
) -> pb::ControlPlane {
    eventually(timeout, &format!("{name} runs on {host}"), || async {
        let cp = cps(ring, &[0, 1, 2]).await.remove(name)?;
        (cp.phase == "running" && cp.host == host).then_some(cp)
    })
    .await
}

/// The control planes as the first of `among` that answers sees them.
pub async fn cps(ring: &Ring, among: &[usize]) -> BTreeMap<String, pb::ControlPlane> {
    for &i in among {
        if let Ok(s) = status(&ring.procs[i]).await {
            return s
                .control_planes
                .into_iter()
                .map(|c| (c.name.clone(), c))
                .collect();
        }
    }
    panic!("no member of {among:?} answers");
}

/// Waits (at most 20 s) until every member sees every member healthy.
pub async fn wait_all_healthy(ring: &Ring) {
    eventually(
        Duration::from_secs(20),
        "every member is healthy",
        || async {
            for p in &ring.procs {
                let s = status(p).await.ok()?;
                if s.members.len() != ring.procs.len()
                    || s.members.iter().any(|m| m.health != "healthy")
                {
                    return None;
                }
            }
            Some(())
        },
    )
    .await;
}

/// Adds `names` (with the given home and host) and waits until all run. First waits until the
/// leader judged every member healthy: on a loaded machine a member slow to start can be judged
/// lost, and its control planes would move before the test begins.
pub async fn add_running(ring: &Ring, specs: &[(&str, Option<&str>, Option<&str>)]) {
    wait_all_healthy(ring).await;
    for (name, home, host) in specs {
        let mut req = control_plane(name, *home);
        req.host = host.unwrap_or_default().to_string();
        add_control_plane(&ring.client(), req).await.unwrap();
    }
    eventually(
        Duration::from_secs(10),
        "every control plane runs",
        || async {
            let all = cps(ring, &[0, 1, 2]).await;
            // Every one added, as seen by the member that answers (not vacuously true).
            let added = specs.iter().all(|(name, ..)| all.contains_key(*name));
            (added && all.values().all(|c| c.phase == "running")).then_some(())
        },
    )
    .await;
}

/// Copies directory `from` to `to` (files and directories only): a data directory as an
/// operator's backup copy would hold it.
pub fn copy_dir(from: &Path, to: &Path) -> std::io::Result<()> {
    std::fs::create_dir_all(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        let kind = entry.file_type()?;
        if kind.is_dir() {
            copy_dir(&entry.path(), &target)?;
        } else if kind.is_file() {
            std::fs::copy(entry.path(), &target)?;
        }
        // Anything else (a guard's control socket) is no data: a copy leaves it out, as tar
        // does ("socket ignored").
    }
    Ok(())
}
