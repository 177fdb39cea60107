//! Probe transport over TCP (tokio): length-delimited frames of at most
//! [`MAX_FRAME_BYTES`], each a version byte plus a postcard-encoded [`Frame`].
//!
//! **Client.** One reused connection per peer (one connect at a time; concurrent
//! requests share it), multiplexed: every request gets a process-unique id, a writer
//! task sends the frames and a reader task hands each response frame to the request
//! waiting for that id. A request that times out only forgets its id,
//! so its late reply is dropped by the connection task and can never be taken for
//! the answer to a later request (a slow peer cannot misattribute replies). At most
//! [`MAX_PENDING_PER_PEER`] requests wait on one connection; more fail at once.
//!
//! **Server.** Each connection answers up to [`MAX_IN_FLIGHT_PER_CONNECTION`]
//! requests concurrently, each in its own task (an indirect ping that waits for a
//! third silo does not hold up the pings behind it); a writer task sends the replies
//! in completion order with their ids, so a slow reader never stops the reading. A
//! frame that does not decode (or fails the [`SharedSecret`] check) is dropped (the
//! connection stays up); an oversized or malformed length prefix closes that
//! connection. Nothing a peer sends can panic the server.
//!
//! **Floods** ([`TcpConfig`]). A connection is *unverified* until it delivers a valid
//! frame of our cluster. At most `max_unverified` unverified connections are kept
//! (a new one evicts the oldest) and each must deliver that frame within
//! `frame_timeout`; so idle or half-open connections cannot exhaust the port (or the
//! process's file descriptors) and a real peer, whose first frame follows its
//! connect within a round trip, always gets in. At most `max_connections` in all;
//! a known peer's connection is closed after `idle_timeout` without a frame, and any
//! frame must complete within about 1.5 x `frame_timeout` of its first byte. Log
//! lines about what peers send or about failed accepts are rate-limited (one per
//! 10 s per kind, with a count of the suppressed ones).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::net::tcp::{OwnedReadHalf, OwnedWriteHalf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot, Semaphore};
use tokio::task::JoinSet;
use tokio_util::codec::{FramedRead, FramedWrite, LengthDelimitedCodec};

use super::{
    answer_request, encode, next_request_id, open_request, read_response, seal, Frame, Listener, LogLimiter,
    ProbeHandler, ProbeRequest, ProbeResponse, SharedSecret, Transport, TransportError, MAX_FRAME_BYTES,
};

/// Requests that may wait for replies on one peer connection at once.
pub const MAX_PENDING_PER_PEER: usize = 1024;
/// Requests one server connection answers concurrently; further frames wait in the
/// socket until one finishes.
pub const MAX_IN_FLIGHT_PER_CONNECTION: usize = 32;

/// Limits and secret of a [`TcpTransport`]. `Default` gives the values below.
#[derive(Clone, Debug)]
pub struct TcpConfig {
    /// The cluster's shared secret: frames are sealed with it, and unsealed or
    /// badly sealed frames are dropped. Default: none.
    pub shared_secret: Option<SharedSecret>,
    /// How long a new connection may take to deliver its first valid frame, and a
    /// frame to complete once its first byte arrived. The silo sets it to its
    /// `probe_timeout`. Default 5 s.
    pub frame_timeout: Duration,
    /// A known peer's connection without any frame for this long is closed (the
    /// peer reconnects when it next needs to). Default 120 s.
    pub idle_timeout: Duration,
    /// Inbound connections served at once; beyond that, the oldest unverified one
    /// is evicted, or (with none) the new one is closed. Default 512.
    pub max_connections: usize,
    /// Inbound connections that have not yet delivered a valid frame, at most;
    /// a new one evicts the oldest. Default 64.
    pub max_unverified: usize,
}

impl Default for TcpConfig {
    fn default() -> Self {
        TcpConfig {
            shared_secret: None,
            frame_timeout: Duration::from_secs(5),
            idle_timeout: Duration::from_secs(120),
            max_connections: 512,
            max_unverified: 64,
        }
    }
}

fn codec() -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .max_frame_length(MAX_FRAME_BYTES)
        .new_codec()
}

