//! Actor state that survives its silo: Orleans' grain state for actix actors.
//!
//! [`PersistentState<T>`] holds one named state of one actor: `load` it (in
//! `started`), look at it with [`read`](PersistentState::read), change and store
//! it in one step with [`update`](PersistentState::update), or change it with
//! [`modify`](PersistentState::modify) and store it with
//! [`write`](PersistentState::write); [`clear`](PersistentState::clear) it.
//! Under it is the store's grain-state table
//! ([`SystemStore::state_table`](crate::SystemStore::state_table)) through a
//! [`StateStorage`]: an etag per write, chunks for large states, an envelope that
//! turns a damaged record into [`Error::Corrupt`].
//!
//! As in Orleans, the calls of one state run one at a time, and writes asked for
//! while one runs merge into the next one. A write that finds another etag than
//! the one it read fails with [`Error::InconsistentState`] and writes nothing;
//! the value is then the stored one again (as Dapr resets its cache), so a
//! handler re-applies its change and writes again. [`update`] does exactly that,
//! a bounded number of times (Kubernetes' `RetryOnConflict`, etcd's STM):
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> rollcall::Result<()> {
//! use rollcall::state::{PersistentState, StateKey, StateStorage};
//! use rollcall::SystemStore;
//!
//! let store = rollcall::connect("memory://state-doc").await?;
//! let storage = StateStorage::new(store.state_table("shop")?);
//! let key = StateKey::new("cart/42", "items")?;
//! let cart: PersistentState<Vec<String>> = PersistentState::new(storage.clone(), key.clone());
//! cart.load().await?;
//! cart.update(|items| items.push("apple".into())).await?;
//!
//! // Another activation writes meanwhile ...
//! let other: PersistentState<Vec<String>> = PersistentState::new(storage, key);
//! other.load().await?;
//! other.update(|items| items.push("pear".into())).await?;
//!
//! // ... so this update conflicts once, reads again, applies again and wins.
//! cart.update(|items| items.push("plum".into())).await?;
//! assert_eq!(cart.read(|items| items.clone()), ["apple", "pear", "plum"]);
//! # Ok(()) }
//! ```
//!
//! The accessors take closures ([`read`](PersistentState::read),
//! [`modify`](PersistentState::modify)): no guard outlives them, so none can be
//! held across an `.await` or another call of the same state (a `std` guard held
//! that way deadlocked the actor's arbiter thread). Calling the same state
//! inside its own closure panics with a message instead of deadlocking, as a
//! `RefCell` does.
//!
//! A write whose commit failed in a way that may have been applied (a timeout, a
//! lost connection) is resolved before the next call of the state: the header
//! says whether it publishes the write's generation, and the etag follows. A
//! write that landed is never reported as a conflict with itself, and so never
//! re-applied. [`overwrite`](PersistentState::overwrite) and
//! [`delete`](PersistentState::delete) write or delete whatever is stored, the
//! way out of a record that reads [`Error::Corrupt`].
//!
//! The serde_json codec is the default (a type that gains a
//! `#[serde(default)]` field reads its old records); with the `postcard` feature,
//! [`Codec::Postcard`] is compact but not self-describing. The codec is stored
//! with each record, so a reader always knows.
//!
//! [`update`]: PersistentState::update

use std::cell::RefCell;
use std::ops::Range;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

pub use rollcall_core::state::*;
use rollcall_core::{bounded, Error, Etag, Result, Timestamp};

/// How long one call of a [`PersistentState`] may take by default: 30 s.
pub const DEFAULT_STATE_TIMEOUT: Duration = Duration::from_secs(30);

/// How many times [`PersistentState::update`] writes before it gives up on a
/// contended state: 5.
pub const UPDATE_ATTEMPTS: usize = 5;

/// A write or clear whose outcome nobody knows yet.
#[derive(Clone, Debug)]
struct Pending {
    generation: String,
    /// `changed` as of the write.
    seq: u64,
    clear: bool,
}

struct Value<T> {
    state: T,
    etag: Option<Etag>,
    exists: bool,
    /// Bumped by every `modify`.
    changed: u64,
    /// `changed` as of the last write that succeeded.
    written: u64,
    /// Changes a load discarded (made to the old value while it ran).
    discarded: Range<u64>,
    /// Writes started, and the number of the last one that succeeded.
    started: u64,
    succeeded: u64,
    /// A write or clear that failed in a way that may have landed.
    pending: Option<Pending>,
}

struct Shared<T> {
    value: Mutex<Value<T>>,
    /// One call at a time.
    io: tokio::sync::Mutex<()>,
}

/// One named state of one actor, as a typed value with its etag. Cheap to clone
/// (the clones share the value, as the handlers of one actor do).
///
/// Memory: the value itself plus a fixed part (the key, the etag, the
/// bookkeeping of merged and unresolved writes) shared by every clone.
pub struct PersistentState<T> {
    storage: StateStorage,
    key: StateKey,
    codec: Codec,
    timeout: Duration,
    expires_in: Option<Duration>,
    version: u32,
    migrate: Option<Migrate<T>>,
    shared: Arc<Shared<T>>,
}

/// A migration hook ([`PersistentState::with_version`]).
type Migrate<T> = Arc<dyn Fn(u32, Codec, &[u8]) -> Result<T> + Send + Sync>;

impl<T> Clone for PersistentState<T> {
    fn clone(&self) -> Self {
        PersistentState {
            storage: self.storage.clone(),
            key: self.key.clone(),
            codec: self.codec,
            timeout: self.timeout,
            expires_in: self.expires_in,
            version: self.version,
            migrate: self.migrate.clone(),
            shared: self.shared.clone(),
        }
    }
}

impl<T> std::fmt::Debug for PersistentState<T> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PersistentState")
            .field("key", &self.key)
            .field("codec", &self.codec)
            .finish_non_exhaustive()
    }
}

