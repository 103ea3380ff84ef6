//! The Admin gRPC service of one member.
//!
//! Every method first asks [`caller`] whether the client may read or write (see
//! [`super::auth`]). Reads (`Status`, lists, `History`) are answered from this member's applied
//! state once it has applied up to the leader's read index ([`super::freshness`]), so they are
//! linearizable on any member; a member cut off from the leader, or a client asking `stale`,
//! gets its local state with a [`pb::ReadFreshness`] that says how stale it may be. Writes go to the leader: a follower forwards the request over
//! the peer port (`Forward` RPC, with the client's authenticated identity) and relays the
//! answer; a forwarded request is never forwarded again. On the leader a write is checked,
//! proposed through Raft, and answered once it is committed and applied.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;
use std::time::Duration;

use openraft::ServerState;
use openraft::type_config::async_runtime::watch::WatchReceiver;
use prost::Message;
use tonic::{Request, Response, Status};

use super::auth::{Access, Caller, Forwarded, caller};
use super::convert::{command_error, control_plane, event, member, non_empty, revoked_certificate};
use super::freshness::Reads;
use super::{MAX_ADMIN_MESSAGE_BYTES, is_connection_failure, retry_safe};
use crate::config::Timing;
use crate::core::controller::Policy;
use crate::core::etcd_cluster::Tolerance;
use crate::core::limits::MAX_PROPOSAL_BYTES;
use crate::core::operator::{self, OperatorError, OperatorMove, PlannedMove};
use crate::core::{Command, ControlPlaneSpec, Health, Member, MemberSpec, Proposal, Role};
use crate::dns::keeper::DnsStatus;
use crate::membership::MembershipChanger;
use crate::pb;
use crate::pb::admin_server::Admin;
use crate::raft::network::{PeerNetwork, PeerPool};
use crate::raft::service::ForwardHandler;
use crate::raft::state_machine::Applied;
use crate::raft::types::RaftMetricsOf;
use crate::raft::{MemberNode, NodeId, RaftNode, StateMachineStore};
use crate::tls::TlsStore;
use crate::tls::server::SeenCertificates;

/// How long a write may take to commit before the client is told the outcome is unknown.
const COMMIT_TIMEOUT: Duration = Duration::from_secs(10);
/// Default time a new learner is given to catch up in `MemberAdd`.
const DEFAULT_CATCH_UP: Duration = Duration::from_secs(30);
/// Longest catch-up time a `MemberAdd` may ask for.
const MAX_CATCH_UP: Duration = Duration::from_secs(600);

/// How the Admin service reaches other members, and what it reports about TLS.
pub struct Transport {
    /// Connections to the other members (forwarding goes over the peer port).
    pub pool: Arc<PeerPool>,
    /// This member's certificates; `None` without TLS.
    pub tls: Option<Arc<TlsStore>>,
    /// Certificates the other members presented.
    pub seen: SeenCertificates,
    /// When a leader last reached this member.
    pub contact: crate::raft::contact::LeaderContact,
}

/// The Admin service of one member.
pub struct AdminService {
    me: NodeId,
    raft: RaftNode,
    membership: MembershipChanger,
    sm: StateMachineStore,
    timing: Timing,
    transport: Transport,
    policy: Policy,
    dns_ttl_s: u32,
    dns: DnsStatus,
    reads: Reads,
    disk: crate::raft::disk::DiskHealth,
    limits: Arc<super::limits::IdentityLimits>,
    upgrade: super::upgrade::Upgrade,
}

/// The Admin server with its interceptor (admits admin and viewer certificates only).
pub type AdminServer = tonic::service::interceptor::InterceptedService<
    pb::admin_server::AdminServer<AdminService>,
    fn(Request<()>) -> Result<Request<()>, Status>,
>;

impl AdminService {
    /// The service of member `me`.
    pub fn new(
        me: NodeId,
        raft: RaftNode,
        membership: MembershipChanger,
        sm: StateMachineStore,
        timing: Timing,
        transport: Transport,
        policy: Policy,
    ) -> Self {
        let reads = Reads::new(
            me,
            raft.clone(),
            sm.clone(),
            transport.pool.clone(),
            transport.contact.clone(),
            &timing,
        );
        Self {
            me,
            raft,
            membership,
            sm,
            timing,
            transport,
            policy,
            dns_ttl_s: 30,
            dns: DnsStatus::default(),
            reads,
            disk: Default::default(),
            limits: super::limits::IdentityLimits::new(Default::default()),
            upgrade: Default::default(),
        }
    }

    /// Where members' binaries are reported, and when the version is raised (`[upgrade]`).
    pub fn with_upgrade(mut self, upgrade: super::upgrade::Upgrade) -> Self {
        self.upgrade = upgrade;
        self
    }

    /// Limits each client identity as `settings` says (`[admin]`).
    pub fn with_limits(mut self, settings: crate::config::AdminSettings) -> Self {
        self.limits = super::limits::IdentityLimits::new(settings);
        self
    }

    /// Who sent `request`, if they may do `access` (else `PERMISSION_DENIED`), and their place
    /// among the requests in flight their identity may have on this member (else
    /// `RESOURCE_EXHAUSTED`, see [`super::limits`]); the place is freed when it is dropped.
    fn admit<T>(
        &self,
        request: &Request<T>,
        access: Access,
    ) -> Result<(Caller, super::limits::InFlight), Status> {
        let caller = caller(request, access)?;
        let in_flight = self.limits.admit(request, &caller.actor, access)?;
        Ok((caller, in_flight))
    }

    /// Where the log store says whether its disk has room (see [`crate::raft::disk`]).
    pub fn with_disk(mut self, disk: crate::raft::disk::DiskHealth) -> Self {
        self.disk = disk;
        self
    }

    /// Sets the TTL of the records the ring publishes, and where the DNS keeper reports.
    pub fn with_dns(mut self, ttl_s: u32, status: DnsStatus) -> Self {
        self.dns_ttl_s = ttl_s;
        self.dns = status;
        self
    }

