//! [`WriteMachine`]: the rules of one state write, sans-io (events in,
//! actions out): stage chunks, commit the header, resolve a commit whose
//! outcome is unknown by reading, delete what the write no longer needs.

use std::ops::Range;

use super::{Commit, StateKey, StateLimits};
use crate::{Error, Etag, Result};

/// A step of a write, decided by [`WriteMachine`].
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteAction {
    /// Stage chunks `range` of the new generation.
    PutChunks(Range<usize>),
    /// Commit the header, with chunk rows `range` in the same transaction
    /// (empty for an inline state, whose bytes are in the header row, and for
    /// staged chunks).
    Commit(Range<usize>),
    /// The commit failed and may have been applied: read the header to learn
    /// whether it publishes this write's generation
    /// ([`WriteEvent::Resolved`]).
    Resolve,
    /// Delete this generation (the replaced one, or the new one after a failure).
    DeleteGeneration(String),
    /// The write is over.
    Finish(std::result::Result<Option<Etag>, WriteFailure>),
}

/// Why a write failed, as the machine sees it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum WriteFailure {
    /// The precondition failed (the etag found).
    Conflict(Option<Etag>),
    /// The commit's fence failed (the lease's fence token now).
    Fenced(Option<u64>),
    /// A table call failed and nothing was written (the caller keeps its error).
    Failed,
    /// The commit failed, and so did the read that would have told whether it
    /// was applied: the staged chunks are kept (a sweep removes them if they were
    /// not published).
    Unknown,
}

/// What happened to the last action.
#[derive(Clone, Debug)]
pub enum WriteEvent {
    /// Start.
    Start,
    /// A [`WriteAction::PutChunks`] succeeded.
    ChunksPut,
    /// The commit's outcome (the etag of the header written, the generation it
    /// replaced).
    Committed(Commit),
    /// The header read by [`WriteAction::Resolve`]: its generation and etag, if
    /// there is one.
    Resolved(Option<(String, Etag)>),
    /// A [`WriteAction::DeleteGeneration`] finished (ok or not: garbage only).
    Deleted,
    /// A table call failed (a commit that failed this way may have landed).
    Failed,
    /// A table call was refused before it reached the store (invalid input, an
    /// unsupported operation: an error that is not transient): nothing was
    /// written.
    Rejected,
    /// The commit failed in a way no read can decide, reported by the provider as
    /// [`Error::OutcomeUnknown`]: e.g. applied on a Redis primary that fewer
    /// replicas acknowledged than `wait_replicas` asks for, so a read now would
    /// find it although a failover may still lose it. The write ends
    /// [`WriteFailure::Unknown`], chunks kept.
    Undecidable,
}

/// Where a [`WriteMachine`] is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Phase {
    Staging,
    Committing,
    Resolving,
    Cleaning,
}

/// Where a state's bytes go, decided by its size against the provider's
/// [`StateLimits`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Layout {
    /// In the header row itself (at most one chunk's size): one conditional
    /// write, no chunk rows.
    Row,
    /// Chunk rows written in the header's transaction.
    Txn,
    /// Chunk rows staged in batches first, then published by the header.
    Staged,
}

/// The rules of one write (sans-io). A small state goes in its header row: the
/// write is one conditional write (no read before it, nothing to delete after
/// it unless the state it replaced had chunk rows). A larger one is chunked:
/// in the header's transaction when it fits one, else staged in batches first.
/// After the commit, the generation it replaced is deleted (the commit names
/// it); after a conflict or a failure that certainly wrote nothing, the staged
/// one.
///
/// A commit that fails with an error may still have been applied (a timeout, a
/// connection lost after the request was sent: Jepsen's "indeterminate"
/// operations). The machine then reads the header again ([`WriteAction::Resolve`]):
/// if it names this write's generation the write landed and succeeds with that
/// etag; if it names another (or none) it did not, and the staged chunks are
/// deleted; if that read fails too, the write fails with
/// [`WriteFailure::Unknown`] and deletes nothing.
#[derive(Debug)]
pub struct WriteMachine {
    limits: StateLimits,
    /// Byte ranges of the chunk rows (none for [`Layout::Row`]).
    chunks: Vec<Range<usize>>,
    generation: String,
    layout: Layout,
    phase: Phase,
    /// Chunks staged so far.
    staged: usize,
    batch: Range<usize>,
    replaced: Option<String>,
    outcome: Option<std::result::Result<Option<Etag>, WriteFailure>>,
}

