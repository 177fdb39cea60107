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

mod d1;
mod d2;
mod f1;
mod j1;
mod p1;
mod r1;
mod r2;
mod r4;
mod r5;
mod s1;
mod t1;
mod t2;

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
    /// Every benchmark that exists (T1, then T2, R1, R2, R4, R5, S1, P1, J1, D1, D2 and F1 with
    /// their defaults).
    All(t1::Args),
    /// T1: table operations per provider next to the backend's raw write and raw
    /// conditional write through the same client library.
    T1(t1::Args),
    /// T2: version-row contention, 1 to 64 writers on distinct rows of one table;
    /// adds its section to the reports.
    T2(t2::Args),
    /// R1: the reminder service at scale on one silo (registrations, ticks,
    /// lateness, bytes per reminder); adds its section to the reports.
    R1(r1::Args),
    /// R2: reminder failover time relative to detection time, 3 silos on real TCP;
    /// adds its section to the reports.
    R2(r2::Args),
    /// R4: what a join, a graceful leave and a crash cost the reminder service
    /// (store calls, the pause of the moved reminders) at 10 and 100 silos;
    /// adds its section to the reports.
    R4(r4::Args),
    /// One process of R4's silos: commands on stdin, answers on stdout.
    #[command(hide = true)]
    R4Silos {
        #[arg(long)]
        store: String,
        #[arg(long)]
        cluster: String,
        #[arg(long)]
        shards: u32,
        /// The fast membership profile instead of the defaults.
        #[arg(long)]
        fast: bool,
        /// The silos' `lease_checkpoint_interval`, ms (0: off).
        #[arg(long, default_value_t = 10_000)]
        checkpoint_ms: u64,
    },
    /// R5: cluster throughput (creations/s, ticks/s and lateness, a mass due
    /// time) on silo processes and one Redis, next to raw SETs; adds its section
    /// to the reports.
    R5(r5::Args),
    /// R5 fairness: a burst of one actor kind beside steady ticks of another,
    /// with and without `max_deliveries_per_kind`; adds its section to the reports.
    R5Fairness(r5::FairArgs),
    /// Issue 71's soak, by hand: R5's periodic workload on etcd with a third
    /// of the calls timing out; prints its figures.
    EtcdSoak(r5::SoakArgs),
    /// One silo process of R5: commands on stdin, answers on stdout.
    #[command(hide = true)]
    R5Silo {
        #[arg(long)]
        store: String,
        #[arg(long)]
        cluster: String,
        /// `run_history` of its reminder service.
        #[arg(long, default_value_t = 20)]
        run_history: usize,
        /// `max_deliveries_per_kind` of its reminder service (0: none).
        #[arg(long, default_value_t = 0)]
        per_kind_cap: usize,
    },
    /// P1: placement and fenced state (a fenced state write next to an
    /// unfenced one, `owner()` lookups next to lease row reads, a crash to
    /// the actors answering on a survivor); adds its section to the reports.
    P1(p1::Args),
    /// S1: actor state writes and reads (1 KiB to 16 MiB) next to the backend's
    /// raw conditional write of the same bytes; adds its section to the reports.
    S1(s1::Args),
    /// J1: join storms (10 to 10,000 silos started at once) on the memory table in
    /// virtual time and on a real Redis; adds its section to the reports.
    J1(j1::Args),
    /// D1: crash detection (5, 50 and 1,000 silos; one at a time and 10% at once)
    /// in virtual time; adds its section to the reports.
    D1(d1::Args),
    /// D2: false positives (5% loss, stalls, a table outage; 10 and 50 silos) in
    /// virtual time; adds its section to the reports.
    D2(d2::Args),
    /// F1: the footprint of an idle silo (RSS, CPU, Redis commands per second) in a
    /// 5-silo cluster of processes; adds its section to the reports.
    F1(f1::Args),
    /// One process of F1 (`silo` or `reference`); prints `ready`, runs until killed.
    #[command(hide = true)]
    FootprintChild {
        #[arg(long)]
        role: String,
        #[arg(long)]
        store: String,
        #[arg(long)]
        cluster: String,
    },
}

