//! The reminder service's rules as a sans-io state machine, built like the
//! membership's `SiloMachine`: [`ReminderMachine::handle`] takes the time and one
//! [`Event`] (a membership view, notices and hints from other silos, the result of
//! a table or lease call or of a delivery, a timer) and returns the [`Action`]s to
//! carry out. It does no I/O, reads no clock and spawns nothing; the agent (one
//! actix actor per silo) only carries its actions out and feeds the results back,
//! and the virtual-time world of [`crate::sim`] drives many of them against the
//! real in-memory tables.
//!
//! Which shards this silo delivers is decided by the shard leases in the store
//! ([`crate::shards`]: the [`ShardMachine`] inside). This machine adds what
//! happens within a held shard:
//! - **Acquire load.** The shard's rows are read and planned from its lease: a
//!   reminder named in the lease's exceptions from its exception; any other from
//!   its first occurrence after the watermark `W` (each owed one delivered in
//!   turn); after a crash (a takeover) by the missed-tick policy from the
//!   takeover time. Owed occurrences older than [`MAX_CATCH_UP`] are planned by
//!   the policy too (a shard nobody held for long).
//! - **Delivery** only while the shard machine says so
//!   ([`ShardMachine::may_deliver`]) and the silo is Active.
//! - **Release.** Delivery in the shard stops, its rows are read once more, and
//!   the release records every reminder whose first undelivered occurrence is at
//!   or before now: the ones waiting or retrying here, and the rows this silo
//!   never saw (registered after its last read, their notice gone elsewhere).
//!   A delivery still running counts as started.
//! - **Notices** ("re-read this row") from registering silos; refresh loads
//!   every `refresh_reminder_list_period`; `last_fired` writes and one-shot
//!   removals.
//!
//! Bounded work (under any fault):
//!
//! | work | bound |
//! |---|---|
//! | shard loads | [`MAX_LOADS`] running, the rest queued (one per shard and kind); each reads in pieces of about [`LOAD_PIECE_ROWS`] rows |
//! | deliveries in flight | `max_deliveries` of the options (default [`MAX_DELIVERIES`]; the rest wait in the queue, in due order) |
//! | notice reads in flight | [`MAX_NOTICE_READS`] (beyond: a refresh of the shard) |
//! | queued notices | [`NOTICE_QUEUE`] (beyond: dropped; the refresh covers them), taken [`NOTICE_BATCH`] per event |
//! | pending `last_fired` writes and one-shot removals | one per reminder, [`MAX_WRITES`] in flight |
//! | lease calls | [`MAX_LEASE_CALLS`] in flight, the rest queued in order; at most one per shard ([`crate::shards`], rule 6) |
//! | retries | backoff timers (full jitter, at most [`MAX_BACKOFF`]; loads at most [`MAX_LOAD_BACKOFF`]), never a loop |

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use rollcall_core::lease::{LeaseException, LeaseStatus, ShardLease};
use rollcall_core::{
    actor_shard, hash_shard, Etag, MembershipSnapshot, MissedTickPolicy, ReminderEntry, ReminderOptions,
    SiloAddress, Timestamp,
};
use serde::{Deserialize, Serialize};
use smol_str::SmolStr;

use crate::api::{ActorId, Counters, ReminderError, ReminderTick};
pub use crate::queue::Key;
use crate::queue::{key_of, Queue};
use crate::ring::RingRange;
use crate::schedule::{after_attempt, plan, AfterAttempt, Learned, Planned, Timing};
use crate::shards::{shard_range, ShardAction, ShardEvent, ShardMachine, ShardOptions};

/// The default of `ReminderOptions::max_deliveries`: deliveries running at
/// once per silo.
pub const MAX_DELIVERIES: usize = 1024;
/// Parked occurrences waiting to be written (the store is out or slow), at
/// most: one more is dropped instead, counted and logged as an error.
pub const MAX_PARKED: usize = 1024;
/// Notice-triggered row reads running at once.
pub const MAX_NOTICE_READS: usize = 64;
/// Shard loads running at once.
pub const MAX_LOADS: usize = 16;
/// Lease reads and writes in flight at once (the rest wait in order): a silo
/// that starts and is assigned a thousand shards does not send a thousand
/// calls at once.
pub const MAX_LEASE_CALLS: usize = 64;
/// Deleted rows remembered between two loads (see `ReminderMachine::deleted`).
const MAX_DELETED: usize = 4096;
/// Notices queued for the agent.
pub const NOTICE_QUEUE: usize = 1024;
/// Notices handed to the machine per event.
pub const NOTICE_BATCH: usize = 256;
/// About how many rows a load reads with one `read_rows_in_range` and handles in
/// one event: the width of the next piece follows the density read so far.
pub const LOAD_PIECE_ROWS: u64 = 2048;
/// The narrowest piece (1/65,536 of the ring).
const MIN_PIECE_WIDTH: u32 = 1 << 16;
/// How long an overdue tick found by a load outside a handoff waits before
/// delivery (a registration rewritten meanwhile is read first): 1 s.
pub const LOAD_GRACE: Duration = Duration::from_secs(1);
/// Occurrences owed by a handoff are delivered in turn when at most this old at
/// the acquire; older ones (a shard nobody held for long: the whole cluster was
/// down) are planned by the missed-tick policy: 60 s.
pub const MAX_CATCH_UP: Duration = Duration::from_secs(60);
/// Most exceptions one release records (a lease row stays under
/// [`MAX_LEASE_BYTES`](rollcall_core::lease::MAX_LEASE_BYTES)); past it
/// the rest are logged and lost.
pub const MAX_EXCEPTIONS: usize = 1024;
/// How long a silo that is not Active (or has not confirmed its row lately)
/// waits before it looks at its due ticks again: 1 s.
pub const INACTIVE_RECHECK: Duration = Duration::from_secs(1);
/// How long a due tick of a shard that may not deliver yet (its load runs)
/// waits before it is looked at again: 100 ms.
const SHARD_RECHECK: Duration = Duration::from_millis(100);
/// `last_fired` writes and one-shot removals running at once.
pub const MAX_WRITES: usize = 16;
/// Longest wait between retries of deliveries and writes: 60 s.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// Longest wait between retries of a failed load: 5 s.
pub const MAX_LOAD_BACKOFF: Duration = Duration::from_secs(5);
/// How many times a registering silo sends a notice that its owner did not take.
pub const NOTICE_ATTEMPTS: u32 = 6;
/// The wait between two such attempts: 500 ms.
pub const NOTICE_RETRY: Duration = Duration::from_millis(500);

