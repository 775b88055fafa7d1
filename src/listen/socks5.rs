//! The SOCKS5 listener (`listen.socks5`): an adapter over the admission sequence
//! ([`crate::egress::admit`]). Per connection, top to bottom in [`serve`]:
//! - the greeting (its first byte within `admission.first_byte_ms`, the whole negotiation
//!   within `timeouts.header_ms`); username/password (RFC 1929) is chosen when offered — user
//!   the sandbox id, password its token — else no authentication, the sandbox known by the
//!   source address or `listen.default_sandbox`;
//! - [`admit::enter`] (identify, the global cap, the sandbox's limits) *before* the
//!   authentication is answered: a wrong token gets RFC 1929's failure, a client no sandbox
//!   claims gets "no acceptable method";
//! - the request: CONNECT only (BIND and UDP ASSOCIATE get "command not supported"); a name
//!   is resolved by the proxy (`socks5h` semantics), an address is judged by address rules and
//!   the guard; [`admit::Entered::admit`] decides, runs the verdict point and dials the checked
//!   address;
//! - success, then the tunnel's first bytes are judged and it is relayed like a CONNECT tunnel
//!   ([`super::connect::relay_opened`]), watched for revocation.
//!
//! A CONNECT to `egress-proxy.local` (port 80, or 443 with `tls_intercept`) is the proxy's
//! own endpoint ([`super::ask`]), answered here as over the HTTP listener: a SOCKS5-only
//! sandbox can ask for access and read its denials.
//!
//! A refusal's reply code is chosen for what clients print (curl, Python's `socksio`): policy,
//! guard and limits "connection not allowed by ruleset", a name that does not resolve or a
//! destination that does not answer "host unreachable", a refused connection "connection
//! refused". The reason itself is in the audit record, one per connection (`mode: "socks5"`).

use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpStream;
use tokio::sync::OwnedSemaphorePermit;
use tokio::time::Instant;

use crate::audit::accept::Accepted;
use crate::audit::{AuditGuard, Close, Mode};
use crate::egress::admit::{self, Admitted, Ask, AtCapacity, Door, Evidence, Seat};
use crate::egress::identity::Credentials;
use crate::egress::source_caps::UnidentifiedSlot;
use crate::policy::reason::Reason;
use crate::policy::target::Target;
use crate::policy::Decision;
use crate::relay::client_io::ClientIo;
use crate::runtime::Shared;
use crate::wire::socks5::{self, method, Command, Malformed, Reply, Step};

use super::connect::relay_opened;
use super::running::Running;

/// Serve one SOCKS5 connection. `unidentified` is its place among its address's connections
/// not yet identified (given back when a sandbox is identified, for a place under the cap).
pub async fn serve(
    shared: Arc<Shared>,
    accepted: Accepted,
    stream: TcpStream,
    unidentified: UnidentifiedSlot,
) {
    let set = shared.policy.load();
    let resolver = shared.resolver();
    let mut audit = shared.audit(&accepted, Mode::Socks5, &set);
    let cx = shared.cx(&set, &resolver);
    let deadline = Instant::now() + shared.settings.timeouts.header;
    let mut io = Negotiation {
        stream,
        buf: Vec::with_capacity(64),
        deadline,
    };
    let mut seat = Unidentified {
        shared: &shared,
        slot: Some(unidentified),
    };
    if !first_byte(&shared, &mut io, &seat, &mut audit).await {
        return;
    }
    // Boxed, and freed once admitted: awaited inline, its largest state (the login, the
    // resolution) would size the task every tunnel keeps for its whole life.
    let negotiated = Box::pin(negotiate(
        &cx,
        accepted.client.ip(),
        &mut io,
        &mut seat,
        &mut audit,
    ))
    .await;
    drop(seat);
    drop(set);
    match negotiated {
        Some(Negotiated::Admitted(admitted)) => {
            relay_admitted(&shared, io, *admitted, &mut audit).await;
        }
        Some(Negotiated::Local(entered, port)) => {
            // Boxed: the proxy's own endpoint is rare, and inline it would size every tunnel.
            Box::pin(serve_local(
                &shared,
                io,
                &entered,
                port,
                &mut audit,
                accepted.client,
            ))
            .await;
        }
        None => {}
    }
}

/// What a negotiation ends in: a destination admitted, or the proxy's own endpoint on `port`.
enum Negotiated {
    Admitted(Box<Admitted>),
    Local(admit::Entered, u16),
}

