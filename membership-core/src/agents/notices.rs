//! Application notices over the probe transport ([`ProbeRequest::Notice`]): the
//! receivers per topic, and what a silo hands them.

use std::collections::HashMap;
use std::sync::RwLock;

use tokio::sync::mpsc;

use crate::transport::ProbeRequest;
use crate::SiloAddress;

/// A notice received on this silo's probe endpoint (or sent to itself), as handed to
/// the receiver of its topic.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Notice {
    /// The sending silo.
    pub from: SiloAddress,
    /// The topic it was sent to.
    pub topic: String,
    /// The sender's payload (at most
    /// [`MAX_NOTICE_BODY`](crate::transport::MAX_NOTICE_BODY) bytes).
    pub body: Vec<u8>,
}

/// The receivers of one silo, by topic. Each queue is bounded; a notice that finds
/// its queue full is dropped (and answered `accepted: false`).
#[derive(Debug, Default)]
pub(crate) struct NoticeSinks {
    by_topic: RwLock<HashMap<String, mpsc::Sender<Notice>>>,
}

impl NoticeSinks {
    /// A new receiver for `topic` with room for `capacity` notices (at least 1); it
    /// replaces the previous one, whose receiver then ends.
    pub(crate) fn subscribe(&self, topic: &str, capacity: usize) -> mpsc::Receiver<Notice> {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        self.by_topic
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(topic.to_owned(), tx);
        rx
    }

    /// Hands `request` to its topic's receiver if it is a notice; whether it was taken.
    pub(crate) fn offer(&self, request: ProbeRequest) -> bool {
        let ProbeRequest::Notice { from, topic, body } = request else {
            return false;
        };
        let sinks = self
            .by_topic
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        match sinks.get(&topic) {
            Some(tx) => tx.try_send(Notice { from, topic, body }).is_ok(),
            None => false,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn notice(topic: &str, n: u8) -> ProbeRequest {
        ProbeRequest::Notice {
            from: SiloAddress::new(([10, 0, 0, 1], 1).into(), 1),
            topic: topic.into(),
            body: vec![n],
        }
    }

    #[test]
    fn notices_reach_their_topic_and_a_full_queue_drops() {
        let sinks = NoticeSinks::default();
        assert!(!sinks.offer(notice("a", 0)), "nobody subscribed");
        let mut rx = sinks.subscribe("a", 2);
        assert!(sinks.offer(notice("a", 1)));
        assert!(sinks.offer(notice("a", 2)));
        assert!(!sinks.offer(notice("a", 3)), "queue of 2 is full");
        assert!(!sinks.offer(notice("b", 4)), "other topic");
        assert_eq!(rx.try_recv().unwrap().body, vec![1]);
        assert_eq!(rx.try_recv().unwrap().body, vec![2]);
        assert!(rx.try_recv().is_err());
        // A new subscriber replaces the old one.
        let mut rx2 = sinks.subscribe("a", 1);
        assert!(sinks.offer(notice("a", 5)));
        assert_eq!(rx2.try_recv().unwrap().body, vec![5]);
        assert!(rx.try_recv().is_err());
    }
}
