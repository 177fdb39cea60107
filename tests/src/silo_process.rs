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
) -> Result<(std::sync::Arc<dyn rollcall::SystemStore>, rollcall::SiloHandle), Box<dyn std::error::Error>> {
    let options = rollcall::ClusterMembershipOptions::fast();
    let store = rollcall::connect_retrying(store_url, options.max_join_attempt_time).await?;
    let silo = rollcall::Silo::builder(store.clone(), cluster)
        .listen(listen)
        .options(options)
        .start()
        .await?;
    Ok((store, silo))
}

/// Runs `system` until SIGTERM, then shuts `silo` down gracefully (its leave
/// hooks first: the reminder service hands its shards over), drops `keep`
/// (the services the silo ran) and stops.
///
/// # Errors
/// The system's own error when it cannot run.
pub fn run_until_sigterm(
    system: actix::SystemRunner,
    silo: rollcall::SiloHandle,
    keep: Box<dyn Any>,
) -> std::io::Result<()> {
    system.block_on(async move {
        actix::spawn(async move {
            let Ok(mut term) = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
            else {
                return;
            };
            term.recv().await;
            if let Err(e) = silo.shutdown().await {
                eprintln!("graceful shutdown: {e}");
            }
            drop(keep);
            actix::System::current().stop();
        });
    });
    system.run()
}
