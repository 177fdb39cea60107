//! The reminder table on etcd: one key per reminder, ordered by the actor hash, so
//! a ring range is a key range. A reminder's last-fired time lives in a second key
//! (`<row key>/fired`, JSON `{"last_fired":ms}`) because any put changes a key's
//! `mod_revision`, which is the etag: recording a tick must not invalidate handles.
//! The paused column lives in a third key (`<row key>/paused`, JSON
//! `{"paused":ms}`, absent when the reminder ticks) for the same reason.

use std::collections::HashMap;
use std::sync::Arc;

use async_trait::async_trait;
use etcd_client::{Compare, CompareOp, GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse};
use rollcall_core::KeyLimits;
use rollcall_core::{
    actor_hash, Error, Etag, Fence, ReminderEntry, ReminderTable, Result, RunRecord, Timestamp,
};
use serde::{Deserialize, Serialize};

use crate::conn::{revision, Conn};
use crate::keys::ReminderKeys;

/// Keys in the first range request of a scan.
const PAGE: i64 = 1000;

/// The bytes a later range request of a scan asks for (its key limit is this
/// over the mean key-value size so far, between [`PAGE`] / 10 and 20
/// [`PAGE`]s): a scan of 20,000 rows is 4 round trips, not 20 (over a 200-ms
/// round trip, 0.9 s instead of 4.4 s), and a response stays far below the
/// client's message limit whatever the payloads.
const SCAN_BYTES: usize = 2 << 20;

/// The value of a fired key.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Fired {
    last_fired: Timestamp,
}

/// The value of a paused key.
#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Paused {
    paused: Timestamp,
}

/// The reminder table of one service on etcd.
#[derive(Debug, Clone)]
pub struct EtcdReminderTable {
    conn: Arc<Conn>,
    keys: ReminderKeys,
    service_id: String,
    /// The base of the service's lease keys (a fenced write compares its
    /// shard's fence key).
    lease_base: String,
}

