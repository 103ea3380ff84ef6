//! The zone a member serves with the `builtin` provider, and how it answers a query: pure
//! functions of the desired records and the applied index, so every member that applied the
//! same log answers the same, and tests need no sockets.
//!
//! - The apex has an SOA whose serial is the applied index (mod 2^32, RFC 1982 arithmetic
//!   makes that fine) and whose minimum (the negative-caching TTL, RFC 2308) is the record
//!   TTL, so "no such name" is not cached longer than a record would be; and an NS record per
//!   member, `<member>.members.<zone>`, the names operators delegate to.
//! - A name with a record answers it; a name whose record is withheld (the control plane is
//!   moving) does not exist (NXDOMAIN with the SOA, so resolvers ask again after the minimum).
//! - A query outside the zone is REFUSED: a member is authoritative for its zone only and
//!   never recurses.
//!
//! Whether a member may answer at all (its lease) is decided by the server, not here.

use std::collections::BTreeMap;
use std::sync::Arc;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::rdata::{A, AAAA, CNAME, NS, SOA};
use hickory_proto::rr::{LowerName, Name, RData, Record, RecordType};
use imbl::OrdMap;

use super::records::DesiredRecord;
use super::update::RecordValue;

/// SOA refresh, retry and expire, seconds. Nobody transfers this zone (every member builds it
/// from the log), so they only need to be plausible.
const SOA_REFRESH_S: i32 = 60;
const SOA_RETRY_S: i32 = 10;
const SOA_EXPIRE_S: i32 = 600;
/// Most CNAMEs followed inside the zone for one answer.
const MAX_CNAME_CHAIN: usize = 8;

/// Why a zone cannot be built.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ZoneError {
    /// A name is not a valid DNS name.
    #[error("{what} {name:?} is not a valid DNS name: {why}")]
    Name {
        /// Which name.
        what: &'static str,
        /// The name.
        name: String,
        /// The parser's complaint.
        why: String,
    },
}

/// What a member answers for one question.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Answer {
    /// The response code: NOERROR, NXDOMAIN or REFUSED.
    pub rcode: ResponseCode,
    /// The answer section.
    pub answers: Vec<Record>,
    /// The authority section (the SOA for a negative answer).
    pub authority: Vec<Record>,
    /// Whether the AA bit is set (the question is in the zone).
    pub authoritative: bool,
}

/// One immutable version of the zone.
///
/// Its records live behind an `Arc`, so a new version at another applied index with the same
/// records costs no copy, and [`Zone::with_changes`] copies them once for any number of
/// changed names instead of building every record again.
#[derive(Debug, Clone, PartialEq)]
pub struct Zone {
    origin: LowerName,
    applied_index: u64,
    ttl_s: u32,
    soa: Record,
    ns: Vec<Record>,
    data: Arc<ZoneData>,
}

/// The records of a [`Zone`], and which names exist. Persistent maps (`imbl`): a copy shares
/// every node with the original, and a change copies only the path to the changed name, so a
/// new version of a zone of 10,000 names costs kilobytes, not another zone.
#[derive(Debug, Clone, Default, PartialEq)]
struct ZoneData {
    records: OrdMap<LowerName, Vec<Record>>,
    /// The names strictly between a record's owner and the apex (empty non-terminals such as
    /// `members.<zone>`, or owners that are also ancestors), with the number of owners below
    /// each. A name exists when it owns records or is here.
    names: OrdMap<LowerName, usize>,
}

fn parse(what: &'static str, name: &str) -> Result<Name, ZoneError> {
    let text = format!("{}.", name.trim_end_matches('.').to_ascii_lowercase());
    Name::from_ascii(&text).map_err(|e| ZoneError::Name {
        what,
        name: name.to_string(),
        why: e.to_string(),
    })
}

/// The key [`Zone::with_changes`] and [`desired_by_name`] use for a record's name: lower case,
/// no trailing dot.
pub fn name_key(name: &str) -> String {
    name.trim_end_matches('.').to_ascii_lowercase()
}

