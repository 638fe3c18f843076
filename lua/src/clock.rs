//! The one wall clock of the contract: milliseconds since the Unix epoch, as the
//! reserve script, the activity windows (`sk:{a}:meta`), the stream entries and the
//! `int64` time fields of `seckill.v1` carry them.

use std::time::{SystemTime, UNIX_EPOCH};

/// Now, in ms since the Unix epoch (0 for a clock set before 1970).
pub fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| d.as_millis() as u64)
        .unwrap_or(0)
}

/// [`unix_ms`] as the signed type of MySQL and protobuf time fields.
pub fn now_ms() -> i64 {
    unix_ms() as i64
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_clock_is_past_2020_and_both_forms_agree() {
        let (u, i) = (super::unix_ms(), super::now_ms());
        assert!(u > 1_577_836_800_000, "{u}");
        assert!(i as u64 >= u && i as u64 - u < 1000);
    }
}
