//! # respway-xds
//!
//! respway's configuration plane: the YAML resource schema, its translation into Envoy v3
//! resources, and their translation into the filters' [`respway_filters::model`].
