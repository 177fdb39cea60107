//! [`StateStorage`]: carries out a [`WriteMachine`]'s actions and the reads,
//! clears, listings and sweeps against a [`StateTable`].

use std::sync::Arc;
use std::time::Duration;

use super::header::verify;
use super::*;
use crate::{Clock, Error, Etag, Result, SystemClock, Timestamp};

/// How a [`StateStorage::write_with`] stores a state, beyond its bytes.
#[derive(Clone, Debug, Default)]
pub struct WriteOptions<'a> {
    /// When the state expires (UTC ms), if ever.
    pub expires_at: Option<Timestamp>,
    /// The version of the type that wrote it (read back as
    /// [`StateRead::version`]).
    pub version: u32,
    /// The generation id to write under (a fresh one when `None`).
    pub generation: Option<&'a str>,
}

/// How many times a read starts again when its chunks changed under it (a write
/// replaced the generation between the header and the chunks). Under heavy
/// contention every attempt can lose that race: the read then fails with a
/// transient [`Error::Backend`], never [`Error::Corrupt`].
pub const READ_ATTEMPTS: usize = 10;

/// Reads and writes states through a [`StateTable`]: the envelope, chunking,
/// generations and sweeping, the same on every provider. Cheap to clone.
///
/// Every call makes a bounded number of table calls (a write: one header read,
/// `ceil(chunks / txn_rows)` staging calls when staged, one commit, one delete; a
/// read: at most [`READ_ATTEMPTS`] x 3), so it answers within that many table
/// operation timeouts (the typed layer bounds each call).
#[derive(Clone, Debug)]
pub struct StateStorage {
    table: Arc<dyn StateTable>,
    clock: Arc<dyn Clock>,
    fence: Option<Arc<crate::Fence>>,
}

impl StateStorage {
    /// Storage over `table`, on the system clock.
    pub fn new(table: Arc<dyn StateTable>) -> StateStorage {
        StateStorage::with_clock(table, Arc::new(SystemClock))
    }

    /// Storage over `table` on `clock` (expiry and generation ids).
    pub fn with_clock(table: Arc<dyn StateTable>, clock: Arc<dyn Clock>) -> StateStorage {
        StateStorage {
            table,
            clock,
            fence: None,
        }
    }

    /// This storage with every write and clear fenced by `fence`: the store
    /// commits one only while `fence.shard`'s lease of `fence.service` is still
    /// held at `fence.epoch`, in the commit's own transaction, and answers
    /// [`Error::Fenced`] otherwise (nothing written). Reads are not fenced.
    ///
    /// A fenced write of a key the fence does not cover (another service, an
    /// actor of another shard) is [`Error::InvalidInput`] before anything is
    /// sent.
    pub fn fenced(&self, fence: crate::Fence) -> StateStorage {
        StateStorage {
            fence: Some(Arc::new(fence)),
            ..self.clone()
        }
    }

    /// The fence of this storage's writes, if any ([`fenced`](Self::fenced)).
    pub fn fence(&self) -> Option<&crate::Fence> {
        self.fence.as_deref()
    }

    /// Checks that the fence, if any, covers `key`.
    fn check_fence(&self, key: &StateKey) -> Result<()> {
        let Some(f) = self.fence.as_deref() else {
            return Ok(());
        };
        if f.service != self.table.service_id() {
            return Err(Error::invalid_input(
                "fence",
                format!(
                    "fences service `{}`, not this table's `{}`",
                    f.service,
                    self.table.service_id()
                ),
            ));
        }
        if !f.covers(key.actor_id()) {
            return Err(Error::invalid_input(
                "fence",
                format!(
                    "shard {} of {} does not hold actor `{}`",
                    f.shard,
                    f.shards,
                    key.actor_id()
                ),
            ));
        }
        Ok(())
    }

    /// [`Error::Fenced`] for `key` with the lease's token `current`.
    fn fenced_error(&self, key: &StateKey, current: Option<u64>) -> Error {
        let f = self.fence.as_deref();
        Error::Fenced {
            key: key.to_string(),
            service: f.map(|f| f.service.clone()).unwrap_or_default(),
            shard: f.map_or(0, |f| f.shard),
            epoch: f.map_or(0, |f| f.epoch),
            current,
        }
    }

    /// The table.
    pub fn table(&self) -> &Arc<dyn StateTable> {
        &self.table
    }

