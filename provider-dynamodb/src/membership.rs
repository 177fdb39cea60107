//! The membership table on DynamoDB: one item per silo and a version item, all
//! in the cluster's partition; conditional writes are `TransactWriteItems`.

use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use aws_sdk_dynamodb::types::{AttributeValue, Delete, Get, Put, TransactGetItem, TransactWriteItem, Update};
use rollcall_core::{
    history::require_history, CorruptRow, Error, Etag, HistoryQuery, MembershipDelta, MembershipEntry,
    MembershipEvent, MembershipRow, MembershipRows, MembershipSnapshot, MembershipTable, ProtocolMode,
    Result, SiloAddress, SiloStatus, SuspectVote, TableVersion, Timestamp, WriteKind, WriteMode, WriteOrigin,
};

use crate::conn::{is_condition_failed, n, new_etag, s, Attrs, Conn, Item};
use crate::schema::{self, CLUSTER_ID, HISTORY_ROWS, METRICS_ROWS, SILO_IDENTITY, VERSION_ROW};

/// The version etag a cluster without a version item reads as. Never a stored
/// etag (those are 16 hex digits); a write at version 1 conditioned on it creates
/// the version item.
const NO_VERSION_ITEM: &str = "none";
/// Times a read is repeated when it saw a row written after the version it read.
const READ_ATTEMPTS: u32 = 10;
/// Items per `TransactWriteItems` (DynamoDB allows 100; 25 is what every
/// DynamoDB-compatible server accepts).
const TRANSACT_ITEMS: usize = 25;

// Column names, after Orleans' silo-instance table.
const ADDRESS: &str = "Address";
const PORT: &str = "Port";
const GENERATION: &str = "Generation";
const STATUS: &str = "Status";
const SUSPECTING_SILOS: &str = "SuspectingSilos";
const SUSPECTING_TIMES: &str = "SuspectingTimes";
const PROXY_PORT: &str = "ProxyPort";
const HOST_NAME: &str = "HostName";
const SILO_NAME: &str = "SiloName";
const ROLE_NAME: &str = "RoleName";
const UPDATE_ZONE: &str = "UpdateZone";
const FAULT_ZONE: &str = "FaultZone";
const START_TIME: &str = "StartTime";
const I_AM_ALIVE_TIME: &str = "IAmAliveTime";
/// Not an Orleans column: present (true) only while the silo's clock is beyond
/// the cluster's bound.
const CLOCK_BEYOND_BOUND: &str = "ClockBeyondBound";
const ETAG: &str = "ETag";
/// The table version a row was last written at (delta reads).
const TABLE_VERSION: &str = "TableVersion";
/// The version item's version number.
const VERSION: &str = "Version";
/// A history item's table version (N) and event (S, JSON).
const EVENT_VERSION: &str = "EventVersion";
const EVENT: &str = "Event";

/// The sort key of the history event at `version` (zero-padded: key order is
/// version order).
fn history_sk(version: u64) -> String {
    format!("{HISTORY_ROWS}{version:020}")
}

