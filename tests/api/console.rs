//! What the web console relies on, checked over HTTP: its files served from the binary with a
//! strict Content-Security-Policy, `GET /api/me` for every kind of caller, and dismissing
//! dead-letter records (`DELETE /api/dlq/{shard}/{entry_id}`). The console itself is tested
//! in a real browser by `scripts/console_test.sh`.

use std::time::Duration;

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{ADMIN_TOKEN, FAST_WORKER, TestApp, TestWorker, problem_code};

impl TestApp {
    async fn key_of(&self, tenant: &str, role: &str) -> Value {
        self.put_tenant(tenant, &json!({})).await;
        let res = self
            .client
            .post(self.url(&format!("/api/tenants/{tenant}/api-keys")))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({"role": role}))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::CREATED);
        res.json().await.unwrap()
    }

    async fn me(&self, token: Option<&str>, tenant: Option<&str>) -> reqwest::Response {
        let mut req = self.client.get(self.url("/api/me"));
        if let Some(t) = token {
            req = req.bearer_auth(t);
        }
        if let Some(t) = tenant {
            req = req.header("X-Tenant-Id", t);
        }
        req.send().await.unwrap()
    }

    /// DELETE /api/dlq/{shard}/{entry}, with `token` (and `tenant` as X-Tenant-Id).
    async fn dismiss(
        &self,
        token: &str,
        tenant: Option<&str>,
        shard: &str,
        entry: &str,
    ) -> reqwest::Response {
        let mut req = self
            .client
            .request(
                Method::DELETE,
                self.url(&format!("/api/dlq/{shard}/{entry}")),
            )
            .bearer_auth(token);
        if let Some(t) = tenant {
            req = req.header("X-Tenant-Id", t);
        }
        req.send().await.unwrap()
    }

    async fn dlq_of(&self, tenant: Option<&str>) -> Vec<Value> {
        self.get_json(tenant, "/api/dlq?limit=200").await["dead_letters"]
            .as_array()
            .unwrap()
            .clone()
    }
}

