//! Go-style duration strings (`"30s"`, `"1m30s"`, `"500ms"`), as Kubernetes'
//! `metav1.Duration` reads and writes them (Go's `time.ParseDuration` and
//! `time.Duration.String`).
//!
//! Negative durations are rejected: no kipvs setting has a meaning for them, and so are
//! durations of [`MAX`] or more, whose Go form the CRD schemas could not bound
//! ([`crate::schema::DURATION_PATTERN`]).

use std::fmt;
use std::time::Duration;

/// Why a duration string was rejected.
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
pub enum DurationError {
    /// The string does not follow Go's syntax `[-+]?([0-9]*(\.[0-9]*)?[a-z]+)+` (or `"0"`).
    #[error(
        "invalid duration {input:?}: {reason} (expected a Go duration such as \"30s\", \"1m30s\" or \"500ms\")"
    )]
    Syntax {
        /// The rejected input.
        input: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// A unit other than `ns`, `us`, `µs`, `ms`, `s`, `m`, `h`.
    #[error(
        "invalid duration {input:?}: unknown unit {unit:?} (valid units: ns, us, µs, ms, s, m, h)"
    )]
    UnknownUnit {
        /// The rejected input.
        input: String,
        /// The unknown unit.
        unit: String,
    },
    /// Longer than [`MAX`].
    #[error("invalid duration {input:?}: out of range (at most 99999h59m59.999999999s)")]
    Overflow {
        /// The rejected input.
        input: String,
    },
    /// A negative, non-zero duration.
    #[error("invalid duration {input:?}: negative durations are not allowed")]
    Negative {
        /// The rejected input.
        input: String,
    },
}

/// The longest duration accepted: just under 100,000 h (about 11 years; Go's `time.Duration`
/// holds up to about 2,562,047 h). Its Go form has at most 5 digits of hours, which is what
/// the CRD schemas' pattern bounds.
pub const MAX: Duration = Duration::new(100_000 * 3600 - 1, 999_999_999);

const MAX_NANOS: u128 = MAX.as_nanos();

fn unit_nanos(unit: &str) -> Option<u128> {
    Some(match unit {
        "ns" => 1,
        "us" | "µs" | "μs" => 1_000,
        "ms" => 1_000_000,
        "s" => 1_000_000_000,
        "m" => 60_000_000_000,
        "h" => 3_600_000_000_000,
        _ => return None,
    })
}

/// Parses a Go duration string (`time.ParseDuration` syntax) into a [`Duration`].
///
/// Accepts a sequence of decimal numbers, each with an optional fraction and a unit
/// (`ns`, `us`/`µs`, `ms`, `s`, `m`, `h`), e.g. `"300ms"`, `"1.5h"`, `"2h45m"`, and the bare
/// `"0"`. A leading `+` is allowed; a leading `-` is rejected unless the value is zero.
///
/// # Errors
/// A syntax error, an unknown unit, a negative duration, or one longer than [`MAX`].
pub fn parse(input: &str) -> Result<Duration, DurationError> {
    let (negative, mut rest) = match input.as_bytes().first() {
        Some(b'-') => (true, &input[1..]),
        Some(b'+') => (false, &input[1..]),
        _ => (false, input),
    };
    if rest == "0" {
        return Ok(Duration::ZERO);
    }
    if rest.is_empty() {
        return Err(DurationError::Syntax {
            input: input.to_owned(),
            reason: "empty",
        });
    }
    let mut total: u128 = 0;
    while !rest.is_empty() {
        let (nanos, after) = term(input, rest)?;
        total = total
            .checked_add(nanos)
            .filter(|total| *total <= MAX_NANOS)
            .ok_or_else(|| DurationError::Overflow {
                input: input.to_owned(),
            })?;
        rest = after;
    }
    if negative && total != 0 {
        return Err(DurationError::Negative {
            input: input.to_owned(),
        });
    }
    let secs = (total / 1_000_000_000) as u64;
    let nanos = (total % 1_000_000_000) as u32;
    Ok(Duration::new(secs, nanos))
}

/// The first term of `rest` (a part of `input`): a decimal number with an optional fraction
/// and its unit, as nanoseconds, and what follows it.
fn term<'a>(input: &str, rest: &'a str) -> Result<(u128, &'a str), DurationError> {
    let syntax = |reason| DurationError::Syntax {
        input: input.to_owned(),
        reason,
    };
    let overflow = || DurationError::Overflow {
        input: input.to_owned(),
    };
    let int_len = rest.bytes().take_while(u8::is_ascii_digit).count();
    let (int_digits, after_int) = rest.split_at(int_len);
    let (frac_digits, after_number) = match after_int.strip_prefix('.') {
        Some(after_dot) => {
            let frac_len = after_dot.bytes().take_while(u8::is_ascii_digit).count();
            after_dot.split_at(frac_len)
        }
        None => ("", after_int),
    };
    if int_digits.is_empty() && frac_digits.is_empty() {
        return Err(syntax("missing number"));
    }
    let unit_len = after_number
        .find(|c: char| c == '.' || c.is_ascii_digit())
        .unwrap_or(after_number.len());
    let (unit, after_unit) = after_number.split_at(unit_len);
    if unit.is_empty() {
        return Err(syntax("missing unit"));
    }
    let scale = unit_nanos(unit).ok_or_else(|| DurationError::UnknownUnit {
        input: input.to_owned(),
        unit: unit.to_owned(),
    })?;
    // Digits beyond what fits are irrelevant: anything that large overflows below.
    let int: u128 = if int_digits.is_empty() {
        0
    } else {
        int_digits.parse().map_err(|_| overflow())?
    };
    let mut nanos = int.checked_mul(scale).ok_or_else(overflow)?;
    // The fraction contributes frac * scale / 10^len, truncated like Go does.
    let mut place = scale;
    for digit in frac_digits.bytes() {
        place /= 10;
        if place == 0 {
            break;
        }
        nanos += u128::from(digit - b'0') * place;
    }
    Ok((nanos, after_unit))
}

