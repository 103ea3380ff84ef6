//! The clients: one writer per control plane that finds it through DNS, the way a kubelet or
//! an operator's tool would, and writes to its etcd continuously, recording every write the
//! server acknowledged, with when and which host acknowledged it.

use std::net::{IpAddr, SocketAddr};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use garden_ring::backup::etcd::{EtcdClient, EtcdClientOptions};
use garden_ring::dns::query::{Observed, observe};
use garden_ring::dns::update::RecordValue;
use tokio::sync::watch;

use crate::world::{DNS_SERVER, ZONE, endpoint, zone_of};

/// Longest a write may take before it counts as failed.
const WRITE_TIMEOUT_MS: u64 = 1_000;
/// Pause after a failed attempt (resolve and connect again).
const RETRY_PAUSE_MS: u64 = 50;
/// Most acknowledgements kept per client (a run writes far fewer).
const MAX_ACKS: usize = 1_000_000;

/// One acknowledged write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Ack {
    /// Its sequence number (the key is `/chaos/<cp>/<seq>`).
    pub seq: u64,
    /// When it was acknowledged, ms since the run started.
    pub at_ms: u64,
    /// The zone (member index) that acknowledged it.
    pub zone: usize,
}

/// What a writer recorded.
#[derive(Debug, Default)]
pub struct Record {
    /// Writes attempted.
    pub attempted: u64,
    /// Acknowledged writes, in order.
    pub acks: Vec<Ack>,
    /// When the name was first seen pointing at a zone other than before: (ms since the run
    /// started, zone).
    pub dns_changes: Vec<(u64, usize)>,
}

/// A running writer.
pub struct Writer {
    /// The control plane.
    pub control_plane: String,
    /// What it recorded so far.
    pub record: Arc<Mutex<Record>>,
    task: tokio::task::JoinHandle<()>,
}

/// The key of write `seq` to `cp`.
pub fn key(cp: &str, seq: u64) -> String {
    format!("/chaos/{cp}/{seq:010}")
}

/// Where `cp`'s DNS name points now, if anywhere.
pub async fn resolve(cp: &str) -> Option<IpAddr> {
    let name = format!("{cp}.{ZONE}");
    let probe = RecordValue::A(std::net::Ipv4Addr::UNSPECIFIED);
    match observe(DNS_SERVER, &name, &probe, Duration::from_millis(500)).await {
        Observed::Values(values) => values.into_iter().find_map(|v| match v {
            RecordValue::A(ip) => Some(IpAddr::V4(ip)),
            _ => None,
        }),
        _ => None,
    }
}

/// A client of `cp`'s etcd at `address`.
pub async fn connect(address: SocketAddr) -> Option<EtcdClient> {
    let options = EtcdClientOptions {
        connect_timeout_ms: 500,
        request_timeout_ms: WRITE_TIMEOUT_MS,
        ..EtcdClientOptions::default()
    };
    EtcdClient::connect(&format!("http://{address}"), options)
        .await
        .ok()
}

impl Writer {
    /// Starts writing to `cp` until `stop` turns true; times are measured from `start`.
    pub fn start(cp: &str, start: Instant, stop: watch::Receiver<bool>) -> Self {
        let record = Arc::new(Mutex::new(Record::default()));
        let task = tokio::spawn(write_loop(cp.to_string(), start, stop, record.clone()));
        Self {
            control_plane: cp.to_string(),
            record,
            task,
        }
    }

    /// Stops writing and returns what was recorded.
    pub async fn finish(self) -> Record {
        let _ = self.task.await;
        std::mem::take(&mut *self.record.lock().unwrap_or_else(|e| e.into_inner()))
    }
}

async fn write_loop(
    cp: String,
    start: Instant,
    stop: watch::Receiver<bool>,
    record: Arc<Mutex<Record>>,
) {
    let mut seq = 0u64;
    let mut current: Option<(usize, EtcdClient)> = None;
    let mut last_zone = None;
    while !*stop.borrow() {
        if current.is_none() {
            let Some(ip) = resolve(&cp).await else {
                tokio::time::sleep(Duration::from_millis(RETRY_PAUSE_MS)).await;
                continue;
            };
            let Some(zone) = zone_of(ip) else {
                tokio::time::sleep(Duration::from_millis(RETRY_PAUSE_MS)).await;
                continue;
            };
            if last_zone != Some(zone) {
                last_zone = Some(zone);
                let at_ms = start.elapsed().as_millis() as u64;
                let mut r = record.lock().unwrap_or_else(|e| e.into_inner());
                if r.dns_changes.len() < MAX_ACKS {
                    r.dns_changes.push((at_ms, zone));
                }
            }
            match connect(endpoint(&cp, zone)).await {
                Some(client) => current = Some((zone, client)),
                None => {
                    tokio::time::sleep(Duration::from_millis(RETRY_PAUSE_MS)).await;
                    continue;
                }
            }
        }
        let (zone, client) = current.as_ref().expect("connected above");
        seq += 1;
        let written = client.put(key(&cp, seq).as_bytes(), b"chaos").await;
        let at_ms = start.elapsed().as_millis() as u64;
        let zone = *zone;
        let acknowledged = written.is_ok();
        {
            let mut r = record.lock().unwrap_or_else(|e| e.into_inner());
            r.attempted += 1;
            if acknowledged && r.acks.len() < MAX_ACKS {
                r.acks.push(Ack { seq, at_ms, zone });
            }
        }
        if !acknowledged {
            current = None;
            tokio::time::sleep(Duration::from_millis(RETRY_PAUSE_MS)).await;
        }
    }
}
