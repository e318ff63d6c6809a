//! Go-style durations (`30s`, `5m`, `1h30m`, `0`): the form NVIDIA's config file and our flags
//! use for periods. Parsing and printing only; pure.

use std::fmt;
use std::str::FromStr;
use std::time::Duration;

use serde::{Deserialize, Serialize};

/// A Go-style duration (`30s`, `5m`, `1h30m`, `0`), the form NVIDIA's config uses.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub struct GoDuration(pub Duration);

impl FromStr for GoDuration {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("`{s}` is not a duration: write e.g. 30s, 5m or 1h30m");
        let s = s.trim();
        if s == "0" {
            return Ok(GoDuration(Duration::ZERO));
        }
        let mut rest = s;
        let mut total = Duration::ZERO;
        if rest.is_empty() {
            return Err(bad());
        }
        while !rest.is_empty() {
            let digits = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).ok_or_else(bad)?;
            if digits == 0 {
                return Err(bad());
            }
            let number: f64 = rest[..digits].parse().map_err(|_| bad())?;
            rest = &rest[digits..];
            let unit_len = rest.find(|c: char| c.is_ascii_digit() || c == '.').unwrap_or(rest.len());
            let nanos_per_unit: f64 = match &rest[..unit_len] {
                "ns" => 1.0,
                "us" | "µs" => 1e3,
                "ms" => 1e6,
                "s" => 1e9,
                "m" => 60e9,
                "h" => 3600e9,
                _ => return Err(bad()),
            };
            rest = &rest[unit_len..];
            total += Duration::from_nanos((number * nanos_per_unit).round() as u64);
        }
        Ok(GoDuration(total))
    }
}

impl fmt::Display for GoDuration {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let d = self.0;
        if d.subsec_nanos() == 0 {
            let s = d.as_secs();
            if s == 0 {
                return f.write_str("0s");
            }
            let (h, m, s) = (s / 3600, (s % 3600) / 60, s % 60);
            if h > 0 {
                write!(f, "{h}h")?;
            }
            if m > 0 {
                write!(f, "{m}m")?;
            }
            if s > 0 {
                write!(f, "{s}s")?;
            }
            Ok(())
        } else {
            write!(f, "{}ms", d.as_millis())
        }
    }
}

impl<'de> Deserialize<'de> for GoDuration {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        let s = String::deserialize(d)?;
        s.parse().map_err(serde::de::Error::custom)
    }
}

impl Serialize for GoDuration {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn go_durations() {
        for (s, secs) in
            [("30s", 30.0), ("5m", 300.0), ("1h30m", 5400.0), ("1.5s", 1.5), ("250ms", 0.25), ("0", 0.0)]
        {
            assert_eq!(s.parse::<GoDuration>().unwrap().0.as_secs_f64(), secs, "{s}");
        }
        for s in ["", "5", "m", "5 m", "5d", "-1s"] {
            assert!(s.parse::<GoDuration>().is_err(), "{s}");
        }
        assert_eq!(GoDuration(Duration::from_secs(5400)).to_string(), "1h30m");
        assert_eq!(GoDuration(Duration::from_millis(1500)).to_string(), "1500ms");
    }
}
