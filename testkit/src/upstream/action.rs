//! What a script tells the upstream to do with a request, and the shape of
//! that choice as recorded.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use bytes::Bytes;

use super::Received;

/// Nested [`Action::Delay`]s beyond this depth are not unwrapped.
const MAX_DELAYS: usize = 16;

/// What the upstream does with one request.
#[derive(Clone, Debug)]
pub enum Action {
    /// Answer with this status and the body `from PORT\n`.
    Reply(u16),
    /// Answer with a status, extra headers and a body.
    ReplyWith(u16, Vec<(&'static str, String)>, Bytes),
    /// Answer 200 with the request's body.
    Echo,
    /// Wait, then answer 200 (`from PORT\n`): `Delay(d, Reply(200))`.
    Stall(Duration),
    /// Wait, then do the action.
    Delay(Duration, Box<Action>),
    /// Send a 200 head announcing the body's length at once, the body after the wait.
    SlowBody(Duration, Bytes),
    /// Stall past a timeout: wait, then close the connection without answering.
    Hold(Duration),
    /// Send a head announcing [`ABORT_LENGTH`](super::ABORT_LENGTH) bytes and a part of them, then reset.
    AbortMidBody,
    /// Reset the connection (RST) after reading the request.
    Reset,
    /// Close the connection (FIN) after reading the request, without answering.
    Close,
    /// Send FIN after reading the request and keep reading until the peer
    /// closes or [`HALF_CLOSE_WAIT`](super::HALF_CLOSE_WAIT) passes.
    HalfClose,
}

/// What the script chose for a request, as recorded (delays unwrapped).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum ActionKind {
    /// Answered (or began to answer) with this status.
    Reply(u16),
    /// [`Action::Hold`].
    Hold,
    /// [`Action::AbortMidBody`].
    AbortMidBody,
    /// [`Action::Reset`].
    Reset,
    /// [`Action::Close`].
    Close,
    /// [`Action::HalfClose`].
    HalfClose,
}

impl Action {
    /// Answers `status` with a text body.
    pub fn text(status: u16, body: impl Into<String>) -> Action {
        Action::ReplyWith(status, Vec::new(), Bytes::from(body.into()))
    }

    /// The total wait before the action proper, and that action.
    pub(crate) fn unwrap_delays(self) -> (Duration, Action) {
        let mut wait = Duration::ZERO;
        let mut action = self;
        for _ in 0..MAX_DELAYS {
            action = match action {
                Action::Delay(d, next) => {
                    wait += d;
                    *next
                }
                Action::Stall(d) => {
                    wait += d;
                    Action::Reply(200)
                }
                other => return (wait, other),
            };
        }
        (wait, action)
    }

    /// What this action does, once its delays are over.
    pub fn kind(&self) -> ActionKind {
        match self.clone().unwrap_delays().1 {
            Action::Reply(s) | Action::ReplyWith(s, _, _) => ActionKind::Reply(s),
            Action::Echo | Action::SlowBody(_, _) | Action::Stall(_) | Action::Delay(_, _) => {
                ActionKind::Reply(200)
            }
            Action::Hold(_) => ActionKind::Hold,
            Action::AbortMidBody => ActionKind::AbortMidBody,
            Action::Reset => ActionKind::Reset,
            Action::Close => ActionKind::Close,
            Action::HalfClose => ActionKind::HalfClose,
        }
    }
}

/// A script shared by clones: whichever upstream gets the very first request
/// of all that run a clone does `first`; every other request gets `rest`.
pub fn first_then(
    first: Action,
    rest: Action,
) -> impl Fn(&Received) -> Action + Clone + Send + Sync {
    let seen = Arc::new(AtomicUsize::new(0));
    move |_| {
        if seen.fetch_add(1, Ordering::SeqCst) == 0 {
            first.clone()
        } else {
            rest.clone()
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_unwrap_to_the_action_they_wrap() {
        let a = Action::Delay(
            Duration::from_millis(5),
            Box::new(Action::Stall(Duration::from_millis(7))),
        );
        assert_eq!(a.kind(), ActionKind::Reply(200));
        let (wait, _) = a.unwrap_delays();
        assert_eq!(wait, Duration::from_millis(12));
        assert_eq!(
            Action::Delay(Duration::ZERO, Box::new(Action::Reset)).kind(),
            ActionKind::Reset
        );
        assert_eq!(Action::text(503, "busy").kind(), ActionKind::Reply(503));
    }
}
