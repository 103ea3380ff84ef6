//! The client side of the peer protocol: how this member's Raft reaches the others.
//!
//! One lazily-connected gRPC channel is cached per peer (by node id and address) and reused by
//! every RPC and replication stream to it; tonic reconnects it when the connection drops.
//! A peer that cannot be reached is reported to openraft as [`Unreachable`], which makes openraft
//! back off (see [`RaftNetworkV2::backoff`]), and it is logged once when it becomes unreachable and
//! once when it comes back, not on every failed heartbeat.

use std::collections::{HashMap, VecDeque};
use std::future::Future;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use openraft::OptionalSend;
use openraft::base::{BoxFuture, BoxStream};
use openraft::errors::{NetworkError, RPCError, ReplicationClosed, StreamingError, Unreachable};
use openraft::network::{
    Backoff, RPCOption, RaftNetworkFactory, RaftNetworkV2, stream_append_sequential,
};
use openraft::raft::{
    AppendEntriesRequest, AppendEntriesResponse, SnapshotResponse, StreamAppendError,
    StreamAppendResult, TransferLeaderRequest, TransferLeaderResponse, VoteRequest, VoteResponse,
};
use serde::Serialize;
use serde::de::DeserializeOwned;
use tokio::sync::watch;
use tonic::transport::Channel;

use super::codec::{decode, encode, readable, reads};
use super::divergence::{Acknowledged, Diverged, OwnDivergence, conflict_after_ack};
use super::types::{
    MemberNode, NodeId, PingReply, ReadIndexReply, RenewReply, RenewRequest, SnapshotData,
    TypeConfig, Vote,
};
use crate::pb;
use crate::pb::raft_client::RaftClient;
use crate::tls::Security;
use crate::tls::client::{Expect, channel};

/// Largest message the peer protocol sends or accepts (a big append batch), in bytes.
pub const MAX_PEER_MESSAGE_BYTES: usize = 64 * 1024 * 1024;
/// Size of the chunks a snapshot is streamed in, in bytes.
pub const SNAPSHOT_CHUNK_BYTES: usize = 1024 * 1024;
/// How long to wait for a TCP connection to a peer.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// Prefix of the status message a member sends to a peer whose id was retired (for people
/// and logs; peers decide by [`REMOVED_HEADER`]).
pub const REMOVED_MARKER: &str = "member-removed";
/// Metadata on the status a member sends to a peer whose id was retired (or that a recovery
/// removed): the peer stops `ringd`. Decided by this header, never by the message text.
pub const REMOVED_HEADER: &str = "x-ring-member-removed";

/// The status that tells a peer it was removed from the ring: `FAILED_PRECONDITION`, the
/// message starting with [`REMOVED_MARKER`], and [`REMOVED_HEADER`] set.
pub fn removed_status(message: String) -> tonic::Status {
    debug_assert!(message.starts_with(REMOVED_MARKER));
    let mut status = tonic::Status::failed_precondition(message);
    status.metadata_mut().insert(
        REMOVED_HEADER,
        tonic::metadata::MetadataValue::from_static("1"),
    );
    status
}

/// Whether `status` tells this member it was removed from the ring.
pub fn is_removed(status: &tonic::Status) -> bool {
    status.code() == tonic::Code::FailedPrecondition
        && status.metadata().contains_key(REMOVED_HEADER)
}

/// A cached channel: (address, member name) it was made for, and the channel.
type CachedChannel = ((String, String), Channel);

/// How many connections a member keeps to each peer: lane 0 carries Raft (and everything
/// else), and lease renewals rotate over all of them and send their hedged copies on another
/// (see [`crate::core::renewal`]). A lost packet stalls one TCP connection for its
/// retransmission timeout; a copy on another connection is not stuck behind it. Eight: with
/// a copy every [`crate::core::Timing::renew_hedge_ms`], they spread over the renewal's
/// timeout; with four, 30% loss still lapsed a 1-2 s lease in 2 of 4 one-minute runs (a
/// round fails only when all its copies do, and one failed round ends a lease).
pub const PEER_LANES: usize = 8;

