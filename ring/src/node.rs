//! One member, assembled: storage, Raft, the peer and Admin servers, and the leader's duties.
//!
//! [`Member::start`] checks and acquires everything that can fail (configuration, data
//! directory, both listening addresses) before Raft starts, so a bad start fails fast with one
//! clear error and changes nothing on disk beyond creating the data directory.

use std::collections::BTreeMap;
use std::sync::Arc;

use openraft::SnapshotPolicy;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;
use tonic::service::interceptor::InterceptedService;

use crate::admin::AdminService;
use crate::admin::service::Transport;
use crate::agent::driver::Workloads;
use crate::agent::{self, Agent};
use crate::config::{Config, ConfigError, DnsProvider};
use crate::core::MemberSpec;
use crate::core::controller::Policy;
use crate::dns::keeper::{Keeper, KeeperSettings};
use crate::duties;
use crate::introspection;
use crate::leases::LeaseDesk;
use crate::membership::MembershipChanger;
use crate::raft::contact::LeaderContact;
use crate::raft::disk::DiskHealth;
use crate::raft::network::{PeerNetwork, PeerPool};
use crate::raft::service::Handlers;
use crate::raft::service::PeerService;
use crate::raft::storage::{self, OpenError};
use crate::raft::{LogStore, MemberNode, NodeId, RaftNode, StateMachineStore};
use crate::tls::server::SeenCertificates;
use crate::tls::{Identity, Role, Security, TlsError, TlsStore};

