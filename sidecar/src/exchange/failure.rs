//! What went wrong with one attempt, and how far it got: the failure
//! taxonomy every log line, metric label and span names (pinned by
//! `names_are_stable`), and the classification of the clients' errors by
//! their types (hyper's and h2's error kinds, `io::ErrorKind`), never their
//! text.

use http::StatusCode;
use std::borrow::Cow;
use std::error::Error as StdError;
use std::io;

/// The error kind of a failed attempt, named as in traces, logs and metrics.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum FailureKind {
    /// The endpoint refused the connection.
    ConnectRefused,
    /// The connection was not established within `connect_ms`.
    ConnectTimeout,
    /// Another error while connecting.
    ConnectError,
    /// The sidecar itself ran out of file descriptors, socket buffers or
    /// memory while connecting: not the endpoint's fault, and another
    /// endpoint would fail the same way.
    LocalResources,
    /// The TLS handshake with the endpoint failed before it completed (a
    /// reset, a close, an alert, a timeout, plain text where TLS was
    /// expected, no HTTP/2 where `h2` needs it): nothing was written.
    TlsHandshake,
    /// The endpoint's certificate failed validation (unknown issuer,
    /// expired or not yet valid, another name, a broken chain): never
    /// retried, since another attempt would only hide it. Which check
    /// failed rides along for the log, the span and the metric.
    TlsCertificate(CertificateError),
    /// The connection was reset.
    ConnectionReset,
    /// The connection closed before response headers arrived.
    ConnectionClosed,
    /// The endpoint sent something that is not valid HTTP.
    ProtocolError,
    /// No response headers within the per-attempt timeout.
    ReadTimeout,
    /// The request's deadline ran out during the attempt, or had passed
    /// before one could start: the policy's total deadline, a client's
    /// `grpc-timeout` or a deadline propagated from an earlier hop.
    /// Answered `504` (gRPC `DEADLINE_EXCEEDED`); never counted against
    /// the endpoint.
    DeadlineExceeded,
    /// Reading the client's request body failed (the client went away or sent bad framing).
    RequestBodyError,
    /// The endpoint answered with a status configured as retryable.
    UpstreamStatus(u16),
    /// The endpoint answered a gRPC request with a `grpc-status` configured as
    /// retryable, before any response message.
    GrpcStatus(u8),
    /// The endpoint reset the HTTP/2 stream before response headers
    /// (REFUSED_STREAM: it did not process the request, RFC 9113 §8.7).
    StreamRefused,
    /// The endpoint reset the HTTP/2 stream before response headers, for
    /// another reason (it may have processed the request).
    StreamReset,
    /// Any other failure.
    Other,
}

/// Which check an endpoint's certificate failed, named as in the access
/// log's `error_detail`, the span's `reprise.tls.certificate_error` and
/// `reprise_tls_certificate_failures_total{reason}`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum CertificateError {
    /// No chain to a trusted root.
    UnknownIssuer,
    /// Past its validity.
    Expired,
    /// Before its validity.
    NotYetValid,
    /// Not valid for the server name verified.
    NameMismatch,
    /// A signature in the chain does not verify, or uses an algorithm
    /// refused.
    BadSignature,
    /// Revoked.
    Revoked,
    /// Not valid for a TLS server (its key usages).
    InvalidPurpose,
    /// The endpoint presented no certificate.
    NotPresented,
    /// Anything else (a malformed certificate, an unknown critical extension).
    Other,
}

impl CertificateError {
    /// Every reason, in the metric's order.
    pub const ALL: [CertificateError; 9] = [
        CertificateError::UnknownIssuer,
        CertificateError::Expired,
        CertificateError::NotYetValid,
        CertificateError::NameMismatch,
        CertificateError::BadSignature,
        CertificateError::Revoked,
        CertificateError::InvalidPurpose,
        CertificateError::NotPresented,
        CertificateError::Other,
    ];

