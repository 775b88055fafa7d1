//! The DNS listener (`listen.dns`, UDP and TCP on one address): a filtering resolver per
//! sandbox, built on hickory-server. A query is answered only as far as the sandbox's policy
//! could use the answer, so DNS carries nothing a connection could not:
//!
//! - the client is identified by source address (or `listen.default_sandbox`); anyone else
//!   gets `REFUSED` up to `admission.dns_queries_per_second_per_source` and no answer beyond,
//!   its refusals summed into one record per source and period ([`crate::dns::strangers`]);
//!   a sandbox over `limits.dns_queries_per_second` gets `REFUSED`;
//! - A and AAAA: a name a name rule could allow (on any port), or any name under
//!   `network.mode: allow-all`, is resolved by the proxy's resolver and answered with the
//!   final addresses under the name asked (CNAMEs flattened), the TTL capped at
//!   `dns.max_answer_ttl_s`, and every address the guard or a deny rule would refuse removed.
//!   A name only address rules could allow is answered only when every address is covered;
//! - HTTPS and SVCB: an empty answer (no ECH configuration, so the SNI stays readable);
//! - any other type: `REFUSED`, unless listed in `dns.pass_types` (then passed for names a
//!   name rule could allow);
//! - a name the policy refuses: `NXDOMAIN` without an SOA record (so no cache keeps it past a
//!   policy change) and, to clients that speak EDNS, an Extended DNS Error "Blocked" saying
//!   why. NXDOMAIN rather than REFUSED because stub resolvers walk their search list on
//!   NXDOMAIN but give up on REFUSED: with Kubernetes' `ndots: 5`, `github.com` is first
//!   asked as `github.com.<ns>.svc.cluster.local`, and a REFUSED there would fail the lookup
//!   of an allowed name. `enforcement: report` answers and records `report`.
//!
//! Each answer is remembered (see [`crate::egress::answers`]) so the transparent listener can
//! decide a nameless connection by the name the sandbox resolved. One audit record per query
//! (`mode: "dns"`), `egress_dns_queries_total{sandbox,decision}`.

use std::net::IpAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{RData, Record, RecordType};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};

use crate::audit::outcome::Mode;
use crate::audit::record::DnsFacts;
use crate::audit::AuditGuard;
use crate::audit::Record as AuditRecord;
use crate::config::AuditDns;
use crate::dns::question::{classify, Asked, Question, Received, Unanswerable};
use crate::dns::reply::{self, Reply};
use crate::egress::admit::{self, Told};
use crate::egress::identity::{self, Identified};
use crate::egress::resolve::ResolveError;
use crate::egress::strangers::{Answer, Strangers};
use crate::pipeline::flow::Phase;
use crate::policy::flows::{Act, Dest};
use crate::policy::reason::Reason;
use crate::policy::{Decision, Enforcement, Verdict};
use crate::runtime::Shared;
use crate::sandboxes::set::{PolicySet, Sandbox};

/// EDE info codes: Blocked (15), Prohibited (18).
const EDE_BLOCKED: u16 = 15;
/// Extended DNS Error "Other" (RFC 8914): a configuration the operator must complete.
pub(super) const EDE_OTHER: u16 = 0;
const EDE_PROHIBITED: u16 = 18;
/// RFC 8914 "Not Ready": the audit trail cannot take the query's record.
const EDE_NOT_READY: u16 = 14;

/// Who asks a query, identified once (by the repeat cache, or by [`DnsListener::respond`]),
/// and the policy set it was identified under (the one the query is decided under).
pub struct Asker {
    /// The set in force when the query was identified.
    pub set: Arc<PolicySet>,
    /// The sandbox, or why none.
    pub who: Result<Identified, identity::Unidentified>,
}

/// The request handler hickory-server calls for every query.
pub struct DnsListener {
    pub shared: Arc<Shared>,
    /// Unidentified sources: their refusals summed, their rate bounded.
    pub strangers: Arc<Strangers>,
    /// What `egress-proxy.local` is answered with (`dns.self_address`, else the DNS or proxy
    /// listener's own address); `None`: the name is refused, saying to set it.
    pub own: Option<IpAddr>,
}

/// An allowed answer a UDP receive loop may serve again to the same query
/// ([`crate::dns::answer_cache`]): the record it wrote (each repeat writes its own copy) and
/// the policy generation it was decided under.
pub struct Answered {
    pub record: AuditRecord,
    pub generation: u64,
}

