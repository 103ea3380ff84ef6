use super::*;
use crate::backup_report::REPORT_INTERVAL_MS;
use crate::command::Proposal;
use crate::testing::{Ring, policy, spec};

#[test]
fn a_lost_hosts_control_planes_move_out_of_its_zone_and_start_at_once() {
    let mut ring = Ring::new();
    ring.add("x", Some("a"), "c");
    let mut obs = Observations::default();
    // Starting -> running once the host reports serving.
    obs.serving.insert(("x".into(), 1, "c".into()));
    ring.run(&mut obs);
    assert_eq!(ring.cp("x").phase, Phase::Running);

    ring.lose(3);
    obs.unix_ms = 10_000_000;
    let d = ring.run(&mut obs);
    assert_eq!(d.len(), 1, "{d:?}");
    let cp = ring.cp("x");
    // Not a (home), not c (lost), not d (c's zone): b.
    assert_eq!(cp.host.as_deref(), Some("b"));
    assert_eq!(cp.epoch, 2);
    // A lost host's lease ran out already: the new host may start at once.
    assert_eq!(cp.phase, Phase::Starting);
    assert!(cp.fencing.is_empty());
    // Nothing more to do, and nothing flaps.
    assert!(ring.run(&mut obs).is_empty());
}

#[test]
fn no_eligible_member_unplaces_with_a_reason_and_nothing_flaps() {
    let mut ring = Ring::new();
    ring.add("x", Some("a"), "b");
    ring.apply(Command::Cordon {
        id: 3,
        cordoned: true,
    })
    .unwrap();
    ring.lose(4);
    ring.lose(2);
    let mut obs = Observations {
        unix_ms: 10_000_000,
        ..Observations::default()
    };
    ring.run(&mut obs);
    let cp = ring.cp("x");
    assert_eq!(
        (cp.host.as_deref(), cp.phase, cp.epoch),
        (None, Phase::Unplaced, 2)
    );
    assert!(
        cp.unplaced_reason.contains("c cordoned") && cp.unplaced_reason.contains("a its home"),
        "{}",
        cp.unplaced_reason
    );
    for _ in 0..5 {
        assert!(ring.run(&mut obs).is_empty(), "unplaced must not flap");
    }
    // An eligible member appears: it is placed.
    ring.apply(Command::Cordon {
        id: 3,
        cordoned: false,
    })
    .unwrap();
    ring.run(&mut obs);
    let cp = ring.cp("x");
    assert_eq!(
        (cp.host.as_deref(), cp.phase, cp.epoch),
        (Some("c"), Phase::Starting, 3)
    );
}

#[test]
fn a_planned_move_waits_for_the_old_host_or_its_lease() {
    let mut ring = Ring::new();
    ring.add("x", None, "a");
    ring.switchover("x", "b", 1);
    assert_eq!(ring.cp("x").phase, Phase::Fencing);
    assert!(ring.cp("x").fencing.contains("a"));
    assert!(ring.state.grants("b").is_empty(), "b must not start yet");
    assert!(ring.state.grants("a").is_empty(), "a lost its grant");

    // Too early: nothing.
    let mut obs = Observations {
        now_ms: 100,
        ..Observations::default()
    };
    assert!(ring.run(&mut obs).is_empty());
    obs.now_ms = 100 + policy().fence_wait_ms() - 1;
    assert!(ring.run(&mut obs).is_empty());
    // The lease has surely run out: released.
    obs.now_ms += 1;
    let d = ring.run(&mut obs);
    assert!(d[0].reason.contains("lease ran out"), "{d:?}");
    assert_eq!(ring.cp("x").phase, Phase::Starting);
    assert_eq!(ring.state.grants("b").get("x"), Some(&2));

    // The fast path: the old host reports it stopped.
    ring.switchover("x", "c", 2);
    obs.released.insert(("x".into(), 3, "b".into()));
    let d = ring.run(&mut obs);
    assert!(d[0].reason.contains("reported it stopped"), "{d:?}");
    assert_eq!(ring.cp("x").phase, Phase::Starting);
}

