//! Mutual TLS with real `ringd` and `ringctl` processes: who gets in, who may do what, a peer
//! claiming another member's id, certificate rotation without a failover, and secrets never
//! printed.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};
use std::sync::Arc;
use std::time::Duration;

use garden_ring::pb;
use garden_ring::raft::MemberNode;
use garden_ring::raft::network::{PeerNetwork, PeerPool};
use garden_ring::tls::client::{Expect, client_config};
use garden_ring::tls::material::{Material, parse_certs, sha256_hex};
use garden_ring::tls::{Identity, Role, Security, TlsFiles, TlsStore};
use garden_ring_tests::{
    Ring, RingOptions, admin_identity, binary, certs_dir, ensure_cert, eventually, status,
};
use serde_json::Value;

const FORM: Duration = Duration::from_secs(20);

fn identity(role: Role, name: &str) -> Identity {
    Identity::new(role, name).unwrap()
}

/// `ringctl` with explicit certificate flags (no client config).
fn ringctl_as(ring: &Ring, tls: &[&Path], args: &[&str]) -> Output {
    let endpoints: Vec<String> = ring.procs.iter().map(|p| p.admin()).collect();
    let mut cmd = Command::new(binary("ringctl"));
    cmd.arg("--endpoint").arg(endpoints.join(","));
    for (flag, path) in ["--ca-file", "--cert-file", "--key-file"].iter().zip(tls) {
        cmd.arg(flag).arg(path);
    }
    cmd.args(args)
        .env_remove("RINGCTL_CONFIG")
        .env_remove("RINGCTL_ENDPOINTS")
        .output()
        .expect("run ringctl")
}

fn stderr(out: &Output) -> String {
    String::from_utf8_lossy(&out.stderr).into_owned()
}

fn refused_with(out: &Output, prefix: &str, needle: &str) {
    assert!(!out.status.success(), "expected a refusal, got success");
    let err = stderr(out);
    assert!(
        err.starts_with(&format!("ringctl: error: {prefix}")) && err.contains(needle),
        "expected {prefix:?} mentioning {needle:?}, got: {err}"
    );
}

fn client_as(ring: &Ring, files: TlsFiles) -> garden_ring::admin::AdminClient {
    let store = TlsStore::load(files, None).expect("load client certificate");
    garden_ring::admin::AdminClient::new(
        ring.procs.iter().map(|p| p.admin()).collect(),
        Security::Tls(store),
        "ignored-with-tls",
    )
    .unwrap()
    .with_request_timeout(Duration::from_secs(20))
}

async fn pause_as(
    client: &garden_ring::admin::AdminClient,
) -> Result<pb::SetPausedResponse, garden_ring::admin::ClientError> {
    client
        .call(
            pb::SetPausedRequest {
                paused: true,
                reason: "security test".into(),
            },
            |mut c, r| async move { c.set_paused(r).await },
        )
        .await
}

#[tokio::test]
async fn only_the_right_certificates_get_in_and_roles_limit_them() {
    let ring = Ring::start(RingOptions::default());
    ring.wait_leader(&[0, 1, 2], &[], FORM).await;
    let certs = certs_dir(ring.dir.path());
    let ca = certs.join("ca.pem");

    // No client certificate at all: UNAUTHENTICATED, with what to do.
    let out = ringctl_as(&ring, &[&ca], &["status"]);
    refused_with(&out, "unauthenticated", "requires a client certificate");

    // Plain text against a TLS port: refused, with a hint.
    let out = ringctl_as(&ring, &[], &["--insecure", "status"]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("probably requires TLS"),
        "{}",
        stderr(&out)
    );

    // A certificate of another CA (the client trusts both CAs, so only the ring can refuse it).
    let other = tempfile::tempdir().unwrap();
    let mallory = ensure_cert(other.path(), &identity(Role::Admin, "mallory"));
    let bundle = other.path().join("bundle.pem");
    std::fs::write(
        &bundle,
        std::fs::read_to_string(&ca).unwrap() + &std::fs::read_to_string(&mallory.ca_file).unwrap(),
    )
    .unwrap();
    let out = ringctl_as(
        &ring,
        &[&bundle, &mallory.cert_file, &mallory.key_file],
        &["pause"],
    );
    refused_with(&out, "unauthenticated", "not issued by this ring's CA");

    // A viewer reads but cannot write.
    let viewer = ensure_cert(&certs, &identity(Role::Viewer, "auditor"));
    let as_viewer = [&*viewer.ca_file, &*viewer.cert_file, &*viewer.key_file];
    let out = ringctl_as(&ring, &as_viewer, &["status", "--output", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = ringctl_as(&ring, &as_viewer, &["pause", "--reason", "nope"]);
    refused_with(&out, "permission denied", "viewer:auditor is a viewer");
    let err = pause_as(&client_as(&ring, viewer.clone()))
        .await
        .unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::PermissionDenied), "{err}");

    // A member certificate is for the peer port only.
    let member = ensure_cert(&certs, &identity(Role::Member, "a"));
    let out = ringctl_as(
        &ring,
        &[&member.ca_file, &member.cert_file, &member.key_file],
        &["pause"],
    );
    refused_with(
        &out,
        "permission denied",
        "member:a may not use the admin service",
    );
    let err = pause_as(&client_as(&ring, member)).await.unwrap_err();
    assert_eq!(err.code(), Some(tonic::Code::PermissionDenied), "{err}");

    // Nothing of that changed the ring.
    let s = status(&ring.procs[0]).await.unwrap();
    assert!(!s.paused, "a refused write was applied");

    // An admin certificate may write, through any member (followers forward it to the
    // leader), and history records the certificate's identity, not a claim.
    for i in 0..3 {
        let out = garden_ring_tests::ringctl(
            &ring.client_config,
            &[ring.procs[i].admin()],
            &["pause", "--reason", "admin test"],
        );
        assert!(out.status.success(), "via member {i}: {}", stderr(&out));
    }
    let out = ring.ringctl(&["history", "--output", "json"]);
    let events: Value = serde_json::from_slice(&out.stdout).unwrap();
    let actors: Vec<&str> = events
        .as_array()
        .unwrap()
        .iter()
        .filter(|e| e["action"] == "ring.pause")
        .map(|e| e["actor"].as_str().unwrap())
        .collect();
    assert_eq!(actors, vec![admin_identity().to_string(); 3]);

    // Every refusal was logged by the member that refused it.
    let logs = ring.logs();
    for needle in [
        "requires a client certificate",
        "not issued by this ring's CA",
        "viewer:auditor is a viewer",
        "member:a may not use the admin service",
    ] {
        assert!(logs.contains(needle), "no log line mentions {needle:?}");
    }
}