/// What a header adds to its transaction besides the chunks, bytes (an upper
/// estimate: the envelope's JSON and the provider's key and attributes).
pub const HEADER_BYTES: usize = 512;

/// Where `len` bytes go on a provider with `limits`.
pub fn layout(len: usize, limits: StateLimits) -> Layout {
    let chunks = len.div_ceil(limits.chunk_bytes.max(1));
    if len <= limits.chunk_bytes && len + HEADER_BYTES <= limits.txn_bytes {
        Layout::Row
    } else if chunks < limits.txn_rows && len + HEADER_BYTES <= limits.txn_bytes {
        Layout::Txn
    } else {
        Layout::Staged
    }
}

impl WriteMachine {
    /// A write of `len` bytes under `generation`.
    ///
    /// # Errors
    /// [`Error::TooLarge`] over the provider's [`StateLimits::max_state_bytes`].
    pub fn new(key: &StateKey, len: usize, generation: String, limits: StateLimits) -> Result<WriteMachine> {
        if len as u64 > limits.max_state_bytes {
            return Err(Error::TooLarge {
                key: key.to_string(),
                size: len as u64,
                max: limits.max_state_bytes,
            });
        }
        let layout = layout(len, limits);
        let step = limits.chunk_bytes.max(1);
        let chunks: Vec<Range<usize>> = match layout {
            Layout::Row => Vec::new(),
            Layout::Txn | Layout::Staged => (0..len).step_by(step).map(|a| a..(a + step).min(len)).collect(),
        };
        Ok(WriteMachine {
            limits,
            chunks,
            generation,
            layout,
            phase: Phase::Staging,
            staged: 0,
            batch: 0..0,
            replaced: None,
            outcome: None,
        })
    }

    /// The chunk rows' byte ranges (none when the bytes go in the header row).
    pub fn chunk_ranges(&self) -> &[Range<usize>] {
        &self.chunks
    }

    /// Where the bytes go.
    pub fn layout(&self) -> Layout {
        self.layout
    }

    /// The new generation.
    pub fn generation(&self) -> &str {
        &self.generation
    }

    fn next_batch(&self) -> Range<usize> {
        let mut end = self.staged;
        let mut bytes = 0;
        while end < self.chunks.len() && end - self.staged < self.limits.txn_rows.max(1) {
            let b = self.chunks[end].len();
            if end > self.staged && bytes + b > self.limits.txn_bytes {
                break;
            }
            bytes += b;
            end += 1;
        }
        self.staged..end
    }

    /// The next action after `event`.
    pub fn handle(&mut self, event: WriteEvent) -> WriteAction {
        match event {
            WriteEvent::Start => self.stage_or_commit(),
            WriteEvent::ChunksPut => {
                self.staged = self.batch.end;
                self.stage_or_commit()
            }
            WriteEvent::Committed(Commit::Done { etags, replaced }) => {
                self.replaced = replaced
                    .into_iter()
                    .next()
                    .flatten()
                    .filter(|g| *g != self.generation);
                self.succeed(etags.into_iter().next().flatten())
            }
            WriteEvent::Committed(Commit::Conflict { current, .. }) => {
                self.fail(WriteFailure::Conflict(current))
            }
            WriteEvent::Committed(Commit::Fenced { current }) => self.fail(WriteFailure::Fenced(current)),
            WriteEvent::Resolved(Some((g, etag))) if g == self.generation => self.succeed(Some(etag)),
            WriteEvent::Resolved(_) | WriteEvent::Rejected => self.fail(WriteFailure::Failed),
            WriteEvent::Undecidable => {
                // No read can tell whether it lasts: keep the chunks, report it unknown.
                self.outcome = Some(Err(WriteFailure::Unknown));
                self.finish()
            }
            WriteEvent::Failed => match self.phase {
                Phase::Committing => {
                    self.phase = Phase::Resolving;
                    WriteAction::Resolve
                }
                Phase::Resolving => {
                    // Nobody knows whether the chunks are published: keep them.
                    self.outcome = Some(Err(WriteFailure::Unknown));
                    self.finish()
                }
                _ => self.fail(WriteFailure::Failed),
            },
            WriteEvent::Deleted => self.finish(),
        }
    }

    fn stage_or_commit(&mut self) -> WriteAction {
        if self.layout == Layout::Staged && self.staged < self.chunks.len() {
            self.phase = Phase::Staging;
            self.batch = self.next_batch();
            return WriteAction::PutChunks(self.batch.clone());
        }
        self.phase = Phase::Committing;
        match self.layout {
            Layout::Txn => WriteAction::Commit(0..self.chunks.len()),
            Layout::Row | Layout::Staged => WriteAction::Commit(0..0),
        }
    }