/// `CONNECT egress-proxy.local:80` (plain HTTP) or `:443` (TLS with a leaf from the
/// interception CA): success, then the endpoint's requests until the client closes. Any other
/// port, or 443 without `tls_intercept`, is refused.
async fn serve_local(
    shared: &Arc<Shared>,
    mut io: Negotiation,
    entered: &admit::Entered,
    port: u16,
    audit: &mut AuditGuard,
    client: std::net::SocketAddr,
) {
    let tls = port == 443;
    if !(port == 80 || tls && shared.settings.interceptor.is_some()) {
        audit.decision(&Decision::deny(Reason::InvalidTarget, None));
        audit.detail(match tls {
            true => "egress-proxy.local over https needs the proxy's tls_intercept CA: use port 80",
            false => "egress-proxy.local answers on port 80 (and 443 with tls_intercept)",
        });
        io.refuse(&socks5::reply(Reply::NotAllowed)).await;
        return;
    }
    if io
        .answer(&socks5::reply(Reply::Succeeded), audit)
        .await
        .is_none()
    {
        return;
    }
    let early = std::mem::take(&mut io.buf);
    let served =
        super::ask::serve_transparent(shared, entered, io.stream, early, tls, audit, client);
    if let Err(e) = served.await {
        audit.detail(format!("egress-proxy.local: {e}"));
        audit.close(Close::Error);
    }
}

/// The client's first byte within `admission.first_byte_ms`, unless its place is taken for a
/// newcomer first; `false` (recorded) when it stays silent.
async fn first_byte(
    shared: &Shared,
    io: &mut Negotiation,
    seat: &Unidentified<'_>,
    audit: &mut AuditGuard,
) -> bool {
    let Some(slot) = &seat.slot else {
        return false;
    };
    let wait = tokio::time::timeout(shared.admissions.first_byte(), io.more());
    let read = tokio::select! {
        r = wait => r,
        () = slot.evicted() => {
            audit.decision(&Decision::deny(Reason::ConnectionLimit, None));
            audit.close(Close::Limit);
            audit.detail("closed to make room: it had sent nothing and the unidentified pool was full");
            return false;
        }
    };
    slot.spoke();
    match read {
        Ok(Ok(())) => true,
        Ok(Err(failure)) => {
            failure.record(audit);
            false
        }
        Err(_) => {
            audit.close(Close::Idle);
            audit.detail("no SOCKS5 greeting within admission.first_byte_ms");
            false
        }
    }
}

/// Greeting, authentication, [`admit::enter`], the request and [`admit::Entered::admit`]:
/// the admitted exchange, or `None` once the client was answered and the guard holds why.
async fn negotiate(
    cx: &admit::Cx<'_>,
    source: IpAddr,
    io: &mut Negotiation,
    seat: &mut Unidentified<'_>,
    audit: &mut AuditGuard,
) -> Option<Negotiated> {
    let peer = first_look(cx, io);
    let methods = io.message(socks5::greeting, audit).await?;
    let (entered, login) = if methods.login {
        io.answer(&socks5::chosen(method::LOGIN), audit).await?;
        let whole = |b: &[u8]| {
            socks5::login(b).map(|step| match step {
                Step::More => Step::More,
                Step::Done(_, n) => Step::Done((), n),
            })
        };
        let n = io.complete(whole, audit).await?;
        let Ok(Step::Done(login, _)) = socks5::login(&io.buf[..n]) else {
            return None;
        };
        let credentials = Credentials::Login {
            user: login.user,
            password: login.password,
        };
        let door = door(source, Some(credentials), peer);
        let entered = admit::enter(cx, door, seat, audit);
        io.consume(n);
        (entered, true)
    } else if methods.none {
        (
            admit::enter(cx, door(source, None, peer), seat, audit),
            false,
        )
    } else {
        audit.decision(&Decision::deny(Reason::AuthRequired, None));
        audit.detail("the SOCKS5 greeting offers neither no-authentication nor username/password");
        io.refuse(&socks5::chosen(method::UNACCEPTABLE)).await;
        return None;
    };
    let accepted = match login {
        true => socks5::login_status(true),
        false => socks5::chosen(method::NONE),
    };
    let entered = match entered {
        Ok(e) => e,
        // No sandbox (a wrong token, an unknown sandbox, no credentials from an address no
        // sandbox claims): the authentication fails.
        Err(r) if r.sandbox.is_none() => {
            let failed = match login {
                true => socks5::login_status(false),
                false => socks5::chosen(method::UNACCEPTABLE),
            };
            io.refuse(&failed).await;
            return None;
        }
        // A sandbox over its limits: authenticated, then its request refused.
        Err(r) => {
            io.answer(&accepted, audit).await?;
            refuse_request(io, reply_for(r.shown.reason), audit).await;
            return None;
        }
    };
    io.answer(&accepted, audit).await?;
    let target = request(io, audit).await?;
    if super::ask::is_local(&target) {
        return Some(Negotiated::Local(entered, target.port));
    }
    match entered.admit(cx, Ask::to(target), audit).await {
        Ok(admitted) => Some(Negotiated::Admitted(Box::new(admitted))),
        Err(r) => {
            io.refuse(&socks5::reply(reply_for(r.shown.reason))).await;
            None
        }
    }
}

