//! JSON kept as its text: an execution's `params` from its admission to the answers that echo
//! them. A parsed `serde_json::Value` costs 32 bytes and more per element (a params object of
//! 64 KiB of small numbers takes over a megabyte as a tree), so a value that is only stored and
//! sent back is never parsed into one: its canonical text is written straight from the
//! client's ([`canonical_text`]), held shared between the request, the store's call and every
//! answer built from it, and written out as it is.

use std::fmt;
use std::ops::Deref;
use std::sync::Arc;

use serde::de::{self, DeserializeSeed, Deserializer, MapAccess, SeqAccess, Visitor};
use serde::{Serialize, Serializer};
use serde_json::Value;
use serde_json::value::RawValue;

/// One JSON value held as its text. Cloning shares the text; serializing with serde_json
/// writes the text as it is, with no tree built.
#[derive(Clone)]
pub struct JsonText(Arc<RawValue>);

impl JsonText {
    /// The canonical text of the JSON value `raw` (see `canonical_text` below).
    pub fn canonical(raw: &str) -> Result<Self, serde_json::Error> {
        let text = String::from_utf8(canonical_text(raw)?).map_err(de::Error::custom)?;
        Self::parse(text)
    }

    /// Text that must be one JSON value (as read back from a row), checked without building it.
    pub fn parse(text: String) -> Result<Self, serde_json::Error> {
        RawValue::from_string(text).map(|raw| Self(Arc::from(raw)))
    }

    /// The text.
    pub fn as_str(&self) -> &str {
        self.0.get()
    }

    /// The value, parsed (for a caller that reads inside it).
    pub fn to_value(&self) -> Value {
        serde_json::from_str(self.as_str()).unwrap_or(Value::Null)
    }
}

impl Deref for JsonText {
    type Target = str;

    fn deref(&self) -> &str {
        self.as_str()
    }
}

impl PartialEq for JsonText {
    fn eq(&self, other: &Self) -> bool {
        self.as_str() == other.as_str()
    }
}

impl Eq for JsonText {}

impl fmt::Debug for JsonText {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

impl Serialize for JsonText {
    fn serialize<S: Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        self.0.serialize(s)
    }
}

/// The canonical text of the JSON value `raw`: exactly what `serde_json::Value`'s
/// `to_string` gives for it — compact, object keys sorted (by bytes), the last of a repeated
/// key kept, strings and numbers as serde_json writes them — written without building the
/// value. Objects are held member by member to sort them; everything else goes straight out.
/// (The one input the two differ on is an object whose first key is serde_json's private
/// raw-value token, which `Value` reads as the JSON inside its string; this keeps it as
/// written.)
pub fn canonical_text(raw: &str) -> Result<Vec<u8>, serde_json::Error> {
    let mut out = Vec::with_capacity(raw.len());
    let mut de = serde_json::Deserializer::from_str(raw);
    Canonical(&mut out).deserialize(&mut de)?;
    de.end()?;
    Ok(out)
}

/// Writes the canonical text of the value a deserializer reads into its buffer.
struct Canonical<'a>(&'a mut Vec<u8>);

impl<'de> DeserializeSeed<'de> for Canonical<'_> {
    type Value = ();

    fn deserialize<D: Deserializer<'de>>(self, d: D) -> Result<(), D::Error> {
        d.deserialize_any(self)
    }
}

/// Appends `v` as serde_json writes it.
fn write<E: de::Error, T: Serialize + ?Sized>(out: &mut Vec<u8>, v: &T) -> Result<(), E> {
    serde_json::to_writer(out, v).map_err(E::custom)
}

