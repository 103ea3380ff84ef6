//! `dig`, the real DNS client (Debian `bind9-dnsutils`), against a server on loopback.

use std::net::SocketAddr;
use std::process::Command;

/// What `dig` printed for one question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Dig {
    /// The response code (`NOERROR`, `NXDOMAIN`, `SERVFAIL`, `REFUSED`), or `TIMEOUT` when no
    /// answer came.
    pub status: String,
    /// The data of each answer record, as `dig` shows it (`10.0.0.1`, `api.example.com.`, an
    /// SOA's seven fields).
    pub answers: Vec<String>,
    /// Whether the AA flag was set.
    pub authoritative: bool,
}

/// Asks `server` for `name`/`record_type` once (one try, 2 s), over TCP when `tcp`.
pub fn dig(server: SocketAddr, name: &str, record_type: &str, tcp: bool) -> Dig {
    let mut command = Command::new("dig");
    command.args([
        format!("@{}", server.ip()),
        "-p".into(),
        server.port().to_string(),
        "+tries=1".into(),
        "+time=2".into(),
        "+norecurse".into(),
        "+noall".into(),
        "+comments".into(),
        "+answer".into(),
    ]);
    if tcp {
        command.arg("+tcp");
    }
    command.args([name, record_type]);
    let out = command
        .output()
        .expect("dig runs (Debian bind9-dnsutils; scripts/test.sh installs it)");
    let text = String::from_utf8_lossy(&out.stdout);
    let status = text
        .split("status: ")
        .nth(1)
        .and_then(|rest| rest.split(',').next())
        .map(str::to_string)
        .unwrap_or_else(|| "TIMEOUT".into());
    let authoritative = text
        .lines()
        .find(|l| l.contains(";; flags:"))
        .is_some_and(|l| l.split(';').nth(2).is_some_and(|f| f.contains(" aa")));
    let answers = text
        .lines()
        .filter(|l| !l.starts_with(';') && !l.trim().is_empty())
        .map(|l| l.split_whitespace().skip(4).collect::<Vec<_>>().join(" "))
        .filter(|data| !data.is_empty())
        .collect();
    Dig {
        status,
        answers,
        authoritative,
    }
}
