//! What a certificate this proxy is shown upstream is verified against — an origin's when a
//! tunnel is terminated, an `https://` parent proxy's: the public roots (webpki-roots) plus
//! the PEM certificates an operator adds (`tls_intercept.upstream_ca_file`,
//! `upstream_proxy.ca_file`), which the configuration has read and checked
//! ([`crate::config::files::certificates`]).

use rustls::pki_types::CertificateDer;
use rustls::RootCertStore;

use crate::config::files::{certificates, PemError};

/// The public roots, plus every certificate in `extra_pem`. `Err` says why `extra_pem` is
/// not usable (unreadable PEM, an invalid certificate, no certificate at all).
pub fn public_and(extra_pem: Option<&[u8]>) -> Result<RootCertStore, PemError> {
    let extra = match extra_pem {
        Some(pem) => certificates(pem)?,
        None => Vec::new(),
    };
    Ok(public_and_certificates(&extra))
}

/// The public roots, plus `extra` (certificates [`certificates`] accepted, so each is a
/// valid trust anchor).
pub fn public_and_certificates(extra: &[CertificateDer<'static>]) -> RootCertStore {
    let mut roots = RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    roots.add_parsable_certificates(extra.iter().cloned());
    roots
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
            Err(PemError::Empty)
        ));
    }
}
