//! The checks every load (and `gateway -t`) runs beyond the types: ranges, relations
//! between fields, addresses, URLs, CIDRs, key files. Each error names its field.

use ipnet::IpNet;
use seckill_daemon::config::{ensure, ensure_clusters, ensure_range, FieldError, Validate};

use super::tls::check_tls_files;
use super::*;

fn check_bucket(b: &Bucket, field: &str) -> Result<(), FieldError> {
    ensure(
        b.rate.is_finite() && b.rate > 0.0,
        &format!("{field}.rate"),
        "must be a positive number of tokens per second",
    )?;
    ensure(
        b.burst.is_finite() && b.burst >= 1.0,
        &format!("{field}.burst"),
        "must be at least 1",
    )
}

fn check_cidrs(list: &[String], field: &str) -> Result<(), FieldError> {
    for (i, c) in list.iter().enumerate() {
        ensure(
            parse_cidr(c).is_some(),
            &format!("{field}[{i}]"),
            format!("`{c}` is not an IP address or CIDR"),
        )?;
    }
    Ok(())
}

/// An IP (as a /32 or /128) or a CIDR.
pub fn parse_cidr(s: &str) -> Option<IpNet> {
    let s = s.trim();
    s.parse::<IpNet>()
        .ok()
        .or_else(|| s.parse::<std::net::IpAddr>().ok().map(IpNet::from))
}

fn check_url(u: &str, field: &str) -> Result<(), FieldError> {
    ensure(
        (u.starts_with("http://") || u.starts_with("https://")) && u.parse::<http::Uri>().is_ok(),
        field,
        "must be an http:// or https:// URL",
    )
}

/// At least one URL and at most [`MAX_ENDPOINTS`], each valid, none twice; the
/// one-URL spelling names the field bare, a list names the entry (`field[1]`).
fn check_urls(urls: &Urls, field: &str) -> Result<(), FieldError> {
    ensure(!urls.is_empty(), field, "needs at least one URL")?;
    ensure(
        urls.len() <= MAX_ENDPOINTS,
        field,
        format!("at most {MAX_ENDPOINTS} URLs"),
    )?;
    if let [one] = &urls[..] {
        return check_url(one, field);
    }
    for (i, u) in urls.iter().enumerate() {
        let entry = format!("{field}[{i}]");
        check_url(u, &entry)?;
        if let Some(j) = urls[..i].iter().position(|v| same_url(v, u)) {
            return Err(FieldError::new(
                entry,
                format!("`{u}` is already {field}[{j}]"),
            ));
        }
    }
    Ok(())
}

/// `https://` URLs need `[upstreams.tls]`, and its files must load. Mixing schemes is
/// allowed: each URL is dialled as its scheme says (plaintext or TLS), which works as
/// long as the daemon behind it serves the same; a mismatch fails at connect and the
/// health checks mark that endpoint down (docs/gateway.md).
fn check_upstream_tls(u: &Upstreams) -> Result<(), FieldError> {
    for (field, urls) in [
        ("upstreams.stockd", &u.stockd),
        ("upstreams.orderd", &u.orderd),
    ] {
        for (i, url) in urls.iter().enumerate() {
            let entry = if urls.len() == 1 {
                field.to_string()
            } else {
                format!("{field}[{i}]")
            };
            ensure(
                !url.starts_with("https://") || u.tls.is_some(),
                &entry,
                "https:// needs [upstreams.tls] ca_path",
            )?;
        }
    }
    match &u.tls {
        Some(tls) => tls.validate("upstreams.tls"),
        None => Ok(()),
    }
}

/// The same endpoint, trailing slash or not.
fn same_url(a: &str, b: &str) -> bool {
    a.trim_end_matches('/') == b.trim_end_matches('/')
}

fn check_addr(a: &str, field: &str) -> Result<(), FieldError> {
    ensure(
        a.rsplit_once(':')
            .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok()),
        field,
        "must be host:port",
    )
}

