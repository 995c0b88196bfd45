//! One delivery attempt: the event's body, signed the Standard Webhooks way, POSTed to the
//! tenant's address (a literal private address refused here, a name by the checked resolver),
//! and what happened, as the delivery log keeps it.

use std::net::IpAddr;
use std::time::Instant;

use super::{Deliverer, check_url, is_private, payload, signature, unix_ms, webhook_id};
use crate::domain::TenantId;
use crate::store::{DeliveryRecord, OutboxEntry};

impl Deliverer {
    /// Sends one event; what happened, as the log keeps it.
    pub(super) async fn send(
        &self,
        tenant: &TenantId,
        url: &str,
        secret: &str,
        e: &OutboxEntry,
        attempt: u32,
    ) -> DeliveryRecord {
        let id = webhook_id(&e.execution_id, e.seq);
        let body = payload(tenant, e);
        let began = Instant::now();
        let result = self.post(url, secret, &id, body).await;
        let (status, error) = match result {
            Ok(s) if (200..300).contains(&s) => (Some(s), None),
            Ok(s) => (Some(s), Some(format!("the receiver answered {s}"))),
            Err(e) => (None, Some(e)),
        };
        DeliveryRecord {
            at_ms: unix_ms(),
            webhook_id: id,
            event_type: format!("execution.{}", e.kind),
            execution_id: e.execution_id.clone(),
            status,
            error,
            duration_ms: began.elapsed().as_millis() as u64,
            attempt,
        }
    }

    /// POSTs one signed body; the status the receiver answered, or why there was none.
    async fn post(&self, url: &str, secret: &str, id: &str, body: Vec<u8>) -> Result<u16, String> {
        let url = check_url(url)?;
        // A literal address is not resolved, so it is checked here.
        if let Some(host) = url.host_str() {
            let literal = host.trim_start_matches('[').trim_end_matches(']');
            if let Ok(ip) = literal.parse::<IpAddr>()
                && !self.config.allow_private
                && is_private(ip)
            {
                return Err(format!(
                    "{ip} is a private address (refused without --webhook-allow-private)"
                ));
            }
        }
        let timestamp = unix_ms() / 1000;
        let signed = signature(secret, id, timestamp, &body)
            .ok_or_else(|| "the stored secret is not valid base64".to_owned())?;
        let res = self
            .http
            .post(url)
            .header("content-type", "application/json")
            .header("webhook-id", id)
            .header("webhook-timestamp", timestamp.to_string())
            .header("webhook-signature", signed)
            .body(body)
            .send()
            .await
            .map_err(|e| error_chain(&e))?;
        Ok(res.status().as_u16())
    }
}

/// An error and its causes, in one line (reqwest's own message hides the cause, e.g. the
/// resolver's refusal).
fn error_chain(e: &dyn std::error::Error) -> String {
    let mut text = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        text.push_str(": ");
        text.push_str(&c.to_string());
        cause = c.source();
    }
    text
}
