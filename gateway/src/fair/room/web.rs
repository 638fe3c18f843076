//! The room's routes, as methods of [`Gateway`]:
//!
//! - `GET  /api/v1/activities/{a}/room`: public status (no Redis call);
//! - `POST /api/v1/activities/{a}/room/join`: a ticket (one Redis call), or, with a
//!   valid position token, the same as a heartbeat;
//! - `POST /api/v1/activities/{a}/room/heartbeat`: renews the place (no Redis call
//!   unless this is the admission: then one `HGET`);
//! - `GET  /api/v1/activities/{a}/room/events`: the same state pushed every second as
//!   server-sent events (each event renews the place), until admitted.
//!
//! The position token travels in the header `X-Room-Token`, the cookie `sk_room_<a>`
//! or (SSE) the query `room_token`; the admission token in `X-Room-Admission` or the
//! cookie `sk_admit_<a>`. Answers set both cookies.

use bytes::Bytes;
use pingora::prelude::*;
use pingora::proxy::Session;
use serde_json::{json, Value};

use super::token::{Admission, Position, TokenError};
use super::{admit_cookie, closed, order, place_cookie, presented, refusal, Method};
use crate::answer::{Outcome, Refusal};
use crate::proxy::{Ctx, Gateway, Req};
use crate::sold_out::Activity;

/// The header apps send the position token in.
pub const PLACE_HEADER: &str = "x-room-token";

/// A place's state, and the tokens to hand back.
struct State {
    body: Value,
    place: Option<String>,
    admission: Option<(String, u64)>,
}

fn place_error(e: TokenError) -> Refusal {
    match e {
        TokenError::Expired => refusal(
            410,
            "place_lost",
            "no heartbeat within room.hold_secs: the place is lost; join again",
        ),
        _ => refusal(403, "bad_room_token", e.message()),
    }
}

impl Gateway {
    /// `GET /api/v1/activities/{a}/room`.
    pub(crate) async fn room_status(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        a: u64,
    ) -> Result<bool> {
        if self.shared.catalog.get(a).is_none() {
            return self
                .refuse(session, ctx, Refusal::NotFound("no such activity"))
                .await;
        }
        let body = self.shared.room.status_json(a);
        self.ok(session, ctx, 200, &body).await
    }

    /// The activity, refused when unknown or ended.
    fn room_activity(
        &self,
        a: u64,
        now_ms: u64,
    ) -> std::result::Result<std::sync::Arc<Activity>, Refusal> {
        let act = self
            .shared
            .catalog
            .get(a)
            .ok_or(Refusal::NotFound("no such activity"))?;
        if now_ms as i64 >= act.end_ms {
            return Err(Refusal::Ended);
        }
        Ok(act)
    }

    /// What a join and a heartbeat start from: the live activity, the user, and the
    /// position token presented (header or cookie), if any.
    fn room_request(
        &self,
        session: &Session,
        req: &Req<'_>,
        a: u64,
    ) -> std::result::Result<(std::sync::Arc<Activity>, String, Option<String>), Refusal> {
        let act = self.room_activity(a, req.now_unix_ms)?;
        let user = req.user.clone().unwrap_or_default();
        let token = presented(
            &session.req_header().headers,
            PLACE_HEADER,
            &place_cookie(a),
        );
        Ok((act, user, token))
    }

    /// `POST /api/v1/activities/{a}/room/join`.
    pub(crate) async fn room_join(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        req: Req<'_>,
        a: u64,
    ) -> Result<bool> {
        let room = &self.shared.room;
        let now = req.now_unix_ms;
        let (act, user, token) = match self.room_request(session, &req, a) {
            Ok(x) => x,
            Err(r) => return self.refuse(session, ctx, r).await,
        };
        let held = token.and_then(|t| {
            room.signer
                .check_position(&t, a, &user, room.cfg.hold_secs * 1000, now)
                .ok()
        });
        let place = match (room.method(a), held) {
            (Method::Reject, _) => return self.refuse(session, ctx, closed()).await,
            (Method::Passthrough, _) => return self.room_answer(session, ctx, open(a)).await,
            // Joining again with a live place keeps it: hammering join gains nothing.
            (_, Some(p)) => p,
            (_, None) => match room.join(a, &user, act.start_ms, act.end_ms).await {
                Ok(j) => Position {
                    activity: a,
                    user: user.clone(),
                    ticket: j.ticket,
                    joined_ms: j.redis_ms.max(1),
                    beat_ms: now,
                },
                Err(e) => {
                    tracing::warn!(activity = a, error = %e, "room: join failed in Redis");
                    return self
                        .refuse(session, ctx, Refusal::BackendUnavailable(1))
                        .await;
                }
            },
        };
        match self.room_state(&act, place, now).await {
            Ok(s) => self.room_answer(session, ctx, s).await,
            Err(r) => self.refuse(session, ctx, r).await,
        }
    }

