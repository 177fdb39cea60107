//! Shard loads. [`Loads`] is the bookkeeping (pure): which loads wait, run or
//! failed, the pieces each still has to read and how wide the next one is. At
//! most [`MAX_LOADS`] run at once, at most one per shard and kind; a failed
//! piece is read again after a backoff (one timer for every load that failed
//! meanwhile). The machine's part plans what an acquire or refresh load reads
//! and collects what a final load finds owed ([`crate::handoff`]).

use std::collections::{BTreeMap, VecDeque};
use std::time::Duration;

use rand::rngs::StdRng;
use rollcall_core::lease::LeaseException;
use rollcall_core::{ReminderEntry, Timestamp};

use super::{Action, ReminderMachine, Timer};
use crate::api::{Counters, ReminderError};
use crate::handoff::{HeldShard, Seen};
use crate::queue::key_of;
use crate::schedule::Learned;
use crate::shards::{shard_range, ShardEvent};
use rollcall_core::ownership::ring::RingRange;

/// Shard loads running at once.
pub const MAX_LOADS: usize = 16;
/// About how many rows a load reads with one `read_rows_in_range` and handles in
/// one event: the width of the next piece follows the density read so far.
pub const LOAD_PIECE_ROWS: u64 = 2048;
/// The narrowest piece (1/65,536 of the ring).
const MIN_PIECE_WIDTH: u32 = 1 << 16;
/// Longest wait between retries of a failed load: 5 s.
pub const MAX_LOAD_BACKOFF: Duration = Duration::from_secs(5);

/// The id of one shard load, echoed by [`Event::PieceRead`](super::Event::PieceRead)
/// (not the lease epoch: a shard is loaded many times under one epoch).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct LoadId(pub u32);

/// What a shard load is for.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum LoadKind {
    /// After an acquire: plan every row from the lease.
    Acquire,
    /// The periodic reconciliation.
    Refresh,
    /// Before a release: find what was not delivered.
    Final,
}

/// A shard load: the pieces of the shard still to read.
#[derive(Debug)]
pub(crate) struct LoadRun {
    pub(crate) shard: u32,
    pub(crate) kind: LoadKind,
    /// Its id, written into the queue slot of every row it reads.
    pub(crate) id: LoadId,
    /// The machine's change count when it started: slots touched after that
    /// are newer than what it reads.
    pub(crate) since: u64,
    left: VecDeque<RingRange>,
    width: u32,
    pub(crate) rows: u64,
    pub(crate) started: Timestamp,
    /// A final load's findings.
    pub(crate) exceptions: Vec<LeaseException>,
    /// Another load of the shard was asked for while this one ran: this one
    /// may have read past a row written since, so the shard is read again
    /// once it ends.
    pub(crate) again: bool,
}

/// What a load does next ([`Loads::next_piece`]).
#[derive(Debug)]
pub(crate) enum Step {
    /// Read this piece, cut at this width.
    Read(RingRange, u32),
    /// Nothing is left to read: the load ended.
    Done(LoadRun),
}

/// The loads of one machine (see the module docs).
#[derive(Debug, Default)]
pub(crate) struct Loads {
    pending: VecDeque<(u32, LoadKind)>,
    running: BTreeMap<LoadId, LoadRun>,
    failed: Vec<LoadRun>,
    last_id: u32,
    failures: u32,
    retrying: bool,
    first_done: bool,
}

impl Loads {
    /// Asks for a `kind` load of shard `k`. One that waits already covers it;
    /// one that runs (or failed) is marked to run again after it ends, since it
    /// may have read past a row written since. Two loads of one shard never
    /// run at once: each drops the slots it did not see.
    pub(crate) fn queue(&mut self, k: u32, kind: LoadKind) {
        if self.pending.iter().any(|(s, kd)| *s == k && *kd == kind) {
            return;
        }
        let again = |r: &mut LoadRun| {
            if r.shard == k && r.kind == kind {
                r.again = kind != LoadKind::Final;
                true
            } else {
                false
            }
        };
        let mut busy = false;
        for r in self.running.values_mut() {
            busy |= again(r);
        }
        for r in &mut self.failed {
            busy |= again(r);
        }
        if !busy {
            self.pending.push_back((k, kind));
        }
    }

