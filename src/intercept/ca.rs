//! The interception CA: certificates for terminated hosts, issued on the fly (rcgen) by the
//! operator's CA (`tls_intercept.ca_cert_file` / `ca_key_file`) and cached; and
//! `egress-proxy ca init DIR`, which makes such a CA.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use rcgen::{
    BasicConstraints, CertificateParams, DistinguishedName, DnType, IsCa, KeyPair, KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};

/// Leaf certificates kept at most (the oldest half is dropped past this).
const CACHE_MAX: usize = 4096;

/// A leaf certificate and its key, DER.
pub struct Leaf {
    pub chain: Vec<CertificateDer<'static>>,
    pub key: Vec<u8>,
}

impl Leaf {
    pub fn key_der(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key.clone()))
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
    pub fn load(cert_file: &Path, key_file: &Path) -> Result<Self, String> {
        let cert_pem = std::fs::read_to_string(cert_file)
            .map_err(|e| format!("tls_intercept.ca_cert_file {}: {e}", cert_file.display()))?;
        let key_pem = std::fs::read_to_string(key_file)
            .map_err(|e| format!("tls_intercept.ca_key_file {}: {e}", key_file.display()))?;
        let key = KeyPair::from_pem(&key_pem)
            .map_err(|e| format!("tls_intercept.ca_key_file: not a private key (PEM): {e}"))?;
        let params = CertificateParams::from_ca_cert_pem(&cert_pem)
            .map_err(|e| format!("tls_intercept.ca_cert_file: not a CA certificate (PEM): {e}"))?;
        // Re-signing the parsed parameters gives an issuer with the same name and key: leaves
        // it signs chain to the operator's certificate.
        let issuer = params
            .self_signed(&key)
            .map_err(|e| format!("tls_intercept: the key does not fit the certificate: {e}"))?;
        let ca_der = rustls_pemfile_first_cert(&cert_pem)?;
        Ok(InterceptCa {
            issuer,
            key,
            ca_der,
            leaves: Mutex::new(HashMap::new()),
        })
    }

    /// The certificate presented for `host` (issued now, or from the cache).
    pub fn leaf(&self, host: &str) -> Result<Arc<Leaf>, String> {
        if let Some(l) = self.leaves.lock().ok().and_then(|m| m.get(host).cloned()) {
            return Ok(l);
        }
        let key = KeyPair::generate().map_err(|e| e.to_string())?;
        let mut params =
            CertificateParams::new(vec![host.to_string()]).map_err(|e| e.to_string())?;
        let mut dn = DistinguishedName::new();
        dn.push(DnType::CommonName, host);
        params.distinguished_name = dn;
        let now = time::OffsetDateTime::now_utc();
        params.not_before = now - time::Duration::hours(1);
        params.not_after = now + time::Duration::days(7);
        let cert = params
            .signed_by(&key, &self.issuer, &self.key)
            .map_err(|e| e.to_string())?;
        let leaf = Arc::new(Leaf {
            chain: vec![cert.der().clone(), self.ca_der.clone()],
            key: key.serialize_der(),
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

fn rustls_pemfile_first_cert(pem: &str) -> Result<CertificateDer<'static>, String> {
    use rustls::pki_types::pem::PemObject;
    CertificateDer::pem_slice_iter(pem.as_bytes())
        .next()
        .and_then(Result::ok)
        .ok_or_else(|| "tls_intercept.ca_cert_file: no certificate in the file".into())
}

/// `egress-proxy ca init DIR`: a new CA for interception, `DIR/ca.crt` (give it to sandboxes)
/// and `DIR/ca.key` (mode 0600; give it only to the proxy).
pub fn init(dir: &Path) -> Result<(), String> {
    std::fs::create_dir_all(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
    let (crt, key_path) = (dir.join("ca.crt"), dir.join("ca.key"));
    if crt.exists() || key_path.exists() {
        return Err(format!(
            "{} already holds a CA: remove it first (sandboxes that trust it must be told)",
            dir.display()
        ));
    }
    let key = KeyPair::generate().map_err(|e| e.to_string())?;
    let mut params = CertificateParams::new(Vec::<String>::new()).map_err(|e| e.to_string())?;
    params.is_ca = IsCa::Ca(BasicConstraints::Constrained(0));
    params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
    let mut dn = DistinguishedName::new();
    dn.push(DnType::CommonName, "egress-proxy interception CA");
    params.distinguished_name = dn;
    let now = time::OffsetDateTime::now_utc();
    params.not_before = now - time::Duration::hours(1);
    params.not_after = now + time::Duration::days(3650);
    let cert = params.self_signed(&key).map_err(|e| e.to_string())?;
    write_private(&key_path, key.serialize_pem().as_bytes())?;
    std::fs::write(&crt, cert.pem()).map_err(|e| format!("{}: {e}", crt.display()))?;
    Ok(())
}

fn write_private(path: &Path, bytes: &[u8]) -> Result<(), String> {
    use std::io::Write;
    use std::os::unix::fs::OpenOptionsExt;
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(0o600)
        .open(path)
        .map_err(|e| format!("{}: {e}", path.display()))?;
    f.write_all(bytes)
        .map_err(|e| format!("{}: {e}", path.display()))
}
