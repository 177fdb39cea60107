//! [`ShardOwnership`]: what a tenant of the shard leases asks of the service
//! that drives the lease rules on this silo (today the reminder service, or
//! a placement service of its own), whichever it is: the fence of an
//! actor's shard, the held-shards watch, and the hosts' registrations,
//! drains and fenced writes going back to the driver.

use std::sync::Arc;

use tokio::sync::watch;

use super::{actor_shard, ActorId, Held};
use crate::{Clock, Fence};

/// What a tenant tells the driver of the lease rules.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum OwnershipFeed {
    /// `delta` actor hosts started (1) or ended (-1): a release waits for
    /// the hosts running when it starts.
    Hosts(isize),
    /// A host ended every activation of `shard` held at `epoch`.
    HostDrained {
        /// The shard.
        shard: u32,
        /// The epoch it was held at.
        epoch: u64,
    },
    /// A store refused a write fenced by `shard` at `epoch`
    /// ([`Error::Fenced`](crate::Error::Fenced)): its lease row is read
    /// again at once (a lease a store failover lost heals now).
    Fenced {
        /// The shard.
        shard: u32,
        /// The epoch the write carried.
        epoch: u64,
    },
}

type Feed = dyn Fn(OwnershipFeed) + Send + Sync;

/// A handle on the shard ownership of one service on this silo: cheap to
/// clone, never waits. Built by the service that drives the lease rules
/// (`Reminders::ownership`, or `Placement::ownership`).
#[derive(Clone)]
pub struct ShardOwnership {
    service_id: Arc<str>,
    shards: u32,
    clock: Arc<dyn Clock>,
    held: watch::Receiver<Held>,
    feed: Arc<Feed>,
}

impl std::fmt::Debug for ShardOwnership {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardOwnership")
            .field("service_id", &self.service_id)
            .field("shards", &self.shards)
            .finish_non_exhaustive()
    }
}

impl ShardOwnership {
    /// The handle of service `service_id` (`shards` shards, at least 1),
    /// whose driver publishes `held` and takes what tenants tell it through
    /// `feed` (called on the tenant's thread: hand it on, do not wait).
    /// `clock` is the driver's: [`fence`](Self::fence) reads it.
    pub fn new(
        service_id: &str,
        shards: u32,
        clock: Arc<dyn Clock>,
        held: watch::Receiver<Held>,
        feed: impl Fn(OwnershipFeed) + Send + Sync + 'static,
    ) -> Self {
        ShardOwnership {
            service_id: service_id.into(),
            shards: shards.max(1),
            clock,
            held,
            feed: Arc::new(feed),
        }
    }

    /// The service id.
    pub fn service_id(&self) -> &str {
        &self.service_id
    }

    /// The service's shard count.
    pub fn shards(&self) -> u32 {
        self.shards
    }

    /// The fence of `actor`'s shard when this silo holds it now (acquired,
    /// not being released, its confirmation and takeover time on both
    /// clocks allowing it: [`Held::epoch_at`]). State writes made under it
    /// ([`StateStorage::fenced`](crate::StateStorage::fenced)) are refused
    /// by the store once another silo took the shard over. `None` when
    /// another silo holds it, or nobody.
    pub fn fence(&self, actor: &ActorId) -> Option<Fence> {
        let shard = actor_shard(&actor.to_string(), self.shards);
        let epoch = self
            .held
            .borrow()
            .epoch_at(shard, self.clock.now(), self.clock.monotonic())?;
        Some(Fence {
            service: self.service_id.to_string(),
            shards: self.shards,
            shard,
            epoch,
        })
    }

    /// The shards this silo holds and keeps, as a watch ([`Held`]).
    pub fn held_shards(&self) -> watch::Receiver<Held> {
        self.held.clone()
    }

    /// Registers an actor host: while the guard lives, a release of a shard
    /// waits (at most the driver's drain) for
    /// [`host_drained`](Self::host_drained) of the shard before it is
    /// written, so the next holder activates the shard's actors only after
    /// this silo's activations ended.
    pub fn register_host(&self) -> HostRegistration {
        (self.feed)(OwnershipFeed::Hosts(1));
        HostRegistration {
            feed: self.feed.clone(),
        }
    }

    /// The actor hosts ended every activation of `shard` held at `epoch`.
    pub fn host_drained(&self, shard: u32, epoch: u64) {
        (self.feed)(OwnershipFeed::HostDrained { shard, epoch });
    }

    /// A store refused a write under `fence`: the driver reads the shard's
    /// lease row again at once. A fence of another service is ignored.
    pub fn lease_fenced(&self, fence: &Fence) {
        if fence.service == *self.service_id {
            (self.feed)(OwnershipFeed::Fenced {
                shard: fence.shard,
                epoch: fence.epoch,
            });
        }
    }
}

/// An actor host's registration ([`ShardOwnership::register_host`]);
/// dropping it unregisters.
pub struct HostRegistration {
    feed: Arc<Feed>,
}

impl std::fmt::Debug for HostRegistration {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HostRegistration").finish_non_exhaustive()
    }
}

impl Drop for HostRegistration {
    fn drop(&mut self) {
        (self.feed)(OwnershipFeed::Hosts(-1));
    }
}
