//! `rollcall silo`: one silo process.

use std::net::SocketAddr;

use rollcall::{ClusterMembershipOptions, OnDeclaredDead, Silo, SiloStatus};

/// Arguments of `rollcall silo`.
#[derive(Debug, clap::Args)]
pub(crate) struct SiloArgs {
    /// Store URL.
    #[arg(long)]
    store: String,
    /// Cluster id.
    #[arg(long, default_value = "rollcall")]
    cluster: String,
    /// Probe endpoint to listen on.
    #[arg(long, default_value = "127.0.0.1:11111")]
    listen: SocketAddr,
    /// Endpoint other silos use (needed when listening on 0.0.0.0).
    #[arg(long)]
    advertise: Option<SocketAddr>,
    /// Options as JSON (e.g. '{"probe_timeout":"2s"}'); unknown fields are errors.
    #[arg(long)]
    options: Option<String>,
    /// Short probe timeouts (500 ms), as in `demo --fast`.
    #[arg(long)]
    fast: bool,
    /// File holding the cluster's shared secret (at least 16 bytes; surrounding
    /// whitespace is trimmed). Probe frames are then sealed with HMAC-SHA256 and
    /// frames without a valid seal are dropped; every silo needs the same file.
    #[arg(long)]
    shared_secret_file: Option<std::path::PathBuf>,
    /// How often the silo writes its row of the metrics table (`rollcall metrics`
    /// shows them); `0s` writes none.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    metrics_period: std::time::Duration,
    /// How often the silo appends its figures to the cluster's statistics store
    /// (`rollcall statistics` shows them, with 1/10/60-minute rollups); `0s` appends
    /// none. Needs `--metrics-period` too; etcd keeps no statistics.
    #[arg(long, default_value = "30s", value_parser = humantime::parse_duration)]
    statistics_period: std::time::Duration,
    /// Serve Prometheus metrics (`rollcall_*` series) at `http://ADDR/metrics`.
    #[arg(long, value_name = "ADDR")]
    metrics_listen: Option<std::net::SocketAddr>,
}

pub(crate) fn run(args: SiloArgs) -> anyhow::Result<()> {
    let options: ClusterMembershipOptions = match (&args.options, args.fast) {
        (Some(json), _) => serde_json_options(json)?,
        (None, true) => ClusterMembershipOptions::fast(),
        (None, false) => ClusterMembershipOptions::default(),
    };
    let secret = crate::read_secret(args.shared_secret_file.as_deref())?;
    if let Some(addr) = args.metrics_listen {
        rollcall::prometheus::serve(addr)?;
        println!("Prometheus metrics at http://{addr}/metrics");
    }
    let system = actix::System::new();
    let (mut leave, silo, publisher) = system.block_on(async {
        // Caught from here on: a SIGTERM sent as soon as the silo says it is
        // Active (or while the loop below handles a table change) waits for
        // the loop instead of killing the process or being missed.
        let leave = LeaveSignals::catch()?;
        // A store that is not up yet (it often starts with the cluster) is waited
        // for, as the join itself is: up to max_join_attempt_time.
        let store = rollcall::connect_retrying(&args.store, options.max_join_attempt_time).await?;
        let mut builder = Silo::builder(store.clone(), args.cluster.clone())
            .listen(args.listen)
            .options(options.clone())
            .on_declared_dead(OnDeclaredDead::StopSystem { exit_code: 70 });
        if let Some(a) = args.advertise {
            builder = builder.advertise(a);
        }
        if let Some(secret) = secret {
            builder = builder.shared_secret(secret);
        }
        let silo = builder.start().await?;
        let publisher = if args.metrics_period.is_zero() {
            None
        } else {
            match metrics_table(&*store, &args.cluster).await {
                Ok(table) => {
                    let mut publisher = rollcall::metrics_table::MetricsPublisher::builder(&silo, table)
                        .period(args.metrics_period)
                        .store(store.clone());
                    if !args.statistics_period.is_zero() {
                        let options = rollcall::StatisticsOptions {
                            statistics_period: args.statistics_period,
                            ..Default::default()
                        };
                        match store.statistics_store(&args.cluster, &options) {
                            Ok(stats) => publisher = publisher.statistics(stats, args.statistics_period),
                            Err(e) => eprintln!("no statistics: {e}"),
                        }
                    }
                    Some(publisher.start())
                }
                Err(e) => {
                    eprintln!("no metrics row: {e}");
                    None
                }
            }
        };
        anyhow::Ok((leave, silo, publisher))
    })?;
    println!("silo {} is Active in cluster {}", silo.address(), args.cluster);
    let handle = silo.clone();
    system.block_on(async move {
        actix::spawn(async move {
            let mut status = handle.subscribe_status();
            let mut snapshots = handle.subscribe();
            loop {
                tokio::select! {
                    signal = leave.recv() => {
                        println!("{signal}: shutting down gracefully");
                        if let Err(e) = handle.shutdown().await {
                            eprintln!("graceful shutdown failed: {e}");
                        }
                        actix::System::current().stop();
                        return;
                    }
                    r = snapshots.changed() => {
                        if r.is_err() { return; }
                        let s = snapshots.borrow_and_update().clone();
                        println!("table version {}: {} active", s.version.version, s.active().count());
                    }
                    r = status.changed() => {
                        if r.is_err() { return; }
                        if *status.borrow_and_update() == SiloStatus::Dead {
                            eprintln!("this silo was declared Dead; exiting");
                        }
                    }
                }
            }
        });
    });
    let code = system.run_with_code()?;
    drop(publisher);
    std::process::exit(code);
}

/// The cluster's metrics table, initialised within 5 s.
async fn metrics_table(
    store: &dyn rollcall::SystemStore,
    cluster: &str,
) -> anyhow::Result<std::sync::Arc<dyn rollcall::MetricsTable>> {
    let table = store.metrics_table(cluster)?;
    tokio::time::timeout(std::time::Duration::from_secs(5), table.init())
        .await
        .map_err(|_| anyhow::anyhow!("the metrics table did not initialise within 5 s"))??;
    Ok(table)
}

/// Ctrl-C (SIGINT) and, on Unix, SIGTERM (what Kubernetes and systemd send),
/// caught once for the silo's life: a signal that arrives while nobody
/// waits on [`LeaveSignals::recv`] is kept for the next call.
struct LeaveSignals {
    interrupt: tokio::signal::unix::Signal,
    terminate: tokio::signal::unix::Signal,
}

impl LeaveSignals {
    /// Installs the handlers (inside the runtime).
    fn catch() -> std::io::Result<Self> {
        use tokio::signal::unix::{signal, SignalKind};
        Ok(LeaveSignals {
            interrupt: signal(SignalKind::interrupt())?,
            terminate: signal(SignalKind::terminate())?,
        })
    }

    /// The next signal, named.
    async fn recv(&mut self) -> &'static str {
        tokio::select! {
            _ = self.interrupt.recv() => "Ctrl-C",
            _ = self.terminate.recv() => "SIGTERM",
        }
    }
}

fn serde_json_options(json: &str) -> anyhow::Result<ClusterMembershipOptions> {
    let o: ClusterMembershipOptions =
        serde_json::from_str(json).map_err(|e| anyhow::anyhow!("--options: {e}"))?;
    o.validate()?;
    Ok(o)
}
