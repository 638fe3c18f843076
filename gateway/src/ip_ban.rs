//! IP bans (state of the `ip_ban` filter).
//!
//! Three sources, all checked in memory: the static `bans.deny` CIDRs of the config
//! (reloaded on SIGHUP; `bans.allow` wins over every ban), the shared ban list in Redis
//! (`keys::BANS`, kept current by [`crate::redis`] from `keys::BANS_CHANNEL`), and the
//! auto-ban: an IP whose refusals for abuse (429, 401, bad purchase token) empty a
//! "strike" bucket of `auto_ban_threshold` tokens refilled over `auto_ban_window_secs`
//! is banned locally at once and announced through Redis (HSET + PUBLISH) with a TTL.
//!
//! [`client_ip`] decides who the client is: the TCP peer, or, when the peer is a
//! trusted proxy, the right-most `X-Forwarded-For` address that is not one.

use crate::config::Bucket;
use crate::rate_limit::{ip_key, BucketMap, Take};
use dashmap::DashMap;
use ipnet::IpNet;
use seckill_lua::messages::BanChange;
use std::net::IpAddr;
use std::sync::RwLock;

/// The shared and automatic bans (the static lists live in the policy).
pub struct Bans {
    /// Exact IPs → expiry (unix ms, 0 = never).
    ips: DashMap<IpAddr, u64>,
    /// CIDR bans from Redis → expiry.
    nets: RwLock<Vec<(IpNet, u64)>>,
    strikes: BucketMap,
    /// Auto-bans to announce through Redis.
    announce: tokio::sync::mpsc::Sender<BanChange>,
}

impl Bans {
    pub fn new(announce: tokio::sync::mpsc::Sender<BanChange>) -> Self {
        Self {
            ips: DashMap::new(),
            nets: RwLock::new(Vec::new()),
            strikes: BucketMap::new(100_000),
            announce,
        }
    }

    /// True when a shared or automatic ban covers `ip` at `now_unix_ms`.
    pub fn is_banned(&self, ip: IpAddr, now_unix_ms: u64) -> bool {
        if let Some(exp) = self.ips.get(&ip) {
            if *exp == 0 || *exp > now_unix_ms {
                return true;
            }
        }
        let nets = self.nets.read().unwrap_or_else(|p| p.into_inner());
        nets.iter()
            .any(|(n, exp)| (*exp == 0 || *exp > now_unix_ms) && n.contains(&ip))
    }

    /// Applies one change (from pub/sub, a reload, or our own auto-ban).
    pub fn apply(&self, change: &BanChange) {
        match change {
            BanChange::Ban {
                cidr,
                expires_at_ms,
                ..
            } => {
                let Some(net) = crate::config::parse_cidr(cidr) else {
                    return;
                };
                if net.prefix_len() == net.max_prefix_len() {
                    self.ips.insert(net.addr(), *expires_at_ms);
                } else {
                    let mut nets = self.nets.write().unwrap_or_else(|p| p.into_inner());
                    nets.retain(|(n, _)| *n != net);
                    nets.push((net, *expires_at_ms));
                }
            }
            BanChange::Unban { cidr } => {
                let Some(net) = crate::config::parse_cidr(cidr) else {
                    return;
                };
                if net.prefix_len() == net.max_prefix_len() {
                    self.ips.remove(&net.addr());
                } else {
                    self.nets
                        .write()
                        .unwrap_or_else(|p| p.into_inner())
                        .retain(|(n, _)| *n != net);
                }
            }
        }
    }

    /// Replaces the shared list with a full read of `keys::BANS` (expired ones dropped).
    pub fn replace_all(&self, bans: Vec<(IpNet, u64)>, now_unix_ms: u64) {
        let live = |exp: u64| exp == 0 || exp > now_unix_ms;
        let (ips, nets): (Vec<_>, Vec<_>) = bans
            .into_iter()
            .filter(|(_, e)| live(*e))
            .partition(|(n, _)| n.prefix_len() == n.max_prefix_len());
        // Timed bans stay until they expire (our own fresh auto-bans may not be in
        // Redis yet); permanent ones follow Redis.
        self.ips.retain(|_, exp| *exp != 0 && live(*exp));
        for (n, e) in ips {
            self.ips.insert(n.addr(), e);
        }
        *self.nets.write().unwrap_or_else(|p| p.into_inner()) = nets;
    }

    /// Counts one abusive refusal of `ip`; bans it when the strikes run out.
    /// Returns true when this call banned it.
    pub fn strike(
        &self,
        ip: IpAddr,
        threshold: u32,
        window_secs: u64,
        ttl_secs: u64,
        now_ms: u64,
        now_unix_ms: u64,
    ) -> bool {
        if threshold == 0 {
            return false;
        }
        let bucket = Bucket {
            rate: f64::from(threshold) / window_secs.max(1) as f64,
            burst: f64::from(threshold),
        };
        if self.strikes.take(ip_key(ip), bucket, now_ms) == Take::Allowed {
            return false;
        }
        let change = BanChange::Ban {
            cidr: ip.to_string(),
            expires_at_ms: now_unix_ms + ttl_secs * 1000,
            reason: format!("auto-ban: {threshold} refusals in {window_secs}s"),
        };
        self.apply(&change);
        if self.announce.try_send(change).is_err() {
            tracing::warn!(%ip, "auto-ban queue full; banned locally only");
        }
        true
    }

