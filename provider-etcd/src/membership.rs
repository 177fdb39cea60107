//! The membership table on etcd.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use etcd_client::{
    Compare, CompareOp, DeleteOptions, GetOptions, KeyValue, Txn, TxnOp, TxnOpResponse, TxnResponse,
};
use rollcall_core::{
    history::{history_floor, require_history},
    CorruptRow, Error, Etag, HistoryQuery, MembershipDelta, MembershipEntry, MembershipEvent, MembershipRow,
    MembershipRows, MembershipSnapshot, MembershipTable, ProtocolMode, Result, SiloAddress, TableVersion,
    Timestamp, WriteMode, WriteOrigin,
};
use serde::{Deserialize, Serialize};

use crate::conn::{revision, Conn};
use crate::keys::{unescape, MembershipKeys};

/// The stored version row. Its exact bytes are compared in write transactions,
/// so it is always written by [`encode_version`].
#[derive(Serialize, Deserialize)]
struct StoredVersion {
    version: u64,
}

/// A stored row: the entry's columns plus the table version it was written at.
#[derive(Serialize, Deserialize)]
struct StoredRow {
    #[serde(flatten)]
    entry: MembershipEntry,
    written_at: u64,
}

/// Defunct rows deleted per transaction: one compare and two deletes each, under
/// etcd's default `--max-txn-ops` of 128.
const CLEANUP_BATCH: usize = 60;

/// Older revisions of a row read while settling the outcome of a failed write.
const HISTORY_STEPS: usize = 8;

fn encode_version(version: u64) -> String {
    format!("{{\"version\":{version}}}")
}

fn etag_of(kv: &KeyValue) -> Etag {
    Etag::new(kv.mod_revision().to_string())
}

fn key_text(kv: &KeyValue) -> String {
    String::from_utf8_lossy(kv.key()).into_owned()
}

fn decode_version(kv: Option<&KeyValue>, key: &str) -> Result<TableVersion> {
    let Some(kv) = kv else {
        // A cluster whose version key does not exist yet: version 0, and etag "0"
        // (the `mod_revision` etcd compares a missing key as).
        return Ok(TableVersion {
            version: 0,
            etag: Etag::new("0"),
        });
    };
    let v: StoredVersion = serde_json::from_slice(kv.value()).map_err(|e| Error::corrupt(key, e))?;
    Ok(TableVersion {
        version: v.version,
        etag: etag_of(kv),
    })
}

/// The kvs of the `i`-th range response of a transaction.
fn range(resp: &[TxnOpResponse], i: usize) -> &[KeyValue] {
    match resp.get(i) {
        Some(TxnOpResponse::Get(g)) => g.kvs(),
        _ => &[],
    }
}

/// The membership table of one cluster on etcd.
#[derive(Debug, Clone)]
pub struct EtcdMembershipTable {
    conn: Arc<Conn>,
    keys: MembershipKeys,
    cluster_id: String,
    mode: ProtocolMode,
    history_capacity: u64,
}

impl EtcdMembershipTable {
    pub(crate) fn new(
        conn: Arc<Conn>,
        prefix: &str,
        cluster_id: &str,
        mode: ProtocolMode,
        history_capacity: u64,
    ) -> Self {
        EtcdMembershipTable {
            conn,
            keys: MembershipKeys::new(prefix, cluster_id),
            cluster_id: cluster_id.to_owned(),
            mode,
            history_capacity,
        }
    }

    /// The silo of a row (or alive) key under `prefix`.
    fn silo_of(key: &str, prefix: &str) -> std::result::Result<SiloAddress, String> {
        let raw = key.strip_prefix(prefix).ok_or("key outside the table")?;
        let id = unescape(raw).ok_or("malformed escape in the key")?;
        id.parse().map_err(|e| format!("not a silo address: {e}"))
    }