/// Why a member could not start.
#[derive(Debug, thiserror::Error)]
pub enum StartError {
    /// The configuration is unusable.
    #[error(transparent)]
    Config(#[from] ConfigError),
    /// The data directory is unusable.
    #[error(transparent)]
    Storage(#[from] OpenError),
    /// A listening address cannot be bound.
    #[error("cannot listen on {what} address {address}: {why}")]
    Bind {
        /// "peer" or "admin".
        what: &'static str,
        /// The address.
        address: std::net::SocketAddr,
        /// Why, in words.
        why: String,
    },
    /// The builtin DNS server cannot bind its address.
    #[error(transparent)]
    Dns(crate::dns::server::ServeError),
    /// The driver cannot be set up.
    #[error("driver: {0}")]
    Driver(#[from] crate::agent::driver::DriverError),
    /// The rfc2136 provider is unusable (its key, its zone).
    #[error("dns.rfc2136: {0}")]
    DnsKey(crate::dns::rfc2136::SetupError),
    /// Raft could not be started.
    #[error("cannot start raft: {0}")]
    Raft(String),
    /// The TLS files are unusable.
    #[error("TLS: {0}")]
    Tls(#[from] TlsError),
    /// The reflection service cannot be built from the embedded descriptors.
    #[error(transparent)]
    Reflection(#[from] crate::introspection::ReflectionError),
    /// The ring knows this member, but its data directory is empty: its data was lost.
    #[error(
        "the ring already knows member {id} as one that was in contact, but the data directory {dir} is empty: \
         this member lost its data and must not rejoin under the same id (its votes and log are gone). \
         Remove it with `ringctl member remove {id}`, then add it back with a new id"
    )]
    DataLost {
        /// The member id.
        id: NodeId,
        /// The empty data directory.
        dir: std::path::PathBuf,
    },
    /// Peers report that this member was removed from the ring.
    #[error("this member was removed from the ring: {0}")]
    Removed(String),
    /// The ring was formed without this member.
    #[error(
        "the ring reachable through initial_members was formed without member {0}; \
         check initial_members, or join it with `ringctl member add`"
    )]
    NotAMember(NodeId),
}

/// What a founder with an empty data directory does, after asking the other founders.
#[derive(Debug, PartialEq, Eq)]
enum FounderStart {
    /// Nobody has formed the ring yet: initialize it (every founder does the same).
    Initialize,
    /// The ring is formed and expects this member: just follow it.
    Follow,
}

/// Asks the other founders how they see this member before an empty data directory forms or
/// joins a ring. Safety: a member that lost its data must never come back under its old id.
async fn founder_start(config: &Config, network: &PeerNetwork) -> Result<FounderStart, StartError> {
    let timeout = std::time::Duration::from_millis(config.timing.probe_timeout_ms());
    let asks = config
        .initial_members
        .iter()
        .filter(|m| m.id != config.id)
        .map(|m| {
            let node = MemberNode::from(&MemberSpec::from(m));
            let mut client = network.client(m.id, &node);
            async move { client.ping(timeout).await }
        });
    let replies = futures::future::join_all(asks).await;
    if let Some(message) = network.pool().watch_removed().borrow().clone() {
        return Err(StartError::Removed(message));
    }
    let mut start = FounderStart::Initialize;
    for reply in replies.into_iter().flatten() {
        if !reply.bootstrapped && reply.leader_id.is_none() && reply.applied_index == 0 {
            continue;
        }
        match reply.registered {
            Some(true) => {
                return Err(StartError::DataLost {
                    id: config.id,
                    dir: config.data_dir.clone(),
                });
            }
            None if reply.bootstrapped => return Err(StartError::NotAMember(config.id)),
            Some(false) | None => start = FounderStart::Follow,
        }
    }
    Ok(start)
}

/// A running member.
pub struct Member {
    /// Its Raft node id.
    pub id: NodeId,
    /// Its Raft node.
    pub raft: RaftNode,
    /// Its state machine (for reads).
    pub state: StateMachineStore,
    removed: watch::Receiver<Option<String>>,
    stop: watch::Sender<bool>,
    tasks: Vec<(&'static str, JoinHandle<()>)>,
}

async fn bind(
    what: &'static str,
    address: std::net::SocketAddr,
) -> Result<TcpListener, StartError> {
    TcpListener::bind(address)
        .await
        .map_err(|e| StartError::Bind {
            what,
            address,
            why: match e.kind() {
                std::io::ErrorKind::AddrInUse => {
                    "the address is already in use (is another ringd running?)".into()
                }
                std::io::ErrorKind::AddrNotAvailable => {
                    "no local interface has this address".into()
                }
                std::io::ErrorKind::PermissionDenied => {
                    "permission denied (ports below 1024 need privileges)".into()
                }
                _ => e.to_string(),
            },
        })
}

/// openraft's heartbeat interval for a ring whose `timing.heartbeat_ms` is `heartbeat_ms`.
///
/// `heartbeat_ms` promises followers a heartbeat at least that often. openraft's
/// `heartbeat_interval` is the least time between two heartbeats: its tick fires every
/// `interval * 13 / 64` ms (openraft 0.10.0-alpha.37, `Config::tick_interval`) and sends one on
/// the first tick after `interval` has passed, so a follower waits up to `interval + tick`
/// (measured in the Admin flood with `heartbeat_interval = 50`: gaps of 60-67 ms; with 250:
/// 300 ms). openraft gets the longest interval whose `interval + tick` is at most 90% of
/// `heartbeat_ms`; the rest is for delivery. 50 -> 38 (worst 45), 250 -> 187 (worst 224).
pub fn openraft_heartbeat_interval_ms(heartbeat_ms: u64) -> u64 {
    let worst = |interval: u128| interval + (interval * 13 / 64).max(1);
    let budget = u128::from(heartbeat_ms) * 9 / 10;
    // About budget * 64 / 77; a step or two above it, then down to the longest that fits.
    let mut interval = (budget * 64 / 77 + 2).max(1);
    while interval > 1 && worst(interval) > budget {
        interval -= 1;
    }
    u64::try_from(interval).unwrap_or(u64::MAX)
}

/// openraft's configuration from ours.
pub fn raft_config(config: &Config) -> Result<openraft::Config, StartError> {
    let t = &config.timing;
    openraft::Config {
        cluster_name: "garden-ring".into(),
        heartbeat_interval: openraft_heartbeat_interval_ms(t.heartbeat_ms),
        election_timeout_min: t.election_timeout_min_ms,
        election_timeout_max: t.election_timeout_max_ms,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot.every_entries),
        max_in_snapshot_log_to_keep: config.snapshot.keep_entries,
        enable_pre_vote: Some(true),
        // A follower whose log went back behind what it acknowledged (a restored data dir)
        // otherwise panics a debug leader (openraft's `debug_assert`) or stalls its replication
        // for good in a release build (the follower stays at its old index, shown healthy:
        // issue 42). With this, openraft searches the follower's log again and re-replicates;
        // the network layer has marked it diverged first (`raft::divergence`), and the leader
        // keeps it judged lost until it is replaced.
        allow_log_reversion: Some(true),
        ..Default::default()
    }
    .validate()
    .map_err(|e| StartError::Raft(e.to_string()))
}

/// What `Member::start` acquires before Raft starts: everything that can fail fast.
struct Acquired {
    security: Security,
    db: Arc<redb::Database>,
    peer: TcpListener,
    admin: TcpListener,
    metrics: Option<TcpListener>,
    dns: Option<crate::dns::server::Sockets>,
}

/// Raft with its storage and network.
struct Consensus {
    raft: RaftNode,
    state: StateMachineStore,
    counters: Arc<crate::metrics::Counters>,
    pool: Arc<PeerPool>,
    network: PeerNetwork,
    /// Whether the log's disk has room (see [`crate::raft::disk`]).
    disk: DiskHealth,
    /// The data directory's database (the ring version it records).
    db: Arc<redb::Database>,
}

/// The long-running tasks of a member and the switch that stops them.
struct Tasks {
    stop: watch::Sender<bool>,
    stopped: watch::Receiver<bool>,
    /// Each task with what it is, for a shutdown that waits long to say what it waits for.
    handles: Vec<(&'static str, JoinHandle<()>)>,
}

impl Tasks {
    fn new() -> Self {
        let (stop, stopped) = watch::channel(false);
        Self {
            stop,
            stopped,
            handles: Vec::new(),
        }
    }

