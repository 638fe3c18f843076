//! `GET /api/v1/orders/{id}/events`: the order's states pushed as server-sent events
//! (`OrderService.WatchOrder`), with a heartbeat every 15 s, until a final state.

use bytes::Bytes;
use pingora::prelude::*;
use pingora::proxy::Session;

use crate::forward::{self, Clients};
use crate::proxy::{Ctx, Gateway, Req};

impl Gateway {
    /// The route: `id`'s events for the authenticated user.
    pub(crate) async fn order_events(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        req: Req<'_>,
        id: &str,
    ) -> Result<bool> {
        let user = req.user;
        let clients = self.clients().await?.clone();
        self.events(
            session,
            ctx,
            &clients,
            id,
            user.as_deref().unwrap_or_default(),
        )
        .await
    }

    /// `GET /api/v1/orders/{id}/events`: the order's states as server-sent events.
    async fn events(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        clients: &Clients,
        id: &str,
        user: &str,
    ) -> Result<bool> {
        let mut stream = match clients.watch(id, user).await {
            Ok(s) => s,
            Err(st) => return self.upstream_failed(session, ctx, clients, &st).await,
        };
        self.open_event_stream(session, ctx).await?;
        loop {
            let next =
                tokio::time::timeout(std::time::Duration::from_secs(15), stream.message()).await;
            match next {
                Err(_) => {
                    // Heartbeat: keeps proxies from closing an idle stream.
                    session
                        .write_response_body(Some(Bytes::from_static(b": keep-alive\n\n")), false)
                        .await?;
                }
                Ok(Ok(Some(order))) => {
                    let data =
                        serde_json::to_string(&forward::order_json(&order)).unwrap_or_default();
                    let done = forward::is_final(order.state);
                    session
                        .write_response_body(
                            Some(Bytes::from(format!("event: order\ndata: {data}\n\n"))),
                            done,
                        )
                        .await?;
                    if done {
                        return Ok(true);
                    }
                }
                Ok(Ok(None)) => break,
                Ok(Err(st)) => {
                    self.shared.metrics.upstream_error("orderd", st.code());
                    break;
                }
            }
        }
        session
            .write_response_body(Some(Bytes::new()), true)
            .await?;
        Ok(true)
    }
}
