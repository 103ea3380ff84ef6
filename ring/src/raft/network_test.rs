//! The pipelined append stream (`StreamAppend`) against a real follower: a Raft node with its
//! redb stores behind the peer service, over gRPC on loopback.

use std::time::Duration;

use futures::StreamExt;
use futures::future::BoxFuture;
use openraft::EntryPayload;
use openraft::raft::StreamAppendError;
use tokio::sync::mpsc;
use tokio_stream::wrappers::ReceiverStream;
use tonic::{Request, Response, Status, Streaming};

use super::*;
use crate::raft::contact::LeaderContact;
use crate::raft::service::{ForwardHandler, Handlers, PeerService, RenewHandler};
use crate::raft::types::{Entry, log_id};
use crate::raft::{LogStore, RaftNode, StateMachineStore, storage};
use crate::tls::server::SeenCertificates;

/// The follower's node id; the requests come from leader 1 in term 1.
const FOLLOWER: NodeId = 2;

struct Refuse;

impl ForwardHandler for Refuse {
    fn handle(&self, _: pb::ForwardRequest) -> BoxFuture<'_, Result<Vec<u8>, Status>> {
        Box::pin(async { Err(Status::unimplemented("not in this test")) })
    }
}

impl RenewHandler for Refuse {
    fn renew(&self, _: NodeId, _: RenewRequest) -> BoxFuture<'_, Result<RenewReply, Status>> {
        Box::pin(async { Err(Status::unimplemented("not in this test")) })
    }
}

/// How the follower's peer service treats `StreamAppend`.
#[derive(Clone, Copy, PartialEq)]
enum Mode {
    /// As ringd does.
    Serve,
    /// As a member of an older version: the RPC does not exist.
    Lack,
    /// Opens the stream, never answers.
    Mute,
}

/// The peer service with `StreamAppend` replaced as `mode` says; everything else unchanged.
struct Wrapped {
    inner: PeerService,
    mode: Mode,
}

type Unary = Result<Response<pb::RaftMessage>, Status>;

#[tonic::async_trait]
impl pb::raft_server::Raft for Wrapped {
    async fn vote(&self, r: Request<pb::RaftMessage>) -> Unary {
        self.inner.vote(r).await
    }
    async fn pre_vote(&self, r: Request<pb::RaftMessage>) -> Unary {
        self.inner.pre_vote(r).await
    }
    async fn append_entries(&self, r: Request<pb::RaftMessage>) -> Unary {
        self.inner.append_entries(r).await
    }
    type StreamAppendStream = <PeerService as pb::raft_server::Raft>::StreamAppendStream;
    async fn stream_append(
        &self,
        r: Request<Streaming<pb::RaftMessage>>,
    ) -> Result<Response<Self::StreamAppendStream>, Status> {
        match self.mode {
            Mode::Serve => self.inner.stream_append(r).await,
            Mode::Lack => Err(Status::unimplemented("unknown method StreamAppend")),
            Mode::Mute => Ok(Response::new(futures::stream::pending().boxed())),
        }
    }
    async fn install_snapshot(&self, r: Request<Streaming<pb::SnapshotChunk>>) -> Unary {
        self.inner.install_snapshot(r).await
    }
    async fn transfer_leader(&self, r: Request<pb::RaftMessage>) -> Unary {
        self.inner.transfer_leader(r).await
    }
    async fn ping(&self, r: Request<pb::RaftMessage>) -> Unary {
        self.inner.ping(r).await
    }
    async fn forward(
        &self,
        r: Request<pb::ForwardRequest>,
    ) -> Result<Response<pb::ForwardReply>, Status> {
        self.inner.forward(r).await
    }
    async fn renew(&self, r: Request<pb::RaftMessage>) -> Unary {
        self.inner.renew(r).await
    }
    async fn read_index(&self, r: Request<pb::RaftMessage>) -> Unary {
        self.inner.read_index(r).await
    }
}