thread_local! {
    /// The values whose lock this thread holds (inside a `read`/`modify`
    /// closure): taking one again would deadlock.
    static HELD: RefCell<Vec<usize>> = const { RefCell::new(Vec::new()) };
}

/// The value's lock, held by this thread until dropped.
struct Held<'a, T> {
    guard: MutexGuard<'a, Value<T>>,
    addr: usize,
}

impl<T> Drop for Held<'_, T> {
    fn drop(&mut self) {
        HELD.with(|h| {
            let mut h = h.borrow_mut();
            if let Some(i) = h.iter().rposition(|a| *a == self.addr) {
                h.remove(i);
            }
        });
    }
}

impl<T> std::ops::Deref for Held<'_, T> {
    type Target = Value<T>;
    fn deref(&self) -> &Value<T> {
        &self.guard
    }
}

impl<T> std::ops::DerefMut for Held<'_, T> {
    fn deref_mut(&mut self) -> &mut Value<T> {
        &mut self.guard
    }
}

impl<T: Serialize + DeserializeOwned + Default + Send + 'static> PersistentState<T> {
    /// The state `key` in `storage`, not loaded yet (`T::default()`), JSON codec,
    /// calls bounded by [`DEFAULT_STATE_TIMEOUT`].
    pub fn new(storage: StateStorage, key: StateKey) -> Self {
        PersistentState {
            storage,
            key,
            codec: Codec::Json,
            timeout: DEFAULT_STATE_TIMEOUT,
            expires_in: None,
            version: 0,
            migrate: None,
            shared: Arc::new(Shared {
                value: Mutex::new(Value {
                    state: T::default(),
                    etag: None,
                    exists: false,
                    changed: 0,
                    written: 0,
                    discarded: 0..0,
                    started: 0,
                    succeeded: 0,
                    pending: None,
                }),
                io: tokio::sync::Mutex::new(()),
            }),
        }
    }

    /// Writes with `codec` ([`Codec::Postcard`] needs the `postcard` feature).
    pub fn with_codec(mut self, codec: Codec) -> Self {
        self.codec = codec;
        self
    }

    /// Bounds every call (its wait for the call before it included) by `timeout`.
    pub fn with_timeout(mut self, timeout: Duration) -> Self {
        self.timeout = timeout;
        self
    }

    /// Each write makes the state expire `ttl` after it (the store removes it).
    /// Every [`write`](Self::write) stores, changed or not, so a write refreshes
    /// the expiry.
    pub fn with_expiry(mut self, ttl: Duration) -> Self {
        self.expires_in = Some(ttl);
        self
    }

    /// Says which version of `T` this build has (stored with every write),
    /// and how to upgrade a record an older version wrote: `migrate(version,
    /// codec, bytes)` runs on load for a record of a lower version (0: written
    /// before versions were used) and returns the value; the next write stores
    /// it as `version`. A record of a **higher** version (a newer build wrote
    /// it) does not load: [`load`](Self::load) is [`Error::Unsupported`] and the
    /// value stays as it was, so an older build cannot overwrite it without
    /// saying so ([`overwrite`](Self::overwrite)).
    pub fn with_version(
        mut self,
        version: u32,
        migrate: impl Fn(u32, Codec, &[u8]) -> Result<T> + Send + Sync + 'static,
    ) -> Self {
        self.version = version;
        self.migrate = Some(Arc::new(migrate));
        self
    }

    /// The key.
    pub fn key(&self) -> &StateKey {
        &self.key
    }

    fn lock(&self) -> Held<'_, T> {
        let addr = Arc::as_ptr(&self.shared) as usize;
        HELD.with(|h| {
            if h.borrow().contains(&addr) {
                panic!(
                    "PersistentState {} used inside its own read/modify/update closure (it would deadlock)",
                    self.key
                );
            }
            h.borrow_mut().push(addr);
        });
        Held {
            guard: self.shared.value.lock().unwrap_or_else(|p| p.into_inner()),
            addr,
        }
    }

    /// `f` of the value (as loaded and changed since).
    ///
    /// # Panics
    /// If `f` calls this same state (it would deadlock).
    pub fn read<R>(&self, f: impl FnOnce(&T) -> R) -> R {
        f(&self.lock().state)
    }

    /// A clone of the value.
    pub fn get(&self) -> T
    where
        T: Clone,
    {
        self.read(T::clone)
    }

    /// Changes the value with `f`; the next [`write`](Self::write) stores it.
    ///
    /// # Panics
    /// If `f` calls this same state (it would deadlock).
    pub fn modify<R>(&self, f: impl FnOnce(&mut T) -> R) -> R {
        let mut v = self.lock();
        v.changed += 1;
        f(&mut v.state)
    }

    /// The etag of the record as last read or written (`None`: no record).
    pub fn etag(&self) -> Option<Etag> {
        self.lock().etag.clone()
    }

    /// Whether a record was found or written (Orleans' `RecordExists`).
    pub fn record_exists(&self) -> bool {
        self.lock().exists
    }

    fn timed_out(&self, what: &'static str) -> impl FnOnce(Duration) -> Error + '_ {
        move |t| Error::backend(format!("{what} of state {} took longer than {t:?}", self.key))
    }

    /// Learns the outcome of a write or clear that failed in a way that may
    /// have landed (the header names its generation or not).
    async fn resolve(&self) -> Result<()> {
        let Some(p) = self.lock().pending.clone() else {
            return Ok(());
        };
        let landed = self.storage.outcome(&self.key, &p.generation).await?;
        let mut v = self.lock();
        v.pending = None;
        if let Some(etag) = landed {
            v.etag = Some(etag);
            v.exists = !p.clear;
            if p.clear {
                v.state = T::default();
                v.written = v.changed;
            } else {
                v.written = v.written.max(p.seq);
            }
        }
        Ok(())
    }

    /// Reads the record, replacing the value (`T::default()` when there is
    /// none). Changes made while it runs are discarded with the old value: a
    /// [`write`](Self::write) asked for after them answers
    /// [`Error::InconsistentState`] instead of storing nothing and answering Ok.
    ///
    /// # Errors
    /// [`Error::Corrupt`] for a record that does not check out or decode (the
    /// value is left as it was); [`Error::Unsupported`] for a codec this build
    /// cannot read, or a record a newer version of the type wrote
    /// ([`with_version`](Self::with_version)); [`Error::Backend`] on a backend
    /// failure or after the timeout.
    pub async fn load(&self) -> Result<()> {
        bounded(
            self.timeout,
            async {
                let _one = self.shared.io.lock().await;
                self.resolve().await?;
                self.reload().await
            },
            self.timed_out("load"),
        )
        .await
    }

    /// [`load`](Self::load), holding the io lock.
    async fn reload(&self) -> Result<()> {
        let from = self.lock().changed;
        let decoded = match self.storage.read(&self.key).await {
            Ok(read) if read.record_exists && read.version > self.version => {
                Err(Error::Unsupported(format!(
                    "state {} was written by version {} of its type and this build has version {}: \
                 load it with a newer build, or replace it explicitly (overwrite)",
                    self.key, read.version, self.version
                )))
            }
            Ok(read) if read.record_exists && read.version < self.version => match &self.migrate {
                Some(migrate) => migrate(read.version, read.codec, &read.data).map(|s| (s, read)),
                None => decode::<T>(&self.key, read.codec, &read.data).map(|s| (s, read)),
            },
            Ok(read) if read.record_exists => {
                decode::<T>(&self.key, read.codec, &read.data).map(|s| (s, read))
            }
            Ok(read) => Ok((T::default(), read)),
            Err(e) => Err(e),
        };
        if let Err(Error::Corrupt { .. }) = &decoded {
            rollcall_core::telemetry::state_corrupt(self.storage.table().service_id());
        }
        let (state, read) = decoded?;
        let mut v = self.lock();
        v.state = state;
        v.etag = read.etag;
        v.exists = read.record_exists;
        if v.changed > from {
            v.discarded = from + 1..v.changed + 1;
        }
        v.written = v.changed;
        Ok(())
    }

    /// Stores the value under the etag last read or written; returns the new
    /// etag. A write asked for while another runs is merged into the next one
    /// (both answer with its result); one whose changes an earlier write already
    /// stored answers at once (without an expiry: with one, every write stores,
    /// to refresh it).
    ///
    /// After a conflict the value is the stored one again (read back; your
    /// change is gone): apply it again and write, or use
    /// [`update`](Self::update), which does.
    ///
    /// # Errors
    /// [`Error::InconsistentState`] when the record changed since it was read,
    /// or a load discarded the changes this write was asked for (nothing
    /// written); [`Error::TooLarge`]; [`Error::Backend`] on a backend failure or
    /// after the timeout; [`Error::OutcomeUnknown`] when the commit failed and
    /// whether it landed could not be read (the next call learns it).
    pub async fn write(&self) -> Result<Etag> {
        self.store(Expected::from_etag, "write").await
    }

    /// Stores the value whatever the record holds (last writer wins,
    /// explicitly): the way past a record that reads [`Error::Corrupt`], or a
    /// repair. Returns the new etag.
    ///
    /// # Errors
    /// As [`write`](Self::write), without the conflict.
    pub async fn overwrite(&self) -> Result<Etag> {
        self.store(|_| Expected::Any, "overwrite").await
    }

    async fn store(&self, expected: fn(Option<&Etag>) -> Expected, what: &'static str) -> Result<Etag> {
        let (wanted, ticket) = {
            let v = self.lock();
            (v.changed, v.started)
        };
        bounded(
            self.timeout,
            async {
                let _one = self.shared.io.lock().await;
                self.resolve().await?;
                let generation = self.storage.new_generation();
                let (bytes, seq, etag) = {
                    let mut v = self.lock();
                    if v.written >= wanted && v.discarded.contains(&wanted) {
                        return Err(Error::InconsistentState {
                            key: self.key.to_string(),
                            expected: None,
                            current: v.etag.clone(),
                        });
                    }
                    let merged = v.written >= wanted
                        && v.exists
                        && (self.expires_in.is_none() || v.succeeded > ticket);
                    if let (true, Some(e)) = (merged, &v.etag) {
                        return Ok(e.clone()); // merged into a write that ran meanwhile
                    }
                    let bytes = encode(&self.key, self.codec, &v.state)?;
                    v.started += 1;
                    let seq = v.changed;
                    v.pending = Some(Pending {
                        generation: generation.clone(),
                        seq,
                        clear: false,
                    });
                    (bytes, seq, v.etag.clone())
                };
                let expires_at = self
                    .expires_in
                    .map(|d| Timestamp::from_millis(Timestamp::now().as_millis() + d.as_millis() as u64));
                let options = WriteOptions {
                    expires_at,
                    version: self.version,
                    generation: Some(&generation),
                };
                let r = self
                    .storage
                    .write_with(&self.key, expected(etag.as_ref()), self.codec, &bytes, options)
                    .await;
                self.settle(r, seq, bytes.len()).await
            },
            self.timed_out(what),
        )
        .await
    }

    /// The bookkeeping after a write's answer (the io lock held).
    async fn settle(&self, r: Result<Etag>, seq: u64, len: usize) -> Result<Etag> {
        record_write(&self.storage, &r, len);
        match r {
            Ok(new) => {
                let mut v = self.lock();
                v.pending = None;
                v.etag = Some(new.clone());
                v.exists = true;
                v.written = v.written.max(seq);
                v.succeeded = v.started;
                Ok(new)
            }
            Err(e @ Error::OutcomeUnknown { .. }) => Err(e), // stays pending
            Err(e) => Err(self.refused(e).await),
        }
    }

    /// A write or clear that certainly wrote nothing answered `e` (the io lock
    /// held): nothing is pending, and after a conflict the value becomes the
    /// stored one, not a change the store refused (if that read fails, the
    /// conflict is still the answer).
    async fn refused(&self, e: Error) -> Error {
        self.lock().pending = None;
        if matches!(e, Error::InconsistentState { .. }) {
            if let Err(read) = self.reload().await {
                tracing::debug!(key = %self.key, error = %read, "reading a state back after a conflict failed");
            }
        }
        e
    }

    /// Applies `f` to the value and writes it; on a conflict, the value is read
    /// again and `f` applied again, up to [`UPDATE_ATTEMPTS`] writes in all.
    /// Returns what the last `f` returned. `f` must be safe to run more than
    /// once (it sees a fresh value each time). Takes at most
    /// [`UPDATE_ATTEMPTS`] times the timeout.
    ///
    /// # Errors
    /// [`Error::InconsistentState`] when every attempt conflicted (the value is
    /// the stored one); otherwise as [`write`](Self::write).
    ///
    /// # Panics
    /// If `f` calls this same state (it would deadlock).
    pub async fn update<R>(&self, mut f: impl FnMut(&mut T) -> R) -> Result<R> {
        let mut last = None;
        for _ in 0..UPDATE_ATTEMPTS {
            let r = self.modify(&mut f);
            match self.write().await {
                Ok(_) => return Ok(r),
                Err(e @ Error::InconsistentState { .. }) => last = Some(e),
                Err(e) => return Err(e),
            }
        }
        Err(last.unwrap_or_else(|| Error::backend("update made no attempt")))
    }

    /// Clears the record under the etag last read or written: a tombstone (its
    /// etag becomes this state's etag), the value back to `T::default()`.
    ///
    /// # Errors
    /// As [`write`](Self::write).
    pub async fn clear(&self) -> Result<()> {
        self.remove(false, "clear").await
    }

    /// Deletes whatever record is stored, its header included (no etag is
    /// compared): the way out of a record that reads [`Error::Corrupt`]. The
    /// value goes back to `T::default()`; the next write is a first write.
    ///
    /// # Errors
    /// [`Error::Backend`] on a backend failure or after the timeout.
    pub async fn delete(&self) -> Result<()> {
        self.remove(true, "delete").await
    }

    async fn remove(&self, delete: bool, what: &'static str) -> Result<()> {
        bounded(
            self.timeout,
            async {
                let _one = self.shared.io.lock().await;
                self.resolve().await?;
                let generation = self.storage.new_generation();
                let (expected, mode) = if delete {
                    (Expected::Any, ClearMode::Delete)
                } else {
                    let v = self.lock();
                    (Expected::from_etag(v.etag.as_ref()), ClearMode::Tombstone)
                };
                if mode == ClearMode::Tombstone {
                    let seq = self.lock().changed;
                    self.lock().pending = Some(Pending {
                        generation: generation.clone(),
                        seq,
                        clear: true,
                    });
                }
                let r = self
                    .storage
                    .clear_as(&self.key, expected, mode, &generation)
                    .await;
                record_write(&self.storage, &r, 0);
                match r {
                    Ok(new) => {
                        let mut v = self.lock();
                        v.pending = None;
                        v.state = T::default();
                        v.etag = new;
                        v.exists = false;
                        v.written = v.changed;
                        Ok(())
                    }
                    Err(e @ Error::OutcomeUnknown { .. }) => Err(e),
                    Err(e) => Err(self.refused(e).await),
                }
            },
            self.timed_out(what),
        )
        .await
    }
}