impl EtcdReminderTable {
    pub(crate) fn new(conn: Arc<Conn>, prefix: &str, service_id: &str) -> Self {
        EtcdReminderTable {
            conn,
            keys: ReminderKeys::new(prefix, service_id),
            lease_base: crate::lease::lease_base(prefix, service_id),
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

    /// Decodes the rows and fired keys among `kvs` (any order) into reminders with
    /// their last-fired times. A fired key whose row is gone is ignored.
    fn decode_all<'a>(&self, kvs: impl IntoIterator<Item = &'a KeyValue>) -> Result<Vec<ReminderEntry>> {
        let mut rows = Vec::new();
        let mut fired = HashMap::new();
        let mut paused = HashMap::new();
        for kv in kvs {
            let key = String::from_utf8_lossy(kv.key());
            if let Some(row_key) = self.keys.fired_row(&key) {
                let f: Fired = serde_json::from_slice(kv.value()).map_err(|e| Error::corrupt(&*key, e))?;
                fired.insert(row_key.to_owned(), f.last_fired);
            } else if let Some(row_key) = self.keys.paused_row(&key) {
                let p: Paused = serde_json::from_slice(kv.value()).map_err(|e| Error::corrupt(&*key, e))?;
                paused.insert(row_key.to_owned(), p.paused);
            } else {
                rows.push((key.into_owned(), self.decode(kv)?));
            }
        }
        Ok(rows
            .into_iter()
            .map(|(key, mut e)| {
                e.last_fired = fired.get(&key).copied();
                e.paused = paused.get(&key).copied();
                e
            })
            .collect())
    }

    /// Under `fence`: the compare of its shard's fence key (a missing key
    /// fails a value compare) and the read that names the current token when
    /// the transaction fails, after the fence's own checks.
    fn fence_guard(&self, fence: Option<&Fence>, actor_id: &str) -> Result<Option<(Compare, TxnOp, String)>> {
        let Some(f) = fence else { return Ok(None) };
        f.check_reminder(&self.service_id, actor_id)?;
        let key = crate::lease::fence_key(&self.lease_base, f.shard);
        Ok(Some((
            Compare::value(key.clone(), CompareOp::Equal, f.token()),
            TxnOp::get(key.clone(), None),
            key,
        )))
    }

    /// After a failed transaction with `fence`'s guard: the refusal when the
    /// fence key (read in its else branch) no longer holds the fence's token.
    fn refused(
        fence: Option<&Fence>,
        resp: &etcd_client::TxnResponse,
        key: Option<&str>,
        actor_id: &str,
        name: &str,
    ) -> Option<Error> {
        let (f, key) = (fence?, key?);
        let token = resp.op_responses().into_iter().find_map(|r| match r {
            TxnOpResponse::Get(g) => g
                .kvs()
                .iter()
                .find(|kv| kv.key() == key.as_bytes())
                .map(|kv| String::from_utf8_lossy(kv.value()).into_owned()),
            _ => None,
        });
        (token.as_deref() != Some(f.token().as_str()))
            .then(|| f.refused_reminder(actor_id, name, token.and_then(|t| t.parse().ok())))
    }

    /// `ops` in one `Txn` if row `key` is at revision `rev` (and, under a
    /// fence, its lease at the fence's epoch: `guard`). `Ok(false)` when the
    /// row is not at `rev`; the fence's refusal when the lease moved on.
    #[allow(clippy::too_many_arguments)]
    async fn when_row_at(
        &self,
        what: &str,
        key: &str,
        rev: i64,
        ops: Vec<TxnOp>,
        guard: Option<(Compare, TxnOp, String)>,
        fence: Option<&Fence>,
        (actor_id, name): (&str, &str),
    ) -> Result<bool> {
        let mut when = vec![Compare::mod_revision(key, CompareOp::Equal, rev)];
        let mut otherwise = Vec::new();
        let fence_key = guard.map(|(c, read, k)| {
            when.push(c);
            otherwise.push(read);
            k
        });
        let txn = Txn::new().when(when).and_then(ops).or_else(otherwise);
        let resp = self.conn.txn(what, txn).await?;
        if resp.succeeded() {
            return Ok(true);
        }
        match Self::refused(fence, &resp, fence_key.as_deref(), actor_id, name) {
            Some(e) => Err(e),
            None => Ok(false),
        }
    }

    /// Every reminder with a key in `[start, end)`, a page at a time, every page read
    /// at the revision of the first.
    async fn scan(&self, mut start: Vec<u8>, end: Vec<u8>) -> Result<Vec<ReminderEntry>> {
        let mut kvs: Vec<KeyValue> = Vec::new();
        let mut at = 0;
        let mut bytes = 0usize;
        loop {
            let limit = match kvs.len() {
                0 => PAGE,
                n => {
                    let mean = (bytes / n).max(1);
                    i64::try_from(SCAN_BYTES / mean).map_or(20 * PAGE, |l| l.clamp(PAGE / 10, 20 * PAGE))
                }
            };
            let options = GetOptions::new()
                .with_range(end.clone())
                .with_limit(limit)
                .with_revision(at);
            let mut resp = self
                .conn
                .get("reminder range read", start.clone(), Some(options))
                .await?;
            if at == 0 {
                at = resp.header().map_or(0, |h| h.revision());
            }
            let more = resp.more();
            let page = resp.take_kvs();
            bytes += page
                .iter()
                .map(|kv| kv.key().len() + kv.value().len())
                .sum::<usize>();
            match page.last() {
                Some(last) if more => {
                    start = last.key().to_vec();
                    start.push(0);
                    kvs.extend(page);
                }
                _ => {
                    kvs.extend(page);
                    return self.decode_all(&kvs);
                }
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
        KeyLimits::CORE.check_actor_id(actor_id)?;
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
        KeyLimits::CORE.check_key(actor_id, name)?;
        let key = self.keys.row(actor_hash(actor_id), actor_id, name);
        // Row, fired and paused keys in one Txn: one revision.
        let txn = Txn::new().and_then(vec![
            TxnOp::get(key.clone(), None),
            TxnOp::get(ReminderKeys::fired(&key), None),
            TxnOp::get(ReminderKeys::paused(&key), None),
        ]);
        let resp = self.conn.txn("reminder read_row", txn).await?;
        let ops = resp.op_responses();
        let kvs: Vec<&KeyValue> = ops
            .iter()
            .filter_map(|op| match op {
                TxnOpResponse::Get(g) => Some(g.kvs()),
                _ => None,
            })
            .flatten()
            .collect();
        Ok(self.decode_all(kvs)?.pop())
    }

    async fn upsert_row(&self, entry: &ReminderEntry) -> Result<Etag> {
        entry.validate_for(&self.service_id, &KeyLimits::CORE)?;
        let stored = ReminderEntry {
            etag: Etag::default(),
            ..entry.clone()
        };
        let json =
            serde_json::to_string(&stored).map_err(|e| Error::backend(format!("encode reminder: {e}")))?;
        let key = self.keys.row(entry.hash, &entry.actor_id, &entry.name);
        let fired = ReminderKeys::fired(&key);
        let fired_op = match entry.last_fired {
            Some(t) => TxnOp::put(fired, fired_json(t)?, None),
            None => TxnOp::delete(fired, None),
        };
        let paused_op = paused_op(&key, entry.paused)?;
        let txn = Txn::new().and_then(vec![TxnOp::put(key, json, None), fired_op, paused_op]);
        let resp = self.conn.txn("reminder upsert_row", txn).await?;
        // The Txn's revision is the row key's new mod_revision: the etag.
        let revision = resp
            .header()
            .map(|h| h.revision())
            .ok_or_else(|| Error::backend("etcd put answered without a response header"))?;
        Ok(Etag::new(revision.to_string()))
    }

    async fn remove_row(
        &self,
        actor_id: &str,
        name: &str,
        etag: &Etag,
        fence: Option<&Fence>,
    ) -> Result<bool> {
        KeyLimits::CORE.check_key(actor_id, name)?;
        let guard = self.fence_guard(fence, actor_id)?;
        let Some(rev) = revision(etag).filter(|r| *r > 0) else {
            return Ok(false);
        };
        let key = self.keys.row(actor_hash(actor_id), actor_id, name);
        let ops = vec![
            TxnOp::delete(ReminderKeys::fired(&key), None),
            TxnOp::delete(ReminderKeys::paused(&key), None),
            TxnOp::delete(key.clone(), None),
        ];
        self.when_row_at(
            "reminder remove_row",
            &key,
            rev,
            ops,
            guard,
            fence,
            (actor_id, name),
        )
        .await
    }

    async fn update_last_fired(
        &self,
        actor_id: &str,
        name: &str,
        etag: &Etag,
        fired_at: Timestamp,
        fence: Option<&Fence>,
    ) -> Result<bool> {
        KeyLimits::CORE.check_key(actor_id, name)?;
        let guard = self.fence_guard(fence, actor_id)?;
        let Some(rev) = revision(etag).filter(|r| *r > 0) else {
            return Ok(false);
        };
        let key = self.keys.row(actor_hash(actor_id), actor_id, name);
        // The row's mod_revision is the etag; the put goes to the fired key, so the
        // etag stays.
        let ops = vec![TxnOp::put(ReminderKeys::fired(&key), fired_json(fired_at)?, None)];
        self.when_row_at(
            "reminder update_last_fired",
            &key,
            rev,
            ops,
            guard,
            fence,
            (actor_id, name),
        )
        .await
    }

    async fn update_paused(
        &self,
        actor_id: &str,
        name: &str,
        etag: &Etag,
        paused: Option<Timestamp>,
    ) -> Result<bool> {
        KeyLimits::CORE.check_key(actor_id, name)?;
        let Some(rev) = revision(etag).filter(|r| *r > 0) else {
            return Ok(false);
        };
        let key = self.keys.row(actor_hash(actor_id), actor_id, name);
        // As update_last_fired: the row key is untouched, so the etag stays.
        let txn = Txn::new()
            .when(vec![Compare::mod_revision(key.clone(), CompareOp::Equal, rev)])
            .and_then(vec![paused_op(&key, paused)?]);
        Ok(self.conn.txn("reminder update_paused", txn).await?.succeeded())
    }

    async fn append_run(
        &self,
        actor_id: &str,
        name: &str,
        run: &RunRecord,
        keep: usize,
        fence: Option<&Fence>,
    ) -> Result<()> {
        KeyLimits::CORE.check_key(actor_id, name)?;
        rollcall_core::check_run_keep(keep)?;
        let fence_guard = self.fence_guard(fence, actor_id)?;
        let key = self.keys.runs(actor_hash(actor_id), actor_id, name);
        // Read, prepend, write if unchanged; again on a race (a handoff's
        // two holders). A write that timed out but landed shows as `run` at
        // the front on the next read: nothing is appended twice.
        for _ in 0..16 {
            let (mut runs, rev) = self.runs_at(&key).await?;
            if !rollcall_core::prepend_run(&mut runs, run, keep) {
                return Ok(());
            }
            let json =
                serde_json::to_string(&runs).map_err(|e| Error::backend(format!("encode runs: {e}")))?;
            let guard = if rev == 0 {
                Compare::version(key.clone(), CompareOp::Equal, 0)
            } else {
                Compare::mod_revision(key.clone(), CompareOp::Equal, rev)
            };
            let mut when = vec![guard];
            let mut otherwise = Vec::new();
            if let Some((c, read, _)) = &fence_guard {
                when.push(c.clone());
                otherwise.push(read.clone());
            }
            let txn = Txn::new()
                .when(when)
                .and_then(vec![TxnOp::put(key.clone(), json, None)])
                .or_else(otherwise);
            let resp = self.conn.txn("reminder append_run", txn).await?;
            if resp.succeeded() {
                return Ok(());
            }
            if let Some(e) = Self::refused(
                fence,
                &resp,
                fence_guard.as_ref().map(|g| g.2.as_str()),
                actor_id,
                name,
            ) {
                return Err(e);
            }
        }
        Err(Error::backend(format!(
            "{key}: 16 appends lost the race in a row"
        )))
    }

    async fn read_runs(&self, actor_id: &str, name: &str) -> Result<Vec<RunRecord>> {
        KeyLimits::CORE.check_key(actor_id, name)?;
        let key = self.keys.runs(actor_hash(actor_id), actor_id, name);
        Ok(self.runs_at(&key).await?.0)
    }

    async fn remove_runs(&self, actor_id: &str, name: &str) -> Result<()> {
        KeyLimits::CORE.check_key(actor_id, name)?;
        let key = self.keys.runs(actor_hash(actor_id), actor_id, name);
        self.conn
            .txn(
                "reminder remove_runs",
                Txn::new().and_then(vec![TxnOp::delete(key, None)]),
            )
            .await
            .map(|_| ())
    }

    async fn clear(&self) -> Result<()> {
        self.conn
            .delete_prefix("reminder clear runs", self.keys.all_runs())
            .await?;
        // One prefix delete: atomic, so a racing upsert lands wholly before or after.
        self.conn.delete_prefix("reminder clear", self.keys.all()).await
    }
}

impl EtcdReminderTable {
    /// The run history at `key` and its `mod_revision` (0: none).
    async fn runs_at(&self, key: &str) -> Result<(Vec<RunRecord>, i64)> {
        let resp = self.conn.get("reminder read_runs", key, None).await?;
        match resp.kvs().first() {
            None => Ok((Vec::new(), 0)),
            Some(kv) => Ok((
                serde_json::from_slice(kv.value()).map_err(|e| Error::corrupt(key, e))?,
                kv.mod_revision(),
            )),
        }
    }
}

/// The put (or delete) of row `key`'s paused key for `paused`.
fn paused_op(key: &str, paused: Option<Timestamp>) -> Result<TxnOp> {
    let paused_key = ReminderKeys::paused(key);
    Ok(match paused {
        Some(t) => TxnOp::put(
            paused_key,
            serde_json::to_string(&Paused { paused: t })
                .map_err(|e| Error::backend(format!("encode paused: {e}")))?,
            None,
        ),
        None => TxnOp::delete(paused_key, None),
    })
}

fn fired_json(t: Timestamp) -> Result<String> {
    serde_json::to_string(&Fired { last_fired: t })
        .map_err(|e| Error::backend(format!("encode last_fired: {e}")))
}
