//! The storage contracts: [`MembershipTable`], [`ReminderTable`] and the
//! [`SystemStore`] that opens them.
//!
//! Every provider (memory, Redis, etcd, DynamoDB) implements these traits and passes
//! the shared conformance suite (`rollcall-tests`), which checks each rule written
//! here against a real server.

use std::sync::Arc;

use async_trait::async_trait;

use crate::{
    lease::Fence, Etag, HistoryQuery, MembershipDelta, MembershipEntry, MembershipEvent, MembershipSnapshot,
    ReminderEntry, Result, SiloAddress, TableVersion, Timestamp, WriteKind, WriteOrigin,
};

/// Whether writes are ordered by the version row.
///
/// *Cluster Management in Orleans* describes a basic protocol (each write conditioned
/// on the row's etag alone) and an extended one (every write also bumps a shared
/// version row in the same transaction, which totally orders all views). The extended
/// protocol is the default; the basic one avoids the single contended version row in
/// very large clusters.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum ProtocolMode {
    /// Every write is conditioned on the row etag **and** the version-row etag and
    /// bumps the version by exactly 1.
    #[default]
    Extended,
    /// Writes are conditioned on the row etag alone; the version row is neither
    /// checked nor written, so `read_all` always reports the version the cluster had
    /// when basic mode was first used (0 for a new cluster).
    Basic,
}

/// The precondition of a membership row write ([`MembershipTable::write_row`]).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WriteMode<'a> {
    /// The row must not exist (Orleans' `InsertRow`: a silo joining).
    Insert,
    /// The row must exist with this etag (Orleans' `UpdateRow`: a status change or a
    /// vote).
    Update(&'a Etag),
}

impl WriteMode<'_> {
    /// The kind the membership history records for this write.
    pub fn kind(&self) -> WriteKind {
        match self {
            WriteMode::Insert => WriteKind::Insert,
            WriteMode::Update(_) => WriteKind::Update,
        }
    }

    /// The name of the write in logs and errors: `"insert_row"` or `"update_row"`.
    pub fn method(&self) -> &'static str {
        match self {
            WriteMode::Insert => "insert_row",
            WriteMode::Update(_) => "update_row",
        }
    }

    /// The etag the row must have, or `None` when it must not exist.
    pub fn expected_etag(&self) -> Option<&Etag> {
        match self {
            WriteMode::Insert => None,
            WriteMode::Update(etag) => Some(etag),
        }
    }
}

/// The membership table of **one cluster** (the Orleans `IMembershipTable`, with the
/// version row of the extended protocol).
///
/// # Contract
/// - [`read_all`](Self::read_all) returns every row of the cluster and the version row
///   as **one atomic snapshot**: no row written at version `v` is ever seen together
///   with a table version `< v`.
/// - [`insert_row`](Self::insert_row) ([`write_row`](Self::write_row) with
///   [`WriteMode::Insert`]) atomically creates the row and sets the version
///   row to `next_version`; `Ok(false)`, with no side effect, if the row exists or the
///   version row's etag is not `next_version.etag` (or its version is not
///   `next_version.version - 1`).
/// - [`update_row`](Self::update_row) atomically replaces the row and sets the version;
///   `Ok(false)`, with no side effect, if the row is missing, its etag is not `etag`, or
///   the version precondition fails.
/// - Every successful write advances the version by exactly 1; of concurrent writers
///   that read the same version, exactly one wins, whichever rows they write.
/// - [`update_i_am_alive`](Self::update_i_am_alive) is one blind write of the IAmAlive
///   column: it never changes the version and never invalidates etags read before it.
/// - `Ok(false)` means a concurrency conflict and nothing else; a backend failure is
///   `Err(Error::Backend)`.
/// - A stored row that does not decode never fails a read: `read_all` and `read_row`
///   return every decodable row and list the others in
///   [`MembershipSnapshot::corrupt`] (key and reason), so one bad row cannot blind
///   the cluster. A write whose precondition needs a corrupt row answers
///   `Err(Error::Corrupt)` and overwrites nothing. Only an undecodable version row
///   fails the read (`Err(Error::Corrupt)`): without it no view can be ordered.
/// - In [`ProtocolMode::Basic`] the version preconditions are not checked and the
///   version row is not written.
///
/// Tables of different clusters in one store never see each other's rows.
#[async_trait]
pub trait MembershipTable: Send + Sync + std::fmt::Debug {
    /// The cluster this table belongs to (the partition key).
    fn cluster_id(&self) -> &str;

