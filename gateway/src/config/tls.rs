//! `server.tls_cert_path` and `server.tls_key_path`: read and parsed as pingora's
//! rustls listener will, so `gateway -t` refuses what the listener would fail on.

use seckill_daemon::config::{ensure, FieldError};

fn bad_pem(field: &str, path: &str, e: &pingora::Error) -> FieldError {
    FieldError::new(
        field,
        format!("`{path}` is not valid PEM: {}", e.root_cause()),
    )
}

/// The TLS listener's certificate chain and key, loaded the way pingora's rustls acceptor
/// loads them when the listener starts (where a bad file is a panic, not an error): each
/// file readable and holding PEM of the right kind, and the key the certificate's.
pub(super) fn check_tls_files(cert_path: &str, key_path: &str) -> Result<(), FieldError> {
    use pingora::tls;
    const CERT: &str = "server.tls_cert_path";
    const KEY: &str = "server.tls_key_path";
    let readable = |path: &str, field: &str| {
        std::fs::read(path)
            .map(drop)
            .map_err(|e| FieldError::new(field, format!("cannot read `{path}`: {e}")))
    };
    readable(cert_path, CERT)?;
    readable(key_path, KEY)?;
    let first_cert =
        tls::load_pem_file_ca(&cert_path.to_string()).map_err(|e| bad_pem(CERT, cert_path, &e))?;
    ensure(
        !first_cert.is_empty(),
        CERT,
        format!("`{cert_path}` holds no PEM certificate (BEGIN CERTIFICATE)"),
    )?;
    let key = tls::load_pem_file_private_key(&key_path.to_string())
        .map_err(|e| bad_pem(KEY, key_path, &e))?;
    ensure(
        !key.is_empty(),
        KEY,
        format!("`{key_path}` holds no PEM private key (PKCS#8, PKCS#1 or SEC1)"),
    )?;
    let Ok(Some((chain, key))) = tls::load_certs_and_key_files(cert_path, key_path) else {
        return Err(FieldError::new(
            KEY,
            format!("`{key_path}` holds no private key of a kind rustls loads"),
        ));
    };
    // The same provider pingora installs before it builds the listener (ring).
    tls::install_default_crypto_provider();
    tls::ServerConfig::builder_with_protocol_versions(&[&tls::version::TLS12, &tls::version::TLS13])
        .with_no_client_auth()
        .with_single_cert(chain, key)
        .map(drop)
        .map_err(|e| {
            FieldError::new(
                KEY,
                format!("`{key_path}` is not usable with the certificate in `{cert_path}`: {e}"),
            )
        })
}
