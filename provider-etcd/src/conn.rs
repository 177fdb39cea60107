//! The etcd client: one balanced gRPC channel, every call bounded by the timeout
//! and its errors mapped to [`Error::Backend`] naming the endpoints and the gRPC
//! status.

use std::time::Duration;

use etcd_client::{
    Certificate, Client, ConnectOptions, DeleteOptions, GetOptions, GetResponse, Identity, KvClient,
    TlsOptions, Txn, TxnResponse,
};
use rollcall_core::{Error, Result};

use crate::config::EtcdConfig;

/// Largest gRPC response accepted (a `read_all` of 10,000 rows is ~5 MB; tonic's
/// default limit is 4 MiB).
const MAX_RESPONSE_BYTES: usize = 256 << 20;

pub(crate) struct Conn {
    kv: KvClient,
    lease: etcd_client::LeaseClient,
    endpoints: String,
    timeout: Duration,
}

impl std::fmt::Debug for Conn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Conn")
            .field("endpoints", &self.endpoints)
            .field("timeout", &self.timeout)
            .finish()
    }
}

fn read_file(field: &str, path: &std::path::Path) -> Result<Vec<u8>> {
    std::fs::read(path)
        .map_err(|e| Error::invalid_config(field, format!("cannot read `{}`: {e}", path.display())))
}

/// The gRPC status of a client error, for messages (`Unavailable`, ...).
fn status_of(e: &etcd_client::Error) -> String {
    match e {
        etcd_client::Error::GRpcStatus(s) => format!("gRPC status {:?}", s.code()),
        etcd_client::Error::TransportError(_) => "transport error".into(),
        _ => "client error".into(),
    }
}

/// The revision an etag names (`mod_revision` as decimal, >= 0); `None` for
/// anything else, which no stored key can have.
pub(crate) fn revision(etag: &rollcall_core::Etag) -> Option<i64> {
    etag.as_str().parse().ok().filter(|r| *r >= 0)
}

/// Whether the call failed while connecting, before any byte of it was sent.
fn never_sent(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            s.code() == tonic::Code::Unavailable && s.message().contains("connect error")
        }
        _ => false,
    }
}

/// Whether etcd refused the credentials (as opposed to being unreachable).
fn is_auth_failure(e: &etcd_client::Error) -> bool {
    match e {
        etcd_client::Error::GRpcStatus(s) => {
            matches!(
                s.code(),
                tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
            ) || s.message().contains("authentication failed")
        }
        _ => false,
    }
}

impl Conn {
    pub(crate) async fn open(config: &EtcdConfig) -> Result<Conn> {
        let mut options = ConnectOptions::new()
            .with_timeout(config.timeout)
            .with_connect_timeout(config.timeout)
            .with_keep_alive(config.timeout, config.timeout)
            // A member cut off from its leader fails at once instead of waiting.
            .with_require_leader(true)
            .with_auto_token_refresh(true);
        if let Some((user, password)) = &config.user {
            options = options.with_user(user.clone(), password.clone());
        }
        if config.tls {
            let mut tls = TlsOptions::new();
            if let Some(ca) = &config.ca_file {
                tls = tls.ca_certificate(Certificate::from_pem(read_file("ca_file", ca)?));
            }
            if let Some((cert, key)) = &config.client_cert {
                tls = tls.identity(Identity::from_pem(
                    read_file("cert_file", cert)?,
                    read_file("key_file", key)?,
                ));
            }
            if let Some(domain) = &config.domain {
                tls = tls.domain_name(domain.clone());
            }
            options = options.with_tls(tls);
        }
        let endpoints = config.endpoints.join(",");
        let urls = config.endpoint_urls();
        let connecting = Client::connect(&urls, Some(options));
        let client = match tokio::time::timeout(config.timeout, connecting).await {
            Ok(Ok(c)) => c,
            Ok(Err(e)) if is_auth_failure(&e) => {
                let user = config.user.as_ref().map_or("", |(u, _)| u.as_str());
                return Err(Error::invalid_config(
                    "store_url",
                    format!("etcd at {endpoints} rejected the credentials of user `{user}`: {e}"),
                ));
            }
            Ok(Err(e)) => {
                return Err(Error::backend_with(
                    format!("etcd connect to {endpoints} failed ({})", status_of(&e)),
                    e,
                ))
            }
            Err(_) => {
                return Err(Error::backend(format!(
                    "etcd connect to {endpoints}: no answer within {:?}",
                    config.timeout
                )))
            }
        };
        let kv = client.kv_client().max_decoding_message_size(MAX_RESPONSE_BYTES);
        Ok(Conn {
            kv,
            lease: client.lease_client(),
            endpoints,
            timeout: config.timeout,
        })
    }

