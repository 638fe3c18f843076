//! Authentication (state of the `authenticate` filter). A bearer JWT names the user in
//! its `sub` claim; the user id never comes from the URL or the body. Also issues the
//! dev-only HS256 tokens of `POST /api/v1/dev/token`.
//!
//! [`Jwt`] holds a key set: the config's single key, `[[auth.keys]]` and the keys of
//! the JWKS file `auth.jwks_path`, each with its algorithm (HS256, RS256, ES256). The
//! token's `kid` header picks the key (two kids valid at once: rotation without
//! downtime); a token without `kid` is verified only when the set holds exactly one
//! key. `iss` and `aud` are checked when configured. The gateway swaps in a new [`Jwt`]
//! on SIGHUP (`crate::shared::Shared::set_jwt`). Every refusal is a [`JwtError`] with
//! a stable reason code for the 401 answer. Loading the keys from config is
//! `auth/keys.rs`.

mod keys;

use crate::config::Auth;
use jsonwebtoken::errors::ErrorKind;
use jsonwebtoken::{Algorithm, EncodingKey, Header};
use keys::{Key, Loaded};
use serde::{Deserialize, Serialize};
use std::sync::Arc;

pub use keys::KeyError;

/// The claims a verified token must have (`exp` is checked by the validation; it is
/// read here only to know how long the token stays valid: see [`TokenMemo`]).
#[derive(Debug, Deserialize)]
struct Subject {
    sub: String,
    /// Any JSON: the validation accepts an integer or a finite non-negative float, and
    /// reading it must never refuse a token the validation accepted.
    #[serde(default)]
    exp: serde_json::Value,
}

/// `exp` as the validation reads it (jsonwebtoken's numeric date: an integer, or a
/// finite non-negative float rounded); `None` when it cannot say.
fn exp_secs(exp: &serde_json::Value) -> Option<u64> {
    let n = exp.as_number()?;
    n.as_u64().or_else(|| {
        n.as_f64()
            .filter(|f| f.is_finite() && *f >= 0.0 && *f < u64::MAX as f64)
            .map(|f| f.round() as u64)
    })
}

/// The claims of a dev token.
#[derive(Debug, Serialize)]
struct Issued<'a> {
    sub: &'a str,
    exp: u64,
    #[serde(skip_serializing_if = "str::is_empty")]
    iss: &'a str,
    #[serde(skip_serializing_if = "str::is_empty")]
    aud: &'a str,
}

/// Why a bearer token was refused: the 401's `reason` (stable) and message.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum JwtError {
    /// No `Authorization: Bearer` header (or query token where allowed).
    Missing,
    /// Not three base64url parts with a JSON header and claims.
    Malformed,
    /// The `kid` header names no configured key.
    UnknownKid,
    /// No `kid` header, and more than one key is configured.
    NoKid,
    /// The signature does not match the key (or the algorithm is not the key's).
    BadSignature,
    /// `exp` is past (beyond the leeway).
    Expired,
    /// `iss` is missing or not `auth.issuer`.
    WrongIssuer,
    /// `aud` is missing or does not hold `auth.audience`.
    WrongAudience,
    /// `sub` is not a valid user id.
    BadSubject,
}

impl JwtError {
    /// Stable code, the `reason` of the 401 answer.
    pub fn reason(self) -> &'static str {
        match self {
            Self::Missing => "missing_token",
            Self::Malformed => "malformed_token",
            Self::UnknownKid => "unknown_kid",
            Self::NoKid => "missing_kid",
            Self::BadSignature => "bad_signature",
            Self::Expired => "token_expired",
            Self::WrongIssuer => "wrong_issuer",
            Self::WrongAudience => "wrong_audience",
            Self::BadSubject => "bad_subject",
        }
    }

    /// What the client is told.
    pub fn message(self) -> &'static str {
        match self {
            Self::Missing => "missing bearer token",
            Self::Malformed => "malformed token",
            Self::UnknownKid => "the token's kid names no key of this service",
            Self::NoKid => "the token names no key (kid) and this service has several",
            Self::BadSignature => "bad token signature",
            Self::Expired => "the token has expired",
            Self::WrongIssuer => "the token's issuer (iss) is not the one this service trusts",
            Self::WrongAudience => "the token is not meant for this service (aud)",
            Self::BadSubject => "the token's subject is not a valid user id",
        }
    }
}

