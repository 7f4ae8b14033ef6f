//! The command line: duration, rate, where the logs and the summary go.

use std::path::PathBuf;

use clap::Parser;

/// Mixed traffic through the real reprise-sidecar against faulty endpoints;
/// prints a summary and exits 1 when a check fails.
#[derive(Debug, Parser)]
#[command(name = "reprise-soak")]
pub(crate) struct Args {
    /// Length of the run in seconds.
    #[arg(long = "duration", value_name = "SECS", default_value_t = 600,
          value_parser = clap::value_parser!(u64).range(30..))]
    pub secs: u64,
    /// Requests per second.
    #[arg(long, value_name = "REQ_PER_S", default_value_t = 200,
          value_parser = clap::value_parser!(u64).range(1..=2_000))]
    pub rate: u64,
    /// Folder for the sidecar's logs (default: a new one under the temporary directory).
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Also write the summary to this file.
    #[arg(long, value_name = "FILE")]
    pub summary: Option<PathBuf>,
}

impl Args {
    /// The logs folder.
    pub fn out(&self) -> PathBuf {
        self.out.clone().unwrap_or_else(|| {
            std::env::temp_dir().join(format!("reprise-soak-{}", std::process::id()))
        })
    }
}
