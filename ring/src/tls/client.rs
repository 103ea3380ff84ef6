//! The client side: gRPC channels to members, over TLS when the ring uses it.
//!
//! A client trusts a server when its certificate chains to the ring's CA and carries a member
//! identity: the named member when the caller knows whom it dials (a peer connection), any
//! member otherwise (`ringctl` dialing an endpoint). Host names are not checked: members are
//! identified by their certificate's identity, not by the address they happen to have, so a
//! member can move without new certificates. Each new connection takes the current material,
//! so a reloaded certificate is presented on the next connection.

use std::sync::Arc;
use std::time::Duration;

use http::Uri;
use hyper_util::rt::TokioIo;
use rustls::client::ResolvesClientCert;
use rustls::client::danger::{HandshakeSignatureValid, ServerCertVerified, ServerCertVerifier};
use rustls::crypto::CryptoProvider;
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, RootCertStore, SignatureScheme};
use rustls_pki_types::{CertificateDer, ServerName, UnixTime};
use tokio::net::TcpStream;
use tonic::transport::{Channel, Endpoint};

use super::identity::{Identity, Role};
use super::material::{Material, provider};
use super::revocation::{CutIo, cert_key};
use super::store::TlsStore;
use super::{Security, describe};

/// Which server certificate a client accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Expect {
    /// Any member of the ring.
    AnyMember,
    /// This member.
    Member(String),
}

#[derive(Debug)]
struct MemberVerifier {
    roots: Arc<RootCertStore>,
    expect: Expect,
    provider: Arc<CryptoProvider>,
}

