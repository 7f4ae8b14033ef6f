//! `reprise-sidecar`: the retry proxy, standalone from a file or fed by the
//! controller (see `run.rs`).

fn main() -> std::process::ExitCode {
    reprise_sidecar::run::main()
}
