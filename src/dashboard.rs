//! A live web dashboard of one cluster on actix-web (feature `dashboard`): the
//! membership table (status, IAmAlive age, votes with their ages, table version),
//! the membership history as a timeline, the statistics rollups as charts with
//! units (tick lateness among them), the reminder service's shard map, its
//! reminders per kind (next due, paused, parked, one reminder's runs) and the
//! actor state per kind. Every number is shown in human units.
//!
//! The page is one HTML file with its script and style, embedded in the binary (no
//! CDN, no build step): plain JavaScript that renders what the server pushes over
//! one [server-sent events](https://html.spec.whatwg.org/multipage/server-sent-events.html)
//! stream, so the page never polls. The server reads the store once per
//! `interval` for all viewers together (one poller per [`Dashboard`]), whatever
//! the number of open pages.
//!
//! It is **read-only**: it offers no action on the cluster. `rollcall dashboard`
//! binds to loopback by default; put it behind your own authentication before
//! exposing it.
//!
//! Mount it in your own actix-web application:
//!
//! ```no_run
//! # async fn run() -> std::io::Result<()> {
//! use actix_web::{web, App, HttpServer};
//! let store = rollcall::connect("memory://").await.expect("store");
//! let dashboard = rollcall::dashboard::Dashboard::new(store, "orders");
//! HttpServer::new(move || {
//!     let dashboard = dashboard.clone();
//!     App::new().service(web::scope("/rollcall").configure(move |c| dashboard.configure(c)))
//! })
//! .bind(("127.0.0.1", 8080))?
//! .run()
//! .await
//! # }
//! ```
//!
//! Routes, under the scope it is mounted at: `/` (the page; the bare scope path
//! redirects there), `/app.js`, `/app.css`, `/api/snapshot` (every panel's latest
//! JSON in one object), `/api/runs?actor=A&name=N` (one reminder's run history,
//! read when asked; 502 with `{"error"}` when the store fails) and
//! `/api/events` (the event stream: events `membership`, `history`,
//! `statistics`, `reminders`, `shards`, `state` and `problem`, each a JSON
//! object; a comment every 15 s keeps idle connections open).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Weak};
use std::time::Duration;

use actix_web::http::header;
use actix_web::web::{self, Bytes};
use actix_web::{HttpRequest, HttpResponse};
use serde_json::{json, Value};
use tokio::sync::watch;

use crate::{
    AggLevel, HistoryQuery, MembershipEvent, MembershipSnapshot, MembershipTable, ProtocolMode,
    ReminderTable, StatFilter, StatisticsOptions, StatisticsStore, SystemStore, Timestamp,
};

const INDEX_HTML: &str = include_str!("dashboard/index.html");
const APP_JS: &str = include_str!("dashboard/app.js");
const APP_CSS: &str = include_str!("dashboard/app.css");

/// History events the timeline shows (the newest).
pub const HISTORY_EVENTS: u64 = 200;
/// Statistics the charts show (of those a silo's metrics publisher appends).
pub const CHARTED_STATISTICS: [&str; 6] = [
    "cpu_percent",
    "memory_bytes",
    "probe_rtt_p99_ms",
    "table_writes",
    "tick_lateness_p50_ms",
    "tick_lateness_p99_ms",
];
/// Reminders listed in each of the reminder panel's lists (next due, paused,
/// parked).
pub const LISTED_REMINDERS: usize = 8;
/// States whose headers the state panel reads per actor kind (the largest and
/// the next expiries are of these).
pub const STATES_READ_PER_KIND: usize = 2_000;
/// Actor kinds the state panel shows at most (the first given, or the first
/// by name of the reminder service's kinds): each
/// costs up to [`STATES_READ_PER_KIND`] header reads.
pub const STATE_KINDS_SHOWN: usize = 20;
/// States listed per kind as the largest and as the next to expire.
pub const LISTED_STATES: usize = 5;
/// Store reads the shard map and the state panel run at once.
const READS_AT_ONCE: usize = 16;
/// How often the statistics and reminder panels are read (the membership table and
/// its history are read every `interval`).
pub const SLOW_PANEL_PERIOD: Duration = Duration::from_secs(15);
/// Bound on each store read of the poller.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The latest JSON of each panel, with a sequence number per panel so that a
/// stream sends only what changed.
#[derive(Clone, Debug, Default)]
struct Frames {
    panels: [(u64, Option<Arc<str>>); PANELS.len()],
}