    /// Decodes row kvs and alive kvs into entries, listing what does not decode.
    /// Alive kvs of silos without a row in `rows` are ignored.
    fn decode_rows(
        &self,
        rows: &[KeyValue],
        alive: &[KeyValue],
        corrupt: &mut Vec<CorruptRow>,
    ) -> MembershipRows {
        let (silo_prefix, alive_prefix) = (self.keys.silo_prefix(), self.keys.alive_prefix());
        let mut alive_times: HashMap<SiloAddress, Timestamp> = HashMap::new();
        for kv in alive {
            let key = key_text(kv);
            let Ok(silo) = Self::silo_of(&key, &alive_prefix) else {
                corrupt.push(CorruptRow {
                    key,
                    reason: "not an IAmAlive key of a silo".into(),
                });
                continue;
            };
            match std::str::from_utf8(kv.value()).ok().and_then(|s| s.parse().ok()) {
                Some(t) => {
                    alive_times.insert(silo, t);
                }
                None => corrupt.push(CorruptRow {
                    key,
                    reason: "IAmAlive value is not an RFC 3339 time".into(),
                }),
            }
        }
        let mut entries = MembershipRows::new();
        for kv in rows {
            let key = key_text(kv);
            let silo = match Self::silo_of(&key, &silo_prefix) {
                Ok(s) => s,
                Err(reason) => {
                    corrupt.push(CorruptRow { key, reason });
                    continue;
                }
            };
            match serde_json::from_slice::<StoredRow>(kv.value()) {
                Ok(row) if row.entry.silo != silo => corrupt.push(CorruptRow {
                    key,
                    reason: format!("row holds silo {} under the key of {silo}", row.entry.silo),
                }),
                Ok(mut row) => {
                    if let Some(t) = alive_times.get(&silo) {
                        row.entry.i_am_alive_time = *t;
                    }
                    entries.insert(std::sync::Arc::new(MembershipRow::new(row.entry, etag_of(kv))));
                }
                Err(e) => corrupt.push(CorruptRow {
                    key,
                    reason: e.to_string(),
                }),
            }
        }
        entries
    }

    /// The transaction ops of a full read: version, every row, every IAmAlive key.
    fn full_read_ops(&self) -> Vec<TxnOp> {
        vec![
            TxnOp::get(self.keys.version(), None),
            TxnOp::get(self.keys.silo_prefix(), Some(GetOptions::new().with_prefix())),
            TxnOp::get(self.keys.alive_prefix(), Some(GetOptions::new().with_prefix())),
        ]
    }

    /// Decodes the responses of [`full_read_ops`](Self::full_read_ops) (or of a
    /// delta's ops, which have the same shape).
    fn snapshot_of(&self, resp: &[TxnOpResponse]) -> Result<MembershipSnapshot> {
        let version_key = self.keys.version();
        let version = decode_version(range(resp, 0).first(), &version_key)?;
        let mut corrupt = Vec::new();
        let entries = self.decode_rows(range(resp, 1), range(resp, 2), &mut corrupt);
        corrupt.sort();
        Ok(MembershipSnapshot {
            version,
            entries,
            corrupt,
        })
    }

    async fn read_full(&self, what: &str) -> Result<MembershipSnapshot> {
        let resp = self
            .conn
            .txn(what, Txn::new().and_then(self.full_read_ops()))
            .await?;
        self.snapshot_of(&resp.op_responses())
    }

    /// The version compares of a write at `next` (none in basic mode); `None` when
    /// no stored version row can satisfy them (the write answers `Ok(false)`).
    fn version_compares(&self, next: &TableVersion) -> Option<Vec<Compare>> {
        if self.mode == ProtocolMode::Basic {
            return Some(Vec::new());
        }
        let key = self.keys.version();
        let previous = next.version.checked_sub(1)?;
        match revision(&next.etag)? {
            // No version key yet (a cluster nobody initialised): only version 1.
            0 if previous == 0 => Some(vec![Compare::mod_revision(key, CompareOp::Equal, 0)]),
            0 => None,
            etag => Some(vec![
                Compare::mod_revision(key.clone(), CompareOp::Equal, etag),
                Compare::value(key, CompareOp::Equal, encode_version(previous)),
            ]),
        }
    }

