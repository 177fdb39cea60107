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

use std::ops::Range;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::{Clock, Error, Etag, Result, SystemClock, Timestamp};

/// The largest state any provider stores: 64 MiB (a provider may store less:
/// [`StateLimits::max_state_bytes`]).
pub const MAX_STATE_BYTES: u64 = 64 * 1024 * 1024;

/// The envelope format written by this version: 2, a header row that may carry
/// a small state inline ([`StateHeader::encode_row`]). Format 1 (a JSON header
/// alone, the bytes always in chunk rows) is still read.
pub const STATE_FORMAT: u32 = 2;

/// The first bytes of a format-2 header row.
const ROW_MAGIC: &[u8; 4] = b"RCS2";

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
    /// [`Error::InvalidConfig`] naming `actor_id` or `name`: empty, longer than
    /// 1,024 bytes, with control characters, or an actor id without a non-empty
    /// kind and key around its first `/`.
    pub fn new(actor_id: impl Into<String>, name: impl Into<String>) -> Result<StateKey> {
        let (actor_id, name) = (actor_id.into(), name.into());
        for (field, v) in [("actor_id", &actor_id), ("name", &name)] {
            if v.is_empty() {
                return Err(Error::invalid_config(field, "must not be empty"));
            }
            if v.len() > 1024 {
                return Err(Error::invalid_config(field, "longer than 1024 bytes"));
            }
            if v.chars().any(char::is_control) {
                return Err(Error::invalid_config(field, "contains control characters"));
            }
        }
        match actor_id.split_once('/') {
            Some((kind, key)) if !kind.is_empty() && !key.is_empty() => {}
            _ => return Err(Error::invalid_config("actor_id", "must be `kind/key`")),
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

/// The envelope: the header row of a stored state.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateHeader {
    /// Envelope format ([`STATE_FORMAT`]).
    pub format: u32,
    /// How the bytes were serialized.
    pub codec: Codec,
    /// Length of the state, bytes.
    pub len: u64,
    /// xxHash3-64 of the state's bytes, hex.
    pub checksum: String,
    /// The generation whose chunks hold the bytes.
    pub generation: String,
    /// How many chunks.
    pub chunks: u32,
    /// When the state expires (UTC ms), if ever.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub expires_at: Option<Timestamp>,
    /// A tombstone left by a clear: no state.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cleared: bool,
    /// The bytes follow the header in its own row (no chunk rows).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub inline: bool,
    /// The version of the type that wrote the state (the typed layer's
    /// `with_version`; 0 when it does not say).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub version: u32,
}

fn is_zero(v: &u32) -> bool {
    *v == 0
}

/// How a [`StateStorage::write_with`] stores a state, beyond its bytes.
#[derive(Clone, Debug, Default)]
pub struct WriteOptions<'a> {
    /// When the state expires (UTC ms), if ever.
    pub expires_at: Option<Timestamp>,
    /// The version of the type that wrote it (read back as
    /// [`StateRead::version`]).
    pub version: u32,
    /// The generation id to write under (a fresh one when `None`).
    pub generation: Option<&'a str>,
}

impl StateHeader {
    /// The header of `data` stored under `generation` in `chunks` chunks.
    pub fn of(
        data: &[u8],
        codec: Codec,
        generation: String,
        chunks: u32,
        expires_at: Option<Timestamp>,
    ) -> Self {
        StateHeader {
            format: STATE_FORMAT,
            codec,
            len: data.len() as u64,
            checksum: checksum(data),
            generation,
            chunks,
            expires_at,
            cleared: false,
            inline: false,
            version: 0,
        }
    }

    /// A tombstone under `generation` (no chunks).
    pub fn tombstone(generation: String) -> Self {
        StateHeader {
            cleared: true,
            ..StateHeader::of(&[], Codec::Raw, generation, 0, None)
        }
    }

    /// The header row as stored: `RCS2`, the JSON header's length (u32, big
    /// endian), the JSON header, then `inline` (the state's bytes when
    /// [`inline`](Self::inline), else empty).
    pub fn encode_row(&self, inline: &[u8]) -> Vec<u8> {
        let json = serde_json::to_vec(self).unwrap_or_default();
        let mut row = Vec::with_capacity(8 + json.len() + inline.len());
        row.extend_from_slice(ROW_MAGIC);
        row.extend_from_slice(&(json.len() as u32).to_be_bytes());
        row.extend_from_slice(&json);
        row.extend_from_slice(inline);
        row
    }

    /// A stored header row: the header and the bytes after it (empty unless
    /// the state is inline). Reads format 1 (a JSON header alone) and 2.
    ///
    /// # Errors
    /// [`Error::Corrupt`] (naming `key`) for bytes that are not a header of a
    /// format this version reads.
    pub fn decode_row<'a>(key: &StateKey, bytes: &'a [u8]) -> Result<(StateHeader, &'a [u8])> {
        let (json, rest) =
            split_row(bytes).ok_or_else(|| Error::corrupt(key.to_string(), "header: not a header row"))?;
        let h: StateHeader = serde_json::from_slice(json)
            .map_err(|e| Error::corrupt(key.to_string(), format!("header: {e}")))?;
        if !(1..=STATE_FORMAT).contains(&h.format) {
            return Err(Error::corrupt(
                key.to_string(),
                format!(
                    "header format {} (this version reads 1 to {STATE_FORMAT}: written by a newer version?)",
                    h.format
                ),
            ));
        }
        Ok((h, rest))
    }

    /// A stored header ([`decode_row`](Self::decode_row) without the bytes).
    ///
    /// # Errors
    /// As [`decode_row`](Self::decode_row).
    pub fn decode(key: &StateKey, bytes: &[u8]) -> Result<StateHeader> {
        Self::decode_row(key, bytes).map(|(h, _)| h)
    }

    /// Whether the state has expired at `now`.
    pub fn expired(&self, now: Timestamp) -> bool {
        self.expires_at.is_some_and(|t| t <= now)
    }
}

/// A header row's JSON header and the bytes after it: format 2's frame, or a
/// format-1 row (JSON alone).
fn split_row(bytes: &[u8]) -> Option<(&[u8], &[u8])> {
    if bytes.first() == Some(&b'{') {
        return Some((bytes, &[]));
    }
    let rest = bytes.strip_prefix(ROW_MAGIC.as_slice())?;
    let (len, rest) = rest.split_first_chunk::<4>()?;
    let len = u32::from_be_bytes(*len) as usize;
    (rest.len() >= len).then(|| rest.split_at(len))
}

