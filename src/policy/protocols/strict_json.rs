//! JSON read the way no server can read differently: a document whose objects repeat a key
//! at any depth is refused. Parsers disagree on `{"name": "search", "name": "delete"}` (the
//! first or the last wins), so a rule judged on one reading could be bypassed on the other.
//! Depth is bounded by `serde_json`'s own recursion limit; trailing bytes are refused.
//! [`parse_borrowed`] reads into a [`Json`] tree that borrows its strings from the body (the
//! MCP and JSON-RPC rules); [`parse`] gives a `serde_json::Value` for the rules that keep one;
//! [`super::json_skim`] reads as strictly and keeps only what a response filter asks.

use std::borrow::Cow;
use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::Value;

use super::json_tree::Json;
use super::ProtocolError;

/// Objects with more members than this are checked for a repeated key by sorting their keys,
/// not by comparing every pair (a hostile body's 100,000 keys cost n log n, not n²).
pub(super) const PAIRWISE: usize = 16;

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
pub(super) fn read_whole<'a, T>(
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
pub(super) struct Strict;

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
pub(super) fn new_among_few<'k, E: de::Error>(
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
pub(super) fn once_each<'k, E: de::Error>(
    keys: impl ExactSizeIterator<Item = &'k str>,
) -> Result<(), E> {
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

/// An object's key, borrowed from the body when it carries no escape. Compared after its
/// escapes are read: `"n\u0061me"` is `"name"`.
pub(super) struct Key;

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
pub(super) mod tests {
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
    pub(crate) enum Gen {
        Leaf(Value),
        Arr(Vec<Gen>),
        Obj(Vec<(String, bool, Gen)>),
    }

    impl Gen {
        pub(crate) fn text(&self) -> String {
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

        pub(crate) fn repeats_a_key(&self) -> bool {
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

    pub(crate) fn gen() -> impl proptest::strategy::Strategy<Value = Gen> {
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
