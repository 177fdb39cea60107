//! The local health monitor: scores this silo's own health every
//! `local_health_monitoring_period` (see [`crate::protocol::health`]).

use std::sync::atomic::{AtomicU32, AtomicU8, Ordering};
use std::time::Duration;

use actix::{Actor, AsyncContext, Context};
use tokio::sync::watch;

use crate::protocol::health::{local_health_score, HealthInputs};
use crate::protocol::votes::fresh_votes;
use crate::SiloStatus;

use super::stop_on_signal;

/// Counters shared by the probe agents, the probe server and the monitor.
#[derive(Debug, Default)]
pub(crate) struct SharedHealth {
    score: AtomicU8,
    pub(crate) probes_sent: AtomicU32,
    pub(crate) probes_answered: AtomicU32,
    pub(crate) probes_received: AtomicU32,
}

impl SharedHealth {
    /// The current score, 0 (healthy) ..= 8.
    pub(crate) fn score(&self) -> u8 {
        self.score.load(Ordering::Relaxed)
    }
}

pub(crate) struct LocalHealthMonitor {
    pub(crate) shared: super::SiloShared,
    pub(crate) stop: watch::Receiver<bool>,
    pub(crate) last_tick: tokio::time::Instant,
}

impl LocalHealthMonitor {
    fn check(&mut self) {
        let period = self.shared.options.local_health_monitoring_period;
        let now_tokio = tokio::time::Instant::now();
        let lateness = now_tokio.saturating_duration_since(self.last_tick + period);
        self.last_tick = now_tokio;
        let sh = &self.shared;
        let snap = sh.latest.borrow();
        let now = sh.clock.now();
        let suspected = snap
            .entry(&sh.me)
            .is_some_and(|e| !fresh_votes(e, now, &sh.options).is_empty());
        let others_active = snap.active().any(|e| e.silo != sh.me);
        let inputs = HealthInputs {
            probes_sent: sh.health.probes_sent.swap(0, Ordering::Relaxed),
            probes_answered: sh.health.probes_answered.swap(0, Ordering::Relaxed),
            probes_received: sh.health.probes_received.swap(0, Ordering::Relaxed),
            expecting_probes: *sh.status.borrow() == SiloStatus::Active && others_active,
            suspected,
            event_loop_delay: lateness.min(Duration::from_secs(3600)),
        };
        let score = local_health_score(&inputs);
        let before = sh.health.score.swap(score, Ordering::Relaxed);
        if score != before {
            tracing::info!(cluster = %sh.cluster, silo = %sh.me, score, ?inputs, "local health score changed");
        }
    }
}

impl Actor for LocalHealthMonitor {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        stop_on_signal(self.stop.clone(), ctx);
        self.last_tick = tokio::time::Instant::now();
        ctx.run_interval(self.shared.options.local_health_monitoring_period, |act, _| {
            act.check()
        });
    }
}