const PANELS: [&str; 7] = [
    "membership",
    "history",
    "statistics",
    "reminders",
    "problem",
    "shards",
    "state",
];
const MEMBERSHIP: usize = 0;
const HISTORY: usize = 1;
const STATISTICS: usize = 2;
const REMINDERS: usize = 3;
const PROBLEM: usize = 4;
const SHARDS: usize = 5;
const STATE: usize = 6;

impl Frames {
    fn set(&mut self, panel: usize, value: Value) {
        let text: Arc<str> = value.to_string().into();
        let slot = &mut self.panels[panel];
        if slot.1.as_deref() != Some(&*text) {
            slot.0 += 1;
            slot.1 = Some(text);
        }
    }
}

struct Inner {
    store: Arc<dyn SystemStore>,
    cluster: String,
    reminder_service: Option<String>,
    ring_points: u32,
    state_service: Option<String>,
    state_kinds: Vec<String>,
    interval: Duration,
    frames: watch::Sender<Frames>,
    polling: AtomicBool,
}

/// How a [`Dashboard`] reads the store.
#[derive(Clone)]
pub struct DashboardBuilder {
    store: Arc<dyn SystemStore>,
    cluster: String,
    reminder_service: Option<String>,
    ring_points: u32,
    state_service: Option<String>,
    state_kinds: Vec<String>,
    interval: Duration,
}

impl DashboardBuilder {
    /// How often the membership table and its history are read (default 1 s, at
    /// least 100 ms). Statistics and reminders are read every
    /// [`SLOW_PANEL_PERIOD`].
    pub fn interval(mut self, interval: Duration) -> Self {
        self.interval = interval.max(Duration::from_millis(100));
        self
    }

    /// The reminder service whose reminders are counted per owner (default: the
    /// service named like the cluster, what a silo's reminder service uses by
    /// default; `None`: no reminder panel), and the ring points per silo of its
    /// services (`ring_points_per_silo`, default 30, at least 1).
    pub fn reminders(mut self, service: Option<String>, ring_points: u32) -> Self {
        self.reminder_service = service;
        self.ring_points = ring_points.max(1);
        self
    }

    /// The actor-state service whose states the state panel sums up per actor
    /// kind (default: none, no state panel), and the kinds to show (the state
    /// table has no index of kinds: empty means the actor kinds of the
    /// reminder service's rows). Of at most [`STATE_KINDS_SHOWN`] kinds, it
    /// reads up to [`STATES_READ_PER_KIND`] headers each every
    /// [`SLOW_PANEL_PERIOD`].
    pub fn state(mut self, service: Option<String>, kinds: Vec<String>) -> Self {
        self.state_service = service;
        self.state_kinds = kinds;
        self
    }

    /// The dashboard.
    pub fn build(self) -> Dashboard {
        Dashboard {
            inner: Arc::new(Inner {
                store: self.store,
                cluster: self.cluster,
                reminder_service: self.reminder_service,
                ring_points: self.ring_points,
                state_service: self.state_service,
                state_kinds: self.state_kinds,
                interval: self.interval,
                frames: watch::channel(Frames::default()).0,
                polling: AtomicBool::new(false),
            }),
        }
    }
}

/// The dashboard of one cluster. Cheap to clone; every clone shares one poller.
#[derive(Clone)]
pub struct Dashboard {
    inner: Arc<Inner>,
}

impl std::fmt::Debug for Dashboard {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Dashboard")
            .field("cluster", &self.inner.cluster)
            .field("interval", &self.inner.interval)
            .finish_non_exhaustive()
    }
}

impl Dashboard {
    /// The dashboard of `cluster` in `store` with the defaults of
    /// [`DashboardBuilder`].
    pub fn new(store: Arc<dyn SystemStore>, cluster: impl Into<String>) -> Self {
        Self::builder(store, cluster).build()
    }

    /// A dashboard of `cluster` in `store`, to configure.
    pub fn builder(store: Arc<dyn SystemStore>, cluster: impl Into<String>) -> DashboardBuilder {
        let cluster = cluster.into();
        DashboardBuilder {
            store,
            reminder_service: Some(cluster.clone()),
            cluster,
            ring_points: 30,
            state_service: None,
            state_kinds: Vec::new(),
            interval: Duration::from_secs(1),
        }
    }

    /// Adds the dashboard's routes to an actix-web configuration (an `App` or a
    /// `Scope`). Starts the poller on the first request.
    pub fn configure(&self, cfg: &mut web::ServiceConfig) {
        let data = web::Data::new(self.clone());
        cfg.app_data(data)
            .route("", web::get().to(redirect_to_slash))
            .route("/", web::get().to(index))
            .route("/app.js", web::get().to(app_js))
            .route("/app.css", web::get().to(app_css))
            .route("/api/snapshot", web::get().to(snapshot))
            .route("/api/runs", web::get().to(runs))
            .route("/api/events", web::get().to(events));
    }

