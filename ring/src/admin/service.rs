//! The Admin gRPC service of one member.
//!
//! Reads (`Status`, lists, `History`) are answered from this member's applied state, so they
//! work on any member, also one cut off from the leader; the response names the member and the
//! applied index. Writes go to the leader: a follower forwards the request unchanged (plus a
//! header naming itself, which stops forwarding loops) and relays the answer. On the leader a
//! write is checked, proposed through Raft, and answered once it is committed and applied.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::sync::Mutex;
use std::time::Duration;

use openraft::ServerState;
use openraft::type_config::async_runtime::watch::WatchReceiver;
use tonic::metadata::MetadataValue;
use tonic::transport::{Channel, Endpoint};
use tonic::{Request, Response, Status};

use super::client::is_connection_failure;
use super::convert::{command_error, control_plane, event, member, non_empty};
use super::{ACTOR_HEADER, FORWARDED_HEADER, retry_safe};
use crate::config::Timing;
use crate::core::limits::MAX_PROPOSAL_BYTES;
use crate::core::{Command, ControlPlaneSpec, Health, Member, MemberSpec, Proposal, Role};
use crate::membership::MembershipChanger;
use crate::pb;
use crate::pb::admin_client::AdminClient as Grpc;
use crate::raft::state_machine::Applied;
use crate::raft::types::RaftMetricsOf;
use crate::raft::{MemberNode, NodeId, RaftNode, StateMachineStore};

/// Largest Admin API message accepted, in bytes.
pub const MAX_ADMIN_MESSAGE_BYTES: usize = 4 * 1024 * 1024;
/// How long a write may take to commit before the client is told the outcome is unknown.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default time a new learner is given to catch up in `MemberAdd`.
const DEFAULT_CATCH_UP: Duration = Duration::from_secs(30);

/// The Admin service of one member.
pub struct AdminService {
    me: NodeId,
    raft: RaftNode,
    membership: MembershipChanger,
    sm: StateMachineStore,
    timing: Timing,
    leader_channels: Mutex<HashMap<String, Channel>>,
}

impl AdminService {
    /// The service of member `me`.
    pub fn new(
        me: NodeId,
        raft: RaftNode,
        membership: MembershipChanger,
        sm: StateMachineStore,
        timing: Timing,
    ) -> Self {
        Self {
            me,
            raft,
            membership,
            sm,
            timing,
            leader_channels: Mutex::new(HashMap::new()),
        }
    }

    /// The tonic server for this service, with the Admin message size limits.
    pub fn into_server(self) -> pb::admin_server::AdminServer<Self> {
        pb::admin_server::AdminServer::new(self)
            .max_decoding_message_size(MAX_ADMIN_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_ADMIN_MESSAGE_BYTES)
    }

    fn metrics(&self) -> RaftMetricsOf {
        self.raft.metrics().borrow_watched().clone()
    }

    /// Where a write must go: `None` when this member is the leader, else a client for the
    /// leader. Waits (bounded) for a leader to be known.
    async fn route<T>(
        &self,
        request: &Request<T>,
    ) -> Result<Option<(NodeId, Grpc<Channel>)>, Status> {
        let wait = Duration::from_millis(self.timing.election_timeout_max_ms * 4);
        let metrics = self
            .raft
            .wait(Some(wait))
            .metrics(|m| m.current_leader.is_some(), "a leader is known")
            .await
            .map_err(|_| {
                retry_safe(format!(
                    "no leader elected within {} ms: is a majority of members up and connected?",
                    wait.as_millis()
                ))
            })?;
        let leader = metrics.current_leader.expect("waited for a leader");
        if leader == self.me && metrics.state == ServerState::Leader {
            // A new ring registers its founders right after the first election; commands that
            // name members must wait for that, not fail with "unknown member".
            let mut applied = self.sm.watch_applied();
            let bootstrapped = tokio::time::timeout(wait, async {
                loop {
                    if self.read(|a| a.state.bootstrapped) {
                        return;
                    }
                    if applied.changed().await.is_err() {
                        return;
                    }
                }
            })
            .await;
            if bootstrapped.is_err() || !self.read(|a| a.state.bootstrapped) {
                return Err(retry_safe(
                    "the ring has a leader but has not registered its founding members yet; retry",
                ));
            }
            return Ok(None);
        }
        if let Some(by) = request.metadata().get(FORWARDED_HEADER) {
            return Err(retry_safe(format!(
                "request forwarded by member {} reached member {}, which is not the leader (leadership is moving); retry",
                by.to_str().unwrap_or("?"),
                self.me
            )));
        }
        let node = metrics
            .membership_config
            .membership()
            .get_node(&leader)
            .cloned()
            .ok_or_else(|| {
                retry_safe(format!("leader {leader} has no known address yet; retry"))
            })?;
        Ok(Some((leader, self.leader_client(&node)?)))
    }

