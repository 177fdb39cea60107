//! # rollcall-provider-memory
//!
//! In-process membership and reminder tables: the embedded default, the reference
//! implementation the other providers are compared against, and the store of tests
//! and simulations.
//!
//! A [`MemoryStore`] is a cheap-to-clone handle (an `Arc`) on one set of tables; many
//! silos in one process share it by cloning. Each cluster id and each service id is
//! isolated. Etags are drawn from one store-wide counter, so an etag is never reused.
//!
//! ```
//! use rollcall_core::{ProtocolMode, SystemStore};
//! use rollcall_provider_memory::MemoryStore;
//!
//! let store = MemoryStore::new();
//! let table = store.membership_table("my-cluster", ProtocolMode::Extended).unwrap();
//! assert_eq!(table.cluster_id(), "my-cluster");
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

mod lease;
mod state;
mod statistics;
pub use lease::MemoryLeaseTable;
pub use state::{MemoryStateTable, MEMORY_STATE_LIMITS};
pub use statistics::MemoryStatistics;

use std::collections::{BTreeMap, HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use async_trait::async_trait;
use rollcall_core::{
    actor_hash,
    history::{history_floor, require_history},
    validate_id, Error, Etag, HistoryQuery, MembershipDelta, MembershipEntry, MembershipEvent, MembershipRow,
    MembershipRows, MembershipSnapshot, MembershipTable, MetricsReport, MetricsRole, MetricsRow,
    MetricsTable, ProtocolMode, ReminderEntry, ReminderTable, Result, SiloAddress, SystemStore, TableVersion,
    Timestamp, WriteKind, WriteMode, WriteOrigin, DEFAULT_HISTORY_CAPACITY,
};

#[derive(Debug, Default)]
struct Cluster {
    version: TableVersion,
    /// A persistent map, so that `read_all` and `read_delta` hand out the rows in
    /// O(1), sharing every node with the table and with each other.
    rows: MembershipRows,
    /// The membership history, oldest first (extended mode).
    history: VecDeque<MembershipEvent>,
}

/// Metrics rows of one cluster, keyed by (role, id).
type MetricsRows = BTreeMap<(MetricsRole, String), MetricsRow>;

/// Reminders of one service, keyed by (hash, actor id, name) so that hash-range reads
/// are ordered range scans.
type Service = BTreeMap<(u32, String, String), ReminderEntry>;

#[derive(Debug)]
struct Inner {
    clusters: Mutex<HashMap<String, Cluster>>,
    services: Mutex<HashMap<String, Service>>,
    /// Metrics rows per cluster, keyed by (role, id).
    metrics: Mutex<HashMap<String, MetricsRows>>,
    /// Statistics per cluster.
    statistics: Mutex<HashMap<String, Arc<MemoryStatistics>>>,
    /// Grain-state rows per service.
    states: Mutex<HashMap<String, state::States>>,
    /// Shard leases per reminder service.
    leases: Mutex<HashMap<String, lease::Leases>>,
    next_etag: AtomicU64,
    unavailable: AtomicBool,
    history_capacity: u64,
}

impl Default for Inner {
    fn default() -> Self {
        Inner {
            clusters: Mutex::default(),
            services: Mutex::default(),
            metrics: Mutex::default(),
            statistics: Mutex::default(),
            states: Mutex::default(),
            leases: Mutex::default(),
            next_etag: AtomicU64::new(0),
            unavailable: AtomicBool::new(false),
            history_capacity: DEFAULT_HISTORY_CAPACITY,
        }
    }
}

/// The in-memory [`SystemStore`]. Clone it to share the same tables.
///
/// Each cluster keeps the last [`DEFAULT_HISTORY_CAPACITY`] membership-history events
/// unless built with [`with_history_capacity`](Self::with_history_capacity).
#[derive(Clone, Debug, Default)]
pub struct MemoryStore {
    inner: Arc<Inner>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding the lock cannot leave a half-written row: every write
    // below is a single map operation after all checks.
    m.lock().unwrap_or_else(|poisoned| poisoned.into_inner())
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }

    /// An empty store whose clusters keep the newest `capacity` membership-history
    /// events (0: no history).
    pub fn with_history_capacity(capacity: u64) -> Self {
        MemoryStore {
            inner: Arc::new(Inner {
                history_capacity: capacity,
                ..Inner::default()
            }),
        }
    }

    /// Makes every table operation of this store fail with [`Error::Backend`] (true)
    /// or work again (false), as a real backend does during an outage. For tests of
    /// "the table is unreachable".
    pub fn set_unavailable(&self, unavailable: bool) {
        self.inner.unavailable.store(unavailable, Ordering::SeqCst);
    }

    fn check_available(&self) -> Result<()> {
        if self.inner.unavailable.load(Ordering::SeqCst) {
            Err(Error::backend("memory store is marked unavailable"))
        } else {
            Ok(())
        }
    }

    fn new_etag(&self) -> Etag {
        Etag::new(format!(
            "{}",
            self.inner.next_etag.fetch_add(1, Ordering::Relaxed) + 1
        ))
    }

    /// Runs `f` on the state of `cluster_id`, creating it (version 0, fresh etag) on
    /// first use.
    fn with_cluster<R>(&self, cluster_id: &str, f: impl FnOnce(&mut Cluster) -> R) -> Result<R> {
        self.check_available()?;
        let mut clusters = lock(&self.inner.clusters);
        let cluster = clusters.entry(cluster_id.to_owned()).or_insert_with(|| Cluster {
            version: TableVersion {
                version: 0,
                etag: self.new_etag(),
            },
            rows: MembershipRows::new(),
            history: VecDeque::new(),
        });
        Ok(f(cluster))
    }

    fn with_service<R>(&self, service_id: &str, f: impl FnOnce(&mut Service) -> R) -> Result<R> {
        self.check_available()?;
        let mut services = lock(&self.inner.services);
        Ok(f(services.entry(service_id.to_owned()).or_default()))
    }
}

