//! The probe transport: how silos ask each other "are you alive?".
//!
//! Silos talk to each other only for liveness: [`ProbeRequest::Ping`],
//! [`ProbeRequest::IndirectPing`] and [`ProbeRequest::Gossip`] ("re-read the
//! table"), plus small best-effort [`ProbeRequest::Notice`]s for services built on
//! the silo (the reminder service's "re-read this reminder"). A [`Transport`] sends one request and waits for its response; it also
//! serves a [`ProbeHandler`] on a local endpoint. Two implementations:
//! [`tcp::TcpTransport`] for real deployments and [`sim::SimNetwork`], an in-process
//! network with loss, delay, partitions and frozen silos for tests and simulations
//! (it runs under tokio's paused clock).

pub mod sim;
#[cfg(test)]
mod suite;
pub mod tcp;

use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use serde::{Deserialize, Serialize};

use crate::SiloAddress;

/// A request from one silo's membership agents to another silo's probe server.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProbeRequest {
    /// "Are you `target`, and alive?" The responder checks that it *is* `target`
    /// (same generation): a restarted process must not keep its predecessor alive.
    Ping {
        /// The prober.
        from: SiloAddress,
        /// The silo the prober believes it talks to.
        target: SiloAddress,
        /// The prober's membership table version: a target that knows an older one
        /// refreshes (the version spreads with the probes, not only by gossip).
        version: u64,
        /// When the prober sent it, on its wall clock, in ms since the UNIX epoch
        /// (NTP's `T1`: see [`clock`](crate::protocol::clock)); 0 when unknown.
        /// It travels in the frame's trailer ([`Timestamps`]).
        #[serde(skip)]
        sent_ms: u64,
    },
    /// "Please ping `target` for me and tell me whether it answered" (indirect
    /// probe through an intermediary).
    IndirectPing {
        /// The prober asking for help.
        from: SiloAddress,
        /// The suspect to ping.
        target: SiloAddress,
        /// How long the intermediary may wait for the suspect, in milliseconds.
        timeout_ms: u32,
    },
    /// "The membership table changed (now at `version`): re-read it."
    Gossip {
        /// The writer.
        from: SiloAddress,
        /// The table version after its write.
        version: u64,
    },
    /// A small application notice for a service running on the target silo (e.g.
    /// the reminder service's "this reminder changed, re-read it"), handed to the
    /// receiver subscribed to `topic` with
    /// [`SiloHandle::subscribe_notices`](crate::SiloHandle::subscribe_notices).
    /// Best effort: receivers must also reconcile on their own.
    Notice {
        /// The sender.
        from: SiloAddress,
        /// Which service it is for, at most [`MAX_NOTICE_TOPIC`] bytes.
        topic: String,
        /// The service's payload, at most [`MAX_NOTICE_BODY`] bytes.
        body: Vec<u8>,
    },
}

pub use crate::protocol::{MAX_NOTICE_BODY, MAX_NOTICE_TOPIC};

/// A probe server's answer.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub enum ProbeResponse {
    /// Answer to a ping: the responder's identity and local health score (0..=8).
    Pong {
        /// Who answered.
        responder: SiloAddress,
        /// Its local health score; 0 = healthy.
        health: u8,
        /// The responder's membership table version (a prober that knows an older
        /// one refreshes).
        version: u64,
        /// When the responder received the ping, on its wall clock, in ms since
        /// the UNIX epoch (NTP's `T2`); 0 when unknown (a silo built before the
        /// timestamps answered). In the frame's trailer ([`Timestamps`]).
        #[serde(skip)]
        received_ms: u64,
        /// When it answered, likewise (NTP's `T3`).
        #[serde(skip)]
        sent_ms: u64,
    },
    /// Answer to a ping addressed to another generation than the responder's.
    WrongSilo {
        /// Who is actually listening on that endpoint.
        responder: SiloAddress,
    },
    /// Answer to an indirect ping.
    IndirectResult {
        /// Whether the suspect answered the intermediary.
        target_answered: bool,
        /// The intermediary's own health score; a non-zero score makes a negative
        /// result "unknown" rather than a vote.
        intermediary_health: u8,
    },
    /// Gossip received.
    GossipAck,
    /// Answer to a notice: whether a receiver of its topic took it (false: nobody
    /// subscribed, or its queue was full and the notice was dropped).
    NoticeAck {
        /// Whether it was queued for a receiver.
        accepted: bool,
    },
}

