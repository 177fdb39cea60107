//! Key layout: every key rollcall writes to Redis, in one table.
//!
//! Each family of keys shares a hash tag (`{...}`), so in a Redis Cluster it lives
//! in one slot and its multi-key transactions and scripts work as on one server.
//! `<prefix>` is `rollcall` unless the store URL says otherwise.
//!
//! | key | type | holds |
//! |---|---|---|
//! | **membership table** (tag `m:<cluster>`) | | |
//! | `<prefix>:{m:<cluster>}:version` | string | the version row: `{"version":N,"etag":"..."}` |
//! | `<prefix>:{m:<cluster>}:silos` | set | silo addresses with a row (the index; no `KEYS` scans) |
//! | `<prefix>:{m:<cluster>}:silo:<ip:port@gen>` | string | the row as JSON, with its `etag` |
//! | `<prefix>:{m:<cluster>}:alive` | hash | silo address -> IAmAlive time (RFC 3339) |
//! | `<prefix>:{m:<cluster>}:changes` | sorted set | silo addresses scored by the table version their row was last written at (delta reads) |
//! | `<prefix>:{m:<cluster>}:history` | sorted set | membership events as JSON, scored by the table version they wrote (extended mode; bounded by `history`) |
//! | `<prefix>:{m:<cluster>}:metrics` | hash | `<role>/<id>` -> the silo or client metrics row as JSON |
//! | **reminders and shard leases** (tag `r:<service>:<shard>`, shard count under `r:<service>`) | | |
//! | `<prefix>:{r:<service>}:shards` | string | the service's shard count (`SET NX`) |
//! | `<prefix>:{r:<service>:<shard>}:ring` | sorted set | `<actor>/<name>` scored by the 32-bit actor hash |
//! | `<prefix>:{r:<service>:<shard>}:rem:<actor>/<name>` | string | the reminder as JSON, with its `etag` |
//! | `<prefix>:{r:<service>:<shard>}:lease` | hash | the shard's lease: `etag`, `row` (JSON) |
//! | `<prefix>:{r:<service>:<shard>}:pages` | hash | `<page set>/<index>` -> a page of the lease's exceptions (JSON) |
//! | `<prefix>:{r:<service>}:ring`, `...:rem:<actor>/<name>` | | the first layout (one slot per service), read once to move its reminders |
//! | **actor state** (tag `r:<service>:<shard>`, the actor's shard among the service's recorded count: the tag of its reminders and lease) | | |
//! | `<prefix>:{r:<service>:<shard>}:h:<actor>/<name>` | hash | the header: `etag`, `body` (frame and JSON header), `data` (a small state's bytes) |
//! | `<prefix>:{r:<service>:<shard>}:c:<actor>/<name>:<generation>` | hash | `<index>` -> chunk bytes, one key per generation |
//! | `<prefix>:{r:<service>:<shard>}:gs:<actor>/<name>` | set | the generations with chunks |
//! | `<prefix>:{g:<service>}:index` | sorted set | `<actor>/<name>`, score 0 (listed by `ZRANGEBYLEX`) |
//! | **statistics** (tag `s:<cluster>`) | | |
//! | `<prefix>:{s:<cluster>}:ids` | hash | `n:<name>` / `s:<silo>` -> interned id; `#next` the id counter |
//! | `<prefix>:{s:<cluster>}:strings` | hash | id -> `n:<name>` / `s:<silo>` |
//! | `<prefix>:{s:<cluster>}:<level>:index` | sorted set | members `<time: 16 hex><name id: 8 hex><silo id: 8 hex>`, score 0 |
//! | `<prefix>:{s:<cluster>}:<level>:values` | hash | member -> `<count> <sum> <min> <max> <is_delta 0/1>` |
//!
//! Cluster and service ids, actor ids and names are escaped (`%`, `{`, `}`, `/`,
//! `:` and control characters as `%XX`), so no id can break a hash tag or reach
//! into another's keys. `<level>` is a statistics level's code (0 raw, 1, 10, 60).
//! How each family is read and written is in its module: `membership.rs`,
//! `reminders.rs`, `lease.rs`, `state.rs`, `statistics.rs`, `metrics_table.rs`.

/// Escapes `%`, `{`, `}`, `/`, `:` and control characters as `%XX`
/// ([`rollcall_core::key_escape`]).
pub(crate) fn escape(s: &str) -> String {
    rollcall_core::key_escape::escape(s, &['{', '}', '/', ':'])
}

pub(crate) use rollcall_core::key_escape::unescape;

/// Keys of one cluster's membership table, formatted once (every row write names
/// five of them).
#[derive(Clone, Debug)]
pub(crate) struct MembershipKeys {
    /// The hash tag content (`m:<escaped cluster>`), for slot routing.
    pub(crate) tag: String,
    version: String,
    index: String,
    alive: String,
    changes: String,
    metrics: String,
    history: String,
    row_prefix: String,
}

