//! A [`SystemStore`] decorator that counts the membership table calls made through
//! it (full reads, delta reads, row reads, writes and their conflicts, IAmAlive
//! writes) and the reminder and shard-lease calls ([`ReminderCounts`]), over any
//! real store: what silos cost their store. Optionally it delays
//! every membership call by a fixed store latency, measured on tokio's clock (so in
//! virtual time when the runtime's clock is paused).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use rollcall_core::lease::{LeaseTable, LeaseWrite};
use rollcall_core::{
    Etag, Expected, HistoryQuery, MembershipDelta, MembershipEntry, MembershipEvent, MembershipSnapshot,
    MembershipTable, ProtocolMode, ReminderEntry, ReminderTable, Result, SiloAddress, SystemStore,
    TableVersion, Timestamp, WriteMode, WriteOrigin,
};

/// Calls counted by a [`CountingStore`], over all its membership tables.
#[derive(Debug, Default)]
pub struct Counts {
    /// `read_all` calls.
    pub read_all: AtomicU64,
    /// `read_delta` calls.
    pub read_delta: AtomicU64,
    /// `read_row` calls.
    pub read_row: AtomicU64,
    /// `insert_row` and `update_row` calls.
    pub writes: AtomicU64,
    /// `insert_row` and `update_row` calls that answered `Ok(false)` (a conflict).
    pub conflicts: AtomicU64,
    /// `update_i_am_alive` calls.
    pub i_am_alive: AtomicU64,
}

/// A copy of the [`Counts`] at one instant (subtract two to count an interval).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct CountsSnapshot {
    /// `read_all` calls.
    pub read_all: u64,
    /// `read_delta` calls.
    pub read_delta: u64,
    /// `read_row` calls.
    pub read_row: u64,
    /// Row writes (inserts and updates).
    pub writes: u64,
    /// Row writes that conflicted.
    pub conflicts: u64,
    /// IAmAlive writes.
    pub i_am_alive: u64,
}

impl CountsSnapshot {
    /// Row writes that committed.
    pub fn commits(&self) -> u64 {
        self.writes - self.conflicts
    }

    /// Every table call counted (reads of all kinds, writes, IAmAlive).
    pub fn calls(&self) -> u64 {
        self.read_all + self.read_delta + self.read_row + self.writes + self.i_am_alive
    }

    /// `self - earlier`, field by field.
    pub fn since(&self, earlier: &CountsSnapshot) -> CountsSnapshot {
        CountsSnapshot {
            read_all: self.read_all - earlier.read_all,
            read_delta: self.read_delta - earlier.read_delta,
            read_row: self.read_row - earlier.read_row,
            writes: self.writes - earlier.writes,
            conflicts: self.conflicts - earlier.conflicts,
            i_am_alive: self.i_am_alive - earlier.i_am_alive,
        }
    }
}

impl Counts {
    /// `read_all` calls so far.
    pub fn read_alls(&self) -> u64 {
        self.read_all.load(Ordering::SeqCst)
    }

    /// Table reads of any kind so far (`read_all`, `read_delta`, `read_row`).
    pub fn reads(&self) -> u64 {
        let s = self.snapshot();
        s.read_all + s.read_delta + s.read_row
    }

    /// Every counter, now.
    pub fn snapshot(&self) -> CountsSnapshot {
        let get = |c: &AtomicU64| c.load(Ordering::SeqCst);
        CountsSnapshot {
            read_all: get(&self.read_all),
            read_delta: get(&self.read_delta),
            read_row: get(&self.read_row),
            writes: get(&self.writes),
            conflicts: get(&self.conflicts),
            i_am_alive: get(&self.i_am_alive),
        }
    }
}

/// Reminder-table and shard-lease calls counted by a [`CountingStore`].
#[derive(Debug, Default)]
pub struct ReminderCounts {
    /// `read_lease` calls.
    pub lease_reads: AtomicU64,
    /// `write_lease` calls (compare-and-sets).
    pub lease_writes: AtomicU64,
    /// Reminder row reads: `read_rows_in_range`, `read_rows_for`, `read_row`.
    pub row_reads: AtomicU64,
    /// Reminder rows returned by those reads.
    pub rows_read: AtomicU64,
    /// Reminder row writes: `upsert_row`, `remove_row`, `update_last_fired`.
    pub row_writes: AtomicU64,
}

impl ReminderCounts {
    /// `[lease reads, lease writes, row reads, rows read, row writes]` now.
    pub fn snapshot(&self) -> [u64; 5] {
        [
            &self.lease_reads,
            &self.lease_writes,
            &self.row_reads,
            &self.rows_read,
            &self.row_writes,
        ]
        .map(|c| c.load(Ordering::SeqCst))
    }
}