/// Counts a write's or clear's outcome in the state metrics.
fn record_write<V>(storage: &StateStorage, r: &Result<V>, len: usize) {
    let outcome = match r {
        Ok(_) => "ok",
        Err(Error::InconsistentState { .. }) => "conflict",
        Err(_) => "error",
    };
    rollcall_core::telemetry::state_write(storage.table().service_id(), outcome, len);
}

/// Options of a [`StateSweeper`].
#[derive(Clone, Debug)]
pub struct SweepOptions {
    /// The actor kinds whose states are swept (a table is listed by kind).
    pub kinds: Vec<String>,
    /// How long after one pass the next starts. Default 5 minutes.
    pub period: Duration,
    /// How long the sweeper must have seen a generation unpublished before it
    /// deletes it ([`SWEEP_GRACE`], 10 minutes, by default): longer than any
    /// write takes.
    pub grace: Duration,
    /// How long a tombstone is kept
    /// ([`TOMBSTONE_RETENTION`](rollcall_core::state::sweep::TOMBSTONE_RETENTION),
    /// 1 hour, by default).
    pub tombstone_retention: Duration,
    /// Keys listed per table call. Default 200.
    pub page: usize,
}

impl SweepOptions {
    /// The defaults, sweeping the states of `kinds`.
    pub fn new(kinds: impl IntoIterator<Item = impl Into<String>>) -> Self {
        SweepOptions {
            kinds: kinds.into_iter().map(Into::into).collect(),
            period: Duration::from_secs(300),
            grace: SWEEP_GRACE,
            tombstone_retention: rollcall_core::state::sweep::TOMBSTONE_RETENTION,
            page: 200,
        }
    }
}

