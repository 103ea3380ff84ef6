//! A network namespace of the test's own, with only a loopback interface, for a program that
//! listens on every interface (`etcdbrctl server` binds `*:<--server-port>`): inside it, "every
//! interface" is the namespace's own `lo`, so nothing is exposed on the machine and two tests
//! never collide on a port.
//!
//! [`Netns::create`] runs `unshare -n -- sh -c 'ip link set lo up && exec sleep infinity'`: the
//! `sleep` holds the namespace (it is killed when the [`Netns`] is dropped, also when a test
//! fails). [`Netns::command`] runs a program inside it with `nsenter --net=/proc/<pid>/ns/net`
//! (no fork: the child *is* the program, so a SIGTERM to it reaches the program).
//!
//! Reaching in and out without any interface between the namespaces: a socket stays in the
//! namespace it was created in, whichever thread uses it later. So a thread of the test process
//! enters the namespace (`setns(2)`), creates a socket there and leaves; the socket is then used
//! from the test's own namespace. [`Netns::forward`] makes a listener inside on
//! `127.0.0.1:<port>` and forwards each connection to an address outside (etcd, moto): the
//! program inside uses the same URLs as a program outside. [`Netns::http`] sends one HTTP
//! request to a port inside.
//!
//! Needs root (CAP_SYS_ADMIN) for `unshare -n`, `nsenter` and `setns`; CI runs as root.

use std::fs::File;
use std::io::ErrorKind;
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use nix::sched::{CloneFlags, setns};

use crate::bind::wait_until;

/// How long the namespace's holder may take to bring `lo` up.
const CREATE_TIMEOUT: Duration = Duration::from_secs(10);
/// How long a forwarded connection to the outside may take to open.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// A loopback-only network namespace; see the [module docs](self).
pub struct Netns {
    holder: Child,
    forwards: Vec<Forward>,
}

impl Netns {
    /// Creates the namespace and waits until its `lo` is up; panics (with what `unshare` said)
    /// when it cannot, e.g. without root.
    pub fn create() -> Netns {
        let mut holder = Command::new("unshare")
            .args([
                "-n",
                "--",
                "sh",
                "-c",
                "ip link set lo up && exec sleep infinity",
            ])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .expect("run unshare (util-linux)");
        let pid = holder.id();
        wait_until(CREATE_TIMEOUT, "the namespace's lo is up", || {
            if let Ok(Some(status)) = holder.try_wait() {
                let mut why = String::new();
                if let Some(mut stderr) = holder.stderr.take() {
                    let _ = std::io::Read::read_to_string(&mut stderr, &mut why);
                }
                panic!(
                    "`unshare -n` + `ip link set lo up` failed ({status}): {why}; a network \
                     namespace needs root (CAP_SYS_ADMIN) and iproute2"
                );
            }
            // `sh` execs `sleep` only after `ip link set lo up` succeeded.
            let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).ok()?;
            (comm.trim() == "sleep").then_some(())
        });
        Netns {
            holder,
            forwards: Vec::new(),
        }
    }

    /// `/proc/<holder>/ns/net`: the namespace, as `nsenter` and `setns` take it.
    pub fn path(&self) -> PathBuf {
        PathBuf::from(format!("/proc/{}/ns/net", self.holder.id()))
    }

    /// A command that runs `program` inside the namespace (through `nsenter`, which execs it).
    pub fn command(&self, program: impl AsRef<std::ffi::OsStr>) -> Command {
        let mut command = Command::new("nsenter");
        command
            .arg(format!("--net={}", self.path().display()))
            .arg("--")
            .arg(program);
        command
    }

    /// Runs `f` on a thread that entered the namespace; sockets it creates stay inside.
    pub fn run_inside<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> T {
        let ns = File::open(self.path()).expect("open the namespace");
        std::thread::spawn(move || {
            setns(&ns, CloneFlags::CLONE_NEWNET).expect("setns into the test's network namespace");
            f()
        })
        .join()
        .expect("the thread inside the namespace panicked")
    }

    /// Listens inside on `127.0.0.1:<port>` and forwards every connection to `target` outside,
    /// until the [`Netns`] is dropped.
    pub fn forward(&mut self, port: u16, target: SocketAddr) {
        let listener = self
            .run_inside(move || TcpListener::bind(("127.0.0.1", port)))
            .unwrap_or_else(|e| panic!("listen on 127.0.0.1:{port} inside the namespace: {e}"));
        self.forwards.push(Forward::start(listener, target));
    }

    /// One HTTP/1.1 request without a body to `127.0.0.1:<port>` inside the namespace (what
    /// `nsenter --net=... curl http://127.0.0.1:<port><path>` would send); its status and body.
    pub fn http(&self, port: u16, method: &str, path: &str) -> std::io::Result<(u16, String)> {
        let (method, path) = (method.to_string(), path.to_string());
        self.run_inside(move || {
            crate::s3::http(SocketAddr::from(([127, 0, 0, 1], port)), &method, &path)
        })
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        self.forwards.clear();
        let _ = self.holder.kill();
        let _ = self.holder.wait();
    }
}

