//! The bagel client library.
//!
//! # Layout
//! * [`bag`]: closable per-second bags of messages on a directory or S3:
//!   writer, metronome, reader.
//! * [`clock`]: injectable clocks.
//! * [`json`]: the JSON forms the CLI prints and reads (a contract).

pub mod bag;
pub mod clock;
pub mod json;

pub use bagel_proto::{Micros, pb};
