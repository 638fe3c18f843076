//! Position and admission tokens: `v1.<key id>.<payload>.<mac>`, the payload and the
//! HMAC-SHA256 in base64url, checked in constant time with no Redis call.
//!
//! - A position token holds the place: the activity, the user, the arrival ticket, the
//!   join time and the last heartbeat. Each heartbeat signs a new one; a token whose
//!   last heartbeat is older than `room.hold_secs` is refused (the place is lost).
//! - An admission token opens the buy flow: activity, user, ticket, admission time and
//!   expiry (`room.session_secs`).
//!
//! Several keys may be valid at once (rotation); the key id picks one.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

use super::config::{valid_key_id, RoomConfig, RoomKey};

type HmacSha256 = Hmac<Sha256>;

/// Why a token was refused (the message goes to the client).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenError {
    Malformed,
    UnknownKey,
    BadSignature,
    WrongActivity,
    WrongUser,
    /// A position token past its hold, or an admission token past its expiry.
    Expired,
}

impl TokenError {
    pub fn message(self) -> &'static str {
        match self {
            Self::Malformed => "malformed waiting-room token",
            Self::UnknownKey => "waiting-room token signed by an unknown key",
            Self::BadSignature => "waiting-room token signature does not match",
            Self::WrongActivity => "waiting-room token is for another activity",
            Self::WrongUser => "waiting-room token is for another user",
            Self::Expired => "waiting-room token expired",
        }
    }
}

/// A place in the queue.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Position {
    pub activity: u64,
    pub user: String,
    /// Arrival order (Redis `HINCRBY` at join), 1-based.
    pub ticket: u64,
    pub joined_ms: u64,
    /// Unix ms of the last heartbeat.
    pub beat_ms: u64,
}

/// The right to ask for purchase tokens.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Admission {
    pub activity: u64,
    pub user: String,
    pub ticket: u64,
    pub admitted_ms: u64,
    pub expires_ms: u64,
}

/// The key set.
pub struct Signer {
    keys: Vec<(String, HmacSha256)>,
    sign: usize,
}

impl Signer {
    /// From `[room]`; without keys, one key `pt` from the purchase-token secret.
    pub fn from_config(cfg: &RoomConfig, purchase_secret: &str) -> Self {
        let keys: Vec<RoomKey> = if cfg.keys.is_empty() {
            vec![RoomKey {
                id: "pt".into(),
                secret: format!("room|{purchase_secret}"),
            }]
        } else {
            cfg.keys.clone()
        };
        let sign = keys.iter().position(|k| k.id == cfg.sign_key).unwrap_or(0);
        Self {
            keys: keys
                .into_iter()
                .map(|k| {
                    let mac = HmacSha256::new_from_slice(k.secret.as_bytes())
                        .expect("HMAC takes any key");
                    (k.id, mac)
                })
                .collect(),
            sign,
        }
    }

    fn seal(&self, payload: &str) -> String {
        let (kid, key) = &self.keys[self.sign];
        let body = URL_SAFE_NO_PAD.encode(payload);
        let mut m = key.clone();
        m.update(format!("v1.{kid}.{body}").as_bytes());
        let mac = URL_SAFE_NO_PAD.encode(m.finalize().into_bytes());
        format!("v1.{kid}.{body}.{mac}")
    }

    /// The payload of a well-signed token.
    fn open(&self, token: &str) -> Result<String, TokenError> {
        if token.len() > 1024 {
            return Err(TokenError::Malformed);
        }
        let mut parts = token.split('.');
        let (Some("v1"), Some(kid), Some(body), Some(mac), None) = (
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
            parts.next(),
        ) else {
            return Err(TokenError::Malformed);
        };
        if !valid_key_id(kid) {
            return Err(TokenError::Malformed);
        }
        let key = self
            .keys
            .iter()
            .find(|(id, _)| id == kid)
            .map(|(_, k)| k)
            .ok_or(TokenError::UnknownKey)?;
        let mac = URL_SAFE_NO_PAD
            .decode(mac)
            .map_err(|_| TokenError::Malformed)?;
        let mut m = key.clone();
        m.update(format!("v1.{kid}.{body}").as_bytes());
        // `verify_slice` compares in constant time.
        m.verify_slice(&mac).map_err(|_| TokenError::BadSignature)?;
        let body = URL_SAFE_NO_PAD
            .decode(body)
            .map_err(|_| TokenError::Malformed)?;
        String::from_utf8(body).map_err(|_| TokenError::Malformed)
    }

