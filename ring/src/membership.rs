//! Changes to the Raft configuration, serialized.
//!
//! Both the Admin service (an operator's `member add|promote|remove`) and the leader's duties
//! (finishing interrupted operations) change the Raft configuration. openraft refuses a change
//! based on a configuration that moved underneath it, so every change goes through one
//! [`MembershipChanger`]: it holds a lock for the duration of the change and re-reads the
//! configuration under the lock, which also makes each change idempotent (asking twice for the
//! same result changes nothing the second time).

use std::sync::Arc;

use openraft::ChangeMembers;
use openraft::type_config::async_runtime::watch::WatchReceiver;
use tokio::sync::Mutex;

use crate::raft::{MemberNode, NodeId, RaftNode};

/// A Raft configuration change failed.
#[derive(Debug, thiserror::Error)]
#[error("raft configuration change failed: {0}")]
pub struct ChangeError(String);

/// Serializes Raft configuration changes of one member (they only succeed on the leader).
#[derive(Clone)]
pub struct MembershipChanger {
    raft: RaftNode,
    lock: Arc<Mutex<()>>,
}

/// Where a node is in the current Raft configuration.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Place {
    Absent,
    Learner,
    Voter,
}

impl MembershipChanger {
    /// A changer for `raft`.
    pub fn new(raft: RaftNode) -> Self {
        Self {
            raft,
            lock: Arc::new(Mutex::new(())),
        }
    }

    fn place(&self, id: NodeId) -> Place {
        let metrics = self.raft.metrics().borrow_watched().clone();
        let membership = metrics.membership_config.membership();
        if membership.voter_ids().any(|v| v == id) {
            Place::Voter
        } else if membership.learner_ids().any(|l| l == id) {
            Place::Learner
        } else {
            Place::Absent
        }
    }

    /// Adds `id` as a learner (no-op if it is in the configuration). Returns the log index of
    /// the change, if one was made.
    pub async fn add_learner(
        &self,
        id: NodeId,
        node: MemberNode,
    ) -> Result<Option<u64>, ChangeError> {
        let _guard = self.lock.lock().await;
        if self.place(id) != Place::Absent {
            return Ok(None);
        }
        let resp = self
            .raft
            .add_learner(id, node, false)
            .await
            .map_err(|e| ChangeError(e.to_string()))?;
        Ok(Some(resp.log_id.index))
    }

    /// Makes learner `id` a voter (no-op if it is one).
    pub async fn promote(&self, id: NodeId) -> Result<Option<u64>, ChangeError> {
        let _guard = self.lock.lock().await;
        match self.place(id) {
            Place::Voter => return Ok(None),
            Place::Absent => {
                return Err(ChangeError(format!(
                    "member {id} is not in the Raft configuration yet (has it been added?)"
                )));
            }
            Place::Learner => {}
        }
        let resp = self
            .raft
            .change_membership(ChangeMembers::AddVoterIds([id].into()), false)
            .await
            .map_err(|e| ChangeError(e.to_string()))?;
        Ok(Some(resp.log_id.index))
    }

    /// Removes `id` from the configuration, as voter or learner (no-op if absent).
    pub async fn remove(&self, id: NodeId) -> Result<Option<u64>, ChangeError> {
        let _guard = self.lock.lock().await;
        let change = match self.place(id) {
            Place::Absent => return Ok(None),
            Place::Voter => ChangeMembers::RemoveVoters([id].into()),
            Place::Learner => ChangeMembers::RemoveNodes([id].into()),
        };
        let resp = self
            .raft
            .change_membership(change, false)
            .await
            .map_err(|e| ChangeError(e.to_string()))?;
        Ok(Some(resp.log_id.index))
    }
}