#[async_trait::async_trait]
impl RequestHandler for DnsListener {
    async fn handle_request<R: ResponseHandler>(
        &self,
        request: &Request,
        response_handle: R,
    ) -> ResponseInfo {
        self.respond(request, response_handle, None, None).await
    }
}

impl DnsListener {
    /// Answer `request`, read by hickory, through `response_handle`; with `keep`, also say
    /// there whether the answer may be served again ([`Answered`]). `asker`: who asks, when
    /// it was already looked up.
    pub async fn respond<R: ResponseHandler>(
        &self,
        request: &Request,
        response_handle: R,
        keep: Option<&mut Option<Answered>>,
        asker: Option<Asker>,
    ) -> ResponseInfo {
        let asked = Received::of_request(request);
        match self.decide(&asked, keep, asker).await {
            Some(reply) => reply::send(request, &reply, response_handle).await,
            None => ResponseInfo::from(reply::header(request.header())),
        }
    }

    /// Decide one query, however it was read: the reply, or `None` for no answer at all (an
    /// unidentified source over its rate). With `keep`, say there whether the answer may be
    /// served again.
    pub async fn decide(
        &self,
        asked: &Received<'_>,
        keep: Option<&mut Option<Answered>>,
        asker: Option<Asker>,
    ) -> Option<Reply> {
        let (reply, answered) = match self.decide_now(asked, keep.is_some(), asker) {
            Now::Silent => return None,
            Now::Done(reply, answered) => (reply, answered),
            Now::Later(later) => later.finish(self).await,
        };
        if let (Some(keep), Some(a)) = (keep, answered) {
            *keep = Some(a);
        }
        Some(reply)
    }

    /// Decide one query as far as it can be without waiting: every refusal, and every answer
    /// without the resolver, is [`Now::Done`] here, with its record written; a query the
    /// resolver must answer comes back as [`Now::Later`], owning what it needs. With `keep`,
    /// an allowed answer with records comes back as [`Answered`] too.
    pub fn decide_now(&self, asked: &Received<'_>, keep: bool, asker: Option<Asker>) -> Now {
        // Who asks, once per query: the source address's sandbox, else the default one.
        let Asker { set, who } = asker.unwrap_or_else(|| {
            let set = self.shared.policy.load();
            let default = self.shared.settings.default_sandbox.as_deref();
            let who = admit::query_asker(&set, default, asked.src.ip());
            Asker { set, who }
        });
        if who.is_err() && self.strangers.refused(asked.src.ip()) != Answer::Refuse {
            // An unidentified source over its rate: no answer (summed, never recorded alone).
            return Now::Silent;
        }
        if let Some(why) = self.shared.sink.refuse_unrecorded() {
            // Nothing can be recorded: answer nothing useful, record nothing (counted).
            let text = format!("{}: {}", Reason::AuditUnavailable.code(), why.explain());
            let reply = Reply::explained(ResponseCode::Refused, EDE_NOT_READY, text);
            return Now::Done(reply, None);
        }
        let shared = &self.shared;
        // The query's one record, written (and counted) when this guard drops.
        let mut q = AuditGuard::query(
            shared.sink.clone(),
            AuditRecord::new(
                shared.next_conn_id(),
                asked.src,
                Mode::Dns,
                set.version_arc(),
            ),
            DnsFacts {
                transport: asked.transport,
                ..DnsFacts::default()
            },
            shared.settings.audit_dns != AuditDns::Denied,
        );
        match self.judge(asked, &set, who, &mut q) {
            Answering::Reply(reply) => {
                let answered = settle(&reply, &mut q, &set, keep);
                Now::Done(reply, answered)
            }
            Answering::Wait(work) => Now::Later(Later { set, q, keep, work }),
        }
    }

