//! Provider policy inputs that operators write as text: availability windows and the
//! thermal/power guard.

use sharemesh_protocol::AvailabilityWindow;

const DAYS: [&str; 7] = ["mon", "tue", "wed", "thu", "fri", "sat", "sun"];

fn day_index(name: &str) -> Result<u8, String> {
    DAYS.iter()
        .position(|d| name.eq_ignore_ascii_case(d))
        .map(|i| i as u8)
        .ok_or_else(|| format!("unknown weekday `{name}` (use mon … sun)"))
}

fn minutes(text: &str) -> Result<u16, String> {
    let (h, m) = text
        .split_once(':')
        .ok_or_else(|| format!("`{text}` is not HH:MM"))?;
    let (h, m): (u16, u16) = (
        h.parse().map_err(|_| format!("bad hour in `{text}`"))?,
        m.parse().map_err(|_| format!("bad minute in `{text}`"))?,
    );
    if m >= 60 || h * 60 + m > 1440 {
        return Err(format!("`{text}` is not a time of day (00:00–24:00)"));
    }
    Ok(h * 60 + m)
}

/// Parses `DAYS HH:MM-HH:MM [UTC±HH:MM]`, e.g. `mon-fri 09:00-17:00 UTC+02:00`,
/// `sat,sun 00:00-24:00`, `mon 22:00-06:00` (past midnight).
pub fn parse_window(text: &str) -> Result<AvailabilityWindow, String> {
    let mut parts = text.split_whitespace();
    let days = parts.next().ok_or("empty window")?;
    let range = parts
        .next()
        .ok_or_else(|| format!("window `{text}` lacks a time range HH:MM-HH:MM"))?;
    let offset = parts.next();
    if parts.next().is_some() {
        return Err(format!("window `{text}` has extra words"));
    }
    let mut weekdays = 0u8;
    for item in days.split(',') {
        match item.split_once('-') {
            Some((from, to)) => {
                let (from, to) = (day_index(from)?, day_index(to)?);
                let mut d = from;
                loop {
                    weekdays |= 1 << d;
                    if d == to {
                        break;
                    }
                    d = (d + 1) % 7;
                }
            }
            None => weekdays |= 1 << day_index(item)?,
        }
    }
    let (start, end) = range
        .split_once('-')
        .ok_or_else(|| format!("`{range}` is not HH:MM-HH:MM"))?;
    let utc_offset_minutes = match offset {
        None => 0,
        Some(offset) => {
            let rest = offset.strip_prefix("UTC").unwrap_or(offset);
            let (sign, rest) = match rest.chars().next() {
                Some('+') => (1, &rest[1..]),
                Some('-') => (-1, &rest[1..]),
                _ => return Err(format!("`{offset}` is not an offset like UTC+02:00")),
            };
            let value = minutes(rest)? as i16;
            if value > 14 * 60 {
                return Err(format!("`{offset}` is beyond ±14:00"));
            }
            sign * value
        }
    };
    Ok(AvailabilityWindow {
        weekdays,
        start_minute: minutes(start)?,
        end_minute: minutes(end)?,
        utc_offset_minutes,
    })
}

/// The text [`parse_window`] reads, for a window: `mon-fri 09:00-17:00 UTC+02:00`.
pub fn format_window(window: &AvailabilityWindow) -> String {
    let mut days = Vec::new();
    let mut day = 0;
    while day < 7 {
        if window.weekdays & (1 << day) == 0 {
            day += 1;
            continue;
        }
        let start = day;
        while day + 1 < 7 && window.weekdays & (1 << (day + 1)) != 0 {
            day += 1;
        }
        days.push(match day - start {
            0 => DAYS[start].to_owned(),
            1 => format!("{},{}", DAYS[start], DAYS[day]),
            _ => format!("{}-{}", DAYS[start], DAYS[day]),
        });
        day += 1;
    }
    let clock = |minute: u16| format!("{:02}:{:02}", minute / 60, minute % 60);
    let mut text = format!(
        "{} {}-{}",
        days.join(","),
        clock(window.start_minute),
        clock(window.end_minute)
    );
    if window.utc_offset_minutes != 0 {
        let sign = if window.utc_offset_minutes < 0 {
            '-'
        } else {
            '+'
        };
        text += &format!(
            " UTC{sign}{}",
            clock(window.utc_offset_minutes.unsigned_abs())
        );
    }
    text
}

/// Limits above which a provider takes no new work.
#[derive(Clone, Copy, Debug, Default)]
pub struct ThermalGuard {
    pub max_temperature_celsius: Option<u32>,
    pub max_power_watts: Option<f64>,
}

impl ThermalGuard {
    /// Why new work must wait, if a GPU is over a limit now (NVML; no GPU → never).
    pub fn over_limit(&self) -> Option<String> {
        if self.max_temperature_celsius.is_none() && self.max_power_watts.is_none() {
            return None;
        }
        let hardware = crate::hardware::detect();
        hardware.gpus.iter().find_map(|gpu| {
            if let (Some(limit), Some(t)) = (self.max_temperature_celsius, gpu.temperature_celsius)
            {
                if t > limit {
                    return Some(format!("GPU at {t} °C, above the {limit} °C limit"));
                }
            }
            if let (Some(limit), Some(w)) = (self.max_power_watts, gpu.power_watts) {
                if w > limit {
                    return Some(format!(
                        "GPU drawing {w:.0} W, above the {limit:.0} W limit"
                    ));
                }
            }
            None
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn windows_parse() {
        let w = parse_window("mon-fri 09:00-17:00 UTC+02:00").unwrap_or(AvailabilityWindow::ALWAYS);
        assert_eq!(w.weekdays, 0b001_1111);
        assert_eq!(
            (w.start_minute, w.end_minute, w.utc_offset_minutes),
            (540, 1020, 120)
        );
        let w = parse_window("sat,sun 00:00-24:00").unwrap_or(AvailabilityWindow::ALWAYS);
        assert_eq!(w.weekdays, 0b110_0000);
        let w = parse_window("fri-mon 22:00-06:00 -05:00").unwrap_or(AvailabilityWindow::ALWAYS);
        assert_eq!(w.weekdays, 0b111_0001);
        assert_eq!(w.utc_offset_minutes, -300);
        for bad in [
            "",
            "mon",
            "funday 09:00-10:00",
            "mon 25:00-26:00",
            "mon 09:00",
            "mon 09:00-10:00 +15:00",
            "mon 9-10",
        ] {
            assert!(parse_window(bad).is_err(), "{bad}");
        }
    }

    #[test]
    fn every_window_prints_as_text_that_reads_back_the_same() {
        for weekdays in 1..=0x7f_u8 {
            for (start_minute, end_minute, utc_offset_minutes) in [
                (0, 1440, 0),
                (540, 1020, 120),
                (1320, 360, -300),
                (5, 7, -840),
            ] {
                let window = AvailabilityWindow {
                    weekdays,
                    start_minute,
                    end_minute,
                    utc_offset_minutes,
                };
                let text = format_window(&window);
                assert_eq!(parse_window(&text), Ok(window), "{text}");
            }
        }
        let window =
            parse_window("mon-fri 09:00-17:00 UTC+02:00").unwrap_or(AvailabilityWindow::ALWAYS);
        assert_eq!(format_window(&window), "mon-fri 09:00-17:00 UTC+02:00");
    }
}
