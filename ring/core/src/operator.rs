//! The operator's moves (`ringctl member drain`, `switchover`, `failover`), planned: which
//! commands a request turns into, or why it cannot be done. Pure: the Admin service only
//! converts the request, calls [`plan`] on its applied state and proposes what comes back.

use super::NodeId;
use super::command::Command;
use super::control_plane::MoveKind;
use super::controller::{PlanError as MovePlanError, Policy, plan_moves};
use super::member::Health;
use super::state::RingState;

/// What the operator asks for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum OperatorMove {
    /// Cordon member `member` (an id or a name) and move every control plane it hosts.
    Drain {
        /// The member.
        member: String,
    },
    /// Move `control_plane` off its host, which must be healthy to hand over (its final
    /// snapshot carries every acknowledged write).
    Switchover {
        /// The control plane.
        control_plane: String,
    },
    /// Move `control_plane` off its host whatever the host's state.
    Failover {
        /// The control plane.
        control_plane: String,
    },
}

/// One move of a plan, as the operator sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedMove {
    /// The control plane.
    pub control_plane: String,
    /// Its host now (empty when it has none).
    pub from: String,
    /// Its host after the move.
    pub to: String,
    /// The epoch the move gives it.
    pub epoch: u64,
}

/// What a request turns into.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct OperatorPlan {
    /// The cordon a drain proposes first (`None` when the member is cordoned already, and for
    /// the other moves).
    pub cordon: Option<Command>,
    /// The moves to propose, in order.
    pub moves: Vec<Command>,
    /// The same moves, as the operator sees them.
    pub planned: Vec<PlannedMove>,
}

/// Why a request cannot be planned.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum OperatorError {
    /// A drain without a member.
    #[error("a member id or name is needed")]
    NoMember,
    /// No member with this id or name.
    #[error("unknown member {0:?}")]
    UnknownMember(String),
    /// No control plane with this name.
    #[error("unknown control plane {0:?}")]
    UnknownControlPlane(String),
    /// A switchover whose host cannot hand over.
    #[error(
        "the host of {control_plane} ({}) is not healthy: a switchover needs it to hand over; use failover",
        host.as_deref().unwrap_or("none")
    )]
    HostNotHealthy {
        /// The control plane.
        control_plane: String,
        /// Its host, if any.
        host: Option<String>,
    },
    /// A control plane of the request cannot move (nobody can take it, or the move is
    /// refused).
    #[error(transparent)]
    Plan(#[from] MovePlanError),
}

/// Plans `request` on `state`: each control plane to `to`, or where placement chooses.
pub fn plan(
    state: &RingState,
    request: &OperatorMove,
    to: Option<&str>,
    policy: &Policy,
    at_ms: u64,
) -> Result<OperatorPlan, OperatorError> {
    let (kind, names, cordon) = match request {
        OperatorMove::Drain { member } => {
            if member.is_empty() {
                return Err(OperatorError::NoMember);
            }
            let target = state
                .member_by_ref(member)
                .ok_or_else(|| OperatorError::UnknownMember(member.clone()))?;
            let cordon = (!target.cordoned).then_some(Command::Cordon {
                id: target.id,
                cordoned: true,
            });
            (MoveKind::Drain, state.hosted_by(&target.name), cordon)
        }
        OperatorMove::Switchover { control_plane } | OperatorMove::Failover { control_plane } => {
            let host = state
                .control_planes
                .get(control_plane)
                .map(|cp| cp.host.clone())
                .ok_or_else(|| OperatorError::UnknownControlPlane(control_plane.clone()))?;
            let kind = if matches!(request, OperatorMove::Switchover { .. }) {
                let healthy = host.as_deref().is_some_and(|h| {
                    state
                        .member_by_name(h)
                        .is_some_and(|m| m.health == Health::Healthy)
                });
                if !healthy {
                    return Err(OperatorError::HostNotHealthy {
                        control_plane: control_plane.clone(),
                        host,
                    });
                }
                MoveKind::Switchover
            } else {
                MoveKind::Forced
            };
            (kind, vec![control_plane.clone()], None)
        }
    };
    let moves = plan_moves(state, &names, to, kind, policy, at_ms)?;
    let planned = moves
        .iter()
        .filter_map(|c| match c {
            Command::MoveControlPlane {
                name, to, epoch, ..
            } => Some(PlannedMove {
                control_plane: name.clone(),
                from: state
                    .control_planes
                    .get(name)
                    .and_then(|cp| cp.host.clone())
                    .unwrap_or_default(),
                to: to.clone().unwrap_or_default(),
                epoch: *epoch,
            }),
            _ => None,
        })
        .collect();
    Ok(OperatorPlan {
        cordon,
        moves,
        planned,
    })
}

