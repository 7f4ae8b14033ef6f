//! Per-pod annotations that replace one value of the injection config
//! each, and those that turn on and shape transparent capture.

use std::collections::BTreeMap;
use std::net::IpAddr;

use k8s_openapi::api::core::v1::ResourceRequirements;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;

use super::config::{self, InjectionConfig, LOG_LEVELS};
use reprise_crds::policy::DeadlinePolicy;

use super::{
    CPU_LIMIT, CPU_REQUEST, DEADLINE_ACCEPT_INCOMING, DEADLINE_PROPAGATE, DIAGNOSTICS_RETAINED,
    EXCLUDE_OUTBOUND_CIDRS, EXCLUDE_OUTBOUND_PORTS, IMAGE, INCLUDE_OUTBOUND_PORTS, LOG_LEVEL,
    MEMORY_LIMIT, MEMORY_REQUEST, TRANSPARENT,
};

/// The sidecar's deadline switches: each from the pod's annotation, else
/// its namespace's (`namespace`, named `ns` in errors), else on. A value
/// other than `"true"` or `"false"` refuses the pod, naming where it is.
pub(super) fn deadline_switches(
    pod: &BTreeMap<String, String>,
    namespace: &BTreeMap<String, String>,
    ns: &str,
) -> Result<DeadlinePolicy, String> {
    let switch = |key: &str| -> Result<bool, String> {
        let (value, on) = match (pod.get(key), namespace.get(key)) {
            (Some(v), _) => (v, format!("annotation {key}")),
            (None, Some(v)) => (v, format!("namespace {ns}'s annotation {key}")),
            (None, None) => return Ok(true),
        };
        match value.trim() {
            "true" => Ok(true),
            "false" => Ok(false),
            other => Err(format!("{on}: {other:?} is not \"true\" or \"false\"")),
        }
    };
    Ok(DeadlinePolicy {
        propagate: switch(DEADLINE_PROPAGATE)?,
        accept_incoming: switch(DEADLINE_ACCEPT_INCOMING)?,
    })
}

/// Per-pod values that replace the injection config's.
#[derive(Debug)]
pub(super) struct Overrides {
    pub(super) image: String,
    pub(super) log_level: String,
    pub(super) diagnostics_retained: usize,
    pub(super) resources: Option<ResourceRequirements>,
}

impl Overrides {
    /// The overrides `annotations` ask for, or why one of them is invalid
    /// (naming the annotation).
    pub(super) fn from_annotations(
        annotations: &BTreeMap<String, String>,
        config: &InjectionConfig,
    ) -> Result<Overrides, String> {
        let mut resources = config.resources.clone();
        for (key, limit, resource) in [
            (CPU_REQUEST, false, "cpu"),
            (MEMORY_REQUEST, false, "memory"),
            (CPU_LIMIT, true, "cpu"),
            (MEMORY_LIMIT, true, "memory"),
        ] {
            let Some(value) = annotations.get(key) else {
                continue;
            };
            if !is_quantity(value) {
                return Err(format!(
                    "annotation {key}: {value:?} is not a Kubernetes quantity (e.g. 100m, 64Mi)"
                ));
            }
            let r = resources.get_or_insert_with(Default::default);
            let map = if limit {
                &mut r.limits
            } else {
                &mut r.requests
            };
            map.get_or_insert_with(BTreeMap::new)
                .insert(resource.into(), Quantity(value.clone()));
        }
        let log_level = match annotations.get(LOG_LEVEL) {
            Some(l) if LOG_LEVELS.contains(&l.as_str()) => l.clone(),
            Some(l) => {
                return Err(format!(
                    "annotation {LOG_LEVEL}: {l:?} is not one of {}",
                    LOG_LEVELS.join(", ")
                ))
            }
            None => config.log_level.clone(),
        };
        let diagnostics_retained = match annotations.get(DIAGNOSTICS_RETAINED) {
            Some(v) => v
                .trim()
                .parse::<usize>()
                .map_err(|_| "not a whole number".to_string())
                .and_then(config::diagnostics_retained)
                .map_err(|rule| {
                    format!(
                        "annotation {DIAGNOSTICS_RETAINED}: {v:?}: {rule} (0 turns diagnostics off; at most {})",
                        reprise_crds::file::MAX_DIAGNOSTICS_RETAINED
                    )
                })?,
            None => config.diagnostics_retained,
        };
        let image = match annotations.get(IMAGE) {
            Some(i) if !i.trim().is_empty() => i.clone(),
            Some(_) => return Err(format!("annotation {IMAGE}: must not be empty")),
            None => config.image.clone(),
        };
        Ok(Overrides {
            image,
            log_level,
            diagnostics_retained,
            resources,
        })
    }
}

