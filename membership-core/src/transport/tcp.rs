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
//! frame that does not decode is dropped with a warning (the connection stays up);
//! an oversized or malformed length prefix closes that connection. Nothing a peer
//! sends can panic the server.

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
    /// One connect at a time per peer: concurrent requests wait for it and share it.
    connecting: Arc<Mutex<HashMap<SocketAddr, Arc<tokio::sync::Mutex<()>>>>>,
}

impl TcpTransport {
    /// A transport with an empty connection cache.
    pub fn new() -> Self {
        Self::default()
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

/// Reads request frames and answers each in its own task (at most
/// [`MAX_IN_FLIGHT_PER_CONNECTION`] at once); a writer task sends the replies in
/// completion order.
async fn serve_connection(
    stream: TcpStream,
    peer: SocketAddr,
    cluster: Arc<str>,
    handler: Arc<dyn ProbeHandler>,
) {
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
    while let Some(frame) = read.next().await {
        let bytes = match frame {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(%peer, error = %e, "probe server: unreadable frame, closing connection");
                break;
            }
        };
        let Ok(permit) = permits.clone().acquire_owned().await else {
            break;
        };
        let (cluster, handler, replies) = (cluster.clone(), handler.clone(), replies.clone());
        answering.spawn(async move {
            let _permit = permit;
            match answer_frame(&cluster, handler.as_ref(), &bytes).await {
                Ok(out) => {
                    let _ = replies.send(Bytes::from(out)).await;
                }
                Err(e) => tracing::warn!(%peer, error = %e, "probe server: garbage frame dropped"),
            }
        });
        while answering.try_join_next().is_some() {}
    }
    // The peer closed its side: finish the answers under way, let the writer send
    // them (bounded: a peer that no longer reads must not hold the task), then close.
    drop(replies);
    while answering.join_next().await.is_some() {}
    let _ = tokio::time::timeout(Duration::from_secs(1), &mut writer.0).await;
}
