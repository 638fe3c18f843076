//! Stream entry fields and pub/sub messages.

use crate::{ActivityId, ItemId};

/// Field names of an entry in `sk:{a:i}:orders`, written by the reserve script.
pub mod entry {
    /// Reservation id (becomes the order id).
    pub const RESERVATION: &str = "rid";
    /// User id.
    pub const USER: &str = "uid";
    /// Activity id.
    pub const ACTIVITY: &str = "a";
    /// Item id.
    pub const ITEM: &str = "s";
    /// The client's request id.
    pub const REQUEST: &str = "req";
    /// When it was reserved, unix ms.
    pub const TIMESTAMP: &str = "ts";
    /// Units the reservation holds, written only when more than one: an entry
    /// without it is one unit (see [`quantity`](super::quantity)).
    pub const QUANTITY: &str = "q";
    /// The buyer's W3C `traceparent`, when the reserve call carried one (optional;
    /// written last, after the fields above).
    pub const TRACE_PARENT: &str = "tp";
}

/// The units of a stream entry from its `q` field (missing: 1). `None` for a value
/// that is not a whole number >= 1.
pub fn quantity(q: Option<&str>) -> Option<u32> {
    match q {
        None => Some(1),
        Some(v) => v.parse::<u32>().ok().filter(|&k| k >= 1),
    }
}

/// A buyer record `"<rid>|<req>"` (one unit) or `"<rid>|<req>|<k>"`, written by the
/// reserve script and by a rebuild.
pub fn buyer_record(rid: &str, request: &str, units: u32) -> String {
    if units <= 1 {
        format!("{rid}|{request}")
    } else {
        format!("{rid}|{request}|{units}")
    }
}

/// The units a buyer record holds (a record without the third field holds one).
pub fn buyer_record_units(record: &str) -> u32 {
    record
        .splitn(3, '|')
        .nth(2)
        .and_then(|k| k.parse().ok())
        .unwrap_or(1)
}

/// A change of an item's sold-out flag, published on
/// [`SOLD_OUT_CHANNEL`](crate::keys::SOLD_OUT_CHANNEL) as `"<a>:<s>:<1|0>"`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SoldOut {
    pub activity: ActivityId,
    pub item: ItemId,
    /// True: sold out; false: units came back.
    pub sold_out: bool,
}

impl SoldOut {
    pub fn encode(&self) -> String {
        format!(
            "{}:{}:{}",
            self.activity,
            self.item,
            u8::from(self.sold_out)
        )
    }

    pub fn parse(msg: &str) -> Option<Self> {
        let mut it = msg.split(':');
        let activity = it.next()?.parse().ok()?;
        let item = it.next()?.parse().ok()?;
        let sold_out = match it.next()? {
            "1" => true,
            "0" => false,
            _ => return None,
        };
        it.next().is_none().then_some(Self {
            activity,
            item,
            sold_out,
        })
    }
}

/// A change of the shared ban list, published on
/// [`BANS_CHANNEL`](crate::keys::BANS_CHANNEL): `"+<cidr>|<expires ms>|<reason>"` or
/// `"-<cidr>"`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum BanChange {
    Ban {
        cidr: String,
        /// Unix ms; 0 = until unbanned.
        expires_at_ms: u64,
        reason: String,
    },
    Unban {
        cidr: String,
    },
}

impl BanChange {
    pub fn encode(&self) -> String {
        match self {
            Self::Ban {
                cidr,
                expires_at_ms,
                reason,
            } => format!("+{cidr}|{expires_at_ms}|{reason}"),
            Self::Unban { cidr } => format!("-{cidr}"),
        }
    }

    pub fn parse(msg: &str) -> Option<Self> {
        if let Some(rest) = msg.strip_prefix('+') {
            let mut it = rest.splitn(3, '|');
            let cidr = it.next()?.to_string();
            let expires_at_ms = it.next()?.parse().ok()?;
            let reason = it.next().unwrap_or("").to_string();
            Some(Self::Ban {
                cidr,
                expires_at_ms,
                reason,
            })
        } else {
            msg.strip_prefix('-').map(|cidr| Self::Unban {
                cidr: cidr.to_string(),
            })
        }
    }

    /// The value stored in the [`BANS`](crate::keys::BANS) hash for a ban.
    pub fn stored_value(expires_at_ms: u64, reason: &str) -> String {
        format!("{expires_at_ms}|{reason}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sold_out_messages_round_trip_and_garbage_is_ignored() {
        let m = SoldOut {
            activity: 3,
            item: 9,
            sold_out: true,
        };
        assert_eq!(SoldOut::parse(&m.encode()), Some(m));
        for bad in ["", "3:9", "3:9:2", "a:9:1", "3:9:1:0"] {
            assert_eq!(SoldOut::parse(bad), None, "{bad}");
        }
    }

    #[test]
    fn quantities_default_to_one_and_buyer_records_round_trip() {
        assert_eq!(quantity(None), Some(1));
        assert_eq!(quantity(Some("4")), Some(4));
        for bad in ["0", "-1", "x", ""] {
            assert_eq!(quantity(Some(bad)), None, "{bad}");
        }
        assert_eq!(buyer_record("r", "q", 1), "r|q");
        assert_eq!(buyer_record("r", "q", 3), "r|q|3");
        assert_eq!(buyer_record_units("r|q"), 1);
        assert_eq!(buyer_record_units("r|q|3"), 3);
    }

    #[test]
    fn ban_changes_round_trip() {
        for m in [
            BanChange::Ban {
                cidr: "10.0.0.0/8".into(),
                expires_at_ms: 5,
                reason: "abuse|again".into(),
            },
            BanChange::Unban {
                cidr: "1.2.3.4".into(),
            },
        ] {
            assert_eq!(BanChange::parse(&m.encode()), Some(m));
        }
        assert_eq!(BanChange::parse("?x"), None);
    }
}
