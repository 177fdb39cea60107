//! A harness for cluster scenario tests: silos on a simulated network and one
//! in-memory membership table, in virtual time.

use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use rollcall_core::transport::sim::SimNetwork;
use rollcall_core::{
    Clock, ClusterMembershipOptions, MembershipSnapshot, MembershipTable, OnDeclaredDead, Silo, SiloAddress,
    SiloError, SiloHandle, SiloStatus, SystemStore, Timestamp, TokioClock,
};
use rollcall_provider_memory::MemoryStore;

/// Runs `f` in a fresh actix `System` on a current-thread tokio runtime whose clock
/// is paused: timers fire as soon as every task is idle, so minutes of protocol run
/// in milliseconds.
pub fn run_virtual<F: Future>(f: impl FnOnce() -> F) -> F::Output {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
    let system = actix::System::with_tokio_rt(|| {
        tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .start_paused(true)
            .build()
            .expect("tokio runtime")
    });
    system.block_on(f())
}

/// Silos of one cluster on one [`SimNetwork`] and one [`MemoryStore`].
pub struct SimCluster {
    /// The seed of the network and of every silo's protocol RNG.
    pub seed: u64,
    /// The network.
    pub net: SimNetwork,
    /// The store (shared by every silo).
    pub store: MemoryStore,
    /// The cluster's table.
    pub table: Arc<dyn MembershipTable>,
    /// The options every silo gets.
    pub options: ClusterMembershipOptions,
    /// Virtual wall clock.
    pub clock: Arc<TokioClock>,
    /// Started silos, in start order.
    pub silos: Vec<SiloHandle>,
}

/// `10.0.0.<n>:11111`.
pub fn endpoint(n: u8) -> SocketAddr {
    SocketAddr::from(([10, 0, 0, n], 11111))
}

impl SimCluster {
    /// An empty cluster with these options (seed 7).
    pub fn new(options: ClusterMembershipOptions) -> Self {
        Self::with_seed(options, 7)
    }

    /// An empty cluster with these options whose network and silos draw every random
    /// choice from `seed`: a run is a function of the seed and the scenario.
    pub fn with_seed(options: ClusterMembershipOptions, seed: u64) -> Self {
        let store = MemoryStore::new();
        let table = store
            .membership_table("sim", options.protocol_mode())
            .expect("table");
        SimCluster {
            seed,
            net: SimNetwork::new(seed),
            store,
            table,
            options,
            clock: Arc::new(TokioClock::starting_at(Timestamp::from_millis(1_795_000_000_000))),
            silos: Vec::new(),
        }
    }

    /// Starts a silo at `endpoint(n)` with `generation` (joins; returns when Active).
    pub async fn start(&mut self, n: u8, generation: u64) -> Result<SiloHandle, SiloError> {
        let addr = endpoint(n);
        let handle = Silo::builder(Arc::new(self.store.clone()), "sim")
            .listen(addr)
            .generation(generation)
            .seed(
                self.seed
                    .wrapping_mul(1_000_003)
                    .wrapping_add(u64::from(n) << 32 | generation),
            )
            .transport(Arc::new(self.net.transport(addr)))
            // The paused tokio clock is this thread's: the silo stays on it.
            .own_thread(false)
            .options(self.options.clone())
            .clock(self.clock.clone())
            .host_name(format!("host-{n}"))
            .on_declared_dead(OnDeclaredDead::StopSilo)
            .start()
            .await?;
        self.silos.push(handle.clone());
        Ok(handle)
    }

    /// Starts silos 1..=n one after another.
    pub async fn start_many(&mut self, n: u8) {
        for i in 1..=n {
            self.start(i, 1)
                .await
                .unwrap_or_else(|e| panic!("silo {i} failed to join: {e}"));
        }
    }

    /// The table as stored now.
    pub async fn table_snapshot(&self) -> MembershipSnapshot {
        self.table.read_all().await.expect("read_all")
    }

    /// Kills `self.silos[i]` abruptly and waits (at most `limit`, virtual) until every
    /// other started silo that is still running sees it Dead; returns its row as
    /// stored and how long detection took.
    ///
    /// # Panics
    /// If the survivors never agree.
    pub async fn kill_and_await_dead(
        &self,
        i: usize,
        limit: Duration,
    ) -> (rollcall_core::MembershipEntry, Duration) {
        let victim = self.silos[i].clone();
        victim.kill();
        let survivors: Vec<SiloHandle> = self
            .silos
            .iter()
            .filter(|s| s.address() != victim.address() && !s.is_stopped())
            .cloned()
            .collect();
        let took = wait_for(limit, || all_see_dead(&survivors, &victim.address()))
            .await
            .unwrap_or_else(|| panic!("survivors never saw {} Dead", victim.address()));
        let row = self
            .table_snapshot()
            .await
            .entry(&victim.address())
            .cloned()
            .expect("victim row");
        (row, took)
    }

    /// Now, on the virtual wall clock.
    pub fn now(&self) -> Timestamp {
        self.clock.now()
    }
}

/// Polls `cond` every 50 ms (virtual) until it holds or `limit` passes; returns the
/// time it took, or `None`.
pub async fn wait_for(limit: Duration, mut cond: impl FnMut() -> bool) -> Option<Duration> {
    let start = tokio::time::Instant::now();
    loop {
        if cond() {
            return Some(start.elapsed());
        }
        if start.elapsed() > limit {
            return None;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
}

/// Whether every silo in `observers` sees `silo` as Dead in its snapshot.
pub fn all_see_dead(observers: &[SiloHandle], silo: &SiloAddress) -> bool {
    observers
        .iter()
        .all(|o| o.snapshot().status_of(silo) == Some(SiloStatus::Dead))
}
