//! The reminder service's rules as a sans-io state machine, built like the
//! membership's `SiloMachine`: [`ReminderMachine::handle`] takes the time and one
//! [`Event`] (a membership view, notices and releases from other silos, the result
//! of a table call or of a delivery, a timer) and returns the [`Action`]s to carry
//! out (table reads and writes, deliveries, messages to other silos, timers). It
//! does no I/O, reads no clock and spawns nothing; the agent (one actix actor per
//! silo) only carries its actions out and feeds the results back, and the
//! virtual-time world of [`crate::sim`] drives many of them against the real
//! in-memory table.
//!
//! What it keeps: the ring of the silo's view and the ranges it owns, the
//! reminders due within `loading_window` (a queue ordered by due time), the running range load,
//! the pending `last_fired` writes and one-shot removals, and the handoff state
//! ([`crate::handoff`]: holds, releases sent and received).
//!
//! Bounded work (under any fault):
//!
//! | work | bound |
//! |---|---|
//! | range loads | 1 running + 1 pending (coalesced); each reads its ranges in pieces of about [`LOAD_PIECE_ROWS`] rows, one piece in flight, each handled in its own event |
//! | deliveries in flight | [`MAX_DELIVERIES`] (the rest wait in the queue) |
//! | notice reads in flight | [`MAX_NOTICE_READS`] (beyond: one coalesced load) |
//! | queued notices | [`NOTICE_QUEUE`] (beyond: dropped; a load covers them), taken [`NOTICE_BATCH`] per event; while a load is pending, a registration notice needs no read of its own |
//! | pending `last_fired` writes and one-shot removals | one per reminder, [`MAX_WRITES`] in flight |
//! | releases ([`crate::handoff`]) | one per new owner per ring change, one per silo of the ring on a graceful leave, each in parts of at most [`MAX_HANDOFF_MESSAGE`] bytes; [`EARLY_RELEASES`] sent, received and early ones kept; the last [`RING_LOG`] rings |
//! | holds | at most [`HANDOFF_TIMEOUT`](crate::handoff::HANDOFF_TIMEOUT); one request round every [`REQUEST_AFTER`] while one waits |
//! | retries | backoff timers (full jitter, at most [`MAX_BACKOFF`]; loads at most [`MAX_LOAD_BACKOFF`]), never a loop |
//!
//! Time bounds (checked by the property tests of `reminders/tests/machine.rs`):
//! - a registration is delivered from its first occurrence once its owner read the
//!   notice (or, if the notice was lost, by the next load: at most
//!   `refresh_reminder_list_period` later);
//! - a graceful leave releases every range within [`LEAVE_DRAIN`] plus the sends;
//!   the new owners deliver every occurrence in turn (owed ones at once): none is
//!   lost, none is repeated;
//! - after a crash, the new owner delivers again within the membership's detection
//!   time plus [`HANDOFF_GRACE`](crate::handoff::HANDOFF_GRACE) plus one load; the
//!   occurrences that fell due in between (the failover window) are planned as
//!   after a load (`Skip` drops them, `FireOnce` delivers one).

use std::collections::{BTreeMap, VecDeque};
use std::sync::Arc;
use std::time::Duration;

use rand::rngs::StdRng;
use rand::Rng;
use rollcall_membership_core::{
    actor_hash, Etag, MembershipSnapshot, MissedTickPolicy, ReminderEntry, ReminderOptions, SiloAddress,
    SiloStatus, Timestamp,
};
use serde::{Deserialize, Serialize};
use smol_str::SmolStr;

use crate::api::{ActorId, Counters, ReminderError, ReminderTick};
use crate::handoff::{
    Custody, Floor, HandoffMessage, Holds, Noticed, Release, ReleaseRequest, ReleasedPiece, Start,
    REQUEST_AFTER,
};
pub use crate::queue::Key;
use crate::queue::{key_of, Queue};
use crate::ring::{Ring, RingRange};
use crate::schedule::{after_attempt, occurrence_after, plan, AfterAttempt, Learned, Planned, Timing};

/// Deliveries running at once per silo.
pub const MAX_DELIVERIES: usize = 1024;
/// Notice-triggered row reads running at once.
pub const MAX_NOTICE_READS: usize = 64;
/// Deleted rows remembered between two loads (see `ReminderMachine::deleted`);
/// past it one is forgotten (a load then may schedule it again until the
/// next load drops it).
const MAX_DELETED: usize = 4096;
/// Notices queued for the agent.
pub const NOTICE_QUEUE: usize = 1024;
/// Notices handed to the machine per event.
pub const NOTICE_BATCH: usize = 256;
/// About how many rows a load reads with one `read_rows_in_range` and handles in
/// one event, so that ticks keep flowing while a million rows load: the width of
/// the next piece of the ring follows the density of the rows read so far.
pub const LOAD_PIECE_ROWS: u64 = 2048;
/// The width of the first piece a silo's first load reads (1/64 of the ring).
const FIRST_PIECE_WIDTH: u32 = 1 << 26;
/// The narrowest piece (1/65,536 of the ring).
const MIN_PIECE_WIDTH: u32 = 1 << 16;
/// How long an overdue tick found by a load outside a handoff waits before
/// delivery (a registration rewritten meanwhile is read first): 1 s.
pub const LOAD_GRACE: Duration = Duration::from_secs(1);
/// Releases kept: received before the ring that needs them, received from other
/// silos (to pass on on request), and sent (to send again on request).
pub const EARLY_RELEASES: usize = 64;
/// Largest handoff message (a release or a request, as JSON), in bytes: the
/// transport's notice body limit. Larger ones are sent in parts.
pub const MAX_HANDOFF_MESSAGE: usize = rollcall_membership_core::transport::MAX_NOTICE_BODY;
/// Past rings a silo keeps, with when each began: a gone silo's last release
/// settles nothing where a third silo owned the piece in one of them since the
/// release used to settle it (rule 9 of [`crate::handoff`]).
pub const RING_LOG: usize = 8;
/// Registrations learned from notices of held pieces that a silo keeps from the
/// releases it received ([`crate::handoff::Noticed`]).
pub const MAX_NOTICED: usize = 1024;
/// How often waiting holds are looked at (expiry, requests): 100 ms.
pub const HOLD_CHECK: Duration = Duration::from_millis(100);
/// How long a graceful leave waits for the deliveries in flight before it releases
/// its ranges (a delivery still running then counts as delivered): 2 s.
pub const LEAVE_DRAIN: Duration = Duration::from_secs(2);
/// How long a silo that is not Active waits before it looks at its due ticks
/// again: 1 s.
pub const INACTIVE_RECHECK: Duration = Duration::from_secs(1);
/// `last_fired` writes and one-shot removals running at once.
pub const MAX_WRITES: usize = 16;
/// Longest wait between retries of deliveries and writes: 60 s.
pub const MAX_BACKOFF: Duration = Duration::from_secs(60);
/// Longest wait between retries of a failed load (a ring change waits for it): 5 s.
pub const MAX_LOAD_BACKOFF: Duration = Duration::from_secs(5);

/// How many times a notice is forwarded at most: a registration's notice can go
/// to a silo two membership versions behind the owner's (a joiner's view, then a
/// silo that saw only the first of two joins).
pub const MAX_NOTICE_HOPS: u8 = 3;

/// How many times a registering silo sends a notice that its owner did not take
/// (the owner stopped and the registering silo's view is behind), each time to
/// the owner in its view then.
pub const NOTICE_ATTEMPTS: u32 = 6;
/// The wait between two such attempts: 500 ms.
pub const NOTICE_RETRY: Duration = Duration::from_millis(500);

/// The notice a registering silo sends to the owner: "re-read this reminder".
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ChangedNotice {
    /// The reminder's service id.
    pub service: String,
    /// The actor id, as stored (`kind/key`).
    pub actor: String,
    /// The reminder name.
    pub name: String,
    /// Times it was forwarded: a silo that gets a notice for a range it does not own
    /// in its view forwards it to the owner of its view (the sender's view may be
    /// older), at most [`MAX_NOTICE_HOPS`] times.
    #[serde(default)]
    pub hops: u8,
}

/// The retry rule of the notice a registering silo sends after a registration
/// change: the silo sends it to the owner in its view; when that owner did not
/// take it (it stopped, and the silo's view is behind), the silo sends it again
/// [`NOTICE_RETRY`] later to the owner in its view then, [`NOTICE_ATTEMPTS`]
/// sends in all. Past that the owner's periodic loads cover the change. Sans-io:
/// the caller sends and waits; [`NoticeRetry::after_send`] says whether and when
/// to send again.
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
                hops: 0,
            },
            sent: 0,
        }
    }

    /// The notice to send.
    pub fn notice(&self) -> &ChangedNotice {
        &self.notice
    }

    /// After one send, `taken` or not: the wait before the next send to the owner
    /// of the view then ([`NOTICE_RETRY`]), or `None` when there is none to do
    /// (taken, or [`NOTICE_ATTEMPTS`] sends done).
    pub fn after_send(&mut self, taken: bool) -> Option<Duration> {
        self.sent += 1;
        (!taken && self.sent < NOTICE_ATTEMPTS).then_some(NOTICE_RETRY)
    }
}

