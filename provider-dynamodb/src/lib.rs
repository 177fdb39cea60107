//! # rollcall-provider-dynamodb
//!
//! Membership and reminder tables on Amazon DynamoDB (or a DynamoDB-compatible
//! server: DynamoDB Local, moto), with conditional puts and `TransactWriteItems`.
//!
//! - **Membership: one table, one partition per cluster.** Partition key
//!   `ClusterId`, sort key `SiloIdentity` (`ip:port@generation`) or `#VERSION` for
//!   the version row. Columns are typed attributes named like Orleans'
//!   silo-instance table (`Address`, `Port`, `Generation`, `Status`,
//!   `SuspectingSilos`, `SuspectingTimes`, `ProxyPort`, `HostName`, `SiloName`,
//!   `RoleName`, `UpdateZone`, `FaultZone`, `StartTime`, `IAmAliveTime`, `ETag`),
//!   plus `TableVersion`: the table version the row was written at.
//! - **Extended protocol in one transaction.** `insert_row` is `TransactWriteItems
//!   { Put row if attribute_not_exists, Update version if ETag = :e AND Version =
//!   :v-1 }`; `update_row` conditions the row on its `ETag` instead. A
//!   `TransactionCanceledException` whose reasons include `ConditionalCheckFailed`
//!   or `TransactionConflict` is `Ok(false)`: DynamoDB wrote nothing. Etags are 64
//!   random bits (16 hex digits), new on every write.
//! - **Ordered reads.** `read_all` is a strongly consistent Query of the
//!   partition; `#VERSION` sorts before every silo, so the version row is read
//!   first, and a row whose `TableVersion` is above it was written by a commit
//!   that landed during the read: the read is repeated (up to 10 times, then
//!   `Error::Backend`). `read_delta` is the same Query filtered to rows with
//!   `TableVersion` above the caller's. `read_row` is one `TransactGetItems`
//!   (serializable).
//! - **IAmAlive** is one `UpdateItem` of `IAmAliveTime`, conditioned only on the
//!   row existing; it never touches `ETag` or the version.
//! - **Deletes in batches.** `cleanup_defunct` deletes each defunct row only as it
//!   was read (25 per transaction). `delete_cluster` deletes rows first (the
//!   version row stays, so reads stay ordered), then the last rows and the version
//!   row in one transaction conditioned on their etags, listing again if a writer
//!   got in between. Reminder `clear` deletes 25 items per `BatchWriteItem`; a
//!   reminder is one item, so a racing upsert survives whole or not at all.
//! - **Reminders without a hot partition.** Partition key `ShardKey` =
//!   `<service id>#<top bits of the ring hash as 2 hex>` (`reminder_shards`
//!   partitions per service, 16 by default), sort key `SortKey` =
//!   `<hash as 8 hex>#<actor id length>#<actor id>#<name>`: a ring range is one
//!   `BETWEEN` Query per partition it overlaps (a wrapping range is two ranges).
//!   Removal and `update_last_fired` are conditioned on `ETag`; `LastFired` is
//!   written without changing it.
//! - **Bounds.** Every request runs under the SDK's operation timeout
//!   (`timeout_ms`, default 5 s, retries included) with the standard retry mode
//!   (`max_attempts`, default 3: throttling and server errors); `delete_cluster`
//!   gives up after `4 × timeout_ms` of racing writers, and unprocessed batch
//!   deletes are sent again for at most one timeout. Unprocessed batch reads
//!   (throttling, or a response cut at DynamoDB's 16 MB: a large actor state's
//!   chunks) are asked for again while each call returns items, and for at
//!   most one timeout without any: at most one call per key. Errors are
//!   `Error::Backend` naming the table, the endpoint and the AWS error code
//!   (`ThrottlingException`, `ResourceNotFoundException`, ...).
//! - **Bad items** (a missing or mistyped attribute) are listed as corrupt rows by
//!   membership reads and answer `Error::Corrupt { key }` in reminder reads;
//!   nothing is overwritten.
//!
//! ```no_run
//! # async fn run() -> rollcall_core::Result<()> {
//! use rollcall_core::ProtocolMode;
//! let store = rollcall_provider_dynamodb::DynamoDbStore::connect(
//!     "dynamodb://rollcall?region=eu-west-1",
//! )
//! .await?;
//! let table = store.membership_table("orders", ProtocolMode::Extended)?;
//! table.init(true).await?;
//! # Ok(()) }
//! ```
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

mod config;
mod conn;
mod lease;
mod membership;
mod metrics_table;
mod reminders;
mod schema;
mod state;
mod statistics;

