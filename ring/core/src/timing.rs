//! Raft and failure-detection timings: the numbers every interval of the ring derives from.
//!
//! Part of `ringd.toml` (`[timing]`), and of the deterministic core because the controller's
//! judgement of a member's health ([`crate::health::judge`]) and the simulation are functions
//! of them. DESIGN.md rule 2: `member_lost_ms > lease_ms + fence_ms + clock_margin_ms`; `ringd`
//! refuses a configuration that breaks it.
//!
//! Every interval the ring derives from these numbers is a method here, named with its unit,
//! so that one place says how, and with which floor: the agent's renewals, the etcd driver's
//! health checks and self-fencing, the leader's duties, the waits of the Admin API.

use serde::{Deserialize, Serialize};

/// Raft and failure-detection timings, in milliseconds.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct Timing {
    /// The longest a follower goes without a message from a healthy leader (its heartbeats come
    /// more often: `ringd` sets openraft's interval below this, see ARCHITECTURE.md, Failure
    /// detection).
    pub heartbeat_ms: u64,
    /// Lower bound of the randomized election timeout.
    pub election_timeout_min_ms: u64,
    /// Upper bound of the randomized election timeout.
    pub election_timeout_max_ms: u64,
    /// A member the leader has not heard from for this long is `suspect`.
    pub member_suspect_ms: u64,
    /// A member the leader has not heard from for this long is `lost`, and its control planes
    /// move. Must exceed `lease_ms + fence_ms + clock_margin_ms` (DESIGN.md rule 2).
    pub member_lost_ms: u64,
    /// How long a member may serve its control planes after the leader last confirmed them,
    /// counted from before it asked (DESIGN.md rule 1).
    pub lease_ms: u64,
    /// How long a member has, at most, to stop a control plane once its lease ran out.
    pub fence_ms: u64,
    /// Allowance for clocks running at different rates between members.
    pub clock_margin_ms: u64,
}

impl Default for Timing {
    /// Timings for members in separate zones (see DESIGN.md).
    fn default() -> Self {
        Self {
            heartbeat_ms: 250,
            election_timeout_min_ms: 1_000,
            election_timeout_max_ms: 2_000,
            member_suspect_ms: 4_000,
            member_lost_ms: 8_000,
            lease_ms: 4_000,
            fence_ms: 2_000,
            clock_margin_ms: 1_000,
        }
    }
}

impl Timing {
    /// Timings for a ring on one machine (tests, the demo).
    pub fn loopback() -> Self {
        Self {
            heartbeat_ms: 50,
            election_timeout_min_ms: 150,
            election_timeout_max_ms: 300,
            member_suspect_ms: 1_000,
            member_lost_ms: 2_000,
            lease_ms: 1_000,
            fence_ms: 500,
            clock_margin_ms: 200,
        }
    }
}

/// Intervals derived from the timings, in milliseconds. Floors keep loopback timings (tests,
/// the demo) from turning into busy loops.
impl Timing {
    /// How often a member asks the leader to renew its lease: four times per lease (so three
    /// renewals may fail before it runs out), at least every 10 ms.
    pub fn renew_interval_ms(&self) -> u64 {
        (self.lease_ms / 4).max(10)
    }

    /// How long one renewal may take before the agent gives up on it: half a lease.
    pub fn renew_timeout_ms(&self) -> u64 {
        self.lease_ms / 2
    }

    /// How long a renewal waits for its answer before the agent sends a copy of it on another
    /// connection to the leader: a quarter of the renewal interval, at least 10 ms. One lost
    /// packet stalls a TCP connection for at least its 200 ms retransmission timeout (and more
    /// after each further loss), which a lossy link makes common; a copy on another connection
    /// usually gets through meanwhile. At rest an answer comes within milliseconds, so copies
    /// are sent only under loss or load. Eight of these make a renewal's timeout
    /// ([`Timing::renew_timeout_ms`]): one copy per connection the agent keeps to the leader.
    pub fn renew_hedge_ms(&self) -> u64 {
        (self.renew_interval_ms() / 4).max(10)
    }

