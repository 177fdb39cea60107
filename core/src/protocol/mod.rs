//! The sans-io protocol core: the whole membership protocol of a silo as state
//! machines and pure functions. No sockets, no clocks, no actors: callers feed events
//! with the current time and get actions back; randomness is injected (pattern:
//! `foca`'s SWIM core). The actix agents (`agents/`) only execute the actions.
//!
//! - [`machine`]: [`SiloMachine`], the silo's state machine: events in, actions out;
//!   it composes the pieces below;
//! - [`probe`]: the probe cycle of one target (pings, indirect probe, suspicion);
//! - [`probe_timeout`]: the adaptive probe timeout from round-trip samples;
//! - [`targets`]: which silos to probe (several consistent-hash rings + suspects);
//! - [`votes`]: suspect / declare-dead decisions with clock-skew tolerant freshness;
//! - [`join`]: what a joining silo must write (older generations Dead);
//! - [`refresh`]: coalesced table reads;
//! - [`cleanup`]: the defunct-row cutoff;
//! - [`health`]: the Lifeguard-style local health score;
//! - [`reach`]: whether this silo reaches a majority, which a vote on probe
//!   evidence needs (network partitions);
//! - [`clock`]: this silo's clock offset from its peers, from the probes'
//!   timestamps, against the cluster's `max_clock_offset`.

pub mod cleanup;
pub mod clock;
pub mod health;
pub mod join;
pub mod machine;
pub mod probe;
pub mod probe_timeout;
pub mod reach;
pub mod refresh;
pub mod targets;
pub mod votes;

pub use cleanup::lost_row_grace;
pub use clock::{ClockOffsets, ClockReport, ClockSample, StepWatch};
pub use machine::{
    gossip_fan_out, gossip_refresh_interval, gossip_refresh_interval_cap, Action, Event, RowWrite,
    SiloMachine, StopReason, Timer,
};
pub use probe::{IndirectOutcome, PingOutcome, SuspectReason};

use std::time::Duration;

use crate::{ClusterMembershipOptions, MembershipEntry, Timestamp};

/// Longest topic of a notice between silos (a probe-port message a service
/// sends to a peer: reminder notices, release hints), in bytes: 64.
pub const MAX_NOTICE_TOPIC: usize = 64;
/// Longest body of a notice between silos, in bytes: 4096. A larger one is
/// refused by the sender.
pub const MAX_NOTICE_BODY: usize = 4096;

/// Whether `entry`'s IAmAlive is stale at `now`: older than
/// `i_am_alive_publish_period * num_missed_table_i_am_alive_limit` (Orleans
/// `NumMissedTableIAmAliveLimit`).
pub fn is_i_am_alive_stale(
    entry: &MembershipEntry,
    now: Timestamp,
    options: &ClusterMembershipOptions,
) -> bool {
    let limit = options
        .i_am_alive_publish_period
        .saturating_mul(options.num_missed_table_i_am_alive_limit);
    now.saturating_duration_since(entry.last_alive()) > limit
}

/// Whether `entry` is a silo stuck in Joining: Joining (or Created) for longer than
/// `max_join_attempt_time` since its start.
pub fn is_stuck_joining(entry: &MembershipEntry, now: Timestamp, options: &ClusterMembershipOptions) -> bool {
    matches!(
        entry.status,
        crate::SiloStatus::Joining | crate::SiloStatus::Created
    ) && now.saturating_duration_since(entry.start_time) > options.max_join_attempt_time
}

/// Exponential backoff with full jitter: a delay in `[0, min(cap, base * 2^attempt)]`
/// chosen by `unit` in `[0, 1)` (the caller's random number).
pub fn backoff_delay(attempt: u32, base: Duration, cap: Duration, unit: f64) -> Duration {
    let exp = base.saturating_mul(1u32 << attempt.min(16));
    let ceiling = exp.min(cap);
    ceiling.mul_f64(unit.clamp(0.0, 1.0))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backoff_grows_and_is_capped() {
        let b = Duration::from_millis(10);
        let cap = Duration::from_secs(1);
        assert_eq!(backoff_delay(0, b, cap, 1.0), Duration::from_millis(10));
        assert_eq!(backoff_delay(3, b, cap, 1.0), Duration::from_millis(80));
        assert_eq!(backoff_delay(30, b, cap, 1.0), cap);
        assert_eq!(backoff_delay(3, b, cap, 0.0), Duration::ZERO);
        assert_eq!(backoff_delay(3, b, cap, 0.5), Duration::from_millis(40));
    }
}
