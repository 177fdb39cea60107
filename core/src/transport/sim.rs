//! An in-process simulated network for tests, simulations and benchmarks.
//!
//! Every silo gets a [`SimTransport`] bound to its endpoint on one shared
//! [`SimNetwork`]. Messages are delivered by calling the destination's handler after
//! the configured one-way delay. Every request and response is encoded into a wire
//! [`Frame`] and decoded again on the other side by the same functions the TCP
//! transport uses, so each simulation also exercises the codec, the request ids and
//! the cluster check. An endpoint where nothing is served answers
//! [`TransportError::Unreachable`] after one delay, as a refused TCP connection does. The network can drop messages at random (per link or
//! everywhere), block links one way or both (partitions), and **freeze** an endpoint
//! (a stalled process: nothing goes in or out until it resumes). It only uses tokio
//! timers, so under a paused clock (`start_paused`) minutes of protocol run in
//! milliseconds, deterministically for a given seed.

use std::collections::{HashMap, HashSet};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio::sync::watch;

use super::{
    answer_frame, encode, next_request_id, read_response, Frame, Listener, ProbeHandler, ProbeRequest,
    ProbeResponse, Transport, TransportError,
};

/// One message seen by the network, for [`SimNetwork::take_log`]: when (virtual
/// time since the network was created), from where, to where, the message, and
/// whether it was lost.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LoggedMessage {
    /// Virtual time since the network was created.
    pub at: Duration,
    /// Sender.
    pub from: SocketAddr,
    /// Destination.
    pub to: SocketAddr,
    /// The message, as text (`Debug` of the request or response).
    pub message: String,
    /// True when the network dropped it.
    pub lost: bool,
}

struct State {
    handlers: HashMap<SocketAddr, (Arc<str>, Arc<dyn ProbeHandler>)>,
    drop_all: f64,
    drop_link: HashMap<(SocketAddr, SocketAddr), f64>,
    blocked: HashSet<(SocketAddr, SocketAddr)>,
    delay: Duration,
    frozen: HashMap<SocketAddr, watch::Sender<bool>>,
    rng: StdRng,
    delivered: u64,
    dropped: u64,
    log: Option<Vec<LoggedMessage>>,
    created: tokio::time::Instant,
}

/// The simulated network. Cheap to clone; clones are the same network.
#[derive(Clone)]
pub struct SimNetwork {
    state: Arc<Mutex<State>>,
}

impl std::fmt::Debug for SimNetwork {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let s = self.lock();
        f.debug_struct("SimNetwork")
            .field("endpoints", &s.handlers.len())
            .field("delivered", &s.delivered)
            .field("dropped", &s.dropped)
            .finish()
    }
}

