//! Reading a batch body's JSON as it arrives: a scanner that checks the JSON's syntax byte by
//! byte, follows the body's one field (`items`) and cuts the array into its items, so each
//! item can be parsed on its own (with serde_json, into its own type) while the rest is still
//! on its way. No tree of the whole document is ever built, and only the item being read is
//! held: its bytes without the whitespace around its tokens.
//!
//! The scanner knows JSON's grammar, not the items' fields; the batch module turns each item
//! into an admission request and bounds what the batch may hold.

/// How deep containers may nest: the body and its `items` array, then what serde_json parses
/// in one item (its recursion limit is 128).
const MAX_DEPTH: usize = 2 + 128;

/// The longest top-level key read: `items` spelled with escapes fits many times over.
const MAX_KEY_BYTES: usize = 1024;

/// What is wrong with a body, found while scanning it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ScanError {
    /// Not JSON (a syntax error, or the body ended early).
    Malformed(String),
    /// JSON, but not a batch: not an object, another field than `items`, `items` not an array.
    Invalid(String),
    /// `items` holds more elements than allowed: found when the first one too many begins.
    TooManyItems { max: usize },
}

/// One element of `items`, found complete.
#[derive(Debug, PartialEq, Eq)]
pub enum Item<'a> {
    /// Its JSON text, whitespace between tokens left out.
    Json(&'a [u8]),
    /// It had more than the item limit of bytes (whitespace aside): not kept.
    TooLarge { bytes: usize },
}

/// Where the scanner is in the grammar.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before the body's first token.
    Start,
    /// A value must come (after `:` or `,` in an array).
    Value,
    /// After `[`: a value or `]`.
    ValueOrEnd,
    /// After `{`: a key or `}`.
    KeyOrEnd,
    /// After `,` in an object: a key.
    Key,
    /// After a key: `:`.
    Colon,
    /// After a value inside a container: `,` or its closer.
    AfterValue,
    /// Inside a string (a key when `key`).
    Str { key: bool },
    /// After `\` in a string.
    Escape { key: bool },
    /// Inside `\uXXXX`: hex digits still to come.
    Unicode { key: bool, left: u8 },
    /// Inside a number, at one of its grammar's places.
    Num(Num),
    /// Inside `true`, `false` or `null`: the bytes still to come.
    Literal(&'static [u8]),
    /// The body's object is closed: only whitespace may follow.
    Done,
}

/// The places of JSON's number grammar: `-? (0 | [1-9][0-9]*) (. [0-9]+)? ([eE] [+-]? [0-9]+)?`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Num {
    Minus,
    Zero,
    Int,
    Dot,
    Frac,
    E,
    ESign,
    Exp,
}

/// The scanner of one batch body. Feed it the body's bytes in any pieces, then call
/// [`ItemScanner::finish`].
#[derive(Debug)]
pub struct ItemScanner {
    state: State,
    /// Open containers, `true` for an object.
    stack: Vec<bool>,
    /// The next value at depth 1 is the `items` array.
    items_next: bool,
    /// The `items` array is the open container at depth 2.
    in_items: bool,
    seen_items: bool,
    /// Elements of `items` begun.
    count: usize,
    max_items: usize,
    /// An item is being read.
    in_item: bool,
    /// Its bytes (whitespace aside), while it fits the limit.
    item: Vec<u8>,
    /// Its size (whitespace aside), also past the limit.
    item_bytes: usize,
    item_limit: usize,
    /// The top-level key being read, with its quotes.
    key: Vec<u8>,
    /// Bytes scanned so far (for the position in a message).
    offset: usize,
}

impl ItemScanner {
    /// A scanner that allows `max_items` elements in `items`, each at most `item_limit` bytes
    /// (whitespace between tokens not counted).
    pub fn new(max_items: usize, item_limit: usize) -> Self {
        Self {
            state: State::Start,
            stack: Vec::new(),
            items_next: false,
            in_items: false,
            seen_items: false,
            count: 0,
            max_items,
            in_item: false,
            item: Vec::new(),
            item_bytes: 0,
            item_limit,
            key: Vec::new(),
            offset: 0,
        }
    }

    /// Elements of `items` seen so far (begun).
    pub fn items(&self) -> usize {
        self.count
    }