/// How many leading bytes of a header row are its frame and JSON header (the
/// rest is a small state's bytes): a provider may store the two apart, so that
/// a commit reads back only the head of the row it replaces. The whole row for
/// format 1 and for bytes that are not a header row.
pub fn row_head_len(row: &[u8]) -> usize {
    match split_row(row) {
        Some((json, _)) if row.first() != Some(&b'{') => ROW_MAGIC.len() + 4 + json.len(),
        _ => row.len(),
    }
}

/// The generation whose chunk rows a replaced header row published (`None`
/// for an inline state, a tombstone, or bytes that are not a header): what a
/// commit's [`Commit::Done::replaced`] holds. Reads only the frame and the JSON
/// header, so a provider may pass the row's head alone ([`row_head_len`]).
pub fn replaced_generation(row: &[u8]) -> Option<String> {
    let (json, _) = split_row(row)?;
    let h: StateHeader = serde_json::from_slice(json).ok()?;
    (h.chunks > 0).then_some(h.generation)
}

/// The checksum of a state's bytes (xxHash3-64, hex).
pub fn checksum(data: &[u8]) -> String {
    format!("{:016x}", xxhash_rust::xxh3::xxh3_64(data))
}

/// A fresh generation id: the time (ms, 13 digits, so ids sort by time) and 32
/// random bits.
pub fn new_generation(now: Timestamp) -> String {
    format!("{:013}-{:08x}", now.as_millis(), rand::random::<u32>())
}

/// The time a generation id was made (ms), if it is one.
pub fn generation_time(generation: &str) -> Option<u64> {
    generation.split_once('-').and_then(|(ms, _)| ms.parse().ok())
}

/// The bytes of a state from its header and chunks, checked: every chunk
/// present, the length and the checksum right.
///
/// # Errors
/// [`Error::Corrupt`] naming `key` and what does not check out.
pub fn assemble(key: &StateKey, header: &StateHeader, chunks: Vec<Option<Vec<u8>>>) -> Result<Vec<u8>> {
    let mut data = Vec::with_capacity(header.len.min(MAX_STATE_BYTES) as usize);
    for (i, c) in chunks.into_iter().enumerate() {
        match c {
            Some(c) => data.extend_from_slice(&c),
            None => {
                return Err(Error::corrupt(
                    key.to_string(),
                    format!("chunk {i} of generation {} is missing", header.generation),
                ))
            }
        }
    }
    verify(key, header, &data)?;
    Ok(data)
}

/// The length and checksum of `data` against `header`.
fn verify(key: &StateKey, header: &StateHeader, data: &[u8]) -> Result<()> {
    if data.len() as u64 != header.len {
        return Err(Error::corrupt(
            key.to_string(),
            format!("{} bytes stored, the header says {}", data.len(), header.len),
        ));
    }
    if checksum(data) != header.checksum {
        return Err(Error::corrupt(key.to_string(), "checksum mismatch"));
    }
    Ok(())
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
    async fn commit(&self, writes: &[HeaderWrite<'_>]) -> Result<Commit>;

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

/// A step of a write, decided by [`WriteMachine`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteAction {
    /// Stage chunks `range` of the new generation.
    PutChunks(Range<usize>),
    /// Commit the header, with chunk rows `range` in the same transaction
    /// (empty for an inline state, whose bytes are in the header row, and for
    /// staged chunks).
    Commit(Range<usize>),
    /// The commit failed and may have been applied: read the header to learn
    /// whether it publishes this write's generation
    /// ([`WriteEvent::Resolved`]).
    Resolve,
    /// Delete this generation (the replaced one, or the new one after a failure).
    DeleteGeneration(String),
    /// The write is over.
    Finish(std::result::Result<Option<Etag>, WriteFailure>),
}

/// Why a write failed, as the machine sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteFailure {
    /// The precondition failed (the etag found).
    Conflict(Option<Etag>),
    /// A table call failed and nothing was written (the caller keeps its error).
    Failed,
    /// The commit failed, and so did the read that would have told whether it
    /// was applied: the staged chunks are kept (a sweep removes them if they were
    /// not published).
    Unknown,
}

/// What happened to the last action.
#[derive(Clone, Debug)]
pub enum WriteEvent {
    /// Start.
    Start,
    /// A [`WriteAction::PutChunks`] succeeded.
    ChunksPut,
    /// The commit's outcome (the etag of the header written, the generation it
    /// replaced).
    Committed(Commit),
    /// The header read by [`WriteAction::Resolve`]: its generation and etag, if
    /// there is one.
    Resolved(Option<(String, Etag)>),
    /// A [`WriteAction::DeleteGeneration`] finished (ok or not: garbage only).
    Deleted,
    /// A table call failed (a commit that failed this way may have landed).
    Failed,
    /// A table call was refused before it reached the store (invalid input, an
    /// unsupported operation: an error that is not transient): nothing was
    /// written.
    Rejected,
    /// The commit failed in a way no read can decide, reported by the provider as
    /// [`Error::OutcomeUnknown`]: e.g. applied on a Redis primary that fewer
    /// replicas acknowledged than `wait_replicas` asks for, so a read now would
    /// find it although a failover may still lose it. The write ends
    /// [`WriteFailure::Unknown`], chunks kept.
    Undecidable,
}

/// Where a [`WriteMachine`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Staging,
    Committing,
    Resolving,
    Cleaning,
}

/// Where a state's bytes go, decided by its size against the provider's
/// [`StateLimits`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// In the header row itself (at most one chunk's size): one conditional
    /// write, no chunk rows.
    Row,
    /// Chunk rows written in the header's transaction.
    Txn,
    /// Chunk rows staged in batches first, then published by the header.
    Staged,
}

