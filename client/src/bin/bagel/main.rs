//! `bagel`: the command-line client. (Being built; see issue 2.)

fn main() {}
