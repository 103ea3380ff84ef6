//! gRPC health checking and server reflection on real `ringd` processes: a reflection client
//! lists the Admin port's services and resolves the Admin service's methods, over mutual TLS
//! with a viewer certificate; health answers SERVING, and the Admin service's status follows
//! readiness; nobody gets in without a certificate of the ring's role for that port, and a
//! viewer still may not change the ring. Then the same with an independent client: grpcio's
//! reflection and health clients (Python), as `grpcurl` would do it.

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use garden_ring::client_config::ClientConfig;
use garden_ring::pb;
use garden_ring::tls::client::{Expect, connect};
use garden_ring::tls::{Identity, Role, Security, TlsFiles, TlsStore, certs};
use garden_ring_tests::{Ring, RingOptions, add_running, certs_dir, ensure_cert, eventually};
use nix::sys::signal::Signal;
use prost::Message as _;
use tonic::Code;
use tonic::transport::Channel;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;
use tonic_health::pb::{HealthCheckRequest, HealthCheckResponse};
use tonic_reflection::pb::v1::server_reflection_client::ServerReflectionClient;
use tonic_reflection::pb::v1::server_reflection_request::MessageRequest;
use tonic_reflection::pb::v1::server_reflection_response::MessageResponse;
use tonic_reflection::pb::v1::{ServerReflectionRequest, ServerReflectionResponse};

const ADMIN: &str = "gardenring.v1.Admin";
const HEALTH: &str = "grpc.health.v1.Health";
const REFLECTION_V1: &str = "grpc.reflection.v1.ServerReflection";
const REFLECTION_V1ALPHA: &str = "grpc.reflection.v1alpha.ServerReflection";

fn identity(role: Role, name: &str) -> Identity {
    Identity::new(role, name).unwrap()
}

/// The TLS files of `identity` in `ring`'s certificate directory (issued if missing).
fn files(ring: &Ring, identity: &Identity) -> TlsFiles {
    ensure_cert(&certs_dir(ring.dir.path()), identity)
}

fn presenting(files: TlsFiles) -> Security {
    Security::Tls(TlsStore::load(files, None).expect("load a client certificate"))
}

/// TLS that trusts the ring's CA but presents no client certificate.
fn no_certificate(ring: &Ring) -> Security {
    ClientConfig {
        ca_file: Some(certs::ca_path(&certs_dir(ring.dir.path()))),
        ..ClientConfig::default()
    }
    .security()
    .unwrap()
}

async fn channel(address: &str, security: &Security) -> Channel {
    connect(
        address,
        security,
        Expect::AnyMember,
        Duration::from_secs(5),
        |e| e.timeout(Duration::from_secs(10)),
    )
    .await
    .unwrap_or_else(|e| panic!("connect to {address}: {e}"))
}

/// One reflection request, its one answer.
async fn reflect(
    channel: &Channel,
    request: MessageRequest,
) -> Result<MessageResponse, tonic::Status> {
    let mut client = ServerReflectionClient::new(channel.clone());
    let request = ServerReflectionRequest {
        host: String::new(),
        message_request: Some(request),
    };
    let mut answers = client
        .server_reflection_info(tokio_stream::once(request))
        .await?
        .into_inner();
    let answer: ServerReflectionResponse = answers
        .message()
        .await?
        .ok_or_else(|| tonic::Status::internal("the reflection stream ended without an answer"))?;
    answer
        .message_response
        .ok_or_else(|| tonic::Status::internal("an empty reflection answer"))
}

async fn list_services(channel: &Channel) -> Result<Vec<String>, tonic::Status> {
    match reflect(channel, MessageRequest::ListServices(String::new())).await? {
        MessageResponse::ListServicesResponse(list) => {
            let mut names: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
            names.sort();
            Ok(names)
        }
        other => panic!("expected a service list, got {other:?}"),
    }
}