    /// Prepares the backend (creates the version row, and the table itself where the
    /// backend needs one and `try_create` is true). Idempotent; call before anything
    /// else.
    ///
    /// # Errors
    /// [`Error::Backend`](crate::Error::Backend) if the backend is unreachable.
    async fn init(&self, try_create: bool) -> Result<()>;

    /// The row of `silo` (if any) and the version row, read atomically. The snapshot
    /// holds 0 or 1 entries.
    async fn read_row(&self, silo: &SiloAddress) -> Result<MembershipSnapshot>;

    /// Every row of the cluster and the version row, as one atomic snapshot. A new
    /// cluster reads as 0 rows, version 0 and a non-empty version etag. Rows that do
    /// not decode are listed in [`MembershipSnapshot::corrupt`], not returned as an
    /// error.
    ///
    /// # Errors
    /// [`Error::Backend`](crate::Error::Backend) if the backend fails;
    /// [`Error::Corrupt`](crate::Error::Corrupt) only for an undecodable version row.
    async fn read_all(&self) -> Result<MembershipSnapshot>;

    /// The version row and every row written after the table version `since` (the
    /// version row of the caller's view, as it read it), as one atomic read (delta
    /// reads: a silo that knows version `since` re-reads only what changed). The
    /// answer never misses a write that committed at or below the version it
    /// reports.
    ///
    /// Providers select rows by `since.version` (memory, Redis: each row records the
    /// version it was written at) or by `since.etag` where the version etag names
    /// the commit itself (etcd: the version key's `mod_revision`, so rows with a
    /// higher `mod_revision` are the ones written after it).
    ///
    /// Removed rows (defunct cleanup, `delete_cluster`) and IAmAlive heartbeats do
    /// not appear in a partial delta; silos still do a periodic full
    /// [`read_all`](Self::read_all) for those. When the provider has no native
    /// delta, in [`ProtocolMode::Basic`], or when the table's version is below
    /// `since.version`, the answer is a full read ([`MembershipDelta::complete`]).
    /// The default implementation is `read_all`.
    ///
    /// # Errors
    /// As [`read_all`](Self::read_all).
    async fn read_delta(&self, since: &TableVersion) -> Result<MembershipDelta> {
        let _ = since;
        Ok(MembershipDelta::full(self.read_all().await?))
    }

    /// Writes the row of `entry.silo` under the precondition `mode` and sets the
    /// version row to `next_version`, in one conditional transaction: the one write
    /// every provider implements ([`insert_row`](Self::insert_row) and
    /// [`update_row`](Self::update_row) are shorthands for it).
    ///
    /// - [`WriteMode::Insert`]: only if no row exists for `entry.silo` (Orleans'
    ///   `InsertRow`, a silo joining).
    /// - [`WriteMode::Update`]`(etag)`: only if the row exists and its etag is `etag`
    ///   (Orleans' `UpdateRow`). Every column is written, IAmAlive included: a
    ///   heartbeat that lands between the writer's read and this write may be replaced
    ///   by the value the writer read, until the next heartbeat.
    ///
    /// In extended mode the version row must also be at `next_version.version - 1`
    /// with etag `next_version.etag`, and the same transaction appends the write's
    /// [`MembershipEvent`] (made by [`MembershipEvent::of`] with `origin` and
    /// [`WriteMode::kind`]) to the membership history, dropping the events beyond
    /// the store's history capacity.
    ///
    /// `Ok(false)`, with no side effect at all (no row, no version, no event), when
    /// any precondition fails.
    ///
    /// # Errors
    /// [`Error::Backend`](crate::Error::Backend) if the backend fails;
    /// [`Error::Corrupt`](crate::Error::Corrupt) if the precondition needs a row that
    /// does not decode (nothing is overwritten).
    async fn write_row(
        &self,
        entry: &MembershipEntry,
        mode: WriteMode<'_>,
        next_version: &TableVersion,
        origin: &WriteOrigin,
    ) -> Result<bool>;

