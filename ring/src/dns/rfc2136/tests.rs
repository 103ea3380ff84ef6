use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use hickory_proto::op::{Message, MessageType, OpCode, Query, ResponseCode, UpdateMessage};
use hickory_proto::rr::rdata::tsig::TsigError;
use hickory_proto::rr::{Name, RecordType, TSigResponseContext};

use super::*;
use crate::dns::tsig_key::TsigKey;
use crate::dns::update::{Change, RecordValue, UpdateBuilder};

const NOW: u64 = 1_760_000_000;

fn server() -> SocketAddr {
    "127.0.0.1:5300".parse().unwrap()
}

fn key(secret: &[u8]) -> TsigKey {
    TsigKey::new("ring-key", secret.to_vec(), "test.key").unwrap()
}

fn client(key: Option<TsigKey>) -> Rfc2136Client {
    Rfc2136Client::new(server(), key, Duration::from_secs(2))
}

fn builder() -> UpdateBuilder {
    UpdateBuilder::new("ring.test").unwrap()
}

fn changes() -> Vec<Change> {
    vec![Change::new(
        "cp-a.ring.test",
        60,
        RecordValue::A(Ipv4Addr::new(10, 0, 0, 1)),
    )]
}

/// What a server would answer to `request`: rcode, and a TSIG made by `tsig`.
fn reply(id: u16, rcode: ResponseCode, tsig: Option<TSigResponseContext>) -> Vec<u8> {
    let mut message = Message::new(id, MessageType::Response, OpCode::Update);
    message.metadata.response_code = rcode;
    let mut zone = Query::query(Name::from_ascii("ring.test.").unwrap(), RecordType::SOA);
    zone.set_query_class(hickory_proto::rr::DNSClass::IN);
    message.add_zone(zone);
    if let Some(tsig) = tsig {
        let unsigned = message.to_vec().unwrap();
        message.set_signature(tsig.sign(&unsigned).unwrap());
    }
    message.to_vec().unwrap()
}

/// A server's signer context for a reply to `request`, with `secret`.
fn server_tsig(
    request: &SignedUpdate,
    secret: &[u8],
    time: u64,
    error: Option<TsigError>,
) -> TSigResponseContext {
    TSigResponseContext::new(
        request.id,
        time,
        key(secret).signer().unwrap(),
        request.mac.clone().unwrap(),
        error,
    )
}

#[test]
fn unsigned_update_is_the_builders_message() {
    let client = client(None);
    let signed = client.sign(&builder(), 7, &changes(), NOW).unwrap();
    assert_eq!(signed.bytes, builder().build(7, &changes()).unwrap());
    assert_eq!(signed.mac, None);
}

#[test]
fn signing_is_deterministic_and_adds_one_tsig_record() {
    let client = client(Some(key(b"0123456789abcdef0123456789abcdef")));
    let a = client.sign(&builder(), 7, &changes(), NOW).unwrap();
    let b = client.sign(&builder(), 7, &changes(), NOW).unwrap();
    assert_eq!(a, b);
    let later = client.sign(&builder(), 7, &changes(), NOW + 1).unwrap();
    assert_ne!(a.mac, later.mac, "the time is signed");

    let message = Message::from_vec(&a.bytes).unwrap();
    let tsig = message.signature().expect("a TSIG record");
    assert_eq!(tsig.name, Name::from_ascii("ring-key.").unwrap());
    assert_eq!(tsig.data.time, NOW);
    assert_eq!(tsig.data.fudge, TSIG_FUDGE_S);
    assert_eq!(tsig.data.mac.len(), 32, "hmac-sha256, not truncated");
    assert_eq!(Some(tsig.data.mac.clone()), a.mac);
    // The server's check: the MAC verifies with the same secret, and not with another.
    let same = key(b"0123456789abcdef0123456789abcdef").signer().unwrap();
    assert!(same.verify_message_byte(&a.bytes, None, true).is_ok());
    let other = key(b"another secret").signer().unwrap();
    assert!(other.verify_message_byte(&a.bytes, None, true).is_err());
}

