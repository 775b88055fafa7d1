//! Connecting to etcd as `control_plane.etcd` says: endpoints, user and password (read from
//! `password_file` at each connection, never kept), TLS with a CA and an optional client
//! certificate, HTTP/2 keep-alive so that a silent peer is noticed within 15 s (a closed one at once).

use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};

use crate::config::EtcdConfig;

/// Why a client could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum EtcdError {
    #[error("control_plane.etcd.{what} {}: {source}", path.display())]
    File {
        what: &'static str,
        path: std::path::PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("etcd: {0}")]
    Client(#[from] etcd_client::Error),
    #[error("etcd: connecting timed out")]
    Timeout,
}

fn read(what: &'static str, path: &std::path::Path) -> Result<Vec<u8>, EtcdError> {
    std::fs::read(path).map_err(|source| EtcdError::File {
        what,
        path: path.to_path_buf(),
        source,
    })
}

const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Open a client. The channel connects lazily and reconnects by itself; this fails only on
/// bad settings or failed authentication.
pub(super) async fn connect(cfg: &EtcdConfig) -> Result<Client, EtcdError> {
    let mut opts = ConnectOptions::new()
        .with_connect_timeout(cfg.dial_timeout)
        // etcd refuses pings more often than every 5 s (`--grpc-keepalive-min-time`) by
        // closing the connection, so ping every 10 s.
        .with_keep_alive(KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT)
        .with_keep_alive_while_idle(true)
        .with_require_leader(true);
    if let (Some(user), Some(file)) = (&cfg.username, &cfg.password_file) {
        let password = String::from_utf8_lossy(&read("password_file", file)?).into_owned();
        // etcd's auth tokens expire (simple tokens after 5 min): get a new one when they do.
        opts = opts
            .with_user(user.clone(), password.trim_end_matches(['\r', '\n']))
            .with_auto_token_refresh(true);
    }
    if let Some(tls) = &cfg.tls {
        let mut t = TlsOptions::new();
        if let Some(ca) = &tls.ca_file {
            let pem = read("tls.ca_file", ca)?;
            t = t.ca_certificate(Certificate::from_pem(pem));
        }
        if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
            let c = read("tls.cert_file", cert)?;
            let k = read("tls.key_file", key)?;
            t = t.identity(Identity::from_pem(c, k));
        }
        opts = opts.with_tls(t);
    }
    match tokio::time::timeout(
        cfg.dial_timeout + cfg.request_timeout,
        Client::connect(&cfg.endpoints, Some(opts)),
    )
    .await
    {
        Ok(Ok(c)) => Ok(c),
        Ok(Err(e)) => Err(EtcdError::Client(e)),
        Err(_) => Err(EtcdError::Timeout),
    }
}