    /// [`write_row`](Self::write_row) with [`WriteMode::Insert`] by an anonymous
    /// writer ([`WriteOrigin::anonymous`]).
    async fn insert_row(&self, entry: &MembershipEntry, next_version: &TableVersion) -> Result<bool> {
        self.write_row(entry, WriteMode::Insert, next_version, &WriteOrigin::anonymous())
            .await
    }

    /// [`write_row`](Self::write_row) with [`WriteMode::Update`]`(etag)` by an
    /// anonymous writer ([`WriteOrigin::anonymous`]).
    async fn update_row(
        &self,
        entry: &MembershipEntry,
        etag: &Etag,
        next_version: &TableVersion,
    ) -> Result<bool> {
        self.write_row(
            entry,
            WriteMode::Update(etag),
            next_version,
            &WriteOrigin::anonymous(),
        )
        .await
    }

    /// The membership history's events that match `query`, in version order (see
    /// [`history`](crate::history)). Versions are consecutive except where the
    /// capacity dropped the oldest events or the query filters by silo.
    ///
    /// # Errors
    /// [`Error::Unsupported`](crate::Error::Unsupported) in basic mode or for a
    /// provider without history (the default implementation);
    /// [`Error::Backend`](crate::Error::Backend) if the backend fails;
    /// [`Error::Corrupt`](crate::Error::Corrupt) naming the key of an event that does
    /// not decode.
    async fn read_history(&self, query: &HistoryQuery) -> Result<Vec<MembershipEvent>> {
        let _ = query;
        Err(crate::Error::Unsupported(format!(
            "{:?} keeps no membership history",
            self
        )))
    }

    /// Writes `time` into the IAmAlive column of `silo`'s row: a blind write that
    /// neither checks nor changes etags or the version. A missing row is left missing
    /// (`Ok(())`).
    async fn update_i_am_alive(&self, silo: &SiloAddress, time: Timestamp) -> Result<()>;

    /// Deletes the Dead rows whose last sign of life (the later of IAmAlive and start
    /// time) is strictly older than `before`. Never touches other rows or the version.
    /// Returns how many rows were deleted.
    async fn cleanup_defunct(&self, before: Timestamp) -> Result<usize>;

    /// Deletes every row, the version row and the membership history of this
    /// table's cluster, and nothing else (other clusters, reminders and metrics of
    /// the store stay). A write racing the delete commits wholly before it (and is
    /// deleted) or wholly after it. [`init`](Self::init) makes the cluster usable
    /// again. To delete a cluster by id, see [`SystemStore::delete_cluster`].
    async fn delete_all(&self) -> Result<()>;
}

/// The reminder table of **one service** (the Orleans `IReminderTable`).
///
/// # Contract
/// - Key = (service id, actor id, name). Actor ids and names are arbitrary UTF-8.
/// - [`read_rows_in_range`](Self::read_rows_in_range)`(begin, end)` returns the rows
///   whose hash is in `(begin, end]`; when `begin >= end` the range wraps:
///   `hash > begin || hash <= end`, so `(0, 0)` is every row (see
///   [`hash_in_range`](crate::hash_in_range)).
/// - [`upsert_row`](Self::upsert_row) writes unconditionally and returns a new etag,
///   distinct from every etag that row had before.
/// - [`remove_row`](Self::remove_row) deletes only if the etag matches: `Ok(false)` on
///   a stale etag or a missing row.
/// - Tables of different services in one store never see each other's rows.
#[async_trait]
pub trait ReminderTable: Send + Sync + std::fmt::Debug {
    /// The service this table belongs to.
    fn service_id(&self) -> &str;

