use super::*;
use std::net::{Ipv4Addr, Ipv6Addr};

const ZONE: &str = "ring.example.com";

fn name(text: &str) -> Name {
    Name::from_ascii(text).unwrap()
}

fn delete_set(owner: &str, record_type: RecordType) -> Record {
    let mut record = Record::update0(name(owner), 0, record_type);
    record.dns_class = DNSClass::ANY;
    record
}

fn deletes(owner: &str) -> Vec<Record> {
    MANAGED_TYPES
        .into_iter()
        .map(|t| delete_set(owner, t))
        .collect()
}

fn a(address: [u8; 4]) -> RecordValue {
    RecordValue::A(Ipv4Addr::from(address))
}

/// The builder's result for one change, or its error.
fn one(builder: &UpdateBuilder, change: Change) -> Result<Vec<u8>, UpdateError> {
    builder.build(7, &[change])
}

#[test]
fn builds_one_atomic_replace_per_name_and_decodes_back() {
    let builder = UpdateBuilder::new(ZONE).unwrap();
    let changes = [
        Change::new("cp-a.ring.example.com", 60, a([10, 0, 1, 20])),
        Change::new(
            "cp-b.ring.example.com",
            300,
            RecordValue::Aaaa("2001:db8::20".parse().unwrap()),
        ),
        Change::new(
            "api.ring.example.com",
            30,
            RecordValue::Cname("cp-a.ring.example.com".into()),
        ),
        Change::new("old.ring.example.com", 0, RecordValue::Delete),
    ];
    let bytes = builder.build(0xbeef, &changes).unwrap();
    let decoded = Message::from_vec(&bytes).unwrap();

    assert_eq!(decoded.metadata.id, 0xbeef);
    assert_eq!(decoded.metadata.message_type, MessageType::Query);
    assert_eq!(decoded.metadata.op_code, OpCode::Update);
    assert!(!decoded.metadata.recursion_desired);

    let mut zone = Query::query(name("ring.example.com."), RecordType::SOA);
    zone.set_query_class(DNSClass::IN);
    assert_eq!(decoded.zones(), [zone]);
    assert!(decoded.prerequisites().is_empty());
    assert!(decoded.additionals().is_empty());
    assert!(decoded.signature().is_none());

    let mut expected = deletes("cp-a.ring.example.com.");
    expected.push(Record::from_rdata(
        name("cp-a.ring.example.com."),
        60,
        RData::A(A::new(10, 0, 1, 20)),
    ));
    expected.extend(deletes("cp-b.ring.example.com."));
    expected.push(Record::from_rdata(
        name("cp-b.ring.example.com."),
        300,
        RData::AAAA(AAAA("2001:db8::20".parse().unwrap())),
    ));
    expected.extend(deletes("api.ring.example.com."));
    expected.push(Record::from_rdata(
        name("api.ring.example.com."),
        30,
        RData::CNAME(CNAME(name("cp-a.ring.example.com."))),
    ));
    expected.extend(deletes("old.ring.example.com."));
    assert_eq!(decoded.updates(), expected.as_slice());

    // The wire form holds exactly the message the builder made, nothing lost or added.
    assert_eq!(decoded, builder.message(0xbeef, &changes).unwrap());
    // Deterministic: the same input gives the same bytes.
    assert_eq!(builder.build(0xbeef, &changes).unwrap(), bytes);
}

#[test]
fn names_are_compared_without_case_and_written_in_lower_case() {
    let builder = UpdateBuilder::new("Ring.Example.COM").unwrap();
    assert_eq!(builder.zone(), ZONE);
    let message = builder
        .message(
            1,
            &[Change::new(
                "CP-A.ring.EXAMPLE.com",
                60,
                RecordValue::Cname("Target.Example.NET".into()),
            )],
        )
        .unwrap();
    let decoded = Message::from_vec(&encode(&message).unwrap()).unwrap();
    assert_eq!(decoded.zones()[0].name().to_string(), "ring.example.com.");
    let added = decoded.updates().last().unwrap();
    assert_eq!(added.name.to_string(), "cp-a.ring.example.com.");
    assert_eq!(added.data, RData::CNAME(CNAME(name("target.example.net."))));
}

