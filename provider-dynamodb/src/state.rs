//! The grain-state table on DynamoDB: a table of its own (`state_table`, keys
//! `ShardKey`/`SortKey`, created on first use when `create_if_missing`), one
//! partition per actor as in Orleans (`<service length>#<service>#<actor id>`):
//!
//! | sort key | attributes |
//! |---|---|
//! | `h#<name>` | `Body` (the envelope, JSON), `ETag`, `Kind` (`<service length>#<service>#<actor kind>`, for listing), `ExpiresAt` (ms) and `Ttl` (s, for DynamoDB's TTL) when the state expires |
//! | `c#<name length>#<name>#<generation>#<index as 8 digits>` | `Data` (one chunk) |
//!
//! A commit is one `TransactWriteItems`: the header's put or delete carries the
//! condition (no header, or an unexpired one with the expected `ETag`), the inline
//! chunks are puts of the same transaction; a failed condition fails it all. An
//! item holds at most 400 KB and a transaction 100 actions and 4 MB: 350 KiB chunks,
//! at most 3 MiB and 90 rows per transaction. DynamoDB deletes expired items late
//! (enable TTL on `Ttl` to have it do so at all): reads check `ExpiresAt`.
//! Listing a kind scans the table (Orleans cannot list at all): an admin tool, not a
//! hot path.

use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{AttributeValue, Delete, Put, ReturnValue, TransactWriteItem};
use rollcall_core::state::{replaced_generation, Commit, HeaderWrite, StateLimits, StateTable};
use rollcall_core::{Error, Etag, Expected, Fence, KeyLimits, Result, StateKey, Timestamp};
use tokio::sync::OnceCell;

use crate::conn::{n, new_etag, s, Attrs, Conn, Item};
use crate::schema::{self, KIND, KIND_INDEX, MEMBER, SHARD_KEY, SORT_KEY, TTL};

const BODY: &str = "Body";
const ETAG: &str = "ETag";
const EXPIRES_AT: &str = "ExpiresAt";
const DATA: &str = "Data";

/// The longest actor ids and names DynamoDB stores, bytes, and why:
///
/// - a state's chunk rows have the sort key `c#<name length>#<name>#<generation>#<index>`,
///   40 bytes besides the name, and a sort key holds at most 1,024 bytes: names
///   up to 984 bytes;
/// - a reminder's sort key is `<hash, 8 hex>#<actor id length>#<actor id>#<name>`,
///   at most 15 bytes besides the actor id and the name: the two together up to
///   1,009 bytes (the kind index's `<actor id>\u{1}<name>` needs 1,023), so an
///   actor id has at most 1,008 bytes;
/// - labels (metrics ids, statistic names) are attributes or short keys: 256
///   bytes, as everywhere.
///
/// Every table checks them before it sends a request:
/// [`Error::InvalidInput`], nothing written (DynamoDB itself would answer a
/// `ValidationException`).
pub const DYNAMODB_KEY_LIMITS: KeyLimits = KeyLimits {
    actor_id: 1008,
    name: 1024 - 40,
    actor_id_and_name: 1009,
    label: 256,
};

/// `key` fits DynamoDB's keys ([`DYNAMODB_KEY_LIMITS`]).
fn check_key(key: &StateKey) -> Result<()> {
    DYNAMODB_KEY_LIMITS.check_key(key.actor_id(), key.name())
}

/// DynamoDB's limits for states.
pub const DYNAMODB_STATE_LIMITS: StateLimits = StateLimits {
    chunk_bytes: 350 * 1024,
    txn_bytes: 3 * 1024 * 1024,
    txn_rows: 90,
    max_state_bytes: rollcall_core::state::MAX_STATE_BYTES,
};

/// How often a commit that lost to a concurrent transaction (not to its
/// condition) is tried again before it reports the conflict.
const TRANSACT_ATTEMPTS: usize = 3;

/// The grain-state table of one service on DynamoDB.
#[derive(Debug)]
pub struct DynamoDbStateTable {
    conn: Arc<Conn>,
    service_id: String,
    ready: OnceCell<()>,
}

