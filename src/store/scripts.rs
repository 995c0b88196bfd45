//! The Lua operations of `migrations-lua/`, compiled into the binary, and how each is composed:
//!
//! ```text
//! <the operation's shebang line>   first line: `#!lua`, with the operation's flags
//! guard.lua                        prefix/KEYS check, freeze marker (every script)
//! common.lua | acl_keys.lua        shard helpers | access key builders (if any)
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
//! and nothing else. Redis Functions were the alternative; they would need reloading on every
//! primary after a restart without persistence, for no gain here.

use redis::Script;

const GUARD: &str = include_str!("../../migrations-lua/guard.lua");
const COMMON: &str = include_str!("../../migrations-lua/common.lua");
const ACL_KEYS: &str = include_str!("../../migrations-lua/acl_keys.lua");

macro_rules! op {
    ($file:literal) => {
        include_str!(concat!("../../migrations-lua/", $file))
    };
}

/// The composed source of an operation: its shebang line first, then the includes, then the
/// rest of the operation. Panics on an operation without a `#!lua` first line (a build-time
/// constant: the unit tests below load every one).
pub fn compose(includes: &[&str], op: &str) -> String {
    let (shebang, body) = op.split_once('\n').unwrap_or((op, ""));
    assert!(
        shebang.starts_with("#!lua"),
        "a sluice script must open with a #!lua line, not {shebang:?}"
    );
    let mut s = format!("{shebang}\n");
    for inc in includes {
        s.push_str(inc);
        s.push('\n');
    }
    s.push_str(body);
    s
}

/// A shard operation: guard + common helpers + the operation.
pub fn shard_source(op: &str) -> String {
    compose(&[GUARD, COMMON], op)
}

/// An access operation (`{acl}` tag): guard + access key builders + the operation.
pub fn acl_source(op: &str) -> String {
    compose(&[GUARD, ACL_KEYS], op)
}

/// A script on the `{meta}` tag: guard + the operation.
pub fn meta_source(op: &str) -> String {
    compose(&[GUARD], op)
}

/// The composed source of a script of `migrations-lua/` by file name, exactly as the store
/// loads it; `name` may also be an operation of the caller's own (`kind` then says which
/// includes it gets: "shard", "acl" or "meta"). For tests that drive the scripts directly
/// (the fences, the key builders); not part of the API.
#[doc(hidden)]
pub fn composed_source(kind: &str, op: &str) -> String {
    match kind {
        "shard" => shard_source(op),
        "acl" => acl_source(op),
        _ => meta_source(op),
    }
}

/// The text of an operation file of `migrations-lua/` by name (`admit.lua`, ...), as compiled
/// into the binary. For tests; not part of the API.
#[doc(hidden)]
pub fn operation(name: &str) -> Option<&'static str> {
    Some(match name {
        "admit.lua" => op!("admit.lua"),
        "abandon.lua" => op!("abandon.lua"),
        "adopt.lua" => op!("adopt.lua"),
        "promote.lua" => op!("promote.lua"),
        "cancel.lua" => op!("cancel.lua"),
        "force_delete.lua" => op!("force_delete.lua"),
        "list.lua" => op!("list.lua"),
        "set_limits.lua" => op!("set_limits.lua"),
        "pin.lua" => op!("pin.lua"),
        "start.lua" => op!("start.lua"),
        "heartbeat.lua" => op!("heartbeat.lua"),
        "complete.lua" => op!("complete.lua"),
        "reclaim.lua" => op!("reclaim.lua"),
        "retry.lua" => op!("retry.lua"),
        "sweep.lua" => op!("sweep.lua"),
        "api_key_create.lua" => op!("api_key_create.lua"),
        "api_key_revoke.lua" => op!("api_key_revoke.lua"),
        "api_key_auth.lua" => op!("api_key_auth.lua"),
        "tenant_delete.lua" => op!("tenant_delete.lua"),
        "sweeper_unlock.lua" => op!("sweeper_unlock.lua"),
        "watch.lua" => op!("watch.lua"),
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
}

impl Scripts {
    pub fn new() -> Self {
        let shard = |op: &str| Script::new(&shard_source(op));
        let acl = |op: &str| Script::new(&acl_source(op));
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
            sweeper_unlock: Script::new(&meta_source(op!("sweeper_unlock.lua"))),
            watch: shard(op!("watch.lua")),
        }
    }

    /// Every script, for loading and readiness checks.
    pub fn all(&self) -> [&Script; 21] {
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
        ];
        let dir = concat!(env!("CARGO_MANIFEST_DIR"), "/migrations-lua/");
        for op in ops {
            let text = std::fs::read_to_string(format!("{dir}{op}")).unwrap();
            let composed = compose(&[GUARD], &text);
            let first = composed.lines().next().unwrap();
            assert!(first.starts_with("#!lua"), "{op}: {first}");
            assert!(composed.contains("TRYAGAIN shard frozen"), "{op}");
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
}
