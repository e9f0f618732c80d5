//! respway-perf: the traffic harness (issue 5). Only the crate skeleton exists so far.
