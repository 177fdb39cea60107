//! The reminder table on DynamoDB. No hot partition: a service's reminders are
//! spread over `reminder_shards` partitions by the top bits of their ring hash,
//! and within a partition the sort key starts with the hash as 8 hex digits, so a
//! ring range is one `BETWEEN` Query per partition it overlaps.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::operation::update_item::builders::UpdateItemFluentBuilder;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{AttributeValue, Delete, Put, TransactWriteItem, Update};
use rollcall_core::{
    actor_hash, Error, Etag, Fence, MissedTickPolicy, ReminderEntry, ReminderTable, Result, RunRecord,
    Timestamp,
};

use crate::conn::{n, new_etag, s, Attrs, Conn, Item};
use crate::schema::{self, SHARD_KEY, SORT_KEY};

const SERVICE_ID: &str = "ServiceId";
const ACTOR_ID: &str = "ActorId";
const REMINDER_NAME: &str = "ReminderName";
const START_TIME: &str = "StartTime";
/// Milliseconds; absent for a one-shot reminder.
const PERIOD_MS: &str = "PeriodMs";
const ACTOR_HASH: &str = "ActorHash";
const ETAG: &str = "ETag";
const LAST_FIRED: &str = "LastFired";
const MISSED_TICK_POLICY: &str = "MissedTickPolicy";
/// A cron expression (absent for a periodic or one-shot reminder).
const CRON: &str = "Cron";
/// The IANA zone of `Cron` (absent: UTC).
const ZONE: &str = "Zone";
/// The time of the last occurrence delivered (absent: no end).
const END_TIME: &str = "EndTime";
/// The tick payload, binary (absent: none).
const PAYLOAD: &str = "Payload";
/// The retry policy as JSON (absent: the service's default).
const RETRY: &str = "Retry";
/// Since when the reminder is paused (absent: it ticks).
const PAUSED: &str = "Paused";
/// The reminder a trigger row triggered (absent: not a trigger).
const TRIGGER_OF: &str = "TriggerOf";

/// The keys this table stores (every call checks them before it sends anything).
const LIMITS: rollcall_core::KeyLimits = crate::DYNAMODB_KEY_LIMITS;

/// The reminder table of one service on DynamoDB.
#[derive(Debug, Clone)]
pub struct DynamoDbReminderTable {
    conn: Arc<Conn>,
    service_id: String,
}

/// The sort key of a reminder: hash first (range reads), then the actor id with
/// its length (so no two (actor, name) pairs share a key), then the name.
fn sort_key(hash: u32, actor: &str, name: &str) -> String {
    format!("{hash:08x}#{}#{actor}#{name}", actor.len())
}

/// The sort key of a reminder's run history, in the partition of its row:
/// `runs#` and the row's sort key. `r` sorts after every hex digit, so no read
/// of rows (hex sort keys) meets one.
fn runs_sort_key(hash: u32, actor: &str, name: &str) -> String {
    format!("runs#{}", sort_key(hash, actor, name))
}

/// A run history's records (JSON, newest first).
const RUNS: &str = "Runs";
/// A run history's version, bumped by every write (the append's condition).
const RUNS_VERSION: &str = "RunsVersion";

impl DynamoDbReminderTable {
    pub(crate) fn new(conn: Arc<Conn>, service_id: &str) -> Self {
        DynamoDbReminderTable {
            conn,
            service_id: service_id.to_owned(),
        }
    }

    /// The reminder table's name.
    fn table_name(&self) -> &str {
        &self.conn.config.reminders_table
    }

    fn bits(&self) -> u32 {
        self.conn.config.shard_bits()
    }

    /// The partition of a hash: its top `bits` bits.
    fn shard_of(&self, hash: u32) -> u32 {
        match self.bits() {
            0 => 0,
            b => hash >> (32 - b),
        }
    }

    /// The partition key of shard `shard`: the service id, then the shard as 2
    /// hex digits (a fixed-width suffix, so no two services share a partition).
    fn shard_key(&self, shard: u32) -> String {
        format!("{}#{shard:02x}", self.service_id)
    }

