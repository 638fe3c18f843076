//! Writes a replica must hold before they count (`redis.replica_acks` of stockd and
//! orderd): group commit per Redis master.
//!
//! `WAIT n t` counts the replicas that acknowledged everything *its connection* wrote,
//! and blocks that connection meanwhile, so a call and its `WAIT` must share a
//! connection that nothing else uses while it waits. Each master has a [`Lane`]: the
//! script calls that become ready while the lane's previous pipeline is in flight queue,
//! and go together in its next one, `EVALSHA` after `EVALSHA` and ONE `WAIT` at the end,
//! on a client borrowed for that pipeline alone ([`Clients`]). One `WAIT` then covers the
//! calls of every shard of that master (the shards' own group commit already put several
//! reservations in each call). The calls do not share a write: fred 10.1 flushes the
//! socket after every `EVALSHA` and every custom command (`CommandKind::should_flush`),
//! so a pipeline of n calls is n + 1 writes on one connection (docs/load-testing.md,
//! "stockd's system calls"). As with the shards' queues there is no timer: a lone call
//! goes at once.
//!
//! A call counts as replicated when `WAIT` saw enough replicas and its slot's master did
//! not change while the pipeline ran (a redirected script may have run on a new master
//! that the `WAIT` did not ask).

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use fred::prelude::*;
use fred::types::cluster::ClusterRouting;
use fred::types::config::{Options, Server};
use fred::types::{ClusterHash, CustomCommand, Value};
use prometheus::IntCounter;
use seckill_lua::calls::Call;
use tokio::sync::{oneshot, Semaphore};

use crate::redis::Scripts;

/// The script's answer, and whether the replicas hold its writes.
pub type Answer = Result<(Value, bool), fred::error::Error>;

/// One script call waiting for its master's next pipeline.
struct Job {
    /// `EVALSHA`'s arguments: sha, key count, keys, args.
    eval: Vec<Value>,
    slot: u16,
    /// Already met `NOSCRIPT` once and was sent again after a reload.
    reloaded: bool,
    answer: oneshot::Sender<Answer>,
}

#[derive(Default)]
struct Lane {
    state: Mutex<LaneState>,
}

#[derive(Default)]
struct LaneState {
    waiting: Vec<Job>,
    running: bool,
}

/// Replica-acknowledged script calls, by master.
pub struct Acks {
    clients: Clients,
    lanes: Mutex<HashMap<Server, Arc<Lane>>>,
    scripts: Scripts,
    /// Counts the script reloads a `NOSCRIPT` caused, when the caller counts them.
    reloads: Option<IntCounter>,
    replicas: i64,
    timeout_ms: i64,
}

impl Acks {
    /// Calls through `clients` (each lent to one pipeline at a time), waiting for
    /// `replicas` replicas up to `timeout` per pipeline; `reloads`, if any, counts the
    /// script reloads after `NOSCRIPT`.
    pub fn new(
        clients: Vec<Client>,
        scripts: Scripts,
        reloads: Option<IntCounter>,
        replicas: u32,
        timeout: Duration,
    ) -> Self {
        Self {
            clients: Clients::new(clients),
            lanes: Mutex::default(),
            scripts,
            reloads,
            replicas: i64::from(replicas),
            timeout_ms: timeout.as_millis() as i64,
        }
    }

    /// One typed script call (`seckill_lua::calls`) on the master of `slot_key`'s slot,
    /// with [`Self::call`].
    pub async fn call_script<C: Call>(self: &Arc<Self>, call: C, slot_key: &str) -> Answer {
        let (keys, args) = call.into_parts();
        // EVALSHA's arguments, built once (the strings move in; a resend after NOSCRIPT
        // clones reference-counted values, not the bytes).
        let mut eval: Vec<Value> = Vec::with_capacity(2 + keys.len() + args.len());
        eval.push(self.scripts.sha(&C::SCRIPT).into());
        eval.push((keys.len() as i64).into());
        eval.extend(keys.into_iter().map(Value::from));
        eval.extend(args.into_iter().map(Value::from));
        self.call(eval, fred::util::redis_keyslot(slot_key.as_bytes()))
            .await
    }

