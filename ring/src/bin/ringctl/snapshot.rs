//! `ringctl snapshot save|restore`: backup and restore of the ring's own state (see
//! `garden_ring::recovery`).

use std::path::{Path, PathBuf};

use garden_ring::admin::{AdminClient, ClientError, LEADER_ADMIN_HEADER};
use garden_ring::config::Config;
use garden_ring::pb;
use garden_ring::recovery::{self, FileHeader, Request, file};
use serde::Serialize;

use super::{Failure, Output, print};

#[derive(Debug, clap::Subcommand)]
pub enum SnapshotCmd {
    /// Save the ring's state to FILE (needs an admin certificate).
    ///
    /// The leader answers, after confirming with a quorum that it still leads, so the file
    /// holds every change acknowledged before this command (a member that is not the leader
    /// names it, and ringctl asks it). The file starts with a header (format version, the log
    /// index and term the state reflects, who answered and when, the state's length and
    /// SHA-256); it is written to FILE.tmp, fsynced and renamed. An existing FILE is never
    /// overwritten.
    Save {
        /// Where to write the snapshot.
        file: PathBuf,
    },
    /// Offline: create a NEW data directory for a one-member ring from a saved snapshot, when
    /// the whole ring is lost (like `etcdutl snapshot restore`).
    ///
    /// The member is the one RINGD.toml describes; it must be a member in the snapshot. Every
    /// other member is removed for good (ids retired); control planes hosted on them are placed
    /// again once their leases have certainly run out; this member's keep their host and epoch;
    /// the history is kept, plus a `ring.recover` event. Every change after the snapshot is
    /// lost. Only do this when the old ring is gone: its members must never run again with
    /// their old data. The file is checked first (format, length, checksum) and the data
    /// directory must not exist or be empty; on any error nothing is created. Then start the
    /// member with `ringd --config RINGD.toml` and add fresh members with `ringctl member add`
    /// (new ids). Asks to type the member's name unless --yes is given.
    Restore(RestoreArgs),
}

#[derive(Debug, clap::Args)]
pub struct RestoreArgs {
    /// The snapshot file (from `ringctl snapshot save`).
    file: PathBuf,
    /// The ringd.toml of the member that will run the restored ring.
    #[arg(long, value_name = "RINGD.toml")]
    ringd_config: PathBuf,
    /// Where to create the data directory (default: the config's data_dir). It must not exist
    /// or be empty.
    #[arg(long, value_name = "DIR")]
    data_dir: Option<PathBuf>,
    /// Do not ask for confirmation (for scripts).
    #[arg(long)]
    yes: bool,
    /// Why (recorded in history with the restore).
    #[arg(long, default_value = "")]
    reason: String,
}

/// What `snapshot save` reports.
#[derive(Debug, Serialize)]
struct Saved {
    file: PathBuf,
    last_log_index: u64,
    last_log_term: u64,
    taken_from: String,
    bytes: u64,
    sha256: String,
    members: usize,
    control_planes: usize,
    history_events: usize,
}

/// What `snapshot restore` reports.
#[derive(Debug, Serialize)]
struct Restored {
    data_dir: PathBuf,
    member: String,
    member_id: u64,
    last_log_index: u64,
    removed: Vec<String>,
    next: String,
}

/// How often `save` follows "ask the leader" before giving up (leadership moving).
const MAX_REDIRECTS: usize = 3;

