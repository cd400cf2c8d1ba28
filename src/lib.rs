//! gantry: a containerd shim v2 runtime handler.

pub mod devices;
