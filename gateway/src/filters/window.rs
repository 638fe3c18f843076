//! The sale window, after authentication: challenge, token and reserve routes need a known
//! activity and item, inside the window, not sold out (but to the authenticated user
//! who holds a unit: their resend gets their reservation back); the item found is
//! kept in the context for the admission cap.

use super::{Cx, Filter, Flow};
use crate::answer::Refusal;
use crate::routes::Route;

/// After authentication: the window and the item for token and reserve.
pub struct Window;

impl Filter for Window {
    fn name(&self) -> &'static str {
        "window"
    }

    fn check(&self, cx: &mut Cx<'_>) -> Flow {
        let (a, s) = match cx.route {
            Route::Token(a, s) | Route::Challenge(a, s) | Route::Reserve(a, s) => (*a, *s),
            _ => return Flow::Go,
        };
        let Some(act) = cx.shared.catalog.get(a) else {
            return Flow::Stop(Refusal::NotFound("no such activity"));
        };
        let Some(item) = act.item(s).cloned() else {
            return Flow::Stop(Refusal::NotFound("no such item"));
        };
        let now = cx.now_unix_ms as i64;
        if now < act.start_ms {
            return Flow::Stop(Refusal::TooEarly {
                start_at_ms: act.start_ms,
                server_time_ms: now,
            });
        }
        if now >= act.end_ms {
            return Flow::Stop(Refusal::Ended);
        }
        if item.sold_out_for(cx.user.as_deref()) {
            return Flow::Stop(Refusal::SoldOut);
        }
        cx.item = Some(item);
        Flow::Go
    }
}
