//! Shard leases: who holds each shard of a service, held in the store rather
//! than in peer messages. Every tenant of the ownership layer acts under
//! them: placement hosts a shard's actors where its lease is held, and a
//! reminder service delivers their ticks there (the watermark and
//! exceptions below are that tenant's part of the row).
//!
//! A service has a fixed number of shards S (recorded in the store
//! when the service is first used: [`ShardLeases::open`]); shard `k` holds the
//! actors [`actor_shard`](crate::actor_shard) maps to `k`. Each shard has one
//! lease row ([`ShardLease`]), written only by conditional writes on its etag:
//! its `epoch` (the fencing token, one more on every acquire), its `owner`,
//! whether it is [`LeaseStatus::Owned`] or [`LeaseStatus::Released`], the
//! watermark `W` (the latest occurrence started: every occurrence at or before
//! `W` of every reminder of the shard the holder knew of was delivered or
//! started; none after it was started), the exceptions (reminders whose first
//! undelivered occurrence is at or before the release's stop, which may be
//! after `W`), and `listed_from` (`W` less the cluster's clock bound): every
//! row the releasing holder knew of whose first occurrence is at or after it
//! is named in the exceptions, so an unnamed one there was registered after
//! the release's read.
//!
//! The same idea as Temporal's history shards (a RangeID bumped on every
//! acquire, timer ack levels in the shard row, every write conditional on it)
//! and Kafka's consumer offsets (commit on revoke, read on assign, generation
//! ids fencing stale members).
//!
//! # The provider contract ([`LeaseTable`])
//! Rows are opaque bytes to a provider (this module encodes them), keyed by
//! (service id, shard):
//! - [`write_lease`](LeaseTable::write_lease) is a compare-and-set: it writes
//!   only if the row's current etag is the expected one ([`Expected::Etag`]), or
//!   no row exists ([`Expected::Absent`]); of concurrent writers with one
//!   expectation exactly one wins, and every other gets
//!   [`LeaseWrite::Conflict`] with the current etag. Every write gives the row
//!   an etag it never had before.
//! - [`shard_count`](LeaseTable::shard_count) records the service's shard count
//!   once (the first caller's) and always returns the recorded one.
//! - Services never see each other's rows or shard counts.
//! - **Pages.** A release may owe more exceptions than one row holds
//!   ([`MAX_LEASE_BYTES`]): [`ShardLeases::write`] then stores them in pages
//!   beside the row, written before it ([`write_pages`](LeaseTable::write_pages),
//!   blind puts keyed by the shard and a page set), and the row names the set
//!   and its page count. A page set is named after the epoch and status of the
//!   row that first wrote it (`<epoch>-owned`, `<epoch>-released`): every
//!   writer of one set writes the same exceptions (only the holder of an epoch
//!   releases it), so a set is never read half old, half new. A row that owes
//!   the same exceptions as the set it was read with names that set instead
//!   (`page_set` in the stored row): an acquire of a release that owed tens of
//!   thousands writes one row, not the release's pages again.
//!   A page is the gzip of a JSON array of exceptions (or the JSON itself
//!   when that is smaller): a fifth of the bytes for a typical release.
//!   [`read_pages`](LeaseTable::read_pages) answers a missing page with `None`;
//!   [`delete_pages`](LeaseTable::delete_pages) removes every set of a shard but
//!   the one its row names, after that row was written. There is no cap on the
//!   exceptions a row owes: what does not fit the row goes to pages, sent in
//!   calls of at most [`PAGE_CALL_BYTES`] that a caller bounds one by one
//!   ([`ShardLeases::prepare`], [`ShardLeases::send_pages`],
//!   [`ShardLeases::commit`]); a write retried in the same process sends only
//!   the pages not known to have landed.
//!
//! - **Fence token.** Beside each row a provider stores the row's
//!   [`fence_token`] (its epoch while [`LeaseStatus::Owned`], nothing while
//!   released), written in the same conditional write as the row. A state
//!   commit under a [`Fence`] compares it in the commit's own transaction
//!   ([`StateTable::commit`](crate::StateTable::commit)), so the store itself
//!   refuses the writes of a silo that lost the shard. The token changes only
//!   on an acquire or a release, never on the holder's watermark updates.
//!
//! A write that fails with a transient error may have landed: read the row to
//! learn its outcome ([`ShardLeases::read`]) before acting on the error.

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::{Error, Etag, Expected, Result, SiloAddress, Timestamp};

/// The largest shard count a service may have: 65,536.
pub const MAX_SHARDS: u32 = 65_536;

/// The largest encoded lease row: 256 KiB (it fits one row on every provider;
/// DynamoDB's item limit is 400 KB).
pub const MAX_LEASE_BYTES: usize = 256 * 1024;

/// Checks a lease row before it is written: the shard below [`MAX_SHARDS`] and
/// the row at most [`MAX_LEASE_BYTES`]. Every provider's
/// [`LeaseTable::write_lease`] calls it before it sends anything.
///
/// # Errors
/// [`Error::InvalidInput`] naming `shard` or `lease`.
pub fn check_row(shard: u32, row: &[u8]) -> Result<()> {
    if shard >= MAX_SHARDS {
        return Err(Error::invalid_input(
            "shard",
            format!("{shard} is not below {MAX_SHARDS}"),
        ));
    }
    if row.len() > MAX_LEASE_BYTES {
        return Err(Error::invalid_input(
            "lease",
            format!(
                "the row of shard {shard} is {} bytes, over {MAX_LEASE_BYTES}",
                row.len()
            ),
        ));
    }
    Ok(())
}

