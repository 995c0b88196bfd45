//! How the Lua of `migrations-lua/` is put together: as one Redis Functions library (`library`,
//! what the store loads and calls), or one operation as a script of its own (`compose`, for
//! the tests that drive an operation by EVAL and the benchmark's bare comparison); and how a
//! Lua error is traced back to the file and line it came from.
//!
//! The library: `#!lua name=...`, the calling convention's locals (`KEYS`, `ARGV`, `P`), the
//! helper files whole (each definition made once per load), then one `redis.register_function`
//! per operation whose callback sets `KEYS` and `ARGV`, runs `guard.lua`, calls `begin_call()`
//! (shard operations: the per-call state, see the end of `common.lua`; not for one whose header
//! declares that it calls it itself, [`BEGINS_ITSELF`]) and then the operation's body.
//!
//! A script of its own: Redis runs a script's whole chunk on every call, so every helper it
//! defines is a closure built anew each time (about a thousand instructions each, measured
//! with callgrind on Redis 7.0), and a script gets only the helpers its body can reach, in the
//! library file's order. A library file is read as a list of top-level definitions (`local
//! function f`, `function K.f`, `local X = ...`, `local a, b`, `a = function`), each with the
//! comment above it; a definition is included when the operation, or a definition already
//! included, names it.
//!
//! Both have lines from several files, so Redis's `user_script:N` / `user_function:N` in an
//! error is not a line of any of them. Each records where each of its lines came from, under
//! its SHA1 (a script) or its name (the library; a function's error names the function,
//! whose name starts with the library's), and `locate` rewrites the reference to
//! `complete.lua:N` (or `common.lua:N`, ...).

use std::collections::{BTreeSet, HashMap};
use std::sync::{Mutex, OnceLock};

/// One top-level definition of a library file.
#[derive(Debug)]
struct Unit {
    /// First line (1-based) in the library file, its comment included.
    first_line: usize,
    lines: Vec<&'static str>,
    /// The names it defines: `f`, `K.f`, `X`.
    defines: Vec<String>,
    /// The names its code mentions (comments and strings left out).
    mentions: BTreeSet<String>,
}

/// A library file split into its definitions.
#[derive(Debug)]
pub struct Library {
    file: &'static str,
    units: Vec<Unit>,
}

impl Library {
    /// Splits `text` (the file `file`) into definitions: a line at column 0 that is not a
    /// comment, not blank and not `end` opens one, with the comment lines right above it.
    /// What comes before the first definition (the file's own header) belongs to none.
    pub fn parse(file: &'static str, text: &'static str) -> Self {
        let lines: Vec<&'static str> = text.lines().collect();
        let mut units: Vec<Unit> = Vec::new();
        let mut comment_start: Option<usize> = None;
        for (i, line) in lines.iter().enumerate() {
            let opens = !line.is_empty()
                && !line.starts_with(' ')
                && !line.starts_with('-')
                && !line.starts_with("end")
                && !line.starts_with('}');
            if line.starts_with("--") {
                comment_start.get_or_insert(i);
            } else if line.trim().is_empty() {
                comment_start = None;
            }
            if opens {
                let first = comment_start.take().unwrap_or(i);
                // The comment lines were counted in the unit before: give them to this one.
                if let Some(prev) = units.last_mut() {
                    let keep = first.saturating_sub(prev.first_line - 1);
                    prev.lines.truncate(keep);
                }
                units.push(Unit {
                    first_line: first + 1,
                    lines: lines[first..=i].to_vec(),
                    defines: defined_names(line),
                    mentions: BTreeSet::new(),
                });
            } else if let Some(u) = units.last_mut() {
                u.lines.push(line);
            }
        }
        for u in &mut units {
            // Trailing blank lines and comments that open the next unit are not code.
            while u.lines.last().is_some_and(|l| l.trim().is_empty()) {
                u.lines.pop();
            }
            let own: BTreeSet<&String> = u.defines.iter().collect();
            u.mentions = mentioned_names(&u.lines.join("\n"))
                .into_iter()
                .filter(|n| !own.contains(n))
                .collect();
        }
        Self { file, units }
    }

