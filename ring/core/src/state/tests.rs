use super::*;
use crate::error::ReportKind;
use crate::limits::HISTORY_LIMIT;
use crate::testing::spec;

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
        tolerance: Default::default(),
        etcd_peers: Default::default(),
    }
}

/// Applies a command that must be refused and checks nothing changed.
/// Applies the move of `name` to `to` at `epoch` as entry `index`.
fn move_to(state: &mut RingState, index: u64, name: &str, to: &str, epoch: u64, kind: MoveKind) {
    let command = Command::MoveControlPlane {
        name: name.into(),
        to: Some(to.into()),
        epoch,
        kind,
        note: String::new(),
    };
    state.apply(index, &proposal(command)).unwrap();
}

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
    assert!(matches!(err, CommandError::AlreadyBootstrapped), "{err}");
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
    assert!(
        matches!(err, CommandError::NotJoinedYet { id: 4, .. }),
        "{err}"
    );

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
    assert!(
        matches!(err, CommandError::DuplicateAddress { id: 1, .. }),
        "{err}"
    );
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
    assert!(matches!(err, CommandError::NotBootstrapped), "{err}");
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

fn recover_command(survivor: MemberSpec, removed: Vec<NodeId>) -> Command {
    Command::Recover {
        survivor,
        removed,
        source: "the data directory of a".into(),
    }
}

/// Ring a, b, c with x on b (home a), y on a (home b), z on c moving to a (fencing c).
fn ring3_with_control_planes() -> RingState {
    let mut state = ring3();
    state.apply_membership(&BTreeSet::from([1, 2, 3]), &BTreeSet::new());
    let mut index = 1;
    let mut add = |state: &mut RingState, name: &str, home: &str, host: &str| {
        index += 1;
        let mut spec = cp(name, Some(home));
        spec.host = Some(host.into());
        state
            .apply(index, &proposal(Command::AddControlPlane(spec)))
            .unwrap();
        index += 1;
        state
            .apply(
                index,
                &proposal(Command::ReportServing {
                    name: name.into(),
                    epoch: 1,
                    member: host.into(),
                }),
            )
            .unwrap();
    };
    add(&mut state, "x", "a", "b");
    add(&mut state, "y", "b", "a");
    add(&mut state, "z", "b", "c");
    move_to(&mut state, 20, "z", "a", 2, MoveKind::Switchover);
    assert_eq!(state.control_planes["z"].phase, Phase::Fencing);
    state
}

