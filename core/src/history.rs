//! The membership history: one event per committed membership write.
//!
//! Every provider appends a [`MembershipEvent`] **in the same conditional
//! transaction** as the row write and the version-row bump (memory: under the same
//! lock; Redis: inside the same `MULTI`/`EXEC`; etcd: the same `Txn`; DynamoDB: the
//! same `TransactWriteItems`). A write that loses its precondition leaves no event, and
//! no event exists without its write, so the history and the table can never disagree.
//! (Keeping a history next to a store with a second, separate write is the dual-write
//! problem that the Durable Task Framework's jump-start table exists to repair; one
//! transaction avoids it.)
//!
//! History needs the extended protocol ([`ProtocolMode::Extended`](crate::ProtocolMode)):
//! events are keyed by the table version the write produced, which is gapless there.
//! In basic mode writes append nothing and
//! [`read_history`](crate::MembershipTable::read_history) answers
//! [`Error::Unsupported`](crate::Error::Unsupported).
//!
//! The history is bounded by length: a write at version `v` also drops the events at
//! versions `<= v - capacity` ([`DEFAULT_HISTORY_CAPACITY`] unless the store is
//! configured otherwise; 0 keeps no history).

use serde::{Deserialize, Serialize};

use crate::{MembershipEntry, SiloAddress, SiloStatus, SuspectVote, TableVersion, Timestamp};

/// How many events a cluster's history keeps by default (the newest ones). At about
/// 200 bytes an event, 10,000 events are about 2 MB per cluster.
pub const DEFAULT_HISTORY_CAPACITY: u64 = 10_000;

/// The largest history capacity a store URL may ask for.
pub const MAX_HISTORY_CAPACITY: u64 = 10_000_000;

/// Parses a `history=N` store-URL parameter: events kept per cluster, `0..=`
/// [`MAX_HISTORY_CAPACITY`] (0 = no history).
///
/// # Errors
/// A message for the store URL error when `value` is not such a number.
pub fn parse_history_capacity(value: &str) -> std::result::Result<u64, String> {
    value
        .parse::<u64>()
        .ok()
        .filter(|n| *n <= MAX_HISTORY_CAPACITY)
        .ok_or_else(|| format!("history must be an event count 0..={MAX_HISTORY_CAPACITY}"))
}

/// Who made a membership write and when; recorded in the history event the write
/// appends. Silos pass their own address and their clock's `now`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct WriteOrigin {
    /// The silo that wrote, when known (tools and tests write anonymously).
    pub writer: Option<SiloAddress>,
    /// The writer's clock when it wrote (ms since the Unix epoch).
    pub time: Timestamp,
}

impl WriteOrigin {
    /// A write by `writer` at `time`.
    pub fn silo(writer: SiloAddress, time: Timestamp) -> Self {
        WriteOrigin {
            writer: Some(writer),
            time,
        }
    }

    /// A write by an unnamed client, timed by the system clock now.
    pub fn anonymous() -> Self {
        WriteOrigin {
            writer: None,
            time: Timestamp::now(),
        }
    }
}

/// What a write did to its row.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WriteKind {
    /// `insert_row`: the row was created (a silo joining).
    Insert,
    /// `update_row`: the row was replaced (a status change or a vote).
    Update,
}

/// One committed membership write, as the history stores it (JSON in every provider).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct MembershipEvent {
    /// The table version the write produced (1 for the first write of a cluster).
    pub version: u64,
    /// When the writer wrote it (its clock, ms since the Unix epoch).
    pub time: Timestamp,
    /// The silo whose row was written.
    pub silo: SiloAddress,
    /// Insert or update.
    pub kind: WriteKind,
    /// The row's status after the write.
    pub status: SiloStatus,
    /// The row's suspicions after the write, oldest first (voter and vote time).
    #[serde(default)]
    pub votes: Vec<SuspectVote>,
    /// Who wrote, when known: the silo itself for joins and shutdowns, the voter for
    /// a vote or a declaration.
    #[serde(default)]
    pub writer: Option<SiloAddress>,
    /// The row's [`MembershipEntry::clock_beyond_bound`] after the write (absent
    /// when false, and in events written by older silos).
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub clock_beyond_bound: bool,
}

impl MembershipEvent {
    /// The event of writing `entry` at `next_version` by `origin`.
    pub fn of(
        entry: &MembershipEntry,
        kind: WriteKind,
        next_version: &TableVersion,
        origin: &WriteOrigin,
    ) -> Self {
        MembershipEvent {
            version: next_version.version,
            time: origin.time,
            silo: entry.silo,
            kind,
            status: entry.status,
            votes: entry.suspect_votes.clone(),
            writer: origin.writer,
            clock_beyond_bound: entry.clock_beyond_bound,
        }
    }
}

/// Which events [`read_history`](crate::MembershipTable::read_history) returns: those
/// with `version >= from_version`, about `silo` if set, oldest first, at most `limit`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HistoryQuery {
    /// First table version to return (inclusive).
    pub from_version: u64,
    /// Only events whose subject is this silo.
    pub silo: Option<SiloAddress>,
    /// At most this many events (the oldest matching ones); page on with
    /// `from_version = last.version + 1`.
    pub limit: usize,
}

impl Default for HistoryQuery {
    /// Every event kept (`from_version` 0, any silo, no limit).
    fn default() -> Self {
        HistoryQuery {
            from_version: 0,
            silo: None,
            limit: usize::MAX,
        }
    }
}

impl HistoryQuery {
    /// Whether `event` passes the silo filter and the version floor.
    pub fn matches(&self, event: &MembershipEvent) -> bool {
        event.version >= self.from_version && self.silo.is_none_or(|s| s == event.silo)
    }

    /// Filters and truncates events read in version order.
    pub fn select(&self, events: impl IntoIterator<Item = MembershipEvent>) -> Vec<MembershipEvent> {
        events
            .into_iter()
            .filter(|e| self.matches(e))
            .take(self.limit)
            .collect()
    }
}

/// The lowest version a history of `capacity` events keeps once a write at `version`
/// committed: events below it are dropped in the same transaction.
pub fn history_floor(version: u64, capacity: u64) -> u64 {
    version.saturating_add(1).saturating_sub(capacity)
}

/// The message of [`Error::Unsupported`](crate::Error::Unsupported) for a history read
/// in basic mode.
pub const BASIC_MODE_HAS_NO_HISTORY: &str =
    "the membership history needs the extended protocol (basic-mode writes are not versioned)";

/// `Ok` in extended mode; in basic mode the `Unsupported` error every provider's
/// `read_history` answers.
///
/// # Errors
/// [`Error::Unsupported`](crate::Error::Unsupported) with
/// [`BASIC_MODE_HAS_NO_HISTORY`] in basic mode.
pub fn require_history(mode: crate::ProtocolMode) -> crate::Result<()> {
    match mode {
        crate::ProtocolMode::Extended => Ok(()),
        crate::ProtocolMode::Basic => Err(crate::Error::Unsupported(BASIC_MODE_HAS_NO_HISTORY.into())),
    }
}
