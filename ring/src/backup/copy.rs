//! Copying every snapshot of one backup location to another, with the semantics of
//! `etcdbrctl copy` (etcd-backup-restore) that a migration needs (DESIGN.md rule 4):
//!
//! - **Final snapshots first**: every `.final` snapshot is copied (newest first) before any
//!   other starts, so an interrupted copy has the most important object already; then the
//!   rest, newest first.
//! - **`.final` is stripped** from the destination name: at the destination it is an ordinary
//!   full snapshot, and the new owner's own final snapshot later is not confused with it. When
//!   a source holds both `X.final` and `X`, only the final one is copied.
//! - **Skips what is there**: a destination object with the same name and size is not copied
//!   again, so running the copy again after a failure resumes it. A destination object with
//!   the same name and another size is a conflict: the copy stops before copying anything and
//!   overwrites nothing.
//! - **Only the restore's chain, when asked** ([`CopyOptions::newest_fulls`], like
//!   `etcdbrctl copy --max-backups-to-copy`): the newest N full snapshots and every delta that
//!   reaches past the oldest of them; older snapshots stay at the source only
//!   ([`CopyReport::left_out`]). A migration copies one stream (a restore replays the newest
//!   full snapshot and the deltas after it) and more only when its full snapshot does not
//!   verify.
//! - **Never deletes or changes anything at the source.**
//! - **Complete or invisible**: a destination object appears only complete. Objects up to one
//!   part ([`PART_SIZE_BYTES`]) are written with one atomic put; bigger ones are streamed from
//!   `get` into a multipart upload completed after the last byte (and aborted on failure), so
//!   no object is ever held whole in memory. A retry first asks whether the previous attempt
//!   completed the object after all (its answer lost), and then counts it as copied. A byte count that differs from the listed size
//!   aborts the upload (the source changed underneath).
//! - **Server-side copy** when both locations are in one bucket of one store
//!   ([`BackupLocation::store_id`]) and the object is at most [`MAX_SERVER_SIDE_COPY_BYTES`]
//!   (S3's limit for one CopyObject).
//! - **Bounded parallelism**: at most `parallelism` objects at once, each with at most
//!   [`MAX_PARTS_IN_FLIGHT`] parts uploading, so memory stays below
//!   `parallelism × (MAX_PARTS_IN_FLIGHT + 1) × PART_SIZE_BYTES` (96 MiB at the default 4).
//! - **Retries**: each object is retried from its start with exponential backoff
//!   ([`RetryPolicy`]) on errors that may pass (store unavailable, timeouts, server errors),
//!   until its attempts run out or the caller's deadline would pass (checked between
//!   attempts; an attempt in progress is not cut, the store client's own timeouts bound it).
//!   Listing is retried the same way. A missing object or bucket, a refused permission or a
//!   conflict stops the copy at once ([`CopyError::is_retryable`] says which is which). After
//!   an error no new object is started; those in progress finish first.
//! - **Progress** goes to an optional watch channel ([`CopyProgress`]) as bytes move.

use std::collections::{BTreeMap, BTreeSet, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;
use futures::stream::FuturesUnordered;
use futures::{StreamExt, TryStreamExt};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutPayload, UploadPart};
use tokio::sync::watch;
use tokio::task::JoinSet;
use tokio::time::Instant;

use super::layout::{Listed, Listing, StoreError, Unparsed, list_snapshots};
use super::location::{BackupLocation, is_retryable};
use crate::config::{BackupSettings, MAX_COPY_PARALLELISM};
use crate::core::backup_name::{BackupNameError, SnapshotKind, SnapshotPath};

/// Size of one multipart part, and the largest object written with a single put.
pub const PART_SIZE_BYTES: usize = 8 * 1024 * 1024;
/// Parts of one object uploading at once.
pub const MAX_PARTS_IN_FLIGHT: usize = 2;
/// Largest object copied server-side (S3 CopyObject copies at most 5 GiB in one request);
/// bigger ones are streamed.
pub const MAX_SERVER_SIDE_COPY_BYTES: u64 = 5 * 1024 * 1024 * 1024;
/// Most attempts a [`RetryPolicy`] may allow per object.
pub const MAX_COPY_ATTEMPTS: u32 = 1_000;

