//! The purchase token of a reserve, after the body: signed for this user and item,
//! not expired (`crate::purchase_token` signs and verifies; no Redis call).

use super::{Cx, Filter, Flow};
use crate::answer::Refusal;
use crate::routes::Route;

/// The purchase token of a reserve.
pub struct PurchaseToken;

impl Filter for PurchaseToken {
    fn name(&self) -> &'static str {
        "purchase_token"
    }

    fn check(&self, cx: &mut Cx<'_>) -> Flow {
        let Route::Reserve(a, s) = cx.route else {
            return Flow::Go;
        };
        let (Some(user), Some(token)) = (cx.user.as_deref(), cx.purchase_token) else {
            return Flow::Stop(Refusal::BadPurchaseToken("missing purchase token"));
        };
        match cx.shared.tokens.verify(token, user, *a, *s, cx.now_unix_ms) {
            Ok(()) => Flow::Go,
            Err(why) => Flow::Stop(Refusal::BadPurchaseToken(why)),
        }
    }
}
