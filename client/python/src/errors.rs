//! The domain errors of the Rust crates as the exceptions of
//! `bagel.errors`, which are plain Python classes (so that `InvalidArgument`
//! can also be a `ValueError`, and each has a docstring). A [`Failure`] is
//! what an operation fails with off the GIL; it becomes the exception when
//! it reaches Python.
//!
//! The Rust error enums are non-exhaustive and gain variants: each mapping
//! ends in a wildcard that gives the base `BagelError`, with the message
//! and whether a retry may help.

use bagel_bags::Error as BagError;
use bagel_client::{Error as LeaseError, TimeSource};
use bagel_proto::authority::monitor::Verdict;
use pyo3::prelude::*;

/// An attribute set on the exception.
#[derive(Clone, Debug)]
pub enum Attr {
    Str(String),
    Int(u64),
    Float(f64),
    Bool(bool),
    None,
}

/// An exception to raise: its class in `bagel.errors`, message and
/// attributes.
#[derive(Debug)]
pub struct Failure {
    class: &'static str,
    message: String,
    attrs: Vec<(&'static str, Attr)>,
    /// Refused for want of signed time, which a clock check that found
    /// the clock off also refuses with ([`Failure::on_clock`]).
    no_signed_time: bool,
}

impl Failure {
    fn new(class: &'static str, message: impl Into<String>, retryable: bool) -> Self {
        Failure {
            class,
            message: message.into(),
            attrs: vec![("retryable", Attr::Bool(retryable))],
            no_signed_time: false,
        }
    }

    fn with(mut self, name: &'static str, value: Attr) -> Self {
        self.attrs.push((name, value));
        self
    }

    /// `BagelError` itself: a failure no narrower class names.
    pub fn base(message: impl Into<String>, retryable: bool) -> Self {
        Failure::new("BagelError", message, retryable)
    }

    /// `InvalidArgument` (also a `ValueError`).
    pub fn invalid(message: impl Into<String>) -> Self {
        Failure::new("InvalidArgument", message, false)
    }

    /// `Closed`: a store closed by its `close()`, a lease already
    /// released, a runtime shut down at exit.
    pub fn closed(message: impl Into<String>) -> Self {
        Failure::new("Closed", message, false)
    }

    /// `LogNotFound` (also an `InvalidArgument` and a `LookupError`): no
    /// writer or closer ever made `log` in the store at `store`.
    pub fn log_not_found(log: &str, store: &str) -> Self {
        Failure::new(
            "LogNotFound",
            format!("log {log:?} does not exist in {store}: nothing was ever written or closed there"),
            false,
        )
        .with("log", Attr::Str(log.to_owned()))
        .with("store", Attr::Str(store.to_owned()))
    }

    /// `LeaseLost`: the lease is no longer held.
    pub fn lost(message: impl Into<String>) -> Self {
        Failure::new("LeaseLost", message, false)
    }

    /// `ClockOff` on what the clock check measured: `offset` (seconds,
    /// this clock less signed time) and `allowed` (the most that passes),
    /// when `time`'s latest verdict is that the clock is off; `None` each
    /// when the refusal rests on something else (a grant's deadline
    /// already past on this clock).
    fn clock_off(message: impl Into<String>, time: Option<&TimeSource>) -> Self {
        let (offset, allowed) = match time.map(TimeSource::verdict) {
            Some(Verdict::Off {
                offset_us, allowed, ..
            }) => (
                Attr::Float(offset_us as f64 / 1e6),
                Attr::Float(allowed.as_secs_f64()),
            ),
            _ => (Attr::None, Attr::None),
        };
        Failure::new("ClockOff", message, false)
            .with("offset", offset)
            .with("allowed", allowed)
    }

    /// This failure of an operation that acts on `time`'s clock check, with
    /// what the check measured: a `ClockOff` gains its `offset` and
    /// `allowed`, and a refusal for want of signed time while the check
    /// says the clock is off (a writer's batch) is that `ClockOff`.
    pub fn on_clock(self, time: &TimeSource) -> Self {
        let off = matches!(time.verdict(), Verdict::Off { .. });
        match self.class {
            "ClockOff" => Failure::clock_off(self.message, Some(time)),
            _ if self.no_signed_time && off => Failure::clock_off(self.message, Some(time)),
            _ => self,
        }
    }

