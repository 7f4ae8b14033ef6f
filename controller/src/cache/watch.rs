//! One watch of one kind: a reflector store every reader shares, and the
//! objects each event touched, relayed to the reconciler.

use std::fmt::Debug;
use std::sync::Arc;

use futures_util::{Stream, StreamExt};
use kube::runtime::reflector::{self, Store};
use kube::runtime::{watcher, WatchStreamExt};
use kube::{Api, Resource};
use serde::de::DeserializeOwned;
use tokio::sync::watch;

use super::dirty::{Dirty, Touch};
use super::relay::Relay;

/// What a kind must be to be watched into a store.
pub(crate) trait Kind:
    Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}

impl<K> Kind for K where
    K: Resource<DynamicType = ()> + Clone + DeserializeOwned + Debug + Send + Sync + 'static
{
}

/// The store of one watched kind and the relay of what its events touched.
pub(crate) struct Watched<K: Kind> {
    /// Every object of the kind, as last seen.
    pub(crate) store: Store<K>,
    touched: Arc<Relay<K>>,
    /// Set while the API server does not serve the kind (its CRD is not
    /// installed): the store will not fill, and nothing is waited for.
    missing: Arc<std::sync::atomic::AtomicBool>,
}

impl<K: Kind> Clone for Watched<K> {
    fn clone(&self) -> Self {
        Watched {
            store: self.store.clone(),
            touched: Arc::clone(&self.touched),
            missing: Arc::clone(&self.missing),
        }
    }
}

/// Where a watch reports besides its store.
#[derive(Clone, Debug)]
pub(crate) struct Signals {
    /// Bumped whenever the store changed, when snapshots depend on the kind.
    pub(crate) changes: Option<Arc<watch::Sender<u64>>>,
    /// Told when the store was replaced by a fresh list (at start, and after
    /// the watch lost its place): every policy is then reconciled again.
    pub(crate) relisted: Arc<Relay<()>>,
    /// What events touched, for the push source (with `changes`).
    pub(crate) dirty: Dirty,
}

impl<K: Kind> Watched<K> {
    /// Starts watching `api` (with `config`) on a task of its own, retrying
    /// with backoff when the watch fails, for as long as the process runs.
    /// `touch` names what an event on an object touched, for the push source.
    pub(crate) fn start(
        api: Api<K>,
        config: watcher::Config,
        signals: Signals,
        touch: fn(&K) -> Touch,
    ) -> Self {
        let (store, writer) = reflector::store();
        let touched = Arc::new(Relay::default());
        let relay = Arc::clone(&touched);
        let missing = Arc::new(std::sync::atomic::AtomicBool::new(false));
        let absent = Arc::clone(&missing);
        tokio::spawn(async move {
            watcher(api, config)
                .default_backoff()
                .reflect(writer)
                .for_each(|event| {
                    match event {
                        // The store already holds the change when the event arrives here.
                        Ok(watcher::Event::Apply(obj) | watcher::Event::Delete(obj)) => {
                            signals.touch(touch(&obj));
                            signals.bump();
                            relay.send(obj);
                        }
                        // A list is buffered until it is complete, then swapped in at once.
                        Ok(watcher::Event::InitDone) => {
                            absent.store(false, std::sync::atomic::Ordering::Release);
                            signals.touch(Touch::All);
                            signals.bump();
                            signals.relisted.send(());
                        }
                        Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
                        // A kind whose CRD is not installed (Gateway API's,
                        // optional): watched again with backoff until it is.
                        Err(e) if kind_missing(&e) => {
                            absent.store(true, std::sync::atomic::Ordering::Release);
                            tracing::debug!(kind = %K::kind(&()), "kind not served (CRD not installed); watching again later");
                        }
                        // Not allowed to list it (RBAC from an older chart):
                        // counted as absent so that the controller still
                        // starts, and said at every retry.
                        Err(e) if status_code(&e) == Some(403) => {
                            absent.store(true, std::sync::atomic::Ordering::Release);
                            tracing::warn!(kind = %K::kind(&()), error = %e, "not allowed to watch this kind (update the chart's RBAC); treated as absent");
                        }
                        Err(e) => {
                            tracing::warn!(kind = %K::kind(&()), error = %e, "watch failed; retrying");
                        }
                    }
                    std::future::ready(())
                })
                .await;
        });
        Watched {
            store,
            touched,
            missing,
        }
    }

    /// A complete store of `objects` that never changes.
    pub(crate) fn fixed(objects: impl IntoIterator<Item = K>) -> Self {
        let mut writer = reflector::store::Writer::default();
        writer.apply_watcher_event(&watcher::Event::Init);
        for obj in objects {
            writer.apply_watcher_event(&watcher::Event::InitApply(obj));
        }
        writer.apply_watcher_event(&watcher::Event::InitDone);
        Watched {
            store: writer.as_reader(),
            touched: Arc::default(),
            missing: Arc::default(),
        }
    }

    /// Waits until the store holds a complete list, or the API server says
    /// it does not serve the kind. `false` when the watch is gone.
    pub(crate) async fn ready_or_missing(&self) -> bool {
        loop {
            if self.missing.load(std::sync::atomic::Ordering::Acquire) {
                return true;
            }
            match tokio::time::timeout(
                std::time::Duration::from_millis(100),
                self.store.wait_until_ready(),
            )
            .await
            {
                Ok(ready) => return ready.is_ok(),
                Err(_) => continue,
            }
        }
    }

    /// The objects events touch from now on (applied or deleted), as the kube
    /// `Controller`'s trigger streams take them. Replaces an earlier
    /// subscription.
    pub(crate) fn touched(&self) -> impl Stream<Item = Result<K, watcher::Error>> + Send + 'static {
        self.touched.subscribe().map(Ok)
    }
}

/// True when the API server does not serve the kind at all (404).
fn kind_missing(e: &watcher::Error) -> bool {
    status_code(e) == Some(404)
}

/// The API server's status code of a failed list or watch start.
fn status_code(e: &watcher::Error) -> Option<u16> {
    match e {
        watcher::Error::InitialListFailed(kube::Error::Api(status))
        | watcher::Error::WatchStartFailed(kube::Error::Api(status)) => Some(status.code),
        _ => None,
    }
}

impl Signals {
    /// Records what an event touched, when snapshots depend on the kind.
    pub(crate) fn touch(&self, touch: Touch) {
        if self.changes.is_some() {
            self.dirty.touch(touch);
        }
    }

    /// Tells the push streams that something snapshots are made of changed.
    pub(crate) fn bump(&self) {
        if let Some(changes) = &self.changes {
            changes.send_modify(|n| *n = n.wrapping_add(1));
        }
    }
}
