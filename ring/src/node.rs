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
use tokio_stream::wrappers::TcpListenerStream;

use crate::admin::AdminService;
use crate::config::{Config, ConfigError};
use crate::duties;
use crate::membership::MembershipChanger;
use crate::raft::network::{PeerNetwork, PeerPool};
use crate::raft::service::PeerService;
use crate::raft::storage::{self, OpenError};
use crate::raft::{LogStore, MemberNode, NodeId, RaftNode, StateMachineStore};

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
    /// Raft could not be started.
    #[error("cannot start raft: {0}")]
    Raft(String),
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
    tasks: Vec<JoinHandle<()>>,
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

/// openraft's configuration from ours.
pub fn raft_config(config: &Config) -> Result<openraft::Config, StartError> {
    let t = &config.timing;
    openraft::Config {
        cluster_name: "garden-ring".into(),
        heartbeat_interval: t.heartbeat_ms,
        election_timeout_min: t.election_timeout_min_ms,
        election_timeout_max: t.election_timeout_max_ms,
        snapshot_policy: SnapshotPolicy::LogsSinceLast(config.snapshot.every_entries),
        max_in_snapshot_log_to_keep: config.snapshot.keep_entries,
        enable_pre_vote: Some(true),
        ..Default::default()
    }
    .validate()
    .map_err(|e| StartError::Raft(e.to_string()))
}

impl Member {
    /// Starts a member from a validated configuration.
    pub async fn start(config: Config) -> Result<Self, StartError> {
        config.validate()?;
        let id = config.id;
        let db = storage::open(&config.data_dir, id)?;
        let peer_listener = bind("peer", config.listen_peer).await?;
        let admin_listener = bind("admin", config.listen_admin).await?;

        let log_store = LogStore::new(db.clone());
        let state = StateMachineStore::open(db)
            .await
            .map_err(|e| StartError::Raft(format!("cannot load the state machine: {e}")))?;
        let pool = Arc::new(PeerPool::default());
        let network = PeerNetwork::new(id, pool.clone());
        let raft = RaftNode::new(
            id,
            Arc::new(raft_config(&config)?),
            network,
            log_store,
            state.clone(),
        )
        .await
        .map_err(|e| StartError::Raft(e.to_string()))?;

        let (stop, stopped) = watch::channel(false);
        let mut tasks = Vec::new();
        let peer = PeerService::new(id, raft.clone(), state.clone()).into_server();
        tasks.push(serve(
            "peer",
            peer_listener,
            stopped.clone(),
            move |mut server| server.add_service(peer),
        ));
        let membership = MembershipChanger::new(raft.clone());
        let admin = AdminService::new(
            id,
            raft.clone(),
            membership.clone(),
            state.clone(),
            config.timing.clone(),
        )
        .into_server();
        tasks.push(serve(
            "admin",
            admin_listener,
            stopped.clone(),
            move |mut server| server.add_service(admin),
        ));

        let initialized = raft
            .is_initialized()
            .await
            .map_err(|e| StartError::Raft(e.to_string()))?;
        if !initialized {
            if config.initial_members.is_empty() {
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
                let nodes: BTreeMap<NodeId, MemberNode> = config
                    .initial_members
                    .iter()
                    .map(|m| {
                        (
                            m.id,
                            MemberNode {
                                name: m.name.clone(),
                                zone: m.zone.clone(),
                                address: m.address.clone(),
                                admin_address: m.admin_address.clone(),
                            },
                        )
                    })
                    .collect();
                // Every founding member initializes with the same membership; openraft elects one
                // leader. A member that finds the ring formed already just follows it.
                match raft.initialize(nodes).await {
                    Ok(()) => {
                        tracing::info!(members = config.initial_members.len(), "forming the ring")
                    }
                    Err(e) => tracing::info!("not initializing: {e}"),
                }
            }
        } else {
            tracing::info!("resuming the ring from {}", config.data_dir.display());
        }

        tasks.push(tokio::spawn(duties::run(
            duties::Duties::new(
                id,
                config.name.clone(),
                raft.clone(),
                membership,
                state.clone(),
                config.timing.clone(),
            ),
            stopped,
        )));
        Ok(Self {
            id,
            raft,
            state,
            removed: pool.watch_removed(),
            stop,
            tasks,
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
        for task in self.tasks {
            let _ = task.await;
        }
        if let Err(e) = self.raft.shutdown().await {
            tracing::warn!("raft did not shut down cleanly: {e}");
        }
    }
}

fn serve<F>(
    what: &'static str,
    listener: TcpListener,
    mut stopped: watch::Receiver<bool>,
    add: F,
) -> JoinHandle<()>
where
    F: FnOnce(tonic::transport::Server) -> tonic::transport::server::Router,
{
    let address = listener.local_addr().ok();
    let router = add(tonic::transport::Server::builder().tcp_nodelay(true));
    tokio::spawn(async move {
        let incoming = TcpListenerStream::new(listener);
        let shutdown = async move {
            let _ = stopped.wait_for(|s| *s).await;
        };
        tracing::info!(?address, "{what} service listening");
        if let Err(e) = router
            .serve_with_incoming_shutdown(incoming, shutdown)
            .await
        {
            tracing::error!(?address, "{what} service failed: {e}");
        }
    })
}