    /// The stored state of `key`.
    ///
    /// # Errors
    /// [`Error::Corrupt`] for a header or chunks that do not check out (after
    /// [`READ_ATTEMPTS`] reads when a concurrent write could explain it);
    /// [`Error::Backend`] if the backend fails.
    pub async fn read(&self, key: &StateKey) -> Result<StateRead> {
        for _ in 0..READ_ATTEMPTS {
            let Some((row, etag)) = self.table.read_header(key).await? else {
                return Ok(StateRead::default());
            };
            let (header, inline) = StateHeader::decode_row(key, &row)?;
            if header.cleared || header.expired(self.clock.now()) {
                return Ok(StateRead {
                    etag: (!header.expired(self.clock.now())).then_some(etag),
                    ..StateRead::default()
                });
            }
            if header.inline {
                // One read: the bytes are in the header row.
                verify(key, &header, inline)?;
                let data = inline.to_vec();
                return Ok(StateRead {
                    data,
                    codec: header.codec,
                    etag: Some(etag),
                    record_exists: true,
                    version: header.version,
                });
            }
            let chunks = self
                .table
                .read_chunks(key, &header.generation, header.chunks)
                .await?;
            match assemble(key, &header, chunks) {
                Ok(data) => {
                    return Ok(StateRead {
                        data,
                        codec: header.codec,
                        etag: Some(etag),
                        record_exists: true,
                        version: header.version,
                    })
                }
                Err(e) => {
                    // A write that replaced the generation meanwhile explains it:
                    // read again; the same header twice does not.
                    let now = self.table.read_header(key).await?;
                    if now.as_ref().map(|(_, e)| e) == Some(&etag) {
                        return Err(e);
                    }
                }
            }
        }
        Err(Error::backend(format!(
            "state {key} was replaced under each of {READ_ATTEMPTS} reads; try again"
        )))
    }

    /// Writes `data` (serialized with `codec`) as the state of `key` if its
    /// header passes `expected`; returns the new etag.
    ///
    /// # Errors
    /// [`Error::InconsistentState`] when the precondition fails (nothing
    /// written); [`Error::TooLarge`] over the provider's
    /// [`StateLimits::max_state_bytes`] (nothing written); [`Error::Backend`] if
    /// the backend fails and the write certainly did not land (the old state
    /// stays readable); [`Error::OutcomeUnknown`] if the commit failed and the
    /// read that would have told whether it landed failed too.
    pub async fn write(
        &self,
        key: &StateKey,
        expected: Expected,
        codec: Codec,
        data: &[u8],
        expires_at: Option<Timestamp>,
    ) -> Result<Etag> {
        let options = WriteOptions {
            expires_at,
            ..WriteOptions::default()
        };
        self.write_with(key, expected, codec, data, options).await
    }

    /// A fresh generation id for [`WriteOptions::generation`].
    ///
    /// The id starts with the writer's clock (ms), which only orders
    /// generations for the sweep's grace period; a sweep never removes the
    /// published generation, whatever the clocks say.
    pub fn new_generation(&self) -> String {
        new_generation(self.clock.now())
    }