/// Shared per-peer state: channels, reachability, and whether a peer told us we were removed.
pub struct PeerPool {
    security: Security,
    /// Per peer and lane (below [`PEER_LANES`]): the channel, and the address and member name
    /// it was made for.
    channels: Mutex<HashMap<(NodeId, usize), CachedChannel>>,
    unreachable: Mutex<HashMap<NodeId, String>>,
    removed: watch::Sender<Option<String>>,
    /// Followers found to have lost entries they acknowledged (while this member led).
    diverged: Diverged,
    /// Whether this member itself diverged (the leader told it, or it applied the record).
    own_divergence: OwnDivergence,
    /// This member's ring generation (`RingState::generation`), sent with every request.
    generation: AtomicU64,
    /// The ring's active version (the applied state's), sent with every message as its codec.
    codec: std::sync::atomic::AtomicU32,
}

impl PeerPool {
    /// A pool whose connections use `security`.
    pub fn new(security: Security) -> Self {
        Self {
            security,
            channels: Mutex::default(),
            unreachable: Mutex::default(),
            removed: watch::channel(None).0,
            diverged: Diverged::default(),
            own_divergence: OwnDivergence::default(),
            generation: AtomicU64::new(0),
            codec: std::sync::atomic::AtomicU32::new(super::codec::CODEC_VERSION),
        }
    }

    /// Sets the codec the messages carry: the ring's active version (from the applied state).
    pub fn set_codec(&self, codec: u32) {
        self.codec.store(codec, Ordering::Relaxed);
    }

    /// The codec the messages carry.
    pub fn codec(&self) -> u32 {
        self.codec.load(Ordering::Relaxed)
    }

    /// Sets the ring generation the requests carry (from the applied state).
    pub fn set_generation(&self, generation: u64) {
        self.generation.store(generation, Ordering::Relaxed);
    }

    /// The ring generation the requests carry.
    pub fn generation(&self) -> u64 {
        self.generation.load(Ordering::Relaxed)
    }

    /// Drops every cached channel, so the next calls connect anew (with the certificates in
    /// use now). Calls in flight finish on their old connection.
    pub fn reconnect_all(&self) {
        lock(&self.channels).clear();
    }

    /// Becomes `Some(message)` once a peer reports that this member was removed from the ring.
    pub fn watch_removed(&self) -> watch::Receiver<Option<String>> {
        self.removed.subscribe()
    }

    /// The channel to member `target` (named `name`) at `address`; over TLS, the server must
    /// present a certificate for `name`.
    pub fn channel(
        &self,
        target: NodeId,
        name: &str,
        address: &str,
    ) -> Result<Channel, tonic::transport::Error> {
        self.channel_on_lane(target, name, address, 0)
    }

    /// Like [`PeerPool::channel`], on connection `lane` (below [`PEER_LANES`]) of the peer.
    pub fn channel_on_lane(
        &self,
        target: NodeId,
        name: &str,
        address: &str,
        lane: usize,
    ) -> Result<Channel, tonic::transport::Error> {
        assert!(lane < PEER_LANES, "lane {lane} of {PEER_LANES}");
        let mut channels = lock(&self.channels);
        let key = (address.to_string(), name.to_string());
        if let Some((cached, channel)) = channels.get(&(target, lane))
            && *cached == key
        {
            return Ok(channel.clone());
        }
        let channel = channel(
            address,
            &self.security,
            Expect::Member(name.to_string()),
            CONNECT_TIMEOUT,
            |e| {
                e.http2_keep_alive_interval(Duration::from_secs(10))
                    .keep_alive_timeout(Duration::from_secs(5))
            },
        )?;
        channels.insert((target, lane), (key, channel.clone()));
        Ok(channel)
    }

    fn mark_reachable(&self, target: NodeId, node: &MemberNode) {
        let mut unreachable = lock(&self.unreachable);
        if unreachable.remove(&target).is_some() {
            tracing::info!(peer = target, name = %node.name, address = %node.address, "peer reachable again");
        }
    }

    fn mark_unreachable(&self, target: NodeId, node: &MemberNode, why: &str) {
        let mut unreachable = lock(&self.unreachable);
        unreachable.entry(target).or_insert_with(|| {
            tracing::warn!(peer = target, name = %node.name, address = %node.address, error = %why, "peer unreachable");
            why.to_string()
        });
    }

    /// The followers this member found diverged while it led.
    pub fn diverged(&self) -> &Diverged {
        &self.diverged
    }

    /// Whether this member itself diverged.
    pub fn own_divergence(&self) -> &OwnDivergence {
        &self.own_divergence
    }

    /// Peers currently unreachable, with the last error seen.
    pub fn unreachable(&self) -> HashMap<NodeId, String> {
        lock(&self.unreachable).clone()
    }
}