async fn health(channel: &Channel, service: &str) -> Result<HealthCheckResponse, tonic::Status> {
    HealthClient::new(channel.clone())
        .check(HealthCheckRequest {
            service: service.into(),
        })
        .await
        .map(tonic::Response::into_inner)
}

fn status_of(response: &HealthCheckResponse) -> ServingStatus {
    ServingStatus::try_from(response.status).unwrap_or(ServingStatus::Unknown)
}

fn assert_refused<T: std::fmt::Debug>(result: Result<T, tonic::Status>, code: Code, what: &str) {
    match result {
        Ok(v) => panic!("{what}: expected {code:?}, got {v:?}"),
        Err(status) => assert_eq!(status.code(), code, "{what}: {status:?}"),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_viewer_lists_and_resolves_the_admin_port_s_services_by_reflection() {
    let ring = Ring::start(RingOptions::default());
    add_running(&ring, &[]).await;
    let address = ring.procs[0].admin();
    let viewer = presenting(files(&ring, &identity(Role::Viewer, "observer")));
    let ch = channel(&address, &viewer).await;

    // The services, by reflection v1.
    let services = list_services(&ch).await.expect("list services");
    println!("services on {address}: {services:?}");
    for expected in [ADMIN, HEALTH, REFLECTION_V1] {
        assert!(
            services.iter().any(|s| s == expected),
            "{expected} missing from {services:?}"
        );
    }
    assert!(
        !services.iter().any(|s| s == "gardenring.v1.Raft"),
        "the peer protocol is not served on the Admin port: {services:?}"
    );

    // The Admin service's file, with its methods.
    let descriptors = match reflect(&ch, MessageRequest::FileContainingSymbol(ADMIN.into()))
        .await
        .expect("file containing gardenring.v1.Admin")
    {
        MessageResponse::FileDescriptorResponse(f) => f.file_descriptor_proto,
        other => panic!("expected file descriptors, got {other:?}"),
    };
    let admin = descriptors
        .iter()
        .map(|raw| prost_types::FileDescriptorProto::decode(raw.as_slice()).unwrap())
        .find_map(|f| {
            (f.package() == "gardenring.v1")
                .then(|| f.service.into_iter().find(|s| s.name() == "Admin"))
                .flatten()
        })
        .expect("the Admin service's descriptor");
    let methods: Vec<&str> = admin.method.iter().map(|m| m.name()).collect();
    println!("{ADMIN} methods: {methods:?}");
    for expected in ["Status", "ControlPlaneList", "SetPaused", "Move"] {
        assert!(
            methods.contains(&expected),
            "{expected} missing: {methods:?}"
        );
    }
    // A symbol the port does not serve is not found (tonic-reflection ends the stream with
    // the status; the protocol also allows an error answer).
    match reflect(
        &ch,
        MessageRequest::FileContainingSymbol("gardenring.v1.Raft".into()),
    )
    .await
    {
        Err(status) => assert_eq!(status.code(), Code::NotFound, "{status:?}"),
        Ok(MessageResponse::ErrorResponse(e)) => assert_eq!(e.error_code, Code::NotFound as i32),
        Ok(other) => panic!("expected not found for the peer service, got {other:?}"),
    }

    // The older v1alpha protocol answers too (older grpcurl, grpcio's client).
    let mut v1alpha =
        tonic_reflection::pb::v1alpha::server_reflection_client::ServerReflectionClient::new(
            ch.clone(),
        );
    let mut answers = v1alpha
        .server_reflection_info(tokio_stream::once(
            tonic_reflection::pb::v1alpha::ServerReflectionRequest {
                host: String::new(),
                message_request: Some(
                    tonic_reflection::pb::v1alpha::server_reflection_request::MessageRequest::ListServices(
                        String::new(),
                    ),
                ),
            },
        ))
        .await
        .expect("v1alpha reflection")
        .into_inner();
    let answer = answers.message().await.unwrap().unwrap();
    let Some(
        tonic_reflection::pb::v1alpha::server_reflection_response::MessageResponse::ListServicesResponse(
            list,
        ),
    ) = answer.message_response
    else {
        panic!("expected a v1alpha service list, got {answer:?}");
    };
    let alpha: Vec<String> = list.service.into_iter().map(|s| s.name).collect();
    assert!(alpha.iter().any(|s| s == ADMIN), "{alpha:?}");
    assert!(alpha.iter().any(|s| s == REFLECTION_V1ALPHA), "{alpha:?}");

    // Health: the server, and the Admin service once the member is ready.
    let server = health(&ch, "").await.expect("health of the server");
    assert_eq!(status_of(&server), ServingStatus::Serving);
    eventually(
        Duration::from_secs(10),
        "the Admin service is SERVING",
        || async {
            (status_of(&health(&ch, ADMIN).await.ok()?) == ServingStatus::Serving).then_some(())
        },
    )
    .await;
    assert_refused(
        health(&ch, "no.such.Service").await,
        Code::NotFound,
        "health of an unknown service",
    );

    // A viewer reads, but an admin-only call is still refused.
    let mut admin_client = pb::admin_client::AdminClient::new(ch.clone());
    admin_client
        .status(pb::StatusRequest::default())
        .await
        .expect("a viewer may read the status");
    assert_refused(
        admin_client
            .set_paused(pb::SetPausedRequest {
                paused: true,
                reason: "a viewer tries".into(),
            })
            .await,
        Code::PermissionDenied,
        "SetPaused as a viewer",
    );

    // Without a client certificate: no health, no reflection, no Admin.
    let anonymous = channel(&address, &no_certificate(&ring)).await;
    assert_refused(
        health(&anonymous, "").await,
        Code::Unauthenticated,
        "health without a certificate",
    );
    assert_refused(
        list_services(&anonymous).await,
        Code::Unauthenticated,
        "reflection without a certificate",
    );
    assert_refused(
        pb::admin_client::AdminClient::new(anonymous)
            .status(pb::StatusRequest::default())
            .await,
        Code::Unauthenticated,
        "Status without a certificate",
    );

    // A member certificate is for the peer port: refused here, admitted there.
    let member = presenting(files(&ring, &identity(Role::Member, "a")));
    let as_member = channel(&address, &member).await;
    assert_refused(
        health(&as_member, "").await,
        Code::PermissionDenied,
        "health on the Admin port with a member certificate",
    );
    assert_refused(
        list_services(&as_member).await,
        Code::PermissionDenied,
        "reflection with a member certificate",
    );
    let peer = ring.procs[0].config.peer_address();
    let on_peer = channel(&peer, &member).await;
    let raft = health(&on_peer, "gardenring.v1.Raft")
        .await
        .expect("health of the peer service");
    assert_eq!(status_of(&raft), ServingStatus::Serving);
    assert_refused(
        health(&channel(&peer, &viewer).await, "").await,
        Code::PermissionDenied,
        "health on the peer port with a viewer certificate",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_admin_service_is_not_serving_while_cut_off_from_the_quorum() {
    let ring = Ring::start(RingOptions::default());
    add_running(&ring, &[]).await;
    let viewer = presenting(files(&ring, &identity(Role::Viewer, "observer")));
    let ch = channel(&ring.procs[2].admin(), &viewer).await;
    eventually(
        Duration::from_secs(10),
        "c's Admin service is SERVING",
        || async {
            (status_of(&health(&ch, ADMIN).await.ok()?) == ServingStatus::Serving).then_some(())
        },
    )
    .await;
    // c alone: its lease runs out, it is not ready, its Admin service NOT_SERVING; the server
    // itself still SERVING (it runs, and still answers reads from its state).
    ring.procs[0].signal(Signal::SIGSTOP);
    ring.procs[1].signal(Signal::SIGSTOP);
    let cut = Instant::now();
    let lease = Duration::from_millis(ring.procs[2].config.timing.lease_ms);
    eventually(lease * 3, "c's Admin service is NOT_SERVING", || async {
        (status_of(&health(&ch, ADMIN).await.ok()?) == ServingStatus::NotServing).then_some(())
    })
    .await;
    let after = cut.elapsed();
    let server = health(&ch, "").await;
    ring.procs[0].signal(Signal::SIGCONT);
    ring.procs[1].signal(Signal::SIGCONT);
    assert_eq!(status_of(&server.unwrap()), ServingStatus::Serving);
    println!("cut-off c's Admin service NOT_SERVING after {after:?} (lease {lease:?})");
    assert!(
        after <= lease + Duration::from_millis(500),
        "NOT_SERVING only after {after:?}"
    );
    eventually(
        Duration::from_secs(10),
        "c's Admin service is SERVING again",
        || async {
            (status_of(&health(&ch, ADMIN).await.ok()?) == ServingStatus::Serving).then_some(())
        },
    )
    .await;
}

/// The grpcio client script next to the tests.
fn grpcio_script() -> &'static Path {
    Path::new(concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/tools/grpcio_reflect.py"
    ))
}

/// Fails (never skips) when grpcio's reflection and health clients are not installed.
fn require_grpcio() {
    let found = Command::new("python3")
        .args(["-c", "import grpc, grpc_reflection, grpc_health"])
        .output()
        .is_ok_and(|o| o.status.success());
    assert!(
        found,
        "python3 with grpcio, grpcio-reflection and grpcio-health-checking is needed: run \
         scripts/test.sh, or `python3 -m pip install grpcio grpcio-reflection grpcio-health-checking`"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpcio_s_reflection_client_lists_the_services_like_grpcurl() {
    require_grpcio();
    let mut ring = Ring::prepare(RingOptions::default());
    // grpcio checks the server's host name, as grpcurl does: a's certificate names its address
    // (`ringctl certs issue --san 127.0.0.1`).
    let dir = certs_dir(ring.dir.path());
    certs::issue(
        &dir,
        &identity(Role::Member, "a"),
        &["127.0.0.1".into(), "localhost".into()],
        30,
        true,
    )
    .unwrap();
    for p in &mut ring.procs {
        p.spawn();
    }
    add_running(&ring, &[]).await;
    let viewer = files(&ring, &identity(Role::Viewer, "observer"));
    let address = ring.procs[0].admin();
    // Ready first: a member's first lease comes a lease and a fence after it starts.
    let ch = channel(&address, &presenting(viewer.clone())).await;
    eventually(
        Duration::from_secs(10),
        "a's Admin service is SERVING",
        || async {
            (status_of(&health(&ch, ADMIN).await.ok()?) == ServingStatus::Serving).then_some(())
        },
    )
    .await;
    let run = |tls: &[&Path]| {
        let mut cmd = Command::new("python3");
        cmd.arg(grpcio_script()).arg(&address).args(tls);
        cmd.output().expect("run python3")
    };
    let out = run(&[&viewer.ca_file, &viewer.cert_file, &viewer.key_file]);
    let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    println!("{stdout}");
    assert!(
        out.status.success(),
        "grpcio client failed: {stderr}\n{stdout}"
    );
    let line = |prefix: &str| -> Vec<String> {
        stdout
            .lines()
            .find_map(|l| l.strip_prefix(prefix))
            .unwrap_or_else(|| panic!("no {prefix:?} line in {stdout}"))
            .split_whitespace()
            .map(str::to_string)
            .collect()
    };
    let services = line("services: ");
    for expected in [ADMIN, HEALTH, REFLECTION_V1ALPHA] {
        assert!(services.contains(&expected.to_string()), "{services:?}");
    }
    assert!(line("methods: ").contains(&"ControlPlaneList".to_string()));
    assert_eq!(line("health: "), ["SERVING"]);
    assert_eq!(line("admin health: "), ["SERVING"]);

    // Without a client certificate grpcio gets UNAUTHENTICATED.
    let out = run(&[&viewer.ca_file]);
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(!out.status.success(), "anonymous grpcio client got in");
    assert!(stderr.contains("UNAUTHENTICATED"), "{stderr}");
}
