//! The committed OpenAPI document is the one the code generates and serves.

use serde_json::Value;

use crate::helpers::TestApp;

#[test]
fn committed_openapi_matches_the_code() {
    let generated = sluice::http::openapi().to_pretty_json().unwrap() + "\n";
    let path = concat!(env!("CARGO_MANIFEST_DIR"), "/openapi/openapi.json");
    if std::env::var_os("UPDATE_OPENAPI").is_some() {
        std::fs::write(path, &generated).unwrap();
    }
    let committed = std::fs::read_to_string(path).unwrap_or_default();
    assert!(
        committed == generated,
        "openapi/openapi.json is stale: run `UPDATE_OPENAPI=1 cargo test committed_openapi` \
         (or `cargo run -- openapi > openapi/openapi.json`) and commit it"
    );
}

#[tokio::test]
async fn the_server_serves_the_same_document() {
    let app = TestApp::spawn().await;
    let served: Value = app
        .client
        .get(app.url("/openapi.json"))
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let generated: Value = serde_json::to_value(sluice::http::openapi()).unwrap();
    assert_eq!(served, generated);
    for path in [
        "/api/executions",
        "/api/executions/{id}",
        "/api/executions/{id}/cancel",
        "/api/tenants/{tenant}",
        "/healthz",
        "/readyz",
    ] {
        assert!(served["paths"].get(path).is_some(), "{path} undocumented");
    }
}