    /// [`write`](Self::write) with [`WriteOptions`]: the version of the type
    /// that wrote it, and a generation id the caller chose
    /// ([`new_generation`](Self::new_generation)), so that it can learn the
    /// outcome of a write it gave up on (a timeout) with
    /// [`outcome`](Self::outcome).
    ///
    /// # Errors
    /// As [`write`](Self::write).
    pub async fn write_with(
        &self,
        key: &StateKey,
        expected: Expected,
        codec: Codec,
        data: &[u8],
        options: WriteOptions<'_>,
    ) -> Result<Etag> {
        self.check_fence(key)?;
        let expires_at = options.expires_at;
        let generation = options
            .generation
            .map_or_else(|| self.new_generation(), str::to_owned);
        let mut m = WriteMachine::new(key, data.len(), generation.clone(), self.table.limits())?;
        let ranges = m.chunk_ranges().to_vec();
        let header = header_row(
            data,
            codec,
            &generation,
            m.layout(),
            ranges.len(),
            expires_at,
            options.version,
        );
        let mut errors: Vec<Error> = Vec::new();
        let mut action = m.handle(WriteEvent::Start);
        loop {
            let event = match action {
                WriteAction::PutChunks(r) => {
                    let chunks: Vec<&[u8]> = ranges[r.clone()].iter().map(|b| &data[b.clone()]).collect();
                    match self
                        .table
                        .put_chunks(key, &generation, r.start as u32, &chunks, expires_at)
                        .await
                    {
                        Ok(()) => WriteEvent::ChunksPut,
                        Err(e) => {
                            errors.push(e);
                            WriteEvent::Failed
                        }
                    }
                }
                WriteAction::Commit(r) => {
                    let w = HeaderWrite {
                        key,
                        expected: expected.clone(),
                        header: Some(&header),
                        generation: &generation,
                        chunks: ranges[r].iter().map(|b| &data[b.clone()]).collect(),
                        expires_at,
                    };
                    match self.table.commit(std::slice::from_ref(&w), self.fence()).await {
                        Ok(c) => WriteEvent::Committed(c),
                        Err(e) => {
                            let transient = e.is_transient();
                            let undecidable = matches!(e, Error::OutcomeUnknown { .. });
                            errors.push(e);
                            if undecidable {
                                WriteEvent::Undecidable
                            } else if transient {
                                WriteEvent::Failed
                            } else {
                                WriteEvent::Rejected
                            }
                        }
                    }
                }
                WriteAction::Resolve => match self.table.read_header(key).await {
                    Ok(h) => WriteEvent::Resolved(h.and_then(|(b, etag)| {
                        StateHeader::decode(key, &b).ok().map(|h| (h.generation, etag))
                    })),
                    Err(e) => {
                        errors.push(e);
                        WriteEvent::Failed
                    }
                },
                WriteAction::DeleteGeneration(g) => {
                    if let Err(e) = self.table.delete_generation(key, &g).await {
                        tracing::debug!(key = %key, generation = %g, error = %e, "deleting a generation failed; a sweep removes it");
                    }
                    WriteEvent::Deleted
                }
                WriteAction::Finish(r) => {
                    return match r {
                        Ok(Some(etag)) => Ok(etag),
                        Ok(None) => Err(Error::backend("the commit returned no etag")),
                        Err(WriteFailure::Conflict(current)) => Err(Error::InconsistentState {
                            key: key.to_string(),
                            expected: expected_etag(&expected),
                            current,
                        }),
                        Err(WriteFailure::Fenced(current)) => Err(self.fenced_error(key, current)),
                        Err(WriteFailure::Failed) => Err(errors
                            .into_iter()
                            .next()
                            .unwrap_or_else(|| Error::backend("state write failed"))),
                        Err(WriteFailure::Unknown) => Err(Error::OutcomeUnknown {
                            key: key.to_string(),
                            reason: errors
                                .iter()
                                .map(ToString::to_string)
                                .collect::<Vec<_>>()
                                .join("; then the read of its header: "),
                        }),
                    }
                }
            };
            action = m.handle(event);
        }
    }

    /// Whether a write under `generation` landed: the header's etag if the
    /// header of `key` publishes that generation (a tombstone of a clear too),
    /// `None` if it does not (another write, or none, is published; it did not
    /// land, or landed and was replaced since).
    ///
    /// # Errors
    /// [`Error::Backend`] if the backend fails.
    pub async fn outcome(&self, key: &StateKey, generation: &str) -> Result<Option<Etag>> {
        Ok(self.table.read_header(key).await?.and_then(|(b, etag)| {
            StateHeader::decode(key, &b)
                .ok()
                .filter(|h| h.generation == generation)
                .map(|_| etag)
        }))
    }

