//! Key layout.
//!
//! | key | holds |
//! |---|---|
//! | `<prefix>/<cluster>/version` | the version row: `{"version":N}`; its etag is the key's `mod_revision` |
//! | `<prefix>/<cluster>/silo/<ip:port@gen>` | one membership row as JSON (the entry's columns plus `written_at`, the table version of the write); its etag is the key's `mod_revision` |
//! | `<prefix>/<cluster>/alive/<ip:port@gen>` | the row's IAmAlive time (RFC 3339), written by heartbeats and by every row write |
//! | `<prefix>/<service>/reminder/<hash as 8 hex>/<actor>/<name>` | one reminder as JSON; its etag is the key's `mod_revision` |
//!
//! Cluster and service ids, actor ids and names are escaped (`%`, `/` and control
//! characters as `%XX`), so every segment is free of `/`: no id can reach into
//! another's keys and no (actor, name) pair collides with another. The hash is
//! fixed-width lowercase hex, so key order is hash order and a ring range is a key
//! range.

/// Escapes `%`, `/` and control characters as `%XX`
/// ([`rollcall_core::key_escape`]).
pub(crate) fn escape(s: &str) -> String {
    rollcall_core::key_escape::escape(s, &['/'])
}

pub(crate) use rollcall_core::key_escape::unescape;

