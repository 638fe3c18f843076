//! W3C trace context (`traceparent`, <https://www.w3.org/TR/trace-context/>) across
//! the hops of one purchase: the edge accepts or starts one, sends it to stockd as
//! gRPC metadata [`METADATA`], stockd writes it into the reservation's stream entry,
//! and orderd logs its trace id with the order it writes.
//!
//! [`TraceParent::parse`] is the one check every hop runs on what it receives (a
//! header or a stream field is input like any other); what fails it is dropped or
//! replaced, never an error for the buyer. Randomness comes from the caller, so this
//! crate needs none.

/// gRPC metadata key (and HTTP header) carrying the trace context.
pub const METADATA: &str = "traceparent";

/// A valid `traceparent`, always in version `00` form:
/// `00-<32 hex trace id>-<16 hex parent id>-<2 hex flags>` (55 bytes, lower case).
/// Held inline, not on the heap: the edge makes one for every request it answers.
/// Every constructor writes ASCII only (hex digits and dashes).
#[derive(Clone, PartialEq, Eq)]
pub struct TraceParent([u8; LEN]);

/// The length of a version-`00` trace context.
const LEN: usize = 55;

fn lower_hex(s: &str) -> bool {
    s.bytes()
        .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
}

fn not_zero(s: &str) -> bool {
    s.bytes().any(|b| b != b'0')
}

/// `00-<trace>-<span>-<flags>`: `trace` writes the 32 hex digits of the trace id.
fn assemble(trace: impl FnOnce(&mut [u8]), span: [u8; 8], flags: &[u8]) -> TraceParent {
    let mut b = *b"00-00000000000000000000000000000000-0000000000000000-00";
    trace(&mut b[3..35]);
    // The slices are exactly twice the bytes' lengths: the encodings cannot fail.
    let _ = hex::encode_to_slice(TraceParent::nonzero_span(span), &mut b[36..52]);
    b[53..55].copy_from_slice(flags);
    TraceParent(b)
}

impl TraceParent {
    /// `s` when it is a valid trace context. Version `00` must be exactly 55 bytes; a
    /// later version (`01`..`fe`) is read by its version-00 prefix (the spec's forward
    /// compatibility) and re-emitted as `00`. Version `ff`, upper-case hex and an
    /// all-zero trace or parent id are invalid.
    pub fn parse(s: &str) -> Option<Self> {
        let s = s.trim_matches(|c| c == ' ' || c == '\t');
        if !s.is_ascii() {
            return None;
        }
        let version = s.get(0..2)?;
        if !lower_hex(version) || version == "ff" {
            return None;
        }
        if version == "00" && s.len() != 55 {
            return None;
        }
        if s.len() < 55 || (s.len() > 55 && s.as_bytes()[55] != b'-') {
            return None;
        }
        let b = s.as_bytes();
        if b[2] != b'-' || b[35] != b'-' || b[52] != b'-' {
            return None;
        }
        let (trace, parent, flags) = (&s[3..35], &s[36..52], &s[53..55]);
        if !(lower_hex(trace) && lower_hex(parent) && lower_hex(flags)) {
            return None;
        }
        if !not_zero(trace) || !not_zero(parent) {
            return None;
        }
        // The version-00 prefix, checked above: lower-case hex and dashes only.
        let mut out = [0; LEN];
        out.copy_from_slice(&b[..LEN]);
        out[..2].copy_from_slice(b"00");
        Some(Self(out))
    }

    /// A new trace: `trace` and `span` random bytes from the caller (an all-zero
    /// draw, which the spec forbids, is nudged to 1). Flags `01` (sampled): the
    /// ids are meant to be followed.
    pub fn start(mut trace: [u8; 16], span: [u8; 8]) -> Self {
        if trace.iter().all(|&b| b == 0) {
            trace[15] = 1;
        }
        assemble(
            |out| {
                let _ = hex::encode_to_slice(trace, out);
            },
            span,
            b"01",
        )
    }

