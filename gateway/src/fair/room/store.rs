//! The room's Redis side: three Lua scripts on one slot per activity (hash tag `{a}`).
//!
//! | key | type | meaning |
//! | --- | --- | --- |
//! | `sk:{a}:room` | hash | live knobs (`method`, `max_active`, `admit_per_sec`, `paused`, `random_block`; set by the admin call, else the config's) and state: `next` (tickets issued), `pre` (pre-queue size, once open), `closed` (tickets in closed blocks), `admitted` (the watermark), `tokens`, `last_ms` (the admission bucket), `seed` |
//! | `sk:{a}:room:users` | hash | user → their latest ticket (a rejoin replaces it) |
//! | `sk:{a}:room:blocks` | list | closed `random` blocks, `"first:last"` |
//! | `sk:{a}:room:adm` | sorted set | `"<ms>:<watermark>"` scored by ms: the watermark's history over one session, to count active buyers |
//!
//! - [`JOIN`] (one call per join): freezes the pre-queue if the opening has passed,
//!   `HINCRBY next`, records the user's ticket.
//! - [`TICK`] (each gateway, every `room.tick_ms`, per activity): the admission step:
//!   refill the bucket by `admit_per_sec` × elapsed (Redis `TIME`), cap by
//!   `max_active` − active, move the watermark; returns the state every gateway reads.
//!   Atomic per activity, so N gateways ticking together admit at the configured rate,
//!   not N times it.
//! - `HGET users` (one call per admission): the ticket presented is the user's latest.

use fred::interfaces::LuaInterface;
use fred::prelude::*;
use std::sync::LazyLock;

/// A script and its SHA1, computed once.
pub struct Script {
    body: &'static str,
    sha: String,
}

impl Script {
    fn new(name: &'static str, body: &'static str) -> Self {
        Self {
            body,
            sha: seckill_lua::scripts::Script { name, body }.sha1(),
        }
    }
}

/// Keys of activity `a`'s room (spelled in `seckill_lua::keys`, with every other key).
pub use seckill_lua::keys::{
    room_admissions as admissions, room_blocks as blocks, room_hash, room_users as users,
};

/// KEYS: room hash, users. ARGV: user, start ms, seed candidate, ttl secs.
/// Returns `{ticket, redis now ms, pre (-1 before the opening)}`.
pub static JOIN: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "room_join",
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local h = KEYS[1]
local pre = tonumber(redis.call('HGET', h, 'pre') or '-1')
if pre < 0 and now >= tonumber(ARGV[2]) then
  pre = tonumber(redis.call('HGET', h, 'next') or '0')
  redis.call('HSET', h, 'pre', pre, 'closed', pre)
end
redis.call('HSETNX', h, 'seed', ARGV[3])
local ticket = redis.call('HINCRBY', h, 'next', 1)
redis.call('HSET', KEYS[2], ARGV[1], ticket)
redis.call('EXPIRE', h, ARGV[4])
redis.call('EXPIRE', KEYS[2], ARGV[4])
return {ticket, now, pre}
"#,
    )
});

/// KEYS: room hash, blocks, admissions. ARGV: start ms, default method, default
/// max_active, default admit_per_sec, default random_block, session ms, seed
/// candidate, blocks already read, ttl secs.
/// Returns `{now, admitted, next, pre, closed, method, max_active, admit_per_sec,
/// paused, active, seed, random_block, new blocks...}`.
pub static TICK: LazyLock<Script> = LazyLock::new(|| {
    Script::new(
        "room_tick",
        r#"
local t = redis.call('TIME')
local now = tonumber(t[1]) * 1000 + math.floor(tonumber(t[2]) / 1000)
local h = KEYS[1]
local f = redis.call('HMGET', h, 'method', 'max_active', 'admit_per_sec', 'paused',
  'random_block', 'next', 'pre', 'closed', 'admitted', 'tokens', 'last_ms', 'seed')
local method = f[1] or ARGV[2]
local max_active = tonumber(f[2] or ARGV[3])
local rate = tonumber(f[3] or ARGV[4])
local paused = f[4] == '1'
local block = tonumber(f[5] or ARGV[5])
local nxt = tonumber(f[6] or '0')
local pre = tonumber(f[7] or '-1')
local closed = tonumber(f[8] or '0')
local w = tonumber(f[9] or '0')
local tokens = tonumber(f[10] or '0')
local last = tonumber(f[11] or tostring(now))
local seed = f[12]
if not seed then
  seed = ARGV[7]
  redis.call('HSET', h, 'seed', seed)
end
if pre < 0 and now >= tonumber(ARGV[1]) then
  pre = nxt
  closed = nxt
  redis.call('HSET', h, 'pre', pre)
end
local active = 0
local queues = method == 'fifo' or method == 'random'
if pre >= 0 then
  local edge = now - tonumber(ARGV[6])
  local old = redis.call('ZREVRANGEBYSCORE', KEYS[3], edge, '-inf', 'WITHSCORES', 'LIMIT', 0, 1)
  local w_old = 0
  if old[1] then
    w_old = tonumber(string.match(old[1], ':(%d+)$'))
    redis.call('ZREMRANGEBYSCORE', KEYS[3], '-inf', '(' .. old[2])
  end
  active = w - w_old
  if method == 'random' then
    while nxt - closed >= block do
      redis.call('RPUSH', KEYS[2], (closed + 1) .. ':' .. (closed + block))
      closed = closed + block
    end
    if w >= closed and nxt > closed then
      redis.call('RPUSH', KEYS[2], (closed + 1) .. ':' .. nxt)
      closed = nxt
    end
  else
    closed = nxt
  end
  if queues and not paused then
    local burst = math.max(1, rate)
    tokens = math.min(burst, tokens + rate * math.max(0, now - last) / 1000)
    local n = math.min(math.floor(tokens), max_active - active, closed - w)
    if n > 0 then
      w = w + n
      tokens = tokens - n
      active = active + n
      redis.call('ZADD', KEYS[3], now, now .. ':' .. w)
    end
  else
    tokens = 0
  end
end
redis.call('HSET', h, 'closed', closed, 'admitted', w, 'tokens', tostring(tokens), 'last_ms', now)
for i = 1, 3 do redis.call('EXPIRE', KEYS[i], ARGV[9]) end
local out = {now, w, nxt, pre, closed, method, max_active, tostring(rate),
  paused and 1 or 0, active, seed, block}
local more = redis.call('LRANGE', KEYS[2], tonumber(ARGV[8]), -1)
for i = 1, #more do out[#out + 1] = more[i] end
return out
"#,
    )
});

/// Redis's `NOSCRIPT` answer (the node does not know the SHA).
fn is_noscript(e: &Error) -> bool {
    e.details().starts_with("NOSCRIPT") || e.to_string().contains("NOSCRIPT")
}

/// `EVALSHA` of `script`; on `NOSCRIPT`, `EVAL` of its body.
pub async fn eval<R: FromValue>(
    client: &Client,
    script: &Script,
    keys: Vec<String>,
    args: Vec<String>,
) -> Result<R, Error> {
    match client
        .evalsha::<R, _, _, _>(script.sha.as_str(), keys.clone(), args.clone())
        .await
    {
        // EVAL runs the body and leaves it cached on that node, so the next EVALSHA
        // there finds it.
        Err(e) if is_noscript(&e) => client.eval::<R, _, _, _>(script.body, keys, args).await,
        r => r,
    }
}