/// The item of a row written at table version `written_at` with `etag`.
fn row_item(cluster: &str, e: &MembershipEntry, written_at: u64, etag: &Etag) -> Item {
    let mut item = Item::new();
    item.insert(CLUSTER_ID.into(), s(cluster));
    item.insert(SILO_IDENTITY.into(), s(e.silo.to_string()));
    item.insert(ADDRESS.into(), s(e.silo.endpoint().ip().to_string()));
    item.insert(PORT.into(), n(e.silo.endpoint().port()));
    item.insert(GENERATION.into(), n(e.silo.generation()));
    item.insert(STATUS.into(), s(e.status.to_string()));
    let (silos, times) = e
        .suspect_votes
        .iter()
        .map(|v| (s(v.silo.to_string()), s(v.time.to_string())))
        .unzip();
    item.insert(SUSPECTING_SILOS.into(), AttributeValue::L(silos));
    item.insert(SUSPECTING_TIMES.into(), AttributeValue::L(times));
    item.insert(PROXY_PORT.into(), n(e.proxy_port));
    item.insert(HOST_NAME.into(), s(&e.host_name));
    item.insert(SILO_NAME.into(), s(&e.silo_name));
    item.insert(ROLE_NAME.into(), s(&e.role_name));
    item.insert(UPDATE_ZONE.into(), n(e.update_zone));
    item.insert(FAULT_ZONE.into(), n(e.fault_zone));
    item.insert(START_TIME.into(), s(e.start_time.to_string()));
    item.insert(I_AM_ALIVE_TIME.into(), s(e.i_am_alive_time.to_string()));
    if e.clock_beyond_bound {
        item.insert(CLOCK_BEYOND_BOUND.into(), AttributeValue::Bool(true));
    }
    item.insert(ETAG.into(), s(etag.as_str()));
    item.insert(TABLE_VERSION.into(), n(written_at));
    item
}

/// A decoded row: the entry, its etag and the table version it was written at.
type Row = (MembershipEntry, Etag, u64);

fn decode_row(item: &Item) -> std::result::Result<Row, String> {
    let a = Attrs(item);
    let silo: SiloAddress = a.parsed(SILO_IDENTITY)?;
    let (ip, port, generation) = (a.s(ADDRESS)?, a.n::<u16>(PORT)?, a.n::<u64>(GENERATION)?);
    if ip.parse().ok() != Some(silo.endpoint().ip())
        || port != silo.endpoint().port()
        || generation != silo.generation()
    {
        return Err("Address, Port and Generation disagree with SiloIdentity".into());
    }
    let voters: Vec<SiloAddress> = a.list(SUSPECTING_SILOS)?;
    let times: Vec<Timestamp> = a.list(SUSPECTING_TIMES)?;
    if voters.len() != times.len() {
        return Err(format!(
            "{} SuspectingSilos but {} SuspectingTimes",
            voters.len(),
            times.len()
        ));
    }
    let entry = MembershipEntry {
        silo,
        status: a.parsed::<SiloStatus>(STATUS)?,
        suspect_votes: voters
            .into_iter()
            .zip(times)
            .map(|(silo, time)| SuspectVote { silo, time })
            .collect(),
        proxy_port: a.n(PROXY_PORT)?,
        host_name: a.s(HOST_NAME)?.to_owned(),
        silo_name: a.s(SILO_NAME)?.to_owned(),
        role_name: a.s(ROLE_NAME)?.to_owned(),
        update_zone: a.n(UPDATE_ZONE)?,
        fault_zone: a.n(FAULT_ZONE)?,
        start_time: a.parsed(START_TIME)?,
        i_am_alive_time: a.parsed(I_AM_ALIVE_TIME)?,
        clock_beyond_bound: a.opt_bool(CLOCK_BEYOND_BOUND)?,
    };
    let etag = a.s(ETAG)?;
    if etag.is_empty() {
        return Err("attribute ETag is empty".into());
    }
    Ok((entry, Etag::new(etag), a.n(TABLE_VERSION)?))
}

/// A read of the cluster's partition, decoded.
struct Read {
    /// `None`: no version item.
    version: Option<TableVersion>,
    rows: MembershipRows,
    corrupt: Vec<CorruptRow>,
    /// The highest table version among the rows.
    newest_row: u64,
}

/// The membership table of one cluster on DynamoDB.
#[derive(Debug, Clone)]
pub struct DynamoDbMembershipTable {
    conn: Arc<Conn>,
    cluster_id: String,
    mode: ProtocolMode,
}

impl DynamoDbMembershipTable {
    pub(crate) fn new(conn: Arc<Conn>, cluster_id: &str, mode: ProtocolMode) -> Self {
        DynamoDbMembershipTable {
            conn,
            cluster_id: cluster_id.to_owned(),
            mode,
        }
    }

