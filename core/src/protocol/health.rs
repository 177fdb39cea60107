//! The local health score (Lifeguard, Dadgar et al., *Lifeguard: Local Health
//! Awareness for More Accurate Failure Detection*, 2018; Orleans'
//! `LocalSiloHealthMonitor`).
//!
//! A silo that is itself slow or cut off should not accuse others. Every
//! `local_health_monitoring_period` the silo scores itself from 0 (healthy) to 8 and
//! uses the score to lengthen its probe timeouts and to answer "unknown" instead of
//! "unreachable" when it serves as an indirect-probe intermediary.

use std::time::Duration;

/// The largest score.
pub const MAX_SCORE: u8 = 8;

/// What the silo observed about itself over the last monitoring period.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct HealthInputs {
    /// Probes this silo sent.
    pub probes_sent: u32,
    /// Of those, how many were answered.
    pub probes_answered: u32,
    /// Probes other silos sent to this one.
    pub probes_received: u32,
    /// Whether others are expected to probe us (we are Active and not alone).
    pub expecting_probes: bool,
    /// Whether our own row carries fresh suspicion votes.
    pub suspected: bool,
    /// Whether this silo's last reach round found no majority of the active silos
    /// (see [`reach`](super::reach)): it is probably the one cut off.
    pub cut_off: bool,
    /// How late this silo's timers fired (event-loop / scheduling delay).
    pub event_loop_delay: Duration,
}

/// The score, 0..=[`MAX_SCORE`]:
/// - +2 if probes were sent and none was answered (we are probably the one cut off);
/// - +1 if others should probe us and none did;
/// - +2 if our own row is suspected;
/// - +1 if we reach no majority of the active silos (probe timeouts double: in a
///   partition this silo does not vote anyway; after a mass crash it is one of the
///   survivors, which must still detect the crashed silos once they go stale);
/// - +1 per full second of event-loop delay, up to +3.
pub fn local_health_score(i: &HealthInputs) -> u8 {
    let mut score: u32 = 0;
    if i.probes_sent > 0 && i.probes_answered == 0 {
        score += 2;
    }
    if i.expecting_probes && i.probes_received == 0 {
        score += 1;
    }
    if i.suspected {
        score += 2;
    }
    if i.cut_off {
        score += 1;
    }
    score += (i.event_loop_delay.as_secs() as u32).min(3);
    score.min(u32::from(MAX_SCORE)) as u8
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn healthy_is_zero_and_score_is_bounded() {
        let ok = HealthInputs {
            probes_sent: 3,
            probes_answered: 3,
            probes_received: 2,
            expecting_probes: true,
            ..Default::default()
        };
        assert_eq!(local_health_score(&ok), 0);
        // Some missed probes alone (a dead peer) do not make us unhealthy.
        assert_eq!(
            local_health_score(&HealthInputs {
                probes_answered: 1,
                ..ok
            }),
            0
        );
        let worst = HealthInputs {
            probes_sent: 3,
            probes_answered: 0,
            probes_received: 0,
            expecting_probes: true,
            suspected: true,
            cut_off: true,
            event_loop_delay: Duration::from_secs(60),
        };
        assert_eq!(local_health_score(&worst), MAX_SCORE);
        assert_eq!(local_health_score(&HealthInputs { cut_off: true, ..ok }), 1);
        assert_eq!(
            local_health_score(&HealthInputs {
                suspected: true,
                ..ok
            }),
            2
        );
        assert_eq!(
            local_health_score(&HealthInputs {
                probes_received: 0,
                ..ok
            }),
            1
        );
        assert_eq!(
            local_health_score(&HealthInputs {
                event_loop_delay: Duration::from_millis(2500),
                ..ok
            }),
            2
        );
    }
}
