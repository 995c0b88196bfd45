//! What a batch admission (`POST /api/executions/batch`) holds, and for how long: its body,
//! read and parsed item by item as it arrives within a server-wide memory budget; the
//! tenant's one-batch mark, given back on every way out of the handler; and its answer,
//! written out result by result. The handler itself (the order of the steps, the admission
//! calls and their results) is `create_batch` in the parent module.
//!
//! Memory, per batch: the admission requests of its items (their params as canonical JSON
//! text, which the answer's executions share) plus about [`ITEM_ALLOWANCE`] per item, and
//! while reading, the item being read and the piece of body the connection handed over. No
//! tree of the whole document exists, nor of an item's params, and the raw body is never held
//! whole.
//!
//! Time: the body is scanned on the request's own task, [`SLICE_BYTES`] at a time, and the
//! task yields to the runtime between slices, so a 16 MiB body never holds a runtime thread
//! for more than a slice (and one item's parse): other requests on the thread run in between.
//! Chosen over a blocking thread per batch: on a small machine those threads take the cores
//! from the runtime's (and Redis's) at the operating system's time slices, and a batch's
//! memory would be spread over more threads' allocator heaps.

use std::convert::Infallible;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request};
use axum::http::{HeaderValue, StatusCode, header};
use axum::response::Response;
use http_body_util::BodyExt;

use super::batch_scan::{Item, ItemScanner, ScanError};
use super::wire::{BatchResult, NewExecution};
use super::{MAX_BATCH, params_within};
use crate::domain::{AdmitRequest, ExecutionId, TenantId};
use crate::http::error::ApiError;
use crate::store::Store;

/// Memory one item of a batch holds besides its params, reserved for it: its admission
/// request, the execution (or problem) of its answer, and their strings. Measured at about
/// 0.7 KiB for an item with a dedup key; rounded up.
pub const ITEM_ALLOWANCE: usize = 1024;

/// The most body bytes scanned before the request's task yields to the runtime.
pub const SLICE_BYTES: usize = 32 * 1024;

/// Seconds a client refused for a full budget should wait: batches end within the request
/// bound, most within a second.
const BUDGET_RETRY_AFTER: u64 = 1;

/// The most one item's JSON may take (whitespace between tokens not counted) to be parsed:
/// four times `--max-params-bytes` (every character of params escaped as `\uXXXX` by a
/// client that escapes all non-ASCII still fits) plus room for the other fields. A larger item
/// could not have params within the limit in any usual writing, and parsing it would build a
/// tree many times its size: it is answered `params_too_large` unread.
pub fn item_limit(max_params_bytes: usize) -> usize {
    max_params_bytes.saturating_mul(4).saturating_add(64 * 1024)
}

/// The memory of a batch whose body is `body_bytes` long, at most: the body's bytes (its
/// params, kept as text, are not longer once canonical, bar exponent notation, which is
/// counted as it is met) and [`ITEM_ALLOWANCE`] for every item it could hold (an item takes
/// at least two bytes, `0,`).
pub fn worst_case(body_bytes: usize) -> usize {
    let items = (body_bytes / 2 + 1).min(MAX_BATCH);
    body_bytes.saturating_add(items * ITEM_ALLOWANCE)
}

/// The bytes batch admissions being processed on this server may hold at once
/// (`--batch-memory-limit`): each batch reserves its worst case before its body is read, and
/// one that does not fit is refused with 429 `batch_memory_full` before anything is read or
/// written.
#[derive(Debug)]
pub struct BatchBudget {
    total: usize,
    used: AtomicUsize,
}

impl BatchBudget {
    /// `--batch-memory-limit`, or room for four full batches; a budget that cannot hold one
    /// full batch (a body of `--batch-body-limit` with 1,000 items) is refused.
    pub fn new(limit: Option<usize>, body_limit: usize) -> Result<Arc<Self>, String> {
        let full = worst_case(body_limit);
        let total = limit.unwrap_or_else(|| Self::default_for(body_limit));
        if total < full {
            return Err(format!(
                "--batch-memory-limit ({total}) must hold at least one full batch: \
                 --batch-body-limit ({body_limit}) plus {ITEM_ALLOWANCE} bytes for each of \
                 {MAX_BATCH} items, {full} bytes"
            ));
        }
        Ok(Arc::new(Self {
            total,
            used: AtomicUsize::new(0),
        }))
    }

    /// The default budget for a `--batch-body-limit`: four full batches.
    pub fn default_for(body_limit: usize) -> usize {
        worst_case(body_limit).saturating_mul(4)
    }

    /// The budget, in bytes.
    pub fn total(&self) -> usize {
        self.total
    }

