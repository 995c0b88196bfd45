//! The thread batch bodies are parsed on: one per process, below the runtime's priority.
//!
//! Parsing a 16 MiB body takes a core for tens of milliseconds. On the runtime's threads it
//! delays every other request on them by its slices, and the operating system shares the
//! cores between the runtime and Redis at its own time slices whatever the runtime yields: the
//! benchmark's batch-memory phase measured another tenant's admission p99 at 6–10 ms beside
//! four bodies parsed there. On this thread, at `nice` +10, the scheduler gives the runtime's
//! threads and Redis the cores first whenever they have work, and the batches take what is
//! left. One thread: batches queue their slices on it in the order they arrive (a slow client's
//! body holds nothing while it is not sending), and the process never spends more than one
//! core on parsing batches.

use std::sync::OnceLock;
use std::sync::mpsc;

/// A piece of work for the thread.
type Job = Box<dyn FnOnce() + Send>;

/// How much nicer than the process the thread runs (`setpriority`; 10 is the usual "background"
/// step: a thread at +10 gets about a tenth of a core's time against one at 0 that wants it).
/// Counted from the niceness the thread starts with (the process's, when it runs under `nice`),
/// capped at `NICEST`.
const NICENESS: libc::c_int = 10;

/// The nicest level Linux has: a process started at it (`nice -n 19`) has no nicer one to give
/// the thread, which then runs at the process's.
const NICEST: libc::c_int = 19;

fn jobs() -> &'static mpsc::Sender<Job> {
    static JOBS: OnceLock<mpsc::Sender<Job>> = OnceLock::new();
    JOBS.get_or_init(|| {
        let (tx, rx) = mpsc::channel::<Job>();
        std::thread::Builder::new()
            .name("sluice-batch-parse".into())
            .spawn(move || {
                lower_priority();
                // A job that panics loses only its own answer (its caller sees the channel
                // closed); the thread goes on with the next.
                while let Ok(job) = rx.recv() {
                    let _ = std::panic::catch_unwind(std::panic::AssertUnwindSafe(job));
                }
            })
            .expect("the batch parsing thread could not be started");
        tx
    })
}

/// Lowers this thread's scheduling priority by `NICENESS` (at most to `NICEST`); when the
/// system refuses, it runs at the process's and says so once. Libc calls with no safe
/// wrapper in the stack (see
/// `unsafe_code` in Cargo.toml). Elsewhere than Linux, where a thread id names no thread to
/// `setpriority`, the thread runs at the process's priority.
#[cfg(target_os = "linux")]
#[allow(unsafe_code)]
fn lower_priority() {
    // SAFETY: gettid takes nothing and only returns the calling thread's id.
    let tid = unsafe { libc::syscall(libc::SYS_gettid) } as libc::id_t;
    // The niceness this thread inherited from the one that started it. Not an absolute 10:
    // under `nice -n 19` that would raise the thread above the runtime's threads.
    // SAFETY: getpriority only reads its integer arguments; on Linux PRIO_PROCESS with a thread
    // id reads that thread's nice value (it cannot fail for the calling thread, so -1 is a
    // niceness, not an error).
    let own = unsafe { libc::getpriority(libc::PRIO_PROCESS, tid) };
    let nicer = (own + NICENESS).min(NICEST);
    if nicer == own {
        return;
    }
    // SAFETY: setpriority only reads its integer arguments; on Linux PRIO_PROCESS with a
    // thread id sets that thread's nice value alone.
    let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid, nicer) };
    if rc != 0 {
        tracing::warn!(
            error = %std::io::Error::last_os_error(),
            "batch parsing runs at the process's priority"
        );
    }
}

#[cfg(not(target_os = "linux"))]
fn lower_priority() {}

/// Runs `work` on the parsing thread and gives back its result; `None` when it panicked.
pub async fn run<R: Send + 'static>(work: impl FnOnce() -> R + Send + 'static) -> Option<R> {
    let (tx, rx) = tokio::sync::oneshot::channel();
    let job: Job = Box::new(move || {
        let _ = tx.send(work());
    });
    jobs().send(job).ok()?;
    rx.await.ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[cfg(target_os = "linux")]
    #[allow(unsafe_code)]
    #[tokio::test]
    async fn work_runs_on_the_nicer_thread_and_a_panic_loses_only_its_own_answer() {
        let name = run(|| std::thread::current().name().map(str::to_owned)).await;
        assert_eq!(name, Some(Some("sluice-batch-parse".to_owned())));
        // SAFETY: getpriority only reads its arguments; 0 names the calling thread.
        let nice = run(|| unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) }).await;
        let own = unsafe { libc::getpriority(libc::PRIO_PROCESS, 0) };
        // NICENESS nicer than the suite, whatever niceness it runs at; under `nice -n 19` there
        // is no nicer level, and the name above is what shows the work ran on the thread.
        assert_eq!(
            nice,
            Some((own + NICENESS).min(NICEST)),
            "the suite runs at {own}"
        );
        assert_eq!(run(|| -> u8 { panic!("a bad job") }).await, None);
        assert_eq!(run(|| 7).await, Some(7), "the thread goes on after a panic");
    }
}
