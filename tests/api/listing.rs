//! Listing: newest first, cursor pages without gaps or repeats, filters, totals.

use std::collections::HashSet;

use reqwest::StatusCode;
use serde_json::{Value, json};

use sluice::store::Outcome;

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

/// Calls of `command` over every master since the last `reset_stats`.
async fn calls_of(app: &TestApp, command: &str) -> u64 {
    app.redis
        .command_calls()
        .await
        .into_iter()
        .find(|(c, _)| c == command)
        .map_or(0, |(_, n)| n)
}

/// Every page of `query` (`limit` each), following the cursor; each page's ids and total.
async fn walk(app: &TestApp, tenant: &str, query: &str, limit: u32) -> Vec<(Vec<String>, u64)> {
    let mut pages = Vec::new();
    let mut cursor: Option<String> = None;
    for _ in 0..1_000 {
        let q = match &cursor {
            Some(c) => format!("{query}&limit={limit}&cursor={c}"),
            None => format!("{query}&limit={limit}"),
        };
        let page = app.page(tenant, &q).await;
        pages.push((ids(&page), page["total"].as_u64().unwrap()));
        cursor = page["next_cursor"].as_str().map(str::to_owned);
        if cursor.is_none() {
            return pages;
        }
    }
    panic!("{query}: no last page after 1000");
}

