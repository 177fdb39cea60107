//! Shard ownership held in the store: the rules of the shard leases, as a
//! sans-io state machine ([`ShardMachine`]: events and the time in, actions
//! out). It decides which shards of a reminder service this silo holds and
//! when it may deliver their ticks; the store's compare-and-set on each shard's
//! lease row ([`crate::lease`]) decides between silos.
//!
//! # The rules
//! 1. **Assignment.** Shard `k` (the actors [`actor_shard`](crate::actor_shard) maps to `k`: the
//!    hash range [`shard_range`](super::shard_range)) is assigned to the owner on the ring of the
//!    Active silos of the first hash of its range. A silo wants the shards
//!    assigned to it while it is Active and not leaving.
//! 2. **Acquire** a wanted shard by compare-and-set of its lease row, with the
//!    epoch one higher and itself as owner, when the row is absent, Released,
//!    or Owned by a silo Dead in the membership view (one the view does not
//!    hold is confirmed with one read of its membership row first).
//! 3. **Load.** After acquiring, the shard's rows are read and scheduled from
//!    the lease: after its watermark `W` (its exceptions from their own
//!    occurrence) when the row was released, from the takeover time when its
//!    owner died (`Skip` / `FireOnce` decide only what fell due before it). With
//!    fencing on, the takeover time is a lease period `L` plus the cluster's
//!    `max_clock_offset` after this silo first saw the owner Dead: the load
//!    runs during that wait, and every occurrence from its end on is owed,
//!    however late the load answers (the reminders' `handoff`, rule 1). When the row holds
//!    the Dead holder's checkpoint (rule 11), every occurrence after it (less
//!    `max_clock_offset`) and every exception it names are owed too, under
//!    every policy, delivered from the takeover time on.
//! 4. **Release** a shard that is no longer wanted: stop delivering, then
//!    compare-and-set `W = max(W, started through)` with the exceptions,
//!    `listed_from` (`W` less `max_clock_offset`: every row whose first
//!    occurrence is at or after it is named, so an unnamed one there is a
//!    registration the release never saw) and `Released`. A shard given up before its load finished is written back
//!    as acquired (it delivered nothing): Released, or after a takeover Owned
//!    by the Dead holder again, so the next holder takes it over in turn,
//!    owing from this takeover's time (the row's `fenced_from`).
//! 5. **Fence.** A failed compare-and-set on a held shard means another epoch
//!    holds it: the silo stops delivering there at once. With fencing on, a
//!    silo delivers only while it confirmed its own membership row Active
//!    within the last `L` (confirmations are read every `L / 3`), so a silo
//!    declared Dead while it runs stops delivering before its successor's
//!    takeover time (rule 3).
//! 6. **Outcomes.** A write that failed may have landed: the row is read again
//!    and the read decides (a row naming this silo at the epoch it wrote is
//!    held). A read that fails, or a holder's membership read that gets no
//!    answer, is asked again after a poll: at most one read per shard per poll,
//!    whatever the store does.
//! 7. **Leave.** A graceful leave releases every held shard (rule 4) and
//!    reports [`ShardAction::Left`] when none is held, before the silo writes
//!    its ShuttingDown row.
//! 8. **Hints.** After a release, a best-effort message tells the shard's owner
//!    in this silo's view; a silo waiting for that shard reads its row at once
//!    instead of at its next poll. The store decides: a lost or stale hint costs
//!    a poll, never a tick.
//! 9. **Clocks.** The fence compares wall clocks and assumes two silos' clocks
//!    differ by at most `max_clock_offset` (rule 3 waits that much longer).
//!    A silo whose clock report ([`ShardEvent::Clock`], measured by the
//!    membership agent from its probes) is beyond the bound wants no shard: it
//!    releases the ones it holds (rule 4, which compares no clocks) and takes
//!    none until it is back. Its membership row says so
//!    (`clock_beyond_bound`), so the ring leaves it out (rule 1,
//!    [`Ring::of_active`](super::ring::Ring::of_active)) and the others take
//!    its released shards as in any graceful handoff, within about a lease
//!    period plus `lease_poll`; when its row says it is within again, the ring
//!    gives its share back. Only when every silo is beyond do its shards wait:
//!    what the release owed is kept, and what falls due meanwhile is
//!    delivered late, or follows the missed-tick policy past a minute
//!    (the reminders' `handoff::MAX_CATCH_UP`).
//! 10. **Healing.** A store that fails over may lose its last writes (Redis'
//!     asynchronous replication), so a lease row may go back to what it was.
//!     A held shard's row is read again (its head alone) when the store
//!     answers after a failure (a failover shows as failed calls first; at
//!     most every [`REVERIFY_POLLS`] polls), on a fenced write, and one
//!     held shard a poll in turn: naming
//!     this silo at its epoch, it is still held; at a lower epoch, whoever it
//!     names, this silo's acquire was lost (every acquire raises the epoch,
//!     so nothing lower is newer) and is written again by compare-and-set,
//!     with nothing delivered until it lands; anything else, another holder
//!     has it and the shard is dropped at once (rule 5). A silo that waits
//!     [`HINT_AFTER_POLLS`] polls for a live holder the ring does not name
//!     hints it; a silo hinted about a shard it neither holds nor wants reads
//!     the row and, if the row names it (its release was lost), releases it
//!     as the row stands (what it delivered since may come again; nothing is
//!     lost).
//! 11. **Checkpoints.** Every `lease_checkpoint_interval` (per shard, from
//!     its load on) the holder of a loaded shard tells its progress: the
//!     latest occurrence it started (or the row's checkpoint, when later)
//!     and what it owes at or before it (waiting, failed, or still running),
//!     at most [`CHECKPOINT_EXCEPTIONS`] of them, the watermark lowered to
//!     just before the first left out ([`checkpoint_of`]). When that moved
//!     since the row's, it is written as the row's `owed_from` and
//!     exceptions by compare-and-set at the same epoch (the fencing token is
//!     unchanged), delivering on meanwhile. Landed, the row's etag moves
//!     on; another write first or an unknown outcome reads the row (rule 10:
//!     still this epoch's, held; another's, dropped); a release that meets
//!     a moved etag reads the row too and, when it is still this epoch's,
//!     writes again over it (rule 6). A stopping shard (rule 4) is
//!     checkpointed too: its progress at the stop, written while its
//!     final load runs (and again after a poll when the outcome is
//!     unknown, after an interval otherwise), its release written once
//!     that answer is in; so a release that never lands (the silo dies
//!     meanwhile, or leaves while the store cannot acknowledge writes)
//!     costs the successor the deliveries in flight at the stop, not the
//!     interval before it. An acquire from a release starts with
//!     the release's watermark as its checkpoint (a row never delivered
//!     from: the epoch's start); a takeover keeps the Dead holder's. The
//!     successor of a crash owes everything after that checkpoint (rule 3).
//!
//! # Safety, in short
//! One holder per epoch (compare-and-set on one row); each epoch starts after
//! what the row says was delivered (`W`, the exceptions) and releases exactly
//! what it did not deliver; watermarks never move back. So on graceful churn no
//! occurrence is delivered twice or lost, whatever the views say and however
//! late messages arrive; a release owes however many reminders are owed (the
//! lease row's pages hold what the row does not) and waits for the
//! deliveries in flight first (`handoff`, rule 2).
//! After a crash the successor delivers from its takeover time `T` on, after
//! the Dead holder stopped (rule 5): every occurrence due at or after `T` is
//! delivered, under every missed-tick policy. With checkpoints (rule 11, the
//! default) it also owes, in turn, every occurrence after the Dead holder's
//! last checkpoint `C` (less `max_clock_offset`) and every exception it
//! names. **What a crash may skip:** with checkpoints, nothing, unless an
//! owed occurrence before `T` is older than `MAX_CATCH_UP` (60 s) at the
//! load (checkpoints that could not be written for that long: the
//! missed-tick policy decides it); without them, the occurrences due before
//! `T` that the Dead holder did not deliver (from its crash on: at most the
//! detection time plus `lease_period` plus `max_clock_offset`), all of them
//! under `Skip` and all but the last under `FireOnce`; the skipped ones due
//! after the cluster saw it Dead are counted in `takeover_skipped` and
//! recorded `skipped` in their run history. **What a crash may repeat:** with
//! checkpoints, what the Dead holder delivered after `C` less
//! `max_clock_offset` (about one checkpoint interval, more while its
//! checkpoints could not land); in every case, a one-shot, or a `FireOnce`
//! reminder's last occurrence before `T`, that the Dead holder delivered but
//! whose removal or `last_fired` write had not landed (normally those of its
//! last moments; during a store outage, every such write still queued), and
//! a one-shot whose removal it had taken over from a holder that left during
//! a store outage; without checkpoints, no other periodic or cron
//! occurrence. Every delivery of one occurrence carries the same
//! `ReminderTick::occurrence_id()`: a handler that records the ids it
//! handled drops the repeat. Delivery is at least once after a crash, exactly
//! once on graceful churn.
//!
//! Modelled on Temporal's history shards (a range id bumped on every acquire,
//! ack levels checkpointed into the shard row) and Kafka's consumer groups (commit on revoke,
//! read on assign, generation ids fencing stale members).

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use crate::lease::{LeaseException, LeaseStatus, ShardLease};
use crate::{Etag, MembershipSnapshot, SiloAddress, SiloStatus, Timestamp};

