//! Sending RFC 2136 DNS UPDATE messages to a zone's primary server, signed with TSIG
//! (RFC 8945, hmac-sha256), and reading its answer.
//!
//! One update is one exchange over TCP (RFC 1035 4.2.2: a 2-byte length, then the message):
//! connect, write the update, read one reply, close. TCP rather than UDP because an update of
//! many names does not fit a UDP datagram, a lost UDP reply would leave "was it applied?"
//! open, and TCP needs no retransmission timer of our own. The whole exchange, connecting
//! included, runs under [`Rfc2136Client::timeout`].
//!
//! The two halves that need no network are pure and public, so tests can drive them with a
//! fixed clock: [`Rfc2136Client::sign`] builds and signs the message at a given Unix time, and
//! [`Rfc2136Client::check_reply`] decodes the reply, checks its id, verifies its TSIG
//! (MAC chained to the request's, RFC 8945 4.3; time within the fudge) and maps the response
//! code. [`Rfc2136Client::send`] joins them around the socket and reads the system clock.
//!
//! Every [`SendError`] says whether trying the same update again later can help
//! ([`SendError::is_retryable`]): a server that is down, resets the connection, does not answer
//! in time or answers SERVFAIL may be fine in a minute; a server that refuses the update, does
//! not know the key, finds the signature wrong or the clocks apart, or cannot parse the message
//! will refuse it again until an operator changes something. Retrying is safe: every update
//! replaces the records at its names, so applying it twice gives the same zone.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, ResponseCode};
use hickory_proto::rr::rdata::tsig::TsigError;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;

use super::keeper::{PublishError, Publisher};
use super::tsig_key::{TSIG_FUDGE_S, TsigKey};
use super::update::{Change, UpdateBuilder, UpdateError, encode};

/// Sends updates to one DNS server.
#[derive(Debug, Clone)]
pub struct Rfc2136Client {
    /// The zone's primary server (TCP).
    pub server: SocketAddr,
    /// The TSIG key updates are signed with; `None` sends them unsigned.
    pub key: Option<TsigKey>,
    /// Longest a whole exchange (connect, send, receive) may take.
    pub timeout: Duration,
}

/// An update ready to send: its wire bytes and what checking the reply needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SignedUpdate {
    /// The message id.
    pub id: u16,
    /// The encoded message, TSIG record included when signed (without the TCP length prefix).
    pub bytes: Vec<u8>,
    /// The request's MAC, which the reply's MAC covers (RFC 8945 4.3.3); `None` when unsigned.
    mac: Option<Vec<u8>>,
    /// The Unix time (s) the request was signed at.
    time_s: u64,
}

/// The server applied the update.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Reply {
    /// The message id (the same as the update's).
    pub id: u16,
    /// The key whose signature on the reply was verified; `None` for an unsigned exchange.
    pub verified_key: Option<String>,
    /// The server's clock in the reply's TSIG record, Unix seconds (when signed).
    pub server_time_s: Option<u64>,
}