/// How one object (or one listing) is retried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RetryPolicy {
    /// Wait before the second attempt, in ms; doubled after every failed attempt.
    pub initial_backoff_ms: u64,
    /// Longest wait between two attempts, in ms.
    pub max_backoff_ms: u64,
    /// Attempts per object, the first included (1 to [`MAX_COPY_ATTEMPTS`]).
    pub max_attempts: u32,
}

impl Default for RetryPolicy {
    /// 100 ms doubling to 5 s, 10 attempts: about 25 s of outage per object.
    fn default() -> Self {
        Self {
            initial_backoff_ms: 100,
            max_backoff_ms: 5_000,
            max_attempts: 10,
        }
    }
}

/// How a copy runs.
#[derive(Debug, Clone)]
pub struct CopyOptions {
    /// Objects copied at once (clamped to 1..=[`MAX_COPY_PARALLELISM`]).
    pub parallelism: usize,
    /// Retries of each object and listing.
    pub retry: RetryPolicy,
    /// No attempt starts after this instant (none: only `retry.max_attempts` bounds retries).
    pub deadline: Option<Instant>,
    /// Where progress is reported, if anywhere.
    pub progress: Option<watch::Sender<CopyProgress>>,
    /// Copy only the newest this many full snapshots and the deltas that reach past the
    /// oldest of them (none: everything). With fewer full snapshots at the source, everything.
    pub newest_fulls: Option<usize>,
}

impl CopyOptions {
    /// Options with the configured parallelism, default retries, no deadline, no progress.
    pub fn new(settings: &BackupSettings) -> Self {
        Self {
            parallelism: settings.copy_parallelism,
            retry: RetryPolicy::default(),
            deadline: None,
            progress: None,
            newest_fulls: None,
        }
    }
}

/// How far a copy is. `bytes_done` may step back when an attempt fails and the bytes it had
/// moved are moved again.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CopyProgress {
    /// Snapshots to copy (skipped ones excluded), known once both locations are listed.
    pub objects_total: usize,
    /// Snapshots copied so far.
    pub objects_done: usize,
    /// Bytes of the snapshots to copy.
    pub bytes_total: u64,
    /// Bytes moved so far (server-side copies count when they complete).
    pub bytes_done: u64,
}

/// How an object reached the destination.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CopyMethod {
    /// The store copied it (same bucket).
    ServerSide,
    /// Read and written in one put (at most [`PART_SIZE_BYTES`]).
    Put,
    /// Streamed into a multipart upload.
    Streamed,
}

/// A snapshot copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CopiedObject {
    /// Its key at the source.
    pub source: SnapshotPath,
    /// Its key at the destination (`.final` stripped).
    pub destination: SnapshotPath,
    /// Its size.
    pub size_bytes: u64,
    /// How it was copied.
    pub method: CopyMethod,
    /// Attempts it took (1 without retries).
    pub attempts: u32,
}

/// Why a snapshot was not copied.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum SkipReason {
    /// The destination already holds it (same name, same size).
    Present,
    /// The source also holds a final snapshot with the same destination name, copied instead.
    SupersededByFinal,
}

/// A snapshot not copied.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SkippedObject {
    /// Its key at the source.
    pub source: SnapshotPath,
    /// The destination key it maps to.
    pub destination: SnapshotPath,
    /// Why.
    pub reason: SkipReason,
}

/// What a copy did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CopyReport {
    /// Snapshots copied, in the order they completed (final snapshots first).
    pub copied: Vec<CopiedObject>,
    /// Snapshots not copied.
    pub skipped: Vec<SkippedObject>,
    /// Objects under the source's `v2/` that are not snapshots (not copied; for the log).
    pub unparsed: Vec<Unparsed>,
    /// Bytes of the snapshots copied.
    pub bytes_copied: u64,
    /// Snapshots older than what [`CopyOptions::newest_fulls`] asked for: not copied.
    pub left_out: usize,
}

