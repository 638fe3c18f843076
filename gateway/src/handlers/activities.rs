//! `GET /api/v1/activities` and `GET /api/v1/activities/{a}`: from memory (the
//! catalog the Redis feeds keep), no backend call.

use pingora::prelude::*;
use pingora::proxy::Session;

use crate::answer::Refusal;
use crate::proxy::{Ctx, Gateway, Req};
use serde_json::json;

impl Gateway {
    /// Current and upcoming activities.
    pub(crate) async fn list_activities(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        req: Req<'_>,
    ) -> Result<bool> {
        let shared = &*self.shared;
        let now = req.now_unix_ms as i64;
        let all = shared.catalog.all();
        let mut acts: Vec<_> = all.values().filter(|a| a.end_ms > now).collect();
        acts.sort_by_key(|a| (a.start_ms, a.id));
        let body = json!({
            "server_time_ms": now,
            "activities": acts.iter().map(|a| a.to_json(now)).collect::<Vec<_>>(),
        });
        self.ok(session, ctx, 200, &body).await
    }

    /// One activity with its items.
    pub(crate) async fn get_activity(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        req: Req<'_>,
        a: u64,
    ) -> Result<bool> {
        let shared = &*self.shared;
        match shared.catalog.get(a) {
            Some(act) => {
                let now = req.now_unix_ms as i64;
                let body = json!({"server_time_ms": now, "activity": act.to_json(now)});
                self.ok(session, ctx, 200, &body).await
            }
            None => {
                self.refuse(session, ctx, Refusal::NotFound("no such activity"))
                    .await
            }
        }
    }
}
