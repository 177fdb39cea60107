//! What an operator watches: the Prometheus endpoint, `status --watch`, and the dashboard in a real browser.

use super::*;

/// The Prometheus exposition served by `rollcall silo --metrics-listen` at `port`
/// (one plain HTTP/1.0 GET).
#[cfg(feature = "redis")]
fn scrape(port: u16) -> String {
    use std::io::{Read, Write};
    let mut stream = std::net::TcpStream::connect(("127.0.0.1", port)).expect("connect to /metrics");
    stream
        .set_read_timeout(Some(std::time::Duration::from_secs(5)))
        .expect("timeout");
    stream
        .write_all(b"GET /metrics HTTP/1.0\r\nHost: localhost\r\n\r\n")
        .expect("send the request");
    let mut reply = String::new();
    stream.read_to_string(&mut reply).expect("read the reply");
    assert!(reply.starts_with("HTTP/1."), "{reply}");
    assert!(reply.contains(" 200 "), "{reply}");
    reply
}

/// The value of the sample of `name` whose labels include every `labels` pair,
/// summed over the series that match.
#[cfg(feature = "redis")]
fn sample(exposition: &str, name: &str, labels: &[(&str, &str)]) -> Option<f64> {
    let mut found = None;
    for line in exposition.lines() {
        let Some(rest) = line.strip_prefix(name) else {
            continue;
        };
        if !(rest.starts_with('{') || rest.starts_with(' ')) {
            continue;
        }
        if labels.iter().all(|(k, v)| rest.contains(&format!("{k}=\"{v}\""))) {
            let v: f64 = rest.rsplit(' ').next()?.parse().ok()?;
            found = Some(found.unwrap_or(0.0) + v);
        }
    }
    found
}

