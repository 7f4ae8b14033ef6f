//! Transparent mode in real network namespaces: `reprise-sidecar iptables`
//! installs the capture rules, and apps with no proxy settings are captured.
//!
//! Each test builds its own [`lab::Lab`]: two namespaces (`rp-app-…`,
//! `rp-svc-…`, unique per process and test) joined by a veth pair, with
//! addresses from 192.0.2.0/24 and 2001:db8::/64 that exist only inside them.
//! Servers run in the svc namespace, the sidecar (as uid 65532) and the
//! clients (Python's `http.client`, Node's `fetch`, grpcio) in the app
//! namespace; every process is placed with `ip netns exec`, and the
//! servers are this test binary run again there ([`helper`]). No iptables
//! rule of the host is read or changed: every iptables command runs inside a
//! lab namespace.
//!
//! The tests need root and `ip netns`; without them they say so and pass,
//! except under CI (`CI` set), where they fail.

#[path = "transparent/clients.rs"]
mod clients;
#[path = "transparent/helper.rs"]
mod helper;
#[path = "transparent/lab.rs"]
mod lab;

#[path = "transparent/bypass.rs"]
mod bypass;
#[path = "transparent/proxying.rs"]
mod proxying;
#[path = "transparent/rules.rs"]
mod rules;
#[path = "transparent/tls.rs"]
mod tls;