/// The fence token of a lease row's bytes: its epoch while the row is
/// [`LeaseStatus::Owned`], `None` while it is released or when the bytes are
/// not a lease row (which then fences every writer out). Every provider stores
/// it beside the row in the row's own write (see the module docs).
pub fn fence_token(row: &[u8]) -> Option<u64> {
    #[derive(Deserialize)]
    struct Token {
        epoch: u64,
        status: LeaseStatus,
    }
    match serde_json::from_slice::<Token>(row) {
        Ok(Token {
            epoch,
            status: LeaseStatus::Owned,
        }) => Some(epoch),
        _ => None,
    }
}

/// Ownership of one shard as a state write carries it: the store commits the
/// write only while the shard's lease is still held at `epoch` (its fence
/// token, [`fence_token`]), in the same transaction. A silo gets one from the
/// reminder service for a shard it holds (`Reminders::fence`, and every
/// `ReminderTick`); the epoch is Temporal's RangeID, Kleppmann's fencing token.
///
/// A fence covers the actors [`actor_shard`](crate::actor_shard)`(actor,
/// shards)` maps to `shard`, in the tables of `service`: a state table of the
/// same service id.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct Fence {
    /// The service whose shard leases fence (the state table's service id).
    pub service: String,
    /// The service's shard count.
    pub shards: u32,
    /// The shard held.
    pub shard: u32,
    /// The lease's epoch when it was acquired (one more on every acquire).
    pub epoch: u64,
}

impl Fence {
    /// Whether the fence covers `actor_id` (its shard among `shards` is `shard`).
    pub fn covers(&self, actor_id: &str) -> bool {
        crate::actor_shard(actor_id, self.shards) == self.shard
    }

    /// The fence token a provider compares: the epoch in decimal.
    pub fn token(&self) -> String {
        self.epoch.to_string()
    }

    /// Checks that this fence can fence a reminder-row write of `actor_id`
    /// in `service`'s table: the fence's service is `service` and its shard
    /// is the actor's.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming what differs; nothing may be written.
    pub fn check_reminder(&self, service: &str, actor_id: &str) -> Result<()> {
        if self.service != service {
            return Err(Error::invalid_input(
                "fence",
                format!(
                    "fences service `{}`, not the reminder table's `{service}`",
                    self.service
                ),
            ));
        }
        if !self.covers(actor_id) {
            return Err(Error::invalid_input(
                "fence",
                format!(
                    "shard {} of {} does not hold actor `{actor_id}`",
                    self.shard, self.shards
                ),
            ));
        }
        Ok(())
    }

    /// The [`Error::Fenced`] of a reminder-row write of `(actor_id, name)`
    /// under this fence, the lease now held at `current` (`None`: released).
    pub fn refused_reminder(&self, actor_id: &str, name: &str, current: Option<u64>) -> Error {
        Error::Fenced {
            key: format!("reminder {actor_id}/{name}"),
            service: self.service.clone(),
            shard: self.shard,
            epoch: self.epoch,
            current,
        }
    }
}

/// Whether a shard's lease is held.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum LeaseStatus {
    /// `owner` holds the shard and may deliver its reminders.
    Owned,
    /// Nobody holds it; the next owner starts after the watermark.
    Released,
}

/// A reminder of a shard whose first undelivered occurrence is at or before the
/// lease's watermark (overdue, retrying, catching up).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct LeaseException {
    /// The reminder's actor.
    pub actor_id: String,
    /// The reminder's name.
    pub name: String,
    /// Its first occurrence not delivered yet (UTC ms).
    pub next: Timestamp,
    /// The etag of the registration that owes it (`None` in rows written
    /// before it was recorded): a reminder registered again since then owes
    /// nothing of the old registration and starts at its own first tick.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub etag: Option<Etag>,
    /// Every occurrence of this registration was delivered, and its row's
    /// removal had not landed at the release (a one-shot, or a schedule past
    /// its end): the next holder delivers nothing of it and removes the row.
    /// Named only for a row at or after the lease's
    /// [`listed_from`](ShardLease::listed_from), where an unnamed row starts
    /// at its first occurrence.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub done: bool,
}

