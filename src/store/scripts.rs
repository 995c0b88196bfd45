//! The Lua operations of `migrations-lua/`, compiled into the binary, and how each is composed
//! (`compose.rs` does the composing):
//!
//! ```text
//! <the operation's shebang line>   first line: `#!lua`, with the operation's flags
//! guard.lua                        prefix/KEYS check, freeze marker (every script)
//! what it uses of common.lua       shard helpers (shard scripts)
//!   or of acl_keys.lua             access key builders (access scripts)
//! <the operation's body>
//! ```
//!
//! The shebang makes Redis 7 treat the source as a script with declared keys: on a cluster
//! a key in another slot than the declared ones is refused. Flags, chosen per operation:
//! no flag (refused while Redis is over `maxmemory`) for what only adds data — admit, retry,
//! API key creation; `allow-oom` for everything that ends, moves or cleans up (so a full
//! Redis can still drain); `no-writes` for the read-only key lookup.
//!
//! They run as cached scripts (EVALSHA): `redis::Script` falls back to loading the source on
//! NOSCRIPT, so a `SCRIPT FLUSH` or a Redis restart costs one extra round trip on the next call
//! and nothing else. Redis Functions were the alternative: a library's helpers are defined once
//! per load instead of once per call, which would save about a third of a small script's cost;
//! they would also need loading on every primary (and again after a restart without
//! persistence). A script gets only the helpers it reaches instead, which halves that cost for
//! the hot ones.

use std::sync::OnceLock;

use redis::Script;

use super::compose::{self, Composed, Library};

const GUARD: &str = include_str!("../../migrations-lua/guard.lua");

/// The shard helpers, split into definitions once per process.
fn common() -> &'static Library {
    static LIB: OnceLock<Library> = OnceLock::new();
    LIB.get_or_init(|| {
        Library::parse(
            "common.lua",
            include_str!("../../migrations-lua/common.lua"),
        )
    })
}

/// The access key builders, split into definitions once per process.
fn acl_keys() -> &'static Library {
    static LIB: OnceLock<Library> = OnceLock::new();
    LIB.get_or_init(|| {
        Library::parse(
            "acl_keys.lua",
            include_str!("../../migrations-lua/acl_keys.lua"),
        )
    })
}

macro_rules! op {
    ($file:literal) => {
        ($file, include_str!(concat!("../../migrations-lua/", $file)))
    };
}

/// Which helpers a script is composed with.
#[derive(Clone, Copy, Debug)]
enum Kind {
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

/// A script handle for a composed operation; its line origins are registered under its SHA1
/// so that an error it raises names the right file and line (`compose::locate`).
fn script(kind: Kind, (file, op): (&'static str, &'static str)) -> Script {
    let c = composed(kind, file, op);
    let s = Script::new(&c.source);
    compose::register(s.get_hash(), &c);
    s
}

/// The composed source of a script of `migrations-lua/` by file name, exactly as the store
/// loads it; `op` may also be an operation of the caller's own (`kind` then says which
/// includes it gets: "shard", "acl" or "meta"; its second line, `-- <name>.lua: ...`, names
/// it in errors). Its line origins are registered, so errors it raises name the right line.
/// For tests that drive the scripts directly (the fences, the key builders); not part of the
/// API.
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

/// The text of an operation file of `migrations-lua/` by name (`admit.lua`, ...), as compiled
/// into the binary. For tests; not part of the API.
#[doc(hidden)]
pub fn operation(name: &str) -> Option<&'static str> {
    Some(match name {
        "admit.lua" => op!("admit.lua").1,
        "abandon.lua" => op!("abandon.lua").1,
        "adopt.lua" => op!("adopt.lua").1,
        "promote.lua" => op!("promote.lua").1,
        "cancel.lua" => op!("cancel.lua").1,
        "force_delete.lua" => op!("force_delete.lua").1,
        "list.lua" => op!("list.lua").1,
        "set_limits.lua" => op!("set_limits.lua").1,
        "pin.lua" => op!("pin.lua").1,
        "pin_home.lua" => op!("pin_home.lua").1,
        "start.lua" => op!("start.lua").1,
        "heartbeat.lua" => op!("heartbeat.lua").1,
        "complete.lua" => op!("complete.lua").1,
        "reclaim.lua" => op!("reclaim.lua").1,
        "retry.lua" => op!("retry.lua").1,
        "sweep.lua" => op!("sweep.lua").1,
        "api_key_create.lua" => op!("api_key_create.lua").1,
        "api_key_revoke.lua" => op!("api_key_revoke.lua").1,
        "api_key_auth.lua" => op!("api_key_auth.lua").1,
        "tenant_delete.lua" => op!("tenant_delete.lua").1,
        "sweeper_unlock.lua" => op!("sweeper_unlock.lua").1,
        "watch.lua" => op!("watch.lua").1,
        "dlq_dismiss.lua" => op!("dlq_dismiss.lua").1,
        "reschedule.lua" => op!("reschedule.lua").1,
        "migrate_dispatch.lua" => op!("migrate_dispatch.lua").1,
        "ring.lua" => op!("ring.lua").1,
        "key_limit.lua" => op!("key_limit.lua").1,
        "dry_admit.lua" => op!("dry_admit.lua").1,
        "webhook.lua" => op!("webhook.lua").1,
        _ => return None,
    })
}

