//! The whole offline path in one process: a real (one-node) Raft writes a ring's data, the
//! recovery rewrites it, and openraft starts from the result and elects the survivor.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use super::*;
use crate::core::{ControlPlaneSpec, Health};
use crate::raft::network::{PeerNetwork, PeerPool};
use crate::raft::wal::WAL_FILE;
use crate::raft::{LogStore, RaftNode, StateMachineStore, storage};
use crate::tls::Security;

fn spec(id: NodeId, name: &str) -> MemberSpec {
    MemberSpec {
        id,
        name: name.into(),
        zone: format!("zone-{name}"),
        address: format!("127.0.0.1:{}", 17000 + id * 10 + 1),
        admin_address: format!("127.0.0.1:{}", 17000 + id * 10),
    }
}

fn config(dir: &Path) -> Config {
    let text = format!(
        "id = 1\nname = \"a\"\nzone = \"zone-a\"\ndata_dir = \"{}\"\nlisten_peer = \"127.0.0.1:17011\"\n\
         listen_admin = \"127.0.0.1:17010\"\ninsecure = true\n",
        dir.display()
    );
    Config::parse(Path::new("test.toml"), &text).unwrap()
}

async fn start(dir: &Path) -> (RaftNode, StateMachineStore) {
    let db = storage::open(dir, 1).unwrap();
    let state = StateMachineStore::open(db.clone()).await.unwrap();
    let network = PeerNetwork::new(1, Arc::new(PeerPool::new(Security::Insecure)));
    let config = openraft::Config {
        heartbeat_interval: 20,
        election_timeout_min: 60,
        election_timeout_max: 120,
        ..Default::default()
    }
    .validate()
    .unwrap();
    let raft = RaftNode::new(
        1,
        Arc::new(config),
        network,
        LogStore::new(db, dir).expect("start the log store"),
        state.clone(),
    )
    .await
    .unwrap();
    (raft, state)
}

async fn write(raft: &RaftNode, command: Command) {
    let resp = raft
        .client_write(Proposal {
            command,
            at_ms: 1_000,
            actor: "test".into(),
            reason: String::new(),
        })
        .await
        .unwrap();
    resp.data.unwrap();
}

async fn wait_leader(raft: &RaftNode) {
    raft.wait(Some(Duration::from_secs(10)))
        .current_leader(1, "member 1 leads")
        .await
        .unwrap();
}

fn cp(name: &str, home: &str, host: &str) -> ControlPlaneSpec {
    ControlPlaneSpec {
        name: name.into(),
        home: Some(home.into()),
        dns_name: format!("{name}.ring.test"),
        endpoints: ["a", "b", "c"]
            .iter()
            .map(|m| (m.to_string(), format!("{m}.example:443")))
            .collect(),
        backup: format!("s3://backups/{name}"),
        backups: BTreeMap::new(),
        host: Some(host.into()),
        prefer: Vec::new(),
        tolerance: Default::default(),
        etcd_peers: Default::default(),
    }
}

