//! TLS between the gateway and the daemons (tonic's rustls, ring provider).
//!
//! - [`ServerTls`]: `[grpc.tls]` of stockd and orderd: the server's certificate chain and
//!   key, and optionally the CA that signs client certificates (then mutual TLS: a client
//!   without a certificate signed by it is refused at the handshake).
//! - [`ClientTls`]: the client side (the gateway's `[upstreams.tls]`, the harness): the
//!   roots that verify the daemons, optionally a client certificate and key.
//!
//! Both are loaded by `validate()` (so `-t` and every load read and parse the files, and
//! a bad one is refused naming its field) and again when the server or channel is
//! built. Loading builds the rustls config tonic will use, so a key that is not the
//! certificate's is caught at `-t`, not at the first handshake.

use rustls_pki_types::pem::PemObject;
use rustls_pki_types::{CertificateDer, PrivateKeyDer};
use serde::{Deserialize, Serialize};
use tonic::transport::{Certificate, ClientTlsConfig, Identity, ServerTlsConfig};

use crate::config::FieldError;

/// `[grpc.tls]`: serve gRPC (the daemon's services, health and reflection, on the same
/// port) over TLS. Absent: plaintext.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ServerTls {
    /// PEM file: the server's certificate chain, its own certificate first; its names
    /// (SAN) must include the host clients dial (an IP or a DNS name). Required in the
    /// section.
    #[serde(default)]
    pub cert_path: String,
    /// PEM file: the private key of that certificate (PKCS#8, PKCS#1 or SEC1). Required
    /// in the section. Never logged.
    #[serde(default)]
    pub key_path: String,
    /// PEM file: the CA certificate(s) that sign client certificates. Set: mutual TLS,
    /// every client must present a certificate signed by one of them (the handshake
    /// fails otherwise). Empty (the default): TLS without client certificates. The
    /// per-caller tokens of `[grpc]` apply either way.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub client_ca_path: String,
}

/// The client side: how a gRPC client (the gateway, seckillctl, the tests) verifies the
/// daemons and, for mutual TLS, proves who it is. Used for `https://` URLs.
#[derive(Debug, Clone, Default, PartialEq, Eq, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
pub struct ClientTls {
    /// PEM file: the CA certificate(s) that verify the daemons' certificates (no system
    /// roots are used). Required in the section.
    #[serde(default)]
    pub ca_path: String,
    /// PEM file: the client certificate chain presented to daemons that ask for one
    /// (`[grpc.tls] client_ca_path`). Empty (the default): none. Set with `key_path`.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub cert_path: String,
    /// PEM file: the private key of `cert_path`. Empty (the default): none. Never logged.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub key_path: String,
    /// The name the daemons' certificates are verified against. Empty (the default): the
    /// host of each URL (an IP address is matched against the certificate's IP names).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub domain: String,
}

/// Longest TLS handshake the daemons wait for: tonic sets none, and a peer that opens a
/// connection and never finishes its handshake would hold it (and a task) forever.
pub const HANDSHAKE_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(10);

/// `{section}.{field}`.
fn at(section: &str, field: &str) -> String {
    format!("{section}.{field}")
}

/// Reads `path` (`field` names it in errors): a required, readable file.
fn read(path: &str, field: &str) -> Result<Vec<u8>, FieldError> {
    if path.is_empty() {
        return Err(FieldError::new(field, "required (a PEM file)"));
    }
    std::fs::read(path).map_err(|e| FieldError::new(field, format!("cannot read `{path}`: {e}")))
}

/// The PEM file of certificates at `path`: readable, well-formed, at least one
/// `BEGIN CERTIFICATE`. Returns the file's bytes (tonic takes PEM).
pub fn read_certs(path: &str, field: &str) -> Result<Vec<u8>, FieldError> {
    let pem = read(path, field)?;
    let certs = CertificateDer::pem_slice_iter(&pem)
        .collect::<Result<Vec<_>, _>>()
        .map_err(|e| FieldError::new(field, format!("`{path}` is not valid PEM: {e}")))?;
    if certs.is_empty() {
        return Err(FieldError::new(
            field,
            format!("`{path}` holds no PEM certificate (BEGIN CERTIFICATE)"),
        ));
    }
    Ok(pem)
}

/// The PEM private key at `path` (PKCS#8, PKCS#1 or SEC1). Returns the file's bytes.
pub fn read_key(path: &str, field: &str) -> Result<Vec<u8>, FieldError> {
    let pem = read(path, field)?;
    PrivateKeyDer::from_pem_slice(&pem).map_err(|e| {
        FieldError::new(
            field,
            format!("`{path}` holds no PEM private key (PKCS#8, PKCS#1 or SEC1): {e}"),
        )
    })?;
    Ok(pem)
}

