//! Probe agents: one actor per monitored silo, sending direct probes, and an
//! indirect probe through a random healthy intermediary before the last allowed miss.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use actix::{Actor, ActorFutureExt, AsyncContext, Context, Message, Recipient, WrapFuture};
use rand::seq::IndexedRandom;

use crate::protocol::phi::ProbeTimeout;
use crate::transport::{ProbeRequest, ProbeResponse, Transport};
use crate::{SiloAddress, SiloStatus};

/// Sent by a probe agent when its target should get a vote.
#[derive(Message, Debug, Clone)]
#[rtype(result = "()")]
pub(crate) struct ProbeFailed {
    pub(crate) target: SiloAddress,
    /// The intermediary that also failed to reach the target (its vote counts too).
    pub(crate) intermediary: Option<SiloAddress>,
    pub(crate) reason: super::oracle::SuspectReason,
}

/// Result of one direct probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Direct {
    Answered(Duration),
    /// Another generation answers on the target's endpoint: the target is gone.
    WrongSilo,
    Missed,
}

/// One direct probe of `target` within `timeout`: two attempts of half the timeout
/// each, so that one lost datagram (or one dead connection) is not a miss.
pub(crate) async fn direct_probe(
    transport: &Arc<dyn Transport>,
    me: SiloAddress,
    target: SiloAddress,
    timeout: Duration,
) -> Direct {
    let attempt_timeout = timeout / 2;
    for _ in 0..2 {
        let started = tokio::time::Instant::now();
        let req = ProbeRequest::Ping { from: me, target };
        match transport.request(target.endpoint(), req, attempt_timeout).await {
            Ok(ProbeResponse::Pong { responder, .. }) if responder == target => {
                return Direct::Answered(started.elapsed());
            }
            Ok(ProbeResponse::WrongSilo { .. }) | Ok(ProbeResponse::Pong { .. }) => return Direct::WrongSilo,
            Ok(_) => {}
            Err(_) => {
                // An immediate failure (connection refused) must not burn the next
                // attempt at once: wait out the attempt's share of the timeout.
                let spent = started.elapsed();
                if spent < attempt_timeout {
                    tokio::time::sleep(attempt_timeout - spent).await;
                }
            }
        }
    }
    Direct::Missed
}

/// Result of an indirect probe.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Indirect {
    Answered,
    /// A healthy intermediary could not reach the target either.
    Failed(SiloAddress),
    /// No intermediary, an unhealthy one, or no answer from it: no conclusion.
    Unknown,
}

pub(crate) struct ProbeAgent {
    pub(crate) shared: super::SiloShared,
    pub(crate) target: SiloAddress,
    pub(crate) on_failure: Recipient<ProbeFailed>,
    pub(crate) timeout: ProbeTimeout,
    pub(crate) missed: u32,
    pub(crate) in_flight: bool,
}

impl ProbeAgent {
    pub(crate) fn new(
        shared: super::SiloShared,
        target: SiloAddress,
        on_failure: Recipient<ProbeFailed>,
    ) -> Self {
        let options = &shared.options;
        let timeout = ProbeTimeout::new(
            options.probe_timeout,
            options.effective_min_probe_timeout(),
            options.effective_max_probe_timeout(),
        );
        ProbeAgent {
            target,
            shared,
            on_failure,
            timeout,
            missed: 0,
            in_flight: false,
        }
    }

    fn current_timeout(&self) -> Duration {
        self.timeout.timeout(
            self.shared.health.score(),
            self.shared.options.extend_probe_timeout_during_degradation,
        )
    }

    /// A random Active silo other than us and the target.
    fn pick_intermediary(&self) -> Option<SiloAddress> {
        let snap = self.shared.latest.borrow();
        let candidates: Vec<SiloAddress> = snap
            .rows()
            .filter(|e| e.status == SiloStatus::Active && e.silo != self.shared.me && e.silo != self.target)
            .map(|e| e.silo)
            .collect();
        candidates.choose(&mut rand::rng()).copied()
    }