/// One shard's lease row.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct ShardLease {
    /// The shard (0 to S - 1).
    pub shard: u32,
    /// The fencing token: one more on every acquire, never less.
    pub epoch: u64,
    /// The silo holding or last holding the shard (`ip:port@generation`).
    pub owner: Option<SiloAddress>,
    /// Held or released.
    pub status: LeaseStatus,
    /// Every occurrence at or before this time (UTC ms) of every reminder of
    /// the shard was delivered or started, except [`exceptions`](Self::exceptions);
    /// none after it was started. `None`: nothing delivered yet.
    pub watermark: Option<Timestamp>,
    /// Reminders whose first undelivered occurrence is at or before the
    /// release's stop (which may be after the watermark): each starts there.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exceptions: Vec<LeaseException>,
    /// When the holder's last full read of the shard's reminder rows started
    /// (UTC ms): a row registered later that the holder never saw starts at its
    /// first tick.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_from: Option<Timestamp>,
    /// Set by a release: every reminder row the releasing holder knew of whose
    /// first occurrence is at or after this time (UTC ms) is named in the
    /// exceptions (where it starts, or [`done`](LeaseException::done)). An
    /// unnamed row whose first occurrence is at or after it was registered
    /// after the holder's final read, so it starts at its first occurrence
    /// even when that is at or before the watermark. It is the watermark less
    /// the cluster's `max_clock_offset`: the watermark is the releasing
    /// silo's clock, and the clock that set the row's first occurrence may be
    /// up to that much behind it. `None`: rows written before it existed, or
    /// a row no release wrote.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub listed_from: Option<Timestamp>,
    /// Set when a silo that took the shard over from its Dead holder gives
    /// it back before its load ended (the row names the Dead holder again):
    /// that takeover's time (UTC ms), after which the Dead holder provably
    /// delivered nothing (its lease fence had ended). The next silo to take
    /// the shard over owes every occurrence from it on, whatever its own
    /// fence. `None` on every other row; cleared by the next acquire.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub fenced_from: Option<Timestamp>,
    /// The holder's progress as last checkpointed (UTC ms): every occurrence
    /// at or before it was delivered or started, except the
    /// [`exceptions`](Self::exceptions). Written by the holder every
    /// checkpoint interval while it holds the shard (same epoch, same owner:
    /// the fencing token is unchanged), and by an acquire (the released
    /// watermark, or the Dead holder's checkpoint it takes over). A silo
    /// that takes the shard over from a Dead holder owes every occurrence
    /// after it, less the cluster's `max_clock_offset`, and the exceptions,
    /// under every missed-tick policy: a crash repeats at most what the
    /// holder delivered after its last checkpoint, and loses nothing after
    /// it. `None`: no checkpoint (a row of an older version, or a takeover
    /// of one): a takeover owes from its takeover time on. Temporal's shard
    /// ack level is the model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub owed_from: Option<Timestamp>,
    /// The etag as last read or written (not stored in the row).
    #[serde(skip)]
    pub etag: Etag,
    /// Where [`ShardLeases::read`] found the exceptions when they were in
    /// pages (not stored in the row, and not part of the lease's value: two
    /// leases that differ only here are equal). A write of the same
    /// exceptions names that page set instead of writing them again: an
    /// acquire references the released set it read.
    #[serde(skip)]
    pub pages_from: PagesFrom,
}

/// Where a lease's exceptions were read from: the page set, its page count
/// and a digest of its pages' bytes ([`ShardLease::pages_from`]). Equal to
/// every other `PagesFrom`: it is bookkeeping, not part of a lease's value.
#[derive(Clone, Debug, Default)]
pub struct PagesFrom(pub Option<PageRef>);

impl PartialEq for PagesFrom {
    fn eq(&self, _: &PagesFrom) -> bool {
        true
    }
}

impl Eq for PagesFrom {}

/// A page set as read: its name, page count and the digest of its pages.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PageRef {
    /// The set's name ([`page_set`]).
    pub set: String,
    /// Its page count.
    pub count: u32,
    /// A digest of its pages' bytes, in order (this process only).
    pub digest: u64,
}

impl ShardLease {
    /// A shard nobody has held: epoch 0, released, no watermark.
    pub fn vacant(shard: u32) -> ShardLease {
        ShardLease {
            shard,
            epoch: 0,
            owner: None,
            status: LeaseStatus::Released,
            watermark: None,
            exceptions: Vec::new(),
            read_from: None,
            listed_from: None,
            fenced_from: None,
            owed_from: None,
            etag: Etag::default(),
            pages_from: PagesFrom::default(),
        }
    }

    /// The row's bytes (JSON), exceptions included.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] (`lease`) when the row would exceed
    /// [`MAX_LEASE_BYTES`] (too many exceptions: [`ShardLeases::write`] puts
    /// them in pages instead).
    pub fn encode(&self) -> Result<Vec<u8>> {
        let bytes = serde_json::to_vec(self)
            .map_err(|e| Error::invalid_input("lease", format!("does not serialize: {e}")))?;
        check_row(self.shard, &bytes)?;
        Ok(bytes)
    }

    /// The row of `shard` from its stored `bytes` and `etag`. A row whose
    /// exceptions are in pages decodes without them: [`ShardLeases::read`]
    /// reads the pages too.
    ///
    /// # Errors
    /// [`Error::Corrupt`] naming the shard when the bytes are not a lease row or
    /// are the row of another shard.
    pub fn decode(service_id: &str, shard: u32, bytes: &[u8], etag: Etag) -> Result<ShardLease> {
        let what = || format!("lease {service_id}/{shard}");
        let lease: ShardLease = serde_json::from_slice(bytes).map_err(|e| Error::corrupt(what(), e))?;
        ShardLease::decode_checked(service_id, shard, lease, etag)
    }

