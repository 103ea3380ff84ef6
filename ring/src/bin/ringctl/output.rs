//! Rendering for `ringctl`: aligned tables for people, JSON for programs.

use garden_ring::pb;

/// A plain text table with aligned columns.
pub struct Table {
    header: Vec<&'static str>,
    rows: Vec<Vec<String>>,
}

impl Table {
    pub fn new(header: Vec<&'static str>) -> Self {
        Self {
            header,
            rows: Vec::new(),
        }
    }

    pub fn row(&mut self, cells: Vec<String>) {
        debug_assert_eq!(cells.len(), self.header.len());
        self.rows.push(cells);
    }

    pub fn render(&self) -> String {
        let mut widths: Vec<usize> = self.header.iter().map(|h| h.len()).collect();
        for row in &self.rows {
            for (w, cell) in widths.iter_mut().zip(row) {
                *w = (*w).max(cell.chars().count());
            }
        }
        let line = |cells: Vec<&str>| {
            let mut s = String::new();
            for (i, (cell, w)) in cells.iter().zip(&widths).enumerate() {
                if i + 1 == cells.len() {
                    s.push_str(cell);
                } else {
                    s.push_str(&format!("{cell:<w$}  "));
                }
            }
            s.trim_end().to_string()
        };
        let mut out = line(self.header.clone());
        for row in &self.rows {
            out.push('\n');
            out.push_str(&line(row.iter().map(String::as_str).collect()));
        }
        out
    }
}

fn or_dash(s: &str) -> String {
    if s.is_empty() {
        "-".into()
    } else {
        s.to_string()
    }
}

pub fn members(members: &[pb::Member], leader_id: Option<u64>) -> String {
    let mut t = Table::new(vec![
        "ID", "NAME", "ZONE", "ROLE", "HEALTH", "VERSION", "PEER", "ADMIN",
    ]);
    let mut revoked = Vec::new();
    let mut diverged = Vec::new();
    for m in members {
        let role = if Some(m.id) == leader_id {
            format!("{} (leader)", m.role)
        } else {
            m.role.clone()
        };
        let mut health = m.health.clone();
        if m.cordoned {
            health.push_str(" (cordoned)");
        }
        if !m.diverged.is_empty() {
            health = "DIVERGED".into();
            diverged.push(format!("{}: {}", m.name, m.diverged));
        }
        if !m.certificate_revoked.is_empty() {
            health.push_str(" (CERTIFICATE REVOKED)");
            revoked.push(format!("{}: {}", m.name, m.certificate_revoked));
        }
        t.row(vec![
            m.id.to_string(),
            m.name.clone(),
            m.zone.clone(),
            role,
            health,
            binary(m.binary.as_ref()),
            m.address.clone(),
            m.admin_address.clone(),
        ]);
    }
    let mut out = t.render();
    for line in diverged {
        out.push_str(&format!(
            "\n{line}\n  it is granted nothing and judged lost once its last lease ran out; never restore a member's data directory: \
             replace it (`ringctl member remove NAME`, then add it anew with an empty data directory: \
             deploy/README.md, \"A member that diverged\")"
        ));
    }
    for line in revoked {
        out.push_str(&format!(
            "\n{line}; issue it a new certificate (ringctl certs issue --force)"
        ));
    }
    out
}

/// A member's binary in a table cell: its release, `0.1.0` for a member that reports none,
/// `-` when the leader has not heard from it (or the answering member predates versions).
pub fn binary(b: Option<&pb::MemberBinary>) -> String {
    match b {
        None => "-".into(),
        Some(b) if !b.reported => "0.1.0".into(),
        Some(b) => b.release.clone(),
    }
}