/// The values `records` want, by [`name_key`], each name's in the order given ("no record"
/// entries left out, a name that only has those keeps an empty list): what
/// [`Zone::with_changes`] compares between two versions.
pub fn desired_by_name(records: &[DesiredRecord]) -> BTreeMap<String, Vec<RecordValue>> {
    let mut out: BTreeMap<String, Vec<RecordValue>> = BTreeMap::new();
    for record in records {
        let values = out.entry(name_key(&record.name)).or_default();
        if record.value != RecordValue::Delete {
            // Names have one value, almost always: room for one, not four.
            values.reserve_exact(1);
            values.push(record.value.clone());
        }
    }
    out
}

impl Zone {
    /// The zone `origin` at `applied_index` with `records` (as [`super::records::desired_records`]
    /// gives them; records outside the zone and "no record" entries are left out), one NS per
    /// name in `nameservers`, and SOA minimum `ttl_s`.
    pub fn build(
        origin: &str,
        applied_index: u64,
        records: &[DesiredRecord],
        nameservers: &[String],
        ttl_s: u32,
    ) -> Result<Self, ZoneError> {
        let apex = parse("zone", origin)?;
        let lower_apex = LowerName::new(&apex);
        let mut ns = Vec::new();
        for server in nameservers {
            let target = parse("nameserver", server)?;
            ns.push(Record::from_rdata(
                apex.clone(),
                ttl_s,
                RData::NS(NS(target)),
            ));
        }
        let mname = match ns.first().map(|r| &r.data) {
            Some(RData::NS(NS(name))) => name.clone(),
            _ => parse("nameserver", &format!("ns.{origin}"))?,
        };
        let rname = parse("hostmaster", &format!("hostmaster.{origin}"))?;
        let soa = Record::from_rdata(
            apex.clone(),
            ttl_s,
            RData::SOA(SOA::new(
                mname,
                rname,
                // RFC 1982 serial arithmetic: wrapping is what serials do.
                (applied_index % (1 << 32)) as u32,
                SOA_REFRESH_S,
                SOA_RETRY_S,
                SOA_EXPIRE_S,
                ttl_s,
            )),
        );
        let mut zone = Self {
            origin: lower_apex,
            applied_index,
            ttl_s,
            soa,
            ns,
            data: Arc::default(),
        };
        let mut data = ZoneData::default();
        for (name, values) in desired_by_name(records) {
            zone.set(&mut data, &name, &values)?;
        }
        zone.data = Arc::new(data);
        Ok(zone)
    }

    /// This zone at `applied_index`, where each name in `changes` (keyed by [`name_key`]) has
    /// exactly the values given (none: no record) and every other name keeps its records: the
    /// same zone [`Zone::build`] makes from the records that give those values. Unchanged
    /// records are shared or copied, never built again. On error nothing is returned and this
    /// zone is unchanged.
    pub fn with_changes(
        &self,
        applied_index: u64,
        changes: &BTreeMap<String, Vec<RecordValue>>,
    ) -> Result<Self, ZoneError> {
        let mut zone = self.clone();
        zone.applied_index = applied_index;
        if let RData::SOA(soa) = &self.soa.data {
            let mut soa = soa.clone();
            // RFC 1982 serial arithmetic: wrapping is what serials do.
            soa.serial = (applied_index % (1 << 32)) as u32;
            zone.soa = Record::from_rdata(self.soa.name.clone(), self.soa.ttl, RData::SOA(soa));
        }
        if !changes.is_empty() {
            let mut data = (*self.data).clone(); // shares every node until changed
            for (name, values) in changes {
                zone.set(&mut data, name, values)?;
            }
            zone.data = Arc::new(data);
        }
        Ok(zone)
    }

