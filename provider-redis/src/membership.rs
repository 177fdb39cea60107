//! The membership table on Redis.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use redis::Value;
use rollcall_core::{
    history::{history_floor, require_history},
    CorruptRow, Error, Etag, HistoryQuery, MembershipDelta, MembershipEntry, MembershipEvent, MembershipRow,
    MembershipSnapshot, MembershipTable, ProtocolMode, Result, SiloAddress, SiloStatus, SuspectVote,
    TableVersion, Timestamp, WriteMode, WriteOrigin,
};
use serde::{Deserialize, Serialize};

use crate::conn::{backend, Dedicated, Node, Router};
use crate::keys::MembershipKeys;
use crate::new_etag;

/// The stored version row.
#[derive(Serialize, Deserialize)]
struct StoredVersion {
    version: u64,
    etag: String,
}

/// A stored row as written: the entry's columns plus its etag, in one JSON object.
#[derive(Serialize)]
struct StoredRowRef<'a> {
    #[serde(flatten)]
    entry: &'a MembershipEntry,
    etag: &'a str,
}

/// A stored row as read, every column listed. `#[serde(flatten)]` on the read
/// side would first buffer the whole object into serde's generic `Content` (an
/// allocation per key and value): perf put that at a third of the client's work in
/// a 1,000-row `read_all`. [`StoredRow::into_parts`] builds the entry with a struct
/// literal, so a column added to `MembershipEntry` fails to compile here until it
/// is listed. Unknown keys are ignored, as before.
#[derive(Deserialize)]
struct StoredRow<'a> {
    /// Borrowed: compared with the key's id as text, parsed once.
    #[serde(borrow)]
    silo: std::borrow::Cow<'a, str>,
    status: SiloStatus,
    #[serde(default)]
    suspect_votes: Vec<SuspectVote>,
    #[serde(default)]
    proxy_port: u16,
    #[serde(default)]
    host_name: String,
    #[serde(default)]
    silo_name: String,
    #[serde(default)]
    role_name: String,
    #[serde(default)]
    update_zone: u32,
    #[serde(default)]
    fault_zone: u32,
    start_time: Timestamp,
    i_am_alive_time: Timestamp,
    #[serde(default)]
    clock_beyond_bound: bool,
    etag: String,
}

impl StoredRow<'_> {
    fn into_parts(self, silo: SiloAddress) -> (MembershipEntry, String) {
        let entry = MembershipEntry {
            silo,
            status: self.status,
            suspect_votes: self.suspect_votes,
            proxy_port: self.proxy_port,
            host_name: self.host_name,
            silo_name: self.silo_name,
            role_name: self.role_name,
            update_zone: self.update_zone,
            fault_zone: self.fault_zone,
            start_time: self.start_time,
            i_am_alive_time: self.i_am_alive_time,
            clock_beyond_bound: self.clock_beyond_bound,
        };
        (entry, self.etag)
    }
}

/// The version of a cluster whose version key does not exist yet.
fn initial_version() -> TableVersion {
    TableVersion {
        version: 0,
        etag: Etag::new("0"),
    }
}

/// Atomic snapshot: version, index, every row and the IAmAlive hash in one script.
static READ_ALL: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
local version = redis.call('GET', KEYS[1])
local ids = redis.call('SMEMBERS', KEYS[2])
local rows = {}
for i, id in ipairs(ids) do rows[i] = redis.call('GET', ARGV[1] .. id) end
local alive = redis.call('HGETALL', KEYS[3])
return {version, ids, rows, alive}
",
    )
});

