//! Asking one authoritative server what it answers for a name: the check behind "is the new
//! record visible yet". Non-recursive queries straight to each server, with no cache in
//! between (a caching resolver would report what it remembered, not what the server says).
//! UDP first; TCP when the answer is truncated.

use std::net::SocketAddr;
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_proto::rr::{Name, RData, RecordType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

use super::update::RecordValue;

/// Largest DNS message read, in bytes.
const MAX_MESSAGE_BYTES: usize = 65_535;

/// What one server answered for a name.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Observed {
    /// These A, AAAA or CNAME values.
    Values(Vec<RecordValue>),
    /// No such record (NXDOMAIN or no data of the types asked).
    Nothing,
    /// No usable answer: an error code, a timeout, a refused connection.
    Failed(String),
}

impl Observed {
    /// Whether this is what `desired` asks for.
    pub fn matches(&self, desired: &RecordValue) -> bool {
        match (self, desired) {
            (Self::Nothing, RecordValue::Delete) => true,
            (Self::Values(values), desired) => values.len() == 1 && values[0] == *desired,
            _ => false,
        }
    }
}

impl std::fmt::Display for Observed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Values(values) => {
                let shown: Vec<String> = values.iter().map(value_text).collect();
                f.write_str(&shown.join(", "))
            }
            Self::Nothing => f.write_str("no record"),
            Self::Failed(why) => write!(f, "error: {why}"),
        }
    }
}

/// A value as `dig` would show it, with its type.
pub fn value_text(value: &RecordValue) -> String {
    match value {
        RecordValue::A(v4) => format!("A {v4}"),
        RecordValue::Aaaa(v6) => format!("AAAA {v6}"),
        RecordValue::Cname(name) => format!("CNAME {name}"),
        RecordValue::Delete => "no record".into(),
    }
}

/// The types to ask for so that `desired` can be confirmed: its own type, or A and AAAA for
/// "no record".
fn types_for(desired: &RecordValue) -> &'static [RecordType] {
    match desired {
        RecordValue::A(_) => &[RecordType::A],
        RecordValue::Aaaa(_) => &[RecordType::AAAA],
        RecordValue::Cname(_) => &[RecordType::CNAME],
        RecordValue::Delete => &[RecordType::A, RecordType::AAAA],
    }
}

/// Asks `server` for `name` with the types that confirm `desired`, within `timeout`.
pub async fn observe(
    server: SocketAddr,
    name: &str,
    desired: &RecordValue,
    timeout: Duration,
) -> Observed {
    let mut values = Vec::new();
    for record_type in types_for(desired) {
        match tokio::time::timeout(timeout, ask(server, name, *record_type)).await {
            Ok(Ok(found)) => values.extend(found),
            Ok(Err(why)) => return Observed::Failed(why.to_string()),
            Err(_) => {
                return Observed::Failed(format!("no answer within {} ms", timeout.as_millis()));
            }
        }
    }
    if values.is_empty() {
        Observed::Nothing
    } else {
        // The leader keeps one of these per record and server (the keeper's status).
        values.shrink_to_fit();
        Observed::Values(values)
    }
}

/// Why a server's answer could not be had (the keeper shows it and asks again later).
#[derive(Debug, thiserror::Error)]
pub enum QueryError {
    /// The name cannot be asked for.
    #[error("{name:?} is not a DNS name: {why}")]
    BadName {
        /// The name.
        name: String,
        /// Why.
        why: String,
    },
    /// The query does not encode.
    #[error("{0}")]
    Encode(String),
    /// The query does not fit DNS's two-byte TCP length.
    #[error("message too long for DNS")]
    TooLong,
    /// No UDP socket.
    #[error("cannot open a UDP socket: {0}")]
    Socket(std::io::Error),
    /// Sending or receiving failed (`via` is " (UDP)", " (TCP)" or empty).
    #[error("{server}{via}: {source}")]
    Io {
        /// The server.
        server: SocketAddr,
        /// The transport, for the message.
        via: &'static str,
        /// The OS's error.
        source: std::io::Error,
    },
    /// The answer does not decode.
    #[error("{server} sent an undecodable answer: {why}")]
    Undecodable {
        /// The server.
        server: SocketAddr,
        /// Why.
        why: String,
    },
    /// The answer is to another question.
    #[error("{server} answered another question (id {id})")]
    WrongId {
        /// The server.
        server: SocketAddr,
        /// The id it answered.
        id: u16,
    },
    /// The server answered with an error code.
    #[error("{server} answered {code}")]
    Refused {
        /// The server.
        server: SocketAddr,
        /// Its response code.
        code: ResponseCode,
    },
}

