//! Fuzz tests: each target in `targets.rs` (pure functions of arbitrary bytes) runs on every file of its seed corpus
//! (`ring/fuzz/corpus/<target>/`), then on generated inputs for a bounded time.
//!
//! Generated inputs come from three sources: random bytes, mutations of corpus entries (bit
//! flips, hostile tokens such as `..`, `%2e`, huge numbers and bidi controls inserted or
//! replacing bytes, slices deleted, duplicated or spliced in from another entry), and
//! structure-aware generators that write mostly well-formed input with hostile parts (proposals
//! as JSON, snapshot keys, `ringd.toml` files, DNS scripts).
//!
//! The time per target is `GARDEN_RING_FUZZ_SECS` seconds (default 3, fractions allowed). Cases
//! run in batches of fresh proptest runners until the time is up. A failing case is shrunk,
//! its proptest seed is appended to `ring/fuzz/regressions/<target>.txt` (replayed first on
//! every later run), and its bytes are written to `ring/fuzz/corpus/<target>/crash-<hash>` so
//! the regression stays replayable even if the generators change. Commit both with the fix.
//! See `ring/fuzz/README.md`.

use std::cell::Cell;
use std::fmt::Write as _;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::panic::{self, AssertUnwindSafe};
use std::path::{Path, PathBuf};
use std::sync::Once;
use std::time::{Duration, Instant};

use garden_ring::core::backup_report::BackupReport;
use garden_ring::core::{Command, ControlPlaneSpec, Health, MemberSpec, MoveKind, Proposal};
mod targets;

use proptest::collection::{btree_map, vec};
use proptest::option;
use proptest::prelude::*;
use proptest::sample::{Index, select};
use proptest::test_runner::{Config, FileFailurePersistence, TestError, TestRunner};
use targets::{self as fuzz, TARGETS, Target};

/// Seconds per target when `GARDEN_RING_FUZZ_SECS` is not set.
const DEFAULT_SECS: f64 = 3.0;
/// Cases per proptest runner; the deadline is checked between batches.
const BATCH: u32 = 32;

/// One fuzz target and how to generate its inputs.
struct Fuzz {
    name: &'static str,
    target: Target,
    /// proptest's failure-persistence file (absolute, so the working directory does not matter).
    regressions: &'static str,
    /// Mostly well-formed inputs with hostile parts.
    structured: fn() -> BoxedStrategy<Vec<u8>>,
}

#[test]
fn command_validation() {
    run(&Fuzz {
        name: "command_validation",
        target: fuzz::command_validation,
        regressions: concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fuzz/regressions/command_validation.txt"
        ),
        structured: proposals,
    });
}

#[test]
fn backup_name() {
    run(&Fuzz {
        name: "backup_name",
        target: fuzz::backup_name,
        regressions: concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fuzz/regressions/backup_name.txt"
        ),
        structured: backup_keys,
    });
}

#[test]
fn config() {
    run(&Fuzz {
        name: "config",
        target: fuzz::config,
        regressions: concat!(env!("CARGO_MANIFEST_DIR"), "/fuzz/regressions/config.txt"),
        structured: config_files,
    });
}

#[test]
fn dns_update() {
    run(&Fuzz {
        name: "dns_update",
        target: fuzz::dns_update,
        regressions: concat!(
            env!("CARGO_MANIFEST_DIR"),
            "/fuzz/regressions/dns_update.txt"
        ),
        structured: dns_scripts,
    });
}

/// A target added to `targets::TARGETS` needs a test above and a corpus.
#[test]
fn every_target_has_a_test_and_a_corpus() {
    let tested = ["command_validation", "backup_name", "config", "dns_update"];
    let names: Vec<_> = TARGETS.iter().map(|(name, _)| *name).collect();
    assert_eq!(names, tested, "add a #[test] for each new target");
    for name in names {
        assert!(
            corpus(name).len() >= 5,
            "the corpus of {name} needs at least five seeds"
        );
    }
}

