//! The server side of the peer protocol: hands peers' Raft messages to the local Raft node.
//!
//! Every message says who sent it and whom it is for; a message for another member (an address
//! reused, a stale peer list) is refused with `FAILED_PRECONDITION` instead of being fed to the
//! wrong Raft node. Over TLS, the sender's certificate must name the member the ring registered
//! under the node id the message claims (`PERMISSION_DENIED` otherwise), so one member cannot
//! speak, or vote, for another. Snapshot streams declare their size up front; oversize or
//! truncated streams are refused.

use serde::Serialize;
use serde::de::DeserializeOwned;
use tonic::{Request, Response, Status, Streaming};

use std::sync::{Arc, Mutex};

use openraft::raft::StreamAppendError;
use openraft::type_config::async_runtime::watch::WatchReceiver;

use super::StateMachineStore;
use super::codec::{decode, encode, readable, reads};
use super::contact::{InFlight, LeaderContact};
use super::divergence::OwnDivergence;
use super::network::{MAX_PEER_MESSAGE_BYTES, REMOVED_MARKER, removed_status};
use super::types::{
    NodeId, PingReply, RaftNode, ReadIndexReply, RenewReply, RenewRequest, SnapshotMeta,
    TypeConfig, Vote,
};
use crate::pb;
use crate::tls::Role;
use crate::tls::server::{ConnInfo, PeerAuth, SeenCertificates};

/// Handles Admin writes that followers forward to this member (implemented by the Admin
/// service; see the `Forward` RPC).
pub trait ForwardHandler: Send + Sync + 'static {
    /// Runs the forwarded request; `request.from` is authenticated already.
    fn handle(
        &self,
        request: pb::ForwardRequest,
    ) -> futures::future::BoxFuture<'_, Result<Vec<u8>, Status>>;
}

/// Largest snapshot a member accepts from a peer, in bytes.
pub const MAX_SNAPSHOT_BYTES: u64 = 1024 * 1024 * 1024;

/// Renews members' leases (implemented by the leader's lease desk; see the `Renew` RPC).
pub trait RenewHandler: Send + Sync + 'static {
    /// Renews the lease of member `from`, whose certificate was checked already.
    fn renew(
        &self,
        from: NodeId,
        request: RenewRequest,
    ) -> futures::future::BoxFuture<'_, Result<RenewReply, Status>>;
}

/// What the peer service hands to the layers above it.
#[derive(Clone)]
pub struct Handlers {
    /// Runs forwarded Admin writes.
    pub forward: Arc<dyn ForwardHandler>,
    /// Renews leases.
    pub renew: Arc<dyn RenewHandler>,
}

/// The `gardenring.v1.Raft` service of one member. Cheap to clone: clones share everything.
#[derive(Clone)]
pub struct PeerService {
    me: NodeId,
    raft: RaftNode,
    state: StateMachineStore,
    contact: LeaderContact,
    seen: SeenCertificates,
    handlers: Handlers,
    /// Whether this member diverged: then it grants no vote until its log holds what it had
    /// acknowledged.
    divergence: OwnDivergence,
}

/// The peer server with its interceptor (admits member certificates only).
pub type PeerServer = tonic::service::interceptor::InterceptedService<
    pb::raft_server::RaftServer<PeerService>,
    fn(Request<()>) -> Result<Request<()>, Status>,
>;

/// The peer server's interceptor: member certificates only (any client without TLS). The
/// health service on the peer port sits behind it too.
pub fn admit_members(request: Request<()>) -> Result<Request<()>, Status> {
    crate::tls::server::admit(&request, &[Role::Member], "peer")?;
    Ok(request)
}

impl PeerService {
    /// Serves `raft`, the Raft node of member `me`; `state` tells which ids were retired and
    /// which member names go with which ids; `contact` records when a leader last reached this
    /// member; `seen` records the certificates peers present; `handlers` run forwarded Admin
    /// writes and lease renewals.
    pub fn new(
        me: NodeId,
        raft: RaftNode,
        state: StateMachineStore,
        contact: LeaderContact,
        seen: SeenCertificates,
        handlers: Handlers,
    ) -> Self {
        Self {
            me,
            raft,
            state,
            contact,
            seen,
            handlers,
            divergence: OwnDivergence::default(),
        }
    }

    /// Refuses votes while `divergence` says this member lost entries it had acknowledged.
    pub fn with_divergence(mut self, divergence: OwnDivergence) -> Self {
        self.divergence = divergence;
        self
    }