/// Version and the rows written after version ARGV[2], atomically, in the reply
/// shape of [`READ_ALL`] plus a fifth element: 1 for a full read. KEYS = version,
/// index, alive, changes; ARGV[1] = row key prefix. A full read is answered when
/// the table's version is below ARGV[2] (it lost data) or when the change index does
/// not cover every row (rows written before it existed).
static READ_DELTA: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
local version = redis.call('GET', KEYS[1])
local v = 0
if version then v = tonumber(cjson.decode(version).version) or 0 end
local since = tonumber(ARGV[2])
local ids
local full = 0
if v < since or redis.call('ZCARD', KEYS[4]) ~= redis.call('SCARD', KEYS[2]) then
  ids = redis.call('SMEMBERS', KEYS[2])
  full = 1
else
  ids = redis.call('ZRANGEBYSCORE', KEYS[4], '(' .. ARGV[2], '+inf')
end
local rows = {}
local alive = {}
for i, id in ipairs(ids) do
  rows[i] = redis.call('GET', ARGV[1] .. id)
  local t = redis.call('HGET', KEYS[3], id)
  if t then
    alive[#alive + 1] = id
    alive[#alive + 1] = t
  end
end
return {version, ids, rows, alive, full}
",
    )
});

/// One row and the version, atomically, in the reply shape of [`READ_ALL`].
static READ_ROW: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
local version = redis.call('GET', KEYS[1])
local row = redis.call('GET', KEYS[2])
if not row then return {version, {}, {}, {}} end
return {version, {ARGV[1]}, {row}, {ARGV[1], redis.call('HGET', KEYS[3], ARGV[1])}}
",
    )
});

/// Blind IAmAlive write, only for a silo that has a row.
static I_AM_ALIVE: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
if redis.call('SISMEMBER', KEYS[1], ARGV[1]) == 1 then
  redis.call('HSET', KEYS[2], ARGV[1], ARGV[2])
end
return 0
",
    )
});

/// Deletes every row, the index, the IAmAlive hash and the version of one cluster,
/// atomically. KEYS = index, alive, version, changes; ARGV[1] = row key prefix.
static DELETE_CLUSTER: LazyLock<redis::Script> = LazyLock::new(|| {
    redis::Script::new(
        r"
local ids = redis.call('SMEMBERS', KEYS[1])
for _, id in ipairs(ids) do redis.call('DEL', ARGV[1] .. id) end
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4], KEYS[5])
return #ids
",
    )
});

/// One planned row write.
struct WriteRow<'a> {
    entry: &'a MembershipEntry,
    expected: Option<&'a Etag>,
    next: &'a TableVersion,
    row_json: &'a str,
    /// The history event's JSON (extended mode with a history).
    event_json: Option<String>,
}

/// Rows decoded by earlier reads of one cluster's table, by silo key: the bytes
/// each was decoded from, the IAmAlive time those bytes hold, and the row as last
/// returned (with the IAmAlive time of that read).
pub(crate) type DecodedRows = HashMap<String, (Vec<u8>, Timestamp, Arc<MembershipRow>)>;

/// [`DecodedRows`] shared by every handle of one cluster's table opened from one
/// store.
pub(crate) type SharedDecodedRows = Arc<std::sync::Mutex<DecodedRows>>;

/// The membership table of one cluster on Redis.
#[derive(Debug, Clone)]
pub struct RedisMembershipTable {
    router: Arc<Router>,
    keys: MembershipKeys,
    cluster_id: String,
    mode: ProtocolMode,
    history_capacity: u64,
    /// A row whose stored bytes are those of an earlier read is not parsed
    /// again: rows change only on membership writes (heartbeats live in their own
    /// hash), so most rows of most reads are unchanged. Holds the rows of the last
    /// full read at most (a full read drops the keys it did not return), and is
    /// shared by the handles of this cluster's table that one store opened (a
    /// process running several silos, or a silo and tools, parses a row once).
    decoded: SharedDecodedRows,
}

/// The text of a string reply, borrowed from it (`None` for nil), or why it is not
/// one: the caller names the key, and builds that name only on this error path.
fn utf8(v: &Value) -> std::result::Result<Option<&str>, String> {
    match v {
        Value::Nil => Ok(None),
        Value::BulkString(b) => std::str::from_utf8(b)
            .map(Some)
            .map_err(|_| "value is not UTF-8".to_owned()),
        Value::SimpleString(s) => Ok(Some(s)),
        other => Err(format!("unexpected reply {other:?}")),
    }
}