/// What a transparent pod's `reprise-init` is told: the ports it redirects
/// (empty: all) and what it leaves alone; no port is both.
#[derive(Debug, Clone, PartialEq)]
pub(super) struct Capture {
    pub(super) include_ports: Vec<u16>,
    pub(super) exclude_ports: Vec<u16>,
    pub(super) exclude_cidrs: Vec<String>,
}

impl Capture {
    /// The capture `annotations` ask for, `None` for a pod that is not
    /// transparent, or why an annotation is invalid (naming it).
    /// `by_default`: the pod's namespace opted in, so only
    /// `reprise.dev/transparent: "false"` opts it out. The config's
    /// exclusions and the `api_server` addresses are always excluded, the
    /// annotations' added to them.
    pub(super) fn from_annotations(
        annotations: &BTreeMap<String, String>,
        config: &InjectionConfig,
        by_default: bool,
        api_server: &[IpAddr],
    ) -> Result<Option<Capture>, String> {
        let on = match annotations.get(TRANSPARENT).map(String::as_str) {
            None => by_default,
            Some("true") => true,
            Some("false") => false,
            Some(other) => {
                return Err(format!(
                    "annotation {TRANSPARENT}: {other:?} is not \"true\" or \"false\""
                ))
            }
        };
        // Checked even when off, so a typo shows before transparency is turned on.
        let ports = |key| {
            annotations
                .get(key)
                .map(|v| parse_ports(key, v))
                .transpose()
        };
        let include = ports(INCLUDE_OUTBOUND_PORTS)?;
        let exclude = ports(EXCLUDE_OUTBOUND_PORTS)?;
        let cidrs = annotations
            .get(EXCLUDE_OUTBOUND_CIDRS)
            .map(|v| parse_cidrs(EXCLUDE_OUTBOUND_CIDRS, v))
            .transpose()?;
        // reprise-init refuses it (`reprise-sidecar iptables` exits 2), so
        // the pod would never start: refuse it here, naming the annotation.
        if exclude.iter().flatten().any(|p| *p == config.redirect_port) {
            return Err(format!(
                "annotation {EXCLUDE_OUTBOUND_PORTS}: {} is the sidecar's redirect port (redirectPort); connections to it stay on loopback, which is never captured",
                config.redirect_port
            ));
        }
        if !on {
            return Ok(None);
        }
        let t = &config.transparent;
        let mut exclude_cidrs: Vec<String> = api_server.iter().map(|ip| host_cidr(*ip)).collect();
        for c in &t.exclude_outbound_cidrs {
            exclude_cidrs.push(parse_cidr(c)?);
        }
        exclude_cidrs.extend(cidrs.unwrap_or_default());
        let exclude = exclude.unwrap_or_default();
        let mut exclude_ports = t.exclude_outbound_ports.clone();
        exclude_ports.extend(exclude);
        let include = include.unwrap_or_default();
        if let Some(p) = include.iter().find(|p| exclude_ports.contains(p)) {
            return Err(format!(
                "annotation {INCLUDE_OUTBOUND_PORTS}: {p} is also excluded ({EXCLUDE_OUTBOUND_PORTS} or the injection config's transparent.excludeOutboundPorts); a port is either included or excluded"
            ));
        }
        Ok(Some(Capture {
            include_ports: dedup(include),
            exclude_ports: dedup(exclude_ports),
            exclude_cidrs: dedup(exclude_cidrs),
        }))
    }
}

/// `items` without repeats, in their first order.
fn dedup<T: PartialEq>(items: Vec<T>) -> Vec<T> {
    let mut out = Vec::with_capacity(items.len());
    for i in items {
        if !out.contains(&i) {
            out.push(i);
        }
    }
    out
}