/// The ring's version line of `ringctl status`, and the upgrade's state.
pub fn ring_version(v: Option<&pb::RingVersionStatus>) -> String {
    let Some(v) = v else {
        return "ring version: 1 (the answering member runs release 0.1.0, which knows no versions)"
            .into();
    };
    let mut line = format!("ring version: {}", v.active);
    if let Some(b) = &v.answering {
        line.push_str(&format!(
            "   answering binary: {} ({}, ring versions {}-{})",
            b.release, b.commit, b.ring_min, b.ring_max
        ));
    }
    line.push_str(&format!("   finalize: {}", v.finalize));
    if v.held {
        line.push_str(&format!(
            "\nupgrade HELD at ring version {}: {}",
            v.active, v.held_reason
        ));
    }
    if v.mixed {
        line.push_str(&format!(
            "\nMIXED RING for {} s: members run binaries of different releases (finish the rolling upgrade, or roll back)",
            v.mixed_for_ms / 1000
        ));
    }
    if v.next != 0 {
        line.push_str(&format!(
            "\nring version {} is available: every member supports it{}",
            v.next,
            if v.held || v.finalize == "manual" {
                " (`ringctl upgrade finalize` raises it; older binaries cannot rejoin after)"
            } else {
                " (the leader raises it)"
            }
        ));
    }
    line
}

/// What `ringctl upgrade` prints.
pub fn upgrade(r: &pb::UpgradeResponse) -> String {
    let status = ring_version(r.ring_version.as_ref());
    if r.index == 0 {
        status
    } else {
        format!("done (index {})\n{status}", r.index)
    }
}

pub fn control_planes(cps: &[pb::ControlPlane]) -> String {
    if cps.is_empty() {
        return "no control planes".into();
    }
    let mut t = Table::new(vec!["NAME", "HOST", "EPOCH", "PHASE", "HOME", "DNS NAME"]);
    for cp in cps {
        let mut phase = match &cp.etcd {
            Some(etcd) if etcd.health != "whole" => format!("{} (etcd {})", cp.phase, etcd.health),
            _ => cp.phase.clone(),
        };
        if cp.problem.is_some() {
            phase.push_str(" (PROBLEM: see cp get)");
        }
        t.row(vec![
            cp.name.clone(),
            or_dash(&cp.host),
            cp.epoch.to_string(),
            phase,
            or_dash(&cp.home),
            cp.dns_name.clone(),
        ]);
    }
    t.render()
}

