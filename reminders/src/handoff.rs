//! The rules of a shard handoff inside the silo that holds the shard (sans-io,
//! pure): where each reminder of a newly acquired shard starts, what a release
//! owes, which notices a shard takes, and what a silo owes after a pause.
//! [`crate::shards`] decides *which* shards a silo holds; this module decides
//! *what* the holder delivers of them, from the lease it acquired.
//!
//! # The rules
//! 1. **Start after an acquire** ([`HeldShard::start`]), until the acquire
//!    load ends: a reminder named in the lease's exceptions starts at its
//!    exception, however old (a release's backlog is owed, not missed),
//!    unless it was registered again since (another etag: it starts at its
//!    own first tick);
//!    after a takeover (the holder died), until the acquire load ends, every
//!    occurrence at or after the takeover time `T` is owed, in turn, however
//!    late the load answers, and the missed-tick policy decides only what
//!    fell due before `T` (`FireOnce`: the last such occurrence unless
//!    `last_fired` says it was delivered; `Skip`: none, each skipped one
//!    after the cluster saw the holder Dead counted and recorded); after a
//!    takeover from the Dead holder's checkpoint (shards rule 11), every
//!    occurrence at or after the checkpoint less `max_clock_offset` and
//!    every exception it names is owed as well, under every policy
//!    ([`HeldShard::start_from_checkpoint`]); otherwise
//!    from its first
//!    occurrence after the watermark `W`. That first occurrence, when older
//!    than [`MAX_CATCH_UP`] at the acquire, is planned by the policy instead (a
//!    shard nobody held for long). A one-shot whose only occurrence is at or before
//!    `W` was delivered by an earlier holder: it is not planned, and a
//!    schedule whose last occurrence is at or before `W` is removed. Except
//!    a row the release does not name whose first occurrence is at or after
//!    the lease's `listed_from` (`W` less `max_clock_offset`): it was
//!    registered after the release's final read by a clock behind the
//!    releasing one, and starts at its first occurrence. A row the release
//!    names done is removed, never delivered.
//! 2. **Owed on release** ([`HeldShard::owed`]): the first occurrence of a row
//!    not delivered here, if it is at or before the release's watermark (the
//!    stop time, or the floor when later: a `FireOnce` catch-up planned at a
//!    takeover time is owed too). Deliveries running at the stop are waited
//!    for first, up to [`MAX_DRAIN`]: one that finished is delivered, one that
//!    failed is owed, and one still running then is owed too (at least once:
//!    its handler may finish after all). A row never seen here owes its first
//!    occurrence after the floor. Every row whose first occurrence is at or
//!    after `listed_from` is named too, owed or not (where it starts), and a
//!    row delivered to its end here whose removal is pending is named done:
//!    the next holder starts an unnamed one at its first occurrence.
//! 3. **Notices** ([`HeldShard::takes_notices`]): a shard that is stopping
//!    takes no notice (its release reads the row, or the row's first tick
//!    comes after the release's watermark); an answer to a read is applied only
//!    for the lease epoch it was asked under.
//! 4. **Pause and resume** ([`Pause`]): a silo that is not Active, or (fencing)
//!    has not confirmed its own row lately, delivers nothing and looks again
//!    after [`INACTIVE_RECHECK`]. When it delivers again, what waited through
//!    the pause is still owed here (taking its shards needs its row Dead, and
//!    Dead is final): delivered in turn, as a catch-up.
//!
//! Together with the lease rules of [`crate::shards`] these are the whole
//! safety argument: each epoch starts where the lease says the last one
//! stopped (rule 1) and records exactly what it did not deliver (rule 2).

use std::collections::HashMap;
use std::time::Duration;

use rollcall_core::lease::LeaseException;
use rollcall_core::{MissedTickPolicy, ReminderEntry, Timestamp};

use crate::queue::Key;
use crate::schedule::Timing;

/// The first occurrence after a lease's watermark is delivered in turn when at
/// most this old at the acquire; an older one (a shard nobody held for long:
/// the whole cluster was down) is planned by the missed-tick policy: 60 s.
/// Exceptions, which a release owes, have no such bound.
pub const MAX_CATCH_UP: Duration = Duration::from_secs(60);

