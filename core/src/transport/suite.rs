//! One test suite for every [`Transport`]: the TCP transport and the simulated
//! network must behave the same way (chitchat's `test_transport_suite` pattern).

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;

use super::{Listener, ProbeHandler, ProbeRequest, ProbeResponse, Transport, TransportError};
use crate::SiloAddress;

/// What the suite needs of a network.
#[async_trait]
pub(crate) trait Net: Send + Sync {
    /// A client transport.
    fn client(&self) -> Arc<dyn Transport>;
    /// Serves `handler` for `cluster` on a fresh endpoint.
    async fn serve(&self, cluster: &str, handler: Arc<dyn ProbeHandler>) -> Listener;
    /// An endpoint where nothing is served.
    async fn dead_endpoint(&self) -> SocketAddr;
}

/// Answers `Ping { target }` with `Pong { responder: target }` (so a reply names the
/// request it belongs to), after `slow` when the target's port is odd.
struct Echo {
    slow: Duration,
}

#[async_trait]
impl ProbeHandler for Echo {
    async fn handle(&self, request: ProbeRequest) -> ProbeResponse {
        match request {
            ProbeRequest::Ping { target, .. } => {
                if target.port() % 2 == 1 {
                    tokio::time::sleep(self.slow).await;
                }
                ProbeResponse::Pong {
                    responder: target,
                    health: 0,
                    version: 0,
                    received_ms: 0,
                    sent_ms: 0,
                }
            }
            ProbeRequest::IndirectPing { .. } => ProbeResponse::IndirectResult {
                target_answered: true,
                intermediary_health: 0,
            },
            ProbeRequest::Gossip { .. } => ProbeResponse::GossipAck,
            ProbeRequest::Notice { .. } => ProbeResponse::NoticeAck { accepted: false },
        }
    }
}

fn silo(port: u16) -> SiloAddress {
    SiloAddress::new(SocketAddr::from(([127, 0, 0, 1], port)), 1)
}

fn ping(port: u16) -> ProbeRequest {
    ProbeRequest::Ping {
        from: silo(1),
        target: silo(port),
        version: 0,
        sent_ms: 0,
    }
}

const TIMEOUT: Duration = Duration::from_millis(200);

pub(crate) async fn round_trip(net: &dyn Net) {
    let l = net.serve("c", Arc::new(Echo { slow: TIMEOUT })).await;
    let r = net.client().request(l.local_addr, "c", ping(10), TIMEOUT).await;
    assert_eq!(
        r.unwrap(),
        ProbeResponse::Pong {
            responder: silo(10),
            health: 0,
            version: 0,
            received_ms: 0,
            sent_ms: 0,
        }
    );
    let r = net
        .client()
        .request(
            l.local_addr,
            "c",
            ProbeRequest::Gossip {
                from: silo(1),
                version: 3,
            },
            TIMEOUT,
        )
        .await;
    assert_eq!(r.unwrap(), ProbeResponse::GossipAck);
}

pub(crate) async fn another_cluster_is_refused(net: &dyn Net) {
    let l = net.serve("orders", Arc::new(Echo { slow: TIMEOUT })).await;
    let r = net
        .client()
        .request(l.local_addr, "billing", ping(10), TIMEOUT)
        .await;
    assert!(matches!(r, Err(TransportError::Refused(_))), "{r:?}");
}

pub(crate) async fn unreachable_peer_fails_before_the_timeout(net: &dyn Net) {
    let dead = net.dead_endpoint().await;
    let started = tokio::time::Instant::now();
    let r = net
        .client()
        .request(dead, "c", ping(10), Duration::from_secs(5))
        .await;
    assert!(matches!(r, Err(TransportError::Unreachable(_))), "{r:?}");
    assert!(started.elapsed() < Duration::from_secs(5));
}

/// The defect of the first TCP transport: a timed-out ping left its reply on the
/// connection and the next request (a gossip) read it.
pub(crate) async fn a_late_reply_never_answers_the_next_request(net: &dyn Net) {
    let l = net.serve("c", Arc::new(Echo { slow: TIMEOUT * 2 })).await;
    let client = net.client();
    let slow = client.request(l.local_addr, "c", ping(11), TIMEOUT).await;
    assert!(matches!(slow, Err(TransportError::Timeout(_))), "{slow:?}");
    // The slow reply arrives while these wait.
    let gossip = ProbeRequest::Gossip {
        from: silo(1),
        version: 1,
    };
    for _ in 0..3 {
        let r = client
            .request(l.local_addr, "c", gossip.clone(), TIMEOUT * 4)
            .await;
        assert_eq!(r.unwrap(), ProbeResponse::GossipAck);
        let r = client.request(l.local_addr, "c", ping(12), TIMEOUT * 4).await;
        assert_eq!(
            r.unwrap(),
            ProbeResponse::Pong {
                responder: silo(12),
                health: 0,
                version: 0,
                received_ms: 0,
                sent_ms: 0,
            }
        );
    }
}

