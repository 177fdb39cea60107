//! A silo in an actix application: the getting-started chapter's first silo, as a process that runs until stopped.
//!
//! Run two or more in separate terminals on one Redis to see them find each other:
//! `cargo run --example silo --features redis -- redis://127.0.0.1:6379 127.0.0.1:11111`
//! (with the default memory store, each process is its own one-silo cluster).

use rollcall::Silo;

#[actix::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let store_url = args.next().unwrap_or_else(|| "memory://".into());
    let listen = args.next().unwrap_or_else(|| "127.0.0.1:11111".into());

    let store = rollcall::connect(&store_url).await?; // or redis://, etcd://, dynamodb://
    let silo = Silo::builder(store, "orders")
        .listen(listen.parse()?) // the probe port
        .start()
        .await?; // returns once Active
    println!("{} is {}", silo.address(), silo.status());

    let mut membership = silo.subscribe(); // tokio watch; versions only grow
    loop {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {
                // Leave gracefully (ShuttingDown, then Dead): nobody has to detect us.
                silo.shutdown().await?;
                return Ok(());
            }
            changed = membership.changed() => {
                if changed.is_err() {
                    return Ok(()); // the silo stopped (declared Dead)
                }
                let view = membership.borrow_and_update().clone();
                let alive: Vec<_> = view.active().map(|e| e.silo).collect();
                println!("table version {}: {alive:?}", view.version.version);
            }
        }
    }
}
