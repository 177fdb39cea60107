//! The error type shared by every rollcall table and provider.

use std::error::Error as StdError;

/// A boxed error from a backend client, kept as the `source` of [`Error::Backend`].
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// Errors of the membership and reminder tables and of option validation.
///
/// A concurrency conflict (a stale etag, a row that already exists on insert) is
/// **not** an error: conditional writes answer `Ok(false)` for it. An `Err` always means
/// the operation could not be carried out and nothing is known about its outcome
/// beyond what the variant says.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The storage backend failed or could not be reached (connection refused,
    /// timeout, server error). Transient: the caller may retry. Its `Display` ends
    /// with the client error's own chain of causes (`: cause: cause ...`), so a log
    /// line names what went wrong, e.g. a Redis `WRONGTYPE`.
    #[error("storage backend error: {message}{}", cause_chain(source.as_deref()))]
    Backend {
        /// What was being done and what went wrong.
        message: String,
        /// The client library's error, when there is one.
        #[source]
        source: Option<BoxError>,
    },
    /// A stored row or value could not be decoded. Nothing was changed; other rows
    /// remain readable.
    #[error("corrupt value at key `{key}`: {reason}")]
    Corrupt {
        /// The backend key (or row key) that holds the bad value.
        key: String,
        /// Why it does not decode.
        reason: String,
    },
    /// An option, a store URL or an argument is invalid.
    #[error("invalid configuration: `{field}`: {reason}")]
    InvalidConfig {
        /// The offending field, option or URL part (e.g. `num_votes_for_death_declaration`).
        field: String,
        /// Why it is invalid.
        reason: String,
    },
    /// A value passed to one call cannot be stored or breaks a rule of the table:
    /// a key longer than the provider stores (see [`crate::KeyLimits`]), an empty
    /// name, control characters, a row over its size bound. Detected before
    /// anything is sent, so nothing was written. Not transient: the same call fails
    /// the same way, so it is never worth retrying (unlike [`Error::Backend`]), and
    /// it is not [`Error::InvalidConfig`], which is about options and store URLs.
    #[error("invalid input: `{what}`: {why}")]
    InvalidInput {
        /// The offending argument or field (e.g. `actor_id`, `name`, `metrics.id`).
        what: String,
        /// Why it cannot be stored, with the bound (e.g. `1,009 bytes; the
        /// dynamodb provider stores at most 1,008`).
        why: String,
    },
    /// The operation or store is not available in this build or provider (e.g. a
    /// store URL whose provider feature is compiled out).
    #[error("unsupported: {0}")]
    Unsupported(String),
    /// A state write or clear found another etag than it expected (Orleans'
    /// `InconsistentStateException`): another writer won. Nothing was written;
    /// re-read, re-apply, write again (see [`crate::state`]).
    #[error("inconsistent state at `{key}`: expected etag {expected:?}, found {current:?}")]
    InconsistentState {
        /// The state (`actor#name`).
        key: String,
        /// The etag the writer expected (`None`: no record).
        expected: Option<crate::Etag>,
        /// The etag found (`None`: no record).
        current: Option<crate::Etag>,
    },
    /// A write under a [`Fence`](crate::Fence) (a state write or clear, or a
    /// shard holder's reminder-row write: a removal, `last_fired`, a run
    /// append) found the fence's shard lease no longer at the fence's epoch,
    /// held (another silo acquired it since, or it was released): the writer
    /// is no longer the owner. Checked by the store in the write's own
    /// transaction; nothing was written. Not retried: the new owner writes it.
    #[error("`{key}` is fenced: shard {shard} of service `{service}` is no longer held at epoch {epoch} (now: {current:?})")]
    Fenced {
        /// What was written: a state (`actor#name`), or a reminder
        /// (`reminder actor/name`).
        key: String,
        /// The lease's service.
        service: String,
        /// The shard.
        shard: u32,
        /// The epoch the writer held.
        epoch: u64,
        /// The lease's epoch if it is held now (`None`: released or never
        /// acquired).
        current: Option<u64>,
    },
    /// A state larger than the provider stores; nothing was written.
    #[error("state `{key}` of {size} bytes is larger than the {max} bytes a state may have")]
    TooLarge {
        /// The state (`actor#name`).
        key: String,
        /// Its size, bytes.
        size: u64,
        /// The largest size, bytes.
        max: u64,
    },
    /// A state write's commit failed in a way that may have been applied (a
    /// timeout, a lost connection), and the read that would have told which also
    /// failed. The state is either the old one or the one written, whole; the
    /// next call of the same `PersistentState` reads the header to learn which.
    /// Transient.
    #[error("the outcome of the write of state `{key}` is unknown: {reason}")]
    OutcomeUnknown {
        /// The state (`actor#name`).
        key: String,
        /// What failed (the commit's error, then the read's).
        reason: String,
    },
}