/// How long a shard that stops waits for the deliveries it has in flight
/// before its release reads what it owes (at most the options'
/// `delivery_timeout`): 5 s, half of a silo's default `shutdown_timeout`, so a
/// graceful leave still writes its releases. A delivery still running then is
/// owed by the release (its handler may yet finish: that tick can come twice).
pub const MAX_DRAIN: Duration = Duration::from_secs(5);

/// How long a silo that is not Active (or has not confirmed its row lately)
/// waits before it looks at its due ticks again: 1 s.
pub const INACTIVE_RECHECK: Duration = Duration::from_secs(1);

/// A shard this silo holds (loading, delivering or stopping), as its lease
/// said when acquired.
#[derive(Clone, Debug, Default)]
pub struct HeldShard {
    /// The lease epoch it is held under (echoed by notice reads).
    pub lease_epoch: u64,
    /// Occurrences at or before it were delivered by earlier holders (the
    /// lease's watermark when acquired; the takeover time less 1 ms after a
    /// crash).
    pub floor: Option<Timestamp>,
    /// The previous holder died: plan by the missed-tick policy from this time
    /// (the fence's end: nothing is due before it).
    pub takeover: Option<Timestamp>,
    /// After a takeover from a checkpoint, the Dead holder's
    /// [`owed_from`](rollcall_core::lease::ShardLease::owed_from): every
    /// occurrence after it is owed, and the exceptions, under every policy.
    pub checkpoint: Option<Timestamp>,
    /// The cluster's `max_clock_offset` when acquired: a row whose first
    /// occurrence is at or after the checkpoint less this much starts there
    /// after a takeover (registered after the checkpoint by a clock behind
    /// the holder's, it may be unknown to it).
    pub clock_bound: Duration,
    /// What this holder's checkpoints start from (shards rule 11): the
    /// lease's `owed_from` when acquired, else its watermark. A checkpoint
    /// says `max(owed_from, started_through)`.
    pub owed_from: Option<Timestamp>,
    /// The lease's exceptions, until the acquire load ends.
    pub exceptions: HashMap<Key, Timestamp>,
    /// The registration (etag) each exception was owed under, where the
    /// lease says.
    pub exception_etags: HashMap<Key, rollcall_core::Etag>,
    /// The lease's [`listed_from`](rollcall_core::lease::ShardLease::listed_from)
    /// when acquired from a release: a row the release does not name whose
    /// first occurrence is at or after it starts there.
    pub listed_from: Option<Timestamp>,
    /// Registrations the release named [`done`](LeaseException::done): their
    /// rows (under these etags) are removed, never delivered. Kept after the
    /// acquire load (a later load may find a row whose removal is pending).
    pub done: HashMap<Key, rollcall_core::Etag>,
    /// Keys planned while loading (out of the due index until the shard may
    /// deliver).
    pub waiting: Vec<Key>,
    /// When delivery stopped: the release owes every occurrence at or
    /// before it that was not started.
    pub stopped_at: Timestamp,
    /// The latest occurrence started in this shard (the release's watermark):
    /// a row written after the release's final read, whose ticks this silo
    /// never saw, is owed from its first occurrence after it.
    pub started_through: Option<Timestamp>,
    /// The acquire load ended.
    pub loaded: bool,
    /// Delivery stopped; the release load runs (or waits for the drain).
    pub stopping: bool,
    /// Delivery stopped with deliveries in flight: the release load waits
    /// for them until this time ([`MAX_DRAIN`]).
    pub draining_until: Option<Timestamp>,
    /// When the last completed load of the shard here (its acquire, or a
    /// refresh) began reading it. A row this silo has no slot for whose first
    /// occurrence is at or after it was not there when that load read, so it
    /// was registered since, while this silo held the shard: none of its
    /// occurrences was delivered, and each one is owed from its first
    /// (within [`MAX_CATCH_UP`]) however late its notice or a refresh finds
    /// it.
    pub known_from: Option<Timestamp>,
    /// Rows the last load read.
    pub rows: u64,
    /// A notice for this shard was not read while its acquire load ran (the
    /// notice reads were all taken, or notices were dropped): the load may have
    /// read its rows before that registration, so it is read again once loaded.
    pub reread: bool,
}

/// Where a reminder of a held shard starts ([`HeldShard::start`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Start {
    /// Deliver this owed occurrence first, in turn (a catch-up when it is
    /// before now).
    Owed(Timestamp),
    /// Plan by the reminder's schedule and missed-tick policy from this time.
    Plan(Timestamp),
    /// Nothing is left to deliver here: every occurrence is at or before the
    /// floor.
    Delivered,
}