#[test]
fn refuses_names_outside_the_zone() {
    let builder = UpdateBuilder::new(ZONE).unwrap();
    for outside in [
        // A suffix, not a label.
        "cp.evilring.example.com",
        "evilring.example.com",
        // The apex, a parent, a sibling, a zone that ends with ours.
        "ring.example.com",
        "RING.example.com",
        "example.com",
        "cp.other.example.com",
        "cp.ring.example.com.evil.org",
        // Not names.
        "",
        "cp..ring.example.com",
        "cp.ring.example.com.",
        "*.ring.example.com",
        "cp_a.ring.example.com",
        "cp a.ring.example.com",
        "../ring.example.com",
        "c\u{e9}.ring.example.com",
    ] {
        let err = one(&builder, Change::new(outside, 60, a([10, 0, 0, 1]))).unwrap_err();
        assert!(
            matches!(err, UpdateError::Name { index: 0, .. }),
            "{outside:?}: {err}"
        );
    }
    let long = format!("{}.{ZONE}", vec!["x".repeat(63); 4].join("."));
    let err = one(&builder, Change::new(&long, 60, RecordValue::Delete)).unwrap_err();
    assert!(matches!(err, UpdateError::Name { .. }), "{err}");
    // The error quotes at most 80 bytes of a hostile name.
    let huge = "x".repeat(100_000);
    let err = one(&builder, Change::new(&huge, 60, RecordValue::Delete)).unwrap_err();
    assert!(err.to_string().len() < 300, "{err}");
}

#[test]
fn the_apex_only_when_allowed_and_never_as_a_cname() {
    let strict = UpdateBuilder::new(ZONE).unwrap();
    let err = one(&strict, Change::new(ZONE, 60, a([10, 0, 0, 1]))).unwrap_err();
    assert!(matches!(err, UpdateError::Name { .. }), "{err}");

    let apex = UpdateBuilder::new(ZONE).unwrap().allow_apex(true);
    one(&apex, Change::new(ZONE, 60, a([10, 0, 0, 1]))).unwrap();
    one(
        &apex,
        Change::new("Ring.Example.Com", 0, RecordValue::Delete),
    )
    .unwrap();
    let err = one(
        &apex,
        Change::new(ZONE, 60, RecordValue::Cname("elsewhere.example.net".into())),
    )
    .unwrap_err();
    assert!(matches!(err, UpdateError::CnameTarget { .. }), "{err}");
    // Allowing the apex does not let anything else out of the zone.
    let err = one(&apex, Change::new("example.com", 60, a([10, 0, 0, 1]))).unwrap_err();
    assert!(matches!(err, UpdateError::Name { .. }), "{err}");
}

#[test]
fn ttls_are_bounded_except_for_deletes() {
    let builder = UpdateBuilder::new(ZONE).unwrap();
    for ttl_s in [0, MAX_TTL_S_PLUS_ONE, u32::MAX] {
        let err = one(
            &builder,
            Change::new("cp.ring.example.com", ttl_s, a([10, 0, 0, 1])),
        )
        .unwrap_err();
        assert!(
            matches!(err, UpdateError::Ttl { ttl_s: t, .. } if t == ttl_s),
            "{ttl_s}: {err}"
        );
    }
    one(
        &builder,
        Change::new("cp.ring.example.com", 1, a([10, 0, 0, 1])),
    )
    .unwrap();
    one(
        &builder,
        Change::new("cp.ring.example.com", 86_400, a([10, 0, 0, 1])),
    )
    .unwrap();
    one(
        &builder,
        Change::new("cp.ring.example.com", u32::MAX, RecordValue::Delete),
    )
    .unwrap();
}

const MAX_TTL_S_PLUS_ONE: u32 = crate::core::limits::MAX_TTL_S + 1;

#[test]
fn refuses_addresses_no_service_has() {
    let builder = UpdateBuilder::new(ZONE).unwrap();
    let values = [
        a([0, 0, 0, 0]),
        a([255, 255, 255, 255]),
        a([224, 0, 0, 1]),
        RecordValue::Aaaa(Ipv6Addr::UNSPECIFIED),
        RecordValue::Aaaa("ff02::1".parse().unwrap()),
    ];
    for value in values {
        let err = one(
            &builder,
            Change::new("cp.ring.example.com", 60, value.clone()),
        )
        .unwrap_err();
        assert!(
            matches!(err, UpdateError::Address { .. }),
            "{value:?}: {err}"
        );
    }
}

