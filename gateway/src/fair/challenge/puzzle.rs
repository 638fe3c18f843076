//! The puzzle: its signed text form, the MAC check, and the work check.
//!
//! A puzzle is the text
//! `v1.<kid>.<a>.<s>.<b64url(user)>.<exp_ms>.<bits>.<count>.<b64url(nonce)>.<b64url(mac)>`
//! where `mac = HMAC-SHA256(key[kid], "seckill-pow|" + everything before the last dot)`.
//! Nothing of it is stored: the MAC is the state. The 16-byte random nonce is the seed
//! of the work: sub-puzzle `i` (`0..count`) is solved by a counter `c` such that
//! `SHA-256(nonce || u32be(i) || u64be(c))` starts with at least `bits` zero bits
//! (28 bytes: one SHA-256 block per try). Expected work: `count * 2^bits` hashes.

use base64::engine::general_purpose::URL_SAFE_NO_PAD;
use base64::Engine;
use hmac::{Hmac, Mac};
use sha2::{Digest, Sha256};

type HmacSha256 = Hmac<Sha256>;

/// Most sub-puzzles one puzzle may carry.
pub const MAX_COUNT: u32 = 256;
/// Most leading zero bits one sub-puzzle may ask for.
pub const MAX_BITS: u32 = 32;
/// Bytes of the random seed.
pub const NONCE_LEN: usize = 16;

/// Why a redeem is refused; each kind has its own stable code (`docs/http-api.md`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Rejection {
    /// The activity asks for a challenge and the request carries none.
    Required,
    /// Not a puzzle, or the solutions are not a list of `count` counters.
    Malformed,
    /// The MAC does not match (a field changed, or an unknown or retired key id).
    Tampered,
    /// Signed for another user.
    WrongUser,
    /// Signed for another activity or item.
    WrongItem,
    Expired,
    /// Sub-puzzle `i`'s counter does not give enough leading zero bits.
    Unsolved(u32),
    /// Redeemed already (on any gateway of the fleet).
    Replayed,
}

impl Rejection {
    /// The stable error code.
    pub fn code(self) -> &'static str {
        match self {
            Self::Required => "challenge_required",
            Self::Malformed => "challenge_malformed",
            Self::Tampered => "challenge_tampered",
            Self::WrongUser => "challenge_wrong_user",
            Self::WrongItem => "challenge_wrong_item",
            Self::Expired => "challenge_expired",
            Self::Unsolved(_) => "challenge_unsolved",
            Self::Replayed => "challenge_replayed",
        }
    }

    /// HTTP status: 400 malformed, 409 replayed, 403 the rest.
    pub fn status(self) -> u16 {
        match self {
            Self::Malformed => 400,
            Self::Replayed => 409,
            _ => 403,
        }
    }

    pub fn message(self) -> String {
        match self {
            Self::Required => "this item needs a solved challenge: POST .../challenge first, then send {\"challenge\", \"solutions\"}".into(),
            Self::Malformed => "the challenge or its solutions are malformed (solutions: one counter per sub-puzzle)".into(),
            Self::Tampered => "the challenge is not one this service signed".into(),
            Self::WrongUser => "the challenge was issued to another user".into(),
            Self::WrongItem => "the challenge was issued for another item".into(),
            Self::Expired => "the challenge expired; ask for a new one".into(),
            Self::Unsolved(i) => format!("solution {i} does not solve its sub-puzzle"),
            Self::Replayed => "the challenge was redeemed already".into(),
        }
    }

    /// True for the kinds an honest client does not produce (they raise the sender's
    /// difficulty and count toward the auto-ban); expiry and replay can be a slow
    /// phone or a double click.
    pub fn is_abuse(self) -> bool {
        !matches!(self, Self::Expired | Self::Replayed)
    }
}

/// One signing/verifying key: its HMAC keyed once (each use clones the keyed state).
pub struct Key {
    pub id: String,
    mac: HmacSha256,
}

