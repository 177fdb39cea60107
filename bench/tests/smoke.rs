//! A smoke run of the benchmark command (milliseconds per op), so the bench code
//! cannot rot: every provider measured, every op next to its references.

/// Runs `rollcall-bench args --out md --json json` and asserts it succeeded.
fn run_bench(args: &[&str], md: &std::path::Path, json: &std::path::Path) {
    let out = std::process::Command::new(env!("CARGO_BIN_EXE_rollcall-bench"))
        .args(args)
        .arg("--out")
        .arg(md)
        .arg("--json")
        .arg(json)
        .output()
        .expect("run rollcall-bench");
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
}

#[test]
fn smoke_run_reports_every_provider_with_ratios() {
    let dir = std::env::temp_dir().join(rollcall_tests::unique_id("bench-smoke"));
    std::fs::create_dir_all(&dir).unwrap();
    let (md, json) = (dir.join("BENCHMARKS.md"), dir.join("benchmarks.json"));
    run_bench(
        &["t1", "--seconds", "0.02", "--rounds", "1", "--clients", "1"],
        &md,
        &json,
    );
    let report = std::fs::read_to_string(&md).unwrap();
    for heading in [
        "### memory",
        "### redis",
        "### etcd",
        "### redis-replicated",
        "### redis-replicated: `wait_replicas=1` next to the same writes without it",
        "### Goals",
    ] {
        assert!(report.contains(heading), "{heading} missing:\n{report}");
    }
    let parsed: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let cells = parsed["t1"].as_array().unwrap();
    // 4 providers x 9 ops, plus references (memory: raw write; Redis: raw write,
    // raw conditional write, the row-shaped MULTI, raw read script; etcd: raw
    // write, raw conditional write, the row-shaped Txn) and `update_row` with
    // history=0 on Redis and etcd; on the replicated Redis the references of
    // Redis and 3 writes again with `wait_replicas=1`.
    assert_eq!(
        cells.len(),
        10 + (9 + 4 + 1) + (9 + 3 + 1) + (9 + 4 + 3),
        "{parsed:#}"
    );
    for shape in ["raw MULTI of update_row's shape", "raw Txn of update_row's shape"] {
        assert!(
            cells
                .iter()
                .any(|c| c["op"].as_str().is_some_and(|o| o.starts_with(shape))),
            "{shape} measured: {parsed:#}"
        );
    }
    assert!(
        report.contains("<= 1.3 x the raw read script"),
        "the read_all decoding goal is reported:\n{report}"
    );
    for c in cells {
        assert!(c["samples"].as_u64().unwrap() > 0, "{c}");
        assert!(c["vs_raw_write"].as_f64().unwrap() > 0.0, "{c}");
    }
    // R1 adds its section and key to the same reports, keeping T1's.
    run_bench(
        &[
            "r1",
            "--counts",
            "300",
            "--rate",
            "300",
            "--seconds",
            "1",
            "--concurrency",
            "8",
        ],
        &md,
        &json,
    );
    let report = std::fs::read_to_string(&md).unwrap();
    assert!(
        report.contains("### memory") && report.contains("## R1"),
        "{report}"
    );
    let parsed: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(parsed["t1"].is_array(), "T1 kept");
    let rows = parsed["r1"].as_array().unwrap();
    assert_eq!(rows.len(), 2, "memory and redis: {parsed:#}");
    for r in rows {
        assert!(r["registrations_per_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(r["raw_upserts_per_s"].as_f64().unwrap() > 0.0, "{r}");
        assert!(
            r["ticks_per_s"].as_f64().unwrap() > 0.0,
            "every reminder ticks: {r}"
        );
    }
    // R2: one kill per provider on a small table.
    run_bench(&["r2", "--counts", "300", "--runs", "1"], &md, &json);
    let report = std::fs::read_to_string(&md).unwrap();
    assert!(report.contains("## R1") && report.contains("## R2"), "{report}");
    let parsed: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let runs = parsed["r2"].as_array().unwrap();
    assert_eq!(runs.len(), 2, "memory and redis: {parsed:#}");
    for r in runs {
        let (detection, failover) = (
            r["detection_s"].as_f64().unwrap(),
            r["failover_s"].as_f64().unwrap(),
        );
        assert!(detection > 0.0 && failover > 0.0, "{r}");
        assert!(
            r["orphaned"].as_u64().unwrap() > 0,
            "the victim held reminders: {r}"
        );
    }
    // R4: a start, a join, a leave and a crash in a small cluster in 2 silo
    // processes on Redis: the child-process mode of the 100-silo rows (with the
    // fast profile, to keep it short); the children run the same silos as a
    // cluster in one process (`Local`).
    run_bench(
        &[
            "r4",
            "--providers",
            "redis",
            "--silos",
            "4",
            "--shards",
            "64",
            "--count",
            "400",
            "--probes",
            "100",
            "--processes",
            "2",
            "--process-from",
            "4",
            "--fast-processes",
        ],
        &md,
        &json,
    );
    let parsed: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let changes = parsed["r4"].as_array().unwrap();
    assert_eq!(changes.len(), 4, "start, join, leave, crash: {parsed:#}");
    for c in changes {
        assert_eq!(c["processes"], 2, "in 2 processes: {c}");
        assert_eq!(c["shards"], 64, "{c}");
        assert!(c["spread"].as_f64().unwrap() >= 1.0, "{c}");
        assert!(c["lease_writes"].as_i64().unwrap() > 0, "shards moved: {c}");
        if c["kind"] == "start" {
            continue;
        }
        assert!(c["moved"].as_u64().unwrap() > 0, "probes moved: {c}");
    }
    // R5: three silo processes on Redis, a small load and a small burst.
    run_bench(
        &[
            "r5",
            "--count",
            "600",
            "--rate",
            "300",
            "--seconds",
            "1",
            "--burst",
            "600",
            "--burst-lead",
            "4",
            "--providers",
            "redis",
        ],
        &md,
        &json,
    );
    let parsed: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let r5 = &parsed["r5"][0];
    assert_eq!(r5["provider"], "redis", "{parsed:#}");
    for key in [
        "creations_per_s",
        "raw_sets_per_s",
        "ticks_per_s",
        "burst_ticks_per_s",
    ] {
        assert!(r5[key].as_f64().is_some_and(|v| v > 0.0), "{key}: {r5}");
    }
    // T1 again: its section is replaced, the others stay.
    run_bench(
        &[
            "t1",
            "--seconds",
            "0.02",
            "--rounds",
            "1",
            "--clients",
            "1",
            "--providers",
            "memory",
        ],
        &md,
        &json,
    );
    let report = std::fs::read_to_string(&md).unwrap();
    assert!(report.contains("## R1") && report.contains("## R2"), "{report}");
    assert!(
        !report.contains("### redis"),
        "the T1 section was replaced: {report}"
    );
    assert_eq!(report.matches("## T1").count(), 1, "{report}");
    // Each section added by a benchmark says the commit it was measured at.
    assert_eq!(
        report.matches("Measured at commit ").count(),
        4,
        "R1, R2, R4 and R5: {report}"
    );
    let parsed: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert!(
        parsed["r1"].is_array() && parsed["r2"].is_array() && parsed["r4"].is_array(),
        "{parsed:#}"
    );
    let _ = std::fs::remove_dir_all(dir);
}

/// J1, D1 and D2 on small clusters: the storms finish, every silo agrees, the
/// crash is detected with no false death, faults cause none, and each adds its
/// section.
#[test]
fn smoke_run_of_join_storms_and_detection() {
    let dir = std::env::temp_dir().join(rollcall_tests::unique_id("bench-smoke-j1"));
    std::fs::create_dir_all(&dir).unwrap();
    let (md, json) = (dir.join("BENCHMARKS.md"), dir.join("benchmarks.json"));
    run_bench(&["j1", "--silos", "30", "--redis-silos", "30"], &md, &json);
    run_bench(
        &["d1", "--sizes", "5,40", "--runs", "3", "--tcp-runs", "2"],
        &md,
        &json,
    );
    let report = std::fs::read_to_string(&md).unwrap();
    assert!(report.contains("## J1") && report.contains("## D1"), "{report}");
    let parsed: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let storms = parsed["j1"].as_array().unwrap();
    // 10 (the reference) and 30, on memory and on Redis.
    assert_eq!(storms.len(), 4, "{parsed:#}");
    for s in storms {
        assert!(s.get("failed").is_none(), "{s}");
        assert_eq!(s["all_agree"], true, "{s}");
        assert!(s["all_active_s"].as_f64().unwrap() > 0.0, "{s}");
        assert!(
            s["writes_per_join"].as_f64().unwrap() >= 2.0,
            "two commits per join: {s}"
        );
        // Real-time storms say how busy their one event loop was.
        let cpu = s.get("client_cpu_share").and_then(|c| c.as_f64());
        if s["store"] == "redis" {
            assert!(cpu.is_some_and(|c| c > 0.0 && c <= 1.05), "{s}");
        } else {
            assert!(cpu.is_none(), "virtual storms have no CPU share: {s}");
        }
    }
    // The same seed repeats a virtual-time storm exactly (all but the wall time).
    let (md2, json2) = (dir.join("again.md"), dir.join("again.json"));
    run_bench(&["j1", "--silos", "30", "--no-redis"], &md2, &json2);
    let again: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json2).unwrap()).unwrap();
    let without_wall = |s: &serde_json::Value| {
        let mut s = s.clone();
        s.as_object_mut().unwrap().remove("wall_s");
        s
    };
    let memory: Vec<_> = storms
        .iter()
        .filter(|s| s["store"] == "memory")
        .map(without_wall)
        .collect();
    let repeated: Vec<_> = again["j1"].as_array().unwrap().iter().map(without_wall).collect();
    assert_eq!(memory, repeated, "same seed, same storm");
    let detections = parsed["d1"].as_array().unwrap();
    // 5 and 40 silos in virtual time, then 5 on real TCP.
    assert_eq!(detections.len(), 3, "{parsed:#}");
    for (i, d) in detections.iter().enumerate() {
        assert_eq!(d["kills"], if i < 2 { 3 } else { 2 }, "{d}");
        assert_eq!(d["undetected"], 0, "{d}");
        assert_eq!(d["false_deaths"], 0, "{d}");
        // Virtual time only: a wall-clock time is no test assertion.
        if i < 2 {
            assert!(
                d["p99_s"].as_f64().unwrap() <= 1.2 * d["bound_s"].as_f64().unwrap(),
                "{d}"
            );
        }
    }
    // T2 on memory: the three modes (bare loop, silo backoff, real silos'
    // joins), 1 and 4 writers, every row with commits.
    run_bench(
        &[
            "t2",
            "--providers",
            "memory",
            "--writers",
            "1,4",
            "--seconds",
            "0.05",
        ],
        &md,
        &json,
    );
    let parsed: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = parsed["t2"].as_array().unwrap();
    assert_eq!(rows.len(), 6, "{parsed:#}");
    for r in rows {
        assert!(r["commits_per_s"].as_f64().unwrap() > 0.0, "{r}");
    }
    assert!(
        rows.iter()
            .any(|r| r["mode"] == "silo joins" && r["writers"] == 4),
        "{parsed:#}"
    );
    // F1: three silo processes and the reference, watched for a second.
    run_bench(&["f1", "--silos", "3", "--seconds", "1"], &md, &json);
    let parsed: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let f1 = &parsed["f1"];
    assert!(f1["silo_rss_mib"].as_f64().unwrap() > 1.0, "{f1}");
    assert!(f1["reference_rss_mib"].as_f64().unwrap() > 1.0, "{f1}");
    assert!(f1["silo_cpu_percent"].as_f64().unwrap() >= 0.0, "{f1}");
    // D2 on a small cluster for two virtual minutes per fault: no false death.
    run_bench(&["d2", "--sizes", "5", "--minutes", "2"], &md, &json);
    let report = std::fs::read_to_string(&md).unwrap();
    assert!(
        report.contains("## D1")
            && report.contains("## D2")
            && report.contains("## F1")
            && report.contains("## T2"),
        "{report}"
    );
    let parsed: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let outcomes = parsed["d2"].as_array().unwrap();
    assert_eq!(
        outcomes.len(),
        9,
        "loss, stalls, table outage, and three splits with and without the majority rule: {parsed:#}"
    );
    for o in outcomes {
        // The Orleans-rule rows are the reference: their false deaths are the point.
        if o["scenario"].as_str().is_some_and(|s| s.contains("Orleans")) {
            continue;
        }
        assert_eq!(o["false_deaths"], 0, "{o}");
        assert_eq!(o["all_active_and_agree"], true, "{o}");
    }
    let _ = std::fs::remove_dir_all(dir);
}

