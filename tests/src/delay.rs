//! A TCP proxy that adds latency: every chunk of bytes, either way, is
//! forwarded a set time after it arrived, in order, so a client behind it
//! sees its store as far away (a round trip twice the one-way delay) without
//! losing throughput. The delay can be changed while connections are open
//! (what `tc netem delay` does to one host's traffic, without root).
//!
//! In front of an HTTP/2 server it can delay only the answers
//! ([`Delayed::Http2Answers`]): a server slow to answer on a healthy
//! connection, whose keepalive pings are still acknowledged at once.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Chunks in flight one way on one connection before the reader waits (a
/// bound, so a stalled writer cannot grow memory without limit).
const IN_FLIGHT: usize = 4096;

/// What a [`DelayProxy`] delays.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Delayed {
    /// Every byte, both ways.
    Everything,
    /// Only an HTTP/2 server's frames on requests' streams (HEADERS, DATA,
    /// CONTINUATION, RST_STREAM), in their order; the server's connection
    /// frames (SETTINGS, PING acknowledgements, WINDOW_UPDATE) and every
    /// byte the client sends go at once. Calls time out while the
    /// connection stays healthy.
    Http2Answers,
}

/// A proxy on a loopback port in front of one server, adding a one-way delay
/// ([`set_delay`](DelayProxy::set_delay)) to every byte it forwards.
#[derive(Debug)]
pub struct DelayProxy {
    addr: SocketAddr,
    one_way_ms: Arc<AtomicU64>,
    queued: Arc<AtomicUsize>,
    connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl DelayProxy {
    /// A proxy on a free loopback port in front of `upstream`, adding no
    /// delay until [`set_delay`](DelayProxy::set_delay).
    ///
    /// # Panics
    /// If no loopback port can be bound (a test fixture).
    pub async fn start(upstream: SocketAddr) -> DelayProxy {
        DelayProxy::start_with(upstream, Delayed::Everything).await
    }

    /// A proxy on a free loopback port in front of `upstream` that delays
    /// what `delayed` says, no delay until
    /// [`set_delay`](DelayProxy::set_delay).
    ///
    /// # Panics
    /// If no loopback port can be bound (a test fixture).
    pub async fn start_with(upstream: SocketAddr, delayed: Delayed) -> DelayProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let one_way_ms = Arc::new(AtomicU64::new(0));
        let queued = Arc::new(AtomicUsize::new(0));
        let connections = Arc::new(AtomicUsize::new(0));
        let delay = one_way_ms.clone();
        let (q, n) = (queued.clone(), connections.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                n.fetch_add(1, Ordering::SeqCst);
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                match delayed {
                    Delayed::Everything => {
                        tokio::spawn(one_way(cr, sw, delay.clone(), q.clone()));
                        tokio::spawn(one_way(sr, cw, delay.clone(), q.clone()));
                    }
                    Delayed::Http2Answers => {
                        tokio::spawn(one_way(cr, sw, Arc::new(AtomicU64::new(0)), q.clone()));
                        tokio::spawn(answers_late(sr, cw, delay.clone(), q.clone()));
                    }
                }
            }
        });
        DelayProxy {
            addr,
            one_way_ms,
            queued,
            connections,
            task,
        }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Chunks read and not yet forwarded, both ways, on every connection:
    /// 0 once what arrived under a delay has gone through.
    pub fn queued(&self) -> usize {
        self.queued.load(Ordering::SeqCst)
    }

    /// Connections accepted (and connected upstream) so far: a client that
    /// reconnects shows here.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }

    /// Forwards every chunk that arrives from now on `one_way` after it
    /// arrived (both ways: a round trip gains twice as much).
    pub fn set_delay(&self, one_way: Duration) {
        self.one_way_ms.store(
            u64::try_from(one_way.as_millis()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
    }
}

impl Drop for DelayProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// Reads from `from`, and writes each chunk to `to` its delay after it
/// arrived; either side closing ends both.
async fn one_way(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Arc<AtomicU64>,
    queued: Arc<AtomicUsize>,
) {
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(IN_FLIGHT);
    let left = queued.clone();
    let writer = tokio::spawn(async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            let sent = to.write_all(&chunk).await;
            left.fetch_sub(1, Ordering::SeqCst);
            if sent.is_err() {
                // What is still queued will never go: not queued any more.
                rx.close();
                while rx.recv().await.is_some() {
                    left.fetch_sub(1, Ordering::SeqCst);
                }
                return;
            }
        }
        let _ = to.shutdown().await;
    });
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => {
                let due = Instant::now() + Duration::from_millis(delay.load(Ordering::SeqCst));
                queued.fetch_add(1, Ordering::SeqCst);
                if tx.send((due, buf[..n].to_vec())).await.is_err() {
                    queued.fetch_sub(1, Ordering::SeqCst);
                    break;
                }
            }
        }
    }
    drop(tx);
    let _ = writer.await;
}