/// The notice topic of a service's reminder machines.
pub fn topic(service_id: &str) -> String {
    format!(
        "rollcall.reminders/{:08x}",
        xxhash_rust::xxh32::xxh32(service_id.as_bytes(), 0)
    )
}

/// The topic of a service's range releases ([`crate::handoff`]).
pub fn release_topic(service_id: &str) -> String {
    format!("{}/release", topic(service_id))
}

/// The wait before retry number `attempt` (1 for the first): exponential backoff
/// with full jitter from 1 s, capped at [`MAX_BACKOFF`]
/// ([`backoff_delay`](rollcall_membership_core::protocol::backoff_delay), as the
/// membership machine's retries), so silos that failed together do not retry
/// together.
pub fn backoff(attempt: u32, rng: &mut StdRng) -> Duration {
    rollcall_membership_core::protocol::backoff_delay(
        attempt.saturating_sub(1),
        Duration::from_secs(1),
        MAX_BACKOFF,
        rng.random(),
    )
}

/// The first occurrence of `entry` at or after `t`; `None` for a one-shot whose
/// time is before `t`.
fn occurrence_at_or_after(entry: Timing, t: Timestamp) -> Option<Timestamp> {
    occurrence_after(
        entry.start_at,
        entry.period,
        Timestamp::from_millis(t.as_millis().saturating_sub(1)),
    )
}

