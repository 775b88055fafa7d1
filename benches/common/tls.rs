//! TLS for the benches' own origins and clients: an upstream CA with one leaf (for the
//! origin), a client configuration trusting the proxy's interception CA and that upstream CA,
//! a connection to a host on a loopback port (through the proxy's CONNECT, or directly), and a
//! response head read without consuming what follows it.

use std::net::SocketAddr;
use std::path::Path;
use std::sync::Arc;

use rcgen::{BasicConstraints, CertificateParams, IsCa, KeyPair, SanType};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

/// An upstream CA, a certificate for `name` and 127.0.0.1 (DER) with its key (DER), and the
/// CA (PEM).
pub fn upstream_pki(name: &str) -> (Vec<u8>, Vec<u8>, String) {
    let ca_key = KeyPair::generate().expect("key");
    let mut ca = CertificateParams::new(Vec::<String>::new()).expect("params");
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    let ca_cert = ca.self_signed(&ca_key).expect("ca");
    let key = KeyPair::generate().expect("key");
    let mut p = CertificateParams::new(vec![name.into()]).expect("params");
    p.subject_alt_names
        .push(SanType::IpAddress("127.0.0.1".parse().expect("ip")));
    let cert = p.signed_by(&key, &ca_cert, &ca_key).expect("leaf");
    (cert.der().to_vec(), key.serialize_der(), ca_cert.pem())
}

/// A TLS acceptor for the leaf `cert`/`key` speaking HTTP/1.1.
pub fn acceptor(cert: Vec<u8>, key: Vec<u8>) -> tokio_rustls::TlsAcceptor {
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut cfg = rustls::ServerConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("tls")
        .with_no_client_auth()
        .with_single_cert(
            vec![rustls::pki_types::CertificateDer::from(cert)],
            rustls::pki_types::PrivateKeyDer::Pkcs8(key.into()),
        )
        .expect("cert");
    cfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    tokio_rustls::TlsAcceptor::from(Arc::new(cfg))
}

/// A client configuration (HTTP/1.1) trusting the interception CA in `dir/ica/ca.crt` and
/// `upstream_ca` (PEM).
pub fn client_config(dir: &Path, upstream_ca: &str) -> Arc<rustls::ClientConfig> {
    let mut roots = rustls::RootCertStore::empty();
    for pem in [
        std::fs::read(dir.join("ica/ca.crt")).expect("ca"),
        upstream_ca.as_bytes().to_vec(),
    ] {
        use rustls::pki_types::pem::PemObject;
        for c in rustls::pki_types::CertificateDer::pem_slice_iter(&pem) {
            roots.add(c.expect("pem")).expect("root");
        }
    }
    let provider = Arc::new(rustls::crypto::ring::default_provider());
    let mut ccfg = rustls::ClientConfig::builder_with_provider(provider)
        .with_safe_default_protocol_versions()
        .expect("tls")
        .with_root_certificates(roots)
        .with_no_client_auth();
    ccfg.alpn_protocols = vec![b"http/1.1".to_vec()];
    Arc::new(ccfg)
}

/// TLS to `host` on loopback `port`: through `proxy` (CONNECT) when given, else directly.
pub async fn connect(
    proxy: Option<SocketAddr>,
    host: &str,
    port: u16,
    cfg: Arc<rustls::ClientConfig>,
) -> tokio_rustls::client::TlsStream<tokio::net::TcpStream> {
    let tcp = match proxy {
        Some(p) => {
            let mut t = tokio::net::TcpStream::connect(p).await.expect("proxy");
            t.write_all(format!("CONNECT {host}:{port} HTTP/1.1\r\n\r\n").as_bytes())
                .await
                .expect("connect");
            let head = read_head(&mut t).await;
            assert!(
                head.starts_with(b"HTTP/1.1 200"),
                "CONNECT refused: {}",
                String::from_utf8_lossy(&head)
            );
            t
        }
        None => tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .expect("origin"),
    };
    let _ = tcp.set_nodelay(true);
    let name = rustls::pki_types::ServerName::try_from(host.to_string()).expect("name");
    tokio_rustls::TlsConnector::from(cfg)
        .connect(name, tcp)
        .await
        .expect("tls")
}

/// Read a response head byte by byte (nothing after it is consumed).
pub async fn read_head<S: tokio::io::AsyncRead + Unpin>(s: &mut S) -> Vec<u8> {
    let mut head = Vec::new();
    let mut b = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        s.read_exact(&mut b).await.expect("head");
        head.push(b[0]);
    }
    head
}

/// The `p` quantile of sorted samples (0 when there are none).
pub fn percentile(sorted: &[u32], p: f64) -> u32 {
    if sorted.is_empty() {
        return 0;
    }
    sorted[((sorted.len() - 1) as f64 * p).round() as usize]
}
