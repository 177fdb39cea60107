//! What goes in and out of a [`ReminderMachine`](super::ReminderMachine): its
//! events, its actions and its timers.

use std::sync::Arc;
use std::time::Duration;

use rollcall_core::lease::ShardLease;
use rollcall_core::{MembershipSnapshot, ReminderEntry, SiloAddress, Timestamp};
use smol_str::SmolStr;

use super::{Key, LoadId, ReleaseHint, Write};
use crate::api::{ReminderError, ReminderTick};
use crate::shards::ShardEvent;
use rollcall_core::ownership::ring::RingRange;

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
    /// The shard machine's timer ([`ShardAction::SetTimer`](crate::shards::ShardAction::SetTimer)).
    Shards,
    /// A stopping shard's drain ends ([`MAX_DRAIN`](crate::handoff::MAX_DRAIN)).
    Drain,
}
/// What happens to a reminder machine.
#[derive(Debug)]
pub enum Event {
    /// The service started: arm the periodic reload.
    Start,
    /// An actor host (`ActorHost`) started (+1) or stopped (-1) on this
    /// service: while any runs, a release also waits (as for deliveries in
    /// flight, at most the drain) for [`Event::HostDrained`] of the shard.
    Hosts(isize),
    /// The actor hosts ended every activation of `shard` held at `epoch`
    /// (their mailboxes handled, their state flushed): its release may be
    /// written.
    HostDrained {
        /// The shard.
        shard: u32,
        /// The epoch the activations were under.
        epoch: u64,
    },
    /// The silo's membership view changed (or was published again).
    View(Arc<MembershipSnapshot>),
    /// The silo's clock report changed ([`SiloHandle::clock`](rollcall_core::SiloHandle::clock)
    /// with the `runtime` feature): beyond the bound, this silo releases its
    /// shards and takes none until it is back (see [`crate::shards`], rule 9).
    Clock {
        /// Whether the clock is within the bound.
        within_bound: bool,
        /// The cluster's `max_clock_offset`.
        max_offset: std::time::Duration,
    },
    /// Messages on the notice topic ([`ChangedNotice`](super::ChangedNotice)), at most
    /// [`NOTICE_BATCH`](super::NOTICE_BATCH).
    Notices(Vec<Inbound>),
    /// Messages on the release topic ([`ReleaseHint`](super::ReleaseHint)).
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
        lease_epoch: u64,
        /// The reminder.
        key: Key,
        /// The row, none if absent, or the error.
        result: Result<Option<ReminderEntry>, ReminderError>,
    },
    /// The answer to [`Action::ReadPiece`].
    PieceRead {
        /// The load, as asked.
        load: LoadId,
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
    /// The end of [`Action::AppendRun`]: whether the record was appended.
    RunAppended {
        /// `false`: the append failed or timed out (the record is dropped).
        ok: bool,
    },
    /// The answer to a call of the shard leases: [`Action::ReadLease`]
    /// ([`ShardEvent::Read`]), [`Action::WriteLease`] ([`ShardEvent::Written`]),
    /// [`Action::ReadSilo`] ([`ShardEvent::SiloRead`]) or
    /// [`Action::ConfirmSelf`] ([`ShardEvent::SelfRead`]).
    Shard(ShardEvent),
}

#[cfg(feature = "runtime")]
impl From<rollcall_core::ownership::OwnershipFeed> for Event {
    fn from(feed: rollcall_core::ownership::OwnershipFeed) -> Self {
        use rollcall_core::ownership::OwnershipFeed;
        match feed {
            OwnershipFeed::Hosts(delta) => Event::Hosts(delta),
            OwnershipFeed::HostDrained { shard, epoch } => Event::HostDrained { shard, epoch },
            OwnershipFeed::Fenced { shard, epoch } => Event::Shard(ShardEvent::Fenced { shard, epoch }),
        }
    }
}

/// What the machine asks its executor to do.
#[derive(Debug)]
pub enum Action {
    /// `read_row(key)`, bounded by `table_operation_timeout`; answer with
    /// [`Event::RowRead`].
    ReadRow {
        /// Echoed in the answer: the shard's lease epoch.
        lease_epoch: u64,
        /// The reminder.
        key: Key,
    },
    /// `read_rows_in_range(piece)`, bounded; answer with [`Event::PieceRead`].
    ReadPiece {
        /// Echoed in the answer.
        load: LoadId,
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
    /// A table write, bounded; answer with [`Event::Written`]. Under the
    /// fence of the shard's lease as this silo holds it when the write is
    /// sent (`None` for a parked row: it goes to the parked table), so the
    /// store refuses it once another silo acquired the shard (issue 72,
    /// item 5).
    Write(Write, Option<rollcall_core::Fence>),
    /// Append a record to a reminder's run history (`append_run`, keeping the
    /// options' `run_history`), bounded; answer with [`Event::RunAppended`].
    AppendRun(super::RunWrite),
    /// Read a shard's lease, bounded; answer with [`Event::Shard`].
    ReadLease(u32),
    /// Read a shard's lease row without the exceptions in its pages
    /// (`ShardLeases::read_head`), bounded; answer with [`Event::Shard`].
    ReadLeaseHead(u32),
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
    /// The shards this silo holds and keeps changed: publish them
    /// (`Reminders::held_shards`, `Reminders::fence`).
    Held(crate::Held),
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
    /// A takeover's missed-tick policy skipped this many occurrences of one
    /// reminder (`ReminderStats::takeover_skipped`): count them.
    TicksSkipped(u64),
}
