//! Membership table rows: [`MembershipEntry`], [`TableVersion`], [`Etag`] and
//! [`MembershipSnapshot`].

use std::fmt;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::{SiloAddress, SiloStatus, Timestamp};

/// An opaque optimistic-concurrency token of one stored row.
///
/// Each provider chooses its form (a counter, an etcd `mod_revision`, a random
/// string); callers only compare etags for equality and hand them back to conditional
/// writes. Never empty for a row that exists.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Etag(String);

impl Etag {
    /// Wraps a provider's token.
    pub fn new(s: impl Into<String>) -> Self {
        Etag(s.into())
    }

    /// The token text.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// True for the empty etag (no stored row).
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

impl fmt::Display for Etag {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl From<&str> for Etag {
    fn from(s: &str) -> Self {
        Etag(s.to_owned())
    }
}

impl From<String> for Etag {
    fn from(s: String) -> Self {
        Etag(s)
    }
}

/// The membership **version row**: a counter bumped by exactly 1 in the same
/// conditional transaction as every row write, plus its etag.
///
/// It totally orders all membership views (Orleans "extended" protocol, *Cluster
/// Management in Orleans*, "the table version"). A writer reads the table, computes
/// [`TableVersion::next`] and passes it to `insert_row`/`update_row`; the write
/// succeeds only if the version row still has the etag that was read.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct TableVersion {
    /// Number of successful row writes since the cluster's table was created.
    pub version: u64,
    /// Etag of the version row as read.
    pub etag: Etag,
}

impl TableVersion {
    /// The version a writer proposes after reading `self`: `version + 1`, carrying the
    /// etag that was read (the write's precondition).
    pub fn next(&self) -> TableVersion {
        TableVersion {
            version: self.version.saturating_add(1),
            etag: self.etag.clone(),
        }
    }

    /// The version precondition of a conditional write, as every provider checks it:
    /// `next` may follow this stored version if it carries this version's etag and
    /// is exactly one higher. Always true in [`ProtocolMode::Basic`](crate::ProtocolMode::Basic).
    pub fn admits(&self, next: &TableVersion, mode: crate::ProtocolMode) -> bool {
        mode == crate::ProtocolMode::Basic
            || (self.etag == next.etag && self.version.checked_add(1) == Some(next.version))
    }
}

/// One suspicion written into a suspect's row: who suspected it and when (by the
/// voter's clock). Orleans keeps these as the parallel columns `SuspectingSilos` /
/// `SuspectingTimes`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub struct SuspectVote {
    /// The silo that voted.
    pub silo: SiloAddress,
    /// When it voted (wall clock of the voter, ms precision).
    pub time: Timestamp,
}

/// One row of the membership table: the Orleans silo-instance columns
/// (*Orleans runtime tables*, `SiloInstanceTableEntry`).
///
/// The row key is [`MembershipEntry::silo`]; the partition is the cluster id the table
/// was opened for.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MembershipEntry {
    /// Silo identity (`Address`, `Port`, `Generation` columns).
    pub silo: SiloAddress,
    /// Lifecycle status (`Status`).
    pub status: SiloStatus,
    /// Suspicions against this silo, oldest first (`SuspectingSilos`,
    /// `SuspectingTimes`).
    #[serde(default)]
    pub suspect_votes: Vec<SuspectVote>,
    /// Silo-to-client (gateway) port; 0 = not a gateway (`ProxyPort`).
    #[serde(default)]
    pub proxy_port: u16,
    /// Host name of the machine (`HostName`); diagnostics only.
    #[serde(default)]
    pub host_name: String,
    /// Silo name given by the host (`InstanceName`); diagnostics only.
    #[serde(default)]
    pub silo_name: String,
    /// Role / application name (`RoleName`); diagnostics only.
    #[serde(default)]
    pub role_name: String,
    /// Update zone (`UpdateZone`).
    #[serde(default)]
    pub update_zone: u32,
    /// Fault zone (`FaultZone`).
    #[serde(default)]
    pub fault_zone: u32,
    /// When the silo process started (`StartTime`).
    pub start_time: Timestamp,
    /// Last IAmAlive heartbeat (`IAmAliveTime`), written blindly by
    /// `update_i_am_alive`.
    pub i_am_alive_time: Timestamp,
    /// The silo measured its own wall clock beyond half the cluster's
    /// `max_clock_offset` from the median of its peers' clocks (see
    /// [`ClockReport`](crate::protocol::ClockReport)) and said so in its row. Not an
    /// Orleans column: rollcall's leases need bounded clocks, so a silo whose clock
    /// is off takes no part in shard ownership (the reminder and placement ring
    /// leaves it out) while it stays a member that probes and answers probes.
    /// Absent in rows written by older silos and when false (read as false).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub clock_beyond_bound: bool,
}