    /// Asks for a final load of shard `k`, ahead of every other.
    pub(crate) fn queue_final(&mut self, k: u32) {
        self.pending.push_front((k, LoadKind::Final));
    }

    /// Forgets every load of shard `k`, waiting, running or failed.
    pub(crate) fn cancel(&mut self, k: u32) {
        self.pending.retain(|(s, _)| *s != k);
        self.running.retain(|_, r| r.shard != k);
        self.failed.retain(|r| r.shard != k);
    }

    /// Starts waiting loads of shards still `held` while fewer than
    /// [`MAX_LOADS`] run and no retry is armed; each reads `range(shard)`.
    /// Returns the loads started, whose first piece is to be read.
    pub(crate) fn start(
        &mut self,
        held: impl Fn(u32) -> bool,
        range: impl Fn(u32) -> RingRange,
        since: u64,
        now: Timestamp,
    ) -> Vec<LoadId> {
        let mut started = Vec::new();
        while !self.retrying && self.running.len() < MAX_LOADS {
            let Some((k, kind)) = self.pending.pop_front() else {
                break;
            };
            if !held(k) {
                continue;
            }
            self.last_id = self.last_id.wrapping_add(1).max(1);
            let id = LoadId(self.last_id);
            let run = LoadRun {
                shard: k,
                kind,
                id,
                since,
                left: VecDeque::from([range(k)]),
                width: u32::MAX,
                rows: 0,
                started: now,
                exceptions: Vec::new(),
                again: false,
            };
            self.running.insert(id, run);
            started.push(id);
        }
        started
    }

    /// The next piece of load `id`, or its end (`None`: no such load runs).
    pub(crate) fn next_piece(&mut self, id: LoadId) -> Option<Step> {
        let run = self.running.get_mut(&id)?;
        let Some(range) = run.left.pop_front() else {
            return self.running.remove(&id).map(Step::Done);
        };
        let (piece, rest) = range.cut(run.width);
        if let Some(rest) = rest {
            run.left.push_front(rest);
        }
        Some(Step::Read(piece, run.width))
    }

    /// The running load `id`, if it runs.
    pub(crate) fn running(&mut self, id: LoadId) -> Option<&mut LoadRun> {
        self.running.get_mut(&id)
    }

    /// `piece` of load `id`, cut at `width`, read `rows` rows: the next piece
    /// is cut for about [`LOAD_PIECE_ROWS`] at that density.
    pub(crate) fn read(&mut self, id: LoadId, piece: RingRange, width: u32, rows: usize) {
        let Some(run) = self.running.get_mut(&id) else {
            return;
        };
        self.failures = 0;
        run.rows += rows as u64;
        let w = u64::from(width);
        let next = match rows as u64 {
            0 => w.saturating_mul(8),
            n => (piece.size() * LOAD_PIECE_ROWS / n).clamp(w / 8, w.saturating_mul(8)),
        };
        run.width = next.clamp(u64::from(MIN_PIECE_WIDTH), u64::from(u32::MAX)) as u32;
    }

    /// Reading `piece` of load `id` failed: the load waits for the retry. The
    /// wait to arm (full jitter, at most `cap`) when this is the first failure
    /// of a retry round, else none (the loads running fail together).
    pub(crate) fn failed(
        &mut self,
        id: LoadId,
        piece: RingRange,
        rng: &mut StdRng,
        cap: Duration,
    ) -> Option<Duration> {
        let mut run = self.running.remove(&id)?;
        run.left.push_front(piece);
        self.failed.push(run);
        if std::mem::replace(&mut self.retrying, true) {
            return None;
        }
        self.failures += 1;
        Some(super::backoff(self.failures, rng).min(MAX_LOAD_BACKOFF).min(cap))
    }

    /// The retry timer fired: the failed loads run again. Returns them, whose
    /// next piece is to be read.
    pub(crate) fn retry(&mut self) -> Vec<LoadId> {
        self.retrying = false;
        let mut again = Vec::new();
        for run in std::mem::take(&mut self.failed) {
            again.push(run.id);
            self.running.insert(run.id, run);
        }
        again
    }

