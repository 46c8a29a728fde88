//! Failures a host can act on: one stable code per kind, and the classification of an HTTP
//! error response into one of them.
//!
//! The code is decided by Lineage from the status and the body's wording, never taken from a
//! server's own error codes, which differ between services speaking the same wire format.
//! `Retry-After` is kept in milliseconds, from either of its forms (seconds, or an HTTP date).

use std::time::{Duration, SystemTime, UNIX_EPOCH};

/// 401 or 403: the credentials were refused.
pub const AUTH: &str = "AUTH";
/// The account's quota, balance, credits or spend limit is exhausted: retrying will not help.
pub const QUOTA: &str = "QUOTA";
/// 429 for any other reason: too many requests for now.
pub const RATE_LIMIT: &str = "RATE_LIMIT";
/// The request does not fit the model's context window.
pub const CONTEXT_WINDOW_EXCEEDED: &str = "CONTEXT_WINDOW_EXCEEDED";
/// Any other 400, or 413: the endpoint refused the request as written.
pub const INVALID_REQUEST: &str = "INVALID_REQUEST";
/// 5xx (529, overloaded, included): the endpoint failed.
pub const SERVER: &str = "SERVER";
/// No byte arrived for longer than the idle timeout.
pub const TIMEOUT: &str = "TIMEOUT";
/// The connection could not be made, or failed before a response arrived.
pub const TRANSPORT: &str = "TRANSPORT";
/// The stream ended before the wire format's end marker.
pub const STREAM_CLOSED: &str = "STREAM_CLOSED";
/// The model stopped normally having produced nothing.
pub const EMPTY_RESPONSE: &str = "EMPTY_RESPONSE";
/// The response does not follow its wire format (bad JSON, an event out of place).
pub const BAD_RESPONSE: &str = "BAD_RESPONSE";

/// Whether a failure with `code` may succeed if the same request is sent again (before any of
/// its answer was streamed: a half-streamed answer is never replayed).
pub fn is_retryable(code: &str) -> bool {
    matches!(code, RATE_LIMIT | SERVER | TIMEOUT | TRANSPORT)
}

/// An HTTP error response, classified.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpFailure {
    /// The stable code: one of this module's constants, or `HTTP_<status>` for a status none of
    /// them covers.
    pub code: String,
    /// The HTTP status.
    pub status: u16,
    /// How long the endpoint asked the caller to wait, when it said (`Retry-After`).
    pub retry_after_ms: Option<u64>,
    /// The endpoint's request id, when it gave one (a header, or the body's `request_id`).
    pub request_id: Option<String>,
    /// What went wrong, for people: the body's error message (at most [`MESSAGE_BOUND`]
    /// characters), or the status alone.
    pub message: String,
}

/// The most characters of a server's error message a failure keeps.
pub const MESSAGE_BOUND: usize = 500;

/// The headers that carry a request id, in the order they are looked at.
const REQUEST_ID_HEADERS: [&str; 3] = ["x-request-id", "request-id", "anthropic-request-id"];

/// Classifies an HTTP error response from its status, its headers (`headers` finds one by its
/// lower-case name) and its body, at time `now` (for an HTTP-date `Retry-After`).
pub fn classify(
    status: u16,
    headers: impl Fn(&str) -> Option<String>,
    body: &str,
    now: SystemTime,
) -> HttpFailure {
    let parsed: Option<serde_json::Value> = serde_json::from_str(body).ok();
    // A JSON body speaks through its error's fields; any other body through its text.
    let words = parsed
        .as_ref()
        .map_or_else(|| body.to_owned(), wording)
        .to_lowercase();
    let code = match status {
        401 | 403 => AUTH.to_owned(),
        402 => QUOTA.to_owned(),
        429 if names_quota(&words) => QUOTA.to_owned(),
        429 => RATE_LIMIT.to_owned(),
        400 | 413 if names_context_overflow(&words) => CONTEXT_WINDOW_EXCEEDED.to_owned(),
        400 | 413 => INVALID_REQUEST.to_owned(),
        500..=599 => SERVER.to_owned(),
        other => format!("HTTP_{other}"),
    };
    let message = parsed
        .as_ref()
        .and_then(error_message)
        .map(|m| bound(&m))
        .unwrap_or_else(|| format!("the endpoint answered HTTP {status}"));
    let request_id = REQUEST_ID_HEADERS
        .iter()
        .find_map(|name| headers(name))
        .or_else(|| {
            parsed
                .as_ref()
                .and_then(|v| v.get("request_id"))
                .and_then(|v| v.as_str())
                .map(str::to_owned)
        })
        .filter(|id| !id.is_empty());
    HttpFailure {
        retry_after_ms: headers("retry-after").and_then(|v| retry_after_ms(&v, now)),
        code,
        status,
        request_id,
        message,
    }
}

