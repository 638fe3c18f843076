//! Fair entry at the edge (issue 14): what stands between a logged-in client and a
//! purchase token besides the limits.
//!
//! - [`challenge`]: the stateless proof-of-work puzzle, issued signed and redeemed once
//!   for a purchase token.
//! - [`room`]: the virtual waiting room (signed position tokens, a shuffled pre-queue,
//!   admission at a fleet-wide rate). The purchase-token handler asks the room first,
//!   then the challenge.

pub mod challenge;
pub mod room;