use super::ring::Ring;

mod checkpoint;
mod heal;
use super::shard::shard_start;
pub use checkpoint::{checkpoint_of, CHECKPOINT_EXCEPTIONS};
pub use heal::{HINT_AFTER_POLLS, REVERIFY_POLLS};

/// Options of a [`ShardMachine`].
#[derive(Clone, Debug)]
pub struct ShardOptions {
    /// The service's shard count (recorded in the store: see
    /// [`ShardLeases::open`](crate::ShardLeases::open)).
    pub shards: u32,
    /// Points per silo on the ring ([`Ring`]).
    pub ring_points_per_silo: u32,
    /// `L`: how long a silo delivers after it last confirmed its own row
    /// Active, and how long a successor waits after it saw a holder Dead.
    pub lease_period: Duration,
    /// Whether rule 5's fencing is on.
    pub fencing: bool,
    /// How often a shard held by a live silo is read again (the releasing
    /// silo's message spares the wait; the store decides).
    pub poll: Duration,
    /// How often a held shard's progress is checkpointed into its lease row
    /// (rule 11); zero: never.
    pub checkpoint: Duration,
}

/// Why a lease write failed.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteFailed {
    /// It may have landed (a timeout, a lost connection, a server error): the
    /// row is read to learn its outcome (rule 6).
    Unknown(String),
    /// It was refused before anything was sent and would be refused again (a
    /// row the store cannot take, `Error::InvalidInput`; a corrupt answer):
    /// never read back as if it might have landed, and tried again only
    /// after a poll, with an error logged each time.
    Refused(String),
}

impl WriteFailed {
    /// From a store call's error: [`Refused`](Self::Refused) for one that is
    /// not transient, else [`Unknown`](Self::Unknown).
    pub fn of(e: &crate::Error) -> WriteFailed {
        if e.is_transient() {
            WriteFailed::Unknown(e.to_string())
        } else {
            WriteFailed::Refused(e.to_string())
        }
    }
}