/// `ringctl snapshot save FILE`: asks `client`'s endpoints; a member that is not the leader
/// names the leader's Admin address, and `leader` makes a client for it.
pub async fn save(
    client: &AdminClient,
    leader: impl Fn(String) -> Result<AdminClient, ClientError>,
    path: &Path,
    out: Output,
) -> Result<(), Failure> {
    if path.exists() {
        return Err(Failure(format!(
            "{} exists already; choose another file name or remove it first",
            path.display()
        )));
    }
    let mut answer = call_save(client).await;
    for _ in 0..MAX_REDIRECTS {
        let address = match &answer {
            Err(ClientError::Status(s)) => s
                .metadata()
                .get(LEADER_ADMIN_HEADER)
                .and_then(|v| v.to_str().ok())
                .map(str::to_string),
            _ => None,
        };
        let Some(address) = address else { break };
        answer = call_save(&leader(address)?).await;
    }
    let mut stream = answer?;

    let stream_err = |e: tonic::Status| Failure(format!("receiving the snapshot: {}", e.message()));
    let first = stream
        .message()
        .await
        .map_err(stream_err)?
        .ok_or_else(|| Failure("the leader sent no snapshot".into()))?;
    let info = first
        .info
        .clone()
        .ok_or_else(|| Failure("the leader's snapshot has no header".into()))?;
    if info.total_bytes > garden_ring::raft::service::MAX_SNAPSHOT_BYTES {
        return Err(Failure(format!(
            "the leader announces a snapshot of {} bytes, more than the limit of {} bytes",
            info.total_bytes,
            garden_ring::raft::service::MAX_SNAPSHOT_BYTES
        )));
    }
    let mut body = Vec::with_capacity(usize::try_from(info.total_bytes).unwrap_or(0));
    body.extend_from_slice(&first.data);
    while let Some(chunk) = stream.message().await.map_err(stream_err)? {
        body.extend_from_slice(&chunk.data);
        if body.len() as u64 > info.total_bytes {
            return Err(Failure(format!(
                "the leader sent more than the {} bytes it announced",
                info.total_bytes
            )));
        }
    }
    let taken_from = format!("{} (id {}), the leader", info.member_name, info.member_id);
    let header = FileHeader::for_body(
        &body,
        info.last_log_index,
        info.last_log_term,
        taken_from.clone(),
        info.taken_unix_ms,
    )
    .with_codec(info.codec);
    if body.len() as u64 != info.total_bytes || header.body_sha256 != info.sha256 {
        return Err(Failure(format!(
            "the snapshot arrived damaged: {} bytes with SHA-256 {}, the leader announced {} bytes with {}; nothing was written",
            body.len(),
            header.body_sha256,
            info.total_bytes,
            info.sha256
        )));
    }
    if !garden_ring::raft::codec::reads(info.codec)
        || info.snapshot_format != header.snapshot_format
    {
        return Err(Failure(format!(
            "the ring encodes its state as codec {} / format {}; this ringctl ({}) reads codecs {} / format {}: use the ringctl of the ring's version",
            info.codec,
            info.snapshot_format,
            garden_ring::version::RELEASE,
            garden_ring::raft::codec::readable(),
            header.snapshot_format
        )));
    }
    // Exactly what restore will read, checked before it is written.
    let (_, applied) = file::decode(path, &file::encode(&header, &body))
        .map_err(|e| Failure(format!("the leader's snapshot cannot be used: {e}")))?;
    file::write(path, &header, &body).map_err(|e| Failure(e.to_string()))?;
    let saved = Saved {
        file: path.to_path_buf(),
        last_log_index: header.last_log_index,
        last_log_term: header.last_log_term,
        taken_from,
        bytes: header.body_bytes,
        sha256: header.body_sha256,
        members: applied.state.members.len(),
        control_planes: applied.state.control_planes.len(),
        history_events: applied.state.history.len(),
    };
    print(out, &saved, |s| {
        format!(
            "saved the ring's state at log index {} (term {}) from {} to {}: {} bytes, sha256 {}; {} members, {} control planes, {} history events",
            s.last_log_index,
            s.last_log_term,
            s.taken_from,
            s.file.display(),
            s.bytes,
            s.sha256,
            s.members,
            s.control_planes,
            s.history_events
        )
    });
    Ok(())
}

async fn call_save(
    client: &AdminClient,
) -> Result<tonic::Streaming<pb::SnapshotSaveChunk>, ClientError> {
    client
        .call(pb::SnapshotSaveRequest {}, |mut c, r| async move {
            c.snapshot_save(r).await
        })
        .await
}

/// `ringctl snapshot restore FILE --ringd-config RINGD.toml` (offline).
pub fn restore(args: RestoreArgs, out: Output) -> Result<(), Failure> {
    let fail = |e: &dyn std::fmt::Display| Failure(e.to_string());
    let config = Config::load(&args.ringd_config).map_err(|e| fail(&e))?;
    config.validate().map_err(|e| fail(&e))?;
    let data_dir = args
        .data_dir
        .clone()
        .unwrap_or_else(|| config.data_dir.clone());
    let request = Request {
        actor: recovery::local_actor("ringctl"),
        reason: args.reason.clone(),
        at_ms: garden_ring::time::unix_ms(),
    };
    let plan =
        recovery::plan_restore(&config, &args.file, &data_dir, &request).map_err(|e| fail(&e))?;
    if args.yes {
        if out == Output::Table {
            println!("{}", plan.describe(&config.timing));
        }
    } else {
        plan.confirm(
            &config.timing,
            &mut std::io::stdin().lock(),
            &mut std::io::stdout(),
        )
        .map_err(|e| fail(&e))?;
        println!();
    }
    recovery::apply_restore(&plan).map_err(|e| fail(&e))?;
    let mut next = format!("ringd --config {}", args.ringd_config.display());
    if data_dir != config.data_dir {
        next.push_str(&format!(" --data-dir {}", data_dir.display()));
    }
    let restored = Restored {
        data_dir,
        member: plan.survivor.name.clone(),
        member_id: plan.survivor.id,
        last_log_index: plan.start.applied.applied_index(),
        removed: plan.removed().iter().map(|m| m.name.clone()).collect(),
        next,
    };
    print(out, &restored, |r| {
        format!(
            "restored: {} is a new data directory for a one-member ring of {} (id {}) at log index {}.\n\
             Next: start it with `{}`, then add fresh members with `ringctl member add` (new ids).",
            r.data_dir.display(),
            r.member,
            r.member_id,
            r.last_log_index,
            r.next
        )
    });
    Ok(())
}
