//! The test CA: a certificate for every test name, tokens' digests and Basic values, and
//! the interception CA the binary makes (`ca init`).

#![allow(dead_code)]

use super::*;

/// Names the test certificate is valid for (the origins answer to all of them).
pub const CERT_NAMES: &[&str] = &[
    "api.test",
    "mcp.test",
    "github.com",
    "git.test",
    "granted.test",
    "pub.auto.test",
    "big.test",
    "slow.test",
    "private.test",
    "meta.test",
    "denied.test",
    "allowed.test",
    "forbidden.test",
    "port.test",
    "report.test",
    "other.test",
    "gone.test",
    "rev.test",
    "mixed.test",
    "s3.test",
    "auth.test",
    "api.github.com",
    "api.openai.test",
    "api.anthropic.test",
    "gemini.test",
    "plain-llm.test",
    "paths-llm.test",
    "api.corp.example",
    "db.corp.example",
    "files.corp.example",
    "secret.corp.example",
    "pypi.org",
];

/// Hex SHA-256 of a token, as `token_sha256` wants it.
pub fn sha(s: &str) -> String {
    hex::encode(Sha256::digest(s.as_bytes()))
}

/// A `Proxy-Authorization: Basic` value.
pub fn basic(user: &str, pass: &str) -> String {
    format!(
        "Basic {}",
        base64::engine::general_purpose::STANDARD.encode(format!("{user}:{pass}"))
    )
}

/// A test CA and a server certificate signed by it, written to `dir`.
pub struct TestCa {
    pub ca_pem: PathBuf,
    /// The server certificate and its key, as PEM files (for servers configured by path).
    pub cert_pem: PathBuf,
    pub key_pem: PathBuf,
    pub cert_der: Vec<u8>,
    pub key_der: Vec<u8>,
}

impl TestCa {
    pub fn generate(dir: &Path) -> TestCa {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca_params = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca_params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca_params
            .distinguished_name
            .push(rcgen::DnType::CommonName, "egress-proxy test CA");
        let ca = ca_params.self_signed(&ca_key).unwrap();
        let key = KeyPair::generate().unwrap();
        let mut params =
            CertificateParams::new(CERT_NAMES.iter().map(|s| s.to_string()).collect::<Vec<_>>())
                .unwrap();
        params
            .subject_alt_names
            .push(SanType::IpAddress("127.0.0.1".parse().unwrap()));
        let cert = params.signed_by(&key, &ca, &ca_key).unwrap();
        let ca_pem = dir.join("ca.pem");
        std::fs::write(&ca_pem, ca.pem()).unwrap();
        let cert_pem = dir.join("test-origin.pem");
        std::fs::write(&cert_pem, cert.pem()).unwrap();
        let key_pem = dir.join("test-origin.key");
        std::fs::write(&key_pem, key.serialize_pem()).unwrap();
        TestCa {
            ca_pem,
            cert_pem,
            key_pem,
            cert_der: cert.der().to_vec(),
            key_der: key.serialize_der(),
        }
    }
}

impl TestCa {
    /// A TLS server configuration presenting the test certificate, offering `alpn`.
    pub fn server_config(&self, alpn: &[&[u8]]) -> rustls::ServerConfig {
        let provider = Arc::new(rustls::crypto::ring::default_provider());
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_no_client_auth()
            .with_single_cert(
                vec![rustls::pki_types::CertificateDer::from(
                    self.cert_der.clone(),
                )],
                rustls::pki_types::PrivateKeyDer::Pkcs8(self.key_der.clone().into()),
            )
            .unwrap();
        cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        cfg
    }
}

/// `egress-proxy ca init DIR`: an interception CA (`DIR/ca.crt`, `DIR/ca.key`) for
/// `tls_intercept`.
pub fn ca_init(dir: &Path) {
    let out = Command::new(env!("CARGO_BIN_EXE_egress-proxy"))
        .args(["ca", "init"])
        .arg(dir)
        .output()
        .expect("the egress-proxy binary runs");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A rustls client configuration trusting only the certificates of the PEM file `roots`
/// (the test CA, or the proxy's interception CA), offering `alpn`.
pub fn client_config(roots: impl AsRef<Path>, alpn: &[&[u8]]) -> rustls::ClientConfig {
    use rustls::pki_types::{pem::PemObject, CertificateDer};
    let mut store = rustls::RootCertStore::empty();
    for c in CertificateDer::pem_file_iter(roots.as_ref()).unwrap() {
        store.add(c.unwrap()).unwrap();
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .unwrap()
        .with_root_certificates(store)
        .with_no_client_auth();
    cfg.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
    cfg
}
