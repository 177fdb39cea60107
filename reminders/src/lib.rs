//! # rollcall-reminders
//!
//! Durable reminders for actix applications, after Orleans' reminder service:
//! periodic, calendar (cron in a time zone) or one-shot ticks, optionally with a
//! payload and an end, stored in a reminder table, split into shards whose
//! fenced leases in the store say which silo delivers them, delivered to actix
//! actors, and taken over by a live silo when their holder dies.
//!
//! The rules (pure, no actix, tokio or sockets: they build without the default
//! `runtime` feature):
//! - [`ring`] (the ownership layer's, [`rollcall_core::ownership`]): which
//!   Active silo a shard is assigned to (property-tested).
//! - [`shards`]: which shards this silo holds, decided by compare-and-set on
//!   their lease rows ([`shards::ShardMachine`]).
//! - [`handoff`]: what the holder of a shard delivers from the lease it
//!   acquired, and what its release records.
//! - [`schedule`]: when a reminder ticks next.
//! - [`machine`]: the service as a sans-io state machine
//!   ([`machine::ReminderMachine`]): loads, deliveries, notices and writes,
//!   with every queue bounded.
//!
//! The service (feature `runtime`, on by default): `Reminders::builder` starts
//! a silo's service, `Reminders` registers, lists and removes reminders, and one
//! actix actor per silo (the agent) carries the machine's actions out and
//! decides nothing. Ticks go to the recipients a `ReminderTarget` resolves.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

#[cfg(feature = "runtime")]
mod agent;
mod api;
pub mod handoff;
pub mod machine;
mod queue;
pub mod schedule;
#[cfg(feature = "runtime")]
mod service;
pub mod shards;
#[cfg(feature = "sim")]
pub mod sim;

#[cfg(feature = "runtime")]
pub use api::ReminderTarget;
pub use api::{
    Lateness, Owner, ReminderError, ReminderHandle, ReminderList, ReminderSpec, ReminderStats, ReminderTick,
    LATE_TICK, MAX_NAME, MAX_REPEAT, TICKS_DROPPED_METRIC,
};
pub use machine::{
    LOAD_PIECE_ROWS, MAX_DELIVERIES, MAX_LOADS, MAX_NOTICE_READS, MAX_WRITES, NOTICE_BATCH, NOTICE_QUEUE,
};
/// Placement, re-exported from the ownership layer
/// ([`rollcall_core::ownership::host`]).
pub use rollcall_core::ownership::host;
/// The ring, re-exported from the ownership layer
/// ([`rollcall_core::ownership::ring`]).
pub use rollcall_core::ownership::ring;
#[cfg(feature = "runtime")]
pub use rollcall_core::ownership::{ActorHost, Deactivate, HostEvent, ShardOwnership, DEACTIVATE_TIMEOUT};
pub use rollcall_core::ownership::{
    ActorId, Held, HeldMap, InvalidActorId, MonotonicDeadlines, MAX_ACTOR_ID,
};
pub use rollcall_core::ownership::{Deactivation, HeldChange, HostError, HostTable};
pub use rollcall_core::{
    MissedTickPolicy, PageToken, ReminderEntry, ReminderOptions, ReminderTable, Removed, RetryPolicy,
    RunOutcome, RunRecord, MAX_REMINDER_PAYLOAD,
};
pub use schedule::{Calendar, ScheduleError};
#[cfg(feature = "runtime")]
pub use service::{
    set_paused, tell_holder, tell_shard_holders, trigger_row, Reminders, RemindersBuilder, Told, ToldShards,
};
