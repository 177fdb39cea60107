//! A proxy in front of an HTTP/1.1 server that holds back the requests of one
//! DynamoDB operation (its `X-Amz-Target` header, say `GetItem`) by a delay
//! while armed, and passes every other byte at once: a read that answers
//! late while the writes beside it land (issue 72, item 6).
//!
//! Requests on one connection are sequential in HTTP/1.1 (the SDK waits for
//! each answer), so holding a request back holds back its answer, and the
//! answers can be copied back as they come.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// The largest request head read (bytes): anything longer ends the connection.
const MAX_HEAD: usize = 64 * 1024;

/// The proxy; it stops when dropped.
#[derive(Debug)]
pub struct TargetDelayProxy {
    addr: SocketAddr,
    delay_ms: Arc<AtomicU64>,
    held: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl TargetDelayProxy {
    /// Listens on a free loopback port and forwards to `upstream`, holding
    /// back the requests whose `X-Amz-Target` ends with `.{operation}` by the
    /// delay ([`set_delay`](Self::set_delay), none at first).
    ///
    /// # Panics
    /// When no loopback port can be bound.
    pub async fn start(upstream: SocketAddr, operation: &str) -> TargetDelayProxy {
        let listener = TcpListener::bind("127.0.0.1:0").await.expect("bind a proxy port");
        let addr = listener.local_addr().expect("the proxy's address");
        let delay_ms = Arc::new(AtomicU64::new(0));
        let held = Arc::new(AtomicUsize::new(0));
        let suffix = format!(".{}", operation.to_ascii_lowercase());
        let (d, h) = (delay_ms.clone(), held.clone());
        let task = tokio::spawn(async move {
            while let Ok((client, _)) = listener.accept().await {
                let Ok(server) = TcpStream::connect(upstream).await else {
                    continue;
                };
                let (d, h, suffix) = (d.clone(), h.clone(), suffix.clone());
                tokio::spawn(async move {
                    let (client_read, client_write) = client.into_split();
                    let (server_read, server_write) = server.into_split();
                    let answers = tokio::spawn(copy(server_read, client_write));
                    requests(client_read, server_write, &suffix, &d, &h).await;
                    answers.abort();
                });
            }
        });
        TargetDelayProxy {
            addr,
            delay_ms,
            held,
            task,
        }
    }

    /// Where clients connect.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// From now on, requests of the operation wait `delay` before they go on
    /// (zero: none).
    pub fn set_delay(&self, delay: Duration) {
        self.delay_ms.store(
            u64::try_from(delay.as_millis()).unwrap_or(u64::MAX),
            Ordering::SeqCst,
        );
    }

    /// How many requests were held back so far.
    pub fn held(&self) -> usize {
        self.held.load(Ordering::SeqCst)
    }
}

impl Drop for TargetDelayProxy {
    fn drop(&mut self) {
        self.task.abort();
    }
}

async fn copy(mut from: tokio::net::tcp::OwnedReadHalf, mut to: tokio::net::tcp::OwnedWriteHalf) {
    let _ = tokio::io::copy(&mut from, &mut to).await;
    let _ = to.shutdown().await;
}

/// Forwards each request whole (head, then a `Content-Length` body), holding
/// back those whose target ends with `suffix` while a delay is set.
async fn requests(
    mut from: tokio::net::tcp::OwnedReadHalf,
    mut to: tokio::net::tcp::OwnedWriteHalf,
    suffix: &str,
    delay_ms: &AtomicU64,
    held: &AtomicUsize,
) {
    let mut buf: Vec<u8> = Vec::new();
    let mut chunk = vec![0u8; 16 * 1024];
    loop {
        // The head: up to the blank line.
        let head_end = loop {
            if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
                break i + 4;
            }
            if buf.len() > MAX_HEAD {
                return;
            }
            match from.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        };
        let head = String::from_utf8_lossy(&buf[..head_end]).to_ascii_lowercase();
        let header = |name: &str| {
            head.lines()
                .find_map(|l| l.strip_prefix(name).map(|v| v.trim().to_owned()))
        };
        let body_len: usize = header("content-length:")
            .and_then(|v| v.parse().ok())
            .unwrap_or(0);
        let hold = header("x-amz-target:").is_some_and(|t| t.ends_with(suffix));
        while buf.len() < head_end + body_len {
            match from.read(&mut chunk).await {
                Ok(0) | Err(_) => return,
                Ok(n) => buf.extend_from_slice(&chunk[..n]),
            }
        }
        let rest = buf.split_off(head_end + body_len);
        let delay = delay_ms.load(Ordering::SeqCst);
        if hold && delay > 0 {
            held.fetch_add(1, Ordering::SeqCst);
            tokio::time::sleep(Duration::from_millis(delay)).await;
        }
        if to.write_all(&buf).await.is_err() {
            return;
        }
        buf = rest;
    }
}