impl ProbeResponse {
    /// Who answered a ping (`Pong` or `WrongSilo`); `None` for any other answer.
    pub fn responder(&self) -> Option<SiloAddress> {
        match self {
            ProbeResponse::Pong { responder, .. } | ProbeResponse::WrongSilo { responder } => {
                Some(*responder)
            }
            _ => None,
        }
    }

    /// The outcome of a ping of `target` that got `response` after `rtt` (see
    /// [`PingOutcome::classify`](crate::protocol::PingOutcome::classify)).
    pub fn ping_outcome(
        target: &SiloAddress,
        response: &Result<ProbeResponse, TransportError>,
        rtt: Duration,
    ) -> crate::protocol::PingOutcome {
        let responder = response.as_ref().ok().and_then(ProbeResponse::responder);
        crate::protocol::PingOutcome::classify(target, responder, rtt)
    }

    /// The clock sample of a ping sent at wall time `sent` (monotonic
    /// `sent_monotonic`) whose answer `response` came back at `received`
    /// (monotonic `monotonic`): `Some` for a `Pong`.
    pub fn clock_sample(
        target: &SiloAddress,
        response: &Result<ProbeResponse, TransportError>,
        (sent, sent_monotonic): (crate::Timestamp, Duration),
        (received, monotonic): (crate::Timestamp, Duration),
    ) -> Option<crate::protocol::ClockSample> {
        match response {
            Ok(ProbeResponse::Pong {
                responder,
                received_ms,
                sent_ms,
                ..
            }) if responder == target && *received_ms > 0 && *sent_ms > 0 && sent.as_millis() > 0 => {
                Some(crate::protocol::ClockSample {
                    peer: *target,
                    sent,
                    peer_received: crate::Timestamp::from_millis(*received_ms),
                    peer_sent: crate::Timestamp::from_millis(*sent_ms),
                    received,
                    sent_monotonic,
                    monotonic,
                })
            }
            _ => None,
        }
    }

    /// The table version a ping's answer carries (`Pong`), if any.
    pub fn peer_version(response: &Result<ProbeResponse, TransportError>) -> Option<u64> {
        match response {
            Ok(ProbeResponse::Pong { version, .. }) => Some(*version),
            _ => None,
        }
    }

    /// What an intermediary's answer to `IndirectPing` reports; no answer (or
    /// another one) is [`IndirectOutcome::Unknown`](crate::protocol::IndirectOutcome::Unknown).
    pub fn indirect_outcome(
        response: &Result<ProbeResponse, TransportError>,
    ) -> crate::protocol::IndirectOutcome {
        use crate::protocol::IndirectOutcome;
        match response {
            Ok(ProbeResponse::IndirectResult {
                target_answered: true,
                ..
            }) => IndirectOutcome::Answered,
            Ok(ProbeResponse::IndirectResult {
                target_answered: false,
                intermediary_health,
            }) => IndirectOutcome::Failed {
                intermediary_health: *intermediary_health,
            },
            _ => IndirectOutcome::Unknown,
        }
    }
}

pub use crate::error::TransportError;

/// The server side: answers requests arriving at a silo's probe endpoint.
#[async_trait]
pub trait ProbeHandler: Send + Sync {
    /// Answers one request. Requests on one connection may be handled concurrently.
    async fn handle(&self, request: ProbeRequest) -> ProbeResponse;
}

/// A served endpoint; serving stops when it is dropped.
pub struct Listener {
    /// The address actually bound (port 0 resolved).
    pub local_addr: SocketAddr,
    _guard: Box<dyn Send + Sync>,
}

impl std::fmt::Debug for Listener {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Listener")
            .field("local_addr", &self.local_addr)
            .finish()
    }
}

/// Sends probe requests and serves probe handlers.
///
/// Every request travels in a [`Frame`] that carries a request id and the cluster
/// id: a reply is matched to its request by id (a late reply to a timed-out request
/// is discarded, never handed to the next request), and a server refuses frames of
/// another cluster ([`TransportError::Refused`]).
#[async_trait]
pub trait Transport: Send + Sync + std::fmt::Debug + 'static {
    /// Sends `request`, on behalf of a silo of `cluster`, to the probe endpoint `to`
    /// and waits at most `timeout` for its response.
    ///
    /// # Errors
    /// [`TransportError::Timeout`], [`TransportError::Unreachable`] (nothing listens
    /// there: answered at once, before the timeout), [`TransportError::Refused`] or
    /// [`TransportError::Codec`]; never panics on what the peer sends.
    async fn request(
        &self,
        to: SocketAddr,
        cluster: &str,
        request: ProbeRequest,
        timeout: Duration,
    ) -> Result<ProbeResponse, TransportError>;

    /// Serves `handler` for the silos of `cluster` at `listen` until the returned
    /// [`Listener`] is dropped.
    ///
    /// # Errors
    /// [`TransportError::Bind`] if the endpoint cannot be served.
    async fn serve(
        &self,
        listen: SocketAddr,
        cluster: &str,
        handler: Arc<dyn ProbeHandler>,
    ) -> Result<Listener, TransportError>;
}

