//! Running the `iptables` and `ip6tables` binaries: which backend they drive,
//! what the nat table holds, and each change, echoed as it is made.

use std::process::Command;

use super::rules::{self, Family, Installed, Rule};
use crate::Error;

/// How long a command waits for the xtables lock (legacy backend; another
/// iptables in any namespace of the machine holds the same lock file).
const LOCK_WAIT_SECONDS: &str = "5";

/// One binary and the family it serves.
#[derive(Clone, Debug)]
pub(crate) struct Tool {
    /// The program, as given (a name found on PATH, or a path).
    pub(crate) program: String,
    pub(crate) family: Family,
}

/// The backend named in `iptables --version` output: `nf_tables` or
/// `legacy` (versions before 1.8 name none and are legacy).
pub(crate) fn backend(version: &str) -> &str {
    match version.rsplit_once('(') {
        Some((_, rest)) => rest.trim().trim_end_matches(')'),
        None => "legacy",
    }
}

impl Tool {
    /// `program ARGS` as one line, for logs and errors.
    pub(crate) fn display(&self, args: &[String]) -> String {
        let mut line = self.program.clone();
        for a in args {
            line.push(' ');
            line.push_str(a);
        }
        line
    }

    fn output(&self, args: &[String]) -> Result<String, Error> {
        let failed = |status: String, stderr: String| Error::Iptables {
            command: self.display(args),
            status,
            stderr,
        };
        let out = Command::new(&self.program)
            .args(args)
            .output()
            .map_err(|e| failed("could not start".into(), e.to_string()))?;
        if !out.status.success() {
            return Err(failed(
                out.status.to_string(),
                String::from_utf8_lossy(&out.stderr).trim().to_string(),
            ));
        }
        Ok(String::from_utf8_lossy(&out.stdout).into_owned())
    }

    /// A table command, with the lock wait added.
    fn run(&self, args: &[String]) -> Result<String, Error> {
        let mut full = vec!["-w".to_string(), LOCK_WAIT_SECONDS.to_string()];
        full.extend(args.iter().cloned());
        self.output(&full)
    }

    /// The first line of `--version`, e.g. `iptables v1.8.9 (nf_tables)`.
    pub(crate) fn version(&self) -> Result<String, Error> {
        let out = self.output(&["--version".to_string()])?;
        Ok(out.lines().next().unwrap_or_default().trim().to_string())
    }

    /// What the nat table holds of ours.
    pub(crate) fn installed(&self) -> Result<Installed, Error> {
        let listing = self.run(&["-t".into(), "nat".into(), "-S".into()])?;
        Ok(Installed::parse(&listing))
    }

    /// Runs `commands` in order, echoing each to stdout first.
    pub(crate) fn apply(&self, commands: &[rules::Command]) -> Result<(), Error> {
        for c in commands {
            println!("+ {}", self.display(c));
            self.run(c)?;
        }
        Ok(())
    }

    /// Makes the nat table hold exactly `wanted` in the chain and one jump to
    /// it; returns how many commands that took (0: already in place).
    pub(crate) fn install(&self, wanted: &[Rule]) -> Result<usize, Error> {
        let commands = rules::install(&self.installed()?, wanted);
        self.apply(&commands)?;
        Ok(commands.len())
    }

    /// Removes the jump and the chain; returns how many commands that took.
    pub(crate) fn clean(&self) -> Result<usize, Error> {
        let commands = rules::clean(&self.installed()?);
        self.apply(&commands)?;
        Ok(commands.len())
    }
}

/// Whether this network namespace has IPv6: any address at all, `::1`
/// included, in `/proc/net/if_inet6` (per namespace; absent when the kernel
/// has no IPv6, empty when it is disabled everywhere).
pub(crate) fn has_ipv6() -> bool {
    std::fs::read_to_string("/proc/net/if_inet6").is_ok_and(|s| !s.trim().is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_from_version_line() {
        let cases = [
            ("iptables v1.8.9 (nf_tables)", "nf_tables"),
            ("ip6tables v1.8.9 (legacy)", "legacy"),
            ("iptables v1.6.1", "legacy"),
        ];
        for (line, want) in cases {
            assert_eq!(backend(line), want, "{line}");
        }
    }

    #[test]
    fn a_missing_binary_is_an_error_naming_the_command() {
        let tool = Tool {
            program: "/nonexistent/iptables".into(),
            family: Family::V4,
        };
        let e = tool.installed().expect_err("no such binary").to_string();
        assert!(
            e.starts_with("`/nonexistent/iptables -w 5 -t nat -S` failed (could not start): "),
            "{e}"
        );
    }
}