    /// Gives `name` exactly `values` in `data` (the apex and names outside the zone are left
    /// alone, as [`Zone::build`] leaves such records out).
    fn set(
        &self,
        data: &mut ZoneData,
        name: &str,
        values: &[RecordValue],
    ) -> Result<(), ZoneError> {
        let owner = parse("record", name)?;
        let lower = LowerName::new(&owner);
        if !self.origin.zone_of(&lower) || lower == self.origin {
            return Ok(());
        }
        // Exactly as many as there are values: a first push makes room for four records (1,120
        // bytes, a record is 280), and a zone keeps one list per name (8 MiB more at 10,000).
        let mut records = Vec::with_capacity(values.len());
        for value in values {
            let rdata = match value {
                RecordValue::A(v4) => RData::A(A(*v4)),
                RecordValue::Aaaa(v6) => RData::AAAA(AAAA(*v6)),
                RecordValue::Cname(target) => RData::CNAME(CNAME(parse("CNAME target", target)?)),
                RecordValue::Delete => continue,
            };
            records.push(Record::from_rdata(owner.clone(), self.ttl_s, rdata));
        }
        let existed = data.records.contains_key(&lower);
        // Every ancestor up to the apex exists while a record below it does (empty
        // non-terminals, RFC 8020). The owner itself exists through its records.
        let ancestors = || {
            let mut names = Vec::new();
            let mut ancestor = lower.base_name();
            while ancestor != self.origin {
                let parent = ancestor.base_name();
                names.push(ancestor);
                ancestor = parent;
            }
            names
        };
        match (existed, records.is_empty()) {
            (true, true) => {
                data.records.remove(&lower);
                for name in ancestors() {
                    if let Some(count) = data.names.get_mut(&name) {
                        *count -= 1;
                        if *count == 0 {
                            data.names.remove(&name);
                        }
                    }
                }
            }
            (false, false) => {
                data.records.insert(lower.clone(), records);
                for name in ancestors() {
                    *data.names.entry(name).or_insert(0) += 1;
                }
            }
            (true, false) => {
                data.records.insert(lower, records);
            }
            (false, true) => {}
        }
        Ok(())
    }

    /// The applied index this version was built from.
    pub fn applied_index(&self) -> u64 {
        self.applied_index
    }

    /// The zone's apex.
    pub fn origin(&self) -> &LowerName {
        &self.origin
    }

    /// Whether `name` is in this zone.
    pub fn contains(&self, name: &LowerName) -> bool {
        self.origin.zone_of(name)
    }

    /// The answer to a question for `name` and `qtype`.
    pub fn answer(&self, name: &LowerName, qtype: RecordType) -> Answer {
        if !self.contains(name) {
            return Answer {
                rcode: ResponseCode::Refused,
                answers: Vec::new(),
                authority: Vec::new(),
                authoritative: false,
            };
        }
        let mut answers = Vec::new();
        if *name == self.origin {
            match qtype {
                RecordType::SOA => answers.push(self.soa.clone()),
                RecordType::NS => answers.extend(self.ns.iter().cloned()),
                RecordType::ANY => {
                    answers.push(self.soa.clone());
                    answers.extend(self.ns.iter().cloned());
                }
                _ => {}
            }
            return self.positive_or_nodata(answers);
        }
        let mut current = name.clone();
        for _ in 0..MAX_CNAME_CHAIN {
            let Some(records) = self.data.records.get(&current) else {
                break;
            };
            let cname = records.iter().find_map(|r| match &r.data {
                RData::CNAME(CNAME(target)) => Some(target.clone()),
                _ => None,
            });
            match cname {
                Some(target) if qtype != RecordType::CNAME && qtype != RecordType::ANY => {
                    answers.extend(records.iter().cloned());
                    let target = LowerName::new(&target);
                    if !self.contains(&target) {
                        break; // the resolver follows it elsewhere
                    }
                    current = target;
                }
                _ => {
                    answers.extend(
                        records
                            .iter()
                            .filter(|r| qtype == RecordType::ANY || r.record_type() == qtype)
                            .cloned(),
                    );
                    break;
                }
            }
        }
        if answers.is_empty()
            && !self.data.records.contains_key(name)
            && !self.data.names.contains_key(name)
        {
            return Answer {
                rcode: ResponseCode::NXDomain,
                answers,
                authority: vec![self.soa.clone()],
                authoritative: true,
            };
        }
        self.positive_or_nodata(answers)
    }