    /// Bytes reserved now.
    pub fn in_use(&self) -> usize {
        self.used.load(Ordering::Relaxed)
    }

    /// Reserves `bytes` if they fit.
    pub fn reserve(self: &Arc<Self>, bytes: usize) -> Option<Reservation> {
        self.take(bytes).then(|| Reservation {
            budget: self.clone(),
            bytes,
        })
    }

    fn take(&self, bytes: usize) -> bool {
        self.used
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |used| {
                used.checked_add(bytes).filter(|&n| n <= self.total)
            })
            .is_ok()
    }
}

/// Bytes of the [`BatchBudget`] one batch holds; given back when dropped (the answer holds
/// it until its last byte is written).
#[derive(Debug)]
pub struct Reservation {
    budget: Arc<BatchBudget>,
    bytes: usize,
}

impl Reservation {
    /// Bytes held.
    pub fn bytes(&self) -> usize {
        self.bytes
    }

    /// Holds `bytes` from now on: more if they fit (false if not, holding what it held), or
    /// fewer.
    pub fn resize(&mut self, bytes: usize) -> bool {
        if bytes > self.bytes {
            if !self.budget.take(bytes - self.bytes) {
                return false;
            }
        } else {
            self.budget
                .used
                .fetch_sub(self.bytes - bytes, Ordering::AcqRel);
        }
        self.bytes = bytes;
        true
    }
}

impl Drop for Reservation {
    fn drop(&mut self) {
        self.budget.used.fetch_sub(self.bytes, Ordering::AcqRel);
    }
}

/// The refusal of a batch the budget has no room for now.
fn budget_full(budget: &BatchBudget, need: usize) -> ApiError {
    ApiError::Busy {
        status: StatusCode::TOO_MANY_REQUESTS,
        code: "batch_memory_full",
        detail: format!(
            "the server is processing other batches: this one needs {need} bytes of its \
             {} for batches; nothing was admitted, send it again shortly",
            budget.total()
        ),
        retry_after: BUDGET_RETRY_AFTER,
    }
}

fn too_large(detail: String) -> ApiError {
    ApiError::Status {
        status: StatusCode::PAYLOAD_TOO_LARGE,
        code: "payload_too_large",
        detail,
    }
}

impl From<ScanError> for ApiError {
    fn from(e: ScanError) -> Self {
        match e {
            ScanError::Malformed(detail) => ApiError::BadRequest {
                code: "malformed_json",
                detail,
            },
            ScanError::Invalid(detail) => ApiError::BadRequest {
                code: "invalid_body",
                detail,
            },
            ScanError::TooManyItems { max } => ApiError::BadRequest {
                code: "invalid_batch",
                detail: format!("a batch holds 1 to {max} items; this one has more"),
            },
        }
    }
}

/// What a batch's items may be, from the server's settings.
#[derive(Debug, Clone, Copy)]
pub struct BatchLimits {
    /// `--batch-body-limit`.
    pub body_limit: usize,
    /// `--max-params-bytes`.
    pub max_params_bytes: usize,
    /// `--default-max-attempts`.
    pub default_max_attempts: u32,
}

/// The body of a batch admission, not yet looked at: the handler checks the caller, the
/// budget and the tenant's mark first ([`BatchBody::start`], then [`PendingBatch::read`]).
pub struct BatchBody {
    req: Request,
}

impl<S: Send + Sync> FromRequest<S> for BatchBody {
    type Rejection = Infallible;

    async fn from_request(req: Request, _: &S) -> Result<Self, Infallible> {
        Ok(Self { req })
    }
}

impl BatchBody {
    /// Checks what the headers say of the body — JSON (else 415), `Content-Length` within
    /// `--batch-body-limit` (else 413) — and reserves its worst case in `budget` (else 429):
    /// all before a byte of it is read. A body without a length reserves as it arrives.
    pub fn start(
        self,
        budget: &Arc<BatchBudget>,
        limits: &BatchLimits,
    ) -> Result<PendingBatch, ApiError> {
        if !crate::http::extract::is_json(self.req.headers()) {
            return Err(ApiError::UnsupportedMediaType(
                "request body must be JSON with Content-Type: application/json".into(),
            ));
        }
        let length = match self.req.headers().get(header::CONTENT_LENGTH) {
            None => None,
            Some(v) => Some(
                v.to_str()
                    .ok()
                    .and_then(|v| v.trim().parse::<u64>().ok())
                    .ok_or_else(|| ApiError::BadRequest {
                        code: "invalid_body",
                        detail: "Content-Length is not a number".into(),
                    })?,
            ),
        };
        let length = match length {
            Some(n) if n > limits.body_limit as u64 => {
                return Err(too_large(format!(
                    "the body takes {n} bytes; --batch-body-limit is {}",
                    limits.body_limit
                )));
            }
            Some(n) => Some(n as usize),
            None => None,
        };
        let need = worst_case(length.unwrap_or(0));
        let reservation = budget
            .reserve(need)
            .ok_or_else(|| budget_full(budget, need))?;
        Ok(PendingBatch {
            body: self.req.into_body(),
            length,
            reservation,
            budget: budget.clone(),
        })
    }
}