    /// Starts the poller once, on the current Tokio runtime.
    fn ensure_polling(&self) {
        if !self.inner.polling.swap(true, Ordering::SeqCst) {
            tokio::spawn(poll(Arc::downgrade(&self.inner)));
        }
    }
}

/// Reads the store every `interval` while the dashboard exists.
/// The store handles one poller reads through, opened once: a handle keeps what it
/// learnt between reads (Redis reuses the rows it decoded, statistics stores their
/// interned names, DynamoDB that the statistics table exists).
struct Handles {
    table: crate::Result<Arc<dyn MembershipTable>>,
    statistics: crate::Result<Arc<dyn StatisticsStore>>,
    reminders: Option<crate::Result<Arc<dyn ReminderTable>>>,
    parked: Option<crate::Result<Arc<dyn ReminderTable>>>,
    leases: Option<crate::Result<Arc<dyn crate::LeaseTable>>>,
    state: Option<crate::Result<Arc<dyn crate::StateTable>>>,
}

async fn poll(inner: Weak<Inner>) {
    let Some(handles) = inner.upgrade().map(|me| Handles {
        table: me.store.membership_table(&me.cluster, ProtocolMode::Extended),
        statistics: me
            .store
            .statistics_store(&me.cluster, &StatisticsOptions::default()),
        reminders: me.reminder_service.as_ref().map(|s| me.store.reminder_table(s)),
        parked: me
            .reminder_service
            .as_ref()
            .map(|s| me.store.reminder_table(&crate::parked_service_id(s))),
        leases: me.reminder_service.as_ref().map(|s| me.store.lease_table(s)),
        state: me.state_service.as_ref().map(|s| me.store.state_table(s)),
    }) else {
        return;
    };
    let mut slow_due = tokio::time::Instant::now();
    let mut moves = ShardMoves::default();
    loop {
        let Some(me) = inner.upgrade() else { return };
        let mut problems = Vec::new();
        let snapshot = match &handles.table {
            Err(e) => {
                problems.push(format!("membership table: {e}"));
                None
            }
            Ok(t) => match bounded("membership table", t.read_all()).await {
                Err(e) => {
                    problems.push(e);
                    None
                }
                Ok(s) => {
                    let query = HistoryQuery {
                        from_version: s.version.version.saturating_sub(HISTORY_EVENTS - 1),
                        silo: None,
                        limit: HISTORY_EVENTS as usize,
                    };
                    match bounded("history", t.read_history(&query)).await {
                        Ok(events) => me.frames.send_modify(|f| f.set(HISTORY, history_json(&events))),
                        Err(e) => problems.push(e),
                    }
                    Some(s)
                }
            },
        };
        if let Some(s) = &snapshot {
            me.frames
                .send_modify(|f| f.set(MEMBERSHIP, membership_json(&me.cluster, s, Timestamp::now())));
            if let Some(leases) = &handles.leases {
                match shards_json(leases, s, &mut moves).await {
                    Ok(v) => me.frames.send_modify(|f| f.set(SHARDS, v)),
                    Err(e) => problems.push(format!("shard leases: {e}")),
                }
            }
        }
        if tokio::time::Instant::now() >= slow_due {
            slow_due = tokio::time::Instant::now() + SLOW_PANEL_PERIOD;
            match statistics_json(&handles.statistics).await {
                Ok(v) => me.frames.send_modify(|f| f.set(STATISTICS, v)),
                Err(e) => problems.push(format!("statistics: {e}")),
            }
            let mut kinds = me.state_kinds.clone();
            if let (Some(reminders), Some(s)) = (&handles.reminders, &snapshot) {
                match reminders_json(&me, reminders, handles.parked.as_ref(), s).await {
                    Ok((v, seen)) => {
                        if kinds.is_empty() {
                            kinds = seen;
                        }
                        me.frames.send_modify(|f| f.set(REMINDERS, v));
                    }
                    Err(e) => problems.push(format!("reminders: {e}")),
                }
            }
            if let Some(state) = &handles.state {
                match state_json(state, &kinds).await {
                    Ok(v) => me.frames.send_modify(|f| f.set(STATE, v)),
                    Err(e) => problems.push(format!("actor state: {e}")),
                }
            }
        }
        me.frames
            .send_modify(|f| f.set(PROBLEM, json!({ "problems": problems })));
        let interval = me.interval;
        drop(me);
        tokio::time::sleep(interval).await;
    }
}