impl MembershipKeys {
    pub(crate) fn new(prefix: &str, cluster: &str) -> Self {
        let tag = format!("m:{}", escape(cluster));
        let base = format!("{prefix}:{{{tag}}}");
        MembershipKeys {
            version: format!("{base}:version"),
            index: format!("{base}:silos"),
            alive: format!("{base}:alive"),
            changes: format!("{base}:changes"),
            metrics: format!("{base}:metrics"),
            history: format!("{base}:history"),
            row_prefix: format!("{base}:silo:"),
            tag,
        }
    }
    pub(crate) fn version(&self) -> &str {
        &self.version
    }
    pub(crate) fn index(&self) -> &str {
        &self.index
    }
    pub(crate) fn alive(&self) -> &str {
        &self.alive
    }
    pub(crate) fn changes(&self) -> &str {
        &self.changes
    }
    /// The metrics table: a hash of `<role>/<escaped id>` -> row JSON.
    pub(crate) fn metrics(&self) -> &str {
        &self.metrics
    }
    /// The membership history: a sorted set of event JSON scored by table version.
    pub(crate) fn history(&self) -> &str {
        &self.history
    }
    pub(crate) fn row_prefix(&self) -> &str {
        &self.row_prefix
    }
    pub(crate) fn row(&self, silo: &str) -> String {
        format!("{}{silo}", self.row_prefix)
    }
}

/// Keys of one service's reminders and shard leases. Shard `k` of the service
/// (see [`actor_shard`](rollcall_core::actor_shard)) has a hash tag of
/// its own, `r:<service>:<k>`: its reminder rows, its ring and its lease share a
/// slot, and a service's shards spread over every master of a cluster. The
/// service's shard count sits under `r:<service>`, as did every reminder of the
/// first layout (`legacy_*`, read once to move them).
#[derive(Clone, Debug)]
pub(crate) struct ReminderKeys {
    prefix: String,
    service: String,
}

impl ReminderKeys {
    pub(crate) fn new(prefix: &str, service: &str) -> Self {
        ReminderKeys {
            prefix: prefix.to_owned(),
            service: escape(service),
        }
    }
    /// The tag of the service's own keys (its shard count).
    pub(crate) fn service_tag(&self) -> String {
        format!("r:{}", self.service)
    }
    /// The tag of shard `k`.
    pub(crate) fn shard_tag(&self, k: u32) -> String {
        format!("r:{}:{k}", self.service)
    }
    fn shard_base(&self, k: u32) -> String {
        format!("{}:{{{}}}", self.prefix, self.shard_tag(k))
    }
    fn service_base(&self) -> String {
        format!("{}:{{{}}}", self.prefix, self.service_tag())
    }
    /// The service's shard count.
    pub(crate) fn count(&self) -> String {
        format!("{}:shards", self.service_base())
    }
    /// The ring of shard `k`: a sorted set of members scored by actor hash.
    pub(crate) fn ring(&self, k: u32) -> String {
        format!("{}:ring", self.shard_base(k))
    }
    /// The ring member of a reminder: `<escaped actor>/<escaped name>`.
    pub(crate) fn member(actor: &str, name: &str) -> String {
        format!("{}/{}", escape(actor), escape(name))
    }
    pub(crate) fn row_prefix(&self, k: u32) -> String {
        format!("{}:rem:", self.shard_base(k))
    }
    pub(crate) fn row(&self, k: u32, member: &str) -> String {
        format!("{}{member}", self.row_prefix(k))
    }
    /// The run history of a reminder of shard `k`: a list, newest first.
    pub(crate) fn runs(&self, k: u32, member: &str) -> String {
        format!("{}{member}", self.runs_prefix(k))
    }
    pub(crate) fn runs_prefix(&self, k: u32) -> String {
        format!("{}:runs:", self.shard_base(k))
    }
    /// The members of shard `k` that have a run history (a set), so that
    /// `clear` finds them.
    pub(crate) fn runs_index(&self, k: u32) -> String {
        format!("{}:runs", self.shard_base(k))
    }
    /// The lease of shard `k`.
    pub(crate) fn lease(&self, k: u32) -> String {
        format!("{}:lease", self.shard_base(k))
    }
    /// The lease pages of shard `k`: a hash of `<set>/<index>` -> page.
    pub(crate) fn lease_pages(&self, k: u32) -> String {
        format!("{}:pages", self.shard_base(k))
    }
    /// The ring of the first layout (every reminder of the service in one slot).
    pub(crate) fn legacy_ring(&self) -> String {
        format!("{}:ring", self.service_base())
    }
    pub(crate) fn legacy_row(&self, member: &str) -> String {
        format!("{}:rem:{member}", self.service_base())
    }
}

/// The Redis Cluster slot of a hash tag (CRC16-XMODEM mod 16384).
pub(crate) fn slot(tag: &str) -> u16 {
    crc16::State::<crc16::XMODEM>::calculate(tag.as_bytes()) % 16384
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_cannot_break_the_hash_tag() {
        let k = MembershipKeys::new("rollcall", "a}b{c:d/e%");
        assert_eq!(k.version(), "rollcall:{m:a%7Db%7Bc%3Ad%2Fe%25}:version");
        assert_eq!(ReminderKeys::member("x/y", "n:m"), "x%2Fy/n%3Am");
        let r = ReminderKeys::new("rollcall", "s}1");
        assert_eq!(r.row(7, "a/b"), "rollcall:{r:s%7D1:7}:rem:a/b");
        assert_eq!(r.lease(7), "rollcall:{r:s%7D1:7}:lease");
        assert_eq!(r.count(), "rollcall:{r:s%7D1}:shards");
        assert_ne!(ReminderKeys::member("a/b", "c"), ReminderKeys::member("a", "b/c"));
        assert_eq!(escape("ü\n"), "ü%0A");
    }

    #[test]
    fn slots_match_redis() {
        // Values from the Redis Cluster specification / CLUSTER KEYSLOT.
        assert_eq!(slot("123456789"), 12739);
        assert_eq!(slot("foo"), 12182);
        assert_eq!(slot(""), 0);
    }
}