pub fn control_plane(cp: &pb::ControlPlane) -> String {
    let problem = match &cp.problem {
        Some(p) => format!(
            "PROBLEM:  {} (reported by {} since {} UTC, {}; `ringctl switchover` or `ringctl failover` moves it)\n",
            p.text,
            or_dash(&cp.host),
            utc(p.since_unix_ms),
            ago(garden_ring::time::unix_ms(), p.since_unix_ms)
        ),
        None => String::new(),
    };
    let mut out = format!(
        "name:     {}\nhost:     {}\nepoch:    {}\nphase:    {}\n{problem}home:     {}\ndns name: {}\nbackup:   {}\nendpoints:",
        cp.name,
        or_dash(&cp.host),
        cp.epoch,
        cp.phase,
        or_dash(&cp.home),
        cp.dns_name,
        cp.backup
    );
    for (member, endpoint) in &cp.endpoints {
        let mark = if *member == cp.host { "  <- host" } else { "" };
        out.push_str(&format!("\n  {member}: {endpoint}{mark}"));
    }
    if let Some(etcd) = &cp.etcd {
        let members = etcd.members.len();
        let up = members - etcd.down.len();
        out.push_str(&format!(
            "\ntolerance: zone\netcd:     {} ({up} of {members} members up{}), token {}, generation {}",
            etcd.health,
            if etcd.down.is_empty() {
                String::new()
            } else {
                format!("; down: {}", etcd.down.join(", "))
            },
            etcd.token,
            etcd.generation
        ));
        for m in &etcd.members {
            let mark = if m.member == cp.host { "  <- host" } else { "" };
            let learner = if m.learner { " (learner)" } else { "" };
            let id = if m.etcd_id == 0 {
                "id not known yet".to_string()
            } else {
                format!("id {:x}", m.etcd_id)
            };
            out.push_str(&format!(
                "\n  {}: peer {}, {id}{learner}{mark}",
                m.member, m.peer
            ));
        }
        if !etcd.change.is_empty() {
            out.push_str(&format!("\n  replacing: {}", etcd.change));
        }
        if etcd.health == "no-quorum" {
            out.push_str(
                "\n  no quorum: etcd takes no writes and no linearizable reads; the ring never \
                 forces a new cluster by itself",
            );
        }
    }
    if !cp.labels.is_empty() {
        let labels: Vec<String> = cp.labels.iter().map(|(k, v)| format!("{k}={v}")).collect();
        out.push_str(&format!("\nlabels:   {}", labels.join(",")));
    }
    if !cp.backups.is_empty() {
        out.push_str("\nbackups on:");
        for (member, url) in &cp.backups {
            out.push_str(&format!("\n  {member}: {url}"));
        }
    }
    if let Some(m) = &cp.migration {
        out.push_str(&format!(
            "\nmigration: {} at epoch {}: {} -> {} ({} -> {})\n  started {} UTC, updated {} UTC, {} bytes copied",
            m.step,
            m.epoch,
            or_dash(&m.from),
            or_dash(&m.to),
            or_dash(&m.source),
            or_dash(&m.destination),
            utc(m.started_unix_ms),
            utc(m.updated_unix_ms),
            m.bytes_copied
        ));
        if !m.restored.is_empty() {
            out.push_str(&format!("\n  restored {}", m.restored));
        }
        if let Some(window) = m.data_loss_window_ms {
            out.push_str(&format!("\n  data-loss window: {window} ms"));
        }
        if !m.note.is_empty() {
            out.push_str(&format!("\n  note: {}", m.note));
        }
    }
    out.push('\n');
    out.push_str(&backups(
        cp.backup_status.as_ref(),
        garden_ring::time::unix_ms(),
    ));
    out
}

/// The "backups:" block of `control-plane get`: what the host last reported (as committed),
/// ages counted at `now_ms` (Unix, this machine's clock).
pub fn backups(b: Option<&pb::BackupStatus>, now_ms: u64) -> String {
    let Some(b) = b else {
        return "backups: none reported".into();
    };
    let deltas = if b.delta_period_ms == 0 {
        format!("{} (delta snapshots off)", b.deltas_since_full)
    } else {
        format!(
            "{} (one every {})",
            b.deltas_since_full,
            duration(b.delta_period_ms)
        )
    };
    let newest_delta = match b.newest_delta_unix_ms {
        Some(at) => format!("{} ({} UTC)", ago(now_ms, at), utc(at)),
        None => "none since the full snapshot".into(),
    };
    let mut out = format!(
        "backups:\n  newest full:      {}\n  deltas since:     {deltas}\n  revision:         {}\n  newest delta:     {newest_delta}\n  up to date as of: {} ({} UTC)",
        if b.full.is_empty() {
            "none yet"
        } else {
            &b.full
        },
        b.revision,
        ago(now_ms, b.up_to_date_unix_ms),
        utc(b.up_to_date_unix_ms)
    );
    if let Some(gc) = &b.gc {
        out.push_str(&format!("\n  retention:        {}", gc.policy));
        if gc.last_unix_ms > 0 {
            let oldest = if gc.oldest_full.is_empty() {
                String::new()
            } else {
                format!(", the oldest {}", gc.oldest_full)
            };
            out.push_str(&format!(
                "\n  kept:             {} full snapshot{}{oldest}\n  last GC:          {} ({} UTC), {} deleted",
                gc.kept_full,
                if gc.kept_full == 1 { "" } else { "s" },
                ago(now_ms, gc.last_unix_ms),
                utc(gc.last_unix_ms),
                gc.deleted
            ));
        }
        if !gc.held.is_empty() {
            out.push_str(&format!("\n  GC held:          {}", gc.held));
        }
    }
    if let Some(d) = &b.defrag {
        out.push_str(&format!(
            "\n  defragmented:     {} ({} UTC) in {}, database {} -> {}{}",
            ago(now_ms, d.last_unix_ms),
            utc(d.last_unix_ms),
            duration(d.took_ms),
            size(d.db_before_bytes),
            size(d.db_after_bytes),
            if d.longer_than_lease {
                " (longer than the lease: the endpoint stalled)"
            } else {
                ""
            }
        ));
    }
    out
}

