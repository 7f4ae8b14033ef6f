use std::collections::HashMap;

use opentelemetry::baggage::BaggageExt;
use opentelemetry::propagation::{Extractor, TextMapPropagator};
use opentelemetry_sdk::propagation::BaggagePropagator;

use super::*;

/// A wall clock reading, in Unix milliseconds.
const NOW: u64 = 1_796_601_600_000;

fn fields(values: &[&str]) -> HeaderMap {
    let mut h = HeaderMap::new();
    for v in values {
        h.append(BAGGAGE, HeaderValue::from_str(v).expect("a field value"));
    }
    h
}

fn read_at(values: &[&str], now: u64) -> Received {
    read(&fields(values), now)
}

fn written(values: &[&str], deadline: u64) -> Result<String, NotWritten> {
    with_deadline(&fields(values), deadline).map(|v| v.to_str().expect("ascii").to_string())
}

#[test]
fn an_entry_is_read_wherever_it_stands_with_spaces_and_properties() {
    let at = |v: &[&str]| read_at(v, NOW);
    assert_eq!(at(&[]), Received::Absent);
    assert_eq!(at(&["userId=alice"]), Received::Absent);
    let d = NOW + 1500;
    for form in [
        format!("reprise-deadline={d}"),
        format!("userId=alice, reprise-deadline = {d} ,isProduction=false"),
        format!("reprise-deadline={d};origin=front;retry"),
        format!("a=1,\treprise-deadline\t=\t{d}\t;p"),
    ] {
        assert_eq!(at(&[&form]), Received::Valid(d), "{form}");
    }
    // In a second field, as the list rule allows.
    assert_eq!(
        at(&["userId=alice", &format!("reprise-deadline={d}")]),
        Received::Valid(d)
    );
}

#[test]
fn keys_that_only_look_alike_are_someone_elses() {
    for other in [
        "reprise-deadlines=5",
        "xreprise-deadline=5",
        "Reprise-Deadline=5",
        "reprise-deadline-ms=5",
        "userId=reprise-deadline=5",
    ] {
        assert_eq!(read_at(&[other], NOW), Received::Absent, "{other}");
    }
}

#[test]
fn the_earliest_of_several_valid_entries_counts_and_a_bad_one_beside_them_does_not() {
    let v = format!(
        "reprise-deadline={},reprise-deadline=garbage,reprise-deadline={}",
        NOW + 900,
        NOW + 300
    );
    assert_eq!(read_at(&[&v], NOW), Received::Valid(NOW + 300));
    let stale_then_valid = format!("reprise-deadline=1,reprise-deadline={}", NOW + 10);
    assert_eq!(
        read_at(&[&stale_then_valid], NOW),
        Received::Valid(NOW + 10),
        "one caller's stale entry does not hide its valid one"
    );
}

#[test]
fn not_a_number_is_malformed_and_ignored() {
    for bad in [
        "",
        "abc",
        "-5",
        "+5",
        "1.5",
        "1e12",
        "0x10",
        "1 2",
        "1234567890123456",
        "\u{661}\u{662}",
        "%31",
    ] {
        let v = format!("reprise-deadline={bad}");
        let Ok(value) = HeaderValue::from_bytes(v.as_bytes()) else {
            continue;
        };
        let mut h = HeaderMap::new();
        h.insert(BAGGAGE, value);
        assert_eq!(
            read(&h, NOW),
            Received::Ignored(Ignored::Malformed),
            "{bad:?}"
        );
    }
    // The largest value of 15 digits does not overflow: far in the future.
    assert_eq!(
        read_at(&["reprise-deadline=999999999999999"], NOW),
        Received::Ignored(Ignored::FarFuture)
    );
}

#[test]
fn a_deadline_past_is_honoured_up_to_the_stale_bound_and_ignored_beyond_it() {
    let stale = millis(STALE_AFTER);
    let at = |d: u64| read_at(&[&format!("reprise-deadline={d}")], NOW);
    assert_eq!(at(NOW), Received::Valid(NOW), "due now: passed");
    assert_eq!(at(NOW - 1), Received::Valid(NOW - 1));
    assert_eq!(at(NOW - stale), Received::Valid(NOW - stale));
    assert_eq!(at(NOW - stale - 1), Received::Ignored(Ignored::Stale));
    assert_eq!(at(0), Received::Ignored(Ignored::Stale), "the epoch");
    assert_eq!(at(1), Received::Ignored(Ignored::Stale));
}

#[test]
fn a_deadline_far_in_the_future_is_ignored() {
    let far = millis(FARTHEST);
    let at = |d: u64| read_at(&[&format!("reprise-deadline={d}")], NOW);
    assert_eq!(at(NOW + far), Received::Valid(NOW + far));
    assert_eq!(at(NOW + far + 1), Received::Ignored(Ignored::FarFuture));
    assert_eq!(
        at(253_402_300_799_000),
        Received::Ignored(Ignored::FarFuture),
        "the year 9999"
    );
}

