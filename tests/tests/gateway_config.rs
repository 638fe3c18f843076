#![cfg(feature = "gateway")]
//! `gateway -t`: the shipped config validates; a bad one is refused with one line that
//! names the file and the field, before any socket, Redis or backend is touched.

use std::path::PathBuf;

fn repo_file(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(rel)
}

fn check(path: &std::path::Path) -> (bool, String) {
    seckill_tests::process::config_test("gateway", path)
}

#[test]
fn the_shipped_config_passes_gateway_t() {
    let (ok, text) = check(&repo_file("deploy/local/gateway.toml"));
    assert!(ok, "{text}");
    // And through the library, with env overrides applied the same way.
    let c = gateway::config::load(&repo_file("deploy/local/gateway.toml")).unwrap();
    assert_eq!(c.server.listen, vec!["127.0.0.1:8080"]);
    assert_eq!(c.admin.listen, "127.0.0.1:9091");
    // Its own caller token, listed by the shipped stockd.toml and orderd.toml (scoped).
    assert_eq!(c.upstreams.service_token, "local-dev-gateway-token");
    for d in ["stockd", "orderd"] {
        let shipped =
            std::fs::read_to_string(repo_file(&format!("deploy/local/{d}.toml"))).unwrap();
        assert!(
            shipped.contains("token = \"local-dev-gateway-token\""),
            "{d}.toml lists the gateway"
        );
    }
}

#[test]
fn a_bad_config_fails_gateway_t_with_one_line_naming_the_field() {
    let shipped = std::fs::read_to_string(repo_file("deploy/local/gateway.toml")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (broken, field) in [
        (shipped.replace("k = 2.0", "k = -1.0"), "admission.k"),
        (
            shipped.replace("deny = [\"203.0.113.0/24\"]", "deny = [\"not-an-ip\"]"),
            "bans.deny[0]",
        ),
        (shipped.replace("threads = 1", "threadz = 1"), "server"),
        (
            shipped.replace("fleet_size = 1", "fleet_size = 0"),
            "limits.fleet_size",
        ),
        (
            shipped.replace("sync_ms = 100", "sync_ms = 1"),
            "limits.sync_ms",
        ),
        (
            shipped.replace("lease_slice = 8", "lease_slice = 0"),
            "admission.lease_slice",
        ),
        (
            shipped.replace(
                "stockd = \"http://127.0.0.1:50051\"",
                "stockd = \"127.0.0.1\"",
            ),
            "upstreams.stockd",
        ),
        (
            shipped.replace("sub_puzzles = 32", "sub_puzzles = 0"),
            "challenge.sub_puzzles",
        ),
        (
            shipped.replace("reserve_batch_max = 256", "reserve_batch_max = 0"),
            "upstreams.reserve_batch_max",
        ),
        (
            shipped.replace("reserve_batch_max = 256", "reserve_batch_max = 5000"),
            "upstreams.reserve_batch_max",
        ),
        (
            shipped.replace("reserve_batch_inflight = 2", "reserve_batch_inflight = 0"),
            "upstreams.reserve_batch_inflight",
        ),
        (
            shipped.replace("reserve_stream = true", "reserve_stream = \"yes\""),
            "upstreams.reserve_stream",
        ),
        (
            shipped.replace(
                "secret = \"local-dev-challenge-key-0123456789\"",
                "secret_file = \"/nonexistent/challenge.key\"",
            ),
            "challenge.keys[0]",
        ),
    ] {
        let path = dir.path().join("gateway.toml");
        std::fs::write(&path, broken).unwrap();
        let (ok, text) = check(&path);
        assert!(!ok, "accepted a bad config for {field}");
        assert_eq!(text.trim().lines().count(), 1, "{text}");
        assert!(text.contains("gateway.toml"), "{text}");
        assert!(text.contains(field), "{field}: {text}");
    }
    let (ok, text) = check(&dir.path().join("missing.toml"));
    assert!(!ok);
    assert!(text.contains("missing.toml"), "{text}");
}

#[test]
fn an_old_spelling_of_a_common_section_fails_gateway_t_naming_the_new_key() {
    let shipped = std::fs::read_to_string(repo_file("deploy/local/gateway.toml")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    for (old, new) in [
        ("admin_listen = \"127.0.0.1:9091\"", "admin.listen"),
        ("json_logs = false", "log.json"),
    ] {
        let broken = shipped.replace("[server]\n", &format!("[server]\n{old}\n"));
        let path = dir.path().join("gateway.toml");
        std::fs::write(&path, broken).unwrap();
        let (ok, text) = check(&path);
        assert!(!ok, "accepted the old spelling {old}");
        assert_eq!(text.trim().lines().count(), 1, "{text}");
        assert!(text.contains(&format!("write `{new}` instead")), "{text}");
    }
}

#[test]
fn a_tls_listener_needs_readable_pem_files_and_gateway_t_names_the_bad_one() {
    let shipped = std::fs::read_to_string(repo_file("deploy/local/gateway.toml")).unwrap();
    let dir = tempfile::tempdir().unwrap();
    let ck = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_string()]).unwrap();
    let (cert, key) = (dir.path().join("cert.pem"), dir.path().join("key.pem"));
    std::fs::write(&cert, ck.cert.pem()).unwrap();
    std::fs::write(&key, ck.signing_key.serialize_pem()).unwrap();
    let garbage = dir.path().join("garbage.pem");
    std::fs::write(&garbage, "-----BEGIN NOTHING-----\n").unwrap();
    let with_tls = |cert: &std::path::Path, key: &std::path::Path| {
        let text = shipped
            .replace("tls_listen = \"\"", "tls_listen = \"127.0.0.1:8443\"")
            .replace(
                "tls_cert_path = \"\"",
                &format!("tls_cert_path = \"{}\"", cert.display()),
            )
            .replace(
                "tls_key_path = \"\"",
                &format!("tls_key_path = \"{}\"", key.display()),
            );
        assert_ne!(
            text, shipped,
            "the shipped file has no empty tls_* fields to fill"
        );
        let path = dir.path().join("gateway.toml");
        std::fs::write(&path, text).unwrap();
        check(&path)
    };

    let (ok, text) = with_tls(&cert, &key);
    assert!(ok, "a good certificate and key were refused: {text}");

    let missing = dir.path().join("missing-key.pem");
    for (cert, key, field, says) in [
        (&cert, &missing, "server.tls_key_path", "missing-key.pem"),
        (&cert, &PathBuf::new(), "server.tls_key_path", "required"),
        (&garbage, &key, "server.tls_cert_path", "not valid PEM"),
        (&key, &key, "server.tls_cert_path", "no PEM certificate"),
        (&cert, &cert, "server.tls_key_path", "no PEM private key"),
    ] {
        let (ok, text) = with_tls(cert, key);
        assert!(!ok, "accepted a bad TLS config for {field}: {text}");
        assert_eq!(text.trim().lines().count(), 1, "{text}");
        assert!(text.contains("gateway.toml"), "{text}");
        assert!(text.contains(field), "{field}: {text}");
        assert!(text.contains(says), "{says}: {text}");
    }
}
