//! The buyer's orders, through `OrderService`: list, one order, pay and cancel (the
//! user from the JWT; orderd checks ownership).

use pingora::prelude::*;
use pingora::proxy::Session;

use serde_json::json;

use crate::forward;
use crate::proxy::{Ctx, Gateway, Req};
use crate::routes::Route;

impl Gateway {
    /// `GET /api/v1/orders`.
    pub(crate) async fn list_orders(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        req: Req<'_>,
    ) -> Result<bool> {
        let user = req.user;
        let clients = self.clients().await?;
        match clients
            .list_orders(user.as_deref().unwrap_or_default())
            .await
        {
            Ok(orders) => {
                let body =
                    json!({"orders": orders.iter().map(forward::order_json).collect::<Vec<_>>()});
                self.ok(session, ctx, 200, &body).await
            }
            Err(st) => self.upstream_failed(session, ctx, clients, &st).await,
        }
    }

    /// `GET /api/v1/orders/{id}`.
    pub(crate) async fn get_order(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        req: Req<'_>,
        id: &str,
    ) -> Result<bool> {
        let user = req.user;
        let clients = self.clients().await?;
        match clients
            .get_order(id, user.as_deref().unwrap_or_default())
            .await
        {
            Ok(o) => self.ok(session, ctx, 200, &forward::order_json(&o)).await,
            Err(st) => self.upstream_failed(session, ctx, clients, &st).await,
        }
    }

    /// `POST /api/v1/orders/{id}/pay` or `/cancel`.
    pub(crate) async fn pay_or_cancel(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        req: Req<'_>,
        id: &str,
    ) -> Result<bool> {
        let (user, route) = (req.user, req.route);
        let clients = self.clients().await?;
        let uid = user.as_deref().unwrap_or_default();
        let r = if matches!(route, Route::Pay(_)) {
            clients.pay(id, uid).await
        } else {
            clients.cancel(id, uid).await
        };
        match r {
            Ok(change) => match forward::change_answer(&change) {
                Ok(v) => self.ok(session, ctx, 200, &v).await,
                Err(r) => self.refuse(session, ctx, r).await,
            },
            Err(st) => self.upstream_failed(session, ctx, clients, &st).await,
        }
    }
}
