//! Reminder shard leases on DynamoDB, in the reminder table (keys `ShardKey` /
//! `SortKey`), one partition per shard so that a service's leases spread:
//!
//! | `ShardKey` | `SortKey` | attributes |
//! |---|---|---|
//! | `<service length>#<service>#<shard>#lease` | `lease` | `Row` (the lease, bytes), `ETag`, `Fence` (the row's fence token: its epoch while held, absent while released; a fenced state commit's `ConditionCheck` compares it) |
//! | `<service length>#<service>#<shard>#lease` | `page#<page set>#<index as 8 digits>` | `Page` (a page of the lease's exceptions, bytes; one item each, under the 400 KB item limit) |
//! | `<service length>#<service>#shards` | `shards` | `Shards` (the shard count) |
//!
//! A reminder partition ends in `#` and two hex digits; these end in `#lease`
//! and `#shards`, so no service's reminders can meet another's leases. A write
//! is one conditional `PutItem` (`ETag` equal, or no item); reads are
//! consistent.

use std::sync::Arc;

use async_trait::async_trait;
use aws_sdk_dynamodb::primitives::Blob;
use aws_sdk_dynamodb::types::{AttributeValue, ConditionCheck, ReturnValue, TransactWriteItem};
use rollcall_core::lease::{LeaseTable, LeaseWrite};
use rollcall_core::{Error, Etag, Expected, Fence, Result};
use tokio::sync::OnceCell;

use crate::conn::{is_condition_failed, n, new_etag, s, Attrs, Conn, Item};
use crate::schema::{self, SHARD_KEY, SORT_KEY};

/// The `ConditionCheck` of a fenced write (a state commit, a holder's
/// reminder-row write): the lease item of the fence's shard (in the
/// reminders table, where `service`'s leases are) has the fence's epoch as
/// its fence token.
pub(crate) fn fence_check(conn: &Conn, service: &str, f: &Fence) -> Result<TransactWriteItem> {
    let check = ConditionCheck::builder()
        .table_name(&conn.config.reminders_table)
        .set_key(Some(lease_item_key(service, f.shard)))
        .condition_expression("#f = :f")
        .expression_attribute_names("#f", FENCE)
        .expression_attribute_values(":f", n(f.epoch))
        .build()
        .map_err(|e| Error::backend(format!("dynamodb condition check: {e}")))?;
    Ok(TransactWriteItem::builder().condition_check(check).build())
}

/// The fence token of the lease item of `f`'s shard now (consistent read;
/// `None`: released, or no item).
pub(crate) async fn fence_token(conn: &Conn, service: &str, f: &Fence) -> Result<Option<u64>> {
    let table = &conn.config.reminders_table;
    let out = conn
        .client
        .get_item()
        .table_name(table)
        .set_key(Some(lease_item_key(service, f.shard)))
        .consistent_read(true)
        .send()
        .await
        .map_err(|e| conn.error("GetItem", table, e))?;
    Ok(out
        .item
        .as_ref()
        .and_then(|i| Attrs(i).opt_n::<u64>(FENCE).ok().flatten()))
}

const ROW: &str = "Row";
const ETAG: &str = "ETag";
const SHARDS: &str = "Shards";
const PAGE: &str = "Page";
/// The fence token attribute of a lease item.
pub(crate) const FENCE: &str = "Fence";

/// The key of the lease item of `shard` of service `service_id` (in the
/// reminders table).
pub(crate) fn lease_item_key(service_id: &str, shard: u32) -> Item {
    Item::from([
        (
            SHARD_KEY.to_owned(),
            s(format!("{}#{service_id}#{shard}#lease", service_id.len())),
        ),
        (SORT_KEY.to_owned(), s("lease")),
    ])
}

/// The shard lease rows of one reminder service on DynamoDB.
#[derive(Debug)]
pub struct DynamoDbLeaseTable {
    conn: Arc<Conn>,
    service_id: String,
    ready: OnceCell<()>,
}

impl DynamoDbLeaseTable {
    pub(crate) fn new(conn: Arc<Conn>, service_id: &str) -> Self {
        DynamoDbLeaseTable {
            conn,
            service_id: service_id.to_owned(),
            ready: OnceCell::new(),
        }
    }

    fn table_name(&self) -> &str {
        &self.conn.config.reminders_table
    }