    fn key(&self, hash: u32, actor: &str, name: &str) -> Item {
        Item::from([
            (SHARD_KEY.into(), s(self.shard_key(self.shard_of(hash)))),
            (SORT_KEY.into(), s(sort_key(hash, actor, name))),
        ])
    }

    fn item_name(&self, item: &Item) -> String {
        let a = Attrs(item);
        format!(
            "{}/{}/{}",
            self.table_name(),
            a.s(SHARD_KEY).unwrap_or("?"),
            a.s(SORT_KEY).unwrap_or("?")
        )
    }

    fn encode(&self, e: &ReminderEntry, etag: &Etag) -> Item {
        let mut item = self.key(e.hash, &e.actor_id, &e.name);
        item.insert(SERVICE_ID.into(), s(&self.service_id));
        item.insert(ACTOR_ID.into(), s(&e.actor_id));
        item.insert(REMINDER_NAME.into(), s(&e.name));
        item.insert(START_TIME.into(), s(e.start_at.to_string()));
        if let Some(p) = e.period {
            item.insert(PERIOD_MS.into(), n(p.as_millis()));
        }
        item.insert(ACTOR_HASH.into(), n(e.hash));
        item.insert(ETAG.into(), s(etag.as_str()));
        if let Some(t) = e.last_fired {
            item.insert(LAST_FIRED.into(), s(t.to_string()));
        }
        if e.missed_tick_policy != MissedTickPolicy::Skip {
            item.insert(
                MISSED_TICK_POLICY.into(),
                s(format!("{:?}", e.missed_tick_policy)),
            );
        }
        if let Some(cron) = &e.cron {
            item.insert(CRON.into(), s(cron));
        }
        if let Some(zone) = &e.zone {
            item.insert(ZONE.into(), s(zone));
        }
        if let Some(t) = e.end_at {
            item.insert(END_TIME.into(), s(t.to_string()));
        }
        if let Some(payload) = &e.payload {
            item.insert(PAYLOAD.into(), AttributeValue::B(Blob::new(payload.clone())));
        }
        if let Some(retry) = &e.retry {
            if let Ok(json) = serde_json::to_string(retry) {
                item.insert(RETRY.into(), s(json));
            }
        }
        if let Some(t) = e.paused {
            item.insert(PAUSED.into(), s(t.to_string()));
        }
        if let Some(of) = &e.trigger_of {
            item.insert(TRIGGER_OF.into(), s(of));
        }
        item
    }

    /// Decodes a stored reminder, checking that it sits under its own key.
    fn decode(&self, item: &Item) -> Result<ReminderEntry> {
        let a = Attrs(item);
        let decoded = (|| -> std::result::Result<ReminderEntry, String> {
            let actor = a.s(ACTOR_ID)?;
            let name = a.s(REMINDER_NAME)?;
            let hash: u32 = a.n(ACTOR_HASH)?;
            if hash != actor_hash(actor) {
                return Err("ActorHash does not match ActorId".into());
            }
            if a.s(SERVICE_ID)? != self.service_id
                || item.get(SORT_KEY) != Some(&s(sort_key(hash, actor, name)))
            {
                return Err("reminder stored under another reminder's key".into());
            }
            let policy = match a.opt_s(MISSED_TICK_POLICY)? {
                None | Some("Skip") => MissedTickPolicy::Skip,
                Some("FireOnce") => MissedTickPolicy::FireOnce,
                Some(other) => return Err(format!("attribute MissedTickPolicy = {other:?}")),
            };
            let etag = a.s(ETAG)?;
            if etag.is_empty() {
                return Err("attribute ETag is empty".into());
            }
            Ok(ReminderEntry {
                service_id: self.service_id.clone(),
                actor_id: actor.to_owned(),
                name: name.to_owned(),
                start_at: a.parsed(START_TIME)?,
                period: a.opt_n::<u64>(PERIOD_MS)?.map(Duration::from_millis),
                hash,
                etag: Etag::new(etag),
                last_fired: a
                    .opt_s(LAST_FIRED)?
                    .map(str::parse)
                    .transpose()
                    .map_err(|e| format!("attribute LastFired: {e}"))?,
                paused: a
                    .opt_s(PAUSED)?
                    .map(str::parse)
                    .transpose()
                    .map_err(|e| format!("attribute Paused: {e}"))?,
                trigger_of: a.opt_s(TRIGGER_OF)?.map(str::to_owned),
                missed_tick_policy: policy,
                cron: a.opt_s(CRON)?.map(str::to_owned),
                zone: a.opt_s(ZONE)?.map(str::to_owned),
                end_at: a
                    .opt_s(END_TIME)?
                    .map(str::parse)
                    .transpose()
                    .map_err(|e| format!("attribute EndTime: {e}"))?,
                payload: match item.get(PAYLOAD) {
                    None | Some(AttributeValue::Null(_)) => None,
                    Some(AttributeValue::B(b)) => Some(b.as_ref().to_vec()),
                    Some(_) => return Err("attribute Payload is not binary".into()),
                },
                retry: a
                    .opt_s(RETRY)?
                    .map(serde_json::from_str)
                    .transpose()
                    .map_err(|e| format!("attribute Retry: {e}"))?,
            })
        })();
        decoded.map_err(|why| Error::corrupt(self.item_name(item), why))
    }