impl SystemStore for MemoryStore {
    fn provider(&self) -> &'static str {
        "memory"
    }

    fn membership_table(&self, cluster_id: &str, mode: ProtocolMode) -> Result<Arc<dyn MembershipTable>> {
        validate_id("cluster_id", cluster_id)?;
        Ok(Arc::new(MemoryMembershipTable {
            store: self.clone(),
            cluster_id: cluster_id.to_owned(),
            mode,
        }))
    }

    fn reminder_table(&self, service_id: &str) -> Result<Arc<dyn ReminderTable>> {
        validate_id("service_id", service_id)?;
        Ok(Arc::new(MemoryReminderTable {
            store: self.clone(),
            service_id: service_id.to_owned(),
        }))
    }

    fn lease_table(&self, service_id: &str) -> Result<Arc<dyn rollcall_core::LeaseTable>> {
        validate_id("service_id", service_id)?;
        Ok(Arc::new(MemoryLeaseTable {
            store: self.clone(),
            service_id: service_id.to_owned(),
        }))
    }

    fn state_table(&self, service_id: &str) -> Result<Arc<dyn rollcall_core::StateTable>> {
        self.state_table_with_limits(service_id, MEMORY_STATE_LIMITS)
    }

    /// One [`MemoryStatistics`] per cluster id, shared by every handle on this store
    /// (the options of the first call stay).
    fn statistics_store(
        &self,
        cluster_id: &str,
        options: &rollcall_core::StatisticsOptions,
    ) -> Result<Arc<dyn rollcall_core::StatisticsStore>> {
        validate_id("cluster_id", cluster_id)?;
        options.validate()?;
        self.check_available()?;
        let mut all = lock(&self.inner.statistics);
        let store = all
            .entry(cluster_id.to_owned())
            .or_insert_with(|| Arc::new(MemoryStatistics::new(cluster_id, options.clone())))
            .clone();
        Ok(store)
    }

    fn metrics_table(&self, cluster_id: &str) -> Result<Arc<dyn MetricsTable>> {
        validate_id("cluster_id", cluster_id)?;
        Ok(Arc::new(MemoryMetricsTable {
            store: self.clone(),
            cluster_id: cluster_id.to_owned(),
        }))
    }
}

