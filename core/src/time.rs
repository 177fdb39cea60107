//! Wall-clock timestamps with millisecond precision and the [`Clock`] abstraction.
//!
//! Every time stored in a table (IAmAlive, start time, suspicion votes, reminder
//! start) is a [`Timestamp`]: milliseconds since the UNIX epoch, UTC. Code that needs
//! "now" asks a [`Clock`] so that tests and simulations can run in virtual time.

use std::fmt;
use std::str::FromStr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::Error;

/// A UTC wall-clock instant, in whole milliseconds since 1970-01-01T00:00:00Z.
///
/// Serialised (JSON and every provider's stored form) as an RFC 3339 string with
/// millisecond precision, e.g. `"2026-11-21T05:39:29.123Z"`, so an operator can read it
/// with the backend's own tools.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Timestamp(u64);

impl Timestamp {
    /// The UNIX epoch (0 ms). Used as "never" for IAmAlive of a silo that has not
    /// published yet.
    pub const EPOCH: Timestamp = Timestamp(0);

    /// From milliseconds since the UNIX epoch.
    pub const fn from_millis(ms: u64) -> Self {
        Timestamp(ms)
    }

    /// Milliseconds since the UNIX epoch.
    pub const fn as_millis(self) -> u64 {
        self.0
    }

    /// The current system time, truncated to milliseconds. Times before 1970 map to
    /// [`Timestamp::EPOCH`].
    pub fn now() -> Self {
        Self::from_system_time(SystemTime::now())
    }

    /// From a [`SystemTime`], truncated to milliseconds (times before 1970 map to the
    /// epoch; times past year 584 million saturate).
    pub fn from_system_time(t: SystemTime) -> Self {
        let ms = t
            .duration_since(UNIX_EPOCH)
            .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
            .unwrap_or(0);
        Timestamp(ms)
    }

    /// As a [`SystemTime`].
    pub fn to_system_time(self) -> SystemTime {
        UNIX_EPOCH + Duration::from_millis(self.0)
    }

    /// `self + d`, saturating, truncated to milliseconds.
    pub fn saturating_add(self, d: Duration) -> Self {
        Timestamp(self.0.saturating_add(duration_millis(d)))
    }

    /// `self - d`, saturating at the epoch, truncated to milliseconds.
    pub fn saturating_sub(self, d: Duration) -> Self {
        Timestamp(self.0.saturating_sub(duration_millis(d)))
    }

    /// The time from `earlier` to `self`; zero if `earlier` is later.
    pub fn saturating_duration_since(self, earlier: Timestamp) -> Duration {
        Duration::from_millis(self.0.saturating_sub(earlier.0))
    }
}

/// Whole milliseconds of `d`, saturating at `u64::MAX`.
pub fn duration_millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

impl fmt::Display for Timestamp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(&humantime::format_rfc3339_millis(self.to_system_time()), f)
    }
}

impl FromStr for Timestamp {
    type Err = Error;

    /// Parses RFC 3339 (`2026-11-21T05:39:29.123Z`); sub-millisecond digits are
    /// truncated.
    fn from_str(s: &str) -> Result<Self, Error> {
        humantime::parse_rfc3339_weak(s)
            .map(Timestamp::from_system_time)
            .map_err(|e| Error::invalid_config("timestamp", format!("`{s}`: {e}")))
    }
}

impl Serialize for Timestamp {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Timestamp {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// A source of wall-clock time.
///
/// Everything in rollcall that needs "now" takes an `Arc<dyn Clock>` so that tests can
/// run minutes of protocol in milliseconds under tokio's paused clock.
pub trait Clock: Send + Sync + fmt::Debug {
    /// The current wall-clock time.
    fn now(&self) -> Timestamp;

    /// Time on a clock that a step of the wall clock does not move, from a
    /// fixed origin (the same at every call on one clock). Deadlines that
    /// fence a silo (its confirmation of its own row plus the lease period, a
    /// takeover time) are kept on it, so an NTP step back cannot stretch
    /// them. Default: [`boot_time`] (Linux `CLOCK_BOOTTIME`, which also
    /// counts time the machine was suspended).
    fn monotonic(&self) -> Duration {
        boot_time()
    }
}

/// Time since the machine booted, suspended time included: Linux
/// `CLOCK_BOOTTIME`. Where that clock does not exist, the monotonic clock
/// since the first call in this process (which may not count a suspend).
/// Never goes back; a step of the wall clock does not move it.
pub fn boot_time() -> Duration {
    #[cfg(any(target_os = "linux", target_os = "android"))]
    {
        let t = rustix::time::clock_gettime(rustix::time::ClockId::Boottime);
        Duration::new(
            u64::try_from(t.tv_sec).unwrap_or(0),
            u32::try_from(t.tv_nsec).unwrap_or(0),
        )
    }
    #[cfg(not(any(target_os = "linux", target_os = "android")))]
    {
        static ORIGIN: std::sync::OnceLock<std::time::Instant> = std::sync::OnceLock::new();
        ORIGIN.get_or_init(std::time::Instant::now).elapsed()
    }
}

/// The operating system's wall clock ([`SystemTime::now`]).
#[derive(Clone, Copy, Debug, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> Timestamp {
        Timestamp::now()
    }
}

