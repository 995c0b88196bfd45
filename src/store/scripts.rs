//! The Lua operations of `migrations-lua/`, compiled into the binary, and the one Redis
//! Functions library they are loaded as (`compose.rs` builds it, `function.rs` calls it):
//!
//! ```text
//! #!lua name=sluice_<12 hex of the library's SHA-256>
//! common.lua, acl_keys.lua         the helpers, whole: defined once, when the library loads
//! per operation: a function sluice_<hash>_<operation> with the flags of its shebang line:
//!   guard.lua                      prefix/KEYS check, freeze marker (every function)
//!   begin_call()                   the shard helpers' per-call state, set afresh (none where
//!                                  the header says `-- begin_call: itself`: admit.lua)
//!   <the operation's body>
//! ```
//!
//! Flags, chosen per operation: none (refused while Redis is over `maxmemory`) for what only
//! adds data — admit, retry, API key creation; `allow-oom` for everything that ends, moves or
//! cleans up (so a full Redis can still drain); `no-writes` for the reads (called with
//! `FCALL_RO`). Never `no-cluster`: on a cluster Redis refuses a key in another slot than the
//! declared ones.
//!
//! Why one library: a script's chunk runs whole on every call, so the helpers it defines were
//! closures built anew on every call (140–240 k instructions of a call's overhead on the hot
//! paths); a library's chunk runs once per load. The price is loading: on every master, at
//! connect, before a shard move, and again on "Function not found" (`function.rs`).
//!
//! Each operation can still be composed as a script of its own (`composed_source`): its
//! shebang, guard.lua, the helpers it reaches and its body, as the tests that drive one
//! operation by EVAL (the fences, the key builders) and the benchmark's bare-script
//! comparison use it.

use std::sync::OnceLock;

use redis::Script;
use sha2::{Digest, Sha256};

use super::call::Call;
use super::compose::{self, Composed, Library, LibraryOp};
use super::function::Function;
use super::{access, admit, cancel, commit, dead_letters, key_limits, keys, lease, list, pin};
use super::{reap, relayout, schema, sweep, tenants, wake, watch, webhooks};

const GUARD: &str = include_str!("../../migrations-lua/guard.lua");
const COMMON: &str = include_str!("../../migrations-lua/common.lua");
const ACL_KEYS: &str = include_str!("../../migrations-lua/acl_keys.lua");

/// The shard helpers, split into definitions once per process.
fn common() -> &'static Library {
    static LIB: OnceLock<Library> = OnceLock::new();
    LIB.get_or_init(|| Library::parse("common.lua", COMMON))
}

/// The access key builders, split into definitions once per process.
fn acl_keys() -> &'static Library {
    static LIB: OnceLock<Library> = OnceLock::new();
    LIB.get_or_init(|| Library::parse("acl_keys.lua", ACL_KEYS))
}

/// Which helpers a script is composed with (and which common positions it takes).
#[derive(Clone, Copy, Debug)]
pub(super) enum Kind {
    /// A shard script: guard + what it uses of common.lua.
    Shard,
    /// An access script (`{acl}` tag): guard + what it uses of acl_keys.lua.
    Acl,
    /// A script on the `{meta}` tag: guard only.
    Meta,
}

fn composed(kind: Kind, file: &'static str, op: &'static str) -> Composed {
    let library = match kind {
        Kind::Shard => Some(common()),
        Kind::Acl => Some(acl_keys()),
        Kind::Meta => None,
    };
    compose::compose(file, op, &[("guard.lua", GUARD)], library)
}

/// This build's library: its name (`sluice_` and the first 12 hex digits of the SHA-256 of its
/// text) and its `FUNCTION LOAD` text, built once per process. Its line origins are
/// registered under its name, so that a function's error names the file and line.
pub struct Built {
    /// `sluice_<12 hex>`: the library's name, and the prefix of its functions' names.
    pub name: String,
    /// The text `FUNCTION LOAD` gets.
    pub source: String,
}

/// The prefix of every sluice library's name (`Store::retire_libraries` looks only at those).
pub const LIBRARY_PREFIX: &str = "sluice_";

