//! `reprise-controller`: reconciles RetryPolicy resources and pushes validated
//! configuration to sidecars.

use clap::{Parser, Subcommand};

/// Reprise controller.
#[derive(Debug, Parser)]
#[command(version, about)]
struct Args {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Print the RetryPolicy CustomResourceDefinition as YAML.
    Crd,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    match args.command {
        Command::Crd => print!("{}", reprise_controller::crd::crd_yaml()?),
    }
    Ok(())
}
