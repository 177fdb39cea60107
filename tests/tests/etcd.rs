//! The etcd provider: the whole conformance suite on a real etcd, and etcd-specific
//! behaviour (corrupt values, outages, auth, a 3-member cluster losing its leader).
#![cfg(feature = "etcd")]

use rollcall_tests::fixtures::{self, Backend};
use rollcall_tests::Store;

async fn store_on(endpoints: &str) -> Store {
    let url = format!("etcd://{endpoints}");
    rollcall::connect(&url)
        .await
        .unwrap_or_else(|e| panic!("connect {url}: {e}"))
}

async fn etcd() -> Option<(Store, Backend)> {
    let b = fixtures::etcd().await?;
    Some((store_on(&b.endpoint).await, b))
}

mod single {
    rollcall_tests::conformance_tests!(super::etcd().await);
}
