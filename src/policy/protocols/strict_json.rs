//! JSON read the way no server can read differently: a document whose objects repeat a key
//! at any depth is refused. Parsers disagree on `{"name": "search", "name": "delete"}` (the
//! first or the last wins), so a rule judged on one reading could be bypassed on the other.
//! Depth is bounded by `serde_json`'s own recursion limit; trailing bytes are refused.
//! [`parse_borrowed`] reads into a [`Json`] tree that borrows its strings from the body (the
//! MCP and JSON-RPC rules); [`parse`] gives a `serde_json::Value` for the rules that keep one.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use super::json_tree::Json;
use super::ProtocolError;

/// Objects with more members than this are checked for a repeated key by sorting their keys,
/// not by comparing every pair (a hostile body's 100,000 keys cost n log n, not n²).
const PAIRWISE: usize = 16;

/// `bytes` as one JSON value, refused when an object repeats a key or anything follows it.
pub fn parse(bytes: &[u8]) -> Result<Value, ProtocolError> {
    parse_borrowed(bytes).map(|doc| doc.to_value())
}

/// [`parse`], into a tree that borrows from `bytes` every string without an escape.
pub fn parse_borrowed(bytes: &[u8]) -> Result<Json<'_>, ProtocolError> {
    read_whole(bytes, |de| Strict.deserialize(de))
}

/// `bytes` as one JSON value read by `read`, refused when it is not UTF-8, `read` refuses
/// it or anything follows it.
fn read_whole<'a, T>(
    bytes: &'a [u8],
    read: impl FnOnce(
        &mut serde_json::Deserializer<serde_json::de::StrRead<'a>>,
    ) -> Result<T, serde_json::Error>,
) -> Result<T, ProtocolError> {
    // JSON is UTF-8 throughout (RFC 8259), and a byte outside a string that is not ASCII is
    // a syntax error anyway: checked once here, the strings need no check of their own.
    let text = std::str::from_utf8(bytes).map_err(|e| {
        ProtocolError::malformed_caused("the body is not JSON this proxy can judge", e)
    })?;
    let mut de = serde_json::Deserializer::from_str(text);
    let v = read(&mut de).map_err(|e| {
        ProtocolError::malformed_caused("the body is not JSON this proxy can judge", e)
    })?;
    de.end().map_err(|e| {
        ProtocolError::malformed_caused("the body has bytes after its JSON value", e)
    })?;
    Ok(v)
}

/// A [`Json`] built by a visitor that refuses duplicate keys.
struct Strict;

impl<'de> DeserializeSeed<'de> for Strict {
    type Value = Json<'de>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Json<'de>, D::Error> {
        d.deserialize_any(Strict)
    }
}

impl<'de> Visitor<'de> for Strict {
    type Value = Json<'de>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Json<'de>, E> {
        Ok(Json::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Json<'de>, E> {
        Ok(Json::Num(v.into()))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Json<'de>, E> {
        Ok(Json::Num(v.into()))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Json<'de>, E> {
        serde_json::Number::from_f64(v)
            .map(Json::Num)
            .ok_or_else(|| E::custom("a number JSON cannot carry"))
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Json<'de>, E> {
        Ok(Json::Str(Cow::Borrowed(v)))
    }
    fn visit_str<E>(self, v: &str) -> Result<Json<'de>, E> {
        Ok(Json::Str(Cow::Owned(v.to_string())))
    }
    fn visit_string<E>(self, v: String) -> Result<Json<'de>, E> {
        Ok(Json::Str(Cow::Owned(v)))
    }
    fn visit_unit<E>(self) -> Result<Json<'de>, E> {
        Ok(Json::Null)
    }
    fn visit_none<E>(self) -> Result<Json<'de>, E> {
        Ok(Json::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Json<'de>, A::Error> {
        // Small arrays and objects are the rule: one allocation, not a grow from empty.
        let mut out = Vec::with_capacity(4);
        while let Some(v) = seq.next_element_seed(Strict)? {
            out.push(v);
        }
        Ok(Json::Arr(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Json<'de>, A::Error> {
        let mut out: Vec<(Cow<'de, str>, Json<'de>)> = Vec::with_capacity(4);
        while let Some(k) = map.next_key_seed(Key)? {
            let v = map.next_value_seed(Strict)?;
            new_among_few(out.iter().map(|(seen, _)| seen.as_ref()), &k)?;
            out.push((k, v));
        }
        once_each(out.iter().map(|(k, _)| k.as_ref()))?;
        Ok(Json::Obj(out))
    }
}

/// `Err` when `key` is among the keys an object has shown so far, while they are few (up to
/// [`PAIRWISE`]; [`once_each`] checks larger objects whole).
fn new_among_few<'k, E: de::Error>(
    seen: impl ExactSizeIterator<Item = &'k str>,
    key: &str,
) -> Result<(), E> {
    let mut seen = seen;
    match seen.len() < PAIRWISE && seen.any(|s| s == key) {
        true => Err(twice(key)),
        false => Ok(()),
    }
}