    /// Every item of shard `shard` whose sort key lies in `[lo, hi]`, all pages
    /// (`keys_only`: just the keys).
    async fn query(&self, shard: u32, lo: &str, hi: &str, keys_only: bool) -> Result<Vec<Item>> {
        let mut q = self
            .conn
            .client
            .query()
            .consistent_read(true)
            .key_condition_expression("#p = :p AND #s BETWEEN :lo AND :hi")
            .expression_attribute_names("#p", SHARD_KEY)
            .expression_attribute_names("#s", SORT_KEY)
            .expression_attribute_values(":p", s(self.shard_key(shard)))
            .expression_attribute_values(":lo", s(lo))
            .expression_attribute_values(":hi", s(hi));
        if keys_only {
            q = q.projection_expression("#p, #s");
        }
        self.conn.query_all(self.table_name(), q).await
    }

    /// Updates the row `(actor_id, name)` as `update` says if its etag is
    /// `etag`, leaving the etag as it is (the columns outside the registration:
    /// `last_fired`, `paused`). `Ok(false)`: missing or stale, nothing written.
    async fn update_under_etag(
        &self,
        what: &str,
        actor_id: &str,
        name: &str,
        etag: &Etag,
        update: impl FnOnce(UpdateItemFluentBuilder) -> UpdateItemFluentBuilder,
    ) -> Result<bool> {
        LIMITS.check_key(actor_id, name)?;
        if etag.is_empty() {
            return Ok(false);
        }
        let request = self
            .conn
            .client
            .update_item()
            .table_name(self.table_name())
            .set_key(Some(self.key(actor_hash(actor_id), actor_id, name)))
            .condition_expression("#e = :e")
            .expression_attribute_names("#e", ETAG)
            .expression_attribute_values(":e", s(etag.as_str()));
        let sent = update(request).send().await;
        Ok(self.conn.conditional(what, self.table_name(), sent)?.is_some())
    }

    /// A holder's write `op` of reminder `(actor_id, name)` under `fence`: one
    /// `TransactWriteItems` of the fence's `ConditionCheck` and `op`.
    /// `Ok(false)` when `op`'s own condition failed (nothing written); the
    /// fence's refusal when its lease is no longer at its epoch (read after
    /// a failed transaction, to tell the two apart).
    async fn fenced(
        &self,
        what: &str,
        fence: &Fence,
        (actor_id, name): (&str, &str),
        op: TransactWriteItem,
    ) -> Result<bool> {
        let check = crate::lease::fence_check(&self.conn, &self.service_id, fence)?;
        if self
            .conn
            .transact(what, self.table_name(), vec![check, op])
            .await?
        {
            return Ok(true);
        }
        let current = crate::lease::fence_token(&self.conn, &self.service_id, fence).await?;
        if current != Some(fence.epoch) {
            return Err(fence.refused_reminder(actor_id, name, current));
        }
        Ok(false)
    }

