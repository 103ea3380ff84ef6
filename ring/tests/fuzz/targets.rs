//! Entry points for the fuzz tests: one pure function per target, each taking arbitrary bytes.
//!
//! A target must return for every input, however hostile. It panics only when a property
//! that must always hold is broken (a crash in the code under test, or one of the `assert!`s
//! below), and that panic is what `ring/tests/fuzz/main.rs`, or any other fuzzer driving these
//! functions, reports. Nothing here does I/O, reads a clock or draws random numbers, so a
//! failing input fails the same way every time.
//!
//! | target | input | properties |
//! | --- | --- | --- |
//! | [`command_validation`] | a JSON [`Proposal`] or array of them | validation and `apply` agree; a refused command changes nothing; `apply` is deterministic; state invariants hold; whatever was stored passes validation again; state and proposals survive JSON |
//! | [`backup_name`] | a snapshot key, prefix or backup URL | parse and format round-trip exactly; whatever is accepted has no `..`, `.` or empty segment |
//! | [`config`] | `ringd.toml` text | parse and validate return; a parsed config survives `to_toml`; a valid config yields a valid member |
//! | [`dns_update`] | a small text script (see [`DnsScript`]) | the builder returns; a built message decodes to exactly the intended sections, inside the zone, within the limits |
//!
//! The seed corpus lives in `ring/fuzz/corpus/<target>/`; `ring/fuzz/README.md` says how to
//! run the targets longer and how to add inputs.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::path::Path;

use hickory_proto::op::{Message, MessageType, OpCode, UpdateMessage};
use hickory_proto::rr::{DNSClass, Name, RData, RecordType};
use serde::Deserialize;

use garden_ring::config::Config;
use garden_ring::core::backup_name::{BackupPrefix, SnapshotName, SnapshotPath};
use garden_ring::core::limits::{
    HISTORY_LIMIT, MAX_CONTROL_PLANES, MAX_DNS_UPDATE_BYTES, MAX_DNS_UPDATE_CHANGES, MAX_MEMBERS,
    MAX_SNAPSHOT_KEY_LEN, MAX_TTL_S, MIN_TTL_S,
};
use garden_ring::core::names::{check_backup_prefix, check_backup_url, check_text};
use garden_ring::core::{
    Command, CommandError, ControlPlaneSpec, MemberSpec, Proposal, RingState, Role,
};
use garden_ring::dns::update::{Change, MANAGED_TYPES, RecordValue, UpdateBuilder};

/// A fuzz target: takes any bytes, panics only when a property breaks.
pub type Target = fn(&[u8]);

/// Every target with its name, which is also its corpus directory.
pub const TARGETS: [(&str, Target); 4] = [
    ("command_validation", command_validation),
    ("backup_name", backup_name),
    ("config", config),
    ("dns_update", dns_update),
];

/// Most proposals one input may carry (a longer array is cut).
const MAX_PROPOSALS_PER_INPUT: usize = 32;

/// One proposal or a sequence of them, applied in order.
#[derive(Deserialize)]
#[serde(untagged)]
enum Proposals {
    Many(Vec<Proposal>),
    One(Proposal),
}

/// Decodes `data` as a JSON [`Proposal`] (or an array of up to 32) and applies it to an empty
/// state and to a formed ring of four members and one control plane. After every proposal:
/// `validate` and `apply` agree, a refused proposal leaves the state as it was, applying the
/// same proposal to the same state gives the same result, the invariants hold, and every
/// stored name, address, URL and text passes validation again. Member changes that succeed are
/// mirrored into the Raft roles, as the membership changer would.
pub fn command_validation(data: &[u8]) {
    let proposals = match serde_json::from_slice::<Proposals>(data) {
        Ok(Proposals::Many(many)) => many,
        Ok(Proposals::One(one)) => vec![one],
        Err(_) => return,
    };
    for mut state in [RingState::default(), fixture_ring()] {
        let mut index = state.history.iter().last().map_or(0, |e| e.index);
        for proposal in proposals.iter().take(MAX_PROPOSALS_PER_INPUT) {
            index += 1;
            let before = state.clone();
            let checked = proposal.validate();
            let result = apply_mirrored(&mut state, index, proposal);
            if let Err(invalid) = &checked {
                assert_eq!(
                    result.as_ref(),
                    Err(invalid),
                    "apply ignored a validation error"
                );
            }
            if result.is_err() {
                assert_eq!(state, before, "a refused proposal changed the state");
            }
            let mut again = before;
            let replayed = apply_mirrored(&mut again, index, proposal);
            assert_eq!(replayed, result, "apply is not deterministic");
            assert_eq!(again, state, "apply is not deterministic");
            state.check_invariants();
            check_stored_values(&state);

            let json = serde_json::to_vec(proposal).expect("a proposal always serializes");
            let back: Proposal = serde_json::from_slice(&json).expect("a proposal decodes back");
            assert_eq!(&back, proposal, "a proposal changed through JSON");
        }
        // Snapshots are the state in JSON: it must come back identical.
        let json = serde_json::to_vec(&state).expect("a state always serializes");
        let back: RingState = serde_json::from_slice(&json).expect("a state decodes back");
        assert_eq!(back, state, "the state changed through JSON");
    }
}

