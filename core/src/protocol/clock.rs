//! How far this silo's wall clock is from its peers', measured from the probes
//! it already sends, and whether that is within the cluster's bound
//! (`max_clock_offset`).
//!
//! Each ping carries the prober's send time (`T1`); each pong the responder's
//! receive and send times (`T2`, `T3`); the prober notes when the pong arrived
//! (`T4`). As in NTP (RFC 5905, section 8), the peer's clock is ahead of ours
//! by `θ = ((T2 - T1) + (T3 - T4)) / 2`, give or take half the round trip
//! `δ = (T4 - T1) - (T3 - T2)`. Of each peer's last [`SAMPLES`] samples the
//! one with the shortest round trip is used (NTP's clock filter: a sample
//! delayed one way is off by up to half its delay).
//!
//! A sample is kept with the local wall clock's distance from the monotonic
//! clock at that moment. A later step of the local wall clock (a VM resumed
//! from a pause, an NTP step) moves that distance by the step, so the offset is
//! corrected at once, before any new probe answers: a silo cut from its peers
//! still knows that its clock jumped.
//!
//! The silo's offset is its clock's distance from the median of the cluster's
//! clocks, its own (at 0) and its peers' as measured. It is within the bound
//! while that is at most half of `max_clock_offset`, so two silos both within
//! it differ by at most `max_clock_offset` (CockroachDB's `max-offset`, whose
//! nodes stop when they are off from most of their peers, is the model). One
//! silo whose clock is off is outvoted from three silos up; with an even count
//! the middle clock nearer to ours counts, so with two silos neither can tell
//! whose clock is wrong and neither is beyond, except after a step of its own
//! clock measured against its last samples. With no peer measured yet, a silo
//! is within (there is nothing to compare with).

use std::collections::{HashMap, VecDeque};
use std::time::Duration;

use crate::{SiloAddress, Timestamp};

/// Samples kept per peer (NTP's clock filter keeps 8).
pub const SAMPLES: usize = 8;

/// The four timestamps of one ping and its pong, with the local monotonic time
/// when the pong arrived.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClockSample {
    /// The peer that answered.
    pub peer: SiloAddress,
    /// `T1`: when the ping was sent, on this silo's wall clock.
    pub sent: Timestamp,
    /// `T2`: when the peer received it, on the peer's wall clock.
    pub peer_received: Timestamp,
    /// `T3`: when the peer sent its pong, on the peer's wall clock.
    pub peer_sent: Timestamp,
    /// `T4`: when the pong arrived, on this silo's wall clock.
    pub received: Timestamp,
    /// The monotonic time when the ping was sent (the origin of `monotonic`).
    pub sent_monotonic: Duration,
    /// The monotonic time when the pong arrived (any fixed origin, the same
    /// for every sample and [`ClockOffsets::report`]).
    pub monotonic: Duration,
}

impl ClockSample {
    /// This silo's clock ahead of the peer's (`-θ`), in ms, and the round trip
    /// less the peer's own time (`δ`, at least 0), in ms.
    ///
    /// `T1` is taken as `T4` less the round trip on the monotonic clock, so
    /// both local times are read on the wall clock the pong came back to: a
    /// step of the local clock while the ping was in flight would otherwise
    /// count half of it in `θ` and shorten `δ` by all of it (a step back
    /// makes the sample look the most precise of all). `sent` is what the
    /// ping carried; it agrees with this `T1` unless the clock stepped.
    fn ahead_and_delay(&self) -> (i64, i64) {
        // In i128: a peer's garbage times cannot overflow.
        let [t2, t3, t4] =
            [self.peer_received, self.peer_sent, self.received].map(|t| i128::from(t.as_millis()));
        let round_trip = i128::try_from(self.monotonic.saturating_sub(self.sent_monotonic).as_millis())
            .unwrap_or(i128::MAX / 4);
        let t1 = t4 - round_trip;
        let theta = ((t2 - t1) + (t3 - t4)) / 2;
        let delay = ((t4 - t1) - (t3 - t2)).max(0);
        let clamp = |v: i128| i64::try_from(v).unwrap_or(if v < 0 { i64::MIN } else { i64::MAX });
        (clamp(-theta), clamp(delay))
    }
}

