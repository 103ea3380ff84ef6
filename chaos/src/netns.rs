//! The network: namespaces, bridges and links that `ring-chaos` creates, breaks and removes.
//!
//! ```text
//!             fabric namespace (bridges only)
//!   br-mesh ── zone-a, zone-b, zone-c            10.77.1.0/24   Raft and Admin between zones
//!   br-reg  ── zone-*, region, client            10.77.2.0/24   DNS server, S3 server
//!   br-cli  ── zone-*, client                    10.77.3.0/24   clients -> control planes
//! ```
//!
//! Zone i (0-based) has 10.77.1.(11+i), 10.77.2.(11+i) and 10.77.3.(11+i); the region is
//! 10.77.2.2; the client 10.77.2.3 and 10.77.3.3. A fault sets links down on the fabric side:
//! `mesh` cuts a zone off from the other zones, `reg` from the region, `cli` from the clients.
//! Every namespace is named `<prefix>-<what>`; [`Topology`] removes all of them when dropped
//! (after killing what runs in them), also when a run fails or is interrupted, and
//! [`cleanup`] removes what an earlier, killed run left behind.

use std::net::Ipv4Addr;
use std::process::Command;

/// Prefix of every namespace `ring-chaos` creates.
pub const PREFIX: &str = "grchaos";

/// The link of a zone that a fault can cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Link {
    /// To the other zones (Raft, Admin).
    Mesh,
    /// To the region (DNS server, object store).
    Region,
    /// To the clients.
    Clients,
}

impl Link {
    /// The interface's name inside a zone's namespace.
    fn inner_name(self) -> &'static str {
        match self {
            Self::Mesh => "mesh",
            Self::Region => "reg",
            Self::Clients => "cli",
        }
    }

    fn fabric_prefix(self) -> &'static str {
        match self {
            Self::Mesh => "m",
            Self::Region => "r",
            Self::Clients => "c",
        }
    }

    /// Every link.
    pub const ALL: [Link; 3] = [Link::Mesh, Link::Region, Link::Clients];
}

/// Why the network could not be set up or changed.
#[derive(Debug, thiserror::Error)]
#[error("ip {args}: {why}")]
pub struct NetError {
    /// The `ip` arguments.
    pub args: String,
    /// What went wrong.
    pub why: String,
}

/// Runs `ip` with `args`.
fn ip(args: &[&str]) -> Result<(), NetError> {
    let out = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| NetError {
            args: args.join(" "),
            why: format!("cannot run ip (Debian package iproute2): {e}"),
        })?;
    if out.status.success() {
        Ok(())
    } else {
        Err(NetError {
            args: args.join(" "),
            why: String::from_utf8_lossy(&out.stderr).trim().to_string(),
        })
    }
}

/// Loads `rules` into nftables in namespace `ns`.
fn nft(ns: &str, rules: &str) -> Result<(), NetError> {
    use std::io::Write as _;
    let failed = |why: String| NetError {
        args: format!("netns exec {ns} nft -f -"),
        why,
    };
    let mut child = Command::new("ip")
        .args(["netns", "exec", ns, "nft", "-f", "-"])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .map_err(|e| failed(format!("cannot run ip: {e}")))?;
    if let Some(mut stdin) = child.stdin.take() {
        stdin
            .write_all(rules.as_bytes())
            .map_err(|e| failed(format!("cannot write the rules: {e}")))?;
    }
    let out = child
        .wait_with_output()
        .map_err(|e| failed(e.to_string()))?;
    if out.status.success() {
        Ok(())
    } else {
        Err(failed(format!(
            "{} (is nftables installed? Debian package nftables)",
            String::from_utf8_lossy(&out.stderr).trim()
        )))
    }
}

/// The namespaces and links of one run.
#[derive(Debug)]
pub struct Topology {
    namespaces: Vec<String>,
}

/// Zone `i`'s address on the mesh.
pub fn mesh_address(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, 1, 11 + i as u8)
}

/// Zone `i`'s address on the region network.
pub fn region_address_of_zone(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, 2, 11 + i as u8)
}

/// Zone `i`'s address on the client network (where its control planes are reached).
pub fn client_address_of_zone(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, 3, 11 + i as u8)
}

/// The region's address (DNS server, object store).
pub const REGION: Ipv4Addr = Ipv4Addr::new(10, 77, 2, 2);

/// The namespace of `what` (`zone-a`, `region`, `client`, `fabric`).
pub fn namespace(what: &str) -> String {
    format!("{PREFIX}-{what}")
}

impl Topology {
    /// Creates the fabric, one namespace per zone in `zones` (at most 9), the region and the
    /// client namespace, with every link up.
    pub fn create(zones: &[String]) -> Result<Self, NetError> {
        assert!(zones.len() <= 9, "at most 9 zones");
        let mut topology = Self {
            namespaces: Vec::new(),
        };
        let fabric = namespace("fabric");
        topology.add_namespace(&fabric)?;
        for bridge in ["br-mesh", "br-reg", "br-cli"] {
            ip(&["-n", &fabric, "link", "add", bridge, "type", "bridge"])?;
            ip(&["-n", &fabric, "link", "set", bridge, "up"])?;
        }
        for (i, zone) in zones.iter().enumerate() {
            let ns = namespace(zone);
            topology.add_namespace(&ns)?;
            let suffix = zone.trim_start_matches("zone-");
            topology.connect(
                &ns,
                &format!("m-{suffix}"),
                "br-mesh",
                "mesh",
                mesh_address(i),
            )?;
            topology.connect(
                &ns,
                &format!("r-{suffix}"),
                "br-reg",
                "reg",
                region_address_of_zone(i),
            )?;
            topology.connect(
                &ns,
                &format!("c-{suffix}"),
                "br-cli",
                "cli",
                client_address_of_zone(i),
            )?;
        }
        let region = namespace("region");
        topology.add_namespace(&region)?;
        topology.connect(&region, "r-region", "br-reg", "reg", REGION)?;
        let client = namespace("client");
        topology.add_namespace(&client)?;
        topology.connect(
            &client,
            "r-client",
            "br-reg",
            "reg",
            Ipv4Addr::new(10, 77, 2, 3),
        )?;
        topology.connect(
            &client,
            "c-client",
            "br-cli",
            "cli",
            Ipv4Addr::new(10, 77, 3, 3),
        )?;
        Ok(topology)
    }