#[test]
fn an_invalid_batch_is_refused_before_signing() {
    let client = client(Some(key(b"secret")));
    let err = client
        .sign(
            &builder(),
            1,
            &[Change::new("x.other.test", 60, RecordValue::Delete)],
            NOW,
        )
        .unwrap_err();
    assert!(matches!(err, SendError::Invalid { .. }), "{err:?}");
    assert!(!err.is_retryable());
    assert!(err.to_string().contains("127.0.0.1:5300"), "{err}");
}

#[test]
fn a_reply_signed_with_the_key_is_accepted() {
    let secret = b"0123456789abcdef0123456789abcdef";
    let client = client(Some(key(secret)));
    let request = client.sign(&builder(), 42, &changes(), NOW).unwrap();
    let bytes = reply(
        42,
        ResponseCode::NoError,
        Some(server_tsig(&request, secret, NOW + 3, None)),
    );
    let ok = client.check_reply(&request, &bytes).unwrap();
    assert_eq!(
        ok,
        Reply {
            id: 42,
            verified_key: Some("ring-key".into()),
            server_time_s: Some(NOW + 3),
        }
    );
}

#[test]
fn a_reply_signed_with_another_secret_is_not_trusted() {
    let client = client(Some(key(b"ours")));
    let request = client.sign(&builder(), 42, &changes(), NOW).unwrap();
    let bytes = reply(
        42,
        ResponseCode::NoError,
        Some(server_tsig(&request, b"theirs", NOW, None)),
    );
    let err = client.check_reply(&request, &bytes).unwrap_err();
    assert!(matches!(err, SendError::BadReply { .. }), "{err:?}");
    assert!(!err.is_retryable());
    let shown = err.to_string();
    assert!(shown.contains("127.0.0.1:5300"), "{shown}");
    assert!(shown.contains("\"ring-key\""), "{shown}");
    assert!(shown.contains("does not verify"), "{shown}");
}

#[test]
fn a_reply_chained_to_another_request_is_not_trusted() {
    let secret = b"s3cret";
    let client = client(Some(key(secret)));
    let request = client.sign(&builder(), 42, &changes(), NOW).unwrap();
    let other = client.sign(&builder(), 42, &changes(), NOW + 1).unwrap();
    let bytes = reply(
        42,
        ResponseCode::NoError,
        Some(server_tsig(&other, secret, NOW, None)),
    );
    assert!(matches!(
        client.check_reply(&request, &bytes),
        Err(SendError::BadReply { .. })
    ));
}

#[test]
fn a_reply_signed_outside_the_fudge_is_not_trusted() {
    let secret = b"s3cret";
    let client = client(Some(key(secret)));
    let request = client.sign(&builder(), 42, &changes(), NOW).unwrap();
    let late = NOW + u64::from(TSIG_FUDGE_S) + 1;
    let bytes = reply(
        42,
        ResponseCode::NoError,
        Some(server_tsig(&request, secret, late, None)),
    );
    let err = client.check_reply(&request, &bytes).unwrap_err();
    assert!(err.to_string().contains(&late.to_string()), "{err}");
    // Right at the edge is fine.
    let edge = NOW + u64::from(TSIG_FUDGE_S) - 1;
    let bytes = reply(
        42,
        ResponseCode::NoError,
        Some(server_tsig(&request, secret, edge, None)),
    );
    assert!(client.check_reply(&request, &bytes).is_ok());
}

#[test]
fn an_unsigned_success_is_not_trusted_when_the_update_was_signed() {
    let client = client(Some(key(b"s3cret")));
    let request = client.sign(&builder(), 42, &changes(), NOW).unwrap();
    let err = client
        .check_reply(&request, &reply(42, ResponseCode::NoError, None))
        .unwrap_err();
    assert!(matches!(err, SendError::BadReply { .. }), "{err:?}");
    assert!(err.to_string().contains("not signed"), "{err}");
}

#[test]
fn an_unsigned_exchange_needs_no_tsig() {
    let client = client(None);
    let request = client.sign(&builder(), 42, &changes(), NOW).unwrap();
    let ok = client
        .check_reply(&request, &reply(42, ResponseCode::NoError, None))
        .unwrap();
    assert_eq!(ok.verified_key, None);
}

