//! Deterministic virtual time for driving sans-io machines (feature `sim`): the
//! harness the membership and reminder property tests share.
//!
//! A [`Scheduler`] holds the events still to happen, each for one node (an index
//! the caller chooses) at a virtual time in ms, and hands them out in time order
//! (ties in the order they were pushed). Every random choice of a world (latencies,
//! losses, faults) comes from its seeded RNG, so a run is a function of the seed
//! and the scenario, and a failing seed replays exactly. [`now_or_fail`] runs a
//! future that completes without waiting, as the in-memory tables' do, so a world
//! can execute table actions on the real provider.
//!
//! Nothing here knows a machine: a world pushes the events its executor would
//! produce (results after a latency, timers at their time) and feeds what
//! [`Scheduler::next_until`] returns to the machine of that node.

use std::collections::BTreeMap;
use std::future::Future;
use std::pin::pin;
use std::task::{Context, Poll, Waker};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::Timestamp;

/// The wall-clock time at virtual time 0 (ms since the Unix epoch; November 2026).
pub const T0_MS: u64 = 1_795_000_000_000;

/// Events for nodes, in virtual time (ms from [`T0_MS`]); see the module docs.
pub struct Scheduler<E> {
    now: u64,
    order: u64,
    queue: BTreeMap<(u64, u64), (usize, E)>,
    rng: StdRng,
    jitter_ms: u64,
}

impl<E> Scheduler<E> {
    /// An empty scheduler at virtual time 0 whose RNG is seeded with `seed` and
    /// whose [`latency`](Self::latency) is 1 to `1 + jitter_ms` ms.
    pub fn new(seed: u64, jitter_ms: u64) -> Self {
        Scheduler {
            now: 0,
            order: 0,
            queue: BTreeMap::new(),
            rng: StdRng::seed_from_u64(seed),
            jitter_ms,
        }
    }

    /// Virtual time now, ms.
    pub fn now_ms(&self) -> u64 {
        self.now
    }

    /// The wall-clock time now ([`T0_MS`] plus the virtual time).
    pub fn time(&self) -> Timestamp {
        Timestamp::from_millis(T0_MS + self.now)
    }

    /// The wall-clock time of virtual time `ms`.
    pub fn time_at(ms: u64) -> Timestamp {
        Timestamp::from_millis(T0_MS + ms)
    }

    /// `event` for `node`, `after_ms` from now.
    pub fn push(&mut self, after_ms: u64, node: usize, event: E) {
        self.push_at(self.now + after_ms, node, event);
    }

    /// `event` for `node` at virtual time `at_ms` (now if that has passed).
    pub fn push_at(&mut self, at_ms: u64, node: usize, event: E) {
        self.order += 1;
        self.queue
            .insert((at_ms.max(self.now), self.order), (node, event));
    }

    /// The next event due at or before `until_ms` with its node, the clock moved to
    /// its time; `None` (the clock moved to `until_ms`) when there is none.
    pub fn next_until(&mut self, until_ms: u64) -> Option<(usize, E)> {
        match self.queue.first_entry() {
            Some(entry) if entry.key().0 <= until_ms => {
                let ((at, _), next) = entry.remove_entry();
                self.now = at;
                Some(next)
            }
            _ => {
                self.now = self.now.max(until_ms);
                None
            }
        }
    }

    /// Events still to happen.
    pub fn pending(&self) -> usize {
        self.queue.len()
    }

    /// A message or call latency: 1 to `1 + jitter_ms` ms.
    pub fn latency(&mut self) -> u64 {
        1 + self.rng.random_range(0..=self.jitter_ms)
    }

    /// The maximum extra latency, ms.
    pub fn jitter_ms(&self) -> u64 {
        self.jitter_ms
    }

    /// Sets the maximum extra latency, ms.
    pub fn set_jitter_ms(&mut self, jitter_ms: u64) {
        self.jitter_ms = jitter_ms;
    }

    /// The world's RNG (every random choice of a run comes from it).
    pub fn rng(&mut self) -> &mut StdRng {
        &mut self.rng
    }
}

/// Polls `f` once and returns its output.
///
/// # Panics
/// If `f` waits: only futures that complete without waiting (the in-memory
/// tables') can be run this way.
pub fn now_or_fail<T>(f: impl Future<Output = T>) -> T {
    let mut f = pin!(f);
    match f.as_mut().poll(&mut Context::from_waker(Waker::noop())) {
        Poll::Ready(v) => v,
        Poll::Pending => {
            panic!("a simulated table call waited; only futures that complete at once can run here")
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn events_come_out_in_time_order_then_push_order() {
        let mut s = Scheduler::new(1, 0);
        s.push(10, 0, "b");
        s.push(5, 1, "a");
        s.push(10, 2, "c");
        assert_eq!(s.next_until(100), Some((1, "a")));
        assert_eq!(s.now_ms(), 5);
        assert_eq!(s.next_until(100), Some((0, "b")));
        assert_eq!(s.next_until(7), None, "c is due at 10");
        assert_eq!(s.now_ms(), 10, "the clock never goes back");
        assert_eq!(s.next_until(10), Some((2, "c")));
    }

    #[test]
    fn nothing_due_moves_the_clock_to_the_limit() {
        let mut s: Scheduler<()> = Scheduler::new(1, 0);
        s.push(50, 0, ());
        assert_eq!(s.next_until(20), None);
        assert_eq!(s.now_ms(), 20);
        assert_eq!(s.time(), Timestamp::from_millis(T0_MS + 20));
        assert_eq!(s.next_until(60), Some((0, ())));
    }

    #[test]
    fn same_seed_same_latencies() {
        let mut a: Scheduler<()> = Scheduler::new(9, 40);
        let mut b: Scheduler<()> = Scheduler::new(9, 40);
        let la: Vec<u64> = (0..20).map(|_| a.latency()).collect();
        let lb: Vec<u64> = (0..20).map(|_| b.latency()).collect();
        assert_eq!(la, lb);
        assert!(la.iter().all(|l| (1..=41).contains(l)));
    }
}
