//! The proof-of-work challenge before a purchase token (issue 14, item 1): state and
//! the two operations the handlers call.
//!
//! - Issue (`POST .../items/{s}/challenge`): a signed puzzle ([`puzzle`]) binding
//!   activity, item, user, expiry, difficulty, sub-puzzle count and a random nonce.
//!   No Redis write, no state: one HMAC and one random draw.
//! - Redeem (the body of `POST .../items/{s}/token` when the activity's challenge is
//!   on): the MAC (constant time), user, item, expiry, every sub-solution, then ONE
//!   Redis command, `SET sk:pow:<digest> 1 NX PX <until expiry + slack>` on the
//!   cluster: whichever gateway sets it first wins, every other redeem of the same
//!   puzzle (same or another gateway, concurrent or later) is `challenge_replayed`.
//!   No read-then-write. Redis down: 503, never a token without the single-use check.
//! - Difficulty ([`Challenges::bits_for`]): the activity's `challenge_bits` (or
//!   `challenge.bits_override`), raised by [`pressure`] (failed redeems from the
//!   client's IP, and a per-activity hook the waiting room may feed), never above
//!   `challenge.max_bits` (nor below the activity's own setting).
//!
//! Parts: [`puzzle`] (format, MAC, work check), [`pressure`] (the raises).

pub mod pressure;
pub mod puzzle;

use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use fred::prelude::*;
use fred::types::{Expiration, SetOptions};
use prometheus::{Histogram, HistogramOpts, IntCounterVec, Opts, Registry};
use serde_json::Value;

use crate::config;
pub use pressure::Pressure;
pub use puzzle::{Keyring, Rejection, Spec, Verified};

/// Extra life of a spent-puzzle key past the puzzle's expiry: gateways' clocks may
/// disagree by this much and still never accept a puzzle whose key has gone.
pub const SPENT_SLACK_MS: u64 = 30_000;

/// The compiled `[challenge]` section (swapped on SIGHUP).
pub struct Settings {
    pub cfg: config::Challenge,
    pub keys: Keyring,
    /// True when `challenge.keys` is empty and a random key was made at start: puzzles
    /// verify only on this gateway.
    pub ephemeral: bool,
}

/// What the handlers share.
pub struct Challenges {
    settings: RwLock<Arc<Settings>>,
    pub pressure: Pressure,
    redis_cfg: config::Redis,
    redis: tokio::sync::OnceCell<Client>,
    pub metrics: ChallengeMetrics,
}

/// The challenge's own series (its refusals also count in `gateway_decisions_total`
/// as outcome `challenge_failed`; these say which refusal, and how hard and how long).
pub struct ChallengeMetrics {
    /// Puzzles issued, by difficulty (bounded: 1..=24 bits).
    pub issued: IntCounterVec,
    /// `issued`'s series for 0..=32 bits, looked up once each (an issue is a hot path).
    issued_at: [std::sync::OnceLock<prometheus::IntCounter>; 33],
    /// Redeems by result: `ok`, each refusal code without its `challenge_` prefix,
    /// `unavailable` (the single-use check could not be made).
    pub redeems: IntCounterVec,
    /// From issue to a redeem that passed every check but the single-use one: how long
    /// buyers take to solve at the live difficulty (the figure to tune `bits` by).
    pub solve_seconds: Histogram,
}

impl ChallengeMetrics {
    fn new(registry: &Registry) -> Self {
        let issued = IntCounterVec::new(
            Opts::new(
                "gateway_challenge_issued_total",
                "Proof-of-work puzzles issued, by difficulty (leading zero bits per sub-puzzle)",
            ),
            &["bits"],
        )
        .expect("metric");
        let redeems = IntCounterVec::new(
            Opts::new(
                "gateway_challenge_redeems_total",
                "Puzzle redeems on the token route, by result (ok, a refusal, unavailable)",
            ),
            &["result"],
        )
        .expect("metric");
        let solve_seconds = Histogram::with_opts(
            HistogramOpts::new(
                "gateway_challenge_solve_seconds",
                "Time from a puzzle's issue to its redeem with a valid solution",
            )
            .buckets(vec![0.1, 0.25, 0.5, 1.0, 2.0, 3.0, 5.0, 10.0, 20.0, 60.0]),
        )
        .expect("metric");
        for c in [
            Box::new(issued.clone()) as Box<dyn prometheus::core::Collector>,
            Box::new(redeems.clone()),
            Box::new(solve_seconds.clone()),
        ] {
            registry
                .register(c)
                .expect("challenge metric registered once");
        }
        Self {
            issued,
            issued_at: std::array::from_fn(|_| std::sync::OnceLock::new()),
            redeems,
            solve_seconds,
        }
    }