/// Why an update was not (known to be) applied. Every message names the server, and the key
/// when the update was signed; none holds the secret.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SendError {
    /// The batch is not a valid update; nothing was sent. Fatal.
    #[error("invalid update for DNS server {server}: {error}")]
    Invalid {
        /// The server.
        server: SocketAddr,
        /// What is wrong.
        error: UpdateError,
    },
    /// The message could not be signed (a bug, or a key hickory refuses). Fatal.
    #[error("cannot sign the update for DNS server {server} with key {key:?}: {why}")]
    Sign {
        /// The server.
        server: SocketAddr,
        /// The key name.
        key: String,
        /// Why.
        why: String,
    },
    /// No connection to the server (refused, unreachable). Retryable.
    #[error("cannot connect to DNS server {server}: {why}")]
    Connect {
        /// The server.
        server: SocketAddr,
        /// The system's error.
        why: String,
    },
    /// The connection broke (reset, closed before the whole reply arrived). Retryable.
    #[error("connection to DNS server {server} failed during the update: {why}")]
    Io {
        /// The server.
        server: SocketAddr,
        /// The system's error.
        why: String,
    },
    /// The exchange did not finish in time. Retryable.
    #[error(
        "DNS server {server} did not answer the update within {} ms",
        .timeout.as_millis()
    )]
    Timeout {
        /// The server.
        server: SocketAddr,
        /// The time allowed.
        timeout: Duration,
    },
    /// The server answered SERVFAIL: a failure on its side. Retryable.
    #[error(
        "DNS server {server} failed the update{}: SERVFAIL (a failure on the server's side; will retry)",
        signed_with(.key)
    )]
    ServFail {
        /// The server.
        server: SocketAddr,
        /// The key name, when signed.
        key: Option<String>,
    },
    /// The server refused the update with this response code. Fatal.
    #[error(
        "DNS server {server} rejected the update{}: {} ({hint})",
        signed_with(.key), rcode_name(*.rcode)
    )]
    Rejected {
        /// The server.
        server: SocketAddr,
        /// The key name, when signed.
        key: Option<String>,
        /// The response code.
        rcode: ResponseCode,
        /// What it usually means.
        hint: String,
    },
    /// The server refused the update's TSIG signature. Fatal.
    #[error(
        "DNS server {server} rejected the update signed with key {key:?}: TSIG {} ({hint})",
        tsig_error_name(*.error)
    )]
    Tsig {
        /// The server.
        server: SocketAddr,
        /// The key name.
        key: String,
        /// The TSIG error.
        error: TsigError,
        /// What it usually means.
        hint: String,
    },
    /// The reply cannot be trusted or understood: undecodable, another id, not an UPDATE
    /// response, unsigned or wrongly signed when the update was signed. Fatal.
    #[error("DNS server {server} sent a bad reply to the update{}: {why}", signed_with(.key))]
    BadReply {
        /// The server.
        server: SocketAddr,
        /// The key name, when signed.
        key: Option<String>,
        /// What is wrong with it.
        why: String,
    },
}

impl SendError {
    /// Whether sending the same update again later can succeed without anyone changing
    /// anything: the server was unreachable, the connection broke, time ran out or the server
    /// answered SERVFAIL. Everything else needs an operator.
    pub fn is_retryable(&self) -> bool {
        matches!(
            self,
            SendError::Connect { .. }
                | SendError::Io { .. }
                | SendError::Timeout { .. }
                | SendError::ServFail { .. }
        )
    }

    /// The server the update was for.
    pub fn server(&self) -> SocketAddr {
        match self {
            SendError::Invalid { server, .. }
            | SendError::Sign { server, .. }
            | SendError::Connect { server, .. }
            | SendError::Io { server, .. }
            | SendError::Timeout { server, .. }
            | SendError::ServFail { server, .. }
            | SendError::Rejected { server, .. }
            | SendError::Tsig { server, .. }
            | SendError::BadReply { server, .. } => *server,
        }
    }
}

/// ` signed with key "NAME"`, or ` (unsigned)`.
fn signed_with(key: &Option<String>) -> String {
    match key {
        Some(key) => format!(" signed with key {key:?}"),
        None => " (unsigned)".into(),
    }
}

/// The mnemonic of a response code, as `dig` prints it.
fn rcode_name(rcode: ResponseCode) -> String {
    match rcode {
        ResponseCode::NoError => "NOERROR".into(),
        ResponseCode::FormErr => "FORMERR".into(),
        ResponseCode::ServFail => "SERVFAIL".into(),
        ResponseCode::NXDomain => "NXDOMAIN".into(),
        ResponseCode::NotImp => "NOTIMP".into(),
        ResponseCode::Refused => "REFUSED".into(),
        ResponseCode::YXDomain => "YXDOMAIN".into(),
        ResponseCode::YXRRSet => "YXRRSET".into(),
        ResponseCode::NXRRSet => "NXRRSET".into(),
        ResponseCode::NotAuth => "NOTAUTH".into(),
        ResponseCode::NotZone => "NOTZONE".into(),
        other => format!("RCODE {}", u16::from(other)),
    }
}