    fn table(&self) -> &str {
        &self.conn.config.table
    }

    /// The key of the item with sort key `sk` in `cluster`.
    fn key(cluster: &str, sk: &str) -> Item {
        Item::from([(CLUSTER_ID.into(), s(cluster)), (SILO_IDENTITY.into(), s(sk))])
    }

    /// How a stored item is named in corrupt-row reports and errors.
    fn item_name(&self, sk: &str) -> String {
        format!("{}/{}/{sk}", self.table(), self.cluster_id)
    }

    fn decode_version(&self, item: &Item) -> Result<TableVersion> {
        let a = Attrs(item);
        let decoded = a.n::<u64>(VERSION).and_then(|v| {
            let etag = a.s(ETAG)?;
            if etag.is_empty() {
                return Err("attribute ETag is empty".into());
            }
            Ok(TableVersion {
                version: v,
                etag: Etag::new(etag),
            })
        });
        decoded.map_err(|why| Error::corrupt(self.item_name(VERSION_ROW), why))
    }

    fn no_version() -> TableVersion {
        TableVersion {
            version: 0,
            etag: Etag::new(NO_VERSION_ITEM),
        }
    }

    /// Every item of the cluster's partition, strongly consistent, all pages;
    /// with `since`, only the version item and rows written after that version.
    async fn query(&self, since: Option<u64>) -> Result<Vec<Item>> {
        let mut q = self
            .conn
            .client
            .query()
            .consistent_read(true)
            .key_condition_expression("#c = :c AND #sk < :history")
            .expression_attribute_names("#c", CLUSTER_ID)
            .expression_attribute_names("#sk", SILO_IDENTITY)
            .expression_attribute_values(":c", s(&self.cluster_id))
            .expression_attribute_values(":history", s(HISTORY_ROWS));
        if let Some(v) = since {
            q = q
                .filter_expression("attribute_exists(#v) OR #tv > :since")
                .expression_attribute_names("#v", VERSION)
                .expression_attribute_names("#tv", TABLE_VERSION)
                .expression_attribute_values(":since", n(v));
        }
        self.conn.query_all(self.table(), q).await
    }

    fn decode_items(&self, items: &[Item]) -> Result<Read> {
        let mut read = Read {
            version: None,
            rows: MembershipRows::new(),
            corrupt: Vec::new(),
            newest_row: 0,
        };
        for item in items {
            let sk = match item.get(SILO_IDENTITY) {
                Some(AttributeValue::S(sk)) => sk.as_str(),
                _ => "?",
            };
            if sk == VERSION_ROW {
                read.version = Some(self.decode_version(item)?);
                continue;
            }
            match decode_row(item) {
                Ok((entry, etag, written_at)) => {
                    read.newest_row = read.newest_row.max(written_at);
                    read.rows
                        .insert(std::sync::Arc::new(MembershipRow::new(entry, etag)));
                }
                Err(reason) => read.corrupt.push(CorruptRow {
                    key: self.item_name(sk),
                    reason,
                }),
            }
        }
        read.corrupt.sort();
        Ok(read)
    }

    /// A read of the partition that holds no row written after the version item
    /// it read. A Query reads the version item first (its sort key sorts first),
    /// then the rows; a row written by a commit that landed meanwhile carries a
    /// higher table version than the one read, and the read is repeated (up to
    /// [`READ_ATTEMPTS`] times, then `Error::Backend`).
    async fn consistent_read(&self, since: Option<u64>) -> Result<Read> {
        let mut pause = Duration::from_millis(2);
        for attempt in 1..=READ_ATTEMPTS {
            let read = self.decode_items(&self.query(since).await?)?;
            let torn = self.mode == ProtocolMode::Extended
                && read.version.as_ref().is_some_and(|v| read.newest_row > v.version);
            if !torn {
                return Ok(read);
            }
            tracing::debug!(attempt, cluster = %self.cluster_id, "a row changed during the read: reading again");
            tokio::time::sleep(pause.mul_f64(0.5 + rand::random::<f64>())).await;
            pause = (pause * 2).min(Duration::from_millis(100));
        }
        Err(Error::backend(format!(
            "dynamodb read of cluster `{}` in table `{}`: rows kept changing while being read \
             ({READ_ATTEMPTS} attempts)",
            self.cluster_id,
            self.table()
        )))
    }