type Waiters = HashMap<u64, oneshot::Sender<Result<ProbeResponse, TransportError>>>;

/// One multiplexed client connection.
#[derive(Debug)]
struct Peer {
    outgoing: mpsc::Sender<Bytes>,
    waiters: Arc<Mutex<Waiters>>,
    task: tokio::task::JoinHandle<()>,
}

impl Drop for Peer {
    fn drop(&mut self) {
        self.task.abort();
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// The TCP [`Transport`]. Cheap to clone; clones share the connection cache.
#[derive(Clone, Debug, Default)]
pub struct TcpTransport {
    peers: Arc<Mutex<HashMap<SocketAddr, Arc<Peer>>>>,
    /// One connect at a time per peer: concurrent requests wait for it and share it.
    connecting: Arc<Mutex<HashMap<SocketAddr, Arc<tokio::sync::Mutex<()>>>>>,
    config: Arc<TcpConfig>,
}

impl TcpTransport {
    /// A transport with an empty connection cache and the default [`TcpConfig`].
    pub fn new() -> Self {
        Self::default()
    }

    /// A transport with `config` (limits, shared secret).
    pub fn with_config(config: TcpConfig) -> Self {
        TcpTransport {
            config: Arc::new(config),
            ..Self::default()
        }
    }

    /// The live connection to `to`, connecting if there is none.
    fn live_peer(&self, to: SocketAddr) -> Option<Arc<Peer>> {
        lock(&self.peers)
            .get(&to)
            .filter(|p| !p.task.is_finished())
            .cloned()
    }

    async fn peer(&self, to: SocketAddr) -> Result<Arc<Peer>, TransportError> {
        if let Some(p) = self.live_peer(to) {
            return Ok(p);
        }
        let gate = lock(&self.connecting).entry(to).or_default().clone();
        let _connecting = gate.lock().await;
        if let Some(p) = self.live_peer(to) {
            return Ok(p); // another request connected while we waited
        }
        let stream = TcpStream::connect(to)
            .await
            .map_err(|e| TransportError::Unreachable(format!("{to}: {e}")))?;
        let _ = stream.set_nodelay(true);
        let (read, write) = stream.into_split();
        let waiters: Arc<Mutex<Waiters>> = Arc::default();
        let (outgoing, rx) = mpsc::channel(64);
        let task = tokio::spawn(run_client_connection(
            FramedRead::new(read, codec()),
            FramedWrite::new(write, codec()),
            to,
            rx,
            waiters.clone(),
            self.config.shared_secret.clone(),
        ));
        let peer = Arc::new(Peer {
            outgoing,
            waiters,
            task,
        });
        lock(&self.peers).insert(to, peer.clone());
        Ok(peer)
    }

    async fn exchange(&self, to: SocketAddr, id: u64, frame: Bytes) -> Result<ProbeResponse, TransportError> {
        let peer = self.peer(to).await?;
        let (tx, rx) = oneshot::channel();
        {
            let mut waiters = lock(&peer.waiters);
            if waiters.len() >= MAX_PENDING_PER_PEER {
                return Err(TransportError::Unreachable(format!(
                    "{to}: {MAX_PENDING_PER_PEER} requests already wait for this peer"
                )));
            }
            waiters.insert(id, tx);
        }
        let _forget = Forget {
            waiters: &peer.waiters,
            id,
        };
        peer.outgoing
            .send(frame)
            .await
            .map_err(|_| TransportError::Unreachable(format!("{to}: connection closed")))?;
        rx.await
            .unwrap_or_else(|_| Err(TransportError::Unreachable(format!("{to}: connection closed"))))
    }
}

/// Removes a request's id from its peer's waiters when the request ends (answered,
/// failed or timed out): a later reply with that id is then dropped.
struct Forget<'a> {
    waiters: &'a Mutex<Waiters>,
    id: u64,
}

impl Drop for Forget<'_> {
    fn drop(&mut self) {
        lock(self.waiters).remove(&self.id);
    }
}