/// What a row's slot in this silo's queue says, for [`HeldShard::owed`]: the
/// occurrence it waits for and whether it is being delivered.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Seen {
    /// The occurrence the slot holds.
    pub scheduled: Timestamp,
    /// Its delivery started.
    pub delivering: bool,
}

impl HeldShard {
    /// A shard acquired under `lease_epoch` with the lease's watermark
    /// `floor`, its `exceptions`, and the `takeover` time if its holder died.
    pub fn acquired(
        lease_epoch: u64,
        floor: Option<Timestamp>,
        takeover: Option<Timestamp>,
        exceptions: HashMap<Key, Timestamp>,
    ) -> HeldShard {
        HeldShard {
            lease_epoch,
            floor,
            takeover,
            exceptions,
            stopped_at: Timestamp::EPOCH,
            started_through: None,
            ..HeldShard::default()
        }
    }

    /// Rule 1: where reminder `key` with `timing` starts at `now`.
    pub fn start(&self, key: &Key, timing: &Timing, now: Timestamp) -> Start {
        if let Some(t) = self.takeover.filter(|_| !self.loaded) {
            if let Some(c) = self.checkpoint {
                return self.start_from_checkpoint(key, timing, c, t, now);
            }
            return HeldShard::start_after_takeover(timing, t);
        }
        // After a crash nothing is planned before the takeover time.
        let from = self.takeover.map_or(now, |t| t.max(now));
        if !self.loaded {
            if let Some(at) = self.exceptions.get(key) {
                // Owed by a graceful release: honoured whatever its age (a
                // backlog at the release); the missed-tick policy is for
                // crashes and outages.
                return Start::Owed(*at);
            }
        }
        let unlisted = self.takeover.is_none() && self.listed_from.is_some_and(|l| timing.start_at >= l);
        if self.loaded
            && self.takeover.is_none()
            && timing.is_one_shot()
            && self.floor.is_some_and(|f| timing.start_at <= f)
            && !unlisted
        {
            // A one-shot an earlier holder delivered whose removal never
            // landed (it left during a store outage), found by a later load:
            // not again.
            return Start::Delivered;
        }
        let owed = if self.loaded || self.takeover.is_some() {
            None
        } else {
            match self.floor {
                // Not named by a release that names every row it knew of from
                // `listed_from` on: registered after its final read, so its
                // first occurrence is owed, though a clock ahead of the
                // registering one set the watermark past it.
                Some(_) if unlisted => {
                    let before = Timestamp::from_millis(timing.start_at.as_millis().saturating_sub(1));
                    match timing.after(before) {
                        Some(t) => Some(t),
                        None => return Start::Delivered,
                    }
                }
                Some(f) => match timing.after(f) {
                    Some(t) => Some(t),
                    None => return Start::Delivered,
                },
                None => Some(timing.start_at),
            }
        };
        match owed {
            Some(at) if now.saturating_duration_since(at) <= MAX_CATCH_UP => Start::Owed(at),
            _ => Start::Plan(from),
        }
    }

    /// Rule 1 after a takeover at `t`, until the acquire load ends: the Dead
    /// holder delivered nothing at or after `t` (its fence ended before), so
    /// the first occurrence at or after `t` is owed, and every later one in
    /// turn, however late the load answers. Before `t` the missed-tick policy
    /// decides: `FireOnce` owes the last occurrence before `t` unless
    /// `last_fired` says it was delivered, `Skip` nothing
    /// ([`skipped`](Self::skipped) lists what it skips). A one-shot whose row
    /// exists is owed (its removal had not landed, or it was never
    /// delivered: a crash may repeat it).
    pub fn start_after_takeover(timing: &Timing, t: Timestamp) -> Start {
        let before = Timestamp::from_millis(t.as_millis().saturating_sub(1));
        if timing.is_one_shot() {
            return Start::Owed(timing.start_at);
        }
        if timing.missed_tick_policy == MissedTickPolicy::FireOnce {
            if let Some(last) = timing.at_or_before(before) {
                if timing.last_fired.is_none_or(|f| f < last) {
                    return Start::Owed(last);
                }
            }
        }
        match timing.after(before) {
            Some(at) => Start::Owed(at),
            None => Start::Delivered,
        }
    }

