//! The metrics table on DynamoDB: items in the membership table, in the cluster's
//! partition, sort key `~metrics#<role>#<id>` (after every silo row and the history,
//! so membership reads never see them). Attributes: `Role`, `Id`, `PublishedAt`
//! (ms since the epoch, N) and `Row` (the row's JSON).

use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::ReturnValue;
use rollcall_core::{CorruptRow, Error, MetricsReport, MetricsRole, MetricsRow, MetricsTable, Result};

use crate::conn::{n, s, Attrs, Conn, Item};
use crate::schema::{self, CLUSTER_ID, METRICS_ROWS, SILO_IDENTITY};

/// The metrics table of one cluster on DynamoDB.
#[derive(Debug, Clone)]
pub struct DynamoDbMetricsTable {
    conn: Arc<Conn>,
    cluster_id: String,
}

fn sort_key(role: MetricsRole, id: &str) -> String {
    format!("{METRICS_ROWS}{}#{id}", role.as_str())
}

impl DynamoDbMetricsTable {
    pub(crate) fn new(conn: Arc<Conn>, cluster_id: &str) -> Self {
        DynamoDbMetricsTable {
            conn,
            cluster_id: cluster_id.to_owned(),
        }
    }

    fn table(&self) -> &str {
        &self.conn.config.table
    }

    fn key(&self, sk: String) -> Item {
        Item::from([
            (CLUSTER_ID.into(), s(&self.cluster_id)),
            (SILO_IDENTITY.into(), s(sk)),
        ])
    }

    /// Every metrics item of the cluster (strongly consistent, all pages).
    async fn items(&self) -> Result<Vec<Item>> {
        let q = self
            .conn
            .client
            .query()
            .consistent_read(true)
            .key_condition_expression("#c = :c AND begins_with(#sk, :m)")
            .expression_attribute_names("#c", CLUSTER_ID)
            .expression_attribute_names("#sk", SILO_IDENTITY)
            .expression_attribute_values(":c", s(&self.cluster_id))
            .expression_attribute_values(":m", s(METRICS_ROWS));
        self.conn.query_all(self.table(), q).await
    }
}

#[async_trait]
impl MetricsTable for DynamoDbMetricsTable {
    fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    async fn init(&self) -> Result<()> {
        schema::ensure_table(
            &self.conn,
            self.table(),
            schema::Kind::Membership,
            self.conn.config.create_if_missing,
        )
        .await
    }

    async fn upsert(&self, row: &MetricsRow) -> Result<()> {
        row.validate()?;
        let json =
            serde_json::to_string(row).map_err(|e| Error::backend(format!("encode metrics row: {e}")))?;
        let mut item = self.key(sort_key(row.role, &row.id));
        item.insert("Role".into(), s(row.role.as_str()));
        item.insert("Id".into(), s(&row.id));
        item.insert("PublishedAt".into(), n(row.time.as_millis()));
        item.insert("Row".into(), s(json));
        self.conn
            .client
            .put_item()
            .table_name(self.table())
            .set_item(Some(item))
            .send()
            .await
            .map(|_| ())
            .map_err(|e| self.conn.error("metrics upsert", self.table(), e))
    }

    async fn read_all(&self) -> Result<MetricsReport> {
        let mut report = MetricsReport::default();
        for item in self.items().await? {
            let attrs = Attrs(&item);
            let sk = attrs.s(SILO_IDENTITY).unwrap_or("?").to_owned();
            let key = format!("{}/{}/{sk}", self.table(), self.cluster_id);
            let decoded = attrs
                .s("Row")
                .and_then(|json| serde_json::from_str::<MetricsRow>(json).map_err(|e| e.to_string()))
                .and_then(|row| {
                    if sort_key(row.role, &row.id) == sk {
                        Ok(row)
                    } else {
                        Err("the row's role and id disagree with its sort key".into())
                    }
                });
            match decoded {
                Ok(row) => report.rows.push(row),
                Err(reason) => report.corrupt.push(CorruptRow { key, reason }),
            }
        }
        Ok(report.sorted())
    }

    async fn remove(&self, role: MetricsRole, id: &str) -> Result<bool> {
        let out = self
            .conn
            .client
            .delete_item()
            .table_name(self.table())
            .set_key(Some(self.key(sort_key(role, id))))
            .return_values(ReturnValue::AllOld)
            .send()
            .await
            .map_err(|e| self.conn.error("metrics remove", self.table(), e))?;
        Ok(out.attributes().is_some_and(|a| !a.is_empty()))
    }

    async fn clear(&self) -> Result<()> {
        let keys = self
            .items()
            .await?
            .iter()
            .filter_map(|item| {
                let sk = Attrs(item).s(SILO_IDENTITY).ok()?.to_owned();
                Some(self.key(sk))
            })
            .collect();
        self.conn.batch_delete(self.table(), keys).await
    }
}
