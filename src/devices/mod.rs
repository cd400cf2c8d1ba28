//! GPU device injection (CDI and NVIDIA_VISIBLE_DEVICES) as edits over the OCI spec.
