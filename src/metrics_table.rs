//! Publishing a silo's row of the metrics table (the Orleans silo-metrics table):
//! a [`MetricsPublisher`] writes the silo's [`MetricsRow`] every
//! `metrics_publish_period` (30 s by default, Orleans' `MetricsTableWriteInterval`),
//! with the process's CPU and resident memory ([`ProcessSampler`], from `sysinfo`),
//! the silo's membership counters and, when given, its reminder service's counters.
//!
//! ```no_run
//! # async fn run(silo: rollcall::SiloHandle, store: std::sync::Arc<dyn rollcall::SystemStore>) -> rollcall::Result<()> {
//! let table = store.metrics_table(silo.cluster_id())?;
//! table.init().await?;
//! let publisher = rollcall::metrics_table::MetricsPublisher::builder(&silo, table).start();
//! // ... the row is rewritten every 30 s until the silo stops or `publisher` is dropped.
//! # Ok(()) }
//! ```

use std::sync::Arc;
use std::time::Duration;

pub use rollcall_core::metrics_table::*;

use rollcall_core::{SiloHandle, SiloStatus, StatPoint, StatisticsStore, Timestamp};
use rollcall_reminders::Reminders;
use sysinfo::{Pid, ProcessRefreshKind, ProcessesToUpdate, System};

/// Orleans' default interval between two writes of a silo's metrics row.
pub const DEFAULT_METRICS_PUBLISH_PERIOD: Duration = Duration::from_secs(30);

/// Bound on one write of the row (a slow store delays the next write, never
/// queues writes).
pub const PUBLISH_TIMEOUT: Duration = Duration::from_secs(5);

/// How often a publisher that appends statistics also removes what is past the
/// store's retention ([`StatisticsStore::expire`]): after its first append, then at
/// most once per this period. Every silo does it; expiry is idempotent.
pub const EXPIRE_EVERY: Duration = Duration::from_secs(3600);

/// CPU and resident memory of this process, as `sysinfo` reports them.
#[derive(Debug)]
pub struct ProcessSampler {
    system: System,
    pid: Option<Pid>,
}

impl Default for ProcessSampler {
    fn default() -> Self {
        Self::new()
    }
}

impl ProcessSampler {
    /// A sampler of the current process. The first [`sample`](Self::sample) reports
    /// 0% CPU: CPU use is measured between two samples.
    pub fn new() -> Self {
        let mut sampler = ProcessSampler {
            system: System::new(),
            pid: sysinfo::get_current_pid().ok(),
        };
        let _ = sampler.sample();
        sampler
    }

    /// `(cpu_percent, resident_bytes)`: CPU use since the previous sample in % of
    /// one core, and the resident set size in bytes. `(0, 0)` where the platform
    /// does not tell.
    pub fn sample(&mut self) -> (f32, u64) {
        let Some(pid) = self.pid else {
            return (0.0, 0);
        };
        self.system.refresh_processes_specifics(
            ProcessesToUpdate::Some(&[pid]),
            false,
            ProcessRefreshKind::nothing().with_cpu().with_memory(),
        );
        self.system
            .process(pid)
            .map_or((0.0, 0), |p| (p.cpu_usage(), p.memory()))
    }
}

/// Builds a [`MetricsPublisher`].
#[derive(Debug)]
pub struct MetricsPublisherBuilder {
    silo: SiloHandle,
    table: Arc<dyn MetricsTable>,
    period: Duration,
    reminders: Option<Reminders>,
    name: String,
    host_name: String,
    statistics: Option<(Arc<dyn StatisticsStore>, Duration)>,
    store: Option<Arc<dyn crate::SystemStore>>,
}

impl MetricsPublisherBuilder {
    /// Also appends the row's figures to `store` every `period` (the
    /// `statistics_period`, at least 100 ms) as statistics points named
    /// `cpu_percent`, `memory_bytes`, `probe_rtt_p50_ms`, `probe_rtt_p99_ms`,
    /// `suspicions_sent`, `votes_written`, `table_reads`, `table_writes`,
    /// `table_conflicts`, `reminders_owned`, `ticks_delivered` and `ticks_late`
    /// (counters as totals, `is_delta = false`), and `tick_lateness_p50_ms` and
    /// `tick_lateness_p99_ms` (of the ticks delivered since the previous
    /// append; absent when none was), under the silo's address. After
    /// the first append and then every [`EXPIRE_EVERY`], it also expires what is
    /// past the store's retention (bounded by [`PUBLISH_TIMEOUT`] as well).
    pub fn statistics(mut self, store: Arc<dyn StatisticsStore>, period: Duration) -> Self {
        self.statistics = Some((store, period.max(Duration::from_millis(100))));
        self
    }

