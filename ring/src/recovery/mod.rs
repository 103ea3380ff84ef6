//! Disaster recovery of the ring itself: `ringd recover` (a majority of members is lost for
//! good) and `ringctl snapshot save|restore` (backup of the ring's own state).
//!
//! # When
//!
//! Raft needs a majority of voters. When a majority is lost *for good* (zones destroyed, disks
//! gone), nothing can ever commit again and the ring is stuck: no control plane moves, and every
//! member fences what it hosts when its lease runs out. Like etcd's `--force-new-cluster`,
//! `ringd recover` restarts the ring from one survivor's data, with that survivor as the only
//! member; operators then add fresh members with the usual `ringctl member add` (new ids).
//! `ringctl snapshot restore` does the same from a file `ringctl snapshot save` wrote, for when
//! no member's data survived.
//!
//! # What is kept and what is lost
//!
//! `ringd recover` rebuilds the state as of the **last entry in the survivor's log**: its
//! latest snapshot, then every entry after it, committed or not. Entries that were appended but
//! not known to be committed become committed; entries that only the lost members had (they
//! may even have been acknowledged to a client, if the survivor was the one member that had
//! not stored them yet) are lost. A restore keeps exactly what the file holds: the leader's
//! applied state when it was saved; everything after is lost. In both cases the history keeps
//! every event the state had, plus one `ring.recover` event naming the survivor, the members
//! removed, the source, the operator's reason and the time.
//!
//! # The new starting point
//!
//! Both write the same thing (see [`crate::raft::offline`]): the recovered state as a snapshot
//! at log id (*a term above every term seen*, *one past the last index*), whose Raft membership
//! is the survivor alone, an empty log purged up to that log id, and a vote for that term that
//! is not committed. The recovery itself is applied through the deterministic core
//! ([`RingState::recover`]) at that index, so the state and its history say what happened. A
//! plain `ringd --config FILE` then starts a one-member ring that elects itself. `ringd recover`
//! writes a new database file (fsynced), keeps the old one unchanged as
//! `<data_dir>/ring.redb.before-recover-<unix ms>` and renames the new one into place. A
//! restore builds the new data directory next to the target and renames it into place, so a
//! failure leaves nothing behind.
//!
//! # Safety after the recovery
//!
//! - **Removed members never come back.** Their ids are retired like `ringctl member remove`
//!   does: peers refuse their messages (they exit with status 3) and `member add` refuses the
//!   ids. Their old data directories must be wiped; the confirmation says so.
//! - **Nor do members the survivor never heard of.** Entries only the lost members had may
//!   have added a member whose id the survivor cannot retire. The recovery raises the ring's
//!   generation ([`RingState::generation`]), which every peer message carries: a member that
//!   kept the state from before the recovery is refused by generation, told it was removed,
//!   and exits with status 3 too.
//! - **No control plane is served twice.** A control plane hosted on a removed member loses
//!   its host at the next epoch. Every control plane then without a host (these, and those
//!   unplaced before) gets every removed member in its `fencing` set: entries only the lost
//!   members had may have placed it on any of them, even on one this state judges lost. Nobody
//!   can know when such a member last renewed its lease, only that it cannot have renewed
//!   since the old majority was lost, which is before the recovery. So the recovered ring's
//!   leader releases them only after it has itself watched the set for `lease + fence + clock
//!   margin` (its controller's normal time-based release), and only then places the control
//!   plane (see [`crate::core::controller`]). A fresh member that reuses a removed member's name is
//!   refused while some control plane still waits for that name, so its renewals cannot be
//!   mistaken for the old member's.
//! - **The survivor's control planes keep their host and epoch.** Its agent renews as usual once
//!   `ringd` is back (after its usual `lease + fence` start-up pause) and gets the same grants.
//!
//! # Offline only
//!
//! `ringd recover` opens the data directory read-only with redb's lock: it refuses while `ringd`
//! runs, `ringd` cannot start while it runs, and the file is not changed before the operator
//! confirms (typing the survivor's name, or `--yes`).

pub mod file;

use std::collections::{BTreeMap, BTreeSet};
use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};

use crate::config::{Config, Timing};
use crate::core::{Command, Member, MemberSpec, Phase, Proposal, RingState, Role};
use crate::durable::sync_parent_dir;
use crate::raft::offline::{OfflineDb, StartingPoint, create_file};
use crate::raft::state_machine::Applied;
use crate::raft::storage::{DB_FILE, OpenError};
use crate::raft::types::{LogId, StoredMembership, Vote, log_id};
use crate::raft::{MemberNode, NodeId};
use crate::time::utc;