/// The corpus says what each seed is by its name: `valid-*` and `example-*` inputs are
/// accepted, `invalid-*`, `bad-*` and `refused-*` ones are refused, `malformed-*` ones do not
/// even decode. Checked here so the seeds keep meaning what they say as validation changes.
#[test]
fn corpus_names_say_what_the_input_is() {
    use garden_ring::config::Config;
    use garden_ring::core::backup_name::{SnapshotName, SnapshotPath};
    use garden_ring::core::names::{check_backup_prefix, check_backup_url};
    use garden_ring::dns::update::UpdateBuilder;

    let kind = |path: &Path| {
        let name = path.file_name().unwrap().to_string_lossy().to_string();
        let kind = name.split('-').next().unwrap().to_string();
        (name, kind)
    };
    let mut checked = 0;
    for (path, bytes) in corpus("command_validation") {
        let (name, kind) = kind(&path);
        let text = String::from_utf8(bytes).unwrap();
        let decoded: Result<Vec<Proposal>, _> = serde_json::from_str(&text)
            .or_else(|_| serde_json::from_str::<Proposal>(&text).map(|p| vec![p]));
        let applies = |mut state: garden_ring::core::RingState, proposals: &[Proposal]| {
            (100..)
                .zip(proposals)
                .all(|(index, p)| fuzz::apply_mirrored(&mut state, index, p).is_ok())
        };
        match (kind.as_str(), decoded) {
            ("valid", Ok(ps)) => assert!(
                applies(fuzz::fixture_ring(), &ps) || applies(Default::default(), &ps),
                "{name} is refused"
            ),
            ("invalid", Ok(ps)) => {
                assert!(ps.iter().any(|p| p.validate().is_err()), "{name} validates")
            }
            ("refused", Ok(ps)) => {
                assert!(ps.iter().all(|p| p.validate().is_ok()), "{name} is invalid");
                assert!(!applies(fuzz::fixture_ring(), &ps), "{name} applies");
            }
            ("malformed", Err(_)) | ("edge" | "regression", _) => {}
            (_, decoded) => panic!("{name}: unexpected {decoded:?}"),
        }
        checked += 1;
    }
    for (path, bytes) in corpus("backup_name") {
        let (name, kind) = kind(&path);
        let text = String::from_utf8(bytes).unwrap();
        let key = SnapshotPath::parse(&text).is_ok();
        let file = SnapshotName::parse(&text).is_ok();
        let url = check_backup_url(&text).is_ok();
        match kind.as_str() {
            "valid" if name.starts_with("valid-url") => assert!(url, "{name}"),
            "valid" if name.starts_with("valid-prefix") => {
                assert_eq!(check_backup_prefix(&text), Ok(()), "{name}")
            }
            "valid" if name.starts_with("valid-name") => assert!(file, "{name}"),
            "valid" => assert!(key, "{name} is refused"),
            "bad" | "regression" => assert!(!key && !file && !url, "{name} is accepted"),
            _ => panic!("{name}: unknown kind"),
        }
        checked += 1;
    }
    for (path, bytes) in corpus("config") {
        let (name, kind) = kind(&path);
        let parsed = Config::parse(&path, &String::from_utf8(bytes).unwrap());
        match (kind.as_str(), parsed) {
            ("valid" | "example", Ok(config)) => {
                assert!(config.validate().is_ok(), "{name}: {:?}", config.validate())
            }
            ("invalid", Ok(config)) => assert!(config.validate().is_err(), "{name} validates"),
            ("invalid" | "malformed", Err(_)) => {}
            (_, parsed) => panic!("{name}: unexpected {parsed:?}"),
        }
        checked += 1;
    }
    for (path, bytes) in corpus("dns_update") {
        let (name, kind) = kind(&path);
        let script = fuzz::DnsScript::parse(&String::from_utf8(bytes).unwrap());
        let built = UpdateBuilder::new(&script.zone)
            .map_err(|e| e.to_string())
            .and_then(|b| {
                b.allow_apex(script.allow_apex)
                    .build(script.id, &script.changes)
                    .map_err(|e| e.to_string())
            });
        match kind.as_str() {
            "valid" => assert!(built.is_ok(), "{name}: {built:?}"),
            "bad" => assert!(built.is_err(), "{name} is built"),
            _ => panic!("{name}: unknown kind"),
        }
        checked += 1;
    }
    assert!(checked > 80, "{checked} corpus files");
}

/// The bugs the config target found are fixed: each input is refused, naming the field. (The
/// last: a log filter whose field value compiled to a DFA for minutes, growing past 1.5 GB.)
#[test]
fn config_bugs_found_by_fuzzing_stay_fixed() {
    for (file, field) in [
        ("invalid-heartbeat-overflow.toml", "timing.heartbeat_ms"),
        ("invalid-listen-port-zero.toml", "advertise_"),
        ("invalid-listen-ipv6-scope.toml", "advertise_"),
        ("invalid-same-advertised-addresses.toml", "advertise_admin"),
        ("invalid-log-level-field-regex.toml", "log.level"),
    ] {
        let config =
            garden_ring::config::Config::parse(Path::new(file), &corpus_file("config", file))
                .unwrap();
        match config.validate() {
            Err(garden_ring::config::ConfigError::Invalid { field: got, .. }) => {
                assert!(got.starts_with(field), "{file}: refused for {got}")
            }
            other => panic!("{file}: {other:?}"),
        }
    }
}

fn corpus_file(target: &str, name: &str) -> String {
    let path = corpus_dir(target).join(name);
    std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display()))
}

/// The fuzz loop must be able to fail: a target that panics on some input is caught by the
/// corpus replay and by the generated cases, with the input shown.
#[test]
fn a_panicking_target_fails() {
    fn picky(data: &[u8]) {
        assert!(!data.starts_with(b"v2/"), "picky target refused {data:?}");
    }
    let replayed =
        quietly(|| panic::catch_unwind(|| replay("backup_name", picky, &corpus("backup_name"))));
    let message = panic_message(replayed.expect_err("the corpus has keys starting with v2/"));
    assert!(message.contains("valid-no-prefix"), "{message}");

    let strategy = prop_oneof![Just(b"v2/".to_vec()), vec(any::<u8>(), 0..4)].boxed();
    let mut runner = TestRunner::new(Config {
        cases: 64,
        failure_persistence: None,
        ..Config::default()
    });
    let result = quietly(|| {
        runner.run(&strategy, |input| {
            picky(&input);
            Ok(())
        })
    });
    match result {
        Err(TestError::Fail(_, input)) => assert!(input.starts_with(b"v2/"), "{input:?}"),
        other => panic!("expected a failure, got {other:?}"),
    }
}

thread_local! {
    static QUIET: Cell<bool> = const { Cell::new(false) };
}

/// Runs `f` with panic messages of this thread silenced: proptest catches the panics of every
/// failing case and every shrinking step, and each would print a backtrace.
fn quietly<R>(f: impl FnOnce() -> R) -> R {
    static HOOK: Once = Once::new();
    HOOK.call_once(|| {
        let default = panic::take_hook();
        panic::set_hook(Box::new(move |info| {
            if !QUIET.with(Cell::get) {
                default(info);
            }
        }));
    });
    struct Loud;
    impl Drop for Loud {
        fn drop(&mut self) {
            QUIET.with(|q| q.set(false));
        }
    }
    QUIET.with(|q| q.set(true));
    let _loud = Loud;
    f()
}

/// Stack of the thread a target runs on: 8 MiB, like the main thread where `ringd` parses its
/// config (a test thread has 2 MiB, which deep-but-bounded recursion in a debug build can
/// exceed where the daemon would not).
const TARGET_STACK_BYTES: usize = 8 * 1024 * 1024;

/// Where the input being run is written before each generated case, so an input that aborts
/// the process (a stack overflow cannot be caught and shrunk) can still be found.
fn in_flight_path(name: &str) -> PathBuf {
    Path::new(env!("CARGO_TARGET_TMPDIR")).join(format!("fuzz-{name}-in-flight"))
}

