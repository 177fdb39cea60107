//! Probe transport over TCP (tokio): length-delimited frames of at most
//! [`MAX_FRAME_BYTES`], each a version byte plus a postcard-encoded message; one
//! reused connection per peer, one request in flight per connection.
//!
//! A frame that does not decode is dropped with a warning (the connection stays up);
//! an oversized or malformed length prefix closes that connection. Nothing a peer
//! sends can panic the server.

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use futures_util::{SinkExt, StreamExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::task::JoinSet;
use tokio_util::codec::{Framed, LengthDelimitedCodec};

use super::{
    decode, encode, Listener, ProbeHandler, ProbeRequest, ProbeResponse, Transport, TransportError,
    MAX_FRAME_BYTES,
};

type Conn = Framed<TcpStream, LengthDelimitedCodec>;
type Slot = Arc<tokio::sync::Mutex<Option<Conn>>>;

fn codec() -> LengthDelimitedCodec {
    LengthDelimitedCodec::builder()
        .max_frame_length(MAX_FRAME_BYTES)
        .new_codec()
}

/// The TCP [`Transport`]. Cheap to clone; clones share the connection cache.
#[derive(Clone, Debug, Default)]
pub struct TcpTransport {
    conns: Arc<Mutex<HashMap<SocketAddr, Slot>>>,
}

impl TcpTransport {
    /// A transport with an empty connection cache.
    pub fn new() -> Self {
        Self::default()
    }

    fn slot(&self, to: SocketAddr) -> Slot {
        let mut conns = self.conns.lock().unwrap_or_else(|p| p.into_inner());
        conns.entry(to).or_default().clone()
    }

    async fn exchange(slot: &Slot, to: SocketAddr, frame: Bytes) -> Result<ProbeResponse, TransportError> {
        let mut guard = slot.lock().await;
        if guard.is_none() {
            let stream = TcpStream::connect(to)
                .await
                .map_err(|e| TransportError::Unreachable(format!("{to}: {e}")))?;
            let _ = stream.set_nodelay(true);
            *guard = Some(Framed::new(stream, codec()));
        }
        let Some(conn) = guard.as_mut() else {
            return Err(TransportError::Unreachable(format!("{to}: no connection")));
        };
        let result = async {
            conn.send(frame)
                .await
                .map_err(|e| TransportError::Unreachable(format!("{to}: {e}")))?;
            match conn.next().await {
                Some(Ok(bytes)) => decode::<ProbeResponse>(&bytes),
                Some(Err(e)) => Err(TransportError::Codec(format!("{to}: {e}"))),
                None => Err(TransportError::Unreachable(format!("{to}: connection closed"))),
            }
        }
        .await;
        if result.is_err() {
            *guard = None;
        }
        result
    }
}

#[async_trait]
impl Transport for TcpTransport {
    async fn request(
        &self,
        to: SocketAddr,
        request: ProbeRequest,
        timeout: Duration,
    ) -> Result<ProbeResponse, TransportError> {
        let frame = Bytes::from(encode(&request)?);
        let slot = self.slot(to);
        match tokio::time::timeout(timeout, Self::exchange(&slot, to, frame)).await {
            Ok(r) => r,
            Err(_) => {
                // The response may still arrive later: never reuse that connection.
                if let Ok(mut g) = slot.try_lock() {
                    *g = None;
                }
                Err(TransportError::Timeout(timeout))
            }
        }
    }

    async fn serve(
        &self,
        listen: SocketAddr,
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
        let task = tokio::spawn(async move {
            // Dropping the JoinSet (when this task is aborted) aborts every connection.
            let mut connections = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => match accepted {
                        Ok((stream, peer)) => {
                            let _ = stream.set_nodelay(true);
                            connections.spawn(serve_connection(stream, peer, handler.clone()));
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

async fn serve_connection(stream: TcpStream, peer: SocketAddr, handler: Arc<dyn ProbeHandler>) {
    let mut conn = Framed::new(stream, codec());
    while let Some(frame) = conn.next().await {
        let bytes = match frame {
            Ok(b) => b,
            Err(e) => {
                tracing::warn!(%peer, error = %e, "probe server: unreadable frame, closing connection");
                return;
            }
        };
        let request = match decode::<ProbeRequest>(&bytes) {
            Ok(r) => r,
            Err(e) => {
                tracing::warn!(%peer, error = %e, len = bytes.len(), "probe server: garbage frame dropped");
                continue;
            }
        };
        let response = handler.handle(request).await;
        let Ok(out) = encode(&response) else { return };
        if conn.send(Bytes::from(out)).await.is_err() {
            return;
        }
    }
}