    /// How long a freshly started `ringd` waits before its first renewal when guards it cannot
    /// reach may still run: the longest lease (an announced restart's) and the fence time, so
    /// that they have stopped serving.
    pub fn start_fence_wait_ms(&self) -> u64 {
        self.lease_ms.max(self.restart_lease_ms()) + self.fence_ms
    }

    /// The lease a leader grants with a member's last renewal before it restarts (an announced
    /// restart: ring's `RenewRequest::restarting`): the longest any lease may be, one millisecond
    /// under `member_lost_ms - fence_ms - clock_margin_ms` (DESIGN.md rule 2 holds for it as for
    /// every lease, also against a leader elected later that knows nothing of the announcement),
    /// and never shorter than `lease_ms`.
    pub fn restart_lease_ms(&self) -> u64 {
        self.member_lost_ms
            .saturating_sub(self.fence_ms)
            .saturating_sub(self.clock_margin_ms)
            .saturating_sub(1)
            .max(self.lease_ms)
    }

    /// How long a leader that heard a member announce its restart does not judge it lost
    /// (suspect at most): three times `member_lost_ms`. Only a delay of the failover, so
    /// always safe; a member that does not come back within it is handled as any silent one.
    pub fn restart_grace_ms(&self) -> u64 {
        self.member_lost_ms.saturating_mul(3)
    }

    /// How long before an unrenewed lease runs out a host stops a workload itself, so that its
    /// final snapshot is taken while etcd still runs: a quarter of the lease, at least 50 ms.
    pub fn self_fence_margin_ms(&self) -> u64 {
        (self.lease_ms / 4).max(50)
    }

    /// How often a workload's health is checked: a quarter of the lease, at least 50 ms.
    pub fn workload_health_interval_ms(&self) -> u64 {
        (self.lease_ms / 4).max(50)
    }

    /// Longest one request of a driver to its workload may take: half a lease, at least
    /// 100 ms.
    pub fn workload_request_timeout_ms(&self) -> u64 {
        (self.lease_ms / 2).max(100)
    }

    /// How often the leader's duties run: every two heartbeats, at least every 20 ms.
    pub fn duties_interval_ms(&self) -> u64 {
        (self.heartbeat_ms * 2).max(20)
    }

    /// How long a request waits for a leader to be known (or to change): four of the longest
    /// election timeouts.
    pub fn leader_wait_ms(&self) -> u64 {
        self.election_timeout_max_ms * 4
    }

    /// How long a linearizable read may take to learn the leader's read index and apply up to
    /// it before the member answers from its own state instead, saying so: two of the longest
    /// election timeouts (a read during an election waits for it, once).
    pub fn read_index_wait_ms(&self) -> u64 {
        self.election_timeout_max_ms * 2
    }

    /// How long a leadership transfer may take: ten of the longest election timeouts.
    pub fn leader_transfer_wait_ms(&self) -> u64 {
        self.election_timeout_max_ms * 10
    }

    /// A leader not heard from for this long is reported as a problem: two of the longest
    /// election timeouts.
    pub fn leader_silence_ms(&self) -> u64 {
        self.election_timeout_max_ms * 2
    }

