//! Input checks shared by every coordinator, so the PostgreSQL implementation and the fake
//! refuse the same things with the same messages. The SQL functions check again (they are
//! callable directly), but a Rust caller is stopped here, before a round trip.

use std::time::Duration;

use chrono::{DateTime, Datelike, Utc};
use serde_json::Value;

use crate::error::{Error, Result};
use crate::types::*;
use crate::{
    MAX_CLAIM_BATCH, MAX_ENQUEUE_BATCH, MAX_KIND_CHARS, MAX_LEASE, MAX_ORDERING_KEY_CHARS,
    MAX_PAYLOAD_BYTES, MAX_PAYLOAD_DEPTH, MAX_SCHEDULE_AHEAD, MAX_UNIQUE_KEY_BYTES,
};

/// Checks a queue name: 1 to 128 characters from `A-Z a-z 0-9 _ . : -`, starting with a
/// letter or digit.
pub fn validate_queue_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 128
        && name.as_bytes()[0].is_ascii_alphanumeric()
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'.' | b':' | b'-'));
    if ok {
        Ok(())
    } else {
        Err(invalid(format!(
            "queue name {:?} must be 1 to 128 characters from A-Z a-z 0-9 _ . : -, starting with a letter or digit",
            truncate(name, 64)
        )))
    }
}

/// Checks a job kind: 1 to [`MAX_KIND_CHARS`] characters, no control characters (NUL
/// included).
pub fn validate_kind(kind: &str) -> Result<()> {
    let n = kind.chars().count();
    if (1..=MAX_KIND_CHARS).contains(&n) && !kind.chars().any(char::is_control) {
        Ok(())
    } else {
        Err(invalid(format!(
            "job kind {:?} must be 1 to {MAX_KIND_CHARS} characters without control characters",
            truncate(kind, 64)
        )))
    }
}

/// Checks an ordering key: 1 to [`MAX_ORDERING_KEY_CHARS`] characters, no control characters
/// (NUL included).
pub fn validate_ordering_key(key: &str) -> Result<()> {
    let n = key.chars().count();
    if (1..=MAX_ORDERING_KEY_CHARS).contains(&n) && !key.chars().any(char::is_control) {
        Ok(())
    } else {
        Err(invalid(format!(
            "ordering key {:?} must be 1 to {MAX_ORDERING_KEY_CHARS} characters without control characters",
            truncate(key, 64)
        )))
    }
}

/// Checks a schema name: 1 to 40 characters from `a-z 0-9 _`, not starting with a digit,
/// not `pg_`-prefixed and not `information_schema` (system schemas are never workpump's).
/// Such a name is always a valid, unambiguous identifier; the coordinator still quotes it
/// wherever it is used.
pub fn validate_schema_name(name: &str) -> Result<()> {
    let ok = !name.is_empty()
        && name.len() <= 40
        && !name.as_bytes()[0].is_ascii_digit()
        && !name.starts_with("pg_")
        && name != "information_schema"
        && name
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'_');
    if ok {
        Ok(())
    } else {
        Err(invalid(format!(
            "schema name {:?} must be 1 to 40 characters from a-z 0-9 _, not starting with a digit or pg_, and not information_schema",
            truncate(name, 64)
        )))
    }
}

pub(crate) fn validate_register_queue(p: &RegisterQueueParams) -> Result<()> {
    validate_queue_name(&p.name)?;
    validate_max_attempts(p.max_attempts)?;
    validate_owner("register_queue", p.owner.as_deref())?;
    validate_flow_limits("register_queue", p.max_running, p.rate_limit)
}

/// A queue's flow limits (docs/flow-control.md): each `None` (unlimited) or in range.
pub(crate) fn validate_flow_limits(
    what: &str,
    max_running: Option<u32>,
    rate: Option<crate::RateLimit>,
) -> Result<()> {
    let named = |e: Error| match e {
        Error::InvalidArgument(m) => invalid(format!("{what}: {m}")),
        other => other,
    };
    if let Some(n) = max_running {
        crate::validate_max_running(n).map_err(named)?;
    }
    if let Some(r) = rate {
        r.validate().map_err(named)?;
    }
    Ok(())
}

/// A queue owner's name: 1 to 128 characters, no NUL.
pub(crate) fn validate_owner(what: &str, owner: Option<&str>) -> Result<()> {
    match owner {
        Some(o) if o.is_empty() || o.chars().count() > 128 || o.contains('\0') => Err(invalid(
            format!("{what}: owner must be 1 to 128 characters without NUL, got {o:?}"),
        )),
        _ => Ok(()),
    }
}