/// What the machine is told.
#[derive(Clone, Debug)]
pub enum ShardEvent {
    /// A membership view (any version; the newest wins).
    View(Arc<MembershipSnapshot>),
    /// The answer of [`ShardAction::Read`]: the row (vacant when absent), or
    /// the error's text.
    Read {
        /// The shard.
        shard: u32,
        /// The row.
        result: Result<ShardLease, String>,
    },
    /// The answer of [`ShardAction::Write`]: `Ok(Ok(etag))` written,
    /// `Ok(Err(current))` another write came first, `Err` failed (see
    /// [`WriteFailed`]).
    Written {
        /// The shard.
        shard: u32,
        /// The outcome.
        result: Result<Result<Etag, Option<Etag>>, WriteFailed>,
    },
    /// The shard's rows are loaded and scheduled ([`ShardAction::Load`]).
    Loaded {
        /// The shard.
        shard: u32,
        /// When the full read of its rows started (stored as the lease's
        /// `read_from`).
        read_from: Timestamp,
    },
    /// Delivery in the shard stopped ([`ShardAction::Stop`]): every occurrence
    /// up to `started_through` was delivered or started except `exceptions`,
    /// and none after it was started.
    Stopped {
        /// The shard.
        shard: u32,
        /// See above; `None` when nothing was started (the watermark stays).
        started_through: Option<Timestamp>,
        /// Reminders whose first undelivered occurrence is at or before
        /// `started_through`, and every reminder whose first occurrence is at
        /// or after `listed_from`.
        exceptions: Vec<LeaseException>,
        /// The release's [`ShardLease::listed_from`]: its watermark less the
        /// cluster's `max_clock_offset` (`None` when it has no watermark).
        listed_from: Option<Timestamp>,
    },
    /// The answer of [`ShardAction::ConfirmSelf`]: this silo's own status as
    /// read by a read issued at `at` (`None`: no row), or the error's text.
    SelfRead {
        /// When the read was issued.
        at: Timestamp,
        /// The status read.
        result: Result<Option<SiloStatus>, String>,
    },
    /// The answer of [`ShardAction::ReadSilo`]: the silo's status (`None`: no
    /// row), or the error's text (asked again after a poll: rule 6).
    SiloRead {
        /// The silo.
        silo: SiloAddress,
        /// Its status.
        result: Result<Option<SiloStatus>, String>,
    },
    /// A store refused a write fenced by `shard` at `epoch`
    /// ([`Error::Fenced`](crate::Error::Fenced)): if this silo holds
    /// it at that epoch, its row is read again at once (rule 10).
    Fenced {
        /// The shard.
        shard: u32,
        /// The epoch the write carried.
        epoch: u64,
    },
    /// Another silo says it released `shard` ([`ShardAction::Hint`]): a shard
    /// this silo waits for is read at once instead of at its next poll. Only a
    /// hint: the row decides.
    Hint {
        /// The shard.
        shard: u32,
    },
    /// This silo's clock report changed (see
    /// [`crate::protocol::clock`]): beyond the bound, the silo wants no
    /// shard (it releases the ones it holds, rule 9); `max_offset` lengthens the
    /// takeover fence (rule 3).
    Clock {
        /// Whether the silo's clock is within half of `max_offset` from the
        /// median of its peers'.
        within_bound: bool,
        /// The cluster's `max_clock_offset`.
        max_offset: Duration,
    },
    /// The answer of [`ShardAction::Checkpoint`]: the shards' progress now
    /// (rule 11), all in one event. Each is written when it moved since its
    /// row's.
    Progress(Vec<Progress>),
    /// The timer of [`ShardAction::SetTimer`] fired (or any time passed).
    Tick,
    /// The silo leaves: release everything.
    Leave,
}

/// One shard's progress (rule 11), for [`ShardEvent::Progress`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Progress {
    /// The shard.
    pub shard: u32,
    /// Every occurrence at or before it was delivered or started, except
    /// `exceptions` ([`ShardLease::owed_from`]).
    pub owed_from: Option<Timestamp>,
    /// What the holder owes at or before `owed_from`, in due order.
    pub exceptions: Vec<LeaseException>,
}

/// What the machine asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ShardAction {
    /// Read the lease row of a shard; answer [`ShardEvent::Read`].
    Read(u32),
    /// Read the lease row of a shard without the exceptions in its pages
    /// ([`ShardLeases::read_head`](crate::ShardLeases::read_head): a
    /// held shard's verification, rule 10); answer [`ShardEvent::Read`].
    ReadHead(u32),
    /// Compare-and-set the lease (expected: its `etag`, empty for no row);
    /// answer [`ShardEvent::Written`].
    Write(ShardLease),
    /// Read the shard's rows and schedule them from `lease` (after its
    /// watermark and from its exceptions, or from `takeover` on, when set: the
    /// previous holder died); answer [`ShardEvent::Loaded`]. Deliver only while
    /// [`ShardMachine::may_deliver`].
    Load {
        /// The lease as acquired (its epoch fences the holder's writes).
        lease: ShardLease,
        /// The takeover time after a crash.
        takeover: Option<Timestamp>,
    },
    /// Stop delivering in the shard now; answer [`ShardEvent::Stopped`].
    Stop(u32),
    /// Tell these shards' progress, delivering on; answer one
    /// [`ShardEvent::Progress`] (a shard not loaded here left out).
    Checkpoint(Vec<u32>),
    /// Forget the shard's reminders without an answer: another epoch holds it.
    Drop(u32),
    /// Read a silo's membership row; answer [`ShardEvent::SiloRead`].
    ReadSilo(SiloAddress),
    /// Read this silo's own membership row; answer [`ShardEvent::SelfRead`].
    ConfirmSelf,
    /// Tell `to` (the shard's owner in this silo's view) that the shard was
    /// released, best effort ([`ShardEvent::Hint`] there); a lost hint costs the
    /// receiver a poll, never a tick.
    Hint {
        /// The shard.
        shard: u32,
        /// Its owner in this silo's view.
        to: SiloAddress,
    },
    /// Send [`ShardEvent::Tick`] at this time (the earliest wins).
    SetTimer(Timestamp),
    /// The leave released every shard.
    Left,
}