#[test]
fn pause_stops_moves_but_not_bookkeeping_and_min_interval_holds_back_flapping() {
    let mut ring = Ring::new();
    ring.add("x", None, "a");
    ring.apply(Command::SetPaused { paused: true }).unwrap();
    ring.lose(1);
    let mut obs = Observations {
        unix_ms: 10_000_000,
        ..Observations::default()
    };
    assert!(ring.run(&mut obs).is_empty(), "paused: nothing moves");
    ring.apply(Command::SetPaused { paused: false }).unwrap();
    ring.run(&mut obs);
    assert_eq!(ring.cp("x").host.as_deref(), Some("b"));
    let moved_at = ring.cp("x").moved_at_ms;
    // b is lost right after: the move waits for min_move_interval_ms.
    ring.lose(2);
    obs.unix_ms = moved_at + policy().min_move_interval_ms - 1;
    assert!(
        ring.run(&mut obs).is_empty(),
        "too soon after the last move"
    );
    obs.unix_ms = moved_at + policy().min_move_interval_ms;
    ring.run(&mut obs);
    assert_eq!(ring.cp("x").host.as_deref(), Some("c"));
}

#[test]
fn a_stale_decision_is_refused() {
    let mut ring = Ring::new();
    ring.add("x", None, "a");
    let stale = plan_moves(
        &ring.state,
        &["x".into()],
        Some("b"),
        MoveKind::Switchover,
        &policy(),
        1,
    )
    .unwrap();
    let fresh = plan_moves(
        &ring.state,
        &["x".into()],
        Some("c"),
        MoveKind::Switchover,
        &policy(),
        1,
    )
    .unwrap();
    ring.apply(fresh[0].clone()).unwrap();
    let err = ring.apply(stale[0].clone()).unwrap_err();
    assert!(err.to_string().contains("stale"), "{err}");
    assert_eq!(ring.cp("x").host.as_deref(), Some("c"));
}

#[test]
fn drain_spreads_with_capacity_and_refuses_what_cannot_move() {
    let mut ring = Ring::new();
    for n in ["p", "q", "r"] {
        ring.add(n, None, "a");
    }
    let names: Vec<String> = ["p", "q", "r"].iter().map(|s| s.to_string()).collect();
    let plan = plan_moves(&ring.state, &names, None, MoveKind::Drain, &policy(), 1).unwrap();
    let targets: Vec<String> = plan
        .iter()
        .map(|c| match c {
            Command::MoveControlPlane { to, .. } => to.clone().unwrap(),
            _ => unreachable!(),
        })
        .collect();
    assert_eq!(targets, ["b", "c", "d"], "spread over the least loaded");
    let tight = Policy {
        capacity: 1,
        ..policy()
    };
    ring.add("s", None, "b");
    let err = plan_moves(&ring.state, &names, None, MoveKind::Drain, &tight, 1).unwrap_err();
    assert!(
        matches!(&err, PlanError::NoHost { control_plane, .. } if control_plane == "r"),
        "{err:?}"
    );
    let err = err.to_string();
    assert!(
        err.contains("cannot move r") && err.contains("at capacity"),
        "{err}"
    );
}

#[test]
fn operator_preferences_come_first_within_the_rules() {
    let mut ring = Ring::new();
    ring.add("x", None, "a");
    ring.add("y", Some("a"), "c");
    for (name, prefer) in [("x", vec!["c", "b"]), ("y", vec!["d", "b"])] {
        ring.state.control_planes.get_mut(name).unwrap().prefer =
            prefer.into_iter().map(str::to_string).collect();
    }
    // Load b so that "least loaded" alone would not choose it.
    ring.add("z", None, "b");
    ring.lose(1);
    ring.lose(3);
    let mut obs = Observations {
        unix_ms: 10_000_000,
        ..Observations::default()
    };
    ring.run(&mut obs);
    // x: c is preferred but lost; b is next.
    assert_eq!(ring.cp("x").host.as_deref(), Some("b"));
    // y: d is preferred but in the lost host c's zone; b is next.
    assert_eq!(ring.cp("y").host.as_deref(), Some("b"));
}

