//! The gate in front of a hosted control plane's public endpoint: a TCP relay from the endpoint
//! clients use to the address the workload really listens on (loopback), which the driver can
//! close at once.
//!
//! Closing the gate is how a host stops taking writes before its final snapshot: once
//! [`Gate::close`] returns, no new connection is accepted, every open one is cut, and nothing
//! more reaches the workload from outside; a snapshot taken after that holds every write a client
//! was ever told succeeded. The workload itself keeps running for the snapshot, on its private
//! address.
//!
//! **Bound to the lease.** The gate is given the lease's deadline (monotonic clock, moved on by
//! each renewal) and forwards nothing after it, in either direction: every chunk is checked
//! against the clock before it is passed on, and at the deadline the gate closes itself. The
//! guard stops the workload at the same deadline, but a host that was frozen (SIGSTOP, a paused
//! VM) wakes up with its workload, its guard and `ringd` all runnable at once: whichever runs
//! first, no reply of the workload reaches a client once the lease ran out, so nothing is
//! acknowledged while a new host may already serve.
//!
//! Limits: at most [`MAX_CONNECTIONS`] connections at once (more wait in the listen backlog);
//! [`CHUNK_BYTES`] of buffer per direction and connection.

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

use super::lease::{lease_ran_out, lease_runs_out};

/// Most connections relayed at once.
pub const MAX_CONNECTIONS: usize = 1024;

/// Most bytes read from one side before they are passed on to the other.
pub const CHUNK_BYTES: usize = 16 * 1024;

/// Why a gate could not open.
#[derive(Debug, thiserror::Error)]
#[error("cannot open the gate on {listen} (to {target}): {source}")]
pub struct GateError {
    /// The public address.
    pub listen: SocketAddr,
    /// The workload's address.
    pub target: SocketAddr,
    /// What the OS said.
    pub source: std::io::Error,
}

/// An open gate; dropping it closes it.
pub struct Gate {
    listen: SocketAddr,
    closed: watch::Sender<bool>,
    /// Turns true when the gate closed itself at the lease's deadline.
    ran_out: watch::Receiver<bool>,
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Gate {
    /// Opens a gate on `listen` relaying to `target` until the lease's `deadline` (monotonic
    /// ms, see the [module docs](self)).
    pub async fn open(
        listen: SocketAddr,
        target: SocketAddr,
        deadline: watch::Receiver<u64>,
    ) -> Result<Self, GateError> {
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| GateError {
                listen,
                target,
                source,
            })?;
        let listen = listener.local_addr().unwrap_or(listen);
        let (closed, mut on_close) = watch::channel(false);
        let (ran_out_tx, ran_out) = watch::channel(false);
        let task = tokio::spawn(async move {
            let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
            let mut connections = JoinSet::new();
            let mut runs_out = deadline.clone();
            let runs_out = lease_runs_out(&mut runs_out, 0);
            tokio::pin!(runs_out);
            loop {
                let permit = tokio::select! {
                    permit = slots.clone().acquire_owned() => permit,
                    _ = on_close.wait_for(|c| *c) => break,
                    _ = &mut runs_out => {
                        let _ = ran_out_tx.send(true);
                        break;
                    }
                };
                let Ok(permit) = permit else { break };
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    _ = on_close.wait_for(|c| *c) => break,
                    _ = &mut runs_out => {
                        let _ = ran_out_tx.send(true);
                        break;
                    }
                };
                let Ok((client, _)) = accepted else { continue };
                let deadline = deadline.clone();
                connections.spawn(async move {
                    let _permit = permit;
                    relay(client, target, deadline).await;
                });
                // Reap finished connections so the set stays small.
                while connections.try_join_next().is_some() {}
            }
            drop(listener);
            // Cut every open connection: aborting the relay drops both sockets.
            connections.shutdown().await;
        });
        Ok(Self {
            listen,
            closed,
            ran_out,
            task: Some(task),
        })
    }

    /// Turns true when the gate closed itself because the lease's deadline passed (it never
    /// opens again by itself: the driver must notice, and open a new gate once the lease is
    /// back). A host frozen past its deadline wakes up with its gate closed this way even when
    /// the next renewal comes at once.
    pub fn ran_out(&self) -> watch::Receiver<bool> {
        self.ran_out.clone()
    }

    /// The address the gate listens on.
    pub fn listen_address(&self) -> SocketAddr {
        self.listen
    }

    /// Closes the gate: returns once the listener is closed and every relayed connection cut.
    pub async fn close(mut self) {
        let _ = self.closed.send(true);
        if let Some(task) = self.task.take() {
            let _ = task.await;
        }
    }
}