/// A ring formed by `a`, `b` and `c` (voters in zones a, b, c), with `d` added as a learner
/// and control plane `cp-a` (home `a`) placed, at log indexes 1 to 3.
pub fn fixture_ring() -> RingState {
    let member = |id: u64, name: &str| MemberSpec {
        id,
        name: name.into(),
        zone: format!("zone-{name}"),
        address: format!("10.0.{id}.10:7401"),
        admin_address: format!("10.0.{id}.10:7400"),
    };
    let proposal = |command| Proposal {
        command,
        at_ms: 1_700_000_000_000,
        actor: "fuzz".into(),
        reason: String::new(),
    };
    let mut state = RingState::default();
    let steps = [
        Command::Bootstrap {
            members: vec![member(1, "a"), member(2, "b"), member(3, "c")],
            dns_zone: None,
        },
        Command::AddMember(member(4, "d")),
        Command::AddControlPlane(ControlPlaneSpec {
            name: "cp-a".into(),
            home: Some("a".into()),
            dns_name: "cp-a.ring.example.com".into(),
            endpoints: (1..)
                .zip(["a", "b", "c", "d"])
                .map(|(i, m)| (m.to_string(), format!("10.1.0.{i}:443")))
                .collect(),
            backup: "s3://backups/shoot--dev--cp-a/etcd-main".into(),
            backups: Default::default(),
            host: None,
            prefer: Vec::new(),
            tolerance: Default::default(),
            etcd_peers: Default::default(),
        }),
    ];
    for (index, command) in (1..).zip(steps) {
        let command_is_add = matches!(command, Command::AddMember(_));
        state
            .apply(index, &proposal(command))
            .expect("the fixture is valid");
        if command_is_add {
            state.apply_membership(&[1, 2, 3].into(), &[4].into());
        }
    }
    state
}

/// Applies `proposal` at `index` and, when it succeeds, mirrors member changes into the Raft
/// roles as the membership changer would: a new member becomes a learner, a promoted one a
/// voter.
pub fn apply_mirrored(
    state: &mut RingState,
    index: u64,
    proposal: &Proposal,
) -> Result<(), CommandError> {
    state.apply(index, proposal)?;
    if matches!(
        proposal.command,
        Command::Bootstrap { .. } | Command::AddMember(_) | Command::PromoteMember { .. }
    ) {
        mirror_membership(state);
    }
    Ok(())
}

fn mirror_membership(state: &mut RingState) {
    let voters: BTreeSet<_> = state
        .members
        .values()
        .filter(|m| m.role == Role::Voter || m.wants_voter)
        .map(|m| m.id)
        .collect();
    let learners = state
        .members
        .keys()
        .copied()
        .filter(|id| !voters.contains(id))
        .collect();
    state.apply_membership(&voters, &learners);
}

/// Whatever reached the state must pass the checks a new proposal gets.
fn check_stored_values(state: &RingState) {
    assert!(state.members.len() <= MAX_MEMBERS, "too many members");
    assert!(
        state.control_planes.len() <= MAX_CONTROL_PLANES,
        "too many control planes"
    );
    assert!(state.history.len() <= HISTORY_LIMIT, "history unbounded");
    for member in state.members.values() {
        if let Err(e) = member.spec().validate() {
            panic!("stored member {} is invalid: {e}", member.id);
        }
    }
    for cp in state.control_planes.values() {
        let spec = ControlPlaneSpec {
            name: cp.name.clone(),
            home: cp.home.clone(),
            dns_name: cp.dns_name.clone(),
            endpoints: cp.endpoints.clone(),
            backup: cp.backup.clone(),
            backups: cp.backups.clone(),
            prefer: Vec::new(),
            tolerance: Default::default(),
            etcd_peers: Default::default(),
            host: cp.host.clone(),
        };
        if let Err(e) = spec.validate() {
            panic!("stored control plane {} is invalid: {e}", cp.name);
        }
        if let Some(Err(e)) = cp.backup_status.as_ref().map(|r| r.validate()) {
            panic!("stored backup report of {} is invalid: {e}", cp.name);
        }
    }
    for event in state.history.iter() {
        for text in [&event.actor, &event.reason] {
            assert_eq!(check_text(text), Ok(()), "stored text {text:?}");
        }
    }
}

