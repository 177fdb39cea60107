//! Table schemas and their creation (`create_if_missing`, for development).

use std::time::Duration;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, GlobalSecondaryIndex, KeySchemaElement, KeyType, Projection,
    ProjectionType, ScalarAttributeType, TableStatus, TimeToLiveSpecification,
};
use rollcall_core::{Error, Result};

use crate::conn::{is_not_found, Conn};

/// Membership table partition key: the cluster id.
pub(crate) const CLUSTER_ID: &str = "ClusterId";
/// Membership table sort key: the silo identity (`ip:port@generation`), or
/// [`VERSION_ROW`].
pub(crate) const SILO_IDENTITY: &str = "SiloIdentity";
/// The version row's sort key. `#` sorts before every silo identity (a digit or
/// `[`), so a Query of a cluster reads the version row first.
pub(crate) const VERSION_ROW: &str = "#VERSION";
/// The first sort key of the membership history's items, which share the cluster's
/// partition: `~` sorts after every silo identity, so row reads stop below it.
pub(crate) const HISTORY_ROWS: &str = "~history#";
/// The first sort key of the metrics rows, which share the cluster's partition after
/// the history (`~m` > `~h`): `~metrics#<role>#<id>`.
pub(crate) const METRICS_ROWS: &str = "~metrics#";
/// Reminder table partition key: `<service id>#<shard as 2 hex digits>`.
pub(crate) const SHARD_KEY: &str = "ShardKey";
/// Reminder table sort key: `<hash as 8 hex>#<actor length>#<actor id>#<name>`.
pub(crate) const SORT_KEY: &str = "SortKey";

/// The grain-state table's index of headers by actor kind (a sparse global
/// secondary index: only header items carry its keys).
pub(crate) const KIND_INDEX: &str = "KindIndex";
/// Its hash key: `<service id length>#<service id>#<kind>`.
pub(crate) const KIND: &str = "Kind";
/// Its range key: `<actor id>\u{1}<state name>` (control characters are not
/// allowed in either, so this sorts as the (actor, name) pair).
pub(crate) const MEMBER: &str = "Member";
/// The grain-state table's TTL attribute (seconds since the epoch).
pub(crate) const TTL: &str = "Ttl";

/// Which of the three tables.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    Membership,
    Reminders,
    /// The statistics store: the reminder table's key names (`ShardKey`, `SortKey`).
    Statistics,
    /// The grain-state table: the same key names.
    State,
}

impl Kind {
    fn keys(self) -> (&'static str, &'static str) {
        match self {
            Kind::Membership => (CLUSTER_ID, SILO_IDENTITY),
            Kind::Reminders | Kind::Statistics | Kind::State => (SHARD_KEY, SORT_KEY),
        }
    }
}

/// Checks that `table` exists, creating it (on-demand billing) when it is missing
/// and `create` is set, and waits (within the timeout) until it is `ACTIVE`.
///
/// # Errors
/// [`Error::Backend`] when the table is missing and may not be created (the message
/// says how to create it), or DynamoDB fails.
pub(crate) async fn ensure_table(conn: &Conn, table: &str, kind: Kind, create: bool) -> Result<()> {
    let deadline = tokio::time::Instant::now() + conn.config.timeout;
    let mut created = false;
    loop {
        match conn.client.describe_table().table_name(table).send().await {
            Ok(out) => {
                let status = out.table().and_then(|t| t.table_status());
                if matches!(status, Some(TableStatus::Active) | None) {
                    return Ok(());
                }
            }
            Err(e) if is_not_found(&e) && create && !created => {
                create_table(conn, table, kind).await?;
                created = true;
                continue;
            }
            Err(e) if is_not_found(&e) && !created => {
                return Err(Error::backend(format!(
                    "dynamodb table `{table}` does not exist: create it (the guide's DynamoDB page has the \
                     schema) or add create_if_missing=true to the store URL"
                )))
            }
            Err(e) if is_not_found(&e) => {}
            Err(e) => return Err(conn.error("DescribeTable", table, e)),
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::backend(format!(
                "dynamodb table `{table}` did not become ACTIVE within {:?}",
                conn.config.timeout
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits (within the timeout) until `table` is `ACTIVE`.
async fn wait_active(conn: &Conn, table: &str) -> Result<()> {
    let deadline = tokio::time::Instant::now() + conn.config.timeout;
    loop {
        let out = conn
            .client
            .describe_table()
            .table_name(table)
            .send()
            .await
            .map_err(|e| conn.error("DescribeTable", table, e))?;
        if matches!(
            out.table().and_then(|t| t.table_status()),
            Some(TableStatus::Active) | None
        ) {
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            return Err(Error::backend(format!(
                "dynamodb table `{table}` did not become ACTIVE within {:?}",
                conn.config.timeout
            )));
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

async fn create_table(conn: &Conn, table: &str, kind: Kind) -> Result<()> {
    let (hash, range) = kind.keys();
    let def = |name: &str| {
        AttributeDefinition::builder()
            .attribute_name(name)
            .attribute_type(ScalarAttributeType::S)
            .build()
            .map_err(|e| Error::backend(format!("dynamodb schema: {e}")))
    };
    let key = |name: &str, t: KeyType| {
        KeySchemaElement::builder()
            .attribute_name(name)
            .key_type(t)
            .build()
            .map_err(|e| Error::backend(format!("dynamodb schema: {e}")))
    };
    let mut create = conn
        .client
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(def(hash)?)
        .attribute_definitions(def(range)?)
        .key_schema(key(hash, KeyType::Hash)?)
        .key_schema(key(range, KeyType::Range)?);
    if kind == Kind::State {
        // Listing by kind pages through this index, never a scan.
        let index = GlobalSecondaryIndex::builder()
            .index_name(KIND_INDEX)
            .key_schema(key(KIND, KeyType::Hash)?)
            .key_schema(key(MEMBER, KeyType::Range)?)
            .projection(
                Projection::builder()
                    .projection_type(ProjectionType::KeysOnly)
                    .build(),
            )
            .build()
            .map_err(|e| Error::backend(format!("dynamodb schema: {e}")))?;
        create = create
            .attribute_definitions(def(KIND)?)
            .attribute_definitions(def(MEMBER)?)
            .global_secondary_indexes(index);
    }
    let result = create.send().await;
    match result {
        Ok(_) => {
            tracing::info!(table, "created dynamodb table (on-demand billing)");
            if kind == Kind::State {
                // DynamoDB removes expired states and chunks by themselves.
                let spec = TimeToLiveSpecification::builder()
                    .attribute_name(TTL)
                    .enabled(true)
                    .build()
                    .map_err(|e| Error::backend(format!("dynamodb schema: {e}")))?;
                wait_active(conn, table).await?;
                conn.client
                    .update_time_to_live()
                    .table_name(table)
                    .time_to_live_specification(spec)
                    .send()
                    .await
                    .map_err(|e| conn.error("UpdateTimeToLive", table, e))?;
            }
            Ok(())
        }
        // Another process created it first.
        Err(e)
            if e.as_service_error()
                .is_some_and(|s| s.is_resource_in_use_exception()) =>
        {
            Ok(())
        }
        Err(e) => Err(conn.error("CreateTable", table, e)),
    }
}
