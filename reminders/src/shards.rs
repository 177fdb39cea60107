//! The shard lease rules, re-exported from the ownership layer
//! ([`rollcall_core::ownership::machine`], where they are documented): the
//! reminder service drives [`ShardMachine`] and is the tenant behind its
//! `Load`, `Stop` and `Checkpoint` actions.

pub use rollcall_core::ownership::machine::*;
pub use rollcall_core::ownership::{shard_owner, shard_range};

/// [`WriteFailed`] from a reminder call's error: a store error that is not
/// transient is [`Refused`](WriteFailed::Refused), anything else (a
/// timeout included) [`Unknown`](WriteFailed::Unknown).
pub fn write_failed(e: &crate::ReminderError) -> WriteFailed {
    match e {
        crate::ReminderError::Table(t) => WriteFailed::of(t),
        _ => WriteFailed::Unknown(e.to_string()),
    }
}