pub use file::{FileError, FileHeader};

/// Why a recovery or restore did not happen. Nothing was changed when one of these is returned,
/// except for [`RecoverError::Io`] while writing (the message says what).
#[derive(Debug, thiserror::Error)]
pub enum RecoverError {
    /// The data directory cannot be used.
    #[error(transparent)]
    Storage(#[from] OpenError),
    /// The snapshot file cannot be used.
    #[error(transparent)]
    File(#[from] FileError),
    /// The state does not allow this recovery (e.g. the member is not in it).
    #[error(transparent)]
    Refused(#[from] crate::core::CommandError),
    /// A file operation failed.
    #[error("cannot {what} {path}: {source}")]
    Io {
        /// What was being done.
        what: &'static str,
        /// On which path.
        path: PathBuf,
        /// Why.
        #[source]
        source: std::io::Error,
    },
    /// A restore needs a data directory that does not exist or is empty.
    #[error(
        "data directory {0} is not empty; a restore creates a new data directory (pass an empty or new one with --data-dir)"
    )]
    NotEmpty(PathBuf),
    /// The operator did not confirm.
    #[error("not confirmed: {0}; nothing was changed")]
    NotConfirmed(String),
}

fn io_err(what: &'static str, path: &Path) -> impl FnOnce(std::io::Error) -> RecoverError {
    let path = path.to_path_buf();
    move |source| RecoverError::Io { what, path, source }
}

/// Where the recovered state comes from.
#[derive(Debug, Clone)]
pub enum Origin {
    /// The survivor's own data directory.
    DataDir {
        /// Its last log entry (or snapshot).
        last: Option<LogId>,
        /// The last log id it knew to be committed.
        committed: Option<LogId>,
        /// Commands in its log after its snapshot that were refused (committed without effect).
        refused: usize,
        /// The file was not closed cleanly and was repaired when opened.
        repaired: bool,
    },
    /// A snapshot file.
    File {
        /// The file.
        path: PathBuf,
        /// Its header.
        header: FileHeader,
    },
}

/// What a recovery or restore will do, computed without changing anything.
#[derive(Debug, Clone)]
pub struct Plan {
    /// The member the ring restarts from.
    pub survivor: MemberSpec,
    /// Its data directory.
    pub data_dir: PathBuf,
    /// Where the state comes from.
    pub origin: Origin,
    /// The state as found.
    pub before: Applied,
    /// What will be written.
    pub start: StartingPoint,
}

/// `tool:user@host`, the actor recorded in history for an offline recovery.
pub fn local_actor(tool: &str) -> String {
    let user = std::env::var("USER")
        .or_else(|_| std::env::var("LOGNAME"))
        .ok()
        .or_else(|| {
            nix::unistd::User::from_uid(nix::unistd::getuid())
                .ok()
                .flatten()
                .map(|u| u.name)
        })
        .unwrap_or_else(|| format!("uid{}", nix::unistd::getuid()));
    let host = nix::unistd::gethostname()
        .ok()
        .and_then(|h| h.into_string().ok())
        .unwrap_or_else(|| "unknown".into());
    format!("{tool}:{user}@{host}")
}

/// What the operator asked for: who, why, when.
#[derive(Debug, Clone)]
pub struct Request {
    /// Recorded as the actor.
    pub actor: String,
    /// Recorded as the reason.
    pub reason: String,
    /// Unix milliseconds, recorded as the time.
    pub at_ms: u64,
}

/// Applies the recovery to `applied` (at one past its last index, in a term above
/// `highest_term`) and returns the starting point: the checks of [`RingState::recover`], then
/// the Raft membership of the survivor alone. Asserts what must hold afterwards.
fn starting_point(
    mut applied: Applied,
    survivor: &MemberSpec,
    highest_term: u64,
    source: String,
    request: &Request,
) -> Result<StartingPoint, RecoverError> {
    let term = highest_term + 1;
    let index = applied.applied_index() + 1;
    let removed: Vec<NodeId> = applied
        .state
        .members
        .keys()
        .copied()
        .filter(|id| *id != survivor.id)
        .collect();
    let proposal = Proposal {
        command: Command::Recover {
            survivor: survivor.clone(),
            removed,
            source,
        },
        at_ms: request.at_ms,
        actor: request.actor.clone(),
        reason: request.reason.clone(),
    };
    applied
        .state
        .recover(index, &proposal)
        .map_err(RecoverError::Refused)?;
    let id = log_id(term, survivor.id, index);
    let membership = openraft::Membership::new(
        vec![BTreeSet::from([survivor.id])],
        BTreeMap::from([(survivor.id, MemberNode::from(survivor))]),
    )
    .expect("one voter with its node is a valid membership");
    applied.last_applied = Some(id);
    applied.last_membership = StoredMembership::new(Some(id), membership);

    // What the new ring relies on.
    let state = &applied.state;
    state.check_invariants();
    assert_eq!(
        state.members.keys().copied().collect::<Vec<_>>(),
        vec![survivor.id],
        "the survivor is the only member"
    );
    assert_eq!(state.members[&survivor.id].role, Role::Voter);
    assert!(
        applied
            .last_membership
            .membership()
            .voter_ids()
            .eq([survivor.id]),
        "the survivor is the only voter"
    );
    assert!(
        !state.retired_ids.contains(&survivor.id),
        "the survivor is not retired"
    );
    Ok(StartingPoint {
        applied,
        vote: Vote::new(term, survivor.id),
    })
}

/// Plans `ringd recover` for the member `config` describes, from its data directory, which is
/// opened (and locked) for the rest of the recovery.
pub fn plan_recover(config: &Config, request: &Request) -> Result<(OfflineDb, Plan), RecoverError> {
    let db = OfflineDb::open_existing(&config.data_dir, config.id)?;
    let stored = db.read()?;
    let (before, refused) = stored.state_at_last_entry();
    let survivor = config.member_spec();
    let last = before.last_applied;
    let source = match last {
        Some(l) => format!(
            "the data directory of {}({}) at its last log entry {} (term {})",
            survivor.name, survivor.id, l.index, l.leader_id.term
        ),
        None => format!(
            "the empty data directory of {}({})",
            survivor.name, survivor.id
        ),
    };
    let start = starting_point(
        before.clone(),
        &survivor,
        stored.highest_term(),
        source,
        request,
    )?;
    let plan = Plan {
        survivor,
        data_dir: config.data_dir.clone(),
        origin: Origin::DataDir {
            last,
            committed: stored.committed,
            refused,
            repaired: db.was_repaired(),
        },
        before,
        start,
    };
    Ok((db, plan))
}

/// Carries out a planned `ringd recover`: a new database file with the starting point
/// replaces the old one, which is kept, unchanged, as
/// `<data_dir>/ring.redb.before-recover-<at_ms>`, and with it its write-ahead file as
/// `<data_dir>/raft.wal.before-recover-<at_ms>` (see [`crate::raft::offline`]). Returns what
/// was kept: the old database's new name, and the old WAL's when there was one.
pub fn apply_recover(
    db: OfflineDb,
    plan: &Plan,
    at_ms: u64,
) -> Result<(PathBuf, Option<PathBuf>), RecoverError> {
    let backup = plan
        .data_dir
        .join(format!("{DB_FILE}.before-recover-{at_ms}"));
    let backup_wal = plan.data_dir.join(format!(
        "{}.before-recover-{at_ms}",
        crate::raft::wal::WAL_FILE
    ));
    let had_wal = db.replace_with(&plan.start, &backup, &backup_wal)?;
    Ok((backup, had_wal.then_some(backup_wal)))
}

/// Fails unless `dir` does not exist or is an empty directory.
fn check_empty(dir: &Path) -> Result<(), RecoverError> {
    match std::fs::read_dir(dir) {
        Ok(mut entries) => match entries.next() {
            None => Ok(()),
            Some(_) => Err(RecoverError::NotEmpty(dir.into())),
        },
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(()),
        Err(e) => Err(RecoverError::Io {
            what: "use the data directory",
            path: dir.into(),
            source: e,
        }),
    }
}

/// Plans `ringctl snapshot restore` of `snapshot` for the member `config` describes, into
/// `data_dir`, which must not exist or be empty.
pub fn plan_restore(
    config: &Config,
    snapshot: &Path,
    data_dir: &Path,
    request: &Request,
) -> Result<Plan, RecoverError> {
    check_empty(data_dir)?;
    let (header, before) = file::read(snapshot)?;
    let survivor = config.member_spec();
    let name = snapshot
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_default();
    let mut source = format!(
        "snapshot file {name} (log index {}, term {}, taken from {}, at {})",
        header.last_log_index,
        header.last_log_term,
        header.taken_from,
        utc(header.taken_unix_ms)
    );
    if source.len() > crate::core::limits::MAX_TEXT_LEN {
        source = format!(
            "a snapshot file at log index {}, term {}",
            header.last_log_index, header.last_log_term
        );
    }
    let start = starting_point(
        before.clone(),
        &survivor,
        header.last_log_term,
        source,
        request,
    )?;
    Ok(Plan {
        survivor,
        data_dir: data_dir.to_path_buf(),
        origin: Origin::File {
            path: snapshot.to_path_buf(),
            header,
        },
        before,
        start,
    })
}

/// Carries out a planned restore: builds the data directory next to its target and renames it
/// into place, so a failure leaves nothing behind.
pub fn apply_restore(plan: &Plan) -> Result<(), RecoverError> {
    let target = &plan.data_dir;
    check_empty(target)?;
    let parent = match target.parent() {
        Some(p) if !p.as_os_str().is_empty() => p.to_path_buf(),
        _ => PathBuf::from("."),
    };
    let name = target
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| "data".into());
    let staging = parent.join(format!(".{name}.restoring-{}", std::process::id()));
    let result = (|| {
        std::fs::create_dir_all(&parent).map_err(io_err("create", &parent))?;
        if staging.exists() {
            std::fs::remove_dir_all(&staging).map_err(io_err("remove", &staging))?;
        }
        std::fs::create_dir_all(&staging).map_err(io_err("create", &staging))?;
        let file = staging.join(DB_FILE);
        create_file(&file, plan.survivor.id, &plan.start)?;
        sync_parent_dir(&file).map_err(io_err("sync the directory of", &file))?;
        // An empty target directory is replaced; a missing one created.
        std::fs::rename(&staging, target).map_err(io_err("move the restored data to", target))?;
        sync_parent_dir(target).map_err(io_err("sync the directory of", target))
    })();
    if result.is_err() {
        let _ = std::fs::remove_dir_all(&staging);
    }
    result
}