/// S1 runs on a real backend and reports every size with its ratios, and the
/// `PersistentState` overhead.
#[test]
fn smoke_run_of_actor_state() {
    let dir = std::env::temp_dir().join(format!("rollcall-bench-s1-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (md, json) = (dir.join("BENCHMARKS.md"), dir.join("benchmarks.json"));
    run_bench(
        &[
            "s1",
            "--providers",
            "redis,etcd",
            "--sizes",
            "1024,65536,2097152",
            "--rounds",
            "1",
            "--seconds",
            "0.05",
        ],
        &md,
        &json,
    );
    let text = std::fs::read_to_string(&md).unwrap();
    assert!(text.contains("## S1: actor state"), "{text}");
    assert!(text.contains("| redis | 2 MiB |"), "{text}");
    let parsed: serde_json::Value = serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    let rows = parsed["s1"]["rows"].as_array().unwrap();
    assert_eq!(
        rows.len(),
        5,
        "etcd skips 2 MiB (over its largest state): {rows:#?}"
    );
    assert!(rows.iter().all(|r| r["write_p50_ratio"].as_f64().unwrap() > 0.0));
    assert!(parsed["s1"]["persistent_state_overhead_bytes"].as_f64().unwrap() > 0.0);
    std::fs::remove_dir_all(&dir).unwrap();
}
