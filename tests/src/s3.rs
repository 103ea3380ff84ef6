//! A real S3 API on loopback for the backup tests: `moto_server` (Python `moto[server]`), plus
//! a TCP proxy in front of it that a test can cut to make the store unavailable without
//! losing its data (moto keeps everything in memory, so a restart empties it).
//!
//! [`Moto::start`] picks a free loopback port, runs `moto_server -H 127.0.0.1 -p PORT` with
//! its log in the test's directory and returns once it answers HTTP. Buckets are made with a
//! plain `PUT /bucket` (moto accepts any credentials, and none). The server is killed when the
//! [`Moto`] is dropped, also when a test fails; [`Moto::stop`] and [`Moto::start_again`] stop
//! and restart it on the same port.
//!
//! `scripts/test.sh` installs moto when `moto_server` is missing; a missing server fails the
//! test with that advice, never a silent skip.

use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use garden_ring::config::BackupSettings;

use crate::Ports;
use crate::bind::wait_until;
use crate::child::{self, LoggedChild};

/// How long `moto_server` may take to start answering (Python start-up is slow).
const START_TIMEOUT: Duration = Duration::from_secs(60);
/// How long one HTTP exchange with moto may take in the harness.
const IO_TIMEOUT: Duration = Duration::from_secs(10);
/// How long `moto_server` may take to exit after SIGTERM before it is killed.
const STOP_TIMEOUT: Duration = Duration::from_secs(10);

/// The `moto_server` executable, from `PATH`; panics with advice when it is missing.
pub fn moto_server_path() -> PathBuf {
    std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .map(|dir| dir.join("moto_server"))
        .find(|candidate| candidate.is_file())
        .unwrap_or_else(|| {
            panic!(
                "`moto_server` not found in PATH: the backup tests need a real S3 API; run \
                 scripts/test.sh (it installs it with `python3 -m pip install 'moto[server]'`) \
                 or install it yourself"
            )
        })
}

/// A running (or stopped) `moto_server`; see the [module docs](self).
pub struct Moto {
    dir: PathBuf,
    port: u16,
    /// `moto_server`, while it runs; killed when the [`Moto`] is dropped.
    child: Option<LoggedChild>,
}

impl Moto {
    /// Starts `moto_server` on a free loopback port, logging to `dir/moto.log`, and waits
    /// until it answers.
    pub fn start(dir: &Path) -> Moto {
        std::fs::create_dir_all(dir).expect("create the moto directory");
        let ports = Ports::reserve(1);
        let port = ports.numbers()[0];
        ports.release();
        let mut moto = Moto {
            dir: dir.to_path_buf(),
            port,
            child: None,
        };
        moto.launch();
        moto
    }

    fn launch(&mut self) {
        assert!(self.child.is_none(), "moto_server is already running");
        let child = LoggedChild::spawn(
            "moto_server",
            Command::new(moto_server_path()).args([
                "-H",
                "127.0.0.1",
                "-p",
                &self.port.to_string(),
            ]),
            self.log_path(),
        )
        .expect("start moto_server");
        self.child = Some(child);
        let addr = self.addr();
        wait_until(
            START_TIMEOUT,
            &format!("moto_server answers HTTP on {addr}"),
            || {
                if let Some(status) = self.child.as_mut().and_then(LoggedChild::exited) {
                    panic!(
                        "moto_server exited with {status} before answering; its log:\n{}",
                        self.log()
                    );
                }
                http(addr, "GET", "/")
                    .ok()
                    .filter(|(status, _)| *status == 200)
                    .map(|_| ())
            },
        );
    }

    /// The server's address.
    pub fn addr(&self) -> SocketAddr {
        SocketAddr::from(([127, 0, 0, 1], self.port))
    }

    /// The S3 endpoint URL, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr())
    }

    fn log_path(&self) -> PathBuf {
        self.dir.join("moto.log")
    }

    /// What moto logged so far (one line per request).
    pub fn log(&self) -> String {
        child::read_log(&self.log_path())
    }

    /// Creates a bucket (`PUT /name`); panics unless moto answers 200.
    pub fn create_bucket(&self, name: &str) {
        let (status, body) = http(self.addr(), "PUT", &format!("/{name}"))
            .unwrap_or_else(|e| panic!("PUT /{name} to moto failed: {e}"));
        assert_eq!(status, 200, "creating bucket {name}: {body}");
    }

    /// Whether `moto_server` runs.
    pub fn is_running(&mut self) -> bool {
        self.child.as_mut().is_some_and(LoggedChild::is_running)
    }

    /// Stops `moto_server` (SIGTERM, then SIGKILL after a deadline) and waits until it exited.
    /// Its data is gone: moto keeps everything in memory.
    pub fn stop(&mut self) {
        if let Some(mut child) = self.child.take() {
            child.terminate_within(STOP_TIMEOUT);
        }
    }

    /// Starts `moto_server` again on the same port (empty) and waits until it answers.
    pub fn start_again(&mut self) {
        self.stop();
        self.launch();
    }

    /// `[backup]` settings that reach this server through `endpoint` (the server itself or a
    /// [`Proxy`] in front of it), with a credentials file written to `dir` (moto accepts any).
    pub fn settings(&self, endpoint: &str) -> BackupSettings {
        let credentials = self.dir.join("s3-credentials.toml");
        std::fs::write(
            &credentials,
            "access_key_id = \"testing\"\nsecret_access_key = \"testing-secret\"\n",
        )
        .expect("write the credentials file");
        BackupSettings {
            s3_endpoint: Some(endpoint.to_string()),
            s3_allow_http: true,
            credentials_file: Some(credentials),
            ..BackupSettings::default()
        }
    }
}