/// 10,000 requests, pings and gossip mixed, to a peer that answers one ping in fifty
/// slower than the timeout: no reply is ever handed to another request.
pub(crate) async fn probe_flood_misattributes_nothing(net: &dyn Net) {
    let l = net
        .serve(
            "c",
            Arc::new(Echo {
                slow: TIMEOUT * 3 / 2,
            }),
        )
        .await;
    let client = net.client();
    let (mut answered, mut timed_out, mut misattributed) = (0u32, 0u32, 0u32);
    for batch in 0..20u16 {
        let requests = (0..500u16).map(|i| {
            let n = batch * 500 + i;
            // Ports: even = fast, odd = slow (one in fifty: fewer than the server's
            // per-connection in-flight slots), every third a gossip.
            let port = if n % 50 == 1 {
                1001 + 2 * (n % 40)
            } else {
                1000 + 2 * (n % 40)
            };
            let request = if n % 3 == 0 {
                ProbeRequest::Gossip {
                    from: silo(1),
                    version: u64::from(n),
                }
            } else {
                ping(port)
            };
            let client = client.clone();
            let to = l.local_addr;
            async move { (request.clone(), client.request(to, "c", request, TIMEOUT).await) }
        });
        for (request, result) in futures_util::future::join_all(requests).await {
            match (request, result) {
                (ProbeRequest::Gossip { .. }, Ok(ProbeResponse::GossipAck)) => answered += 1,
                (ProbeRequest::Ping { target, .. }, Ok(ProbeResponse::Pong { responder, .. }))
                    if responder == target =>
                {
                    answered += 1
                }
                (_, Ok(other)) => {
                    misattributed += 1;
                    eprintln!("misattributed reply: {other:?}");
                }
                (_, Err(TransportError::Timeout(_))) => timed_out += 1,
                (_, Err(e)) => panic!("unexpected error: {e}"),
            }
        }
    }
    assert_eq!(misattributed, 0);
    assert_eq!(answered + timed_out, 10_000);
    assert!(answered >= 9_000, "answered {answered}, timed out {timed_out}");
    assert!(timed_out >= 100, "the slow pings must time out: {timed_out}");
}

macro_rules! transport_suite {
    (#[$attr:meta] $net:expr) => {
        #[$attr]
        async fn round_trip() {
            $crate::transport::suite::round_trip(&$net).await;
        }
        #[$attr]
        async fn another_cluster_is_refused() {
            $crate::transport::suite::another_cluster_is_refused(&$net).await;
        }
        #[$attr]
        async fn unreachable_peer_fails_before_the_timeout() {
            $crate::transport::suite::unreachable_peer_fails_before_the_timeout(&$net).await;
        }
        #[$attr]
        async fn a_late_reply_never_answers_the_next_request() {
            $crate::transport::suite::a_late_reply_never_answers_the_next_request(&$net).await;
        }
        #[$attr]
        async fn probe_flood_misattributes_nothing() {
            $crate::transport::suite::probe_flood_misattributes_nothing(&$net).await;
        }
    };
}

mod tcp {
    use super::*;
    use crate::transport::tcp::TcpTransport;

    struct Tcp;

    #[async_trait]
    impl Net for Tcp {
        fn client(&self) -> Arc<dyn Transport> {
            Arc::new(TcpTransport::new())
        }
        async fn serve(&self, cluster: &str, handler: Arc<dyn ProbeHandler>) -> Listener {
            TcpTransport::new()
                .serve("127.0.0.1:0".parse().unwrap(), cluster, handler)
                .await
                .unwrap()
        }
        async fn dead_endpoint(&self) -> SocketAddr {
            let l = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
            l.local_addr().unwrap()
        }
    }

    transport_suite!(
        #[tokio::test]
        Tcp
    );
}

mod sim {
    use super::*;
    use crate::transport::sim::SimNetwork;

    struct Sim(SimNetwork);

    #[async_trait]
    impl Net for Sim {
        fn client(&self) -> Arc<dyn Transport> {
            Arc::new(self.0.transport(SocketAddr::from(([10, 9, 9, 9], 1))))
        }
        async fn serve(&self, cluster: &str, handler: Arc<dyn ProbeHandler>) -> Listener {
            let addr = SocketAddr::from(([10, 9, 0, 1], 1));
            self.0
                .transport(addr)
                .serve(addr, cluster, handler)
                .await
                .unwrap()
        }
        async fn dead_endpoint(&self) -> SocketAddr {
            SocketAddr::from(([10, 9, 8, 7], 6))
        }
    }

    transport_suite!(
        #[tokio::test(start_paused = true)]
        Sim(SimNetwork::new(7))
    );
}