/// Reads `data` as UTF-8 text and tries it as a whole snapshot key, as a file name alone, as a
/// prefix and as a backup URL. Whatever parses must format back to exactly the input, and
/// whatever is accepted has no `.`, `..` or empty path segment and is printable ASCII.
pub fn backup_name(data: &[u8]) {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Ok(path) = SnapshotPath::parse(text) {
        let formatted = path.to_string();
        assert_eq!(formatted, text, "parse accepted a key it does not write");
        assert_eq!(SnapshotPath::parse(&formatted).as_ref(), Ok(&path));
        assert!(formatted.len() <= MAX_SNAPSHOT_KEY_LEN);
        assert_safe_path(&formatted);
        let name = path.name();
        assert!(name.start_revision() <= name.last_revision());
        let rebuilt = SnapshotName::new(
            name.kind(),
            name.start_revision(),
            name.last_revision(),
            name.created_unix_s(),
        )
        .expect("a parsed name can be built")
        .with_compression(name.compression())
        .with_final(name.is_final());
        let prefix = BackupPrefix::new(path.prefix().as_str()).expect("a parsed prefix is valid");
        assert_eq!(SnapshotPath::new(prefix, rebuilt).as_ref(), Ok(&path));
    }
    if let Ok(name) = SnapshotName::parse(text) {
        assert_eq!(
            name.to_string(),
            text,
            "parse accepted a name it does not write"
        );
    }
    if check_backup_prefix(text).is_ok() && !text.is_empty() {
        assert_safe_path(text);
    }
    if check_backup_url(text).is_ok() {
        let (_, rest) = text
            .split_once("://")
            .expect("an accepted URL has a scheme");
        assert!(text.is_ascii() && !text.contains('%'), "{text:?}");
        for segment in rest.trim_end_matches('/').split('/').skip(1) {
            assert!(!matches!(segment, "" | "." | ".."), "{text:?} accepted");
        }
    }
}

fn assert_safe_path(path: &str) {
    assert!(
        path.bytes().all(|b| b.is_ascii_graphic()),
        "{path:?} accepted"
    );
    for segment in path.split('/') {
        assert!(
            !matches!(segment, "" | "." | ".."),
            "{path:?} accepted with segment {segment:?}"
        );
    }
}

/// Parses `data` (lossily decoded as UTF-8) as `ringd.toml` and validates it. Both must
/// return. A parsed config must survive `to_toml` unchanged, and a config that validates must
/// describe a member the ring would accept.
pub fn config(data: &[u8]) {
    let text = String::from_utf8_lossy(data);
    let path = Path::new("fuzz.toml");
    let Ok(config) = Config::parse(path, &text) else {
        return;
    };
    let again = Config::parse(path, &config.to_toml()).expect("to_toml output parses");
    assert_eq!(again, config, "the config changed through to_toml");
    if config.validate().is_ok() {
        let spec = config.member_spec();
        if let Err(e) = spec.validate() {
            panic!("a valid config describes an invalid member {spec:?}: {e}");
        }
    }
}

/// A DNS UPDATE request in the line-based text form the `dns_update` target reads:
///
/// ```text
/// zone ring.example.com
/// apex yes
/// id 4660
/// cp-a.ring.example.com 60 A 10.0.1.20
/// cp-b.ring.example.com 60 AAAA 2001:db8::20
/// api.ring.example.com 30 CNAME cp-a.ring.example.com
/// old.ring.example.com 0 DELETE
/// ```
///
/// Fields are separated by whitespace. Lines that do not fit a form are skipped, as is a
/// change whose address does not parse; a TTL beyond `u32` becomes `u32::MAX`. At most
/// [`MAX_DNS_UPDATE_CHANGES`] + 8 changes are read, enough to cross the batch limit.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DnsScript {
    /// The zone apex (`zone` line; `example.com` when missing).
    pub zone: String,
    /// Whether the apex may be changed (`apex yes`).
    pub allow_apex: bool,
    /// The message id (`id` line; 0 when missing).
    pub id: u16,
    /// The changes, in order.
    pub changes: Vec<Change>,
}