/// The notice a registering silo sends to the holder of the reminder's shard:
/// "re-read this reminder".
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ChangedNotice {
    /// The reminder's service id.
    pub service: String,
    /// The actor id, as stored (`kind/key`).
    pub actor: String,
    /// The reminder name.
    pub name: String,
}

/// "I released this shard" ([`ShardEvent::Hint`]), sent best effort to the
/// shard's owner in the releasing silo's view.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ReleaseHint {
    /// The service id.
    pub service: String,
    /// The shard.
    pub shard: u32,
}

/// The retry rule of the notice a registering silo sends after a registration
/// change: to the holder its shard's lease names; when that silo did not take
/// it, again [`NOTICE_RETRY`] later to the holder the lease names then,
/// [`NOTICE_ATTEMPTS`] sends in all. Past that the holder's refresh covers the
/// change. Sans-io: the
/// caller sends and waits; [`NoticeRetry::after_send`] says whether and when to
/// send again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoticeRetry {
    notice: ChangedNotice,
    sent: u32,
}

impl NoticeRetry {
    /// The notice "re-read `actor`'s reminder `name`" of `service`, not sent yet.
    pub fn new(service: &str, actor: &str, name: &str) -> Self {
        NoticeRetry {
            notice: ChangedNotice {
                service: service.to_owned(),
                actor: actor.to_owned(),
                name: name.to_owned(),
            },
            sent: 0,
        }
    }

    /// The notice to send.
    pub fn notice(&self) -> &ChangedNotice {
        &self.notice
    }

    /// After one send, `taken` or not: the wait before the next send
    /// ([`NOTICE_RETRY`]), or `None` when there is none to do.
    pub fn after_send(&mut self, taken: bool) -> Option<Duration> {
        self.sent += 1;
        (!taken && self.sent < NOTICE_ATTEMPTS).then_some(NOTICE_RETRY)
    }
}

/// Where a registration's notice goes, by the shard's lease read after the row
/// was written: the holder it names, or none when nobody holds the shard (its
/// next acquire's load reads the row).
pub fn notice_target(lease: &ShardLease) -> Option<SiloAddress> {
    lease.owner.filter(|_| lease.status == LeaseStatus::Owned)
}

/// The notice topic of a service's reminder machines.
pub fn topic(service_id: &str) -> String {
    let hash = xxhash_rust::xxh32::xxh32(service_id.as_bytes(), 0);
    format!("rollcall.reminders/{hash:08x}")
}

/// The topic of a service's release hints ([`ReleaseHint`]).
pub fn release_topic(service_id: &str) -> String {
    format!("{}/release", topic(service_id))
}

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

/// A message that reached the silo on one of the service's topics.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Inbound {
    /// A message: its sender and its body (JSON).
    Message {
        /// The sending silo.
        from: SiloAddress,
        /// The body as sent.
        body: Vec<u8>,
    },
    /// This many messages were dropped because the silo's queue was full.
    Dropped(u64),
}

/// A machine timer; at most one of each armed.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Timer {
    /// The earliest due tick; answer with [`Event::Due`].
    Due,
    /// Retry the loads after a failure.
    LoadRetry,
    /// Retry the writes that failed.
    WriteRetry,
    /// The periodic reload (`refresh_reminder_list_period`).
    Refresh,
    /// The shard machine's timer ([`ShardAction::SetTimer`]).
    Shards,
}

/// A table write the machine asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// `update_last_fired(actor, name, etag, at)` (a `FireOnce` reminder ticked).
    LastFired {
        /// The reminder.
        key: Key,
        /// The row's etag when it was scheduled.
        etag: Etag,
        /// The time of the delivery.
        at: Timestamp,
    },
    /// `remove_row(actor, name, etag)` (a one-shot reminder ticked).
    Remove {
        /// The reminder.
        key: Key,
        /// The row's etag when it was scheduled.
        etag: Etag,
    },
    /// `upsert_row(row)` into the service's parked table
    /// ([`parked_service_id`](rollcall_core::parked_service_id)):
    /// an occurrence whose retry policy is spent and says park. Idempotent (the
    /// row's name holds the occurrence), so a write that may have landed is
    /// simply written again.
    Park {
        /// The parked occurrence as a one-shot row.
        row: Box<ReminderEntry>,
    },
}

/// What happens to a reminder machine.
#[derive(Debug)]
pub enum Event {
    /// The service started: arm the periodic reload.
    Start,
    /// The silo's membership view changed (or was published again).
    View(Arc<MembershipSnapshot>),
    /// Messages on the notice topic ([`ChangedNotice`]), at most [`NOTICE_BATCH`].
    Notices(Vec<Inbound>),
    /// Messages on the release topic ([`ReleaseHint`]).
    Releases(Vec<Inbound>),
    /// The silo leaves gracefully: release every shard. Answered by
    /// [`Action::FinishLeave`] (or [`Action::LeaveDone`] if it was leaving already).
    Leave,
    /// [`Timer::Due`] fired; `active`: whether the silo is Active now.
    Due {
        /// The silo's own status is Active.
        active: bool,
    },
    /// Any other timer fired.
    Timer(Timer),
    /// The answer to [`Action::ReadRow`].
    RowRead {
        /// The shard's lease epoch when asked.
        gen: u64,
        /// The reminder.
        key: Key,
        /// The row, none if absent, or the error.
        result: Result<Option<ReminderEntry>, ReminderError>,
    },
    /// The answer to [`Action::ReadPiece`].
    PieceRead {
        /// The load, as asked.
        epoch: u32,
        /// The piece read.
        piece: RingRange,
        /// The width the piece was cut with.
        width: u32,
        /// Its rows, or the error.
        result: Result<Vec<ReminderEntry>, ReminderError>,
    },
    /// The end of [`Action::Deliver`]: `Ok` once the recipient's handler completed.
    Delivered {
        /// The reminder.
        key: Key,
        /// The etag it was delivered under.
        etag: SmolStr,
        /// The occurrence.
        scheduled: Timestamp,
        /// `Err` with the reason when it was not delivered.
        result: Result<(), String>,
    },
    /// The end of [`Action::Write`].
    Written {
        /// The write, as asked.
        write: Write,
        /// Its result.
        result: Result<(), ReminderError>,
    },
    /// The answer to a call of the shard leases: [`Action::ReadLease`]
    /// ([`ShardEvent::Read`]), [`Action::WriteLease`] ([`ShardEvent::Written`]),
    /// [`Action::ReadSilo`] ([`ShardEvent::SiloRead`]) or
    /// [`Action::ConfirmSelf`] ([`ShardEvent::SelfRead`]).
    Shard(ShardEvent),
}

