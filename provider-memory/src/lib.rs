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
mod membership;
mod metrics_table;
mod reminders;
mod state;
mod statistics;
pub use lease::MemoryLeaseTable;
use membership::Cluster;
pub use membership::MemoryMembershipTable;
pub use metrics_table::MemoryMetricsTable;
use metrics_table::MetricsRows;
pub use reminders::MemoryReminderTable;
use reminders::Service;
pub use state::{MemoryStateTable, MEMORY_STATE_LIMITS};
pub use statistics::MemoryStatistics;

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use rollcall_core::{
    validate_id, Error, Etag, MembershipRows, MembershipTable, MetricsTable, ProtocolMode, ReminderTable,
    Result, SystemStore, TableVersion, DEFAULT_HISTORY_CAPACITY,
};

#[derive(Debug)]
struct Inner {
    clusters: Mutex<HashMap<String, Cluster>>,
    services: Mutex<HashMap<String, Service>>,
    /// Reminder run histories per (service, actor, name), newest first.
    runs: Mutex<HashMap<(String, String, String), Vec<rollcall_core::RunRecord>>>,
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
            runs: Mutex::default(),
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

    // The table files call these on every operation: #[inline] lets them inline
    // across modules (codegen units), as they did when the tables lived here.
    #[inline]
    fn check_available(&self) -> Result<()> {
        if self.inner.unavailable.load(Ordering::SeqCst) {
            Err(Error::backend("memory store is marked unavailable"))
        } else {
            Ok(())
        }
    }

    #[inline]
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

    fn with_runs<R>(
        &self,
        f: impl FnOnce(&mut HashMap<(String, String, String), Vec<rollcall_core::RunRecord>>) -> R,
    ) -> Result<R> {
        self.check_available()?;
        Ok(f(&mut lock(&self.inner.runs)))
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