/// A `Retry-After` value in milliseconds: delay seconds (`120`), or an HTTP date
/// (`Wed, 21 Oct 2015 07:28:00 GMT`) measured from `now`. `None` for a value that is neither,
/// or a date already past.
pub fn retry_after_ms(value: &str, now: SystemTime) -> Option<u64> {
    let value = value.trim();
    if !value.is_empty() && value.bytes().all(|b| b.is_ascii_digit()) {
        return value.parse::<u64>().ok()?.checked_mul(1000);
    }
    let at = UNIX_EPOCH + Duration::from_secs(http_date_seconds(value)?);
    let wait = at.duration_since(now).ok()?;
    u64::try_from(wait.as_millis()).ok().filter(|ms| *ms > 0)
}

/// Seconds since the Unix epoch of an IMF-fixdate (`Sun, 06 Nov 1994 08:49:37 GMT`), the one
/// form of HTTP date a sender may generate.
fn http_date_seconds(value: &str) -> Option<u64> {
    let (weekday, rest) = value.split_once(", ")?;
    if weekday.len() != 3 {
        return None;
    }
    let parts: Vec<&str> = rest.split(' ').collect();
    let [day, month, year, time, "GMT"] = parts.as_slice() else {
        return None;
    };
    let number = |s: &str, len: usize| -> Option<u64> {
        (s.len() == len && s.bytes().all(|b| b.is_ascii_digit())).then(|| s.parse().ok())?
    };
    let day = number(day, 2)?;
    let year = number(year, 4)?;
    const MONTHS: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let month = MONTHS.iter().position(|m| m == month)? as u64 + 1;
    let hms: Vec<&str> = time.split(':').collect();
    let [h, m, s] = hms.as_slice() else {
        return None;
    };
    let (h, m, s) = (number(h, 2)?, number(m, 2)?, number(s, 2)?);
    if !(1970..=9999).contains(&year) || day == 0 || day > 31 || h > 23 || m > 59 || s > 60 {
        return None;
    }
    Some(days_from_civil(year, month, day) * 86_400 + h * 3600 + m * 60 + s)
}

/// Days from 1970-01-01 to the proleptic Gregorian date `year-month-day` (year ≥ 1970).
fn days_from_civil(year: u64, month: u64, day: u64) -> u64 {
    // Howard Hinnant's algorithm, with years starting in March so leap days come last.
    let year = if month <= 2 { year - 1 } else { year };
    let era = year / 400;
    let year_of_era = year - era * 400;
    let shifted_month = (month + 9) % 12;
    let day_of_year = (153 * shifted_month + 2) / 5 + day - 1;
    let day_of_era = year_of_era * 365 + year_of_era / 4 - year_of_era / 100 + day_of_year;
    era * 146_097 + day_of_era - 719_468
}

/// The wording of an error body: its error's message, type and code, as the common shapes put
/// them (`{"error": {"message", "type", "code"}}`, `{"message"}`, and the details' error code).
fn wording(body: &serde_json::Value) -> String {
    let error = body.get("error").unwrap_or(body);
    let mut words: Vec<String> = ["message", "type", "code"]
        .iter()
        .filter_map(|k| error.get(*k))
        .map(|v| v.as_str().map_or_else(|| v.to_string(), str::to_owned))
        .collect();
    if let Some(detail) = error
        .pointer("/details/error_code")
        .and_then(|v| v.as_str())
    {
        words.push(detail.to_owned());
    }
    if let Some(message) = error.as_str() {
        words.push(message.to_owned());
    }
    words.join(" ")
}

fn error_message(body: &serde_json::Value) -> Option<String> {
    let error = body.get("error").unwrap_or(body);
    error
        .get("message")
        .and_then(|v| v.as_str())
        .or_else(|| error.as_str())
        .map(str::to_owned)
        .filter(|m| !m.trim().is_empty())
}

fn names_quota(words: &str) -> bool {
    [
        "quota",
        "insufficient balance",
        "insufficient_balance",
        "insufficient credit",
        "credit balance",
        "billing",
        "spend limit",
        "spend_limit",
    ]
    .iter()
    .any(|w| words.contains(w))
}

fn names_context_overflow(words: &str) -> bool {
    [
        "context length",
        "context_length",
        "context window",
        "maximum context",
        "prompt is too long",
        "too many tokens",
    ]
    .iter()
    .any(|w| words.contains(w))
}

/// At most [`MESSAGE_BOUND`] characters of a server's words, an ellipsis marking a cut.
pub(crate) fn bound(message: &str) -> String {
    if message.chars().count() <= MESSAGE_BOUND {
        return message.to_owned();
    }
    let mut cut: String = message.chars().take(MESSAGE_BOUND - 1).collect();
    cut.push('…');
    cut
}

#[cfg(test)]
mod tests {
    use super::*;

    fn no_headers(_: &str) -> Option<String> {
        None
    }

    fn at(seconds: u64) -> SystemTime {
        UNIX_EPOCH + Duration::from_secs(seconds)
    }

