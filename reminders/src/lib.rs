//! # rollcall-reminders
//!
//! Durable reminders for actix applications, after Orleans' reminder service:
//! periodic, calendar (cron in a time zone) or one-shot ticks, optionally with a
//! payload and an end, stored in a reminder table, owned by silos through
//! a consistent-hash ring over the Active silos of the membership, delivered to
//! actix actors, and taken over by a live silo when their owner dies.
//!
//! - [`Reminders::builder`] starts a silo's service; [`Reminders`] registers, lists
//!   and removes reminders.
//! - [`ring`]: which silo owns which hash range (pure, property-tested).
//! - [`schedule`]: when a reminder ticks next (pure).
//! - [`shards`]: which silo delivers which shard of a service, decided by
//!   fenced leases in the store (pure rules, [`shards::ShardMachine`]).
//! - [`machine`]: the service's rules as a sans-io state machine
//!   ([`machine::ReminderMachine`]): it loads each shard it acquires, plans its
//!   reminders from the shard's lease, keeps them in memory ordered by due
//!   time, delivers ticks to the [`ReminderTarget`]'s recipients while the silo
//!   is Active and holds the shard, and records on release what it did not
//!   deliver. One actix actor per silo (the agent) carries its actions out and
//!   decides nothing.
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

#[cfg(feature = "runtime")]
mod agent;
mod api;
pub mod handoff;
pub mod machine;
mod queue;
pub mod ring;
pub mod schedule;
#[cfg(feature = "runtime")]
mod service;
pub mod shards;
#[cfg(feature = "sim")]
pub mod sim;

#[cfg(feature = "runtime")]
pub use api::ReminderTarget;
pub use api::{
    ActorId, ReminderError, ReminderHandle, ReminderSpec, ReminderStats, ReminderTick, LATE_TICK,
    MAX_ACTOR_ID, MAX_NAME, MAX_REPEAT, TICKS_DROPPED_METRIC,
};
pub use machine::{
    LOAD_PIECE_ROWS, MAX_DELIVERIES, MAX_LOADS, MAX_NOTICE_READS, MAX_WRITES, NOTICE_BATCH, NOTICE_QUEUE,
};
pub use rollcall_core::{
    MissedTickPolicy, ReminderEntry, ReminderOptions, ReminderTable, RetryPolicy, MAX_REMINDER_PAYLOAD,
};
pub use schedule::{Calendar, ScheduleError};
#[cfg(feature = "runtime")]
pub use service::{Reminders, RemindersBuilder};
