//! Actor state: Orleans' grain-state table (`OrleansGrainState`: one row per
//! actor and state name, the serialized state, an etag for optimistic
//! concurrency), with an envelope that makes a corrupt record an error and chunks
//! that let a state outgrow one backend request.
//!
//! Three layers:
//!
//! - [`StateTable`]: what a provider implements, once: a header row per state
//!   (the envelope, the concurrency fence) and chunk rows under a generation id,
//!   one conditional [`commit`](StateTable::commit) that compares every header's
//!   etag and writes headers and inline chunks in **one** backend transaction.
//! - The rules, sans-io: [`StateHeader`] (the envelope: format, codec, length,
//!   checksum, generation, chunk count, expiry), [`WriteMachine`] (events in,
//!   actions out: stage chunks, commit, sweep the replaced generation) and the read
//!   check [`assemble`].
//! - [`StateStorage`]: carries the machine's actions out against a table: `read`,
//!   `write`, `clear`, `write_many`, `list`, `sweep`.
//!
//! # Contract (checked by the conformance scenarios `state_table::*`)
//! - Key: service id (the table), actor id `kind/key` and state name
//!   ([`StateKey::new`] validates them).
//! - [`StateStorage::read`] returns the bytes and their etag, or
//!   [`StateRead::record_exists`] = false (never written, cleared, or expired).
//! - [`StateStorage::write`] with [`Expected::Absent`] (no header may exist: not
//!   even a tombstone), [`Expected::Etag`] (the header's etag must be this one) or
//!   [`Expected::Any`] (last writer wins, explicitly). A failed compare is
//!   [`Error::InconsistentState`] and writes nothing; nothing is retried.
//! - [`StateStorage::clear`]: [`ClearMode::Tombstone`] by default: the header is
//!   replaced by an empty, cleared one with a new etag, so a writer holding an old
//!   etag cannot recreate the state (Orleans' `DeleteStateOnClear = false`);
//!   [`ClearMode::Delete`] deletes the header conditionally, after which
//!   [`Expected::Absent`] writes again.
//! - A state larger than one transaction is written as chunks under a fresh
//!   generation first, then published by its header's conditional commit: a reader
//!   sees the old state or the new one, never a mix. The replaced generation is
//!   deleted after the commit; generations of writes that never published are
//!   removed by [`StateStorage::sweep`].
//! - An expired state (`expires_at` in the past) reads as absent and
//!   [`Expected::Absent`] writes over it.
//! - A header or chunk that does not decode or check out is [`Error::Corrupt`],
//!   never bytes handed to a deserializer.
//! - States up to the provider's [`StateLimits::max_state_bytes`] (at most
//!   [`MAX_STATE_BYTES`], 64 MiB; etcd stores 1 MiB, see its provider); larger
//!   ones are [`Error::TooLarge`] before anything is written.
//! - A commit that fails with an error may have been applied: the write reads
//!   the header to learn its outcome before it cleans up or reports a failure
//!   (see [`WriteMachine`]); when that read fails too, the write is
//!   [`Error::OutcomeUnknown`] and [`StateStorage::outcome`] tells later.
//!
//! Files: `mod.rs` holds the key, the preconditions and the contract;
//! `header.rs` the envelope; `write.rs` the [`WriteMachine`]; `storage.rs` the
//! [`StateStorage`] that carries it out; [`sweep`] the [`SweepMachine`](sweep::SweepMachine).

mod header;
mod storage;
pub mod sweep;
mod write;

pub use header::{
    assemble, checksum, generation_time, new_generation, replaced_generation, row_head_len, StateHeader,
    STATE_FORMAT,
};
pub use storage::{StateStorage, WriteOptions, READ_ATTEMPTS};
pub use sweep::sweepable;
pub use write::{layout, Layout, WriteAction, WriteEvent, WriteFailure, WriteMachine, HEADER_BYTES};

use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::{Error, Etag, Result, Timestamp};

/// The largest state any provider stores: 64 MiB (a provider may store less:
/// [`StateLimits::max_state_bytes`]).
pub const MAX_STATE_BYTES: u64 = 64 * 1024 * 1024;

/// How long a generation that was staged and never published is kept before
/// [`StateStorage::sweep`] removes it: longer than any write takes (the bound of a
/// write is its chunk batches times the table operation timeout).
pub const SWEEP_GRACE: Duration = Duration::from_secs(600);

/// The key of one stored state: (actor id, state name) in one service's table.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct StateKey {
    actor_id: String,
    name: String,
}

