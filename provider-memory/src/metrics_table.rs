//! The silo and client metrics table of one cluster.

use std::collections::BTreeMap;

use async_trait::async_trait;
use rollcall_core::{MetricsReport, MetricsRole, MetricsRow, MetricsTable, Result};

use crate::{lock, MemoryStore};

/// Metrics rows of one cluster, keyed by (role, id).
pub(crate) type MetricsRows = BTreeMap<(MetricsRole, String), MetricsRow>;

/// The metrics table of one cluster in a [`MemoryStore`].
#[derive(Clone, Debug)]
pub struct MemoryMetricsTable {
    pub(crate) store: MemoryStore,
    pub(crate) cluster_id: String,
}

impl MemoryMetricsTable {
    fn with_rows<R>(
        &self,
        f: impl FnOnce(&mut BTreeMap<(MetricsRole, String), MetricsRow>) -> R,
    ) -> Result<R> {
        self.store.check_available()?;
        let mut all = lock(&self.store.inner.metrics);
        Ok(f(all.entry(self.cluster_id.clone()).or_default()))
    }
}

#[async_trait]
impl MetricsTable for MemoryMetricsTable {
    fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    async fn upsert(&self, row: &MetricsRow) -> Result<()> {
        row.validate()?;
        self.with_rows(|rows| {
            rows.insert((row.role, row.id.clone()), row.clone());
        })
    }

    async fn read_all(&self) -> Result<MetricsReport> {
        self.with_rows(|rows| MetricsReport {
            rows: rows.values().cloned().collect(),
            corrupt: Vec::new(),
        })
    }

    async fn remove(&self, role: MetricsRole, id: &str) -> Result<bool> {
        self.with_rows(|rows| rows.remove(&(role, id.to_owned())).is_some())
    }

    async fn clear(&self) -> Result<()> {
        self.with_rows(BTreeMap::clear)
    }
}
