//! A TCP proxy that adds latency: every chunk of bytes, either way, is
//! forwarded a set time after it arrived, in order, so a client behind it
//! sees its store as far away (a round trip twice the one-way delay) without
//! losing throughput. The delay can be changed while connections are open
//! (what `tc netem delay` does to one host's traffic, without root).

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::mpsc;
use tokio::time::Instant;

/// Chunks in flight one way on one connection before the reader waits (a
/// bound, so a stalled writer cannot grow memory without limit).
const IN_FLIGHT: usize = 4096;

/// A proxy on a loopback port in front of one server, adding a one-way delay
/// ([`set_delay`](DelayProxy::set_delay)) to every byte it forwards.
#[derive(Debug)]
pub struct DelayProxy {
    addr: SocketAddr,
    one_way_ms: Arc<AtomicU64>,
    task: tokio::task::JoinHandle<()>,
}

impl DelayProxy {
    /// A proxy on a free loopback port in front of `upstream`, adding no
    /// delay until [`set_delay`](DelayProxy::set_delay).
    ///
    /// # Panics
    /// If no loopback port can be bound (a test fixture).
    pub async fn start(upstream: SocketAddr) -> DelayProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let one_way_ms = Arc::new(AtomicU64::new(0));
        let delay = one_way_ms.clone();
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let _ = client.set_nodelay(true);
                let _ = server.set_nodelay(true);
                let (cr, cw) = client.into_split();
                let (sr, sw) = server.into_split();
                tokio::spawn(one_way(cr, sw, delay.clone()));
                tokio::spawn(one_way(sr, cw, delay.clone()));
            }
        });
        DelayProxy {
            addr,
            one_way_ms,
            task,
        }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
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
) {
    let (tx, mut rx) = mpsc::channel::<(Instant, Vec<u8>)>(IN_FLIGHT);
    let writer = tokio::spawn(async move {
        while let Some((due, chunk)) = rx.recv().await {
            tokio::time::sleep_until(due).await;
            if to.write_all(&chunk).await.is_err() {
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
                if tx.send((due, buf[..n].to_vec())).await.is_err() {
                    break;
                }
            }
        }
    }
    drop(tx);
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
