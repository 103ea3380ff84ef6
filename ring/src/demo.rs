//! `ringctl demo`: a local ring of child `ringd` processes on loopback.
//!
//! Layout under the demo directory, one folder per member:
//! `DIR/<name>/ringd.toml` (its config), `DIR/<name>/ringd.pid`, `DIR/<name>/ringd.log`,
//! `DIR/<name>/data/` (its data directory); `DIR/certs/` holds the ring's CA and the
//! certificates of the members, of an admin (`admin-operator`) and of a viewer
//! (`viewer-observer`); `DIR/ringctl.toml` is a client config for the admin certificate, so
//! `RINGCTL_CONFIG=DIR/ringctl.toml ringctl status` talks to the demo ring over mutual TLS.
//! Member `i` (from 0) is named `a`, `b`, ... in zone
//! `zone-a`, `zone-b`, ..., with its Admin API on `base_port + 10*i`, its peer API on
//! `base_port + 10*i + 1` and the ring's DNS zone (builtin provider, UDP and TCP) on
//! `base_port + 10*i + 3`. Starting a demo in a directory that already holds one resumes it from
//! its data.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde::Serialize;

use crate::admin::AdminClient;
use crate::client_config::ClientConfig;
use crate::config::{
    Config, DnsSettings, DriverKind, DriverSettings, EtcdDriverSettings, InitialMember,
    LogSettings, PlacementSettings, SnapshotSettings, Timing, TlsSettings,
};
use crate::pb;
use crate::tls::{Identity, Role, Security, TlsFiles, certs};

/// The demo ring's DNS zone.
pub const DEMO_ZONE: &str = "demo.garden-ring.local";

/// Most members a demo starts.
pub const MAX_DEMO_MEMBERS: usize = 9;

/// Why the demo could not run.
#[derive(Debug, thiserror::Error)]
pub enum DemoError {
    /// Bad options.
    #[error("{0}")]
    Options(String),
    /// Certificates could not be made or loaded.
    #[error("demo certificates: {0}")]
    Certs(String),
    /// A file or process operation failed.
    #[error("{what}: {source}")]
    Io {
        /// What was being done.
        what: String,
        /// The error.
        #[source]
        source: std::io::Error,
    },
    /// A member exited or the ring did not form.
    #[error("{0}")]
    Ring(String),
}

fn io(what: impl Into<String>) -> impl FnOnce(std::io::Error) -> DemoError {
    let what = what.into();
    move |source| DemoError::Io { what, source }
}

/// One member of the demo ring.
#[derive(Debug, Clone, Serialize)]
pub struct DemoMember {
    /// Raft node id.
    pub id: u64,
    /// Name.
    pub name: String,
    /// Zone.
    pub zone: String,
    /// Admin API endpoint.
    pub admin_endpoint: String,
    /// Peer API endpoint.
    pub peer_endpoint: String,
    /// Where it serves the ring's DNS zone (UDP and TCP).
    pub dns_endpoint: String,
    /// Process id of its `ringd`.
    pub pid: u32,
    /// Its data directory.
    pub data_dir: PathBuf,
    /// Its config file.
    pub config: PathBuf,
    /// Its log file.
    pub log: PathBuf,
}

/// A started demo ring.
#[derive(Debug, Serialize)]
pub struct Demo {
    /// The demo directory.
    pub dir: PathBuf,
    /// The members.
    pub members: Vec<DemoMember>,
    /// The leader's id once the ring formed.
    pub leader_id: u64,
    /// The client config for `ringctl` (`RINGCTL_CONFIG`).
    pub client_config: PathBuf,
    /// Whether the ring runs with TLS.
    pub tls: bool,
    #[serde(skip)]
    security: Security,
    #[serde(skip)]
    children: Vec<Child>,
}

/// What to start.
#[derive(Debug, Clone)]
pub struct DemoOptions {
    /// Number of members (1 to [`MAX_DEMO_MEMBERS`]).
    pub members: usize,
    /// Directory; a fresh one under the system temp dir when `None`.
    pub dir: Option<PathBuf>,
    /// First port.
    pub base_port: u16,
    /// The `ringd` binary.
    pub ringd: PathBuf,
    /// How long to wait for the ring to form.
    pub timeout: Duration,
    /// Whether to register the sample control planes.
    pub samples: bool,
    /// Run without TLS.
    pub insecure: bool,
    /// Run the control planes' etcd with the `etcd` driver, from this directory (the
    /// `none` driver when unset).
    pub etcd_bin_dir: Option<PathBuf>,
}