/// Verifies (and, with an HS256 key, signs) user JWTs.
pub struct Jwt {
    keys: Vec<Key>,
    /// The first HS256 key, for dev tokens: its encoding key and kid.
    signer: Option<(EncodingKey, Option<String>)>,
    issuer: String,
    audience: String,
}

/// A user id follows the one rule of the Redis contract (`seckill_lua::user`): an id
/// the edge accepts is one stockd and orderd accept too.
pub fn valid_user_id(u: &str) -> bool {
    seckill_lua::user::check_id(u).is_ok()
}

impl Jwt {
    /// Loads every key of `a` (reading the PEM and JWKS files). The error names the
    /// field; config validation runs this too.
    pub fn from_config(a: &Auth) -> Result<Self, KeyError> {
        let Loaded { keys, signer } = keys::load(a)?;
        Ok(Self {
            keys,
            signer,
            issuer: a.issuer.clone(),
            audience: a.audience.clone(),
        })
    }

    /// How many keys the set holds.
    pub fn key_count(&self) -> usize {
        self.keys.len()
    }

    /// True when dev tokens can be signed (an HS256 key is configured).
    pub fn can_issue(&self) -> bool {
        self.signer.is_some()
    }

    /// The user id of a valid token.
    pub fn verify(&self, token: &str) -> Result<String, JwtError> {
        self.verify_until(token).map(|(user, _)| user)
    }

    /// The user id of a valid token, and the last unix second at which this key set
    /// still accepts it (its `exp` plus the leeway: the validation refuses a token once
    /// `exp < now - leeway`), when its `exp` says.
    pub fn verify_until(&self, token: &str) -> Result<(String, Option<u64>), JwtError> {
        let header = jsonwebtoken::decode_header(token).map_err(|_| JwtError::Malformed)?;
        let key = match header.kid.as_deref() {
            Some(kid) => self
                .keys
                .iter()
                .find(|k| k.kid.as_deref() == Some(kid))
                .ok_or(JwtError::UnknownKid)?,
            None if self.keys.len() == 1 => &self.keys[0],
            None => return Err(JwtError::NoKid),
        };
        let data = jsonwebtoken::decode::<Subject>(token, &key.decoding, &key.validation).map_err(
            |e| match e.kind() {
                ErrorKind::ExpiredSignature => JwtError::Expired,
                ErrorKind::InvalidSignature | ErrorKind::InvalidAlgorithm => JwtError::BadSignature,
                ErrorKind::InvalidIssuer => JwtError::WrongIssuer,
                ErrorKind::InvalidAudience => JwtError::WrongAudience,
                ErrorKind::MissingRequiredClaim(c) if c == "iss" => JwtError::WrongIssuer,
                ErrorKind::MissingRequiredClaim(c) if c == "aud" => JwtError::WrongAudience,
                _ => JwtError::Malformed,
            },
        )?;
        if !valid_user_id(&data.claims.sub) {
            return Err(JwtError::BadSubject);
        }
        let until = exp_secs(&data.claims.exp).map(|e| e.saturating_add(key.validation.leeway));
        Ok((data.claims.sub, until))
    }

    /// Signs a token for `user` valid `ttl_secs` with the first HS256 key (its kid in
    /// the header, `auth.issuer` and `auth.audience` in the claims). Returns (token,
    /// exp ms); `None` without an HS256 key.
    pub fn issue(&self, user: &str, ttl_secs: u64, now_unix_ms: u64) -> Option<(String, u64)> {
        let (key, kid) = self.signer.as_ref()?;
        let exp = now_unix_ms / 1000 + ttl_secs;
        let claims = Issued {
            sub: user,
            exp,
            iss: &self.issuer,
            aud: &self.audience,
        };
        let mut header = Header::new(Algorithm::HS256);
        header.kid = kid.clone();
        let token = jsonwebtoken::encode(&header, &claims, key).ok()?;
        Some((token, exp * 1000))
    }
}

/// The last token a connection presented and this edge verified: a client on a
/// kept-alive connection sends the same bearer token with every request, and its
/// verification (two base64 and JSON decodes, an HMAC or a signature check) is most of
/// what a cheap answer costs. The same bytes are accepted again without a new check
/// while the key set that verified them is the one in force (a SIGHUP swaps it) and
/// the clock is within their `exp` plus the leeway, which is exactly when a new check
/// would accept them: the validation reads nothing else that changes (no `nbf` check,
/// no revocation list). One per connection (the fast lane's), so it holds one token.
#[derive(Default)]
pub struct TokenMemo(Option<Memo>);

