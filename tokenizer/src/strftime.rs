//! `strftime_now(format)`, which chat templates call for today's date (Llama 3.2,
//! Mistral Small 3, Granite): Python's `datetime.strftime` for the directives templates
//! use, in UTC (a provider and the buyer counting its prompt must render the same text
//! wherever they are). Time is an argument; an unknown directive is an error, not a
//! guess.

/// Days since 1970-01-01 to (year, month 1-12, day 1-31), proleptic Gregorian
/// (Howard Hinnant's `civil_from_days`).
fn civil_from_days(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let day = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let month = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let year = yoe + era * 400 + i64::from(month <= 2);
    (year, month, day)
}

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const WEEKDAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// `format` at `unix_seconds` (UTC) as Python's `strftime` writes it, for %Y %y %m %d
/// %e %B %b %h %A %a %j %H %I %M %S %p %F %D %T and %%.
pub fn strftime(unix_seconds: i64, format: &str) -> Result<String, String> {
    let days = unix_seconds.div_euclid(86_400);
    let secs = unix_seconds.rem_euclid(86_400);
    let (year, month, day) = civil_from_days(days);
    let (hour, minute, second) = (secs / 3600, secs / 60 % 60, secs % 60);
    // 1970-01-01 was a Thursday (index 3 from Monday).
    let weekday = (days + 3).rem_euclid(7) as usize;
    let year_day = days - days_from_civil(year, 1, 1) + 1;
    let month_name = MONTHS[month as usize - 1];
    let mut out = String::new();
    let mut chars = format.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        let Some(directive) = chars.next() else {
            return Err("strftime format ends with a lone `%`".into());
        };
        match directive {
            'Y' => out.push_str(&year.to_string()),
            'y' => out.push_str(&format!("{:02}", year.rem_euclid(100))),
            'm' => out.push_str(&format!("{month:02}")),
            'd' => out.push_str(&format!("{day:02}")),
            'e' => out.push_str(&format!("{day:>2}")),
            'B' => out.push_str(month_name),
            'b' | 'h' => out.push_str(&month_name[..3]),
            'A' => out.push_str(WEEKDAYS[weekday]),
            'a' => out.push_str(&WEEKDAYS[weekday][..3]),
            'j' => out.push_str(&format!("{year_day:03}")),
            'H' => out.push_str(&format!("{hour:02}")),
            'I' => out.push_str(&format!("{:02}", (hour + 11) % 12 + 1)),
            'M' => out.push_str(&format!("{minute:02}")),
            'S' => out.push_str(&format!("{second:02}")),
            'p' => out.push_str(if hour < 12 { "AM" } else { "PM" }),
            'F' => out.push_str(&format!("{year}-{month:02}-{day:02}")),
            'D' => out.push_str(&format!("{month:02}/{day:02}/{:02}", year.rem_euclid(100))),
            'T' => out.push_str(&format!("{hour:02}:{minute:02}:{second:02}")),
            '%' => out.push('%'),
            other => return Err(format!("strftime directive `%{other}` is not supported")),
        }
    }
    Ok(out)
}

/// Days since 1970-01-01 of a civil date (the inverse of [`civil_from_days`]).
fn days_from_civil(year: i64, month: u32, day: u32) -> i64 {
    let year = year - i64::from(month <= 2);
    let era = year.div_euclid(400);
    let yoe = year.rem_euclid(400);
    let month = i64::from(month);
    let doy = (153 * (if month > 2 { month - 3 } else { month + 9 }) + 2) / 5 + i64::from(day) - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    /// 2026-12-06 09:30:00 UTC, the chat-template fixture's clock (a Sunday).
    const FIXTURE: i64 = 1_796_549_400;

    #[test]
    fn formats_as_python_does() {
        // Python: datetime(2026, 12, 6, 9, 30).strftime(...)
        for (format, expected) in [
            ("%d %b %Y", "06 Dec 2026"),
            ("%Y-%m-%d", "2026-12-06"),
            ("%B %d, %Y", "December 06, 2026"),
            ("%A %a %j %y", "Sunday Sun 340 26"),
            ("%H:%M:%S %I %p", "09:30:00 09 AM"),
            ("%F %T %D %e %%", "2026-12-06 09:30:00 12/06/26  6 %"),
        ] {
            assert_eq!(strftime(FIXTURE, format).unwrap(), expected, "{format}");
        }
    }

    #[test]
    fn dates_round_trip_over_four_centuries() {
        // Every day from 1800 to 2200: the civil date and its day number agree, days
        // advance one at a time, and weekdays cycle.
        let start = days_from_civil(1800, 1, 1);
        let mut previous = civil_from_days(start - 1);
        for days in start..days_from_civil(2200, 1, 1) {
            let (y, m, d) = civil_from_days(days);
            assert_eq!(days_from_civil(y, m, d), days);
            assert!((y, m, d) > previous);
            previous = (y, m, d);
        }
        assert_eq!(civil_from_days(days_from_civil(2024, 2, 29)), (2024, 2, 29));
        assert_eq!(strftime(0, "%A %F").unwrap(), "Thursday 1970-01-01");
        assert_eq!(strftime(-1, "%F %T").unwrap(), "1969-12-31 23:59:59");
    }

    #[test]
    fn an_unknown_directive_is_an_error() {
        assert!(strftime(0, "%Q").unwrap_err().contains("%Q"));
        assert!(strftime(0, "100%").is_err());
    }
}