/// What the machine asks its executor to do.
#[derive(Debug)]
pub enum Action {
    /// `read_row(key)`, bounded by `table_operation_timeout`; answer with
    /// [`Event::RowRead`].
    ReadRow {
        /// Echoed in the answer.
        gen: u64,
        /// The reminder.
        key: Key,
    },
    /// `read_rows_in_range(piece)`, bounded; answer with [`Event::PieceRead`].
    ReadPiece {
        /// Echoed in the answer.
        epoch: u32,
        /// The piece.
        piece: RingRange,
        /// Echoed in the answer.
        width: u32,
    },
    /// Deliver `tick` to its actor's recipient, bounded by `delivery_timeout`;
    /// answer with [`Event::Delivered`].
    Deliver {
        /// Echoed in the answer.
        key: Key,
        /// Echoed in the answer.
        etag: SmolStr,
        /// Echoed in the answer.
        scheduled: Timestamp,
        /// The tick (`Err`: none can be built: a failed delivery).
        tick: Result<ReminderTick, String>,
    },
    /// A table write, bounded; answer with [`Event::Written`].
    Write(Write),
    /// Read a shard's lease, bounded; answer with [`Event::Shard`].
    ReadLease(u32),
    /// Compare-and-set a shard's lease over its `etag`, bounded; answer with
    /// [`Event::Shard`].
    WriteLease(ShardLease),
    /// Read a silo's membership row, bounded; answer with [`Event::Shard`].
    ReadSilo(SiloAddress),
    /// Read this silo's own membership row, bounded; answer with
    /// [`Event::Shard`] (with the time the read was issued).
    ConfirmSelf,
    /// Send these release hints (best effort).
    SendHints(Vec<(SiloAddress, ReleaseHint)>),
    /// Every shard is released: answer the leave.
    FinishLeave,
    /// Answer the leave now (the silo was leaving already).
    LeaveDone,
    /// Arm `timer` at this time (replacing the one armed).
    SetTimer(Timer, Timestamp),
    /// Disarm `timer`.
    CancelTimer(Timer),
    /// The first loads of the shards assigned to this silo finished.
    Loaded,
    /// A tick was delivered this late (for the lateness histogram).
    TickDelivered {
        /// Delivery time minus the occurrence.
        lateness: Duration,
    },
    /// This silo's held shards hold this many rows (as last loaded).
    Owned(u64),
    /// A tick was dropped by its reminder's retry policy (for the metrics).
    TickDropped,
    /// A tick was parked by its reminder's retry policy (for the metrics).
    TickParked,
}

/// What a shard load is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum LoadKind {
    /// After an acquire: plan every row from the lease.
    Acquire,
    /// The periodic reconciliation.
    Refresh,
    /// Before a release: find what was not delivered.
    Final,
}

/// A shard load: the pieces of the shard still to read.
#[derive(Debug)]
struct LoadRun {
    shard: u32,
    kind: LoadKind,
    /// Its id, written into `Slot::seen` of every row it reads.
    epoch: u32,
    /// `changes` when it started: slots touched after that are newer than what
    /// it reads.
    since: u64,
    left: VecDeque<RingRange>,
    width: u32,
    rows: u64,
    started: Timestamp,
    /// A final load's findings.
    exceptions: Vec<LeaseException>,
    /// Another load of the shard was asked for while this one ran: this one
    /// may have read past a row written since, so the shard is read again
    /// once it ends.
    again: bool,
}