/// `bytes` in binary units: `812 B`, `20.0 KiB`, `1.5 MiB`, `1.00 GiB`.
fn size(bytes: u64) -> String {
    const KIB: f64 = 1024.0;
    let b = bytes as f64;
    if bytes < 1024 {
        format!("{bytes} B")
    } else if b < KIB * KIB {
        format!("{:.1} KiB", b / KIB)
    } else if b < KIB * KIB * KIB {
        format!("{:.1} MiB", b / (KIB * KIB))
    } else {
        format!("{:.2} GiB", b / (KIB * KIB * KIB))
    }
}

/// `ms` in words: `750 ms`, `20 s`, `1.5 s`, `2 min 5 s`, `3 h 4 min`.
fn duration(ms: u64) -> String {
    let s = ms / 1000;
    if ms < 1000 {
        format!("{ms} ms")
    } else if s < 60 {
        if ms.is_multiple_of(1000) {
            format!("{s} s")
        } else {
            format!("{:.1} s", ms as f64 / 1000.0)
        }
    } else if s < 3600 {
        format!("{} min {} s", s / 60, s % 60)
    } else {
        format!("{} h {} min", s / 3600, s % 3600 / 60)
    }
}

/// How long before `now_ms` the time `at_ms` was (both Unix ms); a time ahead of this
/// machine's clock says so instead.
fn ago(now_ms: u64, at_ms: u64) -> String {
    if at_ms > now_ms {
        return format!("{} ahead of this machine's clock", duration(at_ms - now_ms));
    }
    format!("{} ago", duration(now_ms - at_ms))
}

pub fn status(s: &pb::StatusResponse) -> String {
    let leader = match s.members.iter().find(|m| m.id == s.leader_id) {
        Some(m) => format!("{} ({})", m.name, m.id),
        None if s.leader_id == 0 => "none".into(),
        None => s.leader_id.to_string(),
    };
    let answered = s
        .members
        .iter()
        .find(|m| m.id == s.member_id)
        .map(|m| m.name.clone())
        .unwrap_or_else(|| s.member_id.to_string());
    let tls = match &s.tls {
        None => "tls: OFF (the ring runs with insecure = true)".to_string(),
        Some(t) => {
            let mut line = format!(
                "tls: on   certificate: {} sha256 {}…   valid until {} UTC",
                t.identity,
                t.certificate_sha256
                    .get(..12)
                    .unwrap_or(&t.certificate_sha256),
                utc(u64::try_from(t.not_after_unix_s)
                    .unwrap_or(0)
                    .saturating_mul(1000))
                .get(..10)
                .unwrap_or("?")
            );
            if !t.reload_error.is_empty() {
                line.push_str(&format!(
                    "\nTLS RELOAD FAILED (old certificates in use): {}",
                    t.reload_error
                ));
            }
            let now_s = garden_ring::time::unix_ms() / 1000;
            let mut expiring = vec![(
                format!("this member's certificate ({})", t.identity),
                t.not_after_unix_s,
                RENEW_CERT,
            )];
            expiring.extend(t.cas.iter().map(|c| {
                (
                    format!("CA certificate {}", c.subject),
                    c.not_after_unix_s,
                    RENEW_CA,
                )
            }));
            for (what, not_after_s, advice) in expiring {
                if let Some(warning) = expiry_warning(&what, not_after_s, now_s, advice) {
                    line.push('\n');
                    line.push_str(&warning);
                }
            }
            line
        }
    };
    let read = match garden_ring::admin::freshness::stale_line(s.freshness.as_ref()) {
        Some(line) => format!("{line}\n"),
        None => String::new(),
    };
    format!(
        "{read}leader: {leader}   term: {}   applied index: {}   answered by: {answered} ({})   automatic actions: {}\n{tls}\ndns zone: {}\n{}\n\n{}\n\n{}",
        s.term,
        s.applied_index,
        s.server_state,
        if s.paused { "PAUSED" } else { "on" },
        if s.dns_zone.is_empty() {
            "(none: names unconstrained)"
        } else {
            &s.dns_zone
        },
        ring_version(s.ring_version.as_ref()),
        members(&s.members, Some(s.leader_id)),
        control_planes(&s.control_planes)
    )
}

