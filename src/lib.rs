//! respway: the sidecar.