    fn decode_checked(service_id: &str, shard: u32, mut lease: ShardLease, etag: Etag) -> Result<ShardLease> {
        if lease.shard != shard {
            return Err(Error::corrupt(
                format!("lease {service_id}/{shard}"),
                format!("holds the row of shard {}", lease.shard),
            ));
        }
        lease.etag = etag;
        Ok(lease)
    }
}

/// The outcome of a conditional [`LeaseTable::write_lease`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LeaseWrite {
    /// Written; the row's new etag.
    Written(Etag),
    /// The expectation did not hold; nothing was written. The row's current
    /// etag (`None`: no row).
    Conflict(Option<Etag>),
}

/// The shard lease rows of one reminder service (see the module docs for the
/// contract every provider keeps).
#[async_trait]
pub trait LeaseTable: Send + Sync + std::fmt::Debug {
    /// The service.
    fn service_id(&self) -> &str;

    /// Records `shards` as the service's shard count if none is recorded yet;
    /// returns the recorded count (the first caller's, whatever later callers
    /// pass).
    async fn shard_count(&self, shards: u32) -> Result<u32>;

    /// The row of `shard`: its bytes and etag, or `None`.
    async fn read_lease(&self, shard: u32) -> Result<Option<(Vec<u8>, Etag)>>;

    /// Writes `row` as the row of `shard` if its etag is `expected` (a
    /// compare-and-set; [`Expected::Any`] writes unconditionally).
    async fn write_lease(&self, shard: u32, expected: &Expected, row: &[u8]) -> Result<LeaseWrite>;

    /// Writes `pages` as pages `first..first + pages.len()` of page set `set`
    /// of `shard` (blind puts, each page at most [`MAX_LEASE_BYTES`]; a set
    /// written again is overwritten page by page). [`ShardLeases::write`]
    /// sends at most [`PAGE_CALL_BYTES`] of pages per call, so one call's
    /// time is bounded whatever a release owes; a provider sends them in as
    /// few requests as its limits allow.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a page over [`MAX_LEASE_BYTES`] or a shard
    /// past [`MAX_SHARDS`] ([`check_row`]), before anything is sent; a backend
    /// error (some pages may have been written).
    async fn write_pages(&self, shard: u32, set: &str, first: u32, pages: &[Vec<u8>]) -> Result<()>;

    /// Pages `0..count` of page set `set` of `shard`, `None` for a missing one.
    async fn read_pages(&self, shard: u32, set: &str, count: u32) -> Result<Vec<Option<Vec<u8>>>>;

    /// Deletes every page of `shard` but those of set `keep` (`None`: every
    /// page).
    async fn delete_pages(&self, shard: u32, keep: Option<&str>) -> Result<()>;

    /// Deletes every row, page and the shard count of this service (tests,
    /// tooling).
    async fn clear(&self) -> Result<()>;
}

/// The page set of a row of `epoch` and `status`: `<epoch, 20 digits>-owned` or
/// `-released` (sorted by epoch as text).
pub fn page_set(epoch: u64, status: LeaseStatus) -> String {
    match status {
        LeaseStatus::Owned => format!("{epoch:020}-owned"),
        LeaseStatus::Released => format!("{epoch:020}-released"),
    }
}

/// A row as stored: the lease, and the count of pages that hold its exceptions
/// when they did not fit the row.
#[derive(Serialize)]
struct Stored {
    #[serde(flatten)]
    lease: ShardLease,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pages: Option<u32>,
    /// The page set the pages are in, when not the row's own
    /// ([`page_set`] of its epoch and status): an acquire that kept the
    /// exceptions of the release it read names the release's set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    page_set: Option<String>,
}

/// The page count and set of a stored row (its other fields ignored).
#[derive(Deserialize)]
struct PageCount {
    #[serde(default)]
    pages: Option<u32>,
    #[serde(default)]
    page_set: Option<String>,
}

/// The largest amount of page bytes [`ShardLeases::write`] sends in one
/// [`LeaseTable::write_pages`] call: 1 MiB (four full pages; under etcd's
/// default 1.5 MiB request limit), so each call's time is bounded however
/// much a release owes.
pub const PAGE_CALL_BYTES: usize = 1024 * 1024;

/// A digest of `pages`' bytes, in order.
fn digest<'a>(pages: impl IntoIterator<Item = &'a [u8]>) -> u64 {
    use std::hash::{Hash, Hasher};
    let mut h = std::collections::hash_map::DefaultHasher::new();
    for p in pages {
        p.hash(&mut h);
    }
    h.finish()
}

fn page_digest(page: &[u8]) -> u64 {
    digest([page])
}

/// `exceptions` as JSON arrays of at most [`MAX_LEASE_BYTES`] each, compressed
/// ([`compress_page`]).
fn paginate(shard: u32, exceptions: &[LeaseException]) -> Result<Vec<Vec<u8>>> {
    let mut pages = Vec::new();
    let mut page: Vec<u8> = b"[".to_vec();
    for e in exceptions {
        let one = serde_json::to_vec(e)
            .map_err(|err| Error::invalid_input("lease", format!("does not serialize: {err}")))?;
        // `,` and `]`: two more bytes.
        if page.len() > 1 && page.len() + one.len() + 2 > MAX_LEASE_BYTES {
            page.push(b']');
            pages.push(std::mem::replace(&mut page, b"[".to_vec()));
        }
        if page.len() > 1 {
            page.push(b',');
        }
        page.extend_from_slice(&one);
        if page.len() + 1 > MAX_LEASE_BYTES {
            return Err(Error::invalid_input(
                "lease",
                format!(
                    "an exception of shard {shard} (`{}` `{}`) is {} bytes, over {MAX_LEASE_BYTES}",
                    e.actor_id,
                    e.name,
                    one.len()
                ),
            ));
        }
    }
    page.push(b']');
    pages.push(page);
    Ok(pages.into_iter().map(compress_page).collect())
}

