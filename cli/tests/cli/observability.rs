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

/// The dashboard in a real browser: headless Chromium (through ChromeDriver and the
/// WebDriver protocol) loads `rollcall dashboard` against three `rollcall silo`
/// processes on Redis and sees 3 Active rows; one silo is SIGKILLed and the page,
/// never reloaded, shows it Dead with the survivors' votes, the history timeline
/// shows the declaration, and the statistics charts are drawn. The screenshot goes
/// to `$CARGO_TARGET_TMPDIR/dashboard.png` (and to `ROLLCALL_SCREENSHOT` when set:
/// `docs/dashboard.png`, the guide's picture).
#[cfg(feature = "redis")]
#[test]
fn dashboard_in_a_real_browser_shows_a_killed_silo_dead_without_a_reload() {
    use fantoccini::{ClientBuilder, Locator};
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
    let (mut procs, ports, _) = start_silos_with(
        &store,
        &cluster,
        3,
        &["--metrics-period", "300ms", "--statistics-period", "300ms"],
    );
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

    // fantoccini's HTTP client is built with rustls, which wants a crypto provider.
    let _ = rustls::crypto::ring::default_provider().install_default();
    rt.block_on(async {
        let mut caps = serde_json::Map::new();
        caps.insert(
            "goog:chromeOptions".into(),
            serde_json::json!({
                "binary": chromium,
                "args": [
                    "--headless", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
                    "--disable-quic", "--no-first-run", "--disable-background-networking",
                    "--disable-component-update", "--disable-sync", "--window-size=1400,1000",
                    format!("--user-data-dir={}", profile.path().display()),
                ],
            }),
        );
        let client = ClientBuilder::rustls()
            .expect("webdriver client")
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
        let rows = |status: &'static str| {
            let client = client.clone();
            async move {
                client
                    .find_all(Locator::Css(&format!("#silos tbody tr[data-status='{status}']")))
                    .await
                    .map(|r| r.len())
                    .unwrap_or(0)
            }
        };
        let start = Instant::now();
        while rows("Active").await != 3 {
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "the page never showed 3 Active rows"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        procs.0[2].kill().expect("SIGKILL a silo");
        let killed = Instant::now();
        while rows("Dead").await != 1 {
            assert!(
                killed.elapsed() < Duration::from_secs(20),
                "the page never showed the Dead row"
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        assert_eq!(rows("Active").await, 2);
        let marker = client
            .execute("return window.rollcallMarker === 42;", vec![])
            .await
            .expect("read the marker");
        assert_eq!(marker, serde_json::Value::Bool(true), "the page was reloaded");
        // The row is read in one script (the live updates replace rows, so an
        // element found first can be stale by the time its text is read), until it
        // shows what is asserted below or 10 s pass.
        let read_start = Instant::now();
        let dead_text = loop {
            let text = client
                .execute(
                    "const r = document.querySelector(\"#silos tbody tr[data-status='Dead']\"); return r ? r.innerText : '';",
                    vec![],
                )
                .await
                .expect("read the Dead row")
                .as_str()
                .unwrap_or_default()
                .to_owned();
            let done = text.contains(&format!("127.0.0.1:{}", ports[2])) && text.contains("ago)");
            if done || read_start.elapsed() > Duration::from_secs(10) {
                break text;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        };
        assert!(
            dead_text.contains(&format!("127.0.0.1:{}", ports[2])),
            "{dead_text}"
        );
        assert!(
            dead_text.contains("ago)"),
            "the Dead row shows its votes with ages: {dead_text}"
        );
        let start = Instant::now();
        loop {
            let history = client.find(Locator::Css("#history")).await.expect("timeline");
            let text = history.text().await.unwrap_or_default();
            let charts = client
                .find_all(Locator::Css("#charts .chart svg polyline"))
                .await
                .map(|c| c.len())
                .unwrap_or(0);
            if text.contains(&format!("127.0.0.1:{}", ports[2])) && text.contains("Dead") && charts >= 4 {
                break;
            }
            assert!(
                start.elapsed() < Duration::from_secs(30),
                "no declaration in the timeline or no charts ({charts} series): {text}"
            );
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        let png = client.screenshot().await.expect("screenshot");
        std::fs::write(&screenshot, &png).expect("write the screenshot");
        if let Some(path) = std::env::var_os("ROLLCALL_SCREENSHOT") {
            std::fs::write(path, &png).expect("write ROLLCALL_SCREENSHOT");
        }
        client.close().await.expect("close the browser");
    });
    assert!(std::fs::metadata(&screenshot).map(|m| m.len()).unwrap_or(0) > 10_000);
}