/// This build's library (see [`Built`]).
pub fn library() -> &'static Built {
    static BUILT: OnceLock<Built> = OnceLock::new();
    BUILT.get_or_init(|| {
        let ops: Vec<LibraryOp> = TABLE
            .iter()
            .map(|&(file, kind, text)| LibraryOp {
                file,
                text,
                begins: matches!(kind, Kind::Shard),
            })
            .collect();
        let helpers = [("common.lua", COMMON), ("acl_keys.lua", ACL_KEYS)];
        let draft = compose::library(
            compose::NAME_PLACEHOLDER,
            &helpers,
            ("guard.lua", GUARD),
            &ops,
        );
        let hash = hex::encode(Sha256::digest(draft.source.as_bytes()));
        let name = format!("{LIBRARY_PREFIX}{}", &hash[..12]);
        let built = compose::library(&name, &helpers, ("guard.lua", GUARD), &ops);
        compose::register(&name, &built);
        compose::register(compose::LOADING, &built);
        Built {
            name,
            source: built.source,
        }
    })
}

/// The function of operation `file` in this build's library; `FCALL_RO` for a `no-writes` one.
fn function(file: &'static str, op: &'static str) -> Function {
    let lib = library();
    let read_only = op.lines().next().is_some_and(|l| l.contains("no-writes"));
    Function::new(
        format!("{}_{}", lib.name, file.trim_end_matches(".lua")),
        read_only,
        &lib.source,
    )
}

/// The composed source of a script of `migrations-lua/` by file name, as a script of its own
/// (EVAL); `op` may also be an operation of the caller's own (`kind` then says which
/// includes it gets: "shard", "acl" or "meta"; its second line, `-- <name>.lua: ...`, names
/// it in errors). Its line origins are registered, so errors it raises name the right line.
/// For tests that drive the scripts directly (the fences, the key builders) and the
/// benchmark; the store itself calls the library's functions. Not part of the API.
#[doc(hidden)]
pub fn composed_source(kind: &str, op: &str) -> String {
    let kind = match kind {
        "shard" => Kind::Shard,
        "acl" => Kind::Acl,
        _ => Kind::Meta,
    };
    // The composed text borrows from the operation for the life of the process: the tests
    // compose a handful of sources.
    let op: &'static str = Box::leak(op.to_owned().into_boxed_str());
    let file: &'static str = op
        .lines()
        .nth(1)
        .and_then(|l| l.strip_prefix("-- "))
        .and_then(|l| l.split(':').next())
        .filter(|n| n.ends_with(".lua"))
        .unwrap_or("operation");
    let c = composed(kind, file, op);
    compose::register(Script::new(&c.source).get_hash(), &c);
    c.source
}

/// Declares the script table: each script's field of `Scripts`, the helpers it is composed
/// with, its file, and its typed call (see `call.rs`). Everything that lists the scripts is
/// generated from this one list, and each call is bound to its script here: a call type can
/// only be sent to the script it names.
macro_rules! scripts {
    ($($name:ident: $kind:ident $file:literal => $call:ty,)*) => {
        /// The library's functions, one per operation. Private: a function is reached only
        /// through its typed call (`ShardScript::script`, `TagScript::script`).
        pub struct Scripts {
            $($name: Function,)*
        }

        /// Every operation file: its name, the helpers it is composed with, and its text as
        /// compiled into the binary.
        const TABLE: &[(&str, Kind, &str)] = &[
            $(($file, Kind::$kind, include_str!(concat!("../../migrations-lua/", $file))),)*
        ];

        /// Every operation file with the shape of its call, for the header check.
        #[cfg(test)]
        pub(super) const SHAPES: &[(&str, Kind, super::call::Shape)] = &[
            $(($file, Kind::$kind, <$call as Call>::SHAPE),)*
        ];

        $(bind!($kind, $name, $call);)*

        impl Scripts {
            pub fn new() -> Self {
                Self {
                    $($name: function(
                        $file,
                        include_str!(concat!("../../migrations-lua/", $file)),
                    ),)*
                }
            }

            /// Every function (the tests count them).
            #[cfg(test)]
            pub fn all(&self) -> Vec<&Function> {
                vec![$(&self.$name,)*]
            }
        }
    };
}

/// A call bound to a script of the shard's tag: the caller adds the shard's freeze marker
/// and common values (`Store::shard_call`).
pub(super) trait ShardScript: Call {
    fn script(scripts: &Scripts) -> &Function;
}

/// A call bound to a script of the `{acl}` or `{meta}` tag: the caller adds the tag's freeze
/// marker and prefix (`Store::tag_call`).
pub(super) trait TagScript: Call {
    fn script(scripts: &Scripts) -> &Function;
    fn frozen() -> String;
    fn prefix() -> &'static str;
}

