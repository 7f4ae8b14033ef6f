//! One watch of one kind: a reflector store every reader shares, and the
//! objects each event touched, relayed to the reconciler.

use std::fmt::Debug;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;

use futures_util::{Stream, StreamExt};
use kube::runtime::reflector::{self, store::Writer, Store};
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
    missing: Arc<AtomicBool>,
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

/// The first wait before watching again a kind the API server does not
/// serve (or does not let the controller list), doubled at each failure up
/// to [`MISSING_MAX`]. kube's own backoff starts again at 0.8 s after every
/// attempt (the attempt's first event resets it): without this, a cluster
/// without Gateway API would be asked for BackendTLSPolicies every second
/// by every replica.
const MISSING_FIRST: std::time::Duration = std::time::Duration::from_secs(5);
/// The longest wait before watching a missing kind again: how late a
/// Gateway API installed afterwards is noticed.
const MISSING_MAX: std::time::Duration = std::time::Duration::from_secs(60);

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
        let (store, mut writer) = reflector::store();
        let touched = Arc::new(Relay::default());
        let missing = Arc::new(AtomicBool::new(false));
        let (relay, absent) = (Arc::clone(&touched), Arc::clone(&missing));
        // `on_event` writes the store (rather than `.reflect()`), so that a
        // Feed's events take exactly this path.
        tokio::spawn(async move {
            let mut pause = MISSING_FIRST;
            watcher(api, config)
                .default_backoff()
                .for_each(|event| {
                    let failed = event.is_err();
                    on_event(&mut writer, event, &signals, &relay, &absent, touch);
                    if !absent.load(Ordering::Acquire) {
                        pause = MISSING_FIRST;
                    } else if failed {
                        // The stream is not polled again until this ends.
                        let wait = pause;
                        pause = (pause * 2).min(MISSING_MAX);
                        return futures_util::future::Either::Left(tokio::time::sleep(wait));
                    }
                    futures_util::future::Either::Right(std::future::ready(()))
                })
                .await;
        });
        Watched {
            store,
            touched,
            missing,
        }
    }

    /// A store filled by hand instead of by a watch (a
    /// [`Feed`](super::Feed)): it starts as the complete list `objects`,
    /// and every event sent to the returned [`Fed`] takes the live watch's
    /// path.
    pub(super) fn fed(
        signals: Signals,
        objects: impl IntoIterator<Item = K>,
        touch: fn(&K) -> Touch,
    ) -> (Self, Fed<K>) {
        let (store, writer) = reflector::store();
        let mut fed = Fed {
            writer,
            signals,
            touch,
            relay: Arc::default(),
            missing: Arc::default(),
        };
        fed.send(watcher::Event::Init);
        for obj in objects {
            fed.send(watcher::Event::InitApply(obj));
        }
        fed.send(watcher::Event::InitDone);
        let watched = Watched {
            store,
            touched: Arc::clone(&fed.relay),
            missing: Arc::clone(&fed.missing),
        };
        (watched, fed)
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
            if self.missing.load(Ordering::Acquire) {
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

/// The writing end of a store that [`Watched::fed`] made.
pub(super) struct Fed<K: Kind> {
    writer: Writer<K>,
    signals: Signals,
    touch: fn(&K) -> Touch,
    relay: Arc<Relay<K>>,
    missing: Arc<AtomicBool>,
}

impl<K: Kind> Fed<K> {
    /// Handles `event` as if the watch had received it.
    pub(super) fn send(&mut self, event: watcher::Event<K>) {
        on_event(
            &mut self.writer,
            Ok(event),
            &self.signals,
            &self.relay,
            &self.missing,
            self.touch,
        );
    }
}

/// What every event of a watch does, the live watch's and a
/// [`Feed`](super::Feed)'s alike: the event goes into the store, then the
/// push streams are told (`signals`) and the reconciler is handed what it
/// touched (`relay`); `missing` says whether the kind is served at all.
/// Anything that must see every change (an index of what each event
/// touched) belongs here, so that both paths run it.
/// What the cache keeps of an object: all but what the controller never
/// reads and the API server sends anyway, the server-side apply bookkeeping
/// (`managedFields`, often larger than an EndpointSlice's endpoints) and
/// kubectl's last-applied copy of the whole object. Watches cannot leave
/// fields out (only a metadata-only watch can, and every kind here needs
/// its spec), so they are dropped as each event arrives.
fn slim<K: Kind>(obj: &mut K) {
    obj.meta_mut().managed_fields = None;
    if let Some(annotations) = obj.meta_mut().annotations.as_mut() {
        annotations.remove(LAST_APPLIED);
        if annotations.is_empty() {
            obj.meta_mut().annotations = None;
        }
    }
}

/// kubectl's client-side apply annotation.
const LAST_APPLIED: &str = "kubectl.kubernetes.io/last-applied-configuration";

pub(super) fn on_event<K: Kind>(
    writer: &mut Writer<K>,
    event: Result<watcher::Event<K>, watcher::Error>,
    signals: &Signals,
    relay: &Relay<K>,
    missing: &AtomicBool,
    touch: fn(&K) -> Touch,
) {
    let event = event.map(|e| e.modify(slim));
    if let Ok(event) = &event {
        writer.apply_watcher_event(event);
    }
    match event {
        // The store already holds the change here.
        Ok(watcher::Event::Apply(obj) | watcher::Event::Delete(obj)) => {
            signals.touch(touch(&obj));
            signals.bump();
            relay.send(obj);
        }
        // A list is buffered until it is complete, then swapped in at once.
        Ok(watcher::Event::InitDone) => {
            missing.store(false, Ordering::Release);
            signals.touch(Touch::All);
            signals.bump();
            signals.relisted.send(());
        }
        Ok(watcher::Event::Init | watcher::Event::InitApply(_)) => {}
        // A kind whose CRD is not installed (Gateway API's,
        // optional): watched again with backoff until it is.
        Err(e) if kind_missing(&e) => {
            missing.store(true, Ordering::Release);
            tracing::debug!(kind = %K::kind(&()), "kind not served (CRD not installed); watching again later");
        }
        // Not allowed to list it (RBAC from an older chart):
        // counted as absent so that the controller still
        // starts, and said at every retry.
        Err(e) if status_code(&e) == Some(403) => {
            missing.store(true, Ordering::Release);
            tracing::warn!(kind = %K::kind(&()), error = %e, "not allowed to watch this kind (update the chart's RBAC); treated as absent");
        }
        Err(e) => {
            tracing::warn!(kind = %K::kind(&()), error = %e, "watch failed; retrying");
        }
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
