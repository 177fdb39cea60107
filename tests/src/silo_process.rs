//! What the silo processes of the multi-process tests share (`churn-silo`,
//! `backlog-silo`): warnings to stderr, and a run that ends with a graceful
//! shutdown on SIGTERM.

use std::any::Any;

/// Logs at `warn` (or `RUST_LOG`) to stderr: a hold given up on, a release
/// never taken.
pub fn log_warnings() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn")),
        )
        .with_writer(std::io::stderr)
        .try_init();
}

/// Connects to `store_url` (retrying while the store is unreachable) and
/// starts a silo of `cluster` listening on `listen`, with the fast membership
/// profile: the store and the silo. Must run inside an actix `System`.
///
/// # Errors
/// The connection's or the join's error.
pub async fn start_silo(
    store_url: &str,
    cluster: &str,
    listen: std::net::SocketAddr,
    faults: Option<&Faults>,
) -> Result<(std::sync::Arc<dyn rollcall::SystemStore>, rollcall::SiloHandle), Box<dyn std::error::Error>> {
    start_silo_with(
        store_url,
        cluster,
        listen,
        faults,
        rollcall::OnDeclaredDead::default(),
    )
    .await
}

/// [`start_silo`] with what the silo does when it reads itself Dead.
///
/// # Errors
/// The connection's or the join's error.
pub async fn start_silo_with(
    store_url: &str,
    cluster: &str,
    listen: std::net::SocketAddr,
    faults: Option<&Faults>,
    on_declared_dead: rollcall::OnDeclaredDead,
) -> Result<(std::sync::Arc<dyn rollcall::SystemStore>, rollcall::SiloHandle), Box<dyn std::error::Error>> {
    let options = rollcall::ClusterMembershipOptions::fast();
    let store = rollcall::connect_retrying(store_url, options.max_join_attempt_time).await?;
    let mut builder = rollcall::Silo::builder(store.clone(), cluster)
        .listen(listen)
        .options(options)
        .on_declared_dead(on_declared_dead);
    if let Some(f) = faults {
        builder = builder
            .clock(std::sync::Arc::new(f.clock.clone()))
            .transport(std::sync::Arc::new(f.transport.clone()));
    }
    let silo = builder.start().await?;
    Ok((store, silo))
}

/// The faults a test silo process can be given while it runs: its clock set
/// ahead, its probes cut from every peer.
#[derive(Clone, Debug)]
pub struct Faults {
    /// The silo's (and its services') wall clock.
    pub clock: OffsetClock,
    /// The silo's probe transport (TCP underneath).
    pub transport: CuttableTransport,
}

impl Default for Faults {
    fn default() -> Self {
        Faults {
            clock: OffsetClock::default(),
            transport: CuttableTransport::new(std::sync::Arc::new(
                rollcall::transport::tcp::TcpTransport::new(),
            )),
        }
    }
}

/// The lines of this process's stdin, read on a thread of their own (64
/// waiting at most: the reader waits while they are full): the commands a
/// test silo takes.
pub fn stdin_lines() -> tokio::sync::mpsc::Receiver<String> {
    let (tx, rx) = tokio::sync::mpsc::channel::<String>(64);
    std::thread::spawn(move || {
        for line in std::io::stdin().lines() {
            let Ok(line) = line else { return };
            if tx.blocking_send(line).is_err() {
                return;
            }
        }
    });
    rx
}

/// Catches SIGTERM from now on: a SIGTERM that arrives before
/// [`run_until_sigterm`] runs waits in the returned stream instead of killing
/// the process. Call it inside the system, before the process prints `ready`
/// (a test may send SIGTERM right after it reads `ready`; with the handler
/// installed only once the system runs, a loaded machine saw the process
/// killed by the signal instead of leaving gracefully).
///
/// # Errors
/// When the signal handler cannot be installed.
pub fn catch_sigterm() -> std::io::Result<tokio::signal::unix::Signal> {
    tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
}

/// Runs `system` until `term` (from [`catch_sigterm`]) sees SIGTERM, then
/// shuts `silo` down gracefully (its leave hooks first: the reminder service
/// hands its shards over), drops `keep` (the services the silo ran) and
/// stops.
///
/// # Errors
/// The system's own error when it cannot run.
pub fn run_until_sigterm(
    system: actix::SystemRunner,
    term: tokio::signal::unix::Signal,
    silo: rollcall::SiloHandle,
    keep: Box<dyn Any>,
) -> std::io::Result<()> {
    run_until_sigterm_or(system, term, std::future::pending(), silo, keep)
}

/// [`run_until_sigterm`], but the graceful shutdown also starts when `stop`
/// completes: a process that stops itself at a point of its own work, which
/// a test watching from outside could miss under load. The signal is
/// waited for on the silo's own thread
/// ([`SiloHandle::shutdown_on_signals`](rollcall::SiloHandle::shutdown_on_signals)),
/// so the leave starts however busy the application's arbiter is; `term`
/// (installed early, so that a SIGTERM before the silo is up does not kill
/// the process) is the fallback if that cannot be installed.
///
/// # Errors
/// The system's own error when it cannot run.
pub fn run_until_sigterm_or(
    system: actix::SystemRunner,
    mut term: tokio::signal::unix::Signal,
    stop: impl std::future::Future<Output = ()> + 'static,
    silo: rollcall::SiloHandle,
    keep: Box<dyn Any>,
) -> std::io::Result<()> {
    system.block_on(async move {
        let on_signal = silo.shutdown_on_signals().await;
        actix::spawn(async move {
            let mut stop = std::pin::pin!(stop);
            let shut = match on_signal {
                Ok(done) => tokio::select! {
                    r = done => match r {
                        Ok(r) => r,
                        Err(_) => {
                            // The silo's thread ended with no signal (the
                            // silo read itself Dead): the process runs on
                            // until its SIGTERM or stop, as before.
                            tokio::select! {
                                _ = term.recv() => {}
                                () = &mut stop => {}
                            }
                            silo.shutdown().await
                        }
                    },
                    () = &mut stop => silo.shutdown().await,
                },
                Err(e) => {
                    eprintln!("signals on the silo's thread: {e}; waiting here");
                    tokio::select! {
                        _ = term.recv() => {}
                        () = &mut stop => {}
                    }
                    silo.shutdown().await
                }
            };
            if let Err(e) = shut {
                eprintln!("graceful shutdown: {e}");
            }
            drop(keep);
            actix::System::current().stop();
        });
    });
    system.run()
}