/// Routes response frames to their waiters by id (a writer task sends the request
/// frames), until the connection fails; then every waiter learns it at once.
async fn run_client_connection(
    mut read: FramedRead<OwnedReadHalf, LengthDelimitedCodec>,
    mut write: FramedWrite<OwnedWriteHalf, LengthDelimitedCodec>,
    to: SocketAddr,
    mut outgoing: mpsc::Receiver<Bytes>,
    waiters: Arc<Mutex<Waiters>>,
    secret: Option<SharedSecret>,
) {
    let writer = tokio::spawn(async move {
        while let Some(frame) = outgoing.recv().await {
            if write.send(frame).await.is_err() {
                return;
            }
        }
    });
    let _writer = AbortOnDrop(writer);
    let why = loop {
        match read.next().await {
            Some(Ok(bytes)) => match read_response(&bytes, secret.as_ref()) {
                Ok((id, answer)) => {
                    // No waiter: the request timed out; its reply is dropped here.
                    if let Some(w) = lock(&waiters).remove(&id) {
                        let _ = w.send(answer);
                    }
                }
                Err(e) => tracing::debug!(%to, error = %e, "probe client: undecodable reply dropped"),
            },
            Some(Err(e)) => break format!("{to}: {e}"),
            None => break format!("{to}: connection closed"),
        }
    };
    for (_, w) in lock(&waiters).drain() {
        let _ = w.send(Err(TransportError::Unreachable(why.clone())));
    }
}

#[async_trait]
impl Transport for TcpTransport {
    async fn request(
        &self,
        to: SocketAddr,
        cluster: &str,
        request: ProbeRequest,
        timeout: Duration,
    ) -> Result<ProbeResponse, TransportError> {
        let id = next_request_id();
        let frame = Bytes::from(seal(
            encode(&Frame {
                id,
                cluster: cluster.to_owned(),
                body: request,
            })?,
            self.config.shared_secret.as_ref(),
        ));
        match tokio::time::timeout(timeout, self.exchange(to, id, frame)).await {
            Ok(r) => r,
            Err(_) => Err(TransportError::Timeout(timeout)),
        }
    }

    async fn serve(
        &self,
        listen: SocketAddr,
        cluster: &str,
        handler: Arc<dyn ProbeHandler>,
    ) -> Result<Listener, TransportError> {
        let listener = TcpListener::bind(listen)
            .await
            .map_err(|e| TransportError::Bind {
                addr: listen,
                reason: e.to_string(),
            })?;
        let local_addr = listener.local_addr().map_err(|e| TransportError::Bind {
            addr: listen,
            reason: e.to_string(),
        })?;
        let server = Arc::new(Server {
            cluster: Arc::from(cluster),
            handler,
            config: self.config.clone(),
            garbage_log: LogLimiter::new(LOG_INTERVAL),
            timeout_log: LogLimiter::new(LOG_INTERVAL),
        });
        let task = tokio::spawn(accept_loop(listener, local_addr, server));
        Ok(Listener {
            local_addr,
            _guard: Box::new(AbortOnDrop(task)),
        })
    }
}