#[test]
fn label_preferences_come_before_load() {
    let mut ring = Ring::new();
    ring.apply(Command::SetLabels {
        id: 4,
        labels: [("tier".to_string(), "gold".to_string())].into(),
    })
    .unwrap();
    // d is labelled gold; x prefers gold members, so d wins although c has the same load and
    // a lower id.
    ring.add("x", None, "a");
    ring.state.control_planes.get_mut("x").unwrap().prefer = vec!["tier=gold".into()];
    ring.lose(1);
    let mut obs = Observations {
        unix_ms: 10_000_000,
        ..Observations::default()
    };
    ring.run(&mut obs);
    assert_eq!(ring.cp("x").host.as_deref(), Some("d"));
    // Bad labels and preferences never reach the log.
    assert!(
        Command::SetLabels {
            id: 4,
            labels: [("Bad Key".to_string(), "x".to_string())].into(),
        }
        .validate()
        .is_err()
    );
    assert!(crate::command::check_preference("tier=").is_err());
    assert!(crate::command::check_preference("tier=gold").is_ok());
}

#[test]
fn a_move_records_its_migration_from_fencing_to_done() {
    use crate::migration::{MigrationReport, MigrationStep};
    let mut ring = Ring::new();
    let mut spec_backups = BTreeMap::new();
    spec_backups.insert("a".to_string(), "s3://zone-a/x".to_string());
    spec_backups.insert("b".to_string(), "s3://zone-b/x".to_string());
    ring.add("x", None, "a");
    ring.state
        .control_planes
        .get_mut("x")
        .unwrap()
        .backups
        .clone_from(&spec_backups);
    ring.switchover("x", "b", 1);
    let m = ring.cp("x").migration.clone().unwrap();
    assert_eq!(
        (m.epoch, m.from.as_deref(), m.to.as_str(), m.step),
        (2, Some("a"), "b", MigrationStep::Fencing)
    );
    assert_eq!(
        (m.source.as_str(), m.destination.as_str()),
        ("s3://zone-a/x", "s3://zone-b/x")
    );

    let mut obs = Observations {
        now_ms: 100,
        unix_ms: 2_000_000,
        ..Observations::default()
    };
    obs.released.insert(("x".into(), 2, "a".into()));
    ring.run(&mut obs);
    assert_eq!(
        ring.cp("x").migration.as_ref().unwrap().step,
        MigrationStep::Handover
    );

    // The new host reports its progress; a stale or early report is not proposed.
    let key = ("x".to_string(), 2, "b".to_string());
    obs.progress.insert(
        key.clone(),
        MigrationReport {
            step: Some(MigrationStep::Copying),
            bytes_copied: 4096,
            ..MigrationReport::default()
        },
    );
    let d = ring.run(&mut obs);
    assert!(
        matches!(d[0].command, Command::ReportMigration { .. }),
        "{d:?}"
    );
    assert_eq!(ring.cp("x").migration.as_ref().unwrap().bytes_copied, 4096);
    assert!(
        ring.run(&mut obs).is_empty(),
        "the same report is committed once"
    );
    obs.progress.insert(
        key.clone(),
        MigrationReport {
            step: Some(MigrationStep::Starting),
            bytes_copied: 8192,
            restored: Some("Full-00000000-00000100-1700000000.final".into()),
            data_loss_window_ms: Some(0),
            note: String::new(),
        },
    );
    // The host already serves when its last report arrives (the whole restore fell between
    // two renewals): the report is committed first, so the window is not lost.
    obs.serving.insert(key);
    ring.run(&mut obs);
    let m = ring.cp("x").migration.clone().unwrap();
    assert_eq!(
        (m.step, m.data_loss_window_ms),
        (MigrationStep::Starting, Some(0))
    );

    // Serving ends it; the history says how long it took and what was lost.
    ring.run(&mut obs);
    assert_eq!(ring.cp("x").phase, Phase::Running);
    assert_eq!(
        ring.cp("x").migration.as_ref().unwrap().step,
        MigrationStep::Done
    );
    let last = ring.state.history.iter().last().unwrap();
    assert!(last.detail.contains("migration done"), "{last:?}");
    assert!(last.detail.contains("data-loss window 0 ms"), "{last:?}");

    // A report from a member that is not the host is refused by apply.
    let err = ring
        .apply(Command::ReportMigration {
            name: "x".into(),
            epoch: 2,
            member: "c".into(),
            report: MigrationReport {
                step: Some(MigrationStep::Copying),
                ..MigrationReport::default()
            },
        })
        .unwrap_err();
    assert!(
        err.to_string().contains("cannot report a migration"),
        "{err}"
    );
}