impl Drop for Gate {
    fn drop(&mut self) {
        let _ = self.closed.send(true);
    }
}

/// Relays between `client` and `target` until either side closes, an error, or the lease's
/// deadline: then both sockets are dropped.
async fn relay(client: TcpStream, target: SocketAddr, deadline: watch::Receiver<u64>) {
    if lease_ran_out(&deadline) {
        return; // the client sees the connection close
    }
    let Ok(upstream) = TcpStream::connect(target).await else {
        return;
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let (mut client_in, mut client_out) = client.into_split();
    let (mut upstream_in, mut upstream_out) = upstream.into_split();
    let _ = tokio::try_join!(
        forward(&mut client_in, &mut upstream_out, &deadline),
        forward(&mut upstream_in, &mut client_out, &deadline),
    );
}

/// Copies `from` to `to` chunk by chunk, each only while the lease runs; at the end of `from`,
/// shuts `to` down for writing (a half-close, as the client or workload meant it).
async fn forward(
    from: &mut (impl AsyncReadExt + Unpin),
    to: &mut (impl AsyncWrite + Unpin),
    deadline: &watch::Receiver<u64>,
) -> std::io::Result<()> {
    let mut chunk = vec![0u8; CHUNK_BYTES];
    loop {
        let n = from.read(&mut chunk).await?;
        if n == 0 {
            return to.shutdown().await;
        }
        if lease_ran_out(deadline) {
            return Err(std::io::Error::other("the lease ran out"));
        }
        to.write_all(&chunk[..n]).await?;
    }
}

#[cfg(test)]
mod tests {
    use crate::time::monotonic_ms;
    use std::time::Duration;

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// An echo server on loopback.
    async fn echo() -> SocketAddr {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let address = listener.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = listener.accept().await {
                tokio::spawn(async move {
                    let mut buffer = [0u8; 1024];
                    while let Ok(n) = s.read(&mut buffer).await {
                        if n == 0 || s.write_all(&buffer[..n]).await.is_err() {
                            break;
                        }
                    }
                });
            }
        });
        address
    }

    /// A lease that runs out in `ms`, and the sender that renews it.
    fn lease(ms: u64) -> (watch::Sender<u64>, watch::Receiver<u64>) {
        watch::channel(monotonic_ms() + ms)
    }

    async fn round_trip(stream: &mut TcpStream, text: &[u8]) -> std::io::Result<Vec<u8>> {
        stream.write_all(text).await?;
        let mut buffer = vec![0u8; text.len()];
        tokio::time::timeout(Duration::from_secs(5), stream.read_exact(&mut buffer))
            .await
            .map_err(|_| std::io::Error::other("timed out"))??;
        Ok(buffer)
    }

    #[tokio::test]
    async fn relays_until_closed_then_cuts_and_refuses() {
        let target = echo().await;
        let (_renewals, deadline) = lease(60_000);
        let gate = Gate::open("127.0.0.1:0".parse().unwrap(), target, deadline)
            .await
            .unwrap();
        let public = gate.listen_address();
        let mut open = TcpStream::connect(public).await.unwrap();
        assert_eq!(round_trip(&mut open, b"hello").await.unwrap(), b"hello");

        gate.close().await;
        // The open connection is cut: the next exchange fails (EOF or reset).
        let after = round_trip(&mut open, b"again").await;
        assert!(
            after.is_err(),
            "a connection survived the gate closing: {after:?}"
        );
        // New connections are refused.
        assert!(TcpStream::connect(public).await.is_err());
        // The workload itself still answers on its own address.
        let mut direct = TcpStream::connect(target).await.unwrap();
        assert_eq!(round_trip(&mut direct, b"direct").await.unwrap(), b"direct");
    }

    #[tokio::test]
    async fn a_busy_address_is_a_clear_error() {
        let taken = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let (_renewals, deadline) = lease(60_000);
        let err = Gate::open(
            taken.local_addr().unwrap(),
            "127.0.0.1:1".parse().unwrap(),
            deadline,
        )
        .await
        .err()
        .unwrap();
        assert!(err.to_string().contains("cannot open the gate on"), "{err}");
    }

    #[tokio::test]
    async fn a_gate_closed_by_the_driver_did_not_run_out() {
        let target = echo().await;
        let (_renewals, deadline) = lease(60_000);
        let gate = Gate::open("127.0.0.1:0".parse().unwrap(), target, deadline)
            .await
            .unwrap();
        let ran_out = gate.ran_out();
        gate.close().await;
        assert!(!*ran_out.borrow());
    }

    #[tokio::test]
    async fn nothing_passes_after_the_lease_runs_out_and_a_renewal_keeps_it_open() {
        let target = echo().await;
        let (renewals, deadline) = lease(300);
        let gate = Gate::open("127.0.0.1:0".parse().unwrap(), target, deadline.clone())
            .await
            .unwrap();
        let public = gate.listen_address();
        let ran_out = gate.ran_out();
        let mut open = TcpStream::connect(public).await.unwrap();
        assert_eq!(round_trip(&mut open, b"before").await.unwrap(), b"before");

        // Renewed before it ran out: the connection outlives the first deadline.
        renewals.send(monotonic_ms() + 600).unwrap();
        tokio::time::sleep(Duration::from_millis(400)).await;
        assert_eq!(round_trip(&mut open, b"renewed").await.unwrap(), b"renewed");

        // Not renewed again: once the deadline passed, not a byte comes back.
        let last = *deadline.borrow();
        tokio::time::sleep(Duration::from_millis(
            last.saturating_sub(monotonic_ms()) + 20,
        ))
        .await;
        let after = round_trip(&mut open, b"after").await;
        assert!(after.is_err(), "relayed after the lease ran out: {after:?}");
        // And no new connection gets through.
        let fresh = match TcpStream::connect(public).await {
            Ok(mut stream) => round_trip(&mut stream, b"fresh").await,
            Err(e) => Err(e),
        };
        assert!(fresh.is_err(), "a new connection was relayed: {fresh:?}");
        // And it says it closed itself: a renewal now does not open it again, the driver must.
        assert!(*ran_out.borrow(), "the gate does not say it ran out");
        // The workload itself still answers on its own address (the final snapshot's way in).
        let mut direct = TcpStream::connect(target).await.unwrap();
        assert_eq!(round_trip(&mut direct, b"direct").await.unwrap(), b"direct");
        gate.close().await;
    }

    /// A relay by itself, without the gate's accept loop (which also closes at the deadline):
    /// what a frozen host's relay does when it runs before anything else after waking up.
    async fn relayed_pair(target: SocketAddr, deadline: watch::Receiver<u64>) -> TcpStream {
        let listener = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let client = TcpStream::connect(listener.local_addr().unwrap())
            .await
            .unwrap();
        let (server, _) = listener.accept().await.unwrap();
        tokio::spawn(relay(server, target, deadline));
        client
    }

    #[tokio::test]
    async fn a_relay_passes_nothing_on_after_the_deadline_by_itself() {
        let target = echo().await;
        let (_renewals, deadline) = lease(200);
        let mut open = relayed_pair(target, deadline.clone()).await;
        assert_eq!(round_trip(&mut open, b"before").await.unwrap(), b"before");
        tokio::time::sleep(Duration::from_millis(220)).await;
        let after = round_trip(&mut open, b"after").await;
        assert!(after.is_err(), "relayed after the lease ran out: {after:?}");

        let (_renewals, past) = watch::channel(monotonic_ms().saturating_sub(1));
        let mut late = relayed_pair(target, past).await;
        let got = round_trip(&mut late, b"late").await;
        assert!(
            got.is_err(),
            "a connection was relayed past the deadline: {got:?}"
        );
    }
}