impl MembershipEntry {
    /// A row for `silo` in `status` with the given start time, IAmAlive = start time,
    /// no votes, no gateway and empty names.
    pub fn new(silo: SiloAddress, status: SiloStatus, start_time: Timestamp) -> Self {
        MembershipEntry {
            silo,
            status,
            suspect_votes: Vec::new(),
            proxy_port: 0,
            host_name: String::new(),
            silo_name: String::new(),
            role_name: String::new(),
            update_zone: 0,
            fault_zone: 0,
            start_time,
            i_am_alive_time: start_time,
            clock_beyond_bound: false,
        }
    }

    /// Checks what a caller may put in a row before a table writes it: the host,
    /// silo and role names, empty or labels within
    /// [`KeyLimits::label`](crate::KeyLimits::label) (256 bytes on every
    /// provider) without control characters. The row key, [`SiloAddress`], is
    /// bounded by its type.
    ///
    /// # Errors
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) naming `host_name`,
    /// `silo_name` or `role_name`.
    pub fn validate(&self) -> crate::Result<()> {
        for (what, v) in [
            ("host_name", &self.host_name),
            ("silo_name", &self.silo_name),
            ("role_name", &self.role_name),
        ] {
            if !v.is_empty() {
                crate::KeyLimits::CORE.check_label(what, v)?;
            }
        }
        Ok(())
    }

    /// The later of the IAmAlive and the start time: the last sign of life the table
    /// holds for this silo.
    pub fn last_alive(&self) -> Timestamp {
        self.i_am_alive_time.max(self.start_time)
    }

    /// Whether `cleanup_defunct(before)` deletes this row: Dead, with its last sign of
    /// life strictly older than `before`.
    pub fn is_defunct(&self, before: Timestamp) -> bool {
        self.status == SiloStatus::Dead && self.last_alive() < before
    }
}

/// A row that is stored in the membership table but does not decode (bad JSON, a
/// missing column, a key that names another silo). Providers report it instead of
/// failing the whole read, so one bad row never blinds the cluster; nothing is ever
/// written over it by a read.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct CorruptRow {
    /// The backend key (or row key) that holds the bad value.
    pub key: String,
    /// Why it does not decode.
    pub reason: String,
}

impl fmt::Display for CorruptRow {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.key, self.reason)
    }
}

/// One row of a membership table as read: the silo's entry and the etag a
/// conditional write of this row must name.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct MembershipRow {
    /// The row's columns.
    pub entry: MembershipEntry,
    /// The row's etag (opaque; see [`Etag`]).
    pub etag: Etag,
}

impl MembershipRow {
    /// A row of `entry` at `etag`.
    pub fn new(entry: MembershipEntry, etag: Etag) -> Self {
        MembershipRow { entry, etag }
    }

    /// The entry and the etag.
    pub fn into_parts(self) -> (MembershipEntry, Etag) {
        (self.entry, self.etag)
    }
}

/// How one row differs between two [`MembershipRows`] (see
/// [`MembershipRows::changes`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum RowChange<'a> {
    /// The row exists only in the newer rows.
    Added(&'a MembershipRow),
    /// The row exists only in the older rows.
    Removed(&'a MembershipRow),
    /// The row exists in both with different columns or etag.
    Updated {
        /// The row in the older rows.
        old: &'a MembershipRow,
        /// The row in the newer rows.
        new: &'a MembershipRow,
    },
}

impl RowChange<'_> {
    /// The silo whose row changed.
    pub fn silo(&self) -> SiloAddress {
        match self {
            RowChange::Added(r) | RowChange::Removed(r) | RowChange::Updated { new: r, .. } => r.entry.silo,
        }
    }
}

/// The rows of a membership table keyed by silo, in silo order.
///
/// A persistent ordered map (a B-tree whose nodes are shared between copies, from
/// the `imbl` crate, which is not part of this API): cloning it is O(1), and a view
/// that replaces k rows of an N-row view shares everything else with it (O(k log N)
/// time and memory; each row sits behind an `Arc`, so copying a tree node copies
/// pointers, not strings). Every delta read of every silo builds a new view this
/// way; with a plain `BTreeMap` each one deep-copied the whole table, which is what
/// a 1,000-silo join storm spent its CPU on. [`changes`](Self::changes) between two
/// views skips the subtrees they share.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MembershipRows(imbl::OrdMap<SiloAddress, Arc<MembershipRow>>);

