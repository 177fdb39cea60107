//! Planning and delivering ticks: where a row starts ([`HeldShard::start`]),
//! the due timer, deliveries while the shard and the silo may deliver, and what
//! follows each delivery (the next occurrence, a retry, a park or a drop).

use std::time::Duration;

use rand::Rng;
use rollcall_core::{hash_shard, Etag, MissedTickPolicy, ReminderEntry, RunOutcome, Timestamp};
use smol_str::SmolStr;

use super::{backoff, Action, Key, ReminderMachine, Timer};
use crate::api::{Counters, ReminderTick};
use crate::handoff::{HeldShard, Start, MAX_CATCH_UP};
use crate::queue::{key_of, kind_of};
use crate::schedule::{after_attempt, plan, AfterAttempt, Learned, Planned, Timing};
use crate::ActorId;

/// The default of `ReminderOptions::max_deliveries`: deliveries running at
/// once per silo.
pub const MAX_DELIVERIES: usize = 1024;
/// How long an overdue tick found by a load outside a handoff waits before
/// delivery (a registration rewritten meanwhile is read first): 1 s.
pub const LOAD_GRACE: Duration = Duration::from_secs(1);
/// The most occurrences of one reminder a takeover records as skipped by
/// its missed-tick policy (run history and `ReminderStats::takeover_skipped`):
/// 16.
pub const MAX_SKIPPED_RECORDS: usize = 16;
/// How long a due tick of a shard that may not deliver yet (its load runs)
/// waits before it is looked at again: 100 ms.
const SHARD_RECHECK: Duration = Duration::from_millis(100);