/// The mnemonic of a TSIG error.
fn tsig_error_name(error: TsigError) -> String {
    match error {
        TsigError::BadSig => "BADSIG".into(),
        TsigError::BadKey => "BADKEY".into(),
        TsigError::BadTime => "BADTIME".into(),
        TsigError::BadTrunc => "BADTRUNC".into(),
        TsigError::Unknown(code) => format!("error {code}"),
    }
}

/// What a rejecting response code usually means for an update.
fn rcode_hint(rcode: ResponseCode, signed: bool) -> String {
    match rcode {
        ResponseCode::Refused if signed => {
            "the server does not let this key update the zone: check allow-update or update-policy"
                .into()
        }
        ResponseCode::Refused => {
            "the server does not accept unsigned updates for the zone: configure a TSIG key".into()
        }
        ResponseCode::NotAuth => {
            "the server is not authoritative for the zone, or the update is not authorized".into()
        }
        ResponseCode::NotZone => "a name in the update lies outside the zone".into(),
        ResponseCode::FormErr => "the server could not parse the update message".into(),
        ResponseCode::NotImp => "the server does not implement DNS UPDATE".into(),
        ResponseCode::NXDomain
        | ResponseCode::YXDomain
        | ResponseCode::YXRRSet
        | ResponseCode::NXRRSet => {
            "a prerequisite failed, but this update has none: is this a DNS UPDATE server?".into()
        }
        _ => "unexpected response code to an update".into(),
    }
}

/// What a TSIG error usually means.
fn tsig_hint(error: TsigError) -> String {
    match error {
        TsigError::BadSig => "wrong secret for this key name?".into(),
        TsigError::BadKey => {
            "the server does not know a key of this name with algorithm hmac-sha256".into()
        }
        TsigError::BadTime => {
            format!("the clocks of this host and the server differ by more than {TSIG_FUDGE_S} s")
        }
        TsigError::BadTrunc => "the server refused a truncated MAC".into(),
        TsigError::Unknown(_) => "unknown TSIG error".into(),
    }
}

impl Rfc2136Client {
    /// A client for `server`, signing with `key` when given, each exchange bounded by `timeout`.
    pub fn new(server: SocketAddr, key: Option<TsigKey>, timeout: Duration) -> Self {
        Self {
            server,
            key,
            timeout,
        }
    }

    /// The key name, when updates are signed.
    fn key_name(&self) -> Option<String> {
        self.key.as_ref().map(|k| k.name().to_string())
    }

    /// Builds the update for `changes` with message id `id` and, with a key, signs it as of
    /// `now_s` (Unix seconds). Pure: no I/O, no clock.
    pub fn sign(
        &self,
        builder: &UpdateBuilder,
        id: u16,
        changes: &[Change],
        now_s: u64,
    ) -> Result<SignedUpdate, SendError> {
        let invalid = |error| SendError::Invalid {
            server: self.server,
            error,
        };
        let mut message = builder.message(id, changes).map_err(invalid)?;
        // Refuses an unsigned message that leaves no room for the TSIG record.
        let unsigned = encode(&message).map_err(invalid)?;
        let Some(key) = &self.key else {
            return Ok(SignedUpdate {
                id,
                bytes: unsigned,
                mac: None,
                time_s: now_s,
            });
        };
        let sign_error = |why: String| SendError::Sign {
            server: self.server,
            key: key.name().to_string(),
            why,
        };
        let signer = key.signer().map_err(|e| sign_error(e.to_string()))?;
        message
            .finalize(&signer, now_s)
            .map_err(|e| sign_error(e.to_string()))?;
        let mac = message
            .signature()
            .map(|record| record.data.mac.clone())
            .ok_or_else(|| sign_error("no TSIG record after signing".into()))?;
        let bytes = message.to_vec().map_err(|e| sign_error(e.to_string()))?;
        if bytes.len() > usize::from(u16::MAX) {
            return Err(sign_error(format!(
                "the signed message is {} bytes, more than a DNS message can be",
                bytes.len()
            )));
        }
        Ok(SignedUpdate {
            id,
            bytes,
            mac: Some(mac),
            time_s: now_s,
        })
    }