/// `ip` as the CIDR of that one address.
pub(super) fn host_cidr(ip: IpAddr) -> String {
    match ip {
        IpAddr::V4(_) => format!("{ip}/32"),
        IpAddr::V6(_) => format!("{ip}/128"),
    }
}

/// The comma-separated port list `value` of annotation `key`.
fn parse_ports(key: &str, value: &str) -> Result<Vec<u16>, String> {
    let items = list(key, value, "ports")?;
    items
        .iter()
        .map(|p| match p.parse::<u16>() {
            Ok(n) if n > 0 => Ok(n),
            _ => Err(format!(
                "annotation {key}: {p:?} is not a port number (1-65535); expected a comma-separated list such as 5432,6379"
            )),
        })
        .collect()
}

/// The comma-separated CIDR list `value` of annotation `key`, normalised.
fn parse_cidrs(key: &str, value: &str) -> Result<Vec<String>, String> {
    list(key, value, "CIDRs")?
        .iter()
        .map(|c| parse_cidr(c).map_err(|e| format!("annotation {key}: {e}")))
        .collect()
}

/// The non-empty items of a comma-separated list.
fn list<'a>(key: &str, value: &'a str, what: &str) -> Result<Vec<&'a str>, String> {
    let items: Vec<&str> = value.split(',').map(str::trim).collect();
    if items.iter().any(|i| i.is_empty()) {
        return Err(format!(
            "annotation {key}: {value:?} has an empty item; expected comma-separated {what}"
        ));
    }
    Ok(items)
}

/// An IPv4 or IPv6 CIDR (`10.0.0.0/8`, `fd00::/8`) or a single address
/// (which becomes `/32` or `/128`), normalised to `address/length`.
pub(super) fn parse_cidr(s: &str) -> Result<String, String> {
    let bad = || format!("{s:?} is not an IP address or CIDR (e.g. 10.0.0.0/8, fd00::/8)");
    let (addr, len) = match s.split_once('/') {
        Some((a, l)) => (a, Some(l)),
        None => (s, None),
    };
    let ip: IpAddr = addr.parse().map_err(|_| bad())?;
    let max = if ip.is_ipv4() { 32 } else { 128 };
    match len {
        None => Ok(host_cidr(ip)),
        Some(l) => match l.parse::<u8>() {
            // No sign, no leading zeros: the text iptables is given is what was checked.
            Ok(n) if n <= max && l == n.to_string() => Ok(format!("{ip}/{n}")),
            _ => Err(format!("{s:?}: the prefix length must be 0-{max}")),
        },
    }
}

