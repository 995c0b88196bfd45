//! A batch's answer, written result by result as the connection takes it.

use axum::body::{Body, Bytes};
use axum::http::{HeaderValue, header};
use axum::response::Response;

use super::Reservation;
use crate::http::executions::wire::BatchResult;

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
    // Each piece is made on the parsing thread (`parser.rs`), below the runtime's priority:
    // made on the runtime, the connection would take piece after piece while its socket has
    // room (a loopback one takes megabytes), holding a runtime thread while other requests
    // wait for it.
    let stream = futures_util::stream::unfold(Some(pieces), |pieces| async move {
        let mut pieces = pieces?;
        match super::parser::run(move || {
            let piece = pieces.next();
            (pieces, piece)
        })
        .await
        {
            Some((pieces, Some(piece))) => Some((piece, Some(pieces))),
            Some((_, None)) => None,
            None => Some((
                Err(std::io::Error::other("the answer could not be made")),
                None,
            )),
        }
    });
    let mut res = Response::new(Body::from_stream(stream));
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
    type Item = Result<Bytes, std::io::Error>;

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
                return Some(Err(e.into()));
            }
        }
        Some(Ok(Bytes::from(piece)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::http::error::ApiError;
    use crate::http::executions::batch::{BatchBudget, worst_case};
    use crate::http::executions::wire::BatchAnswer;
    use http_body_util::BodyExt;

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
}