/// A shard this silo holds (loading, delivering or stopping).
#[derive(Debug)]
struct Held {
    /// The lease epoch (echoed by notice reads).
    epoch: u64,
    /// Occurrences at or before it were delivered by earlier holders (the
    /// lease's watermark when acquired; the takeover time less 1 ms after a
    /// crash).
    floor: Option<Timestamp>,
    /// The previous holder died: plan by the missed-tick policy from this
    /// time (the fence's end: nothing is due before it).
    takeover: Option<Timestamp>,
    /// The lease's exceptions, until the acquire load ends.
    exceptions: HashMap<Key, Timestamp>,
    /// Keys planned while loading (out of the due index until the shard may
    /// deliver).
    waiting: Vec<Key>,
    /// When delivery stopped (the release's watermark).
    stopped_at: Timestamp,
    loaded: bool,
    stopping: bool,
    rows: u64,
    /// A notice for this shard was not read while its acquire load ran (the
    /// notice reads were all taken, or notices were dropped): the load may have
    /// read its rows before that registration, so it is read again once loaded.
    reread: bool,
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
    shards: ShardMachine,
    count: u32,
    held: BTreeMap<u32, Held>,
    queue: Queue,
    /// Bumped on every change from a notice; loads started before a change do
    /// not undo it.
    changes: u64,
    /// Rows a notice read found deleted, with `changes` then (at most
    /// [`MAX_DELETED`]).
    deleted: BTreeMap<Key, u64>,
    pending: VecDeque<(u32, LoadKind)>,
    running: BTreeMap<u32, LoadRun>,
    /// Loads that failed, to run again after the backoff.
    failed: Vec<LoadRun>,
    load_epoch: u32,
    load_failures: u32,
    load_retry: bool,
    loaded_once: bool,
    due_timer: Option<Timestamp>,
    active: bool,
    inactive_until: Timestamp,
    deliveries: usize,
    notice_reads: usize,
    /// Rows a notice read is in flight for, each with whether another notice
    /// named it meanwhile (it is read again once the read ends). One read per
    /// row at a time: two reads of a row can answer out of order, and the
    /// older answer would undo the newer. (Found by the sweep,
    /// `PROPTEST_RNG_SEED=608`: a re-registration's row was read, then an
    /// older read of the same row answered and put the replaced schedule
    /// back.) At most [`MAX_NOTICE_READS`] entries.
    reading: HashMap<Key, bool>,
    persist: BTreeMap<Key, (Etag, Timestamp)>,
    removals: BTreeMap<Key, Etag>,
    /// One-shot removals in flight.
    removing: BTreeMap<Key, Etag>,
    /// Parked occurrences still to write, by their parked row's key (at most
    /// [`MAX_PARKED`]).
    parks: BTreeMap<Key, Box<ReminderEntry>>,
    writes: usize,
    write_retry: bool,
    write_failures: u32,
    leaving: bool,
    shard_timer: Option<Timestamp>,
    /// Lease calls waiting for room ([`MAX_LEASE_CALLS`]), and those in flight.
    lease_calls: VecDeque<Action>,
    lease_in_flight: usize,
    /// Delivery paused (not Active, or not confirmed lately).
    paused: bool,
    /// When delivery last resumed after a pause: occurrences before it that
    /// waited are delivered in turn.
    resumed_at: Timestamp,
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
            shards,
            ring_points_per_silo: options.ring_points_per_silo,
            lease_period: options.lease_period,
            fencing: options.lease_fencing,
            poll: options.lease_poll,
        };
        ReminderMachine {
            me,
            service: service.to_owned(),
            counters: Arc::default(),
            rng,
            now: Timestamp::from_millis(0),
            out: Vec::new(),
            shards: ShardMachine::new(me, shard_options),
            count: shards.max(1),
            held: BTreeMap::new(),
            queue: Queue::default(),
            changes: 0,
            deleted: BTreeMap::new(),
            pending: VecDeque::new(),
            running: BTreeMap::new(),
            failed: Vec::new(),
            load_epoch: 0,
            load_failures: 0,
            load_retry: false,
            loaded_once: false,
            due_timer: None,
            active: false,
            inactive_until: Timestamp::from_millis(0),
            deliveries: 0,
            notice_reads: 0,
            reading: HashMap::new(),
            persist: BTreeMap::new(),
            removals: BTreeMap::new(),
            removing: BTreeMap::new(),
            parks: BTreeMap::new(),
            writes: 0,
            write_retry: false,
            write_failures: 0,
            leaving: false,
            shard_timer: None,
            lease_calls: VecDeque::new(),
            lease_in_flight: 0,
            paused: false,
            resumed_at: Timestamp::EPOCH,
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
    pub(crate) fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }

    /// Whether the first loads of the assigned shards finished.
    pub fn loaded_once(&self) -> bool {
        self.loaded_once
    }

    /// Deliveries in flight.
    pub fn deliveries(&self) -> usize {
        self.deliveries
    }

    /// Table writes in flight.
    pub fn writes_in_flight(&self) -> usize {
        self.writes
    }

    /// Notice reads in flight.
    pub fn notice_reads(&self) -> usize {
        self.notice_reads
    }

    /// Handles `event` at `now`; returns what to do.
    pub fn handle(&mut self, now: Timestamp, event: Event) -> Vec<Action> {
        self.now = now;
        match event {
            Event::Start => {
                let at = now.saturating_add(self.options.refresh_reminder_list_period);
                self.out.push(Action::SetTimer(Timer::Refresh, at));
            }
            Event::View(view) => self.feed_shards(ShardEvent::View(view)),
            Event::Notices(batch) => self.notices(batch),
            Event::Releases(batch) => self.hints(batch),
            Event::Leave => {
                if self.leaving {
                    self.out.push(Action::LeaveDone);
                } else {
                    self.leaving = true;
                    self.feed_shards(ShardEvent::Leave);
                }
            }
            Event::Due { active } => {
                self.active = active;
                self.timer(Timer::Due);
            }
            Event::Timer(t) => self.timer(t),
            Event::RowRead { gen, key, result } => self.row_read(gen, key, result),
            Event::PieceRead {
                epoch,
                piece,
                width,
                result,
            } => self.piece_read(epoch, piece, width, result),
            Event::Delivered {
                key,
                etag,
                scheduled,
                result,
            } => self.delivered(key, etag, scheduled, result),
            Event::Written { write, result } => self.written(write, result),
            Event::Shard(answer) => {
                if matches!(answer, ShardEvent::Read { .. } | ShardEvent::Written { .. }) {
                    self.lease_in_flight = self.lease_in_flight.saturating_sub(1);
                }
                self.feed_shards(answer)
            }
        }
        self.check_loaded();
        self.arm_timer();
        std::mem::take(&mut self.out)
    }

    fn timer(&mut self, t: Timer) {
        match t {
            Timer::Due => {
                self.due_timer = None;
                self.deliver_due();
            }
            Timer::LoadRetry => {
                self.load_retry = false;
                for run in std::mem::take(&mut self.failed) {
                    let epoch = run.epoch;
                    self.running.insert(epoch, run);
                    self.next_piece(epoch);
                }
                self.start_loads();
            }
            Timer::WriteRetry => {
                self.write_retry = false;
                self.pump_writes();
            }
            Timer::Refresh => {
                let at = self.now.saturating_add(self.options.refresh_reminder_list_period);
                self.out.push(Action::SetTimer(Timer::Refresh, at));
                self.timer_refresh_now();
            }
            Timer::Shards => {
                self.shard_timer = None;
                self.feed_shards(ShardEvent::Tick);
            }
        }
    }

    /// Feeds the shard machine and carries out what it asks within this machine.
    fn feed_shards(&mut self, event: ShardEvent) {
        let mut actions = self.shards.handle(self.now, event);
        let mut stops = Vec::new();
        while !actions.is_empty() {
            let mut next = Vec::new();
            for a in actions {
                match a {
                    ShardAction::Read(k) => self.lease_calls.push_back(Action::ReadLease(k)),
                    ShardAction::Write(lease) => self.lease_calls.push_back(Action::WriteLease(lease)),
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
                        if self.shard_timer != Some(at) {
                            self.shard_timer = Some(at);
                            self.out.push(Action::SetTimer(Timer::Shards, at));
                        }
                    }
                    ShardAction::Left => self.out.push(Action::FinishLeave),
                    ShardAction::Load { lease, takeover } => self.acquired(lease, takeover),
                    ShardAction::Drop(k) => self.drop_shard(k),
                    ShardAction::Stop(k) => stops.push(k),
                }
            }
            // A final load with nothing left to read answers at once.
            for k in std::mem::take(&mut stops) {
                if let Some(event) = self.stop(k) {
                    next.extend(self.shards.handle(self.now, event));
                }
            }
            actions = next;
        }
        self.pump_lease_calls();
    }

    /// Sends queued lease calls while fewer than [`MAX_LEASE_CALLS`] are in flight.
    fn pump_lease_calls(&mut self) {
        while self.lease_in_flight < MAX_LEASE_CALLS {
            let Some(call) = self.lease_calls.pop_front() else {
                break;
            };
            self.lease_in_flight += 1;
            self.out.push(call);
        }
    }

    /// Rule 3: the shard's rows load and are planned from `lease`.
    fn acquired(&mut self, lease: ShardLease, takeover: Option<Timestamp>) {
        let k = lease.shard;
        self.drop_shard(k);
        let exceptions = lease
            .exceptions
            .iter()
            .map(|e| (Key::new(&e.actor_id, &e.name), e.next))
            .collect();
        self.held.insert(
            k,
            Held {
                epoch: lease.epoch,
                floor: lease.watermark,
                takeover,
                exceptions,
                waiting: Vec::new(),
                stopped_at: Timestamp::EPOCH,
                loaded: false,
                stopping: false,
                rows: 0,
                reread: false,
            },
        );
        self.queue_load(k, LoadKind::Acquire);
        self.start_loads();
    }

    /// Forgets shard `k` (another epoch holds it, or it is taken again).
    fn drop_shard(&mut self, k: u32) {
        if self.held.remove(&k).is_none() {
            return;
        }
        self.cancel_loads(k);
        self.queue.retain_hashes(self.hashes(k), |_| false);
        self.publish_gauges();
        self.start_loads();
    }

    /// Rule 4's first half: delivery in `k` stops, its rows are read once
    /// more. Returns the answer at once when there is nothing to read.
    fn stop(&mut self, k: u32) -> Option<ShardEvent> {
        let Some(held) = self.held.get_mut(&k) else {
            // Nothing held here (cannot happen: a held shard is loaded first).
            return Some(ShardEvent::Stopped {
                shard: k,
                started_through: None,
                exceptions: Vec::new(),
            });
        };
        held.stopping = true;
        held.stopped_at = self.now;
        self.cancel_loads(k);
        self.pending.push_front((k, LoadKind::Final));
        self.start_loads();
        None
    }

    /// The hashes of shard `k`.
    fn hashes(&self, k: u32) -> std::ops::RangeInclusive<u32> {
        let r = shard_range(k, self.count);
        r.begin.wrapping_add(1)..=r.end
    }

    /// Forgets every load of shard `k`, queued, running or failed.
    fn cancel_loads(&mut self, k: u32) {
        self.pending.retain(|(s, _)| *s != k);
        self.running.retain(|_, r| r.shard != k);
        self.failed.retain(|r| r.shard != k);
    }

    fn queue_load(&mut self, k: u32, kind: LoadKind) {
        if self.pending.iter().any(|(s, kd)| *s == k && *kd == kind) {
            return; // it has not started: it will read whatever is there
        }
        // One that started may have read past a row written since (a notice's
        // row, when the notice reads are all taken): it is run again after.
        // (Found by R5: a registration burst coalesced into a running refresh
        // left a one-shot to the next periodic refresh, 5 min later.) Two loads
        // of one shard never run at once: each drops the slots it did not see.
        let again = |r: &mut LoadRun| {
            if r.shard == k && r.kind == kind {
                r.again = kind != LoadKind::Final;
                true
            } else {
                false
            }
        };
        let mut busy = false;
        for r in self.running.values_mut() {
            busy |= again(r);
        }
        for r in &mut self.failed {
            busy |= again(r);
        }
        if !busy {
            self.pending.push_back((k, kind));
        }
    }

    fn start_loads(&mut self) {
        while !self.load_retry && self.running.len() < MAX_LOADS {
            let Some((k, kind)) = self.pending.pop_front() else {
                return;
            };
            if !self.held.contains_key(&k) {
                continue;
            }
            self.load_epoch = self.load_epoch.wrapping_add(1).max(1);
            let epoch = self.load_epoch;
            let range = shard_range(k, self.count);
            let run = LoadRun {
                shard: k,
                kind,
                epoch,
                since: self.changes,
                left: VecDeque::from([range]),
                width: u32::MAX,
                rows: 0,
                started: self.now,
                exceptions: Vec::new(),
                again: false,
            };
            self.running.insert(epoch, run);
            self.next_piece(epoch);
        }
    }

    /// Reads the next piece of load `epoch`, or ends it.
    fn next_piece(&mut self, epoch: u32) {
        let Some(run) = self.running.get_mut(&epoch) else {
            return;
        };
        let Some(range) = run.left.pop_front() else {
            let run = self.running.remove(&epoch).expect("present");
            self.load_finished(run);
            self.start_loads();
            return;
        };
        let (piece, rest) = range.cut(run.width);
        if let Some(rest) = rest {
            run.left.push_front(rest);
        }
        let width = run.width;
        self.out.push(Action::ReadPiece { epoch, piece, width });
    }

    fn piece_read(
        &mut self,
        epoch: u32,
        piece: RingRange,
        width: u32,
        result: Result<Vec<ReminderEntry>, ReminderError>,
    ) {
        let Some(run) = self.running.get_mut(&epoch) else {
            return;
        };
        let rows = match result {
            Ok(rows) => rows,
            Err(e) => {
                // Read the piece again after a backoff.
                run.left.push_front(piece);
                let run = self.running.remove(&epoch).expect("present");
                self.failed.push(run);
                if !self.load_retry {
                    // One failure per retry round (the loads running fail together).
                    Counters::bump(&self.counters.load_failures);
                    self.load_failures += 1;
                    let wait = backoff(self.load_failures, &mut self.rng)
                        .min(MAX_LOAD_BACKOFF)
                        .min(self.options.refresh_reminder_list_period);
                    tracing::warn!(silo = %self.me, error = %e, retry_in = ?wait,
                        "loading reminders failed; the schedule in memory keeps ticking");
                    self.load_retry = true;
                    self.out
                        .push(Action::SetTimer(Timer::LoadRetry, self.now.saturating_add(wait)));
                }
                return;
            }
        };
        self.load_failures = 0;
        run.rows += rows.len() as u64;
        // The next piece: about LOAD_PIECE_ROWS rows at the density just read.
        let w = u64::from(width);
        let next = match rows.len() as u64 {
            0 => w.saturating_mul(8),
            n => (piece.size() * LOAD_PIECE_ROWS / n).clamp(w / 8, w.saturating_mul(8)),
        };
        run.width = next.clamp(u64::from(MIN_PIECE_WIDTH), u64::from(u32::MAX)) as u32;
        let (k, kind, since) = (run.shard, run.kind, run.since);
        for row in rows {
            let key = key_of(&row);
            if self.removals.get(&key) == Some(&row.etag) || self.removing.get(&key) == Some(&row.etag) {
                continue; // a delivered one-shot whose removal is pending
            }
            if self.deleted.get(&key).is_some_and(|c| *c > since) {
                continue; // deleted after this load started
            }
            if kind == LoadKind::Final {
                if let Some(e) = self.owed(k, &row) {
                    if let Some(run) = self.running.get_mut(&epoch) {
                        run.exceptions.push(e);
                    }
                }
                continue;
            }
            match self.queue.get_mut(&key) {
                Some(slot) if slot.etag == row.etag.as_str() || slot.touched > since => slot.seen = epoch,
                _ => {
                    self.schedule_row(k, row, Learned::Load);
                    if let Some(slot) = self.queue.get_mut(&key) {
                        slot.seen = epoch;
                    }
                }
            }
        }
        self.publish_gauges();
        self.next_piece(epoch);
    }

    /// What a release owes for `row` of stopping shard `k`: its first occurrence
    /// not delivered or started, when that is at or before the watermark the
    /// release writes (the stop time, or a takeover's watermark when later: a
    /// `FireOnce` catch-up planned at the takeover time is owed too).
    fn owed(&self, k: u32, row: &ReminderEntry) -> Option<LeaseException> {
        let now = self.held.get(&k).map_or(self.now, |h| {
            h.stopped_at.max(h.floor.unwrap_or(Timestamp::EPOCH))
        });
        // A row whose schedule cannot be read is never delivered: nothing owed.
        let timing = Timing::of(row).ok()?;
        let next = match self.queue.get(&key_of(row)) {
            Some(slot) if slot.etag == row.etag.as_str() => {
                if slot.delivering {
                    // Started: the one after it is owed.
                    timing.after(slot.next.scheduled)?
                } else {
                    slot.next.scheduled
                }
            }
            // Never seen here: everything after the floor is owed.
            _ => match self.held.get(&k).and_then(|h| h.floor) {
                Some(floor) => timing.after(floor)?,
                None => timing.start_at,
            },
        };
        (next <= now).then(|| LeaseException {
            actor_id: row.actor_id.clone(),
            name: row.name.clone(),
            next,
        })
    }

    fn load_finished(&mut self, run: LoadRun) {
        let k = run.shard;
        let Some(held) = self.held.get_mut(&k) else {
            return;
        };
        match run.kind {
            LoadKind::Final => {
                let mut exceptions = run.exceptions;
                if exceptions.len() > MAX_EXCEPTIONS {
                    exceptions.sort_by_key(|e| e.next);
                    tracing::error!(
                        shard = k,
                        owed = exceptions.len(),
                        kept = MAX_EXCEPTIONS,
                        "a release owes more reminders than a lease row holds; the rest are lost"
                    );
                    exceptions.truncate(MAX_EXCEPTIONS);
                }
                let stopped_at = held.stopped_at;
                self.drop_shard(k);
                let event = ShardEvent::Stopped {
                    shard: k,
                    started_through: Some(stopped_at),
                    exceptions,
                };
                self.feed_shards(event);
            }
            LoadKind::Acquire | LoadKind::Refresh => {
                held.rows = run.rows;
                if run.again {
                    held.reread = true;
                }
                let (epoch, since) = (run.epoch, run.since);
                // Slots of the shard the load did not read were deleted.
                let hashes = self.hashes(k);
                self.queue
                    .retain_hashes(hashes, |s| s.seen == epoch || s.touched > since);
                self.deleted.retain(|_, c| *c > since);
                if run.kind == LoadKind::Acquire {
                    let held = self.held.get_mut(&k).expect("present");
                    held.loaded = true;
                    held.exceptions.clear();
                    let waiting = std::mem::take(&mut held.waiting);
                    for key in waiting {
                        if let Some(next) = self.queue.get(&key).map(|s| s.next) {
                            self.queue.requeue(&key, next);
                        }
                    }
                    self.feed_shards(ShardEvent::Loaded {
                        shard: k,
                        read_from: run.started,
                    });
                }
                if let Some(h) = self.held.get_mut(&k).filter(|h| h.loaded && !h.stopping) {
                    if std::mem::take(&mut h.reread) {
                        self.queue_load(k, LoadKind::Refresh);
                    }
                }
                let owned: u64 = self.held.values().map(|h| h.rows).sum();
                self.counters
                    .owned
                    .store(owned, std::sync::atomic::Ordering::Relaxed);
                self.out.push(Action::Owned(owned));
                self.publish_gauges();
            }
        }
    }

    /// The first loads are done once no assigned shard is on its way.
    fn check_loaded(&mut self) {
        if !self.loaded_once && self.shards.settled() && self.running.is_empty() && self.pending.is_empty() {
            self.loaded_once = true;
            Counters::bump(&self.counters.loads);
            self.out.push(Action::Loaded);
        }
    }

    fn hints(&mut self, batch: Vec<Inbound>) {
        for inbound in batch {
            let Inbound::Message { from, body } = inbound else {
                continue; // a lost hint costs a poll
            };
            match serde_json::from_slice::<ReleaseHint>(&body) {
                Ok(h) if h.service == self.service && h.shard < self.count => {
                    self.feed_shards(ShardEvent::Hint { shard: h.shard })
                }
                Ok(_) => {}
                Err(e) => tracing::debug!(%from, error = %e, "undecodable release hint dropped"),
            }
        }
    }

    fn notices(&mut self, batch: Vec<Inbound>) {
        for inbound in batch {
            match inbound {
                Inbound::Message { from, body } => self.notice(from, &body),
                Inbound::Dropped(n) => {
                    tracing::debug!(silo = %self.me, dropped = n,
                        "reminder notices were dropped (queue full); refreshing the held shards");
                    self.timer_refresh_now();
                }
            }
        }
    }

    /// A load round: every held and loaded shard is read again.
    fn timer_refresh_now(&mut self) {
        Counters::bump(&self.counters.loads);
        // Shards still loading are read again once loaded (their load may have
        // read before the registrations of the dropped notices). (Found by R5:
        // a registration burst while a joining silo loaded its shards left a
        // one-shot to the next refresh, 5 min later.)
        for h in self.held.values_mut().filter(|h| !h.loaded && !h.stopping) {
            h.reread = true;
        }
        let loaded: Vec<u32> = self
            .held
            .iter()
            .filter(|(_, h)| h.loaded && !h.stopping)
            .map(|(k, _)| *k)
            .collect();
        for k in loaded {
            self.queue_load(k, LoadKind::Refresh);
        }
        self.start_loads();
    }

    /// One notice: re-reads the reminder it names where this silo holds its
    /// shard.
    fn notice(&mut self, from: SiloAddress, body: &[u8]) {
        let Ok(n) = serde_json::from_slice::<ChangedNotice>(body) else {
            tracing::debug!(%from, "undecodable reminder notice dropped");
            return;
        };
        if n.service != self.service {
            return;
        }
        Counters::bump(&self.counters.notices);
        let k = actor_shard(&n.actor, self.count);
        if self.held.get(&k).is_none_or(|h| h.stopping || !h.loaded) {
            tracing::debug!(silo = %self.me, actor = %n.actor, shard = k, held = ?self.held.get(&k).map(|h| (h.epoch, h.loaded, h.stopping)),
                reads = self.notice_reads, "reminder notice for a shard not loaded here");
        }
        if self.held.get(&k).is_some_and(|h| h.stopping) {
            // Its release reads the row, or the row's first tick comes after
            // the release's watermark.
            return;
        }
        if !self.held.contains_key(&k) {
            // Not held here (any more, or yet): the registering silo read the
            // lease after writing the row, so the shard's next load, or the
            // acquire load this silo has yet to run, reads the row.
            return;
        }
        self.read_row(k, Key::new(&n.actor, &n.name));
    }

    /// Reads row `key` of held shard `k` for a notice: at once, after the
    /// read of it in flight, or by a load when the notice reads are all taken.
    fn read_row(&mut self, k: u32, key: Key) {
        let Some(held) = self.held.get(&k) else {
            return;
        };
        if let Some(again) = self.reading.get_mut(&key) {
            *again = true;
            return;
        }
        if self.notice_reads >= MAX_NOTICE_READS {
            if held.loaded {
                self.queue_load(k, LoadKind::Refresh);
                self.start_loads();
            } else if let Some(h) = self.held.get_mut(&k) {
                h.reread = true;
            }
            return;
        }
        self.notice_reads += 1;
        self.out.push(Action::ReadRow {
            gen: held.epoch,
            key: key.clone(),
        });
        self.reading.insert(key, false);
    }

    fn row_read(&mut self, gen: u64, key: Key, result: Result<Option<ReminderEntry>, ReminderError>) {
        self.notice_reads = self.notice_reads.saturating_sub(1);
        let k = actor_shard(key.actor(), self.count);
        let again = self.reading.remove(&key).unwrap_or(false);
        self.apply_row_read(k, gen, key.clone(), result);
        if again && self.held.get(&k).is_some_and(|h| !h.stopping) {
            self.read_row(k, key);
        }
    }

    fn apply_row_read(
        &mut self,
        k: u32,
        gen: u64,
        key: Key,
        result: Result<Option<ReminderEntry>, ReminderError>,
    ) {
        if !self.held.get(&k).is_some_and(|h| h.epoch == gen && !h.stopping) {
            return; // released or dropped meanwhile: its release read the row
        }
        match result {
            Ok(None) => {
                self.changes += 1;
                self.queue.remove(&key);
                if self.deleted.len() >= MAX_DELETED {
                    self.deleted.pop_first();
                }
                self.deleted.insert(key, self.changes);
            }
            Ok(Some(row)) => {
                if self.queue.get(&key).is_some_and(|s| s.etag == row.etag.as_str()) {
                    return;
                }
                self.changes += 1;
                self.schedule_row(k, row, Learned::Notice);
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading a notified reminder failed; refreshing its shard");
                if self.held.get(&k).is_some_and(|h| h.loaded) {
                    self.queue_load(k, LoadKind::Refresh);
                    self.start_loads();
                }
            }
        }
        self.publish_gauges();
    }

    /// Plans `row` of held shard `k` (see the module docs).
    fn schedule_row(&mut self, k: u32, mut row: ReminderEntry, learned: Learned) {
        let now = self.now;
        let key = key_of(&row);
        if let Some((etag, at)) = self.persist.get(&key) {
            if *etag == row.etag {
                row.last_fired = row.last_fired.max(Some(*at));
            }
        }
        let Some(held) = self.held.get(&k) else {
            return;
        };
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
        let floor_start = if held.loaded {
            None
        } else if let Some(at) = held.exceptions.get(&key) {
            Some(*at)
        } else if held.takeover.is_some() {
            None
        } else {
            Some(match held.floor {
                Some(f) => match timing.after(f) {
                    Some(t) => t,
                    None => {
                        // A one-shot delivered before the floor (its deliverer
                        // removes it), or the last occurrence of an ended
                        // schedule (removed here too, in case its deliverer
                        // could not).
                        self.queue.remove(&key);
                        if timing.end_at.is_some() {
                            self.removals.insert(key, row.etag);
                        }
                        return;
                    }
                },
                None => timing.start_at,
            })
        };
        let (loaded, takeover) = (held.loaded, held.takeover.is_some());
        // After a crash nothing is planned before the takeover time.
        let from = held.takeover.map_or(now, |t| t.max(now));
        let mut catch_up = false;
        let next = match floor_start {
            Some(at) if now.saturating_duration_since(at) <= MAX_CATCH_UP => {
                catch_up = at < now;
                Planned {
                    scheduled: at,
                    due: at.max(now),
                }
            }
            _ => {
                // Nothing before a takeover time: a silo declared Dead while
                // it ran may have delivered up to it.
                let Some(mut next) = plan(&timing, from, learned) else {
                    // Past its end: nothing is left to deliver, and the row goes.
                    self.queue.remove(&key);
                    if timing.end_at.is_some() {
                        self.removals.insert(key, row.etag);
                    }
                    return;
                };
                if learned == Learned::Load && next.is_overdue(from) {
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
            }
        };
        self.queue.set(&row, &timing, next, self.changes);
        if catch_up {
            if let Some(slot) = self.queue.get_mut(&key) {
                slot.catch_up_to = now;
            }
        }
        if !loaded {
            self.queue.hold(&key);
            if let Some(h) = self.held.get_mut(&k) {
                h.waiting.push(key);
            }
        }
    }

    fn publish_gauges(&self) {
        use std::sync::atomic::Ordering;
        self.counters
            .scheduled
            .store(self.queue.len() as u64, Ordering::Relaxed);
    }

    /// Keeps [`Timer::Due`] at the earliest due time; none while every delivery
    /// slot is taken or the silo is leaving.
    fn arm_timer(&mut self) {
        let next = match self.queue.next_due() {
            Some(next) if self.deliveries < self.options.max_deliveries && !self.leaving => {
                next.max(self.inactive_until)
            }
            _ => {
                if self.due_timer.take().is_some() {
                    self.out.push(Action::CancelTimer(Timer::Due));
                }
                return;
            }
        };
        if self.due_timer.is_some_and(|at| at <= next) {
            return;
        }
        self.due_timer = Some(next);
        self.out.push(Action::SetTimer(Timer::Due, next));
    }

    fn deliver_due(&mut self) {
        let now = self.now;
        if self.leaving || now < self.inactive_until {
            return;
        }
        if !self.active || !self.shards.confirmed(now) {
            // Not Active, or (fencing) not confirmed lately: nothing is
            // delivered; look again soon.
            self.inactive_until = now.saturating_add(INACTIVE_RECHECK);
            self.paused = true;
            return;
        }
        if std::mem::take(&mut self.paused) {
            // Confirmed again: nobody took this silo's shards (that needs its
            // row Dead, and Dead is final), so what waited is still owed here.
            self.resumed_at = now;
        }
        let room = self.options.max_deliveries.saturating_sub(self.deliveries);
        for key in self.queue.take_due(now, room) {
            let Some(slot) = self.queue.get_mut(&key) else {
                continue;
            };
            let (k, etag, scheduled) = (
                hash_shard(slot.hash, self.count),
                slot.etag.clone(),
                slot.next.scheduled,
            );
            if !self.shards.may_deliver(k, now) {
                // Its shard is stopping (its release reads the slot) or loading.
                if self.held.get(&k).is_some_and(|h| h.stopping) {
                    slot.delivering = false;
                    self.queue.hold(&key);
                } else {
                    let due = now.saturating_add(SHARD_RECHECK);
                    self.queue.requeue(&key, Planned { scheduled, due });
                }
                continue;
            }
            if scheduled < self.resumed_at {
                // Waited through a pause: delivered in turn, as a catch-up.
                slot.catch_up_to = slot.catch_up_to.max(self.resumed_at);
            }
            let tick = ActorId::parse(key.actor())
                .map(|actor| ReminderTick {
                    actor,
                    name: key.name().to_owned(),
                    first_tick: slot.start_at,
                    period: slot.period(),
                    scheduled,
                    now,
                    etag: Etag::new(slot.etag.as_str()),
                    payload: slot.payload(),
                })
                .map_err(|e| e.to_string());
            self.deliveries += 1;
            self.out.push(Action::Deliver {
                key,
                etag,
                scheduled,
                tick,
            });
        }
    }

    fn delivered(&mut self, key: Key, etag: SmolStr, scheduled: Timestamp, res: Result<(), String>) {
        self.deliveries = self.deliveries.saturating_sub(1);
        let now = self.now;
        let current = self
            .queue
            .get(&key)
            .is_some_and(|s| s.delivering && s.etag == etag && s.next.scheduled == scheduled);
        match res {
            Ok(()) => {
                Counters::bump(&self.counters.ticks_delivered);
                let lateness = now.saturating_duration_since(scheduled);
                if lateness > crate::api::LATE_TICK {
                    Counters::bump(&self.counters.ticks_late);
                }
                self.out.push(Action::TickDelivered { lateness });
                if current {
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
        if self.queue.next_due().is_some_and(|d| d <= now) {
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
            self.persist.insert(key.clone(), (etag.clone(), now));
        }
        // Every slot of a held shard stays in memory: a release reads what it
        // owes from them.
        match after_attempt(&slot.timing(), scheduled, now, true, slot.catch_up_to, now) {
            AfterAttempt::Remove => {
                self.queue.remove(key);
                self.persist.remove(key);
                self.removals.insert(key.clone(), etag);
            }
            AfterAttempt::Next(next) => self.queue.requeue(key, next),
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
            if park && self.parks.len() < MAX_PARKED {
                let mut row = ReminderEntry::new(
                    rollcall_core::parked_service_id(&self.service),
                    key.actor(),
                    format!("{}@{}", key.name(), scheduled.as_millis()),
                    scheduled,
                    None,
                );
                row.payload = payload.map(|p| p.to_vec());
                Counters::bump(&self.counters.ticks_parked);
                self.out.push(Action::TickParked);
                tracing::warn!(actor = %key.actor(), name = %key.name(), scheduled = %scheduled, error = %why,
                    attempts, parked_as = %row.name, "reminder tick parked: its retry policy is spent");
                self.parks.insert(key_of(&row), Box::new(row));
            } else {
                Counters::bump(&self.counters.ticks_dropped);
                self.out.push(Action::TickDropped);
                if park {
                    tracing::error!(actor = %key.actor(), name = %key.name(), scheduled = %scheduled, error = %why,
                        waiting = self.parks.len(), "reminder tick dropped: it should be parked, but too many parked ticks wait for the store");
                } else {
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
                Counters::bump(&self.counters.ticks_given_up);
                tracing::error!(actor = %key.actor(), name = %key.name(), scheduled = %scheduled, error = %why,
                    attempts = slot.attempts, "reminder tick not delivered before the next one was due; moving on");
                slot.attempts = 0;
                self.queue.requeue(key, next);
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

    /// Asks for pending `last_fired` writes and one-shot removals, at most
    /// [`MAX_WRITES`] at once; failures are retried after a backoff.
    fn pump_writes(&mut self) {
        if self.write_retry {
            return;
        }
        while self.writes < MAX_WRITES {
            let write = if let Some((key, etag)) = self.removals.pop_first() {
                self.removing.insert(key.clone(), etag.clone());
                Write::Remove { key, etag }
            } else if let Some((_, row)) = self.parks.pop_first() {
                Write::Park { row }
            } else if let Some((key, (etag, at))) = self.persist.pop_first() {
                Write::LastFired { key, etag, at }
            } else {
                return;
            };
            self.writes += 1;
            self.out.push(Action::Write(write));
        }
    }

    fn written(&mut self, write: Write, result: Result<(), ReminderError>) {
        self.writes = self.writes.saturating_sub(1);
        if let Write::Remove { key, .. } = &write {
            self.removing.remove(key);
        }
        let Err(err) = result else {
            self.write_failures = 0;
            self.pump_writes();
            return;
        };
        match write {
            Write::Remove { key, etag } => {
                self.removals.entry(key).or_insert(etag);
            }
            Write::LastFired { key, etag, at } => {
                self.persist.entry(key).or_insert((etag, at));
            }
            Write::Park { row } => {
                self.parks.entry(key_of(&row)).or_insert(row);
            }
        }
        Counters::bump(&self.counters.write_failures);
        self.write_failures += 1;
        if !self.write_retry {
            let wait = backoff(self.write_failures, &mut self.rng);
            tracing::warn!(error = %err, retry_in = ?wait, "recording a reminder tick failed; retrying");
            self.write_retry = true;
            self.out
                .push(Action::SetTimer(Timer::WriteRetry, self.now.saturating_add(wait)));
        }
    }
}
