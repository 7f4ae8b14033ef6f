//! `reprise-sidecar`: the retry proxy, standalone from a file or fed by the
//! controller (see `run.rs`).

/// jemalloc rather than glibc's malloc, as linkerd2-proxy does: an h2c
/// request calls malloc many times, and jemalloc serves them with less CPU
/// (HTTP/1 unchanged) for a little more RSS. mimalloc was faster still but
/// doubled idle RSS. Figures:
/// e2e/bench/results/2026-12-04-issue18-allocator.md.
#[cfg(target_os = "linux")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    reprise_sidecar::run::main()
}
