//! The upgrade of a terminated request to a WebSocket, after the pipeline allowed it (rules,
//! decider, DLP, credentials on the handshake): sent upstream with the proxy's own upgrade
//! headers and no compression offer; only a `101` the proxy can read switches, and then the
//! socket is parked with the exchange, to be relayed frame by frame
//! ([`crate::intercept::websocket`]) once both sides have handed over their streams. Any
//! other answer is an ordinary response.

use std::sync::Arc;

use http::{HeaderMap, HeaderValue, Request, Response};
use http_body_util::BodyExt;

use super::{Prepared, ResBody, Sent, Terminated, UpBody};
use crate::audit::AuditGuard;
use crate::intercept::websocket::{self, Foreign, Now, Socket, Still, Swaps};
use crate::pipeline::head::{Head, HeadVerdict, HostRules};
use crate::policy::protocols::websocket::WsRule;
use crate::policy::protocols::Protocol;
use crate::policy::reason::Reason;
use crate::policy::{Enforcement, Verdict};
use crate::relay::counted::Counted;

/// A socket relayed once the connection has switched: run by the tunnel after its HTTP
/// connection hands over the stream.
pub type Parked =
    std::pin::Pin<Box<dyn std::future::Future<Output = crate::audit::outcome::Close> + Send>>;

impl Terminated<'_> {
    /// Send the handshake `req` upstream; a `101` the proxy can read parks the socket and
    /// answers the client `101`, anything else is answered as an ordinary response.
    pub(super) async fn socket(
        &self,
        mut req: Request<UpBody>,
        (rule, p): (Arc<Protocol>, &Arc<Prepared>),
        mut audit: AuditGuard,
        sent: Sent,
    ) -> Response<ResBody> {
        let Protocol::WebSocket(ws) = &*rule else {
            return self.ex.refused(
                &sent.asked.method,
                Reason::WebSocketNotAllowed,
                "not a websocket rule",
            );
        };
        let client = hyper::upgrade::on(&mut req);
        let scrubber = p.scrubber_for(&self.ex.mint, req.headers());
        let h2 = self.ex.upstream.is_h2();
        websocket::upstream_headers(req.headers_mut(), h2);
        let uri = req.uri().clone();
        let req = req.map(|b| Counted::new(b, self.ex.live.clone(), true));
        let mut resp = match self.ex.upstream.send(req, None).await {
            Ok((r, _)) => r,
            Err(e) => {
                let why = format!("the upstream failed: {e}");
                audit.answered(0, sent.injected.as_deref());
                audit.verdict(Verdict::Allow, Reason::ConnectionRefused);
                audit.detail(why.clone());
                drop(audit);
                return self
                    .ex
                    .refused(&sent.asked.method, Reason::ConnectionRefused, &why);
            }
        };
        let switch = match h2 {
            true => http::StatusCode::OK,
            false => http::StatusCode::SWITCHING_PROTOCOLS,
        };
        if resp.status() != switch {
            return self
                .response(resp, audit, (scrubber, None, None), sent)
                .await;
        }
        if let Some(why) = websocket::not_switched(resp.headers(), h2) {
            // The origin's fault, and frames the proxy could not read: 502, as a body it
            // cannot scan (review 7b: the docs said 502 and the answer was 403).
            let reason = Reason::UnscannableResponse;
            audit.answered(reason.status(), sent.injected.as_deref());
            audit.verdict(Verdict::Deny, reason);
            audit.detail(why);
            drop(audit);
            return self.ex.refused(&sent.asked.method, reason, why);
        }
        let origin = hyper::upgrade::on(&mut resp);
        audit.answered(switch.as_u16(), sent.injected.as_deref());
        audit.open();
        let socket = self.reader(ws, (p, scrubber), &sent, uri);
        let parked: Parked = Box::pin(async move {
            match tokio::try_join!(client, origin) {
                Ok((c, o)) => socket.run(c, o, audit).await,
                Err(e) => {
                    audit.detail(format!("websocket: the switch failed: {e}"));
                    crate::audit::outcome::Close::Error
                }
            }
        });
        self.park(parked, h2);
        let mut out = Response::new(
            http_body_util::Empty::new()
                .map_err(|never| match never {})
                .boxed(),
        );
        *out.status_mut() = switch;
        *out.headers_mut() = websocket::client_headers(resp.headers(), h2);
        out
    }

    /// What reads the socket's messages: its rule and the credentials, scanners and records
    /// of this host under the binding `p`.
    fn reader(
        &self,
        ws: &WsRule,
        (p, scrubber): (&Prepared, Option<Arc<crate::intercept::scrub::Scrubber>>),
        sent: &Sent,
        uri: http::Uri,
    ) -> Socket {
        let (replace, foreign) = self.message_credentials(p);
        Socket {
            rule: Arc::new(ws.clone()),
            credentialed: !p.bound.is_empty(),
            replace,
            foreign,
            scrubber,
            dlp: p.binding.dlp.clone(),
            report: p.binding.enforcement == Enforcement::Report,
            flow: crate::pipeline::flow::Phase::of(
                &p.binding,
                Some(&self.ex.mint.flows),
                self.ex.dest.process.as_deref(),
            )
            .map(|f| crate::pipeline::flow::Gate::new(&f, &self.ex.dest.host, self.ex.dest.port)),
            live: self.ex.live.clone(),
            recorder: self.ex.recorder.clone(),
            asked: (sent.asked.method.clone(), sent.asked.path.clone()),
            still: self.still(uri),
            ending: self.ex.sockets.ending.subscribe(),
            counts: Default::default(),
            pings: Default::default(),
            reflected: Default::default(),
        }
    }

    /// Run the socket once it has switched: on HTTP/2 as a task beside the connection's other
    /// streams; on HTTP/1.1 parked for the tunnel, whose connection is the socket once the
    /// `101` is written.
    fn park(&self, parked: Parked, h2: bool) {
        if h2 {
            drop(tokio::spawn(parked));
        } else if let Ok(mut slot) = self.ex.sockets.parked.lock() {
            *slot = Some(parked);
        }
    }

    /// The credentials a socket's messages read: placeholders of the `replace_placeholder`
    /// credentials bound here (replaced in the sandbox's messages), and those of credentials
    /// bound elsewhere (refused in them).
    fn message_credentials(&self, p: &Prepared) -> (Swaps, Foreign) {
        let host = self.ex.dest.host.as_str();
        let replace = p
            .bound
            .iter()
            .filter_map(|k| {
                let secret = k.kind.message_secret()?;
                Some((
                    k.placeholder.as_bytes().to_vec(),
                    secret.as_bytes().to_vec(),
                ))
            })
            .filter(|(ph, _)| !ph.is_empty())
            .collect();
        let foreign = p
            .binding
            .credentials
            .iter()
            .filter(|c| !c.bound_to(host) && !c.placeholder.is_empty())
            .map(|c| (c.name.clone(), c.placeholder.as_bytes().to_vec()))
            .collect();
        (replace, foreign)
    }

    /// Whether the policy in force still allows the socket opened on `uri`: its sandbox is
    /// registered and a `protocol: websocket` rule still allows the upgrade (its rule now).
    fn still(&self, uri: http::Uri) -> Still {
        let current = self.ex.current.clone();
        let host = self.ex.dest.host.clone();
        let process = self.ex.dest.process.clone();
        let mut headers = HeaderMap::new();
        headers.insert(http::header::UPGRADE, HeaderValue::from_static("websocket"));
        Box::new(move || {
            let Some((binding, _)) = current() else {
                return Now::Refused("the sandbox is no longer registered".into());
            };
            let head = Head {
                method: &http::Method::GET,
                uri: &uri,
                headers: &headers,
                has_body: false,
                upgrade: true,
                extended: false,
            };
            match HostRules::of(&binding, &host, process.as_deref()).judge(&host, head) {
                HeadVerdict::Socket(p) => match &*p {
                    Protocol::WebSocket(r) => Now::Allowed(Arc::new(r.clone())),
                    _ => Now::Refused("the rule that allowed the socket is gone".into()),
                },
                HeadVerdict::Refused(r) => Now::Refused(format!(
                    "the policy in force no longer allows this socket: {}",
                    r.detail
                )),
                _ => Now::Refused("the policy in force no longer allows the socket".into()),
            }
        })
    }
}