/// A follower (an empty Raft node that neither elects nor leads) serving the peer protocol on
/// a loopback port.
struct Follower {
    raft: RaftNode,
    address: String,
    /// What the follower knows of its own divergence (nothing, unless a test sets it).
    divergence: crate::raft::divergence::OwnDivergence,
    _dir: tempfile::TempDir,
}

impl Follower {
    async fn start(mode: Mode) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let db = storage::open(dir.path(), FOLLOWER).unwrap();
        let state = StateMachineStore::open(db.clone()).await.unwrap();
        let config = openraft::Config {
            enable_elect: false,
            enable_heartbeat: false,
            ..Default::default()
        }
        .validate()
        .unwrap();
        let raft = RaftNode::new(
            FOLLOWER,
            Arc::new(config),
            PeerNetwork::new(FOLLOWER, Arc::new(PeerPool::new(Security::Insecure))),
            LogStore::new(db, dir.path()).unwrap(),
            state.clone(),
        )
        .await
        .unwrap();
        let service = PeerService::new(
            FOLLOWER,
            raft.clone(),
            state,
            LeaderContact::default(),
            SeenCertificates::default(),
            Handlers {
                forward: Arc::new(Refuse),
                renew: Arc::new(Refuse),
            },
        );
        let divergence = crate::raft::divergence::OwnDivergence::default();
        let service = service.with_divergence(divergence.clone());
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap().to_string();
        let incoming = crate::tls::server::incoming(listener, Security::Insecure, "peer");
        let server = pb::raft_server::RaftServer::new(Wrapped {
            inner: service,
            mode,
        });
        tokio::spawn(
            tonic::transport::Server::builder()
                .add_service(server)
                .serve_with_incoming(incoming),
        );
        Self {
            raft,
            address,
            divergence,
            _dir: dir,
        }
    }

    /// The leader's client for this follower.
    fn client(&self) -> PeerClient {
        let node = MemberNode {
            name: "b".into(),
            zone: "zone-b".into(),
            address: self.address.clone(),
            admin_address: "127.0.0.1:1".into(),
        };
        PeerNetwork::new(1, Arc::new(PeerPool::new(Security::Insecure))).client(FOLLOWER, &node)
    }

    /// Waits until the follower's log ends at `index`.
    async fn wait_log(&self, index: u64) {
        self.raft
            .wait(Some(Duration::from_secs(10)))
            .metrics(
                |m| m.last_log_index == Some(index),
                "the follower's log ends at the index",
            )
            .await
            .unwrap_or_else(|e| panic!("waiting for log index {index}: {e}"));
    }
}

/// An append from leader 1 (term 1) of blank entries `indexes`, after `prev` (a log starts at
/// index 0).
fn append(prev: Option<u64>, indexes: std::ops::Range<u64>) -> AppendEntriesRequest<TypeConfig> {
    AppendEntriesRequest {
        vote: Vote::new_committed(1, 1),
        prev_log_id: prev.map(|i| log_id(1, 1, i)),
        leader_commit: None,
        entries: indexes
            .map(|i| Entry {
                log_id: log_id(1, 1, i),
                payload: EntryPayload::Blank,
            })
            .collect(),
    }
}

fn option() -> RPCOption {
    RPCOption::new(Duration::from_millis(500))
}