/// [`utf8`] with the error as [`Error::Corrupt`] on `key`.
fn text<'v>(v: &'v Value, key: &str) -> Result<Option<&'v str>> {
    utf8(v).map_err(|reason| Error::corrupt(key, reason))
}

fn decode_version(raw: Option<&str>, key: &str) -> Result<TableVersion> {
    match raw {
        None => Ok(initial_version()),
        Some(s) => {
            let v: StoredVersion = serde_json::from_str(s).map_err(|e| Error::corrupt(key, e))?;
            if v.etag.is_empty() {
                return Err(Error::corrupt(key, "empty etag"));
            }
            Ok(TableVersion {
                version: v.version,
                etag: Etag::new(v.etag),
            })
        }
    }
}

/// Decodes a stored row (`raw`, JSON) that must hold the silo named `id` (the text
/// of its key); on failure, the reason (the caller names the key). The silo is
/// parsed once: the row's text is compared with the key's, and parsed apart only
/// when they differ (another spelling of the same address is accepted).
fn decode_row(raw: &str, id: &str) -> std::result::Result<(MembershipEntry, Etag), String> {
    let row = serde_json::from_str::<StoredRow>(raw).map_err(|e| e.to_string())?;
    let silo: SiloAddress = id.parse().map_err(|e| format!("not a silo address: {e}"))?;
    if row.silo != id {
        let held: SiloAddress = row.silo.parse().map_err(|e| format!("silo: {e}"))?;
        if held != silo {
            return Err(format!("row holds silo {held} under the key of {silo}"));
        }
    }
    let (entry, etag) = row.into_parts(silo);
    if etag.is_empty() {
        return Err("empty etag".to_owned());
    }
    Ok((entry, Etag::new(etag)))
}

fn encode_row(entry: &MembershipEntry, etag: &str) -> Result<String> {
    serde_json::to_string(&StoredRowRef { entry, etag })
        .map_err(|e| Error::backend(format!("encode row: {e}")))
}

fn encode_version(version: u64) -> Result<(String, String)> {
    let etag = new_etag();
    let json = serde_json::to_string(&StoredVersion {
        version,
        etag: etag.clone(),
    })
    .map_err(|e| Error::backend(format!("encode version: {e}")))?;
    Ok((json, etag))
}

/// The etag of a stored row, read without decoding its columns.
#[derive(Deserialize)]
struct StoredEtag {
    etag: String,
}

async fn unwatch(con: &mut Dedicated) -> Result<bool> {
    redis::cmd("UNWATCH")
        .query_async::<()>(&mut *con)
        .await
        .map_err(|e| backend("UNWATCH", e))?;
    Ok(false)
}

impl RedisMembershipTable {
    pub(crate) fn new(
        router: Arc<Router>,
        prefix: &str,
        cluster_id: &str,
        mode: ProtocolMode,
        history_capacity: u64,
        decoded: SharedDecodedRows,
    ) -> Self {
        RedisMembershipTable {
            router,
            keys: MembershipKeys::new(prefix, cluster_id),
            cluster_id: cluster_id.to_owned(),
            mode,
            history_capacity,
            decoded,
        }
    }