    /// Whether no load waits or runs.
    /// The earliest `since` of the loads running (`None`: none runs): a
    /// deletion or removal recorded after it may still be read by one.
    pub(crate) fn oldest_since(&self) -> Option<u64> {
        self.running.values().map(|r| r.since).min()
    }

    pub(crate) fn idle(&self) -> bool {
        self.running.is_empty() && self.pending.is_empty()
    }

    /// Whether the first loads are done: true once, the first time no load
    /// waits or runs after the shards `settled`. `settled` is asked only until
    /// then (it looks at every shard: once per event would be costly).
    pub(crate) fn first_done(&mut self, settled: impl FnOnce() -> bool) -> bool {
        if self.first_done || !self.idle() || !settled() {
            return false;
        }
        self.first_done = true;
        true
    }

    /// Whether [`first_done`](Self::first_done) said so already.
    pub(crate) fn loaded_once(&self) -> bool {
        self.first_done
    }
}

impl ReminderMachine {
    /// Starts the loads that wait, while there is room.
    pub(super) fn start_loads(&mut self) {
        let (held, count) = (&self.held, self.shards.shard_count());
        let started = self.loads.start(
            |k| held.contains_key(&k),
            |k| shard_range(k, count),
            self.notices.changes(),
            self.now,
        );
        for load in started {
            self.next_piece(load);
        }
    }

    /// Reads the next piece of `load`, or ends it.
    pub(super) fn next_piece(&mut self, load: LoadId) {
        match self.loads.next_piece(load) {
            None => {}
            Some(Step::Read(piece, width)) => self.out.push(Action::ReadPiece { load, piece, width }),
            Some(Step::Done(run)) => {
                self.load_finished(run);
                self.start_loads();
            }
        }
    }

    pub(super) fn piece_read(
        &mut self,
        load: LoadId,
        piece: RingRange,
        width: u32,
        result: Result<Vec<ReminderEntry>, ReminderError>,
    ) {
        let Some(run) = self.loads.running(load) else {
            return;
        };
        let (k, kind, since) = (run.shard, run.kind, run.since);
        let rows = match result {
            Ok(rows) => rows,
            Err(e) => {
                // Read the piece again after a backoff.
                let cap = self.options.refresh_reminder_list_period;
                if let Some(wait) = self.loads.failed(load, piece, &mut self.rng, cap) {
                    Counters::bump(&self.counters.load_failures);
                    tracing::warn!(silo = %self.me, error = %e, retry_in = ?wait,
                        "loading reminders failed; the schedule in memory keeps ticking");
                    self.out
                        .push(Action::SetTimer(Timer::LoadRetry, self.now.saturating_add(wait)));
                }
                return;
            }
        };
        self.loads.read(load, piece, width, rows.len());
        for row in rows {
            let key = key_of(&row);
            if self.writes.removing(&key, &row.etag) {
                // Delivered to its end here, its removal pending: a release
                // names it done where an unnamed row would start over.
                if kind == LoadKind::Final {
                    let listed_from = self
                        .held
                        .get(&k)
                        .and_then(|h| h.listing_from(self.shards.max_clock_offset()));
                    if let Some(e) = HeldShard::delivered(&row, listed_from) {
                        if let Some(run) = self.loads.running(load) {
                            run.exceptions.push(e);
                        }
                    }
                }
                continue;
            }
            if self.notices.deleted_since(&key, since) {
                continue; // deleted after this load started
            }
            if self.notices.removed_since(&key, &row.etag, since) {
                continue; // a one-shot delivered here, removed after this load started
            }
            if kind == LoadKind::Final {
                let seen = self
                    .queue
                    .get(&key)
                    .filter(|slot| slot.etag == row.etag.as_str())
                    .map(|slot| Seen {
                        scheduled: slot.next.scheduled,
                        delivering: slot.delivering,
                    });
                let owed = self.held.get(&k).and_then(|h| {
                    let listed_from = h.listing_from(self.shards.max_clock_offset());
                    h.owed(&row, seen, listed_from)
                });
                if let Some(e) = owed {
                    if let Some(run) = self.loads.running(load) {
                        run.exceptions.push(e);
                    }
                }
                continue;
            }
            match self.queue.get_mut(&key) {
                Some(slot)
                    if (slot.etag == row.etag.as_str() && row.paused.is_none()) || slot.touched > since =>
                {
                    slot.seen = load.0;
                }
                _ => {
                    self.schedule_row(k, row, Learned::Load);
                    if let Some(slot) = self.queue.get_mut(&key) {
                        slot.seen = load.0;
                    }
                }
            }
        }
        self.publish_gauges();
        self.next_piece(load);
    }