/// Where one shard stands on this silo.
#[derive(Clone, Debug)]
enum Slot {
    /// The row is being read.
    Reading,
    /// Held by a silo that may still run; read again at `until`.
    Waiting { until: Timestamp },
    /// Its holder is missing from the view: its membership row is being read.
    Confirming { lease: ShardLease },
    /// The acquire (`lease`, the next epoch) was written; `takeover`: the
    /// previous holder died (rule 3).
    Acquiring {
        lease: ShardLease,
        takeover: Option<Timestamp>,
    },
    /// An acquire's outcome is unknown; the row is being read.
    AcquireUnknown {
        lease: ShardLease,
        takeover: Option<Timestamp>,
    },
    /// Acquired; the rows are loading.
    Loading { lease: ShardLease },
    /// Held, delivering.
    Owned { lease: ShardLease },
    /// Held, delivering, its row being read again (rule 10: a compare-and-set
    /// lost in a store failover).
    Verifying { lease: ShardLease },
    /// Held, delivering, a checkpoint of its progress (`next`, same epoch)
    /// being written over `lease` (rule 11).
    Checkpointing {
        lease: ShardLease,
        next: Box<ShardLease>,
    },
    /// Held, but the row names this silo at a lower epoch (its acquire was
    /// lost): the acquire is written again over it; nothing is delivered
    /// meanwhile (an unknown outcome is read, rule 6).
    Reasserting { lease: ShardLease },
    /// Not held here, though another silo says this silo may hold it (rule
    /// 10): the row is being read; one that names this silo is released.
    Orphan,
    /// Delivery was told to stop; the release follows. `checkpoint`: the
    /// progress at the stop being written over `lease` (rule 11); `stopped`:
    /// the stop's answer, whose release waits for that write's answer (one
    /// write in flight per shard).
    Stopping {
        lease: ShardLease,
        checkpoint: Option<Box<ShardLease>>,
        stopped: Option<Box<Stopped>>,
    },
    /// The release (`lease`) was written.
    Releasing { lease: ShardLease },
    /// A release's outcome is unknown; the row is being read.
    ReleaseUnknown { lease: ShardLease },
}

/// What [`ShardEvent::Stopped`] says: what the release writes.
#[derive(Clone, Debug)]
struct Stopped {
    started_through: Option<Timestamp>,
    exceptions: Vec<LeaseException>,
    listed_from: Option<Timestamp>,
}

/// The shard ownership of one silo (see the module docs for its rules).
#[derive(Debug)]
pub struct ShardMachine {
    me: SiloAddress,
    options: ShardOptions,
    view: Option<Arc<MembershipSnapshot>>,
    ring: Ring,
    leaving: bool,
    left: bool,
    /// Whether this silo's clock is within the bound (rule 9).
    clock_within: bool,
    /// The cluster's `max_clock_offset` (rule 3's fence).
    max_clock_offset: Duration,
    /// When a read issued at this time last found this silo Active.
    confirmed_at: Option<Timestamp>,
    /// When the last confirmation read was asked for.
    confirm_asked: Option<Timestamp>,
    /// When this silo first saw each silo Dead (its own clock).
    dead_since: HashMap<SiloAddress, Timestamp>,
    /// Shards being taken over (acquiring or loading): the Dead holder.
    taken_from: BTreeMap<u32, SiloAddress>,
    slots: BTreeMap<u32, Slot>,
    /// When to ask again for a read whose answer did not come or failed: the
    /// holder's membership row of a `Confirming` slot, the lease row of an
    /// `*Unknown` one (one read per poll at most, whatever the store does).
    retry_at: BTreeMap<u32, Timestamp>,
    /// Rule 10's verifications and waits.
    healing: heal::Healing,
    /// Rule 11's checkpoint times.
    checkpoints: checkpoint::Checkpoints,
}

fn after(t: Timestamp, d: Duration) -> Timestamp {
    Timestamp::from_millis(t.as_millis().saturating_add(d.as_millis() as u64))
}

impl ShardMachine {
    /// The machine of silo `me`.
    pub fn new(me: SiloAddress, options: ShardOptions) -> ShardMachine {
        ShardMachine {
            me,
            options,
            view: None,
            ring: Ring::default(),
            leaving: false,
            left: false,
            clock_within: true,
            max_clock_offset: Duration::ZERO,
            confirmed_at: None,
            confirm_asked: None,
            dead_since: HashMap::new(),
            taken_from: BTreeMap::new(),
            slots: BTreeMap::new(),
            retry_at: BTreeMap::new(),
            healing: heal::Healing::default(),
            checkpoints: checkpoint::Checkpoints::default(),
        }
    }

    /// The shards this silo holds and delivers (its rows loaded).
    pub fn owned(&self) -> Vec<u32> {
        self.slots
            .iter()
            .filter(|(_, s)| {
                matches!(
                    s,
                    Slot::Owned { .. } | Slot::Verifying { .. } | Slot::Checkpointing { .. }
                )
            })
            .map(|(k, _)| *k)
            .collect()
    }

    /// Whether ticks of `shard` may be delivered at `now`: the shard is held
    /// and loaded, `now` is past its watermark (after a takeover the
    /// watermark is the takeover time less 1 ms: rule 3), and (fencing on)
    /// this silo confirmed its own row Active within the lease period.
    pub fn may_deliver(&self, shard: u32, now: Timestamp) -> bool {
        matches!(self.slots.get(&shard), Some(Slot::Owned { lease } | Slot::Verifying { lease } | Slot::Checkpointing { lease, .. }) if lease.watermark.is_none_or(|w| now > w))
            && self.confirmed(now)
    }

    /// The service's shard count ([`ShardOptions::shards`]).
    pub fn shard_count(&self) -> u32 {
        self.options.shards.max(1)
    }

    /// Whether the silo leaves ([`ShardEvent::Leave`] came).
    pub fn leaving(&self) -> bool {
        self.leaving
    }

