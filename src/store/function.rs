//! Calling the functions of sluice's Lua library (`FCALL` / `FCALL_RO`), and loading the
//! library where a node does not have it.
//!
//! Why a library rather than cached scripts: a script's chunk runs whole on every call, so
//! every helper it defines is a closure built anew each time (the key builders, the guard's
//! checks, the quota decision, ...). A library runs its chunk once, when it is loaded: a call
//! pays for its own lines only (`bench/README.md`, "Cost per execution", has the numbers).
//!
//! Where the library is: Redis keeps it in its RDB/AOF and replicates it, but a cluster does not
//! copy it from master to master, and a restart without persistence, `FUNCTION FLUSH` or a
//! replica promoted before it had the library leaves a master without it. `FUNCTION LOAD` is
//! sent to every master (the cluster client routes it to all of them) at connect
//! (`Store::ready`, where a master lacks it), before a shard move gives a master a slot (`reshard.rs`), and again
//! when a call is answered `ERR Function not found`: that answer proves the call did not run
//! (Redis looked the name up before anything else), so the call is sent once more after the
//! load and no request fails for it.
//!
//! The library's name carries the hash of its text (`scripts::library`), so two builds running
//! side by side during a rolling upgrade each call their own functions; `LOAD REPLACE` of the
//! same name is therefore always the same text, and loading it again on a master that has it
//! changes nothing. Which libraries of other builds may go is decided in `libraries.rs`.

use redis::aio::ConnectionLike;
use redis::{Cmd, FromRedisValue, RedisError, RedisResult, ToRedisArgs};

use super::compose;

/// One function of the library: its name on Redis, and whether it only reads (called with
/// `FCALL_RO`, so that Redis itself refuses a write from it).
#[derive(Debug, Clone)]
pub struct Function {
    name: String,
    read_only: bool,
    /// The library's `FUNCTION LOAD` text (shared by every function of it).
    library: &'static str,
}

impl Function {
    pub(super) fn new(name: String, read_only: bool, library: &'static str) -> Self {
        Self {
            name,
            read_only,
            library,
        }
    }

    /// The function's name on Redis (`sluice_<hash>_<operation>`).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A call of this function whose first key is `key`.
    pub fn key<T: ToRedisArgs>(&self, key: T) -> Invocation<'_> {
        let mut inv = Invocation {
            function: self,
            keys: Vec::new(),
            args: Vec::new(),
        };
        inv.key(key);
        inv
    }
}

/// A call of a function being put together: its keys and values, in order.
pub struct Invocation<'f> {
    function: &'f Function,
    keys: Vec<Vec<u8>>,
    args: Vec<Vec<u8>>,
}

impl Invocation<'_> {
    /// Appends a key (each element of a sequence is one key).
    pub fn key<T: ToRedisArgs>(&mut self, key: T) -> &mut Self {
        key.write_redis_args(&mut self.keys);
        self
    }

    /// Appends a value (each element of a sequence is one value).
    pub fn arg<T: ToRedisArgs>(&mut self, arg: T) -> &mut Self {
        arg.write_redis_args(&mut self.args);
        self
    }

    /// The `FCALL` (or `FCALL_RO`) command of this call.
    pub fn command(&self) -> Cmd {
        let mut cmd = redis::cmd(if self.function.read_only {
            "FCALL_RO"
        } else {
            "FCALL"
        });
        cmd.arg(&self.function.name).arg(self.keys.len());
        for k in &self.keys {
            cmd.arg(k.as_slice());
        }
        for a in &self.args {
            cmd.arg(a.as_slice());
        }
        cmd
    }

    /// Sends the call; when the node answers that it has no such function, loads the library
    /// on every master and sends the call once more (the answer proved it did not run).
    pub async fn invoke_async<T: FromRedisValue, C: ConnectionLike>(
        &self,
        conn: &mut C,
    ) -> RedisResult<T> {
        let cmd = self.command();
        match cmd.query_async(conn).await {
            Err(e) if is_missing(&e) => {
                load(conn, self.function.library).await?;
                cmd.query_async(conn).await
            }
            other => other,
        }
    }
}

/// Whether `e` is Redis's answer to a call of a function it does not have, which it gives
/// before running anything.
pub fn is_missing(e: &RedisError) -> bool {
    e.code() == Some("ERR")
        && e.detail()
            .is_some_and(|d| d.starts_with("Function not found"))
}

/// `FUNCTION LOAD REPLACE` of `library` on every master (the cluster client sends it to each
/// and fails unless all succeed). REPLACE makes it idempotent: a master that has the library
/// already gets the same text again.
pub async fn load<C: ConnectionLike>(conn: &mut C, library: &str) -> RedisResult<()> {
    let _: redis::Value = redis::cmd("FUNCTION")
        .arg("LOAD")
        .arg("REPLACE")
        .arg(library)
        .query_async(conn)
        .await
        .map_err(|e| {
            // A library that fails to compile names its line in the library's text.
            match e.detail() {
                Some(d) if d.contains("user_function:") => RedisError::from((
                    redis::ErrorKind::Client,
                    "FUNCTION LOAD failed",
                    compose::locate(d),
                )),
                _ => e,
            }
        })?;
    Ok(())
}