    /// `POST /api/v1/activities/{a}/room/heartbeat`.
    pub(crate) async fn room_beat(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        req: Req<'_>,
        a: u64,
    ) -> Result<bool> {
        let now = req.now_unix_ms;
        let (act, user, token) = match self.room_request(session, &req, a) {
            Ok(x) => x,
            Err(r) => return self.refuse(session, ctx, r).await,
        };
        let r = self.room_place(&act, token.as_deref(), &user, now).await;
        match r {
            Ok(s) => self.room_answer(session, ctx, s).await,
            Err(r) => self.refuse(session, ctx, r).await,
        }
    }

    /// A presented position token's state (a heartbeat).
    async fn room_place(
        &self,
        act: &Activity,
        token: Option<&str>,
        user: &str,
        now: u64,
    ) -> std::result::Result<State, Refusal> {
        let room = &self.shared.room;
        let a = act.id;
        match room.method(a) {
            Method::Reject => return Err(closed()),
            Method::Passthrough => return Ok(open(a)),
            _ => {}
        }
        let token = token.ok_or(refusal(
            400,
            "room_token_required",
            "send the position token from join (X-Room-Token header or sk_room_<a> cookie)",
        ))?;
        let place = room
            .signer
            .check_position(token, a, user, room.cfg.hold_secs * 1000, now)
            .map_err(place_error)?;
        self.room_state(act, place, now).await
    }

    /// The state of `place` now; signs the renewed position token, and the admission
    /// token once the watermark has passed the place.
    async fn room_state(
        &self,
        act: &Activity,
        place: Position,
        now: u64,
    ) -> std::result::Result<State, Refusal> {
        let room = &self.shared.room;
        let cfg = &room.cfg;
        let a = act.id;
        let renewed = Position {
            beat_ms: now,
            ..place.clone()
        };
        let live = room.live(a);
        let position = live.as_ref().and_then(|l| l.layout.position(place.ticket));
        let mut body = json!({
            "activity_id": a,
            "ticket": place.ticket,
            "opens_at_ms": act.start_ms,
            "server_time_ms": now,
            "heartbeat_secs": cfg.heartbeat_secs,
            "hold_secs": cfg.hold_secs,
            "paused": live.as_ref().is_some_and(|l| l.paused),
        });
        let (Some(l), Some(pos)) = (live, position) else {
            // Before the opening: the pre-queue is drawn at the opening.
            body["state"] = json!("pre_queue");
            body["position"] = Value::Null;
            body["queued"] = json!(room.live(a).map_or(0, |l| l.next));
            body["opens_in_ms"] = json!((act.start_ms - now as i64).max(0));
            let place = room.signer.position(&renewed);
            body["position_token"] = json!(place);
            return Ok(State {
                body,
                place: Some(place),
                admission: None,
            });
        };
        if pos <= l.admitted {
            let latest = room
                .is_latest(a, &place.user, place.ticket)
                .await
                .map_err(|e| {
                    tracing::warn!(activity = a, error = %e, "room: admission check failed in Redis");
                    Refusal::BackendUnavailable(1)
                })?;
            if !latest {
                return Err(refusal(
                    409,
                    "place_superseded",
                    "a later join of this user holds the place; use its token",
                ));
            }
            let adm = Admission {
                activity: a,
                user: place.user.clone(),
                ticket: place.ticket,
                admitted_ms: now,
                expires_ms: now + cfg.session_secs * 1000,
            };
            let t = room.signer.admission(&adm);
            room.metrics
                .admissions
                .with_label_values(&[&a.to_string()])
                .inc();
            body["state"] = json!("admitted");
            body["position"] = json!(0);
            body["ahead"] = json!(0);
            body["admission_token"] = json!(t);
            body["admission_expires_at_ms"] = json!(adm.expires_ms);
            return Ok(State {
                body,
                place: None,
                admission: Some((t, adm.expires_ms)),
            });
        }
        let ahead = order::ahead(pos, l.admitted);
        let place = room.signer.position(&renewed);
        body["state"] = json!("waiting");
        body["position"] = json!(ahead + 1);
        body["ahead"] = json!(ahead);
        body["queued"] = json!(l.queued());
        body["eta_secs"] = json!(order::eta_secs(ahead, l.eta_rate()));
        body["position_token"] = json!(place);
        Ok(State {
            body,
            place: Some(place),
            admission: None,
        })
    }

