//! The common query read and answered straight from its bytes, without hickory's message
//! decoder or response encoder: a standard query (QR 0, opcode 0) with one question whose
//! name is plain host-name labels written out in full (no compression pointer), and at most
//! one additional record, an OPT of the root name whose options are well framed and are not a
//! Client Subnet (the one option hickory parses). That is what stub resolvers, `dig` and
//! `dnsperf` send. Anything else — a pointer, an escaped label, a second question, a record in
//! another section, trailing bytes — goes the general way ([`crate::dns::udp`]).
//!
//! An answer without records (a refusal, `NXDOMAIN` with its Extended DNS Error, an empty
//! HTTPS answer) is written here; one with records, or one longer than the client's payload
//! (which hickory truncates), is left to the general encoder. [`differs`] holds the two ways
//! to the same bytes: the unit tests, a proptest and the fuzz target `dns_wire` call it.

use std::ops::Range;

use hickory_proto::op::ResponseCode;
use hickory_proto::rr::Name;
use hickory_proto::serialize::binary::{BinDecodable, BinDecoder};

/// A DNS header: id, flags, four counts.
pub const HEADER: usize = 12;
/// RR type OPT (RFC 6891).
const OPT: u16 = 41;
/// EDNS option Client Subnet (RFC 7871), which hickory parses (and may refuse).
const CLIENT_SUBNET: u16 = 8;
/// The payload a client without EDNS can take (RFC 1035 §4.2.1).
pub const CLASSIC_PAYLOAD: u16 = 512;
/// The UDP payload this listener advertises (the DNS flag day 2020 value).
pub const MAX_UDP_PAYLOAD: u16 = 1232;
/// EDNS option code of an Extended DNS Error (RFC 8914).
pub const EDE_OPTION: u16 = 15;

/// A query read from the wire (see the module's documentation for which).
#[derive(Debug, Clone)]
pub struct Query<'a> {
    bytes: &'a [u8],
    /// The question's name, as sent (labels and the final zero byte).
    name: Range<usize>,
    /// The question section.
    question: Range<usize>,
    /// The question's type.
    pub qtype: u16,
    /// The question's class.
    pub qclass: u16,
    /// The client's UDP payload, when it sent an OPT record.
    edns: Option<u16>,
}

impl<'a> Query<'a> {
    /// Read `bytes` if it is a query of the common shape; `None` sends it the general way.
    pub fn read(bytes: &'a [u8]) -> Option<Self> {
        let count = |at: usize| u16::from_be_bytes([bytes[at], bytes[at + 1]]);
        if bytes.len() < HEADER || bytes[2] & 0xf8 != 0 {
            return None;
        }
        if count(4) != 1 || count(6) != 0 || count(8) != 0 || count(10) > 1 {
            return None;
        }
        let name_end = plain_name_end(bytes, HEADER)?;
        let question_end = name_end + 4;
        let fixed = bytes.get(name_end..question_end)?;
        let mut query = Query {
            bytes,
            name: HEADER..name_end,
            question: HEADER..question_end,
            qtype: u16::from_be_bytes([fixed[0], fixed[1]]),
            qclass: u16::from_be_bytes([fixed[2], fixed[3]]),
            edns: None,
        };
        if count(10) == 1 {
            query.edns = Some(opt_payload(&bytes[question_end..])?);
        } else if bytes.len() != question_end {
            return None;
        }
        Some(query)
    }

    /// The labels of the question's name, as sent.
    pub fn labels(&self) -> impl Iterator<Item = &'a [u8]> + 'a {
        let bytes = self.bytes;
        let mut at = self.name.start;
        std::iter::from_fn(move || {
            let len = usize::from(*bytes.get(at)?);
            let label = bytes.get(at + 1..at + 1 + len).filter(|_| len > 0)?;
            at += 1 + len;
            Some(label)
        })
    }

    /// The question's name in presentation form without its final dot, in lower case: its
    /// labels (plain, so nothing to escape: [`plain_name_end`]) joined with dots, in one pass,
    /// written over `text` (whose room is kept from one query to the next).
    pub fn name_text_into(&self, text: &mut String) {
        let mut bytes = std::mem::take(text).into_bytes();
        bytes.clear();
        for label in self.labels() {
            if !bytes.is_empty() {
                bytes.push(b'.');
            }
            bytes.extend_from_slice(label);
        }
        bytes.make_ascii_lowercase();
        // Plain labels are ASCII: this never fails.
        *text = String::from_utf8(bytes).unwrap_or_default();
    }