/// Frame format version (first byte of every frame). 4: pings and pongs carry the
/// sender's table version. A frame may end with a trailer after its postcard
/// body ([`Timestamps`]), which silos built before it ignore: the version stays.
pub const FRAME_VERSION: u8 = 4;
/// First byte of a frame sealed with a [`SharedSecret`]: the version-2 payload
/// followed by a 32-byte HMAC-SHA256 tag over everything before it.
pub const FRAME_VERSION_SEALED: u8 = 5;
/// Length of the HMAC-SHA256 tag of a sealed frame, in bytes.
pub const TAG_BYTES: usize = 32;

type HmacSha256 = hmac::Hmac<sha2::Sha256>;

/// A cluster's shared secret for the probe port (off by default).
///
/// When a silo has one, every frame it sends carries an HMAC-SHA256 tag (RFC 2104)
/// keyed by it, and every frame it receives without a valid tag is dropped
/// unanswered and never reaches the protocol: a host that can reach the probe port
/// but does not know the secret cannot forge pings, indirect pings or gossip. All
/// silos of a cluster need the same secret. It authenticates, it does not encrypt,
/// and it does not stop the replay of a recorded frame (a replayed gossip costs at
/// most one coalesced table read).
#[derive(Clone)]
pub struct SharedSecret(HmacSha256);

impl SharedSecret {
    /// Minimum secret length, in bytes.
    pub const MIN_BYTES: usize = 16;

    /// A secret from its bytes (e.g. the contents of a key file).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`](crate::Error::InvalidConfig) (field `shared_secret`)
    /// for fewer than [`MIN_BYTES`](Self::MIN_BYTES) bytes.
    pub fn new(secret: impl AsRef<[u8]>) -> crate::Result<Self> {
        use hmac::Mac;
        let secret = secret.as_ref();
        if secret.len() < Self::MIN_BYTES {
            return Err(crate::Error::invalid_config(
                "shared_secret",
                format!("needs at least {} bytes, got {}", Self::MIN_BYTES, secret.len()),
            ));
        }
        HmacSha256::new_from_slice(secret)
            .map(SharedSecret)
            .map_err(|e| crate::Error::invalid_config("shared_secret", e.to_string()))
    }

    fn tag(&self, bytes: &[u8]) -> [u8; TAG_BYTES] {
        use hmac::Mac;
        let mut mac = self.0.clone();
        mac.update(bytes);
        mac.finalize().into_bytes().into()
    }

    fn verify(&self, bytes: &[u8], tag: &[u8]) -> bool {
        use hmac::Mac;
        let mut mac = self.0.clone();
        mac.update(bytes);
        mac.verify_slice(tag).is_ok()
    }
}

impl std::fmt::Debug for SharedSecret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("SharedSecret(..)")
    }
}

/// Seals an [`encode`]d frame with `secret` (no-op without one).
pub fn seal(mut frame: Vec<u8>, secret: Option<&SharedSecret>) -> Vec<u8> {
    if let (Some(secret), Some(first)) = (secret, frame.first_mut()) {
        *first = FRAME_VERSION_SEALED;
        let tag = secret.tag(&frame);
        frame.extend_from_slice(&tag);
    }
    frame
}

/// Checks and strips the seal of a received frame: with a secret, only a sealed
/// frame with a valid tag passes; without one, only an unsealed frame. Returns the
/// frame as [`decode`] takes it.
///
/// # Errors
/// [`TransportError::Unauthenticated`] for a frame that does not pass.
pub fn unseal<'a>(
    bytes: &'a [u8],
    secret: Option<&SharedSecret>,
) -> Result<std::borrow::Cow<'a, [u8]>, TransportError> {
    match (secret, bytes.first()) {
        (None, Some(&FRAME_VERSION_SEALED)) => Err(TransportError::Unauthenticated(
            "a sealed frame, but this silo has no shared secret".into(),
        )),
        (None, _) => Ok(std::borrow::Cow::Borrowed(bytes)),
        (Some(secret), Some(&FRAME_VERSION_SEALED)) if bytes.len() > TAG_BYTES => {
            let (body, tag) = bytes.split_at(bytes.len() - TAG_BYTES);
            if !secret.verify(body, tag) {
                return Err(TransportError::Unauthenticated("bad HMAC tag".into()));
            }
            let mut frame = body.to_vec();
            frame[0] = FRAME_VERSION;
            Ok(std::borrow::Cow::Owned(frame))
        }
        (Some(_), _) => Err(TransportError::Unauthenticated(
            "an unsealed frame, but this cluster requires its shared secret".into(),
        )),
    }
}
/// Largest frame accepted, in bytes; larger frames close the connection.
pub const MAX_FRAME_BYTES: usize = 16 * 1024;

