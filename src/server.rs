//! Serving HTTP connections, bounded: the accept loop, the cap on open connections and the
//! per-connection watchdog. Whatever a client does with a TCP connection, the server holds it
//! only for a bounded time and only while there is room.
//!
//! - **Cap.** At most `max_connections` connections are open per listener; one accepted beyond
//!   that is answered with a fixed `503` problem document (best effort: written without reading
//!   the request) and closed at once, so the connections already served are not disturbed and
//!   the process stays clear of its open-file limit.
//! - **Per address.** One client address has room for `max_anonymous_per_address`
//!   connections that have not carried an authenticated request yet. A connection leaves that
//!   count with its first request that passes authentication. One accepted while its address
//!   has no room is on probation: its requests must authenticate — one that does not is
//!   answered `503 too_many_connections` and the connection closed — and its first must come
//!   within `PROBATION` (or the header timeout, if shorter). So one address cannot hold
//!   more than that many connections without credentials, while any number of authenticated
//!   clients behind one address (workers behind a NAT, even opening connections in a burst)
//!   fit, bounded by the cap and the per-tenant waiter limits; idle ones are bounded in time
//!   by the rules below.
//! - **Waiting for a request.** A connection with no request in flight must deliver the next
//!   request's headers within `header_read_timeout`: counted from the accept (so a client that
//!   sends nothing at all, or only the HTTP/2 preface, is closed too) and from the last byte of
//!   its previous answer that went out (keep-alive idle; an answer still being written to a
//!   slow reader keeps the connection busy as long as bytes move). Only answer bytes count:
//!   HTTP/2 control frames the server writes (a PING or SETTINGS acknowledgement, a
//!   WINDOW_UPDATE) do not, so a peer that sends PINGs or empty SETTINGS and no request is
//!   closed like a silent one. HTTP/1 and HTTP/2 alike; HTTP/2 gets a GOAWAY first.
//! - **Maximum age.** A connection older than `max_age` is closed once it has no request in
//!   flight: over HTTP/1 its next answer carries `Connection: close`, and an idle one is closed
//!   at once; over HTTP/2 it gets a GOAWAY once its streams are done. A request in flight (a
//!   long poll, an event stream) is never cut by it. So a client that sends a cheap request
//!   every few seconds cannot keep a connection for ever; it reconnects.
//! - **Asked to close.** An answer carrying [`CloseConnection`] in its extensions (a refused
//!   waiter) ends its connection: `Connection: close` over HTTP/1; over HTTP/2 a GOAWAY once
//!   the connection's other streams (long polls, event streams of the same client) are done.
//! - **Stalled peers.** A connection with a request in flight that writes no byte of an answer
//!   for `request_timeout + header_read_timeout` since the request began is closed: the handler
//!   is bounded by `request_timeout`, so that silence means the client stopped reading its
//!   answer (what it sends meanwhile, PINGs included, does not count). A long poll, bounded by
//!   its own wait on top, says so through the `ConnectionHandle` in its request's extensions,
//!   and the silence is counted from the end of its allowance.
//!
//! Hyper's own HTTP/1 header-read timeout stays on as well (it also bounds headers trickled in
//! after the first byte); the watchdog is what covers HTTP/2 and the time before the first
//! byte, which hyper's auto-detecting builder does not time.

use std::collections::HashMap;
use std::convert::Infallible;
use std::io;
use std::net::IpAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use axum::body::Body;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt, ReadBuf};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{Notify, Semaphore};
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::http::error::ApiError;
use crate::http::metrics::Metrics;
use crate::http::{CloseConnection, ConnectionControl, ConnectionHandle};
use axum::http::StatusCode;
use axum::response::IntoResponse;