/// What one sweep pass did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SweepReport {
    /// States looked at (listed and owned).
    pub states: usize,
    /// Generations of chunk rows deleted that no header published.
    pub orphans: usize,
    /// Expired states deleted (and index entries of states that are gone).
    pub expired: usize,
    /// Tombstones deleted after their retention.
    pub tombstones: usize,
    /// Table calls that failed (logged; the pass goes on with the next state).
    pub errors: usize,
}

/// Which states a sweeper owns: an actor hash in, yes or no.
type Owns = Box<dyn Fn(u32) -> bool + Send + Sync>;

/// The periodic sweep of a grain-state table: generations no header publishes,
/// expired states and old tombstones, of the states this silo owns (those whose
/// [`actor_hash`](rollcall_core::actor_hash) falls in its ring ranges,
/// the reminders' ring), so that the silos of a cluster share the work. The
/// rules are [`SweepMachine`](rollcall_core::state::sweep::SweepMachine)'s
/// (sans-io): an orphan goes once this sweeper has seen it for the grace on its
/// own clock, never by the writer's clock. Deletions are counted in
/// `rollcall_state_swept_total`.
///
/// Under faults a pass never retries in a loop: a failed table call is counted
/// and the pass goes on; every call is bounded by the provider's operation
/// timeout.
pub struct StateSweeper {
    storage: StateStorage,
    options: SweepOptions,
    machine: rollcall_core::state::sweep::SweepMachine,
    ownership: Box<dyn Fn() -> Owns + Send + Sync>,
}