impl DnsScript {
    /// Reads the text form, leniently (see the type's docs).
    pub fn parse(text: &str) -> Self {
        let mut script = DnsScript {
            zone: "example.com".into(),
            allow_apex: false,
            id: 0,
            changes: Vec::new(),
        };
        for line in text.lines() {
            let fields: Vec<&str> = line.split_whitespace().take(5).collect();
            match fields.as_slice() {
                ["zone", zone] => script.zone = (*zone).to_string(),
                ["apex", yes] => script.allow_apex = *yes == "yes",
                ["id", id] => script.id = id.parse().unwrap_or(0),
                [name, ttl, kind, rest @ ..] => {
                    if script.changes.len() >= MAX_DNS_UPDATE_CHANGES + 8 {
                        continue;
                    }
                    let Ok(ttl) = ttl.parse::<u64>() else {
                        continue;
                    };
                    let ttl_s = u32::try_from(ttl).unwrap_or(u32::MAX);
                    let value = match (*kind, rest) {
                        ("A", [address]) => match address.parse::<Ipv4Addr>() {
                            Ok(a) => RecordValue::A(a),
                            Err(_) => continue,
                        },
                        ("AAAA", [address]) => match address.parse::<Ipv6Addr>() {
                            Ok(a) => RecordValue::Aaaa(a),
                            Err(_) => continue,
                        },
                        ("CNAME", [target]) => RecordValue::Cname((*target).to_string()),
                        ("DELETE", []) => RecordValue::Delete,
                        _ => continue,
                    };
                    script.changes.push(Change::new(*name, ttl_s, value));
                }
                _ => {}
            }
        }
        script
    }
}

/// The builtin server's zone built from the script's changes answers every question like an
/// authority: REFUSED exactly outside the zone, NXDOMAIN only with no answer and the SOA, and
/// an address the zone holds for a name is in the answer for that name.
fn zone_answers(script: &DnsScript) {
    use garden_ring::dns::records::DesiredRecord;
    use garden_ring::dns::zone::Zone;
    use hickory_proto::op::ResponseCode;
    use hickory_proto::rr::LowerName;

    let records: Vec<DesiredRecord> = script
        .changes
        .iter()
        .map(|c| DesiredRecord {
            name: c.name.clone(),
            ttl_s: c.ttl_s,
            value: c.value.clone(),
            why: String::new(),
        })
        .collect();
    let Ok(zone) = Zone::build(&script.zone, u64::from(script.id), &records, &[], 5) else {
        return;
    };
    let mut names: Vec<String> = script.changes.iter().map(|c| c.name.clone()).collect();
    names.push(script.zone.clone());
    names.push(format!("nothing.{}", script.zone));
    names.push("outside.invalid".into());
    for name in names {
        let Ok(parsed) = Name::from_ascii(format!("{}.", name.trim_end_matches('.'))) else {
            continue;
        };
        let lower = LowerName::new(&parsed);
        for record_type in [
            RecordType::A,
            RecordType::AAAA,
            RecordType::CNAME,
            RecordType::SOA,
            RecordType::NS,
            RecordType::ANY,
        ] {
            let answer = zone.answer(&lower, record_type);
            assert_eq!(
                answer.rcode == ResponseCode::Refused,
                !zone.contains(&lower),
                "{name} {record_type}: {answer:?}"
            );
            assert_eq!(answer.authoritative, zone.contains(&lower));
            if answer.rcode == ResponseCode::NXDomain {
                assert!(answer.answers.is_empty() && answer.authority.len() == 1);
            }
        }
    }
    for change in &script.changes {
        let RecordValue::A(address) = change.value else {
            continue;
        };
        let alone = script
            .changes
            .iter()
            .filter(|c| c.name.eq_ignore_ascii_case(&change.name))
            .count()
            == 1;
        let Ok(parsed) = Name::from_ascii(format!("{}.", change.name.trim_end_matches('.'))) else {
            continue;
        };
        let lower = LowerName::new(&parsed);
        if !alone || !zone.contains(&lower) || lower == *zone.origin() {
            continue;
        }
        let answer = zone.answer(&lower, RecordType::A);
        assert!(
            answer
                .answers
                .iter()
                .any(|r| r.data == RData::A(hickory_proto::rr::rdata::A(address))),
            "{} A {address}: {answer:?}",
            change.name
        );
    }
}