    /// Runs `eval` (sha, key count, keys, args) on `slot`'s master and waits for the
    /// replicas; the script's answer and whether they hold its writes.
    pub async fn call(self: &Arc<Self>, eval: Vec<Value>, slot: u16) -> Answer {
        let Some(master) = self.clients.any().and_then(|c| master_of(&c, slot)) else {
            return Err(fred::error::Error::new(
                fred::error::ErrorKind::Cluster,
                "no master known for the slot yet",
            ));
        };
        let lane = self
            .lanes
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .entry(master)
            .or_default()
            .clone();
        let (tx, rx) = oneshot::channel();
        let job = Job {
            eval,
            slot,
            reloaded: false,
            answer: tx,
        };
        if lane.push(job) {
            tokio::spawn(Arc::clone(self).drive(lane));
        }
        rx.await.unwrap_or_else(|_| {
            Err(fred::error::Error::new(
                fred::error::ErrorKind::Canceled,
                "the acknowledged call was dropped",
            ))
        })
    }

    /// Runs `lane`'s pipelines back to back until it is empty.
    async fn drive(self: Arc<Self>, lane: Arc<Lane>) {
        loop {
            // The calls already runnable join this pipeline (no timer).
            tokio::task::yield_now().await;
            let jobs = {
                let mut st = lane.state.lock().unwrap_or_else(|p| p.into_inner());
                if st.waiting.is_empty() {
                    st.running = false;
                    return;
                }
                std::mem::take(&mut st.waiting)
            };
            let again = self.pipeline(jobs).await;
            if !again.is_empty() {
                lane.state
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .waiting
                    .splice(0..0, again);
            }
        }
    }

    /// One pipeline: every job's `EVALSHA`, then one `WAIT`. Answers every job but
    /// those that met `NOSCRIPT` for the first time (after a reload): returned, to go
    /// again.
    async fn pipeline(&self, jobs: Vec<Job>) -> Vec<Job> {
        let Some(lent) = self.clients.borrow().await else {
            for j in jobs {
                let _ = j.answer.send(Err(fred::error::Error::new(
                    fred::error::ErrorKind::Canceled,
                    "ack clients closed",
                )));
            }
            return Vec::new();
        };
        let client = lent.client();
        // One copy of the routing table before the pipeline and one after, not one per
        // job and lookup (each copy allocates).
        let routing = client.cached_cluster_state();
        let masters: Vec<Option<Server>> = jobs
            .iter()
            .map(|j| owner(routing.as_ref(), j.slot))
            .collect();
        let mark = self.scripts.mark();
        let p = client.pipeline();
        let mut queued: Result<(), fred::error::Error> = Ok(());
        for j in &jobs {
            // A pipeline has no EVALSHA of its own (fred routes scripts by their keys):
            // the command is spelled out and routed to the job's slot.
            let cmd = CustomCommand::new_static("EVALSHA", ClusterHash::Custom(j.slot), false);
            if let Err(e) = p.custom::<(), _>(cmd, j.eval.clone()).await {
                queued = Err(e);
            }
        }
        let on_slot = Options {
            cluster_hash: Some(ClusterHash::Custom(jobs[0].slot)),
            ..Default::default()
        };
        if queued.is_ok() {
            queued = p
                .with_options(&on_slot)
                .wait::<()>(self.replicas, self.timeout_ms)
                .await;
        }
        if let Err(e) = queued {
            for j in jobs {
                let _ = j.answer.send(Err(e.clone()));
            }
            return Vec::new();
        }
        let mut answers = p.try_all::<Value>().await;
        let waited = answers
            .pop()
            .and_then(|w| w.ok())
            .and_then(|v| v.as_i64())
            .unwrap_or(0);
        // The node the WAIT asked: a job counts only if its script ran there too.
        let asked = masters[0].clone();
        let routing = client.cached_cluster_state();
        let mut again = Vec::new();
        let mut reload = false;
        for ((mut j, answer), before) in jobs.into_iter().zip(answers).zip(masters) {
            match answer {
                Err(e) if crate::redis::is_noscript(&e) && !j.reloaded => {
                    j.reloaded = true;
                    reload = true;
                    again.push(j);
                }
                Err(e) => {
                    let _ = j.answer.send(Err(e));
                }
                Ok(value) => {
                    let moved = before.is_none()
                        || before != asked
                        || before != owner(routing.as_ref(), j.slot);
                    let _ = j
                        .answer
                        .send(Ok((value, !moved && waited >= self.replicas)));
                }
            }
        }
        if reload {
            tracing::info!("NOSCRIPT: loading scripts again");
            match self.scripts.reload_after(client, mark).await {
                Ok(true) => {
                    if let Some(reloads) = &self.reloads {
                        reloads.inc();
                    }
                }
                Ok(false) => {}
                Err(e) => {
                    for j in again {
                        let _ = j.answer.send(Err(e.clone()));
                    }
                    return Vec::new();
                }
            }
        }
        again
    }

