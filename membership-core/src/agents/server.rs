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
                let started = tokio::time::Instant::now();
                let response = self
                    .transport
                    .request(
                        target.endpoint(),
                        &self.cluster,
                        ProbeRequest::Ping {
                            from: me,
                            target,
                            version: known,
                        },
                        timeout,
                    )
                    .await;
                let outcome = PingOutcome::from_response(&target, &response, started.elapsed());
                ProbeResponse::IndirectResult {
                    target_answered: matches!(outcome, PingOutcome::Answered { .. }),
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