#[test]
fn recovery_keeps_the_survivors_control_planes_and_fences_the_removed_hosts() {
    let mut state = ring3_with_control_planes();
    // A revoked certificate stays revoked through a recovery.
    state
        .apply(20, &proposal(revoke("1a2b", "key leaked")))
        .unwrap();
    let before = state.clone();
    assert_eq!(RingState::default().generation(), 0, "no state yet");
    assert_eq!(before.generation(), 1, "the ring as formed");
    let mut survivor = spec(1, "a", "zone-a");
    survivor.address = "10.9.9.9:7401".into();
    state
        .recover(21, &proposal(recover_command(survivor, vec![2, 3])))
        .unwrap();
    // A new incarnation: members that kept the old state no longer reach it.
    assert_eq!(state.generation(), 2);
    assert_eq!(state.revoked, before.revoked);
    assert_eq!(state.revoked.len(), 1);

    // One member left, the only voter, at its new address; the others retired.
    assert_eq!(state.members.keys().copied().collect::<Vec<_>>(), vec![1]);
    let a = &state.members[&1];
    assert_eq!((a.role, a.address.as_str()), (Role::Voter, "10.9.9.9:7401"));
    assert_eq!(state.retired_ids, BTreeSet::from([2, 3]));

    // y stays as it was: same host, same epoch, still running.
    assert_eq!(state.control_planes["y"], before.control_planes["y"]);
    // x lost its host b: unplaced at the next epoch, every removed member fencing it (nobody
    // knows when b last renewed, nor where entries only b and c had placed it), its migration
    // from b.
    let x = &state.control_planes["x"];
    assert_eq!(
        (x.host.as_deref(), x.phase, x.epoch),
        (None, Phase::Unplaced, 2)
    );
    assert_eq!(
        x.fencing,
        BTreeSet::from(["b".to_string(), "c".to_string()])
    );
    assert_eq!(x.migration.as_ref().unwrap().from.as_deref(), Some("b"));
    assert!(
        x.unplaced_reason
            .contains("removed when the ring was recovered")
    );
    // z was moving from c to a: it stays on a, still waiting for c (now removed).
    let z = &state.control_planes["z"];
    assert_eq!(
        (z.host.as_deref(), z.phase, z.epoch),
        (Some("a"), Phase::Fencing, 2)
    );
    assert_eq!(z.fencing, BTreeSet::from(["c".to_string()]));

    // History: everything before, plus the recovery.
    let events: Vec<_> = state.history.iter().cloned().collect();
    let old: Vec<_> = before.history.iter().cloned().collect();
    assert_eq!(&events[..old.len()], &old[..]);
    let last = events.last().unwrap();
    assert_eq!(
        (last.index, last.action.as_str(), last.subject.as_str()),
        (21, "ring.recover", "ring")
    );
    assert_eq!(last.reason, "because");
    for needed in [
        "a(1) is the only member",
        "b(2), c(3)",
        "x (was on b, now epoch 2)",
    ] {
        assert!(
            last.detail.contains(needed),
            "{needed:?} not in {}",
            last.detail
        );
    }
    state.check_invariants();

    // The old ids are never accepted again; the old names only once nobody fences them.
    let err = refused(&mut state, 22, Command::AddMember(spec(2, "e", "zone-e")));
    assert_eq!(err, CommandError::RetiredMemberId(2));
    let err = refused(&mut state, 22, Command::AddMember(spec(4, "b", "zone-b")));
    assert!(err.to_string().contains("former member named b"), "{err}");
    state
        .apply(
            22,
            &proposal(Command::ReleaseFence {
                name: "x".into(),
                epoch: 2,
                member: "b".into(),
            }),
        )
        .unwrap();
    assert_eq!(state.control_planes["x"].phase, Phase::Unplaced);
    state
        .apply(23, &proposal(Command::AddMember(spec(4, "b", "zone-b"))))
        .unwrap();
}

#[test]
fn recovery_is_never_applied_from_the_log_and_refuses_bad_input_unchanged() {
    let mut state = ring3_with_control_planes();
    let ok = recover_command(spec(1, "a", "zone-a"), vec![2, 3]);
    // Through the log: refused.
    let err = refused(&mut state, 21, ok.clone());
    assert!(
        err.to_string().contains("never committed through Raft"),
        "{err}"
    );
    // recover() takes nothing else.
    let before = state.clone();
    let err = state
        .recover(21, &proposal(Command::SetPaused { paused: true }))
        .unwrap_err();
    assert!(err.to_string().contains("not a ring recovery"), "{err}");
    assert_eq!(state, before);

    let bad = [
        (
            recover_command(spec(9, "q", "zone-q"), vec![1, 2, 3]),
            "not a member",
        ),
        (
            recover_command(spec(1, "x", "zone-a"), vec![2, 3]),
            "registered as a",
        ),
        (
            recover_command(spec(1, "a", "zone-z"), vec![2, 3]),
            "registered as a",
        ),
        (
            recover_command(spec(1, "a", "zone-a"), vec![2]),
            "exactly every other member",
        ),
        (
            recover_command(spec(1, "a", "zone-a"), vec![2, 3, 4]),
            "exactly every other member",
        ),
        (
            recover_command(spec(1, "a", "zone-a"), vec![2, 2, 3]),
            "exactly every other member",
        ),
        (
            recover_command(spec(1, "a", "zone-a"), vec![1, 2, 3]),
            "survivor",
        ),
    ];
    for (command, why) in bad {
        let err = state.recover(21, &proposal(command.clone())).unwrap_err();
        assert!(err.to_string().contains(why), "{command:?}: {err}");
        assert_eq!(state, before, "{command:?} changed the state");
    }

    // A retired survivor, and a ring that never formed.
    state.recover(21, &proposal(ok)).unwrap();
    let again = recover_command(spec(2, "b", "zone-b"), vec![1]);
    let err = state.recover(22, &proposal(again)).unwrap_err();
    assert!(err.to_string().contains("retired"), "{err}");
    let mut empty = RingState::default();
    let err = empty
        .recover(
            1,
            &proposal(recover_command(spec(1, "a", "zone-a"), vec![])),
        )
        .unwrap_err();
    assert!(err.to_string().contains("nothing to recover"), "{err}");
    assert_eq!(empty, RingState::default());
}