    /// The question's name as hickory reads it (for the owner of answer records).
    pub fn owner(&self) -> Option<Name> {
        Name::read(&mut BinDecoder::new(&self.bytes[self.name.clone()])).ok()
    }

    /// Whether the client sent an OPT record.
    pub fn speaks_edns(&self) -> bool {
        self.edns.is_some()
    }

    /// The largest answer the client takes.
    pub fn payload(&self) -> u16 {
        self.edns
            .map(|p| p.max(CLASSIC_PAYLOAD))
            .unwrap_or(CLASSIC_PAYLOAD)
    }

    /// An answer without records: the header with `rcode`, the question as sent, and when the
    /// client speaks EDNS an OPT record (with the Extended DNS Error `ede`). `None` when it
    /// would not fit the client's payload (the general encoder truncates it).
    pub fn answer(&self, rcode: ResponseCode, ede: Option<(u16, &str)>) -> Option<Vec<u8>> {
        let mut out = Vec::new();
        self.answer_into(&mut out, rcode, ede).then_some(out)
    }

    /// [`Query::answer`] appended to `out` (the receive loop's [`crate::dns::mmsg::Outbox`]:
    /// no allocation of its own); `false`, and `out` as it was, when it does not fit.
    pub fn answer_into(
        &self,
        out: &mut Vec<u8>,
        rcode: ResponseCode,
        ede: Option<(u16, &str)>,
    ) -> bool {
        let start = out.len();
        let fits = self.write_answer(out, rcode, ede).is_some()
            && out.len() - start <= usize::from(self.payload());
        if !fits {
            out.truncate(start);
        }
        fits
    }

    fn write_answer(
        &self,
        out: &mut Vec<u8>,
        rcode: ResponseCode,
        ede: Option<(u16, &str)>,
    ) -> Option<()> {
        let b = self.bytes;
        let question = &b[self.question.clone()];
        let ede_len = ede.map_or(0, |(_, text)| 4 + 2 + text.len());
        out.reserve(HEADER + question.len() + 11 + ede_len);
        out.extend_from_slice(&b[..2]);
        // QR, the opcode (0), RD as asked; RA, CD as asked, the code.
        out.push(0x80 | (b[2] & 0x01));
        out.push(0x80 | (b[3] & 0x10) | rcode.low());
        out.extend_from_slice(&[0, 1, 0, 0, 0, 0, 0, u8::from(self.edns.is_some())]);
        out.extend_from_slice(question);
        if self.edns.is_some() {
            // The root name, OPT, our payload, TTL 0 (no high code, version 0, no flags).
            out.extend_from_slice(&[0, 0, 41]);
            out.extend_from_slice(&MAX_UDP_PAYLOAD.to_be_bytes());
            out.extend_from_slice(&[0, 0, 0, 0]);
            let rdata = u16::try_from(ede_len).ok()?;
            out.extend_from_slice(&rdata.to_be_bytes());
            if let Some((code, text)) = ede {
                out.extend_from_slice(&EDE_OPTION.to_be_bytes());
                out.extend_from_slice(&u16::try_from(2 + text.len()).ok()?.to_be_bytes());
                out.extend_from_slice(&code.to_be_bytes());
                out.extend_from_slice(text.as_bytes());
            }
        }
        Some(())
    }
}

/// Where a name of plain labels (1 to 63 bytes of letters, digits, `-` and `_`, not starting
/// with `-`, 255 bytes at most on the wire) that starts at `at` ends; `None` for any other.
fn plain_name_end(bytes: &[u8], mut at: usize) -> Option<usize> {
    let start = at;
    loop {
        let len = usize::from(*bytes.get(at)?);
        if len == 0 {
            at += 1;
            return (at - start <= 255).then_some(at);
        }
        let label = bytes.get(at + 1..at + 1 + len).filter(|_| len <= 63)?;
        let plain = |c: &u8| c.is_ascii_alphanumeric() || *c == b'-' || *c == b'_';
        if label[0] == b'-' || !label.iter().all(plain) {
            return None;
        }
        at += 1 + len;
    }
}