impl ReminderMachine {
    /// Plans `row` of held shard `k`: where it starts is [`HeldShard::start`]'s
    /// (the handoff rules); a late tick found by a load waits [`LOAD_GRACE`].
    ///
    /// [`HeldShard::start`]: crate::handoff::HeldShard::start
    pub(super) fn schedule_row(&mut self, k: u32, mut row: ReminderEntry, learned: Learned) {
        let now = self.now;
        let key = key_of(&row);
        if let Some(at) = self.writes.fired_at(&key, &row.etag) {
            row.last_fired = row.last_fired.max(Some(at));
        }
        let Some(held) = self.held.get_mut(&k) else {
            return;
        };
        // Registered again during the handoff: the old registration's owed
        // occurrence is not this one's.
        held.forget_stale_exception(&key, row.etag.as_str());
        let held = &*held;
        let timing = match Timing::of(&row) {
            Ok(timing) => timing,
            Err(e) => {
                // A malformed row (written by another tool or version): it is
                // skipped, never delivered, and stays for an operator to fix.
                tracing::error!(actor = %row.actor_id, name = %row.name, error = %e, "reminder row with an unreadable schedule skipped");
                self.queue.remove(&key);
                return;
            }
        };
        if row.paused.is_some() {
            // Paused: nothing is delivered and the row stays; a resume (the
            // same etag, unpaused) plans it again from then.
            self.queue.remove(&key);
            return;
        }
        let (loaded, takeover) = (held.loaded, held.takeover.is_some());
        // Registered since the shard's last load here (see
        // `HeldShard::known_from`): owed from its first occurrence, however
        // late this silo learns of it (a notice read or a refresh after a
        // store outage; the long takeover sweep lost 114 occurrences of rows
        // registered as the store went out, their notice reads failed and a
        // refresh found them 3.5 s after their first ticks).
        let registered_since = loaded
            && !takeover
            && self.queue.get(&key).is_none()
            && held.known_from.is_some_and(|k| timing.start_at >= k)
            && now.saturating_duration_since(timing.start_at) <= MAX_CATCH_UP;
        // A release owes every occurrence up to its watermark, which the
        // releasing silo's clock set: one ahead of this silo's sets it past
        // now, and those occurrences are owed all the same.
        let owed_through = if takeover {
            now
        } else {
            now.max(held.floor.unwrap_or(now))
        };
        let mut catch_up = false;
        let start = if held.is_done(&key, row.etag.as_str()) {
            Start::Delivered
        } else {
            match held.start(&key, &timing, now) {
                Start::Plan(_) if registered_since => {
                    let before = Timestamp::from_millis(timing.start_at.as_millis().saturating_sub(1));
                    match timing.after(before) {
                        Some(first) => Start::Owed(first),
                        None => Start::Delivered,
                    }
                }
                other => other,
            }
        };
        // A takeover's acquire load: what the missed-tick policy skips before
        // the takeover time (rule 1 of `handoff`), counted and recorded.
        let skipped = match held.takeover.filter(|_| !loaded) {
            Some(t) => {
                // The takeover time is this long after the holder was seen
                // Dead (shards rule 3; at once without fencing).
                let wait = if self.options.lease_fencing {
                    self.options.lease_period + self.shards.max_clock_offset()
                } else {
                    Duration::ZERO
                };
                let owed = match start {
                    Start::Owed(at) => Some(at),
                    _ => None,
                };
                HeldShard::skipped(&timing, t.saturating_sub(wait), t, owed, MAX_SKIPPED_RECORDS)
            }
            None => Vec::new(),
        };
        let planned = match start {
            Start::Delivered => None,
            Start::Owed(at) => {
                catch_up = at < owed_through;
                // Due at its own time: an owed occurrence goes before the
                // later ones that also fell due meanwhile (the due queue is
                // in due order, and everything due at or before now is taken).
                Some(Planned {
                    scheduled: at,
                    due: at,
                })
            }
            Start::Plan(from) => {
                // A refresh of a shard held here finds a row this silo has no
                // slot for: it was registered (or registered again) while this
                // silo held the shard, so none of its ticks was delivered,
                // and its notice is late or lost: its first tick is due late,
                // as a notice's would be (sweep seed 390: the refresh read it
                // 50 ms after its first tick, before its notice's read).
                let as_learned = if learned == Learned::Load && loaded {
                    Learned::Notice
                } else {
                    learned
                };
                plan(&timing, from, as_learned).map(|mut next| {
                    if as_learned == Learned::Load && next.is_overdue(from) {
                        // A late or catch-up tick found by a load outside a handoff:
                        // wait the load grace; after a takeover spread these ticks
                        // over the start-up jitter (restart storms).
                        let spread = if takeover && !self.options.startup_jitter.is_zero() {
                            self.rng
                                .random_range(0..=self.options.startup_jitter.as_millis() as u64)
                        } else {
                            0
                        };
                        next.due = from.saturating_add(LOAD_GRACE + Duration::from_millis(spread));
                    }
                    next
                })
            }
        };
        // An occurrence already due when it is planned (learned late: a
        // notice or a load that read the row after its time, a `FireOnce`
        // catch-up) waited for the store, not for a handler: like an owed
        // one, it goes on in turn through what falls due while its own
        // delivery runs, instead of Skip's overrun dropping the next one
        // (the long takeover sweep, seed 0 with a failover: a refresh found
        // a row 293 ms after its first tick, whose delivery then overran
        // the second by 7 ms).
        if planned.is_some_and(|p| p.scheduled < now) {
            catch_up = true;
        }
        let Some(next) = planned else {
            // Nothing is left to deliver: every occurrence is at or before the
            // floor, or the schedule ended. A row with an end, or a one-shot,
            // goes (in case its deliverer could not remove it).
            self.queue.remove(&key);
            if timing.end_at.is_some() || timing.is_one_shot() {
                self.writes.remove(&key, row.etag);
            }
            return;
        };
        self.queue.set(&row, &timing, next, self.notices.changes());
        if !skipped.is_empty() {
            self.counters
                .takeover_skipped
                .fetch_add(skipped.len() as u64, std::sync::atomic::Ordering::Relaxed);
            self.out.push(Action::TicksSkipped(skipped.len() as u64));
            for at in skipped {
                self.record_run(&key, at, 0, RunOutcome::Skipped);
            }
        }
        if catch_up {
            if let Some(slot) = self.queue.get_mut(&key) {
                slot.catch_up_to = owed_through;
            }
        }
        if !loaded {
            self.queue.hold(&key);
            if let Some(h) = self.held.get_mut(&k) {
                h.waiting.push(key);
            }
        }
    }

    /// The earliest due time of a slot that may be taken now: of a kind below
    /// its cap when `max_deliveries_per_kind` is set.
    fn next_due(&self) -> Option<Timestamp> {
        match self.options.max_deliveries_per_kind {
            Some(cap) => self.queue.next_due_per_kind(cap, &self.in_flight.per_kind),
            None => self.queue.next_due(),
        }
    }

