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
    /// otherwise the waiters to answer with its result. A pending read, if any, must
    /// then be started with [`start_pending`](Self::start_pending).
    pub fn finished(&mut self, id: u64) -> Option<Vec<u64>> {
        if self.in_flight != Some(id) {
            return None;
        }
        self.in_flight = None;
        Some(std::mem::take(&mut self.in_flight_waiters))
    }

    /// Starts the pending read, numbered `id`, if one is pending and none is in
    /// flight; its waiters move onto it. Returns whether the caller must start it.
    pub fn start_pending(&mut self, id: u64) -> bool {
        if !self.pending || self.in_flight.is_some() {
            return false;
        }
        self.pending = false;
        self.in_flight = Some(id);
        self.in_flight_waiters = std::mem::take(&mut self.pending_waiters);
        true
    }

    /// Whether a read waits to start.
    pub fn has_pending(&self) -> bool {
        self.pending && self.in_flight.is_none()
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
        assert_eq!(r.finished(10).unwrap(), vec![1]);
        assert!(r.start_pending(11));
        assert_eq!(r.finished(10), None, "a stale id is ignored");
        assert_eq!(r.finished(11).unwrap(), (2..100).collect::<Vec<_>>());
        assert!(!r.start_pending(12), "nothing pending");
        assert!(!r.is_reading());
    }
}