/// The rules of one write (sans-io). A small state goes in its header row: the
/// write is one conditional write (no read before it, nothing to delete after
/// it unless the state it replaced had chunk rows). A larger one is chunked:
/// in the header's transaction when it fits one, else staged in batches first.
/// After the commit, the generation it replaced is deleted (the commit names
/// it); after a conflict or a failure that certainly wrote nothing, the staged
/// one.
///
/// A commit that fails with an error may still have been applied (a timeout, a
/// connection lost after the request was sent: Jepsen's "indeterminate"
/// operations). The machine then reads the header again ([`WriteAction::Resolve`]):
/// if it names this write's generation the write landed and succeeds with that
/// etag; if it names another (or none) it did not, and the staged chunks are
/// deleted; if that read fails too, the write fails with
/// [`WriteFailure::Unknown`] and deletes nothing.
#[derive(Debug)]
pub struct WriteMachine {
    limits: StateLimits,
    /// Byte ranges of the chunk rows (none for [`Layout::Row`]).
    chunks: Vec<Range<usize>>,
    generation: String,
    layout: Layout,
    phase: Phase,
    /// Chunks staged so far.
    staged: usize,
    batch: Range<usize>,
    replaced: Option<String>,
    outcome: Option<std::result::Result<Option<Etag>, WriteFailure>>,
}

/// What a header adds to its transaction besides the chunks, bytes (an upper
/// estimate: the envelope's JSON and the provider's key and attributes).
pub const HEADER_BYTES: usize = 512;

/// Where `len` bytes go on a provider with `limits`.
pub fn layout(len: usize, limits: StateLimits) -> Layout {
    let chunks = len.div_ceil(limits.chunk_bytes.max(1));
    if len <= limits.chunk_bytes && len + HEADER_BYTES <= limits.txn_bytes {
        Layout::Row
    } else if chunks < limits.txn_rows && len + HEADER_BYTES <= limits.txn_bytes {
        Layout::Txn
    } else {
        Layout::Staged
    }
}

impl WriteMachine {
    /// A write of `len` bytes under `generation`.
    ///
    /// # Errors
    /// [`Error::TooLarge`] over the provider's [`StateLimits::max_state_bytes`].
    pub fn new(key: &StateKey, len: usize, generation: String, limits: StateLimits) -> Result<WriteMachine> {
        if len as u64 > limits.max_state_bytes {
            return Err(Error::TooLarge {
                key: key.to_string(),
                size: len as u64,
                max: limits.max_state_bytes,
            });
        }
        let layout = layout(len, limits);
        let step = limits.chunk_bytes.max(1);
        let chunks: Vec<Range<usize>> = match layout {
            Layout::Row => Vec::new(),
            Layout::Txn | Layout::Staged => (0..len).step_by(step).map(|a| a..(a + step).min(len)).collect(),
        };
        Ok(WriteMachine {
            limits,
            chunks,
            generation,
            layout,
            phase: Phase::Staging,
            staged: 0,
            batch: 0..0,
            replaced: None,
            outcome: None,
        })
    }

    /// The chunk rows' byte ranges (none when the bytes go in the header row).
    pub fn chunk_ranges(&self) -> &[Range<usize>] {
        &self.chunks
    }

    /// Where the bytes go.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The new generation.
    pub fn generation(&self) -> &str {
        &self.generation
    }

    fn next_batch(&self) -> Range<usize> {
        let mut end = self.staged;
        let mut bytes = 0;
        while end < self.chunks.len() && end - self.staged < self.limits.txn_rows.max(1) {
            let b = self.chunks[end].len();
            if end > self.staged && bytes + b > self.limits.txn_bytes {
                break;
            }
            bytes += b;
            end += 1;
        }
        self.staged..end
    }

    /// The next action after `event`.
    pub fn handle(&mut self, event: WriteEvent) -> WriteAction {
        match event {
            WriteEvent::Start => self.stage_or_commit(),
            WriteEvent::ChunksPut => {
                self.staged = self.batch.end;
                self.stage_or_commit()
            }
            WriteEvent::Committed(Commit::Done { etags, replaced }) => {
                self.replaced = replaced
                    .into_iter()
                    .next()
                    .flatten()
                    .filter(|g| *g != self.generation);
                self.succeed(etags.into_iter().next().flatten())
            }
            WriteEvent::Committed(Commit::Conflict { current, .. }) => {
                self.fail(WriteFailure::Conflict(current))
            }
            WriteEvent::Resolved(Some((g, etag))) if g == self.generation => self.succeed(Some(etag)),
            WriteEvent::Resolved(_) | WriteEvent::Rejected => self.fail(WriteFailure::Failed),
            WriteEvent::Undecidable => {
                // No read can tell whether it lasts: keep the chunks, report it unknown.
                self.outcome = Some(Err(WriteFailure::Unknown));
                self.finish()
            }
            WriteEvent::Failed => match self.phase {
                Phase::Committing => {
                    self.phase = Phase::Resolving;
                    WriteAction::Resolve
                }
                Phase::Resolving => {
                    // Nobody knows whether the chunks are published: keep them.
                    self.outcome = Some(Err(WriteFailure::Unknown));
                    self.finish()
                }
                _ => self.fail(WriteFailure::Failed),
            },
            WriteEvent::Deleted => self.finish(),
        }
    }

    fn stage_or_commit(&mut self) -> WriteAction {
        if self.layout == Layout::Staged && self.staged < self.chunks.len() {
            self.phase = Phase::Staging;
            self.batch = self.next_batch();
            return WriteAction::PutChunks(self.batch.clone());
        }
        self.phase = Phase::Committing;
        match self.layout {
            Layout::Txn => WriteAction::Commit(0..self.chunks.len()),
            Layout::Row | Layout::Staged => WriteAction::Commit(0..0),
        }
    }

    fn succeed(&mut self, etag: Option<Etag>) -> WriteAction {
        self.outcome = Some(Ok(etag));
        match self.replaced.take() {
            Some(g) => {
                self.phase = Phase::Cleaning;
                WriteAction::DeleteGeneration(g)
            }
            None => self.finish(),
        }
    }

    fn fail(&mut self, why: WriteFailure) -> WriteAction {
        self.outcome = Some(Err(why));
        self.replaced = None;
        if self.layout == Layout::Staged && self.staged + self.batch.len() > 0 {
            // Staged chunks nobody will publish.
            self.staged = 0;
            self.batch = 0..0;
            self.phase = Phase::Cleaning;
            return WriteAction::DeleteGeneration(self.generation.clone());
        }
        self.finish()
    }