#[test]
fn tsig_errors_are_fatal_and_say_what_to_check() {
    let secret = b"s3cret";
    let client = client(Some(key(secret)));
    let request = client.sign(&builder(), 42, &changes(), NOW).unwrap();
    let signer = key(secret).signer().unwrap();

    let bad_sig = reply(
        42,
        ResponseCode::NotAuth,
        Some(TSigResponseContext::bad_signature(42, NOW, signer.clone())),
    );
    let err = client.check_reply(&request, &bad_sig).unwrap_err();
    assert!(!err.is_retryable());
    assert_eq!(
        err.to_string(),
        "DNS server 127.0.0.1:5300 rejected the update signed with key \"ring-key\": TSIG BADSIG (wrong secret for this key name?)"
    );

    let bad_key = reply(
        42,
        ResponseCode::NotAuth,
        Some(TSigResponseContext::unknown_key(
            42,
            NOW,
            Name::from_ascii("ring-key.").unwrap(),
        )),
    );
    let err = client.check_reply(&request, &bad_key).unwrap_err();
    assert!(matches!(
        err,
        SendError::Tsig {
            error: TsigError::BadKey,
            ..
        }
    ));
    assert!(err.to_string().contains("TSIG BADKEY"), "{err}");

    let bad_time = reply(
        42,
        ResponseCode::NotAuth,
        Some(server_tsig(
            &request,
            secret,
            NOW + 10_000,
            Some(TsigError::BadTime),
        )),
    );
    let err = client.check_reply(&request, &bad_time).unwrap_err();
    assert!(!err.is_retryable());
    assert!(
        err.to_string().contains("TSIG BADTIME (the clocks"),
        "{err}"
    );
}

#[test]
fn response_codes_map_to_retryable_or_fatal() {
    let secret = b"s3cret";
    let client = client(Some(key(secret)));
    let request = client.sign(&builder(), 42, &changes(), NOW).unwrap();
    let signed = |rcode| reply(42, rcode, Some(server_tsig(&request, secret, NOW, None)));

    let err = client
        .check_reply(&request, &signed(ResponseCode::ServFail))
        .unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert!(err.to_string().contains("SERVFAIL"), "{err}");

    for (rcode, name) in [
        (ResponseCode::Refused, "REFUSED"),
        (ResponseCode::NotAuth, "NOTAUTH"),
        (ResponseCode::NotZone, "NOTZONE"),
        (ResponseCode::FormErr, "FORMERR"),
        (ResponseCode::NotImp, "NOTIMP"),
        (ResponseCode::NXRRSet, "NXRRSET"),
    ] {
        let err = client.check_reply(&request, &signed(rcode)).unwrap_err();
        assert!(!err.is_retryable(), "{rcode:?}: {err:?}");
        let shown = err.to_string();
        assert!(
            shown.starts_with(&format!(
                "DNS server 127.0.0.1:5300 rejected the update signed with key \"ring-key\": {name} ("
            )),
            "{shown}"
        );
    }

    // Unsigned error replies are still reported (stopping is the safe side).
    let err = client
        .check_reply(&request, &reply(42, ResponseCode::Refused, None))
        .unwrap_err();
    assert!(matches!(
        err,
        SendError::Rejected {
            rcode: ResponseCode::Refused,
            ..
        }
    ));
    let unsigned = client_without_key_refused();
    assert!(unsigned.contains("(unsigned): REFUSED"), "{unsigned}");
}

fn client_without_key_refused() -> String {
    let client = client(None);
    let request = client.sign(&builder(), 1, &changes(), NOW).unwrap();
    client
        .check_reply(&request, &reply(1, ResponseCode::Refused, None))
        .unwrap_err()
        .to_string()
}