impl<'de> Visitor<'de> for Canonical<'_> {
    type Value = ();

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON value")
    }

    fn visit_bool<E: de::Error>(self, v: bool) -> Result<(), E> {
        self.0.extend_from_slice(if v { b"true" } else { b"false" });
        Ok(())
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<(), E> {
        // `Value` keeps a negative integer as one, and 0 or more as unsigned: written alike.
        write(self.0, &v)
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<(), E> {
        write(self.0, &v)
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<(), E> {
        // `Value` makes a number that is not finite null (serde_json's parser yields none).
        if v.is_finite() {
            write(self.0, &v)
        } else {
            self.visit_unit()
        }
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<(), E> {
        write(self.0, v)
    }

    fn visit_unit<E: de::Error>(self) -> Result<(), E> {
        self.0.extend_from_slice(b"null");
        Ok(())
    }

    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<(), A::Error> {
        self.0.push(b'[');
        let mut first = true;
        loop {
            let mark = self.0.len();
            if !first {
                self.0.push(b',');
            }
            if seq.next_element_seed(Canonical(self.0))?.is_none() {
                self.0.truncate(mark);
                break;
            }
            first = false;
        }
        self.0.push(b']');
        Ok(())
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<(), A::Error> {
        let mut members: Vec<(String, Vec<u8>)> = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            let mut value = Vec::new();
            map.next_value_seed(Canonical(&mut value))?;
            members.push((key, value));
        }
        // As `Value`'s map: ordered by key, a repeated key's last value kept (the sort is
        // stable, so the last of equal keys is the last of its run).
        members.sort_by(|a, b| a.0.cmp(&b.0));
        self.0.push(b'{');
        let mut first = true;
        for (i, (key, value)) in members.iter().enumerate() {
            if members.get(i + 1).is_some_and(|next| next.0 == *key) {
                continue;
            }
            if !first {
                self.0.push(b',');
            }
            first = false;
            write::<A::Error, _>(self.0, key.as_str())?;
            self.0.push(b':');
            self.0.extend_from_slice(value);
        }
        self.0.push(b'}');
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// What `Value` makes of `raw`, as text.
    fn through_value(raw: &str) -> String {
        serde_json::from_str::<Value>(raw).unwrap().to_string()
    }

    fn canonical(raw: &str) -> String {
        String::from_utf8(canonical_text(raw).unwrap()).unwrap()
    }

    #[test]
    fn canonical_text_is_the_values_compact_sorted_form_and_serializes_as_is() {
        let v = json!({"b": [1, 2.5, "x"], "a": {"d": null, "c": true}});
        let t = JsonText::canonical(&v.to_string()).unwrap();
        assert_eq!(t.as_str(), r#"{"a":{"c":true,"d":null},"b":[1,2.5,"x"]}"#);
        // Inside an answer it is the value itself, not a string.
        #[derive(Serialize)]
        struct Answer {
            params: JsonText,
        }
        assert_eq!(
            serde_json::to_string(&Answer { params: t }).unwrap(),
            serde_json::to_string(&json!({"params": v})).unwrap()
        );
    }

    #[test]
    fn canonical_text_is_what_value_writes_for_every_kind_of_json() {
        for raw in [
            "{}",
            "[]",
            "null",
            r#"{"b":1,"a":2,"b":3}"#,
            r#"{ "z" : [ 1 , -2 , 3.0 , 1e2 , 1E-2 , -0 , -0.0 , 0.1 , 5e-324 , 1.7976931348623157e308 ] }"#,
            r#"[18446744073709551615, -9223372036854775808, 9007199254740993, 123456789012345678901234567890]"#,
            r#"["\u00e9\ud83d\ude00", "\/\b\f\n\r\t\"\\", "\u0000\u001f\u007f", "é😀"]"#,
            r#"{"\u0062":1,"b":2,"a\u0000":3,"a":4,"":5,"é":6,"e":7}"#,
            r#"{"a":{"c":{"e":[{"g":1,"f":2}],"d":null},"b":true},"A":false}"#,
            "  [  [ ] , { } , [ { } ] ]  ",
        ] {
            assert_eq!(canonical(raw), through_value(raw), "{raw}");
        }
        // What serde_json refuses, this refuses.
        for bad in ["", "{", "[1,]", "1e400", r#""\ud800""#, "{} {}"] {
            assert!(canonical_text(bad).is_err(), "{bad}");
        }
    }

    /// A small deterministic generator of JSON text: nested objects (with repeated keys) and
    /// arrays, strings with escapes and non-ASCII, numbers of every form serde_json reads,
    /// whitespace between tokens.
    struct Gen(u64);

    impl Gen {
        fn next(&mut self, n: u64) -> u64 {
            self.0 ^= self.0 << 13;
            self.0 ^= self.0 >> 7;
            self.0 ^= self.0 << 17;
            self.0 % n
        }

        fn string(&mut self, out: &mut String) {
            const PIECES: [&str; 10] = [
                "a",
                "b",
                r"\\",
                r#"\""#,
                r"\u00e9",
                "é",
                r"\n",
                r"\ud83d\ude00",
                "/",
                r"\/",
            ];
            out.push('"');
            for _ in 0..self.next(4) {
                out.push_str(PIECES[self.next(PIECES.len() as u64) as usize]);
            }
            out.push('"');
        }

        fn value(&mut self, depth: u32, out: &mut String) {
            const NUMBERS: [&str; 12] = [
                "0",
                "-0",
                "7",
                "-12",
                "3.25",
                "1e3",
                "-2.5E-3",
                "0.1",
                "1e30",
                "18446744073709551616",
                "-9223372036854775809",
                "4.0",
            ];
            match if depth > 3 {
                self.next(4)
            } else {
                self.next(7)
            } {
                0 => out.push_str(["true", "false", "null"][self.next(3) as usize]),
                1 => out.push_str(NUMBERS[self.next(NUMBERS.len() as u64) as usize]),
                2 | 3 => self.string(out),
                4 => {
                    out.push('[');
                    for i in 0..self.next(4) {
                        if i > 0 {
                            out.push_str(" ,");
                        }
                        self.value(depth + 1, out);
                    }
                    out.push(']');
                }
                _ => {
                    out.push_str("{ ");
                    for i in 0..self.next(5) {
                        if i > 0 {
                            out.push(',');
                        }
                        self.string(out);
                        out.push_str(" : ");
                        self.value(depth + 1, out);
                    }
                    out.push('}');
                }
            }
        }
    }

    #[test]
    fn canonical_text_matches_value_on_generated_json() {
        let mut g = Gen(0x9e37_79b9_7f4a_7c15);
        for _ in 0..5_000 {
            let mut raw = String::new();
            g.value(0, &mut raw);
            assert_eq!(canonical(&raw), through_value(&raw), "{raw}");
        }
    }

    #[test]
    fn stored_text_must_be_one_json_value() {
        assert!(JsonText::parse(r#"{"a":1}"#.into()).is_ok());
        assert!(JsonText::parse(r#"{"a":1"#.into()).is_err());
        assert!(JsonText::parse(r#"{"a":1} {}"#.into()).is_err());
    }
}