/// The first bytes of a gzip stream (RFC 1952); a JSON page starts with `[`.
const GZIP_MAGIC: [u8; 2] = [0x1f, 0x8b];

/// A page's stored bytes: the gzip of its JSON array when that is smaller
/// (a release's exceptions repeat their field names, and often their times
/// and actor id prefixes: a fifth of the bytes or less), else the JSON.
/// Deterministic for equal input (gzip's mtime is 0), so a retried write
/// recognises the pages it already sent by their digests.
fn compress_page(json: Vec<u8>) -> Vec<u8> {
    use std::io::Write;
    let mut gz =
        flate2::write::GzEncoder::new(Vec::with_capacity(json.len() / 4), flate2::Compression::fast());
    match gz.write_all(&json).and_then(|()| gz.finish()) {
        Ok(packed) if packed.len() < json.len() => packed,
        _ => json,
    }
}

/// The exceptions a stored page holds: gzipped JSON or plain JSON (pages
/// written before pages were compressed).
///
/// # Errors
/// A description of what is wrong: not gzip or JSON, a gzip stream that
/// inflates past [`MAX_LEASE_BYTES`] (no page is written larger), or JSON
/// that is not an array of exceptions.
fn page_exceptions(page: &[u8]) -> std::result::Result<Vec<LeaseException>, String> {
    use std::io::Read;
    if !page.starts_with(&GZIP_MAGIC) {
        return serde_json::from_slice(page).map_err(|e| e.to_string());
    }
    let mut json = Vec::new();
    flate2::read::GzDecoder::new(page)
        .take(MAX_LEASE_BYTES as u64 + 1)
        .read_to_end(&mut json)
        .map_err(|e| format!("gzip: {e}"))?;
    if json.len() > MAX_LEASE_BYTES {
        return Err(format!("inflates past {MAX_LEASE_BYTES} bytes"));
    }
    serde_json::from_slice(&json).map_err(|e| e.to_string())
}

/// The page set a write last sent pages of, and the digests of its pages
/// known to have landed (0: not known).
type Landed = (String, Vec<u64>);

/// Typed access to a service's leases: rows decoded, checked, and the shard
/// count agreed. Cheap to clone.
#[derive(Clone, Debug)]
pub struct ShardLeases {
    table: std::sync::Arc<dyn LeaseTable>,
    shards: u32,
    /// Shards whose row, as last read or written here, had pages: the next
    /// write removes the pages it no longer names.
    paged: std::sync::Arc<std::sync::Mutex<std::collections::BTreeSet<u32>>>,
    /// Per shard, the page set a write here last sent pages of and the
    /// digests of the pages known to have landed (0: not known): a retried
    /// write sends only the others.
    landed: std::sync::Arc<std::sync::Mutex<std::collections::HashMap<u32, Landed>>>,
}

impl ShardLeases {
    /// Opens the leases of `table`'s service with `shards` shards, recording
    /// the count if the service has none yet.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] (`shards`) when `shards` is 0 or over
    /// [`MAX_SHARDS`], or when the service was first used with another count
    /// (the message names both: the count of a service never changes, because
    /// it places every reminder); a backend error from the table.
    pub async fn open(table: std::sync::Arc<dyn LeaseTable>, shards: u32) -> Result<ShardLeases> {
        if shards == 0 || shards > MAX_SHARDS {
            return Err(Error::invalid_config(
                "shards",
                format!("{shards} is not between 1 and {MAX_SHARDS}"),
            ));
        }
        let recorded = table.shard_count(shards).await?;
        if recorded != shards {
            return Err(Error::invalid_config(
                "shards",
                format!(
                    "reminder service `{}` was first used with {recorded} shards, not {shards}; \
                     a service's shard count never changes",
                    table.service_id()
                ),
            ));
        }
        Ok(ShardLeases {
            table,
            shards,
            paged: Default::default(),
            landed: Default::default(),
        })
    }

    /// The shard count.
    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// The table.
    pub fn table(&self) -> &std::sync::Arc<dyn LeaseTable> {
        &self.table
    }

    fn check(&self, shard: u32) -> Result<()> {
        if shard >= self.shards {
            return Err(Error::invalid_input(
                "shard",
                format!("{shard} is not below the shard count {}", self.shards),
            ));
        }
        Ok(())
    }

    fn set_paged(&self, shard: u32, paged: bool) -> bool {
        let mut set = self
            .paged
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if paged {
            !set.insert(shard)
        } else {
            set.remove(&shard)
        }
    }