/// Why a copy stopped. Objects completed before it remain at the destination, complete.
#[derive(Debug, thiserror::Error)]
pub enum CopyError {
    /// Source and destination are the same location.
    #[error("cannot copy {url} onto itself")]
    SameLocation {
        /// The location.
        url: String,
    },
    /// A location cannot be listed.
    #[error("{which}: {source}")]
    List {
        /// `source` or `destination`.
        which: &'static str,
        /// Why.
        #[source]
        source: StoreError,
        /// Attempts made.
        attempts: u32,
    },
    /// A destination name cannot be formed (the destination prefix is too long for it).
    #[error("cannot name {source_key} at {destination}: {why}")]
    Name {
        /// The source key.
        source_key: String,
        /// The destination location.
        destination: String,
        /// Why.
        why: BackupNameError,
    },
    /// The destination holds an object of the same name and another size.
    #[error(
        "{destination} already holds {key} with {existing_bytes} bytes, but the source's is {source_bytes} bytes; nothing was copied or overwritten"
    )]
    Conflict {
        /// The destination location.
        destination: String,
        /// The key.
        key: String,
        /// Size at the destination.
        existing_bytes: u64,
        /// Size at the source.
        source_bytes: u64,
    },
    /// The source object's size changed while it was copied (it was replaced).
    #[error(
        "{source_key} at {source_url} was listed with {listed_bytes} bytes but {read_bytes} were read; its copy was abandoned"
    )]
    SourceChanged {
        /// The source location.
        source_url: String,
        /// The key.
        source_key: String,
        /// Size when listed.
        listed_bytes: u64,
        /// Size read.
        read_bytes: u64,
    },
    /// Copying one object failed.
    #[error(
        "copying {source_url}/{source_key} to {destination_url}: gave up after {attempts} attempt(s): {error}"
    )]
    Object {
        /// The source location.
        source_url: String,
        /// The source key.
        source_key: String,
        /// The destination location.
        destination_url: String,
        /// Attempts made.
        attempts: u32,
        /// The last error.
        #[source]
        error: object_store::Error,
    },
    /// A copy task panicked or was cancelled.
    #[error("a copy task failed: {0}")]
    Task(String),
}

impl CopyError {
    /// Whether the same copy may succeed later (the store was unavailable or failing): run it
    /// again, it skips what is complete. Otherwise something must change first.
    pub fn is_retryable(&self) -> bool {
        match self {
            CopyError::List { source, .. } => source.is_retryable(),
            CopyError::Object { error, .. } => is_retryable(error),
            CopyError::Task(_) => true,
            CopyError::SameLocation { .. }
            | CopyError::Name { .. }
            | CopyError::Conflict { .. }
            | CopyError::SourceChanged { .. } => false,
        }
    }
}

/// One object to copy.
#[derive(Debug, Clone)]
struct Job {
    source: Listed,
    destination: SnapshotPath,
    destination_location: Path,
}

/// What every copy task shares.
struct Shared {
    source_store: Arc<dyn ObjectStore>,
    destination_store: Arc<dyn ObjectStore>,
    same_store: bool,
    source_url: String,
    destination_url: String,
    retry: RetryPolicy,
    deadline: Option<Instant>,
    progress: Option<watch::Sender<CopyProgress>>,
}

impl Shared {
    fn progress(&self, change: impl FnOnce(&mut CopyProgress)) {
        if let Some(progress) = &self.progress {
            progress.send_modify(change);
        }
    }
}

/// Copies every snapshot of `source` to `destination` (see the [module docs](self)).
pub async fn copy_snapshots(
    source: &BackupLocation,
    destination: &BackupLocation,
    options: &CopyOptions,
) -> Result<CopyReport, CopyError> {
    if source.store_id() == destination.store_id() && source.prefix() == destination.prefix() {
        return Err(CopyError::SameLocation {
            url: source.to_string(),
        });
    }
    let retry = RetryPolicy {
        max_attempts: options.retry.max_attempts.clamp(1, MAX_COPY_ATTEMPTS),
        ..options.retry
    };
    let source_listing = list_with_retry(source, "source", retry, options.deadline).await?;
    let destination_listing =
        list_with_retry(destination, "destination", retry, options.deadline).await?;
    let mut report = CopyReport {
        unparsed: source_listing.unparsed.clone(),
        ..CopyReport::default()
    };
    let (finals, rest) = plan(
        &source_listing,
        &destination_listing,
        destination,
        options.newest_fulls,
        &mut report,
    )?;

    let shared = Arc::new(Shared {
        source_store: source.store(),
        destination_store: destination.store(),
        same_store: source.store_id() == destination.store_id(),
        source_url: source.to_string(),
        destination_url: destination.to_string(),
        retry,
        deadline: options.deadline,
        progress: options.progress.clone(),
    });
    let to_copy = finals.iter().chain(&rest);
    let (objects_total, bytes_total) = (
        finals.len() + rest.len(),
        to_copy.map(|job| job.source.size_bytes).sum::<u64>(),
    );
    shared.progress(|p| {
        *p = CopyProgress {
            objects_total,
            bytes_total,
            ..CopyProgress::default()
        }
    });
    let parallelism = options.parallelism.clamp(1, MAX_COPY_PARALLELISM);
    run_phase(finals, &shared, parallelism, &mut report).await?;
    run_phase(rest, &shared, parallelism, &mut report).await?;
    Ok(report)
}