/// The next tick of a reminder learned at `now`, its schedule starting as the holds
/// say: `Held` plans as usual (the slot waits out of the due index), `From(floor)`
/// takes the first occurrence at or after the floor (at once if it has passed).
fn planned(timing: Timing, now: Timestamp, learned: Learned, start: Start) -> Option<Planned> {
    match start {
        Start::Free | Start::Held => plan(timing, now, learned),
        Start::From(floor) => {
            let at = occurrence_at_or_after(timing, floor)?;
            Some(Planned {
                scheduled: at,
                due: at.max(now),
            })
        }
    }
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

/// A machine timer. The machine keeps at most one of each armed
/// ([`Action::SetTimer`] replaces the previous one of the kind).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Timer {
    /// The earliest due tick; answer with [`Event::Due`].
    Due,
    /// Look at the waiting holds again ([`HOLD_CHECK`]).
    Holds,
    /// Retry the load that failed.
    LoadRetry,
    /// Retry the writes that failed.
    WriteRetry,
    /// The periodic reload (`refresh_reminder_list_period`).
    Refresh,
    /// The deliveries of a leaving silo had [`LEAVE_DRAIN`] to finish.
    LeaveDrain,
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
    /// Messages on the release topic ([`HandoffMessage`]).
    Releases(Vec<Inbound>),
    /// The silo leaves gracefully: release every range. Answered by
    /// [`Action::FinishLeave`] (or [`Action::LeaveDone`] if it was leaving already).
    Leave,
    /// [`Timer::Due`] fired; `active`: whether the silo is Active now (only an
    /// Active silo delivers).
    Due {
        /// The silo's own status is Active.
        active: bool,
    },
    /// Any other timer fired.
    Timer(Timer),
    /// The answer to [`Action::ReadRow`].
    RowRead {
        /// The ring generation of the request.
        gen: u64,
        /// The reminder.
        key: Key,
        /// The row, none if absent, or the error.
        result: Result<Option<ReminderEntry>, ReminderError>,
    },
    /// The answer to [`Action::ReadPiece`].
    PieceRead {
        /// The load's epoch, as asked.
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
    /// `read_rows_in_range(piece)`, bounded by `table_operation_timeout`; answer
    /// with [`Event::PieceRead`].
    ReadPiece {
        /// Echoed in the answer.
        epoch: u32,
        /// The piece.
        piece: RingRange,
        /// Echoed in the answer.
        width: u32,
    },
    /// Deliver `tick` to its actor's recipient, bounded by `delivery_timeout`
    /// (`Err`: no tick can be built: a failed delivery); answer with
    /// [`Event::Delivered`].
    Deliver {
        /// Echoed in the answer.
        key: Key,
        /// Echoed in the answer.
        etag: SmolStr,
        /// Echoed in the answer.
        scheduled: Timestamp,
        /// The tick.
        tick: Result<ReminderTick, String>,
    },
    /// A table write, bounded by `table_operation_timeout`; answer with
    /// [`Event::Written`].
    Write(Write),
    /// Send these notices (best effort, in order).
    SendNotices(Vec<(SiloAddress, ChangedNotice)>),
    /// Send these handoff messages (each retried a few times).
    SendReleases(Vec<(SiloAddress, HandoffMessage)>),
    /// Send these last releases, then answer the leave.
    FinishLeave(Vec<(SiloAddress, HandoffMessage)>),
    /// Answer the leave now (the silo was leaving already).
    LeaveDone,
    /// Arm `timer` at this time (replacing the one armed).
    SetTimer(Timer, Timestamp),
    /// Disarm `timer`.
    CancelTimer(Timer),
    /// The first load of the owned ranges finished.
    Loaded,
    /// A tick was delivered this late (for the lateness histogram).
    TickDelivered {
        /// Delivery time minus the occurrence.
        lateness: Duration,
    },
    /// The last load found this many rows in the owned ranges.
    Owned(u64),
}

/// A load in progress: the pieces of the owned ranges still to read.
struct LoadRun {
    /// The ring generation it reads for (a ring change abandons it).
    gen: u64,
    /// `changes` when it started: slots touched after that are newer than what it
    /// reads.
    since: u64,
    /// Its epoch, written into `Slot::seen` of every row it reads.
    epoch: u32,
    /// What is left to read of the owned ranges.
    left: VecDeque<RingRange>,
    /// Rows read so far.
    owned: u64,
    /// The pieces it reads, for a partial load (released pieces); `None`: every
    /// owned range.
    only: Option<Vec<RingRange>>,
    /// When it started.
    started: Timestamp,
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
    ring: Ring,
    ranges: Vec<RingRange>,
    ring_gen: u64,
    queue: Queue,
    /// Bumped on every change from a notice; loads started before a change do not
    /// undo it.
    changes: u64,
    /// Rows a notice read found deleted, with `changes` then: a load that started
    /// before does not schedule them again from what it read (at most
    /// [`MAX_DELETED`]; dropped when a load that started after ends).
    deleted: BTreeMap<Key, u64>,
    load: Option<LoadRun>,
    load_epoch: u32,
    /// Width of the next piece a load reads (follows the table's density).
    load_width: u32,
    load_pending: bool,
    load_failures: u32,
    load_retry: bool,
    loaded_once: bool,
    /// Pieces to read again once the running load finished (released pieces).
    reload: Vec<RingRange>,
    /// When [`Timer::Due`] is armed.
    due_timer: Option<Timestamp>,
    /// The silo's status was Active at the last [`Event::Due`].
    active: bool,
    /// The silo was not Active: nothing is looked at before this time.
    inactive_until: Timestamp,
    deliveries: usize,
    notice_reads: usize,
    /// Pending `last_fired` writes: key -> (etag, time).
    persist: BTreeMap<Key, (Etag, Timestamp)>,
    /// Pending one-shot removals: key -> etag.
    removals: BTreeMap<Key, Etag>,
    writes: usize,
    write_retry: bool,
    write_failures: u32,
    /// Ranges gained and not yet released by their previous owners.
    holds: Holds,
    hold_timer: bool,
    /// The membership view the ring was built from.
    view: Option<Arc<MembershipSnapshot>>,
    /// Releases that freed no hold yet (they may arrive before the ring change).
    early: VecDeque<(Timestamp, Release)>,
    /// The silo is leaving: nothing more is delivered, and once the deliveries in
    /// flight finished every range is released.
    leaving: bool,
    /// A leave waits for its releases.
    leave_pending: bool,
    /// The ring before `ring`.
    prev_ring: Arc<Ring>,
    /// The rings before `ring` (at most [`RING_LOG`]), each with when it began,
    /// oldest first; `ring` began at `ring_since`.
    ring_log: VecDeque<(Timestamp, Arc<Ring>)>,
    ring_since: Timestamp,
    /// Registrations of held pieces learned from their notices by the silos
    /// that passed the pieces on (`Release::noticed`), by key, with their etag;
    /// at most [`MAX_NOTICED`] (beyond, the lowest keys go).
    noticed_keys: BTreeMap<Key, String>,
    /// The releases received last (from other silos), to pass on on request.
    received: VecDeque<Release>,
    /// The releases sent last, to send again on request, less what this silo
    /// owns again.
    sent: VecDeque<Release>,
    /// Every release this silo sent last, untrimmed: where a chain of holders
    /// comes back to this silo, its own floor there.
    history: VecDeque<Release>,
    /// The received releases this silo passed on to a third silo, each with `to`
    /// set to that silo: a chain of holders that comes back here waits for it.
    forwarded: VecDeque<Release>,
    /// When the holds last asked for releases (or stopped waiting).
    asked: Timestamp,
    /// When each silo a hold waits for was first seen Dead.
    gone_at: BTreeMap<SiloAddress, Timestamp>,
}

impl ReminderMachine {
    /// The machine of silo `me` for service `service`, its random choices (backoff
    /// jitter, start-up spread) drawn from `rng`: a run is a function of the rng's
    /// seed and the events.
    pub fn new(me: SiloAddress, service: &str, options: Arc<ReminderOptions>, rng: StdRng) -> Self {
        ReminderMachine {
            me,
            service: service.to_owned(),
            options,
            counters: Arc::default(),
            rng,
            now: Timestamp::from_millis(0),
            out: Vec::new(),
            ring: Ring::default(),
            ranges: Vec::new(),
            ring_gen: 0,
            queue: Queue::default(),
            changes: 0,
            deleted: BTreeMap::new(),
            load: None,
            load_epoch: 0,
            load_width: 0,
            load_pending: false,
            load_failures: 0,
            load_retry: false,
            loaded_once: false,
            reload: Vec::new(),
            due_timer: None,
            active: false,
            inactive_until: Timestamp::from_millis(0),
            deliveries: 0,
            notice_reads: 0,
            persist: BTreeMap::new(),
            removals: BTreeMap::new(),
            writes: 0,
            write_retry: false,
            write_failures: 0,
            holds: Holds::default(),
            hold_timer: false,
            view: None,
            early: VecDeque::new(),
            leaving: false,
            leave_pending: false,
            prev_ring: Arc::new(Ring::default()),
            ring_log: VecDeque::new(),
            ring_since: Timestamp::from_millis(0),
            noticed_keys: BTreeMap::new(),
            received: VecDeque::new(),
            sent: VecDeque::new(),
            history: VecDeque::new(),
            forwarded: VecDeque::new(),
            asked: Timestamp::from_millis(0),
            gone_at: BTreeMap::new(),
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

    /// The counters, shared with the service handle (read without the actor).
    pub(crate) fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }

    /// Whether the first load of the owned ranges finished.
    pub fn loaded_once(&self) -> bool {
        self.loaded_once
    }

    /// Reminders held in memory (due within the loading window).
    pub fn scheduled(&self) -> usize {
        self.queue.len()
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

    /// Whether some gained range still waits for its previous owner's release.
    pub fn holding(&self) -> bool {
        self.holds.waiting()
    }

    /// Handles `event` at `now`; returns what to do.
    pub fn handle(&mut self, now: Timestamp, event: Event) -> Vec<Action> {
        self.now = now;
        match event {
            Event::Start => {
                let at = now.saturating_add(self.options.refresh_reminder_list_period);
                self.out.push(Action::SetTimer(Timer::Refresh, at));
            }
            Event::View(view) => self.view_changed(view),
            Event::Notices(batch) => self.notices(batch),
            Event::Releases(batch) => self.releases(batch),
            Event::Leave => self.leave(),
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
            } => self.piece_loaded(epoch, (piece, width), result),
            Event::Delivered {
                key,
                etag,
                scheduled,
                result,
            } => self.delivered(key, etag, scheduled, result),
            Event::Written { write, result } => self.written(write, result),
        }
        let mut out = std::mem::take(&mut self.out);
        for action in &mut out {
            if let Action::SendReleases(messages) | Action::FinishLeave(messages) = action {
                fit_messages(messages);
            }
        }
        out
    }

    fn timer(&mut self, t: Timer) {
        match t {
            Timer::Due => {
                // Executors answer Due with Event::Due (the status); a bare one
                // keeps the last status seen.
                self.due_timer = None;
                self.deliver_due();
                self.arm_timer();
            }
            Timer::Holds => {
                self.hold_timer = false;
                self.expire_holds();
            }
            Timer::LoadRetry => {
                self.load_retry = false;
                if self.load_pending || self.reload.is_empty() {
                    self.request_load();
                } else {
                    let pieces = std::mem::take(&mut self.reload);
                    self.request_reload(pieces, self.now);
                }
            }
            Timer::WriteRetry => {
                self.write_retry = false;
                self.pump_writes();
            }
            Timer::Refresh => {
                let at = self.now.saturating_add(self.options.refresh_reminder_list_period);
                self.out.push(Action::SetTimer(Timer::Refresh, at));
                self.request_load();
            }
            Timer::LeaveDrain => self.finish_leave(),
        }
    }

    fn view_changed(&mut self, view: Arc<MembershipSnapshot>) {
        let ring = Ring::of_active(&view, self.options.ring_points_per_silo);
        self.view = Some(view);
        if self.leaving {
            return;
        }
        if ring == self.ring && self.ring_gen > 0 {
            self.expire_holds();
            return;
        }
        let (now, me) = (self.now, self.me);
        self.ring_gen += 1;
        let old = std::mem::take(&mut self.ring);
        // Where this silo delivered in the old ring (owned, not held): an early
        // release applied again below is not passed on there, since this silo's
        // own release to the new owner says where it stopped. (Found by a seed: a
        // release already used, forwarded to a joiner, arrived before the
        // forwarder's own release and repeated eight ticks.)
        let held: Vec<RingRange> = self.holds.waiting_pieces().into_iter().map(|(r, _)| r).collect();
        let delivering: Vec<RingRange> = old
            .ranges_of(&me)
            .into_iter()
            .flat_map(|r| crate::handoff::subtract(r, &held))
            .collect();
        let lost = self.holds.ring_changed(&old, &ring, me, now, self.load_epoch);
        let releases = self.releases_of(&lost, now);
        self.holds.keep_owned(&ring, me);
        self.ranges = ring.ranges_of(&me);
        // What this silo owns again, it no longer has released.
        let sent = std::mem::take(&mut self.sent);
        let ranges = &self.ranges;
        self.sent = sent.into_iter().filter_map(|r| r.without(ranges)).collect();
        self.ring = ring;
        let old = Arc::new(old);
        if self.ring_log.len() == RING_LOG {
            self.ring_log.pop_front();
        }
        self.ring_log.push_back((self.ring_since, Arc::clone(&old)));
        self.ring_since = now;
        self.prev_ring = old;
        // This silo's releases of what it lost are its word on those pieces
        // before the early releases below are read again: a chain of those that
        // comes back here waits where this silo's release says. (Found by a
        // seed: read first, an old release another silo passed on was taken for
        // this silo's floor on a piece it had only held.)
        self.record_sent(&releases);
        let ring = &self.ring;
        self.queue.retain(|slot| ring.owns(&me, slot.hash));
        // The new ring's load first: the pieces the releases below free are read by
        // it (it starts after they were received).
        self.request_load();
        // Releases that came before this ring may free what it holds.
        // (Kept for a hold timeout at most: older ones can free nothing.)
        let early: Vec<(Timestamp, Release)> = self
            .early
            .drain(..)
            .filter(|(t, _)| now.saturating_duration_since(*t) < crate::handoff::HANDOFF_TIMEOUT)
            .collect();
        let mut freed = false;
        for (at, r) in early {
            freed |= self.release_received(r, at, &delivering);
        }
        // A hold of this ring may wait for a silo that left before it: its last
        // release, received before and used then, says where it stopped (it
        // never delivers again). Only a last one: an older release of a silo
        // that is still here may have been followed by deliveries of its own.
        // (Found by a seed: a silo whose view showed a leaver Active handed it a
        // range back; the leaver's last release had named this silo, and
        // nothing applied it again, so the range failed over and lost two
        // first ticks.)
        freed |= self.replay_received(true);
        self.hold_slots();
        if freed {
            self.free_held();
        }
        tracing::debug!(silo = %me, ranges = self.ranges.len(), silos = self.ring.silos().len(),
            waiting_for = ?self.holds.waiting_for(), "reminder ring changed");
        self.emit(releases);
        self.expire_holds();
        self.arm_timer();
    }

    /// Stops delivering, lets the deliveries in flight finish (at most
    /// [`LEAVE_DRAIN`]: a tick whose handler completed is delivered, one that
    /// failed goes to the new owner), then releases every range.
    fn leave(&mut self) {
        if self.leaving {
            self.out.push(Action::LeaveDone);
            return;
        }
        self.leaving = true;
        self.leave_pending = true;
        if self.due_timer.take().is_some() {
            self.out.push(Action::CancelTimer(Timer::Due));
        }
        if self.deliveries == 0 {
            self.finish_leave();
        } else {
            let at = self.now.saturating_add(LEAVE_DRAIN);
            self.out.push(Action::SetTimer(Timer::LeaveDrain, at));
        }
    }

    fn releases(&mut self, batch: Vec<Inbound>) {
        let mut freed = false;
        for inbound in batch {
            let Inbound::Message { from, body } = inbound else {
                continue; // a request is asked again, a release arrives again or times out
            };
            match serde_json::from_slice::<HandoffMessage>(&body) {
                Ok(HandoffMessage::Release(r)) if r.service == self.service => {
                    freed |= self.release_received(r, self.now, &[])
                }
                Ok(HandoffMessage::Request(r)) if r.service == self.service => self.answer_request(r),
                Ok(_) => {}
                Err(e) => tracing::debug!(%from, error = %e, "undecodable reminder release dropped"),
            }
        }
        if freed {
            self.free_held();
            self.publish_gauges();
            self.arm_timer();
        }
    }

    fn notices(&mut self, batch: Vec<Inbound>) {
        for inbound in batch {
            match inbound {
                Inbound::Message { from, body } => self.notice(from, &body),
                Inbound::Dropped(n) => {
                    tracing::debug!(silo = %self.me, dropped = n, "reminder notices were dropped (queue full); reloading the ranges");
                    self.request_load();
                }
            }
        }
    }

    /// Handles one notice: re-reads the reminder it names (bounded), or leaves it
    /// to a pending load, or forwards it to the owner.
    fn notice(&mut self, from: SiloAddress, body: &[u8]) {
        let Ok(n) = serde_json::from_slice::<ChangedNotice>(body) else {
            tracing::debug!(%from, "undecodable reminder notice dropped");
            return;
        };
        if n.service != self.service {
            return;
        }
        Counters::bump(&self.counters.notices);
        let hash = actor_hash(&n.actor);
        let owner = self.owners().owner_of(hash);
        if owner != Some(self.me) {
            // Not ours in our view (or this silo is leaving): forward to the owner
            // we see (the sender's view may be older); past MAX_NOTICE_HOPS, the
            // owner's own loads cover it.
            if let (true, Some(owner)) = (n.hops < MAX_NOTICE_HOPS, owner) {
                let forward = ChangedNotice {
                    hops: n.hops + 1,
                    ..n
                };
                self.out.push(Action::SendNotices(vec![(owner, forward)]));
            }
            return;
        }
        if self.load_pending {
            // The pending load starts after this notice arrived, so it reads the
            // registration the notice is about.
            return;
        }
        if self.notice_reads >= MAX_NOTICE_READS {
            self.request_load();
            return;
        }
        self.notice_reads += 1;
        self.out.push(Action::ReadRow {
            gen: self.ring_gen,
            key: Key::new(&n.actor, &n.name),
        });
    }

    fn row_read(&mut self, gen: u64, key: Key, result: Result<Option<ReminderEntry>, ReminderError>) {
        self.notice_reads = self.notice_reads.saturating_sub(1);
        if gen != self.ring_gen || self.leaving {
            // The ring changed meanwhile: the load of the new ring reads it if this
            // silo still owns it; else its owner now is told.
            let hash = actor_hash(key.actor());
            if let Some(owner) = self.owners().owner_of(hash).filter(|o| *o != self.me) {
                let notice = ChangedNotice {
                    service: self.service.clone(),
                    actor: key.actor().to_owned(),
                    name: key.name().to_owned(),
                    hops: 1,
                };
                self.out.push(Action::SendNotices(vec![(owner, notice)]));
            }
            return;
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
                if let Some(slot) = self.queue.get_mut(&key).filter(|s| s.etag == row.etag.as_str()) {
                    // Loaded already, in a held range, its first tick not passed:
                    // the failover that frees it plans it as learned from this
                    // notice. (Found by a seed: a reminder registered while its
                    // range waited for a crashed owner lost its first tick, due
                    // during the hold, to the failover's `Skip`.)
                    if slot.held && slot.next.scheduled == row.start_at {
                        slot.noticed = true;
                    }
                    return;
                }
                self.changes += 1;
                self.schedule_row(row, Learned::Notice, false);
            }
            Err(e) => {
                tracing::warn!(error = %e, "reading a notified reminder failed; reloading the ranges");
                self.request_load();
            }
        }
        self.publish_gauges();
        self.arm_timer();
    }

    /// Materialises `row` if its next tick is within the loading window (else drops
    /// any slot it had). `jitter` spreads an overdue tick over `startup_jitter`.
    fn schedule_row(&mut self, mut row: ReminderEntry, learned: Learned, jitter: bool) {
        let now = self.now;
        let key = key_of(&row);
        if let Some((etag, at)) = self.persist.get(&key) {
            if *etag == row.etag {
                row.last_fired = row.last_fired.max(Some(*at));
            }
        }
        let start = self
            .holds
            .start_of(row.hash, &row.actor_id, &row.name, row.etag.as_str());
        // A registration learned from its notice and not delivered since stays
        // learned that way when a load reads it again.
        let passed_on = self
            .noticed_keys
            .get(&key)
            .is_some_and(|e| *e == row.etag.as_str());
        let learned = match self.queue.get(&key) {
            Some(slot) if slot.noticed && slot.etag == row.etag.as_str() => Learned::Notice,
            _ if passed_on => Learned::Notice,
            _ => learned,
        };
        let Some(mut next) = planned(Timing::from(&row), now, learned, start) else {
            self.queue.remove(&key);
            return;
        };
        if next.due > now.saturating_add(self.options.loading_window) {
            self.queue.remove(&key);
            return;
        }
        if start == Start::Free && learned == Learned::Load && next.is_overdue(now) {
            // A late or catch-up tick found by a load outside a handoff: wait the
            // load grace, and at start-up spread these ticks over the jitter
            // window (restart storms).
            let spread = if jitter && !self.options.startup_jitter.is_zero() {
                self.rng
                    .random_range(0..=self.options.startup_jitter.as_millis() as u64)
            } else {
                0
            };
            next.due = now.saturating_add(LOAD_GRACE + Duration::from_millis(spread));
        }
        self.queue.set(&row, next, self.changes);
        if learned == Learned::Notice {
            if let Some(slot) = self.queue.get_mut(&key) {
                slot.noticed = true;
            }
        }
        match start {
            Start::Held => self.queue.hold(&key),
            Start::From(_) if next.scheduled < now => {
                if let Some(slot) = self.queue.get_mut(&key) {
                    slot.catch_up_to = now;
                }
            }
            _ => {}
        }
    }

    /// The releases of the pieces `lost` (with their new owners) at `now`: per new
    /// owner, the pieces this silo delivered in (or inherited a floor for), and the
    /// first undelivered occurrence of every reminder whose floor is not the
    /// piece's. A piece this silo still holds names the silo it waits for (rule 4
    /// of [`crate::handoff`]).
    fn releases_of(&self, lost: &[(RingRange, SiloAddress)], now: Timestamp) -> Vec<(SiloAddress, Release)> {
        let mut by_owner: BTreeMap<SiloAddress, Release> = BTreeMap::new();
        let after = now.as_millis() + 1;
        let mut inherited: Vec<RingRange> = Vec::new();
        for (range, to) in lost {
            let r = by_owner.entry(*to).or_insert_with(|| Release {
                service: self.service.clone(),
                from: self.me,
                at: now.as_millis(),
                pieces: Vec::new(),
                floors: Vec::new(),
                hops: 0,
                last: false,
                to: Some(*to),
                via: None,
                scope: None,
                noticed: Vec::new(),
            });
            for (piece, custody) in self.holds.custody(*range) {
                let (floor, waiting_for) = match custody {
                    Custody::Held(from, fallback) => (fallback, Some(from)),
                    Custody::Free => (Some(after), None),
                    Custody::Inherited(f) => {
                        inherited.push(piece);
                        (f.map(Timestamp::as_millis), None)
                    }
                };
                r.pieces.push(ReleasedPiece {
                    range: piece,
                    floor,
                    waiting_for,
                });
            }
        }
        // Registrations learned from their notices in pieces still held pass on
        // with them. (Found by a seed: a reminder registered just before two
        // graceful leaves was read from its notice by a silo that held its
        // range, which then passed the range on; the failover that freed it in
        // the end skipped the first tick, due during the hold.)
        let mut noticed: BTreeMap<SiloAddress, Vec<Noticed>> = BTreeMap::new();
        for (key, etag) in &self.noticed_keys {
            let h = actor_hash(key.actor());
            if let Some((_, to)) = lost.iter().find(|(r, _)| r.contains(h)) {
                noticed.entry(*to).or_default().push(Noticed {
                    actor: key.actor().to_owned(),
                    name: key.name().to_owned(),
                    etag: etag.clone(),
                });
            }
        }
        for slot in self.queue.iter() {
            let Some((_, to)) = lost.iter().find(|(r, _)| r.contains(slot.hash)) else {
                continue;
            };
            if slot.held {
                if slot.noticed {
                    let n = Noticed {
                        actor: slot.key.actor().to_owned(),
                        name: slot.key.name().to_owned(),
                        etag: slot.etag.to_string(),
                    };
                    let list = noticed.entry(*to).or_default();
                    if !list.contains(&n) {
                        list.push(n);
                    }
                }
                continue;
            }
            // The first occurrence not delivered: a running delivery covers its own.
            let next = if slot.delivering {
                slot.next.scheduled.as_millis() + 1
            } else {
                slot.next.scheduled.as_millis()
            };
            let listed = inherited.iter().any(|p| p.contains(slot.hash));
            if next < after || listed {
                if let Some(r) = by_owner.get_mut(to) {
                    r.floors.push(Floor {
                        actor: slot.key.actor().to_owned(),
                        name: slot.key.name().to_owned(),
                        etag: slot.etag.to_string(),
                        next,
                    });
                }
            }
        }
        for (to, list) in noticed {
            if let Some(r) = by_owner.get_mut(&to) {
                let held: Vec<RingRange> = r
                    .pieces
                    .iter()
                    .filter(|p| p.waiting_for.is_some())
                    .map(|p| p.range)
                    .collect();
                r.noticed.extend(
                    list.into_iter()
                        .filter(|n| held.iter().any(|p| p.contains(actor_hash(&n.actor)))),
                );
            }
        }
        // The per-reminder floors inherited over those pieces pass on too, for
        // reminders not scheduled here yet (a slot above says more). (Found by a
        // seed: a leaver passed on a piece it had freed but not loaded with the
        // piece's floor only, and the tick the silo before it had delivered was
        // repeated.)
        for piece in &inherited {
            let Some((_, to)) = lost
                .iter()
                .find(|(r, _)| !crate::handoff::intersect(*r, *piece).is_empty())
            else {
                continue;
            };
            let Some(r) = by_owner.get_mut(to) else {
                continue;
            };
            for f in self.holds.inherited_floors(*piece) {
                if !r.floors.iter().any(|g| g.actor == f.actor && g.name == f.name) {
                    r.floors.push(f);
                }
            }
        }
        by_owner
            .into_iter()
            .filter(|(_, r)| !r.pieces.is_empty())
            .collect()
    }

    /// Applies a release to the holds; keeps it for a later ring if it freed
    /// nothing, and forwards the pieces owned by a third silo in this silo's view.
    /// Returns whether a hold was freed.
    fn release_received(&mut self, r: Release, received: Timestamp, not_forwarded: &[RingRange]) -> bool {
        let me = self.me;
        // Whether the silo that passed it on vouched (`via`) holds now only.
        let via = r.via.filter(|v| *v != r.from && *v != me);
        let r = Release { via: None, ..r };
        // Kept as it came for a later ring: what it means there (a chain back to
        // this silo, a later floor) is worked out again then, from what this silo
        // knows by then. (Found by a seed: a release rewritten with the floor of
        // an old release, before this silo's own release of the pieces existed,
        // was kept so and freed a range it got back from a floor five ticks old.)
        let original = r.clone();
        self.take_noticed(&r.noticed);
        let r = self.newest(self.back_to_me(r));
        tracing::trace!(silo = %me, from = %r.from, at = r.at, pieces = r.pieces.len(), "release received");
        if r.from != me && !self.received.contains(&r) {
            crate::handoff::remember(&mut self.received, r.clone(), EARLY_RELEASES);
        }
        let mut freed = self.holds.released(&r, me);
        // Passed on by a silo that did not deliver there after it: a hold
        // waiting for that silo takes it as that silo's release. (Found by a
        // seed: a joiner waited for a silo whose view skipped the ring in which
        // it owned the range; that silo passed the leaver's release on, the
        // joiner kept waiting, and its view moved on first: a tick was lost.)
        if let Some(v) = via {
            freed |= self.holds.released(&Release { from: v, ..r.clone() }, me);
        }
        // A piece that now waits for another silo (a chain) may be freed by a
        // release of that silo received before: apply those again (each chain step
        // names a new silo, so this ends within the releases kept).
        if freed {
            freed |= self.replay_received(false);
        }
        // The sender had these pieces: what it scheduled there (registrations
        // whose notices reached it) this silo may not have loaded. Its owned ones
        // are read again (a silo whose view skipped the sender's ring owns them
        // without a hold).
        if r.from != me {
            self.request_reload(r.pieces.iter().map(|p| p.range).collect(), received);
        }
        let forward = r
            .without(not_forwarded)
            .map(|r| crate::handoff::forwards(&r, &self.ring, me))
            .unwrap_or_default();
        if !forward.is_empty() {
            tracing::debug!(silo = %me, from = %r.from, to = ?forward.iter().map(|(to, _)| to).collect::<Vec<_>>(), "forwarding a reminder release");
            for (to, m) in &forward {
                let m = Release {
                    to: Some(*to),
                    ..m.clone()
                };
                crate::handoff::remember(&mut self.forwarded, m, EARLY_RELEASES);
            }
            // This silo vouches that it did not deliver in the pieces after the
            // release: it did not own (or hold) them in its previous ring, and
            // no release of its own covers them since. (A vouch by a silo that
            // had held them for another one repeated two ticks that one
            // delivered.)
            let before = self.prev_ring.ranges_of(&me);
            let overlaps = |m: &Release, q: RingRange| {
                m.pieces
                    .iter()
                    .any(|p| !crate::handoff::intersect(p.range, q).is_empty())
            };
            let since = |m: &Release| {
                before.iter().any(|q| overlaps(m, *q))
                    || self
                        .history
                        .iter()
                        .any(|own| own.at > m.at && own.pieces.iter().any(|q| overlaps(m, q.range)))
            };
            let forward = forward
                .into_iter()
                .map(|(to, m)| {
                    let via = (!since(&m)).then_some(me);
                    (to, HandoffMessage::Release(Release { via, ..m }))
                })
                .collect();
            self.out.push(Action::SendReleases(forward));
        }
        if !freed {
            if self.early.len() == EARLY_RELEASES {
                self.early.pop_front();
            }
            self.early.push_back((received, original));
        }
        freed
    }

    /// Applies again the releases received from the silos some hold waits for
    /// now (only their last ones when `only_last`), until none frees anything
    /// more. Returns whether a hold changed.
    fn replay_received(&mut self, only_last: bool) -> bool {
        let mut changed = false;
        for _ in 0..EARLY_RELEASES {
            let waiting = self.holds.waiting_for();
            let again: Vec<Release> = self
                .received
                .iter()
                .filter(|r| waiting.contains(&r.from) && (r.last || !only_last))
                .cloned()
                .collect();
            let mut any = false;
            for r in again {
                let r = self.newest(self.back_to_me(r));
                any |= self.holds.released(&r, self.me);
            }
            if !any {
                break;
            }
            changed = true;
        }
        changed
    }

    /// The ring that decides who owns a hash for this silo: its ring, or, once it
    /// is leaving, its ring without itself.
    fn owners(&self) -> std::borrow::Cow<'_, Ring> {
        if self.leaving {
            std::borrow::Cow::Owned(self.ring.without(&self.me))
        } else {
            std::borrow::Cow::Borrowed(&self.ring)
        }
    }

    /// The version of the membership view the ring was built from.
    fn view_version(&self) -> u64 {
        self.view.as_ref().map_or(0, |v| v.version.version)
    }

    /// `r` with every piece that names this silo as the one its sender waited for
    /// (a chain of holders that came back here: none of them delivered) replaced
    /// by the newest release this silo knows of it, floors included: its own (it
    /// delivered there last and stopped where its release says) or one it
    /// received without passing the pieces on (a release forwarded through this
    /// silo to a joiner that left before it arrived: the sender delivered there
    /// last).
    fn back_to_me(&self, mut r: Release) -> Release {
        if r.from == self.me || r.pieces.iter().all(|p| p.waiting_for != Some(self.me)) {
            return r;
        }
        // An own release sent to a third silo (not the one whose chain came back
        // here) gave that silo the pieces: it may have delivered there since, so
        // the pieces wait for it, this silo's floor kept as the chain's fallback.
        // (Found by a seed: a silo's view skipped the ring in which the silo it
        // had released to crashed; the joiner after it waited for this silo and
        // left, and the old floor repeated the tick the crashed silo delivered.)
        let redirected: Vec<Release> = self
            .history
            .iter()
            .map(|m| match m.to {
                Some(to) if to != r.from && to != self.me => {
                    let mut m = m.clone();
                    for q in m.pieces.iter_mut().filter(|q| q.waiting_for.is_none()) {
                        q.waiting_for = Some(to);
                    }
                    m
                }
                _ => m.clone(),
            })
            .collect();
        // Likewise a received release this silo passed on to a third silo: that
        // silo had the pieces and may have delivered there. (Found by a seed: a
        // forwarded leaver's floor, taken as this silo's, repeated eleven ticks
        // the silo it was forwarded to had delivered before it crashed.)
        let passed_on: Vec<Release> = self
            .forwarded
            .iter()
            .filter(|m| m.to.is_some_and(|to| to != r.from))
            .map(|m| {
                let mut m = Release {
                    from: self.me,
                    ..m.clone()
                };
                for q in m.pieces.iter_mut().filter(|q| q.waiting_for.is_none()) {
                    q.waiting_for = m.to;
                }
                m
            })
            .collect();
        // Ordered newest first; of a release received and passed on, the pass.
        let mut known: Vec<&Release> = redirected
            .iter()
            .chain(passed_on.iter())
            .chain(
                self.received
                    .iter()
                    .filter(|o| o.from != r.from && o.to.is_none_or(|to| to == self.me)),
            )
            .collect();
        known.sort_by_key(|o| std::cmp::Reverse(o.at));
        let mut pieces = Vec::with_capacity(r.pieces.len());
        for p in std::mem::take(&mut r.pieces) {
            if p.waiting_for != Some(self.me) {
                pieces.push(p);
                continue;
            }
            let me = self.me;
            let mine = known.iter().flat_map(move |m| {
                m.pieces
                    .iter()
                    .filter(move |q| m.from == me || (q.waiting_for.is_none() && q.floor.is_some()))
                    .map(move |q| (*m, q))
            });
            overlay(p, mine, &mut pieces, &mut r.floors);
        }
        r.pieces = pieces;
        r
    }

    /// `r` with every part of a piece that a later release of another silo
    /// covers with a later floor taken from that release (its piece and its
    /// per-reminder floors): that silo delivered there after `r`'s sender
    /// stopped (a view that skipped a ring names an older owner), and a floor
    /// only moves forward.
    fn newest(&self, mut r: Release) -> Release {
        // This silo's own releases count too: it delivered there up to them.
        let newer: Vec<&Release> = self
            .received
            .iter()
            .chain(self.history.iter())
            .filter(|o| o.from != r.from && o.at > r.at)
            .collect();
        if newer.is_empty() {
            return r;
        }
        let mut pieces = Vec::with_capacity(r.pieces.len());
        for p in std::mem::take(&mut r.pieces) {
            let later = newer.iter().flat_map(|o| {
                o.pieces
                    .iter()
                    .filter(move |q| q.floor.is_some() && q.floor >= p.floor)
                    .map(move |q| (*o, q))
            });
            overlay(p, later, &mut pieces, &mut r.floors);
        }
        r.pieces = pieces;
        r
    }

    /// Answers a [`ReleaseRequest`] with what [`crate::handoff::answer`] says,
    /// once this silo's view is at least as new as the asker's.
    fn answer_request(&mut self, r: ReleaseRequest) {
        if self.view_version() < r.version {
            return; // asked again every REQUEST_AFTER
        }
        // A leaving silo owns nothing any more: its last release answers.
        let ring = self.owners();
        let again = crate::handoff::answer(
            &r,
            self.me,
            self.now,
            &ring,
            &self.prev_ring,
            &self.sent,
            &self.received,
        );
        if again.is_empty() {
            return;
        }
        tracing::debug!(silo = %self.me, to = %r.from, releases = again.len(), "answering a request for reminder releases");
        let again = again
            .into_iter()
            .map(|rel| (r.from, HandoffMessage::Release(rel)))
            .collect();
        self.out.push(Action::SendReleases(again));
    }

    /// The last step of a graceful leave: one release of every range, to every silo
    /// of the ring (a new owner in this silo's view may leave too before it sees
    /// this silo go; the silo that gets a range in the end has the release all the
    /// same); the executor answers the leave once they were taken.
    fn finish_leave(&mut self) {
        if !std::mem::take(&mut self.leave_pending) {
            return;
        }
        let (now, me) = (self.now, self.me);
        let remaining = self.ring.without(&me);
        let lost: Vec<(RingRange, SiloAddress)> = crate::handoff::transfers(&self.ring, &remaining)
            .into_iter()
            .filter_map(|(range, was, is)| (was == Some(me)).then_some(range).zip(is))
            .collect();
        let mut all: Option<Release> = None;
        for (_, r) in self.releases_of(&lost, now) {
            match &mut all {
                None => all = Some(r),
                Some(a) => {
                    a.pieces.extend(r.pieces);
                    a.floors.extend(r.floors);
                    a.noticed.extend(r.noticed);
                }
            }
        }
        let releases: Vec<(SiloAddress, HandoffMessage)> = match all {
            None => Vec::new(),
            Some(all) => {
                let all = Release {
                    last: true,
                    to: None,
                    ..all
                };
                // Kept to answer requests until this silo stops.
                crate::handoff::remember(&mut self.sent, all.clone(), EARLY_RELEASES);
                remaining
                    .silos()
                    .into_iter()
                    .map(|to| (to, HandoffMessage::Release(all.clone())))
                    .collect()
            }
        };
        self.queue.retain(|_| false);
        tracing::debug!(silo = %me, releases = releases.len(), "leaving: reminder ranges released");
        self.out.push(Action::FinishLeave(releases));
    }

    /// Keeps the registrations a release passed on as learned from their notices
    /// (at most [`MAX_NOTICED`]), and marks their slots so.
    fn take_noticed(&mut self, noticed: &[Noticed]) {
        for n in noticed {
            let key = Key::new(&n.actor, &n.name);
            if let Some(slot) = self.queue.get_mut(&key).filter(|s| s.etag == n.etag.as_str()) {
                slot.noticed = true;
            }
            self.noticed_keys.insert(key, n.etag.clone());
            if self.noticed_keys.len() > MAX_NOTICED {
                self.noticed_keys.pop_first();
            }
        }
    }

    /// Keeps `releases` (about to be sent) to send again on request and as this
    /// silo's own word on their pieces.
    fn record_sent(&mut self, releases: &[(SiloAddress, Release)]) {
        for (_, r) in releases {
            crate::handoff::remember(&mut self.sent, r.clone(), EARLY_RELEASES);
            crate::handoff::remember(&mut self.history, r.clone(), EARLY_RELEASES);
        }
    }

    /// Sends `releases` already recorded ([`Self::record_sent`]).
    fn emit(&mut self, releases: Vec<(SiloAddress, Release)>) {
        if releases.is_empty() {
            return;
        }
        let messages = releases
            .into_iter()
            .map(|(to, r)| (to, HandoffMessage::Release(r)))
            .collect();
        self.out.push(Action::SendReleases(messages));
    }

    /// Takes the slots of held ranges out of the due index.
    fn hold_slots(&mut self) {
        let holds = &self.holds;
        let held: Vec<Key> = self
            .queue
            .iter()
            .filter(|slot| {
                !slot.held
                    && holds.start_of(slot.hash, slot.key.actor(), slot.key.name(), &slot.etag) == Start::Held
            })
            .map(|slot| slot.key.clone())
            .collect();
        for k in held {
            self.queue.hold(&k);
        }
    }

    /// Schedules the held slots the holds no longer hold.
    fn free_held(&mut self) {
        let now = self.now;
        let holds = &self.holds;
        let freed: Vec<(Key, Option<Planned>, bool)> = self
            .queue
            .iter()
            .filter(|slot| slot.held)
            .filter_map(|slot| {
                let start = holds.start_of(slot.hash, slot.key.actor(), slot.key.name(), &slot.etag);
                (start != Start::Held).then(|| {
                    let learned = if slot.noticed {
                        Learned::Notice
                    } else {
                        Learned::Load
                    };
                    let next = planned(slot.timing(), now, learned, start);
                    (slot.key.clone(), next, matches!(start, Start::From(_)))
                })
            })
            .collect();
        for (key, next, catch_up) in freed {
            match next {
                Some(next) => {
                    self.queue.requeue(&key, next);
                    if let (true, Some(slot)) = (catch_up && next.scheduled < now, self.queue.get_mut(&key)) {
                        slot.catch_up_to = now;
                    }
                }
                None => {
                    self.queue.remove(&key);
                }
            }
        }
    }

    /// Frees the holds whose previous owner is gone or silent too long, asks for
    /// releases, and keeps [`Timer::Holds`] armed while some hold waits.
    fn expire_holds(&mut self) {
        let now = self.now;
        let view = self.view.clone();
        // Dead in this silo's view. A silo absent from it is not gone: it joined
        // in a view this silo has not read yet (another silo named it), and the
        // hold timeout covers one that never shows up. (Found by a seed: a joiner
        // not yet in the view was taken for a crash, and the range it was handed
        // failed over, losing a tick.)
        let gone =
            |silo: &SiloAddress| view.as_ref().and_then(|v| v.status_of(silo)) == Some(SiloStatus::Dead);
        // When each silo waited for was first seen gone: the grace counts from then.
        let waiting = self.holds.waiting_for();
        self.gone_at.retain(|s, _| waiting.contains(s));
        let mut newly_gone = false;
        for s in waiting.iter().filter(|s| gone(s)) {
            self.gone_at.entry(*s).or_insert_with(|| {
                newly_gone = true;
                now
            });
        }
        let gone_at = self.gone_at.clone();
        // Ask the previous owners still in the view that were silent for a while,
        // and, once one waited for is gone, every Active silo (one of them may have
        // its release).
        if !waiting.is_empty() && (newly_gone || now.saturating_duration_since(self.asked) >= REQUEST_AFTER) {
            self.asked = now;
            let mut to: Vec<SiloAddress> = waiting.iter().copied().filter(|s| !gone(s)).collect();
            if !gone_at.is_empty() {
                to.extend(self.ring.silos());
            }
            to.sort_unstable();
            to.dedup();
            let request = ReleaseRequest {
                service: self.service.clone(),
                from: self.me,
                waiting: self.holds.waiting_pieces(),
                gone: gone_at.keys().copied().collect(),
                version: self.view_version(),
            };
            let ask: Vec<_> = to
                .into_iter()
                .filter(|s| *s != self.me)
                .map(|silo| (silo, HandoffMessage::Request(request.clone())))
                .collect();
            if !ask.is_empty() {
                self.out.push(Action::SendReleases(ask));
            }
        } else if waiting.is_empty() {
            self.asked = now;
        }
        // A gone silo's last release settles what it did not own at the end.
        let mut settled = false;
        // (Every part of it received: a part forwarded or answered speaks only for
        // its scope.)
        let mut others: Option<Vec<Release>> = None;
        for silo in gone_at.keys() {
            let lasts: Vec<Release> = self
                .received
                .iter()
                .filter(|r| r.from == *silo && r.last)
                .cloned()
                .collect();
            if lasts.is_empty() {
                continue;
            }
            let others = others.get_or_insert_with(|| self.received.iter().cloned().collect::<Vec<_>>());
            let (log, ring, since, me) = (&self.ring_log, &self.ring, self.ring_since, self.me);
            let third = |r: &Release, range: RingRange| {
                owned_by_others_since(log, ring, since, r.at, range, &[r.from, *silo, me], r.to)
            };
            for last in lasts.iter().rev() {
                settled |= self.holds.settle_with_last(last, others, self.me, third);
            }
        }
        let (changed, silent) = self.holds.expire(now, |s| gone_at.get(s).copied());
        for silo in silent {
            tracing::warn!(silo = %self.me, previous_owner = %silo, timeout = ?crate::handoff::HANDOFF_TIMEOUT,
                "no release of reminder ranges from their previous owner; taking them over");
        }
        if changed || settled {
            self.free_held();
            self.publish_gauges();
            self.arm_timer();
        }
        // Re-checked every HOLD_CHECK while waiting: a previous owner's status
        // changes with the view, and requests go out every REQUEST_AFTER.
        if self.holds.waiting() {
            self.hold_timer = true;
            self.out
                .push(Action::SetTimer(Timer::Holds, now.saturating_add(HOLD_CHECK)));
        } else if std::mem::take(&mut self.hold_timer) {
            self.out.push(Action::CancelTimer(Timer::Holds));
        }
    }

    fn publish_gauges(&self) {
        use std::sync::atomic::Ordering;
        self.counters
            .scheduled
            .store(self.queue.len() as u64, Ordering::Relaxed);
    }

    /// Starts a load of every owned range, or marks one pending if one runs.
    fn request_load(&mut self) {
        if self.load.is_some() || self.load_retry {
            // One load at a time; while backing off after a failure, the retry
            // timer runs the next one.
            self.load_pending = true;
            return;
        }
        self.load_pending = false;
        self.reload.clear();
        let left = self.ranges.iter().copied().collect();
        self.start_load(left, None);
    }

    /// Reads `pieces` again (those of them this silo owns): a previous owner
    /// released them, and rows it learned from notices after this silo's load of
    /// them started are read now. Coalesced like full loads (a full load pending
    /// covers them).
    fn request_reload(&mut self, pieces: Vec<RingRange>, received: Timestamp) {
        if self
            .load
            .as_ref()
            .is_some_and(|l| l.only.is_none() && l.started >= received)
            || self.load_pending
        {
            return; // a full load that starts after the release reads them
        }
        let owned: Vec<RingRange> = pieces
            .iter()
            .flat_map(|p| self.ranges.iter().flat_map(|r| crate::handoff::intersect(*p, *r)))
            .collect();
        if owned.is_empty() {
            return;
        }
        if self.load.is_some() || self.load_retry {
            for range in owned {
                if !self.reload.contains(&range) {
                    self.reload.push(range);
                }
            }
            return;
        }
        self.start_load(owned.clone().into(), Some(owned));
    }

    fn start_load(&mut self, left: VecDeque<RingRange>, only: Option<Vec<RingRange>>) {
        self.load_epoch = self.load_epoch.wrapping_add(1).max(1);
        self.load = Some(LoadRun {
            gen: self.ring_gen,
            since: self.changes,
            epoch: self.load_epoch,
            left,
            owned: 0,
            only,
            started: self.now,
        });
        self.load_next_piece();
    }

    /// Reads the next piece of the running load, or ends it.
    fn load_next_piece(&mut self) {
        let width = match self.load_width {
            0 => FIRST_PIECE_WIDTH,
            w => w,
        };
        let Some(run) = self.load.as_mut() else {
            return;
        };
        let Some(range) = run.left.pop_front() else {
            self.load_finished();
            return;
        };
        let (piece, rest) = range.cut(width);
        if let Some(rest) = rest {
            run.left.push_front(rest);
        }
        let epoch = run.epoch;
        self.out.push(Action::ReadPiece { epoch, piece, width });
    }

    fn piece_loaded(
        &mut self,
        epoch: u32,
        (piece, width): (RingRange, u32),
        res: Result<Vec<ReminderEntry>, ReminderError>,
    ) {
        let Some(run) = self.load.as_ref().filter(|r| r.epoch == epoch) else {
            return;
        };
        let (gen, since) = (run.gen, run.since);
        if gen != self.ring_gen {
            // Read under an older ring: discarded; the new ring's load follows.
            self.load = None;
            self.request_load();
            return;
        }
        let partial = self.load.as_ref().and_then(|r| r.only.clone());
        let rows = match res {
            Ok(rows) => rows,
            Err(e) => {
                self.load = None;
                if let Some(pieces) = partial {
                    self.reload.extend(pieces); // read again with the retry
                } else {
                    self.load_pending = true;
                }
                Counters::bump(&self.counters.load_failures);
                self.load_failures += 1;
                let wait = backoff(self.load_failures, &mut self.rng)
                    .min(MAX_LOAD_BACKOFF)
                    .min(self.options.refresh_reminder_list_period);
                tracing::warn!(silo = %self.me, error = %e, retry_in = ?wait, "loading reminders failed; the schedule in memory keeps ticking");
                self.load_retry = true;
                self.out
                    .push(Action::SetTimer(Timer::LoadRetry, self.now.saturating_add(wait)));
                self.arm_timer();
                return;
            }
        };
        let first = !self.loaded_once;
        if let Some(run) = self.load.as_mut() {
            run.owned += rows.len() as u64;
        }
        // The next piece: about LOAD_PIECE_ROWS rows at the density just read,
        // at most 8x wider or narrower than this one's width.
        let width = u64::from(width);
        let next = match rows.len() as u64 {
            0 => width * 8,
            n => (piece.size() * LOAD_PIECE_ROWS / n).clamp(width / 8, width * 8),
        };
        self.load_width = next.clamp(u64::from(MIN_PIECE_WIDTH), u64::from(u32::MAX)) as u32;
        for row in rows {
            let key = key_of(&row);
            if self.removals.get(&key) == Some(&row.etag) {
                continue; // a delivered one-shot whose removal is pending
            }
            if self.deleted.get(&key).is_some_and(|c| *c > since) {
                // Deleted after this load started. (Found by a seed: a reload
                // read a row just before its removal, the removal's notice came
                // first, and the reload scheduled it again from an old release's
                // floor, repeating a tick.)
                continue;
            }
            // A slot still held where no hold holds it any more is planned again.
            let stale_hold = |slot: &crate::queue::Slot| {
                slot.held
                    && self
                        .holds
                        .start_of(row.hash, &row.actor_id, &row.name, row.etag.as_str())
                        != Start::Held
            };
            match self.queue.get_mut(&key) {
                Some(slot)
                    if (slot.etag == row.etag.as_str() || slot.touched > since) && !stale_hold(slot) =>
                {
                    slot.seen = epoch
                }
                _ => {
                    self.schedule_row(row, Learned::Load, first);
                    if let Some(slot) = self.queue.get_mut(&key) {
                        slot.seen = epoch;
                    }
                }
            }
        }
        self.publish_gauges();
        self.arm_timer();
        self.load_next_piece();
    }

    /// Ends the running load: drops the slots it did not read (deleted rows, or
    /// ranges no longer owned) unless a notice touched them meanwhile; a partial
    /// load only within its pieces.
    fn load_finished(&mut self) {
        let Some(run) = self.load.take() else { return };
        self.load_failures = 0;
        self.deleted.retain(|_, c| *c > run.since);
        if let Some(only) = &run.only {
            self.queue.retain(|slot| {
                !only.iter().any(|p| p.contains(slot.hash))
                    || slot.seen == run.epoch
                    || slot.touched > run.since
            });
        } else {
            Counters::bump(&self.counters.loads);
            self.counters
                .owned
                .store(run.owned, std::sync::atomic::Ordering::Relaxed);
            self.out.push(Action::Owned(run.owned));
            self.queue
                .retain(|slot| slot.seen == run.epoch || slot.touched > run.since);
            self.holds.load_finished(run.epoch);
            if !self.loaded_once {
                self.loaded_once = true;
                self.out.push(Action::Loaded);
            }
        }
        self.publish_gauges();
        if self.load_pending {
            self.request_load();
        } else if !self.reload.is_empty() {
            let pieces = std::mem::take(&mut self.reload);
            self.request_reload(pieces, self.now);
        }
        self.arm_timer();
    }

    /// Keeps [`Timer::Due`] at the earliest due time; none while every delivery
    /// slot is taken (the next [`Event::Delivered`] delivers what waits) or the
    /// silo is leaving, and not before the next look of a silo that was not
    /// Active.
    fn arm_timer(&mut self) {
        let next = match self.queue.next_due() {
            Some(next) if self.deliveries < MAX_DELIVERIES && !self.leaving => next.max(self.inactive_until),
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
        if !self.active {
            // Not Active (yet, or any more): nothing is delivered; look again soon
            // (arm_timer waits for this time).
            self.inactive_until = now.saturating_add(INACTIVE_RECHECK);
            return;
        }
        let room = MAX_DELIVERIES.saturating_sub(self.deliveries);
        for key in self.queue.take_due(now, room) {
            let Some(slot) = self.queue.get(&key) else {
                continue;
            };
            let (etag, scheduled) = (slot.etag.clone(), slot.next.scheduled);
            let tick = ActorId::parse(key.actor())
                .map(|actor| ReminderTick {
                    actor,
                    name: key.name().to_owned(),
                    first_tick: slot.start_at,
                    period: slot.period(),
                    scheduled,
                    now,
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
        if self.leaving {
            if self.deliveries == 0 {
                self.finish_leave();
            }
            return;
        }
        // Room for deliveries that waited on the bound.
        if self.queue.next_due().is_some_and(|d| d <= now) {
            self.deliver_due();
        }
        self.arm_timer();
    }

    /// After a delivery of the slot's current occurrence: the next one, the
    /// `last_fired` write of a `FireOnce` reminder, a one-shot's removal.
    fn advance(&mut self, key: &Key, etag: &SmolStr, scheduled: Timestamp) {
        let now = self.now;
        let window = self.options.loading_window;
        let Some(slot) = self.queue.get_mut(key) else {
            return;
        };
        slot.attempts = 0;
        slot.noticed = false;
        self.noticed_keys.remove(key);
        let etag = Etag::new(etag.as_str());
        if slot.policy == MissedTickPolicy::FireOnce {
            slot.last_fired = now;
            self.persist.insert(key.clone(), (etag.clone(), now));
        }
        match after_attempt(slot.timing(), scheduled, now, true, slot.catch_up_to, window, now) {
            AfterAttempt::Remove => {
                self.queue.remove(key);
                self.persist.remove(key);
                self.removals.insert(key.clone(), etag);
            }
            AfterAttempt::Next(next) => self.queue.requeue(key, next),
            _ => {
                self.queue.remove(key);
            }
        }
    }

    /// After a failed delivery: the same occurrence again after a backoff, or the
    /// next one if that comes first.
    fn retry(&mut self, key: &Key, scheduled: Timestamp, why: &str) {
        let now = self.now;
        let window = self.options.loading_window;
        let Some(slot) = self.queue.get_mut(key) else {
            return;
        };
        slot.attempts = slot.attempts.saturating_add(1);
        let retry = now.saturating_add(backoff(u32::from(slot.attempts), &mut self.rng));
        match after_attempt(
            slot.timing(),
            scheduled,
            now,
            false,
            slot.catch_up_to,
            window,
            retry,
        ) {
            AfterAttempt::GiveUp(next) => {
                Counters::bump(&self.counters.ticks_given_up);
                tracing::error!(actor = %key.actor(), name = %key.name(), scheduled = %scheduled, error = %why, attempts = slot.attempts,
                    "reminder tick not delivered before the next one was due; moving on");
                slot.attempts = 0;
                slot.noticed = false;
                self.queue.requeue(key, next);
            }
            plan => {
                tracing::warn!(actor = %key.actor(), name = %key.name(), scheduled = %scheduled, error = %why, attempt = slot.attempts,
                    "reminder tick delivery failed; retrying");
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
            return; // backing off after a failure: the timer pumps
        }
        while self.writes < MAX_WRITES {
            let write = if let Some(key) = self.removals.keys().next().cloned() {
                let etag = self.removals.remove(&key).unwrap_or_else(|| Etag::new(""));
                Write::Remove { key, etag }
            } else if let Some(key) = self.persist.keys().next().cloned() {
                let Some((etag, at)) = self.persist.remove(&key) else {
                    return;
                };
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
                // A newer time queued meanwhile wins.
                self.persist.entry(key).or_insert((etag, at));
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

/// Cuts every message of `messages` that is over [`MAX_HANDOFF_MESSAGE`] bytes
/// into parts that are not (the transport refuses larger notice bodies, and a
/// release never taken fails its range over after the hold timeout).
fn fit_messages(messages: &mut Vec<(SiloAddress, HandoffMessage)>) {
    *messages = std::mem::take(messages)
        .into_iter()
        .flat_map(|(to, m)| m.fit(MAX_HANDOFF_MESSAGE).into_iter().map(move |m| (to, m)))
        .collect();
}

/// The parts of `range` a silo other than `allowed` (and `to`) owned in one of a
/// silo's rings current after `at` (UTC ms): `log` (past rings with when each
/// began, oldest first), then `ring`, current since `since`. There it may have
/// delivered after a release made at `at`. (Found by a seed: a leaver's release
/// settled a range ten seconds later for a gone joiner that had never owned it,
/// although a silo that owned it meanwhile had delivered there and crashed: five
/// ticks repeated.)
fn owned_by_others_since(
    log: &VecDeque<(Timestamp, Arc<Ring>)>,
    ring: &Ring,
    since: Timestamp,
    at: u64,
    range: RingRange,
    allowed: &[SiloAddress],
    to: Option<SiloAddress>,
) -> Vec<RingRange> {
    let at = Timestamp::from_millis(at);
    let ends = log
        .iter()
        .skip(1)
        .map(|(began, _)| *began)
        .chain(std::iter::once(since));
    let rings = log
        .iter()
        .zip(ends)
        .filter(|(_, end)| *end > at)
        .map(|((_, r), _)| &**r)
        .chain(std::iter::once(ring));
    let mut out = Vec::new();
    for r in rings {
        for (part, owner) in r.owners_within(range) {
            if !allowed.contains(&owner) && Some(owner) != to {
                out.push(part);
            }
        }
    }
    out
}

/// Splits `p` by the pieces of `over` (each with its release), in order: a part
/// that one of them covers becomes that piece (its floor, the silo it waited for)
/// and carries that release's per-reminder floors there instead of `floors`' own;
/// the rest keeps `p`. The parts go to `pieces`.
fn overlay<'a>(
    p: ReleasedPiece,
    over: impl Iterator<Item = (&'a Release, &'a ReleasedPiece)>,
    pieces: &mut Vec<ReleasedPiece>,
    floors: &mut Vec<Floor>,
) {
    let mut rest = vec![p.range];
    for (release, q) in over {
        for left in std::mem::take(&mut rest) {
            for range in crate::handoff::intersect(left, q.range) {
                // A piece that waits with no floor of its own keeps `p`'s as the
                // fallback of a chain that closes (nobody delivered since).
                pieces.push(ReleasedPiece {
                    range,
                    floor: q.floor.or(p.floor),
                    ..*q
                });
                floors.retain(|f| !range.contains(actor_hash(&f.actor)));
                floors.extend(
                    release
                        .floors
                        .iter()
                        .filter(|f| range.contains(actor_hash(&f.actor)))
                        .cloned(),
                );
            }
            rest.extend(crate::handoff::subtract(left, &[q.range]));
        }
    }
    pieces.extend(rest.into_iter().map(|range| ReleasedPiece { range, ..p }));
}
