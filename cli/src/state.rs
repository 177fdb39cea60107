//! `rollcall state get|list|delete`: the grain-state table from the command line.

use clap::{Args, Subcommand};
use rollcall::state::{ClearMode, Codec, Expected, StateKey, StateStorage};

/// Where the states are.
#[derive(Args, Debug)]
pub struct StateArgs {
    /// Store URL (memory://, redis://host:port, etcd://host:port, dynamodb://table?endpoint=...).
    #[arg(long, default_value = "memory://", global = true)]
    store: String,
    /// Service id (the state table's).
    #[arg(long, default_value = "rollcall", global = true)]
    service: String,
    #[command(subcommand)]
    command: StateCommand,
}

#[derive(Subcommand, Debug)]
enum StateCommand {
    /// Print one state: pretty JSON when its codec is JSON, else its size; and its etag.
    Get {
        /// The actor, `kind/key`.
        #[arg(long)]
        actor: String,
        /// The state name.
        #[arg(long)]
        name: String,
    },
    /// Delete one state, header and chunks, whatever it holds (no etag is
    /// compared): the way out of a record that reads as corrupt. The actor's next
    /// write is a first write.
    Delete {
        /// The actor, `kind/key`.
        #[arg(long)]
        actor: String,
        /// The state name.
        #[arg(long)]
        name: String,
    },
    /// List the states of one actor kind (`actor#name`, one per line).
    List {
        /// The actor kind.
        #[arg(long)]
        actor_kind: String,
        /// Print at most this many.
        #[arg(long, default_value_t = 1000)]
        limit: usize,
    },
}

/// Runs the command; the text it prints.
pub async fn run(args: StateArgs) -> anyhow::Result<String> {
    let store = rollcall::connect(&args.store).await?;
    let storage = StateStorage::new(store.state_table(&args.service)?);
    match args.command {
        StateCommand::Get { actor, name } => {
            let key = StateKey::new(actor, name)?;
            let r = storage.read(&key).await?;
            let etag = r.etag.as_ref().map_or("-".to_owned(), |e| e.to_string());
            if !r.record_exists {
                return Ok(format!("{key}: no record (etag {etag})\n"));
            }
            let body = match r.codec {
                Codec::Json => match serde_json::from_slice::<serde_json::Value>(&r.data) {
                    Ok(v) => serde_json::to_string_pretty(&v)?,
                    Err(e) => format!("({} bytes of JSON that does not parse: {e})", r.data.len()),
                },
                other => format!("({} bytes, codec {other:?})", r.data.len()),
            };
            Ok(format!("{key} (etag {etag}, {} bytes)\n{body}\n", r.data.len()))
        }
        StateCommand::Delete { actor, name } => {
            let key = StateKey::new(actor, name)?;
            storage.clear(&key, Expected::Any, ClearMode::Delete).await?;
            Ok(format!("{key}: deleted\n"))
        }
        StateCommand::List { actor_kind, limit } => {
            let mut out = String::new();
            let mut after: Option<StateKey> = None;
            let mut n = 0;
            while n < limit {
                let page = storage
                    .list(&actor_kind, after.as_ref(), (limit - n).min(500))
                    .await?;
                if page.is_empty() {
                    break;
                }
                for k in &page {
                    out.push_str(&format!("{k}\n"));
                }
                n += page.len();
                after = page.last().cloned();
            }
            if n == 0 {
                out.push_str(&format!("no states of kind `{actor_kind}`\n"));
            }
            Ok(out)
        }
    }
}
