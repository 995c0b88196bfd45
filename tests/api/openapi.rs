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
        "/api/tenants",
        "/api/tenants/{tenant}",
        "/api/tenants/{tenant}/api-keys",
        "/api/tenants/{tenant}/api-keys/{key_id}",
        "/healthz",
        "/readyz",
        "/metrics",
    ] {
        assert!(served["paths"].get(path).is_some(), "{path} undocumented");
    }
}

/// Every error answer of every operation is documented as a problem+json document, and every
/// `/api` operation names the bearer scheme.
#[test]
fn every_error_is_a_documented_problem_and_every_api_call_is_secured() {
    let spec = serde_json::to_value(sluice::http::openapi()).unwrap();
    assert_eq!(
        spec["components"]["securitySchemes"]["bearer"]["scheme"],
        "bearer"
    );
    for (path, ops) in spec["paths"].as_object().unwrap() {
        for (method, op) in ops.as_object().unwrap() {
            if method == "parameters" {
                continue;
            }
            let responses = op["responses"].as_object().unwrap();
            for (status, res) in responses {
                if status.starts_with('4') || status.starts_with('5') {
                    let schema = &res["content"]["application/problem+json"]["schema"]["$ref"];
                    assert_eq!(
                        schema, "#/components/schemas/Problem",
                        "{method} {path} {status}"
                    );
                }
            }
            if path.starts_with("/api/") {
                assert!(op.get("security").is_some(), "{method} {path} unsecured");
                assert!(responses.contains_key("401"), "{method} {path} lacks 401");
                assert!(responses.contains_key("503"), "{method} {path} lacks 503");
            }
        }
    }
}