    /// Two round trips. First `WATCH` row (+ version) and `MGET` both; the etags
    /// and the version are compared here. Then `MULTI`, the writes, `EXEC`:
    /// `MSET` row and version (one command: both keys carry the cluster's hash tag),
    /// `SADD` index (inserts only: an updated row is in the index since its
    /// insert), `HSET` IAmAlive, `ZADD` delta index, `ZADD` history event and
    /// `ZREMRANGEBYSCORE` trim (only once the version passes the capacity: below it
    /// the history holds at most `version` events, none under the floor).
    async fn write_on(&self, con: &mut Dedicated, w: &WriteRow<'_>) -> Result<bool> {
        let id = w.entry.silo.to_string();
        let row_key = self.keys.row(&id);
        let version_key = self.keys.version();
        let extended = self.mode == ProtocolMode::Extended;
        // One round trip: WATCH and both reads (pooled connections never carry a
        // WATCH, see conn::WatchConnections), then one for MULTI ... EXEC.
        let mut watch = redis::cmd("WATCH");
        watch.arg(&row_key);
        if extended {
            watch.arg(version_key);
        }
        let ((row, version),): ((Option<String>, Option<String>),) = redis::pipe()
            .add_command(watch)
            .ignore()
            .cmd("MGET")
            .arg(&row_key)
            .arg(version_key)
            .query_async(&mut *con)
            .await
            .map_err(|e| backend("WATCH and read before write", e))?;
        match (w.expected, row.as_deref()) {
            (None, Some(_)) | (Some(_), None) => return unwatch(con).await,
            (Some(etag), Some(raw)) => {
                let stored: StoredEtag =
                    serde_json::from_str(raw).map_err(|e| Error::corrupt(&row_key, e))?;
                if stored.etag.is_empty() {
                    return Err(Error::corrupt(&row_key, "empty etag"));
                }
                if stored.etag != etag.as_str() {
                    return unwatch(con).await;
                }
            }
            (None, None) => {}
        }
        let mut tx = redis::pipe();
        tx.atomic();
        if extended {
            let stored = decode_version(version.as_deref(), version_key)?;
            if !stored.admits(w.next, self.mode) {
                return unwatch(con).await;
            }
            let (json, _) = encode_version(w.next.version)?;
            tx.cmd("MSET")
                .arg(&row_key)
                .arg(w.row_json)
                .arg(version_key)
                .arg(json)
                .ignore();
        } else {
            tx.set(&row_key, w.row_json).ignore();
        }
        if w.expected.is_none() {
            tx.sadd(self.keys.index(), &id).ignore();
        }
        tx.hset(self.keys.alive(), &id, w.entry.i_am_alive_time.to_string())
            .ignore()
            // Delta reads: the version this row is written at (0 in basic mode).
            // Its reply (0 or 1) is the one kept, so that a committed EXEC is a
            // non-empty array: EXEC answers nil when a watched key changed.
            .zadd(self.keys.changes(), &id, w.next.version);
        if extended {
            // The history event, and the trim to the capacity, in the same MULTI.
            let history = self.keys.history();
            if let Some(event) = &w.event_json {
                tx.zadd(history, event, w.next.version).ignore();
            }
            let floor = history_floor(w.next.version, self.history_capacity);
            // Events exist only at versions 1..=next, so none lies under a floor of 1.
            if floor > 1 {
                tx.cmd("ZREMRANGEBYSCORE")
                    .arg(history)
                    .arg("-inf")
                    .arg(format!("({floor}"))
                    .ignore();
            }
        }
        let committed: Option<(i64,)> = tx.query_async(&mut *con).await.map_err(|e| backend("EXEC", e))?;
        Ok(committed.is_some())
    }

    /// The whole table (`only == None`, [`READ_ALL`]) or one row ([`READ_ROW`]), with
    /// the version, as one atomic snapshot.
    async fn read(&self, only: Option<&SiloAddress>) -> Result<MembershipSnapshot> {
        let keys = &self.keys;
        let (what, source, script_keys, args) = match only {
            None => {
                let (script_keys, args) = self.read_all_call();
                ("read_all", &READ_ALL, script_keys, args)
            }
            Some(silo) => {
                let id = silo.to_string();
                (
                    "read_row",
                    &READ_ROW,
                    vec![keys.version().to_owned(), keys.row(&id), keys.alive().to_owned()],
                    vec![id],
                )
            }
        };
        Ok(self.read_script(what, source, script_keys, args).await?.0)
    }