    /// One linearizable keys-only read of at most one key under `prefix` (a whole
    /// key prefix, e.g. `rollcall/`): proves a member with a leader answers and the
    /// credentials may read there.
    pub(crate) async fn check(&self, what: &str, prefix: &str) -> Result<()> {
        let options = GetOptions::new().with_prefix().with_keys_only().with_limit(1);
        self.get(what, prefix, Some(options)).await.map(|_| ())
    }

    /// The per-request timeout.
    pub(crate) fn timeout(&self) -> Duration {
        self.timeout
    }

    fn error(&self, what: &str, e: etcd_client::Error) -> Error {
        if is_auth_failure(&e) {
            return Error::backend_with(
                format!(
                    "etcd {what} at {} refused: not permitted ({})",
                    self.endpoints,
                    status_of(&e)
                ),
                e,
            );
        }
        Error::backend_with(
            format!("etcd {what} at {} failed ({})", self.endpoints, status_of(&e)),
            e,
        )
    }

    /// Runs one client call within the timeout. A call that failed before it
    /// reached any member (a refused connection: the channel picked a member that
    /// is down) is sent again, to whichever member the channel picks, until the
    /// timeout: that is safe for writes too, since nothing was sent.
    async fn bounded<T, F, Fut>(&self, what: &str, mut call: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>>,
    {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut pause = Duration::from_millis(5);
        loop {
            match tokio::time::timeout_at(deadline, call()).await {
                Ok(Ok(v)) => return Ok(v),
                Ok(Err(e)) if never_sent(&e) && tokio::time::Instant::now() + pause < deadline => {
                    tokio::time::sleep(pause).await;
                    pause = (pause * 2).min(Duration::from_millis(200));
                }
                Ok(Err(e)) => return Err(self.error(what, e)),
                Err(_) => {
                    return Err(Error::backend(format!(
                        "etcd {what} at {}: no answer within {:?}",
                        self.endpoints, self.timeout
                    )))
                }
            }
        }
    }

    pub(crate) async fn txn(&self, what: &str, txn: Txn) -> Result<TxnResponse> {
        self.bounded(what, || {
            let mut kv = self.kv.clone();
            let txn = txn.clone();
            async move { kv.txn(txn).await }
        })
        .await
    }

    pub(crate) async fn get(
        &self,
        what: &str,
        key: impl Into<Vec<u8>>,
        options: Option<GetOptions>,
    ) -> Result<GetResponse> {
        let key = key.into();
        self.bounded(what, || {
            let (mut kv, key, options) = (self.kv.clone(), key.clone(), options.clone());
            async move { kv.get(key, options).await }
        })
        .await
    }

    /// A lease of `ttl_secs` seconds (keys put with it go when it expires).
    pub(crate) async fn grant(&self, what: &str, ttl_secs: i64) -> Result<i64> {
        self.bounded(what, || {
            let mut lease = self.lease.clone();
            async move { lease.grant(ttl_secs, None).await }
        })
        .await
        .map(|r| r.id())
    }

    /// Revokes lease `id` (its keys go with it); a lease already gone is fine.
    pub(crate) async fn revoke(&self, what: &str, id: i64) -> Result<()> {
        let r = self
            .bounded(what, || {
                let mut lease = self.lease.clone();
                async move { lease.revoke(id).await }
            })
            .await;
        match r {
            Err(e) if e.to_string().contains("not found") => Ok(()),
            other => other.map(|_| ()),
        }
    }

    /// Deletes the keys in `[from, to)`.
    pub(crate) async fn delete_range(&self, what: &str, from: &str, to: &str) -> Result<()> {
        self.bounded(what, || {
            let (mut kv, from, to) = (self.kv.clone(), from.to_owned(), to.to_owned());
            async move { kv.delete(from, Some(DeleteOptions::new().with_range(to))).await }
        })
        .await
        .map(|_| ())
    }

    pub(crate) async fn delete_prefix(&self, what: &str, prefix: &str) -> Result<()> {
        self.bounded(what, || {
            let (mut kv, prefix) = (self.kv.clone(), prefix.to_owned());
            async move { kv.delete(prefix, Some(DeleteOptions::new().with_prefix())).await }
        })
        .await
        .map(|_| ())
    }
}
