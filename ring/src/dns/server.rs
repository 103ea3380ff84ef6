//! The `builtin` provider: every member serves the ring's zone authoritatively over UDP and
//! TCP (hickory-server), from its applied state.
//!
//! A member answers only what it can vouch for: while its own lease is current and its state
//! is at least as fresh as the leader's when it granted that lease
//! ([`OwnLease::vouches`]). Otherwise it answers SERVFAIL, so resolvers ask another member. A
//! member frozen (SIGSTOP) or cut off past its lease therefore never answers with the state it
//! had before: the lease it had then has run out, and the next grant comes with the index its
//! state must reach first.
//!
//! The zone itself is [`Zone`], rebuilt whenever the applied index moves.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use hickory_proto::op::{Edns, Header, HeaderCounts, Metadata, OpCode, ResponseCode};
use hickory_server::Server;
use hickory_server::net::runtime::Time;
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponseBuilder;
use tokio::net::{TcpListener, UdpSocket};
use tokio::sync::watch;

use super::records::{DesiredRecord, desired_values};
use super::update::RecordValue;
use super::zone::{Zone, desired_by_name};
use crate::agent::OwnLease;
use crate::raft::StateMachineStore;
use crate::time::monotonic_ms;

/// How long a TCP connection may sit idle before the server closes it.
const TCP_IDLE_TIMEOUT: Duration = Duration::from_secs(5);
/// Response buffer per TCP connection, in messages.
const TCP_RESPONSE_BUFFER: usize = 16;
/// Largest UDP payload we announce with EDNS (the DNS flag day 2020 value).
const EDNS_UDP_PAYLOAD: u16 = 1232;

/// The zone as this member last applied it (None before the ring has a zone).
pub type ZoneFeed = watch::Receiver<Option<Arc<Zone>>>;

/// Keeps a [`Zone`] built from the applied state, brought up to date whenever the applied
/// index moves, until `stopped`.
///
/// The zone is built once; after that each version is the previous one with the names whose
/// values changed ([`Zone::with_changes`]), so a ring of thousands of control planes does not
/// build every record again for every applied entry. It is built afresh when the zone itself
/// (its name, the members serving it, the TTL) changes or an update fails.
pub fn feed(
    state: StateMachineStore,
    ttl_s: u32,
    mut stopped: watch::Receiver<bool>,
) -> (ZoneFeed, tokio::task::JoinHandle<()>) {
    let (tx, rx) = watch::channel(None);
    let task = tokio::spawn(async move {
        let mut applied = state.watch_applied();
        // The last zone sent, what it was built for (origin, nameservers) and its values.
        let mut last: Option<(Arc<Zone>, ZoneShape, Values)> = None;
        loop {
            let read = state.read(|a| {
                let zone = a.state.settings.dns_zone.as_ref()?;
                let nameservers: Vec<String> = a
                    .state
                    .members
                    .values()
                    .map(|m| format!("{}.members.{zone}", m.name))
                    .collect();
                let wanted = desired_by_name(&desired_values(&a.state, ttl_s));
                Some(((zone.clone(), nameservers), wanted, a.applied_index()))
            });
            if let Some((shape, wanted, index)) = read {
                let built = match last.take() {
                    Some((zone, last_shape, last_wanted)) if last_shape == shape => {
                        let changes = changed(&last_wanted, &wanted);
                        zone.with_changes(index, &changes)
                    }
                    _ => Zone::build(
                        &shape.0,
                        index,
                        &records_of(&wanted, ttl_s),
                        &shape.1,
                        ttl_s,
                    ),
                };
                match built {
                    Ok(zone) => {
                        let zone = Arc::new(zone);
                        let _ = tx.send(Some(zone.clone()));
                        last = Some((zone, shape, wanted));
                    }
                    Err(e) => tracing::error!("cannot build the DNS zone: {e}"),
                }
            }
            tokio::select! {
                changed = applied.changed() => if changed.is_err() { return },
                _ = stopped.wait_for(|s| *s) => return,
            }
        }
    });
    (rx, task)
}

/// What a zone is built for: its name and its nameservers.
type ZoneShape = (String, Vec<String>);
/// Record values by name ([`desired_by_name`]).
type Values = BTreeMap<String, Vec<RecordValue>>;

/// The names whose values differ between `old` and `new` (a name gone gets no values).
fn changed(
    old: &BTreeMap<String, Vec<RecordValue>>,
    new: &BTreeMap<String, Vec<RecordValue>>,
) -> BTreeMap<String, Vec<RecordValue>> {
    let mut out: BTreeMap<String, Vec<RecordValue>> = new
        .iter()
        .filter(|(name, values)| old.get(*name) != Some(values))
        .map(|(name, values)| (name.clone(), values.clone()))
        .collect();
    for name in old.keys().filter(|name| !new.contains_key(*name)) {
        out.insert(name.clone(), Vec::new());
    }
    out
}

/// Desired records with exactly `wanted`'s values.
fn records_of(wanted: &BTreeMap<String, Vec<RecordValue>>, ttl_s: u32) -> Vec<DesiredRecord> {
    wanted
        .iter()
        .flat_map(|(name, values)| {
            values.iter().map(move |value| DesiredRecord {
                name: name.clone(),
                ttl_s,
                value: value.clone(),
                why: String::new(),
            })
        })
        .collect()
}

