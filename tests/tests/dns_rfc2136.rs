//! The RFC 2136 client against a real BIND 9 `named` on loopback: updates signed with a key
//! made by `tsig-keygen` are applied (checked with `dig`), and every way the server refuses an
//! update gives the right error, retryable or not, naming the server and the key.
//!
//! A NOERROR reply from `named` means the update is committed (journal written, zone changed),
//! so `dig` is asked right after `send` returns, without waiting.

use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use garden_ring::dns::rfc2136::{Rfc2136Client, SendError};
use garden_ring::dns::tsig_key::TsigKey;
use garden_ring::dns::update::{Change, RecordValue, UpdateBuilder};
use garden_ring_tests::bind::{Bind, tsig_keygen};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

const ZONE: &str = "ring.test";
const KEY: &str = "ring-key";
const TIMEOUT: Duration = Duration::from_secs(10);

/// The TSIG error of a [`SendError::Tsig`], as its `Debug` name (`BadSig`, `BadKey`, ...).
fn tsig_error(err: &SendError) -> Option<String> {
    match err {
        SendError::Tsig { error, .. } => Some(format!("{error:?}")),
        _ => None,
    }
}

fn builder() -> UpdateBuilder {
    UpdateBuilder::new(ZONE).unwrap()
}

/// `name.ring.test`
fn fq(name: &str) -> String {
    format!("{name}.{ZONE}")
}

/// A named with the ring's key, and a client that signs with the key file tsig-keygen wrote.
fn start(dir: &tempfile::TempDir) -> (Bind, Rfc2136Client) {
    let bind = Bind::start(&dir.path().join("bind"), ZONE, Some(KEY));
    let key = TsigKey::from_file(bind.key_file().unwrap()).unwrap();
    assert_eq!(key.name(), KEY);
    let client = Rfc2136Client::new(bind.addr(), Some(key), TIMEOUT);
    (bind, client)
}

/// The SOA serial the server has now.
fn serial(bind: &Bind) -> u32 {
    let soa = bind.dig(ZONE, "SOA");
    assert_eq!(soa.len(), 1, "{soa:?}");
    soa[0].split_whitespace().nth(2).unwrap().parse().unwrap()
}

#[tokio::test]
async fn a_aaaa_cname_and_delete_are_applied() {
    let dir = tempfile::tempdir().unwrap();
    let (bind, client) = start(&dir);
    assert!(bind.dig(&fq("cp-a"), "A").is_empty());

    let reply = client
        .send(
            &builder(),
            1,
            &[
                Change::new(fq("cp-a"), 60, RecordValue::A(Ipv4Addr::new(10, 0, 1, 20))),
                Change::new(
                    fq("cp-b"),
                    60,
                    RecordValue::Aaaa("fd00::20".parse::<Ipv6Addr>().unwrap()),
                ),
                Change::new(fq("api"), 60, RecordValue::Cname(fq("cp-a"))),
            ],
        )
        .await
        .unwrap();
    assert_eq!(reply.id, 1);
    assert_eq!(reply.verified_key.as_deref(), Some(KEY));
    assert!(reply.server_time_s.is_some());
    assert_eq!(bind.dig(&fq("cp-a"), "A"), ["10.0.1.20"]);
    assert_eq!(bind.dig(&fq("cp-b"), "AAAA"), ["fd00::20"]);
    assert_eq!(bind.dig(&fq("api"), "CNAME"), [format!("{}.", fq("cp-a"))]);

    // A name changes type: its A set goes, the CNAME comes; another name is deleted.
    client
        .send(
            &builder(),
            2,
            &[
                Change::new(fq("cp-a"), 60, RecordValue::Cname(fq("cp-b"))),
                Change::new(fq("cp-b"), 0, RecordValue::Delete),
            ],
        )
        .await
        .unwrap();
    assert_eq!(bind.dig(&fq("cp-a"), "CNAME"), [format!("{}.", fq("cp-b"))]);
    assert_eq!(
        bind.dig(&fq("cp-a"), "A"),
        [format!("{}.", fq("cp-b"))],
        "only the CNAME is left at cp-a (dig follows it to nothing)"
    );
    assert!(bind.dig(&fq("cp-b"), "AAAA").is_empty());
    // The TTL is the one sent.
    client
        .send(
            &builder(),
            3,
            &[Change::new(
                fq("cp-c"),
                1234,
                RecordValue::A(Ipv4Addr::new(10, 0, 1, 30)),
            )],
        )
        .await
        .unwrap();
    let full = std::process::Command::new(garden_ring_tests::bind::tool("dig"))
        .args(["+noall", "+answer", "@127.0.0.1", "-p"])
        .arg(bind.port().to_string())
        .args([fq("cp-c").as_str(), "A"])
        .output()
        .unwrap();
    let answer = String::from_utf8_lossy(&full.stdout);
    assert!(answer.contains("\t1234\tIN\tA\t10.0.1.30"), "{answer}");
}