pub fn moves(r: &pb::MoveResponse) -> String {
    if r.moves.is_empty() {
        return "nothing to move".into();
    }
    let mut t = Table::new(vec!["CONTROL PLANE", "FROM", "TO", "EPOCH"]);
    for m in &r.moves {
        t.row(vec![
            m.control_plane.clone(),
            m.from.clone(),
            m.to.clone(),
            m.epoch.to_string(),
        ]);
    }
    if r.dry_run {
        format!("plan (dry run, nothing changed):\n{}", t.render())
    } else {
        format!(
            "moved (index {}); each new host starts once the old one released it or its lease ran out:\n{}",
            r.index,
            t.render()
        )
    }
}

pub fn dns(r: &pb::DnsListResponse) -> String {
    let mut out = dns_summary(r);
    if r.records.is_empty() {
        out.push_str("\n\nno records");
        return out;
    }
    let mut t = Table::new(vec!["NAME", "TYPE", "VALUE", "TTL", "SERVERS", "WHY"]);
    for record in &r.records {
        t.row(vec![
            record.name.clone(),
            record.r#type.clone(),
            or_dash(&record.value),
            format!("{}s", record.ttl_s),
            dns_servers(r, record),
            record.why.clone(),
        ]);
    }
    out.push_str("\n\n");
    out.push_str(&t.render());
    out
}

/// What the servers answer for one record: "visible (312 ms)", or each server's answer.
fn dns_servers(r: &pb::DnsListResponse, record: &pb::DnsRecord) -> String {
    if !r.from_leader || r.servers.is_empty() {
        return "-".into();
    }
    if record.visible {
        return format!("visible on all ({} ms)", record.visible_after_ms);
    }
    let answers: Vec<String> = r
        .servers
        .iter()
        .map(
            |server| match record.answers.iter().find(|a| &a.server == server) {
                Some(a) if a.ok => format!("{server}: ok"),
                Some(a) => format!("{server}: PENDING ({})", a.answer),
                None => format!("{server}: PENDING (not asked yet)"),
            },
        )
        .collect();
    answers.join("; ")
}

/// One paragraph on DNS: provider, servers, counts, the last change, problems.
pub fn dns_summary(r: &pb::DnsListResponse) -> String {
    let pending = r.records.iter().filter(|x| !x.visible).count();
    let mut out = format!(
        "dns: zone {}   provider {}   servers {}   answered by {}{}",
        or_dash(&r.zone),
        or_dash(&r.provider),
        if r.servers.is_empty() {
            "-".into()
        } else {
            r.servers.join(", ")
        },
        r.answered_by,
        if r.from_leader { " (leader)" } else { "" }
    );
    if r.from_leader && !r.servers.is_empty() {
        out.push_str(&format!(
            "\nrecords: {}, {} visible on every server, {} pending",
            r.records.len(),
            r.records.len() - pending,
            pending
        ));
    }
    if !r.last_change.is_empty() {
        out.push_str(&format!(
            "\nlast change: {} visible everywhere {} ms after commit",
            r.last_change, r.last_change_ms
        ));
    }
    for p in &r.problems {
        out.push_str(&format!("\nDNS PROBLEM: {p}"));
    }
    out
}

