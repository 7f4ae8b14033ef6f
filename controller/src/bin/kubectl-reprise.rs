//! `kubectl-reprise`: Reprise's kubectl plugin (`kubectl reprise ...` once
//! on PATH). Parses the command line and hands over to the library.

use std::process::ExitCode;

use clap::Parser;
use reprise_controller::cli::plugin::{self, Args};

#[tokio::main]
async fn main() -> ExitCode {
    match plugin::run(Args::parse()).await {
        Ok(true) => ExitCode::SUCCESS,
        Ok(false) => ExitCode::FAILURE,
        // One line, as kubectl reports errors: the message carries its cause.
        Err(e) => {
            eprintln!("error: {}", plugin::error_line(&e));
            ExitCode::FAILURE
        }
    }
}
