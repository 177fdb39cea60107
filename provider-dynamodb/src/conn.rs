//! The DynamoDB client: SDK configuration (one HTTP stack, the timeout and retry
//! policy of the URL) and the mapping of SDK errors to [`Error::Backend`] carrying
//! the AWS error code.

use std::collections::HashMap;
use std::time::Duration;

use aws_config::retry::RetryConfig;
use aws_config::timeout::TimeoutConfig;
use aws_config::{BehaviorVersion, Region};
use aws_sdk_dynamodb::error::{DisplayErrorContext, ProvideErrorMetadata, SdkError};
use aws_sdk_dynamodb::operation::query::builders::QueryFluentBuilder;
use aws_sdk_dynamodb::operation::transact_write_items::TransactWriteItemsError;
use aws_sdk_dynamodb::types::{
    AttributeValue, DeleteRequest, KeysAndAttributes, TransactWriteItem, WriteRequest,
};
use aws_sdk_dynamodb::Client;
use rollcall_core::{Error, Etag, Result};

use crate::config::DynamoDbConfig;

/// One item: attribute name -> typed value.
pub(crate) type Item = HashMap<String, AttributeValue>;

/// The SDK client and what error messages name.
#[derive(Clone)]
pub(crate) struct Conn {
    pub(crate) client: Client,
    pub(crate) config: DynamoDbConfig,
    /// Where requests go, for messages.
    endpoint: String,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("endpoint", &self.endpoint)
            .field("config", &self.config)
            .finish()
    }
}

impl Conn {
    pub(crate) async fn open(config: &DynamoDbConfig) -> Result<Conn> {
        let http = aws_smithy_http_client::Builder::new()
            .tls_provider(aws_smithy_http_client::tls::Provider::Rustls(
                aws_smithy_http_client::tls::rustls_provider::CryptoMode::Ring,
            ))
            .build_https();
        let timeouts = TimeoutConfig::builder()
            .operation_timeout(config.timeout)
            .connect_timeout(config.timeout)
            .build();
        let mut loader = aws_config::defaults(BehaviorVersion::latest())
            .http_client(http)
            .timeout_config(timeouts)
            .retry_config(RetryConfig::standard().with_max_attempts(config.max_attempts));
        if let Some(region) = &config.region {
            loader = loader.region(Region::new(region.clone()));
        }
        let shared = loader.load().await;
        let mut builder = aws_sdk_dynamodb::config::Builder::from(&shared);
        if shared.region().is_none() {
            builder = builder.region(Region::new("us-east-1"));
        }
        if let Some(endpoint) = &config.endpoint {
            builder = builder.endpoint_url(endpoint.clone());
        }
        let endpoint = config.endpoint.clone().unwrap_or_else(|| {
            format!(
                "DynamoDB in {}",
                shared.region().map_or("us-east-1", |r| r.as_ref())
            )
        });
        Ok(Conn {
            client: Client::from_conf(builder.build()),
            config: config.clone(),
            endpoint,
        })
    }

    /// The outcome of a conditional call `sent` (`what` on `table`): `Some` of its
    /// output when it applied, `None` when its condition failed (nothing was
    /// written), else the error of [`error`](Self::error).
    pub(crate) fn conditional<O, E, R>(
        &self,
        what: &str,
        table: &str,
        sent: Result<O, SdkError<E, R>>,
    ) -> Result<Option<O>>
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
        R: std::fmt::Debug + Send + Sync + 'static,
    {
        match sent {
            Ok(out) => Ok(Some(out)),
            Err(e) if is_condition_failed(&e) => Ok(None),
            Err(e) => Err(self.error(what, table, e)),
        }
    }

    /// An [`Error::Backend`] for a failed SDK call: what was done, on which table
    /// and endpoint, the AWS error code (`ThrottlingException`,
    /// `ResourceNotFoundException`, ...) or the transport failure, and the SDK's
    /// error as the source.
    pub(crate) fn error<E, R>(&self, what: &str, table: &str, e: SdkError<E, R>) -> Error
    where
        E: ProvideErrorMetadata + std::error::Error + Send + Sync + 'static,
        R: std::fmt::Debug + Send + Sync + 'static,
    {
        let why = match &e {
            SdkError::TimeoutError(_) => format!("no answer within {:?}", self.config.timeout),
            SdkError::DispatchFailure(_) => "the request could not be sent (endpoint unreachable?)".into(),
            SdkError::ConstructionFailure(_) => {
                format!("the request could not be built ({})", DisplayErrorContext(&e))
            }
            _ => match (e.code(), e.message()) {
                (Some(code), Some(msg)) => format!("{code}: {msg}"),
                (Some(code), None) => code.to_owned(),
                _ => DisplayErrorContext(&e).to_string(),
            },
        };
        Error::backend_with(
            format!(
                "dynamodb {what} on table `{table}` at {} failed: {why}",
                self.endpoint
            ),
            e,
        )
    }
}