    /// The refusal of a (pre-)vote while this member's log ends below what it acknowledged: a
    /// candidate counts the error as no vote, and nothing of it reaches openraft (no vote or
    /// term is stored).
    fn refuse_vote(&self, from: NodeId) -> Result<(), Status> {
        let last = self.raft.metrics().borrow_watched().last_log_index;
        match self.divergence.refuses_vote(last) {
            None => Ok(()),
            Some(why) => {
                tracing::warn!(candidate = from, "vote refused: {why}");
                Err(Status::failed_precondition(why))
            }
        }
    }

    /// The tonic server for this service, with the peer message size limits and the
    /// interceptor that admits member certificates only.
    pub fn into_server(self) -> PeerServer {
        let server = pb::raft_server::RaftServer::new(self)
            .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES);
        tonic::service::interceptor::InterceptedService::new(server, admit_members as fn(_) -> _)
    }

    /// The name the ring knows member `id` by: the Raft configuration (which includes members
    /// being added), else the registry.
    fn known_name(&self, id: NodeId) -> Option<String> {
        let from_config = {
            let metrics = self.raft.metrics();
            let m = metrics.borrow_watched();
            m.membership_config
                .membership()
                .get_node(&id)
                .map(|n| n.name.clone())
        };
        from_config.or_else(|| {
            self.state
                .read(|a| a.state.members.get(&id).map(|m| m.name.clone()))
        })
    }

    /// Over TLS: the sender's certificate must name the member registered under `from`. An id
    /// this member does not know yet (it is new, or lagging behind a membership change) is
    /// accepted from any member certificate: such an id has no vote here to steal.
    fn check_sender(&self, info: Option<&ConnInfo>, from: NodeId) -> Result<(), Status> {
        let Some(info) = info else {
            return Err(Status::unauthenticated("no connection information"));
        };
        match info.auth.as_ref() {
            PeerAuth::Insecure => Ok(()),
            PeerAuth::Verified {
                identity,
                cert_sha256,
            } if identity.role == Role::Member => {
                if let Some(name) = self.known_name(from)
                    && name != identity.name
                {
                    let status = Status::permission_denied(format!(
                        "the certificate is for {identity}, but the message claims to come from member {from} ({name})"
                    ));
                    tracing::warn!(remote = ?info.remote, "refused a peer message: {}", status.message());
                    return Err(status);
                }
                let key = info
                    .revocation
                    .as_ref()
                    .map(|(_, issuer, serial)| (issuer.as_str(), serial.as_str()));
                self.seen.record(&identity.name, cert_sha256, key);
                Ok(())
            }
            other => Err(Status::permission_denied(format!(
                "the peer service admits member certificates only ({other:?})"
            ))),
        }
    }

    fn check_addressing(
        &self,
        from: NodeId,
        to: NodeId,
        codec: u32,
        generation: u64,
    ) -> Result<(), Status> {
        if to != self.me {
            return Err(Status::failed_precondition(format!(
                "message from member {from} is addressed to member {to}, but this is member {}",
                self.me
            )));
        }
        let (retired, ours, active) = self.state.read(|a| {
            (
                a.state.retired_ids.contains(&from),
                a.state.generation(),
                a.state.settings.ring_version.active,
            )
        });
        if retired {
            return Err(removed_status(format!(
                "{REMOVED_MARKER}: member {from} was removed from the ring and its id is retired; \
                 wipe its data directory and add it again under a new id to rejoin"
            )));
        }
        if !reads(codec) {
            return Err(Status::failed_precondition(format!(
                "message from member {from} uses codec {codec} (ring version {codec}); this \
                 member runs release {} at ring version {active} and reads codecs {}",
                env!("CARGO_PKG_VERSION"),
                readable()
            )));
        }
        check_generation(from, generation, ours)
    }

    /// Checks sender, addressing and codec; returns the sender and the decoded payload.
    fn open<T: DeserializeOwned>(
        &self,
        request: Request<pb::RaftMessage>,
        what: &'static str,
    ) -> Result<(NodeId, T), Status> {
        let info = ConnInfo::of(&request).cloned();
        self.open_message(info.as_ref(), request.into_inner(), what)
    }

    /// [`Self::open`] for one message of a stream that came over the connection `info`.
    fn open_message<T: DeserializeOwned>(
        &self,
        info: Option<&ConnInfo>,
        msg: pb::RaftMessage,
        what: &'static str,
    ) -> Result<(NodeId, T), Status> {
        self.check_sender(info, msg.from)?;
        self.check_addressing(msg.from, msg.to, msg.codec, msg.generation)?;
        let value =
            decode(what, &msg.payload).map_err(|e| Status::invalid_argument(e.to_string()))?;
        Ok((msg.from, value))
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
            codec: self.state.read(|a| a.state.settings.ring_version.active),
            payload,
            // Only requests are checked; a reply carries none.
            generation: 0,
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
        let (from, req) = self.open(request, "vote request")?;
        self.refuse_vote(from)?;
        let resp = self.raft.vote(req).await.map_err(stopped)?;
        self.reply(from, "vote response", &resp)
    }

    async fn pre_vote(
        &self,
        request: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let (from, req) = self.open(request, "pre-vote request")?;
        self.refuse_vote(from)?;
        let resp = self.raft.pre_vote(req).await.map_err(stopped)?;
        self.reply(from, "pre-vote response", &resp)
    }

    async fn append_entries(
        &self,
        request: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let (from, req): (NodeId, openraft::raft::AppendEntriesRequest<TypeConfig>) =
            self.open(request, "append-entries request")?;
        let flight = self.contact.begin(req.vote.leader_id.term);
        let resp = self.raft.append_entries(req).await.map_err(stopped)?;
        let accepted = !matches!(resp, openraft::raft::AppendEntriesResponse::HigherVote(_));
        self.contact.answered(flight, accepted);
        self.reply(from, "append-entries response", &resp)
    }

    type StreamAppendStream = futures::stream::BoxStream<'static, Result<pb::RaftMessage, Status>>;

    async fn stream_append(
        &self,
        request: Request<Streaming<pb::RaftMessage>>,
    ) -> Result<Response<Self::StreamAppendStream>, Status> {
        use futures::StreamExt;
        let info = ConnInfo::of(&request).cloned();
        // Each message is checked like a unary AppendEntries. The first one that fails ends
        // the input; the answers to the ones before it still go out, then its error.
        let refused: Arc<Mutex<Option<Status>>> = Arc::default();
        let sender = Arc::new(std::sync::atomic::AtomicU64::new(0));
        // One guard per message handed to Raft, answered in order (openraft answers a stream's
        // messages in the order they came); dropped with the stream if it ends early.
        let flights: Arc<Mutex<std::collections::VecDeque<InFlight>>> = Arc::default();
        let input = {
            let (this, refused, sender, flights) = (
                self.clone(),
                refused.clone(),
                sender.clone(),
                flights.clone(),
            );
            request.into_inner().scan((), move |(), item| {
                let opened = item.and_then(|msg| {
                    this.open_message::<openraft::raft::AppendEntriesRequest<TypeConfig>>(
                        info.as_ref(),
                        msg,
                        "append-entries request",
                    )
                });
                futures::future::ready(match opened {
                    Ok((from, req)) => {
                        sender.store(from, std::sync::atomic::Ordering::Relaxed);
                        let flight = this.contact.begin(req.vote.leader_id.term);
                        flights
                            .lock()
                            .unwrap_or_else(|e| e.into_inner())
                            .push_back(flight);
                        Some(req)
                    }
                    Err(status) => {
                        *refused.lock().unwrap_or_else(|e| e.into_inner()) = Some(status);
                        None
                    }
                })
            })
        };
        let this = self.clone();
        let answers = self.raft.stream_append(input).map(move |result| {
            // As for a unary AppendEntries: any answer Raft gives means a leader made contact;
            // all but a refusal for a higher vote mean the leader's message was accepted.
            let result = result.map_err(stopped)?;
            let flight = flights
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .pop_front();
            if let Some(flight) = flight {
                let accepted = !matches!(result, Err(StreamAppendError::HigherVote(_)));
                this.contact.answered(flight, accepted);
            }
            let to = sender.load(std::sync::atomic::Ordering::Relaxed);
            this.reply(to, "append-entries result", &result)
                .map(Response::into_inner)
        });
        let last = futures::stream::once(async move {
            refused.lock().unwrap_or_else(|e| e.into_inner()).take()
        })
        .filter_map(|status| futures::future::ready(status.map(Err)));
        Ok(Response::new(answers.chain(last).boxed()))
    }

    async fn install_snapshot(
        &self,
        request: Request<Streaming<pb::SnapshotChunk>>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let info = ConnInfo::of(&request).cloned();
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
        self.check_sender(info.as_ref(), header.from)?;
        self.check_addressing(header.from, header.to, header.codec, header.generation)?;
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
        let term = vote.leader_id.term;
        let flight = self.contact.begin(term);
        let resp = self
            .raft
            .install_full_snapshot(vote, snapshot)
            .await
            .map_err(stopped)?;
        self.contact
            .answered(flight, resp.vote.leader_id.term <= term);
        self.reply(header.from, "snapshot response", &resp.vote)
    }

    async fn transfer_leader(
        &self,
        request: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let (from, req) = self.open(request, "transfer-leader request")?;
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
        self.check_sender(ConnInfo::of(&request), request.get_ref().from)?;
        let msg = request.into_inner();
        let from = msg.from;
        self.check_addressing(msg.from, msg.to, msg.codec, msg.generation)?;
        let leader_id = self.raft.metrics().borrow_watched().current_leader;
        let reply = self.state.read(|a| PingReply {
            leader_id,
            applied_index: a.applied_index(),
            bootstrapped: a.state.bootstrapped,
            registered: a.state.members.get(&from).map(|m| m.contacted),
        });
        self.reply(from, "ping reply", &reply)
    }

    async fn forward(
        &self,
        request: Request<pb::ForwardRequest>,
    ) -> Result<Response<pb::ForwardReply>, Status> {
        self.check_sender(ConnInfo::of(&request), request.get_ref().from)?;
        let req = request.into_inner();
        self.check_addressing(
            req.from,
            req.to,
            super::codec::CODEC_VERSION,
            req.generation,
        )?;
        let response = self.handlers.forward.handle(req).await?;
        Ok(Response::new(pb::ForwardReply { response }))
    }

    async fn read_index(
        &self,
        request: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let (from, ()) = self.open(request, "read-index request")?;
        let linearizer = self
            .raft
            .get_read_linearizer(openraft::ReadPolicy::ReadIndex)
            .await
            .map_err(|e| {
                if e.forward_to_leader().is_some() {
                    Status::failed_precondition(format!(
                        "member {} is not the leader: {e}",
                        self.me
                    ))
                } else {
                    Status::unavailable(format!(
                        "member {} cannot confirm its leadership with a quorum: {e}",
                        self.me
                    ))
                }
            })?;
        let read = linearizer.read_log_id();
        let reply = ReadIndexReply {
            index: read.index(),
            term: read.committed_leader_id().term,
        };
        self.reply(from, "read-index reply", &reply)
    }

    async fn renew(
        &self,
        request: Request<pb::RaftMessage>,
    ) -> Result<Response<pb::RaftMessage>, Status> {
        let (from, req): (NodeId, RenewRequest) = self.open(request, "renew request")?;
        let reply = self.handlers.renew.renew(from, req).await?;
        self.reply(from, "renew reply", &reply)
    }
}

