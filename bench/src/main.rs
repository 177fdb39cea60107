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
    /// Every benchmark that exists (today: T1).
    All(t1::Args),
    /// T1: table operations per provider next to the backend's raw write and raw
    /// conditional write through the same client library.
    T1(t1::Args),
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
        Cmd::All(args) | Cmd::T1(args) => rt.block_on(t1::run(args)),
    }
}

/// Where a report goes by default: the workspace root.
pub(crate) fn workspace_file(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(name)
}
