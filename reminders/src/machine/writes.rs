//! Writes. [`WriteQueue`] is the bookkeeping (pure): the `last_fired` writes, one-shot removals and
//! parked occurrences a silo still has to make, one per reminder, at most
//! [`MAX_WRITES`] in flight, failures retried after a backoff; and
//! [`apply_write`], which carries one out against the tables.

use std::collections::BTreeMap;

use rollcall_core::{Etag, ReminderEntry, Timestamp};

use super::{Action, ReminderMachine, Timer};
use crate::api::{Counters, ReminderError};
use crate::queue::{key_of, Key};

/// `last_fired` writes and one-shot removals running at once.
pub const MAX_WRITES: usize = 16;
/// Parked occurrences waiting to be written (the store is out or slow), at
/// most: one more is dropped instead, counted and logged as an error.
pub const MAX_PARKED: usize = 1024;

/// A table write the machine asks for.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Write {
    /// `update_last_fired(actor, name, etag, at)` (a `FireOnce` reminder ticked).
    LastFired {
        /// The reminder.
        key: Key,
        /// The row's etag when it was scheduled.
        etag: Etag,
        /// The time of the delivery.
        at: Timestamp,
    },
    /// `remove_row(actor, name, etag)` (a one-shot reminder ticked).
    Remove {
        /// The reminder.
        key: Key,
        /// The row's etag when it was scheduled.
        etag: Etag,
    },
    /// `upsert_row(row)` into the service's parked table
    /// ([`parked_service_id`](rollcall_core::parked_service_id)):
    /// an occurrence whose retry policy is spent and says park. Idempotent (the
    /// row's name holds the occurrence), so a write that may have landed is
    /// simply written again.
    Park {
        /// The parked occurrence as a one-shot row.
        row: Box<ReminderEntry>,
    },
}

/// The writes still to make (see the module docs). Removals go first, then
/// parked occurrences, then `last_fired` writes, each in key order.
#[derive(Debug, Default)]
pub(crate) struct WriteQueue {
    last_fired: BTreeMap<Key, (Etag, Timestamp)>,
    removals: BTreeMap<Key, Etag>,
    /// One-shot removals in flight.
    removing: BTreeMap<Key, Etag>,
    /// By their parked row's key, at most [`MAX_PARKED`].
    parks: BTreeMap<Key, Box<ReminderEntry>>,
    in_flight: usize,
    /// A retry timer is armed: nothing is sent until it fires.
    retrying: bool,
    failures: u32,
}

impl WriteQueue {
    /// Writes in flight.
    pub(crate) fn in_flight(&self) -> usize {
        self.in_flight
    }

    /// Parked occurrences waiting to be written.
    pub(crate) fn parks_waiting(&self) -> usize {
        self.parks.len()
    }

    /// `key` (a `FireOnce` reminder under `etag`) was delivered at `at`.
    pub(crate) fn fired(&mut self, key: &Key, etag: Etag, at: Timestamp) {
        self.last_fired.insert(key.clone(), (etag, at));
    }

    /// The `last_fired` time still to write for `key` under `etag`.
    pub(crate) fn fired_at(&self, key: &Key, etag: &Etag) -> Option<Timestamp> {
        self.last_fired
            .get(key)
            .filter(|(e, _)| e == etag)
            .map(|(_, at)| *at)
    }

    /// Row `key` under `etag` is to be removed.
    pub(crate) fn remove(&mut self, key: &Key, etag: Etag) {
        self.removals.insert(key.clone(), etag);
    }

    /// Forgets the `last_fired` write of `key` (its row is removed).
    pub(crate) fn unfire(&mut self, key: &Key) {
        self.last_fired.remove(key);
    }

    /// Whether row `key` under `etag` is being removed or is to be.
    pub(crate) fn removing(&self, key: &Key, etag: &Etag) -> bool {
        self.removals.get(key) == Some(etag) || self.removing.get(key) == Some(etag)
    }

    /// Parks `row`; false (and nothing parked) when [`MAX_PARKED`] wait
    /// already.
    pub(crate) fn park(&mut self, row: ReminderEntry) -> bool {
        if self.parks.len() >= MAX_PARKED {
            return false;
        }
        self.parks.insert(key_of(&row), Box::new(row));
        true
    }