    /// The definitions `code` needs, directly or through other definitions, in file order.
    fn needed_by(&self, code: &str) -> Vec<&Unit> {
        let mut wanted: BTreeSet<String> = mentioned_names(code);
        let mut taken = vec![false; self.units.len()];
        loop {
            let mut grew = false;
            for (i, u) in self.units.iter().enumerate() {
                if !taken[i] && u.defines.iter().any(|d| wanted.contains(d)) {
                    taken[i] = true;
                    grew = true;
                    wanted.extend(u.mentions.iter().cloned());
                }
            }
            if !grew {
                break;
            }
        }
        self.units
            .iter()
            .zip(taken)
            .filter_map(|(u, t)| t.then_some(u))
            .collect()
    }

    /// The names `source` (a composed script) mentions that this library defines but
    /// `source` does not: empty for a correctly composed script.
    #[cfg(test)]
    pub fn missing_from(&self, source: &str) -> Vec<String> {
        // A forward declaration (`local a, b`) names what it does not use.
        let code: Vec<&str> = source
            .lines()
            .filter(|l| !(l.starts_with("local ") && !l.contains('=') && !l.contains('(')))
            .collect();
        let mentioned = mentioned_names(&code.join("\n"));
        self.units
            .iter()
            .filter(|u| u.defines.iter().any(|d| mentioned.contains(d)))
            .filter(|u| !source.contains(&u.lines.join("\n")))
            .flat_map(|u| u.defines.clone())
            .collect()
    }

    /// Every name the library defines.
    #[cfg(test)]
    fn defined(&self) -> BTreeSet<String> {
        self.units.iter().flat_map(|u| u.defines.clone()).collect()
    }
}

/// A script as Redis runs it, with where each of its lines came from.
#[derive(Debug, Clone)]
pub struct Composed {
    pub source: String,
    /// Where each line of `source` came from.
    origins: Origins,
}

/// Composes an operation: its `#!lua` line, then `prefix` (whole files, such as guard.lua),
/// then what it needs of `library`, then the rest of the operation. `file` names the operation
/// in error messages. Panics on an operation without a `#!lua` first line (the operations are
/// compiled in; the unit tests compose every one).
pub fn compose(
    file: &'static str,
    op: &'static str,
    prefix: &[(&'static str, &'static str)],
    library: Option<&Library>,
) -> Composed {
    let (shebang, body) = op.split_once('\n').unwrap_or((op, ""));
    assert!(
        shebang.starts_with("#!lua"),
        "a sluice script must open with a #!lua line, not {shebang:?}"
    );
    let mut out = Composed {
        source: String::new(),
        origins: Vec::new(),
    };
    let mut push = |line: &str, origin: (&'static str, usize)| {
        out.source.push_str(line);
        out.source.push('\n');
        out.origins.push(origin);
    };
    push(shebang, (file, 1));
    // The prefix sets P (guard.lua), which a library declares once for all its functions, and
    // uses what the guard remembers (here for one call only). `redis_call` as in a library
    // (see `library`).
    push("local P, redis_call = nil, redis.call", (COMPOSED, 1));
    push(FENCE_STATE, (COMPOSED, 6));
    for (name, text) in prefix {
        for (i, line) in text.lines().enumerate() {
            push(line, (name, i + 1));
        }
    }
    if let Some(lib) = library {
        // What the prefix uses of the library counts as well.
        let mut code = body.to_owned();
        for (_, text) in prefix {
            code.push('\n');
            code.push_str(text);
        }
        // A library with per-call state sets it before the operation's first line.
        let begins = lib
            .units
            .iter()
            .any(|u| u.defines.iter().any(|d| d == BEGIN));
        if begins {
            code.push('\n');
            code.push_str(BEGIN);
        }
        for u in lib.needed_by(&code) {
            for (i, line) in u.lines.iter().enumerate() {
                push(line, (lib.file, u.first_line + i));
            }
        }
        if begins && !begins_itself(file, body) {
            push("begin_call()", (COMPOSED, 2));
        }
    }
    for (i, line) in body.lines().enumerate() {
        push(line, (file, i + 2));
    }
    out
}