impl Key {
    /// `id` is `[A-Za-z0-9_-]` (`challenge.keys` validation checks it; the process key
    /// is `local`): it is a field of the puzzle, which the answer writes into its JSON
    /// as it is, with nothing to escape.
    pub fn new(id: &str, secret: &[u8]) -> Self {
        debug_assert!(
            id.bytes()
                .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
            "challenge key id {id:?}"
        );
        Self {
            id: id.to_string(),
            mac: HmacSha256::new_from_slice(secret).expect("HMAC takes any key"),
        }
    }
}

/// The keys in force: the first signs, every one verifies (rotation: add the new key
/// first, keep the old one listed for a puzzle lifetime, then drop it).
pub struct Keyring {
    keys: Vec<Key>,
}

/// What a puzzle binds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Spec<'a> {
    pub activity: u64,
    pub item: u64,
    pub user: &'a str,
    pub exp_ms: u64,
    pub bits: u32,
    pub count: u32,
}

/// A puzzle whose MAC, user, item and expiry checked out.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    pub nonce: [u8; NONCE_LEN],
    pub bits: u32,
    pub count: u32,
    pub exp_ms: u64,
    /// The first 16 bytes of the MAC, hex: names the puzzle for the single-use key.
    pub digest: String,
}

const DOMAIN: &[u8] = b"seckill-pow|";

impl Keyring {
    /// `keys` must not be empty.
    pub fn new(keys: Vec<Key>) -> Self {
        assert!(!keys.is_empty(), "a keyring needs a key");
        Self { keys }
    }

    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }

    /// A signed puzzle with this `nonce`.
    pub fn issue(&self, spec: &Spec<'_>, nonce: &[u8; NONCE_LEN]) -> String {
        let mut out = Vec::with_capacity(160 + 2 * spec.user.len());
        self.issue_into(spec, nonce, &mut out);
        String::from_utf8(out).expect("a puzzle is ASCII")
    }

    /// [`Self::issue`] appended to `out`, signed where it lies: the challenge answer
    /// writes its puzzle straight into the answer's bytes (no string of its own, no
    /// `core::fmt`; an issue is the hot path of a flood of challenge requests).
    pub fn issue_into(&self, spec: &Spec<'_>, nonce: &[u8; NONCE_LEN], out: &mut Vec<u8>) {
        use crate::answer::push_decimal;
        let key = &self.keys[0];
        let start = out.len();
        out.extend_from_slice(b"v1.");
        out.extend_from_slice(key.id.as_bytes());
        out.push(b'.');
        push_decimal(out, spec.activity);
        out.push(b'.');
        push_decimal(out, spec.item);
        out.push(b'.');
        push_base64(out, spec.user.as_bytes());
        out.push(b'.');
        push_decimal(out, spec.exp_ms);
        out.push(b'.');
        push_decimal(out, u64::from(spec.bits));
        out.push(b'.');
        push_decimal(out, u64::from(spec.count));
        out.push(b'.');
        push_base64(out, nonce);
        let mut m = key.mac.clone();
        m.update(DOMAIN);
        m.update(&out[start..]);
        let tag = m.finalize().into_bytes();
        out.push(b'.');
        push_base64(out, &tag);
    }

    /// Checks the MAC (constant time), then the user, the item and the expiry, in that
    /// order: nothing of an unsigned field is believed before the MAC.
    pub fn verify(
        &self,
        puzzle: &str,
        user: &str,
        activity: u64,
        item: u64,
        now_unix_ms: u64,
    ) -> Result<Verified, Rejection> {
        use Rejection::*;
        if puzzle.len() > 512 {
            return Err(Malformed);
        }
        let (signed, tag) = puzzle.rsplit_once('.').ok_or(Malformed)?;
        let mut tag_bytes = [0u8; 32];
        match URL_SAFE_NO_PAD.decode_slice(tag, &mut tag_bytes) {
            Ok(32) => {}
            _ => return Err(Malformed),
        }
        let f: Vec<&str> = signed.split('.').collect();
        let [v, kid, a, s, u, exp, bits, count, nonce] = f[..] else {
            return Err(Malformed);
        };
        if v != "v1" {
            return Err(Malformed);
        }
        let num = |x: &str| x.parse::<u64>().map_err(|_| Malformed);
        let (a, s, exp) = (num(a)?, num(s)?, num(exp)?);
        let bits = u32::try_from(num(bits)?).map_err(|_| Malformed)?;
        let count = u32::try_from(num(count)?).map_err(|_| Malformed)?;
        let mut nonce_bytes = [0u8; NONCE_LEN];
        match URL_SAFE_NO_PAD.decode_slice(nonce, &mut nonce_bytes) {
            Ok(NONCE_LEN) => {}
            _ => return Err(Malformed),
        }
        let key = self.keys.iter().find(|k| k.id == kid).ok_or(Tampered)?;
        let mut m = key.mac.clone();
        m.update(DOMAIN);
        m.update(signed.as_bytes());
        m.verify_slice(&tag_bytes).map_err(|_| Tampered)?;
        // Signed by us from here on.
        let signed_user = URL_SAFE_NO_PAD.decode(u).map_err(|_| Tampered)?;
        if signed_user != user.as_bytes() {
            return Err(WrongUser);
        }
        if (a, s) != (activity, item) {
            return Err(WrongItem);
        }
        if exp <= now_unix_ms {
            return Err(Expired);
        }
        if bits > MAX_BITS || count == 0 || count > MAX_COUNT {
            return Err(Tampered);
        }
        Ok(Verified {
            nonce: nonce_bytes,
            bits,
            count,
            exp_ms: exp,
            digest: hex::encode(&tag_bytes[..16]),
        })
    }
}

