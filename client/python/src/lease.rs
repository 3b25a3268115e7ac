//! `bagel.Lease`: a held lease, renewed in the background by the Rust
//! handle until released or lost.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use bagel_client::{LeaseState, Mode, NameGrant};
use bagel_proto::Micros;
use bagel_proto::clock::Clock;
use bagel_proto::rights::WriteRights;
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use tokio::sync::{RwLock, watch};

use crate::client::{Env, seconds};
use crate::errors::Failure;
use crate::runtime::{awaitable, block_on, handle};

/// What the Python object holds; shared with the tasks that act on it.
pub struct Held {
    pub env: Arc<Env>,
    /// `None` once released. Renewals and upgrades read it; the release
    /// takes it (a write lock: it waits for a renewal in flight).
    lease: RwLock<Option<bagel_client::Lease>>,
    id: String,
    names: Vec<NameGrant>,
    min_timestamp: Micros,
    state: watch::Receiver<LeaseState>,
    /// The rights writers under this lease write with: they follow its
    /// renewals and record what is written, which the release publishes.
    pub rights: Arc<dyn WriteRights>,
}

impl std::fmt::Debug for Held {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Held")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// A held lease on one or more names.
///
/// Renews itself in the background (every third of its TTL) until
/// `release()` or loss. Instants are microseconds since the Unix epoch
/// (int); durations are seconds (float).
///
/// Dropping a lease without releasing it stops its renewal; it then
/// expires at its deadline, and the next holder treats it as broken (its
/// deadline stands in for the watermark). Prefer `with client.lease(...)`,
/// which releases on exit.
#[pyclass(frozen, module = "bagel._bagel")]
#[derive(Debug)]
pub struct Lease {
    pub held: Arc<Held>,
}

impl Lease {
    pub fn acquired(env: Arc<Env>, lease: bagel_client::Lease) -> Result<Lease, Failure> {
        let held = Held {
            env,
            id: lease.id().to_owned(),
            names: lease.names().to_vec(),
            min_timestamp: lease.min_timestamp(),
            state: lease.subscribe(),
            rights: lease.rights(),
            lease: RwLock::new(Some(lease)),
        };
        Ok(Lease { held: Arc::new(held) })
    }
}

fn released(id: &str) -> Failure {
    Failure::closed(format!("lease {id} was released"))
}

async fn renew(held: Arc<Held>) -> Result<u64, Failure> {
    let guard = held.lease.read().await;
    let lease = guard.as_ref().ok_or_else(|| released(&held.id))?;
    Ok(lease.renew().await?.as_micros())
}

async fn upgrade(held: Arc<Held>) -> Result<(), Failure> {
    let guard = held.lease.read().await;
    let lease = guard.as_ref().ok_or_else(|| released(&held.id))?;
    Ok(lease.upgrade().await?)
}

async fn release(held: Arc<Held>, watermark: Option<u64>) -> Result<u64, Failure> {
    let lease = held
        .lease
        .write()
        .await
        .take()
        .ok_or_else(|| released(&held.id))?;
    Ok(lease
        .release(watermark.map(Micros::from_micros))
        .await?
        .as_micros())
}

/// Where a lease stands, as its state and the backend's clock say now.
enum Standing {
    /// Held for `left` more, unless a renewal moves the deadline.
    Held { left: Duration },
    /// Released (or being released): it can no longer be lost.
    Released,
    /// No longer held, and why.
    Lost(String),
}

/// A lease is lost when a renewal was refused or none came before the
/// deadline (the renewal task says so), and also when its deadline simply
/// passed: a lease that is not renewed in the background
/// (`auto_renew=False`) or whose handle stopped renewing is no longer
/// held then, and nothing else would say so.
fn standing(state: &LeaseState, wall_now: Micros) -> Standing {
    if let Some(lost) = &state.lost {
        return Standing::Lost(lost.to_string());
    }
    if state.released {
        return Standing::Released;
    }
    match state.time_left(wall_now) {
        left if left.is_zero() => Standing::Lost(format!(
            "expired: its deadline {} passed with no renewal",
            state.deadline
        )),
        left => Standing::Held { left },
    }
}

/// The reason once the lease is lost, its deadline passing included;
/// `None` once it can no longer be (released).
async fn lost(mut state: watch::Receiver<LeaseState>, clock: Arc<dyn Clock>) -> Option<String> {
    // Once the handle is gone nothing renews it: only the deadline is left.
    let mut renewing = true;
    loop {
        let left = match standing(&state.borrow_and_update(), clock.now()) {
            Standing::Held { left } => left,
            Standing::Released => return None,
            Standing::Lost(why) => return Some(why),
        };
        if renewing {
            tokio::select! {
                changed = state.changed() => renewing = changed.is_ok(),
                () = tokio::time::sleep(left) => {}
            }
        } else {
            tokio::time::sleep(left).await;
        }
    }
}

impl Held {
    fn standing(&self) -> Standing {
        standing(&self.state.borrow(), self.env.backend.clock().now())
    }

