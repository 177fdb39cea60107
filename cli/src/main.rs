//! The `rollcall` command-line tool: `demo` (the main job), `silo`, `status`,
//! `history`, `metrics`, `statistics`, `reminders` and `dashboard`.

mod demo;
mod silo;
mod state;
mod transfer;
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
    /// Actor states (the grain-state table): `state get`, `state list`, `state delete`.
    State(state::StateArgs),
    /// Print the membership table of a cluster.
    Status {
        /// Store URL (memory://, redis://host:port, etcd://host:port, dynamodb://table?endpoint=...).
        #[arg(long, default_value = "memory://")]
        store: String,
        /// Cluster id.
        #[arg(long, default_value = "rollcall")]
        cluster: String,
        /// Keep reading the table until Ctrl-C. On a terminal the screen is redrawn
        /// every `--interval` (IAmAlive ages tick); otherwise (a pipe, a log) the
        /// table is printed again only when its version changes, as plain lines.
        #[arg(long, short)]
        watch: bool,
        /// How often `--watch` reads the table.
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        interval: std::time::Duration,
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
    /// Print a cluster's statistics (what silos append every `--statistics-period`):
    /// raw points or 1-, 10- or 60-minute buckets (count, mean, min, max), oldest
    /// first, filtered by time, names and silos.
    Statistics {
        /// Store URL (memory://, redis://host:port, dynamodb://table?endpoint=...; etcd
        /// keeps no statistics).
        #[arg(long, default_value = "memory://")]
        store: String,
        /// Cluster id.
        #[arg(long, default_value = "rollcall")]
        cluster: String,
        /// Resolution: raw, 1m, 10m or 60m.
        #[arg(long, default_value = "1m", value_parser = parse_level)]
        level: rollcall::AggLevel,
        /// How far back from now (e.g. 15m, 2h, 7days).
        #[arg(long, default_value = "1h", value_parser = humantime::parse_duration)]
        last: std::time::Duration,
        /// Only this statistic (repeatable), e.g. `table_writes`.
        #[arg(long = "name")]
        names: Vec<String>,
        /// Only this silo (repeatable), `ip:port@generation`.
        #[arg(long = "silo")]
        silos: Vec<String>,
        /// Print at most this many records (the oldest that match).
        #[arg(long, default_value_t = 10_000)]
        limit: usize,
    },
    /// Serve a live web dashboard of a cluster: the membership table, the history
    /// timeline, statistics charts (with reminder tick lateness), the reminder
    /// service's shard map, its reminders per kind (next due, paused, parked, one
    /// reminder's runs) and, with `--state-service`, actor state per kind, pushed
    /// to the page as they change. Read-only; bound to loopback by default (it has no
    /// authentication: put it behind yours before exposing it).
    Dashboard {
        /// Store URL (memory://, redis://host:port, etcd://host:port, dynamodb://table?endpoint=...).
        #[arg(long, default_value = "memory://")]
        store: String,
        /// Cluster id.
        #[arg(long, default_value = "rollcall")]
        cluster: String,
        /// Address to serve on.
        #[arg(long, default_value = "127.0.0.1:8080")]
        listen: std::net::SocketAddr,
        /// How often the membership table is read (for every open page together).
        #[arg(long, default_value = "1s", value_parser = humantime::parse_duration)]
        interval: std::time::Duration,
        /// Reminder service whose reminders are counted per owner (default: the
        /// cluster id, what a silo's reminder service uses by default).
        #[arg(long)]
        service: Option<String>,
        /// Ring points per silo (`ring_points_per_silo` of the reminder services).
        #[arg(long, default_value_t = 30)]
        points: u32,
        /// Actor-state service whose states are summed up per actor kind
        /// (states, bytes, the largest, the next expiries); none by default.
        #[arg(long)]
        state_service: Option<String>,
        /// Actor kinds the state panel shows, comma-separated (default: the
        /// kinds of the reminder service's actors).
        #[arg(long, value_delimiter = ',')]
        state_kinds: Vec<String>,
    },
    /// List the reminders of a service: owner (in the cluster's current membership),
    /// next ticks (`--next`), schedule (period, cron and zone, end), missed-tick and retry policy, etag.
    /// With `--kind` or `--prefix` (or `--after`), one page of `--limit` reminders of
    /// that actor kind or id prefix, and the `--after` token of the next page.
    /// `reminders pause|resume|trigger ACTOR NAME` operates one reminder in the
    /// store and tells the silo holding its shard (as a silo's `Reminders` would);
    /// `reminders history ACTOR NAME` prints its last runs (when, how late, attempts,
    /// outcome, silo).
    /// `reminders delete --kind K` (or `--prefix P`) removes them all, row by row
    /// (safe to run again), and tells the silos holding the shards it changed, so
    /// they stop those ticks at once.
    /// `reminders export` prints its rows as JSON lines; `reminders import` writes
    /// JSON lines (from `--file` or stdin) into the service, all lines checked
    /// before any is written. Running silos load imported rows at their next
    /// refresh (`refresh_reminder_list_period`).
    Reminders {
        /// `list` (the default), `export`, `import`, `delete`, `pause`, `resume`,
        /// `trigger` or `history`.
        #[arg(value_enum, default_value = "list")]
        action: RemindersAction,
        /// `pause`, `resume`, `trigger`, `history`: the actor (`kind/key`).
        actor: Option<String>,
        /// `pause`, `resume`, `trigger`, `history`: the reminder's name.
        reminder: Option<String>,
        /// `pause`, `resume`, `trigger`, `delete`: the file of the cluster's shared
        /// secret, if its silos use one (to reach the holders of the shards).
        #[arg(long)]
        shared_secret_file: Option<std::path::PathBuf>,
        /// `import`: read the JSON lines from this file instead of stdin;
        /// `export`: write them to it instead of stdout.
        #[arg(long)]
        file: Option<std::path::PathBuf>,
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
        /// Print at most this many reminders (with `--kind`, `--prefix` or
        /// `--after`: the page size, at most 10,000).
        #[arg(long, default_value_t = 1000)]
        limit: usize,
        /// Only the reminders of this actor kind (`cart`: actor ids `cart/...`).
        #[arg(long, conflicts_with = "prefix")]
        kind: Option<String>,
        /// Only the reminders whose actor id starts with this (`cart/eu-`).
        #[arg(long)]
        prefix: Option<String>,
        /// The page after this token (printed under the previous page).
        #[arg(long)]
        after: Option<String>,
        /// Next occurrences shown per reminder (1 to 20).
        #[arg(long, default_value_t = 3, value_parser = clap::value_parser!(u8).range(1..=20))]
        next: u8,
    },
}

