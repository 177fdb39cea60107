//! The metrics table on Redis: one hash per cluster (`<prefix>:{m:<cluster>}:metrics`,
//! in the membership table's slot), field `<role>/<escaped id>`, value the row's JSON.

use std::sync::Arc;

use async_trait::async_trait;
use rollcall_core::{CorruptRow, MetricsReport, MetricsRole, MetricsRow, MetricsTable, Result};

use crate::conn::Router;
use crate::keys::{escape, MembershipKeys};

/// The metrics table of one cluster on Redis.
#[derive(Debug, Clone)]
pub struct RedisMetricsTable {
    router: Arc<Router>,
    keys: MembershipKeys,
    cluster_id: String,
}

fn field(role: MetricsRole, id: &str) -> String {
    format!("{}/{}", role.as_str(), escape(id))
}

impl RedisMetricsTable {
    pub(crate) fn new(router: Arc<Router>, prefix: &str, cluster_id: &str) -> Self {
        RedisMetricsTable {
            router,
            keys: MembershipKeys::new(prefix, cluster_id),
            cluster_id: cluster_id.to_owned(),
        }
    }

    /// Runs one command on the shared connection of the cluster's node.
    async fn query<T: redis::FromRedisValue + Send>(&self, what: &'static str, cmd: redis::Cmd) -> Result<T> {
        self.router.query(&self.keys.tag, what, &cmd).await
    }
}

#[async_trait]
impl MetricsTable for RedisMetricsTable {
    fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    async fn upsert(&self, row: &MetricsRow) -> Result<()> {
        row.validate()?;
        let json = serde_json::to_string(row)
            .map_err(|e| rollcall_core::Error::backend(format!("encode metrics row: {e}")))?;
        let mut cmd = redis::cmd("HSET");
        cmd.arg(self.keys.metrics())
            .arg(field(row.role, &row.id))
            .arg(json);
        self.query::<i64>("metrics upsert", cmd).await.map(|_| ())
    }

    async fn read_all(&self) -> Result<MetricsReport> {
        let key = self.keys.metrics();
        let mut cmd = redis::cmd("HGETALL");
        cmd.arg(key);
        let fields: Vec<(String, String)> = self.query("metrics read_all", cmd).await?;
        let mut report = MetricsReport::default();
        for (f, json) in fields {
            match serde_json::from_str::<MetricsRow>(&json) {
                Ok(row) if field(row.role, &row.id) == f => report.rows.push(row),
                Ok(_) => report.corrupt.push(CorruptRow {
                    key: format!("{key} {f}"),
                    reason: "the row's role and id disagree with its field".into(),
                }),
                Err(e) => report.corrupt.push(CorruptRow {
                    key: format!("{key} {f}"),
                    reason: e.to_string(),
                }),
            }
        }
        Ok(report.sorted())
    }

    async fn remove(&self, role: MetricsRole, id: &str) -> Result<bool> {
        let mut cmd = redis::cmd("HDEL");
        cmd.arg(self.keys.metrics()).arg(field(role, id));
        Ok(self.query::<i64>("metrics remove", cmd).await? > 0)
    }

    async fn clear(&self) -> Result<()> {
        let mut cmd = redis::cmd("DEL");
        cmd.arg(self.keys.metrics());
        self.query::<i64>("metrics clear", cmd).await.map(|_| ())
    }
}