/// A wall clock that runs a settable offset ahead of (or behind) the system
/// clock: a VM resumed from a pause, an NTP step or a broken NTP set-up, in
/// one process. Its monotonic time is the system's (a step moves only the
/// wall clock, as on a real machine).
#[derive(Clone, Debug, Default)]
pub struct OffsetClock(std::sync::Arc<std::sync::atomic::AtomicI64>);

impl OffsetClock {
    /// From now on the clock reads the system time plus `ahead`.
    pub fn set_ahead(&self, ahead: std::time::Duration) {
        let ms = i64::try_from(ahead.as_millis()).unwrap_or(i64::MAX);
        self.0.store(ms, std::sync::atomic::Ordering::SeqCst);
    }

    /// From now on the clock reads the system time less `behind`.
    pub fn set_behind(&self, behind: std::time::Duration) {
        let ms = i64::try_from(behind.as_millis()).unwrap_or(i64::MAX);
        self.0.store(-ms, std::sync::atomic::Ordering::SeqCst);
    }
}

impl rollcall::Clock for OffsetClock {
    fn now(&self) -> rollcall::Timestamp {
        let offset = self.0.load(std::sync::atomic::Ordering::SeqCst);
        let now = rollcall::Timestamp::now().as_millis();
        rollcall::Timestamp::from_millis(now.saturating_add_signed(offset))
    }
}

/// A probe transport that can be cut from every peer for a while, both ways,
/// as a blackhole route does it (the store stays reachable): while cut, a
/// request waits out its timeout and fails, and a request arriving is never
/// answered.
#[derive(Clone, Debug)]
pub struct CuttableTransport {
    inner: std::sync::Arc<dyn rollcall::transport::Transport>,
    cut_until: std::sync::Arc<std::sync::Mutex<Option<tokio::time::Instant>>>,
}

impl CuttableTransport {
    /// Around `inner`, not cut.
    pub fn new(inner: std::sync::Arc<dyn rollcall::transport::Transport>) -> Self {
        CuttableTransport {
            inner,
            cut_until: std::sync::Arc::default(),
        }
    }

    /// Cuts every probe for `d` from now.
    pub fn cut_for(&self, d: std::time::Duration) {
        *self
            .cut_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(tokio::time::Instant::now() + d);
    }

    /// When the cut ends, if one is in force now.
    fn cut(&self) -> Option<tokio::time::Instant> {
        let until = *self
            .cut_until
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        until.filter(|u| *u > tokio::time::Instant::now())
    }
}

#[async_trait::async_trait]
impl rollcall::transport::Transport for CuttableTransport {
    async fn request(
        &self,
        to: std::net::SocketAddr,
        cluster: &str,
        request: rollcall::transport::ProbeRequest,
        timeout: std::time::Duration,
    ) -> Result<rollcall::transport::ProbeResponse, rollcall::transport::TransportError> {
        if self.cut().is_some() {
            tokio::time::sleep(timeout).await;
            return Err(rollcall::transport::TransportError::Timeout(timeout));
        }
        self.inner.request(to, cluster, request, timeout).await
    }

    async fn serve(
        &self,
        listen: std::net::SocketAddr,
        cluster: &str,
        handler: std::sync::Arc<dyn rollcall::transport::ProbeHandler>,
    ) -> Result<rollcall::transport::Listener, rollcall::transport::TransportError> {
        let cut = CutHandler {
            inner: handler,
            transport: self.clone(),
        };
        self.inner.serve(listen, cluster, std::sync::Arc::new(cut)).await
    }
}

/// The serving half of a [`CuttableTransport`].
struct CutHandler {
    inner: std::sync::Arc<dyn rollcall::transport::ProbeHandler>,
    transport: CuttableTransport,
}

#[async_trait::async_trait]
impl rollcall::transport::ProbeHandler for CutHandler {
    async fn handle(&self, request: rollcall::transport::ProbeRequest) -> rollcall::transport::ProbeResponse {
        if let Some(until) = self.transport.cut() {
            // Answered only after the cut, when the prober gave up long ago.
            tokio::time::sleep_until(until).await;
        }
        self.inner.handle(request).await
    }
}

/// The actor ids of shard 0 of `shards` (the reminder service's shard of
/// each, [`rollcall_core::actor_shard`]), `count` of them, `id_bytes` long
/// each: `cart/<i>-xx...` for the `i` whose id maps there, in order of `i`.
pub fn shard_zero_actors(count: usize, id_bytes: usize, shards: u32) -> Vec<String> {
    let mut out = Vec::with_capacity(count);
    let mut i = 0u64;
    while out.len() < count {
        let head = format!("cart/{i}-");
        let id = format!("{head}{}", "x".repeat(id_bytes.saturating_sub(head.len())));
        if rollcall_core::actor_shard(&id, shards) == 0 {
            out.push(id);
        }
        i += 1;
    }
    out
}