    fn lost(&self) -> impl Future<Output = Option<String>> + use<> {
        lost(self.state.clone(), self.env.backend.clock())
    }
}

#[pymethods]
impl Lease {
    /// The lease id.
    #[getter]
    fn id(&self) -> &str {
        &self.held.id
    }

    /// The names the lease holds.
    #[getter]
    fn names(&self) -> Vec<String> {
        self.held.names.iter().map(|n| n.name.clone()).collect()
    }

    /// Each name's fencing token: strictly increasing per name across
    /// holders. Hand it to the store you write to and have it refuse a
    /// token lower than one it has seen: that is the guard against a
    /// holder that lost its lease and has not stopped yet.
    #[getter]
    fn fencing_tokens(&self) -> BTreeMap<String, u64> {
        self.held
            .names
            .iter()
            .map(|n| (n.name.clone(), n.fencing_token))
            .collect()
    }

    /// What each name inherited from its previous holder: a dict of name
    /// to `{"lease_id", "watermark", "ended"}`, `ended` being `none`,
    /// `released`, `broken` or `unknown`. Every message earlier holders
    /// wrote is at or below `watermark`.
    #[getter]
    fn previous<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyDict>> {
        let out = PyDict::new(py);
        for n in &self.held.names {
            let d = PyDict::new(py);
            d.set_item("lease_id", n.previous.lease_id.clone())?;
            d.set_item("watermark", n.previous.watermark.as_micros())?;
            d.set_item("ended", n.previous.ended.as_str())?;
            out.set_item(&n.name, d)?;
        }
        Ok(out)
    }

    /// Every message written under this lease is strictly later (µs).
    #[getter]
    fn min_timestamp(&self) -> u64 {
        self.held.min_timestamp.as_micros()
    }

    /// The deadline of the latest grant or renewal (µs), on the server's
    /// clock.
    #[getter]
    fn deadline(&self) -> u64 {
        self.held.state.borrow().deadline.as_micros()
    }

    /// `"full"` or `"tentative"`.
    #[getter]
    fn mode(&self) -> &'static str {
        match self.held.state.borrow().mode {
            Mode::Full => "full",
            _ => "tentative",
        }
    }

