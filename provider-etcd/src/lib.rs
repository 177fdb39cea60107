//! # rollcall-provider-etcd
//!
//! Membership and reminder tables on etcd (Txn compares on `mod_revision`). **Not implemented yet**: [`EtcdStore::connect`] answers
//! [`Error::Unsupported`]; the provider's own issue fills it in.

#![warn(missing_docs)]

use std::sync::Arc;

use rollcall_membership_core::{Error, Result, SystemStore};

/// A etcd-backed [`SystemStore`] (placeholder).
#[derive(Debug)]
pub struct EtcdStore {
    _private: (),
}

impl EtcdStore {
    /// Connects to the store named by `url`.
    ///
    /// # Errors
    /// Always [`Error::Unsupported`] in this release: the provider is not implemented.
    pub async fn connect(url: &str) -> Result<Arc<dyn SystemStore>> {
        Err(Error::Unsupported(format!(
            "the etcd provider is not implemented yet (store URL `{url}`)"
        )))
    }
}