struct AbortOnDrop(tokio::task::JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

/// One line per kind of trouble per this interval, at most.
const LOG_INTERVAL: Duration = Duration::from_secs(10);

/// What every connection of one served endpoint shares.
struct Server {
    cluster: Arc<str>,
    handler: Arc<dyn ProbeHandler>,
    config: Arc<TcpConfig>,
    garbage_log: LogLimiter,
    timeout_log: LogLimiter,
}

/// One inbound connection, as the accept loop tracks it.
struct Inbound {
    abort: tokio::task::AbortHandle,
    /// Set once the connection delivered a valid frame of our cluster.
    verified: Arc<std::sync::atomic::AtomicBool>,
    /// Accept order (older = smaller).
    seq: u64,
}

/// Accepts connections within the [`TcpConfig`] limits until aborted.
async fn accept_loop(listener: TcpListener, local_addr: SocketAddr, server: Arc<Server>) {
    use std::sync::atomic::Ordering;
    // Dropping the JoinSet (when this task is aborted) aborts every connection.
    let mut connections = JoinSet::new();
    let mut live: HashMap<tokio::task::Id, Inbound> = HashMap::new();
    let mut seq = 0u64;
    let accept_log = LogLimiter::new(LOG_INTERVAL);
    let evict_log = LogLimiter::new(LOG_INTERVAL);
    loop {
        tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, peer)) => {
                    let unverified: Vec<(u64, tokio::task::Id)> = live
                        .iter()
                        .filter(|(_, c)| !c.verified.load(Ordering::Relaxed))
                        .map(|(id, c)| (c.seq, *id))
                        .collect();
                    let full = live.len() >= server.config.max_connections;
                    if unverified.len() >= server.config.max_unverified || full {
                        // Evict the oldest connection that never delivered a frame.
                        match unverified.iter().min() {
                            Some((_, id)) => {
                                if let Some(c) = live.remove(id) {
                                    c.abort.abort();
                                }
                            }
                            None => {
                                if let Some(n) = evict_log.allow() {
                                    tracing::warn!(%local_addr, %peer, suppressed = n,
                                        max = server.config.max_connections,
                                        "probe server: connection limit reached; closing a new connection");
                                }
                                continue; // all are known peers: drop the newcomer
                            }
                        }
                    }
                    let _ = stream.set_nodelay(true);
                    seq += 1;
                    let verified = Arc::new(std::sync::atomic::AtomicBool::new(false));
                    let abort = connections.spawn(serve_connection(stream, peer, server.clone(), verified.clone()));
                    live.insert(abort.id(), Inbound { abort, verified, seq });
                }
                Err(e) => {
                    // EMFILE and friends: back off instead of spinning.
                    if let Some(n) = accept_log.allow() {
                        tracing::warn!(%local_addr, error = %e, suppressed = n, "probe server: accept failed");
                    }
                    tokio::time::sleep(Duration::from_millis(50)).await;
                }
            },
            Some(done) = connections.join_next_with_id(), if !connections.is_empty() => {
                let id = match done {
                    Ok((id, ())) => id,
                    Err(e) => e.id(),
                };
                live.remove(&id);
            }
        }
    }
}

