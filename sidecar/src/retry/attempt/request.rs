//! The request template: the parts of the client's request every attempt
//! repeats ([`RequestTemplate`], built once), from which each attempt's
//! [`AttemptRequest`] is made with the fields it sets over the head. Over
//! HTTP/2 an attempt with no other in flight takes the template's own
//! header map ([`RequestTemplate::sole_request`]), its fields kept inline
//! for the next.

use std::borrow::Cow;
use std::sync::atomic::{AtomicU32, Ordering};

use http::header::{HeaderName, HeaderValue};
use http::{HeaderMap, Version};
use tokio::time::Instant;

use crate::exchange::body::replay::AttemptBody;
use crate::exchange::deadline::{self, Hops};
use crate::exchange::request::{
    attempt_number, AttemptFields, AttemptRequest, RequestHead, ATTEMPT_HEADER,
};
use crate::observe::spans::{AttemptSpan, RequestSpan};
use crate::retry::upstream::UpstreamState;

/// The parts of the client's request every attempt repeats.
#[derive(Debug)]
pub(crate) struct RequestTemplate {
    /// Method, path and headers.
    pub(crate) head: RequestHead,
    /// Version towards the endpoint.
    pub(crate) version: Version,
    /// Attempts built so far (numbers the attempt header). Atomic only so a
    /// hedge can be built while the first attempt borrows the template.
    attempts_sent: AtomicU32,
    /// Attempts carry their number ([`ATTEMPT_HEADER`]): the request may be
    /// retried or hedged.
    numbered: bool,
    /// The host the client addressed: HTTP/2's `:authority` towards the endpoint
    /// (the connector dials the endpoint whatever it says). `None` uses the endpoint's address.
    pub(crate) authority: Option<http::uri::Authority>,
    /// A gRPC request (`content-type: application/grpc...`).
    pub(crate) grpc: bool,
    /// When the client's `grpc-timeout` runs out, if it sent one.
    pub(crate) grpc_deadline: Option<Instant>,
    /// The deadline across hops, when one came or attempts carry one on.
    /// Boxed: most requests have none, and the template moves with the
    /// request's future.
    pub(crate) hops: Option<Box<Hops>>,
    /// Retries and hedges carry the retry mark (`retry_layers: once`).
    pub(crate) mark_retries: bool,
}

impl RequestTemplate {
    /// A template of `head`, sent as `version`.
    pub(crate) fn new(
        head: RequestHead,
        version: Version,
        authority: Option<http::uri::Authority>,
        grpc: bool,
    ) -> Self {
        Self {
            head,
            version,
            attempts_sent: AtomicU32::new(0),
            numbered: false,
            authority,
            grpc,
            grpc_deadline: None,
            hops: None,
            mark_retries: false,
        }
    }

    /// True when attempts carry the request's deadline to the next hop.
    pub(crate) fn propagates(&self) -> bool {
        self.hops.as_deref().is_some_and(|h| h.propagate)
    }

    /// The request may be retried or hedged: each attempt carries its
    /// number. On HTTP/2 the field goes into the template now, so that each
    /// copy already has the entry and an attempt only overwrites its value
    /// (inserting a new name into a fresh copy would grow it).
    pub(crate) fn number_attempts(&mut self) {
        self.numbered = true;
        if self.version == Version::HTTP_2 {
            self.head.headers.insert(ATTEMPT_HEADER, attempt_number(1));
        }
    }