    /// Writes several states of one actor atomically: all or none.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] when the states do not fit one transaction of
    /// this provider (or belong to different actors); otherwise as
    /// [`write`](Self::write) ([`Error::InconsistentState`] names the first state
    /// whose precondition failed).
    pub async fn write_many(&self, states: &[(StateKey, Expected, Codec, &[u8])]) -> Result<Vec<Etag>> {
        let limits = self.table.limits();
        if let Some((first, ..)) = states.first() {
            if states.iter().any(|(k, ..)| k.actor_id() != first.actor_id()) {
                return Err(Error::invalid_input(
                    "states",
                    "all states must belong to one actor",
                ));
            }
        }
        for (key, ..) in states {
            self.check_fence(key)?;
        }
        let mut seen = std::collections::BTreeSet::new();
        if let Some((k, ..)) = states.iter().find(|(k, ..)| !seen.insert(k)) {
            return Err(Error::invalid_input(
                "states",
                format!("state {k} is written twice in one write_many"),
            ));
        }
        let generation = new_generation(self.clock.now());
        let mut rows = 0;
        let mut bytes = 0;
        let mut planned = Vec::with_capacity(states.len());
        for (key, _, _, data) in states {
            let m = WriteMachine::new(key, data.len(), generation.clone(), limits)?;
            rows += m.chunk_ranges().len() + 1;
            bytes += data.len() + HEADER_BYTES;
            planned.push((m.layout(), m.chunk_ranges().to_vec()));
        }
        if rows > limits.txn_rows || bytes > limits.txn_bytes {
            return Err(Error::invalid_input(
                "states",
                format!(
                    "{rows} rows and {bytes} bytes do not fit one transaction of this provider ({} rows, {} bytes)",
                    limits.txn_rows, limits.txn_bytes
                ),
            ));
        }
        let headers: Vec<Vec<u8>> = states
            .iter()
            .zip(&planned)
            .map(|((_, _, codec, data), (layout, r))| {
                // A state too big for its row has chunk rows in the transaction.
                let layout = if *layout == Layout::Row {
                    Layout::Row
                } else {
                    Layout::Txn
                };
                header_row(data, *codec, &generation, layout, r.len(), None, 0)
            })
            .collect();
        let writes: Vec<HeaderWrite<'_>> = states
            .iter()
            .zip(&planned)
            .zip(&headers)
            .map(|(((key, expected, _, data), (_, r)), h)| HeaderWrite {
                key,
                expected: expected.clone(),
                header: Some(h),
                generation: &generation,
                chunks: r.iter().map(|b| &data[b.clone()]).collect(),
                expires_at: None,
            })
            .collect();
        let committed = match self.table.commit(&writes, self.fence()).await {
            Ok(c) => c,
            Err(e) if !e.is_transient() => return Err(e),
            Err(e) => {
                // It may have landed: every header names our generation if so.
                let mut etags = Vec::with_capacity(states.len());
                for (key, ..) in states {
                    match self.outcome(key, &generation).await {
                        Ok(Some(etag)) => etags.push(Some(etag)),
                        Ok(None) => return Err(e),
                        Err(read) => {
                            return Err(Error::OutcomeUnknown {
                                key: key.to_string(),
                                reason: format!("{e}; then the read of its header: {read}"),
                            })
                        }
                    }
                }
                Commit::Done {
                    etags,
                    replaced: Vec::new(),
                }
            }
        };
        match committed {
            Commit::Done { etags, replaced } => {
                for ((key, ..), g) in states.iter().zip(replaced) {
                    if let Some(g) = g.filter(|g| *g != generation) {
                        let _ = self.table.delete_generation(key, &g).await;
                    }
                }
                etags
                    .into_iter()
                    .map(|e| e.ok_or_else(|| Error::backend("the commit returned no etag")))
                    .collect()
            }
            Commit::Conflict { index, current } => Err(Error::InconsistentState {
                key: states[index].0.to_string(),
                expected: expected_etag(&states[index].1),
                current,
            }),
            Commit::Fenced { current } => Err(self.fenced_error(&states[0].0, current)),
        }
    }

    /// Clears the state of `key` if its header passes `expected`: a tombstone
    /// (returns its etag) or, with [`ClearMode::Delete`], no header (returns
    /// `None`). The cleared state's chunks are deleted. A header that does not
    /// decode is cleared too (with [`Expected::Any`], the way out of a corrupt
    /// record).
    ///
    /// # Errors
    /// As [`write`](Self::write).
    pub async fn clear(&self, key: &StateKey, expected: Expected, mode: ClearMode) -> Result<Option<Etag>> {
        let generation = self.new_generation();
        self.clear_as(key, expected, mode, &generation).await
    }

    /// [`clear`](Self::clear) with a tombstone under a generation id the caller
    /// chose, so that [`outcome`](Self::outcome) can tell later whether it landed.
    ///
    /// # Errors
    /// As [`write`](Self::write).
    pub async fn clear_as(
        &self,
        key: &StateKey,
        expected: Expected,
        mode: ClearMode,
        generation: &str,
    ) -> Result<Option<Etag>> {
        self.check_fence(key)?;
        let tombstone = StateHeader::tombstone(generation.to_owned()).encode_row(&[]);
        let w = HeaderWrite {
            key,
            expected: expected.clone(),
            header: (mode == ClearMode::Tombstone).then_some(tombstone.as_slice()),
            generation,
            chunks: Vec::new(),
            expires_at: None,
        };
        let committed = match self.table.commit(std::slice::from_ref(&w), self.fence()).await {
            Ok(c) => c,
            Err(e) if !e.is_transient() => return Err(e),
            // It may have landed: a tombstone names our generation; after a
            // delete, no header is left.
            Err(e) => {
                let now = match self.table.read_header(key).await {
                    Ok(h) => h,
                    Err(read) => {
                        return Err(Error::OutcomeUnknown {
                            key: key.to_string(),
                            reason: format!("{e}; then the read of its header: {read}"),
                        })
                    }
                };
                let landed = match (&now, mode) {
                    (None, ClearMode::Delete) => Some(None),
                    (Some((b, etag)), ClearMode::Tombstone) => StateHeader::decode(key, b)
                        .ok()
                        .filter(|h| h.generation == generation)
                        .map(|_| Some(etag.clone())),
                    _ => None,
                };
                match landed {
                    Some(etag) => Commit::Done {
                        etags: vec![etag],
                        replaced: Vec::new(),
                    },
                    None => return Err(e),
                }
            }
        };
        match committed {
            Commit::Done { etags, replaced } => {
                if let Some(g) = replaced.into_iter().next().flatten() {
                    let _ = self.table.delete_generation(key, &g).await;
                }
                Ok(etags.into_iter().next().flatten())
            }
            Commit::Conflict { current, .. } => Err(Error::InconsistentState {
                key: key.to_string(),
                expected: expected_etag(&expected),
                current,
            }),
            Commit::Fenced { current } => Err(self.fenced_error(key, current)),
        }
    }