    fn issued(&self, bits: u32) {
        const LABELS: [&str; 33] = [
            "0", "1", "2", "3", "4", "5", "6", "7", "8", "9", "10", "11", "12", "13", "14", "15",
            "16", "17", "18", "19", "20", "21", "22", "23", "24", "25", "26", "27", "28", "29",
            "30", "31", "32",
        ];
        match (LABELS.get(bits as usize), self.issued_at.get(bits as usize)) {
            (Some(label), Some(c)) => c
                .get_or_init(|| self.issued.with_label_values(&[label]))
                .inc(),
            _ => self.issued.with_label_values(&["other"]).inc(),
        }
    }

    fn redeemed(&self, r: &Result<(), Redeem>) {
        let result = match r {
            Ok(()) => "ok",
            Err(Redeem::Unavailable) => "unavailable",
            Err(Redeem::Rejected(rej)) => rej.code().trim_start_matches("challenge_"),
        };
        self.redeems.with_label_values(&[result]).inc();
    }
}

/// A puzzle as issued.
pub struct Issued {
    pub puzzle: String,
    pub nonce: [u8; puzzle::NONCE_LEN],
    pub bits: u32,
    pub count: u32,
    pub exp_ms: u64,
}

/// The answer to a challenge request for an activity that asks none.
pub const NOT_REQUIRED: &[u8] = br#"{"required":false}"#;

impl Issued {
    /// The JSON answer carrying this puzzle.
    pub fn answer(&self) -> Vec<u8> {
        let mut out = Vec::with_capacity(192 + self.puzzle.len());
        write_answer(
            &mut out,
            self.bits,
            self.count,
            self.exp_ms,
            &self.nonce,
            |out| out.extend_from_slice(self.puzzle.as_bytes()),
        );
        out
    }
}

