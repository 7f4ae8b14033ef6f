//! `kubectl-reprise`: Reprise's kubectl plugin (`kubectl reprise ...` once
//! on PATH). Parses the command line and hands over to the library.

use std::process::ExitCode;

use clap::Parser;
use reprise_controller::cli::plugin::{self, Args};

#[tokio::main]
async fn main() -> anyhow::Result<ExitCode> {
    Ok(if plugin::run(Args::parse()).await? {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    })
}
