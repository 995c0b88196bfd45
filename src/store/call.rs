//! Typed script calls: every script of `migrations-lua/` is called through one struct whose
//! fields are its KEYS and ARGV, named as its header names them and declared in the header's
//! order, so a call cannot send a key or value to the wrong position.
//!
//! Why: a script's positions used to be written twice by hand, as the `KEYS[n]` / `ARGV[n]`
//! lines of its Lua header and as a run of `.key()` / `.arg()` calls in Rust, and nothing
//! compared the two. Now `script_call!` declares a call once; the struct emits its fields in
//! declaration order, and `Call::SHAPE` keeps their names, which the test at the bottom of this
//! file checks against the header of the script `scripts.rs` binds the call to.
//!
//! The header grammar that test reads (the leading comment block of each operation file):
//!
//! ```text
//! -- KEYS[1]  frozen: the freeze marker (see guard.lua)        every script's first key
//! -- KEYS[2]  runnable: ...                                    one line per position
//! -- KEYS[3..] rows: ...                                       a tail of any length
//! --   +0 row: ...                                             a tail of groups: each group's
//! --   +1 void: ...                                              members, in order
//! -- ARGV[1..5] common: ...                                    a shard script's policy values
//! -- ARGV[1]  prefix: ...                                      an access or {meta} script's
//! -- ARGV[6]  consumer: ...
//! -- ARGV[8..] held: ...
//! -- KEYS and ARGV: as admit.lua                               another script's header
//! ```
//!
//! The first key (the freeze marker) and the first values (the prefix and, for a shard script,
//! the policy) come from the caller's `Store` (`shard_call`, `tag_call`), not from the struct.

use super::function::Invocation;

/// The names a call gives its script's own positions, after the common ones.
#[cfg_attr(not(test), allow(dead_code, reason = "read by the header check only"))]
#[derive(Debug)]
pub(crate) struct Shape {
    /// KEYS after the freeze marker, in order.
    pub keys: &'static [&'static str],
    /// The variable-length tail of KEYS, if any.
    pub key_tail: Option<Tail>,
    /// ARGV after the common values, in order.
    pub args: &'static [&'static str],
    /// The variable-length tail of ARGV, if any.
    pub arg_tail: Option<Tail>,
}

/// A variable-length tail: its name, and when it repeats a group, the group's members.
#[cfg_attr(not(test), allow(dead_code, reason = "read by the header check only"))]
#[derive(Debug)]
pub(crate) struct Tail {
    pub name: &'static str,
    /// Empty for a tail of single values (or of pairs described in prose).
    pub parts: &'static [&'static str],
}

/// A call of one script: its own keys and values, in its header's order.
pub(crate) trait Call {
    /// What the header must say.
    #[cfg_attr(not(test), allow(dead_code, reason = "read by the header check only"))]
    const SHAPE: Shape;
    /// Appends the keys after the freeze marker.
    fn keys(&self, inv: &mut Invocation<'_>);
    /// Appends the values after the common ones.
    fn args(&self, inv: &mut Invocation<'_>);
}

/// A group that repeats in a call's tails (one admission of `admit.lua`, one report of
/// `complete.lua`): the names of its keys and values, in order.
#[cfg_attr(not(test), allow(dead_code, reason = "read by the header check only"))]
pub(crate) trait Group {
    const KEYS: &'static [&'static str];
    const ARGS: &'static [&'static str];
}

/// The tail of a group tail's shape (`const` context).
#[cfg_attr(not(test), allow(dead_code, reason = "read by the header check only"))]
pub(crate) const fn group_tail(name: &'static str, parts: &'static [&'static str]) -> Option<Tail> {
    Some(Tail { name, parts })
}

/// The first of zero or one names (`const` context): how an optional tail's name is written.
#[cfg_attr(not(test), allow(dead_code, reason = "read by the header check only"))]
pub(crate) const fn tail(names: &'static [&'static str]) -> Option<Tail> {
    match names {
        [] => None,
        [name, ..] => Some(Tail { name, parts: &[] }),
    }
}