/// How often the demo takes a full snapshot of each control plane's etcd, in ms.
pub const DEMO_SNAPSHOT_INTERVAL_MS: u64 = 60_000;
/// How often the demo writes a delta snapshot of each control plane's etcd, in ms.
pub const DEMO_DELTA_PERIOD_MS: u64 = 1_000;

/// The directory of the first `etcd` on `PATH` that has `etcdctl` or `etcdutl` beside it.
pub fn find_etcd() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    std::env::split_paths(&path).find(|dir| {
        dir.join("etcd").is_file()
            && (dir.join("etcdctl").is_file() || dir.join("etcdutl").is_file())
    })
}

/// Makes (or reuses) the demo's certificates in `dir/certs`: a CA, one certificate per member,
/// one admin and one viewer. Returns the directory.
pub fn demo_certificates(dir: &Path, members: &[InitialMember]) -> Result<PathBuf, DemoError> {
    let certs_dir = dir.join("certs");
    let fail = |e: certs::CertsError| DemoError::Certs(e.to_string());
    if !certs::ca_path(&certs_dir).exists() {
        certs::init_ca(&certs_dir, certs::DEFAULT_CA_DAYS, false).map_err(fail)?;
    }
    let loopback: Vec<String> = vec!["127.0.0.1".into(), "localhost".into()];
    let mut identities: Vec<(Identity, Vec<String>)> = Vec::new();
    for m in members {
        let identity =
            Identity::new(Role::Member, &m.name).map_err(|e| DemoError::Certs(e.to_string()))?;
        // A member's certificate also names the host of its peer address: the etcd members
        // of zone-tolerant control planes present it to their peers, which check it.
        let mut sans = loopback.clone();
        if let Some((host, _)) = m.address.rsplit_once(':')
            && !sans.iter().any(|s| s == host)
        {
            sans.push(
                host.trim_start_matches('[')
                    .trim_end_matches(']')
                    .to_string(),
            );
        }
        identities.push((identity, sans));
    }
    identities.push((
        Identity::new(Role::Admin, "operator").expect("a valid name"),
        loopback.clone(),
    ));
    identities.push((
        Identity::new(Role::Viewer, "observer").expect("a valid name"),
        loopback,
    ));
    for (identity, sans) in identities {
        if !certs::paths(&certs_dir, &identity).0.exists() {
            certs::issue(
                &certs_dir,
                &identity,
                &sans,
                certs::DEFAULT_CERT_DAYS,
                false,
            )
            .map_err(fail)?;
        }
    }
    Ok(certs_dir)
}

/// The TLS files of `identity` in a certificates directory made by [`demo_certificates`].
pub fn tls_files(certs_dir: &Path, identity: &Identity) -> TlsFiles {
    let (cert_file, key_file) = certs::paths(certs_dir, identity);
    TlsFiles {
        ca_file: certs::ca_path(certs_dir),
        cert_file,
        key_file,
        crl_file: None,
    }
}

fn member_name(i: usize) -> String {
    char::from(b'a' + u8::try_from(i).expect("at most 9 members")).to_string()
}

/// The founding members of a demo ring.
pub fn layout(members: usize, base_port: u16) -> Result<Vec<InitialMember>, DemoError> {
    if members == 0 || members > MAX_DEMO_MEMBERS {
        return Err(DemoError::Options(format!(
            "--members must be 1 to {MAX_DEMO_MEMBERS}, got {members}"
        )));
    }
    let last = u32::from(base_port) + 10 * (members as u32 - 1) + 1;
    if base_port < 1024 || last > u32::from(u16::MAX) {
        return Err(DemoError::Options(format!(
            "--base-port {base_port} leaves no room for {members} members (ports {base_port}..={last} must be within 1024..=65535)"
        )));
    }
    Ok((0..members)
        .map(|i| {
            let name = member_name(i);
            let admin = base_port + 10 * i as u16;
            InitialMember {
                id: i as u64 + 1,
                zone: format!("zone-{name}"),
                name,
                address: format!("127.0.0.1:{}", admin + 1),
                admin_address: format!("127.0.0.1:{admin}"),
            }
        })
        .collect())
}

