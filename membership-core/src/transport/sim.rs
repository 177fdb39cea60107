//! An in-process simulated network for tests, simulations and benchmarks.
//!
//! Every silo gets a [`SimTransport`] bound to its endpoint on one shared
//! [`SimNetwork`]. Messages are delivered by calling the destination's handler after
//! the configured one-way delay. The network can drop messages at random (per link or
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

use super::{Listener, ProbeHandler, ProbeRequest, ProbeResponse, Transport, TransportError};

struct State {
    handlers: HashMap<SocketAddr, Arc<dyn ProbeHandler>>,
    drop_all: f64,
    drop_link: HashMap<(SocketAddr, SocketAddr), f64>,
    blocked: HashSet<(SocketAddr, SocketAddr)>,
    delay: Duration,
    frozen: HashMap<SocketAddr, watch::Sender<bool>>,
    rng: StdRng,
    delivered: u64,
    dropped: u64,
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

    /// Whether one message from `from` to `to` gets through (counts it).
    fn passes(&self, from: SocketAddr, to: SocketAddr) -> bool {
        let mut s = self.lock();
        let p = s.drop_link.get(&(from, to)).copied().unwrap_or(s.drop_all);
        let lost = s.blocked.contains(&(from, to)) || (p > 0.0 && s.rng.random_bool(p));
        if lost {
            s.dropped += 1;
        } else {
            s.delivered += 1;
        }
        !lost
    }

    async fn deliver(
        &self,
        from: SocketAddr,
        to: SocketAddr,
        request: ProbeRequest,
    ) -> Option<ProbeResponse> {
        self.wait_unfrozen(from).await;
        let delay = self.lock().delay;
        tokio::time::sleep(delay).await;
        if !self.passes(from, to) {
            return None;
        }
        self.wait_unfrozen(to).await;
        let handler = self.lock().handlers.get(&to).cloned()?;
        let response = handler.handle(request).await;
        self.wait_unfrozen(to).await;
        tokio::time::sleep(delay).await;
        if !self.passes(to, from) {
            return None;
        }
        self.wait_unfrozen(from).await;
        Some(response)
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
        request: ProbeRequest,
        timeout: Duration,
    ) -> Result<ProbeResponse, TransportError> {
        let delivery = async {
            match self.net.deliver(self.local, to, request).await {
                Some(r) => r,
                // A lost message: the sender only learns by its timeout.
                None => std::future::pending().await,
            }
        };
        tokio::time::timeout(timeout, delivery)
            .await
            .map_err(|_| TransportError::Timeout(timeout))
    }

    async fn serve(
        &self,
        listen: SocketAddr,
        handler: Arc<dyn ProbeHandler>,
    ) -> Result<Listener, TransportError> {
        let mut s = self.net.lock();
        if s.handlers.contains_key(&listen) {
            return Err(TransportError::Bind {
                addr: listen,
                reason: "address in use".into(),
            });
        }
        s.handlers.insert(listen, handler);
        Ok(Listener {
            local_addr: listen,
            _guard: Box::new(Unregister {
                net: self.net.clone(),
                addr: listen,
            }),
        })
    }
}
