//! The held-shards publication: which shards a silo holds, at which epoch,
//! and until when it may act as their holder ([`Held::epoch_at`]).
//!
//! Pure: no I/O; the clocks are read by the caller.

use crate::Timestamp;

/// The shards a silo holds and keeps (not releasing), each with the epoch it
/// acquired it at: shard -> epoch.
pub type HeldMap = std::collections::BTreeMap<u32, u64>;

/// What a silo holds, as the service that runs its shard leases publishes
/// it (the reminder service's `Reminders::held_shards`): what its tenants
/// (actor hosts, state writes) check before they act as a shard's holder.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Held {
    /// The shards held and kept, each with its epoch.
    pub shards: HeldMap,
    /// Until when (UTC ms) the silo may act as their holder: its last
    /// confirmation of its own membership row Active plus the lease period
    /// (lease fencing, the rule that stops a silo declared Dead before its
    /// successor takes over). `None`: not confirmed yet, or the service
    /// stopped. After it, the silo holds nothing, whatever `shards` says.
    pub confirmed_until: Option<Timestamp>,
    /// Shards taken over from a silo declared Dead, and the takeover time
    /// (UTC ms) before which the silo does not act as their holder: the Dead
    /// holder stopped by then (lease fencing), so two silos never act on one
    /// shard at once (the reminders' rule 3).
    pub not_before: std::collections::BTreeMap<u32, Timestamp>,
    /// Shards being released whose release waits for actor hosts (shard ->
    /// the epoch released), while it waits: a level, not an event, so a
    /// watch that coalesces changes still shows each one. A host reports
    /// `host_drained` once per entry, after its activations of it ended.
    pub releasing: HeldMap,
    /// `confirmed_until` and `not_before` again, as deadlines on the service
    /// clock's [`monotonic`](crate::Clock::monotonic) time (by
    /// default `CLOCK_BOOTTIME`), which a step of the wall clock does not
    /// move: a clock stepped back right after a confirmation cannot stretch
    /// it (issue 72). The service sets them when it publishes; `None` where
    /// nothing does (the simulation): the wall-clock deadlines alone count
    /// then.
    pub monotonic: Option<MonotonicDeadlines>,
}

/// [`Held`]'s deadlines on a monotonic clock
/// ([`Clock::monotonic`](crate::Clock::monotonic), a duration since
/// its origin).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MonotonicDeadlines {
    /// Until when the silo may act as the holder: [`Held::confirmed_until`].
    pub confirmed_until: Option<std::time::Duration>,
    /// Per shard taken over, the time before which it does not act as the
    /// holder: [`Held::not_before`].
    pub not_before: std::collections::BTreeMap<u32, std::time::Duration>,
}

impl MonotonicDeadlines {
    /// `held`'s wall-clock deadlines moved onto the monotonic clock, given
    /// one reading of both clocks taken together: wall time `now` (UTC ms)
    /// at monotonic time `monotonic`.
    pub fn of(held: &Held, now: Timestamp, monotonic: std::time::Duration) -> Self {
        let on = |t: Timestamp| {
            if t >= now {
                monotonic.saturating_add(t.saturating_duration_since(now))
            } else {
                monotonic.saturating_sub(now.saturating_duration_since(t))
            }
        };
        MonotonicDeadlines {
            confirmed_until: held.confirmed_until.map(on),
            not_before: held.not_before.iter().map(|(k, t)| (*k, on(*t))).collect(),
        }
    }
}

impl Held {
    /// The epoch `shard` is held at, if held at wall time `now` (UTC ms)
    /// and, when [`monotonic`](Held::monotonic) deadlines are set, at
    /// monotonic time `monotonic` too: both clocks must agree, so a step of
    /// either one only shortens the hold.
    pub fn epoch_at(&self, shard: u32, now: Timestamp, monotonic: std::time::Duration) -> Option<u64> {
        let wall = self.confirmed_until.is_some_and(|u| now < u)
            && self.not_before.get(&shard).is_none_or(|t| now >= *t);
        let steady = self.monotonic.as_ref().is_none_or(|m| {
            m.confirmed_until.is_some_and(|u| monotonic < u)
                && m.not_before.get(&shard).is_none_or(|t| monotonic >= *t)
        });
        if wall && steady {
            self.shards.get(&shard).copied()
        } else {
            None
        }
    }
}
