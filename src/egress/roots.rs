//! What a certificate this proxy is shown upstream is verified against — an origin's when a
//! tunnel is terminated, an `https://` parent proxy's: the public roots (webpki-roots) plus
//! the PEM certificates an operator adds (`tls_intercept.upstream_ca_file`,
//! `upstream_proxy.ca_file`).

use rustls::pki_types::{pem::PemObject, CertificateDer};
use rustls::RootCertStore;

/// The public roots, plus every certificate in `extra_pem`. `Err` says why `extra_pem` is
/// not usable (unreadable PEM, an invalid certificate, no certificate at all).
pub fn public_and(extra_pem: Option<&[u8]>) -> Result<RootCertStore, String> {
    let mut roots = RootCertStore::empty();
    roots.extend(webpki_roots::TLS_SERVER_ROOTS.iter().cloned());
    if let Some(pem) = extra_pem {
        let mut added = 0;
        for c in CertificateDer::pem_slice_iter(pem) {
            let c = c.map_err(|e| e.to_string())?;
            roots.add(c).map_err(|e| e.to_string())?;
            added += 1;
        }
        if added == 0 {
            return Err("no PEM certificate in it".into());
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
        assert!(public_and(Some(b"not a certificate"))
            .unwrap_err()
            .contains("no PEM"));
    }
}
