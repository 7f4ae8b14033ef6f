//! `reprise-controller`: reconciles RetryPolicy resources and pushes validated
//! configuration to sidecars. This is a skeleton; the controller is built in
//! its own issue.

fn main() -> anyhow::Result<()> {
    anyhow::bail!("reprise-controller is not implemented yet; run reprise-sidecar --config FILE for the standalone proxy")
}
