//! Progress bars for the long steps an operator waits on: fetching and checking a
//! model, loading its weights, measuring its speed. Drawn on stderr only when it is a
//! terminal (indicatif hides them otherwise, so logs and tests stay clean).

use indicatif::{ProgressBar, ProgressStyle};

fn styled(len: u64, message: &str, template: &str) -> ProgressBar {
    let bar = ProgressBar::new(len);
    bar.set_style(
        ProgressStyle::with_template(template)
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_message(message.to_owned());
    bar
}

/// A bar over `len` bytes, with speed and time left.
pub fn bytes(len: u64, message: &str) -> ProgressBar {
    styled(
        len,
        message,
        "{msg} [{bar:30}] {bytes}/{total_bytes} ({bytes_per_sec}, {eta})",
    )
}

/// A bar over `len` things (tokens, nodes, requests).
pub fn count(len: u64, message: &str) -> ProgressBar {
    styled(len, message, "{msg} [{bar:30}] {pos}/{len} ({elapsed})")
}