    /// The keys and arguments of [`READ_ALL`].
    fn read_all_call(&self) -> (Vec<String>, Vec<String>) {
        let keys = &self.keys;
        let script_keys = [keys.version(), keys.index(), keys.alive()].map(str::to_owned);
        (script_keys.to_vec(), vec![keys.row_prefix().to_owned()])
    }

    /// Runs a read script of the [`READ_ALL`] reply shape; returns the snapshot and
    /// whether the script said it is a full read (a fifth reply element of 1).
    async fn read_script(
        &self,
        what: &'static str,
        source: &'static redis::Script,
        script_keys: Vec<String>,
        args: Vec<String>,
    ) -> Result<(MembershipSnapshot, bool)> {
        let reply = self.invoke(what, source, script_keys, args).await?;
        self.decode_read(reply, what == "read_all")
    }

    /// The script behind `read_all`, its reply not decoded: the number of rows in it.
    /// The benchmark's reference for what decoding costs (see
    /// [`RedisStore::read_all_reply_rows`](crate::RedisStore::read_all_reply_rows)).
    pub(crate) async fn read_all_reply_rows(&self) -> Result<usize> {
        let keys = &self.keys;
        let (script_keys, args) = self.read_all_call();
        let reply = self.invoke("read_all", &READ_ALL, script_keys, args).await?;
        match reply {
            Value::Array(parts) => match parts.get(2) {
                Some(Value::Array(rows)) => Ok(rows.len()),
                _ => Err(Error::corrupt(keys.index(), "unexpected read_all reply")),
            },
            _ => Err(Error::corrupt(keys.index(), "unexpected read_all reply")),
        }
    }

    /// Runs a read script on the cluster's node, bounded by the timeout.
    async fn invoke(
        &self,
        what: &'static str,
        source: &'static redis::Script,
        script_keys: Vec<String>,
        args: Vec<String>,
    ) -> Result<Value> {
        self.router
            .invoke(&self.keys.tag, what, source, &script_keys, &args)
            .await
    }