/// A store read bounded by [`READ_TIMEOUT`], its failure as the text the page shows.
async fn bounded<T>(
    what: &str,
    read: impl std::future::Future<Output = crate::Result<T>>,
) -> Result<T, String> {
    rollcall_core::bounded(
        READ_TIMEOUT,
        async { read.await.map_err(|e| format!("{what}: {e}")) },
        |t| format!("{what}: no answer within {t:?}"),
    )
    .await
}

fn membership_json(cluster: &str, s: &MembershipSnapshot, now: Timestamp) -> Value {
    let silos: Vec<Value> = s
        .rows()
        .map(|e| {
            json!({
                "address": e.silo.to_string(),
                "endpoint": e.silo.endpoint().to_string(),
                "generation": e.silo.generation(),
                "status": e.status.as_str(),
                "host": e.host_name,
                "name": e.silo_name,
                "start_ms": e.start_time.as_millis(),
                "i_am_alive_ms": e.i_am_alive_time.as_millis(),
                "votes": e.suspect_votes.iter().map(|v| json!({
                    "silo": v.silo.to_string(),
                    "time_ms": v.time.as_millis(),
                })).collect::<Vec<_>>(),
            })
        })
        .collect();
    json!({
        "cluster": cluster,
        "version": s.version.version,
        "now_ms": now.as_millis(),
        "silos": silos,
        "corrupt": s.corrupt.iter().map(|c| json!({ "key": c.key, "reason": c.reason })).collect::<Vec<_>>(),
    })
}

fn history_json(events: &[MembershipEvent]) -> Value {
    let events: Vec<Value> = events
        .iter()
        .rev()
        .map(|e| {
            json!({
                "version": e.version,
                "time_ms": e.time.as_millis(),
                "silo": e.silo.to_string(),
                "kind": format!("{:?}", e.kind).to_lowercase(),
                "status": e.status.as_str(),
                "votes": e.votes.iter().map(|v| v.silo.to_string()).collect::<Vec<_>>(),
                "writer": e.writer.map(|w| w.to_string()),
            })
        })
        .collect();
    json!({ "events": events })
}

async fn statistics_json(stats: &crate::Result<Arc<dyn StatisticsStore>>) -> Result<Value, String> {
    let stats = match stats {
        Ok(s) => s,
        Err(crate::Error::Unsupported(why)) => return Ok(json!({ "unsupported": why, "levels": {} })),
        Err(e) => return Err(e.to_string()),
    };
    let now = Timestamp::now();
    let mut levels = serde_json::Map::new();
    for (level, name, span) in [
        (AggLevel::Minute1, "1m", Duration::from_secs(3600)),
        (AggLevel::Minute10, "10m", Duration::from_secs(24 * 3600)),
        (AggLevel::Minute60, "60m", Duration::from_secs(10 * 24 * 3600)),
    ] {
        let filter = StatFilter {
            level,
            from: now.saturating_sub(span),
            to: Timestamp::from_millis(now.as_millis().saturating_add(1)),
            names: Some(CHARTED_STATISTICS.iter().map(|s| s.to_string()).collect()),
            silos: None,
        };
        let records = bounded("scan", stats.scan(&filter)).await?;
        let points: Vec<Value> = records
            .iter()
            .map(|r| {
                json!({
                    "t": r.time.as_millis(),
                    "silo": r.silo,
                    "name": r.name,
                    "mean": r.aggregate.mean(),
                    "min": r.aggregate.min,
                    "max": r.aggregate.max,
                })
            })
            .collect();
        levels.insert(name.into(), Value::Array(points));
    }
    Ok(json!({ "names": CHARTED_STATISTICS, "levels": levels }))
}

