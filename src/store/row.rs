//! The row codec: how a script reply and an execution's row (a Redis hash, as `HGETALL` gives
//! it) become values. The field names themselves are the scripts' and
//! `admission::Execution::from_row`'s; everything here only takes replies apart.

use std::collections::HashMap;

use redis::Value;

use super::StoreError;
use crate::domain::{Execution, ExecutionId, row};

/// A tagged script reply (`{'tag', ...}`): the tag and the rest.
pub(super) fn split_tag(reply: Vec<Value>) -> Result<(String, Vec<Value>), StoreError> {
    let mut it = reply.into_iter();
    let tag = it
        .next()
        .ok_or_else(|| StoreError::Corrupt("empty script reply".into()))?;
    Ok((redis::from_redis_value(tag)?, it.collect()))
}

/// The first value after a reply's tag.
pub(super) fn first(rest: &[Value]) -> Result<&Value, StoreError> {
    rest.first()
        .ok_or_else(|| StoreError::Corrupt("script reply too short".into()))
}

/// The `i`-th value after a reply's tag, as a string.
pub(super) fn string_at(rest: &[Value], i: usize) -> Result<String, StoreError> {
    let v = rest
        .get(i)
        .ok_or_else(|| StoreError::Corrupt("script reply too short".into()))?;
    Ok(redis::from_redis_value(v.clone())?)
}

/// Reads `id, row` from a script reply's remainder.
pub(super) fn execution_from(
    rest: Vec<Value>,
    deduplicated: bool,
) -> Result<Execution, StoreError> {
    let mut it = rest.into_iter();
    let (Some(id), Some(row)) = (it.next(), it.next()) else {
        return Err(StoreError::Corrupt("script reply lacks the row".into()));
    };
    row_to_execution(id, row, deduplicated)
}

/// A row's fields as `HGETALL` (or a script's reply) gives them, as text.
/// At layout 5 a keyed row holds its dedup digest (`dh`, `Shard::stored_digest`) and its
/// fingerprint (`fp`) as bytes that need not be UTF-8; no reader wants them (they are the
/// Lua's, for moving the dedup mapping), so those two are left out when they are not text.
/// Any other field that is not text is a corrupt row, refused as before.
pub(super) struct RowFields(pub(super) HashMap<String, String>);

impl redis::FromRedisValue for RowFields {
    fn from_redis_value(v: Value) -> Result<Self, redis::ParsingError> {
        let raw: HashMap<String, Vec<u8>> = redis::from_redis_value(v)?;
        let mut fields = HashMap::with_capacity(raw.len());
        for (name, value) in raw {
            match String::from_utf8(value) {
                Ok(text) => {
                    fields.insert(name, text);
                }
                Err(_) if name == row::DEDUP_DIGEST || name == row::FINGERPRINT => {}
                Err(_) => {
                    return Err(redis::ParsingError::from(format!(
                        "row field {name} is not UTF-8"
                    )));
                }
            }
        }
        Ok(RowFields(fields))
    }
}

/// An execution from its id and its row as `HGETALL` returns it.
pub(super) fn row_to_execution(
    id: Value,
    row: Value,
    deduplicated: bool,
) -> Result<Execution, StoreError> {
    let id = id_from(id)?;
    let RowFields(fields) = redis::from_redis_value(row)?;
    from_fields(id.as_str(), fields, deduplicated)
}

/// An execution id in a script reply, in either stored form (`ExecutionId::from_reply`).
pub(super) fn id_from(v: Value) -> Result<ExecutionId, StoreError> {
    let bytes: Vec<u8> = redis::from_redis_value(v)?;
    ExecutionId::from_reply(&bytes).map_err(StoreError::Corrupt)
}

/// The `i`-th value after a reply's tag, as an execution id (see `id_from`).
pub(super) fn id_at(rest: &[Value], i: usize) -> Result<ExecutionId, StoreError> {
    let v = rest
        .get(i)
        .ok_or_else(|| StoreError::Corrupt("script reply too short".into()))?;
    id_from(v.clone())
}

/// An execution from its id and its row's fields.
pub(super) fn from_fields(
    id: &str,
    fields: HashMap<String, String>,
    deduplicated: bool,
) -> Result<Execution, StoreError> {
    Execution::from_row(id, fields, deduplicated).map_err(StoreError::Corrupt)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn reply(fields: &[(&str, &[u8])]) -> Value {
        Value::Array(
            fields
                .iter()
                .flat_map(|(k, v)| {
                    [
                        Value::BulkString(k.as_bytes().to_vec()),
                        Value::BulkString(v.to_vec()),
                    ]
                })
                .collect(),
        )
    }

    #[test]
    fn a_binary_digest_and_fingerprint_are_left_out_of_a_row_read() {
        let RowFields(fields) = redis::from_redis_value(reply(&[
            (row::STATUS, b"queued"),
            (row::DEDUP_DIGEST, &[0xff, 0x00, 0x9c]),
            (row::FINGERPRINT, &[0xfe, 0x3a]),
        ]))
        .unwrap();
        assert_eq!(fields.len(), 1, "{fields:?}");
        assert_eq!(fields[row::STATUS], "queued");
    }

    #[test]
    fn any_other_field_that_is_not_text_is_a_corrupt_row() {
        let read: Result<RowFields, _> =
            redis::from_redis_value(reply(&[(row::STATUS, &[0xff, 0xfe])]));
        let err = read.err().expect("a non-UTF-8 status is refused");
        assert!(err.to_string().contains("not UTF-8"), "{err}");
    }
}