/// What travels on the wire: a request or a response with the id that pairs them
/// and the sender's cluster id.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Frame<T> {
    /// Request id, chosen by the requester, echoed by the response.
    pub id: u64,
    /// The sender's cluster id.
    pub cluster: String,
    /// The message.
    pub body: T,
}

/// The body of a response frame: the handler's answer, or why the server refused
/// the request (a frame of another cluster).
pub type ResponseBody = Result<ProbeResponse, String>;

/// The wall-clock timestamps a message carries in its frame's trailer, after
/// the postcard body: a ping's send time, a pong's receive and send times (ms
/// since the UNIX epoch; see [`clock`](crate::protocol::clock)). postcard
/// ignores bytes after a body, so silos built before the trailer existed read
/// these frames as before, and a frame without one leaves the times at 0.
pub trait Timestamps {
    /// The times to send (none for most messages).
    fn times(&self) -> Vec<u64> {
        Vec::new()
    }

    /// Takes the times received (as many as this message has, in order).
    fn set_times(&mut self, _times: &[u64]) {}
}

impl Timestamps for ProbeRequest {
    fn times(&self) -> Vec<u64> {
        match self {
            ProbeRequest::Ping { sent_ms, .. } => vec![*sent_ms],
            _ => Vec::new(),
        }
    }

    fn set_times(&mut self, times: &[u64]) {
        if let (ProbeRequest::Ping { sent_ms, .. }, [t, ..]) = (self, times) {
            *sent_ms = *t;
        }
    }
}

impl Timestamps for ProbeResponse {
    fn times(&self) -> Vec<u64> {
        match self {
            ProbeResponse::Pong {
                received_ms, sent_ms, ..
            } => vec![*received_ms, *sent_ms],
            _ => Vec::new(),
        }
    }

    fn set_times(&mut self, times: &[u64]) {
        if let (
            ProbeResponse::Pong {
                received_ms, sent_ms, ..
            },
            [r, s, ..],
        ) = (self, times)
        {
            (*received_ms, *sent_ms) = (*r, *s);
        }
    }
}

impl Timestamps for ResponseBody {
    fn times(&self) -> Vec<u64> {
        self.as_ref().map(Timestamps::times).unwrap_or_default()
    }

    fn set_times(&mut self, times: &[u64]) {
        if let Ok(r) = self {
            r.set_times(times);
        }
    }
}

impl<T: Timestamps> Timestamps for Frame<T> {
    fn times(&self) -> Vec<u64> {
        self.body.times()
    }

    fn set_times(&mut self, times: &[u64]) {
        self.body.set_times(times);
    }
}

/// Encodes a message as a frame payload: the version byte, postcard, then the
/// [`Timestamps`] trailer when the message has times.
pub fn encode<T: Serialize + Timestamps>(msg: &T) -> Result<Vec<u8>, TransportError> {
    let codec = |e: postcard::Error| TransportError::Codec(e.to_string());
    let mut out = vec![FRAME_VERSION];
    out.extend(postcard::to_stdvec(msg).map_err(codec)?);
    let times = msg.times();
    if !times.is_empty() {
        out.extend(postcard::to_stdvec(&times).map_err(codec)?);
    }
    Ok(out)
}

/// Decodes a frame payload made by [`encode`]. A trailer that does not decode
/// is ignored (a later format's): the times stay 0.
///
/// # Errors
/// [`TransportError::Codec`] for an empty frame, an unknown version byte or a
/// body that does not decode.
pub fn decode<T: for<'de> Deserialize<'de> + Timestamps>(frame: &[u8]) -> Result<T, TransportError> {
    match frame.split_first() {
        None => Err(TransportError::Codec("empty frame".into())),
        Some((&FRAME_VERSION, payload)) => {
            let (mut msg, rest): (T, &[u8]) =
                postcard::take_from_bytes(payload).map_err(|e| TransportError::Codec(e.to_string()))?;
            if !rest.is_empty() {
                if let Ok(times) = postcard::from_bytes::<Vec<u64>>(rest) {
                    msg.set_times(&times);
                }
            }
            Ok(msg)
        }
        Some((v, _)) => Err(TransportError::Codec(format!("unknown frame version {v}"))),
    }
}

