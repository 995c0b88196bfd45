//! Serving HTTP connections, bounded: the accept loop, the cap on open connections and the
//! per-connection watchdog. Whatever a client does with a TCP connection, the server holds it
//! only for a bounded time and only while there is room.
//!
//! - **Cap.** At most `max_connections` connections are open per listener; one accepted beyond
//!   that is answered with a fixed `503` problem document (best effort: written without reading
//!   the request) and closed at once, so the connections already served are not disturbed and
//!   the process stays clear of its open-file limit.
//! - **Waiting for a request.** A connection with no request in flight must deliver the next
//!   request's headers within `header_read_timeout`: counted from the accept (so a client that
//!   sends nothing at all, or only the HTTP/2 preface, is closed too) and from the last byte of
//!   its previous answer that went out (keep-alive idle; an answer still being written to a
//!   slow reader keeps the connection busy as long as bytes move). HTTP/1 and HTTP/2 alike;
//!   HTTP/2 gets a GOAWAY first.
//! - **Stalled peers.** A connection with a request in flight that moves no byte in either
//!   direction for `request_timeout + header_read_timeout` is closed: the handler is bounded by
//!   `request_timeout`, so that silence means the client stopped reading its answer. A long
//!   poll, bounded by its own wait on top, says so through the `ConnectionHandle` in its
//!   request's extensions, and the silence is counted from the end of its allowance.
//!
//! Hyper's own HTTP/1 header-read timeout stays on as well (it also bounds headers trickled in
//! after the first byte); the watchdog is what covers HTTP/2 and the time before the first
//! byte, which hyper's auto-detecting builder does not time.

use std::convert::Infallible;
use std::io;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::http::metrics::Metrics;
use crate::http::{ConnectionControl, ConnectionHandle};

/// Bounds on the connections of one listener.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Connections open at once; more are refused.
    pub max_connections: usize,
    /// How long a connection may wait to deliver a request's headers (see the module docs).
    pub header_read_timeout: Duration,
    /// The bound on handling one request (for the stalled-peer rule).
    pub request_timeout: Duration,
}

/// After a connection was asked to shut down (GOAWAY), how long it may take to close by itself
/// before it is dropped, once nothing is in flight on it.
const CLOSE_GRACE: Duration = Duration::from_secs(1);

/// What the accept loop answers beyond the cap, written once without reading the request.
const REFUSAL: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\n\
content-type: application/problem+json\r\n\
retry-after: 1\r\n\
connection: close\r\n\
content-length: 193\r\n\
\r\n\
{\"type\":\"urn:sluice:problem:too_many_connections\",\"title\":\"Service Unavailable\",\"status\":503,\"detail\":\"the server has no room for another connection; retry later\",\"code\":\"too_many_connections\"}";

/// Serves `router` on `listener` until `stop` is cancelled, then lets open connections finish
/// their requests for up to `grace` (they are asked to close: HTTP/1 after the current answer,
/// HTTP/2 with a GOAWAY).
pub async fn serve(
    listener: TcpListener,
    router: axum::Router,
    limits: ConnectionLimits,
    metrics: Arc<Metrics>,
    stop: CancellationToken,
    grace: Duration,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    builder
        .http1()
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_read_timeout);
    builder.http2().timer(TokioTimer::new());
    let builder = Arc::new(builder);
    let max = limits.max_connections.max(1);
    let slots = Arc::new(Semaphore::new(max));
    loop {
        let stream = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                Err(e) => {
                    // Out of file descriptors and the like: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
            () = stop.cancelled() => break,
        };
        let Ok(slot) = slots.clone().try_acquire_owned() else {
            metrics.connection_refused();
            tracing::debug!(max, "connection refused: at the connection cap");
            refuse(stream);
            continue;
        };
        let _ = stream.set_nodelay(true);
        let builder = builder.clone();
        let router = router.clone();
        let stop = stop.clone();
        let metrics = metrics.clone();
        metrics.connection_opened();
        tokio::spawn(async move {
            serve_connection(&builder, stream, router, limits, stop).await;
            metrics.connection_closed();
            drop(slot);
        });
    }
    drop(listener);
    // Every open connection holds a slot: all of them back means all connections are closed.
    let all = u32::try_from(max).unwrap_or(u32::MAX);
    if tokio::time::timeout(grace, slots.acquire_many(all))
        .await
        .is_err()
    {
        tracing::warn!("connections still open after {grace:?}; closing them");
    }
}

