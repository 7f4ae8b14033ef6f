//! `reprise-sidecar`: the retry proxy, standalone from a file or fed by the
//! controller (see `run.rs`).

/// jemalloc rather than glibc's malloc, as linkerd2-proxy does: an h2c
/// request calls malloc about 10 times, and jemalloc takes 5% off its CPU
/// (6.9 against 7.3 µs pinned; HTTP/1 unchanged) for 0.5-1.7 MiB more RSS
/// (7.8-8.5 MiB idle, 16.3-16.9 with 1,000 connections). mimalloc was faster
/// still but doubled idle RSS. Figures:
/// e2e/bench/results/2026-12-04-issue18-allocator.md.
#[cfg(target_os = "linux")]
#[global_allocator]
static ALLOCATOR: tikv_jemallocator::Jemalloc = tikv_jemallocator::Jemalloc;

fn main() -> std::process::ExitCode {
    reprise_sidecar::run::main()
}