/// Creates [`PeerClient`]s for openraft.
#[derive(Clone)]
pub struct PeerNetwork {
    me: NodeId,
    pool: Arc<PeerPool>,
}

impl PeerNetwork {
    /// The network of member `me`.
    pub fn new(me: NodeId, pool: Arc<PeerPool>) -> Self {
        Self { me, pool }
    }
}

impl PeerNetwork {
    /// A client for one peer, outside openraft (for [`PeerClient::ping`]).
    pub fn client(&self, target: NodeId, node: &MemberNode) -> PeerClient {
        self.client_on_lane(target, node, 0)
    }

    /// A client for one peer on connection `lane` (below [`PEER_LANES`]).
    pub fn client_on_lane(&self, target: NodeId, node: &MemberNode, lane: usize) -> PeerClient {
        PeerClient {
            me: self.me,
            target,
            node: node.clone(),
            pool: self.pool.clone(),
            pipelined: true,
            lane: lane % PEER_LANES,
            acknowledged: Acknowledged::default(),
        }
    }

    /// The shared peer state.
    pub fn pool(&self) -> &Arc<PeerPool> {
        &self.pool
    }
}

impl RaftNetworkFactory<TypeConfig> for PeerNetwork {
    type Network = PeerClient;

    async fn new_client(&mut self, target: NodeId, node: &MemberNode) -> PeerClient {
        PeerClient {
            me: self.me,
            target,
            node: node.clone(),
            pool: self.pool.clone(),
            pipelined: true,
            lane: 0,
            acknowledged: Acknowledged::default(),
        }
    }
}

/// Raft RPCs to one peer.
#[derive(Clone)]
pub struct PeerClient {
    me: NodeId,
    target: NodeId,
    node: MemberNode,
    pool: Arc<PeerPool>,
    /// Whether replication uses the `StreamAppend` RPC; cleared when the peer lacks it (an
    /// older version), for the life of this client (one leadership term's replication).
    pipelined: bool,
    /// Which of the peer's connections it uses (below [`PEER_LANES`]; Raft's is 0).
    lane: usize,
    /// The highest index the peer acknowledged to this client (one leadership's replication
    /// or heartbeats to it): a conflict at or below it is divergence ([`super::divergence`]).
    acknowledged: Acknowledged,
}

/// Why a call to a peer failed: it could not be reached (no connection, no answer in time:
/// openraft's `Unreachable`, a retry may help once it is back), or it answered with a failure
/// (a refusal, an answer that does not decode).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CallError {
    /// No answer: connection refused or broken, timeout.
    #[error("{0}")]
    Unreachable(String),
    /// The peer answered, with a failure.
    #[error("{0}")]
    Network(String),
}

impl CallError {
    fn message(self) -> String {
        match self {
            CallError::Unreachable(m) | CallError::Network(m) => m,
        }
    }

    fn into_rpc(self) -> RPCError<TypeConfig> {
        match self {
            CallError::Unreachable(m) => RPCError::Unreachable(Unreachable::from_string(m)),
            CallError::Network(m) => RPCError::Network(NetworkError::from_string(m)),
        }
    }

    fn into_streaming(self) -> StreamingError<TypeConfig> {
        match self {
            CallError::Unreachable(m) => StreamingError::Unreachable(Unreachable::from_string(m)),
            CallError::Network(m) => StreamingError::Network(NetworkError::from_string(m)),
        }
    }
}

fn classify(status: &tonic::Status) -> bool {
    matches!(
        status.code(),
        tonic::Code::Unavailable | tonic::Code::DeadlineExceeded | tonic::Code::Cancelled
    )
}

impl PeerClient {
    /// Notes what an answer to appends says about the peer's log: a match raises what it
    /// acknowledged, a conflict at or below that marks it diverged.
    fn note_answer(&self, matched: Option<u64>, conflict: Option<u64>) {
        if let Some(index) = matched {
            self.acknowledged.matched(index);
        }
        if let Some(index) = conflict
            && let Some(found) = conflict_after_ack(self.acknowledged.highest(), index)
        {
            self.pool.diverged.mark(self.target, &self.node.name, found);
        }
    }

    /// [`Self::note_answer`] for a streamed append's result.
    fn note_stream_result(&self, result: &StreamAppendResult<TypeConfig>) {
        match result {
            Ok(matched) => self.note_answer(matched.map(|l| l.index()), None),
            Err(StreamAppendError::Conflict(at)) => self.note_answer(None, Some(at.index())),
            Err(StreamAppendError::HigherVote(_)) => {}
        }
    }