/// Appends the unpadded base64url form of `bytes`.
fn push_base64(out: &mut Vec<u8>, bytes: &[u8]) {
    let at = out.len();
    let len = base64::encoded_len(bytes.len(), false).expect("a short field");
    out.resize(at + len, 0);
    // The slice is exactly the encoded length.
    let _ = URL_SAFE_NO_PAD.encode_slice(bytes, &mut out[at..]);
}

/// `SHA-256(nonce || u32be(i) || u64be(c))`.
pub fn sub_hash(nonce: &[u8; NONCE_LEN], i: u32, c: u64) -> [u8; 32] {
    let mut h = Sha256::new();
    h.update(nonce);
    h.update(i.to_be_bytes());
    h.update(c.to_be_bytes());
    h.finalize().into()
}

/// Leading zero bits of a hash.
pub fn leading_zero_bits(h: &[u8]) -> u32 {
    let mut n = 0;
    for b in h {
        if *b == 0 {
            n += 8;
        } else {
            return n + b.leading_zeros();
        }
    }
    n
}

/// Checks every sub-solution (all of them, even after a bad one is found: the answer
/// names the first bad index, and the cost of a refusal does not depend on where).
pub fn check_solutions(v: &Verified, solutions: &[u64]) -> Result<(), Rejection> {
    if solutions.len() != v.count as usize {
        return Err(Rejection::Malformed);
    }
    let mut first_bad = None;
    for (i, c) in solutions.iter().enumerate() {
        let i = i as u32;
        if leading_zero_bits(&sub_hash(&v.nonce, i, *c)) < v.bits && first_bad.is_none() {
            first_bad = Some(i);
        }
    }
    match first_bad {
        Some(i) => Err(Rejection::Unsolved(i)),
        None => Ok(()),
    }
}

/// Solves a puzzle's sub-puzzles (tests, the bench, and Rust clients): the smallest
/// counter for each.
pub fn solve(nonce: &[u8; NONCE_LEN], bits: u32, count: u32) -> Vec<u64> {
    (0..count)
        .map(|i| {
            (0u64..)
                .find(|c| leading_zero_bits(&sub_hash(nonce, i, *c)) >= bits)
                .expect("a counter exists")
        })
        .collect()
}

