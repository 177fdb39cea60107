//! The wire messages of a reminder service between silos: the notice a
//! registering silo sends ("re-read this reminder"), the release hint, their
//! topics, and the retry rule of a notice.

use std::time::Duration;

use rollcall_core::lease::{LeaseStatus, ShardLease};
use rollcall_core::SiloAddress;
use serde::{Deserialize, Serialize};

/// How many times a registering silo sends a notice that its owner did not take.
pub const NOTICE_ATTEMPTS: u32 = 6;
/// The wait between two such attempts: 500 ms.
pub const NOTICE_RETRY: Duration = Duration::from_millis(500);

/// The notice a registering silo sends to the holder of the reminder's shard:
/// "re-read this reminder".
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ChangedNotice {
    /// The reminder's service id.
    pub service: String,
    /// The actor id, as stored (`kind/key`).
    pub actor: String,
    /// The reminder name.
    pub name: String,
}

/// The notice a bulk change (a delete by kind or prefix) sends to the holder
/// of each shard it changed: "re-read this shard" (a refresh of it, which
/// drops the rows that are gone), in place of one [`ChangedNotice`] per row.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
#[serde(deny_unknown_fields)]
pub struct ShardNotice {
    /// The reminder's service id.
    pub service: String,
    /// The shard to read again.
    pub shard: u32,
}

/// "I released this shard" ([`ShardEvent::Hint`](crate::shards::ShardEvent::Hint)), sent best effort to the
/// shard's owner in the releasing silo's view.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Eq)]
pub struct ReleaseHint {
    /// The service id.
    pub service: String,
    /// The shard.
    pub shard: u32,
}

/// The retry rule of the notice a registering silo sends after a registration
/// change: to the holder its shard's lease names; when that silo did not take
/// it, again [`NOTICE_RETRY`] later to the holder the lease names then,
/// [`NOTICE_ATTEMPTS`] sends in all. Past that the holder's refresh covers the
/// change. Sans-io: the
/// caller sends and waits; [`NoticeRetry::after_send`] says whether and when to
/// send again.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NoticeRetry {
    notice: ChangedNotice,
    sent: u32,
}

impl NoticeRetry {
    /// The notice "re-read `actor`'s reminder `name`" of `service`, not sent yet.
    pub fn new(service: &str, actor: &str, name: &str) -> Self {
        NoticeRetry {
            notice: ChangedNotice {
                service: service.to_owned(),
                actor: actor.to_owned(),
                name: name.to_owned(),
            },
            sent: 0,
        }
    }

    /// The notice to send.
    pub fn notice(&self) -> &ChangedNotice {
        &self.notice
    }

    /// After one send, `taken` or not: the wait before the next send
    /// ([`NOTICE_RETRY`]), or `None` when there is none to do.
    pub fn after_send(&mut self, taken: bool) -> Option<Duration> {
        self.sent += 1;
        (!taken && self.sent < NOTICE_ATTEMPTS).then_some(NOTICE_RETRY)
    }
}

/// Where a registration's notice goes, by the shard's lease read after the row
/// was written: the holder it names, or none when nobody holds the shard (its
/// next acquire's load reads the row).
pub fn notice_target(lease: &ShardLease) -> Option<SiloAddress> {
    lease.owner.filter(|_| lease.status == LeaseStatus::Owned)
}

/// The notice topic of a service's reminder machines.
pub fn topic(service_id: &str) -> String {
    let hash = xxhash_rust::xxh32::xxh32(service_id.as_bytes(), 0);
    format!("rollcall.reminders/{hash:08x}")
}

/// The topic of a service's release hints ([`ReleaseHint`]).
pub fn release_topic(service_id: &str) -> String {
    format!("{}/release", topic(service_id))
}