    /// The reason's name, e.g. `unknown_issuer`.
    pub fn name(self) -> &'static str {
        match self {
            CertificateError::UnknownIssuer => "unknown_issuer",
            CertificateError::Expired => "expired",
            CertificateError::NotYetValid => "not_yet_valid",
            CertificateError::NameMismatch => "name_mismatch",
            CertificateError::BadSignature => "bad_signature",
            CertificateError::Revoked => "revoked",
            CertificateError::InvalidPurpose => "invalid_purpose",
            CertificateError::NotPresented => "not_presented",
            CertificateError::Other => "other",
        }
    }

    /// The position in [`Self::ALL`].
    pub(crate) fn index(self) -> usize {
        Self::ALL.iter().position(|r| *r == self).unwrap_or(8)
    }

    /// What rustls' verifier said.
    fn of(e: &rustls::CertificateError) -> Self {
        use rustls::CertificateError as E;
        match e {
            E::UnknownIssuer => CertificateError::UnknownIssuer,
            E::Expired | E::ExpiredContext { .. } => CertificateError::Expired,
            E::NotValidYet | E::NotValidYetContext { .. } => CertificateError::NotYetValid,
            E::NotValidForName | E::NotValidForNameContext { .. } => CertificateError::NameMismatch,
            E::BadSignature
            | E::UnsupportedSignatureAlgorithmContext { .. }
            | E::UnsupportedSignatureAlgorithmForPublicKeyContext { .. } => {
                CertificateError::BadSignature
            }
            E::Revoked => CertificateError::Revoked,
            E::InvalidPurpose | E::InvalidPurposeContext { .. } => CertificateError::InvalidPurpose,
            _ => CertificateError::Other,
        }
    }
}

/// How far a failed attempt got, which decides whether its failure boundary allows a retry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Stage {
    /// Before the request was written: the upstream cannot have seen it.
    Connect,
    /// After the request may have reached the upstream, before response headers.
    AfterWrite,
    /// Response headers arrived (a status failure).
    Response,
}

impl FailureKind {
    /// The kind's name, e.g. `connect_refused` or `upstream_status_503`.
    pub fn name(&self) -> Cow<'static, str> {
        Cow::Borrowed(match self {
            FailureKind::ConnectRefused => "connect_refused",
            FailureKind::ConnectTimeout => "connect_timeout",
            FailureKind::ConnectError => "connect_error",
            FailureKind::LocalResources => "local_resources",
            FailureKind::TlsHandshake => "tls_handshake",
            FailureKind::TlsCertificate(_) => "tls_certificate",
            FailureKind::ConnectionReset => "connection_reset",
            FailureKind::ConnectionClosed => "connection_closed",
            FailureKind::ProtocolError => "protocol_error",
            FailureKind::ReadTimeout => "read_timeout",
            FailureKind::DeadlineExceeded => "deadline_exceeded",
            FailureKind::RequestBodyError => "request_body_error",
            FailureKind::Other => "other",
            FailureKind::StreamRefused => "stream_refused",
            FailureKind::StreamReset => "stream_reset",
            FailureKind::UpstreamStatus(s) => return Cow::Owned(format!("upstream_status_{s}")),
            FailureKind::GrpcStatus(c) => {
                return Cow::Owned(format!(
                    "grpc_status_{}",
                    reprise_crds::grpc::name_of(*c).replace('-', "_")
                ))
            }
        })
    }

    /// What more the kind says, where it says more: which check a
    /// certificate failed.
    pub fn detail(&self) -> Option<&'static str> {
        match self {
            FailureKind::TlsCertificate(reason) => Some(reason.name()),
            _ => None,
        }
    }

    /// True for the endpoint's transport failures (everything but a
    /// status, the client's body, the deadline and the sidecar's own
    /// resources): these feed passive health.
    pub fn is_transport(&self) -> bool {
        !matches!(
            self,
            FailureKind::UpstreamStatus(_)
                | FailureKind::GrpcStatus(_)
                | FailureKind::RequestBodyError
                | FailureKind::DeadlineExceeded
                | FailureKind::LocalResources
        )
    }

    /// The status the sidecar answers with when this failure is final and no
    /// upstream response exists.
    pub fn status(&self) -> StatusCode {
        match self {
            FailureKind::ReadTimeout
            | FailureKind::DeadlineExceeded
            | FailureKind::ConnectTimeout => StatusCode::GATEWAY_TIMEOUT,
            FailureKind::RequestBodyError => StatusCode::BAD_REQUEST,
            FailureKind::LocalResources => StatusCode::SERVICE_UNAVAILABLE,
            _ => StatusCode::BAD_GATEWAY,
        }
    }
}

