//! `rollcall reminders` against silo processes.

use super::*;

/// Runs a command: (success, stdout, stderr).
#[cfg(feature = "redis")]
fn outcome(cmd: &mut Command) -> (bool, String, String) {
    let out = cmd.output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `rollcall reminders ARGS --store STORE --service SERVICE`.
#[cfg(feature = "redis")]
fn reminders_cmd(store: &str, service: &str, args: &[&str]) -> (bool, String, String) {
    outcome(
        rollcall()
            .arg("reminders")
            .args(args)
            .args(["--store", store, "--service", service]),
    )
}

/// `rollcall reminders` lists a service's reminders with their owner in the
/// cluster's membership, next tick, schedule (a period, once, a cron expression
/// in a zone with an end) and policies.
#[cfg(feature = "redis")]
#[test]
fn redis_reminders_lists_rows_with_their_owner() {
    use rollcall::{MembershipEntry, MissedTickPolicy, ProtocolMode, ReminderEntry, SiloStatus, Timestamp};
    let Some((rt, backend)) = redis_fixture() else {
        return;
    };
    let service = rollcall_tests::unique_id("cli-rem");
    let silo: rollcall::SiloAddress = "127.0.0.1:4100@7".parse().unwrap();
    rt.block_on(async {
        let store = rollcall::connect(&backend.endpoint).await.unwrap();
        let table = store.membership_table(&service, ProtocolMode::Extended).unwrap();
        table.init(true).await.unwrap();
        let v = table.read_all().await.unwrap().version.next();
        let row = MembershipEntry::new(silo, SiloStatus::Active, Timestamp::now());
        assert!(table.insert_row(&row, &v).await.unwrap());
        let reminders = store.reminder_table(&service).unwrap();
        let start = Timestamp::now();
        let mut periodic = ReminderEntry::new(
            &service,
            "cart/1",
            "expire",
            start,
            Some(std::time::Duration::from_secs(90)),
        );
        periodic.missed_tick_policy = MissedTickPolicy::FireOnce;
        reminders.upsert_row(&periodic).await.unwrap();
        let once = ReminderEntry::new(&service, "cart/2", "ping", start, None);
        reminders.upsert_row(&once).await.unwrap();
        let mut cron = ReminderEntry::new(&service, "cart/3", "report", start, None);
        cron.cron = Some("0 9 * * MON-FRI".into());
        cron.zone = Some("Europe/Paris".into());
        cron.end_at = Some(Timestamp::from_millis(4_102_444_800_000)); // 2100-01-01
        cron.retry = Some(rollcall::RetryPolicy {
            max_retries: 3,
            first_delay: std::time::Duration::from_secs(1),
            max_delay: std::time::Duration::from_secs(30),
            park: true,
        });
        reminders.upsert_row(&cron).await.unwrap();
    });
    let out = rollcall()
        .args(["reminders", "--store", &backend.endpoint, "--service", &service])
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.starts_with(&format!("service {service}: 3 reminders, 1 owning silos")),
        "{stdout}"
    );
    let lines: Vec<&str> = stdout.lines().skip(2).collect();
    assert_eq!(lines.len(), 3, "{stdout}");
    assert!(
        lines.iter().all(|l| l.contains("127.0.0.1:4100@7")),
        "owner column: {stdout}"
    );
    let periodic = lines.iter().find(|l| l.starts_with("cart/1")).expect("cart/1");
    assert!(
        periodic.contains("1m 30s") && periodic.contains("FireOnce"),
        "{periodic}"
    );
    // The next three occurrences, 90 s apart (`--next` defaults to 3).
    assert_eq!(periodic.matches(", ").count(), 2, "{periodic}");
    let once = lines.iter().find(|l| l.starts_with("cart/2")).expect("cart/2");
    assert!(once.contains("once") && once.contains("(due)"), "{once}");
    let cron = lines.iter().find(|l| l.starts_with("cart/3")).expect("cart/3");
    assert!(
        cron.contains(r#"cron "0 9 * * MON-FRI" Europe/Paris until 2100-01-01"#)
            && cron.contains("Skip, retry 3x 1s..30s then park"),
        "{cron}"
    );
}

/// `rollcall state get` prints a JSON state pretty with its etag, another codec
/// as its size; `rollcall state list` lists the states of one actor kind.
#[cfg(feature = "redis")]
#[test]
fn redis_state_get_and_list_print_the_stored_states() {
    use rollcall::state::{Codec, Expected, StateKey, StateStorage};
    let Some((rt, backend)) = redis_fixture() else {
        return;
    };
    let service = rollcall_tests::unique_id("cli-state");
    let etag = rt.block_on(async {
        let store = rollcall::connect(&backend.endpoint).await.unwrap();
        let s = StateStorage::new(store.state_table(&service).unwrap());
        let k = StateKey::new("cart/7", "cart").unwrap();
        let e = s
            .write(
                &k,
                Expected::Absent,
                Codec::Json,
                br#"{"items":["apple"],"n":2}"#,
                None,
            )
            .await
            .unwrap();
        let raw = StateKey::new("cart/8", "blob").unwrap();
        s.write(&raw, Expected::Absent, Codec::Raw, &[0, 1, 2], None)
            .await
            .unwrap();
        let dog = StateKey::new("dog/1", "s").unwrap();
        s.write(&dog, Expected::Absent, Codec::Json, b"1", None)
            .await
            .unwrap();
        e
    });
    let run = |args: &[&str]| {
        // As the issue spells it: the subcommand first, then the store and service.
        let out = rollcall()
            .args([
                "state",
                args[0],
                "--store",
                &backend.endpoint,
                "--service",
                &service,
            ])
            .args(&args[1..])
            .output()
            .unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    let got = run(&["get", "--actor", "cart/7", "--name", "cart"]);
    assert!(got.contains(&format!("etag {etag}")), "{got}");
    assert!(
        got.contains("\"items\": [\n    \"apple\"\n  ]"),
        "pretty JSON: {got}"
    );
    let got = run(&["get", "--actor", "cart/8", "--name", "blob"]);
    assert!(got.contains("3 bytes, codec Raw"), "{got}");
    let got = run(&["get", "--actor", "cart/9", "--name", "none"]);
    assert!(got.contains("no record"), "{got}");
    let got = run(&["list", "--actor-kind", "cart"]);
    assert_eq!(
        got.lines().collect::<Vec<_>>(),
        ["cart/7#cart", "cart/8#blob"],
        "{got}"
    );
    // A header damaged in the store: `get` says corrupt, `delete` removes it
    // anyway, and the state can be written from scratch.
    let store = rt.block_on(rollcall::connect(&backend.endpoint)).unwrap();
    let s = StateStorage::new(store.state_table(&service).unwrap());
    let k = StateKey::new("cart/7", "cart").unwrap();
    rt.block_on(s.table().commit(
        &[rollcall::state::HeaderWrite {
            key: &k,
            expected: Expected::Any,
            header: Some(b"{not a header"),
            generation: "g",
            chunks: Vec::new(),
            expires_at: None,
        }],
        None,
    ))
    .unwrap();
    let out = rollcall()
        .args([
            "state",
            "get",
            "--store",
            &backend.endpoint,
            "--service",
            &service,
        ])
        .args(["--actor", "cart/7", "--name", "cart"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    assert!(String::from_utf8_lossy(&out.stderr).contains("corrupt"));
    let got = run(&["delete", "--actor", "cart/7", "--name", "cart"]);
    assert!(got.contains("cart/7#cart: deleted"), "{got}");
    rt.block_on(async {
        let r = s.read(&k).await.expect("no longer corrupt");
        assert!(!r.record_exists && r.etag.is_none());
        s.write(&k, Expected::Absent, Codec::Json, b"{}", None)
            .await
            .expect("a first write again");
    });
}

/// `rollcall reminders export` then `import` moves a service's reminders
/// (periodic, one-shot, cron in a zone with an end, a payload and a retry
/// policy) into another service whole; an import with a bad line exits non-zero
/// naming the line and writes nothing.
#[cfg(feature = "redis")]
#[test]
fn redis_reminders_export_then_import_moves_every_row() {
    use rollcall::{ReminderEntry, RetryPolicy, Timestamp};
    let Some((rt, backend)) = redis_fixture() else {
        return;
    };
    let (from, to, refused) = (
        rollcall_tests::unique_id("cli-exp"),
        rollcall_tests::unique_id("cli-imp"),
        rollcall_tests::unique_id("cli-bad"),
    );
    let store = rt.block_on(rollcall::connect(&backend.endpoint)).unwrap();
    let start = Timestamp::from_millis(1_795_000_000_000);
    let mut rows = vec![
        ReminderEntry::new(
            &from,
            "cart/1",
            "expire",
            start,
            Some(std::time::Duration::from_secs(90)),
        ),
        ReminderEntry::new(&from, "cart/2", "ping", start, None),
    ];
    let mut cron = ReminderEntry::new(&from, "cart/ü", "report", start, None);
    cron.cron = Some("0 9 * * MON-FRI".into());
    cron.zone = Some("Europe/Paris".into());
    cron.end_at = Some(Timestamp::from_millis(4_102_444_800_000));
    cron.payload = Some(vec![0, 1, 255]);
    cron.retry = Some(RetryPolicy::DROP);
    rows.push(cron);
    rt.block_on(async {
        let table = store.reminder_table(&from).unwrap();
        for r in &rows {
            table.upsert_row(r).await.unwrap();
        }
    });
    let dir = tempfile::tempdir().unwrap();
    let file = dir.path().join("reminders.jsonl");
    let run = |args: &[&str]| outcome(rollcall().args(args));
    let file_arg = file.to_str().unwrap();
    let (ok, _, err) = run(&[
        "reminders",
        "export",
        "--store",
        &backend.endpoint,
        "--service",
        &from,
        "--file",
        file_arg,
    ]);
    assert!(ok, "{err}");
    assert_eq!(std::fs::read_to_string(&file).unwrap().lines().count(), 3);
    let (ok, out, err) = run(&[
        "reminders",
        "import",
        "--store",
        &backend.endpoint,
        "--service",
        &to,
        "--file",
        file_arg,
    ]);
    assert!(ok && out.contains("imported 3 reminders"), "{out}{err}");
    let moved = rt
        .block_on(store.reminder_table(&to).unwrap().read_rows_in_range(0, 0))
        .unwrap();
    assert_eq!(moved.len(), 3);
    for r in &rows {
        let m = moved
            .iter()
            .find(|m| m.actor_id == r.actor_id && m.name == r.name)
            .expect("every row moved");
        assert_eq!(
            *m,
            ReminderEntry {
                service_id: to.clone(),
                etag: m.etag.clone(),
                ..r.clone()
            }
        );
    }
    // A bad third line: nothing of the file is written.
    let mut text = std::fs::read_to_string(&file).unwrap();
    text = text.lines().take(2).collect::<Vec<_>>().join("\n") + "\n{\"actor_id\": 7}\n";
    std::fs::write(&file, text).unwrap();
    let (ok, _, err) = run(&[
        "reminders",
        "import",
        "--store",
        &backend.endpoint,
        "--service",
        &refused,
        "--file",
        file_arg,
    ]);
    assert!(!ok && err.contains("line 3"), "{err}");
    let none = rt
        .block_on(store.reminder_table(&refused).unwrap().read_rows_in_range(0, 0))
        .unwrap();
    assert!(none.is_empty(), "a refused import writes nothing");
}

/// `rollcall reminders --kind K` pages one kind (following the printed
/// `--after` token to the last page), and `reminders delete --kind K` removes
/// exactly that kind; running it again removes nothing; a bad kind or a
/// delete without a filter is refused.
#[cfg(feature = "redis")]
#[test]
fn redis_reminders_page_and_delete_by_kind() {
    use rollcall::{ReminderEntry, Timestamp};
    let Some((rt, backend)) = redis_fixture() else {
        return;
    };
    let service = rollcall_tests::unique_id("cli-kind");
    let store = rt.block_on(rollcall::connect(&backend.endpoint)).unwrap();
    let start = Timestamp::from_millis(1_795_000_000_000);
    let period = Some(std::time::Duration::from_secs(90));
    rt.block_on(async {
        let table = store.reminder_table(&service).unwrap();
        for i in 0..250 {
            let r = ReminderEntry::new(&service, format!("cart/{i}"), "expire", start, period);
            table.upsert_row(&r).await.unwrap();
        }
        for i in 0..20 {
            let r = ReminderEntry::new(&service, format!("carton/{i}"), "expire", start, period);
            table.upsert_row(&r).await.unwrap();
        }
    });
    let run = |args: &[&str]| reminders_cmd(&backend.endpoint, &service, args);
    let (mut carts, mut after, mut pages) = (std::collections::BTreeSet::new(), None::<String>, 0);
    loop {
        let mut args = vec!["list", "--kind", "cart", "--limit", "100"];
        if let Some(t) = &after {
            args.extend_from_slice(&["--after", t]);
        }
        let (ok, out, err) = run(&args);
        assert!(ok, "{out}{err}");
        pages += 1;
        for line in out.lines().skip(2).filter(|l| l.starts_with("cart")) {
            let actor = line.split_whitespace().next().unwrap().to_owned();
            assert!(actor.starts_with("cart/"), "{line}");
            assert!(carts.insert(actor), "listed twice: {line}");
        }
        match out.lines().last() {
            Some(l) if l.starts_with("next page: --after ") => {
                after = Some(l.trim_start_matches("next page: --after ").to_owned());
            }
            Some("last page") => break,
            other => panic!("no page line: {other:?}\n{out}"),
        }
        assert!(pages < 10, "{out}");
    }
    assert_eq!(carts.len(), 250);
    assert!(pages >= 3, "pages of 100: {pages}");

    let (ok, out, err) = run(&["delete", "--kind", "cart"]);
    assert!(ok, "{out}{err}");
    assert!(out.starts_with("removed 250 reminders of `cart/*`"), "{out}");
    let (ok, out, _) = run(&["delete", "--kind", "cart"]);
    assert!(ok && out.starts_with("removed 0 reminders"), "{out}");
    let left = rt
        .block_on(store.reminder_table(&service).unwrap().read_rows_in_range(0, 0))
        .unwrap();
    assert_eq!(left.len(), 20);
    assert!(left.iter().all(|r| r.actor_id.starts_with("carton/")));
    let (ok, _, err) = run(&["delete"]);
    assert!(!ok && err.contains("needs --kind or --prefix"), "{err}");
    let (ok, _, err) = run(&["list", "--kind", "a/b"]);
    assert!(!ok && err.contains("--kind `a/b`"), "{err}");
    let (ok, _, err) = run(&["list", "--after", "garbage!"]);
    assert!(!ok && err.contains("page token"), "{err}");
}

/// `rollcall reminders pause|resume|trigger ACTOR NAME` writes the paused
/// column (the etag stays) or a trigger row in the store and says whom it
/// told (no silo runs here: nobody holds the shard); again is a no-op; a
/// missing reminder or a bad actor is refused.
#[cfg(feature = "redis")]
#[test]
fn redis_reminders_pause_resume_and_trigger_one_reminder() {
    use rollcall::{ReminderEntry, Timestamp};
    let Some((rt, backend)) = redis_fixture() else {
        return;
    };
    let service = rollcall_tests::unique_id("cli-pause");
    let store = rt.block_on(rollcall::connect(&backend.endpoint)).unwrap();
    let table = store.reminder_table(&service).unwrap();
    let mut row = ReminderEntry::new(
        &service,
        "cart/1",
        "expire",
        Timestamp::from_millis(1_795_000_000_000),
        Some(std::time::Duration::from_secs(90)),
    );
    row.payload = Some(b"p".to_vec());
    let etag = rt.block_on(table.upsert_row(&row)).unwrap();
    let run = |args: &[&str]| reminders_cmd(&backend.endpoint, &service, args);
    let read = || rt.block_on(table.read_row("cart/1", "expire")).unwrap().unwrap();

    let (ok, out, err) = run(&["pause", "cart/1", "expire"]);
    assert!(ok, "{out}{err}");
    assert!(
        out.starts_with("paused cart/1 expire; no silo holds its shard"),
        "{out}"
    );
    let paused = read();
    assert!(paused.paused.is_some());
    assert_eq!(paused.etag, etag, "a pause keeps the registration");
    let (ok, out, _) = run(&["pause", "cart/1", "expire"]);
    assert!(ok && out.contains("already paused"), "{out}");

    let (ok, out, err) = run(&["trigger", "cart/1", "expire"]);
    assert!(
        ok && out.starts_with("triggered cart/1 expire as `expire#trigger-"),
        "{out}{err}"
    );
    let rows = rt.block_on(table.read_rows_for("cart/1")).unwrap();
    let trigger = rows
        .iter()
        .find(|r| r.trigger_of.is_some())
        .expect("a trigger row");
    assert_eq!(trigger.trigger_of.as_deref(), Some("expire"));
    assert_eq!(
        (trigger.period, trigger.payload.as_deref()),
        (None, Some(&b"p"[..]))
    );

    let (ok, out, err) = run(&["resume", "cart/1", "expire"]);
    assert!(ok && out.starts_with("resumed cart/1 expire"), "{out}{err}");
    assert_eq!((read().paused, read().etag), (None, etag));

    // `history` prints the runs newest first, with lateness and outcome.
    for (i, outcome) in [rollcall::RunOutcome::Ok, rollcall::RunOutcome::Parked]
        .into_iter()
        .enumerate()
    {
        let record = rollcall::RunRecord {
            scheduled: Timestamp::from_millis(1_795_000_000_000 + i as u64 * 90_000),
            at: Timestamp::from_millis(1_795_000_000_250 + i as u64 * 90_000),
            attempts: 1 + i as u32,
            outcome,
            silo: "127.0.0.1:4100@7".into(),
            triggered: false,
        };
        rt.block_on(table.append_run("cart/1", "expire", &record, 20, None))
            .unwrap();
    }
    let (ok, out, err) = run(&["history", "cart/1", "expire"]);
    assert!(ok, "{out}{err}");
    let lines: Vec<&str> = out.lines().collect();
    assert_eq!(
        lines[0], "reminder expire of cart/1: 2 runs, newest first",
        "{out}"
    );
    assert!(
        lines[2].contains("parked") && lines[2].contains("250ms") && lines[2].contains("127.0.0.1:4100@7"),
        "{out}"
    );
    assert!(
        lines[3].contains(" ok") && lines[3].contains("2026-11-18T"),
        "{out}"
    );
    let (ok, _, err) = run(&["pause", "cart/2", "expire"]);
    assert!(!ok && err.contains("no reminder `expire` of cart/2"), "{err}");
    let (ok, _, err) = run(&["pause", "nokind", "expire"]);
    assert!(!ok && err.contains("nokind"), "{err}");
    let (ok, _, err) = run(&["pause"]);
    assert!(!ok && err.contains("needs ACTOR and NAME"), "{err}");
}