impl std::fmt::Debug for StateSweeper {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StateSweeper")
            .field("service", &self.storage.table().service_id())
            .field("options", &self.options)
            .finish_non_exhaustive()
    }
}

impl StateSweeper {
    /// A sweeper of every state of `options.kinds` in `storage` (one process
    /// alone, or tests).
    pub fn all(storage: StateStorage, options: SweepOptions) -> Self {
        Self::with_ownership(storage, options, Box::new(|| Box::new(|_| true)))
    }

    /// A sweeper of the states `silo` owns on the ring of the Active silos of
    /// its view, each taking `ring_points_per_silo` points (the reminder
    /// service's [`ReminderOptions::ring_points_per_silo`](rollcall_core::ReminderOptions),
    /// so that one silo sweeps the states of the actors whose reminders it
    /// owns). A silo that is not Active in its own view owns none.
    pub fn for_silo(
        storage: StateStorage,
        options: SweepOptions,
        silo: rollcall_core::SiloHandle,
        ring_points_per_silo: u32,
    ) -> Self {
        Self::with_ownership(
            storage,
            options,
            Box::new(move || {
                let ring = rollcall_reminders::ring::Ring::of_active(&silo.snapshot(), ring_points_per_silo);
                let me = silo.address();
                Box::new(move |hash| ring.owns(&me, hash))
            }),
        )
    }

