//! Authentication and tenancy: tenant API keys and their roles, isolation between tenants,
//! revocation, the tenant registry, and every shape of bad credential.
//!
//! Long on purpose: a list of independent tests, one per role, credential shape or isolation
//! rule; together they are the access matrix, which reads best in one place.

use reqwest::{Method, StatusCode};
use serde_json::{Value, json};

use crate::helpers::{ADMIN_TOKEN, TestApp, problem_code};

/// Who makes a call in these tests.
#[derive(Debug, Clone)]
enum Who {
    /// The platform admin token, acting for a tenant through `X-Tenant-Id`.
    Platform(&'static str),
    /// A tenant API key (the tenant comes from the key).
    Key(String),
}

impl TestApp {
    fn request_as(&self, who: &Who, method: Method, path: &str) -> reqwest::RequestBuilder {
        let req = self.client.request(method, self.url(path));
        match who {
            Who::Platform(t) => req.bearer_auth(ADMIN_TOKEN).header("X-Tenant-Id", *t),
            Who::Key(token) => req.bearer_auth(token),
        }
    }

    /// Registers a tenant with the server defaults.
    pub async fn create_tenant(&self, tenant: &str) {
        self.put_tenant(tenant, &json!({})).await;
    }

    /// Creates an API key as the platform admin; returns the answer (with `token`).
    pub async fn create_key(&self, tenant: &str, role: &str) -> Value {
        let res = self
            .client
            .post(self.url(&format!("/api/tenants/{tenant}/api-keys")))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({"role": role, "name": format!("{role} key")}))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::CREATED);
        res.json().await.unwrap()
    }

    pub async fn key_token(&self, tenant: &str, role: &str) -> String {
        self.create_key(tenant, role).await["token"]
            .as_str()
            .unwrap()
            .to_owned()
    }

    /// Admits one execution as the platform admin; returns its id.
    async fn admitted_id(&self, tenant: &str) -> String {
        self.admit(tenant, "demo.echo").await["execution_id"]
            .as_str()
            .unwrap()
            .to_owned()
    }
}

/// One call of the API as `who`, with whatever it needs set up first (by the platform
/// admin); returns the status the caller saw.
async fn call(app: &TestApp, who: &Who, name: &str) -> StatusCode {
    let send = |method: Method, path: String| app.request_as(who, method, &path);
    let res = match name {
        "admit" => send(Method::POST, "/api/executions".into())
            .json(&json!({"flow_id": "demo.echo"}))
            .send(),
        "dry_run" => send(Method::POST, "/api/executions/dry-run".into())
            .json(&json!({"flow_id": "demo.echo"}))
            .send(),
        "get" => {
            let id = app.admitted_id("acme").await;
            send(Method::GET, format!("/api/executions/{id}")).send()
        }
        "list" => send(Method::GET, "/api/executions".into()).send(),
        "cancel" => {
            let id = app.admitted_id("acme").await;
            send(Method::POST, format!("/api/executions/{id}/cancel")).send()
        }
        "delete" => {
            let id = app.admitted_id("acme").await;
            send(Method::DELETE, format!("/api/executions/{id}")).send()
        }
        "force_delete" => {
            let id = app.admitted_id("acme").await;
            send(Method::DELETE, format!("/api/executions/{id}?force=true")).send()
        }
        "get_tenant" => send(Method::GET, "/api/tenants/acme".into()).send(),
        "put_tenant" => send(Method::PUT, "/api/tenants/acme".into())
            .json(&json!({}))
            .send(),
        "list_tenants" => send(Method::GET, "/api/tenants".into()).send(),
        "delete_tenant" => {
            app.create_tenant("doomed").await;
            send(Method::DELETE, "/api/tenants/doomed".into()).send()
        }
        "create_key" => send(Method::POST, "/api/tenants/acme/api-keys".into())
            .json(&json!({"role": "viewer"}))
            .send(),
        "list_keys" => send(Method::GET, "/api/tenants/acme/api-keys".into()).send(),
        "revoke_key" => {
            let key = app.create_key("acme", "viewer").await;
            let id = key["key_id"].as_str().unwrap().to_owned();
            send(Method::DELETE, format!("/api/tenants/acme/api-keys/{id}")).send()
        }
        "retry" => {
            let id = app.admitted_id("acme").await;
            app.cancel("acme", &id).await;
            send(Method::POST, format!("/api/executions/{id}/retry")).send()
        }
        "dead_letters" => send(Method::GET, "/api/dlq".into()).send(),
        "queue_stats" => send(Method::GET, "/api/queues".into()).send(),
        "tenant_trends" => send(Method::GET, "/api/tenants/acme/trends".into()).send(),
        "trends" => send(Method::GET, "/api/trends".into()).send(),
        "me" => send(Method::GET, "/api/me".into()).send(),
        "reschedule" => {
            let id = app.admitted_id("acme").await;
            send(Method::POST, format!("/api/executions/{id}/reschedule"))
                .json(&json!({"delay": "1h"}))
                .send()
        }
        // No webhook is set: a caller with the role gets 404, one without it 403 first.
        "get_webhook" => send(Method::GET, "/api/tenants/acme/webhook".into()).send(),
        // An invalid `max`: a caller with the role gets 400 (and leases nothing), one without
        // it 403 first.
        "lease" => send(Method::POST, "/api/worker/lease?wait=0".into())
            .json(&json!({"worker_id": "w1", "max": 0}))
            .send(),
        // No such record: a caller with the role gets 404, one without it 403 first.
        "dismiss_dead_letter" => send(Method::DELETE, "/api/dlq/0/1-1".into()).send(),
        other => panic!("no call {other}"),
    };
    res.await.unwrap().status()
}