impl MembershipRows {
    /// No rows.
    pub fn new() -> Self {
        Self::default()
    }

    /// The row of `silo`, if present.
    pub fn get(&self, silo: &SiloAddress) -> Option<&Arc<MembershipRow>> {
        self.0.get(silo)
    }

    /// The row of `silo` for in-place changes (copied first if another view shares
    /// it), if present.
    pub fn get_mut(&mut self, silo: &SiloAddress) -> Option<&mut MembershipRow> {
        self.0.get_mut(silo).map(Arc::make_mut)
    }

    /// True when `silo` has a row.
    pub fn contains(&self, silo: &SiloAddress) -> bool {
        self.0.contains_key(silo)
    }

    /// Adds or replaces the row of `row.entry.silo`; returns the row it replaced.
    pub fn insert(&mut self, row: Arc<MembershipRow>) -> Option<Arc<MembershipRow>> {
        self.0.insert(row.entry.silo, row)
    }

    /// Removes the row of `silo`; returns it.
    pub fn remove(&mut self, silo: &SiloAddress) -> Option<Arc<MembershipRow>> {
        self.0.remove(silo)
    }

    /// Keeps the rows for which `keep` is true.
    pub fn retain(&mut self, mut keep: impl FnMut(&MembershipRow) -> bool) {
        let gone: Vec<SiloAddress> = self
            .0
            .iter()
            .filter(|(_, row)| !keep(row))
            .map(|(s, _)| *s)
            .collect();
        for silo in gone {
            self.0.remove(&silo);
        }
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.0.len()
    }

    /// True when there is no row.
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Every row, in silo order.
    pub fn iter(&self) -> impl Iterator<Item = &Arc<MembershipRow>> {
        self.0.values()
    }

    /// Every silo with a row, in order.
    pub fn silos(&self) -> impl Iterator<Item = &SiloAddress> {
        self.0.keys()
    }

    /// True when both hold the very same tree (a clone never changed since): then
    /// they have no [`changes`](Self::changes). O(1).
    pub fn shares_all(&self, other: &MembershipRows) -> bool {
        self.0.ptr_eq(&other.0)
    }

    /// The rows that differ from `self` (older) to `newer`, in silo order. Subtrees
    /// both share are skipped, so a view derived from `self` by a delta costs its
    /// changed rows.
    pub fn changes<'a>(&'a self, newer: &'a MembershipRows) -> impl Iterator<Item = RowChange<'a>> + 'a {
        use imbl::ordmap::DiffItem;
        self.0.diff(&newer.0).map(|change| match change {
            DiffItem::Add(_, r) => RowChange::Added(r),
            DiffItem::Remove(_, r) => RowChange::Removed(r),
            DiffItem::Update { old, new } => RowChange::Updated {
                old: old.1,
                new: new.1,
            },
        })
    }
}

impl Extend<Arc<MembershipRow>> for MembershipRows {
    fn extend<I: IntoIterator<Item = Arc<MembershipRow>>>(&mut self, rows: I) {
        for row in rows {
            self.insert(row);
        }
    }
}

impl Extend<MembershipRow> for MembershipRows {
    fn extend<I: IntoIterator<Item = MembershipRow>>(&mut self, rows: I) {
        self.extend(rows.into_iter().map(Arc::new));
    }
}

impl FromIterator<Arc<MembershipRow>> for MembershipRows {
    fn from_iter<I: IntoIterator<Item = Arc<MembershipRow>>>(rows: I) -> Self {
        let mut all = MembershipRows::new();
        all.extend(rows);
        all
    }
}

impl FromIterator<MembershipRow> for MembershipRows {
    fn from_iter<I: IntoIterator<Item = MembershipRow>>(rows: I) -> Self {
        rows.into_iter().map(Arc::new).collect()
    }
}

impl IntoIterator for MembershipRows {
    type Item = Arc<MembershipRow>;
    type IntoIter = IntoRows;
    fn into_iter(self) -> IntoRows {
        IntoRows(self.0.into_iter())
    }
}

/// The rows of a [`MembershipRows`] taken by value, in silo order.
pub struct IntoRows(
    imbl::ordmap::ConsumingIter<SiloAddress, Arc<MembershipRow>, imbl::shared_ptr::DefaultSharedPtr>,
);

impl Iterator for IntoRows {
    type Item = Arc<MembershipRow>;
    fn next(&mut self) -> Option<Arc<MembershipRow>> {
        self.0.next().map(|(_, row)| row)
    }
}