/// The first half of answering a frame: checks the seal and decodes the request.
/// Returns it with whether it comes from our cluster (the connection then belongs
/// to a known peer).
///
/// # Errors
/// [`TransportError::Unauthenticated`] or [`TransportError::Codec`] for bytes that
/// are not a valid request frame (nothing is answered then).
pub(crate) fn open_request(
    cluster: &str,
    secret: Option<&SharedSecret>,
    bytes: &[u8],
) -> Result<(Frame<ProbeRequest>, bool), TransportError> {
    let frame: Frame<ProbeRequest> = decode(&unseal(bytes, secret)?)?;
    let from_peer = frame.cluster == cluster;
    Ok((frame, from_peer))
}

/// The second half: asks `handler` (or refuses another cluster's request) and
/// returns the encoded, sealed response frame.
///
/// # Errors
/// [`TransportError::Codec`] if the response does not encode.
pub(crate) async fn answer_request(
    cluster: &str,
    secret: Option<&SharedSecret>,
    handler: &dyn ProbeHandler,
    frame: Frame<ProbeRequest>,
) -> Result<Vec<u8>, TransportError> {
    let body: ResponseBody = if frame.cluster == cluster {
        Ok(handler.handle(frame.body).await)
    } else {
        Err(format!(
            "this endpoint serves cluster `{cluster}`, not `{}`",
            frame.cluster
        ))
    };
    let out = encode(&Frame {
        id: frame.id,
        cluster: cluster.to_owned(),
        body,
    })?;
    Ok(seal(out, secret))
}

/// The server side of one frame, shared by every transport: [`open_request`], then
/// [`answer_request`].
///
/// # Errors
/// As [`open_request`].
pub(crate) async fn answer_frame(
    cluster: &str,
    secret: Option<&SharedSecret>,
    handler: &dyn ProbeHandler,
    bytes: &[u8],
) -> Result<Vec<u8>, TransportError> {
    let (frame, _) = open_request(cluster, secret, bytes)?;
    answer_request(cluster, secret, handler, frame).await
}

/// The client side of a response frame: checks its seal, returns its id and the
/// answer or refusal.
pub(crate) fn read_response(
    bytes: &[u8],
    secret: Option<&SharedSecret>,
) -> Result<(u64, Result<ProbeResponse, TransportError>), TransportError> {
    let frame: Frame<ResponseBody> = decode(&unseal(bytes, secret)?)?;
    Ok((frame.id, frame.body.map_err(TransportError::Refused)))
}

/// A log line at most once per [`interval`](Self::new): what a peer controls must not
/// control the log volume. Counts what it suppresses and reports it with the next
/// line.
#[derive(Debug)]
pub(crate) struct LogLimiter {
    interval: Duration,
    state: std::sync::Mutex<(Option<tokio::time::Instant>, u64)>,
}

impl LogLimiter {
    pub(crate) fn new(interval: Duration) -> Self {
        LogLimiter {
            interval,
            state: std::sync::Mutex::new((None, 0)),
        }
    }

    /// `Some(suppressed since the last line)` when a line may be logged now.
    pub(crate) fn allow(&self) -> Option<u64> {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        let now = tokio::time::Instant::now();
        match st.0 {
            Some(last) if now.duration_since(last) < self.interval => {
                st.1 += 1;
                None
            }
            _ => {
                st.0 = Some(now);
                Some(std::mem::take(&mut st.1))
            }
        }
    }
}