    fn positive_or_nodata(&self, answers: Vec<Record>) -> Answer {
        let authority = if answers.is_empty() {
            vec![self.soa.clone()]
        } else {
            Vec::new()
        };
        Answer {
            rcode: ResponseCode::NoError,
            answers,
            authority,
            authoritative: true,
        }
    }
}

#[cfg(test)]
mod tests {
    use std::net::{Ipv4Addr, Ipv6Addr};

    use super::*;

    fn record(name: &str, value: RecordValue) -> DesiredRecord {
        DesiredRecord {
            name: name.into(),
            ttl_s: 5,
            value,
            why: String::new(),
        }
    }

    fn zone() -> Zone {
        Zone::build(
            "ring.test",
            42,
            &[
                record("api.ring.test", RecordValue::A(Ipv4Addr::new(10, 0, 0, 1))),
                record("v6.ring.test", RecordValue::Aaaa(Ipv6Addr::LOCALHOST)),
                record(
                    "alias.ring.test",
                    RecordValue::Cname("api.ring.test".into()),
                ),
                record(
                    "far.ring.test",
                    RecordValue::Cname("host.example.com".into()),
                ),
                record("gone.ring.test", RecordValue::Delete),
                record("a.members.ring.test", RecordValue::A(Ipv4Addr::LOCALHOST)),
                record("elsewhere.example.com", RecordValue::A(Ipv4Addr::LOCALHOST)),
            ],
            &["a.members.ring.test".into(), "b.members.ring.test".into()],
            5,
        )
        .unwrap()
    }

    fn name(text: &str) -> LowerName {
        LowerName::new(&Name::from_ascii(text).unwrap())
    }

    fn values(answer: &Answer) -> Vec<String> {
        answer.answers.iter().map(|r| r.data.to_string()).collect()
    }

    #[test]
    fn answers_records_case_insensitively() {
        let z = zone();
        let a = z.answer(&name("API.Ring.Test."), RecordType::A);
        assert_eq!(a.rcode, ResponseCode::NoError);
        assert!(a.authoritative);
        assert_eq!(values(&a), ["10.0.0.1"]);
        assert_eq!(
            values(&z.answer(&name("v6.ring.test."), RecordType::AAAA)),
            ["::1"]
        );
    }

    #[test]
    fn follows_cnames_inside_the_zone_only() {
        let z = zone();
        let a = z.answer(&name("alias.ring.test."), RecordType::A);
        assert_eq!(values(&a), ["api.ring.test.", "10.0.0.1"]);
        let far = z.answer(&name("far.ring.test."), RecordType::A);
        assert_eq!(values(&far), ["host.example.com."]);
        let cname = z.answer(&name("alias.ring.test."), RecordType::CNAME);
        assert_eq!(values(&cname), ["api.ring.test."]);
    }

    #[test]
    fn withheld_and_unknown_names_do_not_exist() {
        let z = zone();
        for n in ["gone.ring.test.", "nothing.ring.test."] {
            let a = z.answer(&name(n), RecordType::A);
            assert_eq!(a.rcode, ResponseCode::NXDomain, "{n}");
            assert!(a.answers.is_empty());
            assert_eq!(a.authority.len(), 1, "the SOA, for negative caching");
        }
    }

    #[test]
    fn other_types_and_empty_non_terminals_are_nodata() {
        let z = zone();
        for (n, t) in [
            ("api.ring.test.", RecordType::AAAA),
            ("members.ring.test.", RecordType::A),
            ("ring.test.", RecordType::A),
        ] {
            let a = z.answer(&name(n), t);
            assert_eq!(a.rcode, ResponseCode::NoError, "{n} {t}");
            assert!(a.answers.is_empty(), "{n} {t}");
            assert_eq!(a.authority.len(), 1, "{n} {t}");
        }
    }

