//! Table schemas and their creation (`create_if_missing`, for development).

use std::time::Duration;

use aws_sdk_dynamodb::types::{
    AttributeDefinition, BillingMode, KeySchemaElement, KeyType, ScalarAttributeType, TableStatus,
};
use rollcall_membership_core::{Error, Result};

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
                    "dynamodb table `{table}` does not exist: create it (the README gives the \
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
    let result = conn
        .client
        .create_table()
        .table_name(table)
        .billing_mode(BillingMode::PayPerRequest)
        .attribute_definitions(def(hash)?)
        .attribute_definitions(def(range)?)
        .key_schema(key(hash, KeyType::Hash)?)
        .key_schema(key(range, KeyType::Range)?)
        .send()
        .await;
    match result {
        Ok(_) => {
            tracing::info!(table, "created dynamodb table (on-demand billing)");
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