/// Answers a connection beyond the cap and closes it. Best effort and never waiting: the
/// kernel's send buffer of a fresh connection takes the few bytes at once.
fn refuse(stream: TcpStream) {
    let _ = stream.try_write(REFUSAL);
    tokio::spawn(async move {
        let mut stream = stream;
        // A FIN after the answer rather than a reset, when the client is quick to read it.
        let _ = tokio::time::timeout(Duration::from_millis(100), stream.shutdown()).await;
    });
}

/// Serves one connection under the watchdog (see the module docs).
async fn serve_connection<S>(
    builder: &auto::Builder<TokioExecutor>,
    stream: S,
    router: axum::Router,
    limits: ConnectionLimits,
    stop: CancellationToken,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new());
    let io = TokioIo::new(Watched {
        inner: stream,
        activity: activity.clone(),
    });
    let tracked = activity.clone();
    let handle = ConnectionHandle::new(activity.clone());
    // A request counts as in flight from its headers until its answer's body is handed over
    // (or dropped); hyper may still be writing it then, which `last_write` follows.
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        let guard = tracked.begin();
        req.extensions_mut().insert(handle.clone());
        let router = router.clone();
        async move {
            let res = router.oneshot(req).await?;
            Ok::<_, Infallible>(res.map(|body| {
                Body::new(body.map_frame(move |frame| {
                    let _ = &guard;
                    frame
                }))
            }))
        }
    });
    let conn = builder.serve_connection(io, service);
    tokio::pin!(conn);
    let stalled_after = limits.request_timeout + limits.header_read_timeout;
    // Phase 1: serve until the connection ends, idles out, stalls or the server stops.
    let mut check = activity.idle_deadline(limits.header_read_timeout);
    let reason = loop {
        tokio::select! {
            res = conn.as_mut() => {
                if let Err(e) = res {
                    // A client hanging up or timing out is routine, not an error of the server.
                    tracing::debug!(error = %e, "connection ended with an error");
                }
                return;
            }
            () = stop.cancelled() => break "server stopping",
            () = tokio::time::sleep_until(check.into()) => {
                let now = Instant::now();
                if activity.in_flight() == 0 {
                    let deadline = activity.idle_deadline(limits.header_read_timeout);
                    if deadline <= now {
                        break "idle";
                    }
                    check = deadline;
                } else {
                    let deadline = activity.last_io_or_allowance() + stalled_after;
                    if deadline <= now {
                        break "stalled";
                    }
                    check = deadline.min(now + limits.header_read_timeout);
                }
            }
        }
    };
    tracing::debug!(reason, "closing connection");
    conn.as_mut().graceful_shutdown();
    // Phase 2: let requests in flight finish and answers be written; drop the connection once
    // nothing is in flight and nothing was written for the grace (an HTTP/2 peer ignoring the
    // GOAWAY, or a reader that stopped reading).
    let asked = Instant::now();
    let hard_limit = asked + stalled_after.max(Duration::from_secs(30));
    loop {
        let next = (Instant::now() + Duration::from_millis(100)).min(hard_limit);
        tokio::select! {
            _ = conn.as_mut() => return,
            () = tokio::time::sleep_until(next.into()) => {
                let now = Instant::now();
                let quiet = activity.in_flight() == 0
                    && now >= asked.max(activity.last_write()) + CLOSE_GRACE;
                let stalled = activity.last_io_or_allowance() + stalled_after <= now;
                if quiet || stalled || now >= hard_limit {
                    return;
                }
            }
        }
    }
}

