//! One JSON-RPC message read as strictly as [`super::strict_json`] reads a document (a key
//! twice at any depth, bytes after the value, not UTF-8, too deep: refused alike), keeping
//! only what the MCP response filter needs to know the message would pass unchanged. No tree
//! is built: the filter's common case, an answer that passes as it came, needs none.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};

use super::json_tree::Json;
use super::strict_json::{new_among_few, once_each, read_whole, Key, Strict, PAIRWISE};
use super::ProtocolError;

/// What a response filter needs of one JSON-RPC message to know it would pass unchanged,
/// read without building its tree ([`skim`]).
#[derive(Debug, Clone, PartialEq)]
pub struct Skim<'a> {
    /// The message has a `method` member (of any type).
    pub method: bool,
    /// Its `id`, when it has one.
    pub id: Option<Json<'a>>,
    /// Its `result` is an object with an `inputRequests` member.
    pub input_requests: bool,
}

/// `bytes` read exactly as strictly as [`parse_borrowed`] reads them (refused alike: a key
/// twice at any depth, bytes after the value, not UTF-8, too deep), keeping only a
/// [`Skim`] of the message. `Ok(None)` when the document is not one object (a batch): read
/// it whole. The MCP response filter's common case, an answer that passes as it came,
/// needs no tree, and building one was a fifth of the rule's cost.
pub fn skim(bytes: &[u8]) -> Result<Option<Skim<'_>>, ProtocolError> {
    read_whole(bytes, |de| de::Deserializer::deserialize_any(de, Skimmer))
}

/// Reads a message's top level for [`skim`]; anything but an object is read by [`Discarded`]
/// and gives `None`.
struct Skimmer;

impl<'de> Visitor<'de> for Skimmer {
    type Value = Option<Skim<'de>>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut skim = Skim {
            method: false,
            id: None,
            input_requests: false,
        };
        let mut keys = Seen::new();
        while let Some(k) = map.next_key_seed(Key)? {
            match k.as_ref() {
                "id" => skim.id = Some(map.next_value_seed(Strict)?),
                "result" => skim.input_requests = map.next_value_seed(Looking("inputRequests"))?,
                "method" => skim.method = map.next_value_seed(Discarded).map(|()| true)?,
                _ => map.next_value_seed(Discarded)?,
            }
            keys.add(k)?;
        }
        keys.once_each()?;
        Ok(Some(skim))
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<Self::Value, A::Error> {
        Discarded.visit_seq(seq).map(|()| None)
    }
    fn visit_bool<E>(self, _: bool) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_i64<E>(self, _: i64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_u64<E>(self, _: u64) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        Discarded.visit_f64(v).map(|()| None)
    }
    fn visit_str<E>(self, _: &str) -> Result<Self::Value, E> {
        Ok(None)
    }
    fn visit_unit<E>(self) -> Result<Self::Value, E> {
        Ok(None)
    }
}