/// Counts the membership, reminder and lease calls on `inner`.
#[derive(Debug, Clone)]
pub struct CountingStore {
    inner: Arc<dyn SystemStore>,
    latency: Duration,
    /// The membership counters.
    pub counts: Arc<Counts>,
    /// The reminder and lease counters.
    pub reminder_counts: Arc<ReminderCounts>,
}

impl CountingStore {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn SystemStore>) -> Self {
        CountingStore {
            inner,
            latency: Duration::ZERO,
            counts: Arc::default(),
            reminder_counts: Arc::default(),
        }
    }

    /// Delays every membership table call by `latency` before it reaches the inner
    /// store (a `tokio::time::sleep`: virtual time under a paused clock). Models a
    /// store one network round trip away when the inner store is in memory.
    pub fn with_latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }
}

impl SystemStore for CountingStore {
    fn provider(&self) -> &'static str {
        self.inner.provider()
    }

    fn key_limits(&self) -> rollcall_core::KeyLimits {
        self.inner.key_limits()
    }

    fn membership_table(&self, cluster_id: &str, mode: ProtocolMode) -> Result<Arc<dyn MembershipTable>> {
        Ok(Arc::new(CountingTable {
            inner: self.inner.membership_table(cluster_id, mode)?,
            counts: self.counts.clone(),
            latency: self.latency,
        }))
    }

    fn reminder_table(&self, service_id: &str) -> Result<Arc<dyn ReminderTable>> {
        Ok(Arc::new(CountingReminders {
            inner: self.inner.reminder_table(service_id)?,
            counts: self.reminder_counts.clone(),
        }))
    }

    fn lease_table(&self, service_id: &str) -> Result<Arc<dyn LeaseTable>> {
        Ok(Arc::new(CountingLeases {
            inner: self.inner.lease_table(service_id)?,
            counts: self.reminder_counts.clone(),
        }))
    }
}

fn bump(c: &AtomicU64) {
    c.fetch_add(1, Ordering::SeqCst);
}

#[derive(Debug)]
struct CountingReminders {
    inner: Arc<dyn ReminderTable>,
    counts: Arc<ReminderCounts>,
}

impl CountingReminders {
    fn read(&self, rows: Result<Vec<ReminderEntry>>) -> Result<Vec<ReminderEntry>> {
        bump(&self.counts.row_reads);
        if let Ok(r) = &rows {
            self.counts.rows_read.fetch_add(r.len() as u64, Ordering::SeqCst);
        }
        rows
    }
}

#[async_trait]
impl ReminderTable for CountingReminders {
    fn service_id(&self) -> &str {
        self.inner.service_id()
    }
    async fn init(&self) -> Result<()> {
        self.inner.init().await
    }
    async fn read_rows_for(&self, actor_id: &str) -> Result<Vec<ReminderEntry>> {
        self.read(self.inner.read_rows_for(actor_id).await)
    }
    async fn read_rows_in_range(&self, begin: u32, end: u32) -> Result<Vec<ReminderEntry>> {
        self.read(self.inner.read_rows_in_range(begin, end).await)
    }
    async fn read_row(&self, actor_id: &str, name: &str) -> Result<Option<ReminderEntry>> {
        bump(&self.counts.row_reads);
        self.inner.read_row(actor_id, name).await
    }
    async fn upsert_row(&self, entry: &ReminderEntry) -> Result<Etag> {
        bump(&self.counts.row_writes);
        self.inner.upsert_row(entry).await
    }
    async fn remove_row(
        &self,
        actor_id: &str,
        name: &str,
        etag: &Etag,
        fence: Option<&rollcall_core::Fence>,
    ) -> Result<bool> {
        bump(&self.counts.row_writes);
        self.inner.remove_row(actor_id, name, etag, fence).await
    }
    async fn append_run(
        &self,
        actor_id: &str,
        name: &str,
        run: &rollcall_core::RunRecord,
        keep: usize,
        fence: Option<&rollcall_core::Fence>,
    ) -> Result<()> {
        bump(&self.counts.row_writes);
        self.inner.append_run(actor_id, name, run, keep, fence).await
    }
    async fn read_runs(&self, actor_id: &str, name: &str) -> Result<Vec<rollcall_core::RunRecord>> {
        self.inner.read_runs(actor_id, name).await
    }
    async fn remove_runs(&self, actor_id: &str, name: &str) -> Result<()> {
        bump(&self.counts.row_writes);
        self.inner.remove_runs(actor_id, name).await
    }
    async fn update_paused(
        &self,
        actor_id: &str,
        name: &str,
        etag: &Etag,
        paused: Option<Timestamp>,
    ) -> Result<bool> {
        bump(&self.counts.row_writes);
        self.inner.update_paused(actor_id, name, etag, paused).await
    }
    async fn update_last_fired(
        &self,
        actor_id: &str,
        name: &str,
        etag: &Etag,
        fired_at: Timestamp,
        fence: Option<&rollcall_core::Fence>,
    ) -> Result<bool> {
        bump(&self.counts.row_writes);
        self.inner
            .update_last_fired(actor_id, name, etag, fired_at, fence)
            .await
    }
    async fn clear(&self) -> Result<()> {
        self.inner.clear().await
    }
}

