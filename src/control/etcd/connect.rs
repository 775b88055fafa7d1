//! Connecting to etcd as `control_plane.etcd` says: endpoints, user and password (read from
//! `password_file` at each connection, never kept), TLS with a CA and an optional client
//! certificate, HTTP/2 keep-alive so that a silent peer is noticed within 15 s (a closed one at once).

use std::time::Duration;

use etcd_client::{Certificate, Client, ConnectOptions, Identity, TlsOptions};

use crate::config::EtcdConfig;

const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(10);
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(5);

/// Open a client. The channel connects lazily and reconnects by itself; this fails only on
/// bad settings or failed authentication.
pub(super) async fn connect(cfg: &EtcdConfig) -> Result<Client, String> {
    let mut opts = ConnectOptions::new()
        .with_connect_timeout(cfg.dial_timeout)
        // etcd refuses pings more often than every 5 s (`--grpc-keepalive-min-time`) by
        // closing the connection, so ping every 10 s.
        .with_keep_alive(KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT)
        .with_keep_alive_while_idle(true)
        .with_require_leader(true);
    if let (Some(user), Some(file)) = (&cfg.username, &cfg.password_file) {
        let password = std::fs::read_to_string(file)
            .map_err(|e| format!("password_file {}: {e}", file.display()))?;
        // etcd's auth tokens expire (simple tokens after 5 min): get a new one when they do.
        opts = opts
            .with_user(user.clone(), password.trim_end_matches(['\r', '\n']))
            .with_auto_token_refresh(true);
    }
    if let Some(tls) = &cfg.tls {
        let mut t = TlsOptions::new();
        if let Some(ca) = &tls.ca_file {
            let pem =
                std::fs::read(ca).map_err(|e| format!("tls.ca_file {}: {e}", ca.display()))?;
            t = t.ca_certificate(Certificate::from_pem(pem));
        }
        if let (Some(cert), Some(key)) = (&tls.cert_file, &tls.key_file) {
            let c = std::fs::read(cert)
                .map_err(|e| format!("tls.cert_file {}: {e}", cert.display()))?;
            let k =
                std::fs::read(key).map_err(|e| format!("tls.key_file {}: {e}", key.display()))?;
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
        Ok(Err(e)) => Err(format!("etcd: {e}")),
        Err(_) => Err("etcd: connecting timed out".into()),
    }
}