    fn finish(&mut self) -> WriteAction {
        WriteAction::Finish(self.outcome.take().unwrap_or(Err(WriteFailure::Failed)))
    }
}

/// The generations of a key that a sweep removes: not `published`, and made
/// before `now - grace` (a write still staging is younger).
pub fn sweepable(
    generations: &[String],
    published: Option<&str>,
    now: Timestamp,
    grace: Duration,
) -> Vec<String> {
    let before = now.as_millis().saturating_sub(grace.as_millis() as u64);
    generations
        .iter()
        .filter(|g| Some(g.as_str()) != published)
        .filter(|g| generation_time(g).is_none_or(|t| t < before))
        .cloned()
        .collect()
}

/// How many times a read starts again when its chunks changed under it (a write
/// replaced the generation between the header and the chunks). Under heavy
/// contention every attempt can lose that race: the read then fails with a
/// transient [`Error::Backend`], never [`Error::Corrupt`].
pub const READ_ATTEMPTS: usize = 10;

/// Reads and writes states through a [`StateTable`]: the envelope, chunking,
/// generations and sweeping, the same on every provider. Cheap to clone.
///
/// Every call makes a bounded number of table calls (a write: one header read,
/// `ceil(chunks / txn_rows)` staging calls when staged, one commit, one delete; a
/// read: at most [`READ_ATTEMPTS`] x 3), so it answers within that many table
/// operation timeouts (the typed layer bounds each call).
#[derive(Clone, Debug)]
pub struct StateStorage {
    table: Arc<dyn StateTable>,
    clock: Arc<dyn Clock>,
}

impl StateStorage {
    /// Storage over `table`, on the system clock.
    pub fn new(table: Arc<dyn StateTable>) -> StateStorage {
        StateStorage::with_clock(table, Arc::new(SystemClock))
    }

    /// Storage over `table` on `clock` (expiry and generation ids).
    pub fn with_clock(table: Arc<dyn StateTable>, clock: Arc<dyn Clock>) -> StateStorage {
        StateStorage { table, clock }
    }

    /// The table.
    pub fn table(&self) -> &Arc<dyn StateTable> {
        &self.table
    }

    /// The stored state of `key`.
    ///
    /// # Errors
    /// [`Error::Corrupt`] for a header or chunks that do not check out (after
    /// [`READ_ATTEMPTS`] reads when a concurrent write could explain it);
    /// [`Error::Backend`] if the backend fails.
    pub async fn read(&self, key: &StateKey) -> Result<StateRead> {
        for _ in 0..READ_ATTEMPTS {
            let Some((row, etag)) = self.table.read_header(key).await? else {
                return Ok(StateRead::default());
            };
            let (header, inline) = StateHeader::decode_row(key, &row)?;
            if header.cleared || header.expired(self.clock.now()) {
                return Ok(StateRead {
                    etag: (!header.expired(self.clock.now())).then_some(etag),
                    ..StateRead::default()
                });
            }
            if header.inline {
                // One read: the bytes are in the header row.
                verify(key, &header, inline)?;
                let data = inline.to_vec();
                return Ok(StateRead {
                    data,
                    codec: header.codec,
                    etag: Some(etag),
                    record_exists: true,
                    version: header.version,
                });
            }
            let chunks = self
                .table
                .read_chunks(key, &header.generation, header.chunks)
                .await?;
            match assemble(key, &header, chunks) {
                Ok(data) => {
                    return Ok(StateRead {
                        data,
                        codec: header.codec,
                        etag: Some(etag),
                        record_exists: true,
                        version: header.version,
                    })
                }
                Err(e) => {
                    // A write that replaced the generation meanwhile explains it:
                    // read again; the same header twice does not.
                    let now = self.table.read_header(key).await?;
                    if now.as_ref().map(|(_, e)| e) == Some(&etag) {
                        return Err(e);
                    }
                }
            }
        }
        Err(Error::backend(format!(
            "state {key} was replaced under each of {READ_ATTEMPTS} reads; try again"
        )))
    }

    /// Writes `data` (serialized with `codec`) as the state of `key` if its
    /// header passes `expected`; returns the new etag.
    ///
    /// # Errors
    /// [`Error::InconsistentState`] when the precondition fails (nothing
    /// written); [`Error::TooLarge`] over the provider's
    /// [`StateLimits::max_state_bytes`] (nothing written); [`Error::Backend`] if
    /// the backend fails and the write certainly did not land (the old state
    /// stays readable); [`Error::OutcomeUnknown`] if the commit failed and the
    /// read that would have told whether it landed failed too.
    pub async fn write(
        &self,
        key: &StateKey,
        expected: Expected,
        codec: Codec,
        data: &[u8],
        expires_at: Option<Timestamp>,
    ) -> Result<Etag> {
        let options = WriteOptions {
            expires_at,
            ..WriteOptions::default()
        };
        self.write_with(key, expected, codec, data, options).await
    }

    /// A fresh generation id for [`WriteOptions::generation`].
    ///
    /// The id starts with the writer's clock (ms), which only orders
    /// generations for the sweep's grace period; a sweep never removes the
    /// published generation, whatever the clocks say.
    pub fn new_generation(&self) -> String {
        new_generation(self.clock.now())
    }

