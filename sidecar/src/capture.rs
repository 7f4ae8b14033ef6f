//! `reprise-sidecar iptables`: the nat rules that send an app's outbound TCP
//! to the transparent listener (`docs/src/concepts/transparent-capture.md`, "Capture").
//!
//! In the current network namespace it keeps a chain `REPRISE_OUTPUT`,
//! jumped to from `OUTPUT` for TCP, that returns for the proxy's uid, for
//! loopback and for the excluded CIDRs and ports, and redirects the rest (or
//! the included ports) to `--redirect-port`; for IPv6 too where the namespace
//! has it. [`rules`] computes the wanted rules and the commands that reach
//! them from what is installed (pure); [`iptables`] runs the binaries found
//! on PATH, whichever backend they drive. A second run changes nothing,
//! `--clean` removes exactly the jump and the chain, `--dry-run` prints the
//! rules of a fresh install and changes nothing.
//!
//! Exit codes: 0 done, 2 bad arguments, 1 an iptables command failed (the
//! command and its stderr are printed).

mod iptables;
mod rules;

use std::process::ExitCode;

use self::iptables::Tool;
use self::rules::{Family, Installed, Options, Raw};

/// Installs (or with `--clean` removes) the rules that redirect this network
/// namespace's outbound TCP to the sidecar's transparent listener.
#[derive(Debug, clap::Args)]
pub(crate) struct IptablesArgs {
    /// The transparent listener's port: captured connections go there.
    #[arg(long, value_name = "PORT")]
    redirect_port: u16,
    /// The sidecar's uid; its own connections are never captured.
    #[arg(long, value_name = "UID")]
    proxy_uid: u32,
    /// Capture only these destination ports (default: every TCP port).
    #[arg(long, value_name = "P,...", value_delimiter = ',')]
    include_ports: Vec<String>,
    /// Never capture these destination ports.
    #[arg(long, value_name = "P,...", value_delimiter = ',')]
    exclude_ports: Vec<String>,
    /// Never capture these destinations (IPv4 CIDRs go to iptables, IPv6 to
    /// ip6tables).
    #[arg(long, value_name = "C,...", value_delimiter = ',')]
    exclude_cidrs: Vec<String>,
    /// Print the rules of a fresh install (or the commands of --clean) and
    /// change nothing.
    #[arg(long)]
    dry_run: bool,
    /// Remove the jump and the chain, and nothing else.
    #[arg(long)]
    clean: bool,
    /// The iptables binary (a name on PATH or a path).
    #[arg(long, env = "REPRISE_IPTABLES", default_value = "iptables")]
    iptables: String,
    /// The ip6tables binary.
    #[arg(long, env = "REPRISE_IP6TABLES", default_value = "ip6tables")]
    ip6tables: String,
}

const WHO: &str = "reprise-sidecar iptables";

/// Runs the subcommand; the exit code says how it ended.
pub(crate) fn main(args: IptablesArgs) -> ExitCode {
    let opts = match Options::new(&Raw {
        redirect_port: args.redirect_port,
        proxy_uid: args.proxy_uid,
        include_ports: &args.include_ports,
        exclude_ports: &args.exclude_ports,
        exclude_cidrs: &args.exclude_cidrs,
    }) {
        Ok(o) => o,
        Err(e) => {
            eprintln!("{WHO}: {e}");
            return ExitCode::from(2);
        }
    };
    let ipv6 = iptables::has_ipv6();
    let mut tools = vec![Tool {
        program: args.iptables.clone(),
        family: Family::V4,
    }];
    if ipv6 {
        tools.push(Tool {
            program: args.ip6tables.clone(),
            family: Family::V6,
        });
    } else if let Some(c) = opts.exclude_cidrs.iter().find(|c| c.family() == Family::V6) {
        eprintln!(
            "{WHO}: this network namespace has no IPv6; IPv6 exclusions such as {c} need no rule"
        );
    }
    if args.dry_run {
        dry_run(&tools, &opts, args.clean, ipv6);
        return ExitCode::SUCCESS;
    }
    for tool in &tools {
        if let Err(e) = apply(tool, &opts, args.clean) {
            eprintln!("{WHO}: {e}");
            return ExitCode::FAILURE;
        }
    }
    ExitCode::SUCCESS
}

/// Rules on stdout, one command a line; notes on stderr, so the output can be
/// compared or pasted as it is.
fn dry_run(tools: &[Tool], opts: &Options, clean: bool, ipv6: bool) {
    eprintln!(
        "{WHO}: dry run, nothing changes; IPv6 {} in this network namespace",
        if ipv6 { "present" } else { "absent" }
    );
    for tool in tools {
        if let Ok(version) = tool.version() {
            eprintln!("{WHO}: {} is {version}", tool.program);
        }
        let fresh = Installed {
            chain_exists: true,
            chain: rules::chain(opts, tool.family),
            jumps: vec![rules::jump()],
        };
        let commands = if clean {
            rules::clean(&fresh)
        } else {
            rules::install(&Installed::default(), &fresh.chain)
        };
        for c in commands {
            println!("{}", tool.display(&c));
        }
    }
}

fn apply(tool: &Tool, opts: &Options, clean: bool) -> Result<(), crate::Error> {
    let version = tool.version()?;
    println!(
        "{WHO}: {} rules with {} ({version}, {} backend)",
        tool.family,
        tool.program,
        iptables::backend(&version)
    );
    if clean {
        let n = tool.clean()?;
        println!(
            "{WHO}: {}: {}",
            tool.family,
            if n == 0 {
                "nothing installed, nothing to remove"
            } else {
                "removed the jump and the chain"
            }
        );
    } else {
        let wanted = rules::chain(opts, tool.family);
        let n = tool.install(&wanted)?;
        println!(
            "{WHO}: {}: {} ({} rules in {})",
            tool.family,
            if n == 0 {
                "already in place, nothing changed"
            } else {
                "installed"
            },
            wanted.len(),
            rules::CHAIN
        );
    }
    Ok(())
}
