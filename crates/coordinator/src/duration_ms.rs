//! Reading a `*_ms` duration setting: an integer of milliseconds, or a readable string.
//!
//! Every duration setting of the host's configuration keeps its `_ms` name (so existing
//! configurations keep working) and takes either form:
//!
//! - an integer of milliseconds: `lease_ms = 60000`, `WORKPUMP_LEASE__LEASE_MS=60000`;
//! - a string of one or more `<integer><unit>` parts, units `ms`, `s`, `m`, `h` and `d`:
//!   `lease_ms = "60s"`, `"250ms"`, `"5m"`, `"1h"`, `"1m30s"` (`"1m 30s"` too), and in the
//!   environment `WORKPUMP_LEASE__LEASE_MS=1m30s`. A string of digits alone is milliseconds.
//!
//! Anything else is refused with the accepted forms ([`ACCEPTED`]); figment adds the key.
//! The helpers are `deserialize_with` functions, one per shape of field, in this crate because
//! every worker crate owns a config and depends on this one:
//!
//! ```
//! use serde::Deserialize;
//!
//! #[derive(Deserialize)]
//! struct Config {
//!     #[serde(deserialize_with = "workpump_coordinator::duration_ms::deserialize")]
//!     interval_ms: u64,
//! }
//!
//! let c: Config = serde_json::from_str(r#"{"interval_ms": "1m30s"}"#).unwrap();
//! assert_eq!(c.interval_ms, 90_000);
//! let c: Config = serde_json::from_str(r#"{"interval_ms": 250}"#).unwrap();
//! assert_eq!(c.interval_ms, 250);
//! assert!(serde_json::from_str::<Config>(r#"{"interval_ms": "5 minutes"}"#).is_err());
//! ```
//!
//! Values are still serialized as integers of milliseconds.

use std::fmt;

use serde::de::{self, Deserializer, Visitor};

/// The forms a duration setting accepts, as the refusal of a malformed one states them.
pub const ACCEPTED: &str = "a duration is an integer of milliseconds (e.g. 30000) or a string \
     of numbers with units ms, s, m, h or d (e.g. \"250ms\", \"30s\", \"5m\", \"1h\", \"1m30s\")";

/// A string that is not a duration.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[error("{input:?} is not a duration ({reason}); {ACCEPTED}")]
pub struct ParseDurationError {
    /// The string as given.
    pub input: String,
    /// What is wrong with it.
    pub reason: String,
}

/// Parses a duration string into milliseconds: digits alone (milliseconds), or one or more
/// `<integer><unit>` parts (`ms`, `s`, `m`, `h`, `d`), spaces allowed between them, e.g.
/// `"1m30s"` → 90 000.
pub fn parse(input: &str) -> Result<u64, ParseDurationError> {
    let fail = |reason: String| ParseDurationError {
        input: input.to_owned(),
        reason,
    };
    let text = input.trim();
    if text.is_empty() {
        return Err(fail("it is empty".to_owned()));
    }
    if text.bytes().all(|b| b.is_ascii_digit()) {
        return text
            .parse::<u64>()
            .map_err(|_| fail("too large".to_owned()));
    }
    let mut total: u64 = 0;
    let mut rest = text;
    while !rest.is_empty() {
        let digits = rest.bytes().take_while(u8::is_ascii_digit).count();
        if digits == 0 {
            return Err(fail(format!("expected a number at {rest:?}")));
        }
        let (number, after) = rest.split_at(digits);
        let number: u64 = number.parse().map_err(|_| fail("too large".to_owned()))?;
        let after = after.trim_start();
        let unit_len = after.bytes().take_while(u8::is_ascii_alphabetic).count();
        let (unit, after) = after.split_at(unit_len);
        let per_unit: u64 = match unit {
            "ms" => 1,
            "s" => 1_000,
            "m" => 60_000,
            "h" => 3_600_000,
            "d" => 86_400_000,
            "" => return Err(fail(format!("{number} has no unit"))),
            other => return Err(fail(format!("unknown unit {other:?}"))),
        };
        total = number
            .checked_mul(per_unit)
            .and_then(|ms| total.checked_add(ms))
            .ok_or_else(|| fail("too large".to_owned()))?;
        rest = after.trim_start();
    }
    Ok(total)
}

/// A required `*_ms` setting (`u64`): an integer of milliseconds or a duration string.
pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<u64, D::Error> {
    match d.deserialize_any(Ms { none: None })? {
        Some(ms) => Ok(ms),
        None => Err(de::Error::custom(format!(
            "a value is required: {ACCEPTED}"
        ))),
    }
}

/// An optional `*_ms` setting (`Option<u64>`, unset unless given): an integer of
/// milliseconds or a duration string.
pub mod option {
    use super::*;

    /// See [the module](self).
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        d.deserialize_any(Ms { none: Some(false) })
    }
}

/// A `*_ms` setting that `"none"` turns off (`Option<u64>`; TOML has no null and environment
/// variables are strings): an integer of milliseconds, a duration string, or `"none"`.
pub mod or_none {
    use super::*;