    /// The cluster's `max_clock_offset`, as the last [`ShardEvent::Clock`]
    /// said (zero before one came).
    pub fn max_clock_offset(&self) -> Duration {
        self.max_clock_offset
    }

    /// Whether no shard is on its way to this silo: none is being read,
    /// confirmed, acquired or loaded (a shard a live silo still holds does not
    /// count: it comes when that silo releases it).
    pub fn settled(&self) -> bool {
        self.view.is_some()
            && self.slots.values().all(|s| {
                matches!(
                    s,
                    Slot::Waiting { .. }
                        | Slot::Owned { .. }
                        | Slot::Verifying { .. }
                        | Slot::Checkpointing { .. }
                        | Slot::Reasserting { .. }
                        | Slot::Stopping { .. }
                        | Slot::Releasing { .. }
                        | Slot::ReleaseUnknown { .. }
                )
            })
    }

    /// Until when (fencing on) this silo may act as the holder of its shards:
    /// its last confirmation of its own row Active plus the lease period
    /// (`None`: never confirmed). `Timestamp::MAX`-like `u64::MAX` ms with
    /// fencing off.
    pub fn confirmed_until(&self) -> Option<Timestamp> {
        if !self.options.fencing {
            return Some(Timestamp::from_millis(u64::MAX));
        }
        self.confirmed_at.map(|at| after(at, self.options.lease_period))
    }

    /// Whether (fencing on) this silo confirmed its own row Active within the
    /// lease period before `now`; always true with fencing off.
    pub fn confirmed(&self, now: Timestamp) -> bool {
        !self.options.fencing
            || self
                .confirmed_at
                .is_some_and(|at| now < after(at, self.options.lease_period))
    }

    /// Whether `shard` is assigned to this silo and wanted.
    fn wanted(&self, shard: u32) -> bool {
        !self.leaving
            && self.clock_within
            && self
                .view
                .as_ref()
                .and_then(|v| v.entry(&self.me))
                .is_some_and(|e| e.status == SiloStatus::Active)
            && self.ring.owner_of(shard_start(shard, self.options.shards)) == Some(self.me)
    }

    /// Handles `event` at `now`; the actions to carry out, in order.
    pub fn handle(&mut self, now: Timestamp, event: ShardEvent) -> Vec<ShardAction> {
        let mut out = Vec::new();
        // Rule 10: a store that failed may have failed over and lost writes.
        self.note_store_answer(now, &event);
        match event {
            ShardEvent::View(v) => self.view(now, v, &mut out),
            ShardEvent::Read { shard, result } => self.read(now, shard, result, &mut out),
            ShardEvent::Written { shard, result } => self.written(now, shard, result, &mut out),
            ShardEvent::Loaded { shard, read_from } => {
                if let Some(Slot::Loading { lease }) = self.slots.get(&shard) {
                    let takeover = self.taken_from.remove(&shard).is_some();
                    let mut lease = lease.clone();
                    lease.read_from = Some(read_from);
                    if self.wanted(shard) {
                        self.first_checkpoint(now, shard, &lease, takeover);
                        self.slots.insert(shard, Slot::Owned { lease });
                        self.start_verifying(now);
                    } else {
                        self.stop(shard, lease, &mut out);
                    }
                }
            }
            ShardEvent::Stopped {
                shard,
                started_through,
                exceptions,
                listed_from,
            } => {
                let stopped = Stopped {
                    started_through,
                    exceptions,
                    listed_from,
                };
                match self.slots.get_mut(&shard) {
                    Some(Slot::Stopping {
                        lease,
                        checkpoint: None,
                        ..
                    }) => {
                        let lease = lease.clone();
                        self.release(shard, &lease, stopped, &mut out);
                    }
                    // The release waits for the checkpoint's answer.
                    Some(Slot::Stopping {
                        checkpoint: Some(_),
                        stopped: parked,
                        ..
                    }) => *parked = Some(Box::new(stopped)),
                    _ => {}
                }
            }
            ShardEvent::SelfRead { at, result } => {
                if result == Ok(Some(SiloStatus::Active)) {
                    self.confirmed_at = self.confirmed_at.max(Some(at));
                }
            }
            ShardEvent::SiloRead { silo, result: Err(_) } => {
                tracing::debug!(%silo, "reading a lease holder's membership row failed; asked again after a poll")
            }
            ShardEvent::SiloRead {
                silo,
                result: Ok(status),
            } => {
                let dead = status.is_none_or(|s| s == SiloStatus::Dead);
                if dead {
                    self.dead_since.entry(silo).or_insert(now);
                }
                let waiting: Vec<u32> = self
                    .slots
                    .iter()
                    .filter(|(_, s)| matches!(s, Slot::Confirming { lease } if lease.owner == Some(silo)))
                    .map(|(k, _)| *k)
                    .collect();
                for k in waiting {
                    if let Some(Slot::Confirming { lease }) = self.slots.remove(&k) {
                        if dead {
                            self.consider(now, k, lease, &mut out);
                        } else {
                            // Alive, newer than this silo's view: read the row again later.
                            let until = after(now, self.options.poll);
                            self.slots.insert(k, Slot::Waiting { until });
                        }
                    }
                }
            }
            ShardEvent::Hint { shard } => {
                if matches!(self.slots.get(&shard), Some(Slot::Waiting { .. })) && self.wanted(shard) {
                    self.slots.insert(shard, Slot::Reading);
                    out.push(ShardAction::Read(shard));
                } else if !self.slots.contains_key(&shard) && !self.wanted(shard) && !self.left {
                    // Rule 10: a silo waits for this one to release a shard
                    // it does not hold (its release was lost): read the row.
                    self.hinted_orphan(shard, &mut out);
                }
            }
            ShardEvent::Clock {
                within_bound,
                max_offset,
            } => {
                self.max_clock_offset = max_offset;
                if within_bound != self.clock_within {
                    self.clock_within = within_bound;
                    self.let_go_of_unwanted(&mut out);
                    self.want_more(&mut out);
                }
            }
            ShardEvent::Fenced { shard, epoch } => self.fenced(shard, epoch),
            ShardEvent::Progress(all) => {
                for p in all {
                    self.progress(p, &mut out);
                }
            }
            ShardEvent::Tick => {}
            ShardEvent::Leave => {
                self.leaving = true;
                self.let_go_of_unwanted(&mut out);
            }
        }
        self.tick(now, &mut out);
        out
    }

