//! The probe server: answers pings, performs indirect pings for others, and hands
//! gossip to the membership agent. It runs on the transport's tasks, not in an
//! actor, and holds no protocol state: the answers come from
//! [`answers_ping`](crate::protocol::probe::answers_ping) and the shared health score,
//! and indirect probes follow [`IndirectProbe`].

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use actix::Addr;
use async_trait::async_trait;

use crate::protocol::probe::{answers_ping, IndirectProbe, IndirectStep};
use crate::protocol::PingOutcome;
use crate::transport::{ProbeHandler, ProbeRequest, ProbeResponse, Transport};
use crate::SiloAddress;

use super::executor::{GossipReceived, MembershipAgent, SharedHealth};

pub(crate) struct ProbeServer {
    /// This silo, once its generation is known (set right after the bind).
    pub(crate) me: Arc<OnceLock<SiloAddress>>,
    pub(crate) cluster: Arc<str>,
    pub(crate) health: Arc<SharedHealth>,
    pub(crate) transport: Arc<dyn Transport>,
    /// The agent, once it exists.
    pub(crate) agent: Arc<OnceLock<Addr<MembershipAgent>>>,
    /// Upper bound on an indirect ping's timeout, whatever the requester asks.
    pub(crate) max_indirect_timeout: Duration,
    /// Receivers of application notices.
    pub(crate) notices: Arc<super::NoticeSinks>,
    /// The silo's wall clock: pongs carry its times (see
    /// [`clock`](crate::protocol::clock)).
    pub(crate) clock: Arc<dyn crate::Clock>,
}

impl ProbeServer {
    /// Carries out an [`IndirectProbe`] (the rule and its reasons live there):
    /// pings `target` when it says so and reports each result, until it is done.
    async fn indirect_ping(
        &self,
        me: SiloAddress,
        target: SiloAddress,
        known: u64,
        requested: Duration,
    ) -> bool {
        use futures_util::stream::{FuturesUnordered, StreamExt};
        let mut probe = IndirectProbe::new(requested, self.max_indirect_timeout);
        let started = tokio::time::Instant::now();
        let deadline = started + probe.timeout();
        let attempt = || async move {
            let sent = tokio::time::Instant::now();
            let ping = ProbeRequest::Ping {
                from: me,
                target,
                version: known,
                sent_ms: self.clock.now().as_millis(),
            };
            let response = self
                .transport
                .request(
                    target.endpoint(),
                    &self.cluster,
                    ping,
                    deadline.saturating_duration_since(sent),
                )
                .await;
            ProbeResponse::ping_outcome(&target, &response, sent.elapsed())
        };
        let mut in_flight = FuturesUnordered::new();
        loop {
            let wait_until = match probe.step(started.elapsed()) {
                IndirectStep::Done(answered) => return answered,
                IndirectStep::Send => {
                    in_flight.push(attempt());
                    continue;
                }
                IndirectStep::Wait(until) => until.map(|u| started + u),
            };
            tokio::select! {
                outcome = in_flight.next(), if !in_flight.is_empty() => match outcome {
                    Some(PingOutcome::Answered { .. }) => probe.answered(),
                    Some(_) => probe.failed(),
                    None => {}
                },
                () = tokio::time::sleep_until(wait_until.unwrap_or(deadline)), if wait_until.is_some() => {}
                else => return false,
            }
        }
    }
}

#[async_trait]
impl ProbeHandler for ProbeServer {
    async fn handle(&self, request: ProbeRequest) -> ProbeResponse {
        let Some(&me) = self.me.get() else {
            // Not started yet: we are nobody's target.
            return ProbeResponse::GossipAck;
        };
        let health = self.health.score.load(Ordering::Relaxed);
        let known = self.health.view_version.load(Ordering::Relaxed);
        match request {
            ProbeRequest::Ping { target, version, .. } => {
                let received_ms = self.clock.now().as_millis();
                if !answers_ping(&me, &target) {
                    return ProbeResponse::WrongSilo { responder: me };
                }
                self.health.probes_received.fetch_add(1, Ordering::Relaxed);
                if version > known {
                    // The prober read a newer table: like gossip, the machine
                    // decides (and coalesces) the refresh.
                    if let Some(agent) = self.agent.get() {
                        let _ = agent.try_send(GossipReceived { version });
                    }
                }
                ProbeResponse::Pong {
                    responder: me,
                    health,
                    version: known,
                    received_ms,
                    sent_ms: self.clock.now().as_millis(),
                }
            }
            ProbeRequest::IndirectPing {
                target, timeout_ms, ..
            } => {
                let requested = Duration::from_millis(u64::from(timeout_ms));
                ProbeResponse::IndirectResult {
                    target_answered: self.indirect_ping(me, target, known, requested).await,
                    intermediary_health: health,
                }
            }
            ProbeRequest::Gossip { version, .. } => {
                if let Some(agent) = self.agent.get() {
                    // A full mailbox drops the gossip: the periodic refresh covers it.
                    let _ = agent.try_send(GossipReceived { version });
                }
                ProbeResponse::GossipAck
            }
            notice @ ProbeRequest::Notice { .. } => ProbeResponse::NoticeAck {
                accepted: self.notices.offer(notice),
            },
        }
    }
}
