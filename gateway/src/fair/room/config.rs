//! `[room]`: the waiting room's defaults for every activity (each activity's live knobs,
//! set through the admin port, are kept in Redis and win over these), the signing keys
//! of position and admission tokens, and the timings.

use seckill_daemon::config::{ensure, ensure_range, FieldError};
use serde::Deserialize;

/// How an activity's waiting room treats arrivals.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize, Default)]
#[serde(rename_all = "lowercase")]
pub enum Method {
    /// Arrival order; the pre-queue (arrivals before the opening) is shuffled at the
    /// opening.
    Fifo,
    /// Like `fifo`, and later arrivals are shuffled too, in blocks of
    /// `room.random_block` consecutive arrivals.
    Random,
    /// No room: the buy flow needs no admission token. The default.
    #[default]
    Passthrough,
    /// Kill switch: every join and every purchase token is refused (503 `room_closed`).
    Reject,
}

impl Method {
    pub fn name(self) -> &'static str {
        match self {
            Self::Fifo => "fifo",
            Self::Random => "random",
            Self::Passthrough => "passthrough",
            Self::Reject => "reject",
        }
    }

    pub fn parse(s: &str) -> Option<Self> {
        [Self::Fifo, Self::Random, Self::Passthrough, Self::Reject]
            .into_iter()
            .find(|m| m.name() == s)
    }

    /// True when the buy flow needs an admission token.
    pub fn queues(self) -> bool {
        matches!(self, Self::Fifo | Self::Random)
    }
}

/// One signing key of position and admission tokens.
#[derive(Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RoomKey {
    /// Key id written into every token (1..=16 of `A-Za-z0-9_-`), unique.
    pub id: String,
    /// HMAC-SHA256 secret, at least 16 bytes. Never logged.
    pub secret: String,
}

impl std::fmt::Debug for RoomKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RoomKey")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// `[room]`.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RoomConfig {
    /// Method of every activity without a live override: `fifo`, `random`,
    /// `passthrough` (no room) or `reject` (kill switch). Default `passthrough`.
    pub method: Method,
    /// Most buyers active at once per activity, all gateways together: a buyer counts
    /// as active for `session_secs` after admission. Default 1000.
    pub max_active: u64,
    /// New buyers admitted per second per activity, all gateways together (> 0).
    /// Default 50.
    pub admit_per_sec: f64,
    /// How long a place is held after the last heartbeat, seconds (> `heartbeat_secs`).
    /// Default 60.
    pub hold_secs: u64,
    /// Heartbeat interval the page and apps are told to keep, seconds. Default 20.
    pub heartbeat_secs: u64,
    /// Lifetime of an admission token, and how long an admitted buyer counts toward
    /// `max_active`, seconds. Default 300.
    pub session_secs: u64,
    /// How often each gateway runs the activity's admission step in Redis and reads the
    /// watermark, milliseconds (50..=5000). Default 250.
    pub tick_ms: u64,
    /// Block size of the `random` method: arrivals after the opening are shuffled in
    /// blocks of this many (2..=100000). Default 100.
    pub random_block: u64,
    /// Signing keys of position and admission tokens (`[[room.keys]]`); every gateway
    /// of a fleet needs the same set. Several at once is a rotation: tokens signed by
    /// any listed key are accepted. Empty: one key `pt` made from
    /// `auth.purchase_token_secret`. Default empty.
    pub keys: Vec<RoomKey>,
    /// The id of the key that signs new tokens; empty: the first of `keys`.
    /// Default empty.
    pub sign_key: String,
}

impl Default for RoomConfig {
    fn default() -> Self {
        Self {
            method: Method::Passthrough,
            max_active: 1000,
            admit_per_sec: 50.0,
            hold_secs: 60,
            heartbeat_secs: 20,
            session_secs: 300,
            tick_ms: 250,
            random_block: 100,
            keys: Vec::new(),
            sign_key: String::new(),
        }
    }
}

/// A key id: 1..=16 of `A-Za-z0-9_-`.
pub fn valid_key_id(id: &str) -> bool {
    (1..=16).contains(&id.len())
        && id
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-')
}

impl RoomConfig {
    /// The checks of `[room]`, each naming its field.
    pub fn validate(&self) -> Result<(), FieldError> {
        ensure_range(self.max_active, 1..=100_000_000, "room.max_active")?;
        ensure(
            self.admit_per_sec.is_finite()
                && self.admit_per_sec > 0.0
                && self.admit_per_sec <= 1_000_000.0,
            "room.admit_per_sec",
            "must be a number of buyers per second in (0, 1000000]",
        )?;
        ensure_range(self.heartbeat_secs, 1..=3600, "room.heartbeat_secs")?;
        ensure_range(self.hold_secs, 2..=86_400, "room.hold_secs")?;
        ensure(
            self.hold_secs > self.heartbeat_secs,
            "room.hold_secs",
            "must be longer than room.heartbeat_secs",
        )?;
        ensure_range(self.session_secs, 1..=86_400, "room.session_secs")?;
        ensure_range(self.tick_ms, 50..=5000, "room.tick_ms")?;
        ensure_range(self.random_block, 2..=100_000, "room.random_block")?;
        for (i, k) in self.keys.iter().enumerate() {
            ensure(
                valid_key_id(&k.id),
                &format!("room.keys[{i}].id"),
                "1..=16 characters of A-Za-z0-9_-",
            )?;
            ensure(
                k.secret.len() >= 16,
                &format!("room.keys[{i}].secret"),
                "must be at least 16 bytes",
            )?;
            ensure(
                !self.keys[..i].iter().any(|o| o.id == k.id),
                &format!("room.keys[{i}].id"),
                format!("`{}` is listed twice", k.id),
            )?;
        }
        if !self.sign_key.is_empty() {
            ensure(
                self.keys.iter().any(|k| k.id == self.sign_key),
                "room.sign_key",
                "must be the id of one of room.keys",
            )?;
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn field(c: RoomConfig) -> String {
        c.validate().unwrap_err().field
    }

    #[test]
    fn the_defaults_pass_and_each_bad_field_is_named() {
        assert!(RoomConfig::default().validate().is_ok());
        let hold = RoomConfig {
            hold_secs: 20,
            heartbeat_secs: 20,
            ..Default::default()
        };
        assert_eq!(field(hold), "room.hold_secs");
        let rate = RoomConfig {
            admit_per_sec: 0.0,
            ..Default::default()
        };
        assert_eq!(field(rate), "room.admit_per_sec");
        let key = |id: &str, secret: &str| RoomKey {
            id: id.into(),
            secret: secret.into(),
        };
        let bad_id = RoomConfig {
            keys: vec![key("no spaces", "0123456789abcdef")],
            ..Default::default()
        };
        assert_eq!(field(bad_id), "room.keys[0].id");
        let short = RoomConfig {
            keys: vec![key("k1", "0123456789abcdef"), key("k2", "short")],
            ..Default::default()
        };
        assert_eq!(field(short), "room.keys[1].secret");
        let twice = RoomConfig {
            keys: vec![key("k1", "0123456789abcdef"), key("k1", "0123456789abcdef")],
            ..Default::default()
        };
        assert_eq!(field(twice), "room.keys[1].id");
        let unknown = RoomConfig {
            keys: vec![key("k1", "0123456789abcdef")],
            sign_key: "k2".into(),
            ..Default::default()
        };
        assert_eq!(field(unknown), "room.sign_key");
        assert_eq!(Method::parse("random"), Some(Method::Random));
        assert_eq!(Method::parse("lottery"), None);
    }
}
