//! Reminder shard leases on etcd.
//!
//! | key | holds |
//! |---|---|
//! | `<prefix>/<service>/lease/shards` | the service's shard count (decimal), put only when absent |
//! | `<prefix>/<service>/lease/shard/<shard as 5 digits>` | one lease row; its etag is the key's `mod_revision` |
//! | `<prefix>/<service>/lease/fence/<shard as 5 digits>` | the row's fence token (its epoch in decimal while held, empty while released), put in the row's own `Txn`; a fenced state commit compares its value |
//! | `<prefix>/<service>/lease/pages/<shard as 5 digits>/<page set>/<index as 8 digits>` | a page of a lease's exceptions (each read and written alone: a request stays far below etcd's 1.5 MiB) |
//!
//! A write is one `Txn`: compare the key's `mod_revision` (0: no key), put,
//! or on a failed compare read the key to name its current etag.

use std::sync::Arc;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, GetOptions, Txn, TxnOp, TxnOpResponse, TxnResponse};
use rollcall_core::lease::{LeaseTable, LeaseWrite};
use rollcall_core::{Error, Etag, Expected, Result};

use crate::conn::{revision, Conn};
use crate::keys::escape;

/// The base of a service's lease keys (ends in `/`).
pub(crate) fn lease_base(prefix: &str, service_id: &str) -> String {
    format!("{prefix}/{}/lease/", escape(service_id))
}

/// The fence token key of `shard` under a service's lease `base`.
pub(crate) fn fence_key(base: &str, shard: u32) -> String {
    format!("{base}fence/{shard:05}")
}

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
            base: lease_base(prefix, service_id),
            service_id: service_id.to_owned(),
        }
    }

    fn count_key(&self) -> String {
        format!("{}shards", self.base)
    }

    fn lease_key(&self, shard: u32) -> String {
        format!("{}shard/{shard:05}", self.base)
    }

    fn fence_key(&self, shard: u32) -> String {
        fence_key(&self.base, shard)
    }

    /// The prefix of shard `shard`'s pages (ends in `/`).
    fn pages_prefix(&self, shard: u32) -> String {
        format!("{}pages/{shard:05}/", self.base)
    }

    fn page_key(&self, shard: u32, set: &str, index: u32) -> String {
        format!("{}{set}/{index:08}", self.pages_prefix(shard))
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
        let token = rollcall_core::lease::fence_token(row)
            .map(|e| e.to_string())
            .unwrap_or_default();
        let txn = Txn::new()
            .when(when)
            .and_then(vec![
                TxnOp::put(key.clone(), row.to_vec(), None),
                TxnOp::put(self.fence_key(shard), token, None),
            ])
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

    /// One `Txn` per call ([`PAGE_CALL_BYTES`](rollcall_core::lease::PAGE_CALL_BYTES)
    /// at most, under etcd's default 1.5 MiB request limit); a call with more
    /// (another caller) is sent in `Txn`s of at most that size.
    async fn write_pages(&self, shard: u32, set: &str, first: u32, pages: &[Vec<u8>]) -> Result<()> {
        for page in pages {
            rollcall_core::lease::check_row(shard, page)?;
        }
        let mut ops = Vec::new();
        let mut bytes = 0;
        for (i, page) in pages.iter().enumerate() {
            if !ops.is_empty() && bytes + page.len() > rollcall_core::lease::PAGE_CALL_BYTES {
                let txn = Txn::new().and_then(std::mem::take(&mut ops));
                self.conn.txn("write lease pages", txn).await?;
                bytes = 0;
            }
            bytes += page.len();
            ops.push(TxnOp::put(
                self.page_key(shard, set, first + i as u32),
                page.clone(),
                None,
            ));
        }
        if !ops.is_empty() {
            self.conn
                .txn("write lease pages", Txn::new().and_then(ops))
                .await?;
        }
        Ok(())
    }

    /// Ranges of four pages (1 MiB at most: well under the client's 4 MiB
    /// message limit), one request each.
    async fn read_pages(&self, shard: u32, set: &str, count: u32) -> Result<Vec<Option<Vec<u8>>>> {
        const PER_REQUEST: u32 = 4;
        let mut out = vec![None; count as usize];
        let mut from = 0;
        while from < count {
            let to = (from + PER_REQUEST).min(count);
            let options = GetOptions::new().with_range(self.page_key(shard, set, to));
            let mut resp = self
                .conn
                .get("read lease pages", self.page_key(shard, set, from), Some(options))
                .await?;
            for kv in resp.take_kvs() {
                let index = std::str::from_utf8(kv.key())
                    .ok()
                    .and_then(|k| k.rsplit('/').next())
                    .and_then(|i| i.parse::<u32>().ok());
                if let Some(slot) = index.and_then(|i| out.get_mut(i as usize)) {
                    *slot = Some(kv.value().to_vec());
                }
            }
            from = to;
        }
        Ok(out)
    }

    async fn delete_pages(&self, shard: u32, keep: Option<&str>) -> Result<()> {
        let prefix = self.pages_prefix(shard);
        // Past every key of the prefix: its last byte, `/`, plus one.
        let end = format!("{}0", &prefix[..prefix.len() - 1]);
        match keep {
            None => self.conn.delete_range("delete lease pages", &prefix, &end).await,
            Some(set) => {
                // The keys before the kept set's, then those after it.
                let kept = format!("{prefix}{set}/");
                let after_kept = format!("{prefix}{set}0");
                self.conn
                    .delete_range("delete lease pages", &prefix, &kept)
                    .await?;
                self.conn
                    .delete_range("delete lease pages", &after_kept, &end)
                    .await
            }
        }
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
