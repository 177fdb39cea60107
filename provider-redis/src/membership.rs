//! The membership table on Redis.

use std::collections::HashMap;
use std::sync::{Arc, LazyLock};

use async_trait::async_trait;
use redis::Value;
use rollcall_membership_core::{
    CorruptRow, Error, Etag, MembershipDelta, MembershipEntry, MembershipSnapshot, MembershipTable,
    ProtocolMode, Result, SiloAddress, TableVersion, Timestamp,
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

/// A stored row: the entry's columns plus its etag.
#[derive(Serialize, Deserialize)]
struct StoredRow {
    #[serde(flatten)]
    entry: MembershipEntry,
    etag: String,
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
redis.call('DEL', KEYS[1], KEYS[2], KEYS[3], KEYS[4])
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
}

/// The membership table of one cluster on Redis.
#[derive(Debug, Clone)]
pub struct RedisMembershipTable {
    router: Arc<Router>,
    keys: MembershipKeys,
    prefix: String,
    cluster_id: String,
    mode: ProtocolMode,
}

fn text(v: &Value, key: &str) -> Result<Option<String>> {
    match v {
        Value::Nil => Ok(None),
        Value::BulkString(b) => String::from_utf8(b.clone())
            .map(Some)
            .map_err(|_| Error::corrupt(key, "value is not UTF-8")),
        Value::SimpleString(s) => Ok(Some(s.clone())),
        other => Err(Error::corrupt(key, format!("unexpected reply {other:?}"))),
    }
}

/// The [`CorruptRow`] of a decode error (`Error::Corrupt` carries key and reason).
fn corrupt_row(e: Error) -> CorruptRow {
    match e {
        Error::Corrupt { key, reason } => CorruptRow { key, reason },
        other => CorruptRow {
            key: String::new(),
            reason: other.to_string(),
        },
    }
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

fn decode_row(raw: &str, key: &str, silo: Option<&SiloAddress>) -> Result<(MembershipEntry, Etag)> {
    let row: StoredRow = serde_json::from_str(raw).map_err(|e| Error::corrupt(key, e))?;
    if let Some(s) = silo {
        if row.entry.silo != *s {
            return Err(Error::corrupt(
                key,
                format!("row holds silo {} under the key of {s}", row.entry.silo),
            ));
        }
    }
    if row.etag.is_empty() {
        return Err(Error::corrupt(key, "empty etag"));
    }
    Ok((row.entry, Etag::new(row.etag)))
}

fn encode_row(entry: &MembershipEntry, etag: &str) -> Result<String> {
    serde_json::to_string(&StoredRow {
        entry: entry.clone(),
        etag: etag.to_owned(),
    })
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
        .query_async::<()>(&mut **con)
        .await
        .map_err(|e| backend("UNWATCH", e))?;
    Ok(false)
}

impl RedisMembershipTable {
    pub(crate) fn new(router: Arc<Router>, prefix: &str, cluster_id: &str, mode: ProtocolMode) -> Self {
        RedisMembershipTable {
            router,
            keys: MembershipKeys::new(prefix, cluster_id),
            prefix: prefix.to_owned(),
            cluster_id: cluster_id.to_owned(),
            mode,
        }
    }

    async fn write_row(
        &self,
        entry: &MembershipEntry,
        expected: Option<&Etag>,
        next: &TableVersion,
    ) -> Result<bool> {
        let what = if expected.is_some() {
            "update_row"
        } else {
            "insert_row"
        };
        let row_json = encode_row(entry, &new_etag())?;
        let write = WriteRow {
            entry,
            expected,
            next,
            row_json: &row_json,
        };
        self.router
            .run(&self.keys.tag, |node: Arc<Node>| {
                let write = &write;
                async move {
                    node.timed(what, async {
                        let mut con = node.dedicated().await?;
                        let r = self.write_on(&mut con, write).await;
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

    /// WATCH row (+ version), read, compare etags, MULTI / SET row / SET version / EXEC.
    async fn write_on(&self, con: &mut Dedicated, w: &WriteRow<'_>) -> Result<bool> {
        let id = w.entry.silo.to_string();
        let row_key = self.keys.row(&id);
        let version_key = self.keys.version();
        let extended = self.mode == ProtocolMode::Extended;
        let watched: Vec<&str> = if extended {
            vec![row_key.as_str(), version_key.as_str()]
        } else {
            vec![row_key.as_str()]
        };
        // One round trip: WATCH and both reads (pooled connections never carry a
        // WATCH, see conn::WatchConnections), then one for MULTI ... EXEC.
        let (row, version): (Option<String>, Option<String>) = redis::pipe()
            .cmd("WATCH")
            .arg(&watched)
            .ignore()
            .get(&row_key)
            .get(&version_key)
            .query_async(&mut **con)
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
        tx.atomic()
            .set(&row_key, w.row_json)
            .ignore()
            .sadd(self.keys.index(), &id)
            .ignore()
            .hset(self.keys.alive(), &id, w.entry.i_am_alive_time.to_string())
            .ignore()
            // Delta reads: the version this row is written at (0 in basic mode).
            .zadd(self.keys.changes(), &id, w.next.version)
            .ignore();
        if extended {
            let stored = decode_version(version.as_deref(), &version_key)?;
            if !stored.admits(w.next, self.mode) {
                return unwatch(con).await;
            }
            let (json, _) = encode_version(w.next.version)?;
            tx.set(&version_key, json).ignore();
        }
        // The one reply kept (SADD's count), so that a committed EXEC is a non-empty
        // array: EXEC answers nil when a watched key changed.
        tx.sadd(self.keys.index(), &id);
        let committed: Option<(i64,)> = tx.query_async(&mut **con).await.map_err(|e| backend("EXEC", e))?;
        Ok(committed.is_some())
    }

    /// The whole table (`only == None`, [`READ_ALL`]) or one row ([`READ_ROW`]), with
    /// the version, as one atomic snapshot.
    async fn read(&self, only: Option<&SiloAddress>) -> Result<MembershipSnapshot> {
        let keys = &self.keys;
        let (what, source, script_keys, args) = match only {
            None => (
                "read_all",
                &READ_ALL,
                vec![keys.version(), keys.index(), keys.alive()],
                vec![keys.row_prefix()],
            ),
            Some(silo) => {
                let id = silo.to_string();
                (
                    "read_row",
                    &READ_ROW,
                    vec![keys.version(), keys.row(&id), keys.alive()],
                    vec![id],
                )
            }
        };
        Ok(self.read_script(what, source, script_keys, args).await?.0)
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
        let keys = &self.keys;
        let reply: Value = self
            .router
            .run(&keys.tag, |node: Arc<Node>| {
                let (script_keys, args) = (&script_keys, &args);
                async move {
                    node.timed(what, async {
                        let mut con = node.shared().await?;
                        let script = source;
                        let mut invocation = script.prepare_invoke();
                        for k in script_keys {
                            invocation.key(k);
                        }
                        for a in args {
                            invocation.arg(a);
                        }
                        invocation
                            .invoke_async(&mut con)
                            .await
                            .map_err(|e| backend(what, e))
                    })
                    .await
                }
            })
            .await?;
        let parts = match reply {
            Value::Array(p) if p.len() == 4 || p.len() == 5 => p,
            other => {
                return Err(Error::corrupt(
                    self.keys.version(),
                    format!("unexpected read_all reply {other:?}"),
                ))
            }
        };
        let version = decode_version(
            text(&parts[0], &self.keys.version())?.as_deref(),
            &self.keys.version(),
        )?;
        let (Value::Array(ids), Value::Array(rows), Value::Array(alive)) = (&parts[1], &parts[2], &parts[3])
        else {
            return Err(Error::corrupt(self.keys.index(), "unexpected read_all reply"));
        };
        // A bad row (or IAmAlive field) is reported in `corrupt` and the read goes on:
        // one bad value must not blind the cluster.
        let mut corrupt = Vec::new();
        let mut alive_times: HashMap<String, Timestamp> = HashMap::new();
        for kv in alive.chunks(2) {
            if let [k, v] = kv {
                let field = |id: &str| format!("{}#{id}", self.keys.alive());
                match (text(k, &self.keys.alive()), text(v, &self.keys.alive())) {
                    (Ok(Some(k)), Ok(Some(v))) => match v.parse() {
                        Ok(t) => {
                            alive_times.insert(k, t);
                        }
                        Err(e) => corrupt.push(CorruptRow {
                            key: field(&k),
                            reason: format!("IAmAlive time: {e}"),
                        }),
                    },
                    (Err(e), _) | (_, Err(e)) => corrupt.push(corrupt_row(e)),
                    _ => {}
                }
            }
        }
        let mut snap = MembershipSnapshot {
            version,
            ..Default::default()
        };
        for (id, row) in ids.iter().zip(rows) {
            let id = match text(id, &self.keys.index()) {
                Ok(Some(id)) => id,
                Ok(None) => continue,
                Err(e) => {
                    corrupt.push(corrupt_row(e));
                    continue;
                }
            };
            let key = self.keys.row(&id);
            let silo: SiloAddress = match id.parse() {
                Ok(s) => s,
                Err(e) => {
                    corrupt.push(CorruptRow {
                        key,
                        reason: format!("not a silo address: {e}"),
                    });
                    continue;
                }
            };
            let decoded = text(row, &key)
                .and_then(|raw| raw.map(|raw| decode_row(&raw, &key, Some(&silo))).transpose());
            match decoded {
                Ok(Some((mut entry, etag))) => {
                    if let Some(t) = alive_times.get(&id) {
                        entry.i_am_alive_time = *t;
                    }
                    snap.entries.insert(silo, Arc::new((entry, etag)));
                }
                Ok(None) => {}
                Err(e) => corrupt.push(corrupt_row(e)),
            }
        }
        corrupt.sort();
        snap.corrupt = corrupt;
        let full = matches!(parts.get(4), Some(Value::Int(1)));
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
        self.router
            .run(&self.keys.tag, |node: Arc<Node>| {
                let (key, json) = (key.clone(), json.clone());
                async move {
                    node.timed("init", async {
                        let mut con = node.shared().await?;
                        redis::cmd("SET")
                            .arg(&key)
                            .arg(&json)
                            .arg("NX")
                            .query_async::<Option<String>>(&mut con)
                            .await
                            .map(|_| ())
                            .map_err(|e| backend("init", e))
                    })
                    .await
                }
            })
            .await
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
                vec![keys.version(), keys.index(), keys.alive(), keys.changes()],
                vec![keys.row_prefix(), since.version.to_string()],
            )
            .await?;
        Ok(MembershipDelta {
            version: snap.version,
            changed: snap.entries,
            corrupt: snap.corrupt,
            complete,
        })
    }

    async fn insert_row(&self, entry: &MembershipEntry, next_version: &TableVersion) -> Result<bool> {
        self.write_row(entry, None, next_version).await
    }

    async fn update_row(
        &self,
        entry: &MembershipEntry,
        etag: &Etag,
        next_version: &TableVersion,
    ) -> Result<bool> {
        self.write_row(entry, Some(etag), next_version).await
    }

    async fn update_i_am_alive(&self, silo: &SiloAddress, time: Timestamp) -> Result<()> {
        let (index, alive, id, t) = (
            self.keys.index(),
            self.keys.alive(),
            silo.to_string(),
            time.to_string(),
        );
        self.router
            .run(&self.keys.tag, |node: Arc<Node>| {
                let (index, alive, id, t) = (index.clone(), alive.clone(), id.clone(), t.clone());
                async move {
                    node.timed("update_i_am_alive", async {
                        let mut con = node.shared().await?;
                        I_AM_ALIVE
                            .key(index)
                            .key(alive)
                            .arg(id)
                            .arg(t)
                            .invoke_async::<i64>(&mut con)
                            .await
                            .map(|_| ())
                            .map_err(|e| backend("update_i_am_alive", e))
                    })
                    .await
                }
            })
            .await
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
        let keys = self.keys.clone();
        let ids_ref = &ids;
        self.router
            .run(&keys.tag, |node: Arc<Node>| {
                let keys = keys.clone();
                async move {
                    node.timed("cleanup_defunct", async {
                        let mut con = node.shared().await?;
                        let mut tx = redis::pipe();
                        tx.atomic();
                        for id in ids_ref {
                            tx.del(keys.row(id))
                                .ignore()
                                .srem(keys.index(), id)
                                .ignore()
                                .zrem(keys.changes(), id)
                                .ignore()
                                .hdel(keys.alive(), id)
                                .ignore();
                        }
                        tx.query_async::<()>(&mut con)
                            .await
                            .map_err(|e| backend("cleanup_defunct", e))
                    })
                    .await
                }
            })
            .await?;
        Ok(ids.len())
    }

    async fn delete_cluster(&self, cluster_id: &str) -> Result<()> {
        let keys = MembershipKeys::new(&self.prefix, cluster_id);
        self.router
            .run(&keys.tag, |node: Arc<Node>| {
                let keys = keys.clone();
                async move {
                    node.timed("delete_cluster", async {
                        // One script: a racing write commits wholly before (and is
                        // deleted) or wholly after (and is complete) the delete.
                        let mut con = node.shared().await?;
                        DELETE_CLUSTER
                            .key(keys.index())
                            .key(keys.alive())
                            .key(keys.version())
                            .key(keys.changes())
                            .arg(keys.row_prefix())
                            .invoke_async::<i64>(&mut con)
                            .await
                            .map(|_| ())
                            .map_err(|e| backend("delete_cluster", e))
                    })
                    .await
                }
            })
            .await
    }
}
