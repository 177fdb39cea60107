//! The held-shards publication: which shards a silo holds, at which epoch,
//! and until when it may act as their holder ([`Held::epoch_at`]), and the
//! book its driver keeps of it ([`HeldBook`]).
//!
//! Pure: no I/O; the clocks are read by the caller.

use std::collections::BTreeMap;

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

/// What the driver of the lease rules keeps of the held shards between two
/// publications of [`Held`]: the fences (shard -> epoch) its tenants may act
/// on, the takeover times, the actor hosts running on the service and the
/// releases that wait for them. Every change marks the book; [`publish`]
/// answers a new [`Held`] only when something changed or the confirmation
/// moved. Pure: the caller passes the time in.
///
/// [`publish`]: HeldBook::publish
#[derive(Debug, Default)]
pub struct HeldBook {
    fences: HeldMap,
    not_before: BTreeMap<u32, Timestamp>,
    /// Actor hosts running (registered minus unregistered).
    hosts: usize,
    /// Releases waiting for hosts: shard -> (epoch released, hosts still to
    /// report it drained). An entry with 0 left is removed.
    waits: BTreeMap<u32, (u64, usize)>,
    changed: bool,
    /// The `confirmed_until` of the last publication.
    published_until: Option<Timestamp>,
}

impl HeldBook {
    /// An empty book: nothing held, no host.
    pub fn new() -> Self {
        Self::default()
    }

    /// Records that this silo holds shard `k` at `epoch` and keeps it
    /// (`Some`), or no longer does (`None`: dropped, or stopping before its
    /// release). Either way the shard's takeover time is forgotten.
    pub fn set(&mut self, k: u32, epoch: Option<u64>) {
        self.changed |= match epoch {
            Some(e) => self.fences.insert(k, e) != Some(e),
            None => self.fences.remove(&k).is_some(),
        };
        if self.not_before.remove(&k).is_some() {
            self.changed = true;
        }
    }

    /// Shard `k` was taken over from a Dead holder: this silo does not act
    /// as its holder before `t` (UTC ms), the takeover time.
    pub fn not_before(&mut self, k: u32, t: Timestamp) {
        self.changed |= self.not_before.insert(k, t) != Some(t);
    }

    /// `delta` actor hosts started (positive) or ended (negative).
    pub fn hosts_changed(&mut self, delta: isize) {
        self.hosts = self.hosts.saturating_add_signed(delta);
    }

    /// The actor hosts running.
    pub fn hosts(&self) -> usize {
        self.hosts
    }

    /// The release of shard `k` at `epoch` starts: it waits for every host
    /// running now to report the shard drained ([`host_drained`]). Returns
    /// how many it waits for (0: none runs).
    ///
    /// [`host_drained`]: HeldBook::host_drained
    pub fn wait_for_hosts(&mut self, k: u32, epoch: u64) -> usize {
        if self.hosts == 0 {
            self.waits.remove(&k);
            return 0;
        }
        self.waits.insert(k, (epoch, self.hosts));
        self.changed = true;
        self.hosts
    }

    /// A host ended its activations of shard `k` held at `epoch`. True when
    /// that was the last host the release of `k` at `epoch` waited for; a
    /// report of another epoch, or with no wait, changes nothing.
    pub fn host_drained(&mut self, k: u32, epoch: u64) -> bool {
        let Some((e, left)) = self.waits.get_mut(&k) else {
            return false;
        };
        if *e != epoch {
            return false;
        }
        *left -= 1;
        if *left > 0 {
            return false;
        }
        self.waits.remove(&k);
        self.changed = true;
        true
    }

    /// The hosts the release of `k` still waits for (0: none).
    pub fn hosts_pending(&self, k: u32) -> usize {
        self.waits.get(&k).map_or(0, |(_, left)| *left)
    }

    /// The release of `k` waits for hosts no longer (its drain ended, or the
    /// shard was dropped).
    pub fn end_wait(&mut self, k: u32) {
        if self.waits.remove(&k).is_some() {
            self.changed = true;
        }
    }

    /// The [`Held`] to publish when anything changed since the last one or
    /// `confirmed_until` (the lease rules'
    /// [`confirmed_until`](super::ShardMachine::confirmed_until)) moved;
    /// `None` otherwise. Its monotonic deadlines are left to the runtime,
    /// which reads both clocks together ([`MonotonicDeadlines::of`]).
    pub fn publish(&mut self, confirmed_until: Option<Timestamp>) -> Option<Held> {
        if !std::mem::take(&mut self.changed) && confirmed_until == self.published_until {
            return None;
        }
        self.published_until = confirmed_until;
        Some(Held {
            shards: self.fences.clone(),
            confirmed_until,
            not_before: self.not_before.clone(),
            releasing: self.waits.iter().map(|(k, (e, _))| (*k, *e)).collect(),
            monotonic: None,
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: u64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    #[test]
    fn a_book_publishes_only_what_changed() {
        let mut book = HeldBook::new();
        assert_eq!(book.publish(None), None, "nothing changed");
        book.set(3, Some(7));
        book.not_before(3, t(500));
        let held = book.publish(Some(t(1_000))).expect("a change");
        assert_eq!(held.shards, HeldMap::from([(3, 7)]));
        assert_eq!(held.not_before, BTreeMap::from([(3, t(500))]));
        assert_eq!(book.publish(Some(t(1_000))), None, "same again");
        let held = book.publish(Some(t(2_000))).expect("the confirmation moved");
        assert_eq!(held.confirmed_until, Some(t(2_000)));
        book.set(3, Some(7));
        let held = book
            .publish(Some(t(2_000)))
            .expect("its takeover time is forgotten");
        assert!(held.not_before.is_empty());
        book.set(3, Some(7));
        assert_eq!(book.publish(Some(t(2_000))), None, "the same epoch again");
        book.set(3, None);
        let held = book.publish(Some(t(2_000))).expect("dropped");
        assert!(held.shards.is_empty() && held.not_before.is_empty());
    }

    #[test]
    fn a_release_waits_for_every_host_of_its_epoch() {
        let mut book = HeldBook::new();
        assert_eq!(book.wait_for_hosts(1, 4), 0, "no host: no wait");
        book.hosts_changed(2);
        assert_eq!(book.wait_for_hosts(1, 4), 2);
        assert_eq!(
            book.publish(None).expect("waits").releasing,
            HeldMap::from([(1, 4)])
        );
        assert!(
            !book.host_drained(1, 3),
            "another epoch's report counts for nothing"
        );
        assert!(!book.host_drained(2, 4), "another shard's too");
        assert!(!book.host_drained(1, 4));
        assert_eq!(book.hosts_pending(1), 1);
        assert!(book.host_drained(1, 4), "the last host");
        assert!(!book.host_drained(1, 4), "no wait left");
        assert!(book.publish(None).expect("the wait ended").releasing.is_empty());
        assert_eq!(book.wait_for_hosts(2, 9), 2);
        book.end_wait(2);
        assert_eq!(book.hosts_pending(2), 0);
        assert!(book.publish(None).expect("ended").releasing.is_empty());
        book.hosts_changed(-5);
        assert_eq!(book.hosts(), 0, "never below zero");
    }
}