/// A batch body admitted into the budget, to be read.
pub struct PendingBatch {
    body: Body,
    length: Option<usize>,
    reservation: Reservation,
    budget: Arc<BatchBudget>,
}

/// A batch body read and parsed: one admission request (or the problem an item alone would
/// have had) per item, in order, and the memory they hold.
pub struct ReadBatch {
    pub items: Vec<Result<AdmitRequest, ApiError>>,
    /// The budget the items (and the answer built from them) hold: give it to [`answer`].
    pub held: Reservation,
}

impl PendingBatch {
    /// Reads the body as it arrives and turns each item into its admission request as soon
    /// as it is complete. Refused as a whole: more than 1,000 items (400 `invalid_batch`, as
    /// the 1,001st begins), none, a body that is not JSON or not `{"items": [...]}` (400),
    /// more than `--batch-body-limit` (413), or, for a body sent without a length, the
    /// budget running out as it arrives (429). An item over [`item_limit`] gets its own 413
    /// `params_too_large` without being parsed.
    pub async fn read(mut self, limits: BatchLimits) -> Result<ReadBatch, ApiError> {
        let mut reader = Reader::new(limits);
        while let Some(data) = next_data(&mut self.body).await? {
            reader.read += data.len();
            if reader.read > limits.body_limit {
                return Err(too_large(format!(
                    "the body takes more than --batch-body-limit ({} bytes)",
                    limits.body_limit
                )));
            }
            if self.length.is_none() {
                self.hold(worst_case(reader.read))?;
            }
            for slice in data.chunks(SLICE_BYTES) {
                reader.scan(slice)?;
                // Params in exponent notation may take more once canonical (`1e15` is
                // `1000000000000000.0`): what the items keep is counted, not assumed.
                if reader.kept > self.reservation.bytes() {
                    self.hold(reader.kept)?;
                }
                tokio::task::yield_now().await;
            }
        }
        reader.scanner.finish()?;
        if reader.items.is_empty() {
            return Err(ApiError::BadRequest {
                code: "invalid_batch",
                detail: format!("a batch holds 1 to {MAX_BATCH} items, not 0"),
            });
        }
        // From here the batch holds what its items keep, not what its body could have.
        self.reservation.resize(reader.kept);
        Ok(ReadBatch {
            items: reader.items,
            held: self.reservation,
        })
    }

    /// Grows the reservation to `bytes`: 413 beyond a full batch, 429 when the budget has no
    /// room now.
    fn hold(&mut self, bytes: usize) -> Result<(), ApiError> {
        if bytes <= self.reservation.bytes() {
            return Ok(());
        }
        if bytes > self.budget.total() {
            return Err(too_large(format!(
                "the batch's items take {bytes} bytes once parsed, more than a batch may hold"
            )));
        }
        if self.reservation.resize(bytes) {
            Ok(())
        } else {
            Err(budget_full(&self.budget, bytes))
        }
    }
}

/// The next piece of the body's data (trailers skipped); `None` at its end.
async fn next_data(body: &mut Body) -> Result<Option<Bytes>, ApiError> {
    loop {
        match body.frame().await {
            None => return Ok(None),
            Some(Err(e)) => {
                return Err(ApiError::BadRequest {
                    code: "invalid_body",
                    detail: format!("the request body could not be read: {e}"),
                });
            }
            Some(Ok(frame)) => {
                if let Ok(data) = frame.into_data() {
                    return Ok(Some(data));
                }
            }
        }
    }
}

/// The state of one body's reading.
struct Reader {
    scanner: ItemScanner,
    items: Vec<Result<AdmitRequest, ApiError>>,
    limits: BatchLimits,
    /// Raw bytes read.
    read: usize,
    /// Bytes the items keep: their params and [`ITEM_ALLOWANCE`] each.
    kept: usize,
}

impl Reader {
    fn new(limits: BatchLimits) -> Self {
        Self {
            scanner: ItemScanner::new(MAX_BATCH, item_limit(limits.max_params_bytes)),
            items: Vec::new(),
            limits,
            read: 0,
            kept: 0,
        }
    }