    fn load_finished(&mut self, run: LoadRun) {
        let k = run.shard;
        let Some(held) = self.held.get_mut(&k) else {
            return;
        };
        match run.kind {
            LoadKind::Final => {
                // Every owed reminder, however many: what does not fit the
                // lease row goes to its pages (`ShardLeases::write`).
                let exceptions = run.exceptions;
                // The watermark is the latest occurrence started, not the
                // stop: a row registered after the final read whose first
                // tick is before the stop was never seen here, and the next
                // holder plans it from the watermark (the rows seen owe
                // their own exceptions up to the stop).
                let started_through = held.started_through;
                let listed_from = held.listing_from(self.shards.max_clock_offset());
                self.drop_shard(k);
                let event = ShardEvent::Stopped {
                    shard: k,
                    started_through,
                    exceptions,
                    listed_from,
                };
                self.feed_shards(event);
            }
            LoadKind::Acquire | LoadKind::Refresh => {
                held.rows = run.rows;
                held.known_from = held.known_from.max(Some(run.started));
                if run.again {
                    held.reread = true;
                }
                let (id, since) = (run.id, run.since);
                // Slots of the shard the load did not read were deleted.
                let hashes = self.hashes(k);
                self.queue
                    .retain_hashes(hashes, |s| s.seen == id.0 || s.touched > since);
                // Forget what no running load can have read past: a load that
                // started before this one may still be running (sweep seed
                // 1087: a later load's end forgot a removal an earlier load,
                // still reading, needed, and the one-shot went out twice).
                // A notice read in flight may have read past any of them.
                let none_running = if self.notices.in_flight() > 0 { 0 } else { u64::MAX };
                self.notices
                    .loaded(self.loads.oldest_since().unwrap_or(none_running));
                if run.kind == LoadKind::Acquire {
                    let held = self.held.get_mut(&k).expect("present");
                    held.loaded = true;
                    held.exceptions.clear();
                    let waiting = std::mem::take(&mut held.waiting);
                    let now = self.now;
                    for key in waiting {
                        if let Some(slot) = self.queue.get_mut(&key) {
                            // An occurrence that fell due while the load ran
                            // waited for it, not for a handler: it goes on in
                            // turn through what fell due until now (a slow
                            // store; a takeover owes everything from its
                            // takeover time on).
                            if slot.next.scheduled < now {
                                slot.catch_up_to = slot.catch_up_to.max(now);
                            }
                            let next = slot.next;
                            self.queue.requeue(&key, next);
                        }
                    }
                    self.feed_shards(ShardEvent::Loaded {
                        shard: k,
                        read_from: run.started,
                    });
                }
                if let Some(h) = self.held.get_mut(&k).filter(|h| h.loaded && !h.stopping) {
                    if std::mem::take(&mut h.reread) {
                        self.loads.queue(k, LoadKind::Refresh);
                    }
                }
                let owned: u64 = self.held.values().map(|h| h.rows).sum();
                self.counters
                    .owned
                    .store(owned, std::sync::atomic::Ordering::Relaxed);
                self.out.push(Action::Owned(owned));
                self.publish_gauges();
            }
        }
    }

    /// A load round: every held and loaded shard is read again; shards still
    /// loading are read again once loaded (their load may have read before the
    /// registrations whose notices were dropped).
    pub(super) fn refresh_now(&mut self) {
        Counters::bump(&self.counters.loads);
        for h in self.held.values_mut().filter(|h| !h.loaded && !h.stopping) {
            h.reread = true;
        }
        let loaded: Vec<u32> = self
            .held
            .iter()
            .filter(|(_, h)| h.loaded && !h.stopping)
            .map(|(k, _)| *k)
            .collect();
        for k in loaded {
            self.loads.queue(k, LoadKind::Refresh);
        }
        self.start_loads();
    }
}

#[cfg(test)]
mod tests {
    use rand::SeedableRng;

    use super::*;