/// Answers queries from the current [`Zone`], if the lease allows.
struct Handler {
    zone: ZoneFeed,
    lease: Arc<OwnLease>,
}

impl Handler {
    async fn respond<R: ResponseHandler>(
        &self,
        request: &Request,
        mut response: R,
    ) -> Result<ResponseInfo, hickory_server::net::NetError> {
        let mut metadata = Metadata::response_from_request(&request.metadata);
        let mut builder = MessageResponseBuilder::from_message_request(request);
        let edns = request.edns.as_ref().map(|_| {
            let mut edns = Edns::new();
            edns.set_max_payload(EDNS_UDP_PAYLOAD).set_version(0);
            edns
        });
        if let Some(edns) = &edns {
            builder.edns(edns);
        }
        let query = match request.request_info() {
            Ok(info) if request.metadata.op_code == OpCode::Query => info.query.clone(),
            Ok(_) => {
                metadata.response_code = ResponseCode::NotImp;
                return send(&mut response, builder.build_no_records(metadata)).await;
            }
            Err(_) => {
                metadata.response_code = ResponseCode::FormErr;
                return send(&mut response, builder.build_no_records(metadata)).await;
            }
        };
        let zone = self.zone.borrow().clone();
        let Some(zone) = zone else {
            metadata.response_code = ResponseCode::ServFail;
            return send(&mut response, builder.build_no_records(metadata)).await;
        };
        if !zone.contains(query.name()) {
            metadata.response_code = ResponseCode::Refused;
            return send(&mut response, builder.build_no_records(metadata)).await;
        }
        if !self.lease.vouches(monotonic_ms(), zone.applied_index()) {
            metadata.response_code = ResponseCode::ServFail;
            return send(&mut response, builder.build_no_records(metadata)).await;
        }
        let answer = zone.answer(query.name(), query.query_type());
        metadata.response_code = answer.rcode;
        metadata.authoritative = answer.authoritative;
        let built = builder.build(
            metadata,
            answer.answers.iter(),
            answer.authority.iter(),
            std::iter::empty(),
            std::iter::empty(),
        );
        send(&mut response, built).await
    }
}

async fn send<'a, R: ResponseHandler>(
    response: &mut R,
    message: hickory_server::zone_handler::MessageResponse<
        '_,
        'a,
        impl Iterator<Item = &'a hickory_proto::rr::Record> + Send + 'a,
        impl Iterator<Item = &'a hickory_proto::rr::Record> + Send + 'a,
        impl Iterator<Item = &'a hickory_proto::rr::Record> + Send + 'a,
        impl Iterator<Item = &'a hickory_proto::rr::Record> + Send + 'a,
    >,
) -> Result<ResponseInfo, hickory_server::net::NetError> {
    response.send_response(message).await
}

#[async_trait::async_trait]
impl RequestHandler for Handler {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        response: R,
    ) -> ResponseInfo {
        match self.respond(request, response).await {
            Ok(info) => info,
            Err(e) => {
                tracing::debug!(src = %request.src(), "cannot answer a DNS query: {e}");
                let mut metadata = Metadata::response_from_request(&request.metadata);
                metadata.response_code = ResponseCode::ServFail;
                ResponseInfo::from(Header {
                    metadata,
                    counts: HeaderCounts::default(),
                })
            }
        }
    }
}

/// Why the DNS server could not start.
#[derive(Debug, thiserror::Error)]
#[error("cannot serve DNS on {address} ({protocol}): {source}")]
pub struct ServeError {
    /// The address.
    pub address: SocketAddr,
    /// "UDP" or "TCP".
    pub protocol: &'static str,
    /// What the OS said.
    pub source: std::io::Error,
}

/// The bound UDP socket and TCP listener of one member's DNS server.
pub struct Sockets {
    udp: UdpSocket,
    tcp: TcpListener,
    address: SocketAddr,
}

impl Sockets {
    /// Binds UDP and TCP on `address` (the same port for both, also when `address` asks for
    /// any port).
    pub async fn bind(address: SocketAddr) -> Result<Self, ServeError> {
        let udp = UdpSocket::bind(address)
            .await
            .map_err(|source| ServeError {
                address,
                protocol: "UDP",
                source,
            })?;
        let address = udp.local_addr().unwrap_or(address);
        let tcp = TcpListener::bind(address)
            .await
            .map_err(|source| ServeError {
                address,
                protocol: "TCP",
                source,
            })?;
        Ok(Self { udp, tcp, address })
    }

    /// The address both are bound to.
    pub fn address(&self) -> SocketAddr {
        self.address
    }

    /// Serves `zone` while `lease` vouches for it, until `stopped`.
    pub fn serve(
        self,
        zone: ZoneFeed,
        lease: Arc<OwnLease>,
        mut stopped: watch::Receiver<bool>,
    ) -> tokio::task::JoinHandle<()> {
        let mut server = Server::new(Handler { zone, lease });
        server.register_socket(self.udp);
        server.register_listener(self.tcp, TCP_IDLE_TIMEOUT, TCP_RESPONSE_BUFFER);
        tracing::info!(address = %self.address, "DNS (builtin) listening on UDP and TCP");
        tokio::spawn(async move {
            let _ = stopped.wait_for(|s| *s).await;
            if let Err(e) = server.shutdown_gracefully().await {
                tracing::warn!("DNS server did not shut down cleanly: {e}");
            }
        })
    }
}
