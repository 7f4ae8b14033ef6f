//! The rules `reprise-sidecar iptables` wants, as a pure function of its
//! options, and the commands that turn what a table holds into them.
//!
//! A rule is the argument list after `-A CHAIN`, spelled exactly as
//! `iptables -S` prints it back (`-p tcp -m tcp --dport 53`, not `-p tcp
//! --dport 53`; CIDRs with their host bits cleared), so comparing what is
//! installed with what is wanted is a comparison of strings, the same for the
//! nf_tables and legacy backends (checked in `tests/transparent`).

use std::fmt;
use std::net::IpAddr;

use crate::Error;

/// The chain the rules live in.
pub(crate) const CHAIN: &str = "REPRISE_OUTPUT";
/// The built-in chain that jumps to [`CHAIN`].
pub(crate) const OUTPUT: &str = "OUTPUT";
/// `-m multiport` takes at most 15 ports per rule.
pub(crate) const MULTIPORT_MAX: usize = 15;

/// An address family, and so which binary (`iptables`, `ip6tables`) its
/// rules go to.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Family {
    /// IPv4: `iptables`.
    V4,
    /// IPv6: `ip6tables`.
    V6,
}

impl Family {
    fn of(ip: IpAddr) -> Family {
        match ip {
            IpAddr::V4(_) => Family::V4,
            IpAddr::V6(_) => Family::V6,
        }
    }

    /// The loopback range, as `iptables -S` prints it.
    fn loopback(self) -> &'static str {
        match self {
            Family::V4 => "127.0.0.0/8",
            Family::V6 => "::1/128",
        }
    }
}

impl fmt::Display for Family {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Family::V4 => "IPv4",
            Family::V6 => "IPv6",
        })
    }
}

/// A CIDR with its host bits cleared (iptables clears them too, and prints
/// the cleared form back).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Cidr {
    addr: IpAddr,
    prefix: u8,
}

impl Cidr {
    /// `ADDRESS/PREFIX`, or a bare address (one host: /32 or /128).
    pub(crate) fn parse(text: &str) -> Result<Cidr, String> {
        let (addr, prefix) = match text.split_once('/') {
            Some((a, p)) => (a, Some(p)),
            None => (text, None),
        };
        let addr: IpAddr = addr
            .parse()
            .map_err(|_| format!("{text:?} is not an IPv4 or IPv6 CIDR (ADDRESS/PREFIX)"))?;
        let max = if addr.is_ipv4() { 32 } else { 128 };
        let prefix = match prefix {
            None => max,
            Some(p) => p
                .parse::<u8>()
                .ok()
                .filter(|p| *p <= max)
                .ok_or_else(|| format!("{text:?}: the prefix must be a number in 0..={max}"))?,
        };
        let addr = match addr {
            IpAddr::V4(a) => {
                let mask = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
                IpAddr::V4((u32::from(a) & mask).into())
            }
            IpAddr::V6(a) => {
                let mask = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
                IpAddr::V6((u128::from(a) & mask).into())
            }
        };
        Ok(Cidr { addr, prefix })
    }

    pub(crate) fn family(&self) -> Family {
        Family::of(self.addr)
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.addr, self.prefix)
    }
}

/// What to capture, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Options {
    /// Where redirected connections go (the transparent listener's port).
    pub(crate) redirect_port: u16,
    /// The sidecar's uid: its own connections are never captured.
    pub(crate) proxy_uid: u32,
    /// Only these destination ports are captured; empty: every TCP port.
    pub(crate) include_ports: Vec<u16>,
    /// Destination ports never captured.
    pub(crate) exclude_ports: Vec<u16>,
    /// Destinations never captured.
    pub(crate) exclude_cidrs: Vec<Cidr>,
}

/// Flag values as given, before validation.
#[derive(Clone, Debug, Default)]
pub(crate) struct Raw<'a> {
    pub(crate) redirect_port: u16,
    pub(crate) proxy_uid: u32,
    pub(crate) include_ports: &'a [String],
    pub(crate) exclude_ports: &'a [String],
    pub(crate) exclude_cidrs: &'a [String],
}

