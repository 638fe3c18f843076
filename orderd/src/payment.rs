//! The payment provider callback's signature:
//! `hex(HMAC-SHA256(secret, "{order_id}|{amount_cents}|{provider_ref}|{timestamp_ms}"))`,
//! compared in constant time, and the freshness window on its timestamp.

use hmac::{Hmac, Mac};
use sha2::Sha256;

type HmacSha256 = Hmac<Sha256>;

/// The text that is signed.
pub fn signed_text(
    order_id: &str,
    amount_cents: i64,
    provider_ref: &str,
    timestamp_ms: i64,
) -> String {
    format!("{order_id}|{amount_cents}|{provider_ref}|{timestamp_ms}")
}

/// Lower-case hex signature (what a provider, or a test, sends).
pub fn sign(
    secret: &[u8],
    order_id: &str,
    amount_cents: i64,
    provider_ref: &str,
    timestamp_ms: i64,
) -> String {
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(signed_text(order_id, amount_cents, provider_ref, timestamp_ms).as_bytes());
    hex::encode(mac.finalize().into_bytes())
}

/// True when `signature` (hex, either case) is the HMAC of the fields.
pub fn verify(
    secret: &[u8],
    order_id: &str,
    amount_cents: i64,
    provider_ref: &str,
    timestamp_ms: i64,
    signature: &str,
) -> bool {
    let Ok(raw) = hex::decode(signature.trim()) else {
        return false;
    };
    let mut mac = HmacSha256::new_from_slice(secret).expect("HMAC takes any key length");
    mac.update(signed_text(order_id, amount_cents, provider_ref, timestamp_ms).as_bytes());
    mac.verify_slice(&raw).is_ok()
}

/// True when `timestamp_ms` is within `window_secs` of `now_ms`, either side.
pub fn fresh(timestamp_ms: i64, now_ms: i64, window_secs: u64) -> bool {
    let window = i64::try_from(window_secs.saturating_mul(1000)).unwrap_or(i64::MAX);
    timestamp_ms.abs_diff(now_ms) <= window as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signature_verifies_and_any_changed_field_does_not() {
        let s = sign(b"secret-secret-secret", "1-2-3-a-4", 990, "p-1", 1000);
        assert!(verify(
            b"secret-secret-secret",
            "1-2-3-a-4",
            990,
            "p-1",
            1000,
            &s
        ));
        assert!(verify(
            b"secret-secret-secret",
            "1-2-3-a-4",
            990,
            "p-1",
            1000,
            &s.to_uppercase()
        ));
        assert!(!verify(
            b"secret-secret-secret",
            "1-2-3-a-4",
            991,
            "p-1",
            1000,
            &s
        ));
        assert!(!verify(
            b"secret-secret-secret",
            "1-2-3-a-5",
            990,
            "p-1",
            1000,
            &s
        ));
        assert!(!verify(
            b"secret-secret-secret",
            "1-2-3-a-4",
            990,
            "p-2",
            1000,
            &s
        ));
        assert!(!verify(
            b"secret-secret-secret",
            "1-2-3-a-4",
            990,
            "p-1",
            1001,
            &s
        ));
        assert!(!verify(
            b"other-secret-secret!",
            "1-2-3-a-4",
            990,
            "p-1",
            1000,
            &s
        ));
        assert!(!verify(
            b"secret-secret-secret",
            "1-2-3-a-4",
            990,
            "p-1",
            1000,
            "zz"
        ));
    }

    #[test]
    fn freshness_is_a_window_on_both_sides_of_now() {
        assert!(fresh(10_000, 10_000, 1));
        assert!(fresh(9_000, 10_000, 1));
        assert!(fresh(11_000, 10_000, 1));
        assert!(!fresh(8_999, 10_000, 1));
        assert!(!fresh(i64::MIN, 10_000, u64::MAX));
        assert!(!fresh(11_001, 10_000, 1));
    }
}
