//! Log set-up: human-readable or JSON lines on stderr (a testnet reads the JSON form).

use clap::ValueEnum;
use tracing_subscriber::EnvFilter;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, ValueEnum)]
pub enum LogFormat {
    #[default]
    Pretty,
    Json,
}

/// Installs the global subscriber. `RUST_LOG` overrides the default `info` level.
pub fn init(format: LogFormat) {
    let filter = EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| EnvFilter::new("info,libp2p_gossipsub=warn,libp2p_kad=warn"));
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr);
    // A second init (tests, in-process testnets) keeps the first subscriber.
    let _ = match format {
        LogFormat::Pretty => builder.compact().try_init(),
        LogFormat::Json => builder.json().flatten_event(true).try_init(),
    };
}
