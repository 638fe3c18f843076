//! The IP ban: the allow list, the static deny list, and the bans shared through Redis
//! (automatic and manual), per request ([`IpBan`]) and, with
//! `bans.refuse_at_connection`, per TCP connection ([`ConnectionBan`]). The ban state
//! itself is `crate::ip_ban`.

use super::{Cx, Filter, Flow};
use crate::shared::Shared;

/// The filter: allow list, static deny list, shared and automatic bans.
pub struct IpBan;

impl Filter for IpBan {
    fn name(&self) -> &'static str {
        "ip_ban"
    }

    fn check(&self, cx: &mut Cx<'_>) -> Flow {
        let ip = cx.client_ip;
        let lists = &cx.policy.lists;
        if !lists.allow.is_empty() && lists.allowed(ip) {
            return Flow::Go;
        }
        if lists.denied(ip) || cx.shared.bans.is_banned(ip, cx.now_unix_ms) {
            return Flow::Stop(crate::answer::Refusal::Banned);
        }
        Flow::Go
    }
}

/// With `bans.refuse_at_connection`, banned TCP peers are dropped right after accept,
/// before any HTTP parsing. Peers that are trusted proxies are always accepted (their
/// clients are judged per request).
pub struct ConnectionBan(pub std::sync::Arc<Shared>);

impl std::fmt::Debug for ConnectionBan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ConnectionBan")
    }
}

#[async_trait::async_trait]
impl pingora::listeners::ConnectionFilter for ConnectionBan {
    async fn should_accept(&self, addr: Option<&std::net::SocketAddr>) -> bool {
        let Some(addr) = addr else { return true };
        let policy = self.0.policy();
        if !policy.bans.refuse_at_connection {
            return true;
        }
        let ip = addr.ip();
        let lists = &policy.lists;
        if lists.trusted.iter().any(|n| n.contains(&ip)) || lists.allowed(ip) {
            return true;
        }
        let now = seckill_lua::clock::unix_ms();
        !(lists.denied(ip) || self.0.bans.is_banned(ip, now))
    }
}