impl DynamoDbStateTable {
    pub(crate) fn new(conn: Arc<Conn>, service_id: &str) -> Self {
        DynamoDbStateTable {
            conn,
            service_id: service_id.to_owned(),
            ready: OnceCell::new(),
        }
    }

    fn table_name(&self) -> &str {
        &self.conn.config.state_table
    }

    async fn ready(&self) -> Result<()> {
        self.ready
            .get_or_try_init(|| async {
                schema::ensure_table(
                    &self.conn,
                    &self.conn.config.state_table,
                    schema::Kind::State,
                    self.conn.config.create_if_missing,
                )
                .await
            })
            .await
            .map(|_| ())
    }

    fn partition(&self, actor: &str) -> String {
        format!("{}#{}#{actor}", self.service_id.len(), self.service_id)
    }

    fn kind_tag(&self, kind: &str) -> String {
        format!("{}#{}#{kind}", self.service_id.len(), self.service_id)
    }

    fn key(&self, key: &StateKey, sort: String) -> Item {
        Item::from([
            (SHARD_KEY.to_owned(), s(self.partition(key.actor_id()))),
            (SORT_KEY.to_owned(), s(sort)),
        ])
    }

    fn header_sort(key: &StateKey) -> String {
        format!("h#{}", key.name())
    }

    fn chunks_sort_prefix(key: &StateKey) -> String {
        format!("c#{}#{}#", key.name().len(), key.name())
    }

    fn chunk_sort(key: &StateKey, generation: &str, i: u32) -> String {
        format!("{}{generation}#{i:08}", Self::chunks_sort_prefix(key))
    }

    /// A chunk item; with an expiry, the table's TTL attribute too, so that
    /// DynamoDB removes it with its header.
    fn chunk_item(
        &self,
        key: &StateKey,
        generation: &str,
        i: u32,
        data: &[u8],
        expires_at: Option<Timestamp>,
    ) -> Item {
        let mut item = self.key(key, Self::chunk_sort(key, generation, i));
        item.insert(DATA.to_owned(), AttributeValue::B(Blob::new(data.to_vec())));
        if let Some(at) = expires_at {
            item.insert(TTL.to_owned(), n(at.as_millis().div_ceil(1000)));
        }
        item
    }

    /// The header item of write `w` with etag `etag`.
    fn header_row(&self, w: &HeaderWrite<'_>, mut item: Item, body: &[u8], etag: &Etag) -> Item {
        item.insert(BODY.to_owned(), AttributeValue::B(Blob::new(body.to_vec())));
        item.insert(ETAG.to_owned(), s(etag.as_str()));
        item.insert(KIND.to_owned(), s(self.kind_tag(w.key.kind())));
        item.insert(MEMBER.to_owned(), s(member(w.key)));
        if let Some(at) = w.expires_at {
            item.insert(EXPIRES_AT.to_owned(), n(at.as_millis()));
            item.insert(TTL.to_owned(), n(at.as_millis().div_ceil(1000)));
        }
        item
    }

    /// One header write without chunk rows: a conditional `PutItem` or
    /// `DeleteItem` returning the old item (one round trip; a second read only
    /// on a conflict, to name the etag found).
    async fn commit_one(&self, w: &HeaderWrite<'_>) -> Result<Commit> {
        let (cond, names, values) = condition(&w.expected, Timestamp::now().as_millis());
        let key = self.key(w.key, Self::header_sort(w.key));
        let (etag, old) = match &w.header {
            Some(body) => {
                let etag = new_etag();
                let sent = self
                    .conn
                    .client
                    .put_item()
                    .table_name(self.table_name())
                    .set_item(Some(self.header_row(w, key, body, &etag)))
                    .set_condition_expression(cond)
                    .set_expression_attribute_names(names)
                    .set_expression_attribute_values(values)
                    .return_values(ReturnValue::AllOld)
                    .send()
                    .await;
                match self.conn.conditional("PutItem", self.table_name(), sent)? {
                    Some(out) => (Some(etag), out.attributes),
                    None => return self.conflict(w).await,
                }
            }
            None => {
                let sent = self
                    .conn
                    .client
                    .delete_item()
                    .table_name(self.table_name())
                    .set_key(Some(key))
                    .set_condition_expression(cond)
                    .set_expression_attribute_names(names)
                    .set_expression_attribute_values(values)
                    .return_values(ReturnValue::AllOld)
                    .send()
                    .await;
                match self.conn.conditional("DeleteItem", self.table_name(), sent)? {
                    Some(out) => (None, out.attributes),
                    None => return self.conflict(w).await,
                }
            }
        };
        let replaced = old.as_ref().and_then(replaced_of);
        Ok(Commit::Done {
            etags: vec![etag],
            replaced: vec![replaced],
        })
    }