/// The guard's memory of the checks that passed (see guard.lua): the keys found under a
/// prefix, the freeze marker of each prefix of the right shape, the shard keys found where a
/// call declares them (`declared_shard()` in common.lua), how many names the three hold, and
/// how many they may hold before all are dropped.
const FENCE_STATE: &str = "local FENCE_OK, FENCE_FROZEN, FENCE_BUILT, FENCE_COUNT, FENCE_LIMIT = \
                           {}, {}, {}, 0, 1024";

/// What lines written by the composer itself (not taken from a file) are attributed to.
const COMPOSED: &str = "(composed)";

/// The function of a library file that sets a call's state afresh (common.lua's).
const BEGIN: &str = "begin_call";

/// The line of an operation's header (its leading comment block) by which it declares that
/// its own code calls `begin_call()`: it then sets its call's state where it chooses, and the
/// composer adds no call before its first line. `admit.lua` does, so that a replay is answered
/// before it (the state it sets is a fresh admission's, and it costs a replay about 2,400
/// instructions: bench/README.md, "Round five: admission").
///
/// A declaration, not a search of the code for `begin_call()`: a comment moved, a helper
/// renamed or a string naming it would otherwise change what the composer emits without a
/// word. A unit test holds every declaration to the code (`begin_declaration_matches_code`).
pub const BEGINS_ITSELF: &str = "-- begin_call: itself";

/// Whether `body` (an operation's lines after its shebang) declares [`BEGINS_ITSELF`]; `Err`
/// for a declaration that is not exactly that line, is given twice, or stands anywhere but in
/// the leading comment block.
pub fn begin_declaration(body: &str) -> Result<bool, String> {
    let mut declared = false;
    let mut in_header = true;
    for (i, line) in body.lines().enumerate() {
        let at = i + 2;
        in_header = in_header && line.starts_with("--");
        if !line.trim_start().starts_with("-- begin_call:") {
            continue;
        }
        if line != BEGINS_ITSELF {
            return Err(format!("line {at}: {line:?} is not {BEGINS_ITSELF:?}"));
        }
        if !in_header {
            return Err(format!("line {at}: {BEGINS_ITSELF:?} outside the header"));
        }
        if declared {
            return Err(format!("line {at}: {BEGINS_ITSELF:?} twice"));
        }
        declared = true;
    }
    Ok(declared)
}

/// [`begin_declaration`] of operation `file`; panics on a malformed declaration (the
/// operations are compiled in; the unit tests compose every one).
fn begins_itself(file: &str, body: &str) -> bool {
    begin_declaration(body).unwrap_or_else(|e| panic!("{file}: {e}"))
}

/// `Err` unless `body` (an operation's lines after its shebang) declares [`BEGINS_ITSELF`]
/// exactly when its code calls `begin_call()`, itself or through a helper of `library` it
/// reaches (comments and strings are not code).
#[cfg(test)]
pub fn begin_declaration_matches_code(body: &str, library: Option<&Library>) -> Result<(), String> {
    let declared = begin_declaration(body)?;
    let through_helper = library.is_some_and(|lib| {
        lib.needed_by(body)
            .iter()
            .any(|u| !u.defines.iter().any(|d| d == BEGIN) && u.mentions.contains(BEGIN))
    });
    let calls = mentioned_names(body).contains(BEGIN) || through_helper;
    match (declared, calls) {
        (true, false) => Err(format!(
            "declares {BEGINS_ITSELF:?} but never calls {BEGIN}()"
        )),
        (false, true) => Err(format!(
            "calls {BEGIN}() without {BEGINS_ITSELF:?} in its header"
        )),
        _ => Ok(()),
    }
}

/// One operation of a library: its file, its text (shebang first) and whether it starts with
/// the shard helpers' `begin_call()` (unless its header says it calls it itself,
/// [`BEGINS_ITSELF`]).
pub struct LibraryOp {
    pub file: &'static str,
    pub text: &'static str,
    pub begins: bool,
}