    fn snapshot(&self, read: Read) -> MembershipSnapshot {
        MembershipSnapshot {
            version: read.version.unwrap_or_else(Self::no_version),
            entries: read.rows,
            corrupt: read.corrupt,
        }
    }

    /// The write op on the version item for a write at `next`; `None` when no
    /// stored version item can satisfy it (the write answers `Ok(false)`).
    fn version_op(&self, next: &TableVersion) -> Option<TransactWriteItem> {
        let previous = next.version.checked_sub(1)?;
        let etag = new_etag();
        if next.etag.as_str() == NO_VERSION_ITEM {
            if previous != 0 {
                return None;
            }
            let mut item = Self::key(&self.cluster_id, VERSION_ROW);
            item.insert(VERSION.into(), n(next.version));
            item.insert(ETAG.into(), s(etag.as_str()));
            let put = Put::builder()
                .table_name(self.table())
                .set_item(Some(item))
                .condition_expression("attribute_not_exists(#sk)")
                .expression_attribute_names("#sk", SILO_IDENTITY)
                .build()
                .ok()?;
            return Some(TransactWriteItem::builder().put(put).build());
        }
        if next.etag.is_empty() {
            return None;
        }
        let update = Update::builder()
            .table_name(self.table())
            .set_key(Some(Self::key(&self.cluster_id, VERSION_ROW)))
            .update_expression("SET #v = :v, #e = :ne")
            .condition_expression("#e = :e AND #v = :pv")
            .expression_attribute_names("#v", VERSION)
            .expression_attribute_names("#e", ETAG)
            .expression_attribute_values(":v", n(next.version))
            .expression_attribute_values(":ne", s(etag.as_str()))
            .expression_attribute_values(":e", s(next.etag.as_str()))
            .expression_attribute_values(":pv", n(previous))
            .build()
            .ok()?;
        Some(TransactWriteItem::builder().update(update).build())
    }

    /// The history items of a write at `next`, for its transaction: the event, and
    /// the deletion of the one that falls out of the capacity (versions are gapless
    /// in extended mode, so one delete per write keeps the history at capacity).
    fn history_ops(
        &self,
        entry: &MembershipEntry,
        kind: WriteKind,
        next: &TableVersion,
        origin: &WriteOrigin,
    ) -> Result<Vec<TransactWriteItem>> {
        let capacity = self.conn.config.history_capacity;
        if capacity == 0 {
            return Ok(Vec::new());
        }
        let event = MembershipEvent::of(entry, kind, next, origin);
        let json = serde_json::to_string(&event).map_err(|e| Error::backend(format!("encode event: {e}")))?;
        let mut item = Self::key(&self.cluster_id, &history_sk(next.version));
        item.insert(EVENT_VERSION.into(), n(next.version));
        item.insert(EVENT.into(), s(json));
        let put = Put::builder()
            .table_name(self.table())
            .set_item(Some(item))
            .build()
            .map_err(|e| Error::backend(format!("dynamodb history event: {e}")))?;
        let mut ops = vec![TransactWriteItem::builder().put(put).build()];
        if let Some(old) = next.version.checked_sub(capacity).filter(|v| *v > 0) {
            let delete = Delete::builder()
                .table_name(self.table())
                .set_key(Some(Self::key(&self.cluster_id, &history_sk(old))))
                .build()
                .map_err(|e| Error::backend(format!("dynamodb history trim: {e}")))?;
            ops.push(TransactWriteItem::builder().delete(delete).build());
        }
        Ok(ops)
    }