impl StateKey {
    /// The state `name` of actor `actor_id` (`kind/key`, as the reminder
    /// service's actor ids).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming `actor_id` or `name`: empty, longer than
    /// 1,024 bytes ([`KeyLimits::CORE`](crate::KeyLimits::CORE)), with control
    /// characters, or an actor id without a non-empty kind and key around its
    /// first `/`. A provider may store less: its
    /// [`key_limits`](crate::SystemStore::key_limits) (DynamoDB's are tighter),
    /// checked by its table before it sends anything.
    pub fn new(actor_id: impl Into<String>, name: impl Into<String>) -> Result<StateKey> {
        let (actor_id, name) = (actor_id.into(), name.into());
        for (field, v) in [("actor_id", &actor_id), ("name", &name)] {
            if v.is_empty() {
                return Err(Error::invalid_input(field, "must not be empty"));
            }
            if v.len() > 1024 {
                return Err(Error::invalid_input(field, "longer than 1024 bytes"));
            }
            if v.chars().any(char::is_control) {
                return Err(Error::invalid_input(field, "contains control characters"));
            }
        }
        match actor_id.split_once('/') {
            Some((kind, key)) if !kind.is_empty() && !key.is_empty() => {}
            _ => return Err(Error::invalid_input("actor_id", "must be `kind/key`")),
        }
        Ok(StateKey { actor_id, name })
    }

    /// The actor id, `kind/key`.
    pub fn actor_id(&self) -> &str {
        &self.actor_id
    }

    /// The actor kind (the part before the first `/`).
    pub fn kind(&self) -> &str {
        self.actor_id.split_once('/').map_or("", |(k, _)| k)
    }

    /// The state name.
    pub fn name(&self) -> &str {
        &self.name
    }
}

impl std::fmt::Display for StateKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}#{}", self.actor_id, self.name)
    }
}

/// The precondition of a write or clear.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Expected {
    /// No header may exist (a first write; a tombstone counts as existing).
    Absent,
    /// The header must have this etag.
    Etag(Etag),
    /// No precondition: last writer wins.
    Any,
}

impl Expected {
    /// From what a reader last saw: its etag, or `Absent` when it saw none.
    pub fn from_etag(etag: Option<&Etag>) -> Expected {
        etag.map_or(Expected::Absent, |e| Expected::Etag(e.clone()))
    }

    /// Whether a header with `current` etag (none: no header) passes.
    pub fn admits(&self, current: Option<&Etag>) -> bool {
        match self {
            Expected::Absent => current.is_none(),
            Expected::Etag(e) => current == Some(e),
            Expected::Any => true,
        }
    }
}

/// What [`StateStorage::clear`] leaves behind.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum ClearMode {
    /// An empty, cleared header with a new etag (the default).
    #[default]
    Tombstone,
    /// No header at all (a conditional delete).
    Delete,
}

/// How a state's bytes were serialized (the typed layer's choice; stored in the
/// envelope so a reader knows).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Codec {
    /// serde_json (self-describing; the default).
    #[default]
    Json,
    /// postcard (compact, not self-describing).
    Postcard,
    /// Bytes the caller serialized itself.
    Raw,
}

/// The size limits of one provider, bytes and rows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateLimits {
    /// Largest chunk row.
    pub chunk_bytes: usize,
    /// Largest payload of one transaction (chunks plus headers).
    pub txn_bytes: usize,
    /// Most rows one transaction writes (chunks plus headers).
    pub txn_rows: usize,
    /// Largest state, bytes (at most [`MAX_STATE_BYTES`]); a larger write is
    /// [`Error::TooLarge`] before anything is written.
    pub max_state_bytes: u64,
}

/// One header write of a [`StateTable::commit`].
#[derive(Clone, Debug)]
pub struct HeaderWrite<'a> {
    /// The state.
    pub key: &'a StateKey,
    /// The precondition on its header.
    pub expected: Expected,
    /// The new header row ([`StateHeader::encode_row`], a small state's bytes
    /// inline), or `None` to delete the header.
    pub header: Option<&'a [u8]>,
    /// The generation of the chunks below.
    pub generation: &'a str,
    /// Chunks `0..n` of `generation` written in the same transaction (empty
    /// when they were staged by [`StateTable::put_chunks`]).
    pub chunks: Vec<&'a [u8]>,
    /// Expiry of the header and chunks (UTC ms), if any.
    pub expires_at: Option<Timestamp>,
}

/// The outcome of a [`StateTable::commit`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Commit {
    /// Every write committed.
    Done {
        /// The new etag of each header (`None` where the header was deleted),
        /// in order.
        etags: Vec<Option<Etag>>,
        /// For each write, the generation whose chunk rows the header it
        /// replaced had published ([`replaced_generation`] of the old row,
        /// expired or not): no longer read, to delete. `None` where there were
        /// none. Empty when the provider cannot tell (a sweep removes them).
        replaced: Vec<Option<String>>,
    },
    /// The compare of write `index` failed (the header's etag is `current`, none:
    /// no header); nothing was written.
    Conflict {
        /// Which write.
        index: usize,
        /// The etag found.
        current: Option<Etag>,
    },
    /// The commit's [`Fence`](crate::Fence) failed: its shard's lease is not
    /// held at the fence's epoch; nothing was written. A commit that fails both
    /// its fence and a header's compare answers this.
    Fenced {
        /// The lease's fence token now: its epoch while held, `None` while
        /// released or absent.
        current: Option<u64>,
    },
}