    fn leader_client(&self, node: &MemberNode) -> Result<Grpc<Channel>, Status> {
        let mut channels = self
            .leader_channels
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        let channel = match channels.get(&node.admin_address) {
            Some(c) => c.clone(),
            None => {
                let c = Endpoint::from_shared(format!("http://{}", node.admin_address))
                    .map_err(|e| {
                        Status::internal(format!(
                            "leader admin address {}: {e}",
                            node.admin_address
                        ))
                    })?
                    .connect_timeout(Duration::from_secs(1))
                    .connect_lazy();
                channels.insert(node.admin_address.clone(), c.clone());
                c
            }
        };
        Ok(Grpc::new(channel)
            .max_decoding_message_size(MAX_ADMIN_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_ADMIN_MESSAGE_BYTES))
    }

    /// A copy of `request` to forward to the leader, marked as forwarded by this member.
    fn forwarded<T: Clone>(&self, request: &Request<T>) -> Request<T> {
        let mut metadata = request.metadata().clone();
        metadata.insert(FORWARDED_HEADER, MetadataValue::from(self.me));
        Request::from_parts(metadata, Default::default(), request.get_ref().clone())
    }

    /// Waits (bounded) until a leader other than `old` is known; used when the leader a request
    /// was forwarded to cannot be reached (it may have just died).
    async fn wait_leader_change(&self, old: NodeId) {
        let wait = Duration::from_millis(self.timing.election_timeout_max_ms * 4);
        let _ = self
            .raft
            .wait(Some(wait))
            .metrics(
                move |m| m.current_leader.is_some_and(|l| l != old),
                "a new leader",
            )
            .await;
    }

    /// Proposes `command` on this member, which must be the leader; returns the log index.
    async fn propose(
        &self,
        actor: String,
        reason: String,
        command: Command,
    ) -> Result<u64, Status> {
        let proposal = Proposal {
            command,
            at_ms: crate::time::unix_ms(),
            actor,
            reason,
        };
        proposal.validate().map_err(|e| command_error(&e))?;
        let size = serde_json::to_vec(&proposal)
            .map(|v| v.len())
            .unwrap_or(usize::MAX);
        if size > MAX_PROPOSAL_BYTES {
            return Err(Status::invalid_argument(format!(
                "request encodes to {size} bytes; the limit is {MAX_PROPOSAL_BYTES}"
            )));
        }
        let action = proposal.command.action();
        let resp = tokio::time::timeout(COMMIT_TIMEOUT, self.raft.client_write(proposal))
            .await
            .map_err(|_| {
                Status::deadline_exceeded(format!(
                    "{action} was not committed within {} s; it may still commit (check `ringctl history`). Is a majority of members up?",
                    COMMIT_TIMEOUT.as_secs()
                ))
            })?
            .map_err(|e| {
                if e.forward_to_leader().is_some() {
                    // Leadership moved before the proposal was accepted: it was not appended.
                    retry_safe(format!("{action} not accepted: this member stopped leading; retry"))
                } else {
                    Status::unavailable(format!(
                        "{action} outcome unknown: {e} (check `ringctl history` before retrying)"
                    ))
                }
            })?;
        resp.data.map_err(|e| command_error(&e))?;
        Ok(resp.log_id.index)
    }

    fn read<T>(&self, f: impl FnOnce(&Applied) -> T) -> T {
        self.sm.read(f)
    }