/// The payload of the one OPT record that makes up `rest` exactly: the root name, type OPT,
/// options each framed whole, none a Client Subnet.
fn opt_payload(rest: &[u8]) -> Option<u16> {
    let (fixed, rdata) = (rest.get(..11)?, &rest[11.min(rest.len())..]);
    let field = |at: usize| u16::from_be_bytes([fixed[at], fixed[at + 1]]);
    if fixed[0] != 0 || field(1) != OPT || usize::from(field(9)) != rdata.len() {
        return None;
    }
    let mut at = 0;
    while at < rdata.len() {
        let head = rdata.get(at..at + 4)?;
        let code = u16::from_be_bytes([head[0], head[1]]);
        let len = usize::from(u16::from_be_bytes([head[2], head[3]]));
        if code == CLIENT_SUBNET || at + 4 + len > rdata.len() {
            return None;
        }
        at += 4 + len;
    }
    Some(field(3))
}

/// Where the two ways part for `bytes` answered `rcode` with `ede`: `None` when the wire
/// way does not take the query, declines to write that answer, or writes exactly what the
/// general way (hickory's decoder, the listener's response builder) writes and reads the same
/// question (its name spelt as hickory spells it); else what differs.
pub fn differs(bytes: &[u8], rcode: ResponseCode, ede: Option<(u16, &str)>) -> Option<String> {
    let query = Query::read(bytes)?;
    let wire = query.answer(rcode, ede)?;
    let general = crate::dns::reply::encode_general(bytes, rcode, ede);
    let Some((general, question)) = general else {
        return Some("the general decoder refuses a query the wire way takes".into());
    };
    if general != wire {
        return Some(format!(
            "answers differ:\n wire {wire:02x?}\n hickory {general:02x?}"
        ));
    }
    let labels: Vec<&[u8]> = query.labels().collect();
    let (qtype, qclass, name) = question;
    if (qtype, qclass) != (query.qtype, query.qclass) || labels != name {
        return Some(format!("questions differ: {labels:?} against {name:?}"));
    }
    let Some(owner) = query.owner() else {
        return Some("the owner name cannot be read".into());
    };
    if owner.iter().map(<[u8]>::to_vec).collect::<Vec<_>>() != name {
        return Some("the owner name differs".into());
    }
    let shown = owner.to_ascii().trim_end_matches('.').to_ascii_lowercase();
    // Written over a text that held something else, as the receive loop's scratch does.
    let mut text = String::from("Stale.Example");
    query.name_text_into(&mut text);
    if text != shown {
        return Some(format!(
            "the name's text differs: {text:?} against hickory's {shown:?}"
        ));
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;
    use hickory_proto::op::{Edns, Message, Query as HQuery};
    use hickory_proto::rr::rdata::opt::EdnsOption;
    use hickory_proto::rr::{DNSClass, RecordType};
    use std::str::FromStr;

    fn query(name: &str, edns: Option<Edns>) -> Vec<u8> {
        let mut m = Message::new();
        m.set_id(0xbeef);
        m.set_recursion_desired(true);
        m.set_checking_disabled(true);
        m.add_query(HQuery::query(
            Name::from_str(name).expect("name"),
            RecordType::A,
        ));
        if let Some(e) = edns {
            m.set_edns(e);
        }
        m.to_vec().expect("encode")
    }

    const CODES: [ResponseCode; 4] = [
        ResponseCode::NXDomain,
        ResponseCode::Refused,
        ResponseCode::NoError,
        ResponseCode::ServFail,
    ];

    #[test]
    fn a_plain_query_is_answered_as_hickory_answers_it() {
        let mut cookie = Edns::new();
        cookie.set_max_payload(4096);
        cookie
            .options_mut()
            .insert(EdnsOption::Unknown(10, vec![1, 2, 3, 4, 5, 6, 7, 8]));
        for edns in [None, Some(Edns::new()), Some(cookie)] {
            let mut bytes = query("q0123.exfil.bench.", edns.clone());
            // hickory's encoder writes lower case; a client need not.
            bytes[13] = b'Q';
            bytes[25] = b'B';
            let q = Query::read(&bytes).expect("the common shape");
            assert_eq!((q.qtype, q.qclass), (1, 1));
            let labels: Vec<&[u8]> = q.labels().collect();
            assert_eq!(labels, [&b"Q0123"[..], b"exfil", b"Bench"]);
            for code in CODES {
                for ede in [
                    None,
                    Some((15, "egress-proxy [no_rule_matched]: q0123.exfil.bench")),
                ] {
                    assert_eq!(differs(&bytes, code, ede), None, "{code} {edns:?}");
                }
            }
        }
    }

    #[test]
    fn other_shapes_go_the_general_way() {
        let plain = query("a.test.", None);
        let mut trailing = plain.clone();
        trailing.push(0);
        let mut response = plain.clone();
        response[2] |= 0x80;
        let mut two = Message::new();
        for n in ["a.test.", "b.test."] {
            two.add_query(HQuery::query(Name::from_str(n).expect("n"), RecordType::A));
        }
        let mut chaos = HQuery::query(Name::from_str("a.test.").expect("n"), RecordType::A);
        chaos.set_query_class(DNSClass::CH);
        let chaos = Message::new().add_query(chaos).to_vec().expect("encode");
        let escaped = query("a\\.b.test.", None);
        let mut subnet = Edns::new();
        subnet
            .options_mut()
            .insert(EdnsOption::Unknown(8, vec![0, 1, 0, 0]));
        let subnet = query("a.test.", Some(subnet));
        let two = two.to_vec().expect("encode");
        for (what, bytes) in [
            ("trailing bytes", trailing),
            ("a response", response),
            ("two questions", two),
            ("an escaped label", escaped),
            ("a client subnet", subnet),
            ("a header alone", plain[..12].to_vec()),
        ] {
            assert!(Query::read(&bytes).is_none(), "{what}");
        }
        // Class CH is the common shape; the listener refuses it.
        assert_eq!(Query::read(&chaos).map(|q| q.qclass), Some(3));
    }

    #[test]
    fn an_answer_larger_than_the_payload_is_left_to_the_general_encoder() {
        let bytes = query("a.test.", Some(Edns::new()));
        let q = Query::read(&bytes).expect("the common shape");
        let long = "x".repeat(600);
        assert!(q
            .answer(ResponseCode::NXDomain, Some((15, &long)))
            .is_none());
        assert!(q
            .answer(ResponseCode::NXDomain, Some((15, "short")))
            .is_some());
    }

    proptest::proptest! {
        /// Any bytes: where the wire way answers, it answers as hickory does.
        #[test]
        fn any_bytes_answer_alike(
            bytes in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..80),
            code in 0usize..4,
            text in "[ -~]{0,40}",
        ) {
            proptest::prop_assert_eq!(differs(&bytes, CODES[code], Some((15, &text))), None);
        }

        /// Queries of the common shape, with bytes flipped.
        #[test]
        fn near_queries_answer_alike(
            name in "[a-zA-Z0-9_-]{1,20}(\\.[a-z0-9]{1,10}){0,3}",
            edns in proptest::option::of((0u16..5000, proptest::collection::vec(proptest::prelude::any::<u8>(), 0..12))),
            flip in proptest::option::of((0usize..80, proptest::prelude::any::<u8>())),
            code in 0usize..4,
        ) {
            let edns = edns.map(|(payload, option)| {
                let mut e = Edns::new();
                e.set_max_payload(payload);
                e.options_mut().insert(EdnsOption::Unknown(10, option));
                e
            });
            let Ok(name) = Name::from_str(&format!("{name}.")) else { return Ok(()) };
            let mut m = Message::new();
            m.set_id(7);
            m.add_query(HQuery::query(name, RecordType::A));
            if let Some(e) = edns { m.set_edns(e); }
            let mut bytes = m.to_vec().expect("encode");
            if let Some((at, b)) = flip {
                if let Some(byte) = bytes.get_mut(at) { *byte = b; }
            }
            proptest::prop_assert_eq!(differs(&bytes, CODES[code], None), None);
            proptest::prop_assert_eq!(differs(&bytes, CODES[code], Some((15, "why"))), None);
        }
    }
}