/// One kept sample: the offset, its round trip, and the local wall clock's
/// distance from the monotonic clock when it was taken (all ms).
#[derive(Clone, Copy, Debug)]
struct Kept {
    ahead: i64,
    delay: i64,
    wall_less_monotonic: i64,
}

/// This silo's clock against its peers', as [`ClockOffsets::report`] sees it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ClockReport {
    /// How far this silo's clock is ahead of the median of the cluster's clocks
    /// (its own and its peers'; negative: behind), in ms; `None` before any
    /// peer answered a probe.
    pub offset_ms: Option<i64>,
    /// Half the round trip of the median clock's sample: how far off
    /// `offset_ms` may be, in ms (0 when the median is this silo's own).
    pub uncertainty_ms: i64,
    /// How many peers were measured.
    pub peers: usize,
    /// The cluster's bound between any two silos' clocks (`max_clock_offset`).
    pub max_offset: Duration,
    /// Whether `|offset_ms|` is at most half of `max_offset` (true with no peer
    /// measured).
    pub within_bound: bool,
}

impl ClockReport {
    /// The report of a silo that measured nothing yet.
    pub fn unmeasured(max_offset: Duration) -> Self {
        ClockReport {
            offset_ms: None,
            uncertainty_ms: 0,
            peers: 0,
            max_offset,
            within_bound: true,
        }
    }
}

impl std::fmt::Display for ClockReport {
    /// `+2503 ms (±1 ms, 4 peers): beyond the bound of ±250 ms`, or
    /// `unmeasured`.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let Some(offset) = self.offset_ms else {
            return f.write_str("unmeasured");
        };
        write!(
            f,
            "{offset:+} ms (±{} ms, {} peers): {} the bound of ±{} ms",
            self.uncertainty_ms,
            self.peers,
            if self.within_bound { "within" } else { "beyond" },
            self.max_offset.as_millis() / 2
        )
    }
}

/// The offsets measured to each peer (see the module docs for the rules).
#[derive(Debug)]
pub struct ClockOffsets {
    max_offset: Duration,
    peers: HashMap<SiloAddress, VecDeque<Kept>>,
}

impl ClockOffsets {
    /// No sample yet; `max_offset` is the cluster's `max_clock_offset`.
    pub fn new(max_offset: Duration) -> Self {
        ClockOffsets {
            max_offset,
            peers: HashMap::new(),
        }
    }

    /// Records one ping's four timestamps.
    pub fn sample(&mut self, s: &ClockSample) {
        let (ahead, delay) = s.ahead_and_delay();
        let wall = i64::try_from(s.received.as_millis()).unwrap_or(i64::MAX);
        let mono = i64::try_from(s.monotonic.as_millis()).unwrap_or(i64::MAX);
        let kept = self.peers.entry(s.peer).or_default();
        if kept.len() == SAMPLES {
            kept.pop_front();
        }
        kept.push_back(Kept {
            ahead,
            delay,
            wall_less_monotonic: wall.saturating_sub(mono),
        });
    }

    /// Forgets the peers `keep` rejects (those no longer in the view).
    pub fn retain(&mut self, mut keep: impl FnMut(&SiloAddress) -> bool) {
        self.peers.retain(|p, _| keep(p));
    }

    /// The offset from the median clock at wall time `now` and monotonic time
    /// `monotonic`: each peer's best sample, moved by any step of the local
    /// wall clock since it was taken, and this silo's own clock at 0.
    pub fn report(&self, now: Timestamp, monotonic: Duration) -> ClockReport {
        let wall_less_monotonic = i64::try_from(now.as_millis())
            .unwrap_or(i64::MAX)
            .saturating_sub(i64::try_from(monotonic.as_millis()).unwrap_or(i64::MAX));
        let mut offsets: Vec<(i64, i64)> = self
            .peers
            .values()
            .filter_map(|kept| kept.iter().min_by_key(|k| k.delay))
            .map(|k| {
                let stepped = wall_less_monotonic.saturating_sub(k.wall_less_monotonic);
                (k.ahead.saturating_add(stepped), k.delay / 2)
            })
            .collect();
        if offsets.is_empty() {
            return ClockReport::unmeasured(self.max_offset);
        }
        let peers = offsets.len();
        // This silo's own clock counts as one of the cluster's, at 0.
        offsets.push((0, 0));
        offsets.sort_unstable();
        let mid = offsets.len() / 2;
        let (offset, uncertainty) = if offsets.len() % 2 == 1 {
            offsets[mid]
        } else {
            // Of the two middle clocks, the one nearer to ours: with as many
            // clocks on each side, nobody can tell whose is wrong.
            let (low, high) = (offsets[mid - 1], offsets[mid]);
            if low.0.unsigned_abs() <= high.0.unsigned_abs() {
                low
            } else {
                high
            }
        };
        let half = i64::try_from(self.max_offset.as_millis() / 2).unwrap_or(i64::MAX);
        ClockReport {
            offset_ms: Some(offset),
            uncertainty_ms: uncertainty,
            peers,
            max_offset: self.max_offset,
            within_bound: offset.unsigned_abs() <= half.unsigned_abs(),
        }
    }
}