    /// The key of the run history of `(actor, name)`.
    fn runs_key(&self, actor: &str, name: &str) -> Item {
        let hash = actor_hash(actor);
        Item::from([
            (SHARD_KEY.into(), s(self.shard_key(self.shard_of(hash)))),
            (SORT_KEY.into(), s(runs_sort_key(hash, actor, name))),
        ])
    }

    /// The run history at `key` and its version (0: none).
    async fn runs_at(&self, key: &Item) -> Result<(Vec<RunRecord>, u64)> {
        let out = self
            .conn
            .client
            .get_item()
            .table_name(self.table_name())
            .consistent_read(true)
            .set_key(Some(key.clone()))
            .send()
            .await
            .map_err(|e| self.conn.error("GetItem", self.table_name(), e))?;
        let Some(item) = out.item.filter(|i| !i.is_empty()) else {
            return Ok((Vec::new(), 0));
        };
        let a = Attrs(&item);
        let decoded = (|| -> std::result::Result<(Vec<RunRecord>, u64), String> {
            let runs = serde_json::from_str(a.s(RUNS)?).map_err(|e| format!("attribute Runs: {e}"))?;
            Ok((runs, a.n(RUNS_VERSION)?))
        })();
        decoded.map_err(|why| Error::corrupt(self.item_name(&item), why))
    }

    /// The reminders with a hash in `[lo, hi]`: one Query per shard overlapping it.
    async fn hash_range(&self, lo: u32, hi: u32) -> Result<Vec<ReminderEntry>> {
        let mut out = Vec::new();
        for shard in self.shard_of(lo)..=self.shard_of(hi) {
            let from = format!("{lo:08x}");
            // '$' sorts right after '#', so this bound is above every key of hash `hi`.
            let to = format!("{hi:08x}$");
            for item in self.query(shard, &from, &to, false).await? {
                out.push(self.decode(&item)?);
            }
        }
        Ok(out)
    }
}

#[async_trait]
impl ReminderTable for DynamoDbReminderTable {
    fn service_id(&self) -> &str {
        &self.service_id
    }

    async fn init(&self) -> Result<()> {
        schema::ensure_table(
            &self.conn,
            self.table_name(),
            schema::Kind::Reminders,
            self.conn.config.create_if_missing,
        )
        .await
    }

    async fn read_rows_for(&self, actor_id: &str) -> Result<Vec<ReminderEntry>> {
        LIMITS.check_actor_id(actor_id)?;
        let hash = actor_hash(actor_id);
        let q = self
            .conn
            .client
            .query()
            .consistent_read(true)
            .key_condition_expression("#p = :p AND begins_with(#s, :prefix)")
            .expression_attribute_names("#p", SHARD_KEY)
            .expression_attribute_names("#s", SORT_KEY)
            .expression_attribute_values(":p", s(self.shard_key(self.shard_of(hash))))
            .expression_attribute_values(":prefix", s(format!("{hash:08x}#{}#{actor_id}#", actor_id.len())));
        let items = self.conn.query_all(self.table_name(), q).await?;
        items.iter().map(|i| self.decode(i)).collect()
    }

    async fn read_rows_in_range(&self, begin: u32, end: u32) -> Result<Vec<ReminderEntry>> {
        // (begin, end], or (begin, MAX] and [0, end] when it wraps.
        let mut out = Vec::new();
        if begin < end {
            out.extend(self.hash_range(begin + 1, end).await?);
        } else {
            if begin < u32::MAX {
                out.extend(self.hash_range(begin + 1, u32::MAX).await?);
            }
            out.extend(self.hash_range(0, end).await?);
        }
        Ok(out)
    }

    async fn read_row(&self, actor_id: &str, name: &str) -> Result<Option<ReminderEntry>> {
        LIMITS.check_key(actor_id, name)?;
        let out = self
            .conn
            .client
            .get_item()
            .table_name(self.table_name())
            .consistent_read(true)
            .set_key(Some(self.key(actor_hash(actor_id), actor_id, name)))
            .send()
            .await
            .map_err(|e| self.conn.error("GetItem", self.table_name(), e))?;
        out.item
            .filter(|i| !i.is_empty())
            .map(|i| self.decode(&i))
            .transpose()
    }

