//! Probe transport over TCP (tokio): length-delimited frames of at most
//! [`MAX_FRAME_BYTES`], each a version byte plus a postcard-encoded [`Frame`].
//!
//! **Client.** One reused connection per peer, multiplexed: every request gets a
//! process-unique id, a connection task writes frames and hands each response frame
//! to the request waiting for that id. A request that times out only forgets its id,
//! so its late reply is dropped by the connection task and can never be taken for
//! the answer to a later request (a slow peer cannot misattribute replies). At most
//! [`MAX_PENDING_PER_PEER`] requests wait on one connection; more fail at once.
//!
//! **Server.** Each connection answers up to [`MAX_IN_FLIGHT_PER_CONNECTION`]
//! requests concurrently (an indirect ping that waits for a third silo does not hold
//! up the pings behind it); replies go out in completion order with their ids. A
//! frame that does not decode is dropped with a warning (the connection stays up);
//! an oversized or malformed length prefix closes that connection. Nothing a peer
//! sends can panic the server.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::stream::FuturesUnordered;
use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinSet;
use tokio_util::codec::{Framed, LengthDelimitedCodec};

use super::{
    answer_frame, encode, next_request_id, read_response, Frame, Listener, ProbeHandler, ProbeRequest,
    ProbeResponse, Transport, TransportError, MAX_FRAME_BYTES,
};

/// Requests that may wait for replies on one peer connection at once.
pub const MAX_PENDING_PER_PEER: usize = 1024;
/// Requests one server connection answers concurrently; further frames wait in the
/// socket until one finishes.
pub const MAX_IN_FLIGHT_PER_CONNECTION: usize = 32;

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
}

impl TcpTransport {
    /// A transport with an empty connection cache.
    pub fn new() -> Self {
        Self::default()
    }

    /// The live connection to `to`, connecting if there is none.
    async fn peer(&self, to: SocketAddr) -> Result<Arc<Peer>, TransportError> {
        if let Some(p) = lock(&self.peers).get(&to) {
            if !p.task.is_finished() {
                return Ok(p.clone());
            }
        }
        let stream = TcpStream::connect(to)
            .await
            .map_err(|e| TransportError::Unreachable(format!("{to}: {e}")))?;
        let _ = stream.set_nodelay(true);
        let waiters: Arc<Mutex<Waiters>> = Arc::default();
        let (outgoing, rx) = mpsc::channel(64);
        let task = tokio::spawn(run_client_connection(
            Framed::new(stream, codec()),
            to,
            rx,
            waiters.clone(),
        ));
        let peer = Arc::new(Peer {
            outgoing,
            waiters,
            task,
        });
        let mut peers = lock(&self.peers);
        // Another request may have connected meanwhile: keep one connection.
        match peers.get(&to) {
            Some(existing) if !existing.task.is_finished() => Ok(existing.clone()),
            _ => {
                peers.insert(to, peer.clone());
                Ok(peer)
            }
        }
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

/// Writes request frames and routes response frames to their waiters by id, until
/// the connection fails; then every waiter learns it at once.
async fn run_client_connection(
    mut conn: Framed<TcpStream, LengthDelimitedCodec>,
    to: SocketAddr,
    mut outgoing: mpsc::Receiver<Bytes>,
    waiters: Arc<Mutex<Waiters>>,
) {
    let why = loop {
        tokio::select! {
            biased;
            incoming = conn.next() => match incoming {
                Some(Ok(bytes)) => match read_response(&bytes) {
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
            },
            frame = outgoing.recv() => match frame {
                Some(frame) => {
                    if let Err(e) = conn.send(frame).await {
                        break format!("{to}: {e}");
                    }
                }
                None => return,
            },
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
        let frame = Bytes::from(encode(&Frame {
            id,
            cluster: cluster.to_owned(),
            body: request,
        })?);
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
        let cluster: Arc<str> = Arc::from(cluster);
        let task = tokio::spawn(async move {
            // Dropping the JoinSet (when this task is aborted) aborts every connection.
            let mut connections = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((stream, peer)) => {
                            let _ = stream.set_nodelay(true);
                            connections.spawn(serve_connection(stream, peer, cluster.clone(), handler.clone()));
                        }
                        Err(e) => {
                            tracing::warn!(%local_addr, error = %e, "probe server: accept failed");
                            tokio::time::sleep(Duration::from_millis(50)).await;
                        }
                    },
                    Some(_) = connections.join_next(), if !connections.is_empty() => {}
                }
            }
        });
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

async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    cluster: Arc<str>,
    handler: Arc<dyn ProbeHandler>,
) {
    let mut conn = Framed::new(stream, codec());
    let mut in_flight = FuturesUnordered::new();
    loop {
        tokio::select! {
            biased;
            Some(answer) = in_flight.next(), if !in_flight.is_empty() => {
                let answer: Result<Vec<u8>, TransportError> = answer;
                match answer {
                    Ok(out) => {
                        if conn.send(Bytes::from(out)).await.is_err() {
                            return;
                        }
                    }
                    Err(e) => tracing::warn!(%peer, error = %e, "probe server: garbage frame dropped"),
                }
            }
            frame = conn.next(), if in_flight.len() < MAX_IN_FLIGHT_PER_CONNECTION => match frame {
                Some(Ok(bytes)) => {
                    let (cluster, handler) = (cluster.clone(), handler.clone());
                    in_flight.push(async move { answer_frame(&cluster, handler.as_ref(), &bytes).await });
                }
                Some(Err(e)) => {
                    tracing::warn!(%peer, error = %e, "probe server: unreadable frame, closing connection");
                    return;
                }
                None => return,
            },
        }
    }
}
