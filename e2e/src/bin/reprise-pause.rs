//! The node's pause image (`reprise.local/pause:dev`, built by
//! `e2e/images.sh`): the process that holds a pod's namespaces. It does
//! nothing but wait, and exits 0 on SIGTERM or SIGINT.

fn main() -> std::io::Result<()> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_io()
        .build()?;
    rt.block_on(async {
        use tokio::signal::unix::{signal, SignalKind};
        let mut term = signal(SignalKind::terminate())?;
        let mut int = signal(SignalKind::interrupt())?;
        tokio::select! {
            _ = term.recv() => {}
            _ = int.recv() => {}
        }
        Ok(())
    })
}