    /// Decodes a reply of the [`READ_ALL`] shape (plus the full-read flag), borrowing
    /// every id and row from it.
    fn decode_read(&self, reply: Value, whole_table: bool) -> Result<(MembershipSnapshot, bool)> {
        let parts = match reply {
            Value::Array(p) if p.len() == 4 || p.len() == 5 => p,
            other => {
                return Err(Error::corrupt(
                    self.keys.version(),
                    format!("unexpected read_all reply {other:?}"),
                ))
            }
        };
        let version_key = self.keys.version();
        let version = decode_version(text(&parts[0], version_key)?, version_key)?;
        let (Value::Array(ids), Value::Array(rows), Value::Array(alive)) = (&parts[1], &parts[2], &parts[3])
        else {
            return Err(Error::corrupt(self.keys.index(), "unexpected read_all reply"));
        };
        // A bad row (or IAmAlive field) is reported in `corrupt` and the read goes on:
        // one bad value must not blind the cluster.
        let mut corrupt = Vec::new();
        // Everything below borrows from the reply: no copy of an id or a row.
        let mut alive_times: HashMap<&str, Timestamp> = HashMap::with_capacity(alive.len() / 2);
        for kv in alive.chunks(2) {
            if let [k, v] = kv {
                match (utf8(k), utf8(v)) {
                    (Ok(Some(k)), Ok(Some(v))) => match v.parse() {
                        Ok(t) => {
                            alive_times.insert(k, t);
                        }
                        Err(e) => corrupt.push(CorruptRow {
                            key: format!("{}#{k}", self.keys.alive()),
                            reason: format!("IAmAlive time: {e}"),
                        }),
                    },
                    (Err(reason), _) | (_, Err(reason)) => corrupt.push(CorruptRow {
                        key: self.keys.alive().to_owned(),
                        reason,
                    }),
                    _ => {}
                }
            }
        }
        let mut snap = MembershipSnapshot {
            version,
            ..Default::default()
        };
        let full = matches!(parts.get(4), Some(Value::Int(1)));
        let mut decoded = self.decoded.lock().unwrap_or_else(|p| p.into_inner());
        let mut returned: Vec<&str> = Vec::with_capacity(ids.len());
        for (id, row) in ids.iter().zip(rows) {
            let id = match utf8(id) {
                Ok(Some(id)) => id,
                Ok(None) => continue,
                Err(reason) => {
                    corrupt.push(CorruptRow {
                        key: self.keys.index().to_owned(),
                        reason,
                    });
                    continue;
                }
            };
            returned.push(id);
            let alive = alive_times.get(id).copied();
            // Unchanged bytes: the row decoded last time, with this read's IAmAlive.
            if let (Value::BulkString(bytes), Some((seen, stored_alive, cached))) = (row, decoded.get_mut(id))
            {
                if seen == bytes {
                    let now_alive = alive.unwrap_or(*stored_alive);
                    if now_alive != cached.entry.i_am_alive_time {
                        Arc::make_mut(cached).entry.i_am_alive_time = now_alive;
                    }
                    snap.entries.insert(cached.clone());
                    continue;
                }
            }
            let decoded_row = utf8(row).and_then(|raw| raw.map(|raw| decode_row(raw, id)).transpose());
            match decoded_row {
                Ok(Some((mut entry, etag))) => {
                    let stored_alive = entry.i_am_alive_time;
                    if let Some(t) = alive {
                        entry.i_am_alive_time = t;
                    }
                    let row_arc = Arc::new(MembershipRow::new(entry, etag));
                    if let Value::BulkString(bytes) = row {
                        decoded.insert(id.to_owned(), (bytes.clone(), stored_alive, row_arc.clone()));
                    }
                    snap.entries.insert(row_arc);
                }
                Ok(None) => {}
                Err(reason) => corrupt.push(CorruptRow {
                    key: self.keys.row(id),
                    reason,
                }),
            }
        }
        if whole_table || full {
            let returned: std::collections::HashSet<&str> = returned.into_iter().collect();
            decoded.retain(|id, _| returned.contains(id.as_str()));
        }
        drop(decoded);
        corrupt.sort();
        snap.corrupt = corrupt;
        Ok((snap, full))
    }
}

#[async_trait]
impl MembershipTable for RedisMembershipTable {
    fn cluster_id(&self) -> &str {
        &self.cluster_id
    }

    async fn init(&self, _try_create: bool) -> Result<()> {
        let key = self.keys.version();
        let (json, _) = encode_version(0)?;
        let mut set = redis::cmd("SET");
        set.arg(key).arg(&json).arg("NX");
        self.router
            .query::<Option<String>>(&self.keys.tag, "init", &set)
            .await
            .map(drop)
    }

    async fn read_row(&self, silo: &SiloAddress) -> Result<MembershipSnapshot> {
        self.read(Some(silo)).await
    }

    async fn read_all(&self) -> Result<MembershipSnapshot> {
        self.read(None).await
    }