/// Redis's globals that a library's Lua reads as its own locals of the same names (taken on a
/// function's first call, see `library`): through a function's empty globals table and its
/// metatable's `__index`, each use of a global costs a miss, a metatable lookup and a hit
/// (bench/README.md, "Round seven: where the Lua goes").
const LUA_GLOBALS: &str = "tostring, tonumber, type, pairs, ipairs, unpack, next, pcall, error, select, string, table, math";

/// The name every library is built under before its hash is known (`scripts::library`
/// replaces it).
pub const NAME_PLACEHOLDER: &str = "sluice_@@@@@@@@@@@@";

/// Builds sluice's Lua as one Redis Functions library named `name`: the helper files whole
/// (each definition made once, when the library loads), then one function per operation,
/// registered as `<name>_<operation>` with the flags of its shebang line. A function's body is
/// the convention's set-up (`KEYS`, `ARGV`, shared by the helpers as the library's locals),
/// `guard`, `begin_call()` for a shard operation, then the operation's own lines (those of its
/// per-call part: what comes before it is made once, see [`split_once`]). Panics on an
/// operation without a `#!lua` first line (they are compiled in; the unit tests build it).
pub fn library(
    name: &str,
    helpers: &[(&'static str, &'static str)],
    guard: (&'static str, &'static str),
    ops: &[LibraryOp],
) -> Composed {
    let mut out = Composed {
        source: String::new(),
        origins: Vec::new(),
    };
    let mut push = |line: &str, origin: (&'static str, usize)| {
        out.source.push_str(line);
        out.source.push('\n');
        out.origins.push(origin);
    };
    push(&format!("#!lua name={name}"), (COMPOSED, 1));
    // The calling convention, as locals every helper and function shares (one call at a time
    // runs on a Redis, and each function sets them first). `redis_call` is `redis.call`, which
    // the Lua calls by that name: a function's globals are an empty table whose metatable's
    // `__index` is Redis's real globals, so `redis.call` costs every command two table misses,
    // a metatable lookup and two hits (about 220 instructions; bench/README.md, "Round seven:
    // where the Lua goes") where an upvalue costs one VM instruction. A library cannot take it
    // when it loads (its globals then hold `redis.register_function` alone), so each function
    // takes it first, with `KEYS` and `ARGV`.
    push("local KEYS, ARGV, P, redis_call", (COMPOSED, 2));
    // The same for the other globals the Lua calls, under their own names: a function that
    // returns the globals, written before the locals that hide them, and the locals, set by a
    // function's first call (none are at hand while the library loads, nor used then).
    push(
        &format!("local function lua_globals() return {LUA_GLOBALS} end"),
        (COMPOSED, 9),
    );
    push(&format!("local {LUA_GLOBALS}"), (COMPOSED, 10));
    // What guard.lua remembers of the keys it passed, for as long as the library lives.
    push(FENCE_STATE, (COMPOSED, 6));
    for (file, text) in helpers {
        for (i, line) in text.lines().enumerate() {
            push(line, (file, i + 1));
        }
    }
    for op in ops {
        let (shebang, body) = op.text.split_once('\n').unwrap_or((op.text, ""));
        let flags = shebang
            .strip_prefix("#!lua")
            .unwrap_or_else(|| panic!("{} must open with a #!lua line", op.file))
            .trim()
            .strip_prefix("flags=")
            .map(|f| {
                f.split(',')
                    .map(|f| format!("'{}'", f.trim()))
                    .collect::<Vec<_>>()
                    .join(", ")
            })
            .unwrap_or_default();
        let stem = op.file.trim_end_matches(".lua");
        // The once-per-load part and the register call share a block: its locals are the
        // function's upvalues, and no other operation's.
        let (once, per_call) = split_once(body);
        if !once.is_empty() {
            push("do", (COMPOSED, 7));
            for (i, line) in &once {
                push(line, (op.file, *i));
            }
        }
        push(
            &format!(
                "redis.register_function{{function_name = '{name}_{stem}', flags = {{ {flags} }}, \
                 callback = function(keys, args)"
            ),
            (op.file, 1),
        );
        push(
            "KEYS, ARGV, redis_call = keys, args, redis.call",
            (COMPOSED, 3),
        );
        push(
            &format!("if not string then {LUA_GLOBALS} = lua_globals() end"),
            (COMPOSED, 11),
        );
        for (i, line) in guard.1.lines().enumerate() {
            push(line, (guard.0, i + 1));
        }
        if op.begins && !begins_itself(op.file, body) {
            push("begin_call()", (COMPOSED, 4));
        }
        for (i, line) in per_call {
            push(line, (op.file, i));
        }
        push("end }", (COMPOSED, 5));
        if !once.is_empty() {
            push("end", (COMPOSED, 8));
        }
    }
    out
}