/// One forwarded port: an accept loop (polling, so it can be stopped: a connection from the
/// test's namespace could not reach the listener to wake it) and two pumps per connection.
struct Forward {
    closing: Arc<AtomicBool>,
    open: Arc<Mutex<Vec<TcpStream>>>,
    acceptor: Option<JoinHandle<()>>,
}

impl Forward {
    fn start(listener: TcpListener, target: SocketAddr) -> Forward {
        listener
            .set_nonblocking(true)
            .expect("a non-blocking listener");
        let closing = Arc::new(AtomicBool::new(false));
        let open = Arc::new(Mutex::new(Vec::new()));
        let (stop, streams) = (Arc::clone(&closing), Arc::clone(&open));
        let acceptor = std::thread::spawn(move || {
            while !stop.load(Ordering::SeqCst) {
                match listener.accept() {
                    Ok((inside, _)) => connect(inside, target, &streams),
                    Err(e) if e.kind() == ErrorKind::WouldBlock => {
                        std::thread::sleep(Duration::from_millis(5));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(5)),
                }
            }
        });
        Forward {
            closing,
            open,
            acceptor: Some(acceptor),
        }
    }
}

/// Connects `inside` to `target` and pumps both ways; both sockets are kept in `open` so that
/// dropping the [`Forward`] can shut them down.
fn connect(inside: TcpStream, target: SocketAddr, open: &Mutex<Vec<TcpStream>>) {
    let _ = inside.set_nonblocking(false);
    let Ok(outside) = TcpStream::connect_timeout(&target, CONNECT_TIMEOUT) else {
        let _ = inside.shutdown(Shutdown::Both);
        return;
    };
    let _ = inside.set_nodelay(true);
    let _ = outside.set_nodelay(true);
    let (Ok(inside2), Ok(outside2), Ok(inside3), Ok(outside3)) = (
        inside.try_clone(),
        outside.try_clone(),
        inside.try_clone(),
        outside.try_clone(),
    ) else {
        return;
    };
    open.lock().unwrap().extend([inside3, outside3]);
    std::thread::spawn(move || pump(inside, outside2));
    std::thread::spawn(move || pump(outside, inside2));
}

/// Copies `from` to `to` until either side closes, then closes `to` for writing.
fn pump(mut from: TcpStream, mut to: TcpStream) {
    let _ = std::io::copy(&mut from, &mut to);
    let _ = to.shutdown(Shutdown::Write);
    let _ = from.shutdown(Shutdown::Read);
}

impl Drop for Forward {
    fn drop(&mut self) {
        self.closing.store(true, Ordering::SeqCst);
        if let Some(acceptor) = self.acceptor.take() {
            let _ = acceptor.join();
        }
        for stream in self.open.lock().unwrap().drain(..) {
            let _ = stream.shutdown(Shutdown::Both);
        }
    }
}
