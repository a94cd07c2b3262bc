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

/// A provider running modified code, for the testnet's adversary kit and the lab's
/// attack tests: each mode plays one attack on buyers, and the tests show what it gets.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Adversary {
    /// Goes silent (holding the stream open) after this many tokens.
    StallAfter(u64),
    /// Claims this many times the prompt's real size in its `Accept`.
    Overbill(u32),
    /// After this many tokens, numbers its chunks one further than it sent (claims a
    /// token it never delivered).
    SkipIndex(u64),
    /// After this many tokens, sends text its tokens do not spell (an injected ad).
    LieText(u64),
    /// Sends a well-formed model header that is not its model's (a vocabulary that
    /// counts in its favour).
    ForgeHeader,
    /// Holds a buyer's header request this many seconds before answering.
    SlowHeader(u64),
    /// Offers its model under the first catalog name it does not hold (a name
    /// hijack: its advert claims another model's name for its own file).
    HijackName,
    /// Besides its own advert, publishes this many adverts per refresh, each under a
    /// fresh key, offering its models at the lowest price (a sybil flood of the order
    /// book that would also draw every buyer's first attempts).
    FloodAdverts(u32),
    /// Serves noise tokens without running its model, with fingerprints that look
    /// greedy, under the model's honest name and profile (the engine's `Cheat`).
    Garbage,
    /// Runs its model with this many of the last layers dropped: cheaper, worse, under
    /// the honest name and profile.
    TruncateLayers(u32),
    /// Honest for this many jobs, then garbage (earns trust, then cheats).
    Camouflage(u32),
    /// Runs another GGUF file (a cheaper quantization, a fine-tune) under the served
    /// model's id, header and profile.
    Substitute(std::path::PathBuf),
    /// Honest on fresh jobs, garbage on resumed ones: a lazy verifier (it is paid to
    /// re-run windows of others' jobs and skips the work).
    LazyVerifier,
    /// Advertises and attests a GPU with this many MiB of VRAM that it does not have
    /// (a hardware claim that cannot hold the model it offers).
    ClaimGpu(u64),
    /// Reports log-probabilities that flatter its answer: every alternative but the best
    /// made 2 nats less likely than the model says (a buyer comparing providers by
    /// confidence would pick it).
    LieLogprobs,
    /// Claims to be full: answers every quote and job `OverCapacity` while its adverts
    /// offer a low price (to make buyers' requests wait, or fail, for capacity).
    FalselyFull,
    /// Signs its jobs' `Accept` and chunks with a throwaway key instead of its own (so
    /// receipts, and any fraud proof, would name an identity it can drop).
    AliasKey,
    /// Runs its model but draws each sampled token from its own random stream instead
    /// of the request's seed (the engine's `Cheat::ChooseTokens`): honest fingerprints,
    /// chosen text.
    ChooseTokens,
    /// Runs its model but never ends before `max_tokens`: where the sampler draws an end
    /// token it takes the best other one (the engine's `Cheat::NeverStop`).
    NeverStop,
    /// Names an execution profile no verifier runs in its `Accept` (its device with a
    /// trailing space), so an exact replay would not apply.
    ForeignProfile,
    /// Commits NaN logits in every fingerprint (NaN compares false in any tolerance).
    NanLogits,
    /// Holds each token this many milliseconds before sending it (a drip just inside
    /// the buyer's stall timeout, billing for as long as `max_tokens` allows).
    Drip(u64),
    /// Advertises and attests a GPU with this UUID (another provider's, read from its
    /// public adverts) to get that provider flagged as one GPU under two identities.
    UuidCopy(String),
}

impl std::str::FromStr for Adversary {
    type Err = String;