    /// Rule 1 after a takeover at `t` from the Dead holder's `checkpoint`,
    /// until the acquire load ends: everything the checkpoint did not say
    /// was delivered is owed, under every policy: an exception at its own
    /// occurrence, a one-shot whose row exists, a row whose first
    /// occurrence is at or after `checkpoint` less the clock bound at that
    /// first occurrence (registered after the checkpoint, perhaps, by a
    /// clock behind the holder's), else the first occurrence after
    /// `checkpoint` (what the Dead holder delivered after its checkpoint
    /// comes again). Only an occurrence before `t` that is older than
    /// [`MAX_CATCH_UP`] at `now` (a checkpoint that could not be written for
    /// long) falls to [`start_after_takeover`](Self::start_after_takeover).
    pub fn start_from_checkpoint(
        &self,
        key: &Key,
        timing: &Timing,
        checkpoint: Timestamp,
        t: Timestamp,
        now: Timestamp,
    ) -> Start {
        if timing.is_one_shot() {
            return Start::Owed(timing.start_at);
        }
        if let Some(at) = self.exceptions.get(key) {
            return Start::Owed(*at);
        }
        let unlisted = timing.start_at >= checkpoint.saturating_sub(self.clock_bound);
        let from = if unlisted {
            Timestamp::from_millis(timing.start_at.as_millis().saturating_sub(1))
        } else {
            checkpoint
        };
        match timing.after(from) {
            None => Start::Delivered,
            Some(at) if at >= t || now.saturating_duration_since(at) <= MAX_CATCH_UP => Start::Owed(at),
            Some(_) => HeldShard::start_after_takeover(timing, t),
        }
    }

    /// Rule 1: the occurrences of a reminder the missed-tick policy skips at
    /// a takeover at `t`: those in `[from, t)` (`from`: when the cluster saw
    /// the holder Dead, the takeover's fence less the lease period and the
    /// clock bound) before `owed`, the one [`start`](Self::start) owes
    /// first (every one from it on is delivered), the earliest first, at
    /// most `limit`. A one-shot skips nothing. Occurrences between the
    /// holder's crash and `from` are not listed: the Dead holder may have
    /// delivered them.
    pub fn skipped(
        timing: &Timing,
        from: Timestamp,
        t: Timestamp,
        owed: Option<Timestamp>,
        limit: usize,
    ) -> Vec<Timestamp> {
        if timing.is_one_shot() || from >= t {
            return Vec::new();
        }
        let until = owed.map_or(t, |o| o.min(t));
        let mut out = Vec::new();
        let mut next = timing.after(Timestamp::from_millis(from.as_millis().saturating_sub(1)));
        while let Some(at) = next.filter(|at| *at < until && out.len() < limit) {
            out.push(at);
            next = timing.after(at);
        }
        out
    }

    /// Rule 1, for a registration that changed during the handoff: forgets
    /// the exception of `key` when it was owed under another etag than the
    /// row's (`etag`), so the new registration starts at its own first tick,
    /// not at the old one's owed occurrence. Whether one was forgotten.
    pub fn forget_stale_exception(&mut self, key: &Key, etag: &str) -> bool {
        let stale = self
            .exception_etags
            .get(key)
            .is_some_and(|owed| owed.as_str() != etag);
        if stale {
            self.exceptions.remove(key);
            self.exception_etags.remove(key);
        }
        stale
    }

    /// Rule 1: whether the release named registration `etag` of `key` done
    /// (every occurrence delivered; its row is removed).
    pub fn is_done(&self, key: &Key, etag: &str) -> bool {
        self.done.get(key).is_some_and(|e| e.as_str() == etag)
    }

    /// Rule 2: the release's `listed_from`, from which it names every row it
    /// knows of: its watermark (the floor, or the latest occurrence started
    /// when later) less `max_clock_offset`. `None` without a watermark.
    pub fn listing_from(&self, max_clock_offset: Duration) -> Option<Timestamp> {
        self.floor
            .max(self.started_through)
            .map(|w| w.saturating_sub(max_clock_offset))
    }

