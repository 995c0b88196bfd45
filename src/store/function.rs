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
use redis::{Arg, Cmd, FromRedisValue, RedisError, RedisResult, ToRedisArgs};

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
            keys: Cmd::new(),
            args: Cmd::new(),
        };
        inv.key(key);
        inv
    }
}

/// A call of a function being put together: its keys and values, in order.
///
/// Each list is a `Cmd` used as a buffer (one byte vector and the arguments' ends): a key or
/// value appended is copied once into it, not allocated as a vector of its own (an admission
/// group's call has some 30 of them per admission).
pub struct Invocation<'f> {
    function: &'f Function,
    keys: Cmd,
    args: Cmd,
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

    /// Appends every value written into `values` (a `Cmd` used as a buffer, as a group
    /// item's), in order.
    pub fn args_of(&mut self, values: &Cmd) -> &mut Self {
        for a in values.args_iter() {
            if let Arg::Simple(bytes) = a {
                self.args.arg(bytes);
            }
        }
        self
    }

    /// The `FCALL` (or `FCALL_RO`) command of this call.
    pub fn command(&self) -> Cmd {
        let keys = self.keys.args_iter();
        let args = self.args.args_iter();
        let bytes = bytes_of(&self.keys) + bytes_of(&self.args);
        let mut cmd = Cmd::with_capacity(
            3 + keys.len() + args.len(),
            "FCALL_RO".len() + self.function.name.len() + 20 + bytes,
        );
        cmd.arg(if self.function.read_only {
            "FCALL_RO"
        } else {
            "FCALL"
        })
        .arg(&self.function.name)
        .arg(keys.len());
        for a in keys.chain(args) {
            if let Arg::Simple(bytes) = a {
                cmd.arg(bytes);
            }
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

/// The bytes of the arguments written into `c` (a `Cmd` used as a buffer: it has no
/// cursor).
pub(super) fn bytes_of(c: &Cmd) -> usize {
    c.args_iter()
        .map(|a| {
            if let Arg::Simple(bytes) = a {
                bytes.len()
            } else {
                0
            }
        })
        .sum()
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The `FCALL` an invocation sends: name, key count, keys, then values, each as given
    /// (numbers in decimal, an empty value kept), whatever order they were appended in.
    #[test]
    fn an_invocation_sends_its_keys_then_its_values() {
        let f = Function::new("sluice_x_admit".into(), false, "");
        let mut inv = f.key("k:frozen");
        inv.arg("prefix").arg(42u64);
        inv.key(vec!["k:a".to_owned(), "k:b".to_owned()]);
        // A group item's values, written into a buffer of their own.
        let mut item = Cmd::new();
        item.arg(b"".as_slice())
            .arg(vec![b"x".to_vec(), b"yz".to_vec()]);
        inv.args_of(&item);
        assert_eq!(bytes_of(&item), 3);
        let expected = redis::cmd("FCALL")
            .arg("sluice_x_admit")
            .arg(3)
            .arg("k:frozen")
            .arg("k:a")
            .arg("k:b")
            .arg("prefix")
            .arg("42")
            .arg("")
            .arg("x")
            .arg("yz")
            .get_packed_command();
        assert_eq!(
            String::from_utf8_lossy(&inv.command().get_packed_command()),
            String::from_utf8_lossy(&expected)
        );
        let ro = Function::new("sluice_x_read".into(), true, "");
        let packed = ro.key("k").command().get_packed_command();
        assert_eq!(
            String::from_utf8_lossy(&packed),
            "*4\r\n$8\r\nFCALL_RO\r\n$13\r\nsluice_x_read\r\n$1\r\n1\r\n$1\r\nk\r\n"
        );
    }
}
