//! The probe cycle of one monitored silo (pattern: `foca`'s `probe.rs`).
//!
//! A [`ProbeCycle`] sends a ping every probe period (`probe_timeout / 2`), each with
//! the adaptive timeout `T'` (at least `probe_timeout` by default), keeping at most
//! [`MAX_OUTSTANDING`] pings in flight. Every ping has a sequence number; a result
//! for a number the cycle no longer waits for is ignored, so a late or duplicated
//! result can never count twice.
//!
//! Escalation, measured in time rather than in pings:
//! - the **suspicion window** opens at the send time of the first ping that failed
//!   after the last answered one; any answer closes it;
//! - once the window is `(limit - 1) x T'` old, one **indirect probe** goes through a
//!   random healthy intermediary (its "answered" closes the window: the problem is
//!   our link; its "failed", from a healthy intermediary, adds the intermediary's
//!   vote);
//! - once the window is `limit x T'` old and at least `limit` pings failed, the cycle
//!   asks for a **vote** and starts a new window.
//!
//! A failure handled more than `2 x T'` after its ping was sent is discarded: this
//! silo's own event loop was stalled, which is no evidence against the target.
//!
//! Why time: because pings overlap, the target has been silent for the whole window
//! when it votes, so a silo that stalls for less than `limit x T'` (minus one round
//! trip) is never voted against, however the stall lines up with the pings; while a
//! crashed silo (refused at once) is voted against `limit x T'` after the first ping
//! that found it gone, which is at most one probe period after the crash.

use std::collections::BTreeMap;
use std::time::Duration;

use crate::{ClusterMembershipOptions, SiloAddress, Timestamp};

use super::probe_timeout::ProbeTimeout;

/// Pings of one target in flight at most.
pub const MAX_OUTSTANDING: usize = 4;

/// The result of one ping, as the transport reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum PingOutcome {
    /// The target answered as itself, after `rtt`.
    Answered {
        /// The round trip.
        rtt: Duration,
    },
    /// Another generation answers on the target's endpoint: the target is gone.
    WrongSilo,
    /// No answer (timeout, refused connection, reset, refused cluster, bad frame).
    Failed,
}

/// The result of an indirect probe, as the intermediary reports it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndirectOutcome {
    /// The intermediary reached the target.
    Answered,
    /// The intermediary could not reach the target; its own health score (0 =
    /// healthy; anything else makes the result unknown).
    Failed {
        /// The intermediary's local health score.
        intermediary_health: u8,
    },
    /// No answer from the intermediary.
    Unknown,
}

impl PingOutcome {
    /// Classifies the answer to a ping of `target` that took `rtt`: `responder` is
    /// the silo that answered (`None`: no answer at all). Only `target` itself
    /// (same generation) answering is alive; another generation on its endpoint
    /// means it is gone.
    pub fn classify(target: &SiloAddress, responder: Option<SiloAddress>, rtt: Duration) -> Self {
        match responder {
            Some(r) if r == *target => PingOutcome::Answered { rtt },
            Some(_) => PingOutcome::WrongSilo,
            None => PingOutcome::Failed,
        }
    }
}

/// Whether silo `me` answers a ping addressed to `target` as alive ("Pong"): only
/// when `me` *is* `target`, same generation, so a restarted process never keeps
/// its predecessor alive. Otherwise it answers "wrong silo".
pub fn answers_ping(me: &SiloAddress, target: &SiloAddress) -> bool {
    me == target
}

/// Pings an intermediary sends to a suspect for one indirect probe.
///
/// A "no" from the intermediary becomes a second vote against the target, so it
/// must not rest on one message: under 5% loss a ping or its pong is lost about one
/// time in ten, while three pings are all lost about one time in a thousand.
pub const INDIRECT_ATTEMPTS: u32 = 3;

/// The share of its own wait that a prober gives the intermediary of an indirect
/// probe (80%), so that the intermediary's answer can still reach the prober.
pub fn intermediary_timeout(prober_timeout: Duration) -> Duration {
    prober_timeout.mul_f64(0.8)
}

/// What an intermediary does next in an [`IndirectProbe`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum IndirectStep {
    /// Send one more ping to the target now, due by [`IndirectProbe::timeout`]
    /// after the start.
    Send,
    /// Wait for a ping's result, or until this much time after the start
    /// (`None`: only for results; every ping in flight is due by the timeout).
    Wait(Option<Duration>),
    /// The probe is over: whether the target answered.
    Done(bool),
}