/// Replays the corpus, then explores for the time budget, on a thread with
/// [`TARGET_STACK_BYTES`] of stack.
fn run(fuzz: &Fuzz) {
    let fuzz = Fuzz { ..*fuzz };
    let explored = std::thread::Builder::new()
        .name(fuzz.name.to_string())
        .stack_size(TARGET_STACK_BYTES)
        .spawn(move || explore(&fuzz))
        .expect("spawn the fuzz thread")
        .join();
    if let Err(panic) = explored {
        panic::resume_unwind(panic);
    }
}

fn explore(fuzz: &Fuzz) {
    let seeds = corpus(fuzz.name);
    assert!(!seeds.is_empty(), "no corpus for {}", fuzz.name);
    replay(fuzz.name, fuzz.target, &seeds);

    let inputs: Vec<Vec<u8>> = seeds.into_iter().map(|(_, bytes)| bytes).collect();
    let strategy = prop_oneof![
        1 => vec(any::<u8>(), 0..256),
        3 => mutated(inputs.clone()),
        4 => (fuzz.structured)(),
    ]
    .boxed();
    let budget = budget();
    let started = Instant::now();
    let mut cases = 0u64;
    while started.elapsed() < budget {
        let mut runner = TestRunner::new(Config {
            cases: BATCH,
            failure_persistence: Some(Box::new(FileFailurePersistence::Direct(fuzz.regressions))),
            // Shrinking is bounded too: a failure is reported within a minute or so.
            max_shrink_time: 60_000,
            max_shrink_iters: 100_000,
            ..Config::default()
        });
        let target = fuzz.target;
        let in_flight = in_flight_path(fuzz.name);
        let result = quietly(|| {
            runner.run(&strategy, |input| {
                // Best effort: only read after a crash.
                let _ = std::fs::write(&in_flight, &input);
                target(&input);
                Ok(())
            })
        });
        match result {
            Ok(()) => cases += u64::from(BATCH),
            Err(TestError::Fail(reason, input)) => {
                let saved = save_crash(fuzz.name, &input);
                // Once more, with the panic hook on: where it panicked, and the backtrace.
                let _ = panic::catch_unwind(AssertUnwindSafe(|| target(&input)));
                panic!(
                    "fuzz target {} failed: {reason}\ninput ({} bytes): {}\nsaved as {}; its \
                     seed is in {}. Commit both with the fix.",
                    fuzz.name,
                    input.len(),
                    show(&input),
                    saved.display(),
                    fuzz.regressions,
                );
            }
            Err(TestError::Abort(why)) => panic!("fuzz target {} aborted: {why}", fuzz.name),
        }
    }
    println!(
        "fuzz {}: {} corpus inputs, {cases} generated cases in {:.1?}",
        fuzz.name,
        inputs.len(),
        started.elapsed()
    );
}

fn budget() -> Duration {
    let secs = match std::env::var("GARDEN_RING_FUZZ_SECS") {
        Ok(text) => text
            .trim()
            .parse::<f64>()
            .ok()
            .filter(|s| s.is_finite() && *s >= 0.0)
            .unwrap_or_else(|| panic!("GARDEN_RING_FUZZ_SECS={text:?} is not a number of seconds")),
        Err(_) => DEFAULT_SECS,
    };
    Duration::from_secs_f64(secs)
}

fn corpus_dir(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("fuzz/corpus")
        .join(name)
}

/// Every file of a target's corpus, sorted by name.
fn corpus(name: &str) -> Vec<(PathBuf, Vec<u8>)> {
    let dir = corpus_dir(name);
    let mut files: Vec<_> = std::fs::read_dir(&dir)
        .unwrap_or_else(|e| panic!("cannot read {}: {e}", dir.display()))
        .map(|entry| entry.expect("a directory entry").path())
        .filter(|path| path.is_file())
        .collect();
    files.sort();
    files
        .into_iter()
        .map(|path| {
            let bytes = std::fs::read(&path)
                .unwrap_or_else(|e| panic!("cannot read {}: {e}", path.display()));
            (path, bytes)
        })
        .collect()
}

/// Runs the target on every corpus file; fails naming each file that panicked.
fn replay(name: &str, target: Target, seeds: &[(PathBuf, Vec<u8>)]) {
    let mut failures = String::new();
    for (path, bytes) in seeds {
        if let Err(payload) = panic::catch_unwind(AssertUnwindSafe(|| target(bytes))) {
            let _ = writeln!(
                failures,
                "  {}: {}\n    input: {}",
                path.display(),
                panic_message(payload),
                show(bytes)
            );
        }
    }
    assert!(
        failures.is_empty(),
        "fuzz target {name} failed on corpus files:\n{failures}"
    );
}

fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    payload
        .downcast_ref::<String>()
        .cloned()
        .or_else(|| payload.downcast_ref::<&str>().map(|s| s.to_string()))
        .unwrap_or_else(|| "(no message)".into())
}

/// The input as escaped text, cut at 2 000 characters.
fn show(bytes: &[u8]) -> String {
    let text: String = String::from_utf8_lossy(bytes).escape_debug().collect();
    match text.char_indices().nth(2_000) {
        Some((end, _)) => format!("\"{}\"... (cut)", &text[..end]),
        None => format!("\"{text}\""),
    }
}

/// Writes a failing input into the target's corpus, named by its FNV-1a hash.
fn save_crash(name: &str, bytes: &[u8]) -> PathBuf {
    let hash = bytes.iter().fold(0xcbf2_9ce4_8422_2325_u64, |h, b| {
        (h ^ u64::from(*b)).wrapping_mul(0x0100_0000_01b3)
    });
    let path = corpus_dir(name).join(format!("crash-{hash:016x}"));
    if let Err(e) = std::fs::write(&path, bytes) {
        eprintln!("cannot save the failing input to {}: {e}", path.display());
    }
    path
}

// ---------------------------------------------------------------------------------------------
// Mutations of corpus entries.