    /// Rule 2: what the release of this stopped shard owes for `row`, which
    /// this silo's queue holds as `seen` (none: never seen here, or under
    /// another etag); `listed_from` is [`listing_from`](Self::listing_from)'s.
    pub fn owed(
        &self,
        row: &ReminderEntry,
        seen: Option<Seen>,
        listed_from: Option<Timestamp>,
    ) -> Option<LeaseException> {
        let watermark = self.stopped_at.max(self.floor.unwrap_or(Timestamp::EPOCH));
        // A row whose schedule cannot be read is never delivered: nothing owed.
        let timing = Timing::of(row).ok()?;
        let listed = listed_from.is_some_and(|l| timing.start_at >= l);
        let next = match seen {
            // Still being delivered after the drain: owed, not delivered (its
            // handler may yet finish, so that tick may come twice).
            Some(Seen { scheduled, .. }) => Some(scheduled),
            None => match self.floor {
                Some(floor) => timing.after(floor),
                None => Some(timing.start_at),
            },
        };
        let exception = |next, done| LeaseException {
            actor_id: row.actor_id.clone(),
            name: row.name.clone(),
            next,
            etag: Some(row.etag.clone()),
            done,
        };
        match next {
            Some(next) if next <= watermark || listed => Some(exception(next, false)),
            None if listed => Some(exception(timing.start_at, true)),
            _ => None,
        }
    }

    /// Rule 2 for `row`, delivered to its end here with its removal pending:
    /// named done when at or after `listed_from` (unnamed, the next holder
    /// would take it for a registration it never saw).
    pub fn delivered(row: &ReminderEntry, listed_from: Option<Timestamp>) -> Option<LeaseException> {
        listed_from
            .is_some_and(|l| row.start_at >= l)
            .then(|| LeaseException {
                actor_id: row.actor_id.clone(),
                name: row.name.clone(),
                next: row.start_at,
                etag: Some(row.etag.clone()),
                done: true,
            })
    }

    /// Rule 3: whether a notice for this shard is read (held, not stopping).
    pub fn takes_notices(held: Option<&HeldShard>) -> bool {
        held.is_some_and(|h| !h.stopping)
    }

    /// Rule 3: whether the answer to a read asked under `lease_epoch` applies.
    pub fn takes_answer(held: Option<&HeldShard>, lease_epoch: u64) -> bool {
        held.is_some_and(|h| h.lease_epoch == lease_epoch && !h.stopping)
    }
}

/// Rule 4: whether the silo delivers, and what waited through a pause.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pause {
    active: bool,
    paused: bool,
    until: Timestamp,
    resumed_at: Timestamp,
}

impl Default for Pause {
    fn default() -> Self {
        Pause {
            active: false,
            paused: false,
            until: Timestamp::EPOCH,
            resumed_at: Timestamp::EPOCH,
        }
    }
}

impl Pause {
    /// Before this time the silo does not look at its due ticks.
    pub fn until(&self) -> Timestamp {
        self.until
    }

    /// The silo's own status is Active (`true`) or not, as last seen.
    pub fn set_active(&mut self, active: bool) {
        self.active = active;
    }

    /// Whether the silo delivers at `now`: it is Active and its own row is
    /// `confirmed`. A `false` pauses it for [`INACTIVE_RECHECK`].
    pub fn check(&mut self, now: Timestamp, confirmed: bool) -> bool {
        if now < self.until {
            return false;
        }
        if !self.active || !confirmed {
            self.until = now.saturating_add(INACTIVE_RECHECK);
            self.paused = true;
            return false;
        }
        if std::mem::take(&mut self.paused) {
            self.resumed_at = now;
        }
        true
    }

