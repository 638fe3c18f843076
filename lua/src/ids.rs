//! Reservation ids. The reserve script builds them as
//! `<activity>-<item>-<shard>-<epoch>-<seq>`; the order keeps the same id. Everything
//! needed to find the reservation's shard is in the id, so a release or a status
//! lookup needs no index. The epoch (the shard's fence value) changes on every
//! recompute, so ids stay unique even when Redis lost its sequence counter.

use crate::{ActivityId, ItemId, Shard};
use std::fmt;
use std::str::FromStr;

/// A parsed reservation id.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ReservationId {
    pub activity: ActivityId,
    pub item: ItemId,
    pub shard: Shard,
    /// The shard's fence epoch when the reservation was made (`[0-9a-z]+`).
    pub epoch: String,
    pub seq: u64,
}

impl fmt::Display for ReservationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}-{}-{}-{}-{}",
            self.activity, self.item, self.shard, self.epoch, self.seq
        )
    }
}

/// Why a string is not a reservation id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BadReservationId;

impl fmt::Display for BadReservationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("not a reservation id (expected <activity>-<item>-<shard>-<epoch>-<seq>)")
    }
}

impl std::error::Error for BadReservationId {}

impl FromStr for ReservationId {
    type Err = BadReservationId;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        if s.len() > 96 {
            return Err(BadReservationId);
        }
        let mut parts = s.split('-');
        let mut next = || parts.next().ok_or(BadReservationId);
        let number = |p: &str| -> Result<u64, BadReservationId> {
            if p.is_empty() || !p.bytes().all(|b| b.is_ascii_digit()) {
                return Err(BadReservationId);
            }
            p.parse().map_err(|_| BadReservationId)
        };
        let activity = number(next()?)?;
        let item = number(next()?)?;
        let shard = u32::try_from(number(next()?)?).map_err(|_| BadReservationId)?;
        let epoch = next()?.to_string();
        if epoch.is_empty()
            || !epoch
                .bytes()
                .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase())
        {
            return Err(BadReservationId);
        }
        let seq = number(next()?)?;
        if parts.next().is_some() || shard >= crate::MAX_SHARDS {
            return Err(BadReservationId);
        }
        Ok(Self {
            activity,
            item,
            shard,
            epoch,
            seq,
        })
    }
}

/// A new fence epoch from a unix-ms clock reading: base 36, so it is short and holds
/// no `-` or `|`.
pub fn epoch_from_millis(ms: u64) -> String {
    const DIGITS: &[u8; 36] = b"0123456789abcdefghijklmnopqrstuvwxyz";
    let mut n = ms;
    let mut out = Vec::new();
    loop {
        out.push(DIGITS[(n % 36) as usize]);
        n /= 36;
        if n == 0 {
            break;
        }
    }
    out.reverse();
    String::from_utf8(out).expect("ASCII digits")
}

/// The unix-ms time an epoch was made from ([`epoch_from_millis`]); `None` for text
/// that is not one.
pub fn epoch_millis(epoch: &str) -> Option<u64> {
    if epoch.is_empty()
        || !epoch
            .bytes()
            .all(|b| b.is_ascii_digit() || b.is_ascii_lowercase())
    {
        return None;
    }
    u64::from_str_radix(epoch, 36).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_epoch_reads_back_as_its_time_and_orders_like_it() {
        for ms in [0, 35, 36, 1_700_000_000_000, 1_800_000_000_123] {
            assert_eq!(epoch_millis(&epoch_from_millis(ms)), Some(ms));
        }
        assert_eq!(epoch_millis(""), None);
        assert_eq!(epoch_millis("+1"), None);
        assert_eq!(epoch_millis("AB"), None);
    }

    #[test]
    fn an_id_round_trips_through_its_text() {
        let id = ReservationId {
            activity: 12,
            item: 34,
            shard: 5,
            epoch: epoch_from_millis(1_790_000_000_123),
            seq: 77,
        };
        let text = id.to_string();
        assert_eq!(text.parse::<ReservationId>().unwrap(), id);
    }

    #[test]
    fn malformed_ids_are_refused() {
        for bad in [
            "",
            "1-2-3-abc",
            "1-2-3-abc-4-5",
            "x-2-3-abc-4",
            "1-2-3--4",
            "1-2-3-ABC-4",
            "1-2-3-a|b-4",
            "1-2-9999-abc-4",
            "-1-2-3-abc-4",
            "1-2-3-abc-+4",
        ] {
            assert!(bad.parse::<ReservationId>().is_err(), "{bad:?}");
        }
    }

    #[test]
    fn epochs_are_base36() {
        assert_eq!(epoch_from_millis(0), "0");
        assert_eq!(epoch_from_millis(35), "z");
        assert_eq!(epoch_from_millis(36), "10");
    }
}