    /// Keeps [`Timer::Due`] at the earliest due time; none while every delivery
    /// slot is taken or the silo is leaving.
    pub(super) fn arm_timer(&mut self) {
        let next = match self.next_due() {
            Some(next) if self.in_flight.total < self.options.max_deliveries && !self.shards.leaving() => {
                next.max(self.pause.until())
            }
            _ => {
                if self.armed.due.take().is_some() {
                    self.out.push(Action::CancelTimer(Timer::Due));
                }
                return;
            }
        };
        if self.armed.due.is_some_and(|at| at <= next) {
            return;
        }
        self.armed.due = Some(next);
        self.out.push(Action::SetTimer(Timer::Due, next));
    }

    pub(super) fn deliver_due(&mut self) {
        let now = self.now;
        if self.shards.leaving() || !self.pause.check(now, self.shards.confirmed(now)) {
            return;
        }
        let room = self.options.max_deliveries.saturating_sub(self.in_flight.total);
        let due = match self.options.max_deliveries_per_kind {
            Some(cap) => self
                .queue
                .take_due_per_kind(now, room, cap, &self.in_flight.per_kind),
            None => self.queue.take_due(now, room),
        };
        for key in due {
            let Some(slot) = self.queue.get_mut(&key) else {
                continue;
            };
            let (k, etag, scheduled) = (
                hash_shard(slot.hash, self.shards.shard_count()),
                slot.etag.clone(),
                slot.next.scheduled,
            );
            if !self.shards.may_deliver(k, now) {
                // Its shard is stopping (its release reads the slot) or loading.
                if self.held.get(&k).is_some_and(|h| h.stopping) {
                    slot.delivering = false;
                    self.queue.hold(&key);
                } else {
                    // Held back until the shard may deliver (its load, its
                    // takeover time): owed in turn until then, not skipped
                    // as a handler's overrun would be.
                    let due = now.saturating_add(SHARD_RECHECK);
                    slot.catch_up_to = slot.catch_up_to.max(due);
                    self.queue.requeue(&key, Planned { scheduled, due });
                }
                continue;
            }
            if let Some(resumed) = self.pause.catch_up_to(scheduled) {
                // Waited through a pause: delivered in turn, as a catch-up.
                slot.catch_up_to = slot.catch_up_to.max(resumed);
            }
            let tick = ActorId::parse(key.actor())
                .map(|actor| ReminderTick {
                    actor,
                    name: slot.tick_name().to_owned(),
                    first_tick: slot.start_at,
                    period: slot.period(),
                    scheduled,
                    now,
                    etag: Etag::new(slot.etag.as_str()),
                    payload: slot.payload(),
                    fence: rollcall_core::Fence {
                        service: self.service.clone(),
                        shards: self.shards.shard_count(),
                        shard: k,
                        epoch: self.held.get(&k).map_or(0, |h| h.lease_epoch),
                    },
                })
                .map_err(|e| e.to_string());
            let capped = self.options.max_deliveries_per_kind.is_some();
            self.in_flight.started(k, capped.then(|| kind_of(&key)));
            if let Some(h) = self.held.get_mut(&k) {
                h.started_through = h.started_through.max(Some(scheduled));
            }
            self.out.push(Action::Deliver {
                key,
                etag,
                scheduled,
                tick,
            });
        }
    }

    pub(super) fn delivered(
        &mut self,
        key: Key,
        etag: SmolStr,
        scheduled: Timestamp,
        res: Result<(), String>,
    ) {
        let capped = self.options.max_deliveries_per_kind.is_some();
        let k = rollcall_core::actor_shard(key.actor(), self.shards.shard_count());
        let left = self.in_flight.ended(k, capped.then(|| kind_of(&key)));
        let now = self.now;
        let current = self
            .queue
            .get(&key)
            .is_some_and(|s| s.delivering && s.etag == etag && s.next.scheduled == scheduled);
        match res {
            Ok(()) => {
                Counters::bump(&self.counters.ticks_delivered);
                let lateness = now.saturating_duration_since(scheduled);
                self.counters.record_lateness(lateness);
                if lateness > crate::api::LATE_TICK {
                    Counters::bump(&self.counters.ticks_late);
                }
                self.out.push(Action::TickDelivered { lateness });
                if current {
                    let attempts = self.queue.get(&key).map_or(1, |s| u32::from(s.attempts) + 1);
                    self.record_run(&key, scheduled, attempts, RunOutcome::Ok);
                    self.advance(&key, &etag, scheduled);
                    self.pump_writes();
                }
            }
            Err(why) => {
                Counters::bump(&self.counters.delivery_failures);
                if current {
                    self.retry(&key, scheduled, &why);
                }
            }
        }
        self.publish_gauges();
        if left == Some(0)
            && self.held.get(&k).is_some_and(|h| h.draining_until.is_some())
            && self.book.hosts_pending(k) == 0
        {
            // The last delivery the stopping shard waited for: its release
            // load reads the outcome (delivered, or owed when it failed).
            self.drained(k);
        }
        if self.next_due().is_some_and(|d| d <= now) {
            self.deliver_due();
        }
    }

