use super::*;
use crate::core::limits::HISTORY_LIMIT;

fn spec(id: NodeId, name: &str, zone: &str) -> MemberSpec {
    MemberSpec {
        id,
        name: name.into(),
        zone: zone.into(),
        address: format!("127.0.0.1:{}", 7000 + id * 10 + 1),
        admin_address: format!("127.0.0.1:{}", 7000 + id * 10),
    }
}

fn proposal(command: Command) -> Proposal {
    Proposal {
        command,
        at_ms: 1_700_000_000_000,
        actor: "test".into(),
        reason: "because".into(),
    }
}

fn ring3() -> RingState {
    let mut state = RingState::default();
    let members = vec![
        spec(1, "a", "zone-a"),
        spec(2, "b", "zone-b"),
        spec(3, "c", "zone-c"),
    ];
    state
        .apply(
            1,
            &proposal(Command::Bootstrap {
                members,
                dns_zone: None,
            }),
        )
        .unwrap();
    state
}

fn cp(name: &str, home: Option<&str>) -> ControlPlaneSpec {
    ControlPlaneSpec {
        name: name.into(),
        home: home.map(str::to_string),
        dns_name: format!("{name}.ring.example"),
        endpoints: ["a", "b", "c"]
            .iter()
            .enumerate()
            .map(|(i, m)| (m.to_string(), format!("10.0.0.{}:443", i + 1)))
            .collect(),
        backup: format!("s3://backups/{name}"),
        backups: Default::default(),
        host: None,
        prefer: Vec::new(),
    }
}

/// Applies a command that must be refused and checks nothing changed.
fn refused(state: &mut RingState, index: u64, command: Command) -> CommandError {
    let before = state.clone();
    let err = state.apply(index, &proposal(command)).unwrap_err();
    assert_eq!(*state, before, "a refused command changed the state");
    err
}

#[test]
fn bootstrap_registers_voters_once() {
    let mut state = ring3();
    assert!(state.bootstrapped);
    assert_eq!(state.members.len(), 3);
    assert!(state.members.values().all(|m| m.role == Role::Voter));
    assert_eq!(state.history.len(), 1);

    // The same bootstrap again (a second member also saw an empty registry) is a no-op.
    let again = vec![
        spec(1, "a", "zone-a"),
        spec(2, "b", "zone-b"),
        spec(3, "c", "zone-c"),
    ];
    state
        .apply(
            2,
            &proposal(Command::Bootstrap {
                members: again,
                dns_zone: None,
            }),
        )
        .unwrap();
    assert_eq!(state.history.len(), 1);

    let other = vec![spec(1, "x", "zone-a")];
    let err = refused(
        &mut state,
        3,
        Command::Bootstrap {
            members: other,
            dns_zone: None,
        },
    );
    assert!(matches!(err, CommandError::Refused(_)), "{err}");
}

#[test]
fn bootstrap_rejects_duplicates() {
    let mut state = RingState::default();
    let err = refused(
        &mut state,
        1,
        Command::Bootstrap {
            members: vec![spec(1, "a", "z"), spec(1, "b", "z")],
            dns_zone: None,
        },
    );
    assert_eq!(err, CommandError::DuplicateMemberId(1));
    let err = refused(
        &mut state,
        1,
        Command::Bootstrap {
            members: vec![spec(1, "a", "z"), spec(2, "a", "z")],
            dns_zone: None,
        },
    );
    assert!(
        matches!(err, CommandError::DuplicateMemberName { .. }),
        "{err}"
    );
}