/// A tenant's listing holds one range per status and flow (layout 4), so a status-only or
/// unfiltered page merges one range per flow. With 40 flows (names sharing prefixes, every
/// character a flow id may hold) and executions in three statuses, every listing walks each
/// match exactly once, newest first, with the exact total on every page; and one page's
/// reads stay within the bound docs/api.md states: one `ZRANGE` per range and round, a range
/// read again only while it may hold a row of the page, each time twice as far, so at most
/// `1 + ceil(log2((limit + 1) / first + 1))` times (`first`, the first read's share), and one
/// `ZLEXCOUNT` per range for a total.
#[tokio::test]
async fn many_flows_list_exactly_and_a_page_reads_a_bounded_number_of_ranges() {
    let app = TestApp::spawn_with(|c| c.api.sweep_interval_secs = 0).await;
    let long = format!("z{}", "9".repeat(127));
    let mut flows: Vec<String> = vec![
        "a".into(),
        "a.b".into(),
        "a-b".into(),
        "a/b".into(),
        "a_b".into(),
        "a.".into(),
        "A".into(),
        "a0".into(),
        long,
    ];
    for i in 0..31 {
        flows.push(format!("f{i:02}/x.y-z_{i}"));
    }
    assert_eq!(flows.len(), 40);
    // 320 executions, eight a flow: of each flow's eight, the first is completed by a run,
    // the second cancelled, the other six stay queued (so a queued range outlasts a first
    // read of a share of a small page).
    let store = app.store().await;
    let shard = app.shard("acme");
    app.put_tenant("acme", &json!({"max_concurrent": 200}))
        .await;
    let mut all: Vec<(String, String)> = Vec::new();
    for round in 0..8 {
        for f in &flows {
            let id = app.admit_with("acme", json!({"flow_id": f})).await;
            all.push((id, format!("{f}#{round}")));
        }
        if round == 0 {
            let mut runs = Vec::new();
            for _ in 0..20 {
                let got = app.start_by_hand("acme", 40 - runs.len()).await.started;
                if got.is_empty() {
                    break;
                }
                runs.extend(got);
            }
            assert_eq!(runs.len(), 40, "the first of each flow started");
            for run in &runs {
                store
                    .complete(
                        shard,
                        &run.id,
                        run.fence,
                        "w",
                        &Outcome::Completed(json!({})),
                    )
                    .await
                    .unwrap();
            }
        }
    }
    let status_of = |tag: &str| match tag.rsplit('#').next() {
        Some("0") => "completed",
        Some("1") => "cancelled",
        _ => "queued",
    };
    for (id, tag) in &all {
        if status_of(tag) == "cancelled" {
            assert_eq!(app.cancel("acme", id).await.status(), StatusCode::OK);
        }
    }
    let newest_first = |keep: &dyn Fn(&(String, String)) -> bool| -> Vec<String> {
        let mut v: Vec<String> = all
            .iter()
            .filter(|x| keep(x))
            .map(|(id, _)| id.clone())
            .collect();
        v.sort();
        v.reverse();
        v
    };
    let flow_of = |tag: &str| tag.rsplit_once('#').unwrap().0.to_owned();
    let cases: Vec<(String, Vec<String>)> = vec![
        (String::new(), newest_first(&|_| true)),
        (
            "status=queued".into(),
            newest_first(&|(_, t)| status_of(t) == "queued"),
        ),
        (
            "status=completed".into(),
            newest_first(&|(_, t)| status_of(t) == "completed"),
        ),
        (
            "flow_id=a".into(),
            newest_first(&|(_, t)| flow_of(t) == "a"),
        ),
        (
            "flow_id=a.b&status=cancelled".into(),
            newest_first(&|(_, t)| flow_of(t) == "a.b" && status_of(t) == "cancelled"),
        ),
    ];
    for (q, expected) in &cases {
        for limit in [1, 7, 50] {
            let pages = walk(&app, "acme", q, limit).await;
            let seen: Vec<String> = pages.iter().flat_map(|(p, _)| p.clone()).collect();
            assert_eq!(&seen, expected, "{q} limit {limit}");
            for (_, total) in &pages {
                assert_eq!(*total, expected.len() as u64, "{q} limit {limit}");
            }
        }
    }
    // A time range across flows: from the 150th oldest execution's millisecond on.
    let mut oldest_first: Vec<&String> = all.iter().map(|(id, _)| id).collect();
    oldest_first.sort();
    let from_ms = u64::from_str_radix(&oldest_first[150][..12], 16).unwrap();
    let from = time::OffsetDateTime::from_unix_timestamp_nanos(i128::from(from_ms) * 1_000_000)
        .unwrap()
        .format(&time::format_description::well_known::Rfc3339)
        .unwrap()
        .replace(':', "%3A");
    let in_range = newest_first(&|(id, t)| {
        status_of(t) == "queued" && u64::from_str_radix(&id[..12], 16).unwrap() >= from_ms
    });
    let pages = walk(
        &app,
        "acme",
        &format!("status=queued&created_from={from}"),
        7,
    )
    .await;
    let seen: Vec<String> = pages.iter().flat_map(|(p, _)| p.clone()).collect();
    assert_eq!(seen, in_range);
    assert!(pages.iter().all(|(_, t)| *t == in_range.len() as u64));

    // The reads of one page: unfiltered (5 statuses x 40 flows = 200 ranges) and by status
    // (40 ranges), first pages and a page from a cursor, with a time range (a ZLEXCOUNT per
    // range) and without (one per status).
    let cursor = &newest_first(&|_| true)[30];
    for (q, ranges) in [
        ("limit=50".to_owned(), 200u64),
        (format!("limit=50&cursor={cursor}"), 200),
        ("status=queued&limit=50".to_owned(), 40),
        (format!("status=queued&limit=7&created_from={from}"), 40),
        ("limit=1".to_owned(), 200),
        ("status=queued&limit=1".to_owned(), 40),
        ("status=queued&limit=20".to_owned(), 40),
        ("flow_id=a&status=queued&limit=3".to_owned(), 1),
    ] {
        let limit: u64 = q
            .split("limit=")
            .nth(1)
            .unwrap()
            .split('&')
            .next()
            .unwrap()
            .parse()
            .unwrap();
        let first = if ranges > 1 {
            2 * (limit + 1) / ranges + 2
        } else {
            limit + 1
        };
        let mut reads_per_range = 1;
        while first * ((1 << reads_per_range) - 1) < limit + 1 {
            reads_per_range += 1;
        }
        app.redis.reset_stats().await;
        let page = app.page("acme", &q).await;
        assert!(page["total"].as_u64().unwrap() > 0, "{q}: {page}");
        let (zrange, zlexcount) = (
            calls_of(&app, "zrange").await,
            calls_of(&app, "zlexcount").await,
        );
        println!(
            "{q}: {zrange} ZRANGE over {ranges} ranges (bound {}), {zlexcount} ZLEXCOUNT",
            ranges * reads_per_range
        );
        assert!(
            zrange >= ranges,
            "{q}: every range read once at least ({zrange})"
        );
        assert!(zrange <= ranges * reads_per_range, "{q}: {zrange} ZRANGE");
        assert!(zlexcount <= ranges, "{q}: {zlexcount} ZLEXCOUNT");
    }
}