/// The first look at who holds the client's socket, before the greeting is read.
fn first_look(cx: &admit::Cx<'_>, io: &Negotiation) -> Option<crate::egress::attribution::Peer> {
    let o = cx.observer?;
    let s = &io.stream;
    let (client, dialed) = (s.peer_addr().ok()?, s.local_addr().ok()?);
    Some(crate::egress::attribution::Peer {
        client,
        dialed,
        first: o.first_look(client, dialed, cx.set.any_scoped()),
    })
}

/// Read the request of a client already refused (its target goes in the record), then answer
/// it with `reply`.
async fn refuse_request(io: &mut Negotiation, reply: Reply, audit: &mut AuditGuard) {
    if let Some(request) = io.message(socks5::request, audit).await {
        if let Ok(t) = Target::parse(&request.destination.authority(), None) {
            audit.target(&t);
        }
    }
    io.refuse(&socks5::reply(reply)).await;
}

/// The request, if it is a CONNECT to a valid target; otherwise answered and recorded.
async fn request(io: &mut Negotiation, audit: &mut AuditGuard) -> Option<Target> {
    let request = io.message(socks5::request, audit).await?;
    let target = Target::parse(&request.destination.authority(), None);
    if let Ok(t) = &target {
        audit.target(t);
    }
    if request.command != Command::Connect {
        audit.decision(&Decision::deny(Reason::ProtocolNotAllowed, None));
        audit.detail(format!(
            "SOCKS5 {} is not served: CONNECT only",
            request.command.name()
        ));
        io.refuse(&socks5::reply(Reply::CommandNotSupported)).await;
        return None;
    }
    match target {
        Ok(t) => Some(t),
        Err(_) => {
            audit.decision(&Decision::deny(Reason::InvalidTarget, None));
            audit.detail("the SOCKS5 destination is not a valid host name or address and port");
            io.refuse(&socks5::reply(Reply::GeneralFailure)).await;
            None
        }
    }
}

/// Answer success and relay until the end, idleness, revocation or shutdown.
async fn relay_admitted(
    shared: &Arc<Shared>,
    mut io: Negotiation,
    admitted: Admitted,
    audit: &mut AuditGuard,
) {
    // A SOCKS5 CONNECT never asks for a kept connection.
    let Some(running) = Running::start(shared, admitted, audit) else {
        return;
    };
    let succeeded = io.answer(&socks5::reply(Reply::Succeeded), audit).await;
    if succeeded.is_none() {
        return;
    }
    // What the client sent after its request, before the answer, is its first bytes.
    let early = std::mem::take(&mut io.buf);
    let client = ClientIo::Tcp(io.stream);
    let relayed = relay_opened(running, client, early, audit).await;
    audit.relayed(relayed);
}

/// The reply code a refusal's reason is shown as.
fn reply_for(reason: Reason) -> Reply {
    match reason {
        Reason::DnsError | Reason::DestinationNotFound | Reason::DnsTimeout => {
            Reply::HostUnreachable
        }
        Reason::ConnectionTimeout => Reply::HostUnreachable,
        Reason::ConnectionRefused => Reply::ConnectionRefused,
        Reason::AuditUnavailable | Reason::InvalidTarget | Reason::MalformedRequest => {
            Reply::GeneralFailure
        }
        _ => Reply::NotAllowed,
    }
}

/// A door with what the client presented, if anything.
fn door(
    source: IpAddr,
    credentials: Option<Credentials<'_>>,
    peer: Option<crate::egress::attribution::Peer>,
) -> Door<'_> {
    Door {
        source,
        evidence: Evidence::Presented { credentials },
        port: 0,
        peer,
    }
}

/// The SOCKS5 listener's place under the global cap: identified, a connection leaves its
/// address's unidentified allowance and takes a place under the cap, held with the sandbox's
/// slot until the tunnel ends.
struct Unidentified<'a> {
    shared: &'a Shared,
    slot: Option<UnidentifiedSlot>,
}

impl Seat for Unidentified<'_> {
    fn identified(&mut self) -> Result<Option<OwnedSemaphorePermit>, AtCapacity> {
        let place = self.shared.take_cap().ok_or(AtCapacity)?;
        if let Some(slot) = self.slot.take() {
            self.shared.admissions.identified(slot.source());
        }
        Ok(Some(place))
    }
}

