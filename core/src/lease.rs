//! Reminder shard leases: who owns each shard of a reminder service, held in the
//! store rather than in peer messages.
//!
//! A reminder service has a fixed number of shards S (recorded in the store
//! when the service is first used: [`ShardLeases::open`]); shard `k` holds the
//! actors [`actor_shard`](crate::actor_shard) maps to `k`. Each shard has one
//! lease row ([`ShardLease`]), written only by conditional writes on its etag:
//! its `epoch` (the fencing token, one more on every acquire), its `owner`,
//! whether it is [`LeaseStatus::Owned`] or [`LeaseStatus::Released`], the
//! watermark `W` (every occurrence at or before `W` of every reminder of the
//! shard was delivered or started; none after it was started), the exceptions
//! (reminders whose first undelivered occurrence is at or before `W`), and the
//! registrations the holder knew of.
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
    /// Reminders whose first undelivered occurrence is at or before the watermark.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub exceptions: Vec<LeaseException>,
    /// When the holder's last full read of the shard's reminder rows started
    /// (UTC ms): a row registered later that the holder never saw starts at its
    /// first tick.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub read_from: Option<Timestamp>,
    /// The etag as last read or written (not stored in the row).
    #[serde(skip)]
    pub etag: Etag,
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
            etag: Etag::default(),
        }
    }

    /// The row's bytes (JSON).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] (`lease`) when the row would exceed
    /// [`MAX_LEASE_BYTES`] (too many exceptions).
    pub fn encode(&self) -> Result<Vec<u8>> {
        let bytes = serde_json::to_vec(self)
            .map_err(|e| Error::invalid_input("lease", format!("does not serialize: {e}")))?;
        check_row(self.shard, &bytes)?;
        Ok(bytes)
    }

    /// The row of `shard` from its stored `bytes` and `etag`.
    ///
    /// # Errors
    /// [`Error::Corrupt`] naming the shard when the bytes are not a lease row or
    /// are the row of another shard.
    pub fn decode(service_id: &str, shard: u32, bytes: &[u8], etag: Etag) -> Result<ShardLease> {
        let what = || format!("lease {service_id}/{shard}");
        let mut lease: ShardLease = serde_json::from_slice(bytes).map_err(|e| Error::corrupt(what(), e))?;
        if lease.shard != shard {
            return Err(Error::corrupt(
                what(),
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

    /// Deletes every row and the shard count of this service (tests, tooling).
    async fn clear(&self) -> Result<()>;
}

/// Typed access to a service's leases: rows decoded, checked, and the shard
/// count agreed. Cheap to clone.
#[derive(Clone, Debug)]
pub struct ShardLeases {
    table: std::sync::Arc<dyn LeaseTable>,
    shards: u32,
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
        Ok(ShardLeases { table, shards })
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

    /// The lease of `shard`, [`ShardLease::vacant`] (empty etag) when it has no
    /// row.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a shard out of range; [`Error::Corrupt`]
    /// for a row that does not decode; a backend error.
    pub async fn read(&self, shard: u32) -> Result<ShardLease> {
        self.check(shard)?;
        match self.table.read_lease(shard).await? {
            Some((bytes, etag)) => ShardLease::decode(self.table.service_id(), shard, &bytes, etag),
            None => Ok(ShardLease::vacant(shard)),
        }
    }

    /// Writes `lease` over the row it was read from (its etag; an empty etag:
    /// no row). `Ok(Ok(new etag))` when written, `Ok(Err(current etag))` when
    /// another write came first.
    ///
    /// # Errors
    /// As [`read`](Self::read); [`Error::InvalidInput`] for a row too large.
    pub async fn write(&self, lease: &ShardLease) -> Result<std::result::Result<Etag, Option<Etag>>> {
        self.check(lease.shard)?;
        let bytes = lease.encode()?;
        let expected = if lease.etag.is_empty() {
            Expected::Absent
        } else {
            Expected::Etag(lease.etag.clone())
        };
        Ok(
            match self.table.write_lease(lease.shard, &expected, &bytes).await? {
                LeaseWrite::Written(e) => Ok(e),
                LeaseWrite::Conflict(c) => Err(c),
            },
        )
    }
}