    /// Scans `chunk`, handing every item completed in it to `on_item` in order. Stops at the
    /// first error, its own or `on_item`'s.
    pub fn feed<E: From<ScanError>>(
        &mut self,
        chunk: &[u8],
        on_item: &mut impl FnMut(Item<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        let mut i = 0;
        while i < chunk.len() {
            // Fast paths: a run of plain string bytes, of digits, or of whitespace between
            // tokens.
            if let State::Str { key } = self.state {
                let run = chunk[i..]
                    .iter()
                    .position(|&b| b == b'"' || b == b'\\' || b < 0x20)
                    .unwrap_or(chunk.len() - i);
                if run > 0 {
                    self.keep(&chunk[i..i + run], key)?;
                    i += run;
                    self.offset += run;
                    continue;
                }
            } else if let State::Num(Num::Int | Num::Frac | Num::Exp) = self.state {
                let run = chunk[i..]
                    .iter()
                    .position(|b| !b.is_ascii_digit())
                    .unwrap_or(chunk.len() - i);
                if run > 0 {
                    self.keep(&chunk[i..i + run], false)?;
                    i += run;
                    self.offset += run;
                    continue;
                }
            } else if is_space(chunk[i]) && !matches!(self.state, State::Num(_) | State::Literal(_))
            {
                i += 1;
                self.offset += 1;
                continue;
            }
            // One byte through the grammar; a number's end is seen on the byte after it, which
            // is then scanned again in the number's container.
            if self.step(chunk[i], on_item)? {
                i += 1;
                self.offset += 1;
            }
        }
        Ok(())
    }

    /// The body ended: an error unless it held one complete object with `items`.
    pub fn finish(&self) -> Result<(), ScanError> {
        match self.state {
            State::Done if self.seen_items => Ok(()),
            State::Done => Err(ScanError::Invalid("missing field `items`".into())),
            _ => Err(self.malformed("the body ended before its JSON did")),
        }
    }

    /// Scans one byte; false when the byte ended a number and must be scanned again.
    fn step<E: From<ScanError>>(
        &mut self,
        b: u8,
        on_item: &mut impl FnMut(Item<'_>) -> Result<(), E>,
    ) -> Result<bool, E> {
        match self.state {
            State::Start => {
                if b != b'{' {
                    let error = if starts_value(b) {
                        ScanError::Invalid(
                            "the body must be a JSON object: {\"items\": [...]}".into(),
                        )
                    } else {
                        self.malformed("expected a JSON object")
                    };
                    return Err(error.into());
                }
                self.stack.push(true);
                self.state = State::KeyOrEnd;
            }
            State::Value | State::ValueOrEnd => {
                if b == b']' && self.state == State::ValueOrEnd {
                    return self.close(false, on_item).map(|()| true);
                }
                self.begin_value(b)?;
            }
            State::KeyOrEnd | State::Key => {
                if b == b'}' && self.state == State::KeyOrEnd {
                    return self.close(true, on_item).map(|()| true);
                }
                if b != b'"' {
                    return Err(self.malformed("expected a key in quotes").into());
                }
                self.keep_byte(b, true)?;
                self.state = State::Str { key: true };
            }
            State::Colon => {
                if b != b':' {
                    return Err(self.malformed("expected `:` after a key").into());
                }
                self.keep_byte(b, false)?;
                self.state = State::Value;
            }
            State::AfterValue => {
                let object = self.stack.last().copied().unwrap_or(false);
                match b {
                    b',' => {
                        self.keep_byte(b, false)?;
                        self.state = if object { State::Key } else { State::Value };
                    }
                    b'}' if object => self.close(true, on_item)?,
                    b']' if !object => self.close(false, on_item)?,
                    _ => {
                        return Err(self
                            .malformed("expected `,` or the end of a container")
                            .into());
                    }
                }
            }
            State::Str { key } => match b {
                b'"' => {
                    self.keep_byte(b, key)?;
                    if key {
                        self.state = State::Colon;
                        self.key_done()?;
                    } else {
                        self.value_done(on_item)?;
                    }
                }
                b'\\' => {
                    self.keep_byte(b, key)?;
                    self.state = State::Escape { key };
                }
                _ => return Err(self.malformed("a control character in a string").into()),
            },
            State::Escape { key } => {
                self.state = match b {
                    b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => State::Str { key },
                    b'u' => State::Unicode { key, left: 4 },
                    _ => return Err(self.malformed("an invalid escape in a string").into()),
                };
                self.keep_byte(b, key)?;
            }
            State::Unicode { key, left } => {
                if !b.is_ascii_hexdigit() {
                    return Err(self.malformed("an invalid \\u escape in a string").into());
                }
                self.keep_byte(b, key)?;
                self.state = if left == 1 {
                    State::Str { key }
                } else {
                    State::Unicode {
                        key,
                        left: left - 1,
                    }
                };
            }
            State::Num(at) => {
                let next = match (at, b) {
                    (Num::Minus, b'0') => Num::Zero,
                    (Num::Minus, b'1'..=b'9') => Num::Int,
                    (Num::Int, b'0'..=b'9') => Num::Int,
                    (Num::Zero | Num::Int, b'.') => Num::Dot,
                    (Num::Dot | Num::Frac, b'0'..=b'9') => Num::Frac,
                    (Num::Zero | Num::Int | Num::Frac, b'e' | b'E') => Num::E,
                    (Num::E, b'+' | b'-') => Num::ESign,
                    (Num::E | Num::ESign | Num::Exp, b'0'..=b'9') => Num::Exp,
                    (Num::Zero | Num::Int | Num::Frac | Num::Exp, _) => {
                        // The number ended before this byte, which belongs to its container.
                        self.value_done(on_item)?;
                        return Ok(false);
                    }
                    _ => return Err(self.malformed("an invalid number").into()),
                };
                self.keep_byte(b, false)?;
                self.state = State::Num(next);
            }
            State::Literal(rest) => {
                if rest.first() != Some(&b) {
                    return Err(self.malformed("an invalid literal").into());
                }
                self.keep_byte(b, false)?;
                if rest.len() == 1 {
                    self.value_done(on_item)?;
                } else {
                    self.state = State::Literal(&rest[1..]);
                }
            }
            State::Done => {
                return Err(self
                    .malformed("trailing characters after the body's object")
                    .into());
            }
        }
        Ok(true)
    }

    /// The first byte of a value (after `:`, `[` or `,`).
    fn begin_value(&mut self, b: u8) -> Result<(), ScanError> {
        if self.items_next {
            self.items_next = false;
            if b != b'[' {
                return Err(ScanError::Invalid(
                    "`items` must be an array of executions".into(),
                ));
            }
            self.stack.push(false);
            self.in_items = true;
            self.state = State::ValueOrEnd;
            return Ok(());
        }
        if self.in_items && self.stack.len() == 2 {
            // An element of `items` begins.
            if self.count == self.max_items {
                return Err(ScanError::TooManyItems {
                    max: self.max_items,
                });
            }
            self.count += 1;
            self.in_item = true;
            self.item.clear();
            self.item_bytes = 0;
        }
        self.state = match b {
            b'{' | b'[' => {
                if self.stack.len() == MAX_DEPTH {
                    return Err(self.malformed("containers nested too deeply"));
                }
                self.stack.push(b == b'{');
                if b == b'{' {
                    State::KeyOrEnd
                } else {
                    State::ValueOrEnd
                }
            }
            b'"' => State::Str { key: false },
            b'-' => State::Num(Num::Minus),
            b'0' => State::Num(Num::Zero),
            b'1'..=b'9' => State::Num(Num::Int),
            b't' => State::Literal(b"rue"),
            b'f' => State::Literal(b"alse"),
            b'n' => State::Literal(b"ull"),
            _ => return Err(self.malformed("expected a value")),
        };
        self.keep_byte(b, false)
    }

    /// `}` or `]` closes the innermost container.
    fn close<E: From<ScanError>>(
        &mut self,
        object: bool,
        on_item: &mut impl FnMut(Item<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        self.keep_byte(if object { b'}' } else { b']' }, false)?;
        self.stack.pop();
        if self.stack.len() == 1 && self.in_items {
            // The end of `items`.
            self.in_items = false;
        }
        self.value_done(on_item)
    }

    /// A value ended (the byte that ended it was kept, except a number's terminator).
    fn value_done<E: From<ScanError>>(
        &mut self,
        on_item: &mut impl FnMut(Item<'_>) -> Result<(), E>,
    ) -> Result<(), E> {
        self.state = if self.stack.is_empty() {
            State::Done
        } else {
            State::AfterValue
        };
        if self.in_item && self.stack.len() == 2 {
            self.in_item = false;
            if self.item_bytes > self.item_limit {
                on_item(Item::TooLarge {
                    bytes: self.item_bytes,
                })?;
            } else {
                on_item(Item::Json(&self.item))?;
            }
            self.item.clear();
            // An item near the limit leaves a large buffer behind: give it back.
            if self.item.capacity() > 64 * 1024 {
                self.item = Vec::new();
            }
        }
        Ok(())
    }

    /// A top-level key ended: `items` once, nothing else.
    fn key_done(&mut self) -> Result<(), ScanError> {
        if self.stack.len() != 1 {
            return Ok(());
        }
        let key: String = serde_json::from_slice(&self.key).map_err(|_| {
            ScanError::Malformed(format!(
                "malformed JSON at byte {}: an invalid key",
                self.offset
            ))
        })?;
        self.key.clear();
        if key != "items" {
            return Err(ScanError::Invalid(format!(
                "unknown field `{}`, expected `items`",
                key.chars().take(64).collect::<String>()
            )));
        }
        if self.seen_items {
            return Err(ScanError::Invalid("duplicate field `items`".into()));
        }
        self.seen_items = true;
        self.items_next = true;
        Ok(())
    }

    /// Keeps a byte of the item being read, or of the top-level key being read.
    fn keep_byte(&mut self, b: u8, key: bool) -> Result<(), ScanError> {
        self.keep(std::slice::from_ref(&b), key)
    }

    fn keep(&mut self, bytes: &[u8], key: bool) -> Result<(), ScanError> {
        if key && self.stack.len() == 1 {
            if self.key.len() + bytes.len() > MAX_KEY_BYTES {
                return Err(ScanError::Invalid(
                    "unknown field (a key of over 1 KiB), expected `items`".into(),
                ));
            }
            self.key.extend_from_slice(bytes);
        } else if self.in_item {
            self.item_bytes += bytes.len();
            if self.item_bytes <= self.item_limit {
                self.item.extend_from_slice(bytes);
            }
        }
        Ok(())
    }

    fn malformed(&self, what: &str) -> ScanError {
        ScanError::Malformed(format!("malformed JSON at byte {}: {what}", self.offset))
    }
}

/// JSON's whitespace.
fn is_space(b: u8) -> bool {
    matches!(b, b' ' | b'\t' | b'\n' | b'\r')
}

/// Whether `b` can begin a JSON value.
fn starts_value(b: u8) -> bool {
    matches!(b, b'[' | b'"' | b'-' | b'0'..=b'9' | b't' | b'f' | b'n')
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Scans `body` in pieces of `piece` bytes: the items found (as text, or `TOO LARGE n`),
    /// or the error.
    fn scan(body: &str, piece: usize, max: usize, limit: usize) -> Result<Vec<String>, ScanError> {
        let mut s = ItemScanner::new(max, limit);
        let mut found = Vec::new();
        for chunk in body.as_bytes().chunks(piece.max(1)) {
            s.feed(chunk, &mut |item: Item<'_>| -> Result<(), ScanError> {
                found.push(match item {
                    Item::Json(b) => String::from_utf8(b.to_vec()).unwrap(),
                    Item::TooLarge { bytes } => format!("TOO LARGE {bytes}"),
                });
                Ok(())
            })?;
        }
        s.finish()?;
        Ok(found)
    }

    fn every_split(body: &str, max: usize, limit: usize) -> Result<Vec<String>, ScanError> {
        let whole = scan(body, body.len(), max, limit);
        for piece in 1..8 {
            assert_eq!(
                scan(body, piece, max, limit),
                whole,
                "{body:?} in pieces of {piece}"
            );
        }
        whole
    }

    #[test]
    fn items_come_out_whole_and_compact_however_the_body_is_cut() {
        let body = r#" { "items" : [ {"flow_id": "a", "params": {"s": "x, ]}\" \\ \u00e9", "n": [1, -2.5e+3, 0, 0.25E-1]}},
            42 , "str" , true, false, null, [ ], {}, -0, [[1],[2, {"a": []}]] ] } "#;
        let items = every_split(body, 1000, 1 << 20).unwrap();
        assert_eq!(
            items,
            [
                r#"{"flow_id":"a","params":{"s":"x, ]}\" \\ \u00e9","n":[1,-2.5e+3,0,0.25E-1]}}"#,
                "42",
                r#""str""#,
                "true",
                "false",
                "null",
                "[]",
                "{}",
                "-0",
                r#"[[1],[2,{"a":[]}]]"#,
            ]
        );
        // Each item is the JSON the client meant.
        let first: serde_json::Value = serde_json::from_str(&items[0]).unwrap();
        assert_eq!(first["params"]["s"], "x, ]}\" \\ é");
    }

    #[test]
    fn the_item_past_the_maximum_is_refused_as_it_begins() {
        // The fourth element begins: refused there, whatever follows.
        let body = format!("{{\"items\":[{}0", "0,".repeat(3));
        let mut s = ItemScanner::new(3, 100);
        let mut n = 0;
        let err = s
            .feed(
                body.as_bytes(),
                &mut |_: Item<'_>| -> Result<(), ScanError> {
                    n += 1;
                    Ok(())
                },
            )
            .unwrap_err();
        assert_eq!(err, ScanError::TooManyItems { max: 3 });
        assert_eq!((n, s.items()), (3, 3));
        // Exactly the maximum is a batch.
        assert_eq!(
            every_split(r#"{"items":[1,2,3]}"#, 3, 100).unwrap().len(),
            3
        );
    }

    #[test]
    fn an_item_over_the_limit_is_counted_not_kept() {
        let big = format!(
            r#"{{"items":[{{"p":"{}"}}, {{"p": "y"}}]}}"#,
            "x".repeat(50)
        );
        let items = every_split(&big, 10, 40).unwrap();
        assert_eq!(items, ["TOO LARGE 58", r#"{"p":"y"}"#]);
        // Whitespace between tokens does not count.
        let spaced = r#"{"items":[ {  "p"  :  [ 1 ,  2 ] } ]}"#;
        assert_eq!(every_split(spaced, 10, 13).unwrap(), [r#"{"p":[1,2]}"#]);
    }

    #[test]
    fn the_body_must_be_an_object_with_items_only() {
        let invalid = |body: &str| match every_split(body, 10, 100) {
            Err(ScanError::Invalid(m)) => m,
            other => panic!("{body}: {other:?}"),
        };
        assert!(invalid(r#"{"item": []}"#).contains("unknown field `item`"));
        assert!(invalid(r#"{"items": {}}"#).contains("must be an array"));
        assert!(invalid(r#"{"items": null}"#).contains("must be an array"));
        assert!(invalid(r#"{"items": [], "items": []}"#).contains("duplicate field"));
        assert!(invalid(r#"{}"#).contains("missing field `items`"));
        assert!(invalid(r#"[1]"#).contains("must be a JSON object"));
        // A key spelled with escapes is the same key.
        assert_eq!(
            every_split(r#"{"\u0069tems": [1]}"#, 10, 100).unwrap(),
            ["1"]
        );
        assert_eq!(every_split(r#"{"items": []}"#, 10, 100).unwrap().len(), 0);
    }

    #[test]
    fn syntax_errors_anywhere_are_malformed() {
        for body in [
            "",
            "{",
            r#"{"items": [1,]}"#,
            r#"{"items": [1 2]}"#,
            r#"{"items": [01]}"#,
            r#"{"items": [1.]}"#,
            r#"{"items": [1e]}"#,
            r#"{"items": [-]}"#,
            r#"{"items": [tru]}"#,
            r#"{"items": [nul1]}"#,
            r#"{"items": ["a\x"]}"#,
            r#"{"items": ["\u12G4"]}"#,
            "{\"items\": [\"a\u{1}\"]}",
            r#"{"items": [{"a" 1}]}"#,
            r#"{"items": [{"a": 1,}]}"#,
            r#"{"items": [{1: 1}]}"#,
            r#"{"items": [}]}"#,
            r#"{"items": [1]]}"#,
            r#"{"items": [1]} x"#,
            r#"{"items": [1]}}"#,
            "x",
        ] {
            match every_split(body, 10, 100) {
                Err(ScanError::Malformed(_)) => {}
                other => panic!("{body:?}: {other:?}"),
            }
        }
    }

    #[test]
    fn nesting_is_bounded() {
        let deep = |n: usize| format!(r#"{{"items":[{}{}]}}"#, "[".repeat(n), "]".repeat(n));
        assert_eq!(every_split(&deep(128), 10, 1000).unwrap().len(), 1);
        assert!(matches!(
            every_split(&deep(129), 10, 1000),
            Err(ScanError::Malformed(_))
        ));
    }

    #[test]
    fn what_it_accepts_serde_json_accepts() {
        // Valid bodies of many shapes, scanned and cut: every item parses on its own, and the
        // items are the array serde_json reads from the whole body.
        let bodies = [
            r#"{"items":[{"flow_id":"a","params":{"x":[1,2,{"y":"z"}],"e":1E+2,"f":-0.5e-3}}]}"#,
            "{\"items\":[\"\\ud83d\\ude00\",\"\\\"\",\"\\/\",\"é😀\"]}",
            "\r\n\t{\t\"items\"\r:\n[\n]\t}\n",
        ];
        for body in bodies {
            let items = every_split(body, 1000, 1 << 20).unwrap();
            let whole: serde_json::Value = serde_json::from_str(body).unwrap();
            let parsed: Vec<serde_json::Value> = items
                .iter()
                .map(|i| serde_json::from_str(i).unwrap())
                .collect();
            assert_eq!(serde_json::Value::Array(parsed), whole["items"], "{body}");
        }
    }
}
