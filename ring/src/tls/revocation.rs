//! Refusing revoked certificates, on both ports and in both directions.
//!
//! The list comes from the replicated state ([`crate::core::revocation`]; `ringd` hands every
//! change of it to [`Revocations::set_ring`] as soon as it applied it). A certificate is
//! checked:
//! - at the handshake: a client's certificate by [`super::server::judge`], a server's by the
//!   client's verifier ([`super::client`]), so a revoked member can neither call its peers nor
//!   be called by them;
//! - on every request ([`super::server::admit`]), for connections made before the revocation;
//! - and those connections are cut: each one registers its certificate here ([`Revocations::track`])
//!   and its reads and writes fail once the certificate is revoked, so a revoked client cannot
//!   keep a stream open and a revoked member's Raft connections end at once.

use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, RwLock, Weak};
use std::task::{Context, Poll};

use futures::task::AtomicWaker;
use tokio::io::{AsyncRead, AsyncWrite, ReadBuf};

use super::material::CrlEntry;
use crate::core::revocation::{Revocation, serial_of_bytes};

/// The issuer and serial number of a certificate (DER), as revocations name them; `None` when
/// it cannot be parsed (the handshake refuses such a certificate anyway).
pub fn cert_key(der: &[u8]) -> Option<(String, String)> {
    let (_, cert) = x509_parser::parse_x509_certificate(der).ok()?;
    Some((
        cert.issuer().to_string(),
        serial_of_bytes(cert.raw_serial()),
    ))
}

/// What names a certificate file's first certificate for a revocation: issuer, serial and
/// identity (`member:b`; empty when it carries none).
pub fn cert_file_key(path: &std::path::Path) -> Result<(String, String, String), super::TlsError> {
    let bytes = std::fs::read(path).map_err(|e| super::TlsError::Read {
        what: "certificate",
        path: path.to_path_buf(),
        why: e.to_string(),
    })?;
    let certs = super::material::parse_certs("certificate", path, &bytes)?;
    let leaf = certs[0].as_ref();
    let (issuer, serial) = cert_key(leaf).ok_or_else(|| super::TlsError::Pem {
        what: "certificate",
        path: path.to_path_buf(),
        why: "not an X.509 certificate".into(),
    })?;
    let subject = super::Identity::from_cert_der(leaf)
        .map(|i| i.to_string())
        .unwrap_or_default();
    Ok((issuer, serial, subject))
}

/// The words a refused client or server reads.
pub fn refusal(r: &Revocation) -> String {
    let who = if r.subject.is_empty() {
        String::new()
    } else {
        format!(" for {}", r.subject)
    };
    format!(
        "certificate{who} (serial {}, issuer {}) was revoked at {} by {}: {}",
        r.serial,
        r.issuer,
        crate::time::utc(r.at_ms),
        r.actor,
        r.reason
    )
}

/// A connection's kill switch: tripped when its certificate is revoked.
#[derive(Debug, Default)]
pub struct Cut {
    cut: AtomicBool,
    waker: AtomicWaker,
}

impl Cut {
    /// Whether it was tripped; registers `cx`'s waker to hear of it otherwise.
    pub fn poll_cut(&self, cx: &mut Context<'_>) -> bool {
        if self.cut.load(Ordering::Acquire) {
            return true;
        }
        self.waker.register(cx.waker());
        self.cut.load(Ordering::Acquire)
    }

    fn trip(&self) {
        self.cut.store(true, Ordering::Release);
        self.waker.wake();
    }

    /// The error a cut connection's reads and writes return.
    pub fn error() -> std::io::Error {
        std::io::Error::new(
            std::io::ErrorKind::ConnectionAborted,
            "the certificate of this connection was revoked",
        )
    }
}

/// A connection (`T`) that fails its reads and writes once its [`Cut`] trips.
#[derive(Debug)]
pub struct CutIo<T> {
    inner: T,
    cut: Option<Arc<Cut>>,
}

impl<T> CutIo<T> {
    /// `inner`, cut by `cut` (never, without one).
    pub fn new(inner: T, cut: Option<Arc<Cut>>) -> Self {
        Self { inner, cut }
    }

    fn is_cut(&self, cx: &mut Context<'_>) -> bool {
        self.cut.as_ref().is_some_and(|c| c.poll_cut(cx))
    }
}

impl<T: AsyncRead + Unpin> AsyncRead for CutIo<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<std::io::Result<()>> {
        let this = self.get_mut();
        if this.is_cut(cx) {
            return Poll::Ready(Err(Cut::error()));
        }
        Pin::new(&mut this.inner).poll_read(cx, buf)
    }
}