/// One HTTP/1.1 request without a body; returns the status and the body (as text).
pub fn http(addr: SocketAddr, method: &str, path: &str) -> std::io::Result<(u16, String)> {
    let mut stream = TcpStream::connect_timeout(&addr, IO_TIMEOUT)?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut response = Vec::new();
    stream.read_to_end(&mut response)?;
    let text = String::from_utf8_lossy(&response).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .ok_or_else(|| std::io::Error::other(format!("not an HTTP response: {text:.200}")))?;
    let body = text
        .split_once("\r\n\r\n")
        .map_or("", |(_, b)| b)
        .to_string();
    Ok((status, body))
}

/// A loopback TCP proxy to one address whose traffic a test can cut and restore: while cut,
/// every open connection is shut down and new ones are closed as soon as they are accepted
/// (the client sees the store go away; the server behind keeps its data). It can also stall:
/// connections stay open and are accepted, but no byte goes either way (a store behind a
/// link that drops everything: the client waits for its own timeout).
pub struct Proxy {
    addr: SocketAddr,
    state: Arc<ProxyState>,
    acceptor: Option<std::thread::JoinHandle<()>>,
}

struct ProxyState {
    target: SocketAddr,
    cut: AtomicBool,
    stalled: AtomicBool,
    closing: AtomicBool,
    /// Both sockets of every open connection, to shut them down on a cut.
    open: Mutex<Vec<(TcpStream, TcpStream)>>,
    /// Connections accepted, and refused while cut.
    accepted: AtomicU64,
    refused: AtomicU64,
}

impl Proxy {
    /// Listens on a free loopback port and forwards every connection to `target`.
    pub fn start(target: SocketAddr) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let state = Arc::new(ProxyState {
            target,
            cut: AtomicBool::new(false),
            stalled: AtomicBool::new(false),
            closing: AtomicBool::new(false),
            open: Mutex::new(Vec::new()),
            accepted: AtomicU64::new(0),
            refused: AtomicU64::new(0),
        });
        let shared = Arc::clone(&state);
        let acceptor = std::thread::spawn(move || accept_loop(listener, shared));
        Proxy {
            addr,
            state,
            acceptor: Some(acceptor),
        }
    }

    /// The proxy's endpoint URL, `http://127.0.0.1:PORT`.
    pub fn endpoint(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Cuts the traffic: open connections are shut down, new ones closed at once.
    pub fn cut(&self) {
        self.state.cut.store(true, Ordering::SeqCst);
        for (client, server) in self.state.open.lock().unwrap().drain(..) {
            let _ = client.shutdown(Shutdown::Both);
            let _ = server.shutdown(Shutdown::Both);
        }
    }

    /// Forwards traffic again (after a cut or a stall).
    pub fn restore(&self) {
        self.state.cut.store(false, Ordering::SeqCst);
        self.state.stalled.store(false, Ordering::SeqCst);
    }

    /// Holds every byte from now on, both ways, on open and new connections, until
    /// [`Proxy::restore`].
    pub fn stall(&self) {
        self.state.stalled.store(true, Ordering::SeqCst);
    }

    /// Connections closed because the proxy was cut.
    pub fn refused(&self) -> u64 {
        self.state.refused.load(Ordering::SeqCst)
    }

    /// Connections accepted so far (refused ones included).
    pub fn accepted(&self) -> u64 {
        self.state.accepted.load(Ordering::SeqCst)
    }
}

fn accept_loop(listener: TcpListener, state: Arc<ProxyState>) {
    for client in listener.incoming() {
        if state.closing.load(Ordering::SeqCst) {
            return;
        }
        let Ok(client) = client else { continue };
        state.accepted.fetch_add(1, Ordering::SeqCst);
        if state.cut.load(Ordering::SeqCst) {
            state.refused.fetch_add(1, Ordering::SeqCst);
            let _ = client.shutdown(Shutdown::Both);
            continue;
        }
        let Ok(server) = TcpStream::connect_timeout(&state.target, IO_TIMEOUT) else {
            let _ = client.shutdown(Shutdown::Both);
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (Ok(client2), Ok(server2), Ok(client3), Ok(server3)) = (
            client.try_clone(),
            server.try_clone(),
            client.try_clone(),
            server.try_clone(),
        ) else {
            continue;
        };
        state.open.lock().unwrap().push((client3, server3));
        let (up, down) = (Arc::clone(&state), Arc::clone(&state));
        std::thread::spawn(move || pump(client, server2, &up));
        std::thread::spawn(move || pump(server, client2, &down));
    }
}

/// Copies `from` to `to` (holding what it read while the proxy is stalled) until either side
/// closes, then closes `to` for writing.
fn pump(mut from: TcpStream, mut to: TcpStream, state: &ProxyState) {
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        let n = match from.read(&mut buf) {
            Ok(0) | Err(_) => break,
            Ok(n) => n,
        };
        while state.stalled.load(Ordering::SeqCst) && !state.closing.load(Ordering::SeqCst) {
            std::thread::sleep(Duration::from_millis(5));
        }
        if to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.state.closing.store(true, Ordering::SeqCst);
        self.cut();
        // Wake the acceptor so it sees `closing`.
        let _ = TcpStream::connect_timeout(&self.addr, Duration::from_secs(1));
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
    }
}