fn member_node(ring: &Ring, i: usize) -> MemberNode {
    let c = &ring.procs[i].config;
    MemberNode {
        name: c.name.clone(),
        zone: c.zone.clone(),
        address: c.peer_address(),
        admin_address: c.admin_address(),
    }
}

#[tokio::test]
async fn a_peer_cannot_claim_another_members_id() {
    let ring = Ring::start(RingOptions::default());
    ring.wait_leader(&[0, 1, 2], &[], FORM).await;
    let certs = certs_dir(ring.dir.path());
    // Member b's real certificate and key.
    let b = TlsStore::load(ensure_cert(&certs, &identity(Role::Member, "b")), None).unwrap();
    let pool = Arc::new(PeerPool::new(Security::Tls(b)));
    let a = member_node(&ring, 0);
    let timeout = Duration::from_secs(5);

    // As itself (id 2), b is answered.
    let honest = PeerNetwork::new(2, pool.clone())
        .client(1, &a)
        .ping(timeout)
        .await;
    assert!(honest.is_ok(), "{honest:?}");

    // Claiming to be c (id 3) with b's certificate: refused.
    let forged = PeerNetwork::new(3, pool.clone())
        .client(1, &a)
        .ping(timeout)
        .await
        .unwrap_err()
        .to_string();
    assert!(
        forged.contains("PermissionDenied") || forged.contains("permission"),
        "{forged}"
    );
    assert!(
        forged.contains("certificate is for member:b")
            && forged.contains("claims to come from member 3"),
        "{forged}"
    );
    eventually(
        Duration::from_secs(5),
        "member a logs the refusal",
        || async {
            ring.procs[0]
                .log()
                .contains("claims to come from member 3")
                .then_some(())
        },
    )
    .await;

    // An admin certificate is not let onto the peer port at all.
    let admin = TlsStore::load(ensure_cert(&certs, &admin_identity()), None).unwrap();
    let err = PeerNetwork::new(2, Arc::new(PeerPool::new(Security::Tls(admin))))
        .client(1, &a)
        .ping(timeout)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("may not use the peer service"), "{err}");

    // And a client checks the server too: member a's port is not member c's.
    let mut wrong = a.clone();
    wrong.name = "c".into();
    let err = PeerNetwork::new(2, pool)
        .client(3, &wrong)
        .ping(timeout)
        .await
        .unwrap_err()
        .to_string();
    assert!(err.contains("expected member \"c\""), "{err}");
}

/// SHA-256 of the certificate in a PEM file.
fn pem_sha256(path: &Path) -> String {
    let certs = parse_certs("certificate file", path, &std::fs::read(path).unwrap()).unwrap();
    sha256_hex(certs[0].as_ref())
}

/// SHA-256 of the certificate a server presents on `address`.
async fn presented_sha256(material: &Material, address: &str) -> String {
    let tcp = tokio::net::TcpStream::connect(address).await.unwrap();
    let config = client_config(material, Expect::AnyMember);
    let name = rustls_pki_types::ServerName::try_from("127.0.0.1").unwrap();
    let tls = tokio_rustls::TlsConnector::from(config)
        .connect(name, tcp)
        .await
        .unwrap();
    let chain = tls.get_ref().1.peer_certificates().unwrap();
    sha256_hex(chain[0].as_ref())
}