    /// The lease of `shard`, [`ShardLease::vacant`] (empty etag) when it has no
    /// row; its exceptions read from its pages when it has them (and where it
    /// found them kept in [`ShardLease::pages_from`]). A page found missing
    /// means the row was replaced meanwhile: the row is read again (up to 3
    /// times).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a shard out of range; [`Error::Corrupt`]
    /// for a row or page that does not decode, or a row whose pages are
    /// missing while it stays; a backend error.
    pub async fn read(&self, shard: u32) -> Result<ShardLease> {
        self.check(shard)?;
        let Some((bytes, etag)) = self.table.read_lease(shard).await? else {
            return Ok(ShardLease::vacant(shard));
        };
        let (lease, pages) = self.decode_row(shard, &bytes, etag)?;
        drop(bytes);
        let Some(pages) = pages else {
            return Ok(lease);
        };
        // Rare (a release that owed more than a row holds): boxed, and
        // nothing but the box held across its await, so the future of every
        // other read (one per registration's notice) stays small.
        let paged = Box::pin(self.read_paged(shard, lease, pages));
        paged.await
    }

    /// The row of `shard` without the exceptions its pages hold (those in
    /// the row itself are read): its epoch, owner, status and etag at the
    /// cost of one row read, whatever a release owed. For a holder that
    /// checks the row still names it, and for whoever only needs to know
    /// who holds the shard (a registration's notice, an `owner()` lookup);
    /// never write back what this returns (the exceptions in pages would be
    /// lost).
    ///
    /// # Errors
    /// As [`read`](Self::read).
    pub async fn read_head(&self, shard: u32) -> Result<ShardLease> {
        self.check(shard)?;
        let Some((bytes, etag)) = self.table.read_lease(shard).await? else {
            return Ok(ShardLease::vacant(shard));
        };
        Ok(self.decode_row(shard, &bytes, etag)?.0)
    }

    /// A stored row and, if its exceptions are in pages, their count and set.
    fn decode_row(
        &self,
        shard: u32,
        bytes: &[u8],
        etag: Etag,
    ) -> Result<(ShardLease, Option<(u32, String)>)> {
        let service = self.table.service_id();
        let what = || format!("lease {service}/{shard}");
        // Not through `Stored`: serde's `flatten` buffers the whole row
        // first, and this read is on every registration's path (R1 lost
        // 40% of its memory registrations/s to it). The lease ignores the
        // `pages` field; only a row that has one is read for it again.
        let lease: ShardLease = serde_json::from_slice(bytes).map_err(|e| Error::corrupt(what(), e))?;
        let lease = ShardLease::decode_checked(service, shard, lease, etag)?;
        let pages = if bytes.windows(8).any(|w| w == b"\"pages\":") {
            let stored = serde_json::from_slice::<PageCount>(bytes).map_err(|e| Error::corrupt(what(), e))?;
            stored.pages.map(|n| {
                (
                    n,
                    stored
                        .page_set
                        .unwrap_or_else(|| page_set(lease.epoch, lease.status)),
                )
            })
        } else {
            None
        };
        Ok((lease, pages))
    }

    /// [`read`](Self::read) of a row (`lease`, first read) whose exceptions
    /// are in `count` pages of `set`.
    async fn read_paged(
        &self,
        shard: u32,
        mut lease: ShardLease,
        (mut count, mut set): (u32, String),
    ) -> Result<ShardLease> {
        let service = self.table.service_id();
        let what = || format!("lease {service}/{shard}");
        let mut last_etag: Option<Etag> = None;
        for _ in 0..3 {
            self.set_paged(shard, true);
            let pages = self.table.read_pages(shard, &set, count).await?;
            if pages.iter().any(Option::is_none) {
                if last_etag.as_ref() == Some(&lease.etag) {
                    return Err(Error::corrupt(
                        what(),
                        format!("page set {set} of {count} pages is incomplete"),
                    ));
                }
                last_etag = Some(lease.etag.clone());
                // The row was replaced meanwhile: read it again.
                let Some((bytes, etag)) = self.table.read_lease(shard).await? else {
                    return Ok(ShardLease::vacant(shard));
                };
                match self.decode_row(shard, &bytes, etag)? {
                    (again, None) => return Ok(again),
                    (again, Some((n, s))) => {
                        lease = again;
                        count = n;
                        set = s;
                    }
                }
                continue;
            }
            let pages: Vec<Vec<u8>> = pages.into_iter().flatten().collect();
            for (i, page) in pages.iter().enumerate() {
                let mut more = page_exceptions(page)
                    .map_err(|e| Error::corrupt(format!("{} page {set}/{i}", what()), e))?;
                lease.exceptions.append(&mut more);
            }
            lease.pages_from = PagesFrom(Some(PageRef {
                digest: digest(pages.iter().map(Vec::as_slice)),
                set,
                count,
            }));
            return Ok(lease);
        }
        Err(Error::backend(format!(
            "{}: the row changed three times while its pages were read",
            what()
        )))
    }

