//! Reminder shard leases on etcd.
//!
//! | key | holds |
//! |---|---|
//! | `<prefix>/<service>/lease/shards` | the service's shard count (decimal), put only when absent |
//! | `<prefix>/<service>/lease/shard/<shard as 5 digits>` | one lease row; its etag is the key's `mod_revision` |
//!
//! A write is one `Txn`: compare the key's `mod_revision` (0: no key), put,
//! or on a failed compare read the key to name its current etag.

use std::sync::Arc;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, Txn, TxnOp, TxnOpResponse, TxnResponse};
use rollcall_core::lease::{LeaseTable, LeaseWrite};
use rollcall_core::{Error, Etag, Expected, Result};

use crate::conn::{revision, Conn};
use crate::keys::escape;

/// The shard lease rows of one reminder service on etcd.
#[derive(Debug, Clone)]
pub struct EtcdLeaseTable {
    conn: Arc<Conn>,
    base: String,
    service_id: String,
}

impl EtcdLeaseTable {
    pub(crate) fn new(conn: Arc<Conn>, prefix: &str, service_id: &str) -> Self {
        EtcdLeaseTable {
            conn,
            base: format!("{prefix}/{}/lease/", escape(service_id)),
            service_id: service_id.to_owned(),
        }
    }

    fn count_key(&self) -> String {
        format!("{}shards", self.base)
    }

    fn lease_key(&self, shard: u32) -> String {
        format!("{}shard/{shard:05}", self.base)
    }
}

#[async_trait]
impl LeaseTable for EtcdLeaseTable {
    fn service_id(&self) -> &str {
        &self.service_id
    }

    async fn shard_count(&self, shards: u32) -> Result<u32> {
        let key = self.count_key();
        let txn = Txn::new()
            .when(vec![Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then(vec![TxnOp::put(key.clone(), shards.to_string(), None)])
            .or_else(vec![TxnOp::get(key.clone(), None)]);
        let resp = self.conn.txn("record shard count", txn).await?;
        if resp.succeeded() {
            return Ok(shards);
        }
        let kv = got(&resp).ok_or_else(|| Error::corrupt(&key, "the shard count vanished"))?;
        std::str::from_utf8(kv.value())
            .ok()
            .and_then(|s| s.parse().ok())
            .ok_or_else(|| Error::corrupt(&key, "the shard count is not a number"))
    }

    async fn read_lease(&self, shard: u32) -> Result<Option<(Vec<u8>, Etag)>> {
        let mut resp = self
            .conn
            .get("read shard lease", self.lease_key(shard), None)
            .await?;
        Ok(resp
            .take_kvs()
            .into_iter()
            .next()
            .map(|kv| (kv.value().to_vec(), Etag::new(kv.mod_revision().to_string()))))
    }

    async fn write_lease(&self, shard: u32, expected: &Expected, row: &[u8]) -> Result<LeaseWrite> {
        rollcall_core::lease::check_row(shard, row)?;
        let key = self.lease_key(shard);
        let when = match expected {
            Expected::Absent => vec![Compare::create_revision(key.clone(), CompareOp::Equal, 0)],
            Expected::Etag(e) => match revision(e).filter(|r| *r > 0) {
                Some(rev) => vec![Compare::mod_revision(key.clone(), CompareOp::Equal, rev)],
                // No stored key has this etag: read the current one.
                None => {
                    let current = self.read_lease(shard).await?.map(|(_, e)| e);
                    return Ok(LeaseWrite::Conflict(current));
                }
            },
            Expected::Any => Vec::new(),
        };
        let txn = Txn::new()
            .when(when)
            .and_then(vec![TxnOp::put(key.clone(), row.to_vec(), None)])
            .or_else(vec![TxnOp::get(key, None)]);
        let resp = self.conn.txn("write shard lease", txn).await?;
        if resp.succeeded() {
            let rev = resp
                .header()
                .map(|h| h.revision())
                .ok_or_else(|| Error::backend("etcd txn answered without a response header"))?;
            return Ok(LeaseWrite::Written(Etag::new(rev.to_string())));
        }
        Ok(LeaseWrite::Conflict(
            got(&resp).map(|kv| Etag::new(kv.mod_revision().to_string())),
        ))
    }

    async fn clear(&self) -> Result<()> {
        self.conn.delete_prefix("clear shard leases", &self.base).await
    }
}

/// The key the failure branch read, if it exists.
fn got(resp: &TxnResponse) -> Option<etcd_client::KeyValue> {
    resp.op_responses().into_iter().find_map(|r| match r {
        TxnOpResponse::Get(g) => g.kvs().first().cloned(),
        _ => None,
    })
}
