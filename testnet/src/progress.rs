//! What a researcher sees while a testnet starts or a scenario runs: on a terminal, a
//! bar per counted step (nodes started, adverts seen, requests done); elsewhere (logs,
//! CI) one line per step and per count that changed.

use std::io::IsTerminal;
use std::sync::Mutex;

use indicatif::{ProgressBar, ProgressStyle};

#[derive(Debug)]
pub struct Reporter {
    /// Bars on a terminal; plain lines otherwise; nothing when quiet.
    mode: Mode,
    bar: Mutex<Option<(String, ProgressBar)>>,
    /// Lines: the count last printed, per tenth of its total (a line per tenth, not one
    /// per request).
    printed: Mutex<Option<(String, u64)>>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    Bars,
    Lines,
    Quiet,
}

impl Reporter {
    /// Bars when stderr is a terminal, lines otherwise.
    pub fn stderr() -> Self {
        Self::with(if std::io::stderr().is_terminal() {
            Mode::Bars
        } else {
            Mode::Lines
        })
    }

    pub fn quiet() -> Self {
        Self::with(Mode::Quiet)
    }

    fn with(mode: Mode) -> Self {
        Self {
            mode,
            bar: Mutex::new(None),
            printed: Mutex::new(None),
        }
    }

    /// A step with nothing to count begins (ends any bar).
    pub fn step(&self, message: &str) {
        self.finish();
        if self.mode != Mode::Quiet {
            eprintln!("  … {message}");
        }
    }

    /// `done` of `total` of `what` (a new `what` starts a new bar).
    pub fn count(&self, what: &str, done: u64, total: u64) {
        match self.mode {
            Mode::Quiet => {}
            Mode::Lines => {
                let tenth = (done * 10).checked_div(total).unwrap_or(10);
                let Ok(mut printed) = self.printed.lock() else {
                    return;
                };
                let fresh = printed
                    .as_ref()
                    .is_none_or(|(name, last)| name != what || *last != tenth);
                if fresh {
                    eprintln!("  … {what} {done}/{total}");
                    *printed = Some((what.to_owned(), tenth));
                }
            }
            Mode::Bars => {
                let Ok(mut current) = self.bar.lock() else {
                    return;
                };
                if current.as_ref().is_none_or(|(name, _)| name != what) {
                    if let Some((_, old)) = current.take() {
                        old.finish();
                    }
                    let bar = ProgressBar::new(total);
                    bar.set_style(
                        ProgressStyle::with_template("  {msg} [{bar:30}] {pos}/{len} ({elapsed})")
                            .unwrap_or_else(|_| ProgressStyle::default_bar())
                            .progress_chars("=> "),
                    );
                    bar.set_message(what.to_owned());
                    *current = Some((what.to_owned(), bar));
                }
                if let Some((_, bar)) = current.as_ref() {
                    bar.set_length(total);
                    bar.set_position(done);
                }
            }
        }
    }

    /// Leaves the current bar drawn as it ended.
    pub fn finish(&self) {
        if let Ok(mut current) = self.bar.lock() {
            if let Some((_, bar)) = current.take() {
                bar.finish();
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn lines_come_once_per_tenth_and_again_for_a_new_count() {
        let reporter = Reporter::with(Mode::Lines);
        let mut lines = 0;
        for done in 0..=100 {
            let before = reporter.printed.lock().map(|p| p.clone()).ok().flatten();
            reporter.count("requests done", done, 100);
            let after = reporter.printed.lock().map(|p| p.clone()).ok().flatten();
            lines += usize::from(before != after);
        }
        assert_eq!(lines, 11, "0/100, 10/100 … 100/100");
        let before = reporter.printed.lock().map(|p| p.clone()).ok().flatten();
        reporter.count("adverts", 0, 4);
        assert_ne!(
            before,
            reporter.printed.lock().map(|p| p.clone()).ok().flatten()
        );
    }
}
