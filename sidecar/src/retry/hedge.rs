//! Hedging: when an attempt has waited the policy's delay without response
//! headers, one speculative duplicate goes to another endpoint, if the same
//! gates a retry passes let it (attempt cap, alternate endpoint, budget,
//! deadline). The first final answer wins and the other attempt is cancelled
//! (dropped: its span ends marked cancelled, and the report's history says
//! so). Only buffered bodies are hedged.

use std::time::Duration;

use tokio::time::Instant;

use super::attempt::{self, Attempted, RequestTemplate};
use super::gate::{self, Decision, Trigger};
use super::verdict;
use super::{BodySource, RetryState};
use crate::exchange::deadline::Stop as DeadlineStop;
use crate::exchange::outcome::{ExhaustedBy, Outcome};
use crate::exchange::report::{AttemptEnd, AttemptRecord};
use crate::observe::spans::RequestSpan;
use crate::random::Random;

/// Sends the attempt to `endpoint` and, if it is still waiting after `delay`,
/// a hedge. Returns the attempt that decides the request; when both fail,
/// the one that failed first has already been settled (its failure counts
/// for health and reporting) and the later one is returned.
pub(crate) async fn race(
    state: &mut RetryState<'_>,
    template: &RequestTemplate,
    body: &BodySource,
    endpoint: usize,
    delay: Duration,
    trace: &RequestSpan,
    random: &mut dyn Random,
) -> Attempted {
    let BodySource::Replay(replay) = body else {
        unreachable!("hedging needs a buffered body");
    };
    let up = state.up;
    let started = Instant::now();
    let until = state.attempt_until(started, template.propagates());
    let sent = replay.for_attempt();
    let (request, span) = template.request(up, endpoint, sent, trace, false, until);
    // Kept for the record of its cancellation: the span goes with the attempt.
    let first_span = span.unrecorded_id();
    let first = attempt::send(
        up,
        endpoint,
        request,
        span,
        started,
        state.attempt_timeout(started),
        state.first_frame,
    );
    tokio::pin!(first);
    tokio::select! {
        done = &mut first => return done,
        () = tokio::time::sleep_until(started + delay) => {}
    }
    let second_endpoint = match gate::decide(Trigger::Slow, state, body, random) {
        Decision::Go { endpoint, .. } => endpoint,
        Decision::Stop(outcome) => {
            state.refused(outcome, trace);
            if outcome == Outcome::Exhausted(ExhaustedBy::Deadline) {
                state.deadline_stop(DeadlineStop::Hedge, trace);
            }
            return first.await;
        }
    };
    state.hedging(second_endpoint, delay, trace, &template.head);
    let now = Instant::now();
    let until = state.attempt_until(now, template.propagates());
    let sent = replay.for_attempt();
    let (request, span) = template.request(up, second_endpoint, sent, trace, true, until);
    let second_span = span.unrecorded_id();
    let second = attempt::send(
        up,
        second_endpoint,
        request,
        span,
        now,
        state.attempt_timeout(now),
        state.first_frame,
    );
    tokio::pin!(second);
    let (done, first_won) = tokio::select! {
        a = &mut first => (a, true),
        b = &mut second => (b, false),
    };
    if verdict::is_final(&done, state.plan.policy, state.grpc) {
        // The other attempt is dropped with this race.
        let (endpoint, started, unrecorded_span) = if first_won {
            (second_endpoint, now, second_span)
        } else {
            (endpoint, started, first_span)
        };
        state.report.push_attempt(AttemptRecord {
            endpoint,
            end: AttemptEnd::Cancelled,
            started,
            elapsed: started.elapsed(),
            unrecorded_span,
        });
        return done;
    }
    // The first to answer failed: it counts, and the other decides.
    let _ = verdict::settle(state, done);
    if first_won {
        second.await
    } else {
        first.await
    }
}