impl std::fmt::Debug for IntoRows {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("IntoRows")
    }
}

/// A consistent view of a cluster's membership table: every row with its etag, and
/// the version row, all read at one instant (`read_all`), or one row plus the version
/// (`read_row`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MembershipSnapshot {
    /// The version row at the time of the read.
    pub version: TableVersion,
    /// Rows keyed by silo, each with its etag (see [`MembershipRows`]: cheap to
    /// clone, shared with the views it was derived from).
    pub entries: MembershipRows,
    /// Rows that were read but do not decode, ordered by key. They are left out of
    /// [`entries`](Self::entries); the protocol goes on with the rest.
    pub corrupt: Vec<CorruptRow>,
}

impl MembershipSnapshot {
    /// The row and etag of `silo`, if present.
    pub fn get(&self, silo: &SiloAddress) -> Option<(&MembershipEntry, &Etag)> {
        self.entries.get(silo).map(|row| (&row.entry, &row.etag))
    }

    /// The row of `silo` as one value, if present.
    pub fn row(&self, silo: &SiloAddress) -> Option<&MembershipRow> {
        self.entries.get(silo).map(|row| &**row)
    }

    /// Adds or replaces the row of `entry.silo` with its etag.
    pub fn insert(&mut self, entry: MembershipEntry, etag: Etag) {
        self.entries.insert(Arc::new(MembershipRow { entry, etag }));
    }

    /// The row of `silo` for in-place changes (copied first if another view shares
    /// it), if present. For tests and tools that build views by hand.
    pub fn entry_mut(&mut self, silo: &SiloAddress) -> Option<&mut MembershipEntry> {
        self.entries.get_mut(silo).map(|row| &mut row.entry)
    }

    /// The row of `silo`, if present.
    pub fn entry(&self, silo: &SiloAddress) -> Option<&MembershipEntry> {
        self.entries.get(silo).map(|row| &row.entry)
    }

    /// Number of rows.
    pub fn len(&self) -> usize {
        self.entries.len()
    }

    /// True when there is no row.
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// All rows, ordered by silo address.
    pub fn rows(&self) -> impl Iterator<Item = &MembershipEntry> {
        self.entries.iter().map(|row| &row.entry)
    }

    /// The rows whose status is Active, ordered by silo address.
    pub fn active(&self) -> impl Iterator<Item = &MembershipEntry> {
        self.rows().filter(|e| e.status == SiloStatus::Active)
    }

    /// The gateways: Active rows with a non-zero proxy port.
    pub fn gateways(&self) -> impl Iterator<Item = &MembershipEntry> {
        self.active().filter(|e| e.proxy_port != 0)
    }

    /// The status of `silo`, if it has a row.
    pub fn status_of(&self, silo: &SiloAddress) -> Option<SiloStatus> {
        self.entry(silo).map(|e| e.status)
    }
}

/// The answer of [`MembershipTable::read_delta`](crate::MembershipTable::read_delta):
/// the version row and the rows written after a given version, read atomically.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct MembershipDelta {
    /// The version row at the time of the read.
    pub version: TableVersion,
    /// The rows written (inserted or updated) at a version above the one asked for,
    /// with their etags; every row if [`complete`](Self::complete).
    pub changed: MembershipRows,
    /// Rows among those that do not decode (see [`MembershipSnapshot::corrupt`]).
    pub corrupt: Vec<CorruptRow>,
    /// True when this is a full read: `changed` holds every row of the table, so a
    /// row missing from it was removed. Providers answer a full read when they have
    /// no native delta, in basic mode, and when the table's version is below the one
    /// asked for (the table lost data).
    pub complete: bool,
}

impl MembershipDelta {
    /// A delta that is a full read of `snapshot`.
    pub fn full(snapshot: MembershipSnapshot) -> Self {
        MembershipDelta {
            version: snapshot.version,
            changed: snapshot.entries,
            corrupt: snapshot.corrupt,
            complete: true,
        }
    }