/// Binds a call type to its script, by the kind of script it is.
macro_rules! bind {
    (Shard, $name:ident, $call:ty) => {
        impl ShardScript for $call {
            fn script(scripts: &Scripts) -> &Function {
                &scripts.$name
            }
        }
    };
    (Acl, $name:ident, $call:ty) => {
        impl TagScript for $call {
            fn script(scripts: &Scripts) -> &Function {
                &scripts.$name
            }
            fn frozen() -> String {
                keys::acl_frozen()
            }
            fn prefix() -> &'static str {
                keys::acl_prefix()
            }
        }
    };
    (Meta, $name:ident, $call:ty) => {
        impl TagScript for $call {
            fn script(scripts: &Scripts) -> &Function {
                &scripts.$name
            }
            fn frozen() -> String {
                keys::meta_frozen().to_owned()
            }
            fn prefix() -> &'static str {
                keys::meta_prefix()
            }
        }
    };
}

scripts! {
    admit: Shard "admit.lua" => commit::AdmitCall<'_>,
    abandon: Shard "abandon.lua" => admit::AbandonCall<'_>,
    adopt: Shard "adopt.lua" => lease::AdoptCall<'_>,
    promote: Shard "promote.lua" => tenants::PromoteCall,
    cancel: Shard "cancel.lua" => cancel::CancelCall<'_>,
    force_delete: Shard "force_delete.lua" => cancel::ForceDeleteCall<'_>,
    list: Shard "list.lua" => list::ListCall<'_>,
    set_limits: Shard "set_limits.lua" => tenants::SetLimitsCall<'_>,
    pin: Shard "pin.lua" => pin::PinCall<'_>,
    pin_home: Shard "pin_home.lua" => pin::PinHomeCall<'_>,
    start: Shard "start.lua" => lease::StartCall<'_>,
    heartbeat: Shard "heartbeat.lua" => lease::HeartbeatCall<'_>,
    complete: Shard "complete.lua" => commit::CompleteCall<'_>,
    reclaim: Shard "reclaim.lua" => lease::ReclaimCall,
    retry: Shard "retry.lua" => dead_letters::RetryCall<'_>,
    sweep: Shard "sweep.lua" => sweep::SweepCall<'_>,
    api_key_create: Acl "api_key_create.lua" => access::ApiKeyCreateCall<'_>,
    api_key_revoke: Acl "api_key_revoke.lua" => access::ApiKeyRevokeCall<'_>,
    api_key_auth: Acl "api_key_auth.lua" => access::ApiKeyAuthCall<'_>,
    tenant_delete: Acl "tenant_delete.lua" => access::TenantDeleteCall<'_>,
    sweeper_unlock: Meta "sweeper_unlock.lua" => sweep::SweeperUnlockCall<'_>,
    watch: Shard "watch.lua" => watch::WatchCall<'_>,
    dlq_dismiss: Shard "dlq_dismiss.lua" => dead_letters::DlqDismissCall<'_>,
    dlq_list: Shard "dlq_list.lua" => dead_letters::DlqListCall<'_>,
    dlq_reindex: Shard "dlq_reindex.lua" => dead_letters::DlqReindexCall<'_>,
    reschedule: Shard "reschedule.lua" => cancel::RescheduleCall<'_>,
    migrate_dispatch: Shard "migrate_dispatch.lua" => schema::MigrateDispatchCall,
    ring: Shard "ring.lua" => wake::RingCall,
    key_limit: Shard "key_limit.lua" => key_limits::KeyLimitCall<'_>,
    dry_admit: Shard "dry_admit.lua" => commit::DryAdmitCall<'_>,
    webhook: Shard "webhook.lua" => webhooks::WebhookCall<'_>,
    tenant_drop: Shard "tenant_drop.lua" => reap::TenantDropCall<'_>,
    tenant_reap: Shard "tenant_reap.lua" => reap::TenantReapCall<'_>,
    relayout_dedup: Shard "relayout_dedup.lua" => relayout::RelayoutDedupCall,
}