    /// [`write`](Self::write) with [`WriteOptions`]: the version of the type
    /// that wrote it, and a generation id the caller chose
    /// ([`new_generation`](Self::new_generation)), so that it can learn the
    /// outcome of a write it gave up on (a timeout) with
    /// [`outcome`](Self::outcome).
    ///
    /// # Errors
    /// As [`write`](Self::write).
    pub async fn write_with(
        &self,
        key: &StateKey,
        expected: Expected,
        codec: Codec,
        data: &[u8],
        options: WriteOptions<'_>,
    ) -> Result<Etag> {
        let expires_at = options.expires_at;
        let generation = options
            .generation
            .map_or_else(|| self.new_generation(), str::to_owned);
        let mut m = WriteMachine::new(key, data.len(), generation.clone(), self.table.limits())?;
        let ranges = m.chunk_ranges().to_vec();
        let header = header_row(
            data,
            codec,
            &generation,
            m.layout(),
            ranges.len(),
            expires_at,
            options.version,
        );
        let mut errors: Vec<Error> = Vec::new();
        let mut action = m.handle(WriteEvent::Start);
        loop {
            let event = match action {
                WriteAction::PutChunks(r) => {
                    let chunks: Vec<&[u8]> = ranges[r.clone()].iter().map(|b| &data[b.clone()]).collect();
                    match self
                        .table
                        .put_chunks(key, &generation, r.start as u32, &chunks, expires_at)
                        .await
                    {
                        Ok(()) => WriteEvent::ChunksPut,
                        Err(e) => {
                            errors.push(e);
                            WriteEvent::Failed
                        }
                    }
                }
                WriteAction::Commit(r) => {
                    let w = HeaderWrite {
                        key,
                        expected: expected.clone(),
                        header: Some(&header),
                        generation: &generation,
                        chunks: ranges[r].iter().map(|b| &data[b.clone()]).collect(),
                        expires_at,
                    };
                    match self.table.commit(std::slice::from_ref(&w)).await {
                        Ok(c) => WriteEvent::Committed(c),
                        Err(e) => {
                            let transient = e.is_transient();
                            let undecidable = matches!(e, Error::OutcomeUnknown { .. });
                            errors.push(e);
                            if undecidable {
                                WriteEvent::Undecidable
                            } else if transient {
                                WriteEvent::Failed
                            } else {
                                WriteEvent::Rejected
                            }
                        }
                    }
                }
                WriteAction::Resolve => match self.table.read_header(key).await {
                    Ok(h) => WriteEvent::Resolved(h.and_then(|(b, etag)| {
                        StateHeader::decode(key, &b).ok().map(|h| (h.generation, etag))
                    })),
                    Err(e) => {
                        errors.push(e);
                        WriteEvent::Failed
                    }
                },
                WriteAction::DeleteGeneration(g) => {
                    if let Err(e) = self.table.delete_generation(key, &g).await {
                        tracing::debug!(key = %key, generation = %g, error = %e, "deleting a generation failed; a sweep removes it");
                    }
                    WriteEvent::Deleted
                }
                WriteAction::Finish(r) => {
                    return match r {
                        Ok(Some(etag)) => Ok(etag),
                        Ok(None) => Err(Error::backend("the commit returned no etag")),
                        Err(WriteFailure::Conflict(current)) => Err(Error::InconsistentState {
                            key: key.to_string(),
                            expected: expected_etag(&expected),
                            current,
                        }),
                        Err(WriteFailure::Failed) => Err(errors
                            .into_iter()
                            .next()
                            .unwrap_or_else(|| Error::backend("state write failed"))),
                        Err(WriteFailure::Unknown) => Err(Error::OutcomeUnknown {
                            key: key.to_string(),
                            reason: errors
                                .iter()
                                .map(ToString::to_string)
                                .collect::<Vec<_>>()
                                .join("; then the read of its header: "),
                        }),
                    }
                }
            };
            action = m.handle(event);
        }
    }

    /// Whether a write under `generation` landed: the header's etag if the
    /// header of `key` publishes that generation (a tombstone of a clear too),
    /// `None` if it does not (another write, or none, is published; it did not
    /// land, or landed and was replaced since).
    ///
    /// # Errors
    /// [`Error::Backend`] if the backend fails.
    pub async fn outcome(&self, key: &StateKey, generation: &str) -> Result<Option<Etag>> {
        Ok(self.table.read_header(key).await?.and_then(|(b, etag)| {
            StateHeader::decode(key, &b)
                .ok()
                .filter(|h| h.generation == generation)
                .map(|_| etag)
        }))
    }

    /// Writes several states of one actor atomically: all or none.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] when the states do not fit one transaction of
    /// this provider (or belong to different actors); otherwise as
    /// [`write`](Self::write) ([`Error::InconsistentState`] names the first state
    /// whose precondition failed).
    pub async fn write_many(&self, states: &[(StateKey, Expected, Codec, &[u8])]) -> Result<Vec<Etag>> {
        let limits = self.table.limits();
        if let Some((first, ..)) = states.first() {
            if states.iter().any(|(k, ..)| k.actor_id() != first.actor_id()) {
                return Err(Error::invalid_config(
                    "states",
                    "all states must belong to one actor",
                ));
            }
        }
        let mut seen = std::collections::BTreeSet::new();
        if let Some((k, ..)) = states.iter().find(|(k, ..)| !seen.insert(k)) {
            return Err(Error::invalid_config(
                "states",
                format!("state {k} is written twice in one write_many"),
            ));
        }
        let generation = new_generation(self.clock.now());
        let mut rows = 0;
        let mut bytes = 0;
        let mut planned = Vec::with_capacity(states.len());
        for (key, _, _, data) in states {
            let m = WriteMachine::new(key, data.len(), generation.clone(), limits)?;
            rows += m.chunk_ranges().len() + 1;
            bytes += data.len() + HEADER_BYTES;
            planned.push((m.layout(), m.chunk_ranges().to_vec()));
        }
        if rows > limits.txn_rows || bytes > limits.txn_bytes {
            return Err(Error::invalid_config(
                "states",
                format!(
                    "{rows} rows and {bytes} bytes do not fit one transaction of this provider ({} rows, {} bytes)",
                    limits.txn_rows, limits.txn_bytes
                ),
            ));
        }
        let headers: Vec<Vec<u8>> = states
            .iter()
            .zip(&planned)
            .map(|((_, _, codec, data), (layout, r))| {
                // A state too big for its row has chunk rows in the transaction.
                let layout = if *layout == Layout::Row {
                    Layout::Row
                } else {
                    Layout::Txn
                };
                header_row(data, *codec, &generation, layout, r.len(), None, 0)
            })
            .collect();
        let writes: Vec<HeaderWrite<'_>> = states
            .iter()
            .zip(&planned)
            .zip(&headers)
            .map(|(((key, expected, _, data), (_, r)), h)| HeaderWrite {
                key,
                expected: expected.clone(),
                header: Some(h),
                generation: &generation,
                chunks: r.iter().map(|b| &data[b.clone()]).collect(),
                expires_at: None,
            })
            .collect();
        let committed = match self.table.commit(&writes).await {
            Ok(c) => c,
            Err(e) if !e.is_transient() => return Err(e),
            Err(e) => {
                // It may have landed: every header names our generation if so.
                let mut etags = Vec::with_capacity(states.len());
                for (key, ..) in states {
                    match self.outcome(key, &generation).await {
                        Ok(Some(etag)) => etags.push(Some(etag)),
                        Ok(None) => return Err(e),
                        Err(read) => {
                            return Err(Error::OutcomeUnknown {
                                key: key.to_string(),
                                reason: format!("{e}; then the read of its header: {read}"),
                            })
                        }
                    }
                }
                Commit::Done {
                    etags,
                    replaced: Vec::new(),
                }
            }
        };
        match committed {
            Commit::Done { etags, replaced } => {
                for ((key, ..), g) in states.iter().zip(replaced) {
                    if let Some(g) = g.filter(|g| *g != generation) {
                        let _ = self.table.delete_generation(key, &g).await;
                    }
                }
                etags
                    .into_iter()
                    .map(|e| e.ok_or_else(|| Error::backend("the commit returned no etag")))
                    .collect()
            }
            Commit::Conflict { index, current } => Err(Error::InconsistentState {
                key: states[index].0.to_string(),
                expected: expected_etag(&states[index].1),
                current,
            }),
        }
    }

