//! Coalesced table refreshes: at most one read in flight and one pending per silo.
//!
//! Every reason to re-read the table (gossip, a timer, a write, a caller of
//! `refresh()`) goes through [`Refresher::request`]. While a read is in flight, more
//! requests only mark one more read as pending; its waiters are answered by that
//! next read, which starts after their request, so they see every write committed
//! before they asked. A burst of N gossip messages therefore costs at most two reads.

/// The refresh state of one silo. Read ids are chosen by the caller.
#[derive(Clone, Debug, Default)]
pub struct Refresher {
    in_flight: Option<u64>,
    in_flight_waiters: Vec<u64>,
    pending: bool,
    pending_waiters: Vec<u64>,
}

impl Refresher {
    /// Asks for a read (answering `waiter` with it, if given). Returns `Some(id)` when
    /// the caller must start a read numbered `id` now; `None` when one is already in
    /// flight (the request then rides on the next one).
    pub fn request(&mut self, waiter: Option<u64>, id: u64) -> Option<u64> {
        if self.in_flight.is_some() {
            self.pending = true;
            self.pending_waiters.extend(waiter);
            return None;
        }
        self.in_flight = Some(id);
        self.in_flight_waiters.extend(waiter);
        Some(id)
    }

    /// Whether a read is in flight.
    pub fn is_reading(&self) -> bool {
        self.in_flight.is_some()
    }

    /// Read `id` finished. Returns `None` if `id` is not the read in flight;
    /// otherwise the waiters to answer with its result, and whether a pending read
    /// must start now (with `next_id`).
    pub fn finished(&mut self, id: u64, next_id: u64) -> Option<(Vec<u64>, Option<u64>)> {
        if self.in_flight != Some(id) {
            return None;
        }
        let waiters = std::mem::take(&mut self.in_flight_waiters);
        self.in_flight = None;
        let next = if self.pending {
            self.pending = false;
            self.in_flight = Some(next_id);
            self.in_flight_waiters = std::mem::take(&mut self.pending_waiters);
            Some(next_id)
        } else {
            None
        };
        Some((waiters, next))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_burst_costs_two_reads_and_every_waiter_gets_a_later_read() {
        let mut r = Refresher::default();
        assert_eq!(r.request(Some(1), 10), Some(10));
        for w in 2..100 {
            assert_eq!(r.request(Some(w), 10 + w), None);
        }
        let (waiters, next) = r.finished(10, 11).unwrap();
        assert_eq!(waiters, vec![1]);
        assert_eq!(next, Some(11));
        assert_eq!(r.finished(10, 12), None, "a stale id is ignored");
        let (waiters, next) = r.finished(11, 12).unwrap();
        assert_eq!(waiters, (2..100).collect::<Vec<_>>());
        assert_eq!(next, None);
        assert!(!r.is_reading());
    }
}