impl<T: AsyncWrite + Unpin> AsyncWrite for CutIo<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<std::io::Result<usize>> {
        let this = self.get_mut();
        if this.is_cut(cx) {
            return Poll::Ready(Err(Cut::error()));
        }
        Pin::new(&mut this.inner).poll_write(cx, buf)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_flush(cx)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<std::io::Result<()>> {
        Pin::new(&mut self.get_mut().inner).poll_shutdown(cx)
    }
}

/// The certificates this member refuses, and the live connections that presented one.
#[derive(Debug, Default)]
pub struct Revocations {
    ring: RwLock<Arc<Vec<Revocation>>>,
    /// From the CRL file: (issuer, serial) -> why.
    crl: RwLock<Arc<std::collections::BTreeMap<(String, String), String>>>,
    /// (issuer, serial, switch) of every live TLS connection; pruned of ended ones as it grows.
    live: Mutex<Live>,
}

#[derive(Debug, Default)]
struct Live {
    conns: Vec<(String, String, Weak<Cut>)>,
    /// Prune when `conns` reaches this length.
    prune_at: usize,
}

impl Revocations {
    /// Why the certificate `serial` of `issuer` is refused, if it is.
    pub fn check(&self, issuer: &str, serial: &str) -> Result<(), String> {
        let ring = self.ring.read().unwrap_or_else(|e| e.into_inner()).clone();
        if let Some(r) = ring.iter().find(|r| r.names(issuer, serial)) {
            return Err(refusal(r));
        }
        let crl = self.crl.read().unwrap_or_else(|e| e.into_inner()).clone();
        if crl.is_empty() {
            // Every request asks: no key to build without a CRL.
            return Ok(());
        }
        match crl.get(&(issuer.to_string(), serial.to_string())) {
            Some(why) => Err(why.clone()),
            None => Ok(()),
        }
    }

    /// The certificates the CRL file `path` lists (a loaded and checked file, as a whole);
    /// cuts the live connections it now revokes.
    pub fn set_crl(&self, path: Option<&std::path::Path>, entries: &[CrlEntry]) {
        let file = path.map(|p| p.display().to_string()).unwrap_or_default();
        let crl: std::collections::BTreeMap<(String, String), String> = entries
            .iter()
            .map(|e| {
                let why = format!(
                    "certificate (serial {}, issuer {}) is revoked by the CRL in {file} (since {}{})",
                    e.serial,
                    e.issuer,
                    crate::time::utc(
                        u64::try_from(e.revoked_unix_s)
                            .unwrap_or(0)
                            .saturating_mul(1000)
                    ),
                    e.reason
                        .as_ref()
                        .map(|r| format!(", reason {r}"))
                        .unwrap_or_default()
                );
                ((e.issuer.clone(), e.serial.clone()), why)
            })
            .collect();
        {
            let mut current = self.crl.write().unwrap_or_else(|e| e.into_inner());
            if **current == crl {
                return;
            }
            *current = Arc::new(crl);
        }
        self.cut_revoked();
    }

    /// [`Revocations::check`] of a certificate in DER.
    pub fn check_der(&self, der: &[u8]) -> Result<(), String> {
        match cert_key(der) {
            Some((issuer, serial)) => self.check(&issuer, &serial),
            None => Ok(()),
        }
    }

    /// The ring's list, as applied; cuts the live connections it now revokes.
    pub fn set_ring(&self, list: &[Revocation]) {
        {
            let mut ring = self.ring.write().unwrap_or_else(|e| e.into_inner());
            if ring.as_slice() == list {
                return;
            }
            *ring = Arc::new(list.to_vec());
        }
        self.cut_revoked();
    }

    /// How many certificates the ring revokes.
    pub fn ring_len(&self) -> usize {
        self.ring.read().unwrap_or_else(|e| e.into_inner()).len()
    }

    /// Registers a live connection that presented the certificate `serial` of `issuer`; the
    /// switch trips when that certificate is revoked (at once when it already is).
    pub fn track(&self, issuer: String, serial: String) -> Arc<Cut> {
        let cut = Arc::new(Cut::default());
        if self.check(&issuer, &serial).is_err() {
            cut.trip();
            return cut;
        }
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        if live.conns.len() >= live.prune_at {
            live.conns.retain(|(_, _, c)| c.strong_count() > 0);
            live.prune_at = (live.conns.len() * 2).max(64);
        }
        live.conns.push((issuer, serial, Arc::downgrade(&cut)));
        cut
    }

