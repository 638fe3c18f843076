//! The JWT key set of `[auth]`: the single key, `[[auth.keys]]` and the JWKS file
//! `auth.jwks_path`, loaded into verification keys with their validation (algorithm,
//! leeway, issuer, audience); every problem names its config field ([`KeyError`]).

use crate::config::{Auth, JwtAlg};
use jsonwebtoken::jwk::{AlgorithmParameters, EllipticCurve, JwkSet, KeyAlgorithm};
use jsonwebtoken::{Algorithm, DecodingKey, EncodingKey, Validation};

/// A key set that failed to load: the config field and the problem.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyError {
    pub field: String,
    pub problem: String,
}

impl std::fmt::Display for KeyError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.field, self.problem)
    }
}

impl std::error::Error for KeyError {}

fn key_error(field: impl Into<String>, problem: impl Into<String>) -> KeyError {
    KeyError {
        field: field.into(),
        problem: problem.into(),
    }
}

/// One verification key.
pub(super) struct Key {
    /// `None` only for the single key of `auth.jwt_*`.
    pub kid: Option<String>,
    pub decoding: DecodingKey,
    pub validation: Validation,
}

/// A loaded key set.
pub(super) struct Loaded {
    pub keys: Vec<Key>,
    /// The first HS256 key, for dev tokens: its encoding key and kid.
    pub signer: Option<(EncodingKey, Option<String>)>,
}

fn algorithm(a: JwtAlg) -> Algorithm {
    match a {
        JwtAlg::HS256 => Algorithm::HS256,
        JwtAlg::RS256 => Algorithm::RS256,
        JwtAlg::ES256 => Algorithm::ES256,
    }
}

/// A verification key from a secret or a PEM file; `field` names where it came from.
fn pem_or_secret(
    alg: JwtAlg,
    secret: &str,
    pem_path: &str,
    field: &str,
    path_field: &str,
) -> Result<DecodingKey, KeyError> {
    match alg {
        JwtAlg::HS256 => {
            if secret.len() < 16 {
                return Err(key_error(field, "must be at least 16 bytes for HS256"));
            }
            Ok(DecodingKey::from_secret(secret.as_bytes()))
        }
        JwtAlg::RS256 | JwtAlg::ES256 => {
            if pem_path.is_empty() {
                return Err(key_error(path_field, "required for RS256 and ES256"));
            }
            let pem = std::fs::read(pem_path)
                .map_err(|e| key_error(path_field, format!("cannot read: {e}")))?;
            let key = if alg == JwtAlg::RS256 {
                DecodingKey::from_rsa_pem(&pem)
            } else {
                DecodingKey::from_ec_pem(&pem)
            };
            key.map_err(|_| key_error(path_field, format!("not a PEM {alg} public key")))
        }
    }
}

/// The keys of a JWKS file, each with its kid and algorithm.
fn load_jwks(path: &str) -> Result<Vec<(String, Algorithm, DecodingKey)>, KeyError> {
    const FIELD: &str = "auth.jwks_path";
    let text =
        std::fs::read_to_string(path).map_err(|e| key_error(FIELD, format!("cannot read: {e}")))?;
    let set: JwkSet = serde_json::from_str(&text)
        .map_err(|e| key_error(FIELD, format!("not a JSON Web Key Set: {e}")))?;
    let mut out = Vec::with_capacity(set.keys.len());
    for (i, jwk) in set.keys.iter().enumerate() {
        let Some(kid) = jwk.common.key_id.clone().filter(|k| !k.is_empty()) else {
            return Err(key_error(FIELD, format!("key {i} has no kid")));
        };
        let alg = match (&jwk.common.key_algorithm, &jwk.algorithm) {
            (Some(KeyAlgorithm::RS256), AlgorithmParameters::RSA(_)) => Algorithm::RS256,
            (Some(KeyAlgorithm::ES256), AlgorithmParameters::EllipticCurve(p))
                if p.curve == EllipticCurve::P256 =>
            {
                Algorithm::ES256
            }
            (Some(KeyAlgorithm::HS256), AlgorithmParameters::OctetKey(_)) => Algorithm::HS256,
            (None, AlgorithmParameters::RSA(_)) => Algorithm::RS256,
            (None, AlgorithmParameters::EllipticCurve(p)) if p.curve == EllipticCurve::P256 => {
                Algorithm::ES256
            }
            (None, AlgorithmParameters::OctetKey(_)) => Algorithm::HS256,
            _ => {
                return Err(key_error(
                    FIELD,
                    format!("key {kid:?}: only RS256 (RSA), ES256 (EC P-256) and HS256 (oct) keys"),
                ))
            }
        };
        let key = DecodingKey::from_jwk(jwk)
            .map_err(|e| key_error(FIELD, format!("key {kid:?}: {e}")))?;
        out.push((kid, alg, key));
    }
    Ok(out)
}

