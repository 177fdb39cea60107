//! Actor state that survives its silo: Orleans' grain state for actix actors.
//!
//! [`PersistentState<T>`] holds one named state of one actor: `load` it (in
//! `started`), read and change it with [`state`](PersistentState::state) and
//! [`state_mut`](PersistentState::state_mut), [`write`](PersistentState::write)
//! it, [`clear`](PersistentState::clear) it. Under it is the store's grain-state
//! table ([`SystemStore::state_table`](crate::SystemStore::state_table)) through
//! a [`StateStorage`]: an etag per write, chunks for large states, an envelope
//! that turns a damaged record into [`Error::Corrupt`].
//!
//! As in Orleans, the calls of one state run one at a time, and writes asked for
//! while one runs merge into the next one. A write that finds another etag than
//! the one it read fails with
//! [`Error::InconsistentState`] and writes
//! nothing; nothing is retried behind your back. The usual answer is to read
//! again, apply the change again, and write:
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> rollcall::Result<()> {
//! use rollcall::state::{PersistentState, StateKey, StateStorage};
//! use rollcall::{Error, SystemStore};
//!
//! let store = rollcall::connect("memory://state-doc").await?;
//! let storage = StateStorage::new(store.state_table("shop")?);
//! let key = StateKey::new("cart/42", "items")?;
//! let cart: PersistentState<Vec<String>> = PersistentState::new(storage.clone(), key.clone());
//! cart.load().await?;
//! cart.state_mut().push("apple".into());
//! cart.write().await?;
//!
//! // Another activation wrote meanwhile: our write conflicts.
//! let other: PersistentState<Vec<String>> = PersistentState::new(storage, key);
//! other.load().await?;
//! other.state_mut().push("pear".into());
//! other.write().await?;
//! cart.state_mut().push("plum".into());
//! match cart.write().await {
//!     Err(Error::InconsistentState { .. }) => {
//!         cart.load().await?; // re-read ...
//!         cart.state_mut().push("plum".into()); // ... re-apply ...
//!         cart.write().await?; // ... and write again
//!     }
//!     other => { other?; }
//! }
//! assert_eq!(*cart.state(), ["apple", "pear", "plum"]);
//! # Ok(()) }
//! ```
//!
//! The serde_json codec is the default (a type that gains a
//! `#[serde(default)]` field reads its old records); with the `postcard` feature,
//! [`Codec::Postcard`] is compact but not self-describing. The codec is stored
//! with each record, so a reader always knows.

use std::ops::{Deref, DerefMut};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use serde::de::DeserializeOwned;
use serde::Serialize;

pub use rollcall_membership_core::state::*;
use rollcall_membership_core::{bounded, Error, Etag, Result, Timestamp};

/// How long one call of a [`PersistentState`] may take by default: 30 s.
pub const DEFAULT_STATE_TIMEOUT: Duration = Duration::from_secs(30);

struct Value<T> {
    state: T,
    etag: Option<Etag>,
    exists: bool,
    /// Bumped by every `state_mut`.
    changed: u64,
    /// `changed` as of the last write that succeeded.
    written: u64,
}

struct Shared<T> {
    value: Mutex<Value<T>>,
    /// One call at a time.
    io: tokio::sync::Mutex<()>,
}

/// One named state of one actor, as a typed value with its etag. Cheap to clone
/// (the clones share the value, as the handlers of one actor do).
pub struct PersistentState<T> {
    storage: StateStorage,
    key: StateKey,
    codec: Codec,
    timeout: Duration,
    expires_in: Option<Duration>,
    shared: Arc<Shared<T>>,
}

impl<T> Clone for PersistentState<T> {
    fn clone(&self) -> Self {
        PersistentState {
            storage: self.storage.clone(),
            key: self.key.clone(),
            codec: self.codec,
            timeout: self.timeout,
            expires_in: self.expires_in,
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

/// A read view of the value ([`PersistentState::state`]). Do not hold it across
/// an `.await`.
pub struct StateRef<'a, T>(MutexGuard<'a, Value<T>>);

impl<T> Deref for StateRef<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0.state
    }
}

/// A write view of the value ([`PersistentState::state_mut`]): marks it changed.
/// Do not hold it across an `.await`.
pub struct StateMut<'a, T>(MutexGuard<'a, Value<T>>);

impl<T> Deref for StateMut<'_, T> {
    type Target = T;
    fn deref(&self) -> &T {
        &self.0.state
    }
}

impl<T> DerefMut for StateMut<'_, T> {
    fn deref_mut(&mut self) -> &mut T {
        &mut self.0.state
    }
}