/// The type of a key field of `script_call!` / `script_group!`: `String` unless the field
/// names another (`row: Vec<u8>`: a key that holds an execution id, see `Shard::stored_id`).
macro_rules! key_type {
    () => {
        String
    };
    ($t:ty) => {
        $t
    };
}

/// Declares a typed call: a struct whose fields are the script's keys (`String`, or the type
/// written after the name: `Vec<u8>` for a key holding an execution id), an
/// optional key tail (any `ToRedisArgs`, each element one key), its values (any
/// `ToRedisArgs`), and an optional value tail; or, instead of the two tails, one tail of
/// groups (`items name: Group`), a slice of `commit::Item`s each carrying one group's keys
/// and values. Fields are emitted in the order written, which must be the header's.
macro_rules! script_call {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident $(<$lt:lifetime>)? {
            keys { $($(#[$kmeta:meta])* $key:ident $(: $kty:ty)?),* $(,)? }
            $(key_tail { $(#[$ktmeta:meta])* $ktail:ident: $ktty:ty $(,)? })?
            args { $($(#[$ameta:meta])* $arg:ident: $aty:ty),* $(,)? }
            $(arg_tail { $(#[$atmeta:meta])* $atail:ident: $atty:ty $(,)? })?
        }
    ) => {
        $(#[$meta])*
        $vis struct $name $(<$lt>)? {
            $($(#[$kmeta])* pub $key: $crate::store::call::key_type!($($kty)?),)*
            $($(#[$ktmeta])* pub $ktail: $ktty,)?
            $($(#[$ameta])* pub $arg: $aty,)*
            $($(#[$atmeta])* pub $atail: $atty,)?
        }

        impl $(<$lt>)? $crate::store::call::Call for $name $(<$lt>)? {
            const SHAPE: $crate::store::call::Shape = $crate::store::call::Shape {
                keys: &[$(stringify!($key)),*],
                key_tail: $crate::store::call::tail(&[$(stringify!($ktail))?]),
                args: &[$(stringify!($arg)),*],
                arg_tail: $crate::store::call::tail(&[$(stringify!($atail))?]),
            };

            #[allow(unused_variables)]
            fn keys(&self, inv: &mut $crate::store::function::Invocation<'_>) {
                $(inv.key(&self.$key);)*
                $(inv.key(&self.$ktail);)?
            }

            #[allow(unused_variables)]
            fn args(&self, inv: &mut $crate::store::function::Invocation<'_>) {
                $(inv.arg(&self.$arg);)*
                $(inv.arg(&self.$atail);)?
            }
        }
    };
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident<$lt:lifetime> {
            keys { $($(#[$kmeta:meta])* $key:ident $(: $kty:ty)?),* $(,)? }
            args { $($(#[$ameta:meta])* $arg:ident: $aty:ty),* $(,)? }
            items { $(#[$imeta:meta])* $items:ident: $group:ty $(,)? }
        }
    ) => {
        $(#[$meta])*
        $vis struct $name<$lt> {
            $($(#[$kmeta])* pub $key: $crate::store::call::key_type!($($kty)?),)*
            $($(#[$ameta])* pub $arg: $aty,)*
            $(#[$imeta])*
            pub $items: &$lt [&$lt $crate::store::commit::Item],
        }

        impl<$lt> $crate::store::call::Call for $name<$lt> {
            const SHAPE: $crate::store::call::Shape = $crate::store::call::Shape {
                keys: &[$(stringify!($key)),*],
                key_tail: $crate::store::call::group_tail(
                    stringify!($items),
                    <$group as $crate::store::call::Group>::KEYS,
                ),
                args: &[$(stringify!($arg)),*],
                arg_tail: $crate::store::call::group_tail(
                    stringify!($items),
                    <$group as $crate::store::call::Group>::ARGS,
                ),
            };

            fn keys(&self, inv: &mut $crate::store::function::Invocation<'_>) {
                $(inv.key(&self.$key);)*
                for item in self.$items {
                    inv.key(&item.keys);
                }
            }

            fn args(&self, inv: &mut $crate::store::function::Invocation<'_>) {
                $(inv.arg(&self.$arg);)*
                for item in self.$items {
                    inv.args_of(&item.args);
                }
            }
        }
    };
}

/// Declares a group of a call's group tail: a struct of its keys (optional last ones allowed,
/// sent where present) and values, which becomes one `commit::Item`.
macro_rules! script_group {
    (
        $(#[$meta:meta])*
        $vis:vis struct $name:ident $(<$lt:lifetime>)? {
            keys { $($(#[$kmeta:meta])* $key:ident $(: $kty:ty)?),* $(,)? }
            $(optional_keys { $($(#[$okmeta:meta])* $okey:ident $(: $okty:ty)?),+ $(,)? })?
            args { $($(#[$ameta:meta])* $arg:ident: $aty:ty),* $(,)? }
        }
    ) => {
        $(#[$meta])*
        $vis struct $name $(<$lt>)? {
            $($(#[$kmeta])* pub $key: $crate::store::call::key_type!($($kty)?),)*
            $($($(#[$okmeta])* pub $okey: Option<$crate::store::call::key_type!($($okty)?)>,)+)?
            $($(#[$ameta])* pub $arg: $aty,)*
        }

        impl $(<$lt>)? $crate::store::call::Group for $name $(<$lt>)? {
            const KEYS: &'static [&'static str] =
                &[$(stringify!($key),)* $($(stringify!($okey),)+)?];
            const ARGS: &'static [&'static str] = &[$(stringify!($arg)),*];
        }

        impl $(<$lt>)? From<$name $(<$lt>)?> for $crate::store::commit::Item {
            fn from(g: $name $(<$lt>)?) -> Self {
                use redis::ToRedisArgs;
                // Sized once: grown from empty, the two vectors were reallocated three to
                // five times per admission.
                let mut keys = Vec::with_capacity(
                    <$name as $crate::store::call::Group>::KEYS.len(),
                );
                $(keys.push(g.$key.into());)*
                $($(keys.extend(g.$okey.map(Into::into));)+)?
                let mut args = redis::Cmd::with_capacity(
                    <$name as $crate::store::call::Group>::ARGS.len(),
                    $crate::store::call::ITEM_VALUE_BYTES,
                );
                $(g.$arg.write_redis_args(&mut args);)*
                $crate::store::commit::Item { keys, args }
            }
        }
    };
}

pub(crate) use {key_type, script_call, script_group};

/// Room reserved for a group item's values: an admission with small params and a dedup key
/// writes about 200 bytes (a larger one grows the buffer once or twice).
pub(crate) const ITEM_VALUE_BYTES: usize = 256;

/// One operation file's header, as the test reads it.
#[cfg(test)]
#[derive(Debug, Default, PartialEq)]
struct Header {
    keys: Vec<String>,
    key_tail: Option<(String, Vec<String>)>,
    args: Vec<String>,
    arg_tail: Option<(String, Vec<String>)>,
}

/// Reads the `KEYS[..]` / `ARGV[..]` lines of an operation's leading comment block. Every
/// position must be named (`name:`) and numbered in order; `Err` says what is wrong.
#[cfg(test)]
fn parse_header(text: &str, of: &dyn Fn(&str) -> Option<&'static str>) -> Result<Header, String> {
    let mut h = Header::default();
    // Which list the `+n name:` lines belong to, while in a tail.
    let mut in_tail: Option<bool> = None;
    for (n, line) in text.lines().enumerate() {
        let at = || format!("line {}: {line}", n + 1);
        if line.starts_with("#!") {
            continue;
        }
        let Some(body) = line.strip_prefix("--") else {
            break;
        };
        if body.trim().is_empty() {
            // A blank comment line ends a tail's list of members.
            in_tail = None;
            continue;
        }
        if let Some(other) = body.trim().strip_prefix("KEYS and ARGV: as ") {
            let other = other.trim().trim_end_matches('.');
            let text = of(other).ok_or_else(|| format!("{}: no such file", at()))?;
            return parse_header(text, of);
        }
        let (which, rest) = if let Some(r) = body.strip_prefix(" KEYS[") {
            (true, r)
        } else if let Some(r) = body.strip_prefix(" ARGV[") {
            (false, r)
        } else {
            let t = body.trim_start();
            if let (Some(keys), Some(rest)) = (in_tail, t.strip_prefix('+')) {
                let (num, rest) = rest.split_once(' ').ok_or_else(at)?;
                let num: usize = num.parse().map_err(|_| at())?;
                let name = rest.trim_start().split_once(':').map(|(n, _)| n);
                let name = name.filter(|n| is_name(n)).ok_or_else(at)?;
                let tail = if keys {
                    &mut h.key_tail
                } else {
                    &mut h.arg_tail
                };
                let parts = &mut tail.as_mut().expect("in a tail").1;
                if num != parts.len() {
                    return Err(format!("{}: expected +{}", at(), parts.len()));
                }
                parts.push(name.to_owned());
            } else if t.starts_with("KEYS") || t.starts_with("ARGV") {
                return Err(format!("{}: one position per line, at the start", at()));
            }
            continue;
        };
        let (pos, rest) = rest.split_once(']').ok_or_else(at)?;
        if rest.contains("  KEYS[") || rest.contains("  ARGV[") {
            return Err(format!("{}: one position per line", at()));
        }
        let name = rest.trim_start().split_once(':').map(|(n, _)| n);
        let name = name
            .filter(|n| is_name(n))
            .ok_or_else(|| format!("{}: no name", at()))?;
        let list = if which { &mut h.keys } else { &mut h.args };
        let tail = if which { &h.key_tail } else { &h.arg_tail };
        if tail.is_some() {
            return Err(format!("{}: a position after a tail", at()));
        }
        let next = list.len() + 1;
        in_tail = None;
        if let Some(from) = pos.strip_suffix("..") {
            if from.parse() != Ok(next) {
                return Err(format!("{}: expected position {next}", at()));
            }
            let tail = (name.to_owned(), Vec::new());
            if which {
                h.key_tail = Some(tail);
            } else {
                h.arg_tail = Some(tail);
            }
            in_tail = Some(which);
        } else if let Some((from, to)) = pos.split_once("..") {
            let (from, to): (usize, usize) = (
                from.parse().map_err(|_| at())?,
                to.parse().map_err(|_| at())?,
            );
            if from != next || to < from {
                return Err(format!("{}: expected position {next}", at()));
            }
            for _ in from..=to {
                list.push(name.to_owned());
            }
        } else {
            if pos.parse() != Ok(next) {
                return Err(format!("{}: expected position {next}", at()));
            }
            list.push(name.to_owned());
        }
    }
    Ok(h)
}

#[cfg(test)]
fn is_name(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_lowercase() || c.is_ascii_digit() || c == '_')
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::scripts::{Kind, SHAPES, operation};

    /// What a call's shape says its script's header must be, common positions included.
    fn expected(kind: Kind, shape: &Shape) -> Header {
        let mut keys = vec!["frozen".to_owned()];
        keys.extend(shape.keys.iter().map(|k| k.to_string()));
        let mut args: Vec<String> = match kind {
            Kind::Shard => vec!["common".to_owned(); 5],
            Kind::Acl | Kind::Meta => vec!["prefix".to_owned()],
        };
        args.extend(shape.args.iter().map(|a| a.to_string()));
        let tail = |t: &Option<Tail>| {
            t.as_ref().map(|t| {
                (
                    t.name.to_owned(),
                    t.parts.iter().map(|p| p.to_string()).collect(),
                )
            })
        };
        Header {
            keys,
            key_tail: tail(&shape.key_tail),
            args,
            arg_tail: tail(&shape.arg_tail),
        }
    }

    #[test]
    fn every_script_header_names_the_positions_its_call_sends() {
        assert!(!SHAPES.is_empty());
        for (file, kind, shape) in SHAPES {
            let text = operation(file).unwrap();
            let header = parse_header(text, &operation).unwrap_or_else(|e| panic!("{file}: {e}"));
            assert_eq!(header, expected(*kind, shape), "{file}: header, then call");
        }
    }

    /// The literal indices `body` reads after `open` (`ARGV[`, `KEYS[`, `declared(`), and
    /// whether it also reads one by a computed index.
    fn reads(body: &str, open: &str) -> (Vec<usize>, bool) {
        let (mut found, mut computed) = (Vec::new(), false);
        for (at, _) in body.match_indices(open) {
            let rest = &body[at + open.len()..];
            let digits: String = rest.chars().take_while(char::is_ascii_digit).collect();
            let after = rest[digits.len()..].trim_start();
            match digits.parse() {
                Ok(n) if after.starts_with(']') || after.starts_with(',') => found.push(n),
                _ => computed = true,
            }
        }
        (found, computed)
    }

    #[test]
    fn every_script_reads_only_what_its_header_declares_and_all_of_it() {
        for (file, _, _) in SHAPES {
            let text = operation(file).unwrap();
            if text.contains("\n-- KEYS and ARGV: as ") {
                continue; // another script's header: it may read a part of it
            }
            let h = parse_header(text, &operation).unwrap();
            // The code, without comments (no script puts `--` inside a string it indexes by).
            let body: String = text
                .lines()
                .filter(|l| !l.starts_with("#!"))
                .map(|l| l.split("--").next().unwrap_or(""))
                .collect::<Vec<_>>()
                .join("\n");
            let (mut keys, mut keys_computed) = reads(&body, "KEYS[");
            let (declared, declared_computed) = reads(&body, "declared(");
            keys.extend(declared);
            keys_computed |= declared_computed;
            // The same check through the guard's memory (common.lua's declared_shard()).
            let (shard, shard_computed) = reads(&body, "declared_shard(");
            keys.extend(shard);
            keys_computed |= shard_computed;
            let (args, args_computed) = reads(&body, "ARGV[");
            for (what, read, computed, list, tail) in [
                ("KEYS", &keys, keys_computed, &h.keys, &h.key_tail),
                ("ARGV", &args, args_computed, &h.args, &h.arg_tail),
            ] {
                if tail.is_none() {
                    let beyond: Vec<_> = read.iter().filter(|n| **n > list.len()).collect();
                    assert!(
                        beyond.is_empty(),
                        "{file} reads undeclared {what} {beyond:?}"
                    );
                }
                if !computed {
                    // Its own positions (the common ones are read by guard.lua and common.lua).
                    let own = list
                        .iter()
                        .position(|n| n != "frozen" && n != "common" && n != "prefix");
                    for n in own.map_or(list.len(), |i| i) + 1..=list.len() {
                        assert!(
                            read.contains(&n),
                            "{file} never reads {what}[{n}] ({})",
                            list[n - 1]
                        );
                    }
                }
            }
        }
    }

    #[test]
    fn the_header_reader_refuses_what_it_cannot_check() {
        let none = |_: &str| None;
        let ok = "#!lua\n-- KEYS[1]  frozen: x\n-- KEYS[2..] rows: y\n--   +0 row: r\n\
                  -- ARGV[1..5] common: c\n-- ARGV[6]  id: i\nlocal x = 1\n-- KEYS[9] late: z\n";
        let h = parse_header(ok, &none).unwrap();
        assert_eq!(h.keys, ["frozen"]);
        assert_eq!(h.key_tail, Some(("rows".into(), vec!["row".into()])));
        assert_eq!(h.args.len(), 6);
        assert_eq!(h.arg_tail, None);
        for bad in [
            "-- KEYS[2]  skipped: a\n",
            "-- KEYS[1]  unnamed\n",
            "-- KEYS[1]  a: x  KEYS[2]  b: y\n",
            "-- KEYS[1..] t: x\n--   +1 late: y\n",
            "-- KEYS[1..] t: x\n-- KEYS[2]  after: y\n",
            "-- ARGV[2..1] common: x\n",
        ] {
            assert!(parse_header(bad, &none).is_err(), "{bad}");
        }
    }
}