/// The metrics table of one cluster in a [`MemoryStore`].
#[derive(Clone, Debug)]
pub struct MemoryMetricsTable {
    store: MemoryStore,
    cluster_id: String,
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

/// The membership table of one cluster in a [`MemoryStore`].
#[derive(Clone, Debug)]
pub struct MemoryMembershipTable {
    store: MemoryStore,
    cluster_id: String,
    mode: ProtocolMode,
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

/// The reminder table of one service in a [`MemoryStore`].
#[derive(Clone, Debug)]
pub struct MemoryReminderTable {
    store: MemoryStore,
    service_id: String,
}

fn key_of(actor_id: &str, name: &str) -> (u32, String, String) {
    (actor_hash(actor_id), actor_id.to_owned(), name.to_owned())
}

#[async_trait]
impl ReminderTable for MemoryReminderTable {
    fn service_id(&self) -> &str {
        &self.service_id
    }

    async fn init(&self) -> Result<()> {
        self.store.with_service(&self.service_id, |_| ())
    }

    async fn read_rows_for(&self, actor_id: &str) -> Result<Vec<ReminderEntry>> {
        let h = actor_hash(actor_id);
        self.store.with_service(&self.service_id, |s| {
            s.range((h, String::new(), String::new())..)
                .take_while(|((hash, _, _), _)| *hash == h)
                .filter(|((_, actor, _), _)| actor == actor_id)
                .map(|(_, e)| e.clone())
                .collect()
        })
    }

    async fn read_rows_in_range(&self, begin: u32, end: u32) -> Result<Vec<ReminderEntry>> {
        // Rows with hash > b, in hash order.
        fn above(s: &Service, b: u32) -> impl Iterator<Item = &ReminderEntry> {
            let first = b.checked_add(1);
            first
                .into_iter()
                .flat_map(move |f| s.range((f, String::new(), String::new())..).map(|(_, e)| e))
        }
        self.store.with_service(&self.service_id, |s| {
            if begin < end {
                above(s, begin).take_while(|e| e.hash <= end).cloned().collect()
            } else {
                // Wrapping: (begin, MAX] then [0, end].
                let low = s.values().take_while(|e| e.hash <= end);
                above(s, begin).chain(low).cloned().collect()
            }
        })
    }

    async fn read_row(&self, actor_id: &str, name: &str) -> Result<Option<ReminderEntry>> {
        self.store
            .with_service(&self.service_id, |s| s.get(&key_of(actor_id, name)).cloned())
    }

    async fn upsert_row(&self, entry: &ReminderEntry) -> Result<Etag> {
        entry.validate_for(&self.service_id)?;
        let etag = self.store.new_etag();
        let mut stored = entry.clone();
        stored.etag = etag.clone();
        self.store.with_service(&self.service_id, |s| {
            s.insert(key_of(&entry.actor_id, &entry.name), stored);
        })?;
        Ok(etag)
    }

    async fn remove_row(&self, actor_id: &str, name: &str, etag: &Etag) -> Result<bool> {
        self.store.with_service(&self.service_id, |s| {
            let key = key_of(actor_id, name);
            if s.get(&key).is_some_and(|e| &e.etag == etag) {
                s.remove(&key);
                true
            } else {
                false
            }
        })
    }

    async fn update_last_fired(
        &self,
        actor_id: &str,
        name: &str,
        etag: &Etag,
        fired_at: Timestamp,
    ) -> Result<bool> {
        self.store
            .with_service(&self.service_id, |s| match s.get_mut(&key_of(actor_id, name)) {
                Some(e) if &e.etag == etag => {
                    e.last_fired = Some(fired_at);
                    true
                }
                _ => false,
            })
    }

    async fn clear(&self) -> Result<()> {
        self.store.with_service(&self.service_id, |s| s.clear())
    }
}
