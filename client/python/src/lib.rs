//! `bagel._bagel`: the native half of the `bagel` Python package (the
//! Python half, in `python/bagel/`, adds the context managers, leader
//! election and the exception classes).
//!
//! # Layout
//! * `runtime`: the one tokio runtime the module owns; blocking calls
//!   with the GIL released, asyncio awaitables, shutdown at exit.
//! * `errors`: the Rust crates' errors as `bagel.errors` exceptions.
//! * `client`: `Client`, a lease backend from its URL, and `acquire`.
//! * `lease`: `Lease`, a held lease.
//! * `owner`: the owner a lease is taken under by default (`host:pid`).
//! * `store`: `open_store` and the bag store's writer, reader, audit,
//!   metronome, summaries and retention.

use pyo3::prelude::*;

mod client;
mod errors;
mod lease;
use bagel_cli::owner;
mod runtime;
mod store;

#[pymodule]
fn _bagel(m: &Bound<'_, PyModule>) -> PyResult<()> {
    // The package's version is the workspace's: one number for the wheel,
    // the crates and the binaries.
    m.add("__version__", env!("CARGO_PKG_VERSION"))?;
    m.add_class::<client::Client>()?;
    m.add_class::<lease::Lease>()?;
    m.add_class::<store::Store>()?;
    m.add_class::<store::Writer>()?;
    m.add_class::<store::Message>()?;
    m.add_class::<store::Messages>()?;
    m.add_class::<store::AuditReport>()?;
    m.add_class::<store::Metronome>()?;
    m.add_function(wrap_pyfunction!(store::open_store, m)?)?;
    m.add_function(wrap_pyfunction!(runtime::_shutdown, m)?)?;
    Ok(())
}