    #[test]
    fn apex_has_soa_with_applied_index_and_low_minimum_and_ns() {
        let z = zone();
        let soa = z.answer(&name("ring.test."), RecordType::SOA);
        match &soa.answers[0].data {
            RData::SOA(soa) => {
                assert_eq!(soa.serial, 42);
                assert_eq!(soa.minimum, 5);
                assert_eq!(soa.mname.to_string(), "a.members.ring.test.");
            }
            other => panic!("not an SOA: {other:?}"),
        }
        let ns = z.answer(&name("ring.test."), RecordType::NS);
        assert_eq!(
            values(&ns),
            ["a.members.ring.test.", "b.members.ring.test."]
        );
        let big = Zone::build("ring.test", (1 << 32) + 7, &[], &[], 5).unwrap();
        match &big.answer(&name("ring.test."), RecordType::SOA).answers[0].data {
            RData::SOA(soa) => assert_eq!(soa.serial, 7),
            other => panic!("not an SOA: {other:?}"),
        }
    }

    #[test]
    fn outside_the_zone_is_refused() {
        let z = zone();
        for n in ["elsewhere.example.com.", "ring.test.evil.", "test."] {
            let a = z.answer(&name(n), RecordType::A);
            assert_eq!(a.rcode, ResponseCode::Refused, "{n}");
            assert!(!a.authoritative);
        }
    }

    #[test]
    fn bad_names_are_clear_errors() {
        let err = Zone::build("bad..zone", 1, &[], &[], 5).unwrap_err();
        assert!(err.to_string().contains("zone \"bad..zone\""), "{err}");
    }

    /// A zone updated with [`Zone::with_changes`] is the zone built from scratch with the
    /// new records, through many random changes (records appearing, changing, going away,
    /// CNAMEs, names under names, names outside the zone, mixed case).
    #[test]
    fn updating_equals_building_from_scratch() {
        let names = [
            "a.ring.test",
            "B.ring.test",
            "b.ring.test",
            "x.a.ring.test",
            "y.x.a.ring.test",
            "m.members.ring.test",
            "n.members.ring.test",
            "ring.test",
            "other.example.com",
        ];
        let values = [
            RecordValue::Delete,
            RecordValue::A(Ipv4Addr::new(10, 0, 0, 1)),
            RecordValue::A(Ipv4Addr::new(10, 0, 0, 2)),
            RecordValue::Aaaa(Ipv6Addr::LOCALHOST),
            RecordValue::Cname("a.ring.test".into()),
        ];
        let nameservers = ["m.members.ring.test".to_string()];
        // A small deterministic generator: no clock, no randomness source needed.
        let mut seed: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |n: usize| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            (seed % n as u64) as usize
        };
        let mut current: Vec<DesiredRecord> = Vec::new();
        let mut zone = Zone::build("ring.test", 0, &current, &nameservers, 5).unwrap();
        for index in 1..400u64 {
            let mut records: Vec<DesiredRecord> = current.clone();
            for _ in 0..=next(3) {
                let name = names[next(names.len())];
                records.retain(|r| r.name != name);
                for _ in 0..next(3) {
                    records.push(record(name, values[next(values.len())].clone()));
                }
            }
            records.sort_by(|a, b| a.name.cmp(&b.name));
            let old = desired_by_name(&current);
            let new = desired_by_name(&records);
            let mut changes: BTreeMap<String, Vec<RecordValue>> = new
                .iter()
                .filter(|(n, v)| old.get(*n) != Some(v))
                .map(|(n, v)| (n.clone(), v.clone()))
                .collect();
            for n in old.keys().filter(|n| !new.contains_key(*n)) {
                changes.insert(n.clone(), Vec::new());
            }
            zone = zone.with_changes(index, &changes).unwrap();
            let fresh = Zone::build("ring.test", index, &records, &nameservers, 5).unwrap();
            assert_eq!(zone, fresh, "after change {index}: {records:?}");
            current = records;
        }
    }
}
