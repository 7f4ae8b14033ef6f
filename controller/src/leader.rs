//! Leader election with a coordination.k8s.io Lease, so two replicas can run:
//! only the leader reconciles and writes status; every replica serves pushes.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::MicroTime;
use kube::api::{ObjectMeta, PostParams};
use kube::{Api, Client};
use tokio::sync::watch;

/// The Lease the replicas compete for.
pub(crate) const LEASE_NAME: &str = "reprise-controller";

/// Lease timing.
#[derive(Clone, Debug)]
pub(crate) struct LeaseSettings {
    /// Lease name.
    pub(crate) name: String,
    /// Lease namespace.
    pub(crate) namespace: String,
    /// This replica's identity (its pod name).
    pub(crate) identity: String,
    /// How long a lease is valid without renewal.
    pub(crate) duration: Duration,
    /// How often the holder renews (and others retry).
    pub(crate) renew_every: Duration,
}

/// Runs forever, publishing whether this replica leads.
pub(crate) async fn run(client: Client, settings: LeaseSettings, leading: watch::Sender<bool>) {
    let api: Api<Lease> = Api::namespaced(client, &settings.namespace);
    loop {
        let is_leader = match try_acquire(&api, &settings).await {
            Ok(held) => held,
            Err(e) => {
                tracing::warn!(error = %e, "lease update failed");
                false
            }
        };
        if *leading.borrow() != is_leader {
            tracing::info!(identity = %settings.identity, leader = is_leader, "leadership changed");
            let _ = leading.send(is_leader);
        }
        tokio::time::sleep(settings.renew_every).await;
    }
}

async fn try_acquire(api: &Api<Lease>, s: &LeaseSettings) -> Result<bool, kube::Error> {
    let now = k8s_openapi::jiff::Timestamp::now();
    let secs = i32::try_from(s.duration.as_secs()).unwrap_or(15);
    match api.get_opt(&s.name).await? {
        None => {
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(s.name.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(s.identity.clone()),
                    lease_duration_seconds: Some(secs),
                    acquire_time: Some(MicroTime(now)),
                    renew_time: Some(MicroTime(now)),
                    lease_transitions: Some(0),
                    ..Default::default()
                }),
            };
            match api.create(&PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            }
        }
        Some(mut lease) => {
            let spec = lease.spec.get_or_insert_with(Default::default);
            let holder = spec.holder_identity.clone().unwrap_or_default();
            let duration = i64::from(spec.lease_duration_seconds.unwrap_or(secs));
            let expired = spec
                .renew_time
                .as_ref()
                .is_none_or(|t| now.as_second() > t.0.as_second() + duration);
            if holder != s.identity && !expired {
                return Ok(false);
            }
            if holder != s.identity {
                spec.acquire_time = Some(MicroTime(now));
                spec.lease_transitions = Some(spec.lease_transitions.unwrap_or(0) + 1);
            }
            spec.holder_identity = Some(s.identity.clone());
            spec.lease_duration_seconds = Some(secs);
            spec.renew_time = Some(MicroTime(now));
            // replace() carries resourceVersion: if another replica wrote first, this fails with 409.
            match api.replace(&s.name, &PostParams::default(), &lease).await {
                Ok(_) => Ok(true),
                Err(kube::Error::Api(e)) if e.code == 409 => Ok(false),
                Err(e) => Err(e),
            }
        }
    }
}
