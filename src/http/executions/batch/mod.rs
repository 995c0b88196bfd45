//! What a batch admission (`POST /api/executions/batch`) holds, and for how long: its body,
//! read and parsed item by item as it arrives (here, with `scan.rs` cutting it into items)
//! within the server-wide memory budget (`budget.rs`); the tenant's one-batch mark, given
//! back on every way out of the handler (`mark.rs`); and its answer, written out result by
//! result (`answer.rs`). The handler itself (the order of the steps, the admission calls and
//! their results) is `create_batch` in the parent module.
//!
//! Memory, per batch: the admission requests of its items (their params as canonical JSON
//! text, which the answer's executions share) plus about [`ITEM_ALLOWANCE`] per item, and
//! while reading, the item being read and the piece of body the connection handed over. No
//! tree of the whole document exists, nor of an item's params, and the raw body is never held
//! whole.
//!
//! Time: the body is read on the request's task and scanned, [`SLICE_BYTES`] at a time, on
//! the one parsing thread of the process (`parser.rs`), which runs below the runtime's
//! priority: a 16 MiB body takes no runtime thread's time but the reading, and the cores go
//! to other requests and to Redis first. Chosen over scanning on the runtime with a yield per
//! slice (the operating system still shared the cores at its own time slices: another
//! tenant's admission p99 was 6–10 ms beside four bodies) and over a blocking thread per batch
//! (as many threads as batches, at the runtime's priority).

mod answer;
mod budget;
mod mark;
mod parser;
pub mod scan;

pub use answer::answer;
pub use budget::{BatchBudget, ITEM_ALLOWANCE, Reservation, worst_case};
pub use mark::BatchMark;

use std::convert::Infallible;
use std::sync::Arc;

use axum::body::{Body, Bytes};
use axum::extract::{FromRequest, Request};
use axum::http::{StatusCode, header};
use http_body_util::BodyExt;

use super::wire::NewExecution;
use super::{MAX_BATCH, params_within};
use crate::domain::AdmitRequest;
use crate::http::error::ApiError;
use budget::budget_full;
use scan::{Item, ItemScanner, ScanError};

/// The most body bytes scanned before the request's task yields to the runtime.
pub const SLICE_BYTES: usize = 32 * 1024;

/// The most one item's JSON may take (whitespace between tokens not counted) to be parsed:
/// four times `--max-params-bytes` (every character of params escaped as `\uXXXX` by a
/// client that escapes all non-ASCII still fits) plus room for the other fields. A larger item
/// could not have params within the limit in any usual writing, and parsing it would build a
/// tree many times its size: it is answered `params_too_large` unread.
pub fn item_limit(max_params_bytes: usize) -> usize {
    max_params_bytes.saturating_mul(4).saturating_add(64 * 1024)
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
            let mut at = 0;
            while at < data.len() {
                let slice = data.slice(at..data.len().min(at + SLICE_BYTES));
                at += slice.len();
                let scanned = parser::run(move || {
                    let scanned = reader.scan(&slice);
                    (reader, scanned)
                })
                .await;
                let Some((back, scanned)) = scanned else {
                    return Err(ApiError::Internal(
                        "the batch parsing thread failed on this body".into(),
                    ));
                };
                reader = back;
                scanned?;
                // Params in exponent notation may take more once canonical (`1e15` is
                // `1000000000000000.0`): what the items keep is counted, not assumed.
                if reader.kept > self.reservation.bytes() {
                    self.hold(reader.kept)?;
                }
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