/// The revision a copy of the newest `newest_fulls` full snapshots starts after: the oldest
/// of them's. Full snapshots below it, and deltas that do not reach past it, are left out.
/// `None`: everything is copied (no limit, or no more full snapshots than it).
fn copy_after(source: &Listing, newest_fulls: Option<usize>) -> Option<u64> {
    let n = newest_fulls?.max(1);
    // One entry per destination name (`X` and `X.final` are one), newest first.
    let fulls: BTreeSet<(u64, u64)> = source
        .snapshots
        .iter()
        .map(|s| s.path.name())
        .filter(|n| n.kind() == SnapshotKind::Full)
        .map(|n| (n.last_revision(), n.created_unix_s()))
        .collect();
    (fulls.len() > n).then(|| fulls.iter().rev().nth(n - 1).map(|f| f.0))?
}

/// Splits the source's snapshots into final ones and the rest (each newest first), minus
/// what the destination holds and what `newest_fulls` leaves out; records the skipped ones
/// in `report`.
fn plan(
    source: &Listing,
    destination: &Listing,
    destination_location: &BackupLocation,
    newest_fulls: Option<usize>,
    report: &mut CopyReport,
) -> Result<(Vec<Job>, Vec<Job>), CopyError> {
    let after = copy_after(source, newest_fulls);
    let existing: BTreeMap<String, u64> = destination
        .snapshots
        .iter()
        .map(|s| (s.path.to_string(), s.size_bytes))
        .collect();
    // Finals first, then the rest; newest first within each.
    let mut ordered: Vec<&Listed> = source.snapshots.iter().collect();
    ordered.sort_by(|a, b| {
        let key = |s: &Listed| {
            let n = s.path.name();
            (n.is_final(), n.last_revision(), n.created_unix_s())
        };
        key(b).cmp(&key(a))
    });
    let mut planned = BTreeSet::new();
    let (mut finals, mut rest) = (Vec::new(), Vec::new());
    for listed in ordered {
        if let Some(after) = after {
            let n = listed.path.name();
            let older = match n.kind() {
                SnapshotKind::Full => n.last_revision() < after,
                SnapshotKind::Incr => n.last_revision() <= after,
            };
            if older {
                report.left_out += 1;
                continue;
            }
        }
        let name = listed.path.name().with_final(false);
        let destination = SnapshotPath::new(destination_location.backup_prefix().clone(), name)
            .map_err(|why| CopyError::Name {
                source_key: listed.path.to_string(),
                destination: destination_location.to_string(),
                why,
            })?;
        let key = destination.to_string();
        let skip = |reason| SkippedObject {
            source: listed.path.clone(),
            destination: destination.clone(),
            reason,
        };
        if !planned.insert(key.clone()) {
            report.skipped.push(skip(SkipReason::SupersededByFinal));
            continue;
        }
        match existing.get(&key) {
            Some(&size) if size == listed.size_bytes => {
                report.skipped.push(skip(SkipReason::Present));
                continue;
            }
            Some(&size) => {
                return Err(CopyError::Conflict {
                    destination: destination_location.to_string(),
                    key,
                    existing_bytes: size,
                    source_bytes: listed.size_bytes,
                });
            }
            None => {}
        }
        let destination_location = Path::parse(&key).map_err(|e| CopyError::Name {
            source_key: listed.path.to_string(),
            destination: destination_location.to_string(),
            why: BackupNameError::Layout {
                key: format!("{key} ({e})"),
            },
        })?;
        let job = Job {
            source: listed.clone(),
            destination,
            destination_location,
        };
        if listed.path.name().is_final() {
            finals.push(job);
        } else {
            rest.push(job);
        }
    }
    Ok((finals, rest))
}