    /// A state as JSON, with the tokens in cookies too.
    async fn room_answer(&self, session: &mut Session, ctx: &mut Ctx, s: State) -> Result<bool> {
        let a = s.body["activity_id"].as_u64().unwrap_or(0);
        let cfg = &self.shared.room.cfg;
        let bytes = Bytes::from(serde_json::to_vec(&s.body).unwrap_or_default());
        let mut h = pingora::http::ResponseHeader::build(200, Some(6))?;
        h.insert_header("content-type", "application/json")?;
        h.insert_header("cache-control", "no-store")?;
        h.insert_header("content-length", bytes.len().to_string())?;
        if let Some(p) = &s.place {
            h.append_header(
                "set-cookie",
                format!(
                    "{}={p}; Path=/; Max-Age={}; HttpOnly; SameSite=Strict",
                    place_cookie(a),
                    cfg.hold_secs
                ),
            )?;
        }
        if let Some((t, _)) = &s.admission {
            h.append_header(
                "set-cookie",
                format!(
                    "{}={t}; Path=/; Max-Age={}; HttpOnly; SameSite=Strict",
                    admit_cookie(a),
                    cfg.session_secs
                ),
            )?;
        }
        if let Some(t) = &ctx.trace {
            h.insert_header("traceparent", t.to_string())?;
        }
        ctx.outcome = Outcome::Ok;
        session.write_response_header(Box::new(h), false).await?;
        session.write_response_body(Some(bytes), true).await?;
        Ok(true)
    }

    /// `GET /api/v1/activities/{a}/room/events`: the state every second (each event
    /// renews the place and carries the new position token) until admitted, the place
    /// is refused, or the client leaves.
    pub(crate) async fn room_events(
        &self,
        session: &mut Session,
        ctx: &mut Ctx,
        req: Req<'_>,
        a: u64,
    ) -> Result<bool> {
        let user = req.user.unwrap_or_default();
        let act = match self.room_activity(a, req.now_unix_ms) {
            Ok(act) => act,
            Err(r) => return self.refuse(session, ctx, r).await,
        };
        let from_query = session.req_header().uri.query().and_then(|q| {
            q.split('&')
                .find_map(|kv| kv.strip_prefix("room_token="))
                .filter(|t| !t.is_empty())
                .map(str::to_string)
        });
        let mut token = from_query.or_else(|| {
            presented(
                &session.req_header().headers,
                PLACE_HEADER,
                &place_cookie(a),
            )
        });
        // The first state is checked before the stream opens, so a bad token gets a
        // plain JSON refusal.
        let mut state = match self
            .room_place(&act, token.as_deref(), &user, req.now_unix_ms)
            .await
        {
            Ok(s) => s,
            Err(r) => return self.refuse(session, ctx, r).await,
        };
        self.open_event_stream(session, ctx).await?;
        loop {
            let done = state.body["state"] != "waiting" && state.body["state"] != "pre_queue";
            let data = serde_json::to_string(&state.body).unwrap_or_default();
            session
                .write_response_body(
                    Some(Bytes::from(format!("event: room\ndata: {data}\n\n"))),
                    done,
                )
                .await?;
            if done {
                return Ok(true);
            }
            if let Some(p) = state.place.take() {
                token = Some(p);
            }
            tokio::time::sleep(std::time::Duration::from_secs(1)).await;
            let now = seckill_lua::clock::unix_ms();
            state = match self.room_place(&act, token.as_deref(), &user, now).await {
                Ok(s) => s,
                Err(r) => {
                    let data = json!({"error": {"code": refusal_code(&r), "message": "the place was refused; join again"}});
                    session
                        .write_response_body(
                            Some(Bytes::from(format!("event: error\ndata: {data}\n\n"))),
                            true,
                        )
                        .await?;
                    return Ok(true);
                }
            };
        }
    }
}

fn refusal_code(r: &Refusal) -> &'static str {
    match r {
        Refusal::Room { code, .. } => code,
        Refusal::Ended => "ended",
        _ => "refused",
    }
}

/// Passthrough: no queue, the buy flow is open.
fn open(a: u64) -> State {
    State {
        body: json!({"activity_id": a, "state": "open", "position": 0}),
        place: None,
        admission: None,
    }
}