    /// How often the row is written (default [`DEFAULT_METRICS_PUBLISH_PERIOD`]);
    /// at least 100 ms.
    pub fn period(mut self, period: Duration) -> Self {
        self.period = period.max(Duration::from_millis(100));
        self
    }

    /// Adds the reminder service's figures (owned reminders, ticks delivered and
    /// late).
    pub fn reminders(mut self, reminders: &Reminders) -> Self {
        self.reminders = Some(reminders.clone());
        self
    }

    /// Adds what `store`'s client saw of its connections
    /// ([`SystemStore::connection`](crate::SystemStore::connection)), for a
    /// provider that keeps such figures (`rollcall status` prints them).
    pub fn store(mut self, store: Arc<dyn crate::SystemStore>) -> Self {
        self.store = Some(store);
        self
    }

    /// The silo name in the row (default: the silo's, as in its membership row).
    pub fn name(mut self, name: impl Into<String>) -> Self {
        self.name = name.into();
        self
    }

    /// The host name in the row (default: the silo's, as in its membership row).
    pub fn host_name(mut self, host_name: impl Into<String>) -> Self {
        self.host_name = host_name.into();
        self
    }

    /// Writes the first row at once, then one every period, on a tokio task, until
    /// the silo stops (its row is then left with its last figures) or the publisher
    /// is dropped. A failed write is logged and retried at the next period.
    pub fn start(self) -> MetricsPublisher {
        let mut state = Publishing {
            sampler: ProcessSampler::new(),
            silo: self.silo,
            reminders: self.reminders,
            name: self.name,
            host_name: self.host_name,
            store: self.store,
        };
        let (table, period) = (self.table, self.period);
        let (statistics, statistics_period) = match self.statistics {
            Some((s, p)) => (Some(s), p),
            None => (None, Duration::from_secs(3600)),
        };
        let task = tokio::spawn(async move {
            let mut ticks = tokio::time::interval(period);
            ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            let mut last_expire: Option<tokio::time::Instant> = None;
            let mut stat_ticks = tokio::time::interval(statistics_period);
            stat_ticks.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            loop {
                let for_metrics = tokio::select! {
                    _ = ticks.tick() => true,
                    _ = stat_ticks.tick(), if statistics.is_some() => false,
                };
                if state.silo.status() == SiloStatus::Dead || state.silo.is_stopped() {
                    return;
                }
                // The lateness window goes to the statistics when they are kept,
                // else to the metrics row (one reader: see `take_lateness`).
                let row = state.row(Timestamp::now(), !for_metrics || statistics.is_none());
                let written = if for_metrics {
                    tokio::time::timeout(PUBLISH_TIMEOUT, table.upsert(&row)).await
                } else if let Some(store) = &statistics {
                    let points = statistic_points(&row);
                    let appended = tokio::time::timeout(PUBLISH_TIMEOUT, store.append(&points))
                        .await
                        .map(|r| r.map(|_| ()));
                    if last_expire.is_none_or(|t| t.elapsed() >= EXPIRE_EVERY) {
                        last_expire = Some(tokio::time::Instant::now());
                        match tokio::time::timeout(PUBLISH_TIMEOUT, store.expire(row.time)).await {
                            Ok(Ok(n)) if n > 0 => tracing::debug!(removed = n, "statistics expired"),
                            Ok(Ok(_)) => {}
                            Ok(Err(e)) => tracing::warn!(error = %e, "statistics expiry failed"),
                            Err(_) => {
                                tracing::warn!("statistics expiry did not answer within {PUBLISH_TIMEOUT:?}")
                            }
                        }
                    }
                    appended
                } else {
                    continue;
                };
                let what = if for_metrics { "metrics row" } else { "statistics" };
                match written {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => tracing::warn!(silo = %row.id, error = %e, "{what} write failed"),
                    Err(_) => {
                        tracing::warn!(silo = %row.id, "{what} write did not answer within {PUBLISH_TIMEOUT:?}")
                    }
                }
            }
        });
        MetricsPublisher { task }
    }
}