fn flag(flag: &'static str, rule: impl Into<String>) -> Error {
    Error::Flag {
        flag,
        rule: rule.into(),
    }
}

/// Ports from a list flag: sorted, duplicates dropped, empty entries skipped
/// (so a generated `--exclude-ports=` means none).
fn ports(name: &'static str, values: &[String]) -> Result<Vec<u16>, Error> {
    let mut out = Vec::new();
    for v in values.iter().map(|v| v.trim()).filter(|v| !v.is_empty()) {
        match v.parse::<u16>() {
            Ok(p) if p > 0 => out.push(p),
            _ => {
                return Err(flag(
                    name,
                    format!("{v:?} is not a port: must be a number in 1..=65535"),
                ))
            }
        }
    }
    out.sort_unstable();
    out.dedup();
    Ok(out)
}

impl Options {
    /// Validates the flags; the error names the flag and the rule it breaks.
    pub(crate) fn new(raw: &Raw<'_>) -> Result<Options, Error> {
        if raw.redirect_port == 0 {
            return Err(flag("--redirect-port", "must be in 1..=65535 (got 0)"));
        }
        if raw.proxy_uid == 0 {
            return Err(flag(
                "--proxy-uid",
                "must not be 0: every process running as root would bypass the capture",
            ));
        }
        let include_ports = ports("--include-ports", raw.include_ports)?;
        let exclude_ports = ports("--exclude-ports", raw.exclude_ports)?;
        if exclude_ports.contains(&raw.redirect_port) {
            // Connections to the listener itself go over loopback, which is
            // never captured; excluding its port as a destination elsewhere
            // is almost certainly a mix-up of the two flags.
            return Err(flag(
                "--exclude-ports",
                format!(
                    "{} is the --redirect-port; loopback (where the listener is) is never captured",
                    raw.redirect_port
                ),
            ));
        }
        if let Some(p) = include_ports.iter().find(|p| exclude_ports.contains(p)) {
            return Err(flag(
                "--exclude-ports",
                format!("{p} is also in --include-ports; a port is either included or excluded"),
            ));
        }
        let mut exclude_cidrs = Vec::new();
        for v in raw
            .exclude_cidrs
            .iter()
            .map(|v| v.trim())
            .filter(|v| !v.is_empty())
        {
            exclude_cidrs.push(Cidr::parse(v).map_err(|rule| flag("--exclude-cidrs", rule))?);
        }
        exclude_cidrs.sort_unstable();
        exclude_cidrs.dedup();
        Ok(Options {
            redirect_port: raw.redirect_port,
            proxy_uid: raw.proxy_uid,
            include_ports,
            exclude_ports,
            exclude_cidrs,
        })
    }
}

/// One rule: the arguments after `-A CHAIN`.
pub(crate) type Rule = Vec<String>;

fn rule(parts: &[&str]) -> Rule {
    parts.iter().map(|s| (*s).to_string()).collect()
}

/// The rules of [`CHAIN`] for `family`, in order: every `RETURN` before any
/// `REDIRECT`.
pub(crate) fn chain(opts: &Options, family: Family) -> Vec<Rule> {
    let uid = opts.proxy_uid.to_string();
    let to = opts.redirect_port.to_string();
    // The sidecar's own connections first: without this its upstream
    // connections would come straight back to it (a loop).
    let mut rules = vec![
        rule(&["-m", "owner", "--uid-owner", &uid, "-j", "RETURN"]),
        // Everything routed over lo: loopback and the pod's own addresses.
        rule(&["-o", "lo", "-j", "RETURN"]),
        // The same for loopback by address, so the rule list says it plainly.
        rule(&["-d", family.loopback(), "-j", "RETURN"]),
    ];
    for cidr in opts.exclude_cidrs.iter().filter(|c| c.family() == family) {
        rules.push(rule(&["-d", &cidr.to_string(), "-j", "RETURN"]));
    }
    for port in &opts.exclude_ports {
        rules.push(rule(&[
            "-p",
            "tcp",
            "-m",
            "tcp",
            "--dport",
            &port.to_string(),
            "-j",
            "RETURN",
        ]));
    }
    if opts.include_ports.is_empty() {
        rules.push(rule(&["-p", "tcp", "-j", "REDIRECT", "--to-ports", &to]));
    } else {
        for chunk in opts.include_ports.chunks(MULTIPORT_MAX) {
            let list = chunk
                .iter()
                .map(u16::to_string)
                .collect::<Vec<_>>()
                .join(",");
            rules.push(rule(&[
                "-p",
                "tcp",
                "-m",
                "multiport",
                "--dports",
                &list,
                "-j",
                "REDIRECT",
                "--to-ports",
                &to,
            ]));
        }
    }
    rules
}