/// Reads request frames and answers each in its own task (at most
/// [`MAX_IN_FLIGHT_PER_CONNECTION`] at once); a writer task sends the replies in
/// completion order. Closes the connection on the [`TcpConfig`] timeouts.
async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    server: Arc<Server>,
    verified: Arc<std::sync::atomic::AtomicBool>,
) {
    use std::sync::atomic::Ordering;
    use tokio::time::Instant;
    let (read, write) = stream.into_split();
    let mut read = FramedRead::new(read, codec());
    let mut write = FramedWrite::new(write, codec());
    let (replies, mut rx) = mpsc::channel::<Bytes>(MAX_IN_FLIGHT_PER_CONNECTION);
    let mut writer = AbortOnDrop(tokio::spawn(async move {
        while let Some(frame) = rx.recv().await {
            if write.send(frame).await.is_err() {
                return;
            }
        }
    }));
    let permits = Arc::new(Semaphore::new(MAX_IN_FLIGHT_PER_CONNECTION));
    let mut answering = JoinSet::new();
    let frame_timeout = server.config.frame_timeout.max(Duration::from_millis(10));
    let accepted = Instant::now();
    let mut last_frame = accepted;
    let mut partial_since: Option<Instant> = None;
    loop {
        let next = match tokio::time::timeout(frame_timeout / 2, read.next()).await {
            Ok(next) => next,
            Err(_) => {
                let now = Instant::now();
                let why = if !verified.load(Ordering::Relaxed) {
                    (now.duration_since(accepted) >= frame_timeout).then_some("no valid frame in time")
                } else if !read.read_buffer().is_empty() {
                    let since = *partial_since.get_or_insert(now);
                    (now.duration_since(since) >= frame_timeout).then_some("frame too slow")
                } else {
                    partial_since = None;
                    (now.duration_since(last_frame) >= server.config.idle_timeout).then_some("idle")
                };
                match why {
                    Some(why) => {
                        if let Some(n) = server.timeout_log.allow() {
                            tracing::debug!(%peer, why, suppressed = n, "probe server: closing connection");
                        }
                        break;
                    }
                    None => continue,
                }
            }
        };
        let Some(frame) = next else { break };
        let bytes = match frame {
            Ok(b) => b,
            Err(e) => {
                if let Some(n) = server.garbage_log.allow() {
                    tracing::warn!(%peer, error = %e, suppressed = n, "probe server: unreadable frame, closing connection");
                }
                break;
            }
        };
        last_frame = Instant::now();
        partial_since = None;
        let secret = server.config.shared_secret.as_ref();
        let request = match open_request(&server.cluster, secret, &bytes) {
            Ok((request, from_peer)) => {
                if from_peer {
                    verified.store(true, Ordering::Relaxed);
                }
                request
            }
            Err(e) => {
                if let Some(n) = server.garbage_log.allow() {
                    tracing::warn!(%peer, error = %e, suppressed = n, "probe server: frame dropped");
                }
                continue;
            }
        };
        let Ok(permit) = permits.clone().acquire_owned().await else {
            break;
        };
        let (server, replies) = (server.clone(), replies.clone());
        answering.spawn(async move {
            let _permit = permit;
            let secret = server.config.shared_secret.as_ref();
            match answer_request(&server.cluster, secret, server.handler.as_ref(), request).await {
                Ok(answer) => {
                    let _ = replies.send(Bytes::from(answer)).await;
                }
                Err(e) => tracing::warn!(%peer, error = %e, "probe server: reply not encoded"),
            }
        });
        while answering.try_join_next().is_some() {}
    }
    // The peer closed its side (or timed out): finish the answers under way, let the
    // writer send them (bounded: a peer that no longer reads must not hold the
    // task), then close.
    drop(replies);
    while answering.join_next().await.is_some() {}
    let _ = tokio::time::timeout(Duration::from_secs(1), &mut writer.0).await;
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::{AtomicUsize, Ordering};

    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;
    use crate::SiloAddress;

    /// Counts the requests that reach the protocol.
    #[derive(Default)]
    struct Counting(AtomicUsize);

    #[async_trait]
    impl ProbeHandler for Counting {
        async fn handle(&self, request: ProbeRequest) -> ProbeResponse {
            self.0.fetch_add(1, Ordering::SeqCst);
            match request {
                ProbeRequest::Ping { target, .. } => ProbeResponse::Pong {
                    responder: target,
                    health: 0,
                    version: 0,
                    received_ms: 0,
                    sent_ms: 0,
                },
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

    async fn serve(config: TcpConfig) -> (Listener, Arc<Counting>) {
        let handler = Arc::new(Counting::default());
        let listener = TcpTransport::with_config(config)
            .serve("127.0.0.1:0".parse().unwrap(), "c", handler.clone())
            .await
            .unwrap();
        (listener, handler)
    }

    async fn ping(client: &TcpTransport, to: SocketAddr) -> Result<ProbeResponse, TransportError> {
        let req = ProbeRequest::Ping {
            from: silo(1),
            target: silo(to.port()),
            version: 0,
            sent_ms: 0,
        };
        client.request(to, "c", req, Duration::from_secs(2)).await
    }

    /// Issue 8, defect 4: idle and half-open connections used to pile up until the
    /// port (and the process's descriptors) were exhausted and real pings failed.
    /// Now unverified connections are capped and closed after `frame_timeout`.
    #[tokio::test]
    async fn idle_connections_cannot_exhaust_the_probe_port() {
        let config = TcpConfig {
            frame_timeout: Duration::from_millis(300),
            max_unverified: 8,
            max_connections: 16,
            ..TcpConfig::default()
        };
        let (listener, handler) = serve(config).await;
        let to = listener.local_addr;
        let mut idle = Vec::new();
        for _ in 0..100 {
            idle.push(TcpStream::connect(to).await.unwrap());
        }
        // A real peer still gets in at once, over the 100 idle connections.
        let client = TcpTransport::new();
        assert!(matches!(ping(&client, to).await, Ok(ProbeResponse::Pong { .. })));
        // Every idle connection is closed by the server: evicted or timed out.
        for mut s in idle {
            let mut buf = [0u8; 1];
            let n = tokio::time::timeout(Duration::from_secs(5), s.read(&mut buf))
                .await
                .expect("the server closes an idle connection")
                .unwrap_or(0);
            assert_eq!(n, 0);
        }
        // The known peer's connection stayed (not evicted, not timed out yet).
        assert!(matches!(ping(&client, to).await, Ok(ProbeResponse::Pong { .. })));
        assert_eq!(handler.0.load(Ordering::SeqCst), 2);
    }

    /// A frame that trickles in slower than `frame_timeout` closes the connection,
    /// also on a connection that already delivered a valid frame.
    #[tokio::test]
    async fn a_slow_frame_closes_its_connection() {
        let config = TcpConfig {
            frame_timeout: Duration::from_millis(300),
            ..TcpConfig::default()
        };
        let (listener, _) = serve(config).await;
        let mut s = TcpStream::connect(listener.local_addr).await.unwrap();
        let frame = encode(&Frame {
            id: 1,
            cluster: "c".to_owned(),
            body: ProbeRequest::Gossip {
                from: silo(1),
                version: 1,
            },
        })
        .unwrap();
        s.write_all(&(frame.len() as u32).to_be_bytes()).await.unwrap();
        s.write_all(&frame).await.unwrap();
        let mut reply = [0u8; 4];
        s.read_exact(&mut reply).await.expect("a valid frame is answered");
        // Now a frame announced as 100 bytes, of which 1 byte arrives.
        s.write_all(&100u32.to_be_bytes()).await.unwrap();
        s.write_all(&[FRAME_VERSION_FOR_TESTS]).await.unwrap();
        let mut rest = Vec::new();
        let closed = tokio::time::timeout(Duration::from_secs(5), s.read_to_end(&mut rest)).await;
        assert!(
            closed.is_ok(),
            "the server closes a connection whose frame stalls"
        );
    }
    const FRAME_VERSION_FOR_TESTS: u8 = super::super::FRAME_VERSION;

    /// Issue 8, defect 5: with a shared secret, frames without a valid HMAC never
    /// reach the protocol (5,000 forged gossips cost nothing); peers with the secret
    /// talk as before.
    #[tokio::test]
    async fn with_a_shared_secret_forged_frames_are_dropped() {
        let secret = SharedSecret::new("the cluster's secret, 32 bytes..").unwrap();
        let (listener, handler) = serve(TcpConfig {
            shared_secret: Some(secret.clone()),
            ..TcpConfig::default()
        })
        .await;
        let to = listener.local_addr;
        // A forger without the secret, and one with a wrong secret.
        let mut s = TcpStream::connect(to).await.unwrap();
        for id in 0..5_000u64 {
            let frame = encode(&Frame {
                id,
                cluster: "c".to_owned(),
                body: ProbeRequest::Gossip {
                    from: silo(9),
                    version: u64::MAX,
                },
            })
            .unwrap();
            s.write_all(&(frame.len() as u32).to_be_bytes()).await.unwrap();
            s.write_all(&frame).await.unwrap();
        }
        let wrong = TcpTransport::with_config(TcpConfig {
            shared_secret: Some(SharedSecret::new("not the cluster's secret at all").unwrap()),
            ..TcpConfig::default()
        });
        let r = wrong
            .request(
                to,
                "c",
                ProbeRequest::Gossip {
                    from: silo(9),
                    version: 1,
                },
                Duration::from_millis(300),
            )
            .await;
        assert!(matches!(r, Err(TransportError::Timeout(_))), "{r:?}");
        let plain = TcpTransport::new();
        assert!(ping(&plain, to).await.is_err(), "an unsealed ping gets no answer");
        // The real peer.
        let peer = TcpTransport::with_config(TcpConfig {
            shared_secret: Some(secret),
            ..TcpConfig::default()
        });
        assert!(matches!(ping(&peer, to).await, Ok(ProbeResponse::Pong { .. })));
        assert_eq!(
            handler.0.load(Ordering::SeqCst),
            1,
            "only the sealed ping reached the handler"
        );
    }
}
