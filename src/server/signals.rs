//! What the process watches while it serves: its configuration files (a reload on change),
//! the TLS listeners' certificate files, SIGHUP/SIGUSR1 (reload, reopen the audit file), and
//! SIGTERM/SIGINT (shutdown).

use std::sync::Arc;
use std::time::Duration;

use crate::audit::AuditLog;
use crate::control::Controller;

pub(super) async fn wait_for_signal() {
    use tokio::signal::unix::{signal, SignalKind};
    match (
        signal(SignalKind::terminate()),
        signal(SignalKind::interrupt()),
    ) {
        (Ok(mut term), Ok(mut int)) => {
            tokio::select! {
                _ = term.recv() => {}
                _ = int.recv() => {}
            }
        }
        _ => {
            let _ = tokio::signal::ctrl_c().await;
        }
    }
}

/// Poll the TLS listener's certificate, key and client CA once a second; reload on change.
pub(super) async fn watch_tls_files(tls: Arc<crate::listen::explicit_tls::TlsServer>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let t = tls.clone();
        let r = tokio::task::spawn_blocking(move || t.reload_if_changed()).await;
        match r {
            Ok(Some(Ok(()))) => tracing::info!("listen.proxy_tls: certificate reloaded"),
            Ok(Some(Err(e))) => {
                tracing::warn!(error = %e, "listen.proxy_tls: new files not loaded; the previous certificate stays in force")
            }
            _ => {}
        }
    }
}

/// Poll the configuration's files once a second; reload when one changed. (Polling follows
/// symlinks, so a Kubernetes ConfigMap's atomic `..data` swap is seen too.)
pub(super) async fn watch_files(control: Arc<Controller>) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    loop {
        tick.tick().await;
        let c = control.clone();
        let _ = tokio::task::spawn_blocking(move || {
            if c.files_changed() {
                let _ = c.reload("file change");
            }
        })
        .await;
    }
}

/// SIGHUP reloads the configuration and reopens the audit file; SIGUSR1 only reopens it
/// (logrotate: move the file, then signal).
pub(super) async fn reload_on_sighup(control: Arc<Controller>, audit: Arc<AuditLog>) {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut hup), Ok(mut usr1)) = (
        signal(SignalKind::hangup()),
        signal(SignalKind::user_defined1()),
    ) else {
        return;
    };
    loop {
        tokio::select! {
            Some(()) = hup.recv() => {
                audit.reopen();
                let c = control.clone();
                let _ = tokio::task::spawn_blocking(move || c.reload("SIGHUP")).await;
            }
            Some(()) = usr1.recv() => audit.reopen(),
            else => return,
        }
    }
}
