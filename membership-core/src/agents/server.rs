//! The probe server: answers pings, performs indirect pings for others, and turns
//! gossip into table refreshes.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use actix::Addr;
use async_trait::async_trait;

use crate::transport::{ProbeHandler, ProbeRequest, ProbeResponse, Transport};
use crate::SiloAddress;

use super::health::SharedHealth;
use super::oracle::{GossipReceived, MembershipOracle};
use super::probe::{direct_probe, Direct};

pub(crate) struct ProbeServer {
    pub(crate) me: Arc<std::sync::OnceLock<SiloAddress>>,
    pub(crate) health: Arc<SharedHealth>,
    pub(crate) transport: Arc<dyn Transport>,
    pub(crate) oracle: Addr<MembershipOracle>,
    /// Upper bound on an indirect ping's timeout, whatever the requester asks.
    pub(crate) max_indirect_timeout: Duration,
}

#[async_trait]
impl ProbeHandler for ProbeServer {
    async fn handle(&self, request: ProbeRequest) -> ProbeResponse {
        let Some(&me) = self.me.get() else {
            // Not started yet: we are nobody's target.
            return ProbeResponse::GossipAck;
        };
        match request {
            ProbeRequest::Ping { target, .. } => {
                if target != me {
                    return ProbeResponse::WrongSilo { responder: me };
                }
                self.health.probes_received.fetch_add(1, Ordering::Relaxed);
                ProbeResponse::Pong {
                    responder: me,
                    health: self.health.score(),
                }
            }
            ProbeRequest::IndirectPing {
                target, timeout_ms, ..
            } => {
                let timeout = Duration::from_millis(u64::from(timeout_ms)).min(self.max_indirect_timeout);
                let answered = matches!(
                    direct_probe(&self.transport, me, target, timeout).await,
                    Direct::Answered(_)
                );
                ProbeResponse::IndirectResult {
                    target_answered: answered,
                    intermediary_health: self.health.score(),
                }
            }
            ProbeRequest::Gossip { version, .. } => {
                let _ = self.oracle.try_send(GossipReceived { version });
                ProbeResponse::GossipAck
            }
        }
    }
}