    /// Members as the API shows them: the registry, plus any node in the Raft configuration that
    /// is not registered yet (right after formation).
    fn members(&self, applied: &Applied) -> Vec<pb::Member> {
        let mut out: BTreeMap<NodeId, pb::Member> = applied
            .state
            .members
            .values()
            .map(|m| (m.id, member(m)))
            .collect();
        let membership = applied.last_membership.membership();
        let voters: BTreeSet<NodeId> = membership.voter_ids().collect();
        for (id, node) in membership.nodes() {
            out.entry(*id).or_insert_with(|| pb::Member {
                id: *id,
                name: node.name.clone(),
                zone: node.zone.clone(),
                address: node.address.clone(),
                admin_address: node.admin_address.clone(),
                role: if voters.contains(id) {
                    Role::Voter
                } else {
                    Role::Learner
                }
                .to_string(),
                health: Health::Unknown.to_string(),
            });
        }
        out.into_values().collect()
    }

    fn find_member(&self, reference: &str) -> Result<Member, Status> {
        if reference.is_empty() {
            return Err(Status::invalid_argument("a member id or name is needed"));
        }
        self.read(|a| a.state.member_by_ref(reference).cloned())
            .ok_or_else(|| Status::not_found(format!("unknown member {reference:?}")))
    }

    fn member_response(&self, id: NodeId, index: u64) -> Response<pb::MemberResponse> {
        let m = self.read(|a| a.state.members.get(&id).map(member));
        Response::new(pb::MemberResponse { member: m, index })
    }

    /// Waits until this (leader) member's Raft has replicated to `id` everything committed.
    async fn wait_caught_up(&self, id: NodeId, timeout: Duration) -> bool {
        let target = self.metrics().local_committed.map(|l| l.index).unwrap_or(0);
        self.raft
            .wait(Some(timeout))
            .metrics(
                move |m| {
                    m.replication
                        .as_ref()
                        .and_then(|r| r.get(&id))
                        .and_then(|matched| matched.as_ref())
                        .is_some_and(|l| l.index >= target)
                },
                format!("member {id} caught up"),
            )
            .await
            .is_ok()
    }

    async fn wait_applied(&self, index: u64) {
        let mut rx = self.sm.watch_applied();
        let _ = tokio::time::timeout(COMMIT_TIMEOUT, rx.wait_for(|i| *i >= index)).await;
    }
}

/// The actor of a request: the client-declared identity, or "anonymous".
fn actor<T>(request: &Request<T>) -> String {
    request
        .metadata()
        .get(ACTOR_HEADER)
        .and_then(|v| v.to_str().ok())
        .filter(|s| !s.is_empty())
        .map(str::to_string)
        .unwrap_or_else(|| "anonymous".into())
}

fn server_state(s: ServerState) -> &'static str {
    match s {
        ServerState::Leader => "leader",
        ServerState::Follower => "follower",
        ServerState::Candidate => "candidate",
        ServerState::Learner => "learner",
        ServerState::Shutdown => "shutdown",
    }
}

fn raft_error(action: &str, e: impl std::fmt::Display) -> Status {
    Status::failed_precondition(format!("{action}: {e}"))
}

/// Forwards the call to the leader when this member is not the leader.
/// Forwards the call to the leader when this member is not the leader. When the leader cannot
/// be reached (it may have just died), waits for a new one and tries again, a bounded number
/// of times.
macro_rules! to_leader {
    ($self:ident, $request:ident, $method:ident) => {
        let mut attempts = 0;
        while let Some((leader_id, mut leader)) = $self.route(&$request).await? {
            match leader.$method($self.forwarded(&$request)).await {
                Err(status)
                    if is_connection_failure(&status) && attempts < MAX_FORWARD_ATTEMPTS =>
                {
                    attempts += 1;
                    tracing::info!(
                        leader = leader_id,
                        "leader unreachable ({}); waiting for a new one",
                        status.message()
                    );
                    $self.wait_leader_change(leader_id).await;
                }
                result => return result,
            }
        }
    };
}

/// How often a write is re-forwarded after the leader turned out unreachable.
const MAX_FORWARD_ATTEMPTS: u32 = 3;

#[tonic::async_trait]
impl pb::admin_server::Admin for AdminService {
    async fn status(
        &self,
        _request: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        let m = self.metrics();
        let (members, control_planes, paused, applied_index) = self.read(|a| {
            (
                self.members(a),
                a.state.control_planes.values().map(control_plane).collect(),
                a.state.settings.paused,
                a.applied_index(),
            )
        });
        Ok(Response::new(pb::StatusResponse {
            leader_id: m.current_leader.unwrap_or(0),
            term: m.current_term,
            member_id: self.me,
            server_state: server_state(m.state).into(),
            applied_index,
            paused,
            members,
            control_planes,
        }))
    }

