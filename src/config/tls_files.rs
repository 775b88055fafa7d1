//! The certificate and key files a configuration names for TLS — the TLS listeners'
//! (`listen.proxy_tls`, `listen.admin_tls`) and the interception CA's certificate
//! (`tls_intercept.ca_cert_file`) — checked at load, one way for all: a file that cannot be
//! read is an error naming its line for `run` and a warning for the review tools (it may live
//! in a Secret that only the running proxy sees); a file that is read but is not what the key
//! asks for (no PEM certificate, no private key, a leaf given as the interception CA) is an
//! error for both.

use std::path::Path;

use rustls::pki_types::pem::PemObject;
use rustls::pki_types::PrivateKeyDer;

use super::error::Sink;
use super::Secrets;

/// What a file must hold.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) enum Holds {
    /// One or more PEM certificates (a server chain, a client CA).
    Certificates,
    /// A PEM private key.
    Key,
    /// A PEM certificate with `basicConstraints CA:TRUE` (it signs the leaves it makes).
    CaCertificate,
}

/// Why a file does not do.
#[derive(Debug, PartialEq, Eq)]
pub(super) enum Problem {
    Unreadable(String),
    Wrong(String),
}

/// Check what `path` holds.
pub(super) fn check(path: &Path, holds: Holds) -> Result<(), Problem> {
    let bytes = std::fs::read(path)
        .map_err(|e| Problem::Unreadable(format!("cannot read {}: {e}", path.display())))?;
    let wrong = |why: &str| Problem::Wrong(format!("{}: {why}", path.display()));
    if holds == Holds::Key {
        return PrivateKeyDer::from_pem_slice(&bytes)
            .map(drop)
            .map_err(|_| wrong("no PEM private key in it"));
    }
    // The check every operator CA file gets: PEM certificates, at least one, each valid.
    let certs = super::files::certificates(&bytes).map_err(|e| wrong(&e.to_string()))?;
    if let (Holds::CaCertificate, Some(first)) = (holds, certs.first()) {
        let (_, cert) = x509_parser::parse_x509_certificate(first)
            .map_err(|_| wrong("an invalid certificate"))?;
        if !cert.is_ca() {
            return Err(wrong(
                "not a CA certificate (no basicConstraints CA:TRUE): clients would refuse every \
                 certificate it signs; `egress-proxy ca init DIR` makes one",
            ));
        }
    }
    Ok(())
}

/// Check `path` for `field` and say what is wrong: an unreadable file is a warning under
/// [`Secrets::MayBeAbsent`], everything else an error (its line found by the file's name).
pub(super) fn report(
    path: &Path,
    field: &str,
    holds: Holds,
    secrets: Secrets,
    sink: &mut Sink<'_>,
    warnings: &mut Vec<String>,
) {
    let hint = path.file_name().map(|n| n.to_string_lossy().into_owned());
    match (check(path, holds), secrets) {
        (Ok(()), _) => {}
        (Err(Problem::Unreadable(why)), Secrets::MayBeAbsent) => {
            warnings.push(format!("{field}: {why}; {}", super::ABSENT_SECRET_NOTE));
        }
        (Err(Problem::Unreadable(why) | Problem::Wrong(why)), _) => {
            sink.top(field, why, hint.as_deref());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn files_are_checked_for_what_they_hold() {
        let dir = tempfile::tempdir().unwrap();
        let ca_key = rcgen::KeyPair::generate().unwrap();
        let mut ca = rcgen::CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.is_ca = rcgen::IsCa::Ca(rcgen::BasicConstraints::Unconstrained);
        let ca = ca.self_signed(&ca_key).unwrap();
        let leaf_key = rcgen::KeyPair::generate().unwrap();
        let leaf = rcgen::CertificateParams::new(vec!["a.test".into()])
            .unwrap()
            .self_signed(&leaf_key)
            .unwrap();
        let write = |name: &str, text: &str| {
            let p = dir.path().join(name);
            std::fs::write(&p, text).unwrap();
            p
        };
        let ca_pem = write("ca.pem", &ca.pem());
        let leaf_pem = write("leaf.pem", &leaf.pem());
        let key_pem = write("key.pem", &leaf_key.serialize_pem());
        let junk = write("junk.pem", "not pem");
        assert_eq!(check(&ca_pem, Holds::CaCertificate), Ok(()));
        assert_eq!(check(&leaf_pem, Holds::Certificates), Ok(()));
        assert_eq!(check(&key_pem, Holds::Key), Ok(()));
        assert!(
            matches!(check(&leaf_pem, Holds::CaCertificate), Err(Problem::Wrong(w)) if w.contains("not a CA certificate"))
        );
        assert!(matches!(
            check(&junk, Holds::Certificates),
            Err(Problem::Wrong(_))
        ));
        assert!(matches!(
            check(&leaf_pem, Holds::Key),
            Err(Problem::Wrong(_))
        ));
        assert!(matches!(
            check(&dir.path().join("absent.pem"), Holds::Key),
            Err(Problem::Unreadable(_))
        ));
    }
}