    fn from_str(mode: &str) -> Result<Self, Self::Err> {
        let (name, value) = mode.split_once(':').unwrap_or((mode, ""));
        let number = || {
            value
                .parse::<u64>()
                .map_err(|_| format!("adversary mode `{mode}` needs a whole number after `:`"))
        };
        match name {
            "stall-after" => Ok(Adversary::StallAfter(number()?)),
            "overbill" => {
                let factor = u32::try_from(number()?).map_err(|_| "overbill factor too large")?;
                Ok(Adversary::Overbill(factor))
            }
            "skip-index" => Ok(Adversary::SkipIndex(number()?)),
            "hijack-name" => Ok(Adversary::HijackName),
            "forge-header" => Ok(Adversary::ForgeHeader),
            "slow-header" => Ok(Adversary::SlowHeader(number()?)),
            "lie-text" => Ok(Adversary::LieText(number()?)),
            "garbage" => Ok(Adversary::Garbage),
            "lazy-verifier" => Ok(Adversary::LazyVerifier),
            "claim-gpu" => Ok(Adversary::ClaimGpu(number()?)),
            "lie-logprobs" => Ok(Adversary::LieLogprobs),
            "falsely-full" => Ok(Adversary::FalselyFull),
            "alias-key" => Ok(Adversary::AliasKey),
            "choose-tokens" => Ok(Adversary::ChooseTokens),
            "never-stop" => Ok(Adversary::NeverStop),
            "foreign-profile" => Ok(Adversary::ForeignProfile),
            "nan-logits" => Ok(Adversary::NanLogits),
            "drip" => Ok(Adversary::Drip(number()?)),
            "uuid-copy" if !value.is_empty() => Ok(Adversary::UuidCopy(value.into())),
            "truncate-layers" => {
                let count = u32::try_from(number()?).map_err(|_| "layer count too large")?;
                Ok(Adversary::TruncateLayers(count))
            }
            "substitute" if !value.is_empty() => Ok(Adversary::Substitute(value.into())),
            "camouflage" => {
                let jobs = u32::try_from(number()?).map_err(|_| "job count too large")?;
                Ok(Adversary::Camouflage(jobs))
            }
            "flood-adverts" => {
                let count = u32::try_from(number()?).map_err(|_| "flood count too large")?;
                Ok(Adversary::FloodAdverts(count))
            }
            _ => Err(format!(
                "unknown adversary mode `{mode}` (known: stall-after:N, overbill:K, skip-index:N, lie-text:N, hijack-name, flood-adverts:N, forge-header, slow-header:SECS, garbage, truncate-layers:N, camouflage:N, substitute:PATH, lazy-verifier, claim-gpu:MIB, lie-logprobs, falsely-full, alias-key, choose-tokens, never-stop, foreign-profile, nan-logits, drip:MS, uuid-copy:UUID)"
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn adversary_modes_parse_and_name_the_problem() {
        assert_eq!("stall-after:5".parse(), Ok(Adversary::StallAfter(5)));
        assert_eq!("overbill:1000".parse(), Ok(Adversary::Overbill(1000)));
        assert_eq!("skip-index:3".parse(), Ok(Adversary::SkipIndex(3)));
        assert_eq!("hijack-name".parse(), Ok(Adversary::HijackName));
        assert_eq!("lie-text:2".parse(), Ok(Adversary::LieText(2)));
        assert_eq!("flood-adverts:50".parse(), Ok(Adversary::FloodAdverts(50)));
        assert_eq!("garbage".parse(), Ok(Adversary::Garbage));
        assert_eq!("lazy-verifier".parse(), Ok(Adversary::LazyVerifier));
        assert_eq!("claim-gpu:64".parse(), Ok(Adversary::ClaimGpu(64)));
        assert_eq!("lie-logprobs".parse(), Ok(Adversary::LieLogprobs));
        assert_eq!("falsely-full".parse(), Ok(Adversary::FalselyFull));
        assert_eq!("alias-key".parse(), Ok(Adversary::AliasKey));
        assert_eq!("choose-tokens".parse(), Ok(Adversary::ChooseTokens));
        assert_eq!("never-stop".parse(), Ok(Adversary::NeverStop));
        assert_eq!("foreign-profile".parse(), Ok(Adversary::ForeignProfile));
        assert_eq!("nan-logits".parse(), Ok(Adversary::NanLogits));
        assert_eq!("drip:1500".parse(), Ok(Adversary::Drip(1500)));
        assert_eq!(
            "uuid-copy:GPU-1234".parse(),
            Ok(Adversary::UuidCopy("GPU-1234".into()))
        );
        assert!("uuid-copy".parse::<Adversary>().is_err());
        assert_eq!(
            "truncate-layers:2".parse(),
            Ok(Adversary::TruncateLayers(2))
        );
        assert_eq!("camouflage:5".parse(), Ok(Adversary::Camouflage(5)));
        assert_eq!(
            "substitute:/tmp/q8.gguf".parse(),
            Ok(Adversary::Substitute("/tmp/q8.gguf".into()))
        );
        assert!("substitute".parse::<Adversary>().is_err());
        let err = "overbill".parse::<Adversary>().unwrap_err();
        assert!(err.contains("whole number"), "{err}");
        let err = "steal:1".parse::<Adversary>().unwrap_err();
        assert!(err.contains("unknown adversary mode `steal:1`"), "{err}");
    }

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
