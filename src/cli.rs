//! Command-line definitions shared by the subcommands.

use anyhow::{bail, Result};

/// Parses a byte size: `4096`, `4k`, `2M` (binary units).
pub fn parse_size(s: &str) -> Result<u64, String> {
    let t = s.trim();
    let (num, mult) = match t.char_indices().last() {
        Some((i, c)) if c.is_ascii_alphabetic() => {
            let mult = match c.to_ascii_lowercase() {
                'k' => 1u64 << 10,
                'm' => 1 << 20,
                'g' => 1 << 30,
                _ => return Err(format!("'{s}' is not a size: use bytes, or a k/M/G suffix")),
            };
            (&t[..i], mult)
        }
        _ => (t, 1),
    };
    num.parse::<u64>()
        .ok()
        .and_then(|n| n.checked_mul(mult))
        .ok_or_else(|| format!("'{s}' is not a size: use bytes, or a k/M/G suffix"))
}

/// Parses a positive duration in seconds (fractions allowed).
pub fn parse_secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v.is_finite() => Ok(v),
        _ => Err(format!("'{s}' is not a positive number of seconds")),
    }
}

pub fn check_size_range(min: u64, max: Option<u64>) -> Result<()> {
    if let Some(max) = max {
        if min > max {
            bail!("bad size range: --min-size {min} is larger than --max-size {max}");
        }
    }
    Ok(())
}

/// Parses a stack sampling period: a power of two (1 = every event).
pub fn parse_sample(s: &str) -> Result<u32, String> {
    match s.parse::<u32>() {
        Ok(n) if n.is_power_of_two() => Ok(n),
        _ => Err(format!("'{s}' is not a power of two (1, 2, 4, … 65536)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes() {
        assert_eq!(parse_size("4096"), Ok(4096));
        assert_eq!(parse_size("4k"), Ok(4096));
        assert_eq!(parse_size("2M"), Ok(2 << 20));
        assert!(parse_size("12q").is_err());
        assert!(parse_size("").is_err());
        assert!(parse_size("-1").is_err());
    }

    #[test]
    fn ranges_and_periods() {
        assert!(check_size_range(10, Some(5))
            .unwrap_err()
            .to_string()
            .contains("bad size range"));
        assert!(check_size_range(10, None).is_ok());
        assert_eq!(parse_sample("64"), Ok(64));
        assert!(parse_sample("48").is_err());
        assert!(parse_secs("0").is_err());
        assert_eq!(parse_secs("1.5"), Ok(1.5));
    }
}