/// Stops child processes: SIGTERM to all, then SIGKILL for any still running after `grace`;
/// returns once all have exited.
pub fn terminate_all(children: &mut [Child], grace: Duration) {
    for child in children.iter() {
        if let Ok(pid) = i32::try_from(child.id()) {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
    }
    let deadline = Instant::now() + grace;
    for child in children.iter_mut() {
        loop {
            match child.try_wait() {
                Ok(Some(_)) | Err(_) => break,
                Ok(None) if Instant::now() >= deadline => {
                    let _ = child.kill();
                    let _ = child.wait();
                    break;
                }
                Ok(None) => std::thread::sleep(Duration::from_millis(20)),
            }
        }
    }
}

/// Where the demo member with Admin address `admin` serves DNS: the Admin port + 3.
pub fn dns_address(admin: &str) -> std::net::SocketAddr {
    let mut address: std::net::SocketAddr = admin.parse().expect("demo addresses are valid");
    address.set_port(address.port() + 3);
    address
}

/// Pids recorded in `dir` whose processes are still alive.
pub fn running_pids(dir: &Path) -> Vec<(String, i32)> {
    let Ok(entries) = std::fs::read_dir(dir) else {
        return Vec::new();
    };
    let mut out = Vec::new();
    for entry in entries.flatten() {
        let pid_file = entry.path().join("ringd.pid");
        let Ok(text) = std::fs::read_to_string(&pid_file) else {
            continue;
        };
        if let Ok(pid) = text.trim().parse::<i32>()
            && nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), None).is_ok()
        {
            out.push((entry.file_name().to_string_lossy().into_owned(), pid));
        }
    }
    out.sort();
    out
}

