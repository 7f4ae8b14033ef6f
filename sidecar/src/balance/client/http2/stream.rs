//! One request's stream on an h2c connection: its response body as the
//! engine reads it ([`H2Body`]), and the request body's pipe when it has one
//! ([`pipe`]).
//!
//! The contract: response data is handed on frame by frame and its flow
//! control window released as it goes (what the h2 crate's reader owes the
//! endpoint); trailers end the body. A request body streams in a task of its
//! own, as much as the stream's window allows, and stops with a reset when
//! the response is dropped before it finished (the attempt was abandoned),
//! when the body fails (`INTERNAL_ERROR`) or when the endpoint resets the
//! stream.

use std::task::{ready, Context, Poll};

use bytes::Bytes;
use h2::{RecvStream, SendStream};
use http::HeaderMap;
use http_body::{Frame, SizeHint};
use http_body_util::BodyExt;
use tokio::sync::oneshot;

use super::StreamSlot;
use crate::exchange::body::{impl_body, replay::AttemptBody, BoxError, Frames, H2Recv};

/// The response body of one h2c stream.
#[derive(Debug)]
pub(crate) struct H2Body {
    recv: H2Recv,
    /// Dropped with the body: tells the request body's pipe, if any, to stop.
    _cancel: Option<oneshot::Sender<()>>,
    /// The stream counts against its connection until the body ends or
    /// goes.
    slot: Option<StreamSlot>,
}

impl H2Body {
    /// The body of a response with `headers`; `content` is false when it
    /// has none (answering HEAD, a 204 or a 304).
    pub(super) fn new(
        recv: RecvStream,
        headers: &HeaderMap,
        content: bool,
        cancel: Option<oneshot::Sender<()>>,
        slot: StreamSlot,
    ) -> Self {
        Self {
            recv: if content {
                H2Recv::new(recv, headers)
            } else {
                H2Recv::without_content(recv)
            },
            _cancel: cancel,
            slot: Some(slot),
        }
    }
}

impl Frames for H2Body {
    fn poll_next_frame(
        &mut self,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let polled = ready!(self.recv.poll_frame(cx));
        // Anything but data ends the stream: trailers, the end, an error.
        if !matches!(&polled, Some(Ok(frame)) if frame.is_data()) {
            self.slot = None;
        }
        Poll::Ready(polled.map(|r| r.map_err(Into::into)))
    }

    fn is_ended(&self) -> bool {
        self.recv.is_end_stream()
    }

    fn size(&self) -> SizeHint {
        self.recv.size_hint()
    }
}

impl_body!(H2Body);

/// Streams `body` onto `send`: each data frame once the stream's window has
/// room for it, then the trailers or the end. Stops, resetting the stream,
/// when `cancel` fires or closes (the response was dropped) or the body
/// fails; stops quietly when the endpoint reset the stream.
pub(super) async fn pipe(
    mut body: AttemptBody,
    mut send: SendStream<Bytes>,
    mut cancel: oneshot::Receiver<()>,
) {
    loop {
        let frame = tokio::select! {
            biased;
            _ = &mut cancel => return send.send_reset(h2::Reason::CANCEL),
            _ = std::future::poll_fn(|cx| send.poll_reset(cx)) => return,
            frame = body.frame() => frame,
        };
        let mut data = match frame {
            None => {
                let _ = send.send_data(Bytes::new(), true);
                return;
            }
            Some(Err(_)) => return send.send_reset(h2::Reason::INTERNAL_ERROR),
            Some(Ok(frame)) => match frame.into_data() {
                Ok(data) => data,
                Err(frame) => {
                    if let Ok(trailers) = frame.into_trailers() {
                        let _ = send.send_trailers(trailers);
                        return;
                    }
                    continue;
                }
            },
        };
        while !data.is_empty() {
            send.reserve_capacity(data.len());
            let granted = tokio::select! {
                biased;
                _ = &mut cancel => return send.send_reset(h2::Reason::CANCEL),
                granted = std::future::poll_fn(|cx| send.poll_capacity(cx)) => granted,
            };
            match granted {
                Some(Ok(0)) => {}
                Some(Ok(n)) => {
                    let chunk = data.split_to(n.min(data.len()));
                    if send.send_data(chunk, false).is_err() {
                        return;
                    }
                }
                // The stream was reset or the connection ended.
                Some(Err(_)) | None => return,
            }
        }
    }
}