#[tokio::test]
async fn each_role_gets_exactly_its_calls() {
    let app = TestApp::spawn().await;
    app.create_tenant("acme").await;
    let callers = [
        ("viewer", Who::Key(app.key_token("acme", "viewer").await)),
        ("editor", Who::Key(app.key_token("acme", "editor").await)),
        ("admin", Who::Key(app.key_token("acme", "admin").await)),
        ("platform", Who::Platform("acme")),
    ];
    // Expected status for viewer, editor, tenant admin, platform admin.
    let matrix: [(&str, [u16; 4]); 22] = [
        ("admit", [403, 201, 201, 201]),
        ("dry_run", [403, 200, 200, 200]),
        ("get", [200, 200, 200, 200]),
        ("list", [200, 200, 200, 200]),
        ("cancel", [403, 200, 200, 200]),
        ("delete", [403, 200, 200, 200]),
        ("force_delete", [403, 403, 204, 204]),
        ("get_tenant", [403, 403, 200, 200]),
        ("put_tenant", [403, 403, 403, 200]),
        ("list_tenants", [403, 403, 403, 200]),
        ("delete_tenant", [403, 403, 403, 204]),
        ("create_key", [403, 403, 201, 201]),
        ("list_keys", [403, 403, 200, 200]),
        ("revoke_key", [403, 403, 204, 204]),
        ("retry", [403, 200, 200, 200]),
        ("dead_letters", [200, 200, 200, 200]),
        ("queue_stats", [403, 403, 403, 200]),
        ("tenant_trends", [403, 403, 200, 200]),
        ("trends", [403, 403, 403, 200]),
        ("me", [200, 200, 200, 200]),
        ("dismiss_dead_letter", [403, 404, 404, 404]),
        ("get", [200, 200, 200, 200]),
    ];
    let mut wrong = Vec::new();
    for (name, expected) in matrix {
        for ((role, who), want) in callers.iter().zip(expected) {
            let got = call(&app, who, name).await;
            if got.as_u16() != want {
                wrong.push(format!("{role} {name}: got {got}, want {want}"));
            }
        }
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
}

/// `GET /api/me` lists what the caller may do; each action is taken here by the call it
/// names, and the server must allow exactly the listed ones (anything but 403) and refuse the
/// others (403). The console offers what this list says, so a list that drifted from the
/// handlers' checks would offer buttons that fail or hide ones that work.
#[tokio::test]
async fn me_lists_exactly_the_actions_the_server_allows() {
    let app = TestApp::spawn().await;
    app.create_tenant("acme").await;
    // Each action `may` can name, and the call that takes it.
    let taken_by = [
        ("read", "list"),
        ("admit", "admit"),
        ("cancel", "cancel"),
        ("retry", "retry"),
        ("reschedule", "reschedule"),
        ("dismiss_dead_letters", "dismiss_dead_letter"),
        ("force_delete", "force_delete"),
        ("manage_tenant", "get_tenant"),
        ("manage_api_keys", "list_keys"),
        ("manage_webhook", "get_webhook"),
        ("read_trends", "tenant_trends"),
        ("pull_work", "lease"),
        ("manage_platform", "list_tenants"),
    ];
    let callers = [
        ("viewer", Who::Key(app.key_token("acme", "viewer").await)),
        ("editor", Who::Key(app.key_token("acme", "editor").await)),
        ("admin", Who::Key(app.key_token("acme", "admin").await)),
        ("platform", Who::Platform("acme")),
    ];
    let mut wrong = Vec::new();
    let mut listed_by = Vec::new();
    for (role, who) in &callers {
        let res = app
            .request_as(who, Method::GET, "/api/me")
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "{role}");
        let me: Value = res.json().await.unwrap();
        let may: Vec<String> = me["may"]
            .as_array()
            .unwrap_or_else(|| panic!("{role}: no may in {me}"))
            .iter()
            .map(|a| a.as_str().unwrap().to_owned())
            .collect();
        for listed in &may {
            assert!(
                taken_by.iter().any(|(a, _)| a == listed),
                "{role} may {listed}, which this test does not know how to take"
            );
        }
        for (action, name) in taken_by {
            let status = call(&app, who, name).await;
            let listed = may.iter().any(|a| a == action);
            if listed != (status != StatusCode::FORBIDDEN) || status == StatusCode::UNAUTHORIZED {
                wrong.push(format!(
                    "{role}: {action} listed {listed}, {name} answered {status}"
                ));
            }
        }
        listed_by.push((*role, may));
    }
    assert!(wrong.is_empty(), "{wrong:#?}");
    // The platform admin may do everything, a viewer only read: the list is not empty or full
    // by accident.
    let count = |role: &str| listed_by.iter().find(|(r, _)| *r == role).unwrap().1.len();
    assert_eq!(count("platform"), taken_by.len());
    assert_eq!(count("viewer"), 1);
    assert!(count("viewer") < count("editor") && count("editor") < count("admin"));

    // A worker key reaches only the pull API, `/api/me` included, and may pull.
    let worker = Who::Key(app.key_token("acme", "worker").await);
    let res = app
        .request_as(&worker, Method::GET, "/api/me")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert_eq!(call(&app, &worker, "lease").await, StatusCode::BAD_REQUEST);
}