/// One question; the A, AAAA and CNAME values owned by `name` in the answer.
async fn ask(
    server: SocketAddr,
    name: &str,
    record_type: RecordType,
) -> Result<Vec<RecordValue>, QueryError> {
    let owner = Name::from_ascii(format!("{}.", name.trim_end_matches('.'))).map_err(|e| {
        QueryError::BadName {
            name: name.to_string(),
            why: e.to_string(),
        }
    })?;
    let id = query_id();
    let mut message = Message::new(id, MessageType::Query, OpCode::Query);
    message.add_query(Query::query(owner.clone(), record_type));
    let bytes = message
        .to_vec()
        .map_err(|e| QueryError::Encode(e.to_string()))?;
    let mut reply = exchange_udp(server, &bytes).await?;
    if reply.metadata.truncation {
        reply = exchange_tcp(server, &bytes).await?;
    }
    if reply.metadata.id != id {
        return Err(QueryError::WrongId {
            server,
            id: reply.metadata.id,
        });
    }
    match reply.metadata.response_code {
        ResponseCode::NoError => {}
        ResponseCode::NXDomain => return Ok(Vec::new()),
        code => return Err(QueryError::Refused { server, code }),
    }
    Ok(reply
        .answers
        .iter()
        .filter(|r| r.name == owner)
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(RecordValue::A(a.0)),
            RData::AAAA(a) => Some(RecordValue::Aaaa(a.0)),
            RData::CNAME(c) => Some(RecordValue::Cname(
                c.0.to_ascii().trim_end_matches('.').to_ascii_lowercase(),
            )),
            _ => None,
        })
        .collect())
}

/// A message id that differs between queries.
fn query_id() -> u16 {
    use std::sync::atomic::{AtomicU16, Ordering};
    static NEXT: AtomicU16 = AtomicU16::new(0);
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.subsec_nanos() as u16)
        .unwrap_or(0);
    NEXT.fetch_add(1, Ordering::Relaxed).wrapping_add(seed)
}

fn undecodable(server: SocketAddr, e: impl std::fmt::Display) -> QueryError {
    QueryError::Undecodable {
        server,
        why: e.to_string(),
    }
}

async fn exchange_udp(server: SocketAddr, bytes: &[u8]) -> Result<Message, QueryError> {
    let local: SocketAddr = if server.is_ipv4() {
        "0.0.0.0:0".parse().expect("valid")
    } else {
        "[::]:0".parse().expect("valid")
    };
    let io = |via: &'static str| {
        move |source| QueryError::Io {
            server,
            via,
            source,
        }
    };
    let socket = UdpSocket::bind(local).await.map_err(QueryError::Socket)?;
    socket.connect(server).await.map_err(io(""))?;
    socket.send(bytes).await.map_err(io(""))?;
    let mut buffer = vec![0; MAX_MESSAGE_BYTES];
    let n = socket.recv(&mut buffer).await.map_err(io(" (UDP)"))?;
    Message::from_vec(&buffer[..n]).map_err(|e| undecodable(server, e))
}

/// Sends one DNS message over TCP (RFC 1035 4.2.2: a two-byte length, then the message) and
/// reads one back.
pub async fn exchange_tcp(server: SocketAddr, bytes: &[u8]) -> Result<Message, QueryError> {
    let length = u16::try_from(bytes.len()).map_err(|_| QueryError::TooLong)?;
    let io = |source| QueryError::Io {
        server,
        via: " (TCP)",
        source,
    };
    let mut stream = TcpStream::connect(server).await.map_err(io)?;
    let mut framed = Vec::with_capacity(bytes.len() + 2);
    framed.extend_from_slice(&length.to_be_bytes());
    framed.extend_from_slice(bytes);
    stream.write_all(&framed).await.map_err(io)?;
    let mut length = [0u8; 2];
    stream.read_exact(&mut length).await.map_err(io)?;
    let mut buffer = vec![0; usize::from(u16::from_be_bytes(length))];
    stream.read_exact(&mut buffer).await.map_err(io)?;
    Message::from_vec(&buffer).map_err(|e| undecodable(server, e))
}

#[cfg(test)]
mod tests {
    use std::net::Ipv4Addr;

    use super::*;

    #[test]
    fn matching_is_exact() {
        let a = RecordValue::A(Ipv4Addr::LOCALHOST);
        assert!(Observed::Values(vec![a.clone()]).matches(&a));
        assert!(!Observed::Values(vec![a.clone(), a.clone()]).matches(&a));
        assert!(!Observed::Nothing.matches(&a));
        assert!(Observed::Nothing.matches(&RecordValue::Delete));
        assert!(!Observed::Failed("x".into()).matches(&RecordValue::Delete));
        assert!(!Observed::Values(vec![a]).matches(&RecordValue::Delete));
    }

    #[tokio::test]
    async fn an_unreachable_server_is_a_failure_not_an_answer() {
        // A port nobody listens on: UDP gets "connection refused" or nothing.
        let socket = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
        let server = socket.local_addr().unwrap();
        drop(socket);
        let seen = observe(
            server,
            "x.ring.test",
            &RecordValue::Delete,
            Duration::from_millis(300),
        )
        .await;
        assert!(matches!(seen, Observed::Failed(_)), "{seen:?}");
    }
}