/// Notices a step of the local wall clock between two readings, at once and
/// with no peer: the wall clock's distance from the monotonic clock moved by
/// more than the threshold (plus 1 ms per second between the readings, twice
/// what an NTP slew, at most 500 ppm, can move it).
///
/// [`ClockOffsets::report`] corrects the offset for a step too, but only when
/// the silo next computes a report (after a probe, which a silo cut from its
/// peers waits out); a service that must not act on a stepped clock in
/// between (the reminder service: a clock stepped ahead delivers ticks early,
/// which a successor delivers again) reads the clock through a `StepWatch`
/// and, on a step, stops as if the report were beyond the bound until a
/// report computed after the step says otherwise.
#[derive(Clone, Copy, Debug, Default)]
pub struct StepWatch {
    /// The last reading: the wall clock less the monotonic clock, and the
    /// monotonic clock (ms).
    last: Option<(i64, i64)>,
}

impl StepWatch {
    /// A watch with no reading yet.
    pub fn new() -> Self {
        StepWatch::default()
    }

    /// Reads the wall clock `now` at monotonic time `monotonic` (any fixed
    /// origin, the same at every call). Returns the step since the previous
    /// reading, in ms (positive: the wall clock jumped ahead), when it is over
    /// `threshold`; `None` at the first reading and for anything smaller.
    pub fn observe(&mut self, now: Timestamp, monotonic: Duration, threshold: Duration) -> Option<i64> {
        let wall = i64::try_from(now.as_millis()).unwrap_or(i64::MAX);
        let mono = i64::try_from(monotonic.as_millis()).unwrap_or(i64::MAX);
        let wall_less_monotonic = wall.saturating_sub(mono);
        let (last, last_mono) = self.last.replace((wall_less_monotonic, mono))?;
        let step = wall_less_monotonic.saturating_sub(last);
        let slew = mono.saturating_sub(last_mono).max(0) / 1_000;
        let allowed = i64::try_from(threshold.as_millis())
            .unwrap_or(i64::MAX)
            .saturating_add(slew);
        (step.unsigned_abs() > allowed.unsigned_abs()).then_some(step)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn silo(port: u16) -> SiloAddress {
        format!("127.0.0.1:{port}@1").parse().unwrap()
    }

    /// A ping sent at local wall time `t1` (monotonic `t1` too) to a peer whose
    /// clock is `peer_ahead` ms ahead, `one_way` ms each way.
    fn ping(peer: u16, t1: u64, peer_ahead: i64, one_way: u64) -> ClockSample {
        let at = |t: u64| Timestamp::from_millis((t as i64 + peer_ahead) as u64);
        ClockSample {
            peer: silo(peer),
            sent: Timestamp::from_millis(t1),
            peer_received: at(t1 + one_way),
            peer_sent: at(t1 + one_way),
            received: Timestamp::from_millis(t1 + 2 * one_way),
            sent_monotonic: Duration::from_millis(t1),
            monotonic: Duration::from_millis(t1 + 2 * one_way),
        }
    }

    /// A ping in flight while this silo's wall clock stepped back 3 s (a
    /// clock fault put right): its wall times span the step, so `T4 - T1`
    /// is -3 s and a rule on wall times alone reads half the step (+1.5 s)
    /// with no uncertainty, the best sample there is. Seen in CI: a silo
    /// whose clock was just put right read itself beyond the bound again
    /// 50 ms later, and its shards moved twice more.
    #[test]
    fn a_ping_in_flight_across_a_step_measures_from_the_clock_it_came_back_to() {
        let mut c = ClockOffsets::new(MAX);
        for port in [1, 2, 3, 4] {
            // Before the step: this clock 3 s ahead of every peer's.
            c.sample(&ping(port, 10_000, -3_000, 1));
        }
        assert!(
            !c.report(Timestamp::from_millis(10_002), Duration::from_millis(10_002))
                .within_bound
        );
        // World time 7,010: sent at wall 10,010 (monotonic 10,010); the
        // clock steps back to the world's; the pong comes back at world
        // 7,012, wall 7,012, monotonic 10,012. The peers are at the world's
        // time. (In CI every peer's ping was in flight.)
        for port in [1, 2, 3, 4] {
            c.sample(&ClockSample {
                peer: silo(port),
                sent: Timestamp::from_millis(10_010),
                peer_received: Timestamp::from_millis(7_011),
                peer_sent: Timestamp::from_millis(7_011),
                received: Timestamp::from_millis(7_012),
                sent_monotonic: Duration::from_millis(10_010),
                monotonic: Duration::from_millis(10_012),
            });
        }
        let r = c.report(Timestamp::from_millis(7_013), Duration::from_millis(10_013));
        assert!(r.within_bound, "{r}");
        assert!(r.offset_ms.is_some_and(|o| o.abs() <= 2), "{r}");
        assert_eq!(r.uncertainty_ms, 1, "{r}");
    }

    const MAX: Duration = Duration::from_millis(500);

    #[test]
    fn nothing_measured_is_within() {
        let c = ClockOffsets::new(MAX);
        let r = c.report(Timestamp::from_millis(5), Duration::from_millis(5));
        assert_eq!(r, ClockReport::unmeasured(MAX));
        assert!(r.within_bound);
        assert_eq!(r.to_string(), "unmeasured");
    }

    #[test]
    fn the_offset_is_from_the_median_clock_and_the_bound_is_half_the_max() {
        let now = || (Timestamp::from_millis(10_004), Duration::from_millis(10_004));
        let mut c = ClockOffsets::new(MAX);
        // Peers 250, 300 and 3000 ms ahead: the clocks are ours (0), 250, 300
        // and 3000; of the middle two, 250 is nearer to ours.
        for (port, ahead) in [(1, 250), (2, 300), (3, 3000)] {
            c.sample(&ping(port, 10_000, ahead, 2));
        }
        let r = c.report(now().0, now().1);
        assert_eq!(r.offset_ms, Some(-250));
        assert_eq!((r.peers, r.uncertainty_ms), (3, 2));
        assert!(r.within_bound, "exactly half the max is within: {r}");
        c.sample(&ping(4, 10_000, 400, 2));
        let r = c.report(now().0, now().1);
        assert_eq!(r.offset_ms, Some(-300), "the median of five clocks");
        assert!(!r.within_bound);
        assert_eq!(
            r.to_string(),
            "-300 ms (±2 ms, 4 peers): beyond the bound of ±250 ms"
        );
        c.retain(|p| *p == silo(3));
        let r = c.report(now().0, now().1);
        assert_eq!(r.offset_ms, Some(0), "two clocks: nobody can tell whose is wrong");
        assert!(r.within_bound);
    }

    #[test]
    fn one_silo_whose_clock_is_off_is_outvoted_from_three_up() {
        let now = (Timestamp::from_millis(10_004), Duration::from_millis(10_004));
        // A healthy silo with a good peer and one 2.5 s ahead.
        let mut healthy = ClockOffsets::new(MAX);
        healthy.sample(&ping(1, 10_000, 0, 1));
        healthy.sample(&ping(2, 10_000, 2_500, 1));
        assert!(healthy.report(now.0, now.1).within_bound);
        // The silo ahead, with its two peers 2.5 s behind it.
        let mut ahead = ClockOffsets::new(MAX);
        ahead.sample(&ping(1, 10_000, -2_500, 1));
        ahead.sample(&ping(2, 10_000, -2_500, 1));
        let r = ahead.report(now.0, now.1);
        assert_eq!(r.offset_ms, Some(2_500));
        assert!(!r.within_bound);
    }

    #[test]
    fn the_shortest_round_trip_wins() {
        let mut c = ClockOffsets::new(MAX);
        // A slow sample whose reply was delayed one way reads 400 ms too far.
        let mut slow = ping(1, 10_000, 0, 2);
        slow.received = Timestamp::from_millis(10_804);
        slow.monotonic = Duration::from_millis(10_804);
        c.sample(&slow);
        c.sample(&ping(2, 10_000, -400, 2));
        let r = c.report(Timestamp::from_millis(11_000), Duration::from_millis(11_000));
        assert_eq!(
            r.offset_ms,
            Some(400),
            "a peer 400 ms behind agrees with the slow sample"
        );
        c.sample(&ping(1, 11_000, 0, 3));
        let r = c.report(Timestamp::from_millis(12_000), Duration::from_millis(12_000));
        assert_eq!(
            r.offset_ms,
            Some(0),
            "the faster sample wins: peer 1 agrees with us"
        );
        // Past SAMPLES newer ones, the old slow one is gone either way.
        for i in 0..SAMPLES as u64 {
            c.sample(&ping(1, 20_000 + i * 1000, 50, 10));
        }
        c.retain(|p| *p == silo(1));
        c.sample(&ping(3, 20_000, 50, 1));
        let r = c.report(Timestamp::from_millis(40_000), Duration::from_millis(40_000));
        assert_eq!(r.offset_ms, Some(-50));
    }

    #[test]
    fn a_step_of_the_local_clock_counts_at_once_without_a_new_probe() {
        let mut c = ClockOffsets::new(MAX);
        for port in 1..=4 {
            c.sample(&ping(port, 10_000, 0, 1));
        }
        let r = c.report(Timestamp::from_millis(10_500), Duration::from_millis(10_500));
        assert_eq!(r.offset_ms, Some(0));
        // The wall clock jumps 2.5 s ahead; the monotonic clock does not.
        let r = c.report(Timestamp::from_millis(13_500), Duration::from_millis(11_000));
        assert_eq!(r.offset_ms, Some(2_500));
        assert!(!r.within_bound);
        // An NTP step back puts it right.
        let r = c.report(Timestamp::from_millis(12_000), Duration::from_millis(12_000));
        assert_eq!(r.offset_ms, Some(0));
        assert!(r.within_bound);
    }

    #[test]
    fn garbage_timestamps_do_not_panic() {
        let mut c = ClockOffsets::new(MAX);
        c.sample(&ClockSample {
            peer: silo(1),
            sent: Timestamp::from_millis(u64::MAX),
            peer_received: Timestamp::EPOCH,
            peer_sent: Timestamp::from_millis(u64::MAX),
            received: Timestamp::EPOCH,
            sent_monotonic: Duration::MAX,
            monotonic: Duration::ZERO,
        });
        let _ = c.report(Timestamp::from_millis(u64::MAX), Duration::ZERO);
        let _ = c.report(Timestamp::EPOCH, Duration::MAX);
    }

    #[test]
    fn a_step_watch_sees_a_step_at_once_and_lets_drift_pass() {
        let bound = Duration::from_millis(250);
        let mut w = StepWatch::new();
        assert_eq!(
            w.observe(Timestamp::from_millis(10_000), Duration::from_millis(0), bound),
            None
        );
        // Time passing on both clocks, and a slew of 200 ms over 100 s.
        assert_eq!(
            w.observe(
                Timestamp::from_millis(20_000),
                Duration::from_millis(10_000),
                bound
            ),
            None
        );
        assert_eq!(
            w.observe(
                Timestamp::from_millis(120_200),
                Duration::from_millis(110_000),
                bound
            ),
            None
        );
        // A 2.5 s jump ahead 10 ms later: seen at the next reading.
        assert_eq!(
            w.observe(
                Timestamp::from_millis(122_710),
                Duration::from_millis(110_010),
                bound
            ),
            Some(2_500)
        );
        // Once: the next reading compares with the stepped clock.
        assert_eq!(
            w.observe(
                Timestamp::from_millis(122_720),
                Duration::from_millis(110_020),
                bound
            ),
            None
        );
        // A step back.
        assert_eq!(
            w.observe(
                Timestamp::from_millis(120_000),
                Duration::from_millis(110_030),
                bound
            ),
            Some(-2_730)
        );
        // Within the threshold: no step.
        assert_eq!(
            w.observe(
                Timestamp::from_millis(120_240),
                Duration::from_millis(110_030),
                bound
            ),
            None
        );
        // Garbage readings do not panic.
        let _ = w.observe(Timestamp::from_millis(u64::MAX), Duration::ZERO, bound);
        let _ = w.observe(Timestamp::EPOCH, Duration::MAX, Duration::MAX);
    }
}
