//! The reminder service's rules as a sans-io state machine, built like the
//! membership's `SiloMachine`: [`ReminderMachine::handle`] takes the time and one
//! [`Event`] (a membership view, notices and hints from other silos, the result of
//! a table or lease call or of a delivery, a timer) and returns the [`Action`]s to
//! carry out. It does no I/O, reads no clock and spawns nothing; the agent (one
//! actix actor per silo) only carries its actions out and feeds the results back,
//! and the virtual-time world of `crate::sim` drives many of them against the
//! real in-memory tables.
//!
//! Which shards this silo holds is decided by the shard leases in the store
//! ([`crate::shards`]: the [`ShardMachine`] inside); what the holder delivers
//! of a shard, from the lease it acquired, by [`crate::handoff`]. This machine
//! wires them to the loads, the deliveries, the notices and the writes:
//! - **Loads** (`loads.rs`): an acquire load reads the shard's rows and plans
//!   each by [`HeldShard::start`]; a refresh load every
//!   `refresh_reminder_list_period` reconciles; a final load before a release
//!   collects what [`HeldShard::owed`] says the release records.
//! - **Deliveries** (`deliveries.rs`): only while the shard machine says so
//!   ([`ShardMachine::may_deliver`]) and the silo delivers ([`Pause`]).
//! - **Notices** (`notices.rs`): "re-read this row" from registering silos,
//!   and release hints.
//! - **Writes** (`writes.rs`): `last_fired` writes, one-shot removals and parked
//!   occurrences.
//!
//! Bounded work (under any fault):
//!
//! | work | bound |
//! |---|---|
//! | shard loads | [`MAX_LOADS`] running, the rest queued (one per shard and kind); each reads in pieces of about [`LOAD_PIECE_ROWS`] rows |
//! | deliveries in flight | `max_deliveries` of the options (default [`MAX_DELIVERIES`]; the rest wait in the queue, in due order), and at most `max_deliveries_per_kind` of one actor kind when set (its other due ticks wait; other kinds' go first) |
//! | notice reads in flight | [`MAX_NOTICE_READS`] (beyond: a refresh of the shard) |
//! | queued notices | [`NOTICE_QUEUE`] (beyond: dropped; the refresh covers them), taken [`NOTICE_BATCH`] per event |
//! | pending `last_fired` writes and one-shot removals | one per reminder, [`MAX_WRITES`] in flight |
//! | run-history records | [`RUN_QUEUE`] waiting (beyond: the oldest dropped), [`MAX_RUN_WRITES`] appends in flight |
//! | lease calls | [`MAX_LEASE_CALLS`] in flight, the rest queued in order; at most one per shard ([`crate::shards`], rule 6) |
//! | retries | backoff timers (full jitter, at most [`MAX_BACKOFF`]; loads at most [`MAX_LOAD_BACKOFF`]), never a loop |

mod deliveries;
mod io;
mod lease_calls;
mod loads;
mod notices;
mod runs;
mod wire;
mod writes;

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use rollcall_core::lease::ShardLease;
use rollcall_core::ownership::HeldBook;
use rollcall_core::{ReminderOptions, SiloAddress, Timestamp};

use crate::api::Counters;
pub use crate::handoff::{HeldShard, Pause, INACTIVE_RECHECK, MAX_CATCH_UP};
pub use crate::queue::Key;
use crate::queue::Queue;
use crate::shards::{shard_range, ShardAction, ShardEvent, ShardMachine, ShardOptions};
pub use deliveries::{LOAD_GRACE, MAX_DELIVERIES, MAX_SKIPPED_RECORDS};
pub use io::{Action, Event, Inbound, Timer};
use lease_calls::LeaseCalls;
pub use lease_calls::MAX_LEASE_CALLS;
pub use loads::{LoadId, LOAD_PIECE_ROWS, MAX_LOADS, MAX_LOAD_BACKOFF};
use loads::{LoadKind, Loads};
use notices::NoticeReads;
pub use notices::{MAX_NOTICE_READS, NOTICE_BATCH, NOTICE_QUEUE};
use runs::Runs;
pub use runs::{RunWrite, MAX_RUN_WRITES, RUN_QUEUE};
pub use wire::{
    notice_target, release_topic, topic, ChangedNotice, NoticeRetry, ReleaseHint, ShardNotice,
    NOTICE_ATTEMPTS, NOTICE_RETRY,
};
#[cfg(any(feature = "runtime", feature = "sim"))]
pub(crate) use writes::apply_write;
use writes::WriteQueue;
pub use writes::{Write, MAX_PARKED, MAX_WRITES};