/// The key just above every key that starts with `prefix` (etcd's range end for
/// a prefix): the prefix with its last byte incremented.
pub(crate) fn prefix_end(prefix: &str) -> Vec<u8> {
    let mut end = prefix.as_bytes().to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// Keys of one cluster's membership table.
#[derive(Clone, Debug)]
pub(crate) struct MembershipKeys {
    base: String,
}

impl MembershipKeys {
    pub(crate) fn new(prefix: &str, cluster: &str) -> Self {
        MembershipKeys {
            base: format!("{prefix}/{}/", escape(cluster)),
        }
    }
    pub(crate) fn version(&self) -> String {
        format!("{}version", self.base)
    }
    pub(crate) fn silo_prefix(&self) -> String {
        format!("{}silo/", self.base)
    }
    pub(crate) fn silo(&self, silo: &str) -> String {
        format!("{}{}", self.silo_prefix(), escape(silo))
    }
    pub(crate) fn alive_prefix(&self) -> String {
        format!("{}alive/", self.base)
    }
    /// The metrics table: `metrics/<role>/<escaped id>` -> row JSON.
    pub(crate) fn metrics_prefix(&self) -> String {
        format!("{}metrics/", self.base)
    }
    pub(crate) fn metrics(&self, role: &str, id: &str) -> String {
        format!("{}{role}/{}", self.metrics_prefix(), escape(id))
    }
    /// The membership history: one key per event, named by its table version
    /// zero-padded to 20 digits so that key order is version order.
    pub(crate) fn history_prefix(&self) -> String {
        format!("{}history/", self.base)
    }
    pub(crate) fn history(&self, version: u64) -> String {
        format!("{}{version:020}", self.history_prefix())
    }
    pub(crate) fn alive(&self, silo: &str) -> String {
        format!("{}{}", self.alive_prefix(), escape(silo))
    }
}

/// Keys of one service's reminder table.
#[derive(Clone, Debug)]
pub(crate) struct ReminderKeys {
    base: String,
    runs: String,
}

impl ReminderKeys {
    pub(crate) fn new(prefix: &str, service: &str) -> Self {
        ReminderKeys {
            base: format!("{prefix}/{}/reminder/", escape(service)),
            runs: format!("{prefix}/{}/reminder-runs/", escape(service)),
        }
    }
    /// Every run-history key of the service starts with this: beside the
    /// rows, not under them, so that a range read of rows never meets one.
    pub(crate) fn all_runs(&self) -> &str {
        &self.runs
    }
    /// The run history of a reminder (a JSON array, newest first).
    pub(crate) fn runs(&self, hash: u32, actor: &str, name: &str) -> String {
        format!("{}{hash:08x}/{}/{}", self.runs, escape(actor), escape(name))
    }
    /// Every reminder key of the service starts with this.
    pub(crate) fn all(&self) -> &str {
        &self.base
    }
    /// The first possible key of hash `h`.
    pub(crate) fn hash_start(&self, h: u32) -> String {
        format!("{}{h:08x}/", self.base)
    }
    /// Every reminder key of `actor` starts with this.
    pub(crate) fn actor(&self, hash: u32, actor: &str) -> String {
        format!("{}{}/", self.hash_start(hash), escape(actor))
    }
    pub(crate) fn row(&self, hash: u32, actor: &str, name: &str) -> String {
        format!("{}{}", self.actor(hash, actor), escape(name))
    }
    /// The key of a reminder's last-fired time: its row key plus `/fired`. A row key
    /// has three segments after [`all`](Self::all) (hash, actor, name; `/` is escaped
    /// inside them), a fired key four, so the two never collide.
    pub(crate) fn fired(row_key: &str) -> String {
        format!("{row_key}/fired")
    }
    /// For a key under [`all`](Self::all): `Some(row key)` if it is a fired key.
    pub(crate) fn fired_row<'k>(&self, key: &'k str) -> Option<&'k str> {
        self.side_row(key, "/fired")
    }
    /// The key of a reminder's paused column: its row key plus `/paused`, four
    /// segments like a fired key.
    pub(crate) fn paused(row_key: &str) -> String {
        format!("{row_key}/paused")
    }
    /// For a key under [`all`](Self::all): `Some(row key)` if it is a paused key.
    pub(crate) fn paused_row<'k>(&self, key: &'k str) -> Option<&'k str> {
        self.side_row(key, "/paused")
    }
    fn side_row<'k>(&self, key: &'k str, suffix: &str) -> Option<&'k str> {
        let rest = key.strip_prefix(self.base.as_str())?;
        (rest.matches('/').count() == 3)
            .then(|| key.strip_suffix(suffix))
            .flatten()
    }
    /// `(start, end)` of the keys whose hash lies in `lo..=hi` (`lo <= hi`).
    pub(crate) fn hash_range(&self, lo: u32, hi: u32) -> (Vec<u8>, Vec<u8>) {
        let start = self.hash_start(lo).into_bytes();
        let end = match hi.checked_add(1) {
            Some(next) => self.hash_start(next).into_bytes(),
            None => prefix_end(&self.base),
        };
        (start, end)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escaping_round_trips_and_keeps_segments_apart() {
        for s in ["plain", "a/b", "100%", "ü\n/%2F", ""] {
            assert_eq!(unescape(&escape(s)).as_deref(), Some(s));
            assert!(!escape(s).contains('/'));
        }
        let k = ReminderKeys::new("rc", "svc/x");
        assert_eq!(k.row(0xAB, "a/b", "c"), "rc/svc%2Fx/reminder/000000ab/a%2Fb/c");
        // A reminder named "fired" is a row, not a fired key.
        let named_fired = k.row(0xAB, "a", "fired");
        assert_eq!(k.fired_row(&named_fired), None);
        let fired = ReminderKeys::fired(&named_fired);
        assert_eq!(k.fired_row(&fired), Some(named_fired.as_str()));
        assert_eq!(k.paused_row(&fired), None);
        let named_paused = k.row(0xAB, "a", "paused");
        assert_eq!(k.paused_row(&named_paused), None);
        let paused = ReminderKeys::paused(&named_paused);
        assert_eq!(k.paused_row(&paused), Some(named_paused.as_str()));
        assert_eq!(k.fired_row(&paused), None);
        assert_ne!(k.row(1, "a/b", "c"), k.row(1, "a", "b/c"));
        assert_eq!(unescape("%zz"), None);
        assert_eq!(unescape("%4"), None);
    }

    #[test]
    fn hash_ranges_are_key_ranges() {
        let k = ReminderKeys::new("rc", "s");
        let (start, end) = k.hash_range(5, 0x10);
        assert_eq!(start, b"rc/s/reminder/00000005/".to_vec());
        assert_eq!(end, b"rc/s/reminder/00000011/".to_vec());
        let (_, end) = k.hash_range(0, u32::MAX);
        assert_eq!(end, b"rc/s/reminder0".to_vec());
        let key = k.row(0x10, "actor", "n").into_bytes();
        assert!(start <= key && key < k.hash_range(5, 0x10).1);
        assert_eq!(prefix_end("a/"), b"a0".to_vec());
    }

    #[test]
    fn membership_keys_of_clusters_never_overlap() {
        let a = MembershipKeys::new("rollcall", "a");
        let ab = MembershipKeys::new("rollcall", "a/silo");
        assert_eq!(a.silo("10.0.0.1:1@2"), "rollcall/a/silo/10.0.0.1:1@2");
        assert!(!ab.silo("x").starts_with(&a.silo_prefix()));
        assert_eq!(a.version(), "rollcall/a/version");
    }
}
