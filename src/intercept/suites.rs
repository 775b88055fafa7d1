//! The cipher suites of the proxy's own TLS legs in a terminated tunnel: the one it serves to
//! the sandbox (with a minted certificate) and the one it opens to the origin. The same suites
//! as rustls' *ring* provider, in another order: AES-128-GCM with SHA-256 first. A handshake's
//! key schedule and transcript run on its hash, and SHA-256 has instructions of its own on the
//! x86-64 and ARMv8 machines this runs on where SHA-384 does not; the AES-256 suites stay
//! offered and accepted, after it. The proxy's side chooses on the leg it serves
//! (`ignore_client_order`), so a client that lists AES-256 first still gets AES-128.

use std::sync::Arc;

use rustls::crypto::CryptoProvider;
use rustls::CipherSuite;

/// rustls' *ring* provider with the SHA-384 suites after the others.
pub fn provider() -> Arc<CryptoProvider> {
    let mut p = rustls::crypto::ring::default_provider();
    // A stable sort: the order within each group is rustls'.
    p.cipher_suites.sort_by_key(|s| sha384(s.suite()));
    Arc::new(p)
}

fn sha384(s: CipherSuite) -> bool {
    matches!(
        s,
        CipherSuite::TLS13_AES_256_GCM_SHA384
            | CipherSuite::TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384
            | CipherSuite::TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_same_suites_with_aes_128_first() {
        let ours: Vec<_> = provider().cipher_suites.iter().map(|s| s.suite()).collect();
        let mut theirs: Vec<_> = (rustls::crypto::ring::default_provider().cipher_suites)
            .iter()
            .map(|s| s.suite())
            .collect();
        assert_eq!(ours[0], CipherSuite::TLS13_AES_128_GCM_SHA256);
        assert_eq!(ours.len(), theirs.len());
        let mut sorted = ours.clone();
        sorted.sort_by_key(|s| u16::from(*s));
        theirs.sort_by_key(|s| u16::from(*s));
        assert_eq!(sorted, theirs);
    }
}
