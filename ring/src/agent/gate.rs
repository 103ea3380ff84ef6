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
//! Limits: at most [`MAX_CONNECTIONS`] connections at once (more wait in the listen backlog).

use std::net::SocketAddr;
use std::sync::Arc;

use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Semaphore, watch};
use tokio::task::JoinSet;

/// Most connections relayed at once.
pub const MAX_CONNECTIONS: usize = 1024;

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
    task: Option<tokio::task::JoinHandle<()>>,
}

impl Gate {
    /// Opens a gate on `listen` relaying to `target`.
    pub async fn open(listen: SocketAddr, target: SocketAddr) -> Result<Self, GateError> {
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|source| GateError {
                listen,
                target,
                source,
            })?;
        let listen = listener.local_addr().unwrap_or(listen);
        let (closed, mut on_close) = watch::channel(false);
        let task = tokio::spawn(async move {
            let slots = Arc::new(Semaphore::new(MAX_CONNECTIONS));
            let mut connections = JoinSet::new();
            loop {
                let permit = tokio::select! {
                    permit = slots.clone().acquire_owned() => permit,
                    _ = on_close.wait_for(|c| *c) => break,
                };
                let Ok(permit) = permit else { break };
                let accepted = tokio::select! {
                    accepted = listener.accept() => accepted,
                    _ = on_close.wait_for(|c| *c) => break,
                };
                let Ok((client, _)) = accepted else { continue };
                connections.spawn(async move {
                    let _permit = permit;
                    relay(client, target).await;
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
            task: Some(task),
        })
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

async fn relay(mut client: TcpStream, target: SocketAddr) {
    let Ok(mut upstream) = TcpStream::connect(target).await else {
        return; // the client sees the connection close
    };
    let _ = client.set_nodelay(true);
    let _ = upstream.set_nodelay(true);
    let _ = tokio::io::copy_bidirectional(&mut client, &mut upstream).await;
}

#[cfg(test)]
mod tests {
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
        let gate = Gate::open("127.0.0.1:0".parse().unwrap(), target)
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
        let err = Gate::open(taken.local_addr().unwrap(), "127.0.0.1:1".parse().unwrap())
            .await
            .err()
            .unwrap();
        assert!(err.to_string().contains("cannot open the gate on"), "{err}");
    }
}
