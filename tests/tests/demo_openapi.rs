#![cfg(all(feature = "stockd", feature = "orderd", feature = "gateway"))]
//! Real answers of a running gateway validate against `gateway/static/openapi.json`: every
//! route, the success answers and the refusals we can provoke (401, 403, 404, 405, 409,
//! 410, 415, 425, 429, 400), the SSE events' `Order` payloads, and required headers
//! (`Retry-After`).
//!
//! The validator is our own, over serde_json, for the subset of OpenAPI 3.0 the document
//! uses (`$ref` into components, `allOf`, `type`, `required`, `properties`, `items`,
//! `enum`, `minimum`, `minLength`/`maxLength`, `nullable`). Why not the `jsonschema`
//! crate: OpenAPI 3.0 schemas are not plain JSON Schema (responses, `$ref` into
//! `components`, `nullable`), so it would still need the lookup code around it, and it
//! brings a large dependency tree (regex engines, URL and HTTP resolvers) into the test
//! crate for ~100 lines of checks. The validator has its own unit tests below.
//!
//! (Over 400 lines: an integration suite: each test sets up real processes and states its
//! invariants inline, so the cases read top to bottom.)

use std::path::PathBuf;
use std::time::Duration;

use reqwest::Method;
use seckill_tests::gateway::{bucket, set, GatewayHandle, Stack};
use seckill_tests::init_tracing;
use seckill_tests::stockd::create_published_activity;
use serde_json::{json, Value};

/// The OpenAPI document and the checks against it.
struct Spec {
    doc: Value,
}

impl Spec {
    fn load() -> Self {
        let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../gateway/static/openapi.json");
        let text = std::fs::read_to_string(&path).expect("gateway/static/openapi.json");
        Self {
            doc: serde_json::from_str(&text).expect("openapi.json is JSON"),
        }
    }

    /// Follows `$ref`s (`#/a/b/c`).
    fn resolve<'a>(&'a self, mut v: &'a Value) -> &'a Value {
        for _ in 0..16 {
            let Some(r) = v.get("$ref").and_then(Value::as_str) else {
                return v;
            };
            let ptr = r.strip_prefix('#').expect("local $ref");
            v = self
                .doc
                .pointer(ptr)
                .unwrap_or_else(|| panic!("dangling $ref {r}"));
        }
        panic!("$ref loop");
    }

    /// Validates `value` against `schema`, collecting problems with their JSON path.
    fn validate(&self, schema: &Value, value: &Value, at: &str, errs: &mut Vec<String>) {
        let schema = self.resolve(schema);
        if value.is_null() && schema.get("nullable") == Some(&Value::Bool(true)) {
            return;
        }
        if let Some(all) = schema.get("allOf").and_then(Value::as_array) {
            for s in all {
                self.validate(s, value, at, errs);
            }
        }
        if let Some(e) = schema.get("enum").and_then(Value::as_array) {
            if !e.contains(value) {
                errs.push(format!("{at}: {value} is not one of {e:?}"));
            }
        }
        let Some(ty) = schema.get("type").and_then(Value::as_str) else {
            return;
        };
        let type_ok = match ty {
            "object" => value.is_object(),
            "array" => value.is_array(),
            "string" => value.is_string(),
            "integer" => value.is_i64() || value.is_u64(),
            "number" => value.is_number(),
            "boolean" => value.is_boolean(),
            other => panic!("type {other} not supported by this validator"),
        };
        if !type_ok {
            errs.push(format!("{at}: expected {ty}, got {value}"));
            return;
        }
        match ty {
            "object" => {
                let obj = value.as_object().expect("object");
                for r in schema
                    .get("required")
                    .and_then(Value::as_array)
                    .into_iter()
                    .flatten()
                {
                    let r = r.as_str().expect("required names are strings");
                    if !obj.contains_key(r) {
                        errs.push(format!("{at}: required `{r}` missing"));
                    }
                }
                if let Some(props) = schema.get("properties").and_then(Value::as_object) {
                    for (k, s) in props {
                        if let Some(v) = obj.get(k) {
                            self.validate(s, v, &format!("{at}.{k}"), errs);
                        }
                    }
                }
            }
            "array" => {
                if let Some(items) = schema.get("items") {
                    for (i, v) in value.as_array().expect("array").iter().enumerate() {
                        self.validate(items, v, &format!("{at}[{i}]"), errs);
                    }
                }
            }
            "string" => {
                let n = value.as_str().expect("string").chars().count() as u64;
                if let Some(min) = schema.get("minLength").and_then(Value::as_u64) {
                    if n < min {
                        errs.push(format!("{at}: shorter than {min}"));
                    }
                }
                if let Some(max) = schema.get("maxLength").and_then(Value::as_u64) {
                    if n > max {
                        errs.push(format!("{at}: longer than {max}"));
                    }
                }
            }
            "integer" | "number" => {
                if let (Some(min), Some(v)) = (
                    schema.get("minimum").and_then(Value::as_f64),
                    value.as_f64(),
                ) {
                    if v < min {
                        errs.push(format!("{at}: {v} below the minimum {min}"));
                    }
                }
            }
            _ => {}
        }
    }

