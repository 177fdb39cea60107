//! Actor ids: the name every tenant of the shard leases (reminders,
//! placement, state) files an actor under.

use std::fmt;

/// Longest actor id (`kind/key`) accepted, in bytes (the core limit,
/// [`KeyLimits::CORE`](crate::KeyLimits::CORE)). A provider may store
/// less ([`SystemStore::key_limits`](crate::SystemStore::key_limits):
/// DynamoDB's are 1,008 bytes); its table then refuses a longer id with
/// [`Error::InvalidInput`](crate::Error::InvalidInput) before anything
/// is written.
pub const MAX_ACTOR_ID: usize = 1024;

/// An actor id [`ActorId::new`] or [`ActorId::parse`] refuses: the id as
/// given (`kind/key`, or the text parsed) and why.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("invalid actor id `{0}`: {1}")]
pub struct InvalidActorId(pub String, pub String);

/// The actor a reminder belongs to: an actor kind (its type, e.g. `"cart"`) and a
/// key within the kind (e.g. `"42"`). Stored in the reminder table as `kind/key`,
/// which is also the text the ring hash ([`actor_hash`](crate::actor_hash))
/// is computed over.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ActorId {
    kind: String,
    key: String,
}

/// Whether `kind` has no `/` and no control characters.
fn valid_kind(kind: &str) -> bool {
    !kind.contains('/') && !kind.chars().any(char::is_control)
}

impl ActorId {
    /// An actor id.
    ///
    /// # Errors
    /// [`InvalidActorId`] for an empty kind or key, a kind containing
    /// `/` or control characters, or an id over [`MAX_ACTOR_ID`] bytes.
    pub fn new(kind: impl Into<String>, key: impl Into<String>) -> Result<ActorId, InvalidActorId> {
        let (kind, key) = (kind.into(), key.into());
        let bad = |why: &str| Err(InvalidActorId(format!("{kind}/{key}"), why.to_owned()));
        if kind.is_empty() || key.is_empty() {
            return bad("kind and key must not be empty");
        }
        if !valid_kind(&kind) {
            return bad("the kind must not contain `/` or control characters");
        }
        if kind.len() + 1 + key.len() > MAX_ACTOR_ID {
            return bad("longer than 1024 bytes");
        }
        Ok(ActorId { kind, key })
    }

    /// The prefix of the ids of every actor of kind `kind`: `kind/` (for
    /// the reminders' listing by prefix and their bulk deletes).
    ///
    /// # Errors
    /// [`InvalidActorId`] for a kind [`new`](Self::new) refuses:
    /// empty, or with `/` or control characters.
    pub fn kind_prefix(kind: &str) -> Result<String, InvalidActorId> {
        if kind.is_empty() || !valid_kind(kind) {
            return Err(InvalidActorId(
                kind.to_owned(),
                "a kind is not empty and has no `/` or control characters".into(),
            ));
        }
        Ok(format!("{kind}/"))
    }

    /// Parses the stored form `kind/key` (split at the first `/`).
    ///
    /// # Errors
    /// [`InvalidActorId`] if there is no `/` or a part is invalid.
    pub fn parse(s: &str) -> Result<ActorId, InvalidActorId> {
        match s.split_once('/') {
            Some((kind, key)) => ActorId::new(kind, key),
            None => Err(InvalidActorId(s.to_owned(), "expected `kind/key`".into())),
        }
    }

    /// The actor kind.
    pub fn kind(&self) -> &str {
        &self.kind
    }

    /// The key within the kind.
    pub fn key(&self) -> &str {
        &self.key
    }
}

impl fmt::Display for ActorId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.kind, self.key)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn actor_ids_round_trip_and_bad_ones_are_typed_errors() {
        let a = ActorId::new("cart", "user/42").unwrap();
        assert_eq!(a.to_string(), "cart/user/42");
        assert_eq!(ActorId::parse("cart/user/42").unwrap(), a);
        for bad in ["", "cart", "/x", "cart/"] {
            assert!(matches!(ActorId::parse(bad), Err(InvalidActorId(..))), "{bad:?}");
        }
        assert!(ActorId::new("a\nb", "k").is_err());
        assert!(ActorId::new("k", "x".repeat(MAX_ACTOR_ID)).is_err());
    }
}
