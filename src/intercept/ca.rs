//! The interception CA: certificates for terminated hosts, issued on the fly (rcgen) by the
//! operator's CA (`tls_intercept.ca_cert_file` / `ca_key_file`) and cached; and
//! `egress-proxy ca init DIR`, which makes such a CA.

use super::error::InterceptError;
use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex, OnceLock};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// Leaf certificates kept at most (the oldest half is dropped past this).
const CACHE_MAX: usize = 4096;

/// A leaf certificate and its key, DER, with the TLS server configurations built from it
/// (one per ALPN the upstream chose: none, `http/1.1`, `h2`), built once.
pub struct Leaf {
    /// The leaf certificate, then the CA's.
    pub chain: Vec<CertificateDer<'static>>,
    /// The leaf's private key (PKCS#8 DER).
    pub key: Vec<u8>,
    configs: [OnceLock<Arc<rustls::ServerConfig>>; 3],
}

impl Leaf {
    /// The private key, as rustls takes it.
    pub fn key_der(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key.clone()))
    }

    /// The server configuration presenting this leaf and offering `alpn` (what the upstream
    /// chose), cached.
    pub fn server_config(
        &self,
        alpn: Option<&[u8]>,
    ) -> Result<Arc<rustls::ServerConfig>, rustls::Error> {
        let slot = match alpn {
            None => 0,
            Some(b"h2") => 2,
            Some(_) => 1,
        };
        if let Some(c) = self.configs[slot].get() {
            return Ok(c.clone());
        }
        let provider = super::suites::provider();
        let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
            .with_safe_default_protocol_versions()?
            .with_no_client_auth()
            .with_single_cert(self.chain.clone(), self.key_der())?;
        cfg.alpn_protocols = alpn.map(|p| vec![p.to_vec()]).unwrap_or_default();
        // Ours, not the client's, order of suites (`super::suites`).
        cfg.ignore_client_order = true;
        Ok(self.configs[slot].get_or_init(|| Arc::new(cfg)).clone())
    }
}

/// The CA and its cache of leaves.
pub struct InterceptCa {
    issuer: rcgen::Certificate,
    key: KeyPair,
    /// The CA certificate as the operator gave it (sent after each leaf).
    ca_der: CertificateDer<'static>,
    leaves: Mutex<HashMap<String, Arc<Leaf>>>,
}

impl InterceptCa {
    /// Load the CA certificate and key (PEM).
    pub fn load(cert_file: &Path, key_file: &Path) -> Result<Self, InterceptError> {
        const CERT: &str = "tls_intercept.ca_cert_file";
        const KEY: &str = "tls_intercept.ca_key_file";
        let cert_pem = std::fs::read_to_string(cert_file)
            .map_err(|e| InterceptError::file(CERT, cert_file, e))?;
        let key_pem = std::fs::read_to_string(key_file)
            .map_err(|e| InterceptError::file(KEY, key_file, e))?;
        let key = KeyPair::from_pem(&key_pem)
            .map_err(|e| InterceptError::content_caused(KEY, "not a private key (PEM)", e))?;
        let params = CertificateParams::from_ca_cert_pem(&cert_pem)
            .map_err(|e| InterceptError::content_caused(CERT, "not a CA certificate (PEM)", e))?;
        // Re-signing the parsed parameters gives an issuer with the same name and key: leaves
        // it signs chain to the operator's certificate.
        let issuer = params.self_signed(&key).map_err(|e| {
            InterceptError::content_caused(
                "tls_intercept",
                "the key does not fit the certificate",
                e,
            )
        })?;
        let ca_der = rustls_pemfile_first_cert(&cert_pem)?;
        Ok(InterceptCa {
            issuer,
            key,
            ca_der,
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The certificate presented for `host` (issued now, or from the cache).
    pub fn leaf(&self, host: &str) -> Result<Arc<Leaf>, InterceptError> {
        if let Some(l) = self.leaves.lock().ok().and_then(|m| m.get(host).cloned()) {
            return Ok(l);
        }
        let key = KeyPair::generate()?;
        let mut params = CertificateParams::new(vec![host.to_string()])?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, host);
        params.distinguished_name = dn;
        // What strict verifiers (Apple's, Go's with EKU checks) require of a server leaf.
        params.key_usages = vec![KeyUsagePurpose::DigitalSignature];
        params.extended_key_usages = vec![rcgen::ExtendedKeyUsagePurpose::ServerAuth];
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::days(7);
        let cert = params.signed_by(&key, &self.issuer, &self.key)?;
        let leaf = Arc::new(Leaf {
            chain: vec![cert.der().clone(), self.ca_der.clone()],
            key: key.serialize_der(),
            configs: Default::default(),
        });
        if let Ok(mut m) = self.leaves.lock() {
            if m.len() >= CACHE_MAX {
                let drop: Vec<String> = m.keys().take(CACHE_MAX / 2).cloned().collect();
                for k in drop {
                    m.remove(&k);
                }
            }
            m.insert(host.to_string(), leaf.clone());
        }
        Ok(leaf)
    }
}

fn rustls_pemfile_first_cert(pem: &str) -> Result<CertificateDer<'static>, InterceptError> {
    use rustls::pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()
        .and_then(Result::ok)
        .ok_or_else(|| {
            InterceptError::content("tls_intercept.ca_cert_file", "no certificate in the file")
        })
}

/// `egress-proxy ca init DIR [--permit DOMAIN]...`: a new CA for interception, `DIR/ca.crt`
/// (give it to sandboxes) and `DIR/ca.key` (mode 0600; give it only to the proxy). With
/// `permit`, the CA carries name constraints: clients accept what it signs only for names
/// under those domains, so a stolen key cannot impersonate anything else.
pub fn init(dir: &Path, permit: &[String]) -> Result<(), InterceptError> {
    let mut permitted = Vec::new();
    for d in permit {
        let name = crate::policy::hostname::normalize_name(d.trim_start_matches('.'))
            .map_err(|e| InterceptError::content_caused("ca init --permit", format!("`{d}`"), e))?;
        permitted.push(rcgen::GeneralSubtree::DnsName(name));
    }
    std::fs::create_dir_all(dir).map_err(|e| InterceptError::file("ca init", dir, e))?;
    let (crt, key_path) = (dir.join("ca.crt"), dir.join("ca.key"));
    if crt.exists() || key_path.exists() {
        return Err(InterceptError::Exists(dir.to_path_buf()));
    }
    let key = KeyPair::generate()?;
    let mut params = CertificateParams::new(Vec::<String>::new())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    if !permitted.is_empty() {
        params.name_constraints = Some(rcgen::NameConstraints {
            permitted_subtrees: permitted,
            excluded_subtrees: Vec::new(),
        });
    }
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "egress-proxy interception CA");
    params.distinguished_name = dn;
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(3650);
    let cert = params.self_signed(&key)?;
    write_private(&key_path, key.serialize_pem().as_bytes())
        .map_err(|e| InterceptError::file("ca init", &key_path, e))?;
    std::fs::write(&crt, cert.pem()).map_err(|e| InterceptError::file("ca init", &crt, e))?;
    Ok(())
}

fn write_private(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)?;
    f.write_all(bytes)
}