/// Three `rollcall silo --metrics-listen` processes on Redis: the scrape names the
/// documented series with their units; when one silo is SIGKILLed, a survivor's
/// `rollcall_silos{status="Dead"}` goes from 0 to 1, its table version gauge moves
/// up, and the survivors' `rollcall_suspicions_total` counts the votes.
#[cfg(feature = "redis")]
#[test]
fn prometheus_scrape_names_the_series_and_moves_when_a_silo_dies() {
    use std::time::{Duration, Instant};

    let Some((_rt, backend)) = redis_fixture() else {
        return;
    };
    let store = backend.endpoint.as_str();
    let cluster = rollcall_tests::unique_id("prom");
    let metrics_ports: Vec<u16> = (0..3)
        .map(|_| rollcall_tests::fixtures::free_port().unwrap())
        .collect();
    let (mut procs, _ports, _) = start_silos_each(store, &cluster, 3, |i| {
        vec![
            "--metrics-listen".into(),
            format!("127.0.0.1:{}", metrics_ports[i]),
        ]
    });
    // The first silo has probed, recorded a round trip and sees all three Active
    // (the third may still be Joining in its view right after the first probe).
    let cl = ("cluster", cluster.as_str());
    let start = Instant::now();
    let before = loop {
        let text = scrape(metrics_ports[0]);
        if sample(&text, "rollcall_probe_rtt_seconds_count", &[]).unwrap_or(0.0) >= 1.0
            && sample(&text, "rollcall_silos", &[cl, ("status", "Active")]) == Some(3.0)
        {
            break text;
        }
        assert!(
            start.elapsed() < Duration::from_secs(10),
            "no probe recorded or not all three Active: {text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    for name in [
        "# TYPE rollcall_membership_table_version gauge",
        "# TYPE rollcall_silos gauge",
        "# TYPE rollcall_probe_rtt_seconds histogram",
        "# TYPE rollcall_probes_total counter",
        "# TYPE rollcall_table_operations_total counter",
        "# TYPE rollcall_table_operation_seconds histogram",
    ] {
        assert!(before.contains(name), "missing `{name}`: {before}");
    }
    assert_eq!(
        sample(&before, "rollcall_silos", &[cl, ("status", "Dead")]),
        Some(0.0),
        "{before}"
    );
    assert!(
        sample(
            &before,
            "rollcall_table_operations_total",
            &[("op", "insert_row"), ("outcome", "ok")]
        ) >= Some(1.0),
        "{before}"
    );
    let version_before = sample(&before, "rollcall_membership_table_version", &[cl]).expect("version");

    procs.0[2].kill().expect("SIGKILL the silo process");
    let killed = Instant::now();
    loop {
        let text = scrape(metrics_ports[0]);
        if sample(&text, "rollcall_silos", &[cl, ("status", "Dead")]) == Some(1.0) {
            assert_eq!(
                sample(&text, "rollcall_silos", &[cl, ("status", "Active")]),
                Some(2.0),
                "{text}"
            );
            let version = sample(&text, "rollcall_membership_table_version", &[cl]).expect("version");
            assert!(version > version_before, "{version} <= {version_before}");
            break;
        }
        assert!(
            killed.elapsed() < Duration::from_secs(15),
            "never saw the death: {text}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let votes: f64 = metrics_ports[..2]
        .iter()
        .map(|p| sample(&scrape(*p), "rollcall_suspicions_total", &[cl]).unwrap_or(0.0))
        .sum();
    assert!(votes >= 1.0, "the survivors counted no vote");
}

/// `rollcall status --watch` into a pipe prints the table again only when its
/// version changes, as plain lines (no escape codes): it shows 2 Active silos, then,
/// after one is SIGKILLed, the Dead row, without being restarted. On a terminal
/// (`script` gives it one) it redraws the screen with cursor-home and clear.
#[cfg(feature = "redis")]
#[test]
fn status_watch_redraws_on_new_versions_and_degrades_to_plain_lines() {
    use std::io::{BufRead, BufReader};
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    let Some((_rt, backend)) = redis_fixture() else {
        return;
    };
    let store = backend.endpoint.as_str();
    let cluster = rollcall_tests::unique_id("watch");
    let (mut procs, ports, _) = start_silos_with(store, &cluster, 2, &[]);
    let mut watcher = rollcall()
        .args([
            "status",
            "--watch",
            "--interval",
            "100ms",
            "--store",
            store,
            "--cluster",
            &cluster,
        ])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn status --watch");
    let stdout = watcher.stdout.take().expect("stdout");
    let (tx, rx) = std::sync::mpsc::channel::<String>();
    std::thread::spawn(move || {
        for line in BufReader::new(stdout).lines() {
            let Ok(line) = line else { return };
            if tx.send(line).is_err() {
                return;
            }
        }
    });
    // Blocks: "--- <time>", then the table's header line, then rows.
    let mut lines = Vec::new();
    let mut wait_for = |what: &str, done: &dyn Fn(&[String]) -> bool| {
        let start = Instant::now();
        while !done(&lines) {
            let left = Duration::from_secs(15).saturating_sub(start.elapsed());
            match rx.recv_timeout(left) {
                Ok(l) => lines.push(l),
                Err(_) => panic!("never saw {what}: {lines:#?}"),
            }
        }
    };
    let last_block = |lines: &[String]| -> Vec<String> {
        let start = lines.iter().rposition(|l| l.starts_with("--- ")).unwrap_or(0);
        lines[start..].to_vec()
    };
    wait_for("2 active", &|l| {
        last_block(l).iter().any(|x| x.contains("(2 silos, 2 active)"))
    });
    procs.0[1].kill().expect("SIGKILL");
    let victim = format!("127.0.0.1:{} ", ports[1]);
    wait_for("the Dead row", &|l| {
        last_block(l)
            .iter()
            .any(|x| x.starts_with(&victim) && x.contains(" Dead "))
    });
    let _ = watcher.kill();
    let _ = watcher.wait();
    assert!(
        lines.iter().all(|l| !l.contains('\u{1b}')),
        "escape codes in a pipe: {lines:#?}"
    );
    let versions: Vec<&String> = lines.iter().filter(|l| l.starts_with("cluster ")).collect();
    let mut distinct = versions.clone();
    distinct.dedup();
    assert_eq!(
        versions.len(),
        distinct.len(),
        "a version printed twice in a row: {versions:#?}"
    );

    // On a terminal: the screen is redrawn (cursor home + clear) every interval.
    let bin = env!("CARGO_BIN_EXE_rollcall");
    let command = format!("{bin} status --watch --interval 100ms --store {store} --cluster {cluster}");
    let mut tty = std::process::Command::new("script")
        .args(["-qefc", &command, "/dev/null"])
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .expect("spawn script");
    let mut out = tty.stdout.take().expect("stdout");
    let (ttx, trx) = std::sync::mpsc::channel::<Vec<u8>>();
    std::thread::spawn(move || {
        use std::io::Read;
        let mut buf = [0u8; 4096];
        while let Ok(n) = out.read(&mut buf) {
            if n == 0 || ttx.send(buf[..n].to_vec()).is_err() {
                return;
            }
        }
    });
    let mut screen = Vec::new();
    let start = Instant::now();
    while String::from_utf8_lossy(&screen)
        .matches("\u{1b}[H\u{1b}[2J")
        .count()
        < 3
    {
        let left = Duration::from_secs(15).saturating_sub(start.elapsed());
        match trx.recv_timeout(left) {
            Ok(b) => screen.extend(b),
            Err(_) => panic!("no redraws on a terminal: {}", String::from_utf8_lossy(&screen)),
        }
    }
    let _ = tty.kill();
    let _ = tty.wait();
    let text = String::from_utf8_lossy(&screen);
    assert!(text.contains("(Ctrl-C to quit)"), "{text}");
}

/// Waits until something accepts TCP connections on 127.0.0.1:`port`.
#[cfg(feature = "redis")]
fn wait_for_port(port: u16, what: &str) {
    use std::time::{Duration, Instant};
    let start = Instant::now();
    while std::net::TcpStream::connect(("127.0.0.1", port)).is_err() {
        assert!(
            start.elapsed() < Duration::from_secs(20),
            "{what} never listened on {port}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

/// Chromium and ChromeDriver from Debian's packages (`chromium`, `chromium-driver`;
/// paths overridable with `ROLLCALL_CHROMIUM` and `ROLLCALL_CHROMEDRIVER`), or `None`
/// when they are missing and the run may skip (never when `CI` is set).
#[cfg(feature = "redis")]
fn browser_paths() -> Option<(String, String)> {
    let chromium = std::env::var("ROLLCALL_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into());
    let driver = std::env::var("ROLLCALL_CHROMEDRIVER").unwrap_or_else(|_| "/usr/bin/chromedriver".into());
    if std::path::Path::new(&chromium).exists() && std::path::Path::new(&driver).exists() {
        return Some((chromium, driver));
    }
    let why =
        format!("no browser: {chromium} or {driver} is missing (apt-get install chromium chromium-driver)");
    if std::env::var_os("CI").is_some() || std::env::var_os("ROLLCALL_SKIP_MISSING_BACKENDS").is_none() {
        panic!("{why}");
    }
    eprintln!("SKIPPED: {why}");
    None
}

/// Reminders a dashboard child silo registers (the first child only).
#[cfg(feature = "redis")]
const DASH_CARTS: usize = 40;

/// A silo process of [`dashboard_for_operators_in_a_real_browser_through_a_crash`]:
/// the test binary runs itself with `ROLLCALL_DASHBOARD_CHILD="STORE CLUSTER
/// PORT FIRST"` set, and this function becomes a silo (fast membership
/// options) running the cluster's reminder service (16 shards, ticks to an
/// actor; kind `flaky` has no recipient, so its ticks fail and are parked), a
/// metrics publisher with statistics every 300 ms, and, in the first child,
/// the workload: 40 `cart` reminders every second (one paused), 10 `invoice`
/// ones every 2 s, a daily `report` cron in Paris, 3 `flaky` ones, and actor
/// states of kinds `cart` (1 KiB to 362 KiB) and `invoice` (expiring in an
/// hour) in the state service `dash-state`. It runs until killed. Without the
/// variable (a plain test run) it does nothing.
#[cfg(feature = "redis")]
#[test]
#[ignore = "a silo process of the dashboard test, not a test of its own"]
fn dashboard_child_silo() {
    use actix::{Actor, Context, Handler};
    use rollcall::reminders::{ActorId, ReminderSpec, ReminderTick, Reminders};
    use rollcall::state::{Codec, Expected, StateKey, StateStorage};
    use std::time::Duration;

    struct Sink;
    impl Actor for Sink {
        type Context = Context<Self>;
    }
    impl Handler<ReminderTick> for Sink {
        type Result = ();
        fn handle(&mut self, _: ReminderTick, _: &mut Context<Self>) {}
    }

    let Ok(spec) = std::env::var("ROLLCALL_DASHBOARD_CHILD") else {
        return;
    };
    let f: Vec<String> = spec.split(' ').map(str::to_owned).collect();
    let (store_url, cluster, port, first) = (
        f[0].clone(),
        f[1].clone(),
        f[2].parse::<u16>().expect("port"),
        f[3] == "1",
    );
    let system = actix::System::new();
    system.block_on(async move {
        let store = rollcall::connect(&store_url).await.expect("store");
        let silo = rollcall::Silo::builder(store.clone(), cluster.clone())
            .listen(std::net::SocketAddr::from(([127, 0, 0, 1], port)))
            .options(rollcall::ClusterMembershipOptions::fast())
            .start()
            .await
            .expect("silo");
        let sink = Sink.start().recipient();
        let reminders = Reminders::builder(&silo, store.clone())
            .service_id(cluster.clone())
            .shards(16)
            .options(rollcall::ReminderOptions {
                minimum_period: Duration::from_secs(1),
                ..rollcall::ReminderOptions::default()
            })
            .target(move |a: &ActorId| (a.kind() != "flaky").then(|| sink.clone()))
            .start()
            .await
            .expect("reminders");
        let table = store.metrics_table(&cluster).expect("metrics table");
        table.init().await.expect("metrics table init");
        let stats = store
            .statistics_store(&cluster, &rollcall::StatisticsOptions::default())
            .expect("statistics");
        let _publisher = rollcall::metrics_table::MetricsPublisher::builder(&silo, table)
            .period(Duration::from_millis(300))
            .statistics(stats, Duration::from_millis(300))
            .reminders(&reminders)
            .start();
        if first {
            let second = Duration::from_secs(1);
            for i in 0..DASH_CARTS {
                let actor = ActorId::new("cart", i.to_string()).expect("actor");
                reminders
                    .register(&actor, "refresh", ReminderSpec::every(second, second))
                    .await
                    .expect("register");
            }
            reminders
                .pause(&ActorId::new("cart", "0").expect("actor"), "refresh")
                .await
                .expect("pause");
            for i in 0..10 {
                let actor = ActorId::new("invoice", i.to_string()).expect("actor");
                reminders
                    .register(&actor, "remind", ReminderSpec::every(second, 2 * second))
                    .await
                    .expect("register");
            }
            let daily = ReminderSpec::cron("0 0 6 * * *").in_zone("Europe/Paris");
            reminders
                .register(&ActorId::new("report", "daily").expect("actor"), "mail", daily)
                .await
                .expect("register");
            for i in 0..3 {
                let actor = ActorId::new("flaky", i.to_string()).expect("actor");
                let spec = ReminderSpec::every(second, second).with_retry(rollcall::RetryPolicy::PARK);
                reminders.register(&actor, "sync", spec).await.expect("register");
            }
            let states = StateStorage::new(store.state_table("dash-state").expect("state table"));
            for i in 0..20usize {
                let key = StateKey::new(format!("cart/{i}"), "profile").expect("key");
                let data = vec![b'x'; 1024 * (i * i + 1)];
                states
                    .write(&key, Expected::Any, Codec::Raw, &data, None)
                    .await
                    .expect("state write");
            }
            for i in 0..10u64 {
                let key = StateKey::new(format!("invoice/{i}"), "pdf").expect("key");
                let expires = rollcall::Timestamp::now().saturating_add(Duration::from_secs(3600 + 60 * i));
                states
                    .write(&key, Expected::Any, Codec::Raw, &[b'p'; 50 * 1024], Some(expires))
                    .await
                    .expect("state write");
            }
        }
        println!("ready");
        std::future::pending::<()>().await;
        drop((silo, reminders));
    });
}

/// The dashboard in a real browser, as an operator leaves it open: headless
/// Chromium (through ChromeDriver and the WebDriver protocol) loads
/// `rollcall dashboard` against three silo processes on Redis that run a
/// reminder service and keep actor state ([`dashboard_child_silo`]). Before a
/// crash the page shows the 3 Active rows, the shard map (16 shards owned,
/// by more than one silo), the reminders per kind (with the paused one), the
/// next due and paused reminders, parked occurrences, the runs of a reminder
/// clicked in the page, actor state per kind in KiB/MiB, and the charts with
/// their units (memory in MiB, tick lateness in ms or s); no number on the
/// page is in exponent notation. Then the silo holding the most shards is
/// SIGKILLed, and the page, never reloaded, shows it Dead, its shards fenced,
/// and then every shard owned by the survivors. The screenshot is taken while
/// the shards are fenced, into `$CARGO_TARGET_TMPDIR/dashboard.png` (and
/// `ROLLCALL_SCREENSHOT` when set: `docs/dashboard.png`, the README's picture).
#[cfg(feature = "redis")]
#[test]
fn dashboard_for_operators_in_a_real_browser_through_a_crash() {
    use fantoccini::ClientBuilder;
    use std::process::Stdio;
    use std::time::{Duration, Instant};

    let Some((chromium, driver)) = browser_paths() else {
        return;
    };
    let Some((rt, backend)) = redis_fixture() else {
        return;
    };
    let store = backend.endpoint.clone();
    let cluster = rollcall_tests::unique_id("dash");
    let ports: Vec<u16> = (0..3)
        .map(|_| rollcall_tests::fixtures::free_port().unwrap())
        .collect();
    let mut procs = Procs(Vec::new());
    for (i, port) in ports.iter().enumerate() {
        let log = std::fs::File::create(log_path(&cluster, *port)).expect("child log");
        procs.0.push(
            std::process::Command::new(std::env::current_exe().expect("test binary"))
                .args([
                    "--exact",
                    "observability::dashboard_child_silo",
                    "--ignored",
                    "--nocapture",
                ])
                .env(
                    "ROLLCALL_DASHBOARD_CHILD",
                    format!("{store} {cluster} {port} {}", u8::from(i == 0)),
                )
                .stdin(Stdio::null())
                .stdout(log.try_clone().expect("log"))
                .stderr(log)
                .spawn()
                .expect("spawn a dashboard child silo"),
        );
    }
    let started = Instant::now();
    while active(&status(&store, &cluster).1) < 3 {
        assert!(
            started.elapsed() < Duration::from_secs(60),
            "the 3 child silos never became Active"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let web_port = rollcall_tests::fixtures::free_port().unwrap();
    procs.0.push(
        rollcall()
            .args([
                "dashboard",
                "--store",
                &store,
                "--cluster",
                &cluster,
                "--interval",
                "200ms",
            ])
            .args(["--state-service", "dash-state"])
            .args(["--listen", &format!("127.0.0.1:{web_port}")])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn rollcall dashboard"),
    );
    let driver_port = rollcall_tests::fixtures::free_port().unwrap();
    procs.0.push(
        std::process::Command::new(&driver)
            .arg(format!("--port={driver_port}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn chromedriver"),
    );
    wait_for_port(web_port, "rollcall dashboard");
    wait_for_port(driver_port, "chromedriver");
    let profile = tempfile::tempdir().expect("profile dir");
    let screenshot = std::path::Path::new(env!("CARGO_TARGET_TMPDIR")).join("dashboard.png");

    rt.block_on(async {
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({
                "binary": chromium,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-quic", "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--window-size=1400,2900",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            }),
        );
        let client = ClientBuilder::new(hyper_util::client::legacy::connect::HttpConnector::new())
            .capabilities(caps)
            .connect(&format!("http://127.0.0.1:{driver_port}"))
            .await
            .expect("start a headless Chromium session");
        client
            .goto(&format!("http://127.0.0.1:{web_port}/"))
            .await
            .expect("load the dashboard");
        // A marker that a reload would wipe.
        client
            .execute("window.rollcallMarker = 42; return 1;", vec![])
            .await
            .expect("set the marker");
        // Reads run as one script each: the live updates replace elements, so
        // an element found first can be stale by the time it is read.
        let js = |script: String| {
            let client = client.clone();
            async move {
                client
                    .execute(&script, vec![])
                    .await
                    .unwrap_or_else(|e| panic!("{script}: {e}"))
            }
        };
        let count = |css: &str| js(format!("return document.querySelectorAll(\"{css}\").length;"));
        let inner = |css: &str| {
            js(format!(
                "const e = document.querySelector(\"{css}\"); return e ? e.innerText : '';"
            ))
        };
        async fn wait<F, Fut>(what: &str, within: Duration, mut check: F) -> String
        where
            F: FnMut() -> Fut,
            Fut: std::future::Future<Output = Result<(), String>>,
        {
            let start = Instant::now();
            loop {
                match check().await {
                    Ok(()) => return what.to_owned(),
                    Err(last) => assert!(start.elapsed() < within, "{what}: not within {within:?}: {last}"),
                }
                tokio::time::sleep(Duration::from_millis(100)).await;
            }
        }
        let as_u64 = |v: serde_json::Value| v.as_u64().unwrap_or(0);
        let as_text = |v: serde_json::Value| v.as_str().unwrap_or_default().to_owned();

        // Before the crash: every view.
        wait("3 Active rows", Duration::from_secs(20), || async {
            let n = as_u64(count("#silos tbody tr[data-status='Active']").await);
            (n == 3).then_some(()).ok_or(format!("{n} Active"))
        })
        .await;
        wait("16 shards owned by more than one silo", Duration::from_secs(30), || async {
            let owned = as_u64(count("#shard-map .shard[data-state='owned']").await);
            let holders = as_u64(count("#shard-holders span").await);
            (owned == 16 && holders >= 2)
                .then_some(())
                .ok_or(format!("{owned} owned, {holders} holders: {}", as_text(inner("#shard-map").await)))
        })
        .await;
        wait("the reminders per kind, paused and parked", Duration::from_secs(40), || async {
            let kinds = as_text(inner("#reminder-kinds").await);
            let paused = as_text(inner("#reminder-paused").await);
            let parked = as_text(inner("#parked-total").await);
            let next = as_u64(count("#reminder-next tbody tr.pick[data-actor^='cart/']").await);
            let ok = kinds.contains(&format!("cart\t{DASH_CARTS}\t1"))
                && kinds.contains("invoice\t10\t0")
                && kinds.contains("report\t1\t0")
                && kinds.contains("flaky\t3\t0")
                && paused.contains("cart/0\trefresh")
                && !parked.is_empty()
                && !parked.starts_with("0 ")
                && parked != "-"
                && next > 0;
            ok.then_some(()).ok_or(format!("kinds {kinds:?} paused {paused:?} parked {parked:?} next {next}"))
        })
        .await;
        // The runs of one reminder, picked in the page (a click in the page's
        // own script: the rows are redrawn every second, so an element found
        // through WebDriver can be gone by the time it is clicked).
        let clicked = js("const r = document.querySelector(\"#reminder-next tbody tr.pick[data-actor^='cart/']\"); \
             if (!r) return false; r.click(); return true;"
            .into())
        .await;
        assert_eq!(clicked, serde_json::Value::Bool(true), "a cart reminder due next to click");
        wait("its runs", Duration::from_secs(20), || async {
            let runs = as_text(inner("#runs").await);
            (runs.contains("\tok\t") && runs.contains("127.0.0.1:"))
                .then_some(())
                .ok_or(format!("runs {runs:?}"))
        })
        .await;
        wait("actor state per kind", Duration::from_secs(40), || async {
            let cart = as_text(inner("#state-kinds tr[data-kind='cart']").await);
            let invoice = as_text(inner("#state-kinds tr[data-kind='invoice']").await);
            // 20 cart states of 1 KiB (i² + 1) each: 2,490 KiB in all.
            (cart.contains("cart\t20\t2.4 MiB") && cart.contains("cart/19#profile 362 KiB")
                && invoice.contains("invoice\t10\t500 KiB") && invoice.contains("10: invoice/0#pdf in "))
                .then_some(())
                .ok_or(format!("cart {cart:?} invoice {invoice:?}"))
        })
        .await;
        wait("the charts with their units", Duration::from_secs(40), || async {
            let memory = as_text(inner("#charts .chart[data-statistic='memory_bytes'] .scale .top").await);
            let late = as_text(inner("#charts .chart[data-statistic='tick_lateness_p99_ms'] .scale .top").await);
            let axis = as_text(inner("#charts .chart[data-statistic='tick_lateness_p99_ms'] .time-axis").await);
            let lines = as_u64(count("#charts .chart svg polyline").await);
            (memory.ends_with(" MiB") && (late.ends_with(" ms") || late.ends_with(" s")) && axis.contains("UTC") && lines >= 6)
                .then_some(())
                .ok_or(format!("memory {memory:?} lateness {late:?} axis {axis:?} {lines} series"))
        })
        .await;
        // JavaScript writes an exponent with its sign (`1e+21`, `2.5e-7`); the
        // cluster id's hex suffix may hold `1e2`.
        let exponent = "const t = document.body.innerText; const m = /\\d[eE][+-]\\d|NaN|undefined|Infinity/.exec(t); return m ? t.slice(Math.max(0, m.index - 60), m.index + 20) : '';";
        assert_eq!(as_text(js(exponent.into()).await), "", "a raw number on the page");

        // The crash: the silo holding the most shards.
        let holders: Vec<String> = js(
            "return [...document.querySelectorAll('#shard-map .shard')].map((s) => s.innerText.split('\\n')[1] || '');"
                .into(),
        )
        .await
        .as_array()
        .cloned()
        .unwrap_or_default()
        .into_iter()
        .map(as_text)
        .collect();
        let victim = (0..3)
            .max_by_key(|i| holders.iter().filter(|h| **h == format!("127.0.0.1:{}", ports[*i])).count())
            .expect("three");
        let victim_address = format!("127.0.0.1:{}", ports[victim]);
        procs.0[victim].kill().expect("SIGKILL a silo");
        wait("the Dead row and its shards taken over", Duration::from_secs(30), || async {
            let dead = as_text(inner("#silos tbody tr[data-status='Dead']").await);
            let moved = as_u64(count("#shard-map .shard[data-state='taken_over']").await);
            let map = as_text(inner("#shard-map").await);
            (dead.contains(&victim_address) && moved > 0 && map.contains(&format!("from {victim_address}, ")))
                .then_some(())
                .ok_or(format!("dead {dead:?}, {moved} taken over; victim {victim_address}: {map:?}"))
        })
        .await;
        let png = client.screenshot().await.expect("screenshot");
        std::fs::write(&screenshot, &png).expect("write the screenshot");
        if let Some(path) = std::env::var_os("ROLLCALL_SCREENSHOT") {
            std::fs::write(path, &png).expect("write ROLLCALL_SCREENSHOT");
        }
        wait("every shard held by the survivors", Duration::from_secs(40), || async {
            let owned = as_u64(count("#shard-map .shard[data-state='owned'], #shard-map .shard[data-state='taken_over']").await);
            let holders = as_text(js("return [...document.querySelectorAll('#shard-map .shard')].map((s) => s.innerText.split('\\n')[1] || '').join(' ');".into()).await);
            let map = as_text(inner("#shard-map").await);
            (owned == 16 && !holders.contains(&victim_address))
                .then_some(())
                .ok_or(format!("{owned} owned: {map}"))
        })
        .await;
        let marker = js("return window.rollcallMarker === 42;".into()).await;
        assert_eq!(marker, serde_json::Value::Bool(true), "the page was reloaded");
        client.close().await.expect("close the browser");
    });
    assert!(std::fs::metadata(&screenshot).map(|m| m.len()).unwrap_or(0) > 10_000);
}