/// Lines of an operation's file, each with its 1-based number.
pub type Lines<'a> = Vec<(usize, &'a str)>;

/// The line that ends an operation's once-per-load part (see [`split_once`]).
pub const PER_CALL: &str = "-- Per call";

/// An operation's body (its lines after the shebang, numbered from 2) split at its line that
/// starts with [`PER_CALL`]: the lines before it define what the operation's calls share
/// (its helpers, and the locals they use), made once when the library loads; the rest runs on
/// every call, and sets afresh every one of those locals a call changes (a unit test checks
/// it). Without that line everything runs on every call. A helper defined inside the function
/// would be a closure built on every call, several thousand instructions with its upvalues
/// (callgrind, Redis 7.0). A script of its own (`compose`) runs both parts on every call, in
/// order: the same thing.
pub fn split_once(body: &str) -> (Lines<'_>, Lines<'_>) {
    let lines: Lines<'_> = body.lines().enumerate().map(|(i, l)| (i + 2, l)).collect();
    match lines.iter().position(|(_, l)| l.starts_with(PER_CALL)) {
        Some(at) => (lines[..at].to_vec(), lines[at..].to_vec()),
        None => (Vec::new(), lines),
    }
}

/// (file, 1-based line) of each line of a composed script.
type Origins = Vec<(&'static str, usize)>;

/// Where each composed script's lines came from, by the script's SHA1.
fn registry() -> &'static Mutex<HashMap<String, Origins>> {
    static ORIGINS: OnceLock<Mutex<HashMap<String, Origins>>> = OnceLock::new();
    ORIGINS.get_or_init(Default::default)
}

/// The registry's entry for the library this process loads, for errors of `FUNCTION LOAD`.
pub const LOADING: &str = "(loading)";

/// Remembers `c`'s line origins under `sha` (the script's SHA1, as Redis names it), or under
/// a library's name (its functions' names start with it).
pub fn register(sha: &str, c: &Composed) {
    registry()
        .lock()
        .expect("script registry")
        .entry(sha.to_owned())
        .or_insert_with(|| c.origins.clone());
}

/// Rewrites Redis's `user_script:N` in a script error to the file and line it came from, when
/// the message names a script composed here (`script: <sha1>`); other messages are returned
/// as they are.
///
/// A function's error names the function (`script: sluice_<hash>_admit`) and its line in the
/// whole library (`user_function:N`): the library registered under the longest name the
/// function's starts with gives the file and line. An error of `FUNCTION LOAD` names no
/// function: it is located in the library registered last under [`LOADING`].
pub fn locate(message: &str) -> String {
    let named = message.split("script: ").nth(1).map(|rest| {
        rest.chars()
            .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
            .collect::<String>()
    });
    let map = registry().lock().expect("script registry");
    let origins = match named {
        Some(sha) if sha.len() == 40 && sha.chars().all(|c| c.is_ascii_hexdigit()) => map.get(&sha),
        Some(function) => map
            .iter()
            .filter(|(lib, _)| function.starts_with(&format!("{lib}_")))
            .max_by_key(|(lib, _)| lib.len())
            .map(|(_, o)| o),
        None if message.contains("user_function:") => map.get(LOADING),
        None => None,
    };
    let Some(origins) = origins else {
        return message.to_owned();
    };
    let mut out = String::with_capacity(message.len());
    let mut rest = message;
    while let Some((at, tag)) = ["user_script:", "user_function:"]
        .iter()
        .filter_map(|t| rest.find(t).map(|at| (at, *t)))
        .min()
    {
        out.push_str(&rest[..at]);
        let after = &rest[at + tag.len()..];
        let digits: String = after.chars().take_while(char::is_ascii_digit).collect();
        match digits
            .parse::<usize>()
            .ok()
            .and_then(|n| origins.get(n.checked_sub(1)?))
        {
            Some((file, line)) => out.push_str(&format!("{file}:{line}")),
            None => out.push_str(&format!("{tag}{digits}")),
        }
        rest = &after[digits.len()..];
    }
    out.push_str(rest);
    out
}