    /// Waits up to `timeout` for every client's first connection (and so its routing
    /// table: until then a call fails with "no master known for the slot yet").
    pub async fn wait_for_connect(&self, timeout: Duration) {
        for c in &self.clients.all {
            let _ = tokio::time::timeout(timeout, c.wait_for_connect()).await;
        }
    }

    pub async fn quit(&self) {
        self.clients.quit().await;
    }
}

impl Lane {
    /// Queues `job`; true when no driver runs (the caller starts one).
    fn push(&self, job: Job) -> bool {
        let mut st = self.state.lock().unwrap_or_else(|p| p.into_inner());
        st.waiting.push(job);
        !std::mem::replace(&mut st.running, true)
    }
}

/// The master the client's routing table names for `slot`.
pub fn master_of(client: &Client, slot: u16) -> Option<Server> {
    owner(client.cached_cluster_state().as_ref(), slot)
}

/// The master `routing` names for `slot`.
fn owner(routing: Option<&ClusterRouting>, slot: u16) -> Option<Server> {
    routing.and_then(|r| r.get_server(slot).cloned())
}

/// Clients each lent to one pipeline at a time.
struct Clients {
    all: Vec<Client>,
    free: Mutex<Vec<Client>>,
    permits: Semaphore,
}

impl Clients {
    fn new(all: Vec<Client>) -> Self {
        Self {
            permits: Semaphore::new(all.len()),
            free: Mutex::new(all.clone()),
            all,
        }
    }

    /// Any client, for reading the routing table.
    fn any(&self) -> Option<Client> {
        self.all.first().cloned()
    }

    async fn borrow(&self) -> Option<Borrowed<'_>> {
        let permit = self.permits.acquire().await.ok()?;
        let client = self.free.lock().unwrap_or_else(|p| p.into_inner()).pop()?;
        permit.forget();
        Some(Borrowed {
            owner: self,
            client: Some(client),
        })
    }

    async fn quit(&self) {
        for c in &self.all {
            let _ = c.quit().await;
        }
    }
}

/// A borrowed client; goes back on drop.
struct Borrowed<'a> {
    owner: &'a Clients,
    client: Option<Client>,
}

impl Borrowed<'_> {
    fn client(&self) -> &Client {
        self.client.as_ref().expect("held until drop")
    }
}

impl Drop for Borrowed<'_> {
    fn drop(&mut self) {
        if let Some(c) = self.client.take() {
            self.owner
                .free
                .lock()
                .unwrap_or_else(|p| p.into_inner())
                .push(c);
            self.owner.permits.add_permits(1);
        }
    }
}
