//! The etcd client: one balanced gRPC channel we build ourselves (its HTTP/2
//! limits set, see [`endpoint`]), every call bounded by the timeout without
//! cancelling its stream (see [`Conn::bounded`]), and its errors mapped to
//! [`Error::Backend`] naming the endpoints and the gRPC status.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use etcd_client::{
    Certificate, Client, ConnectOptions, DeleteOptions, GetOptions, GetResponse, Identity, KvClient,
    TlsOptions, Txn, TxnResponse,
};
use rollcall_core::{Error, Result};
use tokio::sync::Semaphore;
use tonic::transport::Endpoint;

use crate::config::EtcdConfig;

/// Largest gRPC response accepted (a `read_all` of 10,000 rows is ~5 MB; tonic's
/// default limit is 4 MiB).
const MAX_RESPONSE_BYTES: usize = 256 << 20;

/// Calls left running on their own at once (see [`Conn::bounded`]): a caller
/// that stops waiting leaves its call running to its answer, up to this many;
/// beyond, a call is cancelled at its timeout as any future is.
const DETACHED_MAX: usize = 4_096;

/// How much longer than the timeout a call left running may wait for its
/// answer before it is cancelled after all, and how much longer than the
/// timeout HTTP/2 remembers a stream it reset (so a late answer to it is
/// ignored quietly).
const LATE_ANSWER: Duration = Duration::from_secs(30);

/// Locally reset streams HTTP/2 remembers at once (h2's default is 50).
const RESET_STREAMS: usize = 10_000;

/// HTTP/2 keepalive ping interval while calls are in flight. Not tied to the
/// timeout: etcd answers pings more frequent than its
/// `--grpc-keepalive-min-time` (5 s by default) with
/// `GOAWAY(ENHANCE_YOUR_CALM, "too_many_pings")`.
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);

/// Counter by `provider` (`etcd`) and `outcome`: calls of the store's
/// client by what became of them, one of `resent` (never reached etcd, sent
/// again), `goaway` (failed or sent again by etcd's GOAWAY), `own_goaway`
/// (failed by the client closing its own connection), `connection_lost`
/// (failed by their connection's end, outcome unknown), `left_running`
/// (timed out and left to run to their answer), `cancelled` (timed out and
/// cancelled: no room to leave them running).
pub const CALLS: &str = "rollcall_store_calls_total";

/// What the client saw ([`rollcall_core::StoreConnection`]), counted as it
/// happens.
#[derive(Debug, Default)]
struct Seen {
    resent: AtomicU64,
    goaways: AtomicU64,
    own_goaways: AtomicU64,
    connection_lost: AtomicU64,
    left_running: AtomicU64,
    cancelled: AtomicU64,
}

impl Seen {
    fn count(counter: &AtomicU64, outcome: &'static str) {
        counter.fetch_add(1, Ordering::Relaxed);
        metrics::counter!(CALLS, "provider" => "etcd", "outcome" => outcome).increment(1);
    }
}

/// What an error says of how the call's connection fared.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Cause {
    /// etcd sent a GOAWAY (its stream was above the last, or etcd shed
    /// the connection).
    GoAway,
    /// The client closed its own connection (h2's GOAWAY).
    OwnGoAway,
    /// The connection ended under the call.
    Lost,
    /// Anything else (an answer from etcd, a connect error).
    Other,
}

/// Reads an error's causes for what became of its connection.
fn cause_of(e: &etcd_client::Error) -> Cause {
    let etcd_client::Error::GRpcStatus(status) = e else {
        return Cause::Other;
    };
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(c) = cause {
        if let Some(h2) = c.downcast_ref::<h2::Error>() {
            return match (h2.is_go_away(), h2.is_remote()) {
                (true, true) => Cause::GoAway,
                (true, false) => Cause::OwnGoAway,
                _ if h2.is_io() => Cause::Lost,
                _ => Cause::Other,
            };
        }
        if let Some(hyper) = c.downcast_ref::<hyper::Error>() {
            if hyper.is_closed() || hyper.is_incomplete_message() {
                return Cause::Lost;
            }
        }
        cause = c.source();
    }
    Cause::Other
}

/// A call that, dropped before its answer (at its timeout, or by a caller
/// that stopped waiting), goes on to its answer on a task of its own, which
/// drops it, instead of being cancelled (see [`Conn::bounded`]). Answered in
/// time, it costs no task.
struct Detached<F: std::future::Future + Send + 'static>
where
    F::Output: Send + 'static,
{
    call: Option<std::pin::Pin<Box<F>>>,
    /// Room for calls left running ([`DETACHED_MAX`]).
    running: Arc<Semaphore>,
    seen: Arc<Seen>,
    /// When a call left running is cancelled after all.
    last: tokio::time::Instant,
}