    /// See [the module](self).
    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<Option<u64>, D::Error> {
        d.deserialize_any(Ms { none: Some(true) })
    }
}

/// `none`: `None` for a required value; `Some(word)` for an optional one, `word` whether
/// `"none"` is accepted.
struct Ms {
    none: Option<bool>,
}

impl<'de> Visitor<'de> for Ms {
    type Value = Option<u64>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(ACCEPTED)?;
        if self.none == Some(true) {
            f.write_str(", or \"none\" to turn it off")?;
        }
        Ok(())
    }

    fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
        Ok(Some(v))
    }

    fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
        u64::try_from(v)
            .map(Some)
            .map_err(|_| E::invalid_value(de::Unexpected::Signed(v), &self))
    }

    fn visit_f64<E: de::Error>(self, v: f64) -> Result<Self::Value, E> {
        Err(E::invalid_value(de::Unexpected::Float(v), &self))
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
        if self.none == Some(true) && v.trim().eq_ignore_ascii_case("none") {
            return Ok(None);
        }
        match parse(v) {
            Ok(ms) => Ok(Some(ms)),
            Err(e) if self.none == Some(true) => {
                Err(E::custom(format!("{e}, or \"none\" to turn it off")))
            }
            Err(e) => Err(E::custom(e)),
        }
    }

    fn visit_unit<E: de::Error>(self) -> Result<Self::Value, E> {
        match self.none {
            Some(_) => Ok(None),
            None => Err(E::invalid_type(de::Unexpected::Unit, &self)),
        }
    }

    fn visit_none<E: de::Error>(self) -> Result<Self::Value, E> {
        self.visit_unit()
    }

    fn visit_some<D: Deserializer<'de>>(self, d: D) -> Result<Self::Value, D::Error> {
        d.deserialize_any(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[test]
    fn readable_strings_parse_to_milliseconds() {
        for (text, ms) in [
            ("250ms", 250),
            ("30s", 30_000),
            ("5m", 300_000),
            ("1h", 3_600_000),
            ("2d", 172_800_000),
            ("1m30s", 90_000),
            ("1h 2m 3s 4ms", 3_723_004),
            ("5 m", 300_000),
            (" 45s ", 45_000),
            ("1500", 1_500),
            ("0s", 0),
        ] {
            assert_eq!(parse(text), Ok(ms), "{text}");
        }
    }

    #[test]
    fn a_malformed_string_is_refused_saying_why_and_what_is_accepted() {
        for (text, reason) in [
            ("", "it is empty"),
            ("30x", "unknown unit \"x\""),
            ("5 minutes", "unknown unit \"minutes\""),
            ("1.5s", "1 has no unit"),
            ("s", "expected a number at \"s\""),
            ("1m30", "30 has no unit"),
            ("-5s", "expected a number at \"-5s\""),
            ("99999999999999999999s", "too large"),
            ("300000000000000d", "too large"),
        ] {
            let err = parse(text).unwrap_err();
            assert_eq!(err.reason, reason, "{text}");
            let message = err.to_string();
            assert!(message.contains("\"1m30s\""), "{message}");
            assert!(message.contains("integer of milliseconds"), "{message}");
        }
    }

    #[derive(Debug, Deserialize, PartialEq)]
    struct Fields {
        #[serde(default, deserialize_with = "deserialize")]
        required: u64,
        #[serde(default, deserialize_with = "option::deserialize")]
        optional: Option<u64>,
        #[serde(default, deserialize_with = "or_none::deserialize")]
        switchable: Option<u64>,
    }

    fn read(json: &str) -> Result<Fields, String> {
        serde_json::from_str(json).map_err(|e| e.to_string())
    }

    #[test]
    fn each_shape_of_field_takes_both_forms() {
        assert_eq!(
            read(r#"{"required": 5, "optional": "2s", "switchable": "none"}"#),
            Ok(Fields {
                required: 5,
                optional: Some(2_000),
                switchable: None
            })
        );
        assert_eq!(
            read(r#"{"required": "1m", "optional": 7, "switchable": "NONE"}"#),
            Ok(Fields {
                required: 60_000,
                optional: Some(7),
                switchable: None
            })
        );
        assert_eq!(
            read(r#"{"optional": null, "switchable": "3h"}"#),
            Ok(Fields {
                required: 0,
                optional: None,
                switchable: Some(10_800_000)
            })
        );
        // "none" only where it turns something off.
        let err = read(r#"{"optional": "none"}"#).unwrap_err();
        assert!(err.contains("\"none\" is not a duration"), "{err}");
        let err = read(r#"{"required": "none"}"#).unwrap_err();
        assert!(err.contains("is not a duration"), "{err}");
        let err = read(r#"{"switchable": "soon"}"#).unwrap_err();
        assert!(err.contains("or \"none\" to turn it off"), "{err}");
        for bad in [
            r#"{"required": -1}"#,
            r#"{"required": 1.5}"#,
            r#"{"required": true}"#,
        ] {
            let err = read(bad).unwrap_err();
            assert!(err.contains("integer of milliseconds"), "{bad}: {err}");
        }
    }
}