/// Wall-clock time that follows tokio's clock: a fixed wall-clock origin plus the
/// tokio [`Instant`](tokio::time::Instant) time elapsed since the clock was created.
///
/// Under `tokio::time::pause()` (or `start_paused`) this advances with virtual time,
/// which is what the simulated-network tests and benchmarks need. It must be created
/// inside a tokio runtime.
#[cfg(feature = "runtime")]
#[derive(Clone, Debug)]
pub struct TokioClock {
    origin_wall: Timestamp,
    origin: tokio::time::Instant,
}

#[cfg(feature = "runtime")]
impl TokioClock {
    /// A clock that reads `origin_wall` now and advances with tokio time.
    pub fn starting_at(origin_wall: Timestamp) -> Self {
        TokioClock {
            origin_wall,
            origin: tokio::time::Instant::now(),
        }
    }

    /// A clock that reads the system time now and advances with tokio time.
    pub fn new() -> Self {
        Self::starting_at(Timestamp::now())
    }
}

#[cfg(feature = "runtime")]
impl Default for TokioClock {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(feature = "runtime")]
impl Clock for TokioClock {
    fn now(&self) -> Timestamp {
        self.origin_wall.saturating_add(self.origin.elapsed())
    }

    /// Tokio time since the clock was created (virtual under a paused clock).
    fn monotonic(&self) -> Duration {
        self.origin.elapsed()
    }
}

/// A clock that only moves when told to; for unit tests of time-dependent logic.
#[derive(Clone, Debug, Default)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock reading `t`.
    pub fn new(t: Timestamp) -> Self {
        ManualClock(Arc::new(AtomicU64::new(t.as_millis())))
    }

    /// Sets the time to `t` (it may go backwards: clocks do).
    pub fn set(&self, t: Timestamp) {
        self.0.store(t.as_millis(), Ordering::SeqCst);
    }

    /// Moves the time forward by `d`.
    pub fn advance(&self, d: Duration) {
        self.0.fetch_add(duration_millis(d), Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now(&self) -> Timestamp {
        Timestamp(self.0.load(Ordering::SeqCst))
    }

    /// The wall time as a duration since the epoch: it moves only when told
    /// (and back, if set back).
    fn monotonic(&self) -> Duration {
        Duration::from_millis(self.0.load(Ordering::SeqCst))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boot_time_moves_forward() {
        let a = boot_time();
        std::thread::sleep(Duration::from_millis(20));
        let b = boot_time();
        assert!(b >= a + Duration::from_millis(20), "{a:?} then {b:?}");
    }

    #[test]
    fn rfc3339_round_trip_keeps_millis() {
        let t = Timestamp::from_millis(1_795_000_000_123);
        let s = t.to_string();
        assert!(s.ends_with(".123Z"), "{s}");
        assert_eq!(s.parse::<Timestamp>().unwrap(), t);
        let json = serde_json::to_string(&t).unwrap();
        assert_eq!(serde_json::from_str::<Timestamp>(&json).unwrap(), t);
    }

    #[test]
    fn garbage_timestamp_is_an_error() {
        assert!("yesterday".parse::<Timestamp>().is_err());
        assert!(serde_json::from_str::<Timestamp>("\"2026-13-01T00:00:00Z\"").is_err());
    }

    #[test]
    fn saturating_arithmetic() {
        let t = Timestamp::from_millis(1000);
        assert_eq!(t.saturating_sub(Duration::from_secs(5)), Timestamp::EPOCH);
        assert_eq!(t.saturating_add(Duration::from_millis(1500)).as_millis(), 2500);
        assert_eq!(
            t.saturating_duration_since(Timestamp::from_millis(4000)),
            Duration::ZERO
        );
    }

    #[test]
    fn manual_clock_moves_only_when_told() {
        let c = ManualClock::new(Timestamp::from_millis(10));
        assert_eq!(c.now().as_millis(), 10);
        c.advance(Duration::from_millis(5));
        assert_eq!(c.now().as_millis(), 15);
    }

    #[cfg(feature = "runtime")]
    #[tokio::test(start_paused = true)]
    async fn tokio_clock_follows_virtual_time() {
        let c = TokioClock::starting_at(Timestamp::from_millis(1_000_000));
        tokio::time::advance(Duration::from_secs(90)).await;
        assert_eq!(c.now().as_millis(), 1_090_000);
    }
}