/// The statistics points of a metrics row (see
/// [`MetricsPublisherBuilder::statistics`]).
pub fn statistic_points(row: &MetricsRow) -> Vec<StatPoint> {
    let figures: [(&str, f64); 12] = [
        ("cpu_percent", f64::from(row.cpu_percent)),
        ("memory_bytes", row.memory_bytes as f64),
        ("probe_rtt_p50_ms", row.probe_rtt_p50_ms),
        ("probe_rtt_p99_ms", row.probe_rtt_p99_ms),
        ("suspicions_sent", row.suspicions_sent as f64),
        ("votes_written", row.votes_written as f64),
        ("table_reads", row.table_reads as f64),
        ("table_writes", row.table_writes as f64),
        ("table_conflicts", row.table_conflicts as f64),
        ("reminders_owned", row.reminders_owned as f64),
        ("ticks_delivered", row.ticks_delivered as f64),
        ("ticks_late", row.ticks_late as f64),
    ];
    let lateness = [
        ("tick_lateness_p50_ms", row.tick_lateness_p50_ms),
        ("tick_lateness_p99_ms", row.tick_lateness_p99_ms),
    ];
    figures
        .into_iter()
        .chain(lateness.into_iter().filter_map(|(n, v)| Some((n, v?))))
        .filter(|(_, v)| v.is_finite())
        .map(|(name, value)| StatPoint {
            time: row.time,
            silo: row.id.clone(),
            name: name.to_owned(),
            value,
            is_delta: false,
        })
        .collect()
}

struct Publishing {
    sampler: ProcessSampler,
    silo: SiloHandle,
    reminders: Option<Reminders>,
    name: String,
    host_name: String,
    store: Option<Arc<dyn crate::SystemStore>>,
}

impl Publishing {
    fn row(&mut self, now: Timestamp, lateness: bool) -> MetricsRow {
        let (cpu_percent, memory_bytes) = self.sampler.sample();
        let c = self.silo.counters();
        let r = self.reminders.as_ref().map(Reminders::stats).unwrap_or_default();
        let lateness = match lateness {
            true => self.reminders.as_ref().and_then(Reminders::take_lateness),
            false => None,
        };
        MetricsRow {
            address: self.silo.address().endpoint().to_string(),
            name: self.name.clone(),
            host_name: self.host_name.clone(),
            cpu_percent,
            memory_bytes,
            probe_rtt_p50_ms: c.probe_rtt_p50_ms,
            probe_rtt_p99_ms: c.probe_rtt_p99_ms,
            suspicions_sent: c.suspicions_sent,
            votes_written: c.votes_written,
            table_reads: c.table_reads,
            table_writes: c.table_writes,
            table_conflicts: c.table_conflicts,
            reminders_owned: r.owned,
            ticks_delivered: r.ticks_delivered,
            ticks_late: r.ticks_late,
            tick_lateness_p50_ms: lateness.map(|l| l.p50_ms as f64),
            tick_lateness_p99_ms: lateness.map(|l| l.p99_ms as f64),
            // actix does not expose mailbox lengths.
            mailbox_backlog: None,
            load_shedding: self.silo.health_score() > 0,
            clock_offset_ms: self.silo.clock().offset_ms,
            clock_within_bound: Some(self.silo.clock().within_bound),
            store_connection: self.store.as_ref().and_then(|s| s.connection()),
            ..MetricsRow::new(MetricsRole::Silo, self.silo.address().to_string(), now)
        }
    }
}

/// Writes a silo's metrics row periodically (see [`MetricsPublisher::builder`]).
/// Dropping it stops the writes.
#[derive(Debug)]
pub struct MetricsPublisher {
    task: tokio::task::JoinHandle<()>,
}

impl MetricsPublisher {
    /// A publisher of `silo`'s row into `table` (the metrics table of the silo's
    /// cluster, [`SystemStore::metrics_table`](crate::SystemStore::metrics_table)).
    pub fn builder(silo: &SiloHandle, table: Arc<dyn MetricsTable>) -> MetricsPublisherBuilder {
        // The names the silo wrote into its membership row.
        let view = silo.shared_snapshot();
        let own = view.entry(&silo.address());
        MetricsPublisherBuilder {
            silo: silo.clone(),
            table,
            period: DEFAULT_METRICS_PUBLISH_PERIOD,
            reminders: None,
            name: own.map(|e| e.silo_name.clone()).unwrap_or_default(),
            host_name: own.map(|e| e.host_name.clone()).unwrap_or_default(),
            statistics: None,
            store: None,
        }
    }
}

impl Drop for MetricsPublisher {
    fn drop(&mut self) {
        self.task.abort();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn burn(d: Duration) {
        let mut x = 0u64;
        let start = std::time::Instant::now();
        while start.elapsed() < d {
            x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
        }
        std::hint::black_box(x);
    }

    #[test]
    fn the_sampler_sees_this_process_use_memory_and_cpu() {
        // sysinfo measures CPU between two samples, and only once the process has
        // used some (a fresh test process may have used none at the first sample).
        burn(Duration::from_millis(50));
        let mut sampler = ProcessSampler::new();
        burn(Duration::from_millis(300));
        let (cpu, rss) = sampler.sample();
        assert!(rss > 1 << 20, "a test process holds more than 1 MiB: {rss}");
        assert!(cpu > 10.0, "300 ms of a busy loop shows as CPU use: {cpu}");
    }
}