/// The index `apply` keeps equals one recomputed from the control planes after every command
/// of long random sequences (moves to any member or nowhere, at the right or a stale epoch,
/// releases, serving reports, removals, members lost and back), and so do the lookups built on
/// it compared with a scan of every control plane; a decoded state rebuilds it.
#[test]
fn the_index_always_equals_a_recomputation() {
    let members = ["a", "b", "c"];
    let mut seed: u64 = 0x2545_f491_4f6c_dd1d;
    let mut next = |n: u64| {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed % n
    };
    let mut state = ring3();
    let mut applied = 0;
    for (step, index) in (0..3_000).zip(2..) {
        let name = format!("cp{}", next(24));
        let epoch = state.control_planes.get(&name).map_or(0, |c| c.epoch);
        let member = members[next(3) as usize].to_string();
        let command = match next(9) {
            0 | 1 => Command::AddControlPlane(ControlPlaneSpec {
                host: (next(2) == 0).then(|| member.clone()),
                ..cp(&name, None)
            }),
            2 | 3 => Command::MoveControlPlane {
                name: name.clone(),
                to: (next(4) != 0).then(|| member.clone()),
                epoch: epoch + 1 - next(2).min(epoch),
                kind: MoveKind::Switchover,
                note: String::new(),
            },
            4 => Command::ReleaseFence {
                name: name.clone(),
                epoch,
                member: member.clone(),
            },
            5 => Command::ReportServing {
                name: name.clone(),
                epoch,
                member: state
                    .control_planes
                    .get(&name)
                    .and_then(|c| c.host.clone())
                    .unwrap_or(member.clone()),
            },
            6 => Command::RemoveControlPlane { name: name.clone() },
            _ => Command::SetHealth {
                id: next(3) + 1,
                health: [Health::Healthy, Health::Suspect, Health::Lost][next(3) as usize],
            },
        };
        if state.apply(index, &proposal(command)).is_ok() {
            applied += 1;
        }
        assert_eq!(state.index, Index::of(&state.control_planes), "step {step}");
        for m in members {
            let scan: Vec<&String> = state
                .control_planes
                .values()
                .filter(|c| c.host.as_deref() == Some(m))
                .map(|c| &c.name)
                .collect();
            assert_eq!(state.hosted_count(m), scan.len());
            assert_eq!(state.hosted(m).map(|c| &c.name).collect::<Vec<_>>(), scan);
            let fenced: Vec<&String> = state
                .control_planes
                .values()
                .filter(|c| c.fencing.contains(m))
                .map(|c| &c.name)
                .collect();
            assert_eq!(
                state.fenced_by(m).map(|c| &c.name).collect::<Vec<_>>(),
                fenced
            );
        }
        let lost: BTreeSet<&str> = state
            .members
            .values()
            .filter(|m| m.health == Health::Lost)
            .map(|m| m.name.as_str())
            .collect();
        let may_change: Vec<&String> = state
            .control_planes
            .values()
            .filter(|c| {
                c.phase != Phase::Running || c.host.as_deref().is_some_and(|h| lost.contains(h))
            })
            .map(|c| &c.name)
            .collect();
        assert_eq!(
            state
                .may_change()
                .iter()
                .map(|c| &c.name)
                .collect::<Vec<_>>(),
            may_change
        );
    }
    assert!(applied > 500, "only {applied} commands applied");
    let decoded: RingState = serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
    assert_eq!(decoded, state, "a decoded state has the same index");
}