    /// The conflict of a single write whose condition failed: the etag found.
    async fn conflict(&self, w: &HeaderWrite<'_>) -> Result<Commit> {
        let item = self.header_item(w.key).await?;
        let current = self.live_etag(w.key, item.as_ref(), Timestamp::now().as_millis())?;
        Ok(Commit::Conflict { index: 0, current })
    }

    /// The transaction of a commit (the fence's `ConditionCheck` first, then
    /// each write's chunks and conditional header), tried again while
    /// concurrent transactions cancel it. Its `Done` has no `replaced`.
    async fn transact(&self, writes: &[HeaderWrite<'_>], fence: Option<&Fence>) -> Result<Commit> {
        for _ in 0..TRANSACT_ATTEMPTS {
            let now = Timestamp::now().as_millis();
            let mut ops = Vec::new();
            if let Some(f) = fence {
                ops.push(crate::lease::fence_check(&self.conn, &self.service_id, f)?);
            }
            let mut etags = Vec::with_capacity(writes.len());
            for w in writes {
                let (cond, names, values) = condition(&w.expected, now);
                for (i, c) in w.chunks.iter().enumerate() {
                    ops.push(self.put(self.chunk_item(w.key, w.generation, i as u32, c, w.expires_at))?);
                }
                let key = self.key(w.key, Self::header_sort(w.key));
                match &w.header {
                    Some(body) => {
                        let etag = new_etag();
                        let item = self.header_row(w, key, body, &etag);
                        let put = Put::builder()
                            .table_name(self.table_name())
                            .set_item(Some(item))
                            .set_condition_expression(cond)
                            .set_expression_attribute_names(names)
                            .set_expression_attribute_values(values)
                            .build()
                            .map_err(|e| Error::backend(format!("dynamodb put: {e}")))?;
                        ops.push(TransactWriteItem::builder().put(put).build());
                        etags.push(Some(etag));
                    }
                    None => {
                        let del = Delete::builder()
                            .table_name(self.table_name())
                            .set_key(Some(key))
                            .set_condition_expression(cond)
                            .set_expression_attribute_names(names)
                            .set_expression_attribute_values(values)
                            .build()
                            .map_err(|e| Error::backend(format!("dynamodb delete: {e}")))?;
                        ops.push(TransactWriteItem::builder().delete(del).build());
                        etags.push(None);
                    }
                }
            }
            if self.conn.transact("state commit", self.table_name(), ops).await? {
                return Ok(Commit::Done {
                    etags,
                    replaced: Vec::new(),
                });
            }
            // A failed condition, or a concurrent transaction: which one?
            if let Some(f) = fence {
                let current = crate::lease::fence_token(&self.conn, &self.service_id, f).await?;
                if current != Some(f.epoch) {
                    return Ok(Commit::Fenced { current });
                }
            }
            for (index, w) in writes.iter().enumerate() {
                let item = self.header_item(w.key).await?;
                let current = self.live_etag(w.key, item.as_ref(), Timestamp::now().as_millis())?;
                if !w.expected.admits(current.as_ref()) {
                    return Ok(Commit::Conflict { index, current });
                }
            }
        }
        // Every precondition still holds: concurrent transactions kept
        // cancelling ours. Not a conflict of any write: transient.
        Err(Error::backend(format!(
            "dynamodb state commit: cancelled by concurrent transactions {TRANSACT_ATTEMPTS} times; try again"
        )))
    }

    fn put(&self, item: Item) -> Result<TransactWriteItem> {
        let put = Put::builder()
            .table_name(self.table_name())
            .set_item(Some(item))
            .build()
            .map_err(|e| Error::backend(format!("dynamodb put: {e}")))?;
        Ok(TransactWriteItem::builder().put(put).build())
    }

    /// The sort keys of the chunk items of `key` that start with `prefix`.
    async fn chunk_sorts(&self, key: &StateKey, prefix: String) -> Result<Vec<String>> {
        let query = self
            .conn
            .client
            .query()
            .consistent_read(true)
            .key_condition_expression("#pk = :pk AND begins_with(#sk, :p)")
            .expression_attribute_names("#pk", SHARD_KEY)
            .expression_attribute_names("#sk", SORT_KEY)
            .expression_attribute_values(":pk", s(self.partition(key.actor_id())))
            .expression_attribute_values(":p", s(prefix))
            .projection_expression("#sk");
        let items = self.conn.query_all(self.table_name(), query).await?;
        Ok(items
            .iter()
            .filter_map(|i| Attrs(i).s(SORT_KEY).ok().map(str::to_owned))
            .collect())
    }

    /// The header item of `key` as stored (expired or not).
    async fn header_item(&self, key: &StateKey) -> Result<Option<Item>> {
        let out = self
            .conn
            .client
            .get_item()
            .table_name(self.table_name())
            .set_key(Some(self.key(key, Self::header_sort(key))))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.conn.error("GetItem", self.table_name(), e))?;
        Ok(out.item)
    }