    /// The next write to send, while fewer than [`MAX_WRITES`] are in flight
    /// and no retry is armed.
    pub(crate) fn next(&mut self) -> Option<Write> {
        if self.retrying || self.in_flight >= MAX_WRITES {
            return None;
        }
        let write = if let Some((key, etag)) = self.removals.pop_first() {
            self.removing.insert(key.clone(), etag.clone());
            Write::Remove { key, etag }
        } else if let Some((_, row)) = self.parks.pop_first() {
            Write::Park { row }
        } else if let Some((key, (etag, at))) = self.last_fired.pop_first() {
            Write::LastFired { key, etag, at }
        } else {
            return None;
        };
        self.in_flight += 1;
        Some(write)
    }

    /// `write` ended, `ok` or not. A failed write is queued again (unless a
    /// newer one of its reminder is); returns the number of failures in a row
    /// when a retry timer is to be armed (the first failure since the last
    /// retry).
    pub(crate) fn written(&mut self, write: Write, ok: bool) -> Option<u32> {
        self.in_flight = self.in_flight.saturating_sub(1);
        if let Write::Remove { key, .. } = &write {
            self.removing.remove(key);
        }
        if ok {
            self.failures = 0;
            return None;
        }
        match write {
            Write::Remove { key, etag } => {
                self.removals.entry(key).or_insert(etag);
            }
            Write::LastFired { key, etag, at } => {
                self.last_fired.entry(key).or_insert((etag, at));
            }
            Write::Park { row } => {
                self.parks.entry(key_of(&row)).or_insert(row);
            }
        }
        self.failures += 1;
        (!std::mem::replace(&mut self.retrying, true)).then_some(self.failures)
    }

    /// The retry timer fired: writes may be sent again.
    pub(crate) fn retry(&mut self) {
        self.retrying = false;
    }
}

/// Carries out `write` on `table` (`remove_row` or `update_last_fired`), or on
/// `parked`, the service's parked table (`upsert_row`; none when the service id
/// is too long for one: the tick is dropped with an error log).
///
/// # Errors
/// The table's error; the caller bounds the call with its timeout.
#[cfg(any(feature = "runtime", feature = "sim"))]
pub(crate) async fn apply_write(
    table: &dyn rollcall_core::ReminderTable,
    parked: Option<&dyn rollcall_core::ReminderTable>,
    write: &Write,
    fence: Option<&rollcall_core::Fence>,
) -> rollcall_core::Result<()> {
    match write {
        Write::Park { row } => match parked {
            Some(parked) => parked.upsert_row(row).await.map(drop),
            None => {
                // A service id too long for the parked one (over 249 bytes).
                tracing::error!(actor = %row.actor_id, name = %row.name,
                    "reminder tick dropped: this service has no parked table (its id is too long)");
                Ok(())
            }
        },
        Write::Remove { key, etag } => table
            .remove_row(key.actor(), key.name(), etag, fence)
            .await
            .map(drop),
        Write::LastFired { key, etag, at } => table
            .update_last_fired(key.actor(), key.name(), etag, *at, fence)
            .await
            .map(drop),
    }
}

impl ReminderMachine {
    /// Asks for the writes the queue lets out.
    pub(super) fn pump_writes(&mut self) {
        while let Some(write) = self.writes.next() {
            let fence = match &write {
                Write::Park { .. } => None,
                Write::Remove { key, .. } | Write::LastFired { key, .. } => {
                    match self.fence_of(key.actor()) {
                        Some(f) => Some(f),
                        None => {
                            // The shard is no longer held here: its release named
                            // a pending removal `done`, and its next holder
                            // writes what it needs; a write now could only be
                            // refused.
                            self.writes.written(write, true);
                            continue;
                        }
                    }
                }
            };
            self.out.push(Action::Write(write, fence));
        }
    }

