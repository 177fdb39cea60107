//! Prometheus exposition of rollcall's metrics (feature `prometheus`), with
//! [`metrics-exporter-prometheus`](https://docs.rs/metrics-exporter-prometheus).
//!
//! rollcall records its metrics through the `metrics` facade whether or not this
//! feature is on (names and labels: [`telemetry`](crate::telemetry)); [`serve`]
//! installs the process-wide recorder and answers scrapes over HTTP. An
//! application that already installs a `metrics` recorder of its own does not need
//! this module: rollcall's series show up there.

use std::net::SocketAddr;

pub use metrics_exporter_prometheus::PrometheusHandle;
use metrics_exporter_prometheus::{Matcher, PrometheusBuilder};

use crate::{Error, Result};

/// The histogram buckets of every `*_seconds` series, in seconds: from 0.5 ms (a
/// loopback probe) to 10 s (beyond any default timeout).
pub const SECONDS_BUCKETS: [f64; 14] = [
    0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0,
];

/// Installs the Prometheus recorder as the process's `metrics` recorder and serves
/// the text exposition format over HTTP on `listen` (every path answers; scrape
/// `http://<listen>/metrics`) from a thread of its own, so a busy actor system never
/// delays a scrape. `*_seconds` series are histograms with [`SECONDS_BUCKETS`].
/// Returns a handle that renders the same text in-process. Answers once the
/// listener is bound (at most a few milliseconds).
///
/// # Errors
/// - [`Error::InvalidConfig`] (field `metrics_listen`) when `listen` cannot be bound;
/// - [`Error::InvalidConfig`] (field `metrics_recorder`) when a `metrics` recorder is
///   already installed in this process (one per process: call `serve` once).
pub fn serve(listen: SocketAddr) -> Result<PrometheusHandle> {
    let builder = PrometheusBuilder::new()
        .with_http_listener(listen)
        .set_buckets_for_metric(Matcher::Suffix("_seconds".into()), &SECONDS_BUCKETS)
        .map_err(|e| Error::invalid_config("metrics_buckets", e.to_string()))?;
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::Builder::new()
        .name("rollcall-prometheus".into())
        .spawn(move || {
            let runtime = match tokio::runtime::Builder::new_current_thread().enable_all().build() {
                Ok(rt) => rt,
                Err(e) => {
                    let _ = tx.send(Err(format!("no runtime for the exporter: {e}")));
                    return;
                }
            };
            let built = runtime.block_on(async { builder.build() });
            match built {
                Ok((recorder, exporter)) => {
                    let _ = tx.send(Ok(recorder));
                    let _ = runtime.block_on(exporter);
                }
                Err(e) => {
                    let _ = tx.send(Err(e.to_string()));
                }
            }
        })
        .map_err(|e| Error::backend(format!("cannot start the metrics thread: {e}")))?;
    let recorder = rx
        .recv()
        .map_err(|_| Error::backend("the metrics thread ended before it was ready"))?
        .map_err(|e| Error::invalid_config("metrics_listen", format!("{listen}: {e}")))?;
    let handle = recorder.handle();
    ::metrics::set_global_recorder(recorder).map_err(|_| {
        Error::invalid_config(
            "metrics_recorder",
            "a metrics recorder is already installed in this process",
        )
    })?;
    Ok(handle)
}