fn lock<V>(m: &Mutex<V>) -> MutexGuard<'_, V> {
    m.lock().unwrap_or_else(|p| p.into_inner())
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
            shared: Arc::new(Shared {
                value: Mutex::new(Value {
                    state: T::default(),
                    etag: None,
                    exists: false,
                    changed: 0,
                    written: 0,
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
    pub fn with_expiry(mut self, ttl: Duration) -> Self {
        self.expires_in = Some(ttl);
        self
    }

    /// The key.
    pub fn key(&self) -> &StateKey {
        &self.key
    }

    /// The value (as loaded and changed since).
    pub fn state(&self) -> StateRef<'_, T> {
        StateRef(lock(&self.shared.value))
    }

    /// The value, to change; the next [`write`](Self::write) stores it.
    pub fn state_mut(&self) -> StateMut<'_, T> {
        let mut g = lock(&self.shared.value);
        g.changed += 1;
        StateMut(g)
    }

    /// The etag of the record as last read or written (`None`: no record).
    pub fn etag(&self) -> Option<Etag> {
        lock(&self.shared.value).etag.clone()
    }

    /// Whether a record was found or written (Orleans' `RecordExists`).
    pub fn record_exists(&self) -> bool {
        lock(&self.shared.value).exists
    }

    fn timed_out(&self, what: &'static str) -> impl FnOnce(Duration) -> Error + '_ {
        move |t| Error::backend(format!("{what} of state {} took longer than {t:?}", self.key))
    }

    /// Reads the record (replacing the value: `T::default()` when there is
    /// none).
    ///
    /// # Errors
    /// [`Error::Corrupt`] for a record that does not check out or decode (the
    /// value is left as it was); [`Error::Unsupported`] for a codec this build
    /// cannot read; [`Error::Backend`] on a backend failure or after the timeout.
    pub async fn load(&self) -> Result<()> {
        bounded(
            self.timeout,
            async {
                let _one = self.shared.io.lock().await;
                let read = self.storage.read(&self.key).await?;
                let state = if read.record_exists {
                    decode::<T>(&self.key, read.codec, &read.data)?
                } else {
                    T::default()
                };
                let mut v = lock(&self.shared.value);
                v.state = state;
                v.etag = read.etag;
                v.exists = read.record_exists;
                v.written = v.changed;
                Ok(())
            },
            self.timed_out("load"),
        )
        .await
    }

    /// Stores the value under the etag last read or written; returns the new
    /// etag. A write asked for while another runs is merged into the next one
    /// (both answer with its result); one whose changes an earlier write already
    /// stored answers at once.
    ///
    /// # Errors
    /// [`Error::InconsistentState`] when the record changed since it was read
    /// (nothing written: re-read, re-apply, write again);
    /// [`Error::TooLarge`]; [`Error::Backend`] on a backend failure or after the
    /// timeout.
    pub async fn write(&self) -> Result<Etag> {
        let wanted = lock(&self.shared.value).changed;
        bounded(
            self.timeout,
            async {
                let _one = self.shared.io.lock().await;
                let (bytes, seq, etag) = {
                    let v = lock(&self.shared.value);
                    if v.written >= wanted && v.exists {
                        if let Some(e) = &v.etag {
                            return Ok(e.clone()); // merged into a write that ran meanwhile
                        }
                    }
                    (
                        encode(&self.key, self.codec, &v.state)?,
                        v.changed,
                        v.etag.clone(),
                    )
                };
                let expires_at = self
                    .expires_in
                    .map(|d| Timestamp::from_millis(Timestamp::now().as_millis() + d.as_millis() as u64));
                let new = self
                    .storage
                    .write(
                        &self.key,
                        Expected::from_etag(etag.as_ref()),
                        self.codec,
                        &bytes,
                        expires_at,
                    )
                    .await?;
                let mut v = lock(&self.shared.value);
                v.etag = Some(new.clone());
                v.exists = true;
                v.written = v.written.max(seq);
                Ok(new)
            },
            self.timed_out("write"),
        )
        .await
    }

    /// Clears the record under the etag last read or written: a tombstone (its
    /// etag becomes this state's etag), the value back to `T::default()`.
    ///
    /// # Errors
    /// As [`write`](Self::write).
    pub async fn clear(&self) -> Result<()> {
        bounded(
            self.timeout,
            async {
                let _one = self.shared.io.lock().await;
                let etag = lock(&self.shared.value).etag.clone();
                let new = self
                    .storage
                    .clear(
                        &self.key,
                        Expected::from_etag(etag.as_ref()),
                        ClearMode::Tombstone,
                    )
                    .await?;
                let mut v = lock(&self.shared.value);
                v.state = T::default();
                v.etag = new;
                v.exists = false;
                v.written = v.changed;
                Ok(())
            },
            self.timed_out("clear"),
        )
        .await
    }
}

fn encode<T: Serialize>(key: &StateKey, codec: Codec, value: &T) -> Result<Vec<u8>> {
    match codec {
        Codec::Json => serde_json::to_vec(value)
            .map_err(|e| Error::invalid_config("state", format!("{key}: does not serialize: {e}"))),
        #[cfg(feature = "postcard")]
        Codec::Postcard => postcard::to_allocvec(value)
            .map_err(|e| Error::invalid_config("state", format!("{key}: does not serialize: {e}"))),
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
        w.state_mut().items.push("apple".into());
        w.state_mut().n = 7;
        w.write().await.unwrap();
        let stored = storage.read(&key).await.unwrap();
        assert_eq!(stored.codec, Codec::Postcard);
        assert!(
            stored.data.len() < serde_json::to_vec(&*w.state()).unwrap().len(),
            "compact"
        );
        let r: PersistentState<Cart> = PersistentState::new(storage, key);
        r.load().await.unwrap();
        assert_eq!(
            *r.state(),
            Cart {
                items: vec!["apple".into()],
                n: 7
            }
        );
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
