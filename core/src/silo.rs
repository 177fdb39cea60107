//! Silo identity ([`SiloAddress`]) and lifecycle status ([`SiloStatus`]).

use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::Error;

/// The identity of one silo process: its probe endpoint plus a **generation**.
///
/// As in Orleans (`SiloAddress`: `IP:port:epoch`), a restarted process on the same
/// `ip:port` gets a new, larger generation and is therefore a different silo; the old
/// generation is declared Dead when the new one joins. rollcall uses the process start
/// time in milliseconds since the UNIX epoch as the generation.
///
/// Text form: `ip:port@generation`, with IPv6 addresses in brackets
/// (`[::1]:11111@1795000000000`). It is the row key of the membership table.
/// Ordered by (ip, port, generation).
#[derive(Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct SiloAddress {
    endpoint: SocketAddr,
    generation: u64,
}

impl SiloAddress {
    /// A silo at `endpoint` (its probe/silo-to-silo port) with `generation`.
    pub fn new(endpoint: SocketAddr, generation: u64) -> Self {
        SiloAddress { endpoint, generation }
    }

    /// The probe endpoint (`ip:port`).
    pub fn endpoint(&self) -> SocketAddr {
        self.endpoint
    }

    /// The IP address.
    pub fn ip(&self) -> IpAddr {
        self.endpoint.ip()
    }

    /// The silo-to-silo (probe) port.
    pub fn port(&self) -> u16 {
        self.endpoint.port()
    }

    /// The generation (epoch): process start time in ms since the UNIX epoch.
    pub fn generation(&self) -> u64 {
        self.generation
    }

    /// True when `other` runs on the same `ip:port` (any generation).
    pub fn same_endpoint(&self, other: &SiloAddress) -> bool {
        self.endpoint == other.endpoint
    }
}

impl fmt::Display for SiloAddress {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}@{}", self.endpoint, self.generation)
    }
}

impl fmt::Debug for SiloAddress {
    /// The text form, as in `Display` (`10.0.0.1:11111@1795000000000`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Display::fmt(self, f)
    }
}

impl FromStr for SiloAddress {
    type Err = Error;

    /// Parses `ip:port@generation` (`[v6]:port@generation` for IPv6).
    ///
    /// # Errors
    /// [`Error::InvalidConfig`] with field `silo_address` when the text is not of
    /// that form.
    fn from_str(s: &str) -> Result<Self, Error> {
        let bad = |why: &str| Error::invalid_config("silo_address", format!("`{s}`: {why}"));
        let (ep, gen) = s
            .rsplit_once('@')
            .ok_or_else(|| bad("expected ip:port@generation"))?;
        let endpoint: SocketAddr = ep.parse().map_err(|_| bad("bad ip:port"))?;
        let generation: u64 = gen.parse().map_err(|_| bad("bad generation"))?;
        Ok(SiloAddress::new(endpoint, generation))
    }
}

impl Serialize for SiloAddress {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for SiloAddress {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = <std::borrow::Cow<'de, str>>::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

/// Lifecycle status of a silo, as written in its membership row.
///
/// Same states and order as Orleans' `SiloStatus`. A silo's status only moves forward
/// in this order (`Created < Joining < Active < ShuttingDown/Stopping < Dead`), and
/// `Dead` is final: a Dead silo never comes back under the same generation.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum SiloStatus {
    /// The process exists but has not written its row yet.
    Created,
    /// The row is written; the silo is validating connectivity to the Active silos.
    Joining,
    /// A full member: probed, probing, owning reminder ranges.
    Active,
    /// Graceful shutdown in progress.
    ShuttingDown,
    /// Ungraceful stop in progress.
    Stopping,
    /// Declared dead by others, or stopped. Final.
    Dead,
}

impl SiloStatus {
    /// All statuses, in lifecycle order.
    pub const ALL: [SiloStatus; 6] = [
        SiloStatus::Created,
        SiloStatus::Joining,
        SiloStatus::Active,
        SiloStatus::ShuttingDown,
        SiloStatus::Stopping,
        SiloStatus::Dead,
    ];

