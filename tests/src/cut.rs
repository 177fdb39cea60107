//! A TCP proxy that cuts a connection between a request and its reply: the
//! server has received the request and answered it (so it was applied), and
//! the client never sees the answer, only a closed connection. The real fault
//! behind an ambiguous commit ("a connection cut after the request is sent").
//!
//! What counts as "the answer" depends on the wire ([`Wire`]): every byte a
//! Redis server sends is a reply, but an HTTP/2 server (etcd's gRPC) also sends
//! control frames of its own (window updates, pings) at any time, and a cut on
//! one of those would come before the request was even sent.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The protocol a [`CutProxy`] relays, which says what a reply looks like.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Wire {
    /// RESP (Redis): a server only sends replies, so any bytes are one.
    Resp,
    /// HTTP/2 (gRPC): a reply is a HEADERS or DATA frame on a request's stream;
    /// connection-level frames (SETTINGS, PING, WINDOW_UPDATE on stream 0, and
    /// WINDOW_UPDATE or RST on any stream) pass through while armed.
    Http2,
}

/// A proxy in front of one server: `addr` forwards to `upstream` until
/// [`arm`](CutProxy::arm)ed; then the next reply any server sends back (as
/// [`Wire`] defines it) is dropped with both sides of its connection.
#[derive(Debug)]
pub struct CutProxy {
    addr: SocketAddr,
    wire: Wire,
    armed: Arc<AtomicBool>,
    cuts: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl CutProxy {
    /// A proxy on a free loopback port in front of `upstream`, which speaks
    /// `wire`.
    ///
    /// # Panics
    /// If no loopback port can be bound (a test fixture).
    pub async fn start(upstream: SocketAddr, wire: Wire) -> CutProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let armed = Arc::new(AtomicBool::new(false));
        let cuts = Arc::new(AtomicUsize::new(0));
        let (a, c) = (armed.clone(), cuts.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                tokio::spawn(relay(client, server, wire, a.clone(), c.clone()));
            }
        });
        CutProxy {
            addr,
            wire,
            armed,
            cuts,
            task,
        }
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Cuts the connection that next carries a reply back from the server,
    /// dropping the reply.
    pub fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
    }

    /// The protocol relayed.
    pub fn wire(&self) -> Wire {
        self.wire
    }

    /// How many connections were cut.
    pub fn cuts(&self) -> usize {
        self.cuts.load(Ordering::SeqCst)
    }
}

impl Drop for CutProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn relay(
    client: TcpStream,
    server: TcpStream,
    wire: Wire,
    armed: Arc<AtomicBool>,
    cuts: Arc<AtomicUsize>,
) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let up = async {
        let _ = tokio::io::copy(&mut cr, &mut sw).await;
    };
    let down = async {
        let mut buf = vec![0u8; 64 * 1024];
        // Bytes read from the server and not yet forwarded (an HTTP/2 frame
        // split over reads).
        let mut pending: Vec<u8> = Vec::new();
        loop {
            match sr.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => pending.extend_from_slice(&buf[..n]),
            }
            // Forward whole units (everything for RESP, whole frames for
            // HTTP/2) until a reply meets an armed proxy.
            loop {
                let (len, reply) = match wire {
                    Wire::Resp => (pending.len(), true),
                    Wire::Http2 => match http2_frame(&pending) {
                        Some(frame) => frame,
                        None => break,
                    },
                };
                if len == 0 {
                    break;
                }
                if reply && armed.swap(false, Ordering::SeqCst) {
                    cuts.fetch_add(1, Ordering::SeqCst);
                    return; // the reply is dropped, and the connection with it
                }
                if cw.write_all(&pending[..len]).await.is_err() {
                    return;
                }
                pending.drain(..len);
            }
        }
    };
    // Either side ending ends both: dropping the halves closes the sockets.
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}

/// The length of the whole HTTP/2 frame at the start of `bytes` and whether it
/// is a reply (HEADERS or DATA on a stream), or `None` until it has all arrived.
/// A server sends no preface of its own (RFC 9113 section 3.4: its preface is a
/// SETTINGS frame), so its bytes are frames from the first.
fn http2_frame(bytes: &[u8]) -> Option<(usize, bool)> {
    let (len, kind, stream) = http2_header(bytes)?;
    // 0x0 DATA, 0x1 HEADERS, 0x9 CONTINUATION (of a HEADERS).
    let reply = stream != 0 && matches!(kind, 0x0 | 0x1 | 0x9);
    Some((len, reply))
}

/// The whole HTTP/2 frame at the start of `bytes`: its length (header
/// included), type and stream id; `None` until it has all arrived.
pub(crate) fn http2_header(bytes: &[u8]) -> Option<(usize, u8, u32)> {
    const HEADER: usize = 9;
    if bytes.len() < HEADER {
        return None;
    }
    let payload = u32::from_be_bytes([0, bytes[0], bytes[1], bytes[2]]) as usize;
    if bytes.len() < HEADER + payload {
        return None;
    }
    let stream = u32::from_be_bytes([bytes[5], bytes[6], bytes[7], bytes[8]]) & 0x7fff_ffff;
    Some((HEADER + payload, bytes[3], stream))
}

#[cfg(test)]
mod tests {
    use super::http2_frame;

    #[test]
    fn http2_frames_are_split_and_classified() {
        // A PING on stream 0 (8-byte payload), then a HEADERS on stream 1 cut short.
        let mut bytes = vec![0, 0, 8, 0x6, 0, 0, 0, 0, 0];
        bytes.extend_from_slice(&[7; 8]);
        assert_eq!(http2_frame(&bytes), Some((17, false)));
        bytes.extend_from_slice(&[0, 0, 3, 0x1, 0x4, 0, 0, 0, 1, 0xaa]);
        assert_eq!(
            http2_frame(&bytes[17..]),
            None,
            "two of its three payload bytes are missing"
        );
        bytes.extend_from_slice(&[0xbb, 0xcc]);
        assert_eq!(http2_frame(&bytes[17..]), Some((12, true)));
        // A WINDOW_UPDATE on stream 1 is not a reply.
        assert_eq!(
            http2_frame(&[0, 0, 4, 0x8, 0, 0, 0, 0, 1, 0, 0, 0, 1]),
            Some((13, false))
        );
        assert_eq!(http2_frame(&[0, 0]), None);
    }
}
