//! JSON read the way no server can read differently: a document whose objects repeat a key
//! at any depth is refused. Parsers disagree on `{"name": "search", "name": "delete"}` (the
//! first or the last wins), so a rule judged on one reading could be bypassed on the other.
//! Depth is bounded by `serde_json`'s own recursion limit; trailing bytes are refused.

use std::fmt;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde_json::{Map, Value};

use super::ProtocolError;

/// `bytes` as one JSON value, refused when an object repeats a key or anything follows it.
pub fn parse(bytes: &[u8]) -> Result<Value, ProtocolError> {
    let mut de = serde_json::Deserializer::from_slice(bytes);
    let v = Strict.deserialize(&mut de).map_err(|e| {
        ProtocolError::malformed(format!("the body is not JSON this proxy can judge: {e}"))
    })?;
    de.end().map_err(|e| {
        ProtocolError::malformed(format!("the body has bytes after its JSON value: {e}"))
    })?;
    Ok(v)
}

/// A [`Value`] built by a visitor that refuses duplicate keys.
struct Strict;

impl<'de> DeserializeSeed<'de> for Strict {
    type Value = Value;
    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<Value, D::Error> {
        d.deserialize_any(Strict)
    }
}

impl<'de> Visitor<'de> for Strict {
    type Value = Value;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Value, E> {
        serde_json::Number::from_f64(v)
            .map(Value::Number)
            .ok_or_else(|| E::custom("a number JSON cannot carry"))
    }
    fn visit_str<E>(self, v: &str) -> Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) = seq.next_element_seed(Strict)? {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(k) = map.next_key::<String>()? {
            let v = map.next_value_seed(Strict)?;
            if out.contains_key(&k) {
                return Err(de::Error::custom(format!("the key `{k}` appears twice")));
            }
            out.insert(k, v);
        }
        Ok(Value::Object(out))
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
    fn trailing_bytes_and_deep_nesting_are_refused_without_a_crash() {
        assert!(parse(br#"{"a":1} {"a":2}"#).is_err());
        assert!(parse(b"").is_err());
        let deep = "[".repeat(100_000);
        assert!(parse(deep.as_bytes()).is_err());
        let deep_obj = r#"{"a":"#.repeat(100_000);
        assert!(parse(deep_obj.as_bytes()).is_err());
    }
}