/// The same entry read by clocks that disagree: the injected reading
/// stands for the receiving node's clock.
#[test]
fn clock_skew_moves_a_deadline_by_the_skew_and_no_further_than_the_bounds() {
    let sent = NOW + 2_000; // two seconds left on the sender's clock
    let entry = format!("reprise-deadline={sent}");
    let at = |skew: i64| read_at(&[&entry], NOW.saturating_add_signed(skew));
    // A receiver behind by a second sees three seconds: the request is
    // shortened less, never lengthened past its own policy.
    assert_eq!(at(-1_000), Received::Valid(sent));
    // Ahead by a second: one second left. Ahead by three: passed (answered
    // at once), as a sender's clock that far ahead would make it.
    assert_eq!(at(1_000), Received::Valid(sent));
    assert_eq!(at(3_000), Received::Valid(sent));
    // Ahead by more than the stale bound: ignored, the request runs on its
    // own policy.
    let beyond = i64::try_from(millis(STALE_AFTER)).expect("small") + 2_001;
    assert_eq!(at(beyond), Received::Ignored(Ignored::Stale));
    // Behind by more than the farthest bound: ignored.
    let behind = -(i64::try_from(millis(FARTHEST)).expect("small") + 2_001);
    assert_eq!(at(behind), Received::Ignored(Ignored::FarFuture));
}

#[test]
fn the_entry_is_added_after_the_applications_members_which_keep_their_order_and_bytes() {
    let d = NOW + 250;
    assert_eq!(
        written(&[], d).as_deref(),
        Ok("reprise-deadline=1796601600250")
    );
    assert_eq!(
        written(
            &["userId=alice,serverNode=DF%2028;p1;p2=v,isProduction=false"],
            d
        )
        .as_deref(),
        Ok("userId=alice,serverNode=DF%2028;p1;p2=v,isProduction=false,reprise-deadline=1796601600250")
    );
    // Two fields become one, in their order; spaces around members and
    // empty elements go (neither is a member).
    assert_eq!(
        written(&[" a = 1 , ,b=2", "c=3 ,"], d).as_deref(),
        Ok("a = 1,b=2,c=3,reprise-deadline=1796601600250")
    );
    // Duplicates of the application's own keys are its business: kept.
    assert_eq!(
        written(&["k=1,k=2"], d).as_deref(),
        Ok("k=1,k=2,reprise-deadline=1796601600250")
    );
    // A value may hold `=`.
    assert_eq!(
        written(&["token=YWJj=="], d).as_deref(),
        Ok("token=YWJj==,reprise-deadline=1796601600250")
    );
}

#[test]
fn an_earlier_entry_is_replaced_where_it_stands_and_its_duplicates_go() {
    let d = NOW + 100;
    assert_eq!(
        written(
            &["a=1,reprise-deadline=1796601609999;p,b=2,reprise-deadline=7"],
            d
        )
        .as_deref(),
        Ok("a=1,reprise-deadline=1796601600100,b=2")
    );
    assert_eq!(
        written(&["reprise-deadline=garbage,a=1"], d).as_deref(),
        Ok("reprise-deadline=1796601600100,a=1"),
        "a malformed entry of its own key is replaced too"
    );
}

#[test]
fn malformed_application_baggage_is_left_as_it_came() {
    for bad in [
        "a b=1",
        "=1",
        "a",
        "a=\"quoted\"",
        "a=1;;",
        "a=1;=v",
        "a=back\\slash",
        "(a)=1",
        "a=1,b",
    ] {
        assert_eq!(written(&[bad], NOW), Err(NotWritten::Malformed), "{bad:?}");
    }
    let mut h = HeaderMap::new();
    h.insert(
        BAGGAGE,
        HeaderValue::from_bytes(b"a=caf\xc3\xa9").expect("obs-text is a valid field value"),
    );
    assert_eq!(with_deadline(&h, NOW), Err(NotWritten::Malformed));
}

#[test]
fn the_entry_is_left_out_rather_than_push_the_baggage_past_the_limits() {
    let members = |n: usize| {
        (0..n)
            .map(|i| format!("k{i}=v"))
            .collect::<Vec<_>>()
            .join(",")
    };
    let room = written(&[&members(MAX_MEMBERS - 1)], NOW).expect("63 + 1");
    assert_eq!(room.split(',').count(), MAX_MEMBERS);
    assert_eq!(
        written(&[&members(MAX_MEMBERS)], NOW),
        Err(NotWritten::Full)
    );
    // Replacing an entry adds no member.
    let full_with_own = format!("{},reprise-deadline=1", members(MAX_MEMBERS - 1));
    assert!(written(&[&full_with_own], NOW).is_ok());
    // Bytes: the entry is 30 bytes with its comma.
    let entry = format!(",reprise-deadline={NOW}").len();
    let pad = |total: usize| format!("big={}", "x".repeat(total - 4));
    let fits = written(&[&pad(MAX_BYTES - entry)], NOW).expect("exactly at the limit");
    assert_eq!(fits.len(), MAX_BYTES);
    assert_eq!(
        written(&[&pad(MAX_BYTES - entry + 1)], NOW),
        Err(NotWritten::Full)
    );
    // A hostile field: many members, far past both limits, refused early.
    let hostile = "a=1,".repeat(20_000);
    assert_eq!(written(&[&hostile], NOW), Err(NotWritten::Full));
}