/// The grain-state table of one service, as a provider implements it: header rows
/// and chunk rows. See the [module docs](self) for the contract; the envelope,
/// chunking and sweeping are [`StateStorage`]'s, so a provider only maps rows onto
/// its own conditional writes.
#[async_trait]
pub trait StateTable: Send + Sync + std::fmt::Debug {
    /// The service this table belongs to.
    fn service_id(&self) -> &str;

    /// The provider's size limits.
    fn limits(&self) -> StateLimits;

    /// The header of `key` and its etag; `None` if there is none or it expired.
    async fn read_header(&self, key: &StateKey) -> Result<Option<(Vec<u8>, Etag)>>;

    /// Chunks `0..count` of `generation` (`None` for a missing one).
    async fn read_chunks(&self, key: &StateKey, generation: &str, count: u32)
        -> Result<Vec<Option<Vec<u8>>>>;

    /// Writes chunks `first..first + chunks.len()` of `generation` (unconditional:
    /// nobody reads a generation before its header publishes it). At most
    /// [`StateLimits::txn_rows`] chunks and [`StateLimits::txn_bytes`] per call.
    async fn put_chunks(
        &self,
        key: &StateKey,
        generation: &str,
        first: u32,
        chunks: &[&[u8]],
        expires_at: Option<Timestamp>,
    ) -> Result<()>;

    /// Compares every write's header against its [`Expected`] and, only if all
    /// pass, writes every header and inline chunk, in one transaction. An
    /// expired header counts as absent. For one write of a header without
    /// chunk rows, this is one conditional write to the backend (no read before
    /// it), and it reports the generation the old header published
    /// ([`Commit::Done::replaced`]).
    ///
    /// With a `fence`, the same transaction also compares the fence token
    /// stored beside the lease row of `fence.shard` of this table's service
    /// ([`fence_token`](crate::lease::fence_token)) with `fence.epoch`, and
    /// answers [`Commit::Fenced`] without writing anything when they differ
    /// (or no lease row exists). The caller checked that the fence names this
    /// table's service and covers every write's actor.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] when the provider cannot place the fence's lease
    /// in the commit's transaction (Redis Cluster: see its provider); a
    /// backend error (the commit may have landed).
    async fn commit(&self, writes: &[HeaderWrite<'_>], fence: Option<&crate::Fence>) -> Result<Commit>;

    /// Every generation with chunks stored for `key`.
    async fn generations(&self, key: &StateKey) -> Result<Vec<String>>;

    /// Deletes every chunk of `generation` of `key`.
    async fn delete_generation(&self, key: &StateKey, generation: &str) -> Result<()>;

    /// Up to `limit` keys of actor kind `kind` with a header, in key order, after
    /// `after` (a page's last key). May include expired or cleared states.
    async fn list(&self, kind: &str, after: Option<&StateKey>, limit: usize) -> Result<Vec<StateKey>>;
}

/// What a read found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct StateRead {
    /// The state's bytes (empty when it does not exist).
    pub data: Vec<u8>,
    /// How they were serialized.
    pub codec: Codec,
    /// The header's etag: the one to write with. `None`: no header (a first
    /// write expects [`Expected::Absent`]); `Some` with `record_exists` false: a
    /// tombstone.
    pub etag: Option<Etag>,
    /// Whether a state is stored (not cleared, not expired).
    pub record_exists: bool,
    /// The version of the type that wrote it ([`WriteOptions::version`]).
    pub version: u32,
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    pub(crate) fn key() -> StateKey {
        StateKey::new("cart/1", "state").unwrap()
    }

    pub(crate) const LIMITS: StateLimits = StateLimits {
        chunk_bytes: 10,
        txn_bytes: 1000,
        txn_rows: 4,
        max_state_bytes: MAX_STATE_BYTES,
    };

    #[test]
    fn keys_are_validated() {
        assert!(StateKey::new("cart/1", "s").is_ok());
        for (a, n) in [
            ("", "s"),
            ("cart", "s"),
            ("/1", "s"),
            ("cart/", "s"),
            ("cart/1", ""),
            ("cart/\n", "s"),
        ] {
            assert!(
                matches!(StateKey::new(a, n), Err(Error::InvalidInput { .. })),
                "{a:?} {n:?}"
            );
        }
        assert_eq!(key().kind(), "cart");
    }
}