/// At most 20 items, then "and N more".
fn list(items: impl IntoIterator<Item = String>) -> String {
    const SHOWN: usize = 20;
    let items: Vec<String> = items.into_iter().collect();
    if items.is_empty() {
        return "none".into();
    }
    let more = items.len().saturating_sub(SHOWN);
    let mut text = items.into_iter().take(SHOWN).collect::<Vec<_>>().join(", ");
    if more > 0 {
        text.push_str(&format!(" and {more} more"));
    }
    text
}

impl Plan {
    /// The members that will be removed.
    pub fn removed(&self) -> Vec<&Member> {
        self.before
            .state
            .members
            .values()
            .filter(|m| m.id != self.survivor.id)
            .collect()
    }

    /// What will happen, for the operator to read before confirming.
    pub fn describe(&self, timing: &Timing) -> String {
        let before: &RingState = &self.before.state;
        let after: &RingState = &self.start.applied.state;
        let s = &self.survivor;
        let term = self.start.vote.leader_id.term;
        let mut out = String::new();
        let mut line = |text: String| {
            out.push_str(&text);
            out.push('\n');
        };
        line(format!(
            "Restart the ring from member {} (id {}) alone; data directory {}.",
            s.name,
            s.id,
            self.data_dir.display()
        ));
        line(String::new());
        match &self.origin {
            Origin::DataDir {
                last,
                committed,
                refused,
                repaired,
            } => {
                if *repaired {
                    line(
                        "  (ringd did not stop cleanly: the file was repaired when opened, as ringd's own start would; its content is unchanged.)"
                            .into(),
                    );
                }
                let last_index = last.map_or(0, |l| l.index);
                let committed_index = committed.map_or(0, |l| l.index);
                line(format!(
                    "State: as of the last entry in {}'s log, index {last_index} (term {}).",
                    s.name,
                    last.map_or(0, |l| l.leader_id.term)
                ));
                if last_index > committed_index {
                    line(format!(
                        "  Entries {}..{last_index} were not known here to be committed: they are kept and become committed.",
                        committed_index + 1
                    ));
                }
                line(
                    "  Entries that only the lost members had are lost (as with etcd's --force-new-cluster)."
                        .into(),
                );
                if *refused > 0 {
                    line(format!(
                        "  ({refused} commands in the log were refused when applied, as on every member.)"
                    ));
                }
            }
            Origin::File { path, header } => {
                line(format!(
                    "State: as saved in {}: log index {} (term {}), taken from {}, at {}.",
                    path.display(),
                    header.last_log_index,
                    header.last_log_term,
                    header.taken_from,
                    utc(header.taken_unix_ms)
                ));
                line("  Every change the ring made after that is lost.".into());
            }
        }
        line(format!(
            "New ring: {} (id {}) is its only member and voter, from term {term}; peer {}, admin {}.",
            s.name, s.id, s.address, s.admin_address
        ));
        line(format!(
            "Removed for good, their ids retired: {}.",
            list(
                self.removed()
                    .iter()
                    .map(|m| format!("{} (id {}, zone {})", m.name, m.id, m.zone))
            )
        ));
        let staying = before
            .control_planes
            .values()
            .filter(|cp| cp.host.as_deref() == Some(s.name.as_str()))
            .map(|cp| format!("{} (epoch {}, {})", cp.name, cp.epoch, cp.phase));
        line(format!(
            "Control planes that stay on {} (same host, same epoch): {}.",
            s.name,
            list(staying)
        ));
        let removed: BTreeSet<&str> = self.removed().iter().map(|m| m.name.as_str()).collect();
        let orphaned = before.control_planes.values().filter_map(|cp| {
            let host = cp.host.as_deref().filter(|h| removed.contains(h))?;
            Some(format!(
                "{} (on {host}, epoch {} -> {})",
                cp.name,
                cp.epoch,
                cp.epoch + 1
            ))
        });
        let orphaned = list(orphaned);
        line(format!("Control planes whose host is removed: {orphaned}."));
        if orphaned != "none" {
            line(format!(
                "  They are placed again only once the removed host's lease has certainly run out: lease {} + fence {} + clock margin {} ms after the new ring elects its leader.",
                timing.lease_ms, timing.fence_ms, timing.clock_margin_ms
            ));
        }
        let waiting = after
            .control_planes
            .values()
            .filter(|cp| cp.phase == Phase::Unplaced || !cp.fencing.is_empty())
            .filter(|cp| {
                before
                    .control_planes
                    .get(&cp.name)
                    .is_none_or(|b| b.host.as_deref().is_none_or(|h| !removed.contains(h)))
            })
            .map(|cp| format!("{} ({})", cp.name, cp.phase));
        let waiting = list(waiting);
        if waiting != "none" {
            line(format!(
                "Other control planes without a host or waiting for a former host: {waiting}."
            ));
        }
        line(format!(
            "History: all {} events kept, plus this recovery.",
            before.history.len()
        ));
        line(String::new());
        let names = list(self.removed().iter().map(|m| m.name.clone()));
        line(format!(
            "Before you go on: the removed members ({names}) must be gone for good. Never start them again with \
             their old data: a member that comes back with it belongs to the old ring. Wipe their data directories \
             and add new members with `ringctl member add` under NEW ids (names may be reused once nothing fences them)."
        ));
        if matches!(self.origin, Origin::DataDir { .. }) {
            line(format!(
                "The current data is kept as {}/{DB_FILE}.before-recover-<unix ms>.",
                self.data_dir.display()
            ));
        }
        out
    }