#[test]
fn refuses_bad_cname_targets() {
    let builder = UpdateBuilder::new(ZONE).unwrap();
    for target in [
        "",
        "a..b",
        "target.example.com.",
        "CP.ring.example.com",
        "cp.ring.example.com",
        "under_score.example.com",
        &"x".repeat(300),
    ] {
        let err = one(
            &builder,
            Change::new("cp.ring.example.com", 60, RecordValue::Cname(target.into())),
        )
        .unwrap_err();
        assert!(
            matches!(err, UpdateError::CnameTarget { .. }),
            "{target:?}: {err}"
        );
    }
}

#[test]
fn batches_are_bounded_and_name_each_owner_once() {
    let builder = UpdateBuilder::new(ZONE).unwrap();
    assert_eq!(builder.build(1, &[]), Err(UpdateError::Empty));

    let change = |i: usize| Change::new(format!("cp-{i}.{ZONE}"), 60, RecordValue::Delete);
    let full: Vec<_> = (0..MAX_DNS_UPDATE_CHANGES).map(change).collect();
    builder.build(1, &full).unwrap();
    let over: Vec<_> = (0..=MAX_DNS_UPDATE_CHANGES).map(change).collect();
    assert_eq!(
        builder.build(1, &over),
        Err(UpdateError::TooManyChanges {
            count: MAX_DNS_UPDATE_CHANGES + 1,
            max: MAX_DNS_UPDATE_CHANGES
        })
    );

    let twice = [
        Change::new("cp.ring.example.com", 60, a([10, 0, 0, 1])),
        Change::new("other.ring.example.com", 60, a([10, 0, 0, 2])),
        Change::new("CP.Ring.Example.Com", 0, RecordValue::Delete),
    ];
    assert_eq!(
        builder.build(1, &twice),
        Err(UpdateError::DuplicateName {
            first: 0,
            second: 2,
            name: "cp.ring.example.com".into()
        })
    );
}

#[test]
fn messages_larger_than_the_limit_are_refused() {
    let builder = UpdateBuilder::new(ZONE).unwrap();
    // Long, distinct owners and targets defeat name compression: about 560 bytes per change.
    let long_label = |i: usize, c: char| format!("{i:03}{}", c.to_string().repeat(60));
    let change = |i: usize| {
        Change::new(
            format!(
                "{}.{}.{}.{ZONE}",
                long_label(i, 'a'),
                long_label(i, 'b'),
                long_label(i, 'c')
            ),
            60,
            RecordValue::Cname(format!(
                "{}.{}.{}.example.net",
                long_label(i, 'd'),
                long_label(i, 'e'),
                long_label(i, 'f')
            )),
        )
    };
    let batch: Vec<_> = (0..MAX_DNS_UPDATE_CHANGES).map(change).collect();
    // The first batch size that no longer fits is refused; one change less is encoded.
    let first_too_large = (1..=batch.len())
        .find(|&n| builder.build(1, &batch[..n]).is_err())
        .expect("256 long changes exceed the message limit");
    match builder.build(1, &batch[..first_too_large]) {
        Err(UpdateError::TooLarge { bytes, max }) => {
            assert!(bytes > MAX_DNS_UPDATE_BYTES, "{bytes}");
            assert_eq!(max, MAX_DNS_UPDATE_BYTES);
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    let fits = builder.build(1, &batch[..first_too_large - 1]).unwrap();
    assert!(fits.len() <= MAX_DNS_UPDATE_BYTES);
    assert!(fits.len() > MAX_DNS_UPDATE_BYTES - 1_000, "{}", fits.len());
    // Far beyond 64 KiB hickory stops encoding; that is reported the same way.
    match builder.build(1, &batch) {
        Err(UpdateError::TooLarge { bytes, .. }) => assert!(bytes > MAX_DNS_UPDATE_BYTES),
        other => panic!("expected TooLarge, got {other:?}"),
    }
}

#[test]
fn the_zone_must_be_a_name() {
    for bad in [
        "",
        ".",
        "example.com.",
        "ex ample.com",
        "a..b",
        &"x".repeat(300),
    ] {
        let err = UpdateBuilder::new(bad).unwrap_err();
        assert!(matches!(err, UpdateError::Zone { .. }), "{bad:?}: {err}");
    }
}