pub fn history(events: &[pb::Event]) -> String {
    if events.is_empty() {
        return "no events".into();
    }
    let mut t = Table::new(vec![
        "INDEX",
        "TIME (UTC)",
        "ACTOR",
        "ACTION",
        "SUBJECT",
        "DETAIL",
        "REASON",
    ]);
    for e in events {
        t.row(vec![
            e.index.to_string(),
            utc(e.at_ms),
            e.actor.clone(),
            e.action.clone(),
            e.subject.clone(),
            e.detail.clone(),
            or_dash(&e.reason),
        ]);
    }
    t.render()
}

/// Below this many days of validity left, `status` and `certs check` warn.
pub const EXPIRY_WARNING_DAYS: u64 = 30;

/// What to do about an expiring member or operator certificate.
pub const RENEW_CERT: &str =
    "issue a new one (ringctl certs issue --force; members load it without a restart)";
/// What to do about an expiring CA certificate.
pub const RENEW_CA: &str = "make a new CA and add it to every member's and client's CA bundle, \
     then issue new certificates with it, before the old one expires";

/// "WARNING: ... expires in N days (at ...): `advice`" when `not_after_s` is less than
/// [`EXPIRY_WARNING_DAYS`] after `now_s` (Unix seconds), "... EXPIRED ..." once past.
pub fn expiry_warning(what: &str, not_after_s: i64, now_s: u64, advice: &str) -> Option<String> {
    let now = i64::try_from(now_s).unwrap_or(i64::MAX);
    let left_s = not_after_s.saturating_sub(now);
    let at = utc(u64::try_from(not_after_s).unwrap_or(0).saturating_mul(1000));
    let at = at.get(..16).unwrap_or(&at);
    if left_s <= 0 {
        return Some(format!(
            "WARNING: {what} EXPIRED at {at} UTC: nothing accepts it; {advice}"
        ));
    }
    let days = left_s / 86_400;
    (u64::try_from(days).unwrap_or(u64::MAX) < EXPIRY_WARNING_DAYS)
        .then(|| format!("WARNING: {what} expires in {days} day(s), at {at} UTC: {advice}"))
}

/// One certificate `certs check` found.
#[derive(Debug, serde::Serialize)]
pub struct CheckedRow {
    /// The file.
    pub file: String,
    /// Identity or subject (or why the file cannot be read).
    pub name: String,
    /// Serial number (hex).
    pub serial: String,
    /// End of validity (Unix seconds; 0 when unreadable).
    pub not_after_unix_s: i64,
    /// Days left (negative once expired).
    pub days_left: i64,
    /// `ok`, `expires soon`, `expired` or `unreadable`.
    pub status: &'static str,
}

/// The rows of `certs check`, soonest expiry first.
pub fn checked_certificates(
    checked: &[garden_ring::tls::certs::Checked],
    now_s: u64,
    warn_days: u64,
) -> Vec<CheckedRow> {
    let now = i64::try_from(now_s).unwrap_or(i64::MAX);
    let warn = i64::try_from(warn_days).unwrap_or(i64::MAX);
    let mut rows = Vec::new();
    for c in checked {
        let file = c
            .path
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        match &c.certs {
            Err(why) => rows.push(CheckedRow {
                file,
                name: why.clone(),
                serial: String::new(),
                not_after_unix_s: 0,
                days_left: 0,
                status: "unreadable",
            }),
            Ok(certs) => {
                for v in certs {
                    let left_s = v.not_after_unix_s.saturating_sub(now);
                    let days_left = left_s.div_euclid(86_400);
                    rows.push(CheckedRow {
                        file: file.clone(),
                        name: v.name.clone(),
                        serial: v.serial.clone(),
                        not_after_unix_s: v.not_after_unix_s,
                        days_left,
                        status: if left_s <= 0 {
                            "expired"
                        } else if days_left < warn {
                            "expires soon"
                        } else {
                            "ok"
                        },
                    });
                }
            }
        }
    }
    rows.sort_by_key(|r| (r.status == "ok", r.not_after_unix_s));
    rows
}

