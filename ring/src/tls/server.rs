//! The server side: accepting connections, with or without TLS, and telling the gRPC services
//! who is on the other end.
//!
//! The TLS layer asks every client for a certificate and checks that it holds the certificate's
//! key, but does not refuse the handshake over the certificate itself: the chain is checked
//! right after the handshake against the current CA, and the verdict ([`PeerAuth`]) travels with
//! the connection into every request. The services' interceptors then refuse with a gRPC status
//! (`UNAUTHENTICATED`, `PERMISSION_DENIED`) and a message a human can act on, instead of a bare
//! TLS alert, and log the attempt.

use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Duration;

use rustls::client::danger::HandshakeSignatureValid;
use rustls::crypto::CryptoProvider;
use rustls::server::danger::{ClientCertVerified, ClientCertVerifier};
use rustls::server::{ClientHello, ResolvesServerCert};
use rustls::sign::CertifiedKey;
use rustls::{DigitallySignedStruct, DistinguishedName, SignatureScheme};
use rustls_pki_types::{CertificateDer, UnixTime};
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, mpsc};
use tokio_stream::wrappers::ReceiverStream;
use tonic::transport::server::Connected;

use super::identity::Identity;
use super::material::{provider, sha256_hex};
use super::revocation::{CutIo, Revocations, cert_key};
use super::store::TlsStore;
use super::{Security, describe};

/// Longest a client may take to complete the TLS handshake.
pub const HANDSHAKE_TIMEOUT: Duration = Duration::from_secs(10);
/// Most handshakes in progress at once per listener; more connections wait.
pub const MAX_PENDING_HANDSHAKES: usize = 256;

/// What the server knows about the other end of a connection.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum PeerAuth {
    /// TLS is off (`insecure = true`): nobody is authenticated.
    Insecure,
    /// TLS, but the client presented no certificate.
    NoCertificate,
    /// The client's certificate was refused; why, in words.
    Refused(String),
    /// A certificate of this ring's CA.
    Verified {
        /// Who it is.
        identity: Identity,
        /// SHA-256 of its certificate.
        cert_sha256: String,
    },
}

/// Connection facts every request carries in its extensions.
#[derive(Debug, Clone)]
pub struct ConnInfo {
    /// The client's address.
    pub remote: Option<SocketAddr>,
    /// Who the client is.
    pub auth: Arc<PeerAuth>,
    /// Where to check, at each request, that its certificate was not revoked since the
    /// handshake (with its issuer and serial); `None` without a verified certificate.
    pub revocation: Option<(Arc<Revocations>, String, String)>,
}

impl ConnInfo {
    /// The connection facts of a request (absent only for requests made in-process).
    pub fn of<T>(request: &tonic::Request<T>) -> Option<&ConnInfo> {
        request.extensions().get::<ConnInfo>()
    }
}

/// An accepted connection. Its reads and writes fail once the client's certificate is
/// revoked ([`CutIo`]).
pub struct Conn {
    io: CutIo<ConnIo>,
    info: ConnInfo,
}

enum ConnIo {
    Plain(TcpStream),
    Tls(Box<tokio_rustls::server::TlsStream<TcpStream>>),
}

impl Connected for Conn {
    type ConnectInfo = ConnInfo;

    fn connect_info(&self) -> ConnInfo {
        self.info.clone()
    }
}

impl AsyncRead for Conn {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl AsyncWrite for Conn {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        Pin::new(&mut self.get_mut().io).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_shutdown(cx)
    }
}

impl AsyncRead for ConnIo {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ConnIo::Plain(s) => Pin::new(s).poll_read(cx, buf),
            ConnIo::Tls(s) => Pin::new(s.as_mut()).poll_read(cx, buf),
        }
    }
}

impl AsyncWrite for ConnIo {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        match self.get_mut() {
            ConnIo::Plain(s) => Pin::new(s).poll_write(cx, buf),
            ConnIo::Tls(s) => Pin::new(s.as_mut()).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ConnIo::Plain(s) => Pin::new(s).poll_flush(cx),
            ConnIo::Tls(s) => Pin::new(s.as_mut()).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        match self.get_mut() {
            ConnIo::Plain(s) => Pin::new(s).poll_shutdown(cx),
            ConnIo::Tls(s) => Pin::new(s.as_mut()).poll_shutdown(cx),
        }
    }
}

/// Serves the current certificate of a [`TlsStore`].
#[derive(Debug)]
struct StoreCert(Arc<TlsStore>);

impl ResolvesServerCert for StoreCert {
    fn resolve(&self, _hello: ClientHello<'_>) -> Option<Arc<CertifiedKey>> {
        Some(self.0.current().certified_key.clone())
    }
}

