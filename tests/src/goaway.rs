//! A TCP proxy in front of an HTTP/2 server that can make the server go away
//! gracefully, as etcd does when it stops or sheds a connection: on
//! [`go_away`](GoAwayProxy::go_away) each open connection gets a
//! `GOAWAY(NO_ERROR)` naming the last stream the server was sent; streams the
//! client opens above it are dropped on their way (the server never sees
//! them, RFC 9113 section 6.8: they "were not or will not be processed"),
//! the ones at or below it are answered as usual, and the connection closes
//! `drain` later.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::watch;

/// The client connection preface (RFC 9113 section 3.4).
const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

/// No GOAWAY sent yet on a connection.
const OPEN: u32 = u32::MAX;

/// A proxy on a loopback port in front of one HTTP/2 server (see the module
/// docs).
#[derive(Debug)]
pub struct GoAwayProxy {
    addr: SocketAddr,
    go_away: watch::Sender<u64>,
    dropped: Arc<AtomicUsize>,
    connections: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl GoAwayProxy {
    /// A proxy on a free loopback port in front of `upstream`; a connection
    /// told to go away closes `drain` after its GOAWAY.
    ///
    /// # Panics
    /// If no loopback port can be bound (a test fixture).
    pub async fn start(upstream: SocketAddr, drain: Duration) -> GoAwayProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind the proxy");
        let addr = listener.local_addr().expect("proxy address");
        let (go_away, _) = watch::channel(0u64);
        let dropped = Arc::new(AtomicUsize::new(0));
        let connections = Arc::new(AtomicUsize::new(0));
        let (tx, d, n) = (go_away.clone(), dropped.clone(), connections.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                n.fetch_add(1, Ordering::SeqCst);
                let mut told = tx.subscribe();
                told.mark_unchanged();
                tokio::spawn(relay(client, server, told, drain, d.clone()));
            }
        });
        GoAwayProxy {
            addr,
            go_away,
            dropped,
            connections,
            task,
        }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Every open connection goes away now (see the module docs).
    pub fn go_away(&self) {
        self.go_away.send_modify(|n| *n += 1);
    }

    /// Frames of streams above a GOAWAY's last stream, dropped so far.
    pub fn dropped(&self) -> usize {
        self.dropped.load(Ordering::SeqCst)
    }

    /// Connections accepted so far.
    pub fn connections(&self) -> usize {
        self.connections.load(Ordering::SeqCst)
    }
}

impl Drop for GoAwayProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// A GOAWAY frame: last stream `last`, error code NO_ERROR (RFC 9113 section 6.8).
fn go_away_frame(last: u32) -> Vec<u8> {
    let mut f = vec![0, 0, 8, 0x7, 0, 0, 0, 0, 0];
    f.extend_from_slice(&(last & 0x7fff_ffff).to_be_bytes());
    f.extend_from_slice(&0u32.to_be_bytes());
    f
}

async fn relay(
    client: TcpStream,
    server: TcpStream,
    mut told: watch::Receiver<u64>,
    drain: Duration,
    dropped: Arc<AtomicUsize>,
) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    // The highest stream the client opened that went on to the server, and
    // the last stream a GOAWAY named (OPEN before one): one lock, so that a
    // stream is either counted before the GOAWAY names its last or dropped.
    let streams = Mutex::new((0u32, OPEN));
    let up = async {
        let mut buf = vec![0u8; 64 * 1024];
        let mut pending: Vec<u8> = Vec::new();
        let mut preface = true;
        loop {
            match cr.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => pending.extend_from_slice(&buf[..n]),
            }
            if preface {
                if pending.len() < PREFACE.len() {
                    continue;
                }
                let rest = pending.split_off(PREFACE.len());
                if sw.write_all(&pending).await.is_err() {
                    return;
                }
                pending = rest;
                preface = false;
            }
            while let Some((len, kind, stream)) = crate::cut::http2_header(&pending) {
                let frame: Vec<u8> = pending.drain(..len).collect();
                let above = {
                    let mut s = streams.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                    if kind == 0x1 && stream <= s.1 {
                        s.0 = s.0.max(stream);
                    }
                    stream != 0 && stream > s.1
                };
                if above {
                    dropped.fetch_add(1, Ordering::SeqCst);
                    continue;
                }
                if sw.write_all(&frame).await.is_err() {
                    return;
                }
            }
        }
    };
    let down = async {
        let mut buf = vec![0u8; 64 * 1024];
        let mut pending: Vec<u8> = Vec::new();
        let mut closing: Option<tokio::time::Instant> = None;
        loop {
            let until = closing.unwrap_or_else(|| tokio::time::Instant::now() + Duration::from_secs(3600));
            tokio::select! {
                r = sr.read(&mut buf) => match r {
                    Ok(0) | Err(_) => return,
                    Ok(n) => pending.extend_from_slice(&buf[..n]),
                },
                changed = told.changed(), if closing.is_none() => {
                    if changed.is_err() {
                        continue;
                    }
                    // Whole frames already read go first: the GOAWAY goes
                    // between two frames.
                    while let Some((len, _, _)) = crate::cut::http2_header(&pending) {
                        let frame: Vec<u8> = pending.drain(..len).collect();
                        if cw.write_all(&frame).await.is_err() {
                            return;
                        }
                    }
                    let last = {
                        let mut s = streams.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
                        s.1 = s.0;
                        s.0
                    };
                    if cw.write_all(&go_away_frame(last)).await.is_err() {
                        return;
                    }
                    closing = Some(tokio::time::Instant::now() + drain);
                    continue;
                }
                () = tokio::time::sleep_until(until), if closing.is_some() => return,
            }
            while let Some((len, _, _)) = crate::cut::http2_header(&pending) {
                let frame: Vec<u8> = pending.drain(..len).collect();
                if cw.write_all(&frame).await.is_err() {
                    return;
                }
            }
        }
    };
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}