#[test]
fn control_plane_labels_are_replaced_recorded_and_checked() {
    let mut state = ring3();
    state
        .apply(2, &proposal(Command::AddControlPlane(cp("x", Some("a")))))
        .unwrap();
    let labels: BTreeMap<String, String> = [("owner".to_string(), "team-1".to_string())].into();
    state
        .apply(
            3,
            &proposal(Command::SetControlPlaneLabels {
                name: "x".into(),
                labels: labels.clone(),
            }),
        )
        .unwrap();
    assert_eq!(state.control_planes["x"].labels, labels);
    let event = state.history.newest(1)[0].clone();
    assert_eq!(event.action, "control-plane.labels");
    assert_eq!(event.subject, "x");
    assert_eq!(event.detail, "labels owner=team-1");

    // Replaced, not merged; an empty set removes them.
    state
        .apply(
            4,
            &proposal(Command::SetControlPlaneLabels {
                name: "x".into(),
                labels: BTreeMap::new(),
            }),
        )
        .unwrap();
    assert!(state.control_planes["x"].labels.is_empty());

    // Unknown control plane, bad label, too many labels: refused, nothing changes.
    let err = refused(
        &mut state,
        5,
        Command::SetControlPlaneLabels {
            name: "nope".into(),
            labels: labels.clone(),
        },
    );
    assert!(
        matches!(err, CommandError::UnknownControlPlane(_)),
        "{err:?}"
    );
    let err = refused(
        &mut state,
        5,
        Command::SetControlPlaneLabels {
            name: "x".into(),
            labels: [("Bad Key".to_string(), "v".to_string())].into(),
        },
    );
    assert!(matches!(err, CommandError::Invalid { .. }), "{err:?}");
    let many = (0..=crate::command::MAX_LABELS)
        .map(|i| (format!("k{i}"), "v".to_string()))
        .collect();
    let err = refused(
        &mut state,
        5,
        Command::SetControlPlaneLabels {
            name: "x".into(),
            labels: many,
        },
    );
    assert!(matches!(err, CommandError::Limit(_)), "{err:?}");
}

fn backup_report(full: &str, deltas: u64, up_to_date_unix_ms: u64) -> BackupReport {
    BackupReport {
        full: Some(format!("shoot--dev--x/etcd-main/v2/{full}")),
        deltas_since_full: deltas,
        revision: 100 + deltas,
        newest_delta_unix_ms: (deltas > 0).then_some(up_to_date_unix_ms),
        up_to_date_unix_ms,
        delta_period_ms: 20_000,
        ..BackupReport::default()
    }
}

fn report_backup(name: &str, epoch: u64, member: &str, report: BackupReport) -> Command {
    Command::ReportBackup {
        name: name.into(),
        epoch,
        member: member.into(),
        report,
    }
}