    /// The signed witnesses of the latest grant, upgrade or renewal: one
    /// per server (or store) the lease is held on, each a dict with
    /// `key_id`, `body` and `signature` (bytes).
    #[getter]
    fn witnesses<'py>(&self, py: Python<'py>) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let witnesses = self.held.state.borrow().witnesses.clone();
        witnesses
            .iter()
            .map(|w| {
                let d = PyDict::new(py);
                d.set_item("key_id", w.key_id())?;
                d.set_item("body", PyBytes::new(py, w.body()))?;
                d.set_item("signature", PyBytes::new(py, w.signature()))?;
                Ok(d)
            })
            .collect()
    }

    /// Why the lease was lost, or `None` while it is held (and once it
    /// is released): a renewal refused, none possible before the
    /// deadline, or the deadline passed with no renewal (`"expired: ..."`,
    /// as with `auto_renew=False` and no `renew()` in time).
    #[getter]
    fn lost(&self) -> Option<String> {
        match self.held.standing() {
            Standing::Lost(why) => Some(why),
            Standing::Held { .. } | Standing::Released => None,
        }
    }

    /// The highest timestamp written under this lease so far (µs), or
    /// `None`: what `release()` publishes at least.
    #[getter]
    fn written(&self) -> Option<u64> {
        self.held
            .rights
            .ledger()
            .and_then(|l| l.summary().max_written.map(|m| m.as_micros()))
    }

    /// A local check, no call: not lost, not released, full, and more than
    /// the safety margin (0.5 s) before the deadline on both the wall
    /// clock and the monotonic clock.
    fn is_valid(&self) -> bool {
        match self.held.lease.try_read() {
            Ok(guard) => guard.as_ref().is_some_and(|l| l.is_valid()),
            // A release holds it: no longer valid.
            Err(_) => false,
        }
    }

    /// How long the lease still counts as held, in seconds (0 once not).
    fn time_left(&self) -> f64 {
        match self.held.lease.try_read() {
            Ok(guard) => guard.as_ref().map_or(0.0, |l| l.time_left().as_secs_f64()),
            Err(_) => 0.0,
        }
    }

    /// Renews now; returns the new deadline (µs). Raises `LeaseLost` if
    /// the lease is no longer held.
    fn renew(&self, py: Python<'_>) -> PyResult<u64> {
        block_on(py, renew(Arc::clone(&self.held)))
    }

    /// `renew`, awaitable.
    fn renew_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, renew(Arc::clone(&self.held)))
    }

    /// Turns a tentative lease full; raises `LeaseLost` if a name was
    /// broken meanwhile.
    fn upgrade(&self, py: Python<'_>) -> PyResult<()> {
        block_on(py, upgrade(Arc::clone(&self.held)))
    }

    /// `upgrade`, awaitable.
    fn upgrade_async<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, upgrade(Arc::clone(&self.held)))
    }

    /// Releases the lease, publishing a watermark (µs): at least the
    /// highest timestamp written under it, or `watermark` if higher. The
    /// next holder of each name inherits it and writes strictly above.
    /// Writes in flight are waited for first. Returns the stored
    /// watermark. A `watermark` below what was written raises
    /// `InvalidArgument`.
    #[pyo3(signature = (watermark=None))]
    fn release(&self, py: Python<'_>, watermark: Option<u64>) -> PyResult<u64> {
        block_on(py, release(Arc::clone(&self.held), watermark))
    }

    /// `release`, awaitable.
    #[pyo3(signature = (watermark=None))]
    fn release_async<'py>(&self, py: Python<'py>, watermark: Option<u64>) -> PyResult<Bound<'py, PyAny>> {
        awaitable(py, release(Arc::clone(&self.held), watermark))
    }

    /// Calls `callback(reason)` once, from one of bagel's threads, when the
    /// lease is lost (a renewal refused, none possible before the
    /// deadline, or the deadline passed with no renewal). Not called after
    /// a release. The callback must not make blocking bagel calls; an
    /// exception in it is printed and ignored.
    fn on_lost(&self, callback: Py<PyAny>) -> PyResult<()> {
        let lost = self.held.lost();
        handle()?.spawn(async move {
            let Some(reason) = lost.await else {
                return;
            };
            Python::attach(|py| {
                if let Err(e) = callback.call1(py, (reason,)) {
                    e.write_unraisable(py, None);
                }
            });
        });
        Ok(())
    }

    /// Blocks until the lease is lost and returns why (as `lost`: its
    /// deadline passing with no renewal counts), or returns `None` after
    /// `timeout` seconds (`None`: no limit) or once it is released.
    #[pyo3(signature = (timeout=None))]
    fn wait_lost(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<Option<String>> {
        let limit = timeout.map(|t| seconds("timeout", t)).transpose()?;
        let lost = self.held.lost();
        block_on(py, async move {
            Ok(match limit {
                Some(limit) => tokio::time::timeout(limit, lost).await.ok().flatten(),
                None => lost.await,
            })
        })
    }

    fn __repr__(&self) -> String {
        format!("<bagel.Lease {} on {:?}>", self.held.id, self.names())
    }
}