/// Text that breaks parsers and validators: traversal, encodings, separators, numbers at and
/// beyond every integer width, control and bidi characters, JSON and TOML syntax.
const TOKENS: &[&str] = &[
    "..",
    "../",
    "/",
    "//",
    ".",
    "-",
    "--",
    "_",
    "%2e%2e",
    "%2F",
    "\\",
    "\\..\\",
    "v2",
    "v1",
    "Full",
    "Incr",
    "Chunk",
    ".gz",
    ".Z",
    ".zlib",
    ".final",
    "00000000",
    "0",
    "-1",
    "+1",
    "255",
    "256",
    "65535",
    "65536",
    "4294967295",
    "4294967296",
    "9223372036854775807",
    "9223372036854775808",
    "18446744073709551615",
    "18446744073709551616",
    "1e308",
    "NaN",
    "\u{0}",
    "\n",
    "\r\n",
    "\t",
    " ",
    "\u{1b}[2J",
    "\u{202e}",
    "\u{200b}",
    "\u{feff}",
    "\u{e9}",
    "\u{661}",
    "\u{ff0e}",
    "\"",
    "'",
    "{",
    "}",
    "[",
    "]",
    "[[",
    "]]",
    ",",
    ":",
    "=",
    "null",
    "true",
    "#",
    "@",
    "?",
    "*",
    "xn--",
    ".com",
    "example.com",
    "A",
    "AAAA",
    "CNAME",
    "DELETE",
    "0.0.0.0",
    "::",
    "255.255.255.255",
    "ff02::1",
    "[::1]",
    ":0",
    "zone",
    "apex yes",
];

#[derive(Debug, Clone)]
enum Mutation {
    FlipBit(Index, u8),
    Insert(Index, Vec<u8>),
    Replace(Index, Index, Vec<u8>),
    Delete(Index, Index),
    Duplicate(Index, Index),
    Splice(Index, Index, Index, Index),
}

fn token() -> BoxedStrategy<Vec<u8>> {
    prop_oneof![
        4 => select(TOKENS).prop_map(|t| t.as_bytes().to_vec()),
        2 => vec(any::<u8>(), 1..8),
        1 => (select(TOKENS), 2..300usize).prop_map(|(t, n)| t.repeat(n).into_bytes()),
    ]
    .boxed()
}

fn mutated(seeds: Vec<Vec<u8>>) -> BoxedStrategy<Vec<u8>> {
    let mutation = prop_oneof![
        (any::<Index>(), 0..8u8).prop_map(|(i, b)| Mutation::FlipBit(i, b)),
        (any::<Index>(), token()).prop_map(|(i, t)| Mutation::Insert(i, t)),
        (any::<Index>(), any::<Index>(), token()).prop_map(|(i, n, t)| Mutation::Replace(i, n, t)),
        (any::<Index>(), any::<Index>()).prop_map(|(i, n)| Mutation::Delete(i, n)),
        (any::<Index>(), any::<Index>()).prop_map(|(i, n)| Mutation::Duplicate(i, n)),
        (
            any::<Index>(),
            any::<Index>(),
            any::<Index>(),
            any::<Index>()
        )
            .prop_map(|(e, s, n, at)| Mutation::Splice(e, s, n, at)),
    ];
    let count = seeds.len();
    (any::<Index>(), vec(mutation, 1..6))
        .prop_map(move |(pick, mutations)| {
            let mut bytes = seeds[pick.index(count)].clone();
            for mutation in mutations {
                apply(&mut bytes, &mutation, &seeds);
            }
            bytes
        })
        .boxed()
}

/// A position in `0..=len`.
fn at(i: &Index, len: usize) -> usize {
    i.index(len + 1)
}

/// A short span (up to 64 bytes) starting at `start`, within `len`.
fn span(start: usize, n: &Index, len: usize) -> usize {
    n.index(64.min(len - start) + 1)
}

fn apply(bytes: &mut Vec<u8>, mutation: &Mutation, seeds: &[Vec<u8>]) {
    let len = bytes.len();
    match mutation {
        Mutation::FlipBit(i, bit) => {
            if len > 0 {
                bytes[i.index(len)] ^= 1 << bit;
            }
        }
        Mutation::Insert(i, token) => {
            let at = at(i, len);
            bytes.splice(at..at, token.iter().copied());
        }
        Mutation::Replace(i, n, token) => {
            let start = at(i, len);
            let end = start + span(start, n, len);
            bytes.splice(start..end, token.iter().copied());
        }
        Mutation::Delete(i, n) => {
            let start = at(i, len);
            let end = start + span(start, n, len);
            bytes.drain(start..end);
        }
        Mutation::Duplicate(i, n) => {
            let start = at(i, len);
            let end = start + span(start, n, len);
            let copy = bytes[start..end].to_vec();
            bytes.splice(end..end, copy);
        }
        Mutation::Splice(entry, s, n, to) => {
            let other = &seeds[entry.index(seeds.len())];
            let start = at(s, other.len());
            let end = start + span(start, n, other.len());
            let to = at(to, len);
            bytes.splice(to..to, other[start..end].iter().copied());
        }
    }
}

// ---------------------------------------------------------------------------------------------
// Structure-aware generators. Each part of an input is valid nine times in ten and hostile
// otherwise, so most inputs get past the first check and carry one or two defects deep
// inside, where parsers and validators are least exercised.

fn strings(values: &'static [&'static str]) -> BoxedStrategy<String> {
    select(values).prop_map(str::to_string).boxed()
}

/// `valid` nine times in ten, `hostile` otherwise.
fn mostly<T: std::fmt::Debug + 'static>(
    valid: impl Strategy<Value = T> + 'static,
    hostile: impl Strategy<Value = T> + 'static,
) -> BoxedStrategy<T> {
    prop_oneof![9 => valid, 1 => hostile].boxed()
}

/// Member names: the fixture's and new ones; near misses, the longest and one too long.
fn member_name() -> BoxedStrategy<String> {
    mostly(
        strings(&["a", "b", "c", "d", "e", "f", "g"]),
        prop_oneof![
            strings(&["A", "-x", "x-", "a_b", "", "\u{e9}", "a.b", "a b", "cp-a"]),
            (63usize..=64).prop_map(|n| "m".repeat(n)),
        ],
    )
}