/// The reminder panel: counts per owner and per actor kind (with the paused
/// ones and the next due time), the next due reminders, the paused ones and
/// the parked occurrences (`<service>.parked`); and the actor kinds seen.
async fn reminders_json(
    me: &Inner,
    table: &crate::Result<Arc<dyn ReminderTable>>,
    parked: Option<&crate::Result<Arc<dyn ReminderTable>>>,
    membership: &MembershipSnapshot,
) -> Result<(Value, Vec<String>), String> {
    use crate::reminders::schedule::Timing;
    let table = table.as_ref().map_err(|e| e.to_string())?;
    let rows = bounded("read_rows_in_range", table.read_rows_in_range(0, 0)).await?;
    let ring = crate::reminders::ring::Ring::of_active(membership, me.ring_points);
    let now = Timestamp::now();
    let mut owners: std::collections::BTreeMap<String, u64> = Default::default();
    // Per kind: count, paused, the next due time.
    let mut kinds: std::collections::BTreeMap<&str, (u64, u64, Option<u64>)> = Default::default();
    let mut next: Vec<(u64, &crate::ReminderEntry)> = Vec::new();
    let mut paused = Vec::new();
    for r in &rows {
        let owner = ring
            .owner_of(r.hash)
            .map_or_else(|| "(no Active silo)".to_owned(), |s| s.to_string());
        *owners.entry(owner).or_default() += 1;
        let kind = r.actor_id.split('/').next().unwrap_or_default();
        let k = kinds.entry(kind).or_default();
        k.0 += 1;
        if r.paused.is_some() {
            k.1 += 1;
            paused.push(r);
            continue;
        }
        // A one-shot past due is due now (it waits for its delivery).
        let due = Timing::of(r).ok().and_then(|t| {
            t.after(now.saturating_sub(Duration::from_millis(1)))
                .or_else(|| t.is_one_shot().then_some(r.start_at))
        });
        if let Some(due) = due {
            let due = due.as_millis();
            k.2 = Some(k.2.map_or(due, |d| d.min(due)));
            next.push((due, r));
        }
    }
    next.sort_by_key(|(due, _)| *due);
    let entry = |r: &crate::ReminderEntry, due: Option<u64>| {
        json!({
            "actor": r.actor_id,
            "name": r.name,
            "due_ms": due,
            "period_ms": r.period.map(|p| p.as_millis() as u64),
            "cron": r.cron,
            "paused_ms": r.paused.map(|p| p.as_millis()),
            "trigger_of": r.trigger_of,
        })
    };
    let parked = match parked {
        None => json!(null),
        Some(Err(e)) => json!({ "error": e.to_string() }),
        Some(Ok(t)) => match bounded("parked rows", t.read_rows_in_range(0, 0)).await {
            Err(e) => json!({ "error": e }),
            Ok(rows) => json!({
                "total": rows.len(),
                "rows": rows.iter().take(LISTED_REMINDERS).map(|r| json!({
                    "actor": r.actor_id,
                    "name": r.name,
                    "scheduled_ms": r.start_at.as_millis(),
                })).collect::<Vec<_>>(),
            }),
        },
    };
    let seen: Vec<String> = kinds.keys().map(|k| (*k).to_owned()).collect();
    Ok((
        json!({
            "service": table.service_id(),
            "now_ms": now.as_millis(),
            "total": rows.len(),
            "owners": owners.into_iter().map(|(silo, count)| json!({ "silo": silo, "count": count })).collect::<Vec<_>>(),
            "kinds": kinds.iter().map(|(kind, (count, paused, due))| json!({
                "kind": kind, "count": count, "paused": paused, "next_due_ms": due,
            })).collect::<Vec<_>>(),
            "next": next.iter().take(LISTED_REMINDERS).map(|(due, r)| entry(r, Some(*due))).collect::<Vec<_>>(),
            "paused": paused.iter().take(LISTED_REMINDERS).map(|r| entry(r, None)).collect::<Vec<_>>(),
            "paused_total": paused.len(),
            "parked": parked,
        }),
        seen,
    ))
}

/// A lease row as read: its bytes and etag.
type LeaseRow = (Vec<u8>, crate::Etag);

/// How long a shard taken over from a silo that is not Active shows as
/// `taken_over` on the shard map.
pub const TAKEOVER_SHOWN: Duration = Duration::from_secs(60);

/// What the poller saw of each shard's lease: its epoch and holder, and the
/// last change of epoch it saw (the holder before, and when, UTC ms).
#[derive(Default)]
struct ShardMoves {
    seen: std::collections::HashMap<u32, (u64, Option<crate::SiloAddress>)>,
    last_move: std::collections::HashMap<u32, (Option<crate::SiloAddress>, u64)>,
}