/// A Kubernetes resource quantity: a decimal number with an optional suffix.
fn is_quantity(s: &str) -> bool {
    const SUFFIXES: [&str; 14] = [
        "", "m", "k", "M", "G", "T", "P", "E", "Ki", "Mi", "Gi", "Ti", "Pi", "Ei",
    ];
    let digits_end = s
        .find(|c: char| !(c.is_ascii_digit() || c == '.'))
        .unwrap_or(s.len());
    let (number, suffix) = s.split_at(digits_end);
    !number.is_empty()
        && number.chars().filter(|&c| c == '.').count() <= 1
        && number != "."
        && SUFFIXES.contains(&suffix)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn config() -> InjectionConfig {
        InjectionConfig::from_yaml("image: x\ncontrollerAddress: y\n").expect("config")
    }

    fn capture(annotations: &[(&str, &str)], by_default: bool) -> Result<Option<Capture>, String> {
        let a = annotations
            .iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect();
        let api: IpAddr = "10.96.0.1".parse().expect("ip");
        Capture::from_annotations(&a, &config(), by_default, &[api])
    }

    #[test]
    fn transparency_follows_the_annotation_then_the_namespace() {
        assert_eq!(capture(&[], false), Ok(None));
        assert!(capture(&[], true).expect("ok").is_some());
        assert!(capture(&[(TRANSPARENT, "true")], false)
            .expect("ok")
            .is_some());
        assert_eq!(capture(&[(TRANSPARENT, "false")], true), Ok(None));
        let e = capture(&[(TRANSPARENT, "yes")], false).expect_err("not a bool");
        assert!(e.contains(TRANSPARENT) && e.contains("\"true\""), "{e}");
    }

    #[test]
    fn exclusions_add_to_dns_and_the_api_server() {
        let c = capture(
            &[
                (TRANSPARENT, "true"),
                (EXCLUDE_OUTBOUND_PORTS, "5432, 53,6379"),
                (EXCLUDE_OUTBOUND_CIDRS, "10.0.0.0/8,fd00::1,10.96.0.1"),
                (INCLUDE_OUTBOUND_PORTS, "80,8080"),
            ],
            false,
        )
        .expect("ok")
        .expect("on");
        assert_eq!(c.exclude_ports, [53, 5432, 6379]);
        assert_eq!(
            c.exclude_cidrs,
            ["10.96.0.1/32", "10.0.0.0/8", "fd00::1/128"]
        );
        assert_eq!(c.include_ports, [80, 8080]);
        let plain = capture(&[], true).expect("ok").expect("on");
        assert_eq!(plain.exclude_ports, [53]);
        assert_eq!(plain.exclude_cidrs, ["10.96.0.1/32"]);
        assert!(plain.include_ports.is_empty(), "every port by default");
    }

    #[test]
    fn bad_lists_are_refused_naming_the_annotation_and_the_rule() {
        for (key, value, rule) in [
            (EXCLUDE_OUTBOUND_PORTS, "80,http", "not a port number"),
            (EXCLUDE_OUTBOUND_PORTS, "15006", "redirect port"),
            (EXCLUDE_OUTBOUND_PORTS, "0", "not a port number"),
            (INCLUDE_OUTBOUND_PORTS, "65536", "not a port number"),
            (INCLUDE_OUTBOUND_PORTS, "80,,81", "empty item"),
            (EXCLUDE_OUTBOUND_CIDRS, "", "empty item"),
            (
                EXCLUDE_OUTBOUND_CIDRS,
                "10.0.0.0/33",
                "prefix length must be 0-32",
            ),
            (
                EXCLUDE_OUTBOUND_CIDRS,
                "fd00::/129",
                "prefix length must be 0-128",
            ),
            (EXCLUDE_OUTBOUND_CIDRS, "10.0.0.0/+8", "prefix length"),
            (
                EXCLUDE_OUTBOUND_CIDRS,
                "db.internal",
                "not an IP address or CIDR",
            ),
        ] {
            // Refused whether or not the pod is transparent.
            for on in ["true", "false"] {
                let e = capture(&[(TRANSPARENT, on), (key, value)], false)
                    .expect_err(&format!("{key}: {value:?}"));
                assert!(e.contains(key) && e.contains(rule), "{key}={value:?}: {e}");
            }
        }
    }

    #[test]
    fn a_port_both_included_and_excluded_is_refused() {
        for excluded in [vec![], vec![(EXCLUDE_OUTBOUND_PORTS, "8080")]] {
            let mut a = vec![(TRANSPARENT, "true"), (INCLUDE_OUTBOUND_PORTS, "8080,53")];
            a.extend(excluded);
            let e = capture(&a, false).expect_err("53 is excluded by default");
            assert!(
                e.contains(INCLUDE_OUTBOUND_PORTS) && e.contains("either included or excluded"),
                "{e}"
            );
        }
    }

    #[test]
    fn cidrs_are_normalised() {
        assert_eq!(parse_cidr("10.1.2.3").as_deref(), Ok("10.1.2.3/32"));
        assert_eq!(parse_cidr("0.0.0.0/0").as_deref(), Ok("0.0.0.0/0"));
        assert_eq!(parse_cidr("fd00:0:0::1/64").as_deref(), Ok("fd00::1/64"));
        assert!(parse_cidr("10.0.0.0/08").is_err());
        assert!(parse_cidr("[fd00::1]").is_err());
    }

    #[test]
    fn quantities() {
        for ok in ["1", "100m", "0.5", "64Mi", "1Gi", "2k"] {
            assert!(is_quantity(ok), "{ok}");
        }
        for bad in ["", "m", "1.2.3", "lots", "64MB", "-1", "."] {
            assert!(!is_quantity(bad), "{bad}");
        }
    }
}