    /// A position token.
    pub fn position(&self, p: &Position) -> String {
        self.seal(&format!(
            "p|{}|{}|{}|{}|{}",
            p.activity, p.ticket, p.joined_ms, p.beat_ms, p.user
        ))
    }

    /// An admission token.
    pub fn admission(&self, a: &Admission) -> String {
        self.seal(&format!(
            "a|{}|{}|{}|{}|{}",
            a.activity, a.ticket, a.admitted_ms, a.expires_ms, a.user
        ))
    }

    /// Checks a position token of `user` for `activity`: signature, then binding, then
    /// the hold (`beat_ms + hold_ms > now`).
    pub fn check_position(
        &self,
        token: &str,
        activity: u64,
        user: &str,
        hold_ms: u64,
        now_ms: u64,
    ) -> Result<Position, TokenError> {
        let body = self.open(token)?;
        let f: Vec<&str> = body.splitn(6, '|').collect();
        let [kind, a, t, j, b, u] = f[..] else {
            return Err(TokenError::Malformed);
        };
        let num = |s: &str| s.parse::<u64>().map_err(|_| TokenError::Malformed);
        if kind != "p" {
            return Err(TokenError::Malformed);
        }
        let p = Position {
            activity: num(a)?,
            ticket: num(t)?,
            joined_ms: num(j)?,
            beat_ms: num(b)?,
            user: u.to_string(),
        };
        if p.activity != activity {
            return Err(TokenError::WrongActivity);
        }
        if p.user != user {
            return Err(TokenError::WrongUser);
        }
        if p.beat_ms.saturating_add(hold_ms) <= now_ms {
            return Err(TokenError::Expired);
        }
        Ok(p)
    }

