//! # rollcall-reminders
//!
//! The reminder service (ring ownership, loading, scheduling and delivery of ticks to
//! actix actors). Not implemented yet: this crate only fixes its place in the
//! workspace; see `docs/ARCHITECTURE.md` for where it fits.

#![warn(missing_docs)]

pub use rollcall_membership_core::{ReminderEntry, ReminderOptions, ReminderTable};