    fn spawn(
        &mut self,
        name: &'static str,
        task: impl std::future::Future<Output = ()> + Send + 'static,
    ) {
        self.handles.push((name, tokio::spawn(task)));
    }

    fn push(&mut self, name: &'static str, handle: JoinHandle<()>) {
        self.handles.push((name, handle));
    }
}

/// Exit status of a `ringd` that stopped because its Raft storage failed (fail-stop): a
/// supervisor restarts it (systemd's `Restart=on-failure`), and the restart recovers from what
/// is on disk.
pub const EXIT_STORAGE_FAILED: i32 = 4;

/// Fail-stop: when Raft stops on a storage error (a failed write or fsync of the log, a
/// snapshot that cannot be stored) or a panic, the process exits at once with
/// [`EXIT_STORAGE_FAILED`]. Nothing is retried in place: after a failed fsync the kernel may
/// have dropped the pages it could not write, and a retry could succeed without them and
/// acknowledge what is not on disk. The flusher acknowledges nothing after its first failure,
/// so exiting loses nothing acknowledged; running on without Raft would only leave a member
/// that answers but never acts.
async fn fail_stop(raft: RaftNode, mut stopped: watch::Receiver<bool>) {
    use openraft::errors::Fatal;
    use openraft::type_config::async_runtime::watch::WatchReceiver;
    let mut metrics = raft.metrics();
    loop {
        let fatal = match &metrics.borrow_watched().running_state {
            Err(Fatal::Stopped) | Ok(()) => None,
            Err(fatal) => Some(fatal.to_string()),
        };
        if let Some(fatal) = fatal {
            tracing::error!(
                "Raft stopped: {fatal}. Exiting (fail-stop, status {EXIT_STORAGE_FAILED}): a failed \
                 write or fsync is never retried in place; a restart recovers from what is on disk"
            );
            std::process::exit(EXIT_STORAGE_FAILED);
        }
        let core_gone = tokio::select! {
            changed = metrics.changed() => changed.is_err(),
            _ = stopped.wait_for(|s| *s) => return,
        };
        if core_gone {
            // Raft's core is gone without saying why (a panic can end it before it reports):
            // the same fail-stop, unless this member is shutting down.
            if *stopped.borrow() {
                return;
            }
            tracing::error!(
                "Raft's core ended unexpectedly. Exiting (fail-stop, status \
                     {EXIT_STORAGE_FAILED}): a restart recovers from what is on disk"
            );
            std::process::exit(EXIT_STORAGE_FAILED);
        }
    }
}

impl Member {
    /// Starts a member from a validated configuration, in named steps: [`security`] and
    /// [`Acquired::acquire`] (fail fast: the data directory and every address; nothing runs yet), [`Consensus::open`] (storage, Raft),
    /// [`form_or_join`], then the background tasks, the servers, the duties, the agent, metrics
    /// and DNS.
    pub async fn start(config: Config) -> Result<Self, StartError> {
        config.validate()?;
        let dns_publisher = crate::dns::publisher(&config.dns).map_err(StartError::DnsKey)?;
        let id = config.id;
        let acquired = Acquired::acquire(&config, security(&config)?).await?;
        let consensus = Consensus::open(&config, &acquired).await?;
        form_or_join(&config, &consensus).await?;

        let Acquired {
            security,
            db: _,
            peer: peer_listener,
            admin: admin_listener,
            metrics: metrics_listener,
            dns: dns_sockets,
        } = acquired;
        let mut tasks = Tasks::new();
        start_maintenance(&config, &security, &consensus, &mut tasks);
        let Consensus {
            raft,
            state,
            counters,
            pool,
            network,
            disk,
            db: _,
        } = consensus;
        tasks.spawn("fail-stop", fail_stop(raft.clone(), tasks.stopped.clone()));
        let contact = LeaderContact::default();
        let seen = SeenCertificates::default();
        let policy = Policy::new(
            &config.timing,
            config.placement.min_move_interval_ms,
            config.placement.capacity,
        )
        .with_etcd_replace_after_ms(config.placement.etcd_replace_after_ms);
        let reports = Arc::new(crate::upgrade::Reports::default());
        let desk = Arc::new(
            LeaseDesk::new(
                id,
                raft.clone(),
                state.clone(),
                policy.clone(),
                reports.clone(),
                pool.diverged().clone(),
            )
            .with_restarts(crate::leases::RestartPolicy {
                lease_ms: config.timing.restart_lease_ms(),
                grace_ms: config.timing.restart_grace_ms(),
            }),
        );
        let renewals = desk.renewals();
        let membership = MembershipChanger::new(raft.clone());
        let workloads = Workloads::from_config(&config)?;
        let snapshot_times = workloads.snapshot_times();
        let backup_statuses = workloads.backup_statuses();
        let keeper = Keeper::new(
            id,
            raft.clone(),
            state.clone(),
            KeeperSettings {
                ttl_s: config.dns.ttl_s,
                provider: config.dns.provider.as_str().into(),
                servers: config.dns.servers_to_verify(),
                reconcile_every: std::time::Duration::from_millis(config.dns.reconcile_interval_ms),
                timeout: std::time::Duration::from_millis(config.dns.timeout_ms),
            },
            dns_publisher,
        );
        let admin = Arc::new(
            AdminService::new(
                id,
                raft.clone(),
                membership.clone(),
                state.clone(),
                config.timing.clone(),
                Transport {
                    pool: pool.clone(),
                    tls: security.store().cloned(),
                    seen: seen.clone(),
                    contact: contact.clone(),
                },
                policy,
            )
            .with_dns(config.dns.ttl_s, keeper.status())
            .with_disk(disk.clone())
            .with_limits(config.admin.clone())
            .with_upgrade(crate::admin::upgrade::Upgrade {
                reports: reports.clone(),
                finalize: config.upgrade.finalize,
                fresh: std::time::Duration::from_millis(
                    config.timing.lease_ms * crate::upgrade::FRESH_LEASES,
                ),
            }),
        );
        let peer = PeerService::new(
            id,
            raft.clone(),
            state.clone(),
            contact.clone(),
            seen,
            Handlers {
                forward: admin.clone(),
                renew: desk.clone(),
            },
        )
        .with_divergence(pool.own_divergence().clone());
        let listeners = (peer_listener, admin_listener);
        let health = serve_ports(&security, listeners, peer, &admin, &mut tasks)?;

        tasks.spawn(
            "duties",
            duties::run(
                duties::Duties::new(
                    id,
                    &config.name,
                    config.timing.clone(),
                    config.dns.zone.clone(),
                    duties::Parts {
                        raft: raft.clone(),
                        membership,
                        state: state.clone(),
                        network: network.clone(),
                        contact: contact.clone(),
                        desk: desk.clone(),
                        finalize: config.upgrade.finalize,
                    },
                ),
                tasks.stopped.clone(),
            ),
        );
        let agent = Agent::new(
            id,
            &config.name,
            raft.clone(),
            state.clone(),
            network,
            desk,
            workloads,
            config.timing.clone(),
            contact.clone(),
        );
        tasks.spawn(
            "health reports",
            introspection::report_health(
                health,
                raft.clone(),
                agent.own_lease(),
                disk.clone(),
                tasks.stopped.clone(),
            ),
        );
        if let Some(listener) = metrics_listener {
            tracing::info!(address = ?config.metrics.listen, "metrics endpoint listening (/metrics, /healthz, /readyz)");
            tasks.push(
                "metrics",
                crate::metrics::serve(
                    listener,
                    crate::metrics::Sources {
                        raft: raft.clone(),
                        state: state.clone(),
                        own: agent.own_lease(),
                        counters,
                        renewals,
                        dns_propagation: keeper.propagation(),
                        snapshots: snapshot_times,
                        backups: backup_statuses,
                        disk,
                        tls: security.store().cloned(),
                        contact: contact.clone(),
                        diverged: pool.diverged().clone(),
                        upgrade: reports.clone(),
                        mixed_alert_after_ms: config.upgrade.mixed_alert_after_ms,
                    },
                    tasks.stopped.clone(),
                ),
            );
        }
        if let Some(sockets) = dns_sockets {
            let (zone, feeder) =
                crate::dns::server::feed(state.clone(), config.dns.ttl_s, tasks.stopped.clone());
            tasks.push("dns feeder", feeder);
            tasks.push(
                "dns server",
                sockets.serve(zone, agent.own_lease(), tasks.stopped.clone()),
            );
        }
        tasks.spawn(
            "dns keeper",
            crate::dns::keeper::run(keeper, tasks.stopped.clone()),
        );
        tasks.spawn("agent", agent::run(agent, tasks.stopped.clone()));
        Ok(Self {
            id,
            raft,
            state,
            removed: pool.watch_removed(),
            stop: tasks.stop,
            tasks: tasks.handles,
        })
    }