    /// The operation for a concrete path: (template, operation object).
    fn operation(&self, method: &str, path: &str) -> Option<(String, &Value)> {
        let paths = self.doc["paths"].as_object().expect("paths");
        let segs: Vec<&str> = path.split('/').collect();
        for (tpl, item) in paths {
            let t: Vec<&str> = tpl.split('/').collect();
            let matches = t.len() == segs.len()
                && t.iter().zip(&segs).all(|(t, s)| {
                    (t.starts_with('{') && t.ends_with('}') && !s.is_empty()) || t == s
                });
            if matches {
                return item
                    .get(method.to_ascii_lowercase())
                    .map(|op| (tpl.clone(), op));
            }
        }
        None
    }

    /// Checks one real answer; returns the problems.
    fn check(
        &self,
        method: &str,
        path: &str,
        status: u16,
        headers: &reqwest::header::HeaderMap,
        body: &str,
    ) -> Vec<String> {
        let what = format!("{method} {path} → {status}");
        if status == 405 {
            // OpenAPI describes the methods a path has, not the refusal of the others:
            // the path must exist, the method must not, and the body is an Error.
            let known =
                self.operation("GET", path).is_some() || self.operation("POST", path).is_some();
            let mut errs = Vec::new();
            if !known || self.operation(method, path).is_some() {
                errs.push(format!(
                    "{what}: 405 for a path/method the document lists otherwise"
                ));
            }
            match serde_json::from_str::<Value>(body) {
                Ok(v) => self.validate(&self.schema("Error"), &v, &what, &mut errs),
                Err(e) => errs.push(format!("{what}: body is not JSON ({e})")),
            }
            return errs;
        }
        let Some((tpl, op)) = self.operation(method, path) else {
            return vec![format!("{what}: no such operation in openapi.json")];
        };
        let responses = &op["responses"];
        let Some(resp) = responses
            .get(status.to_string())
            .or_else(|| responses.get("default"))
        else {
            return vec![format!("{what}: status not documented for {method} {tpl}")];
        };
        let resp = self.resolve(resp);
        let mut errs = Vec::new();
        for (name, h) in resp
            .get("headers")
            .and_then(Value::as_object)
            .into_iter()
            .flatten()
        {
            if self.resolve(h).get("required") == Some(&Value::Bool(true))
                && !headers.contains_key(name.as_str())
            {
                errs.push(format!("{what}: required header {name} missing"));
            }
        }
        let Some(content) = resp.get("content").and_then(Value::as_object) else {
            return errs;
        };
        let ctype = headers
            .get("content-type")
            .and_then(|v| v.to_str().ok())
            .unwrap_or("")
            .split(';')
            .next()
            .unwrap_or("")
            .trim()
            .to_ascii_lowercase();
        let Some(media) = content.get(&ctype) else {
            errs.push(format!(
                "{what}: content type `{ctype}` not among {:?}",
                content.keys().collect::<Vec<_>>()
            ));
            return errs;
        };
        if ctype == "application/json" {
            match serde_json::from_str::<Value>(body) {
                Ok(v) => self.validate(&media["schema"], &v, "$", &mut errs),
                Err(e) => errs.push(format!("{what}: body is not JSON ({e}): {body}")),
            }
            errs.iter_mut().for_each(|e| {
                if !e.starts_with(&what) {
                    *e = format!("{what}: {e} in {body}");
                }
            });
        }
        errs
    }