    fn client(&self) -> Result<RaftClient<Channel>, CallError> {
        let channel = self
            .pool
            .channel_on_lane(self.target, &self.node.name, &self.node.address, self.lane)
            .map_err(|e| {
                CallError::Unreachable(format!("bad peer address {}: {e}", self.node.address))
            })?;
        Ok(RaftClient::new(channel)
            .max_decoding_message_size(MAX_PEER_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_PEER_MESSAGE_BYTES))
    }

    fn message<T: Serialize>(
        &self,
        what: &'static str,
        value: &T,
    ) -> Result<pb::RaftMessage, CallError> {
        let payload = encode(what, value).map_err(|e| CallError::Network(e.to_string()))?;
        Ok(pb::RaftMessage {
            from: self.me,
            to: self.target,
            codec: self.pool.codec(),
            payload,
            generation: self.pool.generation(),
        })
    }

    fn outcome<T>(
        &self,
        result: Result<tonic::Response<pb::RaftMessage>, tonic::Status>,
        what: &'static str,
    ) -> Result<T, CallError>
    where
        T: DeserializeOwned,
    {
        match result {
            Ok(resp) => self.answer(resp.into_inner(), what),
            Err(status) => Err(self.status_error(&status)),
        }
    }

    /// Decodes an answer of the peer (which is reachable, then).
    fn answer<T: DeserializeOwned>(
        &self,
        msg: pb::RaftMessage,
        what: &'static str,
    ) -> Result<T, CallError> {
        self.pool.mark_reachable(self.target, &self.node);
        if !reads(msg.codec) {
            return Err(CallError::Network(format!(
                "peer {} answered with codec {} (ring version {}); this release ({}) reads codecs {}",
                self.target,
                msg.codec,
                msg.codec,
                env!("CARGO_PKG_VERSION"),
                readable()
            )));
        }
        decode(what, &msg.payload).map_err(|e| CallError::Network(e.to_string()))
    }

    /// What a failed call's `status` means, noting an unreachable peer or a removal.
    fn status_error(&self, status: &tonic::Status) -> CallError {
        if classify(status) {
            let why = status.message().to_string();
            self.pool.mark_unreachable(self.target, &self.node, &why);
            return CallError::Unreachable(why);
        }
        if is_removed(status) {
            let message = status.message().to_string();
            self.pool.removed.send_if_modified(|r| {
                let first = r.is_none();
                if first {
                    *r = Some(message.clone());
                }
                first
            });
            return CallError::Network(message);
        }
        CallError::Network(format!(
            "peer {} ({}): {}: {}",
            self.target,
            self.node.address,
            status.code(),
            status.message()
        ))
    }

    /// Asks the peer how it sees this member (see the `Ping` RPC). A peer that reports this
    /// member removed also flips [`PeerPool::watch_removed`].
    pub async fn ping(&mut self, timeout: Duration) -> Result<PingReply, CallError> {
        let msg = self.message("ping", &())?;
        let mut client = self.client()?;
        let mut req = tonic::Request::new(msg);
        req.set_timeout(timeout);
        let result = client.ping(req).await;
        self.outcome(result, "ping reply")
    }

    /// Asks this peer, the leader, for a read index (see the `ReadIndex` RPC).
    pub async fn read_index(&mut self, timeout: Duration) -> Result<ReadIndexReply, CallError> {
        let msg = self.message("read-index request", &())?;
        let mut client = self.client()?;
        let mut req = tonic::Request::new(msg);
        req.set_timeout(timeout);
        let result = client.read_index(req).await;
        self.outcome(result, "read-index reply")
    }

    /// Asks this peer, the leader, to renew this member's lease.
    pub async fn renew(
        &mut self,
        request: &RenewRequest,
        timeout: Duration,
    ) -> Result<RenewReply, CallError> {
        let msg = self.message("renew request", request)?;
        let mut client = self.client()?;
        let mut req = tonic::Request::new(msg);
        req.set_timeout(timeout);
        let result = client.renew(req).await;
        self.outcome(result, "renew reply")
    }