/// The intermediary's side of an indirect probe (sans-io): whether the target
/// answers any of [`INDIRECT_ATTEMPTS`] pings, all due by the timeout. The first
/// goes at once, the next at `timeout / 3` and `2 x timeout / 3`, or as soon as the
/// one before fails outright (a refused connection is no lost message, so a
/// crashed target is reported as fast as with one ping). The first answer ends it.
///
/// Drive it with [`step`](Self::step) (elapsed time since the start in, what to do
/// out) and report each ping's result with [`answered`](Self::answered) or
/// [`failed`](Self::failed).
#[derive(Clone, Debug)]
pub struct IndirectProbe {
    timeout: Duration,
    sent: u32,
    failed: u32,
    /// Failures not yet answered with a ping.
    retries: u32,
    answered: bool,
}

impl IndirectProbe {
    /// A probe that gives the target `requested` (what the prober asked for), at
    /// most `max`.
    pub fn new(requested: Duration, max: Duration) -> Self {
        IndirectProbe {
            timeout: requested.min(max),
            sent: 0,
            failed: 0,
            retries: 0,
            answered: false,
        }
    }

    /// The whole probe's deadline, after the start.
    pub fn timeout(&self) -> Duration {
        self.timeout
    }

    /// What to do at `elapsed` after the start. After [`IndirectStep::Send`] the
    /// ping counts as sent.
    pub fn step(&mut self, elapsed: Duration) -> IndirectStep {
        if self.answered {
            return IndirectStep::Done(true);
        }
        let in_flight = self.sent - self.failed;
        let more = self.sent < INDIRECT_ATTEMPTS && elapsed < self.timeout;
        let due = self.timeout / INDIRECT_ATTEMPTS * self.sent;
        if more && self.retries > 0 {
            // A failure is answered with the next ping at once.
            self.retries = self.retries.saturating_sub(1);
            self.sent += 1;
            return IndirectStep::Send;
        }
        if more && elapsed >= due {
            self.sent += 1;
            return IndirectStep::Send;
        }
        if in_flight == 0 {
            return IndirectStep::Done(false);
        }
        IndirectStep::Wait(more.then_some(due))
    }

    /// A ping was answered by the target itself.
    pub fn answered(&mut self) {
        self.answered = true;
    }

    /// A ping failed (no answer within its time, refused, or another generation).
    pub fn failed(&mut self) {
        if self.failed < self.sent {
            self.failed += 1;
            self.retries += 1;
        }
    }
}

/// Why a silo is suspected.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum SuspectReason {
    /// Probes (and the indirect probe) went unanswered for the whole window.
    MissedProbes,
    /// Another generation answers on its endpoint.
    WrongSilo,
    /// It has been Joining longer than `max_join_attempt_time`.
    StuckJoining,
}

/// What the cycle asks for after a result.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Nothing to do.
    Nothing,
    /// Send an indirect probe now (the caller picks the intermediary and calls
    /// [`ProbeCycle::indirect_sent`]).
    AskIntermediary,
    /// Vote against the target, with the intermediary's vote if it also failed.
    Suspect {
        /// Why.
        reason: SuspectReason,
        /// A healthy intermediary that could not reach the target either.
        intermediary: Option<SiloAddress>,
    },
}

/// The probing state of one target.
#[derive(Clone, Debug)]
pub struct ProbeCycle {
    target: SiloAddress,
    timeout: ProbeTimeout,
    /// Pings in flight: sequence number -> send time.
    outstanding: BTreeMap<u64, Timestamp>,
    /// Send time of the first failed ping since the last answer.
    window_start: Option<Timestamp>,
    failed: u32,
    indirect: Option<(u64, SiloAddress)>,
    indirect_tried: bool,
    indirect_failed_via: Option<SiloAddress>,
}

impl ProbeCycle {
    /// A cycle for `target` with the options' timeout bounds.
    pub fn new(target: SiloAddress, options: &ClusterMembershipOptions) -> Self {
        ProbeCycle {
            target,
            timeout: ProbeTimeout::new(
                options.probe_timeout,
                options.effective_min_probe_timeout(),
                options.effective_max_probe_timeout(),
            ),
            outstanding: BTreeMap::new(),
            window_start: None,
            failed: 0,
            indirect: None,
            indirect_tried: false,
            indirect_failed_via: None,
        }
    }

    /// The probed silo.
    pub fn target(&self) -> SiloAddress {
        self.target
    }

