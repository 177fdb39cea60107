//! Lease calls (pure bookkeeping): reads and writes of the shard leases wait
//! in order for room, at most [`MAX_LEASE_CALLS`] in flight, so a silo that
//! starts and is assigned a thousand shards does not send a thousand calls at
//! once. (At most one call per shard is asked for at a time: [`crate::shards`],
//! rule 6.)

use std::collections::VecDeque;

/// Lease reads and writes in flight at once (the rest wait in order).
pub const MAX_LEASE_CALLS: usize = 64;

/// Calls of type `C` waiting and in flight.
#[derive(Debug)]
pub(crate) struct LeaseCalls<C> {
    waiting: VecDeque<C>,
    in_flight: usize,
}

impl<C> Default for LeaseCalls<C> {
    fn default() -> Self {
        LeaseCalls {
            waiting: VecDeque::new(),
            in_flight: 0,
        }
    }
}

impl<C> LeaseCalls<C> {
    /// Queues `call` behind the others.
    pub(crate) fn push(&mut self, call: C) {
        self.waiting.push_back(call);
    }

    /// A call in flight answered.
    pub(crate) fn answered(&mut self) {
        self.in_flight = self.in_flight.saturating_sub(1);
    }

    /// The calls to send now, in order, while fewer than [`MAX_LEASE_CALLS`]
    /// are in flight.
    pub(crate) fn send(&mut self) -> impl Iterator<Item = C> + '_ {
        std::iter::from_fn(move || {
            if self.in_flight >= MAX_LEASE_CALLS {
                return None;
            }
            let call = self.waiting.pop_front()?;
            self.in_flight += 1;
            Some(call)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn calls_go_in_order_with_at_most_the_bound_in_flight() {
        let mut c = LeaseCalls::default();
        for i in 0..MAX_LEASE_CALLS + 2 {
            c.push(i);
        }
        let sent: Vec<usize> = c.send().collect();
        assert_eq!(sent, (0..MAX_LEASE_CALLS).collect::<Vec<_>>());
        assert_eq!(c.send().count(), 0);
        c.answered();
        assert_eq!(c.send().collect::<Vec<_>>(), vec![MAX_LEASE_CALLS]);
        c.answered();
        c.answered();
        assert_eq!(c.send().collect::<Vec<_>>(), vec![MAX_LEASE_CALLS + 1]);
    }
}