/// Opens a pipelined stream from `client`: where to put requests, and the answers.
async fn open(
    client: &mut PeerClient,
) -> (
    mpsc::Sender<AppendEntriesRequest<TypeConfig>>,
    BoxStream<'_, AppendResult>,
) {
    let (tx, rx) = mpsc::channel(8);
    let answers = client
        .stream_append(ReceiverStream::new(rx), option())
        .await
        .expect("the stream opens");
    (tx, answers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn appends_go_out_before_earlier_answers_are_read_and_answers_come_in_order() {
    let follower = Follower::start(Mode::Serve).await;
    let mut client = follower.client();
    let (tx, mut answers) = open(&mut client).await;
    tx.send(append(None, 0..1)).await.unwrap();
    tx.send(append(Some(0), 1..3)).await.unwrap();
    // No answer has been read: one request at a time would not have sent the second.
    follower.wait_log(2).await;
    let first = answers.next().await.expect("an answer").expect("no error");
    let second = answers.next().await.expect("an answer").expect("no error");
    assert_eq!(first, Ok(Some(log_id(1, 1, 0))));
    assert_eq!(second, Ok(Some(log_id(1, 1, 2))));
    // The stream stays open for more.
    tx.send(append(Some(2), 3..4)).await.unwrap();
    let third = answers.next().await.expect("an answer").expect("no error");
    assert_eq!(third, Ok(Some(log_id(1, 1, 3))));
    // The leader closes its side: the answers end.
    drop(tx);
    assert!(answers.next().await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dropping_the_answers_stops_the_sending_side() {
    // openraft ends a session by dropping the answers; the requests' source must be let go
    // then, or a later session's entries would go down this stream.
    let follower = Follower::start(Mode::Serve).await;
    let mut client = follower.client();
    let (tx, mut answers) = open(&mut client).await;
    tx.send(append(None, 0..1)).await.unwrap();
    let first = answers.next().await.expect("an answer").expect("no error");
    assert_eq!(first, Ok(Some(log_id(1, 1, 0))));
    drop(answers);
    tokio::time::timeout(Duration::from_secs(5), tx.closed())
        .await
        .expect("the sending side let go of the requests' source");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_conflict_is_the_last_answer() {
    let follower = Follower::start(Mode::Serve).await;
    let mut client = follower.client();
    let (tx, mut answers) = open(&mut client).await;
    tx.send(append(None, 0..1)).await.unwrap();
    // Index 5 does not follow the follower's log (it ends at 0).
    tx.send(append(Some(5), 6..7)).await.unwrap();
    tx.send(append(Some(0), 1..2)).await.unwrap();
    let first = answers.next().await.expect("an answer").expect("no error");
    assert_eq!(first, Ok(Some(log_id(1, 1, 0))));
    let second = answers.next().await.expect("an answer").expect("no error");
    assert_eq!(second, Err(StreamAppendError::Conflict(log_id(1, 1, 5))));
    assert!(answers.next().await.is_none(), "nothing after the conflict");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_message_the_follower_refuses_ends_the_stream_with_its_error_after_earlier_answers() {
    let follower = Follower::start(Mode::Serve).await;
    let client = follower.client();
    let message = |rpc| {
        client
            .message("append", &rpc)
            .unwrap_or_else(|e| panic!("{}", e.message()))
    };
    let good = message(append(None, 0..1));
    let mut misaddressed = message(append(Some(0), 1..2));
    misaddressed.to = 9;
    let mut raw = client.client().expect("a client");
    let mut answers = raw
        .stream_append(futures::stream::iter([good, misaddressed]))
        .await
        .expect("the stream opens")
        .into_inner();
    let first = answers
        .message()
        .await
        .expect("no error")
        .expect("an answer");
    let first: StreamAppendResult<TypeConfig> = decode("answer", &first.payload).unwrap();
    assert_eq!(first, Ok(Some(log_id(1, 1, 0))));
    let refused = answers.message().await.expect_err("the refusal");
    assert_eq!(
        refused.code(),
        tonic::Code::FailedPrecondition,
        "{refused:?}"
    );
    assert!(
        refused.message().contains("addressed to member 9"),
        "{refused:?}"
    );
    follower.wait_log(0).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_without_stream_append_gets_one_request_at_a_time() {
    let follower = Follower::start(Mode::Lack).await;
    let mut client = follower.client();
    let first_try = client
        .stream_append(futures::stream::iter([append(None, 0..1)]), option())
        .await
        .map(|_| ());
    let Err(RPCError::Network(e)) = first_try else {
        panic!("expected a network error, got {first_try:?}");
    };
    assert!(e.to_string().contains("lacks StreamAppend"), "{e}");
    assert!(!client.pipelined);
    // openraft retries with a new stream, which now goes one request at a time.
    let requests = [append(None, 0..1), append(Some(0), 1..2)];
    let answers: Vec<_> = client
        .stream_append(futures::stream::iter(requests), option())
        .await
        .expect("the sequential stream")
        .collect()
        .await;
    let answers: Vec<_> = answers.into_iter().map(|a| a.expect("no error")).collect();
    assert_eq!(
        answers,
        [Ok(Some(log_id(1, 1, 0))), Ok(Some(log_id(1, 1, 1)))]
    );
    follower.wait_log(1).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_follower_that_does_not_answer_is_reported_unreachable_within_the_rpc_time() {
    let follower = Follower::start(Mode::Mute).await;
    let mut client = follower.client();
    let (tx, mut answers) = open(&mut client).await;
    // Nothing sent, nothing owed: no error however long the stream stays quiet.
    let quiet = tokio::time::timeout(Duration::from_millis(800), answers.next()).await;
    assert!(
        quiet.is_err(),
        "an idle stream must not fail: {:?}",
        quiet.map(|_| ())
    );
    let sent = std::time::Instant::now();
    tx.send(append(None, 0..1)).await.unwrap();
    let answer = tokio::time::timeout(Duration::from_secs(5), answers.next())
        .await
        .expect("an error within the RPC time, not a hang")
        .expect("an item");
    let Err(RPCError::Unreachable(e)) = answer else {
        panic!("expected unreachable, got {answer:?}");
    };
    assert!(e.to_string().contains("did not answer"), "{e}");
    let waited = sent.elapsed();
    assert!(
        waited >= Duration::from_millis(450) && waited < Duration::from_secs(3),
        "{waited:?}"
    );
    assert!(answers.next().await.is_none(), "nothing after the error");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_diverged_follower_grants_no_vote_until_its_log_holds_what_it_acknowledged() {
    let follower = Follower::start(Mode::Serve).await;
    let mut client = follower.client();
    let (tx, mut answers) = open(&mut client).await;
    tx.send(append(None, 0..3)).await.unwrap();
    let answer = answers.next().await.expect("an answer").expect("no error");
    assert_eq!(answer, Ok(Some(log_id(1, 1, 2))));
    drop((tx, answers));
    // A candidate of term 2 whose log ends at index 2: a member whose log is no longer than
    // that grants it.
    let request = || VoteRequest::new(Vote::new(2, 3), Some(log_id(1, 1, 2)));
    follower
        .divergence
        .learn(&crate::raft::divergence::Divergence {
            acknowledged_index: 9,
            reason: "lost 3..=9".into(),
        });
    let refused = client.vote(request(), option()).await;
    let Err(RPCError::Network(e)) = &refused else {
        panic!("expected the vote refused, got {refused:?}");
    };
    assert!(
        e.to_string().contains("grants no vote") && e.to_string().contains("up to 9"),
        "{e}"
    );
    let pre = client.pre_vote(request(), option()).await;
    assert!(pre.is_err(), "a pre-vote is refused too: {pre:?}");
    // Nothing reached openraft: its vote is still the leader's of term 1.
    let vote = openraft::type_config::async_runtime::watch::WatchReceiver::borrow_watched(
        &follower.raft.metrics(),
    )
    .vote;
    assert_eq!(vote.leader_id.term, 1, "{vote:?}");

    // Once its log holds what it acknowledged, it votes as any member.
    let mut client = follower.client();
    let (tx, mut answers) = open(&mut client).await;
    tx.send(append(Some(2), 3..10)).await.unwrap();
    let answer = answers.next().await.expect("an answer").expect("no error");
    assert_eq!(answer, Ok(Some(log_id(1, 1, 9))));
    drop((tx, answers));
    // (As part of a leadership transfer: openraft refuses any other candidate while the
    // leader of term 1, whose appends it just took, may still hold its lease.)
    let mut request = VoteRequest::new(Vote::new(2, 3), Some(log_id(1, 1, 9)));
    request.leadership_transfer = true;
    let granted = client.vote(request, option()).await.expect("an answer");
    assert!(granted.is_granted_to(&Vote::new(2, 3)), "{granted:?}");
}