    /// A failed compare: `Err(Corrupt)` if the row or version it needed does not
    /// decode (nothing was written), else `Ok(false)`.
    fn explain_conflict(&self, resp: &TxnResponse, row_key: &str, version_key: &str) -> Result<bool> {
        let ops = resp.op_responses();
        if let Some(kv) = range(&ops, 0).first() {
            serde_json::from_slice::<StoredRow>(kv.value()).map_err(|e| Error::corrupt(row_key, e))?;
        }
        if self.mode == ProtocolMode::Extended {
            decode_version(range(&ops, 1).first(), version_key)?;
        }
        Ok(false)
    }

    /// Settles the outcome of a write whose request failed in transport: walks the
    /// row's revisions back from the newest (a linearizable read, so a new leader
    /// has committed whatever of the old leader's log survives) until it finds the
    /// value this write put (`Ok(true)`), or the revision the write was conditioned
    /// on, or the row's absence for an insert (not committed: the original error).
    /// Reads are retried for up to one timeout (a leader election); if the history
    /// cannot be read, the original error, whose outcome stays unknown.
    async fn settle(
        &self,
        error: Error,
        row_key: &str,
        row_json: &str,
        precondition: Option<i64>,
    ) -> Result<bool> {
        let deadline = tokio::time::Instant::now() + self.conn.timeout();
        let mut pause = Duration::from_millis(25);
        loop {
            match self.walk_history(row_key, row_json, precondition).await {
                Ok(Some(true)) => {
                    tracing::info!(key = row_key, "a write whose request failed had committed");
                    return Ok(true);
                }
                Ok(_) => return Err(error),
                Err(_) if tokio::time::Instant::now() + pause < deadline => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(400));
                }
                Err(_) => return Err(error),
            }
        }
    }

    /// `Some(true)`: the row holds (or held, after `precondition`) `row_json`;
    /// `Some(false)`: it did not; `None`: history too long or compacted to tell.
    async fn walk_history(
        &self,
        row_key: &str,
        row_json: &str,
        precondition: Option<i64>,
    ) -> Result<Option<bool>> {
        let mut at: Option<i64> = None;
        for _ in 0..HISTORY_STEPS {
            let options = at.map(|rev| GetOptions::new().with_revision(rev));
            let resp = match self
                .conn
                .get("read to settle a failed write", row_key, options)
                .await
            {
                Ok(r) => r,
                // An older revision may be compacted away: that is an answer too.
                Err(_) if at.is_some() => return Ok(None),
                Err(e) => return Err(e),
            };
            let Some(kv) = resp.kvs().first() else {
                return Ok(Some(false));
            };
            if kv.value() == row_json.as_bytes() {
                return Ok(Some(true));
            }
            if precondition.is_some_and(|r| kv.mod_revision() <= r) || kv.mod_revision() <= 1 {
                return Ok(Some(false));
            }
            at = Some(kv.mod_revision() - 1);
        }
        Ok(None)
    }
}

#[async_trait]
impl MembershipTable for EtcdMembershipTable {
    fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    async fn init(&self, _try_create: bool) -> Result<()> {
        let key = self.keys.version();
        let txn = Txn::new()
            .when(vec![Compare::create_revision(key.clone(), CompareOp::Equal, 0)])
            .and_then(vec![TxnOp::put(key, encode_version(0), None)]);
        self.conn.txn("init", txn).await.map(|_| ())
    }

    async fn read_row(&self, silo: &SiloAddress) -> Result<MembershipSnapshot> {
        let id = silo.to_string();
        let txn = Txn::new().and_then(vec![
            TxnOp::get(self.keys.version(), None),
            TxnOp::get(self.keys.silo(&id), None),
            TxnOp::get(self.keys.alive(&id), None),
        ]);
        let resp = self.conn.txn("read_row", txn).await?;
        self.snapshot_of(&resp.op_responses())
    }

