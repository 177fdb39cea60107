//! The adaptive probe timeout, estimated from the round-trip times of answered
//! probes.
//!
//! Round trips are kept in a sliding window of [`WINDOW`] samples. The estimate is a
//! high quantile of their distribution, `mean + k * stddev`, with `k` chosen so that
//! under a normal approximation a healthy reply comes later than the estimate with
//! probability `10^-THRESHOLD` (the same tail bound the phi-accrual detector of
//! Hayashibara et al. uses as its suspicion level, with the logistic approximation
//! of the normal CDF used by Akka and Cassandra). This is **not** phi-accrual
//! detection: it only sizes the timeout of each probe. Until [`MIN_SAMPLES`] samples
//! exist the configured `probe_timeout` is used. The result is clamped to
//! `[min, max]` (by default `[probe_timeout, 4 * probe_timeout]`, so adaptivity only
//! ever lengthens a timeout; a `min_probe_timeout` below `probe_timeout` is an
//! explicit opt-in) and then, when the local silo is degraded, multiplied by
//! `1 + health score` (Lifeguard, Dadgar et al. 2018: a slow local silo waits longer
//! before suspecting others).

use std::collections::VecDeque;
use std::time::Duration;

/// The tail bound, as a negative power of ten: a healthy reply is later than the
/// estimate with probability `10^-8` (Akka's phi threshold).
pub const THRESHOLD: f64 = 8.0;
/// Samples needed before the window replaces the initial timeout.
pub const MIN_SAMPLES: usize = 5;
/// Window size.
pub const WINDOW: usize = 100;

/// `1 - F(y)` with the logistic approximation of the standard normal CDF.
fn tail(y: f64) -> f64 {
    let e = (-y * (1.5976 + 0.070566 * y * y)).exp();
    e / (1.0 + e)
}

/// The standardised distance `y` at which `phi` reaches `threshold`.
fn threshold_y(threshold: f64) -> f64 {
    let target = 10f64.powf(-threshold);
    let (mut lo, mut hi) = (0.0f64, 40.0f64);
    for _ in 0..100 {
        let mid = (lo + hi) / 2.0;
        if tail(mid) > target {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    hi
}

/// Adaptive probe timeout of one probed silo: an RTT quantile estimate, clamped.
#[derive(Clone, Debug)]
pub struct ProbeTimeout {
    samples: VecDeque<f64>,
    initial: Duration,
    min: Duration,
    max: Duration,
}

impl ProbeTimeout {
    /// A detector starting at `initial`, clamped to `[min, max]` (`min <= max`).
    pub fn new(initial: Duration, min: Duration, max: Duration) -> Self {
        ProbeTimeout {
            samples: VecDeque::with_capacity(WINDOW),
            initial,
            min,
            max: max.max(min),
        }
    }

    /// Records the round trip of an answered probe.
    pub fn record(&mut self, rtt: Duration) {
        if self.samples.len() == WINDOW {
            self.samples.pop_front();
        }
        self.samples.push_back(rtt.as_secs_f64() * 1000.0);
    }

    /// Samples held.
    pub fn len(&self) -> usize {
        self.samples.len()
    }

    /// True when no sample is held.
    pub fn is_empty(&self) -> bool {
        self.samples.is_empty()
    }

    /// The timeout for the next probe, with the local health score (0..=8) applied
    /// when `extend` is set.
    pub fn timeout(&self, health_score: u8, extend: bool) -> Duration {
        let base = if self.samples.len() < MIN_SAMPLES {
            self.initial
        } else {
            let n = self.samples.len() as f64;
            let mean = self.samples.iter().sum::<f64>() / n;
            let var = self.samples.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / n;
            // A floor on the deviation: perfectly regular samples must not give a
            // timeout equal to the mean.
            let std = var.sqrt().max(mean / 4.0).max(1.0);
            Duration::from_secs_f64((mean + threshold_y(THRESHOLD) * std) / 1000.0)
        };
        let clamped = base.clamp(self.min, self.max);
        if extend {
            clamped.saturating_mul(1 + u32::from(health_score.min(8)))
        } else {
            clamped
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    #[test]
    fn initial_until_enough_samples_then_adapts() {
        let mut p = ProbeTimeout::new(ms(5000), ms(10), ms(20_000));
        assert_eq!(p.timeout(0, true), ms(5000));
        for _ in 0..MIN_SAMPLES {
            p.record(ms(20));
        }
        let t = p.timeout(0, true);
        assert!(t > ms(20) && t < ms(200), "{t:?}");
    }

    #[test]
    fn jittery_links_get_longer_timeouts() {
        let mut steady = ProbeTimeout::new(ms(5000), ms(1), ms(60_000));
        let mut jittery = steady.clone();
        for i in 0..50u64 {
            steady.record(ms(100));
            jittery.record(ms(if i % 2 == 0 { 20 } else { 400 }));
        }
        assert!(jittery.timeout(0, false) > steady.timeout(0, false));
    }

    #[test]
    fn clamped_and_extended_by_health() {
        let mut p = ProbeTimeout::new(ms(5000), ms(2500), ms(20_000));
        for _ in 0..10 {
            p.record(Duration::from_micros(100));
        }
        assert_eq!(p.timeout(0, true), ms(2500));
        assert_eq!(p.timeout(2, true), ms(7500));
        assert_eq!(p.timeout(2, false), ms(2500));
        assert_eq!(p.timeout(200, true), ms(2500 * 9));
        for _ in 0..WINDOW {
            p.record(ms(60_000));
        }
        assert_eq!(p.timeout(0, true), ms(20_000));
        assert_eq!(p.len(), WINDOW);
    }

    #[test]
    fn threshold_matches_phi_definition() {
        let y = threshold_y(THRESHOLD);
        let phi = -tail(y).log10();
        assert!((phi - THRESHOLD).abs() < 1e-6, "{phi}");
    }
}