/// The rule in `OUTPUT` that sends TCP to [`CHAIN`].
pub(crate) fn jump() -> Rule {
    rule(&["-p", "tcp", "-j", CHAIN])
}

/// One command's arguments after the binary (`-t nat ...`).
pub(crate) type Command = Vec<String>;

fn command(op: &str, chain_name: &str, args: &[String]) -> Command {
    let mut c = rule(&["-t", "nat", op, chain_name]);
    c.extend(args.iter().cloned());
    c
}

/// What the nat table holds of ours, read from `iptables -t nat -S`.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Installed {
    /// Whether [`CHAIN`] exists.
    pub(crate) chain_exists: bool,
    /// Its rules, in order.
    pub(crate) chain: Vec<Rule>,
    /// Rules in `OUTPUT` that jump to it.
    pub(crate) jumps: Vec<Rule>,
}

impl Installed {
    /// Parses the output of `iptables -t nat -S`. Only our chain and jumps to
    /// it are kept; other rules are no business of ours.
    pub(crate) fn parse(listing: &str) -> Installed {
        let mut installed = Installed::default();
        for line in listing.lines() {
            let words: Vec<&str> = line.split_whitespace().collect();
            match words.as_slice() {
                ["-N", name] if *name == CHAIN => installed.chain_exists = true,
                ["-A", name, rest @ ..] if *name == CHAIN => {
                    installed.chain.push(rule(rest));
                }
                ["-A", name, rest @ ..] if *name == OUTPUT && rest.ends_with(&["-j", CHAIN]) => {
                    installed.jumps.push(rule(rest));
                }
                _ => {}
            }
        }
        installed
    }
}

/// The commands that turn `installed` into exactly `wanted` and one jump:
/// nothing when they already agree. A chain that differs in any way is
/// flushed and refilled (so options changed since the last run leave exactly
/// the new rules); the chain is complete before the jump to it is added.
pub(crate) fn install(installed: &Installed, wanted: &[Rule]) -> Vec<Command> {
    let mut out = Vec::new();
    if !installed.chain_exists {
        out.push(command("-N", CHAIN, &[]));
    }
    if installed.chain != wanted {
        if !installed.chain.is_empty() {
            out.push(command("-F", CHAIN, &[]));
        }
        out.extend(wanted.iter().map(|r| command("-A", CHAIN, r)));
    }
    let jump = jump();
    let mut kept = false;
    for j in &installed.jumps {
        if *j == jump && !kept {
            kept = true;
        } else {
            // A duplicate, or a jump of another shape (an older version's):
            // exactly one jump is wanted.
            out.push(command("-D", OUTPUT, j));
        }
    }
    if !kept {
        out.push(command("-A", OUTPUT, &jump));
    }
    out
}

/// The commands that remove what [`install`] adds, and nothing else: every
/// jump to [`CHAIN`], then the chain. Nothing when nothing is installed.
pub(crate) fn clean(installed: &Installed) -> Vec<Command> {
    let mut out: Vec<Command> = installed
        .jumps
        .iter()
        .map(|j| command("-D", OUTPUT, j))
        .collect();
    if installed.chain_exists {
        out.push(command("-F", CHAIN, &[]));
        out.push(command("-X", CHAIN, &[]));
    }
    out
}

#[cfg(test)]
mod tests;