    fn probe(&mut self, ctx: &mut Context<Self>) {
        if self.in_flight {
            return;
        }
        self.in_flight = true;
        let limit = self.shared.options.num_missed_probes_limit;
        let timeout = self.current_timeout();
        let (transport, me, target) = (self.shared.transport.clone(), self.shared.me, self.target);
        // Before the last allowed miss, probe directly and indirectly at once.
        let indirect_via =
            if self.shared.options.enable_indirect_probes && limit > 1 && self.missed + 1 == limit {
                self.pick_intermediary()
            } else {
                None
            };
        self.shared.health.probes_sent.fetch_add(1, Ordering::Relaxed);
        let fut = async move {
            let direct = direct_probe(&transport, me, target, timeout);
            let indirect = async {
                let Some(via) = indirect_via else {
                    return Indirect::Unknown;
                };
                let req = ProbeRequest::IndirectPing {
                    from: me,
                    target,
                    timeout_ms: u32::try_from((timeout.mul_f64(0.8)).as_millis()).unwrap_or(u32::MAX),
                };
                match transport.request(via.endpoint(), req, timeout).await {
                    Ok(ProbeResponse::IndirectResult {
                        target_answered: true,
                        ..
                    }) => Indirect::Answered,
                    Ok(ProbeResponse::IndirectResult {
                        target_answered: false,
                        intermediary_health: 0,
                    }) => Indirect::Failed(via),
                    _ => Indirect::Unknown,
                }
            };
            tokio::join!(direct, indirect)
        };
        ctx.spawn(fut.into_actor(self).map(|(direct, indirect), act, ctx| {
            act.in_flight = false;
            act.on_result(direct, indirect, ctx);
        }));
    }

    fn on_result(&mut self, direct: Direct, indirect: Indirect, ctx: &mut Context<Self>) {
        let limit = self.shared.options.num_missed_probes_limit;
        match (direct, indirect) {
            (Direct::Answered(rtt), _) => {
                self.shared.health.probes_answered.fetch_add(1, Ordering::Relaxed);
                self.timeout.record(rtt);
                self.missed = 0;
            }
            (Direct::WrongSilo, _) => {
                self.shared.health.probes_answered.fetch_add(1, Ordering::Relaxed);
                self.missed = 0;
                let _ = self.on_failure.try_send(ProbeFailed {
                    target: self.target,
                    intermediary: None,
                    reason: super::oracle::SuspectReason::WrongSilo,
                });
            }
            (Direct::Missed, Indirect::Answered) => {
                tracing::debug!(cluster = %self.shared.cluster, silo = %self.shared.me, target = %self.target,
                    "direct probe missed, indirect probe answered");
                self.missed = 0;
            }
            (Direct::Missed, indirect) => {
                self.missed += 1;
                tracing::debug!(cluster = %self.shared.cluster, silo = %self.shared.me, target = %self.target,
                    missed = self.missed, "probe missed");
                if self.missed >= limit {
                    self.missed = 0;
                    let intermediary = match indirect {
                        Indirect::Failed(via) => Some(via),
                        _ => None,
                    };
                    let _ = self.on_failure.try_send(ProbeFailed {
                        target: self.target,
                        intermediary,
                        reason: super::oracle::SuspectReason::MissedProbes,
                    });
                } else {
                    // Retry at once: a dead silo is detected in `limit` timeouts.
                    self.probe(ctx);
                }
            }
        }
    }
}

impl Actor for ProbeAgent {
    type Context = Context<Self>;

    fn started(&mut self, ctx: &mut Self::Context) {
        ctx.run_interval(self.shared.options.probe_timeout, |act, ctx| act.probe(ctx));
    }
}

/// Stop a probe agent.
#[derive(Message)]
#[rtype(result = "()")]
pub(crate) struct StopProbing;

impl actix::Handler<StopProbing> for ProbeAgent {
    type Result = ();

    fn handle(&mut self, _: StopProbing, ctx: &mut Context<Self>) {
        actix::ActorContext::stop(ctx);
    }
}