impl ServerCertVerifier for MemberVerifier {
    fn verify_server_cert(
        &self,
        end_entity: &CertificateDer<'_>,
        intermediates: &[CertificateDer<'_>],
        _server_name: &ServerName<'_>,
        _ocsp_response: &[u8],
        now: UnixTime,
    ) -> Result<ServerCertVerified, rustls::Error> {
        let parsed = rustls::server::ParsedCertificate::try_from(end_entity)?;
        rustls::client::verify_server_cert_signed_by_trust_anchor(
            &parsed,
            &self.roots,
            intermediates,
            now,
            self.provider.signature_verification_algorithms.all,
        )?;
        let identity = Identity::from_cert_der(end_entity.as_ref())
            .map_err(|e| rustls::Error::General(format!("server certificate: {e}")))?;
        if identity.role != Role::Member {
            return Err(rustls::Error::General(format!(
                "the server presented a certificate for {identity}, not for a ring member"
            )));
        }
        if let Expect::Member(name) = &self.expect
            && identity.name != *name
        {
            return Err(rustls::Error::General(format!(
                "expected member {name:?}, but the server's certificate is for {identity}"
            )));
        }
        Ok(ServerCertVerified::assertion())
    }

    fn verify_tls12_signature(
        &self,
        _message: &[u8],
        _cert: &CertificateDer<'_>,
        _dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        super::handshake::tls12()
    }

    fn verify_tls13_signature(
        &self,
        message: &[u8],
        cert: &CertificateDer<'_>,
        dss: &DigitallySignedStruct,
    ) -> Result<HandshakeSignatureValid, rustls::Error> {
        super::handshake::tls13(&self.provider, message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        super::handshake::schemes(&self.provider)
    }
}

#[derive(Debug)]
struct OwnCert(Arc<CertifiedKey>);

impl ResolvesClientCert for OwnCert {
    fn resolve(
        &self,
        _root_hint_subjects: &[&[u8]],
        _sigschemes: &[SignatureScheme],
    ) -> Option<Arc<CertifiedKey>> {
        Some(self.0.clone())
    }

    fn has_certs(&self) -> bool {
        true
    }
}

/// A TLS client configuration presenting `material`'s certificate and accepting `expect`.
pub fn client_config(material: &Material, expect: Expect) -> Arc<rustls::ClientConfig> {
    config_for(
        material.roots.clone(),
        Some(material.certified_key.clone()),
        expect,
    )
}

fn config_for(
    roots: Arc<RootCertStore>,
    own: Option<Arc<CertifiedKey>>,
    expect: Expect,
) -> Arc<rustls::ClientConfig> {
    let provider = provider();
    let builder = rustls::ClientConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("the ring provider supports TLS 1.3")
        .dangerous()
        .with_custom_certificate_verifier(Arc::new(MemberVerifier {
            roots,
            expect,
            provider,
        }));
    let mut config = match own {
        Some(key) => builder.with_client_cert_resolver(Arc::new(OwnCert(key))),
        None => builder.with_no_client_auth(),
    };
    config.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(config)
}

/// Where a connection takes its TLS configuration from, at connect time.
#[derive(Clone)]
enum Side {
    Store(Arc<TlsStore>),
    Roots(Arc<RootCertStore>),
}

impl Side {
    fn config(&self, expect: Expect) -> Arc<rustls::ClientConfig> {
        match self {
            Side::Store(store) => client_config(&store.current(), expect),
            Side::Roots(roots) => config_for(roots.clone(), None, expect),
        }
    }
}

async fn connect_tls(
    uri: Uri,
    side: Side,
    expect: Expect,
    connect_timeout: Duration,
) -> std::io::Result<TokioIo<CutIo<tokio_rustls::client::TlsStream<TcpStream>>>> {
    let io = |why: String| std::io::Error::new(std::io::ErrorKind::ConnectionRefused, why);
    let host = uri
        .host()
        .ok_or_else(|| io(format!("no host in {uri}")))?
        .trim_start_matches('[')
        .trim_end_matches(']')
        .to_string();
    let port = uri
        .port_u16()
        .ok_or_else(|| io(format!("no port in {uri}")))?;
    let tcp = tokio::time::timeout(connect_timeout, TcpStream::connect((host.as_str(), port)))
        .await
        .map_err(|_| io(format!("tcp connect to {host}:{port} timed out")))??;
    tcp.set_nodelay(true)?;
    let name = ServerName::try_from(host.clone()).map_err(|e| io(format!("host {host:?}: {e}")))?;
    let config = side.config(expect);
    let tls = tokio::time::timeout(
        connect_timeout.max(Duration::from_secs(2)),
        tokio_rustls::TlsConnector::from(config).connect(name, tcp),
    )
    .await
    .map_err(|_| io(format!("TLS handshake with {host}:{port} timed out")))?
    .map_err(|e| {
        let why = e
            .get_ref()
            .and_then(|inner| inner.downcast_ref::<rustls::Error>())
            .map(describe)
            .unwrap_or_else(|| e.to_string());
        io(format!("TLS handshake with {host}:{port} failed: {why}"))
    })?;
    // A server whose certificate the ring revoked is refused, and a connection made before
    // the revocation is cut by it.
    let cut = match &side {
        Side::Store(store) => {
            let key = tls
                .get_ref()
                .1
                .peer_certificates()
                .and_then(|c| c.first())
                .and_then(|leaf| cert_key(leaf.as_ref()));
            match key {
                Some((issuer, serial)) => {
                    let revocations = store.revocations();
                    if let Err(why) = revocations.check(&issuer, &serial) {
                        return Err(io(format!(
                            "server certificate of {host}:{port} refused: {why}"
                        )));
                    }
                    Some(revocations.track(issuer, serial))
                }
                None => None,
            }
        }
        Side::Roots(_) => None,
    };
    Ok(TokioIo::new(CutIo::new(tls, cut)))
}

fn endpoint(
    address: &str,
    connect_timeout: Duration,
    tune: impl FnOnce(Endpoint) -> Endpoint,
) -> Result<Endpoint, tonic::transport::Error> {
    Ok(tune(
        Endpoint::from_shared(format!("http://{address}"))?
            .connect_timeout(connect_timeout)
            .tcp_nodelay(true),
    ))
}

fn connector(
    side: Side,
    expect: Expect,
    connect_timeout: Duration,
) -> impl tower::Service<
    Uri,
    Response = TokioIo<CutIo<tokio_rustls::client::TlsStream<TcpStream>>>,
    Error = std::io::Error,
    Future = impl Send,
> + Clone
+ Send
+ 'static {
    tower::service_fn(move |uri: Uri| {
        connect_tls(uri, side.clone(), expect.clone(), connect_timeout)
    })
}

fn side(security: &Security) -> Option<Side> {
    match security {
        Security::Insecure => None,
        Security::Tls(store) => Some(Side::Store(store.clone())),
        Security::TlsWithoutCertificate(roots) => Some(Side::Roots(roots.clone())),
    }
}

/// A lazily connected channel to `address` (`host:port`). `tune` sets timeouts and the like.
pub fn channel(
    address: &str,
    security: &Security,
    expect: Expect,
    connect_timeout: Duration,
    tune: impl FnOnce(Endpoint) -> Endpoint,
) -> Result<Channel, tonic::transport::Error> {
    let endpoint = endpoint(address, connect_timeout, tune)?;
    Ok(match side(security) {
        None => endpoint.connect_lazy(),
        Some(side) => {
            endpoint.connect_with_connector_lazy(connector(side, expect, connect_timeout))
        }
    })
}

/// A channel to `address`, connected now (so an unreachable or refusing server is an error
/// here, not on the first call).
pub async fn connect(
    address: &str,
    security: &Security,
    expect: Expect,
    connect_timeout: Duration,
    tune: impl FnOnce(Endpoint) -> Endpoint,
) -> Result<Channel, tonic::transport::Error> {
    let endpoint = endpoint(address, connect_timeout, tune)?;
    match side(security) {
        None => endpoint.connect().await,
        Some(side) => {
            endpoint
                .connect_with_connector(connector(side, expect, connect_timeout))
                .await
        }
    }
}
