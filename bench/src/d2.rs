//! D2: false positives in virtual time. A cluster of N silos (default options)
//! forms by a join storm on the simulated network and the memory table (1 ms per
//! call); then, with no silo crashed, it lives through faults that must not make it
//! declare anyone Dead:
//! - every message lost with probability 5%, for 30 minutes;
//! - one silo's network stalled for 2 s every 30 s (its messages wait), for 30
//!   minutes;
//! - the membership table unavailable for 60 s, then 5 minutes more;
//! - network partitions for 60 s (every silo still reaches the table), then healed:
//!   sides in the ratios 2|3 and 3|4, and 5|5 (no side holds a majority). Deaths on
//!   the minority side of a split are correct; a death on the majority side, or any
//!   death when no side holds a majority, is a false death.
//!
//! Reported per scenario: the silos declared Dead (false deaths; goal 0), the
//! suspicion votes written meanwhile (row writes during the scenario: a silo that
//! is alive writes no other row), and whether every silo is still Active with one
//! view at the end.

use std::fmt::Write as _;
use std::sync::Arc;
use std::time::Duration;

use rollcall_core::{ClusterMembershipOptions, SiloStatus};
use serde::Serialize;

/// Options of `d2`.
#[derive(clap::Args, Clone, Debug)]
pub struct Args {
    /// Cluster sizes.
    #[arg(long, value_delimiter = ',', default_value = "10,50")]
    sizes: Vec<usize>,
    /// Minutes (virtual) of the loss and stall scenarios.
    #[arg(long, default_value_t = 30)]
    minutes: u64,
    /// Seed of the clusters and of the network.
    #[arg(long, default_value_t = 7)]
    seed: u64,
    /// Only the partition scenarios (`true`) or only the others (`false`); both
    /// when absent.
    #[arg(long)]
    partitions_only: Option<bool>,
    /// The reports to add the D2 section and the `d2` key to.
    #[command(flatten)]
    pub reports: crate::Reports,
}

/// The figures of one scenario on one cluster size.
#[derive(Clone, Debug, Serialize)]
pub struct Outcome {
    silos: usize,
    scenario: String,
    /// Virtual minutes the fault lasted, plus the time after it that was watched.
    minutes: f64,
    /// Silos the table has Dead (none was killed).
    false_deaths: usize,
    /// Suspicion votes written during the scenario.
    votes_written: u64,
    /// Partitions: silos of the minority side declared Dead (a correct outcome).
    #[serde(skip_serializing_if = "Option::is_none")]
    minority_deaths: Option<usize>,
    /// Every silo Active, and every view at the table's version, at the end.
    all_active_and_agree: bool,
}

/// The faults of D2.
#[derive(Clone, Copy, Debug)]
enum Scenario {
    Loss,
    Stalls,
    TableOutage,
    /// A partition for [`SPLIT`] into sides in the ratio `a : b` (`a <= b`).
    Split(usize, usize),
    /// The same with Orleans' rule (`vote_needs_majority = false`): the reference.
    SplitOrleans(usize, usize),
}

/// How long a D2 partition lasts: well past the detection bound (17.5 s).
const SPLIT: Duration = Duration::from_secs(60);

impl Scenario {
    fn name(self) -> String {
        match self {
            Scenario::Loss => "5% message loss".to_owned(),
            Scenario::Stalls => "one silo stalled 2 s every 30 s".to_owned(),
            Scenario::TableOutage => "table unavailable for 60 s".to_owned(),
            Scenario::Split(a, b) => format!("partition {a}|{b} for 60 s"),
            Scenario::SplitOrleans(a, b) => format!("partition {a}|{b} for 60 s, Orleans' rule (reference)"),
        }
    }

    fn is_split(self) -> bool {
        matches!(self, Scenario::Split(..) | Scenario::SplitOrleans(..))
    }

    /// The minority side's size in a cluster of `n` (`a / (a + b)` of it).
    fn minority(self, n: usize) -> usize {
        match self {
            Scenario::Split(a, b) | Scenario::SplitOrleans(a, b) => (n * a + (a + b) / 2) / (a + b),
            _ => 0,
        }
    }
}