#[test]
fn member_add_promote_remove() {
    let mut state = ring3();
    state
        .apply(2, &proposal(Command::AddMember(spec(4, "d", "zone-d"))))
        .unwrap();
    assert_eq!(state.members[&4].role, Role::Joining);

    let err = refused(&mut state, 3, Command::PromoteMember { id: 4 });
    assert!(matches!(err, CommandError::Refused(_)), "{err}");

    state.apply_membership(&[1, 2, 3].into(), &[4].into());
    assert_eq!(state.members[&4].role, Role::Learner);
    state
        .apply(4, &proposal(Command::PromoteMember { id: 4 }))
        .unwrap();
    assert!(state.members[&4].wants_voter);
    state.apply_membership(&[1, 2, 3, 4].into(), &BTreeSet::new());
    assert_eq!(state.members[&4].role, Role::Voter);

    state
        .apply(5, &proposal(Command::RemoveMember { id: 4 }))
        .unwrap();
    assert!(!state.members.contains_key(&4));
    assert!(state.retired_ids.contains(&4));
    let last = state.history.iter().last().unwrap();
    assert_eq!(last.action, "member.remove");
    assert_eq!(last.subject, "d(4)");

    // An id is never reused, not even with another name.
    let err = refused(&mut state, 6, Command::AddMember(spec(4, "e", "zone-e")));
    assert_eq!(err, CommandError::RetiredMemberId(4));
}

#[test]
fn member_add_rejects_conflicts() {
    let mut state = ring3();
    let err = refused(&mut state, 2, Command::AddMember(spec(2, "d", "zone-d")));
    assert_eq!(err, CommandError::DuplicateMemberId(2));
    let err = refused(&mut state, 2, Command::AddMember(spec(4, "b", "zone-d")));
    assert!(
        matches!(err, CommandError::DuplicateMemberName { id: 2, .. }),
        "{err}"
    );
    let mut same_addr = spec(4, "d", "zone-d");
    same_addr.address = state.members[&1].address.clone();
    let err = refused(&mut state, 2, Command::AddMember(same_addr));
    assert!(matches!(err, CommandError::Refused(_)), "{err}");
    let err = refused(&mut state, 2, Command::RemoveMember { id: 9 });
    assert_eq!(err, CommandError::UnknownMember("9".into()));
}

#[test]
fn invalid_input_is_refused_with_the_field_named() {
    let mut state = ring3();
    let cases = [
        (
            Command::AddMember(spec(4, "Bad_Name", "zone-d")),
            "member name",
        ),
        (Command::AddMember(spec(4, "d", "zone d")), "zone"),
        (Command::AddMember(spec(0, "d", "zone-d")), "member id"),
        (
            Command::AddMember(MemberSpec {
                address: "127.0.0.1".into(),
                ..spec(4, "d", "zone-d")
            }),
            "member address",
        ),
        (
            Command::AddControlPlane(ControlPlaneSpec {
                backup: "s3://bucket/../x".into(),
                backups: Default::default(),
                ..cp("x", None)
            }),
            "backup location",
        ),
        (
            Command::AddControlPlane(ControlPlaneSpec {
                dns_name: "x..example".into(),
                ..cp("x", None)
            }),
            "DNS name",
        ),
        (
            Command::AddControlPlane(cp("X", None)),
            "control plane name",
        ),
    ];
    for (command, field) in cases {
        match refused(&mut state, 2, command) {
            CommandError::Invalid { field: got, .. } => assert_eq!(got, field),
            other => panic!("expected invalid {field}, got {other}"),
        }
    }
    let mut long_reason = proposal(Command::SetPaused { paused: true });
    long_reason.reason = "x".repeat(10_000);
    let before = state.clone();
    assert!(state.apply(2, &long_reason).is_err());
    assert_eq!(state, before);
}

