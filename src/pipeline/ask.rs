//! The decider's phase of the request pipeline: after the head and body rules allowed a
//! request, and before the DLP phase, the quota, the credentials and the send, the sandbox's
//! decider (when it has one) is asked about it. One phase for every path that reads requests —
//! forwarded plain HTTP, plain HTTP served request by request inside a tunnel, terminated
//! requests — with one question: the method, target and headers (without credentials), and the
//! body when the decider asks for it (up to `need_body_max`; the bytes shown are the bytes
//! sent). Its header edits are made on every path. A request the rules refused is never asked
//! about, so a refused request reaches no decider and spends nothing.
//!
//! The pipeline says what it needs ([`Asker`], [`Prefix`]); the decider implements [`Asker`]
//! (`decider::request`) and each path's body type implements [`Prefix`], so this phase neither
//! knows how a decider is reached nor how a body is read.

use std::future::Future;
use std::pin::Pin;

use bytes::Bytes;
use http::{HeaderMap, HeaderName, HeaderValue, Method, Request, Uri};

use super::Refusal;
use crate::audit::AuditGuard;
use crate::config::Binding;
use crate::policy::Verdict;

/// A future the phase waits on, boxed so that [`Asker`] can be a trait object.
pub type Pending<'a, T> = Pin<Box<dyn Future<Output = T> + Send + 'a>>;

/// What the decider is asked about: the request as the rules allowed it.
pub struct About {
    /// `http` (plain, forwarded or in a tunnel) or `https` (terminated).
    pub protocol: &'static str,
    /// The decided host.
    pub host: String,
    /// The decided port.
    pub port: u16,
    /// The request's method.
    pub method: Method,
    /// Its target.
    pub uri: Uri,
    /// Its headers as the sandbox sent them (the decider's question leaves credentials out).
    pub headers: HeaderMap,
}

/// Why a body could not be shown (then it cannot be sent either: the request is refused).
#[derive(Debug, thiserror::Error)]
pub enum ShowError {
    /// Reading it failed.
    #[error("reading the body for the decider: {0}")]
    Read(#[source] Box<dyn std::error::Error + Send + Sync>),
    /// It ends with trailers, which a shown prefix cannot carry.
    #[error("a body with trailers cannot be shown to the decider")]
    Trailers,
}

/// A request body the decider may be shown: up to `max` bytes and whether there is more; the
/// body stays sendable (the same bytes, then the rest).
pub trait Shows: Send {
    /// Up to `max` bytes, and whether the body is longer; `Err` with why it could not be read.
    fn show(&mut self, max: usize) -> Pending<'_, Result<(Bytes, bool), ShowError>>;
}

/// What the decider's answer asks of the request.
pub enum Told {
    /// Send it, with these headers set and removed.
    Allow {
        /// Headers to set.
        set: Vec<(HeaderName, HeaderValue)>,
        /// Headers to remove.
        remove: Vec<HeaderName>,
    },
    /// Refuse it (the decider said no, or could not answer under `on_error: deny`).
    Refuse(Refusal),
}

/// The answer, with the record's note of it (`decider`).
pub struct Asked {
    /// What the record says the decider answered.
    pub note: String,
    /// What the request must do.
    pub told: Told,
}

/// Who answers: the external decider ([`crate::config::decider`]), through whatever client
/// the process keeps.
pub trait Asker: Send + Sync {
    /// Ask about `about`, a request of `binding` (which has a decider); `body` is shown when
    /// the decider asks for it.
    fn ask<'a>(
        &'a self,
        binding: &'a Binding,
        about: About,
        body: &'a mut dyn Shows,
    ) -> Pending<'a, Asked>;
}

/// A request body type the phase can show a prefix of.
pub trait Prefix: Sized + Send {
    /// Read up to `max` bytes: the body that sends the same bytes and then the rest, the bytes
    /// read (at most `max`), and whether there are more.
    fn prefix(
        self,
        max: usize,
    ) -> impl Future<Output = Result<(Self, Bytes, bool), ShowError>> + Send;
    /// A body that stands in while the real one is read.
    fn stand_in() -> Self;
}

/// A request whose body is shown through [`Prefix`].
struct Shown<'r, B>(&'r mut Request<B>);

impl<B: Prefix> Shows for Shown<'_, B> {
    fn show(&mut self, max: usize) -> Pending<'_, Result<(Bytes, bool), ShowError>> {
        Box::pin(async move {
            let body = std::mem::replace(self.0.body_mut(), B::stand_in());
            let (body, shown, more) = body.prefix(max).await?;
            *self.0.body_mut() = body;
            Ok((shown, more))
        })
    }
}

/// The phase: ask `asker` about `req` (to `host`:`port` over `protocol`) when `binding` has a
/// decider and the request is allowed so far (`verdict`), make its header edits, and say what
/// verdict the request goes on with — in report mode a refusal lets it go on, recorded
/// `report` with `how` — or refuse it, recorded.
pub async fn phase<B: Prefix>(
    asker: &dyn Asker,
    binding: &Binding,
    (protocol, host, port): (&'static str, &str, u16),
    req: &mut Request<B>,
    (verdict, how): (Verdict, &str),
    audit: &mut AuditGuard,
) -> Result<Verdict, Refusal> {
    if binding.decider.is_none() || verdict != Verdict::Allow {
        return Ok(verdict);
    }
    let about = About {
        protocol,
        host: host.to_string(),
        port,
        method: req.method().clone(),
        uri: req.uri().clone(),
        headers: req.headers().clone(),
    };
    let asked = asker.ask(binding, about, &mut Shown(req)).await;
    audit.decider(asked.note);
    match asked.told {
        Told::Allow { set, remove } => {
            for n in &remove {
                req.headers_mut().remove(n);
            }
            for (n, v) in set {
                req.headers_mut().insert(n, v);
            }
            Ok(verdict)
        }
        Told::Refuse(r) => super::reported(binding, r, how, audit).map(|()| Verdict::Report),
    }
}
