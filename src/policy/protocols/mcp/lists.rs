//! The requests of one client body whose answers the response filter waits for, by id. A
//! body is nearly always one message: its request is held inline, compared without hashing
//! and without writing its id out as text (a `String` and two SipHash passes per call
//! before). The requests of a batch after its first go to a map, so that a hostile batch of
//! many thousand requests is looked up in constant time, never scanned.

use std::collections::HashMap;

use serde_json::{Number, Value};

use super::{Asked, List};
use crate::policy::protocols::json_tree::Json;

/// A request id as JSON-RPC allows it: a string, a number or `null`. Numbers compare as
/// `serde_json` reads them (`1` and `1.0` are two ids, as their texts are).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
enum Id {
    Str(Box<str>),
    Num(Number),
    Null,
}

impl Id {
    /// The id `j` names; `None` for a value no request can carry as its id.
    fn of(j: &Json<'_>) -> Option<Id> {
        match j {
            Json::Str(s) => Some(Id::Str(s.as_ref().into())),
            Json::Num(n) => Some(Id::Num(n.clone())),
            Json::Null => Some(Id::Null),
            _ => None,
        }
    }

    /// Whether `j` is this id (no copy made).
    fn is(&self, j: &Json<'_>) -> bool {
        match (self, j) {
            (Id::Str(a), Json::Str(b)) => **a == **b,
            (Id::Num(a), Json::Num(b)) => a == b,
            (Id::Null, Json::Null) => true,
            _ => false,
        }
    }

    fn to_value(&self) -> Value {
        match self {
            Id::Str(s) => Value::String(s.to_string()),
            Id::Num(n) => Value::Number(n.clone()),
            Id::Null => Value::Null,
        }
    }
}

/// What each request of one body asked for, by id: the answers the client waits for.
#[derive(Debug, Clone, Default)]
pub struct Lists {
    /// The body's first request.
    first: Option<(Id, Asked)>,
    /// The requests of a batch after the first.
    rest: HashMap<Id, Asked>,
}

impl Lists {
    /// No request.
    pub fn new() -> Lists {
        Lists::default()
    }

    /// The request `id` asked for `list` and waits for its answer (a second request with the
    /// same id takes the first one's place).
    pub fn ask(&mut self, id: &Json<'_>, list: List) {
        let Some(key) = Id::of(id) else {
            return;
        };
        let asked = Asked {
            list,
            answered: false,
        };
        match &mut self.first {
            None => self.first = Some((key, asked)),
            Some((k, a)) if *k == key => *a = asked,
            Some(_) => {
                self.rest.insert(key, asked);
            }
        }
    }

    /// The request answered by a message with this `id`.
    pub fn get(&self, id: &Json<'_>) -> Option<&Asked> {
        match &self.first {
            Some((k, a)) if k.is(id) => Some(a),
            _ if self.rest.is_empty() => None,
            _ => self.rest.get(&Id::of(id)?),
        }
    }

    /// [`Lists::get`], to mark it answered.
    pub fn get_mut(&mut self, id: &Json<'_>) -> Option<&mut Asked> {
        match &mut self.first {
            Some((k, a)) if k.is(id) => Some(a),
            _ if self.rest.is_empty() => None,
            _ => self.rest.get_mut(&Id::of(id)?),
        }
    }

    /// Whether the body sent no request.
    pub fn is_empty(&self) -> bool {
        self.first.is_none()
    }

    /// The ids of the requests whose answers have not come, first the body's first.
    pub fn unanswered(&self) -> impl Iterator<Item = Value> + '_ {
        self.first
            .iter()
            .map(|(k, a)| (k, a))
            .chain(&self.rest)
            .filter(|(_, a)| !a.answered)
            .map(|(k, _)| k.to_value())
    }
}

#[cfg(test)]
mod tests {
    use std::borrow::Cow;

    use super::*;

    fn num(n: u64) -> Json<'static> {
        Json::Num(n.into())
    }

    #[test]
    fn ids_are_found_by_kind_and_value() {
        let mut l = Lists::new();
        assert!(l.is_empty());
        l.ask(&num(1), List::Tools);
        l.ask(&Json::Str(Cow::Borrowed("1")), List::Prompts);
        l.ask(&Json::Null, List::Other);
        assert!(!l.is_empty());
        assert_eq!(l.get(&num(1)).map(|a| a.list), Some(List::Tools));
        let s = Json::Str(Cow::Owned("1".to_string()));
        assert_eq!(l.get(&s).map(|a| a.list), Some(List::Prompts));
        assert_eq!(l.get(&Json::Null).map(|a| a.list), Some(List::Other));
        assert_eq!(l.get(&num(2)), None);
        assert_eq!(l.get(&Json::Num(serde_json::Number::from(-1))), None);
        assert_eq!(l.get(&Json::Bool(true)), None);
        assert_eq!(l.get(&Json::Arr(vec![num(1)])), None);
        let float = Json::Num(serde_json::Number::from_f64(1.0).unwrap());
        assert_eq!(l.get(&float), None, "1.0 is another id than 1");
    }

    #[test]
    fn the_same_id_twice_is_one_request_and_the_last_asked_counts() {
        for first in [true, false] {
            let mut l = Lists::new();
            if !first {
                l.ask(&num(9), List::Other);
            }
            l.ask(&num(1), List::Tools);
            l.ask(&num(1), List::Resources);
            assert_eq!(l.get(&num(1)).map(|a| a.list), Some(List::Resources));
            assert_eq!(l.unanswered().count(), if first { 1 } else { 2 });
        }
    }

    #[test]
    fn what_is_marked_answered_is_not_unanswered() {
        let mut l = Lists::new();
        for i in 0..5 {
            l.ask(&num(i), List::Other);
        }
        l.ask(&Json::Obj(vec![]), List::Other);
        for i in [0, 3] {
            if let Some(a) = l.get_mut(&num(i)) {
                a.answered = true;
            }
        }
        let mut left: Vec<Value> = l.unanswered().collect();
        left.sort_by_key(Value::to_string);
        assert_eq!(left, vec![Value::from(1), Value::from(2), Value::from(4)]);
    }

    #[test]
    fn a_large_batch_is_found_whole() {
        let mut l = Lists::new();
        for i in 0..10_000 {
            l.ask(&num(i), List::Other);
        }
        for i in (0..10_000).step_by(7) {
            assert!(l.get_mut(&num(i)).is_some(), "{i}");
        }
        assert_eq!(l.get(&num(10_000)), None);
    }
}
