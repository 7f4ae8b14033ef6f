//! Where the running configuration comes from, and how it changes without a
//! restart: a file watched for changes and SIGHUP (standalone), or the
//! controller's authenticated snapshot stream with the last good snapshot kept
//! on disk (Kubernetes). Either way a new configuration is validated by the
//! shared rules of `reprise-crds` first and swapped in whole; an invalid one
//! is refused and the running one stays.

pub(crate) mod address_map;
pub(crate) mod reload;
pub(crate) mod subscription;

pub use subscription::{Farewell, Running, Subscription, TrustedCa, FAREWELL_TIMEOUT, SAVE_EVERY};