impl<F: std::future::Future + Send + 'static> std::future::Future for Detached<F>
where
    F::Output: Send + 'static,
{
    type Output = F::Output;

    fn poll(
        mut self: std::pin::Pin<&mut Self>,
        cx: &mut std::task::Context<'_>,
    ) -> std::task::Poll<F::Output> {
        let Some(call) = self.call.as_mut() else {
            // Polled again after its answer: never done by `attempt`.
            return std::task::Poll::Pending;
        };
        let answer = std::task::ready!(call.as_mut().poll(cx));
        self.call = None;
        std::task::Poll::Ready(answer)
    }
}

impl<F: std::future::Future + Send + 'static> Drop for Detached<F>
where
    F::Output: Send + 'static,
{
    fn drop(&mut self) {
        let Some(call) = self.call.take() else {
            return;
        };
        // Outside a runtime (a process ending) the call is cancelled.
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        match self.running.clone().try_acquire_owned() {
            Ok(room) => {
                Seen::count(&self.seen.left_running, "left_running");
                let last = self.last;
                runtime.spawn(async move {
                    let _room = room;
                    let _ = tokio::time::timeout_at(last, call).await;
                });
            }
            Err(_) => Seen::count(&self.seen.cancelled, "cancelled"),
        }
    }
}

pub(crate) struct Conn {
    /// One client per channel (`channels` in the URL), each over HTTP/2
    /// connections of its own, one per member; calls take them in turn.
    pool: Vec<(KvClient, etcd_client::LeaseClient)>,
    /// The channel the next call takes (modulo the pool's size).
    next: std::sync::atomic::AtomicUsize,
    endpoints: String,
    timeout: Duration,
    /// Room for calls running on their own ([`DETACHED_MAX`]).
    running: Arc<Semaphore>,
    seen: Arc<Seen>,
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

/// Whether the call provably never reached etcd, so sending it again is safe
/// for a write too: it failed while connecting; or HTTP/2 says so (hyper
/// canceled it before sending it, its connection closing; etcd refused its
/// stream, `REFUSED_STREAM`; or etcd went away naming a last stream below
/// its own, which RFC 9113 section 6.8 says was not and will not be
/// processed: h2 fails only such streams with the peer's GOAWAY, the ones
/// cut by the connection's end fail with an I/O error).
fn never_sent(e: &etcd_client::Error) -> bool {
    let etcd_client::Error::GRpcStatus(status) = e else {
        return false;
    };
    if status.code() == tonic::Code::Unavailable && status.message().contains("connect error") {
        return true;
    }
    let mut cause: Option<&(dyn std::error::Error + 'static)> = std::error::Error::source(status);
    while let Some(c) = cause {
        if c.downcast_ref::<hyper::Error>()
            .is_some_and(hyper::Error::is_canceled)
        {
            return true;
        }
        if let Some(h2) = c.downcast_ref::<h2::Error>() {
            let refused = h2.is_reset() && h2.reason() == Some(h2::Reason::REFUSED_STREAM);
            return h2.is_remote() && (refused || h2.is_go_away());
        }
        cause = c.source();
    }
    false
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

/// The TLS settings of `config` (`etcds://`), `None` for plain gRPC.
fn tls_of(config: &EtcdConfig) -> Result<Option<TlsOptions>> {
    if !config.tls {
        return Ok(None);
    }
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
    Ok(Some(tls))
}

/// The gRPC endpoint of one member at `url`, with the HTTP/2 limits set for
/// calls that outlive their caller (see [`Conn::bounded`]): a stream reset
/// is remembered for the timeout plus [`LATE_ANSWER`], up to
/// [`RESET_STREAMS`] of them, and the count of late frames the client
/// answers with a reset of its own is not capped. h2 caps that count at
/// 1,024 per connection by default and then closes the connection itself
/// with `GOAWAY(ENHANCE_YOUR_CALM, "too_many_internal_resets")`: with the
/// 1-s, 50-stream memory it had, every call that timed out against a slow
/// etcd added one, and a loaded silo lost its connection (hyperium/h2#856).
/// The cap guards a server against abusive clients; our peer is the
/// configured etcd. No request timeout on the endpoint: tonic would cancel
/// the stream at it. Keepalive pings every [`KEEPALIVE_INTERVAL`] while
/// calls are in flight, a connection that does not answer one within the
/// timeout (at least 2 s) is closed.
fn endpoint(url: &str, config: &EtcdConfig, tls: Option<&TlsOptions>) -> Result<Endpoint> {
    let endpoint = Endpoint::from_shared(url.to_owned())
        .map_err(|e| Error::invalid_config("store_url", format!("`{url}` is no endpoint: {e}")))?
        .connect_timeout(config.timeout)
        .tcp_nodelay(true)
        .http2_keep_alive_interval(KEEPALIVE_INTERVAL)
        .keep_alive_timeout(config.timeout.max(Duration::from_secs(2)))
        .keep_alive_while_idle(false)
        .http2_reset_stream_duration(config.timeout + LATE_ANSWER)
        .http2_max_concurrent_reset_streams(RESET_STREAMS)
        .http2_max_local_error_reset_streams(None);
    match tls {
        Some(tls) => endpoint
            .tls_config(tls.clone())
            .map_err(|e| Error::invalid_config("store_url", format!("TLS settings for `{url}`: {e}"))),
        None => Ok(endpoint),
    }
}

impl Conn {
    /// Opens the pool on the `rollcall-io` thread
    /// ([`rollcall_core::io::on_io`]): the channels' connection and balancer
    /// tasks live there, not on the caller's arbiter, whose actors may keep
    /// it busy while the silo's own threads need the store.
    pub(crate) async fn open(config: &EtcdConfig) -> Result<Conn> {
        let config = config.clone();
        rollcall_core::io::on_io(async move { Self::open_here(&config).await }).await
    }

    async fn open_here(config: &EtcdConfig) -> Result<Conn> {
        let mut options = ConnectOptions::new()
            // A member cut off from its leader fails at once instead of waiting.
            .with_require_leader(true)
            .with_auto_token_refresh(true);
        if let Some((user, password)) = &config.user {
            options = options.with_user(user.clone(), password.clone());
        }
        let tls = tls_of(config)?;
        let endpoints = config.endpoints.join(",");
        let members = config
            .endpoint_urls()
            .iter()
            .map(|url| endpoint(url, config, tls.as_ref()))
            .collect::<Result<Vec<_>>>()?;
        // Within one timeout for the whole pool: each channel connects (and
        // authenticates) on its own.
        let deadline = tokio::time::Instant::now() + config.timeout;
        let channels = config.channels.clamp(1, crate::config::MAX_CHANNELS);
        let mut pool = Vec::with_capacity(channels);
        for _ in 0..channels {
            let channel = tonic::transport::Channel::balance_list(members.clone().into_iter());
            let connecting =
                Client::from_channel(etcd_client::Channel::Tonic(channel), Some(options.clone()));
            let client = match tokio::time::timeout_at(deadline, connecting).await {
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
            pool.push((kv, client.lease_client()));
        }
        Ok(Conn {
            pool,
            next: std::sync::atomic::AtomicUsize::new(0),
            endpoints,
            timeout: config.timeout,
            running: Arc::new(Semaphore::new(DETACHED_MAX)),
            seen: Arc::default(),
        })
    }

    /// One linearizable keys-only read of at most one key under `prefix` (a whole
    /// key prefix, e.g. `rollcall/`): proves a member with a leader answers and the
    /// credentials may read there.
    pub(crate) async fn check(&self, what: &str, prefix: &str) -> Result<()> {
        let options = GetOptions::new().with_prefix().with_keys_only().with_limit(1);
        self.get(what, prefix, Some(options)).await.map(|_| ())
    }

    /// The next channel's KV client (the channels in turn).
    fn kv(&self) -> KvClient {
        self.channel().0.clone()
    }

    /// The next channel's lease client.
    fn lease(&self) -> etcd_client::LeaseClient {
        self.channel().1.clone()
    }

    fn channel(&self) -> &(KvClient, etcd_client::LeaseClient) {
        let i = self.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        &self.pool[i % self.pool.len()]
    }

    /// Counts what `e` says of the call's connection, and warns when the
    /// client closed its own connection (which the HTTP/2 limits set in
    /// [`endpoint`] are there to prevent).
    fn saw(&self, what: &str, e: &etcd_client::Error) -> Cause {
        let cause = cause_of(e);
        match cause {
            Cause::GoAway => Seen::count(&self.seen.goaways, "goaway"),
            Cause::OwnGoAway => {
                Seen::count(&self.seen.own_goaways, "own_goaway");
                tracing::warn!(
                    endpoints = %self.endpoints,
                    call = what,
                    error = %e,
                    "the etcd client closed its own connection (an HTTP/2 GOAWAY of its own, \
                     such as ENHANCE_YOUR_CALM too_many_internal_resets)"
                );
            }
            Cause::Lost => Seen::count(&self.seen.connection_lost, "connection_lost"),
            Cause::Other => {}
        }
        cause
    }

    /// What the client saw of its connections.
    pub(crate) fn connection(&self) -> rollcall_core::StoreConnection {
        let n = |c: &AtomicU64| c.load(Ordering::Relaxed);
        rollcall_core::StoreConnection {
            endpoints: self.endpoints.clone(),
            channels: self.pool.len(),
            resent: n(&self.seen.resent),
            goaways: n(&self.seen.goaways),
            own_goaways: n(&self.seen.own_goaways),
            connection_lost: n(&self.seen.connection_lost),
            left_running: n(&self.seen.left_running),
            still_running: (DETACHED_MAX - self.running.available_permits()) as u64,
            cancelled: n(&self.seen.cancelled),
        }
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

    /// Runs one client call within the timeout. A call that provably never
    /// reached etcd (a refused connection: the channel picked a member that is
    /// down; a request HTTP/2 did not send or etcd refused, see [`never_sent`])
    /// is sent again, to whichever member the channel picks, until the
    /// timeout: that is safe for writes too, since nothing was applied.
    ///
    /// When the timeout passes (or the caller drops this future) the caller
    /// gets its error and the call goes on, on a task of its own, to its
    /// answer, which is dropped, for at most the timeout plus
    /// [`LATE_ANSWER`]. Dropping the call's future instead would reset its
    /// HTTP/2 stream (`RST_STREAM(CANCEL)`), and etcd's late answer to a
    /// reset stream counts against the connection (see [`endpoint`]). Up to
    /// [`DETACHED_MAX`] calls run so at once; beyond, a call is cancelled at
    /// its timeout. A call answered in time costs no task. The outcome of a write left running is unknown to its
    /// caller, as of any write that timed out.
    async fn bounded<T, F, Fut>(&self, what: &str, mut call: F) -> Result<T>
    where
        F: FnMut() -> Fut,
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>> + Send + 'static,
        T: Send + 'static,
    {
        let deadline = tokio::time::Instant::now() + self.timeout;
        let mut pause = Duration::from_millis(5);
        loop {
            match self.attempt(deadline, call()).await {
                Some(Ok(v)) => return Ok(v),
                Some(Err(e)) => {
                    let cause = self.saw(what, &e);
                    if never_sent(&e) && tokio::time::Instant::now() + pause < deadline {
                        if cause != Cause::GoAway {
                            Seen::count(&self.seen.resent, "resent");
                        }
                        tokio::time::sleep(pause).await;
                        pause = (pause * 2).min(Duration::from_millis(200));
                        continue;
                    }
                    return Err(self.error(what, e));
                }
                None => {
                    return Err(Error::backend(format!(
                        "etcd {what} at {}: no answer within {:?}",
                        self.endpoints, self.timeout
                    )))
                }
            }
        }
    }

    /// `call`'s answer if it comes by `deadline` (see [`bounded`](Self::bounded)):
    /// a call not answered by then goes on to its answer on a task of its own.
    async fn attempt<T, Fut>(
        &self,
        deadline: tokio::time::Instant,
        call: Fut,
    ) -> Option<std::result::Result<T, etcd_client::Error>>
    where
        Fut: std::future::Future<Output = std::result::Result<T, etcd_client::Error>> + Send + 'static,
        T: Send + 'static,
    {
        let call = Detached {
            call: Some(Box::pin(call)),
            running: self.running.clone(),
            seen: self.seen.clone(),
            last: deadline + LATE_ANSWER,
        };
        tokio::time::timeout_at(deadline, call).await.ok()
    }

    pub(crate) async fn txn(&self, what: &str, txn: Txn) -> Result<TxnResponse> {
        self.bounded(what, || {
            let mut kv = self.kv();
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
            let (mut kv, key, options) = (self.kv(), key.clone(), options.clone());
            async move { kv.get(key, options).await }
        })
        .await
    }

    /// A lease of `ttl_secs` seconds (keys put with it go when it expires).
    pub(crate) async fn grant(&self, what: &str, ttl_secs: i64) -> Result<i64> {
        self.bounded(what, || {
            let mut lease = self.lease();
            async move { lease.grant(ttl_secs, None).await }
        })
        .await
        .map(|r| r.id())
    }

    /// Revokes lease `id` (its keys go with it); a lease already gone is fine.
    pub(crate) async fn revoke(&self, what: &str, id: i64) -> Result<()> {
        let r = self
            .bounded(what, || {
                let mut lease = self.lease();
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
            let (mut kv, from, to) = (self.kv(), from.to_owned(), to.to_owned());
            async move { kv.delete(from, Some(DeleteOptions::new().with_range(to))).await }
        })
        .await
        .map(|_| ())
    }

    pub(crate) async fn delete_prefix(&self, what: &str, prefix: &str) -> Result<()> {
        self.bounded(what, || {
            let (mut kv, prefix) = (self.kv(), prefix.to_owned());
            async move { kv.delete(prefix, Some(DeleteOptions::new().with_prefix())).await }
        })
        .await
        .map(|_| ())
    }
}
