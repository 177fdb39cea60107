//! A [`SystemStore`] decorator that counts the membership table calls made through
//! it (reads, writes), over any real store: what a silo costs its store.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use rollcall_membership_core::{
    Etag, MembershipEntry, MembershipSnapshot, MembershipTable, ProtocolMode, ReminderTable, Result,
    SiloAddress, SystemStore, TableVersion, Timestamp,
};

/// Calls counted by a [`CountingStore`], over all its membership tables.
#[derive(Debug, Default)]
pub struct Counts {
    /// `read_all` calls.
    pub read_all: AtomicU64,
    /// `read_row` calls.
    pub read_row: AtomicU64,
    /// `insert_row` and `update_row` calls.
    pub writes: AtomicU64,
}

impl Counts {
    /// `read_all` calls so far.
    pub fn read_alls(&self) -> u64 {
        self.read_all.load(Ordering::SeqCst)
    }
}

/// Counts the membership calls on `inner`.
#[derive(Debug, Clone)]
pub struct CountingStore {
    inner: Arc<dyn SystemStore>,
    /// The counters.
    pub counts: Arc<Counts>,
}

impl CountingStore {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn SystemStore>) -> Self {
        CountingStore {
            inner,
            counts: Arc::default(),
        }
    }
}

impl SystemStore for CountingStore {
    fn provider(&self) -> &'static str {
        self.inner.provider()
    }

    fn membership_table(&self, cluster_id: &str, mode: ProtocolMode) -> Result<Arc<dyn MembershipTable>> {
        Ok(Arc::new(CountingTable {
            inner: self.inner.membership_table(cluster_id, mode)?,
            counts: self.counts.clone(),
        }))
    }

    fn reminder_table(&self, service_id: &str) -> Result<Arc<dyn ReminderTable>> {
        self.inner.reminder_table(service_id)
    }
}

#[derive(Debug)]
struct CountingTable {
    inner: Arc<dyn MembershipTable>,
    counts: Arc<Counts>,
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
        self.counts.read_row.fetch_add(1, Ordering::SeqCst);
        self.inner.read_row(silo).await
    }
    async fn read_all(&self) -> Result<MembershipSnapshot> {
        self.counts.read_all.fetch_add(1, Ordering::SeqCst);
        self.inner.read_all().await
    }
    async fn insert_row(&self, entry: &MembershipEntry, next_version: &TableVersion) -> Result<bool> {
        self.counts.writes.fetch_add(1, Ordering::SeqCst);
        self.inner.insert_row(entry, next_version).await
    }
    async fn update_row(
        &self,
        entry: &MembershipEntry,
        etag: &Etag,
        next_version: &TableVersion,
    ) -> Result<bool> {
        self.counts.writes.fetch_add(1, Ordering::SeqCst);
        self.inner.update_row(entry, etag, next_version).await
    }
    async fn update_i_am_alive(&self, silo: &SiloAddress, time: Timestamp) -> Result<()> {
        self.inner.update_i_am_alive(silo, time).await
    }
    async fn cleanup_defunct(&self, before: Timestamp) -> Result<usize> {
        self.inner.cleanup_defunct(before).await
    }
    async fn delete_cluster(&self, cluster_id: &str) -> Result<()> {
        self.inner.delete_cluster(cluster_id).await
    }
}