#[tokio::test]
async fn a_recovered_data_directory_starts_as_a_one_member_ring_with_its_history() {
    let tmp = tempfile::tempdir().unwrap();
    let dir = tmp.path().join("data");
    // The ring's data as member a had it: three members registered, control planes on a and b.
    {
        let (raft, state) = start(&dir).await;
        raft.initialize(BTreeMap::from([(1, MemberNode::from(&spec(1, "a")))]))
            .await
            .unwrap();
        wait_leader(&raft).await;
        write(
            &raft,
            Command::Bootstrap {
                members: vec![spec(1, "a"), spec(2, "b"), spec(3, "c")],
                dns_zone: None,
            },
        )
        .await;
        write(&raft, Command::AddControlPlane(cp("on-a", "b", "a"))).await;
        write(&raft, Command::AddControlPlane(cp("on-b", "a", "b"))).await;
        write(
            &raft,
            Command::SetHealth {
                id: 2,
                health: Health::Healthy,
            },
        )
        .await;
        assert_eq!(state.read(|a| a.state.history.len()), 4);
        raft.shutdown().await.unwrap();
    }

    let config = config(&dir);
    let request = Request {
        actor: "ringd-recover:test@host".into(),
        reason: "zones b and c burned down".into(),
        at_ms: 2_000,
    };
    let before = std::fs::read(dir.join(DB_FILE)).unwrap();
    // A plan that is abandoned changes nothing, byte for byte.
    drop(plan_recover(&config, &request).unwrap());
    assert!(std::fs::read(dir.join(DB_FILE)).unwrap() == before);
    let (db, plan) = plan_recover(&config, &request).unwrap();
    // While planned, the directory is locked: ringd could not start on it, and a second
    // recovery could not work on it at the same time.
    assert!(matches!(storage::open(&dir, 1), Err(OpenError::InUse(_))));
    let second = plan_recover(&config, &request)
        .err()
        .expect("a second recovery waits");
    assert!(
        second.to_string().contains("another `ringd recover`"),
        "{second}"
    );
    assert!(!db.was_repaired(), "ringd stopped cleanly");
    let text = plan.describe(&Timing::loopback());
    for needed in [
        "member a (id 1) alone",
        "b (id 2, zone zone-b), c (id 3, zone zone-c)",
        "stay on a (same host, same epoch): on-a (epoch 1, starting)",
        "on-b (on b, epoch 1 -> 2)",
        "lease 1000 + fence 500 + clock margin 200 ms",
        "History: all 4 events kept",
        "Never start them again with their old data",
    ] {
        assert!(text.contains(needed), "{needed:?} not in:\n{text}");
    }

    // Confirmation: a wrong answer or none changes nothing.
    for answer in ["b\n", "", "A\n"] {
        let mut out = Vec::new();
        let err = plan
            .confirm(&Timing::loopback(), &mut answer.as_bytes(), &mut out)
            .unwrap_err();
        assert!(matches!(err, RecoverError::NotConfirmed(_)), "{err}");
        assert!(
            String::from_utf8(out)
                .unwrap()
                .contains("Type the member name \"a\"")
        );
    }
    assert!(std::fs::read(dir.join(DB_FILE)).unwrap() == before);
    plan.confirm(&Timing::loopback(), &mut "a\n".as_bytes(), &mut Vec::new())
        .unwrap();

    let wal_before = std::fs::read(dir.join(WAL_FILE)).unwrap();
    let (backup, backup_wal) = apply_recover(db, &plan, 2_000).unwrap();
    assert!(
        std::fs::read(&backup).unwrap() == before,
        "the original is kept as it was"
    );
    assert!(backup.ends_with("ring.redb.before-recover-2000"));
    // Its write-ahead file (where its newest entries are) goes with it.
    let backup_wal = backup_wal.expect("the old database recorded a WAL");
    assert!(backup_wal.ends_with("raft.wal.before-recover-2000"));
    assert!(std::fs::read(&backup_wal).unwrap() == wal_before);

    // What is on disk now is a snapshot and nothing else.
    let stored = OfflineDb::open_existing(&dir, 1).unwrap().read().unwrap();
    assert!(stored.entries.is_empty());
    let recovered = stored.snapshot.as_ref().unwrap().0.last_log_id.unwrap();
    assert_eq!(stored.last_purged, Some(recovered));
    assert_eq!(stored.committed, Some(recovered));
    assert!(recovered.leader_id.term > plan.before.last_applied.unwrap().leader_id.term);
    assert_eq!(recovered.index, plan.before.applied_index() + 1);

    // openraft takes it: member a elects itself, the state is there, and new writes commit.
    let (raft, state) = start(&dir).await;
    wait_leader(&raft).await;
    let (members, retired, on_a, on_b, events) = state.read(|a| {
        (
            a.state.members.keys().copied().collect::<Vec<_>>(),
            a.state.retired_ids.clone(),
            a.state.control_planes["on-a"].clone(),
            a.state.control_planes["on-b"].clone(),
            a.state.history.newest(0),
        )
    });
    assert_eq!(members, vec![1]);
    assert_eq!(retired, BTreeSet::from([2, 3]));
    assert_eq!((on_a.host.as_deref(), on_a.epoch), (Some("a"), 1));
    assert_eq!(
        (on_b.host.as_deref(), on_b.epoch, on_b.phase),
        (None, 2, Phase::Unplaced)
    );
    assert!(on_b.fencing.contains("b"));
    assert_eq!(events.len(), 5);
    let last = events.last().unwrap();
    assert_eq!(last.action, "ring.recover");
    assert_eq!(last.actor, "ringd-recover:test@host");
    assert_eq!(last.reason, "zones b and c burned down");
    assert_eq!(last.index, recovered.index);
    assert!(
        last.detail.contains("a(1) is the only member"),
        "{}",
        last.detail
    );
    write(&raft, Command::SetPaused { paused: true }).await;
    let err = raft
        .client_write(Proposal {
            command: Command::AddMember(spec(2, "b")),
            at_ms: 3_000,
            actor: "test".into(),
            reason: String::new(),
        })
        .await
        .unwrap()
        .data
        .unwrap_err();
    assert_eq!(err, crate::core::CommandError::RetiredMemberId(2));
    raft.shutdown().await.unwrap();
}

