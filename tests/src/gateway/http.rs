//! JSON calls through the edge as a browser or app makes them, as methods of
//! [`GatewayHandle`]: [`GatewayHandle::get`], [`GatewayHandle::post`],
//! [`GatewayHandle::purchase_token`], [`GatewayHandle::reserve`], and [`call`] for a
//! request with an `X-Forwarded-For` or another base URL.

use serde_json::{json, Value};

use super::GatewayHandle;

/// One answer of the edge: status, JSON body (`null` when not JSON), `Retry-After`.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub body: Value,
    pub retry_after: Option<String>,
}

impl Answer {
    /// The stable error code of a refusal (`error.code`), or "".
    pub fn code(&self) -> &str {
        self.body["error"]["code"].as_str().unwrap_or("")
    }
}

/// `method url` with an optional bearer JWT, JSON body and `X-Forwarded-For`.
pub async fn call(
    method: reqwest::Method,
    url: String,
    jwt: Option<&str>,
    body: Option<Value>,
    xff: Option<&str>,
) -> Answer {
    let xff: Vec<(&str, &str)> = xff.map(|ip| ("x-forwarded-for", ip)).into_iter().collect();
    send(method, url, jwt, &xff, body).await
}

/// `method url` with an optional bearer JWT, extra headers and JSON body.
pub async fn send(
    method: reqwest::Method,
    url: String,
    jwt: Option<&str>,
    headers: &[(&str, &str)],
    body: Option<Value>,
) -> Answer {
    let mut req = reqwest::Client::new().request(method, url);
    if let Some(t) = jwt {
        req = req.bearer_auth(t);
    }
    for (k, v) in headers {
        req = req.header(*k, *v);
    }
    if let Some(b) = body {
        req = req.json(&b);
    }
    let r = req.send().await.expect("request");
    let status = r.status().as_u16();
    let retry_after = r
        .headers()
        .get("retry-after")
        .and_then(|v| v.to_str().ok())
        .map(str::to_string);
    let text = r.text().await.unwrap_or_default();
    Answer {
        status,
        body: serde_json::from_str(&text).unwrap_or(Value::Null),
        retry_after,
    }
}

impl GatewayHandle {
    /// `GET path` on the plain port.
    pub async fn get(&self, path: &str, jwt: Option<&str>) -> Answer {
        call(
            reqwest::Method::GET,
            format!("{}{path}", self.base_url()),
            jwt,
            None,
            None,
        )
        .await
    }

    /// `POST path` with a JSON body on the plain port.
    pub async fn post(&self, path: &str, jwt: Option<&str>, body: Value) -> Answer {
        call(
            reqwest::Method::POST,
            format!("{}{path}", self.base_url()),
            jwt,
            Some(body),
            None,
        )
        .await
    }

    /// A purchase token for `(a, s)`; panics unless the edge gives one.
    pub async fn purchase_token(&self, jwt: &str, a: u64, s: u64) -> String {
        let r = self
            .post(
                &format!("/api/v1/activities/{a}/items/{s}/token"),
                Some(jwt),
                json!({}),
            )
            .await;
        assert_eq!(r.status, 200, "{}", r.body);
        r.body["purchase_token"].as_str().unwrap().to_string()
    }

    /// A reserve of `(a, s)` with `token` (no request id: the edge derives one).
    pub async fn reserve(&self, jwt: &str, a: u64, s: u64, token: &str) -> Answer {
        self.post(
            &format!("/api/v1/activities/{a}/items/{s}/reserve"),
            Some(jwt),
            json!({"purchase_token": token}),
        )
        .await
    }
}