/// Asks for a client certificate and checks possession of its key; the chain is judged after
/// the handshake (see the module docs).
#[derive(Debug)]
struct AskForCertificate(Arc<CryptoProvider>);

impl ClientCertVerifier for AskForCertificate {
    fn offer_client_auth(&self) -> bool {
        true
    }

    fn client_auth_mandatory(&self) -> bool {
        false
    }

    fn root_hint_subjects(&self) -> &[DistinguishedName] {
        &[]
    }

    fn verify_client_cert(
        &self,
        _end_entity: &CertificateDer<'_>,
        _intermediates: &[CertificateDer<'_>],
        _now: UnixTime,
    ) -> Result<ClientCertVerified, rustls::Error> {
        Ok(ClientCertVerified::assertion())
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
        super::handshake::tls13(&self.0, message, cert, dss)
    }

    fn supported_verify_schemes(&self) -> Vec<SignatureScheme> {
        super::handshake::schemes(&self.0)
    }
}

fn server_config(store: Arc<TlsStore>) -> Arc<rustls::ServerConfig> {
    let provider = provider();
    let mut config = rustls::ServerConfig::builder_with_provider(provider.clone())
        .with_protocol_versions(&[&rustls::version::TLS13])
        .expect("the ring provider supports TLS 1.3")
        .with_client_cert_verifier(Arc::new(AskForCertificate(provider)))
        .with_cert_resolver(Arc::new(StoreCert(store)));
    config.alpn_protocols = vec![b"h2".to_vec()];
    Arc::new(config)
}

/// Judges the certificate chain a client presented, against the current CA.
pub fn judge(store: &TlsStore, chain: Option<&[CertificateDer<'static>]>) -> PeerAuth {
    let Some((leaf, intermediates)) = chain.and_then(|c| c.split_first()) else {
        return PeerAuth::NoCertificate;
    };
    let material = store.current();
    if let Err(e) =
        material
            .client_verifier
            .verify_client_cert(leaf, intermediates, UnixTime::now())
    {
        return PeerAuth::Refused(describe(&e));
    }
    if let Err(why) = store.revocations().check_der(leaf.as_ref()) {
        return PeerAuth::Refused(why);
    }
    match Identity::from_cert_der(leaf.as_ref()) {
        Ok(identity) => PeerAuth::Verified {
            identity,
            cert_sha256: sha256_hex(leaf.as_ref()),
        },
        Err(e) => PeerAuth::Refused(e.to_string()),
    }
}

/// The connections accepted on `listener`: TLS handshakes run concurrently (bounded), and a
/// failed handshake is logged and dropped without stopping the listener.
pub fn incoming(
    listener: TcpListener,
    security: Security,
    what: &'static str,
) -> ReceiverStream<std::io::Result<Conn>> {
    let (tx, rx) = mpsc::channel(64);
    let acceptor = match &security {
        Security::Tls(store) => Some((
            store.clone(),
            tokio_rustls::TlsAcceptor::from(server_config(store.clone())),
        )),
        Security::Insecure => None,
        Security::TlsWithoutCertificate(_) => {
            panic!("a server needs a certificate: TlsWithoutCertificate is for clients only")
        }
    };
    let pending = Arc::new(Semaphore::new(MAX_PENDING_HANDSHAKES));
    tokio::spawn(async move {
        loop {
            let accepted = tokio::select! {
                accepted = listener.accept() => accepted,
                // The server stopped: release the port.
                () = tx.closed() => return,
            };
            let (tcp, remote) = match accepted {
                Ok(c) => c,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!("{what} listener: accept failed: {e}");
                    tokio::time::sleep(Duration::from_millis(100)).await;
                    continue;
                }
            };
            let _ = tcp.set_nodelay(true);
            let Some((store, acceptor)) = acceptor.clone() else {
                let conn = Conn {
                    io: CutIo::new(ConnIo::Plain(tcp), None),
                    info: ConnInfo {
                        remote: Some(remote),
                        auth: Arc::new(PeerAuth::Insecure),
                        revocation: None,
                    },
                };
                if tx.send(Ok(conn)).await.is_err() {
                    return;
                }
                continue;
            };
            let Ok(permit) = pending.clone().acquire_owned().await else {
                return;
            };
            let tx = tx.clone();
            tokio::spawn(async move {
                let _permit = permit;
                let tls = match tokio::time::timeout(HANDSHAKE_TIMEOUT, acceptor.accept(tcp)).await
                {
                    Ok(Ok(tls)) => tls,
                    Ok(Err(e)) => {
                        tracing::warn!(%remote, "{what} service: TLS handshake failed: {e}");
                        return;
                    }
                    Err(_) => {
                        tracing::warn!(%remote, "{what} service: TLS handshake timed out");
                        return;
                    }
                };
                let auth = judge(&store, tls.get_ref().1.peer_certificates());
                let key = match &auth {
                    PeerAuth::Verified { .. } => tls
                        .get_ref()
                        .1
                        .peer_certificates()
                        .and_then(|c| c.first())
                        .and_then(|leaf| cert_key(leaf.as_ref())),
                    _ => None,
                };
                let revocations = store.revocations().clone();
                let cut = key
                    .as_ref()
                    .map(|(issuer, serial)| revocations.track(issuer.clone(), serial.clone()));
                let conn = Conn {
                    io: CutIo::new(ConnIo::Tls(Box::new(tls)), cut),
                    info: ConnInfo {
                        remote: Some(remote),
                        auth: Arc::new(auth),
                        revocation: key.map(|(issuer, serial)| (revocations, issuer, serial)),
                    },
                };
                let _ = tx.send(Ok(conn)).await;
            });
        }
    });
    ReceiverStream::new(rx)
}

/// The certificates members presented on the peer port, newest per member (for status).
#[derive(Clone, Default)]
pub struct SeenCertificates(Arc<std::sync::Mutex<std::collections::BTreeMap<String, Seen>>>);

#[derive(Clone)]
struct Seen {
    sha256: String,
    at_unix_ms: u64,
    /// (issuer, serial), to tell whether it was revoked since.
    key: Option<(String, String)>,
}

impl SeenCertificates {
    /// Records that member `name` presented the certificate with SHA-256 `sha256` (issuer and
    /// serial `key`).
    pub fn record(&self, name: &str, sha256: &str, key: Option<(&str, &str)>) {
        let mut seen = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let now = crate::time::unix_ms();
        match seen.get_mut(name) {
            Some(s) if s.sha256 == sha256 => s.at_unix_ms = now,
            _ => {
                // Bounded: one entry per member name, and names come from verified certificates.
                seen.insert(
                    name.to_string(),
                    Seen {
                        sha256: sha256.to_string(),
                        at_unix_ms: now,
                        key: key.map(|(i, s)| (i.to_string(), s.to_string())),
                    },
                );
            }
        }
    }