#[test]
fn backup_reports_are_kept_while_running_refused_elsewhere_and_cleared_on_move() {
    let mut state = ring3();
    state
        .apply(2, &proposal(Command::AddControlPlane(cp("x", Some("a")))))
        .unwrap();
    let host = state.control_planes["x"].host.clone().unwrap();
    let other = if host == "b" { "c" } else { "b" };
    let full = "Full-00000000-00000100-1700000000.gz";

    // Not running yet: refused.
    let err = refused(
        &mut state,
        3,
        report_backup("x", 1, &host, backup_report(full, 0, 1)),
    );
    assert!(
        matches!(
            &err,
            CommandError::UnexpectedReport {
                report: ReportKind::Backups,
                ..
            }
        ),
        "{err:?}"
    );
    state
        .apply(
            3,
            &proposal(Command::ReportServing {
                name: "x".into(),
                epoch: 1,
                member: host.clone(),
            }),
        )
        .unwrap();

    // The first report of the epoch is stored and recorded in history.
    state
        .apply(
            4,
            &proposal(report_backup("x", 1, &host, backup_report(full, 0, 1_000))),
        )
        .unwrap();
    assert_eq!(
        state.control_planes["x"].backup_status,
        Some(backup_report(full, 0, 1_000))
    );
    let event = state.history.newest(1)[0].clone();
    assert_eq!(
        (event.index, event.action.as_str(), event.subject.as_str()),
        (4, "control-plane.backup", "x")
    );
    assert_eq!(
        event.detail,
        format!(
            "backups at epoch 1: full snapshot {full}, revision 100, 0 delta snapshots since, one every 20000 ms"
        )
    );

    // More deltas on the same full snapshot: stored, history left alone.
    let events = state.history.len();
    state
        .apply(
            5,
            &proposal(report_backup("x", 1, &host, backup_report(full, 4, 9_000))),
        )
        .unwrap();
    assert_eq!(
        state.control_planes["x"].backup_status,
        Some(backup_report(full, 4, 9_000))
    );
    assert_eq!(state.history.len(), events, "a delta report pushed history");

    // A new full snapshot is recorded again.
    let newer = "Full-00000000-00000104-1700000010.gz";
    state
        .apply(
            6,
            &proposal(report_backup(
                "x",
                1,
                &host,
                backup_report(newer, 0, 10_000),
            )),
        )
        .unwrap();
    assert_eq!(state.history.len(), events + 1);
    assert!(
        state.history.newest(1)[0].detail.contains(newer),
        "{:?}",
        state.history.newest(1)
    );

    // Another member, another epoch, an unknown control plane, a bad report: refused, nothing
    // changes.
    for (command, what) in [
        (
            report_backup("x", 1, other, backup_report(full, 0, 20_000)),
            "member",
        ),
        (
            report_backup("x", 2, &host, backup_report(full, 0, 20_000)),
            "epoch",
        ),
    ] {
        let err = refused(&mut state, 7, command);
        assert!(
            matches!(
                &err,
                CommandError::UnexpectedReport {
                    report: ReportKind::Backups,
                    ..
                }
            ),
            "wrong {what}: {err:?}"
        );
    }
    let err = refused(
        &mut state,
        7,
        report_backup("nope", 1, &host, backup_report(full, 0, 20_000)),
    );
    assert!(
        matches!(err, CommandError::UnknownControlPlane(_)),
        "{err:?}"
    );
    let mut bad = backup_report(full, 0, 20_000);
    bad.full = Some("Full\n".into());
    let err = refused(&mut state, 7, report_backup("x", 1, &host, bad));
    assert!(matches!(err, CommandError::Invalid { .. }), "{err:?}");

    // A state with a report survives JSON; one without writes no field for it (old snapshots
    // decode, and decode the same).
    let decoded: RingState = serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
    assert_eq!(decoded, state);

    // A move clears it: the new host reports its own backups.
    move_to(&mut state, 7, "x", other, 2, MoveKind::Switchover);
    assert_eq!(state.control_planes["x"].backup_status, None);
    let json = serde_json::to_string(&state).unwrap();
    assert!(!json.contains("backup_status"), "{json}");
    let err = refused(
        &mut state,
        8,
        report_backup("x", 1, &host, backup_report(full, 0, 30_000)),
    );
    assert!(
        matches!(
            err,
            CommandError::UnexpectedReport {
                report: ReportKind::Backups,
                ..
            }
        ),
        "{err:?}"
    );
}

fn report_problem(name: &str, epoch: u64, member: &str, problem: Option<&str>) -> Command {
    Command::ReportProblem {
        name: name.into(),
        epoch,
        member: member.into(),
        problem: problem.map(str::to_string),
    }
}

fn at(command: Command, at_ms: u64) -> Proposal {
    Proposal {
        at_ms,
        ..proposal(command)
    }
}

