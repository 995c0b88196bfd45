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

/// Every schema in `v`, recursively (properties, items, parameters' schemas, ...).
fn schemas<'a>(v: &'a Value, out: &mut Vec<&'a Value>) {
    match v {
        Value::Object(map) => {
            if map.contains_key("type") {
                out.push(v);
            }
            for child in map.values() {
                schemas(child, out);
            }
        }
        Value::Array(items) => items.iter().for_each(|i| schemas(i, out)),
        _ => {}
    }
}

fn types(schema: &Value) -> Vec<&str> {
    match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec![],
    }
}

/// The document says what the server enforces: every header the API reads is a parameter,
/// every answer the shared machinery can give is a response, every id and paging parameter has
/// its pattern or bounds, and integer formats hold the values the code allows.
#[test]
fn the_document_is_as_strict_as_the_server() {
    let spec = serde_json::to_value(sluice::http::openapi()).unwrap();
    let mut problems = Vec::new();
    for (path, item) in spec["paths"].as_object().unwrap() {
        let shared: Vec<&Value> = item["parameters"]
            .as_array()
            .map(|a| a.iter().collect())
            .unwrap_or_default();
        let names: Vec<&str> = shared.iter().filter_map(|p| p["name"].as_str()).collect();
        if !names.contains(&"X-Request-Id") {
            problems.push(format!("{path}: X-Request-Id undocumented"));
        }
        if path.starts_with("/api/") && !names.contains(&"X-Tenant-Id") {
            problems.push(format!("{path}: X-Tenant-Id undocumented"));
        }
        for (method, op) in item.as_object().unwrap() {
            if method == "parameters" {
                continue;
            }
            let responses = op["responses"].as_object().unwrap();
            let mut need: Vec<&str> = Vec::new();
            if path.starts_with("/api/") {
                // 429: a credential's share of connections (`key_too_many_connections`).
                need.extend(["400", "401", "403", "429", "503"]);
            }
            if op.get("requestBody").is_some() {
                need.extend(["413", "415"]);
            }
            for status in need {
                if !responses.contains_key(status) {
                    problems.push(format!("{method} {path}: {status} undocumented"));
                }
            }
            if let Some(r) = responses.get("401")
                && r["headers"].get("WWW-Authenticate").is_none()
            {
                problems.push(format!("{method} {path}: 401 without WWW-Authenticate"));
            }
            for status in ["429", "503"] {
                if let Some(r) = responses.get(status)
                    && r["headers"].get("Retry-After").is_none()
                {
                    problems.push(format!("{method} {path}: {status} without Retry-After"));
                }
            }
            for p in op["parameters"].as_array().into_iter().flatten() {
                let name = p["name"].as_str().unwrap();
                // Read as W3C Trace Context says: any value is taken, one that does not parse
                // is ignored (never a 400), so no pattern could be honest. Their description
                // must say so.
                if ["traceparent", "tracestate"].contains(&name) {
                    if !p["description"].as_str().unwrap_or("").contains("ignored")
                        && !p["description"].as_str().unwrap_or("").contains("dropped")
                    {
                        problems.push(format!(
                            "{method} {path}: {name} does not say it is lenient"
                        ));
                    }
                    continue;
                }
                let schema = &p["schema"];
                let bounded = match types(schema).first().copied() {
                    Some("string") => {
                        schema.get("pattern").is_some() || schema.get("enum").is_some()
                    }
                    Some("integer") => {
                        schema.get("minimum").is_some() && schema.get("maximum").is_some()
                    }
                    Some("boolean") => true,
                    _ => schema.get("$ref").is_some() || schema.get("oneOf").is_some(),
                };
                if !bounded {
                    problems.push(format!("{method} {path}: parameter {name} unbounded"));
                }
            }
        }
    }
    let mut all = Vec::new();
    schemas(&spec, &mut all);
    for s in all {
        if s["format"] == "int32"
            && s["maximum"]
                .as_i64()
                .is_none_or(|m| m > i64::from(i32::MAX))
        {
            problems.push(format!("int32 without a maximum that fits: {s}"));
        }
    }
    assert!(problems.is_empty(), "{problems:#?}");
}