#[derive(Debug)]
struct CountingLeases {
    inner: Arc<dyn LeaseTable>,
    counts: Arc<ReminderCounts>,
}

#[async_trait]
impl LeaseTable for CountingLeases {
    fn service_id(&self) -> &str {
        self.inner.service_id()
    }
    async fn shard_count(&self, shards: u32) -> Result<u32> {
        self.inner.shard_count(shards).await
    }
    async fn read_lease(&self, shard: u32) -> Result<Option<(Vec<u8>, Etag)>> {
        bump(&self.counts.lease_reads);
        self.inner.read_lease(shard).await
    }
    async fn write_pages(&self, shard: u32, set: &str, first: u32, pages: &[Vec<u8>]) -> Result<()> {
        self.inner.write_pages(shard, set, first, pages).await
    }
    async fn read_pages(&self, shard: u32, set: &str, count: u32) -> Result<Vec<Option<Vec<u8>>>> {
        self.inner.read_pages(shard, set, count).await
    }
    async fn delete_pages(&self, shard: u32, keep: Option<&str>) -> Result<()> {
        self.inner.delete_pages(shard, keep).await
    }
    async fn write_lease(&self, shard: u32, expected: &Expected, row: &[u8]) -> Result<LeaseWrite> {
        bump(&self.counts.lease_writes);
        self.inner.write_lease(shard, expected, row).await
    }
    async fn clear(&self) -> Result<()> {
        self.inner.clear().await
    }
}

#[derive(Debug)]
struct CountingTable {
    inner: Arc<dyn MembershipTable>,
    counts: Arc<Counts>,
    latency: Duration,
}

impl CountingTable {
    async fn delay(&self, counter: &AtomicU64) {
        counter.fetch_add(1, Ordering::SeqCst);
        if !self.latency.is_zero() {
            tokio::time::sleep(self.latency).await;
        }
    }

    fn settle(&self, written: Result<bool>) -> Result<bool> {
        if matches!(written, Ok(false)) {
            self.counts.conflicts.fetch_add(1, Ordering::SeqCst);
        }
        written
    }
}

#[async_trait]
impl MembershipTable for CountingTable {
    fn cluster_id(&self) -> &str {
        self.inner.cluster_id()
    }
    async fn init(&self, try_create: bool) -> Result<()> {
        self.inner.init(try_create).await
    }
    async fn read_row(&self, silo: &SiloAddress) -> Result<MembershipSnapshot> {
        self.delay(&self.counts.read_row).await;
        self.inner.read_row(silo).await
    }
    async fn read_all(&self) -> Result<MembershipSnapshot> {
        self.delay(&self.counts.read_all).await;
        self.inner.read_all().await
    }
    async fn read_delta(&self, since: &TableVersion) -> Result<MembershipDelta> {
        self.delay(&self.counts.read_delta).await;
        self.inner.read_delta(since).await
    }
    async fn write_row(
        &self,
        entry: &MembershipEntry,
        mode: WriteMode<'_>,
        next_version: &TableVersion,
        origin: &WriteOrigin,
    ) -> Result<bool> {
        self.delay(&self.counts.writes).await;
        self.settle(self.inner.write_row(entry, mode, next_version, origin).await)
    }
    async fn read_history(&self, query: &HistoryQuery) -> Result<Vec<MembershipEvent>> {
        self.inner.read_history(query).await
    }
    async fn update_i_am_alive(&self, silo: &SiloAddress, time: Timestamp) -> Result<()> {
        self.delay(&self.counts.i_am_alive).await;
        self.inner.update_i_am_alive(silo, time).await
    }
    async fn cleanup_defunct(&self, before: Timestamp) -> Result<usize> {
        self.inner.cleanup_defunct(before).await
    }
    async fn delete_all(&self) -> Result<()> {
        self.inner.delete_all().await
    }
}