#[tokio::test]
async fn a_restore_builds_a_new_data_directory_or_nothing() {
    let tmp = tempfile::tempdir().unwrap();
    // A state as a saved file holds it.
    let mut applied = Applied::default();
    let entries = [
        Command::Bootstrap {
            members: vec![spec(1, "a"), spec(2, "b"), spec(3, "c")],
            dns_zone: None,
        },
        Command::AddControlPlane(cp("on-c", "a", "c")),
    ];
    for (i, command) in entries.into_iter().enumerate() {
        let index = i as u64 + 1;
        applied
            .state
            .apply(
                index,
                &Proposal {
                    command,
                    at_ms: 1,
                    actor: "t".into(),
                    reason: String::new(),
                },
            )
            .unwrap();
        applied.last_applied = Some(log_id(7, 2, index));
    }
    let body = crate::raft::state_machine::encode_body(applied).unwrap();
    let file = tmp.path().join("ring.snap");
    file::write(
        &file,
        &FileHeader::for_body(&body, 2, 7, "b (id 2), the leader".into(), 0),
        &body,
    )
    .unwrap();
    let request = Request {
        actor: "ringctl:test@host".into(),
        reason: String::new(),
        at_ms: 5,
    };

    // Into a non-empty directory: refused, nothing touched.
    let busy = tmp.path().join("busy");
    std::fs::create_dir(&busy).unwrap();
    std::fs::write(busy.join("x"), b"x").unwrap();
    let config = config(&busy);
    let err = plan_restore(&config, &file, &busy, &request).unwrap_err();
    assert!(matches!(err, RecoverError::NotEmpty(_)), "{err}");

    // As a member the snapshot does not know: refused.
    let fresh = tmp.path().join("fresh");
    let mut stranger = config.clone();
    stranger.id = 9;
    let err = plan_restore(&stranger, &file, &fresh, &request).unwrap_err();
    assert!(
        err.to_string().contains("not a member of this ring"),
        "{err}"
    );
    assert!(!fresh.exists());

    // Into a new directory: one member, the snapshot's term passed.
    let plan = plan_restore(&config, &file, &fresh, &request).unwrap();
    assert!(
        plan.describe(&Timing::loopback())
            .contains("Every change the ring made after that is lost")
    );
    apply_restore(&plan).unwrap();
    let names: Vec<_> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(!names.iter().any(|n| n.contains("restoring")), "{names:?}");
    let stored = OfflineDb::open_existing(&fresh, 1).unwrap().read().unwrap();
    let at = stored.snapshot.unwrap().0.last_log_id.unwrap();
    assert_eq!((at.leader_id.term, at.index), (8, 3));
    // A second restore into it is refused.
    let err = plan_restore(&config, &file, &fresh, &request).unwrap_err();
    assert!(matches!(err, RecoverError::NotEmpty(_)), "{err}");

    // It starts.
    let (raft, state) = start(&fresh).await;
    wait_leader(&raft).await;
    let on_c = state.read(|a| a.state.control_planes["on-c"].clone());
    assert_eq!((on_c.phase, on_c.epoch), (Phase::Unplaced, 2));
    raft.shutdown().await.unwrap();
}
