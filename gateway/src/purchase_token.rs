//! Purchase tokens (state of the `purchase_token` filter). `POST .../token` gives an authenticated user, once the
//! window is open, `"<expiry ms>.<base64url HMAC-SHA256(secret, v1|user|a|s|expiry)>"`;
//! `reserve` must present it. Checking it is one HMAC in memory: no Redis call.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// Issues and checks purchase tokens.
pub struct PurchaseTokens {
    key: HmacSha256,
    ttl_ms: u64,
}

impl PurchaseTokens {
    pub fn new(secret: &str, ttl_secs: u64) -> Self {
        Self {
            key: HmacSha256::new_from_slice(secret.as_bytes()).expect("HMAC takes any key"),
            ttl_ms: ttl_secs * 1000,
        }
    }

    fn mac(&self, user: &str, a: u64, s: u64, exp: u64) -> HmacSha256 {
        let mut m = self.key.clone();
        m.update(format!("v1|{user}|{a}|{s}|{exp}").as_bytes());
        m
    }

    /// A token for `(user, a, s)`, valid until the returned unix ms.
    pub fn issue(&self, user: &str, a: u64, s: u64, now_unix_ms: u64) -> (String, u64) {
        let exp = now_unix_ms + self.ttl_ms;
        let mac = self.mac(user, a, s, exp).finalize().into_bytes();
        (format!("{exp}.{}", URL_SAFE_NO_PAD.encode(mac)), exp)
    }

    /// Checks `token` for `(user, a, s)` at `now_unix_ms`.
    pub fn verify(
        &self,
        token: &str,
        user: &str,
        a: u64,
        s: u64,
        now_unix_ms: u64,
    ) -> Result<(), &'static str> {
        let (exp, mac) = token.split_once('.').ok_or("malformed purchase token")?;
        let exp: u64 = exp.parse().map_err(|_| "malformed purchase token")?;
        let mac = URL_SAFE_NO_PAD
            .decode(mac)
            .map_err(|_| "malformed purchase token")?;
        self.mac(user, a, s, exp)
            .verify_slice(&mac)
            .map_err(|_| "purchase token not valid for this user and item")?;
        if exp <= now_unix_ms {
            return Err("purchase token expired");
        }
        Ok(())
    }
}

/// The idempotency key used when the client sends none: derived from the token, so
/// retrying with the same token never takes a second unit.
pub fn request_id_from_token(token: &str) -> String {
    let h = xxhash_rust::xxh3::xxh3_128(token.as_bytes());
    format!("pt-{h:032x}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_good_only_for_its_user_item_and_lifetime() {
        let t = PurchaseTokens::new("0123456789abcdef", 60);
        let (tok, exp) = t.issue("alice", 1, 7, 1_000);
        assert_eq!(exp, 61_000);
        assert_eq!(t.verify(&tok, "alice", 1, 7, 2_000), Ok(()));
        assert!(t.verify(&tok, "bob", 1, 7, 2_000).is_err());
        assert!(t.verify(&tok, "alice", 1, 8, 2_000).is_err());
        assert!(t.verify(&tok, "alice", 2, 7, 2_000).is_err());
        assert_eq!(
            t.verify(&tok, "alice", 1, 7, 61_000),
            Err("purchase token expired")
        );
    }

    #[test]
    fn forged_and_malformed_tokens_are_refused() {
        let t = PurchaseTokens::new("0123456789abcdef", 60);
        let (tok, _) = t.issue("alice", 1, 7, 1_000);
        // Moving the expiry breaks the MAC.
        let (_, mac) = tok.split_once('.').unwrap();
        assert!(t
            .verify(&format!("99999999.{mac}"), "alice", 1, 7, 2_000)
            .is_err());
        let other = PurchaseTokens::new("another-secret!!", 60);
        let (forged, _) = other.issue("alice", 1, 7, 1_000);
        assert!(t.verify(&forged, "alice", 1, 7, 2_000).is_err());
        for bad in ["", ".", "abc", "1.!!!", "x.y"] {
            assert!(t.verify(bad, "alice", 1, 7, 2_000).is_err(), "{bad}");
        }
    }

    #[test]
    fn derived_request_ids_are_stable_and_short() {
        let a = request_id_from_token("123.abc");
        assert_eq!(a, request_id_from_token("123.abc"));
        assert_ne!(a, request_id_from_token("123.abd"));
        assert!(a.len() <= 64);
    }
}
