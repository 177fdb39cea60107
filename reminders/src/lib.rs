//! # rollcall-reminders
//!
//! The reminder service (ring ownership, loading, scheduling and delivery of ticks to
//! actix actors). Not implemented yet: this crate only fixes its place in the
//! workspace; see `shared/design/REMINDERS.md` for the semantics it will implement.

#![warn(missing_docs)]

pub use rollcall_membership_core::{ReminderEntry, ReminderOptions, ReminderTable};