    /// Prepares the backend. Idempotent.
    async fn init(&self) -> Result<()>;

    /// Every reminder of `actor_id`.
    async fn read_rows_for(&self, actor_id: &str) -> Result<Vec<ReminderEntry>>;

    /// Every reminder whose hash lies in the ring range `(begin, end]` (wrapping when
    /// `begin >= end`).
    async fn read_rows_in_range(&self, begin: u32, end: u32) -> Result<Vec<ReminderEntry>>;

    /// One reminder, or `None` if it does not exist.
    async fn read_row(&self, actor_id: &str, name: &str) -> Result<Option<ReminderEntry>>;

    /// Inserts or replaces the reminder `(entry.actor_id, entry.name)` (its
    /// `service_id` must be this table's; `entry.etag` is ignored) and returns its new
    /// etag.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) for an entry of another
    /// service.
    async fn upsert_row(&self, entry: &ReminderEntry) -> Result<Etag>;

    /// Deletes the reminder if its etag is `etag`. `Ok(false)` if it is missing or the
    /// etag is stale.
    ///
    /// Under `fence` (the write of a shard's holder: a one-shot delivered), the
    /// store also compares the fence's shard lease in the same transaction:
    /// [`Error::Fenced`](crate::Error::Fenced), nothing deleted, once the lease
    /// is no longer held at the fence's epoch. `None`: the caller is not a
    /// holder (an application's `unregister`).
    async fn remove_row(
        &self,
        actor_id: &str,
        name: &str,
        etag: &Etag,
        fence: Option<&Fence>,
    ) -> Result<bool>;

    /// Records `fired_at` as the reminder's [`last_fired`](ReminderEntry::last_fired)
    /// time if the row exists with etag `etag`, **without changing the etag** (like
    /// the membership table's IAmAlive column): a handle holding the etag stays valid
    /// while the service persists ticks. `Ok(false)` if the row is missing or the etag
    /// is stale (the reminder was re-registered or removed meanwhile), and nothing is
    /// written. Under `fence`, refused as [`remove_row`](Self::remove_row) is.
    async fn update_last_fired(
        &self,
        actor_id: &str,
        name: &str,
        etag: &Etag,
        fired_at: Timestamp,
        fence: Option<&Fence>,
    ) -> Result<bool>;

    /// Sets the reminder's [`paused`](ReminderEntry::paused) column to `paused`
    /// (`Some(since)`: paused, `None`: ticking) if the row exists with etag
    /// `etag`, **without changing the etag**, as
    /// [`update_last_fired`](Self::update_last_fired) does: a pause is not a
    /// new registration. `Ok(false)` if the row is missing or the etag is
    /// stale, and nothing is written.
    async fn update_paused(
        &self,
        actor_id: &str,
        name: &str,
        etag: &Etag,
        paused: Option<Timestamp>,
    ) -> Result<bool>;

    /// Appends `run` to the run history of reminder `(actor_id, name)`, keeping
    /// the newest `keep` (1..=[`MAX_RUN_HISTORY`](crate::MAX_RUN_HISTORY))
    /// records. The history is apart from the row: it needs no row, survives
    /// the row's re-registration, and is removed only by
    /// [`remove_runs`](Self::remove_runs) or [`clear`](Self::clear). Concurrent
    /// appends to one history all land (none overwrites another). Stored
    /// where the row is (on Redis in the shard's slot).
    ///
    /// Under `fence`, refused as [`remove_row`](Self::remove_row) is.
    ///
    /// # Errors
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for a key past the
    /// limits or `keep` outside 1..=1,000; [`Error::Fenced`](crate::Error::Fenced);
    /// the backend's errors.
    async fn append_run(
        &self,
        actor_id: &str,
        name: &str,
        run: &crate::RunRecord,
        keep: usize,
        fence: Option<&Fence>,
    ) -> Result<()>;

    /// The run history of reminder `(actor_id, name)`, newest first (empty if
    /// none).
    async fn read_runs(&self, actor_id: &str, name: &str) -> Result<Vec<crate::RunRecord>>;