fn node_id() -> BoxedStrategy<u64> {
    mostly(1u64..=8, prop_oneof![Just(0), any::<u64>()])
}

fn address() -> BoxedStrategy<String> {
    mostly(
        prop_oneof![
            4 => (1u8..=9, 7400u16..7403).prop_map(|(h, p)| format!("10.0.{h}.10:{p}")),
            1 => strings(&["[::1]:7400", "[2001:db8::1]:443", "ringd-e.garden.svc:7401", "LOCALHOST:80"]),
        ],
        prop_oneof![
            strings(&[
                "10.0.0.1:0",
                "10.0.0.1",
                "300.1.1.1:80",
                "::1:80",
                "[::g]:1",
                "host:65536",
                "a..b:80",
                "",
                ":80",
                "[fe80::1%eth0]:80",
                "h\u{e9}st:80",
                "10.0.0.1:+80",
            ]),
            (1usize..300).prop_map(|n| format!("{}:80", "h".repeat(n))),
        ],
    )
}

fn dns_name() -> BoxedStrategy<String> {
    mostly(
        "[a-z]{1,6}\\.ring\\.example\\.com",
        strings(&[
            "cp-a.ring.example.com",
            "CP.ring.example.com",
            "cp..example.com",
            "cp.example.com.",
            "*.ring.example.com",
            "",
            "cp_a.example.com",
            "xn--bcher-kva.example",
        ]),
    )
}

fn backup_url() -> BoxedStrategy<String> {
    mostly(
        "(s3|gs|az)://[a-z0-9-]{3,10}(/[a-z0-9-]{1,8}){0,3}/?",
        strings(&[
            "file:///var/lib/b",
            "s3://backups/../x",
            "file:///var/%2e%2e/etc",
            "s3://b/x",
            "http://x/y",
            "s3://backups/a//b",
            "s3://key:secret@backups/x",
            "s3://backups/caf\u{e9}",
            "s3://backups/a\u{202e}b",
            "s3://backups/x?y",
            "file://relative",
            "s3://Bucket/x",
            "s3://backups/./x",
            "s3://backups//",
        ]),
    )
}

fn text() -> BoxedStrategy<String> {
    mostly(
        strings(&["ringctl:ops@laptop", "ringd/a", "planned maintenance", ""]),
        prop_oneof![
            strings(&[
                "x\u{1b}[2J",
                "\u{202e}evil",
                "a\u{200b}b",
                "line\nbreak",
                "\u{0}"
            ]),
            (500usize..530).prop_map(|n| "r".repeat(n)),
        ],
    )
}

fn member_spec() -> BoxedStrategy<MemberSpec> {
    (
        node_id(),
        member_name(),
        mostly(
            strings(&["zone-a", "zone-b", "zone-e"]),
            strings(&["Zone", "", "z_1"]),
        ),
        address(),
        address(),
    )
        .prop_map(|(id, name, zone, address, admin_address)| MemberSpec {
            id,
            name,
            zone,
            address,
            admin_address,
        })
        .boxed()
}

fn control_plane_spec() -> BoxedStrategy<ControlPlaneSpec> {
    (
        mostly(
            strings(&["cp-a", "cp-b", "cp-c", "cp-d"]),
            strings(&["CP", "", "cp.a", "-cp"]),
        ),
        option::of(member_name()),
        dns_name(),
        btree_map(member_name(), address(), 1..5),
        backup_url(),
        btree_map(member_name(), backup_url(), 0..3),
        option::weighted(0.3, member_name()),
    )
        .prop_map(
            |(name, home, dns_name, endpoints, backup, backups, host)| ControlPlaneSpec {
                name,
                home,
                dns_name,
                endpoints: endpoints.into_iter().collect(),
                backup,
                backups,
                host,
                prefer: Vec::new(),
                tolerance: Default::default(),
                etcd_peers: Default::default(),
            },
        )
        .boxed()
}

fn command() -> BoxedStrategy<Command> {
    let health = select(
        &[
            Health::Unknown,
            Health::Healthy,
            Health::Suspect,
            Health::Lost,
        ][..],
    );
    prop_oneof![
        1 => (
            vec(member_spec(), 0..5),
            prop_oneof![
                Just(None),
                Just(Some("ring.example.com".to_string())),
                Just(Some("Bad Zone..".to_string())),
            ]
        )
            .prop_map(|(members, dns_zone)| Command::Bootstrap { members, dns_zone }),
        3 => member_spec().prop_map(Command::AddMember),
        2 => node_id().prop_map(|id| Command::PromoteMember { id }),
        2 => node_id().prop_map(|id| Command::RemoveMember { id }),
        2 => (node_id(), health).prop_map(|(id, health)| Command::SetHealth { id, health }),
        4 => control_plane_spec().prop_map(Command::AddControlPlane),
        1 => strings(&["cp-a", "cp-b", "nope", ""]).prop_map(|name| Command::RemoveControlPlane { name }),
        1 => any::<bool>().prop_map(|paused| Command::SetPaused { paused }),
        3 => (
            strings(&["cp-a", "nope", ""]),
            option::of(member_name()),
            0u64..5,
            select(&[MoveKind::Placement, MoveKind::Failover, MoveKind::Switchover, MoveKind::Drain, MoveKind::Forced][..]),
        )
            .prop_map(|(name, to, epoch, kind)| Command::MoveControlPlane {
                name,
                to,
                epoch,
                kind,
                note: String::new(),
            }),
        2 => (strings(&["cp-a", "nope"]), 0u64..5, member_name())
            .prop_map(|(name, epoch, member)| Command::ReleaseFence { name, epoch, member }),
        2 => (strings(&["cp-a", "nope"]), 0u64..5, member_name())
            .prop_map(|(name, epoch, member)| Command::ReportServing { name, epoch, member }),
        2 => (strings(&["cp-a", "nope"]), 0u64..5, member_name(), backup_report())
            .prop_map(|(name, epoch, member, report)| Command::ReportBackup { name, epoch, member, report }),
        2 => (
            strings(&["cp-a", "nope"]),
            0u64..5,
            member_name(),
            option::of(prop_oneof![
                strings(&["etcd exited", "", "bad\u{0}", "\u{202e}"]),
                (510usize..=514).prop_map(|n| "p".repeat(n)),
            ]),
        )
            .prop_map(|(name, epoch, member, problem)| Command::ReportProblem { name, epoch, member, problem }),
        1 => (node_id(), any::<bool>()).prop_map(|(id, cordoned)| Command::Cordon { id, cordoned }),
        1 => (
            strings(&["CN=garden-ring CA", "", "CN=\u{202e}"]),
            strings(&["1a2b", "01a2b", "0", "xyz", ""]),
            strings(&["member:b", ""]),
            strings(&["key leaked", "", " "]),
        )
            .prop_map(|(issuer, serial, subject, reason)| Command::RevokeCertificate { issuer, serial, subject, reason }),
        1 => (strings(&["CN=garden-ring CA", ""]), strings(&["1a2b", "ff"]))
            .prop_map(|(issuer, serial)| Command::UnrevokeCertificate { issuer, serial }),
        1 => (node_id(), vec((member_name(), member_name()), 0..20))
            .prop_map(|(id, labels)| Command::SetLabels { id, labels: labels.into_iter().collect() }),
    ]
    .boxed()
}