/// An enqueue batch's JSON, as text ready to send.
#[derive(Debug)]
pub(crate) struct EnqueueTexts {
    /// Each item's payload.
    pub(crate) payloads: Vec<String>,
    /// Each item's metadata object, if it has one.
    pub(crate) metadata: Vec<Option<String>>,
}

/// An enqueue batch, checked item by item; payloads and metadata come back as JSON text.
pub(crate) fn validate_enqueue(p: &EnqueueWorkParams) -> Result<EnqueueTexts> {
    if p.items.is_empty() {
        return Err(invalid("enqueue needs at least one item".into()));
    }
    if p.items.len() > MAX_ENQUEUE_BATCH {
        return Err(invalid(format!(
            "a batch of {} items exceeds the maximum of {MAX_ENQUEUE_BATCH}",
            p.items.len()
        )));
    }
    let mut texts = EnqueueTexts {
        payloads: Vec::with_capacity(p.items.len()),
        metadata: Vec::with_capacity(p.items.len()),
    };
    for (i, item) in p.items.iter().enumerate() {
        let at = |msg: String| invalid(format!("item {i}: {msg}"));
        validate_queue_name(&item.queue).map_err(|e| at(reason(e)))?;
        texts
            .payloads
            .push(payload_text(&item.payload).map_err(at)?);
        if let Some(kind) = &item.kind {
            validate_kind(kind).map_err(|e| at(reason(e)))?;
        }
        if let Some(key) = &item.ordering_key {
            validate_ordering_key(key).map_err(|e| at(reason(e)))?;
        }
        texts.metadata.push(match &item.metadata {
            None => None,
            Some(m @ Value::Object(_)) => Some(
                payload_text(m)
                    .map_err(|e| at(format!("metadata: {}", e.replacen("payload", "it", 1))))?,
            ),
            Some(_) => return Err(at("metadata must be a JSON object".into())),
        });
        match item.schedule {
            Schedule::Now => {}
            Schedule::After(d) => {
                if d > MAX_SCHEDULE_AHEAD {
                    return Err(at(format!(
                        "run_after of {d:?} is more than 100 years ahead"
                    )));
                }
            }
            Schedule::At(t) => validate_business_time(t).map_err(at)?,
        }
        if let Some(key) = &item.unique_key {
            if key.is_empty() || key.len() > MAX_UNIQUE_KEY_BYTES || key.contains('\0') {
                return Err(at(format!(
                    "unique_key must be 1 to {MAX_UNIQUE_KEY_BYTES} bytes without NUL characters"
                )));
            }
        }
        if let Some(m) = item.max_attempts {
            validate_max_attempts(m).map_err(|e| at(reason(e)))?;
        }
    }
    Ok(texts)
}

pub(crate) fn validate_claim(p: &ClaimWorkParams) -> Result<()> {
    if p.queues.is_empty() {
        return Err(invalid("claim needs at least one queue".into()));
    }
    for q in &p.queues {
        validate_queue_name(q)?;
    }
    if p.max_items == 0 || p.max_items > MAX_CLAIM_BATCH {
        return Err(invalid(format!(
            "max_items must be between 1 and {MAX_CLAIM_BATCH}, got {}",
            p.max_items
        )));
    }
    validate_lease(p.lease)
}

pub(crate) fn validate_renew(p: &RenewLeasesParams) -> Result<()> {
    validate_lease(p.lease)
}

pub(crate) fn validate_fail(p: &FailWorkParams) -> Result<()> {
    for f in &p.items {
        if let FailDisposition::RetryAfter(d) = f.disposition {
            if d > MAX_SCHEDULE_AHEAD {
                return Err(invalid(format!(
                    "item {}: retry delay of {d:?} is more than 100 years",
                    f.fence.id
                )));
            }
        }
    }
    Ok(())
}

pub(crate) fn validate_checkpoint(p: &CheckpointWorkParams) -> Result<String> {
    payload_text(&p.checkpoint).map_err(|m| invalid(format!("checkpoint: {m}")))
}

/// A heartbeat: its metadata is stored as jsonb, so it obeys the payload rules (no NUL
/// characters, bounded depth and size, numbers that read back).
pub(crate) fn validate_heartbeat(p: &RecordHeartbeatParams) -> Result<()> {
    payload_text(&p.metadata)
        .map(drop)
        .map_err(|m| invalid(format!("metadata: {m}")))
}