/// Flow ids are validated at the API: no NUL (the listing's separator) or other byte outside
/// `[A-Za-z0-9_./-]` can name a flow, so a flow whose name is another's prefix lists apart.
#[tokio::test]
async fn a_flow_id_cannot_hold_the_listing_separator() {
    let app = TestApp::spawn().await;
    for bad in ["a\u{0}b", "a b", "a:b", "\u{0}", "a\u{7f}"] {
        let res = app.post_execution("acme", &json!({"flow_id": bad})).await;
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{bad:?}");
        assert_eq!(problem_code(res).await, "invalid_flow_id", "{bad:?}");
        let res = app
            .list(
                "acme",
                &format!(
                    "flow_id={}",
                    bad.replace('\u{0}', "%00").replace(' ', "%20")
                ),
            )
            .await;
        assert_eq!(res.status(), StatusCode::BAD_REQUEST, "{bad:?}");
    }
    let a = app.admit_with("acme", json!({"flow_id": "a"})).await;
    let ab = app.admit_with("acme", json!({"flow_id": "a.b"})).await;
    let a_dash = app.admit_with("acme", json!({"flow_id": "a-"})).await;
    for (q, want) in [
        ("flow_id=a", vec![a.clone()]),
        ("flow_id=a.b", vec![ab.clone()]),
        ("flow_id=a-", vec![a_dash.clone()]),
        ("status=queued", vec![a_dash.clone(), ab.clone(), a.clone()]),
    ] {
        // Whole, and one by one through the cursor.
        let page = app.page("acme", q).await;
        assert_eq!(ids(&page), want, "{q}");
        assert_eq!(page["total"], want.len(), "{q}");
        let pages = walk(&app, "acme", q, 1).await;
        let seen: Vec<String> = pages.iter().flat_map(|(p, _)| p.clone()).collect();
        assert_eq!(seen, want, "{q} limit 1");
        assert!(pages.iter().all(|(_, t)| *t == want.len() as u64), "{q}");
    }
}

/// Status-only and unfiltered pages find a flow's members through the tenant's flows set: a
/// flow missing from it (removed by hand, or by a process of another build) hides its
/// executions there while `total` still counts them. The sweeper's walk of the listing puts
/// the flow back, and the pages are whole again.
#[tokio::test]
async fn the_sweeper_puts_back_a_flow_the_flows_set_lost() {
    let app = TestApp::spawn_with(|c| c.api.sweep_interval_secs = 0).await;
    let a = app.admit_with("acme", json!({"flow_id": "flow.a"})).await;
    let b = app.admit_with("acme", json!({"flow_id": "flow.b"})).await;
    let tenant = sluice::domain::TenantId::parse("acme").unwrap();
    let flows = app.shard("acme").flows(&tenant);
    let _: i64 = app
        .redis
        .query(redis::cmd("SREM").arg(&flows).arg("flow.b"))
        .await;
    let page = app.page("acme", "status=queued").await;
    assert_eq!(ids(&page), vec![a.clone()], "the lost flow is not read");
    assert_eq!(page["total"], 2);

    let store = std::sync::Arc::new(app.store().await);
    let repaired =
        sluice::sweeper::sweep_once(store, "test", std::time::Duration::from_millis(200))
            .await
            .expect("took the sweeper turn");
    assert_eq!(repaired["index"], 1, "{repaired:?}");
    let page = app.page("acme", "status=queued").await;
    assert_eq!(ids(&page), vec![b, a]);
    assert_eq!(page["total"], 2);
}
