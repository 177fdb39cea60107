//! Reminder shard leases in memory: per service, its shard count and one row
//! per shard, under one lock (so a compare-and-set is atomic).

use std::collections::BTreeMap;

use async_trait::async_trait;
use rollcall_core::lease::{LeaseTable, LeaseWrite};
use rollcall_core::{Etag, Expected, Result};

use crate::{lock, MemoryStore};

/// The leases of one service.
#[derive(Debug, Default)]
pub(crate) struct Leases {
    shards: Option<u32>,
    rows: BTreeMap<u32, (Vec<u8>, Etag)>,
    /// Each row's fence token, written with it.
    fences: BTreeMap<u32, u64>,
    /// Pages by (shard, set, index).
    pages: BTreeMap<(u32, String, u32), Vec<u8>>,
}

impl Leases {
    /// The fence token of `shard`'s row: its epoch while held.
    pub(crate) fn fence(&self, shard: u32) -> Option<u64> {
        self.fences.get(&shard).copied()
    }
}

/// The shard lease rows of one reminder service in a [`MemoryStore`].
#[derive(Clone, Debug)]
pub struct MemoryLeaseTable {
    pub(crate) store: MemoryStore,
    pub(crate) service_id: String,
}

impl MemoryLeaseTable {
    fn with<R>(&self, f: impl FnOnce(&mut Leases) -> R) -> Result<R> {
        self.store.check_available()?;
        let mut all = lock(&self.store.inner.leases);
        Ok(f(all.entry(self.service_id.clone()).or_default()))
    }
}

#[async_trait]
impl LeaseTable for MemoryLeaseTable {
    fn service_id(&self) -> &str {
        &self.service_id
    }

    async fn shard_count(&self, shards: u32) -> Result<u32> {
        self.with(|l| *l.shards.get_or_insert(shards))
    }

    async fn read_lease(&self, shard: u32) -> Result<Option<(Vec<u8>, Etag)>> {
        self.with(|l| l.rows.get(&shard).cloned())
    }

    async fn write_lease(&self, shard: u32, expected: &Expected, row: &[u8]) -> Result<LeaseWrite> {
        rollcall_core::lease::check_row(shard, row)?;
        let etag = self.store.new_etag();
        let token = rollcall_core::lease::fence_token(row);
        self.with(|l| {
            let current = l.rows.get(&shard).map(|(_, e)| e.clone());
            let ok = match expected {
                Expected::Any => true,
                Expected::Absent => current.is_none(),
                Expected::Etag(e) => current.as_ref() == Some(e),
            };
            if !ok {
                return LeaseWrite::Conflict(current);
            }
            l.rows.insert(shard, (row.to_vec(), etag.clone()));
            match token {
                Some(t) => l.fences.insert(shard, t),
                None => l.fences.remove(&shard),
            };
            LeaseWrite::Written(etag)
        })
    }

    async fn write_pages(&self, shard: u32, set: &str, first: u32, pages: &[Vec<u8>]) -> Result<()> {
        for page in pages {
            rollcall_core::lease::check_row(shard, page)?;
        }
        self.with(|l| {
            for (i, page) in pages.iter().enumerate() {
                l.pages
                    .insert((shard, set.to_owned(), first + i as u32), page.clone());
            }
        })
    }

    async fn read_pages(&self, shard: u32, set: &str, count: u32) -> Result<Vec<Option<Vec<u8>>>> {
        self.with(|l| {
            (0..count)
                .map(|i| l.pages.get(&(shard, set.to_owned(), i)).cloned())
                .collect()
        })
    }

    async fn delete_pages(&self, shard: u32, keep: Option<&str>) -> Result<()> {
        self.with(|l| {
            l.pages
                .retain(|(k, set, _), _| *k != shard || Some(set.as_str()) == keep);
        })
    }

    async fn clear(&self) -> Result<()> {
        self.store.check_available()?;
        lock(&self.store.inner.leases).remove(&self.service_id);
        Ok(())
    }
}
