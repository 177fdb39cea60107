//! The reminder table on etcd: one key per reminder, ordered by the actor hash, so
//! a ring range is a key range.

use std::sync::Arc;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, Txn, TxnOp};
use rollcall_membership_core::{actor_hash, Error, Etag, ReminderEntry, ReminderTable, Result};

use crate::conn::{revision, Conn};
use crate::keys::ReminderKeys;

/// Keys per range request when reading a ring range.
const PAGE: i64 = 1000;

/// The reminder table of one service on etcd.
#[derive(Debug, Clone)]
pub struct EtcdReminderTable {
    conn: Arc<Conn>,
    keys: ReminderKeys,
    service_id: String,
}

impl EtcdReminderTable {
    pub(crate) fn new(conn: Arc<Conn>, prefix: &str, service_id: &str) -> Self {
        EtcdReminderTable {
            conn,
            keys: ReminderKeys::new(prefix, service_id),
            service_id: service_id.to_owned(),
        }
    }

    /// Decodes a stored reminder; its etag is the key's `mod_revision`.
    fn decode(&self, kv: &KeyValue) -> Result<ReminderEntry> {
        let key = String::from_utf8_lossy(kv.key()).into_owned();
        let mut e: ReminderEntry = serde_json::from_slice(kv.value()).map_err(|e| Error::corrupt(&key, e))?;
        if e.hash != actor_hash(&e.actor_id) {
            return Err(Error::corrupt(&key, "hash does not match actor id"));
        }
        if e.service_id != self.service_id || self.keys.row(e.hash, &e.actor_id, &e.name) != key {
            return Err(Error::corrupt(
                &key,
                "reminder stored under another reminder's key",
            ));
        }
        e.etag = Etag::new(kv.mod_revision().to_string());
        Ok(e)
    }

    /// Every reminder with a key in `[start, end)`, a page at a time.
    async fn scan(&self, mut start: Vec<u8>, end: Vec<u8>) -> Result<Vec<ReminderEntry>> {
        let mut out = Vec::new();
        loop {
            let options = GetOptions::new().with_range(end.clone()).with_limit(PAGE);
            let resp = self
                .conn
                .get("reminder range read", start.clone(), Some(options))
                .await?;
            for kv in resp.kvs() {
                out.push(self.decode(kv)?);
            }
            match resp.kvs().last() {
                Some(last) if resp.more() => {
                    start = last.key().to_vec();
                    start.push(0);
                }
                _ => return Ok(out),
            }
        }
    }
}

#[async_trait]
impl ReminderTable for EtcdReminderTable {
    fn service_id(&self) -> &str {
        &self.service_id
    }

    async fn init(&self) -> Result<()> {
        self.conn.check("reminder init", self.keys.all()).await
    }

    async fn read_rows_for(&self, actor_id: &str) -> Result<Vec<ReminderEntry>> {
        let prefix = self.keys.actor(actor_hash(actor_id), actor_id);
        let end = crate::keys::prefix_end(&prefix);
        self.scan(prefix.into_bytes(), end).await
    }

    async fn read_rows_in_range(&self, begin: u32, end: u32) -> Result<Vec<ReminderEntry>> {
        // (begin, end], or (begin, MAX] and [0, end] when it wraps.
        let mut parts = Vec::new();
        if begin < end {
            parts.push((begin + 1, end));
        } else {
            if begin < u32::MAX {
                parts.push((begin + 1, u32::MAX));
            }
            parts.push((0, end));
        }
        let mut out = Vec::new();
        for (lo, hi) in parts {
            let (start, stop) = self.keys.hash_range(lo, hi);
            out.extend(self.scan(start, stop).await?);
        }
        Ok(out)
    }

    async fn read_row(&self, actor_id: &str, name: &str) -> Result<Option<ReminderEntry>> {
        let key = self.keys.row(actor_hash(actor_id), actor_id, name);
        let resp = self.conn.get("reminder read_row", key, None).await?;
        resp.kvs().first().map(|kv| self.decode(kv)).transpose()
    }

    async fn upsert_row(&self, entry: &ReminderEntry) -> Result<Etag> {
        entry.validate_for(&self.service_id)?;
        let stored = ReminderEntry {
            etag: Etag::default(),
            ..entry.clone()
        };
        let json =
            serde_json::to_string(&stored).map_err(|e| Error::backend(format!("encode reminder: {e}")))?;
        let key = self.keys.row(entry.hash, &entry.actor_id, &entry.name);
        let resp = self.conn.put("reminder upsert_row", key, json).await?;
        // The put's revision is the key's new mod_revision: the etag.
        let revision = resp
            .header()
            .map(|h| h.revision())
            .ok_or_else(|| Error::backend("etcd put answered without a response header"))?;
        Ok(Etag::new(revision.to_string()))
    }

    async fn remove_row(&self, actor_id: &str, name: &str, etag: &Etag) -> Result<bool> {
        let Some(rev) = revision(etag).filter(|r| *r > 0) else {
            return Ok(false);
        };
        let key = self.keys.row(actor_hash(actor_id), actor_id, name);
        let txn = Txn::new()
            .when(vec![Compare::mod_revision(key.clone(), CompareOp::Equal, rev)])
            .and_then(vec![TxnOp::delete(key, None)]);
        Ok(self.conn.txn("reminder remove_row", txn).await?.succeeded())
    }

    async fn clear(&self) -> Result<()> {
        // One prefix delete: atomic, so a racing upsert lands wholly before or after.
        self.conn.delete_prefix("reminder clear", self.keys.all()).await
    }
}