#[tokio::test]
async fn rotating_member_certificates_causes_no_failover() {
    let ring = Ring::start(RingOptions::default());
    let leader = ring.wait_leader(&[0, 1, 2], &[], FORM).await;
    let before = status(&ring.procs[0]).await.unwrap();
    let certs = certs_dir(ring.dir.path());
    let admin = Material::load(&ensure_cert(&certs, &admin_identity()), None).unwrap();

    // A broken file is reported and the certificate in use stays.
    let key_a = certs.join("member-a-key.pem");
    let good_key = std::fs::read(&key_a).unwrap();
    std::fs::write(&key_a, "not a key").unwrap();
    eventually(
        Duration::from_secs(10),
        "a reports the broken key",
        || async {
            let s = status(&ring.procs[0]).await.ok()?;
            let tls = s.tls?;
            tls.reload_error.contains("member-a-key.pem").then_some(())
        },
    )
    .await;
    std::fs::write(&key_a, good_key).unwrap();

    // Rotate: a new certificate and key for every member, made by the real ringctl.
    let mut new_sha = Vec::new();
    for p in &ring.procs {
        let out = Command::new(binary("ringctl"))
            .args([
                "certs", "issue", "--role", "member", "--force", "--days", "7",
            ])
            .args(["--name", &p.config.name, "--dir"])
            .arg(&certs)
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", stderr(&out));
        let file: PathBuf = certs.join(format!("member-{}.pem", p.config.name));
        new_sha.push(pem_sha256(&file));
    }

    // Every member loads its new certificate and presents it on both ports.
    let rotated_at = std::time::Instant::now();
    for (i, p) in ring.procs.iter().enumerate() {
        let want = new_sha[i].clone();
        eventually(
            Duration::from_secs(10),
            "the new certificate is loaded",
            || async {
                let tls = status(p).await.ok()?.tls?;
                (tls.certificate_sha256 == want && tls.reload_error.is_empty()).then_some(())
            },
        )
        .await;
        assert_eq!(presented_sha256(&admin, &p.admin()).await, new_sha[i]);
        assert_eq!(
            presented_sha256(&admin, &p.config.peer_address()).await,
            new_sha[i],
            "peer port of {}",
            p.config.name
        );
    }

    println!(
        "all members present their new certificates {} ms after the files were replaced (reload_interval_ms 200)",
        rotated_at.elapsed().as_millis()
    );

    // ... and as a client: the followers see the leader's new certificate on its heartbeats,
    // and the leader sees each follower's when it forwards a write.
    let leader_i = ring.index_of(leader);
    for (i, p) in ring.procs.iter().enumerate() {
        if i == leader_i {
            continue;
        }
        let out = garden_ring_tests::ringctl(
            &ring.client_config,
            &[p.admin()],
            &["pause", "--reason", "rotation"],
        );
        assert!(out.status.success(), "{}", stderr(&out));
        let leader_name = ring.procs[leader_i].config.name.clone();
        let want = new_sha[leader_i].clone();
        eventually(
            Duration::from_secs(10),
            "follower saw the leader's new certificate",
            || async {
                let tls = status(p).await.ok()?.tls?;
                tls.peers
                    .iter()
                    .any(|c| c.member == leader_name && c.certificate_sha256 == want)
                    .then_some(())
            },
        )
        .await;
    }
    let s = status(&ring.procs[leader_i]).await.unwrap();
    let peers = s.tls.unwrap().peers;
    for (i, p) in ring.procs.iter().enumerate() {
        if i != leader_i {
            assert!(
                peers
                    .iter()
                    .any(|c| c.member == p.config.name && c.certificate_sha256 == new_sha[i]),
                "the leader did not see {}'s new certificate: {peers:?}",
                p.config.name
            );
        }
    }

    // No failover: same leader, same term, everyone healthy.
    println!(
        "leader {leader} and term {} before and after the rotation",
        before.term
    );
    for p in &ring.procs {
        let s = status(p).await.unwrap();
        assert_eq!(s.leader_id, leader, "leadership moved");
        assert_eq!(s.term, before.term, "a new term began (an election)");
        assert!(s.members.iter().all(|m| m.health == "healthy"), "{s:?}");
    }
}

#[tokio::test]
async fn secrets_never_reach_logs_status_history_or_errors() {
    let mut ring = Ring::prepare(RingOptions::default());
    for p in &mut ring.procs {
        p.config.log.level = "debug,openraft=info".into();
        p.spawn();
    }
    ring.wait_leader(&[0, 1, 2], &[], FORM).await;
    let certs = certs_dir(ring.dir.path());

    // Every line of every private key's body (the parts of a key that are secret).
    let mut secrets: Vec<String> = Vec::new();
    for entry in std::fs::read_dir(&certs).unwrap() {
        let path = entry.unwrap().path();
        if path.to_string_lossy().ends_with("-key.pem") {
            secrets.extend(
                std::fs::read_to_string(&path)
                    .unwrap()
                    .lines()
                    .filter(|l| !l.starts_with("-----") && l.len() >= 16)
                    .map(str::to_string),
            );
        }
    }
    assert!(secrets.len() >= 8, "found the keys' bodies");
    let marker = "SECRET-MARKER-7f3a";

    // Error paths that read secrets: a key file that is no key (on a member's reload, and in
    // ringctl), and a key of another certificate.
    let mut outputs = Vec::new();
    let bad_key = ring.dir.path().join("bad-key.pem");
    std::fs::write(&bad_key, format!("{marker}\n{}\n", secrets[0])).unwrap();
    let admin = ensure_cert(&certs, &admin_identity());
    let out = ringctl_as(
        &ring,
        &[&admin.ca_file, &admin.cert_file, &bad_key],
        &["status"],
    );
    assert!(!out.status.success());
    outputs.push(stderr(&out));
    let member_b = ensure_cert(&certs, &identity(Role::Member, "b"));
    let out = ringctl_as(
        &ring,
        &[&admin.ca_file, &admin.cert_file, &member_b.key_file],
        &["status"],
    );
    assert!(!out.status.success());
    outputs.push(stderr(&out));

    let key_c = certs.join("member-c-key.pem");
    let good = std::fs::read(&key_c).unwrap();
    std::fs::write(&key_c, std::fs::read(&bad_key).unwrap()).unwrap();
    eventually(
        Duration::from_secs(10),
        "c reports its broken key",
        || async {
            let tls = status(&ring.procs[2]).await.ok()?.tls?;
            (!tls.reload_error.is_empty()).then_some(())
        },
    )
    .await;
    for what in [
        &["status", "--output", "json"][..],
        &["history", "--output", "json"],
    ] {
        let out = garden_ring_tests::ringctl(&ring.client_config, &[ring.procs[2].admin()], what);
        assert!(out.status.success(), "{}", stderr(&out));
        outputs.push(String::from_utf8_lossy(&out.stdout).into_owned());
    }
    std::fs::write(&key_c, good).unwrap();
    // Some writes, so the logs hold more than start-up.
    let out = ring.ringctl(&["pause", "--reason", "secret test"]);
    assert!(out.status.success(), "{}", stderr(&out));

    outputs.push(ring.logs());
    let everything = outputs.join("\n");
    assert!(
        everything.contains("member-c-key.pem"),
        "the errors name the file"
    );
    assert!(
        !everything.contains(marker),
        "a key file's content was printed"
    );
    for secret in &secrets {
        assert!(
            !everything.contains(secret.as_str()),
            "a private key line was printed"
        );
    }
}