/// `Err` when an object of more than [`PAIRWISE`] keys repeats one: sorted, not compared
/// pair by pair.
fn once_each<'k, E: de::Error>(keys: impl ExactSizeIterator<Item = &'k str>) -> Result<(), E> {
    if keys.len() <= PAIRWISE {
        return Ok(());
    }
    let mut keys: Vec<&str> = keys.collect();
    keys.sort_unstable();
    match keys.windows(2).find(|w| w[0] == w[1]) {
        Some(w) => Err(twice(w[0])),
        None => Ok(()),
    }
}

fn twice<E: de::Error>(key: &str) -> E {
    E::custom(format!("the key `{key}` appears twice"))
}

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
        let mut keys: Vec<Cow<'de, str>> = Vec::with_capacity(4);
        while let Some(k) = map.next_key_seed(Key)? {
            match k.as_ref() {
                "id" => skim.id = Some(map.next_value_seed(Strict)?),
                "result" => skim.input_requests = map.next_value_seed(Looking("inputRequests"))?,
                "method" => skim.method = map.next_value_seed(Discarded).map(|()| true)?,
                _ => map.next_value_seed(Discarded)?,
            }
            new_among_few(keys.iter().map(Cow::as_ref), &k)?;
            keys.push(k);
        }
        once_each(keys.iter().map(Cow::as_ref))?;
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
        let mut keys: Vec<Cow<'de, str>> = Vec::with_capacity(4);
        while let Some(k) = map.next_key_seed(Key)? {
            map.next_value_seed(Discarded)?;
            new_among_few(keys.iter().map(Cow::as_ref), &k)?;
            each(&k);
            keys.push(k);
        }
        once_each(keys.iter().map(Cow::as_ref))
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

/// An object's key, borrowed from the body when it carries no escape. Compared after its
/// escapes are read: `"n\u0061me"` is `"name"`.
struct Key;

impl<'de> DeserializeSeed<'de> for Key {
    type Value = Cow<'de, str>;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Cow<'de, str>, D::Error> {
        d.deserialize_str(Key)
    }
}

