//! Waiting-room calls through the edge, as an app makes them (tokens in the
//! `X-Room-Token` / `X-Room-Admission` headers), and the room's admin knobs.

use serde_json::Value;

use super::http::send;
use super::{Answer, GatewayHandle};

impl GatewayHandle {
    /// `POST /api/v1/activities/{a}/room/join`, with a position token when given.
    pub async fn room_join(&self, jwt: &str, a: u64, place: Option<&str>) -> Answer {
        let h: Vec<(&str, &str)> = place.map(|p| ("x-room-token", p)).into_iter().collect();
        send(
            reqwest::Method::POST,
            format!("{}/api/v1/activities/{a}/room/join", self.base_url()),
            Some(jwt),
            &h,
            None,
        )
        .await
    }

    /// `POST /api/v1/activities/{a}/room/heartbeat` with the position token.
    pub async fn room_beat(&self, jwt: &str, a: u64, place: &str) -> Answer {
        send(
            reqwest::Method::POST,
            format!("{}/api/v1/activities/{a}/room/heartbeat", self.base_url()),
            Some(jwt),
            &[("x-room-token", place)],
            None,
        )
        .await
    }

    /// `POST .../items/{s}/token` with an admission token (or none).
    pub async fn token_admitted(
        &self,
        jwt: &str,
        a: u64,
        s: u64,
        admission: Option<&str>,
    ) -> Answer {
        self.item_post_admitted(jwt, a, s, "token", admission).await
    }

    /// `POST .../items/{s}/challenge` with an optional admission token.
    pub async fn challenge_admitted(
        &self,
        jwt: &str,
        a: u64,
        s: u64,
        admission: Option<&str>,
    ) -> Answer {
        self.item_post_admitted(jwt, a, s, "challenge", admission)
            .await
    }

    /// `POST .../items/{s}/<route>` with an empty JSON body and an optional admission
    /// token (`X-Room-Admission`).
    async fn item_post_admitted(
        &self,
        jwt: &str,
        a: u64,
        s: u64,
        route: &str,
        admission: Option<&str>,
    ) -> Answer {
        let h: Vec<(&str, &str)> = admission
            .map(|t| ("x-room-admission", t))
            .into_iter()
            .collect();
        send(
            reqwest::Method::POST,
            format!(
                "{}/api/v1/activities/{a}/items/{s}/{route}",
                self.base_url()
            ),
            Some(jwt),
            &h,
            Some(serde_json::json!({})),
        )
        .await
    }

    /// Joins the room of `a` and heartbeats every 100 ms (each beat asserted 200) until
    /// admitted: the admission token.
    pub async fn room_wait_admitted(&self, jwt: &str, a: u64) -> String {
        // A join may be admitted at once: with nobody ahead, a tick can land between
        // the join and its answer.
        let mut r = self.room_join(jwt, a, None).await;
        loop {
            assert_eq!(r.status, 200, "{}", r.body);
            if r.body["state"] == "admitted" {
                return r.body["admission_token"].as_str().unwrap().to_string();
            }
            let place = r.body["position_token"]
                .as_str()
                .unwrap_or_else(|| panic!("a position token: {}", r.body))
                .to_string();
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            r = self.room_beat(jwt, a, &place).await;
        }
    }

    /// `POST /room/{a}` on the admin port: live knobs for the whole fleet.
    pub async fn room_knobs(&self, a: u64, knobs: Value) -> Answer {
        send(
            reqwest::Method::POST,
            format!("{}/room/{a}", self.admin_url()),
            None,
            &[],
            Some(knobs),
        )
        .await
    }

    /// [`Self::room_knobs`] for a test that goes on only once the change is made: a 503
    /// (the gateway's Redis call failed, as it may on a loaded machine) is sent again,
    /// as an operator would, for up to 20 s; then the answer must be 200. Without the
    /// check, a lost "resume" shows up much later as a room that never moves.
    pub async fn room_knobs_ok(&self, a: u64, knobs: Value) -> Value {
        let give_up = std::time::Instant::now() + std::time::Duration::from_secs(20);
        loop {
            let r = self.room_knobs(a, knobs.clone()).await;
            if r.status == 503 && std::time::Instant::now() < give_up {
                tokio::time::sleep(std::time::Duration::from_millis(200)).await;
                continue;
            }
            assert_eq!(r.status, 200, "room {a} knobs {knobs}: {}", r.body);
            return r.body;
        }
    }

    /// Sets room `a`'s `paused` knob ([`Self::room_knobs_ok`]) and waits until this
    /// gateway's ticks say so (`GET /room/{a}` on the admin port), up to 20 s.
    pub async fn room_pause(&self, a: u64, paused: bool) {
        self.room_knobs_ok(a, serde_json::json!({ "paused": paused }))
            .await;
        crate::process::wait_until_async(
            &format!("room {a}: paused = {paused}"),
            std::time::Duration::from_secs(20),
            || async { self.room_admin_status(a).await["paused"] == paused },
        )
        .await;
    }

    /// `GET /room/{a}` on the admin port (the status as this gateway last ticked it).
    pub async fn room_admin_status(&self, a: u64) -> Value {
        send(
            reqwest::Method::GET,
            format!("{}/room/{a}", self.admin_url()),
            None,
            &[],
            None,
        )
        .await
        .body
    }
}
