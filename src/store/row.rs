//! The row codec: how a script reply and an execution's row (a Redis hash, as `HGETALL` gives
//! it) become values. The field names themselves are the scripts' and
//! `admission::Execution::from_row`'s; everything here only takes replies apart.

use std::collections::HashMap;

use redis::Value;

use super::StoreError;
use crate::domain::{Execution, ExecutionId};

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

/// A row's fields as `HGETALL` (or a script's reply) gives them, the values that are text.
/// At layout 5 a keyed row holds its dedup digest (`dh`, `Shard::stored_digest`) and its
/// fingerprint (`fp`) as bytes that need not be UTF-8; no reader wants them (they are the
/// Lua's, for moving the dedup mapping), so a value that is not text is left out rather than
/// failing the whole row.
pub(super) struct RowFields(pub(super) HashMap<String, String>);

impl redis::FromRedisValue for RowFields {
    fn from_redis_value(v: Value) -> Result<Self, redis::ParsingError> {
        let raw: HashMap<String, Vec<u8>> = redis::from_redis_value(v)?;
        Ok(RowFields(
            raw.into_iter()
                .filter_map(|(k, v)| String::from_utf8(v).ok().map(|v| (k, v)))
                .collect(),
        ))
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
