//! Compact rows (layout 3): the field names an execution's row may hold are declared once on
//! each side — the "Rows" table of `migrations-lua/common.lua` and `sluice::domain::row` —
//! and these tests hold the two together and hold the scripts to them: a field renamed on one
//! side only fails here, not as a row that reads wrong.

use std::collections::{BTreeMap, BTreeSet};

use sluice::domain::row;

use crate::helpers::TestApp;
use crate::layout::{populate, tenants_in_distinct_shards};

const COMMON: &str = include_str!("../../migrations-lua/common.lua");

/// The names of common.lua's "Rows" table, one a line (`--   <name>  <meaning>`).
fn lua_declared() -> Vec<String> {
    let start = COMMON
        .find("-- Rows (layout 3, compact).")
        .expect("common.lua has its Rows table");
    let table = &COMMON[start..];
    let end = table
        .find("\n-- Replies may append")
        .expect("the table ends");
    table[..end]
        .lines()
        .filter_map(|l| l.strip_prefix("--   "))
        .filter_map(|l| l.split_whitespace().next())
        .filter(|n| *n != "name")
        .map(str::to_owned)
        .collect()
}

/// The compact names `domain::row` declares.
fn rust_declared() -> Vec<String> {
    row::LEGACY
        .iter()
        .map(|(_, c)| *c)
        .chain(row::LAYOUT_5)
        .map(str::to_owned)
        .collect()
}

#[test]
fn lua_and_rust_declare_the_same_row_fields() {
    let (lua, rust) = (lua_declared(), rust_declared());
    assert_eq!(lua.len(), 35, "{lua:?}");
    let (l, r): (BTreeSet<&String>, BTreeSet<&String>) =
        (lua.iter().collect(), rust.iter().collect());
    assert_eq!(
        l.len(),
        lua.len(),
        "a name declared twice in common.lua: {lua:?}"
    );
    assert_eq!(
        r.len(),
        rust.len(),
        "a name declared twice in domain::row: {rust:?}"
    );
    assert_eq!(
        l, r,
        "common.lua and domain::row declare different row fields"
    );
    for n in &lua {
        assert!((1..=2).contains(&n.len()), "{n} is not 1-2 characters");
        assert!(
            !["qs", "qpt", "qpk", "qkl"].contains(&n.as_str()),
            "{n} is a reply field"
        );
    }
}

/// Every quoted name on a line of a script that reads or writes a row (`K.row(`, `ROW`, the
/// `RUN_FIELDS` list, admit.lua's new row) is a declared name, never a name of layout 2
/// (`status`, `tenant`, ...). Values that happen to share a name (`'deleted'` announced to
/// waiters) are listed.
#[test]
fn scripts_name_row_fields_only_by_their_declared_names() {
    let old: BTreeSet<&str> = row::LEGACY
        .iter()
        .filter(|(l, c)| l != c)
        .map(|(l, _)| *l)
        .collect();
    // Quoted words on row lines that are values, not field names.
    let values = ["deleted"];
    let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations-lua");
    let mut bad = Vec::new();
    let mut row_lines = 0;
    for entry in std::fs::read_dir(dir).unwrap() {
        let path = entry.unwrap().path();
        if path.extension().and_then(|e| e.to_str()) != Some("lua") {
            continue;
        }
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let text = std::fs::read_to_string(&path).unwrap();
        let mut in_list = false;
        for (i, line) in text.lines().enumerate() {
            let code = line.split("--").next().unwrap_or("");
            if code.contains("local RUN_FIELDS") || code.contains("local row = { 't'") {
                in_list = true;
            }
            let touches = in_list
                || code.contains("K.row(")
                || code.contains("ROW,")
                || code.contains("ROW)");
            if touches {
                row_lines += 1;
                for (j, part) in code.split('\'').enumerate() {
                    if j % 2 == 1 && old.contains(part) && !values.contains(&part) {
                        bad.push(format!("{name}:{}: '{part}': {}", i + 1, line.trim()));
                    }
                }
            }
            if in_list && code.contains('}') {
                in_list = false;
            }
        }
    }
    assert!(row_lines > 40, "found only {row_lines} lines touching rows");
    assert!(bad.is_empty(), "old row field names:\n{}", bad.join("\n"));
}

/// What the scripts actually write: every field of every row, in every state an execution
/// can be in, is a declared name; and the states cover the declared names (but those only
/// some deployments write: the schema-1 stream entry, a waiter's mark, a webhook's sequence,
/// a tracestate).
#[tokio::test]
async fn rows_in_every_state_hold_only_declared_fields() {
    let app = TestApp::spawn().await;
    let tenants = tenants_in_distinct_shards(&app, 1, None);
    let ids = populate(&app, &tenants).await;
    assert!(ids.len() >= 9);
    let declared: BTreeSet<String> = rust_declared().into_iter().collect();
    let mut seen = BTreeSet::new();
    let rows: Vec<String> = app
        .redis
        .keys()
        .await
        .into_iter()
        .filter(|k| k.contains(":exec:"))
        .collect();
    assert_eq!(rows.len(), ids.len());
    for key in rows {
        // (Values as bytes: layout 5's `dh` and `fp` are not text.)
        let fields: BTreeMap<String, Vec<u8>> = app
            .redis
            .query(redis::cmd("HGETALL").arg(crate::helpers::key_bytes(&key)))
            .await;
        for f in fields.keys() {
            assert!(
                declared.contains(f),
                "{key} holds undeclared field {f}: {fields:?}"
            );
            seen.insert(f.clone());
        }
    }
    let mut rare: BTreeSet<String> = ["e", "w", "ws", "ts"].map(String::from).into();
    if !crate::helpers::binary_layout() {
        // Only a layout-5 row holds the fingerprint (`row::LAYOUT_5`).
        rare.insert(row::FINGERPRINT.to_owned());
    }
    let missing: Vec<&String> = declared
        .difference(&seen)
        .filter(|f| !rare.contains(*f))
        .collect();
    assert!(
        missing.is_empty(),
        "no row holds {missing:?}; seen {seen:?}"
    );
}
