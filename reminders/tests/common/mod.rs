//! What the reminder property tests share.

use proptest::test_runner::{Config as ProptestConfig, RngSeed};

/// `cases` schedules (or `PROPTEST_CASES` when it is set) from the fixed
/// `seed` (the same schedules on every run), or from `PROPTEST_RNG_SEED`
/// when it is set (`PROPTEST_RNG_SEED=$RANDOM` explores).
pub fn sweep_config(cases: u32, seed: u64) -> ProptestConfig {
    let cases = std::env::var("PROPTEST_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(cases);
    let mut c = ProptestConfig::with_cases(cases);
    c.failure_persistence = None;
    if std::env::var_os("PROPTEST_RNG_SEED").is_none() {
        c.rng_seed = RngSeed::Fixed(seed);
    }
    c
}