    /// Forwards an Admin write to this peer, the leader (see the `Forward` RPC). The leader's
    /// error statuses come back unchanged.
    pub async fn forward(
        &mut self,
        method: &str,
        actor: &str,
        role: &str,
        request: Vec<u8>,
        timeout: Duration,
    ) -> Result<Vec<u8>, tonic::Status> {
        let mut client = self
            .client()
            .map_err(|e| tonic::Status::unavailable(e.message()))?;
        let mut req = tonic::Request::new(pb::ForwardRequest {
            from: self.me,
            to: self.target,
            method: method.to_string(),
            actor: actor.to_string(),
            role: role.to_string(),
            request,
            generation: self.pool.generation(),
        });
        req.set_timeout(timeout);
        client.forward(req).await.map(|r| r.into_inner().response)
    }

    fn request<T>(msg: T, option: &RPCOption) -> tonic::Request<T> {
        let mut req = tonic::Request::new(msg);
        req.set_timeout(option.hard_ttl());
        req
    }
}

/// Requests of a `StreamAppend` stream sent and not answered yet, oldest first: when each went
/// out. Shared by the sending side (which pushes) and the answering side (which pops).
#[derive(Default)]
struct Unanswered {
    sent: Mutex<VecDeque<Instant>>,
    /// Wakes the answering side when a request goes out while it waits with none unanswered.
    more: tokio::sync::Notify,
    /// Why the sending side stopped early (a request that could not be encoded).
    failed: Mutex<Option<String>>,
}

impl Unanswered {
    fn push(&self) {
        lock(&self.sent).push_back(Instant::now());
        self.more.notify_one();
    }

    fn oldest(&self) -> Option<Instant> {
        lock(&self.sent).front().copied()
    }

    fn pop(&self) -> bool {
        lock(&self.sent).pop_front().is_some()
    }
}

/// Locks `m`; a panic while it was held leaves nothing half-done in these maps and queues.
fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|e| e.into_inner())
}

/// Ends the sending side of a `StreamAppend` stream when dropped.
///
/// The sending side is polled by the HTTP/2 connection, not by whoever reads the answers, so
/// it would otherwise outlive them. openraft's request streams of one follower share their
/// state: a sending side left running after its session ended (an error, a timeout) would
/// take the next session's entries and send them down a stream nobody reads any more.
struct StopSending(futures::stream::AbortHandle);