impl ServerTls {
    /// Reads the files and builds the server's TLS config; `section` (`grpc.tls`) names
    /// the fields in errors.
    pub fn load(&self, section: &str) -> Result<ServerTlsConfig, FieldError> {
        let cert = read_certs(&self.cert_path, &at(section, "cert_path"))?;
        let key = read_key(&self.key_path, &at(section, "key_path"))?;
        let plain = ServerTlsConfig::new()
            .identity(Identity::from_pem(cert, key))
            .timeout(HANDSHAKE_TIMEOUT);
        tonic::transport::Server::builder()
            .tls_config(plain.clone())
            .map_err(|e| {
                FieldError::new(
                    at(section, "key_path"),
                    format!(
                        "`{}` is not usable with the certificate in `{}`: {}",
                        self.key_path,
                        self.cert_path,
                        root_cause(&e)
                    ),
                )
            })?;
        if self.client_ca_path.is_empty() {
            return Ok(plain);
        }
        let field = at(section, "client_ca_path");
        let ca = read_certs(&self.client_ca_path, &field)?;
        let mutual = plain.client_ca_root(Certificate::from_pem(ca));
        tonic::transport::Server::builder()
            .tls_config(mutual.clone())
            .map_err(|e| {
                FieldError::new(
                    field,
                    format!(
                        "`{}` does not make a client verifier: {}",
                        self.client_ca_path,
                        root_cause(&e)
                    ),
                )
            })?;
        Ok(mutual)
    }

    /// [`Self::load`], for `validate()`.
    pub fn validate(&self, section: &str) -> Result<(), FieldError> {
        self.load(section).map(drop)
    }

    /// True when clients must present a certificate.
    pub fn is_mutual(&self) -> bool {
        !self.client_ca_path.is_empty()
    }
}

impl ClientTls {
    /// Reads the files and builds the client's TLS config; `section` (`upstreams.tls`)
    /// names the fields in errors.
    pub fn load(&self, section: &str) -> Result<ClientTlsConfig, FieldError> {
        let ca = read_certs(&self.ca_path, &at(section, "ca_path"))?;
        let mut config = ClientTlsConfig::new().ca_certificate(Certificate::from_pem(ca));
        match (self.cert_path.is_empty(), self.key_path.is_empty()) {
            (true, true) => {}
            (false, true) => {
                return Err(FieldError::new(
                    at(section, "key_path"),
                    "required with cert_path",
                ))
            }
            (true, false) => {
                return Err(FieldError::new(
                    at(section, "cert_path"),
                    "required with key_path",
                ))
            }
            (false, false) => {
                let cert = read_certs(&self.cert_path, &at(section, "cert_path"))?;
                let key = read_key(&self.key_path, &at(section, "key_path"))?;
                config = config.identity(Identity::from_pem(cert, key));
            }
        }
        if !self.domain.is_empty() {
            rustls_pki_types::ServerName::try_from(self.domain.as_str()).map_err(|e| {
                FieldError::new(
                    at(section, "domain"),
                    format!("`{}` is not a DNS name or IP address: {e}", self.domain),
                )
            })?;
            config = config.domain_name(self.domain.clone());
        }
        // Builds the rustls client config now: a key that is not the certificate's fails
        // here rather than on the first handshake.
        tonic::transport::Endpoint::from_static("https://localhost")
            .tls_config(config.clone())
            .map_err(|e| {
                FieldError::new(
                    at(section, "key_path"),
                    format!(
                        "`{}` is not usable with the certificate in `{}`: {}",
                        self.key_path,
                        self.cert_path,
                        root_cause(&e)
                    ),
                )
            })?;
        Ok(config)
    }

    /// [`Self::load`], for `validate()`.
    pub fn validate(&self, section: &str) -> Result<(), FieldError> {
        self.load(section).map(drop)
    }
}

