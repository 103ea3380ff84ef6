//! A small client for the parts of etcd's v3 gRPC API the backups need: `Status` (health, the
//! store's revision), the `Snapshot` stream (full snapshots), `Watch` (the events of delta
//! snapshots), `Txn` (replaying them), and `Put`, `Range`, `DeleteRange` and `Compact` (health
//! checks and tests).
//!
//! It speaks plain HTTP/2 to one endpoint (`http://127.0.0.1:2379`): the etcd it talks to is
//! the hosted control plane's, run by this member on loopback. **TLS to etcd is not supported
//! yet**; an `https://` endpoint is refused with [`EtcdError::BadEndpoint`].
//!
//! Every unary call is bounded by [`EtcdClientOptions::request_timeout_ms`]; the snapshot
//! stream by [`EtcdClientOptions::snapshot_idle_timeout_ms`] between two messages (a whole
//! snapshot of a large database takes long, a stalled one must not hang forever). Errors say
//! whether trying again can help ([`EtcdError::is_retryable`]).

use std::time::Duration;

use bytes::Bytes;
use tonic::transport::{Channel, Endpoint};

use crate::etcdpb;
use crate::etcdpb::cluster_client::ClusterClient;
use crate::etcdpb::kv_client::KvClient;
use crate::etcdpb::maintenance_client::MaintenanceClient;
use crate::etcdpb::watch_client::WatchClient;

/// Longest endpoint accepted, in bytes.
pub const MAX_ENDPOINT_LEN: usize = 256;
/// Largest gRPC message accepted from etcd, in bytes. etcd sends snapshot chunks of 32 KiB and
/// caps its own requests at 1.5 MiB by default; 16 MiB leaves room for large `Range` answers.
pub const MAX_MESSAGE_BYTES: usize = 16 * 1024 * 1024;
/// Most keys one [`EtcdClient::get_prefix`] returns.
pub const MAX_RANGE_KEYS: i64 = 100_000;
/// Most requests in one transaction ([`EtcdClient::txn`]); etcd's own default
/// (`--max-txn-ops`) is 128, and a replayed revision holds as many writes as the transaction
/// that made it.
pub const MAX_TXN_OPS: usize = 128;

/// How patient the client is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct EtcdClientOptions {
    /// Connecting (TCP and HTTP/2), in ms.
    pub connect_timeout_ms: u64,
    /// One unary call, in ms.
    pub request_timeout_ms: u64,
    /// Longest wait for the next message of the snapshot stream, in ms.
    pub snapshot_idle_timeout_ms: u64,
}

impl Default for EtcdClientOptions {
    fn default() -> Self {
        Self {
            connect_timeout_ms: 2_000,
            request_timeout_ms: 5_000,
            snapshot_idle_timeout_ms: 30_000,
        }
    }
}

/// Why a call to etcd failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum EtcdError {
    /// The endpoint cannot be used at all (fatal).
    #[error("etcd endpoint {endpoint:?} is not usable: {why}")]
    BadEndpoint {
        /// The endpoint (shortened).
        endpoint: String,
        /// What is wrong with it.
        why: String,
    },
    /// etcd could not be reached: not running (yet), or the connection broke (retryable).
    #[error("cannot reach etcd at {endpoint} ({what}): {why}")]
    Unavailable {
        /// The endpoint.
        endpoint: String,
        /// The call.
        what: &'static str,
        /// The transport's complaint.
        why: String,
    },
    /// etcd did not answer in time (retryable).
    #[error("etcd at {endpoint} did not answer {what} within {timeout_ms} ms")]
    Timeout {
        /// The endpoint.
        endpoint: String,
        /// The call.
        what: &'static str,
        /// The limit that passed.
        timeout_ms: u64,
    },
    /// etcd answered with a gRPC error; retryable when the code says so (unavailable, deadline,
    /// resource exhausted, aborted, unknown).
    #[error("etcd at {endpoint} refused {what}: {code:?}: {message}")]
    Status {
        /// The endpoint.
        endpoint: String,
        /// The call.
        what: &'static str,
        /// The gRPC code.
        code: tonic::Code,
        /// etcd's message.
        message: String,
    },
    /// etcd answered something this client does not understand (fatal).
    #[error("etcd at {endpoint} answered {what} unexpectedly: {why}")]
    Protocol {
        /// The endpoint.
        endpoint: String,
        /// The call.
        what: &'static str,
        /// What was wrong.
        why: String,
    },
}

