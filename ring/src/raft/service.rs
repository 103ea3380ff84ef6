//! The server side of the peer protocol: hands peers' Raft messages to the local Raft node.
//!
//! Every message says who sent it and whom it is for; a message for another member (an address
//! reused, a stale peer list) is refused with `FAILED_PRECONDITION` instead of being fed to the
//! wrong Raft node. Snapshot streams declare their size up front; oversize or truncated streams
//! are refused.

use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::{Request, Response, Status, Streaming};

use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::type_config::async_runtime::watch::WatchReceiver;

use super::StateMachineStore;
use super::codec::{CODEC_VERSION, decode, encode};
use super::network::{MAX_PEER_MESSAGE_BYTES, REMOVED_MARKER};
use super::types::{NodeId, PingReply, RaftNode, SnapshotMeta, TypeConfig, Vote};
use crate::pb;

/// Largest snapshot a member accepts from a peer, in bytes.
pub const MAX_SNAPSHOT_BYTES: u64 = 1024 * 1024 * 1024;

/// When this member last heard from a leader (an AppendEntries or a snapshot).
#[derive(Clone, Default)]
pub struct LeaderContact(Arc<Mutex<Option<Instant>>>);

impl LeaderContact {
    fn touch(&self) {
        *self.0.lock().unwrap_or_else(|e| e.into_inner()) = Some(Instant::now());
    }

    /// Time since the last contact; `None` if there was none since start.
    pub fn since(&self) -> Option<Duration> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .map(|at| at.elapsed())
    }
}

/// The `gardenring.v1.Raft` service of one member.
pub struct PeerService {
    me: NodeId,
    raft: RaftNode,
    state: StateMachineStore,
    contact: LeaderContact,
}

impl PeerService {
    /// Serves `raft`, the Raft node of member `me`; `state` tells which ids were retired;
    /// `contact` records when a leader last reached this member.
    pub fn new(
        me: NodeId,
        raft: RaftNode,
        state: StateMachineStore,
        contact: LeaderContact,
    ) -> Self {
        Self {
            me,
            raft,
            state,
            contact,
        }
    }

    /// The tonic server for this service, with the peer message size limits.
    pub fn into_server(self) -> pb::raft_server::RaftServer<Self> {
        pb::raft_server::RaftServer::new(self)
            .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES)
    }

    fn check_addressing(&self, from: NodeId, to: NodeId, codec: u32) -> Result<(), Status> {
        if to != self.me {
            return Err(Status::failed_precondition(format!(
                "message from member {from} is addressed to member {to}, but this is member {}",
                self.me
            )));
        }
        if self.state.read(|a| a.state.retired_ids.contains(&from)) {
            return Err(Status::failed_precondition(format!(
                "{REMOVED_MARKER}: member {from} was removed from the ring and its id is retired; \
                 wipe its data directory and add it again under a new id to rejoin"
            )));
        }
        if codec != CODEC_VERSION {
            return Err(Status::failed_precondition(format!(
                "message from member {from} uses codec {codec}; this member speaks {CODEC_VERSION}"
            )));
        }
        Ok(())
    }

    fn open<T: DeserializeOwned>(
        &self,
        msg: pb::RaftMessage,
        what: &'static str,
    ) -> Result<T, Status> {
        self.check_addressing(msg.from, msg.to, msg.codec)?;
        decode(what, &msg.payload).map_err(|e| Status::invalid_argument(e.to_string()))
    }

    fn reply<T: Serialize>(
        &self,
        to: NodeId,
        what: &'static str,
        value: &T,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let payload = encode(what, value).map_err(|e| Status::internal(e.to_string()))?;
        Ok(Response::new(pb::RaftMessage {
            from: self.me,
            to,
            codec: CODEC_VERSION,
            payload,
        }))
    }
}

fn stopped(e: impl std::fmt::Display) -> Status {
    Status::unavailable(format!("raft is not running on this member: {e}"))
}