    /// Removes the run history of reminder `(actor_id, name)`. Idempotent.
    async fn remove_runs(&self, actor_id: &str, name: &str) -> Result<()>;

    /// Deletes every reminder of this service, and every run history (for
    /// tests and tooling).
    async fn clear(&self) -> Result<()>;

    /// One page of the rows whose actor id starts with `prefix` (an actor kind
    /// and its slash, `"cart/"`, or any id prefix; `""`: every row), in ring
    /// order, after `after` (`None`: the first page), at most `size` rows
    /// (1..=10,000). By default [`paging::read_page`](crate::paging::read_page)
    /// over [`read_rows_in_range`](Self::read_rows_in_range): a few reads of at
    /// most 50,000 rows in all, so a page may come back short with a token.
    ///
    /// # Errors
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for a size outside
    /// 1..=10,000; the errors of `read_rows_in_range`.
    async fn read_page(
        &self,
        prefix: &str,
        after: Option<&crate::PageToken>,
        size: usize,
    ) -> Result<crate::ReminderPage> {
        crate::paging::read_page(self, prefix, after, size).await
    }
}

/// What a provider's client saw of its connections to the store since it
/// connected ([`SystemStore::connection`]): counts of calls (not of events: a
/// connection's end fails every call in flight on it, each counted).
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
#[serde(default)]
pub struct StoreConnection {
    /// The endpoints, as the store URL named them.
    pub endpoints: String,
    /// Connections per endpoint the client keeps.
    pub channels: usize,
    /// Calls that provably never reached the store and were sent again (a
    /// connection refused, a request the transport never sent, a stream the
    /// store refused or went away above).
    pub resent: u64,
    /// Calls the store's `GOAWAY` failed or sent again.
    pub goaways: u64,
    /// Calls failed by the client closing its own connection (HTTP/2's
    /// `GOAWAY(ENHANCE_YOUR_CALM)`, e.g. `too_many_internal_resets`).
    pub own_goaways: u64,
    /// Calls failed because their connection ended under them (their outcome
    /// unknown); the connection is made again on its next call.
    pub connection_lost: u64,
    /// Calls answered with a timeout and left to run to their answer
    /// (dropped), so their stream is never reset.
    pub left_running: u64,
    /// Of the calls left running, those still running now.
    pub still_running: u64,
    /// Calls cancelled at their timeout (their stream reset): no room left to
    /// leave them running.
    pub cancelled: u64,
}

impl std::fmt::Display for StoreConnection {
    /// One line: `<endpoints>, <n> channels; resent <n>, GOAWAY <n>, own GOAWAY
    /// <n>, connection lost <n>; timed out: left running <n> (<n> still),
    /// cancelled <n>`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "{}, {} channels; resent {}, GOAWAY {}, own GOAWAY {}, connection lost {}; \
             timed out: left running {} ({} still), cancelled {}",
            self.endpoints,
            self.channels,
            self.resent,
            self.goaways,
            self.own_goaways,
            self.connection_lost,
            self.left_running,
            self.still_running,
            self.cancelled
        )
    }
}

/// A storage backend that opens membership tables per cluster and reminder tables
/// per service. `rollcall::connect(url)` returns one.
#[async_trait]
pub trait SystemStore: Send + Sync + std::fmt::Debug {
    /// A short name of the provider (`"memory"`, `"redis"`, ...).
    fn provider(&self) -> &'static str;

    /// What this provider's client saw of its connections to the store
    /// ([`StoreConnection`]); `None` (the default) for a provider that keeps
    /// no such figures. The etcd provider keeps them.
    fn connection(&self) -> Option<StoreConnection> {
        None
    }