#[tokio::test]
async fn without_tls_only_by_explicit_choice_and_with_a_warning() {
    let ring = Ring::start(RingOptions {
        insecure: true,
        ..RingOptions::default()
    });
    ring.wait_leader(&[0, 1, 2], &[], FORM).await;
    let out = ring.ringctl(&["pause", "--reason", "lab"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let s = status(&ring.procs[0]).await.unwrap();
    assert!(s.tls.is_none(), "status says TLS is off");
    for p in &ring.procs {
        assert!(p.log().contains("running WITHOUT TLS"), "{}", p.log());
    }
    // A client that expects TLS gets a clear failure from a plain-text member.
    let certs = tempfile::tempdir().unwrap();
    let admin = ensure_cert(certs.path(), &admin_identity());
    let out = ringctl_as(
        &ring,
        &[&admin.ca_file, &admin.cert_file, &admin.key_file],
        &["status"],
    );
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("no member answered"),
        "{}",
        stderr(&out)
    );
}

#[tokio::test]
async fn oversized_admin_messages_are_refused_before_they_reach_the_log() {
    let ring = Ring::start(RingOptions::default());
    ring.wait_leader(&[0, 1, 2], &[], FORM).await;
    // A client that does not limit what it sends, unlike ringctl.
    let channel = garden_ring::tls::client::connect(
        &ring.procs[0].admin(),
        &ring.security,
        Expect::AnyMember,
        Duration::from_secs(2),
        |e| e,
    )
    .await
    .unwrap();
    let mut raw = pb::admin_client::AdminClient::new(channel)
        .max_encoding_message_size(usize::MAX)
        .max_decoding_message_size(usize::MAX);
    let huge = "x".repeat(5 * 1024 * 1024);
    let err = raw
        .set_paused(pb::SetPausedRequest {
            paused: true,
            reason: huge.clone(),
        })
        .await
        .unwrap_err();
    assert!(err.message().contains("too large"), "{err:?}");
    // Under the transport limit but over the proposal limits: refused by validation.
    let err = raw
        .set_paused(pb::SetPausedRequest {
            paused: true,
            reason: huge[..100_000].to_string(),
        })
        .await
        .unwrap_err();
    assert_eq!(err.code(), tonic::Code::InvalidArgument, "{err:?}");
    let after = status(&ring.procs[0]).await.unwrap();
    assert!(!after.paused);
    let out = ring.ringctl(&["history", "--output", "json"]);
    let events: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert!(
        events
            .as_array()
            .unwrap()
            .iter()
            .all(|e| e["action"] != "ring.pause"),
        "nothing reached the log: {events}"
    );
}

/// `Status` through `client`.
async fn status_as(
    client: &garden_ring::admin::AdminClient,
) -> Result<pb::StatusResponse, garden_ring::admin::ClientError> {
    client
        .call(pb::StatusRequest::default(), |mut c, r| async move {
            c.status(r).await
        })
        .await
}

/// Polls `status` through `client` every 5 ms until it is refused as revoked; the refusal and
/// how long after `since` it came.
async fn refused_as_revoked(
    client: &garden_ring::admin::AdminClient,
    since: std::time::Instant,
) -> (String, Duration) {
    eventually(
        Duration::from_secs(5),
        "the revoked certificate is refused",
        || async {
            let err = status_as(client).await.err()?;
            let text = err.to_string();
            (err.code() == Some(tonic::Code::Unauthenticated) && text.contains("was revoked at"))
                .then(|| (text, since.elapsed()))
        },
    )
    .await
}

/// An admin client of member `i` only, with the certificate in `files`.
fn client_of(ring: &Ring, i: usize, files: &TlsFiles) -> garden_ring::admin::AdminClient {
    let store = TlsStore::load(files.clone(), None).expect("load client certificate");
    garden_ring::admin::AdminClient::new(
        vec![ring.procs[i].admin()],
        Security::Tls(store),
        "ignored-with-tls",
    )
    .unwrap()
    .with_request_timeout(Duration::from_secs(2))
}

#[tokio::test]
async fn a_revoked_certificate_is_refused_by_every_member_within_a_second() {
    let mut ring = Ring::start(RingOptions::default());
    ring.wait_leader(&[0, 1, 2], &[], FORM).await;
    let certs = certs_dir(ring.dir.path());
    let leaky = ensure_cert(&certs, &identity(Role::Admin, "leaky"));
    let cert = leaky.cert_file.display().to_string();
    let clients: Vec<_> = (0..3).map(|i| client_of(&ring, i, &leaky)).collect();
    // A connection to every member, open before the revocation (an AdminClient connects per
    // call; a channel stays connected).
    let store = TlsStore::load(leaky.clone(), None).unwrap();
    let mut open = Vec::new();
    for p in &ring.procs {
        let channel = garden_ring::tls::client::connect(
            &p.admin(),
            &Security::Tls(store.clone()),
            Expect::AnyMember,
            Duration::from_secs(2),
            |e| e,
        )
        .await
        .unwrap();
        let mut client = pb::admin_client::AdminClient::new(channel);
        client
            .status(pb::StatusRequest::default())
            .await
            .expect("accepted before the revocation");
        open.push(client);
    }

    let out = ring.ringctl(&["certs", "revoke", "--cert", &cert, "--reason", "key leaked"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let revoked_at = std::time::Instant::now();
    let said = String::from_utf8_lossy(&out.stdout);
    assert!(
        said.contains("(admin:leaky)") && said.contains("by admin:tester: key leaked"),
        "{said}"
    );
    let mut took = Vec::new();
    for (i, client) in clients.iter().enumerate() {
        let (why, after) = refused_as_revoked(client, revoked_at).await;
        assert!(
            why.contains("certificate for admin:leaky")
                && why.contains("by admin:tester: key leaked"),
            "member {i}: {why}"
        );
        took.push(after.as_millis());
    }
    println!("revoke -> refused, ms after ringctl returned, members a, b, c: {took:?}");
    assert!(
        took.iter().all(|ms| *ms < 1_000),
        "a member refused it only after {took:?} ms"
    );
    // The connections open before were closed, on every member: the next call on one fails.
    for (i, client) in open.iter_mut().enumerate() {
        let err = client
            .status(pb::StatusRequest::default())
            .await
            .unwrap_err();
        println!("member {i}: the connection open before says: {err}");
    }
    for p in &ring.procs {
        eventually(
            Duration::from_secs(5),
            &format!("member {} logs the connection it closed", p.config.name),
            || async {
                p.log()
                    .contains("connection(s) whose certificate was revoked")
                    .then_some(())
            },
        )
        .await;
    }

    // Listed, for admins and viewers; only admins revoke.
    let out = ring.ringctl(&["certs", "list-revoked", "--output", "json"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");
    assert_eq!(list[0]["subject"], "admin:leaky", "{list}");
    assert_eq!(list[0]["actor"], "admin:tester", "{list}");
    let viewer = ensure_cert(&certs, &identity(Role::Viewer, "auditor"));
    let as_viewer = [&*viewer.ca_file, &*viewer.cert_file, &*viewer.key_file];
    let out = ringctl_as(&ring, &as_viewer, &["certs", "list-revoked"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let out = ringctl_as(
        &ring,
        &as_viewer,
        &["certs", "unrevoke", "--cert", &cert, "--reason", "mine"],
    );
    refused_with(&out, "permission denied", "viewer:auditor is a viewer");

    // Bad input: one clear line each, and the list stays as it is.
    for (args, prefix, needle) in [
        (
            vec!["certs", "revoke", "--cert", &cert, "--reason", "again"],
            "already exists",
            "is already revoked",
        ),
        (
            vec!["certs", "unrevoke", "--serial", "ffff", "--reason", "typo"],
            "not found",
            "is not revoked",
        ),
        (
            vec!["certs", "revoke", "--serial", "xyz", "--reason", "bad"],
            "invalid argument",
            "must be hexadecimal",
        ),
        (
            vec!["certs", "revoke", "--serial", "1f", "--reason", " "],
            "invalid argument",
            "must say why",
        ),
    ] {
        let out = ring.ringctl(&args);
        refused_with(&out, prefix, needle);
        assert_eq!(stderr(&out).lines().count(), 1, "{}", stderr(&out));
    }
    let out = ring.ringctl(&[
        "certs",
        "revoke",
        "--cert",
        "/nonexistent.pem",
        "--reason",
        "x",
    ]);
    assert!(!out.status.success());
    assert!(
        stderr(&out).contains("/nonexistent.pem"),
        "{}",
        stderr(&out)
    );
    let out = ring.ringctl(&["certs", "list-revoked", "--output", "json"]);
    let list: Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(list.as_array().map(Vec::len), Some(1), "{list}");

    // A restarted member still refuses it (from its own state, before anything new commits).
    ring.procs[2].terminate();
    ring.procs[2].spawn();
    let restarted = client_of(&ring, 2, &leaky);
    eventually(FORM, "the restarted member answers", || async {
        status(&ring.procs[2]).await.ok()
    })
    .await;
    refused_as_revoked(&restarted, std::time::Instant::now()).await;

    // Unrevoked: accepted again, by every member.
    let out = ring.ringctl(&[
        "certs",
        "unrevoke",
        "--cert",
        &cert,
        "--reason",
        "false alarm",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    for i in 0..3 {
        let client = client_of(&ring, i, &leaky);
        eventually(Duration::from_secs(5), "accepted again", || async {
            status_as(&client).await.ok()
        })
        .await;
    }
}

#[tokio::test]
async fn a_revoked_member_takes_no_part_in_raft_until_it_has_a_new_certificate() {
    let ring = Ring::start(RingOptions::default());
    let leader = ring.wait_leader(&[0, 1, 2], &[], FORM).await;
    // The victim is a follower; its old certificate is kept for the peer port check.
    let victim = (0..3).find(|&i| ring.procs[i].config.id != leader).unwrap();
    let name = ring.procs[victim].config.name.clone();
    let certs = certs_dir(ring.dir.path());
    let files = ensure_cert(&certs, &identity(Role::Member, &name));
    let old = TlsStore::load(files.clone(), None).unwrap();
    let cert = files.cert_file.display().to_string();

    let out = ring.ringctl(&[
        "certs",
        "revoke",
        "--cert",
        &cert,
        "--reason",
        "host stolen",
    ]);
    assert!(out.status.success(), "{}", stderr(&out));
    let revoked_at = std::time::Instant::now();
    // The peer port of both other members refuses it too.
    let mut took = Vec::new();
    for a in (0..3).filter(|&i| i != victim) {
        let err = eventually(
            Duration::from_secs(5),
            "the peer port refuses it",
            || async {
                let err = PeerNetwork::new(
                    ring.procs[victim].config.id,
                    Arc::new(PeerPool::new(Security::Tls(old.clone()))),
                )
                .client(ring.procs[a].config.id, &member_node(&ring, a))
                .ping(Duration::from_secs(2))
                .await
                .err()?
                .to_string();
                err.contains("was revoked at").then_some(err)
            },
        )
        .await;
        assert!(err.contains(&format!("member:{name}")), "{err}");
        took.push(revoked_at.elapsed().as_millis());
    }
    println!(
        "member {name}'s certificate refused on the others' peer ports, ms after ringctl returned: {took:?}"
    );
    assert!(took.iter().all(|ms| *ms < 1_000), "{took:?}");

    // Writes go on without it; it does not see them, and the leader shows why.
    let on_leader = ring.procs[ring.index_of(leader)].client();
    garden_ring_tests::add_control_plane(
        &on_leader,
        garden_ring_tests::control_plane("after-revoke", None),
    )
    .await
    .unwrap();
    let shown = eventually(FORM, "the leader shows the member revoked", || async {
        let s = status(&ring.procs[ring.index_of(leader)]).await.ok()?;
        let m = s.members.into_iter().find(|m| m.name == name)?;
        (!m.certificate_revoked.is_empty()).then_some(m)
    })
    .await;
    assert!(
        shown.certificate_revoked.contains("host stolen"),
        "{shown:?}"
    );
    let out = garden_ring_tests::ringctl(
        &ring.client_config,
        &[ring.procs[ring.index_of(leader)].admin()],
        &["member", "list"],
    );
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("CERTIFICATE REVOKED"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    let stale = pb::StatusRequest { stale: true };
    let s = ring.procs[victim]
        .client()
        .call(stale, |mut c, r| async move { c.status(r).await })
        .await
        .unwrap();
    assert!(
        !s.control_planes.iter().any(|c| c.name == "after-revoke"),
        "the revoked member applied a write made after its revocation"
    );

    // A new certificate (new serial) brings it back: it catches up.
    let out = Command::new(binary("ringctl"))
        .args([
            "certs", "issue", "--role", "member", "--force", "--name", &name, "--dir",
        ])
        .arg(&certs)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let back_at = std::time::Instant::now();
    eventually(
        FORM,
        "the member catches up with its new certificate",
        || async {
            let s = ring.procs[victim]
                .client()
                .call(stale, |mut c, r| async move { c.status(r).await })
                .await
                .ok()?;
            s.control_planes
                .iter()
                .any(|c| c.name == "after-revoke")
                .then_some(())
        },
    )
    .await;
    println!(
        "member {name} back in Raft {} ms after its new certificate was written",
        back_at.elapsed().as_millis()
    );
    eventually(FORM, "the leader no longer shows it revoked", || async {
        let s = status(&ring.procs[ring.index_of(leader)]).await.ok()?;
        s.members
            .iter()
            .all(|m| m.certificate_revoked.is_empty())
            .then_some(())
    })
    .await;
}

#[tokio::test]
async fn an_expiring_certificate_is_seen_weeks_ahead() {
    let mut ring = Ring::prepare(RingOptions::default());
    let metrics = ring.free_addresses(1)[0];
    ring.procs[0].config.metrics.listen = Some(metrics);
    for p in &mut ring.procs {
        p.spawn();
    }
    ring.wait_leader(&[0, 1, 2], &[], FORM).await;
    let certs = certs_dir(ring.dir.path());
    // a's certificate is replaced by one valid for 7 days; a loads it without a restart.
    let out = Command::new(binary("ringctl"))
        .args([
            "certs", "issue", "--role", "member", "--name", "a", "--force",
        ])
        .args(["--days", "7", "--dir"])
        .arg(&certs)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let want = pem_sha256(&certs.join("member-a.pem"));
    eventually(Duration::from_secs(10), "a loads it", || async {
        let tls = status(&ring.procs[0]).await.ok()?.tls?;
        (tls.certificate_sha256 == want).then_some(())
    })
    .await;

    // The metric, for the alert (below 14 days).
    let (_, text) = garden_ring_tests::http_get(metrics, "/metrics").unwrap();
    let own = text
        .lines()
        .find(|l| {
            l.starts_with(
                "garden_ring_certificate_expiry_seconds{certificate=\"own\",name=\"member:a\"}",
            )
        })
        .unwrap_or_else(|| panic!("no expiry of a's own certificate in:\n{text}"));
    let left_s: i64 = own.rsplit(' ').next().unwrap().parse().unwrap();
    assert!((7 * 86_400 - 120..=7 * 86_400).contains(&left_s), "{own}");
    assert!(
        text.contains(
            "garden_ring_certificate_expiry_seconds{certificate=\"ca\",name=\"CN=garden-ring CA"
        ),
        "{text}"
    );

    // `ringctl status` answered by a warns (below 30 days).
    let out =
        garden_ring_tests::ringctl(&ring.client_config, &[ring.procs[0].admin()], &["status"]);
    assert!(out.status.success(), "{}", stderr(&out));
    let said = String::from_utf8_lossy(&out.stdout);
    // 7 days less the moment since it was issued: 6 days, or 7 within the second it was.
    assert!(
        ["6", "7"].iter().any(|days| said.contains(&format!(
            "WARNING: this member's certificate (member:a) expires in {days} day(s)"
        ))),
        "{said}"
    );

    // `ringctl certs check DIR`: every certificate file, soonest first; exit 1 while one is
    // within --warn-days, naming it.
    let check = |warn: &str| {
        Command::new(binary("ringctl"))
            .args(["certs", "check", "--warn-days", warn])
            .arg(&certs)
            .output()
            .unwrap()
    };
    let out = check("10");
    let table = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{table}{}", stderr(&out));
    let first = table.lines().nth(1).unwrap_or_default();
    assert!(
        first.starts_with("member-a.pem")
            && first.contains("member:a")
            && first.contains("expires soon"),
        "{table}"
    );
    assert!(table.contains("ca.pem"), "{table}");
    assert!(
        !table.contains("-key.pem"),
        "keys are not certificates: {table}"
    );
    assert!(
        stderr(&out).contains("member-a.pem (member:a)"),
        "{}",
        stderr(&out)
    );
    let out = check("5");
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        stderr(&out)
    );
    println!("{table}");
}

/// The serial (hex) of the certificate in `files`.
fn serial_of(files: &TlsFiles) -> String {
    garden_ring::tls::revocation::cert_file_key(&files.cert_file)
        .unwrap()
        .1
}

#[tokio::test]
async fn a_crl_file_refuses_what_it_lists_and_a_bad_one_changes_nothing() {
    let mut ring = Ring::prepare(RingOptions::default());
    let certs = certs_dir(ring.dir.path());
    let crl = ring.dir.path().join("ring.crl.pem");
    garden_ring::tls::certs::write_crl(&certs, &[], 30, &crl).unwrap();
    for p in &mut ring.procs {
        p.config.tls.as_mut().unwrap().files.crl_file = Some(crl.clone());
        p.spawn();
    }
    ring.wait_leader(&[0, 1, 2], &[], FORM).await;
    let victim = ensure_cert(&certs, &identity(Role::Admin, "crl-victim"));
    let clients: Vec<_> = (0..3).map(|i| client_of(&ring, i, &victim)).collect();
    for client in &clients {
        status_as(client).await.expect("not listed yet");
    }

    // The CRL now lists it (written by the real ringctl): every member refuses it once it
    // reloaded the file (every 200 ms here).
    let out = Command::new(binary("ringctl"))
        .args(["certs", "crl", "--serial", &serial_of(&victim), "--out"])
        .arg(&crl)
        .arg("--dir")
        .arg(&certs)
        .output()
        .unwrap();
    assert!(out.status.success(), "{}", stderr(&out));
    let written = std::time::Instant::now();
    let mut took = Vec::new();
    for client in &clients {
        let why = eventually(Duration::from_secs(5), "the CRL refuses it", || async {
            let err = status_as(client).await.err()?;
            let text = err.to_string();
            text.contains("is revoked by the CRL in").then_some(text)
        })
        .await;
        assert!(why.contains("reason KeyCompromise"), "{why}");
        took.push(written.elapsed().as_millis());
    }
    println!("CRL written -> refused, ms, members a, b, c (reload every 200 ms): {took:?}");

    // A corrupt CRL, and one of another CA: reported, nothing of it applied, the list kept.
    let other = tempfile::tempdir().unwrap();
    garden_ring::tls::certs::init_ca(other.path(), 30, false).unwrap();
    let foreign = other.path().join("foreign.crl.pem");
    garden_ring::tls::certs::write_crl(other.path(), &["1".into()], 30, &foreign).unwrap();
    let good = std::fs::read(&crl).unwrap();
    for (bad, needle) in [
        (
            b"-----BEGIN X509 CRL-----\nnot base64\n-----END X509 CRL-----\n".to_vec(),
            "CRL file",
        ),
        (
            std::fs::read(&foreign).unwrap(),
            "which is no CA of the CA file",
        ),
        (good[..good.len() / 2].to_vec(), "CRL file"),
    ] {
        // From a good file each time, so each error seen is this one's.
        std::fs::write(&crl, &good).unwrap();
        eventually(Duration::from_secs(5), "a loads the good CRL", || async {
            let tls = status(&ring.procs[0]).await.ok()?.tls?;
            tls.reload_error.is_empty().then_some(())
        })
        .await;
        std::fs::write(&crl, &bad).unwrap();
        let error = eventually(Duration::from_secs(5), "a reports the bad CRL", || async {
            let tls = status(&ring.procs[0]).await.ok()?.tls?;
            tls.reload_error
                .contains(needle)
                .then_some(tls.reload_error)
        })
        .await;
        assert_eq!(error.lines().count(), 1, "{error}");
        println!("bad CRL: {error}");
        let err = status_as(&clients[0]).await.unwrap_err();
        assert!(
            err.to_string().contains("is revoked by the CRL in"),
            "{err}"
        );
        assert!(
            status(&ring.procs[0]).await.is_ok(),
            "the admin is still let in"
        );
    }

    // The same list as DER: loaded, and the error clears.
    use rustls_pki_types::pem::PemObject as _;
    let der = rustls_pki_types::CertificateRevocationListDer::from_pem_slice(&good).unwrap();
    std::fs::write(&crl, der.as_ref()).unwrap();
    eventually(Duration::from_secs(5), "a loads the DER CRL", || async {
        let tls = status(&ring.procs[0]).await.ok()?.tls?;
        tls.reload_error.is_empty().then_some(())
    })
    .await;
    assert!(
        status_as(&clients[0]).await.is_err(),
        "the DER CRL lists it too"
    );

    // Both sources apply: the ring revokes another certificate beside the CRL's.
    let other_admin = ensure_cert(&certs, &identity(Role::Admin, "ring-revoked"));
    let cert = other_admin.cert_file.display().to_string();
    let out = ring.ringctl(&["certs", "revoke", "--cert", &cert, "--reason", "both"]);
    assert!(out.status.success(), "{}", stderr(&out));
    refused_as_revoked(
        &client_of(&ring, 1, &other_admin),
        std::time::Instant::now(),
    )
    .await;
    assert!(status_as(&clients[1]).await.is_err());
}

#[tokio::test]
async fn an_identity_over_its_admin_limits_is_refused_with_resource_exhausted() {
    let mut ring = Ring::prepare(RingOptions::default());
    for p in &mut ring.procs {
        p.config.admin = garden_ring::config::AdminSettings {
            max_in_flight_per_identity: 1,
            max_writes_per_second_per_identity: 5,
        };
        p.spawn();
    }
    let leader = ring.wait_leader(&[0, 1, 2], &[], FORM).await;
    let on_leader = &ring.procs[ring.index_of(leader)];
    let certs = certs_dir(ring.dir.path());
    let store = TlsStore::load(ensure_cert(&certs, &admin_identity()), None).unwrap();
    let channel = garden_ring::tls::client::connect(
        &on_leader.admin(),
        &Security::Tls(store),
        Expect::AnyMember,
        Duration::from_secs(2),
        |e| e,
    )
    .await
    .unwrap();
    let client = pb::admin_client::AdminClient::new(channel);

    // 64 reads at once on one connection: one in flight at a time, the others refused at once.
    let calls = (0..64).map(|_| {
        let mut c = client.clone();
        async move { c.status(pb::StatusRequest::default()).await }
    });
    let answers = futures::future::join_all(calls).await;
    let refused: Vec<_> = answers.iter().filter_map(|a| a.as_ref().err()).collect();
    assert!(refused.len() < 64, "none answered");
    assert!(
        !refused.is_empty(),
        "all 64 answered: the in-flight limit did nothing"
    );
    for status in &refused {
        assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status}");
        assert!(
            status
                .message()
                .contains("admin:tester has 1 Admin requests in flight on this member"),
            "{status}"
        );
    }

    // Writes one after the other: 5 per second, then refused until tokens come back.
    let mut ok = 0;
    let mut limited = None;
    for n in 0..20 {
        let mut c = client.clone();
        match c
            .set_paused(pb::SetPausedRequest {
                paused: n % 2 == 0,
                reason: "limit test".into(),
            })
            .await
        {
            Ok(_) => ok += 1,
            Err(status) => {
                assert_eq!(status.code(), tonic::Code::ResourceExhausted, "{status}");
                limited = Some(status.message().to_string());
            }
        }
    }
    let limited = limited.expect("20 writes in a row were all let through");
    assert!(
        limited.contains("more than 5 writes per second"),
        "{limited}"
    );
    assert!((5..20).contains(&ok), "{ok} of 20 writes let through");
    println!(
        "limits: {} of 64 concurrent reads refused; {ok} of 20 back-to-back writes let through: {limited}",
        refused.len()
    );
    // Another identity is not held back by this one's limits.
    let viewer = ensure_cert(&certs, &identity(Role::Viewer, "other"));
    status_as(&client_of(&ring, ring.index_of(leader), &viewer))
        .await
        .expect("another identity is served");
}