    async fn upsert_row(&self, entry: &ReminderEntry) -> Result<Etag> {
        entry.validate_for(&self.service_id, &LIMITS)?;
        let etag = new_etag();
        self.conn
            .client
            .put_item()
            .table_name(self.table_name())
            .set_item(Some(self.encode(entry, &etag)))
            .send()
            .await
            .map_err(|e| self.conn.error("upsert_row", self.table_name(), e))?;
        Ok(etag)
    }

    async fn remove_row(
        &self,
        actor_id: &str,
        name: &str,
        etag: &Etag,
        fence: Option<&Fence>,
    ) -> Result<bool> {
        LIMITS.check_key(actor_id, name)?;
        if let Some(f) = fence {
            f.check_reminder(&self.service_id, actor_id)?;
        }
        if etag.is_empty() {
            return Ok(false);
        }
        if let Some(f) = fence {
            let delete = Delete::builder()
                .table_name(self.table_name())
                .set_key(Some(self.key(actor_hash(actor_id), actor_id, name)))
                .condition_expression("#e = :e")
                .expression_attribute_names("#e", ETAG)
                .expression_attribute_values(":e", s(etag.as_str()))
                .build()
                .map_err(|e| Error::backend(format!("dynamodb delete: {e}")))?;
            let op = TransactWriteItem::builder().delete(delete).build();
            return self.fenced("remove_row", f, (actor_id, name), op).await;
        }
        let sent = self
            .conn
            .client
            .delete_item()
            .table_name(self.table_name())
            .set_key(Some(self.key(actor_hash(actor_id), actor_id, name)))
            .condition_expression("#e = :e")
            .expression_attribute_names("#e", ETAG)
            .expression_attribute_values(":e", s(etag.as_str()))
            .send()
            .await;
        Ok(self
            .conn
            .conditional("remove_row", self.table_name(), sent)?
            .is_some())
    }

    async fn update_last_fired(
        &self,
        actor_id: &str,
        name: &str,
        etag: &Etag,
        fired_at: Timestamp,
        fence: Option<&Fence>,
    ) -> Result<bool> {
        if let Some(f) = fence {
            LIMITS.check_key(actor_id, name)?;
            f.check_reminder(&self.service_id, actor_id)?;
            if etag.is_empty() {
                return Ok(false);
            }
            let update = Update::builder()
                .table_name(self.table_name())
                .set_key(Some(self.key(actor_hash(actor_id), actor_id, name)))
                .update_expression("SET #f = :f")
                .condition_expression("#e = :e")
                .expression_attribute_names("#e", ETAG)
                .expression_attribute_names("#f", LAST_FIRED)
                .expression_attribute_values(":e", s(etag.as_str()))
                .expression_attribute_values(":f", s(fired_at.to_string()))
                .build()
                .map_err(|e| Error::backend(format!("dynamodb update: {e}")))?;
            let op = TransactWriteItem::builder().update(update).build();
            return self.fenced("update_last_fired", f, (actor_id, name), op).await;
        }
        self.update_under_etag("update_last_fired", actor_id, name, etag, |u| {
            u.update_expression("SET #f = :f")
                .expression_attribute_names("#f", LAST_FIRED)
                .expression_attribute_values(":f", s(fired_at.to_string()))
        })
        .await
    }

    async fn update_paused(
        &self,
        actor_id: &str,
        name: &str,
        etag: &Etag,
        paused: Option<Timestamp>,
    ) -> Result<bool> {
        self.update_under_etag("update_paused", actor_id, name, etag, |u| {
            let u = u.expression_attribute_names("#p", PAUSED);
            match paused {
                Some(t) => u
                    .update_expression("SET #p = :p")
                    .expression_attribute_values(":p", s(t.to_string())),
                None => u.update_expression("REMOVE #p"),
            }
        })
        .await
    }