    /// Clears the state of `key` if its header passes `expected`: a tombstone
    /// (returns its etag) or, with [`ClearMode::Delete`], no header (returns
    /// `None`). The cleared state's chunks are deleted. A header that does not
    /// decode is cleared too (with [`Expected::Any`], the way out of a corrupt
    /// record).
    ///
    /// # Errors
    /// As [`write`](Self::write).
    pub async fn clear(&self, key: &StateKey, expected: Expected, mode: ClearMode) -> Result<Option<Etag>> {
        let generation = self.new_generation();
        self.clear_as(key, expected, mode, &generation).await
    }

    /// [`clear`](Self::clear) with a tombstone under a generation id the caller
    /// chose, so that [`outcome`](Self::outcome) can tell later whether it landed.
    ///
    /// # Errors
    /// As [`write`](Self::write).
    pub async fn clear_as(
        &self,
        key: &StateKey,
        expected: Expected,
        mode: ClearMode,
        generation: &str,
    ) -> Result<Option<Etag>> {
        let tombstone = StateHeader::tombstone(generation.to_owned()).encode_row(&[]);
        let w = HeaderWrite {
            key,
            expected: expected.clone(),
            header: (mode == ClearMode::Tombstone).then_some(tombstone.as_slice()),
            generation,
            chunks: Vec::new(),
            expires_at: None,
        };
        let committed = match self.table.commit(std::slice::from_ref(&w)).await {
            Ok(c) => c,
            Err(e) if !e.is_transient() => return Err(e),
            // It may have landed: a tombstone names our generation; after a
            // delete, no header is left.
            Err(e) => {
                let now = match self.table.read_header(key).await {
                    Ok(h) => h,
                    Err(read) => {
                        return Err(Error::OutcomeUnknown {
                            key: key.to_string(),
                            reason: format!("{e}; then the read of its header: {read}"),
                        })
                    }
                };
                let landed = match (&now, mode) {
                    (None, ClearMode::Delete) => Some(None),
                    (Some((b, etag)), ClearMode::Tombstone) => StateHeader::decode(key, b)
                        .ok()
                        .filter(|h| h.generation == generation)
                        .map(|_| Some(etag.clone())),
                    _ => None,
                };
                match landed {
                    Some(etag) => Commit::Done {
                        etags: vec![etag],
                        replaced: Vec::new(),
                    },
                    None => return Err(e),
                }
            }
        };
        match committed {
            Commit::Done { etags, replaced } => {
                if let Some(g) = replaced.into_iter().next().flatten() {
                    let _ = self.table.delete_generation(key, &g).await;
                }
                Ok(etags.into_iter().next().flatten())
            }
            Commit::Conflict { current, .. } => Err(Error::InconsistentState {
                key: key.to_string(),
                expected: expected_etag(&expected),
                current,
            }),
        }
    }

    /// One page of the keys of actor kind `kind` (at most `limit`, after `after`).
    ///
    /// # Errors
    /// [`Error::Backend`] if the backend fails.
    pub async fn list(&self, kind: &str, after: Option<&StateKey>, limit: usize) -> Result<Vec<StateKey>> {
        self.table.list(kind, after, limit).await
    }

    /// Removes the generations of `key` that no header publishes and that are
    /// older than `grace` ([`SWEEP_GRACE`] normally: younger ones may belong to a
    /// write still staging). Returns how many.
    ///
    /// # Errors
    /// [`Error::Backend`] if the backend fails.
    pub async fn sweep(&self, key: &StateKey, grace: Duration) -> Result<usize> {
        // Note: judges a generation's age by the time in its id (the writer's
        // clock). The service's periodic sweep ([`sweep_with`](Self::sweep_with))
        // judges by its own sightings instead.
        let published = match self.table.read_header(key).await? {
            Some((b, _)) => Some(StateHeader::decode(key, &b)?.generation),
            None => None,
        };
        let gens = self.table.generations(key).await?;
        let gone = sweepable(&gens, published.as_deref(), self.clock.now(), grace);
        for g in &gone {
            self.table.delete_generation(key, g).await?;
        }
        Ok(gone.len())
    }

    /// The storage's clock (expiry, generation ids, sweeps).
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// Sweeps `key` (listed by the table) by the rules of `machine`
    /// ([`crate::state_sweep`]): deletes what they say, returns what was
    /// deleted, each once. A header that does not decode is left alone (a
    /// repair is `PersistentState::overwrite` or `delete`).
    ///
    /// # Errors
    /// [`Error::Corrupt`] for a header that does not decode (nothing deleted);
    /// [`Error::Backend`] if the backend fails (what was deleted stays deleted).
    pub async fn sweep_with(
        &self,
        key: &StateKey,
        machine: &mut crate::state_sweep::SweepMachine,
    ) -> Result<Vec<crate::state_sweep::Swept>> {
        use crate::state_sweep::SweepAction;
        let header = match self.table.read_header(key).await? {
            Some((row, etag)) => Some((StateHeader::decode(key, &row)?, etag)),
            None => None,
        };
        let gens = self.table.generations(key).await?;
        let now = self.clock.now();
        let mut done = Vec::new();
        for (action, what) in machine.observe(key, now, header.as_ref().map(|(h, e)| (h, e)), &gens) {
            match action {
                SweepAction::DeleteGeneration(g) => {
                    self.table.delete_generation(key, &g).await?;
                    done.push(what);
                }
                SweepAction::DeleteHeader(expected) => {
                    let w = HeaderWrite {
                        key,
                        expected,
                        header: None,
                        generation: "",
                        chunks: Vec::new(),
                        expires_at: None,
                    };
                    // A conflict: written meanwhile, left alone.
                    if let Commit::Done { .. } = self.table.commit(std::slice::from_ref(&w)).await? {
                        done.push(what);
                    }
                }
            }
        }
        Ok(done)
    }
}

