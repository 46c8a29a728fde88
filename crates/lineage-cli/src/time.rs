//! UTC timestamps in ISO-8601 form, from milliseconds since the Unix epoch.
//!
//! The calendar arithmetic is the proleptic Gregorian civil-from-days conversion, valid for every
//! `i64` millisecond value (years far outside 0..=9999 are printed with as many digits as they
//! need and a sign when negative).

/// Milliseconds in a day.
const MS_PER_DAY: i64 = 86_400_000;

/// The civil date `(year, month, day)` of `days` since 1970-01-01.
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    // Shift the epoch to 0000-03-01 so that leap days fall at the end of a 400-year era.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097); // day of era, 0..=146096
    let yoe = (doe - doe / 1_460 + doe / 36_524 - doe / 146_096) / 365; // year of era, 0..=399
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100); // day of year from March 1, 0..=365
    let mp = (5 * doy + 2) / 153; // month from March, 0..=11
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

/// The parts of a timestamp: date, hour, minute, second, millisecond.
fn parts(ms: i64) -> ((i64, u32, u32), i64, i64, i64, i64) {
    let days = ms.div_euclid(MS_PER_DAY);
    let in_day = ms.rem_euclid(MS_PER_DAY);
    (
        civil_from_days(days),
        in_day / 3_600_000,
        in_day / 60_000 % 60,
        in_day / 1_000 % 60,
        in_day % 1_000,
    )
}

/// Formats a year with at least four digits, signed when negative.
fn year(y: i64) -> String {
    if y < 0 {
        format!("-{:04}", y.unsigned_abs())
    } else {
        format!("{y:04}")
    }
}

/// `ms` as `YYYY-MM-DDTHH:MM:SSZ` (seconds precision), for creation times.
pub fn iso_seconds(ms: i64) -> String {
    let ((y, mo, d), h, mi, s, _) = parts(ms);
    format!("{}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z", year(y))
}

/// `ms` as `YYYY-MM-DDTHH:MM:SS.mmmZ` (milliseconds precision), for event times.
pub fn iso_millis(ms: i64) -> String {
    let ((y, mo, d), h, mi, s, milli) = parts(ms);
    format!(
        "{}-{mo:02}-{d:02}T{h:02}:{mi:02}:{s:02}.{milli:03}Z",
        year(y)
    )
}

/// A creation time (unsigned milliseconds) at seconds precision; times past `i64::MAX` are clamped.
pub fn iso_seconds_u64(ms: u64) -> String {
    iso_seconds(i64::try_from(ms).unwrap_or(i64::MAX))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_instants() {
        assert_eq!(iso_seconds(0), "1970-01-01T00:00:00Z");
        assert_eq!(iso_millis(1_767_225_600_000), "2026-01-01T00:00:00.000Z");
        assert_eq!(iso_millis(1_750_000_000_123), "2025-06-15T15:06:40.123Z");
        assert_eq!(iso_millis(-1), "1969-12-31T23:59:59.999Z");
        assert_eq!(iso_seconds(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(iso_seconds(253_402_300_799_000), "9999-12-31T23:59:59Z");
        assert_eq!(iso_seconds(-62_135_596_800_000), "0001-01-01T00:00:00Z");
    }

    #[test]
    fn extremes_do_not_overflow() {
        assert!(iso_millis(i64::MAX).ends_with('Z'));
        assert!(iso_millis(i64::MIN).starts_with('-'));
        assert!(iso_seconds_u64(u64::MAX).ends_with('Z'));
    }

    #[test]
    fn every_day_of_a_leap_cycle_round_trips() {
        // Days from civil, the inverse, checked over 400 years around the epoch.
        fn days_from_civil(y: i64, m: u32, d: u32) -> i64 {
            let y = if m <= 2 { y - 1 } else { y };
            let era = y.div_euclid(400);
            let yoe = y.rem_euclid(400);
            let m = i64::from(m);
            let doy = (153 * (if m > 2 { m - 3 } else { m + 9 }) + 2) / 5 + i64::from(d) - 1;
            let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
            era * 146_097 + doe - 719_468
        }
        for days in -73_000..73_000 {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days, "{y}-{m}-{d}");
        }
    }
}
