//! A TCP proxy that cuts a connection between a request and its reply: the
//! server has received the request and answered it (so it was applied), and
//! the client never sees the answer, only a closed connection. The real fault
//! behind an ambiguous commit ("a connection cut after the request is sent").

use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

/// A proxy in front of one server: `addr` forwards to `upstream` until
/// [`arm`](CutProxy::arm)ed; then the next bytes any server sends back are
/// dropped with both sides of their connection.
#[derive(Debug)]
pub struct CutProxy {
    addr: SocketAddr,
    armed: Arc<AtomicBool>,
    cuts: Arc<AtomicUsize>,
    task: tokio::task::JoinHandle<()>,
}

impl CutProxy {
    /// A proxy on a free loopback port in front of `upstream`.
    ///
    /// # Panics
    /// If no loopback port can be bound (a test fixture).
    pub async fn start(upstream: SocketAddr) -> CutProxy {
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
                tokio::spawn(relay(client, server, a.clone(), c.clone()));
            }
        });
        CutProxy {
            addr,
            armed,
            cuts,
            task,
        }
    }

    /// The address clients connect to.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Cuts the connection that next carries bytes back from the server,
    /// dropping those bytes.
    pub fn arm(&self) {
        self.armed.store(true, Ordering::SeqCst);
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

async fn relay(client: TcpStream, server: TcpStream, armed: Arc<AtomicBool>, cuts: Arc<AtomicUsize>) {
    let _ = client.set_nodelay(true);
    let _ = server.set_nodelay(true);
    let (mut cr, mut cw) = client.into_split();
    let (mut sr, mut sw) = server.into_split();
    let up = async {
        let _ = tokio::io::copy(&mut cr, &mut sw).await;
    };
    let down = async {
        let mut buf = vec![0u8; 64 * 1024];
        loop {
            match sr.read(&mut buf).await {
                Ok(0) | Err(_) => return,
                Ok(n) => {
                    if armed.swap(false, Ordering::SeqCst) {
                        cuts.fetch_add(1, Ordering::SeqCst);
                        return; // the reply is dropped, and the connection with it
                    }
                    if cw.write_all(&buf[..n]).await.is_err() {
                        return;
                    }
                }
            }
        }
    };
    // Either side ending ends both: dropping the halves closes the sockets.
    tokio::select! {
        () = up => {}
        () = down => {}
    }
}