    /// Steps 1-3 of a query, and the answers that need no resolver.
    fn judge(
        &self,
        asked: &Received<'_>,
        set: &PolicySet,
        who: Result<Identified, identity::Unidentified>,
        q: &mut AuditGuard,
    ) -> Answering {
        let shared = &self.shared;
        let query = match &asked.question {
            Ok(query) => query,
            Err(why) => {
                q.detail(why.to_string());
                return Answering::Reply(Reply::code(match why {
                    Unanswerable::NotAQuery => ResponseCode::NotImp,
                    _ => ResponseCode::FormErr,
                }));
            }
        };
        let rtype = query.rtype;
        q.dns().qtype = match rtype {
            // RFC 3597's name for a type without one (hickory says "Unknown").
            RecordType::Unknown(code) => format!("TYPE{code}").into(),
            known => std::borrow::Cow::Borrowed(known.into()),
        };
        let pass_types = &shared.resolver().pass_types;
        let question = classify(query.class, rtype, &query.text, pass_types);
        // Recorded normalised when it is a host name, else as received.
        q.dns().name = match question {
            Ok(ref question) => question.name.clone(),
            Err(_) => query.shown_name().into(),
        };

        // 1-2. Who asks (identified once, by respond), and its query rate.
        let limiters = &shared.limiters;
        let Ok(who) = admit::query_enter(who, limiters, shared.metrics(), q) else {
            return Answering::Reply(Reply::code(ResponseCode::Refused));
        };
        let sb = who.sandbox;

        // The question: class IN, a type this listener answers, a valid name.
        let Question { kind, name } = match question {
            Ok(question) => question,
            Err(why) => return Answering::Reply(unanswerable(why, q, asked.edns)),
        };

        // The proxy itself, where every sandbox may ask for access (no policy applies).
        if &*name == crate::policy::target::PROXY_NAME {
            return Answering::Reply(self.itself(kind, query.owner(), q, asked.edns));
        }

        // 3. What the policy lets this sandbox learn about the name.
        let address_only = match admit::query_name(set, &sb, &name, q) {
            Ok(allowed) => allowed.address_only,
            Err(d) => return Answering::Reply(self.blocked(&sb, &name, &d, q, asked.edns)),
        };

        // A query carries its name out: after a label, a write (flow rules).
        if let Some(reply) = self.flow_refused(&sb, &name, q, asked.edns) {
            return Answering::Reply(reply);
        }

        let family = match kind {
            Asked::Addresses(f) => f,
            Asked::Empty => return Answering::Reply(Reply::code(ResponseCode::NoError)),
            Asked::Pass(t) if address_only => {
                let d = Decision::deny(Reason::NoRuleMatched, None);
                q.decision(&d);
                q.detail(format!("{t} is passed only for names a name rule allows"));
                return Answering::Reply(self.blocked(&sb, &name, &d, q, asked.edns));
            }
            Asked::Pass(rtype) => return Answering::Wait(Work::Pass { name, rtype }),
        };

        // 4. Resolve (later), then keep only what a connection could reach.
        Answering::Wait(Work::Resolve(Resolving {
            owner: query.owner(),
            sb,
            name,
            address_only,
            edns: asked.edns,
            family,
        }))
    }

    /// Step 4 of a query: resolve with the proxy's resolver, then answer only the addresses
    /// a connection of the sandbox could reach ([`admit::query_addresses`]; remembered for
    /// transparent connections).
    async fn resolve(&self, asked: Resolving, set: &PolicySet, q: &mut AuditGuard) -> Reply {
        let Resolving {
            sb,
            name,
            owner,
            address_only,
            edns,
            family,
        } = asked;
        let (sb, name) = (&*sb, &*name);
        let Some(owner) = owner else {
            // Cannot happen: the name was read once already.
            q.detail("the question's name cannot be read again");
            return Reply::code(ResponseCode::ServFail);
        };
        let shared = &self.shared;
        let resolver = shared.resolver();
        let t = Instant::now();
        let found = resolver.lookup_family(name, family).await;
        shared
            .metrics()
            .observe(crate::audit::metrics::Timing::Dns, t);
        let found = match found {
            Ok(f) => f,
            Err(ResolveError::NotFound | ResolveError::NoData) if address_only => {
                let detail = "the name has no addresses; answered as refused, so that the answer does not tell which names exist";
                let d = admit::query_not_covered(q, detail);
                return self.blocked(sb, name, &d, q, edns);
            }
            Err(e) => return self.resolve_failed(e, q),
        };
        let ttl = found.ttl.min(resolver.max_answer_ttl).as_secs() as u32;
        let kept = match admit::query_addresses(set, sb, &found.addrs, address_only, q) {
            Told::Addresses(kept) => kept,
            Told::NotCovered(d) => return self.blocked(sb, name, &d, q, edns),
            Told::NoneAllowed => {
                q.dns().ttl = Some(ttl);
                let text = format!(
                    "egress-proxy: every address of {name} is refused (private, metadata, reserved or denied)"
                );
                q.detail(text.clone());
                return Reply::explained(ResponseCode::NoError, EDE_BLOCKED, text);
            }
        };
        q.dns().ttl = Some(ttl);
        shared.dns_memory.remember(
            &sb.binding.id,
            name,
            &kept,
            Duration::from_secs(ttl.into()) + resolver.answer_grace,
        );
        let records = kept
            .iter()
            .map(|ip| {
                let data = match ip {
                    IpAddr::V4(v4) => RData::A(A(*v4)),
                    IpAddr::V6(v6) => RData::AAAA(AAAA(*v6)),
                };
                Record::from_rdata(owner.clone(), ttl, data)
            })
            .collect();
        q.dns().answers = kept.into();
        Reply {
            rcode: ResponseCode::NoError,
            records,
            ede: None,
        }
    }