/// Classifies an error from hyper-util's pooled client (hosts outside every
/// upstream).
pub(crate) fn classify_client_error(
    err: &hyper_util::client::legacy::Error,
) -> (FailureKind, Stage) {
    if err.is_connect() {
        // hyper-util reports its own connect timeout as an `io::Error` of kind
        // `TimedOut`, like the kernel's.
        return classify_connect(find_io(err));
    }
    classify_chain(err.source())
}

/// Classifies a TLS handshake that failed with `e` (tokio-rustls reports
/// rustls' own errors inside an `io::Error`): a certificate that failed
/// validation, or any other end of the handshake.
pub(crate) fn classify_tls_error(e: &io::Error) -> FailureKind {
    match e
        .get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
    {
        Some(rustls::Error::InvalidCertificate(e)) => {
            FailureKind::TlsCertificate(CertificateError::of(e))
        }
        Some(rustls::Error::NoCertificatesPresented) => {
            FailureKind::TlsCertificate(CertificateError::NotPresented)
        }
        Some(rustls::Error::InvalidCertRevocationList(_)) => {
            FailureKind::TlsCertificate(CertificateError::Other)
        }
        _ => FailureKind::TlsHandshake,
    }
}

/// Classifies a failed dial of an endpoint: `TimedOut` is the connect
/// timeout (the sidecar's own, or the kernel's).
pub(crate) fn classify_connect_error(err: &io::Error) -> (FailureKind, Stage) {
    classify_connect(Some(err))
}

/// How an h2c endpoint's stream or connection failed: its socket error
/// when it had one (as hyper's client classified them before the endpoints'
/// h2c connections were the h2 crate's own), else its reset or GOAWAY
/// reason, with the same rules as [`classify_client_error`].
pub(crate) fn classify_h2_error(err: &h2::Error) -> (FailureKind, Stage) {
    match err.get_io() {
        Some(io) => (classify_io(io), Stage::AfterWrite),
        None => classify_chain(Some(err)),
    }
}

fn classify_connect(io: Option<&io::Error>) -> (FailureKind, Stage) {
    let kind = match io {
        Some(e) if is_local_resources(e) => FailureKind::LocalResources,
        Some(e) if e.kind() == io::ErrorKind::ConnectionRefused => FailureKind::ConnectRefused,
        Some(e) if e.kind() == io::ErrorKind::TimedOut => FailureKind::ConnectTimeout,
        _ => FailureKind::ConnectError,
    };
    (kind, Stage::Connect)
}

/// True when `e` says this process, not the peer, ran out of something:
/// descriptors (its own or the system's), socket buffers, memory.
pub(crate) fn is_local_resources(e: &io::Error) -> bool {
    use rustix::io::Errno;
    [Errno::MFILE, Errno::NFILE, Errno::NOBUFS, Errno::NOMEM]
        .iter()
        .any(|errno| e.raw_os_error() == Some(errno.raw_os_error()))
}

/// A socket error on an open connection, by its kind (hyper's client and
/// the sidecar's own HTTP/1 codec alike).
pub(crate) fn classify_io(e: &io::Error) -> FailureKind {
    // TLS that failed once the client's side of the handshake was done: in
    // TLS 1.3 an endpoint refusing the client's certificate says so with an
    // alert the first read meets.
    if e.get_ref()
        .is_some_and(|inner| inner.downcast_ref::<rustls::Error>().is_some())
    {
        return classify_tls_error(e);
    }
    match e.kind() {
        io::ErrorKind::ConnectionReset
        | io::ErrorKind::BrokenPipe
        | io::ErrorKind::ConnectionAborted => FailureKind::ConnectionReset,
        io::ErrorKind::UnexpectedEof => FailureKind::ConnectionClosed,
        io::ErrorKind::TimedOut => FailureKind::ReadTimeout,
        _ => FailureKind::Other,
    }
}