use std::sync::Arc;

pub use config::DynamoDbConfig;
pub use lease::DynamoDbLeaseTable;
pub use membership::DynamoDbMembershipTable;
pub use metrics_table::DynamoDbMetricsTable;
pub use reminders::DynamoDbReminderTable;
use rollcall_core::{
    validate_id, MembershipTable, MetricsTable, ProtocolMode, ReminderTable, Result, StatisticsOptions,
    StatisticsStore, SystemStore,
};
pub use state::{DynamoDbStateTable, DYNAMODB_KEY_LIMITS, DYNAMODB_STATE_LIMITS};
pub use statistics::DynamoDbStatistics;

/// The DynamoDB [`SystemStore`]. Cheap to clone (one SDK client with its
/// connection pool).
#[derive(Clone, Debug)]
pub struct DynamoDbStore {
    conn: Arc<conn::Conn>,
}

impl DynamoDbStore {
    /// Opens the store named by `url` (see [`DynamoDbConfig`] for the form) and
    /// checks, with one `DescribeTable` of the membership table, that DynamoDB
    /// answers and accepts the credentials (a missing table is fine here: `init`
    /// creates it when the URL says `create_if_missing=true`). Answers within
    /// `timeout_ms`.
    ///
    /// # Errors
    /// - [`Error::InvalidConfig`](rollcall_core::Error::InvalidConfig) for a bad URL;
    /// - [`Error::Backend`](rollcall_core::Error::Backend) when DynamoDB does not answer, or refuses the
    ///   credentials (the message carries the AWS error code).
    pub async fn connect(url: &str) -> Result<Arc<dyn SystemStore>> {
        Ok(Arc::new(Self::open(url).await?))
    }

    /// As [`connect`](Self::connect), returning the concrete type.
    ///
    /// # Errors
    /// As [`connect`](Self::connect).
    pub async fn open(url: &str) -> Result<DynamoDbStore> {
        let config = DynamoDbConfig::from_url(url)?;
        let conn = conn::Conn::open(&config).await?;
        match conn
            .client
            .describe_table()
            .table_name(&config.table)
            .send()
            .await
        {
            Ok(_) => {}
            Err(e) if conn::is_not_found(&e) => {}
            Err(e) => return Err(conn.error("connect check (DescribeTable)", &config.table, e)),
        }
        Ok(DynamoDbStore { conn: Arc::new(conn) })
    }

    /// The configuration in use.
    pub fn config(&self) -> &DynamoDbConfig {
        &self.conn.config
    }
}

impl SystemStore for DynamoDbStore {
    fn provider(&self) -> &'static str {
        "dynamodb"
    }

    fn key_limits(&self) -> rollcall_core::KeyLimits {
        DYNAMODB_KEY_LIMITS
    }

    fn membership_table(&self, cluster_id: &str, mode: ProtocolMode) -> Result<Arc<dyn MembershipTable>> {
        validate_id("cluster_id", cluster_id)?;
        Ok(Arc::new(DynamoDbMembershipTable::new(
            self.conn.clone(),
            cluster_id,
            mode,
        )))
    }

    fn reminder_table(&self, service_id: &str) -> Result<Arc<dyn ReminderTable>> {
        validate_id("service_id", service_id)?;
        Ok(Arc::new(DynamoDbReminderTable::new(
            self.conn.clone(),
            service_id,
        )))
    }

    fn lease_table(&self, service_id: &str) -> Result<Arc<dyn rollcall_core::LeaseTable>> {
        validate_id("service_id", service_id)?;
        Ok(Arc::new(DynamoDbLeaseTable::new(self.conn.clone(), service_id)))
    }

    fn state_table(&self, service_id: &str) -> Result<Arc<dyn rollcall_core::StateTable>> {
        validate_id("service_id", service_id)?;
        Ok(Arc::new(DynamoDbStateTable::new(self.conn.clone(), service_id)))
    }

    fn metrics_table(&self, cluster_id: &str) -> Result<Arc<dyn MetricsTable>> {
        validate_id("cluster_id", cluster_id)?;
        Ok(Arc::new(DynamoDbMetricsTable::new(self.conn.clone(), cluster_id)))
    }

    fn statistics_store(
        &self,
        cluster_id: &str,
        options: &StatisticsOptions,
    ) -> Result<Arc<dyn StatisticsStore>> {
        validate_id("cluster_id", cluster_id)?;
        options.validate()?;
        Ok(Arc::new(DynamoDbStatistics::new(
            self.conn.clone(),
            cluster_id,
            options.clone(),
        )))
    }
}