async fn list_with_retry(
    location: &BackupLocation,
    which: &'static str,
    retry: RetryPolicy,
    deadline: Option<Instant>,
) -> Result<Listing, CopyError> {
    let mut backoff = Backoff::new(retry);
    loop {
        match list_snapshots(location).await {
            Ok(listing) => return Ok(listing),
            Err(error) => {
                let attempts = backoff.attempts;
                if !(error.is_retryable() && backoff.wait(deadline, &error).await) {
                    return Err(CopyError::List {
                        which,
                        source: error,
                        attempts,
                    });
                }
            }
        }
    }
}

/// Exponential backoff over the attempts of one [`RetryPolicy`].
struct Backoff {
    policy: RetryPolicy,
    attempts: u32,
    next_ms: u64,
}

impl Backoff {
    fn new(policy: RetryPolicy) -> Self {
        Self {
            policy,
            attempts: 1,
            next_ms: policy.initial_backoff_ms,
        }
    }

    /// Sleeps before the next attempt and returns true, or returns false when the attempts
    /// are used up or the next one would start after the deadline.
    async fn wait(
        &mut self,
        deadline: Option<Instant>,
        error: &(dyn std::fmt::Display + Sync),
    ) -> bool {
        if self.attempts >= self.policy.max_attempts {
            return false;
        }
        let pause = Duration::from_millis(self.next_ms.min(self.policy.max_backoff_ms));
        if deadline.is_some_and(|d| Instant::now() + pause >= d) {
            return false;
        }
        tracing::warn!(
            attempt = self.attempts,
            retry_in_ms = pause.as_millis() as u64,
            "backup copy: {error}; retrying"
        );
        tokio::time::sleep(pause).await;
        self.attempts += 1;
        self.next_ms = self
            .next_ms
            .saturating_mul(2)
            .min(self.policy.max_backoff_ms);
        true
    }
}

/// Copies `jobs`, at most `parallelism` at once; after an error starts no new job, waits for
/// those running and returns the first error.
async fn run_phase(
    jobs: Vec<Job>,
    shared: &Arc<Shared>,
    parallelism: usize,
    report: &mut CopyReport,
) -> Result<(), CopyError> {
    let mut queue = jobs.into_iter();
    let mut running = JoinSet::new();
    let mut first_error = None;
    loop {
        while first_error.is_none() && running.len() < parallelism {
            let Some(job) = queue.next() else { break };
            running.spawn(copy_one(Arc::clone(shared), job));
        }
        let Some(done) = running.join_next().await else {
            break;
        };
        match done {
            Ok(Ok(copied)) => {
                report.bytes_copied += copied.size_bytes;
                report.copied.push(copied);
            }
            Ok(Err(error)) => {
                first_error.get_or_insert(error);
            }
            Err(join) => {
                first_error.get_or_insert(CopyError::Task(join.to_string()));
            }
        }
    }
    first_error.map_or(Ok(()), Err)
}

/// Why one attempt failed.
enum AttemptError {
    Store(object_store::Error),
    Changed { read_bytes: u64 },
}

impl From<object_store::Error> for AttemptError {
    fn from(error: object_store::Error) -> Self {
        AttemptError::Store(error)
    }
}

/// Copies one object, retrying it whole.
async fn copy_one(shared: Arc<Shared>, job: Job) -> Result<CopiedObject, CopyError> {
    let mut backoff = Backoff::new(shared.retry);
    loop {
        let mut moved = 0u64;
        let result = attempt(&shared, &job, backoff.attempts == 1, &mut moved).await;
        if result.is_err() {
            shared.progress(|p| p.bytes_done = p.bytes_done.saturating_sub(moved));
        }
        match result {
            Ok(method) => {
                shared.progress(|p| p.objects_done += 1);
                tracing::info!(
                    source = %job.source.path,
                    destination = %job.destination,
                    bytes = job.source.size_bytes,
                    ?method,
                    "backup copy: copied {} to {}",
                    shared.source_url,
                    shared.destination_url
                );
                return Ok(CopiedObject {
                    source: job.source.path.clone(),
                    destination: job.destination.clone(),
                    size_bytes: job.source.size_bytes,
                    method,
                    attempts: backoff.attempts,
                });
            }
            Err(AttemptError::Changed { read_bytes }) => {
                return Err(CopyError::SourceChanged {
                    source_url: shared.source_url.clone(),
                    source_key: job.source.path.to_string(),
                    listed_bytes: job.source.size_bytes,
                    read_bytes,
                });
            }
            Err(AttemptError::Store(error)) => {
                let attempts = backoff.attempts;
                let shown = format!("{} at {}: {error}", job.source.path, shared.source_url);
                if !(is_retryable(&error) && backoff.wait(shared.deadline, &shown).await) {
                    return Err(CopyError::Object {
                        source_url: shared.source_url.clone(),
                        source_key: job.source.path.to_string(),
                        destination_url: shared.destination_url.clone(),
                        attempts,
                        error,
                    });
                }
            }
        }
    }
}

