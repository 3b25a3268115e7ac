//! Clocks, injectable so that time-dependent logic is tested exactly. The
//! types live in `bagel-proto` because the server uses them too.

pub use bagel_proto::clock::*;
