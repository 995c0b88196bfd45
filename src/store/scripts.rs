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

use super::call::Call;
use super::compose::{self, Composed, Library};
use super::{access, admit, cancel, commit, dead_letters, key_limits, keys, lease, list, pin};
use super::{reap, schema, sweep, tenants, wake, watch, webhooks};

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

/// A script handle for a composed operation; its line origins are registered under its SHA1
/// so that an error it raises names the right file and line (`compose::locate`).
fn script(kind: Kind, file: &'static str, op: &'static str) -> Script {
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

/// Declares the script table: each script's field of `Scripts`, the helpers it is composed
/// with, its file, and its typed call (see `call.rs`). Everything that lists the scripts is
/// generated from this one list, and each call is bound to its script here: a call type can
/// only be sent to the script it names.
macro_rules! scripts {
    ($($name:ident: $kind:ident $file:literal => $call:ty,)*) => {
        /// The loaded-once script handles (each knows its SHA1). Private: a script is
        /// reached only through its typed call (`ShardScript::script`, `TagScript::script`).
        pub struct Scripts {
            $($name: Script,)*
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
                    $($name: script(
                        Kind::$kind,
                        $file,
                        include_str!(concat!("../../migrations-lua/", $file)),
                    ),)*
                }
            }

            /// Every script, for loading and readiness checks.
            pub fn all(&self) -> Vec<&Script> {
                vec![$(&self.$name,)*]
            }
        }
    };
}

/// A call bound to a script of the shard's tag: the caller adds the shard's freeze marker
/// and common values (`Store::shard_call`).
pub(super) trait ShardScript: Call {
    fn script(scripts: &Scripts) -> &Script;
}

/// A call bound to a script of the `{acl}` or `{meta}` tag: the caller adds the tag's freeze
/// marker and prefix (`Store::tag_call`).
pub(super) trait TagScript: Call {
    fn script(scripts: &Scripts) -> &Script;
    fn frozen() -> String;
    fn prefix() -> &'static str;
}

/// Binds a call type to its script, by the kind of script it is.
macro_rules! bind {
    (Shard, $name:ident, $call:ty) => {
        impl ShardScript for $call {
            fn script(scripts: &Scripts) -> &Script {
                &scripts.$name
            }
        }
    };
    (Acl, $name:ident, $call:ty) => {
        impl TagScript for $call {
            fn script(scripts: &Scripts) -> &Script {
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
            fn script(scripts: &Scripts) -> &Script {
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