/// The method an object of `size` bytes is copied with.
fn method_for(shared: &Shared, size: u64) -> CopyMethod {
    if shared.same_store && size <= MAX_SERVER_SIDE_COPY_BYTES {
        CopyMethod::ServerSide
    } else if size <= PART_SIZE_BYTES as u64 {
        CopyMethod::Put
    } else {
        CopyMethod::Streamed
    }
}

/// One attempt at copying one object; `moved` counts the bytes it reported as progress.
async fn attempt(
    shared: &Shared,
    job: &Job,
    first: bool,
    moved: &mut u64,
) -> Result<CopyMethod, AttemptError> {
    let size = job.source.size_bytes;
    let destination = &job.destination_location;
    let store = &shared.destination_store;
    let mut advance = |bytes: u64| {
        *moved += bytes;
        shared.progress(|p| p.bytes_done += bytes);
    };
    if !first {
        // The previous attempt may have completed the object and only lost the answer.
        match store.head(destination).await {
            Ok(meta) if meta.size == size => {
                advance(size);
                return Ok(method_for(shared, size));
            }
            Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
            Err(error) => return Err(error.into()),
        }
    }
    if method_for(shared, size) == CopyMethod::ServerSide {
        store.copy(&job.source.location, destination).await?;
        let meta = store.head(destination).await?;
        if meta.size != size {
            return Err(AttemptError::Changed {
                read_bytes: meta.size,
            });
        }
        advance(size);
        return Ok(CopyMethod::ServerSide);
    }

    let got = shared.source_store.get(&job.source.location).await?;
    if got.meta.size != size {
        return Err(AttemptError::Changed {
            read_bytes: got.meta.size,
        });
    }
    let mut stream = got.into_stream();
    // Up to one part is buffered; an object that ends within it is written with one put.
    let mut parts = PartBuffer::default();
    let mut read = 0u64;
    while parts.len < PART_SIZE_BYTES {
        match stream.try_next().await? {
            Some(chunk) => {
                read += chunk.len() as u64;
                advance(chunk.len() as u64);
                parts.len += chunk.len();
                parts.chunks.push_back(chunk);
            }
            None => {
                if read != size {
                    return Err(AttemptError::Changed { read_bytes: read });
                }
                store
                    .put(destination, PutPayload::from_iter(parts.chunks))
                    .await?;
                return Ok(CopyMethod::Put);
            }
        }
    }

    // The multipart upload is driven here rather than through object_store's
    // `WriteMultipart`, whose `finish` reports the error of its clean-up (an abort of an
    // upload that may in fact have completed: "NoSuchUpload", a 404) instead of the
    // completion's own error, which turned a dropped connection into a fatal "not found".
    let mut upload = store.put_multipart(destination).await?;
    let mut in_flight: FuturesUnordered<UploadPart> = FuturesUnordered::new();
    let streamed: Result<u64, AttemptError> = async {
        loop {
            while let Some(part) = parts.full_part() {
                while in_flight.len() >= MAX_PARTS_IN_FLIGHT {
                    if let Some(done) = in_flight.next().await {
                        done?;
                    }
                }
                in_flight.push(upload.put_part(part));
            }
            match stream.try_next().await? {
                Some(chunk) => {
                    read += chunk.len() as u64;
                    advance(chunk.len() as u64);
                    parts.len += chunk.len();
                    parts.chunks.push_back(chunk);
                }
                None => break,
            }
        }
        if let Some(last) = parts.rest() {
            in_flight.push(upload.put_part(last));
        }
        while let Some(done) = in_flight.next().await {
            done?;
        }
        Ok(read)
    }
    .await;
    drop(in_flight);
    let failure = match streamed {
        Ok(read) if read == size => match upload.complete().await {
            // Only now does the object appear, whole.
            Ok(_) => return Ok(CopyMethod::Streamed),
            Err(error) => AttemptError::Store(error),
        },
        Ok(read) => AttemptError::Changed { read_bytes: read },
        Err(error) => error,
    };
    // Parts already uploaded are invisible; abort frees them. An abort that fails (the
    // store is away, or the completion did succeed after all) leaves at most invisible
    // parts that the store's lifecycle rules remove, so it is logged, not returned.
    if let Err(error) = upload.abort().await {
        tracing::debug!(%destination, "backup copy: aborting an upload failed: {error}");
    }
    Err(failure)
}