    /// The view after this delta: `base` with the changed rows replaced (or, for a
    /// complete delta, the delta's rows alone), at the delta's version. Rows of
    /// `base` that are not in a partial delta keep their columns, IAmAlive included
    /// (heartbeats do not bump the version; the periodic full read refreshes them).
    /// Costs O(k log N) for k changed rows of N: the result shares `base`'s
    /// unchanged rows (see [`MembershipRows`]).
    pub fn merged_onto(self, base: &MembershipSnapshot) -> MembershipSnapshot {
        if self.complete {
            return MembershipSnapshot {
                version: self.version,
                entries: self.changed,
                corrupt: self.corrupt,
            };
        }
        let mut entries = base.entries.clone();
        entries.extend(self.changed);
        let mut corrupt = base.corrupt.clone();
        for c in self.corrupt {
            if !corrupt.contains(&c) {
                corrupt.push(c);
            }
        }
        corrupt.sort();
        MembershipSnapshot {
            version: self.version,
            entries,
            corrupt,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn deltas_merge_onto_a_view() {
        let t = Timestamp::from_millis(1);
        let row = |n: u16, status| {
            let e = MembershipEntry::new(silo(&format!("10.0.0.1:{n}@1")), status, t);
            MembershipRow::new(e, Etag::new(format!("e{n}")))
        };
        let base = MembershipSnapshot {
            version: TableVersion {
                version: 5,
                etag: "v5".into(),
            },
            entries: [row(1, SiloStatus::Active), row(2, SiloStatus::Active)]
                .into_iter()
                .collect(),
            corrupt: Vec::new(),
        };
        let delta = MembershipDelta {
            version: TableVersion {
                version: 7,
                etag: "v7".into(),
            },
            changed: [row(2, SiloStatus::Dead), row(3, SiloStatus::Joining)]
                .into_iter()
                .collect(),
            corrupt: Vec::new(),
            complete: false,
        };
        let merged = delta.clone().merged_onto(&base);
        assert_eq!(merged.version.version, 7);
        assert_eq!(merged.len(), 3);
        assert_eq!(merged.status_of(&silo("10.0.0.1:2@1")), Some(SiloStatus::Dead));
        let full = MembershipDelta {
            complete: true,
            ..delta
        }
        .merged_onto(&base);
        assert_eq!(full.len(), 2, "a complete delta replaces the view");
        assert_eq!(
            MembershipDelta::full(base.clone()).merged_onto(&MembershipSnapshot::default()),
            base
        );
    }

    fn silo(s: &str) -> SiloAddress {
        s.parse().unwrap()
    }

    #[test]
    fn next_version_keeps_etag_and_adds_one() {
        let v = TableVersion {
            version: 41,
            etag: "e41".into(),
        };
        let n = v.next();
        assert_eq!(n.version, 42);
        assert_eq!(n.etag, v.etag);
    }

    #[test]
    fn version_precondition() {
        use crate::ProtocolMode::{Basic, Extended};
        let v = TableVersion {
            version: 4,
            etag: "e4".into(),
        };
        assert!(v.admits(&v.next(), Extended));
        assert!(!v.admits(
            &TableVersion {
                version: 5,
                etag: "other".into()
            },
            Extended
        ));
        assert!(!v.admits(
            &TableVersion {
                version: 6,
                etag: "e4".into()
            },
            Extended
        ));
        assert!(!v.admits(
            &TableVersion {
                version: 4,
                etag: "e4".into()
            },
            Extended
        ));
        assert!(v.admits(&TableVersion::default(), Basic));
    }

    #[test]
    fn snapshot_filters_active_and_gateways() {
        let t = Timestamp::from_millis(1);
        let mut snap = MembershipSnapshot::default();
        for (addr, status, proxy) in [
            ("127.0.0.1:1@1", SiloStatus::Active, 0),
            ("127.0.0.1:2@1", SiloStatus::Active, 3000),
            ("127.0.0.1:3@1", SiloStatus::Dead, 3001),
            ("127.0.0.1:4@1", SiloStatus::Joining, 3002),
        ] {
            let mut e = MembershipEntry::new(silo(addr), status, t);
            e.proxy_port = proxy;
            snap.insert(e, Etag::new("x"));
        }
        assert_eq!(snap.active().count(), 2);
        let gws: Vec<_> = snap.gateways().map(|e| e.silo.port()).collect();
        assert_eq!(gws, vec![2]);
        assert_eq!(snap.status_of(&silo("127.0.0.1:3@1")), Some(SiloStatus::Dead));
        assert_eq!(snap.status_of(&silo("127.0.0.1:9@1")), None);
    }

    #[test]
    fn entry_json_round_trip() {
        let mut e = MembershipEntry::new(
            silo("10.1.2.3:11111@99"),
            SiloStatus::Active,
            Timestamp::from_millis(1_795_000_000_001),
        );
        e.suspect_votes.push(SuspectVote {
            silo: silo("10.1.2.4:11111@98"),
            time: Timestamp::from_millis(1_795_000_000_500),
        });
        e.host_name = "h".into();
        let json = serde_json::to_string(&e).unwrap();
        assert_eq!(serde_json::from_str::<MembershipEntry>(&json).unwrap(), e);
    }
}