    fn with_ownership(
        storage: StateStorage,
        options: SweepOptions,
        ownership: Box<dyn Fn() -> Owns + Send + Sync>,
    ) -> Self {
        let machine = rollcall_core::state::sweep::SweepMachine::new(
            options.grace,
            options.tombstone_retention,
            rollcall_core::state::sweep::MAX_TRACKED,
        );
        StateSweeper {
            storage,
            options,
            machine,
            ownership,
        }
    }

    /// One pass over every owned state of the kinds: lists them page by page
    /// and sweeps each. At most `ceil(states / page)` list calls plus four
    /// table calls a state.
    pub async fn pass(&mut self) -> SweepReport {
        use rollcall_core::state::sweep::Swept;
        let owns = (self.ownership)();
        let service = self.storage.table().service_id().to_owned();
        let mut report = SweepReport::default();
        for kind in self.options.kinds.clone() {
            let mut after: Option<StateKey> = None;
            loop {
                let page = match self
                    .storage
                    .list(&kind, after.as_ref(), self.options.page.max(1))
                    .await
                {
                    Ok(p) => p,
                    Err(e) => {
                        tracing::warn!(service = %service, kind = %kind, error = %e, "listing states to sweep failed; the next pass tries again");
                        report.errors += 1;
                        break;
                    }
                };
                let Some(last) = page.last().cloned() else { break };
                for key in page
                    .iter()
                    .filter(|k| owns(rollcall_core::actor_hash(k.actor_id())))
                {
                    report.states += 1;
                    match self.storage.sweep_with(key, &mut self.machine).await {
                        Ok(done) => {
                            for what in done {
                                rollcall_core::telemetry::state_swept(&service, what.label());
                                match what {
                                    Swept::Orphan => report.orphans += 1,
                                    Swept::Expired => report.expired += 1,
                                    Swept::Tombstone => report.tombstones += 1,
                                }
                            }
                        }
                        Err(e) => {
                            tracing::debug!(service = %service, key = %key, error = %e, "sweeping a state failed");
                            report.errors += 1;
                        }
                    }
                }
                after = Some(last);
            }
        }
        report
    }