/// The names a definition line introduces.
fn defined_names(line: &str) -> Vec<String> {
    let split = |s: &str| -> Vec<String> {
        s.split(',')
            .map(|n| n.trim().to_owned())
            .filter(|n| !n.is_empty())
            .collect()
    };
    if let Some(rest) = line.strip_prefix("local function ") {
        return vec![ident_prefix(rest)];
    }
    if let Some(rest) = line.strip_prefix("function ") {
        let name: String = rest
            .chars()
            .take_while(|c| c.is_alphanumeric() || *c == '_' || *c == '.')
            .collect();
        return vec![name];
    }
    if let Some(rest) = line.strip_prefix("local ") {
        let names = rest.split('=').next().unwrap_or(rest);
        return split(names);
    }
    // `name = function ...`: the body of a name declared earlier (`local a, b`).
    let names = line.split('=').next().unwrap_or(line);
    split(names)
}

fn ident_prefix(s: &str) -> String {
    s.chars()
        .take_while(|c| c.is_alphanumeric() || *c == '_')
        .collect()
}

/// The identifiers `code` mentions outside comments and string literals; `A.b` (a field of a
/// table of builders) is mentioned as both `A` and `A.b`.
fn mentioned_names(code: &str) -> BTreeSet<String> {
    let bytes = code.as_bytes();
    let mut names = BTreeSet::new();
    let mut i = 0;
    let ident_start = |c: u8| c.is_ascii_alphabetic() || c == b'_';
    let ident_char = |c: u8| c.is_ascii_alphanumeric() || c == b'_';
    while i < bytes.len() {
        let c = bytes[i];
        if c == b'-' && bytes.get(i + 1) == Some(&b'-') {
            // A comment: a long one (`--[[ ... ]]`) or to the end of the line.
            if code[i + 2..].starts_with("[[") {
                i = code[i..].find("]]").map_or(bytes.len(), |e| i + e + 2);
            } else {
                i = code[i..].find('\n').map_or(bytes.len(), |e| i + e);
            }
        } else if c == b'\'' || c == b'"' {
            i += 1;
            while i < bytes.len() && bytes[i] != c {
                if bytes[i] == b'\\' {
                    i += 1;
                }
                i += 1;
            }
            i += 1;
        } else if c == b'[' && bytes.get(i + 1) == Some(&b'[') {
            i = code[i..].find("]]").map_or(bytes.len(), |e| i + e + 2);
        } else if ident_start(c) {
            let start = i;
            while i < bytes.len() && ident_char(bytes[i]) {
                i += 1;
            }
            let name = &code[start..i];
            // Not the field of something else (`redis.call`, `x.y`): only a name at the start
            // of an expression can be a definition's.
            let after_dot =
                start > 0 && bytes[start - 1] == b'.' && !(start > 1 && bytes[start - 2] == b'.');
            if !after_dot {
                names.insert(name.to_owned());
                if bytes.get(i) == Some(&b'.')
                    && bytes.get(i + 1) != Some(&b'.')
                    && bytes.get(i + 1).is_some_and(|c| ident_start(*c))
                {
                    let field: String = code[i + 1..]
                        .chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect();
                    names.insert(format!("{name}.{field}"));
                }
            }
        } else if c.is_ascii_digit() {
            while i < bytes.len() && (bytes[i].is_ascii_alphanumeric() || bytes[i] == b'.') {
                i += 1;
            }
        } else {
            i += 1;
        }
    }
    names
}

#[cfg(test)]
mod tests {
    use super::*;