    /// What an operator should know about these timings before running them across zones
    /// (`ringd --check-config` prints these, `ringd` logs them at start); each from a
    /// measurement in chaos/results/ (deploy/README.md, "Tuning the timings"). Empty for the
    /// defaults.
    pub fn warnings(&self) -> Vec<String> {
        let mut warnings = Vec::new();
        if self.lease_ms < 2_000 {
            warnings.push(format!(
                "timing.lease_ms = {} is under 2000: a host fences its control planes when its \
                 renewals fail for {} ms (a cut of its links, or 50% packet loss: writes refused \
                 for 6.6 s, measured with a 1000 ms lease); fine on one machine, fragile across \
                 zones",
                self.lease_ms,
                self.lease_ms
                    .saturating_sub(self.self_fence_margin_ms() + self.renew_interval_ms())
            ));
        }
        let floor = self.lease_ms + self.fence_ms + self.clock_margin_ms;
        if self.member_lost_ms > 2 * floor {
            warnings.push(format!(
                "timing.member_lost_ms = {} is more than twice what safety needs \
                 (lease_ms + fence_ms + clock_margin_ms = {floor}): the time from a zone's loss \
                 to its control planes serving elsewhere is member_lost_ms plus about 6%",
                self.member_lost_ms
            ));
        }
        if self.election_timeout_max_ms * 2 > self.member_lost_ms {
            warnings.push(format!(
                "timing.election_timeout_max_ms = {} is more than half of member_lost_ms ({}): \
                 after the leader's zone is lost, the new leader may be elected too late to move \
                 its control planes at member_lost_ms",
                self.election_timeout_max_ms, self.member_lost_ms
            ));
        }
        warnings
    }

    /// How long one probe of a peer may take (a member that lost the leader asks around, a
    /// founder with an empty directory asks the others): the longest election timeout, at
    /// least 500 ms.
    pub fn probe_timeout_ms(&self) -> u64 {
        self.election_timeout_max_ms.max(500)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn derived_intervals_follow_the_timings_with_their_floors() {
        let production = Timing::default();
        assert_eq!(production.restart_lease_ms(), 4_999);
        assert_eq!(production.restart_grace_ms(), 24_000);
        assert_eq!(Timing::loopback().restart_lease_ms(), 1_299);
        for t in [production.clone(), Timing::loopback()] {
            // Rule 2 holds for the restart lease too.
            assert!(t.member_lost_ms > t.restart_lease_ms() + t.fence_ms + t.clock_margin_ms);
            assert!(t.restart_lease_ms() >= t.lease_ms);
        }
        assert_eq!(production.renew_interval_ms(), 1_000);
        assert_eq!(production.renew_timeout_ms(), 2_000);
        assert_eq!(production.self_fence_margin_ms(), 1_000);
        assert_eq!(production.duties_interval_ms(), 500);
        assert_eq!(production.leader_wait_ms(), 8_000);
        let tiny = Timing {
            lease_ms: 20,
            heartbeat_ms: 1,
            election_timeout_max_ms: 10,
            ..Timing::loopback()
        };
        assert_eq!(tiny.renew_interval_ms(), 10);
        assert_eq!(tiny.self_fence_margin_ms(), 50);
        assert_eq!(tiny.workload_health_interval_ms(), 50);
        assert_eq!(tiny.workload_request_timeout_ms(), 100);
        assert_eq!(tiny.duties_interval_ms(), 20);
        assert_eq!(tiny.probe_timeout_ms(), 500);
    }

    #[test]
    fn warnings_name_what_was_measured_to_hurt() {
        assert!(Timing::default().warnings().is_empty(), "the defaults");
        let loopback = Timing::loopback().warnings();
        assert_eq!(loopback.len(), 1, "{loopback:?}");
        assert!(
            loopback[0].contains("timing.lease_ms = 1000"),
            "{loopback:?}"
        );
        assert!(loopback[0].contains("fail for 500 ms"), "{loopback:?}");
        let slow = Timing {
            member_lost_ms: 30_000,
            ..Timing::default()
        };
        assert!(slow.warnings()[0].contains("more than twice"));
        let late_election = Timing {
            election_timeout_min_ms: 4_000,
            election_timeout_max_ms: 5_000,
            member_suspect_ms: 5_000,
            ..Timing::default()
        };
        assert!(late_election.warnings()[0].contains("more than half"));
        let tiny = Timing {
            lease_ms: 40,
            ..Timing::loopback()
        };
        assert!(tiny.warnings()[0].contains("fail for 0 ms"), "no underflow");
    }
}