    /// The longest actor ids, names and labels this provider stores, bytes
    /// ([`KeyLimits::CORE`](crate::KeyLimits::CORE) unless it says otherwise).
    /// Every table of the provider answers a longer one with
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) before it sends
    /// anything.
    fn key_limits(&self) -> crate::KeyLimits {
        crate::KeyLimits::CORE
    }

    /// The membership table of `cluster_id`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) for an empty or otherwise
    /// unusable cluster id; [`Error::Unsupported`](crate::Error::Unsupported) if the
    /// provider is not available.
    fn membership_table(&self, cluster_id: &str, mode: ProtocolMode) -> Result<Arc<dyn MembershipTable>>;

    /// The reminder table of `service_id`.
    ///
    /// # Errors
    /// As for [`membership_table`](Self::membership_table).
    fn reminder_table(&self, service_id: &str) -> Result<Arc<dyn ReminderTable>>;

    /// Deletes the membership table of `cluster_id` (every row, the version row and
    /// the history: [`MembershipTable::delete_all`]) and nothing else.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) for an invalid id;
    /// [`Error::Backend`](crate::Error::Backend) if the backend fails.
    async fn delete_cluster(&self, cluster_id: &str) -> Result<()> {
        self.membership_table(cluster_id, ProtocolMode::Extended)?
            .delete_all()
            .await
    }

    /// The grain-state table of `service_id` (see [`crate::state`]); wrap it in
    /// a [`StateStorage`](crate::StateStorage) to read and write states.
    ///
    /// # Errors
    /// As for [`membership_table`](Self::membership_table);
    /// [`Error::Unsupported`](crate::Error::Unsupported) from providers without
    /// one (the default).
    fn state_table(&self, service_id: &str) -> Result<Arc<dyn crate::StateTable>> {
        let _ = service_id;
        Err(crate::Error::Unsupported(format!(
            "the {} provider has no state table",
            self.provider()
        )))
    }

    /// The shard lease rows of reminder service `service_id` (see
    /// [`crate::lease`]).
    ///
    /// # Errors
    /// As for [`membership_table`](Self::membership_table);
    /// [`Error::Unsupported`](crate::Error::Unsupported) from providers without
    /// one (the default).
    fn lease_table(&self, service_id: &str) -> Result<Arc<dyn crate::LeaseTable>> {
        let _ = service_id;
        Err(crate::Error::Unsupported(format!(
            "the {} provider has no lease table",
            self.provider()
        )))
    }

    /// The statistics store of `cluster_id` (see
    /// [`StatisticsStore`](crate::StatisticsStore)), run with `options`.
    ///
    /// # Errors
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) for invalid options or
    /// id; [`Error::Unsupported`](crate::Error::Unsupported) from providers without
    /// one (the default).
    fn statistics_store(
        &self,
        cluster_id: &str,
        options: &crate::StatisticsOptions,
    ) -> Result<Arc<dyn crate::StatisticsStore>> {
        let _ = (cluster_id, options);
        Err(crate::Error::Unsupported(format!(
            "the {} provider has no statistics store yet",
            self.provider()
        )))
    }

    /// The silo and client metrics table of `cluster_id` (see
    /// [`MetricsTable`](crate::MetricsTable)).
    ///
    /// # Errors
    /// As for [`membership_table`](Self::membership_table);
    /// [`Error::Unsupported`](crate::Error::Unsupported) from providers without one
    /// (the default).
    fn metrics_table(&self, cluster_id: &str) -> Result<Arc<dyn crate::MetricsTable>> {
        let _ = cluster_id;
        Err(crate::Error::Unsupported(format!(
            "the {} provider has no metrics table",
            self.provider()
        )))
    }
}

/// Checks a cluster or service id: non-empty, at most 256 bytes, no control
/// characters.
///
/// # Errors
/// [`Error::InvalidConfig`](crate::Error::InvalidConfig) naming `field`.
pub fn validate_id(field: &str, id: &str) -> Result<()> {
    if id.is_empty() {
        return Err(crate::Error::invalid_config(field, "must not be empty"));
    }
    if id.len() > 256 {
        return Err(crate::Error::invalid_config(field, "longer than 256 bytes"));
    }
    if id.chars().any(char::is_control) {
        return Err(crate::Error::invalid_config(field, "contains control characters"));
    }
    Ok(())
}