/// Only a socket a rule allowed switches protocols: any other request loses its `Upgrade`.
pub(super) fn no_switch(socket: &Option<Arc<Protocol>>, req: &mut Request<UpBody>) {
    if socket.is_none() && req.headers().contains_key(http::header::UPGRADE) {
        req.headers_mut().remove(http::header::UPGRADE);
        req.headers_mut().remove(http::header::CONNECTION);
    }
}

/// A tunnel's WebSockets: the socket the last HTTP/1.1 upgrade opened, relayed once the
/// connection hands over, and the signal that tells open sockets the tunnel is stopped (so
/// that they close with a reason first).
pub struct Sockets {
    parked: std::sync::Mutex<Option<Parked>>,
    ending: Arc<tokio::sync::watch::Sender<Option<crate::audit::outcome::Close>>>,
}

impl Default for Sockets {
    fn default() -> Self {
        Sockets {
            parked: std::sync::Mutex::new(None),
            ending: Arc::new(tokio::sync::watch::channel(None).0),
        }
    }
}

impl Sockets {
    /// Told when the tunnel is stopped: open sockets close with a reason first.
    pub fn ending(&self) -> Arc<tokio::sync::watch::Sender<Option<crate::audit::outcome::Close>>> {
        self.ending.clone()
    }

    /// The socket parked by the last upgrade, if any (taken once).
    pub fn take_parked(&self) -> Option<Parked> {
        self.parked.lock().ok().and_then(|mut s| s.take())
    }
}
