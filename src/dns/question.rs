//! What a query asks, read without any I/O: the one question's class, type and name, checked
//! and normalised ([`Asked`], whether hickory read the message or [`crate::dns::wire`] did).
//! The listener decides on this; the fuzz target `dns_query` feeds it any bytes (hostile
//! queries must give a refusal, never a panic).

use std::borrow::Cow;
use std::net::SocketAddr;
use std::sync::Arc;

use hickory_proto::op::{Message, MessageType, OpCode};
use hickory_proto::rr::{DNSClass, Name, RecordType};
use hickory_proto::xfer::Protocol;
use hickory_server::server::Request;

use crate::dns::wire;

use crate::egress::resolve::Family;
use crate::policy::hostname::normalize_name_shared;

/// What kind of answer a question gets.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Asked {
    /// A or AAAA.
    Addresses(Family),
    /// HTTPS / SVCB: always empty (no ECH configuration, so the SNI stays readable).
    Empty,
    /// A type of `dns.pass_types`.
    Pass(RecordType),
}

/// Why a question is not answered.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum Unanswerable {
    /// Not a standard query.
    #[error("not a standard query")]
    NotAQuery,
    /// Not exactly one question.
    #[error("a query must ask exactly one question")]
    NotOneQuestion,
    /// A class other than IN.
    #[error("only class IN is answered")]
    Class,
    /// A type not answered.
    #[error("egress-proxy: {0} queries are not answered (dns.pass_types)")]
    Type(RecordType),
    /// A name that is not a valid host name.
    #[error("egress-proxy: not a valid host name: {0}")]
    Name(#[source] crate::policy::hostname::NameError),
}

/// The question, ready to decide.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Question {
    /// What is asked.
    pub kind: Asked,
    /// Lower case, no trailing dot, IDNA-checked; shared with the query's record.
    pub name: Arc<str>,
}

/// One query as the listener decides it.
pub struct Received<'a> {
    /// Who sent it.
    pub src: SocketAddr,
    /// `udp` or `tcp`.
    pub transport: &'static str,
    /// It carries an OPT record: the answer can say why (an Extended DNS Error).
    pub edns: bool,
    /// The one question, or why there is none ([`Unanswerable::NotAQuery`],
    /// [`Unanswerable::NotOneQuestion`]).
    pub question: Result<ReceivedQuestion<'a>, Unanswerable>,
}

/// The one question of a standard query, as asked.
pub struct ReceivedQuestion<'a> {
    /// Its class.
    pub class: DNSClass,
    /// Its type.
    pub rtype: RecordType,
    /// The name's presentation form without its final dot ([`text`]), in lower case (how
    /// the decision and the record read it). Read from the wire, it is written into the
    /// receive loop's scratch text (no allocation per query).
    pub text: Cow<'a, str>,
    owner: Owner<'a>,
}

/// Where the question's name, as sent, is read from.
enum Owner<'a> {
    Read(&'a Name),
    Wire(&'a wire::Query<'a>),
}

impl ReceivedQuestion<'_> {
    /// The question's name as asked: the owner of the answer's records.
    pub fn owner(&self) -> Option<Name> {
        match self.owner {
            Owner::Read(name) => Some(name.clone()),
            Owner::Wire(query) => query.owner(),
        }
    }

    /// The name as the record shows it, before it is known to be valid.
    pub fn shown_name(&self) -> &str {
        &self.text
    }
}

impl<'a> Received<'a> {
    /// A query hickory read.
    pub fn of_request(request: &'a Request) -> Self {
        let transport = match request.protocol() {
            Protocol::Tcp => "tcp",
            _ => "udp",
        };
        let question =
            if request.message_type() != MessageType::Query || request.op_code() != OpCode::Query {
                Err(Unanswerable::NotAQuery)
            } else {
                match request.queries() {
                    [q] => {
                        let q = q.original();
                        Ok(ReceivedQuestion {
                            class: q.query_class(),
                            rtype: q.query_type(),
                            text: Cow::Owned(text(q.name()).to_ascii_lowercase()),
                            owner: Owner::Read(q.name()),
                        })
                    }
                    _ => Err(Unanswerable::NotOneQuestion),
                }
            };
        Received {
            src: request.src(),
            transport,
            edns: request.edns().is_some(),
            question,
        }
    }

    /// A query read from the wire (a standard query with one question, by construction), its
    /// name's text written into `scratch` (the receive loop's, reused query after query).
    pub fn of_wire(query: &'a wire::Query<'a>, src: SocketAddr, scratch: &'a mut String) -> Self {
        // Plain labels by construction ([`wire::Query::read`]): joined, nothing to escape.
        query.name_text_into(scratch);
        let text = Cow::Borrowed(scratch.as_str());
        Received {
            src,
            transport: "udp",
            edns: query.speaks_edns(),
            question: Ok(ReceivedQuestion {
                class: DNSClass::from(query.qclass),
                rtype: RecordType::from(query.qtype),
                text,
                owner: Owner::Wire(query),
            }),
        }
    }
}

/// The name's presentation form without its final dot: put together from the labels when
/// each is plain host-name bytes (letters, digits, `_`, and `-` after the first: nothing to
/// escape), else hickory's escaped form (`\.`, `\DDD`), which a host-name check refuses.
fn text(name: &Name) -> String {
    plain_text(name.iter()).unwrap_or_else(|| name.to_ascii().trim_end_matches('.').to_owned())
}