pub(crate) fn validate_stale(
    stale_after: Duration,
    dead_after: Option<Duration>,
    lock_grace: Option<Duration>,
) -> Result<()> {
    // Bounded above too: the store computes now() - cutoff, which a cutoff of (say)
    // Duration::MAX would take out of the timestamp range (a database error, or a panic in
    // the fake's clock arithmetic).
    let check = |name: &str, d: Duration| {
        if micros(d) == 0 || d > MAX_CUTOFF {
            Err(invalid(format!(
                "{name} must be between 1 µs and 100 years, got {d:?}"
            )))
        } else {
            Ok(())
        }
    };
    check("stale_after", stale_after)?;
    if let Some(d) = dead_after {
        check("dead_after", d)?;
    }
    if let Some(d) = lock_grace {
        check("lock_grace", d)?;
    }
    Ok(())
}

fn validate_lease(lease: Duration) -> Result<()> {
    if micros(lease) == 0 || lease > MAX_LEASE {
        return Err(invalid(format!(
            "lease must be between 1 µs and 24 h, got {lease:?}"
        )));
    }
    Ok(())
}

pub(crate) fn validate_max_attempts(m: i32) -> Result<()> {
    if (1..=1000).contains(&m) {
        Ok(())
    } else {
        Err(invalid(format!(
            "max_attempts must be between 1 and 1000, got {m}"
        )))
    }
}

fn validate_business_time(t: DateTime<Utc>) -> std::result::Result<(), String> {
    if (1970..=9999).contains(&t.year()) {
        Ok(())
    } else {
        Err(format!("run_at {t} is outside the years 1970 to 9999"))
    }
}

/// A payload's JSON text, after checking depth, NUL characters (PostgreSQL's jsonb refuses
/// `\u0000`) and size. The walk is iterative, so a hostile nesting depth can't overflow the
/// stack before it is refused.
fn payload_text(v: &Value) -> std::result::Result<String, String> {
    let mut stack = vec![(v, 1usize)];
    while let Some((v, depth)) = stack.pop() {
        match v {
            Value::Array(items) => {
                check_depth(depth)?;
                stack.extend(items.iter().map(|i| (i, depth + 1)));
            }
            Value::Object(map) => {
                check_depth(depth)?;
                for (k, item) in map {
                    if k.contains('\0') {
                        return Err("payload has a NUL character (\\u0000) in a key, which PostgreSQL's jsonb refuses".into());
                    }
                    stack.push((item, depth + 1));
                }
            }
            Value::String(s) if s.contains('\0') => {
                return Err("payload has a NUL character (\\u0000) in a string, which PostgreSQL's jsonb refuses".into());
            }
            Value::Number(n) if n.as_f64().is_some_and(|f| f.abs() > MAX_PAYLOAD_NUMBER) => {
                return Err(format!(
                    "payload has the number {n}, beyond ±1e308: it would be stored, but could not be read back"
                ));
            }
            _ => {}
        }
    }
    let text = serde_json::to_string(v).map_err(|e| format!("payload is not serialisable: {e}"))?;
    if text.len() > MAX_PAYLOAD_BYTES {
        return Err(format!(
            "payload is {} bytes as JSON; the limit is {MAX_PAYLOAD_BYTES}",
            text.len()
        ));
    }
    Ok(text)
}

/// The largest magnitude of a payload number. PostgreSQL's jsonb prints a number like
/// 1.7976931348623157e308 as its 309 plain digits, which serde_json (without its
/// `float_roundtrip` feature) reads back as infinity and refuses; every claim of the item
/// would then fail to decode. Below 1e308 the rounding can never reach infinity.
const MAX_PAYLOAD_NUMBER: f64 = 1e308;

fn check_depth(depth: usize) -> std::result::Result<(), String> {
    if depth > MAX_PAYLOAD_DEPTH {
        Err(format!(
            "payload is nested more than {MAX_PAYLOAD_DEPTH} levels deep"
        ))
    } else {
        Ok(())
    }
}

/// Text for a column that can't hold NUL (error messages, host names): NUL becomes U+FFFD.
pub(crate) fn sanitize_text(s: &str) -> String {
    if s.contains('\0') {
        s.replace('\0', "\u{FFFD}")
    } else {
        s.to_owned()
    }
}

/// The longest liveness cutoff (stale_after, dead_after, lock_grace) accepted: the same 100
/// years as scheduling ahead.
const MAX_CUTOFF: Duration = MAX_SCHEDULE_AHEAD;

