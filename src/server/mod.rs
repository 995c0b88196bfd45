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
//!   fit, bounded by the cap, the shares below and the per-tenant waiter limits; idle ones
//!   are bounded in time by the rules below.
//! - **Per credential.** A connection is counted against the credential of its first request
//!   that authenticates — an API key and the key's tenant, or under dev auth the tenant named —
//!   until it closes; one key holds at most `max_connections_per_key`, one tenant's keys
//!   together at most `max_connections_per_tenant` (`shares`). A request whose credential
//!   would go past a share is answered `429` (`key_too_many_connections`,
//!   `tenant_too_many_connections`) by the `Caller` extractor before its handler runs, and
//!   the connection closed. A later request on a counted connection is served whatever its
//!   credential (a proxy's pooled connection carries many clients) and counted nowhere else.
//!   The platform admin token counts against no share: it is the operator's own and acts for
//!   every tenant over one pool. So one key, or one tenant, cannot hold every connection by
//!   keeping a cheap request going on each; the others keep their room.
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

mod activity;
mod anonymous;
mod shares;
mod watched;

use std::convert::Infallible;
use std::sync::Arc;
use std::time::{Duration, Instant};

use axum::body::Body;
use axum::http::StatusCode;
use axum::response::IntoResponse;
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use tokio::io::{AsyncRead, AsyncWrite, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tower::ServiceExt;

use crate::http::error::ApiError;
use crate::http::metrics::Metrics;
use crate::http::{App, CloseConnection, ConnectionHandle};
use activity::Activity;
use anonymous::{Anonymous, Unproven};
use shares::Shares;
use watched::{Frames, Watched};

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
    /// Connections counted against one API key (0 = no such share; see the module docs).
    pub max_per_key: usize,
    /// Connections counted against one tenant's credentials together (0 = no such share).
    pub max_per_tenant: usize,
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
    router: App,
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
    let shares = Arc::new(Shares::new(
        limits.max_per_key,
        limits.max_per_tenant,
        metrics.clone(),
    ));
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
        let shares = shares.clone();
        metrics.connection_opened();
        tokio::spawn(async move {
            serve_connection(&builder, stream, router, limits, stop, unproven, shares).await;
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
    router: App,
    limits: ConnectionLimits,
    stop: CancellationToken,
    unproven: Unproven,
    shares: Arc<Shares>,
) where
    S: AsyncRead + AsyncWrite + Unpin + Send + 'static,
{
    let activity = Arc::new(Activity::new(limits.max_age, unproven, shares));
    // Whichever way this returns, the connection's places (its address's, its credential's)
    // are given back as it ends.
    let _ended = Ended(activity.clone());
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
            let mut res = router.oneshot(req.map(Body::new)).await?;
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

/// Tells the connection's [`Activity`] that it ended, when dropped.
struct Ended(Arc<Activity>);

impl Drop for Ended {
    fn drop(&mut self) {
        self.0.ended();
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
        let router = App::new(
            axum::Router::new().route("/big", axum::routing::get(|| async { vec![b'x'; BIG] })),
        );
        let limits = ConnectionLimits {
            max_connections: 1,
            header_read_timeout: Duration::from_millis(200),
            request_timeout: Duration::from_millis(200),
            max_age: Duration::from_secs(60),
            max_anonymous_per_address: 0,
            max_per_key: 0,
            max_per_tenant: 0,
        };
        let unproven = Arc::new(Anonymous::new(0)).admit(std::net::Ipv4Addr::LOCALHOST.into());
        let shares = Arc::new(Shares::new(0, 0, Arc::new(Metrics::new(10))));
        tokio::spawn(async move {
            let builder = auto::Builder::new(TokioExecutor::new());
            let stop = CancellationToken::new();
            serve_connection(&builder, server, router, limits, stop, unproven, shares).await;
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