impl EtcdError {
    /// Whether the same call may succeed later (etcd starting, a leader election, a blip).
    pub fn is_retryable(&self) -> bool {
        match self {
            EtcdError::Unavailable { .. } | EtcdError::Timeout { .. } => true,
            EtcdError::Status { code, .. } => matches!(
                code,
                tonic::Code::Unavailable
                    | tonic::Code::DeadlineExceeded
                    | tonic::Code::ResourceExhausted
                    | tonic::Code::Aborted
                    | tonic::Code::Unknown
                    | tonic::Code::Cancelled
            ),
            EtcdError::BadEndpoint { .. } | EtcdError::Protocol { .. } => false,
        }
    }
}

/// What `Status` says about the answering member.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdStatus {
    /// The server's version, e.g. `3.4.23`.
    pub version: String,
    /// The backend database's size, in bytes.
    pub db_size_bytes: u64,
    /// The bytes of it in use (the rest a defragmentation gives back).
    pub db_size_in_use_bytes: u64,
    /// The alarms raised (e.g. `NOSPACE` past the quota).
    pub alarms: Vec<String>,
    /// The leader's member id as this member knows it, 0 when it knows none.
    pub leader: u64,
    /// This member's id.
    pub member_id: u64,
    /// The key-value store's revision.
    pub revision: u64,
    /// Raft index.
    pub raft_index: u64,
    /// Raft term.
    pub raft_term: u64,
}

/// One key as etcd stores it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyValue {
    /// The key.
    pub key: Vec<u8>,
    /// The value.
    pub value: Vec<u8>,
    /// The revision of its latest creation.
    pub create_revision: u64,
    /// The revision of its latest change.
    pub mod_revision: u64,
}

/// One write inside a transaction ([`EtcdClient::txn`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum TxnOp {
    /// Put `key` = `value`.
    Put {
        /// The key.
        key: Vec<u8>,
        /// The value.
        value: Vec<u8>,
    },
    /// Delete `key`.
    Delete {
        /// The key.
        key: Vec<u8>,
    },
}

/// What happened to a key, as a watch reports it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    /// Written.
    Put,
    /// Deleted.
    Delete,
}

/// One change a watch delivered.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WatchEvent {
    /// Put or delete.
    pub kind: EventKind,
    /// The key after the change (a delete carries only the key and its `mod_revision`).
    pub kv: KeyValueFull,
}

/// A key as etcd stores it, every field (what a delta snapshot records).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct KeyValueFull {
    /// The key.
    pub key: Vec<u8>,
    /// The revision of its latest creation (0 for a delete).
    pub create_revision: i64,
    /// The revision of this change.
    pub mod_revision: i64,
    /// How often it changed since its creation (0 for a delete).
    pub version: i64,
    /// The value (empty for a delete).
    pub value: Vec<u8>,
    /// Its lease, 0 for none.
    pub lease: i64,
}

/// What a watch stream delivered next.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WatchMessage {
    /// Events, in revision order, and the store's revision when they were sent.
    Events {
        /// The events (none in a progress notification).
        events: Vec<WatchEvent>,
        /// The header's revision: every change up to it has been delivered once a response
        /// without `fragment` arrives (for a progress notification, exactly that).
        revision: u64,
    },
    /// The history asked for is compacted: events from `compact_revision` on are all the store
    /// still has. The watcher ended.
    Compacted {
        /// The oldest revision still available.
        compact_revision: u64,
    },
    /// The server ended the watcher.
    Canceled {
        /// Its reason.
        reason: String,
    },
}

/// A watch on every key from one revision on ([`EtcdClient::watch_all`]).
pub struct WatchStream {
    requests: tokio::sync::mpsc::Sender<etcdpb::WatchRequest>,
    inner: tonic::Streaming<etcdpb::WatchResponse>,
    endpoint: String,
}

