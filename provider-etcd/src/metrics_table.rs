//! The metrics table on etcd: one key per row,
//! `<prefix>/<cluster>/metrics/<role>/<escaped id>`, value the row's JSON (readable
//! with `etcdctl get --prefix`).

use std::sync::Arc;

use async_trait::async_trait;
use etcd_client::{GetOptions, Txn, TxnOp};
use rollcall_core::{CorruptRow, Error, MetricsReport, MetricsRole, MetricsRow, MetricsTable, Result};

use crate::conn::Conn;
use crate::keys::MembershipKeys;

/// The metrics table of one cluster on etcd.
#[derive(Debug, Clone)]
pub struct EtcdMetricsTable {
    conn: Arc<Conn>,
    keys: MembershipKeys,
    cluster_id: String,
}

impl EtcdMetricsTable {
    pub(crate) fn new(conn: Arc<Conn>, prefix: &str, cluster_id: &str) -> Self {
        EtcdMetricsTable {
            conn,
            keys: MembershipKeys::new(prefix, cluster_id),
            cluster_id: cluster_id.to_owned(),
        }
    }
}

#[async_trait]
impl MetricsTable for EtcdMetricsTable {
    fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    async fn upsert(&self, row: &MetricsRow) -> Result<()> {
        row.validate()?;
        let json =
            serde_json::to_string(row).map_err(|e| Error::backend(format!("encode metrics row: {e}")))?;
        let key = self.keys.metrics(row.role.as_str(), &row.id);
        let txn = Txn::new().and_then(vec![TxnOp::put(key, json, None)]);
        self.conn.txn("metrics upsert", txn).await.map(|_| ())
    }

    async fn read_all(&self) -> Result<MetricsReport> {
        let prefix = self.keys.metrics_prefix();
        let resp = self
            .conn
            .get("metrics read_all", prefix, Some(GetOptions::new().with_prefix()))
            .await?;
        let mut report = MetricsReport::default();
        for kv in resp.kvs() {
            let key = String::from_utf8_lossy(kv.key()).into_owned();
            match serde_json::from_slice::<MetricsRow>(kv.value()) {
                Ok(row) if self.keys.metrics(row.role.as_str(), &row.id) == key => report.rows.push(row),
                Ok(_) => report.corrupt.push(CorruptRow {
                    key,
                    reason: "the row's role and id disagree with its key".into(),
                }),
                Err(e) => report.corrupt.push(CorruptRow {
                    key,
                    reason: e.to_string(),
                }),
            }
        }
        Ok(report.sorted())
    }

    async fn remove(&self, role: MetricsRole, id: &str) -> Result<bool> {
        let key = self.keys.metrics(role.as_str(), id);
        let txn = Txn::new().and_then(vec![TxnOp::delete(key, None)]);
        let resp = self.conn.txn("metrics remove", txn).await?;
        Ok(resp.op_responses().iter().any(|r| match r {
            etcd_client::TxnOpResponse::Delete(d) => d.deleted() > 0,
            _ => false,
        }))
    }

    async fn clear(&self) -> Result<()> {
        self.conn
            .delete_prefix("metrics clear", &self.keys.metrics_prefix())
            .await
    }
}