    /// Checks an admission token of `user` for `activity` at `now_ms`.
    pub fn check_admission(
        &self,
        token: &str,
        activity: u64,
        user: &str,
        now_ms: u64,
    ) -> Result<Admission, TokenError> {
        let body = self.open(token)?;
        let f: Vec<&str> = body.splitn(6, '|').collect();
        let [kind, a, t, at, exp, u] = f[..] else {
            return Err(TokenError::Malformed);
        };
        let num = |s: &str| s.parse::<u64>().map_err(|_| TokenError::Malformed);
        if kind != "a" {
            return Err(TokenError::Malformed);
        }
        let adm = Admission {
            activity: num(a)?,
            ticket: num(t)?,
            admitted_ms: num(at)?,
            expires_ms: num(exp)?,
            user: u.to_string(),
        };
        if adm.activity != activity {
            return Err(TokenError::WrongActivity);
        }
        if adm.user != user {
            return Err(TokenError::WrongUser);
        }
        if adm.expires_ms <= now_ms {
            return Err(TokenError::Expired);
        }
        Ok(adm)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signer(keys: &[(&str, &str)], sign: &str) -> Signer {
        let cfg = RoomConfig {
            keys: keys
                .iter()
                .map(|(id, s)| RoomKey {
                    id: id.to_string(),
                    secret: s.to_string(),
                })
                .collect(),
            sign_key: sign.into(),
            ..Default::default()
        };
        Signer::from_config(&cfg, "unused-purchase-secret")
    }

    fn place() -> Position {
        Position {
            activity: 7,
            user: "alice|with|bars".into(),
            ticket: 42,
            joined_ms: 1_000,
            beat_ms: 5_000,
        }
    }

    #[test]
    fn a_position_token_verifies_for_its_user_and_activity_until_the_hold_runs_out() {
        let s = signer(&[("k1", "0123456789abcdef")], "");
        let t = s.position(&place());
        assert_eq!(
            s.check_position(&t, 7, "alice|with|bars", 60_000, 64_999),
            Ok(place())
        );
        assert_eq!(
            s.check_position(&t, 7, "alice|with|bars", 60_000, 65_000),
            Err(TokenError::Expired)
        );
        assert_eq!(
            s.check_position(&t, 8, "alice|with|bars", 60_000, 6_000),
            Err(TokenError::WrongActivity)
        );
        assert_eq!(
            s.check_position(&t, 7, "bob", 60_000, 6_000),
            Err(TokenError::WrongUser)
        );
        // A position token is not an admission token.
        assert_eq!(
            s.check_admission(&t, 7, "alice|with|bars", 6_000),
            Err(TokenError::Malformed)
        );
    }

    #[test]
    fn an_admission_token_expires_and_is_bound_to_its_user() {
        let s = signer(&[("k1", "0123456789abcdef")], "");
        let a = Admission {
            activity: 3,
            user: "u1".into(),
            ticket: 9,
            admitted_ms: 100,
            expires_ms: 1_000,
        };
        let t = s.admission(&a);
        assert_eq!(s.check_admission(&t, 3, "u1", 999), Ok(a));
        assert_eq!(
            s.check_admission(&t, 3, "u1", 1_000),
            Err(TokenError::Expired)
        );
        assert_eq!(
            s.check_admission(&t, 3, "u2", 10),
            Err(TokenError::WrongUser)
        );
    }

    #[test]
    fn a_tampered_token_is_refused() {
        let s = signer(&[("k1", "0123456789abcdef")], "");
        let t = s.position(&place());
        let parts: Vec<&str> = t.split('.').collect();
        // A better ticket in the payload, the old signature.
        let forged_body = URL_SAFE_NO_PAD.encode("p|7|1|1000|5000|alice|with|bars");
        let forged = format!("v1.k1.{forged_body}.{}", parts[3]);
        assert_eq!(
            s.check_position(&forged, 7, "alice|with|bars", 60_000, 6_000),
            Err(TokenError::BadSignature)
        );
        let mut flipped = t.clone().into_bytes();
        let last = flipped.len() - 1;
        flipped[last] = if flipped[last] == b'A' { b'B' } else { b'A' };
        let flipped = String::from_utf8(flipped).unwrap();
        assert!(s
            .check_position(&flipped, 7, "alice|with|bars", 60_000, 6_000)
            .is_err());
        for junk in ["", "v1", "v1.k1.x", "v2.k1.a.b", "v1.k1.!!.??", "v1..a.b"] {
            assert!(
                s.check_position(junk, 7, "alice", 60_000, 6_000).is_err(),
                "{junk}"
            );
        }
    }

    #[test]
    fn a_rotation_accepts_both_keys_and_signs_with_the_chosen_one() {
        let old = signer(&[("old", "0123456789abcdef")], "");
        let both = signer(
            &[("old", "0123456789abcdef"), ("new", "fedcba9876543210")],
            "new",
        );
        let new_only = signer(&[("new", "fedcba9876543210")], "");
        let t_old = old.position(&place());
        let t_new = both.position(&place());
        assert!(t_new.starts_with("v1.new."));
        assert!(both
            .check_position(&t_old, 7, "alice|with|bars", 60_000, 6_000)
            .is_ok());
        assert!(new_only
            .check_position(&t_new, 7, "alice|with|bars", 60_000, 6_000)
            .is_ok());
        assert_eq!(
            new_only.check_position(&t_old, 7, "alice|with|bars", 60_000, 6_000),
            Err(TokenError::UnknownKey)
        );
        // Same id, another secret: a forgery.
        let imposter = signer(&[("new", "not-the-real-secret")], "");
        assert_eq!(
            both.check_position(
                &imposter.position(&place()),
                7,
                "alice|with|bars",
                60_000,
                6_000
            ),
            Err(TokenError::BadSignature)
        );
    }
}