/// Longest wait between retries of deliveries and writes: 60 s.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);

/// The wait before retry number `attempt` (1 for the first): exponential backoff
/// with full jitter from 1 s, capped at [`MAX_BACKOFF`].
pub fn backoff(attempt: u32, rng: &mut StdRng) -> Duration {
    rollcall_core::protocol::backoff_delay(
        attempt.saturating_sub(1),
        Duration::from_secs(1),
        MAX_BACKOFF,
        rng.random(),
    )
}

/// The timers armed, with their times.
#[derive(Debug, Default)]
struct Armed {
    due: Option<Timestamp>,
    shards: Option<Timestamp>,
}

/// One silo's reminder service as a state machine (see the module docs).
pub struct ReminderMachine {
    me: SiloAddress,
    service: String,
    options: Arc<ReminderOptions>,
    counters: Arc<Counters>,
    rng: StdRng,
    now: Timestamp,
    out: Vec<Action>,
    /// The lease rules (the ownership layer's): which shards this silo
    /// holds; also the shard count, the leave and the clock bound.
    shards: ShardMachine,
    held: BTreeMap<u32, HeldShard>,
    /// The shards held and kept (not stopping) by epoch, their takeover
    /// times, the actor hosts ([`Event::Hosts`]) and the releases waiting
    /// for them: what [`Action::Held`] publishes.
    book: HeldBook,
    queue: Queue,
    loads: Loads,
    notices: NoticeReads,
    writes: WriteQueue,
    runs: Runs,
    lease_calls: LeaseCalls<Action>,
    /// Deliveries in flight: in all, per shard, per kind.
    in_flight: deliveries::InFlight,
    /// Whether the silo delivers (Active and confirmed), and the resume rule.
    pause: Pause,
    armed: Armed,
}

impl ReminderMachine {
    /// The machine of silo `me` for service `service` with `shards` shards, its
    /// random choices (backoff jitter, start-up spread) drawn from `rng`.
    pub fn new(
        me: SiloAddress,
        service: &str,
        options: Arc<ReminderOptions>,
        shards: u32,
        rng: StdRng,
    ) -> Self {
        let shard_options = ShardOptions {
            shards: shards.max(1),
            ring_points_per_silo: options.ring_points_per_silo,
            lease_period: options.lease_period,
            fencing: options.lease_fencing,
            poll: options.lease_poll,
            checkpoint: options.lease_checkpoint_interval,
        };
        ReminderMachine {
            me,
            service: service.to_owned(),
            counters: Arc::default(),
            rng,
            now: Timestamp::from_millis(0),
            out: Vec::new(),
            shards: ShardMachine::new(me, shard_options),
            held: BTreeMap::new(),
            book: HeldBook::new(),
            queue: if options.max_deliveries_per_kind.is_some() {
                Queue::per_kind()
            } else {
                Queue::default()
            },
            loads: Loads::default(),
            notices: NoticeReads::default(),
            writes: WriteQueue::default(),
            runs: Runs::default(),
            lease_calls: LeaseCalls::default(),
            in_flight: deliveries::InFlight::default(),
            pause: Pause::default(),
            armed: Armed::default(),
            options,
        }
    }

    /// This silo.
    pub fn me(&self) -> SiloAddress {
        self.me
    }

    /// This silo's counters (see [`ReminderStats`](crate::ReminderStats)).
    pub fn stats(&self) -> crate::ReminderStats {
        self.counters.read()
    }