    fn add_namespace(&mut self, ns: &str) -> Result<(), NetError> {
        ip(&["netns", "add", ns])?;
        self.namespaces.push(ns.to_string());
        ip(&["-n", ns, "link", "set", "lo", "up"])
    }

    /// A veth from `bridge` in the fabric (`fabric_end`) to `ns` (`inner`, with `address`/24).
    fn connect(
        &self,
        ns: &str,
        fabric_end: &str,
        bridge: &str,
        inner: &str,
        address: Ipv4Addr,
    ) -> Result<(), NetError> {
        let fabric = namespace("fabric");
        ip(&[
            "-n", &fabric, "link", "add", fabric_end, "type", "veth", "peer", "name", inner,
            "netns", ns,
        ])?;
        ip(&["-n", &fabric, "link", "set", fabric_end, "master", bridge])?;
        ip(&["-n", &fabric, "link", "set", fabric_end, "up"])?;
        ip(&[
            "-n",
            ns,
            "addr",
            "add",
            &format!("{address}/24"),
            "dev",
            inner,
        ])?;
        ip(&["-n", ns, "link", "set", inner, "up"])
    }

    /// Sets `link` of `zone` up or down.
    pub fn set_link(&self, zone: &str, link: Link, up: bool) -> Result<(), NetError> {
        let name = format!(
            "{}-{}",
            link.fabric_prefix(),
            zone.trim_start_matches("zone-")
        );
        ip(&[
            "-n",
            &namespace("fabric"),
            "link",
            "set",
            &name,
            if up { "up" } else { "down" },
        ])
    }

    /// Makes `links` of `zone` drop `percent` of the packets each way, at random (nftables
    /// `numgen random`, in the zone's namespace); 0 removes the loss. Replaces any loss set
    /// before.
    pub fn set_loss(&self, zone: &str, links: &[Link], percent: u8) -> Result<(), NetError> {
        assert!(percent <= 100, "a loss of {percent}%");
        // Creating the table first makes the delete valid when there is none.
        let mut rules = String::from("table inet grchaos {}\ndelete table inet grchaos\n");
        if percent > 0 {
            rules.push_str("table inet grchaos {\n");
            for (chain, hook, dir) in [
                ("input", "input", "iifname"),
                ("output", "output", "oifname"),
            ] {
                rules.push_str(&format!(
                    "  chain {chain} {{\n    type filter hook {hook} priority 0; policy accept;\n"
                ));
                for link in links {
                    rules.push_str(&format!(
                        "    {dir} \"{}\" numgen random mod 100 < {percent} drop\n",
                        link.inner_name()
                    ));
                }
                rules.push_str("  }\n");
            }
            rules.push_str("}\n");
        }
        nft(&namespace(zone), &rules)
    }

    /// Sends `signal` to every process in `zone`'s namespace (ringd, guards, etcds).
    pub fn signal_zone(&self, zone: &str, signal: nix::sys::signal::Signal) -> usize {
        signal_namespace(&namespace(zone), signal)
    }
}

/// Pids of the processes in namespace `ns`.
pub fn pids(ns: &str) -> Vec<i32> {
    Command::new("ip")
        .args(["netns", "pids", ns])
        .output()
        .map(|out| {
            String::from_utf8_lossy(&out.stdout)
                .lines()
                .filter_map(|l| l.trim().parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

fn signal_namespace(ns: &str, signal: nix::sys::signal::Signal) -> usize {
    let pids = pids(ns);
    for pid in &pids {
        let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(*pid), signal);
    }
    pids.len()
}

fn remove_namespace(ns: &str) {
    for _ in 0..50 {
        if signal_namespace(ns, nix::sys::signal::Signal::SIGKILL) == 0 {
            break;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    let _ = ip(&["netns", "del", ns]);
}

impl Drop for Topology {
    fn drop(&mut self) {
        // Processes first, then namespaces; the fabric last (deleting it removes every veth).
        for ns in self.namespaces.iter().rev() {
            remove_namespace(ns);
        }
    }
}

/// Removes every namespace named `<PREFIX>-*` (what a killed run left behind); returns their
/// names.
pub fn cleanup() -> Vec<String> {
    let out = Command::new("ip").args(["netns", "list"]).output();
    let names: Vec<String> = out
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .lines()
                .filter_map(|l| l.split_whitespace().next())
                .filter(|n| n.starts_with(&format!("{PREFIX}-")))
                .map(str::to_string)
                .collect()
        })
        .unwrap_or_default();
    for ns in &names {
        remove_namespace(ns);
    }
    names
}

/// Moves the calling thread into namespace `ns`'s network (threads it starts afterwards
/// inherit it).
pub fn enter(ns: &str) -> Result<(), NetError> {
    let path = format!("/var/run/netns/{ns}");
    let file = std::fs::File::open(&path).map_err(|e| NetError {
        args: format!("netns exec {ns}"),
        why: format!("cannot open {path}: {e}"),
    })?;
    nix::sched::setns(file, nix::sched::CloneFlags::CLONE_NEWNET).map_err(|e| NetError {
        args: format!("netns exec {ns}"),
        why: format!("setns: {e}"),
    })
}