    /// Resolves with the peer's message once a peer reports that this member was removed from
    /// the ring (its id retired). A removed member cannot rejoin under the same id.
    pub async fn removed(&self) -> String {
        let mut rx = self.removed.clone();
        match rx.wait_for(Option::is_some).await {
            Ok(msg) => msg.clone().unwrap_or_default(),
            // The pool lives as long as the member, so this only happens during shutdown.
            Err(_) => std::future::pending().await,
        }
    }

    /// Stops the servers and Raft, and waits for them.
    pub async fn shutdown(self) {
        let _ = self.stop.send(true);
        for (name, mut task) in self.tasks {
            // A shutdown that hangs says on what (every SHUTDOWN_REPORT_MS), rather than
            // leaving a supervisor's SIGKILL as the only clue.
            loop {
                let wait = std::time::Duration::from_millis(SHUTDOWN_REPORT_MS);
                match tokio::time::timeout(wait, &mut task).await {
                    Ok(_) => break,
                    Err(_) => tracing::warn!("shutting down: still waiting for the {name} task"),
                }
            }
        }
        let raft = self.raft.shutdown();
        tokio::pin!(raft);
        loop {
            let wait = std::time::Duration::from_millis(SHUTDOWN_REPORT_MS);
            match tokio::time::timeout(wait, &mut raft).await {
                Ok(Ok(())) => break,
                Ok(Err(e)) => {
                    tracing::warn!("raft did not shut down cleanly: {e}");
                    break;
                }
                Err(_) => tracing::warn!("shutting down: still waiting for raft"),
            }
        }
    }
}

/// How often a shutdown that waits for a task says which, ms.
const SHUTDOWN_REPORT_MS: u64 = 2_000;
/// After a shutdown begins, how long the gRPC servers wait for open connections to close before
/// dropping them, in milliseconds.
pub const SERVER_DRAIN_MS: u64 = 500;
/// Most concurrent gRPC calls on one connection (HTTP/2 streams); more wait.
pub const MAX_STREAMS_PER_CONNECTION: u32 = 256;
/// Largest request header list accepted, in bytes.
pub const MAX_HEADER_LIST_BYTES: u32 = 16 * 1024;

/// The member's transport security: its certificate store, or none (with a warning).
fn security(config: &Config) -> Result<Security, StartError> {
    Ok(match &config.tls {
        Some(tls) => {
            let me = Identity::new(Role::Member, &config.name).map_err(|e| TlsError::Identity {
                path: tls.files.cert_file.clone(),
                source: e,
            })?;
            Security::Tls(TlsStore::load(tls.files.clone(), Some(me))?)
        }
        None => {
            tracing::warn!(
                "running WITHOUT TLS (insecure = true): anyone who can reach the peer and admin \
                 ports can change the ring; use this only on one machine or a lab network"
            );
            Security::Insecure
        }
    })
}

impl Acquired {
    /// Opens (and locks) the data directory, then binds every listening address (peer,
    /// Admin, metrics, the builtin DNS server).
    async fn acquire(config: &Config, security: Security) -> Result<Self, StartError> {
        let db = storage::open(&config.data_dir, config.id)?;
        let peer = bind("peer", config.listen_peer).await?;
        let admin = bind("admin", config.listen_admin).await?;
        let metrics = match config.metrics.listen {
            Some(address) => Some(bind("metrics", address).await?),
            None => None,
        };
        let dns = match (config.dns.provider, config.dns.listen) {
            (DnsProvider::Builtin, Some(listen)) => Some(
                crate::dns::server::Sockets::bind(listen)
                    .await
                    .map_err(StartError::Dns)?,
            ),
            _ => None,
        };
        Ok(Self {
            security,
            db,
            peer,
            admin,
            metrics,
            dns,
        })
    }
}

impl Consensus {
    /// Opens the log store and the state machine in the data directory and starts Raft on them.
    async fn open(config: &Config, acquired: &Acquired) -> Result<Self, StartError> {
        let id = config.id;
        let db = acquired.db.clone();
        let log_store = LogStore::new(db.clone(), &config.data_dir)
            .map_err(|e| StartError::Raft(format!("cannot start the log store: {e}")))?;
        let disk = log_store.disk_health();
        let counters = Arc::new(crate::metrics::Counters::default());
        let state = StateMachineStore::open(db.clone())
            .await
            .map_err(|e| StartError::Raft(format!("cannot load the state machine: {e}")))?
            .with_observer(counters.clone());
        let pool = Arc::new(PeerPool::new(acquired.security.clone()));
        // Requests carry this member's ring generation from before the first one is sent.
        pool.set_generation(state.read(|a| a.state.generation()));
        pool.set_codec(state.read(|a| a.state.settings.ring_version.active));
        let network = PeerNetwork::new(id, pool.clone());
        let raft = RaftNode::new(
            id,
            Arc::new(raft_config(config)?),
            network.clone(),
            log_store,
            state.clone(),
        )
        .await
        .map_err(|e| StartError::Raft(e.to_string()))?;
        Ok(Self {
            raft,
            state,
            counters,
            pool,
            network,
            disk,
            db: acquired.db.clone(),
        })
    }
}

/// A member with an empty data directory forms the ring with the other founders, follows a
/// ring they formed, or waits to be added; one with data resumes.
async fn form_or_join(config: &Config, consensus: &Consensus) -> Result<(), StartError> {
    let raft = &consensus.raft;
    let initialized = raft
        .is_initialized()
        .await
        .map_err(|e| StartError::Raft(e.to_string()))?;
    if !initialized && !config.initial_members.is_empty() {
        match founder_start(config, &consensus.network).await {
            Ok(FounderStart::Initialize) => {
                let nodes: BTreeMap<NodeId, MemberNode> = config
                    .initial_members
                    .iter()
                    .map(|m| (m.id, MemberNode::from(&MemberSpec::from(m))))
                    .collect();
                // Every founding member initializes with the same membership (openraft
                // elects one leader); one that finds the ring formed follows it instead.
                match raft.initialize(nodes).await {
                    Ok(()) => {
                        tracing::info!(members = config.initial_members.len(), "forming the ring")
                    }
                    Err(e) => tracing::info!("not initializing: {e}"),
                }
            }
            Ok(FounderStart::Follow) => {
                tracing::info!("the ring is formed already; following it as a founding member")
            }
            Err(e) => {
                let _ = raft.shutdown().await;
                return Err(e);
            }
        }
    } else if !initialized {
        let spec = config.member_spec();
        tracing::info!(
            "no ring in {} and no initial_members: waiting to be added; run \
             `ringctl member add --id {} --name {} --zone {} --address {} --admin-address {}` against the ring",
            config.data_dir.display(),
            spec.id,
            spec.name,
            spec.zone,
            spec.address,
            spec.admin_address
        );
    } else {
        tracing::info!("resuming the ring from {}", config.data_dir.display());
    }
    Ok(())
}

/// The background upkeep: the ring generation the peer pool sends, and the reload of the TLS
/// files (with reconnects to peers when they change).
fn start_maintenance(
    config: &Config,
    security: &Security,
    consensus: &Consensus,
    tasks: &mut Tasks,
) {
    tasks.spawn(
        "generation",
        keep_generation(
            consensus.state.clone(),
            consensus.pool.clone(),
            tasks.stopped.clone(),
        ),
    );
    tasks.spawn(
        "ring version",
        crate::upgrade::keep_ring_version(
            consensus.state.clone(),
            consensus.pool.clone(),
            consensus.db.clone(),
            tasks.stopped.clone(),
        ),
    );
    if let Some(store) = security.store() {
        // Before the ports serve: a certificate revoked before a restart stays refused.
        let revocations = store.revocations().clone();
        consensus
            .state
            .read(|a| revocations.set_ring(&a.state.revoked));
        tasks.spawn(
            "revocations",
            follow_revocations(consensus.state.clone(), revocations, tasks.stopped.clone()),
        );
    }
    if let (Some(store), Some(tls)) = (security.store(), &config.tls) {
        tasks.spawn(
            "tls reloader",
            store.clone().run_reloader(
                std::time::Duration::from_millis(tls.reload_interval_ms),
                tasks.stopped.clone(),
            ),
        );
        tasks.spawn(
            "tls reconnects",
            reconnect_on_reload(store.clone(), consensus.pool.clone(), tasks.stopped.clone()),
        );
    }
}

/// Serves the peer port (Raft, forwarding, leases; gRPC health) and the Admin port (the Admin
/// API; gRPC health and reflection). Returns the health reporter both ports share.
fn serve_ports(
    security: &Security,
    (peer_listener, admin_listener): (TcpListener, TcpListener),
    peer: PeerService,
    admin: &Arc<AdminService>,
    tasks: &mut Tasks,
) -> Result<tonic_health::server::HealthReporter, StartError> {
    let peer = peer.into_server();
    // gRPC health on both ports, reflection on the Admin port (see `introspection`).
    let (health, health_server) = tonic_health::server::health_reporter();
    let peer_health = InterceptedService::new(
        health_server.clone(),
        crate::raft::service::admit_members as introspection::Check,
    );
    let admin_health = InterceptedService::new(
        health_server,
        crate::admin::auth::admit_operators as introspection::Check,
    );
    let reflection_v1 = introspection::reflection_v1()?;
    let reflection_v1alpha = introspection::reflection_v1alpha()?;
    tasks.push(
        "peer service",
        serve(
            "peer",
            peer_listener,
            security,
            tasks.stopped.clone(),
            move |mut server| server.add_service(peer).add_service(peer_health),
        ),
    );
    let admin = admin.server();
    tasks.push(
        "admin service",
        serve(
            "admin",
            admin_listener,
            security,
            tasks.stopped.clone(),
            move |mut server| {
                server
                    .add_service(admin)
                    .add_service(admin_health)
                    .add_service(reflection_v1)
                    .add_service(reflection_v1alpha)
            },
        ),
    );
    Ok(health)
}

/// Drops the peer connections whenever new certificates are loaded, so that this member
/// presents them to its peers from then on.
async fn reconnect_on_reload(
    store: Arc<TlsStore>,
    pool: Arc<PeerPool>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut generation = store.watch();
    loop {
        tokio::select! {
            changed = generation.changed() => {
                if changed.is_err() {
                    return;
                }
                pool.reconnect_all();
            }
            _ = stopped.wait_for(|s| *s) => return,
        }
    }
}

fn serve<F>(
    what: &'static str,
    listener: TcpListener,
    security: &Security,
    mut stopped: watch::Receiver<bool>,
    add: F,
) -> JoinHandle<()>
where
    F: FnOnce(tonic::transport::Server) -> tonic::transport::server::Router,
{
    let address = listener.local_addr().ok();
    let router = add(tonic::transport::Server::builder()
        .max_concurrent_streams(MAX_STREAMS_PER_CONNECTION)
        .http2_max_header_list_size(MAX_HEADER_LIST_BYTES));
    let incoming = crate::tls::server::incoming(listener, security.clone(), what);
    tokio::spawn(async move {
        let mut drain_stopped = stopped.clone();
        let shutdown = async move {
            let _ = stopped.wait_for(|s| *s).await;
        };
        tracing::info!(?address, "{what} service listening");
        let served = router.serve_with_incoming_shutdown(incoming, shutdown);
        // A graceful shutdown waits for every open connection to close; a client that keeps an
        // idle connection open would hold ringd's exit forever. Calls in flight get
        // SERVER_DRAIN_MS to finish, then the connections are dropped.
        let drained = async move {
            let _ = drain_stopped.wait_for(|s| *s).await;
            tokio::time::sleep(std::time::Duration::from_millis(SERVER_DRAIN_MS)).await;
        };
        tokio::select! {
            result = served => {
                if let Err(e) = result {
                    tracing::error!(?address, "{what} service failed: {e}");
                }
            }
            () = drained => tracing::info!(
                ?address,
                "{what} service: connections still open {SERVER_DRAIN_MS} ms after shutdown began; closed them"
            ),
        }
    })
}

/// Hands every change of the ring's revoked certificates to the TLS layer as soon as it is
/// applied (a snapshot installed counts): from then on this member refuses them on both ports
/// and cuts the connections that presented them.
async fn follow_revocations(
    state: StateMachineStore,
    revocations: Arc<crate::tls::revocation::Revocations>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut applied = state.watch_applied();
    loop {
        state.read(|a| revocations.set_ring(&a.state.revoked));
        tokio::select! {
            changed = applied.changed() => if changed.is_err() { return },
            _ = stopped.wait_for(|s| *s) => return,
        }
    }
}

/// Keeps the ring generation the peer requests carry equal to the applied state's until it is
/// known: it goes from 0 once, when the founders are registered or a first snapshot arrives,
/// and never changes while `ringd` runs after that (a recovery is applied offline, and a peer
/// of another generation is refused before its snapshot could be installed). So this watches
/// the applied index only while the generation is 0.
async fn keep_generation(
    state: StateMachineStore,
    pool: Arc<PeerPool>,
    mut stopped: watch::Receiver<bool>,
) {
    let mut applied = state.watch_applied();
    loop {
        let generation = state.read(|a| a.state.generation());
        pool.set_generation(generation);
        if generation != 0 {
            return;
        }
        tokio::select! {
            changed = applied.changed() => if changed.is_err() { return },
            _ = stopped.wait_for(|s| *s) => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::openraft_heartbeat_interval_ms;

    #[test]
    fn openraft_heartbeats_come_within_heartbeat_ms() {
        assert_eq!(openraft_heartbeat_interval_ms(50), 38);
        assert_eq!(openraft_heartbeat_interval_ms(250), 187);
        for heartbeat_ms in 1..=10_000 {
            let interval = openraft_heartbeat_interval_ms(heartbeat_ms);
            assert!(interval >= 1, "{heartbeat_ms}");
            let worst = |i: u64| i + (i * 13 / 64).max(1);
            if heartbeat_ms >= 3 {
                let budget = heartbeat_ms * 9 / 10;
                assert!(worst(interval) <= budget, "{heartbeat_ms}: {interval}");
                // The longest such interval: no more heartbeats than needed.
                assert!(worst(interval + 1) > budget, "{heartbeat_ms}: {interval}");
            }
        }
        // No overflow (the configuration refuses such timings, but this must not panic).
        assert!(openraft_heartbeat_interval_ms(u64::MAX) > u64::MAX / 2);
    }
}
