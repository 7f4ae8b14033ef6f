//! The soak test driver (`e2e/soak/run.sh`); the soak itself is
//! `reprise_e2e::soak` (e2e/src/soak.rs and e2e/src/soak/).

fn main() -> std::process::ExitCode {
    reprise_e2e::soak::main()
}
