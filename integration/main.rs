//! Integration tests: gantry against real engines, runtimes and the kernel.
//! They need root, containerd, runc and busybox-static (scripts/test.sh installs them).

mod catalogue;
mod common;
mod containerd;
mod cri;
mod cri_exec;
mod cri_restart;
mod crio;
mod crio_node;
mod daemon_cgroup;
mod faults;
mod gpu;
/// The library's GPU fixtures (fake NVIDIA nodes, CDI specs), compiled into this target.
#[allow(dead_code)]
#[path = "../src/devices/fixture.rs"]
mod gpu_fixture;
mod image;
mod install;
mod installer;
mod lifecycle;
mod metrics;
mod mount_helper;
mod node;
mod node_fleet;
mod sandbox;
mod seccomp_notify;
mod seccomp_record;
mod security;
mod stats_oom;
mod task_api;
mod trust;