    async fn member_list(
        &self,
        _request: Request<pb::MemberListRequest>,
    ) -> Result<Response<pb::MemberListResponse>, Status> {
        let members = self.read(|a| self.members(a));
        Ok(Response::new(pb::MemberListResponse { members }))
    }

    async fn member_add(
        &self,
        request: Request<pb::MemberAddRequest>,
    ) -> Result<Response<pb::MemberAddResponse>, Status> {
        to_leader!(self, request, member_add);
        let actor = actor(&request);
        let req = request.into_inner();
        let spec = MemberSpec {
            id: req.id,
            name: req.name,
            zone: req.zone,
            address: req.address,
            admin_address: req.admin_address,
        };
        spec.validate().map_err(|e| command_error(&e))?;
        let node = MemberNode::from(&spec);
        let id = spec.id;
        let index = self
            .propose(actor, req.reason, Command::AddMember(spec))
            .await?;
        self.membership.add_learner(id, node).await.map_err(|e| {
            raft_error(
                "registered, but adding it as a Raft learner failed (it will be retried)",
                e,
            )
        })?;
        let timeout = match req.catch_up_timeout_ms {
            0 => DEFAULT_CATCH_UP,
            ms => Duration::from_millis(ms.min(600_000)),
        };
        let caught_up = self.wait_caught_up(id, timeout).await;
        let index = index.max(self.metrics().last_applied.map(|l| l.index).unwrap_or(0));
        self.wait_applied(index).await;
        let m = self.read(|a| a.state.members.get(&id).map(member));
        Ok(Response::new(pb::MemberAddResponse {
            member: m,
            caught_up,
            index,
        }))
    }

    async fn member_promote(
        &self,
        request: Request<pb::MemberRefRequest>,
    ) -> Result<Response<pb::MemberResponse>, Status> {
        to_leader!(self, request, member_promote);
        let actor = actor(&request);
        let req = request.into_inner();
        let target = self.find_member(&req.member)?;
        if target.role == Role::Voter {
            return Ok(self.member_response(target.id, self.read(Applied::applied_index)));
        }
        self.propose(actor, req.reason, Command::PromoteMember { id: target.id })
            .await?;
        let index = self
            .membership
            .promote(target.id)
            .await
            .map_err(|e| raft_error("promotion recorded, but the Raft configuration change failed (it will be retried)", e))?
            .unwrap_or_else(|| self.read(Applied::applied_index));
        self.wait_applied(index).await;
        Ok(self.member_response(target.id, index))
    }

    async fn member_remove(
        &self,
        request: Request<pb::MemberRefRequest>,
    ) -> Result<Response<pb::MemberResponse>, Status> {
        to_leader!(self, request, member_remove);
        let actor = actor(&request);
        let req = request.into_inner();
        let target = self.find_member(&req.member)?;
        let index = self
            .propose(actor, req.reason, Command::RemoveMember { id: target.id })
            .await?;
        let index = self
            .membership
            .remove(target.id)
            .await
            .map_err(|e| {
                raft_error(
                    "removal recorded, but the Raft configuration change failed (it will be retried)",
                    e,
                )
            })?
            .unwrap_or(index);
        self.wait_applied(index).await;
        Ok(Response::new(pb::MemberResponse {
            member: Some(member(&target)),
            index,
        }))
    }

    async fn control_plane_list(
        &self,
        _request: Request<pb::ControlPlaneListRequest>,
    ) -> Result<Response<pb::ControlPlaneListResponse>, Status> {
        let control_planes =
            self.read(|a| a.state.control_planes.values().map(control_plane).collect());
        Ok(Response::new(pb::ControlPlaneListResponse {
            control_planes,
        }))
    }

    async fn control_plane_get(
        &self,
        request: Request<pb::ControlPlaneGetRequest>,
    ) -> Result<Response<pb::ControlPlane>, Status> {
        let name = request.into_inner().name;
        self.read(|a| a.state.control_planes.get(&name).map(control_plane))
            .map(Response::new)
            .ok_or_else(|| Status::not_found(format!("unknown control plane {name:?}")))
    }