#[test]
fn replies_that_do_not_answer_this_update_are_refused() {
    let client = client(None);
    let request = client.sign(&builder(), 42, &changes(), NOW).unwrap();
    let err = client
        .check_reply(&request, &reply(43, ResponseCode::NoError, None))
        .unwrap_err();
    assert!(err.to_string().contains("its id is 43"), "{err}");
    assert!(!err.is_retryable());
    // Our own request echoed back is not a response.
    assert!(matches!(
        client.check_reply(&request, &request.bytes),
        Err(SendError::BadReply { .. })
    ));
    assert!(matches!(
        client.check_reply(&request, b"\x00\x2a garbage"),
        Err(SendError::BadReply { .. })
    ));
    assert!(matches!(
        client.check_reply(&request, b""),
        Err(SendError::BadReply { .. })
    ));
}

/// A loopback port where nothing listens.
fn closed_port() -> SocketAddr {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.local_addr().unwrap()
}

#[tokio::test]
async fn a_server_that_is_down_is_retryable() {
    let address = closed_port();
    let client = Rfc2136Client::new(address, None, Duration::from_secs(5));
    let err = client.send(&builder(), 1, &changes()).await.unwrap_err();
    assert!(matches!(err, SendError::Connect { .. }), "{err:?}");
    assert!(err.is_retryable());
    assert!(err.to_string().contains(&address.to_string()), "{err}");
}

#[tokio::test]
async fn a_server_that_never_answers_times_out() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let silent = tokio::spawn(async move {
        let (socket, _) = listener.accept().await.unwrap();
        // Hold the connection open without answering until the test ends.
        std::future::pending::<()>().await;
        drop(socket);
    });
    let client = Rfc2136Client::new(address, None, Duration::from_millis(300));
    let err = client.send(&builder(), 1, &changes()).await.unwrap_err();
    assert_eq!(
        err,
        SendError::Timeout {
            server: address,
            timeout: Duration::from_millis(300)
        }
    );
    assert!(err.is_retryable());
    silent.abort();
}

#[tokio::test]
async fn a_connection_closed_before_the_reply_is_retryable() {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        // Read the request, answer half a length prefix, hang up.
        let mut prefix = [0u8; 2];
        socket.read_exact(&mut prefix).await.unwrap();
        let mut request = vec![0u8; usize::from(u16::from_be_bytes(prefix))];
        socket.read_exact(&mut request).await.unwrap();
        socket.write_all(&[0]).await.unwrap();
    });
    let client = Rfc2136Client::new(address, None, Duration::from_secs(5));
    let err = client.send(&builder(), 1, &changes()).await.unwrap_err();
    assert!(matches!(err, SendError::Io { .. }), "{err:?}");
    assert!(err.is_retryable());
    assert!(err.to_string().contains("closed the connection"), "{err}");
    server.await.unwrap();
}

#[tokio::test]
async fn a_full_exchange_with_a_fake_server() {
    let secret = b"0123456789abcdef0123456789abcdef";
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let address = listener.local_addr().unwrap();
    let server = tokio::spawn(async move {
        let (mut socket, _) = listener.accept().await.unwrap();
        let mut prefix = [0u8; 2];
        socket.read_exact(&mut prefix).await.unwrap();
        let mut request = vec![0u8; usize::from(u16::from_be_bytes(prefix))];
        socket.read_exact(&mut request).await.unwrap();
        // Verify the request as a server would, then sign the answer.
        let signer = key(secret).signer().unwrap();
        let (mac, time, _) = signer.verify_message_byte(&request, None, true).unwrap();
        let id = u16::from_be_bytes([request[0], request[1]]);
        let answer = reply(
            id,
            ResponseCode::NoError,
            Some(TSigResponseContext::new(id, time, signer, mac, None)),
        );
        socket
            .write_all(&u16::try_from(answer.len()).unwrap().to_be_bytes())
            .await
            .unwrap();
        socket.write_all(&answer).await.unwrap();
    });
    let client = Rfc2136Client::new(address, Some(key(secret)), Duration::from_secs(5));
    let ok = client.send(&builder(), 0x4242, &changes()).await.unwrap();
    assert_eq!(ok.id, 0x4242);
    assert_eq!(ok.verified_key.as_deref(), Some("ring-key"));
    server.await.unwrap();
}