/// The header row of `data` written under `generation` with `layout`.
fn header_row(
    data: &[u8],
    codec: Codec,
    generation: &str,
    layout: Layout,
    chunks: usize,
    expires_at: Option<Timestamp>,
    version: u32,
) -> Vec<u8> {
    let mut h = StateHeader::of(data, codec, generation.to_owned(), chunks as u32, expires_at);
    h.version = version;
    if layout == Layout::Row {
        h.inline = true;
        h.encode_row(data)
    } else {
        h.encode_row(&[])
    }
}

fn expected_etag(e: &Expected) -> Option<Etag> {
    match e {
        Expected::Etag(e) => Some(e.clone()),
        Expected::Absent | Expected::Any => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn key() -> StateKey {
        StateKey::new("cart/1", "state").unwrap()
    }

    const LIMITS: StateLimits = StateLimits {
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
                matches!(StateKey::new(a, n), Err(Error::InvalidConfig { .. })),
                "{a:?} {n:?}"
            );
        }
        assert_eq!(key().kind(), "cart");
    }

    fn done(etag: &str, replaced: Option<&str>) -> Commit {
        Commit::Done {
            etags: vec![Some(Etag::new(etag))],
            replaced: vec![replaced.map(str::to_owned)],
        }
    }

    #[test]
    fn a_small_state_is_one_conditional_write_of_its_row() {
        let mut m = WriteMachine::new(&key(), 10, "g2".into(), LIMITS).unwrap();
        assert_eq!(m.layout(), Layout::Row);
        assert!(m.chunk_ranges().is_empty(), "no chunk rows");
        assert_eq!(
            m.handle(WriteEvent::Start),
            WriteAction::Commit(0..0),
            "no read before"
        );
        assert_eq!(
            m.handle(WriteEvent::Committed(done("e", None))),
            WriteAction::Finish(Ok(Some(Etag::new("e")))),
            "nothing to delete after"
        );
    }

    #[test]
    fn the_generation_a_commit_replaced_is_deleted() {
        let mut m = WriteMachine::new(&key(), 25, "g2".into(), LIMITS).unwrap();
        assert_eq!(m.layout(), Layout::Txn);
        assert_eq!(m.chunk_ranges(), &[0..10, 10..20, 20..25]);
        assert_eq!(m.handle(WriteEvent::Start), WriteAction::Commit(0..3));
        assert_eq!(
            m.handle(WriteEvent::Committed(done("e", Some("g1")))),
            WriteAction::DeleteGeneration("g1".into())
        );
        assert_eq!(
            m.handle(WriteEvent::Deleted),
            WriteAction::Finish(Ok(Some(Etag::new("e"))))
        );
    }

    #[test]
    fn a_large_state_is_staged_in_batches_and_a_conflict_deletes_them() {
        let mut m = WriteMachine::new(&key(), 95, "g2".into(), LIMITS).unwrap();
        assert_eq!(m.layout(), Layout::Staged);
        assert_eq!(m.handle(WriteEvent::Start), WriteAction::PutChunks(0..4));
        assert_eq!(m.handle(WriteEvent::ChunksPut), WriteAction::PutChunks(4..8));
        assert_eq!(m.handle(WriteEvent::ChunksPut), WriteAction::PutChunks(8..10));
        assert_eq!(m.handle(WriteEvent::ChunksPut), WriteAction::Commit(0..0));
        assert_eq!(
            m.handle(WriteEvent::Committed(Commit::Conflict {
                index: 0,
                current: Some(Etag::new("x"))
            })),
            WriteAction::DeleteGeneration("g2".into())
        );
        assert_eq!(
            m.handle(WriteEvent::Deleted),
            WriteAction::Finish(Err(WriteFailure::Conflict(Some(Etag::new("x")))))
        );
    }

    #[test]
    fn a_failed_staging_call_deletes_what_was_staged() {
        let mut m = WriteMachine::new(&key(), 95, "g2".into(), LIMITS).unwrap();
        m.handle(WriteEvent::Start);
        assert_eq!(
            m.handle(WriteEvent::Failed),
            WriteAction::DeleteGeneration("g2".into())
        );
        assert_eq!(
            m.handle(WriteEvent::Deleted),
            WriteAction::Finish(Err(WriteFailure::Failed))
        );
    }

    fn staged_to_commit() -> WriteMachine {
        let mut m = WriteMachine::new(&key(), 95, "g2".into(), LIMITS).unwrap();
        m.handle(WriteEvent::Start);
        m.handle(WriteEvent::ChunksPut);
        m.handle(WriteEvent::ChunksPut);
        assert_eq!(m.handle(WriteEvent::ChunksPut), WriteAction::Commit(0..0));
        m
    }

    /// A commit that errors may have landed: the machine reads the header before
    /// it deletes anything (the first version deleted the staged generation at
    /// once, and a commit that had landed read `Corrupt` for ever).
    #[test]
    fn a_failed_commit_that_landed_succeeds_and_keeps_its_chunks() {
        let mut m = staged_to_commit();
        assert_eq!(m.handle(WriteEvent::Failed), WriteAction::Resolve);
        assert_eq!(
            m.handle(WriteEvent::Resolved(Some(("g2".into(), Etag::new("e"))))),
            WriteAction::Finish(Ok(Some(Etag::new("e")))),
            "landed: ours stays"
        );
        // In the header row: the same.
        let mut m = WriteMachine::new(&key(), 5, "g2".into(), LIMITS).unwrap();
        assert_eq!(m.handle(WriteEvent::Start), WriteAction::Commit(0..0));
        assert_eq!(m.handle(WriteEvent::Failed), WriteAction::Resolve);
        assert_eq!(
            m.handle(WriteEvent::Resolved(Some(("g2".into(), Etag::new("e"))))),
            WriteAction::Finish(Ok(Some(Etag::new("e"))))
        );
    }

    #[test]
    fn a_failed_commit_that_did_not_land_deletes_what_it_staged() {
        for found in [Some(("g1".to_owned(), Etag::new("old"))), None] {
            let mut m = staged_to_commit();
            assert_eq!(m.handle(WriteEvent::Failed), WriteAction::Resolve);
            assert_eq!(
                m.handle(WriteEvent::Resolved(found)),
                WriteAction::DeleteGeneration("g2".into())
            );
            assert_eq!(
                m.handle(WriteEvent::Deleted),
                WriteAction::Finish(Err(WriteFailure::Failed))
            );
        }
    }

    #[test]
    fn a_refused_commit_wrote_nothing_and_is_not_resolved() {
        let mut m = staged_to_commit();
        assert_eq!(
            m.handle(WriteEvent::Rejected),
            WriteAction::DeleteGeneration("g2".into())
        );
        assert_eq!(
            m.handle(WriteEvent::Deleted),
            WriteAction::Finish(Err(WriteFailure::Failed))
        );
    }

    #[test]
    fn a_failed_commit_whose_outcome_cannot_be_read_deletes_nothing() {
        let mut m = staged_to_commit();
        assert_eq!(m.handle(WriteEvent::Failed), WriteAction::Resolve);
        assert_eq!(
            m.handle(WriteEvent::Failed),
            WriteAction::Finish(Err(WriteFailure::Unknown))
        );
    }

    /// A commit the provider calls undecidable (a Redis primary applied it, the
    /// replicas `wait_replicas` asks for did not acknowledge it) is not resolved
    /// by a read: the primary would say it landed whether or not a failover
    /// keeps it. It ends unknown, its chunks kept.
    #[test]
    fn an_undecidable_commit_is_unknown_without_a_read() {
        let mut m = staged_to_commit();
        assert_eq!(
            m.handle(WriteEvent::Undecidable),
            WriteAction::Finish(Err(WriteFailure::Unknown))
        );
        let mut m = WriteMachine::new(&key(), 5, "g2".into(), LIMITS).unwrap();
        assert_eq!(m.handle(WriteEvent::Start), WriteAction::Commit(0..0));
        assert_eq!(
            m.handle(WriteEvent::Undecidable),
            WriteAction::Finish(Err(WriteFailure::Unknown))
        );
    }

    #[test]
    fn header_rows_round_trip_and_format_1_still_reads() {
        let data = b"hello".to_vec();
        let mut h = StateHeader::of(&data, Codec::Json, "g".into(), 0, None);
        h.inline = true;
        let row = h.encode_row(&data);
        let (back, inline) = StateHeader::decode_row(&key(), &row).unwrap();
        assert_eq!((back, inline), (h, data.as_slice()));
        assert_eq!(replaced_generation(&row), None, "inline: no chunk rows");
        let head = row_head_len(&row);
        assert_eq!(
            &row[head..],
            data.as_slice(),
            "the head ends where the bytes start"
        );
        assert_eq!(StateHeader::decode(&key(), &row[..head]).unwrap().len, 5);
        let v1 = br#"{"format":1,"codec":"json","len":5,"checksum":"x","generation":"g1","chunks":1}"#;
        let (old, rest) = StateHeader::decode_row(&key(), v1).unwrap();
        assert_eq!((old.format, old.chunks, rest.len()), (1, 1, 0));
        assert_eq!(replaced_generation(v1), Some("g1".into()));
        assert_eq!(replaced_generation(&v1[..20]), None, "cut: not a header");
        for bad in [&b"RCS2\0\0\0\x09{}"[..], b"RCS", b"xyz", b""] {
            assert!(
                matches!(StateHeader::decode_row(&key(), bad), Err(Error::Corrupt { .. })),
                "{bad:?}"
            );
        }
        let newer = br#"{"format":3,"codec":"json","len":0,"checksum":"x","generation":"g","chunks":0}"#;
        let e = StateHeader::decode(&key(), newer).unwrap_err();
        assert!(e.to_string().contains("newer"), "{e}");
    }

    #[test]
    fn a_provider_cap_below_the_maximum_is_enforced() {
        let capped = StateLimits {
            max_state_bytes: 100,
            ..LIMITS
        };
        assert!(WriteMachine::new(&key(), 100, "g".into(), capped).is_ok());
        let e = WriteMachine::new(&key(), 101, "g".into(), capped).unwrap_err();
        assert!(matches!(e, Error::TooLarge { max: 100, .. }), "{e}");
    }

    #[test]
    fn too_large_is_refused_before_anything() {
        let e = WriteMachine::new(&key(), MAX_STATE_BYTES as usize + 1, "g".into(), LIMITS).unwrap_err();
        assert!(matches!(e, Error::TooLarge { .. }));
    }

    #[test]
    fn assemble_checks_every_chunk_length_and_checksum() {
        let data = b"hello world".to_vec();
        let h = StateHeader::of(&data, Codec::Raw, "g".into(), 2, None);
        let ok = assemble(
            &key(),
            &h,
            vec![Some(b"hello ".to_vec()), Some(b"world".to_vec())],
        )
        .unwrap();
        assert_eq!(ok, data);
        for bad in [
            vec![Some(b"hello ".to_vec()), None],
            vec![Some(b"hello ".to_vec()), Some(b"worl".to_vec())],
            vec![Some(b"hello ".to_vec()), Some(b"World".to_vec())],
        ] {
            assert!(matches!(assemble(&key(), &h, bad), Err(Error::Corrupt { .. })));
        }
        assert!(matches!(
            StateHeader::decode(&key(), b"{nope"),
            Err(Error::Corrupt { .. })
        ));
    }

    #[test]
    fn sweep_spares_the_published_and_the_young() {
        let now = Timestamp::from_millis(1_000_000);
        let gens = vec![
            new_generation(Timestamp::from_millis(1_000)),
            new_generation(Timestamp::from_millis(2_000)),
            new_generation(Timestamp::from_millis(999_000)),
        ];
        let gone = sweepable(&gens, Some(&gens[1]), now, Duration::from_secs(10));
        assert_eq!(gone, vec![gens[0].clone()]);
    }
}