#[tokio::test]
async fn a_batch_replaces_several_names_in_one_transaction() {
    let dir = tempfile::tempdir().unwrap();
    let (bind, client) = start(&dir);
    let names = ["cp-a", "cp-b", "cp-c", "cp-d"];
    let first: Vec<Change> = names
        .iter()
        .zip(1..)
        .map(|(name, i)| Change::new(fq(name), 60, RecordValue::A(Ipv4Addr::new(10, 0, 0, i))))
        .collect();
    client.send(&builder(), 10, &first).await.unwrap();
    let before = serial(&bind);

    // Every name changes: three move, one goes.
    let second = vec![
        Change::new(fq("cp-a"), 60, RecordValue::A(Ipv4Addr::new(10, 9, 0, 1))),
        Change::new(fq("cp-b"), 60, RecordValue::A(Ipv4Addr::new(10, 9, 0, 2))),
        Change::new(
            fq("cp-c"),
            60,
            RecordValue::Aaaa("fd00::3".parse().unwrap()),
        ),
        Change::new(fq("cp-d"), 0, RecordValue::Delete),
    ];
    client.send(&builder(), 11, &second).await.unwrap();
    assert_eq!(bind.dig(&fq("cp-a"), "A"), ["10.9.0.1"]);
    assert_eq!(bind.dig(&fq("cp-b"), "A"), ["10.9.0.2"]);
    assert!(
        bind.dig(&fq("cp-c"), "A").is_empty(),
        "cp-c's A set is replaced"
    );
    assert_eq!(bind.dig(&fq("cp-c"), "AAAA"), ["fd00::3"]);
    assert!(bind.dig(&fq("cp-d"), "A").is_empty());
    // One message, one zone transaction: the serial moved by exactly one.
    assert_eq!(serial(&bind), before + 1);
}

#[tokio::test]
async fn a_wrong_secret_is_fatal_and_named_stays_fine() {
    let dir = tempfile::tempdir().unwrap();
    let (bind, good) = start(&dir);
    // Same key name, another secret.
    let wrong_file = tsig_keygen(&dir.path().join("wrong"), KEY);
    let wrong_key = TsigKey::from_file(&wrong_file).unwrap();
    assert_ne!(
        wrong_key.expose_secret(),
        good.key.as_ref().unwrap().expose_secret()
    );
    let wrong = Rfc2136Client::new(bind.addr(), Some(wrong_key), TIMEOUT);
    let change = [Change::new(
        fq("cp-a"),
        60,
        RecordValue::A(Ipv4Addr::new(10, 0, 1, 20)),
    )];

    let err = wrong.send(&builder(), 20, &change).await.unwrap_err();
    assert!(!err.is_retryable(), "{err:?}");
    assert_eq!(tsig_error(&err).as_deref(), Some("BadSig"), "{err}");
    assert_eq!(
        err.to_string(),
        format!(
            "DNS server {} rejected the update signed with key \"{KEY}\": TSIG BADSIG (wrong secret for this key name?)",
            bind.addr()
        )
    );
    assert!(bind.dig(&fq("cp-a"), "A").is_empty(), "nothing was applied");

    // named is fine and still takes the right key.
    good.send(&builder(), 21, &change).await.unwrap();
    assert_eq!(bind.dig(&fq("cp-a"), "A"), ["10.0.1.20"]);
}

#[tokio::test]
async fn an_unknown_key_name_is_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let (bind, _) = start(&dir);
    let stranger = TsigKey::from_file(&tsig_keygen(&dir.path().join("other"), "stranger")).unwrap();
    let client = Rfc2136Client::new(bind.addr(), Some(stranger), TIMEOUT);
    let err = client
        .send(
            &builder(),
            30,
            &[Change::new(fq("cp-a"), 0, RecordValue::Delete)],
        )
        .await
        .unwrap_err();
    assert!(!err.is_retryable(), "{err:?}");
    assert!(matches!(err, SendError::Tsig { .. }), "{err:?}");
    assert_eq!(tsig_error(&err).as_deref(), Some("BadKey"), "{err}");
    let shown = err.to_string();
    assert!(shown.contains(&bind.addr().to_string()), "{shown}");
    assert!(shown.contains("\"stranger\""), "{shown}");
}

