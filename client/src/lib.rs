//! The bagel client library.
//!
//! # Layout
//! * [`clock`]: injectable clocks.
//! * [`json`]: the JSON forms the CLI prints and reads (a contract).

pub mod clock;
pub mod json;

pub use bagel_proto::{Micros, pb};