    /// The counters, shared with the service handle.
    #[cfg(feature = "runtime")]
    pub(crate) fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }

    /// Whether the first loads of the assigned shards finished.
    pub fn loaded_once(&self) -> bool {
        self.loads.loaded_once()
    }

    /// Deliveries in flight.
    pub fn deliveries(&self) -> usize {
        self.in_flight.total
    }

    /// Table writes in flight.
    pub fn writes_in_flight(&self) -> usize {
        self.writes.in_flight()
    }

    /// Notice reads in flight.
    pub fn notice_reads(&self) -> usize {
        self.notices.in_flight()
    }

    /// Handles `event` at `now`; returns what to do.
    pub fn handle(&mut self, now: Timestamp, event: Event) -> Vec<Action> {
        self.now = now;
        match event {
            Event::Hosts(delta) => self.book.hosts_changed(delta),
            Event::HostDrained { shard, epoch } => {
                let idle = self.in_flight.of_shard(shard) == 0;
                let last = self.book.host_drained(shard, epoch);
                let waiting = last
                    && self
                        .held
                        .get(&shard)
                        .is_some_and(|h| h.lease_epoch == epoch && h.draining_until.is_some());
                if waiting && idle {
                    self.drained(shard);
                }
            }
            Event::Start => {
                let at = now.saturating_add(self.options.refresh_reminder_list_period);
                self.out.push(Action::SetTimer(Timer::Refresh, at));
            }
            Event::View(view) => self.feed_shards(ShardEvent::View(view)),
            Event::Clock {
                within_bound,
                max_offset,
            } => {
                self.feed_shards(ShardEvent::Clock {
                    within_bound,
                    max_offset,
                });
            }
            Event::Notices(batch) => self.notices(batch),
            Event::Releases(batch) => self.hints(batch),
            Event::Leave => {
                if self.shards.leaving() {
                    self.out.push(Action::LeaveDone);
                } else {
                    self.feed_shards(ShardEvent::Leave);
                }
            }
            Event::Due { active } => {
                self.pause.set_active(active);
                self.timer(Timer::Due);
            }
            Event::Timer(t) => self.timer(t),
            Event::RowRead {
                lease_epoch,
                key,
                result,
            } => self.row_read(lease_epoch, key, result),
            Event::PieceRead {
                load,
                piece,
                width,
                result,
            } => self.piece_read(load, piece, width, result),
            Event::Delivered {
                key,
                etag,
                scheduled,
                result,
            } => self.delivered(key, etag, scheduled, result),
            Event::Written { write, result } => self.written(write, result),
            Event::RunAppended { ok } => self.run_appended(ok),
            Event::Shard(answer) => {
                if matches!(answer, ShardEvent::Read { .. } | ShardEvent::Written { .. }) {
                    self.lease_calls.answered();
                }
                self.feed_shards(answer)
            }
        }
        let shards = &self.shards;
        if self.loads.first_done(|| shards.settled()) {
            Counters::bump(&self.counters.loads);
            self.out.push(Action::Loaded);
        }
        self.arm_timer();
        // The runtime adds the monotonic deadlines when it publishes.
        if let Some(held) = self.book.publish(self.shards.confirmed_until()) {
            self.out.push(Action::Held(held));
        }
        std::mem::take(&mut self.out)
    }

    fn timer(&mut self, t: Timer) {
        match t {
            Timer::Due => {
                self.armed.due = None;
                self.deliver_due();
            }
            Timer::LoadRetry => {
                for load in self.loads.retry() {
                    self.next_piece(load);
                }
                self.start_loads();
            }
            Timer::WriteRetry => {
                self.writes.retry();
                self.pump_writes();
            }
            Timer::Refresh => {
                let at = self.now.saturating_add(self.options.refresh_reminder_list_period);
                self.out.push(Action::SetTimer(Timer::Refresh, at));
                self.refresh_now();
            }
            Timer::Drain => {
                let now = self.now;
                let over: Vec<u32> = self
                    .held
                    .iter()
                    .filter(|(_, h)| h.draining_until.is_some_and(|t| t <= now))
                    .map(|(k, _)| *k)
                    .collect();
                for k in over {
                    tracing::warn!(
                        shard = k,
                        in_flight = self.in_flight.of_shard(k),
                        hosts_pending = self.book.hosts_pending(k),
                        "deliveries or activations still running when the drain ended: the release goes on"
                    );
                    self.drained(k);
                }
            }
            Timer::Shards => {
                self.armed.shards = None;
                self.feed_shards(ShardEvent::Tick);
            }
        }
    }

    /// Feeds the shard machine and carries out what it asks within this machine.
    pub(super) fn feed_shards(&mut self, event: ShardEvent) {
        let mut actions = self.shards.handle(self.now, event);
        let mut stops = Vec::new();
        while !actions.is_empty() {
            let mut next = Vec::new();
            for a in actions {
                match a {
                    ShardAction::Read(k) => self.lease_calls.push(Action::ReadLease(k)),
                    ShardAction::ReadHead(k) => self.lease_calls.push(Action::ReadLeaseHead(k)),
                    ShardAction::Write(lease) => self.lease_calls.push(Action::WriteLease(lease)),
                    ShardAction::ReadSilo(s) => self.out.push(Action::ReadSilo(s)),
                    ShardAction::ConfirmSelf => self.out.push(Action::ConfirmSelf),
                    ShardAction::Hint { shard, to } => {
                        let hint = ReleaseHint {
                            service: self.service.clone(),
                            shard,
                        };
                        self.out.push(Action::SendHints(vec![(to, hint)]));
                    }
                    ShardAction::SetTimer(at) => {
                        if self.armed.shards != Some(at) {
                            self.armed.shards = Some(at);
                            self.out.push(Action::SetTimer(Timer::Shards, at));
                        }
                    }
                    ShardAction::Left => self.out.push(Action::FinishLeave),
                    ShardAction::Load { lease, takeover } => self.acquired(lease, takeover),
                    ShardAction::Drop(k) => self.drop_shard(k),
                    ShardAction::Stop(k) => stops.push(k),
                    ShardAction::Checkpoint(ks) => next.extend(self.progress(&ks)),
                }
            }
            // A final load with nothing left to read answers at once; one
            // that waits (for deliveries in flight, for the store) has the
            // progress at the stop checkpointed meanwhile (shards rule 11).
            for k in std::mem::take(&mut stops) {
                match self.stop(k) {
                    Some(event) => next.extend(self.shards.handle(self.now, event)),
                    None => next.extend(self.progress(&[k])),
                }
            }
            actions = next;
        }
        self.out.extend(self.lease_calls.send());
    }

    /// Shards rule 3: the shard's rows load and are planned from `lease`.
    fn acquired(&mut self, lease: ShardLease, takeover: Option<Timestamp>) {
        let k = lease.shard;
        self.drop_shard(k);
        let (done, owed): (Vec<_>, Vec<_>) = lease.exceptions.iter().partition(|e| e.done);
        let exceptions = owed
            .iter()
            .map(|e| (Key::new(&e.actor_id, &e.name), e.next))
            .collect();
        let mut held = HeldShard::acquired(lease.epoch, lease.watermark, takeover, exceptions);
        held.owed_from = lease.owed_from.or(lease.watermark);
        if takeover.is_some() {
            // Shards rule 11: owed from the Dead holder's checkpoint; a row
            // whose first occurrence is within the clock bound before it
            // may have been registered after it (by a clock behind).
            held.checkpoint = lease.owed_from;
            held.clock_bound = self.shards.max_clock_offset();
        }
        held.exception_etags = owed
            .iter()
            .filter_map(|e| Some((Key::new(&e.actor_id, &e.name), e.etag.clone()?)))
            .collect();
        if takeover.is_none() {
            held.listed_from = lease.listed_from;
            held.done = done
                .iter()
                .filter_map(|e| Some((Key::new(&e.actor_id, &e.name), e.etag.clone()?)))
                .collect();
        }
        self.book.set(k, Some(held.lease_epoch));
        if let Some(t) = takeover {
            self.book.not_before(k, t);
        }
        self.held.insert(k, held);
        self.loads.queue(k, LoadKind::Acquire);
        self.start_loads();
    }

    /// Shards rule 11: the progress of loaded shard `k`, delivering on: the
    /// latest occurrence started (or the lease's checkpoint, when later)
    /// and every occurrence at or before it that is owed (waiting, failed,
    /// or still running: a crash may repeat it), as
    /// [`checkpoint_of`](crate::shards::checkpoint_of) bounds them.
    fn progress(&mut self, shards: &[u32]) -> Vec<ShardAction> {
        let all = shards.iter().filter_map(|k| self.progress_of(*k)).collect();
        self.shards.handle(self.now, ShardEvent::Progress(all))
    }

    /// [`progress`](Self::progress) of one shard; `None` when not loaded.
    /// A stopping shard's stands still but for its deliveries in flight.
    fn progress_of(&self, k: u32) -> Option<crate::shards::Progress> {
        let held = self.held.get(&k).filter(|h| h.loaded)?;
        let through = held.started_through.max(held.owed_from);
        let owed = match through {
            Some(t) => self
                .queue
                .in_hashes(self.hashes(k))
                .filter(|slot| slot.next.scheduled <= t)
                .map(|slot| rollcall_core::lease::LeaseException {
                    actor_id: slot.key.actor().to_owned(),
                    name: slot.key.name().to_owned(),
                    next: slot.next.scheduled,
                    etag: Some(rollcall_core::Etag::new(slot.etag.as_str())),
                    done: false,
                })
                .collect(),
            None => Vec::new(),
        };
        let (owed_from, exceptions) = crate::shards::checkpoint_of(through, owed);
        Some(crate::shards::Progress {
            shard: k,
            owed_from,
            exceptions,
        })
    }

    /// Forgets shard `k` (another epoch holds it, or it is taken again).
    fn drop_shard(&mut self, k: u32) {
        self.book.set(k, None);
        self.book.end_wait(k);
        if self.held.remove(&k).is_none() {
            return;
        }
        self.loads.cancel(k);
        self.queue.retain_hashes(self.hashes(k), |_| false);
        self.publish_gauges();
        self.start_loads();
    }

    /// Shards rule 4's first half: delivery in `k` stops, its rows are read
    /// once more. Returns the answer at once when there is nothing to read.
    fn stop(&mut self, k: u32) -> Option<ShardEvent> {
        self.book.set(k, None);
        let hosts = match self.held.get(&k) {
            Some(held) => self.book.wait_for_hosts(k, held.lease_epoch),
            None => 0,
        };
        let Some(held) = self.held.get_mut(&k) else {
            // Nothing held here (cannot happen: a held shard is loaded first).
            return Some(ShardEvent::Stopped {
                shard: k,
                started_through: None,
                exceptions: Vec::new(),
                listed_from: None,
            });
        };
        held.stopping = true;
        held.stopped_at = self.now;
        self.loads.cancel(k);
        if self.in_flight.of_shard(k) > 0 || hosts > 0 {
            // Wait for the deliveries in flight (rule 2 of `handoff`) and the
            // hosts' activations of the shard.
            // Deliveries get `MAX_DRAIN`; activations that flush on
            // `Deactivate` get `deactivate_drain` (issue 72, item 3).
            let mut drain = self.options.delivery_timeout.min(crate::handoff::MAX_DRAIN);
            if hosts > 0 {
                drain = drain.max(self.options.deactivate_drain);
            }
            let until = self.now.saturating_add(drain);
            held.draining_until = Some(until);
            self.out.push(Action::SetTimer(Timer::Drain, until));
            return None;
        }
        self.loads.queue_final(k);
        self.start_loads();
        None
    }

    /// The drain of stopping shard `k` is over: its release load runs.
    pub(super) fn drained(&mut self, k: u32) {
        let Some(held) = self.held.get_mut(&k) else {
            return;
        };
        if held.draining_until.take().is_none() {
            return;
        }
        self.book.end_wait(k);
        self.loads.queue_final(k);
        self.start_loads();
    }

    /// The fence of the shard of `actor` as this silo holds it (stopping
    /// included: its release may not have landed), if it holds it.
    pub(super) fn fence_of(&self, actor: &str) -> Option<rollcall_core::Fence> {
        let shard = rollcall_core::actor_shard(actor, self.shards.shard_count());
        self.held.get(&shard).map(|h| rollcall_core::Fence {
            service: self.service.clone(),
            shards: self.shards.shard_count(),
            shard,
            epoch: h.lease_epoch,
        })
    }

    /// The hashes of shard `k`.
    fn hashes(&self, k: u32) -> std::ops::RangeInclusive<u32> {
        let r = shard_range(k, self.shards.shard_count());
        r.begin.wrapping_add(1)..=r.end
    }

    fn publish_gauges(&self) {
        use std::sync::atomic::Ordering;
        self.counters
            .scheduled
            .store(self.queue.len() as u64, Ordering::Relaxed);
    }
}