    async fn ready(&self) -> Result<()> {
        self.ready
            .get_or_try_init(|| async {
                schema::ensure_table(
                    &self.conn,
                    &self.conn.config.reminders_table,
                    schema::Kind::Reminders,
                    self.conn.config.create_if_missing,
                )
                .await
            })
            .await
            .map(|_| ())
    }

    fn base(&self) -> String {
        format!("{}#{}", self.service_id.len(), self.service_id)
    }

    fn lease_key(&self, shard: u32) -> Item {
        lease_item_key(&self.service_id, shard)
    }

    fn shard_partition(&self, shard: u32) -> String {
        format!("{}#{shard}#lease", self.base())
    }

    fn page_key(&self, shard: u32, set: &str, index: u32) -> Item {
        Item::from([
            (SHARD_KEY.to_owned(), s(self.shard_partition(shard))),
            (SORT_KEY.to_owned(), s(format!("page#{set}#{index:08}"))),
        ])
    }

    /// The keys of every page of `shard`.
    async fn page_keys(&self, shard: u32) -> Result<Vec<Item>> {
        let q = self
            .conn
            .client
            .query()
            .consistent_read(true)
            .key_condition_expression("#p = :p AND begins_with(#s, :page)")
            .expression_attribute_names("#p", SHARD_KEY)
            .expression_attribute_names("#s", SORT_KEY)
            .expression_attribute_values(":p", s(self.shard_partition(shard)))
            .expression_attribute_values(":page", s("page#"))
            .projection_expression("#p, #s");
        self.conn.query_all(self.table_name(), q).await
    }

    fn count_key(&self) -> Item {
        Item::from([
            (SHARD_KEY.to_owned(), s(format!("{}#shards", self.base()))),
            (SORT_KEY.to_owned(), s("shards")),
        ])
    }

    async fn get(&self, key: Item) -> Result<Option<Item>> {
        self.ready().await?;
        let out = self
            .conn
            .client
            .get_item()
            .table_name(self.table_name())
            .set_key(Some(key))
            .consistent_read(true)
            .send()
            .await
            .map_err(|e| self.conn.error("GetItem", self.table_name(), e))?;
        Ok(out.item)
    }

    fn what(&self, shard: u32) -> String {
        format!("lease {}/{shard}", self.service_id)
    }

    /// The etag of a stored lease item.
    fn etag_of(&self, shard: u32, item: &Item) -> Result<Etag> {
        Attrs(item)
            .s(ETAG)
            .map(Etag::new)
            .map_err(|e| Error::corrupt(self.what(shard), e))
    }
}

#[async_trait]
impl LeaseTable for DynamoDbLeaseTable {
    fn service_id(&self) -> &str {
        &self.service_id
    }