/// The innermost message of a tonic transport error (its Display is only "transport
/// error").
fn root_cause(e: &(dyn std::error::Error + 'static)) -> String {
    let mut cause = e;
    while let Some(next) = cause.source() {
        cause = next;
    }
    cause.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A CA, a server certificate for 127.0.0.1/localhost and a client certificate, as
    /// PEM files in a fresh directory.
    struct Pki {
        dir: tempfile::TempDir,
    }

    impl Pki {
        fn path(&self, name: &str) -> String {
            self.dir.path().join(name).display().to_string()
        }
    }

    fn pki() -> Pki {
        use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair};
        let dir = tempfile::tempdir().unwrap();
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        let ca_cert = ca.self_signed(&ca_key).unwrap();
        let issuer = rcgen::Issuer::new(ca, ca_key);
        let write = |name: &str, text: String| std::fs::write(dir.path().join(name), text).unwrap();
        write("ca.pem", ca_cert.pem());
        for (name, sans) in [
            ("server", vec!["127.0.0.1".to_string(), "localhost".into()]),
            ("client", vec!["gateway".to_string()]),
        ] {
            let key = KeyPair::generate().unwrap();
            let cert = CertificateParams::new(sans)
                .unwrap()
                .signed_by(&key, &issuer)
                .unwrap();
            write(&format!("{name}.pem"), cert.pem());
            write(&format!("{name}.key"), key.serialize_pem());
        }
        write("garbage.pem", "not a certificate\n".into());
        Pki { dir }
    }

    fn server(p: &Pki, cert: &str, key: &str, ca: &str) -> ServerTls {
        ServerTls {
            cert_path: p.path(cert),
            key_path: p.path(key),
            client_ca_path: if ca.is_empty() {
                String::new()
            } else {
                p.path(ca)
            },
        }
    }

    fn field(r: Result<(), FieldError>) -> (String, String) {
        let e = r.unwrap_err();
        (e.field, e.problem)
    }

    #[test]
    fn a_server_section_with_good_files_loads_with_and_without_client_certificates() {
        let p = pki();
        server(&p, "server.pem", "server.key", "")
            .validate("grpc.tls")
            .unwrap();
        let mutual = server(&p, "server.pem", "server.key", "ca.pem");
        mutual.validate("grpc.tls").unwrap();
        assert!(mutual.is_mutual());
    }

    #[test]
    fn a_bad_server_file_is_refused_naming_its_field() {
        let p = pki();
        for (s, want, says) in [
            (
                server(&p, "missing.pem", "server.key", ""),
                "grpc.tls.cert_path",
                "cannot read",
            ),
            (
                server(&p, "garbage.pem", "server.key", ""),
                "grpc.tls.cert_path",
                "no PEM certificate",
            ),
            (
                server(&p, "server.key", "server.key", ""),
                "grpc.tls.cert_path",
                "no PEM certificate",
            ),
            (
                server(&p, "server.pem", "server.pem", ""),
                "grpc.tls.key_path",
                "no PEM private key",
            ),
            (
                server(&p, "server.pem", "client.key", ""),
                "grpc.tls.key_path",
                "not usable",
            ),
            (
                server(&p, "server.pem", "server.key", "gone.pem"),
                "grpc.tls.client_ca_path",
                "cannot read",
            ),
            (
                server(&p, "server.pem", "server.key", "garbage.pem"),
                "grpc.tls.client_ca_path",
                "no PEM",
            ),
        ] {
            let (field, problem) = field(s.validate("grpc.tls"));
            assert_eq!(field, want, "{problem}");
            assert!(problem.contains(says), "{field}: {problem}");
        }
        let empty = ServerTls::default();
        assert_eq!(field(empty.validate("grpc.tls")).0, "grpc.tls.cert_path");
    }

    #[test]
    fn a_client_section_needs_its_roots_and_both_halves_of_a_client_certificate() {
        let p = pki();
        let good = ClientTls {
            ca_path: p.path("ca.pem"),
            cert_path: p.path("client.pem"),
            key_path: p.path("client.key"),
            domain: String::new(),
        };
        good.validate("upstreams.tls").unwrap();
        let roots_only = ClientTls {
            ca_path: p.path("ca.pem"),
            ..Default::default()
        };
        roots_only.validate("upstreams.tls").unwrap();
        for (c, want) in [
            (ClientTls::default(), "upstreams.tls.ca_path"),
            (
                ClientTls {
                    key_path: String::new(),
                    ..good.clone()
                },
                "upstreams.tls.key_path",
            ),
            (
                ClientTls {
                    cert_path: String::new(),
                    ..good.clone()
                },
                "upstreams.tls.cert_path",
            ),
            (
                ClientTls {
                    key_path: p.path("server.key"),
                    ..good.clone()
                },
                "upstreams.tls.key_path",
            ),
            (
                ClientTls {
                    domain: "not a name".into(),
                    ..good.clone()
                },
                "upstreams.tls.domain",
            ),
        ] {
            assert_eq!(field(c.validate("upstreams.tls")).0, want);
        }
    }
}