    fn scan(&mut self, data: &[u8]) -> Result<(), ApiError> {
        let Self {
            scanner,
            items,
            limits,
            kept,
            ..
        } = self;
        let mut on_item = |item: Item<'_>| -> Result<(), ApiError> {
            let request = match item {
                Item::Json(json) => item_request(json, items.len(), limits)?,
                Item::TooLarge { bytes } => Err(ApiError::Status {
                    status: StatusCode::PAYLOAD_TOO_LARGE,
                    code: "params_too_large",
                    detail: format!(
                        "the item takes {bytes} bytes of JSON; its params could not be within \
                         {} bytes as canonical JSON, so it was not parsed",
                        limits.max_params_bytes
                    ),
                }),
            };
            *kept += ITEM_ALLOWANCE + request.as_ref().map_or(0, |r| r.params.len());
            items.push(request);
            Ok(())
        };
        scanner.feed(data, &mut on_item)
    }
}

/// One item, as the body of a single admission is checked: its own problem when it is not
/// valid (`Ok(Err(..))`), or an error of the whole body when it is not even JSON.
fn item_request(
    json: &[u8],
    index: usize,
    limits: &BatchLimits,
) -> Result<Result<AdmitRequest, ApiError>, ApiError> {
    if json.first() != Some(&b'{') {
        return Ok(Err(ApiError::BadRequest {
            code: "invalid_body",
            detail: "each item must be a JSON object".into(),
        }));
    }
    let body: NewExecution = match serde_json::from_slice(json) {
        Ok(body) => body,
        Err(e) if e.classify() == serde_json::error::Category::Data => {
            return Ok(Err(ApiError::BadRequest {
                code: "invalid_body",
                detail: e.to_string(),
            }));
        }
        // What the scanner lets through and serde_json does not (a lone surrogate, a number
        // out of range, invalid UTF-8) makes the body malformed, as a parse of it whole would.
        Err(e) => {
            return Err(ApiError::BadRequest {
                code: "malformed_json",
                detail: format!("malformed JSON in item {index}: {e}"),
            });
        }
    };
    Ok(
        AdmitRequest::parse(body.into(), None, limits.default_max_attempts)
            .map_err(ApiError::from)
            .and_then(|req| params_within(req, limits.max_params_bytes)),
    )
}

/// The tenant's right to run its one batch admission (the `batch` mark on Redis, with the
/// request's bound as its TTL). Give it back with [`BatchMark::release`]; dropped without
/// that (the request bound cut the handler, the client went away, a panic), it is given back
/// by a task of its own.
pub struct BatchMark {
    store: Arc<Store>,
    tenant: TenantId,
    holder: String,
    held: bool,
}

impl BatchMark {
    /// Takes the mark for at most `ttl`: 409 `batch_in_flight` when another batch of the
    /// tenant holds it. A failed call answers 503, and gives back the mark in case Redis took
    /// it all the same.
    pub async fn take(
        store: &Arc<Store>,
        tenant: &TenantId,
        ttl: Duration,
    ) -> Result<Self, ApiError> {
        let mark = Self {
            store: store.clone(),
            tenant: tenant.clone(),
            holder: ExecutionId::new().to_string(),
            held: true,
        };
        match store.hold_batch(tenant, &mark.holder, ttl).await {
            Ok(true) => Ok(mark),
            Ok(false) => {
                let mut mark = mark;
                mark.held = false;
                Err(ApiError::Status {
                    status: StatusCode::CONFLICT,
                    code: "batch_in_flight",
                    detail:
                        "another batch of this tenant is being admitted; send this one after it"
                            .into(),
                })
            }
            // `mark` is dropped here, which gives it back if the SET ran.
            Err(e) => Err(e.into()),
        }
    }

    /// Gives the mark back, before the answer (so the tenant's next batch is not refused).
    pub async fn release(mut self) {
        self.held = false;
        if let Err(e) = self.store.release_batch(&self.tenant, &self.holder).await {
            // It lapses on its own at the end of the request's bound.
            tracing::warn!(tenant = %self.tenant, error = %e, "batch mark not given back");
        }
    }
}

impl Drop for BatchMark {
    fn drop(&mut self) {
        if !self.held {
            return;
        }
        let Ok(runtime) = tokio::runtime::Handle::try_current() else {
            return;
        };
        let (store, tenant, holder) = (
            self.store.clone(),
            self.tenant.clone(),
            std::mem::take(&mut self.holder),
        );
        runtime.spawn(async move {
            if let Err(e) = store.release_batch(&tenant, &holder).await {
                tracing::warn!(%tenant, error = %e, "batch mark not given back");
            }
        });
    }
}