/// Chunks read from the source, cut into parts of exactly [`PART_SIZE_BYTES`] (some stores
/// want every part but the last of one size) without copying bytes.
#[derive(Default)]
struct PartBuffer {
    chunks: VecDeque<Bytes>,
    len: usize,
}

impl PartBuffer {
    /// The next full part, if the buffer holds one.
    fn full_part(&mut self) -> Option<PutPayload> {
        if self.len < PART_SIZE_BYTES {
            return None;
        }
        let mut part = Vec::new();
        let mut needed = PART_SIZE_BYTES;
        while needed > 0 {
            let Some(chunk) = self.chunks.front_mut() else {
                break;
            };
            if chunk.len() <= needed {
                needed -= chunk.len();
                part.extend(self.chunks.pop_front());
            } else {
                part.push(chunk.split_to(needed));
                needed = 0;
            }
        }
        self.len -= PART_SIZE_BYTES;
        Some(PutPayload::from_iter(part))
    }

    /// What is left, as the last part, if anything.
    fn rest(&mut self) -> Option<PutPayload> {
        (self.len > 0).then(|| {
            self.len = 0;
            PutPayload::from_iter(std::mem::take(&mut self.chunks))
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn listed(key: &str, size_bytes: u64) -> Listed {
        Listed {
            path: SnapshotPath::parse(key).unwrap(),
            location: Path::parse(key).unwrap(),
            size_bytes,
        }
    }

    fn destination() -> BackupLocation {
        let settings = BackupSettings {
            s3_endpoint: Some("http://127.0.0.1:9".into()),
            s3_allow_http: true,
            ..BackupSettings::default()
        };
        BackupLocation::parse("s3://dest-bucket/to", &settings).unwrap()
    }

    #[test]
    fn plan_puts_finals_first_strips_final_and_skips_what_is_there() {
        let source = Listing {
            snapshots: vec![
                listed("from/v2/Full-00000000-00001000-1700000000.gz", 10),
                listed("from/v2/Incr-00001001-00001050-1700000060.gz", 20),
                listed("from/v2/Full-00000000-00001100-1700000120.gz", 30),
                listed("from/v2/Full-00000000-00001100-1700000120.gz.final", 31),
            ],
            unparsed: Vec::new(),
        };
        let present = Listing {
            snapshots: vec![listed("to/v2/Full-00000000-00001000-1700000000.gz", 10)],
            unparsed: Vec::new(),
        };
        let mut report = CopyReport::default();
        let (finals, rest) = plan(&source, &present, &destination(), None, &mut report).unwrap();
        let keys = |jobs: &[Job]| -> Vec<String> {
            jobs.iter().map(|j| j.destination.to_string()).collect()
        };
        assert_eq!(
            keys(&finals),
            ["to/v2/Full-00000000-00001100-1700000120.gz"]
        );
        assert_eq!(finals[0].source.size_bytes, 31);
        assert_eq!(keys(&rest), ["to/v2/Incr-00001001-00001050-1700000060.gz"]);
        let skipped: Vec<(String, SkipReason)> = report
            .skipped
            .iter()
            .map(|s| (s.source.to_string(), s.reason))
            .collect();
        assert_eq!(
            skipped,
            [
                (
                    "from/v2/Full-00000000-00001100-1700000120.gz".to_string(),
                    SkipReason::SupersededByFinal
                ),
                (
                    "from/v2/Full-00000000-00001000-1700000000.gz".to_string(),
                    SkipReason::Present
                ),
            ]
        );
    }

    #[test]
    fn plan_of_the_newest_fulls_copies_their_chain_only() {
        let source = Listing {
            snapshots: vec![
                listed("from/v2/Full-00000000-00001000-1700000000", 10),
                listed("from/v2/Incr-00001001-00001050-1700000060", 20),
                listed("from/v2/Full-00000000-00001100-1700000120", 30),
                listed("from/v2/Incr-00001051-00001150-1700000130", 40),
                listed("from/v2/Incr-00001151-00001200-1700000140", 50),
                listed("from/v2/Full-00000000-00001200-1700000150", 60),
                listed("from/v2/Full-00000000-00001200-1700000150.final", 61),
            ],
            unparsed: Vec::new(),
        };
        let empty = Listing::default();
        let names = |limit| {
            let mut report = CopyReport::default();
            let (finals, rest) = plan(&source, &empty, &destination(), limit, &mut report).unwrap();
            let names: Vec<String> = finals
                .iter()
                .chain(&rest)
                .map(|j| j.destination.name().to_string())
                .collect();
            (names, report.left_out)
        };
        // One stream: the newest full snapshot (its final copy) and nothing before it.
        assert_eq!(
            names(Some(1)),
            (vec!["Full-00000000-00001200-1700000150".to_string()], 5)
        );
        // Two: the full snapshot before it too, and the deltas that reach past that one (the
        // one overlapping it included).
        assert_eq!(
            names(Some(2)),
            (
                vec![
                    "Full-00000000-00001200-1700000150".to_string(),
                    "Incr-00001151-00001200-1700000140".to_string(),
                    "Incr-00001051-00001150-1700000130".to_string(),
                    "Full-00000000-00001100-1700000120".to_string(),
                ],
                2
            )
        );
        // As many as there are, or no limit: everything.
        assert_eq!(names(Some(3)).1, 0);
        assert_eq!(names(None).0.len(), 6);
    }

    #[test]
    fn plan_refuses_a_same_name_object_of_another_size() {
        let source = Listing {
            snapshots: vec![listed("v2/Full-00000000-00001000-1700000000.gz", 10)],
            unparsed: Vec::new(),
        };
        let present = Listing {
            snapshots: vec![listed("to/v2/Full-00000000-00001000-1700000000.gz", 9)],
            unparsed: Vec::new(),
        };
        let err = plan(
            &source,
            &present,
            &destination(),
            None,
            &mut CopyReport::default(),
        )
        .err()
        .unwrap();
        assert!(matches!(err, CopyError::Conflict { .. }), "{err}");
        assert!(!err.is_retryable());
    }

    #[test]
    fn parts_are_cut_to_exact_size_without_losing_bytes() {
        let mut parts = PartBuffer::default();
        let mut expected = Vec::new();
        for i in 0..40u8 {
            let chunk = vec![i; 700_001];
            expected.extend_from_slice(&chunk);
            parts.len += chunk.len();
            parts.chunks.push_back(Bytes::from(chunk));
        }
        let mut got = Vec::new();
        while let Some(part) = parts.full_part() {
            assert_eq!(part.content_length(), PART_SIZE_BYTES);
            got.extend(part.iter().flat_map(|b| b.to_vec()));
        }
        let rest = parts.rest().unwrap();
        assert_eq!(rest.content_length(), 40 * 700_001 % PART_SIZE_BYTES);
        got.extend(rest.iter().flat_map(|b| b.to_vec()));
        assert!(got == expected);
        assert!(parts.rest().is_none());
    }

    #[tokio::test]
    async fn backoff_doubles_to_its_cap_and_respects_attempts_and_deadline() {
        let policy = RetryPolicy {
            initial_backoff_ms: 1,
            max_backoff_ms: 5,
            max_attempts: 6,
        };
        let mut backoff = Backoff::new(policy);
        let mut pauses = vec![backoff.next_ms];
        while backoff.wait(None, &"x").await {
            pauses.push(backoff.next_ms);
        }
        assert_eq!(pauses, [1, 2, 4, 5, 5, 5]);
        assert_eq!(backoff.attempts, 6);

        let mut backoff = Backoff::new(RetryPolicy {
            initial_backoff_ms: 200,
            max_backoff_ms: 60_000,
            max_attempts: 10,
        });
        let deadline = Some(Instant::now() + Duration::from_millis(300));
        assert!(backoff.wait(deadline, &"x").await);
        assert!(
            !backoff.wait(deadline, &"x").await,
            "400 ms more would pass the deadline"
        );
        assert_eq!(backoff.attempts, 2);
    }
}