/// Microseconds, PostgreSQL's interval resolution (finer parts are dropped).
pub(crate) fn micros(d: Duration) -> i64 {
    i64::try_from(d.as_micros()).unwrap_or(i64::MAX)
}

fn invalid(msg: String) -> Error {
    Error::InvalidArgument(msg)
}

/// The message of an invalid argument without its "invalid argument: " prefix, to wrap it in
/// more context (e.g. "item 3: ...") without saying it twice.
fn reason(e: Error) -> String {
    match e {
        Error::InvalidArgument(m) => m,
        other => other.to_string(),
    }
}

fn truncate(s: &str, max: usize) -> &str {
    match s.char_indices().nth(max) {
        Some((i, _)) => &s[..i],
        None => s,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn queue_names_follow_the_documented_alphabet() {
        for ok in ["a", "emails", "Q-1.b:c_d", &"x".repeat(128)] {
            assert!(validate_queue_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "-a",
            "_a",
            "a b",
            "a'; drop table work; --",
            "é",
            &"x".repeat(129),
        ] {
            assert!(
                matches!(validate_queue_name(bad), Err(Error::InvalidArgument(_))),
                "{bad}"
            );
        }
    }

    #[test]
    fn schema_names_are_plain_lowercase_identifiers() {
        for ok in ["workpump", "wp_2", "_x"] {
            assert!(validate_schema_name(ok).is_ok(), "{ok}");
        }
        for bad in [
            "",
            "Workpump",
            "1wp",
            "pg_catalog",
            "a\"b",
            "a-b",
            &"x".repeat(41),
        ] {
            assert!(validate_schema_name(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn a_payload_nested_too_deep_is_refused_without_recursion() {
        let mut v = json!(1);
        for _ in 0..100_000 {
            v = Value::Array(vec![v]);
        }
        let err = payload_text(&v).unwrap_err();
        assert!(
            err.contains(&format!("nested more than {MAX_PAYLOAD_DEPTH}")),
            "{err}"
        );
        // Dropping a deeply nested Value recurses in serde_json; unwind it by hand.
        while let Value::Array(mut items) = v {
            v = items.pop().unwrap_or(Value::Null);
        }
    }

    #[test]
    fn a_payload_at_the_depth_limit_is_accepted() {
        let mut v = json!(1);
        for _ in 0..MAX_PAYLOAD_DEPTH {
            v = json!([v]);
        }
        assert!(payload_text(&v).is_ok());
        let v = json!([v]);
        assert!(payload_text(&v).is_err());
    }

    #[test]
    fn nul_characters_and_oversized_payloads_are_refused() {
        assert!(payload_text(&json!({"a": "x\u{0}y"}))
            .unwrap_err()
            .contains("NUL"));
        assert!(payload_text(&json!({"a\u{0}": 1}))
            .unwrap_err()
            .contains("NUL"));
        // The six characters \u0000 in a string are fine: they are not a NUL.
        assert!(payload_text(&json!({"a": "\\u0000"})).is_ok());
        let big = json!("x".repeat(MAX_PAYLOAD_BYTES));
        assert!(payload_text(&big).unwrap_err().contains("limit"));
    }

    #[test]
    fn enqueue_names_the_offending_item() {
        let p = EnqueueWorkParams {
            items: vec![
                NewWork::new("q", json!(1)),
                NewWork::new("q", json!(1)).max_attempts(0),
            ],
        };
        let err = validate_enqueue(&p).unwrap_err().to_string();
        assert!(
            err.contains("item 1") && err.contains("max_attempts"),
            "{err}"
        );
        let empty = EnqueueWorkParams { items: vec![] };
        assert!(validate_enqueue(&empty).is_err());
        let huge = EnqueueWorkParams {
            items: vec![NewWork::new("q", json!(1)); MAX_ENQUEUE_BATCH + 1],
        };
        assert!(validate_enqueue(&huge)
            .unwrap_err()
            .to_string()
            .contains("exceeds the maximum"));
    }

    #[test]
    fn leases_must_be_positive_and_bounded() {
        let mut p = ClaimWorkParams {
            instance: InstanceId::new(),
            queues: vec!["q".into()],
            max_items: 1,
            lease: Duration::from_nanos(999),
            async_commit: false,
        };
        assert!(validate_claim(&p).is_err());
        p.lease = Duration::from_secs(25 * 3600);
        assert!(validate_claim(&p).is_err());
        p.lease = Duration::from_secs(60);
        assert!(validate_claim(&p).is_ok());
        p.max_items = 0;
        assert!(validate_claim(&p).is_err());
    }
}