    async fn read_all(&self) -> Result<MembershipSnapshot> {
        self.read_full("read_all").await
    }

    async fn read_delta(&self, since: &TableVersion) -> Result<MembershipDelta> {
        let Some(since_rev) = revision(&since.etag).filter(|_| self.mode == ProtocolMode::Extended) else {
            return Ok(MembershipDelta::full(self.read_all().await?));
        };
        let version_key = self.keys.version();
        let after = GetOptions::new()
            .with_prefix()
            .with_min_mod_revision(since_rev + 1);
        // Every row written after `since` has a higher mod_revision, and so has
        // its IAmAlive key (written in the same transaction). A version key older
        // than `since` means an etag from elsewhere: read everything.
        let txn = Txn::new()
            .when(vec![Compare::mod_revision(
                version_key.clone(),
                CompareOp::Less,
                since_rev,
            )])
            .and_then(self.full_read_ops())
            .or_else(vec![
                TxnOp::get(version_key, None),
                TxnOp::get(self.keys.silo_prefix(), Some(after.clone())),
                TxnOp::get(self.keys.alive_prefix(), Some(after)),
            ]);
        let resp = self.conn.txn("read_delta", txn).await?;
        let snap = self.snapshot_of(&resp.op_responses())?;
        if resp.succeeded() {
            return Ok(MembershipDelta::full(snap));
        }
        if snap.version.version < since.version {
            // The table lost data: a delta cannot show the rows that went away.
            return Ok(MembershipDelta::full(self.read_all().await?));
        }
        Ok(MembershipDelta {
            version: snap.version,
            changed: snap.entries,
            corrupt: snap.corrupt,
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
        let id = entry.silo.to_string();
        let (row_key, version_key) = (self.keys.silo(&id), self.keys.version());
        let precondition = match expected {
            None => None,
            Some(etag) => match revision(etag).filter(|r| *r > 0) {
                Some(r) => Some(r),
                None => return Ok(false),
            },
        };
        let Some(mut compares) = self.version_compares(next) else {
            return Ok(false);
        };
        compares.push(match precondition {
            None => Compare::create_revision(row_key.clone(), CompareOp::Equal, 0),
            Some(r) => Compare::mod_revision(row_key.clone(), CompareOp::Equal, r),
        });
        let row_json = serde_json::to_string(&StoredRow {
            entry: entry.clone(),
            written_at: next.version,
        })
        .map_err(|e| Error::backend(format!("encode row: {e}")))?;
        let mut puts = vec![
            TxnOp::put(row_key.clone(), row_json.clone(), None),
            TxnOp::put(self.keys.alive(&id), entry.i_am_alive_time.to_string(), None),
        ];
        if self.mode == ProtocolMode::Extended {
            puts.push(TxnOp::put(
                version_key.clone(),
                encode_version(next.version),
                None,
            ));
            // The history event and the trim to the capacity, in the same Txn. The
            // trimmed range ends below the event's key (floor <= version when the
            // capacity is >= 1): etcd rejects a Txn whose put and delete overlap.
            if self.history_capacity > 0 {
                let event = MembershipEvent::of(entry, kind, next, origin);
                let json = serde_json::to_string(&event)
                    .map_err(|e| Error::backend(format!("encode event: {e}")))?;
                puts.push(TxnOp::put(self.keys.history(next.version), json, None));
            }
            let floor = history_floor(next.version, self.history_capacity);
            puts.push(TxnOp::delete(
                self.keys.history_prefix(),
                Some(DeleteOptions::new().with_range(self.keys.history(floor))),
            ));
        }
        let txn = Txn::new().when(compares).and_then(puts).or_else(vec![
            TxnOp::get(row_key.clone(), None),
            TxnOp::get(version_key.clone(), None),
        ]);
        let resp = match self.conn.txn(what, txn).await {
            Ok(r) => r,
            Err(e) => return self.settle(e, &row_key, &row_json, precondition).await,
        };
        if resp.succeeded() {
            return Ok(true);
        }
        self.explain_conflict(&resp, &row_key, &version_key)
    }

    async fn read_history(&self, query: &HistoryQuery) -> Result<Vec<MembershipEvent>> {
        require_history(self.mode)?;
        let end = crate::keys::prefix_end(&self.keys.history_prefix());
        let mut options = GetOptions::new().with_range(end);
        if query.silo.is_none() && query.limit < usize::MAX {
            options = options.with_limit(i64::try_from(query.limit).unwrap_or(i64::MAX));
        }
        let from = self.keys.history(query.from_version);
        let resp = self.conn.get("read_history", from, Some(options)).await?;
        let mut events = Vec::with_capacity(resp.kvs().len());
        for kv in resp.kvs() {
            let event: MembershipEvent =
                serde_json::from_slice(kv.value()).map_err(|e| Error::corrupt(key_text(kv), e))?;
            events.push(event);
        }
        Ok(query.select(events))
    }

    async fn update_i_am_alive(&self, silo: &SiloAddress, time: Timestamp) -> Result<()> {
        let id = silo.to_string();
        let txn = Txn::new()
            .when(vec![Compare::create_revision(
                self.keys.silo(&id),
                CompareOp::Greater,
                0,
            )])
            .and_then(vec![TxnOp::put(self.keys.alive(&id), time.to_string(), None)]);
        self.conn.txn("update_i_am_alive", txn).await.map(|_| ())
    }

    async fn cleanup_defunct(&self, before: Timestamp) -> Result<usize> {
        let snap = self.read_full("cleanup_defunct read").await?;
        let defunct: Vec<(String, i64)> = snap
            .entries
            .iter()
            .filter(|row| row.entry.is_defunct(before))
            .filter_map(|row| Some((row.entry.silo.to_string(), revision(&row.etag)?)))
            .collect();
        let delete = |id: &str| {
            [
                TxnOp::delete(self.keys.silo(id), None),
                TxnOp::delete(self.keys.alive(id), None),
            ]
        };
        let unchanged = |id: &str, rev: i64| Compare::mod_revision(self.keys.silo(id), CompareOp::Equal, rev);
        let mut deleted = 0;
        for batch in defunct.chunks(CLEANUP_BATCH) {
            // Each row goes with its IAmAlive key, and only as it was read.
            let txn = Txn::new()
                .when(
                    batch
                        .iter()
                        .map(|(id, rev)| unchanged(id, *rev))
                        .collect::<Vec<_>>(),
                )
                .and_then(batch.iter().flat_map(|(id, _)| delete(id)).collect::<Vec<_>>());
            if self.conn.txn("cleanup_defunct", txn).await?.succeeded() {
                deleted += batch.len();
                continue;
            }
            // A row of the batch changed since the read: row by row.
            for (id, rev) in batch {
                let txn = Txn::new()
                    .when(vec![unchanged(id, *rev)])
                    .and_then(delete(id).to_vec());
                if self.conn.txn("cleanup_defunct", txn).await?.succeeded() {
                    deleted += 1;
                }
            }
        }
        Ok(deleted)
    }

    async fn delete_all(&self) -> Result<()> {
        let keys = &self.keys;
        let prefix = || Some(etcd_client::DeleteOptions::new().with_prefix());
        // One transaction: a racing write commits wholly before (and is deleted) or
        // wholly after (and is complete) the delete. Reminders of a service with
        // the same id live under `.../reminder/` and are not touched.
        let txn = Txn::new().and_then(vec![
            TxnOp::delete(keys.version(), None),
            TxnOp::delete(keys.silo_prefix(), prefix()),
            TxnOp::delete(keys.alive_prefix(), prefix()),
            TxnOp::delete(keys.history_prefix(), prefix()),
        ]);
        self.conn.txn("delete_cluster", txn).await.map(|_| ())
    }
}