    /// The request for one attempt to `endpoint`, and the attempt's CLIENT
    /// span under `trace`, whose context it carries; `until` is the
    /// deadline it carries to the next hop, if any.
    pub(crate) fn request<'t>(
        &'t self,
        up: &'t UpstreamState,
        endpoint: usize,
        body: AttemptBody,
        trace: &RequestSpan,
        hedge: bool,
        until: Option<Instant>,
    ) -> (AttemptRequest<'t>, AttemptSpan) {
        let head = Cow::Borrowed(&self.head);
        self.attempt(head, up, endpoint, body, trace, hedge, until)
    }

    /// The request of the only attempt there will be: over HTTP/2 it takes
    /// the template's headers instead of copying them (HTTP/1 never copies).
    pub(crate) fn only_request<'t>(
        &'t mut self,
        up: &'t UpstreamState,
        endpoint: usize,
        body: AttemptBody,
        trace: &RequestSpan,
        until: Option<Instant>,
    ) -> (AttemptRequest<'t>, AttemptSpan) {
        if self.version != Version::HTTP_2 {
            return self.request(up, endpoint, body, trace, false, until);
        }
        let head = self.take_head();
        let this: &'t Self = self;
        this.attempt(Cow::Owned(head), up, endpoint, body, trace, false, until)
    }

    /// The request of an attempt with no other in flight (not a hedge's
    /// race) when more may follow: over HTTP/2 it takes the template's
    /// headers too, their fields kept inline in `kept` (no allocation) for
    /// [`RequestTemplate::restore_head`] to give them back before the next
    /// attempt. Copying the header map for every first attempt cost two
    /// allocations, their frees and the map's second drop (measured:
    /// `e2e/bench/results/2026-12-04-issue18-clocks-and-copies.md`). A head
    /// of more than [`KEPT_FIELDS`] fields is copied as before.
    pub(crate) fn sole_request<'t>(
        &'t mut self,
        kept: &mut Option<KeptFields>,
        up: &'t UpstreamState,
        endpoint: usize,
        body: AttemptBody,
        trace: &RequestSpan,
        until: Option<Instant>,
    ) -> (AttemptRequest<'t>, AttemptSpan) {
        if self.version != Version::HTTP_2 || !KeptFields::keep(kept, &self.head.headers) {
            return self.request(up, endpoint, body, trace, false, until);
        }
        let head = self.take_head();
        let this: &'t Self = self;
        this.attempt(Cow::Owned(head), up, endpoint, body, trace, false, until)
    }

    /// Gives back the head [`RequestTemplate::sole_request`] took, if it did.
    pub(crate) fn restore_head(&mut self, kept: &mut Option<KeptFields>) {
        if let Some(fields) = kept.take() {
            self.head.headers = fields.into_map();
        }
    }

    /// The head for an attempt that takes the template's headers.
    fn take_head(&mut self) -> RequestHead {
        RequestHead {
            method: self.head.method.clone(),
            path_and_query: self.head.path_and_query.clone(),
            headers: std::mem::take(&mut self.head.headers),
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn attempt<'t>(
        &'t self,
        head: Cow<'t, RequestHead>,
        up: &'t UpstreamState,
        endpoint: usize,
        body: AttemptBody,
        trace: &RequestSpan,
        hedge: bool,
        until: Option<Instant>,
    ) -> (AttemptRequest<'t>, AttemptSpan) {
        let n = self.attempts_sent.fetch_add(1, Ordering::Relaxed) + 1;
        let endpoint_authority = &up.endpoints[endpoint].authority;
        let authority = self.authority.as_ref().unwrap_or(endpoint_authority);
        let mut fields = AttemptFields::default();
        if self.numbered && (n > 1 || self.version != Version::HTTP_2) {
            fields.set_attempt(n, self.grpc);
        }
        let mark = self.mark_retries && n > 1;
        match (until, self.hops.as_deref()) {
            (Some(until), Some(hops)) => {
                self.carry(&head.headers, up, Some((hops, until)), mark, &mut fields)
            }
            _ => {
                if let Some(deadline) = self.grpc_deadline {
                    fields.set_grpc_timeout(deadline.saturating_duration_since(Instant::now()));
                }
                if mark {
                    self.carry(&head.headers, up, None, true, &mut fields);
                }
            }
        }
        if self.version != Version::HTTP_2
            && self.authority.is_none()
            && !head.headers.contains_key(http::header::HOST)
        {
            // A client that named no host at all (HTTP/1.0): the endpoint's
            // address, as HTTP/1.1 requires a `Host`.
            fields.set_host(HeaderValue::from_str(endpoint_authority.as_str()).ok());
        }
        let span = trace.attempt(
            &up.endpoints[endpoint].endpoint,
            authority.as_str(),
            &head.method,
            head.path_and_query.path(),
            n - 1,
            hedge,
        );
        if let Some(trace) = span.trace_fields() {
            fields.set_trace(trace);
        }
        let request = AttemptRequest {
            head,
            fields,
            authority,
            body,
        };
        (request, span)
    }
}

impl RequestTemplate {
    /// Sets the fields that carry the attempt's deadline (`hops`, `until`)
    /// to the next hop, and the retry mark when `mark`: `grpc-timeout` for
    /// gRPC, and the Reprise entries of `baggage`, unless the entry the
    /// application forwarded already says the same deadline and no mark is
    /// due (the common pass-through costs no rewrite).
    #[cold]
    fn carry(
        &self,
        headers: &HeaderMap,
        up: &UpstreamState,
        deadline: Option<(&Hops, Instant)>,
        mark: bool,
        fields: &mut AttemptFields,
    ) {
        let ms = deadline.and_then(|(hops, until)| {
            if self.grpc {
                fields.set_grpc_timeout(until.saturating_duration_since(Instant::now()));
            }
            let ms = hops.ms(until);
            (hops.incoming_ms != Some(ms)).then_some(ms)
        });
        if ms.is_none() && !mark {
            return;
        }
        match deadline::with_entries(headers, ms, mark) {
            Ok(value) => fields.set_baggage(value),
            Err(why) => up.metrics.record_deadline_not_written(why),
        }
    }
}

/// Fields a head may have for [`KeptFields`] to keep them: h2load sends
/// one, curl two, a gRPC client five to seven.
pub(crate) const KEPT_FIELDS: usize = 8;

/// A request head's fields, in order, kept inline while its header map is
/// with an attempt.
#[derive(Debug)]
pub(crate) struct KeptFields([Option<(HeaderName, HeaderValue)>; KEPT_FIELDS]);

impl KeptFields {
    /// Keeps `headers`' fields in `kept` (written in place: an array built
    /// first would be copied in), unless there are more than [`KEPT_FIELDS`].
    fn keep(kept: &mut Option<Self>, headers: &HeaderMap) -> bool {
        if headers.len() > KEPT_FIELDS {
            return false;
        }
        let slots = &mut kept.insert(KeptFields(Default::default())).0;
        for (slot, (name, value)) in slots.iter_mut().zip(headers) {
            *slot = Some((name.clone(), value.clone()));
        }
        true
    }

    /// The header map again, its fields in their order.
    fn into_map(self) -> HeaderMap {
        let mut headers = HeaderMap::with_capacity(KEPT_FIELDS);
        for (name, value) in self.0.into_iter().flatten() {
            headers.append(name, value);
        }
        headers
    }
}