/// Why leadership cannot be handed over.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TransferError {
    /// This member is the only voter.
    #[error("there is no other voter to hand leadership to")]
    NoOtherVoter,
    /// The requested member does not vote.
    #[error("member {name} ({id}) is not a voter; only voters can lead")]
    NotAVoter {
        /// Its name.
        name: String,
        /// Its id.
        id: NodeId,
    },
}

/// The voter leadership goes to (`ringctl leader transfer`): `requested` (its id and name),
/// which must be a voter, or else the other voter whose log reaches furthest (`matched` is
/// the leader's view of each member's last replicated index), so the election is quickest.
/// `me` itself may be returned when requested: nothing to do.
pub fn transfer_target(
    me: NodeId,
    voters: &[NodeId],
    matched: impl Fn(NodeId) -> Option<u64>,
    requested: Option<(NodeId, &str)>,
) -> Result<NodeId, TransferError> {
    match requested {
        Some((id, _)) if voters.contains(&id) => Ok(id),
        Some((id, name)) => Err(TransferError::NotAVoter {
            name: name.to_string(),
            id,
        }),
        None => voters
            .iter()
            .copied()
            .filter(|id| *id != me)
            .max_by_key(|id| matched(*id))
            .ok_or(TransferError::NoOtherVoter),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::testing::{Ring, policy};

    /// The test ring (a..d, healthy) with `cp1` hosted on a.
    fn ring() -> Ring {
        let mut ring = Ring::new();
        ring.add("cp1", None, "a");
        ring
    }

    #[test]
    fn a_drain_cordons_first_and_moves_everything_off_the_member() {
        let ring = ring();
        let drain = OperatorMove::Drain { member: "a".into() };
        let plan = plan(&ring.state, &drain, None, &policy(), 2_000).unwrap();
        assert_eq!(
            plan.cordon,
            Some(Command::Cordon {
                id: 1,
                cordoned: true
            })
        );
        assert_eq!(plan.moves.len(), 1);
        assert_eq!(plan.planned[0].control_plane, "cp1");
        assert_eq!(plan.planned[0].from, "a");
        assert_ne!(plan.planned[0].to, "a");
        assert_eq!(plan.planned[0].epoch, 2);
    }

    #[test]
    fn a_switchover_needs_a_healthy_host_and_a_failover_does_not() {
        let mut ring = ring();
        ring.apply(Command::SetHealth {
            id: 1,
            health: Health::Suspect,
        })
        .unwrap();
        let switchover = OperatorMove::Switchover {
            control_plane: "cp1".into(),
        };
        let err = plan(&ring.state, &switchover, None, &policy(), 2_000).unwrap_err();
        assert_eq!(
            err.to_string(),
            "the host of cp1 (a) is not healthy: a switchover needs it to hand over; use failover"
        );
        let failover = OperatorMove::Failover {
            control_plane: "cp1".into(),
        };
        let plan = plan(&ring.state, &failover, Some("c"), &policy(), 2_000).unwrap();
        assert_eq!(plan.cordon, None);
        assert!(matches!(
            &plan.moves[..],
            [Command::MoveControlPlane { kind: MoveKind::Forced, to: Some(to), .. }] if to == "c"
        ));
    }

    #[test]
    fn unknown_names_and_refused_moves_say_why() {
        let ring = ring();
        let policy = policy();
        let err = |request: OperatorMove, to: Option<&str>| {
            plan(&ring.state, &request, to, &policy, 2_000).unwrap_err()
        };
        assert_eq!(
            err(
                OperatorMove::Drain {
                    member: String::new()
                },
                None
            ),
            OperatorError::NoMember
        );
        assert_eq!(
            err(OperatorMove::Drain { member: "z".into() }, None),
            OperatorError::UnknownMember("z".into())
        );
        assert_eq!(
            err(
                OperatorMove::Failover {
                    control_plane: "nope".into()
                },
                None
            ),
            OperatorError::UnknownControlPlane("nope".into())
        );
        let refused = err(
            OperatorMove::Switchover {
                control_plane: "cp1".into(),
            },
            Some("a"),
        );
        assert_eq!(
            refused.to_string(),
            "cannot move cp1: control plane cp1 is already hosted on a"
        );
    }

    #[test]
    fn leadership_goes_to_the_requested_voter_or_the_one_furthest_along() {
        let matched = |id: NodeId| match id {
            2 => Some(10),
            3 => Some(12),
            _ => None,
        };
        assert_eq!(transfer_target(1, &[1, 2, 3], matched, None), Ok(3));
        assert_eq!(
            transfer_target(1, &[1, 2, 3], matched, Some((2, "b"))),
            Ok(2)
        );
        assert_eq!(
            transfer_target(1, &[1, 2, 3], matched, Some((4, "d"))),
            Err(TransferError::NotAVoter {
                name: "d".into(),
                id: 4
            })
        );
        assert_eq!(
            transfer_target(1, &[1], matched, None),
            Err(TransferError::NoOtherVoter)
        );
    }
}