/// Reads `data` as a [`DnsScript`] and builds its update. The builder must return; if it
/// built a message, the bytes fit the limit and decode to an UPDATE for the zone whose update
/// section is exactly: per change, the three deletes then the new record, every name inside
/// the zone (the apex only when allowed), every TTL in bounds. A refused batch is refused the
/// same way by every entry point.
pub fn dns_update(data: &[u8]) {
    let script = DnsScript::parse(&String::from_utf8_lossy(data));
    zone_answers(&script);
    let Ok(builder) = UpdateBuilder::new(&script.zone) else {
        return;
    };
    let builder = builder.allow_apex(script.allow_apex);
    let built = builder.build(script.id, &script.changes);
    let message = builder.message(script.id, &script.changes);
    let bytes = match (&built, &message) {
        (Err(e), Err(same)) => {
            assert_eq!(e, same, "build and message disagree");
            assert_eq!(builder.validate(&script.changes).as_ref(), Err(e));
            return;
        }
        (Err(e), Ok(_)) => {
            assert!(
                matches!(e, garden_ring::dns::update::UpdateError::TooLarge { .. }),
                "only the size may refuse a message that was built: {e}"
            );
            return;
        }
        (Ok(_), Err(e)) => panic!("build succeeded but message failed: {e}"),
        (Ok(bytes), Ok(_)) => bytes,
    };
    assert!(bytes.len() <= MAX_DNS_UPDATE_BYTES, "{} bytes", bytes.len());
    let decoded = Message::from_vec(bytes).expect("a built update decodes");
    assert_eq!(Ok(&decoded), message.as_ref(), "the wire form differs");
    assert_eq!(decoded.metadata.id, script.id);
    assert_eq!(decoded.metadata.message_type, MessageType::Query);
    assert_eq!(decoded.metadata.op_code, OpCode::Update);

    let zone = Name::from_ascii(format!("{}.", builder.zone())).expect("the zone is a name");
    let [query] = decoded.zones() else {
        panic!("{} zones", decoded.zones().len());
    };
    assert_eq!(query.name(), &zone);
    assert_eq!(query.query_type(), RecordType::SOA);
    assert_eq!(query.query_class(), DNSClass::IN);
    assert!(decoded.prerequisites().is_empty() && decoded.additionals().is_empty());

    let adds = script
        .changes
        .iter()
        .filter(|c| c.value != RecordValue::Delete)
        .count();
    let updates = decoded.updates();
    assert_eq!(
        updates.len(),
        MANAGED_TYPES.len() * script.changes.len() + adds
    );
    let mut rest = updates;
    for change in &script.changes {
        let owner =
            Name::from_ascii(format!("{}.", change.name.to_ascii_lowercase())).expect("a name");
        assert!(zone.zone_of(&owner), "{owner} outside {zone}");
        assert!(script.allow_apex || owner != zone, "{owner} is the apex");
        for record_type in MANAGED_TYPES {
            let (delete, tail) = rest.split_first().expect("a delete per managed type");
            assert_eq!(delete.name, owner);
            assert_eq!(delete.dns_class, DNSClass::ANY);
            assert_eq!(delete.ttl, 0);
            assert_eq!(delete.data, RData::Update0(record_type));
            rest = tail;
        }
        if change.value == RecordValue::Delete {
            continue;
        }
        let (add, tail) = rest.split_first().expect("the new record");
        assert_eq!(add.name, owner);
        assert_eq!(add.dns_class, DNSClass::IN);
        assert!(
            (MIN_TTL_S..=MAX_TTL_S).contains(&add.ttl),
            "TTL {}",
            add.ttl
        );
        match (&change.value, &add.data) {
            (RecordValue::A(a), RData::A(got)) => assert_eq!(got.0, *a),
            (RecordValue::Aaaa(a), RData::AAAA(got)) => assert_eq!(got.0, *a),
            (RecordValue::Cname(target), RData::CNAME(got)) => {
                // Compared as names: Display would show punycode labels decoded.
                let want = Name::from_ascii(format!("{}.", target.to_ascii_lowercase()))
                    .expect("a checked target is a name");
                assert!(
                    got.0.eq_case(&want),
                    "{} written as {}",
                    want.to_ascii(),
                    got.0.to_ascii()
                );
            }
            (want, got) => panic!("{want:?} written as {got:?}"),
        }
        rest = tail;
    }
    assert!(rest.is_empty(), "{} records too many", rest.len());
}
