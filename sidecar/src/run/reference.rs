//! The user guide's flag reference for `reprise-sidecar`, rendered from its
//! clap command and compared with the committed page (`REPRISE_BLESS=1`
//! rewrites it), so a renamed or new flag cannot leave the guide behind.

use clap::CommandFactory;
use reprise_testkit::docs::{check_generated, clap_reference, header};

const TEST: &str = "cargo test -p reprise-sidecar --lib run::reference";

#[test]
fn flags_page_matches_the_command() {
    let mut page = header(
        "the clap command of reprise-sidecar (sidecar/src/run.rs)",
        TEST,
    );
    page.push_str("# reprise-sidecar flags\n\n");
    page.push_str(
        "Every flag of the sidecar binary and of its `iptables` subcommand, as `--help` prints \
         them. What the listeners serve: [Standalone gateway mode](../tasks/standalone.md); \
         the variables it reads: [Environment variables](environment.md).\n\n",
    );
    page.push_str(&clap_reference(
        "reprise-sidecar",
        &super::Args::command(),
        2,
    ));
    check_generated("docs/src/reference/cli-sidecar.md", &page, TEST);
}
