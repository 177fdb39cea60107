//! # rollcall-provider-dynamodb
//!
//! Membership and reminder tables on DynamoDB (conditional puts and TransactWriteItems). **Not implemented yet**: [`DynamoDbStore::connect`] answers
//! [`Error::Unsupported`]; the provider's own issue fills it in.

#![warn(missing_docs)]

use std::sync::Arc;

use rollcall_membership_core::{Error, Result, SystemStore};

/// A DynamoDB-backed [`SystemStore`] (placeholder).
#[derive(Debug)]
pub struct DynamoDbStore {
    _private: (),
}

impl DynamoDbStore {
    /// Connects to the store named by `url`.
    ///
    /// # Errors
    /// Always [`Error::Unsupported`] in this release: the provider is not implemented.
    pub async fn connect(url: &str) -> Result<Arc<dyn SystemStore>> {
        Err(Error::Unsupported(format!(
            "the DynamoDB provider is not implemented yet (store URL `{url}`)"
        )))
    }
}
