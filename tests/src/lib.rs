//! # rollcall-tests
//!
//! The provider **conformance suite** and the **backend fixtures** shared by every
//! provider's tests (pattern: `object_store`'s `integration.rs`).
//!
//! - [`membership_table`] and [`reminder_table`] export one `pub async fn` per
//!   scenario. Each takes the store under test, opens a table under a fresh random
//!   cluster / service id (so tests can share one server) and panics with a message
//!   when the provider breaks the contract.
//! - [`conformance_tests!`] expands to one `#[tokio::test]` per scenario for a store
//!   expression, so a provider runs the whole suite with one line.
//! - [`fixtures`] finds a real backend: an endpoint from the environment, a
//!   testcontainers container when a Docker daemon answers (feature `docker`), or a
//!   local server process on a free loopback port.

pub mod counting;
pub mod fixtures;
pub mod membership_table;
pub mod reminder_table;
pub mod sim;

/// The Redis client the fixtures use, for tests that poke at a server directly.
#[cfg(feature = "redis")]
pub use redis;

use std::sync::Arc;

use rand::Rng;
use rollcall_membership_core::SystemStore;

/// The store under test, as the scenarios take it.
pub type Store = Arc<dyn SystemStore>;

/// A fresh id `rc-<what>-<random>` so that scenarios never share rows.
pub fn unique_id(what: &str) -> String {
    let n: u64 = rand::rng().random();
    format!("rc-{what}-{n:016x}")
}

/// Expands to one `#[tokio::test]` per conformance scenario (membership and
/// reminders), each running against the store produced by `$store`, an expression
/// of type `Option<(rollcall_tests::Store, G)>` evaluated inside the test's runtime.
/// `G` is a guard kept alive for the test (a fixture holding a server); `None`
/// skips the test (the fixture has already said why, or panicked under CI).
///
/// ```ignore
/// rollcall_tests::conformance_tests!(Some((memory_store(), ())));
/// ```
#[macro_export]
macro_rules! conformance_tests {
    ($store:expr) => {
        $crate::conformance_tests!(@each $store;
            membership_table::empty_cluster,
            membership_table::insert_row_bumps_version,
            membership_table::duplicate_and_stale_inserts_have_no_effect,
            membership_table::read_row_returns_every_column,
            membership_table::update_row_preconditions,
            membership_table::every_write_advances_version_by_one,
            membership_table::concurrent_inserts_have_one_winner,
            membership_table::concurrent_read_modify_write_loses_nothing,
            membership_table::different_rows_same_version_one_winner,
            membership_table::snapshots_are_atomic,
            membership_table::i_am_alive_is_a_blind_write,
            membership_table::cleanup_defunct_removes_only_old_dead_rows,
            membership_table::delete_cluster_and_isolation,
            membership_table::basic_mode_checks_row_etag_only,
            reminder_table::round_trip_odd_names,
            reminder_table::every_upsert_yields_a_new_etag,
            reminder_table::remove_row_preconditions,
            reminder_table::concurrent_upserts_yield_distinct_etags,
            reminder_table::range_reads_match_the_contract,
            reminder_table::read_rows_for_returns_one_actor,
            reminder_table::read_row_of_missing_key_is_none,
            reminder_table::services_are_isolated,
            reminder_table::invalid_entries_are_rejected,
        );
    };
    (@each $store:expr; $($module:ident :: $scenario:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $scenario() {
                let Some((store, _guard)) = $store else { return };
                $crate::$module::$scenario(store).await;
            }
        )+
    };
}