    /// Decodes and checks the server's reply to `request`: same id, an UPDATE response, a
    /// valid TSIG chained to the request's when it was signed (time within the fudge of the
    /// request's), and NOERROR. Pure: no I/O, no clock.
    pub fn check_reply(&self, request: &SignedUpdate, reply: &[u8]) -> Result<Reply, SendError> {
        let key_name = self.key_name();
        let bad = |why: String| SendError::BadReply {
            server: self.server,
            key: key_name.clone(),
            why,
        };
        let message =
            Message::from_vec(reply).map_err(|e| bad(format!("cannot decode it: {e}")))?;
        if message.id != request.id {
            return Err(bad(format!(
                "its id is {}, the update's is {}",
                message.id, request.id
            )));
        }
        if message.message_type != MessageType::Response || message.op_code != OpCode::Update {
            return Err(bad(format!(
                "it is a {:?} {:?}, not an UPDATE response",
                message.op_code, message.message_type
            )));
        }
        let rcode = message.response_code;
        let mut verified_key = None;
        let mut server_time_s = None;
        if let (Some(key), Some(request_mac)) = (&self.key, &request.mac) {
            match message.signature() {
                // BADSIG and BADKEY replies are unsigned by design (RFC 8945 5.3.2): nothing to
                // verify, and refusing is the safe side anyway.
                Some(tsig) if tsig.data.error.is_some() => {
                    let error = tsig.data.error.unwrap_or(TsigError::Unknown(0));
                    return Err(SendError::Tsig {
                        server: self.server,
                        key: key.name().to_string(),
                        error,
                        hint: tsig_hint(error),
                    });
                }
                Some(_) => {
                    let signer = key.signer().map_err(|why| bad(why.to_string()))?;
                    let (_, time_s, window) = signer
                        .verify_message_byte(reply, Some(request_mac), true)
                        .map_err(|e| {
                            bad(format!(
                                "its TSIG signature does not verify with this key ({e})"
                            ))
                        })?;
                    if !window.contains(&request.time_s) {
                        return Err(bad(format!(
                            "it was signed at {time_s} (Unix s), more than {TSIG_FUDGE_S} s from the update's {}",
                            request.time_s
                        )));
                    }
                    verified_key = Some(key.name().to_string());
                    server_time_s = Some(time_s);
                }
                // An unsigned error reply only makes us stop or retry, the safe side; an
                // unsigned success could be forged and is not believed.
                None if rcode == ResponseCode::NoError => {
                    return Err(bad(
                        "it is not signed although the update was, so its NOERROR is not trusted"
                            .into(),
                    ));
                }
                None => {}
            }
        }
        match rcode {
            ResponseCode::NoError => Ok(Reply {
                id: message.id,
                verified_key,
                server_time_s,
            }),
            ResponseCode::ServFail => Err(SendError::ServFail {
                server: self.server,
                key: key_name,
            }),
            rcode => Err(SendError::Rejected {
                server: self.server,
                key: key_name,
                rcode,
                hint: rcode_hint(rcode, self.key.is_some()),
            }),
        }
    }

    /// Sends the update for `changes` with message id `id` (signed as of the system clock when
    /// a key is set) and waits for the server's answer; `Ok` once the server applied it.
    pub async fn send(
        &self,
        builder: &UpdateBuilder,
        id: u16,
        changes: &[Change],
    ) -> Result<Reply, SendError> {
        let request = self.sign(builder, id, changes, crate::time::unix_ms() / 1_000)?;
        let reply = self.exchange(&request.bytes).await?;
        self.check_reply(&request, &reply)
    }

