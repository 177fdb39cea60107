//! Shard ownership: the layer that decides, through fenced leases in the
//! store, which silo acts for which actors. Reminders and placement are its
//! tenants; neither owns it.
//!
//! - [`shard`]: the shard function. An actor id ([`ActorId`], `kind/key`)
//!   hashes to one of a service's shards ([`actor_shard`]); a shard covers a
//!   contiguous range of the hash ring ([`shard_range`]).
//! - [`ring`]: which Active silo a shard is assigned to ([`Ring`], Orleans'
//!   consistent ring with virtual buckets), the same on every silo that read
//!   the same membership version.
//! - [`lease`]: one lease row per shard in the store, held by compare-and-set
//!   at an epoch that every acquire raises (the fencing token,
//!   [`Fence`]); the store checks a tenant's writes against it.
//! - [`held`]: what a silo holds, at which epoch and until when it may act as
//!   the holder ([`Held`]), as the lease rules publish it for the tenants to
//!   check.
//!
//! - [`host`]: placement, a tenant: one activation per actor on the silo
//!   holding its shard ([`HostTable`]'s rules, carried out for actix actors
//!   by `ActorHost`), through a [`ShardOwnership`] handle on whichever
//!   service drives the leases.
//! - [`machine`]: the lease rules, a sans-io machine ([`ShardMachine`]):
//!   which shards this silo acquires, releases, checkpoints and heals, and
//!   when its tenants may act for them. Today the reminder service drives it
//!   for both tenants and publishes [`Held`].
//!
//! Everything here is pure but [`lease::ShardLeases`], whose calls go to the
//! store's lease table.

pub mod actor;
#[cfg(feature = "runtime")]
pub mod calls;
#[cfg(feature = "runtime")]
mod handle;
pub mod held;
pub mod host;
pub mod lease;
pub mod machine;
#[cfg(feature = "runtime")]
pub mod placement;
pub mod ring;
pub mod shard;

pub use actor::{ActorId, InvalidActorId, MAX_ACTOR_ID};
#[cfg(feature = "runtime")]
pub use handle::{HostRegistration, OwnershipFeed, ShardOwnership};
pub use held::{Held, HeldBook, HeldMap, MonotonicDeadlines};
#[cfg(feature = "runtime")]
pub use host::{ActorHost, Deactivate, HostEvent, DEACTIVATE_TIMEOUT};
pub use host::{Deactivation, HeldChange, HostError, HostTable, Route};
pub use lease::{Fence, LeaseStatus, LeaseTable, ShardLease, ShardLeases};
pub use machine::{ShardAction, ShardEvent, ShardMachine, ShardOptions};
#[cfg(feature = "runtime")]
pub use placement::{Placement, PlacementBuilder, PlacementOptions};
pub use ring::{points_of, Ring, RingRange};
pub use shard::{actor_hash, actor_shard, hash_shard, shard_owner, shard_range, shard_start, DEFAULT_SHARDS};