/// The process's allocator, counting the bytes currently allocated: how R1
/// measures what the reminder service holds per reminder (exact, unlike RSS, which
/// keeps freed pages and transient peaks).
struct CountingAllocator;

static HEAP_LIVE: std::sync::atomic::AtomicI64 = std::sync::atomic::AtomicI64::new(0);

// SAFETY: every call is forwarded unchanged to the system allocator; the counter
// is only a side effect.
unsafe impl std::alloc::GlobalAlloc for CountingAllocator {
    unsafe fn alloc(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        let p = unsafe { std::alloc::System.alloc(layout) };
        if !p.is_null() {
            HEAP_LIVE.fetch_add(block(layout.size()), std::sync::atomic::Ordering::Relaxed);
        }
        p
    }

    unsafe fn dealloc(&self, ptr: *mut u8, layout: std::alloc::Layout) {
        // SAFETY: `ptr` was allocated by `alloc` above with this layout.
        unsafe { std::alloc::System.dealloc(ptr, layout) };
        HEAP_LIVE.fetch_sub(block(layout.size()), std::sync::atomic::Ordering::Relaxed);
    }

    unsafe fn alloc_zeroed(&self, layout: std::alloc::Layout) -> *mut u8 {
        // SAFETY: forwarded with the caller's layout.
        let p = unsafe { std::alloc::System.alloc_zeroed(layout) };
        if !p.is_null() {
            HEAP_LIVE.fetch_add(block(layout.size()), std::sync::atomic::Ordering::Relaxed);
        }
        p
    }

    unsafe fn realloc(&self, ptr: *mut u8, layout: std::alloc::Layout, new_size: usize) -> *mut u8 {
        // SAFETY: `ptr` was allocated by this allocator with `layout`.
        let p = unsafe { std::alloc::System.realloc(ptr, layout, new_size) };
        if !p.is_null() {
            HEAP_LIVE.fetch_add(
                block(new_size) - block(layout.size()),
                std::sync::atomic::Ordering::Relaxed,
            );
        }
        p
    }
}

/// The size of the block glibc's malloc uses for a request of `size` bytes on a
/// 64-bit machine: the request plus an 8-byte header, rounded up to 16, at least 32.
pub(crate) fn block(size: usize) -> i64 {
    (((size + 8 + 15) & !15).max(32)) as i64
}

#[global_allocator]
static ALLOCATOR: CountingAllocator = CountingAllocator;

