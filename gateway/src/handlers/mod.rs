//! The route handlers, one file per family, each an `impl` block of
//! [`crate::proxy::Gateway`]: they run once the [`crate::filters::EDGE`] and
//! [`crate::filters::AUTHENTICATED`] filters have let the request through.
//!
//! - [`activities`]: activity list and one activity, from memory.
//! - [`reserve`]: purchase token and reservation (the [`crate::filters::AFTER_BODY`]
//!   filters, then `StockService.Reserve`).
//! - [`orders`]: list, get, pay, cancel (`OrderService`).
//! - [`payments`]: the provider's signed callback.
//! - [`events`]: an order's states as server-sent events.
//! - [`dev`]: dev-only JWTs.

mod activities;
mod dev;
mod events;
mod orders;
mod payments;
mod reserve;

use std::sync::Arc;

use crate::routes::Route;
use crate::shared::Compiled;
use crate::sold_out::ItemLive;

/// What the pipeline learnt of a request before its handler runs.
pub(crate) struct Req<'a> {
    /// The policy the request started with (a SIGHUP mid-request does not change it).
    pub policy: &'a Compiled,
    pub route: &'a Route,
    /// The authenticated user, on routes that need one.
    pub user: Option<String>,
    /// The item [`crate::filters::Window`] found (token and reserve).
    pub item: Option<Arc<ItemLive>>,
    /// Gateway monotonic ms and wall-clock ms at the start of the request.
    pub now_ms: u64,
    pub now_unix_ms: u64,
}