    fn view(&mut self, now: Timestamp, v: Arc<MembershipSnapshot>, out: &mut Vec<ShardAction>) {
        if self
            .view
            .as_ref()
            .is_some_and(|old| old.version.version > v.version.version)
        {
            return;
        }
        for e in v.rows() {
            if e.status == SiloStatus::Dead {
                self.dead_since.entry(e.silo).or_insert(now);
            }
        }
        self.ring = std::mem::take(&mut self.ring).follow(&v, self.options.ring_points_per_silo);
        self.view = Some(v);
        self.let_go_of_unwanted(out);
        self.want_more(out);
    }

    /// Starts reading every wanted shard that has no slot.
    fn want_more(&mut self, out: &mut Vec<ShardAction>) {
        for k in 0..self.options.shards {
            if !self.slots.contains_key(&k) && self.wanted(k) {
                self.slots.insert(k, Slot::Reading);
                out.push(ShardAction::Read(k));
            }
        }
    }

    /// Rule 4 for every shard no longer wanted.
    fn let_go_of_unwanted(&mut self, out: &mut Vec<ShardAction>) {
        let unwanted: Vec<u32> = self.slots.keys().copied().filter(|k| !self.wanted(*k)).collect();
        for k in unwanted {
            match self.slots.remove(&k) {
                // Not held: nothing to give back.
                Some(Slot::Reading | Slot::Waiting { .. } | Slot::Confirming { .. } | Slot::Orphan)
                | None => {}
                Some(Slot::Owned { lease }) => self.stop(k, lease, out),
                Some(Slot::Loading { lease }) => {
                    out.push(ShardAction::Drop(k));
                    self.give_back(k, lease, out);
                }
                // In flight: its answer decides.
                // (A verification or reassertion ends by stopping the shard
                // when it is no longer wanted.)
                Some(
                    s @ (Slot::Acquiring { .. }
                    | Slot::Verifying { .. }
                    | Slot::Checkpointing { .. }
                    | Slot::Reasserting { .. }
                    | Slot::AcquireUnknown { .. }
                    | Slot::Stopping { .. }
                    | Slot::Releasing { .. }
                    | Slot::ReleaseUnknown { .. }),
                ) => {
                    self.slots.insert(k, s);
                }
            }
        }
        self.check_left(out);
    }

    fn check_left(&mut self, out: &mut Vec<ShardAction>) {
        if self.leaving && !self.left && self.slots.is_empty() {
            self.left = true;
            out.push(ShardAction::Left);
        }
    }

    fn read(
        &mut self,
        now: Timestamp,
        k: u32,
        result: Result<ShardLease, String>,
        out: &mut Vec<ShardAction>,
    ) {
        match (self.slots.get(&k).cloned(), result) {
            (Some(Slot::Reading), Ok(lease)) => {
                self.slots.remove(&k);
                if self.wanted(k) {
                    self.consider(now, k, lease, out);
                } else {
                    self.check_left(out);
                }
            }
            (Some(Slot::Reading), Err(_)) => {
                // Read again later.
                self.slots.insert(
                    k,
                    Slot::Waiting {
                        until: after(now, self.options.poll),
                    },
                );
            }
            (Some(Slot::Verifying { lease } | Slot::Reasserting { lease }), row) => {
                self.verified(now, k, lease, row, out)
            }
            (Some(Slot::Orphan), row) => self.orphan_read(now, k, row, out),
            (Some(Slot::ReleaseUnknown { lease: ours }), Ok(row)) => {
                if row.owner == Some(self.me) && row.epoch == ours.epoch && row.status == LeaseStatus::Owned {
                    // The release did not land: write it again over what is there.
                    let release = ShardLease {
                        etag: row.etag,
                        ..ours
                    };
                    out.push(ShardAction::Write(release.clone()));
                    self.slots.insert(k, Slot::Releasing { lease: release });
                } else {
                    // Released (ours landed) or taken by a later epoch.
                    self.slots.remove(&k);
                    if self.wanted(k) {
                        self.consider(now, k, row, out);
                    } else {
                        self.check_left(out);
                    }
                }
            }
            (Some(Slot::ReleaseUnknown { .. } | Slot::AcquireUnknown { .. }), Err(_)) => {
                // Read again after a poll, not at once (the store may be down).
                self.retry_at.insert(k, after(now, self.options.poll));
            }
            (
                Some(Slot::AcquireUnknown {
                    lease: ours,
                    takeover,
                }),
                Ok(row),
            ) => {
                self.slots.remove(&k);
                if row.owner == Some(self.me) && row.epoch == ours.epoch && row.status == LeaseStatus::Owned {
                    // Our acquire landed.
                    self.acquired(
                        k,
                        ShardLease {
                            etag: row.etag,
                            ..ours
                        },
                        takeover,
                        out,
                    );
                } else if self.wanted(k) {
                    self.consider(now, k, row, out);
                } else {
                    self.check_left(out);
                }
            }
            _ => {}
        }
    }