async fn measure(n: usize, scenario: Scenario, minutes: u64, seed: u64) -> anyhow::Result<Outcome> {
    let options = ClusterMembershipOptions {
        vote_needs_majority: !matches!(scenario, Scenario::SplitOrleans(..)),
        ..ClusterMembershipOptions::default()
    };
    let store = Arc::new(rollcall::memory::MemoryStore::new());
    let cluster = crate::j1::storm(store.clone(), Duration::from_millis(1), n, &options, seed).await?;
    let before = cluster.counts.snapshot();
    let lasted = match scenario {
        Scenario::Loss => {
            cluster.net.set_drop_probability(0.05);
            tokio::time::sleep(Duration::from_secs(60 * minutes)).await;
            cluster.net.set_drop_probability(0.0);
            Duration::from_secs(60 * minutes)
        }
        Scenario::Stalls => {
            let stalled = cluster.silos[n / 2].address().endpoint();
            for _ in 0..(minutes * 2) {
                cluster.net.freeze(stalled);
                tokio::time::sleep(Duration::from_secs(2)).await;
                cluster.net.resume(stalled);
                tokio::time::sleep(Duration::from_secs(28)).await;
            }
            Duration::from_secs(60 * minutes)
        }
        Scenario::TableOutage => {
            store.set_unavailable(true);
            tokio::time::sleep(Duration::from_secs(60)).await;
            store.set_unavailable(false);
            tokio::time::sleep(Duration::from_secs(300)).await;
            Duration::from_secs(360)
        }
        Scenario::Split(..) | Scenario::SplitOrleans(..) => {
            let k = scenario.minority(n);
            let addrs: Vec<_> = cluster.silos.iter().map(|s| s.address().endpoint()).collect();
            for a in &addrs[..k] {
                for b in &addrs[k..] {
                    cluster.net.partition(*a, *b);
                }
            }
            tokio::time::sleep(SPLIT).await;
            cluster.net.heal();
            SPLIT
        }
    };
    // Let the last suspicions expire or settle, then look.
    tokio::time::sleep(options.probe_timeout * options.num_missed_probes_limit * 2).await;
    let votes_written = cluster.counts.snapshot().since(&before).writes;
    // The observer is on the larger side of a split (the first k silos or the rest).
    let k = scenario.minority(n);
    let observer = &cluster.silos[if 2 * k > n { 0 } else { n - 1 }];
    observer.refresh().await.ok();
    let view = observer.shared_snapshot();
    // The sides are the first k silos and the rest; with an odd n a "5|5" split is
    // as even as it gets, and one side may then hold a strict majority.
    let first: Vec<_> = cluster.silos[..k].iter().map(|s| s.address()).collect();
    let dead: Vec<_> = view
        .rows()
        .filter(|e| e.status == SiloStatus::Dead)
        .map(|e| e.silo)
        .collect();
    let in_first = dead.iter().filter(|s| first.contains(s)).count();
    let in_rest = dead.len() - in_first;
    // A side may die only where the other side holds a strict majority.
    let (false_deaths, minority_deaths) = if 2 * (n - k) > n {
        (in_rest, in_first)
    } else if 2 * k > n {
        (in_first, in_rest)
    } else {
        (dead.len(), 0)
    };
    let version = view.version.version;
    let all_active_and_agree = cluster.silos.iter().all(|s| {
        dead.contains(&s.address())
            || (!s.is_stopped()
                && s.status() == SiloStatus::Active
                && s.shared_snapshot().version.version >= version)
    });
    for s in &cluster.silos {
        s.kill();
    }
    Ok(Outcome {
        silos: n,
        scenario: scenario.name().to_owned(),
        minutes: lasted.as_secs_f64() / 60.0,
        false_deaths,
        votes_written,
        minority_deaths: scenario.is_split().then_some(minority_deaths),
        all_active_and_agree,
    })
}

/// Runs D2 (each size and scenario in its own actix `System`, virtual time) and
/// adds its section to the reports.
pub fn run(args: Args) -> anyhow::Result<()> {
    let mut all = Vec::new();
    for &n in &args.sizes {
        anyhow::ensure!(n >= 3, "D2 needs clusters of at least 3 silos");
        let scenarios = [
            Scenario::Loss,
            Scenario::Stalls,
            Scenario::TableOutage,
            Scenario::Split(2, 3),
            Scenario::SplitOrleans(2, 3),
            Scenario::Split(3, 4),
            Scenario::SplitOrleans(3, 4),
            Scenario::Split(5, 5),
            Scenario::SplitOrleans(5, 5),
        ];
        for scenario in scenarios {
            let split = scenario.is_split();
            if args.partitions_only.is_some_and(|p| p != split) {
                continue;
            }
            let (minutes, seed) = (args.minutes, args.seed);
            let row = crate::on_own_thread(format!("D2 {n} {}", scenario.name()), move || {
                rollcall_tests::sim::run_virtual(|| measure(n, scenario, minutes, seed))
            })?;
            eprintln!("{row:?}");
            all.push(row);
        }
    }
    let mut md = String::new();
    let _ = writeln!(
        md,
        "## D2: false positives in virtual time\n\n\
         Default options; the cluster forms by a join storm on the simulated network and \
         the memory table (1 ms per call), and no silo is killed. Scenarios: every message \
         lost with probability 5% for {m} minutes; one silo's network stalled for 2 s every \
         30 s for {m} minutes (its messages wait 2 s, less than a probe timeout, so \
         only a protocol that counts late answers as losses would suspect it); the table \
         unavailable for 60 s, then 5 minutes more; partitions for 60 s (every silo still \
         reaches the table) into sides in the ratios 2|3 and 3|4 of the cluster, and 5|5, then \
         healed. Each is followed by `2 x L x T` of quiet. *Votes*: suspicions written during \
         the scenario. *False deaths*: any death, except on the minority side of a split whose \
         other side holds a strict majority (those are *minority deaths*, the expected outcome; \
         with 5|5 nobody may die). *All Active, one view*: every silo not declared Dead. \
         Each split also runs with Orleans' rule (`vote_needs_majority = false`: votes alone, \
         `min(2, (active + 1) / 2)`) as the same-run reference. Goal: 0 false deaths (the \
         reference rows show what the rule prevents).\n",
        m = args.minutes
    );
    let _ = writeln!(
        md,
        "| silos | scenario | minutes | votes written | false deaths | minority deaths | all Active, one view |\n|---|---|---|---|---|---|---|"
    );
    for o in &all {
        let _ = writeln!(
            md,
            "| {} | {} | {:.0} | {} | {} | {} | {} |",
            o.silos,
            // A `|` inside a Markdown table cell must be escaped.
            o.scenario.replace('|', "\\|"),
            o.minutes,
            o.votes_written,
            if o.false_deaths == 0 {
                "0".to_owned()
            } else {
                format!("**{}**", o.false_deaths)
            },
            o.minority_deaths.map_or("-".to_owned(), |d| d.to_string()),
            if o.all_active_and_agree { "yes" } else { "**no**" }
        );
    }
    args.reports
        .add(("## D2", &md), ("d2", serde_json::to_value(&all)?))
}
