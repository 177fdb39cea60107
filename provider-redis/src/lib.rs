//! # rollcall-provider-redis
//!
//! Membership and reminder tables on Redis: one server, Redis Cluster, or a
//! primary with replicas behind Redis Sentinel.
//!
//! - **Conditional writes** use `WATCH` / `MULTI` / `EXEC` on a dedicated pooled
//!   connection (deadpool; WATCH state is per connection, so never on the shared
//!   multiplexed one): WATCH row + version and `MGET` both, compare etags, then
//!   `MULTI / MSET row version / HSET alive / ZADD changes (+ history) / EXEC`. A
//!   nil EXEC (a watched key changed) is `Ok(false)`; connection and server errors
//!   are [`Error::Backend`](rollcall_core::Error::Backend).
//! - **Atomic `read_all`**: one read-only Lua script returns the version, the index,
//!   every row and the IAmAlive hash at one instant. The handles of one cluster's
//!   table opened from one store reuse the rows any of them decoded before while
//!   their stored bytes are unchanged.
//! - **Heartbeats** (`update_i_am_alive`) are one blind `HSET` into a hash of their
//!   own, so they change neither row etags nor the version and never conflict.
//! - **Reminders**: one JSON value per reminder plus a sorted set scored by the actor
//!   hash; a hash range is one `ZRANGEBYSCORE` (two when it wraps).
//! - **Redis Cluster**: all keys of one cluster (or service) share a hash tag, so they
//!   live in one slot; the provider sends each operation to the master of that slot
//!   (from `CLUSTER SLOTS`, refreshed on `MOVED` and after a failure that says the
//!   node is gone or demoted), where transactions work as on a single server.
//! - **Sentinel** (`redis+sentinel://`): the primary the sentinels name, found
//!   again after such a failure and checked every second.
//! - **`wait_replicas`**: conditional writes acknowledged only once that many
//!   replicas have them (`WAIT`); see [`RedisConfig::wait_replicas`].
//! - Values are JSON, readable with `redis-cli`. Every key family (membership,
//!   history, metrics, reminders, shard leases, actor state, statistics) is in
//!   one table, the [key layout](keys); the default prefix is `rollcall`.
//!
//! ```no_run
//! # async fn run() -> rollcall_core::Result<()> {
//! use rollcall_core::ProtocolMode;
//! let store = rollcall_provider_redis::RedisStore::connect("redis://127.0.0.1:6379/0?pool_size=8").await?;
//! let table = store.membership_table("orders", ProtocolMode::Extended)?;
//! # Ok(()) }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

mod config;
mod conn;
pub mod keys;
mod lease;
mod membership;
mod metrics_table;
mod reminders;
mod state;
mod statistics;

use std::collections::HashMap;
use std::sync::{Arc, Mutex, Weak};

pub use config::{RedisConfig, SentinelTarget};
pub use lease::RedisLeaseTable;
pub use membership::RedisMembershipTable;
pub use metrics_table::RedisMetricsTable;
pub use reminders::RedisReminderTable;
use rollcall_core::{
    validate_id, MembershipTable, MetricsTable, ProtocolMode, ReminderTable, Result, StatisticsOptions,
    StatisticsStore, SystemStore,
};
pub use state::{RedisStateTable, REDIS_STATE_LIMITS};
pub use statistics::RedisStatistics;

/// A fresh random etag: 64 bits as 16 hex digits. An etag only has to differ from
/// the row's previous ones (a write conditioned on a stale etag must fail): 2^-64 per
/// rewrite is far below any other failure, and 16 characters keep the etag inline
/// (no heap block) in the reminder service's slots, 64 bytes a reminder less than
/// 128 bits did. Rows written with longer etags stay valid: etags are opaque.
pub(crate) fn new_etag() -> String {
    format!("{:016x}", rand::random::<u64>())
}

/// The Redis [`SystemStore`]. Cheap to clone.
#[derive(Clone, Debug)]
pub struct RedisStore {
    router: Arc<conn::Router>,
    config: RedisConfig,
    /// Per cluster id: the decoded-row cache its table handles share, while one
    /// of them is alive.
    decoded: Arc<Mutex<HashMap<String, Weak<Mutex<membership::DecodedRows>>>>>,
}

