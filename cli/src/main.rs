//! The `rollcall` command-line tool: `demo` (the main job), `silo`, `status`,
//! `history`, `metrics` and `reminders`.

mod demo;
mod silo;
mod view;

use clap::{Parser, Subcommand};

/// rollcall: Orleans-style cluster membership and durable reminders.
#[derive(Debug, Parser)]
#[command(name = "rollcall", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Start N silos on loopback with real TCP probing, kill one abruptly and show
    /// the cluster detect it: a live timeline, then the membership table.
    Demo(demo::DemoArgs),
    /// Run one silo until Ctrl-C (graceful shutdown) or until the cluster declares it Dead.
    Silo(silo::SiloArgs),
    /// Print the membership table of a cluster.
    Status {
        /// Store URL (memory://, redis://host:port, etcd://host:port, dynamodb://table?endpoint=...).
        #[arg(long, default_value = "memory://")]
        store: String,
        /// Cluster id.
        #[arg(long, default_value = "rollcall")]
        cluster: String,
    },
    /// Print the membership history of a cluster: joins, suspicions with their voters,
    /// declarations and shutdowns, each with the table version it produced (oldest
    /// first). Answers "why was silo X declared dead, and who voted".
    History {
        /// Store URL (redis://host:port, etcd://host:port, dynamodb://table?endpoint=...).
        #[arg(long, default_value = "memory://")]
        store: String,
        /// Cluster id.
        #[arg(long, default_value = "rollcall")]
        cluster: String,
        /// Only the events about this silo (`ip:port@generation`).
        #[arg(long)]
        silo: Option<rollcall::SiloAddress>,
        /// First table version to show (inclusive).
        #[arg(long, default_value_t = 0)]
        since: u64,
        /// Print at most this many events (the oldest that match).
        #[arg(long, default_value_t = 10_000)]
        limit: usize,
    },
    /// Print the metrics table of a cluster: one row per silo (and client) with its
    /// CPU, memory, probe round trips, suspicions, votes, table operations and
    /// reminder figures, as each last published them.
    Metrics {
        /// Store URL (redis://host:port, etcd://host:port, dynamodb://table?endpoint=...).
        #[arg(long, default_value = "memory://")]
        store: String,
        /// Cluster id.
        #[arg(long, default_value = "rollcall")]
        cluster: String,
    },
    /// List the reminders of a service: owner (in the cluster's current membership),
    /// next tick, period, missed-tick policy, etag.
    Reminders {
        /// Store URL (memory://, redis://host:port, etcd://host:port, dynamodb://table?endpoint=...).
        #[arg(long, default_value = "memory://")]
        store: String,
        /// Reminder service id.
        #[arg(long, default_value = "rollcall")]
        service: String,
        /// Cluster whose Active silos own the reminders (default: the service id,
        /// which is what a silo's reminder service uses by default).
        #[arg(long)]
        cluster: Option<String>,
        /// Ring points per silo (`ring_points_per_silo` of the services).
        #[arg(long, default_value_t = 30)]
        points: u32,
        /// Print at most this many reminders.
        #[arg(long, default_value_t = 1000)]
        limit: usize,
    },
}

fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("error")),
        )
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Demo(args) => {
            let converged = actix::System::new().block_on(demo::run(args))?;
            if !converged {
                std::process::exit(1);
            }
            Ok(())
        }
        Command::Silo(args) => silo::run(args),
        Command::Status { store, cluster } => actix::System::new().block_on(async move {
            let store = rollcall::connect(&store).await?;
            let table = store.membership_table(&cluster, rollcall::ProtocolMode::Extended)?;
            let snap = table.read_all().await?;
            print!("{}", view::table(&cluster, &snap, rollcall::Timestamp::now()));
            Ok(())
        }),
        Command::History {
            store,
            cluster,
            silo,
            since,
            limit,
        } => actix::System::new().block_on(async move {
            let store = rollcall::connect(&store).await?;
            let table = store.membership_table(&cluster, rollcall::ProtocolMode::Extended)?;
            let events = table
                .read_history(&rollcall::HistoryQuery {
                    from_version: since,
                    silo,
                    limit,
                })
                .await?;
            print!("{}", view::history(&cluster, &events, silo.as_ref()));
            Ok(())
        }),
        Command::Metrics { store, cluster } => actix::System::new().block_on(async move {
            let store = rollcall::connect(&store).await?;
            let report = store.metrics_table(&cluster)?.read_all().await?;
            print!("{}", view::metrics(&cluster, &report, rollcall::Timestamp::now()));
            Ok(())
        }),
        Command::Reminders {
            store,
            service,
            cluster,
            points,
            limit,
        } => actix::System::new().block_on(async move {
            let store = rollcall::connect(&store).await?;
            let cluster = cluster.unwrap_or_else(|| service.clone());
            let membership = store
                .membership_table(&cluster, rollcall::ProtocolMode::Extended)?
                .read_all()
                .await?;
            let ring = rollcall::reminders::ring::Ring::of_active(&membership, points);
            let mut rows = store.reminder_table(&service)?.read_rows_in_range(0, 0).await?;
            rows.sort_by(|a, b| (a.hash, &a.actor_id, &a.name).cmp(&(b.hash, &b.actor_id, &b.name)));
            print!(
                "{}",
                view::reminders(&service, &rows, &ring, rollcall::Timestamp::now(), limit)
            );
            Ok(())
        }),
    }
}