    /// Member name -> (certificate SHA-256, last seen in Unix milliseconds).
    pub fn snapshot(&self) -> std::collections::BTreeMap<String, (String, u64)> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|(name, s)| (name.clone(), (s.sha256.clone(), s.at_unix_ms)))
            .collect()
    }

    /// Member name -> why the certificate it last presented here is refused now (revoked).
    pub fn revoked(&self, revocations: &Revocations) -> std::collections::BTreeMap<String, String> {
        self.0
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .filter_map(|(name, s)| {
                let (issuer, serial) = s.key.as_ref()?;
                revocations
                    .check(issuer, serial)
                    .err()
                    .map(|why| (name.clone(), why))
            })
            .collect()
    }
}

/// Admits a request whose client holds one of the `allowed` roles (every request when TLS is
/// off), and logs every refusal. Runs before the request body is decoded.
pub fn admit(
    request: &tonic::Request<()>,
    allowed: &[super::Role],
    service: &'static str,
) -> Result<(), tonic::Status> {
    let info = ConnInfo::of(request);
    let remote = info
        .and_then(|i| i.remote)
        .map(|r| r.to_string())
        .unwrap_or_else(|| "?".into());
    let refuse = |status: tonic::Status| {
        tracing::warn!(%remote, service, code = ?status.code(), "refused: {}", status.message());
        Err(status)
    };
    let Some(info) = info else {
        return refuse(tonic::Status::unauthenticated("no connection information"));
    };
    // Revoked since the handshake (its connection is being cut).
    if let Some((revocations, issuer, serial)) = &info.revocation
        && let Err(why) = revocations.check(issuer, serial)
    {
        return refuse(tonic::Status::unauthenticated(format!(
            "client certificate refused: {why}"
        )));
    }
    match info.auth.as_ref() {
        PeerAuth::Insecure => Ok(()),
        PeerAuth::NoCertificate => refuse(tonic::Status::unauthenticated(format!(
            "the {service} service requires a client certificate issued by this ring's CA \
             (ringctl: --cert-file/--key-file or a client config; make one with `ringctl certs issue`)"
        ))),
        PeerAuth::Refused(why) => refuse(tonic::Status::unauthenticated(format!(
            "client certificate refused: {why}"
        ))),
        PeerAuth::Verified { identity, .. } if allowed.contains(&identity.role) => Ok(()),
        PeerAuth::Verified { identity, .. } => refuse(tonic::Status::permission_denied(format!(
            "{identity} may not use the {service} service (it admits {})",
            allowed
                .iter()
                .map(|r| r.as_str())
                .collect::<Vec<_>>()
                .join(", ")
        ))),
    }
}