    /// True for `ShuttingDown`, `Stopping` and `Dead`: the silo is leaving or gone.
    pub fn is_terminating(self) -> bool {
        matches!(
            self,
            SiloStatus::ShuttingDown | SiloStatus::Stopping | SiloStatus::Dead
        )
    }

    /// True for `Active` only.
    pub fn is_active(self) -> bool {
        self == SiloStatus::Active
    }

    /// Whether a silo in status `self` may move to `next`: only forward, `Dead` is
    /// final, and `ShuttingDown`/`Stopping` may only move on to `Dead`. Staying in the
    /// same status is allowed.
    pub fn can_transition_to(self, next: SiloStatus) -> bool {
        if self == next {
            return true;
        }
        match self {
            SiloStatus::Dead => false,
            SiloStatus::ShuttingDown | SiloStatus::Stopping => next == SiloStatus::Dead,
            _ => next > self,
        }
    }

    /// The name used in tables and logs (`"Active"`, ...).
    pub fn as_str(self) -> &'static str {
        match self {
            SiloStatus::Created => "Created",
            SiloStatus::Joining => "Joining",
            SiloStatus::Active => "Active",
            SiloStatus::ShuttingDown => "ShuttingDown",
            SiloStatus::Stopping => "Stopping",
            SiloStatus::Dead => "Dead",
        }
    }
}

impl fmt::Display for SiloStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl FromStr for SiloStatus {
    type Err = Error;

    fn from_str(s: &str) -> Result<Self, Error> {
        SiloStatus::ALL
            .into_iter()
            .find(|st| st.as_str() == s)
            .ok_or_else(|| Error::invalid_config("silo_status", format!("unknown status `{s}`")))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn address_text_round_trip_v4_and_v6() {
        for s in ["10.0.0.1:11111@1795000000000", "[::1]:30000@7"] {
            let a: SiloAddress = s.parse().unwrap();
            assert_eq!(a.to_string(), s);
            let json = serde_json::to_string(&a).unwrap();
            assert_eq!(serde_json::from_str::<SiloAddress>(&json).unwrap(), a);
        }
    }

    #[test]
    fn address_parse_errors_name_the_field() {
        for s in [
            "",
            "10.0.0.1:1",
            "10.0.0.1@3",
            "x:1@2",
            "1.2.3.4:5@-1",
            "1.2.3.4:99999@1",
        ] {
            match s.parse::<SiloAddress>() {
                Err(Error::InvalidConfig { field, .. }) => assert_eq!(field, "silo_address"),
                other => panic!("{s}: {other:?}"),
            }
        }
    }

    #[test]
    fn addresses_order_by_endpoint_then_generation() {
        let a: SiloAddress = "10.0.0.1:1@5".parse().unwrap();
        let b: SiloAddress = "10.0.0.1:1@6".parse().unwrap();
        let c: SiloAddress = "10.0.0.2:1@1".parse().unwrap();
        assert!(a < b && b < c);
        assert!(a.same_endpoint(&b) && !a.same_endpoint(&c));
    }

    #[test]
    fn status_only_moves_forward_and_dead_is_final() {
        use SiloStatus::*;
        assert!(Created.can_transition_to(Joining));
        assert!(Joining.can_transition_to(Active));
        assert!(Active.can_transition_to(ShuttingDown));
        assert!(Active.can_transition_to(Dead));
        assert!(Stopping.can_transition_to(Dead));
        assert!(!Active.can_transition_to(Joining));
        assert!(!ShuttingDown.can_transition_to(Stopping));
        for s in SiloStatus::ALL {
            assert_eq!(Dead.can_transition_to(s), s == Dead);
            assert_eq!(s.as_str().parse::<SiloStatus>().unwrap(), s);
        }
        assert!(Dead.is_terminating() && Stopping.is_terminating() && !Active.is_terminating());
    }
}