/// The client's stream while the negotiation is read, with what was read and not yet used.
struct Negotiation {
    stream: TcpStream,
    buf: Vec<u8>,
    /// The whole negotiation ends by then (`timeouts.header_ms`).
    deadline: Instant,
}

/// Why a negotiation stopped before its message was whole.
enum Failure {
    Closed,
    Io(std::io::Error),
    TimedOut,
    Malformed(Malformed),
}

impl Failure {
    fn record(&self, audit: &mut AuditGuard) {
        match self {
            Failure::Closed => {
                audit.close(Close::Eof);
                audit.detail("closed during the SOCKS5 negotiation");
            }
            Failure::Io(e) => {
                audit.close(Close::Error);
                audit.detail(format!("read error during the SOCKS5 negotiation: {e}"));
            }
            Failure::TimedOut => {
                audit.close(Close::Idle);
                audit.detail("SOCKS5 negotiation not finished within timeouts.header_ms");
            }
            Failure::Malformed(m) => {
                audit.decision(&Decision::deny(Reason::MalformedRequest, None));
                audit.detail(m.explain());
            }
        }
    }
}

impl Negotiation {
    /// Read more bytes (before the deadline). Every message has a length of at most 513
    /// bytes, so the buffer never holds much more than one when this is called.
    async fn more(&mut self) -> Result<(), Failure> {
        self.buf.reserve(512);
        let read = tokio::time::timeout_at(self.deadline, self.stream.read_buf(&mut self.buf));
        match read.await {
            Ok(Ok(0)) => Err(Failure::Closed),
            Ok(Ok(_)) => Ok(()),
            Ok(Err(e)) => Err(Failure::Io(e)),
            Err(_) => Err(Failure::TimedOut),
        }
    }

    /// Read until `parse` has a whole message: its length (the buffer still holds it).
    /// `None` when it never came whole (recorded; a bad address type is answered).
    async fn complete<T>(
        &mut self,
        parse: impl Fn(&[u8]) -> Result<Step<T>, Malformed>,
        audit: &mut AuditGuard,
    ) -> Option<usize> {
        loop {
            let failure = match parse(&self.buf) {
                Ok(Step::Done(_, n)) => return Some(n),
                Ok(Step::More) => match self.more().await {
                    Ok(()) => continue,
                    Err(f) => f,
                },
                Err(m) => Failure::Malformed(m),
            };
            failure.record(audit);
            if let Failure::Malformed(m) = failure {
                let code = match m {
                    Malformed::AddressType(_) => Reply::AddressTypeNotSupported,
                    _ => Reply::GeneralFailure,
                };
                // Only a request is answered with a reply; a bad greeting or login is closed.
                if matches!(m, Malformed::AddressType(_) | Malformed::Reserved(_)) {
                    self.refuse(&socks5::reply(code)).await;
                }
            }
            return None;
        }
    }

    /// Read a whole message that borrows nothing, and take it out of the buffer.
    async fn message<T>(
        &mut self,
        parse: impl Fn(&[u8]) -> Result<Step<T>, Malformed> + Copy,
        audit: &mut AuditGuard,
    ) -> Option<T> {
        let n = self.complete(parse, audit).await?;
        let Ok(Step::Done(value, _)) = parse(&self.buf[..n]) else {
            return None;
        };
        self.consume(n);
        Some(value)
    }

    fn consume(&mut self, n: usize) {
        self.buf.drain(..n.min(self.buf.len()));
    }

    /// Write an answer the negotiation goes on after; `None` (recorded) when it cannot be.
    async fn answer(&mut self, bytes: &[u8], audit: &mut AuditGuard) -> Option<()> {
        let write = tokio::time::timeout_at(self.deadline, self.stream.write_all(bytes));
        match write.await {
            Ok(Ok(())) => Some(()),
            _ => {
                audit.close(Close::Error);
                audit.detail("could not answer during the SOCKS5 negotiation");
                None
            }
        }
    }

    /// Write a final answer and close: what the client still sends is read (for at most a
    /// second) so that the close does not reset the connection before it reads the answer.
    async fn refuse(&mut self, bytes: &[u8]) {
        let stream = &mut self.stream;
        let _ = tokio::time::timeout(Duration::from_secs(1), async {
            stream.write_all(bytes).await?;
            stream.shutdown().await?;
            let mut sink = [0u8; 512];
            while stream.read(&mut sink).await? > 0 {}
            std::io::Result::Ok(())
        })
        .await;
    }
}