    /// A query the sandbox's flow rules refuse (a write of its name after a label), answered
    /// as a refused name; in report mode recorded `report` and answered (`None`).
    fn flow_refused(
        &self,
        sb: &Sandbox,
        name: &str,
        q: &mut AuditGuard,
        edns: bool,
    ) -> Option<Reply> {
        // A query names no process: judged with every process's labels.
        let flow = Phase::of(&sb.binding, Some(&self.shared.settings.flows), None)?;
        let dest = Dest {
            host: name,
            port: None,
            request: None,
        };
        let judged = flow.judge_unspent(&dest, Act::Write);
        q.labels(judged.labels);
        let refused = judged.refused?;
        if sb.binding.enforcement == Enforcement::Report {
            q.verdict(Verdict::Report, Reason::FlowRefused);
            q.detail(format!("{} (answered)", refused.detail));
            return None;
        }
        let d = Decision::deny(Reason::FlowRefused, None);
        q.decision(&d);
        q.detail(refused.detail);
        Some(self.blocked(sb, name, &d, q, edns))
    }

    /// A refused name: NXDOMAIN without SOA, and why — with the reason's code and, when a
    /// grant could answer it, where to ask (what `dig` prints of the EDE). Only a client that
    /// speaks EDNS (`edns`) can be told; the text is not written for one that cannot.
    fn blocked(
        &self,
        sb: &Sandbox,
        name: &str,
        d: &Decision,
        q: &mut AuditGuard,
        edns: bool,
    ) -> Reply {
        if !q.has_detail() {
            q.detail("refused by policy: no upstream query was made");
        }
        if !edns {
            return Reply::code(ResponseCode::NXDomain);
        }
        let why = d.explain(&sb.binding.id, sb.policy.file(), 0);
        let code = d.reason.code();
        let mut text = String::with_capacity(64 + code.len() + name.len() + why.len());
        for part in ["egress-proxy [", code, "]: ", name, ": ", &why] {
            text.push_str(part);
        }
        if crate::relay::deny::grantable(d.reason) {
            for part in [" (ask: POST ", self.shared.ask().url(), ")"] {
                text.push_str(part);
            }
        }
        Reply::explained(ResponseCode::NXDomain, EDE_BLOCKED, text)
    }

    /// The resolver could not answer an allowed name.
    fn resolve_failed(&self, e: ResolveError, q: &mut AuditGuard) -> Reply {
        let rcode = match e {
            ResolveError::NotFound => ResponseCode::NXDomain,
            ResolveError::NoData => ResponseCode::NoError,
            ResolveError::Timeout | ResolveError::Failed(_) => ResponseCode::ServFail,
        };
        if let ResolveError::Failed(text) = &e {
            q.detail(text.clone());
        }
        if rcode != ResponseCode::NoError {
            q.decision(&Decision::deny(e.reason(), None));
        }
        Reply::code(rcode)
    }

    /// A `dns.pass_types` query for a name a name rule allows: the resolver's records, TTLs
    /// capped.
    async fn pass(&self, name: &str, rtype: RecordType, q: &mut AuditGuard) -> Reply {
        let resolver = self.shared.resolver();
        match resolver.lookup_records(name, rtype).await {
            Ok((mut records, ttl)) => {
                let cap = resolver.max_answer_ttl.as_secs() as u32;
                let ttl = (ttl.as_secs() as u32).min(cap);
                for r in &mut records {
                    let t = r.ttl().min(cap);
                    r.set_ttl(t);
                }
                q.dns().ttl = Some(ttl);
                q.dns().passed = records.len();
                Reply {
                    rcode: ResponseCode::NoError,
                    records,
                    ede: None,
                }
            }
            Err(e) => self.resolve_failed(e, q),
        }
    }
}

