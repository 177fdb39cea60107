//! A client process that rewrites one large actor state in a loop, for the test
//! that kills a writer between its chunks and its header
//! (`state_table::killed_writer_process_leaves_a_whole_state`).
//!
//! Usage: `state-writer <store url> <service> <actor> <name> <bytes>`. Each round
//! writes `state_payload(bytes, round)` under the etag it read, and prints
//! `wrote <round>`.

use rollcall::state::{Codec, Expected, StateKey, StateStorage};

#[tokio::main(flavor = "current_thread")]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let args: Vec<String> = std::env::args().collect();
    let [_, url, service, actor, name, bytes] = args.as_slice() else {
        return Err("usage: state-writer <store url> <service> <actor> <name> <bytes>".into());
    };
    let store = rollcall::connect(url).await?;
    let storage = StateStorage::new(store.state_table(service)?);
    let key = StateKey::new(actor.as_str(), name.as_str())?;
    let n: usize = bytes.parse()?;
    for round in 1u8.. {
        let etag = storage.read(&key).await?.etag;
        let data = rollcall_tests::state_table::state_payload(n, round);
        storage
            .write(&key, Expected::from_etag(etag.as_ref()), Codec::Raw, &data, None)
            .await?;
        println!("wrote {round}");
    }
    Ok(())
}