/// The shard map: every shard's lease row (holder, its status in the view,
/// epoch, watermark and how long ago that was) and its state:
/// - `owned`: held by an Active silo;
/// - `fenced`: held by a silo the view does not show Active (declared Dead:
///   its successor is about to take it over);
/// - `taken_over`: acquired from a silo that is not Active (a crash) in the
///   last [`TAKEOVER_SHOWN`], as this dashboard saw it: the new holder
///   delivers nothing of it before its takeover time (`lease_period` plus
///   `max_clock_offset` after it saw the holder Dead);
/// - `released`: handed over, waiting for its next holder;
/// - `vacant`: never held; `unreadable`: the row does not decode.
async fn shards_json(
    leases: &crate::Result<Arc<dyn crate::LeaseTable>>,
    membership: &MembershipSnapshot,
    moves: &mut ShardMoves,
) -> Result<Value, String> {
    use futures_util::StreamExt;
    let leases = leases.as_ref().map_err(|e| e.to_string())?;
    let service = leases.service_id().to_owned();
    // No row for shard 0: the service has not started (its first start records
    // the shard count before any lease is written; recording one here would fix
    // the service's count).
    let Some(first) = bounded("lease row", leases.read_lease(0)).await? else {
        return Ok(json!({ "service": service, "shards": null, "rows": [] }));
    };
    let count = bounded("shard count", leases.shard_count(1)).await?;
    let now = Timestamp::now();
    let mut rows: Vec<(u32, Result<Option<LeaseRow>, String>)> = vec![(0, Ok(Some(first)))];
    let rest: Vec<_> = futures_util::stream::iter(1..count)
        .map(|shard| async move { (shard, bounded("lease row", leases.read_lease(shard)).await) })
        .buffered(READS_AT_ONCE)
        .collect()
        .await;
    rows.extend(rest);
    let rows: Vec<Value> = rows
        .into_iter()
        .map(|(shard, row)| {
            let row = match row {
                Err(e) => return json!({ "shard": shard, "state": "unreadable", "error": e }),
                Ok(None) => return json!({ "shard": shard, "state": "vacant" }),
                Ok(Some(row)) => row,
            };
            match crate::ShardLease::decode(&service, shard, &row.0, row.1) {
                Err(e) => json!({ "shard": shard, "state": "unreadable", "error": e.to_string() }),
                Ok(l) => {
                    let holder_status = l.owner.and_then(|o| membership.status_of(&o));
                    let before = moves.seen.insert(shard, (l.epoch, l.owner));
                    if let Some((epoch, holder)) = before {
                        if epoch != l.epoch {
                            moves.last_move.insert(shard, (holder, now.as_millis()));
                        }
                    }
                    let last_move = moves.last_move.get(&shard).copied();
                    let taken_over = last_move.is_some_and(|(from, at)| {
                        now.as_millis().saturating_sub(at) < TAKEOVER_SHOWN.as_millis() as u64
                            && from.is_some_and(|f| {
                                Some(f) != l.owner
                                    && membership.status_of(&f) != Some(crate::SiloStatus::Active)
                            })
                    });
                    let state = match (l.status, holder_status) {
                        (crate::LeaseStatus::Released, _) => "released",
                        (crate::LeaseStatus::Owned, Some(crate::SiloStatus::Active)) if taken_over => {
                            "taken_over"
                        }
                        (crate::LeaseStatus::Owned, Some(crate::SiloStatus::Active)) => "owned",
                        (crate::LeaseStatus::Owned, _) => "fenced",
                    };
                    json!({
                        "shard": shard,
                        "state": state,
                        "holder": l.owner.map(|o| o.to_string()),
                        "holder_status": holder_status.map(|s| s.as_str()),
                        "epoch": l.epoch,
                        "watermark_ms": l.watermark.map(|w| w.as_millis()),
                        "lag_ms": l.watermark.map(|w| now.as_millis().saturating_sub(w.as_millis())),
                        "exceptions": l.exceptions.len(),
                        "moved_from": last_move.and_then(|(from, _)| from).map(|f| f.to_string()),
                        "moved_ms": last_move.map(|(_, at)| at),
                    })
                }
            }
        })
        .collect();
    Ok(json!({ "service": service, "shards": count, "now_ms": now.as_millis(), "rows": rows }))
}