/// The answer's bytes are made in pieces of about this size as the connection takes them
/// (small enough for the allocator's medium size classes, which it reuses best).
const ANSWER_PIECE: usize = 32 * 1024;

/// The answer of a batch, `{"results": [...]}` exactly as `BatchAnswer` serializes, written
/// result by result as the connection takes it: each result is dropped once written, and
/// `held` (the batch's reservation) is given back as the last piece is made, before the
/// client can have it. So the answer never exists whole beside the results it is made of.
pub fn answer(results: Vec<BatchResult>, held: Reservation) -> Response {
    let pieces = AnswerPieces {
        results: results.into_iter(),
        opened: false,
        held: Some(held),
    };
    let mut res = Response::new(Body::from_stream(futures_util::stream::iter(pieces)));
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    res
}

struct AnswerPieces {
    results: std::vec::IntoIter<BatchResult>,
    opened: bool,
    /// The batch's reservation, until the last piece is made (`None`: the answer is done).
    held: Option<Reservation>,
}

impl Iterator for AnswerPieces {
    type Item = Result<Bytes, serde_json::Error>;

    fn next(&mut self) -> Option<Self::Item> {
        self.held.as_ref()?;
        // Room for the result that ends the piece without growing it, unless it is large.
        let mut piece = Vec::with_capacity(ANSWER_PIECE + ANSWER_PIECE / 2);
        if !self.opened {
            piece.extend_from_slice(b"{\"results\":[");
        }
        while piece.len() < ANSWER_PIECE {
            let Some(result) = self.results.next() else {
                piece.extend_from_slice(b"]}");
                self.held = None;
                break;
            };
            if self.opened {
                piece.push(b',');
            }
            self.opened = true;
            if let Err(e) = serde_json::to_writer(&mut piece, &result) {
                self.held = None;
                return Some(Err(e));
            }
        }
        Some(Ok(Bytes::from(piece)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::executions::wire::BatchAnswer;

    fn results(n: usize) -> Vec<BatchResult> {
        (0..n)
            .map(|i| BatchResult {
                status: 400,
                execution: None,
                problem: Some(
                    ApiError::BadRequest {
                        code: "invalid_body",
                        detail: format!("item {i}: {}", "x".repeat(i % 3 * 20_000)),
                    }
                    .problem(),
                ),
            })
            .collect()
    }

    #[tokio::test]
    async fn the_written_answer_is_the_batch_answer_and_gives_its_budget_back_at_its_end() {
        for n in [1, 2, 7, 40] {
            let budget = BatchBudget::new(Some(worst_case(1 << 20)), 1 << 20).unwrap();
            let held = budget.reserve(1000).unwrap();
            let res = answer(results(n), held);
            assert_eq!(res.headers()[header::CONTENT_TYPE], "application/json");
            assert_eq!(budget.in_use(), 1000, "held while the answer is written");
            let mut body = res.into_body();
            let mut bytes = Vec::new();
            while let Some(frame) = body.frame().await {
                // Given back as the last piece is made, before anyone can read it.
                let last = budget.in_use() == 0;
                bytes.extend_from_slice(&frame.unwrap().into_data().unwrap());
                if last {
                    assert!(bytes.ends_with(b"]}"), "given back before the last piece");
                }
            }
            let whole = serde_json::to_vec(&BatchAnswer {
                results: results(n),
            })
            .unwrap();
            assert_eq!(bytes, whole, "{n} results");
            assert_eq!(budget.in_use(), 0, "given back with the last byte");
        }
    }

    #[test]
    fn the_budget_holds_what_is_reserved_and_no_more() {
        assert!(BatchBudget::new(Some(worst_case(100) - 1), 100).is_err());
        let budget = BatchBudget::new(None, 100).unwrap();
        assert_eq!(budget.total(), 4 * (100 + 51 * ITEM_ALLOWANCE));
        let mut a = budget.reserve(budget.total() - 10).unwrap();
        assert!(budget.reserve(11).is_none());
        let b = budget.reserve(10).unwrap();
        assert!(!a.resize(a.bytes() + 1), "no room to grow");
        assert_eq!(budget.in_use(), budget.total());
        assert!(a.resize(5));
        assert_eq!(budget.in_use(), 15);
        drop(b);
        drop(a);
        assert_eq!(budget.in_use(), 0);
        // A full batch's worst case: the body and a thousand items.
        assert_eq!(
            worst_case(16 << 20),
            (16 << 20) + MAX_BATCH * ITEM_ALLOWANCE
        );
    }
}