#[test]
fn a_hosts_problem_is_recorded_once_kept_while_it_lasts_and_cleared_by_the_host_or_a_move() {
    let mut state = ring3();
    state
        .apply(2, &proposal(Command::AddControlPlane(cp("x", Some("a")))))
        .unwrap();
    let host = state.control_planes["x"].host.clone().unwrap();
    let other = if host == "b" { "c" } else { "b" };
    let disk_full = "etcd exited while serving: exit status: 2";

    // Starting counts (an etcd that cannot start is exactly what must be seen).
    assert_eq!(state.control_planes["x"].phase, Phase::Starting);
    let events = state.history.len();
    state
        .apply(
            3,
            &at(report_problem("x", 1, &host, Some(disk_full)), 1_000),
        )
        .unwrap();
    let problem = state.control_planes["x"].problem.clone().unwrap();
    assert_eq!(
        (problem.text.as_str(), problem.since_ms),
        (disk_full, 1_000)
    );
    let event = state.history.newest(1)[0].clone();
    assert_eq!(
        (event.index, event.action.as_str(), event.subject.as_str()),
        (3, "control-plane.problem", "x")
    );
    assert_eq!(
        event.detail,
        format!("problem on {host} at epoch 1: {disk_full}")
    );

    // The same words again: nothing new in history. Other words: recorded, the first time kept.
    state
        .apply(
            4,
            &at(report_problem("x", 1, &host, Some(disk_full)), 2_000),
        )
        .unwrap();
    assert_eq!(state.history.len(), events + 1);
    state
        .apply(5, &at(report_problem("x", 1, &host, Some("worse")), 3_000))
        .unwrap();
    assert_eq!(state.history.len(), events + 2);
    assert_eq!(
        state.control_planes["x"]
            .problem
            .as_ref()
            .map(|p| p.since_ms),
        Some(1_000)
    );

    // Only the host at the current epoch reports; bad words are refused; nothing changes.
    for command in [
        report_problem("x", 1, other, Some("not mine")),
        report_problem("x", 2, &host, Some("future")),
        report_problem("x", 0, &host, Some("zero")),
        report_problem("x", 1, &host, Some("  ")),
        report_problem("x", 1, &host, Some("bad\u{0}")),
        report_problem("nope", 1, &host, Some("who")),
    ] {
        refused(&mut state, 6, command);
    }
    let err = refused(&mut state, 6, report_problem("x", 1, other, Some("x")));
    assert!(
        matches!(
            err,
            CommandError::UnexpectedReport {
                report: ReportKind::Problem,
                ..
            }
        ),
        "{err:?}"
    );

    // It survives JSON; cleared by the host with the time it lasted.
    let decoded: RingState = serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
    assert_eq!(decoded, state);
    state
        .apply(6, &at(report_problem("x", 1, &host, None), 8_000))
        .unwrap();
    assert_eq!(state.control_planes["x"].problem, None);
    assert_eq!(
        state.history.newest(1)[0].detail,
        format!("no problem any more on {host} at epoch 1 (reported since 7000 ms before): worse")
    );
    // Nothing to clear: no history.
    let events = state.history.len();
    state
        .apply(7, &proposal(report_problem("x", 1, &host, None)))
        .unwrap();
    assert_eq!(state.history.len(), events);

    // A move clears it, and the old host can no longer report.
    state
        .apply(8, &proposal(report_problem("x", 1, &host, Some(disk_full))))
        .unwrap();
    move_to(&mut state, 9, "x", other, 2, MoveKind::Failover);
    assert_eq!(state.control_planes["x"].problem, None);
    let json = serde_json::to_string(&state).unwrap();
    assert!(!json.contains("\"problem\""), "{json}");
    refused(
        &mut state,
        10,
        report_problem("x", 1, &host, Some(disk_full)),
    );
    // The new host, still fencing the old one: refused until it may start.
    assert_eq!(state.control_planes["x"].phase, Phase::Fencing);
    refused(
        &mut state,
        10,
        report_problem("x", 2, other, Some(disk_full)),
    );
}

fn revoke(serial: &str, reason: &str) -> Command {
    Command::RevokeCertificate {
        issuer: "CN=garden-ring CA".into(),
        serial: serial.into(),
        subject: "member:b".into(),
        reason: reason.into(),
    }
}

