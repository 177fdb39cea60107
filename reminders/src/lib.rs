//! # rollcall-reminders
//!
//! Durable reminders for actix applications, after Orleans' reminder service:
//! periodic (or one-shot) ticks stored in a reminder table, owned by silos through
//! a consistent-hash ring over the Active silos of the membership, delivered to
//! actix actors, and taken over by a live silo when their owner dies.
//!
//! - [`Reminders::builder`] starts a silo's service; [`Reminders`] registers, lists
//!   and removes reminders.
//! - [`ring`]: which silo owns which hash range (pure, property-tested).
//! - [`schedule`]: when a reminder ticks next (pure).
//! - [`handoff`]: how a range changes hands on a leave or a join without a tick
//!   repeated or lost: releases, holds, requests (pure).
//! - [`machine`]: the service's rules as a sans-io state machine
//!   ([`machine::ReminderMachine`]): it loads the owned ranges at start, on every
//!   ring change and every `refresh_reminder_list_period`, keeps the reminders due
//!   within `loading_window` in memory ordered by due time, and delivers ticks to
//!   the [`ReminderTarget`]'s recipients while the silo is Active. One actix actor
//!   per silo (the agent) carries its actions out and decides nothing.

#![warn(missing_docs)]

mod agent;
mod api;
pub mod handoff;
pub mod machine;
mod queue;
pub mod ring;
pub mod schedule;
mod send;
mod service;
pub mod shards;
#[cfg(feature = "sim")]
pub mod sim;

pub use api::{
    ActorId, ReminderError, ReminderHandle, ReminderSpec, ReminderStats, ReminderTarget, ReminderTick,
    LATE_TICK, MAX_ACTOR_ID, MAX_NAME,
};
pub use machine::{
    LOAD_PIECE_ROWS, MAX_DELIVERIES, MAX_NOTICE_READS, MAX_WRITES, NOTICE_BATCH, NOTICE_QUEUE,
};
pub use rollcall_membership_core::{MissedTickPolicy, ReminderEntry, ReminderOptions, ReminderTable};
pub use service::{Reminders, RemindersBuilder};
