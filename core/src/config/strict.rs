//! Strict JSON: duplicate keys and unknown fields are errors naming their path.

use crate::error::{Error, Result};
use serde_json::{Map, Value};

/// What a JSON value is, for messages about values that may hold secrets (URLs with
/// passwords), which are never echoed.
pub(super) fn kind(v: &Value) -> &'static str {
    match v {
        Value::Null => "null",
        Value::Bool(_) => "a boolean",
        Value::Number(_) => "a number",
        Value::String(_) => "a string",
        Value::Array(_) => "a list",
        Value::Object(_) => "an object",
    }
}

/// Parses JSON like `serde_json::from_str::<Value>`, but fails on a key that appears twice
/// in one object, naming its path (`policies.login`, `shards[1].url`): how configs are read.
pub fn parse_strict_json(text: &str) -> Result<Value> {
    use serde::de::DeserializeSeed;
    let duplicate = std::cell::RefCell::new(None);
    let mut de = serde_json::Deserializer::from_str(text);
    let parsed = StrictValue {
        path: String::new(),
        duplicate: &duplicate,
    }
    .deserialize(&mut de)
    .and_then(|v| de.end().map(|_| v));
    parsed.map_err(|e| match duplicate.take() {
        Some(path) => Error::config(
            path,
            format!(
                "duplicate key (line {}, column {}); each key may appear only once",
                e.line(),
                e.column()
            ),
        ),
        None => Error::config(
            "config",
            format!(
                "not valid JSON: {e} (line {}, column {})",
                e.line(),
                e.column()
            ),
        ),
    })
}

/// A JSON value at `path` whose objects may not repeat a key; the path of the first
/// repeated key goes to `duplicate`. serde_json's recursion limit still applies.
pub(super) struct StrictValue<'a> {
    path: String,
    duplicate: &'a std::cell::RefCell<Option<String>>,
}

impl<'a> StrictValue<'a> {
    fn child(&self, path: String) -> StrictValue<'a> {
        StrictValue {
            path,
            duplicate: self.duplicate,
        }
    }
}

impl<'de> serde::de::DeserializeSeed<'de> for StrictValue<'_> {
    type Value = Value;
    fn deserialize<D: serde::Deserializer<'de>>(
        self,
        d: D,
    ) -> std::result::Result<Value, D::Error> {
        d.deserialize_any(self)
    }
}

impl<'de> serde::de::Visitor<'de> for StrictValue<'_> {
    type Value = Value;
    fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
        f.write_str("a JSON value")
    }
    fn visit_bool<E>(self, v: bool) -> std::result::Result<Value, E> {
        Ok(Value::Bool(v))
    }
    fn visit_i64<E>(self, v: i64) -> std::result::Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_u64<E>(self, v: u64) -> std::result::Result<Value, E> {
        Ok(Value::from(v))
    }
    fn visit_f64<E>(self, v: f64) -> std::result::Result<Value, E> {
        Ok(serde_json::Number::from_f64(v).map_or(Value::Null, Value::Number))
    }
    fn visit_str<E>(self, v: &str) -> std::result::Result<Value, E> {
        Ok(Value::String(v.to_string()))
    }
    fn visit_string<E>(self, v: String) -> std::result::Result<Value, E> {
        Ok(Value::String(v))
    }
    fn visit_unit<E>(self) -> std::result::Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_none<E>(self) -> std::result::Result<Value, E> {
        Ok(Value::Null)
    }
    fn visit_seq<A: serde::de::SeqAccess<'de>>(
        self,
        mut seq: A,
    ) -> std::result::Result<Value, A::Error> {
        let mut out = Vec::new();
        while let Some(v) =
            seq.next_element_seed(self.child(format!("{}[{}]", self.path, out.len())))?
        {
            out.push(v);
        }
        Ok(Value::Array(out))
    }
    fn visit_map<A: serde::de::MapAccess<'de>>(
        self,
        mut map: A,
    ) -> std::result::Result<Value, A::Error> {
        let mut out = Map::new();
        while let Some(k) = map.next_key::<String>()? {
            let path = if self.path.is_empty() {
                k.clone()
            } else {
                format!("{}.{k}", self.path)
            };
            if out.contains_key(&k) {
                *self.duplicate.borrow_mut() = Some(path);
                return Err(serde::de::Error::custom("duplicate key"));
            }
            let v = map.next_value_seed(self.child(path))?;
            out.insert(k, v);
        }
        Ok(Value::Object(out))
    }
}

pub(super) fn check_fields(obj: &Map<String, Value>, path: &str, known: &[&str]) -> Result<()> {
    for k in obj.keys() {
        if !known.contains(&k.as_str()) {
            return Err(Error::config(
                format!("{path}{k}"),
                format!("unknown field; expected one of: {}", known.join(", ")),
            ));
        }
    }
    Ok(())
}