    /// The tonic server for this service, with the Admin message size limits and the
    /// interceptor that refuses clients without an admin or viewer certificate.
    pub fn server(self: &Arc<Self>) -> AdminServer {
        let server = pb::admin_server::AdminServer::from_arc(self.clone())
            .max_decoding_message_size(MAX_ADMIN_MESSAGE_BYTES)
            .max_encoding_message_size(MAX_ADMIN_MESSAGE_BYTES);
        tonic::service::interceptor::InterceptedService::new(
            server,
            super::auth::admit_operators as fn(_) -> _,
        )
    }

    fn metrics(&self) -> RaftMetricsOf {
        self.raft.metrics().borrow_watched().clone()
    }

    /// Where a write must go: `None` when this member is the leader, else the leader. Waits
    /// (bounded) for a leader to be known.
    async fn route<T>(&self, request: &Request<T>) -> Result<Option<(NodeId, MemberNode)>, Status> {
        let wait = Duration::from_millis(self.timing.leader_wait_ms());
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
        if let Some(forwarded) = request.extensions().get::<Forwarded>() {
            return Err(retry_safe(format!(
                "request forwarded by member {} reached member {}, which is not the leader (leadership is moving); retry",
                forwarded.by, self.me
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
        Ok(Some((leader, node)))
    }

    /// Runs a write on the leader when this member is not the leader: `Ok(None)` means "this
    /// member leads, go on here". When the leader cannot be reached (it may have just died),
    /// waits for a new one and tries again, a bounded number of times.
    async fn forward<Req, Resp>(
        &self,
        request: &Request<Req>,
        caller: &Caller,
        method: &'static str,
        timeout: Duration,
    ) -> Result<Option<Response<Resp>>, Status>
    where
        Req: Message,
        Resp: Message + Default,
    {
        let role = caller.role.map(|r| r.as_str()).unwrap_or("");
        let mut attempts = 0;
        while let Some((leader_id, node)) = self.route(request).await? {
            let mut client =
                PeerNetwork::new(self.me, self.transport.pool.clone()).client(leader_id, &node);
            let encoded = request.get_ref().encode_to_vec();
            match client
                .forward(method, &caller.actor, role, encoded, timeout)
                .await
            {
                Ok(bytes) => {
                    return Resp::decode(bytes.as_slice())
                        .map(|r| Some(Response::new(r)))
                        .map_err(|e| {
                            Status::internal(format!(
                                "leader {leader_id} sent an undecodable {method} reply: {e}"
                            ))
                        });
                }
                Err(status)
                    if is_connection_failure(&status) && attempts < MAX_FORWARD_ATTEMPTS =>
                {
                    attempts += 1;
                    tracing::info!(
                        leader = leader_id,
                        "leader unreachable ({}); waiting for a new one",
                        status.message()
                    );
                    self.wait_leader_change(leader_id).await;
                }
                Err(status) => return Err(status),
            }
        }
        Ok(None)
    }

    /// Waits (bounded) until a leader other than `old` is known; used when the leader a request
    /// was forwarded to cannot be reached (it may have just died).
    async fn wait_leader_change(&self, old: NodeId) {
        let wait = Duration::from_millis(self.timing.leader_wait_ms());
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
        // The gate of rolling upgrades: nothing a member of an older release cannot read.
        self.read(|a| a.state.settings.ring_version.admits(&proposal.command))
            .map_err(|e| command_error(&e))?;
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

    /// Control plane `name` as the API shows it, if registered.
    fn find_control_plane(&self, name: &str) -> Option<pb::ControlPlane> {
        self.read(|a| {
            a.state
                .control_planes
                .get(name)
                .map(Box::as_ref)
                .map(|cp| control_plane(cp, &a.state))
        })
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
                cordoned: false,
                labels: BTreeMap::new(),
                certificate_revoked: String::new(),
                diverged: String::new(),
                binary: None,
            });
        }
        for (id, version) in self.upgrade.versions() {
            if let Some(m) = out.get_mut(&id) {
                m.binary = Some(super::upgrade::binary(&version));
            }
        }
        let own = self
            .transport
            .pool
            .own_divergence()
            .get()
            .map(|d| (self.me, d));
        for (id, d) in self.transport.pool.diverged().all().into_iter().chain(own) {
            if let Some(m) = out.get_mut(&id)
                && m.diverged.is_empty()
            {
                m.diverged = d.reason;
            }
        }
        if let Some(store) = &self.transport.tls {
            let revoked = self.transport.seen.revoked(store.revocations());
            for m in out.values_mut() {
                if let Some(why) = revoked.get(&m.name) {
                    m.certificate_revoked = why.clone();
                }
            }
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

    /// Why the ring cannot act, as this member sees it; empty when it can.
    fn problem(&self, m: &RaftMetricsOf) -> String {
        let quorum = self.quorum_problem(m);
        match self.disk.problem() {
            Some(disk) if quorum.is_empty() => disk,
            Some(disk) => format!("{disk}; {quorum}"),
            None => quorum,
        }
    }

    fn quorum_problem(&self, m: &RaftMetricsOf) -> String {
        const CONSEQUENCE: &str = "Nothing moves until a quorum is back, and control planes stop where their leases run out";
        let stale_ms = self.timing.leader_silence_ms();
        let membership = m.membership_config.membership();
        let voters: Vec<NodeId> = membership.voter_ids().collect();
        let majority = voters.len() / 2 + 1;
        match m.current_leader {
            None => format!(
                "no leader: member {} cannot reach a majority of the {} voters. {CONSEQUENCE}",
                self.me,
                voters.len()
            ),
            Some(leader) if leader == self.me => {
                use openraft::type_config::async_runtime::Instant as _;
                let answering = 1 + voters
                    .iter()
                    .filter(|id| **id != self.me)
                    .filter(|id| {
                        m.heartbeat
                            .as_ref()
                            .and_then(|h| h.get(id).cloned().flatten())
                            .is_some_and(|at| at.elapsed().as_millis() < u128::from(stale_ms))
                    })
                    .count();
                if answering < majority {
                    format!(
                        "this leader hears from {answering} of {} voters, fewer than the {majority} a quorum needs. {CONSEQUENCE}",
                        voters.len()
                    )
                } else {
                    String::new()
                }
            }
            Some(leader) => match self.transport.contact.since() {
                Some(since) if since.as_millis() >= u128::from(stale_ms) => format!(
                    "no contact with the leader ({leader}) for {} ms: a majority of the voters may be unreachable. {CONSEQUENCE}",
                    since.as_millis()
                ),
                _ => String::new(),
            },
        }
    }

    /// The issuer a revocation names: `given`, or the issuer of this member's own certificate
    /// (the ring's CA) when empty; and the serial in the ring's form.
    fn revocation_target(&self, issuer: &str, serial: &str) -> Result<(String, String), Status> {
        let Some(store) = self.transport.tls.as_ref() else {
            return Err(Status::failed_precondition(
                "the ring runs without TLS (insecure = true): it authenticates no certificate, \
                 so there is nothing to revoke",
            ));
        };
        let serial = crate::core::revocation::serial(serial).map_err(|e| command_error(&e))?;
        let issuer = if issuer.trim().is_empty() {
            let material = store.current();
            let leaf = material
                .certified_key
                .cert
                .first()
                .ok_or_else(|| Status::internal("this member has no certificate"))?;
            crate::tls::revocation::cert_key(leaf.as_ref())
                .map(|(issuer, _)| issuer)
                .ok_or_else(|| Status::internal("this member's certificate cannot be parsed"))?
        } else {
            issuer.trim().to_string()
        };
        Ok((issuer, serial))
    }

    /// Whether this member's own certificate is the one `serial` of `issuer`.
    fn own_certificate_is(&self, issuer: &str, serial: &str) -> bool {
        let Some(store) = self.transport.tls.as_ref() else {
            return false;
        };
        let material = store.current();
        material
            .certified_key
            .cert
            .first()
            .and_then(|leaf| crate::tls::revocation::cert_key(leaf.as_ref()))
            .is_some_and(|(i, s)| i == issuer && s == serial)
    }

    fn tls_status(&self) -> Option<pb::TlsStatus> {
        let status = self.transport.tls.as_ref()?.status();
        Some(pb::TlsStatus {
            identity: status.identity,
            certificate_sha256: status.cert_sha256,
            ca_sha256: status.ca_sha256,
            not_after_unix_s: status.not_after_unix_s,
            loaded_at_unix_ms: status.loaded_at_unix_ms,
            reload_error: status.reload_error,
            peers: self
                .transport
                .seen
                .snapshot()
                .into_iter()
                .map(
                    |(member, (certificate_sha256, seen_at_unix_ms))| pb::PeerCertificate {
                        member,
                        certificate_sha256,
                        seen_at_unix_ms,
                    },
                )
                .collect(),
            cas: status
                .cas
                .into_iter()
                .map(|c| pb::CaCertificate {
                    subject: c.name,
                    sha256: c.sha256,
                    not_after_unix_s: c.not_after_unix_s,
                })
                .collect(),
        })
    }

    /// Proposes the command `make` builds for the member `reference` names, and answers with
    /// the member as applied.
    async fn member_command(
        &self,
        caller: Caller,
        reason: String,
        reference: &str,
        make: impl FnOnce(NodeId) -> Command,
    ) -> Result<Response<pb::MemberResponse>, Status> {
        let target = self.find_member(reference)?;
        let index = self.propose(caller.actor, reason, make(target.id)).await?;
        self.wait_applied(index).await;
        Ok(self.member_response(target.id, index))
    }

    async fn wait_applied(&self, index: u64) {
        let mut rx = self.sm.watch_applied();
        let _ = tokio::time::timeout(COMMIT_TIMEOUT, rx.wait_for(|i| *i >= index)).await;
    }
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

/// Runs the call on the leader when this member is not the leader (see
/// [`AdminService::forward`]).
macro_rules! to_leader {
    ($self:ident, $request:ident, $caller:ident, $method:literal) => {
        to_leader!($self, $request, $caller, $method, FORWARD_TIMEOUT)
    };
    ($self:ident, $request:ident, $caller:ident, $method:literal, $timeout:expr) => {
        if let Some(response) = $self
            .forward(&$request, &$caller, $method, $timeout)
            .await?
        {
            return Ok(response);
        }
    };
}

/// How long a forwarded write may take on the leader: a few commits.
const FORWARD_TIMEOUT: Duration = Duration::from_secs(COMMIT_TIMEOUT.as_secs() * 3);
/// How long a forwarded `MemberAdd` may take: the new learner's catch-up, then its commits.
const MEMBER_ADD_FORWARD_TIMEOUT: Duration =
    Duration::from_secs(MAX_CATCH_UP.as_secs() + COMMIT_TIMEOUT.as_secs() * 2);

/// How often a write is re-forwarded after the leader turned out unreachable.
const MAX_FORWARD_ATTEMPTS: u32 = 3;

/// The stream `SnapshotSave` answers with.
pub type SnapshotStream =
    std::pin::Pin<Box<dyn futures::Stream<Item = Result<pb::SnapshotSaveChunk, Status>> + Send>>;

impl AdminService {
    /// Refuses a snapshot on a member that is not the leader, naming the leader (and its Admin
    /// address in a header, for the client to ask there).
    fn not_the_leader(&self, m: &RaftMetricsOf) -> Status {
        let leader = m.current_leader.and_then(|id| {
            m.membership_config
                .membership()
                .get_node(&id)
                .map(|n| (id, n.name.clone(), n.admin_address.clone()))
        });
        let mut status = Status::failed_precondition(match &leader {
            Some((id, name, admin)) => format!(
                "member {} is not the leader; snapshots are taken on the leader, {name} (id {id}) at {admin}",
                self.me
            ),
            None => format!(
                "member {} knows no leader: a snapshot needs a leader confirmed by a quorum",
                self.me
            ),
        });
        if let Some((_, _, admin)) = leader
            && let Ok(v) = tonic::metadata::MetadataValue::try_from(admin.as_str())
        {
            status.metadata_mut().insert(super::LEADER_ADMIN_HEADER, v);
        }
        status
    }
}

#[tonic::async_trait]
impl Admin for AdminService {
    type SnapshotSaveStream = SnapshotStream;

    async fn cert_revoke(
        &self,
        request: Request<pb::CertRevokeRequest>,
    ) -> Result<Response<pb::CertRevokeResponse>, Status> {
        let (caller, _in_flight) = self.admit(&request, Access::Write)?;
        let m = self.metrics();
        if m.state != ServerState::Leader || m.current_leader != Some(self.me) {
            let (issuer, serial) =
                self.revocation_target(&request.get_ref().issuer, &request.get_ref().serial)?;
            if self.own_certificate_is(&issuer, &serial) {
                // Its connection to the leader ends when the leader applies the revocation,
                // and the answer with it: the client would not learn that it committed.
                let mut status = Status::failed_precondition(format!(
                    "certificate {serial} is this member's own: its connection to the leader \
                     ends with the revocation, and the answer with it; ask another member"
                ));
                status.metadata_mut().insert(
                    super::REFUSAL_HEADER,
                    tonic::metadata::MetadataValue::from_static(super::OWN_CERTIFICATE_REFUSAL),
                );
                return Err(status);
            }
        }
        to_leader!(self, request, caller, "CertRevoke");
        let req = request.into_inner();
        let (issuer, serial) = self.revocation_target(&req.issuer, &req.serial)?;
        let index = self
            .propose(
                caller.actor,
                req.reason.clone(),
                Command::RevokeCertificate {
                    issuer: issuer.clone(),
                    serial: serial.clone(),
                    subject: req.subject,
                    reason: req.reason,
                },
            )
            .await?;
        let revoked = self
            .read(|a| {
                a.state
                    .revocation(&issuer, &serial)
                    .map(revoked_certificate)
            })
            .ok_or_else(|| Status::internal("the revocation was committed but is not applied"))?;
        Ok(Response::new(pb::CertRevokeResponse {
            revoked: Some(revoked),
            index,
        }))
    }

    async fn cert_unrevoke(
        &self,
        request: Request<pb::CertUnrevokeRequest>,
    ) -> Result<Response<pb::CertUnrevokeResponse>, Status> {
        let (caller, _in_flight) = self.admit(&request, Access::Write)?;
        to_leader!(self, request, caller, "CertUnrevoke");
        let req = request.into_inner();
        let (issuer, serial) = self.revocation_target(&req.issuer, &req.serial)?;
        let index = self
            .propose(
                caller.actor,
                req.reason,
                Command::UnrevokeCertificate { issuer, serial },
            )
            .await?;
        Ok(Response::new(pb::CertUnrevokeResponse { index }))
    }

    async fn cert_list_revoked(
        &self,
        request: Request<pb::CertListRevokedRequest>,
    ) -> Result<Response<pb::CertListRevokedResponse>, Status> {
        let (_, _in_flight) = self.admit(&request, Access::Read)?;
        let req = request.into_inner();
        let freshness = self.reads.linearize(req.stale).await;
        let revoked = self.read(|a| a.state.revoked.iter().map(revoked_certificate).collect());
        Ok(Response::new(pb::CertListRevokedResponse {
            revoked,
            freshness: Some(freshness),
        }))
    }

    async fn snapshot_save(
        &self,
        request: Request<pb::SnapshotSaveRequest>,
    ) -> Result<Response<SnapshotStream>, Status> {
        let (caller, _in_flight) = self.admit(&request, Access::Backup)?;
        let m = self.metrics();
        if m.state != ServerState::Leader || m.current_leader != Some(self.me) {
            return Err(self.not_the_leader(&m));
        }
        // A quorum confirms this member still leads, and everything committed before this
        // request is applied here: the snapshot holds every write acknowledged before it.
        self.raft
            .ensure_linearizable(openraft::ReadPolicy::ReadIndex)
            .await
            .map_err(|e| {
                if e.forward_to_leader().is_some() {
                    self.not_the_leader(&self.metrics())
                } else {
                    Status::unavailable(format!("cannot confirm leadership with a quorum: {e}"))
                }
            })?;
        let applied = self.read(Clone::clone);
        let applied_codec = applied.state.settings.ring_version.active;
        let name = applied
            .state
            .members
            .get(&self.me)
            .map(|m| m.name.clone())
            .unwrap_or_default();
        let (index, term) = applied
            .last_applied
            .map(|l| (l.index, l.leader_id.term))
            .unwrap_or_default();
        let body = crate::raft::state_machine::encode_body(applied)
            .map_err(|e| Status::internal(format!("cannot encode the state: {e}")))?;
        if body.len() as u64 > crate::raft::service::MAX_SNAPSHOT_BYTES {
            return Err(Status::resource_exhausted(format!(
                "the state encodes to {} bytes, more than a snapshot may hold ({} bytes)",
                body.len(),
                crate::raft::service::MAX_SNAPSHOT_BYTES
            )));
        }
        let info = pb::SnapshotSaveInfo {
            last_log_index: index,
            last_log_term: term,
            member_id: self.me,
            member_name: name,
            taken_unix_ms: crate::time::unix_ms(),
            total_bytes: body.len() as u64,
            sha256: crate::tls::material::sha256_hex(&body),
            codec: applied_codec,
            snapshot_format: crate::raft::state_machine::SNAPSHOT_FORMAT,
        };
        tracing::info!(actor = %caller.actor, index, term, bytes = body.len(), "snapshot saved by an operator");
        let mut chunks: Vec<Result<pb::SnapshotSaveChunk, Status>> = body
            .chunks(crate::raft::network::SNAPSHOT_CHUNK_BYTES)
            .map(|piece| {
                Ok(pb::SnapshotSaveChunk {
                    info: None,
                    data: piece.to_vec(),
                })
            })
            .collect();
        if let Some(Ok(first)) = chunks.first_mut() {
            first.info = Some(info);
        }
        Ok(Response::new(Box::pin(futures::stream::iter(chunks))))
    }

    async fn status(
        &self,
        request: Request<pb::StatusRequest>,
    ) -> Result<Response<pb::StatusResponse>, Status> {
        let (_, _in_flight) = self.admit(&request, Access::Read)?;
        let freshness = self.reads.linearize(request.get_ref().stale).await;
        let m = self.metrics();
        let (members, control_planes, paused, applied_index, dns_zone, ring_version) =
            self.read(|a| {
                (
                    self.members(a),
                    a.state
                        .control_planes
                        .values()
                        .map(Box::as_ref)
                        .map(|cp| control_plane(cp, &a.state))
                        .collect(),
                    a.state.settings.paused,
                    a.applied_index(),
                    a.state.settings.dns_zone.clone().unwrap_or_default(),
                    self.upgrade.status(&a.state),
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
            tls: self.tls_status(),
            dns_zone,
            problem: self.problem(&m),
            freshness: Some(freshness),
            ring_version: Some(ring_version),
        }))
    }

    async fn member_list(
        &self,
        request: Request<pb::MemberListRequest>,
    ) -> Result<Response<pb::MemberListResponse>, Status> {
        let (_, _in_flight) = self.admit(&request, Access::Read)?;
        let freshness = self.reads.linearize(request.get_ref().stale).await;
        let members = self.read(|a| self.members(a));
        Ok(Response::new(pb::MemberListResponse {
            members,
            freshness: Some(freshness),
        }))
    }

    async fn member_add(
        &self,
        request: Request<pb::MemberAddRequest>,
    ) -> Result<Response<pb::MemberAddResponse>, Status> {
        let (caller, _in_flight) = self.admit(&request, Access::Write)?;
        to_leader!(
            self,
            request,
            caller,
            "MemberAdd",
            MEMBER_ADD_FORWARD_TIMEOUT
        );
        let actor = caller.actor;
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
            ms => Duration::from_millis(ms).min(MAX_CATCH_UP),
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
        let (caller, _in_flight) = self.admit(&request, Access::Write)?;
        to_leader!(self, request, caller, "MemberPromote");
        let actor = caller.actor;
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
        let (caller, _in_flight) = self.admit(&request, Access::Write)?;
        to_leader!(self, request, caller, "MemberRemove");
        let actor = caller.actor;
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
        request: Request<pb::ControlPlaneListRequest>,
    ) -> Result<Response<pb::ControlPlaneListResponse>, Status> {
        let (_, _in_flight) = self.admit(&request, Access::Read)?;
        let freshness = self.reads.linearize(request.get_ref().stale).await;
        let control_planes = self.read(|a| {
            a.state
                .control_planes
                .values()
                .map(Box::as_ref)
                .map(|cp| control_plane(cp, &a.state))
                .collect()
        });
        Ok(Response::new(pb::ControlPlaneListResponse {
            control_planes,
            freshness: Some(freshness),
        }))
    }

    async fn control_plane_get(
        &self,
        request: Request<pb::ControlPlaneGetRequest>,
    ) -> Result<Response<pb::ControlPlane>, Status> {
        let (_, _in_flight) = self.admit(&request, Access::Read)?;
        let req = request.into_inner();
        let freshness = self.reads.linearize(req.stale).await;
        let name = req.name;
        let mut found = self.find_control_plane(&name).ok_or_else(|| {
            let stale = super::freshness::stale_line(Some(&freshness))
                .map(|line| format!(" ({line})"))
                .unwrap_or_default();
            Status::not_found(format!("unknown control plane {name:?}{stale}"))
        })?;
        found.freshness = Some(freshness);
        Ok(Response::new(found))
    }

    async fn control_plane_add(
        &self,
        request: Request<pb::ControlPlaneAddRequest>,
    ) -> Result<Response<pb::ControlPlaneResponse>, Status> {
        let (caller, _in_flight) = self.admit(&request, Access::Write)?;
        to_leader!(self, request, caller, "ControlPlaneAdd");
        let actor = caller.actor;
        let req = request.into_inner();
        let spec = ControlPlaneSpec {
            name: req.name,
            home: non_empty(req.home),
            dns_name: req.dns_name,
            endpoints: req.endpoints.into_iter().collect(),
            backup: req.backup,
            backups: req.backups.into_iter().collect(),
            host: non_empty(req.host),
            prefer: req.prefer,
            tolerance: match req.tolerance.as_str() {
                "" => Tolerance::None,
                text => Tolerance::parse(text).ok_or_else(|| {
                    Status::invalid_argument(format!(
                        "invalid tolerance {text:?}: must be none or zone"
                    ))
                })?,
            },
            etcd_peers: req.etcd_peers.into_iter().collect(),
        };
        let name = spec.name.clone();
        let index = self
            .propose(actor, req.reason, Command::AddControlPlane(spec))
            .await?;
        self.wait_applied(index).await;
        let cp = self.find_control_plane(&name);
        Ok(Response::new(pb::ControlPlaneResponse {
            control_plane: cp,
            index,
        }))
    }

    async fn control_plane_remove(
        &self,
        request: Request<pb::ControlPlaneRemoveRequest>,
    ) -> Result<Response<pb::ControlPlaneResponse>, Status> {
        let (caller, _in_flight) = self.admit(&request, Access::Write)?;
        to_leader!(self, request, caller, "ControlPlaneRemove");
        let actor = caller.actor;
        let req = request.into_inner();
        let before = self.find_control_plane(&req.name);
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

    async fn control_plane_label(
        &self,
        request: Request<pb::ControlPlaneLabelRequest>,
    ) -> Result<Response<pb::ControlPlaneResponse>, Status> {
        let (caller, _in_flight) = self.admit(&request, Access::Write)?;
        to_leader!(self, request, caller, "ControlPlaneLabel");
        let req = request.into_inner();
        let name = req.name;
        let index = self
            .propose(
                caller.actor,
                req.reason,
                Command::SetControlPlaneLabels {
                    name: name.clone(),
                    labels: req.labels,
                },
            )
            .await?;
        let cp = self.find_control_plane(&name);
        Ok(Response::new(pb::ControlPlaneResponse {
            control_plane: cp,
            index,
        }))
    }

    async fn control_plane_recover(
        &self,
        request: Request<pb::ControlPlaneRecoverRequest>,
    ) -> Result<Response<pb::ControlPlaneRecoverResponse>, Status> {
        let (caller, _in_flight) = self.admit(&request, Access::Write)?;
        to_leader!(self, request, caller, "ControlPlaneRecover");
        let req = request.into_inner();
        let name = req.name.clone();
        // Checked on a copy of the state first: a dry run, and the words of what is lost.
        let checked = self.read(|a| {
            let cp = a.state.control_planes.get(&name)?;
            let generation = cp.etcd.as_ref().map(|c| c.generation).unwrap_or_default();
            let from = if req.from_member.is_empty() && req.from_backup {
                cp.host.clone().unwrap_or_default()
            } else {
                req.from_member.clone()
            };
            let command = Command::RecoverEtcdCluster {
                name: name.clone(),
                from,
                generation,
                from_backup: req.from_backup,
            };
            let mut scratch = a.state.clone();
            let index = a.applied_index() + 1;
            let proposal = crate::core::Proposal {
                command: command.clone(),
                at_ms: crate::time::unix_ms(),
                actor: caller.actor.clone(),
                reason: req.reason.clone(),
            };
            Some(
                scratch
                    .apply(index, &proposal)
                    .map(|()| (command, scratch.history.newest(1)[0].detail.clone())),
            )
        });
        let (command, detail) = match checked {
            None => {
                return Err(Status::not_found(format!("unknown control plane {name:?}")));
            }
            Some(Err(e)) => return Err(command_error(&e)),
            Some(Ok(checked)) => checked,
        };
        if req.dry_run {
            return Ok(Response::new(pb::ControlPlaneRecoverResponse {
                plan: format!("dry run, nothing changed: would have {detail}"),
                index: 0,
                control_plane: self.find_control_plane(&name),
            }));
        }
        let index = self.propose(caller.actor, req.reason, command).await?;
        self.wait_applied(index).await;
        Ok(Response::new(pb::ControlPlaneRecoverResponse {
            plan: detail,
            index,
            control_plane: self.find_control_plane(&name),
        }))
    }

    async fn history(
        &self,
        request: Request<pb::HistoryRequest>,
    ) -> Result<Response<pb::HistoryResponse>, Status> {
        let (_, _in_flight) = self.admit(&request, Access::Read)?;
        let req = request.into_inner();
        let freshness = self.reads.linearize(req.stale).await;
        let limit = req.limit as usize;
        let events = self.read(|a| a.state.history.newest(limit).iter().map(event).collect());
        Ok(Response::new(pb::HistoryResponse {
            events,
            freshness: Some(freshness),
        }))
    }

    async fn leader_transfer(
        &self,
        request: Request<pb::LeaderTransferRequest>,
    ) -> Result<Response<pb::LeaderTransferResponse>, Status> {
        let (caller, _in_flight) = self.admit(&request, Access::Write)?;
        to_leader!(self, request, caller, "LeaderTransfer");
        let req = request.into_inner();
        let m = self.metrics();
        let voters: Vec<NodeId> = m.membership_config.membership().voter_ids().collect();
        let requested = if req.to.is_empty() {
            None
        } else {
            Some(self.find_member(&req.to)?)
        };
        let matched = |id: NodeId| {
            m.replication
                .as_ref()
                .and_then(|r| r.get(&id).cloned().flatten())
                .map(|l| l.index)
        };
        let to = operator::transfer_target(
            self.me,
            &voters,
            matched,
            requested.as_ref().map(|t| (t.id, t.name.as_str())),
        )
        .map_err(|e| Status::failed_precondition(e.to_string()))?;
        if to == self.me {
            return Ok(Response::new(pb::LeaderTransferResponse { leader_id: to }));
        }
        self.raft
            .trigger()
            .transfer_leader(to)
            .await
            .map_err(|e| Status::unavailable(format!("leader transfer: {e}")))?;
        let wait = Duration::from_millis(self.timing.leader_transfer_wait_ms());
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
        let (caller, _in_flight) = self.admit(&request, Access::Write)?;
        to_leader!(self, request, caller, "SetPaused");
        let actor = caller.actor;
        let req = request.into_inner();
        let index = self
            .propose(actor, req.reason, Command::SetPaused { paused: req.paused })
            .await?;
        Ok(Response::new(pb::SetPausedResponse {
            paused: req.paused,
            index,
        }))
    }

    async fn upgrade_hold(
        &self,
        request: Request<pb::UpgradeHoldRequest>,
    ) -> Result<Response<pb::UpgradeResponse>, Status> {
        let (caller, _in_flight) = self.admit(&request, Access::Write)?;
        to_leader!(self, request, caller, "UpgradeHold");
        let req = request.into_inner();
        let command = self.read(|a| super::upgrade::Upgrade::hold(&a.state, req.held))?;
        let index = self.propose(caller.actor, req.reason, command).await?;
        Ok(Response::new(pb::UpgradeResponse {
            ring_version: Some(self.read(|a| self.upgrade.status(&a.state))),
            index,
        }))
    }

    async fn upgrade_finalize(
        &self,
        request: Request<pb::UpgradeFinalizeRequest>,
    ) -> Result<Response<pb::UpgradeResponse>, Status> {
        let (caller, _in_flight) = self.admit(&request, Access::Write)?;
        to_leader!(self, request, caller, "UpgradeFinalize");
        let req = request.into_inner();
        let command = self.read(|a| self.upgrade.finalize(&a.state))?;
        let index = self.propose(caller.actor, req.reason, command).await?;
        Ok(Response::new(pb::UpgradeResponse {
            ring_version: Some(self.read(|a| self.upgrade.status(&a.state))),
            index,
        }))
    }

    async fn member_cordon(
        &self,
        request: Request<pb::MemberCordonRequest>,
    ) -> Result<Response<pb::MemberResponse>, Status> {
        let (caller, _in_flight) = self.admit(&request, Access::Write)?;
        to_leader!(self, request, caller, "MemberCordon");
        let req = request.into_inner();
        self.member_command(caller, req.reason, &req.member, |id| Command::Cordon {
            id,
            cordoned: req.cordoned,
        })
        .await
    }

    async fn dns_list(
        &self,
        request: Request<pb::DnsListRequest>,
    ) -> Result<Response<pb::DnsListResponse>, Status> {
        let (caller, _in_flight) = self.admit(&request, Access::Read)?;
        // Only the leader checks the servers: ask it. Without a leader (or one that does not
        // answer within a read's bound: a member cut off from it must not hold `ringctl status`
        // for the forward's retries), say what this member would publish, and that nobody
        // checked.
        let mut local_problem = None;
        let bound = Duration::from_millis(self.timing.read_index_wait_ms());
        match tokio::time::timeout(
            bound,
            self.forward(&request, &caller, "DnsList", FORWARD_TIMEOUT),
        )
        .await
        {
            Ok(Ok(Some(response))) => return Ok(response),
            Ok(Ok(None)) => {}
            Ok(Err(status)) => local_problem = Some(status.message().to_string()),
            Err(_) => {
                local_problem = Some(format!(
                    "the leader did not answer within {} ms",
                    bound.as_millis()
                ))
            }
        }
        let view = self.dns.view();
        let (records, zone, me) = self.read(|a| {
            (
                crate::dns::records::desired_records(&a.state, self.dns_ttl_s),
                a.state.settings.dns_zone.clone().unwrap_or_default(),
                a.state
                    .members
                    .get(&self.me)
                    .map(|m| m.name.clone())
                    .unwrap_or_else(|| self.me.to_string()),
            )
        });
        let from_leader = local_problem.is_none() && view.leading;
        let mut problems = view.problems.clone();
        if let Some(p) = local_problem {
            problems.insert(
                0,
                format!("answered by member {me}, which cannot reach a leader ({p}): server answers unknown"),
            );
        }
        let records = records
            .into_iter()
            .map(|r| {
                let (kind, value) = record_type_value(&r.value);
                let known = view
                    .records
                    .get(&r.name)
                    .filter(|s| from_leader && s.desired.value == r.value);
                pb::DnsRecord {
                    answers: known
                        .map(|s| {
                            s.answers
                                .iter()
                                .map(|(server, seen)| pb::DnsAnswer {
                                    server: server.to_string(),
                                    answer: seen.to_string(),
                                    ok: seen.matches(&r.value),
                                })
                                .collect()
                        })
                        .unwrap_or_default(),
                    visible: known.is_some_and(|s| s.visible_after_ms.is_some()),
                    since_unix_ms: known.map(|s| s.since_unix_ms).unwrap_or_default(),
                    visible_after_ms: known.and_then(|s| s.visible_after_ms).unwrap_or_default(),
                    name: r.name,
                    r#type: kind.into(),
                    value,
                    ttl_s: r.ttl_s,
                    why: r.why,
                }
            })
            .collect();
        let (last_change, last_change_ms) = match &view.last_change {
            Some(p) if from_leader => (
                format!("{} -> {}", p.name, crate::dns::query::value_text(&p.value)),
                p.propagation_ms,
            ),
            _ => (String::new(), 0),
        };
        Ok(Response::new(pb::DnsListResponse {
            records,
            zone,
            provider: view.provider.clone(),
            servers: view.servers.iter().map(|s| s.to_string()).collect(),
            problems,
            last_change,
            last_change_ms,
            answered_by: me,
            from_leader,
        }))
    }

    async fn member_label(
        &self,
        request: Request<pb::MemberLabelRequest>,
    ) -> Result<Response<pb::MemberResponse>, Status> {
        let (caller, _in_flight) = self.admit(&request, Access::Write)?;
        to_leader!(self, request, caller, "MemberLabel");
        let req = request.into_inner();
        self.member_command(caller, req.reason, &req.member, |id| Command::SetLabels {
            id,
            labels: req.labels,
        })
        .await
    }

    async fn r#move(
        &self,
        request: Request<pb::MoveRequest>,
    ) -> Result<Response<pb::MoveResponse>, Status> {
        let access = if request.get_ref().dry_run {
            Access::Read
        } else {
            Access::Write
        };
        let (caller, _in_flight) = self.admit(&request, access)?;
        if !request.get_ref().dry_run {
            to_leader!(self, request, caller, "Move");
        }
        let req = request.into_inner();
        let operator_move = operator_move(&req)?;
        let to = non_empty(req.to.clone());
        let now = crate::time::unix_ms();
        let plan = self
            .read(|a| operator::plan(&a.state, &operator_move, to.as_deref(), &self.policy, now))
            .map_err(operator_error)?;
        let moves: Vec<pb::PlannedMove> = plan.planned.iter().map(planned_move).collect();
        if req.dry_run {
            return Ok(Response::new(pb::MoveResponse {
                moves,
                dry_run: true,
                index: 0,
            }));
        }
        let mut index = 0;
        if let Some(cordon) = plan.cordon {
            index = self
                .propose(
                    caller.actor.clone(),
                    format!("drain: {}", req.reason),
                    cordon,
                )
                .await?;
        }
        for command in plan.moves {
            index = self
                .propose(caller.actor.clone(), req.reason.clone(), command)
                .await?;
        }
        self.wait_applied(index).await;
        Ok(Response::new(pb::MoveResponse {
            moves,
            dry_run: false,
            index,
        }))
    }
}

/// The operator's move a request asks for: `move_kind`, or the deprecated `kind` string when
/// it is unset (clients from before `move_kind`).
fn operator_move(req: &pb::MoveRequest) -> Result<OperatorMove, Status> {
    #[allow(deprecated)]
    let legacy = req.kind.as_str();
    let kind = match pb::MoveKind::try_from(req.move_kind) {
        Ok(pb::MoveKind::Unspecified) => match legacy {
            "drain" => pb::MoveKind::Drain,
            "switchover" => pb::MoveKind::Switchover,
            "failover" => pb::MoveKind::Failover,
            other => {
                return Err(Status::invalid_argument(format!(
                    "move kind {other:?} must be drain, switchover or failover"
                )));
            }
        },
        Ok(kind) => kind,
        Err(_) => {
            return Err(Status::invalid_argument(format!(
                "move kind {} must be drain, switchover or failover",
                req.move_kind
            )));
        }
    };
    Ok(match kind {
        pb::MoveKind::Drain => OperatorMove::Drain {
            member: req.member.clone(),
        },
        pb::MoveKind::Switchover => OperatorMove::Switchover {
            control_plane: req.control_plane.clone(),
        },
        pb::MoveKind::Failover | pb::MoveKind::Unspecified => OperatorMove::Failover {
            control_plane: req.control_plane.clone(),
        },
    })
}

/// The gRPC status for a move that cannot be planned.
fn operator_error(e: OperatorError) -> Status {
    let message = e.to_string();
    match e {
        OperatorError::NoMember => Status::invalid_argument(message),
        OperatorError::UnknownMember(_) | OperatorError::UnknownControlPlane(_) => {
            Status::not_found(message)
        }
        OperatorError::HostNotHealthy { .. } | OperatorError::Plan(_) => {
            Status::failed_precondition(message)
        }
    }
}

fn planned_move(m: &PlannedMove) -> pb::PlannedMove {
    pb::PlannedMove {
        control_plane: m.control_plane.clone(),
        from: m.from.clone(),
        to: m.to.clone(),
        epoch: m.epoch,
    }
}

impl ForwardHandler for AdminService {
    fn handle(
        &self,
        req: pb::ForwardRequest,
    ) -> futures::future::BoxFuture<'_, Result<Vec<u8>, Status>> {
        Box::pin(async move {
            let role = match req.role.as_str() {
                "" if self.transport.tls.is_some() => {
                    return Err(Status::permission_denied(
                        "a request forwarded without an authenticated role reached a member that runs TLS",
                    ));
                }
                "" => None,
                r => Some(crate::tls::Role::parse(r).ok_or_else(|| {
                    Status::invalid_argument(format!("forwarded request names unknown role {r:?}"))
                })?),
            };
            let forwarded = Forwarded {
                by: req.from,
                caller: Caller {
                    actor: req.actor,
                    role,
                },
            };
            macro_rules! run {
                ($method:ident, $ty:ty) => {{
                    let message = <$ty>::decode(req.request.as_slice()).map_err(|e| {
                        Status::invalid_argument(format!("forwarded {}: {e}", req.method))
                    })?;
                    let mut request = Request::new(message);
                    request.extensions_mut().insert(forwarded);
                    self.$method(request)
                        .await
                        .map(|r| r.into_inner().encode_to_vec())
                }};
            }
            match req.method.as_str() {
                "MemberAdd" => run!(member_add, pb::MemberAddRequest),
                "MemberPromote" => run!(member_promote, pb::MemberRefRequest),
                "MemberRemove" => run!(member_remove, pb::MemberRefRequest),
                "ControlPlaneAdd" => run!(control_plane_add, pb::ControlPlaneAddRequest),
                "ControlPlaneRemove" => run!(control_plane_remove, pb::ControlPlaneRemoveRequest),
                "ControlPlaneLabel" => run!(control_plane_label, pb::ControlPlaneLabelRequest),
                "ControlPlaneRecover" => {
                    run!(control_plane_recover, pb::ControlPlaneRecoverRequest)
                }
                "LeaderTransfer" => run!(leader_transfer, pb::LeaderTransferRequest),
                "SetPaused" => run!(set_paused, pb::SetPausedRequest),
                "UpgradeHold" => run!(upgrade_hold, pb::UpgradeHoldRequest),
                "UpgradeFinalize" => run!(upgrade_finalize, pb::UpgradeFinalizeRequest),
                "MemberCordon" => run!(member_cordon, pb::MemberCordonRequest),
                "MemberLabel" => run!(member_label, pb::MemberLabelRequest),
                "Move" => run!(r#move, pb::MoveRequest),
                "DnsList" => run!(dns_list, pb::DnsListRequest),
                "CertRevoke" => run!(cert_revoke, pb::CertRevokeRequest),
                "CertUnrevoke" => run!(cert_unrevoke, pb::CertUnrevokeRequest),
                other => Err(Status::unimplemented(format!(
                    "method {other:?} cannot be forwarded"
                ))),
            }
        })
    }
}

/// A record value as the Admin API shows it: its type and value.
fn record_type_value(value: &crate::dns::update::RecordValue) -> (&'static str, String) {
    use crate::dns::update::RecordValue;
    match value {
        RecordValue::A(v4) => ("A", v4.to_string()),
        RecordValue::Aaaa(v6) => ("AAAA", v6.to_string()),
        RecordValue::Cname(name) => ("CNAME", name.clone()),
        RecordValue::Delete => ("NONE", String::new()),
    }
}