#[test]
fn after_a_recovery_a_removed_hosts_control_plane_waits_a_full_lease_then_moves() {
    let mut ring = Ring::new();
    ring.add("x", Some("d"), "b");
    ring.add("y", Some("b"), "a");
    let mut obs = Observations::default();
    obs.serving.insert(("x".into(), 1, "b".into()));
    obs.serving.insert(("y".into(), 1, "a".into()));
    ring.run(&mut obs);
    assert_eq!(ring.cp("x").phase, Phase::Running);

    // The ring restarts from a's data; b, c and d are gone.
    ring.index += 1;
    ring.state
        .recover(
            ring.index,
            &Proposal {
                command: Command::Recover {
                    survivor: spec(1, "a", "za"),
                    removed: vec![2, 3, 4],
                    source: "test".into(),
                },
                at_ms: 2_000_000,
                actor: "test".into(),
                reason: String::new(),
            },
        )
        .unwrap();
    assert_eq!(
        (ring.cp("x").phase, ring.cp("x").epoch),
        (Phase::Unplaced, 2)
    );

    // The recovered ring's leader starts watching at its own time; nothing moves before
    // lease + fence + margin, although a could host x.
    let mut obs = Observations {
        now_ms: 50_000,
        unix_ms: 10_000_000,
        ..Observations::default()
    };
    assert!(ring.run(&mut obs).is_empty());
    obs.now_ms += policy().fence_wait_ms() - 1;
    assert!(ring.run(&mut obs).is_empty(), "released too early");
    // Every removed member fences it: entries only they had may have placed it on any of them.
    assert_eq!(
        ring.cp("x").fencing,
        BTreeSet::from(["b".to_string(), "c".to_string(), "d".to_string()])
    );

    obs.now_ms += 1;
    // All released now (one a round), with no more time passing.
    let mut released = Vec::new();
    while !ring.cp("x").fencing.is_empty() {
        let d = ring.run(&mut obs);
        assert!(!d.is_empty() && released.len() < 3, "{d:?}");
        for d in d {
            match d.command {
                Command::ReleaseFence {
                    member, epoch: 2, ..
                } => released.push(member),
                other => panic!("not a release: {other:?}"),
            }
        }
    }
    assert_eq!(released, ["b", "c", "d"]);
    // Then placed, and it may start at once: nobody fences it any more.
    let d = ring.run(&mut obs);
    assert_eq!(d.len(), 1, "{d:?}");
    let x = ring.cp("x");
    assert_eq!(
        (x.host.as_deref(), x.phase, x.epoch),
        (Some("a"), Phase::Starting, 3)
    );
    // y never moved.
    assert_eq!(
        (ring.cp("y").host.as_deref(), ring.cp("y").epoch),
        (Some("a"), 1)
    );
}

#[test]
fn an_unplaced_control_plane_with_a_live_former_host_is_placed_once_released() {
    let mut ring = Ring::new();
    ring.add("x", None, "a");
    // Unplaced by hand while a runs it: a fences it.
    ring.apply(Command::MoveControlPlane {
        name: "x".into(),
        to: None,
        epoch: 2,
        kind: MoveKind::Failover,
        note: "test".into(),
    })
    .unwrap();
    assert_eq!(ring.cp("x").fencing, BTreeSet::from(["a".to_string()]));
    let mut obs = Observations {
        unix_ms: 10_000_000,
        ..Observations::default()
    };
    assert!(
        ring.run(&mut obs).is_empty(),
        "not placed while a fences it"
    );
    // a renews without it: released, then placed.
    obs.released.insert(("x".into(), 2, "a".into()));
    let d = ring.run(&mut obs);
    assert!(
        matches!(d[0].command, Command::ReleaseFence { .. }),
        "{d:?}"
    );
    ring.run(&mut obs);
    assert_eq!(ring.cp("x").phase, Phase::Starting);
}