struct Memo {
    token: Box<str>,
    user: String,
    until_s: u64,
    keys: Arc<Jwt>,
}

impl TokenMemo {
    /// [`Jwt::verify`] by `keys`, answered from the memo when `token` is the one it
    /// holds and still valid at `now_unix_ms`.
    pub fn verify(
        &mut self,
        keys: &Arc<Jwt>,
        token: &str,
        now_unix_ms: u64,
    ) -> Result<String, JwtError> {
        if let Some(m) = &self.0 {
            if Arc::ptr_eq(&m.keys, keys) && *m.token == *token && now_unix_ms / 1000 <= m.until_s {
                return Ok(m.user.clone());
            }
        }
        let (user, until_s) = keys.verify_until(token)?;
        // A token whose expiry cannot be read is verified each time, never remembered.
        self.0 = until_s.map(|until_s| Memo {
            token: token.into(),
            user: user.clone(),
            until_s,
            keys: keys.clone(),
        });
        Ok(user)
    }
}

/// The bearer token of a request: `Authorization: Bearer <t>`, or `access_token=<t>`
/// in the query (only where allowed: browsers' `EventSource` cannot set headers).
pub fn bearer<'a>(
    authorization: Option<&'a [u8]>,
    query: Option<&'a str>,
    allow_query: bool,
) -> Option<&'a str> {
    if let Some(h) = authorization {
        let h = std::str::from_utf8(h).ok()?;
        let (scheme, token) = h.split_once(' ')?;
        return scheme.eq_ignore_ascii_case("bearer").then(|| token.trim());
    }
    if allow_query {
        return query?
            .split('&')
            .find_map(|kv| kv.strip_prefix("access_token="))
            .filter(|t| !t.is_empty());
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::{JwtAlg, JwtKey};
    use seckill_lua::clock::unix_ms as now_ms;

    const SECRET: &str = "0123456789abcdef0123";

    fn hs_auth() -> Auth {
        Auth {
            jwt_secret: SECRET.into(),
            jwt_leeway_secs: 0,
            purchase_token_secret: "x".repeat(16),
            purchase_token_ttl_secs: 60,
            ..Auth::default()
        }
    }

    fn hs() -> Jwt {
        Jwt::from_config(&hs_auth()).unwrap()
    }

    fn hs_key(kid: &str, secret: &str) -> JwtKey {
        JwtKey {
            kid: kid.into(),
            alg: JwtAlg::HS256,
            secret: secret.into(),
            ..JwtKey::default()
        }
    }

    /// A token signed by `secret` with `kid` and extra claims.
    fn sign(secret: &str, kid: Option<&str>, claims: serde_json::Value) -> String {
        let mut h = Header::new(Algorithm::HS256);
        h.kid = kid.map(str::to_string);
        jsonwebtoken::encode(&h, &claims, &EncodingKey::from_secret(secret.as_bytes())).unwrap()
    }

    fn exp() -> u64 {
        now_ms() / 1000 + 60
    }

    #[test]
    fn an_issued_token_names_its_user() {
        let j = hs();
        let (t, exp) = j.issue("alice", 60, now_ms()).unwrap();
        assert!(exp > now_ms());
        assert_eq!(j.verify(&t).unwrap(), "alice");
    }

    #[test]
    fn a_remembered_token_holds_until_its_expiry_and_a_key_reload_checks_it_again() {
        let keys = Arc::new(hs());
        let mut memo = TokenMemo::default();
        let (alice, _) = keys.issue("alice", 60, now_ms()).unwrap();
        assert_eq!(memo.verify(&keys, &alice, now_ms()).unwrap(), "alice");
        assert_eq!(memo.verify(&keys, &alice, now_ms()).unwrap(), "alice");
        // A reloaded key set that no longer signs it: checked again, refused; the old
        // set (a request that started before the reload) still accepts it.
        let reloaded = Arc::new(
            Jwt::from_config(&Auth {
                jwt_secret: "another-secret-of-20b".into(),
                ..hs_auth()
            })
            .unwrap(),
        );
        assert_eq!(
            memo.verify(&reloaded, &alice, now_ms()),
            Err(JwtError::BadSignature)
        );
        assert_eq!(memo.verify(&keys, &alice, now_ms()).unwrap(), "alice");
        // Another token on the connection is verified on its own.
        assert_eq!(
            memo.verify(&keys, "not.a.jwt", now_ms()),
            Err(JwtError::Malformed)
        );
        // A token one second from its expiry (leeway 0): remembered, then refused once
        // the clock passes it, as a new check refuses it.
        let bob = sign(
            SECRET,
            None,
            serde_json::json!({"sub": "bob", "exp": now_ms() / 1000 + 1}),
        );
        assert_eq!(memo.verify(&keys, &bob, now_ms()).unwrap(), "bob");
        std::thread::sleep(std::time::Duration::from_millis(2100));
        assert_eq!(memo.verify(&keys, &bob, now_ms()), Err(JwtError::Expired));
        assert_eq!(keys.verify(&bob), Err(JwtError::Expired));
    }

    #[test]
    fn a_float_exp_the_validation_accepts_is_accepted_and_read() {
        let keys = Arc::new(hs());
        let exp = (now_ms() / 1000 + 60) as f64 + 0.5;
        let t = sign(
            SECRET,
            None,
            serde_json::json!({"sub": "carol", "exp": exp}),
        );
        assert_eq!(keys.verify(&t).unwrap(), "carol");
        let (_, until) = keys.verify_until(&t).unwrap();
        assert_eq!(until, Some(exp.round() as u64));
        let mut memo = TokenMemo::default();
        assert_eq!(memo.verify(&keys, &t, now_ms()).unwrap(), "carol");
        assert_eq!(exp_secs(&serde_json::json!("soon")), None);
        assert_eq!(exp_secs(&serde_json::json!(-1.0)), None);
    }

    #[test]
    fn expired_forged_and_garbage_tokens_are_refused() {
        let j = hs();
        let (old, _) = j.issue("alice", 1, now_ms() - 3_600_000).unwrap();
        assert_eq!(j.verify(&old), Err(JwtError::Expired));
        let (t, _) = j.issue("alice", 60, now_ms()).unwrap();
        let mut forged = t.clone();
        forged.pop();
        forged.push(if t.ends_with('A') { 'B' } else { 'A' });
        assert!(j.verify(&forged).is_err());
        let other = Jwt::from_config(&Auth {
            jwt_secret: "another-secret-of-20b".into(),
            ..hs_auth()
        })
        .unwrap();
        assert_eq!(other.verify(&t), Err(JwtError::BadSignature));
        assert_eq!(j.verify("not.a.jwt"), Err(JwtError::Malformed));
        assert_eq!(j.verify(""), Err(JwtError::Malformed));
    }

    #[test]
    fn the_kid_picks_the_key_so_two_keys_are_valid_during_a_rotation() {
        let j = Jwt::from_config(&Auth {
            jwt_secret: String::new(),
            keys: vec![
                hs_key("old", "old-secret-0123456789"),
                hs_key("new", "new-secret-0123456789"),
            ],
            ..hs_auth()
        })
        .unwrap();
        let claims = serde_json::json!({"sub": "alice", "exp": exp()});
        for (kid, secret) in [
            ("old", "old-secret-0123456789"),
            ("new", "new-secret-0123456789"),
        ] {
            let t = sign(secret, Some(kid), claims.clone());
            assert_eq!(j.verify(&t).unwrap(), "alice", "{kid}");
        }
        // The right secret under the wrong kid is a bad signature, not a pass.
        let t = sign("old-secret-0123456789", Some("new"), claims.clone());
        assert_eq!(j.verify(&t), Err(JwtError::BadSignature));
        let t = sign("old-secret-0123456789", Some("gone"), claims.clone());
        assert_eq!(j.verify(&t), Err(JwtError::UnknownKid));
        // No kid with two keys: refused rather than guessed.
        let t = sign("old-secret-0123456789", None, claims.clone());
        assert_eq!(j.verify(&t), Err(JwtError::NoKid));
        // The dev endpoint signs with the first HS256 key, naming its kid.
        let (t, _) = j.issue("bob", 60, now_ms()).unwrap();
        assert_eq!(
            jsonwebtoken::decode_header(&t).unwrap().kid.as_deref(),
            Some("old")
        );
        assert_eq!(j.verify(&t).unwrap(), "bob");
    }

    #[test]
    fn a_token_without_kid_is_verified_by_the_only_key() {
        let j = Jwt::from_config(&Auth {
            jwt_secret: String::new(),
            keys: vec![hs_key("only", "only-secret-0123456789")],
            ..hs_auth()
        })
        .unwrap();
        let t = sign(
            "only-secret-0123456789",
            None,
            serde_json::json!({"sub": "al", "exp": exp()}),
        );
        assert_eq!(j.verify(&t).unwrap(), "al");
    }

    #[test]
    fn issuer_and_audience_are_checked_when_configured() {
        let j = Jwt::from_config(&Auth {
            issuer: "https://id.example".into(),
            audience: "seckill".into(),
            ..hs_auth()
        })
        .unwrap();
        let t = |c: serde_json::Value| sign(SECRET, None, c);
        let e = exp();
        let good = t(
            serde_json::json!({"sub": "a", "exp": e, "iss": "https://id.example", "aud": ["other", "seckill"]}),
        );
        assert_eq!(j.verify(&good).unwrap(), "a");
        let cases = [
            (
                serde_json::json!({"sub": "a", "exp": e, "iss": "https://evil", "aud": "seckill"}),
                JwtError::WrongIssuer,
            ),
            (
                serde_json::json!({"sub": "a", "exp": e, "aud": "seckill"}),
                JwtError::WrongIssuer,
            ),
            (
                serde_json::json!({"sub": "a", "exp": e, "iss": "https://id.example", "aud": "other"}),
                JwtError::WrongAudience,
            ),
            (
                serde_json::json!({"sub": "a", "exp": e, "iss": "https://id.example"}),
                JwtError::WrongAudience,
            ),
        ];
        for (claims, want) in cases {
            assert_eq!(j.verify(&t(claims.clone())), Err(want), "{claims}");
        }
        // Dev tokens carry both, so they pass.
        let (dev, _) = j.issue("d", 60, now_ms()).unwrap();
        assert_eq!(j.verify(&dev).unwrap(), "d");
        // Without an audience configured, a token's aud is ignored.
        let plain = hs();
        let t = sign(
            SECRET,
            None,
            serde_json::json!({"sub": "a", "exp": e, "aud": "x"}),
        );
        assert_eq!(plain.verify(&t).unwrap(), "a");
    }

    #[test]
    fn es256_keys_from_pem_and_a_jwks_file_verify_their_tokens() {
        let pair = rcgen::KeyPair::generate_for(&rcgen::PKCS_ECDSA_P256_SHA256).unwrap();
        let dir = tempfile::tempdir().unwrap();
        let pem = dir.path().join("es.pem");
        std::fs::write(&pem, pair.public_key_pem()).unwrap();
        let jwks = dir.path().join("jwks.json");
        std::fs::write(
            &jwks,
            r#"{"keys": [{"kty": "oct", "kid": "sym", "alg": "HS256", "k": "c3ltLXNlY3JldC0wMTIzNDU2Nzg5"}]}"#,
        )
        .unwrap();
        let j = Jwt::from_config(&Auth {
            jwt_secret: String::new(),
            keys: vec![JwtKey {
                kid: "ec".into(),
                alg: JwtAlg::ES256,
                public_key_path: pem.display().to_string(),
                ..JwtKey::default()
            }],
            jwks_path: jwks.display().to_string(),
            ..hs_auth()
        })
        .unwrap();
        assert_eq!(j.key_count(), 2);
        let mut h = Header::new(Algorithm::ES256);
        h.kid = Some("ec".into());
        let signing = EncodingKey::from_ec_pem(pair.serialize_pem().as_bytes()).unwrap();
        let claims = serde_json::json!({"sub": "eve", "exp": exp()});
        let t = jsonwebtoken::encode(&h, &claims, &signing).unwrap();
        assert_eq!(j.verify(&t).unwrap(), "eve");
        // "sym-secret-0123456789", base64url in the file.
        let t = sign("sym-secret-0123456789", Some("sym"), claims.clone());
        assert_eq!(j.verify(&t).unwrap(), "eve");
        // An HS256 token under the EC kid (algorithm confusion) is refused.
        let t = sign("sym-secret-0123456789", Some("ec"), claims);
        assert_eq!(j.verify(&t), Err(JwtError::BadSignature));
    }

    #[test]
    fn bearer_comes_from_the_header_or_where_allowed_the_query() {
        assert_eq!(bearer(Some(b"Bearer abc"), None, false), Some("abc"));
        assert_eq!(bearer(Some(b"bearer abc"), None, false), Some("abc"));
        assert_eq!(bearer(Some(b"Basic abc"), None, false), None);
        assert_eq!(bearer(None, Some("x=1&access_token=t"), true), Some("t"));
        assert_eq!(bearer(None, Some("access_token=t"), false), None);
    }
}