    fn unavailable(message: impl Into<String>, retry_after: Option<f64>) -> Self {
        Failure::new("Unavailable", message, true)
            .with("retry_after", retry_after.map_or(Attr::None, Attr::Float))
    }

    fn into_pyerr(self, py: Python<'_>) -> PyResult<PyErr> {
        let errors = py.import("bagel.errors")?;
        let exc = errors.getattr(self.class)?.call1((self.message,))?;
        for (name, value) in self.attrs {
            match value {
                Attr::Str(s) => exc.setattr(name, s)?,
                Attr::Int(i) => exc.setattr(name, i)?,
                Attr::Float(f) => exc.setattr(name, f)?,
                Attr::Bool(b) => exc.setattr(name, b)?,
                Attr::None => exc.setattr(name, py.None())?,
            }
        }
        Ok(PyErr::from_value(exc))
    }
}

impl From<Failure> for PyErr {
    fn from(f: Failure) -> PyErr {
        Python::attach(|py| f.into_pyerr(py).unwrap_or_else(|e| e))
    }
}

impl From<LeaseError> for Failure {
    fn from(e: LeaseError) -> Failure {
        let message = e.to_string();
        let retryable = e.is_retryable();
        // A refusal that names a field of the request, of any variant
        // (those added later too), is bad input.
        let names_a_field = e.field().is_some();
        match e {
            LeaseError::Busy { conflict, .. } => {
                let mut f = Failure::new("HeldError", message, true);
                if let Some(c) = conflict {
                    f = f
                        .with("name", Attr::Str(c.name))
                        .with("holder", Attr::Str(c.holder_lease_id))
                        .with("owner", Attr::Str(c.holder_owner))
                        .with("mode", Attr::Str(c.holder_mode.as_str().to_owned()))
                        .with("deadline", Attr::Int(c.holder_deadline.as_micros()));
                }
                f
            }
            LeaseError::Unavailable { retry_after, .. } => {
                Failure::unavailable(message, retry_after.map(|d| d.as_secs_f64()))
            }
            LeaseError::NoSignedTime { .. } => Failure {
                no_signed_time: true,
                ..Failure::unavailable(message, None)
            },
            LeaseError::Connect { .. } | LeaseError::Timeout { .. } => Failure::unavailable(message, None),
            LeaseError::NotHeld { reason, .. } => {
                Failure::lost(message).with("reason", Attr::Str(reason.as_str().to_owned()))
            }
            LeaseError::ClockOff { .. } => Failure::clock_off(message, None),
            LeaseError::Invalid { .. }
            | LeaseError::OutOfRange { .. }
            | LeaseError::WatermarkBelowWritten { .. }
            | LeaseError::Config { .. } => Failure::invalid(message),
            LeaseError::Store { retryable: true, .. } => Failure::unavailable(message, None),
            _ if names_a_field && !retryable => Failure::invalid(message),
            _ => Failure::base(message, retryable),
        }
    }
}

impl From<BagError> for Failure {
    fn from(e: BagError) -> Failure {
        let message = e.to_string();
        let retryable = e.is_retryable();
        match e {
            BagError::LateRejected { log, bucket } | BagError::BagClosed { log, bucket } => {
                Failure::new("LateRejected", message, false)
                    .with("log", Attr::Str(log))
                    .with("bag", Attr::Str(bucket.to_string()))
            }
            BagError::NoRights { .. } | BagError::WritesClosed | BagError::LeaseExpiring { .. } => {
                Failure::lost(message)
            }
            BagError::SignedTimeOff { .. } | BagError::ClockUnvouched { .. } => {
                Failure::clock_off(message, None)
            }
            BagError::NoSignedTime { .. } => Failure {
                no_signed_time: true,
                ..Failure::unavailable(message, None)
            },
            BagError::Timeout { .. } => Failure::unavailable(message, None),
            BagError::Invalid { .. } => Failure::invalid(message),
            _ if retryable => Failure::unavailable(message, None),
            _ => Failure::base(message, false),
        }
    }
}