impl Drop for StopSending {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// The answering side of a `StreamAppend` stream.
struct Answers {
    peer: PeerClient,
    stream: tonic::Streaming<pb::RaftMessage>,
    unanswered: Arc<Unanswered>,
    /// Longest wait for the answer to the oldest unanswered request.
    patience: Duration,
    /// Ends the sending side when the answers are dropped.
    _stop_sending: StopSending,
}

type AppendResult = Result<StreamAppendResult<TypeConfig>, RPCError<TypeConfig>>;

impl Answers {
    /// The next answer; `None` when the stream ended. An error is the last item.
    async fn next(&mut self) -> Option<AppendResult> {
        loop {
            let received = match self.unanswered.oldest() {
                Some(sent) => {
                    let deadline = tokio::time::Instant::from_std(sent + self.patience);
                    match tokio::time::timeout_at(deadline, self.stream.message()).await {
                        Ok(received) => received,
                        Err(_) => {
                            let why = format!(
                                "peer {} did not answer an append within {} ms",
                                self.peer.target,
                                self.patience.as_millis()
                            );
                            self.peer.pool.mark_unreachable(
                                self.peer.target,
                                &self.peer.node,
                                &why,
                            );
                            return Some(Err(CallError::Unreachable(why).into_rpc()));
                        }
                    }
                }
                // Nothing to wait for: an answer now would be a protocol error, and the stream
                // may stay quiet for long (no new entries).
                None => tokio::select! {
                    received = self.stream.message() => received,
                    () = self.unanswered.more.notified() => continue,
                },
            };
            return match received {
                Ok(Some(msg)) => {
                    if !self.unanswered.pop() {
                        return Some(Err(CallError::Network(format!(
                            "peer {} answered an append it was not sent",
                            self.peer.target
                        ))
                        .into_rpc()));
                    }
                    let answer: Result<StreamAppendResult<TypeConfig>, CallError> =
                        self.peer.answer(msg, "append-entries result");
                    if let Ok(result) = &answer {
                        self.peer.note_stream_result(result);
                    }
                    Some(answer.map_err(CallError::into_rpc))
                }
                Ok(None) => lock(&self.unanswered.failed)
                    .take()
                    .map(|why| Err(CallError::Network(why).into_rpc())),
                Err(status) => Some(Err(self.peer.status_error(&status).into_rpc())),
            };
        }
    }
}

/// Why a `StreamAppend` stream could not be opened.
enum OpenError {
    /// The peer does not have the RPC (an older version).
    Unimplemented,
    Call(CallError),
}

impl PeerClient {
    /// Opens a `StreamAppend` stream that sends `input` as it comes and answers in order.
    async fn open_append_stream<S>(
        &self,
        input: S,
        option: &RPCOption,
    ) -> Result<Answers, OpenError>
    where
        S: futures::Stream<Item = AppendEntriesRequest<TypeConfig>> + Send + Unpin + 'static,
    {
        use futures::StreamExt;
        let unanswered = Arc::new(Unanswered::default());
        let (abort, registration) = futures::stream::AbortHandle::new_pair();
        // From here on, every way out (an error, a timeout, the answers dropped) ends sending.
        let stop_sending = StopSending(abort);
        let requests = {
            let (peer, unanswered) = (self.clone(), unanswered.clone());
            input.scan((), move |(), rpc| {
                let msg = match peer.message("append-entries request", &rpc) {
                    Ok(msg) => {
                        unanswered.push();
                        Some(msg)
                    }
                    Err(e) => {
                        *lock(&unanswered.failed) = Some(e.message());
                        None
                    }
                };
                futures::future::ready(msg)
            })
        };
        let requests = futures::stream::Abortable::new(requests, registration);
        let mut client = self.client().map_err(OpenError::Call)?;
        // Opening waits for the peer's response headers, which it sends at once.
        let patience = option.hard_ttl();
        let opened = tokio::time::timeout(patience, client.stream_append(requests))
            .await
            .map_err(|_| {
                let why = format!(
                    "peer {} did not open an append stream within {} ms",
                    self.target,
                    patience.as_millis()
                );
                self.pool.mark_unreachable(self.target, &self.node, &why);
                OpenError::Call(CallError::Unreachable(why))
            })?;
        match opened {
            Ok(response) => Ok(Answers {
                peer: self.clone(),
                stream: response.into_inner(),
                unanswered,
                patience,
                _stop_sending: stop_sending,
            }),
            Err(status) if status.code() == tonic::Code::Unimplemented => {
                Err(OpenError::Unimplemented)
            }
            Err(status) => Err(OpenError::Call(self.status_error(&status))),
        }
    }
}

impl RaftNetworkV2<TypeConfig> for PeerClient {
    type SnapshotData = SnapshotData;