/// A host's backup report: mostly consistent (a delta time exactly when there are deltas),
/// with hostile keys, numbers past etcd's range and inconsistent delta times now and then.
fn backup_report() -> BoxedStrategy<BackupReport> {
    let full = mostly(
        option::of(strings(&[
            "shoot--dev--cp-a/etcd-main/v2/Full-00000000-00000100-1700000000.gz",
            "Full-00000000-00000100-1700000000.final",
        ])),
        prop_oneof![
            strings(&["", "Full\n", "Full\u{202e}", "\u{0}"]).prop_map(Some),
            (1023usize..=1026).prop_map(|n| Some("k".repeat(n))),
        ],
    );
    let number = mostly(0u64..=1 << 40, any::<u64>());
    (
        full,
        0u64..4,
        number.clone(),
        number,
        0u64..=60_000,
        any::<u8>(),
    )
        .prop_map(|(full, deltas, revision, at, period, skew)| BackupReport {
            // Garbage collection and defragmentation reports now and then, their texts as
            // arbitrary as the snapshot key's.
            gc: (skew % 4 == 1).then(|| garden_ring::core::backup_report::GcReport {
                policy: full.clone().unwrap_or_default(),
                last_unix_ms: at,
                kept_full: deltas,
                oldest_full: full.clone(),
                deleted: revision,
                held: full.clone().unwrap_or_default(),
            }),
            defrag: (skew % 4 == 2).then_some(garden_ring::core::backup_report::DefragReport {
                last_unix_ms: at,
                took_ms: period,
                db_before_bytes: revision,
                db_after_bytes: deltas,
                longer_than_lease: skew % 8 == 2,
            }),
            full,
            deltas_since_full: deltas,
            revision,
            newest_delta_unix_ms: ((deltas > 0) != (skew == 0)).then_some(at),
            up_to_date_unix_ms: at,
            delta_period_ms: period,
        })
        .boxed()
}

/// JSON proposals: one, or a sequence applied in order.
fn proposals() -> BoxedStrategy<Vec<u8>> {
    let proposal =
        (command(), any::<u64>(), text(), text()).prop_map(|(command, at_ms, actor, reason)| {
            Proposal {
                command,
                at_ms,
                actor,
                reason,
            }
        });
    prop_oneof![
        proposal
            .clone()
            .prop_map(|p| serde_json::to_vec(&p).expect("serializes")),
        vec(proposal, 1..12).prop_map(|ps| serde_json::to_vec(&ps).expect("serializes")),
    ]
    .boxed()
}

/// Snapshot keys assembled from good and bad parts, and backup URLs.
fn backup_keys() -> BoxedStrategy<Vec<u8>> {
    let segment = mostly(
        "[a-z0-9][a-z0-9-]{0,11}",
        strings(&[
            "..",
            ".",
            "",
            "a b",
            "caf\u{e9}",
            "%2e%2e",
            "\\",
            "x?y",
            "@",
            "\u{202e}",
            "v2",
            "v1",
        ]),
    );
    let prefix = vec(segment, 0..4).prop_map(|s| s.join("/"));
    let max = i64::MAX as u64;
    let hostile_number = prop_oneof![
        (any::<u64>(), 0usize..24).prop_map(|(n, w)| format!("{n:0w$}")),
        "[0-9]{1,30}",
        strings(&["", "-1", "+1", "9223372036854775808", "0\u{661}", "1e3"]),
    ];
    let revisions = mostly(
        (0..=max, 0..=max)
            .prop_map(|(a, b)| (a.min(b), a.max(b)))
            .prop_map(|(a, b)| (format!("{a:08}"), format!("{b:08}"))),
        (hostile_number.clone(), hostile_number.clone()),
    );
    let time = mostly(
        prop_oneof![(0u64..=4_102_444_800), (0..=max)].prop_map(|n| n.to_string()),
        hostile_number,
    );
    let key = (
        prefix.clone(),
        mostly(
            Just("v2".to_string()),
            strings(&["v1", "V2", "v2/Backup-1518427675", "", "/v2"]),
        ),
        mostly(
            strings(&["Full", "Incr"]),
            strings(&["Chunk", "full", "", "Backup"]),
        ),
        revisions,
        time,
        mostly(
            strings(&[
                "",
                ".gz",
                ".Z",
                ".zlib",
                ".final",
                ".gz.final",
                ".Z.final",
                ".zlib.final",
            ]),
            strings(&[
                ".final.gz",
                ".gz.gz",
                ".bz2",
                ".",
                ".GZ",
                "/",
                "/0000000001",
                ".final.final",
            ]),
        ),
        mostly(Just("-".to_string()), strings(&["_", "--", ""])),
    )
        .prop_map(|(prefix, layout, kind, (start, last), time, suffix, sep)| {
            let mut key = String::new();
            for part in [prefix, layout] {
                if !part.is_empty() {
                    key += &part;
                    key.push('/');
                }
            }
            key + &format!("{kind}{sep}{start}{sep}{last}{sep}{time}{suffix}")
        });
    let url = (
        mostly(
            strings(&["s3", "gs", "az", "file"]),
            strings(&["http", "", "S3"]),
        ),
        mostly(
            strings(&["backups", "my.bucket-1"]),
            strings(&["b", "Bad_Bucket", "a..b", "", "/"]),
        ),
        prefix,
        strings(&["", "", "/", "//"]),
    )
        .prop_map(|(scheme, bucket, prefix, end)| format!("{scheme}://{bucket}/{prefix}{end}"));
    prop_oneof![3 => key, 1 => url]
        .prop_map(String::into_bytes)
        .boxed()
}