    async fn read_delta(&self, since: &TableVersion) -> Result<MembershipDelta> {
        if self.mode == ProtocolMode::Basic {
            return Ok(MembershipDelta::full(self.read(None).await?));
        }
        let keys = &self.keys;
        let (snap, complete) = self
            .read_script(
                "read_delta",
                &READ_DELTA,
                vec![
                    keys.version().to_owned(),
                    keys.index().to_owned(),
                    keys.alive().to_owned(),
                    keys.changes().to_owned(),
                ],
                vec![keys.row_prefix().to_owned(), since.version.to_string()],
            )
            .await?;
        Ok(MembershipDelta {
            version: snap.version,
            changed: snap.entries,
            corrupt: snap.corrupt,
            complete,
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
        let row_json = encode_row(entry, &new_etag())?;
        let event_json = if self.mode == ProtocolMode::Extended && self.history_capacity > 0 {
            let event = MembershipEvent::of(entry, kind, next, origin);
            Some(serde_json::to_string(&event).map_err(|e| Error::backend(format!("encode event: {e}")))?)
        } else {
            None
        };
        let write = WriteRow {
            entry,
            expected,
            next,
            row_json: &row_json,
            event_json,
        };
        self.router
            .run(&self.keys.tag, |node: Arc<Node>| {
                let write = &write;
                async move {
                    node.timed(what, async {
                        let mut con = node.dedicated().await?;
                        let r = match self.write_on(&mut con, write).await {
                            // Acknowledged only once the replicas asked for have it.
                            Ok(true) => node.wait_for_replicas(&mut con).await.map(|()| true),
                            other => other,
                        };
                        if r.is_err() {
                            // Never hand a connection with unknown WATCH state back to the pool.
                            crate::conn::discard(con);
                        }
                        r
                    })
                    .await
                }
            })
            .await
    }

    async fn read_history(&self, query: &HistoryQuery) -> Result<Vec<MembershipEvent>> {
        require_history(self.mode)?;
        let key = self.keys.history();
        let from = query.from_version;
        // Without a silo filter the limit applies in Redis; with one, every event
        // from `from` on is read and filtered here (at most the capacity).
        let limit = match query.silo {
            None => i64::try_from(query.limit).unwrap_or(i64::MAX),
            Some(_) => -1,
        };
        let mut range = redis::cmd("ZRANGEBYSCORE");
        range
            .arg(key)
            .arg(from)
            .arg("+inf")
            .arg("WITHSCORES")
            .arg("LIMIT")
            .arg(0)
            .arg(limit);
        let raw: Vec<(String, u64)> = self.router.query(&self.keys.tag, "read_history", &range).await?;
        let mut events = Vec::with_capacity(raw.len());
        for (json, version) in raw {
            let event: MembershipEvent =
                serde_json::from_str(&json).map_err(|e| Error::corrupt(format!("{key} @ {version}"), e))?;
            events.push(event);
        }
        Ok(query.select(events))
    }

    async fn update_i_am_alive(&self, silo: &SiloAddress, time: Timestamp) -> Result<()> {
        let keys = [self.keys.index().to_owned(), self.keys.alive().to_owned()];
        let args = [silo.to_string(), time.to_string()];
        self.router
            .invoke::<i64, _>(&self.keys.tag, "update_i_am_alive", &I_AM_ALIVE, &keys, &args)
            .await
            .map(drop)
    }

    async fn cleanup_defunct(&self, before: Timestamp) -> Result<usize> {
        let snap = self.read(None).await?;
        // Dead is final: nobody writes a Dead row again, so no WATCH is needed.
        let ids: Vec<String> = snap
            .rows()
            .filter(|e| e.is_defunct(before))
            .map(|e| e.silo.to_string())
            .collect();
        if ids.is_empty() {
            return Ok(0);
        }
        let keys = &self.keys;
        let mut tx = redis::pipe();
        tx.atomic();
        for id in &ids {
            tx.del(keys.row(id))
                .ignore()
                .srem(keys.index(), id)
                .ignore()
                .zrem(keys.changes(), id)
                .ignore()
                .hdel(keys.alive(), id)
                .ignore();
        }
        self.router
            .pipeline::<()>(&keys.tag, "cleanup_defunct", &tx)
            .await?;
        Ok(ids.len())
    }

    async fn delete_all(&self) -> Result<()> {
        // One script: a racing write commits wholly before (and is deleted) or
        // wholly after (and is complete) the delete.
        let k = &self.keys;
        let keys = [k.index(), k.alive(), k.version(), k.changes(), k.history()].map(str::to_owned);
        self.router
            .invoke::<i64, _>(
                &k.tag,
                "delete_cluster",
                &DELETE_CLUSTER,
                &keys,
                &[k.row_prefix()],
            )
            .await
            .map(drop)
    }
}