#[tokio::test]
async fn the_console_is_served_from_the_binary_with_a_strict_policy() {
    let app = TestApp::spawn().await;
    let res = app.client.get(app.url("/console")).send().await.unwrap();
    // reqwest follows the redirect to /console/.
    assert_eq!(res.url().path(), "/console/");
    assert_eq!(res.status(), StatusCode::OK);
    for (path, kind) in [
        ("/console/", "text/html; charset=utf-8"),
        ("/console/js/app.js", "text/javascript; charset=utf-8"),
        (
            "/console/js/pages/executions.js",
            "text/javascript; charset=utf-8",
        ),
        ("/console/style.css", "text/css; charset=utf-8"),
    ] {
        let res = app.client.get(app.url(path)).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{path}");
        let h = res.headers();
        assert_eq!(h["content-type"], kind, "{path}");
        assert_eq!(h["x-content-type-options"], "nosniff", "{path}");
        let csp = h["content-security-policy"].to_str().unwrap();
        for directive in [
            "default-src 'none'",
            "script-src 'self'",
            "style-src 'self'",
            "connect-src 'self'",
            "frame-ancestors 'none'",
            "require-trusted-types-for 'script'",
        ] {
            assert!(csp.contains(directive), "{path}: {csp}");
        }
        assert!(!csp.contains("unsafe"), "{path}: {csp}");
        let body = res.text().await.unwrap();
        assert!(!body.contains("https://"), "{path} names another origin");
    }
    let index = app.get_text("/console/").await;
    assert!(index.contains(r#"<script type="module" src="/console/js/app.js"></script>"#));
    // No credential is needed for the files; unknown ones are 404 problem documents.
    let res = app
        .client
        .get(app.url("/console/js/missing.js"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    assert_eq!(problem_code(res).await, "route_not_found");
    let res = app
        .client
        .get(app.url("/console/../openapi.json"))
        .send()
        .await
        .unwrap();
    assert_ne!(res.status(), StatusCode::INTERNAL_SERVER_ERROR);
}

#[tokio::test]
async fn me_says_who_each_caller_is() {
    let app = TestApp::spawn().await;
    // What each role may do, as the console reads it (`access::me_lists_exactly_the_actions_
    // the_server_allows` proves each list against the calls themselves).
    let viewer = vec!["read"];
    let editor = [
        viewer.clone(),
        vec![
            "admit",
            "cancel",
            "retry",
            "reschedule",
            "dismiss_dead_letters",
        ],
    ]
    .concat();
    let admin = [
        editor.clone(),
        vec![
            "force_delete",
            "manage_tenant",
            "manage_api_keys",
            "manage_webhook",
            "read_trends",
        ],
    ]
    .concat();
    let everything = [admin.clone(), vec!["pull_work", "manage_platform"]].concat();
    for (role, may) in [("viewer", &viewer), ("editor", &editor), ("admin", &admin)] {
        let key = app.key_of("acme", role).await;
        let res = app.me(key["token"].as_str(), None).await;
        assert_eq!(res.status(), StatusCode::OK);
        let me: Value = res.json().await.unwrap();
        assert_eq!(
            me,
            json!({"tenant_id": "acme", "role": role, "key_id": key["key_id"], "auth": "api_key",
                   "may": may})
        );
        // Its own tenant named again is fine; another is a 403.
        let res = app.me(key["token"].as_str(), Some("acme")).await;
        assert_eq!(res.status(), StatusCode::OK);
        let res = app.me(key["token"].as_str(), Some("globex")).await;
        assert_eq!(res.status(), StatusCode::FORBIDDEN);
        assert_eq!(problem_code(res).await, "tenant_mismatch");
    }
    let me: Value = app.me(Some(ADMIN_TOKEN), None).await.json().await.unwrap();
    assert_eq!(
        me,
        json!({"tenant_id": null, "role": "platform_admin", "key_id": null, "auth": "admin_token",
               "may": everything})
    );
    let me: Value = app
        .me(Some(ADMIN_TOKEN), Some("globex"))
        .await
        .json()
        .await
        .unwrap();
    assert_eq!(me["tenant_id"], "globex");
    for bad in [None, Some("wrong"), Some("sk_0123456789abcdef_00")] {
        let res = app.me(bad, None).await;
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "{bad:?}");
    }
    // A revoked key is refused at once.
    let key = app.key_of("acme", "viewer").await;
    let res = app
        .client
        .delete(app.url(&format!(
            "/api/tenants/acme/api-keys/{}",
            key["key_id"].as_str().unwrap()
        )))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let res = app.me(key["token"].as_str(), None).await;
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);

    // Dev auth: no credential, platform admin.
    let dev = TestApp::spawn_with(|c| {
        c.api.dev_auth = true;
        c.api.admin_token = None;
    })
    .await;
    let me: Value = dev.me(None, Some("acme")).await.json().await.unwrap();
    assert_eq!(
        me,
        json!({"tenant_id": "acme", "role": "platform_admin", "key_id": null, "auth": "dev_auth",
               "may": everything})
    );
}

#[tokio::test]
async fn a_dead_letter_is_dismissed_once_and_only_by_its_tenant() {
    let app = TestApp::spawn().await;
    let _worker = TestWorker::spawn(&app.redis, FAST_WORKER);
    let mut failed = Vec::new();
    for tenant in ["acme", "globex"] {
        let id = app
            .admit_with(
                tenant,
                json!({"flow_id": "demo.fail", "max_attempts": 1, "params": {"message": "no"}}),
            )
            .await;
        let done = app
            .wait_terminal(tenant, &id, Duration::from_secs(15))
            .await;
        assert_eq!(done["status"], "failed");
        failed.push(id);
    }
    let acme = app.dlq_of(Some("acme")).await;
    assert_eq!(acme.len(), 1);
    assert_eq!(acme[0]["execution_id"], failed[0].as_str());
    assert_eq!(acme[0]["shard"], app.shard("acme").number());
    let shard = acme[0]["shard"].to_string();
    let entry = acme[0]["entry_id"].as_str().unwrap().to_owned();

    // A viewer may read but not dismiss; another tenant cannot touch it (404, as if absent).
    let viewer = app.key_of("acme", "viewer").await;
    let res = app
        .dismiss(viewer["token"].as_str().unwrap(), None, &shard, &entry)
        .await;
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert_eq!(problem_code(res).await, "insufficient_role");
    let res = app
        .dismiss(ADMIN_TOKEN, Some("globex"), &shard, &entry)
        .await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    assert_eq!(problem_code(res).await, "dead_letter_not_found");
    assert_eq!(app.dlq_of(Some("acme")).await.len(), 1);

    // The tenant's editor dismisses it, once.
    let editor = app.key_of("acme", "editor").await;
    let token = editor["token"].as_str().unwrap();
    let res = app.dismiss(token, None, &shard, &entry).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let res = app.dismiss(token, None, &shard, &entry).await;
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    assert_eq!(app.dlq_of(Some("acme")).await, Vec::<Value>::new());
    assert_eq!(app.counter("dlq_dismissed").await, 1);
    // The execution is untouched: still failed, and retryable.
    assert_eq!(app.execution("acme", &failed[0]).await["status"], "failed");
    assert_eq!(app.retry("acme", &failed[0]).await.status(), StatusCode::OK);

    // The platform admin without a tenant dismisses any record, a poison one included.
    let globex = app.dlq_of(Some("globex")).await;
    assert_eq!(globex.len(), 1);
    let res = app
        .dismiss(
            ADMIN_TOKEN,
            None,
            &globex[0]["shard"].to_string(),
            globex[0]["entry_id"].as_str().unwrap(),
        )
        .await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let key = app.shard("acme").dead_letters();
    let poison: String = app
        .redis
        .query(
            redis::cmd("XADD")
                .arg(&key)
                .arg("*")
                .arg("execution_id")
                .arg("garbage")
                .arg("reason")
                .arg("poison")
                .arg("attempts")
                .arg(0),
        )
        .await;
    let res = app
        .dismiss(ADMIN_TOKEN, Some("acme"), &shard, &poison)
        .await;
    assert_eq!(
        res.status(),
        StatusCode::NOT_FOUND,
        "a poison record is no tenant's"
    );
    let res = app.dismiss(ADMIN_TOKEN, None, &shard, &poison).await;
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert_eq!(app.counter("dlq_dismissed").await, 3);
}

#[tokio::test]
async fn a_malformed_dismissal_is_refused_before_redis_sees_it() {
    let app = TestApp::spawn().await;
    for (shard, entry, want, code) in [
        ("x", "1-1", 400, "invalid_shard"),
        ("-1", "1-1", 400, "invalid_shard"),
        ("70000", "1-1", 400, "invalid_shard"),
        ("0", "abc", 400, "invalid_record_id"),
        ("0", "1-", 400, "invalid_record_id"),
        ("0", "1-2-3", 400, "invalid_record_id"),
        ("0", "99999999999999999999-0", 404, "dead_letter_not_found"),
        ("0", "1-1", 404, "dead_letter_not_found"),
        ("999", "1-1", 404, "dead_letter_not_found"),
    ] {
        let res = app.dismiss(ADMIN_TOKEN, None, shard, entry).await;
        assert_eq!(res.status().as_u16(), want, "{shard}/{entry}");
        assert_eq!(problem_code(res).await, code, "{shard}/{entry}");
    }
}

/// Issue 19: the console's first load logged a 401 of `GET /api/me` (its probe without a
/// token). `/console/session.json` tells it whether the server runs with dev auth, so without a
/// token it shows the login at once and asks `/api` nothing (the browser check is in
/// `scripts/console_test.py`).
#[tokio::test]
async fn the_console_learns_whether_it_needs_a_login_without_a_refused_call() {
    let app = TestApp::spawn().await;
    let dev = TestApp::spawn_with(|c| {
        c.api.dev_auth = true;
        c.api.admin_token = None;
    })
    .await;
    for (server, dev_auth) in [(&app, false), (&dev, true)] {
        let res = server
            .client
            .get(server.url("/console/session.json"))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        assert_eq!(res.headers()["cache-control"], "no-store");
        assert!(res.headers().contains_key("content-security-policy"));
        assert_eq!(
            res.json::<Value>().await.unwrap(),
            json!({"dev_auth": dev_auth})
        );
    }
    let app_js = app.get_text("/console/js/app.js").await;
    assert!(app_js.contains("/console/session.json"));
}