impl<'de> Visitor<'de> for Key {
    type Value = Cow<'de, str>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("an object key")
    }
    fn visit_borrowed_str<E>(self, v: &'de str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Borrowed(v))
    }
    fn visit_str<E>(self, v: &str) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Cow<'de, str>, E> {
        Ok(Cow::Owned(v))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeated_key_at_any_depth_is_refused() {
        assert!(parse(br#"{"a":1,"a":2}"#).is_err());
        assert!(parse(br#"{"p":{"name":"x","name":"y"}}"#).is_err());
        assert!(parse(br#"[{"x":1},{"x":1,"x":1}]"#).is_err());
        // The same key after its escapes are read is the same key.
        assert!(parse(br#"{"name":1,"n\u0061me":2}"#).is_err());
        assert_eq!(
            parse(br#"{"a":1,"b":[1,2.5,"x",null,true]}"#).unwrap()["b"][1],
            2.5
        );
    }

    #[test]
    fn utf_8_is_read_as_serde_json_reads_it() {
        // Not UTF-8, in a string or outside one: refused, as `from_slice` refuses it.
        for bad in [
            &b"{\"a\":\"\xff\"}"[..],
            b"{\"\xc3\":1}",
            b"[1]\xff",
            b"\xef[1]",
        ] {
            assert!(parse(bad).is_err(), "{bad:?}");
            assert!(serde_json::from_slice::<Value>(bad).is_err(), "{bad:?}");
        }
        let doc = parse_borrowed("{\"q\":\"caf\u{e9} \u{1f980}\"}".as_bytes()).unwrap();
        assert_eq!(
            doc.get("q").and_then(Json::as_str),
            Some("caf\u{e9} \u{1f980}")
        );
    }

    #[test]
    fn trailing_bytes_and_deep_nesting_are_refused_without_a_crash() {
        assert!(parse(br#"{"a":1} {"a":2}"#).is_err());
        assert!(parse(b"").is_err());
        let deep = "[".repeat(100_000);
        assert!(parse(deep.as_bytes()).is_err());
        let deep_obj = r#"{"a":"#.repeat(100_000);
        assert!(parse(deep_obj.as_bytes()).is_err());
    }

    #[test]
    fn a_key_repeated_among_many_is_found_without_comparing_every_pair() {
        let many = |last: &str| {
            let pairs: Vec<String> = (0..100_000).map(|i| format!("\"k{i}\":{i}")).collect();
            format!("{{{},\"{last}\":0}}", pairs.join(","))
        };
        assert!(parse(many("k99999").as_bytes()).is_err());
        assert!(parse(many("k0").as_bytes()).is_err());
        assert!(parse(many("fresh").as_bytes()).is_ok());
    }

    /// A document for the differential below: an object may repeat a key (one key copied to
    /// another position, some keys written with a `\u` escape), and some objects are larger
    /// than [`PAIRWISE`].
    #[derive(Debug, Clone)]
    enum Gen {
        Leaf(Value),
        Arr(Vec<Gen>),
        Obj(Vec<(String, bool, Gen)>),
    }

    impl Gen {
        fn text(&self) -> String {
            match self {
                Gen::Leaf(v) => v.to_string(),
                Gen::Arr(items) => {
                    let items: Vec<String> = items.iter().map(Gen::text).collect();
                    format!("[{}]", items.join(","))
                }
                Gen::Obj(pairs) => {
                    let pairs: Vec<String> = pairs
                        .iter()
                        .map(|(k, esc, v)| {
                            let key = match esc {
                                true => {
                                    format!("\"\\u{:04x}{}\"", u32::from(k.as_bytes()[0]), &k[1..])
                                }
                                false => format!("\"{k}\""),
                            };
                            format!("{key}:{}", v.text())
                        })
                        .collect();
                    format!("{{{}}}", pairs.join(","))
                }
            }
        }

        fn repeats_a_key(&self) -> bool {
            match self {
                Gen::Leaf(_) => false,
                Gen::Arr(items) => items.iter().any(Gen::repeats_a_key),
                Gen::Obj(pairs) => {
                    let keys: std::collections::HashSet<&str> =
                        pairs.iter().map(|(k, _, _)| k.as_str()).collect();
                    keys.len() < pairs.len() || pairs.iter().any(|(_, _, v)| v.repeats_a_key())
                }
            }
        }
    }

    fn gen() -> impl proptest::strategy::Strategy<Value = Gen> {
        use proptest::prelude::*;
        let leaf = prop_oneof![
            Just(Value::Null),
            any::<bool>().prop_map(Value::Bool),
            any::<i64>().prop_map(Value::from),
            (-1e9f64..1e9).prop_map(Value::from),
            "[a-z\\\\\"\u{e9}\n]{0,6}".prop_map(Value::String),
        ]
        .prop_map(Gen::Leaf);
        leaf.prop_recursive(4, 64, 24, |inner| {
            prop_oneof![
                proptest::collection::vec(inner.clone(), 0..6).prop_map(Gen::Arr),
                (
                    proptest::collection::vec(("[a-z]{1,3}", any::<bool>(), inner), 0..24),
                    any::<Option<(prop::sample::Index, prop::sample::Index)>>(),
                )
                    .prop_map(|(mut pairs, copy)| {
                        // Now and then one key written again elsewhere, at any position.
                        if let (Some((from, to)), false) = (copy, pairs.is_empty()) {
                            let key = pairs[from.index(pairs.len())].0.clone();
                            let at = to.index(pairs.len());
                            pairs[at].0 = key;
                        }
                        Gen::Obj(pairs)
                    }),
            ]
        })
    }

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

    proptest::proptest! {
        /// The strict reader refuses exactly the documents that repeat a key somewhere, and
        /// reads every other one as `serde_json` does; the borrowed tree written back is the
        /// same document.
        #[test]
        fn it_refuses_exactly_repeated_keys_and_reads_the_rest_as_serde_json(doc in gen()) {
            let text = doc.text();
            let strict = parse(text.as_bytes());
            if doc.repeats_a_key() {
                proptest::prop_assert!(strict.is_err(), "{}", text);
            } else {
                let plain: Value = serde_json::from_str(&text).unwrap();
                proptest::prop_assert_eq!(strict.unwrap(), plain.clone());
                let tree = parse_borrowed(text.as_bytes()).unwrap();
                proptest::prop_assert!(tree == plain);
                let written: Value = serde_json::from_str(&tree.to_string()).unwrap();
                proptest::prop_assert_eq!(written, plain);
            }
        }
    }
}
