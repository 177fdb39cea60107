//! The `rollcall` command-line tool.

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
    /// Print the membership table of a cluster.
    Status {
        /// Store URL (memory://, redis://host:port, etcd://host:port, dynamodb://table?endpoint=...).
        #[arg(long, default_value = "memory://")]
        store: String,
        /// Cluster id.
        #[arg(long, default_value = "rollcall")]
        cluster: String,
    },
}

#[tokio::main]
async fn main() -> anyhow::Result<()> {
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_writer(std::io::stderr)
        .init();
    match Cli::parse().command {
        Command::Status { store, cluster } => status(&store, &cluster).await,
    }
}

async fn status(store: &str, cluster: &str) -> anyhow::Result<()> {
    let store = rollcall::connect(store).await?;
    let table = store.membership_table(cluster, rollcall::ProtocolMode::Extended)?;
    table.init(false).await?;
    let snap = table.read_all().await?;
    let now = rollcall::Timestamp::now();
    println!(
        "cluster {cluster}: table version {} ({} silos)",
        snap.version.version,
        snap.len()
    );
    println!(
        "{:<28} {:<12} {:<20} {:>12}  votes",
        "silo", "status", "host", "i_am_alive"
    );
    for e in snap.rows() {
        let age = now.saturating_duration_since(e.i_am_alive_time);
        let votes: Vec<String> = e
            .suspect_votes
            .iter()
            .map(|v| {
                format!(
                    "{} ({}s ago)",
                    v.silo,
                    now.saturating_duration_since(v.time).as_secs()
                )
            })
            .collect();
        println!(
            "{:<28} {:<12} {:<20} {:>10}s  {}",
            e.silo.to_string(),
            e.status.as_str(),
            e.host_name,
            age.as_secs(),
            votes.join(", ")
        );
    }
    Ok(())
}