impl SimNetwork {
    /// A network with no loss, a 1 ms one-way delay, and random drops seeded by `seed`.
    pub fn new(seed: u64) -> Self {
        SimNetwork {
            state: Arc::new(Mutex::new(State {
                handlers: HashMap::new(),
                drop_all: 0.0,
                drop_link: HashMap::new(),
                blocked: HashSet::new(),
                delay: Duration::from_millis(1),
                frozen: HashMap::new(),
                rng: StdRng::seed_from_u64(seed),
                delivered: 0,
                dropped: 0,
                log: None,
                created: tokio::time::Instant::now(),
            })),
        }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The transport of the silo at `local`.
    pub fn transport(&self, local: SocketAddr) -> SimTransport {
        SimTransport {
            net: self.clone(),
            local,
        }
    }

    /// Drops every message with probability `p` (0.0..=1.0).
    pub fn set_drop_probability(&self, p: f64) {
        self.lock().drop_all = p.clamp(0.0, 1.0);
    }

    /// Drops messages from `from` to `to` with probability `p` (overrides the global
    /// probability for that direction).
    pub fn set_link_drop_probability(&self, from: SocketAddr, to: SocketAddr, p: f64) {
        self.lock().drop_link.insert((from, to), p.clamp(0.0, 1.0));
    }

    /// Sets the one-way delay of every message.
    pub fn set_delay(&self, delay: Duration) {
        self.lock().delay = delay;
    }

    /// Blocks messages from `from` to `to` (one-way partition) until [`heal`](Self::heal).
    pub fn block(&self, from: SocketAddr, to: SocketAddr) {
        self.lock().blocked.insert((from, to));
    }

    /// Blocks both directions between `a` and `b`.
    pub fn partition(&self, a: SocketAddr, b: SocketAddr) {
        let mut s = self.lock();
        s.blocked.insert((a, b));
        s.blocked.insert((b, a));
    }

    /// Removes every block and every per-link drop probability.
    pub fn heal(&self) {
        let mut s = self.lock();
        s.blocked.clear();
        s.drop_link.clear();
    }

    /// Freezes `addr`: messages to and from it wait until [`resume`](Self::resume)
    /// (their senders time out meanwhile), as with a stalled process.
    pub fn freeze(&self, addr: SocketAddr) {
        let mut s = self.lock();
        s.frozen
            .entry(addr)
            .or_insert_with(|| watch::channel(false).0)
            .send_replace(true);
    }

    /// Resumes a frozen endpoint.
    pub fn resume(&self, addr: SocketAddr) {
        if let Some(tx) = self.lock().frozen.get(&addr) {
            tx.send_replace(false);
        }
    }

    /// Starts recording every message (see [`take_log`](Self::take_log)).
    pub fn record(&self) {
        self.lock().log.get_or_insert_with(Vec::new);
    }

    /// The messages recorded since [`record`](Self::record) or the last call.
    pub fn take_log(&self) -> Vec<LoggedMessage> {
        self.lock().log.as_mut().map(std::mem::take).unwrap_or_default()
    }

    /// Messages delivered and dropped so far.
    pub fn counters(&self) -> (u64, u64) {
        let s = self.lock();
        (s.delivered, s.dropped)
    }

    async fn wait_unfrozen(&self, addr: SocketAddr) {
        let rx = self.lock().frozen.get(&addr).map(|tx| tx.subscribe());
        if let Some(mut rx) = rx {
            let _ = rx.wait_for(|frozen| !*frozen).await;
        }
    }

    /// Whether one message from `from` to `to` gets through (counts and logs it).
    fn passes(&self, from: SocketAddr, to: SocketAddr, message: &dyn std::fmt::Debug) -> bool {
        let mut s = self.lock();
        let p = s.drop_link.get(&(from, to)).copied().unwrap_or(s.drop_all);
        let lost = s.blocked.contains(&(from, to)) || (p > 0.0 && s.rng.random_bool(p));
        if lost {
            s.dropped += 1;
        } else {
            s.delivered += 1;
        }
        let at = s.created.elapsed();
        if let Some(log) = s.log.as_mut() {
            log.push(LoggedMessage {
                at,
                from,
                to,
                message: format!("{message:?}"),
                lost,
            });
        }
        !lost
    }

    /// Carries one request frame to `to` and its response frame back. `None` when a
    /// message was lost (the sender learns it only by its timeout).
    async fn deliver(
        &self,
        from: SocketAddr,
        to: SocketAddr,
        request: &Frame<ProbeRequest>,
    ) -> Option<Result<ProbeResponse, TransportError>> {
        let bytes = match encode(request) {
            Ok(b) => b,
            Err(e) => return Some(Err(e)),
        };
        self.wait_unfrozen(from).await;
        let delay = self.lock().delay;
        tokio::time::sleep(delay).await;
        if !self.passes(from, to, &request.body) {
            return None;
        }
        self.wait_unfrozen(to).await;
        let Some((cluster, handler)) = self.lock().handlers.get(&to).cloned() else {
            // Nothing listens there: refused, like a closed TCP port.
            return Some(Err(TransportError::Unreachable(format!(
                "{to}: connection refused"
            ))));
        };
        // The simulated network carries unsealed frames (no shared secret).
        let reply = match answer_frame(&cluster, None, handler.as_ref(), &bytes).await {
            Ok(r) => r,
            Err(_) => return None, // a garbage frame is dropped by the server
        };
        self.wait_unfrozen(to).await;
        tokio::time::sleep(delay).await;
        let (id, answer) = match read_response(&reply, None) {
            Ok(r) => r,
            Err(e) => return Some(Err(e)),
        };
        if !self.passes(to, from, &answer) {
            return None;
        }
        self.wait_unfrozen(from).await;
        if id != request.id {
            return Some(Err(TransportError::Codec(format!(
                "reply id {id} does not match request id {}",
                request.id
            ))));
        }
        Some(answer)
    }
}

/// One silo's endpoint on a [`SimNetwork`].
#[derive(Clone, Debug)]
pub struct SimTransport {
    net: SimNetwork,
    local: SocketAddr,
}

impl SimTransport {
    /// The endpoint this transport sends from.
    pub fn local_addr(&self) -> SocketAddr {
        self.local
    }
}

struct Unregister {
    net: SimNetwork,
    addr: SocketAddr,
}

impl Drop for Unregister {
    fn drop(&mut self) {
        self.net.lock().handlers.remove(&self.addr);
    }
}

#[async_trait]
impl Transport for SimTransport {
    async fn request(
        &self,
        to: SocketAddr,
        cluster: &str,
        request: ProbeRequest,
        timeout: Duration,
    ) -> Result<ProbeResponse, TransportError> {
        let frame = Frame {
            id: next_request_id(),
            cluster: cluster.to_owned(),
            body: request,
        };
        let delivery = async {
            match self.net.deliver(self.local, to, &frame).await {
                Some(r) => r,
                // A lost message: the sender only learns by its timeout.
                None => std::future::pending().await,
            }
        };
        tokio::time::timeout(timeout, delivery)
            .await
            .map_err(|_| TransportError::Timeout(timeout))?
    }

    async fn serve(
        &self,
        listen: SocketAddr,
        cluster: &str,
        handler: Arc<dyn ProbeHandler>,
    ) -> Result<Listener, TransportError> {
        let mut s = self.net.lock();
        if s.handlers.contains_key(&listen) {
            return Err(TransportError::Bind {
                addr: listen,
                reason: "address in use".into(),
            });
        }
        s.handlers.insert(listen, (Arc::from(cluster), handler));
        Ok(Listener {
            local_addr: listen,
            _guard: Box::new(Unregister {
                net: self.net.clone(),
                addr: listen,
            }),
        })
    }
}