/// Appends the JSON answer carrying a puzzle, written by `puzzle` in its place: fields
/// in name order, as serde writes a map, byte for byte (a test holds the two equal).
/// The puzzle's characters need no escaping (digits, base64url, dots and a key id of
/// `[A-Za-z0-9_-]`).
fn write_answer(
    out: &mut Vec<u8>,
    bits: u32,
    count: u32,
    exp_ms: u64,
    nonce: &[u8; puzzle::NONCE_LEN],
    puzzle: impl FnOnce(&mut Vec<u8>),
) {
    use crate::answer::push_decimal;
    out.extend_from_slice(br#"{"algorithm":"sha256-leading-zero-bits","bits":"#);
    push_decimal(out, u64::from(bits));
    out.extend_from_slice(br#","challenge":""#);
    puzzle(out);
    out.extend_from_slice(br#"","count":"#);
    push_decimal(out, u64::from(count));
    out.extend_from_slice(br#","expected_hashes":"#);
    push_decimal(out, u64::from(count) << bits);
    out.extend_from_slice(br#","expires_at_ms":"#);
    push_decimal(out, exp_ms);
    out.extend_from_slice(br#","required":true,"seed":""#);
    let at = out.len();
    out.resize(at + 2 * puzzle::NONCE_LEN, 0);
    // The slice is exactly twice the nonce's length.
    let _ = hex::encode_to_slice(nonce, &mut out[at..]);
    out.extend_from_slice(br#""}"#);
}

/// Why a redeem did not give a token.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Redeem {
    Rejected(Rejection),
    /// The single-use check could not be made (Redis unreachable).
    Unavailable,
}

impl Settings {
    /// Reads the key files; with no key, the process's random key (one gateway only;
    /// the same across reloads, so a reload never voids open puzzles).
    pub fn new(cfg: &config::Challenge) -> anyhow::Result<Self> {
        let mut keys = Vec::with_capacity(cfg.keys.len());
        for (i, k) in cfg.keys.iter().enumerate() {
            let secret = k
                .secret_bytes()
                .map_err(|e| anyhow::anyhow!("challenge.keys[{i}]: {e}"))?;
            keys.push(puzzle::Key::new(&k.id, &secret));
        }
        let ephemeral = keys.is_empty();
        if ephemeral {
            keys.push(puzzle::Key::new("local", &process_secret()));
        }
        Ok(Self {
            cfg: cfg.clone(),
            keys: Keyring::new(keys),
            ephemeral,
        })
    }
}

/// One random secret per process, for a gateway without `challenge.keys`.
fn process_secret() -> [u8; 32] {
    static SECRET: std::sync::OnceLock<[u8; 32]> = std::sync::OnceLock::new();
    *SECRET.get_or_init(rand::random)
}

impl Challenges {
    pub fn new(
        cfg: &config::Challenge,
        redis: &config::Redis,
        registry: &Registry,
    ) -> anyhow::Result<Self> {
        let settings = Settings::new(cfg)?;
        if settings.ephemeral {
            tracing::warn!(
                "challenge.keys is empty: puzzles are signed with a random key of this \
                 process and verify only here; a fleet must share challenge.keys"
            );
        }
        Ok(Self {
            settings: RwLock::new(Arc::new(settings)),
            pressure: Pressure::default(),
            redis_cfg: redis.clone(),
            redis: tokio::sync::OnceCell::new(),
            metrics: ChallengeMetrics::new(registry),
        })
    }

    pub fn settings(&self) -> Arc<Settings> {
        self.settings
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// SIGHUP: new keys and knobs; a bad key file keeps the running set.
    pub fn reload(&self, cfg: &config::Challenge) {
        match Settings::new(cfg) {
            Ok(s) => {
                let keys = s.keys.len();
                *self.settings.write().unwrap_or_else(|p| p.into_inner()) = Arc::new(s);
                tracing::info!(keys, "reloaded the challenge settings");
            }
            Err(e) => {
                tracing::error!(error = %e, "challenge keys not reloaded; keeping the running set")
            }
        }
    }

    /// The difficulty (leading zero bits per sub-puzzle) for a client of activity
    /// `a`, whose own setting is `activity_bits` (`None`: its meta predates the field);
    /// 0 = no challenge.
    pub fn bits_for(&self, a: u64, activity_bits: Option<u32>, ip: IpAddr, now_ms: u64) -> u32 {
        self.bits_in(&self.settings(), a, activity_bits, ip, now_ms)
    }

    fn bits_in(
        &self,
        st: &Settings,
        a: u64,
        activity_bits: Option<u32>,
        ip: IpAddr,
        now_ms: u64,
    ) -> u32 {
        let c = &st.cfg;
        if !c.enabled {
            return 0;
        }
        let base = c
            .bits_override
            .unwrap_or(activity_bits.unwrap_or(c.default_bits));
        if base == 0 {
            return 0;
        }
        let extra = self.pressure.extra_bits(a, ip, now_ms, c);
        (base + extra).min(c.max_bits.max(base))
    }

    /// What a puzzle for `(user, a, s)` at `bits` binds, with a fresh random nonce.
    fn spec<'u>(
        st: &Settings,
        user: &'u str,
        (a, s): (u64, u64),
        bits: u32,
        now_unix_ms: u64,
    ) -> (Spec<'u>, [u8; puzzle::NONCE_LEN]) {
        let spec = Spec {
            activity: a,
            item: s,
            user,
            exp_ms: now_unix_ms + st.cfg.ttl_secs * 1000,
            bits,
            count: st.cfg.sub_puzzles,
        };
        (spec, rand::random())
    }

    /// A signed puzzle for `(user, a, s)` at difficulty `bits` (> 0).
    pub fn issue(&self, user: &str, a: u64, s: u64, bits: u32, now_unix_ms: u64) -> Issued {
        let st = self.settings();
        let (spec, nonce) = Self::spec(&st, user, (a, s), bits, now_unix_ms);
        self.metrics.issued(bits);
        Issued {
            puzzle: st.keys.issue(&spec, &nonce),
            nonce,
            bits,
            count: spec.count,
            exp_ms: spec.exp_ms,
        }
    }

    /// Appends the body of the answer to a challenge request to `out`:
    /// [`NOT_REQUIRED`] when the difficulty for `(a, ip)` is 0 (see [`Self::bits_for`]),
    /// else [`Issued::answer`] of a new puzzle for `(user, a, s)`, signed where it lies
    /// in `out`. One read of the settings, no buffer of its own: the issue is what a
    /// flood of challenge requests costs.
    pub fn answer_into(
        &self,
        user: &str,
        (a, s): (u64, u64),
        (activity_bits, ip): (Option<u32>, IpAddr),
        (now_ms, now_unix_ms): (u64, u64),
        out: &mut Vec<u8>,
    ) {
        let st = self.settings();
        let bits = self.bits_in(&st, a, activity_bits, ip, now_ms);
        if bits == 0 {
            out.extend_from_slice(NOT_REQUIRED);
            return;
        }
        let (spec, nonce) = Self::spec(&st, user, (a, s), bits, now_unix_ms);
        self.metrics.issued(bits);
        write_answer(out, bits, spec.count, spec.exp_ms, &nonce, |out| {
            st.keys.issue_into(&spec, &nonce, out)
        });
    }

    /// Checks a redeem body (`{"challenge": "...", "solutions": [c0, c1, ...]}`) and
    /// spends the puzzle. A refusal an honest client does not make raises the IP's
    /// difficulty.
    #[allow(clippy::too_many_arguments)]
    pub async fn redeem(
        &self,
        body: Option<&Value>,
        user: &str,
        a: u64,
        s: u64,
        ip: IpAddr,
        now_ms: u64,
        now_unix_ms: u64,
    ) -> Result<(), Redeem> {
        let r = async {
            let r = self.check(body, user, a, s, now_unix_ms);
            let v = match r {
                Ok(v) => v,
                Err(rej) => {
                    if rej.is_abuse() {
                        let st = self.settings();
                        self.pressure.failed(ip, now_ms, &st.cfg);
                    }
                    return Err(Redeem::Rejected(rej));
                }
            };
            let issued_at = v.exp_ms.saturating_sub(self.settings().cfg.ttl_secs * 1000);
            self.metrics
                .solve_seconds
                .observe(now_unix_ms.saturating_sub(issued_at) as f64 / 1000.0);
            let px = v.exp_ms.saturating_sub(now_unix_ms) + SPENT_SLACK_MS;
            match self.spend(&v.digest, px).await {
                Ok(true) => Ok(()),
                Ok(false) => Err(Redeem::Rejected(Rejection::Replayed)),
                Err(e) => {
                    tracing::warn!(error = %e, "challenge single-use check failed");
                    Err(Redeem::Unavailable)
                }
            }
        }
        .await;
        self.metrics.redeemed(&r);
        r
    }

    /// Everything but the single-use check.
    pub fn check(
        &self,
        body: Option<&Value>,
        user: &str,
        a: u64,
        s: u64,
        now_unix_ms: u64,
    ) -> Result<Verified, Rejection> {
        let body = body.ok_or(Rejection::Required)?;
        let p = match body.get("challenge") {
            None | Some(Value::Null) => return Err(Rejection::Required),
            Some(Value::String(p)) => p,
            Some(_) => return Err(Rejection::Malformed),
        };
        let solutions = match body.get("solutions") {
            Some(Value::Array(xs)) if xs.len() <= puzzle::MAX_COUNT as usize => xs
                .iter()
                .map(Value::as_u64)
                .collect::<Option<Vec<u64>>>()
                .ok_or(Rejection::Malformed)?,
            _ => return Err(Rejection::Malformed),
        };
        let st = self.settings();
        let v = st.keys.verify(p, user, a, s, now_unix_ms)?;
        puzzle::check_solutions(&v, &solutions)?;
        Ok(v)
    }

    /// `SET sk:pow:<digest> 1 NX PX px`: true when this call set it.
    async fn spend(&self, digest: &str, px: u64) -> Result<bool, Error> {
        let c = self.client().await?;
        let set: Option<String> = c
            .set(
                seckill_lua::keys::pow_spent(digest),
                1,
                Some(Expiration::PX(px as i64)),
                Some(SetOptions::NX),
                false,
            )
            .await?;
        Ok(set.is_some())
    }

    /// The cluster client, connected on first use (a failed connect is retried by the
    /// next redeem).
    async fn client(&self) -> Result<&Client, Error> {
        let timeout = Duration::from_millis(self.redis_cfg.timeout_ms);
        self.redis
            .get_or_try_init(|| async {
                let c = crate::redis::client(&self.redis_cfg)?;
                match tokio::time::timeout(timeout, c.init()).await {
                    Ok(Ok(_task)) => Ok(c),
                    Ok(Err(e)) => Err(e),
                    Err(_) => {
                        let _ = c.quit().await;
                        Err(Error::new(ErrorKind::Timeout, "connecting to Redis"))
                    }
                }
            })
            .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn challenges(extra: &str) -> Challenges {
        let text = format!(
            "{}[challenge]\nkeys = [{{ id = \"k1\", secret = \"0123456789abcdef\" }}]\n{extra}",
            crate::config::MINIMAL
        );
        let cfg: crate::config::Config = seckill_daemon::config::load_str(
            &text,
            "test.toml",
            crate::config::ENV_PREFIX,
            Vec::new(),
        )
        .expect("test config");
        Challenges::new(&cfg.challenge, &cfg.redis, &Registry::new()).unwrap()
    }

    const IP: IpAddr = IpAddr::V4(std::net::Ipv4Addr::new(198, 51, 100, 1));

    #[test]
    fn an_issued_puzzle_solved_passes_every_check_but_the_single_use_one() {
        let c = challenges("sub_puzzles = 8\n");
        let is = c.issue("alice", 1, 2, 3, 1_000);
        assert_eq!((is.bits, is.count), (3, 8));
        let sol = puzzle::solve(&is.nonce, is.bits, is.count);
        let body = serde_json::json!({"challenge": is.puzzle, "solutions": sol});
        assert!(c.check(Some(&body), "alice", 1, 2, 2_000).is_ok());
        assert_eq!(
            c.check(Some(&body), "alice", 1, 2, is.exp_ms),
            Err(Rejection::Expired)
        );
        assert_eq!(
            c.check(None, "alice", 1, 2, 2_000),
            Err(Rejection::Required)
        );
        let missing = serde_json::json!({"solutions": sol});
        assert_eq!(
            c.check(Some(&missing), "alice", 1, 2, 2_000),
            Err(Rejection::Required)
        );
        for bad in [
            serde_json::json!({"challenge": is.puzzle}),
            serde_json::json!({"challenge": is.puzzle, "solutions": "1,2"}),
            serde_json::json!({"challenge": is.puzzle, "solutions": [-1, 2]}),
            serde_json::json!({"challenge": 5, "solutions": sol}),
        ] {
            assert_eq!(
                c.check(Some(&bad), "alice", 1, 2, 2_000),
                Err(Rejection::Malformed),
                "{bad}"
            );
        }
    }

    /// The answer as serde writes it: the reference of the hand-written form.
    #[derive(serde::Serialize)]
    struct Answer<'a> {
        algorithm: &'static str,
        bits: u32,
        challenge: &'a str,
        count: u32,
        expected_hashes: u64,
        expires_at_ms: u64,
        required: bool,
        seed: &'a str,
    }

    fn serde_answer(bits: u32, challenge: &str, count: u32, exp_ms: u64, seed: &str) -> String {
        serde_json::to_string(&Answer {
            algorithm: "sha256-leading-zero-bits",
            bits,
            challenge,
            count,
            expected_hashes: u64::from(count) << bits,
            expires_at_ms: exp_ms,
            required: true,
            seed,
        })
        .unwrap()
    }

    #[test]
    fn the_answer_is_serdes_form_byte_for_byte_and_signed_in_place() {
        let c = challenges("sub_puzzles = 8\n");
        let is = c.issue("alice", 1, 2, 3, 1_000);
        let seed = hex::encode(is.nonce);
        assert_eq!(
            String::from_utf8(is.answer()).unwrap(),
            serde_answer(3, &is.puzzle, 8, is.exp_ms, &seed)
        );

        // Appended after an earlier answer, a puzzle that verifies for its user.
        let mut out = b"earlier".to_vec();
        c.answer_into("alice", (1, 2), (Some(3), IP), (0, 1_000), &mut out);
        assert_eq!(out[..7], *b"earlier");
        let body = std::str::from_utf8(&out[7..]).unwrap();
        let v: Value = serde_json::from_str(body).unwrap();
        let puzzle = v["challenge"].as_str().unwrap();
        let verified = c
            .settings()
            .keys
            .verify(puzzle, "alice", 1, 2, 1_500)
            .unwrap();
        assert_eq!(
            (verified.bits, verified.count, verified.exp_ms),
            (3, 8, is.exp_ms)
        );
        let seed = hex::encode(verified.nonce);
        assert_eq!(body, serde_answer(3, puzzle, 8, is.exp_ms, &seed));
        // A fresh nonce each time.
        let mut again = Vec::new();
        c.answer_into("alice", (1, 2), (Some(3), IP), (0, 1_000), &mut again);
        assert_ne!(again, out[7..]);

        // An activity that asks no challenge.
        let mut out = Vec::new();
        c.answer_into("alice", (1, 2), (Some(0), IP), (0, 1_000), &mut out);
        assert_eq!(out, NOT_REQUIRED);
    }

    #[test]
    fn the_difficulty_follows_the_activity_the_override_and_the_cap() {
        let c = challenges("max_bits = 12\nraise_after_failures = 2\n");
        assert_eq!(c.bits_for(1, Some(0), IP, 0), 0);
        assert_eq!(c.bits_for(1, None, IP, 0), 0);
        assert_eq!(c.bits_for(1, Some(10), IP, 0), 10);
        // Above the cap, the activity's own setting still holds (never lowered).
        assert_eq!(c.bits_for(1, Some(14), IP, 0), 14);
        // Failures from one IP raise its difficulty, up to the cap.
        let st = c.settings();
        for _ in 0..20 {
            c.pressure.failed(IP, 0, &st.cfg);
        }
        assert_eq!(c.bits_for(1, Some(10), IP, 0), 12);
        let other = IpAddr::V4(std::net::Ipv4Addr::new(198, 51, 100, 2));
        assert_eq!(c.bits_for(1, Some(10), other, 0), 10);
        // The hook (waiting room pressure) raises one activity, bounded likewise.
        c.pressure.set_activity_extra(2, 1);
        assert_eq!(c.bits_for(2, Some(10), other, 0), 11);
        assert_eq!(c.bits_for(3, Some(10), other, 0), 10);
        let off = challenges("enabled = false\n");
        assert_eq!(off.bits_for(1, Some(10), IP, 0), 0);
        let forced = challenges("bits_override = 6\n");
        assert_eq!(forced.bits_for(1, Some(0), IP, 0), 6);
    }

    #[test]
    fn without_keys_a_process_key_signs_and_survives_a_reload() {
        let text = crate::config::MINIMAL;
        let cfg: crate::config::Config = seckill_daemon::config::load_str(
            text,
            "test.toml",
            crate::config::ENV_PREFIX,
            Vec::new(),
        )
        .unwrap();
        let c = Challenges::new(&cfg.challenge, &cfg.redis, &Registry::new()).unwrap();
        assert!(c.settings().ephemeral);
        let is = c.issue("alice", 1, 2, 1, 1_000);
        c.reload(&cfg.challenge);
        let sol = puzzle::solve(&is.nonce, is.bits, is.count);
        let body = serde_json::json!({"challenge": is.puzzle, "solutions": sol});
        assert!(c.check(Some(&body), "alice", 1, 2, 2_000).is_ok());
    }
}