/// Bytes of heap blocks currently allocated by this process, each counted at the
/// size glibc's malloc gives it (see [`block`]).
pub(crate) fn heap_live() -> i64 {
    HEAP_LIVE.load(std::sync::atomic::Ordering::Relaxed)
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

/// A benchmark's options with their defaults, as `rollcall-bench <name>` would
/// parse them (for `all`).
fn defaults<A: clap::Args>(name: &str) -> A {
    #[derive(Parser)]
    struct Defaults<A: clap::Args> {
        #[command(flatten)]
        args: A,
    }
    Defaults::<A>::parse_from([name]).args
}

fn main() -> anyhow::Result<()> {
    let cli = Cli::parse();
    let rt = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    match cli.cmd {
        Cmd::T1(args) => rt.block_on(t1::run(args)),
        Cmd::T2(args) => {
            drop(rt);
            t2::run(args)
        }
        Cmd::R1(args) => r1::run(args),
        Cmd::R2(args) => r2::run(args),
        Cmd::R4(args) => r4::run(args),
        Cmd::R4Silos {
            store,
            cluster,
            shards,
            fast,
            checkpoint_ms,
        } => {
            drop(rt);
            r4::silos(
                &store,
                &cluster,
                shards,
                fast,
                std::time::Duration::from_millis(checkpoint_ms),
            )
        }
        Cmd::R5(args) => {
            drop(rt);
            r5::run(args)
        }
        Cmd::R5Fairness(args) => {
            drop(rt);
            r5::fairness(args)
        }
        Cmd::EtcdSoak(args) => {
            drop(rt);
            r5::soak(args)
        }
        Cmd::R5Silo {
            store,
            cluster,
            run_history,
            per_kind_cap,
        } => {
            drop(rt);
            r5::silo(&store, &cluster, run_history, per_kind_cap)
        }
        Cmd::S1(args) => {
            drop(rt);
            s1::run(args)
        }
        Cmd::P1(args) => {
            drop(rt);
            p1::run(args)
        }
        Cmd::J1(args) => j1::run(args),
        Cmd::D1(args) => d1::run(args),
        Cmd::D2(args) => d2::run(args),
        Cmd::F1(args) => {
            drop(rt);
            f1::run(args)
        }
        Cmd::FootprintChild { role, store, cluster } => {
            drop(rt);
            f1::child(&role, &store, &cluster)
        }
        Cmd::All(args) => {
            let reports = Reports {
                out: args.out.clone(),
                json: args.json.clone(),
            };
            rt.block_on(t1::run(args))?;
            drop(rt);
            let mut t2: t2::Args = defaults("t2");
            t2.reports = reports.clone();
            t2::run(t2)?;
            let mut r1: r1::Args = defaults("r1");
            r1.reports = reports.clone();
            r1::run(r1)?;
            let mut r2: r2::Args = defaults("r2");
            r2.reports = reports.clone();
            r2::run(r2)?;
            let mut r4: r4::Args = defaults("r4");
            r4.reports = reports.clone();
            r4::run(r4)?;
            let mut r5: r5::Args = defaults("r5");
            r5.reports = reports.clone();
            r5::run(r5)?;
            let mut s1: s1::Args = defaults("s1");
            s1.reports = reports.clone();
            s1::run(s1)?;
            let mut p1: p1::Args = defaults("p1");
            p1.reports = reports.clone();
            p1::run(p1)?;
            let mut j1: j1::Args = defaults("j1");
            j1.reports = reports.clone();
            j1::run(j1)?;
            let mut d1: d1::Args = defaults("d1");
            d1.reports = reports.clone();
            d1::run(d1)?;
            let mut d2: d2::Args = defaults("d2");
            d2.reports = reports.clone();
            d2::run(d2)?;
            let mut f1: f1::Args = defaults("f1");
            f1.reports = reports;
            f1::run(f1)
        }
    }
}

/// Whether `line` is the heading `heading` (`## J1`): the line is the heading or
/// goes on with `:` (`## J1: join storms`), so that `## J1 notes` is another one.
fn is_heading(line: &str, heading: &str) -> bool {
    line.strip_prefix(heading)
        .is_some_and(|rest| rest.is_empty() || rest.starts_with(':'))
}

/// Replaces the section of `path` whose heading line is `heading` (see
/// [`is_heading`]; up to the next `## ` heading) with `body`, or appends it.
/// Sections with other headings, hand-written notes included, are kept.
pub(crate) fn set_section(path: &std::path::Path, heading: &str, body: &str) -> anyhow::Result<()> {
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let mut out = String::new();
    let mut skipping = false;
    let mut replaced = false;
    for line in old.lines() {
        if is_heading(line, heading) {
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

/// Replaces what precedes the first `## ` heading of `path` (title and provenance)
/// with `header`, keeping every section; writes `header` alone to a new file.
pub(crate) fn set_header(path: &std::path::Path, header: &str) -> anyhow::Result<()> {
    let old = std::fs::read_to_string(path).unwrap_or_default();
    let rest = match old.find("\n## ") {
        Some(i) => &old[i + 1..],
        None => "",
    };
    std::fs::write(path, format!("{}\n\n{rest}", header.trim_end()))?;
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

/// The reports a benchmark adds its figures to (defaults: the workspace's
/// BENCHMARKS.md and benchmarks.json).
#[derive(clap::Args, Clone, Debug, Default)]
pub struct Reports {
    /// The Markdown report.
    #[arg(long)]
    out: Option<PathBuf>,
    /// The JSON report.
    #[arg(long)]
    json: Option<PathBuf>,
}

impl Reports {
    /// Adds a benchmark's section (starting with the line `heading`) to the
    /// Markdown report and its figures under `key` to the JSON report, keeping what
    /// other benchmarks wrote.
    pub(crate) fn add(
        &self,
        (heading, body): (&str, &str),
        (key, value): (&str, serde_json::Value),
    ) -> anyhow::Result<()> {
        let out = self
            .out
            .clone()
            .unwrap_or_else(|| workspace_file("BENCHMARKS.md"));
        let json = self
            .json
            .clone()
            .unwrap_or_else(|| workspace_file("benchmarks.json"));
        // Each section says when and at which commit it was measured: sections
        // are rerun one at a time, and the header's commit is T1's.
        let at: std::collections::BTreeMap<String, String> = provenance().into_iter().collect();
        let line = format!(
            "Measured at commit {} on {} UTC.",
            at.get("commit").map_or("unknown", String::as_str),
            at.get("date (UTC)").map_or("unknown", String::as_str)
        );
        let body = match body.split_once('\n') {
            Some((title, rest)) => format!("{title}\n\n{line}\n{rest}"),
            None => format!("{body}\n\n{line}\n"),
        };
        set_section(&out, heading, &body)?;
        set_json_key(&json, key, value)?;
        eprintln!("updated {} and {}", out.display(), json.display());
        Ok(())
    }
}

/// Runs one measurement on its own thread (each in its own actix `System` or
/// virtual-time runtime, which `f` creates); a panic becomes an error naming `what`.
pub(crate) fn on_own_thread<T: Send + 'static>(
    what: String,
    f: impl FnOnce() -> anyhow::Result<T> + Send + 'static,
) -> anyhow::Result<T> {
    std::thread::spawn(f)
        .join()
        .map_err(|_| anyhow::anyhow!("{what} panicked"))?
}

/// Where a report goes by default: the workspace root.
pub(crate) fn workspace_file(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("..").join(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `all` runs every benchmark with the options its own command would parse.
    #[test]
    fn every_benchmark_has_parseable_defaults() {
        let t2: t2::Args = defaults("t2");
        let f1: f1::Args = defaults("f1");
        let _: (
            r1::Args,
            r2::Args,
            r4::Args,
            s1::Args,
            p1::Args,
            j1::Args,
            d1::Args,
            d2::Args,
        ) = (
            defaults("r1"),
            defaults("r2"),
            defaults("r4"),
            defaults("s1"),
            defaults("p1"),
            defaults("j1"),
            defaults("d1"),
            defaults("d2"),
        );
        assert!(format!("{t2:?}").contains("writers: [1, 4, 16, 64]"), "{t2:?}");
        assert!(format!("{f1:?}").contains("silos: 5"), "{f1:?}");
    }

    /// A benchmark's section is replaced, a section whose heading only starts
    /// with the same name (hand-written notes) is kept. (`j1` replaced its notes
    /// with a second copy of its table.)
    #[test]
    fn a_section_is_replaced_and_its_notes_are_kept() {
        let dir = std::env::temp_dir().join(format!("rollcall-bench-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("BENCHMARKS.md");
        std::fs::write(
            &path,
            "# title\n\n## J1: storms\n\nold figures\n\n## J1 notes: what they taught\n\nnotes\n\n## D1: x\n\nd1\n",
        )
        .unwrap();
        set_section(&path, "## J1", "## J1: storms\n\nnew figures\n").unwrap();
        let text = std::fs::read_to_string(&path).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            text,
            "# title\n\n## J1: storms\n\nnew figures\n\n## J1 notes: what they taught\n\nnotes\n\n## D1: x\n\nd1\n"
        );
    }
}
