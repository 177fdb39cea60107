//! The shard function: which shard an actor is in ([`actor_shard`]), which
//! hashes a shard covers ([`shard_range`]), and which silo a ring assigns a
//! shard to ([`shard_owner`]). One function for every tenant of the shard
//! leases: an actor's reminders, its activation and its states' keys.
//!
//! Pure: no I/O, no clock.

use super::ring::{Ring, RingRange};
use crate::SiloAddress;

/// The stable 32-bit hash that places an actor id on the reminder ring.
///
/// Algorithm: **xxHash32 with seed 0 over the UTF-8 bytes of the actor id**
/// (XXH32 as specified by Yann Collet's xxHash, the same value on every platform,
/// endianness and release). It is stored with each reminder and decides which silo
/// owns it, so it must never change; the test vectors below pin it.
///
/// ```
/// use rollcall_core::actor_hash;
/// assert_eq!(actor_hash(""), 0x02CC_5D05);
/// assert_eq!(actor_hash("abc"), 0x32D1_53FF);
/// ```
pub fn actor_hash(actor_id: &str) -> u32 {
    xxhash_rust::xxh32::xxh32(actor_id.as_bytes(), 0)
}

/// How many shards a service's actors are spread over by default
/// ([`actor_shard`]): 1,024. Measured (R4 in the repository's `BENCHMARKS.md`): the
/// store calls of a start or a membership change grow with the count, and the
/// spread of reminders over silos needs it well above the number of silos; 1,024
/// spreads well up to about 100 silos, 4,096 above that.
pub const DEFAULT_SHARDS: u32 = 1024;

/// The shard of `actor_id` among `shards` (1 or more; 0 counts as 1): shard `k`
/// holds the contiguous range of [`actor_hash`] values
/// `[k * 2^32 / shards, (k + 1) * 2^32 / shards)`. One function places an
/// actor's states (the Redis provider tags their keys with it, so one actor's
/// states share a Redis Cluster slot and a cluster spreads a service's states)
/// and, with the reminder shard leases, its reminders.
///
/// ```
/// use rollcall_core::{actor_hash, actor_shard};
/// assert_eq!(actor_shard("cart/1", 1), 0);
/// let k = actor_shard("cart/1", 1024);
/// assert_eq!(k, (u64::from(actor_hash("cart/1")) * 1024 >> 32) as u32);
/// ```
pub fn actor_shard(actor_id: &str, shards: u32) -> u32 {
    hash_shard(actor_hash(actor_id), shards)
}

/// The shard among `shards` (1 or more; 0 counts as 1) of the [`actor_hash`] value
/// `hash`: [`actor_shard`] for a hash already computed, such as a reminder row's.
pub fn hash_shard(hash: u32, shards: u32) -> u32 {
    ((u64::from(hash) * u64::from(shards.max(1))) >> 32) as u32
}

/// The hash range of shard `k` of `shards` (1 or more): exactly the hashes
/// `h` with `(h * shards) >> 32 == k`, the actors
/// [`actor_shard`] maps to `k`.
pub fn shard_range(k: u32, shards: u32) -> RingRange {
    let s = u64::from(shards.max(1));
    let first = (u64::from(k) << 32).div_ceil(s);
    let next = (u64::from(k + 1) << 32).div_ceil(s);
    RingRange {
        begin: (first as u32).wrapping_sub(1),
        end: (next - 1) as u32,
    }
}

/// The first hash of shard `k`'s range: the point of the ring whose owner
/// [`shard_owner`] names.
pub fn shard_start(k: u32, shards: u32) -> u32 {
    shard_range(k, shards).begin.wrapping_add(1)
}

/// The silo `ring` assigns `actor_id`'s shard to (of `shards`): where its
/// registration notices go.
pub fn shard_owner(ring: &Ring, actor_id: &str, shards: u32) -> Option<SiloAddress> {
    let k = actor_shard(actor_id, shards);
    ring.owner_of(shard_start(k, shards))
}