impl Error {
    /// A [`Error::Backend`] without a source.
    pub fn backend(message: impl Into<String>) -> Self {
        Error::Backend {
            message: message.into(),
            source: None,
        }
    }

    /// A [`Error::Backend`] wrapping a client error.
    pub fn backend_with(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Error::Backend {
            message: message.into(),
            source: Some(source.into()),
        }
    }

    /// A [`Error::Corrupt`] for `key`.
    pub fn corrupt(key: impl Into<String>, reason: impl ToString) -> Self {
        Error::Corrupt {
            key: key.into(),
            reason: reason.to_string(),
        }
    }

    /// A [`Error::InvalidConfig`] naming `field`.
    pub fn invalid_config(field: impl Into<String>, reason: impl Into<String>) -> Self {
        Error::InvalidConfig {
            field: field.into(),
            reason: reason.into(),
        }
    }

    /// A [`Error::InvalidInput`] naming `what`.
    pub fn invalid_input(what: impl Into<String>, why: impl Into<String>) -> Self {
        Error::InvalidInput {
            what: what.into(),
            why: why.into(),
        }
    }

    /// True for errors worth retrying: [`Error::Backend`] and
    /// [`Error::OutcomeUnknown`].
    pub fn is_transient(&self) -> bool {
        matches!(self, Error::Backend { .. } | Error::OutcomeUnknown { .. })
    }
}

/// `url` with the password of its `user:password@` part replaced by `***`, for logs
/// and error messages. Works on URLs a URL parser rejects (several comma-separated
/// hosts, as in `etcd://` and `redis+cluster://`); a URL without a password is
/// returned unchanged.
///
/// ```
/// use rollcall_core::redact_password;
/// assert_eq!(redact_password("etcd://root:pw@a:1,b:2"), "etcd://root:***@a:1,b:2");
/// assert_eq!(redact_password("redis://h:6379"), "redis://h:6379");
/// ```
pub fn redact_password(url: &str) -> String {
    match (url.find("://"), url.rfind('@')) {
        (Some(s), Some(at)) if at > s => match url[s + 3..at].split_once(':') {
            Some((user, _)) => format!("{}{user}:***{}", &url[..s + 3], &url[at..]),
            None => url.to_owned(),
        },
        _ => url.to_owned(),
    }
}

/// `": cause: its cause ..."` for an error's source chain ("" without one).
fn cause_chain(source: Option<&(dyn StdError + Send + Sync + 'static)>) -> String {
    let mut out = String::new();
    let mut next: Option<&(dyn StdError + 'static)> = source.map(|s| s as &(dyn StdError + 'static));
    while let Some(e) = next {
        out.push_str(": ");
        out.push_str(&e.to_string());
        next = e.source();
    }
    out
}

/// Runs `call` for at most `timeout`: its own result, or `timed_out(timeout)` if it
/// has not answered by then (the call is dropped). The one way rollcall bounds a
/// store or network call, so that every public call answers within a stated bound.
///
/// ```
/// # #[tokio::main(flavor = "current_thread")] async fn main() {
/// use std::time::Duration;
/// use rollcall_core::{bounded, Error};
/// let slow = async {
///     tokio::time::sleep(Duration::from_secs(60)).await;
///     Ok::<u32, Error>(1)
/// };
/// let r = bounded(Duration::from_millis(10), slow, |t| {
///     Error::backend(format!("no answer within {t:?}"))
/// })
/// .await;
/// assert!(r.unwrap_err().is_transient());
/// # }
/// ```
#[cfg(feature = "runtime")]
pub async fn bounded<T, E>(
    timeout: std::time::Duration,
    call: impl std::future::Future<Output = std::result::Result<T, E>>,
    timed_out: impl FnOnce(std::time::Duration) -> E,
) -> std::result::Result<T, E> {
    match tokio::time::timeout(timeout, call).await {
        Ok(result) => result,
        Err(_) => Err(timed_out(timeout)),
    }
}