    async fn control_plane_add(
        &self,
        request: Request<pb::ControlPlaneAddRequest>,
    ) -> Result<Response<pb::ControlPlaneResponse>, Status> {
        to_leader!(self, request, control_plane_add);
        let actor = actor(&request);
        let req = request.into_inner();
        let spec = ControlPlaneSpec {
            name: req.name,
            home: non_empty(req.home),
            dns_name: req.dns_name,
            endpoints: req.endpoints,
            backup: req.backup,
            host: non_empty(req.host),
        };
        let name = spec.name.clone();
        let index = self
            .propose(actor, req.reason, Command::AddControlPlane(spec))
            .await?;
        self.wait_applied(index).await;
        let cp = self.read(|a| a.state.control_planes.get(&name).map(control_plane));
        Ok(Response::new(pb::ControlPlaneResponse {
            control_plane: cp,
            index,
        }))
    }

    async fn control_plane_remove(
        &self,
        request: Request<pb::ControlPlaneRemoveRequest>,
    ) -> Result<Response<pb::ControlPlaneResponse>, Status> {
        to_leader!(self, request, control_plane_remove);
        let actor = actor(&request);
        let req = request.into_inner();
        let before = self.read(|a| a.state.control_planes.get(&req.name).map(control_plane));
        let index = self
            .propose(
                actor,
                req.reason,
                Command::RemoveControlPlane { name: req.name },
            )
            .await?;
        Ok(Response::new(pb::ControlPlaneResponse {
            control_plane: before,
            index,
        }))
    }

    async fn history(
        &self,
        request: Request<pb::HistoryRequest>,
    ) -> Result<Response<pb::HistoryResponse>, Status> {
        let limit = request.into_inner().limit as usize;
        let events = self.read(|a| a.state.history.newest(limit).iter().map(event).collect());
        Ok(Response::new(pb::HistoryResponse { events }))
    }

    async fn leader_transfer(
        &self,
        request: Request<pb::LeaderTransferRequest>,
    ) -> Result<Response<pb::LeaderTransferResponse>, Status> {
        to_leader!(self, request, leader_transfer);
        let req = request.into_inner();
        let m = self.metrics();
        let voters: Vec<NodeId> = m.membership_config.membership().voter_ids().collect();
        let to = if req.to.is_empty() {
            // The most up-to-date other voter.
            voters
                .iter()
                .copied()
                .filter(|id| *id != self.me)
                .max_by_key(|id| {
                    m.replication
                        .as_ref()
                        .and_then(|r| r.get(id).cloned().flatten())
                        .map(|l| l.index)
                })
                .ok_or_else(|| {
                    Status::failed_precondition("there is no other voter to hand leadership to")
                })?
        } else {
            let target = self.find_member(&req.to)?;
            if !voters.contains(&target.id) {
                return Err(Status::failed_precondition(format!(
                    "member {} ({}) is not a voter; only voters can lead",
                    target.name, target.id
                )));
            }
            target.id
        };
        if to == self.me {
            return Ok(Response::new(pb::LeaderTransferResponse { leader_id: to }));
        }
        self.raft
            .trigger()
            .transfer_leader(to)
            .await
            .map_err(|e| Status::unavailable(format!("leader transfer: {e}")))?;
        let wait = Duration::from_millis(self.timing.election_timeout_max_ms * 10);
        self.raft
            .wait(Some(wait))
            .current_leader(to, "leader transfer")
            .await
            .map_err(|_| {
                Status::deadline_exceeded(format!(
                    "member {to} did not take over within {} ms; leadership stays where it is",
                    wait.as_millis()
                ))
            })?;
        Ok(Response::new(pb::LeaderTransferResponse { leader_id: to }))
    }

    async fn set_paused(
        &self,
        request: Request<pb::SetPausedRequest>,
    ) -> Result<Response<pb::SetPausedResponse>, Status> {
        to_leader!(self, request, set_paused);
        let actor = actor(&request);
        let req = request.into_inner();
        let index = self
            .propose(actor, req.reason, Command::SetPaused { paused: req.paused })
            .await?;
        Ok(Response::new(pb::SetPausedResponse {
            paused: req.paused,
            index,
        }))
    }
}