    #[test]
    fn every_status_and_wording_has_one_code() {
        let table = [
            (401, r#"{"error":{"message":"Incorrect API key"}}"#, AUTH),
            (403, "forbidden", AUTH),
            (
                402,
                r#"{"error":{"message":"Insufficient Balance"}}"#,
                QUOTA,
            ),
            (
                429,
                r#"{"error":{"message":"You exceeded your current quota"}}"#,
                QUOTA,
            ),
            (
                429,
                r#"{"type":"error","error":{"type":"rate_limit_error","message":"slow down","details":{"error_code":"enforced_spend_limit_reached"}}}"#,
                QUOTA,
            ),
            (
                429,
                r#"{"error":{"type":"rate_limit_error","message":"slow down"}}"#,
                RATE_LIMIT,
            ),
            (
                400,
                r#"{"error":{"message":"This model's maximum context length is 8192 tokens"}}"#,
                CONTEXT_WINDOW_EXCEEDED,
            ),
            (
                400,
                r#"{"type":"error","error":{"type":"invalid_request_error","message":"prompt is too long: 210000 tokens > 200000 maximum"}}"#,
                CONTEXT_WINDOW_EXCEEDED,
            ),
            (413, "request entity too large", INVALID_REQUEST),
            (
                400,
                r#"{"error":{"message":"unknown field"}}"#,
                INVALID_REQUEST,
            ),
            (500, "", SERVER),
            (
                529,
                r#"{"type":"error","error":{"type":"overloaded_error"}}"#,
                SERVER,
            ),
            (404, "", "HTTP_404"),
        ];
        for (status, body, code) in table {
            let failure = classify(status, no_headers, body, at(0));
            assert_eq!(failure.code, code, "{status} {body}");
            assert_eq!(failure.status, status);
        }
        for code in [RATE_LIMIT, SERVER, TIMEOUT, TRANSPORT] {
            assert!(is_retryable(code), "{code}");
        }
        for code in [
            AUTH,
            QUOTA,
            CONTEXT_WINDOW_EXCEEDED,
            INVALID_REQUEST,
            BAD_RESPONSE,
        ] {
            assert!(!is_retryable(code), "{code}");
        }
    }

    #[test]
    fn the_message_request_id_and_retry_after_are_kept() {
        let headers = |name: &str| match name {
            "retry-after" => Some("2".to_owned()),
            "x-request-id" => Some("req-7".to_owned()),
            _ => None,
        };
        let failure = classify(429, headers, r#"{"error":{"message":"slow down"}}"#, at(0));
        assert_eq!(failure.retry_after_ms, Some(2000));
        assert_eq!(failure.request_id.as_deref(), Some("req-7"));
        assert_eq!(failure.message, "slow down");
        let from_body = classify(
            500,
            no_headers,
            r#"{"type":"error","error":{"type":"api_error","message":"boom"},"request_id":"req_01"}"#,
            at(0),
        );
        assert_eq!(from_body.request_id.as_deref(), Some("req_01"));
        let plain = classify(502, no_headers, "<html>bad gateway</html>", at(0));
        assert_eq!(plain.message, "the endpoint answered HTTP 502");
        let long = format!(r#"{{"error":{{"message":"{}"}}}}"#, "x".repeat(2000));
        let bounded = classify(400, no_headers, &long, at(0));
        assert_eq!(bounded.message.chars().count(), MESSAGE_BOUND);
        assert!(bounded.message.ends_with('…'));
    }

    #[test]
    fn retry_after_reads_seconds_and_http_dates_and_refuses_anything_else() {
        assert_eq!(retry_after_ms("120", at(0)), Some(120_000));
        assert_eq!(retry_after_ms(" 0 ", at(0)), Some(0));
        // 1994-11-06 08:49:37 UTC is 784111777 s after the epoch.
        let date = "Sun, 06 Nov 1994 08:49:37 GMT";
        assert_eq!(http_date_seconds(date), Some(784_111_777));
        assert_eq!(retry_after_ms(date, at(784_111_767)), Some(10_000));
        assert_eq!(
            retry_after_ms(date, at(784_111_777)),
            None,
            "not in the future"
        );
        assert_eq!(retry_after_ms(date, at(784_111_800)), None, "already past");
        // A leap day, and the first day of a year.
        assert_eq!(
            http_date_seconds("Thu, 29 Feb 2024 00:00:00 GMT"),
            Some(1_709_164_800)
        );
        assert_eq!(http_date_seconds("Thu, 01 Jan 1970 00:00:00 GMT"), Some(0));
        for bad in [
            "",
            "-5",
            "1.5",
            "soon",
            "Sun, 06 Nov 1994 08:49:37 UTC",
            "Sunday, 06-Nov-94 08:49:37 GMT",
            "Sun, 6 Nov 1994 08:49:37 GMT",
            "Sun, 06 Foo 1994 08:49:37 GMT",
            "Sun, 06 Nov 1994 25:49:37 GMT",
            "99999999999999999999999",
        ] {
            assert_eq!(retry_after_ms(bad, at(0)), None, "{bad:?}");
        }
    }
}
