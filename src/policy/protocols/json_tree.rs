//! A JSON document as the protocol rules read it: a tree that borrows its strings from the
//! body it was read from ([`super::strict_json::parse_borrowed`]). A string without escapes
//! is a slice of the body, not a copy; an object is its pairs in the order they came, not a
//! map. A terminated MCP `tools/call` built two `serde_json::Value` trees (the request and
//! the response), an allocation for every key, string and object: a third of the call's
//! allocations by a uprobe on `malloc`. Here an object or an array is one allocation and a
//! string none, unless it carries an escape.
//!
//! Objects never repeat a key (the reader refuses it), so a lookup by key has one answer.
//! Written back ([`Json`]'s `Serialize` and `Display`), a tree is compact JSON with its keys
//! in their order.

use std::borrow::Cow;
use std::fmt;

use serde::ser::{Serialize, SerializeMap, SerializeSeq, Serializer};
use serde_json::{Number, Value};

/// One JSON value, its strings borrowed from the body where they carried no escape.
#[derive(Debug, Clone, PartialEq)]
pub enum Json<'a> {
    /// `null`.
    Null,
    /// `true` or `false`.
    Bool(bool),
    /// A number, as `serde_json` reads it.
    Num(Number),
    /// A string, its escapes read.
    Str(Cow<'a, str>),
    /// An array.
    Arr(Vec<Json<'a>>),
    /// An object: its pairs in order, no key twice.
    Obj(Vec<(Cow<'a, str>, Json<'a>)>),
}

/// What a missing member reads as.
pub static NULL: Json<'static> = Json::Null;

impl<'a> Json<'a> {
    /// The member `key` of an object.
    pub fn get(&self, key: &str) -> Option<&Json<'a>> {
        match self {
            Json::Obj(pairs) => pairs.iter().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// The member `key` of an object, to change it.
    pub fn get_mut(&mut self, key: &str) -> Option<&mut Json<'a>> {
        match self {
            Json::Obj(pairs) => pairs.iter_mut().find(|(k, _)| k == key).map(|(_, v)| v),
            _ => None,
        }
    }

    /// Take the member `key` out of an object.
    pub fn remove(&mut self, key: &str) -> Option<Json<'a>> {
        match self {
            Json::Obj(pairs) => {
                let i = pairs.iter().position(|(k, _)| k == key)?;
                Some(pairs.remove(i).1)
            }
            _ => None,
        }
    }

    /// Set the member `key` of an object (replacing one of that name); nothing on another
    /// value.
    pub fn set(&mut self, key: &'a str, value: Json<'a>) {
        if let Json::Obj(pairs) = self {
            match pairs.iter_mut().find(|(k, _)| k == key) {
                Some((_, v)) => *v = value,
                None => pairs.push((Cow::Borrowed(key), value)),
            }
        }
    }

    /// The text of a string.
    pub fn as_str(&self) -> Option<&str> {
        match self {
            Json::Str(s) => Some(s),
            _ => None,
        }
    }

    /// Compact JSON text: an id as the key of what a client waits for.
    pub fn text(&self) -> String {
        // Writing to memory a tree whose keys are all strings does not fail.
        serde_json::to_string(self).unwrap_or_default()
    }

    /// The same value as a `serde_json::Value` (owned: for what outlives the body, such as
    /// the ids a refusal answers).
    pub fn to_value(&self) -> Value {
        match self {
            Json::Null => Value::Null,
            Json::Bool(b) => Value::Bool(*b),
            Json::Num(n) => Value::Number(n.clone()),
            Json::Str(s) => Value::String(s.to_string()),
            Json::Arr(items) => Value::Array(items.iter().map(Json::to_value).collect()),
            Json::Obj(pairs) => Value::Object(
                pairs
                    .iter()
                    .map(|(k, v)| (k.to_string(), v.to_value()))
                    .collect(),
            ),
        }
    }
}