impl Conn {
    /// Every item a Query returns, all pages (the SDK's paginator).
    pub(crate) async fn query_all(&self, table: &str, query: QueryFluentBuilder) -> Result<Vec<Item>> {
        query
            .table_name(table)
            .into_paginator()
            .items()
            .send()
            .try_collect()
            .await
            .map_err(|e| self.error("Query", table, e))
    }

    /// The first `max` items a Query returns, reading only as many pages as needed.
    pub(crate) async fn query_pages(
        &self,
        table: &str,
        query: QueryFluentBuilder,
        max: usize,
    ) -> Result<Vec<Item>> {
        let mut stream = query.table_name(table).into_paginator().items().send();
        let mut items = Vec::new();
        while items.len() < max {
            match stream.try_next().await {
                Ok(Some(item)) => items.push(item),
                Ok(None) => break,
                Err(e) => return Err(self.error("Query", table, e)),
            }
        }
        Ok(items)
    }

    /// The items with `keys` in `table` (strongly consistent), 100 per
    /// BatchGetItem, asking again for unprocessed keys with a growing pause
    /// (10 ms doubling to 500 ms). Keys come back unprocessed under throttling,
    /// and also whenever a response would pass DynamoDB's 16 MB: a batch of
    /// large chunk items takes several calls. A call that returned items is
    /// progress and starts a new timeout; a timeout without one is
    /// `Error::Backend`. So a batch takes at most one call per key, each
    /// bounded by the client's timeout. Missing items are simply absent from
    /// the answer.
    pub(crate) async fn batch_get(&self, table: &str, keys: Vec<Item>) -> Result<Vec<Item>> {
        let mut found = Vec::with_capacity(keys.len());
        for chunk in keys.chunks(100) {
            let mut deadline = tokio::time::Instant::now() + self.config.timeout;
            let mut pending = chunk.to_vec();
            let mut pause = Duration::from_millis(10);
            while !pending.is_empty() {
                let request = KeysAndAttributes::builder()
                    .set_keys(Some(pending))
                    .consistent_read(true)
                    .build()
                    .map_err(|e| Error::backend(format!("dynamodb get request: {e}")))?;
                let out = self
                    .client
                    .batch_get_item()
                    .request_items(table, request)
                    .send()
                    .await
                    .map_err(|e| self.error("BatchGetItem", table, e))?;
                if let Some(mut r) = out.responses {
                    let items = r.remove(table).unwrap_or_default();
                    if !items.is_empty() {
                        // Progress (a response cut at 16 MB, not throttling).
                        deadline = tokio::time::Instant::now() + self.config.timeout;
                        pause = Duration::from_millis(10);
                    }
                    found.extend(items);
                }
                pending = out
                    .unprocessed_keys
                    .and_then(|mut u| u.remove(table))
                    .map(|k| k.keys)
                    .unwrap_or_default();
                if !pending.is_empty() {
                    if tokio::time::Instant::now() + pause >= deadline {
                        return Err(Error::backend(format!(
                            "dynamodb BatchGetItem on table `{table}` at {}: {} keys still \
                             unprocessed after {:?} without progress",
                            self.endpoint,
                            pending.len(),
                            self.config.timeout
                        )));
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
            }
        }
        Ok(found)
    }

    /// Runs one TransactWriteItems on `table`; `Ok(false)` when a condition failed or
    /// a concurrent transaction got in the way (nothing was written).
    pub(crate) async fn transact(
        &self,
        what: &str,
        table: &str,
        ops: Vec<TransactWriteItem>,
    ) -> Result<bool> {
        match self
            .client
            .transact_write_items()
            .set_transact_items(Some(ops))
            .send()
            .await
        {
            Ok(_) => Ok(true),
            Err(e) if is_conflict(&e) => Ok(false),
            Err(e) => Err(self.error(what, table, e)),
        }
    }

    /// Deletes the items with `keys` from `table` without conditions, 25 per
    /// BatchWriteItem, sending unprocessed items (throttling) again with a growing
    /// pause, for at most one timeout per batch: then `Error::Backend`.
    pub(crate) async fn batch_delete(&self, table: &str, keys: Vec<Item>) -> Result<()> {
        for chunk in keys.chunks(25) {
            let deadline = tokio::time::Instant::now() + self.config.timeout;
            let mut requests: Vec<WriteRequest> = chunk
                .iter()
                .map(|k| {
                    DeleteRequest::builder()
                        .set_key(Some(k.clone()))
                        .build()
                        .map(|d| WriteRequest::builder().delete_request(d).build())
                        .map_err(|e| Error::backend(format!("dynamodb delete request: {e}")))
                })
                .collect::<Result<_>>()?;
            let mut pause = Duration::from_millis(10);
            while !requests.is_empty() {
                let out = self
                    .client
                    .batch_write_item()
                    .request_items(table, requests)
                    .send()
                    .await
                    .map_err(|e| self.error("BatchWriteItem", table, e))?;
                requests = out
                    .unprocessed_items
                    .and_then(|mut u| u.remove(table))
                    .unwrap_or_default();
                if !requests.is_empty() {
                    if tokio::time::Instant::now() + pause >= deadline {
                        return Err(Error::backend(format!(
                            "dynamodb BatchWriteItem on table `{table}` at {}: {} deletes still \
                             unprocessed after {:?}",
                            self.endpoint,
                            requests.len(),
                            self.config.timeout
                        )));
                    }
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(500));
                }
            }
        }
        Ok(())
    }
}

/// A fresh etag: 64 random bits as 16 hex digits.
pub(crate) fn new_etag() -> Etag {
    Etag::new(format!("{:016x}", rand::random::<u64>()))
}

pub(crate) fn s(v: impl Into<String>) -> AttributeValue {
    AttributeValue::S(v.into())
}

pub(crate) fn n(v: impl std::fmt::Display) -> AttributeValue {
    AttributeValue::N(v.to_string())
}

/// Typed reads of one item's attributes; every failure names the attribute.
pub(crate) struct Attrs<'a>(pub(crate) &'a Item);