    async fn shard_count(&self, shards: u32) -> Result<u32> {
        self.ready().await?;
        let mut item = self.count_key();
        item.insert(SHARDS.to_owned(), n(shards));
        let sent = self
            .conn
            .client
            .put_item()
            .table_name(self.table_name())
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(#k)")
            .expression_attribute_names("#k", SHARD_KEY)
            .send()
            .await;
        match sent {
            Ok(_) => Ok(shards),
            Err(e) if is_condition_failed(&e) => {
                let what = || format!("shard count of {}", self.service_id);
                let item = self
                    .get(self.count_key())
                    .await?
                    .ok_or_else(|| Error::corrupt(what(), "the shard count vanished"))?;
                Attrs(&item).n(SHARDS).map_err(|e| Error::corrupt(what(), e))
            }
            Err(e) => Err(self.conn.error("PutItem", self.table_name(), e)),
        }
    }

    async fn read_lease(&self, shard: u32) -> Result<Option<(Vec<u8>, Etag)>> {
        let Some(item) = self.get(self.lease_key(shard)).await? else {
            return Ok(None);
        };
        let etag = self.etag_of(shard, &item)?;
        match item.get(ROW) {
            Some(AttributeValue::B(b)) => Ok(Some((b.as_ref().to_vec(), etag))),
            _ => Err(Error::corrupt(
                self.what(shard),
                "attribute Row: missing or not bytes",
            )),
        }
    }

    async fn write_lease(&self, shard: u32, expected: &Expected, row: &[u8]) -> Result<LeaseWrite> {
        rollcall_core::lease::check_row(shard, row)?;
        self.ready().await?;
        let etag = new_etag();
        let mut item = self.lease_key(shard);
        item.insert(ROW.to_owned(), AttributeValue::B(Blob::new(row.to_vec())));
        item.insert(ETAG.to_owned(), s(etag.as_str()));
        if let Some(token) = rollcall_core::lease::fence_token(row) {
            item.insert(FENCE.to_owned(), n(token));
        }
        let mut put = self
            .conn
            .client
            .put_item()
            .table_name(self.table_name())
            .set_item(Some(item))
            .return_values(ReturnValue::None);
        match expected {
            Expected::Absent => {
                put = put
                    .condition_expression("attribute_not_exists(#k)")
                    .expression_attribute_names("#k", SHARD_KEY);
            }
            Expected::Etag(e) => {
                put = put
                    .condition_expression("#e = :e")
                    .expression_attribute_names("#e", ETAG)
                    .expression_attribute_values(":e", s(e.as_str()));
            }
            Expected::Any => {}
        }
        match put.send().await {
            Ok(_) => Ok(LeaseWrite::Written(etag)),
            Err(e) if is_condition_failed(&e) => {
                let current = match self.get(self.lease_key(shard)).await? {
                    Some(item) => Some(self.etag_of(shard, &item)?),
                    None => None,
                };
                Ok(LeaseWrite::Conflict(current))
            }
            Err(e) => Err(self.conn.error("PutItem", self.table_name(), e)),
        }
    }

    async fn write_pages(&self, shard: u32, set: &str, first: u32, pages: &[Vec<u8>]) -> Result<()> {
        for page in pages {
            rollcall_core::lease::check_row(shard, page)?;
        }
        self.ready().await?;
        for (i, page) in pages.iter().enumerate() {
            let mut item = self.page_key(shard, set, first + i as u32);
            item.insert(PAGE.to_owned(), AttributeValue::B(Blob::new(page.clone())));
            self.conn
                .client
                .put_item()
                .table_name(self.table_name())
                .set_item(Some(item))
                .send()
                .await
                .map_err(|e| self.conn.error("PutItem", self.table_name(), e))?;
        }
        Ok(())
    }

    async fn read_pages(&self, shard: u32, set: &str, count: u32) -> Result<Vec<Option<Vec<u8>>>> {
        self.ready().await?;
        let keys = (0..count).map(|i| self.page_key(shard, set, i)).collect();
        let items = self.conn.batch_get(self.table_name(), keys).await?;
        let mut out = vec![None; count as usize];
        let prefix = format!("page#{set}#");
        for item in &items {
            let attrs = Attrs(item);
            let index = attrs
                .s(SORT_KEY)
                .ok()
                .and_then(|sk| sk.strip_prefix(&prefix))
                .and_then(|i| i.parse::<usize>().ok());
            if let (Some(slot), Some(AttributeValue::B(b))) =
                (index.and_then(|i| out.get_mut(i)), item.get(PAGE))
            {
                *slot = Some(b.as_ref().to_vec());
            }
        }
        Ok(out)
    }

    async fn delete_pages(&self, shard: u32, keep: Option<&str>) -> Result<()> {
        self.ready().await?;
        let kept = keep.map(|set| format!("page#{set}#"));
        let stale: Vec<Item> = self
            .page_keys(shard)
            .await?
            .into_iter()
            .filter(|item| {
                let sk = Attrs(item).s(SORT_KEY).unwrap_or_default().to_owned();
                kept.as_ref().is_none_or(|k| !sk.starts_with(k.as_str()))
            })
            .collect();
        self.conn.batch_delete(self.table_name(), stale).await
    }

    async fn clear(&self) -> Result<()> {
        self.ready().await?;
        let Some(count) = self.get(self.count_key()).await? else {
            return Ok(());
        };
        let shards: u32 = Attrs(&count)
            .n(SHARDS)
            .map_err(|e| Error::corrupt(format!("shard count of {}", self.service_id), e))?;
        for k in 0..shards {
            self.delete_pages(k, None).await?;
        }
        let mut keys: Vec<Item> = (0..shards).map(|k| self.lease_key(k)).collect();
        keys.push(self.count_key());
        self.conn.batch_delete(self.table_name(), keys).await
    }
}