struct Fields<'a>(&'a HeaderMap);

impl Extractor for Fields<'_> {
    fn get(&self, key: &str) -> Option<&str> {
        self.0.get(key).and_then(|v| v.to_str().ok())
    }

    fn keys(&self) -> Vec<&str> {
        self.0.keys().map(HeaderName::as_str).collect()
    }
}

/// What OpenTelemetry's own propagator reads from a field: key to value
/// and properties.
fn extracted(value: &str) -> HashMap<String, (String, String)> {
    let mut h = HeaderMap::new();
    h.insert(BAGGAGE, HeaderValue::from_str(value).expect("ascii"));
    let cx = BaggagePropagator::new().extract(&Fields(&h));
    cx.baggage()
        .iter()
        .map(|(k, (v, m))| (k.to_string(), (v.to_string(), m.as_str().to_string())))
        .collect()
}

#[test]
fn opentelemetrys_propagator_reads_every_application_entry_and_the_deadline() {
    let app = "userId=alice,serverNode=DF%2028,tenant=t-7;ttl=60";
    let before = extracted(app);
    let out = written(&[app], NOW + 42).expect("room");
    let after = extracted(&out);
    assert_eq!(after.len(), before.len() + 1, "{out}");
    for (k, v) in &before {
        assert_eq!(after.get(k), Some(v), "{k} kept");
    }
    assert_eq!(
        after.get(KEY).map(|(v, _)| v.as_str()),
        Some("1796601600042")
    );
    // At the limits the SDK keeps everything too.
    let many = (0..MAX_MEMBERS - 1)
        .map(|i| format!("k{i}=v"))
        .collect::<Vec<_>>()
        .join(",");
    let out = written(&[&many], NOW).expect("room for one");
    assert_eq!(extracted(&out).len(), MAX_MEMBERS);
}

#[tokio::test(start_paused = true)]
async fn instants_and_wall_milliseconds_map_both_ways_from_one_reading() {
    let at = Instant::now();
    let hops = Hops::new(NOW, at, Some(NOW + 750), true);
    assert_eq!(hops.incoming(), Some(at + Duration::from_millis(750)));
    assert_eq!(hops.ms(at + Duration::from_millis(750)), NOW + 750);
    assert_eq!(
        hops.ms(at + Duration::from_micros(750_999)),
        NOW + 750,
        "rounded down"
    );
    tokio::time::advance(Duration::from_secs(2)).await;
    let later = Instant::now();
    let hops = Hops::new(NOW + 2_000, later, None, true);
    assert_eq!(
        hops.instant(NOW + 500),
        at + Duration::from_millis(500),
        "in the past"
    );
    assert_eq!(hops.ms(at + Duration::from_millis(500)), NOW + 500);
    assert_eq!(hops.ms(at + Duration::from_micros(500_500)), NOW + 500);
    assert_eq!(hops.ms(at + Duration::from_micros(499_500)), NOW + 499);
}

#[test]
fn the_retry_mark_is_read_anywhere_and_written_once_beside_the_deadline() {
    assert!(!has_retry_mark(&fields(&["userId=alice"])));
    assert!(!has_retry_mark(&fields(&["reprise-retrying=1"])));
    assert!(has_retry_mark(&fields(&["a=1", "reprise-retry=1;x"])));
    let marked = |values: &[&str], deadline| {
        with_entries(&fields(values), deadline, true)
            .map(|v| v.to_str().expect("ascii").to_string())
    };
    assert_eq!(marked(&[], None).as_deref(), Ok("reprise-retry=1"));
    assert_eq!(
        marked(&["a=1,reprise-deadline=5"], None).as_deref(),
        Ok("a=1,reprise-deadline=5,reprise-retry=1"),
        "without a deadline of its own, the forwarded one stays"
    );
    assert_eq!(
        marked(&["reprise-retry=1,a=1"], Some(NOW)).as_deref(),
        Ok("reprise-retry=1,a=1,reprise-deadline=1796601600000"),
        "already marked: not twice"
    );
    assert_eq!(marked(&["a b"], None), Err(NotWritten::Malformed));
}

#[test]
fn a_baggage_field_is_found_by_its_name_in_any_case_among_others() {
    assert!(!has_baggage(&fields(&[])));
    assert!(has_baggage(&fields(&["k=v"])));
    let mut h = HeaderMap::new();
    h.insert("x-baggage", http::HeaderValue::from_static("k=v"));
    h.insert(http::header::ACCEPT, http::HeaderValue::from_static("*/*"));
    assert!(!has_baggage(&h));
    h.append(
        http::HeaderName::from_bytes(b"Baggage").expect("name"),
        http::HeaderValue::from_static("k=v"),
    );
    assert!(has_baggage(&h));
}