    fn cut_revoked(&self) {
        let mut live = self.live.lock().unwrap_or_else(|e| e.into_inner());
        let mut cut = 0;
        live.conns.retain(|(issuer, serial, switch)| {
            let Some(switch) = switch.upgrade() else {
                return false;
            };
            if self.check(issuer, serial).is_err() {
                switch.trip();
                cut += 1;
                return false;
            }
            true
        });
        if cut > 0 {
            tracing::warn!("closed {cut} connection(s) whose certificate was revoked");
        }
    }
}

#[cfg(test)]
mod tests {
    use std::task::{Wake, Waker};

    use super::*;

    struct Flag(AtomicBool);
    impl Wake for Flag {
        fn wake(self: Arc<Self>) {
            self.0.store(true, Ordering::SeqCst);
        }
    }

    fn revoked(serial: &str) -> Revocation {
        Revocation {
            issuer: "CN=ca".into(),
            serial: serial.into(),
            subject: "member:b".into(),
            reason: "key leaked".into(),
            at_ms: 1_796_083_200_000,
            actor: "admin:alice".into(),
        }
    }

    #[test]
    fn a_revocation_refuses_and_cuts_the_live_connections_of_that_certificate_only() {
        let revocations = Revocations::default();
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        let waker = Waker::from(flag.clone());
        let mut cx = Context::from_waker(&waker);
        let b = revocations.track("CN=ca".into(), "1a".into());
        let other = revocations.track("CN=ca".into(), "2b".into());
        let same_serial_other_ca = revocations.track("CN=other".into(), "1a".into());
        assert!(!b.poll_cut(&mut cx));

        revocations.set_ring(&[revoked("1a")]);
        assert!(flag.0.load(Ordering::SeqCst), "the waiting reader is woken");
        assert!(b.poll_cut(&mut cx));
        assert!(!other.poll_cut(&mut cx));
        assert!(!same_serial_other_ca.poll_cut(&mut cx));
        let why = revocations.check("CN=ca", "1a").unwrap_err();
        assert_eq!(
            why,
            "certificate for member:b (serial 1a, issuer CN=ca) was revoked at 2026-12-01 00:00:00 UTC by admin:alice: key leaked"
        );
        assert!(revocations.check("CN=ca", "2b").is_ok());
        // A new connection with it is cut at once; unrevoked, a new one is not.
        assert!(
            revocations
                .track("CN=ca".into(), "1a".into())
                .poll_cut(&mut cx)
        );
        revocations.set_ring(&[]);
        assert!(
            !revocations
                .track("CN=ca".into(), "1a".into())
                .poll_cut(&mut cx)
        );
    }

    #[test]
    fn the_ring_and_a_crl_both_revoke_and_a_new_crl_replaces_the_old_as_a_whole() {
        let revocations = Revocations::default();
        let crl_entry = |serial: &str| CrlEntry {
            issuer: "CN=ca".into(),
            serial: serial.into(),
            revoked_unix_s: 1_796_083_200,
            reason: Some("KeyCompromise".into()),
        };
        let flag = Arc::new(Flag(AtomicBool::new(false)));
        let waker = Waker::from(flag.clone());
        let mut cx = Context::from_waker(&waker);
        let live = revocations.track("CN=ca".into(), "3c".into());
        revocations.set_ring(&[revoked("1a")]);
        revocations.set_crl(
            Some(std::path::Path::new("/etc/pki/ring.crl")),
            &[crl_entry("3c")],
        );
        assert!(live.poll_cut(&mut cx), "a CRL entry cuts too");
        assert!(revocations.check("CN=ca", "1a").is_err());
        let why = revocations.check("CN=ca", "3c").unwrap_err();
        assert_eq!(
            why,
            "certificate (serial 3c, issuer CN=ca) is revoked by the CRL in /etc/pki/ring.crl (since 2026-12-01 00:00:00 UTC, reason KeyCompromise)"
        );
        revocations.set_crl(Some(std::path::Path::new("/etc/pki/ring.crl")), &[]);
        assert!(revocations.check("CN=ca", "3c").is_ok());
        assert!(
            revocations.check("CN=ca", "1a").is_err(),
            "the ring's list stays"
        );
    }

    #[test]
    fn ended_connections_are_pruned() {
        let revocations = Revocations::default();
        for n in 0..10_000 {
            drop(revocations.track("CN=ca".into(), format!("{n:x}")));
        }
        let live = revocations.live.lock().unwrap().conns.len();
        assert!(live <= 64, "{live} entries kept for ended connections");
    }
}