/// `certs check` as a table.
pub fn certificate_table(rows: &[CheckedRow]) -> String {
    if rows.is_empty() {
        return "no certificate files".into();
    }
    let mut t = Table::new(vec![
        "FILE",
        "NAME",
        "SERIAL",
        "NOT AFTER (UTC)",
        "DAYS LEFT",
        "STATUS",
    ]);
    for r in rows {
        t.row(vec![
            r.file.clone(),
            r.name.clone(),
            or_dash(&r.serial),
            if r.not_after_unix_s == 0 {
                "-".into()
            } else {
                utc(u64::try_from(r.not_after_unix_s)
                    .unwrap_or(0)
                    .saturating_mul(1000))
            },
            r.days_left.to_string(),
            r.status.to_string(),
        ]);
    }
    t.render()
}

/// One revoked certificate in a line.
pub fn revoked_line(r: &pb::RevokedCertificate) -> String {
    format!(
        "certificate {}{} of {} revoked at {} UTC by {}: {}",
        r.serial,
        if r.subject.is_empty() {
            String::new()
        } else {
            format!(" ({})", r.subject)
        },
        r.issuer,
        utc(r.revoked_unix_ms),
        r.actor,
        r.reason
    )
}

/// `certs list-revoked`.
pub fn revoked(list: &[pb::RevokedCertificate]) -> String {
    if list.is_empty() {
        return "no certificate is revoked".into();
    }
    let mut t = Table::new(vec![
        "SERIAL",
        "SUBJECT",
        "ISSUER",
        "REVOKED (UTC)",
        "BY",
        "REASON",
    ]);
    for r in list {
        t.row(vec![
            r.serial.clone(),
            or_dash(&r.subject),
            r.issuer.clone(),
            utc(r.revoked_unix_ms),
            r.actor.clone(),
            r.reason.clone(),
        ]);
    }
    t.render()
}

