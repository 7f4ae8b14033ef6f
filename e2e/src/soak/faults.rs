//! The fault schedule and the three endpoints.
//!
//! Each endpoint is a test-kit upstream whose script rolls the faults in
//! force at the moment a request arrives; what it chose and whether the
//! answer went out are in the upstream's record, read back as [`Rec`]s after
//! the run. The churn endpoint's listener follows the schedule's down
//! intervals ([`churn`]).

use std::sync::{Arc, Mutex};
use std::time::Duration;

use bytes::Bytes;
use rand::Rng;
use reprise_testkit::upstream::{Action, ActionKind, Deliveries, Received, Upstream};

use super::{lock, ms_at, now_ms};

/// Length of one fault cycle; the first `CALM_MS` of each cycle have no faults.
const CYCLE_MS: u64 = 60_000;
const CALM_MS: u64 = 10_000;
/// The churn endpoint's listener is closed during these parts of each cycle.
const B_DOWN: [(u64, u64); 2] = [(20_000, 23_000), (40_000, 45_000)];
/// A stalled attempt waits this long (the attempt timeout is 400 ms) and closes.
const STALL: Duration = Duration::from_millis(1_500);
/// An attempt the churn endpoint never saw is explained by its downtime when
/// the request overlapped a down interval widened by this much.
const DOWN_SLACK_MS: u64 = 1_000;
/// Longest hold a client may ask for (`x-soak-delay-ms`).
const MAX_DELAY_MS: u64 = 2_000;

/// Faults in force at one moment (percentages of requests).
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Faults {
    a_503: u32,
    c_reset: u32,
    c_abort: u32,
    c_stall: u32,
    b_down: bool,
}

impl Faults {
    pub fn any(&self) -> bool {
        self.a_503 > 0 || self.c_reset > 0 || self.c_abort > 0 || self.c_stall > 0 || self.b_down
    }
}

/// Cycle k (60 s): 10 s calm, then faults whose strength rotates light, storm,
/// medium: endpoint a answers 503 to 20%, 90% or 50% of its requests; endpoint c
/// resets before headers, aborts mid-body or stalls (8%, 15% or 8% in all);
/// endpoint b's listener is closed from 20 s to 23 s and from 40 s to 45 s.
pub(crate) fn faults_at(t: u64) -> Faults {
    let k = (t / CYCLE_MS) % 3;
    let s = t % CYCLE_MS;
    if s < CALM_MS {
        return Faults::default();
    }
    let storm = k == 1;
    Faults {
        a_503: [20, 90, 50][k as usize],
        c_reset: if storm { 8 } else { 4 },
        c_abort: if storm { 3 } else { 2 },
        c_stall: if storm { 4 } else { 2 },
        b_down: B_DOWN.iter().any(|(from, to)| (*from..*to).contains(&s)),
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Role {
    /// Answers 503 to a share of requests.
    Status503,
    /// Killed and restarted on the same port.
    Churn,
    /// Resets before headers, aborts mid-body, stalls.
    Transport,
}

/// What an endpoint did with one request.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) enum Act {
    Ok,
    S503,
    Reset,
    Abort,
    Stall,
}

impl Act {
    pub fn name(self) -> &'static str {
        match self {
            Act::Ok => "200",
            Act::S503 => "503",
            Act::Reset => "reset before headers",
            Act::Abort => "abort mid-body",
            Act::Stall => "stall",
        }
    }

    /// The action the upstream runs for this act (after the request's delay).
    fn action(self, id: u64, name: &str, resp_size: usize) -> Action {
        let answer = |status: u16, body: Vec<u8>| {
            Action::ReplyWith(
                status,
                vec![("x-soak-endpoint", name.to_string())],
                Bytes::from(body),
            )
        };
        match self {
            Act::Ok => {
                let mut body = format!("ok {id} {name}\n").into_bytes();
                if resp_size > body.len() {
                    body.resize(resp_size, b'.');
                }
                answer(200, body)
            }
            Act::S503 => answer(503, format!("unavailable {id} {name}\n").into_bytes()),
            Act::Reset => Action::Reset,
            Act::Abort => Action::AbortMidBody,
            Act::Stall => Action::Hold(STALL),
        }
    }

    /// The act an upstream record shows. The soak's script chooses only the
    /// actions of [`Act::action`].
    fn of(kind: Option<ActionKind>) -> Act {
        match kind {
            Some(ActionKind::Reply(200)) => Act::Ok,
            Some(ActionKind::Reply(_)) => Act::S503,
            Some(ActionKind::AbortMidBody) => Act::Abort,
            Some(ActionKind::Hold) => Act::Stall,
            _ => Act::Reset,
        }
    }
}

/// One request as an endpoint received it.
#[derive(Clone, Debug)]
pub(crate) struct Rec {
    pub id: u64,
    pub method: String,
    pub t_ms: u64,
    pub act: Act,
    /// The whole answer was written (false: a fault, or killed while answering).
    pub done: bool,
    /// The body's checksum matched the client's `x-soak-sum`.
    pub body_ok: bool,
    /// `x-reprise-attempt`, 0 when absent.
    pub attempt: u32,
}

