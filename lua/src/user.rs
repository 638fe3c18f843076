//! The ids a caller hands us: [`UserId`] and [`RequestId`], parsed once at the door
//! with one rule for the gateway, stockd and orderd.
//!
//! The rule: 1..=[`MAX_ID_LEN`] bytes, every byte printable ASCII (no space, no
//! control character, nothing outside ASCII), and no `|`, which separates the
//! reservation id from the request id in a buyer record (`sk:{a:i}:buyers:<s>`).
//! It is the intersection of the three rules the daemons had before (the gateway:
//! printable ASCII; stockd: no whitespace, control or `|`; orderd: length only), so
//! an id the edge lets through is one every daemon accepts.

use crate::MAX_ID_LEN;
use std::fmt;

/// Why a string is not a user or request id.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BadId {
    Empty,
    TooLong(usize),
    /// A space, control character, non-ASCII byte or `|`.
    Forbidden,
}

impl fmt::Display for BadId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            BadId::Empty => f.write_str("must not be empty"),
            BadId::TooLong(n) => write!(f, "must be at most {MAX_ID_LEN} bytes (got {n})"),
            BadId::Forbidden => f.write_str("must be printable ASCII, without whitespace or '|'"),
        }
    }
}

impl std::error::Error for BadId {}

/// Checks `s` against the one id rule.
pub fn check_id(s: &str) -> Result<(), BadId> {
    if s.is_empty() {
        return Err(BadId::Empty);
    }
    if s.len() > MAX_ID_LEN {
        return Err(BadId::TooLong(s.len()));
    }
    if !s.bytes().all(|b| b.is_ascii_graphic() && b != b'|') {
        return Err(BadId::Forbidden);
    }
    Ok(())
}

macro_rules! id_type {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Debug, Clone, PartialEq, Eq, Hash)]
        pub struct $name(String);

        impl $name {
            /// `s` as this id, when it follows the rule.
            pub fn parse(s: &str) -> Result<Self, BadId> {
                check_id(s)?;
                Ok(Self(s.to_string()))
            }

            pub fn as_str(&self) -> &str {
                &self.0
            }

            pub fn into_string(self) -> String {
                self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

id_type!(
    /// A validated user id (the JWT subject at the edge, `user_id` on gRPC).
    UserId
);
id_type!(
    /// A validated request id: the idempotency key of a reservation.
    RequestId
);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_must_be_short_printable_ascii_and_free_of_the_separator() {
        assert!(UserId::parse("alice-1").is_ok());
        assert!(RequestId::parse(&"x".repeat(MAX_ID_LEN)).is_ok());
        assert_eq!(UserId::parse(""), Err(BadId::Empty));
        assert_eq!(UserId::parse(&"x".repeat(65)), Err(BadId::TooLong(65)));
        for bad in ["a|b", "a b", "a\nb", "a\tb", "caf\u{e9}", "a\u{7f}"] {
            assert_eq!(UserId::parse(bad), Err(BadId::Forbidden), "{bad:?}");
            assert_eq!(RequestId::parse(bad), Err(BadId::Forbidden), "{bad:?}");
        }
    }

    #[test]
    fn an_id_reads_back_as_it_was_given() {
        let u = UserId::parse("bob_7@x.io").unwrap();
        assert_eq!(u.as_str(), "bob_7@x.io");
        assert_eq!(u.to_string(), "bob_7@x.io");
        assert_eq!(u.into_string(), "bob_7@x.io");
    }
}