/// Refuses a message whose sender belongs to another incarnation of the ring
/// ([`RingState::generation`](crate::core::RingState::generation)): 0 on either side (a member
/// without state yet) is accepted. A sender from before a recovery was removed by it (perhaps
/// without the ring knowing its id): it is told so with [`REMOVED_MARKER`], which makes it stop.
/// A sender from after a recovery that this member predates is refused without the marker: the
/// stale one here must not stop a member of the recovered ring.
fn check_generation(from: NodeId, theirs: u64, ours: u64) -> Result<(), Status> {
    if theirs == 0 || ours == 0 || theirs == ours {
        return Ok(());
    }
    if theirs < ours {
        return Err(removed_status(format!(
            "{REMOVED_MARKER}: member {from} keeps the ring's state from before a recovery \
             (its generation {theirs}, the ring's {ours}): the recovery removed it; wipe its data \
             directory and add it again under a new id to rejoin"
        )));
    }
    Err(Status::failed_precondition(format!(
        "member {from} belongs to the ring as recovered (generation {theirs}), and this member \
         keeps its state from before that recovery (generation {ours}): this member was removed; \
         stop it and wipe its data directory"
    )))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_members_of_another_ring_generation_are_refused() {
        // No state on either side, or the same generation: accepted.
        for (theirs, ours) in [(0, 0), (0, 2), (3, 0), (1, 1), (4, 4)] {
            assert!(check_generation(7, theirs, ours).is_ok(), "{theirs} {ours}");
        }
        // From before a recovery: told it was removed (it stops on the marker).
        let older = check_generation(7, 1, 2).unwrap_err();
        assert_eq!(older.code(), tonic::Code::FailedPrecondition);
        assert!(older.message().starts_with(REMOVED_MARKER), "{older:?}");
        assert!(crate::raft::network::is_removed(&older), "{older:?}");
        assert!(older.message().contains("member 7"), "{older:?}");
        // From after a recovery this member predates: refused, but the sender is not stopped.
        let newer = check_generation(7, 3, 2).unwrap_err();
        assert_eq!(newer.code(), tonic::Code::FailedPrecondition);
        assert!(!newer.message().contains(REMOVED_MARKER), "{newer:?}");
        assert!(!crate::raft::network::is_removed(&newer), "{newer:?}");
    }
}