    fn succeed(&mut self, etag: Option<Etag>) -> WriteAction {
        self.outcome = Some(Ok(etag));
        match self.replaced.take() {
            Some(g) => {
                self.phase = Phase::Cleaning;
                WriteAction::DeleteGeneration(g)
            }
            None => self.finish(),
        }
    }

    fn fail(&mut self, why: WriteFailure) -> WriteAction {
        self.outcome = Some(Err(why));
        self.replaced = None;
        if self.layout == Layout::Staged && self.staged + self.batch.len() > 0 {
            // Staged chunks nobody will publish.
            self.staged = 0;
            self.batch = 0..0;
            self.phase = Phase::Cleaning;
            return WriteAction::DeleteGeneration(self.generation.clone());
        }
        self.finish()
    }

    fn finish(&mut self) -> WriteAction {
        WriteAction::Finish(self.outcome.take().unwrap_or(Err(WriteFailure::Failed)))
    }
}

#[cfg(test)]
mod tests {
    use super::super::tests::{key, LIMITS};
    use super::super::MAX_STATE_BYTES;
    use super::*;

    fn done(etag: &str, replaced: Option<&str>) -> Commit {
        Commit::Done {
            etags: vec![Some(Etag::new(etag))],
            replaced: vec![replaced.map(str::to_owned)],
        }
    }

    #[test]
    fn a_small_state_is_one_conditional_write_of_its_row() {
        let mut m = WriteMachine::new(&key(), 10, "g2".into(), LIMITS).unwrap();
        assert_eq!(m.layout(), Layout::Row);
        assert!(m.chunk_ranges().is_empty(), "no chunk rows");
        assert_eq!(
            m.handle(WriteEvent::Start),
            WriteAction::Commit(0..0),
            "no read before"
        );
        assert_eq!(
            m.handle(WriteEvent::Committed(done("e", None))),
            WriteAction::Finish(Ok(Some(Etag::new("e")))),
            "nothing to delete after"
        );
    }

    #[test]
    fn the_generation_a_commit_replaced_is_deleted() {
        let mut m = WriteMachine::new(&key(), 25, "g2".into(), LIMITS).unwrap();
        assert_eq!(m.layout(), Layout::Txn);
        assert_eq!(m.chunk_ranges(), &[0..10, 10..20, 20..25]);
        assert_eq!(m.handle(WriteEvent::Start), WriteAction::Commit(0..3));
        assert_eq!(
            m.handle(WriteEvent::Committed(done("e", Some("g1")))),
            WriteAction::DeleteGeneration("g1".into())
        );
        assert_eq!(
            m.handle(WriteEvent::Deleted),
            WriteAction::Finish(Ok(Some(Etag::new("e"))))
        );
    }

    #[test]
    fn a_large_state_is_staged_in_batches_and_a_conflict_deletes_them() {
        let mut m = WriteMachine::new(&key(), 95, "g2".into(), LIMITS).unwrap();
        assert_eq!(m.layout(), Layout::Staged);
        assert_eq!(m.handle(WriteEvent::Start), WriteAction::PutChunks(0..4));
        assert_eq!(m.handle(WriteEvent::ChunksPut), WriteAction::PutChunks(4..8));
        assert_eq!(m.handle(WriteEvent::ChunksPut), WriteAction::PutChunks(8..10));
        assert_eq!(m.handle(WriteEvent::ChunksPut), WriteAction::Commit(0..0));
        assert_eq!(
            m.handle(WriteEvent::Committed(Commit::Conflict {
                index: 0,
                current: Some(Etag::new("x"))
            })),
            WriteAction::DeleteGeneration("g2".into())
        );
        assert_eq!(
            m.handle(WriteEvent::Deleted),
            WriteAction::Finish(Err(WriteFailure::Conflict(Some(Etag::new("x")))))
        );
    }

    #[test]
    fn a_failed_staging_call_deletes_what_was_staged() {
        let mut m = WriteMachine::new(&key(), 95, "g2".into(), LIMITS).unwrap();
        m.handle(WriteEvent::Start);
        assert_eq!(
            m.handle(WriteEvent::Failed),
            WriteAction::DeleteGeneration("g2".into())
        );
        assert_eq!(
            m.handle(WriteEvent::Deleted),
            WriteAction::Finish(Err(WriteFailure::Failed))
        );
    }