    /// After a delivery of the slot's current occurrence: the next one, the
    /// `last_fired` write of a `FireOnce` reminder, a one-shot's removal.
    fn advance(&mut self, key: &Key, etag: &SmolStr, scheduled: Timestamp) {
        let now = self.now;
        let Some(slot) = self.queue.get_mut(key) else {
            return;
        };
        slot.attempts = 0;
        let etag = Etag::new(etag.as_str());
        if slot.policy == MissedTickPolicy::FireOnce {
            slot.last_fired = now;
            self.writes.fired(key, etag.clone(), now);
        }
        if scheduled < slot.catch_up_to && now.saturating_duration_since(scheduled) <= MAX_CATCH_UP {
            // A catch-up goes on in turn through what fell due while its own
            // deliveries ran, while it stays within `MAX_CATCH_UP` of the
            // present (a handler slower than the period falls behind for
            // ever: past that, it skips what it overran as usual).
            slot.catch_up_to = slot.catch_up_to.max(now);
        }
        // Every slot of a held shard stays in memory: a release reads what it
        // owes from them.
        match after_attempt(&slot.timing(), scheduled, now, true, slot.catch_up_to, now) {
            AfterAttempt::Remove => {
                self.queue.remove(key);
                self.writes.unfire(key);
                self.writes.remove(key, etag);
            }
            AfterAttempt::Next(next) => {
                // A handler that overran occurrences: the first it skipped
                // (worked out only when histories are kept: a calendar's is
                // not free).
                let skipped = (self.options.run_history > 0)
                    .then(|| slot.timing().after(scheduled))
                    .flatten()
                    .filter(|first| *first < next.scheduled);
                self.queue.requeue(key, next);
                if let Some(first) = skipped {
                    self.record_run(key, first, 0, RunOutcome::Skipped);
                }
            }
            AfterAttempt::Retry(_) | AfterAttempt::GiveUp(_) => {}
        }
    }