impl Demo {
    /// Writes the configs, starts the members and waits until the ring has a leader and has
    /// registered every member.
    pub async fn start(opts: DemoOptions) -> Result<Self, DemoError> {
        let founders = layout(opts.members, opts.base_port)?;
        let dir = match &opts.dir {
            Some(d) => d.clone(),
            None => std::env::temp_dir().join(format!(
                "garden-ring-demo-{}-{}",
                std::process::id(),
                crate::time::unix_ms()
            )),
        };
        let running = running_pids(&dir);
        if !running.is_empty() {
            return Err(DemoError::Options(format!(
                "a demo is already running in {} (members {:?}); stop it with `ringctl demo --stop --dir {}`",
                dir.display(),
                running,
                dir.display()
            )));
        }
        std::fs::create_dir_all(&dir).map_err(io(format!("creating {}", dir.display())))?;
        let dir = dir
            .canonicalize()
            .map_err(io(format!("resolving {}", dir.display())))?;

        let certs_dir = if opts.insecure {
            None
        } else {
            Some(demo_certificates(&dir, &founders)?)
        };
        let client_config = ClientConfig {
            endpoints: founders.iter().map(|m| m.admin_address.clone()).collect(),
            insecure: opts.insecure,
            ..match &certs_dir {
                Some(d) => {
                    let files =
                        tls_files(d, &Identity::new(Role::Admin, "operator").expect("valid"));
                    ClientConfig {
                        ca_file: Some(files.ca_file),
                        cert_file: Some(files.cert_file),
                        key_file: Some(files.key_file),
                        ..ClientConfig::default()
                    }
                }
                None => ClientConfig::default(),
            }
        };
        let client_config_path = dir.join("ringctl.toml");
        std::fs::write(&client_config_path, client_config.to_toml())
            .map_err(io(format!("writing {}", client_config_path.display())))?;
        let security = client_config
            .security()
            .map_err(|e| DemoError::Certs(e.to_string()))?;

        let mut demo = Demo {
            dir: dir.clone(),
            members: Vec::new(),
            leader_id: 0,
            client_config: client_config_path,
            tls: !opts.insecure,
            security,
            children: Vec::new(),
        };
        for m in &founders {
            let home = dir.join(&m.name);
            std::fs::create_dir_all(&home).map_err(io(format!("creating {}", home.display())))?;
            let config = Config {
                id: m.id,
                name: m.name.clone(),
                zone: m.zone.clone(),
                data_dir: home.join("data"),
                listen_peer: m.address.parse().expect("demo addresses are valid"),
                listen_admin: m.admin_address.parse().expect("demo addresses are valid"),
                advertise_peer: None,
                advertise_admin: None,
                initial_members: founders.clone(),
                timing: Timing::loopback(),
                snapshot: SnapshotSettings::default(),
                log: LogSettings::default(),
                backup: Default::default(),
                upgrade: Default::default(),
                tls: certs_dir.as_ref().map(|d| TlsSettings {
                    files: tls_files(d, &Identity::new(Role::Member, &m.name).expect("valid")),
                    reload_interval_ms: 1_000,
                }),
                insecure: opts.insecure,
                dns: DnsSettings {
                    zone: Some(DEMO_ZONE.into()),
                    ttl_s: 5,
                    listen: Some(dns_address(&m.admin_address)),
                    verify_servers: founders
                        .iter()
                        .map(|f| dns_address(&f.admin_address))
                        .collect(),
                    ..DnsSettings::default()
                },
                metrics: Default::default(),
                admin: Default::default(),
                placement: PlacementSettings {
                    min_move_interval_ms: 10_000,
                    capacity: 0,
                    ..PlacementSettings::default()
                },
                driver: match &opts.etcd_bin_dir {
                    Some(bin_dir) => DriverSettings {
                        kind: DriverKind::Etcd,
                        etcd: EtcdDriverSettings {
                            bin_dir: Some(bin_dir.clone()),
                            full_snapshot_interval_ms: DEMO_SNAPSHOT_INTERVAL_MS,
                            delta_snapshot_period_ms: DEMO_DELTA_PERIOD_MS,
                            ..EtcdDriverSettings::default()
                        },
                        ..DriverSettings::default()
                    },
                    None => DriverSettings::default(),
                },
            };
            config
                .validate()
                .map_err(|e| DemoError::Options(e.to_string()))?;
            let config_path = home.join("ringd.toml");
            std::fs::write(&config_path, config.to_toml())
                .map_err(io(format!("writing {}", config_path.display())))?;
            let log_path = home.join("ringd.log");
            let log = std::fs::OpenOptions::new()
                .create(true)
                .append(true)
                .open(&log_path)
                .map_err(io(format!("opening {}", log_path.display())))?;
            let log_err = log.try_clone().map_err(io("duplicating the log file"))?;
            let child = {
                use std::os::unix::process::CommandExt;
                Command::new(&opts.ringd)
                    .arg("--config")
                    .arg(&config_path)
                    .stdin(Stdio::null())
                    .stdout(log)
                    .stderr(log_err)
                    // Own process group: a Ctrl-C meant for ringctl does not hit the members,
                    // which are stopped in order instead (or keep running with --detach).
                    .process_group(0)
                    .spawn()
                    .map_err(io(format!("starting {}", opts.ringd.display())))?
            };
            let pid = child.id();
            std::fs::write(home.join("ringd.pid"), format!("{pid}\n"))
                .map_err(io("writing the pid file"))?;
            demo.children.push(child);
            demo.members.push(DemoMember {
                id: m.id,
                name: m.name.clone(),
                zone: m.zone.clone(),
                dns_endpoint: dns_address(&m.admin_address).to_string(),
                admin_endpoint: m.admin_address.clone(),
                peer_endpoint: m.address.clone(),
                pid,
                data_dir: config.data_dir.clone(),
                config: config_path,
                log: log_path,
            });
        }
        if let Err(e) = demo.wait_formed(opts.timeout).await {
            demo.stop(Duration::from_secs(5));
            return Err(e);
        }
        if opts.samples {
            demo.add_samples().await?;
        }
        Ok(demo)
    }

    /// A client for all members.
    pub fn client(&self) -> AdminClient {
        AdminClient::new(
            self.members
                .iter()
                .map(|m| m.admin_endpoint.clone())
                .collect(),
            self.security.clone(),
            "ringctl/demo",
        )
        .expect("demo endpoints are valid")
        .with_request_timeout(Duration::from_secs(15))
    }

    fn check_children(&mut self) -> Result<(), DemoError> {
        for (child, m) in self.children.iter_mut().zip(&self.members) {
            if let Ok(Some(status)) = child.try_wait() {
                let tail = std::fs::read_to_string(&m.log).unwrap_or_default();
                let last = tail
                    .lines()
                    .rev()
                    .find(|l| !l.trim().is_empty())
                    .unwrap_or("");
                return Err(DemoError::Ring(format!(
                    "member {} exited ({status}); last log line: {last} (log: {})",
                    m.name,
                    m.log.display()
                )));
            }
        }
        Ok(())
    }