    pub fn evict_idle(&self, now_ms: u64, now_unix_ms: u64) {
        self.strikes.evict_idle(600_000, now_ms);
        self.ips.retain(|_, exp| *exp == 0 || *exp > now_unix_ms);
    }
}

/// Static lists compiled from the config.
#[derive(Debug, Default)]
pub struct StaticLists {
    pub deny: Vec<IpNet>,
    pub allow: Vec<IpNet>,
    pub trusted: Vec<IpNet>,
}

impl StaticLists {
    pub fn from_config(b: &crate::config::Bans) -> Self {
        let parse = |v: &[String]| {
            v.iter()
                .filter_map(|c| crate::config::parse_cidr(c))
                .collect()
        };
        Self {
            deny: parse(&b.deny),
            allow: parse(&b.allow),
            trusted: parse(&b.trusted_proxies),
        }
    }

    pub fn allowed(&self, ip: IpAddr) -> bool {
        self.allow.iter().any(|n| n.contains(&ip))
    }

    pub fn denied(&self, ip: IpAddr) -> bool {
        self.deny.iter().any(|n| n.contains(&ip))
    }
}

/// The client's address: the peer, or the right-most untrusted `X-Forwarded-For` hop
/// when the peer is a trusted proxy. Garbage in the header falls back to the peer.
pub fn client_ip(peer: IpAddr, xff: Option<&[u8]>, trusted: &[IpNet]) -> IpAddr {
    if trusted.is_empty() || !trusted.iter().any(|n| n.contains(&peer)) {
        return peer;
    }
    let Some(xff) = xff.and_then(|v| std::str::from_utf8(v).ok()) else {
        return peer;
    };
    let mut last_trusted = peer;
    for hop in xff.rsplit(',') {
        let Ok(ip) = hop.trim().parse::<IpAddr>() else {
            return last_trusted;
        };
        if !trusted.iter().any(|n| n.contains(&ip)) {
            return ip;
        }
        last_trusted = ip;
    }
    last_trusted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ip(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    fn bans() -> (Bans, tokio::sync::mpsc::Receiver<BanChange>) {
        let (tx, rx) = tokio::sync::mpsc::channel(16);
        (Bans::new(tx), rx)
    }

    #[test]
    fn shared_bans_cover_ips_and_cidrs_until_they_expire_or_are_lifted() {
        let (b, _rx) = bans();
        b.apply(&BanChange::Ban {
            cidr: "10.0.0.0/8".into(),
            expires_at_ms: 0,
            reason: String::new(),
        });
        b.apply(&BanChange::Ban {
            cidr: "192.0.2.7".into(),
            expires_at_ms: 1000,
            reason: String::new(),
        });
        assert!(b.is_banned(ip("10.9.9.9"), 5));
        assert!(b.is_banned(ip("192.0.2.7"), 999));
        assert!(!b.is_banned(ip("192.0.2.7"), 1000));
        assert!(!b.is_banned(ip("192.0.2.8"), 5));
        b.apply(&BanChange::Unban {
            cidr: "10.0.0.0/8".into(),
        });
        assert!(!b.is_banned(ip("10.9.9.9"), 5));
    }

    #[test]
    fn crossing_the_threshold_bans_and_announces_with_a_ttl() {
        let (b, mut rx) = bans();
        let me = ip("198.51.100.4");
        for _ in 0..3 {
            assert!(!b.strike(me, 3, 10, 60, 0, 1_000));
        }
        assert!(b.strike(me, 3, 10, 60, 0, 1_000));
        assert!(b.is_banned(me, 1_000));
        assert!(!b.is_banned(me, 61_000));
        match rx.try_recv().unwrap() {
            BanChange::Ban {
                cidr,
                expires_at_ms,
                ..
            } => {
                assert_eq!(cidr, "198.51.100.4");
                assert_eq!(expires_at_ms, 61_000);
            }
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn forwarded_for_is_believed_only_from_trusted_proxies() {
        let trusted = vec![crate::config::parse_cidr("10.0.0.0/8").unwrap()];
        let xff = Some(b"203.0.113.9, 10.1.1.1".as_slice());
        assert_eq!(client_ip(ip("10.2.2.2"), xff, &trusted), ip("203.0.113.9"));
        assert_eq!(
            client_ip(ip("198.51.100.1"), xff, &trusted),
            ip("198.51.100.1")
        );
        assert_eq!(client_ip(ip("10.2.2.2"), None, &trusted), ip("10.2.2.2"));
        assert_eq!(
            client_ip(ip("10.2.2.2"), Some(b"junk, 10.1.1.1"), &trusted),
            ip("10.1.1.1")
        );
        // A client cannot smuggle an address left of its own.
        assert_eq!(
            client_ip(ip("10.2.2.2"), Some(b"1.1.1.1, 203.0.113.9"), &trusted),
            ip("203.0.113.9")
        );
    }

    #[test]
    fn the_allow_list_wins_over_the_deny_list() {
        let lists = StaticLists::from_config(&crate::config::Bans {
            deny: vec!["10.0.0.0/8".into()],
            allow: vec!["10.1.0.0/16".into()],
            ..Default::default()
        });
        assert!(lists.denied(ip("10.1.2.3")));
        assert!(lists.allowed(ip("10.1.2.3")));
        assert!(!lists.allowed(ip("10.2.2.3")));
    }
}
