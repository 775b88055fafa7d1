//! What a certificate this proxy is shown upstream is verified against — an origin's when a
//! tunnel is terminated, an `https://` parent proxy's: the public roots (webpki-roots) plus
//! the PEM certificates an operator adds (`tls_intercept.upstream_ca_file`,
//! `upstream_proxy.ca_file`).

use rustls::pki_types::{pem::PemObject, CertificateDer};
use rustls::RootCertStore;

/// Why an operator's PEM file cannot add roots.
#[derive(Debug, thiserror::Error)]
pub enum RootsError {
    #[error("not readable as PEM: {0}")]
    Pem(#[from] rustls::pki_types::pem::Error),
    #[error("an invalid certificate: {0}")]
    Certificate(#[from] rustls::Error),
    #[error("no PEM certificate in it")]
    Empty,
}

/// The public roots, plus every certificate in `extra_pem`. `Err` says why `extra_pem` is
/// not usable (unreadable PEM, an invalid certificate, no certificate at all).
pub fn public_and(extra_pem: Option<&[u8]>) -> Result<RootCertStore, RootsError> {
    let mut roots = RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(pem) = extra_pem {
        let mut added = 0;
        for c in CertificateDer::pem_slice_iter(pem) {
            roots.add(c?)?;
            added += 1;
        }
        if added == 0 {
            return Err(RootsError::Empty);
        }
    }
    Ok(roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn extra_certificates_are_added_and_an_empty_file_is_refused() {
        let public = public_and(None).unwrap().len();
        assert!(public > 100);
        let key = rcgen::KeyPair::generate().unwrap();
        let ca = rcgen::CertificateParams::new(Vec::<String>::new())
            .unwrap()
            .self_signed(&key)
            .unwrap();
        let two = format!("{}{}", ca.pem(), ca.pem());
        assert_eq!(public_and(Some(two.as_bytes())).unwrap().len(), public + 2);
        assert!(matches!(
            public_and(Some(b"not a certificate")),
            Err(RootsError::Empty)
        ));
    }
}
