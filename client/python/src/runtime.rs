//! The one tokio runtime the module owns, and the two ways Python waits on
//! it: a blocking call that releases the GIL ([`block_on`]) and an asyncio
//! awaitable ([`awaitable`]).
//!
//! The runtime starts on first use and is shut down by an `atexit` hook
//! (registered in `bagel/__init__.py`), so no worker thread outlives the
//! interpreter and no background renewal runs into its finalization.

use std::future::Future;
use std::sync::mpsc::RecvTimeoutError;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use pyo3::IntoPyObjectExt as _;
use pyo3::prelude::*;
use tokio::runtime::{Handle, Runtime};

use crate::errors::Failure;

/// `None` before the first call and after [`shutdown`]. A std mutex: held
/// only to clone the handle or take the runtime, never across an await.
static RUNTIME: Mutex<Option<Arc<Runtime>>> = Mutex::new(None);
/// Set by [`shutdown`]: nothing starts the runtime again afterwards.
static SHUT_DOWN: Mutex<bool> = Mutex::new(false);

/// How often a blocking call looks up from its wait to let Python handle
/// a signal (Ctrl-C raises `KeyboardInterrupt` and drops the operation).
const SIGNAL_CHECK: Duration = Duration::from_millis(100);

/// The runtime's handle, starting it on first use.
pub fn handle() -> Result<Handle, Failure> {
    if *SHUT_DOWN.lock().unwrap_or_else(PoisonError::into_inner) {
        return Err(Failure::closed(
            "bagel's runtime is shut down (the interpreter is exiting)",
        ));
    }
    let mut slot = RUNTIME.lock().unwrap_or_else(PoisonError::into_inner);
    if let Some(rt) = slot.as_ref() {
        return Ok(rt.handle().clone());
    }
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .thread_name("bagel-runtime")
        .enable_all()
        .build()
        .map_err(|e| Failure::base(format!("cannot start bagel's runtime: {e}"), false))?;
    let handle = rt.handle().clone();
    *slot = Some(Arc::new(rt));
    Ok(handle)
}

/// Stops the runtime: every task (background renewals, metronomes, loss
/// watchers) is dropped and its worker threads joined, for at most two
/// seconds. Idempotent; later calls into bagel raise `Closed`.
#[pyfunction]
pub fn _shutdown(py: Python<'_>) {
    *SHUT_DOWN.lock().unwrap_or_else(PoisonError::into_inner) = true;
    let taken = RUNTIME.lock().unwrap_or_else(PoisonError::into_inner).take();
    if let Some(rt) = taken {
        // Workers may be waiting for the GIL (a callback into Python):
        // let them have it while they wind down.
        py.detach(move || match Arc::try_unwrap(rt) {
            Ok(rt) => rt.shutdown_timeout(Duration::from_secs(2)),
            Err(shared) => drop(shared),
        });
    }
}

/// Runs `fut` to completion on the runtime with the GIL released,
/// checking for signals every [`SIGNAL_CHECK`]: a `KeyboardInterrupt`
/// aborts the task, which cancels the operation (an acquire stops
/// waiting). The calling thread only waits on a channel, never enters the
/// runtime: a call in flight when the runtime shuts down (a daemon thread
/// at exit) raises `Closed` instead of failing inside tokio.
pub fn block_on<T, F>(py: Python<'_>, fut: F) -> PyResult<T>
where
    T: Send + 'static,
    F: Future<Output = Result<T, Failure>> + Send + 'static,
{
    if Handle::try_current().is_ok() {
        return Err(Failure::base(
            "a blocking bagel call from a bagel callback (it runs on bagel's runtime): use the async form, or \
             hand the work to another thread",
            false,
        )
        .into());
    }
    let (tx, rx) = std::sync::mpsc::sync_channel(1);
    let task = handle()?.spawn(async move {
        let _ = tx.send(fut.await);
    });
    let mut rx = rx;
    loop {
        // The receiver moves to the detached closure and back (it is Send,
        // not Sync).
        let (step, back) = py.detach(move || (rx.recv_timeout(SIGNAL_CHECK), rx));
        rx = back;
        match step {
            Ok(done) => return done.map_err(PyErr::from),
            Err(RecvTimeoutError::Timeout) => {
                if let Err(e) = py.check_signals() {
                    task.abort();
                    return Err(e);
                }
            }
            Err(RecvTimeoutError::Disconnected) => {
                return Err(Failure::closed("bagel's runtime shut down while the call was in flight").into());
            }
        }
    }
}

/// An asyncio future, on the running loop, that `fut` resolves from the
/// runtime. Cancelling it aborts `fut`.
pub fn awaitable<'py, T, F>(py: Python<'py>, fut: F) -> PyResult<Bound<'py, PyAny>>
where
    T: for<'a> IntoPyObject<'a> + Send + 'static,
    F: Future<Output = Result<T, Failure>> + Send + 'static,
{
    let aio = py.import("bagel._aio")?;
    let pair = aio.call_method0("new_future")?;
    let event_loop: Py<PyAny> = pair.get_item(0)?.unbind();
    let py_future = pair.get_item(1)?;
    let target: Py<PyAny> = py_future.clone().unbind();
    let task = handle()?.spawn(async move {
        let outcome = fut.await;
        Python::attach(|py| {
            let (ok, value) = match outcome {
                Ok(v) => match v.into_py_any(py) {
                    Ok(obj) => (true, obj),
                    Err(e) => (false, e.into_value(py).into_any()),
                },
                Err(f) => (false, PyErr::from(f).into_value(py).into_any()),
            };
            let resolved = py
                .import("bagel._aio")
                .and_then(|aio| aio.call_method1("resolve", (event_loop, target, ok, value)));
            if let Err(e) = resolved {
                e.write_unraisable(py, None);
            }
        });
    });
    aio.call_method1("on_cancel", (&py_future, Abort(task.abort_handle())))?;
    Ok(py_future)
}

/// Aborts a runtime task: what a cancelled asyncio future calls.
#[pyclass(frozen)]
#[derive(Debug)]
pub struct Abort(tokio::task::AbortHandle);

#[pymethods]
impl Abort {
    fn __call__(&self) {
        self.0.abort();
    }
}
