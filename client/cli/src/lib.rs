//! The `bagel` command-line client: its JSON contract ([`contract`]) as a
//! library, so tests and scripts in Rust read and write exactly what the
//! CLI does; and the default owner ([`owner`]), which the Python package
//! takes too. The commands themselves live in `src/bin/bagel/`.

pub mod contract;
pub mod open_backend;
pub mod owner;

pub use open_backend::{LeaseBackendOptions, S3Options, open_lease_backend};
