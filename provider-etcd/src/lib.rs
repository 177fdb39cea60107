//! # rollcall-provider-etcd
//!
//! Membership and reminder tables on etcd v3, with optimistic concurrency on
//! `mod_revision`.
//!
//! - **Etags are revisions.** A row's etag is its key's `mod_revision`; the version
//!   row's etag is the version key's `mod_revision`. A conditional write is one `Txn`
//!   whose compares are the row's (`create_revision == 0` to insert, `mod_revision ==
//!   etag` to update) and the version key's (`mod_revision == etag` and value ==
//!   the previous version); its success branch puts the row, its IAmAlive key and
//!   the next version. A failed compare is `Ok(false)` with no side effect.
//! - **Atomic reads.** `read_all`, `read_row` and `read_delta` are one `Txn` of range
//!   reads, served at one revision. A delta is a range over the silo keys with
//!   `min_mod_revision` = the caller's version etag + 1: every row written in a
//!   later version commit has a higher `mod_revision`.
//! - **Heartbeats** write only the `alive/` key (a `Txn` that checks the row
//!   exists), so they never change a row's etag or the version.
//! - **Outcome of a failed write.** When a conditional write fails in transport (a
//!   member died mid-request), the provider reads the row's recent history (a
//!   linearizable read through a live member, then older revisions) to tell whether
//!   the write committed: `Ok(true)` if it did, the transport error if it did not.
//!   Only when that cannot be told (history compacted, no member answers) does the
//!   error leave the outcome open, as every `Error::Backend` may.
//! - **Bounds.** A call answers within the URL's `timeout_ms` (default 5 s), a
//!   conditional write that fails in transport within `2 × timeout_ms` (the write,
//!   then the read that settles its outcome). Reminder range reads are paged (1,000
//!   keys per request) and take one timeout per page. A request that has not
//!   answered in time is not cancelled: it runs on to its answer (30 s more at
//!   most), which is dropped, so that no late answer meets a reset stream.
//! - **The connection.** `channels` (URL, default 2) HTTP/2 connections per member,
//!   taken in turn by calls, built here with their limits set: reset streams remembered for `timeout_ms` + 30 s, no cap on late
//!   frames (h2's 1,024 would close the connection), keepalive pings every 10 s
//!   while calls are in flight. The guide's etcd chapter says why.
//! - Every transaction stays under etcd's default `--max-txn-ops` (128).
//!
//! Values are JSON, readable with `etcdctl get --prefix rollcall/`; the layout is in
//! the `keys` module docs (repeated in the guide's etcd chapter).
//!
//! Building needs `protoc` (Debian: `protobuf-compiler`), which `etcd-client`'s build
//! script uses to compile etcd's protobuf definitions.
//!
//! ```no_run
//! # async fn run() -> rollcall_core::Result<()> {
//! use rollcall_core::ProtocolMode;
//! let store = rollcall_provider_etcd::EtcdStore::connect("etcd://127.0.0.1:2379?prefix=myapp").await?;
//! let table = store.membership_table("orders", ProtocolMode::Extended)?;
//! # Ok(()) }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

mod config;
mod conn;
mod keys;
mod lease;
mod membership;
mod metrics_table;
mod reminders;
mod state;

use std::sync::Arc;

pub use config::{EtcdConfig, DEFAULT_CHANNELS, MAX_CHANNELS};
pub use conn::CALLS;
pub use lease::EtcdLeaseTable;
pub use membership::EtcdMembershipTable;
pub use metrics_table::EtcdMetricsTable;
pub use reminders::EtcdReminderTable;
use rollcall_core::{
    validate_id, MembershipTable, MetricsTable, ProtocolMode, ReminderTable, Result, SystemStore,
};
pub use state::{EtcdStateTable, ETCD_MAX_STATE_BYTES, ETCD_STATE_LIMITS};

/// The etcd [`SystemStore`]. Cheap to clone (one gRPC channel, balanced over the
/// URL's endpoints).
#[derive(Clone, Debug)]
pub struct EtcdStore {
    conn: Arc<conn::Conn>,
    config: EtcdConfig,
}