    /// After a failed delivery: the same occurrence again after a backoff, or
    /// the next one if that comes first.
    fn retry(&mut self, key: &Key, scheduled: Timestamp, why: &str) {
        let now = self.now;
        let Some(slot) = self.queue.get_mut(key) else {
            return;
        };
        slot.attempts = slot.attempts.saturating_add(1);
        let delay = match slot.retry() {
            None => Some(backoff(u32::from(slot.attempts), &mut self.rng)),
            Some(policy) => policy.delay(u32::from(slot.attempts), self.rng.random()),
        };
        let Some(delay) = delay else {
            // The reminder's retry policy is spent: this occurrence is parked
            // or dropped, and the reminder goes on as after a delivery.
            let (park, payload, attempts) = (
                slot.retry().is_some_and(|p| p.park),
                slot.payload(),
                slot.attempts,
            );
            let etag = slot.etag.clone();
            let parked = park.then(|| {
                let mut row = ReminderEntry::new(
                    rollcall_core::parked_service_id(&self.service),
                    key.actor(),
                    format!("{}@{}", key.name(), scheduled.as_millis()),
                    scheduled,
                    None,
                );
                row.payload = payload.map(|p| p.to_vec());
                // Parked rows are paused: listed as such, delivered once resumed.
                row.paused = Some(self.now);
                let name = row.name.clone();
                (name, self.writes.park(row))
            });
            let outcome = match parked {
                Some((_, true)) => RunOutcome::Parked,
                _ => RunOutcome::Failed,
            };
            self.record_run(key, scheduled, u32::from(attempts), outcome);
            match parked {
                Some((parked_as, true)) => {
                    Counters::bump(&self.counters.ticks_parked);
                    self.out.push(Action::TickParked);
                    tracing::warn!(actor = %key.actor(), name = %key.name(), scheduled = %scheduled, error = %why,
                        attempts, parked_as = %parked_as, "reminder tick parked: its retry policy is spent");
                }
                Some((_, false)) => {
                    Counters::bump(&self.counters.ticks_dropped);
                    self.out.push(Action::TickDropped);
                    tracing::error!(actor = %key.actor(), name = %key.name(), scheduled = %scheduled, error = %why,
                        waiting = self.writes.parks_waiting(), "reminder tick dropped: it should be parked, but too many parked ticks wait for the store");
                }
                None => {
                    Counters::bump(&self.counters.ticks_dropped);
                    self.out.push(Action::TickDropped);
                    tracing::warn!(actor = %key.actor(), name = %key.name(), scheduled = %scheduled, error = %why,
                        attempts, "reminder tick dropped: its retry policy is spent");
                }
            }
            self.advance(key, &etag, scheduled);
            self.pump_writes();
            return;
        };
        let retry = now.saturating_add(delay);
        match after_attempt(&slot.timing(), scheduled, now, false, slot.catch_up_to, retry) {
            AfterAttempt::GiveUp(next) => {
                let attempts = u32::from(slot.attempts);
                Counters::bump(&self.counters.ticks_given_up);
                tracing::error!(actor = %key.actor(), name = %key.name(), scheduled = %scheduled, error = %why,
                    attempts = slot.attempts, "reminder tick not delivered before the next one was due; moving on");
                slot.attempts = 0;
                self.queue.requeue(key, next);
                self.record_run(key, scheduled, attempts, RunOutcome::GivenUp);
            }
            plan => {
                tracing::warn!(actor = %key.actor(), name = %key.name(), scheduled = %scheduled, error = %why,
                    attempt = slot.attempts, "reminder tick delivery failed; retrying");
                if let AfterAttempt::Retry(retry) = plan {
                    self.queue.requeue(key, retry);
                }
            }
        }
    }
}

/// The deliveries in flight: in all, per shard (a stopping shard waits for
/// its own) and, with `max_deliveries_per_kind`, per actor kind.
#[derive(Debug, Default)]
pub(super) struct InFlight {
    pub(super) total: usize,
    per_shard: std::collections::BTreeMap<u32, usize>,
    pub(super) per_kind: std::collections::HashMap<SmolStr, usize>,
}

impl InFlight {
    /// A delivery in shard `k` started; `kind` when kinds are capped.
    fn started(&mut self, k: u32, kind: Option<&str>) {
        self.total += 1;
        *self.per_shard.entry(k).or_default() += 1;
        if let Some(kind) = kind {
            *self.per_kind.entry(SmolStr::new(kind)).or_default() += 1;
        }
    }

    /// A delivery in shard `k` ended; answers how many of the shard's are
    /// still in flight (`None`: none was).
    fn ended(&mut self, k: u32, kind: Option<&str>) -> Option<usize> {
        self.total = self.total.saturating_sub(1);
        if let Some(kind) = kind {
            if let Some(n) = self.per_kind.get_mut(kind) {
                *n = n.saturating_sub(1);
                if *n == 0 {
                    self.per_kind.remove(kind);
                }
            }
        }
        let n = self.per_shard.get_mut(&k)?;
        *n = n.saturating_sub(1);
        let left = *n;
        if left == 0 {
            self.per_shard.remove(&k);
        }
        Some(left)
    }

    /// The deliveries of shard `k` in flight.
    pub(super) fn of_shard(&self, k: u32) -> usize {
        self.per_shard.get(&k).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod in_flight_tests {
    use super::InFlight;

    #[test]
    fn in_flight_counts_in_all_per_shard_and_per_kind() {
        let mut f = InFlight::default();
        f.started(1, Some("cart"));
        f.started(1, Some("cart"));
        f.started(2, None);
        assert_eq!((f.total, f.of_shard(1), f.of_shard(2)), (3, 2, 1));
        assert_eq!(f.per_kind.get("cart"), Some(&2));
        assert_eq!(f.ended(1, Some("cart")), Some(1));
        assert_eq!(f.ended(1, Some("cart")), Some(0));
        assert!(f.per_kind.is_empty(), "a kind with none running is forgotten");
        assert_eq!(f.ended(2, None), Some(0));
        assert_eq!(f.ended(3, None), None, "a shard with none in flight");
        assert_eq!(f.total, 0, "never below zero");
    }
}