    fn staged_to_commit() -> WriteMachine {
        let mut m = WriteMachine::new(&key(), 95, "g2".into(), LIMITS).unwrap();
        m.handle(WriteEvent::Start);
        m.handle(WriteEvent::ChunksPut);
        m.handle(WriteEvent::ChunksPut);
        assert_eq!(m.handle(WriteEvent::ChunksPut), WriteAction::Commit(0..0));
        m
    }

    /// A commit that errors may have landed: the machine reads the header before
    /// it deletes anything (the first version deleted the staged generation at
    /// once, and a commit that had landed read `Corrupt` for ever).
    #[test]
    fn a_failed_commit_that_landed_succeeds_and_keeps_its_chunks() {
        let mut m = staged_to_commit();
        assert_eq!(m.handle(WriteEvent::Failed), WriteAction::Resolve);
        assert_eq!(
            m.handle(WriteEvent::Resolved(Some(("g2".into(), Etag::new("e"))))),
            WriteAction::Finish(Ok(Some(Etag::new("e")))),
            "landed: ours stays"
        );
        // In the header row: the same.
        let mut m = WriteMachine::new(&key(), 5, "g2".into(), LIMITS).unwrap();
        assert_eq!(m.handle(WriteEvent::Start), WriteAction::Commit(0..0));
        assert_eq!(m.handle(WriteEvent::Failed), WriteAction::Resolve);
        assert_eq!(
            m.handle(WriteEvent::Resolved(Some(("g2".into(), Etag::new("e"))))),
            WriteAction::Finish(Ok(Some(Etag::new("e"))))
        );
    }

    #[test]
    fn a_failed_commit_that_did_not_land_deletes_what_it_staged() {
        for found in [Some(("g1".to_owned(), Etag::new("old"))), None] {
            let mut m = staged_to_commit();
            assert_eq!(m.handle(WriteEvent::Failed), WriteAction::Resolve);
            assert_eq!(
                m.handle(WriteEvent::Resolved(found)),
                WriteAction::DeleteGeneration("g2".into())
            );
            assert_eq!(
                m.handle(WriteEvent::Deleted),
                WriteAction::Finish(Err(WriteFailure::Failed))
            );
        }
    }

    #[test]
    fn a_refused_commit_wrote_nothing_and_is_not_resolved() {
        let mut m = staged_to_commit();
        assert_eq!(
            m.handle(WriteEvent::Rejected),
            WriteAction::DeleteGeneration("g2".into())
        );
        assert_eq!(
            m.handle(WriteEvent::Deleted),
            WriteAction::Finish(Err(WriteFailure::Failed))
        );
    }

    #[test]
    fn a_failed_commit_whose_outcome_cannot_be_read_deletes_nothing() {
        let mut m = staged_to_commit();
        assert_eq!(m.handle(WriteEvent::Failed), WriteAction::Resolve);
        assert_eq!(
            m.handle(WriteEvent::Failed),
            WriteAction::Finish(Err(WriteFailure::Unknown))
        );
    }

    /// A commit the provider calls undecidable (a Redis primary applied it, the
    /// replicas `wait_replicas` asks for did not acknowledge it) is not resolved
    /// by a read: the primary would say it landed whether or not a failover
    /// keeps it. It ends unknown, its chunks kept.
    #[test]
    fn an_undecidable_commit_is_unknown_without_a_read() {
        let mut m = staged_to_commit();
        assert_eq!(
            m.handle(WriteEvent::Undecidable),
            WriteAction::Finish(Err(WriteFailure::Unknown))
        );
        let mut m = WriteMachine::new(&key(), 5, "g2".into(), LIMITS).unwrap();
        assert_eq!(m.handle(WriteEvent::Start), WriteAction::Commit(0..0));
        assert_eq!(
            m.handle(WriteEvent::Undecidable),
            WriteAction::Finish(Err(WriteFailure::Unknown))
        );
    }

    #[test]
    fn a_provider_cap_below_the_maximum_is_enforced() {
        let capped = StateLimits {
            max_state_bytes: 100,
            ..LIMITS
        };
        assert!(WriteMachine::new(&key(), 100, "g".into(), capped).is_ok());
        let e = WriteMachine::new(&key(), 101, "g".into(), capped).unwrap_err();
        assert!(matches!(e, Error::TooLarge { max: 100, .. }), "{e}");
    }

    #[test]
    fn too_large_is_refused_before_anything() {
        let e = WriteMachine::new(&key(), MAX_STATE_BYTES as usize + 1, "g".into(), LIMITS).unwrap_err();
        assert!(matches!(e, Error::TooLarge { .. }));
    }
}
