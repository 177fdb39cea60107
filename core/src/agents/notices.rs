//! Application notices over the probe transport ([`ProbeRequest::Notice`]): the
//! receivers per topic, and what a silo hands them.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

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

/// Notices were dropped because the receiver's queue was full: the receiver must
/// reconcile on its own (re-read whatever the notices were about).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct NoticesDropped(pub u64);

/// The receiving end of one topic's notices. See
/// [`SiloHandle::subscribe_notices`](crate::SiloHandle::subscribe_notices).
#[derive(Debug)]
pub struct NoticeReceiver {
    rx: mpsc::Receiver<Notice>,
    dropped: Arc<AtomicU64>,
}

impl NoticeReceiver {
    /// The next notice; first `Err(NoticesDropped(n))` if `n` notices were dropped
    /// since the last call because the queue was full. `None` once the silo stopped
    /// serving the topic (it stopped, or another receiver replaced this one).
    pub async fn recv(&mut self) -> Option<Result<Notice, NoticesDropped>> {
        let dropped = self.dropped.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            return Some(Err(NoticesDropped(dropped)));
        }
        self.rx.recv().await.map(Ok)
    }

    /// As [`recv`](Self::recv), without waiting: `None` if nothing is queued.
    pub fn try_recv(&mut self) -> Option<Result<Notice, NoticesDropped>> {
        let dropped = self.dropped.swap(0, Ordering::Relaxed);
        if dropped > 0 {
            return Some(Err(NoticesDropped(dropped)));
        }
        self.rx.try_recv().ok().map(Ok)
    }
}

/// One topic's queue and its count of dropped notices.
type Sink = (mpsc::Sender<Notice>, Arc<AtomicU64>);

/// The receivers of one silo, by topic. Each queue is bounded; a notice that finds
/// its queue full is dropped (answered `accepted: false`, and counted for the
/// receiver, which learns it from [`NoticeReceiver::recv`]).
#[derive(Debug, Default)]
pub(crate) struct NoticeSinks {
    by_topic: RwLock<HashMap<String, Sink>>,
}

impl NoticeSinks {
    /// A new receiver for `topic` with room for `capacity` notices (at least 1); it
    /// replaces the previous one, whose receiver then ends.
    pub(crate) fn subscribe(&self, topic: &str, capacity: usize) -> NoticeReceiver {
        let (tx, rx) = mpsc::channel(capacity.max(1));
        let dropped = Arc::new(AtomicU64::new(0));
        self.by_topic
            .write()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .insert(topic.to_owned(), (tx, dropped.clone()));
        NoticeReceiver { rx, dropped }
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
            Some((tx, dropped)) => match tx.try_send(Notice { from, topic, body }) {
                Ok(()) => true,
                Err(mpsc::error::TrySendError::Full(_)) => {
                    dropped.fetch_add(1, Ordering::Relaxed);
                    false
                }
                Err(mpsc::error::TrySendError::Closed(_)) => false,
            },
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
        assert!(!sinks.offer(notice("a", 3)), "still full");
        assert!(!sinks.offer(notice("b", 4)), "other topic");
        // The receiver learns first that two were dropped, then gets the queue.
        assert_eq!(rx.try_recv(), Some(Err(NoticesDropped(2))));
        assert_eq!(rx.try_recv().unwrap().unwrap().body, vec![1]);
        assert_eq!(rx.try_recv().unwrap().unwrap().body, vec![2]);
        assert!(rx.try_recv().is_none());
        // A new subscriber replaces the old one.
        let mut rx2 = sinks.subscribe("a", 1);
        assert!(sinks.offer(notice("a", 5)));
        assert_eq!(rx2.try_recv().unwrap().unwrap().body, vec![5]);
        assert!(rx.try_recv().is_none());
    }
}