/// What the watchdog knows of one connection: requests in flight, and when it last became
/// idle, moved a byte, or wrote one (milliseconds since it was accepted).
struct Activity {
    started: Instant,
    in_flight: AtomicUsize,
    idle_since_ms: AtomicU64,
    last_io_ms: AtomicU64,
    last_write_ms: AtomicU64,
    /// Until when the requests in flight may be silent (a long poll's allowance), reset when
    /// none is in flight any more.
    quiet_until_ms: AtomicU64,
}

impl Activity {
    fn new() -> Self {
        Self {
            started: Instant::now(),
            in_flight: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(0),
            last_io_ms: AtomicU64::new(0),
            last_write_ms: AtomicU64::new(0),
            quiet_until_ms: AtomicU64::new(0),
        }
    }

    fn elapsed_ms(&self) -> u64 {
        u64::try_from(self.started.elapsed().as_millis()).unwrap_or(u64::MAX)
    }

    fn at(&self, ms: u64) -> Instant {
        self.started + Duration::from_millis(ms)
    }

    /// A request started; the guard ends it.
    fn begin(self: &Arc<Self>) -> InFlight {
        self.in_flight.fetch_add(1, Ordering::AcqRel);
        InFlight(self.clone())
    }

    fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::Acquire)
    }

    /// When the connection will have waited `timeout` for a request, counting from when it
    /// last became idle or, later, last wrote a byte of an answer.
    fn idle_deadline(&self, timeout: Duration) -> Instant {
        let idle = self.idle_since_ms.load(Ordering::Acquire);
        let wrote = self.last_write_ms.load(Ordering::Relaxed);
        self.at(idle.max(wrote)) + timeout
    }

    /// The last byte moved, or the end of a silence allowed, whichever is later: what the
    /// stalled-peer rule counts from.
    fn last_io_or_allowance(&self) -> Instant {
        let io = self.last_io_ms.load(Ordering::Relaxed);
        let quiet = self.quiet_until_ms.load(Ordering::Relaxed);
        self.at(io.max(quiet))
    }

    fn last_write(&self) -> Instant {
        self.at(self.last_write_ms.load(Ordering::Relaxed))
    }

    fn read_some(&self) {
        self.last_io_ms.store(self.elapsed_ms(), Ordering::Relaxed);
    }

    fn wrote_some(&self) {
        let now = self.elapsed_ms();
        self.last_io_ms.store(now, Ordering::Relaxed);
        self.last_write_ms.store(now, Ordering::Relaxed);
    }
}

/// One request in flight on a connection; dropping it ends the request.
struct InFlight(Arc<Activity>);

impl Drop for InFlight {
    fn drop(&mut self) {
        // Set before the count drops, so a watchdog that sees zero sees the new idle start.
        self.0
            .idle_since_ms
            .store(self.0.elapsed_ms(), Ordering::Release);
        if self.0.in_flight.fetch_sub(1, Ordering::AcqRel) == 1 {
            // The allowance was for the requests that were in flight, not for the next ones.
            self.0.quiet_until_ms.store(0, Ordering::Relaxed);
        }
    }
}

impl ConnectionControl for Activity {
    fn allow_silence_until(&self, until: Instant) {
        let ms = u64::try_from(until.saturating_duration_since(self.started).as_millis())
            .unwrap_or(u64::MAX);
        self.quiet_until_ms.fetch_max(ms, Ordering::Relaxed);
    }
}

