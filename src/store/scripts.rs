//! The Lua operations of `migrations-lua/`, compiled into the binary. Each script is the
//! shared helpers (`common.lua`) followed by one operation.
//!
//! They run as cached scripts (EVALSHA): `redis::Script` falls back to loading the source on
//! NOSCRIPT, so a `SCRIPT FLUSH` or a Redis restart costs one extra round trip on the next call
//! and nothing else. Redis Functions were the alternative; they would need reloading on every
//! primary after a restart without persistence, for no gain here.

use redis::Script;

macro_rules! lua {
    ($file:literal) => {
        concat!(
            include_str!("../../migrations-lua/common.lua"),
            "\n",
            include_str!(concat!("../../migrations-lua/", $file))
        )
    };
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
    pub start: Script,
    pub heartbeat: Script,
    pub complete: Script,
    pub reclaim: Script,
    pub retry: Script,
    pub sweep: Script,
}

impl Scripts {
    pub fn new() -> Self {
        Self {
            admit: Script::new(lua!("admit.lua")),
            abandon: Script::new(lua!("abandon.lua")),
            adopt: Script::new(lua!("adopt.lua")),
            promote: Script::new(lua!("promote.lua")),
            cancel: Script::new(lua!("cancel.lua")),
            force_delete: Script::new(lua!("force_delete.lua")),
            list: Script::new(lua!("list.lua")),
            set_limits: Script::new(lua!("set_limits.lua")),
            start: Script::new(lua!("start.lua")),
            heartbeat: Script::new(lua!("heartbeat.lua")),
            complete: Script::new(lua!("complete.lua")),
            reclaim: Script::new(lua!("reclaim.lua")),
            retry: Script::new(lua!("retry.lua")),
            sweep: Script::new(lua!("sweep.lua")),
        }
    }

    /// Every script, for loading and readiness checks.
    pub fn all(&self) -> [&Script; 14] {
        [
            &self.admit,
            &self.abandon,
            &self.adopt,
            &self.promote,
            &self.cancel,
            &self.force_delete,
            &self.list,
            &self.set_limits,
            &self.start,
            &self.heartbeat,
            &self.complete,
            &self.reclaim,
            &self.retry,
            &self.sweep,
        ]
    }
}

impl Default for Scripts {
    fn default() -> Self {
        Self::new()
    }
}