impl RedisStore {
    /// Opens the store named by `url` (see [`RedisConfig`] for the forms) and checks
    /// that the server answers.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`](rollcall_core::Error::InvalidConfig) for a bad URL; [`Error::Backend`](rollcall_core::Error::Backend) if the server (or,
    /// for a cluster, no seed node) answers.
    pub async fn connect(url: &str) -> Result<Arc<dyn SystemStore>> {
        Ok(Arc::new(Self::open(url).await?))
    }

    /// As [`connect`](Self::connect), returning the concrete type.
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    pub async fn open(url: &str) -> Result<RedisStore> {
        let config = RedisConfig::from_url(url)?;
        if config.tls {
            // rustls needs a process-wide crypto provider; keep one the application
            // installed already.
            let _ = rustls::crypto::ring::default_provider().install_default();
        }
        let router = Arc::new(conn::Router::new(&config)?);
        conn::SentinelRouter::watch(&router);
        let node = router.node("").await?;
        let mut con = node.shared().await?;
        redis::cmd("PING")
            .query_async::<String>(&mut con)
            .await
            .map_err(|e| conn::backend("PING", e))?;
        Ok(RedisStore {
            router,
            config,
            decoded: Arc::default(),
        })
    }

    /// The configuration in use.
    pub fn config(&self) -> &RedisConfig {
        &self.config
    }

    /// Runs the script behind `read_all` on `cluster_id`'s membership table and
    /// answers how many rows its reply holds, without decoding them: the benchmark's
    /// reference for the cost of decoding (T1's "raw read script"). Not a stable API.
    ///
    /// # Errors
    /// As `read_all`.
    #[doc(hidden)]
    pub async fn read_all_reply_rows(&self, cluster_id: &str) -> Result<usize> {
        RedisMembershipTable::new(
            self.router.clone(),
            &self.config.key_prefix,
            cluster_id,
            ProtocolMode::Extended,
            self.config.history_capacity,
            Arc::default(),
        )
        .read_all_reply_rows()
        .await
    }
}

impl SystemStore for RedisStore {
    fn provider(&self) -> &'static str {
        "redis"
    }

    fn membership_table(&self, cluster_id: &str, mode: ProtocolMode) -> Result<Arc<dyn MembershipTable>> {
        validate_id("cluster_id", cluster_id)?;
        let decoded = {
            let mut caches = self.decoded.lock().unwrap_or_else(|p| p.into_inner());
            caches.retain(|_, cache| cache.strong_count() > 0);
            match caches.get(cluster_id).and_then(Weak::upgrade) {
                Some(cache) => cache,
                None => {
                    let cache = membership::SharedDecodedRows::default();
                    caches.insert(cluster_id.to_owned(), Arc::downgrade(&cache));
                    cache
                }
            }
        };
        Ok(Arc::new(RedisMembershipTable::new(
            self.router.clone(),
            &self.config.key_prefix,
            cluster_id,
            mode,
            self.config.history_capacity,
            decoded,
        )))
    }

    fn reminder_table(&self, service_id: &str) -> Result<Arc<dyn ReminderTable>> {
        validate_id("service_id", service_id)?;
        Ok(Arc::new(RedisReminderTable::new(
            self.router.clone(),
            &self.config.key_prefix,
            service_id,
        )))
    }

    fn lease_table(&self, service_id: &str) -> Result<Arc<dyn rollcall_core::LeaseTable>> {
        validate_id("service_id", service_id)?;
        Ok(Arc::new(RedisLeaseTable::new(
            self.router.clone(),
            &self.config.key_prefix,
            service_id,
        )))
    }

    fn state_table(&self, service_id: &str) -> Result<Arc<dyn rollcall_core::StateTable>> {
        validate_id("service_id", service_id)?;
        Ok(Arc::new(RedisStateTable::new(
            self.router.clone(),
            &self.config.key_prefix,
            service_id,
        )))
    }

    fn metrics_table(&self, cluster_id: &str) -> Result<Arc<dyn MetricsTable>> {
        validate_id("cluster_id", cluster_id)?;
        Ok(Arc::new(RedisMetricsTable::new(
            self.router.clone(),
            &self.config.key_prefix,
            cluster_id,
        )))
    }

    fn statistics_store(
        &self,
        cluster_id: &str,
        options: &StatisticsOptions,
    ) -> Result<Arc<dyn StatisticsStore>> {
        validate_id("cluster_id", cluster_id)?;
        options.validate()?;
        Ok(Arc::new(RedisStatistics::new(
            self.router.clone(),
            &self.config.key_prefix,
            cluster_id,
            options.clone(),
        )))
    }
}