    /// The etag of a live header item (`None`: none, or expired).
    fn live_etag(&self, key: &StateKey, item: Option<&Item>, now: u64) -> Result<Option<Etag>> {
        let Some(item) = item else { return Ok(None) };
        let a = Attrs(item);
        let corrupt = |e: String| Error::corrupt(format!("{}/{key}", self.table_name()), e);
        if a.opt_n::<u64>(EXPIRES_AT)
            .map_err(corrupt)?
            .is_some_and(|t| t <= now)
        {
            return Ok(None);
        }
        Ok(Some(Etag::new(a.s(ETAG).map_err(corrupt)?)))
    }
}

#[async_trait]
impl StateTable for DynamoDbStateTable {
    fn service_id(&self) -> &str {
        &self.service_id
    }

    fn limits(&self) -> StateLimits {
        DYNAMODB_STATE_LIMITS
    }

    async fn read_header(&self, key: &StateKey) -> Result<Option<(Vec<u8>, Etag)>> {
        check_key(key)?;
        self.ready().await?;
        let item = self.header_item(key).await?;
        let Some(etag) = self.live_etag(key, item.as_ref(), Timestamp::now().as_millis())? else {
            return Ok(None);
        };
        match item.as_ref().and_then(|i| i.get(BODY)) {
            Some(AttributeValue::B(b)) => Ok(Some((b.as_ref().to_vec(), etag))),
            _ => Err(Error::corrupt(
                format!("{}/{key}", self.table_name()),
                "a header without a body",
            )),
        }
    }

    async fn read_chunks(
        &self,
        key: &StateKey,
        generation: &str,
        count: u32,
    ) -> Result<Vec<Option<Vec<u8>>>> {
        check_key(key)?;
        self.ready().await?;
        let keys: Vec<Item> = (0..count)
            .map(|i| self.key(key, Self::chunk_sort(key, generation, i)))
            .collect();
        let items = self.conn.batch_get(self.table_name(), keys).await?;
        let mut out = vec![None; count as usize];
        let prefix = format!("{}{generation}#", Self::chunks_sort_prefix(key));
        for item in &items {
            let attrs = Attrs(item);
            let Ok(sort) = attrs.s(SORT_KEY) else { continue };
            let Some(i) = sort.strip_prefix(&prefix).and_then(|i| i.parse::<usize>().ok()) else {
                continue;
            };
            if let (Some(slot), Some(AttributeValue::B(b))) = (out.get_mut(i), item.get(DATA)) {
                *slot = Some(b.as_ref().to_vec());
            }
        }
        Ok(out)
    }