    /// The catch-up bound of an occurrence `scheduled`: the resume time when it
    /// waited through a pause, else none.
    pub fn catch_up_to(&self, scheduled: Timestamp) -> Option<Timestamp> {
        (scheduled < self.resumed_at).then_some(self.resumed_at)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn t(ms: u64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    fn row(start: u64, period_ms: Option<u64>) -> ReminderEntry {
        ReminderEntry::new("svc", "k/a", "r", t(start), period_ms.map(Duration::from_millis))
    }

    fn key() -> Key {
        Key::new("k/a", "r")
    }

    #[test]
    fn an_acquire_starts_after_the_watermark_or_at_an_exception() {
        let every_10s = Timing::of(&row(0, Some(10_000))).unwrap();
        let after_w = HeldShard::acquired(1, Some(t(25_000)), None, HashMap::new());
        assert_eq!(
            after_w.start(&key(), &every_10s, t(31_000)),
            Start::Owed(t(30_000))
        );
        let exception = HeldShard::acquired(1, Some(t(25_000)), None, HashMap::from([(key(), t(20_000))]));
        assert_eq!(
            exception.start(&key(), &every_10s, t(31_000)),
            Start::Owed(t(20_000))
        );
        let fresh = HeldShard::acquired(1, None, None, HashMap::new());
        assert_eq!(fresh.start(&key(), &every_10s, t(5_000)), Start::Owed(t(0)));
    }

    #[test]
    fn owed_occurrences_older_than_the_cut_off_are_planned_by_policy() {
        let every_10s = Timing::of(&row(0, Some(10_000))).unwrap();
        let h = HeldShard::acquired(1, Some(t(5_000)), None, HashMap::new());
        let now = t(10_000).saturating_add(MAX_CATCH_UP);
        assert_eq!(h.start(&key(), &every_10s, now), Start::Owed(t(10_000)));
        let later = now.saturating_add(Duration::from_millis(1));
        assert_eq!(h.start(&key(), &every_10s, later), Start::Plan(later));
    }

    /// A reminder registered again during the handoff (a new etag) owes
    /// nothing of the old registration: its exception is forgotten, and it
    /// starts at its own first tick.
    #[test]
    fn an_exception_of_another_registration_is_forgotten() {
        let every_10s = Timing::of(&row(40_000, Some(10_000))).unwrap();
        let mut h = HeldShard::acquired(1, Some(t(25_000)), None, HashMap::from([(key(), t(20_000))]));
        h.exception_etags.insert(key(), rollcall_core::Etag::new("old"));
        assert!(
            !h.forget_stale_exception(&key(), "old"),
            "the same registration keeps it"
        );
        assert_eq!(h.start(&key(), &every_10s, t(31_000)), Start::Owed(t(20_000)));
        assert!(h.forget_stale_exception(&key(), "new"));
        assert_eq!(h.start(&key(), &every_10s, t(31_000)), Start::Owed(t(40_000)));
    }

    /// A release's backlog is owed, not missed: an exception an hour old
    /// still starts at its own occurrence (it fell to the policy past 60 s).
    #[test]
    fn exceptions_are_owed_whatever_their_age() {
        let every_10s = Timing::of(&row(0, Some(10_000))).unwrap();
        let h = HeldShard::acquired(1, Some(t(25_000)), None, HashMap::from([(key(), t(20_000))]));
        let hour_later = t(20_000).saturating_add(Duration::from_secs(3_600));
        assert_eq!(h.start(&key(), &every_10s, hour_later), Start::Owed(t(20_000)));
    }

    /// After a crash everything from the takeover time on is owed, the
    /// occurrence at the takeover time included, however late the load
    /// answers; before it, `Skip` owes nothing and `FireOnce` the last one
    /// unless `last_fired` says it was delivered.
    #[test]
    fn a_takeover_owes_every_occurrence_from_the_takeover_time_on() {
        let every_10s = Timing::of(&row(0, Some(10_000))).unwrap();
        let h = HeldShard::acquired(2, Some(t(49_999)), Some(t(50_000)), HashMap::new());
        assert_eq!(h.start(&key(), &every_10s, t(40_000)), Start::Owed(t(50_000)));
        assert_eq!(
            h.start(&key(), &every_10s, t(75_000)),
            Start::Owed(t(50_000)),
            "a load that answers 25 s after T owes from T"
        );
        let late = HeldShard::acquired(2, Some(t(50_000)), Some(t(50_001)), HashMap::new());
        assert_eq!(late.start(&key(), &every_10s, t(50_001)), Start::Owed(t(60_000)));
        let hour = t(50_000).saturating_add(Duration::from_secs(3_600));
        assert_eq!(
            h.start(&key(), &every_10s, hour),
            Start::Owed(t(50_000)),
            "owed however old: MAX_CATCH_UP is for shards nobody held"
        );
        let mut fire_once = every_10s.clone();
        fire_once.missed_tick_policy = MissedTickPolicy::FireOnce;
        assert_eq!(h.start(&key(), &fire_once, t(40_000)), Start::Owed(t(40_000)));
        fire_once.last_fired = Some(t(40_005));
        assert_eq!(h.start(&key(), &fire_once, t(40_000)), Start::Owed(t(50_000)));
        let once = Timing::of(&row(10_000, None)).unwrap();
        assert_eq!(h.start(&key(), &once, t(60_000)), Start::Owed(t(10_000)));
        let mut ended = Timing::of(&row(0, Some(10_000))).unwrap();
        ended.end_at = Some(t(45_000));
        assert_eq!(h.start(&key(), &ended, t(60_000)), Start::Delivered);
    }

    #[test]
    fn a_takeover_lists_what_the_policy_skips_between_the_death_and_t() {
        let every_1s = Timing::of(&row(0, Some(1_000))).unwrap();
        let owed = |timing: &Timing| match HeldShard::start_after_takeover(timing, t(50_000)) {
            Start::Owed(at) => Some(at),
            _ => None,
        };
        assert_eq!(
            HeldShard::skipped(&every_1s, t(47_500), t(50_000), owed(&every_1s), 16),
            vec![t(48_000), t(49_000)],
            "T itself is owed, not skipped"
        );
        assert_eq!(
            HeldShard::skipped(&every_1s, t(47_000), t(50_000), owed(&every_1s), 2).len(),
            2
        );
        let mut fire_once = every_1s.clone();
        fire_once.missed_tick_policy = MissedTickPolicy::FireOnce;
        assert_eq!(
            HeldShard::skipped(&fire_once, t(47_500), t(50_000), owed(&fire_once), 16),
            vec![t(48_000)],
            "FireOnce's catch-up is owed"
        );
        let once = Timing::of(&row(48_000, None)).unwrap();
        assert!(HeldShard::skipped(&once, t(47_500), t(50_000), owed(&once), 16).is_empty());
    }

    /// Shards rule 11: a takeover from a checkpoint owes, under every
    /// policy, the exceptions at their own occurrence and every occurrence
    /// at or after the checkpoint; only one before `T` older than
    /// `MAX_CATCH_UP` falls to the policy. Nothing between the checkpoint
    /// and `T` is skipped.
    #[test]
    fn a_takeover_from_a_checkpoint_owes_everything_after_it() {
        let every_1s = Timing::of(&row(0, Some(1_000))).unwrap();
        let mut h = HeldShard::acquired(3, Some(t(49_999)), Some(t(50_000)), HashMap::new());
        h.checkpoint = Some(t(44_500));
        assert_eq!(
            h.start(&key(), &every_1s, t(50_000)),
            Start::Owed(t(45_000)),
            "Skip owes what fell due between the checkpoint and T"
        );
        assert_eq!(
            h.start(&key(), &every_1s, t(44_500).saturating_add(MAX_CATCH_UP)),
            Start::Owed(t(45_000))
        );
        let stale = t(45_000).saturating_add(MAX_CATCH_UP + Duration::from_millis(1));
        assert_eq!(
            h.start(&key(), &every_1s, stale),
            Start::Owed(t(50_000)),
            "older than MAX_CATCH_UP: the policy decides before T"
        );
        let exception = HashMap::from([(key(), t(30_000))]);
        let mut owing = HeldShard::acquired(3, Some(t(49_999)), Some(t(50_000)), exception);
        owing.checkpoint = Some(t(44_500));
        assert_eq!(
            owing.start(&key(), &every_1s, t(50_000)),
            Start::Owed(t(30_000)),
            "the checkpoint's exception at its own occurrence"
        );
        let once = Timing::of(&row(10_000, None)).unwrap();
        assert_eq!(h.start(&key(), &once, t(50_000)), Start::Owed(t(10_000)));
        let mut h = HeldShard::acquired(3, Some(t(49_999)), Some(t(50_000)), HashMap::new());
        h.checkpoint = Some(t(45_000));
        h.clock_bound = Duration::from_millis(500);
        assert_eq!(
            h.start(&key(), &every_1s, t(50_000)),
            Start::Owed(t(46_000)),
            "the occurrence at the checkpoint was started: not again"
        );
        let late_row = Timing::of(&row(44_600, Some(1_000))).unwrap();
        assert_eq!(
            h.start(&key(), &late_row, t(50_000)),
            Start::Owed(t(44_600)),
            "a first occurrence within the clock bound before the checkpoint: maybe unknown to it"
        );
        let owed = Some(t(45_000));
        assert!(
            HeldShard::skipped(&every_1s, t(47_500), t(50_000), owed, 16).is_empty(),
            "nothing skipped from the owed occurrence on"
        );
        assert_eq!(
            HeldShard::skipped(&every_1s, t(42_500), t(50_000), owed, 16),
            vec![t(43_000), t(44_000)]
        );
    }

    #[test]
    fn a_loaded_takeover_plans_from_the_takeover_time_and_a_loaded_shard_from_now() {
        let every_10s = Timing::of(&row(0, Some(10_000))).unwrap();
        let mut h = HeldShard::acquired(2, Some(t(1_000)), Some(t(50_000)), HashMap::new());
        h.loaded = true;
        assert_eq!(h.start(&key(), &every_10s, t(40_000)), Start::Plan(t(50_000)));
        let mut loaded = HeldShard::acquired(2, Some(t(1_000)), None, HashMap::new());
        loaded.loaded = true;
        assert_eq!(
            loaded.start(&key(), &every_10s, t(40_000)),
            Start::Plan(t(40_000))
        );
    }

    #[test]
    fn a_one_shot_at_or_before_the_watermark_was_delivered() {
        let once = Timing::of(&row(10_000, None)).unwrap();
        let h = HeldShard::acquired(1, Some(t(10_000)), None, HashMap::new());
        assert_eq!(h.start(&key(), &once, t(11_000)), Start::Delivered);
        let before = HeldShard::acquired(1, Some(t(9_999)), None, HashMap::new());
        assert_eq!(before.start(&key(), &once, t(11_000)), Start::Owed(t(10_000)));
    }

    #[test]
    fn a_release_owes_the_first_occurrence_not_delivered() {
        let r = row(0, Some(10_000));
        let mut h = HeldShard::acquired(1, Some(t(5_000)), None, HashMap::new());
        h.stopping = true;
        h.stopped_at = t(32_000);
        let waiting = Seen {
            scheduled: t(30_000),
            delivering: false,
        };
        assert_eq!(h.owed(&r, Some(waiting), None).map(|e| e.next), Some(t(30_000)));
        let running = Seen {
            scheduled: t(30_000),
            delivering: true,
        };
        assert_eq!(
            h.owed(&r, Some(running), None).map(|e| e.next),
            Some(t(30_000)),
            "still running after the drain: owed, not delivered"
        );
        assert_eq!(h.owed(&r, None, None).map(|e| e.next), Some(t(10_000)));
    }

    #[test]
    fn the_floor_raises_the_release_watermark() {
        let r = row(0, Some(10_000));
        let mut h = HeldShard::acquired(1, Some(t(40_000)), Some(t(40_001)), HashMap::new());
        h.stopping = true;
        h.stopped_at = t(35_000);
        let seen = Seen {
            scheduled: t(40_000),
            delivering: false,
        };
        assert_eq!(h.owed(&r, Some(seen), None).map(|e| e.next), Some(t(40_000)));
    }

    #[test]
    fn a_stopping_shard_takes_no_notice_and_no_stale_answer() {
        let mut h = HeldShard::acquired(7, None, None, HashMap::new());
        assert!(HeldShard::takes_notices(Some(&h)));
        assert!(HeldShard::takes_answer(Some(&h), 7));
        assert!(!HeldShard::takes_answer(Some(&h), 6));
        h.stopping = true;
        assert!(!HeldShard::takes_notices(Some(&h)));
        assert!(!HeldShard::takes_answer(Some(&h), 7));
        assert!(!HeldShard::takes_notices(None));
    }

    #[test]
    fn what_waited_through_a_pause_is_a_catch_up() {
        let mut p = Pause::default();
        p.set_active(true);
        assert!(p.check(t(1_000), true));
        assert_eq!(p.catch_up_to(t(500)), None, "nothing waited");
        p.set_active(false);
        assert!(!p.check(t(2_000), true));
        p.set_active(true);
        assert!(!p.check(t(2_500), true), "rechecks only after INACTIVE_RECHECK");
        assert!(p.check(t(3_000), true));
        assert_eq!(p.catch_up_to(t(2_200)), Some(t(3_000)));
        assert_eq!(p.catch_up_to(t(3_000)), None);
        assert!(!p.check(t(4_000), false), "an unconfirmed row pauses too");
    }
}