/// Reads HTTP/2 frames from the server half `from` and writes them to `to`:
/// frames on a request's stream (HEADERS, DATA, CONTINUATION, RST_STREAM)
/// the delay after they arrived and in their order (never before an earlier
/// one: HPACK state rides on their order), every other frame at once.
async fn answers_late(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    delay: Arc<AtomicU64>,
    queued: Arc<AtomicUsize>,
) {
    let (tx_now, mut rx_now) = mpsc::channel::<Vec<u8>>(IN_FLIGHT);
    let (tx_late, mut rx_late) = mpsc::channel::<(Instant, Vec<u8>)>(IN_FLIGHT);
    let left = queued.clone();
    let writer = tokio::spawn(async move {
        let mut late = std::collections::VecDeque::<(Instant, Vec<u8>)>::new();
        let (mut now_open, mut late_open) = (true, true);
        while now_open || late_open || !late.is_empty() {
            let head = late.front().map(|(due, _)| *due);
            let frame = tokio::select! {
                biased;
                f = rx_now.recv(), if now_open => match f {
                    Some(f) => Some(f),
                    None => {
                        now_open = false;
                        None
                    }
                },
                () = tokio::time::sleep_until(head.unwrap_or_else(Instant::now)), if head.is_some() => {
                    left.fetch_sub(1, Ordering::SeqCst);
                    late.pop_front().map(|(_, f)| f)
                },
                f = rx_late.recv(), if late_open => {
                    match f {
                        Some(f) => late.push_back(f),
                        None => late_open = false,
                    }
                    None
                },
            };
            if let Some(frame) = frame {
                if to.write_all(&frame).await.is_err() {
                    break;
                }
            }
        }
        rx_late.close();
        let unsent = late.len() + std::iter::from_fn(|| rx_late.try_recv().ok()).count();
        left.fetch_sub(unsent, Ordering::SeqCst);
        let _ = to.shutdown().await;
    });
    let mut buf = vec![0u8; 64 * 1024];
    let mut pending: Vec<u8> = Vec::new();
    let mut last_due = Instant::now();
    'read: loop {
        match from.read(&mut buf).await {
            Ok(0) | Err(_) => break,
            Ok(n) => pending.extend_from_slice(&buf[..n]),
        }
        while let Some((len, kind, stream)) = crate::cut::http2_header(&pending) {
            let frame: Vec<u8> = pending.drain(..len).collect();
            // 0x0 DATA, 0x1 HEADERS, 0x3 RST_STREAM, 0x9 CONTINUATION.
            let sent = if stream != 0 && matches!(kind, 0x0 | 0x1 | 0x3 | 0x9) {
                let due = Instant::now() + Duration::from_millis(delay.load(Ordering::SeqCst));
                last_due = last_due.max(due);
                queued.fetch_add(1, Ordering::SeqCst);
                let sent = tx_late.send((last_due, frame)).await.is_ok();
                if !sent {
                    queued.fetch_sub(1, Ordering::SeqCst);
                }
                sent
            } else {
                tx_now.send(frame).await.is_ok()
            };
            if !sent {
                break 'read;
            }
        }
    }
    drop((tx_now, tx_late));
    let _ = writer.await;
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Bytes go through in order, a round trip takes at least twice the
    /// one-way delay once it is set, and none before.
    #[tokio::test]
    async fn it_delays_both_ways_in_order() {
        let echo = TcpListener::bind("127.0.0.1:0").await.unwrap();
        let upstream = echo.local_addr().unwrap();
        tokio::spawn(async move {
            while let Ok((mut s, _)) = echo.accept().await {
                tokio::spawn(async move {
                    let mut b = [0u8; 1024];
                    while let Ok(n) = s.read(&mut b).await {
                        if n == 0 || s.write_all(&b[..n]).await.is_err() {
                            return;
                        }
                    }
                });
            }
        });
        let proxy = DelayProxy::start(upstream).await;
        let mut c = TcpStream::connect(proxy.addr()).await.unwrap();
        async fn round_trip(c: &mut TcpStream, msg: &[u8]) -> Duration {
            let started = Instant::now();
            c.write_all(msg).await.unwrap();
            let mut got = vec![0u8; msg.len()];
            c.read_exact(&mut got).await.unwrap();
            assert_eq!(got, msg);
            started.elapsed()
        }
        let fast = round_trip(&mut c, b"one").await;
        assert!(fast < Duration::from_millis(150), "{fast:?}");
        proxy.set_delay(Duration::from_millis(150));
        let slow = round_trip(&mut c, b"two, in order").await;
        assert!(slow >= Duration::from_millis(300), "{slow:?}");
    }
}