/// Equal as JSON values are: an object to an object with the same members in any order.
impl PartialEq<Value> for Json<'_> {
    fn eq(&self, other: &Value) -> bool {
        match (self, other) {
            (Json::Null, Value::Null) => true,
            (Json::Bool(a), Value::Bool(b)) => a == b,
            (Json::Num(a), Value::Number(b)) => a == b,
            (Json::Str(a), Value::String(b)) => a == b,
            (Json::Arr(a), Value::Array(b)) => {
                a.len() == b.len() && a.iter().zip(b).all(|(x, y)| x == y)
            }
            // No key twice on either side: the same count and every pair found is equality.
            (Json::Obj(a), Value::Object(b)) => {
                a.len() == b.len()
                    && a.iter()
                        .all(|(k, v)| b.get(k.as_ref()).is_some_and(|w| v == w))
            }
            _ => false,
        }
    }
}

impl Serialize for Json<'_> {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        match self {
            Json::Null => s.serialize_unit(),
            Json::Bool(b) => s.serialize_bool(*b),
            Json::Num(n) => n.serialize(s),
            Json::Str(t) => s.serialize_str(t),
            Json::Arr(items) => {
                let mut seq = s.serialize_seq(Some(items.len()))?;
                for v in items {
                    seq.serialize_element(v)?;
                }
                seq.end()
            }
            Json::Obj(pairs) => {
                let mut map = s.serialize_map(Some(pairs.len()))?;
                for (k, v) in pairs {
                    map.serialize_entry(k.as_ref(), v)?;
                }
                map.end()
            }
        }
    }
}

/// Compact JSON text, as [`Json::text`].
impl fmt::Display for Json<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.text())
    }
}

#[cfg(test)]
mod tests {
    use super::super::strict_json::parse_borrowed;
    use super::*;

    #[test]
    fn strings_without_escapes_are_borrowed_and_lookups_find_members() {
        let body = br#"{"a":"plain","b":"tab\there","c":[1,2.5,null,true],"d":{"e":"f"}}"#;
        let mut doc = parse_borrowed(body).unwrap();
        assert!(matches!(
            doc.get("a"),
            Some(Json::Str(Cow::Borrowed("plain")))
        ));
        assert!(matches!(doc.get("b"), Some(Json::Str(Cow::Owned(s))) if s == "tab\there"));
        assert_eq!(
            doc.get("d").and_then(|d| d.get("e")).and_then(Json::as_str),
            Some("f")
        );
        assert!(doc.get("zz").is_none() && NULL.get("a").is_none());
        assert!(doc.remove("a").is_some() && doc.get("a").is_none());
        doc.set("a", Json::Bool(false));
        doc.set("b", Json::Null);
        assert_eq!(
            doc.to_string(),
            r#"{"b":null,"c":[1,2.5,null,true],"d":{"e":"f"},"a":false}"#
        );
    }

    #[test]
    fn numbers_written_back_read_as_they_were_read() {
        // Found by the `strict_json` fuzz target: without `serde_json`'s `float_roundtrip`,
        // this integer read as one float and, written back, as another.
        let body = br#"[2200000000000008384980382601066723,1e-7,0.1,-0.0,18446744073709551616]"#;
        let doc = parse_borrowed(body).unwrap();
        let again: Value = serde_json::from_str(&doc.text()).unwrap();
        assert_eq!(again, doc.to_value());
    }

    #[test]
    fn equality_with_a_value_is_json_equality() {
        let doc = parse_borrowed(br#"{"x":[1,"y"],"z":{"p":true,"q":null}}"#).unwrap();
        let same = serde_json::json!({"z":{"q":null,"p":true},"x":[1,"y"]});
        assert!(doc == same);
        assert_eq!(doc.to_value(), same);
        for other in [
            serde_json::json!({"x":[1,"y"]}),
            serde_json::json!({"x":[1,"y"],"z":{"p":true,"q":0}}),
            serde_json::json!({"x":["y",1],"z":{"p":true,"q":null}}),
            serde_json::json!({"x":[1,"y"],"z":{"p":true,"r":null}}),
        ] {
            assert!(doc != other, "{other}");
        }
        assert!(Json::Num(1.into()) == serde_json::json!(1));
        assert!(Json::Num(1.into()) != serde_json::json!(1.5));
        assert!(Json::Str("1".into()) != serde_json::json!(1));
    }
}
