//! What the process watches while it serves: its configuration files (a reload on change),
//! the TLS listeners' certificate files, SIGHUP/SIGUSR1 (reload, reopen the audit file), and
//! SIGTERM/SIGINT (shutdown).

use std::sync::Arc;
use std::time::Duration;

use tokio::signal::unix::Signal;

use crate::audit::AuditLog;
use crate::control::Controller;

/// The signals the process answers, registered before it serves. A signal's default action
/// ends the process at once: a SIGTERM (or SIGHUP, SIGUSR1) that came after the listeners were
/// up and `/readyz` said ready, but before its handler was registered, stopped the proxy
/// without draining and without the audit trail's final checkpoint.
pub(super) struct Signals {
    /// SIGTERM and SIGINT: shut down.
    stop: Option<(Signal, Signal)>,
    /// SIGHUP and SIGUSR1: reload, reopen the audit file.
    reload: Option<(Signal, Signal)>,
}

impl Signals {
    /// Register the handlers now (a signal that arrives before it is awaited is kept).
    pub(super) fn install() -> Self {
        use tokio::signal::unix::{signal, SignalKind};
        let pair = |a: SignalKind, b: SignalKind| signal(a).ok().zip(signal(b).ok());
        Signals {
            stop: pair(SignalKind::terminate(), SignalKind::interrupt()),
            reload: pair(SignalKind::hangup(), SignalKind::user_defined1()),
        }
    }

    /// What SIGHUP and SIGUSR1 do, from now on ([`reload_on_sighup`]).
    pub(super) fn reloads(
        &mut self,
        control: Arc<Controller>,
        audit: Arc<AuditLog>,
    ) -> impl std::future::Future<Output = ()> + Send + 'static {
        reload_on_sighup(control, audit, self.reload.take())
    }

    /// Until SIGTERM or SIGINT.
    pub(super) async fn stopped(self) {
        match self.stop {
            Some((mut term, mut int)) => {
                tokio::select! {
                    _ = term.recv() => {}
                    _ = int.recv() => {}
                }
            }
            None => {
                let _ = tokio::signal::ctrl_c().await;
            }
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
async fn reload_on_sighup(
    control: Arc<Controller>,
    audit: Arc<AuditLog>,
    signals: Option<(Signal, Signal)>,
) {
    let Some((mut hup, mut usr1)) = signals else {
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