impl Rec {
    /// True when this delivery was a healthy, complete answer.
    pub fn healthy(&self) -> bool {
        self.act == Act::Ok && self.done
    }

    fn of(r: &Received) -> Rec {
        let sum = r
            .header("x-soak-sum")
            .and_then(|v| u64::from_str_radix(v.trim(), 16).ok());
        Rec {
            id: request_id(r),
            method: r.method.clone(),
            t_ms: ms_at(r.at),
            act: Act::of(r.action),
            done: r.answered,
            body_ok: sum.is_none_or(|s| s == r.body_digest),
            attempt: r.attempt.unwrap_or(0),
        }
    }
}

fn request_id(r: &Received) -> u64 {
    r.id.as_deref()
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

fn number(r: &Received, header: &str) -> u64 {
    r.header(header)
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0)
}

#[derive(Debug)]
pub(crate) struct Endpoint {
    pub name: &'static str,
    pub role: Role,
    pub up: Upstream,
    /// Intervals (ms) during which the listener was closed; `u64::MAX` while down.
    pub down: Mutex<Vec<(u64, u64)>>,
}

impl Endpoint {
    pub async fn start(
        name: &'static str,
        role: Role,
        deliveries: &Deliveries,
    ) -> std::io::Result<Arc<Self>> {
        let up = Upstream::builder()
            // A 10-minute run would keep gigabytes of bodies; their digests suffice.
            .keep_bodies(false)
            .count_ids("x-soak-id", deliveries)
            .start(move |r| script(name, role, r))
            .await?;
        Ok(Arc::new(Endpoint {
            name,
            role,
            up,
            down: Mutex::default(),
        }))
    }

    /// Every request it received, in the order recorded.
    pub fn records(&self) -> Vec<Rec> {
        self.up.received().iter().map(Rec::of).collect()
    }

    /// True when the listener was down at some moment in `[from, to]` (widened by the slack).
    pub fn was_down(&self, from: u64, to: u64) -> bool {
        let from = from.saturating_sub(DOWN_SLACK_MS);
        let to = to.saturating_add(DOWN_SLACK_MS);
        lock(&self.down).iter().any(|(d, u)| *d <= to && *u >= from)
    }
}

fn choose(role: Role, f: Faults) -> Act {
    let roll = rand::rng().random_range(0..100u32);
    match role {
        Role::Churn => Act::Ok,
        Role::Status503 if roll < f.a_503 => Act::S503,
        Role::Status503 => Act::Ok,
        Role::Transport if roll < f.c_reset => Act::Reset,
        Role::Transport if roll < f.c_reset + f.c_abort => Act::Abort,
        Role::Transport if roll < f.c_reset + f.c_abort + f.c_stall => Act::Stall,
        Role::Transport => Act::Ok,
    }
}

/// What endpoint `name` does with request `r`: the faults in force now, after
/// the processing time the client asked for (drain probes) and, on the churn
/// endpoint, a few ms so that a kill can catch answers in progress.
fn script(name: &str, role: Role, r: &Received) -> Action {
    let mut delay = number(r, "x-soak-delay-ms").min(MAX_DELAY_MS);
    if role == Role::Churn {
        delay += rand::rng().random_range(0..20);
    }
    let act = choose(role, faults_at(ms_at(r.at)));
    let resp_size = usize::try_from(number(r, "x-soak-resp")).unwrap_or(0);
    let action = act.action(request_id(r), name, resp_size);
    if delay > 0 {
        Action::Delay(Duration::from_millis(delay), Box::new(action))
    } else {
        action
    }
}

/// The churn endpoint follows the schedule: every 100 ms, closes or reopens its
/// listener. Ends at `until_ms`.
pub(crate) async fn churn(ep: Arc<Endpoint>, until_ms: u64) -> anyhow::Result<()> {
    let reopen = |ep: Arc<Endpoint>| async move {
        ep.up.reopen().await.map_err(|e| {
            anyhow::anyhow!("{}: cannot listen on {} again: {e}", ep.name, ep.up.addr)
        })?;
        if let Some(last) = lock(&ep.down).last_mut() {
            last.1 = now_ms();
        }
        anyhow::Ok(())
    };
    let ticks = until_ms / 100 + 10;
    for _ in 0..ticks {
        let now = now_ms();
        if now >= until_ms {
            break;
        }
        let want_down = faults_at(now).b_down;
        if want_down && ep.up.is_open() {
            ep.up.close();
            lock(&ep.down).push((now, u64::MAX));
        } else if !want_down && !ep.up.is_open() {
            reopen(Arc::clone(&ep)).await?;
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    if !ep.up.is_open() {
        reopen(ep).await?;
    }
    Ok(())
}
