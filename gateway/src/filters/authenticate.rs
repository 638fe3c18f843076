//! Authentication: routes that need a user get one from a valid JWT (`crate::auth`
//! verifies it against the key set in force, swapped on SIGHUP), or 401 naming the
//! reason.

use super::{Cx, Filter, Flow};
use crate::answer::Refusal;
use crate::auth::JwtError;

/// The filter: routes that need a user get one from a valid JWT, or 401.
pub struct Authenticate;

impl Filter for Authenticate {
    fn name(&self) -> &'static str {
        "authenticate"
    }

    fn check(&self, cx: &mut Cx<'_>) -> Flow {
        if !cx.route.needs_user() {
            return Flow::Go;
        }
        let Some(token) = cx.bearer else {
            return Flow::Stop(Refusal::Unauthenticated(JwtError::Missing));
        };
        let keys = cx.shared.jwt();
        let verified = match cx.memo.as_deref_mut() {
            Some(memo) => memo.verify(&keys, token, cx.now_unix_ms),
            None => keys.verify(token),
        };
        match verified {
            Ok(user) => {
                cx.user = Some(user);
                Flow::Go
            }
            Err(why) => Flow::Stop(Refusal::Unauthenticated(why)),
        }
    }
}