/// The state panel: per actor kind, the states (up to
/// [`STATES_READ_PER_KIND`] read), their bytes, the largest and the next to
/// expire.
async fn state_json(
    table: &crate::Result<Arc<dyn crate::StateTable>>,
    kinds: &[String],
) -> Result<Value, String> {
    use futures_util::StreamExt;
    let table = table.as_ref().map_err(|e| e.to_string())?;
    let now = Timestamp::now();
    let mut out = Vec::new();
    for kind in kinds.iter().take(STATE_KINDS_SHOWN) {
        let keys = bounded("state list", table.list(kind, None, STATES_READ_PER_KIND)).await?;
        let headers: Vec<(crate::StateKey, Option<crate::state::StateHeader>)> =
            futures_util::stream::iter(keys)
                .map(|key| async move {
                    let header = match bounded("state header", table.read_header(&key)).await {
                        Ok(Some((bytes, _))) => crate::state::StateHeader::decode(&key, &bytes).ok(),
                        _ => None,
                    };
                    (key, header)
                })
                .buffered(READS_AT_ONCE)
                .collect()
                .await;
        let mut live: Vec<(&crate::StateKey, &crate::state::StateHeader)> = headers
            .iter()
            .filter_map(|(k, h)| h.as_ref().map(|h| (k, h)))
            .filter(|(_, h)| !h.cleared && h.expires_at.is_none_or(|e| e > now))
            .collect();
        let bytes: u64 = live.iter().map(|(_, h)| h.len).sum();
        live.sort_by_key(|(_, h)| std::cmp::Reverse(h.len));
        let largest: Vec<Value> = live
            .iter()
            .take(LISTED_STATES)
            .map(|(k, h)| json!({ "actor": k.actor_id(), "name": k.name(), "bytes": h.len }))
            .collect();
        let mut expiring: Vec<_> = live.iter().filter(|(_, h)| h.expires_at.is_some()).collect();
        expiring.sort_by_key(|(_, h)| h.expires_at);
        out.push(json!({
            "kind": kind,
            "states": live.len(),
            "read": headers.len(),
            "bytes": bytes,
            "largest": largest,
            "expiring_total": expiring.len(),
            "expiring": expiring.iter().take(LISTED_STATES).map(|(k, h)| json!({
                "actor": k.actor_id(),
                "name": k.name(),
                "expires_ms": h.expires_at.map(|e| e.as_millis()),
                "bytes": h.len,
            })).collect::<Vec<_>>(),
        }));
    }
    Ok(json!({ "service": table.service_id(), "now_ms": now.as_millis(), "kinds": out }))
}

/// `/api/runs?actor=A&name=N`: the run history of one reminder, newest first.
async fn runs(d: web::Data<Dashboard>, q: web::Query<RunsQuery>) -> HttpResponse {
    let Some(service) = &d.inner.reminder_service else {
        return HttpResponse::NotFound().json(json!({ "error": "no reminder service" }));
    };
    let table = match d.inner.store.reminder_table(service) {
        Ok(t) => t,
        Err(e) => return HttpResponse::InternalServerError().json(json!({ "error": e.to_string() })),
    };
    match bounded("read_runs", table.read_runs(&q.actor, &q.name)).await {
        Ok(runs) => HttpResponse::Ok().json(json!({
            "actor": q.actor,
            "name": q.name,
            "runs": runs,
        })),
        Err(e) => HttpResponse::BadGateway().json(json!({ "error": e })),
    }
}

/// The query of `/api/runs`.
#[derive(serde::Deserialize)]
struct RunsQuery {
    actor: String,
    name: String,
}

async fn redirect_to_slash(req: HttpRequest) -> HttpResponse {
    HttpResponse::PermanentRedirect()
        .insert_header((header::LOCATION, format!("{}/", req.path())))
        .finish()
}

async fn index(d: web::Data<Dashboard>) -> HttpResponse {
    d.ensure_polling();
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .insert_header((header::CACHE_CONTROL, "no-store"))
        .body(INDEX_HTML)
}

async fn app_js() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/javascript; charset=utf-8")
        .body(APP_JS)
}

async fn app_css() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/css; charset=utf-8")
        .body(APP_CSS)
}

async fn snapshot(d: web::Data<Dashboard>) -> HttpResponse {
    d.ensure_polling();
    let frames = d.inner.frames.borrow().clone();
    let mut out = String::from("{");
    for (i, (_, text)) in frames.panels.iter().enumerate() {
        if i > 0 {
            out.push(',');
        }
        out.push_str(&format!(
            "\"{}\":{}",
            PANELS[i],
            text.as_deref().unwrap_or("null")
        ));
    }
    out.push('}');
    HttpResponse::Ok().content_type("application/json").body(out)
}

/// The event stream: every panel's latest JSON at once, then each change; a
/// comment line every 15 s while nothing changes.
async fn events(d: web::Data<Dashboard>) -> HttpResponse {
    d.ensure_polling();
    let rx = d.inner.frames.subscribe();
    let sent = [0u64; PANELS.len()];
    let stream = futures_util::stream::unfold((rx, sent, true), |(mut rx, mut sent, first)| async move {
        if !first {
            match tokio::time::timeout(Duration::from_secs(15), rx.changed()).await {
                Ok(Ok(())) => {}
                Ok(Err(_)) => return None, // the dashboard is gone
                Err(_) => {
                    return Some((
                        Ok::<_, actix_web::Error>(Bytes::from_static(b": keep-alive\n\n")),
                        (rx, sent, false),
                    ))
                }
            }
        }
        let frames = rx.borrow_and_update().clone();
        let mut chunk = String::new();
        for (i, (seq, text)) in frames.panels.iter().enumerate() {
            if let Some(text) = text {
                if *seq != sent[i] {
                    sent[i] = *seq;
                    chunk.push_str(&format!("event: {}\ndata: {text}\n\n", PANELS[i]));
                }
            }
        }
        if chunk.is_empty() {
            chunk.push_str(": nothing new\n\n");
        }
        Some((Ok(Bytes::from(chunk)), (rx, sent, false)))
    });
    HttpResponse::Ok()
        .content_type("text/event-stream")
        .insert_header((header::CACHE_CONTROL, "no-cache"))
        .streaming(stream)
}

