//! When an endpoint's certificate expires: the leaf's `notAfter`, read from
//! its DER after each handshake for `reprise_tls_peer_certificate_expiry_seconds`
//! (Envoy's `expiration_unix_time_seconds`), so an alert can fire before a
//! pod's certificate runs out rather than after its requests start failing.
//!
//! Only the path to `validity` in `tbsCertificate` is walked (RFC 5280
//! §4.1); the certificate has already been verified by rustls, so anything
//! unexpected is `None`, never an error.

/// The leaf's `notAfter` in seconds since the Unix epoch.
pub(crate) fn not_after(der: &[u8]) -> Option<i64> {
    let (cert, _) = element(der, 0x30)?;
    let (mut tbs, _) = element(cert, 0x30)?;
    // [0] EXPLICIT version, when present.
    if tbs.first() == Some(&0xa0) {
        tbs = element(tbs, 0xa0)?.1;
    }
    let (_serial, rest) = element(tbs, 0x02)?;
    let (_signature, rest) = element(rest, 0x30)?;
    let (_issuer, rest) = element(rest, 0x30)?;
    let (validity, _) = element(rest, 0x30)?;
    let (_, after_before) = any(validity)?;
    let (tag, time, _) = any_tagged(after_before)?;
    match tag {
        0x17 => utc_time(time),
        0x18 => generalized_time(time),
        _ => None,
    }
}

/// The content of the element at the start of `der` if its tag is `tag`,
/// and what follows it.
fn element(der: &[u8], tag: u8) -> Option<(&[u8], &[u8])> {
    let (t, content, rest) = any_tagged(der)?;
    (t == tag).then_some((content, rest))
}

/// The element at the start of `der` (any tag), and what follows it.
fn any(der: &[u8]) -> Option<(&[u8], &[u8])> {
    any_tagged(der).map(|(_, c, r)| (c, r))
}

/// Tag, content and rest of the element at the start of `der` (definite
/// lengths only, as DER requires).
fn any_tagged(der: &[u8]) -> Option<(u8, &[u8], &[u8])> {
    let (&tag, rest) = der.split_first()?;
    let (&first, rest) = rest.split_first()?;
    let (len, rest) = if first < 0x80 {
        (usize::from(first), rest)
    } else {
        let n = usize::from(first & 0x7f);
        if n == 0 || n > 4 || rest.len() < n {
            return None;
        }
        let len = rest[..n]
            .iter()
            .fold(0usize, |acc, b| (acc << 8) | usize::from(*b));
        (len, &rest[n..])
    };
    (rest.len() >= len).then(|| (tag, &rest[..len], &rest[len..]))
}

/// `YYMMDDHHMMSSZ`; years 50-99 are 19xx (RFC 5280 §4.1.2.5.1).
fn utc_time(t: &[u8]) -> Option<i64> {
    if t.len() != 13 || t[12] != b'Z' {
        return None;
    }
    let yy = digits(&t[0..2])?;
    let year = if yy >= 50 { 1900 + yy } else { 2000 + yy };
    seconds(year, &t[2..12])
}

/// `YYYYMMDDHHMMSSZ` (RFC 5280 §4.1.2.5.2).
fn generalized_time(t: &[u8]) -> Option<i64> {
    if t.len() != 15 || t[14] != b'Z' {
        return None;
    }
    seconds(digits(&t[0..4])?, &t[4..14])
}

/// `MMDDHHMMSS` of `year` as seconds since the epoch.
fn seconds(year: i64, t: &[u8]) -> Option<i64> {
    let month = digits(&t[0..2])?;
    let day = digits(&t[2..4])?;
    let (h, m, s) = (digits(&t[4..6])?, digits(&t[6..8])?, digits(&t[8..10])?);
    if !(1..=12).contains(&month) || !(1..=31).contains(&day) || h > 23 || m > 59 || s > 60 {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + h * 3_600 + m * 60 + s)
}

fn digits(t: &[u8]) -> Option<i64> {
    t.iter().try_fold(0i64, |acc, b| {
        b.is_ascii_digit().then(|| acc * 10 + i64::from(b - b'0'))
    })
}

/// Days from 1970-01-01 to `year-month-day` in the proleptic Gregorian
/// calendar (Howard Hinnant's `days_from_civil`).
fn days_from_civil(year: i64, month: i64, day: i64) -> i64 {
    let y = if month <= 2 { year - 1 } else { year };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let mp = (month + 9) % 12;
    let doy = (153 * mp + 2) / 5 + day - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    fn certificate((y, m, d): (i32, u8, u8)) -> Vec<u8> {
        let key = rcgen::KeyPair::generate().expect("key");
        let mut params =
            rcgen::CertificateParams::new(vec!["api.test".to_string()]).expect("params");
        params.not_after = rcgen::date_time_ymd(y, m, d);
        params.self_signed(&key).expect("cert").der().to_vec()
    }

    #[test]
    fn reads_not_after_in_both_time_forms() {
        // rcgen writes UTCTime before 2050 and GeneralizedTime from 2050 on.
        for (y, m, d, unix) in [
            (2021, 1, 1, 1_609_459_200),
            (2030, 6, 15, 1_907_712_000),
            (2051, 3, 1, 2_561_241_600),
        ] {
            let der = certificate((y, m, d));
            assert_eq!(not_after(&der), Some(unix), "{y}-{m}-{d}");
        }
    }

    #[test]
    fn anything_unexpected_is_none() {
        let der = certificate((2030, 1, 1));
        for cut in [0, 1, 5, 40, der.len() / 2] {
            assert_eq!(not_after(&der[..cut]), None, "cut at {cut}");
        }
        assert_eq!(not_after(b"\x04\x02ab"), None);
        assert_eq!(utc_time(b"3001011200Z"), None);
        assert_eq!(generalized_time(b"20301301000000Z"), None);
        assert_eq!(days_from_civil(1970, 1, 1), 0);
        assert_eq!(days_from_civil(2000, 3, 1), 11_017);
    }
}