    async fn put_chunks(
        &self,
        key: &StateKey,
        generation: &str,
        first: u32,
        chunks: &[&[u8]],
        expires_at: Option<Timestamp>,
    ) -> Result<()> {
        check_key(key)?;
        self.ready().await?;
        if chunks.is_empty() {
            return Ok(());
        }
        let ops = chunks
            .iter()
            .enumerate()
            .map(|(i, c)| self.put(self.chunk_item(key, generation, first + i as u32, c, expires_at)))
            .collect::<Result<Vec<_>>>()?;
        if self
            .conn
            .transact("stage state chunks", self.table_name(), ops)
            .await?
        {
            Ok(())
        } else {
            Err(Error::backend(
                "dynamodb: staging state chunks collided with another transaction",
            ))
        }
    }

    async fn commit(&self, writes: &[HeaderWrite<'_>], fence: Option<&Fence>) -> Result<Commit> {
        for w in writes {
            check_key(w.key)?;
        }
        self.ready().await?;
        match writes {
            [] => {
                return Ok(Commit::Done {
                    etags: Vec::new(),
                    replaced: Vec::new(),
                })
            }
            // One header and no chunk rows: one conditional PutItem (or
            // DeleteItem) that returns the item it replaced. A fenced one is a
            // transaction with the lease's ConditionCheck.
            [w] if w.chunks.is_empty() && fence.is_none() => return self.commit_one(w).await,
            _ => {}
        }
        // The generations the headers publish now (a transaction returns no old
        // items), so that their chunks can be deleted after. A fenced write of
        // one small header reads it beside its transaction instead of before
        // (one round trip, not two). That read may answer after this write
        // and even after a later writer's: it is trusted only when it names
        // the etag this write replaced (issue 72, item 6: a read held back
        // 3 s named a later writer's generation, whose chunks were then
        // deleted). A read not trusted costs the old chunks until a sweep.
        if let ([w], Some(_)) = (writes, fence) {
            if w.chunks.is_empty() {
                let (old, committed) =
                    futures_util::future::join(self.header_item(w.key), self.transact(writes, fence)).await;
                let replaced = match (&w.expected, old) {
                    (Expected::Etag(e), Ok(Some(item))) if matches!(item.get(ETAG), Some(AttributeValue::S(found)) if found == e.as_str()) => {
                        replaced_of(&item)
                    }
                    _ => None,
                };
                return Ok(match committed? {
                    Commit::Done { etags, .. } => Commit::Done {
                        etags,
                        replaced: vec![replaced],
                    },
                    other => other,
                });
            }
        }
        let mut replaced = Vec::with_capacity(writes.len());
        for w in writes {
            replaced.push(self.header_item(w.key).await?.as_ref().and_then(replaced_of));
        }
        Ok(match self.transact(writes, fence).await? {
            Commit::Done { etags, .. } => Commit::Done { etags, replaced },
            other => other,
        })
    }

    async fn generations(&self, key: &StateKey) -> Result<Vec<String>> {
        check_key(key)?;
        self.ready().await?;
        let prefix = Self::chunks_sort_prefix(key);
        let mut gens: Vec<String> = self
            .chunk_sorts(key, prefix.clone())
            .await?
            .iter()
            .filter_map(|sk| {
                sk.strip_prefix(&prefix)?
                    .rsplit_once('#')
                    .map(|(g, _)| g.to_owned())
            })
            .collect();
        gens.sort();
        gens.dedup();
        Ok(gens)
    }

    async fn delete_generation(&self, key: &StateKey, generation: &str) -> Result<()> {
        check_key(key)?;
        self.ready().await?;
        let sorts = self
            .chunk_sorts(key, format!("{}{generation}#", Self::chunks_sort_prefix(key)))
            .await?;
        let keys: Vec<Item> = sorts.into_iter().map(|sk| self.key(key, sk)).collect();
        self.conn.batch_delete(self.table_name(), keys).await
    }

    async fn list(&self, kind: &str, after: Option<&StateKey>, limit: usize) -> Result<Vec<StateKey>> {
        DYNAMODB_KEY_LIMITS.check_kind(kind)?;
        if let Some(k) = after {
            check_key(k)?;
        }
        self.ready().await?;
        let prefix = format!("{}#{}#", self.service_id.len(), self.service_id);
        let mut from = after.map(member);
        let limit = limit.max(1);
        loop {
            let mut query = self
                .conn
                .client
                .query()
                .table_name(self.table_name())
                .index_name(KIND_INDEX)
                .expression_attribute_names("#k", KIND)
                .expression_attribute_values(":k", s(self.kind_tag(kind)))
                .limit(limit as i32);
            query = match &from {
                Some(m) => query
                    .key_condition_expression("#k = :k AND #m > :m")
                    .expression_attribute_names("#m", MEMBER)
                    .expression_attribute_values(":m", s(m.as_str())),
                None => query.key_condition_expression("#k = :k"),
            };
            let out = query
                .send()
                .await
                .map_err(|e| self.conn.error("Query", self.table_name(), e))?;
            let items = out.items.unwrap_or_default();
            let keys: Vec<StateKey> = items
                .iter()
                .filter_map(|i| {
                    let a = Attrs(i);
                    let actor = a.s(SHARD_KEY).ok()?.strip_prefix(&prefix)?.to_owned();
                    let name = a.s(SORT_KEY).ok()?.strip_prefix("h#")?.to_owned();
                    StateKey::new(actor, name).ok()
                })
                .collect();
            // A full page of items that are not keys does not end the listing.
            let last = items
                .last()
                .and_then(|i| Attrs(i).s(MEMBER).ok().map(str::to_owned));
            match last {
                Some(m) if keys.is_empty() && items.len() == limit => from = Some(m),
                _ => return Ok(keys),
            }
        }
    }
}

/// The generation whose chunks a header item (as stored, expired or not)
/// published, if it had any.
fn replaced_of(item: &Item) -> Option<String> {
    match item.get(BODY) {
        Some(AttributeValue::B(b)) => replaced_generation(b.as_ref()),
        _ => None,
    }
}

/// The index range key of `key`: the actor id and the name apart by `\u{1}`
/// (which neither may hold), so that it sorts as the pair.
fn member(key: &StateKey) -> String {
    format!("{}\u{1}{}", key.actor_id(), key.name())
}

type Names = Option<std::collections::HashMap<String, String>>;
type Values = Option<std::collections::HashMap<String, AttributeValue>>;

/// The condition on a header for `expected` at `now` (ms): an expired header
/// counts as absent.
fn condition(expected: &Expected, now: u64) -> (Option<String>, Names, Values) {
    let names = |pairs: &[(&str, &str)]| {
        Some(
            pairs
                .iter()
                .map(|(a, b)| (a.to_string(), b.to_string()))
                .collect(),
        )
    };
    match expected {
        Expected::Any => (None, None, None),
        Expected::Absent => (
            Some("attribute_not_exists(#sk) OR #x <= :now".to_owned()),
            names(&[("#sk", SORT_KEY), ("#x", EXPIRES_AT)]),
            Some([(":now".to_owned(), n(now))].into()),
        ),
        Expected::Etag(e) => (
            Some("#e = :e AND (attribute_not_exists(#x) OR #x > :now)".to_owned()),
            names(&[("#e", ETAG), ("#x", EXPIRES_AT)]),
            Some([(":e".to_owned(), s(e.as_str())), (":now".to_owned(), n(now))].into()),
        ),
    }
}