    /// One page of the keys of actor kind `kind` (at most `limit`, after `after`).
    ///
    /// # Errors
    /// [`Error::Backend`] if the backend fails.
    pub async fn list(&self, kind: &str, after: Option<&StateKey>, limit: usize) -> Result<Vec<StateKey>> {
        self.table.list(kind, after, limit).await
    }

    /// Removes the generations of `key` that no header publishes and that are
    /// older than `grace` ([`SWEEP_GRACE`] normally: younger ones may belong to a
    /// write still staging). Returns how many.
    ///
    /// # Errors
    /// [`Error::Backend`] if the backend fails.
    pub async fn sweep(&self, key: &StateKey, grace: Duration) -> Result<usize> {
        // Note: judges a generation's age by the time in its id (the writer's
        // clock). The service's periodic sweep ([`sweep_with`](Self::sweep_with))
        // judges by its own sightings instead.
        let published = match self.table.read_header(key).await? {
            Some((b, _)) => Some(StateHeader::decode(key, &b)?.generation),
            None => None,
        };
        let gens = self.table.generations(key).await?;
        let gone = sweepable(&gens, published.as_deref(), self.clock.now(), grace);
        for g in &gone {
            self.table.delete_generation(key, g).await?;
        }
        Ok(gone.len())
    }

    /// The storage's clock (expiry, generation ids, sweeps).
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }

    /// Sweeps `key` (listed by the table) by the rules of `machine`
    /// ([`crate::state::sweep`]): deletes what they say, returns what was
    /// deleted, each once. A header that does not decode is left alone (a
    /// repair is `PersistentState::overwrite` or `delete`).
    ///
    /// # Errors
    /// [`Error::Corrupt`] for a header that does not decode (nothing deleted);
    /// [`Error::Backend`] if the backend fails (what was deleted stays deleted).
    pub async fn sweep_with(
        &self,
        key: &StateKey,
        machine: &mut crate::state::sweep::SweepMachine,
    ) -> Result<Vec<crate::state::sweep::Swept>> {
        use crate::state::sweep::SweepAction;
        let header = match self.table.read_header(key).await? {
            Some((row, etag)) => Some((StateHeader::decode(key, &row)?, etag)),
            None => None,
        };
        let gens = self.table.generations(key).await?;
        let now = self.clock.now();
        let mut done = Vec::new();
        for (action, what) in machine.observe(key, now, header.as_ref().map(|(h, e)| (h, e)), &gens) {
            match action {
                SweepAction::DeleteGeneration(g) => {
                    self.table.delete_generation(key, &g).await?;
                    done.push(what);
                }
                SweepAction::DeleteHeader(expected) => {
                    let w = HeaderWrite {
                        key,
                        expected,
                        header: None,
                        generation: "",
                        chunks: Vec::new(),
                        expires_at: None,
                    };
                    // A conflict: written meanwhile, left alone.
                    if let Commit::Done { .. } = self.table.commit(std::slice::from_ref(&w), None).await? {
                        done.push(what);
                    }
                }
            }
        }
        Ok(done)
    }
}

/// The header row of `data` written under `generation` with `layout`.
fn header_row(
    data: &[u8],
    codec: Codec,
    generation: &str,
    layout: Layout,
    chunks: usize,
    expires_at: Option<Timestamp>,
    version: u32,
) -> Vec<u8> {
    let mut h = StateHeader::of(data, codec, generation.to_owned(), chunks as u32, expires_at);
    h.version = version;
    if layout == Layout::Row {
        h.inline = true;
        h.encode_row(data)
    } else {
        h.encode_row(&[])
    }
}

fn expected_etag(e: &Expected) -> Option<Etag> {
    match e {
        Expected::Etag(e) => Some(e.clone()),
        Expected::Absent | Expected::Any => None,
    }
}