fn check_challenge(c: &Challenge) -> Result<(), FieldError> {
    ensure_range(c.sub_puzzles, 1..=256, "challenge.sub_puzzles")?;
    ensure_range(c.ttl_secs, 10..=3600, "challenge.ttl_secs")?;
    ensure_range(c.max_bits, 1..=24, "challenge.max_bits")?;
    ensure_range(c.default_bits, 0..=24, "challenge.default_bits")?;
    if let Some(b) = c.bits_override {
        ensure_range(b, 0..=c.max_bits, "challenge.bits_override")?;
    }
    ensure(
        c.failure_window_secs >= 1,
        "challenge.failure_window_secs",
        "must be at least 1",
    )?;
    for (i, k) in c.keys.iter().enumerate() {
        let field = format!("challenge.keys[{i}]");
        ensure(
            (1..=32).contains(&k.id.len())
                && k.id
                    .bytes()
                    .all(|b| b.is_ascii_alphanumeric() || b == b'_' || b == b'-'),
            &format!("{field}.id"),
            "1..=32 characters of A-Z a-z 0-9 _ -",
        )?;
        if let Some(j) = c.keys[..i].iter().position(|o| o.id == k.id) {
            return Err(FieldError::new(
                format!("{field}.id"),
                format!("`{}` is already challenge.keys[{j}].id", k.id),
            ));
        }
        if let Err(e) = k.secret_bytes() {
            return Err(FieldError::new(field, e));
        }
    }
    Ok(())
}

