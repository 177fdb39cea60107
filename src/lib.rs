//! # rollcall
//!
//! Orleans' system store for actix applications, on the store you already
//! operate: **cluster membership** (who is alive: [`Silo`]), **durable reminders**
//! (timers that survive restarts: [`reminders::Reminders`]) and **actor state**
//! (an actor's state in the store, with etags: [`state::PersistentState`]).
//!
//! A silo, a reminder that ticks an actix actor, and the actor's state, which counts
//! the ticks in the store (`examples/quickstart.rs`, also in the README):
//!
#![doc = concat!("```\n", include_str!("../examples/quickstart.rs"), "```")]
//!
//! The [`guide`] has a chapter per subject: getting started, membership, reminders,
//! actor state, each provider, operating, Kubernetes, testing and benchmarks.
//!
//! This facade re-exports the model and contracts of
//! [`rollcall-core`](rollcall_core) and picks a storage provider
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
#![cfg_attr(docsrs, feature(doc_cfg))]
#![warn(missing_docs)]

mod connect;
#[cfg(feature = "dashboard")]
pub mod dashboard;
pub mod guide;
pub mod metrics_table;
#[cfg(feature = "prometheus")]
pub mod prometheus;
pub mod state;

pub use connect::{connect, connect_retrying, StoreUrl};
pub use rollcall_core::*;

/// Durable reminders: the reminder service ([`reminders::Reminders`]), actor ids and
/// ticks (crate `rollcall-reminders`).
pub use rollcall_reminders as reminders;

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
    /// The README shows `examples/quickstart.rs` and the reminders chapter
    /// `examples/reminders.rs`, verbatim (both run as doctests from there).
    #[test]
    fn the_readme_and_the_guide_hold_the_examples_verbatim() {
        for (doc, text, example) in [
            (
                "README.md",
                include_str!("../README.md"),
                include_str!("../examples/quickstart.rs"),
            ),
            (
                "docs/guide/reminders.md",
                include_str!("../docs/guide/reminders.md"),
                include_str!("../examples/reminders.rs"),
            ),
        ] {
            assert!(
                text.contains(&format!("```rust\n{example}```")),
                "{doc} must contain its example verbatim in a ```rust block"
            );
        }
    }

    /// The guide's links are intra-doc links (`cargo doc` checks them) or
    /// web addresses: a relative file link would break on docs.rs, where no
    /// check could catch it.
    #[test]
    fn the_guide_links_only_to_checked_targets() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/docs/guide");
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            for (i, _) in text.match_indices("](") {
                let target = &text[i + 2..];
                assert!(
                    ["crate::", "http://", "https://"]
                        .iter()
                        .any(|p| target.starts_with(p)),
                    "{}: a link to `{}`: use an intra-doc link (crate::guide::...) or a web address",
                    path.display(),
                    target.split(')').next().unwrap_or(target)
                );
            }
        }
    }
}