/// Bounds on the connections of one listener.
#[derive(Debug, Clone, Copy)]
pub struct ConnectionLimits {
    /// Connections open at once; more are refused.
    pub max_connections: usize,
    /// How long a connection may wait to deliver a request's headers (see the module docs).
    pub header_read_timeout: Duration,
    /// The bound on handling one request (for the stalled-peer rule).
    pub request_timeout: Duration,
    /// Age after which a connection is closed once it has no request in flight.
    pub max_age: Duration,
    /// Connections of one client address that have not authenticated a request yet
    /// (0 = no such cap).
    pub max_anonymous_per_address: usize,
}

/// How soon a connection on probation (see [`ConnectionLimits::max_anonymous_per_address`])
/// must deliver its first request, at most.
const PROBATION: Duration = Duration::from_secs(2);

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
    let anonymous = Arc::new(Anonymous::new(limits.max_anonymous_per_address));
    loop {
        let (stream, peer) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(accepted) => accepted,
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
        let unproven = anonymous.admit(peer.ip());
        let _ = stream.set_nodelay(true);
        let builder = builder.clone();
        let router = router.clone();
        let stop = stop.clone();
        let metrics = metrics.clone();
        metrics.connection_opened();
        tokio::spawn(async move {
            serve_connection(&builder, stream, router, limits, stop, unproven).await;
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

/// The connections of each client address that have not authenticated a request yet.
struct Anonymous {
    max: usize,
    by_address: Mutex<HashMap<IpAddr, usize>>,
}

impl Anonymous {
    fn new(max: usize) -> Self {
        Self {
            max,
            by_address: Mutex::new(HashMap::new()),
        }
    }

    /// A new connection of `ip`: counted when its address has room, else on probation.
    fn admit(self: &Arc<Self>, ip: IpAddr) -> Unproven {
        let ip = ip.to_canonical();
        let mut counted = false;
        if self.max > 0 {
            let mut map = self.by_address.lock().unwrap_or_else(|e| e.into_inner());
            let n = map.entry(ip).or_insert(0);
            if *n < self.max {
                *n += 1;
                counted = true;
            }
        }
        Unproven {
            registry: self.clone(),
            ip,
            probation: self.max > 0 && !counted,
        }
    }
}

/// A connection that has not authenticated a request yet: one of its address's
/// `max_anonymous_per_address`, or beyond them on probation. Dropping it (on the first
/// authenticated request, or when the connection ends) frees its place.
struct Unproven {
    registry: Arc<Anonymous>,
    ip: IpAddr,
    /// Beyond the address's cap: its first request must authenticate, and come soon.
    probation: bool,
}

impl Drop for Unproven {
    fn drop(&mut self) {
        if self.registry.max == 0 || self.probation {
            return;
        }
        let mut map = self
            .registry
            .by_address
            .lock()
            .unwrap_or_else(|e| e.into_inner());
        if let Some(n) = map.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                map.remove(&self.ip);
            }
        }
    }
}

/// Serves one connection under the watchdog (see the module docs).
async fn serve_connection<S>(
    builder: &auto::Builder<TokioExecutor>,
    stream: S,
    router: axum::Router,
    limits: ConnectionLimits,
    stop: CancellationToken,
    unproven: Unproven,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new(limits.max_age, unproven));
    let io = TokioIo::new(Watched {
        inner: stream,
        activity: activity.clone(),
        frames: Frames::default(),
    });
    let tracked = activity.clone();
    let handle = ConnectionHandle::new(activity.clone());
    // A request counts as in flight from its headers until its answer's body is handed over
    // (or dropped); hyper may still be writing it then, which `last_write` follows.
    let service = hyper::service::service_fn(move |mut req: hyper::Request<Incoming>| {
        let guard = tracked.begin();
        req.extensions_mut().insert(handle.clone());
        let router = router.clone();
        let http1 = req.version() < hyper::Version::HTTP_2;
        let tracked = tracked.clone();
        async move {
            let mut res = router.oneshot(req).await?;
            if tracked.on_probation() {
                // Beyond its address's unauthenticated connections, and this request did not
                // authenticate: refused, and the connection closed.
                res = ApiError::Busy {
                    status: StatusCode::SERVICE_UNAVAILABLE,
                    code: "too_many_connections",
                    detail: "this address has as many unauthenticated connections open as the \
                             server allows; reuse one, authenticate, or retry later"
                        .into(),
                    retry_after: 1,
                }
                .into_response();
            }
            let asked = res.extensions().get::<CloseConnection>().is_some();
            if http1 && (asked || tracked.too_old()) {
                // hyper closes an HTTP/1 connection after an answer that says so.
                res.headers_mut().insert(
                    hyper::header::CONNECTION,
                    hyper::header::HeaderValue::from_static("close"),
                );
            } else if asked {
                tracked.close_soon();
            }
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
    // A connection on probation must come with its first request sooner.
    let idle_timeout = || {
        if activity.on_probation() {
            limits.header_read_timeout.min(PROBATION)
        } else {
            limits.header_read_timeout
        }
    };
    let mut check = activity.idle_deadline(idle_timeout());
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
            () = activity.close.notified() => {
                // A request may have begun since: then its end wakes this again.
                if activity.in_flight() == 0 {
                    break "retired";
                }
            }
            () = tokio::time::sleep_until(check.into()) => {
                let now = Instant::now();
                if activity.in_flight() == 0 {
                    let deadline = activity.idle_deadline(idle_timeout());
                    if deadline <= now {
                        break "idle";
                    }
                    if activity.to_retire() {
                        break "retired";
                    }
                    check = deadline.min(activity.retire_at());
                } else {
                    let deadline = activity.last_progress_or_allowance() + stalled_after;
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
                let stalled = activity.last_progress_or_allowance() + stalled_after <= now;
                if quiet || stalled || now >= hard_limit {
                    return;
                }
            }
        }
    }
}

/// What the watchdog knows of one connection: requests in flight, and when it last became
/// idle, made progress or wrote a byte of an answer (milliseconds since it was accepted).
struct Activity {
    started: Instant,
    /// Past this age the connection is closed once no request is in flight.
    max_age: Duration,
    in_flight: AtomicUsize,
    idle_since_ms: AtomicU64,
    /// The last answer byte written or request begun: what the stalled-peer rule counts from.
    progress_ms: AtomicU64,
    /// The last answer byte written (control frames excluded): what the idle rule counts from.
    last_write_ms: AtomicU64,
    /// Until when the requests in flight may be silent (a long poll's allowance), reset when
    /// none is in flight any more.
    quiet_until_ms: AtomicU64,
    /// An answer asked to close the connection: it is retired once nothing is in flight.
    retiring: AtomicBool,
    /// Wakes the watchdog when a connection to retire has nothing in flight any more.
    close: Notify,
    /// The connection's place in its address's unauthenticated count, until a request of it
    /// authenticates.
    unproven: Mutex<Option<Unproven>>,
}

impl Activity {
    fn new(max_age: Duration, unproven: Unproven) -> Self {
        Self {
            started: Instant::now(),
            max_age,
            in_flight: AtomicUsize::new(0),
            idle_since_ms: AtomicU64::new(0),
            progress_ms: AtomicU64::new(0),
            last_write_ms: AtomicU64::new(0),
            quiet_until_ms: AtomicU64::new(0),
            retiring: AtomicBool::new(false),
            close: Notify::new(),
            unproven: Mutex::new(Some(unproven)),
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
        self.progress_ms.store(self.elapsed_ms(), Ordering::Relaxed);
        self.in_flight.fetch_add(1, Ordering::SeqCst);
        InFlight(self.clone())
    }

    fn in_flight(&self) -> usize {
        self.in_flight.load(Ordering::SeqCst)
    }

    /// Whether the connection is beyond its address's unauthenticated ones and has not
    /// authenticated a request yet.
    fn on_probation(&self) -> bool {
        self.unproven
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .is_some_and(|u| u.probation)
    }

    /// When the connection reaches its maximum age.
    fn retire_at(&self) -> Instant {
        self.started + self.max_age
    }

    fn too_old(&self) -> bool {
        self.started.elapsed() >= self.max_age
    }

    /// Whether the connection is to be closed as soon as nothing is in flight on it: past its
    /// age, or asked by an answer.
    fn to_retire(&self) -> bool {
        self.retiring.load(Ordering::SeqCst) || self.too_old()
    }

    /// Asks the watchdog to close the connection gracefully (GOAWAY over HTTP/2) once its
    /// other requests, if any, are done (they are not cut: an HTTP/2 client may have long
    /// polls and streams on the same connection).
    fn close_soon(&self) {
        self.retiring.store(true, Ordering::SeqCst);
        if self.in_flight() == 0 {
            self.close.notify_one();
        }
    }

    /// When the connection will have waited `timeout` for a request, counting from when it
    /// last became idle or, later, last wrote a byte of an answer.
    fn idle_deadline(&self, timeout: Duration) -> Instant {
        let idle = self.idle_since_ms.load(Ordering::Acquire);
        let wrote = self.last_write_ms.load(Ordering::Relaxed);
        self.at(idle.max(wrote)) + timeout
    }

    /// The last progress of the requests in flight, or the end of a silence allowed, whichever
    /// is later: what the stalled-peer rule counts from.
    fn last_progress_or_allowance(&self) -> Instant {
        let progress = self.progress_ms.load(Ordering::Relaxed);
        let quiet = self.quiet_until_ms.load(Ordering::Relaxed);
        self.at(progress.max(quiet))
    }

    fn last_write(&self) -> Instant {
        self.at(self.last_write_ms.load(Ordering::Relaxed))
    }

    /// Bytes of an answer went out.
    fn wrote_answer(&self) {
        let now = self.elapsed_ms();
        self.progress_ms.store(now, Ordering::Relaxed);
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
        if self.0.in_flight.fetch_sub(1, Ordering::SeqCst) == 1 {
            // The allowance was for the requests that were in flight, not for the next ones.
            self.0.quiet_until_ms.store(0, Ordering::Relaxed);
            if self.0.to_retire() {
                // Its last request is done: now is the time to retire it.
                self.0.close.notify_one();
            }
        }
    }
}

impl ConnectionControl for Activity {
    fn allow_silence_until(&self, until: Instant) {
        let ms = u64::try_from(until.saturating_duration_since(self.started).as_millis())
            .unwrap_or(u64::MAX);
        self.quiet_until_ms.fetch_max(ms, Ordering::Relaxed);
    }

    fn authenticated(&self) {
        let taken = self
            .unproven
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .take();
        drop(taken);
    }
}

/// Which bytes the server writes belong to answers. Over HTTP/1 all of them; over HTTP/2 those
/// of HEADERS, CONTINUATION and DATA frames on a stream, not control frames (SETTINGS, PING,
/// GOAWAY, WINDOW_UPDATE), which a peer can provoke without asking anything.
#[derive(Debug, Default)]
struct Frames {
    /// `None` until the first byte written tells: an HTTP/1 answer starts with `H`, an HTTP/2
    /// server starts with a SETTINGS frame, whose first byte (of a 24-bit length) is 0.
    http2: Option<bool>,
    /// The frame header being written, and how much of it.
    header: [u8; 9],
    header_len: usize,
    /// Payload bytes of the current frame still to come.
    payload_left: usize,
    /// Whether the current frame is part of an answer.
    answer: bool,
}

impl Frames {
    /// Follows `bytes` (just written); whether any of them belongs to an answer.
    fn written(&mut self, mut bytes: &[u8]) -> bool {
        let Some(&first) = bytes.first() else {
            return false;
        };
        if !*self.http2.get_or_insert(first != b'H') {
            return true;
        }
        let mut answer = false;
        while !bytes.is_empty() {
            if self.payload_left > 0 {
                let n = self.payload_left.min(bytes.len());
                answer |= self.answer;
                self.payload_left -= n;
                bytes = &bytes[n..];
                continue;
            }
            let n = (9 - self.header_len).min(bytes.len());
            self.header[self.header_len..self.header_len + n].copy_from_slice(&bytes[..n]);
            self.header_len += n;
            bytes = &bytes[n..];
            if self.header_len == 9 {
                let h = self.header;
                self.header_len = 0;
                self.payload_left =
                    usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
                let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
                // DATA, HEADERS, CONTINUATION.
                self.answer = stream != 0 && matches!(h[3], 0x0 | 0x1 | 0x9);
                answer |= self.answer;
            }
        }
        answer
    }
}

/// The connection's stream, noting every answer byte written for the idle and stalled-peer
/// rules.
struct Watched<S> {
    inner: S,
    activity: Arc<Activity>,
    frames: Frames,
}

impl<S: AsyncRead + Unpin> AsyncRead for Watched<S> {
    fn poll_read(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.inner).poll_read(cx, buf)
    }
}

impl<S: AsyncWrite + Unpin> Watched<S> {
    fn note(&mut self, written: &[u8]) {
        if self.frames.written(written) {
            self.activity.wrote_answer();
        }
    }
}

impl<S: AsyncWrite + Unpin> AsyncWrite for Watched<S> {
    fn poll_write(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let res = Pin::new(&mut self.inner).poll_write(cx, buf);
        if let Poll::Ready(Ok(n)) = res {
            self.note(&buf[..n]);
        }
        res
    }

    fn poll_write_vectored(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let res = Pin::new(&mut self.inner).poll_write_vectored(cx, bufs);
        if let Poll::Ready(Ok(mut n)) = res {
            for buf in bufs {
                if n == 0 {
                    break;
                }
                let take = n.min(buf.len());
                self.note(&buf[..take]);
                n -= take;
            }
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
            max_age: Duration::from_secs(60),
            max_anonymous_per_address: 0,
        };
        let unproven = Arc::new(Anonymous::new(0)).admit(std::net::Ipv4Addr::LOCALHOST.into());
        tokio::spawn(async move {
            let builder = auto::Builder::new(TokioExecutor::new());
            let stop = CancellationToken::new();
            serve_connection(&builder, server, router, limits, stop, unproven).await;
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

    /// HTTP/2 frames as a server writes them: a SETTINGS frame, a PING acknowledgement, then a
    /// HEADERS frame of stream 1, split at awkward places.
    #[test]
    fn only_answer_frames_count_as_answer_bytes() {
        let settings = [0, 0, 6, 0x4, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 100];
        let ping_ack = [0, 0, 8, 0x6, 0x1, 0, 0, 0, 0, 1, 2, 3, 4, 5, 6, 7, 8];
        let headers = [0, 0, 1, 0x1, 0x4, 0, 0, 0, 1, 0x88];
        let mut frames = Frames::default();
        assert!(!frames.written(&settings));
        assert!(!frames.written(&ping_ack[..5]));
        assert!(!frames.written(&ping_ack[5..]));
        assert!(!frames.written(&[]));
        assert!(!frames.written(&headers[..4]));
        assert!(frames.written(&headers[4..]));
        // A DATA frame's payload written on its own still counts.
        let mut frames = Frames::default();
        assert!(!frames.written(&settings));
        assert!(frames.written(&[0, 0, 4, 0x0, 0, 0, 0, 0, 3]));
        assert!(frames.written(b"body"));
        assert!(!frames.written(&ping_ack));
        // HTTP/1: every byte is an answer's.
        let mut frames = Frames::default();
        assert!(frames.written(b"HTTP/1.1 200 OK\r\n"));
        assert!(frames.written(&[0]));
    }
}