#[test]
fn control_planes_are_placed_away_from_home_and_spread() {
    let mut state = ring3();
    state
        .apply(
            2,
            &proposal(Command::AddControlPlane(cp("cp-a", Some("a")))),
        )
        .unwrap();
    let placed = &state.control_planes["cp-a"];
    assert_eq!(
        placed.host.as_deref(),
        Some("b"),
        "least loaded, lowest id, not home"
    );
    assert_eq!((placed.epoch, placed.phase), (1, Phase::Starting));

    state
        .apply(
            3,
            &proposal(Command::AddControlPlane(cp("cp-b", Some("b")))),
        )
        .unwrap();
    assert_eq!(state.control_planes["cp-b"].host.as_deref(), Some("a"));
    state
        .apply(4, &proposal(Command::AddControlPlane(cp("cp-x", None))))
        .unwrap();
    assert_eq!(state.control_planes["cp-x"].host.as_deref(), Some("c"));

    // Explicit host at home is refused; unknown members too.
    let err = refused(
        &mut state,
        5,
        Command::AddControlPlane(ControlPlaneSpec {
            host: Some("a".into()),
            ..cp("cp-y", Some("a"))
        }),
    );
    assert!(matches!(err, CommandError::Invalid { .. }), "{err}");
    let mut endpoints = cp("cp-z", None);
    endpoints
        .endpoints
        .insert("nope".into(), "10.0.0.9:443".into());
    let err = refused(&mut state, 5, Command::AddControlPlane(endpoints));
    assert_eq!(err, CommandError::UnknownMember("nope".into()));

    // Duplicates by name and by DNS name.
    let err = refused(&mut state, 5, Command::AddControlPlane(cp("cp-a", None)));
    assert_eq!(err, CommandError::DuplicateControlPlane("cp-a".into()));
    let dup_dns = ControlPlaneSpec {
        dns_name: "cp-a.ring.example".into(),
        ..cp("cp-q", None)
    };
    let err = refused(&mut state, 5, Command::AddControlPlane(dup_dns));
    assert!(
        matches!(err, CommandError::DuplicateDnsName { .. }),
        "{err}"
    );

    // A host cannot be removed while it hosts something.
    let err = refused(&mut state, 5, Command::RemoveMember { id: 2 });
    assert!(err.to_string().contains("cp-a"), "{err}");
    state
        .apply(
            5,
            &proposal(Command::RemoveControlPlane {
                name: "cp-a".into(),
            }),
        )
        .unwrap();
    state
        .apply(6, &proposal(Command::RemoveMember { id: 2 }))
        .unwrap();
}

#[test]
fn no_eligible_member_leaves_the_control_plane_pending() {
    let mut state = ring3();
    let mut only_home = cp("cp-a", Some("a"));
    only_home.endpoints.retain(|m, _| m == "a");
    state
        .apply(2, &proposal(Command::AddControlPlane(only_home)))
        .unwrap();
    let cp = &state.control_planes["cp-a"];
    assert_eq!(
        (cp.host.as_deref(), cp.epoch, cp.phase),
        (None, 0, Phase::Unplaced)
    );
}

#[test]
fn last_voter_cannot_be_removed() {
    let mut state = RingState::default();
    state
        .apply(
            1,
            &proposal(Command::Bootstrap {
                members: vec![spec(1, "a", "zone-a")],
                dns_zone: None,
            }),
        )
        .unwrap();
    let err = refused(&mut state, 2, Command::RemoveMember { id: 1 });
    assert!(err.to_string().contains("last voter"), "{err}");
}

#[test]
fn health_changes_are_recorded_once() {
    let mut state = ring3();
    let set = |health| Command::SetHealth { id: 2, health };
    state.apply(2, &proposal(set(Health::Healthy))).unwrap();
    state.apply(3, &proposal(set(Health::Healthy))).unwrap();
    state.apply(4, &proposal(set(Health::Lost))).unwrap();
    let details: Vec<_> = state
        .history
        .iter()
        .filter(|e| e.action == "member.health")
        .map(|e| e.detail.clone())
        .collect();
    assert_eq!(details, ["unknown -> healthy", "healthy -> lost"]);
    assert!(
        state.members[&2].contacted,
        "once healthy, always known to have been in contact"
    );
    state
        .apply(
            5,
            &proposal(Command::SetHealth {
                id: 3,
                health: Health::Lost,
            }),
        )
        .unwrap();
    assert!(
        !state.members[&3].contacted,
        "lost without ever answering is not contact"
    );
}

#[test]
fn apply_is_deterministic_and_history_bounded() {
    let commands: Vec<Command> = (0..(HISTORY_LIMIT + 50))
        .map(|i| match i % 3 {
            0 => Command::SetPaused { paused: i % 2 == 0 },
            1 => Command::AddControlPlane(cp(&format!("cp-{i}"), Some("a"))),
            _ => Command::RemoveControlPlane {
                name: format!("cp-{}", i - 1),
            },
        })
        .collect();
    let run = || {
        let mut state = ring3();
        for (i, c) in commands.iter().enumerate() {
            state.apply(i as u64 + 2, &proposal(c.clone())).unwrap();
        }
        state
    };
    let (one, two) = (run(), run());
    assert_eq!(one, two);
    assert_eq!(one.history.len(), HISTORY_LIMIT);
    let json = serde_json::to_string(&one).unwrap();
    let back: RingState = serde_json::from_str(&json).unwrap();
    assert_eq!(back, one, "state survives a snapshot round trip");
}