#[cfg(test)]
mod tests {
    use actix_web::{http::StatusCode, test, web, App};

    use crate::{MembershipEntry, ProtocolMode, SiloStatus, Timestamp};

    /// Mounted under a scope: the bare scope path redirects to the page, the page and
    /// its script are served, and `/api/snapshot` soon holds the cluster's rows.
    #[actix_rt::test]
    async fn mounts_under_a_scope_and_serves_the_cluster() {
        let store = crate::connect(&format!("memory://dash-{}", rand_suffix()))
            .await
            .expect("store");
        let table = store
            .membership_table("orders", ProtocolMode::Extended)
            .expect("table");
        table.init(true).await.expect("init");
        let me = "127.0.0.1:11111@1".parse().expect("address");
        let snap = table.read_all().await.expect("read");
        let row = MembershipEntry::new(me, SiloStatus::Active, Timestamp::now());
        assert!(table
            .insert_row(&row, &snap.version.next())
            .await
            .expect("insert"));
        let dashboard = super::Dashboard::builder(store, "orders")
            .interval(std::time::Duration::from_millis(100))
            .build();
        let app = test::init_service(
            App::new().service(web::scope("/rollcall").configure(|c| dashboard.configure(c))),
        )
        .await;
        let res = test::call_service(&app, test::TestRequest::get().uri("/rollcall").to_request()).await;
        assert_eq!(res.status(), StatusCode::PERMANENT_REDIRECT);
        assert_eq!(res.headers().get("location").unwrap(), "/rollcall/");
        let page =
            test::call_and_read_body(&app, test::TestRequest::get().uri("/rollcall/").to_request()).await;
        assert!(std::str::from_utf8(&page)
            .unwrap()
            .contains("<script src=\"app.js\">"));
        let js = test::call_service(
            &app,
            test::TestRequest::get().uri("/rollcall/app.js").to_request(),
        )
        .await;
        assert_eq!(js.status(), StatusCode::OK);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        loop {
            let body = test::call_and_read_body(
                &app,
                test::TestRequest::get()
                    .uri("/rollcall/api/snapshot")
                    .to_request(),
            )
            .await;
            let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
            if let Some(silos) = v["membership"]["silos"].as_array() {
                assert_eq!(silos.len(), 1);
                assert_eq!(silos[0]["status"], "Active");
                assert_eq!(v["membership"]["version"], 1);
                assert_eq!(v["history"]["events"][0]["kind"], "insert");
                break;
            }
            assert!(std::time::Instant::now() < deadline, "no membership frame: {v}");
            actix_rt::time::sleep(std::time::Duration::from_millis(50)).await;
        }
    }

    /// `/api/runs` answers one reminder's history as JSON, and a query
    /// without the reminder with a 400 (nothing read).
    #[actix_rt::test]
    async fn runs_of_one_reminder_and_a_bad_query() {
        let store = crate::connect(&format!("memory://dash-runs-{}", rand_suffix()))
            .await
            .expect("store");
        let table = store.reminder_table("orders").expect("table");
        let run = crate::RunRecord {
            scheduled: Timestamp::from_millis(1_000),
            at: Timestamp::from_millis(1_250),
            attempts: 1,
            outcome: crate::RunOutcome::Ok,
            silo: "127.0.0.1:11111@1".into(),
            triggered: false,
        };
        table
            .append_run("cart/1", "tick", &run, 20, None)
            .await
            .expect("append");
        let dashboard = super::Dashboard::new(store, "orders");
        let app = test::init_service(App::new().configure(|c| dashboard.configure(c))).await;
        let body = test::call_and_read_body(
            &app,
            test::TestRequest::get()
                .uri("/api/runs?actor=cart%2F1&name=tick")
                .to_request(),
        )
        .await;
        let v: serde_json::Value = serde_json::from_slice(&body).expect("json");
        assert_eq!(v["runs"].as_array().map(Vec::len), Some(1), "{v}");
        assert_eq!(v["runs"][0]["outcome"], "ok");
        let res = test::call_service(
            &app,
            test::TestRequest::get()
                .uri("/api/runs?actor=cart%2F1")
                .to_request(),
        )
        .await;
        assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    }

    fn rand_suffix() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    }
}