/// Plain labels joined with dots; `None` when one needs escaping. Plain bytes are ASCII, so
/// the joined bytes are checked as UTF-8 once, not label by label.
fn plain_text<'l>(labels: impl Iterator<Item = &'l [u8]>) -> Option<String> {
    let plain = |b: &u8| b.is_ascii_alphanumeric() || *b == b'-' || *b == b'_';
    let mut out = Vec::with_capacity(64);
    for label in labels {
        // hickory escapes a leading `-` (`\-`).
        if label.first() == Some(&b'-') || !label.iter().all(plain) {
            return None;
        }
        if !out.is_empty() {
            out.push(b'.');
        }
        out.extend_from_slice(label);
    }
    String::from_utf8(out).ok()
}

/// Check one question (class, type, name in [`text`] form) against what this listener
/// answers.
pub fn classify(
    class: DNSClass,
    rtype: RecordType,
    name: &str,
    pass_types: &[u16],
) -> Result<Question, Unanswerable> {
    if class != DNSClass::IN {
        return Err(Unanswerable::Class);
    }
    let kind = match rtype {
        RecordType::A => Asked::Addresses(Family::V4),
        RecordType::AAAA => Asked::Addresses(Family::V6),
        RecordType::HTTPS | RecordType::SVCB => Asked::Empty,
        t if pass_types.contains(&u16::from(t)) => Asked::Pass(t),
        t => return Err(Unanswerable::Type(t)),
    };
    let name = normalize_name_shared(name).map_err(Unanswerable::Name)?;
    Ok(Question { kind, name })
}

/// Read a query from the wire, as the fuzz target and tests do: a message that is a standard
/// query with exactly one question, classified.
pub fn read(bytes: &[u8], pass_types: &[u16]) -> Result<Question, Unanswerable> {
    let msg = Message::from_vec(bytes).map_err(|_| Unanswerable::NotAQuery)?;
    if msg.message_type() != MessageType::Query || msg.op_code() != OpCode::Query {
        return Err(Unanswerable::NotAQuery);
    }
    let [q] = msg.queries() else {
        return Err(Unanswerable::NotOneQuestion);
    };
    classify(q.query_class(), q.query_type(), &text(q.name()), pass_types)
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::Query;
    use hickory_proto::rr::Name;
    use std::str::FromStr;

    fn wire(name: &str, t: RecordType, class: DNSClass) -> Vec<u8> {
        let mut m = Message::new();
        let mut q = Query::query(Name::from_str(name).expect("name"), t);
        q.set_query_class(class);
        m.add_query(q);
        m.to_vec().expect("encode")
    }

    #[test]
    fn an_a_query_is_read_and_normalised() {
        let q = read(&wire("GitHub.COM.", RecordType::A, DNSClass::IN), &[]).expect("ok");
        assert_eq!(&*q.name, "github.com");
        assert_eq!(q.kind, Asked::Addresses(Family::V4));
    }

    #[test]
    fn other_classes_types_and_shapes_are_refused() {
        let chaos = wire("version.bind.", RecordType::TXT, DNSClass::CH);
        assert_eq!(read(&chaos, &[16]), Err(Unanswerable::Class));
        let txt = wire("a.test.", RecordType::TXT, DNSClass::IN);
        assert_eq!(read(&txt, &[]), Err(Unanswerable::Type(RecordType::TXT)));
        assert_eq!(
            read(&txt, &[16]).map(|q| q.kind),
            Ok(Asked::Pass(RecordType::TXT))
        );
        let mut two = Message::new();
        two.add_query(Query::query(
            Name::from_str("a.test.").expect("n"),
            RecordType::A,
        ));
        two.add_query(Query::query(
            Name::from_str("b.test.").expect("n"),
            RecordType::A,
        ));
        assert_eq!(
            read(&two.to_vec().expect("encode"), &[]),
            Err(Unanswerable::NotOneQuestion)
        );
        assert_eq!(read(b"\x00\x01garbage", &[]), Err(Unanswerable::NotAQuery));
    }

    use proptest::strategy::Strategy;

    proptest::proptest! {
        /// The text put together from plain labels is hickory's own presentation form.
        #[test]
        fn a_name_reads_as_hickory_spells_it(
            labels in proptest::collection::vec(proptest::prop_oneof![
                "[a-zA-Z0-9_-]{1,12}".prop_map(String::into_bytes),
                "[a-z.*\\\\ é]{1,6}".prop_map(String::into_bytes),
                proptest::collection::vec(proptest::prelude::any::<u8>(), 1..12),
            ], 0..5),
            fqdn in proptest::prelude::any::<bool>(),
        ) {
            let Ok(mut name) = Name::from_labels(labels) else { return Ok(()) };
            name.set_fqdn(fqdn);
            let hickory = name.to_ascii();
            proptest::prop_assert_eq!(text(&name), hickory.trim_end_matches('.'));
        }
    }

    #[test]
    fn a_name_that_is_not_a_host_name_is_refused() {
        let bad = wire("127.1.", RecordType::A, DNSClass::IN);
        assert!(matches!(read(&bad, &[]), Err(Unanswerable::Name(_))));
    }
}
