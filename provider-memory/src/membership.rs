//! The membership table (with the version row and the history) of one cluster.

use std::collections::VecDeque;
use std::sync::Arc;

use async_trait::async_trait;
use rollcall_core::{
    history::{history_floor, require_history},
    HistoryQuery, MembershipDelta, MembershipEntry, MembershipEvent, MembershipRow, MembershipRows,
    MembershipSnapshot, MembershipTable, ProtocolMode, Result, SiloAddress, TableVersion, Timestamp,
    WriteKind, WriteMode, WriteOrigin,
};

use crate::{lock, MemoryStore};

#[derive(Debug, Default)]
pub(crate) struct Cluster {
    pub(crate) version: TableVersion,
    /// A persistent map, so that `read_all` and `read_delta` hand out the rows in
    /// O(1), sharing every node with the table and with each other.
    pub(crate) rows: MembershipRows,
    /// The membership history, oldest first (extended mode).
    pub(crate) history: VecDeque<MembershipEvent>,
}

/// The membership table of one cluster in a [`MemoryStore`].
#[derive(Clone, Debug)]
pub struct MemoryMembershipTable {
    pub(crate) store: MemoryStore,
    pub(crate) cluster_id: String,
    pub(crate) mode: ProtocolMode,
}

impl MemoryMembershipTable {
    /// Stores the row, the version row and (extended mode) the history event: the
    /// caller holds the store's lock and has checked the preconditions.
    fn commit(
        &self,
        cluster: &mut Cluster,
        entry: &MembershipEntry,
        next: &TableVersion,
        kind: WriteKind,
        origin: &WriteOrigin,
    ) {
        let etag = self.store.new_etag();
        cluster
            .rows
            .insert(Arc::new(MembershipRow::new(entry.clone(), etag)));
        if self.mode == ProtocolMode::Extended {
            cluster.version = TableVersion {
                version: next.version,
                etag: self.store.new_etag(),
            };
            let capacity = self.store.inner.history_capacity;
            if capacity > 0 {
                cluster
                    .history
                    .push_back(MembershipEvent::of(entry, kind, next, origin));
            }
            let floor = history_floor(next.version, capacity);
            while cluster.history.front().is_some_and(|e| e.version < floor) {
                cluster.history.pop_front();
            }
        }
    }
}

#[async_trait]
impl MembershipTable for MemoryMembershipTable {
    fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    async fn init(&self, _try_create: bool) -> Result<()> {
        self.store.with_cluster(&self.cluster_id, |_| ())
    }

    async fn read_row(&self, silo: &SiloAddress) -> Result<MembershipSnapshot> {
        self.store.with_cluster(&self.cluster_id, |c| MembershipSnapshot {
            version: c.version.clone(),
            entries: c.rows.get(silo).cloned().into_iter().collect(),
            // Rows are stored typed: nothing here can fail to decode.
            ..Default::default()
        })
    }

    async fn read_all(&self) -> Result<MembershipSnapshot> {
        self.store.with_cluster(&self.cluster_id, |c| MembershipSnapshot {
            version: c.version.clone(),
            entries: c.rows.clone(),
            ..Default::default()
        })
    }

    /// Answers every delta with the whole table (`complete`): handing out the
    /// persistent map costs O(1), less than building the k changed rows would, and
    /// a silo that adopts it shares every node with the table and with the other
    /// silos of the process, where k merged rows would copy O(k log N) nodes into
    /// a view of its own (N silos in one process then hold N^2 rows' worth).
    async fn read_delta(&self, _since: &TableVersion) -> Result<MembershipDelta> {
        self.store.with_cluster(&self.cluster_id, |c| MembershipDelta {
            version: c.version.clone(),
            changed: c.rows.clone(),
            corrupt: Vec::new(),
            complete: true,
        })
    }

    async fn write_row(
        &self,
        entry: &MembershipEntry,
        mode: WriteMode<'_>,
        next_version: &TableVersion,
        origin: &WriteOrigin,
    ) -> Result<bool> {
        entry.validate()?;
        self.store.with_cluster(&self.cluster_id, |c| {
            let row_ok = match (mode, c.rows.get(&entry.silo)) {
                (WriteMode::Insert, row) => row.is_none(),
                (WriteMode::Update(etag), Some(row)) => row.etag == *etag,
                (WriteMode::Update(_), None) => false,
            };
            if !row_ok || !c.version.admits(next_version, self.mode) {
                return false;
            }
            self.commit(c, entry, next_version, mode.kind(), origin);
            true
        })
    }

    async fn read_history(&self, query: &HistoryQuery) -> Result<Vec<MembershipEvent>> {
        require_history(self.mode)?;
        self.store.with_cluster(&self.cluster_id, |c| {
            let start = c.history.partition_point(|e| e.version < query.from_version);
            query.select(c.history.range(start..).cloned())
        })
    }

    async fn update_i_am_alive(&self, silo: &SiloAddress, time: Timestamp) -> Result<()> {
        self.store.with_cluster(&self.cluster_id, |c| {
            if let Some(row) = c.rows.get_mut(silo) {
                row.entry.i_am_alive_time = time;
            }
        })
    }

    async fn cleanup_defunct(&self, before: Timestamp) -> Result<usize> {
        self.store.with_cluster(&self.cluster_id, |c| {
            let defunct: Vec<SiloAddress> = c
                .rows
                .iter()
                .filter(|row| row.entry.is_defunct(before))
                .map(|row| row.entry.silo)
                .collect();
            for s in &defunct {
                c.rows.remove(s);
            }
            defunct.len()
        })
    }

    async fn delete_all(&self) -> Result<()> {
        self.store.check_available()?;
        lock(&self.store.inner.clusters).remove(&self.cluster_id);
        Ok(())
    }
}