/// A process-wide source of request ids (unique per process, never reused).
pub(crate) fn next_request_id() -> u64 {
    static NEXT: std::sync::atomic::AtomicU64 = std::sync::atomic::AtomicU64::new(1);
    NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frames_round_trip_and_garbage_is_an_error() {
        let from: SiloAddress = "127.0.0.1:1@1".parse().unwrap();
        let req = ProbeRequest::IndirectPing {
            from,
            target: from,
            timeout_ms: 1500,
        };
        let bytes = encode(&req).unwrap();
        assert_eq!(decode::<ProbeRequest>(&bytes).unwrap(), req);
        let frame = Frame {
            id: u64::MAX,
            cluster: "c".to_owned(),
            body: req.clone(),
        };
        assert_eq!(
            decode::<Frame<ProbeRequest>>(&encode(&frame).unwrap()).unwrap(),
            frame
        );
        assert!(decode::<ProbeRequest>(&[]).is_err());
        assert!(decode::<ProbeRequest>(&[9, 0, 0]).is_err());
        assert!(decode::<ProbeRequest>(&[FRAME_VERSION, 0xff, 0xff, 0xff]).is_err());
        let mut rng_bytes = vec![FRAME_VERSION];
        rng_bytes.extend((0..200u32).map(|i| (i.wrapping_mul(2654435761) >> 13) as u8));
        let _ = decode::<ProbeRequest>(&rng_bytes); // must not panic
    }

    /// The timestamps travel in a trailer: they round-trip, a reader of the
    /// body alone (a silo built before them) decodes the same message, and a
    /// frame without a trailer leaves them 0.
    #[test]
    fn timestamps_travel_in_a_trailer_older_readers_skip() {
        let from: SiloAddress = "127.0.0.1:1@1".parse().unwrap();
        let ping = Frame {
            id: 3,
            cluster: "c".to_owned(),
            body: ProbeRequest::Ping {
                from,
                target: from,
                version: 9,
                sent_ms: 1_795_000_000_123,
            },
        };
        let bytes = encode(&ping).unwrap();
        assert_eq!(decode::<Frame<ProbeRequest>>(&bytes).unwrap(), ping);
        let body_only: Frame<ProbeRequest> = postcard::from_bytes(&bytes[1..]).unwrap();
        assert!(matches!(
            body_only.body,
            ProbeRequest::Ping {
                version: 9,
                sent_ms: 0,
                ..
            }
        ));
        let pong: ResponseBody = Ok(ProbeResponse::Pong {
            responder: from,
            health: 0,
            version: 9,
            received_ms: 5,
            sent_ms: 6,
        });
        assert_eq!(decode::<ResponseBody>(&encode(&pong).unwrap()).unwrap(), pong);
        let mut untrailed = vec![FRAME_VERSION];
        untrailed.extend(postcard::to_stdvec(&pong).unwrap());
        assert!(matches!(
            decode::<ResponseBody>(&untrailed).unwrap(),
            Ok(ProbeResponse::Pong {
                received_ms: 0,
                sent_ms: 0,
                ..
            })
        ));
        let mut garbage_trailer = untrailed.clone();
        garbage_trailer.extend([0xff, 0xff]);
        assert!(
            decode::<ResponseBody>(&garbage_trailer).is_ok(),
            "an unreadable trailer is ignored"
        );
    }

    #[test]
    fn sealed_frames_pass_only_with_the_same_secret() {
        assert!(SharedSecret::new("short").is_err(), "too short");
        let a = SharedSecret::new("0123456789abcdef-a").unwrap();
        let b = SharedSecret::new("0123456789abcdef-b").unwrap();
        let from: SiloAddress = "127.0.0.1:1@1".parse().unwrap();
        let frame = encode(&Frame {
            id: 7,
            cluster: "c".to_owned(),
            body: ProbeRequest::Gossip {
                from,
                version: u64::MAX,
            },
        })
        .unwrap();
        let sealed = seal(frame.clone(), Some(&a));
        assert_eq!(sealed.len(), frame.len() + TAG_BYTES);
        assert_eq!(unseal(&sealed, Some(&a)).unwrap().as_ref(), frame.as_slice());
        assert!(matches!(
            unseal(&sealed, Some(&b)),
            Err(TransportError::Unauthenticated(_))
        ));
        assert!(matches!(
            unseal(&frame, Some(&a)),
            Err(TransportError::Unauthenticated(_))
        ));
        assert!(matches!(
            unseal(&sealed, None),
            Err(TransportError::Unauthenticated(_))
        ));
        let mut tampered = sealed.clone();
        tampered[3] ^= 1;
        assert!(unseal(&tampered, Some(&a)).is_err());
        assert!(
            unseal(&[FRAME_VERSION_SEALED], Some(&a)).is_err(),
            "no room for a tag"
        );
        assert!(unseal(&[], Some(&a)).is_err());
        assert_eq!(unseal(&frame, None).unwrap().as_ref(), frame.as_slice());
        assert_eq!(seal(frame.clone(), None), frame);
        assert_eq!(format!("{a:?}"), "SharedSecret(..)", "never printed");
    }
}