    /// Rule 2 for a wanted shard whose row reads `lease`.
    fn consider(&mut self, now: Timestamp, k: u32, lease: ShardLease, out: &mut Vec<ShardAction>) {
        if !self.wanted(k) {
            self.check_left(out);
            return;
        }
        if lease.status == LeaseStatus::Owned && lease.owner == Some(self.me) {
            // Our acquire landed though its answer was lost (rule 6).
            out.push(ShardAction::Load {
                lease: lease.clone(),
                takeover: None,
            });
            self.slots.insert(k, Slot::Loading { lease });
            return;
        }
        let mut takeover = None;
        if lease.status == LeaseStatus::Owned {
            let Some(owner) = lease.owner else {
                return self.acquire(k, lease, None, out);
            };
            let status = self.view.as_ref().and_then(|v| v.entry(&owner)).map(|e| e.status);
            let dead_since = match status {
                Some(SiloStatus::Dead) => self.dead_since.get(&owner).copied(),
                None => match self.dead_since.get(&owner) {
                    Some(t) => Some(*t),
                    None => {
                        out.push(ShardAction::ReadSilo(owner));
                        self.slots.insert(k, Slot::Confirming { lease });
                        // Asked again if no answer comes within a poll.
                        self.retry_at.insert(k, after(now, self.options.poll));
                        return;
                    }
                },
                Some(_) => {
                    self.slots.insert(
                        k,
                        Slot::Waiting {
                            until: after(now, self.options.poll),
                        },
                    );
                    self.waited(k, owner, out);
                    return;
                }
            };
            // Acquired at once, so the load overlaps the fence; the takeover
            // (what the load plans from) is `L` after this silo saw it Dead.
            let since = dead_since.unwrap_or(now);
            let fence = if self.options.fencing {
                after(since, self.options.lease_period + self.max_clock_offset)
            } else {
                since
            };
            // Never before the row's watermark: a takeover of a takeover
            // keeps the first one's fence.
            let after_w = lease.watermark.map(|w| after(w, Duration::from_millis(1)));
            takeover = Some(match lease.fenced_from {
                // Given back by a silo that took it over: the Dead holder
                // stopped before that takeover's time, and everything from
                // it on is owed (a later fence of this silo's would lose
                // what fell due between the two).
                Some(t) => t.max(after_w.unwrap_or(t)),
                None => fence.max(now).max(after_w.unwrap_or(now)),
            });
        }
        self.acquire(k, lease, takeover, out);
    }

    fn acquire(
        &mut self,
        k: u32,
        lease: ShardLease,
        takeover: Option<Timestamp>,
        out: &mut Vec<ShardAction>,
    ) {
        self.healing.acquiring(k);
        let mut next = ShardLease {
            epoch: lease.epoch + 1,
            owner: Some(self.me),
            status: LeaseStatus::Owned,
            fenced_from: None,
            ..lease
        };
        self.taken_from.remove(&k);
        if let Some(t) = takeover {
            // A crash: nothing is delivered before the takeover time (the
            // watermark gates delivery, rule 5). What the Dead holder owed is
            // its last checkpoint (rule 11), kept for the load and for a
            // takeover of this epoch in turn; without one the load plans
            // from the takeover time (inclusive), and so does the next
            // release.
            let before = Timestamp::from_millis(t.as_millis().saturating_sub(1));
            next.watermark = next.watermark.max(Some(before));
            if next.owed_from.is_none() {
                next.exceptions.clear();
            }
            next.listed_from = None;
            if let Some(dead) = lease.owner {
                self.taken_from.insert(k, dead);
            }
        } else if !self.options.checkpoint.is_zero() {
            // The release's watermark and exceptions are this epoch's first
            // checkpoint (rule 11); a row without one says nothing was
            // delivered yet.
            next.owed_from = next.watermark.or(Some(Timestamp::EPOCH));
        }
        out.push(ShardAction::Write(next.clone()));
        self.slots.insert(
            k,
            Slot::Acquiring {
                lease: next,
                takeover,
            },
        );
    }

    fn written(
        &mut self,
        now: Timestamp,
        k: u32,
        result: Result<Result<Etag, Option<Etag>>, WriteFailed>,
        out: &mut Vec<ShardAction>,
    ) {
        let Some(slot) = self.slots.get(&k).cloned() else {
            return;
        };
        match (slot, result) {
            // Refused: nothing landed, and trying at once would be refused
            // again. The row is read (and the write made again if it still
            // stands) after a poll, as for an unknown outcome whose read failed.
            (Slot::Acquiring { lease, takeover }, Err(WriteFailed::Refused(why))) => {
                tracing::error!(shard = k, error = %why, "a shard lease acquire was refused; trying again after a poll");
                self.slots.insert(k, Slot::AcquireUnknown { lease, takeover });
                self.retry_at.insert(k, after(now, self.options.poll));
            }
            (Slot::Releasing { lease }, Err(WriteFailed::Refused(why))) => {
                tracing::error!(shard = k, error = %why, "a shard lease release was refused; trying again after a poll");
                self.slots.insert(k, Slot::ReleaseUnknown { lease });
                self.retry_at.insert(k, after(now, self.options.poll));
            }
            (Slot::Acquiring { mut lease, takeover }, Ok(Ok(etag))) => {
                lease.etag = etag;
                self.acquired(k, lease, takeover, out);
            }
            (Slot::Acquiring { .. }, Ok(Err(_))) => {
                // Another acquire came first: read the row again.
                self.slots.insert(k, Slot::Reading);
                out.push(ShardAction::Read(k));
            }
            (Slot::Acquiring { lease, takeover }, Err(_)) => {
                // Ours may have landed: the row decides (rule 6).
                self.slots.insert(k, Slot::AcquireUnknown { lease, takeover });
                out.push(ShardAction::Read(k));
            }
            (Slot::Releasing { .. }, Ok(Ok(_))) => {
                self.slots.remove(&k);
                if let Some(to) = self
                    .ring
                    .owner_of(shard_start(k, self.options.shards))
                    .filter(|to| *to != self.me)
                {
                    out.push(ShardAction::Hint { shard: k, to });
                }
                if self.wanted(k) {
                    self.slots.insert(k, Slot::Reading);
                    out.push(ShardAction::Read(k));
                }
                self.check_left(out);
            }
            (Slot::Releasing { lease }, Ok(Err(_))) => {
                // Another epoch holds the shard (we stopped already), or the
                // row moved under this epoch (a checkpoint that landed though
                // its answer was lost, rule 11): the row decides, as for an
                // unknown outcome.
                self.slots.insert(k, Slot::ReleaseUnknown { lease });
                out.push(ShardAction::Read(k));
            }
            (Slot::Releasing { lease }, Err(_)) => {
                self.slots.insert(k, Slot::ReleaseUnknown { lease });
                out.push(ShardAction::Read(k));
            }
            (Slot::Reasserting { lease }, result) => self.reasserted(k, lease, result, out),
            (Slot::Checkpointing { lease, next }, result) => self.checkpointed(k, lease, next, result, out),
            (
                Slot::Stopping {
                    lease,
                    checkpoint: Some(next),
                    stopped,
                },
                result,
            ) => self.stop_checkpointed(now, k, lease, next, stopped, result, out),
            _ => {}
        }
    }