/// Whether a value is an object with the member named; read by [`Discarded`] whatever it is.
struct Looking(&'static str);

impl<'de> DeserializeSeed<'de> for Looking {
    type Value = bool;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<bool, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Looking {
    type Value = bool;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<bool, A::Error> {
        let mut found = false;
        Discarded::members(map, |k| found |= k == self.0)?;
        Ok(found)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, seq: A) -> Result<bool, A::Error> {
        Discarded.visit_seq(seq).map(|()| false)
    }
    fn visit_bool<E>(self, _: bool) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_i64<E>(self, _: i64) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_u64<E>(self, _: u64) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<bool, E> {
        Discarded.visit_f64(v).map(|()| false)
    }
    fn visit_str<E>(self, _: &str) -> Result<bool, E> {
        Ok(false)
    }
    fn visit_unit<E>(self) -> Result<bool, E> {
        Ok(false)
    }
}

/// A value read as [`Strict`] reads it (refused alike) and kept nowhere.
struct Discarded;

impl Discarded {
    /// An object's members, values checked, keys shown to `each` and checked for repeats.
    fn members<'de, A: MapAccess<'de>>(
        mut map: A,
        mut each: impl FnMut(&str),
    ) -> Result<(), A::Error> {
        let mut keys = Seen::new();
        while let Some(k) = map.next_key_seed(Key)? {
            map.next_value_seed(Discarded)?;
            each(&k);
            keys.add(k)?;
        }
        keys.once_each()
    }
}

/// One object's keys read so far, for the repeated-key check: on the stack while there are
/// no more than [`PAIRWISE`] and none carries an escape (each compared with those before it,
/// as the tree reader does), all moved to the heap otherwise and sorted once at the end
/// ([`once_each`]). A skimmed answer's objects have a few keys each: one allocation per object
/// was most of what the skim cost beyond the tokenizer, and keys the stack held as `Cow`s
/// were dropped one by one, all 16 of them.
struct Seen<'de> {
    few: [&'de str; PAIRWISE],
    len: usize,
    many: Vec<Cow<'de, str>>,
}

impl<'de> Seen<'de> {
    fn new() -> Self {
        Seen {
            few: [""; PAIRWISE],
            len: 0,
            many: Vec::new(),
        }
    }

    /// `k` kept; `Err` when it repeats one of the first [`PAIRWISE`] keys.
    fn add<E: de::Error>(&mut self, k: Cow<'de, str>) -> Result<(), E> {
        if self.many.is_empty() {
            if let Cow::Borrowed(b) = k {
                if self.len < PAIRWISE {
                    new_among_few(self.few[..self.len].iter().copied(), b)?;
                    self.few[self.len] = b;
                    self.len += 1;
                    return Ok(());
                }
            }
            let held = self.few[..self.len].iter().map(|s| Cow::Borrowed(*s));
            self.many.extend(held);
        }
        // Compared pair by pair up to [`PAIRWISE`] keys, as on the stack; beyond, sorted.
        new_among_few(self.many.iter().map(Cow::as_ref), &k)?;
        self.many.push(k);
        Ok(())
    }

    /// `Err` when an object of more than [`PAIRWISE`] keys repeats one.
    fn once_each<E: de::Error>(&self) -> Result<(), E> {
        once_each(self.many.iter().map(Cow::as_ref))
    }
}

impl<'de> DeserializeSeed<'de> for Discarded {
    type Value = ();
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> Visitor<'de> for Discarded {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_map<A: MapAccess<'de>>(self, map: A) -> Result<(), A::Error> {
        Discarded::members(map, |_| ())
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        while seq.next_element_seed(Discarded)?.is_some() {}
        Ok(())
    }
    fn visit_bool<E>(self, _: bool) -> Result<(), E> {
        Ok(())
    }
    fn visit_i64<E>(self, _: i64) -> Result<(), E> {
        Ok(())
    }
    fn visit_u64<E>(self, _: u64) -> Result<(), E> {
        Ok(())
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        match v.is_finite() {
            true => Ok(()),
            false => Err(E::custom("a number JSON cannot carry")),
        }
    }
    fn visit_str<E>(self, _: &str) -> Result<(), E> {
        Ok(())
    }
    fn visit_unit<E>(self) -> Result<(), E> {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::policy::protocols::strict_json::parse_borrowed;
    use crate::policy::protocols::strict_json::tests::{gen, Gen};

    /// A message for [`skim`]'s differential: members named as a JSON-RPC message's (now
    /// and then twice), `result` sometimes an object asking for input, any values below.
    fn message() -> impl proptest::strategy::Strategy<Value = Gen> {
        use proptest::prelude::*;
        let key = prop_oneof![
            Just("id"),
            Just("method"),
            Just("result"),
            Just("jsonrpc"),
            Just("inputRequests"),
        ];
        let value = prop_oneof![
            gen(),
            gen().prop_map(|g| Gen::Obj(vec![("inputRequests".into(), false, g)])),
        ];
        proptest::collection::vec((key, any::<bool>(), value), 0..6).prop_map(|pairs| {
            Gen::Obj(
                pairs
                    .into_iter()
                    .map(|(k, esc, v)| (k.to_string(), esc, v))
                    .collect(),
            )
        })
    }

    #[test]
    fn a_skim_refuses_what_the_whole_reading_refuses() {
        for bad in [
            &br#"{"id":1,"result":{"content":[{"a":1,"a":2}]}}"#[..],
            br#"{"id":1,"id":2}"#,
            br#"{"result":{"inputRequests":1,"inputRequests":2}}"#,
            br#"{"id":1} 2"#,
            b"{\"id\":\"\xff\"}",
            br#"{"id":1,"result":1e400}"#,
        ] {
            assert!(skim(bad).is_err(), "{bad:?}");
            assert!(parse_borrowed(bad).is_err(), "{bad:?}");
        }
        let deep = format!(r#"{{"id":1,"result":{}}}"#, "[".repeat(100_000));
        assert!(skim(deep.as_bytes()).is_err());
        assert_eq!(skim(b"[1,2]").unwrap(), None);
    }

    /// Up to [`PAIRWISE`] keys are compared pair by pair on the stack, more are sorted on the
    /// heap: a repeat is found wherever it falls, on either side of the boundary and across it.
    #[test]
    fn a_repeated_key_is_found_in_an_object_of_any_size() {
        for n in [1, PAIRWISE - 1, PAIRWISE, PAIRWISE + 1, 3 * PAIRWISE] {
            let keys: Vec<String> = (0..n).map(|i| format!("k{i}")).collect();
            let object = |keys: &[String]| {
                let members: Vec<String> = keys.iter().map(|k| format!(r#""{k}":1"#)).collect();
                format!(r#"{{"id":1,"result":{{{}}}}}"#, members.join(","))
            };
            assert!(skim(object(&keys).as_bytes()).is_ok(), "{n} distinct keys");
            // A key written with an escape (`\u006b` is `k`) is the same key.
            let escaped = |k: &str| k.replacen('k', "\\u006b", 1);
            for (first, again) in [(0, 0), (0, n - 1), (n - 1, n - 1), (n / 2, 0)] {
                for (a, b) in [(false, false), (false, true), (true, false)] {
                    let mut twice = keys.clone();
                    twice.insert(again + 1, keys[first].clone());
                    if a {
                        twice[first] = escaped(&twice[first]);
                    }
                    if b {
                        twice[again + 1] = escaped(&twice[again + 1]);
                    }
                    let text = object(&twice);
                    assert!(skim(text.as_bytes()).is_err(), "{n} keys, {text}");
                    assert!(parse_borrowed(text.as_bytes()).is_err(), "{n} keys, {text}");
                }
            }
            let mut one_escaped = keys.clone();
            one_escaped[n / 2] = escaped(&one_escaped[n / 2]);
            assert!(
                skim(object(&one_escaped).as_bytes()).is_ok(),
                "{n} keys, one escaped"
            );
        }
    }

    proptest::proptest! {
        /// [`skim`] refuses exactly what [`parse_borrowed`] refuses, and what it keeps is
        /// what the tree says.
        #[test]
        fn a_skim_reads_as_the_tree_reads(doc in message()) {
            let text = doc.text();
            match (skim(text.as_bytes()), parse_borrowed(text.as_bytes())) {
                (Ok(Some(s)), Ok(tree)) => {
                    proptest::prop_assert_eq!(s.method, tree.get("method").is_some());
                    proptest::prop_assert_eq!(s.id.as_ref(), tree.get("id"));
                    let asks = tree.get("result").and_then(|r| r.get("inputRequests"));
                    proptest::prop_assert_eq!(s.input_requests, asks.is_some());
                }
                (Err(_), Err(_)) => proptest::prop_assert!(doc.repeats_a_key()),
                (s, t) => proptest::prop_assert!(false, "{}: {:?} / {:?}", text, s, t),
            }
        }
    }
}
