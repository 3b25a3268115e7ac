//! The global flags every command family reads: where the leases are, and
//! how the clock is checked.

use crate::target::TargetArgs;
use crate::time_cmds::RoughtimeArgs;

/// What a command needs from the global flags.
#[derive(Clone, Copy, Debug)]
pub struct Globals<'a> {
    pub target: &'a TargetArgs,
    pub roughtime: &'a RoughtimeArgs,
}