    /// Rule 4's first step for held shard `k` (as `lease`): delivery stops
    /// (and, rule 11, the progress at the stop is checkpointed when the
    /// release cannot follow at once).
    fn stop(&mut self, k: u32, lease: ShardLease, out: &mut Vec<ShardAction>) {
        out.push(ShardAction::Stop(k));
        self.slots.insert(
            k,
            Slot::Stopping {
                lease,
                checkpoint: None,
                stopped: None,
            },
        );
    }

    /// Rule 4's release of stopped shard `k`, held as `lease`, with what its
    /// stop found.
    fn release(&mut self, k: u32, lease: &ShardLease, stopped: Stopped, out: &mut Vec<ShardAction>) {
        let release = ShardLease {
            status: LeaseStatus::Released,
            watermark: lease.watermark.max(stopped.started_through),
            exceptions: stopped.exceptions,
            listed_from: stopped.listed_from,
            // The release's watermark and exceptions say it all.
            owed_from: None,
            ..lease.clone()
        };
        out.push(ShardAction::Write(release.clone()));
        self.slots.insert(k, Slot::Releasing { lease: release });
    }

    /// `lease` (with its etag) is held: load it if still wanted, else write it
    /// back released as it was (it delivered nothing).
    fn acquired(
        &mut self,
        k: u32,
        lease: ShardLease,
        takeover: Option<Timestamp>,
        out: &mut Vec<ShardAction>,
    ) {
        if self.wanted(k) {
            out.push(ShardAction::Load {
                lease: lease.clone(),
                takeover,
            });
            self.slots.insert(k, Slot::Loading { lease });
        } else {
            self.give_back(k, lease, out);
        }
    }

    /// Writes back a shard acquired (`lease`) but not loaded: it delivered
    /// nothing. Released as it was acquired; after a takeover, Owned by the
    /// Dead holder again (at this epoch, with the takeover's watermark), so
    /// that the next holder takes it over too and plans by the missed-tick
    /// policy (a release would say everything up to the watermark was
    /// delivered, and a `FireOnce` catch-up would be lost), from this
    /// takeover's time (`fenced_from`), not from a later fence of its own.
    fn give_back(&mut self, k: u32, lease: ShardLease, out: &mut Vec<ShardAction>) {
        let back = match self.taken_from.remove(&k) {
            Some(dead) => ShardLease {
                owner: Some(dead),
                fenced_from: lease.watermark.map(|w| after(w, Duration::from_millis(1))),
                ..lease
            },
            None => ShardLease {
                status: LeaseStatus::Released,
                ..lease
            },
        };
        out.push(ShardAction::Write(back.clone()));
        self.slots.insert(k, Slot::Releasing { lease: back });
    }

    /// Timers: shards waiting to be read again, and the self-confirmation.
    fn tick(&mut self, now: Timestamp, out: &mut Vec<ShardAction>) {
        let due: Vec<u32> = self
            .slots
            .iter()
            .filter(|(_, s)| matches!(s, Slot::Waiting { until } if *until <= now))
            .map(|(k, _)| *k)
            .collect();
        for k in due {
            if self.wanted(k) {
                self.slots.insert(k, Slot::Reading);
                out.push(ShardAction::Read(k));
            } else {
                self.slots.remove(&k);
            }
        }
        // Checkpoints first: a shard due for one is not held back by its
        // turn to be read again (with one held shard that is every poll).
        let checkpoint = self.checkpoint_due(now, out);
        self.verify_due(now, out);
        let retries: Vec<u32> = self
            .retry_at
            .iter()
            .filter(|(_, t)| **t <= now)
            .map(|(k, _)| *k)
            .collect();
        for k in retries {
            self.retry_at.remove(&k);
            match self.slots.get(&k) {
                Some(Slot::Confirming { lease }) => {
                    if let Some(owner) = lease.owner {
                        out.push(ShardAction::ReadSilo(owner));
                        self.retry_at.insert(k, after(now, self.options.poll));
                    }
                }
                Some(
                    Slot::AcquireUnknown { .. } | Slot::ReleaseUnknown { .. } | Slot::Reasserting { .. },
                ) => out.push(ShardAction::Read(k)),
                // Answered meanwhile.
                _ => {}
            }
        }
        self.check_left(out);
        let mut next: Option<Timestamp> = self
            .slots
            .values()
            .filter_map(|s| match s {
                Slot::Waiting { until } => Some(*until),
                _ => None,
            })
            .chain(self.retry_at.values().copied())
            .chain(self.healing.next())
            .chain(checkpoint)
            .min();
        if self.options.fencing && !self.left {
            let every = self.options.lease_period / 3;
            let due = self.confirm_asked.is_none_or(|t| now >= after(t, every));
            if due {
                self.confirm_asked = Some(now);
                out.push(ShardAction::ConfirmSelf);
            }
            let again = after(self.confirm_asked.unwrap_or(now), every);
            next = Some(next.map_or(again, |n| n.min(again)));
        }
        if let Some(t) = next {
            out.push(ShardAction::SetTimer(t));
        }
    }
}