    /// Pipelined replication: requests go out as openraft produces them, without waiting for
    /// the answer to the one before (which a commit-index update right after each commit would
    /// otherwise hold up). Falls back to one request at a time for a peer that lacks
    /// `StreamAppend`.
    fn stream_append<'s, S>(
        &'s mut self,
        input: S,
        option: RPCOption,
    ) -> BoxFuture<'s, Result<BoxStream<'s, AppendResult>, RPCError<TypeConfig>>>
    where
        S: futures::Stream<Item = AppendEntriesRequest<TypeConfig>>
            + OptionalSend
            + Unpin
            + 'static,
    {
        if !self.pipelined {
            return stream_append_sequential(self, input, option);
        }
        Box::pin(async move {
            match self.open_append_stream(input, &option).await {
                Ok(answers) => {
                    let answers = futures::stream::unfold(Some(answers), |state| async move {
                        let mut answers = state?;
                        let item = answers.next().await?;
                        let more = matches!(item, Ok(Ok(_)));
                        Some((item, more.then_some(answers)))
                    });
                    Ok(Box::pin(answers) as BoxStream<'s, AppendResult>)
                }
                Err(OpenError::Unimplemented) => {
                    self.pipelined = false;
                    tracing::info!(
                        peer = self.target,
                        "peer lacks StreamAppend (an older version); replicating to it one request at a time"
                    );
                    Err(CallError::Network(format!(
                        "peer {} lacks StreamAppend; retrying one request at a time",
                        self.target
                    ))
                    .into_rpc())
                }
                Err(OpenError::Call(e)) => Err(e.into_rpc()),
            }
        })
    }

    async fn append_entries(
        &mut self,
        rpc: AppendEntriesRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<AppendEntriesResponse<TypeConfig>, RPCError<TypeConfig>> {
        let msg = self
            .message("append-entries request", &rpc)
            .map_err(CallError::into_rpc)?;
        let prev = rpc.prev_log_id.map(|l| l.index());
        let last = rpc.entries.last().map(|e| e.log_id.index()).or(prev);
        let mut client = self.client().map_err(CallError::into_rpc)?;
        let result = client.append_entries(Self::request(msg, &option)).await;
        let response: AppendEntriesResponse<TypeConfig> = self
            .outcome(result, "append-entries response")
            .map_err(CallError::into_rpc)?;
        match &response {
            AppendEntriesResponse::Success => self.note_answer(last, None),
            AppendEntriesResponse::PartialSuccess(matched) => {
                self.note_answer(matched.map(|l| l.index()), None)
            }
            AppendEntriesResponse::Conflict => {
                if let Some(prev) = prev {
                    self.note_answer(None, Some(prev));
                }
            }
            AppendEntriesResponse::HigherVote(_) => {}
        }
        Ok(response)
    }

    async fn vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let msg = self
            .message("vote request", &rpc)
            .map_err(CallError::into_rpc)?;
        let mut client = self.client().map_err(CallError::into_rpc)?;
        let result = client.vote(Self::request(msg, &option)).await;
        self.outcome(result, "vote response")
            .map_err(CallError::into_rpc)
    }

    async fn pre_vote(
        &mut self,
        rpc: VoteRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<VoteResponse<TypeConfig>, RPCError<TypeConfig>> {
        let msg = self
            .message("pre-vote request", &rpc)
            .map_err(CallError::into_rpc)?;
        let mut client = self.client().map_err(CallError::into_rpc)?;
        let result = client.pre_vote(Self::request(msg, &option)).await;
        self.outcome(result, "pre-vote response")
            .map_err(CallError::into_rpc)
    }

    async fn full_snapshot(
        &mut self,
        vote: Vote,
        snapshot: openraft::alias::SnapshotOf<TypeConfig, SnapshotData>,
        cancel: impl Future<Output = ReplicationClosed> + OptionalSend + 'static,
        option: RPCOption,
    ) -> Result<SnapshotResponse<TypeConfig>, StreamingError<TypeConfig>> {
        let meta = encode("snapshot header", &(&vote, &snapshot.meta))
            .map_err(|e| CallError::Network(e.to_string()).into_streaming())?;
        let header = pb::SnapshotChunk {
            item: Some(pb::snapshot_chunk::Item::Header(pb::SnapshotHeader {
                from: self.me,
                to: self.target,
                codec: self.pool.codec(),
                meta,
                total_bytes: snapshot.snapshot.len() as u64,
                generation: self.pool.generation(),
            })),
        };
        let data = snapshot.snapshot;
        let chunks: Vec<pb::SnapshotChunk> = data
            .chunks(SNAPSHOT_CHUNK_BYTES)
            .map(|c| pb::SnapshotChunk {
                item: Some(pb::snapshot_chunk::Item::Data(c.to_vec())),
            })
            .collect();
        let stream = futures::stream::iter(std::iter::once(header).chain(chunks));
        let mut client = self.client().map_err(CallError::into_streaming)?;
        let mut req = tonic::Request::new(stream);
        req.set_timeout(option.hard_ttl());
        let send = client.install_snapshot(req);
        let result = tokio::select! {
            result = send => result,
            closed = cancel => return Err(StreamingError::Closed(closed)),
        };
        let vote: Vote = self
            .outcome(result, "snapshot response")
            .map_err(CallError::into_streaming)?;
        Ok(SnapshotResponse { vote })
    }

    async fn transfer_leader(
        &mut self,
        req: TransferLeaderRequest<TypeConfig>,
        option: RPCOption,
    ) -> Result<TransferLeaderResponse<TypeConfig>, RPCError<TypeConfig>> {
        let msg = self
            .message("transfer-leader request", &req)
            .map_err(CallError::into_rpc)?;
        let mut client = self.client().map_err(CallError::into_rpc)?;
        let result = client.transfer_leader(Self::request(msg, &option)).await;
        self.outcome(result, "transfer-leader response")
            .map_err(CallError::into_rpc)
    }

    fn backoff(&self) -> Option<Backoff> {
        // 50 ms, doubling to a 2 s ceiling: fast when a peer restarts, quiet when it is gone.
        let steps = (0..).map(|i: u32| Duration::from_millis((50u64 << i.min(6)).min(2_000)));
        Some(Backoff::new(steps))
    }
}

#[cfg(test)]
#[path = "network_test.rs"]
mod tests;