    /// The same trace with this hop's own span id as the parent (what a hop that
    /// forwards a request sends on).
    pub fn child(&self, span: [u8; 8]) -> Self {
        assemble(
            |out| out.copy_from_slice(&self.0[3..35]),
            span,
            &self.0[53..55],
        )
    }

    /// `span`, an all-zero draw (which the spec forbids) nudged to 1.
    fn nonzero_span(mut span: [u8; 8]) -> [u8; 8] {
        if span.iter().all(|&b| b == 0) {
            span[7] = 1;
        }
        span
    }

    /// The 32 hex digits naming the whole trace (what the logs and answers show).
    pub fn trace_id(&self) -> &str {
        &self.as_str()[3..35]
    }

    /// The 16 hex digits of the parent span.
    pub fn parent_id(&self) -> &str {
        &self.as_str()[36..52]
    }

    /// The header value.
    pub fn as_str(&self) -> &str {
        // ASCII by construction (see the type), so this never falls back.
        std::str::from_utf8(&self.0).unwrap_or_default()
    }
}

impl std::fmt::Display for TraceParent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::fmt::Debug for TraceParent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_tuple("TraceParent").field(&self.as_str()).finish()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GOOD: &str = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01";

    #[test]
    fn the_spec_example_parses_and_names_its_ids() {
        let t = TraceParent::parse(GOOD).unwrap();
        assert_eq!(t.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(t.parent_id(), "00f067aa0ba902b7");
        assert_eq!(t.as_str(), GOOD);
    }

    #[test]
    fn malformed_trace_contexts_are_refused() {
        let bad = [
            "",
            "garbage",
            &GOOD[..54],
            &format!("{GOOD}-extra"),
            &GOOD.replace("4bf9", "4BF9"),
            "00-00000000000000000000000000000000-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-0000000000000000-01",
            &GOOD.replacen("00", "ff", 1),
            &GOOD.replace('-', "_"),
            "00-4bf92f3577b34da6a3ce929d0e0e473g-00f067aa0ba902b7-01",
            "0x-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01",
            "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01é",
            "00-4bf92f3577b34da6a3ce929d0e0é4736-00f067aa0ba902b7-0",
        ];
        for s in bad {
            assert_eq!(TraceParent::parse(s), None, "{s:?}");
        }
    }

    #[test]
    fn a_later_version_is_read_by_its_prefix_and_sent_on_as_version_00() {
        let later = GOOD.replacen("00", "01", 1) + "-what-comes-next";
        assert_eq!(TraceParent::parse(&later).unwrap().as_str(), GOOD);
        assert_eq!(
            TraceParent::parse(&(GOOD.replacen("00", "01", 1) + "x")),
            None
        );
    }

    #[test]
    fn a_new_trace_and_a_child_are_valid_and_the_child_keeps_the_trace() {
        let t = TraceParent::start([0xab; 16], [0; 8]);
        assert_eq!(TraceParent::parse(t.as_str()), Some(t.clone()));
        assert_eq!(t.trace_id(), "ab".repeat(16));
        let zero = TraceParent::start([0; 16], [0; 8]);
        assert!(TraceParent::parse(zero.as_str()).is_some(), "{zero}");
        let c = TraceParent::parse(GOOD).unwrap().child([7; 8]);
        assert_eq!(c.trace_id(), "4bf92f3577b34da6a3ce929d0e0e4736");
        assert_eq!(c.parent_id(), "0707070707070707");
        assert!(c.as_str().ends_with("-01"));
        let unsampled = TraceParent::parse(&GOOD.replace("-01", "-00")).unwrap();
        assert!(unsampled
            .child([7; 8])
            .as_str()
            .ends_with("-0707070707070707-00"));
        assert_eq!(format!("{c:?}"), format!("TraceParent({:?})", c.as_str()));
    }
}