/// What `rollcall reminders` does.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
enum RemindersAction {
    /// Print a table of the reminders.
    List,
    /// Print the rows as JSON lines.
    Export,
    /// Write JSON lines into the service.
    Import,
    /// Remove every reminder of `--kind` or `--prefix`.
    Delete,
    /// Pause one reminder: no silo delivers it until `resume`.
    Pause,
    /// Resume a paused (or parked) reminder, from now under its missed-tick policy.
    Resume,
    /// Deliver one extra tick of a reminder now.
    Trigger,
    /// Print a reminder's run history, newest first.
    History,
}

/// The shared secret in `--shared-secret-file`, if given.
fn read_secret(path: Option<&std::path::Path>) -> anyhow::Result<Option<rollcall::transport::SharedSecret>> {
    let Some(path) = path else { return Ok(None) };
    let bytes =
        std::fs::read(path).map_err(|e| anyhow::anyhow!("--shared-secret-file {}: {e}", path.display()))?;
    Ok(Some(rollcall::transport::SharedSecret::new(bytes.trim_ascii())?))
}

/// The actor-id prefix of `--kind` or `--prefix`.
fn kind_or_prefix(kind: Option<&str>, prefix: Option<&str>) -> anyhow::Result<Option<String>> {
    match (kind, prefix) {
        (Some(k), _) => rollcall::reminders::ActorId::kind_prefix(k)
            .map(Some)
            .map_err(|e| anyhow::anyhow!("--kind `{k}`: {e}")),
        (None, p) => Ok(p.map(str::to_owned)),
    }
}