/// A TOML value: an integer or a quoted string.
fn quoted(text: &str) -> String {
    serde_json::to_string(text).expect("a string serializes")
}

/// Integers that break parsing or arithmetic: negative, beyond i64, floats, strings, and the
/// values where `3 * x` or `x + y` overflow.
fn hostile_int() -> BoxedStrategy<String> {
    strings(&[
        "0",
        "-1",
        "3074457345618258602",
        "6148914691236517206",
        "9223372036854775807",
        "9223372036854775808",
        "1.5",
        "\"1\"",
        "0x10",
        "1_000",
        "inf",
    ])
}

fn socket_address(port: u16) -> BoxedStrategy<String> {
    mostly(
        prop_oneof![
            3 => Just(format!("127.0.0.1:{port}")),
            1 => Just(format!("[::1]:{port}")),
            1 => Just(format!("0.0.0.0:{port}")),
        ],
        strings(&[
            "[::]:7400",
            "127.0.0.1:0",
            "[fe80::1%2]:7400",
            "256.0.0.1:1",
            "localhost:7400",
            "",
            "127.0.0.1:7400",
        ]),
    )
}

/// `[timing]`: the defaults, the loopback values, random consistent values, or hostile ones.
fn timing() -> BoxedStrategy<Vec<String>> {
    mostly(
        prop_oneof![
            Just([250u64, 1000, 2000, 4000, 8000]),
            Just([50, 150, 300, 1000, 2000]),
            (1u64..1000, 0u64..1000, 1u64..1000, 0u64..1000, 1u64..1000).prop_map(
                |(h, a, b, c, d)| [
                    h,
                    3 * h + a,
                    3 * h + a + b,
                    3 * h + a + b + c,
                    3 * h + a + b + c + d
                ]
            ),
        ]
        .prop_map(|t| t.iter().map(u64::to_string).collect::<Vec<_>>()),
        vec(
            prop_oneof![(0u64..10_000).prop_map(|n| n.to_string()), hostile_int()],
            5,
        ),
    )
}

/// `ringd.toml` files with every field drawn from good and bad values, some left out.
fn config_files() -> BoxedStrategy<Vec<u8>> {
    let head = (
        mostly((1u64..=5).prop_map(|n| n.to_string()), hostile_int()),
        member_name(),
        mostly(
            strings(&["zone-a", "zone-b"]),
            strings(&["Zone", "", "z_1"]),
        ),
        mostly(
            strings(&["/var/lib/garden-ring", "/tmp/ring-a", "relative/dir"]),
            strings(&["", "../../etc", "/tmp/x\u{0}"]),
        ),
        socket_address(7401),
        socket_address(7400),
        option::weighted(0.3, address()),
        option::weighted(0.3, address()),
    );
    let others = vec(
        (
            mostly((6u64..=9).prop_map(|n| n.to_string()), hostile_int()),
            member_name(),
            address(),
            address(),
        ),
        0..3,
    );
    let tail = (
        option::of(timing()),
        option::of(mostly(
            (1u64..10_000, 0u64..10_000).prop_map(|(a, b)| (a.to_string(), b.to_string())),
            (hostile_int(), hostile_int()),
        )),
        option::of((
            mostly(
                strings(&[
                    "info",
                    "info,openraft=error",
                    "warn,garden_ring=debug",
                    "debug",
                ]),
                strings(&[
                    "debug,garden_ring[span{a=1}]=trace",
                    "info,garden_ring[{a=/(x+x+)+y/}]=debug",
                    "=",
                    "[",
                    "warn,,",
                    "INFO",
                    "info,garden_ring=\u{e9}",
                ]),
            ),
            mostly(strings(&["text", "json"]), strings(&["xml", "", "Text"])),
        )),
        option::weighted(0.05, Just("listen_peers = \"127.0.0.1:1\"\n")),
        any::<bool>(),
    );
    (head, others, tail)
        .prop_map(|(head, others, tail)| {
            let (id, name, zone, data_dir, peer, admin, advertise_peer, advertise_admin) = head;
            let (timing, snapshot, log, unknown, founder) = tail;
            let mut toml = format!(
                "id = {id}\nname = {}\nzone = {}\ndata_dir = {}\nlisten_peer = {}\nlisten_admin = {}\n",
                quoted(&name),
                quoted(&zone),
                quoted(&data_dir),
                quoted(&peer),
                quoted(&admin)
            );
            for (key, value) in [
                ("advertise_peer", &advertise_peer),
                ("advertise_admin", &advertise_admin),
            ] {
                if let Some(value) = value {
                    toml += &format!("{key} = {}\n", quoted(value));
                }
            }
            toml += unknown.unwrap_or("");
            // A founder lists itself (as it advertises itself) first, then the others.
            if founder {
                let me_peer = advertise_peer.unwrap_or(peer);
                let me_admin = advertise_admin.unwrap_or(admin);
                let me = (id, name, me_peer, me_admin);
                for (i, (mid, mname, address, admin_address)) in
                    std::iter::once(me).chain(others).enumerate()
                {
                    toml += &format!(
                        "\n[[initial_members]]\nid = {mid}\nname = {}\nzone = {}\naddress = {}\nadmin_address = {}\n",
                        quoted(&mname),
                        quoted(if i == 0 { &zone } else { "zone-x" }),
                        quoted(&address),
                        quoted(&admin_address)
                    );
                }
            }
            if let Some(t) = timing {
                toml += &format!(
                    "\n[timing]\nheartbeat_ms = {}\nelection_timeout_min_ms = {}\nelection_timeout_max_ms = {}\nmember_suspect_ms = {}\nmember_lost_ms = {}\n",
                    t[0], t[1], t[2], t[3], t[4]
                );
            }
            if let Some((every, keep)) = snapshot {
                toml += &format!("\n[snapshot]\nevery_entries = {every}\nkeep_entries = {keep}\n");
            }
            if let Some((level, format)) = log {
                toml += &format!(
                    "\n[log]\nlevel = {}\nformat = {}\n",
                    quoted(&level),
                    quoted(&format)
                );
            }
            toml.into_bytes()
        })
        .boxed()
}

