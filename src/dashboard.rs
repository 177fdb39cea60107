//! A live web dashboard of one cluster on actix-web (feature `dashboard`): the
//! membership table (status, IAmAlive age, votes with their ages, table version),
//! the membership history as a timeline, the statistics rollups as charts and the
//! reminders per owner.
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
//! JSON in one object) and `/api/events` (the event stream: events `membership`,
//! `history`, `statistics`, `reminders` and `problem`, each a JSON object; a
//! comment every 15 s keeps idle connections open).

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
pub const CHARTED_STATISTICS: [&str; 4] = ["cpu_percent", "memory_bytes", "probe_rtt_p99_ms", "table_writes"];
/// How often the statistics and reminder panels are read (the membership table and
/// its history are read every `interval`).
pub const SLOW_PANEL_PERIOD: Duration = Duration::from_secs(15);
/// Bound on each store read of the poller.
pub const READ_TIMEOUT: Duration = Duration::from_secs(5);

/// The latest JSON of each panel, with a sequence number per panel so that a
/// stream sends only what changed.
#[derive(Clone, Debug, Default)]
struct Frames {
    panels: [(u64, Option<Arc<str>>); 5],
}

const PANELS: [&str; 5] = ["membership", "history", "statistics", "reminders", "problem"];

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

    /// The dashboard.
    pub fn build(self) -> Dashboard {
        Dashboard {
            inner: Arc::new(Inner {
                store: self.store,
                cluster: self.cluster,
                reminder_service: self.reminder_service,
                ring_points: self.ring_points,
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
}

async fn poll(inner: Weak<Inner>) {
    let Some(handles) = inner.upgrade().map(|me| Handles {
        table: me.store.membership_table(&me.cluster, ProtocolMode::Extended),
        statistics: me
            .store
            .statistics_store(&me.cluster, &StatisticsOptions::default()),
        reminders: me.reminder_service.as_ref().map(|s| me.store.reminder_table(s)),
    }) else {
        return;
    };
    let mut slow_due = tokio::time::Instant::now();
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
                        Ok(events) => me.frames.send_modify(|f| f.set(1, history_json(&events))),
                        Err(e) => problems.push(e),
                    }
                    Some(s)
                }
            },
        };
        if let Some(s) = &snapshot {
            me.frames
                .send_modify(|f| f.set(0, membership_json(&me.cluster, s, Timestamp::now())));
        }
        if tokio::time::Instant::now() >= slow_due {
            slow_due = tokio::time::Instant::now() + SLOW_PANEL_PERIOD;
            match statistics_json(&handles.statistics).await {
                Ok(v) => me.frames.send_modify(|f| f.set(2, v)),
                Err(e) => problems.push(format!("statistics: {e}")),
            }
            if let (Some(reminders), Some(s)) = (&handles.reminders, &snapshot) {
                match reminders_json(&me, reminders, s).await {
                    Ok(v) => me.frames.send_modify(|f| f.set(3, v)),
                    Err(e) => problems.push(format!("reminders: {e}")),
                }
            }
        }
        me.frames
            .send_modify(|f| f.set(4, json!({ "problems": problems })));
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

async fn reminders_json(
    me: &Inner,
    table: &crate::Result<Arc<dyn ReminderTable>>,
    membership: &MembershipSnapshot,
) -> Result<Value, String> {
    let table = table.as_ref().map_err(|e| e.to_string())?;
    let rows = bounded("read_rows_in_range", table.read_rows_in_range(0, 0)).await?;
    let ring = crate::reminders::ring::Ring::of_active(membership, me.ring_points);
    let mut owners: std::collections::BTreeMap<String, u64> = Default::default();
    for r in &rows {
        let owner = ring
            .owner_of(r.hash)
            .map_or_else(|| "(no Active silo)".to_owned(), |s| s.to_string());
        *owners.entry(owner).or_default() += 1;
    }
    Ok(json!({
        "service": table.service_id(),
        "total": rows.len(),
        "owners": owners.into_iter().map(|(silo, count)| json!({ "silo": silo, "count": count })).collect::<Vec<_>>(),
    }))
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
    let sent = [0u64; 5];
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

    fn rand_suffix() -> u64 {
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos() as u64)
            .unwrap_or(0)
    }
}