    /// Plans the write of `lease` over the row it was read from (its etag;
    /// an empty etag: no row), for [`send_pages`](Self::send_pages) and
    /// [`commit`](Self::commit) to carry out, each call bounded on its own.
    /// Exceptions that do not fit the row go to pages (see the module docs),
    /// however many; the same exceptions as the page set the lease was read
    /// from ([`ShardLease::pages_from`]) are not written again: the row names
    /// that set. Pages of the same set that an earlier attempt here wrote
    /// with the same bytes are not sent again: a retried write resumes.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a shard out of range, or for one exception
    /// over [`MAX_LEASE_BYTES`] alone (cannot happen with keys within
    /// [`KeyLimits`](crate::KeyLimits)), before anything is sent.
    pub fn prepare(&self, lease: &ShardLease) -> Result<PreparedWrite> {
        self.check(lease.shard)?;
        let shard = lease.shard;
        let expected = if lease.etag.is_empty() {
            Expected::Absent
        } else {
            Expected::Etag(lease.etag.clone())
        };
        match lease.encode() {
            Ok(row) => {
                return Ok(PreparedWrite {
                    shard,
                    expected,
                    row,
                    set: None,
                    pages: Vec::new(),
                    todo: Vec::new(),
                })
            }
            Err(Error::InvalidInput { .. }) => {}
            Err(e) => return Err(e),
        }
        let pages = paginate(shard, &lease.exceptions)?;
        let count = pages.len() as u32;
        let own = page_set(lease.epoch, lease.status);
        let kept = lease
            .pages_from
            .0
            .as_ref()
            .filter(|r| r.count == count && r.digest == digest(pages.iter().map(Vec::as_slice)));
        let set = kept.map_or_else(|| own.clone(), |r| r.set.clone());
        let stored = Stored {
            lease: ShardLease {
                exceptions: Vec::new(),
                ..lease.clone()
            },
            pages: Some(count),
            page_set: (set != own).then(|| set.clone()),
        };
        let row = serde_json::to_vec(&stored)
            .map_err(|e| Error::invalid_input("lease", format!("does not serialize: {e}")))?;
        let todo = if kept.is_some() {
            Vec::new()
        } else {
            let landed = self.landed_pages(shard, &set);
            (0..count)
                .filter(|i| landed.get(*i as usize) != Some(&page_digest(&pages[*i as usize])))
                .collect()
        };
        Ok(PreparedWrite {
            shard,
            expected,
            row,
            set: Some(set),
            pages,
            todo,
        })
    }

    /// Sends the next pages of `write` that are not known to have landed, at
    /// most [`PAGE_CALL_BYTES`] in one [`LeaseTable::write_pages`] call (one
    /// store call: bound it with the table's operation timeout). `Ok(true)`
    /// while pages are left to send.
    ///
    /// # Errors
    /// A backend error (some of this call's pages may have been written: the
    /// next attempt sends them again).
    pub async fn send_pages(&self, write: &mut PreparedWrite) -> Result<bool> {
        let Some(set) = write.set.clone() else {
            return Ok(false);
        };
        let Some(&first) = write.todo.first() else {
            return Ok(false);
        };
        // A run of consecutive pages from `first`, within the call's bytes.
        let mut n = 0usize;
        let mut bytes = 0usize;
        while let Some(&i) = write.todo.get(n) {
            let len = write.pages[i as usize].len();
            if i != first + n as u32 || (n > 0 && bytes + len > PAGE_CALL_BYTES) {
                break;
            }
            bytes += len;
            n += 1;
        }
        let range = first as usize..first as usize + n;
        self.table
            .write_pages(write.shard, &set, first, &write.pages[range.clone()])
            .await?;
        self.record_landed(write.shard, &set, first, &write.pages[range]);
        write.todo.drain(..n);
        Ok(!write.todo.is_empty())
    }

    /// Writes the row of `write` by compare-and-set, once every page was sent
    /// ([`send_pages`](Self::send_pages)): `Ok(Ok(new etag))` when written,
    /// `Ok(Err(current etag))` when another write came first. One store call.
    /// What to clean up after a written row is left in `write`
    /// ([`cleanup`](Self::cleanup)).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] when pages are left to send; a backend error.
    pub async fn commit(&self, write: &PreparedWrite) -> Result<std::result::Result<Etag, Option<Etag>>> {
        if !write.todo.is_empty() {
            return Err(Error::invalid_input(
                "lease",
                format!(
                    "{} pages of shard {} are not written yet",
                    write.todo.len(),
                    write.shard
                ),
            ));
        }
        match self
            .table
            .write_lease(write.shard, &write.expected, &write.row)
            .await?
        {
            LeaseWrite::Written(e) => Ok(Ok(e)),
            // Another write came first: our pages may be the winner's too (the
            // acquirers of one epoch write the same set), so they stay.
            LeaseWrite::Conflict(c) => Ok(Err(c)),
        }
    }

    /// After [`commit`](Self::commit) wrote the row of `write`: deletes the
    /// pages of the shard the row no longer names, if it or the row before
    /// it had pages (one store call). Best effort: a failure is logged, and a
    /// later paged write of the shard deletes them.
    pub async fn cleanup(&self, write: &PreparedWrite) {
        let paged = write.set.is_some();
        let was = self.set_paged(write.shard, paged);
        self.forget_landed_but(write.shard, write.set.as_deref().unwrap_or_default());
        if paged || was {
            if let Err(err) = self.table.delete_pages(write.shard, write.set.as_deref()).await {
                tracing::warn!(service = %self.table.service_id(), shard = write.shard, error = %err,
                    "lease pages the row no longer names were not deleted; a later paged write deletes them");
            }
        }
    }

