//! The Redis contract shared by the gateway, stockd and orderd, so that they can never
//! disagree on a key, a shard or a message.
//!
//! Layout:
//! - [`keys`]: every key and channel name of DESIGN.md's Redis contract.
//! - [`shard`]: [`home_shard`] (which shard holds a user's buyer record) and
//!   [`split_stock`] (how a total is spread over shards).
//! - [`scripts`]: the `.lua` files, embedded at build time, with their SHA1 for EVALSHA.
//! - [`calls`]: a typed call per script (the KEYS and ARGV it sends) and its outcome.
//! - [`user`]: [`UserId`] and [`RequestId`], one rule for all three daemons.
//! - [`clock`]: the contract's clock, ms since the Unix epoch.
//! - [`ids`]: the reservation id the reserve script builds, and its parser.
//! - [`messages`]: the stream entry fields and the pub/sub message formats.
#![forbid(unsafe_code)]

pub mod calls;
pub mod clock;
pub mod ids;
pub mod keys;
pub mod messages;
pub mod scripts;
pub mod shard;
pub mod user;

pub use ids::ReservationId;
pub use shard::{home_shard, split_stock};
pub use user::{RequestId, UserId};

/// Activity id (MySQL `activities.id`).
pub type ActivityId = u64;
/// Item id (MySQL `activity_items.id`).
pub type ItemId = u64;
/// Shard number, `0..shard_count`.
pub type Shard = u32;

/// Default number of shards per activity.
pub const DEFAULT_SHARDS: u32 = 8;
/// Largest shard count an activity may have.
pub const MAX_SHARDS: u32 = 1024;
/// Longest user id or request id accepted anywhere (bytes).
pub const MAX_ID_LEN: usize = 64;