    const LIB: &str = r#"-- lib.lua: a test library
-- (its header belongs to no definition)

local K = {}
function K.row(id) return P .. 'exec:' .. id end
function K.bell() return P .. 'bell' end

-- says hello
local function hello(id)
  return 'hello ' .. K.row(id) -- not: unused()
end

local function unused() return 'unused' end
local notify, announce
local function caller() notify() end
announce = function() return K.bell() end
notify = function() announce() end
"#;

    #[test]
    fn a_library_splits_into_definitions_with_their_comments() {
        let lib = Library::parse("lib.lua", LIB);
        let defined: Vec<Vec<String>> = lib.units.iter().map(|u| u.defines.clone()).collect();
        assert_eq!(
            defined,
            vec![
                vec!["K"],
                vec!["K.row"],
                vec!["K.bell"],
                vec!["hello"],
                vec!["unused"],
                vec!["notify", "announce"],
                vec!["caller"],
                vec!["announce"],
                vec!["notify"],
            ]
        );
        let hello = &lib.units[3];
        assert_eq!(hello.first_line, 8, "the comment above belongs to it");
        assert_eq!(hello.lines.len(), 4);
        assert!(hello.mentions.contains("K.row"));
        assert!(
            !hello.mentions.contains("unused"),
            "a comment mentions nothing"
        );
        assert!(
            !hello.mentions.contains("exec"),
            "a string mentions nothing"
        );
    }

    #[test]
    fn an_operation_gets_what_it_reaches_and_nothing_else() {
        let lib = Library::parse("lib.lua", LIB);
        let op = "#!lua\n-- op.lua\nreturn hello(ARGV[1])\n";
        let c = compose("op.lua", op, &[], Some(&lib));
        assert!(c.source.contains("local function hello"));
        assert!(c.source.contains("function K.row"));
        assert!(!c.source.contains("function K.bell"), "{}", c.source);
        assert!(!c.source.contains("local function unused"));
        // Through a forward declaration: its body and what that body needs.
        let op = "#!lua\n-- op.lua\ncaller()\n";
        let c = compose("op.lua", op, &[], Some(&lib));
        for part in [
            "local notify, announce",
            "announce = function",
            "notify = function",
            "function K.bell",
        ] {
            assert!(c.source.contains(part), "{part} missing from\n{}", c.source);
        }
        assert!(!c.source.contains("local function hello"));
    }

    #[test]
    fn every_line_of_a_composed_script_knows_its_file_and_line() {
        let lib = Library::parse("lib.lua", LIB);
        let op = "#!lua flags=allow-oom\n-- op.lua\nlocal x = 1\nreturn hello(x)\n";
        let guard = "local P = ARGV[1]\n";
        let c = compose("op.lua", op, &[("guard.lua", guard)], Some(&lib));
        let lines: Vec<&str> = c.source.lines().collect();
        assert_eq!(lines.len(), c.origins.len());
        for (text, (file, line)) in lines.iter().zip(&c.origins) {
            if *file == COMPOSED {
                continue; // a line of the composer's own ("local P")
            }
            let original = match *file {
                "op.lua" => op,
                "guard.lua" => guard,
                _ => LIB,
            };
            assert_eq!(original.lines().nth(line - 1), Some(*text), "{file}:{line}");
        }
        assert_eq!(c.origins[0], ("op.lua", 1));
        assert_eq!(c.origins.last(), Some(&("op.lua", 4)));
    }

    #[test]
    fn an_error_names_the_file_and_line_it_came_from() {
        let lib = Library::parse("lib.lua", LIB);
        let op = "#!lua\n-- op.lua\nlocal x = 1\nreturn hello(x)\n";
        let c = compose("op.lua", op, &[], Some(&lib));
        let sha = "0123456789abcdef0123456789abcdef01234567";
        register(sha, &c);
        let last = c.origins.len();
        let hello_body = c
            .source
            .lines()
            .position(|l| l.contains("'hello '"))
            .unwrap()
            + 1;
        let msg =
            format!("ERR user_script:{hello_body}: boom script: {sha}, on @user_script:{last}.");
        assert_eq!(
            locate(&msg),
            format!("ERR lib.lua:10: boom script: {sha}, on @op.lua:4.")
        );
        // A message about a script not composed here is left alone.
        let other = "ERR user_script:3: boom script: ffffffffffffffffffffffffffffffffffffffff";
        assert_eq!(locate(other), other);
    }