impl EtcdStore {
    /// Opens the store named by `url` (see [`EtcdConfig`] for the forms),
    /// authenticates if the URL carries a user, and checks that a member with a
    /// leader answers a read of the key prefix. Answers within `timeout_ms`.
    ///
    /// # Errors
    /// - [`Error::InvalidConfig`](rollcall_core::Error::InvalidConfig) for
    ///   a bad URL, an unreadable TLS file, or credentials etcd rejects (the message
    ///   names the user);
    /// - [`Error::Backend`](rollcall_core::Error::Backend) when no member
    ///   answers within the timeout.
    pub async fn connect(url: &str) -> Result<Arc<dyn SystemStore>> {
        Ok(Arc::new(Self::open(url).await?))
    }

    /// As [`connect`](Self::connect), returning the concrete type.
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    pub async fn open(url: &str) -> Result<EtcdStore> {
        let config = EtcdConfig::from_url(url)?;
        let conn = Arc::new(conn::Conn::open(&config).await?);
        conn.check("connect check", &format!("{}/", config.key_prefix))
            .await?;
        Ok(EtcdStore { conn, config })
    }

    /// The configuration in use.
    pub fn config(&self) -> &EtcdConfig {
        &self.config
    }
}

impl SystemStore for EtcdStore {
    fn provider(&self) -> &'static str {
        "etcd"
    }

    /// Counted by the client as calls happen (also as the metric
    /// [`CALLS`] by outcome); up to 4,096 calls are left running at once
    /// (beyond, a call is cancelled at its timeout).
    fn connection(&self) -> Option<rollcall_core::StoreConnection> {
        Some(self.conn.connection())
    }

    fn membership_table(&self, cluster_id: &str, mode: ProtocolMode) -> Result<Arc<dyn MembershipTable>> {
        validate_id("cluster_id", cluster_id)?;
        Ok(Arc::new(EtcdMembershipTable::new(
            self.conn.clone(),
            &self.config.key_prefix,
            cluster_id,
            mode,
            self.config.history_capacity,
        )))
    }

    fn lease_table(&self, service_id: &str) -> Result<Arc<dyn rollcall_core::LeaseTable>> {
        validate_id("service_id", service_id)?;
        Ok(Arc::new(EtcdLeaseTable::new(
            self.conn.clone(),
            &self.config.key_prefix,
            service_id,
        )))
    }

    fn state_table(&self, service_id: &str) -> Result<Arc<dyn rollcall_core::StateTable>> {
        validate_id("service_id", service_id)?;
        Ok(Arc::new(EtcdStateTable::new(
            self.conn.clone(),
            &self.config.key_prefix,
            service_id,
        )))
    }

    fn reminder_table(&self, service_id: &str) -> Result<Arc<dyn ReminderTable>> {
        validate_id("service_id", service_id)?;
        Ok(Arc::new(EtcdReminderTable::new(
            self.conn.clone(),
            &self.config.key_prefix,
            service_id,
        )))
    }

    /// Always `Error::Unsupported`: etcd keeps every revision of every key until
    /// compaction and caps its database (2 GiB by default), so an append-heavy
    /// series store belongs elsewhere (the embedded store on the host, Redis or
    /// DynamoDB).
    fn statistics_store(
        &self,
        _cluster_id: &str,
        _options: &rollcall_core::StatisticsOptions,
    ) -> Result<Arc<dyn rollcall_core::StatisticsStore>> {
        Err(rollcall_core::Error::Unsupported(
            "etcd holds no statistics: it keeps every revision until compaction and caps its database \
             (2 GiB by default), which an append-heavy series would exhaust; use the embedded store, \
             Redis or DynamoDB for statistics"
                .into(),
        ))
    }

    fn metrics_table(&self, cluster_id: &str) -> Result<Arc<dyn MetricsTable>> {
        validate_id("cluster_id", cluster_id)?;
        Ok(Arc::new(EtcdMetricsTable::new(
            self.conn.clone(),
            &self.config.key_prefix,
            cluster_id,
        )))
    }
}