    async fn wait_formed(&mut self, timeout: Duration) -> Result<(), DemoError> {
        let deadline = Instant::now() + timeout;
        let client = self.client().with_request_timeout(Duration::from_secs(2));
        let want = self.members.len();
        let mut last = String::from("no answer yet");
        while Instant::now() < deadline {
            self.check_children()?;
            match client
                .call(pb::StatusRequest::default(), |mut c, r| async move {
                    c.status(r).await
                })
                .await
            {
                Ok(s) if s.leader_id != 0 && registered_voters(&s) == want => {
                    self.leader_id = s.leader_id;
                    return Ok(());
                }
                Ok(s) => {
                    last = format!(
                        "leader {}, {} of {want} members registered",
                        s.leader_id,
                        registered_voters(&s)
                    )
                }
                Err(e) => last = e.to_string(),
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        Err(DemoError::Ring(format!(
            "the ring did not form within {} s ({last}); see the logs under {}",
            timeout.as_secs(),
            self.dir.display()
        )))
    }

    async fn add_samples(&self) -> Result<(), DemoError> {
        let client = self.client();
        let mut last_index = 0;
        for (i, m) in self.members.iter().enumerate() {
            let name = format!("cp-{}", m.name);
            // Member j serves control plane i on its admin port + 5 + i: one port per control
            // plane and member, so the etcd driver's gates never collide.
            let endpoints: BTreeMap<String, String> = self
                .members
                .iter()
                .map(|other| {
                    let port = other
                        .admin_endpoint
                        .rsplit(':')
                        .next()
                        .and_then(|p| p.parse::<u16>().ok())
                        .unwrap_or(0);
                    let offset = 5 + u16::try_from(i).expect("at most MAX_DEMO_MEMBERS");
                    (other.name.clone(), format!("127.0.0.1:{}", port + offset))
                })
                .collect();
            let req = pb::ControlPlaneAddRequest {
                name: name.clone(),
                home: m.name.clone(),
                dns_name: format!("{name}.{DEMO_ZONE}"),
                endpoints,
                backup: format!("file://{}/backups/{name}", self.dir.display()),
                // Each zone has its own bucket, as Gardener gives every seed one: a move copies
                // the backups from the old host's bucket to the new host's.
                backups: self
                    .members
                    .iter()
                    .map(|other| {
                        (
                            other.name.clone(),
                            format!(
                                "file://{}/backups/{}/{name}",
                                self.dir.display(),
                                other.zone
                            ),
                        )
                    })
                    .collect(),
                host: String::new(),
                reason: "demo sample".into(),
                prefer: Vec::new(),
                tolerance: Default::default(),
                etcd_peers: Default::default(),
            };
            match client
                .call(req, |mut c, r| async move { c.control_plane_add(r).await })
                .await
            {
                Ok(resp) => last_index = last_index.max(resp.index),
                Err(e) if e.code() == Some(tonic::Code::AlreadyExists) => {}
                Err(e) => {
                    return Err(DemoError::Ring(format!(
                        "adding sample control plane {name}: {e}"
                    )));
                }
            }
        }
        self.wait_all_applied(last_index, Duration::from_secs(10))
            .await
    }

    /// Waits until every member has applied `index`, so whichever member `ringctl` asks next
    /// shows the same ring.
    async fn wait_all_applied(&self, index: u64, timeout: Duration) -> Result<(), DemoError> {
        let deadline = Instant::now() + timeout;
        for m in &self.members {
            let one = AdminClient::new(
                vec![m.admin_endpoint.clone()],
                self.security.clone(),
                "ringctl/demo",
            )
            .expect("demo endpoints are valid")
            .with_request_timeout(Duration::from_secs(2));
            loop {
                let applied = one
                    .call(pb::StatusRequest::default(), |mut c, r| async move {
                        c.status(r).await
                    })
                    .await
                    .map(|s| s.applied_index)
                    .unwrap_or(0);
                if applied >= index {
                    break;
                }
                if Instant::now() >= deadline {
                    return Err(DemoError::Ring(format!(
                        "member {} has applied index {applied}, not yet {index}, after {} s",
                        m.name,
                        timeout.as_secs()
                    )));
                }
                tokio::time::sleep(Duration::from_millis(20)).await;
            }
        }
        Ok(())
    }

    /// Leaves the members running after this value is dropped.
    pub fn detach(mut self) -> Self {
        self.children.clear();
        self
    }

    /// Stops the members: SIGTERM, then SIGKILL for any still running after `grace`.
    pub fn stop(&mut self, grace: Duration) {
        terminate_all(&mut self.children, grace);
        for m in &self.members {
            let _ = std::fs::remove_file(m.config.with_file_name("ringd.pid"));
        }
        self.children.clear();
    }
}

/// Stops the members of a detached demo in `dir`; returns the names stopped.
pub fn stop_detached(dir: &Path, grace: Duration) -> Vec<String> {
    let running = running_pids(dir);
    for (_, pid) in &running {
        let _ = nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(*pid),
            nix::sys::signal::Signal::SIGTERM,
        );
    }
    let deadline = Instant::now() + grace;
    for (name, pid) in &running {
        let pid = nix::unistd::Pid::from_raw(*pid);
        while nix::sys::signal::kill(pid, None).is_ok() {
            if Instant::now() >= deadline {
                let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
                break;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        let _ = std::fs::remove_file(dir.join(name).join("ringd.pid"));
    }
    running.into_iter().map(|(n, _)| n).collect()
}

/// Fails a zone of the demo in `dir` the way a zone dies: SIGKILL to its member's `ringd` and
/// to every process started for it (the guards and the etcds of the control planes it hosts).
/// `zone` is a zone (`zone-a`) or a member name (`a`). Returns what was killed, as
/// `(what, pid)`.
pub fn fail_zone(dir: &Path, zone: &str) -> Result<Vec<(String, i32)>, DemoError> {
    let member = zone.strip_prefix("zone-").unwrap_or(zone);
    let home = dir.join(member);
    if member.is_empty() || !home.join("ringd.toml").is_file() {
        return Err(DemoError::Options(format!(
            "{} has no demo member for zone {zone:?} (zones are zone-a, zone-b, ...)",
            dir.display()
        )));
    }
    let running = running_pids(dir);
    let ringd = running
        .iter()
        .find(|(name, _)| name == member)
        .map(|(_, pid)| *pid);
    let mut killed = Vec::new();
    let kill = |pid: i32| {
        nix::sys::signal::kill(
            nix::unistd::Pid::from_raw(pid),
            nix::sys::signal::Signal::SIGKILL,
        )
        .is_ok()
    };
    if let Some(pid) = ringd
        && kill(pid)
    {
        killed.push((format!("ringd {member}"), pid));
    }
    // Whatever runs with a path inside the member's directory: its guards and etcds.
    let marker = format!("{}/", home.display());
    if let Ok(entries) = std::fs::read_dir("/proc") {
        for entry in entries.flatten() {
            let Some(pid) = entry
                .file_name()
                .to_str()
                .and_then(|n| n.parse::<i32>().ok())
            else {
                continue;
            };
            if Some(pid) == ringd {
                continue;
            }
            let Ok(cmdline) = std::fs::read(entry.path().join("cmdline")) else {
                continue;
            };
            let args: Vec<String> = cmdline
                .split(|b| *b == 0)
                .map(|a| String::from_utf8_lossy(a).into_owned())
                .collect();
            if args.iter().any(|a| a.starts_with(&marker)) && kill(pid) {
                let program = args
                    .first()
                    .map(|a| a.rsplit('/').next().unwrap_or(a).to_string());
                killed.push((program.unwrap_or_default(), pid));
            }
        }
    }
    let _ = std::fs::remove_file(home.join("ringd.pid"));
    if killed.is_empty() {
        return Err(DemoError::Options(format!(
            "nothing of zone {zone} runs in {}",
            dir.display()
        )));
    }
    Ok(killed)
}

fn registered_voters(s: &pb::StatusResponse) -> usize {
    s.members
        .iter()
        .filter(|m| m.role == "voter" && m.health != "unknown")
        .count()
}

impl Drop for Demo {
    fn drop(&mut self) {
        if !self.children.is_empty() {
            self.stop(Duration::from_secs(5));
        }
    }
}