/// A query decided as far as it could be without waiting ([`DnsListener::decide_now`]).
pub enum Now {
    /// No answer at all (an unidentified source over its rate).
    Silent,
    /// The reply (its record written), and whether it may be served again.
    Done(Reply, Option<Answered>),
    /// The resolver must answer first ([`Later::finish`]).
    Later(Later),
}

/// A query waiting for the resolver. It owns what it needs, its record included, so the
/// loop that read it goes on answering others meanwhile.
pub struct Later {
    set: Arc<PolicySet>,
    q: AuditGuard,
    keep: bool,
    work: Work,
}

impl Later {
    /// Ask the resolver, then answer; the query's record is written when this returns.
    pub async fn finish(self, listener: &DnsListener) -> (Reply, Option<Answered>) {
        let Later {
            set,
            mut q,
            keep,
            work,
        } = self;
        let reply = match work {
            Work::Resolve(asked) => listener.resolve(asked, &set, &mut q).await,
            Work::Pass { name, rtype } => listener.pass(&name, rtype, &mut q).await,
        };
        let answered = settle(&reply, &mut q, &set, keep);
        (reply, answered)
    }
}

/// What judging a query gives: its reply, or the resolver's work still to do.
enum Answering {
    Reply(Reply),
    Wait(Work),
}

/// What a query waits for.
enum Work {
    /// Step 4: the name's addresses.
    Resolve(Resolving),
    /// A `dns.pass_types` query for a name a name rule allows.
    Pass { name: Arc<str>, rtype: RecordType },
}

/// The rcode in the record, and with `keep`, the allowed answer that may be served again.
fn settle(reply: &Reply, q: &mut AuditGuard, set: &PolicySet, keep: bool) -> Option<Answered> {
    q.dns().rcode = reply::rcode_name(reply.rcode);
    (keep
        && reply.rcode == ResponseCode::NoError
        && !reply.records.is_empty()
        && q.verdict_so_far() == Verdict::Allow
        && q.dns().ttl.is_some_and(|t| t > 0)
        && !has_flow_rules(set, q))
    .then(|| Answered {
        record: q.record.clone(),
        generation: set.generation(),
    })
}

/// Whether the asking sandbox has flow rules: its answers are never served again from a
/// receive loop's cache (a label armed in the meantime would not be asked).
fn has_flow_rules(set: &PolicySet, q: &AuditGuard) -> bool {
    let sandbox = q.record.sandbox.as_ref();
    sandbox
        .and_then(|id| set.get(id.as_str()))
        .is_none_or(|sb| sb.binding.network.flows.is_some())
}

/// What step 4 of a query resolves, for whom.
struct Resolving {
    sb: Arc<Sandbox>,
    name: Arc<str>,
    /// The question's name as asked (the owner of the answer's records).
    owner: Option<hickory_proto::rr::Name>,
    /// Allowed only by address rules: every address must be covered.
    address_only: bool,
    /// The client speaks EDNS (can be told why).
    edns: bool,
    /// A, AAAA or both.
    family: crate::egress::resolve::Family,
}

/// A question this listener does not answer: class other than IN (REFUSED), a type it does
/// not pass (REFUSED, EDE Prohibited) or an invalid name (NXDOMAIN, EDE Blocked). The record
/// says why; so does the answer, to a client that speaks EDNS (`edns`).
fn unanswerable(why: Unanswerable, q: &mut AuditGuard, edns: bool) -> Reply {
    let (reason, rcode) = match why {
        Unanswerable::Name(_) => (Reason::InvalidTarget, ResponseCode::NXDomain),
        _ => (Reason::ProtocolNotAllowed, ResponseCode::Refused),
    };
    q.decision(&Decision::deny(reason, None));
    let text = why.to_string();
    let ede = match why {
        Unanswerable::Class => None,
        Unanswerable::Name(_) => Some(EDE_BLOCKED),
        _ => Some(EDE_PROHIBITED),
    };
    match ede.filter(|_| edns) {
        Some(code) => {
            q.detail(text.clone());
            Reply::explained(rcode, code, text)
        }
        None => {
            q.detail(text);
            Reply::code(rcode)
        }
    }
}