    /// A library with per-call state, as common.lua has.
    const STATEFUL: &str = "-- state.lua\n\nlocal STATE\n\nlocal function begin_call()\n  \
                            STATE = {}\nend\n\nlocal function begin_here()\n  begin_call()\nend\n";

    /// How many `begin_call()` lines the composer itself wrote into `c`.
    fn composed_begins(c: &Composed) -> usize {
        c.source
            .lines()
            .zip(&c.origins)
            .filter(|(l, (file, _))| *file == COMPOSED && *l == "begin_call()")
            .count()
    }

    #[test]
    fn an_operation_declares_that_it_begins_its_call_itself_and_its_code_agrees() {
        let lib = Library::parse("state.lua", STATEFUL);
        let body = |header: &str, code: &str| format!("-- op.lua\n{header}--\n{code}");
        let declared = format!("{BEGINS_ITSELF}\n");
        let cases = [
            // (header, code, what the check says, whether the composer begins the call)
            (
                declared.as_str(),
                "if x then begin_call() end\n",
                Ok(()),
                false,
            ),
            (declared.as_str(), "begin_here()\n", Ok(()), false),
            ("", "return 1\n", Ok(()), true),
            // Text that names it but is no call: a comment, a string.
            (
                "",
                "-- begin_call() runs first\nreturn 'begin_call()'\n",
                Ok(()),
                true,
            ),
            (
                declared.as_str(),
                "-- begin_call()\nreturn 'begin_call()'\n",
                Err("never calls"),
                false,
            ),
            ("", "begin_call()\n", Err("without"), true),
            ("", "begin_here()\n", Err("without"), true),
        ];
        for (header, code, check, composer_begins) in cases {
            let body = body(header, code);
            let got = begin_declaration_matches_code(&body, Some(&lib));
            match check {
                Ok(()) => assert_eq!(got, Ok(()), "{body}"),
                Err(says) => assert!(
                    got.as_ref().is_err_and(|e| e.contains(says)),
                    "{body}: {got:?}"
                ),
            }
            let op: &'static str = Box::leak(format!("#!lua\n{body}").into_boxed_str());
            let c = compose("op.lua", op, &[], Some(&lib));
            assert_eq!(
                composed_begins(&c),
                usize::from(composer_begins),
                "{}",
                c.source
            );
            let l = library(
                "lib",
                &[("state.lua", STATEFUL)],
                ("guard.lua", ""),
                &[LibraryOp {
                    file: "op.lua",
                    text: op,
                    begins: true,
                }],
            );
            assert_eq!(
                composed_begins(&l),
                usize::from(composer_begins),
                "{}",
                l.source
            );
        }
    }

    #[test]
    fn a_declaration_that_is_not_exactly_the_line_is_refused() {
        for bad in [
            "-- op.lua\n-- begin_call: yes\nreturn 1\n",
            "-- op.lua\n-- begin_call: itself.\nreturn 1\n",
            "-- op.lua\n-- begin_call: itself\n-- begin_call: itself\nbegin_call()\n",
            "-- op.lua\nbegin_call()\n-- begin_call: itself\n",
            "-- op.lua\n\n-- begin_call: itself\nbegin_call()\n",
        ] {
            assert!(begin_declaration(bad).is_err(), "{bad}");
        }
        assert_eq!(
            begin_declaration("-- op.lua\n-- begin_call: itself\nx()\n"),
            Ok(true)
        );
        assert_eq!(
            begin_declaration("-- op.lua\n-- begin_call() first\nx()\n"),
            Ok(false)
        );
    }

    #[test]
    fn every_name_a_sluice_library_defines_is_found() {
        let common = Library::parse(
            "common.lua",
            include_str!("../../migrations-lua/common.lua"),
        );
        let defined = common.defined();
        for name in [
            "K",
            "K.row",
            "finish",
            "notify",
            "announce",
            "RUN_FIELDS",
            "refresh",
            "QUANTUM",
        ] {
            assert!(defined.contains(name), "{name}");
        }
    }
}