    fn schema(&self, name: &str) -> Value {
        json!({ "$ref": format!("#/components/schemas/{name}") })
    }
}

/// A client that records every answer it gets and checks it against the spec.
struct Probe {
    spec: Spec,
    http: reqwest::Client,
    base: String,
    problems: Vec<String>,
    seen: Vec<(String, String, u16)>,
}

struct Answer {
    status: u16,
    body: Value,
    headers: reqwest::header::HeaderMap,
}

impl Probe {
    async fn call(
        &mut self,
        method: Method,
        path: &str,
        jwt: Option<&str>,
        body: Option<Value>,
    ) -> Answer {
        let mut req = self
            .http
            .request(method.clone(), format!("{}{path}", self.base));
        if let Some(t) = jwt {
            req = req.bearer_auth(t);
        }
        if let Some(b) = body {
            req = req.json(&b);
        }
        self.finish(method.as_str(), path, req).await
    }

    async fn finish(&mut self, method: &str, path: &str, req: reqwest::RequestBuilder) -> Answer {
        let resp = req.send().await.expect("request");
        let status = resp.status().as_u16();
        let headers = resp.headers().clone();
        let text = resp.text().await.expect("body");
        let concrete = path.split('?').next().unwrap_or(path);
        self.problems
            .extend(self.spec.check(method, concrete, status, &headers, &text));
        self.seen
            .push((method.to_owned(), concrete.to_owned(), status));
        Answer {
            status,
            body: serde_json::from_str(&text).unwrap_or(Value::Null),
            headers,
        }
    }

    fn expect(&mut self, a: &Answer, status: u16, code: Option<&str>, what: &str) {
        if a.status != status {
            self.problems.push(format!(
                "{what}: expected {status}, got {} {}",
                a.status, a.body
            ));
        }
        if let Some(c) = code {
            if a.body["error"]["code"] != c {
                self.problems
                    .push(format!("{what}: expected code {c}, got {}", a.body));
            }
        }
    }
}