    pub(super) fn written(&mut self, write: Write, result: Result<(), ReminderError>) {
        if let Err(ReminderError::Table(rollcall_core::Error::Fenced { shard, epoch, .. })) = &result {
            // The store's lease is not this silo's acquire: read it again at
            // once (shards rule 10: an acquire a store failover lost is
            // written again). The write is retried after the backoff, under
            // the fence this silo then holds; once the shard is no longer
            // held here it is dropped instead (`pump_writes`): its new holder
            // writes what it needs (issue 72, item 5).
            self.feed_shards(crate::shards::ShardEvent::Fenced {
                shard: *shard,
                epoch: *epoch,
            });
        }
        let Err(err) = result else {
            let quiet = self.loads.idle() && self.notices.in_flight() == 0;
            if let (Write::Remove { key, etag }, false) = (&write, quiet) {
                // A load or a notice read that read the row before this
                // landed skips it (with none running, none can have).
                self.notices.removed(key.clone(), etag.clone());
            }
            self.writes.written(write, true);
            self.pump_writes();
            return;
        };
        Counters::bump(&self.counters.write_failures);
        if let Some(failures) = self.writes.written(write, false) {
            let wait = super::backoff(failures, &mut self.rng);
            tracing::warn!(error = %err, retry_in = ?wait, "recording a reminder tick failed; retrying");
            self.out
                .push(Action::SetTimer(Timer::WriteRetry, self.now.saturating_add(wait)));
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn k(n: &str) -> Key {
        Key::new("k/a", n)
    }

    fn t(ms: u64) -> Timestamp {
        Timestamp::from_millis(ms)
    }

    #[test]
    fn removals_go_first() {
        let mut q = WriteQueue::default();
        q.fired(&k("a"), Etag::new("1"), t(5));
        q.fired(&k("b"), Etag::new("1"), t(6));
        assert_eq!(q.fired_at(&k("a"), &Etag::new("1")), Some(t(5)));
        assert_eq!(q.fired_at(&k("a"), &Etag::new("2")), None);
        q.unfire(&k("b"));
        q.remove(&k("b"), Etag::new("1"));
        assert!(matches!(q.next(), Some(Write::Remove { key, .. }) if key == k("b")));
        assert!(q.removing(&k("b"), &Etag::new("1")), "in flight counts");
        assert!(matches!(q.next(), Some(Write::LastFired { key, .. }) if key == k("a")));
        assert_eq!(q.next(), None);
        assert_eq!(q.in_flight(), 2);
    }

    #[test]
    fn at_most_max_writes_run_at_once() {
        let mut q = WriteQueue::default();
        for i in 0..MAX_WRITES + 3 {
            q.fired(&k(&i.to_string()), Etag::new("1"), t(1));
        }
        let sent: Vec<Write> = std::iter::from_fn(|| q.next()).collect();
        assert_eq!(sent.len(), MAX_WRITES);
        assert_eq!(q.written(sent[0].clone(), true), None);
        assert!(q.next().is_some(), "room again");
        assert_eq!(q.next(), None);
    }

    #[test]
    fn a_failure_arms_one_retry_and_keeps_the_write() {
        let mut q = WriteQueue::default();
        q.fired(&k("a"), Etag::new("1"), t(1));
        q.fired(&k("b"), Etag::new("1"), t(1));
        let (a, b) = (q.next().unwrap(), q.next().unwrap());
        assert_eq!(q.written(a, false), Some(1), "the first failure arms the timer");
        assert_eq!(q.written(b, false), None, "already armed");
        assert_eq!(q.next(), None, "nothing is sent before the retry");
        q.retry();
        assert!(q.next().is_some() && q.next().is_some() && q.next().is_none());
    }

    #[test]
    fn a_failed_write_does_not_replace_a_newer_one() {
        let mut q = WriteQueue::default();
        q.fired(&k("a"), Etag::new("1"), t(1));
        let old = q.next().unwrap();
        q.fired(&k("a"), Etag::new("1"), t(2));
        q.written(old, false);
        q.retry();
        assert!(matches!(q.next(), Some(Write::LastFired { at, .. }) if at == t(2)));
    }

    #[test]
    fn parks_are_bounded() {
        let mut q = WriteQueue::default();
        for i in 0..MAX_PARKED {
            let row = ReminderEntry::new("svc", "k/a", format!("r@{i}"), t(1), None);
            assert!(q.park(row));
        }
        let row = ReminderEntry::new("svc", "k/a", "one too many", t(1), None);
        assert!(!q.park(row));
        assert_eq!(q.parks_waiting(), MAX_PARKED);
        assert!(matches!(q.next(), Some(Write::Park { .. })));
    }
}