    /// One TCP exchange: connect, write the length-prefixed message, read one length-prefixed
    /// reply (at most 65 535 bytes, the 16-bit prefix's limit), all within the timeout.
    async fn exchange(&self, message: &[u8]) -> Result<Vec<u8>, SendError> {
        let server = self.server;
        let io = |e: std::io::Error| SendError::Io {
            server,
            why: match e.kind() {
                std::io::ErrorKind::UnexpectedEof => {
                    "the server closed the connection before replying in full".into()
                }
                _ => e.to_string(),
            },
        };
        let length = u16::try_from(message.len()).map_err(|_| SendError::Invalid {
            server,
            error: UpdateError::TooLarge {
                bytes: message.len(),
                max: usize::from(u16::MAX),
            },
        })?;
        let exchange = async {
            let mut stream = TcpStream::connect(server)
                .await
                .map_err(|e| SendError::Connect {
                    server,
                    why: e.to_string(),
                })?;
            let mut framed = Vec::with_capacity(message.len() + 2);
            framed.extend_from_slice(&length.to_be_bytes());
            framed.extend_from_slice(message);
            stream.write_all(&framed).await.map_err(io)?;
            stream.flush().await.map_err(io)?;
            let mut prefix = [0u8; 2];
            stream.read_exact(&mut prefix).await.map_err(io)?;
            let mut reply = vec![0u8; usize::from(u16::from_be_bytes(prefix))];
            stream.read_exact(&mut reply).await.map_err(io)?;
            Ok(reply)
        };
        tokio::time::timeout(self.timeout, exchange)
            .await
            .map_err(|_| SendError::Timeout {
                server,
                timeout: self.timeout,
            })?
    }
}

/// The `rfc2136` provider as the leader's [`Publisher`]: one signed update per batch. After an
/// update is refused (a wrong key, say), the key file is read again before the next attempt,
/// so an operator who fixes the key needs no restart.
pub struct Rfc2136Publisher {
    client: Rfc2136Client,
    builder: UpdateBuilder,
    key_file: PathBuf,
    next_id: u16,
    reload_key: bool,
}

/// Why the `rfc2136` provider cannot be set up (fatal: `ringd` does not start).
#[derive(Debug, thiserror::Error)]
pub enum SetupError {
    /// `dns.zone` or `[dns.rfc2136]` is missing.
    #[error("provider rfc2136 needs dns.zone and [dns.rfc2136]")]
    Incomplete,
    /// The TSIG key file is unusable.
    #[error(transparent)]
    Key(#[from] super::tsig_key::TsigKeyError),
    /// The zone is not a DNS name.
    #[error("zone {zone:?}: {source}")]
    Zone {
        /// The zone as given.
        zone: String,
        /// Why.
        source: super::update::UpdateError,
    },
}

impl Rfc2136Publisher {
    /// Updates `zone` on `server`, signed with the key in `key_file`.
    pub fn new(
        zone: &str,
        server: SocketAddr,
        key_file: &Path,
        timeout: Duration,
    ) -> Result<Self, SetupError> {
        let key = TsigKey::from_file(key_file)?;
        let builder = UpdateBuilder::new(zone).map_err(|source| SetupError::Zone {
            zone: zone.to_string(),
            source,
        })?;
        let seed = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.subsec_nanos() as u16)
            .unwrap_or(0);
        Ok(Self {
            client: Rfc2136Client::new(server, Some(key), timeout),
            builder,
            key_file: key_file.to_path_buf(),
            next_id: seed,
            reload_key: false,
        })
    }
}

impl Publisher for Rfc2136Publisher {
    fn publish(
        &mut self,
        changes: Vec<Change>,
    ) -> futures::future::BoxFuture<'_, Result<(), PublishError>> {
        Box::pin(async move {
            if self.reload_key {
                match TsigKey::from_file(&self.key_file) {
                    Ok(key) => self.client.key = Some(key),
                    Err(e) => {
                        return Err(PublishError {
                            message: e.to_string(),
                            retryable: false,
                        });
                    }
                }
            }
            let id = self.next_id;
            self.next_id = self.next_id.wrapping_add(1);
            match self.client.send(&self.builder, id, &changes).await {
                Ok(_) => {
                    self.reload_key = false;
                    Ok(())
                }
                Err(e) => {
                    self.reload_key = !e.is_retryable();
                    Err(PublishError {
                        message: e.to_string(),
                        retryable: e.is_retryable(),
                    })
                }
            }
        })
    }

    fn server(&self) -> SocketAddr {
        self.client.server
    }
}

#[cfg(test)]
mod tests;