/// Waits for `/readyz`, showing the gateway's log when it never comes.
async fn wait_ready(gw: &GatewayHandle) {
    let url = format!("{}/readyz", gw.admin_url());
    for _ in 0..300 {
        if matches!(reqwest::get(&url).await, Ok(r) if r.status() == 200) {
            return;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    panic!("gateway never ready; its log:\n{}", gw.log());
}

async fn wait_state(p: &mut Probe, order: &str, jwt: &str, state: &str) -> Value {
    for _ in 0..200 {
        let a = p
            .call(
                Method::GET,
                &format!("/api/v1/orders/{order}"),
                Some(jwt),
                None,
            )
            .await;
        if a.status == 200 && a.body["state"] == state {
            return a.body;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    panic!("order {order} never reached {state}");
}

async fn probe_sse(p: &mut Probe, gw: &GatewayHandle, order: &str, jwt: &str) {
    let url = format!(
        "{}/api/v1/orders/{order}/events?access_token={jwt}",
        gw.base_url()
    );
    let mut resp = p.http.get(url).send().await.expect("events");
    let status = resp.status().as_u16();
    let ctype = resp
        .headers()
        .get("content-type")
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
        .to_owned();
    p.seen.push((
        "GET".into(),
        format!("/api/v1/orders/{order}/events"),
        status,
    ));
    if status != 200 || !ctype.starts_with("text/event-stream") {
        p.problems.push(format!(
            "events: {status} {ctype}, expected 200 text/event-stream"
        ));
        return;
    }
    // Read until the first complete `data:` line (the current state at once).
    let mut buf = String::new();
    let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
    while !buf.contains("\n\n") && tokio::time::Instant::now() < deadline {
        match tokio::time::timeout(Duration::from_secs(10), resp.chunk()).await {
            Ok(Ok(Some(c))) => buf.push_str(&String::from_utf8_lossy(&c)),
            _ => break,
        }
    }
    let event = buf.split("\n\n").next().unwrap_or("");
    if !event.lines().any(|l| l.trim() == "event: order") {
        p.problems
            .push(format!("events: no `event: order` in {event:?}"));
    }
    let data: String = event
        .lines()
        .filter_map(|l| l.strip_prefix("data:"))
        .map(str::trim)
        .collect();
    match serde_json::from_str::<Value>(&data) {
        Ok(v) => {
            let mut errs = Vec::new();
            p.spec
                .validate(&p.spec.schema("Order"), &v, "event", &mut errs);
            p.problems.extend(errs);
        }
        Err(e) => p
            .problems
            .push(format!("events: data is not JSON ({e}): {data:?}")),
    }
}

/// The edge's `Activity` object carries the values `AdminService.GetActivity` holds
/// (window, titles, list and sale prices, stock), field by field.
async fn same_as_admin(admin: &mut seckill_tests::stockd::AdminClient, edge: &Value) {
    let id = edge["id"].as_u64().expect("activity id");
    let held = admin
        .get_activity(seckill_proto::pb::GetActivityRequest { activity_id: id })
        .await
        .expect("AdminService.GetActivity")
        .into_inner();
    let want = json!({
        "id": held.id,
        "title": held.title,
        "start_at_ms": held.start_at_ms,
        "end_at_ms": held.end_at_ms,
        "items": held.items.iter().map(|i| json!({
            "id": i.id,
            "title": i.title,
            "price_cents": i.price_cents,
            "sale_price_cents": i.sale_price_cents,
            "stock": i.stock,
        })).collect::<Vec<_>>(),
    });
    let got = json!({
        "id": edge["id"],
        "title": edge["title"],
        "start_at_ms": edge["start_at_ms"],
        "end_at_ms": edge["end_at_ms"],
        "items": edge["items"].as_array().expect("items").iter().map(|i| json!({
            "id": i["id"],
            "title": i["title"],
            "price_cents": i["price_cents"],
            "sale_price_cents": i["sale_price_cents"],
            "stock": i["stock"],
        })).collect::<Vec<_>>(),
    });
    assert_eq!(
        got, want,
        "the edge's catalog of activity {id} against the admin API"
    );
}

#[tokio::test]
async fn real_answers_of_the_gateway_validate_against_the_openapi_document() {
    init_tracing();
    let stack = Stack::start().await;
    let hour = Duration::from_secs(3600);
    // One open activity with a 1-unit item (to sell out) and a roomy one; one upcoming.
    let open = create_published_activity(
        &stack.stockd,
        &[(1, 500), (50, 900)],
        2,
        Duration::ZERO,
        hour,
    )
    .await;
    let later = create_published_activity(&stack.stockd, &[(5, 100)], 2, hour, hour).await;
    let gw = stack
        .gateway_unready(|c| {
            set(c, "limits", "per_user", bucket(20.0, 30.0));
            set(c, "dev", "token_ttl_secs", 3600);
        })
        .await;
    let Stack {
        redis: _redis,
        db: _db,
        stockd,
        orderd,
    } = stack;
    wait_ready(&gw).await;
    gw.wait_activity(open.id).await;
    gw.wait_activity(later.id).await;
    let (a, tiny, roomy) = (open.id, open.items[0].id, open.items[1].id);

    let mut p = Probe {
        spec: Spec::load(),
        http: reqwest::Client::new(),
        base: gw.base_url(),
        problems: Vec::new(),
        seen: Vec::new(),
    };

    // Static documents.
    let r = p.call(Method::GET, "/", None, None).await;
    p.expect(&r, 200, None, "GET /");
    let r = p.call(Method::GET, "/api/openapi.json", None, None).await;
    p.expect(&r, 200, None, "GET /api/openapi.json");
    assert_eq!(
        r.body, p.spec.doc,
        "the served OpenAPI document is gateway/static/openapi.json"
    );

    // Activities.
    let r = p.call(Method::GET, "/api/v1/activities", None, None).await;
    p.expect(&r, 200, None, "list activities");
    // Values, not only shapes: the edge's catalog says what the admin API holds.
    let mut admin = stockd.admin_client().await;
    for held in [&open, &later] {
        let listed = r.body["activities"]
            .as_array()
            .and_then(|all| all.iter().find(|x| x["id"] == held.id))
            .unwrap_or_else(|| panic!("activity {} not listed: {}", held.id, r.body));
        same_as_admin(&mut admin, listed).await;
    }
    let r = p
        .call(Method::GET, &format!("/api/v1/activities/{a}"), None, None)
        .await;
    p.expect(&r, 200, None, "get activity");
    same_as_admin(&mut admin, &r.body["activity"]).await;
    let r = p
        .call(Method::GET, "/api/v1/activities/999999", None, None)
        .await;
    p.expect(&r, 404, Some("not_found"), "unknown activity");
    let r = p
        .call(Method::DELETE, "/api/v1/activities", None, None)
        .await;
    p.expect(&r, 405, Some("method_not_allowed"), "wrong method");

    // Dev token: success, bad body, wrong media type.
    let r = p
        .call(
            Method::POST,
            "/api/v1/dev/token",
            None,
            Some(json!({"user_id": "alice"})),
        )
        .await;
    p.expect(&r, 200, None, "dev token");
    let alice = r.body["token"].as_str().unwrap_or_default().to_owned();
    let bob = {
        let r = p
            .call(
                Method::POST,
                "/api/v1/dev/token",
                None,
                Some(json!({"user_id": "bob"})),
            )
            .await;
        r.body["token"].as_str().unwrap_or_default().to_owned()
    };
    let r = p
        .call(
            Method::POST,
            "/api/v1/dev/token",
            None,
            Some(json!({"name": "x"})),
        )
        .await;
    p.expect(&r, 400, Some("bad_request"), "dev token without user_id");
    let req = p
        .http
        .post(format!("{}/api/v1/dev/token", p.base))
        .header("content-type", "text/plain")
        .body("user_id=alice");
    let r = p.finish("POST", "/api/v1/dev/token", req).await;
    p.expect(
        &r,
        415,
        Some("unsupported_media_type"),
        "dev token as text/plain",
    );

    // Purchase token and reserve.
    let tok_path = format!("/api/v1/activities/{a}/items/{roomy}/token");
    let res_path = format!("/api/v1/activities/{a}/items/{roomy}/reserve");
    let r = p.call(Method::POST, &tok_path, None, None).await;
    p.expect(&r, 401, Some("unauthenticated"), "token without a JWT");
    let ch_path = format!("/api/v1/activities/{a}/items/{roomy}/challenge");
    let r = p.call(Method::POST, &ch_path, Some(&alice), None).await;
    p.expect(&r, 200, None, "no challenge asked");
    let r = p.call(Method::POST, &tok_path, Some(&alice), None).await;
    p.expect(&r, 200, None, "purchase token");
    let pt = r.body["purchase_token"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let r = p
        .call(
            Method::POST,
            &res_path,
            Some(&alice),
            Some(json!({"purchase_token": "forged"})),
        )
        .await;
    p.expect(&r, 403, Some("bad_purchase_token"), "forged purchase token");
    let r = p
        .call(
            Method::POST,
            &res_path,
            Some(&alice),
            Some(json!({"request_id": "r1"})),
        )
        .await;
    p.expect(
        &r,
        403,
        Some("bad_purchase_token"),
        "reserve without a purchase token",
    );
    let req = p
        .http
        .post(format!("{}{res_path}", p.base))
        .bearer_auth(&alice)
        .header("content-type", "application/json")
        .body("{\"purchase_token\": ");
    let r = p.finish("POST", &res_path, req).await;
    p.expect(&r, 400, Some("bad_request"), "reserve with malformed JSON");
    let r = p
        .call(
            Method::POST,
            &res_path,
            Some(&alice),
            Some(json!({"purchase_token": pt, "request_id": "r1"})),
        )
        .await;
    p.expect(&r, 202, None, "reserve");
    let order = r.body["order_id"].as_str().unwrap_or_default().to_owned();
    let r = p
        .call(
            Method::POST,
            &res_path,
            Some(&alice),
            Some(json!({"purchase_token": pt, "request_id": "r2"})),
        )
        .await;
    p.expect(&r, 409, Some("duplicate"), "second reservation");

    // Too early: the upcoming activity.
    let r = p
        .call(
            Method::POST,
            &format!(
                "/api/v1/activities/{}/items/{}/token",
                later.id, later.items[0].id
            ),
            Some(&alice),
            None,
        )
        .await;
    p.expect(&r, 425, Some("too_early"), "token before the window");

    // Sold out: bob takes the only unit, alice is refused.
    let tiny_tok = format!("/api/v1/activities/{a}/items/{tiny}/token");
    let tiny_res = format!("/api/v1/activities/{a}/items/{tiny}/reserve");
    let r = p.call(Method::POST, &tiny_tok, Some(&bob), None).await;
    let bpt = r.body["purchase_token"]
        .as_str()
        .unwrap_or_default()
        .to_owned();
    let r = p
        .call(
            Method::POST,
            &tiny_res,
            Some(&bob),
            Some(json!({"purchase_token": bpt})),
        )
        .await;
    p.expect(&r, 202, None, "bob reserves the last unit");
    let mut sold_out = false;
    for _ in 0..100 {
        let r = p.call(Method::POST, &tiny_tok, Some(&alice), None).await;
        let r = if r.status == 200 {
            let t = r.body["purchase_token"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            p.call(
                Method::POST,
                &tiny_res,
                Some(&alice),
                Some(json!({"purchase_token": t})),
            )
            .await
        } else {
            r
        };
        if r.status == 410 {
            p.expect(&r, 410, Some("sold_out"), "sold out");
            sold_out = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    assert!(sold_out, "never answered 410 sold_out");

    // Orders: list, get, events, pay, pay again, cancel after pay (conflict), others'.
    let pending = wait_state(&mut p, &order, &alice, "PENDING_PAYMENT").await;
    assert_eq!(pending["id"], order.as_str());
    let r = p
        .call(Method::GET, "/api/v1/orders", Some(&alice), None)
        .await;
    p.expect(&r, 200, None, "list orders");
    let r = p
        .call(
            Method::GET,
            &format!("/api/v1/orders/{order}"),
            Some(&bob),
            None,
        )
        .await;
    if r.status != 403 && r.status != 404 {
        p.problems.push(format!(
            "another user's order: expected 403 or 404, got {}",
            r.status
        ));
    }
    let r = p
        .call(
            Method::GET,
            "/api/v1/orders/1-1-0-0-424242",
            Some(&alice),
            None,
        )
        .await;
    p.expect(&r, 404, Some("not_found"), "unknown order");
    probe_sse(&mut p, &gw, &order, &alice).await;
    let pay = format!("/api/v1/orders/{order}/pay");
    let r = p.call(Method::POST, &pay, Some(&alice), None).await;
    p.expect(&r, 200, None, "pay");
    assert_eq!(r.body["outcome"], "applied", "{}", r.body);
    let r = p.call(Method::POST, &pay, Some(&alice), None).await;
    p.expect(&r, 200, None, "pay again");
    let r = p
        .call(
            Method::POST,
            &format!("/api/v1/orders/{order}/cancel"),
            Some(&alice),
            None,
        )
        .await;
    p.expect(&r, 409, Some("conflict"), "cancel after pay");

    // Payment callback with a bad signature.
    let r = p
        .call(
            Method::POST,
            "/api/v1/payments/callback",
            None,
            Some(
                json!({"order_id": order, "amount_cents": 900, "provider_ref": "p1",
                        "timestamp_ms": 1, "signature": "00"}),
            ),
        )
        .await;
    p.expect(
        &r,
        400,
        Some("bad_request"),
        "callback with a bad signature",
    );

    // Unknown route.
    // Unknown route: not an operation of the document, so only its status and error shape.
    let r = p
        .http
        .get(format!("{}/api/v1/nothing-here", p.base))
        .send()
        .await
        .expect("unknown route");
    assert_eq!(r.status(), 404);
    let body: Value = r.json().await.expect("JSON error body");
    let mut errs = Vec::new();
    p.spec
        .validate(&p.spec.schema("Error"), &body, "unknown route", &mut errs);
    p.problems.extend(errs);

    // Rate limited (per-user bucket of 30): Retry-After is required by the document.
    let mut limited = false;
    for _ in 0..60 {
        let r = p
            .call(Method::GET, "/api/v1/orders", Some(&bob), None)
            .await;
        if r.status == 429 {
            p.expect(&r, 429, Some("rate_limited"), "limited");
            assert!(r.headers.contains_key("retry-after"));
            limited = true;
            break;
        }
    }
    assert!(limited, "the per-user bucket never answered 429");

    // Too large a body (413) and too many headers (431).
    let big = json!({ "user_id": "x".repeat(64 * 1024) });
    let r = p
        .call(Method::POST, "/api/v1/dev/token", None, Some(big))
        .await;
    p.expect(&r, 413, Some("payload_too_large"), "oversized body");
    let mut req = p.http.get(format!("{}/api/v1/activities", p.base));
    for i in 0..200 {
        req = req.header(format!("x-filler-{i}"), "y");
    }
    let r = p.finish("GET", "/api/v1/activities", req).await;
    p.expect(&r, 431, Some("headers_too_large"), "too many headers");

    // orderd down: 503 with Retry-After.
    orderd.stop().await.expect("stop orderd");
    let mut unavailable = false;
    for _ in 0..50 {
        let carol = p
            .call(Method::GET, "/api/v1/orders", Some(&alice), None)
            .await;
        if carol.status == 503 {
            p.expect(&carol, 503, Some("backend_unavailable"), "orderd down");
            unavailable = true;
            break;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    assert!(unavailable, "orderd down never answered 503");

    let statuses: std::collections::BTreeSet<u16> = p.seen.iter().map(|s| s.2).collect();
    for s in [
        200, 202, 400, 401, 403, 404, 405, 409, 410, 413, 415, 425, 429, 431, 503,
    ] {
        assert!(
            statuses.contains(&s),
            "status {s} never exercised: {statuses:?}"
        );
    }
    assert!(
        p.problems.is_empty(),
        "answers that do not match openapi.json:\n{}",
        p.problems.join("\n")
    );
}

#[test]
fn the_openapi_document_is_complete_for_the_documented_routes() {
    let spec = Spec::load();
    assert!(spec.doc["openapi"].as_str().unwrap().starts_with("3.0"));
    for (m, p) in [
        ("get", "/api/v1/activities"),
        ("get", "/api/v1/activities/{a}"),
        ("post", "/api/v1/activities/{a}/items/{s}/challenge"),
        ("post", "/api/v1/activities/{a}/items/{s}/token"),
        ("post", "/api/v1/activities/{a}/items/{s}/reserve"),
        ("get", "/api/v1/orders"),
        ("get", "/api/v1/orders/{id}"),
        ("get", "/api/v1/orders/{id}/events"),
        ("post", "/api/v1/orders/{id}/pay"),
        ("post", "/api/v1/orders/{id}/cancel"),
        ("post", "/api/v1/payments/callback"),
        ("post", "/api/v1/dev/token"),
        ("get", "/api/v1/activities/{a}/room"),
        ("post", "/api/v1/activities/{a}/room/join"),
        ("post", "/api/v1/activities/{a}/room/heartbeat"),
        ("get", "/api/v1/activities/{a}/room/events"),
        ("get", "/"),
        ("get", "/api/openapi.json"),
    ] {
        let op = &spec.doc["paths"][p][m];
        assert!(op.is_object(), "{m} {p} missing");
        assert!(op["responses"].is_object(), "{m} {p} has no responses");
    }
    // Every $ref resolves.
    fn walk(spec: &Spec, v: &Value) {
        match v {
            Value::Object(o) => {
                if o.contains_key("$ref") {
                    spec.resolve(v);
                }
                o.values().for_each(|x| walk(spec, x));
            }
            Value::Array(a) => a.iter().for_each(|x| walk(spec, x)),
            _ => {}
        }
    }
    walk(&spec, &spec.doc);
    // Every error code of docs/http-api.md is in the Error enum.
    let codes = &spec.doc["components"]["schemas"]["Error"]["properties"]["error"]["properties"]
        ["code"]["enum"];
    let doc = std::fs::read_to_string(
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../docs/http-api.md"),
    )
    .unwrap();
    for line in doc
        .lines()
        .filter(|l| l.starts_with("| 4") || l.starts_with("| 5"))
    {
        let code = line.split('`').nth(1).expect("a code per status row");
        assert!(
            codes.as_array().unwrap().contains(&json!(code)),
            "code {code} missing"
        );
    }
}

#[test]
fn the_validator_catches_missing_fields_wrong_types_and_bad_enums() {
    let spec = Spec::load();
    let order = json!({"id": "1-7-3-x-1", "activity_id": 1, "item_id": 7, "state": "PAID",
        "amount_cents": 100, "created_at_ms": 1, "pay_deadline_ms": 0, "paid_at_ms": 2,
        "updated_at_ms": 2, "failure_reason": ""});
    let mut errs = Vec::new();
    spec.validate(&spec.schema("Order"), &order, "$", &mut errs);
    assert!(errs.is_empty(), "{errs:?}");

    let mut bad = order.clone();
    bad.as_object_mut().unwrap().remove("state");
    bad["item_id"] = json!("7");
    let mut errs = Vec::new();
    spec.validate(&spec.schema("Order"), &bad, "$", &mut errs);
    assert_eq!(errs.len(), 2, "{errs:?}");

    let mut errs = Vec::new();
    spec.validate(
        &spec.schema("OrderState"),
        &json!("SHIPPED"),
        "$",
        &mut errs,
    );
    assert_eq!(errs.len(), 1);

    // allOf: a duplicate refusal needs the error object and the reservation id.
    let mut errs = Vec::new();
    spec.validate(
        &spec.schema("DuplicateError"),
        &json!({"error": {"code": "duplicate", "message": "m"}}),
        "$",
        &mut errs,
    );
    assert_eq!(errs.len(), 1, "{errs:?}");
    let mut errs = Vec::new();
    spec.validate(
        &spec.schema("Error"),
        &json!({"error": {"code": "teapot", "message": "m"}}),
        "$",
        &mut errs,
    );
    assert_eq!(errs.len(), 1, "{errs:?}");
}

#[test]
fn answers_are_matched_to_their_path_templates_and_statuses() {
    let spec = Spec::load();
    let (tpl, _) = spec
        .operation("POST", "/api/v1/activities/1/items/7/reserve")
        .unwrap();
    assert_eq!(tpl, "/api/v1/activities/{a}/items/{s}/reserve");
    assert!(spec
        .operation("GET", "/api/v1/activities/1/items/7/reserve")
        .is_none());
    let mut h = reqwest::header::HeaderMap::new();
    h.insert("content-type", "application/json".parse().unwrap());
    let errs = spec.check(
        "POST",
        "/api/v1/activities/1/items/7/reserve",
        418,
        &h,
        "{}",
    );
    assert_eq!(errs.len(), 1, "an undocumented status is a problem");
    let body = r#"{"error":{"code":"rate_limited","message":"slow down"}}"#;
    let errs = spec.check(
        "POST",
        "/api/v1/activities/1/items/7/reserve",
        429,
        &h,
        body,
    );
    assert!(errs.iter().any(|e| e.contains("Retry-After")), "{errs:?}");
    h.insert("retry-after", "1".parse().unwrap());
    assert!(spec
        .check(
            "POST",
            "/api/v1/activities/1/items/7/reserve",
            429,
            &h,
            body
        )
        .is_empty());
}
