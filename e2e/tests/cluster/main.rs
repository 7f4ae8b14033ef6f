//! End-to-end tests against a real kube-apiserver, etcd and
//! kube-controller-manager (started by `e2e/cluster.sh up`), with the real
//! `reprise-controller` and `reprise-sidecar` binaries and real upstream
//! servers. There is no kubelet: pods are API objects whose status the test
//! sets, and whose "containers" are processes on 127.1.x.y. The API server
//! refuses loopback addresses in EndpointSlices, so pods get 10.244.x.y and
//! the sidecars map that prefix to 127.1.x.y (REPRISE_ENDPOINT_ADDRESS_MAP);
//! nothing is ever sent to 10.244.0.0/16.
//!
//! Ignored by default; `e2e/test.sh` runs them with `--ignored` once the
//! cluster is up and `REPRISE_E2E_KUBECONFIG` is set.

mod chart;
mod flows;
mod security;
