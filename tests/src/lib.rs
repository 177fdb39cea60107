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
pub mod cut;
pub mod delay;
pub mod fenced_state;
pub mod fixtures;
pub mod goaway;
pub mod http_delay;
pub mod key_limits;
pub mod lease_table;
pub mod membership_table;
pub mod metrics_table;
pub mod reminder_table;
pub mod reminders;
#[cfg(feature = "redis")]
pub mod replicated;
pub mod silo_process;
pub mod sim;
pub mod state_table;
pub mod statistics_store;

/// The Redis client the fixtures use, for tests that poke at a server directly.
#[cfg(feature = "redis")]
pub use redis;

use std::sync::Arc;

use rand::Rng;
use rollcall_core::SystemStore;

/// The store under test, as the scenarios take it.
pub type Store = Arc<dyn SystemStore>;

/// A fresh id `rc-<what>-<random>` so that scenarios never share rows.
pub fn unique_id(what: &str) -> String {
    let n: u64 = rand::rng().random();
    format!("rc-{what}-{n:016x}")
}

/// Every conformance scenario as `"module::function"`, from the same list that
/// [`conformance_tests!`] expands (a unit test checks that the list names every
/// scenario function, so it cannot drift).
pub const SCENARIOS: &[&str] = conformance_tests!(@names);

/// Every grain-state scenario as `"state_table::function"`, from the list that
/// [`state_conformance_tests!`] expands.
pub const STATE_SCENARIOS: &[&str] = state_conformance_tests!(@names);

/// Expands to one `#[tokio::test]` per grain-state scenario ([`state_table`]),
/// for a store expression as in [`conformance_tests!`]. Run by every provider:
/// memory, Redis (and Cluster), etcd (one member and three), DynamoDB.
#[macro_export]
macro_rules! state_conformance_tests {
    (@names) => {
        $crate::state_conformance_tests!(@list [@names_out])
    };
    (@list [$($pre:tt)*]) => {
        $crate::state_conformance_tests! { $($pre)*
            state_table::state_sizes_round_trip,
            state_table::state_largest_state_and_one_byte_over,
            state_table::state_grows_and_shrinks_leaving_no_stale_chunk,
            state_table::state_multibyte_utf8_across_chunk_boundaries,
            state_table::state_preconditions,
            state_table::state_concurrent_writers_one_winner_per_etag,
            state_table::state_last_writer_wins_never_fails_under_contention,
            state_table::state_clear_against_a_concurrent_writer,
            state_table::state_killed_write_leaves_the_old_state_and_the_sweep_removes_orphans,
            state_table::state_a_commit_that_landed_but_errored_is_a_success,
            state_table::state_a_commit_that_errored_before_it_landed_is_an_error,
            state_table::state_an_unknown_outcome_deletes_nothing_and_is_learned_later,
            state_table::state_corrupt_header_or_chunk_is_an_error,
            state_table::state_expiry,
            state_table::state_a_failed_write_with_an_expiry_leaves_the_live_state,
            state_table::state_a_write_over_an_expired_state_deletes_its_chunks,
            state_table::state_the_sweep_drops_expired_states_and_tombstones,
            state_table::state_enumeration_pages,
            state_table::state_atomic_write_of_several_states,
            state_table::state_services_are_isolated,
            fenced_state::fenced_writes_land_at_their_epoch_and_are_refused_after_a_takeover,
            fenced_state::fenced_writes_after_a_release_or_without_a_lease_are_refused,
            fenced_state::a_fence_that_does_not_cover_the_key_is_invalid_input,
            fenced_state::fenced_writes_racing_a_takeover_never_land_after_it,
            key_limits::state_keys_at_and_past_the_limit,
        }
    };
    (@names_out $($module:ident :: $scenario:ident),+ $(,)?) => {
        $crate::conformance_tests!(@names_out $($module :: $scenario),+)
    };
    (@each $store:expr; $($module:ident :: $scenario:ident),+ $(,)?) => {
        $crate::conformance_tests!(@each $store; $($module :: $scenario),+);
    };
    ($store:expr) => {
        $crate::state_conformance_tests!(@list [@each $store;]);
    };
}

