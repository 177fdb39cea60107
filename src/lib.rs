//! # rollcall
//!
//! Orleans-style **cluster membership** and **durable reminders** for actix
//! applications, on the store you already operate.
//!
//! This facade re-exports the model and contracts of
//! [`rollcall-membership-core`](rollcall_membership_core) and picks a storage provider
//! from a URL with [`connect`]:
//!
//! | URL | provider | feature |
//! |---|---|---|
//! | `memory://` | in-process tables (one shared store per process) | `memory` (default) |
//! | `redis://[user:pass@]host:port/db`, `rediss://...` | Redis | `redis` |
//! | `etcd://[user:pass@]host:port[,host:port]?prefix=...`, `etcds://...` | etcd | `etcd` |
//! | `dynamodb://table?endpoint=...` | DynamoDB | `dynamodb` |
//!
//! ```
//! # #[tokio::main(flavor = "current_thread")]
//! # async fn main() -> rollcall::Result<()> {
//! use rollcall::{MembershipEntry, ProtocolMode, SiloStatus, Timestamp};
//!
//! let store = rollcall::connect("memory://").await?;
//! let table = store.membership_table("demo-cluster", ProtocolMode::Extended)?;
//! table.init(true).await?;
//! let snapshot = table.read_all().await?;
//! let me = "127.0.0.1:11111@1".parse()?;
//! let row = MembershipEntry::new(me, SiloStatus::Joining, Timestamp::now());
//! assert!(table.insert_row(&row, &snapshot.version.next()).await?);
//! assert_eq!(table.read_all().await?.version.version, 1);
//! # Ok(()) }
//! ```

#![warn(missing_docs)]

mod connect;
#[cfg(feature = "dashboard")]
pub mod dashboard;
pub mod metrics_table;
#[cfg(feature = "prometheus")]
pub mod prometheus;
pub mod state;

pub use connect::{connect, connect_retrying, StoreUrl};
pub use rollcall_membership_core::*;

/// Durable reminders: the reminder service ([`reminders::Reminders`]), actor ids and
/// ticks (crate `rollcall-reminders`).
pub use rollcall_reminders as reminders;

// The README's reminders example, run as a doctest so that it stays true.
#[doc = concat!("```\n", include_str!("../examples/reminders.rs"), "\n```")]
mod readme_reminders_example {}

/// The DynamoDB provider.
#[cfg(feature = "dynamodb")]
pub use rollcall_provider_dynamodb as dynamodb;
/// The etcd provider.
#[cfg(feature = "etcd")]
pub use rollcall_provider_etcd as etcd;
/// The in-memory provider.
#[cfg(feature = "memory")]
pub use rollcall_provider_memory as memory;
/// The Redis provider.
#[cfg(feature = "redis")]
pub use rollcall_provider_redis as redis;

#[cfg(test)]
mod tests {
    /// The README shows `examples/reminders.rs` verbatim.
    #[test]
    fn readme_holds_the_reminders_example() {
        let readme = include_str!("../README.md");
        let example = include_str!("../examples/reminders.rs");
        assert!(
            readme.contains(&format!("```rust\n{example}```")),
            "README.md must contain examples/reminders.rs verbatim in a ```rust block"
        );
    }
}
