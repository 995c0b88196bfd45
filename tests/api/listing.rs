//! Listing: newest first, cursor pages without gaps or repeats, filters, totals.

use std::collections::HashSet;

use reqwest::StatusCode;
use serde_json::{Value, json};

use crate::helpers::{TestApp, problem_code};

fn ids(page: &Value) -> Vec<String> {
    page["executions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e["execution_id"].as_str().unwrap().to_owned())
        .collect()
}

#[tokio::test]
async fn pages_walk_every_execution_newest_first() {
    let app = TestApp::spawn().await;
    let mut admitted = Vec::new();
    for i in 0..7 {
        let flow = if i % 2 == 0 { "flow.even" } else { "flow.odd" };
        admitted.push(
            app.admit("acme", flow).await["execution_id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
    }
    // Another tenant's rows never show.
    app.admit("other", "flow.even").await;

    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..10 {
        let q = match &cursor {
            Some(c) => format!("limit=3&cursor={c}"),
            None => "limit=3".to_owned(),
        };
        let res = app.list("acme", &q).await;
        assert_eq!(res.status(), StatusCode::OK);
        let page: Value = res.json().await.unwrap();
        assert_eq!(page["total"], 7);
        seen.extend(ids(&page));
        cursor = page["next_cursor"].as_str().map(str::to_owned);
        if cursor.is_none() {
            break;
        }
    }
    let newest_first: Vec<String> = admitted.iter().rev().cloned().collect();
    assert_eq!(seen, newest_first);
}

#[tokio::test]
async fn filters_by_status_and_flow_combine() {
    let app = TestApp::spawn().await;
    let mut even = Vec::new();
    for i in 0..6 {
        let flow = if i % 2 == 0 { "flow.even" } else { "flow.odd" };
        let id = app.admit("acme", flow).await["execution_id"]
            .as_str()
            .unwrap()
            .to_owned();
        if i % 2 == 0 {
            even.push(id);
        }
    }
    let cancelled = even[0].clone();
    app.cancel("acme", &cancelled).await;

    let page = app.page("acme", "status=cancelled").await;
    assert_eq!(ids(&page), vec![cancelled.clone()]);
    assert_eq!(page["total"], 1);

    let page = app.page("acme", "flow_id=flow.even").await;
    assert_eq!(page["total"], 3);
    let expected: Vec<String> = even.iter().rev().cloned().collect();
    assert_eq!(ids(&page), expected);

    let page = app.page("acme", "flow_id=flow.even&status=queued").await;
    assert_eq!(page["total"], 2);
    let got: HashSet<String> = ids(&page).into_iter().collect();
    assert_eq!(got, even[1..].iter().cloned().collect());
    for e in page["executions"].as_array().unwrap() {
        assert_eq!(e["status"], "queued");
        assert_eq!(e["flow_id"], "flow.even");
    }

    let page = app.page("acme", "flow_id=flow.none").await;
    assert_eq!(page["total"], 0);
    assert_eq!(page["next_cursor"], Value::Null);
}

#[tokio::test]
async fn rows_that_expired_are_skipped_and_their_index_entries_dropped() {
    let app = TestApp::spawn().await;
    let gone = app.admit("acme", "demo.echo").await["execution_id"]
        .as_str()
        .unwrap()
        .to_owned();
    let kept = app.admit("acme", "demo.echo").await["execution_id"]
        .as_str()
        .unwrap()
        .to_owned();
    app.cancel("acme", &gone).await;
    // What the retention TTL does after 30 days.
    let key = app
        .shard("acme")
        .row(&sluice::domain::ExecutionId::parse(&gone).unwrap());
    let _: i64 = app.redis.query(redis::cmd("DEL").arg(key)).await;

    let page = app.page("acme", "").await;
    assert_eq!(ids(&page), vec![kept]);
    assert_eq!(page["total"], 1);
    let page = app.page("acme", "status=cancelled").await;
    assert_eq!(page["total"], 0);
}

#[tokio::test]
async fn a_page_ends_at_its_byte_budget_and_the_cursor_walks_on() {
    let app = TestApp::spawn_with(|c| c.api.max_page_bytes = 4000).await;
    let blob = "x".repeat(1000);
    let mut admitted = Vec::new();
    for i in 0..10 {
        let id = app
            .admit_with(
                "acme",
                serde_json::json!({"flow_id": "demo.echo", "params": {"i": i, "blob": blob}}),
            )
            .await;
        admitted.push(id);
    }
    // One execution far over the budget still gets a page of its own.
    let huge = app
        .admit_with(
            "acme",
            serde_json::json!({"flow_id": "demo.echo", "params": {"blob": "y".repeat(20_000)}}),
        )
        .await;
    admitted.push(huge.clone());

    let first = app.page("acme", "limit=200").await;
    assert_eq!(ids(&first), vec![huge], "the big one alone");
    assert!(first["next_cursor"].is_string());
    let mut seen = ids(&first);
    let mut cursor = first["next_cursor"].as_str().map(str::to_owned);
    let mut pages = 1;
    while let Some(c) = cursor {
        let page = app.page("acme", &format!("limit=200&cursor={c}")).await;
        let got = ids(&page);
        assert!(
            (1..=3).contains(&got.len()),
            "a ~1 KB row each in a 4000-byte budget: {}",
            got.len()
        );
        assert_eq!(page["total"], 11);
        seen.extend(got);
        cursor = page["next_cursor"].as_str().map(str::to_owned);
        pages += 1;
        assert!(pages < 20, "the cursor does not advance");
    }
    let newest_first: Vec<String> = admitted.iter().rev().cloned().collect();
    assert_eq!(seen, newest_first);
}

#[tokio::test]
async fn the_tenant_registry_is_listed_in_pages() {
    let app = TestApp::spawn().await;
    let names = ["t-a", "t-b", "t-c", "t-d", "t-e"];
    for t in names.iter().rev() {
        app.put_tenant(t, &serde_json::json!({"max_concurrent": 3}))
            .await;
    }
    let mut seen = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..10 {
        let path = match &cursor {
            Some(c) => format!("/api/tenants?limit=2&cursor={c}"),
            None => "/api/tenants?limit=2".to_owned(),
        };
        let page = app.get_json(None, &path).await;
        let tenants = page["tenants"].as_array().unwrap();
        assert!(tenants.len() <= 2);
        for t in tenants {
            assert_eq!(t["max_concurrent"], 3);
            seen.push(t["tenant_id"].as_str().unwrap().to_owned());
        }
        cursor = page["next_cursor"].as_str().map(str::to_owned);
        if cursor.is_none() {
            break;
        }
    }
    assert_eq!(seen, names);
    for bad in ["limit=0", "limit=201", "cursor=a%7Bb"] {
        let res = app
            .client
            .get(app.url(&format!("/api/tenants?{bad}")))
            .bearer_auth(crate::helpers::ADMIN_TOKEN)
            .send()
            .await
            .unwrap();
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{bad}");
    }
}

#[tokio::test]
async fn the_dedup_key_filter_finds_the_one_execution_holding_the_key() {
    let app = TestApp::spawn().await;
    let held = app
        .admit_with(
            "acme",
            json!({"flow_id": "flow.a", "dedup_key": "order/42 ü"}),
        )
        .await;
    let other = app
        .admit_with(
            "acme",
            json!({"flow_id": "flow.a", "dedup_key": "order-43"}),
        )
        .await;
    app.admit_with("acme", json!({"flow_id": "flow.b"})).await;
    // Another tenant's execution under the same key is not acme's.
    app.admit_with(
        "globex",
        json!({"flow_id": "flow.a", "dedup_key": "order/42 ü"}),
    )
    .await;

    let page = app.page("acme", "dedup_key=order%2F42%20%C3%BC").await;
    assert_eq!(ids(&page), vec![held.clone()]);
    assert_eq!(page["total"], 1);
    assert_eq!(page["executions"][0]["dedup_key"], "order/42 ü");
    assert_eq!(page["next_cursor"], Value::Null);

    // Combined with the other filters: it must pass them too.
    let page = app
        .page("acme", "dedup_key=order-43&status=queued&flow_id=flow.a")
        .await;
    assert_eq!(ids(&page), vec![other.clone()]);
    for q in [
        "dedup_key=order-43&status=running",
        "dedup_key=order-43&flow_id=flow.b",
        "dedup_key=order-44",
    ] {
        let page = app.page("acme", q).await;
        assert_eq!(page["total"], 0, "{q}");
        assert_eq!(ids(&page), Vec::<String>::new(), "{q}");
    }
    // A cancelled holder still holds its key (its mapping outlives it by the dedup TTL).
    app.cancel("acme", &other).await;
    let page = app
        .page("acme", "dedup_key=order-43&status=cancelled")
        .await;
    assert_eq!(ids(&page), vec![other.clone()]);
    // A force delete frees the key: nothing holds it, then the new holder does.
    app.delete("acme", &other, true).await;
    assert_eq!(app.page("acme", "dedup_key=order-43").await["total"], 0);
    let again = app
        .admit_with(
            "acme",
            json!({"flow_id": "flow.a", "dedup_key": "order-43"}),
        )
        .await;
    assert_eq!(
        ids(&app.page("acme", "dedup_key=order-43").await),
        vec![again]
    );
    // A key that is no dedup key at all is refused before Redis sees it.
    let res = app.list("acme", "dedup_key=").await;
    assert_eq!(res.status(), StatusCode::BAD_REQUEST);
    assert_eq!(problem_code(res).await, "invalid_dedup_key");
}

#[tokio::test]
async fn the_time_range_filter_bounds_executions_by_admission_time() {
    let app = TestApp::spawn().await;
    let mut ids_in_order = Vec::new();
    for _ in 0..3 {
        ids_in_order.push(
            app.admit("acme", "flow.t").await["execution_id"]
                .as_str()
                .unwrap()
                .to_owned(),
        );
        // A millisecond apart at least, so each has its own admission time.
        let last = ids_in_order.last().unwrap().clone();
        while sluice::domain::ExecutionId::new().as_str()[..12] == last[..12] {
            tokio::task::yield_now().await;
        }
    }
    // The id's own time: the middle execution's millisecond, as RFC 3339.
    let ms_of = |id: &str| u64::from_str_radix(&id[..12], 16).unwrap();
    let rfc = |ms: u64| {
        time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(ms) * 1_000_000)
            .unwrap()
            .format(&time::format_description::well_known::Rfc3339)
            .unwrap()
    };
    let enc = |s: &str| s.replace('+', "%2B").replace(':', "%3A");
    let mid = ms_of(&ids_in_order[1]);

    // From the middle one's millisecond (inclusive): the last two, newest first.
    let page = app
        .page("acme", &format!("created_from={}", enc(&rfc(mid))))
        .await;
    assert_eq!(
        ids(&page),
        vec![ids_in_order[2].clone(), ids_in_order[1].clone()]
    );
    assert_eq!(page["total"], 2);
    // Before it (exclusive): only the first.
    let page = app
        .page("acme", &format!("created_before={}", enc(&rfc(mid))))
        .await;
    assert_eq!(ids(&page), vec![ids_in_order[0].clone()]);
    assert_eq!(page["total"], 1);
    // Exactly its millisecond, combined with a status filter and with paging.
    let page = app
        .page(
            "acme",
            &format!(
                "created_from={}&created_before={}&status=queued",
                enc(&rfc(mid)),
                enc(&rfc(mid + 1))
            ),
        )
        .await;
    assert_eq!(ids(&page), vec![ids_in_order[1].clone()]);
    let all = format!(
        "created_from={}&created_before={}",
        enc(&rfc(ms_of(&ids_in_order[0]))),
        enc(&rfc(ms_of(&ids_in_order[2]) + 1))
    );
    let first = app.page("acme", &format!("{all}&limit=2")).await;
    assert_eq!(first["total"], 3);
    assert_eq!(
        ids(&first),
        vec![ids_in_order[2].clone(), ids_in_order[1].clone()]
    );
    let cursor = first["next_cursor"].as_str().unwrap().to_owned();
    let second = app
        .page("acme", &format!("{all}&limit=2&cursor={cursor}"))
        .await;
    assert_eq!(ids(&second), vec![ids_in_order[0].clone()]);
    assert_eq!(second["next_cursor"], Value::Null);
    // A time with an offset is the same instant in UTC.
    let page = app
        .page(
            "acme",
            &format!("created_from={}", enc("2000-01-01T02:00:00+02:00")),
        )
        .await;
    assert_eq!(page["total"], 3);
    let page = app
        .page(
            "acme",
            &format!("created_from={}", enc("2999-01-01T00:00:00Z")),
        )
        .await;
    assert_eq!(page["total"], 0);
    // Not a time: 400 before Redis sees it.
    for bad in ["yesterday", "2026-13-01T00:00:00Z", "2026-11-29"] {
        let res = app.list("acme", &format!("created_from={bad}")).await;
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{bad}");
        assert_eq!(problem_code(res).await, "invalid_time", "{bad}");
    }
}
