//! The rollcall guide: one chapter per subject, written for users of the crates
//! (the README is the front door; the design notes are `docs/ARCHITECTURE.md` and
//! `docs/PROTOCOL.md` in the repository).
//!
//! The chapters are Markdown files under `docs/guide/`, made into these pages by
//! rustdoc, so their Rust code blocks are doctests (`cargo test --doc`) and their
//! links between chapters are intra-doc links that `cargo doc` checks.
//!
//! | chapter | what |
//! |---|---|
//! | [`getting_started`] | the demo, the tests, adding the crate, a first silo |
//! | [`membership`] | how silos detect each other's death: probes, votes, the version row, partitions, options, the history |
//! | [`reminders`] | durable ticks: ownership by shard leases, handoff guarantees, failover, schedules, failures, bounds |
//! | [`actor_state`] | an actor's state in the store: etags, ambiguous writes, sizes per provider, expiry, the sweep |
//! | [`placement`] | one owner per actor: who holds it, state writes fenced by the store, hosting actix actors, the carts example |
//! | [`providers`] | cargo features and store URLs |
//! | [`redis`], [`etcd`], [`dynamodb`] | one page per provider: URLs, deployment, permissions, limits |
//! | [`operating`] | the CLI, Prometheus series, the dashboard, metrics and statistics tables, sizing the store, after an outage |
//! | [`kubernetes`] | SIGTERM, readiness, the advertised address, a Deployment that loses no tick |
//! | [`testing`] | the conformance suite, containers, the repository's layout |
//! | [`benchmarks`] | what is measured and how to reproduce it |

// Each page is a Markdown chapter; its code blocks run as doctests.
macro_rules! chapter {
    ($(#[$meta:meta])* $name:ident, $file:literal) => {
        $(#[$meta])*
        #[doc = include_str!(concat!("../docs/guide/", $file))]
        pub mod $name {}
    };
}

chapter!(getting_started, "getting-started.md");
chapter!(membership, "membership.md");
chapter!(reminders, "reminders.md");
chapter!(actor_state, "actor-state.md");
chapter!(placement, "placement.md");
chapter!(providers, "providers.md");
chapter!(redis, "redis.md");
chapter!(etcd, "etcd.md");
chapter!(dynamodb, "dynamodb.md");
chapter!(operating, "operating.md");
chapter!(kubernetes, "kubernetes.md");
chapter!(testing, "testing.md");
chapter!(benchmarks, "benchmarks.md");