/// `raw`, `1m`, `10m` or `60m` as a level.
fn parse_level(s: &str) -> Result<rollcall::AggLevel, String> {
    rollcall::AggLevel::ALL
        .into_iter()
        .find(|l| view::level_name(*l) == s)
        .ok_or_else(|| format!("`{s}`: expected raw, 1m, 10m or 60m"))
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
        Command::State(args) => actix::System::new().block_on(async move {
            print!("{}", state::run(args).await?);
            Ok(())
        }),
        Command::Status {
            store,
            cluster,
            watch,
            interval,
        } => actix::System::new().block_on(async move {
            let store = rollcall::connect(&store).await?;
            let table = store.membership_table(&cluster, rollcall::ProtocolMode::Extended)?;
            if watch {
                return view::watch(&*table, &cluster, interval).await;
            }
            let snap = table.read_all().await?;
            print!("{}", view::table(&cluster, &snap, rollcall::Timestamp::now()));
            // The clocks the silos report in their metrics rows (best effort:
            // a store without them, or silos that publish none, add nothing).
            if let Ok(metrics) = store.metrics_table(&cluster) {
                if let Ok(report) = metrics.read_all().await {
                    print!("{}", view::clocks(&snap, &report));
                    print!("{}", view::connections(&snap, &report));
                }
            }
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
        Command::Statistics {
            store,
            cluster,
            level,
            last,
            names,
            silos,
            limit,
        } => actix::System::new().block_on(async move {
            let store = rollcall::connect(&store).await?;
            let stats = store.statistics_store(&cluster, &rollcall::StatisticsOptions::default())?;
            let now = rollcall::Timestamp::now();
            let filter = rollcall::StatFilter {
                level,
                from: now.saturating_sub(last),
                to: rollcall::Timestamp::from_millis(now.as_millis().saturating_add(1)),
                names: (!names.is_empty()).then(|| names.into_iter().collect()),
                silos: (!silos.is_empty()).then(|| silos.into_iter().collect()),
            };
            let records = stats.scan(&filter).await?;
            print!("{}", view::statistics(&cluster, level, &records, limit));
            Ok(())
        }),
        Command::Dashboard {
            store,
            cluster,
            listen,
            interval,
            service,
            points,
            state_service,
            state_kinds,
        } => actix::System::new().block_on(async move {
            let store = rollcall::connect(&store).await?;
            let service = Some(service.unwrap_or_else(|| cluster.clone()));
            let dashboard = rollcall::dashboard::Dashboard::builder(store, cluster.clone())
                .interval(interval)
                .reminders(service, points)
                .state(state_service, state_kinds)
                .build();
            let server = actix_web::HttpServer::new(move || {
                let dashboard = dashboard.clone();
                actix_web::App::new().configure(move |c| dashboard.configure(c))
            })
            .workers(2)
            .bind(listen)
            .map_err(|e| anyhow::anyhow!("--listen {listen}: {e}"))?;
            println!("dashboard of cluster {cluster} at http://{listen}/ (Ctrl-C to stop)");
            server.run().await?;
            Ok(())
        }),
        Command::Reminders {
            action: RemindersAction::Export,
            store,
            service,
            file,
            ..
        } => actix::System::new().block_on(async move {
            let store = rollcall::connect(&store).await?;
            let mut rows = store.reminder_table(&service)?.read_rows_in_range(0, 0).await?;
            rows.sort_by(|a, b| (&a.actor_id, &a.name).cmp(&(&b.actor_id, &b.name)));
            let text = transfer::export(&rows);
            match file {
                Some(path) => std::fs::write(&path, text)?,
                None => print!("{text}"),
            }
            eprintln!("exported {} reminders of service {service}", rows.len());
            Ok(())
        }),
        Command::Reminders {
            action: RemindersAction::Import,
            store,
            service,
            file,
            ..
        } => actix::System::new().block_on(async move {
            let text = match file {
                Some(path) => std::fs::read_to_string(&path)?,
                None => std::io::read_to_string(std::io::stdin())?,
            };
            let store = rollcall::connect(&store).await?;
            let rows = transfer::parse(&text, &service, &store.key_limits())?;
            let table = store.reminder_table(&service)?;
            for (i, row) in rows.iter().enumerate() {
                if let Err(e) = table.upsert_row(row).await {
                    anyhow::bail!(
                        "writing reminder `{}` of `{}` failed after {i} of {} were imported: {e}",
                        row.name,
                        row.actor_id,
                        rows.len()
                    );
                }
            }
            println!("imported {} reminders into service {service}", rows.len());
            Ok(())
        }),
        Command::Reminders {
            action: action @ (RemindersAction::Pause | RemindersAction::Resume | RemindersAction::Trigger),
            store,
            service,
            cluster,
            actor,
            reminder,
            shared_secret_file,
            ..
        } => actix::System::new().block_on(async move {
            let (Some(actor), Some(name)) = (actor, reminder) else {
                anyhow::bail!("`reminders {action:?}` needs ACTOR and NAME, e.g. `cart/42 expire`");
            };
            let actor_id = rollcall::reminders::ActorId::parse(&actor)?;
            let secret = read_secret(shared_secret_file.as_deref())?;
            let store = rollcall::connect(&store).await?;
            let table = store.reminder_table(&service)?;
            let now = rollcall::Timestamp::now();
            let (done, told_name) = match action {
                RemindersAction::Trigger => {
                    let Some(row) = table.read_row(&actor, &name).await? else {
                        anyhow::bail!("no reminder `{name}` of {actor} in service {service}");
                    };
                    // Two triggers in one millisecond get different names.
                    let nanos = std::time::SystemTime::now()
                        .duration_since(std::time::UNIX_EPOCH)
                        .map_or(0, |d| d.subsec_nanos());
                    let salt = (nanos ^ std::process::id()) as u16;
                    let mut entry = rollcall::reminders::trigger_row(&row, now, salt)?;
                    entry.etag = table.upsert_row(&entry).await?;
                    (format!("triggered {actor} {name} as `{}`", entry.name), entry.name)
                }
                _ => {
                    let paused = (action == RemindersAction::Pause).then_some(now);
                    let timeout = std::time::Duration::from_secs(10);
                    let (_, changed) =
                        rollcall::reminders::set_paused(&*table, &actor_id, &name, paused, timeout).await?;
                    if !changed {
                        println!("{actor} {name} was already {}", if paused.is_some() { "paused" } else { "ticking" });
                        return Ok(());
                    }
                    let verb = if paused.is_some() { "paused" } else { "resumed" };
                    (format!("{verb} {actor} {name}"), name.clone())
                }
            };
            let transport = rollcall::transport::tcp::TcpTransport::with_config(rollcall::transport::tcp::TcpConfig {
                shared_secret: secret,
                ..Default::default()
            });
            let cluster = cluster.unwrap_or_else(|| service.clone());
            let told = rollcall::reminders::tell_holder(
                &*store,
                &transport,
                &cluster,
                &service,
                &actor,
                &told_name,
                std::time::Duration::from_secs(5),
            )
            .await;
            let how = match told {
                Ok(rollcall::reminders::Told::Taken(h)) => format!("silo {h} applies it now"),
                Ok(rollcall::reminders::Told::NotTaken(h)) => {
                    format!("silo {h} did not take the notice: its next refresh applies it")
                }
                Ok(rollcall::reminders::Told::NoHolder) => "no silo holds its shard: the next to take it applies it".into(),
                Err(e) => format!("the holder was not told ({e}): its next refresh applies it"),
            };
            println!("{done}; {how}");
            Ok(())
        }),
        Command::Reminders {
            action: RemindersAction::History,
            store,
            service,
            actor,
            reminder,
            ..
        } => actix::System::new().block_on(async move {
            let (Some(actor), Some(name)) = (actor, reminder) else {
                anyhow::bail!("`reminders history` needs ACTOR and NAME, e.g. `cart/42 expire`");
            };
            rollcall::reminders::ActorId::parse(&actor)?;
            let store = rollcall::connect(&store).await?;
            let runs = store.reminder_table(&service)?.read_runs(&actor, &name).await?;
            print!("{}", view::runs(&actor, &name, &runs));
            Ok(())
        }),
        Command::Reminders {
            action: RemindersAction::Delete,
            store,
            service,
            cluster,
            kind,
            prefix,
            shared_secret_file,
            ..
        } => actix::System::new().block_on(async move {
            let Some(prefix) = kind_or_prefix(kind.as_deref(), prefix.as_deref())? else {
                anyhow::bail!("`reminders delete` needs --kind or --prefix (--prefix '' is every reminder)");
            };
            let secret = read_secret(shared_secret_file.as_deref())?;
            let store = rollcall::connect(&store).await?;
            let table = store.reminder_table(&service)?;
            let started = std::time::Instant::now();
            let mut hashes = std::collections::BTreeSet::new();
            let done = rollcall::paging::remove_prefix(
                &*table,
                &prefix,
                1000,
                32,
                std::time::Duration::from_secs(10),
                &mut |row| {
                    hashes.insert(row.hash);
                },
            )
            .await;
            let took = started.elapsed();
            // The holders of the shards it changed read them again at once
            // (also after a failure: what was removed stays removed).
            let transport = rollcall::transport::tcp::TcpTransport::with_config(rollcall::transport::tcp::TcpConfig {
                shared_secret: secret,
                ..Default::default()
            });
            let cluster = cluster.unwrap_or_else(|| service.clone());
            let told = if hashes.is_empty() {
                Ok(rollcall::reminders::ToldShards::default())
            } else {
                rollcall::reminders::tell_shard_holders(
                    &*store,
                    &transport,
                    &cluster,
                    &service,
                    hashes,
                    std::time::Duration::from_secs(5),
                )
                .await
            };
            let done = done
                .map_err(|e| anyhow::anyhow!("{e} (the rows removed so far stay removed; run it again to finish)"))?;
            println!(
                "removed {} reminders of `{prefix}*` from service {service} in {:.1} s ({} changed meanwhile and kept, {} pages)",
                done.removed,
                took.as_secs_f64(),
                done.changed,
                done.pages
            );
            match told {
                Ok(t) => println!(
                    "shards changed: {} told, {} not taken and {} unreached (their next refresh applies it), {} held by no silo",
                    t.taken, t.not_taken, t.failed, t.no_holder
                ),
                Err(e) => println!("the holders were not told ({e}): their next refresh applies it"),
            }
            Ok(())
        }),
        Command::Reminders {
            action: RemindersAction::List,
            store,
            service,
            cluster,
            points,
            limit,
            next,
            kind,
            prefix,
            after,
            ..
        } => actix::System::new().block_on(async move {
            let filter = kind_or_prefix(kind.as_deref(), prefix.as_deref())?;
            let after = after.as_deref().map(rollcall::PageToken::parse).transpose()?;
            let store = rollcall::connect(&store).await?;
            let cluster = cluster.unwrap_or_else(|| service.clone());
            let membership = store
                .membership_table(&cluster, rollcall::ProtocolMode::Extended)?
                .read_all()
                .await?;
            let ring = rollcall::reminders::ring::Ring::of_active(&membership, points);
            let table = store.reminder_table(&service)?;
            if filter.is_some() || after.is_some() {
                let prefix = filter.unwrap_or_default();
                let page = table.read_page(&prefix, after.as_ref(), limit).await?;
                print!(
                    "{}",
                    view::reminders(
                        &service,
                        &page.rows,
                        &ring,
                        rollcall::Timestamp::now(),
                        limit,
                        usize::from(next)
                    )
                );
                match page.next {
                    Some(token) => println!("next page: --after {token}"),
                    None => println!("last page"),
                }
                return Ok(());
            }
            let mut rows = table.read_rows_in_range(0, 0).await?;
            rows.sort_by(|a, b| (a.hash, &a.actor_id, &a.name).cmp(&(b.hash, &b.actor_id, &b.name)));
            print!(
                "{}",
                view::reminders(
                    &service,
                    &rows,
                    &ring,
                    rollcall::Timestamp::now(),
                    limit,
                    usize::from(next)
                )
            );
            Ok(())
        }),
    }
}