/// Formats a [`Duration`] the way Go's `time.Duration.String` does: `"0s"`, `"500ms"`,
/// `"1.5µs"`, `"30s"`, `"1m30s"`, `"1h0m0s"`. [`parse`] reads every output back exactly.
pub fn format(duration: Duration) -> String {
    GoDuration(duration).to_string()
}

/// Display adapter implementing Go's `time.Duration.String` algorithm.
struct GoDuration(Duration);

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let nanos = self.0.as_nanos();
        if nanos == 0 {
            return f.write_str("0s");
        }
        if nanos < 1_000_000_000 {
            // Sub-second values use the largest unit that keeps an integer part.
            let (unit, digits) = if nanos < 1_000 {
                ("ns", 0)
            } else if nanos < 1_000_000 {
                ("µs", 3)
            } else {
                ("ms", 6)
            };
            write_fraction(f, nanos, digits)?;
            return f.write_str(unit);
        }
        let hours = nanos / 3_600_000_000_000;
        let minutes = nanos / 60_000_000_000 % 60;
        let second_nanos = nanos % 60_000_000_000;
        if hours > 0 {
            write!(f, "{hours}h{minutes}m")?;
        } else if minutes > 0 {
            write!(f, "{minutes}m")?;
        }
        write_fraction(f, second_nanos, 9)?;
        f.write_str("s")
    }
}

/// Writes `value / 10^digits` with the fraction's trailing zeros (and a bare dot) removed.
fn write_fraction(f: &mut fmt::Formatter<'_>, value: u128, digits: u32) -> fmt::Result {
    let divisor = 10u128.pow(digits);
    write!(f, "{}", value / divisor)?;
    let fraction = value % divisor;
    if fraction != 0 {
        let text = format!("{fraction:0width$}", width = digits as usize);
        write!(f, ".{}", text.trim_end_matches('0'))?;
    }
    Ok(())
}

/// `#[serde(with = "crate::duration::serde_go")]` for `std::time::Duration` fields stored as
/// Go duration strings.
pub(crate) mod serde_go {
    use serde::{Deserialize, Deserializer, Serializer};
    use std::time::Duration;

    pub(crate) fn serialize<S: Serializer>(
        duration: &Duration,
        serializer: S,
    ) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&super::format(*duration))
    }

    pub(crate) fn deserialize<'de, D: Deserializer<'de>>(
        deserializer: D,
    ) -> Result<Duration, D::Error> {
        let text = String::deserialize(deserializer)?;
        super::parse(&text).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ms(v: u64) -> Duration {
        Duration::from_millis(v)
    }

    #[test]
    fn parses_go_syntax() {
        assert_eq!(parse("0"), Ok(Duration::ZERO));
        assert_eq!(parse("0s"), Ok(Duration::ZERO));
        assert_eq!(parse("-0s"), Ok(Duration::ZERO));
        assert_eq!(parse("30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("+30s"), Ok(Duration::from_secs(30)));
        assert_eq!(parse("1m30s"), Ok(Duration::from_secs(90)));
        assert_eq!(parse("500ms"), Ok(ms(500)));
        assert_eq!(parse("1.5h"), Ok(Duration::from_secs(5400)));
        assert_eq!(parse(".5s"), Ok(ms(500)));
        assert_eq!(parse("1.s"), Ok(Duration::from_secs(1)));
        assert_eq!(parse("2h45m"), Ok(Duration::from_secs(9900)));
        assert_eq!(parse("1µs"), Ok(Duration::from_micros(1)));
        assert_eq!(parse("1us"), Ok(Duration::from_micros(1)));
        assert_eq!(parse("3ns"), Ok(Duration::from_nanos(3)));
        assert_eq!(parse("1.0000000001s"), Ok(Duration::from_secs(1)));
        assert_eq!(
            parse("1h1m1s1ms1us1ns").unwrap().as_nanos(),
            3_661_001_001_001
        );
    }

    #[test]
    fn rejects_bad_durations() {
        for bad in [
            "", "-", "s", "30", "1.5", ".s", "1x", "1m30", "30 s", "1e3s", "1s-2s",
        ] {
            assert!(parse(bad).is_err(), "{bad:?} should be rejected");
        }
        assert_eq!(
            parse("-5s"),
            Err(DurationError::Negative {
                input: "-5s".into()
            })
        );
        assert_eq!(
            parse("3d"),
            Err(DurationError::UnknownUnit {
                input: "3d".into(),
                unit: "d".into()
            })
        );
        assert!(matches!(
            parse("9223372037s"),
            Err(DurationError::Overflow { .. })
        ));
        assert!(matches!(
            parse("99999999999999999999999999999999999999999h"),
            Err(DurationError::Overflow { .. })
        ));
    }

    #[test]
    fn formats_like_go() {
        let cases = [
            (Duration::ZERO, "0s"),
            (Duration::from_nanos(1), "1ns"),
            (Duration::from_nanos(1_500), "1.5µs"),
            (ms(500), "500ms"),
            (Duration::from_micros(1_500), "1.5ms"),
            (Duration::from_secs(30), "30s"),
            (ms(1_500), "1.5s"),
            (Duration::from_secs(90), "1m30s"),
            (Duration::from_secs(120), "2m0s"),
            (Duration::from_secs(3600), "1h0m0s"),
            (Duration::from_secs(3661), "1h1m1s"),
        ];
        for (duration, text) in cases {
            assert_eq!(format(duration), text);
            assert_eq!(parse(text), Ok(duration), "round trip of {text}");
        }
    }
}
