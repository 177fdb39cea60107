//! The longest caller-supplied strings the tables store: [`KeyLimits`].
//!
//! Every table keys its rows by strings a caller passes with each call (actor
//! ids, reminder and state names, silo names, metric ids, statistic names). The
//! core types bound them ([`KeyLimits::CORE`]); a provider whose row keys are
//! smaller (DynamoDB's 1,024-byte sort key) states its own, tighter limits and
//! checks them before it sends anything, so input it cannot store fails the same
//! way on every provider: [`Error::InvalidInput`], nothing written, never a
//! transient [`Error::Backend`] a caller would retry forever.
//!
//! Service and cluster ids are configuration, not per-call input: at most 256
//! bytes on every provider ([`crate::validate_id`]), checked when a table is
//! opened, [`Error::InvalidConfig`].

use crate::{Error, Result};

/// The longest strings one provider stores, bytes (UTF-8). Each limit holds on
/// every table that stores such a string; [`check_key`](Self::check_key) and
/// [`check_label`](Self::check_label) apply them. A provider states its
/// limits in its docs and returns them from
/// [`SystemStore::key_limits`](crate::SystemStore::key_limits).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct KeyLimits {
    /// Longest actor id (`kind/key`) in the reminder and grain-state tables.
    pub actor_id: usize,
    /// Longest reminder or state name.
    pub name: usize,
    /// Longest actor id and name of one reminder or state together (a provider
    /// whose row key holds both has a bound on the pair, tighter than the sum of
    /// the two above).
    pub actor_id_and_name: usize,
    /// Longest label: a membership row's host, silo and role names, a metrics
    /// row's id, a statistic's silo and name.
    pub label: usize,
}

impl KeyLimits {
    /// The limits of the core types, which every provider stores at least up to
    /// unless it says otherwise: 1,024-byte actor ids and names (as
    /// [`StateKey`](crate::StateKey) accepts), 256-byte labels. The memory, Redis
    /// (standalone, Sentinel and Cluster) and etcd providers store exactly these.
    pub const CORE: KeyLimits = KeyLimits {
        actor_id: 1024,
        name: 1024,
        actor_id_and_name: 2048,
        label: 256,
    };

    /// Checks one reminder's or state's key: a non-empty actor id and name
    /// within [`actor_id`](Self::actor_id), [`name`](Self::name) and, together,
    /// [`actor_id_and_name`](Self::actor_id_and_name).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming `actor_id`, `name` or `actor_id+name`.
    pub fn check_key(&self, actor_id: &str, name: &str) -> Result<()> {
        check_len("actor_id", actor_id, self.actor_id)?;
        check_len("name", name, self.name)?;
        let both = actor_id.len() + name.len();
        if both > self.actor_id_and_name {
            return Err(Error::invalid_input(
                "actor_id+name",
                format!(
                    "{both} bytes together, over the {} this provider stores",
                    self.actor_id_and_name
                ),
            ));
        }
        Ok(())
    }

    /// Checks an actor id alone (a read of all of an actor's reminders).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming `actor_id`.
    pub fn check_actor_id(&self, actor_id: &str) -> Result<()> {
        check_len("actor_id", actor_id, self.actor_id)
    }

    /// Checks an actor kind (a listing of the grain-state table by kind): non-empty
    /// and within [`actor_id`](Self::actor_id).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming `kind`.
    pub fn check_kind(&self, kind: &str) -> Result<()> {
        check_len("kind", kind, self.actor_id)
    }

    /// Checks a label named `what`: non-empty, within [`label`](Self::label), no
    /// control characters.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] naming `what`.
    pub fn check_label(&self, what: &str, label: &str) -> Result<()> {
        check_len(what, label, self.label)?;
        if label.chars().any(char::is_control) {
            return Err(Error::invalid_input(what, "contains control characters"));
        }
        Ok(())
    }
}

/// `value` (argument `what`) is non-empty and at most `max` bytes.
fn check_len(what: &str, value: &str, max: usize) -> Result<()> {
    if value.is_empty() {
        return Err(Error::invalid_input(what, "must not be empty"));
    }
    if value.len() > max {
        return Err(Error::invalid_input(
            what,
            format!("{} bytes, over the {max} this provider stores", value.len()),
        ));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_limit_admits_its_bound_and_names_what_is_past_it() {
        let l = KeyLimits {
            actor_id: 10,
            name: 8,
            actor_id_and_name: 12,
            label: 4,
        };
        assert!(l.check_key("a/3456789", "abc").is_ok()); // 9 + 3 = 12
        let what = |r: Result<()>| match r {
            Err(Error::InvalidInput { what, .. }) => what,
            other => panic!("expected InvalidInput, got {other:?}"),
        };
        assert_eq!(what(l.check_key("a/345678901", "b")), "actor_id");
        assert_eq!(what(l.check_key("a/b", "123456789")), "name");
        assert_eq!(what(l.check_key("a/3456789", "abcd")), "actor_id+name");
        assert_eq!(what(l.check_key("", "n")), "actor_id");
        assert!(l.check_label("host", "abcd").is_ok());
        assert_eq!(what(l.check_label("host", "abcde")), "host");
        assert_eq!(what(l.check_label("host", "a\nb")), "host");
        assert_eq!(what(l.check_actor_id("a/345678901")), "actor_id");
    }
}