    /// The timeout `T'` of the next ping, with the local health score applied.
    pub fn current_timeout(&self, health: u8, options: &ClusterMembershipOptions) -> Duration {
        self.timeout
            .timeout(health, options.extend_probe_timeout_during_degradation)
    }

    /// Whether a suspicion window is open (some ping failed since the last answer).
    pub fn is_suspicious(&self) -> bool {
        self.window_start.is_some()
    }

    /// The probe period elapsed: returns the timeout for a ping numbered `seq` if one
    /// may be sent now (fewer than [`MAX_OUTSTANDING`] in flight), and records it.
    pub fn tick(
        &mut self,
        seq: u64,
        now: Timestamp,
        health: u8,
        options: &ClusterMembershipOptions,
    ) -> Option<Duration> {
        if self.outstanding.len() >= MAX_OUTSTANDING {
            return None;
        }
        self.outstanding.insert(seq, now);
        Some(self.current_timeout(health, options))
    }

    fn close_window(&mut self) {
        self.window_start = None;
        self.failed = 0;
        self.indirect_tried = false;
        self.indirect_failed_via = None;
    }

    /// The result of ping `seq`.
    pub fn on_ping(
        &mut self,
        seq: u64,
        outcome: PingOutcome,
        now: Timestamp,
        health: u8,
        options: &ClusterMembershipOptions,
    ) -> Verdict {
        let Some(sent) = self.outstanding.remove(&seq) else {
            return Verdict::Nothing; // not ours, or already counted
        };
        match outcome {
            PingOutcome::Answered { rtt } => {
                self.timeout.record(rtt);
                self.close_window();
                Verdict::Nothing
            }
            PingOutcome::WrongSilo => {
                self.close_window();
                Verdict::Suspect {
                    reason: SuspectReason::WrongSilo,
                    intermediary: None,
                }
            }
            PingOutcome::Failed => {
                let limit = options.num_missed_probes_limit;
                let t = self.current_timeout(health, options);
                if now.saturating_duration_since(sent) > t.saturating_mul(2) {
                    // We handle this failure long after its deadline: our own event
                    // loop was stalled, and that says nothing about the target
                    // (Lifeguard's self-awareness). Not counted.
                    return Verdict::Nothing;
                }
                self.failed += 1;
                let start = *self.window_start.get_or_insert(sent);
                let silent = now.saturating_duration_since(start);
                if self.failed >= limit && silent >= t.saturating_mul(limit) {
                    let intermediary = self.indirect_failed_via.take();
                    self.close_window();
                    return Verdict::Suspect {
                        reason: SuspectReason::MissedProbes,
                        intermediary,
                    };
                }
                let indirect_due = options.enable_indirect_probes
                    && limit > 1
                    && !self.indirect_tried
                    && self.indirect.is_none()
                    && self.failed + 1 >= limit
                    && silent >= t.saturating_mul(limit - 1);
                if indirect_due {
                    Verdict::AskIntermediary
                } else {
                    Verdict::Nothing
                }
            }
        }
    }

    /// Records that an indirect probe numbered `seq` went out through `via` (or that
    /// no intermediary was available, with `None`: then none is tried in this window).
    pub fn indirect_sent(&mut self, probe: Option<(u64, SiloAddress)>) {
        self.indirect_tried = true;
        self.indirect = probe;
    }