/// The text of an operation file of `migrations-lua/` by name (`admit.lua`, ...), as compiled
/// into the binary. For tests; not part of the API.
#[doc(hidden)]
pub fn operation(name: &str) -> Option<&'static str> {
    TABLE
        .iter()
        .find(|(file, _, _)| *file == name)
        .map(|(_, _, text)| *text)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_shard_function_begins_its_call_after_the_guard_unless_it_declares_it_does() {
        // admit.lua declares that it runs begin_call() itself, past its dedup lookup (a replay
        // is answered before it); every other shard operation gets the composer's call right
        // after the guard. Each declaration is held to the code, in both directions.
        let lib = library();
        let guard_end = "TRYAGAIN shard frozen for a slot move')\nend\n";
        let mut shard_ops = 0;
        for &(file, kind, text) in TABLE {
            let body = text.split_once('\n').map_or("", |(_, b)| b);
            let helpers = match kind {
                Kind::Shard => Some(common()),
                Kind::Acl => Some(acl_keys()),
                Kind::Meta => None,
            };
            compose::begin_declaration_matches_code(body, helpers)
                .unwrap_or_else(|e| panic!("{file}: {e}"));
            let own = compose::begin_declaration(body).unwrap();
            assert_eq!(own, file == "admit.lua", "{file}");
            if !matches!(kind, Kind::Shard) {
                continue;
            }
            shard_ops += 1;
            let stem = file.trim_end_matches(".lua");
            let at = lib
                .source
                .find(&format!("_{stem}', flags"))
                .unwrap_or_else(|| panic!("{file} is not in the library"));
            let body = &lib.source[at..];
            let after_guard = &body[body.find(guard_end).expect("the guard") + guard_end.len()..];
            assert_eq!(
                after_guard.starts_with("begin_call()\n"),
                !own,
                "{file}: {}",
                after_guard.lines().next().unwrap_or("")
            );
        }
        assert!(shard_ops > 10, "{shard_ops}");
    }

    #[test]
    fn every_composed_script_opens_with_a_shebang_and_the_guard() {
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations-lua/");
        for &(op, kind, _) in TABLE {
            let text = std::fs::read_to_string(format!("{dir}{op}")).unwrap();
            assert_eq!(
                operation(op),
                Some(text.as_str()),
                "{op} is compiled in as it is"
            );
            let kind = match kind {
                Kind::Shard => "shard",
                Kind::Acl => "acl",
                Kind::Meta => "meta",
            };
            let composed = composed_source(kind, &text);
            let first = composed.lines().next().unwrap();
            assert!(first.starts_with("#!lua"), "{op}: {first}");
            assert!(composed.contains("TRYAGAIN shard frozen"), "{op}");
            // Whatever the composed text mentions that a library defines, it defines.
            for lib in [common(), acl_keys()] {
                let missing = lib.missing_from(&composed);
                assert!(missing.is_empty(), "{op} lacks {missing:?}");
            }
            // The trend counters a call collects are written by its flush_trends() (see the
            // trends block of common.lua): a script that can collect one must flush.
            if composed.contains("\nlocal function trend_add(") {
                assert!(
                    text.contains("\nflush_trends()\n"),
                    "{op} can count trends but never writes them (flush_trends)"
                );
            }
            // Likewise the storage counters (see "Storage" in common.lua): a script that can
            // change them must write them. (A dry run reads them and cannot change them.)
            if composed.contains("\nlocal function count_bytes(")
                || composed.contains("\nlocal function retain(")
            {
                assert!(
                    text.contains("flush_usage()\n"),
                    "{op} can change storage counters but never writes them (flush_usage)"
                );
            }
        }
        // Every operation file in the folder is one of the above (or an include).
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|f| f.ends_with(".lua"))
            .filter(|f| !["guard.lua", "common.lua", "acl_keys.lua"].contains(&f.as_str()))
            .collect();
        files.sort();
        let mut listed: Vec<String> = TABLE.iter().map(|(f, _, _)| f.to_string()).collect();
        listed.sort();
        assert_eq!(files, listed);
        assert_eq!(Scripts::new().all().len(), TABLE.len());
    }

    /// The names common.lua declares at its top level that are not functions.
    fn top_level_values(text: &str) -> Vec<String> {
        text.lines()
            .filter_map(|l| l.strip_prefix("local "))
            .filter(|l| !l.starts_with("function "))
            .flat_map(|l| {
                l.split('=')
                    .next()
                    .unwrap_or(l)
                    .split(',')
                    .map(|n| n.trim().to_owned())
                    .collect::<Vec<_>>()
            })
            .filter(|n| !n.is_empty())
            .collect()
    }

    /// Whether `line` changes `name` (assigns it, one of its fields, or inserts into it).
    fn changes(line: &str, name: &str) -> bool {
        let code = line.split("--").next().unwrap_or("");
        let t = code.trim_start();
        if t.starts_with("local ") {
            return false;
        }
        let is_name = |s: &str| s.chars().all(|c| c.is_alphanumeric() || c == '_');
        // `NAME = `, `A, NAME = `, `NAME[x] = `
        if let Some((lhs, rhs)) = t.split_once('=')
            && !rhs.starts_with('=')
            && !lhs.ends_with(['~', '<', '>', '='])
        {
            let hit = lhs.split(',').any(|target| {
                let target = target.trim();
                let base = target.split('[').next().unwrap_or(target);
                base == name && is_name(base)
            });
            if hit {
                return true;
            }
        }
        ["table.insert(", "table.remove("]
            .iter()
            .any(|f| t.contains(&format!("{f}{name},")) || t.contains(&format!("{f}{name})")))
    }

    #[test]
    fn every_local_a_call_changes_is_reset_by_begin_call() {
        // A library's top-level locals live as long as the library: whatever a call changes
        // (in a helper, or in an operation's body) must be set afresh before the next call.
        let values = top_level_values(COMMON);
        assert!(values.contains(&"LIMITS_READ".to_owned()), "{values:?}");
        // A memo (its name ends in `_MEMO`) holds only what is a pure function of its key (a
        // day's number as text): what a call leaves in it is right for the next call.
        let values: Vec<String> = values
            .into_iter()
            .filter(|n| !n.ends_with("_MEMO"))
            .collect();
        let begin = COMMON
            .split("\nlocal function begin_call()\n")
            .nth(1)
            .and_then(|rest| rest.split("\nend").next())
            .expect("common.lua defines begin_call()");
        let resets: Vec<String> = begin
            .lines()
            .flat_map(|l| {
                l.split('=')
                    .next()
                    .unwrap_or("")
                    .split(',')
                    .map(|n| n.trim().to_owned())
                    .collect::<Vec<_>>()
            })
            .collect();
        let mut sources: Vec<(&str, &str, bool)> = vec![("common.lua", COMMON, true)];
        sources.extend(TABLE.iter().map(|&(f, _, t)| (f, t, false)));
        let mut missing = Vec::new();
        for (file, text, helpers) in sources {
            for (n, line) in text.lines().enumerate() {
                // A helper file's own top level runs once, at load; an operation's runs per
                // call, like the inside of every function.
                if helpers && !line.starts_with([' ', '\t']) {
                    continue;
                }
                if helpers && begin.contains(line) {
                    continue;
                }
                for name in &values {
                    if changes(line, name) && !resets.contains(name) {
                        missing.push(format!("{file}:{}: {name}", n + 1));
                    }
                }
            }
        }
        assert!(
            missing.is_empty(),
            "changed by a call but not reset by begin_call(): {missing:?}"
        );
    }

    #[test]
    fn what_an_operation_makes_once_is_set_afresh_by_each_call() {
        // An operation's part before its "-- Per call" line runs once, when the library loads
        // (compose::split_once): a local it declares that a call changes (in the part's
        // helpers or per call) keeps its value into the next call unless the per-call part
        // assigns it, as begin_call() does for common.lua's.
        let mut missing = Vec::new();
        let mut with_once = 0;
        for &(file, _, text) in TABLE {
            let body = text.split_once('\n').map_or("", |(_, b)| b);
            let (once, per_call) = compose::split_once(body);
            if once.is_empty() {
                continue;
            }
            with_once += 1;
            let declared =
                top_level_values(&once.iter().map(|(_, l)| *l).collect::<Vec<_>>().join("\n"));
            for name in declared {
                let changed = body.lines().any(|l| changes(l, &name));
                let reset = per_call.iter().any(|(_, l)| changes(l, &name));
                if changed && !reset {
                    missing.push(format!("{file}: {name}"));
                }
            }
        }
        assert!(
            with_once >= 2,
            "admit.lua and complete.lua make their helpers once"
        );
        assert!(
            missing.is_empty(),
            "changed by a call but not set by its per-call part: {missing:?}"
        );
    }

    #[test]
    fn the_library_registers_one_function_per_operation_with_its_flags() {
        let lib = library();
        assert!(lib.name.starts_with(LIBRARY_PREFIX) && lib.name.len() == 7 + 12);
        assert!(
            lib.source
                .starts_with(&format!("#!lua name={}\n", lib.name))
        );
        for &(file, _, text) in TABLE {
            let stem = file.trim_end_matches(".lua");
            let flags = text
                .lines()
                .next()
                .unwrap()
                .strip_prefix("#!lua")
                .unwrap()
                .trim()
                .strip_prefix("flags=")
                .unwrap_or("");
            assert!(!flags.contains("no-cluster"), "{file}");
            let quoted: Vec<String> = flags
                .split(',')
                .filter(|f| !f.is_empty())
                .map(|f| format!("'{f}'"))
                .collect();
            let line = format!(
                "redis.register_function{{function_name = '{}_{stem}', flags = {{ {} }}, ",
                lib.name,
                quoted.join(", ")
            );
            assert_eq!(lib.source.matches(&line).count(), 1, "{file}: {line}");
        }
        assert_eq!(
            lib.source.matches("redis.register_function{").count(),
            TABLE.len()
        );
        // The same text, the same name: a build calls its own library and nobody else's.
        assert_eq!(
            compose::library(
                &lib.name,
                &[("common.lua", COMMON), ("acl_keys.lua", ACL_KEYS)],
                ("guard.lua", GUARD),
                &TABLE
                    .iter()
                    .map(|&(file, kind, text)| LibraryOp {
                        file,
                        text,
                        begins: matches!(kind, Kind::Shard),
                    })
                    .collect::<Vec<_>>(),
            )
            .source,
            lib.source
        );
    }

    /// Every command goes through the `redis_call` local each function sets first
    /// (`compose::library`): called by its global, `redis.call` costs each command about 220
    /// redis-server instructions more (bench/README.md, "Round seven: where the Lua goes").
    #[test]
    fn the_lua_calls_redis_through_its_local() {
        let lib = library();
        let direct: Vec<&str> = lib
            .source
            .lines()
            .filter(|l| !l.trim_start().starts_with("--") && l.contains("redis.call("))
            .collect();
        assert!(direct.is_empty(), "redis.call( by its global: {direct:#?}");
        assert_eq!(
            lib.source
                .matches("\nKEYS, ARGV, redis_call = keys, args, redis.call\n")
                .count(),
            TABLE.len()
        );
    }

    /// The other globals the Lua calls (`tostring`, `string`, ...) are the library's locals of
    /// the same names, taken by every function's first call (`compose::library`): each
    /// function sets them, after the function that reads the globals and the locals that
    /// hide them.
    #[test]
    fn the_library_reads_the_globals_once() {
        let lib = library();
        let reads = lib
            .source
            .find("\nlocal function lua_globals() return tostring, ")
            .expect("the function that reads the globals");
        let hides = lib
            .source
            .find("\nlocal tostring, ")
            .expect("the locals that hide them");
        assert!(reads < hides);
        assert_eq!(
            lib.source
                .matches("\nif not string then tostring, ")
                .count(),
            TABLE.len()
        );
    }

    #[test]
    fn a_library_error_names_the_operation_file_and_line() {
        let lib = library();
        // The line of watch.lua that reads the row, wherever the library put it (in watch's
        // function: other operations have the same line).
        let name = format!("{}_watch", lib.name);
        let opens = lib
            .source
            .lines()
            .position(|l| l.contains(&format!("'{name}'")))
            .unwrap();
        let at = opens
            + lib
                .source
                .lines()
                .skip(opens)
                .position(|l| l.starts_with("local row = redis_call('HMGET', ROW, 't'"))
                .unwrap()
            + 1;
        let in_file = operation("watch.lua")
            .unwrap()
            .lines()
            .position(|l| l.starts_with("local row = redis_call('HMGET', ROW, 't'"))
            .unwrap()
            + 1;
        let msg = format!("ERR user_function:{at}: boom script: {name}, on @user_function:{at}.");
        assert_eq!(
            compose::locate(&msg),
            format!("ERR watch.lua:{in_file}: boom script: {name}, on @watch.lua:{in_file}.")
        );
        // A helper's line: the first key builder of common.lua.
        let k = lib
            .source
            .lines()
            .position(|l| l.starts_with("function K.ready()"))
            .unwrap()
            + 1;
        let k_file = COMMON
            .lines()
            .position(|l| l.starts_with("function K.ready()"))
            .unwrap()
            + 1;
        assert_eq!(
            compose::locate(&format!("ERR user_function:{k}: x script: {name}")),
            format!("ERR common.lua:{k_file}: x script: {name}")
        );
    }

    #[test]
    fn a_hot_script_carries_only_the_helpers_it_reaches() {
        let start = composed_source("shard", operation("start.lua").unwrap());
        assert!(start.contains("local function refresh("));
        assert!(
            !start.contains("local function tell_holder("),
            "start never tells a holder"
        );
        assert!(!start.contains("local function recover("));
        let admit = composed_source("shard", operation("admit.lua").unwrap());
        assert!(admit.contains("local function place("));
        assert!(
            !admit.contains("local function finish("),
            "admit finishes nothing"
        );
    }
}
