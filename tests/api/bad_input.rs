//! Bad input never produces a 500 or a partial write: every case answers problem+json with a
//! stable code and leaves Redis exactly as it was.
//!
//! Long on purpose: one table-driven test per family of bad input; the tables are long because
//! hostile input is varied.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{ADMIN_TOKEN, TestApp, TestRedis, problem_code};

struct Case {
    name: &'static str,
    method: Method,
    path: String,
    tenant: Option<&'static str>,
    headers: Vec<(&'static str, String)>,
    body: Option<(Option<&'static str>, Vec<u8>)>,
    status: StatusCode,
    code: &'static str,
}

fn post_json(name: &'static str, body: &str, status: StatusCode, code: &'static str) -> Case {
    Case {
        name,
        method: Method::POST,
        path: "/api/executions".into(),
        tenant: Some("acme"),
        headers: vec![],
        body: Some((Some("application/json"), body.as_bytes().to_vec())),
        status,
        code,
    }
}

fn cases() -> Vec<Case> {
    let bad = StatusCode::BAD_REQUEST;
    let mut v = vec![
        post_json("invalid json", "{flow_id: x}", bad, "malformed_json"),
        post_json(
            "truncated json",
            r#"{"flow_id": "demo.echo", "par"#,
            bad,
            "malformed_json",
        ),
        post_json("empty body", "", bad, "malformed_json"),
        post_json(
            "flow_id of wrong type",
            r#"{"flow_id": 5}"#,
            bad,
            "invalid_body",
        ),
        post_json("flow_id missing", r#"{"params": {}}"#, bad, "invalid_body"),
        post_json(
            "unknown field",
            r#"{"flow_id": "f", "flowid": "g"}"#,
            bad,
            "invalid_body",
        ),
        post_json("body not an object", "[1, 2]", bad, "invalid_body"),
        // Serde's structs also read an array of their fields in order; the API does not.
        post_json(
            "body as a field array",
            r#"["demo.echo"]"#,
            bad,
            "invalid_body",
        ),
        post_json(
            "max_attempts not whole",
            r#"{"flow_id": "f", "max_attempts": 2.5}"#,
            bad,
            "invalid_body",
        ),
        post_json(
            "empty flow_id",
            r#"{"flow_id": ""}"#,
            bad,
            "invalid_flow_id",
        ),
        post_json(
            "flow_id with a brace",
            r#"{"flow_id": "a{b}"}"#,
            bad,
            "invalid_flow_id",
        ),
        post_json(
            "flow_id with a colon",
            r#"{"flow_id": "a:b"}"#,
            bad,
            "invalid_flow_id",
        ),
        post_json(
            "params an array",
            r#"{"flow_id": "f", "params": [1]}"#,
            bad,
            "invalid_params",
        ),
        post_json(
            "params a string",
            r#"{"flow_id": "f", "params": "x"}"#,
            bad,
            "invalid_params",
        ),
        post_json(
            "params a number",
            r#"{"flow_id": "f", "params": 3}"#,
            bad,
            "invalid_params",
        ),
        post_json(
            "max_attempts zero",
            r#"{"flow_id": "f", "max_attempts": 0}"#,
            bad,
            "invalid_max_attempts",
        ),
        post_json(
            "max_attempts negative",
            r#"{"flow_id": "f", "max_attempts": -1}"#,
            bad,
            "invalid_body",
        ),
        post_json(
            "version empty",
            r#"{"flow_id": "f", "version": ""}"#,
            bad,
            "invalid_version",
        ),
        post_json(
            "dedup key with a control character",
            r#"{"flow_id": "f", "dedup_key": "a\u0001b"}"#,
            bad,
            "invalid_dedup_key",
        ),
        post_json(
            "dedup key empty",
            r#"{"flow_id": "f", "dedup_key": ""}"#,
            bad,
            "invalid_dedup_key",
        ),
    ];
    let long_flow = format!(r#"{{"flow_id": "{}"}}"#, "f".repeat(129));
    v.push(Case {
        body: Some((Some("application/json"), long_flow.into_bytes())),
        ..post_json("flow_id over 128", "", bad, "invalid_flow_id")
    });
    let long_key = format!(r#"{{"flow_id": "f", "dedup_key": "{}"}}"#, "k".repeat(257));
    v.push(Case {
        body: Some((Some("application/json"), long_key.into_bytes())),
        ..post_json("dedup key over 256 bytes", "", bad, "invalid_dedup_key")
    });
    v.push(Case {
        headers: vec![("Idempotency-Key", "k".repeat(257))],
        ..post_json(
            "header dedup key over 256 bytes",
            r#"{"flow_id": "f"}"#,
            bad,
            "invalid_dedup_key",
        )
    });
    v.push(Case {
        headers: vec![("Idempotency-Key", "a".into())],
        ..post_json(
            "header and body keys differ",
            r#"{"flow_id": "f", "dedup_key": "b"}"#,
            bad,
            "dedup_key_mismatch",
        )
    });
    let huge = format!(
        r#"{{"flow_id": "f", "params": {{"blob": "{}"}}}}"#,
        "x".repeat(2 * 1024 * 1024)
    );
    v.push(Case {
        body: Some((Some("application/json"), huge.into_bytes())),
        ..post_json(
            "body over the limit",
            "",
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
        )
    });
    v.push(Case {
        body: Some((None, br#"{"flow_id": "f"}"#.to_vec())),
        ..post_json(
            "no content type",
            "",
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
        )
    });
    v.push(Case {
        body: Some((Some("text/plain"), br#"{"flow_id": "f"}"#.to_vec())),
        ..post_json(
            "text content type",
            "",
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            "unsupported_media_type",
        )
    });
    for (name, tenant) in [
        ("tenant with an open brace", "a{b"),
        ("tenant with a close brace", "a}b"),
        ("tenant with a colon", "a:b"),
        ("tenant with a star", "a*"),
        ("tenant with a space", "a b"),
        (
            "tenant too long",
            "t234567890123456789012345678901234567890123456789012345678901234x",
        ),
    ] {
        v.push(Case {
            tenant: Some(tenant),
            ..post_json(name, r#"{"flow_id": "f"}"#, bad, "invalid_tenant_id")
        });
    }
    v.push(Case {
        tenant: None,
        ..post_json(
            "no tenant header",
            r#"{"flow_id": "f"}"#,
            bad,
            "tenant_required",
        )
    });
    let get = |name, path: &str, code| Case {
        name,
        method: Method::GET,
        path: path.into(),
        tenant: Some("acme"),
        headers: vec![],
        body: None,
        status: bad,
        code,
    };
    v.push(get(
        "malformed execution id",
        "/api/executions/not-an-id",
        "invalid_execution_id",
    ));
    v.push(get(
        "uppercase execution id",
        "/api/executions/0123456789ABCDEF0123456789ABCDEF",
        "invalid_execution_id",
    ));
    v.push(get(
        "limit zero",
        "/api/executions?limit=0",
        "invalid_limit",
    ));
    v.push(get(
        "limit over 200",
        "/api/executions?limit=201",
        "invalid_limit",
    ));
    v.push(get(
        "limit not a number",
        "/api/executions?limit=ten",
        "invalid_query",
    ));
    v.push(get(
        "unknown status",
        "/api/executions?status=done",
        "invalid_status",
    ));
    v.push(get(
        "bad cursor",
        "/api/executions?cursor=zzz",
        "invalid_cursor",
    ));
    v.push(get(
        "bad flow filter",
        "/api/executions?flow_id=a%7Bb",
        "invalid_flow_id",
    ));
    v.push(Case {
        method: Method::PUT,
        path: "/api/tenants/acme".into(),
        tenant: None,
        body: Some((
            Some("application/json"),
            br#"{"max_concurrent": "ten"}"#.to_vec(),
        )),
        ..get("tenant limits of wrong type", "", "invalid_body")
    });
    v.push(Case {
        method: Method::PUT,
        path: "/api/tenants/acme".into(),
        tenant: None,
        body: Some((Some("application/json"), b"[null, null]".to_vec())),
        ..get("tenant limits as a field array", "", "invalid_body")
    });
    v.push(Case {
        method: Method::PUT,
        path: "/api/tenants/a%7Bb".into(),
        tenant: None,
        body: Some((Some("application/json"), b"{}".to_vec())),
        ..get("tenant path with a brace", "", "invalid_tenant_id")
    });
    v.push(Case {
        status: StatusCode::METHOD_NOT_ALLOWED,
        method: Method::PATCH,
        ..get(
            "unsupported method",
            "/api/executions",
            "method_not_allowed",
        )
    });
    v.push(Case {
        status: StatusCode::NOT_FOUND,
        ..get("unknown route", "/api/nothing-here", "route_not_found")
    });
    v
}

#[tokio::test]
async fn bad_input_is_refused_with_a_problem_and_leaves_redis_untouched() {
    // No sweeper: its turn would write (its lock, its counters) while the cases run.
    let app = TestApp::spawn_with(|c| c.api.sweep_interval_secs = 0).await;
    // One real execution, so "untouched" is checked against a database with a row, its
    // indexes, a stream entry and a dedup mapping in it.
    let admitted = app
        .admit_with(
            "acme",
            json!({"flow_id": "demo.echo", "dedup_key": "k1", "params": {"a": 1}}),
        )
        .await;
    let before = app.redis.dump().await;
    let row = crate::helpers::key_text(
        app.shard("acme")
            .row(&sluice::domain::ExecutionId::parse(&admitted).unwrap()),
    );
    assert!(before.contains_key(&row), "{:?}", before.keys());
    let mut failures = Vec::new();
    for case in cases() {
        let mut req = app
            .client
            .request(case.method.clone(), app.url(&case.path))
            .bearer_auth(ADMIN_TOKEN);
        if let Some(t) = case.tenant {
            req = req.header("X-Tenant-Id", t);
        }
        for (k, v) in &case.headers {
            req = req.header(*k, v);
        }
        if let Some((ct, body)) = case.body {
            if let Some(ct) = ct {
                req = req.header("Content-Type", ct);
            }
            req = req.body(body);
        }
        let res = req.send().await.unwrap();
        let status = res.status();
        let code = problem_code(res).await;
        if status != case.status || code != case.code {
            failures.push(format!(
                "{}: got {status} {code}, want {} {}",
                case.name, case.status, case.code
            ));
        }
    }
    assert!(failures.is_empty(), "{failures:#?}");
    let after = app.redis.dump().await;
    let changed: std::collections::BTreeSet<&String> = before
        .keys()
        .chain(after.keys())
        .filter(|k| before.get(*k) != after.get(*k))
        .collect();
    assert!(
        changed.is_empty(),
        "bad input changed these keys: {changed:?}"
    );
}

#[tokio::test]
async fn missing_or_wrong_credentials_are_401() {
    let app = TestApp::spawn().await;
    let body = json!({"flow_id": "f"});
    let cases = [
        app.client
            .post(app.url("/api/executions"))
            .header("X-Tenant-Id", "acme"),
        app.client
            .post(app.url("/api/executions"))
            .header("X-Tenant-Id", "acme")
            .bearer_auth("wrong"),
        app.client
            .post(app.url("/api/executions"))
            .header("X-Tenant-Id", "acme")
            .header("Authorization", "Bearer "),
        app.client
            .post(app.url("/api/executions"))
            .header("X-Tenant-Id", "acme")
            .header("Authorization", "Basic Zm9vOmJhcg=="),
        app.client
            .post(app.url("/api/executions"))
            .header("X-Tenant-Id", "acme")
            .bearer_auth("x".repeat(10_000)),
    ];
    for req in cases {
        let res = req.json(&body).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
        assert_eq!(res.headers()["www-authenticate"], "Bearer");
        assert_eq!(problem_code(res).await, "unauthorized");
    }
    assert_eq!(app.row_count().await, 0);
}

#[tokio::test]
async fn params_are_bounded_in_bytes_below_the_body_limit() {
    let app = TestApp::spawn().await;
    // `{"b":"x…x"}` is the blob plus 8 bytes of canonical JSON.
    let limit = 64 * 1024;
    let body = |n: usize| json!({"flow_id": "demo.echo", "params": {"b": "x".repeat(n)}});
    let res = app.post_execution("acme", &body(limit - 8)).await;
    assert_eq!(res.status(), StatusCode::CREATED);
    let res = app.post_execution("acme", &body(limit - 7)).await;
    assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
    assert_eq!(problem_code(res).await, "params_too_large");
    assert_eq!(app.row_count().await, 1);

    // The limit is a setting.
    let small = TestApp::spawn_with(|c| c.api.max_params_bytes = 100).await;
    let res = small.post_execution("acme", &body(100)).await;
    assert_eq!(res.status(), StatusCode::PAYLOAD_TOO_LARGE);
    let res = small.post_execution("acme", &body(92)).await;
    assert_eq!(res.status(), StatusCode::CREATED);
}

#[tokio::test]
async fn dead_letter_cursors_are_checked_before_redis_sees_them() {
    // Two records of acme's shard, with ids chosen to sit at the edges, written by hand before
    // the app connects (it indexes them then, as records an older build left).
    let redis = TestRedis::start().await;
    let key = sluice::store::ShardMap::new(16, sluice::store::Layout::CURRENT)
        .shard_of(&sluice::domain::TenantId::parse("acme").unwrap())
        .dead_letters();
    for id in ["1-1", "5-0"] {
        let _: String = redis
            .query(
                redis::cmd("XADD")
                    .arg(&key)
                    .arg(id)
                    .arg("execution_id")
                    .arg(format!("e{id}"))
                    .arg("tenant_id")
                    .arg("acme")
                    .arg("reason")
                    .arg("poison")
                    .arg("attempts")
                    .arg(1)
                    .arg("at")
                    .arg(1000),
            )
            .await;
    }
    let app = TestApp::spawn_on(redis, |_| {}).await;
    let page = |before: &'static str| {
        app.as_tenant(
            reqwest::Method::GET,
            &format!("/api/dlq?before={before}"),
            "acme",
        )
        .send()
    };
    for (before, want) in [
        ("5-0", vec!["1-1"]),
        ("5-1", vec!["5-0", "1-1"]),
        ("0-0", vec![]),
        ("1-1", vec![]),
        ("99999999999999999999-0", vec!["5-0", "1-1"]),
        ("4-99999999999999999999", vec!["1-1"]),
        (
            "18446744073709551615-18446744073709551615",
            vec!["5-0", "1-1"],
        ),
    ] {
        let res = page(before).await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "before={before}");
        let body: serde_json::Value = res.json().await.unwrap();
        let got: Vec<&str> = body["dead_letters"]
            .as_array()
            .unwrap()
            .iter()
            .map(|d| d["entry_id"].as_str().unwrap())
            .collect();
        assert_eq!(got, want, "before={before}");
    }
    for before in [
        "5-",
        "-5",
        "5",
        "a-1",
        "1-2-3",
        "123456789012345678901-0",
        "%2B1-0",
    ] {
        let res = page(before).await.unwrap();
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "before={before}");
        assert_eq!(problem_code(res).await, "invalid_cursor", "before={before}");
    }
}

#[tokio::test]
async fn whole_numbers_are_integers_in_any_json_spelling() {
    let app = TestApp::spawn().await;
    // JSON Schema's `integer` admits 5.0 and 1e1; so does the server.
    let res = app
        .post_execution(
            "acme",
            &json!({"flow_id": "demo.echo", "max_attempts": 5.0}),
        )
        .await;
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(
        res.json::<serde_json::Value>().await.unwrap()["max_attempts"],
        5
    );
    let tenant = app
        .put_tenant("acme", &json!({"max_concurrent": 1e1, "max_queued": 7.0}))
        .await;
    assert_eq!(tenant["max_concurrent"], 10);
    assert_eq!(tenant["max_queued"], 7);
}

/// Whether `v` is valid against `schema` (inside the document `spec`), for the keywords the
/// request bodies below use: `$ref`, `oneOf`, `type`, `required`, `properties` and
/// `additionalProperties: false`. Formats and patterns are not checked: every string sample
/// below has one the schema allows, so only the shape decides.
fn schema_takes(spec: &Value, schema: &Value, v: &Value) -> bool {
    if let Some(name) = schema["$ref"].as_str() {
        let name = name.trim_start_matches("#/components/schemas/");
        return schema_takes(spec, &spec["components"]["schemas"][name], v);
    }
    if let Some(branches) = schema["oneOf"].as_array()
        && branches.iter().filter(|b| schema_takes(spec, b, v)).count() != 1
    {
        return false;
    }
    let kind = match v {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(_) => "number",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) => "object",
    };
    let kinds: Vec<&str> = match &schema["type"] {
        Value::String(t) => vec![t.as_str()],
        Value::Array(ts) => ts.iter().filter_map(Value::as_str).collect(),
        _ => vec![kind],
    };
    if !kinds.contains(&kind) {
        return false;
    }
    let Value::Object(members) = v else {
        return true;
    };
    let props = schema["properties"].as_object();
    let required = schema["required"].as_array().into_iter().flatten();
    required
        .filter_map(Value::as_str)
        .all(|r| members.contains_key(r))
        && members
            .iter()
            .all(|(k, m)| match props.and_then(|p| p.get(k)) {
                Some(s) => schema_takes(spec, s, m),
                None => schema["additionalProperties"] != json!(false),
            })
}

/// Whether an answer is the one the document promised: a body it takes is applied (200), one
/// it refuses is a 400, or a 415 when no JSON body was sent at all where one is required.
fn agrees(taken: bool, status: StatusCode) -> bool {
    if taken {
        status == StatusCode::OK
    } else {
        status == StatusCode::BAD_REQUEST || status == StatusCode::UNSUPPORTED_MEDIA_TYPE
    }
}

/// Whether the document takes `body` (`None`: no body at all) for `POST path`.
fn document_takes(spec: &Value, path: &str, body: Option<&Value>) -> bool {
    let request = &spec["paths"][path]["post"]["requestBody"];
    match body {
        None => request.is_null() || request["required"] != json!(true),
        Some(v) => {
            let schema = &request["content"]["application/json"]["schema"];
            !schema.is_null() && schema_takes(spec, schema, v)
        }
    }
}

/// A client that checks its body against the published document gets the answer the document
/// promised: for `.../reschedule` (exactly one of `run_at` and `delay`) and `.../retry` (no
/// body, or an empty object), every body the schema refuses is a 400 problem (415 for no body
/// where one is required) and every one it takes is applied (200).
#[tokio::test]
async fn reschedule_and_retry_take_exactly_the_bodies_their_schema_takes() {
    let app = TestApp::spawn().await;
    let spec = serde_json::to_value(sluice::http::openapi()).unwrap();
    let in_two_hours = time::OffsetDateTime::now_utc() + time::Duration::hours(2);
    let run_at = in_two_hours
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap();
    let send = |path: String, body: Option<&Value>| {
        let req = app.as_tenant(Method::POST, &path, "acme");
        match body {
            Some(b) => req.json(b),
            None => req,
        }
        .send()
    };
    let mut wrong = Vec::new();

    // Each sample on a scheduled execution: a body the server takes moves it (200).
    let scheduled = app
        .admit_with("acme", json!({"flow_id": "demo.echo", "delay": "1h"}))
        .await;
    let path = "/api/executions/{id}/reschedule";
    for body in [
        None,
        Some(json!({})),
        Some(json!({"delay": "1h"})),
        Some(json!({"run_at": run_at})),
        Some(json!({"delay": "1h", "run_at": run_at})),
        Some(json!({"delay": null})),
        Some(json!({"delay": "1h", "run_at": null})),
        Some(json!({"run_at": run_at, "delay": null})),
        Some(json!({"delay": "1h", "at": "now"})),
        Some(json!({"delay": 60})),
        Some(json!([])),
        Some(json!(null)),
    ] {
        let res = send(
            format!("/api/executions/{scheduled}/reschedule"),
            body.as_ref(),
        )
        .await
        .unwrap();
        let taken = document_takes(&spec, path, body.as_ref());
        let status = res.status();
        let code = if status.is_success() {
            String::new()
        } else {
            problem_code(res).await
        };
        if !agrees(taken, status) {
            wrong.push(format!(
                "reschedule {body:?}: {status} {code}, the document takes it: {taken}"
            ));
        }
    }

    // Each sample on a cancelled execution of its own: a body the server takes queues it
    // again (200); one it ignored would do the same.
    let path = "/api/executions/{id}/retry";
    for body in [
        None,
        Some(json!({})),
        Some(json!({"max_attempts": 3})),
        Some(json!({"params": {"a": 1}})),
        Some(json!({"delay": "1h"})),
        Some(json!([])),
        Some(json!(null)),
        Some(json!("again")),
    ] {
        let id = app
            .admit_with("acme", json!({"flow_id": "demo.echo"}))
            .await;
        app.cancel("acme", &id).await;
        let res = send(format!("/api/executions/{id}/retry"), body.as_ref())
            .await
            .unwrap();
        let taken = document_takes(&spec, path, body.as_ref());
        let status = res.status();
        let code = if status.is_success() {
            String::new()
        } else {
            problem_code(res).await
        };
        if !agrees(taken, status) {
            wrong.push(format!(
                "retry {body:?}: {status} {code}, the document takes it: {taken}"
            ));
        }
        let state = app.execution("acme", &id).await;
        let queued = state["status"] == "queued";
        if queued != taken {
            wrong.push(format!(
                "retry {body:?}: the execution is {}",
                state["status"]
            ));
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// An empty retry body is no body whatever its type says (`curl -d ''` sends a form type),
/// and a refused one names the member it did not take.
#[tokio::test]
async fn a_retry_takes_an_empty_body_of_any_type_and_names_a_refused_member() {
    let app = TestApp::spawn().await;
    let retry_with = |id: String, content_type: Option<&'static str>, body: &'static str| {
        let mut req = app.as_tenant(Method::POST, &format!("/api/executions/{id}/retry"), "acme");
        if let Some(ct) = content_type {
            req = req.header("Content-Type", ct);
        }
        req.body(body).send()
    };
    for content_type in [
        None,
        Some("application/x-www-form-urlencoded"),
        Some("application/json"),
    ] {
        let id = app
            .admit_with("acme", json!({"flow_id": "demo.echo"}))
            .await;
        app.cancel("acme", &id).await;
        let res = retry_with(id, content_type, "").await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{content_type:?}");
    }
    let id = app
        .admit_with("acme", json!({"flow_id": "demo.echo"}))
        .await;
    app.cancel("acme", &id).await;
    let res = retry_with(
        id.clone(),
        Some("application/json"),
        r#"{"max_attempts": 3}"#,
    )
    .await
    .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    let problem: Value = res.json().await.unwrap();
    assert_eq!(problem["code"], "invalid_body", "{problem}");
    assert!(
        problem["detail"].as_str().unwrap().contains("max_attempts"),
        "{problem}"
    );
    // A body that is not JSON is refused as everywhere (and nothing was retried).
    let res = retry_with(id.clone(), Some("text/plain"), "{}")
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNSUPPORTED_MEDIA_TYPE);
    assert_eq!(app.execution("acme", &id).await["status"], "cancelled");
}