#[test]
fn a_batch_of_failovers_spreads_over_the_survivors_and_respects_capacity() {
    // Twelve control planes on b; b is lost. One round decides all twelve moves against the
    // same state: each placement must see the ones decided before it.
    let hosts_after = |capacity: usize| {
        let mut ring = Ring::new();
        for i in 0..12 {
            ring.add(&format!("x{i:02}"), None, "b");
        }
        let mut obs = Observations::default();
        for i in 0..12 {
            obs.serving.insert((format!("x{i:02}"), 1, "b".into()));
        }
        ring.run(&mut obs);
        ring.lose(2);
        obs.unix_ms = 10_000_000;
        obs.observe(&ring.state);
        let policy = Policy {
            capacity,
            ..policy()
        };
        let decisions = decide(&ring.state, &obs, &policy);
        assert_eq!(decisions.len(), 12, "{decisions:?}");
        let mut hosts: BTreeMap<String, usize> = BTreeMap::new();
        for d in &decisions {
            let Command::MoveControlPlane { to, note, .. } = &d.command else {
                panic!("not a move: {d:?}");
            };
            match to {
                Some(to) => *hosts.entry(to.clone()).or_default() += 1,
                None => {
                    assert!(note.contains("at capacity"), "{note}");
                    *hosts.entry("unplaced".into()).or_default() += 1;
                }
            }
            ring.apply(d.command.clone()).unwrap();
        }
        hosts
    };
    // a, c and d survive outside b's zone: four each.
    let spread = hosts_after(0);
    assert_eq!(
        spread,
        BTreeMap::from([("a".into(), 4), ("c".into(), 4), ("d".into(), 4)])
    );
    // At most three each: nine placed, three unplaced with the reason.
    let capped = hosts_after(3);
    assert_eq!(
        capped,
        BTreeMap::from([
            ("a".into(), 3),
            ("c".into(), 3),
            ("d".into(), 3),
            ("unplaced".into(), 3)
        ])
    );
}

fn backups(full: &str, deltas: u64, up_to_date_unix_ms: u64) -> BackupReport {
    BackupReport {
        full: Some(format!("x/v2/{full}")),
        deltas_since_full: deltas,
        revision: 100 + deltas,
        newest_delta_unix_ms: (deltas > 0).then_some(up_to_date_unix_ms),
        up_to_date_unix_ms,
        delta_period_ms: 1_000,
        ..BackupReport::default()
    }
}

fn backup_decisions(d: &[Decision]) -> Vec<&BackupReport> {
    d.iter()
        .filter_map(|d| match &d.command {
            Command::ReportBackup { report, .. } => Some(report),
            _ => None,
        })
        .collect()
}

#[test]
fn backup_reports_are_committed_when_absent_throttled_and_on_a_new_full() {
    let mut ring = Ring::new();
    ring.add("x", None, "a");
    let full = "Full-00000000-00000100-1700000000.gz";
    let key = ("x".to_string(), 1, "a".to_string());
    let mut obs = Observations::default();
    // Reported while starting: kept, not proposed before it runs.
    obs.backups.insert(key.clone(), backups(full, 0, 1_000));
    assert!(ring.run(&mut obs).is_empty());
    obs.serving.insert(key.clone());
    ring.run(&mut obs);
    assert_eq!(ring.cp("x").phase, Phase::Running);

    // Absent: committed.
    let d = ring.run(&mut obs);
    assert_eq!(backup_decisions(&d), [&backups(full, 0, 1_000)], "{d:?}");
    assert!(d[0].reason.contains("a reports its backups"), "{d:?}");
    assert_eq!(ring.cp("x").backup_status, Some(backups(full, 0, 1_000)));
    assert!(
        ring.run(&mut obs).is_empty(),
        "the same report is committed once"
    );

    // Deltas on the same full snapshot: at most one commit per REPORT_INTERVAL_MS.
    obs.backups.insert(
        key.clone(),
        backups(full, 4, 1_000 + REPORT_INTERVAL_MS - 1),
    );
    assert!(ring.run(&mut obs).is_empty(), "throttled");
    obs.backups
        .insert(key.clone(), backups(full, 5, 1_000 + REPORT_INTERVAL_MS));
    let d = ring.run(&mut obs);
    assert_eq!(backup_decisions(&d).len(), 1, "{d:?}");
    assert_eq!(
        ring.cp("x")
            .backup_status
            .as_ref()
            .unwrap()
            .deltas_since_full,
        5
    );

    // A new full snapshot: at once.
    let newer = "Full-00000000-00000105-1700000006.gz";
    obs.backups.insert(
        key.clone(),
        backups(newer, 0, 1_000 + REPORT_INTERVAL_MS + 1),
    );
    let d = ring.run(&mut obs);
    assert_eq!(backup_decisions(&d).len(), 1, "{d:?}");
    assert_eq!(
        ring.cp("x").backup_status.as_ref().unwrap().full_name(),
        Some(newer)
    );
    let recorded = ring
        .state
        .history
        .iter()
        .filter(|e| e.action == "control-plane.backup")
        .count();
    assert_eq!(recorded, 2, "the first report and the new full one");

    // Not from the host, not at the epoch, not valid: never proposed.
    let mut other = Observations::default();
    other
        .backups
        .insert(("x".into(), 1, "b".into()), backups(full, 0, 99_000));
    other
        .backups
        .insert(("x".into(), 2, "a".into()), backups(full, 0, 99_000));
    assert!(ring.run(&mut other).is_empty());
    let mut bad = backups(newer, 0, 99_000);
    bad.newest_delta_unix_ms = Some(1);
    other.backups.insert(key.clone(), bad);
    assert!(
        ring.run(&mut other).is_empty(),
        "an invalid report is proposed"
    );

    // The host is lost: the move comes first and alone, and clears the report; the old
    // epoch's report is forgotten.
    ring.lose(1);
    obs.unix_ms = 10_000_000;
    obs.backups.insert(
        key.clone(),
        backups(newer, 3, 2_000 + REPORT_INTERVAL_MS * 2),
    );
    let d = ring.run(&mut obs);
    assert_eq!(d.len(), 1, "{d:?}");
    assert!(
        matches!(d[0].command, Command::MoveControlPlane { .. }),
        "{d:?}"
    );
    assert_eq!(ring.cp("x").backup_status, None);
    obs.observe(&ring.state);
    assert!(obs.backups.is_empty(), "{:?}", obs.backups);
}