/// The first error in `source`'s chain that says what happened.
fn classify_chain(mut source: Option<&(dyn StdError + 'static)>) -> (FailureKind, Stage) {
    while let Some(e) = source {
        if let Some(h) = e.downcast_ref::<hyper::Error>() {
            // A user error is the request body's own failure (the client's bad
            // chunked framing or its dropped connection), even when it carries an
            // I/O error: that error is the client's, never the upstream's.
            if h.is_user() || (h.is_body_write_aborted() && find_io(h).is_none()) {
                return (FailureKind::RequestBodyError, Stage::AfterWrite);
            }
            if h.is_parse() || h.is_parse_status() {
                return (FailureKind::ProtocolError, Stage::AfterWrite);
            }
            if h.is_incomplete_message() {
                return (FailureKind::ConnectionClosed, Stage::AfterWrite);
            }
        }
        if let Some(io) = e.downcast_ref::<io::Error>() {
            return (classify_io(io), Stage::AfterWrite);
        }
        if let Some(h2) = e.downcast_ref::<h2::Error>() {
            if h2.is_reset() || h2.is_go_away() {
                // REFUSED_STREAM promises the request was not processed, so
                // it is safe to retry even at the connect boundary.
                return if h2.reason() == Some(h2::Reason::REFUSED_STREAM) {
                    (FailureKind::StreamRefused, Stage::Connect)
                } else {
                    (FailureKind::StreamReset, Stage::AfterWrite)
                };
            }
        }
        source = e.source();
    }
    (FailureKind::Other, Stage::AfterWrite)
}

fn find_io<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a io::Error> {
    let mut source: Option<&(dyn StdError + 'static)> = Some(err);
    while let Some(e) = source {
        if let Some(io) = e.downcast_ref::<io::Error>() {
            return Some(io);
        }
        source = e.source();
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn running_out_of_descriptors_or_memory_is_the_sidecars_own_failure() {
        for errno in [
            rustix::io::Errno::MFILE,
            rustix::io::Errno::NFILE,
            rustix::io::Errno::NOBUFS,
            rustix::io::Errno::NOMEM,
        ] {
            let e = io::Error::from_raw_os_error(errno.raw_os_error());
            assert_eq!(
                classify_connect_error(&e),
                (FailureKind::LocalResources, Stage::Connect),
                "{e}"
            );
        }
        let kind = FailureKind::LocalResources;
        assert_eq!(kind.name(), "local_resources");
        assert!(!kind.is_transport(), "never counts against an endpoint");
        assert_eq!(kind.status(), StatusCode::SERVICE_UNAVAILABLE);
        let refused = io::Error::from(io::ErrorKind::ConnectionRefused);
        assert_eq!(
            classify_connect_error(&refused).0,
            FailureKind::ConnectRefused
        );
    }

    #[test]
    fn a_certificate_rustls_refused_is_tls_certificate_with_its_reason_anything_else_tls_handshake()
    {
        use rustls::CertificateError as E;
        let cases = [
            (
                rustls::Error::InvalidCertificate(E::UnknownIssuer),
                "unknown_issuer",
            ),
            (rustls::Error::InvalidCertificate(E::Expired), "expired"),
            (
                rustls::Error::InvalidCertificate(E::NotValidYet),
                "not_yet_valid",
            ),
            (
                rustls::Error::InvalidCertificate(E::NotValidForName),
                "name_mismatch",
            ),
            (
                rustls::Error::InvalidCertificate(E::BadSignature),
                "bad_signature",
            ),
            (rustls::Error::InvalidCertificate(E::Revoked), "revoked"),
            (
                rustls::Error::InvalidCertificate(E::InvalidPurpose),
                "invalid_purpose",
            ),
            (rustls::Error::InvalidCertificate(E::BadEncoding), "other"),
            (rustls::Error::NoCertificatesPresented, "not_presented"),
        ];
        for (error, reason) in cases {
            let kind = classify_tls_error(&io::Error::new(io::ErrorKind::InvalidData, error));
            assert_eq!(kind.name(), "tls_certificate");
            assert_eq!(kind.detail(), Some(reason));
            assert!(kind.is_transport(), "counts for passive health");
            assert_eq!(kind.status(), StatusCode::BAD_GATEWAY);
        }
        for (i, reason) in CertificateError::ALL.iter().enumerate() {
            assert_eq!(reason.index(), i);
        }
        let alert = io::Error::new(
            io::ErrorKind::InvalidData,
            rustls::Error::AlertReceived(rustls::AlertDescription::HandshakeFailure),
        );
        assert_eq!(classify_tls_error(&alert), FailureKind::TlsHandshake);
        let reset = io::Error::from(io::ErrorKind::ConnectionReset);
        assert_eq!(classify_tls_error(&reset), FailureKind::TlsHandshake);
        assert_eq!(FailureKind::TlsHandshake.name(), "tls_handshake");
        assert_eq!(FailureKind::TlsHandshake.detail(), None);
        assert!(FailureKind::TlsHandshake.is_transport());
    }

    /// The controller takes only the failure kinds it knows from a traffic
    /// report (`reprise_crds::traffic`): every kind a sidecar names is one.
    #[test]
    fn every_kind_is_in_the_controllers_vocabulary() {
        use reprise_crds::traffic::is_failure_kind;
        let mut kinds = vec![
            FailureKind::ConnectRefused,
            FailureKind::ConnectTimeout,
            FailureKind::ConnectError,
            FailureKind::LocalResources,
            FailureKind::TlsHandshake,
            FailureKind::TlsCertificate(CertificateError::Expired),
            FailureKind::ConnectionReset,
            FailureKind::ConnectionClosed,
            FailureKind::ProtocolError,
            FailureKind::ReadTimeout,
            FailureKind::DeadlineExceeded,
            FailureKind::RequestBodyError,
            FailureKind::StreamRefused,
            FailureKind::StreamReset,
            FailureKind::Other,
        ];
        kinds.extend((400..=599).map(FailureKind::UpstreamStatus));
        kinds.extend((1..=16).map(FailureKind::GrpcStatus));
        for kind in kinds {
            // A new kind does not compile here until it is in the list above.
            match kind {
                FailureKind::ConnectRefused
                | FailureKind::ConnectTimeout
                | FailureKind::ConnectError
                | FailureKind::LocalResources
                | FailureKind::TlsHandshake
                | FailureKind::TlsCertificate(_)
                | FailureKind::ConnectionReset
                | FailureKind::ConnectionClosed
                | FailureKind::ProtocolError
                | FailureKind::ReadTimeout
                | FailureKind::DeadlineExceeded
                | FailureKind::RequestBodyError
                | FailureKind::UpstreamStatus(_)
                | FailureKind::GrpcStatus(_)
                | FailureKind::StreamRefused
                | FailureKind::StreamReset
                | FailureKind::Other => {}
            }
            assert!(is_failure_kind(&kind.name()), "{}", kind.name());
        }
    }

    #[test]
    fn names_are_stable() {
        assert_eq!(
            FailureKind::UpstreamStatus(503).name(),
            "upstream_status_503"
        );
        assert_eq!(FailureKind::ConnectRefused.name(), "connect_refused");
        assert_eq!(FailureKind::ReadTimeout.name(), "read_timeout");
        assert!(!FailureKind::UpstreamStatus(503).is_transport());
        assert_eq!(
            FailureKind::GrpcStatus(14).name(),
            "grpc_status_unavailable"
        );
        assert_eq!(
            FailureKind::GrpcStatus(8).name(),
            "grpc_status_resource_exhausted"
        );
        assert!(!FailureKind::GrpcStatus(14).is_transport());
        assert_eq!(FailureKind::StreamRefused.name(), "stream_refused");
        assert_eq!(FailureKind::StreamReset.name(), "stream_reset");
        assert!(FailureKind::ConnectionReset.is_transport());
    }

    #[test]
    fn a_deadline_is_504_deadline_exceeded_and_never_the_endpoints_fault() {
        let kind = FailureKind::DeadlineExceeded;
        assert_eq!(kind.name(), "deadline_exceeded");
        assert_eq!(kind.status(), StatusCode::GATEWAY_TIMEOUT);
        assert_eq!(kind.detail(), None);
        assert!(
            !kind.is_transport(),
            "a deadline (the caller's, a route's or a policy's) says nothing of the endpoint's health"
        );
    }
}