/// Every shard lease scenario as `"lease_table::function"`, from the list that
/// [`lease_conformance_tests!`] expands.
pub const LEASE_SCENARIOS: &[&str] = lease_conformance_tests!(@names);

/// Expands to one `#[tokio::test]` per shard lease scenario ([`lease_table`]),
/// for a store expression as in [`conformance_tests!`]. Run by every provider.
#[macro_export]
macro_rules! lease_conformance_tests {
    (@names) => {
        $crate::lease_conformance_tests!(@list [@names_out])
    };
    (@list [$($pre:tt)*]) => {
        $crate::lease_conformance_tests! { $($pre)*
            lease_table::lease_absent_rows_are_vacant_and_rows_round_trip,
            lease_table::lease_writes_are_compare_and_set,
            lease_table::lease_concurrent_acquirers_of_one_etag_have_one_winner,
            lease_table::lease_release_by_a_stale_epoch_fails,
            lease_table::lease_shard_count_is_recorded_once,
            lease_table::lease_services_are_isolated,
            lease_table::lease_a_garbage_row_is_a_typed_error,
            key_limits::lease_rows_at_and_past_the_limit,
            lease_table::lease_exceptions_past_one_row_go_to_pages,
        }
    };
    (@names_out $($module:ident :: $scenario:ident),+ $(,)?) => {
        $crate::conformance_tests!(@names_out $($module :: $scenario),+)
    };
    (@each $store:expr; $($module:ident :: $scenario:ident),+ $(,)?) => {
        $crate::conformance_tests!(@each $store; $($module :: $scenario),+);
    };
    ($store:expr) => {
        $crate::lease_conformance_tests!(@list [@each $store;]);
    };
}

/// Expands to one `#[tokio::test]` per conformance scenario (membership and
/// reminders), each running against the store produced by `$store`, an expression
/// of type `Option<(rollcall_tests::Store, G)>` evaluated inside the test's runtime.
/// `G` is a guard kept alive for the test (a fixture holding a server). The
/// fixtures return `None` only when a missing backend was explicitly opted out
/// (`ROLLCALL_SKIP_MISSING_BACKENDS=1`, never under `CI`); the test then says
/// `SKIPPED` on stderr. Otherwise a missing backend fails the test.
///
/// ```ignore
/// rollcall_tests::conformance_tests!(Some((memory_store(), ())));
/// ```
#[macro_export]
macro_rules! conformance_tests {
    (@names) => {
        $crate::conformance_tests!(@list [@names_out])
    };
    (@list [$($pre:tt)*]) => {
        $crate::conformance_tests! { $($pre)*
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
                membership_table::delete_cluster_racing_writers_leaves_no_half_row,
                membership_table::ids_with_separators_and_prefixes_stay_apart,
                membership_table::i_am_alive_races_updates_and_touches_nothing_else,
                membership_table::read_row_is_atomic,
                membership_table::init_on_a_populated_cluster_changes_nothing,
                membership_table::malformed_version_preconditions_are_refused,
                membership_table::read_delta_returns_the_rows_written_after_a_version,
                membership_table::read_delta_never_misses_a_committed_write,
                membership_table::history_records_each_committed_write_and_nothing_else,
                membership_table::history_of_concurrent_writes_is_exactly_the_commits,
                metrics_table::metrics_upsert_replaces_in_place,
                metrics_table::metrics_stay_apart_from_membership_and_other_clusters,
                metrics_table::metrics_concurrent_publishers_keep_one_row_each,
                statistics_store::statistics_rollups_equal_a_brute_force_model,
                statistics_store::statistics_retention_removes_exactly_what_is_older,
                statistics_store::statistics_invalid_points_store_nothing_and_retries_add_nothing,
                statistics_store::statistics_concurrent_appends_fold_every_point,
                statistics_store::statistics_names_read_back_through_a_fresh_handle,
                reminder_table::round_trip_odd_names,
                reminder_table::calendar_end_and_payload_round_trip,
                reminder_table::every_upsert_yields_a_new_etag,
                reminder_table::remove_row_preconditions,
                reminder_table::concurrent_upserts_yield_distinct_etags,
                reminder_table::range_reads_match_the_contract,
                reminder_table::read_rows_for_returns_one_actor,
                reminder_table::read_row_of_missing_key_is_none,
                reminder_table::services_are_isolated,
                reminder_table::invalid_entries_are_rejected,
                reminder_table::concurrent_removes_with_one_etag_have_one_winner,
                reminder_table::clear_racing_upserts_leaves_no_half_row,
                reminder_table::ids_with_separators_never_collide,
                reminder_table::last_fired_keeps_the_etag,
                reminder_table::pages_by_prefix_return_each_row_once,
                reminder_table::remove_prefix_is_exact_and_safe_to_run_again,
                reminder_table::paused_keeps_the_etag,
                reminder_table::run_history_keeps_the_newest,
                reminder_table::holder_writes_under_a_stale_fence_are_refused,
                key_limits::keys_membership_names_at_and_past_the_limit,
                key_limits::keys_reminders_at_and_past_the_limit,
                key_limits::keys_metrics_ids_at_and_past_the_limit,
                key_limits::keys_statistics_names_at_and_past_the_limit,
        }
    };
    (@names_out $($module:ident :: $scenario:ident),+ $(,)?) => {
        &[$(concat!(stringify!($module), "::", stringify!($scenario))),+]
    };
    (@each $store:expr; $($module:ident :: $scenario:ident),+ $(,)?) => {
        $(
            #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
            async fn $scenario() {
                let Some((store, _guard)) = $store else {
                    eprintln!("SKIPPED {}: no backend (opted out)", stringify!($scenario));
                    return;
                };
                $crate::$module::$scenario(store).await;
            }
        )+
    };
    ($store:expr) => {
        $crate::conformance_tests!(@list [@each $store;]);
    };
}

