//! The sold-out short-circuit, before authentication: a reserve of an item whose
//! shards are all empty is answered 410 from memory (`crate::sold_out`, fed by the
//! shard keys, the buyers hashes and pub/sub), with no JWT check and no backend call,
//! unless the bearer token names a user who holds a unit of the item.
//!
//! That user is read from the token's payload WITHOUT checking its signature (a base64
//! decode and a JSON scan of one field, no allocation for a usual token): it only
//! decides whether the request is worth the full path, which then verifies the JWT
//! (`authenticate`), the holder again (`window`) and the purchase token before stockd
//! answers the resend with the same reservation (or `duplicate`). A forged `sub` buys
//! a JWT check and a 401, never a backend call; everyone else gets 410 as before.

use std::borrow::Cow;
use std::sync::atomic::Ordering;

use base64::Engine as _;
use serde::Deserialize;

use super::{Cx, Filter, Flow};
use crate::answer::Refusal;
use crate::routes::Route;

/// Before authentication: a reserve of a sold-out item is answered 410 at once, but
/// for its holders.
pub struct SoldOutEarly;

impl Filter for SoldOutEarly {
    fn name(&self) -> &'static str {
        "sold_out"
    }

    fn check(&self, cx: &mut Cx<'_>) -> Flow {
        if let Route::Reserve(a, s) = cx.route {
            if let Some(act) = cx.shared.catalog.get(*a) {
                if let Some(item) = act.item(*s) {
                    if item.touch(cx.now_unix_ms as i64) {
                        // Idle until now: read on every poll from here, starting now.
                        cx.shared.catalog.want_read(act.cluster.as_deref());
                    }
                    if cx.now_unix_ms as i64 >= act.start_ms
                        && item.sold_out.load(Ordering::Acquire)
                        && !with_unverified_sub(cx.bearer, |u| item.held_by(u)).unwrap_or(false)
                    {
                        return Flow::Stop(Refusal::SoldOut);
                    }
                }
            }
        }
        Flow::Go
    }
}

/// The claim we read.
#[derive(Deserialize)]
struct Sub<'a> {
    #[serde(borrow)]
    sub: Cow<'a, str>,
}

/// Payloads up to this size decode on the stack.
const STACK_PAYLOAD: usize = 768;

/// `f` of the `sub` claim of a JWT, its signature NOT checked; `None` when there is no
/// token or it is not shaped like a JWT.
fn with_unverified_sub<R>(bearer: Option<&str>, f: impl FnOnce(&str) -> R) -> Option<R> {
    let mut parts = bearer?.split('.');
    let (_, payload) = (parts.next()?, parts.next()?);
    let engine = &base64::engine::general_purpose::URL_SAFE_NO_PAD;
    let mut stack = [0u8; STACK_PAYLOAD];
    let heap;
    let json: &[u8] = match engine.decode_slice(payload, &mut stack) {
        Ok(n) => &stack[..n],
        Err(_) => {
            heap = engine.decode(payload).ok()?;
            &heap
        }
    };
    serde_json::from_slice::<Sub<'_>>(json)
        .ok()
        .map(|c| f(&c.sub))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unverified_sub(bearer: Option<&str>) -> Option<String> {
        with_unverified_sub(bearer, str::to_owned)
    }

    fn token(payload: &str) -> String {
        let b64 = |s: &str| base64::engine::general_purpose::URL_SAFE_NO_PAD.encode(s);
        format!("{}.{}.sig", b64(r#"{"alg":"HS256"}"#), b64(payload))
    }

    #[test]
    fn the_subject_is_read_without_the_key() {
        let t = token(r#"{"sub":"alice","exp":1}"#);
        assert_eq!(unverified_sub(Some(&t)).as_deref(), Some("alice"));
        let escaped = token(r#"{"exp":1,"sub":"a\u006cice"}"#);
        assert_eq!(unverified_sub(Some(&escaped)).as_deref(), Some("alice"));
        let long = token(&format!(r#"{{"sub":"bob","pad":"{}"}}"#, "x".repeat(2000)));
        assert_eq!(unverified_sub(Some(&long)).as_deref(), Some("bob"));
    }

    #[test]
    fn what_is_not_a_jwt_names_nobody() {
        for t in [
            "",
            "abc",
            "a.!!!.c",
            &token("not json"),
            &token(r#"{"exp":1}"#),
            &token(r#"{"sub":7}"#),
        ] {
            assert_eq!(unverified_sub(Some(t)), None, "{t}");
        }
        assert_eq!(unverified_sub(None), None);
    }
}
