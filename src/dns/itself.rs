//! `egress-proxy.local` in the DNS listener: a sandbox that resolves the proxy's own name —
//! to ask for access (`POST http://egress-proxy.local/v1/requests`) from a sandbox whose only
//! resolver is this listener — is answered with the address sandboxes reach the proxy on
//! (`dns.self_address`, else the DNS listener's own address, else the proxy listener's, when
//! bound to one). No policy applies: the name is the proxy, every identified sandbox may
//! reach it. Without an address to give, the name is refused saying what to set.

use std::net::IpAddr;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::rdata::{A, AAAA};
use hickory_proto::rr::{Name, RData, Record};

use super::listener::DnsListener;
use super::question::Asked;
use super::reply::Reply;
use crate::audit::AuditGuard;
use crate::egress::resolve::Family;
use crate::policy::decision::Decision;
use crate::policy::reason::Reason;

/// The TTL of the answer (the address changes only with the configuration).
const TTL: u32 = 60;

impl DnsListener {
    /// The answer to a question for `egress-proxy.local` of type `kind` (its name as asked:
    /// `owner`).
    pub(super) fn itself(
        &self,
        kind: Asked,
        owner: Option<Name>,
        q: &mut AuditGuard,
        edns: bool,
    ) -> Reply {
        let Some(own) = self.own else {
            let why = "egress-proxy.local: the proxy's address is not known (its listeners are bound to every address): set dns.self_address";
            q.decision(&Decision::deny(Reason::ProxyEndpoint, None));
            q.detail(why);
            return match edns {
                true => Reply::explained(
                    ResponseCode::NXDomain,
                    super::listener::EDE_OTHER,
                    why.into(),
                ),
                false => Reply::code(ResponseCode::NXDomain),
            };
        };
        q.decision(&Decision::allow(Reason::ProxyEndpoint, None));
        q.detail("the proxy itself");
        let data = match (kind, own) {
            (Asked::Addresses(Family::V4), IpAddr::V4(v4)) => RData::A(A(v4)),
            (Asked::Addresses(Family::V6), IpAddr::V6(v6)) => RData::AAAA(AAAA(v6)),
            // Another type, or the other family: the name exists, with nothing of that type.
            _ => return Reply::code(ResponseCode::NoError),
        };
        let Some(owner) = owner else {
            return Reply::code(ResponseCode::ServFail);
        };
        q.dns().ttl = Some(TTL);
        q.dns().answers = vec![own].into();
        Reply {
            rcode: ResponseCode::NoError,
            records: vec![Record::from_rdata(owner, TTL, data)],
            ede: None,
        }
    }
}