/// The connection's stream, noting every byte moved for the stalled-peer rule.
struct Watched<S> {
    inner: S,
    activity: Arc<Activity>,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let before = buf.filled().len();
        let res = Pin::new(&mut self.inner).poll_read(cx, buf);
        if matches!(res, Poll::Ready(Ok(()))) && buf.filled().len() > before {
            self.activity.read_some();
        }
        res
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let res = Pin::new(&mut self.inner).poll_write(cx, buf);
        if matches!(res, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.wrote_some();
        }
        res
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let res = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if matches!(res, Poll::Ready(Ok(n)) if n > 0) {
            self.activity.wrote_some();
        }
        res
    }

    fn is_write_vectored(&self) -> bool {
        self.inner.is_write_vectored()
    }

    fn poll_flush(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_flush(cx)
    }

    fn poll_shutdown(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_shutdown(cx)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use tokio::io::AsyncReadExt;

    const BIG: usize = 32 * 1024;

    /// A connection over an in-memory pipe of `pipe` bytes to a router with one 32 KiB answer
    /// (200 ms timeouts); the client half.
    fn connection(pipe: usize) -> tokio::io::DuplexStream {
        let (client, server) = tokio::io::duplex(pipe);
        let router =
            axum::Router::new().route("/big", axum::routing::get(|| async { vec![b'x'; BIG] }));
        let limits = ConnectionLimits {
            max_connections: 1,
            header_read_timeout: Duration::from_millis(200),
            request_timeout: Duration::from_millis(200),
        };
        tokio::spawn(async move {
            let builder = auto::Builder::new(TokioExecutor::new());
            serve_connection(&builder, server, router, limits, CancellationToken::new()).await;
        });
        client
    }

    async fn read_all(client: &mut tokio::io::DuplexStream) -> usize {
        let mut got = Vec::new();
        tokio::time::timeout(Duration::from_secs(10), client.read_to_end(&mut got))
            .await
            .expect("the connection ends")
            .expect("a clean end");
        got.len()
    }

    #[tokio::test]
    async fn a_peer_that_stops_reading_its_answer_is_cut_off() {
        let mut client = connection(1024);
        client
            .write_all(b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n")
            .await
            .unwrap();
        // Not reading: the server's writes stall once the pipe is full.
        tokio::time::sleep(Duration::from_millis(2500)).await;
        let got = read_all(&mut client).await;
        assert!(got < BIG, "the whole answer arrived: {got} bytes");
    }

    /// Reads one answer (headers and a `BIG` body) in 1 KiB reads `pause` apart.
    async fn read_answer(client: &mut tokio::io::DuplexStream, pause: Duration) -> Vec<u8> {
        let mut got = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        loop {
            if let Some(end) = got.windows(4).position(|w| w == b"\r\n\r\n")
                && got.len() >= end + 4 + BIG
            {
                return got;
            }
            let mut buf = [0u8; 1024];
            let n = tokio::time::timeout(Duration::from_secs(5), client.read(&mut buf))
                .await
                .expect("a read")
                .unwrap_or(0);
            assert!(n > 0, "closed after {} bytes", got.len());
            got.extend_from_slice(&buf[..n]);
            assert!(Instant::now() < deadline);
            tokio::time::sleep(pause).await;
        }
    }

    #[tokio::test]
    async fn a_slow_reader_gets_its_whole_answer_and_keeps_its_connection() {
        let mut client = connection(1024);
        let get = b"GET /big HTTP/1.1\r\nHost: x\r\n\r\n";
        client.write_all(get).await.unwrap();
        // 1 KiB every 50 ms: ~1.6 s for the answer, far past the 200 ms timeouts plus the
        // close grace, but bytes keep moving, so it is neither idle nor stalled.
        let first = read_answer(&mut client, Duration::from_millis(50)).await;
        assert!(first.starts_with(b"HTTP/1.1 200"));
        // Still a kept-alive connection: a second request is served on it.
        client.write_all(get).await.unwrap();
        let second = read_answer(&mut client, Duration::ZERO).await;
        assert!(second.starts_with(b"HTTP/1.1 200"));
        // Then, idle, it is closed.
        let mut rest = Vec::new();
        tokio::time::timeout(Duration::from_secs(5), client.read_to_end(&mut rest))
            .await
            .expect("the idle connection is closed")
            .unwrap();
    }

    #[test]
    fn the_refusal_is_a_complete_problem_answer() {
        let text = std::str::from_utf8(REFUSAL).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("content-length: {}", body.len())));
        let problem: serde_json::Value = serde_json::from_str(body).unwrap();
        assert_eq!(problem["code"], "too_many_connections");
        assert_eq!(problem["status"], 503);
    }
}