#[tokio::test]
async fn a_tenant_key_never_reaches_another_tenants_executions() {
    let app = TestApp::spawn().await;
    for t in ["tenant-a", "tenant-b"] {
        app.create_tenant(t).await;
    }
    let a = Who::Key(app.key_token("tenant-a", "admin").await);
    let b = Who::Key(app.key_token("tenant-b", "admin").await);
    let mine = app.request_as(&a, Method::POST, "/api/executions");
    let res = mine
        .json(&json!({"flow_id": "demo.echo"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let a_id = res.json::<Value>().await.unwrap()["execution_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let b_id = app.admitted_id("tenant-b").await;

    // Every call on B's execution with A's key is a 404, exactly as for an unknown id.
    for (method, path) in [
        (Method::GET, format!("/api/executions/{b_id}")),
        (Method::POST, format!("/api/executions/{b_id}/cancel")),
        (Method::DELETE, format!("/api/executions/{b_id}")),
        (Method::DELETE, format!("/api/executions/{b_id}?force=true")),
    ] {
        let res = app
            .request_as(&a, method.clone(), &path)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::NOT_FOUND, "{method} {path}");
        assert_eq!(problem_code(res).await, "execution_not_found");
    }
    // B's execution is untouched.
    let got = app.execution("tenant-b", &b_id).await;
    assert_eq!(got["status"], "queued");
    assert_eq!(got["cancel_requested"], false);

    // Each list shows only its own tenant's rows.
    for (who, own, other) in [(&a, &a_id, &b_id), (&b, &b_id, &a_id)] {
        let page: Value = app
            .request_as(who, Method::GET, "/api/executions")
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let ids: Vec<&str> = page["executions"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| e["execution_id"].as_str().unwrap())
            .collect();
        assert_eq!(ids, vec![own.as_str()]);
        assert!(!ids.contains(&other.as_str()));
        assert_eq!(page["total"], 1);
    }

    // Naming the other tenant explicitly is refused, not honoured.
    let res = app
        .request_as(&a, Method::GET, "/api/executions")
        .header("X-Tenant-Id", "tenant-b")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert_eq!(problem_code(res).await, "tenant_mismatch");
    for path in ["/api/tenants/tenant-b", "/api/tenants/tenant-b/api-keys"] {
        let res = app.request_as(&a, Method::GET, path).send().await.unwrap();
        assert_eq!(res.status(), StatusCode::FORBIDDEN, "{path}");
        assert_eq!(problem_code(res).await, "tenant_mismatch");
    }
    // The same header naming its own tenant is fine.
    let res = app
        .request_as(&a, Method::GET, "/api/executions")
        .header("X-Tenant-Id", "tenant-a")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
}

#[tokio::test]
async fn a_revoked_key_is_refused_on_the_next_call() {
    let app = TestApp::spawn().await;
    app.create_tenant("acme").await;
    let key = app.create_key("acme", "editor").await;
    let who = Who::Key(key["token"].as_str().unwrap().to_owned());
    let list = || app.request_as(&who, Method::GET, "/api/executions").send();
    assert_eq!(list().await.unwrap().status(), StatusCode::OK);

    let id = key["key_id"].as_str().unwrap();
    let res = app
        .client
        .delete(app.url(&format!("/api/tenants/acme/api-keys/{id}")))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);

    let res = list().await.unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(problem_code(res).await, "unauthorized");
    // Revoking again: it is gone.
    let res = app
        .client
        .delete(app.url(&format!("/api/tenants/acme/api-keys/{id}")))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    assert_eq!(problem_code(res).await, "api_key_not_found");
}

#[tokio::test]
async fn a_tenant_admin_manages_its_own_keys_and_may_revoke_itself() {
    let app = TestApp::spawn().await;
    app.create_tenant("acme").await;
    let admin = app.create_key("acme", "admin").await;
    let who = Who::Key(admin["token"].as_str().unwrap().to_owned());

    let res = app
        .request_as(&who, Method::POST, "/api/tenants/acme/api-keys")
        .json(&json!({"role": "viewer", "name": "dashboard"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let created: Value = res.json().await.unwrap();
    assert_eq!(created["role"], "viewer");
    assert_eq!(created["tenant_id"], "acme");
    let viewer = Who::Key(created["token"].as_str().unwrap().to_owned());
    let res = app
        .request_as(&viewer, Method::GET, "/api/executions")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);

    // Listed by id, name and role; never by value.
    let listed: Value = app
        .request_as(&who, Method::GET, "/api/tenants/acme/api-keys")
        .send()
        .await
        .unwrap()
        .json()
        .await
        .unwrap();
    let keys = listed["api_keys"].as_array().unwrap();
    assert_eq!(keys.len(), 2);
    let text = listed.to_string();
    for token in [&admin["token"], &created["token"]] {
        let token = token.as_str().unwrap();
        let secret = token.rsplit('_').next().unwrap();
        assert!(!text.contains(secret));
    }
    assert!(keys.iter().all(|k| k.get("token").is_none()));

    let own_id = admin["key_id"].as_str().unwrap();
    let res = app
        .request_as(
            &who,
            Method::DELETE,
            &format!("/api/tenants/acme/api-keys/{own_id}"),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    let res = app
        .request_as(&who, Method::GET, "/api/tenants/acme/api-keys")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
}

#[tokio::test]
async fn redis_holds_only_a_hash_of_each_key() {
    let app = TestApp::spawn().await;
    app.create_tenant("acme").await;
    let token = app.key_token("acme", "admin").await;
    let secret = token.rsplit('_').next().unwrap().to_owned();
    let mut conn = app.redis.conn().await;
    for key in app.redis.keys().await {
        let kind: String = redis::cmd("TYPE")
            .arg(&key)
            .query_async(&mut conn)
            .await
            .unwrap();
        let dump = match kind.as_str() {
            "hash" => format!(
                "{:?}",
                redis::cmd("HGETALL")
                    .arg(&key)
                    .query_async::<Vec<String>>(&mut conn)
                    .await
                    .unwrap()
            ),
            "set" => format!(
                "{:?}",
                redis::cmd("SMEMBERS")
                    .arg(&key)
                    .query_async::<Vec<String>>(&mut conn)
                    .await
                    .unwrap()
            ),
            _ => String::new(),
        };
        assert!(!dump.contains(&secret), "{key} holds the secret");
        assert!(!key.contains(&secret));
    }
}

#[tokio::test]
async fn bad_credentials_are_401() {
    let app = TestApp::spawn().await;
    app.create_tenant("acme").await;
    let real = app.create_key("acme", "admin").await;
    let real_token = real["token"].as_str().unwrap().to_owned();
    let real_id = real["key_id"].as_str().unwrap().to_owned();
    let wrong_secret = format!("sk_{real_id}_{}", "0".repeat(64));
    let unknown_id = format!("sk_0123456789abcdef_{}", "a".repeat(64));
    let long = format!("Bearer {}", "x".repeat(8_000));
    let cases: Vec<(&str, Option<String>)> = vec![
        ("no header", None),
        ("empty bearer", Some("Bearer ".into())),
        ("bare scheme", Some("Bearer".into())),
        ("other scheme", Some(format!("Basic {ADMIN_TOKEN}"))),
        ("no scheme", Some(ADMIN_TOKEN.into())),
        (
            "wrong admin token",
            Some("Bearer not-the-admin-token".into()),
        ),
        ("very long token", Some(long)),
        ("malformed key", Some("Bearer sk_nothex_123".into())),
        ("unknown key id", Some(format!("Bearer {unknown_id}"))),
        ("wrong secret", Some(format!("Bearer {wrong_secret}"))),
    ];
    for (what, header) in cases {
        let mut req = app
            .client
            .get(app.url("/api/executions"))
            .header("X-Tenant-Id", "acme");
        if let Some(h) = header {
            req = req.header("Authorization", h);
        }
        let res = req.send().await.unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED, "{what}");
        assert_eq!(
            res.headers().get("www-authenticate").unwrap(),
            "Bearer",
            "{what}"
        );
        assert_eq!(problem_code(res).await, "unauthorized", "{what}");
    }
    // Without a credential, even a malformed X-Tenant-Id is only a 401: nothing is validated
    // for a stranger.
    let res = app
        .client
        .get(app.url("/api/executions"))
        .header("X-Tenant-Id", "not a tenant!")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);

    // The scheme is case-insensitive (RFC 9110).
    let res = app
        .client
        .get(app.url("/api/executions"))
        .header("Authorization", format!("bearer {real_token}"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);

    // The key of a deleted tenant is dead, also if the tenant is created again.
    let res = app
        .client
        .delete(app.url("/api/tenants/acme"))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    for _ in 0..2 {
        let res = app
            .client
            .get(app.url("/api/executions"))
            .bearer_auth(&real_token)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
        app.create_tenant("acme").await;
    }
}

#[tokio::test]
async fn the_tenant_registry_lists_creates_and_deletes() {
    let app = TestApp::spawn().await;
    let list = || async {
        let res = app
            .client
            .get(app.url("/api/tenants"))
            .bearer_auth(ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK);
        let body: Value = res.json().await.unwrap();
        body["tenants"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| t["tenant_id"].as_str().unwrap().to_owned())
            .collect::<Vec<_>>()
    };
    assert!(list().await.is_empty());
    app.put_tenant("zeta", &json!({"max_concurrent": 3})).await;
    app.create_tenant("alpha").await;
    app.put_tenant("zeta", &json!({"max_concurrent": 4})).await;
    assert_eq!(list().await, vec!["alpha", "zeta"]);

    // A key needs a registered tenant.
    let res = app
        .client
        .post(app.url("/api/tenants/nobody/api-keys"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"role": "admin"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    assert_eq!(problem_code(res).await, "tenant_not_found");

    let del = |t: &'static str| {
        app.client
            .delete(app.url(&format!("/api/tenants/{t}")))
            .bearer_auth(ADMIN_TOKEN)
            .send()
    };
    assert_eq!(del("zeta").await.unwrap().status(), StatusCode::NO_CONTENT);
    assert_eq!(list().await, vec!["alpha"]);
    let res = del("zeta").await.unwrap();
    assert_eq!(res.status(), StatusCode::NOT_FOUND);
    assert_eq!(problem_code(res).await, "tenant_not_found");
}

#[tokio::test]
async fn a_disabled_tenant_reads_but_admits_nothing() {
    let app = TestApp::spawn().await;
    app.create_tenant("acme").await;
    let editor = Who::Key(app.key_token("acme", "editor").await);
    let id = app.admitted_id("acme").await;
    app.put_tenant("acme", &json!({"enabled": false})).await;

    let res = app
        .request_as(&editor, Method::POST, "/api/executions")
        .json(&json!({"flow_id": "demo.echo"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
    assert_eq!(problem_code(res).await, "tenant_disabled");
    // Work already admitted is untouched and readable.
    let res = app
        .request_as(&editor, Method::GET, &format!("/api/executions/{id}"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let e: Value = res.json().await.unwrap();
    assert_eq!(e["status"], "queued");
    // Still in its tenant's queue, ready to start: disabling stops admissions, not work.
    assert_eq!(e["queue_state"], "ready");
    assert_eq!(app.queue_ids("acme").await, [id]);
    assert_eq!(app.runnable_tenants("acme").await, ["acme"]);
}

#[tokio::test]
async fn invalid_key_requests_are_400() {
    let app = TestApp::spawn().await;
    app.create_tenant("acme").await;
    for body in [
        json!({"role": "owner"}),
        json!({}),
        json!({"role": "viewer", "name": ""}),
        json!({"role": "viewer", "extra": 1}),
    ] {
        let res = app
            .client
            .post(app.url("/api/tenants/acme/api-keys"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&body)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{body}");
    }
}

/// Issue 19: a name that reads as something else in a listing ("ci" with a right-to-left
/// override, a zero-width space) is refused like a control character; so is a dedup key that
/// would look like another one.
#[tokio::test]
async fn invisible_and_bidirectional_characters_are_refused_in_key_names_and_dedup_keys() {
    let app = TestApp::spawn().await;
    app.create_tenant("acme").await;
    for name in [
        "ci\u{202E}gnp.exe",
        "c\u{200B}i",
        "\u{FEFF}ci",
        "ci\u{2066}x\u{2069}",
    ] {
        let res = app
            .client
            .post(app.url("/api/tenants/acme/api-keys"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({"role": "viewer", "name": name}))
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{name:?}");
        assert_eq!(problem_code(res).await, "invalid_key_name");
    }
    for key in ["order\u{200B}42", "order\u{202E}24", "order\u{200D}42"] {
        let res = app
            .post_execution("acme", &json!({"flow_id": "demo.echo", "dedup_key": key}))
            .await;
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{key:?}");
        assert_eq!(problem_code(res).await, "invalid_dedup_key");
    }
    assert_eq!(app.row_count().await, 0, "nothing admitted");
    // Names and keys in any script are fine.
    let res = app
        .client
        .post(app.url("/api/tenants/acme/api-keys"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"role": "viewer", "name": "сборка ci"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
}

/// Issue 19: a one-character `--admin-token` used to be accepted. The server now refuses to
/// start with one shorter than 16 bytes, and says why.
#[tokio::test]
async fn a_short_admin_token_is_refused_at_start() {
    let redis = crate::helpers::TestRedis::start().await;
    let mut api = sluice::config::ApiSettings::defaults();
    api.listen = "127.0.0.1:0".parse().unwrap();
    let mut config = sluice::config::AppConfig {
        api,
        redis: redis.settings(),
    };
    for short in ["x", "change-me", "fifteen-bytes!!"] {
        config.api.admin_token = Some(short.into());
        let refused = sluice::Application::build(config.clone()).await;
        let error = format!("{:#}", refused.err().expect("refused"));
        assert!(error.contains("at least 16"), "{error}");
    }
    config.api.admin_token = Some("sixteen-bytes-ok".into());
    assert!(sluice::Application::build(config).await.is_ok());
}

#[tokio::test]
async fn keys_minted_under_dev_auth_never_work_on_a_server_that_authenticates() {
    let dev = TestApp::spawn_with(|c| {
        c.api.dev_auth = true;
        c.api.admin_token = None;
    })
    .await;
    let normal = dev
        .spawn_beside(|c| {
            c.api.dev_auth = false;
            c.api.admin_token = Some(ADMIN_TOKEN.into());
        })
        .await;
    // In dev mode anybody registers a tenant and mints a key, without credentials.
    let res = dev
        .client
        .put(dev.url("/api/tenants/acme"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let res = dev
        .client
        .post(dev.url("/api/tenants/acme/api-keys"))
        .json(&json!({"role": "admin"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let dev_token = res.json::<Value>().await.unwrap()["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let list = |base: String, token: String| {
        let client = dev.client.clone();
        async move {
            client
                .get(format!("{base}/api/executions"))
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
        }
    };
    let normal_base = format!("http://{normal}");
    // The dev server takes it; the authenticating one on the same Redis does not.
    let res = list(dev.url(""), dev_token.clone()).await;
    assert_eq!(res.status(), StatusCode::OK);
    let res = list(normal_base.clone(), dev_token).await;
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
    assert_eq!(problem_code(res).await, "unauthorized");
    // A key minted with real authentication works on both.
    let res = dev
        .client
        .post(format!("{normal_base}/api/tenants/acme/api-keys"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"role": "viewer"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let token = res.json::<Value>().await.unwrap()["token"]
        .as_str()
        .unwrap()
        .to_owned();
    assert_eq!(
        list(normal_base, token.clone()).await.status(),
        StatusCode::OK
    );
    assert_eq!(list(dev.url(""), token).await.status(), StatusCode::OK);
}

#[tokio::test]
async fn the_answer_carrying_a_token_is_never_cached() {
    let app = TestApp::spawn().await;
    app.create_tenant("acme").await;
    let res = app
        .client
        .post(app.url("/api/tenants/acme/api-keys"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"role": "viewer"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    assert_eq!(res.headers()["cache-control"], "no-store");
}

#[tokio::test]
async fn the_role_is_checked_before_the_body_is_looked_at() {
    let app = TestApp::spawn().await;
    app.create_tenant("acme").await;
    let viewer = Who::Key(app.key_token("acme", "viewer").await);
    let tenant_admin = Who::Key(app.key_token("acme", "admin").await);
    let bodies: [(&str, Vec<u8>); 4] = [
        ("application/json", b"{not json".to_vec()),
        ("application/json", br#"{"unknown": 1}"#.to_vec()),
        ("text/plain", b"hello".to_vec()),
        ("application/json", vec![b' '; 2 * 1024 * 1024]),
    ];
    let calls = [
        (&viewer, Method::POST, "/api/executions"),
        (&tenant_admin, Method::PUT, "/api/tenants/acme"),
        (&viewer, Method::POST, "/api/tenants/acme/api-keys"),
    ];
    for (who, method, path) in calls {
        for (content_type, body) in &bodies {
            let res = app
                .request_as(who, method.clone(), path)
                .header("Content-Type", *content_type)
                .body(body.clone())
                .send()
                .await
                .unwrap();
            assert_eq!(res.status(), StatusCode::FORBIDDEN, "{method} {path}");
            assert_eq!(problem_code(res).await, "insufficient_role");
        }
    }
    // With the role, the same bodies are judged on their merits.
    let editor = Who::Key(app.key_token("acme", "editor").await);
    let res = app
        .request_as(&editor, Method::POST, "/api/executions")
        .header("Content-Type", "application/json")
        .body("{not json")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    // Listing tenants: the query is not parsed for a caller who may not list.
    let res = app
        .request_as(&tenant_admin, Method::GET, "/api/tenants?limit=zero")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::FORBIDDEN);
}

#[tokio::test]
async fn a_tenant_has_a_bounded_number_of_keys() {
    let app = TestApp::spawn_with(|c| c.api.max_api_keys_per_tenant = 2).await;
    app.create_tenant("acme").await;
    let first = app.create_key("acme", "viewer").await;
    app.create_key("acme", "viewer").await;
    let create = || {
        app.client
            .post(app.url("/api/tenants/acme/api-keys"))
            .bearer_auth(ADMIN_TOKEN)
            .json(&json!({"role": "viewer"}))
            .send()
    };
    let res = create().await.unwrap();
    assert_eq!(res.status(), StatusCode::CONFLICT);
    assert_eq!(problem_code(res).await, "too_many_api_keys");
    // Revoking one makes room again.
    let id = first["key_id"].as_str().unwrap();
    let res = app
        .client
        .delete(app.url(&format!("/api/tenants/acme/api-keys/{id}")))
        .bearer_auth(ADMIN_TOKEN)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::NO_CONTENT);
    assert_eq!(create().await.unwrap().status(), StatusCode::CREATED);
}

#[tokio::test]
async fn a_refusal_names_the_role_the_call_needs_as_the_api_spells_it() {
    let app = TestApp::spawn().await;
    app.create_tenant("acme").await;
    let viewer = Who::Key(app.key_token("acme", "viewer").await);
    let editor = Who::Key(app.key_token("acme", "editor").await);
    let admin = Who::Key(app.key_token("acme", "admin").await);
    let id = app.admitted_id("acme").await;
    let force = format!("/api/executions/{id}?force=true");
    let cases = [
        (&viewer, Method::POST, "/api/executions", "the editor role"),
        (&editor, Method::DELETE, force.as_str(), "the admin role"),
        (
            &admin,
            Method::GET,
            "/api/tenants",
            "the platform admin token",
        ),
    ];
    for (who, method, path, needs) in cases {
        let mut req = app.request_as(who, method.clone(), path);
        if method == Method::POST {
            req = req.json(&json!({"flow_id": "demo.echo"}));
        }
        let res = req.send().await.unwrap();
        assert_eq!(res.status(), StatusCode::FORBIDDEN, "{method} {path}");
        let problem: Value = res.json().await.unwrap();
        assert_eq!(problem["code"], "insufficient_role", "{problem}");
        let detail = problem["detail"].as_str().unwrap();
        assert_eq!(
            detail,
            format!("this call needs {needs}"),
            "{method} {path}"
        );
    }
}

/// Issue 19, item 8: a dev-auth server answers only what a local tool sends. A page whose DNS
/// name was rebound to 127.0.0.1 (simulated by resolving a made-up name to the server's
/// loopback address) and a cross-site form post (an `Origin` of another site) are refused
/// with a 403 problem before anything is read or written; loopback names in every spelling
/// and the server's own origin are served.
#[tokio::test]
async fn dev_auth_serves_only_loopback_hosts_and_its_own_origin() {
    let app = TestApp::spawn_with(|c| {
        c.api.dev_auth = true;
        c.api.admin_token = None;
    })
    .await;
    let port = app.addr.port();
    let rebound = sluice::tls::client_builder(&[])
        .unwrap()
        .resolve("rebound.example", app.addr)
        .build()
        .unwrap();
    let foreign = |method: Method, path: &str| {
        rebound.request(method, format!("http://rebound.example:{port}{path}"))
    };
    let refusals = [
        foreign(Method::GET, "/api/tenants"),
        foreign(Method::PUT, "/api/tenants/acme").json(&json!({})),
        foreign(Method::POST, "/api/tenants/acme/api-keys").json(&json!({"role": "admin"})),
        foreign(Method::GET, "/api/me"),
        foreign(Method::GET, "/console/"),
    ];
    for req in refusals {
        let res = req.send().await.unwrap();
        assert_eq!(res.status(), StatusCode::FORBIDDEN);
        assert_eq!(
            res.headers()["content-type"],
            "application/problem+json",
            "a problem document"
        );
        assert_eq!(problem_code(res).await, "dev_auth_host_refused");
    }
    // Nothing was registered by the refused calls.
    let listed = app
        .client
        .get(app.url("/api/tenants"))
        .send()
        .await
        .unwrap();
    assert_eq!(listed.status(), StatusCode::OK);
    assert_eq!(listed.json::<Value>().await.unwrap()["tenants"], json!([]));

    // Loopback names, however spelt, are served.
    for host in [
        format!("localhost:{port}"),
        format!("LocalHost.:{port}"),
        format!("127.0.0.1:{port}"),
        format!("127.0.0.2:{port}"),
        format!("[::1]:{port}"),
    ] {
        let res = app
            .client
            .get(app.url("/api/me"))
            .header("host", &host)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::OK, "Host: {host}");
    }

    // A cross-site form post needs no preflight: refused by its Origin, nothing pinned.
    app.client
        .put(app.url("/api/tenants/acme"))
        .json(&json!({}))
        .send()
        .await
        .unwrap();
    for origin in [
        "http://evil.example",
        "null",
        &format!("http://127.0.0.1:{}", port + 1),
    ] {
        let res = app
            .client
            .post(app.url("/api/tenants/acme/dedicated-shard"))
            .header("origin", origin)
            .header("content-type", "text/plain")
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::FORBIDDEN, "Origin: {origin}");
        assert_eq!(problem_code(res).await, "dev_auth_origin_refused");
    }
    // A cross-site request without Origin (an image, a link) is known by Sec-Fetch-Site.
    let res = app
        .client
        .get(app.url("/api/tenants"))
        .header("sec-fetch-site", "cross-site")
        .send()
        .await
        .unwrap();
    assert_eq!(problem_code(res).await, "dev_auth_origin_refused");
    let pins: std::collections::HashMap<String, String> = app
        .redis
        .query(redis::cmd("HGETALL").arg("sluice:{meta}:pins"))
        .await;
    assert!(pins.is_empty(), "no dedicated shard was taken: {pins:?}");

    // The server's own pages (the console, Swagger UI) are same-origin: served.
    let res = app
        .client
        .post(app.url("/api/tenants/acme/dedicated-shard"))
        .header("origin", format!("http://127.0.0.1:{port}"))
        .header("sec-fetch-site", "same-origin")
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);

    // A server that authenticates serves any host: a rebound page holds no credential.
    let normal = TestApp::spawn().await;
    let res = sluice::tls::client_builder(&[])
        .unwrap()
        .resolve("rebound.example", normal.addr)
        .build()
        .unwrap()
        .get(format!(
            "http://rebound.example:{}/api/tenants",
            normal.addr.port()
        ))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::UNAUTHORIZED);
}

/// `{acl}` lookups (api_key_auth.lua's SISMEMBER: no other script sends one) so far.
async fn key_lookups(app: &TestApp) -> u64 {
    app.redis
        .command_calls()
        .await
        .iter()
        .find(|(c, _)| c == "sismember")
        .map_or(0, |(_, n)| *n)
}

/// A verified key is taken on trust for `HIT_TTL`: its admissions do not each read the one
/// `{acl}` slot, which would cap a whole cluster's authenticated request rate; and the many
/// requests that find its trust run out at once ask Redis once between them.
#[tokio::test]
async fn a_verified_key_is_looked_up_once_per_half_second_not_per_request() {
    use sluice::revocation::HIT_TTL;
    let app = TestApp::spawn().await;
    app.create_tenant("acme").await;
    let token = app.key_token("acme", "editor").await;
    let before = key_lookups(&app).await;
    let started = std::time::Instant::now();
    const TASKS: usize = 16;
    const EACH: usize = 25;
    let tasks: Vec<_> = (0..TASKS)
        .map(|_| {
            let (client, url, token) = (
                app.client.clone(),
                app.url("/api/executions"),
                token.clone(),
            );
            tokio::spawn(async move {
                for _ in 0..EACH {
                    let res = client
                        .post(&url)
                        .bearer_auth(&token)
                        .json(&json!({"flow_id": "demo.echo"}))
                        .send()
                        .await
                        .unwrap();
                    assert_eq!(res.status(), StatusCode::CREATED);
                }
            })
        })
        .collect();
    for t in tasks {
        t.await.unwrap();
    }
    let elapsed = started.elapsed();
    let lookups = key_lookups(&app).await - before;
    // One when the key is first seen, then at most one each time its trust runs out.
    let most = 1 + (elapsed.as_millis() / HIT_TTL.as_millis()) as u64;
    assert!(
        (1..=most).contains(&lookups),
        "{lookups} key lookups for {} admissions by {TASKS} tasks in {elapsed:?}",
        TASKS * EACH
    );
}

/// Behind a stalled Redis, the requests of one key that wait on its lookup share that lookup's
/// failure: each is answered 503 about one Redis time-out after it came, not one time-out for
/// every request queued ahead of it (eight requests once took eight time-outs, the last
/// waiting 3.2 s here) — and they ask Redis once between them, not once each.
#[tokio::test]
async fn requests_queued_on_a_failed_key_lookup_share_its_failure() {
    use std::time::{Duration, Instant};
    const TIMEOUT_MS: u64 = 400;
    const REQUESTS: usize = 8;
    let app = TestApp::spawn_with(|c| c.redis.redis_timeout_ms = TIMEOUT_MS).await;
    app.create_tenant("acme").await;
    // Never used yet, so not taken on trust: its first request looks it up.
    let token = app.key_token("acme", "viewer").await;
    let before = key_lookups(&app).await;
    app.redis.signal("STOP");
    let tasks: Vec<_> = (0..REQUESTS)
        .map(|_| {
            let req = app
                .client
                .get(app.url("/api/executions"))
                .bearer_auth(&token);
            tokio::spawn(async move {
                let sent = Instant::now();
                let res = req.send().await.unwrap();
                (res.status(), problem_code(res).await, sent.elapsed())
            })
        })
        .collect();
    let mut answers = Vec::new();
    for t in tasks {
        answers.push(t.await.unwrap());
    }
    app.redis.signal("CONT");
    let slowest = answers.iter().map(|(_, _, took)| *took).max().unwrap();
    for (status, code, _) in &answers {
        assert_eq!(
            (*status, code.as_str()),
            (StatusCode::SERVICE_UNAVAILABLE, "redis_unavailable"),
            "{answers:?}"
        );
    }
    // Each waited for at most the lookup under way when it came and the one after it; taking
    // turns, the last would have waited REQUESTS time-outs.
    assert!(
        slowest < Duration::from_millis(TIMEOUT_MS * REQUESTS as u64 / 2),
        "slowest answer after {slowest:?}: {answers:?}"
    );
    // What was sent during the stall runs once Redis is back: the answer to this request
    // comes after it.
    let res = app
        .client
        .get(app.url("/api/executions"))
        .bearer_auth(&token)
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    let lookups = key_lookups(&app).await - before;
    // The stalled ones (the first, and one more if requests came after it failed) and the one
    // after the stall; the stalled ones count only if Redis read them after all.
    assert!(
        (1..=REQUESTS as u64 / 2).contains(&lookups),
        "{lookups} key lookups"
    );
}

/// A key withdrawn on Redis is refused by a server that had verified it, with or without the
/// news: the news forgets it at once, its trust runs out without.
#[tokio::test]
async fn a_withdrawn_key_is_refused_by_every_server_with_or_without_the_news() {
    let app = TestApp::spawn().await;
    let other = app.spawn_beside(|_| {}).await;
    app.create_tenant("acme").await;
    let on_other = |token: String| {
        let client = app.client.clone();
        async move {
            client
                .get(format!("http://{other}/api/executions"))
                .bearer_auth(token)
                .send()
                .await
                .unwrap()
                .status()
        }
    };
    let refused_soon = |token: String, what: &'static str| async move {
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while on_other(token.clone()).await != StatusCode::UNAUTHORIZED {
            assert!(std::time::Instant::now() < deadline, "{what}: still served");
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        // And from then on.
        for _ in 0..5 {
            assert_eq!(
                on_other(token.clone()).await,
                StatusCode::UNAUTHORIZED,
                "{what}"
            );
        }
    };
    // Revoked through the API of the first server: the second hears it.
    let key = app.create_key("acme", "viewer").await;
    let token = key["token"].as_str().unwrap().to_owned();
    assert_eq!(on_other(token.clone()).await, StatusCode::OK);
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
    refused_soon(token, "revoked with the news").await;
    // Taken out of its tenant's key set behind sluice's back: no news at all.
    let key = app.create_key("acme", "viewer").await;
    let token = key["token"].as_str().unwrap().to_owned();
    assert_eq!(on_other(token.clone()).await, StatusCode::OK);
    let _: i64 = app
        .redis
        .query(
            redis::cmd("SREM")
                .arg("sluice:{acl}:t:acme:keys")
                .arg(key["key_id"].as_str().unwrap()),
        )
        .await;
    refused_soon(token, "withdrawn without news").await;
}

/// Script calls (each a key lookup here: no sweeper, no orphan scan, no admission) so far.
async fn script_calls(app: &TestApp) -> u64 {
    app.redis
        .command_calls()
        .await
        .iter()
        .filter(|(c, _)| c.starts_with("eval"))
        .map(|(_, n)| n)
        .sum()
}

/// Made-up tokens, each with a new key id, cost Redis at most the server's budget for
/// unknown ids (a burst of 10 s of `--unknown-key-lookups-per-second`, then that rate),
/// however many and however often repeated: 3,000 of them, each sent twice, and then one of
/// them a thousand times (a flood larger than the misses a server remembers once flushed that
/// memory, so every unknown token cost a lookup again; now the budget bounds the lookups
/// whatever the number). Past the budget they are answered
/// 503 `key_lookups_busy`, never served. Meanwhile a key created on another server works
/// here at once (its creation is news), and a real key this server has verified is never
/// held back by the budget.
#[tokio::test]
async fn made_up_tokens_cost_redis_at_most_the_budget_for_unknown_ids() {
    use std::collections::BTreeMap;
    use std::time::{Duration, Instant};
    const RATE: u32 = 20;
    const BURST: u64 = RATE as u64 * 10;
    const TOKENS: usize = 3_000;
    const TASKS: usize = 16;
    let app = TestApp::spawn_with(|c| {
        c.api.unknown_key_lookups_per_second = RATE;
        // Nothing else may call a script: every call counted is a key lookup.
        c.api.sweep_interval_secs = 0;
        c.api.orphan_scan_ms = 0;
    })
    .await;
    let other = app
        .spawn_beside(|c| c.api.unknown_key_lookups_per_second = RATE)
        .await;
    app.create_tenant("acme").await;
    let known = app.key_token("acme", "viewer").await;
    let client = app.client.clone();
    let get = move |base: String, token: String| {
        let client = client.clone();
        async move {
            let res = client
                .get(format!("{base}/api/executions"))
                .bearer_auth(token)
                .send()
                .await
                .unwrap();
            let status = res.status();
            let code = match status {
                StatusCode::OK => "ok".to_owned(),
                _ => problem_code(res).await,
            };
            (status, code)
        }
    };
    let base = app.url("");
    assert_eq!(get(base.clone(), known.clone()).await.0, StatusCode::OK);
    let made_up = |i: usize| format!("sk_{:016x}_{}", 0x5eed_0000_0000 + i, "ab".repeat(32));
    app.redis.reset_stats().await;
    let started = Instant::now();
    // Every made-up token twice, from 16 tasks at once.
    let tasks: Vec<_> = (0..TASKS)
        .map(|t| {
            let (base, get) = (base.clone(), get.clone());
            tokio::spawn(async move {
                let mut seen: BTreeMap<(StatusCode, String), usize> = BTreeMap::new();
                for _round in 0..2 {
                    for i in (t..TOKENS).step_by(TASKS) {
                        let answer = get(base.clone(), made_up(i)).await;
                        *seen.entry(answer).or_default() += 1;
                    }
                }
                seen
            })
        })
        .collect();
    // While the flood runs: a key created through the other server works here at once, and
    // the key this server verified keeps working.
    tokio::time::sleep(Duration::from_millis(500)).await;
    let res = app
        .client
        .post(format!("http://{other}/api/tenants/acme/api-keys"))
        .bearer_auth(ADMIN_TOKEN)
        .json(&json!({"role": "viewer"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::CREATED);
    let fresh = res.json::<Value>().await.unwrap()["token"]
        .as_str()
        .unwrap()
        .to_owned();
    let deadline = Instant::now() + Duration::from_secs(2);
    loop {
        let (status, code) = get(base.clone(), fresh.clone()).await;
        if status == StatusCode::OK {
            break;
        }
        // Only until the news of its creation arrives, and never a 401.
        assert_eq!(code, "key_lookups_busy", "{status}");
        assert!(Instant::now() < deadline, "the new key is not served here");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    let mut seen: BTreeMap<(StatusCode, String), usize> = BTreeMap::new();
    for t in tasks {
        for (answer, n) in t.await.unwrap() {
            *seen.entry(answer).or_default() += n;
        }
    }
    // One of them, a thousand times more.
    for _ in 0..1000 {
        let answer = get(base.clone(), made_up(7)).await;
        *seen.entry(answer).or_default() += 1;
    }
    assert_eq!(get(base.clone(), known.clone()).await.0, StatusCode::OK);
    let elapsed = started.elapsed();
    let lookups = script_calls(&app).await;
    // The burst, the rate over the time it took, the two real keys' lookups (a verified key
    // once per half second) and one for the last refill's rounding.
    let real = 2 * (1 + elapsed.as_millis() as u64 / 500);
    let most = BURST + (elapsed.as_secs_f64() * f64::from(RATE)).ceil() as u64 + real + 1;
    println!(
        "{} requests with made-up tokens in {elapsed:?}: {lookups} key lookups (at most \
         {most}); answers {seen:?}",
        2 * TOKENS + 1000
    );
    assert!(lookups <= most, "{lookups} lookups, more than {most}");
    let answered: usize = seen.values().sum();
    assert_eq!(answered, 2 * TOKENS + 1000);
    for (status, code) in seen.keys() {
        assert!(
            matches!(
                (*status, code.as_str()),
                (StatusCode::UNAUTHORIZED, "unauthorized")
                    | (StatusCode::SERVICE_UNAVAILABLE, "key_lookups_busy")
            ),
            "{status} {code}"
        );
    }
    // A server started after a key was created knows it (it reads the ids that exist when
    // its listener connects): with its budget spent by made-up tokens, the key is served.
    let late = app
        .spawn_beside(|c| c.api.unknown_key_lookups_per_second = 1)
        .await;
    let late = format!("http://{late}");
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut next = TOKENS;
    loop {
        // Spend its budget (a burst of 10) first.
        for _ in 0..12 {
            next += 1;
            get(late.clone(), made_up(next)).await;
        }
        match get(late.clone(), known.clone()).await {
            (StatusCode::OK, _) => break,
            (_, code) => {
                assert_eq!(code, "key_lookups_busy");
                assert!(
                    Instant::now() < deadline,
                    "a key that existed before the server started is held back"
                );
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }
    }
}