    /// The result of indirect probe `seq`.
    pub fn on_indirect(&mut self, seq: u64, outcome: IndirectOutcome) {
        let Some((expected, via)) = self.indirect else {
            return;
        };
        if expected != seq {
            return;
        }
        self.indirect = None;
        match outcome {
            // The target is alive; the trouble is between us.
            IndirectOutcome::Answered => self.close_window(),
            IndirectOutcome::Failed {
                intermediary_health: 0,
            } if self.window_start.is_some() => self.indirect_failed_via = Some(via),
            _ => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(n: u64) -> Duration {
        Duration::from_millis(n)
    }

    /// Regression: with one ping per indirect probe, benchmark D2 (50 silos, 30
    /// minutes, 5% loss) saw one lost ping or pong declare a live silo Dead:
    /// the prober had just seen its own pings fail, so the intermediary's "no"
    /// was the second vote.
    #[test]
    fn indirect_probe_staggers_three_pings_and_stops_at_the_first_answer() {
        let mut p = IndirectProbe::new(ms(900), ms(10_000));
        assert_eq!(p.step(ms(0)), IndirectStep::Send);
        assert_eq!(p.step(ms(0)), IndirectStep::Wait(Some(ms(300))));
        assert_eq!(p.step(ms(300)), IndirectStep::Send);
        assert_eq!(p.step(ms(301)), IndirectStep::Wait(Some(ms(600))));
        assert_eq!(p.step(ms(600)), IndirectStep::Send);
        assert_eq!(p.step(ms(601)), IndirectStep::Wait(None), "all three sent");
        p.answered();
        assert_eq!(p.step(ms(650)), IndirectStep::Done(true));
    }

    #[test]
    fn indirect_probe_answers_a_refusal_with_the_next_ping_and_says_no_after_three() {
        let mut p = IndirectProbe::new(ms(900), ms(10_000));
        assert_eq!(p.step(ms(0)), IndirectStep::Send);
        p.failed();
        assert_eq!(p.step(ms(1)), IndirectStep::Send, "a refusal is answered at once");
        p.failed();
        assert_eq!(p.step(ms(2)), IndirectStep::Send);
        p.failed();
        assert_eq!(p.step(ms(3)), IndirectStep::Done(false));
        // Results beyond the pings sent count for nothing.
        p.failed();
        assert_eq!(p.step(ms(4)), IndirectStep::Done(false));
    }

    #[test]
    fn indirect_probe_sends_nothing_after_its_timeout_and_is_clamped() {
        let mut p = IndirectProbe::new(ms(60_000), ms(900));
        assert_eq!(p.timeout(), ms(900));
        assert_eq!(p.step(ms(0)), IndirectStep::Send);
        assert_eq!(p.step(ms(950)), IndirectStep::Wait(None));
        p.failed();
        assert_eq!(p.step(ms(960)), IndirectStep::Done(false));
        assert_eq!(intermediary_timeout(ms(1000)), ms(800));
    }

    #[test]
    fn only_the_same_generation_answers_a_ping() {
        let me: SiloAddress = "10.0.0.1:11111@2".parse().unwrap();
        let old: SiloAddress = "10.0.0.1:11111@1".parse().unwrap();
        assert!(answers_ping(&me, &me));
        assert!(!answers_ping(&me, &old));
        assert_eq!(
            PingOutcome::classify(&old, Some(me), ms(5)),
            PingOutcome::WrongSilo
        );
        assert_eq!(
            PingOutcome::classify(&me, Some(me), ms(5)),
            PingOutcome::Answered { rtt: ms(5) }
        );
        assert_eq!(PingOutcome::classify(&me, None, ms(5)), PingOutcome::Failed);
    }

    fn opts() -> ClusterMembershipOptions {
        ClusterMembershipOptions::default() // T = 5 s, limit 3
    }

    fn at(ms: u64) -> Timestamp {
        Timestamp::from_millis(1_000_000 + ms)
    }

    fn target() -> SiloAddress {
        "10.0.0.9:1@1".parse().unwrap()
    }

    /// Drives a cycle with pings every period against a target that is silent from
    /// `silent_from` to `silent_until` (ms), refused (`refused`) or timing out;
    /// returns the time of the first vote, if any, before `end`.
    fn drive(silent_from: u64, silent_until: u64, refused: bool, end: u64) -> Option<u64> {
        let o = opts();
        let mut c = ProbeCycle::new(target(), &o);
        let period = o.probe_period().as_millis() as u64;
        let mut pending: Vec<(u64, u64, PingOutcome)> = Vec::new(); // (result at, seq, outcome)
        let mut seq = 0;
        let mut t = 0;
        while t <= end {
            // results due by now, in time order
            pending.sort_by_key(|p| p.0);
            while let Some(&(when, s, outcome)) = pending.first() {
                if when > t {
                    break;
                }
                pending.remove(0);
                if let Verdict::Suspect { .. } = c.on_ping(s, outcome, at(when), 0, &o) {
                    return Some(when);
                }
            }
            if t % period == 0 {
                seq += 1;
                if let Some(timeout) = c.tick(seq, at(t), 0, &o) {
                    let timeout = timeout.as_millis() as u64;
                    let silent = t >= silent_from && t < silent_until;
                    let r = if !silent {
                        (
                            t + 1,
                            seq,
                            PingOutcome::Answered {
                                rtt: Duration::from_millis(1),
                            },
                        )
                    } else if refused {
                        (t, seq, PingOutcome::Failed)
                    } else if silent_until < t + timeout {
                        // the stalled target answers when it resumes
                        (
                            silent_until + 1,
                            seq,
                            PingOutcome::Answered {
                                rtt: Duration::from_millis(1),
                            },
                        )
                    } else {
                        (t + timeout, seq, PingOutcome::Failed)
                    };
                    pending.push(r);
                }
            }
            t += 1;
        }
        None
    }

    #[test]
    fn a_stall_shorter_than_the_limit_never_votes_whatever_its_phase() {
        // limit x T = 15 s; stalls of 14.9 s starting at every 100 ms of a period.
        for phase in (0..2500).step_by(100) {
            let from = 20_000 + phase;
            assert_eq!(drive(from, from + 14_900, false, 60_000), None, "phase {phase}");
        }
    }

    #[test]
    fn a_crash_is_voted_within_limit_times_t_plus_one_period() {
        for phase in (0..2500).step_by(100) {
            let crash = 20_000 + phase;
            let voted = drive(crash, u64::MAX, true, 60_000).expect("vote");
            let took = voted - crash;
            assert!((15_000..=17_500).contains(&took), "phase {phase}: {took} ms");
            // A silent (not refused) crash: the last ping times out 15 s after the first.
            let voted = drive(crash, u64::MAX, false, 60_000).expect("vote");
            let took = voted - crash;
            assert!((15_000..=17_500).contains(&took), "phase {phase}: {took} ms");
        }
    }

    #[test]
    fn stale_and_duplicate_results_are_ignored() {
        let o = opts();
        let mut c = ProbeCycle::new(target(), &o);
        assert!(c.tick(1, at(0), 0, &o).is_some());
        assert_eq!(
            c.on_ping(1, PingOutcome::Failed, at(5000), 0, &o),
            Verdict::Nothing
        );
        assert!(c.is_suspicious());
        // seq 1 again (a duplicate) and seq 9 (never sent) change nothing
        assert_eq!(
            c.on_ping(1, PingOutcome::Failed, at(90_000), 0, &o),
            Verdict::Nothing
        );
        assert_eq!(
            c.on_ping(9, PingOutcome::Failed, at(90_000), 0, &o),
            Verdict::Nothing
        );
        assert_eq!(c.failed, 1);
    }

    #[test]
    fn failures_handled_late_after_our_own_stall_are_not_evidence() {
        let o = opts();
        let mut c = ProbeCycle::new(target(), &o);
        for seq in 0..4 {
            c.tick(seq, at(seq * 2500), 0, &o);
        }
        // We were frozen for a minute: every timeout is handled at once, late.
        for seq in 0..4 {
            assert_eq!(
                c.on_ping(seq, PingOutcome::Failed, at(60_000), 0, &o),
                Verdict::Nothing
            );
        }
        assert!(!c.is_suspicious());
    }

    #[test]
    fn at_most_max_outstanding_pings() {
        let o = opts();
        let mut c = ProbeCycle::new(target(), &o);
        let sent = (0..10)
            .filter(|&i| c.tick(i, at(i * 10), 0, &o).is_some())
            .count();
        assert_eq!(sent, MAX_OUTSTANDING);
    }

    #[test]
    fn indirect_answer_closes_the_window_and_failure_adds_the_intermediary() {
        let o = opts();
        let via: SiloAddress = "10.0.0.3:1@1".parse().unwrap();
        let run = |outcome: IndirectOutcome| {
            let mut c = ProbeCycle::new(target(), &o);
            let mut asked = false;
            for i in 0..12u64 {
                let t = i * 2500;
                c.tick(i, at(t), 0, &o);
                match c.on_ping(i, PingOutcome::Failed, at(t + 5000), 0, &o) {
                    Verdict::AskIntermediary => {
                        asked = true;
                        c.indirect_sent(Some((100, via)));
                        c.on_indirect(100, outcome);
                    }
                    Verdict::Suspect { intermediary, .. } => return (asked, Some(intermediary)),
                    Verdict::Nothing => {}
                }
            }
            (asked, None)
        };
        assert_eq!(
            run(IndirectOutcome::Failed {
                intermediary_health: 0
            }),
            (true, Some(Some(via)))
        );
        // An unhealthy intermediary's failure is no vote.
        assert_eq!(
            run(IndirectOutcome::Failed {
                intermediary_health: 3
            }),
            (true, Some(None))
        );
        // Answered: the window closes each time; the target is reachable by others,
        // so this prober never votes.
        assert_eq!(run(IndirectOutcome::Answered), (true, None));
    }
}