impl std::fmt::Debug for WatchStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("WatchStream")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl WatchStream {
    /// The next message. Waits as long as it takes (events come when clients write); an ended
    /// stream is [`EtcdError::Unavailable`].
    pub async fn next(&mut self) -> Result<WatchMessage, EtcdError> {
        let what = "Watch";
        loop {
            let message = self
                .inner
                .message()
                .await
                .map_err(|s| status_error(&self.endpoint, what, s))?
                .ok_or_else(|| EtcdError::Unavailable {
                    endpoint: self.endpoint.clone(),
                    what,
                    why: "the watch stream ended".into(),
                })?;
            if message.compact_revision > 0 {
                return Ok(WatchMessage::Compacted {
                    compact_revision: u64::try_from(message.compact_revision).unwrap_or(0),
                });
            }
            if message.canceled {
                return Ok(WatchMessage::Canceled {
                    reason: message.cancel_reason,
                });
            }
            if message.created && message.events.is_empty() {
                continue;
            }
            let revision = u64::try_from(message.header.unwrap_or_default().revision).unwrap_or(0);
            let events = message
                .events
                .into_iter()
                .map(|e| {
                    let kind = if e.r#type == etcdpb::event::EventType::Delete as i32 {
                        EventKind::Delete
                    } else {
                        EventKind::Put
                    };
                    let kv = e.kv.unwrap_or_default();
                    WatchEvent {
                        kind,
                        kv: KeyValueFull {
                            key: kv.key,
                            create_revision: kv.create_revision,
                            mod_revision: kv.mod_revision,
                            version: kv.version,
                            value: kv.value,
                            lease: kv.lease,
                        },
                    }
                })
                .collect();
            return Ok(WatchMessage::Events { events, revision });
        }
    }

    /// Asks the server for a progress notification: an [`WatchMessage::Events`] without events
    /// whose revision says how far the watch has delivered (etcd 3.4+).
    pub async fn request_progress(&self) -> Result<(), EtcdError> {
        self.requests
            .send(etcdpb::WatchRequest {
                request_union: Some(etcdpb::watch_request::RequestUnion::ProgressRequest(
                    etcdpb::WatchProgressRequest {},
                )),
            })
            .await
            .map_err(|_| EtcdError::Unavailable {
                endpoint: self.endpoint.clone(),
                what: "Watch",
                why: "the watch stream is closed".into(),
            })
    }
}

/// One message of the snapshot stream.
#[derive(Debug, Clone)]
pub struct SnapshotChunk {
    /// The store's revision in this message's header, when the server fills it (etcd 3.6 and
    /// later: "the first header in the snapshot stream indicates the point in time of the
    /// snapshot"; 3.4 sends none).
    pub header_revision: Option<u64>,
    /// Snapshot bytes still to come after this message.
    pub remaining_bytes: u64,
    /// The next bytes of the snapshot (the last message carries the sha256 trailer).
    pub blob: Bytes,
}

/// The `Maintenance.Snapshot` stream: the backend database, then its sha256.
pub struct SnapshotStream {
    inner: tonic::Streaming<etcdpb::SnapshotResponse>,
    endpoint: String,
    idle_timeout_ms: u64,
}

impl std::fmt::Debug for SnapshotStream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SnapshotStream")
            .field("endpoint", &self.endpoint)
            .finish_non_exhaustive()
    }
}

impl SnapshotStream {
    /// The next message, `None` at the end. Waits at most the idle timeout.
    pub async fn next_chunk(&mut self) -> Result<Option<SnapshotChunk>, EtcdError> {
        let what = "Snapshot";
        let message = tokio::time::timeout(
            Duration::from_millis(self.idle_timeout_ms),
            self.inner.message(),
        )
        .await
        .map_err(|_| EtcdError::Timeout {
            endpoint: self.endpoint.clone(),
            what,
            timeout_ms: self.idle_timeout_ms,
        })?
        .map_err(|s| status_error(&self.endpoint, what, s))?;
        Ok(message.map(|m| SnapshotChunk {
            header_revision: m
                .header
                .and_then(|h| u64::try_from(h.revision).ok())
                .filter(|r| *r > 0),
            remaining_bytes: m.remaining_bytes,
            blob: Bytes::from(m.blob),
        }))
    }
}