impl Validate for Config {
    const RENAMED: &'static [(&'static str, &'static str)] = &[
        ("server.admin_listen", "admin.listen"),
        ("server.json_logs", "log.json"),
    ];

    fn validate(&self) -> Result<(), FieldError> {
        let s = &self.server;
        ensure(
            !s.listen.is_empty() || !s.tls_listen.is_empty(),
            "server.listen",
            "needs at least one address",
        )?;
        for (i, a) in s.listen.iter().enumerate() {
            check_addr(a, &format!("server.listen[{i}]"))?;
        }
        ensure_range(s.threads, 1..=256, "server.threads")?;
        check_addr(&self.admin.listen, "admin.listen")?;
        if !s.tls_listen.is_empty() {
            check_addr(&s.tls_listen, "server.tls_listen")?;
            ensure(
                !s.tls_cert_path.is_empty(),
                "server.tls_cert_path",
                "required with tls_listen",
            )?;
            ensure(
                !s.tls_key_path.is_empty(),
                "server.tls_key_path",
                "required with tls_listen",
            )?;
            check_tls_files(&s.tls_cert_path, &s.tls_key_path)?;
        }
        ensure(
            !s.pid_file.is_empty(),
            "server.pid_file",
            "must not be empty",
        )?;
        ensure(
            !s.upgrade_sock.is_empty(),
            "server.upgrade_sock",
            "must not be empty",
        )?;

        let r = &self.redis;
        ensure(
            !r.nodes.is_empty(),
            "redis.nodes",
            "needs at least one node",
        )?;
        for (i, n) in r.nodes.iter().enumerate() {
            check_addr(n, &format!("redis.nodes[{i}]"))?;
        }
        ensure_clusters(&r.clusters, "redis.clusters")?;
        ensure(
            r.refresh_ms >= 50,
            "redis.refresh_ms",
            "must be at least 50",
        )?;
        ensure(
            r.stock_poll_ms >= 10,
            "redis.stock_poll_ms",
            "must be at least 10",
        )?;
        ensure(
            (1..=1_000_000).contains(&r.stock_poll_idle_keys),
            "redis.stock_poll_idle_keys",
            "must be 1..=1000000",
        )?;
        ensure(r.timeout_ms >= 1, "redis.timeout_ms", "must be at least 1")?;

        let u = &self.upstreams;
        check_urls(&u.stockd, "upstreams.stockd")?;
        check_urls(&u.orderd, "upstreams.orderd")?;
        check_upstream_tls(u)?;
        ensure(
            !u.service_token.is_empty() && u.service_token.bytes().all(|b| b.is_ascii_graphic()),
            "upstreams.service_token",
            "must be non-empty printable ASCII",
        )?;
        ensure(
            u.connect_timeout_ms >= 1,
            "upstreams.connect_timeout_ms",
            "must be at least 1",
        )?;
        ensure(
            u.reserve_deadline_ms >= 1,
            "upstreams.reserve_deadline_ms",
            "must be at least 1",
        )?;
        ensure(
            (1..=crate::batch::MAX_BATCH).contains(&u.reserve_batch_max),
            "upstreams.reserve_batch_max",
            "must be 1..=1024 (1: no batching)",
        )?;
        ensure(
            (1..=64).contains(&u.reserve_batch_inflight),
            "upstreams.reserve_batch_inflight",
            "must be 1..=64",
        )?;
        ensure(
            u.order_deadline_ms >= 1,
            "upstreams.order_deadline_ms",
            "must be at least 1",
        )?;
        ensure(
            u.health_interval_ms >= 10,
            "upstreams.health_interval_ms",
            "must be at least 10",
        )?;
        ensure(
            u.health_timeout_ms >= 1,
            "upstreams.health_timeout_ms",
            "must be at least 1",
        )?;

        let a = &self.auth;
        // The key set, loaded as the gateway will load it (PEM and JWKS files read).
        let jwt =
            crate::auth::Jwt::from_config(a).map_err(|e| FieldError::new(e.field, e.problem))?;
        ensure(
            a.purchase_token_secret.len() >= 16,
            "auth.purchase_token_secret",
            "must be at least 16 bytes",
        )?;
        ensure_range(
            a.purchase_token_ttl_secs,
            1..=86_400,
            "auth.purchase_token_ttl_secs",
        )?;

        let l = &self.limits;
        check_bucket(&l.per_ip, "limits.per_ip")?;
        check_bucket(&l.per_user, "limits.per_user")?;
        for (name, b) in &l.routes {
            ensure(
                crate::routes::RouteClass::from_name(name).is_some(),
                &format!("limits.routes.{name}"),
                "unknown route (token, reserve, orders, activities, payments, dev)",
            )?;
            check_bucket(b, &format!("limits.routes.{name}"))?;
        }
        ensure(
            l.max_tracked >= 1024,
            "limits.max_tracked",
            "must be at least 1024",
        )?;
        ensure(
            l.idle_evict_secs >= 1,
            "limits.idle_evict_secs",
            "must be at least 1",
        )?;
        ensure_range(l.fleet_size, 1..=1024, "limits.fleet_size")?;
        ensure_range(l.sync_ms, 10..=10_000, "limits.sync_ms")?;

        let b = &self.bans;
        check_cidrs(&b.deny, "bans.deny")?;
        check_cidrs(&b.allow, "bans.allow")?;
        check_cidrs(&b.trusted_proxies, "bans.trusted_proxies")?;
        if b.auto_ban_threshold > 0 {
            ensure(
                b.auto_ban_window_secs >= 1,
                "bans.auto_ban_window_secs",
                "must be at least 1",
            )?;
            ensure(
                b.auto_ban_ttl_secs >= 1,
                "bans.auto_ban_ttl_secs",
                "must be at least 1",
            )?;
        }

        ensure(
            self.admission.k.is_finite() && self.admission.k > 0.0,
            "admission.k",
            "must be a positive number",
        )?;
        ensure_range(
            self.admission.lease_slice,
            1..=100_000,
            "admission.lease_slice",
        )?;

        let p = &self.protection;
        ensure_range(p.max_header_count, 1..=256, "protection.max_header_count")?;
        ensure(
            p.max_header_bytes >= 256,
            "protection.max_header_bytes",
            "must be at least 256",
        )?;
        ensure(
            p.max_body_bytes >= 64,
            "protection.max_body_bytes",
            "must be at least 64",
        )?;
        ensure(
            p.request_read_ms >= 10,
            "protection.request_read_ms",
            "must be at least 10",
        )?;

        check_challenge(&self.challenge)?;

        if self.dev.enabled {
            ensure(
                jwt.can_issue(),
                "dev.enabled",
                "the dev token endpoint signs HS256 JWTs: needs an HS256 key (auth.jwt_secret or an HS256 entry of auth.keys)",
            )?;
            ensure(
                self.dev.token_ttl_secs >= 1,
                "dev.token_ttl_secs",
                "must be at least 1",
            )?;
        }
        self.room.validate()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use super::super::MINIMAL;

    fn load(text: &str) -> Result<Config, seckill_daemon::config::ConfigError> {
        seckill_daemon::config::load_str(text, "g.toml", ENV_PREFIX, Vec::new())
    }

    #[test]
    fn challenge_keys_and_ranges_are_checked_naming_the_field() {
        let with = |extra: &str| load(&format!("{MINIMAL}[challenge]\n{extra}\n"));
        assert!(with("keys = [{ id = \"k1\", secret = \"0123456789abcdef\" }]").is_ok());
        for (extra, field) in [
            ("sub_puzzles = 0", "challenge.sub_puzzles"),
            ("max_bits = 30", "challenge.max_bits"),
            ("bits_override = 17", "challenge.bits_override"),
            ("ttl_secs = 1", "challenge.ttl_secs"),
            ("keys = [{ id = \"a.b\", secret = \"0123456789abcdef\" }]", "challenge.keys[0].id"),
            ("keys = [{ id = \"k\", secret = \"short\" }]", "challenge.keys[0]"),
            ("keys = [{ id = \"k\" }]", "challenge.keys[0]"),
            ("keys = [{ id = \"k\", secret_file = \"/nonexistent/pow\" }]", "challenge.keys[0]"),
            (
                "keys = [{ id = \"k\", secret = \"0123456789abcdef\" }, { id = \"k\", secret = \"0123456789abcdef\" }]",
                "challenge.keys[1].id",
            ),
        ] {
            let e = with(extra).unwrap_err().to_string();
            assert!(e.contains(field), "{extra}: {e}");
        }
        let dir = tempfile::tempdir().unwrap();
        let f = dir.path().join("pow.key");
        std::fs::write(&f, "0123456789abcdef0123\n").unwrap();
        let c = with(&format!(
            "keys = [{{ id = \"k\", secret_file = \"{}\" }}]",
            f.display()
        ))
        .unwrap();
        assert_eq!(
            c.challenge.keys[0].secret_bytes().unwrap(),
            b"0123456789abcdef0123"
        );
    }

    #[test]
    fn a_minimal_file_loads_with_defaults() {
        let c = load(MINIMAL).unwrap();
        assert_eq!(c.server.threads, 1);
        assert_eq!(c.limits.per_ip.burst, 40.0);
        assert!(!c.dev.enabled);
        assert_eq!(c.dev.token_ttl_secs, 3600);
    }

    #[test]
    fn a_bad_cidr_is_named() {
        let e = load(&format!(
            "{MINIMAL}[bans]\ndeny = [\"10.0.0.0/8\", \"nope\"]\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.starts_with("g.toml: bans.deny[1]:"), "{e}");
    }

    #[test]
    fn fleet_fields_are_validated_and_named() {
        let c = load(&format!(
            "{MINIMAL}[limits]\nfleet = true\nfleet_size = 3\nsync_ms = 50\n"
        ))
        .unwrap();
        assert!(c.limits.fleet);
        assert_eq!((c.limits.fleet_size, c.limits.sync_ms), (3, 50));
        assert_eq!(c.admission.lease_slice, 8);
        for (extra, field) in [
            ("[limits]\nfleet_size = 0\n", "limits.fleet_size"),
            ("[limits]\nsync_ms = 5\n", "limits.sync_ms"),
            ("[limits]\nsync_ms = 20000\n", "limits.sync_ms"),
            ("[admission]\nlease_slice = 0\n", "admission.lease_slice"),
        ] {
            let e = load(&format!("{MINIMAL}{extra}")).unwrap_err().to_string();
            assert!(e.contains(field), "{e}");
        }
    }

    #[test]
    fn a_short_secret_and_an_unknown_route_are_refused() {
        let e = load(&MINIMAL.replace("0123456789abcdef0123", "short"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("auth.jwt_secret"), "{e}");
        let e = load(&format!(
            "{MINIMAL}[limits.routes]\nwhatever = {{ rate = 1.0, burst = 1.0 }}\n"
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("limits.routes.whatever"), "{e}");
    }

    /// MINIMAL with a TLS listener on `cert` and `key`.
    fn with_tls(cert: &std::path::Path, key: &std::path::Path) -> String {
        format!(
            "[server]\ntls_listen = \"127.0.0.1:8443\"\ntls_cert_path = \"{}\"\ntls_key_path = \"{}\"\n{MINIMAL}",
            cert.display(),
            key.display()
        )
    }

    #[test]
    fn tls_files_are_loaded_by_validation_and_a_bad_one_is_named() {
        let tmp = tempfile::tempdir().unwrap();
        let dir = tmp.path().to_path_buf();
        let write = |name: &str, text: &str| {
            let p = dir.join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let one = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
        let other = rcgen::KeyPair::generate().unwrap();
        let cert = write("cert.pem", &one.cert.pem());
        let key = write("key.pem", &one.signing_key.serialize_pem());
        let other_key = write("other.pem", &other.serialize_pem());
        let garbage = write("garbage.pem", "not pem at all\n");

        let c = load(&with_tls(&cert, &key)).unwrap();
        assert_eq!(c.server.tls_listen, "127.0.0.1:8443");

        for (cert, key, field, says) in [
            (
                &cert,
                &dir.join("missing.pem"),
                "server.tls_key_path",
                "cannot read",
            ),
            (
                &dir.join("missing.pem"),
                &key,
                "server.tls_cert_path",
                "cannot read",
            ),
            (&garbage, &key, "server.tls_cert_path", "no PEM certificate"),
            (&key, &key, "server.tls_cert_path", "no PEM certificate"),
            (&cert, &garbage, "server.tls_key_path", "no PEM private key"),
            (&cert, &cert, "server.tls_key_path", "no PEM private key"),
            (
                &cert,
                &other_key,
                "server.tls_key_path",
                "not usable with the certificate",
            ),
            (&cert, &dir, "server.tls_key_path", "cannot read"),
        ] {
            let e = load(&with_tls(cert, key)).unwrap_err().to_string();
            assert!(e.starts_with(&format!("g.toml: {field}: ")), "{e}");
            assert!(e.contains(says), "{e}");
            assert_eq!(e.lines().count(), 1, "{e}");
        }
        let e = load(&with_tls(&cert, std::path::Path::new("")))
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("server.tls_key_path: required with tls_listen"),
            "{e}"
        );
    }

    #[test]
    fn an_upstream_is_one_url_or_a_list_of_them() {
        let c = load(MINIMAL).unwrap();
        assert_eq!(&c.upstreams.stockd[..], ["http://127.0.0.1:50051"]);
        assert_eq!(c.upstreams.health_interval_ms, 500);
        let c = load(&MINIMAL.replace(
            "stockd = \"http://127.0.0.1:50051\"",
            "stockd = [\"http://127.0.0.1:50051\", \"http://127.0.0.1:50061\"]",
        ))
        .unwrap();
        assert_eq!(
            &c.upstreams.stockd[..],
            ["http://127.0.0.1:50051", "http://127.0.0.1:50061"]
        );
    }

    #[test]
    fn the_environment_sets_an_upstream_list_as_toml() {
        let env = vec![(
            "GATEWAY__UPSTREAMS__ORDERD".to_string(),
            r#"["http://10.0.0.1:50052", "http://10.0.0.2:50052"]"#.to_string(),
        )];
        let c =
            seckill_daemon::config::load_str::<Config>(MINIMAL, "g.toml", ENV_PREFIX, env).unwrap();
        assert_eq!(c.upstreams.orderd.len(), 2);
    }

    #[test]
    fn an_empty_bad_or_repeated_upstream_list_is_named() {
        for (stockd, starts, says) in [
            ("[]", "upstreams.stockd: ", "at least one"),
            ("\"127.0.0.1:50051\"", "upstreams.stockd: ", "http://"),
            (
                "[\"http://127.0.0.1:50051\", \"nope\"]",
                "upstreams.stockd[1]: ",
                "http://",
            ),
            (
                "[\"http://a:1\", \"http://b:1\", \"http://a:1/\"]",
                "upstreams.stockd[2]: ",
                "already upstreams.stockd[0]",
            ),
            ("7", "upstreams.stockd", "a URL or a list of URLs"),
        ] {
            let e = load(&MINIMAL.replace(
                "stockd = \"http://127.0.0.1:50051\"",
                &format!("stockd = {stockd}"),
            ))
            .unwrap_err()
            .to_string();
            assert!(e.starts_with(&format!("g.toml: {starts}")), "{stockd}: {e}");
            assert!(e.contains(says), "{stockd}: {e}");
        }
        let e = load(&MINIMAL.replace("service_token", "health_interval_ms = 0\nservice_token"))
            .unwrap_err()
            .to_string();
        assert!(e.contains("upstreams.health_interval_ms"), "{e}");
    }

    #[test]
    fn dev_tokens_need_hs256() {
        let e = load(&format!(
            "{}[dev]\nenabled = true\n",
            MINIMAL.replace(
                "[auth]",
                "[auth]\njwt_alg = \"RS256\"\njwt_public_key_path = \"/nonexistent\""
            )
        ))
        .unwrap_err()
        .to_string();
        assert!(e.contains("auth.jwt_public_key_path"), "{e}");
    }

    #[test]
    fn an_unknown_jwt_alg_names_the_field_and_the_choices() {
        let e = load(&MINIMAL.replace("[auth]\n", "[auth]\njwt_alg = \"none\"\n"))
            .unwrap_err()
            .to_string();
        assert!(e.starts_with("g.toml: auth.jwt_alg:"), "{e}");
        assert!(
            e.contains("HS256") && e.contains("RS256") && e.contains("ES256"),
            "{e}"
        );
    }

    #[test]
    fn an_https_upstream_needs_upstreams_tls_and_its_files_must_load() {
        let https = MINIMAL.replace("http://127.0.0.1:50051", "https://127.0.0.1:50051");
        let e = load(&https).unwrap_err().to_string();
        assert_eq!(
            e,
            "g.toml: upstreams.stockd: https:// needs [upstreams.tls] ca_path"
        );
        let fleet = MINIMAL.replace(
            "orderd = \"http://127.0.0.1:50052\"",
            "orderd = [\"http://127.0.0.1:50052\", \"https://127.0.0.1:50062\"]",
        );
        let e = load(&fleet).unwrap_err().to_string();
        assert!(
            e.starts_with("g.toml: upstreams.orderd[1]: https://"),
            "{e}"
        );

        let dir = tempfile::tempdir().unwrap();
        let ca = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
        let ca_path = dir.path().join("ca.pem");
        std::fs::write(&ca_path, ca.cert.pem()).unwrap();
        let with = |section: &str| format!("{https}[upstreams.tls]\n{section}\n");
        let c = load(&with(&format!("ca_path = \"{}\"", ca_path.display()))).unwrap();
        assert_eq!(
            c.upstreams.tls.unwrap().ca_path,
            ca_path.display().to_string()
        );
        // Plaintext and TLS endpoints side by side: each dialled as its scheme says.
        let mixed = format!(
            "{fleet}[upstreams.tls]\nca_path = \"{}\"\n",
            ca_path.display()
        );
        load(&mixed).unwrap();
        for (section, field) in [
            ("ca_path = \"/nonexistent/ca.pem\"", "upstreams.tls.ca_path"),
            ("", "upstreams.tls.ca_path"),
            (
                &format!(
                    "ca_path = \"{}\"\ncert_path = \"{}\"",
                    ca_path.display(),
                    ca_path.display()
                ),
                "upstreams.tls.key_path",
            ),
        ] {
            let e = load(&with(section)).unwrap_err().to_string();
            assert!(e.starts_with(&format!("g.toml: {field}:")), "{e}");
        }
    }

    #[test]
    fn named_redis_clusters_are_read_and_a_bad_one_is_refused_naming_the_field() {
        let with = |extra: &str| load(&format!("{MINIMAL}{extra}\n"));
        let c = with("[redis.clusters.hot]\nnodes = [\"10.0.0.9:7001\"]").unwrap();
        assert_eq!(c.redis.clusters["hot"].nodes, vec!["10.0.0.9:7001"]);
        assert!(load(MINIMAL).unwrap().redis.clusters.is_empty());
        for (extra, field) in [
            (
                "[redis.clusters.hot]\nnodes = []",
                "redis.clusters.hot.nodes",
            ),
            (
                "[redis.clusters.hot]\nnodes = [\"nope\"]",
                "redis.clusters.hot.nodes",
            ),
            ("[redis.clusters.hot]", "redis.clusters.hot"),
            (
                "[redis.clusters.hot]\nnodes = [\"h:1\"]\ntimeout_ms = 5",
                "redis.clusters.hot",
            ),
            (
                "[redis.clusters.Hot]\nnodes = [\"h:1\"]",
                "redis.clusters.Hot",
            ),
            (
                "[redis.clusters.default]\nnodes = [\"h:1\"]",
                "redis.clusters.default",
            ),
        ] {
            let e = with(extra).unwrap_err().to_string();
            assert!(e.contains(field), "{extra}: {e}");
        }
    }
}