#[tonic::async_trait]
impl pb::raft_server::Raft for PeerService {
    async fn vote(
        &self,
        request: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let msg = request.into_inner();
        let from = msg.from;
        let req = self.open(msg, "vote request")?;
        let resp = self.raft.vote(req).await.map_err(stopped)?;
        self.reply(from, "vote response", &resp)
    }

    async fn pre_vote(
        &self,
        request: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let msg = request.into_inner();
        let from = msg.from;
        let req = self.open(msg, "pre-vote request")?;
        let resp = self.raft.pre_vote(req).await.map_err(stopped)?;
        self.reply(from, "pre-vote response", &resp)
    }

    async fn append_entries(
        &self,
        request: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let msg = request.into_inner();
        let from = msg.from;
        let req = self.open(msg, "append-entries request")?;
        let resp = self.raft.append_entries(req).await.map_err(stopped)?;
        self.contact.touch();
        self.reply(from, "append-entries response", &resp)
    }

    async fn install_snapshot(
        &self,
        request: Request<Streaming<pb::SnapshotChunk>>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let mut stream = request.into_inner();
        let header = match stream.message().await? {
            Some(pb::SnapshotChunk {
                item: Some(pb::snapshot_chunk::Item::Header(h)),
            }) => h,
            _ => {
                return Err(Status::invalid_argument(
                    "a snapshot stream must start with its header",
                ));
            }
        };
        self.check_addressing(header.from, header.to, header.codec)?;
        if header.total_bytes > MAX_SNAPSHOT_BYTES {
            return Err(Status::resource_exhausted(format!(
                "snapshot of {} bytes exceeds the limit of {MAX_SNAPSHOT_BYTES} bytes",
                header.total_bytes
            )));
        }
        let (vote, meta): (Vote, SnapshotMeta) = decode("snapshot header", &header.meta)
            .map_err(|e| Status::invalid_argument(e.to_string()))?;
        let total = usize::try_from(header.total_bytes)
            .map_err(|_| Status::resource_exhausted("snapshot too large"))?;
        let mut data = Vec::with_capacity(total);
        while let Some(chunk) = stream.message().await? {
            match chunk.item {
                Some(pb::snapshot_chunk::Item::Data(bytes)) => {
                    if data.len() + bytes.len() > total {
                        return Err(Status::invalid_argument(format!(
                            "snapshot stream carries more than the {total} bytes its header announced"
                        )));
                    }
                    data.extend_from_slice(&bytes);
                }
                _ => {
                    return Err(Status::invalid_argument(
                        "unexpected second snapshot header",
                    ));
                }
            }
        }
        if data.len() != total {
            return Err(Status::data_loss(format!(
                "snapshot stream ended after {} of {total} bytes",
                data.len()
            )));
        }
        let snapshot = openraft::alias::SnapshotOf::<TypeConfig, Vec<u8>> {
            meta,
            snapshot: data,
        };
        let resp = self
            .raft
            .install_full_snapshot(vote, snapshot)
            .await
            .map_err(stopped)?;
        self.reply(header.from, "snapshot response", &resp.vote)
    }

    async fn transfer_leader(
        &self,
        request: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let msg = request.into_inner();
        let from = msg.from;
        let req = self.open(msg, "transfer-leader request")?;
        let resp = self
            .raft
            .handle_transfer_leader(req)
            .await
            .map_err(stopped)?;
        self.reply(from, "transfer-leader response", &resp)
    }

    async fn ping(
        &self,
        request: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let msg = request.into_inner();
        let from = msg.from;
        self.check_addressing(msg.from, msg.to, msg.codec)?;
        let leader_id = self.raft.metrics().borrow_watched().current_leader;
        let reply = self.state.read(|a| PingReply {
            leader_id,
            applied_index: a.applied_index(),
            bootstrapped: a.state.bootstrapped,
            registered: a.state.members.get(&from).map(|m| m.contacted),
        });
        self.reply(from, "ping reply", &reply)
    }
}
