//! `rollcall-bench`: rollcall's benchmark command.
//!
//! ```sh
//! cargo run --release -p rollcall-bench -- all            # every figure; writes BENCHMARKS.md + benchmarks.json
//! cargo run --release -p rollcall-bench -- t1 --providers redis,etcd --clients 1,16
//! ```
//!
//! Every figure is reported next to a reference measured in the same run, and the
//! two are interleaved (round after round, each op for `--seconds`), so that the
//! noise of a shared machine hits both sides; the ratio is the figure to read.
//! Backends are found or started as the test command does (`ROLLCALL_REDIS_URL`,
//! `ROLLCALL_ETCD_ENDPOINTS`, ... or local `redis-server` / `etcd` processes).

mod r1;
mod t1;

use std::path::PathBuf;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(
    name = "rollcall-bench",
    about = "rollcall's benchmarks, each next to a same-run reference"
)]
struct Cli {
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Subcommand)]
enum Cmd {
    /// Every benchmark that exists (today: T1, then R1 with its defaults).
    All(t1::Args),
    /// T1: table operations per provider next to the backend's raw write and raw
    /// conditional write through the same client library.
    T1(t1::Args),
    /// R1: the reminder service at scale on one silo (registrations, ticks,
    /// lateness, bytes per reminder); adds its section to the reports.
    R1(r1::Args),
}

/// Date, commit and machine, for the report header.
pub(crate) fn provenance() -> Vec<(String, String)> {
    let run = |cmd: &str, args: &[&str]| {
        std::process::Command::new(cmd)
            .args(args)
            .output()
            .ok()
            .filter(|o| o.status.success())
            .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_owned())
            .unwrap_or_else(|| "unknown".into())
    };
    let cpu = std::fs::read_to_string("/proc/cpuinfo")
        .ok()
        .and_then(|c| {
            c.lines()
                .find(|l| l.starts_with("model name"))
                .and_then(|l| l.split(':').nth(1))
                .map(|m| m.trim().to_owned())
        })
        .unwrap_or_else(|| "unknown".into());
    vec![
        ("date (UTC)".into(), run("date", &["-u", "+%Y-%m-%d %H:%M"])),
        ("commit".into(), run("git", &["rev-parse", "--short", "HEAD"])),
        ("kernel".into(), run("uname", &["-sr"])),
        ("cpu".into(), cpu),
        (
            "cores".into(),
            std::thread::available_parallelism().map_or("unknown".into(), |n| n.to_string()),
        ),
    ]
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    match cli.cmd {
        Cmd::T1(args) => rt.block_on(t1::run(args)),
        Cmd::R1(args) => r1::run(args),
        Cmd::All(args) => {
            let (out, json) = (args.out.clone(), args.json.clone());
            rt.block_on(t1::run(args))?;
            drop(rt);
            /// R1's defaults, as `rollcall-bench r1` would parse them.
            #[derive(Parser)]
            struct Defaults {
                #[command(flatten)]
                r1: r1::Args,
            }
            let mut r1 = Defaults::parse_from(["r1"]).r1;
            r1.set_reports(out, json);
            r1::run(r1)
        }
    }
}

/// Replaces the section of `path` that starts with the line `heading` (up to the
/// next `## ` heading) with `body`, or appends it.
pub(crate) fn set_section(path: &std::path::Path, heading: &str, body: &str) -> anyhow::Result<()> {
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let mut out = String::new();
    let mut skipping = false;
    let mut replaced = false;
    for line in old.lines() {
        if line.starts_with(heading) {
            skipping = true;
            replaced = true;
            out.push_str(body);
            out.push('\n');
            continue;
        }
        if skipping && line.starts_with("## ") {
            skipping = false;
        }
        if !skipping {
            out.push_str(line);
            out.push('\n');
        }
    }
    if !replaced {
        out.push('\n');
        out.push_str(body);
    }
    std::fs::write(path, out)?;
    Ok(())
}

/// Sets `key` in the JSON object stored at `path` (created if missing).
pub(crate) fn set_json_key(
    path: &std::path::Path,
    key: &str,
    value: serde_json::Value,
) -> anyhow::Result<()> {
    let mut doc: serde_json::Value = std::fs::read_to_string(path)
        .ok()
        .and_then(|s| serde_json::from_str(&s).ok())
        .unwrap_or_else(|| serde_json::json!({}));
    doc.as_object_mut()
        .ok_or_else(|| anyhow::anyhow!("{} is not a JSON object", path.display()))?
        .insert(key.to_owned(), value);
    std::fs::write(path, serde_json::to_string_pretty(&doc)?)?;
    Ok(())
}

/// Where a report goes by default: the workspace root.
pub(crate) fn workspace_file(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(name)
}