    /// After a failed precondition: `Err(Corrupt)` when the row or the version item
    /// it was checked against does not decode (nothing was written), else `Ok(())`.
    async fn explain_conflict(&self, silo: &SiloAddress) -> Result<()> {
        let id = silo.to_string();
        let items = self.transact_get(&[VERSION_ROW, &id]).await?;
        for item in items.iter().flatten() {
            match item.get(SILO_IDENTITY) {
                Some(AttributeValue::S(sk)) if sk == VERSION_ROW => {
                    if self.mode == ProtocolMode::Extended {
                        self.decode_version(item)?;
                    }
                }
                _ => {
                    decode_row(item).map_err(|why| Error::corrupt(self.item_name(&id), why))?;
                }
            }
        }
        Ok(())
    }

    /// The items with sort keys `sks`, read in one serializable TransactGetItems.
    async fn transact_get(&self, sks: &[&str]) -> Result<Vec<Option<Item>>> {
        let gets = sks
            .iter()
            .map(|sk| {
                Get::builder()
                    .table_name(self.table())
                    .set_key(Some(Self::key(&self.cluster_id, sk)))
                    .build()
                    .map(|g| TransactGetItem::builder().get(g).build())
                    .map_err(|e| Error::backend(format!("dynamodb TransactGetItems: {e}")))
            })
            .collect::<Result<Vec<_>>>()?;
        let out = self
            .conn
            .client
            .transact_get_items()
            .set_transact_items(Some(gets))
            .send()
            .await
            .map_err(|e| self.conn.error("TransactGetItems", self.table(), e))?;
        Ok(out
            .responses
            .unwrap_or_default()
            .into_iter()
            .map(|r| r.item.filter(|i| !i.is_empty()))
            .collect())
    }

    /// Runs one TransactWriteItems; `Ok(false)` when a condition failed (nothing
    /// written).
    async fn transact(&self, what: &str, ops: Vec<TransactWriteItem>) -> Result<bool> {
        self.conn.transact(what, self.table(), ops).await
    }

    fn delete_op(&self, cluster: &str, sk: &str, etag: Option<&str>) -> Result<TransactWriteItem> {
        let mut d = Delete::builder()
            .table_name(self.table())
            .set_key(Some(Self::key(cluster, sk)))
            .expression_attribute_names("#e", ETAG);
        d = match etag {
            Some(e) => d
                .condition_expression("#e = :e")
                .expression_attribute_values(":e", s(e)),
            None => d.condition_expression("attribute_not_exists(#e)"),
        };
        let d = d
            .build()
            .map_err(|e| Error::backend(format!("dynamodb delete: {e}")))?;
        Ok(TransactWriteItem::builder().delete(d).build())
    }

    /// Keys and etags of every item of `cluster`.
    async fn list(&self, cluster: &str) -> Result<Vec<(String, Option<String>)>> {
        let q = self
            .conn
            .client
            .query()
            .consistent_read(true)
            // Rows, the version item and the history; not the metrics rows after them.
            .key_condition_expression("#c = :c AND #sk < :metrics")
            .projection_expression("#sk, #e")
            .expression_attribute_names("#c", CLUSTER_ID)
            .expression_attribute_names("#sk", SILO_IDENTITY)
            .expression_attribute_names("#e", ETAG)
            .expression_attribute_values(":c", s(cluster))
            .expression_attribute_values(":metrics", s(METRICS_ROWS));
        let items = self.conn.query_all(self.table(), q).await?;
        Ok(items
            .iter()
            .filter_map(|item| {
                let a = Attrs(item);
                let sk = a.s(SILO_IDENTITY).ok()?;
                Some((sk.to_owned(), a.s(ETAG).ok().map(str::to_owned)))
            })
            .collect())
    }
}