/// DNS scripts: zones, names around the zone boundary, TTLs at and beyond the bounds,
/// addresses no service has, CNAME loops, and batches near the count and size limits.
fn dns_scripts() -> BoxedStrategy<Vec<u8>> {
    let label = mostly(
        "[a-z0-9]([a-z0-9-]{0,10}[a-z0-9])?",
        prop_oneof![
            strings(&[
                "*",
                "-a",
                "a-",
                "A",
                "\u{e9}",
                "a_b",
                "..",
                "",
                "xn--p1ai",
                "a\u{200b}"
            ]),
            (60usize..=64).prop_map(|n| "x".repeat(n)),
        ],
    );
    // A name relative to the zone, and where to put it (see `render`).
    let name = (vec(label, 1..3), mostly(0..3u8, 3..8u8));
    let ttl = mostly(
        (1u64..=86_400).prop_map(|n| n.to_string()),
        prop_oneof![
            strings(&["0", "86401", "4294967295", "4294967296", "-1", "x"]),
            any::<u64>().prop_map(|n| n.to_string()),
        ],
    );
    let value = prop_oneof![
        3 => mostly(
            any::<[u8; 4]>().prop_map(|a| format!("A {}", Ipv4Addr::from(a))),
            strings(&["A 0.0.0.0", "A 255.255.255.255", "A 224.0.0.1", "A 1.2.3", "A ::1"]),
        ),
        2 => mostly(
            any::<[u16; 8]>().prop_map(|a| format!("AAAA {}", Ipv6Addr::from(a))),
            strings(&["AAAA ::", "AAAA ff02::1", "AAAA ::ffff:10.0.0.1", "AAAA 10.0.0.1"]),
        ),
        2 => name.clone().prop_map(|n| format!("CNAME {}", render(&n, ZONE_MARKER))),
        1 => Just("DELETE".to_string()),
    ];
    let change = (name, ttl, value);
    let batch = prop_oneof![
        20 => vec(change.clone(), 1..6),
        1 => Just(Vec::new()),
        1 => vec(change, 250..262),
    ];
    let script = (
        mostly(
            strings(&[
                "ring.example.com",
                "Ring.Example.COM",
                "example.com",
                "com",
                "a",
            ]),
            strings(&[
                "ring..example.com",
                "",
                "xn--bcher-kva.example",
                "*.example.com",
                "example.com.",
            ]),
        ),
        prop::bool::weighted(0.2),
        any::<u16>(),
        batch,
    )
        .prop_map(|(zone, apex, id, changes)| {
            let mut text = format!(
                "zone {zone}\napex {}\nid {id}\n",
                if apex { "yes" } else { "no" }
            );
            for (name, ttl, value) in changes {
                let name = render(&name, &zone);
                let value = value.replace(ZONE_MARKER, &zone);
                text += &format!("{name} {ttl} {value}\n");
            }
            text
        });
    // Long, valid, distinct names and targets: large batches that only the size limit stops.
    let large = (100usize..=256, any::<u16>()).prop_map(|(n, id)| {
        let long = |i: usize, c: char| format!("{i:03}{}", c.to_string().repeat(60));
        let mut text = format!("zone ring.example.com\nid {id}\n");
        for i in 0..n {
            text += &format!(
                "{}.{}.ring.example.com 60 CNAME {}.{}.{}.example.net\n",
                long(i, 'a'),
                long(i, 'b'),
                long(i, 'c'),
                long(i, 'd'),
                long(i, 'e')
            );
        }
        text
    });
    prop_oneof![19 => script, 1 => large]
        .prop_map(String::into_bytes)
        .boxed()
}

/// Stands for the zone in a CNAME target until the zone is known.
const ZONE_MARKER: &str = "@ZONE@";

/// Places relative labels around `zone`: inside (0, 1), inside in other case (2), the apex
/// (3), in a lookalike zone (4), bare (5), with a root dot (6), below a zone that ends with
/// this one (7).
fn render((labels, mode): &(Vec<String>, u8), zone: &str) -> String {
    let relative = labels.join(".");
    match mode {
        0 | 1 => format!("{relative}.{zone}"),
        2 => format!("{relative}.{}", zone.to_ascii_uppercase()),
        3 => zone.to_string(),
        4 => format!("{relative}.evil{zone}"),
        5 => relative,
        6 => format!("{relative}.{zone}."),
        _ => format!("{relative}.{zone}.evil.org"),
    }
}

#[test]
fn mutations_stay_in_bounds() {
    // Mutations of empty and tiny inputs hit every edge of every index.
    let seeds = vec![Vec::new(), b"a".to_vec(), b"ab".to_vec()];
    let mut runner = TestRunner::new(Config {
        cases: 2_000,
        failure_persistence: None,
        ..Config::default()
    });
    runner
        .run(&mutated(seeds), |bytes| {
            prop_assert!(bytes.len() < 100_000);
            Ok(())
        })
        .unwrap();
}