/// The nonce of a puzzle's text, unchecked (clients and tests; the server reads it
/// through [`Keyring::verify`]).
pub fn nonce_of(puzzle: &str) -> Option<[u8; NONCE_LEN]> {
    let signed = puzzle.rsplit_once('.')?.0;
    let n = signed.rsplit_once('.')?.1;
    let mut out = [0u8; NONCE_LEN];
    match URL_SAFE_NO_PAD.decode_slice(n, &mut out) {
        Ok(NONCE_LEN) => Some(out),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(ids: &[(&str, &str)]) -> Keyring {
        Keyring::new(ids.iter().map(|(i, s)| Key::new(i, s.as_bytes())).collect())
    }

    fn spec(user: &str) -> Spec<'_> {
        Spec {
            activity: 3,
            item: 7,
            user,
            exp_ms: 10_000,
            bits: 4,
            count: 8,
        }
    }

    const NONCE: [u8; NONCE_LEN] = [9; NONCE_LEN];

    #[test]
    fn a_signed_puzzle_verifies_for_its_user_item_and_lifetime() {
        let k = ring(&[("k1", "0123456789abcdef")]);
        let p = k.issue(&spec("alice"), &NONCE);
        let v = k.verify(&p, "alice", 3, 7, 9_999).unwrap();
        assert_eq!((v.nonce, v.bits, v.count, v.exp_ms), (NONCE, 4, 8, 10_000));
        assert_eq!(v.digest.len(), 32);
        assert_eq!(nonce_of(&p), Some(NONCE));
        assert_eq!(k.verify(&p, "bob", 3, 7, 1), Err(Rejection::WrongUser));
        assert_eq!(k.verify(&p, "alice", 3, 8, 1), Err(Rejection::WrongItem));
        assert_eq!(k.verify(&p, "alice", 4, 7, 1), Err(Rejection::WrongItem));
        assert_eq!(k.verify(&p, "alice", 3, 7, 10_000), Err(Rejection::Expired));
    }

    #[test]
    fn the_puzzle_text_is_the_documented_form() {
        let k = ring(&[("k-1_", "0123456789abcdef")]);
        let p = k.issue(&spec("alice"), &NONCE);
        let b64 = |b: &[u8]| URL_SAFE_NO_PAD.encode(b);
        let signed = format!("v1.k-1_.3.7.{}.10000.4.8.{}", b64(b"alice"), b64(&NONCE));
        let mut m = HmacSha256::new_from_slice(b"0123456789abcdef").unwrap();
        m.update(format!("seckill-pow|{signed}").as_bytes());
        assert_eq!(p, format!("{signed}.{}", b64(&m.finalize().into_bytes())));
        // Written after other bytes, signed where it lies.
        let mut out = b"{\"challenge\":\"".to_vec();
        k.issue_into(&spec("alice"), &NONCE, &mut out);
        assert_eq!(out[14..], *p.as_bytes());
    }

    #[test]
    fn changing_any_signed_field_is_tampering() {
        let k = ring(&[("k1", "0123456789abcdef")]);
        let p = k.issue(&spec("alice"), &NONCE);
        let fields: Vec<&str> = p.split('.').collect();
        // Lower the difficulty, push the expiry, change the nonce, claim another user.
        for (i, value) in [
            (6, "1"),
            (5, "99999999"),
            (8, "AAAAAAAAAAAAAAAAAAAAAA"),
            (4, "Ym9i"),
            (2, "4"),
        ] {
            let mut f = fields.clone();
            f[i] = value;
            let forged = f.join(".");
            assert_eq!(
                k.verify(&forged, "alice", 3, 7, 1),
                Err(Rejection::Tampered),
                "field {i}"
            );
        }
        // Signed with a key we do not hold (same id, another secret).
        let other = ring(&[("k1", "another-secret!!")]);
        let forged = other.issue(&spec("alice"), &NONCE);
        assert_eq!(
            k.verify(&forged, "alice", 3, 7, 1),
            Err(Rejection::Tampered)
        );
        // A flipped MAC byte.
        let mut bad = p.clone();
        let last = bad.pop().unwrap();
        bad.push(if last == 'A' { 'B' } else { 'A' });
        assert_eq!(k.verify(&bad, "alice", 3, 7, 1), Err(Rejection::Tampered));
    }

    #[test]
    fn garbage_is_malformed_not_a_panic() {
        let k = ring(&[("k1", "0123456789abcdef")]);
        let p = k.issue(&spec("alice"), &NONCE);
        for bad in [
            "",
            ".",
            "v1",
            "a.b.c.d.e.f.g.h.i.j",
            &p.replacen("v1", "v2", 1),
            &p[..p.len() - 3],
            &format!("{p}.x"),
            &"x".repeat(1000),
        ] {
            assert_eq!(
                k.verify(bad, "alice", 3, 7, 1),
                Err(Rejection::Malformed),
                "{bad}"
            );
        }
    }

    #[test]
    fn a_rotated_keyring_verifies_old_puzzles_and_signs_with_the_new_key() {
        let old = ring(&[("2026a", "0123456789abcdef")]);
        let p_old = old.issue(&spec("alice"), &NONCE);
        let rotated = ring(&[("2026b", "fedcba9876543210"), ("2026a", "0123456789abcdef")]);
        assert!(rotated.verify(&p_old, "alice", 3, 7, 1).is_ok());
        let p_new = rotated.issue(&spec("alice"), &NONCE);
        assert!(p_new.starts_with("v1.2026b."));
        // The old gateway does not know the new key yet; once the old key is retired,
        // its puzzles are refused.
        assert_eq!(
            old.verify(&p_new, "alice", 3, 7, 1),
            Err(Rejection::Tampered)
        );
        let retired = ring(&[("2026b", "fedcba9876543210")]);
        assert_eq!(
            retired.verify(&p_old, "alice", 3, 7, 1),
            Err(Rejection::Tampered)
        );
    }

    #[test]
    fn leading_zero_bits_are_counted_across_bytes() {
        assert_eq!(leading_zero_bits(&[0x80]), 0);
        assert_eq!(leading_zero_bits(&[0x01]), 7);
        assert_eq!(leading_zero_bits(&[0x00, 0x40]), 9);
        assert_eq!(leading_zero_bits(&[0x00, 0x00, 0x0f]), 20);
        assert_eq!(leading_zero_bits(&[0, 0]), 16);
        assert_eq!(leading_zero_bits(&[0xff; 32]), 0);
    }

    #[test]
    fn solutions_are_checked_one_by_one() {
        let k = ring(&[("k1", "0123456789abcdef")]);
        let p = k.issue(&spec("alice"), &NONCE);
        let v = k.verify(&p, "alice", 3, 7, 1).unwrap();
        let mut sol = solve(&NONCE, v.bits, v.count);
        assert_eq!(check_solutions(&v, &sol), Ok(()));
        for (i, c) in sol.iter().enumerate() {
            assert!(leading_zero_bits(&sub_hash(&NONCE, i as u32, *c)) >= 4);
        }
        // One counter wrong (the next counter that does not solve it).
        let bad = (sol[5] + 1..)
            .find(|c| leading_zero_bits(&sub_hash(&NONCE, 5, *c)) < 4)
            .unwrap();
        sol[5] = bad;
        assert_eq!(check_solutions(&v, &sol), Err(Rejection::Unsolved(5)));
        assert_eq!(check_solutions(&v, &sol[..7]), Err(Rejection::Malformed));
        assert_eq!(check_solutions(&v, &[]), Err(Rejection::Malformed));
    }
}