impl Attrs<'_> {
    pub(crate) fn s(&self, name: &str) -> std::result::Result<&str, String> {
        match self.0.get(name) {
            Some(AttributeValue::S(v)) => Ok(v),
            Some(_) => Err(format!("attribute {name} is not a string")),
            None => Err(format!("attribute {name} is missing")),
        }
    }

    pub(crate) fn opt_s(&self, name: &str) -> std::result::Result<Option<&str>, String> {
        match self.0.get(name) {
            None | Some(AttributeValue::Null(_)) => Ok(None),
            Some(_) => self.s(name).map(Some),
        }
    }

    pub(crate) fn n<T: std::str::FromStr>(&self, name: &str) -> std::result::Result<T, String> {
        match self.0.get(name) {
            Some(AttributeValue::N(v)) => v
                .parse()
                .map_err(|_| format!("attribute {name} = {v} is out of range")),
            Some(_) => Err(format!("attribute {name} is not a number")),
            None => Err(format!("attribute {name} is missing")),
        }
    }

    /// A boolean attribute that may be absent (absent or `NULL` reads as false).
    pub(crate) fn opt_bool(&self, name: &str) -> std::result::Result<bool, String> {
        match self.0.get(name) {
            None | Some(AttributeValue::Null(_)) => Ok(false),
            Some(AttributeValue::Bool(b)) => Ok(*b),
            Some(_) => Err(format!("attribute {name} is not a boolean")),
        }
    }

    pub(crate) fn opt_n<T: std::str::FromStr>(&self, name: &str) -> std::result::Result<Option<T>, String> {
        match self.0.get(name) {
            None | Some(AttributeValue::Null(_)) => Ok(None),
            Some(_) => self.n(name).map(Some),
        }
    }

    pub(crate) fn parsed<T: std::str::FromStr>(&self, name: &str) -> std::result::Result<T, String>
    where
        T::Err: std::fmt::Display,
    {
        let v = self.s(name)?;
        v.parse().map_err(|e| format!("attribute {name} = {v:?}: {e}"))
    }

    /// A list of strings, each parsed.
    pub(crate) fn list<T: std::str::FromStr>(&self, name: &str) -> std::result::Result<Vec<T>, String>
    where
        T::Err: std::fmt::Display,
    {
        match self.0.get(name) {
            None => Ok(Vec::new()),
            Some(AttributeValue::L(items)) => items
                .iter()
                .map(|i| match i {
                    AttributeValue::S(v) => v.parse().map_err(|e| format!("attribute {name}: {v:?}: {e}")),
                    _ => Err(format!("attribute {name} holds a value that is not a string")),
                })
                .collect(),
            Some(_) => Err(format!("attribute {name} is not a list")),
        }
    }
}

/// Whether a failed call is a `ConditionalCheckFailedException`.
pub(crate) fn is_condition_failed<E: ProvideErrorMetadata, R>(e: &SdkError<E, R>) -> bool {
    matches!(e, SdkError::ServiceError(_)) && e.code() == Some("ConditionalCheckFailedException")
}

/// Whether a failed call is a `ResourceNotFoundException` (no such table).
pub(crate) fn is_not_found<E: ProvideErrorMetadata, R>(e: &SdkError<E, R>) -> bool {
    matches!(e, SdkError::ServiceError(_)) && e.code() == Some("ResourceNotFoundException")
}

/// Whether a TransactWriteItems failed on a condition or a concurrent transaction
/// (nothing was written): `Ok(false)` for a conditional write, a retry for a fold.
pub(crate) fn is_conflict<R>(e: &SdkError<TransactWriteItemsError, R>) -> bool {
    match e.as_service_error() {
        Some(TransactWriteItemsError::TransactionCanceledException(c)) => {
            let reasons = c.cancellation_reasons();
            reasons.is_empty()
                || reasons
                    .iter()
                    .any(|r| matches!(r.code(), Some("ConditionalCheckFailed" | "TransactionConflict")))
        }
        Some(other) => matches!(
            other.code(),
            Some("TransactionConflictException" | "ConditionalCheckFailedException")
        ),
        None => false,
    }
}
