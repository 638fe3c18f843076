//! Authentication (state of the `authenticate` filter). A bearer JWT (HS256 secret, or RS256/ES256 public key from
//! config) names the user in its `sub` claim; the user id never comes from the URL or
//! the body. Also issues the dev-only HS256 tokens of `POST /api/v1/dev/token`.

use crate::config::{Auth, JwtAlg};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Header, Validation};
use serde::{Deserialize, Serialize};

#[derive(Debug, Serialize, Deserialize)]
struct Claims {
    sub: String,
    exp: u64,
}

/// Verifies (and for HS256, signs) user JWTs.
pub struct Jwt {
    decoding: DecodingKey,
    encoding: Option<EncodingKey>,
    alg: Algorithm,
    validation: Validation,
}

/// A user id follows the one rule of the Redis contract (`seckill_lua::user`): an id
/// the edge accepts is one stockd and orderd accept too.
pub fn valid_user_id(u: &str) -> bool {
    seckill_lua::user::check_id(u).is_ok()
}

impl Jwt {
    /// Config validation has already checked the key.
    pub fn from_config(a: &Auth) -> anyhow::Result<Self> {
        let (alg, decoding, encoding) = match a.jwt_alg {
            JwtAlg::HS256 => (
                Algorithm::HS256,
                DecodingKey::from_secret(a.jwt_secret.as_bytes()),
                Some(EncodingKey::from_secret(a.jwt_secret.as_bytes())),
            ),
            JwtAlg::RS256 => (
                Algorithm::RS256,
                DecodingKey::from_rsa_pem(&std::fs::read(&a.jwt_public_key_path)?)?,
                None,
            ),
            JwtAlg::ES256 => (
                Algorithm::ES256,
                DecodingKey::from_ec_pem(&std::fs::read(&a.jwt_public_key_path)?)?,
                None,
            ),
        };
        let mut validation = Validation::new(alg);
        validation.leeway = a.jwt_leeway_secs;
        validation.set_required_spec_claims(&["exp", "sub"]);
        Ok(Self {
            decoding,
            encoding,
            alg,
            validation,
        })
    }

    /// The user id of a valid token.
    pub fn verify(&self, token: &str) -> Result<String, &'static str> {
        let data = jsonwebtoken::decode::<Claims>(token, &self.decoding, &self.validation)
            .map_err(|e| match e.kind() {
                jsonwebtoken::errors::ErrorKind::ExpiredSignature => "the token has expired",
                jsonwebtoken::errors::ErrorKind::InvalidSignature => "bad token signature",
                _ => "malformed or wrongly signed token",
            })?;
        if !valid_user_id(&data.claims.sub) {
            return Err("the token's subject is not a valid user id");
        }
        Ok(data.claims.sub)
    }

    /// Signs a token for `user` valid `ttl_secs` (HS256 only). Returns (token, exp ms).
    pub fn issue(&self, user: &str, ttl_secs: u64, now_unix_ms: u64) -> Option<(String, u64)> {
        let key = self.encoding.as_ref()?;
        let exp = now_unix_ms / 1000 + ttl_secs;
        let claims = Claims {
            sub: user.to_string(),
            exp,
        };
        let token = jsonwebtoken::encode(&Header::new(self.alg), &claims, key).ok()?;
        Some((token, exp * 1000))
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

    fn hs() -> Jwt {
        Jwt::from_config(&Auth {
            jwt_alg: JwtAlg::HS256,
            jwt_secret: "0123456789abcdef0123".into(),
            jwt_public_key_path: String::new(),
            jwt_leeway_secs: 0,
            purchase_token_secret: "x".repeat(16),
            purchase_token_ttl_secs: 60,
        })
        .unwrap()
    }

    use seckill_lua::clock::unix_ms as now_ms;

    #[test]
    fn an_issued_token_names_its_user() {
        let j = hs();
        let (t, exp) = j.issue("alice", 60, now_ms()).unwrap();
        assert!(exp > now_ms());
        assert_eq!(j.verify(&t).unwrap(), "alice");
    }

    #[test]
    fn expired_forged_and_garbage_tokens_are_refused() {
        let j = hs();
        let (old, _) = j.issue("alice", 1, now_ms() - 3_600_000).unwrap();
        assert_eq!(j.verify(&old), Err("the token has expired"));
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
        assert!(other.verify(&t).is_err());
        assert!(j.verify("not.a.jwt").is_err());
        assert!(j.verify("").is_err());
    }

    fn hs_auth() -> Auth {
        Auth {
            jwt_alg: JwtAlg::HS256,
            jwt_secret: "0123456789abcdef0123".into(),
            jwt_public_key_path: String::new(),
            jwt_leeway_secs: 0,
            purchase_token_secret: "x".repeat(16),
            purchase_token_ttl_secs: 60,
        }
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