    fn whole() -> RingRange {
        RingRange { begin: 0, end: 0 }
    }

    fn start(l: &mut Loads) -> Vec<LoadId> {
        l.start(|_| true, |_| whole(), 0, Timestamp::EPOCH)
    }

    /// Regression: benchmark R5 (a registration burst on silo processes) found
    /// a refresh asked for while one of the same shard ran folded into it; the
    /// running load could have read past the new row, which then waited for
    /// the next periodic refresh, 5 minutes later.
    #[test]
    fn one_load_per_shard_and_kind_and_a_running_one_runs_again() {
        let mut l = Loads::default();
        l.queue(1, LoadKind::Refresh);
        l.queue(1, LoadKind::Refresh);
        let ids = start(&mut l);
        assert_eq!(ids.len(), 1);
        l.queue(1, LoadKind::Refresh);
        assert!(l.running(ids[0]).unwrap().again, "marked, not queued");
        assert!(start(&mut l).is_empty());
        l.queue(1, LoadKind::Final);
        assert_eq!(start(&mut l).len(), 1, "another kind is another load");
    }

    #[test]
    fn at_most_max_loads_run_and_unheld_shards_are_skipped() {
        let mut l = Loads::default();
        for k in 0..(MAX_LOADS as u32 + 4) {
            l.queue(k, LoadKind::Acquire);
        }
        let ids = l.start(|k| k != 0, |_| whole(), 0, Timestamp::EPOCH);
        assert_eq!(ids.len(), MAX_LOADS);
        assert!(ids.iter().all(|id| l.running(*id).unwrap().shard != 0));
        l.cancel(1);
        assert_eq!(start(&mut l).len(), 1, "a cancelled load frees its place");
    }

    #[test]
    fn pieces_follow_the_density_read() {
        let mut l = Loads::default();
        l.queue(0, LoadKind::Acquire);
        let id = start(&mut l)[0];
        let Some(Step::Read(piece, width)) = l.next_piece(id) else {
            panic!("a first piece")
        };
        assert_eq!(width, u32::MAX);
        l.read(id, piece, width, 4 * LOAD_PIECE_ROWS as usize);
        let Some(Step::Read(next, narrower)) = l.next_piece(id) else {
            panic!("more to read")
        };
        assert!(narrower < width / 2, "{narrower}");
        l.read(id, next, narrower, 0);
        let mut steps = 0;
        while let Some(Step::Read(p, w)) = l.next_piece(id) {
            l.read(id, p, w, 0);
            steps += 1;
        }
        assert!(steps < 16, "an empty shard widens the pieces: {steps}");
        assert!(l.idle());
    }

    #[test]
    fn failures_arm_one_retry_per_round() {
        let mut rng = StdRng::seed_from_u64(1);
        let mut l = Loads::default();
        l.queue(0, LoadKind::Acquire);
        l.queue(1, LoadKind::Acquire);
        let ids = start(&mut l);
        let pieces: Vec<_> = ids
            .iter()
            .map(|id| match l.next_piece(*id) {
                Some(Step::Read(p, _)) => p,
                other => panic!("{other:?}"),
            })
            .collect();
        let cap = Duration::from_secs(60);
        assert!(l.failed(ids[0], pieces[0], &mut rng, cap).unwrap() <= MAX_LOAD_BACKOFF);
        assert_eq!(l.failed(ids[1], pieces[1], &mut rng, cap), None);
        l.queue(2, LoadKind::Acquire);
        assert!(start(&mut l).is_empty(), "nothing starts before the retry");
        assert!(!l.idle());
        assert_eq!(l.retry(), ids);
        assert!(matches!(l.next_piece(ids[0]), Some(Step::Read(p, _)) if p == pieces[0]));
    }

    #[test]
    fn the_first_loads_are_done_once() {
        let mut l = Loads::default();
        assert!(!l.first_done(|| false));
        l.queue(0, LoadKind::Acquire);
        assert!(!l.first_done(|| true));
        let id = start(&mut l)[0];
        while let Some(Step::Read(p, w)) = l.next_piece(id) {
            l.read(id, p, w, 0);
        }
        assert!(l.first_done(|| true));
        assert!(!l.first_done(|| panic!("not asked once done")));
        assert!(l.loaded_once());
    }
}