/// The loaded-once script handles (each knows its SHA1).
pub struct Scripts {
    pub admit: Script,
    pub abandon: Script,
    pub adopt: Script,
    pub promote: Script,
    pub cancel: Script,
    pub force_delete: Script,
    pub list: Script,
    pub set_limits: Script,
    pub pin: Script,
    pub pin_home: Script,
    pub start: Script,
    pub heartbeat: Script,
    pub complete: Script,
    pub reclaim: Script,
    pub retry: Script,
    pub sweep: Script,
    pub api_key_create: Script,
    pub api_key_revoke: Script,
    pub api_key_auth: Script,
    pub tenant_delete: Script,
    pub sweeper_unlock: Script,
    pub watch: Script,
    pub dlq_dismiss: Script,
    pub reschedule: Script,
    pub migrate_dispatch: Script,
    pub ring: Script,
    pub key_limit: Script,
    pub dry_admit: Script,
    pub webhook: Script,
}

impl Scripts {
    pub fn new() -> Self {
        let shard = |op| script(Kind::Shard, op);
        let acl = |op| script(Kind::Acl, op);
        Self {
            admit: shard(op!("admit.lua")),
            abandon: shard(op!("abandon.lua")),
            adopt: shard(op!("adopt.lua")),
            promote: shard(op!("promote.lua")),
            cancel: shard(op!("cancel.lua")),
            force_delete: shard(op!("force_delete.lua")),
            list: shard(op!("list.lua")),
            set_limits: shard(op!("set_limits.lua")),
            pin: shard(op!("pin.lua")),
            pin_home: shard(op!("pin_home.lua")),
            start: shard(op!("start.lua")),
            heartbeat: shard(op!("heartbeat.lua")),
            complete: shard(op!("complete.lua")),
            reclaim: shard(op!("reclaim.lua")),
            retry: shard(op!("retry.lua")),
            sweep: shard(op!("sweep.lua")),
            api_key_create: acl(op!("api_key_create.lua")),
            api_key_revoke: acl(op!("api_key_revoke.lua")),
            api_key_auth: acl(op!("api_key_auth.lua")),
            tenant_delete: acl(op!("tenant_delete.lua")),
            sweeper_unlock: script(Kind::Meta, op!("sweeper_unlock.lua")),
            watch: shard(op!("watch.lua")),
            dlq_dismiss: shard(op!("dlq_dismiss.lua")),
            reschedule: shard(op!("reschedule.lua")),
            migrate_dispatch: shard(op!("migrate_dispatch.lua")),
            ring: shard(op!("ring.lua")),
            key_limit: shard(op!("key_limit.lua")),
            dry_admit: shard(op!("dry_admit.lua")),
            webhook: shard(op!("webhook.lua")),
        }
    }

    /// Every script, for loading and readiness checks.
    pub fn all(&self) -> [&Script; 29] {
        [
            &self.admit,
            &self.abandon,
            &self.adopt,
            &self.promote,
            &self.cancel,
            &self.force_delete,
            &self.list,
            &self.set_limits,
            &self.pin,
            &self.pin_home,
            &self.start,
            &self.heartbeat,
            &self.complete,
            &self.reclaim,
            &self.retry,
            &self.sweep,
            &self.api_key_create,
            &self.api_key_revoke,
            &self.api_key_auth,
            &self.tenant_delete,
            &self.sweeper_unlock,
            &self.watch,
            &self.dlq_dismiss,
            &self.reschedule,
            &self.migrate_dispatch,
            &self.ring,
            &self.key_limit,
            &self.dry_admit,
            &self.webhook,
        ]
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_composed_script_opens_with_a_shebang_and_the_guard() {
        let ops = [
            "admit.lua",
            "abandon.lua",
            "adopt.lua",
            "promote.lua",
            "cancel.lua",
            "force_delete.lua",
            "list.lua",
            "set_limits.lua",
            "pin.lua",
            "pin_home.lua",
            "start.lua",
            "heartbeat.lua",
            "complete.lua",
            "reclaim.lua",
            "retry.lua",
            "sweep.lua",
            "api_key_create.lua",
            "api_key_revoke.lua",
            "api_key_auth.lua",
            "tenant_delete.lua",
            "sweeper_unlock.lua",
            "watch.lua",
            "dlq_dismiss.lua",
            "reschedule.lua",
            "migrate_dispatch.lua",
            "ring.lua",
            "key_limit.lua",
            "dry_admit.lua",
            "webhook.lua",
        ];
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations-lua/");
        for op in ops {
            let text = std::fs::read_to_string(format!("{dir}{op}")).unwrap();
            assert_eq!(
                operation(op),
                Some(text.as_str()),
                "{op} is compiled in as it is"
            );
            let kind = if op.starts_with("api_key") || op == "tenant_delete.lua" {
                "acl"
            } else if op == "sweeper_unlock.lua" {
                "meta"
            } else {
                "shard"
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
        }
        // Every operation file in the folder is one of the above (or an include).
        let mut files: Vec<String> = std::fs::read_dir(dir)
            .unwrap()
            .map(|e| e.unwrap().file_name().into_string().unwrap())
            .filter(|f| f.ends_with(".lua"))
            .filter(|f| !["guard.lua", "common.lua", "acl_keys.lua"].contains(&f.as_str()))
            .collect();
        files.sort();
        let mut listed: Vec<String> = ops.iter().map(|s| s.to_string()).collect();
        listed.sort();
        assert_eq!(files, listed);
        assert_eq!(Scripts::new().all().len(), ops.len());
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