    /// [`prepare`](Self::prepare), every [`send_pages`](Self::send_pages),
    /// [`commit`](Self::commit) and [`cleanup`](Self::cleanup) in one call:
    /// `Ok(Ok(new etag))` when written, `Ok(Err(current etag))` when another
    /// write came first. Its time is not bounded by one store call's: a
    /// caller with a deadline per store call drives the steps itself.
    ///
    /// # Errors
    /// As [`prepare`](Self::prepare) and [`send_pages`](Self::send_pages).
    pub async fn write(&self, lease: &ShardLease) -> Result<std::result::Result<Etag, Option<Etag>>> {
        let mut write = self.prepare(lease)?;
        while self.send_pages(&mut write).await? {}
        let result = self.commit(&write).await?;
        if result.is_ok() {
            self.cleanup(&write).await;
        }
        Ok(result)
    }

    fn landed_pages(&self, shard: u32, set: &str) -> Vec<u64> {
        let landed = self
            .landed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match landed.get(&shard) {
            Some((s, digests)) if s == set => digests.clone(),
            _ => Vec::new(),
        }
    }

    fn record_landed(&self, shard: u32, set: &str, first: u32, pages: &[Vec<u8>]) {
        let mut landed = self
            .landed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let entry = landed
            .entry(shard)
            .or_insert_with(|| (set.to_owned(), Vec::new()));
        if entry.0 != set {
            *entry = (set.to_owned(), Vec::new());
        }
        let end = first as usize + pages.len();
        if entry.1.len() < end {
            entry.1.resize(end, 0);
        }
        for (i, p) in pages.iter().enumerate() {
            entry.1[first as usize + i] = page_digest(p);
        }
    }

    /// Forgets the landed pages of `shard` unless they are of `set` (`""`:
    /// whatever they are of).
    fn forget_landed_but(&self, shard: u32, set: &str) {
        let mut landed = self
            .landed
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        if landed.get(&shard).is_some_and(|(s, _)| s != set) {
            landed.remove(&shard);
        }
    }
}

/// A lease write planned by [`ShardLeases::prepare`]: the row, and the pages
/// still to send when its exceptions do not fit it.
#[derive(Debug)]
pub struct PreparedWrite {
    shard: u32,
    expected: Expected,
    row: Vec<u8>,
    /// The page set the row names, if it has pages.
    set: Option<String>,
    pages: Vec<Vec<u8>>,
    /// Indexes of the pages still to send, ascending.
    todo: Vec<u32>,
}

impl PreparedWrite {
    /// The shard.
    pub fn shard(&self) -> u32 {
        self.shard
    }

    /// How many pages are still to send (0: the row is next).
    pub fn pages_left(&self) -> usize {
        self.todo.len()
    }

    /// The page set the row names (`None`: the exceptions fit the row).
    pub fn page_set(&self) -> Option<&str> {
        self.set.as_deref()
    }
}

#[cfg(test)]
mod page_tests {
    use super::*;

    /// `n` exceptions shaped like a mass-due release: hashed 24-byte actor
    /// ids, one reminder name, one due time, a store revision as etag.
    fn release_shaped(n: usize) -> Vec<LeaseException> {
        (0..n)
            .map(|i| LeaseException {
                actor_id: format!("{:024x}", xxhash_rust::xxh3::xxh3_128(&i.to_le_bytes())),
                name: "due".to_owned(),
                next: Timestamp::from_millis(1_796_650_564_872),
                etag: Some(Etag::new((700_000 + i).to_string())),
                done: false,
            })
            .collect()
    }

    #[test]
    fn pages_round_trip_compressed_and_plain() {
        let owed = release_shaped(18_000);
        let pages = paginate(0, &owed).unwrap();
        let raw: usize = owed
            .iter()
            .map(|e| serde_json::to_vec(e).unwrap().len() + 1)
            .sum();
        let stored: usize = pages.iter().map(Vec::len).sum();
        assert!(pages.iter().all(|p| p.starts_with(&GZIP_MAGIC)));
        // Hashed ids are the incompressible part: 24 hex digits of 60-odd bytes.
        eprintln!("{} pages: {stored} of {raw} bytes", pages.len());
        assert!(stored * 2 < raw, "{stored} of {raw} bytes");
        let back: Vec<LeaseException> = pages.iter().flat_map(|p| page_exceptions(p).unwrap()).collect();
        assert_eq!(back, owed);
        // A page written before compression reads as before.
        let plain = serde_json::to_vec(&owed[..10]).unwrap();
        assert_eq!(page_exceptions(&plain).unwrap(), owed[..10]);
        // Equal input, equal bytes: a retry recognises what landed.
        assert_eq!(paginate(0, &owed).unwrap(), pages);
    }

    #[test]
    fn a_page_that_does_not_shrink_stays_json() {
        let one = release_shaped(1);
        let pages = paginate(0, &one).unwrap();
        assert_eq!(pages.len(), 1);
        assert_eq!(pages[0][0], b'[', "{} bytes", pages[0].len());
    }
}
