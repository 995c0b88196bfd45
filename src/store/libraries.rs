//! The Lua libraries of other builds: which are deleted, and when.
//!
//! Each build loads its own library (`sluice_<hash>`, see `scripts::library`), so after an
//! upgrade the masters hold the older build's library too, and they would collect one per
//! build forever. A library is deleted only when no process of its build has said it runs for
//! [`LIBRARY_GRACE`]: every `serve` and `worker` process records its build's library name with
//! Redis's time in one `{meta}` hash (`keys::libraries`) at connect and then at most every
//! [`ANNOUNCE_EVERY`] (the sweeper's and the orphan scan's ticks), and the sweeper's turn
//! holder deletes, on every master, the `sluice_` libraries other than its own whose last word
//! is older than the grace. A library found on a master but never recorded (a process that
//! died before its first sweep, or a hash lost with a `{meta}` master) gets its grace from the
//! moment it is first seen. So during a rolling upgrade each build keeps its library while any
//! of its processes run.
//!
//! If a running build's library is deleted anyway (a process stalled longer than the grace,
//! clocks aside), nothing fails: its next call is answered "Function not found", which proves
//! it did not run, and the call loads the library again and repeats (`function.rs`).

use std::sync::atomic::Ordering;
use std::time::Duration;

use redis::Value;

use super::scripts::{LIBRARY_PREFIX, library};
use super::{Store, StoreError, keys};

/// How long a library of another build stays after a process of that build last said it runs.
pub const LIBRARY_GRACE: Duration = Duration::from_secs(3600);

/// How often a process says again that its build's library is in use.
pub const ANNOUNCE_EVERY: Duration = Duration::from_secs(300);

impl Store {
    /// Records that this build's library is in use, now (Redis's clock). At most once per
    /// [`ANNOUNCE_EVERY`] unless `force`; the sweeper and the orphan scan call it on each tick.
    pub async fn announce_library(&self, force: bool) -> Result<(), StoreError> {
        let now = self.clock.elapsed().as_millis() as u64 + 1;
        let last = self.announced.load(Ordering::Relaxed);
        if !force && last != 0 && now.saturating_sub(last) < ANNOUNCE_EVERY.as_millis() as u64 {
            return Ok(());
        }
        let mut c = self.conn();
        let at = self.redis_ms().await?;
        let _: i64 = self
            .bounded(
                redis::cmd("HSET")
                    .arg(keys::libraries())
                    .arg(&library().name)
                    .arg(at)
                    .query_async(&mut c),
            )
            .await?;
        self.announced.store(now, Ordering::Relaxed);
        Ok(())
    }

    /// Deletes, on every master, the sluice libraries of other builds whose processes have not
    /// said they run for `grace` (see the module comment); records the first sighting of a
    /// library nobody recorded. Returns the names deleted. Called by the sweeper's turn holder
    /// (one process at a time) and by the tests.
    pub async fn retire_libraries(&self, grace: Duration) -> Result<Vec<String>, StoreError> {
        let own = &library().name;
        let mut c = self.conn();
        let mut list = redis::cmd("FUNCTION");
        list.arg("LIST")
            .arg("LIBRARYNAME")
            .arg(format!("{LIBRARY_PREFIX}*"));
        let answers = self.bounded(c.on_every_master(&list)).await?;
        let mut present: Vec<String> = answers.iter().flat_map(library_names).collect();
        present.sort();
        present.dedup();
        let now = self.redis_ms().await?;
        let mut deleted = Vec::new();
        for name in present.iter().filter(|n| *n != own) {
            let seen: Option<u64> = self
                .bounded(
                    redis::cmd("HGET")
                        .arg(keys::libraries())
                        .arg(name)
                        .query_async(&mut c),
                )
                .await?;
            match seen {
                None => {
                    let _: i64 = self
                        .bounded(
                            redis::cmd("HSETNX")
                                .arg(keys::libraries())
                                .arg(name)
                                .arg(now)
                                .query_async(&mut c),
                        )
                        .await?;
                }
                Some(at) if now.saturating_sub(at) > grace.as_millis() as u64 => {
                    let mut delete = redis::cmd("FUNCTION");
                    delete.arg("DELETE").arg(name);
                    // A master that lacks it answers an error; the others delete it.
                    let _ = self.bounded(c.on_every_master(&delete)).await?;
                    let _: i64 = self
                        .bounded(
                            redis::cmd("HDEL")
                                .arg(keys::libraries())
                                .arg(name)
                                .query_async(&mut c),
                        )
                        .await?;
                    tracing::info!(library = %name, "deleted the Lua library of a build no longer running");
                    deleted.push(name.clone());
                }
                Some(_) => {}
            }
        }
        Ok(deleted)
    }

    /// Redis's clock, ms (the one clock every process of every build shares).
    async fn redis_ms(&self) -> Result<u64, StoreError> {
        let mut c = self.conn();
        let (s, us): (u64, u64) = self.bounded(redis::cmd("TIME").query_async(&mut c)).await?;
        Ok(s * 1000 + us / 1000)
    }
}

/// The library names in one master's `FUNCTION LIST` answer.
fn library_names(answer: &Value) -> Vec<String> {
    let Value::Array(libraries) = answer else {
        return Vec::new();
    };
    libraries
        .iter()
        .filter_map(|lib| {
            let fields: Vec<&Value> = match lib {
                Value::Array(f) => f.iter().collect(),
                Value::Map(pairs) => pairs.iter().flat_map(|(k, v)| [k, v]).collect(),
                _ => return None,
            };
            fields.windows(2).find_map(|w| match (w[0], w[1]) {
                (Value::BulkString(k), Value::BulkString(v)) if k == b"library_name" => {
                    String::from_utf8(v.clone()).ok()
                }
                _ => None,
            })
        })
        .collect()
}

/// Whether a `FUNCTION LIST` answer lists the library `name` itself.
pub(super) fn lists_library(answer: &Value, name: &str) -> bool {
    library_names(answer).iter().any(|n| n == name)
}
