//! The route handlers, one file per family, each an `impl` block of
//! [`crate::proxy::Gateway`]: they run once the [`crate::filters::EDGE`] and
//! [`crate::filters::AUTHENTICATED`] filters have let the request through.
//!
//! - [`activities`]: activity list and one activity, from memory.
//! - [`challenge`]: the proof-of-work puzzle, and its redeem before a purchase token.
//! - [`reserve`]: purchase token and reservation (the [`crate::filters::AFTER_BODY`]
//!   filters, then `StockService.Reserve`).
//! - [`orders`]: list, get, pay, cancel (`OrderService`).
//! - [`payments`]: the provider's signed callback.
//! - [`events`]: an order's states as server-sent events.
//! - [`dev`]: dev-only JWTs.
//! - [`respond`]: the answers they share (refusal, JSON, upstream failure) and the
//!   bounded body read.
//!
//! Each handler takes the [`crate::proxy::Req`] the pipeline built; `proxy.rs` calls
//! the handlers as methods and imports nothing from here.

mod activities;
pub(crate) mod challenge;
mod dev;
mod events;
mod orders;
mod payments;
pub(crate) mod reserve;
pub(crate) mod respond;
