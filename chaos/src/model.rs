//! What a chaos run records and reports: the timeline of events, the clients' view, and the
//! numbers computed from them. Plain data, serialized as the run's JSON.

use serde::{Deserialize, Serialize};

/// One thing that happened during a run, on the run's clock (ms since the run started).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Event {
    /// When, in ms since the run started.
    pub at_ms: u64,
    /// What kind: `fault` (the harness broke something), `heal` (it repaired it), `ring` (the
    /// ring did something: a leader elected, a member judged lost, a control plane moved or
    /// serving), `dns` (a name changed), `client` (a client's first write after an outage),
    /// `check` (an expected outcome verified or violated).
    pub kind: String,
    /// The zone or control plane it concerns, if any.
    pub subject: String,
    /// In words.
    pub detail: String,
}

/// What one client saw of one control plane.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClientStats {
    /// The control plane.
    pub control_plane: String,
    /// Writes attempted.
    pub attempted: u64,
    /// Writes acknowledged.
    pub acknowledged: u64,
    /// Acknowledged writes missing when the control plane was read after the run.
    pub lost: u64,
    /// Of the lost ones, those acknowledged before the newest snapshot the restore could use
    /// (must be 0: a loss is allowed only after the last snapshot).
    pub lost_before_snapshot: u64,
    /// Of the lost ones, those acknowledged more than one delta period (plus its upload) before
    /// the fault: the delta snapshots must hold them (must be 0).
    #[serde(default)]
    pub lost_before_delta_period: u64,
    /// Writes acknowledged by a host after another host had taken over (split brain; must be
    /// 0).
    pub split_brain: u64,
    /// The longest time without an acknowledged write, ms.
    pub longest_gap_ms: u64,
}

/// The numbers of one run.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Measures {
    /// Fault to the lost member judged `lost` by the ring, ms (none if it never was).
    pub detect_ms: Option<u64>,
    /// Fault to a new leader, ms (none when the leader survived).
    pub elect_ms: Option<u64>,
    /// Fault to the first write through the DNS name acknowledged by the new host, ms (the
    /// largest over the moved control planes; none when nothing had to move).
    pub rto_ms: Option<u64>,
    /// Acknowledged writes missing afterwards, over all control planes.
    pub lost_writes: u64,
    /// Of those, the writes acknowledged more than a delta period (plus its upload) before the
    /// fault, over all control planes (must be 0).
    #[serde(default)]
    pub lost_before_delta_period: u64,
    /// The data-loss window the ring reported for the migrations, ms (the largest).
    pub data_loss_window_ms: Option<u64>,
    /// Writes acknowledged by an old host after the new one took over, over all control planes.
    pub split_brain_writes: u64,
    /// Zone-tolerant control planes in a ring with spare zones: fault to every etcd cluster
    /// whole again without the lost member (replaced on a spare), ms.
    #[serde(default)]
    pub etcd_repair_ms: Option<u64>,
    /// The lossy-link scenario's phases, and what the ring did in each.
    #[serde(default)]
    pub loss_phases: Vec<LossPhase>,
    /// The Admin API clients' history of the control-plane registry, checked for
    /// linearizability.
    #[serde(default)]
    pub registry: Option<RegistryCheck>,
    /// Rolling restarts and upgrades: how many of the etcds running before were another
    /// process after (none for other scenarios).
    #[serde(default)]
    pub etcd_restarts: Option<u64>,
}

/// What the linearizability check of the Admin API clients' history covered.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegistryCheck {
    /// Operations checked (reads and writes, over all registers).
    pub ops_checked: u64,
    /// Of those, writes and linearizable reads.
    pub writes: u64,
    pub reads: u64,
    /// Writes whose outcome the client could not know (timed out, connection broken): checked
    /// as "took effect at some time after their invocation, or never".
    pub unknown_writes: u64,
    /// Writes certainly not applied (refused as retry-safe, or never sent), not checked.
    pub not_applied: u64,
    /// Reads answered stale (the member could not linearize them and said so), not checked.
    pub stale_reads: u64,
    /// Reads that failed, not checked.
    pub failed_reads: u64,
    /// Registers (control planes) checked, and the search's states over all of them.
    pub registers: u64,
    pub states: u64,
}

/// One phase of the lossy-link scenario: what the victim zone's links did for a while, and
/// what the ring did meanwhile.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct LossPhase {
    /// What the links did: `30% loss` or `cut for 750 ms`.
    pub what: String,
    /// When it began and ended, ms since the run started.
    pub start_ms: u64,
    /// See `start_ms`.
    pub end_ms: u64,
    /// Leader changes seen.
    pub leader_changes: u64,
    /// Members judged other than healthy, as `name health`, each once.
    pub judged: Vec<String>,
    /// Control planes that moved to another epoch.
    pub moved: Vec<String>,
    /// The longest time a client went without an acknowledged write within the phase, ms.
    pub longest_gap_ms: u64,
}

/// One run of one scenario.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Run {
    /// The scenario's name.
    pub scenario: String,
    /// Which run of the scenario (1-based).
    pub run: u32,
    /// Wall-clock start, Unix ms.
    pub started_unix_ms: u64,
    /// How long the run took, ms.
    pub duration_ms: u64,
    /// The numbers.
    pub measures: Measures,
    /// Per control plane, what the clients saw.
    pub clients: Vec<ClientStats>,
    /// The timeline, in order.
    pub events: Vec<Event>,
    /// Expected outcomes that did not hold (empty when the run passed).
    pub failures: Vec<String>,
}

impl Run {
    /// Whether every expected outcome held.
    pub fn passed(&self) -> bool {
        self.failures.is_empty()
    }
}