#[test]
fn revocations_are_kept_once_bounded_and_taken_back_only_when_they_exist() {
    let mut state = ring3();
    state
        .apply(2, &at(revoke("1a2b", "key leaked"), 5_000))
        .unwrap();
    let r = state
        .revocation("CN=garden-ring CA", "1a2b")
        .unwrap()
        .clone();
    assert_eq!(
        (
            r.subject.as_str(),
            r.reason.as_str(),
            r.at_ms,
            r.actor.as_str()
        ),
        ("member:b", "key leaked", 5_000, "test")
    );
    assert_eq!(state.revocation("CN=another CA", "1a2b"), None);
    let event = state.history.newest(1)[0].clone();
    assert_eq!(
        (event.action.as_str(), event.subject.as_str()),
        ("cert.revoke", "certificate 1a2b (member:b)")
    );

    // Twice: refused, saying when and by whom. Malformed: refused. Nothing changes.
    let err = refused(&mut state, 3, revoke("1a2b", "again"));
    assert!(
        matches!(err, CommandError::AlreadyRevoked { at_ms: 5_000, .. }),
        "{err:?}"
    );
    assert!(err.to_string().contains("by test"), "{err}");
    for bad in ["01a2b", "1A2B", "xyz", ""] {
        let err = refused(&mut state, 3, revoke(bad, "why"));
        assert!(
            matches!(err, CommandError::Invalid { .. }),
            "{bad}: {err:?}"
        );
    }
    let err = refused(&mut state, 3, revoke("ff", ""));
    assert!(matches!(err, CommandError::Invalid { .. }), "{err:?}");

    // Survives JSON (a snapshot); a state without any writes no field (old snapshots decode).
    let decoded: RingState = serde_json::from_str(&serde_json::to_string(&state).unwrap()).unwrap();
    assert_eq!(decoded, state);
    assert!(!serde_json::to_string(&ring3()).unwrap().contains("revoked"));

    // Unrevoke: only what is revoked.
    let unknown = Command::UnrevokeCertificate {
        issuer: "CN=garden-ring CA".into(),
        serial: "ff".into(),
    };
    let err = refused(&mut state, 3, unknown);
    assert!(matches!(err, CommandError::NotRevoked { .. }), "{err:?}");
    state
        .apply(
            3,
            &proposal(Command::UnrevokeCertificate {
                issuer: "CN=garden-ring CA".into(),
                serial: "1a2b".into(),
            }),
        )
        .unwrap();
    assert!(state.revoked.is_empty());
    assert!(
        state.history.newest(1)[0]
            .detail
            .contains("accepted again (revoked at 5000 ms by test: key leaked)"),
        "{:?}",
        state.history.newest(1)
    );

    // Bounded.
    for n in 0..crate::revocation::MAX_REVOKED {
        state
            .apply(
                4 + n as u64,
                &proposal(revoke(&format!("{:x}", n + 1), "r")),
            )
            .unwrap();
    }
    let err = refused(&mut state, 5_000, revoke("ffffff", "one more"));
    assert!(matches!(err, CommandError::Limit(_)), "{err:?}");
}

#[test]
fn a_diverged_member_is_recorded_once_from_ring_version_2_and_never_placed_on() {
    let mut state = ring3();
    for (index, id) in (2..).zip(1..=3) {
        let healthy = Command::SetHealth {
            id,
            health: Health::Healthy,
        };
        state.apply(index, &proposal(healthy)).unwrap();
    }
    let mark = |acknowledged_index| Command::MarkDiverged {
        id: 2,
        acknowledged_index,
    };
    // Ring version 1 (release 0.1.0) cannot read it: refused, nothing changes.
    let err = refused(&mut state, 5, mark(69));
    assert!(
        matches!(err, CommandError::RingVersionTooLow { .. }),
        "{err:?}"
    );
    state
        .apply(6, &proposal(Command::SetRingVersion { version: 2 }))
        .unwrap();
    state.apply(7, &proposal(mark(69))).unwrap();
    // A second finding changes nothing and records nothing.
    state.apply(8, &proposal(mark(3))).unwrap();
    let b = &state.members[&2];
    assert_eq!(
        b.diverged,
        Some(Divergence {
            acknowledged_index: 69,
            reason: "because".into()
        })
    );
    let events: Vec<_> = state
        .history
        .iter()
        .filter(|e| e.action == "member.diverged")
        .collect();
    assert_eq!(events.len(), 1, "{events:?}");
    assert!(events[0].detail.contains("up to index 69"), "{events:?}");
    // Never a host, whatever its health says.
    state
        .apply(
            9,
            &proposal(Command::AddControlPlane(cp("cp-x", Some("a")))),
        )
        .unwrap();
    state
        .apply(
            10,
            &proposal(Command::AddControlPlane(cp("cp-y", Some("a")))),
        )
        .unwrap();
    for name in ["cp-x", "cp-y"] {
        assert_eq!(
            state.control_planes[name].host.as_deref(),
            Some("c"),
            "{name}"
        );
    }
    // Unknown members are refused.
    let unknown = Command::MarkDiverged {
        id: 9,
        acknowledged_index: 1,
    };
    refused(&mut state, 11, unknown);
    // A state of ring version 1 encodes without the field (0.1.0 reads it).
    let v1 = ring3();
    let json = serde_json::to_string(&v1).unwrap();
    assert!(!json.contains("diverged"), "{json}");
    // The removal takes the record with it (a replacement gets a new id).
    state
        .apply(12, &proposal(Command::RemoveMember { id: 2 }))
        .unwrap();
    assert!(!state.members.contains_key(&2));
}
