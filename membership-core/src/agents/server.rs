//! The probe server: answers pings, performs indirect pings for others, and hands
//! gossip to the membership agent. It runs on the transport's tasks, not in an
//! actor, and holds no protocol state: the answers come from
//! [`answer_ping`](crate::protocol::probe::answer_ping) and the shared health score.

use std::sync::atomic::Ordering;
use std::sync::{Arc, OnceLock};
use std::time::Duration;

use actix::Addr;
use async_trait::async_trait;

use crate::protocol::probe::answer_ping;
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
}

/// Pings an intermediary sends to a suspect for one indirect probe, staggered over
/// the prober's timeout.
pub(crate) const INDIRECT_ATTEMPTS: u32 = 3;

impl ProbeServer {
    /// Whether `target` answers any of [`INDIRECT_ATTEMPTS`] pings, all due by
    /// `timeout`: one at once, the next at `timeout / 3` and `2 x timeout / 3`, or as
    /// soon as the one before fails outright (a refused connection is no lost
    /// message, so a crashed target is reported as fast as before). Returns at the
    /// first answer. A "no" here becomes a second vote against the target, so it
    /// must not rest on one message: under 5% loss a ping or its pong is lost about
    /// one time in ten, and the prober that asked has just seen its own pings fail,
    /// so one such loss declared a live silo Dead (found by D2: 50 silos, 30
    /// minutes). Three pings are all lost about one time in a thousand.
    async fn indirect_ping(
        &self,
        me: SiloAddress,
        target: SiloAddress,
        known: u64,
        timeout: Duration,
    ) -> bool {
        use futures_util::stream::{FuturesUnordered, StreamExt};
        let started = tokio::time::Instant::now();
        let deadline = started + timeout;
        let attempt = || async move {
            let sent = tokio::time::Instant::now();
            let ping = ProbeRequest::Ping {
                from: me,
                target,
                version: known,
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
            matches!(
                PingOutcome::from_response(&target, &response, sent.elapsed()),
                PingOutcome::Answered { .. }
            )
        };
        let mut in_flight = FuturesUnordered::new();
        in_flight.push(attempt());
        let mut sent = 1;
        loop {
            let next_at = started + timeout / INDIRECT_ATTEMPTS * sent;
            tokio::select! {
                answered = in_flight.next(), if !in_flight.is_empty() => match answered {
                    Some(true) => return true,
                    _ if sent < INDIRECT_ATTEMPTS && tokio::time::Instant::now() < deadline => {
                        in_flight.push(attempt());
                        sent += 1;
                    }
                    _ if in_flight.is_empty() => return false,
                    _ => {}
                },
                () = tokio::time::sleep_until(next_at), if sent < INDIRECT_ATTEMPTS => {
                    in_flight.push(attempt());
                    sent += 1;
                }
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
                let answer = answer_ping(me, target, health, known);
                if matches!(answer, ProbeResponse::Pong { .. }) {
                    self.health.probes_received.fetch_add(1, Ordering::Relaxed);
                    if version > known {
                        // The prober read a newer table: like gossip, the machine
                        // decides (and coalesces) the refresh.
                        if let Some(agent) = self.agent.get() {
                            let _ = agent.try_send(GossipReceived { version });
                        }
                    }
                }
                answer
            }
            ProbeRequest::IndirectPing {
                target, timeout_ms, ..
            } => {
                let timeout = Duration::from_millis(u64::from(timeout_ms)).min(self.max_indirect_timeout);
                ProbeResponse::IndirectResult {
                    target_answered: self.indirect_ping(me, target, known, timeout).await,
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
