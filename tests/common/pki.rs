//! A certificate authority of the test's own, made with rcgen, that issues server and client
//! certificates (mutual TLS listeners, the console's certificate sign-in).

use std::path::{Path, PathBuf};

use rcgen::{BasicConstraints, CertificateParams, DnType, IsCa, KeyPair, SanType};

/// A CA in the test's directory: `<name>-ca.pem`, and what it issued beside it.
pub struct Pki {
    dir: PathBuf,
    ca: rcgen::Certificate,
    key: KeyPair,
    pub ca_pem: PathBuf,
}

impl Pki {
    pub fn new(dir: &Path, name: &str) -> Pki {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        p.distinguished_name.push(DnType::CommonName, name);
        let ca = p.self_signed(&key).unwrap();
        let ca_pem = dir.join(format!("{name}-ca.pem"));
        std::fs::write(&ca_pem, ca.pem()).unwrap();
        Pki {
            dir: dir.to_path_buf(),
            ca,
            key,
            ca_pem,
        }
    }

    /// Issue a certificate (CN `cn`, the given SANs) as `<file>.pem` / `<file>.key`.
    pub fn issue(&self, file: &str, cn: &str, sans: Vec<SanType>) -> (PathBuf, PathBuf) {
        let key = KeyPair::generate().unwrap();
        let mut p = CertificateParams::new(Vec::<String>::new()).unwrap();
        p.distinguished_name.push(DnType::CommonName, cn);
        p.subject_alt_names = sans;
        let cert = p.signed_by(&key, &self.ca, &self.key).unwrap();
        let (c, k) = (
            self.dir.join(format!("{file}.pem")),
            self.dir.join(format!("{file}.key")),
        );
        // Written to a temporary name and renamed, as a Secret rotation does.
        std::fs::write(self.dir.join("tmp.pem"), cert.pem()).unwrap();
        std::fs::write(self.dir.join("tmp.key"), key.serialize_pem()).unwrap();
        std::fs::rename(self.dir.join("tmp.key"), &k).unwrap();
        std::fs::rename(self.dir.join("tmp.pem"), &c).unwrap();
        (c, k)
    }
}