/// Formats Unix milliseconds as `YYYY-MM-DD HH:MM:SS.mmm` (UTC), without a date library.
pub fn utc(ms: u64) -> String {
    let secs = ms / 1000;
    let (days, rem) = (secs / 86_400, secs % 86_400);
    let (h, m, s) = (rem / 3600, rem % 3600 / 60, rem % 60);
    // Civil-from-days (Howard Hinnant's algorithm).
    let z = days as i64 + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = doy - (153 * mp + 2) / 5 + 1;
    let mo = if mp < 10 { mp + 3 } else { mp - 9 };
    let y = yoe + era * 400 + i64::from(mo <= 2);
    format!(
        "{y:04}-{mo:02}-{d:02} {h:02}:{m:02}:{s:02}.{:03}",
        ms % 1000
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn expiry_warnings_start_thirty_days_before() {
        let now = 1_796_083_200; // 2026-12-01 00:00 UTC
        let day = 86_400;
        assert_eq!(
            expiry_warning("x", now + 31 * day, now as u64, RENEW_CERT),
            None
        );
        let soon = expiry_warning(
            "this member's certificate (member:a)",
            now + 13 * day + 5,
            now as u64,
            RENEW_CERT,
        )
        .unwrap();
        assert!(soon.starts_with("WARNING: this member's certificate (member:a) expires in 13 day(s), at 2026-12-14 00:00 UTC"), "{soon}");
        let gone = expiry_warning("CA certificate CN=x", now - 1, now as u64, RENEW_CA).unwrap();
        assert!(gone.contains("EXPIRED at 2026-11-30 23:59 UTC"), "{gone}");
    }

    #[test]
    fn utc_formatting() {
        assert_eq!(utc(0), "1970-01-01 00:00:00.000");
        assert_eq!(utc(1_796_083_200_123), "2026-12-01 00:00:00.123");
        assert_eq!(utc(951_782_400_000), "2000-02-29 00:00:00.000");
    }

    #[test]
    fn backups_block() {
        assert_eq!(backups(None, 0), "backups: none reported");
        let b = pb::BackupStatus {
            full: "x/v2/Full-00000000-00000100-1700000000.gz".into(),
            deltas_since_full: 3,
            revision: 142,
            newest_delta_unix_ms: Some(1_796_083_200_000),
            up_to_date_unix_ms: 1_796_083_201_000,
            delta_period_ms: 20_000,
            gc: None,
            defrag: None,
        };
        assert_eq!(
            backups(Some(&b), 1_796_083_203_500),
            "backups:\n  newest full:      x/v2/Full-00000000-00000100-1700000000.gz\n  deltas since:     3 (one every 20 s)\n  revision:         142\n  newest delta:     3.5 s ago (2026-12-01 00:00:00.000 UTC)\n  up to date as of: 2.5 s ago (2026-12-01 00:00:01.000 UTC)"
        );
        let quiet = pb::BackupStatus {
            full: String::new(),
            deltas_since_full: 0,
            newest_delta_unix_ms: None,
            delta_period_ms: 0,
            ..b.clone()
        };
        let text = backups(Some(&quiet), 1_796_083_000_000);
        assert!(text.contains("newest full:      none yet"), "{text}");
        assert!(text.contains("0 (delta snapshots off)"), "{text}");
        assert!(text.contains("none since the full snapshot"), "{text}");
        assert!(
            text.contains("3 min 21 s ahead of this machine's clock"),
            "{text}"
        );
        let collected = pb::BackupStatus {
            gc: Some(pb::GarbageCollection {
                policy: "limit-based (7)".into(),
                last_unix_ms: 1_796_083_200_000,
                kept_full: 7,
                oldest_full: "Full-00000000-00000010-1796000000".into(),
                deleted: 4,
                held: String::new(),
            }),
            ..b.clone()
        };
        let text = backups(Some(&collected), 1_796_083_210_000);
        assert!(
            text.ends_with("\n  retention:        limit-based (7)\n  kept:             7 full snapshots, the oldest Full-00000000-00000010-1796000000\n  last GC:          10 s ago (2026-12-01 00:00:00.000 UTC), 4 deleted"),
            "{text}"
        );
        let held = pb::BackupStatus {
            gc: Some(pb::GarbageCollection {
                policy: "exponential".into(),
                held: "its migration of epoch 4 is in progress (copying)".into(),
                ..pb::GarbageCollection::default()
            }),
            ..b
        };
        let held = pb::BackupStatus {
            defrag: Some(pb::Defragmentation {
                last_unix_ms: 1_796_083_200_000,
                took_ms: 5_250,
                db_before_bytes: 1_073_741_824,
                db_after_bytes: 536_870_912,
                longer_than_lease: true,
            }),
            ..held
        };
        let text = backups(Some(&held), 1_796_083_210_000);
        assert!(
            text.ends_with("\n  retention:        exponential\n  GC held:          its migration of epoch 4 is in progress (copying)\n  defragmented:     10 s ago (2026-12-01 00:00:00.000 UTC) in 5.2 s, database 1.00 GiB -> 512.0 MiB (longer than the lease: the endpoint stalled)"),
            "{text}"
        );
        assert_eq!(duration(3_723_000), "1 h 2 min");
        assert_eq!(duration(750), "750 ms");
    }

    #[test]
    fn table_alignment() {
        let mut t = Table::new(vec!["A", "LONGER"]);
        t.row(vec!["xyz".into(), "1".into()]);
        assert_eq!(t.render(), "A    LONGER\nxyz  1");
    }
}