/// Expands to the whole suite for one provider topology: the conformance
/// scenarios ([`conformance_tests!`]) and, in modules `lease` and `state`, the
/// shard lease ([`lease_conformance_tests!`]) and grain-state
/// ([`state_conformance_tests!`]) scenarios. `$store` is the path from the
/// crate root of an `async fn() -> Option<(Store, G)>` (see
/// [`conformance_tests!`]), so it resolves in the nested modules too.
///
/// ```ignore
/// mod cluster {
///     rollcall_tests::provider_conformance_tests!(crate::redis_cluster);
/// }
/// ```
#[macro_export]
macro_rules! provider_conformance_tests {
    ($store:path) => {
        $crate::conformance_tests!($store().await);

        /// The shard lease scenarios.
        mod lease {
            $crate::lease_conformance_tests!($store().await);
        }

        /// The grain-state scenarios.
        mod state {
            $crate::state_conformance_tests!($store().await);
        }
    };
}

#[cfg(test)]
mod tests {
    /// The scenario list cannot drift from the scenario functions: every
    /// `pub async fn f(store: Store)` of the scenario modules is listed, and only those.
    #[test]
    fn every_scenario_function_is_listed() {
        let mut found = Vec::new();
        for (module, source) in [
            ("membership_table", include_str!("membership_table.rs")),
            ("reminder_table", include_str!("reminder_table.rs")),
            ("metrics_table", include_str!("metrics_table.rs")),
            ("statistics_store", include_str!("statistics_store.rs")),
            ("state_table", include_str!("state_table.rs")),
            ("fenced_state", include_str!("fenced_state.rs")),
            ("lease_table", include_str!("lease_table.rs")),
            ("key_limits", include_str!("key_limits.rs")),
        ] {
            for line in source.lines() {
                if let Some(rest) = line.strip_prefix("pub async fn ") {
                    if let Some((name, args)) = rest.split_once('(') {
                        if args.starts_with("store: Store)") {
                            found.push(format!("{module}::{name}"));
                        }
                    }
                }
            }
        }
        let mut listed: Vec<String> = super::SCENARIOS
            .iter()
            .chain(super::STATE_SCENARIOS)
            .chain(super::LEASE_SCENARIOS)
            .map(|s| s.to_string())
            .collect();
        found.sort();
        listed.sort();
        assert_eq!(
            found, listed,
            "conformance_tests! must list exactly the scenario functions"
        );
    }
}