/// Runs `attempt` until it succeeds, fails with a non-transient error, or `within`
/// has passed, backing off between tries (100 ms, doubling, at most 5 s; the last
/// try starts no later than `within` after the call). Each transient failure is
/// logged (`tracing` warn, "`what` unreachable; retrying").
///
/// Used where a store that is not up yet must be waited for: opening a store
/// (`rollcall::connect_retrying`) and a joining silo's table `init`, both bounded by
/// Orleans' `max_join_attempt_time`.
///
/// # Errors
/// A non-transient error at once; after `within`, [`Error::Backend`] saying
/// "`what` unreachable for `within` (N attempts)" with the last error as its source.
#[cfg(feature = "runtime")]
pub async fn retry_transient<T, F, Fut>(what: &str, within: std::time::Duration, mut attempt: F) -> Result<T>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<T>>,
{
    use std::time::Duration;
    let deadline = tokio::time::Instant::now() + within;
    let mut delay = Duration::from_millis(100);
    let mut attempts = 1u32;
    loop {
        match attempt().await {
            Ok(v) => return Ok(v),
            Err(e) if e.is_transient() => {
                let left = deadline.saturating_duration_since(tokio::time::Instant::now());
                if left.is_zero() {
                    return Err(Error::backend_with(
                        format!("{what} unreachable for {within:?} ({attempts} attempts)"),
                        e,
                    ));
                }
                tracing::warn!(attempt = attempts, error = %e, retry_in = ?delay.min(left), "{what} unreachable; retrying");
                tokio::time::sleep(delay.min(left)).await;
                delay = (delay * 2).min(Duration::from_secs(5));
                attempts += 1;
            }
            Err(e) => return Err(e),
        }
    }
}

/// `Result` with [`Error`].
pub type Result<T, E = Error> = std::result::Result<T, E>;

/// Errors of a silo's lifecycle and of the calls on its handle.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SiloError {
    /// The membership table failed (after the silo's retries), or an option is
    /// invalid.
    #[error(transparent)]
    Table(#[from] Error),
    /// The probe endpoint could not be served.
    #[error(transparent)]
    Transport(#[from] TransportError),
    /// Some Active silos stayed unreachable for `max_join_attempt_time`; this silo
    /// wrote itself Dead and stopped.
    #[error("could not reach {unreachable:?} within max_join_attempt_time ({waited:?})")]
    JoinTimeout {
        /// The silos that never answered.
        unreachable: Vec<crate::SiloAddress>,
        /// How long the silo tried.
        waited: std::time::Duration,
    },
    /// A newer generation of this endpoint is in the table: this process is stale.
    #[error("superseded by the newer generation {by}")]
    Superseded {
        /// The newer silo.
        by: crate::SiloAddress,
    },
    /// The cluster declared this silo Dead.
    #[error("this silo was declared Dead")]
    DeclaredDead,
    /// The call did not complete within its documented bound.
    #[error("no answer within {0:?}")]
    Timeout(std::time::Duration),
    /// The silo's agents have stopped.
    #[error("the silo is stopped")]
    Stopped,
}

/// Why a request got no response.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum TransportError {
    /// No response within the timeout.
    #[error("no response within {0:?}")]
    Timeout(std::time::Duration),
    /// The peer could not be reached (connection refused, reset, no route).
    #[error("peer unreachable: {0}")]
    Unreachable(String),
    /// The peer sent bytes that are not a valid frame.
    #[error("bad frame: {0}")]
    Codec(String),
    /// The peer refused the request: it serves another cluster.
    #[error("refused by the peer: {0}")]
    Refused(String),
    /// A frame without a valid HMAC tag where a shared secret is set (or a tagged
    /// frame where none is): dropped unanswered.
    #[error("unauthenticated frame: {0}")]
    Unauthenticated(String),
    /// The local endpoint could not be served.
    #[error("cannot serve {addr}: {reason}")]
    Bind {
        /// The endpoint.
        addr: std::net::SocketAddr,
        /// Why.
        reason: String,
    },
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("WRONGTYPE Operation against a key holding the wrong kind of value")]
    struct WrongType(#[source] std::io::Error);

    #[test]
    fn backend_errors_show_their_causes() {
        let inner = std::io::Error::other("connection 7");
        let e = Error::backend_with("redis: read_all", WrongType(inner));
        assert_eq!(
            e.to_string(),
            "storage backend error: redis: read_all: WRONGTYPE Operation against a key holding \
             the wrong kind of value: connection 7"
        );
        assert_eq!(
            Error::backend("timed out").to_string(),
            "storage backend error: timed out"
        );
        // Through SiloError (transparent) too.
        let s = SiloError::from(Error::backend_with(
            "redis: read_all",
            WrongType(std::io::Error::other("x")),
        ));
        assert!(s.to_string().contains("WRONGTYPE"), "{s}");
    }
}