/// Whether a TransactWriteItems failed on a condition or on a concurrent
/// transaction over one of its items: a conflict, with nothing written.
#[async_trait]
impl MembershipTable for DynamoDbMembershipTable {
    fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    async fn init(&self, try_create: bool) -> Result<()> {
        schema::ensure_table(
            &self.conn,
            self.table(),
            schema::Kind::Membership,
            try_create && self.conn.config.create_if_missing,
        )
        .await?;
        let mut item = Self::key(&self.cluster_id, VERSION_ROW);
        item.insert(VERSION.into(), n(0));
        item.insert(ETAG.into(), s(new_etag().as_str()));
        match self
            .conn
            .client
            .put_item()
            .table_name(self.table())
            .set_item(Some(item))
            .condition_expression("attribute_not_exists(#sk)")
            .expression_attribute_names("#sk", SILO_IDENTITY)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(e) if is_condition_failed(&e) => Ok(()),
            Err(e) => Err(self.conn.error("init", self.table(), e)),
        }
    }

    async fn read_row(&self, silo: &SiloAddress) -> Result<MembershipSnapshot> {
        let id = silo.to_string();
        let items: Vec<Item> = self
            .transact_get(&[VERSION_ROW, &id])
            .await?
            .into_iter()
            .flatten()
            .collect();
        Ok(self.snapshot(self.decode_items(&items)?))
    }

    async fn read_all(&self) -> Result<MembershipSnapshot> {
        Ok(self.snapshot(self.consistent_read(None).await?))
    }

    async fn read_delta(&self, since: &TableVersion) -> Result<MembershipDelta> {
        if self.mode == ProtocolMode::Basic {
            return Ok(MembershipDelta::full(self.read_all().await?));
        }
        let read = self.consistent_read(Some(since.version)).await?;
        let version = read.version.clone().unwrap_or_else(Self::no_version);
        if version.version < since.version || read.version.is_none() {
            // The table lost data (or never had a version item): only a full read
            // shows what went away.
            return Ok(MembershipDelta::full(self.read_all().await?));
        }
        Ok(MembershipDelta {
            version,
            changed: read.rows,
            corrupt: read.corrupt,
            complete: false,
        })
    }

    async fn write_row(
        &self,
        entry: &MembershipEntry,
        mode: WriteMode<'_>,
        next: &TableVersion,
        origin: &WriteOrigin,
    ) -> Result<bool> {
        entry.validate()?;
        let (what, kind, expected) = (mode.method(), mode.kind(), mode.expected_etag());
        if expected.is_some_and(|e| e.is_empty()) {
            return Ok(false);
        }
        let item = row_item(&self.cluster_id, entry, next.version, &new_etag());
        let mut put = Put::builder()
            .table_name(self.table())
            .set_item(Some(item))
            .expression_attribute_names("#sk", SILO_IDENTITY);
        put = match expected {
            None => put.condition_expression("attribute_not_exists(#sk)"),
            Some(etag) => put
                .condition_expression("attribute_exists(#sk) AND #e = :re")
                .expression_attribute_names("#e", ETAG)
                .expression_attribute_values(":re", s(etag.as_str())),
        };
        let put = put
            .build()
            .map_err(|e| Error::backend(format!("dynamodb {what}: {e}")))?;
        let committed = if self.mode == ProtocolMode::Basic {
            let mut req = self
                .conn
                .client
                .put_item()
                .table_name(self.table())
                .set_item(Some(put.item))
                .set_condition_expression(put.condition_expression)
                .set_expression_attribute_names(put.expression_attribute_names);
            if let Some(values) = put.expression_attribute_values {
                req = req.set_expression_attribute_values(Some(values));
            }
            match req.send().await {
                Ok(_) => true,
                Err(e) if is_condition_failed(&e) => false,
                Err(e) => return Err(self.conn.error(what, self.table(), e)),
            }
        } else {
            let Some(version_op) = self.version_op(next) else {
                return Ok(false);
            };
            let mut ops = vec![TransactWriteItem::builder().put(put).build(), version_op];
            ops.extend(self.history_ops(entry, kind, next, origin)?);
            self.transact(what, ops).await?
        };
        if !committed {
            self.explain_conflict(&entry.silo).await?;
        }
        Ok(committed)
    }

    async fn read_history(&self, query: &HistoryQuery) -> Result<Vec<MembershipEvent>> {
        require_history(self.mode)?;
        let mut q = self
            .conn
            .client
            .query()
            .consistent_read(true)
            .key_condition_expression("#c = :c AND #sk BETWEEN :from AND :to")
            .expression_attribute_names("#c", CLUSTER_ID)
            .expression_attribute_names("#sk", SILO_IDENTITY)
            .expression_attribute_values(":c", s(&self.cluster_id))
            .expression_attribute_values(":from", s(history_sk(query.from_version)))
            .expression_attribute_values(":to", s(history_sk(u64::MAX)));
        // Without a silo filter the limit applies in DynamoDB; with one, every
        // event from `from_version` on is read and filtered here.
        let items = if query.silo.is_none() && query.limit < usize::MAX {
            q = q.limit(i32::try_from(query.limit).unwrap_or(i32::MAX).max(1));
            self.conn.query_pages(self.table(), q, query.limit).await?
        } else {
            self.conn.query_all(self.table(), q).await?
        };
        let mut events = Vec::with_capacity(items.len());
        for item in &items {
            let attrs = Attrs(item);
            let sk = attrs.s(SILO_IDENTITY).unwrap_or("?").to_owned();
            let json = attrs
                .s(EVENT)
                .map_err(|e| Error::corrupt(self.item_name(&sk), e))?;
            let event: MembershipEvent =
                serde_json::from_str(json).map_err(|e| Error::corrupt(self.item_name(&sk), e))?;
            events.push(event);
        }
        Ok(query.select(events))
    }

    async fn update_i_am_alive(&self, silo: &SiloAddress, time: Timestamp) -> Result<()> {
        let sent = self
            .conn
            .client
            .update_item()
            .table_name(self.table())
            .set_key(Some(Self::key(&self.cluster_id, &silo.to_string())))
            .update_expression("SET #t = :t")
            .condition_expression("attribute_exists(#sk)")
            .expression_attribute_names("#t", I_AM_ALIVE_TIME)
            .expression_attribute_names("#sk", SILO_IDENTITY)
            .expression_attribute_values(":t", s(time.to_string()))
            .send()
            .await;
        // A row that is gone (cleaned up) is not written again.
        self.conn
            .conditional("update_i_am_alive", self.table(), sent)
            .map(drop)
    }

    async fn cleanup_defunct(&self, before: Timestamp) -> Result<usize> {
        let snap = self.read_all().await?;
        let defunct: Vec<(String, Etag)> = snap
            .entries
            .iter()
            .filter(|row| row.entry.is_defunct(before))
            .map(|row| (row.entry.silo.to_string(), row.etag.clone()))
            .collect();
        let mut deleted = 0;
        for batch in defunct.chunks(TRANSACT_ITEMS) {
            // Each row only as it was read: a row written since stays.
            let ops = batch
                .iter()
                .map(|(id, etag)| self.delete_op(&self.cluster_id, id, Some(etag.as_str())))
                .collect::<Result<Vec<_>>>()?;
            if self.transact("cleanup_defunct", ops).await? {
                deleted += batch.len();
                continue;
            }
            for (id, etag) in batch {
                let op = self.delete_op(&self.cluster_id, id, Some(etag.as_str()))?;
                if self.transact("cleanup_defunct", vec![op]).await? {
                    deleted += 1;
                }
            }
        }
        Ok(deleted)
    }

    async fn delete_all(&self) -> Result<()> {
        let cluster_id = self.cluster_id.as_str();
        // Rows go first (the version item stays, so every read stays ordered: a
        // row deleted under a live version item is what cleanup does too), then,
        // once few remain, the last rows and the version item in one
        // transaction conditioned on the etags just listed. A writer that commits
        // in between fails that transaction and the loop lists again.
        let deadline = tokio::time::Instant::now() + self.conn.config.timeout * 4;
        loop {
            if tokio::time::Instant::now() >= deadline {
                return Err(Error::backend(format!(
                    "dynamodb delete_cluster `{cluster_id}` in table `{}`: writers kept changing the \
                     cluster for {:?}",
                    self.table(),
                    self.conn.config.timeout * 4
                )));
            }
            let items = self.list(cluster_id).await?;
            if items.is_empty() {
                return Ok(());
            }
            let rows: Vec<String> = items
                .iter()
                .filter(|(sk, _)| sk != VERSION_ROW)
                .map(|(sk, _)| sk.clone())
                .collect();
            if items.len() > TRANSACT_ITEMS {
                // Every history item listed goes, and the rows but a few: every
                // write adds a history item, so the final transaction keeps room
                // for those written meanwhile. All listed items belong to the
                // cluster's current life (its version item still exists).
                let (history, rows): (Vec<&String>, Vec<&String>) =
                    rows.iter().partition(|sk| sk.starts_with(HISTORY_ROWS));
                let keep = (TRANSACT_ITEMS / 2).min(rows.len());
                let keys = history
                    .into_iter()
                    .chain(rows[..rows.len() - keep].iter().copied())
                    .map(|sk| Self::key(cluster_id, sk))
                    .collect();
                self.conn.batch_delete(self.table(), keys).await?;
                continue;
            }
            let ops = items
                .iter()
                .map(|(sk, etag)| self.delete_op(cluster_id, sk, etag.as_deref()))
                .collect::<Result<Vec<_>>>()?;
            if self.transact("delete_cluster", ops).await? {
                return Ok(());
            }
            tokio::time::sleep(Duration::from_millis(1 + rand::random::<u64>() % 5)).await;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn entry() -> MembershipEntry {
        let silo: SiloAddress = "10.0.0.1:11111@1795000000000".parse().unwrap();
        MembershipEntry {
            suspect_votes: vec![SuspectVote {
                silo: "10.0.0.2:11111@7".parse().unwrap(),
                time: Timestamp::from_millis(1_795_000_000_123),
            }],
            host_name: "h".into(),
            ..MembershipEntry::new(
                silo,
                SiloStatus::Active,
                Timestamp::from_millis(1_795_000_000_000),
            )
        }
    }

    #[test]
    fn rows_round_trip() {
        let e = entry();
        let item = row_item("c", &e, 7, &Etag::new("00ff"));
        assert_eq!(decode_row(&item).unwrap(), (e, Etag::new("00ff"), 7));
    }

    #[test]
    fn missing_or_mistyped_attributes_are_named() {
        let good = row_item("c", &entry(), 7, &Etag::new("00ff"));
        for (name, value, says) in [
            (STATUS, None, "attribute Status is missing"),
            (PORT, Some(s("11111")), "attribute Port is not a number"),
            (GENERATION, Some(n(8)), "disagree with SiloIdentity"),
            (
                SUSPECTING_TIMES,
                Some(AttributeValue::L(vec![])),
                "1 SuspectingSilos but 0",
            ),
            (STATUS, Some(s("Sleepy")), "attribute Status"),
            (ETAG, Some(s("")), "ETag is empty"),
            (TABLE_VERSION, Some(n(-1)), "TableVersion = -1 is out of range"),
        ] {
            let mut item = good.clone();
            match value {
                Some(v) => item.insert(name.into(), v),
                None => item.remove(name),
            };
            let err = decode_row(&item).unwrap_err();
            assert!(err.contains(says), "{name}: {err}");
        }
    }

    #[test]
    fn version_row_sorts_before_every_silo() {
        for silo in [
            "0.0.0.0:1@0",
            "[::1]:1@0",
            "255.255.255.255:65535@18446744073709551615",
        ] {
            assert!(VERSION_ROW < silo, "{silo}");
        }
    }
}