#[tokio::test]
async fn an_unsigned_update_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let (bind, _) = start(&dir);
    let client = Rfc2136Client::new(bind.addr(), None, TIMEOUT);
    let err = client
        .send(
            &builder(),
            40,
            &[Change::new(
                fq("cp-a"),
                60,
                RecordValue::A(Ipv4Addr::new(10, 0, 1, 20)),
            )],
        )
        .await
        .unwrap_err();
    assert!(!err.is_retryable(), "{err:?}");
    let shown = err.to_string();
    assert!(
        shown.starts_with(&format!(
            "DNS server {} rejected the update (unsigned): REFUSED (",
            bind.addr()
        )),
        "{shown}"
    );
    assert!(bind.dig(&fq("cp-a"), "A").is_empty());
}

#[tokio::test]
async fn a_clock_far_off_is_badtime() {
    let dir = tempfile::tempdir().unwrap();
    let (bind, client) = start(&dir);
    let now_s = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_secs();
    // Signed an hour ago, far beyond the 300 s fudge; sent by hand over TCP.
    let request = client
        .sign(
            &builder(),
            50,
            &[Change::new(fq("cp-a"), 0, RecordValue::Delete)],
            now_s - 3600,
        )
        .unwrap();
    let mut stream = tokio::net::TcpStream::connect(bind.addr()).await.unwrap();
    let length = u16::try_from(request.bytes.len()).unwrap();
    stream.write_all(&length.to_be_bytes()).await.unwrap();
    stream.write_all(&request.bytes).await.unwrap();
    let mut prefix = [0u8; 2];
    stream.read_exact(&mut prefix).await.unwrap();
    let mut reply = vec![0u8; usize::from(u16::from_be_bytes(prefix))];
    stream.read_exact(&mut reply).await.unwrap();

    let err = client.check_reply(&request, &reply).unwrap_err();
    assert!(!err.is_retryable(), "{err:?}");
    assert_eq!(tsig_error(&err).as_deref(), Some("BadTime"), "{err}");
    assert!(err.to_string().contains(&format!("\"{KEY}\"")), "{err}");
}

#[tokio::test]
async fn a_server_that_is_down_is_retryable_and_updates_survive_a_restart() {
    let dir = tempfile::tempdir().unwrap();
    let (mut bind, client) = start(&dir);
    let change = |i: u8| {
        [Change::new(
            fq("cp-a"),
            60,
            RecordValue::A(Ipv4Addr::new(10, 0, 2, i)),
        )]
    };
    client.send(&builder(), 60, &change(1)).await.unwrap();

    bind.stop();
    assert!(!bind.is_running());
    let err = client.send(&builder(), 61, &change(2)).await.unwrap_err();
    assert!(err.is_retryable(), "{err:?}");
    assert!(matches!(err, SendError::Connect { .. }), "{err:?}");
    assert!(err.to_string().contains(&bind.addr().to_string()), "{err}");

    bind.restart();
    // The update applied before the stop was kept (journal).
    assert_eq!(bind.dig(&fq("cp-a"), "A"), ["10.0.2.1"]);
    // The same update, retried, now goes through.
    client.send(&builder(), 61, &change(2)).await.unwrap();
    assert_eq!(bind.dig(&fq("cp-a"), "A"), ["10.0.2.2"]);
}

#[test]
fn tsig_keygen_files_load_and_a_missing_key_file_is_named() {
    let dir = tempfile::tempdir().unwrap();
    let path = tsig_keygen(dir.path(), "ring-key");
    let key = TsigKey::from_file(&path).unwrap();
    assert_eq!(key.name(), "ring-key");
    assert_eq!(
        key.expose_secret().len(),
        32,
        "tsig-keygen's hmac-sha256 secret"
    );
    let text = std::fs::read_to_string(&path).unwrap();
    let secret_b64 = text.split('"').nth(3).unwrap();
    assert_eq!(secret_b64.len(), 44, "{text}");
    assert!(!format!("{key:?}").contains(secret_b64));

    let missing = dir.path().join("absent.key");
    let err = TsigKey::from_file(&missing).unwrap_err();
    assert!(
        err.to_string().contains(&*missing.to_string_lossy()),
        "{err}"
    );
}

#[test]
#[should_panic(expected = "run scripts/test.sh")]
fn a_missing_bind_tool_fails_with_advice() {
    garden_ring_tests::bind::tool("named-that-does-not-exist");
}