#[test]
fn backup_reports_keep_decisions_in_name_order() {
    let mut ring = Ring::new();
    ring.add("w", None, "a");
    ring.add("x", None, "b");
    let mut obs = Observations::default();
    obs.serving.insert(("w".into(), 1, "a".into()));
    ring.run(&mut obs);
    // x is still starting (a serving decision), w runs (a backup report).
    obs.serving.insert(("x".into(), 1, "b".into()));
    obs.backups.insert(
        ("w".into(), 1, "a".into()),
        backups("Full-00000000-00000001-1700000000.gz", 0, 1),
    );
    obs.observe(&ring.state);
    let d = decide(&ring.state, &obs, &policy());
    let names: Vec<_> = d
        .iter()
        .map(|d| d.command.control_plane_epoch().unwrap().0)
        .collect();
    assert_eq!(names, ["w", "x"], "{d:?}");
}

fn problem_decisions(d: &[Decision]) -> Vec<Option<&str>> {
    d.iter()
        .filter_map(|d| match &d.command {
            Command::ReportProblem { problem, .. } => Some(problem.as_deref()),
            _ => None,
        })
        .collect()
}

#[test]
fn a_hosts_problem_is_committed_once_and_its_end_once() {
    let mut ring = Ring::new();
    ring.add("x", None, "a");
    let key = ("x".to_string(), 1, "a".to_string());
    let mut obs = Observations::default();

    // Reported while starting: committed at once (no waiting for it to run).
    obs.problems.insert(key.clone(), Some("etcd exited".into()));
    let d = ring.run(&mut obs);
    assert_eq!(problem_decisions(&d), [Some("etcd exited")], "{d:?}");
    assert!(d[0].reason.contains("a reports a problem"), "{d:?}");
    assert!(ring.run(&mut obs).is_empty(), "committed once");
    assert!(obs.problems.is_empty(), "a committed report is forgotten");

    // From another member, another epoch, or invalid: never.
    for (k, text) in [
        (("x".to_string(), 1, "b".to_string()), "not mine"),
        (("x".to_string(), 2, "a".to_string()), "future"),
        (key.clone(), "bad\u{0}"),
    ] {
        obs.problems.insert(k, Some(text.into()));
        let d = ring.run(&mut obs);
        assert!(problem_decisions(&d).is_empty(), "{text}: {d:?}");
        obs.problems.clear();
    }

    // Well again: the clearing is committed once.
    obs.problems.insert(key.clone(), None);
    let d = ring.run(&mut obs);
    assert_eq!(problem_decisions(&d), [None], "{d:?}");
    assert!(d[0].reason.contains("a reports it well again"), "{d:?}");
    assert_eq!(ring.cp("x").problem, None);
    assert!(ring.run(&mut obs).is_empty());
}