    async fn append_run(
        &self,
        actor_id: &str,
        name: &str,
        run: &RunRecord,
        keep: usize,
        fence: Option<&Fence>,
    ) -> Result<()> {
        LIMITS.check_key(actor_id, name)?;
        rollcall_core::check_run_keep(keep)?;
        if let Some(f) = fence {
            f.check_reminder(&self.service_id, actor_id)?;
        }
        let key = self.runs_key(actor_id, name);
        // Read, prepend, write if unchanged; again on a race. A write that
        // timed out but landed shows as `run` at the front on the next read.
        for _ in 0..16 {
            let (mut runs, version) = self.runs_at(&key).await?;
            if !rollcall_core::prepend_run(&mut runs, run, keep) {
                return Ok(());
            }
            let json =
                serde_json::to_string(&runs).map_err(|e| Error::backend(format!("encode runs: {e}")))?;
            let mut item = key.clone();
            item.insert(RUNS.into(), s(json));
            item.insert(RUNS_VERSION.into(), AttributeValue::N((version + 1).to_string()));
            if let Some(f) = fence {
                let put = Put::builder()
                    .table_name(self.table_name())
                    .set_item(Some(item))
                    .expression_attribute_names("#v", RUNS_VERSION);
                let put = if version == 0 {
                    put.condition_expression("attribute_not_exists(#v)")
                } else {
                    put.condition_expression("#v = :v")
                        .expression_attribute_values(":v", AttributeValue::N(version.to_string()))
                };
                let put = put
                    .build()
                    .map_err(|e| Error::backend(format!("dynamodb put: {e}")))?;
                let op = TransactWriteItem::builder().put(put).build();
                if self.fenced("append_run", f, (actor_id, name), op).await? {
                    return Ok(());
                }
                continue;
            }
            let put = self
                .conn
                .client
                .put_item()
                .table_name(self.table_name())
                .set_item(Some(item));
            let put = if version == 0 {
                put.condition_expression("attribute_not_exists(#v)")
                    .expression_attribute_names("#v", RUNS_VERSION)
            } else {
                put.condition_expression("#v = :v")
                    .expression_attribute_names("#v", RUNS_VERSION)
                    .expression_attribute_values(":v", AttributeValue::N(version.to_string()))
            };
            let sent = put.send().await;
            if self
                .conn
                .conditional("append_run", self.table_name(), sent)?
                .is_some()
            {
                return Ok(());
            }
        }
        Err(Error::backend(format!(
            "{}: 16 appends lost the race in a row",
            self.item_name(&key)
        )))
    }

    async fn read_runs(&self, actor_id: &str, name: &str) -> Result<Vec<RunRecord>> {
        LIMITS.check_key(actor_id, name)?;
        Ok(self.runs_at(&self.runs_key(actor_id, name)).await?.0)
    }

    async fn remove_runs(&self, actor_id: &str, name: &str) -> Result<()> {
        LIMITS.check_key(actor_id, name)?;
        self.conn
            .client
            .delete_item()
            .table_name(self.table_name())
            .set_key(Some(self.runs_key(actor_id, name)))
            .send()
            .await
            .map_err(|e| self.conn.error("remove_runs", self.table_name(), e))?;
        Ok(())
    }

    async fn clear(&self) -> Result<()> {
        // Shard by shard, 25 keys per BatchWriteItem. A reminder is one item, so a
        // racing upsert is either deleted whole or kept whole. Then the run
        // histories (sort keys `runs#...`).
        for shard in 0..self.conn.config.reminder_shards {
            let keys = self.query(shard, "0", "g", true).await?;
            self.conn.batch_delete(self.table_name(), keys).await?;
            let runs = self.query(shard, "runs#", "runs$", true).await?;
            self.conn.batch_delete(self.table_name(), runs).await?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sort_keys_never_collide_and_keep_hash_order() {
        assert_ne!(sort_key(1, "a#1#b", "c"), sort_key(1, "a", "1#b#c"));
        assert_ne!(sort_key(1, "ab", "c"), sort_key(1, "a", "bc"));
        assert!(sort_key(1, "zzz", "zzz") < sort_key(2, "", ""));
        assert!(sort_key(0xffff_ffff, "z", "z").as_str() < "ffffffff$");
        assert!(format!("{:08x}", 5) < sort_key(5, "", ""));
    }
}