/// A client for one etcd member.
#[derive(Debug, Clone)]
pub struct EtcdClient {
    endpoint: String,
    options: EtcdClientOptions,
    kv: KvClient<Channel>,
    maintenance: MaintenanceClient<Channel>,
    watch: WatchClient<Channel>,
    cluster: ClusterClient<Channel>,
}

/// A member of an etcd cluster, as its membership API lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EtcdMember {
    /// Its id.
    pub id: u64,
    /// Its name; empty until it started.
    pub name: String,
    /// Where its peers reach it.
    pub peer_urls: Vec<String>,
    /// Whether it is a learner.
    pub learner: bool,
}

fn convert_member(m: etcdpb::Member) -> EtcdMember {
    EtcdMember {
        id: m.id,
        name: m.name,
        peer_urls: m.peer_ur_ls,
        learner: m.is_learner,
    }
}

impl EtcdClient {
    /// Connects to `endpoint` (`http://host:port`, or `host:port`). Fails with a retryable
    /// [`EtcdError::Unavailable`] when nothing answers there.
    pub async fn connect(endpoint: &str, options: EtcdClientOptions) -> Result<Self, EtcdError> {
        let endpoint = normalize_endpoint(endpoint)?;
        let channel = Endpoint::from_shared(endpoint.clone())
            .map_err(|e| EtcdError::BadEndpoint {
                endpoint: endpoint.clone(),
                why: e.to_string(),
            })?
            .connect_timeout(Duration::from_millis(options.connect_timeout_ms))
            .tcp_nodelay(true);
        let channel = tokio::time::timeout(
            Duration::from_millis(options.connect_timeout_ms),
            channel.connect(),
        )
        .await
        .map_err(|_| EtcdError::Timeout {
            endpoint: endpoint.clone(),
            what: "connect",
            timeout_ms: options.connect_timeout_ms,
        })?
        .map_err(|e| EtcdError::Unavailable {
            endpoint: endpoint.clone(),
            what: "connect",
            why: error_chain(&e),
        })?;
        Ok(Self {
            kv: KvClient::new(channel.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            watch: WatchClient::new(channel.clone())
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            cluster: ClusterClient::new(channel.clone()),
            maintenance: MaintenanceClient::new(channel)
                .max_decoding_message_size(MAX_MESSAGE_BYTES)
                .max_encoding_message_size(MAX_MESSAGE_BYTES),
            endpoint,
            options,
        })
    }

    /// The endpoint, normalized (`http://host:port`).
    pub fn endpoint(&self) -> &str {
        &self.endpoint
    }

    /// The answering member's status.
    pub async fn status(&self) -> Result<EtcdStatus, EtcdError> {
        let mut client = self.maintenance.clone();
        let r = self
            .unary(
                "Status",
                client.status(self.request(etcdpb::StatusRequest::default())),
            )
            .await?;
        let header = r.header.unwrap_or_default();
        Ok(EtcdStatus {
            version: r.version,
            db_size_bytes: u64::try_from(r.db_size).unwrap_or(0),
            db_size_in_use_bytes: u64::try_from(r.db_size_in_use).unwrap_or(0),
            alarms: r.errors,
            leader: r.leader,
            member_id: header.member_id,
            revision: self.revision_of("Status", header.revision)?,
            raft_index: r.raft_index,
            raft_term: r.raft_term,
        })
    }

    /// The cluster's members.
    pub async fn member_list(&self) -> Result<Vec<EtcdMember>, EtcdError> {
        let mut client = self.cluster.clone();
        let r = self
            .unary(
                "MemberList",
                client.member_list(self.request(etcdpb::MemberListRequest { linearizable: true })),
            )
            .await?;
        Ok(r.members.into_iter().map(convert_member).collect())
    }

    /// Adds a member reached at `peer_url` as a learner; returns its id.
    pub async fn member_add_learner(&self, peer_url: &str) -> Result<u64, EtcdError> {
        let mut client = self.cluster.clone();
        let r = self
            .unary(
                "MemberAdd",
                client.member_add(self.request(etcdpb::MemberAddRequest {
                    peer_ur_ls: vec![peer_url.to_string()],
                    is_learner: true,
                })),
            )
            .await?;
        Ok(r.member.map(|m| m.id).unwrap_or_default())
    }

    /// Removes member `id`.
    pub async fn member_remove(&self, id: u64) -> Result<(), EtcdError> {
        let mut client = self.cluster.clone();
        self.unary(
            "MemberRemove",
            client.member_remove(self.request(etcdpb::MemberRemoveRequest { id })),
        )
        .await?;
        Ok(())
    }

    /// Sets the peer URLs of member `id` to `peer_urls`.
    pub async fn member_update(&self, id: u64, peer_urls: &[String]) -> Result<(), EtcdError> {
        let mut client = self.cluster.clone();
        self.unary(
            "MemberUpdate",
            client.member_update(self.request(etcdpb::MemberUpdateRequest {
                id,
                peer_ur_ls: peer_urls.to_vec(),
            })),
        )
        .await?;
        Ok(())
    }

    /// Promotes learner `id`; etcd refuses until it caught up with the leader.
    pub async fn member_promote(&self, id: u64) -> Result<(), EtcdError> {
        let mut client = self.cluster.clone();
        self.unary(
            "MemberPromote",
            client.member_promote(self.request(etcdpb::MemberPromoteRequest { id })),
        )
        .await?;
        Ok(())
    }

    /// Writes `key` = `value`; returns the revision of the write.
    pub async fn put(&self, key: &[u8], value: &[u8]) -> Result<u64, EtcdError> {
        let mut client = self.kv.clone();
        let r = self
            .unary(
                "Put",
                client.put(self.request(etcdpb::PutRequest {
                    key: key.to_vec(),
                    value: value.to_vec(),
                    ..Default::default()
                })),
            )
            .await?;
        self.revision_of("Put", r.header.unwrap_or_default().revision)
    }

    /// Deletes `key`; returns the revision after the call and how many keys were deleted.
    pub async fn delete(&self, key: &[u8]) -> Result<(u64, u64), EtcdError> {
        let mut client = self.kv.clone();
        let r = self
            .unary(
                "DeleteRange",
                client.delete_range(self.request(etcdpb::DeleteRangeRequest {
                    key: key.to_vec(),
                    ..Default::default()
                })),
            )
            .await?;
        let revision = self.revision_of("DeleteRange", r.header.unwrap_or_default().revision)?;
        Ok((revision, u64::try_from(r.deleted).unwrap_or(0)))
    }

    /// Runs `ops` as one transaction (one revision for all its writes); returns the revision
    /// after it. At most [`MAX_TXN_OPS`] operations.
    pub async fn txn(&self, ops: &[TxnOp]) -> Result<u64, EtcdError> {
        if ops.len() > MAX_TXN_OPS {
            return Err(EtcdError::Protocol {
                endpoint: self.endpoint.clone(),
                what: "Txn",
                why: format!("{} operations, more than {MAX_TXN_OPS}", ops.len()),
            });
        }
        use etcdpb::request_op::Request;
        let success = ops
            .iter()
            .map(|op| etcdpb::RequestOp {
                request: Some(match op {
                    TxnOp::Put { key, value } => Request::RequestPut(etcdpb::PutRequest {
                        key: key.clone(),
                        value: value.clone(),
                        ..Default::default()
                    }),
                    TxnOp::Delete { key } => {
                        Request::RequestDeleteRange(etcdpb::DeleteRangeRequest {
                            key: key.clone(),
                            ..Default::default()
                        })
                    }
                }),
            })
            .collect();
        let mut client = self.kv.clone();
        let r = self
            .unary(
                "Txn",
                client.txn(self.request(etcdpb::TxnRequest {
                    success,
                    failure: Vec::new(),
                })),
            )
            .await?;
        if !r.succeeded {
            return Err(EtcdError::Protocol {
                endpoint: self.endpoint.clone(),
                what: "Txn",
                why: "a transaction without comparisons did not succeed".into(),
            });
        }
        self.revision_of("Txn", r.header.unwrap_or_default().revision)
    }

    /// Defragments the answering member's database; it answers nothing else meanwhile. Waits
    /// up to `timeout_ms` (a big database takes long), not the client's request timeout.
    pub async fn defragment(&self, timeout_ms: u64) -> Result<(), EtcdError> {
        let mut client = self.maintenance.clone();
        let call = client.defragment(self.request(etcdpb::DefragmentRequest {}));
        tokio::time::timeout(Duration::from_millis(timeout_ms), call)
            .await
            .map_err(|_| EtcdError::Timeout {
                endpoint: self.endpoint.clone(),
                what: "Defragment",
                timeout_ms,
            })?
            .map_err(|s| status_error(&self.endpoint, "Defragment", s))?;
        Ok(())
    }

    /// Compacts the history before `revision` (tests: a watch behind a compaction).
    pub async fn compact(&self, revision: u64) -> Result<(), EtcdError> {
        let mut client = self.kv.clone();
        self.unary(
            "Compact",
            client.compact(self.request(etcdpb::CompactionRequest {
                revision: i64::try_from(revision).unwrap_or(i64::MAX),
                physical: true,
            })),
        )
        .await?;
        Ok(())
    }

    /// Watches every key from `start_revision` on (history first, then live changes). The
    /// stream has no deadline: it lasts as long as the caller reads it.
    pub async fn watch_all(&self, start_revision: u64) -> Result<WatchStream, EtcdError> {
        let what = "Watch";
        let (requests, rx) = tokio::sync::mpsc::channel(4);
        requests
            .send(etcdpb::WatchRequest {
                request_union: Some(etcdpb::watch_request::RequestUnion::CreateRequest(
                    etcdpb::WatchCreateRequest {
                        key: vec![0],
                        range_end: vec![0],
                        start_revision: i64::try_from(start_revision).unwrap_or(i64::MAX),
                        progress_notify: true,
                        ..Default::default()
                    },
                )),
            })
            .await
            .map_err(|_| EtcdError::Protocol {
                endpoint: self.endpoint.clone(),
                what,
                why: "cannot queue the create request".into(),
            })?;
        let mut client = self.watch.clone();
        let response = tokio::time::timeout(
            Duration::from_millis(self.options.request_timeout_ms),
            client.watch(tokio_stream::wrappers::ReceiverStream::new(rx)),
        )
        .await
        .map_err(|_| self.timeout(what))?
        .map_err(|s| status_error(&self.endpoint, what, s))?;
        Ok(WatchStream {
            requests,
            inner: response.into_inner(),
            endpoint: self.endpoint.clone(),
        })
    }

    /// Reads `key` (a linearizable read).
    pub async fn get(&self, key: &[u8]) -> Result<Option<KeyValue>, EtcdError> {
        let mut client = self.kv.clone();
        let r = self
            .unary(
                "Range",
                client.range(self.request(etcdpb::RangeRequest {
                    key: key.to_vec(),
                    ..Default::default()
                })),
            )
            .await?;
        Ok(r.kvs.into_iter().next().map(convert_kv))
    }

    /// Every key starting with `prefix` (all keys for an empty prefix), sorted by key; refused
    /// as [`EtcdError::Protocol`] when more than [`MAX_RANGE_KEYS`] match.
    pub async fn get_prefix(&self, prefix: &[u8]) -> Result<Vec<KeyValue>, EtcdError> {
        self.range_prefix(prefix, false).await
    }

    /// Like [`EtcdClient::get_prefix`], without the values (empty): for keys whose values
    /// together exceed a response's size limit.
    pub async fn get_prefix_keys(&self, prefix: &[u8]) -> Result<Vec<KeyValue>, EtcdError> {
        self.range_prefix(prefix, true).await
    }

    async fn range_prefix(
        &self,
        prefix: &[u8],
        keys_only: bool,
    ) -> Result<Vec<KeyValue>, EtcdError> {
        let mut client = self.kv.clone();
        let range_end = prefix_end(prefix);
        let r = self
            .unary(
                "Range",
                client.range(self.request(etcdpb::RangeRequest {
                    key: if prefix.is_empty() {
                        vec![0]
                    } else {
                        prefix.to_vec()
                    },
                    range_end,
                    limit: MAX_RANGE_KEYS,
                    keys_only,
                    ..Default::default()
                })),
            )
            .await?;
        if r.more {
            return Err(EtcdError::Protocol {
                endpoint: self.endpoint.clone(),
                what: "Range",
                why: format!("more than {MAX_RANGE_KEYS} keys match; read a narrower prefix"),
            });
        }
        Ok(r.kvs.into_iter().map(convert_kv).collect())
    }

    /// The key-value store's current revision.
    pub async fn revision(&self) -> Result<u64, EtcdError> {
        Ok(self.status().await?.revision)
    }

    /// Opens the snapshot stream.
    pub async fn snapshot_stream(&self) -> Result<SnapshotStream, EtcdError> {
        let mut client = self.maintenance.clone();
        let what = "Snapshot";
        // No grpc-timeout on the stream: it takes as long as the database is large; every
        // message is bounded by the idle timeout instead.
        let response = tokio::time::timeout(
            Duration::from_millis(self.options.request_timeout_ms),
            client.snapshot(etcdpb::SnapshotRequest {}),
        )
        .await
        .map_err(|_| self.timeout(what))?
        .map_err(|s| status_error(&self.endpoint, what, s))?;
        Ok(SnapshotStream {
            inner: response.into_inner(),
            endpoint: self.endpoint.clone(),
            idle_timeout_ms: self.options.snapshot_idle_timeout_ms,
        })
    }

    fn request<T>(&self, message: T) -> tonic::Request<T> {
        let mut request = tonic::Request::new(message);
        request.set_timeout(Duration::from_millis(self.options.request_timeout_ms));
        request
    }

    async fn unary<T>(
        &self,
        what: &'static str,
        call: impl Future<Output = Result<tonic::Response<T>, tonic::Status>>,
    ) -> Result<T, EtcdError> {
        tokio::time::timeout(Duration::from_millis(self.options.request_timeout_ms), call)
            .await
            .map_err(|_| self.timeout(what))?
            .map(tonic::Response::into_inner)
            .map_err(|s| status_error(&self.endpoint, what, s))
    }

    fn timeout(&self, what: &'static str) -> EtcdError {
        EtcdError::Timeout {
            endpoint: self.endpoint.clone(),
            what,
            timeout_ms: self.options.request_timeout_ms,
        }
    }

    fn revision_of(&self, what: &'static str, revision: i64) -> Result<u64, EtcdError> {
        u64::try_from(revision).map_err(|_| EtcdError::Protocol {
            endpoint: self.endpoint.clone(),
            what,
            why: format!("negative revision {revision}"),
        })
    }
}

fn convert_kv(kv: etcdpb::KeyValue) -> KeyValue {
    KeyValue {
        key: kv.key,
        value: kv.value,
        create_revision: u64::try_from(kv.create_revision).unwrap_or(0),
        mod_revision: u64::try_from(kv.mod_revision).unwrap_or(0),
    }
}

/// The `range_end` that makes a range cover every key starting with `prefix`: the prefix with
/// its last byte below 0xff incremented (and what follows dropped); `"\0"` (every key) when
/// there is no such byte.
pub fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// `host:port` or `http://host:port` -> `http://host:port`; `https://` and anything with a path
/// refused.
pub fn normalize_endpoint(endpoint: &str) -> Result<String, EtcdError> {
    let bad = |why: &str| EtcdError::BadEndpoint {
        endpoint: crate::core::error::shorten(endpoint),
        why: why.to_string(),
    };
    if endpoint.len() > MAX_ENDPOINT_LEN {
        return Err(bad(&format!("longer than {MAX_ENDPOINT_LEN} bytes")));
    }
    if endpoint.starts_with("https://") {
        return Err(bad(
            "TLS to etcd is not supported yet; garden-ring talks to its local etcd over plain http on loopback",
        ));
    }
    let rest = endpoint.strip_prefix("http://").unwrap_or(endpoint);
    let rest = rest.strip_suffix('/').unwrap_or(rest);
    if rest.is_empty()
        || rest.contains(['/', '?', '#', '@', ' '])
        || rest.contains("://")
        || !rest.rsplit_once(':').is_some_and(|(host, port)| {
            !host.is_empty() && port.parse::<u16>().is_ok_and(|p| p != 0)
        })
    {
        return Err(bad("expected http://host:port"));
    }
    Ok(format!("http://{rest}"))
}

fn status_error(endpoint: &str, what: &'static str, status: tonic::Status) -> EtcdError {
    // A transport failure (refused connection, reset stream) comes back as a status too.
    let message = status.message();
    if status.code() == tonic::Code::Unavailable
        && ["transport", "connect", "connection"]
            .iter()
            .any(|m| message.contains(m))
    {
        return EtcdError::Unavailable {
            endpoint: endpoint.to_string(),
            what,
            why: status.message().to_string(),
        };
    }
    EtcdError::Status {
        endpoint: endpoint.to_string(),
        what,
        code: status.code(),
        message: crate::core::error::shorten(status.message()),
    }
}

/// The error and its sources, one line.
fn error_chain(e: &(dyn std::error::Error + 'static)) -> String {
    let mut out = e.to_string();
    let mut source = e.source();
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_are_normalized_or_refused() {
        assert_eq!(
            normalize_endpoint("127.0.0.1:2379").unwrap(),
            "http://127.0.0.1:2379"
        );
        assert_eq!(
            normalize_endpoint("http://localhost:2379/").unwrap(),
            "http://localhost:2379"
        );
        assert_eq!(
            normalize_endpoint("http://[::1]:2379").unwrap(),
            "http://[::1]:2379"
        );
        for bad in [
            "",
            "https://127.0.0.1:2379",
            "http://127.0.0.1",
            "127.0.0.1:0",
            "127.0.0.1:99999",
            "http://127.0.0.1:2379/v3",
            "unix:///run/etcd.sock",
            "http://u:p@127.0.0.1:2379",
        ] {
            let err = normalize_endpoint(bad).unwrap_err();
            assert!(!err.is_retryable(), "{bad}");
            assert!(matches!(err, EtcdError::BadEndpoint { .. }), "{bad}: {err}");
        }
        let long = format!("http://{}:1", "a".repeat(MAX_ENDPOINT_LEN));
        assert!(normalize_endpoint(&long).is_err());
        let https = normalize_endpoint("https://127.0.0.1:2379").unwrap_err();
        assert!(https.to_string().contains("TLS"), "{https}");
    }

    #[test]
    fn prefix_ends_cover_the_prefix() {
        assert_eq!(prefix_end(b"abc"), b"abd");
        assert_eq!(prefix_end(b"a\xff"), b"b");
        assert_eq!(prefix_end(b"\xff\xff"), b"\0");
        assert_eq!(prefix_end(b""), b"\0");
    }

    #[test]
    fn retryable_codes() {
        let status = |code| EtcdError::Status {
            endpoint: "e".into(),
            what: "Put",
            code,
            message: String::new(),
        };
        assert!(status(tonic::Code::Unavailable).is_retryable());
        assert!(status(tonic::Code::DeadlineExceeded).is_retryable());
        assert!(!status(tonic::Code::InvalidArgument).is_retryable());
        assert!(!status(tonic::Code::PermissionDenied).is_retryable());
    }

    #[tokio::test]
    async fn nothing_listening_is_retryable() {
        // A port just freed: nothing listens there.
        let port = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let err = EtcdClient::connect(
            &format!("127.0.0.1:{port}"),
            EtcdClientOptions {
                connect_timeout_ms: 500,
                ..EtcdClientOptions::default()
            },
        )
        .await
        .unwrap_err();
        assert!(err.is_retryable(), "{err}");
        assert!(matches!(err, EtcdError::Unavailable { .. }), "{err}");
    }
}