    /// Runs a pass every `period` until the returned task is aborted (or the
    /// runtime stops).
    pub fn spawn(mut self) -> tokio::task::JoinHandle<()> {
        tokio::spawn(async move {
            loop {
                let report = self.pass().await;
                tracing::debug!(?report, "state sweep pass");
                tokio::time::sleep(self.options.period).await;
            }
        })
    }
}

fn encode<T: Serialize>(key: &StateKey, codec: Codec, value: &T) -> Result<Vec<u8>> {
    match codec {
        Codec::Json => serde_json::to_vec(value)
            .map_err(|e| Error::invalid_input("state", format!("{key}: does not serialize: {e}"))),
        #[cfg(feature = "postcard")]
        Codec::Postcard => postcard::to_allocvec(value)
            .map_err(|e| Error::invalid_input("state", format!("{key}: does not serialize: {e}"))),
        other => Err(Error::Unsupported(format!("writing the {other:?} codec"))),
    }
}

fn decode<T: DeserializeOwned>(key: &StateKey, codec: Codec, data: &[u8]) -> Result<T> {
    match codec {
        Codec::Json => serde_json::from_slice(data).map_err(|e| Error::corrupt(key.to_string(), e)),
        #[cfg(feature = "postcard")]
        Codec::Postcard => postcard::from_bytes(data).map_err(|e| Error::corrupt(key.to_string(), e)),
        other => Err(Error::Unsupported(format!("reading the {other:?} codec"))),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Default, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Cart {
        items: Vec<String>,
        n: u64,
    }

    /// A state written with a codec is read with the codec its record names,
    /// whichever the reader was built with.
    #[cfg(all(feature = "postcard", feature = "memory"))]
    #[tokio::test]
    async fn a_postcard_record_is_read_by_its_stored_codec() {
        use crate::SystemStore;
        let store = rollcall_provider_memory::MemoryStore::new();
        let storage = StateStorage::new(store.state_table("s").unwrap());
        let key = StateKey::new("cart/1", "cart").unwrap();
        let w: PersistentState<Cart> =
            PersistentState::new(storage.clone(), key.clone()).with_codec(Codec::Postcard);
        w.modify(|c| {
            c.items.push("apple".into());
            c.n = 7;
        });
        w.write().await.unwrap();
        let stored = storage.read(&key).await.unwrap();
        assert_eq!(stored.codec, Codec::Postcard);
        assert!(
            stored.data.len() < w.read(|c| serde_json::to_vec(c).unwrap().len()),
            "compact"
        );
        let r: PersistentState<Cart> = PersistentState::new(storage, key);
        r.load().await.unwrap();
        assert_eq!(r.read(|c| (c.items.clone(), c.n)), (vec!["apple".to_owned()], 7));
    }

    #[test]
    fn raw_records_are_not_decoded_as_a_type() {
        let key = StateKey::new("cart/1", "cart").unwrap();
        assert!(matches!(
            decode::<Cart>(&key, Codec::Raw, b"{}"),
            Err(Error::Unsupported(_))
        ));
        assert!(matches!(
            decode::<Cart>(&key, Codec::Json, b"{"),
            Err(Error::Corrupt { .. })
        ));
    }
}