    /// Shows [`Plan::describe`] on `output` and asks the operator to type the survivor's name
    /// on `input`; anything else (or end of input) is a refusal.
    pub fn confirm(
        &self,
        timing: &Timing,
        input: &mut dyn BufRead,
        output: &mut dyn Write,
    ) -> Result<(), RecoverError> {
        let name = &self.survivor.name;
        let stdout = |e| RecoverError::Io {
            what: "write to",
            path: "standard output".into(),
            source: e,
        };
        write!(
            output,
            "{}\nType the member name {name:?} to go on (anything else stops without changing anything): ",
            self.describe(timing)
        )
        .and_then(|()| output.flush())
        .map_err(stdout)?;
        let mut answer = String::new();
        input.read_line(&mut answer).map_err(|e| RecoverError::Io {
            what: "read the confirmation from",
            path: "standard input".into(),
            source: e,
        })?;
        let answer = answer.trim();
        if answer == name {
            Ok(())
        } else if answer.is_empty() {
            Err(RecoverError::NotConfirmed(format!(
                "no answer (expected {name:?}; use --yes in scripts)"
            )))
        } else {
            Err(RecoverError::NotConfirmed(format!(
                "the answer was not {name:?}"
            )))
        }
    }
}

#[cfg(test)]
mod tests;
