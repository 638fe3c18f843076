//! `POST /api/v1/dev/token` (only with `dev.enabled`): a JWT for a user id, for local
//! stacks and load tests.

use pingora::prelude::*;
use pingora::proxy::Session;

use crate::answer::Refusal;
use crate::proxy::{Ctx, Gateway, Req};
use serde_json::{json, Value};

impl Gateway {
    /// A JWT for the body's `user_id`.
    pub(crate) async fn dev_token(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        req: Req<'_>,
    ) -> Result<bool> {
        let shared = &*self.shared;
        if !shared.cfg.dev.enabled {
            return self
                .refuse(session, ctx, Refusal::NotFound("no such route"))
                .await;
        }
        let body = match self.body(session, &req.policy.protection).await? {
            Ok(b) => b,
            Err(r) => return self.refuse(session, ctx, r).await,
        };
        let Some(uid) = body
            .get("user_id")
            .and_then(Value::as_str)
            .filter(|u| crate::auth::valid_user_id(u))
        else {
            return self
                .refuse(
                    session,
                    ctx,
                    Refusal::BadRequest(
                        "user_id: 1..=64 printable ASCII characters, no '|'".into(),
                    ),
                )
                .await;
        };
        match shared
            .jwt()
            .issue(uid, shared.cfg.dev.token_ttl_secs, req.now_unix_ms)
        {
            Some((token, exp)) => {
                self.ok(
                    session,
                    ctx,
                    200,
                    &json!({"token": token, "expires_at_ms": exp}),
                )
                .await
            }
            None => {
                self.refuse(session, ctx, Refusal::NotFound("no such route"))
                    .await
            }
        }
    }
}