/// Every key of `a` (the PEM and JWKS files read) and the dev signer. The error names
/// the field.
pub(super) fn load(a: &Auth) -> Result<Loaded, KeyError> {
    let validation = |alg: Algorithm| {
        let mut v = Validation::new(alg);
        v.leeway = a.jwt_leeway_secs;
        let mut required = vec!["exp", "sub"];
        if a.issuer.is_empty() {
            v.iss = None;
        } else {
            v.set_issuer(&[&a.issuer]);
            required.push("iss");
        }
        if a.audience.is_empty() {
            v.validate_aud = false;
        } else {
            v.set_audience(&[&a.audience]);
            required.push("aud");
        }
        v.set_required_spec_claims(&required);
        v
    };
    let mut keys = Vec::new();
    let mut signer = None;
    let single = match a.jwt_alg {
        JwtAlg::HS256 => !a.jwt_secret.is_empty(),
        JwtAlg::RS256 | JwtAlg::ES256 => !a.jwt_public_key_path.is_empty(),
    };
    // With no key anywhere, the single key is checked so that the error names it.
    if single || (a.keys.is_empty() && a.jwks_path.is_empty()) {
        let decoding = pem_or_secret(
            a.jwt_alg,
            &a.jwt_secret,
            &a.jwt_public_key_path,
            "auth.jwt_secret",
            "auth.jwt_public_key_path",
        )?;
        if a.jwt_alg == JwtAlg::HS256 {
            signer = Some((EncodingKey::from_secret(a.jwt_secret.as_bytes()), None));
        }
        keys.push(Key {
            kid: None,
            decoding,
            validation: validation(algorithm(a.jwt_alg)),
        });
    }
    for (i, k) in a.keys.iter().enumerate() {
        let field = |f: &str| format!("auth.keys[{i}].{f}");
        if k.kid.is_empty() {
            return Err(key_error(field("kid"), "required"));
        }
        if a.keys[..i].iter().any(|o| o.kid == k.kid) {
            return Err(key_error(field("kid"), "names another key already"));
        }
        let decoding = pem_or_secret(
            k.alg,
            &k.secret,
            &k.public_key_path,
            &field("secret"),
            &field("public_key_path"),
        )?;
        if k.alg == JwtAlg::HS256 && signer.is_none() {
            signer = Some((
                EncodingKey::from_secret(k.secret.as_bytes()),
                Some(k.kid.clone()),
            ));
        }
        keys.push(Key {
            kid: Some(k.kid.clone()),
            decoding,
            validation: validation(algorithm(k.alg)),
        });
    }
    if !a.jwks_path.is_empty() {
        for (kid, alg, decoding) in load_jwks(&a.jwks_path)? {
            if keys.iter().any(|k| k.kid.as_deref() == Some(kid.as_str())) {
                return Err(key_error(
                    "auth.jwks_path",
                    format!("kid {kid:?} is given twice (in auth.keys or the file)"),
                ));
            }
            keys.push(Key {
                kid: Some(kid),
                decoding,
                validation: validation(alg),
            });
        }
    }
    if keys.is_empty() {
        return Err(key_error("auth.jwks_path", "the key set holds no key"));
    }
    Ok(Loaded { keys, signer })
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::JwtKey;

    fn hs_auth() -> Auth {
        Auth {
            jwt_secret: "0123456789abcdef0123".into(),
            purchase_token_secret: "x".repeat(16),
            ..Auth::default()
        }
    }

    fn hs_key(kid: &str, secret: &str) -> JwtKey {
        JwtKey {
            kid: kid.into(),
            alg: JwtAlg::HS256,
            secret: secret.into(),
            ..JwtKey::default()
        }
    }

    #[test]
    fn bad_key_sets_are_refused_naming_the_field() {
        let err = |a: Auth| load(&a).err().unwrap().field;
        assert_eq!(
            err(Auth {
                jwt_secret: "short".into(),
                ..hs_auth()
            }),
            "auth.jwt_secret"
        );
        assert_eq!(
            err(Auth {
                keys: vec![hs_key("", "0123456789abcdef")],
                ..hs_auth()
            }),
            "auth.keys[0].kid"
        );
        assert_eq!(
            err(Auth {
                keys: vec![
                    hs_key("a", "0123456789abcdef"),
                    hs_key("a", "0123456789abcdeg")
                ],
                ..hs_auth()
            }),
            "auth.keys[1].kid"
        );
        assert_eq!(
            err(Auth {
                keys: vec![hs_key("a", "short")],
                ..hs_auth()
            }),
            "auth.keys[0].secret"
        );
        assert_eq!(
            err(Auth {
                keys: vec![JwtKey {
                    kid: "r".into(),
                    alg: JwtAlg::RS256,
                    ..JwtKey::default()
                }],
                ..hs_auth()
            }),
            "auth.keys[0].public_key_path"
        );
        let dir = tempfile::tempdir().unwrap();
        let jwks = dir.path().join("jwks.json");
        for bad in [
            "nope",
            r#"{"keys": [{"kty": "oct", "k": "c2VjcmV0LXNlY3JldC1zZWNyZXQ"}]}"#,
        ] {
            std::fs::write(&jwks, bad).unwrap();
            let a = Auth {
                jwks_path: jwks.display().to_string(),
                ..hs_auth()
            };
            assert_eq!(err(a), "auth.jwks_path", "{bad}");
        }
    }
}