#[test]
fn placement_skips_joining_suspect_and_lost_members() {
    let mut state = ring3();
    state
        .apply(2, &proposal(Command::AddMember(spec(4, "d", "zone-d"))))
        .unwrap();
    state
        .apply(
            3,
            &proposal(Command::SetHealth {
                id: 2,
                health: Health::Suspect,
            }),
        )
        .unwrap();
    state
        .apply(
            4,
            &proposal(Command::SetHealth {
                id: 3,
                health: Health::Lost,
            }),
        )
        .unwrap();
    let mut spec = cp("cp-x", None);
    spec.endpoints.insert("d".into(), "10.0.0.4:443".into());
    state
        .apply(5, &proposal(Command::AddControlPlane(spec)))
        .unwrap();
    assert_eq!(
        state.control_planes["cp-x"].host.as_deref(),
        Some("a"),
        "d is still joining, b suspect, c lost"
    );
}

/// Found by the command_validation fuzz target: AddMember was accepted before Bootstrap, and a
/// Bootstrap naming the same member name then registered it twice (an invariant panic).
#[test]
fn members_are_added_only_after_the_founders() {
    let mut state = RingState::default();
    let err = refused(&mut state, 1, Command::AddMember(spec(1, "e", "zone-e")));
    assert!(matches!(err, CommandError::Refused(_)), "{err}");
    assert!(state.members.is_empty());

    state
        .apply(
            2,
            &proposal(Command::Bootstrap {
                members: vec![spec(2, "e", "zone-e")],
                dns_zone: None,
            }),
        )
        .unwrap();
    state
        .apply(3, &proposal(Command::AddMember(spec(1, "f", "zone-f"))))
        .unwrap();
    assert_eq!(state.members.len(), 2);
}

#[test]
#[should_panic(expected = "registered before the ring was bootstrapped")]
fn invariants_refuse_members_without_bootstrap() {
    let mut state = ring3();
    state.bootstrapped = false;
    state.check_invariants();
}

#[test]
fn control_plane_names_must_lie_inside_the_rings_dns_zone() {
    let mut state = RingState::default();
    let members = vec![
        spec(1, "a", "zone-a"),
        spec(2, "b", "zone-b"),
        spec(3, "c", "zone-c"),
    ];
    let zone = Some("ring.example".to_string());
    state
        .apply(
            1,
            &proposal(Command::Bootstrap {
                members: members.clone(),
                dns_zone: zone.clone(),
            }),
        )
        .unwrap();
    assert_eq!(state.settings.dns_zone, zone);
    for outside in [
        "cp.evilring.example",
        "ring.example",
        "cp.ring.example.org",
        "cp.other",
    ] {
        let mut c = cp("x", None);
        c.dns_name = outside.into();
        let err = refused(&mut state, 2, Command::AddControlPlane(c));
        assert!(
            err.to_string().contains("the ring's DNS zone"),
            "{outside}: {err}"
        );
    }
    // Inside.
    let mut c = cp("x", None);
    c.dns_name = "api.x.ring.example".into();
    state
        .apply(3, &proposal(Command::AddControlPlane(c)))
        .unwrap();
    // The same bootstrap again is a no-op; another zone is refused.
    state
        .apply(
            4,
            &proposal(Command::Bootstrap {
                members: members.clone(),
                dns_zone: zone,
            }),
        )
        .unwrap();
    let err = refused(
        &mut state,
        5,
        Command::Bootstrap {
            members,
            dns_zone: Some("other.example".into()),
        },
    );
    assert!(err.to_string().contains("another DNS zone"), "{err}");
    // A malformed zone never reaches the log.
    let bad = Command::Bootstrap {
        members: vec![spec(1, "a", "zone-a")],
        dns_zone: Some("not a zone".into()),
    };
    assert!(bad.validate().is_err());
}
